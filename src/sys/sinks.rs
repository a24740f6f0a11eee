//! The writers that drain the log and audit queues (`core::log`) into stderr or the audit
//! file as fast as those accept.
//!
//! Invariants:
//! - The writer never blocks: it writes through a descriptor of its own in non-blocking
//!   mode (a fresh open of stderr, so the flag touches no other process's copy), and what
//!   the target does not take waits in the queue for the next turn.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::Path;
use std::time::SystemTime;

use crate::core::log::Queue;

/// Where a queue's bytes go: a descriptor of our own, written without ever blocking.
#[derive(Debug)]
pub struct Out {
    file: File,
    /// A socket shared with no one but written with `MSG_DONTWAIT`: a stream socket (the
    /// journal's stdout stream) cannot be reopened through `/proc`.
    socket: bool,
}

impl Out {
    /// The daemon's stderr, reopened so that its own descriptor is non-blocking. Falls
    /// back to a duplicate of fd 2 when stderr cannot be reopened (a socket).
    pub fn stderr() -> io::Result<Out> {
        let target = Path::new("/proc/self/fd/2");
        let meta = std::fs::metadata(target)?;
        if meta.file_type().is_socket() {
            use std::os::fd::AsFd;
            let file = File::from(io::stderr().as_fd().try_clone_to_owned()?);
            return Ok(Out { file, socket: true });
        }
        let mut opts = OpenOptions::new();
        opts.write(true)
            .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC);
        // A file is appended to (reopening it without O_APPEND would write from its start).
        if meta.is_file() {
            opts.append(true);
        }
        Ok(Out {
            file: opts.open(target)?,
            socket: false,
        })
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
            socket: false,
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
                let r = if self.socket {
                    crate::sys::socket::send_nonblocking(self.file.as_raw_fd(), q.pending())
                } else {
                    self.file.write(q.pending())
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
            socket: false,
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
}
