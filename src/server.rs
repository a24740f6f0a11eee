//! The event loop: one `Poll` over the listener, the signals, the log's descriptor, every
//! connection and every child pipe. It owns every descriptor and nothing else: the state
//! and the decisions are the core's.
//!
//! Each turn: poll (timeout = earliest timer, or zero while work is left over), service
//! what is ready (accept, read requests, read pipes, write stdin, reap on SIGCHLD), fire
//! due timers, carry out the core's effects (`apply`), flush the connections that got
//! output, write the log. A request goes connection -> `dispatch` -> family -> `Step`, and
//! `settle` turns the step into an answer, a parked wait, or a spawn.
//!
//! Invariants:
//! - No call here blocks: sockets, pipes and the log are non-blocking, children are reaped
//!   with `WNOHANG`, and a source that errors closes alone.
//! - An event for a token no longer held is ignored.
//! - A process's exit is published only after its pipes were drained of what they held.

use std::collections::HashMap;
use std::io::{self, Write};
use std::time::{Duration, Instant};

use mio::unix::SourceFd;
use mio::{Events, Interest, Poll, Token};
use serde_json::{json, Map, Value};
use signal_hook::consts::{SIGCHLD, SIGHUP, SIGINT, SIGTERM};
use signal_hook_mio::v1_0::Signals;

use crate::audit::{Log, Sinks};
use crate::config::Config;
use crate::conn::{Bounds, Conn, Fill};
use crate::contain::{Contain, Place, PrepareError, Unavailable};
use crate::core::{Caller, Core, Effect, Gated, Step};
use crate::events::{self, Outbox, Outboxes};
use crate::http;
use crate::launch::LaunchRequest;
use crate::listen::{Accepted, Listeners};
use crate::pipes::{Flushed, Got, Pipes, Source};
use crate::process::{self, Identity, PeerCred};
use crate::rpc::Incoming;
use crate::rpc::{self, ReqNo, RpcError};
use crate::table::{ConnId, Key, Peer};
use crate::timers::Timers;
use crate::{dispatch, systemd};

/// Signals the loop handles; every other one keeps its default.
const HANDLED_SIGNALS: [i32; 4] = [SIGCHLD, SIGTERM, SIGINT, SIGHUP];

const LISTENER: Token = Token(0);
const SIGNALS: Token = Token(1);
const LOG: Token = Token(2);
const AUDIT: Token = Token(3);
const CGROUPS: Token = Token(4);
const FIRST_DYNAMIC: usize = 5;

/// Size of the buffer pipes and sockets are read into.
const SCRATCH: usize = 256 << 10;
/// Bytes read from a connection per read.
const CONN_READ: usize = 64 << 10;
/// Bytes read from one pipe per turn before other sources get a go.
const PIPE_BYTES_PER_TURN: usize = 4 << 20;
/// Bytes read from each pipe when its command exits: more than a full pipe holds (execd
/// grows pipes to at most 1 MiB), and bounded even if a descendant keeps writing.
const EXIT_DRAIN_BYTES: usize = 2 << 20;
/// Smallest read from a watched pipe, so a tiny ring cannot turn reading into a busy loop
/// of one-byte reads (a ring that small loses bytes to a fast writer either way).
const MIN_WATCHED_READ: usize = 64 << 10;
/// Pause before accepting again after running out of descriptors.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);
/// How long shutdown waits for answers to drain to clients after the last command ended.
const SHUTDOWN_FLUSH: Duration = Duration::from_millis(500);
/// How often shutdown looks again for what is left of killed trees.
const SHUTDOWN_RECHECK: Duration = Duration::from_millis(20);
/// Output memory freed since the last trim that makes the heap worth trimming.
const TRIM_AFTER: usize = 16 << 20;

/// Where a command's request came from, for whom it runs as.
#[derive(Debug, Default)]
struct Origin {
    /// Through a TCP listener: it runs as `--http-run-as`.
    over_tcp: bool,
    /// The supplementary groups of the Unix peer.
    groups: Vec<u32>,
}

/// How often idle TCP connections are looked for at most, while there are any.
const TCP_IDLE_SWEEP: Duration = Duration::from_secs(5);

/// The loop's own deadlines (the core keeps the rest).
#[derive(Debug)]
enum LoopTimer {
    AcceptResume,
    /// Close TCP connections idle for `--http-idle`: an idle keep-alive connection, or
    /// one that never finishes a request.
    TcpIdleSweep,
    /// Grace plus a little after shutdown began: end what is left, stop waiting.
    ShutdownDeadline,
    /// Look again whether shutdown can finish.
    ShutdownRecheck,
    /// Tell systemd the loop still turns (`WATCHDOG=1`).
    Watchdog,
    /// A status change waits for its turn (at most one `STATUS=` a second).
    Status,
}

/// Where shutdown is.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Shutdown {
    /// Commands were killed; waiting for them to be reaped.
    Killing,
    /// Everything parked was answered; writing answers out until this instant.
    Flushing(Instant),
}

/// The outgoing buffers of every connection, as the event pump sees them.
struct ConnOuts<'a>(&'a mut HashMap<Token, Conn>);

impl Outbox for Conn {
    fn has_room(&self) -> bool {
        Conn::has_room(self)
    }
    fn below_half(&self) -> bool {
        Conn::below_half(self)
    }
    fn pending(&self) -> usize {
        self.pending_out()
    }
    fn buf(&mut self) -> &mut Vec<u8> {
        self.out_buf()
    }
}

impl Outboxes for ConnOuts<'_> {
    /// An HTTP connection has no outbox for events: its stream carries responses only (a
    /// subscription an HTTP request asked for is dropped as if its connection were gone).
    fn outbox(&mut self, conn: ConnId) -> Option<&mut dyn Outbox> {
        self.0
            .get_mut(&Token(conn.0))
            .filter(|c| !c.is_http())
            .map(|c| c as &mut dyn Outbox)
    }
}

/// The daemon.
pub struct Server {
    core: Core,
    poll: Poll,
    listeners: Listeners,
    signals: Signals,
    conns: HashMap<Token, Conn>,
    pipes: Pipes,
    contain: Contain,
    spawner: process::Spawner,
    /// `--run-as`, resolved at startup.
    run_as: Option<Identity>,
    timers: Timers<LoopTimer>,
    next_token: usize,
    scratch: Vec<u8>,
    /// Connections with output queued this turn.
    dirty: Vec<Token>,
    /// Pipes left readable after their per-turn budget.
    hot: Vec<(Key, usize)>,
    shutdown: Option<Shutdown>,
    accept_paused: bool,
    /// Leaders killed as they started (their pipes could not be watched), by pid: their
    /// holds are let go when they are reaped.
    abandoned: HashMap<i32, Key>,
    /// A `TcpIdleSweep` is due.
    tcp_sweep_armed: bool,
    uid: u32,
    /// The most output memory held since the heap was last trimmed.
    memory_peak: usize,
    /// systemd's notification socket, when it gave one.
    notifier: Option<systemd::Notifier>,
    /// A status change waits for its turn.
    status_pending: bool,
    /// Where the log and the audit records go.
    sinks: Sinks,
}

/// A limit containment cannot enforce: `-32003` naming the controller it needs.
fn unavailable(u: &Unavailable) -> RpcError {
    let c = u.0;
    RpcError::new(
        rpc::LIMIT_REACHED,
        format!(
            "limit reached: the {c} controller is not available to execd, so a {c} limit \
             cannot be enforced"
        ),
    )
    .with_data(json!({ "limit": format!("{c}-max"), "value": null, "controller": c }))
}

impl Server {
    /// Binds (or takes the systemd socket), installs signals and becomes subreaper.
    pub fn new(mut cfg: Config) -> io::Result<Server> {
        process::tune_allocator();
        process::cloexec_inherited();
        let poll = Poll::new()?;
        // Signals first: from the moment a client can connect, SIGTERM means a clean stop.
        let mut signals = Signals::new(HANDLED_SIGNALS)?;
        // A daemon started with these blocked would never hear of its children or a stop.
        process::unblock_signals(&HANDLED_SIGNALS);
        poll.registry()
            .register(&mut signals, SIGNALS, Interest::READABLE)?;
        process::become_subreaper()?;
        let run_as = match &cfg.run_as {
            Some(user) if process::current_uid() != 0 => {
                return Err(io::Error::new(
                    io::ErrorKind::PermissionDenied,
                    format!("--run-as {user} needs a daemon running as root"),
                ));
            }
            Some(user) => Some(Identity::of_user(user)?),
            None => None,
        };
        // After the signal handlers are in place: they are what children must reset.
        let spawner = process::Spawner::new(
            cfg.clean_env,
            &systemd::PRIVATE_VARS,
            &cfg.rlimits,
            process::raise_nofile(),
        )?;
        let policy = match &cfg.policy {
            Some(path) => crate::policy::Policy::load(path)
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?,
            None => crate::policy::Policy::default(),
        };
        let audit_file = match &cfg.audit {
            Some(crate::config::AuditTarget::File(path)) => Some(path.as_path()),
            _ => None,
        };
        let sinks = Sinks::open(audit_file, LOG, AUDIT)?;
        let notifier = systemd::Notifier::from_env(
            std::env::var_os("NOTIFY_SOCKET"),
            std::env::var_os("WATCHDOG_USEC"),
            std::env::var_os("WATCHDOG_PID"),
        )?;
        // Before anything is spawned: the daemon may move itself into its cgroup's leaf.
        let (contain, leftovers) = Contain::choose(&cfg.cgroup);
        if let Err(u) = contain.check(&cfg.limits) {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                format!(
                    "--{}-max needs the {} controller, and containment is {}",
                    u.0,
                    u.0,
                    contain.describe()
                ),
            ));
        }
        if let Some(fd) = contain.events_fd() {
            poll.registry()
                .register(&mut SourceFd(&fd), CGROUPS, Interest::READABLE)?;
        }
        // The journal stamps its lines itself.
        let mut log = Log::new(std::env::var_os("JOURNAL_STREAM").is_none());
        let mut next_token = FIRST_DYNAMIC;
        let listeners = Listeners::open(&mut cfg, &poll, LISTENER, &mut next_token, &mut log)?;
        let now = Instant::now();
        let mut core = Core::new(cfg, now, log);
        core.policy = policy;
        core.containment = (contain.kind(), contain.describe());
        if let Some(l) = leftovers.filter(|l| l.cgroups > 0) {
            core.log.line(format_args!(
                "killed {} process(es) a previous instance left in {} command cgroup(s){}",
                l.processes,
                l.cgroups,
                if l.kept > 0 {
                    format!("; {} could not be removed yet", l.kept)
                } else {
                    String::new()
                }
            ));
            core.record(
                "leftovers",
                None,
                json!({ "cgroups": l.cgroups, "processes": l.processes, "kept": l.kept }),
            );
        }
        Ok(Server {
            core,
            poll,
            listeners,
            signals,
            conns: HashMap::new(),
            pipes: Pipes::default(),
            contain,
            spawner,
            run_as,
            timers: Timers::default(),
            next_token,
            scratch: vec![0; SCRATCH],
            dirty: Vec::new(),
            hot: Vec::new(),
            shutdown: None,
            accept_paused: false,
            abandoned: HashMap::new(),
            tcp_sweep_armed: false,
            uid: process::current_uid(),
            sinks,
            memory_peak: 0,
            notifier,
            status_pending: false,
        })
    }

    /// Runs until shutdown completes.
    pub fn run(mut self) -> io::Result<()> {
        self.core.log.line(format_args!(
            "listening on {}{} (pid {}), containment: {}",
            self.core.cfg.socket.display(),
            if self.listeners.socket_file.is_none() {
                ", passed by systemd"
            } else {
                ""
            },
            std::process::id(),
            self.contain.describe()
        ));
        if let Some(n) = &self.notifier {
            n.send(&format!("READY=1\nSTATUS={}", self.status_text()));
            if let Some(every) = n.watchdog {
                n.send("WATCHDOG=1");
                self.timers.add(Instant::now() + every, LoopTimer::Watchdog);
            }
        }
        let mut events = Events::with_capacity(1024);
        loop {
            self.notify_status();
            self.write_log();
            // Work left from this turn (pipes still readable, answers queued while
            // flushing) means polling without sleeping.
            let timeout = if self.hot.is_empty() && self.dirty.is_empty() {
                let next = match (self.core.next_deadline(), self.timers.next_deadline()) {
                    (Some(a), Some(b)) => Some(a.min(b)),
                    (a, b) => a.or(b),
                };
                next.map(|d| d.saturating_duration_since(Instant::now()))
            } else {
                Some(Duration::ZERO)
            };
            if let Err(e) = self.poll.poll(&mut events, timeout) {
                if e.kind() != io::ErrorKind::Interrupted {
                    return Err(e);
                }
            }
            self.core.now = Instant::now();
            for ev in events.iter() {
                match ev.token() {
                    t if self.listeners.owns(t) => self.accept(t),
                    SIGNALS => self.on_signals(),
                    LOG | AUDIT => self.sinks.writable(ev.token()),
                    CGROUPS => self.contain.on_cgroup_events(),
                    t => self.on_ready(
                        t,
                        ev.is_readable() || ev.is_read_closed(),
                        ev.is_write_closed(),
                    ),
                }
            }
            self.service_hot();
            self.fire_timers();
            self.apply();
            self.flush_dirty();
            if self.shutdown_done() {
                break;
            }
        }
        self.listeners.remove_socket_file();
        self.core.log.line(format_args!("stopped"));
        self.write_log();
        Ok(())
    }

    /// What `STATUS=` says: clients and running commands.
    fn status_text(&self) -> String {
        format!(
            "{} client(s), {} running command(s), containment: {}",
            self.conns.len(),
            self.core.table.running(),
            self.contain.kind()
        )
    }

    /// Tells systemd the counts when they changed, at most once a second.
    fn notify_status(&mut self) {
        if self.status_pending {
            return;
        }
        let counts = (self.conns.len(), self.core.table.running());
        let text = self.status_text();
        if let Some(n) = self.notifier.as_mut() {
            if let systemd::Status::Later(at) = n.status(counts, &text, Instant::now()) {
                self.status_pending = true;
                self.timers.add(at, LoopTimer::Status);
            }
        }
    }

    fn token(&mut self) -> Token {
        let t = Token(self.next_token);
        self.next_token += 1;
        t
    }

    /// Writes the log and the audit records as far as their targets take them.
    fn write_log(&mut self) {
        let core = &mut self.core;
        self.sinks.write(
            self.poll.registry(),
            &mut core.log.queue,
            core.audit.as_mut(),
        );
    }

    /// SIGHUP: reopen the audit file (log rotation) and reload the policy.
    fn reopen(&mut self) {
        let cfg = &self.core.cfg;
        let what = match (cfg.audit.is_some(), cfg.policy.is_some()) {
            (false, false) => "no audit file or policy to reload",
            (true, false) => "reopening the audit file",
            (false, true) => "reloading the policy",
            (true, true) => "reopening the audit file and reloading the policy",
        };
        self.core.log.line(format_args!("SIGHUP: {what}"));
        if let Some(crate::config::AuditTarget::File(path)) = &self.core.cfg.audit {
            let path = path.clone();
            match self.sinks.reopen_audit(self.poll.registry(), &path) {
                Ok(()) => self
                    .core
                    .log
                    .line(format_args!("audit file {} reopened", path.display())),
                Err(e) => self.core.log.line(format_args!(
                    "audit file {} not reopened, still writing the old one: {e}",
                    path.display()
                )),
            }
        }
        if let Some(path) = self.core.cfg.policy.clone() {
            self.core.reload_policy(crate::policy::Policy::load(&path));
        }
    }

    // ---- connections -------------------------------------------------------------------

    fn peer_allowed(&self, peer: &PeerCred, groups: &[u32]) -> bool {
        let cfg = &self.core.cfg;
        peer.uid == self.uid
            || peer.uid == 0
            || cfg.allow_uids.contains(&peer.uid)
            || std::iter::once(&peer.gid)
                .chain(groups)
                .any(|g| cfg.allow_gids.contains(g))
    }

    /// Accepts what waits on listener `lt`: a Unix peer its credentials allow, or an
    /// HTTP client; none past `--max-clients` (told so in its own protocol).
    fn accept(&mut self, lt: Token) {
        while !self.accept_paused && self.shutdown.is_none() {
            let now = self.core.now;
            type Make = Box<dyn FnOnce(Token, Bounds) -> Conn>;
            let (conn_of, peer, groups): (Make, PeerCred, Vec<u32>) =
                match self.listeners.accept(lt) {
                    Accepted::Nothing => return,
                    Accepted::Failed(e) => {
                        // Out of descriptors (or memory): waiting connections stay queued
                        // in the kernel. Pause instead of spinning on a listener that
                        // stays ready.
                        self.core.log.refusal(
                            "accept",
                            now,
                            format_args!("accept failed: {e}; pausing accepts"),
                        );
                        self.accept_paused = true;
                        self.timers
                            .add(Instant::now() + ACCEPT_BACKOFF, LoopTimer::AcceptResume);
                        return;
                    }
                    Accepted::NoCredentials(e) => {
                        self.core.log.refusal(
                            "peer credentials",
                            now,
                            format_args!("dropped a connection without peer credentials: {e}"),
                        );
                        continue;
                    }
                    Accepted::Unix(stream, peer, groups) => {
                        if !self.peer_allowed(&peer, &groups) {
                            self.refuse(peer, "peer not allowed");
                            continue;
                        }
                        if self.conns.len() >= self.core.cfg.max_clients {
                            let mut stream = stream;
                            let e = RpcError::limit("max-clients", self.core.cfg.max_clients);
                            let _ = stream.write(&rpc::encode_response(&rpc::Id::null(), &Err(e)));
                            self.refuse(peer, "max-clients");
                            continue;
                        }
                        (
                            Box::new(move |t, b| Conn::unix(stream, t, peer, b)),
                            peer,
                            groups,
                        )
                    }
                    Accepted::Http(stream) => {
                        let peer = self.listeners.http_peer;
                        // TCP peers take at most half the connections: the Unix socket,
                        // whose peers say who they are, always keeps the other half.
                        let cap = self.core.cfg.max_clients.div_ceil(2);
                        let tcp = self.conns.values().filter(|c| c.is_tcp()).count();
                        let full = if tcp >= cap {
                            Some(("tcp-clients", cap))
                        } else if self.conns.len() >= self.core.cfg.max_clients {
                            Some(("max-clients", self.core.cfg.max_clients))
                        } else {
                            None
                        };
                        if let Some((limit, value)) = full {
                            let mut stream = stream;
                            let (status, body) = http::error_body(
                                rpc::LIMIT_REACHED,
                                &format!("limit reached: {limit}"),
                                Some(&json!({ "limit": limit, "value": value })),
                            );
                            let _ = stream.write(&http::response(status, &body, false, &[]));
                            self.refuse(peer, limit);
                            continue;
                        }
                        let auth = self.listeners.http_auth.clone();
                        (
                            Box::new(move |t, b| Conn::http(stream, t, peer, b, auth)),
                            peer,
                            self.listeners.http_groups.clone(),
                        )
                    }
                };
            let token = self.token();
            let mut conn = conn_of(token, self.bounds());
            if conn.register(self.poll.registry()).is_err() {
                continue;
            }
            if conn.is_tcp() && !self.tcp_sweep_armed {
                self.tcp_sweep_armed = true;
                self.timers
                    .add(now + self.tcp_sweep_every(), LoopTimer::TcpIdleSweep);
            }
            conn.last_request = now;
            conn.groups = groups.clone();
            self.conns.insert(token, conn);
            self.core.connected(
                ConnId(token.0),
                Peer {
                    uid: peer.uid,
                    gid: peer.gid,
                    pid: peer.pid,
                },
                groups,
            );
        }
    }

    /// A peer turned away at accept: logged (rate-limited) and audited.
    fn refuse(&mut self, peer: PeerCred, why: &str) {
        let who = Peer {
            uid: peer.uid,
            gid: peer.gid,
            pid: peer.pid,
        };
        self.core.record("refuse", Some(who), json!({ "why": why }));
        self.core.log.refusal(
            why,
            self.core.now,
            format_args!(
                "refused a connection from uid {} gid {} pid {}: {why}",
                peer.uid, peer.gid, peer.pid
            ),
        );
    }

    fn bounds(&self) -> Bounds {
        let cfg = &self.core.cfg;
        Bounds {
            max_message: cfg.max_message,
            max_batch: cfg.max_batch,
            cap: cfg.client_buffer,
        }
    }

    /// A source is ready. For a connection, writing (and resuming what waited for room)
    /// happens in `flush_dirty`, so only readability and a hang-up matter here.
    fn on_ready(&mut self, token: Token, readable: bool, hung_up: bool) {
        if self.conns.contains_key(&token) {
            if readable {
                self.read_requests(token);
            }
            // The peer closed its socket entirely (a half-close only ends reading), or
            // an HTTP client left while a request waits: what it sent was carried out
            // just now, and what waits for it (parked requests, asks for approval) is
            // withdrawn as the connection closes.
            if let Some(c) = self.conns.get_mut(&token) {
                if hung_up || c.left_waiting() {
                    c.broken = true;
                }
            }
            self.dirty.push(token);
            return;
        }
        match self.pipes.source(token) {
            Some(Source::Out { key, stream }) => {
                self.read_pipe(key, stream, PIPE_BYTES_PER_TURN, false)
            }
            Some(Source::Stdin { key }) => self.flush_stdin(key),
            None => {} // a source closed earlier this turn
        }
    }

    /// Reads and handles requests while the connection may read.
    fn read_requests(&mut self, token: Token) {
        let mut scratch = std::mem::take(&mut self.scratch);
        while let Some(conn) = self.conns.get_mut(&token) {
            // After EOF, requests already buffered are still handled.
            let fill = conn.fill(&mut scratch[..CONN_READ]);
            self.handle_incoming(token);
            let held = self.conns.get(&token).is_none_or(|c| c.read_pending);
            if held || fill != Fill::More {
                break;
            }
        }
        self.scratch = scratch;
    }

    /// Carries out what a connection has buffered, one request at a time.
    fn handle_incoming(&mut self, token: Token) {
        while let Some(incoming) = self.conns.get_mut(&token).and_then(Conn::ready) {
            match incoming {
                Incoming::Request {
                    req,
                    method,
                    params,
                } => self.request(token, req, &method, &params),
                // Answers to the approval requests execd sent.
                Incoming::Response { id, result } => {
                    if let Value::String(id) = id.to_value() {
                        self.core.approval_answer(ConnId(token.0), &id, &result);
                        self.apply();
                    }
                }
                Incoming::Cancel(req) => {
                    self.core.cancel(ConnId(token.0), req);
                    self.apply();
                }
            }
        }
        self.dirty.push(token);
    }

    fn request(
        &mut self,
        token: Token,
        req: Option<ReqNo>,
        method: &str,
        params: &Map<String, Value>,
    ) {
        let Some(conn) = self.conns.get(&token) else {
            return;
        };
        let caller = Caller {
            conn: ConnId(token.0),
            uid: conn.peer.uid,
            gid: conn.peer.gid,
            pid: conn.peer.pid,
        };
        let step = dispatch::call(&mut self.core, &caller, method, params);
        self.settle(token, req, step);
        self.apply();
    }

    /// Turns a family's step into action: an answer, a parked wait, or a spawn followed
    /// by the family's tail (which yields the next step).
    fn settle(&mut self, token: Token, req: Option<ReqNo>, step: Result<Step, RpcError>) {
        match step {
            Ok(Step::Launch(launch)) => match self.core.gate(launch, ConnId(token.0), req) {
                Gated::Admitted(launch) => self.start(token, req, &launch),
                Gated::Refused(e) => self.answer(token, req, Err(e)),
                Gated::Asked => {} // answered once an approver decides
            },
            Ok(Step::Park { wait, deadline }) => {
                // A notification is carried out and never answered, so never waits.
                if let Some(req) = req {
                    self.core.park(ConnId(token.0), req, wait, deadline);
                }
            }
            Ok(Step::Done(v)) => self.answer(token, req, Ok(v)),
            Err(e) => self.answer(token, req, Err(e)),
        }
    }

    /// Starts an admitted command, then settles the request with the family's tail.
    fn start(&mut self, token: Token, req: Option<ReqNo>, launch: &LaunchRequest) {
        let origin = self.conns.get(&token).map(|c| Origin {
            over_tcp: c.is_tcp(),
            groups: c.groups.clone(),
        });
        let started = self.launch(launch, origin.unwrap_or_default());
        let next = dispatch::after_launch(&mut self.core, launch, started);
        self.settle(token, req, next);
    }

    fn answer(&mut self, token: Token, req: Option<ReqNo>, result: Result<Value, RpcError>) {
        let Some(req) = req else { return };
        if let Err(e) = &result {
            if e.code == rpc::INTERNAL_ERROR {
                self.core.log.line(format_args!(
                    "internal error answered to conn {}: {}",
                    token.0, e.message
                ));
            }
            if e.code == rpc::LIMIT_REACHED {
                let data = e.data.as_ref();
                let limit = data
                    .and_then(|d| d["limit"].as_str())
                    .unwrap_or("limit")
                    .to_string();
                let value = data.map_or(Value::Null, |d| d["value"].clone());
                let uid = self.conns.get(&token).map_or(0, |c| c.peer.uid);
                self.core.log.refusal(
                    &limit,
                    self.core.now,
                    format_args!("refused a request of uid {uid}: {limit} ({value}) reached"),
                );
            }
        }
        if let Some(c) = self.conns.get_mut(&token) {
            let piling = c.owes_past_cap();
            c.answer(req, &result);
            self.dirty.push(token);
            if piling {
                self.bound_backlog(token);
            }
        }
    }

    /// A connection got an answer while more than `--client-buffer` was already owed to it
    /// (it parks requests and does not read their answers). Answers are not dropped, so
    /// when all that connections owe passes `--max-output-memory` this one is closed:
    /// like the rings, the answers waiting to be read stay within the budget (plus one
    /// answer), and a client reading its answers is never the one closed.
    fn bound_backlog(&mut self, token: Token) {
        let total: usize = self.conns.values().map(Conn::owed).sum();
        if total <= self.core.cfg.max_output_memory {
            return;
        }
        let Some(c) = self.conns.get_mut(&token) else {
            return;
        };
        let (uid, owed) = (c.peer.uid, c.owed());
        c.broken = true;
        self.core.log.refusal(
            "unread answers",
            self.core.now,
            format_args!(
                "closed a connection of uid {uid}: {owed} bytes of answers unread while \
                 connections are owed {total} bytes, over --max-output-memory"
            ),
        );
    }

    /// Carries out the core's effects, then lets it forget what is done with.
    fn apply(&mut self) {
        while !self.core.out.is_empty() {
            for effect in std::mem::take(&mut self.core.out) {
                match effect {
                    Effect::Reply { conn, req, result } => {
                        self.answer(Token(conn.0), Some(req), result)
                    }
                    Effect::End { key, stage } => self.contain.end(key, stage),
                    Effect::Signal { key, sig } => self.contain.signal(key, sig),
                    Effect::ClosePipes(key) => {
                        self.pipes.close_all(self.poll.registry(), key);
                        self.hot.retain(|(k, _)| *k != key);
                    }
                    Effect::FlushStdin(key) => self.flush_stdin(key),
                    Effect::CloseStdin(key) => self.pipes.close_stdin(self.poll.registry(), key),
                    Effect::Pump(key) => self.pump(key),
                    Effect::Send { conn, line } => {
                        if let Some(c) = self.conns.get_mut(&Token(conn.0)) {
                            c.queue_bytes(&line);
                            self.dirty.push(Token(conn.0));
                        }
                    }
                    Effect::Launch { conn, req, launch } => self.start(Token(conn.0), req, &launch),
                }
            }
        }
        self.core.sweep();
        // Give the heap back once much output memory was freed since it last was.
        let held = self.core.table.memory.total;
        self.memory_peak = self.memory_peak.max(held);
        if self.memory_peak - held >= TRIM_AFTER {
            process::trim_heap();
            self.memory_peak = held;
        }
    }

    /// Delivers events owed to `key`'s subscribers; marks the connections that got some.
    fn pump(&mut self, key: Key) {
        let done = events::pump(&mut self.core.table, key, &mut ConnOuts(&mut self.conns));
        self.after_pump(done);
    }

    /// Marks the connections a pump wrote to, and reads again the pipes it unpaused (they
    /// give no new readiness event while their writer waits on a full pipe).
    fn after_pump(&mut self, done: events::Pumped) {
        self.dirty
            .extend(done.touched.into_iter().map(|c| Token(c.0)));
        for key in done.resumed {
            let n = self.core.table.get(key).map_or(0, |p| p.streams.len());
            for s in 0..n {
                if !self.hot.contains(&(key, s)) {
                    self.hot.push((key, s));
                }
            }
        }
    }

    /// Writes what each connection touched this turn is owed, then closes the finished
    /// ones. While a connection has room, what waited for room goes on: lagging
    /// subscribers resume and requests held back by back-pressure are read, and what they
    /// queue is written too, until the socket is full (WRITABLE brings us back) or nothing
    /// more is owed. A connection still busy after a few rounds gets the next turn.
    fn flush_dirty(&mut self) {
        const ROUNDS: usize = 8;
        // A connection is marked once per message queued to it; flush it once.
        let mut dirty = std::mem::take(&mut self.dirty);
        dirty.sort_unstable_by_key(|t| t.0);
        dirty.dedup();
        for token in dirty {
            for round in 0.. {
                let Some(conn) = self.conns.get_mut(&token) else {
                    break;
                };
                conn.flush();
                if conn.broken || !conn.has_room() {
                    break;
                }
                let owed = conn.pending_out();
                // Read again only what may take requests now: re-reading a connection
                // still held back would mark it dirty again and spin the loop until its
                // oldest request is answered (which marks it dirty in turn).
                let held_back = conn.read_pending && conn.can_take();
                let mut done = events::on_room(
                    &mut self.core.table,
                    ConnId(token.0),
                    &mut ConnOuts(&mut self.conns),
                );
                done.touched.retain(|c| c.0 != token.0);
                self.after_pump(done);
                if held_back {
                    self.read_requests(token);
                }
                let Some(conn) = self.conns.get(&token) else {
                    break;
                };
                if conn.pending_out() == owed {
                    break; // nothing new to write
                }
                if round == ROUNDS {
                    self.dirty.push(token);
                    break;
                }
            }
            let Some(conn) = self.conns.get_mut(&token) else {
                continue;
            };
            // An approver that stops reading is asked nothing until it drains.
            self.core
                .approvals
                .set_listening(ConnId(token.0), conn.has_room());
            if conn.finished() {
                self.close_conn(token);
            } else {
                conn.update_interest(self.poll.registry());
            }
        }
        // Requests read while flushing may have left effects (and dirty connections, which
        // the next turn flushes without sleeping).
        self.apply();
    }

    /// How often idle TCP connections are looked for: a connection closes within half of
    /// `--http-idle` (or `TCP_IDLE_SWEEP`) after its time is up.
    fn tcp_sweep_every(&self) -> Duration {
        (self.core.cfg.http_idle / 2).min(TCP_IDLE_SWEEP)
    }

    /// Closes TCP connections that went `--http-idle` without a request while nothing was
    /// owed to them, and looks again later while any are open.
    fn close_idle_tcp(&mut self) {
        let now = self.core.now;
        let limit = self.core.cfg.http_idle;
        let mut any = false;
        for (token, c) in self.conns.iter_mut() {
            if !c.is_tcp() {
                continue;
            }
            any = true;
            if c.waiting() > 0 || c.owed() > 0 {
                continue; // in flight: idle from when its answer is written (`flush`)
            }
            if now.saturating_duration_since(c.last_request) >= limit {
                c.broken = true;
                self.dirty.push(*token);
            }
        }
        self.tcp_sweep_armed = any;
        if any {
            self.timers
                .add(now + self.tcp_sweep_every(), LoopTimer::TcpIdleSweep);
        }
    }

    fn close_conn(&mut self, token: Token) {
        let Some(mut conn) = self.conns.remove(&token) else {
            return;
        };
        conn.deregister(self.poll.registry());
        self.core.disconnected(ConnId(token.0));
    }

    // ---- spawning ----------------------------------------------------------------------

    /// Who a peer's commands run as: a root daemon runs a non-root peer's commands as that
    /// peer with the groups it holds (or as `--run-as`), and a request over TCP as its peer,
    /// `--http-run-as`, with the groups of that user's entry (looked up once at start: no
    /// user database is asked on the loop). Otherwise as the daemon itself.
    fn identity(&self, peer: Peer, origin: Origin) -> Option<Identity> {
        if self.uid != 0 || peer.uid == 0 {
            return None;
        }
        if let (Some(id), false) = (&self.run_as, origin.over_tcp) {
            return Some(id.clone());
        }
        Some(Identity {
            uid: peer.uid,
            gid: peer.gid,
            groups: origin.groups,
        })
    }

    /// Starts a command and records it: its place (a cgroup with its limits, made before
    /// the spawn), the spawn, its pipes. A failure at any step leaves nothing behind.
    fn launch(&mut self, req: &LaunchRequest, origin: Origin) -> Result<Key, RpcError> {
        let max = self.core.cfg.max_processes;
        if self.core.table.running() >= max {
            return Err(RpcError::limit("max-processes", max));
        }
        let (key, id) = match &req.admitted {
            Some(a) => (a.key, a.id.clone()),
            None => self.core.table.next_ids(req.prefix),
        };
        let place = self
            .contain
            .prepare(&id, &req.limits)
            .map_err(|e| match e {
                PrepareError::Unavailable(u) => unavailable(&u),
                PrepareError::Io(e) => RpcError::internal(format!("{e}")),
            })?;
        let user = self.identity(req.peer, origin);
        let spec = process::SpawnSpec {
            program: &req.program,
            env: &req.env,
            cwd: &req.cwd,
            stdio: req.stdio,
            user: user.as_ref(),
            cgroup_procs: place.as_ref().map(Place::procs_fd),
        };
        let spawned = match self.spawner.spawn(&spec) {
            Ok(s) => s,
            Err(e) => {
                self.contain.abandon(place);
                self.core.log.refusal(
                    "spawn failures",
                    self.core.now,
                    format_args!(
                        "could not start {:?} for uid {}: {}",
                        req.command,
                        req.peer.uid,
                        rpc::os_error_text(&e)
                    ),
                );
                let program = match &req.program {
                    process::Program::Direct { program, .. } => program.clone(),
                    process::Program::Shell { shell, .. } => shell.display().to_string(),
                };
                return Err(RpcError::spawn_failed(&program, &e));
            }
        };
        let pid = spawned.pid;
        // From here the tree is held: whatever fails next, it can be ended.
        self.contain.started(key, pid, place);
        let outs: Vec<_> = std::iter::once(spawned.out).chain(spawned.err).collect();
        let next = &mut self.next_token;
        let added = self
            .pipes
            .add(self.poll.registry(), key, outs, spawned.stdin, || {
                let t = Token(*next);
                *next += 1;
                t
            });
        if let Err(e) = added {
            // Cannot watch its output: do not leave it running unobserved. Its hold is let
            // go when the leader is reaped.
            self.contain.end(key, crate::contain::Stage::Kill);
            process::signal_group(pid, libc::SIGKILL);
            self.abandoned.insert(pid, key);
            return Err(RpcError::internal(format!("registering a pipe: {e}")));
        }
        let runs_as = user.as_ref().map_or(self.uid, |u| u.uid);
        self.core.started(req, key, id, pid, runs_as);
        Ok(key)
    }

    // ---- pipes -------------------------------------------------------------------------

    /// Reads up to `budget` bytes from one of a process's pipes into its ring.
    ///
    /// With subscribers attached, each read is at most the ring's size (but not tiny) and
    /// they are pumped after each one, so a subscriber with room never loses bytes to the
    /// ring in between. `to_eof` (the drain when a command exits) reads on after a short
    /// read, to see an EOF that is already there: a stream known to have ended hands out
    /// its last incomplete character as U+FFFD instead of holding it back.
    fn read_pipe(&mut self, key: Key, stream: usize, budget: usize, to_eof: bool) {
        if !self.pipes.is_open(key, stream) {
            self.core.read_out(key, stream);
            return; // closed earlier (EOF, release), or never had one
        }
        let mut scratch = std::mem::take(&mut self.scratch);
        let mut got = false;
        let mut eof = false;
        let mut exhausted = true;
        let mut left = budget;
        while left > 0 {
            let Some(p) = self.core.table.get(key) else {
                exhausted = false;
                break;
            };
            if p.paused {
                // A lossless subscriber is behind: the command waits on its full pipe
                // until the subscriber drains (the pump then puts this pipe back here).
                exhausted = false;
                break;
            }
            let watched = !p.subs.is_empty();
            let capacity = p.streams.get(stream).map_or(0, |s| s.ring.capacity());
            let want = if watched {
                capacity.clamp(MIN_WATCHED_READ, scratch.len())
            } else {
                scratch.len()
            }
            .min(left);
            match self.pipes.read(key, stream, &mut scratch[..want]) {
                Got::Data(n) => {
                    self.core.output(key, stream, &scratch[..n]);
                    got = true;
                    left -= n;
                    if watched {
                        self.pump(key);
                    }
                    if n < want && !to_eof {
                        // A short read from a pipe took all it held (under the pipe's lock),
                        // so the next write finds it empty and wakes epoll again: the read
                        // that would only say EAGAIN is not needed.
                        exhausted = false;
                        break;
                    }
                }
                Got::Empty => {
                    exhausted = false;
                    break;
                }
                Got::Eof => {
                    self.pipes.close_out(self.poll.registry(), key, stream);
                    eof = true;
                    exhausted = false;
                    break;
                }
            }
        }
        self.scratch = scratch;
        if exhausted && !self.hot.contains(&(key, stream)) {
            self.hot.push((key, stream));
        }
        if eof {
            self.hot.retain(|h| *h != (key, stream));
            self.core.eof(key, stream);
        } else if got {
            self.pump(key);
            self.core.wake(key);
        }
        // An exit that found this pipe paused waits for every pipe to be read out.
        if !exhausted {
            self.core.read_out(key, stream);
        }
    }

    fn service_hot(&mut self) {
        for (key, stream) in std::mem::take(&mut self.hot) {
            self.read_pipe(key, stream, PIPE_BYTES_PER_TURN, false);
        }
    }

    /// Writes pending stdin as far as the pipe takes it.
    fn flush_stdin(&mut self, key: Key) {
        let Some(stdin) = self.core.table.get_mut(key).and_then(|p| p.stdin.as_mut()) else {
            return;
        };
        if !stdin.open {
            return;
        }
        let before = stdin.buf.len();
        let flushed = self.pipes.flush_stdin(self.poll.registry(), key, stdin);
        if flushed == Flushed::Closed {
            stdin.close();
        }
        if flushed == Flushed::Closed || stdin.buf.len() < before {
            // Room, or never any: a write waiting for room can be answered.
            self.core.wake(key);
            self.apply();
        }
    }

    // ---- processes and signals -----------------------------------------------------------

    fn on_signals(&mut self) {
        let mut chld = false;
        let mut term = false;
        for sig in self.signals.pending() {
            match sig {
                SIGCHLD => chld = true,
                SIGTERM | SIGINT => term = true,
                // Reopens the audit file and reloads the policy; a closing terminal's HUP
                // never kills the daemon (and with it every command).
                SIGHUP => self.reopen(),
                _ => {}
            }
        }
        if chld {
            self.reap_all();
        }
        if term {
            self.begin_shutdown();
        }
    }

    /// Reaps every exited child; one SIGCHLD may stand for many exits.
    fn reap_all(&mut self) {
        let mut orphans = false;
        while let Some(r) = process::reap_one() {
            let Some(key) = self.core.table.by_pid(r.pid) else {
                if let Some(key) = self.abandoned.remove(&r.pid) {
                    self.contain.leader_exited(key); // killed as it started
                } else {
                    orphans = true; // a re-parented descendant: reaped, nothing to publish
                }
                continue;
            };
            // Whatever the pipes hold now was written before the exit: read it first.
            let nstreams = self.core.table.get(key).map_or(0, |p| p.streams.len());
            for s in 0..nstreams {
                self.read_pipe(key, s, EXIT_DRAIN_BYTES, true);
            }
            let tree = self.contain.leader_exited(key);
            self.core.exited(key, r.ended, r.usage, tree);
            self.apply();
        }
        if orphans {
            self.contain.orphan_reaped();
        }
    }

    fn fire_timers(&mut self) {
        self.core.fire_due(Instant::now());
        while let Some(t) = self.timers.pop_due(Instant::now()) {
            match t {
                LoopTimer::AcceptResume => {
                    self.accept_paused = false;
                    for t in self.listeners.tokens() {
                        self.accept(t);
                    }
                }
                LoopTimer::ShutdownDeadline => {
                    // The grace is over: end whatever is left and stop waiting for it.
                    self.contain.kill_all();
                    self.finish_shutdown();
                }
                LoopTimer::ShutdownRecheck => {}
                LoopTimer::Watchdog => {
                    if let Some(n) = &self.notifier {
                        n.send("WATCHDOG=1");
                        if let Some(every) = n.watchdog {
                            self.timers.add(Instant::now() + every, LoopTimer::Watchdog);
                        }
                    }
                }
                LoopTimer::Status => self.status_pending = false,
                LoopTimer::TcpIdleSweep => self.close_idle_tcp(),
            }
        }
    }

    // ---- shutdown ----------------------------------------------------------------------

    fn begin_shutdown(&mut self) {
        if self.shutdown.is_some() {
            return;
        }
        if let Some(n) = &self.notifier {
            n.send("STOPPING=1");
        }
        self.shutdown = Some(Shutdown::Killing);
        self.listeners.close(&self.poll);
        self.core.begin_shutdown();
        self.apply();
        self.timers.add(
            self.core.now + self.core.cfg.kill_grace + SHUTDOWN_FLUSH,
            LoopTimer::ShutdownDeadline,
        );
    }

    /// Answers what is still parked and starts the final flush.
    fn finish_shutdown(&mut self) {
        if self.shutdown != Some(Shutdown::Killing) {
            return;
        }
        let until = Instant::now() + SHUTDOWN_FLUSH;
        self.shutdown = Some(Shutdown::Flushing(until));
        // Writability wakes the loop while answers go out; this bounds the wait.
        self.timers.add(until, LoopTimer::ShutdownRecheck);
        self.core.answer_all_parked();
        self.apply();
        self.dirty.extend(self.conns.keys().copied());
        self.flush_dirty();
    }

    fn shutdown_done(&mut self) -> bool {
        match self.shutdown {
            None => false,
            Some(Shutdown::Killing) => {
                // Every killed command was reaped: what their trees still hold goes now
                // (the leaders had their grace), and the daemon finishes once it is gone.
                if self.core.table.running() == 0 {
                    self.contain.kill_all();
                    if self.contain.any_left() {
                        self.timers.add(
                            Instant::now() + SHUTDOWN_RECHECK,
                            LoopTimer::ShutdownRecheck,
                        );
                    } else {
                        self.finish_shutdown();
                        return self.shutdown_done();
                    }
                }
                false
            }
            Some(Shutdown::Flushing(until)) => {
                let pending = self
                    .conns
                    .values()
                    .any(|c| c.pending_out() > 0 && !c.broken);
                !(pending && Instant::now() < until)
            }
        }
    }
}
