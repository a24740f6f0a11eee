//! Sockets below what mio offers: checking and taking a socket systemd passed, and a
//! send that never blocks or raises SIGPIPE.

use std::io;
use std::os::fd::{FromRawFd, RawFd};

/// Checks that `fd` is a listening Unix stream socket (what systemd socket activation
/// must pass).
pub fn check_listening_unix_socket(fd: RawFd) -> io::Result<()> {
    let option = |name: libc::c_int| -> io::Result<libc::c_int> {
        let mut value: libc::c_int = 0;
        let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
        // SAFETY: pointers to a live int and its length; getsockopt writes at most `len`.
        let rc = unsafe {
            libc::getsockopt(
                fd,
                libc::SOL_SOCKET,
                name,
                (&mut value as *mut libc::c_int).cast(),
                &mut len,
            )
        };
        if rc < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(value)
    };
    let what = |s: &str| io::Error::new(io::ErrorKind::InvalidInput, s.to_string());
    if option(libc::SO_DOMAIN)? != libc::AF_UNIX {
        return Err(what("not an AF_UNIX socket"));
    }
    if option(libc::SO_TYPE)? != libc::SOCK_STREAM {
        return Err(what("not a stream socket"));
    }
    if option(libc::SO_ACCEPTCONN)? == 0 {
        return Err(what("not listening"));
    }
    Ok(())
}

/// Takes ownership of a listening socket passed at `fd` (checked by
/// `check_listening_unix_socket`), close-on-exec from now on.
pub fn take_listener(fd: RawFd) -> std::os::unix::net::UnixListener {
    // SAFETY: setting FD_CLOEXEC on a descriptor number has no memory effects.
    unsafe {
        libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC);
    }
    // SAFETY: the caller checked that `fd` is a listening socket passed to exactly this
    // process; nothing else in the process owns it.
    unsafe { std::os::unix::net::UnixListener::from_raw_fd(fd) }
}

/// Writes to a stream socket without blocking and without SIGPIPE, whatever the
/// descriptor's own mode (the journal's stream, shared with no one, is left as it was).
pub fn send_nonblocking(fd: RawFd, buf: &[u8]) -> io::Result<usize> {
    // SAFETY: `buf` is valid for `buf.len()` bytes of reading.
    let n = unsafe {
        libc::send(
            fd,
            buf.as_ptr().cast(),
            buf.len(),
            libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
        )
    };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(n as usize)
}
