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

/// Sends `sig` to the foreground process group of the terminal `fd` (either end) is: the
/// job a person at that terminal would reach with Ctrl-C, whatever the terminal's modes
/// (a program in raw mode reads Ctrl-C as a byte). The group is one of the terminal's
/// session, which the daemon started: no other group can be the foreground one there.
pub fn signal_foreground(fd: RawFd, sig: i32) -> io::Result<()> {
    let mut pgrp: libc::pid_t = 0;
    // SAFETY: TIOCGPGRP writes one pid_t we own.
    if unsafe { libc::ioctl(fd, libc::TIOCGPGRP, &mut pgrp) } < 0 {
        return Err(io::Error::last_os_error());
    }
    if pgrp <= 1 {
        return Err(io::Error::from_raw_os_error(libc::ESRCH));
    }
    // SAFETY: kill with a negative pid signals that process group; no memory involved.
    if unsafe { libc::kill(-pgrp, sig) } < 0 {
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
