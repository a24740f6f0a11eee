//! The commands' side of the loop: starting a command (its place, the spawn, its pipes),
//! reading its pipes into the core, writing its stdin, and reaping it. Owns the pipe
//! descriptors, the containment, the spawner and the off-loop reader (`server::reader`,
//! which runs the cookie sweeps and the looks for commands waiting for input); the loop
//! lends it the core and the connections for each call, and carries out the effects it
//! leaves in the core.
//!
//! Invariants:
//! - A command that cannot be watched is not left running: a failure after the spawn
//!   kills its tree, and its hold is let go when its leader is reaped.
//! - A process's exit is published only after its pipes were drained of what they held.
//! - A pipe is read at most `PIPE_BYTES_PER_TURN` at a time; one left readable is "hot"
//!   and read again at the end of the turn (`service_hot`), without waiting for an event.

use std::collections::{HashMap, HashSet};
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::PathBuf;
use std::time::Instant;

use mio::unix::SourceFd;
use mio::{Interest, Registry, Token};
use serde_json::json;

use crate::config::Config;
use crate::core::confine::Decided;
use crate::core::launch::{LaunchRequest, Origin};
use crate::core::pump::Pumped;
use crate::core::table::{ConnId, Key, KillReason, Peer};
use crate::core::tie::Tie;
use crate::core::Core;
use crate::server::clients::{token_of, Clients};
use crate::server::pipes::{Flushed, Got, Pipes, Source};
use crate::server::reader::{Asker, Heard, Reader};
use crate::sys::contain::{Contain, Place, PrepareError, Unavailable};
use crate::sys::cookie::{CookieRead, Instance};
use crate::sys::ids::Identity;
use crate::sys::spawn::{FailedAt, InFlight, ParentEnds, Report, SandboxStep, Spawned};
use crate::sys::systemd;
use crate::types::Leftovers;
use crate::types::Stage;
use crate::types::{Ended, Usage};
use crate::wire::rpc::{self, ReqNo, RpcError};
use crate::wire::state::{InputImage, ServerImage};

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
    /// The descriptor limit the daemon runs with (raised at start).
    pub nofile: crate::sys::host::Nofile,
    pipes: Pipes,
    pub contain: Contain,
    spawner: crate::sys::spawn::Spawner,
    /// The sandbox's kernel side (PROTOCOL 16).
    pub sandbox: crate::sys::sandbox::Sandboxer,
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
    hot: Hot,
    /// The file each running command reads its input from, while its stdin is open (for
    /// telling when it waits for input).
    inputs: HashMap<Key, crate::sys::waiting::InputFile>,
    /// The off-loop reader: sweeps, looks, cookies.
    reader: Reader,
    /// Commands whose look the reader has not answered yet (one at a time each).
    looking: HashSet<Key>,
    /// Cookie reads the reader answered for connections (`Asker::Peer`): the
    /// connection, the peer's pid and start time, and what was read. The loop takes them
    /// (`take_peer_cookies`).
    peer_cookies: Vec<(Token, i32, u64, crate::sys::cookie::CookieRead)>,
    /// The looks for input are made on the loop, not by the reader: the daemon is not
    /// root and Yama lets only the commands' ancestor read what they wait in.
    looks_on_loop: bool,
    /// Spawns whose child has not reported yet (exec'd or failed), by pid.
    starting: HashMap<i32, Starting>,
    /// The report pipe of each spawn under way: its token, and the child's pid.
    reports: HashMap<Token, i32>,
    /// Children whose spawn failed, not reaped yet: the memory they read is kept until
    /// they are (they may still be on their way to `_exit`).
    failed: HashMap<i32, InFlight>,
    /// The pre-flight of an upgrade (`--upgrade-check`), while it is not reaped; and how
    /// it ended once it was.
    probe: Option<i32>,
    probe_ended: Option<Ended>,
    scratch: Vec<u8>,
    /// The loop thread's `/proc/thread-self/children`, kept open, and the buffer it is
    /// read into (`tree_may_remain`).
    children_list: Option<std::fs::File>,
    scratch_list: Vec<u8>,
    /// That list as read this turn, until a turn, a reap or a signal that reached
    /// something could have changed it (what exits hands its children to the daemon):
    /// the final kills of commands already gone, a turn's batch of them, share one read.
    /// The kernel walks its list of children again for each page of it, so one read
    /// costs about a millisecond with 10,000 commands running; read per kill, a release
    /// of all of them took 45 s.
    children_seen: Option<HashSet<i32>>,
    /// Orphans (children of the daemon it did not start), by pid and start time: the
    /// command their cookie names (None: no command of this instance), once the reader
    /// said; and those it is asked about.
    orphans_of: HashMap<(i32, u64), Option<String>>,
    orphans_asked: HashSet<(i32, u64)>,
    /// Processes found not to descend from the daemon (PROTOCOL 7.3): a later peer's walk
    /// up its parents stops at one of them.
    outsiders: crate::core::tie::Outsiders,
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
        Children::with_nofile(cfg, crate::sys::host::raise_nofile())
    }

    /// As `new`, with the descriptor limit as it stands (raised at the first start, and
    /// carried across upgrades with what commands get back).
    fn with_nofile(cfg: &Config, nofile: crate::sys::host::Nofile) -> io::Result<Children> {
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
        let mut spawner = crate::sys::spawn::Spawner::new(
            cfg.clean_env,
            &systemd::PRIVATE_VARS,
            &cfg.rlimits,
            nofile.raised_from,
        )?;
        let sandbox =
            crate::sys::sandbox::Sandboxer::new(cfg.landlock_abi_max).map_err(io::Error::other)?;
        // A spare waits in a process group of its own, which a sandboxed command under
        // the seccomp fallback for signals (aimed only at the daemon's pid and group)
        // could stop, holding up the next spawn: no spares there. Without Landlock no
        // command is sandboxed, and unsandboxed ones may signal the daemon itself.
        let k = &sandbox.kernel;
        spawner.allow_spares(k.abi == 0 || k.signals_scoped());
        Ok(Children {
            nofile,
            pipes: Pipes::default(),
            contain: Contain::default(),
            spawner,
            sandbox,
            run_as,
            uid,
            abandoned: HashMap::new(),
            orphans: false,
            hot: Hot::default(),
            inputs: HashMap::new(),
            reader: Reader::default(),
            looking: HashSet::new(),
            peer_cookies: Vec::new(),
            looks_on_loop: !crate::sys::reader::looks_off_loop(
                crate::sys::ids::effective_uid(),
                crate::sys::reader::yama_scope().as_deref(),
            ),
            starting: HashMap::new(),
            reports: HashMap::new(),
            failed: HashMap::new(),
            probe: None,
            probe_ended: None,
            scratch: vec![0; SCRATCH],
            children_list: None,
            scratch_list: Vec::new(),
            children_seen: None,
            orphans_of: HashMap::new(),
            orphans_asked: HashSet::new(),
            outsiders: Default::default(),
        })
    }

    /// Chooses containment as `--cgroup` says, before anything is spawned: it may move the
    /// daemon into its cgroup's leaf and end what a previous instance left behind in
    /// command cgroups (it returns that); what earlier instances on this socket left
    /// carrying their cookies is swept first thing (by the reader, once the loop runs). A
    /// daemon-wide limit it cannot enforce stops the start (before any sweep).
    /// `cfg.socket` is the socket the daemon holds.
    pub fn choose_containment(&mut self, cfg: &Config) -> io::Result<Option<Leftovers>> {
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
        contain.ask_earlier();
        self.contain = contain;
        Ok(leftovers)
    }

    /// Resolves what sandboxes name (workspaces, `--tmpdir`, homes, the operator's
    /// roots) to real paths and opens them, for the core and the sandboxer (PROTOCOL 16):
    /// at start, after an upgrade and at a policy reload. An error is a reason the daemon
    /// cannot start: a workspace that is not a directory, a sandbox naming `$CWD` with no
    /// workspace at all, a default sandbox this kernel cannot give.
    pub fn prepare_sandboxes(
        &mut self,
        cfg: &Config,
        policy: &crate::policy::Policy,
    ) -> Result<crate::core::confine::Sandboxing, String> {
        use crate::policy::sandbox::{Base, Given, Names, Partial, Template};
        let real = |p: &std::path::Path, what: &str| {
            std::fs::canonicalize(p).map_err(|e| format!("{what} {}: {e}", p.display()))
        };
        let mut named: Vec<std::path::PathBuf> = cfg.workspaces.clone();
        named.extend(policy.workspaces().iter().cloned());
        if named.is_empty() && cfg.workdir_given {
            named.push(cfg.workdir.clone());
        }
        let mut workspaces = Vec::new();
        for w in named {
            let r = real(&w, "workspace")?;
            if r == std::path::Path::new("/") {
                return Err(format!("workspace {}: / is never a workspace", w.display()));
            }
            if !r.is_dir() {
                return Err(format!("workspace {}: not a directory", w.display()));
            }
            workspaces.push((w, r));
        }
        let tmpdir = real(&cfg.tmpdir, "--tmpdir")?;
        let mut uids = vec![self.uid];
        uids.extend(cfg.allow_uids.iter().copied());
        let run_as = self.run_as.as_ref().map(|i| i.uid);
        uids.extend(run_as);
        if let Some(u) = &cfg.http_run_as {
            if let Ok(id) = Identity::of_user(u) {
                uids.push(id.uid);
            }
        }
        if self.uid == 0 {
            uids.push(0);
        }
        let mut homes = HashMap::new();
        for uid in uids {
            if let Ok(Some(h)) = crate::sys::ids::home_of(uid) {
                homes.insert(uid, std::fs::canonicalize(&h).unwrap_or(h));
            }
        }
        let default = match &cfg.sandbox {
            None => Template::off(),
            Some(flag) => flag.read()?.over(&Template::off()),
        };
        let top = policy
            .sandbox()
            .map_or_else(|| default.clone(), |p| p.over(&default));
        let templates: Vec<Template> = std::iter::once(default.clone())
            .chain(std::iter::once(top.clone()))
            .chain(policy.sandboxes().map(|p: &Partial| p.over(&top)))
            .collect();
        let mut real_of = HashMap::new();
        for t in &templates {
            for p in t.absolute_roots() {
                // A root that does not exist grants nothing; it keeps its words.
                if let Ok(r) = std::fs::canonicalize(&p) {
                    real_of.insert(p, r);
                }
            }
        }
        for (given, r) in &workspaces {
            real_of.insert(given.clone(), r.clone());
        }
        real_of.insert(cfg.tmpdir.clone(), tmpdir.clone());
        if top.names(Base::Cwd) && workspaces.is_empty() {
            return Err(
                "the sandbox in force names $CWD, and there is no workspace for it: name one \
                 with --workspace DIR (or the policy's \"workspaces\", or --workdir)"
                    .into(),
            );
        }
        let kernel = self.sandbox.kernel.clone();
        // A default the kernel cannot give stops the start (it would refuse every command).
        let names = Names {
            cwd: workspaces.first().map(|(_, r)| r.as_path()),
            home: homes.get(&self.uid).map(std::path::PathBuf::as_path),
            tmpdir: Some(&tmpdir),
            real: Some(&real_of),
        };
        let probe = Given {
            name: String::new(),
            sandbox: top.resolve(&names).0,
            cwd_root: None,
            verify_cwd: false,
            escalated: false,
        };
        if let Some(why) = kernel.unavailable(&probe) {
            return Err(format!("sandbox unavailable: {why}"));
        }
        let mut roots: Vec<std::path::PathBuf> = real_of.values().cloned().collect();
        roots.extend(homes.values().cloned());
        let ws_real: Vec<std::path::PathBuf> = workspaces.iter().map(|(_, r)| r.clone()).collect();
        self.sandbox.trust(&roots, &ws_real, &tmpdir);
        Ok(crate::core::confine::Sandboxing {
            default,
            workspaces,
            tmpdir,
            homes,
            real: real_of,
            run_as,
            kernel,
        })
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

    /// Starts a command: its place (a cgroup with its limits, made before the spawn), and
    /// its child cloned, with the parent's ends of its pipes kept here and its report pipe
    /// watched. `Ok` means it is on its way (`spawn_reported` finishes it when the child
    /// execs or fails); an error means nothing was left behind and the request is
    /// answered with it.
    #[allow(clippy::too_many_arguments)]
    pub fn launch(
        &mut self,
        core: &mut Core,
        registry: &Registry,
        next_token: &mut usize,
        launch: Box<LaunchRequest>,
        origin: Origin,
        token: Token,
        req: Option<ReqNo>,
    ) -> Result<(), (Box<LaunchRequest>, RpcError)> {
        if let Err(e) = core.may_start(&launch) {
            return Err((launch, e));
        }
        let (key, id) = match &launch.admitted {
            Some(a) => (a.key, a.id.clone()),
            None => core.table.next_ids(launch.prefix),
        };
        // Nothing runs unrecorded: room for its `start` record first (PROTOCOL 7.4).
        if let Err(e) = core.promise_start(&launch, key, &id) {
            return Err((launch, e));
        }
        let place = match self.contain.prepare(&id, &launch.limits) {
            Ok(place) => place,
            Err(e) => {
                core.unpromise_start(key);
                let e = match e {
                    PrepareError::Unavailable(u) => unavailable(&u),
                    PrepareError::Io(e) => RpcError::internal(format!("{e}")),
                };
                return Err((launch, e));
            }
        };
        // Every launch has passed the gate, which gave it its sandbox; one that did not
        // (a shell restarted from a state that carried none) gets the one in force.
        let mut launch = launch;
        if launch.sandbox.is_none() {
            match core.sandbox_for(&launch, None) {
                Ok(Decided::Within(g)) => launch.sandbox = Some(g),
                Ok(Decided::Wider { .. }) => {
                    let e = unavailable_sandbox("it was never asked for");
                    return Err((launch, e));
                }
                Err(e) => return Err((launch, e)),
            }
        }
        let confined = match launch.sandbox.as_ref().filter(|g| !g.is_off()) {
            None => None,
            Some(g) => match self.sandbox.confine(g) {
                Ok(c) => Some(c),
                Err(why) => {
                    self.contain.abandon(place);
                    return Err((launch, unavailable_sandbox(&why)));
                }
            },
        };
        let user = self.identity(launch.peer, origin);
        let cookie = self.contain.cookie(&id);
        let tag = crate::sys::cookie::tag_hex(&core.shells.secret, &id);
        let spec = crate::sys::spawn::SpawnSpec {
            program: &launch.program,
            env: &launch.env,
            cwd: &launch.cwd,
            stdio: launch.stdio,
            user: user.as_ref(),
            cgroup_procs: place.as_ref().map(Place::procs_fd),
            cookie: &cookie,
            tag: Some(&tag),
            check_binary: None,
        };
        let spawned = match self.spawner.spawn(&spec, confined) {
            Ok(spawned) => spawned,
            Err(e) => {
                self.contain.abandon(place);
                core.unpromise_start(key);
                let e = spawn_error(core, &launch, &e);
                return Err((launch, e));
            }
        };
        let Spawned {
            pid,
            ends,
            report,
            memory,
        } = spawned;
        let report_token = Token(*next_token);
        *next_token += 1;
        let fd = report.as_raw_fd();
        if let Err(e) = registry.register(&mut SourceFd(&fd), report_token, Interest::READABLE) {
            // Nobody would hear how it went: end it, and keep what it reads until reaped.
            let _ = crate::sys::reap::signal_pid(pid as u32, libc::SIGKILL);
            self.contain.abandon(place);
            core.unpromise_start(key);
            self.failed.insert(pid, memory);
            let e = RpcError::internal(format!("watching a spawn: {e}"));
            return Err((launch, e));
        }
        self.reports.insert(report_token, pid);
        core.table.reserve_start(launch.peer.uid, true);
        let runs_as = user.as_ref().map_or(self.uid, |u| u.uid);
        self.starting.insert(
            pid,
            Starting {
                token,
                req,
                launch,
                key,
                id,
                place,
                ends,
                runs_as,
                report,
                report_token,
                memory,
                exit: None,
            },
        );
        Ok(())
    }

    /// Spawns handed out and not finished yet, and spares killed and not yet reaped
    /// (shutdown and an upgrade's drain wait for both).
    pub fn spawning(&self) -> usize {
        self.starting.len() + self.spawner.spares_quitting()
    }

    /// The end of a turn: the spares spawns asked for are made (`wanted`) once no spawn is
    /// between clone and exec (a spare's early steps would take a CPU from it), and the
    /// ruleset for the next spawn in the last one's sandbox is built; or, for a daemon
    /// that stops or upgrades, every spare is killed.
    pub fn spares(&mut self, wanted: bool) {
        if !wanted {
            self.spawner.quit_spares();
        } else if self.starting.is_empty() {
            self.spawner.replenish();
            self.sandbox.prepare();
        }
    }

    /// Gives up on the spawns still in flight (the daemon is stopping and one hangs, on a
    /// working directory that never answers, say): each child is killed (a child asleep in
    /// a hung file system dies when it wakes), and the requests they answer are returned,
    /// to be told so.
    pub fn give_up_spawns(&mut self, registry: &Registry) -> Vec<(Token, Option<ReqNo>)> {
        let starting: Vec<(i32, Starting)> = self.starting.drain().collect();
        starting
            .into_iter()
            .map(|(pid, s)| {
                self.forget_report(registry, &s);
                self.contain.abandon(s.place);
                // One already reaped is gone, its memory free, and its pid may be
                // someone else's by now: only a child not yet reaped is killed and
                // waited for.
                if s.exit.is_none() {
                    let _ = crate::sys::reap::signal_pid(pid as u32, libc::SIGKILL);
                    self.failed.insert(pid, s.memory);
                }
                (s.token, s.req)
            })
            .collect()
    }

    /// Whether `token` is a spawn's report pipe.
    pub fn is_report(&self, token: Token) -> bool {
        self.reports.contains_key(&token)
    }

    fn forget_report(&mut self, registry: &Registry, s: &Starting) {
        let _ = registry.deregister(&mut SourceFd(&s.report.as_raw_fd()));
        self.reports.remove(&s.report_token);
    }

    /// A spawn's report pipe is readable: the child exec'd (the command is recorded in the
    /// core with its pipes watched, and its exit published if it was reaped already) or a
    /// step failed (nothing is left behind). Returns the request it answers and the
    /// launch's outcome, for the family's tail; `None` while nothing is said yet.
    pub fn spawn_reported(
        &mut self,
        core: &mut Core,
        clients: &mut Clients,
        registry: &Registry,
        next_token: &mut usize,
        token: Token,
    ) -> Option<Launched> {
        let pid = *self.reports.get(&token)?;
        let starting = self.starting.get_mut(&pid)?;
        let fd = starting.report.as_raw_fd();
        let outcome = match crate::sys::spawn::read_report(fd, Some(&mut starting.memory)) {
            Report::Pending => return None,
            Report::Execd => Ok(()),
            Report::Failed(at, e) => Err((at, e)),
        };
        let s = self.starting.remove(&pid)?;
        self.forget_report(registry, &s);
        core.table.reserve_start(s.launch.peer.uid, false);
        if let Err((at, e)) = outcome {
            self.contain.abandon(s.place);
            core.unpromise_start(s.key);
            // The child exits after its report: keep what it reads until it is reaped.
            if s.exit.is_none() {
                self.failed.insert(pid, s.memory);
            }
            // A directory that does not exist, or is not one, is the request's mistake
            // (`-32602` naming the field, PROTOCOL 3); anything else the child met
            // entering it (permission after the user switch, I/O) is a spawn failure.
            let not_a_dir = matches!(e.raw_os_error(), Some(libc::ENOENT | libc::ENOTDIR));
            let err = match at {
                FailedAt::Cwd if not_a_dir => RpcError::invalid_params(
                    s.launch.cwd_field,
                    format!("{:?}: {}", s.launch.cwd, rpc::os_error_text(&e)),
                ),
                FailedAt::Sandbox(step) => {
                    let memory = self.failed.get(&pid).or(None);
                    sandbox_error(&s.launch, step, &e, memory)
                }
                _ => spawn_error(core, &s.launch, &e),
            };
            return Some(Launched::of((s.token, s.req, s.launch), Err(err)));
        }
        // It exec'd: its memory is its own now, and ours to free.
        drop(s.memory);
        let key = s.key;
        // From here the tree is held: whatever fails next, it can be ended.
        self.contain.started(key, pid, s.place);
        if let Some(input) = s.ends.input {
            self.inputs.insert(key, input);
        }
        let outs: Vec<_> = std::iter::once(s.ends.out).chain(s.ends.err).collect();
        let inputs = (s.ends.stdin, s.ends.commands);
        let added = self.pipes.add(registry, key, outs, inputs, || {
            let t = Token(*next_token);
            *next_token += 1;
            t
        });
        if let Err(e) = added {
            // Cannot watch its output: do not leave it running unobserved. Its hold is let
            // go when the leader is reaped.
            self.contain.end(key, &s.id, Stage::Kill, true);
            crate::sys::reap::signal_group(pid, libc::SIGKILL);
            if s.exit.is_some() {
                self.contain.leader_exited(key); // already reaped: only its hold is left
            } else {
                self.abandoned.insert(pid, key);
            }
            core.unpromise_start(key);
            let e = RpcError::internal(format!("registering a pipe: {e}"));
            return Some(Launched::of((s.token, s.req, s.launch), Err(e)));
        }
        core.started(&s.launch, key, s.id, pid, s.runs_as);
        if let Some(path) = s.ends.tty_path {
            core.tty_path(key, path);
        }
        // A command started while the daemon stops is ended with the rest.
        if core.stopping {
            core.kill(key, KillReason::Shutdown);
        }
        // It may have exited, and been reaped, before its report was read.
        if let Some(exit) = s.exit {
            self.publish_exit(core, clients, registry, key, exit);
        }
        Some(Launched::of((s.token, s.req, s.launch), Ok(key)))
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
                // A shell's end marker: where it is now is read before anything else this
                // turn (a request judged next must not be shown the last directory).
                core.out
                    .iter()
                    .any(|e| matches!(e, crate::core::Effect::ShellDir { .. }))
            }
            Some(Source::Stdin { key }) => self.flush_stdin(core, registry, key),
            Some(Source::Commands { key }) => {
                self.flush_commands(core, registry, key);
                false
            }
            None => false, // a source closed earlier this turn
        }
    }

    /// Whether a pipe was left readable last turn: the loop polls without sleeping.
    pub fn busy(&self) -> bool {
        !self.hot.set.is_empty()
    }

    /// Reads again the pipes left readable after their budget.
    pub fn service_hot(&mut self, core: &mut Core, clients: &mut Clients, registry: &Registry) {
        for pipe in std::mem::take(&mut self.hot.order) {
            if self.hot.set.remove(&pipe) {
                self.read_pipe(core, clients, registry, pipe, PIPE_BYTES_PER_TURN, false);
            }
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
            if self.scratch.is_empty() {
                self.scratch = vec![0; SCRATCH];
            }
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
        if exhausted {
            self.hot.add((key, stream));
        }
        if eof {
            self.hot.set.remove(&(key, stream));
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
                self.hot.add((key, s));
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

    /// Writes what waits for a shell's command channel as far as the socket takes it.
    pub fn flush_commands(&mut self, core: &mut Core, registry: &Registry, key: Key) {
        let Some(c) = core.table.get_mut(key).and_then(|p| p.commands.as_mut()) else {
            return;
        };
        if !c.open {
            return;
        }
        if self.pipes.flush_commands(registry, key, c) == Flushed::Closed {
            c.close();
        }
    }

    /// SIGINT to the foreground job of a shell's terminal unless it is the group
    /// `spared`; the core is told where it went. A terminal already closed (the shell
    /// ended) has no job to reach.
    pub fn interrupt(&mut self, core: &mut Core, key: Key, spared: Option<i32>) {
        let Some(pid) = core.table.get(key).map(|p| p.pid) else {
            return;
        };
        let Some(fd) = self.pipes.terminal_fd(key) else {
            return;
        };
        if let Ok(s) = crate::sys::pty::interrupt(fd, pid, spared) {
            if s.sent.is_some() {
                self.signalled();
            }
            core.shell_interrupted(key, s.sent, s.held);
        }
    }

    /// Discards the unread input of a shell's terminal (its prompt is shown). A terminal
    /// already closed has none.
    pub fn discard_input(&mut self, key: Key) {
        if let Some(fd) = self.pipes.terminal_fd(key) {
            let _ = crate::sys::pty::discard_input(fd);
        }
    }

    /// Reads where shell `key` is (`/proc/PID/cwd`) and hands it to the core: `logical`
    /// instead when it names the same directory (a kept symlink).
    pub fn shell_dir(&mut self, core: &mut Core, key: Key, logical: Option<PathBuf>) {
        let Some(pid) = core.table.get(key).map(|p| p.pid) else {
            return;
        };
        let dir = match logical {
            Some(l) if crate::sys::cwd::names(pid, &l) => Some(l),
            _ => crate::sys::cwd::of(pid).ok(),
        };
        core.shell_dir(key, dir);
    }

    /// Closes every pipe of a command (it was released or forgotten).
    pub fn close_pipes(&mut self, registry: &Registry, key: Key) {
        self.inputs.remove(&key);
        self.pipes.close_all(registry, key);
        for s in 0..2 {
            self.hot.set.remove(&(key, s));
        }
    }

    /// Sets the window size of a command's terminal. A terminal already closed (the
    /// command ended) has nobody to tell.
    pub fn resize(&mut self, key: Key, size: crate::types::WinSize) {
        if let Some(fd) = self.pipes.terminal_fd(key) {
            let _ = crate::sys::pty::resize(fd, size);
        }
    }

    /// Asks the reader to look at the commands the core names (running, stdin open,
    /// quiet) for one whose tree is blocked reading its input (PROTOCOL 12.3); the core is
    /// told what it saw when it answers (`hear`). A command whose last look is not
    /// answered yet is not asked about again.
    pub fn look_for_input_waits(&mut self, core: &mut Core) {
        for (key, pid) in core.input_candidates() {
            if self.looking.contains(&key) {
                continue;
            }
            match self.inputs.get(&key) {
                // Only the daemon may look (`looks_on_loop`): as before the reader, a
                // process whose memory hangs holds the loop while it is looked at.
                Some(input) if self.looks_on_loop => {
                    let waiting = crate::sys::waiting::look(pid, *input, &mut |_| true);
                    core.input_seen(key, waiting == Some(true));
                }
                Some(input) => {
                    self.reader.ask_look(key, pid, *input);
                    self.looking.insert(key);
                }
                None => core.input_seen(key, false),
            }
        }
        self.hear(core);
    }

    /// Whether the looks for input are made on the loop (see `looks_on_loop`).
    pub fn looks_on_loop(&self) -> bool {
        self.looks_on_loop
    }

    // ---- the off-loop reader -------------------------------------------------------------

    /// Whether `token` is one of the reader's pipes.
    pub fn reader_owns(&self, token: Token) -> bool {
        self.reader.owns(token)
    }

    /// One of the reader's pipes is ready: what it said is acted on.
    pub fn on_reader(&mut self, core: &mut Core, registry: &Registry, token: Token) {
        self.reader.ready(token, registry, Instant::now());
        self.hear(core);
    }

    /// Once a turn: the reader is started (or replaced), given the sweep that is due and
    /// the skipped processes whose back-off is over, and what it owes is written to it.
    pub fn step_reader(
        &mut self,
        core: &mut Core,
        registry: &Registry,
        next_token: &mut usize,
        now: Instant,
    ) {
        if let Some((me, scope)) = self.contain.sweep_next(now) {
            self.reader.ask_sweep(me, scope);
        }
        let reader = &self.reader;
        let due = self.contain.sweep_retries_due(|pid| reader.hung(pid, now));
        for (pid, start) in due {
            self.reader.ask_cookie(pid, start, Asker::Sweep);
        }
        self.reader
            .step(&mut self.spawner, registry, next_token, now);
        self.hear(core);
    }

    /// When the loop should call `step_reader` next.
    pub fn reader_due(&self, now: Instant) -> Option<Instant> {
        self.contain
            .sweep_due()
            .into_iter()
            .chain(self.reader.due(now))
            .min()
    }

    /// Kills the reader (the daemon is about to re-execute itself; the new image starts
    /// its own, and a failed `execve` starts another here at the next turn).
    pub fn stop_reader(&mut self, registry: &Registry) {
        self.reader.stop(registry);
    }

    /// Routes what the reader said: sweeps to containment (their reports to the core's
    /// log and audit), looks to the core, cookie reads to whoever asked.
    fn hear(&mut self, core: &mut Core) {
        for heard in self.reader.take_heard() {
            let now = Instant::now();
            match heard {
                Heard::Killed { pid, comm } => self.contain.sweep_killed(pid, comm),
                Heard::Swept(stats) => {
                    if let Some(s) = self.contain.sweep_done(stats, now) {
                        core.swept(&s);
                    }
                }
                Heard::SweepLost => {
                    core.log.line(format_args!(
                        "a cookie sweep could not be run (its readers failed twice); asked \
                         again"
                    ));
                    if let Some(s) = self.contain.sweep_lost(now) {
                        core.swept(&s);
                    }
                }
                Heard::Looked { key, waiting } => {
                    self.looking.remove(&key);
                    if let Some(waiting) = waiting {
                        core.input_seen(key, waiting);
                    }
                }
                Heard::Cookie {
                    asker: Asker::Sweep,
                    pid,
                    start,
                    read,
                } => {
                    if let Some(s) = self.contain.sweep_retried(pid, start, &read) {
                        core.swept(&s);
                    }
                }
                Heard::Cookie {
                    asker: Asker::Peer(token),
                    pid,
                    start,
                    read,
                } => self.peer_cookies.push((token, pid, start, read)),
                Heard::Cookie {
                    asker: Asker::Orphan,
                    pid,
                    start,
                    read,
                } => {
                    let orphan = (pid, start);
                    if self.orphans_asked.remove(&orphan) {
                        let named = match &read {
                            CookieRead::Found(value) => Some(self.contain.command_named(value)),
                            CookieRead::Absent => Some(None),
                            // Not known: asked again at the next kill that looks.
                            CookieRead::Gone | CookieRead::Denied | CookieRead::Hung => None,
                        };
                        if let Some(named) = named {
                            self.orphans_of.insert(orphan, named);
                        }
                    }
                }
                Heard::Stuck { pid, backoff } => core.log.refusal(
                    "hung processes",
                    core.now,
                    format_args!(
                        "process {pid} did not let its memory be read within {} ms (a hung \
                         file system?): the off-loop reader was replaced, and {pid} is \
                         skipped for {} s",
                        crate::sys::reader::DEADLINE.as_millis(),
                        backoff.as_secs()
                    ),
                ),
                Heard::Ended { why, again } => core.log.refusal(
                    "reader restarts",
                    core.now,
                    format_args!(
                        "the off-loop reader {why}; another is started{}",
                        if again.is_zero() {
                            String::new()
                        } else {
                            format!(" in {} ms", again.as_millis())
                        }
                    ),
                ),
            }
        }
    }

    /// Closes a command's stdin (its input was drained after an `eof`, it exited or was
    /// released), and a shell's command channel with it.
    pub fn close_stdin(&mut self, registry: &Registry, key: Key) {
        self.inputs.remove(&key);
        self.pipes.close_stdin(registry, key);
        self.pipes.close_commands(registry, key);
    }

    /// Ends `key`'s tree (command `id`), one stage (`Contain::end`). The final SIGKILL
    /// asks for a cookie sweep only when something of the tree may be alive out of its
    /// group's and cgroup's reach (`tree_may_remain`).
    pub fn end(&mut self, core: &Core, key: Key, id: &str, stage: Stage) {
        let sweep = stage == Stage::Kill && self.tree_may_remain(core, key, id);
        if self.contain.end(key, id, stage, sweep) {
            self.signalled();
        }
    }

    /// A signal went to a command's group or cgroup (or a shell's job): what it ends
    /// hands its children to the daemon, so the list read this turn no longer holds.
    pub fn signalled(&mut self) {
        self.children_seen = None;
    }

    /// An idle loop gives back what it reads pipes into (taken again at the next read).
    /// Its spares stay, asleep: killing them would wake the loop for their reap, and a
    /// client that starts a command every few seconds would pay a spare it never used.
    pub fn give_back_idle(&mut self) {
        self.scratch = Vec::new();
    }

    /// A new turn of the loop: the daemon's children are read again when next needed
    /// (processes re-parented to it since are among them then).
    pub fn new_turn(&mut self) {
        self.children_seen = None;
    }

    /// Whether anything of command `key`'s tree (command `id`) may be alive where only
    /// its cookie finds it: while its leader is not reaped, its descendants may be
    /// anywhere below it; once it is, each of them that lives is below a child of the
    /// daemon it did not start (the daemon is the subreaper every orphan of the tree
    /// goes to: the ones that left the group with `setsid` or a double fork, and their
    /// parents'). An orphan with no children of its own is just itself, and its own
    /// cookie says whether a sweep for this command would kill it; the reader reads it
    /// once per orphan (pinned by pid and start time). So the sweep, which reads every
    /// process on the host, is left out only when every orphan is childless and its
    /// cookie is known to name another command or none. It runs when an orphan has
    /// children (a server left by one command may run another command's processes, with
    /// that command's cookie), when an orphan's cookie is not known yet (not read, hung,
    /// not readable) or anything about it cannot be read, and when the kernel does not
    /// list children. A process that carries the cookie but never descended from the
    /// daemon (a server that started it with a copy of a command's environment) is found
    /// only by the sweeps that still run.
    fn tree_may_remain(&mut self, core: &Core, key: Key, id: &str) -> bool {
        if self.contain.leader_alive(key) {
            return true;
        }
        if self.children_seen.is_none() {
            let list =
                crate::sys::reap::own_children(&mut self.children_list, &mut self.scratch_list);
            self.children_seen = list.map(|l| l.into_iter().collect());
        }
        let Some(children) = &self.children_seen else {
            return true;
        };
        let mut orphans = HashSet::new();
        let mut may = false;
        for &pid in children {
            let known = core.table.by_pid(pid).is_some()
                || self.starting.get(&pid).is_some_and(|s| s.exit.is_none())
                || self.failed.contains_key(&pid)
                || self.abandoned.contains_key(&pid)
                || self.probe == Some(pid)
                || self.reader.pid() == Some(pid)
                || self.spawner.is_spare(pid);
            if known {
                continue;
            }
            // Its start time pins it (`/proc/PID/stat`: no memory lock). Only the loop
            // reaps, so a child's stat is there: one that cannot be read counts.
            let Some(start) = crate::sys::cookie::process_start(pid as u32) else {
                may = true;
                continue;
            };
            let orphan = (pid, start);
            orphans.insert(orphan);
            if crate::sys::reap::has_children(pid) != Some(false) {
                may = true;
                continue;
            }
            match self.orphans_of.get(&orphan) {
                Some(Some(named)) => may |= named == id,
                Some(None) => {}
                None => {
                    may = true;
                    if self.orphans_asked.insert(orphan) {
                        self.reader.ask_cookie(pid, start, Asker::Orphan);
                    }
                }
            }
        }
        // What is no longer a child is forgotten.
        self.orphans_of.retain(|k, _| orphans.contains(k));
        self.orphans_asked.retain(|k| orphans.contains(k));
        may
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
        // What it leaves behind is the daemon's now: the list is read again when needed.
        self.children_seen = None;
        let how = match r.ended {
            Ended::Code(c) => format!("exited with {c}"),
            Ended::Signal(s) => format!("was killed by signal {s}"),
        };
        if let Some(killed) = self.spawner.reaped(r.pid) {
            if !killed {
                core.log.line(format_args!(
                    "a spare child {} before it was used; the next start clones its own",
                    how
                ));
            }
            return ReapOutcome::Other;
        }
        if self.reader.reaped(r.pid, &how, registry, Instant::now()) {
            self.hear(core);
            return ReapOutcome::Other;
        }
        if self.probe == Some(r.pid) {
            self.probe = None;
            self.probe_ended = Some(r.ended);
            self.failed.remove(&r.pid);
            return ReapOutcome::Other;
        }
        let Some(key) = core.table.by_pid(r.pid) else {
            if let Some(key) = self.abandoned.remove(&r.pid) {
                self.contain.leader_exited(key); // killed as it started
            } else if let Some(s) = self.starting.get_mut(&r.pid) {
                // It exec'd and exited before its report was read: kept for it. It
                // shares nothing now, whether it said so or not.
                s.exit = Some((r.ended, r.usage));
                s.memory.unshared();
            } else if self.failed.remove(&r.pid).is_none() {
                self.orphans = true; // a re-parented descendant
            }
            return ReapOutcome::Other;
        };
        self.publish_exit(core, clients, registry, key, (r.ended, r.usage));
        ReapOutcome::Command
    }

    /// A command's leader exited: whatever its pipes hold now was written before the exit,
    /// so it is read first, then the exit goes to the core.
    fn publish_exit(
        &mut self,
        core: &mut Core,
        clients: &mut Clients,
        registry: &Registry,
        key: Key,
        (ended, usage): (Ended, Usage),
    ) {
        for s in 0..streams(core, key) {
            self.read_pipe(core, clients, registry, (key, s), EXIT_DRAIN_BYTES, true);
        }
        self.inputs.remove(&key);
        let tree = self.contain.leader_exited(key);
        if self.contain.holds(key) {
            core.lingers(key);
        }
        core.exited(key, ended, usage, tree);
    }
}

impl Children {
    /// What an upgrade in place carries of the commands' side: pipes and PTY masters by
    /// number, the files commands read their input from, the pipes left hot, the leaders
    /// killed as they started, containment, and the descriptor limit. Nothing is being
    /// started (the upgrade waits for spawns in flight); a child whose spawn failed and
    /// that is not reaped yet is reaped by the new image as a stranger (what it reads is
    /// in the old image's memory, which it keeps).
    pub fn carry(&self, img: &mut ServerImage) {
        img.pipes = self.pipes.carry();
        let mut inputs: Vec<(u64, InputImage)> = self
            .inputs
            .iter()
            .map(|(k, i)| {
                let input = InputImage {
                    dev: i.dev,
                    ino: i.ino,
                    tty: i.tty,
                };
                (k.0, input)
            })
            .collect();
        inputs.sort_by_key(|(k, _)| *k);
        img.inputs = inputs;
        img.hot = self
            .hot
            .order
            .iter()
            .filter(|p| self.hot.set.contains(p))
            .map(|(k, s)| (k.0, *s))
            .collect();
        let mut abandoned: Vec<(i32, u64)> =
            self.abandoned.iter().map(|(pid, k)| (*pid, k.0)).collect();
        abandoned.sort_unstable();
        img.abandoned = abandoned;
        img.contain = self.contain.carry();
        img.nofile = self.nofile.limit;
        img.nofile_raised_from = self.nofile.raised_from;
    }

    /// The state this image was carried in is taken and the numbers it came under are
    /// closed: the spawner's slots move down into them.
    pub fn carried_in(&mut self) {
        self.spawner.reserve_slots_again();
    }

    /// The commands' side `carry` described: a new spawner (its threads did not survive
    /// the `execve`), the carried pipes registered under their tokens, containment as it
    /// was.
    pub fn resume(
        cfg: &Config,
        img: &ServerImage,
        registry: &Registry,
        take: &mut dyn FnMut(std::os::fd::RawFd) -> Result<std::os::fd::OwnedFd, String>,
    ) -> Result<Children, String> {
        let nofile = crate::sys::host::Nofile {
            limit: img.nofile,
            raised_from: img.nofile_raised_from,
        };
        let mut c =
            Children::with_nofile(cfg, nofile).map_err(|e| format!("starting the spawner: {e}"))?;
        let inotify = match &img.contain.cgroups {
            Some(cg) => Some(take(cg.inotify_fd)?),
            None => None,
        };
        c.contain = Contain::resume(&img.contain, inotify)?;
        c.pipes = Pipes::resume(registry, &img.pipes, take)?;
        for (k, i) in &img.inputs {
            let input = crate::sys::waiting::InputFile {
                dev: i.dev,
                ino: i.ino,
                tty: i.tty,
            };
            c.inputs.insert(Key(*k), input);
        }
        for (k, s) in &img.hot {
            c.hot.add((Key(*k), *s));
        }
        c.abandoned = img
            .abandoned
            .iter()
            .map(|(pid, k)| (*pid, Key(*k)))
            .collect();
        Ok(c)
    }

    /// The tie of the process at the other end of Unix socket `fd`, which `SO_PEERCRED`
    /// says is `pid` (PROTOCOL 7.3): the command whose cgroup holds it, else the command
    /// (or the daemon) its chain of parents reaches; pinned, so that facts of a process
    /// that took its pid meanwhile make it `unknown` (a descendant), never an outsider.
    /// Only `/proc/PID/stat` and `/proc/PID/cgroup` are read (`sys::peer`).
    /// Also the peer's start time, as read (none when it could not be).
    pub fn tie_of(&mut self, core: &Core, fd: std::os::fd::RawFd, pid: i32) -> (Tie, Option<u64>) {
        if pid <= 0 {
            return (Tie::outside(), None);
        }
        self.tie_pinned(core, crate::sys::peer::Pinned::of_socket(fd, pid))
    }

    /// Asks the reader for the cookie of connection `token`'s peer `pid` (started at
    /// `start`): the step of the peer check that reads a process's memory, so never made
    /// on the loop. Answered through `take_peer_cookies`.
    pub fn ask_peer_cookie(&mut self, token: Token, pid: i32, start: u64) {
        self.reader.ask_cookie(pid, start, Asker::Peer(token));
    }

    /// The cookie reads answered for connections since the last call.
    pub fn take_peer_cookies(&mut self) -> Vec<(Token, i32, u64, crate::sys::cookie::CookieRead)> {
        std::mem::take(&mut self.peer_cookies)
    }

    /// The command a peer's cookie read ties it to (PROTOCOL 7.3): one of this instance's,
    /// with its tag, still known (running, or exited and not released).
    pub fn cookie_tie(&self, core: &Core, read: &crate::sys::cookie::CookieRead) -> Option<Key> {
        let crate::sys::cookie::CookieRead::Found(value) = read else {
            return None;
        };
        let id = self.contain.tied_id(value, &core.shells.secret)?;
        core.table
            .find(id, 0)
            .or_else(|| self.starting.values().find(|s| s.id == id).map(|s| s.key))
    }

    /// The tie of the process that sent a signal (`si_pid`): as `tie_of`, pinned by its
    /// start time only. A sender already gone is `unknown`.
    pub fn tie_of_sender(&mut self, core: &Core, pid: i32) -> Tie {
        if pid <= 0 {
            return Tie::outside();
        }
        self.tie_pinned(core, crate::sys::peer::Pinned::of_pid(pid))
            .0
    }

    fn tie_pinned(&mut self, core: &Core, pinned: crate::sys::peer::Pinned) -> (Tie, Option<u64>) {
        let pid = pinned.pid;
        let key_of = |id: &str| {
            core.table
                .find(id, 0)
                .or_else(|| self.starting.values().find(|s| s.id == id).map(|s| s.key))
        };
        let cgroup = self.contain.command_holding(pid).map(|id| key_of(&id));
        // A spawn whose report is not read yet already runs its program.
        let leader = |p: i32| {
            core.table
                .by_pid(p)
                .or_else(|| self.starting.get(&p).map(|s| s.key))
        };
        let daemon = std::process::id() as i32;
        let traced = crate::core::tie::trace(
            pid,
            daemon,
            cgroup,
            (leader, &mut self.outsiders),
            crate::sys::peer::stat,
        );
        if !pinned.still_same(traced.start) {
            return (Tie::unknown(), None);
        }
        (traced.tie, traced.start)
    }

    /// How the pre-flight ended, once it was reaped.
    pub fn probe_ended(&self) -> Option<Ended> {
        self.probe_ended
    }

    /// The pre-flight is no longer wanted: killed if it runs still (not reaped, so its
    /// pid is still its own).
    pub fn end_probe(&mut self) {
        if let Some(pid) = self.probe.take() {
            // Not reaped: the pid is still the pre-flight's. Reaped later as a stranger.
            let _ = crate::sys::reap::signal_pid(pid as u32, libc::SIGKILL);
        }
    }

    /// Starts `binary --upgrade-check` (PROTOCOL 13), cloned like a command but owned by
    /// no one: the caller watches its report pipe and its output (stdout and stderr
    /// together), and hands back what it reads (`probe_failed`, `probe_execd`). It runs
    /// as the daemon, in the daemon's own cgroup, with a cookie of the daemon's. A binary
    /// a caller `named` is checked by the child before it runs anything
    /// (`FailedAt::Binary`): where a hung file system holds only that child.
    pub fn probe(&mut self, binary: &str, named: bool) -> io::Result<Spawned> {
        let program = crate::types::Program::Direct {
            program: binary.to_string(),
            args: vec!["--upgrade-check".to_string()],
        };
        let spec = crate::sys::spawn::SpawnSpec {
            program: &program,
            env: &[],
            cwd: std::path::Path::new("/"),
            stdio: crate::types::Stdio3::Merged,
            user: None,
            cgroup_procs: None,
            cookie: &self.contain.cookie("upgrade-check"),
            tag: None,
            check_binary: named.then_some(self.uid),
        };
        let spawned = self.spawner.spawn_copying(&spec)?;
        self.probe = Some(spawned.pid);
        self.probe_ended = None;
        Ok(spawned)
    }

    /// The pre-flight's child failed before its exec: what it reads is kept until it is
    /// reaped.
    pub fn probe_failed(&mut self, pid: i32, memory: InFlight) {
        if self.probe == Some(pid) {
            self.failed.insert(pid, memory);
        }
    }
}

/// `-32004` "sandbox unavailable: ...".
fn unavailable_sandbox(why: &str) -> RpcError {
    crate::core::confine::unavailable(why)
}

/// The error a spawn whose child could not apply its sandbox answers.
fn sandbox_error(
    launch: &LaunchRequest,
    step: SandboxStep,
    e: &io::Error,
    memory: Option<&InFlight>,
) -> RpcError {
    let text = rpc::os_error_text(e);
    let root = |n: usize| {
        memory
            .and_then(|m| m.sandbox_root(n))
            .unwrap_or_else(|| format!("root #{n}"))
    };
    match step {
        SandboxStep::Apply => unavailable_sandbox(&format!("the kernel refused it ({text})")),
        SandboxStep::Root(n) => {
            let why = match e.raw_os_error() {
                Some(libc::EXDEV) => "it leads out of the root it lies in".to_string(),
                _ => text,
            };
            RpcError::invalid_params("sandbox", format!("{}: {why}", root(n)))
        }
        SandboxStep::Protect(n) => unavailable_sandbox(&format!(
            "{} holds a name the sandbox protects, and execd keeps protected names \
             read-only only in roots it opened itself (a workspace, $TMPDIR, the \
             operator's)",
            root(n)
        )),
        SandboxStep::Outside => RpcError::invalid_params(
            launch.cwd_field,
            format!(
                "{:?} does not lie in the workspace {} its path names (a symlink leads \
                 out of it)",
                launch.cwd,
                launch
                    .sandbox
                    .as_ref()
                    .and_then(|g| g.cwd_root.as_ref())
                    .map_or_else(String::new, |p| p.display().to_string())
            ),
        ),
    }
}

/// The error a failed spawn answers: the OS error for the program (`-32004`), logged at
/// a bounded rate.
fn spawn_error(core: &mut Core, launch: &LaunchRequest, e: &io::Error) -> RpcError {
    core.log.refusal(
        "spawn failures",
        core.now,
        format_args!(
            "could not start {:?} for uid {}: {}",
            launch.command,
            launch.peer.uid,
            rpc::os_error_text(e)
        ),
    );
    let program = match &launch.program {
        crate::types::Program::Direct { program, .. } => program.clone(),
        crate::types::Program::Shell { shell, .. } => shell.display().to_string(),
    };
    RpcError::spawn_failed(&program, e)
}

/// Pipes left readable after their turn's budget, read again at the end of the turn, in
/// the order they became so; membership is a set lookup, and a pipe taken off (EOF,
/// closed) leaves only a stale entry in `order`, skipped when it comes up.
#[derive(Debug, Default)]
struct Hot {
    order: Vec<(Key, usize)>,
    set: HashSet<(Key, usize)>,
}

impl Hot {
    fn add(&mut self, pipe: (Key, usize)) {
        if self.set.insert(pipe) {
            self.order.push(pipe);
        }
    }
}

/// A finished spawn: the request it answers, and how the launch went.
pub struct Launched {
    pub token: Token,
    pub req: Option<ReqNo>,
    pub launch: Box<LaunchRequest>,
    pub started: Result<Key, RpcError>,
}

impl Launched {
    fn of(
        (token, req, launch): (Token, Option<ReqNo>, Box<LaunchRequest>),
        started: Result<Key, RpcError>,
    ) -> Launched {
        Launched {
            token,
            req,
            launch,
            started,
        }
    }
}

/// A spawn whose child has not reported yet.
struct Starting {
    /// The connection and request it answers.
    token: Token,
    req: Option<ReqNo>,
    launch: Box<LaunchRequest>,
    key: Key,
    id: String,
    place: Option<Place>,
    ends: ParentEnds,
    runs_as: u32,
    /// Its report pipe and the token it is watched under.
    report: OwnedFd,
    report_token: Token,
    /// What the child reads until it execs.
    memory: InFlight,
    /// It was reaped before its report was read (a command that ran and ended at once).
    exit: Option<(Ended, Usage)>,
}
