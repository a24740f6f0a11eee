//! Plain types that the core, the method families and the OS layer all speak: what to
//! execute and how its stdio is wired, how a process ended and what it used, resource and
//! cgroup limits, how a tree is ended, and the names of signals and errno values. Nothing here makes a system
//! call; it is a leaf every room may import, so the pure half never needs `sys`.

use std::path::PathBuf;
use std::time::Duration;
#[cfg(test)]
use std::time::{Instant, SystemTime};

/// How much the daemon logs (`--log-level`): each level keeps the lines of those before
/// it. `error`: what the daemon could not do for itself (its audit file, an internal
/// error); `warn`: refusals (limits, peers, spawns) and warnings; `info` (the default):
/// the daemon's life, each command's start and exit, sessions closed by the daemon,
/// leftovers killed; `debug`: the rest (releases, signals sent, sessions closed by
/// request).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    Error,
    Warn,
    #[default]
    Info,
    Debug,
}

impl Level {
    pub const NAMES: [&'static str; 4] = ["error", "warn", "info", "debug"];

    pub fn parse(s: &str) -> Option<Level> {
        Some(match s {
            "error" => Level::Error,
            "warn" => Level::Warn,
            "info" => Level::Info,
            "debug" => Level::Debug,
            _ => return None,
        })
    }
}

/// A resource limit `--rlimit` may set for commands.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Rlimit {
    Cpu,
    As,
    Nofile,
    Nproc,
    Fsize,
    Core,
}

impl Rlimit {
    /// The name `--rlimit` takes.
    pub fn name(self) -> &'static str {
        match self {
            Rlimit::Cpu => "cpu",
            Rlimit::As => "as",
            Rlimit::Nofile => "nofile",
            Rlimit::Nproc => "nproc",
            Rlimit::Fsize => "fsize",
            Rlimit::Core => "core",
        }
    }

    /// The resource `--rlimit` names.
    pub fn parse(name: &str) -> Option<Rlimit> {
        Some(match name {
            "cpu" => Rlimit::Cpu,
            "as" => Rlimit::As,
            "nofile" => Rlimit::Nofile,
            "nproc" => Rlimit::Nproc,
            "fsize" => Rlimit::Fsize,
            "core" => Rlimit::Core,
            _ => return None,
        })
    }
}

/// What to execute.
#[derive(Debug, Clone)]
pub enum Program {
    /// `program` looked up in PATH, with these arguments.
    Direct { program: String, args: Vec<String> },
    /// `shell -c line`.
    Shell {
        shell: std::path::PathBuf,
        line: String,
    },
}

impl Program {
    /// The words a direct program runs with, program first (empty for a shell line, whose
    /// words only the policy's splitter reads).
    pub fn argv(&self) -> Vec<String> {
        match self {
            Program::Direct { program, args } => {
                std::iter::once(program).chain(args).cloned().collect()
            }
            Program::Shell { .. } => Vec::new(),
        }
    }
}

/// How the command's stdio is wired.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Stdio3 {
    /// stdin `/dev/null`; stdout and stderr share one pipe, so their order is kept.
    Merged,
    /// stdin a pipe; stdout and stderr share one pipe (a terminal fed by its client).
    MergedWithStdin,
    /// stdin a pipe; stdout and stderr each their own pipe.
    Separate,
    /// A pseudo-terminal of this size is stdin, stdout, stderr and the controlling
    /// terminal; its output is one stream.
    Pty(WinSize),
    /// A shell session's bash (PROTOCOL 12.2): a pseudo-terminal of this size is stdout,
    /// stderr and the controlling terminal, and stdin is a Unix socket of its own that
    /// only the daemon writes (shut for writing on the shell's side): the command lines
    /// that passed the gate. What a person types to a running program goes to the
    /// terminal, which the shell never reads commands from.
    Shell(WinSize),
}

/// A terminal's size in character cells.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WinSize {
    pub rows: u16,
    pub cols: u16,
}

impl WinSize {
    /// 24 x 80, as a terminal starts.
    pub const DEFAULT: WinSize = WinSize { rows: 24, cols: 80 };
    /// The largest side a request may ask for.
    pub const MAX_SIDE: u16 = 1000;
}

/// How a reaped process ended.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Ended {
    Code(i32),
    Signal(i32),
}

/// Resource use from `wait4`.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Usage {
    pub user: Duration,
    pub system: Duration,
    pub max_rss_kb: u64,
}

/// Every signal by its conventional name.
const SIGNAL_NAMES: &[(&str, i32)] = &[
    ("SIGHUP", libc::SIGHUP),
    ("SIGINT", libc::SIGINT),
    ("SIGQUIT", libc::SIGQUIT),
    ("SIGILL", libc::SIGILL),
    ("SIGTRAP", libc::SIGTRAP),
    ("SIGABRT", libc::SIGABRT),
    ("SIGBUS", libc::SIGBUS),
    ("SIGFPE", libc::SIGFPE),
    ("SIGKILL", libc::SIGKILL),
    ("SIGUSR1", libc::SIGUSR1),
    ("SIGSEGV", libc::SIGSEGV),
    ("SIGUSR2", libc::SIGUSR2),
    ("SIGPIPE", libc::SIGPIPE),
    ("SIGALRM", libc::SIGALRM),
    ("SIGTERM", libc::SIGTERM),
    ("SIGSTKFLT", libc::SIGSTKFLT),
    ("SIGCHLD", libc::SIGCHLD),
    ("SIGCONT", libc::SIGCONT),
    ("SIGSTOP", libc::SIGSTOP),
    ("SIGTSTP", libc::SIGTSTP),
    ("SIGTTIN", libc::SIGTTIN),
    ("SIGTTOU", libc::SIGTTOU),
    ("SIGURG", libc::SIGURG),
    ("SIGXCPU", libc::SIGXCPU),
    ("SIGXFSZ", libc::SIGXFSZ),
    ("SIGVTALRM", libc::SIGVTALRM),
    ("SIGPROF", libc::SIGPROF),
    ("SIGWINCH", libc::SIGWINCH),
    ("SIGIO", libc::SIGIO),
    ("SIGPWR", libc::SIGPWR),
    ("SIGSYS", libc::SIGSYS),
];

/// Signals `bash/kill` accepts.
const KILL_SIGNALS: &[i32] = &[
    libc::SIGTERM,
    libc::SIGKILL,
    libc::SIGINT,
    libc::SIGHUP,
    libc::SIGQUIT,
    libc::SIGUSR1,
    libc::SIGUSR2,
    libc::SIGSTOP,
    libc::SIGCONT,
];

/// The number of a signal named with or without `SIG`, in any case.
fn named_signal(name: &str) -> Option<i32> {
    let upper = name.to_ascii_uppercase();
    let bare = upper.strip_prefix("SIG").unwrap_or(&upper);
    SIGNAL_NAMES
        .iter()
        .find(|(n, _)| n[3..] == *bare)
        .map(|&(_, s)| s)
}

/// The number of a signal as `signal_name` writes it: a name, or `SIG<n>`.
pub fn signal_number(name: &str) -> Option<i32> {
    named_signal(name).or_else(|| name.strip_prefix("SIG")?.parse().ok())
}

/// The signal a client may send with `bash/kill`: by name only, from the allowed list.
pub fn signal_by_name(name: &str) -> Option<i32> {
    named_signal(name).filter(|s| KILL_SIGNALS.contains(s))
}

/// The conventional name of a signal number, e.g. `"SIGKILL"` (`"SIG40"` when it has none).
pub fn signal_name(sig: i32) -> String {
    SIGNAL_NAMES
        .iter()
        .find(|&&(_, s)| s == sig)
        .map_or_else(|| format!("SIG{sig}"), |(n, _)| n.to_string())
}

/// The symbolic name of an errno value a spawn can fail with (`"ENOENT"`), for clients
/// that map it to an exit status; `"E<n>"` for others.
pub fn errno_name(code: i32) -> String {
    let name = match code {
        libc::ENOENT => "ENOENT",
        libc::EACCES => "EACCES",
        libc::EPERM => "EPERM",
        libc::ENOEXEC => "ENOEXEC",
        libc::EISDIR => "EISDIR",
        libc::ENOTDIR => "ENOTDIR",
        libc::ELOOP => "ELOOP",
        libc::ENAMETOOLONG => "ENAMETOOLONG",
        libc::E2BIG => "E2BIG",
        libc::ENOMEM => "ENOMEM",
        libc::ETXTBSY => "ETXTBSY",
        libc::EAGAIN => "EAGAIN",
        libc::EMFILE => "EMFILE",
        libc::ENFILE => "ENFILE",
        libc::EINVAL => "EINVAL",
        _ => return format!("E{code}"),
    };
    name.to_string()
}

/// Where unit tests start their fake clocks: a monotonic instant and a fixed wall time
/// (2026-11-25T00:00:00Z). The core never reads a clock; its tests advance these.
/// One command's limits; `None` leaves the kernel's default (`max`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CgroupLimits {
    /// `memory.max`, bytes.
    pub memory_max: Option<u64>,
    /// `pids.max`.
    pub pids_max: Option<u64>,
    /// `cpu.max`, percent of one CPU (50 is half a CPU, 200 two CPUs).
    pub cpu_max: Option<u32>,
}

/// What the start-up sweep found of a previous instance's command cgroups.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Leftovers {
    /// Command cgroups found under ROOT.
    pub cgroups: usize,
    /// Processes found in them (and killed).
    pub processes: usize,
    /// Of `cgroups`, how many could not be removed (still busy after `SWEEP_WAIT`).
    pub kept: usize,
}

/// Which processes a cookie sweep (PROTOCOL 14) looks for: those whose `EXECD_TREE` names
/// one of these.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SweepScope {
    /// These commands of this instance: they were killed or released.
    Commands(Vec<String>),
    /// Every command of this instance: the daemon is stopping.
    Every,
    /// Any command of an earlier instance on the same socket path whose daemon is gone:
    /// what it left, swept at start.
    Earlier,
}

/// What one cookie sweep did, for the log and the audit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Swept {
    pub scope: SweepScope,
    /// Processes found carrying a cookie in scope, and SIGKILLed.
    pub killed: usize,
    /// The first few of them, as pid and command name.
    pub sample: Vec<(i32, String)>,
    /// Processes of an earlier instance left alone because its daemon still runs (its
    /// socket file was replaced under it).
    pub spared: usize,
    /// Environments read, over every pass.
    pub read: usize,
    /// Passes over /proc: another follows each one that killed something.
    pub passes: usize,
    /// The time the reader spent on it.
    pub elapsed: Duration,
    /// Processes it did not read because their memory did not answer (a hung file
    /// system): each is read again alone later.
    pub skipped: Vec<i32>,
}

/// How execd chooses its ROOT: `--cgroup auto|off|PATH`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mode {
    /// The daemon's own cgroup, when it is delegated to it (see `choose_root`).
    Auto,
    /// Process groups only.
    Off,
    /// This cgroup v2 directory, named by the operator.
    Path(PathBuf),
}

impl Mode {
    /// Reads the flag's value: `auto`, `off`, or an absolute path.
    pub fn parse(s: &str) -> Result<Mode, String> {
        match s {
            "auto" => Ok(Mode::Auto),
            "off" => Ok(Mode::Off),
            p if p.starts_with('/') => Ok(Mode::Path(PathBuf::from(p))),
            _ => Err(format!(
                "--cgroup takes auto, off or an absolute path, not {s:?}"
            )),
        }
    }
}

/// The two steps of ending a tree.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// SIGTERM to the process group: a polite request.
    Term,
    /// SIGKILL to whatever of the tree is left.
    Kill,
}

/// Whole-tree figures of a command, read from its cgroup when its leader exits.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct TreeUsage {
    pub cpu_ms: Option<u64>,
    pub memory_peak_kb: Option<u64>,
    /// The OOM killer took a process of the tree.
    pub oom_killed: bool,
}

#[cfg(test)]
pub fn test_clock() -> (Instant, SystemTime) {
    (
        Instant::now(),
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_795_564_800),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signal_names_round_trip() {
        assert_eq!(signal_by_name("SIGINT"), Some(libc::SIGINT));
        assert_eq!(signal_by_name("term"), Some(libc::SIGTERM));
        assert_eq!(signal_by_name("SIGSEGV"), None, "not one bash/kill sends");
        assert_eq!(signal_number("SIGSEGV"), Some(libc::SIGSEGV));
        assert_eq!(signal_number("SIG40"), Some(40));
        assert_eq!(signal_number("nope"), None);
        assert_eq!(signal_by_name("9"), None, "names only");
        assert_eq!(signal_by_name(""), None);
        assert_eq!(signal_by_name("SIG"), None);
        assert_eq!(signal_name(libc::SIGKILL), "SIGKILL");
        assert_eq!(signal_name(200), "SIG200");
    }
}
