//! Pseudo-terminals for commands that asked for one (PROTOCOL 12.1): a master the loop
//! holds and a slave that becomes the command's stdin, stdout, stderr and controlling
//! terminal, and the window size the kernel reports to the command (with SIGWINCH).
//!
//! Invariants:
//! - Both ends are close-on-exec: the child's copy of the slave survives only as the
//!   descriptors it duplicates onto 0, 1 and 2.
//! - The line discipline starts in the kernel's default modes (echo, canonical input,
//!   signals, CR/NL mapping): nothing here sets termios.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::PathBuf;

use crate::types::WinSize;

/// Opens a pseudo-terminal pair of `size`: `(master, slave)`, both close-on-exec.
pub fn open(size: WinSize) -> io::Result<(OwnedFd, OwnedFd)> {
    // SAFETY: posix_openpt returns a new descriptor or -1; nothing else is touched.
    let master = unsafe { libc::posix_openpt(libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC) };
    if master < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a descriptor we just opened and own.
    let master = unsafe { OwnedFd::from_raw_fd(master) };
    // SAFETY: grantpt and unlockpt take the master descriptor and touch nothing else.
    if unsafe { libc::grantpt(master.as_raw_fd()) } < 0
        || unsafe { libc::unlockpt(master.as_raw_fd()) } < 0
    {
        return Err(io::Error::last_os_error());
    }
    // TIOCGPTPEER opens the slave from the master itself: no path lookup, no race with a
    // reused /dev/pts number.
    // SAFETY: TIOCGPTPEER takes open flags and returns a new descriptor or -1.
    let slave = unsafe {
        libc::ioctl(
            master.as_raw_fd(),
            libc::TIOCGPTPEER,
            libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC,
        )
    };
    if slave < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a descriptor the ioctl just opened for us.
    let slave = unsafe { OwnedFd::from_raw_fd(slave) };
    resize(master.as_raw_fd(), size)?;
    Ok((master, slave))
}

/// Sets the window size of the terminal `fd` (either end) is; the kernel sends SIGWINCH
/// to its foreground process group when it changed.
pub fn resize(fd: RawFd, size: WinSize) -> io::Result<()> {
    let ws = libc::winsize {
        ws_row: size.rows,
        ws_col: size.cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCSWINSZ reads a winsize we own for the duration of the call.
    if unsafe { libc::ioctl(fd, libc::TIOCSWINSZ, &ws) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Where a SIGINT for a shell's foreground job went (`interrupt`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sigint {
    /// The process group it was sent to, if it was.
    pub sent: Option<libc::pid_t>,
    /// The foreground may hold it without acting on it: the shell itself is in the
    /// foreground (bash takes a SIGINT that comes while it starts a job as its own, and
    /// runs the job regardless), or a child of the shell that has not exec'd yet and
    /// still has the shell's handlers (it is not sent one: it would keep it too).
    pub held: bool,
}

/// Sends SIGINT to the foreground process group of the terminal `fd` (either end) is,
/// the terminal of shell `shell` (a session leader), unless that group is `spared` (it
/// had one already): the job a person at that terminal would reach with Ctrl-C,
/// whatever the terminal's modes (a program in raw mode reads Ctrl-C as a byte). The
/// group is one of the terminal's session, which the daemon started: no other group
/// can be the foreground one there.
pub fn interrupt(fd: RawFd, shell: libc::pid_t, spared: Option<libc::pid_t>) -> io::Result<Sigint> {
    let mut group: libc::pid_t = 0;
    // SAFETY: TIOCGPGRP writes one pid_t we own.
    if unsafe { libc::ioctl(fd, libc::TIOCGPGRP, &mut group) } < 0 {
        return Err(io::Error::last_os_error());
    }
    if group <= 1 {
        return Err(io::Error::from_raw_os_error(libc::ESRCH));
    }
    if group != shell && has_handlers_of(group, shell) {
        return Ok(Sigint {
            sent: None,
            held: true,
        });
    }
    let sent = (spared != Some(group)).then_some(group);
    if sent.is_some() {
        // SAFETY: kill with a negative pid signals that process group; no memory involved.
        if unsafe { libc::kill(-group, libc::SIGINT) } < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(Sigint {
        sent,
        held: group == shell,
    })
}

/// Whether process `pid` runs the program of process `shell` with the same signal
/// handlers, SIGINT's among them: a child bash forked and has not exec'd yet.
fn has_handlers_of(pid: libc::pid_t, shell: libc::pid_t) -> bool {
    use std::os::unix::fs::MetadataExt;
    let file = |p| std::fs::metadata(format!("/proc/{p}/exe")).map(|m| (m.dev(), m.ino()));
    let caught = |p| {
        let status = std::fs::read_to_string(format!("/proc/{p}/status")).ok()?;
        let mask = status.lines().find_map(|l| l.strip_prefix("SigCgt:"))?;
        u64::from_str_radix(mask.trim(), 16).ok()
    };
    let sigint = 1u64 << (libc::SIGINT - 1);
    matches!((caught(pid), caught(shell)), (Some(a), Some(b)) if a == b && a & sigint != 0)
        && matches!((file(pid), file(shell)), (Ok(a), Ok(b)) if a == b)
}

/// The path the slave `slave` has in the file system (`/dev/pts/N`), as this process sees
/// it: what a shell session's command lines open for each command (PROTOCOL 12.2), so that
/// `tty` names the terminal and nothing a line redirected carries over to the next.
pub fn path_of(slave: &OwnedFd) -> io::Result<PathBuf> {
    let path = std::fs::read_link(format!("/proc/self/fd/{}", slave.as_raw_fd()))?;
    if path.is_absolute() {
        Ok(path)
    } else {
        Err(io::Error::other(format!(
            "a terminal with no path: {}",
            path.display()
        )))
    }
}

/// Discards what the terminal whose master is `master` holds as input and nobody has read
/// (typed, written by the daemon, or pushed with `TIOCSTI`): the prompt of a shell session
/// starts the next command on an empty input queue (PROTOCOL 12.2). The queue is the
/// slave's: a flush through the master (`TCIFLUSH` or `TCOFLUSH`) leaves a line already
/// received there for the next reader (the tests below show it), so the slave is opened
/// from the master for the flush and closed again.
pub fn discard_input(master: RawFd) -> io::Result<()> {
    // SAFETY: TIOCGPTPEER takes open flags and returns a new descriptor or -1.
    let slave = unsafe {
        libc::ioctl(
            master,
            libc::TIOCGPTPEER,
            libc::O_RDWR | libc::O_NOCTTY | libc::O_CLOEXEC | libc::O_NONBLOCK,
        )
    };
    if slave < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a descriptor the ioctl just opened for us.
    let slave = unsafe { OwnedFd::from_raw_fd(slave) };
    // SAFETY: tcflush takes a descriptor we own and a queue selector.
    if unsafe { libc::tcflush(slave.as_raw_fd(), libc::TCIFLUSH) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The window size of the terminal `fd` is.
    pub fn size(fd: RawFd) -> io::Result<WinSize> {
        // SAFETY: winsize is plain old data for TIOCGWINSZ to fill.
        let mut ws: libc::winsize = unsafe { std::mem::zeroed() };
        // SAFETY: TIOCGWINSZ writes a winsize we own.
        if unsafe { libc::ioctl(fd, libc::TIOCGWINSZ, &mut ws) } < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(WinSize {
            rows: ws.ws_row,
            cols: ws.ws_col,
        })
    }

    #[test]
    fn a_pair_has_the_size_asked_for_and_resizes() {
        let (master, slave) = open(WinSize {
            rows: 30,
            cols: 100,
        })
        .expect("openpty");
        assert_eq!(
            size(slave.as_raw_fd()).expect("size"),
            WinSize {
                rows: 30,
                cols: 100
            }
        );
        resize(master.as_raw_fd(), WinSize { rows: 5, cols: 7 }).expect("resize");
        assert_eq!(
            size(slave.as_raw_fd()).expect("size"),
            WinSize { rows: 5, cols: 7 }
        );
    }

    /// Bytes waiting in the terminal's input queue (`FIONREAD` on the slave).
    fn unread(slave: &OwnedFd) -> usize {
        let mut n: libc::c_int = 0;
        // SAFETY: FIONREAD writes one int we own.
        if unsafe { libc::ioctl(slave.as_raw_fd(), libc::FIONREAD, &mut n) } < 0 {
            panic!("FIONREAD: {}", io::Error::last_os_error());
        }
        n as usize
    }

    /// What a non-blocking read of the slave gets now.
    fn read_now(slave: &OwnedFd) -> Vec<u8> {
        let mut buf = [0u8; 64];
        // SAFETY: reading into a buffer we own from a descriptor we own.
        let n = unsafe { libc::read(slave.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
        buf[..n.max(0) as usize].to_vec()
    }

    /// Writes whole lines `bytes` as input (to the master) and waits until the slave holds
    /// them all (in canonical mode `FIONREAD` counts complete lines only).
    fn typed(master: &OwnedFd, slave: &OwnedFd, bytes: &[u8]) {
        // SAFETY: writing a buffer we own to a descriptor we own.
        let n = unsafe { libc::write(master.as_raw_fd(), bytes.as_ptr().cast(), bytes.len()) };
        assert_eq!(n, bytes.len() as isize);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while unread(slave) < bytes.len() {
            assert!(std::time::Instant::now() < deadline, "input never arrived");
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
    }

    /// Which flush empties the queue a command reads: not one through the master (neither
    /// queue selector), only `TCIFLUSH` on the slave, which `discard_input` opens.
    #[test]
    fn only_a_flush_of_the_slaves_input_queue_discards_unread_input() {
        for how in ["master TCIFLUSH", "master TCOFLUSH", "master TCIOFLUSH"] {
            let (master, slave) = open(WinSize::DEFAULT).expect("openpty");
            crate::sys::spawn::set_nonblocking(slave.as_raw_fd()).expect("nonblocking");
            typed(&master, &slave, b"left over\nsecond\n");
            let queue = match how {
                "master TCIFLUSH" => libc::TCIFLUSH,
                "master TCOFLUSH" => libc::TCOFLUSH,
                _ => libc::TCIOFLUSH,
            };
            // SAFETY: tcflush on a descriptor we own.
            assert_eq!(unsafe { libc::tcflush(master.as_raw_fd(), queue) }, 0);
            assert_eq!(read_now(&slave), b"left over\n", "{how} kept the line");
        }
        let (master, slave) = open(WinSize::DEFAULT).expect("openpty");
        crate::sys::spawn::set_nonblocking(slave.as_raw_fd()).expect("nonblocking");
        typed(&master, &slave, b"left over\nsecond\n");
        discard_input(master.as_raw_fd()).expect("discard");
        assert_eq!(unread(&slave), 0);
        assert_eq!(read_now(&slave), b"");
        // What comes after the flush is input again.
        typed(&master, &slave, b"next\n");
        assert_eq!(read_now(&slave), b"next\n");
    }

    #[test]
    fn a_slave_has_its_dev_pts_path() {
        let (_master, slave) = open(WinSize::DEFAULT).expect("openpty");
        let path = path_of(&slave).expect("path");
        assert!(path.starts_with("/dev/pts"), "{}", path.display());
        let opened = std::fs::File::open(&path).expect("open by path");
        let same = |f: RawFd| {
            let mut st = std::mem::MaybeUninit::<libc::stat>::uninit();
            // SAFETY: fstat fills a stat we own.
            assert_eq!(unsafe { libc::fstat(f, st.as_mut_ptr()) }, 0);
            // SAFETY: fstat succeeded.
            let st = unsafe { st.assume_init() };
            (st.st_dev, st.st_ino)
        };
        assert_eq!(same(opened.as_raw_fd()), same(slave.as_raw_fd()));
    }

    #[test]
    fn what_the_slave_writes_the_master_reads() {
        let (master, slave) = open(WinSize::DEFAULT).expect("openpty");
        let mut s = std::fs::File::from(slave);
        io::Write::write_all(&mut s, b"hi\n").expect("write");
        let mut m = std::fs::File::from(master);
        let mut buf = [0u8; 16];
        let n = io::Read::read(&mut m, &mut buf).expect("read");
        // The line discipline maps NL to CR NL on output.
        assert_eq!(&buf[..n], b"hi\r\n");
    }
}
