//! The filesystem side of "a cgroup per command" (PROTOCOL section 9): finding the cgroup2
//! mount and the daemon's own cgroup, deciding whether execd may use it, setting up the
//! tree under it, and creating, killing, watching, accounting and removing one command's
//! cgroup.
//!
//! Layout under the chosen ROOT:
//! ```text
//! ROOT/                  cgroup.subtree_control: +memory +pids +cpu where offered
//! ROOT/daemon/           execd itself (no processes may sit in ROOT once children
//!                        have controllers: the "no internal processes" rule)
//! ROOT/cmd-<name>/       one per command: limits written before anything runs in it
//! ROOT/<anything else>/  not ours; never read, killed or removed
//! ```
//!
//! Invariants:
//! - Only children of ROOT named with `PREFIX` are ever killed or removed; `daemon` and
//!   every other child are left alone, so a ROOT shared by mistake loses nothing foreign.
//! - A limit is refused, naming its controller, before anything is created when that
//!   controller is not enabled for ROOT's children: never silently ignored.
//! - Nothing here starts a thread, and nothing blocks the running loop for long: waits
//!   are bounded polls (`SWEEP_WAIT` for the start-up sweep, before the loop runs;
//!   `FREEZE_WAIT` for the freeze fallback); the loop learns that a cgroup emptied from
//!   an inotify watch on its `cgroup.events`.
//! - A ROOT whose `daemon` leaf holds another live process belongs to another execd and
//!   is not used: its commands are not leftovers.
//! - Parsing is pure and separate from file operations, and every file operation works
//!   against an arbitrary root, so tests run them on plain directories laid out like a
//!   cgroup.
//! - A cgroup file is written in one `write` (the kernel takes each write as one command).
//!
//! Use, in order: `locate_self` and `choose_root` (or log the `Fallback`), `Tree::setup`,
//! `Tree::sweep_leftovers`; then per command `Tree::create`, a spawn that joins it through
//! `Cgroup::procs_fd`, `Cgroup::signal` / `Cgroup::kill` to end it, `Cgroup::stats` when
//! the leader is reaped, and `Cgroup::remove` once `populated` reads 0 (at once for most
//! commands; else when an inotify watch on `Cgroup::events_path` says it changed).

use crate::types::{CgroupLimits, Leftovers, Mode};
use std::collections::HashSet;
use std::ffi::OsString;
use std::fmt;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStringExt;
use std::path::{Component, Path, PathBuf};
use std::time::{Duration, Instant};

/// The prefix of every command cgroup's name: how execd tells its own children of ROOT
/// from anything else there.
pub const PREFIX: &str = "cmd-";

/// The leaf under ROOT that holds execd itself.
pub const DAEMON: &str = "daemon";

/// The controllers execd enables for its command cgroups, when ROOT offers them.
pub const CONTROLLERS: [&str; 3] = ["memory", "pids", "cpu"];

/// `cpu.max` period: 100 ms, the kernel's default, so a percentage of one CPU is
/// `percent * 1000` microseconds of quota.
pub const CPU_PERIOD_USEC: u64 = 100_000;

/// How long `Tree::sweep_leftovers` waits in all for killed leftovers to empty: SIGKILLed
/// processes need CPU to exit, which a loaded host may not give them at once. A cgroup
/// still busy after that (a process stuck in the kernel) is kept and counted.
pub const SWEEP_WAIT: Duration = Duration::from_secs(5);

/// How long the freeze fallback waits for `frozen 1` before it signals anyway.
pub const FREEZE_WAIT: Duration = Duration::from_millis(100);

/// Between two looks at `cgroup.events` in the bounded waits above.
const POLL: Duration = Duration::from_millis(5);

/// At most this many passes over `cgroup.procs` in the freeze fallback: each pass
/// SIGKILLs the pids not yet signalled; a frozen tree needs one, an unfrozen one that
/// forks while we read it a few.
const KILL_PASSES: usize = 8;

// ---------------------------------------------------------------------------------------
// Finding the hierarchy (pure)
// ---------------------------------------------------------------------------------------

/// One cgroup2 line of mountinfo: where it is mounted, and which cgroup of the hierarchy
/// appears there ("/" unless a subtree was bind-mounted).
struct MountEntry {
    point: PathBuf,
    root: String,
}

/// The cgroup2 mount point from `/proc/self/mountinfo` text: the first line whose
/// filesystem type is `cgroup2`, with `\040`-style escapes undone.
pub fn cgroup2_mount(mountinfo: &str) -> Option<PathBuf> {
    cgroup2_entry(mountinfo).map(|m| m.point)
}

fn cgroup2_entry(mountinfo: &str) -> Option<MountEntry> {
    mountinfo.lines().find_map(|line| {
        // ID PARENT MAJ:MIN ROOT POINT OPTIONS [OPTIONAL...] - FSTYPE SOURCE SUPER
        let fields: Vec<&str> = line.split_whitespace().collect();
        let dash = fields.iter().skip(6).position(|f| *f == "-")? + 6;
        if *fields.get(dash + 1)? != "cgroup2" {
            return None;
        }
        let root = String::from_utf8(unescape(fields[3])).ok()?;
        Some(MountEntry {
            point: PathBuf::from(OsString::from_vec(unescape(fields[4]))),
            root,
        })
    })
}

/// Undoes mountinfo's octal escapes (`\040` space, `\011` tab, `\012` newline, `\134`
/// backslash); anything else is kept as it is.
fn unescape(field: &str) -> Vec<u8> {
    let b = field.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let octal = b.get(i + 1..i + 4).filter(|d| {
            b[i] == b'\\' && d[0] <= b'3' && d.iter().all(|c| (b'0'..=b'7').contains(c))
        });
        match octal {
            Some(d) => {
                out.push((d[0] - b'0') * 64 + (d[1] - b'0') * 8 + (d[2] - b'0'));
                i += 4;
            }
            None => {
                out.push(b[i]);
                i += 1;
            }
        }
    }
    out
}

/// The v2 cgroup path of a process from `/proc/PID/cgroup` text (its `0::` line), e.g.
/// `/system.slice/execd.service`. None on a v1-only system.
pub fn own_cgroup(proc_cgroup: &str) -> Option<String> {
    proc_cgroup
        .lines()
        .find_map(|l| l.strip_prefix("0::"))
        .map(str::to_string)
}

/// The command whose cgroup holds a process, from its `/proc/PID/cgroup` text and the
/// daemon's own (`own`, which names `ROOT/daemon` while cgroups are in use): the `<name>`
/// of `ROOT/cmd-<name>` when the process is in it or below it, else None. Both texts are
/// read by the daemon, so they name cgroups the same way (its cgroup namespace).
pub fn command_of(proc_cgroup: &str, own: &str) -> Option<String> {
    let own = own_cgroup(own)?;
    let root = own.strip_suffix(&format!("/{DAEMON}"))?;
    let path = own_cgroup(proc_cgroup)?;
    let rest = path.strip_prefix(root)?.strip_prefix('/')?;
    let first = rest.split('/').next()?;
    let name = first.strip_prefix(PREFIX)?;
    (!name.is_empty()).then(|| name.to_string())
}

/// The mount and the daemon's cgroup relative to it, as `choose_root` takes them, from
/// mountinfo and `/proc/self/cgroup` text. A bind-mounted subtree shows the cgroup named in
/// its mountinfo root at its mount point, so that prefix is taken off the cgroup path; a
/// cgroup outside the mounted subtree is not reachable (None).
pub fn locate(mountinfo: &str, proc_cgroup: &str) -> (Option<PathBuf>, Option<String>) {
    let Some(mount) = cgroup2_entry(mountinfo) else {
        return (None, None);
    };
    let own = own_cgroup(proc_cgroup).and_then(|own| {
        if mount.root == "/" {
            return Some(own);
        }
        let rest = own.strip_prefix(mount.root.trim_end_matches('/'))?;
        match rest {
            "" => Some("/".to_string()),
            r if r.starts_with('/') => Some(r.to_string()),
            _ => None,
        }
    });
    (Some(mount.point), own)
}

/// `locate` over this process's own `/proc/self/mountinfo` and `/proc/self/cgroup`.
pub fn locate_self() -> (Option<PathBuf>, Option<String>) {
    let mountinfo = fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let cgroup = fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
    locate(&mountinfo, &cgroup)
}

// ---------------------------------------------------------------------------------------
// Choosing ROOT
// ---------------------------------------------------------------------------------------

/// Why containment fell back to process groups: one sentence for the log line,
/// `initialize` and `execctl status`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fallback {
    /// `--cgroup off`.
    Off,
    /// No cgroup2 mount, or no `0::` line for the daemon (a v1-only system).
    NoCgroup2,
    /// The daemon sits in the host's root cgroup, which holds everything else too.
    RootCgroup,
    /// The daemon's cgroup holds `others` more processes (a login session, a shell).
    Shared { others: usize },
    /// This cgroup file or directory may not be written.
    NotWritable(String),
    /// ROOT's `daemon` leaf holds another process: another execd uses this ROOT, and
    /// taking it over would sweep that daemon's commands as leftovers.
    Taken { pid: u32 },
    /// Anything else that went wrong on the way, said in the text.
    Setup(String),
}

const HOW_TO_DELEGATE: &str = "falling back to process groups; to contain commands in \
cgroups, run execd as a systemd service with Delegate=yes, or pass --cgroup PATH naming a \
cgroup v2 directory execd may write";

impl fmt::Display for Fallback {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Fallback::Off => {
                // The operator chose this: no advice on delegation.
                return f.write_str("cgroup containment is off (--cgroup off)");
            }
            Fallback::NoCgroup2 => f.write_str(
                "no cgroup v2 hierarchy holding execd is mounted (see /proc/self/mountinfo and \
                 /proc/self/cgroup)",
            )?,
            Fallback::RootCgroup => f.write_str(
                "execd runs in the root cgroup, which holds the whole system and is never used",
            )?,
            Fallback::Shared { others } => write!(
                f,
                "execd's cgroup also holds {others} other process{} (a login session or a \
                 shell?), which execd must not move or kill",
                if *others == 1 { "" } else { "es" }
            )?,
            Fallback::NotWritable(what) => write!(f, "{what} is not writable by execd")?,
            Fallback::Taken { pid } => write!(
                f,
                "the cgroup's {DAEMON} leaf already holds pid {pid} (another execd?), whose \
                 commands execd must not kill"
            )?,
            Fallback::Setup(why) => write!(f, "cgroup setup failed: {why}")?,
        }
        write!(f, ", {HOW_TO_DELEGATE}")
    }
}

/// Decides ROOT (PROTOCOL 9). `mount` and `own` are what `locate` found (`own` relative to
/// the mount). `Auto` takes the daemon's own cgroup only when it is not the host's root
/// cgroup, holds no process but `self_pid`, and may be written; `Path` takes that
/// directory when it lies inside the mount, is a cgroup, is not the host's root cgroup and
/// may be written (other processes in it are the operator's choice and are never touched).
///
/// Reads only the files it names, so tests run it on plain directories.
pub fn choose_root(
    mode: &Mode,
    mount: Option<&Path>,
    own: Option<&str>,
    self_pid: u32,
) -> Result<PathBuf, Fallback> {
    match mode {
        Mode::Off => Err(Fallback::Off),
        Mode::Auto => {
            let (Some(mount), Some(own)) = (mount, own) else {
                return Err(Fallback::NoCgroup2);
            };
            let rel = Path::new(own);
            if !rel.is_absolute() || rel.components().any(|c| c == Component::ParentDir) {
                // A cgroup namespace shows a cgroup outside it as "/../..".
                return Err(Fallback::Setup(format!(
                    "execd's cgroup {own:?} is not inside the cgroup2 mount {}",
                    mount.display()
                )));
            }
            let dir = match rel.strip_prefix("/") {
                Ok(r) if r.as_os_str().is_empty() => mount.to_path_buf(),
                Ok(r) => mount.join(r),
                Err(_) => mount.join(rel),
            };
            check_cgroup_dir(&dir, dir == mount)?;
            let procs = read_file(&dir.join("cgroup.procs")).map_err(setup_failed)?;
            let others = parse_procs(&procs)
                .into_iter()
                .filter(|&p| p != self_pid)
                .count();
            if others > 0 {
                return Err(Fallback::Shared { others });
            }
            check_writable(&dir)?;
            check_not_taken(&dir, self_pid)?;
            Ok(dir)
        }
        Mode::Path(path) => {
            let mount = mount.ok_or(Fallback::NoCgroup2)?;
            let dir = fs::canonicalize(path)
                .map_err(|e| Fallback::Setup(format!("--cgroup {}: {e}", path.display())))?;
            let mount = fs::canonicalize(mount).map_err(setup_failed)?;
            if !dir.starts_with(&mount) {
                return Err(Fallback::Setup(format!(
                    "--cgroup {} is not inside the cgroup2 mount {}",
                    path.display(),
                    mount.display()
                )));
            }
            check_cgroup_dir(&dir, dir == mount)?;
            check_writable(&dir)?;
            check_not_taken(&dir, self_pid)?;
            Ok(dir)
        }
    }
}

/// A live process in `dir/daemon` other than this one is another execd using `dir` as its
/// ROOT (a daemon moves itself there, and nothing else goes there but what it clones).
/// No leaf yet, or an empty one (its daemon is gone), is free. A daemon's spare children
/// (`sys::spawn`, named `execd-spare`) sit there too and do not count: one left alone is
/// dying of its daemon's death (its parent-death signal), and a live daemon is there
/// beside its own.
fn check_not_taken(dir: &Path, self_pid: u32) -> Result<(), Fallback> {
    let Ok(procs) = fs::read_to_string(dir.join(DAEMON).join("cgroup.procs")) else {
        return Ok(());
    };
    let spare = |pid: u32| {
        fs::read(format!("/proc/{pid}/comm"))
            .is_ok_and(|c| c.strip_suffix(b"\n") == Some(super::spawn::SPARE_NAME.to_bytes()))
    };
    match parse_procs(&procs)
        .into_iter()
        .find(|&p| p != self_pid && !spare(p))
    {
        Some(pid) => Err(Fallback::Taken { pid }),
        None => Ok(()),
    }
}

fn setup_failed(e: io::Error) -> Fallback {
    Fallback::Setup(e.to_string())
}

/// `dir` must be a cgroup and, when it is the mount's top, not the host's root cgroup.
/// Every cgroup but the host's root has `cgroup.type`, so a mount's top that has one is
/// the root of a cgroup namespace (a container's own cgroup), which execd may use.
fn check_cgroup_dir(dir: &Path, mount_top: bool) -> Result<(), Fallback> {
    if !dir.join("cgroup.procs").is_file() {
        return Err(Fallback::Setup(format!(
            "{} is not a cgroup v2 directory",
            dir.display()
        )));
    }
    if mount_top && !dir.join("cgroup.type").exists() {
        return Err(Fallback::RootCgroup);
    }
    Ok(())
}

/// What execd writes in ROOT: the directory (children), `cgroup.procs` (moving itself
/// into `daemon`) and `cgroup.subtree_control`.
fn check_writable(dir: &Path) -> Result<(), Fallback> {
    for p in [
        dir.to_path_buf(),
        dir.join("cgroup.procs"),
        dir.join("cgroup.subtree_control"),
    ] {
        match crate::sys::host::writable(&p) {
            Ok(true) => {}
            Ok(false) => return Err(Fallback::NotWritable(p.display().to_string())),
            Err(e) => return Err(Fallback::Setup(format!("{}: {e}", p.display()))),
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------
// The tree under ROOT
// ---------------------------------------------------------------------------------------

/// The controllers enabled for command cgroups: a limit needs its controller.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Controllers {
    pub memory: bool,
    pub pids: bool,
    pub cpu: bool,
}

impl fmt::Display for Controllers {
    /// `memory pids cpu`, or `none`, for logs and status.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let on: Vec<&str> = [
            (self.memory, "memory"),
            (self.pids, "pids"),
            (self.cpu, "cpu"),
        ]
        .iter()
        .filter(|(on, _)| *on)
        .map(|(_, n)| *n)
        .collect();
        if on.is_empty() {
            f.write_str("none")
        } else {
            f.write_str(&on.join(" "))
        }
    }
}

/// Why a command cgroup was not created.
#[derive(Debug)]
pub enum CreateError {
    /// A limit asked for this controller, and it is not enabled for command cgroups.
    Unavailable(&'static str),
    /// A bad name or limit (`InvalidInput`), or the filesystem refused.
    Io(io::Error),
}

impl fmt::Display for CreateError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CreateError::Unavailable(c) => write!(
                f,
                "the cgroup {c} controller is not available to execd, so a {c} limit cannot \
                 be enforced"
            ),
            CreateError::Io(e) => write!(f, "cannot create the command's cgroup: {e}"),
        }
    }
}

impl std::error::Error for CreateError {}

impl From<io::Error> for CreateError {
    fn from(e: io::Error) -> Self {
        CreateError::Io(e)
    }
}

/// The command cgroups under ROOT.
#[derive(Debug)]
pub struct Tree {
    root: PathBuf,
    controllers: Controllers,
}

impl Tree {
    /// ROOT as an earlier image of this daemon set it up (an upgrade in place carries it):
    /// nothing is moved, enabled or swept.
    pub fn carried(root: PathBuf, controllers: Controllers) -> Tree {
        Tree { root, controllers }
    }

    /// Sets ROOT up: moves `self_pid` into `ROOT/daemon` (creating it), then enables in
    /// `ROOT/cgroup.subtree_control` each of memory, pids and cpu that
    /// `ROOT/cgroup.controllers` offers. Enabling is best effort, one controller per write
    /// so one refusal costs only itself; a refused controller is just not available.
    /// Idempotent: a restart finds `daemon` and the controllers already there.
    pub fn setup(root: &Path, self_pid: u32) -> io::Result<Tree> {
        let daemon = root.join(DAEMON);
        match fs::create_dir(&daemon) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(annotate(&daemon, e)),
        }
        // First, because ROOT may enable controllers for its children only once no
        // process is left in it.
        write_file(&daemon.join("cgroup.procs"), &self_pid.to_string())?;
        let offered = read_file(&root.join("cgroup.controllers"))?;
        let offered: HashSet<&str> = offered.split_whitespace().collect();
        let control = root.join("cgroup.subtree_control");
        let mut c = Controllers::default();
        for name in CONTROLLERS {
            let on = offered.contains(name) && write_file(&control, &format!("+{name}")).is_ok();
            match name {
                "memory" => c.memory = on,
                "pids" => c.pids = on,
                _ => c.cpu = on,
            }
        }
        Ok(Tree {
            root: root.to_path_buf(),
            controllers: c,
        })
    }

    /// Which limits can be enforced.
    pub fn controllers(&self) -> &Controllers {
        &self.controllers
    }

    /// ROOT: the delegated cgroup holding `daemon` and the command cgroups.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Kills and removes every command cgroup (a child of ROOT named `PREFIX…`) a previous
    /// instance left, waiting at most `SWEEP_WAIT` in all for them to empty. Never touches
    /// `daemon` or any other child. What could not be removed is counted in `kept`.
    pub fn sweep_leftovers(&self) -> Leftovers {
        let Ok(entries) = fs::read_dir(&self.root) else {
            return Leftovers::default();
        };
        let found: Vec<Cgroup> = entries
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with(PREFIX))
            .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
            .map(|e| Cgroup { path: e.path() })
            .collect();
        let processes = found.iter().map(|cg| cg.kill().unwrap_or(0)).sum();
        let deadline = Instant::now() + SWEEP_WAIT;
        while found.iter().any(|cg| cg.populated().unwrap_or(false)) && Instant::now() < deadline {
            std::thread::sleep(POLL);
        }
        let kept = found.iter().filter(|cg| cg.remove().is_err()).count();
        Leftovers {
            cgroups: found.len(),
            processes,
            kept,
        }
    }

    /// Creates `ROOT/cmd-<name>` and writes its limits, before anything runs in it. A
    /// limit whose controller is not available is refused naming it, and a bad name (only
    /// letters, digits and `_ . -`) or a zero CPU share is `InvalidInput`, both before
    /// anything is created. A cgroup of that name already there is an error, not reused.
    pub fn create(&self, name: &str, limits: &CgroupLimits) -> Result<Cgroup, CreateError> {
        let c = &self.controllers;
        for (asked, on, controller) in [
            (limits.memory_max.is_some(), c.memory, "memory"),
            (limits.pids_max.is_some(), c.pids, "pids"),
            (limits.cpu_max.is_some(), c.cpu, "cpu"),
        ] {
            if asked && !on {
                return Err(CreateError::Unavailable(controller));
            }
        }
        let name_ok = !name.is_empty()
            && name.len() <= 200
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b));
        if !name_ok {
            return Err(invalid(format!("bad command cgroup name {name:?}")).into());
        }
        if limits.cpu_max == Some(0) {
            return Err(invalid("a CPU limit of 0 % lets nothing run".into()).into());
        }
        let path = self.root.join(format!("{PREFIX}{name}"));
        fs::create_dir(&path).map_err(|e| annotate(&path, e))?;
        let cg = Cgroup { path };
        if let Err(e) = cg.write_limits(limits) {
            // Best effort: nothing has run in it, so on cgroupfs the rmdir succeeds.
            let _ = fs::remove_dir(&cg.path);
            return Err(e.into());
        }
        Ok(cg)
    }
}

// ---------------------------------------------------------------------------------------
// One command's cgroup
// ---------------------------------------------------------------------------------------

/// Whole-tree accounting of one command, where the files exist (`cpu.stat` always on
/// 4.15+; the memory files only with the memory controller, `memory.peak` from 5.19).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    /// `cpu.stat` `usage_usec`, in milliseconds.
    pub cpu_ms: Option<u64>,
    /// `memory.peak`, in KiB.
    pub memory_peak_kb: Option<u64>,
    /// `memory.events` `oom_kill`: how many processes the OOM killer took.
    pub oom_kills: Option<u64>,
}

/// One command's cgroup, `ROOT/cmd-<name>`. Only a path: cheap to clone, holds no
/// descriptor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cgroup {
    path: PathBuf,
}

impl Cgroup {
    /// `ROOT/cmd-<name>`.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// A command cgroup an earlier image of this daemon made (an upgrade in place carries
    /// its path).
    pub fn carried(path: PathBuf) -> Cgroup {
        Cgroup { path }
    }

    /// `cgroup.procs` opened `O_WRONLY|O_CLOEXEC`, for a child that writes `0` to it
    /// before `execve` (opened by the parent: the child may not allocate). Since 5.16 the
    /// kernel checks a migration against the credentials of whoever opened the file, so
    /// the write still works after the child has dropped to another user.
    pub fn procs_fd(&self) -> io::Result<OwnedFd> {
        let p = self.path.join("cgroup.procs");
        OpenOptions::new()
            .write(true)
            .open(&p)
            .map(OwnedFd::from)
            .map_err(|e| annotate(&p, e))
    }

    /// Every process in this cgroup and in any cgroup the command made below it.
    pub fn pids(&self) -> io::Result<Vec<u32>> {
        let mut pids = parse_procs(&read_file(&self.path.join("cgroup.procs"))?);
        for dir in subtree(&self.path).iter().filter(|d| **d != self.path) {
            // A nested cgroup may vanish while we walk: then it has nothing left to list.
            if let Ok(text) = fs::read_to_string(dir.join("cgroup.procs")) {
                pids.extend(parse_procs(&text));
            }
        }
        Ok(pids)
    }

    /// SIGKILL to every process in it, escaped from its process group or not: `1` to
    /// `cgroup.kill` (5.14+), else `kill_by_freezing`. Returns how many processes were in
    /// it just before. The processes are gone once `populated` says 0.
    pub fn kill(&self) -> io::Result<usize> {
        let n = self.pids()?.len();
        match write_existing(&self.path.join("cgroup.kill"), "1") {
            Ok(()) => Ok(n),
            Err(e) if e.kind() == io::ErrorKind::NotFound => self.kill_by_freezing(),
            Err(e) => Err(e),
        }
    }

    /// `kill` for kernels without `cgroup.kill`: freeze (so nothing forks or leaves while
    /// we read), SIGKILL every pid in `cgroup.procs` (a frozen task still dies of it), thaw.
    /// Without a freezer (before 5.2) the SIGKILL passes still run, repeated while they
    /// find pids not yet signalled. Public so tests can take this path on new kernels too.
    pub fn kill_by_freezing(&self) -> io::Result<usize> {
        let freeze = self.path.join("cgroup.freeze");
        let frozen = write_existing(&freeze, "1").is_ok();
        if frozen {
            let deadline = Instant::now() + FREEZE_WAIT;
            while !self.frozen().unwrap_or(true) && Instant::now() < deadline {
                std::thread::sleep(POLL);
            }
        }
        let killed = self.kill_passes();
        // Thawing lets the killed tasks run to their exit; a cgroup left frozen would keep
        // any later process in it stopped.
        let thawed = if frozen {
            write_existing(&freeze, "0")
        } else {
            Ok(())
        };
        let n = killed?;
        thawed.map(|()| n)
    }

    fn kill_passes(&self) -> io::Result<usize> {
        let mut signalled = HashSet::new();
        let mut first = None;
        for _ in 0..KILL_PASSES {
            let pids = self.pids()?;
            first.get_or_insert(pids.len());
            let fresh: Vec<u32> = pids.into_iter().filter(|p| signalled.insert(*p)).collect();
            if fresh.is_empty() {
                break;
            }
            for pid in fresh {
                match crate::sys::reap::signal_pid(pid, libc::SIGKILL) {
                    Ok(()) => {}
                    Err(e) if e.raw_os_error() == Some(libc::ESRCH) => {}
                    Err(e) => return Err(e),
                }
            }
        }
        Ok(first.unwrap_or(0))
    }

    /// `populated` from `cgroup.events`: whether any live process is in it or below.
    /// Zombies do not count, so this can go false before the leader is reaped.
    pub fn populated(&self) -> io::Result<bool> {
        let p = self.events_path();
        parse_events_populated(&read_control(&p)?).ok_or_else(|| bad_data(&p))
    }

    fn frozen(&self) -> io::Result<bool> {
        let p = self.events_path();
        parse_events_frozen(&read_control(&p)?).ok_or_else(|| bad_data(&p))
    }

    /// `cgroup.events`: once a command's tree outlives its leader, the loop watches it
    /// with inotify (`IN_MODIFY`) and checks `populated` when it fires.
    pub fn events_path(&self) -> PathBuf {
        self.path.join("cgroup.events")
    }

    /// Removes the cgroup with any cgroups the command made below it. A populated
    /// cgroup refuses (`EBUSY`): reported, not retried; the loop tries again when
    /// `cgroup.events` says it emptied. A cgroup already gone is not an error.
    ///
    /// Most commands make no cgroup of their own, so the `rmdir` comes first, and what
    /// is below is looked for only when the kernel refuses (`EBUSY`, or `ENOTEMPTY` on a
    /// plain directory), then removed deepest first: one `rmdir`, not a directory read
    /// and an `rmdir`.
    pub fn remove(&self) -> io::Result<()> {
        match fs::remove_dir(&self.path) {
            Ok(()) => return Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) if !matches!(e.raw_os_error(), Some(libc::EBUSY | libc::ENOTEMPTY)) => {
                return Err(annotate(&self.path, e));
            }
            Err(_) => {}
        }
        for dir in subtree(&self.path) {
            match fs::remove_dir(&dir) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(annotate(&dir, e)),
            }
        }
        Ok(())
    }

    /// Whole-tree accounting, each figure where its file exists. The memory files are
    /// looked for only when the memory controller is enabled for command cgroups
    /// (`memory`, from `Tree::controllers`): without it they do not exist.
    pub fn stats(&self, memory: bool) -> Stats {
        let read = |f: &str| read_control(&self.path.join(f)).ok();
        let memory_file = |f: &str| if memory { read(f) } else { None };
        Stats {
            cpu_ms: read("cpu.stat")
                .and_then(|t| parse_cpu_stat(&t))
                .map(|us| us / 1000),
            memory_peak_kb: memory_file("memory.peak")
                .and_then(|t| parse_flat_u64(&t))
                .map(|b| b / 1024),
            oom_kills: memory_file("memory.events").and_then(|t| parse_memory_events(&t)),
        }
    }

    fn write_limits(&self, limits: &CgroupLimits) -> io::Result<()> {
        if let Some(bytes) = limits.memory_max {
            write_file(&self.path.join("memory.max"), &format_memory_max(bytes))?;
        }
        if let Some(n) = limits.pids_max {
            write_file(&self.path.join("pids.max"), &format_pids_max(n))?;
        }
        if let Some(percent) = limits.cpu_max {
            write_file(&self.path.join("cpu.max"), &format_cpu_max(percent))?;
        }
        Ok(())
    }
}

/// `top` and every directory below it, children before their parents (the order `rmdir`
/// needs). Iterative, so a deep tree cannot overflow the stack.
fn subtree(top: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![top.to_path_buf()];
    while let Some(dir) = stack.pop() {
        if let Ok(entries) = fs::read_dir(&dir) {
            stack.extend(
                entries
                    .flatten()
                    .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                    .map(|e| e.path()),
            );
        }
        out.push(dir);
    }
    // Pre-order puts each parent before its children; reversed, after them.
    out.reverse();
    out
}

// ---------------------------------------------------------------------------------------
// File access
// ---------------------------------------------------------------------------------------

/// Writes `value` in one write, creating the file when missing: on a plain directory (in
/// tests) that makes it; on cgroupfs a missing file cannot be created (`EACCES`).
fn write_file(path: &Path, value: &str) -> io::Result<()> {
    let open = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(path);
    write_value(open, path, value)
}

/// Like `write_file` but never creates: a control file the kernel lacks (`cgroup.kill`
/// before 5.14, `cgroup.freeze` before 5.2) is `NotFound`.
fn write_existing(path: &Path, value: &str) -> io::Result<()> {
    let open = OpenOptions::new().write(true).truncate(true).open(path);
    write_value(open, path, value)
}

fn write_value(open: io::Result<File>, path: &Path, value: &str) -> io::Result<()> {
    open.and_then(|mut f| f.write_all(value.as_bytes()))
        .map_err(|e| annotate(path, e))
}

fn read_file(path: &Path) -> io::Result<String> {
    fs::read_to_string(path).map_err(|e| annotate(path, e))
}

/// The text of one of the small control files a command's exit reads (`cgroup.events`,
/// `cpu.stat`, `memory.peak`, `memory.events`), in one `read`: a kernfs file hands out
/// all of its text to a read with room for it, so a short read is all of it. So open,
/// read, close, where `fs::read_to_string`
/// adds a `statx` (which says 0 bytes on cgroupfs) and reads growing from 32 bytes. A
/// file that fills the buffer is read on to its end.
fn read_control(path: &Path) -> io::Result<String> {
    let mut file = File::open(path).map_err(|e| annotate(path, e))?;
    let mut buf = [0u8; 4096];
    let n = loop {
        match file.read(&mut buf) {
            Ok(n) => break n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(annotate(path, e)),
        }
    };
    let mut text = buf[..n].to_vec();
    if n == buf.len() {
        file.read_to_end(&mut text).map_err(|e| annotate(path, e))?;
    }
    String::from_utf8(text).map_err(|_| bad_data(path))
}

/// Names the file in the error, keeping its kind (`NotFound`, `ResourceBusy`, ...).
fn annotate(path: &Path, e: io::Error) -> io::Error {
    io::Error::new(e.kind(), format!("{}: {e}", path.display()))
}

fn invalid(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, msg)
}

fn bad_data(path: &Path) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("{}: unexpected contents", path.display()),
    )
}

// ---------------------------------------------------------------------------------------
// Parsing and formatting (pure)
// ---------------------------------------------------------------------------------------

/// The value of `key` in a flat keyed file (`key value` lines: `cpu.stat`,
/// `memory.events`, `cgroup.events`).
pub fn parse_keyed(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let mut it = l.split_whitespace();
        if it.next()? != key {
            return None;
        }
        it.next()?.parse().ok()
    })
}

/// `usage_usec` of `cpu.stat`: CPU time of the whole tree, microseconds.
pub fn parse_cpu_stat(text: &str) -> Option<u64> {
    parse_keyed(text, "usage_usec")
}

/// `oom_kill` of `memory.events`: processes the OOM killer took in the tree.
pub fn parse_memory_events(text: &str) -> Option<u64> {
    parse_keyed(text, "oom_kill")
}

/// `populated` of `cgroup.events`.
pub fn parse_events_populated(text: &str) -> Option<bool> {
    parse_keyed(text, "populated").map(|v| v != 0)
}

/// `frozen` of `cgroup.events`.
pub fn parse_events_frozen(text: &str) -> Option<bool> {
    parse_keyed(text, "frozen").map(|v| v != 0)
}

/// A single-value file (`memory.peak`, `memory.max`, `pids.max`); `max` (no limit) reads
/// as `u64::MAX`.
pub fn parse_flat_u64(text: &str) -> Option<u64> {
    match text.trim() {
        "max" => Some(u64::MAX),
        t => t.parse().ok(),
    }
}

/// The pids of `cgroup.procs`, one a line. A 0 (a process outside the reader's pid
/// namespace) or a malformed line is left out: neither names a process we could signal.
pub fn parse_procs(text: &str) -> Vec<u32> {
    text.lines()
        .filter_map(|l| l.trim().parse().ok())
        .filter(|&p| p != 0)
        .collect()
}

/// `cpu.max` for `percent` of one CPU: `"$QUOTA $PERIOD"` in microseconds, e.g. 50 ->
/// `"50000 100000"`, 200 -> `"200000 100000"` (two CPUs' worth).
pub fn format_cpu_max(percent: u32) -> String {
    let quota = u64::from(percent) * CPU_PERIOD_USEC / 100;
    format!("{quota} {CPU_PERIOD_USEC}")
}

/// `memory.max` for a limit in bytes (the kernel rounds down to whole pages).
pub fn format_memory_max(bytes: u64) -> String {
    bytes.to_string()
}

/// `pids.max` for a limit on processes and threads.
pub fn format_pids_max(n: u64) -> String {
    n.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::{Child, ChildStdin, Command, Stdio};
    use std::sync::atomic::{AtomicUsize, Ordering};

    use crate::sys::inotify::inotify_add_watch;
    use crate::sys::inotify::inotify_init;
    use crate::sys::inotify::read_events;
    use crate::sys::inotify::IN_MODIFY;

    static SEQ: AtomicUsize = AtomicUsize::new(0);

    fn unique(tag: &str) -> String {
        let n = SEQ.fetch_add(1, Ordering::Relaxed);
        format!("execd-test-{}-{n}-{tag}", std::process::id())
    }

    /// Polls `done` until it holds, failing the test after `secs` seconds.
    #[track_caller]
    fn eventually(what: &str, secs: u64, mut done: impl FnMut() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(secs);
        while !done() {
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    // -----------------------------------------------------------------------------------
    // Plain directories laid out like a cgroup
    // -----------------------------------------------------------------------------------

    /// A temporary directory, removed on drop (immutable attributes a test set are taken
    /// off first, or the removal would fail).
    struct TempDir {
        path: PathBuf,
        immutable: Vec<PathBuf>,
    }

    impl TempDir {
        fn new(tag: &str) -> TempDir {
            let path = std::env::temp_dir().join(unique(tag));
            fs::create_dir_all(&path).unwrap();
            TempDir {
                path,
                immutable: Vec::new(),
            }
        }

        /// Makes `file` unwritable even for root (mode bits do not stop root, the
        /// immutable attribute does). False when this filesystem cannot.
        fn make_unwritable(&mut self, file: &Path) -> bool {
            use std::os::unix::fs::PermissionsExt;
            fs::set_permissions(file, fs::Permissions::from_mode(0o444)).unwrap();
            if crate::sys::host::writable(file).unwrap() {
                let ok = Command::new("chattr")
                    .arg("+i")
                    .arg(file)
                    .stderr(Stdio::null())
                    .status()
                    .is_ok_and(|s| s.success());
                if ok {
                    self.immutable.push(file.to_path_buf());
                }
            }
            !crate::sys::host::writable(file).unwrap()
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            for f in &self.immutable {
                let _ = Command::new("chattr").arg("-i").arg(f).status();
            }
            let _ = fs::remove_dir_all(&self.path);
        }
    }

    /// Lays `dir` out like a cgroup holding `procs`, offering `controllers` to its
    /// children. `host_root` leaves out `cgroup.type`, as on the host's root cgroup.
    fn fake_cgroup(dir: &Path, procs: &str, controllers: &str, host_root: bool) {
        fs::create_dir_all(dir).unwrap();
        for (file, text) in [
            ("cgroup.procs", procs),
            ("cgroup.controllers", controllers),
            ("cgroup.subtree_control", ""),
            ("cgroup.events", "populated 0\nfrozen 0\n"),
            ("cgroup.kill", ""),
            ("cgroup.freeze", "0\n"),
        ] {
            fs::write(dir.join(file), text).unwrap();
        }
        if !host_root {
            fs::write(dir.join("cgroup.type"), "domain\n").unwrap();
        }
    }

    fn read(p: impl AsRef<Path>) -> String {
        fs::read_to_string(p.as_ref()).unwrap()
    }

    const ALL: &str = "cpuset cpu io memory hugetlb pids rdma misc\n";

    #[test]
    fn a_command_cgroup_names_its_command_and_nothing_else_does() {
        let own = "0::/system.slice/execd.service/daemon\n";
        let at = |p: &str| command_of(&format!("0::{p}\n"), own);
        assert_eq!(
            at("/system.slice/execd.service/cmd-cmd_12"),
            Some("cmd_12".into())
        );
        assert_eq!(
            at("/system.slice/execd.service/cmd-term_3/nested/deeper"),
            Some("term_3".into()),
            "a cgroup a root command made below its own"
        );
        assert_eq!(at("/system.slice/execd.service/daemon"), None);
        assert_eq!(at("/system.slice/execd.service/other"), None);
        assert_eq!(at("/system.slice/execd.service/cmd-"), None);
        assert_eq!(at("/system.slice/execd.serviceX/cmd-cmd_1"), None);
        assert_eq!(at("/user.slice/cmd-cmd_1"), None);
        // ROOT at the mount's top.
        assert_eq!(
            command_of("0::/cmd-cmd_1\n", "0::/daemon\n"),
            Some("cmd_1".into())
        );
        // The daemon out of its leaf (cgroups not in use): nothing is a command cgroup.
        assert_eq!(command_of("0::/x/cmd-cmd_1\n", "0::/x\n"), None);
        assert_eq!(command_of("", own), None);
    }

    #[test]
    fn setup_moves_the_daemon_and_enables_offered_controllers() {
        let t = TempDir::new("setup");
        fake_cgroup(&t.path, "4242\n", ALL, false);
        let tree = Tree::setup(&t.path, 4242).unwrap();
        assert_eq!(read(t.path.join("daemon/cgroup.procs")), "4242");
        let all = Controllers {
            memory: true,
            pids: true,
            cpu: true,
        };
        assert_eq!(*tree.controllers(), all);
        assert_eq!(tree.controllers().to_string(), "memory pids cpu");
        assert_eq!(tree.root(), t.path);
        // A restart finds `daemon` there.
        let again = Tree::setup(&t.path, 4243).unwrap();
        assert_eq!(*again.controllers(), all);
        assert_eq!(read(t.path.join("daemon/cgroup.procs")), "4243");

        // This machine's v2 hierarchy offers only hugetlb.
        let h = TempDir::new("setup-hugetlb");
        fake_cgroup(&h.path, "", "hugetlb\n", false);
        let tree = Tree::setup(&h.path, 1).unwrap();
        assert_eq!(*tree.controllers(), Controllers::default());
        assert_eq!(tree.controllers().to_string(), "none");
        assert_eq!(read(h.path.join("cgroup.subtree_control")), "");
    }

    #[test]
    fn create_writes_limits_exactly() {
        let t = TempDir::new("limits");
        fake_cgroup(&t.path, "", ALL, false);
        let tree = Tree::setup(&t.path, 1).unwrap();
        let limits = CgroupLimits {
            memory_max: Some(512 << 20),
            pids_max: Some(64),
            cpu_max: Some(50),
        };
        let cg = tree.create("7", &limits).unwrap();
        assert_eq!(cg.path(), t.path.join("cmd-7"));
        assert_eq!(read(cg.path().join("memory.max")), "536870912");
        assert_eq!(read(cg.path().join("pids.max")), "64");
        assert_eq!(read(cg.path().join("cpu.max")), "50000 100000");
        assert_eq!(cg.events_path(), t.path.join("cmd-7/cgroup.events"));

        // No limit: nothing written, the kernel's `max` stays.
        let plain = tree.create("8", &CgroupLimits::default()).unwrap();
        assert_eq!(fs::read_dir(plain.path()).unwrap().count(), 0);

        // Two CPUs' worth.
        let two = CgroupLimits {
            cpu_max: Some(200),
            ..CgroupLimits::default()
        };
        let cg = tree.create("9", &two).unwrap();
        assert_eq!(read(cg.path().join("cpu.max")), "200000 100000");

        // A name taken is an error, not a reuse.
        let err = tree.create("7", &CgroupLimits::default()).unwrap_err();
        assert!(matches!(&err, CreateError::Io(e) if e.kind() == io::ErrorKind::AlreadyExists));
    }

    #[test]
    fn create_refuses_an_unavailable_controller_naming_it_before_creating() {
        let t = TempDir::new("unavailable");
        fake_cgroup(&t.path, "", "pids hugetlb\n", false);
        let tree = Tree::setup(&t.path, 1).unwrap();
        for (limits, controller) in [
            (
                CgroupLimits {
                    memory_max: Some(1 << 30),
                    pids_max: Some(10),
                    ..CgroupLimits::default()
                },
                "memory",
            ),
            (
                CgroupLimits {
                    cpu_max: Some(50),
                    ..CgroupLimits::default()
                },
                "cpu",
            ),
        ] {
            let err = tree.create("x", &limits).unwrap_err();
            assert!(matches!(err, CreateError::Unavailable(c) if c == controller));
            assert!(err
                .to_string()
                .contains(&format!("{controller} controller")));
            assert!(!t.path.join("cmd-x").exists(), "nothing created");
        }
        let pids = CgroupLimits {
            pids_max: Some(10),
            ..CgroupLimits::default()
        };
        tree.create("x", &pids).expect("pids is available");
    }

    #[test]
    fn create_refuses_bad_names_and_a_zero_cpu_share_before_creating() {
        let t = TempDir::new("names");
        fake_cgroup(&t.path, "", ALL, false);
        let tree = Tree::setup(&t.path, 1).unwrap();
        for name in ["", "../x", "a/b", "sp ace", "ü"] {
            let err = tree.create(name, &CgroupLimits::default()).unwrap_err();
            assert!(
                matches!(&err, CreateError::Io(e) if e.kind() == io::ErrorKind::InvalidInput),
                "{name:?}: {err}"
            );
        }
        let zero = CgroupLimits {
            cpu_max: Some(0),
            ..CgroupLimits::default()
        };
        assert!(tree.create("z", &zero).is_err());
        let mut names: Vec<String> = fs::read_dir(&t.path)
            .unwrap()
            .flatten()
            .filter(|e| e.path().is_dir())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert_eq!(names, ["daemon"]);
    }

    #[test]
    fn sweep_touches_only_command_cgroups() {
        let t = TempDir::new("sweep-fake");
        fake_cgroup(&t.path, "", ALL, false);
        let tree = Tree::setup(&t.path, 1).unwrap();
        for child in ["cmd-a", "cmd-b", "other", "daemon"] {
            fake_cgroup(&t.path.join(child), "", "", false);
        }
        fs::write(t.path.join("cmd-file"), "").unwrap();
        let left = tree.sweep_leftovers();
        // Plain directories with files in them cannot be removed: kept.
        assert_eq!(
            left,
            Leftovers {
                cgroups: 2,
                processes: 0,
                kept: 2
            }
        );
        assert_eq!(read(t.path.join("cmd-a/cgroup.kill")), "1");
        assert_eq!(read(t.path.join("cmd-b/cgroup.kill")), "1");
        assert_eq!(read(t.path.join("other/cgroup.kill")), "");
        assert_eq!(read(t.path.join("daemon/cgroup.kill")), "");
    }

    #[test]
    fn a_control_file_is_read_whole_whatever_its_length() {
        let t = TempDir::new("control");
        for len in [0, 21, 4095, 4096, 4097, 10_000] {
            let text: String = (0..len).map(|i| (b'a' + (i % 26) as u8) as char).collect();
            let p = t.path.join(format!("f{len}"));
            fs::write(&p, &text).unwrap();
            assert_eq!(read_control(&p).unwrap(), text, "{len} bytes");
        }
        let err = read_control(&t.path.join("missing")).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::NotFound);
        assert!(err.to_string().contains("missing"), "{err}");
    }

    #[test]
    fn removing_a_cgroup_takes_what_the_command_made_below_it() {
        let t = TempDir::new("nested");
        let cg = Cgroup {
            path: t.path.join("cmd-1"),
        };
        fs::create_dir_all(cg.path.join("a/b")).unwrap();
        fs::create_dir_all(cg.path.join("c")).unwrap();
        cg.remove().unwrap();
        assert!(!cg.path.exists());
        cg.remove().expect("a cgroup already gone is not an error");
    }

    #[test]
    fn stats_read_whatever_files_exist() {
        let t = TempDir::new("stats");
        let cg = Cgroup {
            path: t.path.clone(),
        };
        assert_eq!(cg.stats(true), Stats::default());
        fs::write(t.path.join("cpu.stat"), CPU_STAT).unwrap();
        fs::write(t.path.join("memory.peak"), "1073741824\n").unwrap();
        fs::write(t.path.join("memory.events"), MEMORY_EVENTS).unwrap();
        assert_eq!(
            cg.stats(true),
            Stats {
                cpu_ms: Some(1234),
                memory_peak_kb: Some(1 << 20),
                oom_kills: Some(2),
            }
        );
        // Without the memory controller its files are not looked for.
        assert_eq!(
            cg.stats(false),
            Stats {
                cpu_ms: Some(1234),
                ..Stats::default()
            }
        );
    }

    // -----------------------------------------------------------------------------------
    // Pure parsing
    // -----------------------------------------------------------------------------------

    const CPU_STAT: &str = "usage_usec 1234567\nuser_usec 1000000\nsystem_usec 234567\n\
        core_sched.force_idle_usec 0\nnr_periods 0\nnr_throttled 0\nthrottled_usec 0\n\
        nr_bursts 0\nburst_usec 0\n";

    const MEMORY_EVENTS: &str = "low 0\nhigh 0\nmax 12\noom 3\noom_kill 2\noom_group_kill 0\n";

    #[test]
    fn parses_cgroup_files() {
        assert_eq!(parse_cpu_stat(CPU_STAT), Some(1_234_567));
        assert_eq!(parse_cpu_stat("user_usec 5\n"), None);
        // `oom 3` comes first and must not be taken for `oom_kill`.
        assert_eq!(parse_memory_events(MEMORY_EVENTS), Some(2));
        assert_eq!(parse_memory_events("oom 3\n"), None);
        assert_eq!(parse_keyed("a 1\nb x\n", "b"), None);
        assert_eq!(parse_flat_u64("1073741824\n"), Some(1 << 30));
        assert_eq!(parse_flat_u64("max\n"), Some(u64::MAX));
        assert_eq!(parse_flat_u64("12 34\n"), None);
        assert_eq!(parse_flat_u64(""), None);
        assert_eq!(
            parse_events_populated("populated 1\nfrozen 0\n"),
            Some(true)
        );
        assert_eq!(
            parse_events_populated("populated 0\nfrozen 1\n"),
            Some(false)
        );
        assert_eq!(parse_events_frozen("populated 0\nfrozen 1\n"), Some(true));
        assert_eq!(parse_events_frozen("populated 0\n"), None);
        assert_eq!(parse_procs("12\n0\n345\nbad\n\n"), vec![12, 345]);
    }

    #[test]
    fn formats_limits() {
        assert_eq!(format_cpu_max(50), "50000 100000");
        assert_eq!(format_cpu_max(1), "1000 100000");
        assert_eq!(format_cpu_max(100), "100000 100000");
        assert_eq!(format_cpu_max(250), "250000 100000");
        assert_eq!(format_memory_max(1 << 20), "1048576");
        assert_eq!(format_pids_max(64), "64");
    }

    /// This machine's mountinfo: a hybrid host, cgroup v1 controllers under a tmpfs at
    /// /sys/fs/cgroup and the v2 hierarchy at /sys/fs/cgroup/unified.
    const HYBRID_MOUNTINFO: &str = "\
22 27 0:21 / /proc rw,relatime - proc proc rw
23 27 0:22 / /sys rw,relatime - sysfs sysfs rw
24 27 0:6 / /dev rw,relatime - devtmpfs devtmpfs rw,size=12334492k,nr_inodes=3083623,mode=755
27 1 254:0 / / rw,relatime - ext4 /dev/vda rw,discard,resv_strict,resuid=65534,resgid=65534
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";

    const HYBRID_PROC_CGROUP: &str = "9:name=systemd:/\n8:pids:/\n4:memory:/process_api/832e\n\
        1:cpu:/\n0::/\n";

    #[test]
    fn finds_the_cgroup2_mount() {
        assert_eq!(
            cgroup2_mount(HYBRID_MOUNTINFO),
            Some(PathBuf::from("/sys/fs/cgroup/unified"))
        );
        let unified = "29 23 0:26 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 \
                       - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot\n";
        assert_eq!(
            cgroup2_mount(unified),
            Some(PathBuf::from("/sys/fs/cgroup"))
        );
        let escaped =
            "40 30 0:40 / /mnt/my\\040cgroup\\134x rw shared:9 master:2 - cgroup2 none rw\n";
        assert_eq!(
            cgroup2_mount(escaped),
            Some(PathBuf::from("/mnt/my cgroup\\x"))
        );
        let two = format!("{unified}{escaped}");
        assert_eq!(cgroup2_mount(&two), Some(PathBuf::from("/sys/fs/cgroup")));
        // The filesystem type is the field after " - ", not a word anywhere in the line.
        let lookalike = "50 1 0:50 / /cgroup2 rw - tmpfs cgroup2 rw\n";
        assert_eq!(cgroup2_mount(lookalike), None);
        assert_eq!(cgroup2_mount(""), None);
        assert_eq!(cgroup2_mount("garbage\n1 2 3\n"), None);
    }

    #[test]
    fn finds_own_cgroup() {
        assert_eq!(own_cgroup(HYBRID_PROC_CGROUP).as_deref(), Some("/"));
        let systemd = "0::/system.slice/execd.service\n";
        assert_eq!(
            own_cgroup(systemd).as_deref(),
            Some("/system.slice/execd.service")
        );
        assert_eq!(own_cgroup("4:memory:/\n1:name=systemd:/x\n"), None);
        assert_eq!(
            locate(HYBRID_MOUNTINFO, HYBRID_PROC_CGROUP),
            (
                Some(PathBuf::from("/sys/fs/cgroup/unified")),
                Some("/".into())
            )
        );
    }

    #[test]
    fn locate_takes_a_bind_mounted_subtree_off_the_path() {
        let mi = "60 1 0:30 /machine.slice/c1 /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n";
        let at = |own: &str| locate(mi, &format!("0::{own}\n")).1;
        assert_eq!(
            at("/machine.slice/c1/init.scope").as_deref(),
            Some("/init.scope")
        );
        assert_eq!(at("/machine.slice/c1").as_deref(), Some("/"));
        assert_eq!(at("/machine.slice/c10/x"), None, "a prefix, not a parent");
        assert_eq!(at("/elsewhere"), None);
    }

    #[test]
    fn this_machine_mountinfo_names_a_cgroup2_directory() {
        let (mount, own) = locate_self();
        match mount {
            Some(m) => {
                assert!(m.join("cgroup.controllers").is_file(), "{}", m.display());
                assert!(own.is_some_and(|o| o.starts_with('/')));
            }
            None => eprintln!("no cgroup2 mount on this machine"),
        }
    }

    // -----------------------------------------------------------------------------------
    // Choosing ROOT
    // -----------------------------------------------------------------------------------

    #[test]
    fn choose_root_refuses_the_mounts_root_cgroup() {
        let t = TempDir::new("host-root");
        fake_cgroup(&t.path, "1\n", ALL, true);
        let auto = choose_root(&Mode::Auto, Some(&t.path), Some("/"), 1);
        assert_eq!(auto, Err(Fallback::RootCgroup));
        let path = choose_root(&Mode::Path(t.path.clone()), Some(&t.path), None, 1);
        assert_eq!(path, Err(Fallback::RootCgroup));
    }

    #[test]
    fn choose_root_takes_a_cgroup_namespace_root_held_alone() {
        // PID 1 of a container with its own cgroup namespace sees its cgroup as "/", but
        // that cgroup has `cgroup.type`, which only the host's root lacks.
        let t = TempDir::new("ns-root");
        fake_cgroup(&t.path, "1\n", ALL, false);
        let got = choose_root(&Mode::Auto, Some(&t.path), Some("/"), 1);
        assert_eq!(got, Ok(t.path.clone()));
    }

    #[test]
    fn choose_root_refuses_a_cgroup_shared_with_a_login_session() {
        let t = TempDir::new("shared");
        fake_cgroup(&t.path, "1\n", ALL, true);
        let session = t.path.join("user.slice/session-3.scope");
        fake_cgroup(&session, "812\n4242\n9001\n", "", false);
        let own = Some("/user.slice/session-3.scope");
        let got = choose_root(&Mode::Auto, Some(&t.path), own, 4242);
        assert_eq!(got, Err(Fallback::Shared { others: 2 }));
        // The same cgroup, with only us left in it, is taken.
        fs::write(session.join("cgroup.procs"), "4242\n").unwrap();
        assert_eq!(
            choose_root(&Mode::Auto, Some(&t.path), own, 4242),
            Ok(session.clone())
        );
        // Unless another daemon sits in its leaf: then in neither mode.
        fake_cgroup(&session.join(DAEMON), "777\n", "", false);
        let taken = Err(Fallback::Taken { pid: 777 });
        assert_eq!(choose_root(&Mode::Auto, Some(&t.path), own, 4242), taken);
        let path = Mode::Path(session.clone());
        assert_eq!(choose_root(&path, Some(&t.path), None, 4242), taken);
        // An empty leaf (its daemon is gone), or one holding only us, is free.
        for procs in ["", "4242\n"] {
            fs::write(session.join(DAEMON).join("cgroup.procs"), procs).unwrap();
            assert_eq!(
                choose_root(&path, Some(&t.path), None, 4242),
                Ok(session.clone())
            );
        }
        // So is one holding a dead daemon's spare, which its death is killing (a live
        // process named so: `sleep` run through a link of that name).
        let link = t.path.join("execd-spare");
        std::os::unix::fs::symlink("/bin/sleep", &link).unwrap();
        let mut spare = std::process::Command::new(&link).arg("30").spawn().unwrap();
        let pid = spare.id();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default() != "execd-spare\n"
        {
            assert!(std::time::Instant::now() < deadline, "the spare runs");
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
        fs::write(
            session.join(DAEMON).join("cgroup.procs"),
            format!("{pid}\n"),
        )
        .unwrap();
        let free = choose_root(&path, Some(&t.path), None, 4242);
        let _ = spare.kill();
        let _ = spare.wait();
        assert_eq!(free, Ok(session.clone()));
    }

    #[test]
    fn choose_root_refuses_what_it_cannot_write() {
        let mut t = TempDir::new("readonly");
        fake_cgroup(&t.path, "", ALL, true);
        let svc = t.path.join("system.slice/execd.service");
        fake_cgroup(&svc, "77\n", ALL, false);
        let own = Some("/system.slice/execd.service");
        assert_eq!(
            choose_root(&Mode::Auto, Some(&t.path), own, 77),
            Ok(svc.clone())
        );
        let procs = svc.join("cgroup.procs");
        if !t.make_unwritable(&procs) {
            eprintln!("skipped: cannot make a file unwritable for this user here");
            return;
        }
        let want = Err(Fallback::NotWritable(procs.display().to_string()));
        assert_eq!(choose_root(&Mode::Auto, Some(&t.path), own, 77), want);
        assert_eq!(choose_root(&Mode::Path(svc), Some(&t.path), None, 77), want);
    }

    #[test]
    fn choose_root_other_refusals() {
        let t = TempDir::new("refusals");
        fake_cgroup(&t.path, "", ALL, true);
        let m = Some(t.path.as_path());
        let setup = |r: Result<PathBuf, Fallback>| matches!(r, Err(Fallback::Setup(_)));
        assert_eq!(
            choose_root(&Mode::Off, m, Some("/x"), 1),
            Err(Fallback::Off)
        );
        assert_eq!(
            choose_root(&Mode::Auto, None, Some("/x"), 1),
            Err(Fallback::NoCgroup2)
        );
        assert_eq!(
            choose_root(&Mode::Auto, m, None, 1),
            Err(Fallback::NoCgroup2)
        );
        let outside = Mode::Path(t.path.clone());
        assert_eq!(
            choose_root(&outside, None, None, 1),
            Err(Fallback::NoCgroup2)
        );
        assert!(setup(choose_root(&Mode::Auto, m, Some("/../.."), 1)));
        assert!(setup(choose_root(&Mode::Auto, m, Some("relative"), 1)));
        assert!(setup(choose_root(&Mode::Auto, m, Some("/missing"), 1)));
        // A directory that is not a cgroup.
        fs::create_dir(t.path.join("plain")).unwrap();
        assert!(setup(choose_root(&Mode::Auto, m, Some("/plain"), 1)));
        let plain = Mode::Path(t.path.join("plain"));
        assert!(setup(choose_root(&plain, m, None, 1)));
        // A cgroup, but outside the mount.
        let other = TempDir::new("elsewhere");
        fake_cgroup(&other.path, "", "", false);
        assert!(setup(choose_root(
            &Mode::Path(other.path.clone()),
            m,
            None,
            1
        )));
        // Inside, and its other processes are the operator's business.
        let svc = t.path.join("svc");
        fake_cgroup(&svc, "5\n6\n", "", false);
        let dotted = Mode::Path(t.path.join("svc/../svc"));
        assert_eq!(choose_root(&dotted, m, None, 1), Ok(svc));
    }

    #[test]
    fn mode_parses_the_flag() {
        assert_eq!(Mode::parse("auto"), Ok(Mode::Auto));
        assert_eq!(Mode::parse("off"), Ok(Mode::Off));
        assert_eq!(
            Mode::parse("/sys/fs/cgroup/x"),
            Ok(Mode::Path("/sys/fs/cgroup/x".into()))
        );
        assert!(Mode::parse("on").is_err());
        assert!(Mode::parse("relative/dir").is_err());
    }

    #[test]
    fn fallback_messages_say_why_and_how_to_delegate() {
        let cases = [
            (Fallback::NoCgroup2, "no cgroup v2 hierarchy"),
            (Fallback::RootCgroup, "root cgroup"),
            (Fallback::Shared { others: 1 }, "1 other process (a login"),
            (Fallback::Shared { others: 3 }, "3 other processes"),
            (
                Fallback::Taken { pid: 77 },
                "leaf already holds pid 77 (another execd?)",
            ),
            (
                Fallback::NotWritable("/sys/fs/cgroup/x/cgroup.procs".into()),
                "/sys/fs/cgroup/x/cgroup.procs is not writable",
            ),
            (
                Fallback::Setup("EBUSY".into()),
                "cgroup setup failed: EBUSY",
            ),
        ];
        for (f, why) in cases {
            let s = f.to_string();
            assert!(s.contains(why), "{s}");
            assert!(
                s.contains("Delegate=yes") && s.contains("--cgroup PATH"),
                "{s}"
            );
            assert!(s.contains("falling back to process groups"), "{s}");
            assert!(!s.contains('\n') && !s.ends_with('.'), "one sentence: {s}");
        }
        let off = Fallback::Off.to_string();
        assert!(
            off.contains("--cgroup off") && !off.contains("Delegate"),
            "{off}"
        );
    }

    // -----------------------------------------------------------------------------------
    // The real kernel
    // -----------------------------------------------------------------------------------

    /// A private parent cgroup under the real cgroup2 mount and the processes a test
    /// started. Drop kills and removes everything, also when the test failed.
    struct Kernel {
        mount: PathBuf,
        /// The test process's own cgroup, where its children start and return to.
        home: PathBuf,
        parent: PathBuf,
        children: Vec<Child>,
    }

    impl Kernel {
        /// None, with the reason printed, when no cgroup2 mount is writable here.
        fn new(tag: &str) -> Option<Kernel> {
            let (Some(mount), Some(own)) = locate_self() else {
                eprintln!("skipped: no cgroup2 mount holds this process");
                return None;
            };
            let home = mount.join(own.trim_start_matches('/'));
            let parent = mount.join(unique(tag));
            if let Err(e) = fs::create_dir(&parent) {
                eprintln!(
                    "skipped: cannot create a cgroup in {}: {e}",
                    mount.display()
                );
                return None;
            }
            Some(Kernel {
                mount,
                home,
                parent,
                children: Vec::new(),
            })
        }

        /// The parent's path relative to the mount, as `/proc/PID/cgroup` would show it.
        fn rel(&self, dir: &Path) -> String {
            format!("/{}", dir.strip_prefix(&self.mount).unwrap().display())
        }

        fn keep(&mut self, child: Child) -> u32 {
            let pid = child.id();
            self.children.push(child);
            pid
        }

        fn sleeper(&mut self) -> u32 {
            let child = Command::new("sleep")
                .arg("1000")
                .stdin(Stdio::null())
                .spawn()
                .unwrap();
            self.keep(child)
        }

        /// `sh` starting a `setsid sleep` (out of its process group and session) and a
        /// plain `sleep`, once a line arrives on its stdin: so it can be moved into a
        /// cgroup before it forks anything.
        fn gated_tree(&mut self) -> (u32, ChildStdin) {
            let mut child = Command::new("sh")
                .args(["-c", "read -r _; setsid sleep 1000 & sleep 1000"])
                .stdin(Stdio::piped())
                .spawn()
                .unwrap();
            let gate = child.stdin.take().unwrap();
            (self.keep(child), gate)
        }

        /// Reaps our child `pid` once it died (a zombie still has a /proc entry).
        fn reap(&mut self, pid: u32) {
            if let Some(c) = self.children.iter_mut().find(|c| c.id() == pid) {
                eventually("our child to exit", 5, || c.try_wait().unwrap().is_some());
            }
        }
    }

    impl Drop for Kernel {
        fn drop(&mut self) {
            // The daemon stand-in goes home first, so `daemon` can be removed.
            let daemon = self.parent.join(DAEMON).join("cgroup.procs");
            for pid in parse_procs(&fs::read_to_string(daemon).unwrap_or_default()) {
                let _ = fs::write(self.home.join("cgroup.procs"), pid.to_string());
            }
            let parent = Cgroup {
                path: self.parent.clone(),
            };
            let _ = parent.kill();
            for c in &mut self.children {
                let _ = c.kill();
                let _ = c.wait();
            }
            let deadline = Instant::now() + Duration::from_secs(3);
            while parent.populated().unwrap_or(false) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(10));
            }
            if let Err(e) = parent.remove() {
                eprintln!("cleanup of {} failed: {e}", self.parent.display());
            }
        }
    }

    fn join(cg: &Path, pid: u32) {
        fs::write(cg.join("cgroup.procs"), pid.to_string()).unwrap();
    }

    /// `/proc/PID/stat` fields after the command name: state is [0], session [3],
    /// start time [19].
    fn stat(pid: u32) -> Option<Vec<String>> {
        let text = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        let rest = &text[text.rfind(')')? + 1..];
        Some(rest.split_whitespace().map(String::from).collect())
    }

    /// Identifies a process by pid and start time, so a reused pid is not mistaken for it.
    fn identity(pid: u32) -> (u32, String) {
        (pid, stat(pid).expect("process exists")[19].clone())
    }

    /// Exited: no /proc entry, a zombie, or the pid now belongs to someone else.
    fn dead(&(pid, ref start): &(u32, String)) -> bool {
        stat(pid).is_none_or(|f| f[0] == "Z" || f[0] == "X" || f[19] != *start)
    }

    fn comm(pid: u32) -> String {
        fs::read_to_string(format!("/proc/{pid}/comm"))
            .unwrap_or_default()
            .trim()
            .to_string()
    }

    /// Moves a gated tree into `cg` through `procs_fd`, opens the gate and waits until
    /// both sleeps run in it. Returns the identities of every process in it.
    fn fill(k: &mut Kernel, cg: &Cgroup) -> (u32, Vec<(u32, String)>) {
        let (sh, mut gate) = k.gated_tree();
        let mut procs = File::from(cg.procs_fd().unwrap());
        procs.write_all(sh.to_string().as_bytes()).unwrap();
        writeln!(gate).unwrap();
        eventually("two sleeps in the cgroup", 5, || {
            let pids = cg.pids().unwrap();
            pids.iter().filter(|&&p| comm(p) == "sleep").count() == 2
        });
        let pids = cg.pids().unwrap();
        assert!(pids.contains(&sh), "{pids:?}");
        (sh, pids.into_iter().map(identity).collect())
    }

    #[test]
    fn kernel_command_cgroup_lifecycle() {
        let Some(mut k) = Kernel::new("life") else {
            return;
        };
        let stand_in = k.sleeper();
        let tree = Tree::setup(&k.parent, stand_in).unwrap();
        let daemon_line = format!("0::{}\n", k.rel(&k.parent.join(DAEMON)));
        let seen = fs::read_to_string(format!("/proc/{stand_in}/cgroup")).unwrap();
        assert!(seen.contains(&daemon_line), "{seen}");
        let again = Tree::setup(&k.parent, stand_in).expect("idempotent");
        assert_eq!(again.controllers(), tree.controllers());

        // A limit is written where its controller is enabled, refused where it is not.
        let memory = CgroupLimits {
            memory_max: Some(64 << 20),
            ..CgroupLimits::default()
        };
        if tree.controllers().memory {
            let cg = tree.create("mem", &memory).unwrap();
            assert_eq!(read(cg.path().join("memory.max")), "67108864\n");
            cg.remove().unwrap();
        } else {
            let err = tree.create("mem", &memory).unwrap_err();
            assert!(matches!(err, CreateError::Unavailable("memory")), "{err}");
            assert!(!k.parent.join("cmd-mem").exists());
        }

        let cg = tree.create("life", &CgroupLimits::default()).unwrap();
        assert!(!cg.populated().unwrap());

        let inotify = inotify_init().unwrap();
        let wd = inotify_add_watch(&inotify, &cg.events_path(), IN_MODIFY).unwrap();
        let (sh, procs) = fill(&mut k, &cg);
        assert!(cg.populated().unwrap());
        // The point of it all: `setsid` took one sleep out of sh's session and group.
        let sessions: HashSet<String> = procs
            .iter()
            .map(|(p, _)| stat(*p).unwrap()[3].clone())
            .collect();
        assert_eq!(sessions.len(), 2, "one process left the session");
        read_events(&inotify).unwrap();

        assert_eq!(cg.kill().unwrap(), procs.len());
        k.reap(sh);
        eventually("every process of the tree to die", 5, || {
            procs.iter().all(dead)
        });
        eventually("populated 0", 5, || !cg.populated().unwrap());
        eventually("an inotify event on cgroup.events", 5, || {
            read_events(&inotify).unwrap().contains(&wd)
        });
        assert!(
            cg.stats(tree.controllers().memory).cpu_ms.is_some(),
            "cpu.stat exists on every cgroup"
        );
        assert_eq!(cg.kill().unwrap(), 0, "killing an empty cgroup is harmless");
        cg.remove().unwrap();
        assert!(!cg.path().exists());
        cg.remove().expect("removing it again is not an error");
    }

    #[test]
    fn kernel_remove_refuses_while_populated_then_succeeds() {
        let Some(mut k) = Kernel::new("busy") else {
            return;
        };
        let stand_in = k.sleeper();
        let tree = Tree::setup(&k.parent, stand_in).unwrap();
        let cg = tree.create("busy", &CgroupLimits::default()).unwrap();
        let pid = k.sleeper();
        join(cg.path(), pid);
        let err = cg.remove().unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::ResourceBusy, "{err}");
        crate::sys::reap::signal_pid(pid, libc::SIGTERM).unwrap();
        k.reap(pid);
        eventually("populated 0", 5, || !cg.populated().unwrap());
        cg.remove().unwrap();
    }

    #[test]
    fn kernel_freeze_fallback_kills_the_whole_tree_and_thaws() {
        let Some(mut k) = Kernel::new("freeze") else {
            return;
        };
        let stand_in = k.sleeper();
        let tree = Tree::setup(&k.parent, stand_in).unwrap();
        let cg = tree.create("frozen", &CgroupLimits::default()).unwrap();
        if !cg.path().join("cgroup.freeze").exists() {
            eprintln!("no cgroup.freeze (kernel < 5.2): only the SIGKILL passes run");
        }
        let (sh, procs) = fill(&mut k, &cg);
        assert_eq!(cg.kill_by_freezing().unwrap(), procs.len());
        k.reap(sh);
        eventually("every process of the tree to die", 5, || {
            procs.iter().all(dead)
        });
        eventually("populated 0", 5, || !cg.populated().unwrap());
        assert!(!cg.frozen().unwrap(), "thawed");
        cg.remove().unwrap();
    }

    #[test]
    fn kernel_sweep_kills_and_removes_only_leftover_command_cgroups() {
        let Some(mut k) = Kernel::new("sweep") else {
            return;
        };
        let stand_in = k.sleeper();
        let tree = Tree::setup(&k.parent, stand_in).unwrap();
        // A previous instance's leftovers, one with a cgroup its command made inside.
        for dir in ["cmd-a", "cmd-b/inner", "other"] {
            fs::create_dir_all(k.parent.join(dir)).unwrap();
        }
        let mut victims = Vec::new();
        for dir in ["cmd-a", "cmd-b", "cmd-b/inner"] {
            let pid = k.sleeper();
            join(&k.parent.join(dir), pid);
            victims.push(identity(pid));
        }
        let bystander = k.sleeper();
        join(&k.parent.join("other"), bystander);
        let bystander = identity(bystander);

        let left = tree.sweep_leftovers();
        assert_eq!(
            left,
            Leftovers {
                cgroups: 2,
                processes: 3,
                kept: 0
            }
        );
        assert!(!k.parent.join("cmd-a").exists());
        assert!(!k.parent.join("cmd-b").exists());
        for &(pid, _) in &victims {
            k.reap(pid);
        }
        assert!(victims.iter().all(dead));
        assert!(k.parent.join("other").is_dir(), "not ours: untouched");
        assert!(!dead(&bystander));
        assert_eq!(
            read(k.parent.join("other/cgroup.procs")),
            format!("{}\n", bystander.0)
        );
        assert!(!dead(&identity(stand_in)));
        assert!(k.parent.join(DAEMON).is_dir());
        assert_eq!(tree.sweep_leftovers(), Leftovers::default(), "nothing left");
    }

    #[test]
    fn kernel_choose_root_on_real_cgroups() {
        let Some(mut k) = Kernel::new("choose") else {
            return;
        };
        let mount = k.mount.clone();
        let alone = k.sleeper();
        join(&k.parent, alone);
        let own = k.rel(&k.parent);
        let auto = |pid| choose_root(&Mode::Auto, Some(&mount), Some(&own), pid);
        assert_eq!(auto(alone), Ok(k.parent.clone()));
        let second = k.sleeper();
        join(&k.parent, second);
        assert_eq!(auto(alone), Err(Fallback::Shared { others: 1 }));
        let path = Mode::Path(k.parent.clone());
        assert_eq!(
            choose_root(&path, Some(&mount), None, alone),
            Ok(k.parent.clone())
        );
        let top = choose_root(&Mode::Auto, Some(&mount), Some("/"), alone);
        assert_eq!(top, Err(Fallback::RootCgroup));
        let top = choose_root(&Mode::Path(mount.clone()), Some(&mount), None, alone);
        assert_eq!(top, Err(Fallback::RootCgroup));
    }
}
