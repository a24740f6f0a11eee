//! Process trees that try to outlive their command, for the containment tests: each shape
//! is a shell script whose processes carry a unique marker on their command lines (a
//! `sleep` duration no other test uses), so a test finds exactly its own processes in
//! /proc, and a `Marks` guard SIGKILLs whatever of them is left when the test ends, by
//! pid, even when it fails.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use super::{pid_alive, WAIT};

/// Pids of live processes whose command line holds `marker`.
pub fn with_marker(marker: &str) -> Vec<i32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| e.file_name().to_string_lossy().parse::<i32>().ok())
        .filter(|&pid| pid_alive(pid))
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| {
                String::from_utf8_lossy(&c)
                    .replace('\0', " ")
                    .contains(marker)
            })
        })
        .collect()
}

/// Pids of live `sleep MARKER` processes (the command line exactly that: not a shell whose
/// script mentions it, nor a child not yet exec'd).
pub fn sleeps(marker: &str) -> Vec<i32> {
    let want = format!("sleep\0{marker}\0");
    with_marker(marker)
        .into_iter()
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| c == want.as_bytes())
        })
        .collect()
}

/// A unique `sleep` duration: its command line marks the processes of one test tree.
pub fn marker() -> String {
    static N: AtomicUsize = AtomicUsize::new(1);
    format!(
        "999.{}{:04}",
        std::process::id() % 100_000,
        N.fetch_add(1, Ordering::SeqCst)
    )
}

/// The ways a command's descendants try to outlive it, as shell scripts that start one
/// (marked by `m`), print `ready`, and keep the leader running. Each leaves at least three
/// marked processes running: the leader's shell, its own `sleep`, and the one that tries
/// to get away.
pub const SHAPES: [&str; 6] = [
    "setsid",
    "double fork",
    "nohup",
    "nohup setsid",
    "group background",
    "TERM ignorer",
];

/// The script of shape `shape` (one of `SHAPES`), marked by `m`.
pub fn script(shape: &str, m: &str) -> String {
    let escape = match shape {
        // A new session: out of the process group at once.
        "setsid" => format!("setsid sleep {m} &"),
        // A daemon's double fork: the middle process exits, the grandchild (in a session
        // of its own) is re-parented to execd, the subreaper.
        "double fork" => format!("(setsid sh -c 'sleep {m} & exit' &);"),
        // nohup alone ignores SIGHUP and stays in the group.
        "nohup" => format!("nohup sleep {m} >/dev/null 2>&1 &"),
        "nohup setsid" => format!("nohup setsid sleep {m} >/dev/null 2>&1 &"),
        // A background job whose parent exits: an orphan, still in the group.
        "group background" => format!("sh -c 'sleep {m} &';"),
        // Stays in the group and ignores the polite SIGTERM.
        "TERM ignorer" => format!("(trap '' TERM; exec sleep {m}) &"),
        other => panic!("no such shape {other:?}"),
    };
    // `true` last, so that no shell execs the final `sleep` in its own place: the leader
    // stays a shell, and a tree that is up has three marked processes.
    format!("{escape} echo ready; sleep {m}; true")
}

/// Waits until every process marked `m` is gone; panics naming `what` and the survivors.
#[track_caller]
pub fn all_gone(m: &str, what: &str) {
    let deadline = Instant::now() + WAIT;
    while !with_marker(m).is_empty() {
        assert!(
            Instant::now() < deadline,
            "{what}: processes survived: {:?}",
            with_marker(m)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The markers of a test's trees: on drop, every process still carrying one is SIGKILLed
/// (by pid), so a failing test leaves nothing behind.
#[derive(Default)]
pub struct Marks(pub Vec<String>);

impl Marks {
    /// A new marker, remembered for the cleanup.
    pub fn next(&mut self) -> String {
        let m = marker();
        self.0.push(m.clone());
        m
    }
}

impl Drop for Marks {
    fn drop(&mut self) {
        for m in &self.0 {
            for pid in with_marker(m) {
                super::unsafe_kill(pid, libc::SIGKILL);
            }
        }
    }
}
