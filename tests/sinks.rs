//! The log and audit sinks against targets that stall or fail (PROTOCOL.md section 7.4):
//! an audit file on a full disk, an audit FIFO whose reader is stopped, and stderr a
//! pipe nobody reads. Whatever is lost is counted (a `dropped` record, or a plain log
//! line), nothing is torn, the writer resumes when the target drains, and the daemon
//! stays idle while it waits.

use std::fs::File;
use std::io::Read;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::util::*;

/// Most clock ticks (utime + stime) an idle daemon may use in a second: a loop that
/// turned without sleeping would use about a hundred.
const IDLE_TICKS: u64 = 5;

/// A small tmpfs mounted on a private directory, unmounted on drop.
struct Tmpfs(TempDir);

impl Tmpfs {
    /// `None` (after `skip`) where mounting is not permitted.
    #[track_caller]
    fn mount(size: &str) -> Option<Tmpfs> {
        let dir = TempDir::new();
        let c = |s: &str| std::ffi::CString::new(s).expect("no NUL");
        let (target, fs, data) = (
            c(dir.path().to_str().expect("utf-8")),
            c("tmpfs"),
            c(&format!("size={size},mode=0700")),
        );
        // SAFETY: valid NUL-terminated strings for mount(2).
        let rc = unsafe {
            libc::mount(
                fs.as_ptr(),
                target.as_ptr(),
                fs.as_ptr(),
                libc::MS_NOSUID | libc::MS_NODEV,
                data.as_ptr().cast(),
            )
        };
        if rc != 0 {
            skip(&format!(
                "cannot mount a tmpfs (needs root): {}",
                std::io::Error::last_os_error()
            ));
            return None;
        }
        Some(Tmpfs(dir))
    }

    fn path(&self) -> &Path {
        self.0.path()
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let target = std::ffi::CString::new(self.path().to_str().unwrap_or("")).unwrap_or_default();
        // SAFETY: a valid NUL-terminated path for umount2(2).
        unsafe {
            libc::umount2(target.as_ptr(), libc::MNT_DETACH);
        }
    }
}

/// A `cat` copying a FIFO into a file; resumed and killed on drop.
struct Reader(Child);

impl Reader {
    fn start(fifo: &Path, into: &Path) -> Reader {
        let out = File::create(into).expect("reader's output");
        let child = Command::new("cat")
            .arg(fifo)
            .stdin(Stdio::null())
            .stdout(out)
            .spawn()
            .expect("spawn cat");
        Reader(child)
    }

    fn pid(&self) -> i32 {
        self.0.id() as i32
    }
}

impl Drop for Reader {
    fn drop(&mut self) {
        unsafe_kill(self.pid(), libc::SIGCONT);
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The state letter of a process (`R`, `S`, `T` for stopped...).
fn state(pid: i32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit(')').next()?.trim_start().chars().next()
}

#[track_caller]
fn mkfifo(path: &Path) {
    let c = std::ffi::CString::new(path.to_str().expect("utf-8")).expect("no NUL");
    // SAFETY: a valid NUL-terminated path for mkfifo(3).
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0, "mkfifo");
}

/// Bytes free on the filesystem holding `path`.
fn free_bytes(path: &Path) -> u64 {
    let c = std::ffi::CString::new(path.to_str().expect("utf-8")).expect("no NUL");
    // SAFETY: statvfs fills the struct it is given; a zeroed one is a valid start.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: a valid path and a valid struct for statvfs(3).
    assert_eq!(unsafe { libc::statvfs(c.as_ptr(), &mut st) }, 0, "statvfs");
    st.f_bavail as u64 * st.f_frsize as u64
}

/// CPU ticks the daemon uses in a second with nothing asked of it.
fn idle_ticks(pid: i32) -> u64 {
    let before = cpu_ticks(pid);
    std::thread::sleep(Duration::from_secs(1));
    cpu_ticks(pid).saturating_sub(before)
}

/// What an audit target got, line by line: every line must be a whole JSON record.
struct Audit {
    /// Records other than `dropped`, by event.
    records: Vec<Value>,
    /// The counts of the `dropped` records.
    dropped: Vec<u64>,
}

impl Audit {
    /// Parses the complete lines of `bytes`; `whole` also requires that nothing follows
    /// the last newline.
    #[track_caller]
    fn parse(bytes: &[u8], whole: bool) -> Audit {
        let text = String::from_utf8_lossy(bytes);
        let complete = match text.rfind('\n') {
            Some(i) => &text[..=i],
            None => "",
        };
        if whole {
            assert_eq!(
                complete.len(),
                text.len(),
                "ends mid-line: {:?}",
                &text[complete.len()..]
            );
        }
        let mut a = Audit {
            records: Vec::new(),
            dropped: Vec::new(),
        };
        for line in complete.lines() {
            let rec: Value = serde_json::from_str(line)
                .unwrap_or_else(|e| panic!("a torn or bad line ({e}): {line:?}"));
            if rec["event"] == "dropped" {
                a.dropped
                    .push(rec["count"].as_u64().expect("dropped has a count"));
            } else {
                a.records.push(rec);
            }
        }
        a
    }

    fn count(&self, event: &str) -> usize {
        self.records.iter().filter(|r| r["event"] == event).count()
    }

    fn has(&self, event: &str, id: &str) -> bool {
        self.records
            .iter()
            .any(|r| r["event"] == event && r["id"] == id)
    }

    fn lost(&self) -> u64 {
        self.dropped.iter().sum()
    }
}

/// A synchronous `bash/exec` in session `s`; returns its command id.
#[track_caller]
fn exec(c: &mut Client, command: &str) -> String {
    let r = ok(
        c,
        "bash/exec",
        json!({"command": command, "session_id": "s"}),
    );
    assert_eq!(r["status"], "completed", "{r}");
    r["command_id"].as_str().expect("command_id").to_string()
}

/// `n` async `bash/exec` of `true`, each in a session of its own, pipelined in windows
/// of 100 on one connection; each is accepted, or refused for want of room for its start
/// record (`-32003` `audit`: nothing runs unrecorded). Returns the ids of those accepted.
#[track_caller]
fn exec_async_many(c: &mut Client, n: usize) -> Vec<String> {
    let mut sent = 0;
    let mut accepted = Vec::new();
    while sent < n {
        let window = (n - sent).min(100);
        let ids: Vec<u64> = (0..window)
            .map(|_| {
                c.send("bash/exec", json!({"command": "true", "async_mode": true}))
                    .expect("send")
            })
            .collect();
        for id in ids {
            match c.wait_response(id) {
                Ok(r) => accepted.push(r["command_id"].as_str().expect("id").to_string()),
                Err(CallError::Rpc { code, data, .. })
                    if code == -32003 && data.as_ref().is_some_and(|d| d["limit"] == "audit") => {}
                Err(e) => panic!("bash/exec {} of {n}: {e:?}", sent + 1),
            }
        }
        sent += window;
    }
    accepted
}

/// (a) An audit file on a full disk: the records that do not fit are counted, the file
/// holds whole records only (a record half taken is cut off again), and once space is
/// freed the records resume behind a `dropped` record. The records present plus the
/// counts of the `dropped` records are every record the daemon made: a `connect` for the
/// harness's probe and for our connection, a `start` and an `exit` per command.
#[test]
fn a_full_disk_keeps_whole_audit_records_and_counts_the_lost_ones() {
    let Some(fs) = Tmpfs::mount("64k") else {
        return;
    };
    // 48 KiB of the 64 leave the audit file 4 pages: a few dozen records.
    let filler = fs.path().join("filler");
    std::fs::write(&filler, vec![0u8; 48 << 10]).expect("filler");
    let audit = fs.path().join("audit.jsonl");
    let mut d = Daemon::start(&["--audit", audit.to_str().expect("utf-8")]);
    let mut c = d.client();
    let size = || std::fs::metadata(&audit).map_or(0, |m| m.len());
    // Full: no page left, and five commands in a row added nothing.
    let (mut commands, mut unchanged) = (0, 0);
    while free_bytes(fs.path()) > 0 || unchanged < 5 {
        let before = size();
        exec(&mut c, "true");
        commands += 1;
        unchanged = if size() == before { unchanged + 1 } else { 0 };
        assert!(commands < 2000, "the audit file never filled the disk");
    }
    let before_full = commands;
    let size_full = size();
    // Commands while the disk is full: their records are lost, and counted.
    for _ in 0..50 {
        exec(&mut c, "true");
        commands += 1;
    }
    // Only a short `dropped` record may still fit what is left of the last page.
    let size_now = size();
    assert!(
        size_now < size_full + 512,
        "a full disk took {size_full} -> {size_now} bytes"
    );
    // Every turn retries the owed `dropped` record: on the full disk part of it may be
    // written and taken back (`ftruncate`) as this reads. Read until the file ends on a
    // whole record, then every record in it is whole.
    let deadline = Instant::now() + WAIT;
    let bytes = loop {
        let bytes = std::fs::read(&audit).expect("read audit");
        if bytes.is_empty() || bytes.ends_with(b"\n") || Instant::now() > deadline {
            break bytes;
        }
        std::thread::sleep(Duration::from_millis(1));
    };
    Audit::parse(&bytes, true);
    wait_until("the daemon logs that the audit file fails", || {
        d.log().contains("audit file: No space left on device")
    });
    let ticks = idle_ticks(d.pid());
    assert!(
        ticks <= IDLE_TICKS,
        "{ticks} ticks in an idle second on a full disk"
    );
    // Space comes back: the next records bring the report with them.
    std::fs::remove_file(&filler).expect("free space");
    let mut last = String::new();
    for _ in 0..10 {
        last = exec(&mut c, "true");
        commands += 1;
    }
    wait_until("the audit file has the last command's exit", || {
        Audit::parse(&std::fs::read(&audit).unwrap_or_default(), false).has("exit", &last)
    });
    assert!(
        d.log().contains("audit file takes records again"),
        "{}",
        d.log()
    );
    drop(c);
    assert_eq!(d.terminate(), Some(0));
    let got = Audit::parse(&std::fs::read(&audit).expect("read audit"), true);
    let made = 2 + 2 * commands as u64;
    eprintln!(
        "full disk: {commands} commands ({before_full} before the disk filled), {made} records \
         made, {} present ({} connect, {} start, {} exit), {:?} counted in dropped records; \
         {ticks} tick(s) in an idle second while full",
        got.records.len(),
        got.count("connect"),
        got.count("start"),
        got.count("exit"),
        got.dropped
    );
    assert!(!got.dropped.is_empty(), "no dropped record");
    assert!(
        got.lost() >= 100,
        "the 50 commands on a full disk: {got:?}",
        got = got.dropped
    );
    assert_eq!(
        got.records.len() as u64 + got.lost(),
        made,
        "records present plus dropped counts must be every record made"
    );
    assert_eq!(got.count("connect"), 2);
    assert_eq!(
        got.count("start") + got.count("exit"),
        got.records.len() - 2
    );
}

/// (b) An audit FIFO whose reader is stopped while 3,000 commands are asked for: those
/// whose start records fit run, the rest are refused (nothing runs unrecorded); the
/// daemon keeps serving and stays idle once they are done; when the reader resumes, the
/// writer resumes with it (it is woken by the FIFO draining, not by other work), a
/// `dropped` record counts what did not fit, and fresh records follow. Everything made
/// is either present or counted, and every command that ran has its start record.
#[test]
fn a_stalled_audit_fifo_resumes_and_reports_what_it_dropped() {
    const COMMANDS: usize = 3000;
    let dir = TempDir::new();
    let fifo = dir.path().join("audit.fifo");
    mkfifo(&fifo);
    let received = dir.path().join("received.jsonl");
    // Started first: cat waits in open(2) for the daemon to open the FIFO.
    let reader = Reader::start(&fifo, &received);
    let socket = dir.path().join("execd.sock");
    let flags = [
        "--audit",
        fifo.to_str().expect("utf-8"),
        "--max-sessions",
        "8192",
    ];
    let d = Daemon::start_at(dir, socket, &flags);
    let read = || std::fs::read(&received).unwrap_or_default();
    wait_until("the probe's connect record arrives", || {
        Audit::parse(&read(), false).count("connect") == 1
    });
    unsafe_kill(reader.pid(), libc::SIGSTOP);
    wait_until("the reader is stopped", || state(reader.pid()) == Some('T'));
    let mut c = d.client();
    let t0 = Instant::now();
    let accepted = exec_async_many(&mut c, COMMANDS);
    let took = t0.elapsed();
    assert!(
        accepted.len() < COMMANDS,
        "3,000 commands' records do not fit a stalled 1 MiB queue"
    );
    // Every command has exited (one command per session, each session idle).
    wait_until("all commands exited", || {
        let r = ok(&mut c, "bash/sessions", json!({}));
        r.as_array()
            .is_some_and(|s| s.iter().all(|s| s["current_command"].is_null()))
    });
    // Records that may be lost (connections') once the queue is full: counted.
    const PROBES: usize = 3;
    for _ in 0..PROBES {
        drop(d.client());
    }
    let seen_while_stalled = Audit::parse(&read(), false).records.len();
    let ticks = idle_ticks(d.pid());
    assert!(
        ticks <= IDLE_TICKS,
        "{ticks} ticks in an idle second with the audit FIFO stalled"
    );
    unsafe_kill(reader.pid(), libc::SIGCONT);
    let resumed = Instant::now();
    wait_until("a dropped record arrives", || {
        !Audit::parse(&read(), false).dropped.is_empty()
    });
    let report_after = resumed.elapsed();
    let fresh: Vec<String> = (0..5).map(|_| exec(&mut c, "true")).collect();
    wait_until("the fresh commands' records arrive", || {
        let a = Audit::parse(&read(), false);
        fresh
            .iter()
            .all(|id| a.has("start", id) && a.has("exit", id))
    });
    let got = Audit::parse(&read(), true);
    let made = (2 + PROBES + 2 * (accepted.len() + fresh.len())) as u64;
    for id in &accepted {
        assert!(got.has("start", id), "{id} ran unrecorded");
    }
    eprintln!(
        "stalled FIFO: {COMMANDS} commands in {took:?} ({seen_while_stalled} records read \
         before the stop), then {} fresh; {made} records made, {} present, {:?} counted in \
         dropped records; the report came {report_after:?} after SIGCONT; {ticks} tick(s) in \
         an idle second while stalled",
        fresh.len(),
        got.records.len(),
        got.dropped
    );
    assert_eq!(
        got.dropped.len(),
        1,
        "one stall, one report: {:?}",
        got.dropped
    );
    assert_eq!(
        got.records.len() as u64 + got.lost(),
        made,
        "records present plus dropped counts must be every record made"
    );
    // The report comes after everything queued before it and before the fresh records.
    let text = String::from_utf8(read()).expect("utf-8");
    let at_report = text.find("\"event\":\"dropped\"").expect("report");
    let at_fresh = text
        .find(&format!("\"id\":\"{}\"", fresh[0]))
        .expect("fresh record");
    assert!(at_report < at_fresh, "the report follows the fresh records");
}

/// (c) The daemon's own log with stderr a pipe nobody reads: commands whose log lines
/// are long (a 4 KiB argument) overflow the 1 MiB queue; the daemon stays idle while it
/// waits; once the pipe is read, whole lines come out, then one line saying how many
/// were dropped, then fresh lines. The lines present plus that count are every line made.
#[test]
fn a_stalled_stderr_keeps_whole_log_lines_and_says_how_many_it_dropped() {
    const COMMANDS: usize = 400;
    let dir = TempDir::new();
    let socket = dir.path().join("execd.sock");
    let mut child = Command::new(env!("CARGO_BIN_EXE_execd"))
        .arg("--socket")
        .arg(&socket)
        // Process groups, whatever the host, chosen: the start is one line.
        .args(["--kill-grace", "1s", "--cgroup", "off"])
        // Lines stamped as they are without the journal.
        .env_remove("JOURNAL_STREAM")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn execd");
    let mut stderr = File::from(OwnedFd::from(child.stderr.take().expect("stderr")));
    let d = Daemon::adopt(Some(child), socket, dir);
    let arg = "A".repeat(4096);
    let mut c = d.client();
    for _ in 0..COMMANDS {
        exec(&mut c, &format!("true {arg}"));
    }
    let ticks = idle_ticks(d.pid());
    assert!(
        ticks <= IDLE_TICKS,
        "{ticks} ticks in an idle second with stderr stalled"
    );
    // SAFETY: fcntl on a descriptor we own, plain integer arguments.
    assert!(unsafe { libc::fcntl(stderr.as_raw_fd(), libc::F_SETFL, libc::O_NONBLOCK) } >= 0);
    let mut got = Vec::new();
    let mut buf = vec![0u8; 64 << 10];
    let mut drain = |got: &mut Vec<u8>| loop {
        match stderr.read(&mut buf) {
            Ok(0) => return,
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return,
            Err(e) => panic!("read the daemon's stderr: {e}"),
        }
    };
    const REPORT: &str = " log line(s) dropped: stderr was not taking them\n";
    wait_until("the log says how many lines it dropped", || {
        drain(&mut got);
        String::from_utf8_lossy(&got).contains(REPORT)
    });
    let fresh = exec(&mut c, "true");
    wait_until("the fresh command's lines arrive", || {
        drain(&mut got);
        String::from_utf8_lossy(&got).contains(&format!("execd: {fresh} exited"))
    });
    let text = String::from_utf8(got).expect("utf-8");
    assert!(text.ends_with('\n'), "ends mid-line");
    let started_tail = format!(" command \"true {arg}\"");
    let (mut present, mut dropped, mut reports) = (0u64, 0u64, 0);
    for line in text.lines() {
        // `2026-11-25T16:21:43.123Z execd: ...`
        let (stamp, rest) = line.split_once(' ').expect("a stamp");
        assert!(
            stamp.len() == 24 && stamp.ends_with('Z'),
            "not a whole line: {:?}",
            &line[..line.len().min(120)]
        );
        let rest = rest.strip_prefix("execd: ").expect("execd: ");
        if let Some(n) = rest.strip_suffix(REPORT.trim_end()) {
            dropped += n.parse::<u64>().expect("a count");
            reports += 1;
            continue;
        }
        present += 1;
        let whole = rest.starts_with("listening on ")
            || rest.contains(" exited: ")
            || (rest.contains(" started: ")
                && (rest.ends_with(&started_tail) || rest.ends_with("command \"true\"")));
        assert!(
            whole,
            "a torn or unexpected line: {:?}",
            &rest[..rest.len().min(200)]
        );
    }
    let made = 1 + 2 * (COMMANDS as u64 + 1);
    eprintln!(
        "stalled stderr: {made} log lines made, {present} present, {dropped} counted dropped \
         in {reports} line(s); {ticks} tick(s) in an idle second while stalled"
    );
    assert_eq!(reports, 1, "one stall, one report");
    assert!(dropped > 0);
    assert_eq!(
        present + dropped,
        made,
        "lines present plus dropped must be every line made"
    );
    let at_report = text.find(REPORT).expect("report");
    let at_fresh = text
        .find(&format!("execd: {fresh} started"))
        .expect("fresh");
    assert!(
        at_report < at_fresh,
        "the report comes before the fresh lines"
    );
}
