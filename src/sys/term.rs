//! execctl's own terminal: its window size, and its modes saved, made raw and put back
//! (`execctl run -t`, `execctl attach`). The daemon never calls these; the PTYs of
//! commands are another room.
//!
//! Raw mode is `cfmakeraw`'s: no echo, no line editing, no signals from keys (Ctrl-C is
//! the byte 0x03), no CR/NL translation in either direction, 8-bit bytes, and reads that
//! return as soon as one byte is there.

use std::io;
use std::os::fd::RawFd;

/// A terminal's modes, as `tcgetattr` reads them.
#[derive(Clone, Copy)]
pub struct Modes(libc::termios);

impl PartialEq for Modes {
    /// The modes a program sees; the speeds and line discipline fields included.
    fn eq(&self, other: &Modes) -> bool {
        let (a, b) = (&self.0, &other.0);
        a.c_iflag == b.c_iflag
            && a.c_oflag == b.c_oflag
            && a.c_cflag == b.c_cflag
            && a.c_lflag == b.c_lflag
            && a.c_line == b.c_line
            && a.c_cc == b.c_cc
            && a.c_ispeed == b.c_ispeed
            && a.c_ospeed == b.c_ospeed
    }
}

impl std::fmt::Debug for Modes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Modes {{ iflag: {:#o}, oflag: {:#o}, cflag: {:#o}, lflag: {:#o} }}",
            self.0.c_iflag, self.0.c_oflag, self.0.c_cflag, self.0.c_lflag
        )
    }
}

impl Modes {
    /// The terminal's current modes; an error when `fd` is not a terminal.
    pub fn get(fd: RawFd) -> io::Result<Modes> {
        // SAFETY: termios is plain old data; tcgetattr fills it or fails.
        let mut t: libc::termios = unsafe { std::mem::zeroed() };
        // SAFETY: a descriptor number and a pointer to a live termios.
        if unsafe { libc::tcgetattr(fd, &mut t) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Modes(t))
    }

    /// Sets these modes at once (`TCSANOW`: typed-ahead input is kept, not flushed).
    pub fn set(&self, fd: RawFd) -> io::Result<()> {
        loop {
            // SAFETY: a descriptor number and a pointer to a live termios.
            if unsafe { libc::tcsetattr(fd, libc::TCSANOW, &self.0) } == 0 {
                return Ok(());
            }
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
    }

    /// These modes made raw, as `cfmakeraw` does.
    pub fn raw(&self) -> Modes {
        let mut t = self.0;
        // SAFETY: cfmakeraw only changes the flags of the live termios it is given.
        unsafe { libc::cfmakeraw(&mut t) };
        Modes(t)
    }
}

/// The window size of the terminal `fd` as (rows, cols); `None` when it is not a
/// terminal or reports no size (0 x 0, as a fresh pseudo-terminal does).
pub fn window_size(fd: RawFd) -> Option<(u16, u16)> {
    // SAFETY: winsize is plain old data; TIOCGWINSZ writes at most its size into it.
    let mut ws: libc::winsize = unsafe { std::mem::zeroed() };
    // SAFETY: ioctl on a descriptor number with a pointer to a live winsize.
    let rc = unsafe { libc::ioctl(fd, libc::TIOCGWINSZ, &mut ws) };
    (rc == 0 && ws.ws_row > 0 && ws.ws_col > 0).then_some((ws.ws_row, ws.ws_col))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raw_turns_off_echo_lines_signals_and_translation() {
        // SAFETY: termios is plain old data; these are the bits a cooked terminal has.
        let mut t: libc::termios = unsafe { std::mem::zeroed() };
        t.c_lflag = libc::ECHO | libc::ICANON | libc::ISIG | libc::IEXTEN;
        t.c_iflag = libc::ICRNL | libc::IXON;
        t.c_oflag = libc::OPOST | libc::ONLCR;
        let cooked = Modes(t);
        let raw = cooked.raw();
        assert_ne!(raw, cooked);
        assert_eq!(
            raw.0.c_lflag & (libc::ECHO | libc::ICANON | libc::ISIG | libc::IEXTEN),
            0
        );
        assert_eq!(raw.0.c_iflag & (libc::ICRNL | libc::IXON), 0);
        assert_eq!(raw.0.c_oflag & libc::OPOST, 0);
        assert_eq!(raw.0.c_cc[libc::VMIN], 1);
        assert!(Modes::get(-1).is_err());
        assert_eq!(window_size(-1), None);
    }
}
