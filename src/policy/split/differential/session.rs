//! The differential test's shell-session mode (PROTOCOL 7.2, 12.2): sequences of lines
//! run one after another in ONE interactive bash, set up and fed exactly as a session's
//! shell is (the daemon's own spawn: a PTY and a command socket; `setup_line`, then each
//! line as `command_line` writes it), with every `execve` and `write` of the shell's tree
//! traced. Every program the shell starts between the start marker of a plain line and
//! the start marker of the next line (its own run, and the prompt after it) must be one
//! of the simple commands the splitter reported for that line, read as a session line.
//!
//! Besides the plain lines, the sequences hold lines a person would have to approve, run
//! as if approved: an assignment to every variable of the bash manual's list
//! (`policy::BASH_VARIABLES`), each with values that would run code if the shell ever
//! expanded or evaluated them (`'$(p9)'`, `'a[$(p9)]'`, `'zz1?$(p9)'`), a program name, a
//! number or an option; and lines that change the shell itself (`APPROVED_ODD`: `set -k`,
//! `exec 1>file`, closing bash's saved stdin, ...). Their own windows are not checked (a person saw them); the plain
//! lines after them are: nothing an approved assignment leaves behind may make a later
//! plain line run what its words do not say. Lines the splitter calls unparsed for any
//! other reason are not run, as in the one-line mode.
//!
//! `SPLITTER_SESSION_SEQUENCES` and `SPLITTER_DIFF_SEED` change the number of sequences
//! (each a fresh shell) and the seed.

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::{check, env_number, line, parse_execve, Gen, Run, Scratch, Tools, BIN, PROGRAMS};
use crate::core::shell::{command_line, setup_line, Marker, Scanner};
use crate::core::vocab::LineOpts;
use crate::policy::split::{split_line_traced, Reading};
use crate::policy::{bash_variable, changes_what_runs, BASH_VARIABLES};
use crate::sys::spawn::{read_report, Report, SpawnSpec, Spawner};
use crate::types::{Program, Stdio3, WinSize};

/// Sequences per run (each in a fresh shell), and generated lines in each besides the
/// assignments.
const SEQUENCES: usize = 8;
const GENERATED_PER_SEQUENCE: usize = 80;
/// A line (with its prompt) must be done within this, and the whole run within `RUN`.
const LINE: Duration = Duration::from_secs(20);
const RUN: Duration = Duration::from_secs(600);

/// Values an approved assignment gives: code a shell must never run later, a name, a
/// number, an option, and the program `p9` (a symlink to `/bin/true` like the others,
/// so that running it shows).
const VALUES: &[&str] = &[
    "'$(p9)'",
    "'a[$(p9)]'",
    "'zz1?$(p9)'",
    "'`p9`'",
    "p9",
    "zz1",
    "x",
    "0",
    "1",
    "-k",
];

/// Lines a person might approve that change the shell itself rather than a variable:
/// keyword arguments as assignments (`set -k` would make `p1 A=b` run `p1` with `A=b` in
/// its environment), exporting every assignment, history expansion, the shell's own
/// stdout and stderr redirected or closed, bash's saved copy of its stdin closed, alias
/// expansion on.
const APPROVED_ODD: &[&str] = &[
    "set -k",
    "set -a",
    "set -H",
    "exec 1>./o8",
    "exec 2>&-",
    "exec 10>&-",
    "shopt -s expand_aliases",
];

/// One line of a sequence.
struct Line {
    text: String,
    /// Run as if a person approved it: its window is not checked.
    approved: bool,
}

#[test]
fn session_lines_run_only_what_the_splitter_reported() {
    let test =
        "policy::split::differential::session::session_lines_run_only_what_the_splitter_reported";
    let sequences = env_number("SPLITTER_SESSION_SEQUENCES").map_or(SEQUENCES, |n| n as usize);
    let seed = env_number("SPLITTER_DIFF_SEED").unwrap_or(0x5e55_1012);
    let Some(tools) = Tools::find(test) else {
        return;
    };
    let session = Reading {
        session: true,
        ..Reading::default()
    };
    let started = Instant::now();
    let mut g = Gen(seed);
    let mut plan: Vec<Vec<Line>> = Vec::new();
    let mut skipped = 0;
    for s in 0..sequences {
        let mut lines: Vec<Line> = Vec::new();
        // Every variable of the manual, in every third sequence; `x` is set plainly first
        // (`x='a[$(p9)]'` runs nothing), so that a variable evaluated as arithmetic later
        // would run p9 through it.
        for (i, name) in BASH_VARIABLES.iter().enumerate() {
            if i % 3 == s % 3 {
                lines.push(Line {
                    text: format!("{name}={}", g.pick(VALUES)),
                    approved: true,
                });
            }
        }
        for odd in APPROVED_ODD {
            lines.push(Line {
                text: (*odd).to_owned(),
                approved: true,
            });
        }
        for _ in 0..GENERATED_PER_SEQUENCE {
            let text = line(&mut g, 0);
            if runnable(&text, session) {
                lines.push(Line {
                    text,
                    approved: false,
                });
            } else {
                skipped += 1;
            }
        }
        lines.push(Line {
            text: "x='a[$(p9)]'".into(),
            approved: false,
        });
        // Shuffled; a `PATH=` last, since no program is found after it.
        for i in (1..lines.len()).rev() {
            let j = g.below(i + 1);
            lines.swap(i, j);
        }
        lines.sort_by_key(|l| l.text.starts_with("PATH="));
        plan.push(lines);
    }
    for lines in &plan {
        for l in lines.iter().filter(|l| l.approved) {
            // What the sequences approve is what the policy would have asked about.
            let (split, _) = split_line_traced(&l.text, session);
            let asked = split.unparsed || split.assigned.iter().any(|n| bash_variable(n));
            assert!(asked, "{:?} would not be asked about in a session", l.text);
        }
    }

    let scratch = Scratch::new();
    let bin = scratch.0.join(BIN);
    let link = |target: &Path, name: &str| {
        std::os::unix::fs::symlink(target, bin.join(name)).expect("symlink in scratch bin");
    };
    for (name, real) in &tools.shells {
        link(real, name);
    }
    for program in PROGRAMS.iter().chain(&["p9"]) {
        link(&tools.truth, program);
    }
    let mut failures = Vec::new();
    let (mut ran, mut approved, mut execs, mut shells) = (0, 0, 0, 0);
    for (n, lines) in plan.iter().enumerate() {
        let mut from = 0;
        while from < lines.len() {
            assert!(started.elapsed() < RUN, "the traced run took over {RUN:?}");
            let trace = scratch.0.join(format!("trace-{n}-{from}"));
            let done = run_shell(&tools, &scratch.0, &trace, &lines[from..]);
            shells += 1;
            let windows = windows(&trace, done.nonce.as_str(), done.ran);
            for (i, l) in lines[from..from + done.ran].iter().enumerate() {
                if l.approved {
                    approved += 1;
                    continue;
                }
                ran += 1;
                let (split, shells) = split_line_traced(&l.text, session);
                let run = Run {
                    line: &l.text,
                    split,
                    shells,
                };
                execs += windows[i].len();
                check(&run, &windows[i], &bin, &mut failures);
            }
            // A line that ended its shell (`exit`) ends the sequence's shell; the rest run
            // in a new one, as a session starts one.
            from += done.ran.max(1);
        }
    }
    eprintln!(
        "session differential: {sequences} sequences in {shells} shells: {ran} plain lines \
         checked ({execs} execve), {approved} approved lines run, {skipped} generated \
         lines not run (unparsed or not confined); seed {seed:#x}; {:.1} s",
        started.elapsed().as_secs_f64()
    );
    assert!(
        failures.is_empty(),
        "{} programs ran that the splitter did not report:\n{}",
        failures.len(),
        failures
            .iter()
            .take(40)
            .cloned()
            .collect::<Vec<_>>()
            .join("\n")
    );
    assert!(ran > sequences * 10, "only {ran} plain lines ran");
    assert!(execs > ran / 2, "only {execs} execve");
    assert!(
        approved >= BASH_VARIABLES.len() * 2,
        "only {approved} approved lines"
    );
}

/// How a session's line is read.
fn session_reading() -> Reading {
    Reading {
        session: true,
        ..Reading::default()
    }
}

/// Whether a generated line runs in the test: plain as a session line, setting nothing
/// the policy weighs, naming nothing outside the scratch directory.
fn runnable(text: &str, session: Reading) -> bool {
    let (split, _) = split_line_traced(text, session);
    !split.unparsed
        && !split
            .assigned
            .iter()
            .any(|n| changes_what_runs(n) || bash_variable(n) || n.starts_with("__execd"))
        && super::confined(text)
}

/// What one shell ran: how many lines it took (from the first given) and its nonce.
struct Done {
    ran: usize,
    nonce: String,
}

/// The traced shell: strace's process (the leader of its own session, which holds the
/// shell), killed with its group and reaped when dropped.
struct Shell {
    pid: i32,
}

impl Drop for Shell {
    fn drop(&mut self) {
        crate::sys::reap::signal_group(self.pid, libc::SIGKILL);
        let deadline = Instant::now() + Duration::from_secs(10);
        while crate::sys::reap::try_reap(self.pid).is_none() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

/// Starts a session shell under `strace` (as the daemon starts one, through its own
/// spawner), sends it its setup line and then `lines` one by one, each once the last
/// one's prompt is shown, until they are done or the shell ends; then closes its command
/// channel and waits for the trace to be complete.
fn run_shell(tools: &Tools, scratch: &Path, trace: &Path, lines: &[Line]) -> Done {
    let bin = scratch.join(BIN);
    let work = scratch.join("work");
    let mut args: Vec<String> = ["-f", "-qq", "-xx", "-s", "65536"]
        .iter()
        .map(|a| (*a).to_owned())
        .collect();
    args.extend(
        [
            "-e",
            "trace=execve,execveat,write",
            "-e",
            "signal=none",
            "-o",
        ]
        .map(String::from),
    );
    args.push(trace.display().to_string());
    if tools.seccomp {
        args.push("--seccomp-bpf".into());
    }
    args.push(bin.join("bash").display().to_string());
    args.extend(crate::core::shell::SHELL_ARGS.map(String::from));
    let program = Program::Direct {
        program: tools.strace.display().to_string(),
        args,
    };
    let env: Vec<(String, String)> = [
        ("PATH", bin.display().to_string()),
        ("HOME", work.display().to_string()),
        ("TERM", "dumb".into()),
        ("PS1", String::new()),
        ("PROMPT_COMMAND", String::new()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    let mut spawner = Spawner::new(true, &[], &[], None).expect("spawner");
    let mut spawned = spawner
        .spawn(
            &SpawnSpec {
                program: &program,
                env: &env,
                cwd: &work,
                stdio: Stdio3::Shell(WinSize::DEFAULT),
                user: None,
                cgroup_procs: None,
                tag: None,
                cookie: "differential",
                check_binary: None,
            },
            None,
        )
        .expect("spawn the traced shell");
    let shell = Shell { pid: spawned.pid };
    let deadline = Instant::now() + LINE;
    loop {
        match read_report(spawned.report.as_raw_fd(), Some(&mut spawned.memory)) {
            Report::Execd => break,
            Report::Pending if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(1))
            }
            Report::Pending => panic!("strace did not start"),
            Report::Failed(at, e) => panic!("starting strace: {at:?}: {e}"),
        }
    }
    drop(spawned.memory);
    let tty: PathBuf = spawned.ends.tty_path.clone().expect("the terminal's path");
    let mut master = File::from(spawned.ends.out);
    let mut channel = File::from(spawned.ends.commands.expect("the command channel"));
    let nonce = format!("{:032x}", 0x5e55_1017u128 + shell.pid as u128);
    let mut term = Terminal {
        master: &mut master,
        scan: Scanner::default(),
        offset: 0,
        nonce: &nonce,
        seen: Vec::new(),
        ended: false,
        tail: Vec::new(),
    };
    send(&mut channel, &setup_line(&nonce, &work, false));
    term.until(|m| m.contains(&Marker::Prompt), "the first prompt");
    let mut status = 0;
    let mut ran = 0;
    for (i, l) in lines.iter().enumerate() {
        let seq = i as u64 + 1;
        term.seen.clear();
        // Run as the daemon runs it: guarded when it is not a plain script.
        let guarded = split_line_traced(&l.text, session_reading()).0.unparsed;
        let text = command_line(seq, &l.text, &LineOpts::default(), (&tty, status), guarded);
        send(&mut channel, &text);
        let what = format!("line {:?}", l.text);
        let ended = term.until(
            |m| {
                let start = m.iter().position(|m| *m == Marker::Start { seq });
                start.is_some_and(|s| {
                    let end = m[s..].iter().position(|m| matches!(m, Marker::End { .. }));
                    end.is_some_and(|e| m[s + e..].contains(&Marker::Prompt))
                })
            },
            &what,
        );
        ran += 1;
        if !ended {
            break; // the line ended the shell
        }
        if let Some(Marker::End { status: s, .. }) = term
            .seen
            .iter()
            .rev()
            .find(|m| matches!(m, Marker::End { .. }))
        {
            status = *s;
        }
    }
    // EOF on its channel ends the shell; strace ends with it, its trace complete.
    drop(channel);
    let deadline = Instant::now() + LINE;
    loop {
        match crate::sys::reap::try_reap(shell.pid) {
            // strace ends as the shell did: with its last status, or killed as it was
            // (a shell that finds its stdin gone ends itself with SIGKILL).
            Some(_) => break,
            None if Instant::now() < deadline => {
                // Its terminal must be read for it to finish writing.
                let mut buf = [0u8; 4096];
                let _ = term.master.read(&mut buf);
                std::thread::sleep(Duration::from_millis(2));
            }
            None => panic!("the traced shell did not end at EOF"),
        }
    }
    std::mem::forget(shell); // reaped
    Done { ran, nonce }
}

/// Writes all of `bytes` to the (non-blocking) command channel.
fn send(channel: &mut File, bytes: &[u8]) {
    let deadline = Instant::now() + LINE;
    let mut at = 0;
    while at < bytes.len() {
        match channel.write(&bytes[at..]) {
            Ok(n) => at += n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(1))
            }
            Err(e) => panic!("writing to the shell: {e} (does it still read its channel?)"),
        }
    }
}

/// The shell's terminal, read for markers.
struct Terminal<'a> {
    master: &'a mut File,
    scan: Scanner,
    offset: u64,
    nonce: &'a str,
    /// The markers read since the last line was sent.
    seen: Vec<Marker>,
    /// The terminal was hung up: the shell is gone.
    ended: bool,
    /// The last output read, for a message.
    tail: Vec<u8>,
}

impl Terminal<'_> {
    /// Reads until `done(markers seen)`; false if the shell ended first. Panics after
    /// `LINE`, naming `what`.
    fn until(&mut self, done: impl Fn(&[Marker]) -> bool, what: &str) -> bool {
        let deadline = Instant::now() + LINE;
        let mut buf = [0u8; 16 << 10];
        while !done(&self.seen) {
            if self.ended {
                return false;
            }
            match self.master.read(&mut buf) {
                Ok(0) => self.ended = true,
                Ok(n) => {
                    self.tail.extend_from_slice(&buf[..n]);
                    let cut = self.tail.len().saturating_sub(2000);
                    self.tail.drain(..cut);
                    for (m, _, _) in self.scan.feed(self.nonce, self.offset, &buf[..n]) {
                        self.seen.push(m);
                    }
                    self.offset += n as u64;
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    assert!(
                        Instant::now() < deadline,
                        "{what} took over {LINE:?}; markers {:?}; the terminal showed: {:?}",
                        self.seen,
                        String::from_utf8_lossy(&self.tail)
                    );
                    std::thread::sleep(Duration::from_millis(1));
                }
                // EIO: every slave descriptor is closed, the shell is gone.
                Err(_) => self.ended = true,
            }
        }
        true
    }
}

/// The `execve`s of each of the first `lines` lines, from the trace: a line's window
/// opens at its start marker (the shell's `write` of it) and closes at the next one.
fn windows(trace: &Path, nonce: &str, lines: usize) -> Vec<Vec<super::Exec>> {
    let text = std::fs::read_to_string(trace).expect("read trace");
    let mut per_line: Vec<Vec<super::Exec>> = (0..lines).map(|_| Vec::new()).collect();
    let start = format!("\x1b]6973;s;{nonce};");
    let mut current: Option<usize> = None;
    for record in text.lines() {
        assert!(
            !record.contains("execveat("),
            "unexpected execveat: {record}"
        );
        if let Some(at) = record.find(" write(") {
            let rest = &record[at + " write(".len()..];
            let Some(rest) = rest.find(", ").map(|c| &rest[c + 2..]) else {
                continue;
            };
            if let Some((written, _)) = super::hex_string(rest) {
                if let Some(seq) = written.strip_prefix(&start) {
                    let seq: usize = seq.trim_end_matches('\x07').parse().expect("a seq");
                    current = seq.checked_sub(1);
                }
            }
            continue;
        }
        if !record.contains("execve(") {
            continue;
        }
        let Some(exec) = parse_execve(record) else {
            panic!("cannot read trace record: {record}");
        };
        if let Some(execs) = current.and_then(|i| per_line.get_mut(i)) {
            execs.push(exec);
        }
    }
    per_line
}
