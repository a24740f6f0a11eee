//! The system calls of an upgrade in place (PROTOCOL 13): the state in a sealed memfd,
//! close-on-exec cleared on exactly the descriptors carried, signals held across the
//! `execve`, the `execve` itself (of the new binary, or of the old one through a
//! descriptor of its executable for a hand-back), and on the other side the checks that
//! every descriptor named is still there.
//!
//! Invariants:
//! - Nothing here closes a descriptor it did not open: the carried ones belong to the
//!   rooms that carry them until the `execve` succeeds, and to the new image after.
//! - Signals the daemon handles are blocked from just before the `execve` until the new
//!   image has installed its handlers: a SIGTERM in between is pending, not fatal (their
//!   default action, which `execve` restores, would end the daemon and every command).

use std::ffi::{CString, OsStr, OsString};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use super::cstring;

/// The variable a refusing image sets for the old one it hands the state back to: why.
pub const REFUSED_VAR: &str = "EXECD_UPGRADE_REFUSED";
/// Set to `1` in the daemon's environment, it makes an image resuming from an upgrade
/// refuse the state (never one resuming from a hand-back): for tests of the hand-back.
pub const TEST_REFUSE_VAR: &str = "EXECD_TEST_REFUSE_STATE";

/// Set to a number of milliseconds in the daemon's environment, it makes an image
/// resuming from an upgrade wait that long before it rebuilds anything, with no image
/// serving: for tests of commands that exit during the swap (their exits wait as zombies
/// for the new image).
pub const TEST_PAUSE_VAR: &str = "EXECD_TEST_SWAP_PAUSE_MS";

/// The nice value the daemon takes for an upgrade's swap where it may not run it in real
/// time (`raise_for_swap`).
pub const SWAP_NICE: i32 = -10;

/// Raises the calling thread's priority for an upgrade's swap, where the daemon may (root,
/// or `CAP_SYS_NICE`): the new image needs a CPU for a few tens of milliseconds while the
/// clients it serves (a build, streamers) keep both cores busy, and at the default weight
/// it queued behind them for hundreds (issue 33); a nice of -10 still left it waiting
/// behind a hundred busy threads. So `SCHED_RR` at the lowest real-time priority, with
/// `SCHED_RESET_ON_FORK` (nothing it starts inherits it), else nice `SWAP_NICE`. Returns
/// the nice value it had, to put back once the image that goes on serves (`lower_after_swap`);
/// none when nothing was raised: a daemon without `CAP_SYS_NICE`, one the operator runs
/// at a nice other than 0 or under a policy of their own. Both cross the `execve`, as
/// the loop's thread is the process's only one. `nice_too`: whether nice may stand in
/// for real time (not while commands may still be started, as they would inherit it;
/// real time they do not).
pub fn raise_for_swap(nice_too: bool) -> Option<i32> {
    // Only with CAP_SYS_NICE: a daemon that may enter real time by its RLIMIT_RTPRIO alone
    // may not clear SCHED_RESET_ON_FORK again, and would stay there.
    // SAFETY: plain integers; 0 is the calling thread.
    if !has_sys_nice() || unsafe { libc::sched_getscheduler(0) } != libc::SCHED_OTHER {
        return None;
    }
    // SAFETY: plain integers; 0 is the calling thread. (An error answers -1: not 0.)
    let before = unsafe { libc::getpriority(libc::PRIO_PROCESS, 0) };
    // Only from the default nice: a process started by a real-time one gets nice 0 (the
    // kernel's reset on fork), which for a daemon run at a positive nice would raise what
    // the drain starts.
    if before != 0 {
        return None;
    }
    let rt = libc::sched_param { sched_priority: 1 };
    // SAFETY: a sched_param we own; 0 is the calling thread.
    if unsafe { libc::sched_setscheduler(0, libc::SCHED_RR | libc::SCHED_RESET_ON_FORK, &rt) } == 0
    {
        return Some(before);
    }
    if !nice_too {
        return None;
    }
    // SAFETY: plain integers; 0 is the calling thread.
    (unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, SWAP_NICE) } == 0).then_some(before)
}

/// Runs the upgrade's pre-flight `pid` (the new binary with `--upgrade-check`) as the
/// daemon runs once `raise_for_swap` raised it: `SCHED_RR` at the lowest real-time
/// priority, with `SCHED_RESET_ON_FORK`. A child that already ended is left alone; where
/// the kernel refuses, it runs at the normal priority, as before.
pub fn raise_pre_flight(pid: libc::pid_t) {
    let rt = libc::sched_param { sched_priority: 1 };
    // SAFETY: a sched_param we own; pid is the daemon's own child, not yet reaped.
    unsafe { libc::sched_setscheduler(pid, libc::SCHED_RR | libc::SCHED_RESET_ON_FORK, &rt) };
}

/// Whether the daemon holds `CAP_SYS_NICE` in its effective set (`CapEff` of
/// `/proc/self/status`).
fn has_sys_nice() -> bool {
    const CAP_SYS_NICE: u32 = 23;
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            let hex = s.lines().find_map(|l| l.strip_prefix("CapEff:"))?;
            u64::from_str_radix(hex.trim(), 16).ok()
        })
        .is_some_and(|eff| eff & (1 << CAP_SYS_NICE) != 0)
}

/// Puts the calling thread back as it was before `raise_for_swap`: the normal policy and
/// the nice value `nice` it had. Whether it is out of real time now (a seccomp filter or
/// a security module could refuse even that).
pub fn lower_after_swap(nice: i32) -> bool {
    let normal = libc::sched_param { sched_priority: 0 };
    // SAFETY: a sched_param we own, plain integers; 0 is the calling thread. Leaving real
    // time and raising one's nice value are always allowed; clearing
    // SCHED_RESET_ON_FORK is not (an image that lost CAP_SYS_NICE, say one installed
    // without the file capability the old one had), and then the normal policy with
    // the flag kept is what is left to ask for, rather than staying in real time.
    unsafe {
        if libc::sched_getscheduler(0) & !libc::SCHED_RESET_ON_FORK != libc::SCHED_OTHER
            && libc::sched_setscheduler(0, libc::SCHED_OTHER, &normal) != 0
        {
            libc::sched_setscheduler(0, libc::SCHED_OTHER | libc::SCHED_RESET_ON_FORK, &normal);
        }
        libc::setpriority(libc::PRIO_PROCESS, 0, nice);
    }
    !real_time()
}

/// Whether the calling thread runs in real time (what `raise_for_swap` gives where the
/// kernel lets it; nice alone, the fallback, is not): its children do not inherit it.
pub fn real_time() -> bool {
    // SAFETY: plain integers; 0 is the calling thread.
    let policy = unsafe { libc::sched_getscheduler(0) };
    policy >= 0 && policy & !libc::SCHED_RESET_ON_FORK == libc::SCHED_RR
}

/// CLOCK_MONOTONIC in nanoseconds: the clock both images read, where `Instant` cannot
/// travel.
pub fn monotonic_ns() -> i64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes a timespec we own.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec * 1_000_000_000 + ts.tv_nsec
}

/// A sealed memfd holding `parts` one after the other, its offset at 0, close-on-exec
/// (cleared with the others just before the `execve`).
pub fn memfd_with(parts: &[&[u8]]) -> io::Result<OwnedFd> {
    // SAFETY: a NUL-terminated name and plain flags.
    let fd = unsafe {
        libc::memfd_create(
            c"execd-state".as_ptr(),
            libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: memfd_create returned a new descriptor nobody else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let mut file = std::fs::File::from(fd);
    for part in parts {
        io::Write::write_all(&mut file, part)?;
    }
    let fd = OwnedFd::from(file);
    let seals = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_WRITE | libc::F_SEAL_SEAL;
    // SAFETY: fcntl and lseek on a descriptor we own, with plain integer arguments.
    unsafe {
        if libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, seals) < 0
            || libc::lseek(fd.as_raw_fd(), 0, libc::SEEK_SET) < 0
        {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(fd)
}

/// Everything `fd` holds, from its start (the state's memfd). The descriptor stays open:
/// a hand-back passes it on.
pub fn read_whole(fd: RawFd) -> io::Result<Vec<u8>> {
    let mut out = Vec::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        // SAFETY: pread writes at most `buf.len()` bytes into `buf`.
        let n = unsafe {
            libc::pread(
                fd,
                buf.as_mut_ptr().cast(),
                buf.len(),
                out.len() as libc::off_t,
            )
        };
        match n {
            0 => return Ok(out),
            n if n > 0 => out.extend_from_slice(&buf[..n as usize]),
            _ => {
                let e = io::Error::last_os_error();
                if e.kind() != io::ErrorKind::Interrupted {
                    return Err(e);
                }
            }
        }
    }
}

/// Sets or clears close-on-exec on `fd`.
pub fn set_cloexec(fd: RawFd, on: bool) -> io::Result<()> {
    // SAFETY: F_SETFD on a descriptor number with a plain flag; a bad number fails.
    let rc = unsafe { libc::fcntl(fd, libc::F_SETFD, if on { libc::FD_CLOEXEC } else { 0 }) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// What a carried descriptor must be.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum FdKind {
    /// A socket (a listener or a connection).
    Socket,
    /// A pipe end, a terminal or a socket pair's end (a command's output, stdin or PTY
    /// master, a shell's command channel).
    Stream,
    /// Anything open (the inotify descriptor, the audit file).
    Any,
}

/// Whether `fd` is open and of `kind`; the error says what it is instead.
pub fn check_fd(fd: RawFd, kind: FdKind) -> Result<(), String> {
    let mut st = std::mem::MaybeUninit::<libc::stat>::uninit();
    // SAFETY: fstat writes a stat we own; a closed descriptor fails with EBADF.
    if fd < 0 || unsafe { libc::fstat(fd, st.as_mut_ptr()) } != 0 {
        return Err(format!(
            "descriptor {fd} is not open: {}",
            io::Error::last_os_error()
        ));
    }
    // SAFETY: fstat succeeded, so it filled `st`.
    let mode = unsafe { st.assume_init() }.st_mode & libc::S_IFMT;
    let ok = match kind {
        FdKind::Socket => mode == libc::S_IFSOCK,
        FdKind::Stream => mode == libc::S_IFIFO || mode == libc::S_IFCHR || mode == libc::S_IFSOCK,
        FdKind::Any => true,
    };
    if ok {
        Ok(())
    } else {
        Err(format!("descriptor {fd} is not a {kind:?} (mode {mode:o})"))
    }
}

/// The descriptors an upgrade carried, taken as duplicates (close-on-exec): the numbers
/// the state names stay as they are, so that a hand-back can pass them on, until
/// `commit` closes them. A failure on the way drops duplicates only.
pub struct Carried {
    dups: std::collections::HashMap<RawFd, OwnedFd>,
}

impl Carried {
    /// Duplicates every descriptor named, which checks it is open; a socket or another
    /// file is also checked to be what it must be (the pipes, the many, only by their
    /// duplication: an upgrade with a thousand commands pays for no more).
    pub fn take_all(fds: &[(RawFd, FdKind)]) -> Result<Carried, String> {
        let mut dups = std::collections::HashMap::new();
        for &(fd, kind) in fds {
            if kind != FdKind::Stream {
                check_fd(fd, kind)?;
            }
            // SAFETY: F_DUPFD_CLOEXEC on a descriptor just checked open returns a new one
            // nobody else owns, or -1.
            let dup = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 3) };
            if dup < 0 {
                return Err(format!(
                    "duplicating descriptor {fd}: {}",
                    io::Error::last_os_error()
                ));
            }
            // SAFETY: as above.
            dups.insert(fd, unsafe { OwnedFd::from_raw_fd(dup) });
        }
        Ok(Carried { dups })
    }

    /// The duplicate of carried descriptor `fd`, once.
    pub fn take(&mut self, fd: RawFd) -> Result<OwnedFd, String> {
        self.dups.remove(&fd).ok_or_else(|| {
            format!("descriptor {fd} is not one the state carries, or is named twice")
        })
    }

    /// The new image keeps the state: the numbers it was carried under (and the other
    /// descriptors the writer left open for it, `also`) are closed.
    pub fn commit(self, originals: &[RawFd]) {
        for &fd in originals {
            // SAFETY: numbers the writer left open for this image and nothing here owns
            // (only their duplicates are in use).
            unsafe { libc::close(fd) };
        }
    }
}

/// Blocks `sigs` (they stay pending across `execve`). Returns what to restore if the
/// `execve` fails.
pub fn block_signals(sigs: &[i32]) -> libc::sigset_t {
    // SAFETY: sigset_t is plain old data, initialised by sigemptyset before use.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        let mut before: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for &s in sigs {
            libc::sigaddset(&mut set, s);
        }
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, &mut before);
        before
    }
}

/// Puts back the signal mask `block_signals` returned.
pub fn restore_signals(before: &libc::sigset_t) {
    // SAFETY: a mask pthread_sigmask itself filled.
    unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, before, std::ptr::null_mut()) };
}

/// A descriptor of the executable this process runs (`/proc/self/exe`, which stays the
/// old file even when a new one was renamed over its path): what a hand-back executes.
pub fn own_executable() -> io::Result<OwnedFd> {
    // SAFETY: a NUL-terminated path and plain flags.
    let fd = unsafe { libc::open(c"/proc/self/exe".as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: open returned a new descriptor nobody else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// What to execute.
pub enum Image<'a> {
    /// A file by its path.
    Path(&'a Path),
    /// The executable open at this descriptor (a hand-back to the old image).
    Fd(RawFd),
}

/// Replaces this process with `image`, `argv[0]` `arg0` and `args` after it, in this
/// environment plus `extra` (a name and value). Returns only on failure, with the error.
pub fn exec(
    image: Image,
    arg0: &OsStr,
    args: &[OsString],
    extra: Option<(&str, &str)>,
) -> io::Error {
    let run = || -> io::Result<io::Error> {
        let argv: Vec<CString> = std::iter::once(arg0)
            .chain(args.iter().map(OsString::as_os_str))
            .map(|a| cstring(a.as_bytes()))
            .collect::<io::Result<_>>()?;
        let mut envp: Vec<CString> = Vec::new();
        for (k, v) in std::env::vars_os() {
            if extra.is_some_and(|(name, _)| k == name) {
                continue;
            }
            let mut kv = k.as_bytes().to_vec();
            kv.push(b'=');
            kv.extend_from_slice(v.as_bytes());
            envp.push(cstring(kv)?);
        }
        if let Some((k, v)) = extra {
            envp.push(cstring(format!("{k}={v}"))?);
        }
        let argv_p: Vec<*const libc::c_char> = argv
            .iter()
            .map(|c| c.as_ptr())
            .chain(std::iter::once(std::ptr::null()))
            .collect();
        let envp_p: Vec<*const libc::c_char> = envp
            .iter()
            .map(|c| c.as_ptr())
            .chain(std::iter::once(std::ptr::null()))
            .collect();
        match image {
            Image::Path(path) => {
                let path = super::path_cstring(path)?;
                // SAFETY: NUL-terminated strings and NULL-terminated arrays of them, all
                // alive across the call; execve returns only on failure.
                unsafe { libc::execve(path.as_ptr(), argv_p.as_ptr(), envp_p.as_ptr()) };
            }
            Image::Fd(fd) => {
                // SAFETY: as above, with the executable given by an open descriptor.
                unsafe {
                    libc::execveat(
                        fd,
                        c"".as_ptr(),
                        argv_p.as_ptr().cast(),
                        envp_p.as_ptr().cast(),
                        libc::AT_EMPTY_PATH,
                    )
                };
            }
        }
        Ok(io::Error::last_os_error())
    };
    match run() {
        Ok(e) | Err(e) => e,
    }
}

/// `argv[0]` as an absolute path, as the daemon was started (PROTOCOL 13): relative to
/// `cwd` when it names a directory, else the first executable file of that name in
/// `path_var`. Symlinks are not resolved, so a package manager that renames a new file
/// over the path, or moves a symlink, is followed at the next upgrade.
pub fn absolute_binary(
    argv0: &OsStr,
    cwd: &Path,
    path_var: Option<&OsStr>,
) -> Option<std::path::PathBuf> {
    let p = Path::new(argv0);
    if argv0.as_bytes().contains(&b'/') {
        // `./execd` is `CWD/execd`: `.` components go (lexically; nothing is resolved).
        let joined = if p.is_absolute() {
            p.to_path_buf()
        } else {
            cwd.join(p)
        };
        return Some(joined.components().collect());
    }
    let dirs = path_var?;
    std::env::split_paths(dirs)
        .map(|d| if d.is_absolute() { d } else { cwd.join(d) })
        .map(|d| d.join(p))
        .find(|c| {
            use std::os::unix::fs::PermissionsExt;
            std::fs::metadata(c).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_memfd_holds_its_parts_and_is_sealed() {
        let fd = memfd_with(&[b"EXECD", b"ST\n"]).unwrap();
        assert_eq!(read_whole(fd.as_raw_fd()).unwrap(), b"EXECDST\n");
        // SAFETY: a write of two bytes from a static buffer to a descriptor we own.
        let n = unsafe { libc::write(fd.as_raw_fd(), b"xy".as_ptr().cast(), 2) };
        assert_eq!(n, -1, "sealed against writes");
        check_fd(fd.as_raw_fd(), FdKind::Any).unwrap();
        assert!(check_fd(fd.as_raw_fd(), FdKind::Socket).is_err());
        set_cloexec(fd.as_raw_fd(), false).unwrap();
        // SAFETY: F_GETFD on a descriptor we own.
        assert_eq!(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETFD) }, 0);
        let n = fd.as_raw_fd();
        drop(fd);
        assert!(check_fd(n, FdKind::Any).unwrap_err().contains("not open"));
    }

    #[test]
    fn argv0_is_made_absolute_without_resolving_links() {
        let cwd = Path::new("/srv");
        assert_eq!(
            absolute_binary(OsStr::new("bin/execd"), cwd, None),
            Some("/srv/bin/execd".into())
        );
        assert_eq!(
            absolute_binary(OsStr::new("/usr/bin/execd"), cwd, None),
            Some("/usr/bin/execd".into())
        );
        assert_eq!(
            absolute_binary(OsStr::new("./bin/../execd"), cwd, None),
            Some("/srv/bin/../execd".into()),
            "`..` may cross a symlink: kept"
        );
        let found = absolute_binary(OsStr::new("sh"), cwd, Some(OsStr::new("/nonexistent:/bin")));
        assert_eq!(found, Some("/bin/sh".into()));
        assert_eq!(absolute_binary(OsStr::new("sh"), cwd, None), None);
    }
}
