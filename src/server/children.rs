//! The commands' side of the loop: starting a command (its place, the spawn, its pipes),
//! reading its pipes into the core, writing its stdin, and reaping it. Owns the pipe
//! descriptors, the containment and the spawner; the loop lends it the core and the
//! connections for each call, and carries out the effects it leaves in the core.
//!
//! Invariants:
//! - A command that cannot be watched is not left running: a failure after the spawn
//!   kills its tree, and its hold is let go when its leader is reaped.
//! - A process's exit is published only after its pipes were drained of what they held.
//! - A pipe is read at most `PIPE_BYTES_PER_TURN` at a time; one left readable is "hot"
//!   and read again at the end of the turn (`service_hot`), without waiting for an event.

use std::collections::HashMap;
use std::io;

use mio::{Registry, Token};
use serde_json::json;

use crate::config::Config;
use crate::core::launch::LaunchRequest;
use crate::core::pump::Pumped;
use crate::core::table::{ConnId, Key, Peer};
use crate::core::Core;
use crate::server::clients::{token_of, Clients};
use crate::server::pipes::{Flushed, Got, Pipes, Source};
use crate::sys::contain::{Contain, Place, PrepareError, Unavailable};
use crate::sys::cookie::Instance;
use crate::sys::ids::Identity;
use crate::sys::systemd;
use crate::types::Leftovers;
use crate::types::Stage;
use crate::types::Swept;
use crate::wire::rpc::{self, RpcError};

/// Size of the buffer pipes are read into.
const SCRATCH: usize = 256 << 10;
/// Bytes read from one pipe per turn before other sources get a go.
const PIPE_BYTES_PER_TURN: usize = 4 << 20;
/// Bytes read from each pipe when its command exits: more than a full pipe holds (execd
/// grows pipes to at most 1 MiB), and bounded even if a descendant keeps writing.
const EXIT_DRAIN_BYTES: usize = 2 << 20;
/// Smallest read from a watched pipe, so a tiny ring cannot turn reading into a busy loop
/// of one-byte reads (a ring that small loses bytes to a fast writer either way).
const MIN_WATCHED_READ: usize = 64 << 10;

/// Where a command's request came from, for whom it runs as.
#[derive(Debug, Default)]
pub struct Origin {
    /// Through a TCP listener: it runs as `--http-run-as`.
    pub over_tcp: bool,
    /// The supplementary groups of the Unix peer.
    pub groups: Vec<u32>,
}

/// What one reap found.
#[derive(Debug, PartialEq)]
pub enum ReapOutcome {
    /// A command's exit, published to the core (which has effects to carry out).
    Command,
    /// A child that is not a command: a leader killed as it started, or a re-parented
    /// descendant.
    Other,
    /// Nothing more has exited.
    Nothing,
}

/// The running commands' descriptors and how they are started and held.
pub struct Children {
    pipes: Pipes,
    pub contain: Contain,
    spawner: crate::sys::spawn::Spawner,
    /// `--run-as`, resolved at startup.
    run_as: Option<Identity>,
    /// The daemon's own uid.
    uid: u32,
    /// Leaders killed as they started (their pipes could not be watched), by pid: their
    /// holds are let go when they are reaped.
    abandoned: HashMap<i32, Key>,
    /// A re-parented descendant was reaped since the last look.
    orphans: bool,
    /// Pipes left readable after their per-turn budget.
    hot: Vec<(Key, usize)>,
    scratch: Vec<u8>,
}

/// How many output streams a command has (a pipe each, open or not).
fn streams(core: &Core, key: Key) -> usize {
    core.table.get(key).map_or(0, |p| p.streams.len())
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

impl Children {
    /// Resolves `--run-as` and prepares the spawner (after the signal handlers are in
    /// place: they are what children must reset). Containment is chosen later, by
    /// `choose_containment`, once the daemon holds its socket.
    pub fn new(cfg: &Config) -> io::Result<Children> {
        let uid = crate::sys::ids::current_uid();
        let run_as = match &cfg.run_as {
            Some(user) if uid != 0 => {
                return Err(io::Error::new(
                    io::ErrorKind::PermissionDenied,
                    format!("--run-as {user} needs a daemon running as root"),
                ));
            }
            Some(user) => Some(Identity::of_user(user)?),
            None => None,
        };
        let spawner = crate::sys::spawn::Spawner::new(
            cfg.clean_env,
            &systemd::PRIVATE_VARS,
            &cfg.rlimits,
            crate::sys::host::raise_nofile(),
        )?;
        Ok(Children {
            pipes: Pipes::default(),
            contain: Contain::default(),
            spawner,
            run_as,
            uid,
            abandoned: HashMap::new(),
            orphans: false,
            hot: Vec::new(),
            scratch: vec![0; SCRATCH],
        })
    }

    /// Chooses containment as `--cgroup` says, before anything is spawned: it may move the
    /// daemon into its cgroup's leaf and end what a previous instance left behind in
    /// command cgroups; then it ends what earlier instances on this socket left carrying
    /// their cookies (it returns both). A daemon-wide limit it cannot enforce stops the
    /// start (before any sweep). `cfg.socket` is the socket the daemon holds.
    pub fn choose_containment(&mut self, cfg: &Config) -> io::Result<(Option<Leftovers>, Swept)> {
        let (mut contain, leftovers) = Contain::choose(&cfg.cgroup, Instance::of_self(&cfg.socket));
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
        let swept = contain.sweep_earlier();
        self.contain = contain;
        Ok((leftovers, swept))
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

    /// Starts a command and records it in the core: its place (a cgroup with its limits,
    /// made before the spawn), the spawn, its pipes. A failure at any step leaves nothing
    /// behind.
    pub fn launch(
        &mut self,
        core: &mut Core,
        registry: &Registry,
        next_token: &mut usize,
        req: &LaunchRequest,
        origin: Origin,
    ) -> Result<Key, RpcError> {
        core.may_start(req)?;
        let (key, id) = match &req.admitted {
            Some(a) => (a.key, a.id.clone()),
            None => core.table.next_ids(req.prefix),
        };
        let place = self
            .contain
            .prepare(&id, &req.limits)
            .map_err(|e| match e {
                PrepareError::Unavailable(u) => unavailable(&u),
                PrepareError::Io(e) => RpcError::internal(format!("{e}")),
            })?;
        let user = self.identity(req.peer, origin);
        let cookie = self.contain.cookie(&id);
        let spec = crate::sys::spawn::SpawnSpec {
            program: &req.program,
            env: &req.env,
            cwd: &req.cwd,
            stdio: req.stdio,
            user: user.as_ref(),
            cgroup_procs: place.as_ref().map(Place::procs_fd),
            cookie: &cookie,
        };
        let spawned = match self.spawner.spawn(&spec) {
            Ok(s) => s,
            Err(e) => {
                self.contain.abandon(place);
                core.log.refusal(
                    "spawn failures",
                    core.now,
                    format_args!(
                        "could not start {:?} for uid {}: {}",
                        req.command,
                        req.peer.uid,
                        rpc::os_error_text(&e)
                    ),
                );
                let program = match &req.program {
                    crate::types::Program::Direct { program, .. } => program.clone(),
                    crate::types::Program::Shell { shell, .. } => shell.display().to_string(),
                };
                return Err(RpcError::spawn_failed(&program, &e));
            }
        };
        let pid = spawned.pid;
        // From here the tree is held: whatever fails next, it can be ended.
        self.contain.started(key, pid, place);
        let outs: Vec<_> = std::iter::once(spawned.out).chain(spawned.err).collect();
        let added = self.pipes.add(registry, key, outs, spawned.stdin, || {
            let t = Token(*next_token);
            *next_token += 1;
            t
        });
        if let Err(e) = added {
            // Cannot watch its output: do not leave it running unobserved. Its hold is let
            // go when the leader is reaped.
            self.contain.end(key, &id, Stage::Kill);
            crate::sys::reap::signal_group(pid, libc::SIGKILL);
            self.abandoned.insert(pid, key);
            return Err(RpcError::internal(format!("registering a pipe: {e}")));
        }
        let runs_as = user.as_ref().map_or(self.uid, |u| u.uid);
        core.started(req, key, id, pid, runs_as);
        Ok(key)
    }

    // ---- pipes -------------------------------------------------------------------------

    /// A pipe is ready: output is read, waiting stdin written. Returns whether the core
    /// has effects to carry out now (those of output wait for the end of the turn).
    pub fn on_ready(
        &mut self,
        token: Token,
        core: &mut Core,
        clients: &mut Clients,
        registry: &Registry,
    ) -> bool {
        match self.pipes.source(token) {
            Some(Source::Out { key, stream }) => {
                self.read_pipe(
                    core,
                    clients,
                    registry,
                    (key, stream),
                    PIPE_BYTES_PER_TURN,
                    false,
                );
                false
            }
            Some(Source::Stdin { key }) => self.flush_stdin(core, registry, key),
            None => false, // a source closed earlier this turn
        }
    }

    /// Whether a pipe was left readable last turn: the loop polls without sleeping.
    pub fn busy(&self) -> bool {
        !self.hot.is_empty()
    }

    /// Reads again the pipes left readable after their budget.
    pub fn service_hot(&mut self, core: &mut Core, clients: &mut Clients, registry: &Registry) {
        for pipe in std::mem::take(&mut self.hot) {
            self.read_pipe(core, clients, registry, pipe, PIPE_BYTES_PER_TURN, false);
        }
    }

    /// Reads up to `budget` bytes from one of a process's pipes into its ring.
    ///
    /// With subscribers attached, each read is at most the ring's size (but not tiny) and
    /// they are pumped after each one, so a subscriber with room never loses bytes to the
    /// ring in between. `to_eof` (the drain when a command exits) reads on after a short
    /// read, to see an EOF that is already there: a stream known to have ended hands out
    /// its last incomplete character as U+FFFD instead of holding it back.
    fn read_pipe(
        &mut self,
        core: &mut Core,
        clients: &mut Clients,
        registry: &Registry,
        (key, stream): (Key, usize),
        budget: usize,
        to_eof: bool,
    ) {
        if !self.pipes.is_open(key, stream) {
            core.read_out(key, stream);
            return; // closed earlier (EOF, release), or never had one
        }
        let mut got = false;
        let mut eof = false;
        let mut exhausted = true;
        let mut left = budget;
        while left > 0 {
            let Some(p) = core.table.get(key) else {
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
                capacity.clamp(MIN_WATCHED_READ, SCRATCH)
            } else {
                SCRATCH
            }
            .min(left);
            match self.pipes.read(key, stream, &mut self.scratch[..want]) {
                Got::Data(n) => {
                    core.output(key, stream, &self.scratch[..n]);
                    got = true;
                    left -= n;
                    if watched {
                        self.pump(core, clients, key);
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
                    self.pipes.close_out(registry, key, stream);
                    eof = true;
                    exhausted = false;
                    break;
                }
            }
        }
        if exhausted && !self.hot.contains(&(key, stream)) {
            self.hot.push((key, stream));
        }
        if eof {
            self.hot.retain(|h| *h != (key, stream));
            core.eof(key, stream);
        } else if got {
            self.pump(core, clients, key);
            core.wake(key);
        }
        // An exit that found this pipe paused waits for every pipe to be read out.
        if !exhausted {
            core.read_out(key, stream);
        }
    }

    /// Hands a command's new output to its subscribers.
    pub fn pump(&mut self, core: &mut Core, clients: &mut Clients, key: Key) {
        let done = crate::core::pump::pump(&mut core.table, key, clients);
        self.after_pump(core, clients, done);
    }

    /// A connection drained below half its cap: its lagging subscribers resume.
    pub fn on_room(&mut self, core: &mut Core, clients: &mut Clients, conn: ConnId) {
        let mut done = crate::core::pump::on_room(&mut core.table, conn, clients);
        done.touched.retain(|c| *c != conn);
        self.after_pump(core, clients, done);
    }

    /// Marks the connections a pump wrote to, and reads again the pipes it unpaused (they
    /// give no new readiness event while their writer waits on a full pipe).
    fn after_pump(&mut self, core: &Core, clients: &mut Clients, done: Pumped) {
        clients.dirty.extend(done.touched.into_iter().map(token_of));
        for key in done.resumed {
            for s in 0..streams(core, key) {
                if !self.hot.contains(&(key, s)) {
                    self.hot.push((key, s));
                }
            }
        }
    }

    /// Writes pending stdin as far as the pipe takes it. Returns whether the core was
    /// woken (a write waiting for room can be answered).
    pub fn flush_stdin(&mut self, core: &mut Core, registry: &Registry, key: Key) -> bool {
        let Some(stdin) = core.table.get_mut(key).and_then(|p| p.stdin.as_mut()) else {
            return false;
        };
        if !stdin.open {
            return false;
        }
        let before = stdin.buf.len();
        let flushed = self.pipes.flush_stdin(registry, key, stdin);
        if flushed == Flushed::Closed {
            stdin.close();
        }
        if flushed == Flushed::Closed || stdin.buf.len() < before {
            core.wake(key);
            return true;
        }
        false
    }

    /// Closes every pipe of a command (it was released or forgotten).
    pub fn close_pipes(&mut self, registry: &Registry, key: Key) {
        self.pipes.close_all(registry, key);
        self.hot.retain(|(k, _)| *k != key);
    }

    /// Closes a command's stdin (its input was drained after an `eof`).
    pub fn close_stdin(&mut self, registry: &Registry, key: Key) {
        self.pipes.close_stdin(registry, key);
    }

    // ---- reaping -----------------------------------------------------------------------

    /// Reaps one exited child and, if it is a command, reads its pipes out and publishes
    /// its exit to the core. One SIGCHLD may stand for many exits, so the loop calls this
    /// until it says `ReapOutcome::Nothing`.
    pub fn reap_one(
        &mut self,
        core: &mut Core,
        clients: &mut Clients,
        registry: &Registry,
    ) -> ReapOutcome {
        let Some(r) = crate::sys::reap::reap_one() else {
            if std::mem::take(&mut self.orphans) {
                self.contain.orphan_reaped();
            }
            return ReapOutcome::Nothing;
        };
        let Some(key) = core.table.by_pid(r.pid) else {
            if let Some(key) = self.abandoned.remove(&r.pid) {
                self.contain.leader_exited(key); // killed as it started
            } else {
                self.orphans = true; // a re-parented descendant: reaped, nothing to publish
            }
            return ReapOutcome::Other;
        };
        // Whatever the pipes hold now was written before the exit: read it first.
        for s in 0..streams(core, key) {
            self.read_pipe(core, clients, registry, (key, s), EXIT_DRAIN_BYTES, true);
        }
        let tree = self.contain.leader_exited(key);
        core.exited(key, r.ended, r.usage, tree);
        ReapOutcome::Command
    }
}
