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

pub mod gate;
pub mod launch;
pub mod log;
pub mod ring;
pub mod table;
pub mod timers;
pub mod view;

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime};

use serde_json::{json, Value};

use crate::config::{Config, BASH_HISTORY};
use crate::core::launch::{Admitted, LaunchRequest};
use crate::core::table::{
    ConnId, Exit, Key, KillReason, Peer, Proc, Session, SessionKey, Stdin, Stream, Table, TreeUsage,
};
use crate::core::timers::{TimerId, Timers};
use crate::policy::{self, Decision, Judged, Policy};
use crate::sys::cgroup::Leftovers;
use crate::sys::contain::Stage;
use crate::types::Ended;
use crate::types::Stdio3;
use crate::types::Usage;
use crate::wire::rpc::{ReqNo, RpcError};
use gate::{Answer, Approvals, Asked, Pending};
use log::{Log, Queue};

/// Who is calling: the connection and the peer's credentials.
#[derive(Debug, Clone, Copy)]
pub struct Caller {
    pub conn: ConnId,
    pub uid: u32,
    pub gid: u32,
    pub pid: i32,
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

/// What a parked request waits for.
#[derive(Debug, Clone)]
pub enum Wait {
    /// `terminal/wait_for_exit`.
    Exit(Key),
    /// `terminal/kill`: answered `{}` once the leader exited.
    Killed(Key),
    /// Synchronous `bash/exec`.
    BashExec { key: Key, max_len: usize },
    /// `bash/output` with `wait`.
    BashOutput { key: Key, from: [u64; 2] },
    /// `bash/kill`: answered once the command ended or the grace passed.
    BashKill(Key),
    /// `terminal/kill` with a signal of the client's: answered once the leader exited or
    /// the grace passed, saying which.
    Signalled(Key),
    /// A write with `wait`: answered once its input fits the stdin buffer.
    StdinRoom { key: Key, data: Vec<u8>, eof: bool },
}

impl Wait {
    /// Whether its answer carries output (a ring's worth at most).
    fn carries_output(&self) -> bool {
        matches!(self, Wait::BashExec { .. } | Wait::BashOutput { .. })
    }

    fn key(&self) -> Key {
        match self {
            Wait::Exit(k) | Wait::Killed(k) | Wait::BashKill(k) | Wait::Signalled(k) => *k,
            Wait::BashExec { key, .. }
            | Wait::BashOutput { key, .. }
            | Wait::StdinRoom { key, .. } => *key,
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
}

/// What the core asks the loop to do.
#[derive(Debug)]
pub enum Effect {
    /// Answer a request of a connection.
    Reply {
        conn: ConnId,
        req: ReqNo,
        result: Result<Value, RpcError>,
    },
    /// End a command's tree, one stage.
    End { key: Key, stage: Stage },
    /// Send a signal to a command's tree (`bash/kill`).
    Signal { key: Key, sig: i32 },
    /// Stop reading a command's output (release, history trimming).
    ClosePipes(Key),
    /// Write what waits for a command's stdin.
    FlushStdin(Key),
    /// Close a command's stdin pipe.
    CloseStdin(Key),
    /// Deliver what subscribers of a command are owed.
    Pump(Key),
    /// Queue a whole message (a Wire request or event) for a connection.
    Send { conn: ConnId, line: Vec<u8> },
    /// An approved command: start it, then go on with the request that asked for it.
    Launch {
        conn: ConnId,
        req: Option<ReqNo>,
        launch: Box<LaunchRequest>,
    },
}

/// What the gate made of a command.
#[derive(Debug)]
pub enum Gated {
    /// Start it now.
    Admitted(Box<LaunchRequest>),
    /// Answer the request with this error; nothing starts.
    Refused(RpcError),
    /// An approver was asked; the request waits.
    Asked,
}

/// Everything the core waits for in time.
#[derive(Debug, Clone, PartialEq)]
enum Timer {
    /// SIGKILL what is left of a tree after the grace.
    Escalate(Key),
    /// A parked request's deadline (soft timeout, `wait_timeout`, kill answer).
    Deadline(u64),
    /// A bash command's `hard_timeout`.
    HardTimeout(Key),
    /// Check a bash session for idleness.
    SessionIdle(SessionKey),
    /// An approval not answered in time.
    Approval(String),
}

#[derive(Debug)]
struct Parked {
    conn: ConnId,
    req: ReqNo,
    wait: Wait,
    timer: Option<TimerId>,
}

/// Parked requests one connection may have whose answers carry output (synchronous
/// `bash/exec`, `bash/output` with `wait`), counting those waiting for an approver. One
/// write can resolve all of them at once, each answer holding up to a ring's worth, so
/// they are bounded well below `MAX_WAITING`; more are refused with `-32003`.
pub const MAX_OUTPUT_WAITS: usize = 32;

/// The daemon's state.
#[derive(Debug)]
pub struct Core {
    pub cfg: Config,
    pub table: Table,
    timers: Timers<Timer>,
    parked: HashMap<u64, Parked>,
    next_park: u64,
    /// Parked requests carrying output, per connection.
    output_waits: HashMap<ConnId, usize>,
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
    /// How commands are contained (`cgroup` or `process-group`) and in words.
    pub containment: (&'static str, String),
    /// Shutdown has begun: no new work is taken.
    pub stopping: bool,
    /// Effects for the loop, in the order they arose.
    pub out: Vec<Effect>,
}

impl Core {
    pub fn new(cfg: Config, now: Instant, wall: SystemTime, mut log: Log) -> Core {
        log.wall = wall;
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
            next_park: 0,
            output_waits: HashMap::new(),
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
            containment: ("process-group", "process groups".into()),
            stopping: false,
            out: Vec::new(),
        }
    }

    /// Writes one audit record (when auditing): `event`, the peer it concerns, and its
    /// own fields.
    pub fn record(&mut self, event: &str, peer: Option<Peer>, fields: Value) {
        if self.audit.is_none() && !self.audit_to_log {
            return;
        }
        let peer = peer.map(|p| json!({ "uid": p.uid, "gid": p.gid, "pid": p.pid }));
        let fields = match fields {
            Value::Object(m) => m,
            _ => Default::default(),
        };
        let line = log::audit_line(self.wall, event, peer, fields);
        match self.audit.as_mut() {
            Some(q) => q.push(&line),
            None => self.log.queue.push(&line),
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
            json!({ "cgroups": l.cgroups, "processes": l.processes, "kept": l.kept }),
        );
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
                Timer::Escalate(key) => self.out.push(Effect::End {
                    key,
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
            }
        }
    }

    // ---- connections -------------------------------------------------------------------

    pub fn connected(&mut self, conn: ConnId, peer: Peer, groups: Vec<u32>) {
        self.clients.insert(conn, peer);
        if !groups.is_empty() {
            self.groups.insert(conn, groups);
        }
        self.record("connect", Some(peer), json!({}));
    }

    /// A connection closed: its parked requests have nobody to answer (the processes go
    /// on), and its subscriptions end.
    pub fn disconnected(&mut self, conn: ConnId) {
        self.clients.remove(&conn);
        self.groups.remove(&conn);
        self.approvals.remove(conn);
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
            self.resolve_approval(&id, Answer::Reject, "withdrawn", None);
        }
        // Commands it subscribed to are pumped again: a lossless subscriber leaving may
        // free their pipes.
        for key in self.table.subs_of.get(&conn).cloned().unwrap_or_default() {
            self.out.push(Effect::Pump(key));
        }
        let gone: Vec<u64> = self
            .parked
            .iter()
            .filter(|(_, p)| p.conn == conn)
            .map(|(id, _)| *id)
            .collect();
        for id in gone {
            self.unpark(id);
        }
        self.table.drop_conn(conn);
    }

    /// Requests of `conn` whose answers will carry output: parked, or synchronous execs
    /// waiting for an approver.
    fn output_waits_of(&self, conn: ConnId) -> usize {
        let asked = self
            .approvals
            .pending
            .values()
            .filter(|p| p.conn == conn && p.req.is_some() && p.launch.answers_with_output())
            .count();
        self.output_waits.get(&conn).copied().unwrap_or(0) + asked
    }

    /// Requests of `conn` parked now.
    pub fn parked_by(&self, conn: ConnId) -> usize {
        self.parked.values().filter(|p| p.conn == conn).count()
    }

    // ---- parked requests ---------------------------------------------------------------

    /// Parks request `req` of `conn` until `wait` holds or `deadline` passes. It may hold
    /// already (an exited command, output already past the offset): then it is answered now.
    pub fn park(&mut self, conn: ConnId, req: ReqNo, wait: Wait, deadline: Option<Instant>) {
        if wait.carries_output() {
            // A synchronous exec was counted at the gate, before it started.
            let sync_exec = matches!(wait, Wait::BashExec { .. });
            if !sync_exec && self.output_waits_of(conn) >= MAX_OUTPUT_WAITS {
                self.out.push(Effect::Reply {
                    conn,
                    req,
                    result: Err(RpcError::limit("waiting-output", MAX_OUTPUT_WAITS)),
                });
                return;
            }
            *self.output_waits.entry(conn).or_default() += 1;
        }
        let id = self.next_park;
        self.next_park += 1;
        let key = wait.key();
        let timer = deadline.map(|at| self.timers.add(at, Timer::Deadline(id)));
        self.parked.insert(
            id,
            Parked {
                conn,
                req,
                wait,
                timer,
            },
        );
        match self.table.get_mut(key) {
            Some(p) => {
                p.waiters.push(id);
                self.resolve(id, false);
            }
            None => self.resolve(id, true),
        }
    }

    /// Answers parked request `id` if its condition holds (or `expired`).
    fn resolve(&mut self, id: u64, expired: bool) {
        let Some(p) = self.parked.get(&id) else {
            return;
        };
        if let Wait::StdinRoom { key, data, eof } = &p.wait {
            let result = match queue_stdin(&mut self.table, *key, data, *eof) {
                Ok(None) => return, // still no room
                Ok(Some(n)) => {
                    self.out.push(Effect::FlushStdin(*key));
                    Ok(json!({ "written": n }))
                }
                Err(e) => Err(e),
            };
            if let Some(p) = self.unpark(id) {
                self.out.push(Effect::Reply {
                    conn: p.conn,
                    req: p.req,
                    result,
                });
            }
            return;
        }
        let result = match (self.table.get(p.wait.key()), &p.wait) {
            (None, _) => Some(Err(RpcError::not_found("process", "released"))),
            (Some(proc_), Wait::Exit(_)) => {
                proc_.exit.is_some().then(|| Ok(view::exit_status(proc_)))
            }
            (Some(proc_), Wait::Killed(_)) => proc_.exit.is_some().then(|| Ok(json!({}))),
            (Some(proc_), Wait::BashExec { max_len, .. }) => {
                (expired || proc_.exit.is_some()).then(|| Ok(view::exec_result(proc_, *max_len)))
            }
            (Some(proc_), Wait::BashOutput { from, .. }) => {
                (expired || proc_.exit.is_some() || view::has_output_past(proc_, *from))
                    .then(|| Ok(view::output_result(proc_, *from)))
            }
            (Some(proc_), Wait::BashKill(_)) => {
                (expired || proc_.exit.is_some()).then(|| Ok(view::command_info(proc_)))
            }
            (Some(proc_), Wait::Signalled(_)) => (expired || proc_.exit.is_some())
                .then(|| Ok(json!({ "_meta": { "execd": { "exited": proc_.exit.is_some() } } }))),
            (Some(_), Wait::StdinRoom { .. }) => None, // handled above
        };
        let Some(result) = result else { return };
        if let Some(p) = self.unpark(id) {
            self.out.push(Effect::Reply {
                conn: p.conn,
                req: p.req,
                result,
            });
        }
    }

    /// `$/cancel_request`: ends request `req` of `conn` with `-32800` if it is parked, or
    /// withdraws it if it waits for an approver (nothing starts).
    pub fn cancel(&mut self, conn: ConnId, req: ReqNo) {
        let asked = self
            .approvals
            .pending
            .values()
            .find(|p| p.conn == conn && p.req == Some(req))
            .map(|p| p.id.clone());
        if let Some(id) = asked {
            if let Some(p) = self.approvals.pending.get_mut(&id) {
                p.req = None; // answered below with -32800, not with the reject
            }
            self.resolve_approval(&id, Answer::Reject, "withdrawn", None);
            self.out.push(Effect::Reply {
                conn,
                req,
                result: Err(RpcError::cancelled()),
            });
            return;
        }
        let found = self
            .parked
            .iter()
            .find(|(_, p)| p.conn == conn && p.req == req)
            .map(|(id, _)| *id);
        if let Some(p) = found.and_then(|id| self.unpark(id)) {
            self.out.push(Effect::Reply {
                conn: p.conn,
                req: p.req,
                result: Err(RpcError::cancelled()),
            });
        }
    }

    /// Takes a parked request out of every index: its timer and its process's waiters.
    fn unpark(&mut self, id: u64) -> Option<Parked> {
        let p = self.parked.remove(&id)?;
        if p.wait.carries_output() {
            if let Some(n) = self.output_waits.get_mut(&p.conn) {
                *n -= 1;
                if *n == 0 {
                    self.output_waits.remove(&p.conn);
                }
            }
        }
        if let Some(t) = p.timer {
            self.timers.cancel(t);
        }
        if let Some(proc_) = self.table.get_mut(p.wait.key()) {
            proc_.waiters.retain(|w| *w != id);
        }
        Some(p)
    }

    /// Re-checks every parked request on process `key`.
    pub fn wake(&mut self, key: Key) {
        let Some(p) = self.table.get(key) else { return };
        if p.waiters.is_empty() {
            return;
        }
        for id in p.waiters.clone() {
            self.resolve(id, false);
        }
    }

    // ---- a command's life --------------------------------------------------------------

    /// Records a command the loop just started as `key` (public id `id`, leader `pid`).
    /// `runs_as` is the uid the command runs as (a root daemon runs peers as
    /// themselves, or as `--run-as`).
    pub fn started(&mut self, req: &LaunchRequest, key: Key, id: String, pid: i32, runs_as: u32) {
        let (streams, stdin) = match req.stdio {
            Stdio3::Merged => (vec![Stream::new(req.ring_capacity)], None),
            Stdio3::MergedWithStdin => (
                vec![Stream::new(req.ring_capacity)],
                Some(Stdin::new(self.cfg.stdin_buffer)),
            ),
            Stdio3::Separate => (
                vec![
                    Stream::new(req.ring_capacity),
                    Stream::new(req.ring_capacity),
                ],
                Some(Stdin::new(self.cfg.stdin_buffer)),
            ),
        };
        self.log.line(format_args!(
            "{id} started: pid {pid} uid {} cwd {:?} command {:?}{}",
            req.peer.uid,
            req.cwd,
            req.command,
            if req.args.is_empty() {
                String::new()
            } else {
                format!(" args {:?}", req.args)
            }
        ));
        if self.audit.is_some() || self.audit_to_log {
            let (decision, rule) = req
                .admitted
                .as_ref()
                .map_or(("allow", "default"), |a| (a.decision, a.rule.as_str()));
            let mut fields = json!({
                "id": id, "session": req.family.session_id(), "cwd": req.cwd,
                "uid": runs_as, "decision": decision, "rule": rule, "pid": pid,
            });
            match &req.program {
                crate::types::Program::Shell { line, .. } => fields["line"] = line.clone().into(),
                crate::types::Program::Direct { program, args } => {
                    let argv: Vec<&String> = std::iter::once(program).chain(args).collect();
                    fields["argv"] = json!(argv);
                }
            }
            self.record("start", Some(req.peer), fields);
        }
        self.table.insert(Proc {
            key,
            id,
            family: req.family.clone(),
            owner: req.peer.uid,
            peer: req.peer,
            command: req.command.clone(),
            args: req.args.clone(),
            cwd: req.cwd.clone(),
            pid,
            started: self.now,
            started_wall: self.wall,
            streams,
            stdin,
            exit: None,
            kill: None,
            signalled: false,
            released: false,
            waiters: Vec::new(),
            subs: Vec::new(),
            paused: false,
            drained: false,
            read_out: [false; 2],
        });
        if let Some((conn, opts)) = req.subscribe {
            self.table.subscribe(key, conn, [0, 0], opts);
        }
    }

    /// Appends bytes read from output stream `stream` of `key` to its ring. A ring that
    /// needs more storage asks the output memory budget; what the budget cannot give, the
    /// ring does without (it wraps within what it holds).
    pub fn output(&mut self, key: Key, stream: usize, data: &[u8]) {
        let Some(p) = self.table.get(key) else { return };
        let Some(s) = p.streams.get(stream) else {
            return;
        };
        let owner = p.owner;
        let want = s.ring.growth_for(data.len());
        let granted = if want > 0 {
            self.grant(owner, key, want)
        } else {
            0
        };
        let Some(ring) = self
            .table
            .get_mut(key)
            .and_then(|p| p.streams.get_mut(stream))
            .map(|s| &mut s.ring)
        else {
            return;
        };
        if granted > 0 {
            let before = ring.committed();
            ring.grow(granted);
            let grown = ring.committed() - before;
            ring.append(data);
            self.table.memory.add(owner, grown);
        } else {
            ring.append(data);
        }
    }

    /// How much of `want` more bytes `owner`'s command `key` may commit. Past the budget
    /// (all of `--max-output-memory`, half of it for a non-root owner) the retained output
    /// of exited commands is given back first: the owner's own when its share is the
    /// limit, else the oldest of the owner holding the most.
    fn grant(&mut self, owner: u32, key: Key, want: usize) -> usize {
        let max = self.cfg.max_output_memory;
        let share = if owner == 0 { max } else { max / 2 };
        let used = self.table.memory.of(owner);
        if used + want > share {
            self.release_retained(Some(owner), used + want - share, key);
        }
        let total = self.table.memory.total;
        if total + want > max {
            self.release_retained(None, total + want - max, key);
        }
        let room_owner = share.saturating_sub(self.table.memory.of(owner));
        let room_total = max.saturating_sub(self.table.memory.total);
        want.min(room_owner).min(room_total)
    }

    /// Gives back the output of exited commands (never `except`) until `need` bytes are
    /// freed or none is left: oldest exit first, from `only`, or else from whichever owner
    /// holds the most at each step.
    fn release_retained(&mut self, only: Option<u32>, need: usize, except: Key) {
        let mut candidates: Vec<(Instant, Key, u32)> = self
            .table
            .procs
            .values()
            .filter(|p| p.key != except && p.committed() > 0)
            .filter(|p| only.is_none_or(|o| p.owner == o))
            .filter_map(|p| p.exit.map(|e| (e.at, p.key, p.owner)))
            .collect();
        candidates.sort_unstable();
        let mut freed = 0;
        while freed < need && !candidates.is_empty() {
            let memory = &self.table.memory;
            let Some(owner) = candidates
                .iter()
                .map(|c| c.2)
                .max_by_key(|o| (memory.of(*o), std::cmp::Reverse(*o)))
            else {
                break;
            };
            let Some(i) = candidates.iter().position(|c| c.2 == owner) else {
                break;
            };
            let (_, victim, _) = candidates.remove(i);
            freed += self.discard_output(victim);
        }
    }

    /// Gives back all output memory of `key`; its bytes count as dropped from now on.
    fn discard_output(&mut self, key: Key) -> usize {
        let Some(p) = self.table.get_mut(key) else {
            return 0;
        };
        let owner = p.owner;
        let freed: usize = p.streams.iter_mut().map(|s| s.ring.discard()).sum();
        self.table.memory.sub(owner, freed);
        self.table.memory.released += freed as u64;
        freed
    }

    /// Output stream `stream` of `key` reached its end.
    pub fn eof(&mut self, key: Key, stream: usize) {
        if let Some(s) = self
            .table
            .get_mut(key)
            .and_then(|p| p.streams.get_mut(stream))
        {
            s.open = false;
        }
        self.out.push(Effect::Pump(key));
        self.wake(key);
    }

    /// The leader of `key` was reaped (after its pipes were drained of what they held).
    pub fn exited(&mut self, key: Key, ended: Ended, usage: Usage, tree: Option<TreeUsage>) {
        let exit = Exit {
            ended,
            usage,
            tree,
            at: self.now,
        };
        let evict = self.table.record_exit(key, exit, self.cfg.max_retained);
        if let Some(p) = self.table.get_mut(key) {
            // The loop read what the pipes held, unless a lossless subscriber holds them
            // paused: then `drained` comes when they are read again.
            p.drained = !p.paused;
        }
        self.close_stdin(key);
        if let Some(t) = self.hard_timers.remove(&key) {
            self.timers.cancel(t);
        }
        let Some(p) = self.table.get(key) else { return };
        self.log.line(format_args!(
            "{} exited: {} after {} ms",
            p.id,
            view::describe_exit(p),
            p.duration().as_millis()
        ));
        if self.audit.is_some() || self.audit_to_log {
            let (code, signal) = view::exit_fields(p);
            let streams: Vec<u64> = p.streams.iter().map(|s| s.ring.end()).collect();
            let fields = json!({
                "id": p.id, "status": p.status(), "exit_code": code, "signal": signal,
                "duration_ms": p.duration().as_millis() as u64,
                "cpu_ms": tree.and_then(|t| t.cpu_ms)
                    .unwrap_or((usage.user + usage.system).as_millis() as u64),
                "memory_peak_kb": tree.and_then(|t| t.memory_peak_kb),
                "oomKilled": tree.is_some_and(|t| t.oom_killed),
                "max_rss_kb": usage.max_rss_kb,
                "stdout_bytes": streams.first().copied().unwrap_or(0),
                "stderr_bytes": streams.get(1).copied(),
            });
            let peer = p.peer;
            self.record("exit", Some(peer), fields);
        }
        let Some(p) = self.table.get(key) else { return };
        let (released, session) = (p.released, p.session_key());
        self.out.push(Effect::Pump(key));
        self.wake(key);
        if released {
            self.forget.push(key);
        }
        for k in evict {
            self.release(k, KillReason::Release);
        }
        if let Some(s) = session {
            for k in self.table.history_overflow(&s, BASH_HISTORY) {
                self.drop_finished(k);
            }
        }
    }

    /// Output stream `stream` of `key` was just read to empty (or found closed). After an
    /// exit that found the pipes paused, the `Exit` event may follow once every stream
    /// has been: each may still hold what was written before the exit.
    pub fn read_out(&mut self, key: Key, stream: usize) {
        let Some(p) = self.table.get_mut(key) else {
            return;
        };
        if p.exit.is_none() || p.drained || p.paused {
            return;
        }
        if let Some(done) = p.read_out.get_mut(stream) {
            *done = true;
        }
        let all = p
            .streams
            .iter()
            .enumerate()
            .all(|(i, s)| !s.open || p.read_out[i]);
        if all {
            p.drained = true;
            self.out.push(Effect::Pump(key));
        }
    }

    /// Starts ending a command: SIGTERM to its tree now, SIGKILL to what is left after the
    /// grace. A command already being killed is left to that kill.
    pub fn kill(&mut self, key: Key, reason: KillReason) {
        let Some(p) = self.table.get_mut(key) else {
            return;
        };
        if !p.running() || p.kill.is_some() {
            return;
        }
        p.kill = Some(reason);
        let fields = json!({ "id": p.id, "reason": reason.as_str() });
        let peer = p.peer;
        self.record("kill", Some(peer), fields);
        self.end_tree(key);
    }

    /// SIGTERM to a tree now, SIGKILL to what is left after the grace.
    fn end_tree(&mut self, key: Key) {
        self.out.push(Effect::End {
            key,
            stage: Stage::Term,
        });
        self.timers
            .add(self.now + self.cfg.kill_grace, Timer::Escalate(key));
    }

    /// A signal from `bash/kill` (or `terminal/kill` with one) to a running command.
    pub fn signal(&mut self, key: Key, sig: i32) {
        let Some(p) = self.table.get_mut(key) else {
            return;
        };
        if !p.running() {
            return;
        }
        if sig != libc::SIGSTOP && sig != libc::SIGCONT {
            p.signalled = true;
        }
        self.log.line(format_args!(
            "{} sent {}",
            p.id,
            crate::types::signal_name(sig)
        ));
        // SIGKILL means the whole tree, escaped or not; other signals are requests the
        // process group gets.
        if sig == libc::SIGKILL {
            self.out.push(Effect::End {
                key,
                stage: Stage::Kill,
            });
        } else {
            self.out.push(Effect::Signal { key, sig });
        }
    }

    /// Release: hide the id, stop reading, end what runs (or what an exited command left
    /// in its tree). Parked waiters still get the exit.
    pub fn release(&mut self, key: Key, reason: KillReason) {
        let Some(p) = self.table.get_mut(key) else {
            return;
        };
        let running = p.running();
        for s in &mut p.streams {
            s.open = false;
        }
        self.log.line(format_args!("{} released", p.id));
        let fields = json!({ "id": p.id });
        let peer = p.peer;
        self.record("release", Some(peer), fields);
        self.table.hide(key);
        self.out.push(Effect::ClosePipes(key));
        self.close_stdin(key);
        if running {
            self.kill(key, reason);
        } else {
            // The leader is gone; descendants that kept its tree alive are not wanted.
            self.end_tree(key);
            self.out.push(Effect::Pump(key));
            self.forget.push(key);
        }
    }

    /// Marks a command's stdin closed (counting what never got through) and has the loop
    /// close its pipe; a write waiting for room learns it never will.
    pub fn close_stdin(&mut self, key: Key) {
        if let Some(stdin) = self.table.get_mut(key).and_then(|p| p.stdin.as_mut()) {
            if stdin.open {
                stdin.close();
                self.out.push(Effect::CloseStdin(key));
                self.wake(key);
            }
        }
    }

    /// Queues input for a running command's stdin (`bash/write`, `terminal/write`):
    /// answered at once with `{written}`, or, with `wait`, once it fits the buffer.
    /// Input that does not fit is otherwise refused whole (`-32003`); so is a write while
    /// another waits, which keeps input in the order it was sent.
    pub fn write_stdin(
        &mut self,
        key: Key,
        data: Vec<u8>,
        eof: bool,
        wait: bool,
    ) -> Result<Step, RpcError> {
        let waiting = self.table.get(key).is_some_and(|p| {
            p.waiters.iter().any(|w| {
                self.parked
                    .get(w)
                    .is_some_and(|x| matches!(x.wait, Wait::StdinRoom { .. }))
            })
        });
        let capacity = self
            .table
            .get(key)
            .and_then(|p| p.stdin.as_ref())
            .map_or(0, |s| s.capacity);
        if !waiting {
            if let Some(n) = queue_stdin(&mut self.table, key, &data, eof)? {
                self.out.push(Effect::FlushStdin(key));
                return Ok(Step::Done(json!({ "written": n })));
            }
        }
        if wait && !waiting && data.len() <= capacity {
            return Ok(Step::Park {
                wait: Wait::StdinRoom { key, data, eof },
                deadline: None,
            });
        }
        Err(RpcError::limit("stdin-buffer", capacity))
    }

    /// Removes a finished command from view (bash history trimming, session close).
    fn drop_finished(&mut self, key: Key) {
        let Some(p) = self.table.get_mut(key) else {
            return;
        };
        if p.running() {
            return;
        }
        for s in &mut p.streams {
            s.open = false;
        }
        let waiters = p.waiters.clone();
        self.table.hide(key);
        self.out.push(Effect::ClosePipes(key));
        for w in waiters {
            self.resolve(w, true);
        }
        self.forget.push(key);
    }

    /// Forgets released, exited processes that nobody waits on any more. The loop calls
    /// it after carrying out the effects, so their last events were delivered first.
    pub fn sweep(&mut self) {
        for key in std::mem::take(&mut self.forget) {
            let done = self
                .table
                .get(key)
                .is_some_and(|p| p.released && p.exit.is_some() && p.waiters.is_empty());
            if done {
                self.table.remove(key);
            }
        }
    }

    /// Arms a bash command's hard timeout.
    pub fn arm_hard_timeout(&mut self, key: Key, after: Duration) {
        let t = self.timers.add(self.now + after, Timer::HardTimeout(key));
        if let Some(old) = self.hard_timers.insert(key, t) {
            self.timers.cancel(old);
        }
    }

    // ---- the gate -----------------------------------------------------------------------

    /// Passes a command through the policy, once, before anything starts (PROTOCOL 7):
    /// `allow` admits it, `deny` refuses it (`-32005`), `ask` sends it to the approvers
    /// of its owner and parks request `req` of `conn` until one answers, it times out or
    /// the requester leaves. An earlier `approve_for_session` of the same rule, owner and
    /// session admits it at once; no approver at all refuses it at once (`-32006`).
    pub fn gate(
        &mut self,
        mut launch: Box<LaunchRequest>,
        conn: ConnId,
        req: Option<ReqNo>,
    ) -> Gated {
        if launch.answers_with_output() && self.output_waits_of(conn) >= MAX_OUTPUT_WAITS {
            self.launch_failed(&launch);
            return Gated::Refused(RpcError::limit("waiting-output", MAX_OUTPUT_WAITS));
        }
        let (key, id) = self.table.next_ids(launch.prefix);
        let peer = launch.peer;
        let argv: Vec<String>;
        let judged = match &launch.program {
            crate::types::Program::Shell { line, .. } => Judged::Line(line),
            crate::types::Program::Direct { program, args } => {
                argv = std::iter::once(program.clone())
                    .chain(args.clone())
                    .collect();
                Judged::Argv(&argv)
            }
        };
        // A rule's `gids` match the peer's primary group and the groups it holds.
        let gids: Vec<u32> = std::iter::once(peer.gid)
            .chain(self.groups.get(&conn).into_iter().flatten().copied())
            .collect();
        let verdict = self.policy.judge(
            &judged,
            &policy::Peer {
                uid: peer.uid,
                gids: &gids,
            },
        );
        let admit = |launch: &mut LaunchRequest, decision, rule: &str| {
            launch.admitted = Some(Admitted {
                key,
                id: id.clone(),
                decision,
                rule: rule.to_string(),
            });
        };
        match verdict.decision {
            Decision::Allow => {
                admit(&mut launch, "allow", &verdict.rule);
                Gated::Admitted(launch)
            }
            Decision::Deny => {
                self.record(
                    "deny",
                    Some(peer),
                    json!({ "id": id, "rule": verdict.rule, "reason": "policy",
                            "command": gate::describe(&launch) }),
                );
                self.log.line(format_args!(
                    "denied {id} of uid {}: rule {}",
                    peer.uid, verdict.rule
                ));
                self.launch_failed(&launch);
                Gated::Refused(RpcError::denied(
                    &verdict.rule,
                    verdict.justification.as_deref(),
                ))
            }
            Decision::Ask => {
                let grant = (peer.uid, launch.session_ref(), verdict.rule.clone());
                if self.approvals.grants.contains(&grant) {
                    admit(&mut launch, "approve_for_session", &verdict.rule);
                    return Gated::Admitted(launch);
                }
                let approvers = self.approvals.approvers_for(peer.uid);
                let reason = if approvers.is_empty() {
                    Some("no approver")
                } else if self.approvals.pending.len() >= self.cfg.max_pending_approvals {
                    None
                } else {
                    Some("")
                };
                let Some(reason) = reason else {
                    self.launch_failed(&launch);
                    return Gated::Refused(RpcError::limit(
                        "max-pending-approvals",
                        self.cfg.max_pending_approvals,
                    ));
                };
                if !reason.is_empty() {
                    self.record(
                        "reject",
                        Some(peer),
                        json!({ "id": id, "rule": verdict.rule, "reason": reason }),
                    );
                    self.launch_failed(&launch);
                    return Gated::Refused(RpcError::not_approved(&verdict.rule, reason, None));
                }
                let appr = self.approvals.next_id();
                let session = launch.family.session_id().to_string();
                let command = gate::describe(&launch);
                let why = verdict
                    .justification
                    .as_deref()
                    .map_or(String::new(), |j| format!(": {j}"));
                let asked = Asked {
                    rule: verdict.rule.clone(),
                    justification: verdict.justification.clone(),
                    // Raw, like the description: what shows it to a person escapes
                    // control characters (execctl approve does).
                    brief: format!(
                        "rule {}{why}; uid {} (pid {}), cwd {}, session {session}",
                        verdict.rule,
                        peer.uid,
                        peer.pid,
                        launch.cwd.display()
                    ),
                    description: crate::core::view::cut_text(&command, gate::DESCRIPTION_MAX),
                };
                let line = gate::request_line(&appr, &id, &asked);
                for a in &approvers {
                    self.out.push(Effect::Send {
                        conn: *a,
                        line: line.clone(),
                    });
                }
                self.record(
                    "ask",
                    Some(peer),
                    json!({ "id": id, "approval": appr, "rule": verdict.rule,
                            "reason": if verdict.unparsed { "unparsed" } else { "policy" },
                            "command": command }),
                );
                admit(&mut launch, "approve", &verdict.rule);
                let timer = self.timers.add(
                    self.now + self.cfg.approval_timeout,
                    Timer::Approval(appr.clone()),
                );
                self.approvals.pending.insert(
                    appr.clone(),
                    Pending {
                        id: appr,
                        conn,
                        req,
                        launch,
                        asked,
                        sent_to: approvers,
                        timer,
                    },
                );
                Gated::Asked
            }
        }
    }

    /// An approver's answer to approval `id` (a Wire response). Only an approver that got
    /// the request may answer it; the first answer wins, later ones are ignored.
    pub fn approval_answer(&mut self, from: ConnId, id: &str, result: &Result<Value, Value>) {
        let may = self
            .approvals
            .pending
            .get(id)
            .is_some_and(|p| p.sent_to.contains(&from));
        if !may {
            return;
        }
        let (answer, feedback) = Answer::from_response(id, result);
        let approver = self.clients.get(&from).copied();
        self.resolve_approval_by(id, answer, "rejected", feedback, approver);
    }

    /// Ends approval `id` with `answer` (`reason` says why a reject happened).
    fn resolve_approval(
        &mut self,
        id: &str,
        answer: Answer,
        reason: &str,
        feedback: Option<String>,
    ) {
        self.resolve_approval_by(id, answer, reason, feedback, None);
    }

    fn resolve_approval_by(
        &mut self,
        id: &str,
        answer: Answer,
        reason: &str,
        feedback: Option<String>,
        approver: Option<Peer>,
    ) {
        let Some(p) = self.approvals.pending.remove(id) else {
            return;
        };
        self.timers.cancel(p.timer);
        let line = gate::resolved_line(id, answer);
        for a in &p.sent_to {
            self.out.push(Effect::Send {
                conn: *a,
                line: line.clone(),
            });
        }
        let peer = p.launch.peer;
        let command_id = p.launch.admitted.as_ref().map(|a| a.id.clone());
        let mut fields = json!({ "id": command_id, "approval": id, "rule": p.asked.rule });
        if let Some(a) = approver {
            fields["approver"] = json!({ "uid": a.uid, "pid": a.pid });
        }
        // Nothing new starts once the daemon is stopping.
        let answer = if self.stopping {
            Answer::Reject
        } else {
            answer
        };
        match answer {
            Answer::Approve | Answer::ApproveForSession => {
                if answer == Answer::ApproveForSession {
                    self.approvals.grants.insert((
                        peer.uid,
                        p.launch.session_ref(),
                        p.asked.rule.clone(),
                    ));
                    fields["for_session"] = true.into();
                }
                self.record("approve", Some(peer), fields);
                self.out.push(Effect::Launch {
                    conn: p.conn,
                    req: p.req,
                    launch: p.launch,
                });
            }
            Answer::Reject => {
                fields["reason"] = reason.into();
                if let Some(f) = &feedback {
                    fields["feedback"] = f.clone().into();
                }
                self.record("reject", Some(peer), fields);
                self.launch_failed(&p.launch);
                if let Some(req) = p.req {
                    self.out.push(Effect::Reply {
                        conn: p.conn,
                        req,
                        result: Err(RpcError::not_approved(&p.asked.rule, reason, feedback)),
                    });
                }
            }
        }
    }

    /// A command that will not start (refused by the gate or an approver, or its spawn
    /// failed): a bash session made for it alone is not kept.
    pub fn launch_failed(&mut self, launch: &LaunchRequest) {
        if let crate::core::launch::After::BashExec {
            created_session: true,
            ..
        } = launch.after
        {
            let key = (launch.peer.uid, launch.family.session_id().to_string());
            let unused = self
                .table
                .sessions
                .get(&key)
                .is_some_and(|s| s.commands.is_empty());
            if unused {
                self.forget_session(&key);
            }
        }
    }

    /// Replaces the policy (SIGHUP), or keeps the old one when the new one is refused.
    pub fn reload_policy(&mut self, loaded: Result<Policy, String>) {
        match loaded {
            Ok(p) => {
                self.log
                    .line(format_args!("policy reloaded: {} rule(s)", p.rule_count()));
                self.policy = p;
                self.record("policy_reload", None, json!({ "ok": true }));
            }
            Err(e) => {
                self.log
                    .line(format_args!("policy not reloaded, the old one stays: {e}"));
                self.record("policy_reload", None, json!({ "ok": false, "error": e }));
            }
        }
    }

    // ---- bash sessions -----------------------------------------------------------------

    /// Finds the caller's session `id`, or creates it (under that name, or a new one when
    /// `id` is absent or empty) when `create`. At `--max-sessions` (or, for a non-root
    /// owner, at half of it for its own) the owner's least recently used session running
    /// nothing is closed to make room; another owner's never is. When every session of the
    /// owner is busy the new one is refused. Counts as use; `dir` becomes its default
    /// directory.
    pub fn open_session(
        &mut self,
        owner: u32,
        id: Option<&str>,
        dir: Option<PathBuf>,
        create: bool,
    ) -> Result<SessionKey, RpcError> {
        let name = match id.filter(|i| !i.is_empty()) {
            Some(i) => i.to_string(),
            None if create => self.table.new_session_id(owner),
            None => return Err(RpcError::invalid_params("session_id", "required")),
        };
        let key = (owner, name);
        if !self.table.sessions.contains_key(&key) {
            if !create {
                return Err(RpcError::not_found("session", &key.1));
            }
            let max = self.cfg.max_sessions;
            let share = if owner == 0 { max } else { (max / 2).max(1) };
            let own = self.table.sessions.keys().filter(|k| k.0 == owner).count();
            if self.table.sessions.len() >= max || own >= share {
                let Some(victim) = self.table.lru_quiet_session(owner) else {
                    return Err(RpcError::limit("max-sessions", max));
                };
                self.log.line(format_args!(
                    "session {:?} of uid {} closed to make room (max-sessions {max})",
                    victim.1, victim.0
                ));
                self.close_session(&victim);
            }
            let now_wall = self.wall;
            self.table.sessions.insert(
                key.clone(),
                Session {
                    id: key.1.clone(),
                    owner,
                    workdir: self.cfg.workdir.clone(),
                    created_wall: now_wall,
                    last_used: self.now,
                    last_used_wall: now_wall,
                    commands: Default::default(),
                    command_count: 0,
                },
            );
            self.arm_idle(&key, self.now + self.cfg.session_idle);
        }
        self.table.touch_session(&key, self.now, self.wall);
        if let (Some(dir), Some(s)) = (dir, self.table.sessions.get_mut(&key)) {
            s.workdir = dir;
        }
        Ok(key)
    }

    /// Counts a request on a bash command as use of its session.
    pub fn touch_session_of(&mut self, key: Key) {
        if let Some(sk) = self.table.get(key).and_then(Proc::session_key) {
            self.table.touch_session(&sk, self.now, self.wall);
        }
    }

    /// Frees a session: running commands are killed (and forgotten once reaped), finished
    /// ones dropped now.
    pub fn close_session(&mut self, key: &SessionKey) {
        let Some(s) = self.table.sessions.get(key) else {
            return;
        };
        let keys: Vec<Key> = s.commands.iter().copied().collect();
        for k in keys {
            if self.table.get(k).is_some_and(Proc::running) {
                self.release(k, KillReason::SessionClose);
            } else {
                self.drop_finished(k);
            }
        }
        // Its commands still waiting for an approver are withdrawn: they would start in a
        // session that no longer exists.
        let session_ref = format!("bash:{}", key.1);
        let mut asked: Vec<String> = self
            .approvals
            .pending
            .values()
            .filter(|p| p.launch.peer.uid == key.0 && p.launch.session_ref() == session_ref)
            .map(|p| p.id.clone())
            .collect();
        asked.sort();
        for id in asked {
            self.resolve_approval(&id, Answer::Reject, "session closed", None);
        }
        self.forget_session(key);
        self.approvals.end_session(key.0, &session_ref);
        self.log.line(format_args!("session {:?} closed", key.1));
        self.record(
            "session_close",
            None,
            json!({ "session": key.1, "uid": key.0 }),
        );
    }

    /// Removes a session record and its idle timer (a session whose only command never
    /// started is not kept).
    pub fn forget_session(&mut self, key: &SessionKey) {
        self.table.sessions.remove(key);
        if let Some(t) = self.idle_timers.remove(key) {
            self.timers.cancel(t);
        }
    }

    /// (Re)arms a session's idle check at `at`.
    fn arm_idle(&mut self, key: &SessionKey, at: Instant) {
        let t = self.timers.add(at, Timer::SessionIdle(key.clone()));
        if let Some(old) = self.idle_timers.insert(key.clone(), t) {
            self.timers.cancel(old);
        }
    }

    /// A session's idle timer fired: close it, or look again when it could next be idle.
    fn check_idle(&mut self, key: &SessionKey) {
        let idle = self.cfg.session_idle;
        if self.table.session_idle(key, self.now, idle) {
            self.log.line(format_args!(
                "session {:?} idle for {} s",
                key.1,
                idle.as_secs()
            ));
            self.close_session(key);
            return;
        }
        let Some(s) = self.table.sessions.get(key) else {
            return;
        };
        let next = if self.table.session_busy(key) {
            self.now + idle
        } else {
            s.last_used + idle
        };
        self.arm_idle(key, next.max(self.now + Duration::from_millis(10)));
    }

    // ---- shutdown ----------------------------------------------------------------------

    /// Begins a stop: every running command is killed, and what exited commands left in
    /// their trees is ended too.
    pub fn begin_shutdown(&mut self) {
        if self.stopping {
            return;
        }
        self.stopping = true;
        self.log.line(format_args!(
            "shutting down: killing {} running command(s)",
            self.table.running()
        ));
        let mut keys: Vec<Key> = self.table.procs.keys().copied().collect();
        keys.sort_unstable();
        for key in keys {
            match self.table.get(key).map(Proc::running) {
                Some(true) => self.kill(key, KillReason::Shutdown),
                Some(false) => self.end_tree(key),
                None => {}
            }
        }
    }

    /// Answers everything still parked: from state where it can be, else `-32007`
    /// (a command still waiting for an approver never starts).
    pub fn answer_all_parked(&mut self) {
        let mut asked: Vec<String> = self.approvals.pending.keys().cloned().collect();
        asked.sort();
        for id in asked {
            let reply = self
                .approvals
                .pending
                .get_mut(&id)
                .and_then(|p| p.req.take().map(|r| (p.conn, r)));
            self.resolve_approval(&id, Answer::Reject, "shutting down", None);
            if let Some((conn, req)) = reply {
                self.out.push(Effect::Reply {
                    conn,
                    req,
                    result: Err(RpcError::shutting_down()),
                });
            }
        }
        let mut ids: Vec<u64> = self.parked.keys().copied().collect();
        ids.sort_unstable();
        for id in ids {
            self.resolve(id, true);
            if let Some(p) = self.unpark(id) {
                self.out.push(Effect::Reply {
                    conn: p.conn,
                    req: p.req,
                    result: Err(RpcError::shutting_down()),
                });
            }
        }
    }
}

/// Puts `data` in `key`'s stdin buffer if it fits: `Some(written)`, or `None` when it
/// does not fit yet. An error when the command is gone, has exited or its stdin is closed.
fn queue_stdin(
    table: &mut Table,
    key: Key,
    data: &[u8],
    eof: bool,
) -> Result<Option<usize>, RpcError> {
    let p = table
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::launch::After;
    use crate::core::table::{Family, SubOpts};
    use crate::methods::events::tests::FakeOuts;
    use crate::methods::events::{self};
    use crate::types::Program;

    const C1: ConnId = ConnId(1);
    const C2: ConnId = ConnId(2);

    fn core() -> Core {
        let cfg = Config {
            kill_grace: Duration::from_secs(2),
            session_idle: Duration::from_secs(60),
            max_sessions: 6,
            ..Config::default()
        };
        {
            let (now, wall) = crate::types::test_clock();
            Core::new(cfg, now, wall, Log::new(false))
        }
    }

    fn request(family: Family, stdio: Stdio3) -> LaunchRequest {
        LaunchRequest {
            family,
            peer: Peer {
                uid: 1000,
                gid: 1000,
                pid: 42,
            },
            program: Program::Direct {
                program: "true".into(),
                args: vec![],
            },
            command: "true".into(),
            args: vec![],
            env: vec![],
            cwd: "/".into(),
            stdio,
            ring_capacity: 64,
            prefix: "term",
            subscribe: None,
            limits: Default::default(),
            after: After::Terminal,
            admitted: None,
        }
    }

    /// Starts a fake terminal (pid = key + 1000) and returns its key.
    fn terminal(c: &mut Core) -> Key {
        let req = request(
            Family::Terminal {
                session_id: "s".into(),
            },
            Stdio3::Merged,
        );
        let (key, id) = c.table.next_ids("term");
        c.started(&req, key, id, key as i32 + 1000, req.peer.uid);
        key
    }

    fn bash(c: &mut Core, session: &str) -> Key {
        let sk = c.open_session(1000, Some(session), None, true).unwrap();
        assert_eq!(sk.0, 1000);
        let req = request(
            Family::Bash {
                session_id: session.into(),
            },
            Stdio3::Separate,
        );
        let (key, id) = c.table.next_ids("cmd");
        c.started(&req, key, id, key as i32 + 1000, req.peer.uid);
        key
    }

    fn replies(c: &mut Core) -> Vec<(ConnId, ReqNo, Result<Value, RpcError>)> {
        let mut v = Vec::new();
        for e in std::mem::take(&mut c.out) {
            if let Effect::Reply { conn, req, result } = e {
                v.push((conn, req, result));
            }
        }
        v
    }

    fn ends(c: &mut Core) -> Vec<(Key, Stage)> {
        std::mem::take(&mut c.out)
            .into_iter()
            .filter_map(|e| match e {
                Effect::End { key, stage } => Some((key, stage)),
                _ => None,
            })
            .collect()
    }

    fn later(c: &mut Core, d: Duration) {
        let (now, wall) = (c.now + d, c.wall + d);
        c.tick(now, wall);
        c.fire_due();
    }

    #[test]
    fn a_wait_for_exit_parks_until_the_exit() {
        let mut c = core();
        let k = terminal(&mut c);
        c.park(C1, ReqNo(7), Wait::Exit(k), None);
        assert!(replies(&mut c).is_empty(), "still running");
        assert_eq!(c.parked_by(C1), 1);
        c.exited(k, Ended::Code(3), Usage::default(), None);
        let r = replies(&mut c);
        assert_eq!(r.len(), 1);
        assert_eq!(r[0].0, C1);
        assert_eq!(r[0].1, ReqNo(7));
        assert_eq!(
            r[0].2.as_ref().unwrap(),
            &json!({"exitCode": 3, "signal": null})
        );
        assert_eq!(c.parked_by(C1), 0);
        // Already exited: answered at once.
        c.park(C2, ReqNo(1), Wait::Exit(k), None);
        assert_eq!(replies(&mut c).len(), 1);
    }

    #[test]
    fn bash_output_wait_answers_on_output_past_the_offset_or_the_deadline() {
        let mut c = core();
        let k = bash(&mut c, "w");
        let deadline = c.now + Duration::from_secs(5);
        c.park(
            C1,
            ReqNo(1),
            Wait::BashOutput {
                key: k,
                from: [0, 0],
            },
            Some(deadline),
        );
        assert!(replies(&mut c).is_empty(), "nothing yet");
        c.output(k, 0, b"abc");
        c.wake(k);
        let r = replies(&mut c);
        assert_eq!(r.len(), 1);
        assert_eq!(r[0].1, ReqNo(1));
        assert_eq!(r[0].2.as_ref().unwrap()["stdout"], "abc");
        c.park(
            C1,
            ReqNo(2),
            Wait::BashOutput {
                key: k,
                from: [3, 0],
            },
            Some(deadline),
        );
        assert!(replies(&mut c).is_empty(), "nothing past offset 3");
        // The other answers at its deadline, with nothing new.
        later(&mut c, Duration::from_secs(4));
        assert!(replies(&mut c).is_empty());
        later(&mut c, Duration::from_secs(1));
        let r = replies(&mut c);
        assert_eq!(r.len(), 1);
        assert_eq!(r[0].2.as_ref().unwrap()["stdout"], "");
        assert_eq!(r[0].2.as_ref().unwrap()["offset"], 3);
    }

    #[test]
    fn waits_that_answer_with_output_are_bounded_per_connection() {
        let mut c = core();
        let k = bash(&mut c, "s");
        let wait = || Wait::BashOutput {
            key: k,
            from: [0, 0],
        };
        for n in 0..MAX_OUTPUT_WAITS as u64 {
            c.park(C1, ReqNo(n), wait(), None);
        }
        assert!(replies(&mut c).is_empty());
        // One more is refused; another connection and other waits are not.
        c.park(C1, ReqNo(100), wait(), None);
        c.park(C1, ReqNo(101), Wait::Exit(k), None);
        c.park(C2, ReqNo(1), wait(), None);
        let r = replies(&mut c);
        assert_eq!(r.len(), 1);
        assert_eq!(r[0].1, ReqNo(100));
        let e = r[0].2.as_ref().unwrap_err();
        assert_eq!(e.code, -32003);
        assert_eq!(
            e.data,
            Some(json!({"limit": "waiting-output", "value": 32}))
        );
        // An answered wait frees its place.
        c.cancel(C1, ReqNo(0));
        assert_eq!(replies(&mut c).len(), 1);
        c.park(C1, ReqNo(102), wait(), None);
        assert!(replies(&mut c).is_empty());
        assert_eq!(c.parked_by(C1), MAX_OUTPUT_WAITS + 1);
    }

    #[test]
    fn a_disconnected_client_leaves_nothing_parked() {
        let mut c = core();
        let k = terminal(&mut c);
        c.park(C1, ReqNo(1), Wait::Exit(k), None);
        c.park(
            C2,
            ReqNo(1),
            Wait::Exit(k),
            Some(c.now + Duration::from_secs(1)),
        );
        c.disconnected(C2);
        assert_eq!(c.parked_by(C2), 0);
        assert_eq!(c.table.get(k).unwrap().waiters.len(), 1);
        later(&mut c, Duration::from_secs(2));
        c.exited(k, Ended::Code(0), Usage::default(), None);
        let r = replies(&mut c);
        assert_eq!(r.len(), 1);
        assert_eq!(r[0].0, C1);
    }

    #[test]
    fn kill_escalates_after_the_grace_even_when_the_leader_died() {
        let mut c = core();
        let k = terminal(&mut c);
        c.kill(k, KillReason::Request);
        assert_eq!(ends(&mut c), vec![(k, Stage::Term)]);
        // A second kill waits for the first: no new SIGTERM, no second escalation.
        c.kill(k, KillReason::Request);
        assert!(ends(&mut c).is_empty());
        // The leader dies of the SIGTERM; a descendant may not have.
        c.exited(k, Ended::Signal(libc::SIGTERM), Usage::default(), None);
        std::mem::take(&mut c.out);
        later(&mut c, Duration::from_millis(1999));
        assert!(ends(&mut c).is_empty());
        later(&mut c, Duration::from_millis(1));
        assert_eq!(ends(&mut c), vec![(k, Stage::Kill)], "exactly one SIGKILL");
        assert_eq!(c.table.get(k).unwrap().status(), "killed");
    }

    #[test]
    fn release_of_a_running_command_kills_it_and_forgets_it_once_reaped() {
        let mut c = core();
        let k = terminal(&mut c);
        let id = c.table.get(k).unwrap().id.clone();
        c.park(C1, ReqNo(1), Wait::Exit(k), None);
        c.release(k, KillReason::Release);
        assert_eq!(c.table.find(&id, 1000), None, "hidden at once");
        let effects = std::mem::take(&mut c.out);
        assert!(effects
            .iter()
            .any(|e| matches!(e, Effect::ClosePipes(x) if *x == k)));
        assert!(effects
            .iter()
            .any(|e| matches!(e, Effect::End { key, stage: Stage::Term } if *key == k)));
        c.sweep();
        assert!(c.table.get(k).is_some(), "kept until reaped");
        c.exited(k, Ended::Signal(libc::SIGTERM), Usage::default(), None);
        assert_eq!(
            replies(&mut c).len(),
            1,
            "the parked waiter still gets the exit"
        );
        c.sweep();
        assert!(
            c.table.get(k).is_none(),
            "forgotten once reaped and answered"
        );
    }

    #[test]
    fn release_of_an_exited_command_ends_its_leftovers_and_forgets_it() {
        let mut c = core();
        let k = terminal(&mut c);
        c.exited(k, Ended::Code(0), Usage::default(), None);
        std::mem::take(&mut c.out);
        c.release(k, KillReason::Release);
        assert_eq!(ends(&mut c), vec![(k, Stage::Term)]);
        c.sweep();
        assert!(c.table.get(k).is_none());
        later(&mut c, Duration::from_secs(2));
        assert_eq!(ends(&mut c), vec![(k, Stage::Kill)]);
    }

    #[test]
    fn a_hard_timeout_kills_and_reports_timed_out() {
        let mut c = core();
        let k = bash(&mut c, "h");
        c.arm_hard_timeout(k, Duration::from_secs(3));
        later(&mut c, Duration::from_secs(3));
        assert_eq!(ends(&mut c), vec![(k, Stage::Term)]);
        c.exited(k, Ended::Signal(libc::SIGTERM), Usage::default(), None);
        assert_eq!(c.table.get(k).unwrap().status(), "timed_out");
    }

    #[test]
    fn idle_sessions_close_and_busy_ones_stay() {
        let mut c = core();
        let k = bash(&mut c, "busy");
        c.open_session(1000, Some("quiet"), None, true).unwrap();
        later(&mut c, Duration::from_secs(61));
        let quiet = (1000, "quiet".to_string());
        let busy = (1000, "busy".to_string());
        assert!(!c.table.sessions.contains_key(&quiet), "idle: closed");
        assert!(
            c.table.sessions.contains_key(&busy),
            "a running command keeps it"
        );
        c.exited(k, Ended::Code(0), Usage::default(), None);
        later(&mut c, Duration::from_secs(59));
        assert!(
            c.table.sessions.contains_key(&busy),
            "used by the exit just now"
        );
        later(&mut c, Duration::from_secs(62));
        assert!(!c.table.sessions.contains_key(&busy));
    }

    fn session_names(c: &Core) -> Vec<(u32, String)> {
        let mut v: Vec<(u32, String)> = c.table.sessions.keys().cloned().collect();
        v.sort();
        v
    }

    #[test]
    fn at_the_session_cap_the_owner_s_least_recently_used_quiet_session_makes_room() {
        let mut c = core();
        c.cfg.max_sessions = 4;
        c.open_session(0, Some("root-old"), None, true).unwrap();
        later(&mut c, Duration::from_secs(1));
        bash(&mut c, "a"); // uid 1000, busy
        c.open_session(1000, Some("b"), None, true).unwrap();
        later(&mut c, Duration::from_secs(1));
        // uid 1000 holds half the cap: its oldest quiet session makes room, not root's
        // older one.
        c.open_session(1000, Some("c"), None, true).unwrap();
        let names = session_names(&c);
        assert_eq!(
            names,
            [
                (0, "root-old".into()),
                (1000, "a".into()),
                (1000, "c".into())
            ]
        );
        // At the cap, root's own oldest quiet session goes.
        c.open_session(0, Some("root-new"), None, true).unwrap();
        c.open_session(0, Some("root-newer"), None, true).unwrap();
        let names = session_names(&c);
        assert_eq!(
            names,
            [
                (0, "root-new".into()),
                (0, "root-newer".into()),
                (1000, "a".into()),
                (1000, "c".into())
            ]
        );
        // Every session of the owner busy: refused, and nobody else's is touched.
        bash(&mut c, "c");
        let e = c.open_session(1000, Some("w"), None, true).unwrap_err();
        assert_eq!(e.code, crate::wire::rpc::LIMIT_REACHED);
        assert_eq!(session_names(&c).len(), 4);
    }

    #[test]
    fn closing_a_session_releases_running_commands_and_drops_finished_ones() {
        let mut c = core();
        let done = bash(&mut c, "s");
        let running = bash(&mut c, "s");
        c.exited(done, Ended::Code(0), Usage::default(), None);
        std::mem::take(&mut c.out);
        c.close_session(&(1000, "s".to_string()));
        assert_eq!(ends(&mut c), vec![(running, Stage::Term)]);
        c.sweep();
        assert!(c.table.get(done).is_none());
        assert!(c.table.get(running).is_some());
        c.exited(
            running,
            Ended::Signal(libc::SIGTERM),
            Usage::default(),
            None,
        );
        assert_eq!(c.table.get(running).unwrap().status(), "killed");
        c.sweep();
        assert!(c.table.get(running).is_none());
    }

    #[test]
    fn shutdown_kills_everything_and_answers_the_parked() {
        let mut c = core();
        let a = terminal(&mut c);
        let b = terminal(&mut c);
        c.exited(b, Ended::Code(0), Usage::default(), None);
        c.park(C1, ReqNo(1), Wait::Exit(a), None);
        std::mem::take(&mut c.out);
        c.begin_shutdown();
        assert_eq!(ends(&mut c), vec![(a, Stage::Term), (b, Stage::Term)]);
        c.exited(a, Ended::Signal(libc::SIGTERM), Usage::default(), None);
        c.answer_all_parked();
        let r = replies(&mut c);
        assert_eq!(r.len(), 1);
        assert!(r[0].2.is_ok());
    }

    fn terminal_of(c: &mut Core, owner: u32, limit: usize) -> Key {
        let mut req = request(
            Family::Terminal {
                session_id: "s".into(),
            },
            Stdio3::Merged,
        );
        req.peer.uid = owner;
        req.ring_capacity = limit;
        let (key, id) = c.table.next_ids("term");
        c.started(&req, key, id, key as i32 + 1000, req.peer.uid);
        key
    }

    fn budget_core(max: usize) -> Core {
        let cfg = Config {
            max_output_memory: max,
            ..Config::default()
        };
        {
            let (now, wall) = crate::types::test_clock();
            Core::new(cfg, now, wall, Log::new(false))
        }
    }

    const MIB: usize = 1 << 20;

    #[test]
    fn the_budget_releases_retained_output_oldest_first_from_the_biggest_owner() {
        let mut c = budget_core(8 * MIB);
        // Root holds 3 MiB of exited output, uid 1000 holds 2 MiB in two commands.
        let r1 = terminal_of(&mut c, 0, MIB);
        let r2 = terminal_of(&mut c, 0, 2 * MIB);
        let u1 = terminal_of(&mut c, 1000, MIB);
        let u2 = terminal_of(&mut c, 1000, MIB);
        for (k, n) in [(r1, MIB), (u1, MIB), (r2, 2 * MIB), (u2, MIB)] {
            c.output(k, 0, &vec![b'x'; n]);
            later(&mut c, Duration::from_millis(10));
            c.exited(k, Ended::Code(0), Usage::default(), None);
        }
        assert_eq!(c.table.memory.total, 5 * MIB);
        // A running command of uid 2000 wants 4 MiB: 1 MiB must go. Root holds the most,
        // and its oldest exited command is r1.
        let run = terminal_of(&mut c, 2000, 4 * MIB);
        c.output(run, 0, &vec![b'y'; 4 * MIB]);
        assert_eq!(c.table.get(r1).unwrap().committed(), 0, "r1 released");
        assert_eq!(c.table.get(r2).unwrap().committed(), 2 * MIB, "r2 kept");
        assert_eq!(c.table.get(u1).unwrap().committed(), MIB, "u1 kept");
        assert_eq!(
            c.table.get(run).unwrap().streams[0].ring.retained(),
            4 * MIB
        );
        assert!(c.table.memory.total <= 8 * MIB);
        // A later read says what was dropped.
        let ring = &c.table.get(r1).unwrap().streams[0].ring;
        assert_eq!((ring.start(), ring.end()), (MIB as u64, MIB as u64));
        assert_eq!(c.table.memory.released, MIB as u64);
    }

    #[test]
    fn a_non_root_owner_holds_at_most_half_the_budget() {
        let mut c = budget_core(8 * MIB);
        let old = terminal_of(&mut c, 1000, 2 * MIB);
        c.output(old, 0, &vec![b'a'; 2 * MIB]);
        c.exited(old, Ended::Code(0), Usage::default(), None);
        let run = terminal_of(&mut c, 1000, 8 * MIB);
        c.output(run, 0, &vec![b'b'; 6 * MIB]);
        // Its own exited output went first; then its running ring stopped growing.
        assert_eq!(c.table.get(old).unwrap().committed(), 0);
        assert!(c.table.memory.of(1000) <= 4 * MIB);
        let ring = &c.table.get(run).unwrap().streams[0].ring;
        assert_eq!(ring.end(), 6 * MIB as u64);
        assert!(ring.start() > 0, "truncated, as a full ring is");
        assert_eq!(ring.retained(), ring.committed());
        // Root may use the rest.
        let root = terminal_of(&mut c, 0, 4 * MIB);
        c.output(root, 0, &vec![b'c'; 4 * MIB]);
        assert_eq!(c.table.get(root).unwrap().committed(), 4 * MIB);
    }

    #[test]
    fn running_commands_alone_at_the_budget_keep_their_tails_and_nothing_is_refused() {
        let mut c = budget_core(2 * MIB);
        let a = terminal_of(&mut c, 0, 2 * MIB);
        let b = terminal_of(&mut c, 0, 2 * MIB);
        c.output(a, 0, &vec![b'a'; 3 * MIB / 2]);
        c.output(b, 0, &vec![b'b'; 3 * MIB / 2]);
        c.output(b, 0, b"tail");
        assert!(c.table.memory.total <= 2 * MIB);
        let rb = &c.table.get(b).unwrap().streams[0].ring;
        let (s, e) = (rb.start(), rb.end());
        assert_eq!(&rb.text(e - 4, e), "tail");
        assert!(s > 0);
        // Forgetting a command gives its memory back.
        c.exited(a, Ended::Code(0), Usage::default(), None);
        c.release(a, KillReason::Release);
        c.sweep();
        assert_eq!(c.table.memory.total, c.table.get(b).unwrap().committed());
    }

    #[test]
    fn a_subscriber_with_nothing_to_send_asks_for_no_wake_up() {
        let mut c = core();
        let k = terminal(&mut c);
        c.table.subscribe(k, C1, [0, 0], SubOpts::default());
        let mut outs = FakeOuts::with(&[(1, 1 << 20)]);
        assert!(
            events::pump(&mut c.table, k, &mut outs).touched.is_empty(),
            "nothing written: no connection to flush"
        );
        assert!(events::on_room(&mut c.table, C1, &mut outs)
            .touched
            .is_empty());
        c.output(k, 0, b"hi\n");
        assert_eq!(events::pump(&mut c.table, k, &mut outs).touched, vec![C1]);
        let ev = outs.drain(1);
        assert_eq!(ev[0]["params"]["payload"]["data"], "hi\n");
        // Caught up: quiet again.
        assert!(events::pump(&mut c.table, k, &mut outs).touched.is_empty());
        assert!(events::on_room(&mut c.table, C1, &mut outs)
            .touched
            .is_empty());
    }

    #[test]
    fn a_lagging_subscriber_gets_one_gap_and_resumes_at_the_live_edge() {
        let mut c = core();
        let k = terminal(&mut c); // ring of 64 bytes
        c.table.subscribe(k, C1, [0, 0], SubOpts::default());
        let mut outs = FakeOuts::with(&[(1, 200)]);
        c.output(k, 0, &[b'a'; 60]);
        events::pump(&mut c.table, k, &mut outs);
        c.output(k, 0, &[b'b'; 60]);
        events::pump(&mut c.table, k, &mut outs);
        // Over the cap of 200 now: lagging, more output is not queued.
        let queued = outs.0[&C1].buf.len();
        assert!(queued >= 200, "{queued}");
        c.output(k, 0, &[b'c'; 60]);
        assert!(events::pump(&mut c.table, k, &mut outs).touched.is_empty());
        assert!(c.table.get(k).unwrap().subs[0].lagging);
        // The socket takes it all: one Gap for what was missed, then live output.
        let seen = outs.drain(1);
        assert_eq!(seen.len(), 2);
        assert_eq!(
            events::on_room(&mut c.table, C1, &mut outs).touched,
            vec![C1]
        );
        let ev = outs.drain(1);
        assert_eq!(ev.len(), 1);
        assert_eq!(ev[0]["params"]["type"], "Gap");
        assert_eq!(ev[0]["params"]["payload"]["offset"], 120);
        assert_eq!(ev[0]["params"]["payload"]["skipped"], 60);
        c.output(k, 0, b"d");
        events::pump(&mut c.table, k, &mut outs);
        let ev = outs.drain(1);
        assert_eq!(ev[0]["params"]["payload"]["offset"], 180);
        assert_eq!(ev[0]["params"]["payload"]["data"], "d");
    }

    #[test]
    fn exit_reaches_subscribers_of_a_released_command_before_it_is_forgotten() {
        let mut c = core();
        let k = terminal(&mut c);
        c.table.subscribe(k, C1, [0, 0], SubOpts::default());
        c.release(k, KillReason::Release);
        c.exited(k, Ended::Signal(libc::SIGTERM), Usage::default(), None);
        let mut outs = FakeOuts::with(&[(1, 1 << 20)]);
        for e in std::mem::take(&mut c.out) {
            if let Effect::Pump(key) = e {
                events::pump(&mut c.table, key, &mut outs);
            }
        }
        c.sweep();
        assert!(c.table.get(k).is_none());
        assert!(c.table.subs_of.is_empty(), "the subscription went with it");
        let ev = outs.drain(1);
        assert_eq!(ev.last().unwrap()["params"]["type"], "Exit");
    }
}
