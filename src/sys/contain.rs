//! How a command's process tree is held and ended (PROTOCOL.md sections 3, 9 and 14): in a
//! cgroup of its own where the kernel and the host allow it, else by its process group;
//! and, either way, by the `EXECD_TREE` cookie in its environment (`sys::cookie`), which
//! finds what left the group, and what a SIGKILLed daemon left, again.
//!
//! The core decides *when* a tree is signalled (`Effect::End`); this module decides
//! *what* that reaches and makes sure it never reaches anything else.
//!
//! Invariants:
//! - Every command leads its own session and process group. The polite SIGTERM always
//!   goes to that group; the final SIGKILL goes to the command's cgroup (`cgroup.kill`)
//!   when it has one, which also reaches what left the group (`setsid`, double forks).
//! - A group number is signalled only while it is known to be ours: while its leader
//!   runs (no other group can take the number of a live process), or after the leader's
//!   exit while the group is known to still have members. Group numbers are free for reuse
//!   once a group empties, so a group found empty is never signalled again.
//! - A command cgroup is created (with its limits) before the spawn and joined by the
//!   child before `execve`; it is removed once the leader has been reaped and its tree
//!   is empty: at the reap for most commands, else when `cgroup.events`, watched with
//!   inotify from the reap on, says it emptied. (Watched from the start, it would wake
//!   the loop at the child's join and cost two more system calls per command, for
//!   events nothing acts on while the leader runs.)
//! - The final SIGKILL of a command (the end of a kill's grace, `bash/kill` SIGKILL, the
//!   end of a release) also asks for a cookie sweep of that command, whether or not its
//!   group or cgroup is still held: what left both is found by its cookie alone. With
//!   cgroups the sweep runs too (a second net: a root command may move itself out of its
//!   cgroup). The caller leaves the sweep out when nothing of the tree can be alive
//!   (`server::children`: its leader was reaped, and every child of the daemon it did
//!   not start, the orphans every tree's escapees hang below, is childless and carries
//!   no cookie of this command): a sweep reads every process on the host, and most
//!   commands leave nothing. Shutdown sweeps every command of this instance once;
//!   start sweeps what earlier instances on the same socket left. Sweeps are only asked
//!   for here: the off-loop reader runs them (`server::reader`), and the loop hands this
//!   module what it said (`sweep_next`, `sweep_killed`, `sweep_done`, ...).

use std::collections::{BTreeSet, HashMap};

use crate::types::Stage;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::path::PathBuf;

use crate::core::table::Key;
use crate::sys::cgroup::{self, Cgroup, CreateError, Fallback, Tree};
use crate::sys::cookie::{CookieRead, Instance, Scope, SweepStats, Sweeper, SweepsCarried};
use crate::types::CgroupLimits;
use crate::types::Leftovers;
use crate::types::Mode;
use crate::types::Swept;
use crate::types::TreeUsage;
use crate::wire::state::{
    Bytes, CgroupsImage, ContainImage, FallbackImage, HoldImage, SweepRetryImage,
};

/// A command cgroup made for a spawn: the child joins it through `procs`.
#[derive(Debug)]
pub struct Place {
    cgroup: Cgroup,
    procs: OwnedFd,
}

impl Place {
    /// The `cgroup.procs` descriptor the child writes `0` to before `execve`.
    pub fn procs_fd(&self) -> RawFd {
        self.procs.as_raw_fd()
    }
}

/// What is known of one command's tree.
#[derive(Debug)]
struct Hold {
    pgid: i32,
    /// The leader has not been reaped.
    leader_alive: bool,
    /// The group may still have members: true while the leader runs, then as last seen.
    /// Once false, never true again: its number may belong to someone else now.
    group_alive: bool,
    cgroup: Option<Cgroup>,
    /// Its inotify watch on `cgroup.events`: from the leader's reap on, while the tree
    /// outlives it. (Older images watched from the start; a hold they carried keeps its
    /// watch.)
    wd: Option<i32>,
}

/// Cgroup containment in use.
#[derive(Debug)]
struct Cgroups {
    tree: Tree,
    inotify: OwnedFd,
    watches: HashMap<i32, Key>,
}

/// Every tree the daemon still holds, and how it holds them.
#[derive(Debug, Default)]
pub struct Contain {
    holds: HashMap<Key, Hold>,
    /// Holds whose leader was reaped and whose tree still has members: the only ones a
    /// reaped orphan can have emptied (the rest are not looked at).
    lingering: BTreeSet<Key>,
    cgroups: Option<Cgroups>,
    /// Why cgroups are not used, when they are not.
    fallback: Option<Fallback>,
    /// This run's cookie and its sweeps.
    cookies: Sweeper,
    /// The daemon's own `/proc/self/cgroup` (its `daemon` leaf), read once it is needed
    /// (after the daemon moved there).
    own_cgroup: std::cell::OnceCell<Option<String>>,
}

/// A limit the request or the flags ask for that containment cannot enforce.
#[derive(Debug, Clone, PartialEq)]
pub struct Unavailable(pub &'static str);

impl Contain {
    /// Process groups only (and the cookie), for the reason given.
    fn groups(why: Fallback, instance: Instance) -> Contain {
        Contain {
            fallback: Some(why),
            cookies: Sweeper::new(instance),
            ..Contain::default()
        }
    }

    /// Chooses containment as `--cgroup` says (section 9): a delegated cgroup v2 tree, set
    /// up with the daemon moved into its `daemon` leaf, or process groups with the reason;
    /// the cookie names `instance` either way. Also returns what a previous instance left
    /// in that tree, killed and removed now.
    pub fn choose(mode: &Mode, instance: Instance) -> (Contain, Option<Leftovers>) {
        let (mount, own) = cgroup::locate_self();
        let me = std::process::id();
        let root = match cgroup::choose_root(mode, mount.as_deref(), own.as_deref(), me) {
            Ok(root) => root,
            Err(why) => return (Contain::groups(why, instance), None),
        };
        let setup = Tree::setup(&root, me).and_then(|tree| {
            let inotify = crate::sys::inotify::inotify_init()?;
            Ok((tree, inotify))
        });
        match setup {
            Ok((tree, inotify)) => {
                let leftovers = tree.sweep_leftovers();
                let c = Contain {
                    cgroups: Some(Cgroups {
                        tree,
                        inotify,
                        watches: HashMap::new(),
                    }),
                    cookies: Sweeper::new(instance),
                    ..Contain::default()
                };
                (c, Some(leftovers))
            }
            Err(e) => (
                Contain::groups(Fallback::Setup(e.to_string()), instance),
                None,
            ),
        }
    }

    /// What is in use, for logs, `initialize` and `execctl status`.
    pub fn describe(&self) -> String {
        const COOKIE: &str = "process groups + the EXECD_TREE cookie (a process that clears \
                              its environment, or changes to a uid execd may not signal, \
                              still escapes)";
        match (&self.cgroups, &self.fallback) {
            (Some(c), _) => format!(
                "cgroup {} (controllers: {}) + the EXECD_TREE cookie",
                c.tree.root().display(),
                c.tree.controllers()
            ),
            (None, Some(why)) => format!("{COOKIE}: {why}"),
            (None, None) => COOKIE.into(),
        }
    }

    /// What is in use, short (the log's start line): the cgroup tree, or process groups
    /// with the cookie; and, without cgroups, why and how to get them (nothing more when
    /// the operator chose it: `--cgroup off`).
    pub fn summary(&self) -> (String, Option<String>) {
        match (&self.cgroups, &self.fallback) {
            (Some(c), _) => (
                format!("cgroup {} + the EXECD_TREE cookie", c.tree.root().display()),
                None,
            ),
            (None, why) => (
                "process groups + the EXECD_TREE cookie".to_string(),
                why.as_ref()
                    .filter(|w| !matches!(w, Fallback::Off))
                    .map(|w| format!("no cgroups: {w}")),
            ),
        }
    }

    /// This run's instance, as every command's cookie names it.
    pub fn instance(&self) -> String {
        self.cookies.instance().to_string()
    }

    /// The command of this instance cookie `value` names (any tag or none: what a sweep
    /// goes by), if it names one.
    pub fn command_named(&self, value: &[u8]) -> Option<String> {
        let (instance, id) = crate::sys::cookie::parse_cookie(value)?;
        if instance != *self.cookies.instance() {
            return None;
        }
        std::str::from_utf8(id).ok().map(str::to_string)
    }

    /// The `EXECD_TREE` value of command `id`.
    pub fn cookie(&self, id: &str) -> String {
        self.cookies.instance().cookie(id)
    }

    /// The command id cookie `value` ties its process to (PROTOCOL 7.3).
    pub fn tied_id<'a>(&self, value: &'a [u8], secret: &[u8; 32]) -> Option<&'a str> {
        crate::sys::cookie::tied_id(value, self.cookies.instance(), secret)
    }

    /// The id of the command whose cgroup holds process `pid` (PROTOCOL 7.3), with cgroup
    /// containment; None when it is in no command cgroup, or cgroups are not in use.
    pub fn command_holding(&self, pid: i32) -> Option<String> {
        self.cgroups.as_ref()?;
        let own = self
            .own_cgroup
            .get_or_init(crate::sys::peer::own_cgroup)
            .as_deref()?;
        cgroup::command_of(&crate::sys::peer::cgroup(pid)?, own)
    }

    /// The kind in use: `cgroup` or `process-group`.
    pub fn kind(&self) -> &'static str {
        if self.cgroups.is_some() {
            "cgroup"
        } else {
            "process-group"
        }
    }

    /// The inotify descriptor the loop registers (cgroup containment only).
    pub fn events_fd(&self) -> Option<RawFd> {
        self.cgroups.as_ref().map(|c| c.inotify.as_raw_fd())
    }

    /// Whether `limits` can be enforced at all: each needs its controller.
    pub fn check(&self, limits: &CgroupLimits) -> Result<(), Unavailable> {
        let c = self
            .cgroups
            .as_ref()
            .map(|c| *c.tree.controllers())
            .unwrap_or_default();
        for (asked, on, controller) in [
            (limits.memory_max.is_some(), c.memory, "memory"),
            (limits.pids_max.is_some(), c.pids, "pids"),
            (limits.cpu_max.is_some(), c.cpu, "cpu"),
        ] {
            if asked && !on {
                return Err(Unavailable(controller));
            }
        }
        Ok(())
    }

    /// Makes the place a command named `name` will run in, with its limits, before the
    /// spawn: its own cgroup, or nothing (process groups; any limit is then refused).
    pub fn prepare(
        &mut self,
        name: &str,
        limits: &CgroupLimits,
    ) -> Result<Option<Place>, PrepareError> {
        self.check(limits).map_err(PrepareError::Unavailable)?;
        let Some(c) = &self.cgroups else {
            return Ok(None);
        };
        let cgroup = c.tree.create(name, limits).map_err(|e| match e {
            CreateError::Unavailable(what) => PrepareError::Unavailable(Unavailable(what)),
            CreateError::Io(e) => PrepareError::Io(e),
        })?;
        match cgroup.procs_fd() {
            Ok(procs) => Ok(Some(Place { cgroup, procs })),
            Err(e) => {
                let _ = cgroup.remove();
                Err(PrepareError::Io(e))
            }
        }
    }

    /// A spawn that was prepared for did not happen: its empty cgroup goes.
    pub fn abandon(&mut self, place: Option<Place>) {
        if let Some(p) = place {
            let _ = p.cgroup.remove();
        }
    }

    /// A command started: its leader `pid` leads group `pid`, in `place` if it has one.
    pub fn started(&mut self, key: Key, pid: i32, place: Option<Place>) {
        let mut hold = Hold {
            pgid: pid,
            leader_alive: true,
            group_alive: true,
            cgroup: None,
            wd: None,
        };
        if self.cgroups.is_some() {
            hold.cgroup = place.map(|p| p.cgroup);
        }
        self.holds.insert(key, hold);
    }

    /// The leader was reaped: the whole tree's figures, and from now on the tree is held
    /// only while it has members.
    pub fn leader_exited(&mut self, key: Key) -> Option<TreeUsage> {
        let memory = self
            .cgroups
            .as_ref()
            .is_some_and(|c| c.tree.controllers().memory);
        let h = self.holds.get_mut(&key)?;
        h.leader_alive = false;
        let usage = h.cgroup.as_ref().map(|cg| {
            let s = cg.stats(memory);
            TreeUsage {
                cpu_ms: s.cpu_ms,
                memory_peak_kb: s.memory_peak_kb,
                oom_killed: s.oom_kills.is_some_and(|n| n > 0),
            }
        });
        self.forget_if_empty(key);
        if self.holds.contains_key(&key) {
            self.lingering.insert(key);
            // The tree outlives its leader: from now on its cgroup's emptying is watched,
            // and looked at once more, since it may have emptied before the watch began.
            if self.watch(key) {
                self.forget_if_empty(key);
            }
        }
        usage
    }

    /// Watches `key`'s cgroup's `cgroup.events`, unless it is watched already (a hold an
    /// earlier image carried) or has no cgroup. Whether a watch was added. Without one
    /// (inotify's limit reached), the tree is looked at again only when an orphan is
    /// reaped, as with process groups.
    fn watch(&mut self, key: Key) -> bool {
        let (Some(h), Some(c)) = (self.holds.get_mut(&key), self.cgroups.as_mut()) else {
            return false;
        };
        let Some(cg) = h.cgroup.as_ref().filter(|_| h.wd.is_none()) else {
            return false;
        };
        let Ok(wd) = crate::sys::inotify::inotify_add_watch(
            &c.inotify,
            &cg.events_path(),
            crate::sys::inotify::IN_MODIFY,
        ) else {
            return false;
        };
        c.watches.insert(wd, key);
        h.wd = Some(wd);
        true
    }

    /// Whether `key`'s tree is still held: its leader runs, or its group or cgroup had
    /// members when last looked at.
    pub fn holds(&self, key: Key) -> bool {
        self.holds.contains_key(&key)
    }

    /// A re-parented descendant was reaped: groups that lost their last member are
    /// forgotten, so their numbers, free for reuse now, are never signalled.
    pub fn orphan_reaped(&mut self) {
        let keys: Vec<Key> = self.lingering.iter().copied().collect();
        for key in keys {
            self.forget_if_empty(key);
        }
    }

    /// `cgroup.events` of some command cgroups changed: the empty ones whose leaders were
    /// reaped are removed.
    pub fn on_cgroup_events(&mut self) {
        let Some(c) = &self.cgroups else { return };
        let wds = crate::sys::inotify::read_events(&c.inotify).unwrap_or_default();
        let keys: Vec<Key> = if wds.contains(&crate::sys::inotify::OVERFLOW_WD) {
            self.holds.keys().copied().collect()
        } else {
            wds.iter()
                .filter_map(|wd| c.watches.get(wd).copied())
                .collect()
        };
        for key in keys {
            self.forget_if_empty(key);
        }
    }

    /// Drops `key`'s hold once its leader is reaped and its tree is empty, removing its
    /// cgroup.
    fn forget_if_empty(&mut self, key: Key) {
        let Some(h) = self.holds.get_mut(&key) else {
            return;
        };
        if h.leader_alive {
            return;
        }
        // With a cgroup, its `populated` decides, and the group is looked at only for a
        // tree that stays held (a later SIGTERM goes to the group while it may have
        // members): a hold dropped now needs no probe. A cgroup that is gone is empty;
        // one that cannot be read now (out of descriptors) is kept, to be looked at
        // again, rather than dropped with members the final SIGKILL could not reach.
        let alive = h.cgroup.as_ref().map(|cg| match cg.populated() {
            Ok(populated) => populated,
            Err(e) => e.kind() != std::io::ErrorKind::NotFound,
        });
        if alive != Some(false) {
            h.group_alive = h.group_alive && crate::sys::reap::group_exists(h.pgid);
        }
        if alive.unwrap_or(h.group_alive) {
            return;
        }
        self.lingering.remove(&key);
        if let Some(h) = self.holds.remove(&key) {
            if let (Some(wd), Some(c)) = (h.wd, self.cgroups.as_mut()) {
                c.watches.remove(&wd);
                let _ = crate::sys::inotify::inotify_rm_watch(&c.inotify, wd);
            }
            if let Some(cg) = &h.cgroup {
                // Empty now, so the kernel lets it go; a failure leaves a directory that
                // the next start sweeps.
                let _ = cg.remove();
            }
        }
    }

    /// Ends `key`'s tree (command `id`), one stage: SIGTERM to its group, or SIGKILL to
    /// all that is left of it (its cgroup, else its group, and, when `sweep`, at the next
    /// sweep whatever carries its cookie, held or not). Whether a signal went out now.
    pub fn end(&mut self, key: Key, id: &str, stage: Stage, sweep: bool) -> bool {
        match stage {
            Stage::Term => self.signal(key, libc::SIGTERM),
            Stage::Kill => {
                let sent = self.kill_held(key);
                if sweep {
                    self.cookies.ask(id);
                }
                sent
            }
        }
    }

    /// Whether `key`'s leader has not been reaped yet.
    pub fn leader_alive(&self, key: Key) -> bool {
        self.holds.get(&key).is_some_and(|h| h.leader_alive)
    }

    /// Sends `sig` to `key`'s process group (a `bash/kill`, or the polite SIGTERM), if it
    /// may have members: whether it was sent.
    pub fn signal(&mut self, key: Key, sig: i32) -> bool {
        let Some(h) = self.holds.get(&key) else {
            return false;
        };
        let alive = h.leader_alive || (h.group_alive && crate::sys::reap::group_exists(h.pgid));
        if alive {
            crate::sys::reap::signal_group(h.pgid, sig);
        }
        alive
    }

    /// Whether any tree still has members (the leader counts until reaped), or a cookie
    /// sweep runs or waits to.
    pub fn any_left(&mut self) -> bool {
        self.orphan_reaped();
        !self.holds.is_empty() || self.cookies.busy()
    }

    /// SIGKILL to everything still held, and one sweep of every command's cookie (the
    /// last step of a shutdown).
    pub fn kill_all(&mut self) {
        let keys: Vec<Key> = self.holds.keys().copied().collect();
        for key in keys {
            self.kill_held(key);
        }
        self.cookies.ask_every();
    }

    /// The final SIGKILL to what is held of `key`'s tree: its cgroup, else its group.
    /// Whether it went out.
    fn kill_held(&mut self, key: Key) -> bool {
        let Some(h) = self.holds.get(&key) else {
            return false;
        };
        match &h.cgroup {
            Some(cg) => cg.kill().is_ok(),
            None => self.signal(key, libc::SIGKILL),
        }
    }

    // ---- cookie sweeps -------------------------------------------------------------------

    /// At start: what earlier instances on this socket path left (by their cookies) is
    /// swept, first of all.
    pub fn ask_earlier(&mut self) {
        self.cookies.ask_earlier();
    }

    /// When the loop should look for a sweep to hand the reader (None: none asked, or one
    /// runs).
    pub fn sweep_due(&self) -> Option<std::time::Instant> {
        self.cookies.due()
    }

    /// The next sweep for the reader, when one is asked and may start.
    pub fn sweep_next(&mut self, now: std::time::Instant) -> Option<(Instance, Scope)> {
        let me = *self.cookies.instance();
        self.cookies.next(now).map(|scope| (me, scope))
    }

    /// The sweep under way killed `pid`.
    pub fn sweep_killed(&mut self, pid: i32, comm: String) {
        self.cookies.killed(pid, comm);
    }

    /// The sweep under way ended: its report.
    pub fn sweep_done(&mut self, stats: SweepStats, now: std::time::Instant) -> Option<Swept> {
        self.cookies.done(stats, now)
    }

    /// The sweep under way could not be run: asked again later; what it killed.
    pub fn sweep_lost(&mut self, now: std::time::Instant) -> Option<Swept> {
        self.cookies.lost(now)
    }

    /// Processes a sweep skipped whose cookies may be read again now.
    pub fn sweep_retries_due(&mut self, hung: impl Fn(i32) -> bool) -> Vec<(i32, u64)> {
        if !self.cookies.retrying() {
            return Vec::new();
        }
        self.cookies.retries_due(hung)
    }

    /// A skipped process's cookie, read again: what became of it.
    pub fn sweep_retried(&mut self, pid: i32, start: u64, read: &CookieRead) -> Option<Swept> {
        self.cookies.retried(pid, start, read)
    }

    /// Whether a sweep runs or waits to (not counting processes to read again).
    pub fn sweeping(&self) -> bool {
        self.cookies.busy()
    }
}

impl Contain {
    /// What an upgrade in place carries: every hold, the cgroup tree with its inotify
    /// descriptor and watches (by number), why cgroups are not used, the cookie instance
    /// and the sweeps asked for.
    ///
    /// A hold whose leader runs is carried without a watch. An image from before
    /// watches began at the reap (a downgrade) adds none there; it still finds such a
    /// tree empty when it reaps the tree's last orphan (execd is the subreaper), so only
    /// a tree whose last process is reaped by a parent outside its cgroup keeps the
    /// cgroup until the next start sweeps it.
    pub fn carry(&self) -> ContainImage {
        let mut holds: Vec<HoldImage> = self
            .holds
            .iter()
            .map(|(key, h)| HoldImage {
                key: key.0,
                pgid: h.pgid,
                leader_alive: h.leader_alive,
                group_alive: h.group_alive,
                cgroup: h
                    .cgroup
                    .as_ref()
                    .map(|c| Bytes::of_os(c.path().as_os_str())),
                wd: h.wd,
            })
            .collect();
        holds.sort_by_key(|h| h.key);
        let cgroups = self.cgroups.as_ref().map(|c| {
            let mut watches: Vec<(i32, u64)> = c.watches.iter().map(|(wd, k)| (*wd, k.0)).collect();
            watches.sort_unstable();
            let on = c.tree.controllers();
            CgroupsImage {
                root: Bytes::of_os(c.tree.root().as_os_str()),
                memory: on.memory,
                pids: on.pids,
                cpu: on.cpu,
                inotify_fd: c.inotify.as_raw_fd(),
                watches,
            }
        });
        let SweepsCarried {
            asked: sweep_asked,
            every,
            earlier: sweep_earlier,
            retries,
        } = self.cookies.carry();
        ContainImage {
            holds,
            lingering: self.lingering.iter().map(|k| k.0).collect(),
            cgroups,
            fallback: self.fallback.as_ref().map(|f| match f {
                Fallback::Off => FallbackImage::Off,
                Fallback::NoCgroup2 => FallbackImage::NoCgroup2,
                Fallback::RootCgroup => FallbackImage::RootCgroup,
                Fallback::Shared { others } => FallbackImage::Shared { others: *others },
                Fallback::NotWritable(w) => FallbackImage::NotWritable(w.clone()),
                Fallback::Taken { pid } => FallbackImage::Taken { pid: *pid },
                Fallback::Setup(w) => FallbackImage::Setup(w.clone()),
            }),
            instance: self.cookies.instance().to_string(),
            sweep_asked,
            sweep_every: every.to_string(),
            sweep_earlier,
            sweep_retries: retries
                .into_iter()
                .map(|(pid, start, scope)| SweepRetryImage {
                    pid,
                    start,
                    ids: scope.ids.into_iter().collect(),
                    every: scope.every,
                    earlier: scope.earlier,
                })
                .collect(),
        }
    }

    /// The containment `carry` described, with its inotify descriptor when it uses
    /// cgroups. Nothing is swept: every hold is this daemon's own.
    pub fn resume(img: &ContainImage, inotify: Option<OwnedFd>) -> Result<Contain, String> {
        let me = Instance::parse(img.instance.as_bytes())
            .ok_or_else(|| format!("cookie instance {:?}", img.instance))?;
        let every = ["no", "asked", "done"]
            .into_iter()
            .find(|e| *e == img.sweep_every)
            .ok_or_else(|| format!("cookie sweep state {:?}", img.sweep_every))?;
        let carried = SweepsCarried {
            asked: img.sweep_asked.clone(),
            every,
            earlier: img.sweep_earlier,
            retries: img
                .sweep_retries
                .iter()
                .map(|r| {
                    let scope = Scope {
                        ids: r.ids.iter().cloned().collect(),
                        every: r.every,
                        earlier: r.earlier,
                    };
                    (r.pid, r.start, scope)
                })
                .collect(),
        };
        let cookies = Sweeper::resume(me, &carried)
            .ok_or_else(|| format!("cookie sweep state {:?}", img.sweep_every))?;
        let cgroups = match (&img.cgroups, inotify) {
            (None, _) => None,
            (Some(_), None) => return Err("cgroups without their inotify descriptor".into()),
            (Some(c), Some(inotify)) => {
                let controllers = crate::sys::cgroup::Controllers {
                    memory: c.memory,
                    pids: c.pids,
                    cpu: c.cpu,
                };
                Some(Cgroups {
                    tree: Tree::carried(PathBuf::from(c.root.to_os()), controllers),
                    inotify,
                    watches: c.watches.iter().map(|(wd, k)| (*wd, Key(*k))).collect(),
                })
            }
        };
        Ok(Contain {
            holds: img
                .holds
                .iter()
                .map(|h| {
                    let hold = Hold {
                        pgid: h.pgid,
                        leader_alive: h.leader_alive,
                        group_alive: h.group_alive,
                        cgroup: h
                            .cgroup
                            .as_ref()
                            .map(|p| Cgroup::carried(PathBuf::from(p.to_os()))),
                        wd: h.wd,
                    };
                    (Key(h.key), hold)
                })
                .collect(),
            lingering: img.lingering.iter().copied().map(Key).collect(),
            cgroups,
            fallback: img.fallback.as_ref().map(|f| match f {
                FallbackImage::Off => Fallback::Off,
                FallbackImage::NoCgroup2 => Fallback::NoCgroup2,
                FallbackImage::RootCgroup => Fallback::RootCgroup,
                FallbackImage::Shared { others } => Fallback::Shared { others: *others },
                FallbackImage::NotWritable(w) => Fallback::NotWritable(w.clone()),
                FallbackImage::Taken { pid } => Fallback::Taken { pid: *pid },
                FallbackImage::Setup(w) => Fallback::Setup(w.clone()),
            }),
            cookies,
            own_cgroup: Default::default(),
        })
    }
}

/// Why a place for a command could not be made.
#[derive(Debug)]
pub enum PrepareError {
    /// A limit needs a controller containment does not have.
    Unavailable(Unavailable),
    /// The cgroup could not be created.
    Io(std::io::Error),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn containment_carried_by_an_upgrade_holds_the_same_trees_and_sweeps() {
        let me = Instance {
            path: 0xfeed,
            pid: 77,
            start: 12345,
        };
        let mut c = Contain::groups(Fallback::Shared { others: 2 }, me);
        // A command running, one whose leader was reaped while its group lives on, and a
        // kill whose cookie sweep is asked for and not run yet. (Pids far above any real
        // one: nothing here signals them.)
        c.started(Key(1), 3_999_001, None);
        c.started(Key(2), 3_999_002, None);
        if let Some(h) = c.holds.get_mut(&Key(2)) {
            h.leader_alive = false;
        }
        c.lingering.insert(Key(2));
        c.cookies.ask("term_2");
        let img = c.carry();
        let json = serde_json::to_vec(&img).unwrap();
        let read: ContainImage = serde_json::from_slice(&json).unwrap();
        assert_eq!(read, img);
        let back = Contain::resume(&read, None).unwrap();
        assert_eq!(back.carry(), img, "carried again, the same");
        assert_eq!(back.instance(), c.instance(), "the same cookies");
        assert_eq!(back.kind(), "process-group");
        assert_eq!(back.describe(), c.describe());
        assert!(back.cookies.busy(), "the sweep asked for is still owed");
        assert!(back.sweep_due().is_some());
        let mut bad = img.clone();
        bad.sweep_every = "sometimes".into();
        assert!(Contain::resume(&bad, None).is_err());
    }

    /// A directory of its own under the temporary directory, removed when dropped.
    struct Scratch(std::path::PathBuf);

    impl Scratch {
        fn new(tag: &str) -> Scratch {
            let dir =
                std::env::temp_dir().join(format!("execd-contain-{}-{tag}", std::process::id()));
            std::fs::create_dir_all(&dir).unwrap();
            Scratch(dir)
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    /// A cgroup-holding containment over plain directories laid out like cgroups.
    fn cgroups_on(dir: &std::path::Path) -> Contain {
        let me = Instance {
            path: 0xfeed,
            pid: 77,
            start: 12345,
        };
        Contain {
            cgroups: Some(Cgroups {
                tree: Tree::carried(dir.to_path_buf(), cgroup::Controllers::default()),
                inotify: crate::sys::inotify::inotify_init().unwrap(),
                watches: HashMap::new(),
            }),
            cookies: Sweeper::new(me),
            ..Contain::default()
        }
    }

    /// `ROOT/cmd-NAME` with the given `cgroup.events`, as the place a command starts in.
    fn place(dir: &std::path::Path, name: &str, populated: bool) -> Place {
        let path = dir.join(format!("cmd-{name}"));
        std::fs::create_dir(&path).unwrap();
        let events = format!("populated {}\nfrozen 0\n", u8::from(populated));
        std::fs::write(path.join("cgroup.events"), events).unwrap();
        std::fs::write(path.join("cpu.stat"), "usage_usec 2000\n").unwrap();
        let procs = std::fs::File::open("/dev/null").unwrap().into();
        Place {
            cgroup: Cgroup::carried(path),
            procs,
        }
    }

    #[test]
    fn a_cgroup_is_watched_only_once_its_tree_outlives_the_leader() {
        let dir = Scratch::new("watch");
        let mut c = cgroups_on(&dir.0);
        let watches = |c: &Contain| c.cgroups.as_ref().map_or(0, |g| g.watches.len());
        // Group numbers far above any real one: the group probe finds none, and nothing
        // here sends a signal.
        c.started(Key(1), 3_999_001, Some(place(&dir.0, "1", true)));
        c.started(Key(2), 3_999_002, Some(place(&dir.0, "2", false)));
        assert_eq!(watches(&c), 0, "no watch while leaders run");
        assert!(c.holds[&Key(1)].wd.is_none());

        // Empty at its leader's reap: dropped at once, never watched.
        let usage = c.leader_exited(Key(2)).expect("its figures");
        assert_eq!(usage.cpu_ms, Some(2));
        assert!(!c.holds(Key(2)));
        assert_eq!(watches(&c), 0);

        // Still populated at its leader's reap: held and watched from now on.
        c.leader_exited(Key(1)).expect("its figures");
        assert!(c.holds(Key(1)));
        assert!(c.holds[&Key(1)].wd.is_some());
        assert_eq!(watches(&c), 1);
        // An event that says nothing new keeps it.
        let events = dir.0.join("cmd-1/cgroup.events");
        std::fs::write(&events, "populated 1\nfrozen 0\n").unwrap();
        c.on_cgroup_events();
        assert!(c.holds(Key(1)));
        // Its tree empties: the event drops the hold and its watch.
        std::fs::write(&events, "populated 0\nfrozen 0\n").unwrap();
        c.on_cgroup_events();
        assert!(!c.holds(Key(1)));
        assert_eq!(watches(&c), 0);
        assert!(c.lingering.is_empty());
    }

    #[test]
    fn a_cgroup_that_cannot_be_read_is_held_and_one_that_is_gone_is_not() {
        let dir = Scratch::new("unread");
        let mut c = cgroups_on(&dir.0);
        c.started(Key(1), 3_999_003, Some(place(&dir.0, "1", true)));
        c.started(Key(2), 3_999_004, Some(place(&dir.0, "2", true)));
        // Unreadable `cgroup.events` (a directory in its place: EISDIR, as EMFILE would
        // be): it may still have members, so it is held.
        let events = dir.0.join("cmd-1/cgroup.events");
        std::fs::remove_file(&events).unwrap();
        std::fs::create_dir(&events).unwrap();
        c.leader_exited(Key(1));
        assert!(c.holds(Key(1)), "held while it cannot be read");
        // A cgroup removed under us has nothing left to hold.
        std::fs::remove_dir_all(dir.0.join("cmd-2")).unwrap();
        c.leader_exited(Key(2));
        assert!(!c.holds(Key(2)));
    }
}
