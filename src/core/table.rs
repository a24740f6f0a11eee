//! The process table, the bash sessions and the subscriptions: what runs, who owns it,
//! what it printed, how it ended, who watches it. State only: no descriptor, token or timer
//! lives here, and nothing here makes a system call. The core feeds it events and `now`.
//!
//! Invariants:
//! - A process is found by its public id (`term_N`, `cmd_N`) only while it is not
//!   released; a released one stays (hidden) until it is reaped and its waiters answered.
//! - `running` counts processes whose leader has not been reaped.
//! - Foreign ids look exactly like unknown ones: every lookup takes the caller's uid.
//! - Sessions live in one namespace per owner: a name reveals nothing about another
//!   owner's sessions, and two owners may both use `default`.
//! - `subs_of` and each process's `subs` list the same subscriptions.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime};

use crate::core::ring::Ring;
use crate::core::screen::Screen;
use crate::types::{Ended, TreeUsage, Usage, WinSize};
use crate::wire::rpc::RpcError;
use serde_json::json;

/// Internal key of a command's record; never reused. Its public id is derived from it
/// (`term_N`, `cmd_N`), and listings page by it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Key(pub u64);

impl std::fmt::Display for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

/// A parked request, as its command's waiters name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ParkId(pub u64);

/// A client connection as the core knows it; the loop maps it to its socket.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ConnId(pub usize);

/// A bash session: its owner and its name in that owner's namespace.
pub type SessionKey = (u32, String);

/// Which protocol created the process.
#[derive(Debug, Clone, PartialEq)]
pub enum Family {
    /// An ACP terminal: stdout and stderr merged into one stream. `session_id` is the ACP
    /// session the client named, nothing execd manages.
    Terminal { session_id: String },
    /// A bash command in a bash session of its owner: stdout and stderr apart, stdin a pipe.
    Bash { session_id: String },
    /// The interactive bash of a shell session of its owner (PROTOCOL 12.2): one stream,
    /// its terminal's; the lines typed into it are the session's, not processes here.
    Shell { session_id: String },
}

impl Family {
    pub fn session_id(&self) -> &str {
        match self {
            Family::Terminal { session_id }
            | Family::Bash { session_id }
            | Family::Shell { session_id } => session_id,
        }
    }

    pub fn is_bash(&self) -> bool {
        matches!(self, Family::Bash { .. })
    }

    pub fn is_shell(&self) -> bool {
        matches!(self, Family::Shell { .. })
    }
}

/// Why the daemon ended a command, when it did. Named as the audit log names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KillReason {
    /// `terminal/kill`.
    Request,
    /// `terminal/release`, or a retained terminal evicted past `--max-retained`.
    Release,
    /// The bash `hard_timeout` passed.
    Timeout,
    /// `bash/sessions/close`, `shell/sessions/close`, or an idle session closed.
    SessionClose,
    /// The daemon is stopping.
    Shutdown,
    /// The connection that created it with `killOnDisconnect` closed.
    Disconnect,
}

impl KillReason {
    pub fn as_str(self) -> &'static str {
        match self {
            KillReason::Request => "request",
            KillReason::Release => "release",
            KillReason::Timeout => "timeout",
            KillReason::SessionClose => "session close",
            KillReason::Shutdown => "shutdown",
            KillReason::Disconnect => "disconnect",
        }
    }
}

/// One output stream: its ring, and whether its pipe may still deliver.
#[derive(Debug)]
pub struct Stream {
    pub ring: Ring,
    /// False once EOF was seen or the process was released.
    pub open: bool,
    /// A PTY's output: text replies show its plain text (PROTOCOL 12.1).
    pub plain: bool,
}

impl Stream {
    pub fn new(capacity: usize) -> Stream {
        Stream {
            ring: Ring::new(capacity),
            open: true,
            plain: false,
        }
    }

    /// A stream nothing is written to (a PTY bash command's stderr).
    pub fn closed() -> Stream {
        Stream {
            open: false,
            ..Stream::new(0)
        }
    }

    /// A PTY's output stream.
    pub fn terminal(capacity: usize) -> Stream {
        Stream {
            plain: true,
            ..Stream::new(capacity)
        }
    }

    /// The text of `[from, to)` (a window from `Ring::utf8_window`): the bytes as UTF-8,
    /// or for a PTY what a terminal would show of them.
    pub fn text(&self, from: u64, to: u64) -> String {
        if self.plain {
            let ended = !self.open && to >= self.ring.end();
            crate::core::plain::render(&self.ring, from, to, ended)
        } else {
            self.ring.text(from, to)
        }
    }

    /// The end of what may be handed out as text now (an incomplete trailing character of
    /// an open stream is held back).
    pub fn text_end(&self) -> u64 {
        self.ring
            .utf8_window(self.ring.start(), self.ring.end(), self.open)
            .1
    }
}

/// A command's pseudo-terminal: its size, and its screen once one was asked for.
#[derive(Debug)]
pub struct Tty {
    pub size: WinSize,
    pub screen: Option<Box<Screen>>,
    /// The terminal's path (`/dev/pts/N`), known for a shell session's shell: its command
    /// lines open it for each command. `None` for other terminals, and for a shell an
    /// upgrade carried from an image that did not say (it is restarted before its next
    /// line).
    pub path: Option<std::path::PathBuf>,
}

/// A command's stdin: a fixed-capacity buffer the loop drains into the pipe as it accepts.
#[derive(Debug)]
pub struct Stdin {
    pub buf: VecDeque<u8>,
    pub capacity: usize,
    /// Close the pipe once `buf` drains.
    pub eof_requested: bool,
    /// False once the pipe is closed (drained after `eof`, broken, exit or release).
    pub open: bool,
    /// Bytes accepted but never delivered (the command closed its stdin or exited).
    pub undelivered: u64,
}

impl Stdin {
    pub fn new(capacity: usize) -> Stdin {
        Stdin {
            buf: VecDeque::new(),
            capacity,
            eof_requested: false,
            open: true,
            undelivered: 0,
        }
    }

    /// Marks the pipe closed, counting what never got through.
    pub fn close(&mut self) {
        self.open = false;
        self.undelivered += self.buf.len() as u64;
        self.buf.clear();
        self.buf.shrink_to_fit();
    }
}

/// How a command ended.
#[derive(Debug, Clone, Copy)]
pub struct Exit {
    pub ended: Ended,
    /// The leader's rusage (and what it waited for).
    pub usage: Usage,
    /// The whole tree's figures, from its cgroup when it has one.
    pub tree: Option<TreeUsage>,
    pub at: Instant,
}

/// How a subscriber wants its output.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct SubOpts {
    /// Never drop output for this subscriber's slowness: the command's pipes stop being
    /// read while its connection is over its cap.
    pub lossless: bool,
    /// `Output` data as base64 of the exact bytes, chunks cut anywhere.
    pub base64: bool,
}

/// One subscriber of a process's output (see `events`).
#[derive(Debug, Clone)]
pub struct Sub {
    pub conn: ConnId,
    pub opts: SubOpts,
    /// Next offset to deliver, per stream.
    pub next: [u64; 2],
    /// The subscriber fell behind its connection's cap; a `Gap` is owed per stream.
    pub lagging: bool,
    /// `Exit` has been delivered.
    pub done: bool,
}

/// Who started a command: the peer's credentials.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Peer {
    pub uid: u32,
    pub gid: u32,
    pub pid: i32,
}

/// One command, terminal or bash.
#[derive(Debug)]
pub struct Proc {
    pub key: Key,
    /// Public id: `term_N` or `cmd_N`.
    pub id: String,
    pub family: Family,
    /// The uid that owns it (the peer's).
    pub owner: u32,
    /// The peer that started it, for the audit log.
    pub peer: Peer,
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
    /// A shell session's command channel: the gated lines waiting for the shell to take them.
    pub commands: Option<Stdin>,
    /// The uid it runs as (a root daemon runs a peer's commands as the peer).
    pub runs_as: u32,
    /// The sandbox it runs in (PROTOCOL 16); none: not sandboxed.
    pub sandbox: Option<crate::policy::sandbox::Given>,
    pub exit: Option<Exit>,
    /// Set when the daemon starts ending it; a later kill only waits for this one.
    pub kill: Option<KillReason>,
    /// The connection that created it asking for `killOnDisconnect`: its close kills
    /// the command (a foreground `execctl run` that dies takes its command with it).
    pub tied_to: Option<ConnId>,
    /// `bash/kill` sent it a terminating signal: ending by a signal then means `killed`.
    pub signalled: bool,
    /// Hidden from lookups by release; kept until reaped and its waiters answered.
    pub released: bool,
    /// Its pseudo-terminal, when it runs in one.
    pub tty: Option<Tty>,
    /// When it last wrote output (or started): a command quiet for a while with its
    /// stdin open is looked at for waiting for input (PROTOCOL 12.3).
    pub quiet_since: Instant,
    /// A process of its tree is blocked reading its stdin or terminal, as last looked.
    pub waiting_for_input: bool,
    /// Parked requests interested in this process.
    pub waiters: Vec<ParkId>,
    /// Answers about it that wait for room on their connection: it is not forgotten
    /// until they are rendered (PROTOCOL 8, pipelining).
    pub held: u32,
    pub subs: Vec<Sub>,
    /// A lossless subscriber is behind: its pipes are not read until it catches up.
    pub paused: bool,
    /// After the exit, what the pipes held then has been read (or they are closed): the
    /// `Exit` event may follow. False between an exit and a paused pipe's drain.
    pub drained: bool,
    /// Streams read to empty (or closed) since an exit that found the pipes paused;
    /// `drained` once every stream is.
    pub read_out: [bool; 2],
    /// Bytes its record holds besides output (command line, cwd, ids), counted in the
    /// output memory budget while it is kept (PROTOCOL 8).
    pub meta: usize,
    /// When its leader exited, processes of its tree were still alive (its group or cgroup
    /// had members, or a pipe was held open): what it left lives while its session does
    /// (PROTOCOL 14), and keeps a one-shot session its full idle time (PROTOCOL 8).
    pub lingers: bool,
    /// Said in its `bash/exec` answer: its session had been closed by the daemon and was
    /// started again for it (PROTOCOL 8).
    pub notice: Option<String>,
}

impl Proc {
    pub fn running(&self) -> bool {
        self.exit.is_none()
    }

    /// Bytes of memory its rings hold.
    pub fn committed(&self) -> usize {
        self.streams.iter().map(|s| s.ring.committed()).sum()
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
            (Some(KillReason::Timeout), _) => "timed_out",
            (Some(_), _) => "killed",
            (None, Ended::Signal(_)) if self.signalled => "killed",
            _ => "completed",
        }
    }

    pub fn duration(&self) -> Duration {
        match &self.exit {
            Some(e) => e.at.saturating_duration_since(self.started),
            None => Duration::ZERO,
        }
    }

    pub fn session_id(&self) -> &str {
        self.family.session_id()
    }

    /// The bash session it belongs to, if it is a bash command.
    pub fn session_key(&self) -> Option<SessionKey> {
        match &self.family {
            Family::Bash { session_id } => Some((self.owner, session_id.clone())),
            Family::Terminal { .. } | Family::Shell { .. } => None,
        }
    }
}

/// A bash session: API-level state shared by its commands.
#[derive(Debug)]
pub struct BashSession {
    pub id: String,
    pub owner: u32,
    pub workdir: PathBuf,
    pub created_wall: SystemTime,
    pub last_used: Instant,
    pub last_used_wall: SystemTime,
    /// Commands in start order (finished ones beyond the history limit are dropped).
    pub commands: VecDeque<Key>,
    pub command_count: u64,
    /// Made by a request that named no session and never named by a later call: the
    /// first to go at `--max-sessions`, and idle after a sixth of `--session-idle`
    /// (PROTOCOL 8).
    pub oneshot: bool,
    /// The daemon had closed a session of this name (idle or to make room) and this one
    /// was made again in its place: what the call that made it answers, taken once.
    pub reopened: Option<String>,
    /// Commands dropped from its history whose trees still had members: what they left
    /// ends when the session closes (PROTOCOL 14).
    pub left: Vec<(Key, String)>,
}

/// Output memory held: committed ring storage, in all and per owner.
#[derive(Debug, Default)]
pub struct Memory {
    pub total: usize,
    by_owner: HashMap<u32, usize>,
    /// Bytes of retained output of exited commands given back to stay within the budget.
    pub released: u64,
}

impl Memory {
    pub fn of(&self, owner: u32) -> usize {
        self.by_owner.get(&owner).copied().unwrap_or(0)
    }

    pub fn add(&mut self, owner: u32, bytes: usize) {
        self.total += bytes;
        *self.by_owner.entry(owner).or_default() += bytes;
    }

    pub fn sub(&mut self, owner: u32, bytes: usize) {
        self.total = self.total.saturating_sub(bytes);
        if let Some(n) = self.by_owner.get_mut(&owner) {
            *n = n.saturating_sub(bytes);
            if *n == 0 {
                self.by_owner.remove(&owner);
            }
        }
    }
}

/// Whether `caller` may see something owned by `owner`: the owner itself, or root.
pub fn visible(owner: u32, caller: u32) -> bool {
    owner == caller || caller == 0
}

/// All processes, sessions and subscriptions.
#[derive(Debug, Default)]
pub struct Table {
    /// Every process by key: in start order, so a listing page is read off in place.
    pub procs: BTreeMap<Key, Proc>,
    ids: HashMap<String, Key>,
    pids: HashMap<i32, Key>,
    pub sessions: HashMap<SessionKey, BashSession>,
    /// The processes each connection subscribes to.
    pub subs_of: HashMap<ConnId, Vec<Key>>,
    /// Output memory held by every ring together.
    pub memory: Memory,
    next_key: u64,
    next_session: u64,
    running: usize,
    /// Running processes per owner (fair shares, and what a non-root peer is shown).
    running_by: HashMap<u32, usize>,
    /// Commands being started (cloned, not exec'd yet), per owner: they
    /// count against the limits on running commands.
    starting: HashMap<u32, usize>,
    /// Exited, unreleased terminals per owner, oldest first.
    exited_terminals: HashMap<u32, VecDeque<Key>>,
    /// Exited processes that may hold output, per owner, oldest exit first: what the
    /// output budget gives back first (`take_retained`), found without a scan.
    retained: HashMap<u32, BTreeSet<(Instant, Key)>>,
}

impl Table {
    /// Puts `data` in `key`'s stdin buffer if it fits: `Some(written)`, or `None` when it
    /// does not fit yet. An error when the command is gone, has exited or its stdin is closed.
    pub fn queue_stdin(
        &mut self,
        key: Key,
        data: &[u8],
        eof: bool,
    ) -> Result<Option<usize>, RpcError> {
        let p = self
            .get_mut(key)
            .ok_or_else(|| RpcError::not_found("process", "released"))?;
        if !p.running() {
            return Err(RpcError::invalid_state(format!("{} has exited", p.id)));
        }
        let id = p.id.clone();
        let stdin = p
            .stdin
            .as_mut()
            .ok_or_else(|| RpcError::invalid_state(format!("{id} has no stdin pipe")))?;
        if !stdin.open || stdin.eof_requested {
            let n = stdin.undelivered;
            let msg = if n > 0 {
                format!("stdin of {id} is closed; {n} bytes of earlier input were not delivered")
            } else {
                format!("stdin of {id} is closed")
            };
            return Err(RpcError::invalid_state(msg).with_data(json!({ "undelivered": n })));
        }
        if stdin.buf.len() + data.len() > stdin.capacity {
            return Ok(None);
        }
        stdin.buf.extend(data);
        stdin.eof_requested = eof;
        Ok(Some(data.len()))
    }

    pub fn running(&self) -> usize {
        self.running
    }

    /// Every uid with a command running or being started.
    pub fn owners_running(&self) -> impl Iterator<Item = u32> + '_ {
        let starting = self
            .starting
            .keys()
            .filter(|u| !self.running_by.contains_key(u));
        self.running_by.keys().chain(starting).copied()
    }

    /// Running processes owned by `owner`.
    pub fn running_of(&self, owner: u32) -> usize {
        self.running_by.get(&owner).copied().unwrap_or(0)
    }

    /// A command of `owner` begins (`true`) or ends (`false`) being started.
    pub fn reserve_start(&mut self, owner: u32, begins: bool) {
        let n = self.starting.entry(owner).or_default();
        if begins {
            *n += 1;
        } else {
            *n = n.saturating_sub(1);
            if *n == 0 {
                self.starting.remove(&owner);
            }
        }
    }

    /// Commands being started: of `owner`, or of everyone.
    pub fn starting(&self, owner: Option<u32>) -> usize {
        match owner {
            Some(o) => self.starting.get(&o).copied().unwrap_or(0),
            None => self.starting.values().sum(),
        }
    }

    fn count_running(&mut self, owner: u32, up: bool) {
        if up {
            self.running += 1;
            *self.running_by.entry(owner).or_default() += 1;
        } else {
            self.running -= 1;
            if let Some(n) = self.running_by.get_mut(&owner) {
                *n -= 1;
                if *n == 0 {
                    self.running_by.remove(&owner);
                }
            }
        }
    }

    /// Allocates the key and public id for a new process (`term_N` or `cmd_N`).
    pub fn next_ids(&mut self, prefix: &str) -> (Key, String) {
        self.next_key += 1;
        (Key(self.next_key), format!("{prefix}_{}", self.next_key))
    }

    /// Records a started process.
    pub fn insert(&mut self, p: Proc) {
        self.memory.add(p.owner, p.meta);
        self.ids.insert(p.id.clone(), p.key);
        self.pids.insert(p.pid, p.key);
        self.count_running(p.owner, true);
        if let Some(sk) = p.session_key() {
            if let Some(s) = self.sessions.get_mut(&sk) {
                s.commands.push_back(p.key);
                s.command_count += 1;
            }
        }
        self.procs.insert(p.key, p);
    }

    /// The key of the visible, unreleased process with public id `id`.
    pub fn find(&self, id: &str, caller: u32) -> Option<Key> {
        self.find_in(id, caller, |_| true)
    }

    /// The key of the visible, unreleased process `id` that also satisfies `belongs`
    /// (a terminal of the named ACP session, a command of the named bash session).
    pub fn find_in(&self, id: &str, caller: u32, belongs: impl Fn(&Proc) -> bool) -> Option<Key> {
        let key = *self.ids.get(id)?;
        let p = self.procs.get(&key)?;
        (visible(p.owner, caller) && belongs(p)).then_some(key)
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
        // Bash commands and shells are kept as their sessions say, not by the cap on
        // retained terminals.
        let keep = p.released || p.family.is_bash() || p.family.is_shell();
        let (pid, owner) = (p.pid, p.owner);
        if p.committed() > 0 {
            self.retained
                .entry(owner)
                .or_default()
                .insert((exit.at, key));
        }
        self.pids.remove(&pid);
        self.count_running(owner, false);
        if keep {
            return Vec::new();
        }
        let q = self.exited_terminals.entry(owner).or_default();
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

    /// Forgets a process entirely, with its subscriptions.
    pub fn remove(&mut self, key: Key) -> Option<Proc> {
        let p = self.procs.remove(&key)?;
        self.unretain(&p);
        self.ids.remove(&p.id);
        if p.exit.is_none() {
            self.pids.remove(&p.pid);
            self.count_running(p.owner, false);
        }
        if let Some(q) = self.exited_terminals.get_mut(&p.owner) {
            q.retain(|k| *k != key);
            if q.is_empty() {
                self.exited_terminals.remove(&p.owner);
            }
        }
        if let Some(sk) = p.session_key() {
            if let Some(s) = self.sessions.get_mut(&sk) {
                s.commands.retain(|k| *k != key);
            }
        }
        for sub in &p.subs {
            self.unlink_sub(sub.conn, key);
        }
        self.memory.sub(p.owner, p.committed() + p.meta);
        // Give back what a burst of commands made the indexes grow to (amortised: only
        // when three quarters stand empty).
        if self.ids.capacity() > 64 && self.ids.len() < self.ids.capacity() / 4 {
            self.ids.shrink_to_fit();
            self.pids.shrink_to_fit();
        }
        Some(p)
    }

    /// Visible, unreleased processes, newest first, from the one below key `below` on:
    /// read lazily, so a page costs its own length (and the entries it skips), not a
    /// pass over every process.
    pub fn list(&self, caller: u32, below: Option<Key>) -> impl Iterator<Item = &Proc> {
        let upper = below.map_or(std::ops::Bound::Unbounded, std::ops::Bound::Excluded);
        self.procs
            .range((std::ops::Bound::Unbounded, upper))
            .rev()
            .map(|(_, p)| p)
            .filter(move |p| !p.released && visible(p.owner, caller))
    }

    // ---- retained output ---------------------------------------------------------------

    /// Output was committed to `key` after it exited (what its pipes still held, or a
    /// descendant that keeps writing): it is retained output the budget may give back.
    pub fn retain_output(&mut self, key: Key) {
        if let Some(p) = self.procs.get(&key) {
            if let Some(e) = p.exit {
                self.retained
                    .entry(p.owner)
                    .or_default()
                    .insert((e.at, key));
            }
        }
    }

    /// The oldest exited process (never `except`) holding retained output: of `only`, or
    /// else of whichever owner holds the most memory. It leaves the index: its output is
    /// about to be given back.
    pub fn take_retained(&mut self, only: Option<u32>, except: Key) -> Option<Key> {
        let owner = match only {
            Some(o) => o,
            None => *self
                .retained
                .iter()
                .filter(|(_, set)| set.iter().any(|(_, k)| *k != except))
                .map(|(o, _)| o)
                .max_by_key(|o| (self.memory.of(**o), std::cmp::Reverse(**o)))?,
        };
        let set = self.retained.get_mut(&owner)?;
        let entry = *set.iter().find(|(_, k)| *k != except)?;
        set.remove(&entry);
        if set.is_empty() {
            self.retained.remove(&owner);
        }
        Some(entry.1)
    }

    fn unretain(&mut self, p: &Proc) {
        let Some(at) = p.exit.map(|e| e.at) else {
            return;
        };
        if let Some(set) = self.retained.get_mut(&p.owner) {
            set.remove(&(at, p.key));
            if set.is_empty() {
                self.retained.remove(&p.owner);
            }
        }
    }

    // ---- subscriptions -----------------------------------------------------------------

    /// Subscribes `conn` to `key` from the offsets `next` (replacing an earlier
    /// subscription of the same connection).
    pub fn subscribe(&mut self, key: Key, conn: ConnId, next: [u64; 2], opts: SubOpts) -> bool {
        let Some(p) = self.procs.get_mut(&key) else {
            return false;
        };
        p.subs.retain(|s| s.conn != conn);
        p.subs.push(Sub {
            conn,
            opts,
            next,
            lagging: false,
            done: false,
        });
        let keys = self.subs_of.entry(conn).or_default();
        if !keys.contains(&key) {
            keys.push(key);
        }
        true
    }

    pub fn unsubscribe(&mut self, key: Key, conn: ConnId) {
        if let Some(p) = self.procs.get_mut(&key) {
            p.subs.retain(|s| s.conn != conn);
        }
        self.unlink_sub(conn, key);
    }

    /// A connection is gone: its subscriptions go with it.
    pub fn drop_conn(&mut self, conn: ConnId) {
        for key in self.subs_of.remove(&conn).unwrap_or_default() {
            if let Some(p) = self.procs.get_mut(&key) {
                p.subs.retain(|s| s.conn != conn);
            }
        }
    }

    /// Removes `key` from `conn`'s list (the process side is the caller's business).
    pub fn unlink_sub(&mut self, conn: ConnId, key: Key) {
        if let Some(keys) = self.subs_of.get_mut(&conn) {
            keys.retain(|k| *k != key);
            if keys.is_empty() {
                self.subs_of.remove(&conn);
            }
        }
    }

    // ---- sessions ----------------------------------------------------------------------

    /// A fresh bash session name that `owner` does not use.
    pub fn new_session_id(&mut self, owner: u32) -> String {
        loop {
            self.next_session += 1;
            let id = format!("session_{}", self.next_session);
            if !self.sessions.contains_key(&(owner, id.clone())) {
                return id;
            }
        }
    }

    /// Marks a session used now.
    pub fn touch_session(&mut self, key: &SessionKey, now: Instant, wall: SystemTime) {
        if let Some(s) = self.sessions.get_mut(key) {
            s.last_used = now;
            s.last_used_wall = wall;
        }
    }

    /// Whether any command of the session is running.
    pub fn session_busy(&self, key: &SessionKey) -> bool {
        self.sessions.get(key).is_some_and(|s| {
            s.commands
                .iter()
                .any(|k| self.procs.get(k).is_some_and(Proc::running))
        })
    }

    /// The session's newest command.
    pub fn newest_command(&self, key: &SessionKey) -> Option<Key> {
        self.sessions.get(key)?.commands.back().copied()
    }

    /// The session's newest running command.
    pub fn newest_running(&self, key: &SessionKey) -> Option<Key> {
        let s = self.sessions.get(key)?;
        s.commands
            .iter()
            .rev()
            .copied()
            .find(|k| self.procs.get(k).is_some_and(Proc::running))
    }

    /// Finished commands of the session beyond the newest `keep` finished ones, oldest
    /// first: the ones to drop.
    pub fn history_overflow(&self, key: &SessionKey, keep: usize) -> Vec<Key> {
        let Some(s) = self.sessions.get(key) else {
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

    /// Whether the session has been unused for `idle` and runs nothing at `now`.
    pub fn session_idle(&self, key: &SessionKey, now: Instant, idle: Duration) -> bool {
        self.sessions.get(key).is_some_and(|s| {
            now.saturating_duration_since(s.last_used) >= idle && !self.session_busy(key)
        })
    }
}

impl Table {
    /// What an upgrade in place carries of the table besides its commands and sessions:
    /// the id sequences, the order retained terminals leave in, and the output given back.
    pub fn sequences(&self) -> (u64, u64, Vec<(u32, Vec<u64>)>, u64) {
        let mut exited: Vec<(u32, Vec<u64>)> = self
            .exited_terminals
            .iter()
            .map(|(owner, q)| (*owner, q.iter().map(|k| k.0).collect()))
            .collect();
        exited.sort_by_key(|(owner, _)| *owner);
        (
            self.next_key,
            self.next_session,
            exited,
            self.memory.released,
        )
    }

    /// A table of carried commands and sessions, with its indexes, counts and output
    /// memory worked out from them (nothing is being started across an upgrade).
    pub fn restore(
        procs: Vec<Proc>,
        sessions: Vec<BashSession>,
        (next_key, next_session, exited, released): (u64, u64, Vec<(u32, Vec<u64>)>, u64),
    ) -> Table {
        let mut t = Table {
            next_key,
            next_session,
            ..Table::default()
        };
        t.memory.released = released;
        for s in sessions {
            t.sessions.insert((s.owner, s.id.clone()), s);
        }
        for p in procs {
            if !p.released {
                t.ids.insert(p.id.clone(), p.key);
            }
            t.memory.add(p.owner, p.committed() + p.meta);
            match p.exit {
                None => {
                    t.pids.insert(p.pid, p.key);
                    t.count_running(p.owner, true);
                }
                Some(e) if p.committed() > 0 => {
                    t.retained.entry(p.owner).or_default().insert((e.at, p.key));
                }
                Some(_) => {}
            }
            for sub in &p.subs {
                t.subs_of.entry(sub.conn).or_default().push(p.key);
            }
            t.procs.insert(p.key, p);
        }
        for (owner, keys) in exited {
            let keys = keys
                .into_iter()
                .map(Key)
                .filter(|k| t.procs.contains_key(k))
                .collect();
            t.exited_terminals.insert(owner, keys);
        }
        t
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn proc(t: &mut Table, prefix: &str, family: Family, owner: u32, pid: i32) -> Key {
        let (key, id) = t.next_ids(prefix);
        t.insert(Proc {
            key,
            id,
            family,
            owner,
            peer: Peer {
                uid: owner,
                gid: owner,
                pid: 1,
            },
            command: "true".into(),
            args: vec![],
            cwd: PathBuf::from("/"),
            pid,
            started: crate::types::test_clock().0,
            started_wall: crate::types::test_clock().1,
            streams: vec![],
            stdin: None,
            commands: None,
            runs_as: owner,
            sandbox: None,
            exit: None,
            kill: None,
            tied_to: None,
            signalled: false,
            released: false,
            tty: None,
            quiet_since: crate::types::test_clock().0,
            waiting_for_input: false,
            waiters: vec![],
            held: 0,
            subs: vec![],
            paused: false,
            drained: false,
            read_out: [false; 2],
            meta: 0,
            lingers: false,
            notice: None,
        });
        key
    }

    fn exit() -> Exit {
        Exit {
            ended: Ended::Code(0),
            usage: Usage::default(),
            tree: None,
            at: crate::types::test_clock().0,
        }
    }

    fn term(session: &str) -> Family {
        Family::Terminal {
            session_id: session.into(),
        }
    }

    fn session(t: &mut Table, id: &str, owner: u32, now: Instant) -> SessionKey {
        let key = (owner, id.to_string());
        t.sessions.insert(
            key.clone(),
            BashSession {
                id: id.into(),
                owner,
                workdir: "/".into(),
                created_wall: crate::types::test_clock().1,
                last_used: now,
                last_used_wall: crate::types::test_clock().1,
                commands: VecDeque::new(),
                command_count: 0,
                oneshot: false,
                reopened: None,
                left: Vec::new(),
            },
        );
        key
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
        assert_eq!(t.find_in(&id, 1000, |p| p.session_id() == "s"), Some(k));
        assert_eq!(t.find_in(&id, 1000, |p| p.session_id() == "t"), None);
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
    fn removing_a_running_process_fixes_the_count_and_its_subscriptions() {
        let mut t = Table::default();
        let k = proc(&mut t, "term", term("s"), 1, 10);
        assert!(t.subscribe(k, ConnId(5), [0, 0], SubOpts::default()));
        assert_eq!(t.subs_of[&ConnId(5)], vec![k]);
        t.remove(k);
        assert_eq!(t.running(), 0);
        assert_eq!(t.by_pid(10), None);
        assert!(t.subs_of.is_empty());
    }

    #[test]
    fn subscriptions_are_indexed_both_ways() {
        let mut t = Table::default();
        let a = proc(&mut t, "term", term("s"), 1, 10);
        let b = proc(&mut t, "term", term("s"), 1, 11);
        t.subscribe(a, ConnId(1), [0, 0], SubOpts::default());
        t.subscribe(a, ConnId(1), [5, 0], SubOpts::default()); // replaces, does not add
        t.subscribe(b, ConnId(1), [0, 0], SubOpts::default());
        t.subscribe(a, ConnId(2), [0, 0], SubOpts::default());
        assert_eq!(t.get(a).unwrap().subs.len(), 2);
        assert_eq!(t.get(a).unwrap().subs[0].next, [5, 0]);
        t.unsubscribe(b, ConnId(1));
        assert_eq!(t.subs_of[&ConnId(1)], vec![a]);
        t.drop_conn(ConnId(1));
        assert_eq!(t.get(a).unwrap().subs.len(), 1);
        assert!(!t.subs_of.contains_key(&ConnId(1)));
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
        let now = crate::types::test_clock().0;
        let b = session(&mut t, "b", 1, now);
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
        assert_eq!(t.history_overflow(&b, 2), vec![keys[0], keys[1]]);
        assert_eq!(t.newest_command(&b), Some(keys[4]));
        assert_eq!(t.newest_running(&b), Some(keys[4]));
        t.remove(keys[0]);
        assert_eq!(t.sessions[&b].commands.len(), 4);
        assert_eq!(t.sessions[&b].command_count, 5);
    }

    #[test]
    fn sessions_are_per_owner() {
        let mut t = Table::default();
        let now = crate::types::test_clock().0;
        let mine = session(&mut t, "default", 1000, now);
        let yours = session(&mut t, "default", 1001, now);
        proc(
            &mut t,
            "cmd",
            Family::Bash {
                session_id: "default".into(),
            },
            1000,
            50,
        );
        assert!(t.session_busy(&mine));
        assert!(
            !t.session_busy(&yours),
            "the other owner's session is its own"
        );
        assert_eq!(t.sessions[&yours].commands.len(), 0);
    }

    #[test]
    fn idle_and_least_recently_used_sessions_with_a_fake_clock() {
        let mut t = Table::default();
        let t0 = crate::types::test_clock().0;
        let idle = Duration::from_secs(60);
        let a = session(&mut t, "a", 1, t0);
        let b = session(&mut t, "b", 1, t0 + Duration::from_secs(1));
        let c = session(&mut t, "c", 1, t0);
        let bash = Family::Bash {
            session_id: "c".into(),
        };
        proc(&mut t, "cmd", bash, 1, 400);
        assert!(!t.session_idle(&a, t0 + Duration::from_secs(59), idle));
        t.touch_session(
            &b,
            t0 + Duration::from_secs(30),
            crate::types::test_clock().1,
        );
        // "a" is idle; "b" was used since; "c" runs a command, which keeps it alive.
        let at = t0 + Duration::from_secs(61);
        assert!(t.session_idle(&a, at, idle));
        assert!(!t.session_idle(&b, at, idle));
        assert!(!t.session_idle(&c, at, idle));
    }

    #[test]
    fn session_ids_do_not_collide_with_chosen_ones() {
        let mut t = Table::default();
        session(&mut t, "session_1", 1, crate::types::test_clock().0);
        assert_eq!(t.new_session_id(1), "session_2");
        assert_eq!(t.new_session_id(2), "session_3");
    }
}
