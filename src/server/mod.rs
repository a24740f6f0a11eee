//! The event loop: one `Poll` over the listeners, the signals, the log's descriptors,
//! every connection and every child pipe. It turns readiness into calls and nothing else:
//! the state and the decisions are the core's; admitting and answering connections is
//! `clients`'; starting commands, reading their pipes and reaping them is `children`'.
//!
//! Each turn: poll (timeout = earliest timer, or zero while work is left over), service
//! what is ready (accept, read requests, read pipes, write stdin, reap on SIGCHLD), fire
//! due timers, carry out the core's effects (`apply`), flush the connections that got
//! output, write the log. A request goes connection -> `dispatch` -> family -> `Step`, and
//! `settle` turns the step into an answer, a parked wait, or a spawn.
//!
//! What one turn may do for one source, so that a ping waits for about one slice of work
//! and not for a burst: a connection has at most `conn::REQUESTS_PER_TURN` (64) messages
//! taken (but for WebSocket frames and the last pass of a peer that hung up), a pipe at
//! most `children::PIPE_BYTES_PER_TURN` (4 MiB) read, and a connection one spawn in
//! flight; sweeps of other processes run off the loop (`reader`). What is left over is
//! taken up in the next turn, which polls without sleeping.
//!
//! Invariants:
//! - No call here blocks: sockets, pipes and the log are non-blocking, children are reaped
//!   with `WNOHANG`, and a source that errors closes alone.
//! - An event for a token no longer held is ignored.
//! - Every effect the core leaves is carried out before the loop sleeps.

mod children;
mod clients;
mod conn;
mod listen;
mod pipes;
mod reader;
mod signals;
mod upgrade;
mod ws;

use std::io;
use std::time::{Duration, Instant, SystemTime};

use mio::unix::SourceFd;
use mio::{Events, Interest, Poll, Token};
use serde_json::{Map, Value};
use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM, SIGUSR2};
use signal_hook::iterator::exfiltrator::origin::Origin;

use crate::config::Config;
use crate::core::launch::LaunchRequest;
use crate::core::log::Log;
use crate::core::tie::{Tie, TieSource};
use crate::core::timers::Timers;
use crate::core::vocab::After;
use crate::core::{Caller, Containment, Core, Effect, Gated, Step, Wait};
use crate::methods as dispatch;
use crate::server::children::{Children, ReapOutcome};
use crate::server::clients::{conn_id, token_of, Admission, Clients, Refusal};
use crate::server::conn::{Conn, Fill};
use crate::server::listen::Listeners;
use crate::server::signals::Signals;
use crate::sys::sinks::Sinks;
use crate::sys::systemd;
use crate::wire::rpc::{Incoming, ReqNo, RpcError};

pub use upgrade::{handed_back_flags, refuse_unparsed};

/// The flag the daemon runs its off-loop reader with (`execd --reader`).
pub const READER_FLAG: &str = crate::sys::reader::FLAG;

/// `execd --reader`: the off-loop reader's process, started by the daemon (never by
/// hand); it serves the daemon's requests on its stdin until that ends. Returns the exit
/// code.
pub fn reader_main() -> i32 {
    crate::sys::reader::serve()
}

/// What `execd --upgrade-check` prints: this build's version and the upgrade states it
/// takes, one JSON line (PROTOCOL 13).
pub fn upgrade_check_line() -> String {
    crate::wire::state::check_line()
}

/// Signals the loop handles; every other one keeps its default.
const HANDLED_SIGNALS: [i32; 4] = [SIGTERM, SIGINT, SIGHUP, SIGUSR2];

const LISTENER: Token = Token(0);
const SIGNALS: Token = Token(1);
const LOG: Token = Token(2);
const AUDIT: Token = Token(3);
const CGROUPS: Token = Token(4);
const FIRST_DYNAMIC: usize = 5;
/// Who a launch nobody asked for answers (a shell session's shell, restarted): no
/// connection ever has this token, so its answer goes nowhere.
const NOBODY: Token = Token(usize::MAX);
/// SIGCHLD's signalfd (`sys::reap::ExitSignals`): above every token handed out, so no
/// image's state can hold it.
const EXITS: Token = Token(usize::MAX - 1);

/// Bytes read from a connection per read.
const CONN_READ: usize = 64 << 10;
/// Pause before accepting again after running out of descriptors.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);
/// How long shutdown waits for answers to drain to clients after the last command ended.
const SHUTDOWN_FLUSH: Duration = Duration::from_millis(500);
/// How often shutdown looks again for what is left of killed trees.
const SHUTDOWN_RECHECK: Duration = Duration::from_millis(20);
/// How long shutdown waits past its deadline for the last cookie sweep (which a process
/// whose memory hangs delays by the reader's deadline each).
const FINAL_SWEEP: Duration = Duration::from_secs(3);
/// The longest a connection's requests wait for the read of its peer's cookie: past the
/// reader's own deadline for a hung memory (500 ms) and a restart; a reader that broke
/// answers later still, and then the connection is already served as it was tied.
const COOKIE_WAIT: Duration = Duration::from_secs(1);
/// Output memory freed since the last trim that makes the heap worth trimming.
const TRIM_AFTER: usize = 16 << 20;

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
    /// Look for commands waiting for input (PROTOCOL 12.3).
    InputCheck,
    /// The new binary's time to answer `--upgrade-check` is up (PROTOCOL 13).
    UpgradeProbe,
    /// The wait for spawns in flight before an upgrade's swap is up.
    UpgradeDrain,
    /// Ping every WebSocket (PROTOCOL 12.5).
    WsPing,
    /// Screen frames held back to their pace are due.
    WsFrames,
    /// The wait of a connection for its peer's cookie is up (`Conn::cookie_wait`).
    CookieWait(Token),
}

/// Where shutdown is.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Shutdown {
    /// Commands were killed; waiting for them to be reaped.
    Killing,
    /// Everything parked was answered; writing answers out until this instant.
    Flushing(Instant),
}

/// The daemon.
pub struct Server {
    core: Core,
    poll: Poll,
    listeners: Listeners,
    signals: Signals,
    exits: crate::sys::reap::ExitSignals,
    clients: Clients,
    children: Children,
    timers: Timers<LoopTimer>,
    next_token: usize,
    /// What connections are read into.
    scratch: Vec<u8>,
    shutdown: Option<Shutdown>,
    accept_paused: bool,
    /// A `TcpIdleSweep` is due.
    tcp_sweep_armed: bool,
    /// An `InputCheck` timer is set.
    input_check_armed: bool,
    /// The most output memory held since the heap was last trimmed.
    memory_peak: usize,
    /// When the loop last ended a turn that had something to do (`active`); what idle
    /// does not need is given back `host::IDLE_GIVE_BACK` later, once (`given_back`)
    /// until something happens again.
    quiet_since: Instant,
    active: bool,
    given_back: bool,
    /// The loop's turns, counted: a connection's `REQUESTS_PER_TURN` is per turn.
    turn: u64,
    /// systemd's notification socket, when it gave one.
    notifier: Option<systemd::Notifier>,
    /// A status change waits for its turn.
    status_pending: bool,
    /// Where the log and the audit records go.
    sinks: Sinks,
    /// An upgrade in place under way (PROTOCOL 13).
    upgrade: Option<upgrade::Upgrading>,
    /// Shutdown's deadline passed: it ends once the last cookie sweep did, or then.
    final_sweep_until: Option<Instant>,
    /// What this image, resumed from an upgrade, tells once it serves.
    resumed: Option<upgrade::Resumed>,
    /// The real time an upgrade's swap ran in, kept until this image caught up with what
    /// queued during the pause.
    swap_raised: Option<upgrade::SwapRaised>,
    /// WebSockets owed a screen frame (`ws`).
    frames_due: Vec<Token>,
    ws_frames_armed: bool,
    ws_ping_armed: bool,
}

impl Server {
    /// Binds (or takes the systemd socket), installs signals and becomes subreaper.
    pub fn new(mut cfg: Config) -> io::Result<Server> {
        crate::sys::host::tune_allocator();
        crate::sys::host::cloexec_inherited();
        let poll = Poll::new()?;
        // Signals first: from the moment a client can connect, SIGTERM means a clean stop.
        let mut signals = Signals::new(&HANDLED_SIGNALS)?;
        // A daemon started with these blocked would never hear of a stop. (SIGCHLD it blocks
        // itself, and reads from a signalfd: `ExitSignals`.)
        crate::sys::host::unblock_signals(&HANDLED_SIGNALS);
        poll.registry()
            .register(&mut signals, SIGNALS, Interest::READABLE)?;
        let exits = crate::sys::reap::ExitSignals::new()?;
        poll.registry()
            .register(&mut SourceFd(&exits.fd()), EXITS, Interest::READABLE)?;
        crate::sys::host::become_subreaper()?;
        let mut children = Children::new(&cfg)?;
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
        // The journal stamps its lines itself.
        let mut log = Log::new(std::env::var_os("JOURNAL_STREAM").is_none());
        log.wall = SystemTime::now();
        let mut next_token = FIRST_DYNAMIC;
        let mut listeners = Listeners::open(&mut cfg, &poll, LISTENER, &mut next_token, &mut log)?;
        // Last, once the socket is ours (a daemon that finds another listening stops before
        // touching any cgroup), and before anything is spawned: the daemon may move itself
        // into its cgroup's leaf and sweep what a previous instance left. A refusal here
        // leaves no socket file behind.
        let contained = children.choose_containment(&cfg).and_then(|found| {
            if let Some(fd) = children.contain.events_fd() {
                poll.registry()
                    .register(&mut SourceFd(&fd), CGROUPS, Interest::READABLE)?;
            }
            Ok(found)
        });
        let leftovers = contained.inspect_err(|_| listeners.remove_socket_file())?;
        let sandboxing = children
            .prepare_sandboxes(&cfg, &policy)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))
            .inspect_err(|_| listeners.remove_socket_file())?;
        let mut core = Core::new(cfg, Instant::now(), SystemTime::now(), log);
        core.policy = policy;
        core.sandboxing = sandboxing;
        core.containment = Containment {
            kind: children.contain.kind(),
            detail: children.contain.describe(),
            cookie: children.contain.instance(),
        };
        core.daemon_uid = crate::sys::ids::current_uid();
        core.shells.secret = crate::sys::host::random_secret()?;
        core.nofile = children.nofile.limit;
        if let Some((soft, _)) = children.nofile.raised_from {
            let limit = children.nofile.limit;
            core.log.line(format_args!(
                "descriptor limit raised from {soft} to {limit} (RLIMIT_NOFILE); commands \
                 get {soft} back"
            ));
        }
        if let Some(l) = &leftovers {
            core.found_leftovers(l);
        }
        if children.looks_on_loop() {
            core.log.line(format_args!(
                "looks for commands waiting for input run on the daemon's loop: Yama's \
                 ptrace_scope is 1 and the daemon is not root, so only it (the commands' \
                 ancestor) may read what they wait in, not its off-loop reader; a command \
                 whose memory hangs can hold the daemon while it is looked at"
            ));
        }
        Ok(Server {
            core,
            poll,
            listeners,
            signals,
            exits,
            clients: Clients::new(crate::sys::ids::current_uid()),
            children,
            timers: Timers::default(),
            next_token,
            scratch: vec![0; CONN_READ],
            shutdown: None,
            accept_paused: false,
            tcp_sweep_armed: false,
            input_check_armed: false,
            sinks,
            memory_peak: 0,
            quiet_since: Instant::now(),
            active: false,
            given_back: false,
            turn: 0,
            notifier,
            status_pending: false,
            upgrade: None,
            resumed: None,
            swap_raised: None,
            final_sweep_until: None,
            frames_due: Vec::new(),
            ws_frames_armed: false,
            ws_ping_armed: false,
        })
    }

    /// Runs until shutdown completes.
    pub fn run(mut self) -> io::Result<()> {
        if self.resumed.is_none() {
            self.log_listening();
        }
        let (counts, text) = (
            (self.clients.count(), self.core.table.running()),
            self.status_text(),
        );
        if let Some(n) = self.notifier.as_mut() {
            // The first status rides with READY=1 and counts as sent (at most one a
            // second).
            n.ready(counts, &text, Instant::now());
            if let Some(every) = n.watchdog {
                n.send("WATCHDOG=1");
                self.timers.add(Instant::now() + every, LoopTimer::Watchdog);
            }
        }
        // An image resumed from an upgrade serves from here: it says so.
        self.after_resume();
        let mut events = Events::with_capacity(1024);
        loop {
            self.turn += 1;
            self.notify_status();
            self.write_log();
            self.children.new_turn();
            // Quiet is counted from the end of the last turn that had something to do.
            if std::mem::take(&mut self.active) {
                self.quiet_since = Instant::now();
                self.given_back = false;
            }
            // Work left from this turn (pipes still readable, answers queued while
            // flushing) means polling without sleeping.
            let mut give_back = false;
            let timeout = if !self.children.busy() && self.clients.dirty.is_empty() {
                let idle_at = self.quiet_since + crate::sys::host::IDLE_GIVE_BACK;
                give_back = !self.given_back && Instant::now() >= idle_at;
                self.given_back |= give_back;
                let next = [
                    self.core.next_deadline(),
                    self.timers.next_deadline(),
                    self.children.reader_due(Instant::now()),
                    (!self.given_back).then_some(idle_at),
                    self.swap_raised.as_ref().map(|r| r.until),
                ]
                .into_iter()
                .flatten()
                .min();
                next.map(|d| d.saturating_duration_since(Instant::now()))
            } else {
                Some(Duration::ZERO)
            };
            // Long enough quiet: what idle does not need goes last thing before the
            // sleep, so that little more than the way into `epoll_wait` is mapped back.
            if give_back {
                self.give_back_idle();
            }
            if let Err(e) = self.poll.poll(&mut events, timeout) {
                if e.kind() != io::ErrorKind::Interrupted {
                    return Err(e);
                }
            }
            // Activity is what connections, commands and signals bring, and work left
            // over. What runs on its own while nothing else happens (a timer: the input
            // checks, the systemd watchdog; the reader's answers to the input checks) is
            // not: it maps back the little it runs.
            self.active = timeout == Some(Duration::ZERO)
                || events
                    .iter()
                    .any(|ev| !self.children.reader_owns(ev.token()));
            self.core.tick(Instant::now(), SystemTime::now());
            let mut accepted = false;
            for ev in events.iter() {
                match ev.token() {
                    t if self.listeners.owns(t) => {
                        self.accept(t);
                        accepted = true;
                    }
                    SIGNALS => self.on_signals(),
                    EXITS => {
                        if self.exits.take() {
                            self.reap_all();
                        }
                    }
                    LOG | AUDIT => self.sinks.writable(ev.token()),
                    CGROUPS => self.children.contain.on_cgroup_events(),
                    t if self.children.reader_owns(t) => {
                        let registry = self.poll.registry();
                        self.children.on_reader(&mut self.core, registry, t);
                        self.peer_cookies_read();
                    }
                    t if self.probe_token(t) => self.on_probe(t),
                    t => self.on_ready(
                        t,
                        (ev.is_readable(), ev.is_read_closed()),
                        ev.is_write_closed(),
                    ),
                }
            }
            let (core, clients) = (&mut self.core, &mut self.clients);
            self.children
                .service_hot(core, clients, self.poll.registry());
            // The off-loop reader: started or replaced, handed the sweep that is due, and
            // written to; what it answers arrives as its pipe's readiness.
            let registry = self.poll.registry();
            self.children.step_reader(
                &mut self.core,
                registry,
                &mut self.next_token,
                Instant::now(),
            );
            self.peer_cookies_read();
            self.fire_timers();
            self.apply();
            // While a running command has its stdin open, look every so often whether it
            // waits for input (only the quiet ones are looked at).
            if !self.input_check_armed && self.core.input_watch() {
                self.input_check_armed = true;
                let at = Instant::now() + crate::core::input::EVERY;
                self.timers.add(at, LoopTimer::InputCheck);
            }
            // What the log and the audit say about this turn is out before its answers:
            // a client that reads the log after an answer finds what led to it.
            self.write_log();
            self.flush_dirty();
            // A turn that took in all there was and left nothing over: an image resumed
            // from an upgrade has caught up, and the swap's real time goes. (Connections
            // accepted in this turn are read in the next: not caught up yet.) Looked at
            // only while that real time is held.
            if self.swap_raised.is_some() {
                self.settle_after_swap(
                    !accepted
                        && events.iter().count() < events.capacity()
                        && !self.children.busy()
                        && self.clients.dirty.is_empty(),
                );
            }
            // Spares for the next spawns are cloned after the answers are out.
            let stopping = self.shutdown.is_some() || self.draining();
            self.children.spares(!stopping);
            // An upgrade whose spawns in flight are done swaps images here, between turns.
            self.upgrade_step();
            if self.shutdown_done() {
                break;
            }
        }
        self.listeners.remove_socket_file();
        self.core.log.line(format_args!("stopped"));
        self.write_log();
        Ok(())
    }

    /// Frees the read buffers, trims the heap and unmaps the daemon's code pages, once
    /// until the loop has something to do again. Said first: the log is not written
    /// again before the sleep.
    fn give_back_idle(&mut self) {
        self.core.log.debug(format_args!(
            "idle: giving back read buffers, free heap and code pages"
        ));
        self.write_log();
        self.scratch = Vec::new();
        self.children.give_back_idle();
        crate::sys::host::trim_heap();
        crate::sys::host::unmap_own_code();
    }

    /// The start-up line: where the daemon listens and how it contains commands, short;
    /// without cgroups, a second line says why and how to get them (what still escapes
    /// is for `initialize`, `execctl status` and execd(8), not every start).
    fn log_listening(&mut self) {
        let (containment, why) = self.children.contain.summary();
        self.core.log.line(format_args!(
            "listening on {}{} (pid {}), containment: {containment}",
            self.core.cfg.socket.display(),
            if self.listeners.socket_file.is_none() {
                ", passed by systemd"
            } else {
                ""
            },
            std::process::id(),
        ));
        if let Some(why) = why {
            self.core.log.line(format_args!("{why}"));
        }
    }

    /// What `STATUS=` says: clients and running commands.
    fn status_text(&self) -> String {
        let counts = (self.clients.count(), self.core.table.running());
        Server::status_line(counts, self.children.contain.kind())
    }

    fn status_line((clients, running): (usize, usize), containment: &str) -> String {
        format!("{clients} client(s), {running} running command(s), containment: {containment}")
    }

    /// Tells systemd the counts when they changed, at most once a second.
    fn notify_status(&mut self) {
        if self.status_pending || self.notifier.is_none() {
            return;
        }
        let counts = (self.clients.count(), self.core.table.running());
        let kind = self.children.contain.kind();
        let text = || Server::status_line(counts, kind);
        if let Some(n) = self.notifier.as_mut() {
            if let systemd::Status::Later(at) = n.status(counts, text, Instant::now()) {
                self.status_pending = true;
                self.timers.add(at, LoopTimer::Status);
            }
        }
    }

    /// Writes the log and the audit records as far as their targets take them.
    fn write_log(&mut self) {
        let core = &mut self.core;
        self.sinks
            .write(self.poll.registry(), &mut core.log, core.audit.as_mut());
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
            let queue = self.core.audit.as_mut();
            match self.sinks.reopen_audit(self.poll.registry(), &path, queue) {
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
            // The new policy's workspaces and roots are opened; one that cannot be used
            // leaves the sandboxes as they were.
            match self
                .children
                .prepare_sandboxes(&self.core.cfg, &self.core.policy)
            {
                Ok(s) => self.core.sandboxing = s,
                Err(e) => self
                    .core
                    .log
                    .line(format_args!("sandboxes not changed by the reload: {e}")),
            }
        }
    }

    // ---- connections -------------------------------------------------------------------

    /// Accepts what waits on listener `lt`, until nothing does or accepting fails (then
    /// it pauses: the waiting connections stay queued in the kernel).
    fn accept(&mut self, lt: Token) {
        // Refused peers are told and closed once the log says why: a peer that reads its
        // answer, or sees the close, and then the log finds its refusal there. A few at a
        // time, so a flood of them costs a write of the log per batch, not per peer.
        const REFUSALS: usize = 64;
        let mut refused: Vec<Refusal> = Vec::new();
        // An upgrade that stopped reading requests takes no connections either: they wait
        // in the kernel's queue for the image that serves next.
        while !self.accept_paused && self.shutdown.is_none() && !self.draining() {
            let registry = self.poll.registry();
            let (core, next) = (&mut self.core, &mut self.next_token);
            let children = &mut self.children;
            let mut tie_of = |core: &Core, fd, pid| children.tie_of(core, fd, pid);
            match self
                .clients
                .accept(lt, &self.listeners, core, registry, next, &mut tie_of)
            {
                Admission::Nothing => break,
                Admission::Failed => {
                    self.accept_paused = true;
                    self.timers
                        .add(Instant::now() + ACCEPT_BACKOFF, LoopTimer::AcceptResume);
                    break;
                }
                Admission::Admitted { tcp: true, .. } if !self.tcp_sweep_armed => {
                    self.tcp_sweep_armed = true;
                    self.timers.add(
                        self.core.now + self.tcp_sweep_every(),
                        LoopTimer::TcpIdleSweep,
                    );
                }
                Admission::Admitted {
                    cookie: Some((token, pid, start)),
                    ..
                } => {
                    self.children.ask_peer_cookie(token, pid, start);
                    let until = Instant::now() + COOKIE_WAIT;
                    self.timers.add(until, LoopTimer::CookieWait(token));
                }
                Admission::Refused(Some(refusal)) => {
                    refused.push(refusal);
                    if refused.len() == REFUSALS {
                        self.write_log();
                        refused.drain(..).for_each(Refusal::send);
                    }
                }
                Admission::Admitted { .. } | Admission::Refused(None) => {}
            }
        }
        if !refused.is_empty() {
            self.write_log();
            refused.into_iter().for_each(Refusal::send);
        }
    }

    /// A source is ready. For a connection, writing (and resuming what waited for room)
    /// happens in `flush_dirty`, so only readability and a hang-up matter here.
    fn on_ready(&mut self, token: Token, (readable, read_closed): (bool, bool), hung_up: bool) {
        let readable = readable || read_closed;
        if let Some(c) = self.clients.get_mut(&token) {
            // Kept: its end of stream may still wait behind data (`Conn::fill`).
            c.peer_closed |= read_closed || hung_up;
            c.unread |= readable || hung_up;
            // Closed after this pass: what it sent is not held to 64 a turn.
            c.leaving |= hung_up;
            if readable {
                self.read_requests(token);
            }
            // The peer closed its socket entirely (a half-close only ends reading), or
            // an HTTP client left while a request waits: what it sent was carried out
            // just now, and what waits for it (parked requests, asks for approval) is
            // withdrawn as the connection closes.
            if let Some(c) = self.clients.get_mut(&token) {
                if hung_up || c.left_waiting() {
                    c.broken = true;
                }
            }
            self.clients.dirty.push(token);
            return;
        }
        if self.children.is_report(token) {
            return self.on_spawn_report(token);
        }
        let (core, clients) = (&mut self.core, &mut self.clients);
        if self
            .children
            .on_ready(token, core, clients, self.poll.registry())
        {
            self.apply();
        }
    }

    /// Reads and handles requests while the connection may read.
    fn read_requests(&mut self, token: Token) {
        if self.draining() {
            return; // what it sends waits in its socket for the image that serves next
        }
        let mut scratch = std::mem::take(&mut self.scratch);
        if scratch.is_empty() {
            scratch = vec![0; CONN_READ]; // given back when idle
        }
        while let Some(conn) = self.clients.get_mut(&token) {
            // After EOF, requests already buffered are still handled.
            let fill = conn.fill(&mut scratch);
            self.handle_incoming(token);
            let held = self.clients.get(&token).is_none_or(|c| c.read_pending);
            if held || fill != Fill::More {
                break;
            }
        }
        self.scratch = scratch;
    }

    /// Carries out what a connection has buffered, one request at a time.
    fn handle_incoming(&mut self, token: Token) {
        let turn = self.turn;
        while let Some(incoming) = self.clients.get_mut(&token).and_then(|c| c.ready(turn)) {
            match incoming {
                Incoming::Request {
                    req,
                    method,
                    params,
                } => self.request(token, req, &method, &params),
                // Answers to the approval requests execd sent.
                Incoming::Response { id, result } => {
                    if let Value::String(id) = id.to_value() {
                        self.core.approval_answer(conn_id(token), &id, &result);
                        self.apply();
                    }
                }
                Incoming::Cancel(req) => {
                    self.core.cancel(conn_id(token), req);
                    self.apply();
                }
            }
        }
        if self.clients.get(&token).is_some_and(Conn::is_ws) {
            self.ws_input(token);
        }
        self.clients.dirty.push(token);
    }

    fn request(
        &mut self,
        token: Token,
        req: Option<ReqNo>,
        method: &str,
        params: &Map<String, Value>,
    ) {
        if method == crate::wire::http::exchange::WS_METHOD {
            let opening = req.and_then(|r| {
                let c = self.clients.get_mut(&token)?;
                Some((r, c.take_upgrade(r)?))
            });
            if let Some((req, opening)) = opening {
                self.handshake(token, req, &opening, params);
                self.apply();
                return;
            }
        }
        let Some(conn) = self.clients.get(&token) else {
            return;
        };
        let caller = Caller {
            conn: conn_id(token),
            uid: conn.peer.uid,
            gid: conn.peer.gid,
            pid: conn.peer.pid,
            tie: conn.tie,
        };
        let step = dispatch::call(&mut self.core, &caller, method, params);
        self.settle(token, req, step);
        self.apply();
    }

    /// Turns a family's step into action: an answer, a parked wait, or a spawn followed
    /// by the family's tail (which yields the next step).
    fn settle(&mut self, token: Token, req: Option<ReqNo>, step: Result<Step, RpcError>) {
        match step {
            Ok(Step::Launch(mut launch)) => {
                // The door it came through, for the audit (a shell restarted by the daemon
                // keeps its default).
                // And what its peer descends from bounds its sandbox (PROTOCOL 16).
                if let Some(c) = self.clients.get(&token) {
                    if launch.via == crate::core::vocab::Via::Rpc {
                        launch.via = c.via();
                    }
                    launch.ceiling = self.core.ceiling_of(&c.tie, launch.ceiling.take());
                }
                match self.core.gate(launch, conn_id(token), req) {
                    Gated::Admitted(launch) => self.start(token, req, launch),
                    Gated::Refused(e) => self.answer(token, req, Err(e)),
                    // Answered once an approver decides; a person at the terminal is told
                    // it waits.
                    Gated::Asked => {
                        if let Some(req) =
                            req.filter(|_| self.clients.get(&token).is_some_and(Conn::is_ws))
                        {
                            self.core.people_asked(conn_id(token), req);
                        }
                    }
                }
            }
            Ok(Step::Park { wait, deadline }) => {
                // A notification is carried out and never answered, so never waits.
                if let Some(req) = req {
                    // A request that streams follows its command's lines meanwhile.
                    let streams = self.clients.get(&token).is_some_and(|c| c.streams(req));
                    if let (true, Wait::Shell { session, seq, .. }) = (streams, &wait) {
                        self.core.follow(conn_id(token), req, session, *seq);
                    }
                    self.core.park(conn_id(token), req, wait, deadline);
                }
            }
            Ok(Step::Done(v)) => self.answer(token, req, Ok(v)),
            Ok(Step::Upgrade(binary)) => {
                let Some(peer) = self.clients.get(&token).map(|c| c.peer) else {
                    return;
                };
                let asker = upgrade::Asker::Peer(crate::core::table::Peer {
                    uid: peer.uid,
                    gid: peer.gid,
                    pid: peer.pid,
                });
                self.begin_upgrade(req.map(|r| (token, r)), binary, asker)
            }
            Err(e) => self.answer(token, req, Err(e)),
        }
    }

    /// Starts an admitted command: its child is cloned, and the launch is finished in
    /// `on_spawn_report` when the child has exec'd or failed; one that cannot even be
    /// cloned settles the request at once. A line for a shell session starts no process:
    /// its family types it into the session's shell (`methods::shell`), which may need
    /// starting first.
    fn start(&mut self, token: Token, req: Option<ReqNo>, mut launch: Box<LaunchRequest>) {
        if matches!(launch.after, After::ShellLine(_)) {
            let step = dispatch::shell::line_admitted(&mut self.core, &launch);
            self.settle(token, req, step);
            return;
        }
        let origin = launch.origin.clone().unwrap_or_else(|| {
            self.clients
                .get(&token)
                .map(|c| crate::core::launch::Origin {
                    over_tcp: c.is_tcp(),
                    groups: c.groups.clone(),
                })
                .unwrap_or_default()
        });
        // Kept with the request: a shell session starts its later shells as it did this one.
        launch.origin = Some(origin.clone());
        let (core, registry, next) = (&mut self.core, self.poll.registry(), &mut self.next_token);
        match self
            .children
            .launch(core, registry, next, launch, origin, token, req)
        {
            Ok(()) => {
                if let Some(c) = self.clients.get_mut(&token) {
                    c.launching += 1;
                }
            }
            Err((launch, e)) => {
                let next = dispatch::after_launch(&mut self.core, &launch, Err(e));
                self.settle(token, req, next);
            }
        }
    }

    /// A spawn's report pipe is readable: the command is recorded (or its failure known),
    /// and its request goes on with the family's tail.
    fn on_spawn_report(&mut self, token: Token) {
        let (core, clients) = (&mut self.core, &mut self.clients);
        let registry = self.poll.registry();
        let next = &mut self.next_token;
        let Some(l) = self
            .children
            .spawn_reported(core, clients, registry, next, token)
        else {
            return;
        };
        if let Some(c) = self.clients.get_mut(&l.token) {
            c.launching = c.launching.saturating_sub(1);
            if c.launching == 0 && c.read_pending {
                self.clients.dirty.push(l.token); // its next requests are read again
            }
        }
        let step = dispatch::after_launch(&mut self.core, &l.launch, l.started);
        self.settle(l.token, l.req, step);
        self.apply();
    }

    fn answer(&mut self, token: Token, req: Option<ReqNo>, result: Result<Value, RpcError>) {
        if let (Some(req), true) = (req, self.clients.get(&token).is_some_and(Conn::is_ws)) {
            return self.ws_answered(token, req, &result);
        }
        self.clients.answer(&mut self.core, token, req, result);
    }

    /// Answers parked request `req` as `wait` says: rendered now if the connection has
    /// room, else once it has (`render_deferred`), so that however many answers a
    /// pipelining client has coming, the daemon holds at most its buffer plus one answer
    /// in bytes for it (PROTOCOL 8). Answers keep their order.
    fn answer_parked(&mut self, token: Token, req: ReqNo, wait: Wait) {
        let Some(c) = self.clients.get_mut(&token) else {
            return;
        };
        // A shell session's answer is rendered at once, room or not: it reads the
        // session's console, whose records later lines push out and whose session may
        // close, so no reference could keep it (it is bounded by `truncate`). Over
        // JSON-RPC answers go by id, and HTTP keeps its own order, so it may pass the
        // ones deferred before it.
        if let Some(key) = wait.key() {
            if !c.has_room() || !c.deferred.is_empty() {
                self.core.hold(key);
                c.deferred.push_back((req, wait));
                return;
            }
        }
        // A request that streams gets the lines it has not had, then its result.
        if let Some(data) = self.core.follow_end(conn_id(token), req) {
            if let Some(c) = self.clients.get_mut(&token) {
                c.event(req, "output", &data);
            }
        }
        let result = dispatch::answer(&self.core, &wait);
        self.answer(token, Some(req), result);
    }

    /// Renders the answers that waited for room on `token`'s connection while it has room.
    fn render_deferred(&mut self, token: Token) {
        loop {
            let Some(c) = self.clients.get_mut(&token) else {
                return;
            };
            if !c.has_room() || c.broken {
                return;
            }
            let Some((req, wait)) = c.deferred.pop_front() else {
                return;
            };
            let result = dispatch::answer(&self.core, &wait);
            if let Some(key) = wait.key() {
                self.core.let_go(key);
            }
            self.answer(token, Some(req), result);
        }
    }

    /// Carries out the core's effects, then lets it forget what is done with.
    fn apply(&mut self) {
        while !self.core.out.is_empty() {
            for effect in std::mem::take(&mut self.core.out) {
                match effect {
                    Effect::Reply { conn, req, result } => {
                        self.answer(token_of(conn), Some(req), result)
                    }
                    Effect::Answer { conn, req, wait } => {
                        self.answer_parked(token_of(conn), req, wait)
                    }
                    Effect::End { key, id, stage } => {
                        self.children.end(&self.core, key, &id, stage)
                    }
                    Effect::Signal { key, sig } => {
                        if self.children.contain.signal(key, sig) {
                            self.children.signalled();
                        }
                    }
                    Effect::ClosePipes(key) => self.children.close_pipes(self.poll.registry(), key),
                    Effect::FlushStdin(key) => {
                        let registry = self.poll.registry();
                        // Room made answers a waiting write before the rest of the batch.
                        if self.children.flush_stdin(&mut self.core, registry, key) {
                            self.apply();
                        }
                    }
                    Effect::CloseStdin(key) => self.children.close_stdin(self.poll.registry(), key),
                    Effect::FlushCommands(key) => {
                        let registry = self.poll.registry();
                        self.children.flush_commands(&mut self.core, registry, key);
                    }
                    Effect::Interrupt { key, spared } => {
                        self.children.interrupt(&mut self.core, key, spared)
                    }
                    Effect::DiscardInput(key) => self.children.discard_input(key),
                    Effect::ShellDir { key, logical } => {
                        self.children.shell_dir(&mut self.core, key, logical)
                    }
                    Effect::Spawn(launch) => self.start(NOBODY, None, launch),
                    Effect::Pump(key) => self.children.pump(&mut self.core, &mut self.clients, key),
                    Effect::Resize { key, size } => self.children.resize(key, size),
                    Effect::Send { conn, line } => self.clients.send(conn, &line),
                    Effect::ApprovalPending { conn, req, params } => {
                        self.clients.approval_pending(conn, req, params)
                    }
                    Effect::Launch { conn, req, launch } => self.start(token_of(conn), req, launch),
                    Effect::Show { session, text } => self.show(&session, &text),
                    Effect::Line {
                        conn,
                        session,
                        line,
                    } => self.ws_line(token_of(conn), &session, line),
                    Effect::Unwatch { conn, code, reason } => self.unwatch(conn, code, &reason),
                    Effect::Event {
                        conn,
                        req,
                        name,
                        data,
                    } => {
                        if let Some(c) = self.clients.get_mut(&token_of(conn)) {
                            c.event(req, name, &data);
                            self.clients.dirty.push(token_of(conn));
                        }
                    }
                }
            }
        }
        self.core.sweep();
        // Give the heap back once much output memory was freed since it last was.
        let held = self.core.table.memory.total;
        self.memory_peak = self.memory_peak.max(held);
        if self.memory_peak - held >= TRIM_AFTER {
            crate::sys::host::trim_heap();
            self.memory_peak = held;
        }
    }

    /// Writes what each connection touched this turn is owed, then closes the finished
    /// ones. While a connection has room, what waited for room goes on: lagging
    /// subscribers resume and requests held back by back-pressure are read, and what they
    /// queue is written too, until the socket is full (WRITABLE brings us back) or nothing
    /// more is owed. A connection still busy after a few rounds gets the next turn.
    fn flush_dirty(&mut self) {
        const ROUNDS: usize = 8;
        self.ws_frames();
        // A connection is marked once per message queued to it; flush it once.
        let mut dirty = std::mem::take(&mut self.clients.dirty);
        dirty.sort_unstable_by_key(|t| t.0);
        dirty.dedup();
        for token in dirty {
            for round in 0.. {
                // What the last round read and answered may have logged: out first.
                if round > 0 {
                    self.write_log();
                }
                let Some(conn) = self.clients.get_mut(&token) else {
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
                let (core, clients) = (&mut self.core, &mut self.clients);
                self.children.on_room(core, clients, conn_id(token));
                self.render_deferred(token);
                if held_back {
                    self.read_requests(token);
                }
                let Some(conn) = self.clients.get(&token) else {
                    break;
                };
                if conn.pending_out() == owed {
                    break; // nothing new to write
                }
                if round == ROUNDS {
                    self.clients.dirty.push(token);
                    break;
                }
            }
            let Some(conn) = self.clients.get_mut(&token) else {
                continue;
            };
            // An approver that stops reading is asked nothing until it drains.
            self.core
                .approvals
                .set_listening(conn_id(token), conn.has_room());
            if conn.finished() {
                self.clients
                    .close(token, self.poll.registry(), &mut self.core);
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

    /// Closes TCP connections idle for `--http-idle`, and looks again later while any
    /// are open.
    fn close_idle_tcp(&mut self) {
        let now = self.core.now;
        self.tcp_sweep_armed = self.clients.close_idle_tcp(now, self.core.cfg.http_idle);
        if self.tcp_sweep_armed {
            self.timers
                .add(now + self.tcp_sweep_every(), LoopTimer::TcpIdleSweep);
        }
    }

    // ---- processes and signals -----------------------------------------------------------

    fn on_signals(&mut self) {
        let mut term = false;
        let pending: Vec<Origin> = self.signals.pending().collect();
        for origin in pending {
            match origin.signal {
                SIGTERM | SIGINT => term = true,
                // Reopens the audit file and reloads the policy; a closing terminal's HUP
                // never kills the daemon (and with it every command).
                SIGHUP if self.sender_may_operate(&origin, "SIGHUP") => self.reopen(),
                // An upgrade in place into the binary the daemon was started as.
                SIGUSR2 if self.sender_may_operate(&origin, "SIGUSR2") => {
                    let from = origin.process.map(|p| (p.pid, p.uid));
                    self.begin_upgrade(None, None, upgrade::Asker::Signal(from))
                }
                _ => {}
            }
        }
        if term {
            self.begin_shutdown();
        }
    }

    /// Whether the sender of `origin` (`signal`, SIGHUP or SIGUSR2) may have it acted on:
    /// only a `kill` or `tgkill` (whose sender pid the kernel fills in and no process can
    /// forge), from a sender that does not descend from the daemon (7.3) and can be shown
    /// not to (it is not gone already); and a SIGHUP the kernel sent (a terminal's
    /// hang-up). A queued signal (its pid written by the sender), one raised by I/O on a
    /// descriptor (`F_SETOWN`), or one whose cause is unknown is never acted on. A refused
    /// one is logged and audited as `refuse {signal, pid}`.
    fn sender_may_operate(&mut self, origin: &Origin, signal: &str) -> bool {
        use signal_hook::low_level::siginfo::{Cause, Sent};
        let sender = match (origin.cause, origin.process) {
            (Cause::Sent(Sent::User | Sent::TKill), Some(sender)) => sender,
            (Cause::Kernel, _) if signal == "SIGHUP" => return true,
            (cause, process) => {
                let pid = process.map(|p| p.pid);
                self.core.log.refusal(
                    "subject signal",
                    self.core.now,
                    format_args!(
                        "{signal} ignored: not sent by kill ({cause:?}, pid {pid:?}), so who \
                         sent it cannot be told"
                    ),
                );
                self.core.record(
                    "refuse",
                    None,
                    serde_json::json!({ "signal": signal, "pid": pid,
                                        "why": "not sent by kill", "cause": format!("{cause:?}") }),
                );
                return false;
            }
        };
        let tie = self.children.tie_of_sender(&self.core, sender.pid);
        if !tie.descends {
            return true;
        }
        let said = tie.describe();
        self.core.log.refusal(
            "subject signal",
            self.core.now,
            format_args!(
                "{signal} from pid {} (uid {}) ignored: the sender descends from the daemon \
                 ({said}), and what execd runs never reloads or upgrades it",
                sender.pid, sender.uid
            ),
        );
        self.core.record(
            "refuse",
            None,
            serde_json::json!({ "signal": signal, "pid": sender.pid, "uid": sender.uid,
                                "why": "descends from the daemon", "tie": said }),
        );
        false
    }

    /// Reaps every exited child, carrying out what each exit leaves to do.
    fn reap_all(&mut self) {
        loop {
            let (core, clients) = (&mut self.core, &mut self.clients);
            match self.children.reap_one(core, clients, self.poll.registry()) {
                ReapOutcome::Command => self.apply(),
                ReapOutcome::Other => {}
                ReapOutcome::Nothing => return,
            }
        }
    }

    fn fire_timers(&mut self) {
        self.core.tick(Instant::now(), SystemTime::now());
        self.core.fire_due();
        while let Some(t) = self.timers.pop_due(Instant::now()) {
            match t {
                LoopTimer::AcceptResume => {
                    self.accept_paused = false;
                    for t in self.listeners.tokens() {
                        self.accept(t);
                    }
                }
                LoopTimer::ShutdownDeadline => {
                    // The grace is over: end whatever is left, and stop waiting for it once
                    // the last cookie sweep ended (`shutdown_done`), or `FINAL_SWEEP` on.
                    self.children.contain.kill_all();
                    let until = Instant::now() + FINAL_SWEEP;
                    self.final_sweep_until = Some(until);
                    self.timers.add(until, LoopTimer::ShutdownRecheck);
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
                LoopTimer::InputCheck => {
                    self.input_check_armed = false;
                    self.children.look_for_input_waits(&mut self.core);
                }
                LoopTimer::UpgradeProbe => self.probe_timed_out(),
                LoopTimer::UpgradeDrain => self.drain_timed_out(),
                LoopTimer::WsPing => self.ws_ping(),
                LoopTimer::WsFrames => {
                    self.ws_frames_armed = false;
                    self.ws_frames();
                }
                LoopTimer::CookieWait(token) => {
                    if let Some(c) = self.clients.get_mut(&token) {
                        if c.cookie_wait.take().is_some() {
                            self.clients.dirty.push(token);
                        }
                    }
                }
            }
        }
    }

    /// Cookie reads answered for connections waiting on them (PROTOCOL 7.3): a cookie of
    /// this instance, with its command's tag, ties a descendant that its cgroup and
    /// ancestry tied to no command to that command; either way its requests are taken
    /// from now on. An answer for a connection that stopped waiting (gone, or its wait
    /// was up) is dropped.
    fn peer_cookies_read(&mut self) {
        for (token, pid, start, read) in self.children.take_peer_cookies() {
            let command = self.children.cookie_tie(&self.core, &read);
            let Some(c) = self.clients.get_mut(&token) else {
                continue;
            };
            if c.peer.pid != pid || c.cookie_wait != Some(start) {
                continue;
            }
            c.cookie_wait = None;
            if let Some(k) = command {
                c.tie = Tie::descendant(Some(k), TieSource::Cookie);
            }
            self.clients.dirty.push(token);
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
        self.stop_upgrade("the daemon is stopping");
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
        for (token, req) in self.children.give_up_spawns(self.poll.registry()) {
            self.answer(token, req, Err(RpcError::shutting_down()));
        }
        self.apply();
        self.clients.mark_all();
        self.write_log();
        self.flush_dirty();
    }

    fn shutdown_done(&mut self) -> bool {
        match self.shutdown {
            None => false,
            Some(Shutdown::Killing) if self.final_sweep_until.is_some() => {
                let sweeping = self.children.contain.sweeping();
                if sweeping && self.final_sweep_until.is_some_and(|t| Instant::now() < t) {
                    return false;
                }
                if sweeping {
                    self.core.log.line(format_args!(
                        "stopping without the end of the last cookie sweep ({} s past the \
                         grace): what it did not reach is swept at the next start",
                        FINAL_SWEEP.as_secs()
                    ));
                }
                self.finish_shutdown();
                self.shutdown_done()
            }
            Some(Shutdown::Killing) => {
                // Every killed command was reaped: what their trees still hold goes now
                // (the leaders had their grace), with one sweep of every command's
                // cookie, and the daemon finishes once it is gone. Spawns still on their
                // way are waited for: they end with the rest.
                if self.core.table.running() == 0 && self.children.spawning() == 0 {
                    self.children.contain.kill_all();
                    if self.children.contain.any_left() {
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
                    .clients
                    .values()
                    .any(|c| c.pending_out() > 0 && !c.broken);
                !(pending && Instant::now() < until)
            }
        }
    }
}
