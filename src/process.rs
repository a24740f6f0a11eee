//! Processes at the syscall level: spawn (new session, parent-death signal, rlimits), group
//! signals, `wait4` reaping with rusage, pipes, and peer credentials. Every `unsafe` block
//! of the crate lives here.
//!
//! Invariants:
//! - Every descriptor execd opens is close-on-exec (std, mio and `pipe2(O_CLOEXEC)` ensure
//!   it), so a command inherits exactly its three stdio descriptors.
//! - A spawned command leads its own session and process group (`setsid`), so signalling
//!   `-pid` reaches it and everything it started that did not leave the group.
//! - Nothing here ever waits: reaping is `wait4(-1, WNOHANG)`, driven by SIGCHLD.

use std::ffi::OsString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::config::Rlimit;

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

/// How the command's stdio is wired.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Stdio3 {
    /// stdin `/dev/null`; stdout and stderr share one pipe, so their order is kept.
    Merged,
    /// stdin a pipe; stdout and stderr each their own pipe.
    Separate,
}

/// Everything `spawn` needs.
pub struct SpawnSpec<'a> {
    pub program: &'a Program,
    pub env: &'a [(String, String)],
    pub clean_env: bool,
    pub cwd: &'a Path,
    pub stdio: Stdio3,
    pub rlimits: &'a [(Rlimit, u64)],
    /// The descriptor limit to give back to the child (see `raise_nofile`).
    pub child_nofile: Option<(u64, u64)>,
}

/// A started command: its pid (also its process group and session id) and the parent's
/// ends of its pipes, all non-blocking and close-on-exec.
#[derive(Debug)]
pub struct Spawned {
    pub pid: i32,
    /// stdout (Separate) or the merged stdout+stderr pipe (Merged).
    pub out: OwnedFd,
    pub err: Option<OwnedFd>,
    pub stdin: Option<OwnedFd>,
}

/// Creates a pipe with both ends close-on-exec: `(read, write)`.
pub fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as RawFd; 2];
    // SAFETY: `fds` is a valid array of two ints for pipe2 to fill.
    let rc = unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: pipe2 succeeded, so both descriptors are open and owned by nobody else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// Puts a descriptor in non-blocking mode.
pub fn set_nonblocking(fd: RawFd) -> io::Result<()> {
    // SAFETY: fcntl on a descriptor we own; F_GETFL/F_SETFL take and return plain ints.
    unsafe {
        let flags = libc::fcntl(fd, libc::F_GETFL);
        if flags < 0 || libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Grows a pipe's kernel buffer so a chatty command needs fewer wakeups. Best effort: the
/// system limit (`/proc/sys/fs/pipe-max-size`) may refuse it, and that is fine.
fn grow_pipe(fd: RawFd) {
    const PIPE_SIZE: libc::c_int = 1 << 20;
    // SAFETY: F_SETPIPE_SZ on a pipe descriptor we own; failure is ignored on purpose.
    unsafe {
        libc::fcntl(fd, libc::F_SETPIPE_SZ, PIPE_SIZE);
    }
}

fn rlimit_resource(r: Rlimit) -> libc::__rlimit_resource_t {
    match r {
        Rlimit::Cpu => libc::RLIMIT_CPU,
        Rlimit::As => libc::RLIMIT_AS,
        Rlimit::Nofile => libc::RLIMIT_NOFILE,
        Rlimit::Nproc => libc::RLIMIT_NPROC,
        Rlimit::Fsize => libc::RLIMIT_FSIZE,
        Rlimit::Core => libc::RLIMIT_CORE,
    }
}

/// Starts a command. Spawn failures (no such program, permission denied, a working
/// directory that vanished) come back as the OS error and leave no process behind: std
/// reports exec failure through a close-on-exec pipe and reaps the failed child itself.
pub fn spawn(spec: &SpawnSpec) -> io::Result<Spawned> {
    let mut cmd = match spec.program {
        Program::Direct { program, args } => {
            let mut c = Command::new(program);
            c.args(args);
            c
        }
        Program::Shell { shell, line } => {
            let mut c = Command::new(shell);
            c.arg("-c").arg(line);
            c
        }
    };
    if spec.clean_env {
        cmd.env_clear();
    }
    for (k, v) in spec.env {
        cmd.env(k, v);
    }
    cmd.current_dir(spec.cwd);

    let (out_r, out_w) = pipe()?;
    let (err_r, stdin_w) = match spec.stdio {
        Stdio3::Merged => {
            let err_w = out_w.try_clone()?;
            cmd.stdin(Stdio::null())
                .stdout(Stdio::from(out_w))
                .stderr(Stdio::from(err_w));
            (None, None)
        }
        Stdio3::Separate => {
            let (err_r, err_w) = pipe()?;
            let (in_r, in_w) = pipe()?;
            cmd.stdin(Stdio::from(in_r))
                .stdout(Stdio::from(out_w))
                .stderr(Stdio::from(err_w));
            (Some(err_r), Some(in_w))
        }
    };

    let as_rlim = |v: u64| {
        if v == u64::MAX {
            libc::RLIM_INFINITY
        } else {
            v as libc::rlim_t
        }
    };
    // The daemon's raised descriptor limit goes back to what the child would have had;
    // the configured limits apply on top.
    let restore = spec.child_nofile.map(|(soft, hard)| {
        let lim = libc::rlimit {
            rlim_cur: as_rlim(soft),
            rlim_max: as_rlim(hard),
        };
        (libc::RLIMIT_NOFILE, lim)
    });
    let limits: Vec<(libc::__rlimit_resource_t, libc::rlimit)> = restore
        .into_iter()
        .chain(spec.rlimits.iter().map(|&(r, v)| {
            let lim = libc::rlimit {
                rlim_cur: as_rlim(v),
                rlim_max: as_rlim(v),
            };
            (rlimit_resource(r), lim)
        }))
        .collect();
    // SAFETY: getpid cannot fail.
    let daemon_pid = unsafe { libc::getpid() };
    // SAFETY: the closure runs in the forked child before exec and only makes
    // async-signal-safe system calls on memory prepared before the fork.
    unsafe {
        cmd.pre_exec(move || {
            if libc::setsid() < 0 {
                return Err(io::Error::last_os_error());
            }
            if libc::prctl(
                libc::PR_SET_PDEATHSIG,
                libc::SIGKILL as libc::c_ulong,
                0,
                0,
                0,
            ) < 0
            {
                return Err(io::Error::last_os_error());
            }
            // The daemon may have died between fork and prctl: then nobody would kill us.
            if libc::getppid() != daemon_pid {
                libc::_exit(137);
            }
            for (res, lim) in &limits {
                if libc::setrlimit(*res, lim) < 0 {
                    return Err(io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
    let child = cmd.spawn()?;
    // The command line is gone with `cmd`: the write ends the child holds are closed here.
    drop(cmd);
    let pid = child.id() as i32;
    // `Child` is dropped without waiting: reaping belongs to the SIGCHLD loop.
    drop(child);

    for fd in [Some(&out_r), err_r.as_ref(), stdin_w.as_ref()]
        .into_iter()
        .flatten()
    {
        set_nonblocking(fd.as_raw_fd())?;
    }
    grow_pipe(out_r.as_raw_fd());
    Ok(Spawned {
        pid,
        out: out_r,
        err: err_r,
        stdin: stdin_w,
    })
}

/// Sends `sig` to process group `pgid`. A group that no longer exists is not an error.
pub fn signal_group(pgid: i32, sig: i32) {
    if pgid <= 1 {
        return; // never signal -1 (everything) or -0 (our own group)
    }
    // SAFETY: kill takes plain integers; a negative pid addresses a process group.
    unsafe {
        libc::kill(-pgid, sig);
    }
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

/// One reaped child.
#[derive(Debug, Clone, Copy)]
pub struct Reaped {
    pub pid: i32,
    pub ended: Ended,
    pub usage: Usage,
}

fn timeval(tv: libc::timeval) -> Duration {
    Duration::from_secs(tv.tv_sec.max(0) as u64) + Duration::from_micros(tv.tv_usec.max(0) as u64)
}

/// Reaps one exited child, ours or a re-parented orphan, without blocking.
pub fn reap_one() -> Option<Reaped> {
    let mut status: libc::c_int = 0;
    // SAFETY: rusage is plain old data; zeroed is a valid value for wait4 to overwrite.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    loop {
        // SAFETY: status and ru are valid for writes; WNOHANG makes this return at once.
        let pid = unsafe { libc::wait4(-1, &mut status, libc::WNOHANG, &mut ru) };
        if pid > 0 {
            let ended = if libc::WIFSIGNALED(status) {
                Ended::Signal(libc::WTERMSIG(status))
            } else {
                Ended::Code(libc::WEXITSTATUS(status))
            };
            let usage = Usage {
                user: timeval(ru.ru_utime),
                system: timeval(ru.ru_stime),
                max_rss_kb: ru.ru_maxrss.max(0) as u64,
            };
            return Some(Reaped { pid, ended, usage });
        }
        if pid < 0 && io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
            continue;
        }
        return None; // 0: children remain but none has exited; ECHILD: no children
    }
}

/// Raises the daemon's soft descriptor limit to its hard limit (a service started with
/// the common soft limit of 1024 would otherwise run out at about a thousand commands).
/// Returns the limits as they were, to restore in children, or `None` if nothing changed.
pub fn raise_nofile() -> Option<(u64, u64)> {
    // SAFETY: rlimit is plain old data for getrlimit to fill.
    let mut lim: libc::rlimit = unsafe { std::mem::zeroed() };
    // SAFETY: a pointer to a live rlimit.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0
        || lim.rlim_cur >= lim.rlim_max
    {
        return None;
    }
    let before = (lim.rlim_cur as u64, lim.rlim_max as u64);
    let raised = libc::rlimit {
        rlim_cur: lim.rlim_max,
        rlim_max: lim.rlim_max,
    };
    // SAFETY: a pointer to a live rlimit; raising the soft limit up to the hard one is allowed.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } != 0 {
        return None;
    }
    Some(before)
}

/// Makes the daemon the reaper of orphaned descendants, so they are reaped here too.
pub fn become_subreaper() -> io::Result<()> {
    // SAFETY: prctl with integer arguments only.
    if unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1 as libc::c_ulong, 0, 0, 0) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Credentials of the process at the other end of a Unix socket.
#[derive(Debug, Clone, Copy)]
pub struct PeerCred {
    pub pid: i32,
    pub uid: u32,
    pub gid: u32,
}

/// Reads `SO_PEERCRED`.
pub fn peer_cred(fd: RawFd) -> io::Result<PeerCred> {
    // SAFETY: ucred is plain old data; getsockopt writes at most `len` bytes into it.
    let mut cred: libc::ucred = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: pointers to live locals with the length that describes them.
    let rc = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(PeerCred {
        pid: cred.pid,
        uid: cred.uid,
        gid: cred.gid,
    })
}

/// The daemon's real uid.
pub fn current_uid() -> u32 {
    // SAFETY: getuid cannot fail.
    unsafe { libc::getuid() }
}

/// Changes the owner group of a path (the socket file, for `--socket-group`).
pub fn chown_group(path: &Path, gid: u32) -> io::Result<()> {
    std::os::unix::fs::chown(path, None, Some(gid))
}

/// Takes the listening socket systemd passed (fd 3) when `LISTEN_PID` is us and
/// `LISTEN_FDS` is 1.
pub fn systemd_listener(
    listen_pid: Option<OsString>,
    listen_fds: Option<OsString>,
) -> Option<std::os::unix::net::UnixListener> {
    let pid: i32 = listen_pid?.to_str()?.parse().ok()?;
    let fds: i32 = listen_fds?.to_str()?.parse().ok()?;
    // SAFETY: getpid cannot fail.
    if pid != unsafe { libc::getpid() } || fds != 1 {
        return None;
    }
    const SD_LISTEN_FDS_START: RawFd = 3;
    // SAFETY: systemd hands fd 3 to exactly this pid (checked above) as the listening
    // socket; nothing else in the process owns it.
    let listener = unsafe { std::os::unix::net::UnixListener::from_raw_fd(SD_LISTEN_FDS_START) };
    // SAFETY: setting FD_CLOEXEC on the fd we now own.
    unsafe {
        libc::fcntl(SD_LISTEN_FDS_START, libc::F_SETFD, libc::FD_CLOEXEC);
    }
    Some(listener)
}

/// Signals a client may name, with their numbers.
const SIGNALS: &[(&str, i32)] = &[
    ("SIGHUP", libc::SIGHUP),
    ("SIGINT", libc::SIGINT),
    ("SIGQUIT", libc::SIGQUIT),
    ("SIGKILL", libc::SIGKILL),
    ("SIGUSR1", libc::SIGUSR1),
    ("SIGUSR2", libc::SIGUSR2),
    ("SIGTERM", libc::SIGTERM),
    ("SIGCONT", libc::SIGCONT),
    ("SIGSTOP", libc::SIGSTOP),
];

/// The signal a client names, with or without the `SIG` prefix, in any case.
pub fn signal_by_name(name: &str) -> Option<i32> {
    let upper = name.to_ascii_uppercase();
    let full = if upper.starts_with("SIG") {
        upper
    } else {
        format!("SIG{upper}")
    };
    SIGNALS.iter().find(|(n, _)| *n == full).map(|&(_, s)| s)
}

/// The conventional name of a signal number, e.g. `"SIGKILL"`.
pub fn signal_name(sig: i32) -> String {
    let known = match sig {
        libc::SIGHUP => "SIGHUP",
        libc::SIGINT => "SIGINT",
        libc::SIGQUIT => "SIGQUIT",
        libc::SIGILL => "SIGILL",
        libc::SIGTRAP => "SIGTRAP",
        libc::SIGABRT => "SIGABRT",
        libc::SIGBUS => "SIGBUS",
        libc::SIGFPE => "SIGFPE",
        libc::SIGKILL => "SIGKILL",
        libc::SIGUSR1 => "SIGUSR1",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGUSR2 => "SIGUSR2",
        libc::SIGPIPE => "SIGPIPE",
        libc::SIGALRM => "SIGALRM",
        libc::SIGTERM => "SIGTERM",
        libc::SIGSTKFLT => "SIGSTKFLT",
        libc::SIGCHLD => "SIGCHLD",
        libc::SIGCONT => "SIGCONT",
        libc::SIGSTOP => "SIGSTOP",
        libc::SIGTSTP => "SIGTSTP",
        libc::SIGTTIN => "SIGTTIN",
        libc::SIGTTOU => "SIGTTOU",
        libc::SIGURG => "SIGURG",
        libc::SIGXCPU => "SIGXCPU",
        libc::SIGXFSZ => "SIGXFSZ",
        libc::SIGVTALRM => "SIGVTALRM",
        libc::SIGPROF => "SIGPROF",
        libc::SIGWINCH => "SIGWINCH",
        libc::SIGIO => "SIGIO",
        libc::SIGPWR => "SIGPWR",
        libc::SIGSYS => "SIGSYS",
        _ => return format!("SIG{sig}"),
    };
    known.to_string()
}

/// Columns of the terminal on stdout, if stdout is one.
pub fn terminal_width() -> Option<usize> {
    // SAFETY: winsize is plain old data; TIOCGWINSZ writes at most its size into it.
    let mut ws: libc::winsize = unsafe { std::mem::zeroed() };
    // SAFETY: ioctl on fd 1 with a pointer to a live winsize.
    let rc = unsafe { libc::ioctl(1, libc::TIOCGWINSZ, &mut ws) };
    (rc == 0 && ws.ws_col > 0).then_some(ws.ws_col as usize)
}

/// Whether a process exists (or is an unreaped zombie) under `pid`.
pub fn pid_exists(pid: i32) -> bool {
    // SAFETY: signal 0 only checks for existence and permission.
    unsafe { libc::kill(pid, 0) == 0 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signal_names_round_trip() {
        assert_eq!(signal_by_name("SIGINT"), Some(libc::SIGINT));
        assert_eq!(signal_by_name("term"), Some(libc::SIGTERM));
        assert_eq!(signal_by_name("SIGSEGV"), None);
        assert_eq!(signal_name(libc::SIGKILL), "SIGKILL");
        assert_eq!(signal_name(200), "SIG200");
    }
}
