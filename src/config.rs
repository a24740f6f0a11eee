//! Every daemon flag, its default as a documented constant, and the socket path rule that
//! `execd` and `execctl` share. Parsing is small enough to write by hand: `--name VALUE` or
//! `--name=VALUE`, repeated flags where a list is meant.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::types::CgroupLimits;
use crate::types::Mode;
use crate::types::Rlimit;

/// Most concurrent client connections.
pub const DEFAULT_MAX_CLIENTS: usize = 1024;
/// Most commands running at once, both method families together.
pub const DEFAULT_MAX_PROCESSES: usize = 1024;
/// Most exited, unreleased terminals kept per owner; the oldest is released past it.
pub const DEFAULT_MAX_RETAINED: usize = 1024;
/// Longest request line in bytes.
pub const DEFAULT_MAX_MESSAGE: usize = 1 << 20;
/// Most elements of one batch; a larger batch is refused whole.
pub const DEFAULT_MAX_BATCH: usize = 1000;
/// Cap on one connection's outgoing buffer; output events past it become a `Gap`.
pub const DEFAULT_CLIENT_BUFFER: usize = 4 << 20;
/// Output ring capacity when a request names none.
pub const DEFAULT_OUTPUT_LIMIT: usize = 1 << 20;
/// Largest output ring a request may ask for; larger asks are clamped.
pub const DEFAULT_MAX_OUTPUT_LIMIT: usize = 64 << 20;
/// All output memory the daemon holds, every ring together (committed bytes).
pub const DEFAULT_MAX_OUTPUT_MEMORY: usize = 256 << 20;
/// Input waiting for a command's stdin, per command.
pub const DEFAULT_STDIN_BUFFER: usize = 64 << 10;
/// Time between SIGTERM and SIGKILL when a command is killed.
pub const DEFAULT_KILL_GRACE: Duration = Duration::from_secs(2);
/// A bash session unused this long (and running nothing) is closed.
pub const DEFAULT_SESSION_IDLE: Duration = Duration::from_secs(3600);
pub const DEFAULT_HTTP_IDLE: Duration = Duration::from_secs(60);
/// Most bash sessions at once.
pub const DEFAULT_MAX_SESSIONS: usize = 256;
/// Finished commands kept per bash session; older ones are dropped, oldest first.
pub const BASH_HISTORY: usize = 100;
/// How long an `ask` waits for an approver's answer before it is refused.
pub const DEFAULT_APPROVAL_TIMEOUT: Duration = Duration::from_secs(60);
/// Approvals waiting for an answer at once, all peers together.
pub const DEFAULT_MAX_PENDING_APPROVALS: usize = 256;
/// What `$TMPDIR` stands for in a sandbox unless `--tmpdir` says otherwise.
pub const DEFAULT_TMPDIR: &str = "/tmp";
/// Socket file mode unless `--socket-mode` widens it.
pub const DEFAULT_SOCKET_MODE: u32 = 0o600;

/// The daemon's whole configuration.
#[derive(Debug, Clone)]
pub struct Config {
    pub socket: PathBuf,
    pub socket_mode: u32,
    pub socket_group: Option<u32>,
    pub allow_uids: Vec<u32>,
    pub allow_gids: Vec<u32>,
    pub max_clients: usize,
    pub max_processes: usize,
    pub max_retained: usize,
    pub max_message: usize,
    pub max_batch: usize,
    pub client_buffer: usize,
    pub output_limit: usize,
    pub max_output_limit: usize,
    pub max_output_memory: usize,
    pub stdin_buffer: usize,
    pub kill_grace: Duration,
    pub session_idle: Duration,
    pub max_sessions: usize,
    pub shell: PathBuf,
    pub clean_env: bool,
    pub workdir: PathBuf,
    pub rlimits: Vec<(Rlimit, u64)>,
    /// With a root daemon, run non-root peers' commands as this user (name or uid)
    /// instead of as the peer itself.
    pub run_as: Option<String>,
    /// The policy file (section 7); none: every command is allowed.
    pub policy: Option<PathBuf>,
    /// Where audit records go: a file, or `-` for stderr; none: not kept.
    pub audit: Option<AuditTarget>,
    pub approval_timeout: Duration,
    pub max_pending_approvals: usize,
    /// `--approver-uid`/`--approver-gid` (repeatable): who may approve the commands of
    /// every uid instead of the default (a command's own uid, and root).
    pub approver_uids: Vec<u32>,
    pub approver_gids: Vec<u32>,
    /// `--cgroup auto|off|PATH` (section 9).
    pub cgroup: Mode,
    /// `--memory-max`, `--pids-max`, `--cpu-max`: every command's limits; a request may
    /// only lower them.
    pub limits: CgroupLimits,
    /// `--http-listen ADDR:PORT` (repeatable): TCP listeners of the HTTP front end.
    pub http_listen: Vec<std::net::SocketAddr>,
    /// `--http-token-file`: the bearer token every TCP request must carry.
    pub http_token_file: Option<PathBuf>,
    /// `--http-no-auth`: no token, for loopback listeners only.
    pub http_no_auth: bool,
    /// `--http-run-as USER`: whom TCP requests run as and are owned by (required when
    /// the daemon runs as root).
    pub http_run_as: Option<String>,
    /// `--http-idle`: a TCP connection without a request this long, owed nothing, closes.
    pub http_idle: Duration,
    /// `--http-host NAME` (repeatable): a name a browser may reach execd by besides
    /// loopback addresses and `localhost` (PROTOCOL 11), with any port.
    pub http_hosts: Vec<String>,
    /// `--resume-from FD` (given by the daemon itself): the state an upgrade in place
    /// carries, in the memfd at FD (PROTOCOL 13).
    pub resume_from: Option<i32>,
    /// What the daemon was started as: `argv[0]` made absolute, symlinks not resolved
    /// (`started_as`). What SIGUSR2 or `daemon/upgrade` without `binary` executes.
    pub binary: Option<PathBuf>,
    /// The flags the daemon was started with, as given (without `--resume-from`): the next
    /// image gets them unchanged.
    pub args: Vec<OsString>,
    /// `--workdir` was given (it then counts as the workspace when none is named).
    pub workdir_given: bool,
    /// `--sandbox PRESET|FILE`: every command's sandbox unless the policy says otherwise
    /// (PROTOCOL 16); none: `off`. A file is read when the daemon starts (`sandbox_of`).
    pub sandbox: Option<SandboxFlag>,
    /// `--workspace DIR` (repeatable): where `$CWD` may stand for.
    pub workspaces: Vec<PathBuf>,
    /// `--tmpdir DIR`: what `$TMPDIR` stands for (default `/tmp`).
    pub tmpdir: PathBuf,
    /// `--landlock-abi-max N`: use no newer Landlock ABI than N (it can only refuse more).
    pub landlock_abi_max: Option<u8>,
    /// `--log-level`: how much the daemon logs (default `info`).
    pub log_level: crate::types::Level,
}

/// Where `--audit` sends records.
#[derive(Debug, Clone, PartialEq)]
pub enum AuditTarget {
    Stderr,
    File(PathBuf),
}

impl Default for Config {
    /// Every documented default; the socket path is left empty (see `resolve_socket`).
    fn default() -> Config {
        Config {
            socket: PathBuf::new(),
            socket_mode: DEFAULT_SOCKET_MODE,
            socket_group: None,
            allow_uids: Vec::new(),
            allow_gids: Vec::new(),
            approver_uids: Vec::new(),
            approver_gids: Vec::new(),
            max_clients: DEFAULT_MAX_CLIENTS,
            max_processes: DEFAULT_MAX_PROCESSES,
            max_retained: DEFAULT_MAX_RETAINED,
            max_message: DEFAULT_MAX_MESSAGE,
            max_batch: DEFAULT_MAX_BATCH,
            client_buffer: DEFAULT_CLIENT_BUFFER,
            output_limit: DEFAULT_OUTPUT_LIMIT,
            max_output_limit: DEFAULT_MAX_OUTPUT_LIMIT,
            max_output_memory: DEFAULT_MAX_OUTPUT_MEMORY,
            stdin_buffer: DEFAULT_STDIN_BUFFER,
            kill_grace: DEFAULT_KILL_GRACE,
            session_idle: DEFAULT_SESSION_IDLE,
            max_sessions: DEFAULT_MAX_SESSIONS,
            shell: default_shell(),
            clean_env: false,
            workdir: std::env::current_dir().unwrap_or_else(|_| PathBuf::from("/")),
            rlimits: Vec::new(),
            run_as: None,
            policy: None,
            audit: None,
            approval_timeout: DEFAULT_APPROVAL_TIMEOUT,
            max_pending_approvals: DEFAULT_MAX_PENDING_APPROVALS,
            cgroup: Mode::Auto,
            limits: CgroupLimits::default(),
            http_listen: Vec::new(),
            http_token_file: None,
            http_no_auth: false,
            http_run_as: None,
            http_idle: DEFAULT_HTTP_IDLE,
            log_level: crate::types::Level::default(),
            http_hosts: Vec::new(),
            resume_from: None,
            binary: None,
            args: Vec::new(),
            workdir_given: false,
            sandbox: None,
            workspaces: Vec::new(),
            tmpdir: PathBuf::from(DEFAULT_TMPDIR),
            landlock_abi_max: None,
        }
    }
}

/// What the command line asked for.
#[derive(Debug)]
pub enum Invocation {
    Run(Box<Config>),
    /// `--check-policy FILE`: validate a policy file and exit.
    CheckPolicy(PathBuf),
    /// `--upgrade-check`: say which states this build takes, and exit (PROTOCOL 13).
    UpgradeCheck,
    /// `--print-unit service|socket`: print a shipped systemd unit, and exit.
    PrintUnit(&'static str),
    Help,
    Version,
}

pub const USAGE: &str = "\
usage: execd [OPTIONS]

Runs commands for clients speaking JSON-RPC 2.0 over a Unix socket: ACP
terminal/*, bash/* sessions, shell/* sessions (a long-lived interactive bash per
session: cd and exports persist), events/*; the same socket answers HTTP for
/v1/bash/* and /v1/shell/*. See execd(8) and execd-protocol(7).

options:
  --socket PATH            listening socket (default: $EXECD_SOCKET, else
                           $XDG_RUNTIME_DIR/execd.sock, else /run/user/$UID/execd.sock
                           when that is your own directory, else /run/execd.sock for
                           root, else /tmp/execd-$UID/execd.sock)
  --socket-mode MODE       socket file mode, octal (default 0600)
  --socket-group GID       group of the socket file
  --allow-uid UID          also accept peers with this uid (repeatable)
  --allow-gid GID          also accept peers with this gid (repeatable)
  --max-clients N          concurrent connections (default 1024)
  --max-processes N        commands running at once (default 1024)
  --max-retained N         exited unreleased terminals per owner (default 1024)
  --max-message BYTES      longest request line (default 1M)
  --max-batch N            most requests in one batch (default 1000)
  --client-buffer BYTES    outgoing buffer per connection (default 4M)
  --output-limit BYTES     output ring when a request names none (default 1M)
  --max-output-limit BYTES largest output ring a request may ask (default 64M)
  --max-output-memory BYTES
                           all output the daemon holds, every ring together
                           (default 256M); a non-root owner holds at most half
  --stdin-buffer BYTES     pending stdin per command (default 64K)
  --kill-grace DURATION    SIGTERM to SIGKILL delay (default 2s)
  --session-idle DURATION  close bash and shell sessions idle this long (default 1h;
                           one made without a name and never named again: a sixth)
  --max-sessions N         bash and shell sessions at once, together (default 256);
                           at it, the caller's unnamed then least recently used quiet
                           bash sessions make room, never a named shell session
  --shell PATH             shell for command lines (default /bin/bash, else /bin/sh)
  --clean-env              start commands with an empty environment
  --workdir DIR            default working directory (default: the daemon's)
  --sandbox PRESET|FILE    every command's sandbox (PROTOCOL 16): workspace (write
                           $CWD and $TMPDIR, no network, .git read-only), read-only,
                           off (the default), or a JSON file of that shape; the
                           policy's own sandbox and rules narrow or change it
  --workspace DIR          a directory $CWD may stand for (repeatable; default: the
                           policy's workspaces, else --workdir when given)
  --tmpdir DIR             what $TMPDIR stands for in a sandbox (default /tmp)
  --landlock-abi-max N     use no newer Landlock ABI than N (it can only refuse more)
  --rlimit NAME=VALUE      limit for commands: cpu, as, nofile, nproc, fsize, core
                           (repeatable)
  --run-as USER            (root daemon) run non-root peers' commands as USER
                           instead of as the peer
  --policy FILE            allow, ask or deny commands by rules (execd-protocol(7));
                           SIGHUP reloads it
  --log-level LEVEL        error, warn, info (the default) or debug: how much the
                           daemon writes to stderr (refusals are warn, each command's
                           start and exit info, releases, signals sent and cookie
                           sweeps that killed nothing debug)
  --audit FILE|-           append one JSON record per decision, start and end
                           (file mode 0640; - is stderr); SIGHUP reopens it
  --approval-timeout DURATION
                           how long an ask waits for an approver (default 60s)
  --max-pending-approvals N
                           asks waiting at once (default 256); a non-root uid's
                           commands hold at most half
  --approver-uid UID       only connections of this uid approve, for every uid
                           (repeatable; default: a command's own uid, and root)
  --approver-gid GID       only connections in this group approve, for every uid
                           (repeatable)
  --check-policy FILE      validate a policy file (with its examples) and exit
  --upgrade-check          print this build's version and the upgrade states it takes
                           (one JSON line) and exit: what a running daemon asks a new
                           binary before it upgrades into it (SIGUSR2, execctl upgrade)
  --resume-from FD         (given by execd itself) resume from an upgrade's state
  --print-unit service|socket
                           print the systemd unit execd ships (execd.service,
                           execd.socket) and exit; see execd(8)
  --cgroup auto|off|PATH   a cgroup v2 per command under PATH, or the daemon's own
                           delegated cgroup (auto, the default), or process groups
                           (off); either way every command carries EXECD_TREE, by
                           which what leaves its group is found and killed
  --memory-max BYTES       memory limit of every command (needs the memory controller)
  --pids-max N             process limit of every command (needs the pids controller)
  --cpu-max PERCENT        CPU limit of every command, in percent of one CPU
                           (needs the cpu controller)
  --http-listen ADDR:PORT  also serve the bash pipe API over HTTP on TCP (repeatable);
                           the Unix socket serves it always
  --http-token-file FILE   the bearer token TCP requests must carry (the file must not
                           be readable by others)
  --http-no-auth           no token, for loopback listeners only
  --http-run-as USER       whom TCP requests run as (required when execd runs as root)
  --http-idle DURATION     close a TCP connection that sends no request this long
                           while nothing is owed to it (default 60s)
  --http-host NAME         a host name a browser may reach execd by, besides loopback
                           addresses and localhost (repeatable; any port)
  -h, --help               print this help
  -V, --version            print the version

Sizes take K, M or G suffixes; durations take ms, s, m or h (seconds if bare).
";

/// The systemd units execd ships (`systemd/` in its source), as `--print-unit` prints
/// them: `execd.service` (Type=notify, Delegate=yes) and `execd.socket`.
pub const SERVICE_UNIT: &str = include_str!("../systemd/execd.service");
pub const SOCKET_UNIT: &str = include_str!("../systemd/execd.socket");

/// The shipped unit called `name` (`service` or `socket`).
pub fn unit(name: &str) -> Option<&'static str> {
    match name {
        "service" => Some(SERVICE_UNIT),
        "socket" => Some(SOCKET_UNIT),
        _ => None,
    }
}

/// `--sandbox PRESET|FILE` as given.
#[derive(Debug, Clone, PartialEq)]
pub enum SandboxFlag {
    Preset(String),
    /// A file holding a sandbox object, read when the daemon starts: what it holds that
    /// execd does not know stops the start (exit 1), as a policy file's does.
    File(PathBuf),
}

impl SandboxFlag {
    /// The sandbox it names (the error names the file and the problem).
    pub fn read(&self) -> Result<crate::policy::sandbox::Partial, String> {
        use crate::policy::sandbox;
        match self {
            SandboxFlag::Preset(p) => {
                sandbox::parse(&serde_json::Value::from(p.as_str())).map_err(|e| e.to_string())
            }
            SandboxFlag::File(path) => {
                let shown = path.display();
                let text = std::fs::read_to_string(path)
                    .map_err(|e| format!("--sandbox {shown}: cannot read: {e}"))?;
                let value: serde_json::Value = serde_json::from_str(&text)
                    .map_err(|e| format!("--sandbox {shown}: not JSON: {e}"))?;
                sandbox::parse(&value).map_err(|e| format!("--sandbox {shown}: {e}"))
            }
        }
    }
}

/// `--sandbox`'s value: a preset's name, or a file holding a sandbox object.
fn sandbox_flag(v: &str) -> Result<SandboxFlag, String> {
    use crate::policy::sandbox;
    if sandbox::PRESETS.contains(&v) {
        return Ok(SandboxFlag::Preset(v.to_string()));
    }
    let path = PathBuf::from(v);
    if !path.is_file() {
        return Err(format!(
            "--sandbox: {v:?} is neither a preset ({}) nor a file",
            sandbox::PRESETS.join(", ")
        ));
    }
    Ok(SandboxFlag::File(path))
}

/// Where the daemon's socket may be, in section 1's order: `--socket`, else
/// `$EXECD_SOCKET` (each alone: named, it is the one), else `$XDG_RUNTIME_DIR/execd.sock`,
/// `/run/user/UID/execd.sock` when that directory exists and is owned by UID
/// (`runtime_dir_owner` says who owns it: MCP clients and cron start programs without
/// `XDG_RUNTIME_DIR`, and a user's daemon listens there all the same), `/run/execd.sock`
/// for root, and `/tmp/execd-UID/execd.sock` (a directory of its own, see
/// `private_socket_dir`). execd listens at the first; execctl tries them in order.
pub fn socket_candidates(
    flag: Option<PathBuf>,
    env: &dyn Fn(&str) -> Option<OsString>,
    uid: u32,
    runtime_dir_owner: &dyn Fn(&Path) -> Option<u32>,
) -> Vec<PathBuf> {
    if let Some(p) = flag {
        return vec![p];
    }
    if let Some(p) = env("EXECD_SOCKET").filter(|v| !v.is_empty()) {
        return vec![PathBuf::from(p)];
    }
    let mut all = Vec::with_capacity(4);
    if let Some(dir) = env("XDG_RUNTIME_DIR").filter(|v| !v.is_empty()) {
        all.push(Path::new(&dir).join("execd.sock"));
    }
    let run_user = PathBuf::from(format!("/run/user/{uid}"));
    if runtime_dir_owner(&run_user) == Some(uid) {
        let p = run_user.join("execd.sock");
        if !all.contains(&p) {
            all.push(p);
        }
    }
    if uid == 0 {
        all.push(PathBuf::from("/run/execd.sock"));
    }
    all.push(private_socket_dir(uid).join("execd.sock"));
    all
}

/// The socket path as section 1 says (`socket_candidates`' first).
pub fn resolve_socket(
    flag: Option<PathBuf>,
    env: &dyn Fn(&str) -> Option<OsString>,
    uid: u32,
    runtime_dir_owner: &dyn Fn(&Path) -> Option<u32>,
) -> PathBuf {
    let mut all = socket_candidates(flag, env, uid, runtime_dir_owner);
    all.swap_remove(0)
}

/// The directory of last resort for uid's socket, `/tmp/execd-UID`: execd makes it mode
/// 0700 and uses it only when it is a directory owned by UID that no one else may write
/// (anyone may create a name in /tmp first; a file of theirs there is refused, never
/// used).
pub fn private_socket_dir(uid: u32) -> PathBuf {
    PathBuf::from(format!("/tmp/execd-{uid}"))
}

/// The owner of directory `dir`, if it is one (a symlink is followed, as `/run/user`
/// entries are real directories the login manager made).
pub fn dir_owner(dir: &Path) -> Option<u32> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(dir)
        .ok()
        .filter(|m| m.is_dir())
        .map(|m| m.uid())
}

/// What the daemon was started as (PROTOCOL 13): `argv0` made absolute, against the
/// working directory when it names a directory, else through `PATH`; symlinks are not
/// resolved, so a package manager that renames a new file over that path is followed.
/// `None` when neither finds it (the caller then falls back to the running executable).
pub fn started_as(argv0: &std::ffi::OsStr) -> Option<PathBuf> {
    let cwd = std::env::current_dir().ok()?;
    crate::sys::upgrade::absolute_binary(argv0, &cwd, std::env::var_os("PATH").as_deref())
}

/// The flags of `args` (without the program name) an upgrade passes on unchanged: all but
/// `--resume-from FD`, which names one image's state.
pub fn flags_to_keep(args: &[OsString]) -> Vec<OsString> {
    let mut kept = Vec::with_capacity(args.len());
    let mut it = args.iter();
    while let Some(a) = it.next() {
        if a == "--resume-from" {
            it.next();
            continue;
        }
        if a.to_str().is_some_and(|s| s.starts_with("--resume-from=")) {
            continue;
        }
        kept.push(a.clone());
    }
    kept
}

/// The process's own socket path resolution, from its real environment and uid.
pub fn default_socket(flag: Option<PathBuf>) -> PathBuf {
    let uid = crate::sys::ids::current_uid();
    resolve_socket(flag, &|k| std::env::var_os(k), uid, &dir_owner)
}

/// The process's own candidates (`socket_candidates`), from its environment and uid.
pub fn default_socket_candidates() -> Vec<PathBuf> {
    let uid = crate::sys::ids::current_uid();
    socket_candidates(None, &|k| std::env::var_os(k), uid, &dir_owner)
}

/// Parses a size: bytes, or with a K, M or G suffix (powers of 1024).
pub fn parse_size(s: &str) -> Result<usize, String> {
    let (digits, mult) = match s.as_bytes().last() {
        Some(b'K' | b'k') => (&s[..s.len() - 1], 1 << 10),
        Some(b'M' | b'm') => (&s[..s.len() - 1], 1 << 20),
        Some(b'G' | b'g') => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    digits
        .parse::<usize>()
        .ok()
        .and_then(|n| n.checked_mul(mult))
        .ok_or_else(|| format!("invalid size {s:?}"))
}

/// Parses a duration: seconds (fractions allowed), or with an ms, s, m or h suffix.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let (num, unit) = if let Some(n) = s.strip_suffix("ms") {
        (n, 0.001)
    } else if let Some(n) = s.strip_suffix('s') {
        (n, 1.0)
    } else if let Some(n) = s.strip_suffix('m') {
        (n, 60.0)
    } else if let Some(n) = s.strip_suffix('h') {
        (n, 3600.0)
    } else {
        (s, 1.0)
    };
    match num.parse::<f64>() {
        Ok(v) if v >= 0.0 && (v * unit).is_finite() && v * unit < 1e9 => {
            Ok(Duration::from_secs_f64(v * unit))
        }
        _ => Err(format!("invalid duration {s:?}")),
    }
}

/// A size flag's value; a bad one is refused naming the flag.
fn size(flag: &str, v: &str) -> Result<usize, String> {
    parse_size(v).map_err(|e| format!("{flag}: {e}; give bytes or a K, M or G suffix"))
}

/// A duration flag's value; a bad one is refused naming the flag.
fn duration(flag: &str, v: &str) -> Result<Duration, String> {
    parse_duration(v)
        .map_err(|e| format!("{flag}: {e}; give seconds (2, 1.5) or an ms, s, m or h suffix"))
}

fn parse_num<T: std::str::FromStr>(flag: &str, v: &str) -> Result<T, String> {
    v.parse()
        .map_err(|_| format!("{flag}: invalid number {v:?}"))
}

/// The default shell: `/bin/bash` if present, else `/bin/sh`.
fn default_shell() -> PathBuf {
    let bash = Path::new("/bin/bash");
    if bash.exists() {
        bash.to_path_buf()
    } else {
        PathBuf::from("/bin/sh")
    }
}

/// Parses the daemon's arguments (without the program name).
pub fn parse_args(args: impl IntoIterator<Item = String>) -> Result<Invocation, String> {
    let mut socket = None;
    let mut cfg = Config::default();
    let mut it = args.into_iter();
    while let Some(arg) = it.next() {
        let (flag, inline) = match arg.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f.to_string(), Some(v.to_string())),
            _ => (arg.clone(), None),
        };
        let mut value = || -> Result<String, String> {
            match &inline {
                Some(v) => Ok(v.clone()),
                None => it.next().ok_or_else(|| format!("{flag} needs a value")),
            }
        };
        match flag.as_str() {
            "-h" | "--help" => return Ok(Invocation::Help),
            "-V" | "--version" => return Ok(Invocation::Version),
            "--socket" => socket = Some(PathBuf::from(value()?)),
            "--socket-mode" => {
                let v = value()?;
                cfg.socket_mode = u32::from_str_radix(&v, 8)
                    .ok()
                    .filter(|m| *m <= 0o777)
                    .ok_or_else(|| format!("--socket-mode: invalid octal mode {v:?}"))?;
            }
            "--socket-group" => cfg.socket_group = Some(parse_num(&flag, &value()?)?),
            "--allow-uid" => cfg.allow_uids.push(parse_num(&flag, &value()?)?),
            "--allow-gid" => cfg.allow_gids.push(parse_num(&flag, &value()?)?),
            "--approver-uid" => cfg.approver_uids.push(parse_num(&flag, &value()?)?),
            "--approver-gid" => cfg.approver_gids.push(parse_num(&flag, &value()?)?),
            "--max-clients" => cfg.max_clients = parse_num(&flag, &value()?)?,
            "--max-processes" => cfg.max_processes = parse_num(&flag, &value()?)?,
            "--max-retained" => cfg.max_retained = parse_num(&flag, &value()?)?,
            "--max-sessions" => cfg.max_sessions = parse_num(&flag, &value()?)?,
            "--max-message" => cfg.max_message = size(&flag, &value()?)?,
            "--max-batch" => cfg.max_batch = parse_num(&flag, &value()?)?,
            "--client-buffer" => cfg.client_buffer = size(&flag, &value()?)?,
            "--output-limit" => cfg.output_limit = size(&flag, &value()?)?,
            "--max-output-limit" => cfg.max_output_limit = size(&flag, &value()?)?,
            "--max-output-memory" => cfg.max_output_memory = size(&flag, &value()?)?,
            "--stdin-buffer" => cfg.stdin_buffer = size(&flag, &value()?)?,
            "--kill-grace" => cfg.kill_grace = duration(&flag, &value()?)?,
            "--session-idle" => cfg.session_idle = duration(&flag, &value()?)?,
            "--shell" => cfg.shell = PathBuf::from(value()?),
            "--clean-env" => cfg.clean_env = true,
            "--workdir" => {
                cfg.workdir = PathBuf::from(value()?);
                cfg.workdir_given = true;
            }
            "--sandbox" => cfg.sandbox = Some(sandbox_flag(&value()?)?),
            "--workspace" => {
                let v = PathBuf::from(value()?);
                if !v.is_absolute() || !v.is_dir() || v == Path::new("/") {
                    return Err(format!(
                        "--workspace: {} is not an absolute path to a directory other than /",
                        v.display()
                    ));
                }
                cfg.workspaces.push(v);
            }
            "--tmpdir" => {
                let v = PathBuf::from(value()?);
                if !v.is_absolute() || !v.is_dir() {
                    return Err(format!(
                        "--tmpdir: {} is not an absolute path to a directory",
                        v.display()
                    ));
                }
                cfg.tmpdir = v;
            }
            "--landlock-abi-max" => cfg.landlock_abi_max = Some(parse_num(&flag, &value()?)?),
            "--run-as" => cfg.run_as = Some(value()?),
            "--check-policy" => return Ok(Invocation::CheckPolicy(PathBuf::from(value()?))),
            "--upgrade-check" => return Ok(Invocation::UpgradeCheck),
            "--log-level" => {
                let v = value()?;
                cfg.log_level = crate::types::Level::parse(&v).ok_or_else(|| {
                    format!(
                        "--log-level: {v:?} is not one of {}",
                        crate::types::Level::NAMES.join(", ")
                    )
                })?;
            }
            "--print-unit" => {
                let v = value()?;
                return match unit(&v) {
                    Some(text) => Ok(Invocation::PrintUnit(text)),
                    None => Err(format!(
                        "--print-unit: {v:?} is neither \"service\" nor \"socket\""
                    )),
                };
            }
            "--resume-from" => cfg.resume_from = Some(parse_num(&flag, &value()?)?),
            "--policy" => cfg.policy = Some(PathBuf::from(value()?)),
            "--audit" => {
                let v = value()?;
                cfg.audit = Some(if v == "-" {
                    AuditTarget::Stderr
                } else {
                    AuditTarget::File(PathBuf::from(v))
                });
            }
            "--approval-timeout" => cfg.approval_timeout = duration(&flag, &value()?)?,
            "--cgroup" => cfg.cgroup = Mode::parse(&value()?)?,
            "--http-listen" => {
                let v = value()?;
                let addr = v.parse().map_err(|_| {
                    format!("--http-listen: {v:?} is not ADDR:PORT (e.g. 127.0.0.1:8080)")
                })?;
                cfg.http_listen.push(addr);
            }
            "--http-token-file" => cfg.http_token_file = Some(PathBuf::from(value()?)),
            "--http-no-auth" => cfg.http_no_auth = true,
            "--http-run-as" => cfg.http_run_as = Some(value()?),
            "--http-idle" => cfg.http_idle = duration(&flag, &value()?)?,
            "--http-host" => {
                let v = value()?;
                let name = v
                    .strip_prefix('[')
                    .and_then(|n| n.strip_suffix(']'))
                    .unwrap_or(&v);
                let ok = !v.is_empty()
                    && v.len() <= 253
                    && (name.parse::<std::net::IpAddr>().is_ok()
                        || v.split('.').all(|l| {
                            !l.is_empty()
                                && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
                        }));
                if !ok {
                    return Err(format!(
                        "--http-host: {v:?} is not a host name (without a port, e.g. box.example)"
                    ));
                }
                cfg.http_hosts.push(v);
            }
            "--memory-max" => cfg.limits.memory_max = Some(size(&flag, &value()?)? as u64),
            "--pids-max" => cfg.limits.pids_max = Some(parse_num(&flag, &value()?)?),
            "--cpu-max" => {
                let v = value()?;
                let pct: u32 = parse_num(&flag, v.trim_end_matches('%'))?;
                if pct == 0 {
                    return Err("--cpu-max must be at least 1 (percent of one CPU)".into());
                }
                cfg.limits.cpu_max = Some(pct);
            }
            "--max-pending-approvals" => cfg.max_pending_approvals = parse_num(&flag, &value()?)?,
            "--rlimit" => {
                let v = value()?;
                let (name, val) = v
                    .split_once('=')
                    .ok_or_else(|| format!("--rlimit: expected NAME=VALUE, got {v:?}"))?;
                let which = Rlimit::parse(name)
                    .ok_or_else(|| format!("--rlimit: unknown resource {name:?}"))?;
                let n = if val == "unlimited" {
                    u64::MAX
                } else {
                    parse_num::<u64>("--rlimit", val)?
                };
                cfg.rlimits.push((which, n));
            }
            other => return Err(format!("unknown option {other:?} (see --help)")),
        }
    }
    if !cfg.http_listen.is_empty() && cfg.http_token_file.is_none() && !cfg.http_no_auth {
        return Err(
            "--http-listen needs --http-token-file FILE (or --http-no-auth on a loopback address)"
                .into(),
        );
    }
    if cfg.http_no_auth {
        if let Some(a) = cfg.http_listen.iter().find(|a| !a.ip().is_loopback()) {
            return Err(format!(
                "--http-no-auth is for loopback addresses only, and {a} is not one: give \
                 --http-token-file FILE"
            ));
        }
    }
    if cfg.max_batch == 0 {
        return Err("--max-batch must be at least 1".into());
    }
    if cfg.max_message < 64 {
        return Err("--max-message must be at least 64 bytes".into());
    }
    if cfg.max_output_memory < 1 << 20 {
        return Err("--max-output-memory must be at least 1M".into());
    }
    if cfg.http_idle < Duration::from_secs(1) {
        return Err("--http-idle must be at least 1s".into());
    }
    if cfg.client_buffer < 64 << 10 {
        return Err("--client-buffer must be at least 64K".into());
    }
    cfg.output_limit = cfg.output_limit.min(cfg.max_output_limit);
    if !cfg.workdir.is_absolute() || !cfg.workdir.is_dir() {
        return Err(format!(
            "--workdir: {} is not an absolute path to a directory",
            cfg.workdir.display()
        ));
    }
    cfg.socket = default_socket(socket);
    Ok(Invocation::Run(Box::new(cfg)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn socket_resolution_order() {
        let none = |_: &str| None;
        let nobody_owns = |_: &Path| None;
        let resolve = |flag, env: &dyn Fn(&str) -> Option<OsString>, uid| {
            resolve_socket(flag, env, uid, &nobody_owns)
        };
        assert_eq!(resolve(Some("/x".into()), &none, 5), PathBuf::from("/x"));
        let env = |k: &str| (k == "EXECD_SOCKET").then(|| OsString::from("/e.sock"));
        assert_eq!(resolve(None, &env, 5), PathBuf::from("/e.sock"));
        let xdg = |k: &str| (k == "XDG_RUNTIME_DIR").then(|| OsString::from("/run/user/5"));
        assert_eq!(
            resolve(None, &xdg, 5),
            PathBuf::from("/run/user/5/execd.sock")
        );
        assert_eq!(resolve(None, &none, 0), PathBuf::from("/run/execd.sock"));
        assert_eq!(
            resolve(None, &none, 1000),
            PathBuf::from("/tmp/execd-1000/execd.sock")
        );
    }

    #[test]
    fn a_runtime_dir_of_ones_own_is_found_without_xdg_runtime_dir() {
        let none = |_: &str| None;
        let owned_by =
            |owner: u32| move |d: &Path| (d == Path::new("/run/user/1000")).then_some(owner);
        // Owned by the uid: before /tmp; owned by another: passed over.
        assert_eq!(
            socket_candidates(None, &none, 1000, &owned_by(1000)),
            [
                PathBuf::from("/run/user/1000/execd.sock"),
                PathBuf::from("/tmp/execd-1000/execd.sock")
            ]
        );
        assert_eq!(
            socket_candidates(None, &none, 1000, &owned_by(0)),
            [PathBuf::from("/tmp/execd-1000/execd.sock")]
        );
        // Root's own runtime directory comes before /run/execd.sock; XDG_RUNTIME_DIR
        // naming the same place lists it once.
        let root_owns = |d: &Path| (d == Path::new("/run/user/0")).then_some(0);
        let xdg = |k: &str| (k == "XDG_RUNTIME_DIR").then(|| OsString::from("/run/user/0"));
        let expect = [
            PathBuf::from("/run/user/0/execd.sock"),
            PathBuf::from("/run/execd.sock"),
            PathBuf::from("/tmp/execd-0/execd.sock"),
        ];
        assert_eq!(socket_candidates(None, &none, 0, &root_owns), expect);
        assert_eq!(socket_candidates(None, &xdg, 0, &root_owns), expect);
        // A named socket is the only one.
        let env = |k: &str| (k == "EXECD_SOCKET").then(|| OsString::from("/e.sock"));
        assert_eq!(
            socket_candidates(None, &env, 0, &root_owns),
            [PathBuf::from("/e.sock")]
        );
    }

    #[test]
    fn sizes_and_durations() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("64K"), Ok(65536));
        assert_eq!(parse_size("2M"), Ok(2 << 20));
        assert!(parse_size("x").is_err());
        assert_eq!(parse_duration("2"), Ok(Duration::from_secs(2)));
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
        assert!(parse_duration("-1").is_err());
    }

    #[test]
    fn every_bad_flag_value_names_its_flag() {
        // Every flag of the usage that takes a value, given one nothing accepts.
        let valued: Vec<&str> = USAGE
            .lines()
            .filter_map(|l| l.trim_start().strip_prefix("--"))
            .filter_map(|l| {
                let mut words = l.split_whitespace();
                let name = words.next()?;
                let value = words.next()?;
                value
                    .chars()
                    .next()
                    .filter(|c| c.is_ascii_uppercase() || *c == 'a')
                    .map(|_| name)
            })
            .collect();
        assert!(
            valued.contains(&"kill-grace") && valued.contains(&"cgroup"),
            "{valued:?}"
        );
        for name in valued {
            let flag = format!("--{name}");
            if [
                "--socket",
                "--shell",
                "--policy",
                "--audit",
                "--http-token-file",
                "--run-as",
                "--http-run-as",
                "--http-host",
                "--check-policy",
            ]
            .contains(&flag.as_str())
            {
                continue; // any text is a path or a name; checked when used
            }
            let e = parse_args([flag.clone(), "2x".to_string()])
                .err()
                .unwrap_or_else(|| panic!("{flag} 2x was accepted"));
            assert!(e.starts_with(&flag), "{flag} 2x: {e}");
        }
        let e = parse_args(["--kill-grace".to_string(), "2x".to_string()]).unwrap_err();
        assert!(
            e.starts_with("--kill-grace: invalid duration \"2x\""),
            "{e}"
        );
    }

    #[test]
    fn flags_parse_both_forms() {
        let args = [
            "--socket",
            "/s",
            "--max-clients=7",
            "--rlimit",
            "nofile=64",
            "--allow-uid",
            "5",
        ];
        let Ok(Invocation::Run(cfg)) = parse_args(args.map(String::from)) else {
            panic!()
        };
        assert_eq!(cfg.socket, PathBuf::from("/s"));
        assert_eq!(cfg.max_clients, 7);
        assert_eq!(cfg.rlimits, vec![(Rlimit::Nofile, 64)]);
        assert_eq!(cfg.allow_uids, vec![5]);
        assert!(parse_args(["--bogus".to_string()]).is_err());
        assert!(parse_args(["--max-clients".to_string()]).is_err());
        assert!(matches!(
            parse_args(["--help".to_string()]),
            Ok(Invocation::Help)
        ));
    }
}
