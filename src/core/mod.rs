//! The core: every piece of state the daemon keeps and every decision it makes, below the
//! loop and without a descriptor. Method families read and change it and return a `Step`;
//! the core's own transitions (a parked request resolved, a kill escalated, a session
//! closed for idleness) push `Effect`s, which the loop carries out. Time comes in as
//! `now`, so every transition is unit-tested with a fake clock.
//!
//! Invariants:
//! - A parked request is answered exactly once: when its condition holds, its deadline
//!   passes, its process is forgotten, or the daemon stops. A request whose connection
//!   closed is dropped unanswered.
//! - A kill is one SIGTERM to the tree and, after `--kill-grace`, one SIGKILL to whatever
//!   of it is left (even when the leader died of the SIGTERM). A second kill of a command
//!   already being killed only waits for the first.
//! - A released process is hidden at once and forgotten (`sweep`) once it has exited,
//!   nobody waits on it and the loop has delivered its last events.

pub mod budget;
pub mod carry;
pub mod confine;
pub mod gate;
pub mod input;
pub mod launch;
pub mod life;
pub mod log;
pub mod park;
pub mod plain;
pub mod pump;
pub mod ring;
pub mod screen;
pub mod sessions;
pub mod shell;
pub mod shutdown;
pub mod table;
#[cfg(test)]
pub mod testkit;
pub mod tie;
pub mod timers;
pub mod view;
pub mod vocab;

use std::collections::{BTreeSet, HashMap};
use std::time::{Instant, SystemTime};

use serde_json::{json, Value};

use crate::config::Config;
use crate::core::launch::LaunchRequest;
use crate::core::table::{ConnId, Key, KillReason, ParkId, Peer, SessionKey, Table};
use crate::core::timers::{TimerId, Timers};
use crate::policy::Policy;
use crate::types::Leftovers;
use crate::types::{Stage, SweepScope, Swept, WinSize};
use crate::wire::rpc::{ReqNo, RpcError};
use gate::Approvals;
pub use gate::Gated;
use log::{Log, Queue};
use park::Parked;
use vocab::Answer;
pub use vocab::Wait;

/// How commands are contained (PROTOCOL 9 and 14), as `initialize` and `execctl status`
/// say it.
#[derive(Debug, Clone)]
pub struct Containment {
    /// `cgroup` or `process-group`: what holds a command's tree besides its cookie.
    pub kind: &'static str,
    /// In words: the cgroup and its controllers, or why there is none, and what escapes.
    pub detail: String,
    /// This run's instance: every command's environment holds
    /// `EXECD_TREE=<cookie>:<command id>`.
    pub cookie: String,
}

impl Default for Containment {
    fn default() -> Containment {
        Containment {
            kind: "process-group",
            detail: "process groups".into(),
            cookie: String::new(),
        }
    }
}

/// The fair shares of a limit `max` (PROTOCOL 8): what one shared uid may hold (half),
/// and what all of them together may (seven eighths); at least one each.
pub fn fair_shares(max: usize) -> (usize, usize) {
    ((max / 2).max(1), (max / 8 * 7 + max % 8 * 7 / 8).max(1))
}

/// How an audit record goes into its queue.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Queued {
    /// As it fits (a shared uid's request records in its share).
    Any,
    /// Into room promised for it, this many bytes (`Queue::reserve`): a command's `start`.
    Promised(usize),
}

/// Who is calling: the connection, the peer's credentials, and whether the peer is one
/// of the gate's subjects (a descendant of the daemon, and of which command: 7.3).
#[derive(Debug, Clone, Copy)]
pub struct Caller {
    pub conn: ConnId,
    pub uid: u32,
    pub gid: u32,
    pub pid: i32,
    pub tie: tie::Tie,
}

impl Caller {
    pub fn peer(&self) -> Peer {
        Peer {
            uid: self.uid,
            gid: self.gid,
            pid: self.pid,
        }
    }
}

/// What a method family wants done with a request.
#[derive(Debug)]
pub enum Step {
    /// Answer now.
    Done(Value),
    /// Answer when `wait` holds, or at `deadline` with the state then.
    Park {
        wait: Wait,
        deadline: Option<Instant>,
    },
    /// Start a command (through the gate), then run its `After` tail.
    Launch(Box<LaunchRequest>),
    /// Upgrade the daemon in place into `binary` (none: the binary it was started as);
    /// the request is answered by the image that serves afterwards (PROTOCOL 13).
    Upgrade(Option<std::path::PathBuf>),
}

/// What the core asks the loop to do.
#[derive(Debug)]
pub enum Effect {
    /// Answer a request of a connection with what is decided already (an error, or a
    /// reply that needs no command's state).
    Reply {
        conn: ConnId,
        req: ReqNo,
        result: Result<Value, RpcError>,
    },
    /// Answer a parked request whose wait is over (its condition held or its deadline
    /// passed): its family renders the answer from the command's state as it is now
    /// (`methods::answer`). The command is still in the table while effects are applied.
    Answer {
        conn: ConnId,
        req: ReqNo,
        wait: Wait,
    },
    /// End a command's tree, one stage. `id` is the command's public id, which its
    /// `EXECD_TREE` cookie names (the command may be forgotten by the time the final
    /// stage comes).
    End { key: Key, id: String, stage: Stage },
    /// Send a signal to a command's tree (`bash/kill`).
    Signal { key: Key, sig: i32 },
    /// Stop reading a command's output (release, history trimming).
    ClosePipes(Key),
    /// Write what waits for a command's stdin.
    FlushStdin(Key),
    /// Write what waits for a shell's command channel.
    FlushCommands(Key),
    /// Discard the unread input of a shell's terminal (its prompt: what one command did
    /// not read never reaches the next, PROTOCOL 12.2).
    DiscardInput(Key),
    /// Read where a shell really is (`/proc/PID/cwd`) and hand it to `Core::shell_dir`;
    /// `logical` is the `$PWD` its end marker named, to be taken instead when the session
    /// keeps symlinks and it is the same directory.
    ShellDir {
        key: Key,
        logical: Option<std::path::PathBuf>,
    },
    /// SIGINT to the foreground job of a shell's terminal (`shell/kill`), unless that
    /// process group is `spared` (it had this kill's SIGINT already). The server tells
    /// `Core::shell_interrupted` where it went.
    Interrupt { key: Key, spared: Option<i32> },
    /// Start a command nobody's request waits for (a shell session's shell, restarted).
    Spawn(Box<LaunchRequest>),
    /// Close a command's stdin pipe.
    CloseStdin(Key),
    /// Deliver what subscribers of a command are owed.
    Pump(Key),
    /// Set the window size of a command's terminal.
    Resize { key: Key, size: WinSize },
    /// Queue a whole message (a Wire request or event) for a connection.
    Send { conn: ConnId, line: Vec<u8> },
    /// Tell a requester that its request `req` waits for an approver: the notification
    /// `_execd/approval_pending` with `params` and the request's own JSON-RPC id as
    /// `requestId`, which only its connection knows (PROTOCOL 7.3).
    ApprovalPending {
        conn: ConnId,
        req: ReqNo,
        params: Value,
    },
    /// An approved command: start it, then go on with the request that asked for it.
    Launch {
        conn: ConnId,
        req: Option<ReqNo>,
        launch: Box<LaunchRequest>,
    },
    /// Show `text` to the people watching shell session `session` (PROTOCOL 12.5): its
    /// terminal's output without markers, or the daemon's echo.
    Show { session: SessionKey, text: String },
    /// A person (connection `conn`) ended a line with Enter at session `session`'s
    /// prompt: run it as that connection's `shell/exec`, through the gate.
    Line {
        conn: ConnId,
        session: SessionKey,
        line: String,
    },
    /// A server-sent event `name` with `data` (one line of JSON) for request `req` of
    /// connection `conn`, which streams (PROTOCOL 12.5).
    Event {
        conn: ConnId,
        req: ReqNo,
        name: &'static str,
        data: Vec<u8>,
    },
    /// Stop connection `conn` watching a session: close it with `code`, saying `reason`.
    Unwatch {
        conn: ConnId,
        code: u16,
        reason: String,
    },
}

/// Everything the core waits for in time.
#[derive(Debug, Clone, PartialEq)]
enum Timer {
    /// SIGKILL what is left of a tree (command `id`) after the grace.
    Escalate(Key, String),
    /// A parked request's deadline (soft timeout, `wait_timeout`, kill answer).
    Deadline(ParkId),
    /// A bash command's `hard_timeout`.
    HardTimeout(Key),
    /// Check a bash session for idleness.
    SessionIdle(SessionKey),
    /// An approval not answered in time.
    Approval(String),
    /// A shell session's command reached its `hard_timeout`.
    ShellHard(SessionKey, u64),
    /// A shell session's command may have had no output for its `no_change_timeout`.
    ShellQuiet(SessionKey, u64),
    /// A shell session's command did not stop at SIGINT within the grace.
    ShellKill(SessionKey, u64),
    /// A shell session's command was sent SIGINT where it may have been held (the shell
    /// was starting it): look at its terminal's foreground job again.
    ShellInterrupt(SessionKey, u64),
    /// Check a shell session for idleness.
    ShellIdle(SessionKey),
}

/// The daemon's state.
#[derive(Debug)]
pub struct Core {
    pub cfg: Config,
    pub table: Table,
    timers: Timers<Timer>,
    parked: HashMap<ParkId, Parked>,
    /// The parked requests of each connection (a disconnect finds its own without a scan).
    parked_of: HashMap<ConnId, BTreeSet<ParkId>>,
    next_park: u64,
    hard_timers: HashMap<Key, TimerId>,
    idle_timers: HashMap<SessionKey, TimerId>,
    /// Released processes to forget once nothing needs them (see `sweep`).
    forget: Vec<Key>,
    /// Connected clients, with the peer each one is.
    pub clients: HashMap<ConnId, Peer>,
    /// The supplementary groups of connected Unix peers, for rules keyed on `gids`.
    groups: HashMap<ConnId, Vec<u32>>,
    /// The loop's monotonic clock at this turn, and the wall clock beside it: the core
    /// never reads a clock itself (`tick` sets both).
    pub now: Instant,
    pub wall: SystemTime,
    pub started: Instant,
    /// The daemon log's queue (the loop writes it out).
    pub log: Log,
    /// Audit records waiting for the audit file (`--audit FILE`); with `--audit -` they
    /// go into the log's queue instead, and without `--audit` nowhere.
    pub audit: Option<Queue>,
    audit_to_log: bool,
    pub policy: Policy,
    pub approvals: Approvals,
    /// The shell sessions (PROTOCOL 12.2).
    pub shells: shell::Shells,
    /// Sessions the daemon closed by itself (idle, or to make room), for a call naming
    /// one again (PROTOCOL 8).
    pub closed: sessions::ClosedSessions,
    /// How commands are contained, as `initialize` says.
    pub containment: Containment,
    /// What the daemon knows about sandboxes (PROTOCOL 16).
    pub sandboxing: confine::Sandboxing,
    /// The daemon's descriptor limit (`RLIMIT_NOFILE`, raised at start).
    pub nofile: u64,
    /// Shutdown has begun: no new work is taken.
    pub stopping: bool,
    /// A command with its stdin open started since the loop last looked for commands
    /// waiting for input (`input_watch`).
    pub input_watch: bool,
    /// The uid the daemon runs as: with root, the one uid not held to fair shares.
    pub daemon_uid: u32,
    /// Upgrades in place this daemon went through (PROTOCOL 13).
    pub upgrades: u64,
    /// Room promised in the audit queue to the `start` record of each command being
    /// spawned, in bytes (PROTOCOL 7.4: nothing runs unrecorded).
    audit_promised: HashMap<Key, usize>,
    /// Effects for the loop, in the order they arose.
    pub out: Vec<Effect>,
}

impl Core {
    pub fn new(cfg: Config, now: Instant, wall: SystemTime, mut log: Log) -> Core {
        log.wall = wall;
        log.level = cfg.log_level;
        let (audit, audit_to_log) = match &cfg.audit {
            None => (None, false),
            Some(crate::config::AuditTarget::Stderr) => (None, true),
            Some(crate::config::AuditTarget::File(_)) => {
                (Some(Queue::new(log::QUEUE_BYTES, log::Kind::Audit)), false)
            }
        };
        Core {
            cfg,
            table: Table::default(),
            timers: Timers::default(),
            parked: HashMap::new(),
            parked_of: HashMap::new(),
            next_park: 0,
            hard_timers: HashMap::new(),
            idle_timers: HashMap::new(),
            forget: Vec::new(),
            clients: HashMap::new(),
            groups: HashMap::new(),
            now,
            wall,
            started: now,
            log,
            audit,
            audit_to_log,
            policy: Policy::default(),
            approvals: Approvals::default(),
            shells: shell::Shells::default(),
            closed: sessions::ClosedSessions::default(),
            containment: Containment::default(),
            sandboxing: confine::Sandboxing::default(),
            nofile: 1024,
            stopping: false,
            input_watch: false,
            daemon_uid: 0,
            upgrades: 0,
            audit_promised: HashMap::new(),
            out: Vec::new(),
        }
    }

    /// Writes one audit record (when auditing): `event`, the peer it concerns, and its
    /// own fields, in at most `log::RECORD_MAX` bytes. A record a shared uid causes itself
    /// (`deny`, `ask`, `refuse`, `reject` for want of an approver, `connect`, `exit`) is
    /// held in that uid's share of the queue (PROTOCOL 7.4).
    pub fn record(&mut self, event: &str, peer: Option<Peer>, fields: Value) {
        self.record_queued(event, peer, fields, Queued::Any);
    }

    /// `record`, queued as `how` says.
    pub(crate) fn record_queued(
        &mut self,
        event: &str,
        peer: Option<Peer>,
        fields: Value,
        how: Queued,
    ) {
        if !self.auditing() {
            return;
        }
        let fields = match fields {
            Value::Object(m) => m,
            _ => Default::default(),
        };
        // What a shared uid causes itself (its denials, asks and refusals, its
        // connections, its commands' exits) holds at most its share of the queue, so its
        // flood loses only its own. What others decide about it (an approver's answer, a
        // kill, a release) never counts against that share, and a command's start goes
        // into the room promised for it.
        let flood = matches!(event, "deny" | "ask" | "refuse" | "connect" | "exit")
            || (event == "reject" && fields.get("reason") == Some(&json!("no approver")));
        let share = peer.map(|p| p.uid).filter(|&u| flood && self.shares(u));
        let peer = peer.map(|p| json!({ "uid": p.uid, "gid": p.gid, "pid": p.pid }));
        let line = log::bounded_audit_line(self.wall, event, peer, fields);
        let q = self.audit_queue();
        match (how, share) {
            (Queued::Promised(n), _) => q.push_reserved(&line, n),
            (Queued::Any, Some(uid)) => q.push_shared(&line, uid),
            (Queued::Any, None) => q.push(&line),
        }
    }

    /// Whether audit records are made (`--audit`).
    pub fn auditing(&self) -> bool {
        self.audit.is_some() || self.audit_to_log
    }

    /// Where audit records wait: the audit file's queue, or with `--audit -` the log's.
    pub(crate) fn audit_queue(&mut self) -> &mut Queue {
        match self.audit.as_mut() {
            Some(q) => q,
            None => &mut self.log.queue,
        }
    }

    /// At start, containment ended what a previous instance left in command cgroups:
    /// logged and audited (nothing is said when there was nothing).
    pub fn found_leftovers(&mut self, l: &Leftovers) {
        if l.cgroups == 0 {
            return;
        }
        let kept = if l.kept > 0 {
            format!("; {} could not be removed yet", l.kept)
        } else {
            String::new()
        };
        self.log.line(format_args!(
            "killed {} process(es) a previous instance left in {} command cgroup(s){kept}",
            l.processes, l.cgroups,
        ));
        self.record(
            "leftovers",
            None,
            json!({ "cgroups": l.cgroups, "processes": l.processes, "kept": l.kept,
                    "mode": "cgroup" }),
        );
    }

    /// A cookie sweep ended (PROTOCOL 14). What it killed is logged and audited: at start
    /// as `leftovers {count, mode: "cookie"}`, after a kill or at shutdown as `swept {ids,
    /// count}`. A sweep that found nothing says so only at `--log-level debug`.
    pub fn swept(&mut self, s: &Swept) {
        let named = if s.sample.is_empty() {
            String::new()
        } else {
            let list: Vec<String> = s
                .sample
                .iter()
                .map(|(pid, name)| format!("{pid} {name}"))
                .collect();
            let more = if s.killed > s.sample.len() {
                ", ..."
            } else {
                ""
            };
            format!(": {}{more}", list.join(", "))
        };
        if s.spared > 0 {
            self.log.line(format_args!(
                "left {} process(es) of an earlier instance on this socket alone: the daemon \
                 that started them still runs",
                s.spared
            ));
        }
        if !s.skipped.is_empty() {
            let pids: Vec<String> = s.skipped.iter().map(i32::to_string).collect();
            self.log.refusal(
                "hung processes",
                self.now,
                format_args!(
                    "a cookie sweep did not read {} process(es) whose memory does not answer \
                     (a hung file system?), pid {}: each is read again alone later",
                    pids.len(),
                    pids.join(", ")
                ),
            );
        }
        if s.killed == 0 {
            let of = match &s.scope {
                SweepScope::Commands(ids) => format!("{} command(s)", ids.len()),
                SweepScope::Every => "every command".to_string(),
                SweepScope::Earlier => "earlier instances".to_string(),
            };
            self.log.debug(format_args!(
                "a cookie sweep of {of} killed nothing ({} environments read in {:.1} ms)",
                s.read,
                s.elapsed.as_secs_f64() * 1e3
            ));
            return;
        }
        let read = format!(
            "{} environments read in {} pass(es), {:.1} ms",
            s.read,
            s.passes,
            s.elapsed.as_secs_f64() * 1e3
        );
        match &s.scope {
            SweepScope::Earlier => {
                self.log.line(format_args!(
                    "killed {} process(es) an earlier instance on this socket left (found by \
                     their EXECD_TREE cookie; {read}){named}",
                    s.killed
                ));
                self.record(
                    "leftovers",
                    None,
                    json!({ "count": s.killed, "mode": "cookie" }),
                );
            }
            SweepScope::Commands(ids) => {
                let shown = if ids.len() > 5 {
                    format!("{} and {} more", ids[..5].join(", "), ids.len() - 5)
                } else {
                    ids.join(", ")
                };
                self.log.line(format_args!(
                    "{shown}: killed {} process(es) that left the process group but carried \
                     the EXECD_TREE cookie ({read}){named}",
                    s.killed
                ));
                self.record(
                    "swept",
                    None,
                    json!({ "ids": ids, "count": s.killed, "mode": "cookie" }),
                );
            }
            SweepScope::Every => {
                self.log.line(format_args!(
                    "shutdown: killed {} process(es) that carried this instance's EXECD_TREE \
                     cookie ({read}){named}",
                    s.killed
                ));
                self.record(
                    "swept",
                    None,
                    json!({ "ids": "every", "count": s.killed, "mode": "cookie" }),
                );
            }
        }
    }

    /// The earliest time a timer of the core is due.
    pub fn next_deadline(&mut self) -> Option<Instant> {
        self.timers.next_deadline()
    }

    /// The time of this turn: `now` on the monotonic clock, `wall` on the wall clock.
    pub fn tick(&mut self, now: Instant, wall: SystemTime) {
        self.now = now;
        self.wall = wall;
        self.log.wall = wall;
    }

    /// Runs every timer due at `now` (the time of this turn, see `tick`).
    pub fn fire_due(&mut self) {
        let now = self.now;
        while let Some(t) = self.timers.pop_due(now) {
            match t {
                Timer::Escalate(key, id) => self.out.push(Effect::End {
                    key,
                    id,
                    stage: Stage::Kill,
                }),
                Timer::Deadline(park) => {
                    if let Some(p) = self.parked.get_mut(&park) {
                        p.timer = None;
                    }
                    self.resolve(park, true);
                }
                Timer::HardTimeout(key) => {
                    self.hard_timers.remove(&key);
                    self.kill(key, KillReason::Timeout);
                }
                Timer::SessionIdle(session) => {
                    self.idle_timers.remove(&session);
                    self.check_idle(&session);
                }
                Timer::Approval(id) => self.resolve_approval(&id, Answer::Reject, "timeout", None),
                Timer::ShellHard(session, seq) => {
                    if self
                        .shells
                        .map
                        .get(&session)
                        .and_then(|s| s.current())
                        .is_some_and(|r| r.seq == seq)
                    {
                        self.shell_kill(&session, shell::Ending::HardTimeout);
                    }
                }
                Timer::ShellQuiet(session, seq) => self.shell_quiet_check(&session, seq),
                Timer::ShellKill(session, seq) => self.shell_kill_escalate(&session, seq),
                Timer::ShellInterrupt(session, seq) => self.shell_interrupt_again(&session, seq),
                Timer::ShellIdle(session) => self.shell_idle_check(&session),
            }
        }
    }

    /// Whether `uid` is held to a fair share (half) of each shared limit (PROTOCOL 8):
    /// every uid but root and the daemon's own, so one allowed user cannot lock out the
    /// others.
    pub fn shares(&self, uid: u32) -> bool {
        uid != 0 && uid != self.daemon_uid
    }

    /// Whether one more of a limit `max` (`--max-processes`, `--max-clients`...) may go
    /// to `uid`, which holds `own` of it while all shared uids hold `shared` (PROTOCOL 8):
    /// a shared uid at most half, all of them together at most seven eighths, so root and
    /// the daemon's own uid always have room. The limit passed, named `<name>-per-uid` or
    /// `<name>-shared`, with its value, when not (the whole of `max` is the caller's).
    pub fn fair_share(
        &self,
        uid: u32,
        (own, shared): (usize, usize),
        (name, max): (&str, usize),
    ) -> Result<(), RpcError> {
        if !self.shares(uid) {
            return Ok(());
        }
        let (one, all) = fair_shares(max);
        if own >= one {
            return Err(RpcError::limit(&format!("{name}-per-uid"), one));
        }
        if shared >= all {
            return Err(RpcError::limit(&format!("{name}-shared"), all));
        }
        Ok(())
    }

    /// Every group of a caller: its primary group and the groups its connection holds.
    pub fn groups_of(&self, caller: &Caller) -> Vec<u32> {
        std::iter::once(caller.gid)
            .chain(self.groups.get(&caller.conn).into_iter().flatten().copied())
            .collect()
    }

    pub fn connected(&mut self, conn: ConnId, peer: Peer, groups: Vec<u32>) {
        self.clients.insert(conn, peer);
        if !groups.is_empty() {
            self.groups.insert(conn, groups);
        }
        self.record("connect", Some(peer), json!({}));
    }

    /// A connection closed: its parked requests have nobody to answer, its subscriptions
    /// end, and the commands it created with `killOnDisconnect` are killed (the others go
    /// on).
    pub fn disconnected(&mut self, conn: ConnId) {
        self.clients.remove(&conn);
        // A scan rather than an index: a disconnect is rare next to the work it ends, and
        // the table is bounded (`--max-processes` running, `--max-retained` kept).
        let mut tied: Vec<Key> = self
            .table
            .procs
            .values()
            .filter(|p| p.tied_to == Some(conn))
            .map(|p| p.key)
            .collect();
        tied.sort_unstable();
        for key in tied {
            if let Some(p) = self.table.get_mut(key) {
                p.tied_to = None;
                if p.running() && p.kill.is_none() {
                    self.log.line(format_args!(
                        "{} killed: the connection that started it closed",
                        p.id
                    ));
                }
            }
            self.kill(key, KillReason::Disconnect);
        }
        self.groups.remove(&conn);
        self.unwatch(conn);
        self.unfollow(conn);
        self.approvals.remove(conn);
        self.approvals.set_notices(conn, false);
        // Its commands waiting for approval are withdrawn: nothing is started for a
        // requester that is gone.
        let mut withdrawn: Vec<String> = self
            .approvals
            .pending
            .values()
            .filter(|p| p.conn == conn)
            .map(|p| p.id.clone())
            .collect();
        withdrawn.sort();
        for id in withdrawn {
            self.resolve_approval(&id, Answer::Reject, gate::WITHDRAWN, None);
        }
        // Commands it subscribed to are pumped again: a lossless subscriber leaving may
        // free their pipes.
        for key in self.table.subs_of.get(&conn).cloned().unwrap_or_default() {
            self.out.push(Effect::Pump(key));
        }
        for id in self.parked_of.remove(&conn).unwrap_or_default() {
            self.unpark(id);
        }
        self.table.drop_conn(conn);
    }
}
