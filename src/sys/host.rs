//! The daemon's own process: inherited descriptors, its descriptor limit, its signal mask,
//! the allocator, the subreaper role, and a few file-system questions about paths it
//! owns. For execctl: the terminal's width, and children that outlive a Ctrl-C.

use std::io;
use std::os::fd::RawFd;
use std::path::Path;

use super::path_cstring;

/// Marks every descriptor above stderr close-on-exec: whatever the daemon inherited from
/// whoever started it must not leak into commands. (Rust's runtime already made sure 0, 1
/// and 2 are open, so no pipe of ours can land on them.)
pub fn cloexec_inherited() {
    let Ok(dir) = std::fs::read_dir("/proc/self/fd") else {
        return;
    };
    let fds: Vec<RawFd> = dir
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .filter(|&fd| fd > 2)
        .collect();
    for fd in fds {
        // SAFETY: F_SETFD on a descriptor number; one that closed meanwhile fails harmlessly.
        unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) };
    }
}

/// The daemon's descriptor limit once `raise_nofile` had its say.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Nofile {
    /// The soft limit the daemon runs with.
    pub limit: u64,
    /// The limits as they were at start, to restore in commands, if they were raised.
    pub raised_from: Option<(u64, u64)>,
}

/// Raises the daemon's soft descriptor limit to its hard limit (a service started with
/// the common soft limit of 1024 would otherwise run out at a few hundred commands).
pub fn raise_nofile() -> Nofile {
    // SAFETY: rlimit is plain old data for getrlimit to fill.
    let mut lim: libc::rlimit = unsafe { std::mem::zeroed() };
    // SAFETY: a pointer to a live rlimit.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return Nofile {
            limit: 1024,
            raised_from: None,
        };
    }
    let now = Nofile {
        limit: lim.rlim_cur as u64,
        raised_from: None,
    };
    if lim.rlim_cur >= lim.rlim_max {
        return now;
    }
    let raised = libc::rlimit {
        rlim_cur: lim.rlim_max,
        rlim_max: lim.rlim_max,
    };
    // SAFETY: a pointer to a live rlimit; raising the soft limit up to the hard one is allowed.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } != 0 {
        return now;
    }
    Nofile {
        limit: lim.rlim_max as u64,
        raised_from: Some((lim.rlim_cur as u64, lim.rlim_max as u64)),
    }
}

/// Unblocks signals the daemon handles, in case whoever started it had them blocked.
pub fn unblock_signals(sigs: &[i32]) {
    // SAFETY: sigset_t is plain old data, initialised by sigemptyset before use.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for &s in sigs {
            libc::sigaddset(&mut set, s);
        }
        libc::pthread_sigmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
    }
}

/// Has the allocator give large freed buffers back to the system at once. glibc raises
/// its mmap threshold as large blocks are freed, and then serves later output rings from
/// its heap, where freed ones stay: after a churn of commands the daemon would sit at
/// tens of megabytes with nothing running. A fixed threshold keeps every ring's storage
/// past 64 KiB in its own mapping, unmapped when freed.
pub fn tune_allocator() {
    #[cfg(target_env = "gnu")]
    // SAFETY: mallopt only changes the allocator's parameters; called before any thread.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 64 << 10);
    }
}

/// Hands freed heap memory back to the system (glibc keeps freed blocks, and after a
/// churn of commands whose output rings came and went the daemon would otherwise sit at
/// many times its idle size with nothing running). Called after large frees.
pub fn trim_heap() {
    #[cfg(target_env = "gnu")]
    // SAFETY: malloc_trim only returns free memory at the heap's top and in its arenas.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Makes the daemon the reaper of orphaned descendants, so they are reaped here too.
pub fn become_subreaper() -> io::Result<()> {
    // SAFETY: prctl with integer arguments only.
    if unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1 as libc::c_ulong, 0, 0, 0) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Changes the owner group of a path (the socket file, for `--socket-group`).
pub fn chown_group(path: &Path, gid: u32) -> io::Result<()> {
    std::os::unix::fs::chown(path, None, Some(gid))
}

/// Columns of the terminal on stdout, if stdout is one.
pub fn terminal_width() -> Option<usize> {
    // SAFETY: winsize is plain old data; TIOCGWINSZ writes at most its size into it.
    let mut ws: libc::winsize = unsafe { std::mem::zeroed() };
    // SAFETY: ioctl on fd 1 with a pointer to a live winsize.
    let rc = unsafe { libc::ioctl(1, libc::TIOCGWINSZ, &mut ws) };
    (rc == 0 && ws.ws_col > 0).then_some(ws.ws_col as usize)
}

/// Whether the effective user may write `path` (`faccessat(W_OK, AT_EACCESS)`), which
/// also sees a read-only mount and the immutable attribute, unlike the mode bits. Missing
/// files and other failures are errors, so "no" means only "refused".
pub fn writable(path: &Path) -> io::Result<bool> {
    let c = path_cstring(path)?;
    // SAFETY: `c` is a NUL-terminated string that lives across the call; the other
    // arguments are plain integers.
    let rc = unsafe { libc::faccessat(libc::AT_FDCWD, c.as_ptr(), libc::W_OK, libc::AT_EACCESS) };
    if rc == 0 {
        return Ok(true);
    }
    let err = io::Error::last_os_error();
    match err.raw_os_error() {
        Some(libc::EACCES | libc::EPERM | libc::EROFS) => Ok(false),
        _ => Err(err),
    }
}

/// Has `cmd`'s child ignore SIGINT. A Ctrl-C at a terminal goes to its whole foreground
/// process group: execctl's own ssh links (`execctl -H ssh://...`) are in it and must
/// survive it, since execctl turns the Ctrl-C into a kill of the remote command sent over
/// them. OpenSSH leaves an ignored SIGINT ignored, and so does a shell script standing in
/// for ssh; unlike a process group of its own, this keeps ssh in the foreground, where it
/// may still ask for a password or a host key on the terminal.
pub fn ignore_sigint_in_child(cmd: &mut std::process::Command) {
    use std::os::unix::process::CommandExt;
    // SAFETY: runs in the forked child before exec; signal(2) is async-signal-safe and
    // touches no memory of the parent.
    unsafe {
        cmd.pre_exec(|| {
            libc::signal(libc::SIGINT, libc::SIG_IGN);
            Ok(())
        });
    }
}

/// 32 bytes from the kernel's random source (`getrandom(2)`), for the secrets the daemon
/// makes shell sessions' nonces from.
pub fn random_secret() -> io::Result<[u8; 32]> {
    let mut buf = [0u8; 32];
    let mut got = 0;
    while got < buf.len() {
        // SAFETY: getrandom writes at most the given length into the buffer we own.
        let n = unsafe { libc::getrandom(buf[got..].as_mut_ptr().cast(), buf.len() - got, 0) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        got += n as usize;
    }
    Ok(buf)
}
