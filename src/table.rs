//! The process table and the bash sessions: what runs, who owns it, what it printed, how
//! it ended. Fed events and `now` by the server; makes no system calls.
//!
//! Invariants:
//! - A process is found by its public id (`term_N`, `cmd_N`) only while it is not
//!   released; a released one stays (hidden) until it is reaped and its waiters answered.
//! - `running` counts processes whose leader has not been reaped.
//! - Foreign ids look exactly like unknown ones: `find` takes the caller's uid.

use std::collections::{HashMap, VecDeque};
use std::fs::File;
use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime};

use mio::Token;

use crate::process::{Ended, Usage};
use crate::ring::Ring;

/// Internal key of a process record; never reused.
pub type Key = u64;

/// Which protocol created the process.
#[derive(Debug, Clone, PartialEq)]
pub enum Family {
    /// An ACP terminal: stdout and stderr merged into one stream.
    Terminal { session_id: String },
    /// A bash command in a bash session: stdout and stderr apart, stdin a pipe.
    Bash { session_id: String },
}

/// Why the daemon ended a command, when it did.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum KillReason {
    /// `terminal/kill`, `bash/kill`, release, session close or shutdown.
    Killed,
    /// The bash `hard_timeout` passed.
    TimedOut,
}

/// One output stream: its ring and its pipe.
#[derive(Debug)]
pub struct Stream {
    pub ring: Ring,
    /// The read end; `None` once EOF was seen or the process was released.
    pub fd: Option<File>,
    pub token: Token,
    /// The pipe was found full once and has been grown.
    pub grown: bool,
}

impl Stream {
    /// Whether more bytes may still arrive.
    pub fn open(&self) -> bool {
        self.fd.is_some()
    }

    /// The end of what may be handed out as text now (an incomplete trailing character of
    /// an open stream is held back).
    pub fn text_end(&self) -> u64 {
        self.ring
            .utf8_window(self.ring.start(), self.ring.end(), self.open())
            .1
    }
}

/// A command's stdin: a fixed-capacity buffer drained into the pipe as it accepts.
#[derive(Debug)]
pub struct Stdin {
    pub fd: Option<File>,
    pub token: Token,
    pub buf: VecDeque<u8>,
    pub capacity: usize,
    /// Close the pipe once `buf` drains.
    pub eof_requested: bool,
    /// Whether the pipe is registered for WRITABLE.
    pub registered: bool,
    /// Bytes accepted but never delivered (the command closed its stdin or exited).
    pub undelivered: u64,
}

/// How a command ended.
#[derive(Debug, Clone, Copy)]
pub struct Exit {
    pub ended: Ended,
    pub usage: Usage,
    pub at: Instant,
}

/// One subscriber of a process's output (see `events`).
#[derive(Debug, Clone)]
pub struct Sub {
    pub conn: Token,
    /// Next offset to deliver, per stream.
    pub next: [u64; 2],
    /// The subscriber fell behind its connection's cap; a `Gap` is owed per stream.
    pub lagging: bool,
    /// `Exit` has been delivered.
    pub done: bool,
}

/// One command, terminal or bash.
#[derive(Debug)]
pub struct Proc {
    pub key: Key,
    /// Public id: `term_N` or `cmd_N`.
    pub id: String,
    pub family: Family,
    pub owner: u32,
    /// What the client asked to run (program, or the shell line).
    pub command: String,
    pub args: Vec<String>,
    pub cwd: PathBuf,
    pub pid: i32,
    pub started: Instant,
    pub started_wall: SystemTime,
    /// One stream (merged) for terminals; stdout and stderr for bash commands.
    pub streams: Vec<Stream>,
    pub stdin: Option<Stdin>,
    pub exit: Option<Exit>,
    pub kill: Option<KillReason>,
    /// `bash/kill` sent it a terminating signal: ending by a signal then means `killed`.
    pub signalled: bool,
    /// Hidden from lookups by release; kept until reaped and its waiters answered.
    pub released: bool,
    /// Its process group may still have members (true while the leader runs; after that,
    /// as last seen). A group known empty is never signalled: its number may be reused.
    pub group_alive: bool,
    /// The bash `hard_timeout`, cancelled when the command exits first.
    pub hard_timer: Option<crate::timers::TimerId>,
    /// Parked requests interested in this process.
    pub waiters: Vec<u64>,
    pub subs: Vec<Sub>,
}

impl Proc {
    /// A just-started process: running, unreleased, nothing waiting or subscribed.
    #[allow(clippy::too_many_arguments)] // one field each; a builder would add nothing
    pub fn started(
        key: Key,
        id: String,
        family: Family,
        owner: u32,
        command: String,
        args: Vec<String>,
        cwd: PathBuf,
        pid: i32,
        started: Instant,
        streams: Vec<Stream>,
        stdin: Option<Stdin>,
    ) -> Proc {
        Proc {
            key,
            id,
            family,
            owner,
            command,
            args,
            cwd,
            pid,
            started,
            started_wall: SystemTime::now(),
            streams,
            stdin,
            exit: None,
            kill: None,
            signalled: false,
            released: false,
            group_alive: true,
            hard_timer: None,
            waiters: Vec::new(),
            subs: Vec::new(),
        }
    }

    pub fn running(&self) -> bool {
        self.exit.is_none()
    }

    /// Total bytes of output produced so far, all streams.
    pub fn output_bytes(&self) -> u64 {
        self.streams.iter().map(|s| s.ring.end()).sum()
    }

    /// Bash status word: `running`, `completed`, `timed_out` or `killed`.
    ///
    /// `killed` means execd ended it: a kill, release, session close or shutdown, or a
    /// `bash/kill` signal it died of. A command that dies of a signal nobody here sent
    /// (a crash) is `completed`, with `exit_code: null` and its `signal`.
    pub fn status(&self) -> &'static str {
        let Some(exit) = &self.exit else {
            return "running";
        };
        match (self.kill, exit.ended) {
            (Some(KillReason::TimedOut), _) => "timed_out",
            (Some(KillReason::Killed), _) => "killed",
            (None, Ended::Signal(_)) if self.signalled => "killed",
            _ => "completed",
        }
    }

    /// `(exit code, signal name)` as every protocol reports them: a code with no signal
    /// when it exited, no code and the signal's name when a signal ended it, and neither
    /// while it runs.
    pub fn exit_fields(&self) -> (Option<i32>, Option<String>) {
        match self.exit.map(|e| e.ended) {
            Some(Ended::Code(c)) => (Some(c), None),
            Some(Ended::Signal(sig)) => (None, Some(crate::process::signal_name(sig))),
            None => (None, None),
        }
    }

    pub fn duration(&self) -> Duration {
        match &self.exit {
            Some(e) => e.at.saturating_duration_since(self.started),
            None => Duration::ZERO,
        }
    }

    pub fn session_id(&self) -> &str {
        match &self.family {
            Family::Terminal { session_id } | Family::Bash { session_id } => session_id,
        }
    }
}

/// A bash session: API-level state shared by its commands.
#[derive(Debug)]
pub struct Session {
    pub id: String,
    pub owner: u32,
    pub workdir: PathBuf,
    pub created_wall: SystemTime,
    pub last_used: Instant,
    pub last_used_wall: SystemTime,
    /// Commands in start order (finished ones beyond the history limit are dropped).
    pub commands: VecDeque<Key>,
    pub command_count: u64,
    /// The pending idle check, cancelled when the session closes.
    pub idle_timer: Option<crate::timers::TimerId>,
}

/// Whether `caller` may see something owned by `owner`: the owner itself, or root.
pub fn visible(owner: u32, caller: u32) -> bool {
    owner == caller || caller == 0
}

/// All processes and sessions.
#[derive(Debug, Default)]
pub struct Table {
    pub procs: HashMap<Key, Proc>,
    ids: HashMap<String, Key>,
    pids: HashMap<i32, Key>,
    pub sessions: HashMap<String, Session>,
    next_key: Key,
    next_session: u64,
    running: usize,
    /// Exited, unreleased terminals per owner, oldest first.
    exited_terminals: HashMap<u32, VecDeque<Key>>,
}

impl Table {
    pub fn running(&self) -> usize {
        self.running
    }

    /// Allocates the key and public id for a new process (`term_N` or `cmd_N`).
    pub fn next_ids(&mut self, prefix: &str) -> (Key, String) {
        self.next_key += 1;
        (self.next_key, format!("{prefix}_{}", self.next_key))
    }

    /// Records a started process.
    pub fn insert(&mut self, p: Proc) {
        self.ids.insert(p.id.clone(), p.key);
        self.pids.insert(p.pid, p.key);
        self.running += 1;
        if let Family::Bash { session_id } = &p.family {
            if let Some(s) = self.sessions.get_mut(session_id) {
                s.commands.push_back(p.key);
                s.command_count += 1;
            }
        }
        self.procs.insert(p.key, p);
    }

    /// The key of the visible, unreleased process with public id `id`.
    pub fn find(&self, id: &str, caller: u32) -> Option<Key> {
        let key = *self.ids.get(id)?;
        let p = self.procs.get(&key)?;
        visible(p.owner, caller).then_some(key)
    }

    pub fn get(&self, key: Key) -> Option<&Proc> {
        self.procs.get(&key)
    }

    pub fn get_mut(&mut self, key: Key) -> Option<&mut Proc> {
        self.procs.get_mut(&key)
    }

    /// The process whose leader is `pid`, if it is still running.
    pub fn by_pid(&self, pid: i32) -> Option<Key> {
        self.pids.get(&pid).copied()
    }

    /// Whether a running process of ours leads group `pgid` (so the number is in use).
    pub fn leads_group(&self, pgid: i32) -> bool {
        self.pids.contains_key(&pgid)
    }

    /// Records an exit. Returns the terminals to release because their owner now keeps
    /// more than `max_retained` exited ones (oldest first).
    pub fn record_exit(&mut self, key: Key, exit: Exit, max_retained: usize) -> Vec<Key> {
        let Some(p) = self.procs.get_mut(&key) else {
            return Vec::new();
        };
        if p.exit.is_some() {
            return Vec::new();
        }
        p.exit = Some(exit);
        self.pids.remove(&p.pid);
        self.running -= 1;
        if p.released || !matches!(p.family, Family::Terminal { .. }) {
            return Vec::new();
        }
        let q = self.exited_terminals.entry(p.owner).or_default();
        q.push_back(key);
        let mut evict = Vec::new();
        while q.len() > max_retained {
            if let Some(k) = q.pop_front() {
                evict.push(k);
            }
        }
        evict
    }

    /// Hides a process from lookups (release). It stays until `remove`.
    pub fn hide(&mut self, key: Key) {
        if let Some(p) = self.procs.get_mut(&key) {
            p.released = true;
            self.ids.remove(&p.id);
            if let Some(q) = self.exited_terminals.get_mut(&p.owner) {
                q.retain(|k| *k != key);
            }
        }
    }

    /// Forgets a process entirely.
    pub fn remove(&mut self, key: Key) -> Option<Proc> {
        let p = self.procs.remove(&key)?;
        self.ids.remove(&p.id);
        if p.exit.is_none() {
            self.pids.remove(&p.pid);
            self.running -= 1;
        }
        if let Some(q) = self.exited_terminals.get_mut(&p.owner) {
            q.retain(|k| *k != key);
            if q.is_empty() {
                self.exited_terminals.remove(&p.owner);
            }
        }
        if let Family::Bash { session_id } = &p.family {
            if let Some(s) = self.sessions.get_mut(session_id) {
                s.commands.retain(|k| *k != key);
            }
        }
        Some(p)
    }

    /// Visible, unreleased processes, newest first.
    pub fn list(&self, caller: u32) -> Vec<&Proc> {
        let mut v: Vec<&Proc> = self
            .procs
            .values()
            .filter(|p| !p.released && visible(p.owner, caller))
            .collect();
        v.sort_by_key(|p| std::cmp::Reverse(p.key));
        v
    }

    /// A fresh bash session id that no session uses.
    pub fn new_session_id(&mut self) -> String {
        loop {
            self.next_session += 1;
            let id = format!("session_{}", self.next_session);
            if !self.sessions.contains_key(&id) {
                return id;
            }
        }
    }

    /// The visible session `id`.
    pub fn session(&self, id: &str, caller: u32) -> Option<&Session> {
        self.sessions.get(id).filter(|s| visible(s.owner, caller))
    }

    /// Marks a session used now.
    pub fn touch_session(&mut self, id: &str, now: Instant) {
        if let Some(s) = self.sessions.get_mut(id) {
            s.last_used = now;
            s.last_used_wall = SystemTime::now();
        }
    }

    /// Whether any command of the session is running.
    pub fn session_busy(&self, id: &str) -> bool {
        self.sessions.get(id).is_some_and(|s| {
            s.commands
                .iter()
                .any(|k| self.procs.get(k).is_some_and(Proc::running))
        })
    }

    /// The session's newest command.
    pub fn newest_command(&self, session: &str) -> Option<Key> {
        self.sessions.get(session)?.commands.back().copied()
    }

    /// The session's newest running command.
    pub fn newest_running(&self, session: &str) -> Option<Key> {
        let s = self.sessions.get(session)?;
        s.commands
            .iter()
            .rev()
            .copied()
            .find(|k| self.procs.get(k).is_some_and(Proc::running))
    }

    /// Finished commands of the session beyond the newest `keep` finished ones, oldest
    /// first: the ones to drop.
    pub fn history_overflow(&self, session: &str, keep: usize) -> Vec<Key> {
        let Some(s) = self.sessions.get(session) else {
            return Vec::new();
        };
        let finished: Vec<Key> = s
            .commands
            .iter()
            .copied()
            .filter(|k| self.procs.get(k).is_some_and(|p| !p.running()))
            .collect();
        finished[..finished.len().saturating_sub(keep)].to_vec()
    }

    /// Sessions unused for `idle` and running nothing at `now`.
    pub fn idle_sessions(&self, now: Instant, idle: Duration) -> Vec<String> {
        let mut v: Vec<String> = self
            .sessions
            .values()
            .filter(|s| now.saturating_duration_since(s.last_used) >= idle)
            .filter(|s| !self.session_busy(&s.id))
            .map(|s| s.id.clone())
            .collect();
        v.sort();
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn proc(t: &mut Table, prefix: &str, family: Family, owner: u32, pid: i32) -> Key {
        let (key, id) = t.next_ids(prefix);
        let cwd = PathBuf::from("/");
        let p = Proc::started(
            key,
            id,
            family,
            owner,
            "true".into(),
            vec![],
            cwd,
            pid,
            Instant::now(),
            vec![],
            None,
        );
        t.insert(p);
        key
    }

    fn exit() -> Exit {
        Exit {
            ended: Ended::Code(0),
            usage: Usage::default(),
            at: Instant::now(),
        }
    }

    fn term(session: &str) -> Family {
        Family::Terminal {
            session_id: session.into(),
        }
    }

    fn session(t: &mut Table, id: &str, owner: u32, now: Instant) {
        t.sessions.insert(
            id.into(),
            Session {
                id: id.into(),
                owner,
                workdir: "/".into(),
                created_wall: SystemTime::now(),
                last_used: now,
                last_used_wall: SystemTime::now(),
                commands: VecDeque::new(),
                command_count: 0,
                idle_timer: None,
            },
        );
    }

    #[test]
    fn foreign_ids_look_unknown_except_to_root() {
        let mut t = Table::default();
        let k = proc(&mut t, "term", term("s"), 1000, 10);
        let id = t.get(k).unwrap().id.clone();
        assert_eq!(t.find(&id, 1000), Some(k));
        assert_eq!(t.find(&id, 1001), None);
        assert_eq!(t.find(&id, 0), Some(k));
        assert_eq!(t.find("term_999", 1000), None);
    }

    #[test]
    fn exit_and_release_bookkeeping() {
        let mut t = Table::default();
        let k = proc(&mut t, "term", term("s"), 1, 10);
        assert_eq!(t.running(), 1);
        assert_eq!(t.by_pid(10), Some(k));
        assert!(t.record_exit(k, exit(), 8).is_empty());
        assert_eq!(t.running(), 0);
        assert_eq!(t.by_pid(10), None);
        // A second report of the same exit changes nothing.
        t.record_exit(k, exit(), 8);
        assert_eq!(t.running(), 0);
        let id = t.get(k).unwrap().id.clone();
        t.hide(k);
        assert_eq!(t.find(&id, 1), None);
        assert!(t.get(k).is_some(), "hidden until removed");
        t.remove(k);
        assert!(t.get(k).is_none());
        assert_eq!(t.running(), 0);
    }

    #[test]
    fn removing_a_running_process_fixes_the_count() {
        let mut t = Table::default();
        let k = proc(&mut t, "term", term("s"), 1, 10);
        t.remove(k);
        assert_eq!(t.running(), 0);
        assert_eq!(t.by_pid(10), None);
    }

    #[test]
    fn retained_exited_terminals_are_capped_per_owner() {
        let mut t = Table::default();
        let keys: Vec<Key> = (0..5)
            .map(|i| proc(&mut t, "term", term("s"), 7, 100 + i))
            .collect();
        let other = proc(&mut t, "term", term("s"), 8, 200);
        assert!(t.record_exit(other, exit(), 2).is_empty());
        assert!(t.record_exit(keys[0], exit(), 2).is_empty());
        assert!(t.record_exit(keys[1], exit(), 2).is_empty());
        assert_eq!(t.record_exit(keys[2], exit(), 2), vec![keys[0]]);
        // A released one no longer counts.
        t.hide(keys[1]);
        assert!(t.record_exit(keys[3], exit(), 2).is_empty());
        assert_eq!(t.record_exit(keys[4], exit(), 2), vec![keys[2]]);
    }

    #[test]
    fn bash_history_keeps_the_newest_finished_commands() {
        let mut t = Table::default();
        let now = Instant::now();
        session(&mut t, "b", 1, now);
        let bash = || Family::Bash {
            session_id: "b".into(),
        };
        let keys: Vec<Key> = (0..5)
            .map(|i| proc(&mut t, "cmd", bash(), 1, 300 + i))
            .collect();
        assert_eq!(t.get(keys[0]).unwrap().status(), "running");
        for k in &keys[..4] {
            t.record_exit(*k, exit(), 100);
        }
        assert_eq!(t.get(keys[0]).unwrap().status(), "completed");
        // keys[4] still runs and never counts against the history.
        assert_eq!(t.history_overflow("b", 2), vec![keys[0], keys[1]]);
        assert_eq!(t.newest_command("b"), Some(keys[4]));
        assert_eq!(t.newest_running("b"), Some(keys[4]));
        t.remove(keys[0]);
        assert_eq!(t.sessions["b"].commands.len(), 4);
        assert_eq!(t.sessions["b"].command_count, 5);
    }

    #[test]
    fn idle_sessions_with_a_fake_clock() {
        let mut t = Table::default();
        let t0 = Instant::now();
        let idle = Duration::from_secs(60);
        session(&mut t, "a", 1, t0);
        session(&mut t, "b", 1, t0);
        session(&mut t, "c", 1, t0);
        let bash = Family::Bash {
            session_id: "c".into(),
        };
        proc(&mut t, "cmd", bash, 1, 400);
        assert!(t
            .idle_sessions(t0 + Duration::from_secs(59), idle)
            .is_empty());
        t.touch_session("b", t0 + Duration::from_secs(30));
        // "a" is idle; "b" was used since; "c" runs a command, which keeps it alive.
        assert_eq!(
            t.idle_sessions(t0 + Duration::from_secs(61), idle),
            vec!["a"]
        );
        assert_eq!(
            t.idle_sessions(t0 + Duration::from_secs(91), idle),
            vec!["a", "b"]
        );
    }

    #[test]
    fn session_ids_do_not_collide_with_chosen_ones() {
        let mut t = Table::default();
        session(&mut t, "session_1", 1, Instant::now());
        assert_eq!(t.new_session_id(), "session_2");
    }
}
