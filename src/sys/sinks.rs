//! The writers that drain the log and audit queues (`core::log`) into stderr or the audit
//! file as fast as those accept.
//!
//! Invariants:
//! - The writer never blocks: it writes through a descriptor of its own in non-blocking
//!   mode (a fresh open of stderr, so the flag touches no other process's copy), and what
//!   the target does not take waits in the queue for the next turn.
//! - A stderr execd may not open again (another user's file or pipe: a daemon started as
//!   `nobody` from a root shell) is still written, through the inherited descriptor left
//!   in its own mode: a regular file as it is (it never blocks), a pipe or terminal only
//!   when `poll` says it has room, at most `PIPE_BUF` (a pipe) or `TTY_CHUNK` bytes (a
//!   terminal) at a time, which then fit. (Another writer filling the same pipe between
//!   the poll and the write is the one way such a write can wait.) The log is never
//!   dropped for want of permission to reopen it.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::Path;
use std::time::SystemTime;

use crate::core::log::Queue;

/// At most this much goes to a terminal shared with whoever started execd in one write:
/// a terminal that polls writable has room for that much.
const TTY_CHUNK: usize = 256;

/// How a sink's descriptor is written without blocking.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Mode {
    /// Our own open file description, in non-blocking mode.
    Own,
    /// A socket shared with no one but written with `MSG_DONTWAIT`: a stream socket (the
    /// journal's stdout stream) cannot be reopened through `/proc`.
    Socket,
    /// The inherited description, left blocking (its mode is shared with other
    /// processes): written only when `poll` says it takes `chunk` bytes.
    Shared { chunk: usize },
}

/// Where a queue's bytes go: a descriptor of our own, written without ever blocking.
#[derive(Debug)]
pub struct Out {
    file: File,
    mode: Mode,
}

impl Out {
    /// The daemon's stderr, reopened so that its own descriptor is non-blocking. Falls
    /// back to a duplicate of fd 2 when stderr cannot be reopened: a socket, or a file or
    /// pipe execd has no permission to open (see the module's invariants).
    pub fn stderr() -> io::Result<Out> {
        use std::os::fd::AsFd;
        let target = Path::new("/proc/self/fd/2");
        let meta = std::fs::metadata(target)?;
        let inherited =
            || -> io::Result<File> { Ok(File::from(io::stderr().as_fd().try_clone_to_owned()?)) };
        if meta.file_type().is_socket() {
            return Ok(Out {
                file: inherited()?,
                mode: Mode::Socket,
            });
        }
        let mut opts = OpenOptions::new();
        opts.write(true)
            .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC);
        // A file is appended to (reopening it without O_APPEND would write from its start).
        if meta.is_file() {
            opts.append(true);
        }
        match opts.open(target) {
            Ok(file) => Ok(Out {
                file,
                mode: Mode::Own,
            }),
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::EACCES | libc::EPERM | libc::ENXIO)
                ) =>
            {
                let chunk = if meta.is_file() {
                    usize::MAX
                } else if meta.file_type().is_fifo() {
                    libc::PIPE_BUF
                } else {
                    TTY_CHUNK
                };
                Ok(Out {
                    file: inherited()?,
                    mode: Mode::Shared { chunk },
                })
            }
            Err(e) => Err(e),
        }
    }

    /// An audit file: appended to, created mode 0640. A FIFO is opened read-write, which
    /// never blocks or fails for want of a reader.
    pub fn file(path: &Path) -> io::Result<Out> {
        let fifo = std::fs::metadata(path).is_ok_and(|m| m.file_type().is_fifo());
        let mut opts = OpenOptions::new();
        if fifo {
            opts.read(true).write(true);
        } else {
            opts.append(true).create(true).mode(0o640);
        }
        opts.custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC);
        Ok(Out {
            file: opts.open(path)?,
            mode: Mode::Own,
        })
    }

    pub fn fd(&self) -> RawFd {
        self.file.as_raw_fd()
    }

    /// Writes what the queue holds until the target would block. Returns whether the
    /// queue still holds bytes (the caller then waits for writability).
    pub fn drain(&mut self, q: &mut Queue) -> bool {
        // Two rounds: the first may queue the report of drops.
        for _ in 0..2 {
            while !q.pending().is_empty() {
                let r = match self.mode {
                    Mode::Socket => {
                        crate::sys::socket::send_nonblocking(self.file.as_raw_fd(), q.pending())
                    }
                    Mode::Own => self.file.write(q.pending()),
                    Mode::Shared { chunk } => {
                        if has_room(self.file.as_raw_fd()) {
                            let n = q.pending().len().min(chunk);
                            self.file.write(&q.pending()[..n])
                        } else {
                            Err(io::ErrorKind::WouldBlock.into())
                        }
                    }
                };
                match r {
                    Ok(0) => return true,
                    Ok(n) => q.consume(n, SystemTime::now()),
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => return true,
                    // A target that is gone (EPIPE, EIO, ENOSPC): what it would have taken
                    // is lost either way; drop it rather than retry for ever.
                    Err(_) => {
                        let n = q.pending().len();
                        q.consume(n, SystemTime::now());
                    }
                }
            }
            if q.dropped() == 0 {
                break;
            }
            q.consume(0, SystemTime::now());
        }
        !q.pending().is_empty()
    }
}

/// Whether a write to `fd` would find room now (`poll` for POLLOUT, without waiting).
fn has_room(fd: RawFd) -> bool {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLOUT,
        revents: 0,
    };
    // SAFETY: one valid pollfd, and a zero timeout: poll returns at once.
    let n = unsafe { libc::poll(&mut p, 1, 0) };
    // An error or hang-up lets the write say what is wrong (EPIPE drops the bytes).
    n != 0 && (n < 0 || p.revents != 0)
}

/// The descriptors the log and the audit records are written to, and whether each waits
/// for WRITABLE (registered with the loop under its token).
#[derive(Debug)]
pub struct Sinks {
    log: Option<(Out, bool)>,
    audit: Option<(Out, bool)>,
    log_token: mio::Token,
    audit_token: mio::Token,
}

impl Sinks {
    /// stderr for the log (dropped if stderr cannot be written at all), and the audit file
    /// when `--audit FILE` names one.
    pub fn open(
        audit: Option<&Path>,
        log_token: mio::Token,
        audit_token: mio::Token,
    ) -> io::Result<Sinks> {
        let audit = match audit {
            Some(path) => Some((
                Out::file(path).map_err(|e| {
                    io::Error::new(e.kind(), format!("--audit {}: {e}", path.display()))
                })?,
                false,
            )),
            None => None,
        };
        Ok(Sinks {
            log: Out::stderr().ok().map(|o| (o, false)),
            audit,
            log_token,
            audit_token,
        })
    }

    /// A WRITABLE event for `token`: its target may take more now.
    pub fn writable(&mut self, token: mio::Token) {
        for (sink, t) in [
            (&mut self.log, self.log_token),
            (&mut self.audit, self.audit_token),
        ] {
            if t == token {
                if let Some((_, waiting)) = sink {
                    *waiting = false;
                }
            }
        }
    }

    /// Writes the queues as far as their targets take them, waiting for WRITABLE where a
    /// target can be polled (a pipe, a terminal, a FIFO). A regular file is never full and
    /// cannot be polled; its next write comes next turn.
    pub fn write(&mut self, registry: &mio::Registry, log: &mut Queue, audit: Option<&mut Queue>) {
        if let Some(sink) = self.log.as_mut() {
            drain_into(sink, log, registry, self.log_token);
        }
        if let (Some(sink), Some(q)) = (self.audit.as_mut(), audit) {
            drain_into(sink, q, registry, self.audit_token);
        }
    }

    /// Reopens the audit file at `path` (log rotation): what the old one had not taken yet
    /// goes to the new one. On failure the old one stays.
    pub fn reopen_audit(&mut self, registry: &mio::Registry, path: &Path) -> io::Result<()> {
        let out = Out::file(path)?;
        if let Some((old, _)) = self.audit.take() {
            let _ = registry.deregister(&mut mio::unix::SourceFd(&old.fd()));
        }
        self.audit = Some((out, false));
        Ok(())
    }
}

/// Writes `q` into a sink until it would block; registers it for WRITABLE (under `token`)
/// while bytes wait, where it can be polled.
fn drain_into(sink: &mut (Out, bool), q: &mut Queue, registry: &mio::Registry, token: mio::Token) {
    let (out, waiting) = sink;
    if q.is_empty() || *waiting {
        return;
    }
    let fd = out.fd();
    if out.drain(q) {
        *waiting = registry
            .register(
                &mut mio::unix::SourceFd(&fd),
                token,
                mio::Interest::WRITABLE,
            )
            .is_ok();
    }
    if !*waiting {
        let _ = registry.deregister(&mut mio::unix::SourceFd(&fd));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::log::{Kind, Queue, QUEUE_BYTES};

    #[test]
    fn a_pipe_nobody_reads_never_blocks_the_writer() {
        let (r, w) = crate::sys::spawn::pipe().unwrap();
        crate::sys::spawn::set_nonblocking(w.as_raw_fd()).unwrap();
        let mut out = Out {
            file: File::from(w),
            mode: Mode::Own,
        };
        let mut q = Queue::new(QUEUE_BYTES, Kind::Log);
        let line = [b'x'; 1023];
        let mut more = false;
        for _ in 0..200 {
            let mut l = line.to_vec();
            l.push(b'\n');
            q.push(&l);
            more = out.drain(&mut q);
        }
        assert!(more, "a 64 KiB pipe cannot take 200 KiB");
        drop(r);
    }

    /// A stderr execd may not reopen is written through the inherited, blocking
    /// descriptor: in pieces that fit, and not at all while the pipe is full.
    #[test]
    fn a_shared_blocking_pipe_is_written_only_when_it_has_room() {
        let (r, w) = crate::sys::spawn::pipe().unwrap();
        let mut out = Out {
            file: File::from(w),
            mode: Mode::Shared {
                chunk: libc::PIPE_BUF,
            },
        };
        let mut q = Queue::new(QUEUE_BYTES, Kind::Log);
        let mut line = vec![b'y'; 1023];
        line.push(b'\n');
        for _ in 0..200 {
            q.push(&line);
        }
        // This would hang on a blocking write of the whole queue.
        assert!(out.drain(&mut q), "a 64 KiB pipe cannot take 200 KiB");
        let mut reader = File::from(r);
        let mut got = vec![0u8; 1 << 20];
        let n = std::io::Read::read(&mut reader, &mut got).unwrap();
        assert!(n > 0 && got[..n].iter().all(|&b| b == b'y' || b == b'\n'));
        // Room made: the rest goes on.
        let before = q.pending().len();
        out.drain(&mut q);
        assert!(q.pending().len() < before);
    }
}
