//! The event loop. One `Server` owns the `Poll`, the listener, every connection, every child
//! pipe, the signal source, the process table and the timers; nothing else touches them.
//!
//! Each turn: poll (timeout = earliest timer), service what is ready (accept, read requests,
//! read pipes, write stdin, reap on SIGCHLD), fire due timers, then flush every connection
//! that got output and close the finished ones. Method handlers (`acp`, `bash`, `events`)
//! run inside that turn and either answer at once or park the request; parked requests are
//! answered when the process they watch changes or their deadline passes.
//!
//! Invariants:
//! - No call here blocks on a peer: sockets and pipes are non-blocking, children are reaped
//!   with `WNOHANG`, and a source that errors closes alone.
//! - An event for a token no longer held is ignored.
//! - A process's exit is published only after its pipes were drained of what they held.

use std::collections::HashMap;
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use mio::net::UnixListener;
use mio::unix::SourceFd;
use mio::{Events, Interest, Poll, Token};
use serde_json::{json, Map, Value};
use signal_hook::consts::{SIGCHLD, SIGHUP, SIGINT, SIGTERM};
use signal_hook_mio::v1_0::Signals;

use crate::config::Config;
use crate::conn::{Conn, Fill};
use crate::process::{self, PeerCred};
use crate::rpc::{self, Frame, Message, Parsed, Request, RpcError};
use crate::table::{Exit, Family, Key, KillReason, Table};
use crate::timers::{TimerId, Timers};
use crate::{acp, bash, events};

/// Signals the loop handles; every other one keeps its default.
const HANDLED_SIGNALS: [i32; 4] = [SIGCHLD, SIGTERM, SIGINT, SIGHUP];

const LISTENER: Token = Token(0);
const SIGNALS: Token = Token(1);
const FIRST_DYNAMIC: usize = 2;

/// Size of the buffer pipes and sockets are read into.
const SCRATCH: usize = 256 << 10;
/// Bytes read from one pipe per turn before other sources get a go.
const PIPE_BYTES_PER_TURN: usize = 4 << 20;
/// Bytes read from each pipe when its command exits: more than a full pipe holds (execd
/// grows pipes to at most 1 MiB), and bounded even if a descendant keeps writing.
const EXIT_DRAIN_BYTES: usize = 2 << 20;
/// Smallest read from a watched pipe, so a tiny ring cannot turn reading into a busy loop
/// of one-byte reads (a ring that small loses bytes to a fast writer either way).
const MIN_WATCHED_READ: usize = 64 << 10;
/// A pipe's default capacity on Linux; a read this large means the pipe was full.
const DEFAULT_PIPE_SIZE: usize = 64 << 10;
/// Pause before accepting again after running out of descriptors.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);
/// Requests one connection may have waiting (parked, or open batches) before further
/// requests on it are refused with -32003: waits cost memory and timers, not output, so
/// back-pressure on the outgoing buffer does not bound them.
pub const MAX_WAITING_PER_CONN: usize = 4096;
/// How long shutdown waits for answers to drain to clients after the last command ended.
const SHUTDOWN_FLUSH: Duration = Duration::from_millis(500);

/// What a dynamic token stands for, besides connections.
#[derive(Debug, Clone, Copy)]
pub enum Source {
    Pipe { key: Key, stream: usize },
    Stdin { key: Key },
}

/// Everything the loop waits for in time.
#[derive(Debug)]
pub enum Timer {
    /// SIGKILL the group if the leader outlived `--kill-grace`.
    KillEscalate {
        key: Key,
        pgid: i32,
    },
    /// SIGKILL what is left of a released command's group.
    GroupKill {
        pgid: i32,
    },
    /// A parked request's deadline (soft timeout, `wait_timeout`, kill answer).
    Deadline {
        park: u64,
    },
    /// A bash command's `hard_timeout`.
    HardTimeout {
        key: Key,
    },
    /// Check a bash session for idleness.
    SessionIdle {
        session: String,
    },
    AcceptResume,
    ShutdownDeadline,
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
}

impl Wait {
    fn key(&self) -> Key {
        match self {
            Wait::Exit(k) | Wait::Killed(k) | Wait::BashKill(k) => *k,
            Wait::BashExec { key, .. } | Wait::BashOutput { key, .. } => *key,
        }
    }
}

/// A handler's answer: now, or later.
pub enum Outcome {
    Done(Result<Value, RpcError>),
    Park {
        wait: Wait,
        deadline: Option<Instant>,
    },
}

impl From<Result<Value, RpcError>> for Outcome {
    fn from(r: Result<Value, RpcError>) -> Outcome {
        Outcome::Done(r)
    }
}

/// Where an answer goes.
#[derive(Debug, Clone)]
enum Reply {
    Single(Value),
    Batch { batch: u64, slot: usize, id: Value },
}

#[derive(Debug)]
struct Parked {
    conn: Token,
    reply: Reply,
    wait: Wait,
    timer: Option<TimerId>,
}

#[derive(Debug)]
struct Batch {
    conn: Token,
    slots: Vec<Option<Vec<u8>>>,
    pending: usize,
    /// Bytes of the answers gathered so far.
    bytes: usize,
    /// Still being dispatched: completion waits until every element was seen.
    open: bool,
}

/// Who is calling.
#[derive(Debug, Clone, Copy)]
pub struct Caller {
    pub conn: Token,
    pub uid: u32,
}

struct Shutdown {
    /// When every command is gone (or the deadline passed), the time to stop flushing.
    flush_until: Option<Instant>,
}

/// The daemon.
pub struct Server {
    pub cfg: Config,
    poll: Poll,
    listener: Option<UnixListener>,
    socket_file: Option<PathBuf>,
    signals: Signals,
    pub conns: HashMap<Token, Conn>,
    pub sources: HashMap<Token, Source>,
    next_token: usize,
    pub table: Table,
    pub timers: Timers<Timer>,
    parked: HashMap<u64, Parked>,
    next_park: u64,
    batches: HashMap<u64, Batch>,
    next_batch: u64,
    pub now: Instant,
    pub started: Instant,
    scratch: Vec<u8>,
    /// Connections with output queued this turn.
    dirty: Vec<Token>,
    /// Processes whose subscribers get events once the current response is queued.
    deferred_pumps: Vec<Key>,
    /// Pipes left readable after their per-turn budget.
    hot: Vec<(Key, usize)>,
    shutdown: Option<Shutdown>,
    accept_paused: bool,
    pub uid: u32,
    spawner: process::Spawner,
    /// `--run-as`, resolved at startup.
    run_as: Option<process::Identity>,
    /// Groups of released, exited commands that got SIGTERM and await their SIGKILL.
    lingering: Vec<i32>,
}

/// Binds the socket as section 1 says: refuse beside a live daemon, replace a stale file.
fn bind(cfg: &Config) -> io::Result<UnixListener> {
    let path = &cfg.socket;
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        use std::os::unix::fs::FileTypeExt;
        if !meta.file_type().is_socket() {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                format!(
                    "{} exists and is not a socket; not replacing it",
                    path.display()
                ),
            ));
        }
        if std::os::unix::net::UnixStream::connect(path).is_ok() {
            return Err(io::Error::new(
                io::ErrorKind::AddrInUse,
                format!("another execd is listening on {}", path.display()),
            ));
        }
        std::fs::remove_file(path)?;
    }
    if let Some(dir) = path.parent() {
        if !dir.as_os_str().is_empty() && !dir.is_dir() {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("directory {} does not exist", dir.display()),
            ));
        }
    }
    let listener = UnixListener::bind(path)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(cfg.socket_mode))?;
    if let Some(gid) = cfg.socket_group {
        process::chown_group(path, gid)?;
    }
    Ok(listener)
}

/// Logs one line to stderr, as one write (stderr is unbuffered: written piecemeal, a
/// line would cost a system call per fragment and could interleave with other writers).
pub fn log(line: std::fmt::Arguments) {
    let text = format!("execd: {line}\n");
    let _ = io::stderr().lock().write_all(text.as_bytes());
}

impl Server {
    /// Binds (or takes the systemd socket), installs signals and becomes subreaper.
    pub fn new(mut cfg: Config) -> io::Result<Server> {
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
            Some(user) => Some(process::Identity::of_user(user)?),
            None => None,
        };
        // After the signal handlers are in place: they are what children must reset.
        let spawner = process::Spawner::new(cfg.clean_env, &cfg.rlimits, process::raise_nofile())?;
        // Last, so a refusal above leaves no socket file behind.
        let (mut listener, socket_file) = match process::systemd_listener(
            std::env::var_os("LISTEN_PID"),
            std::env::var_os("LISTEN_FDS"),
        ) {
            Some(std_listener) => {
                std_listener.set_nonblocking(true)?;
                // Report the socket systemd bound, not the path flags would have chosen.
                if let Some(path) = std_listener.local_addr()?.as_pathname() {
                    cfg.socket = path.to_path_buf();
                }
                (UnixListener::from_std(std_listener), None)
            }
            None => (bind(&cfg)?, Some(cfg.socket.clone())),
        };
        if let Err(e) = poll
            .registry()
            .register(&mut listener, LISTENER, Interest::READABLE)
        {
            if let Some(path) = &socket_file {
                let _ = std::fs::remove_file(path);
            }
            return Err(e);
        }
        let now = Instant::now();
        Ok(Server {
            cfg,
            poll,
            listener: Some(listener),
            socket_file,
            signals,
            conns: HashMap::new(),
            sources: HashMap::new(),
            next_token: FIRST_DYNAMIC,
            table: Table::default(),
            timers: Timers::default(),
            parked: HashMap::new(),
            next_park: 0,
            batches: HashMap::new(),
            next_batch: 0,
            now,
            started: now,
            scratch: vec![0; SCRATCH],
            dirty: Vec::new(),
            deferred_pumps: Vec::new(),
            hot: Vec::new(),
            shutdown: None,
            accept_paused: false,
            uid: process::current_uid(),
            spawner,
            run_as,
            lingering: Vec::new(),
        })
    }

    /// Runs until shutdown completes.
    pub fn run(mut self) -> io::Result<()> {
        log(format_args!(
            "listening on {}{} (pid {})",
            self.cfg.socket.display(),
            if self.socket_file.is_none() {
                ", passed by systemd"
            } else {
                ""
            },
            std::process::id()
        ));
        let mut events = Events::with_capacity(1024);
        loop {
            // Work left from this turn (pipes still readable, answers queued while
            // flushing) means polling without sleeping.
            let timeout = if self.hot.is_empty() && self.dirty.is_empty() {
                self.timers
                    .next_deadline()
                    .map(|d| d.saturating_duration_since(Instant::now()))
            } else {
                Some(Duration::ZERO)
            };
            if let Err(e) = self.poll.poll(&mut events, timeout) {
                if e.kind() != io::ErrorKind::Interrupted {
                    return Err(e);
                }
            }
            self.now = Instant::now();
            for ev in events.iter() {
                match ev.token() {
                    LISTENER => self.accept_all(),
                    SIGNALS => self.on_signals(),
                    t => self.on_ready(t, ev.is_readable() || ev.is_read_closed()),
                }
            }
            self.service_hot();
            self.fire_timers();
            self.flush_dirty();
            if self.shutdown_done() {
                break;
            }
        }
        self.remove_socket_file();
        log(format_args!("stopped"));
        Ok(())
    }

    fn token(&mut self) -> Token {
        let t = Token(self.next_token);
        self.next_token += 1;
        t
    }

    // ---- connections -------------------------------------------------------------

    fn peer_allowed(&self, peer: &PeerCred) -> bool {
        peer.uid == self.uid
            || peer.uid == 0
            || self.cfg.allow_uids.contains(&peer.uid)
            || self.cfg.allow_gids.contains(&peer.gid)
    }

    fn accept_all(&mut self) {
        if self.accept_paused || self.shutdown.is_some() {
            return;
        }
        loop {
            let Some(listener) = &self.listener else {
                return;
            };
            let (mut stream, _) = match listener.accept() {
                Ok(s) => s,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    // EMFILE, ENFILE, ENOBUFS...: stop accepting for a moment instead of
                    // spinning on a listener that stays readable.
                    log(format_args!("accept failed: {e}; pausing accepts"));
                    self.accept_paused = true;
                    self.timers
                        .add(self.now + ACCEPT_BACKOFF, Timer::AcceptResume);
                    return;
                }
            };
            let peer = match process::peer_cred(stream.as_raw_fd()) {
                Ok(p) => p,
                Err(e) => {
                    log(format_args!(
                        "refused a connection: no peer credentials: {e}"
                    ));
                    continue;
                }
            };
            if !self.peer_allowed(&peer) {
                log(format_args!(
                    "refused connection from uid {} gid {} pid {}",
                    peer.uid, peer.gid, peer.pid
                ));
                continue;
            }
            if self.conns.len() >= self.cfg.max_clients {
                let line = rpc::encode_response(
                    &Value::Null,
                    &Err(RpcError::limit("max-clients", self.cfg.max_clients)),
                );
                let _ = stream.write(&line);
                log(format_args!(
                    "refused connection from uid {} pid {}: max-clients ({}) reached",
                    peer.uid, peer.pid, self.cfg.max_clients
                ));
                continue;
            }
            let token = self.token();
            let mut conn = Conn::new(
                stream,
                token,
                peer,
                self.cfg.max_message,
                self.cfg.client_buffer,
            );
            // A root daemon runs a non-root peer's commands as that peer (or --run-as).
            // Looked up once here: user databases can be slow, and this is per connection.
            if self.uid == 0 && peer.uid != 0 {
                conn.run_as = Some(match &self.run_as {
                    Some(id) => id.clone(),
                    None => process::Identity::of_peer(peer.uid, peer.gid),
                });
            }
            if conn.register(self.poll.registry()).is_err() {
                continue;
            }
            self.conns.insert(token, conn);
        }
    }

    /// A source is ready. For a connection, writing (and resuming what waited for room)
    /// happens in `flush_dirty`, so only readability matters here.
    fn on_ready(&mut self, token: Token, readable: bool) {
        if self.conns.contains_key(&token) {
            if readable {
                self.read_requests(token);
            }
            self.dirty.push(token);
            return;
        }
        match self.sources.get(&token).copied() {
            Some(Source::Pipe { key, stream }) => {
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
            if conn.broken {
                break;
            }
            if !conn.has_room() {
                // Answers are not being read: take no more requests until they drain.
                conn.read_pending = true;
                break;
            }
            conn.read_pending = false;
            // After EOF, requests already buffered are still handled.
            let fill = if conn.eof {
                Fill::Eof
            } else {
                conn.fill(&mut scratch[..64 << 10])
            };
            self.handle_frames(token);
            if fill != Fill::More {
                break;
            }
        }
        self.scratch = scratch;
    }

    fn handle_frames(&mut self, token: Token) {
        loop {
            let Some(conn) = self.conns.get_mut(&token) else {
                return;
            };
            if !conn.has_room() {
                // Answers are not being read: stop taking requests until they drain.
                conn.read_pending = true;
                return;
            }
            let Some(frame) = conn.next_frame() else {
                return;
            };
            match frame {
                Frame::TooLong => {
                    let err = RpcError::too_long(self.cfg.max_message);
                    self.send(token, &Reply::Single(Value::Null), Err(err));
                }
                Frame::Line(line) => self.handle_line(token, &line),
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
                let held_back = conn.read_pending;
                events::on_room(self, token);
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
            if conn.finished() {
                self.close_conn(token);
            } else {
                conn.update_interest(self.poll.registry());
            }
        }
    }

    fn close_conn(&mut self, token: Token) {
        let Some(mut conn) = self.conns.remove(&token) else {
            return;
        };
        conn.deregister(self.poll.registry());
        // Its parked requests have nobody to answer; the processes go on.
        let gone: Vec<u64> = self
            .parked
            .iter()
            .filter(|(_, p)| p.conn == token)
            .map(|(id, _)| *id)
            .collect();
        for id in gone {
            self.unpark(id);
        }
        self.batches.retain(|_, b| b.conn != token);
        let subs = std::mem::take(&mut conn.subs);
        events::drop_conn(self, token, subs);
    }

    /// Queues bytes for a connection and marks it for flushing.
    pub fn queue(&mut self, token: Token, bytes: &[u8]) {
        if let Some(c) = self.conns.get_mut(&token) {
            c.queue(bytes);
            self.dirty.push(token);
        }
    }

    /// Pumps `key`'s subscribers after the response being built is queued.
    pub fn defer_pump(&mut self, key: Key) {
        self.deferred_pumps.push(key);
    }

    /// Marks a connection for flushing after an in-place write.
    pub fn mark_dirty(&mut self, token: Token) {
        self.dirty.push(token);
    }

    // ---- requests ----------------------------------------------------------------

    fn handle_line(&mut self, token: Token, line: &[u8]) {
        match rpc::parse_line(line) {
            Parsed::Error(e) => self.send(token, &Reply::Single(Value::Null), Err(e)),
            Parsed::Single(msg) => self.handle_message(token, msg, None),
            Parsed::Batch(msgs) => {
                let id = self.next_batch;
                self.next_batch += 1;
                if let Some(c) = self.conns.get_mut(&token) {
                    c.waiting += 1;
                }
                self.batches.insert(
                    id,
                    Batch {
                        conn: token,
                        slots: Vec::new(),
                        pending: 0,
                        bytes: 0,
                        open: true,
                    },
                );
                for msg in msgs {
                    if self.batch_full(id, token) {
                        // The answers so far already fill what this client may be owed.
                        self.refuse(token, msg, id, self.cfg.client_buffer);
                        continue;
                    }
                    self.handle_message(token, msg, Some(id));
                }
                if let Some(b) = self.batches.get_mut(&id) {
                    b.open = false;
                }
                self.finish_batch(id);
            }
        }
    }

    /// Whether a batch's answers plus what its connection already owes reach the cap.
    fn batch_full(&self, batch: u64, token: Token) -> bool {
        let owed = self.conns.get(&token).map_or(0, |c| c.pending_out());
        self.batches
            .get(&batch)
            .is_some_and(|b| b.bytes + owed >= self.cfg.client_buffer)
    }

    /// Answers a batch element with -32003 without carrying it out.
    fn refuse(&mut self, token: Token, msg: Message, batch: u64, cap: usize) {
        let id = match msg {
            Message::Request(Request { id: Some(id), .. }) | Message::Invalid { id, .. } => id,
            _ => return, // notifications and responses are never answered
        };
        let target = self.reply_target(id, Some(batch));
        self.send(token, &target, Err(RpcError::limit("client-buffer", cap)));
    }

    fn reply_target(&mut self, id: Value, batch: Option<u64>) -> Reply {
        match batch.and_then(|b| self.batches.get_mut(&b).map(|s| (b, s))) {
            Some((b, state)) => {
                state.slots.push(None);
                state.pending += 1;
                Reply::Batch {
                    batch: b,
                    slot: state.slots.len() - 1,
                    id,
                }
            }
            None => Reply::Single(id),
        }
    }

    fn handle_message(&mut self, token: Token, msg: Message, batch: Option<u64>) {
        match msg {
            Message::Invalid { id, error } => {
                let target = self.reply_target(id, batch);
                self.send(token, &target, Err(error));
            }
            // No request from execd to clients is outstanding yet: nothing to match.
            Message::Response { .. } => {}
            Message::Request(req) => {
                let Some(conn) = self.conns.get(&token) else {
                    return;
                };
                let caller = Caller {
                    conn: token,
                    uid: conn.peer.uid,
                };
                // Only a request can wait; notifications are never parked.
                if conn.waiting >= MAX_WAITING_PER_CONN && req.id.is_some() {
                    let target = self.reply_target(req.id.unwrap_or_default(), batch);
                    let err = RpcError::limit("waiting-requests", MAX_WAITING_PER_CONN);
                    self.send(token, &target, Err(err));
                    return;
                }
                let outcome = self.dispatch(&caller, &req.method, &req.params);
                // A notification is carried out and never answered.
                if let Some(id) = req.id {
                    let target = self.reply_target(id, batch);
                    match outcome {
                        Outcome::Done(result) => self.send(token, &target, result),
                        Outcome::Park { wait, deadline } => {
                            self.park(token, target, wait, deadline)
                        }
                    }
                }
                for key in std::mem::take(&mut self.deferred_pumps) {
                    events::pump(self, key);
                }
            }
        }
    }

    fn dispatch(&mut self, caller: &Caller, method: &str, params: &Map<String, Value>) -> Outcome {
        if self.shutdown.is_some() {
            return Outcome::Done(Err(RpcError::shutting_down()));
        }
        let p = rpc::Params(params);
        match method {
            "initialize" => acp::initialize(self, &p).into(),
            "terminal/create" => acp::create(self, caller, &p).into(),
            "terminal/output" => acp::output(self, caller, &p).into(),
            "terminal/wait_for_exit" => acp::wait_for_exit(self, caller, &p),
            "terminal/kill" => acp::kill(self, caller, &p),
            "terminal/release" => acp::release(self, caller, &p).into(),
            "terminal/list" => acp::list(self, caller, &p).into(),
            "bash/exec" => bash::exec(self, caller, &p),
            "bash/output" => bash::output(self, caller, &p),
            "bash/write" => bash::write(self, caller, &p).into(),
            "bash/kill" => bash::kill(self, caller, &p),
            "bash/sessions" => bash::sessions(self, caller).into(),
            "bash/commands" => bash::commands(self, caller, &p).into(),
            "bash/sessions/create" => bash::create_session(self, caller, &p).into(),
            "bash/sessions/close" => bash::close_session(self, caller, &p).into(),
            "events/subscribe" => events::subscribe(self, caller, &p).into(),
            "events/unsubscribe" => events::unsubscribe(self, caller, &p).into(),
            _ => Outcome::Done(Err(RpcError::method_not_found(method))),
        }
    }

    fn send(&mut self, token: Token, target: &Reply, result: Result<Value, RpcError>) {
        if let Err(e) = &result {
            if e.code == rpc::INTERNAL_ERROR {
                log(format_args!(
                    "internal error answered to conn {}: {}",
                    token.0, e.message
                ));
            }
        }
        match target {
            Reply::Single(id) => {
                let line = rpc::encode_response(id, &result);
                self.queue(token, &line);
            }
            Reply::Batch { batch, slot, id } => {
                let Some(b) = self.batches.get_mut(batch) else {
                    return;
                };
                let mut one = Vec::new();
                rpc::write_response(&mut one, id, &result);
                if let Some(s) = b.slots.get_mut(*slot) {
                    b.bytes += one.len();
                    *s = Some(one);
                    b.pending -= 1;
                }
                self.finish_batch(*batch);
            }
        }
    }

    fn finish_batch(&mut self, id: u64) {
        let Some(b) = self.batches.get(&id) else {
            return;
        };
        if b.open || b.pending > 0 {
            return;
        }
        let b = self.batches.remove(&id).expect("present");
        if let Some(c) = self.conns.get_mut(&b.conn) {
            c.waiting -= 1;
        }
        if b.slots.is_empty() {
            return; // only notifications
        }
        let mut line = vec![b'['];
        for (i, s) in b.slots.into_iter().enumerate() {
            if i > 0 {
                line.push(b',');
            }
            line.extend(s.unwrap_or_default());
        }
        line.extend_from_slice(b"]\n");
        self.queue(b.conn, &line);
    }

    fn park(&mut self, conn: Token, reply: Reply, wait: Wait, deadline: Option<Instant>) {
        let id = self.next_park;
        self.next_park += 1;
        let key = wait.key();
        let timer = deadline.map(|at| self.timers.add(at, Timer::Deadline { park: id }));
        if let Some(c) = self.conns.get_mut(&conn) {
            c.waiting += 1;
        }
        self.parked.insert(
            id,
            Parked {
                conn,
                reply,
                wait,
                timer,
            },
        );
        match self.table.get_mut(key) {
            Some(p) => p.waiters.push(id),
            None => {
                self.resolve(id, true);
                return;
            }
        }
        // It may already be satisfied (an exited command, output already past the offset).
        self.resolve(id, false);
    }

    /// Answers parked request `id` if its condition holds (or `expired`).
    fn resolve(&mut self, id: u64, expired: bool) {
        let Some(p) = self.parked.get(&id) else {
            return;
        };
        let key = p.wait.key();
        let result = match (self.table.get(key), &p.wait) {
            (None, _) => Some(Err(RpcError::not_found("process", "released"))),
            (Some(proc_), Wait::Exit(_)) => {
                proc_.exit.is_some().then(|| Ok(acp::exit_status(proc_)))
            }
            (Some(proc_), Wait::Killed(_)) => proc_.exit.is_some().then(|| Ok(json!({}))),
            (Some(proc_), Wait::BashExec { max_len, .. }) => {
                (expired || proc_.exit.is_some()).then(|| Ok(bash::exec_result(proc_, *max_len)))
            }
            (Some(proc_), Wait::BashOutput { from, .. }) => {
                (expired || proc_.exit.is_some() || bash::has_output_past(proc_, *from))
                    .then(|| Ok(bash::output_result(proc_, *from)))
            }
            (Some(proc_), Wait::BashKill(_)) => {
                (expired || proc_.exit.is_some()).then(|| Ok(bash::command_info(proc_)))
            }
        };
        let Some(result) = result else { return };
        if let Some(p) = self.unpark(id) {
            self.send(p.conn, &p.reply, result);
        }
    }

    /// Takes a parked request out of every index: its timer, its process's waiters, and
    /// its connection's count.
    fn unpark(&mut self, id: u64) -> Option<Parked> {
        let p = self.parked.remove(&id)?;
        if let Some(t) = p.timer {
            self.timers.cancel(t);
        }
        if let Some(proc_) = self.table.get_mut(p.wait.key()) {
            proc_.waiters.retain(|w| *w != id);
        }
        if let Some(c) = self.conns.get_mut(&p.conn) {
            c.waiting -= 1;
        }
        Some(p)
    }

    /// Re-checks every parked request on process `key`.
    fn wake(&mut self, key: Key) {
        let Some(p) = self.table.get(key) else { return };
        if p.waiters.is_empty() {
            return;
        }
        for id in p.waiters.clone() {
            self.resolve(id, false);
        }
    }

    // ---- pipes ---------------------------------------------------------------------

    /// Registers a pipe read end and returns its token.
    pub fn register_pipe(&mut self, file: &File, key: Key, stream: usize) -> io::Result<Token> {
        let token = self.token();
        self.poll.registry().register(
            &mut SourceFd(&file.as_raw_fd()),
            token,
            Interest::READABLE,
        )?;
        self.sources.insert(token, Source::Pipe { key, stream });
        Ok(token)
    }

    /// Allocates the token a stdin pipe uses when it has input waiting.
    pub fn stdin_token(&mut self, key: Key) -> Token {
        let token = self.token();
        self.sources.insert(token, Source::Stdin { key });
        token
    }

    /// Reads up to `budget` bytes from one of a process's pipes into its ring.
    ///
    /// With subscribers attached, each read is at most the ring's size (but not tiny) and
    /// they are pumped after each one, so a subscriber with room never loses bytes to the
    /// ring in between.
    /// A pipe found full is grown once, so a chatty command needs fewer wakeups while
    /// quiet ones keep the default size.
    /// `to_eof` (the drain when a command exits) reads on after a short read, to see an
    /// EOF that is already there: a stream known to have ended hands out its last
    /// incomplete character as U+FFFD instead of holding it back.
    fn read_pipe(&mut self, key: Key, stream: usize, budget: usize, to_eof: bool) {
        let mut scratch = std::mem::take(&mut self.scratch);
        let mut got = false;
        let mut eof = false;
        let mut exhausted = true;
        let mut left = budget;
        while left > 0 {
            let Some(p) = self.table.get_mut(key) else {
                exhausted = false;
                break;
            };
            let watched = !p.subs.is_empty();
            let Some(s) = p.streams.get_mut(stream) else {
                exhausted = false;
                break;
            };
            let Some(file) = s.fd.as_mut() else {
                exhausted = false;
                break;
            };
            let want = if watched {
                s.ring.capacity().clamp(MIN_WATCHED_READ, scratch.len())
            } else {
                scratch.len()
            }
            .min(left);
            match file.read(&mut scratch[..want]) {
                Ok(0) => {
                    eof = true;
                    exhausted = false;
                    break;
                }
                Ok(n) => {
                    s.ring.push(&scratch[..n]);
                    got = true;
                    left -= n;
                    if n == DEFAULT_PIPE_SIZE && !s.grown {
                        s.grown = true;
                        process::grow_pipe(file.as_raw_fd());
                    }
                    if watched {
                        events::pump(self, key);
                    }
                    if n < want && !to_eof {
                        // A short read from a pipe took all it held (under the pipe's lock),
                        // so the next write finds it empty and wakes epoll again: the read
                        // that would only say EAGAIN is not needed.
                        exhausted = false;
                        break;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    exhausted = false;
                    break;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => {
                    eof = true;
                    exhausted = false;
                    break;
                }
            }
        }
        self.scratch = scratch;
        if eof {
            self.close_stream(key, stream);
        }
        if exhausted && !self.hot.contains(&(key, stream)) {
            self.hot.push((key, stream));
        }
        if got || eof {
            events::pump(self, key);
            self.wake(key);
        }
    }

    fn service_hot(&mut self) {
        for (key, stream) in std::mem::take(&mut self.hot) {
            self.read_pipe(key, stream, PIPE_BYTES_PER_TURN, false);
        }
    }

    /// Deregisters and closes one output pipe.
    pub fn close_stream(&mut self, key: Key, stream: usize) {
        let Some(s) = self
            .table
            .get_mut(key)
            .and_then(|p| p.streams.get_mut(stream))
        else {
            return;
        };
        if let Some(file) = s.fd.take() {
            let _ = self
                .poll
                .registry()
                .deregister(&mut SourceFd(&file.as_raw_fd()));
            self.sources.remove(&s.token);
        }
        self.hot.retain(|h| *h != (key, stream));
    }

    /// Writes pending stdin as far as the pipe takes it; closes it after `eof` drains.
    pub fn flush_stdin(&mut self, key: Key) {
        let Some(proc_) = self.table.get_mut(key) else {
            return;
        };
        let Some(stdin) = proc_.stdin.as_mut() else {
            return;
        };
        let mut broken = false;
        if let Some(file) = stdin.fd.as_mut() {
            while !stdin.buf.is_empty() {
                let (a, _) = stdin.buf.as_slices();
                match file.write(a) {
                    Ok(n) => {
                        stdin.buf.drain(..n);
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(_) => {
                        // EPIPE: the command closed its stdin or exited. Not a crash: the
                        // input is counted as undelivered and reported.
                        broken = true;
                        break;
                    }
                }
            }
        }
        let registry = self.poll.registry();
        let done = broken || (stdin.buf.is_empty() && stdin.eof_requested);
        let want = !done && !stdin.buf.is_empty() && stdin.fd.is_some();
        if let Some(file) = stdin.fd.as_ref() {
            let fd = file.as_raw_fd();
            if want && !stdin.registered {
                stdin.registered = registry
                    .register(&mut SourceFd(&fd), stdin.token, Interest::WRITABLE)
                    .is_ok();
            } else if !want && stdin.registered {
                let _ = registry.deregister(&mut SourceFd(&fd));
                stdin.registered = false;
            }
        }
        if done {
            self.close_stdin(key);
        }
    }

    /// Closes a command's stdin, counting what never got through.
    pub fn close_stdin(&mut self, key: Key) {
        let Some(stdin) = self.table.get_mut(key).and_then(|p| p.stdin.as_mut()) else {
            return;
        };
        if let Some(file) = stdin.fd.take() {
            if stdin.registered {
                let _ = self
                    .poll
                    .registry()
                    .deregister(&mut SourceFd(&file.as_raw_fd()));
                stdin.registered = false;
            }
        }
        stdin.undelivered += stdin.buf.len() as u64;
        stdin.buf.clear();
        let token = stdin.token;
        self.sources.remove(&token);
    }

    // ---- processes -------------------------------------------------------------------

    fn on_signals(&mut self) {
        let mut chld = false;
        let mut term = false;
        for sig in self.signals.pending() {
            match sig {
                SIGCHLD => chld = true,
                SIGTERM | SIGINT => term = true,
                // Caught so that a closing terminal or a logrotate-style HUP does not kill
                // the daemon (and with it every command). There is no audit file to reopen.
                SIGHUP => log(format_args!("SIGHUP: nothing to reopen")),
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
            let Some(key) = self.table.by_pid(r.pid) else {
                orphans = true; // a re-parented descendant: reaped, nothing to publish
                continue;
            };
            // Whatever the pipes hold now was written before the exit: read it first.
            let nstreams = self.table.get(key).map_or(0, |p| p.streams.len());
            for s in 0..nstreams {
                self.read_pipe(key, s, EXIT_DRAIN_BYTES, true);
            }
            let exit = Exit {
                ended: r.ended,
                usage: r.usage,
                at: self.now,
            };
            let evict = self.table.record_exit(key, exit, self.cfg.max_retained);
            self.close_stdin(key);
            let stopping = self.shutdown.is_some();
            if let Some(p) = self.table.get_mut(key) {
                // Descendants may live on in the group; from now on its number is only
                // signalled while it is known to still have members (see `lingering`).
                p.group_alive = process::group_exists(p.pid);
                if let Some(t) = p.hard_timer.take() {
                    self.timers.cancel(t);
                }
                if p.group_alive && (p.released || stopping) {
                    self.lingering.push(p.pid);
                }
            }
            if let Some(p) = self.table.get(key) {
                log(format_args!(
                    "{} exited: {} after {} ms",
                    p.id,
                    describe_exit(p),
                    p.duration().as_millis()
                ));
            }
            events::pump(self, key);
            self.wake(key);
            let (released, session) = match self.table.get(key) {
                Some(p) => (
                    p.released,
                    match &p.family {
                        Family::Bash { session_id } => Some(session_id.clone()),
                        Family::Terminal { .. } => None,
                    },
                ),
                None => (false, None),
            };
            if released {
                self.forget_if_done(key);
            }
            for k in evict {
                self.release(k);
            }
            if let Some(s) = session {
                bash::trim_history(self, &s);
            }
        }
        if orphans {
            self.recheck_groups();
        }
    }

    /// A descendant died: groups that lost their last member are forgotten, so their
    /// numbers, free for reuse now, are never signalled.
    fn recheck_groups(&mut self) {
        self.lingering.retain(|g| process::group_exists(*g));
        for p in self.table.procs.values_mut() {
            if p.exit.is_some() && p.group_alive {
                p.group_alive = process::group_exists(p.pid);
            }
        }
    }

    /// Starts ending a command: SIGTERM to its group now, SIGKILL after the grace.
    pub fn kill_proc(&mut self, key: Key, reason: KillReason) {
        let grace = self.cfg.kill_grace;
        let Some(p) = self.table.get_mut(key) else {
            return;
        };
        if !p.running() {
            return;
        }
        if p.kill.is_none() {
            p.kill = Some(reason);
        }
        let pgid = p.pid;
        process::signal_group(pgid, libc::SIGTERM);
        self.timers
            .add(self.now + grace, Timer::KillEscalate { key, pgid });
    }

    /// Release: hide the id, stop reading, kill what runs. Parked waiters still get the exit.
    pub fn release(&mut self, key: Key) {
        let Some(p) = self.table.get(key) else { return };
        let running = p.running();
        let pgid = p.pid;
        let group_alive = p.group_alive;
        let nstreams = p.streams.len();
        log(format_args!("{} released", p.id));
        self.table.hide(key);
        for s in 0..nstreams {
            self.close_stream(key, s);
        }
        self.close_stdin(key);
        if running {
            self.kill_proc(key, KillReason::Killed);
        } else {
            // The leader is gone; descendants that kept its group alive are not wanted.
            if group_alive && process::group_exists(pgid) {
                process::signal_group(pgid, libc::SIGTERM);
                self.lingering.push(pgid);
                self.timers
                    .add(self.now + self.cfg.kill_grace, Timer::GroupKill { pgid });
            }
            events::pump(self, key);
            self.forget_if_done(key);
        }
    }

    /// Drops a released, exited process once nobody waits on it.
    fn forget_if_done(&mut self, key: Key) {
        let Some(p) = self.table.get(key) else { return };
        if p.released && p.exit.is_some() && p.waiters.is_empty() {
            events::drop_proc(self, key);
            self.table.remove(key);
        }
    }

    /// Removes a finished process from the table (bash history trimming).
    pub fn drop_finished(&mut self, key: Key) {
        let Some(p) = self.table.get(key) else { return };
        if p.running() {
            return;
        }
        let nstreams = p.streams.len();
        let waiters = p.waiters.clone();
        for s in 0..nstreams {
            self.close_stream(key, s);
        }
        self.table.hide(key);
        for w in waiters {
            self.resolve(w, true);
        }
        self.forget_if_done(key);
    }

    // ---- timers ----------------------------------------------------------------------

    fn fire_timers(&mut self) {
        while let Some(t) = self.timers.pop_due(Instant::now()) {
            match t {
                Timer::KillEscalate { key, pgid } => {
                    let alive = self.table.get(key).is_some_and(|p| p.running());
                    // A released command's group goes entirely, even when the leader died
                    // of the SIGTERM and a descendant ignored it.
                    if alive || self.lingering.contains(&pgid) {
                        self.lingering.retain(|g| *g != pgid);
                        process::signal_group(pgid, libc::SIGKILL);
                    }
                }
                Timer::GroupKill { pgid } => {
                    if !self.lingering.contains(&pgid) {
                        continue; // its last member died meanwhile
                    }
                    self.lingering.retain(|g| *g != pgid);
                    // A number can be reused once its group is empty; never hit a group
                    // one of our own running commands now leads.
                    if !self.table.leads_group(pgid) {
                        process::signal_group(pgid, libc::SIGKILL);
                    }
                }
                Timer::Deadline { park } => {
                    if let Some(p) = self.parked.get_mut(&park) {
                        p.timer = None;
                    }
                    self.resolve(park, true);
                }
                Timer::HardTimeout { key } => self.kill_proc(key, KillReason::TimedOut),
                Timer::SessionIdle { session } => bash::check_idle(self, &session),
                Timer::AcceptResume => {
                    self.accept_paused = false;
                    self.accept_all();
                }
                Timer::ShutdownDeadline => {
                    for p in self.table.procs.values() {
                        if p.running() {
                            process::signal_group(p.pid, libc::SIGKILL);
                        }
                    }
                    for pgid in std::mem::take(&mut self.lingering) {
                        process::signal_group(pgid, libc::SIGKILL);
                    }
                    self.finish_shutdown();
                }
            }
        }
    }

    // ---- shutdown --------------------------------------------------------------------

    fn begin_shutdown(&mut self) {
        if self.shutdown.is_some() {
            return;
        }
        log(format_args!(
            "shutting down: killing {} running command(s)",
            self.table.running()
        ));
        self.shutdown = Some(Shutdown { flush_until: None });
        if let Some(mut l) = self.listener.take() {
            let _ = self.poll.registry().deregister(&mut l);
        }
        self.remove_socket_file();
        let running: Vec<Key> = self
            .table
            .procs
            .values()
            .filter(|p| p.running())
            .map(|p| p.key)
            .collect();
        // Exited commands may have left descendants in their groups: those go too. (The
        // groups of running ones are watched from when their leaders are reaped.)
        let lingering: Vec<i32> = self
            .table
            .procs
            .values()
            .filter(|p| p.exit.is_some() && p.group_alive)
            .map(|p| p.pid)
            .collect();
        for key in running {
            self.kill_proc(key, KillReason::Killed);
        }
        for pgid in lingering {
            process::signal_group(pgid, libc::SIGTERM);
            self.lingering.push(pgid);
        }
        self.timers.add(
            self.now + self.cfg.kill_grace + Duration::from_millis(500),
            Timer::ShutdownDeadline,
        );
    }

    /// Answers what is still parked and starts the final flush.
    fn finish_shutdown(&mut self) {
        let Some(sd) = self.shutdown.as_mut() else {
            return;
        };
        if sd.flush_until.is_some() {
            return;
        }
        sd.flush_until = Some(Instant::now() + SHUTDOWN_FLUSH);
        let ids: Vec<u64> = self.parked.keys().copied().collect();
        for id in ids {
            // Requests that can be answered from state are; the rest get -32007.
            self.resolve(id, true);
            if let Some(p) = self.unpark(id) {
                self.send(p.conn, &p.reply, Err(RpcError::shutting_down()));
            }
        }
        for t in self.conns.keys().copied().collect::<Vec<_>>() {
            self.dirty.push(t);
        }
    }

    fn shutdown_done(&mut self) -> bool {
        let Some(sd) = &self.shutdown else {
            return false;
        };
        match sd.flush_until {
            None => {
                // Done once every command exited and what they left in their groups is gone
                // too (their deaths wake the loop: orphans are re-parented to us). The
                // deadline timer SIGKILLs whatever remains after the grace.
                let lingering = self.lingering.iter().any(|g| process::group_exists(*g));
                if self.table.running() == 0 && !lingering {
                    self.finish_shutdown();
                    self.flush_dirty();
                }
                false
            }
            Some(until) => {
                let pending = self
                    .conns
                    .values()
                    .any(|c| c.pending_out() > 0 && !c.broken);
                if pending && Instant::now() < until {
                    // Keep the loop turning for writability until the deadline.
                    if self.timers.next_deadline().is_none_or(|d| d > until) {
                        self.timers.add(until, Timer::ShutdownDeadline);
                    }
                    return false;
                }
                true
            }
        }
    }

    fn remove_socket_file(&mut self) {
        if let Some(path) = self.socket_file.take() {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// "exit 3", "signal SIGKILL" or "running" for logs.
fn describe_exit(p: &crate::table::Proc) -> String {
    match p.exit_fields() {
        (Some(c), _) => format!("exit {c}"),
        (_, Some(sig)) => format!("signal {sig}"),
        _ => "running".into(),
    }
}

/// What to start, already validated by a method family.
pub struct Launch {
    pub family: Family,
    pub owner: u32,
    /// The connection asking: whose identity the command may run as.
    pub conn: Token,
    pub program: process::Program,
    /// What the client asked to run, for listings and logs.
    pub command: String,
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
    pub cwd: PathBuf,
    pub stdio: process::Stdio3,
    pub ring_capacity: usize,
    /// `term` or `cmd`: the public id's prefix.
    pub prefix: &'static str,
}

impl Server {
    /// Starts a command and records it. A spawn failure leaves nothing behind.
    pub fn launch(&mut self, l: Launch) -> Result<Key, RpcError> {
        if self.table.running() >= self.cfg.max_processes {
            return Err(RpcError::limit("max-processes", self.cfg.max_processes));
        }
        let user = self.conns.get(&l.conn).and_then(|c| c.run_as.as_ref());
        let spec = process::SpawnSpec {
            program: &l.program,
            env: &l.env,
            cwd: &l.cwd,
            stdio: l.stdio,
            user,
        };
        let spawned = self
            .spawner
            .spawn(&spec)
            .map_err(|e| RpcError::spawn_failed(&e))?;
        let (key, id) = self.table.next_ids(l.prefix);
        let mut files = vec![File::from(spawned.out)];
        files.extend(spawned.err.map(File::from));
        let mut streams = Vec::with_capacity(files.len());
        for (i, file) in files.into_iter().enumerate() {
            let token = match self.register_pipe(&file, key, i) {
                Ok(t) => t,
                Err(e) => {
                    // Cannot watch its output: do not leave it running unobserved.
                    process::signal_group(spawned.pid, libc::SIGKILL);
                    return Err(RpcError::internal(format!("registering a pipe: {e}")));
                }
            };
            streams.push(crate::table::Stream {
                ring: crate::ring::Ring::new(l.ring_capacity),
                fd: Some(file),
                token,
                grown: false,
            });
        }
        let stdin = match spawned.stdin {
            Some(fd) => Some(crate::table::Stdin {
                fd: Some(File::from(fd)),
                token: self.stdin_token(key),
                buf: std::collections::VecDeque::new(),
                capacity: self.cfg.stdin_buffer,
                eof_requested: false,
                registered: false,
                undelivered: 0,
            }),
            None => None,
        };
        log(format_args!(
            "{id} started: pid {} uid {} cwd {} command {:?}{}",
            spawned.pid,
            l.owner,
            l.cwd.display(),
            l.command,
            if l.args.is_empty() {
                String::new()
            } else {
                format!(" args {:?}", l.args)
            }
        ));
        self.table.insert(crate::table::Proc::started(
            key,
            id,
            l.family,
            l.owner,
            l.command,
            l.args,
            l.cwd,
            spawned.pid,
            self.now,
            streams,
            stdin,
        ));
        Ok(key)
    }
}

/// Checks request environment variables: a name must be non-empty and hold no `=` or NUL,
/// a value no NUL.
pub fn validate_env(field: &str, vars: &[(String, String)]) -> Result<(), RpcError> {
    for (name, value) in vars {
        if name.is_empty() {
            return Err(RpcError::invalid_params(field, "empty variable name"));
        }
        if name.contains('=') || name.contains('\0') {
            return Err(RpcError::invalid_params(
                field,
                format!("variable name {name:?} holds '=' or NUL"),
            ));
        }
        if value.contains('\0') {
            return Err(RpcError::invalid_params(
                field,
                format!("value of {name:?} holds NUL"),
            ));
        }
    }
    Ok(())
}

/// Checks a working directory: absolute, existing, a directory.
pub fn validate_dir(field: &str, dir: &str) -> Result<PathBuf, RpcError> {
    let path = PathBuf::from(dir);
    if !path.is_absolute() {
        return Err(RpcError::invalid_params(
            field,
            format!("{dir:?} is not an absolute path"),
        ));
    }
    match std::fs::metadata(&path) {
        Ok(m) if m.is_dir() => Ok(path),
        Ok(_) => Err(RpcError::invalid_params(
            field,
            format!("{dir:?} is not a directory"),
        )),
        Err(e) => Err(RpcError::invalid_params(
            field,
            format!("{dir:?}: {}", rpc::os_error_text(&e)),
        )),
    }
}
