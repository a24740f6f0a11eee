//! What the loop may read of a peer process to tell whether it descends from the daemon
//! (PROTOCOL 7.3): its `/proc/PID/stat` (parent and start time) and `/proc/PID/cgroup`,
//! and its identity pinned with `SO_PEERPIDFD`. The walk over these facts is the core's
//! (`core::tie`).
//!
//! Invariants:
//! - Only `stat` and `cgroup` are read: neither takes the peer's memory lock, so a peer
//!   with a hung mapping (a FUSE-backed `mmap`, say) cannot freeze the loop. Anything in
//!   the peer's memory (`environ`, `cmdline`) is read off the loop, never here.
//! - A pidfd (`SO_PEERPIDFD`, Linux 6.5) names the process that connected for as long as
//!   it is held: facts read by pid are that process's if it is still alive after they
//!   were read (a pid is not reused while its process lives or is a zombie). Without one,
//!   the start time read first is read again and must match.

use std::io;
use std::os::fd::{FromRawFd, OwnedFd, RawFd};

use crate::core::tie::Stat;

/// `SO_PEERPIDFD` (asm-generic; the libc crate does not export it for every target yet).
const SO_PEERPIDFD: libc::c_int = 77;

/// Parent and start time from `/proc/PID/stat` text. The name (field 2) may hold spaces
/// and parentheses, so fields are counted from the last `)`.
pub fn parse_stat(text: &str) -> Option<Stat> {
    let rest = &text[text.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace();
    // After the name: state (3), ppid (4), ... starttime (22).
    let ppid = fields.nth(1)?.parse().ok()?;
    let start = fields.nth(17)?.parse().ok()?;
    Some(Stat { ppid, start })
}

/// Process `pid`'s parent and start time, if it is there.
pub fn stat(pid: i32) -> Option<Stat> {
    if pid <= 0 {
        return None;
    }
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_stat(&text)
}

/// Process `pid`'s `/proc/PID/cgroup` text, if it is there.
pub fn cgroup(pid: i32) -> Option<String> {
    if pid <= 0 {
        return None;
    }
    std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()
}

/// The daemon's own `/proc/self/cgroup` text.
pub fn own_cgroup() -> Option<String> {
    std::fs::read_to_string("/proc/self/cgroup").ok()
}

/// A peer process pinned at accept: its pid, and a pidfd of it where the kernel gives one.
pub struct Pinned {
    pub pid: i32,
    pidfd: Option<OwnedFd>,
}

impl Pinned {
    /// The process at the other end of Unix socket `fd`, which `SO_PEERCRED` says is `pid`.
    pub fn of_socket(fd: RawFd, pid: i32) -> Pinned {
        Pinned {
            pid,
            pidfd: peer_pidfd(fd),
        }
    }

    /// Process `pid` as it is now, without a pidfd (a signal's sender: only its start
    /// time, read again after the facts, says it is still the same).
    pub fn of_pid(pid: i32) -> Pinned {
        Pinned { pid, pidfd: None }
    }

    /// Whether facts read by pid since the pin are the pinned process's: it is still
    /// alive (pidfd), or (without one) its start time is still `start`.
    pub fn still_same(&self, start: Option<u64>) -> bool {
        match &self.pidfd {
            Some(fd) => pidfd_alive(fd),
            None => start.is_some() && stat(self.pid).map(|s| s.start) == start,
        }
    }
}

/// `SO_PEERPIDFD` of Unix socket `fd`: none on a kernel without it (before 6.5), or when
/// the peer is gone.
fn peer_pidfd(fd: RawFd) -> Option<OwnedFd> {
    let mut pidfd: libc::c_int = -1;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into a live local of that size.
    let rc = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            SO_PEERPIDFD,
            (&mut pidfd as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    if rc != 0 || pidfd < 0 {
        return None;
    }
    // SAFETY: the kernel made a new close-on-exec descriptor for us alone.
    Some(unsafe { OwnedFd::from_raw_fd(pidfd) })
}

/// Whether the process of `pidfd` is still alive (signal 0 through it).
fn pidfd_alive(pidfd: &OwnedFd) -> bool {
    use std::os::fd::AsRawFd;
    // SAFETY: pidfd_send_signal with a pidfd we own, signal 0 (a check), no siginfo, no
    // flags.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            pidfd.as_raw_fd(),
            0,
            std::ptr::null::<libc::siginfo_t>(),
            0,
        )
    };
    rc == 0 || io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_are_counted_from_the_last_parenthesis() {
        let text = "4242 (a) b (c)) S 17 4242 4242 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 \
                    1 0 987654 1000 10 18446744073709551615";
        assert_eq!(
            parse_stat(text),
            Some(Stat {
                ppid: 17,
                start: 987654
            })
        );
        assert_eq!(parse_stat("4242 (x) S"), None);
        assert_eq!(parse_stat("garbage"), None);
    }

    #[test]
    fn this_process_reads_as_its_own_parent_s_child() {
        let me = std::process::id() as i32;
        let s = stat(me).expect("our own stat");
        // SAFETY: getppid cannot fail.
        assert_eq!(s.ppid, unsafe { libc::getppid() });
        assert!(stat(0).is_none() && stat(-3).is_none());
        assert!(cgroup(me).is_some());
    }

    #[test]
    fn a_pinned_peer_is_the_same_while_it_lives() {
        let (a, b) = std::os::unix::net::UnixStream::pair().unwrap();
        use std::os::fd::AsRawFd;
        let me = std::process::id() as i32;
        let pinned = Pinned::of_socket(a.as_raw_fd(), me);
        let start = stat(me).map(|s| s.start);
        assert!(pinned.still_same(start));
        let unpinned = Pinned {
            pid: me,
            pidfd: None,
        };
        assert!(unpinned.still_same(start));
        assert!(!unpinned.still_same(start.map(|s| s + 1)), "another start");
        assert!(!unpinned.still_same(None));
        drop(b);
    }
}
