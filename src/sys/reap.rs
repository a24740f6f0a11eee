//! Signals to commands and their reaping: a process group, a single pid, and
//! `wait4(-1, WNOHANG)` with rusage, driven by SIGCHLD read from a signalfd
//! (`ExitSignals`). Nothing here ever waits.
//!
//! A signal never goes to a pid that is not a single positive process id: `kill(0)`,
//! `kill(-1)` and negative numbers address groups or everything, never what a
//! `cgroup.procs` line meant.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

use crate::types::{Ended, Usage};

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

/// The calling thread's children, as the kernel lists them
/// (`/proc/thread-self/children`): what it started and, when it is the daemon's main
/// thread, what was re-parented to the daemon (orphans go to a subreaper's thread-group
/// leader while it lives). `file` keeps the list open between calls (read with `pread`
/// from offset 0 to the end); `buf` is reused. None when the kernel does not list
/// children (no `CONFIG_PROC_CHILDREN`) or the list cannot be read.
pub fn own_children(file: &mut Option<std::fs::File>, buf: &mut Vec<u8>) -> Option<Vec<i32>> {
    use std::os::unix::fs::FileExt;
    if file.is_none() {
        *file = std::fs::File::open("/proc/thread-self/children").ok();
    }
    let f = file.as_ref()?;
    buf.clear();
    let mut chunk = [0u8; 4096];
    loop {
        match f.read_at(&mut chunk, buf.len() as u64) {
            Ok(0) => break,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => {
                *file = None;
                return None;
            }
        }
    }
    let text = std::str::from_utf8(buf).ok()?;
    text.split_ascii_whitespace()
        .map(|pid| pid.parse().ok())
        .collect()
}

/// Whether process `pid` has children of its own, any thread's
/// (`/proc/PID/task/TID/children`: no memory lock is taken). None when that cannot be
/// told (the kernel lists no children, or a read failed).
pub fn has_children(pid: i32) -> Option<bool> {
    let tasks = std::path::PathBuf::from(format!("/proc/{pid}/task"));
    for task in std::fs::read_dir(&tasks).ok()? {
        let list = std::fs::read(tasks.join(task.ok()?.file_name()).join("children")).ok()?;
        if list.iter().any(u8::is_ascii_digit) {
            return Some(true);
        }
    }
    Some(false)
}

/// One reaped child.
#[derive(Debug, Clone, Copy)]
pub struct ChildExit {
    pub pid: i32,
    pub ended: Ended,
    pub usage: Usage,
}

fn timeval(tv: libc::timeval) -> Duration {
    Duration::from_secs(tv.tv_sec.max(0) as u64) + Duration::from_micros(tv.tv_usec.max(0) as u64)
}

/// Reaps one exited child, ours or a re-parented orphan, without blocking.
pub fn reap_one() -> Option<ChildExit> {
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
            return Some(ChildExit { pid, ended, usage });
        }
        if pid < 0 && io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
            continue;
        }
        return None; // 0: children remain but none has exited; ECHILD: no children
    }
}

/// Children's exits as a descriptor the loop polls: a `signalfd` for SIGCHLD, which the
/// daemon keeps blocked from here on (a pending SIGCHLD is what makes it readable), so no
/// handler runs, nothing is written to a pipe for the loop, and no system call of the
/// loop's is interrupted. Commands start with no signal blocked (`sys::spawn`). SIGCHLD
/// stays blocked across an upgrade's `execve`, and the image that goes on makes a
/// `reap_all` once it resumes, which finds whatever exited meanwhile.
pub struct ExitSignals(OwnedFd);

impl ExitSignals {
    /// Blocks SIGCHLD and opens the signalfd. A daemon started with SIGCHLD ignored would
    /// have its children reaped by the kernel, leaving `wait4` nothing: that disposition
    /// goes back to the default. A default one is left alone, since setting SIG_DFL again
    /// would discard a pending SIGCHLD (one that came during an upgrade's `execve`).
    pub fn new() -> io::Result<ExitSignals> {
        // SAFETY: sigaction and sigset_t are plain old data, initialised before use; the
        // mask is the calling thread's, the loop's and the process's only one.
        unsafe {
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, libc::SIGCHLD);
            libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
            let mut now: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(libc::SIGCHLD, std::ptr::null(), &mut now) != 0 {
                return Err(io::Error::last_os_error());
            }
            // `execve` clears every action's flags, so SA_NOCLDWAIT (which also has the
            // kernel reap) cannot be inherited; it is looked for all the same.
            if now.sa_sigaction == libc::SIG_IGN || now.sa_flags & libc::SA_NOCLDWAIT != 0 {
                let mut dfl: libc::sigaction = std::mem::zeroed();
                dfl.sa_sigaction = libc::SIG_DFL;
                libc::sigemptyset(&mut dfl.sa_mask);
                if libc::sigaction(libc::SIGCHLD, &dfl, std::ptr::null_mut()) != 0 {
                    return Err(io::Error::last_os_error());
                }
            }
            let fd = libc::signalfd(-1, &set, libc::SFD_NONBLOCK | libc::SFD_CLOEXEC);
            if fd < 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(ExitSignals(OwnedFd::from_raw_fd(fd)))
        }
    }

    /// The descriptor to poll: readable while a SIGCHLD is pending.
    pub fn fd(&self) -> RawFd {
        self.0.as_raw_fd()
    }

    /// Takes what is pending: whether to reap (one SIGCHLD stands for any number of
    /// exits, as the kernel merges them; `reap_one` until it finds none). A read that fails
    /// otherwise than by finding nothing says to reap too: reaping finds out.
    pub fn take(&self) -> bool {
        // SAFETY: signalfd_siginfo is plain old data; zeroed is valid for read to fill.
        let mut info: [libc::signalfd_siginfo; 4] = unsafe { std::mem::zeroed() };
        let size = std::mem::size_of_val(&info);
        let mut any = false;
        loop {
            // SAFETY: a read into our buffer of `size` bytes.
            let n = unsafe { libc::read(self.fd(), info.as_mut_ptr().cast(), size) };
            if n > 0 {
                any = true;
                if (n as usize) < size {
                    return any; // a short read took all there was
                }
                continue;
            }
            if n < 0 {
                match io::Error::last_os_error().kind() {
                    io::ErrorKind::Interrupted => continue,
                    io::ErrorKind::WouldBlock => return any,
                    _ => return true,
                }
            }
            return any;
        }
    }
}

/// Reaps child `pid` if it has exited, without blocking: its end, or `None` while it
/// runs (or if it is no child of ours). For a caller that started `pid` itself and must
/// not reap anyone else's children (a test among others in one process).
#[cfg(test)]
pub fn try_reap(pid: i32) -> Option<Ended> {
    if pid <= 0 {
        return None;
    }
    let mut status: libc::c_int = 0;
    loop {
        // SAFETY: status is valid for writes; WNOHANG makes this return at once.
        let got = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        if got < 0 && io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
            continue;
        }
        if got != pid {
            return None;
        }
        return Some(if libc::WIFSIGNALED(status) {
            Ended::Signal(libc::WTERMSIG(status))
        } else {
            Ended::Code(libc::WEXITSTATUS(status))
        });
    }
}

/// Whether process group `pgid` still has a member.
pub fn group_exists(pgid: i32) -> bool {
    // SAFETY: signal 0 only checks for existence and permission.
    pgid > 1 && unsafe { libc::kill(-pgid, 0) == 0 }
}

/// Sends `sig` to the one process `pid`. Refuses 0 and anything that would not fit a
/// positive `pid_t`, since `kill` reads those as "my group", "every process" or a group.
pub fn signal_pid(pid: u32, sig: i32) -> io::Result<()> {
    let pid = match i32::try_from(pid) {
        Ok(p) if p > 0 => p,
        _ => {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("refusing to signal pid {pid}"),
            ))
        }
    };
    // SAFETY: kill with a positive pid and a plain signal number touches no memory.
    if unsafe { libc::kill(pid, sig) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_group_and_broadcast_pids() {
        for pid in [0, u32::MAX, i32::MAX as u32 + 1] {
            let err = signal_pid(pid, 0).unwrap_err();
            assert_eq!(err.kind(), io::ErrorKind::InvalidInput, "pid {pid}");
        }
        signal_pid(std::process::id(), 0).expect("signal 0 to ourselves");
    }
}
