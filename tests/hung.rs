//! A process whose memory hangs holds only what asks about it (PROTOCOL 7.3, 12.3, 14).
//!
//! The cookie sweeps and the looks for input read other processes' memory (their
//! environment, a poll set), which waits for the target's memory lock. The process here
//! (`util::mapper`) holds that lock forever, as one does whose thread faults on a mapping
//! of a dead NFS or FUSE file while another thread maps memory: its faulting thread
//! waits for a READ this test's FUSE file system (`util::fuse`) holds, and its main
//! thread's `mmap` queues behind it, so every later reader of its memory (`ps` too) waits.
//!
//! Each test holds such a hang for `HOLD` while another connection pings the daemon in a
//! loop: every ping must be answered within `PING_BOUND` (a generous bound for loaded
//! machines; the latencies are printed), and other commands must be served (swept, found
//! waiting) meanwhile. The reads go through the daemon's off-loop reader, which is killed
//! and replaced when a read outlasts its deadline. Once the hang is released, what was
//! skipped is read again and everything ends cleanly. Were the reads made on the loop,
//! the pings would wait for the whole hold.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::util::fuse::SlowFs;
use crate::util::mapper;
use crate::util::*;

/// How long each hang is held while others are served: far past `PING_BOUND`.
const HOLD: Duration = Duration::from_secs(5);
/// The longest a ping may take while a hang is held.
const PING_BOUND: Duration = Duration::from_secs(2);
/// What the daemon logs when its reader was replaced over a hung process.
const REPLACED: &str = "did not let its memory be read";

/// One hang at a time: while one lasts, every reader of that process's memory on the
/// machine waits (other tests' reads of `/proc/PID/cmdline` among them).
static ONE_HANG: Mutex<()> = Mutex::new(());

/// A FUSE file system whose reads are held, and what turns this test binary into a
/// process that maps it (`util::mapper`).
struct Hang {
    fs: SlowFs,
    go: PathBuf,
    _dir: TempDir,
    _one: MutexGuard<'static, ()>,
}

impl Hang {
    /// Mounted, or `None` (after `skip`) where FUSE is not available.
    #[track_caller]
    fn new() -> Option<Hang> {
        let one = ONE_HANG.lock().unwrap_or_else(|p| p.into_inner());
        let fs = match SlowFs::mount() {
            Ok(fs) => fs,
            Err(why) => {
                skip(&why);
                return None;
            }
        };
        let dir = TempDir::new();
        Some(Hang {
            fs,
            go: dir.path().join("go"),
            _dir: dir,
            _one: one,
        })
    }

    /// The environment of the mapper, as `NAME=VALUE` words for `env` or a shell line.
    fn env(&self) -> [String; 2] {
        [
            format!("{}={}", mapper::MAP, self.fs.data().display()),
            format!("{}={}", mapper::GO, self.go.display()),
        ]
    }

    /// Waits until the mapper holds its memory lock in a held READ and its `mmap` waits
    /// behind it; returns the mapper's pid.
    #[track_caller]
    fn hold(&self) -> i32 {
        let tid = self.fs.wait_read_held() as i32;
        let pid = tgid(tid).expect("the faulting thread's process");
        std::fs::write(&self.go, b"").expect("let the mapper go");
        wait_until("the mapper's mmap waits behind its fault", || {
            state(pid) == Some('D')
        });
        pid
    }
}

/// The process thread `tid` belongs to.
fn tgid(tid: i32) -> Option<i32> {
    let status = std::fs::read_to_string(format!("/proc/{tid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("Tgid:"))?
        .trim()
        .parse()
        .ok()
}

/// The state letter of `pid` (`/proc/PID/stat` takes no lock of its memory).
fn state(pid: i32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit(')')
        .next()?
        .split_whitespace()
        .next()?
        .chars()
        .next()
}

/// SIGKILLs the mapper when the test ends, whatever happened (it dies once its read is
/// answered, which the `Hang` dropped next makes sure of).
struct KillOnDrop(i32);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if self.0 > 0 {
            unsafe_kill(self.0, libc::SIGKILL);
        }
    }
}

/// Another connection pinging the daemon (`initialize`) in a loop until finished.
struct Pinger {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<Vec<Duration>>>,
}

impl Pinger {
    fn start(d: &Daemon) -> Pinger {
        let stop = Arc::new(AtomicBool::new(false));
        let mut c = d.client();
        let thread = {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut took = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    let t = Instant::now();
                    let answered = c.call("initialize", json!({"protocolVersion": 1}));
                    took.push(t.elapsed());
                    if answered.is_err() {
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(20));
                }
                took
            })
        };
        Pinger {
            stop,
            thread: Some(thread),
        }
    }

    /// Stops; every ping was answered within `PING_BOUND` (the figures are printed).
    #[track_caller]
    fn finish(mut self, what: &str) {
        self.stop.store(true, Ordering::Relaxed);
        let mut took = self
            .thread
            .take()
            .and_then(|t| t.join().ok())
            .unwrap_or_default();
        assert!(took.len() > 10, "{what}: only {} pings", took.len());
        took.sort();
        let at = |q: f64| took[((took.len() - 1) as f64 * q) as usize];
        eprintln!(
            "{what}: {} pings while a process's memory hung: p50 {:?}, p99 {:?}, max {:?}",
            took.len(),
            at(0.5),
            at(0.99),
            at(1.0)
        );
        assert!(
            at(1.0) < PING_BOUND,
            "{what}: a ping took {:?} while a process's memory hung",
            at(1.0)
        );
    }
}

impl Drop for Pinger {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// This test binary, which `util::mapper` turns into the mapper.
fn exe() -> String {
    std::env::current_exe()
        .expect("the test binary")
        .display()
        .to_string()
}

/// Waits until the log says the reader was replaced over a hung process, and a reader
/// other than `before` (the one that ran before the hang) runs.
#[track_caller]
fn replaced(d: &Daemon, before: Option<i32>) {
    assert!(before.is_some(), "the daemon's reader ran");
    wait_until("the reader is replaced over the hung process", || {
        d.log().contains(REPLACED)
    });
    wait_until("a new reader runs", || {
        reader_of(d.pid()).is_some_and(|r| Some(r) != before)
    });
}

/// A kill sweeps for its command's cookie while a process carrying that cookie (it left
/// the group with `setsid`) cannot have its environment read: the sweep skips it, another
/// command's kill sweeps its own escapee meanwhile, the daemon answers throughout, and
/// once the hang is over the skipped process is read again and killed.
#[test]
fn a_kill_whose_sweep_meets_a_hung_process_holds_nobody() {
    // Declared first, dropped last: a failing test releases the hang before the daemon
    // stops.
    let d = Daemon::start(&["--kill-grace", "0s"]);
    let Some(h) = Hang::new() else { return };
    let mut c = d.client();
    let [map, go] = h.env();
    let id = create_with(
        &mut c,
        json!({"sessionId": "s", "command": "sh",
               "args": ["-c", "env \"$1\" \"$2\" setsid \"$0\" & exec sleep 600", exe(), map, go]}),
    );
    let mapper = KillOnDrop(h.hold());
    let before = reader_of(d.pid());
    let held = Instant::now();
    let pinger = Pinger::start(&d);
    ok(
        &mut c,
        "terminal/kill",
        json!({"sessionId": "s", "terminalId": id}),
    );
    // Another command's escapee is swept while the hang lasts.
    let other = create_with(
        &mut c,
        json!({"sessionId": "s", "command": "sh",
               "args": ["-c", "setsid sleep 600 & echo $!; exec sleep 600"]}),
    );
    let mut escapee = None;
    wait_until("the other escapee's pid", || {
        escapee = output(&mut c, &other)["output"]
            .as_str()
            .and_then(|o| o.lines().next()?.trim().parse::<i32>().ok());
        escapee.is_some()
    });
    let escapee = escapee.unwrap_or_default();
    ok(
        &mut c,
        "terminal/kill",
        json!({"sessionId": "s", "terminalId": other}),
    );
    wait_until("the other escapee is swept", || !pid_alive(escapee));
    replaced(&d, before);
    std::thread::sleep(HOLD.saturating_sub(held.elapsed()));
    assert_eq!(state(mapper.0), Some('D'), "the hang lasted");
    pinger.finish("kill");
    h.fs.release_reads();
    wait_until("the skipped process, read again, is killed", || {
        !pid_alive(mapper.0)
    });
    // The sweep's line is queued after its kill, in the same turn.
    let said = format!(": {} ", mapper.0);
    wait_until("the kill of the skipped process is logged", || {
        d.log().contains(&said)
    });
}

/// A look for input at a command whose poll set cannot be read (its memory hangs) is not
/// known, and holds nobody: another command is found waiting meanwhile, the daemon
/// answers throughout, and once the hang is over the command is found waiting too.
#[test]
fn a_look_for_input_at_a_hung_process_holds_nobody() {
    let d = Daemon::start(&[]);
    let Some(h) = Hang::new() else { return };
    let mut c = d.client();
    let [map, go] = h.env();
    let start = |c: &mut Client, session: &str, line: &str| {
        ok(
            c,
            "bash/exec",
            json!({"command": line, "session_id": session, "async_mode": true}),
        );
    };
    start(
        &mut c,
        "hung",
        &format!("exec env '{map}' '{go}' '{}'", exe()),
    );
    let mapper = KillOnDrop(h.hold());
    let before = reader_of(d.pid());
    let held = Instant::now();
    let pinger = Pinger::start(&d);
    let waiting = |c: &mut Client, session: &str| {
        ok(c, "bash/output", json!({"session_id": session}))["waiting_for_input"] == true
    };
    start(&mut c, "other", "cat");
    wait_until("another command is found waiting", || {
        waiting(&mut c, "other")
    });
    replaced(&d, before);
    std::thread::sleep(HOLD.saturating_sub(held.elapsed()));
    assert_eq!(state(mapper.0), Some('D'), "the hang lasted");
    assert!(!waiting(&mut c, "hung"), "not known while it hangs");
    pinger.finish("look");
    h.fs.release_reads();
    wait_until(
        "the command is found waiting once its memory answers",
        || waiting(&mut c, "hung"),
    );
    for session in ["hung", "other"] {
        ok(
            &mut c,
            "bash/kill",
            json!({"session_id": session, "signal": "SIGKILL"}),
        );
    }
    wait_until("the mapper is gone", || !pid_alive(mapper.0));
}

/// The sweep of every cookie at shutdown skips a hung process, so the daemon stops in
/// time; the next daemon on the socket sweeps what it left at start while serving, and
/// kills it once its memory answers.
#[test]
fn a_stop_and_the_next_start_sweep_past_a_hung_process() {
    let home = TempDir::new();
    let socket = home.path().join("execd.sock");
    let mut d = Daemon::start_at(TempDir::new(), socket.clone(), &[]);
    let Some(h) = Hang::new() else { return };
    let mut c = d.client();
    let [map, go] = h.env();
    create_with(
        &mut c,
        json!({"sessionId": "s", "command": "sh",
               "args": ["-c", "env \"$1\" \"$2\" setsid \"$0\" & exec sleep 600", exe(), map, go]}),
    );
    let mapper = KillOnDrop(h.hold());
    let held = Instant::now();
    let t = Instant::now();
    d.terminate();
    eprintln!("stop: the daemon stopped {:?} after SIGTERM", t.elapsed());
    assert!(
        d.log().contains(REPLACED),
        "the final sweep met it:\n{}",
        d.log()
    );
    assert!(
        pid_alive(mapper.0),
        "what it could not read is left to the next start"
    );
    let again = Daemon::start_at(TempDir::new(), socket, &[]);
    let pinger = Pinger::start(&again);
    wait_until("the start-up sweep meets it", || {
        again.log().contains(REPLACED)
    });
    std::thread::sleep(HOLD.saturating_sub(held.elapsed()));
    assert_eq!(state(mapper.0), Some('D'), "the hang lasted");
    pinger.finish("start");
    h.fs.release_reads();
    wait_until("the leftover, read again, is killed", || {
        !pid_alive(mapper.0)
    });
    wait_until("its kill is logged", || {
        again
            .log()
            .contains("an earlier instance on this socket left")
    });
}
