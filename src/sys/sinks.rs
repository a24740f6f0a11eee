//! The daemon's log lines and audit records: bounded queues that never block the loop, and
//! the writers that drain them into stderr or the audit file as fast as those accept.
//!
//! Invariants:
//! - Queuing never blocks and never grows a queue past its capacity: a line that does not
//!   fit is counted, not kept, and once the queue drains one line says how many were lost
//!   (for the audit log, a `dropped` record).
//! - The writer never blocks either: it writes through a descriptor of its own in
//!   non-blocking mode (a fresh open of stderr, so the flag touches no other process's
//!   copy), and what the target does not take waits in the queue for the next turn.
//! - A line is queued whole or not at all, so a reader never sees half a line.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::Path;
use std::time::{Duration, Instant, SystemTime};

use serde_json::{Map, Value};

use crate::wire::rpc::{rfc3339, write_json};

/// Bytes the log and the audit queue each hold while their target does not accept them.
pub const QUEUE_BYTES: usize = 1 << 20;

/// Refusals of one kind logged in full per window; the rest are counted.
const REFUSALS_PER_WINDOW: u32 = 10;
const REFUSAL_WINDOW: Duration = Duration::from_secs(10);

/// What a queue says about the lines it had to drop.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Kind {
    /// Daemon log lines: a plain line.
    Log,
    /// Audit records: a `dropped` record.
    Audit,
}

/// A bounded queue of whole lines.
#[derive(Debug)]
pub struct Queue {
    buf: Vec<u8>,
    /// Bytes of `buf` already written.
    pos: usize,
    cap: usize,
    /// Lines dropped since the last report of drops.
    dropped: u64,
    kind: Kind,
}

impl Queue {
    pub fn new(cap: usize, kind: Kind) -> Queue {
        Queue {
            buf: Vec::new(),
            pos: 0,
            cap,
            dropped: 0,
            kind,
        }
    }

    /// Queues one line (which must end in `\n`), or counts it as dropped when it does not fit.
    pub fn push(&mut self, line: &[u8]) {
        if self.buf.len() - self.pos + line.len() > self.cap {
            self.dropped += 1;
            return;
        }
        self.buf.extend_from_slice(line);
    }

    /// The bytes waiting to be written.
    pub fn pending(&self) -> &[u8] {
        &self.buf[self.pos..]
    }

    pub fn is_empty(&self) -> bool {
        self.pos == self.buf.len() && self.dropped == 0
    }

    /// Lines dropped and not yet reported.
    pub fn dropped(&self) -> u64 {
        self.dropped
    }

    /// `n` bytes were written. Once everything is, the report of drops is queued.
    pub fn consume(&mut self, n: usize) {
        self.pos = (self.pos + n).min(self.buf.len());
        if self.pos < self.buf.len() {
            if self.pos > self.buf.len() / 2 {
                self.buf.drain(..self.pos);
                self.pos = 0;
            }
            return;
        }
        self.buf.clear();
        self.pos = 0;
        if self.buf.capacity() > 64 << 10 {
            self.buf.shrink_to(64 << 10);
        }
        if self.dropped > 0 {
            let count = std::mem::take(&mut self.dropped);
            let line = match self.kind {
                Kind::Log => format!(
                    "{}execd: {count} log line(s) dropped: stderr was not taking them\n",
                    stamp_prefix(true)
                )
                .into_bytes(),
                Kind::Audit => {
                    let mut fields = Map::new();
                    fields.insert("count".into(), count.into());
                    audit_line("dropped", None, fields)
                }
            };
            self.buf.extend_from_slice(&line);
        }
    }
}

fn stamp_prefix(stamp: bool) -> String {
    if stamp {
        format!("{} ", rfc3339(SystemTime::now()))
    } else {
        String::new()
    }
}

/// One audit record as a line: `ts`, `event`, `peer` when there is one, then `fields`.
pub fn audit_line(event: &str, peer: Option<Value>, fields: Map<String, Value>) -> Vec<u8> {
    let mut rec = Map::new();
    rec.insert("ts".into(), rfc3339(SystemTime::now()).into());
    rec.insert("event".into(), event.into());
    if let Some(p) = peer {
        rec.insert("peer".into(), p);
    }
    rec.extend(fields);
    let mut line = Vec::with_capacity(128);
    write_json(&mut line, &Value::Object(rec));
    line.push(b'\n');
    line
}

/// A log of one kind of refusal, rate-limited.
#[derive(Debug, Default)]
struct Refusals {
    window_start: Option<Instant>,
    in_window: u32,
    suppressed: u64,
}

/// The daemon's log: `execd: ...` lines, stamped unless stderr is the journal (which
/// stamps them itself).
#[derive(Debug)]
pub struct Log {
    pub queue: Queue,
    stamp: bool,
    refusals: std::collections::HashMap<String, Refusals>,
}

impl Log {
    pub fn new(stamp: bool) -> Log {
        Log {
            queue: Queue::new(QUEUE_BYTES, Kind::Log),
            stamp,
            refusals: Default::default(),
        }
    }

    /// Queues one log line.
    pub fn line(&mut self, args: std::fmt::Arguments) {
        let text = format!("{}execd: {args}\n", stamp_prefix(self.stamp));
        self.queue.push(text.as_bytes());
    }

    /// Queues a refusal (a limit reached, a peer refused), at most a few per kind and
    /// window; the rest are counted and the count is logged when the next window opens.
    pub fn refusal(&mut self, kind: &str, now: Instant, args: std::fmt::Arguments) {
        if !self.refusals.contains_key(kind) {
            self.refusals.insert(kind.to_string(), Refusals::default());
        }
        let Some(r) = self.refusals.get_mut(kind) else {
            return;
        };
        let fresh = r
            .window_start
            .is_none_or(|s| now.saturating_duration_since(s) >= REFUSAL_WINDOW);
        let mut note = None;
        if fresh {
            if r.suppressed > 0 {
                note = Some(std::mem::take(&mut r.suppressed));
            }
            r.window_start = Some(now);
            r.in_window = 0;
        }
        if r.in_window >= REFUSALS_PER_WINDOW {
            r.suppressed += 1;
            return;
        }
        r.in_window += 1;
        if let Some(n) = note {
            self.line(format_args!(
                "{n} more refusal(s) of {kind} were not logged"
            ));
        }
        self.line(args);
    }

    /// Refusals of each kind counted but not logged yet.
    pub fn suppressed(&self, kind: &str) -> u64 {
        self.refusals.get(kind).map_or(0, |r| r.suppressed)
    }
}

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
                    Ok(n) => q.consume(n),
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => return true,
                    // A target that is gone (EPIPE, EIO, ENOSPC): what it would have taken
                    // is lost either way; drop it rather than retry for ever.
                    Err(_) => {
                        let n = q.pending().len();
                        q.consume(n);
                    }
                }
            }
            if q.dropped() == 0 {
                break;
            }
            q.consume(0);
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

    #[test]
    fn a_full_queue_counts_lines_and_reports_them_once_drained() {
        let mut q = Queue::new(10, Kind::Log);
        q.push(b"12345\n");
        q.push(b"abcdef\n"); // does not fit: dropped whole
        q.push(b"xyz\n");
        assert_eq!(q.pending(), b"12345\nxyz\n");
        assert_eq!(q.dropped(), 1);
        q.consume(6);
        assert_eq!(q.pending(), b"xyz\n");
        q.consume(4);
        let report = String::from_utf8(q.pending().to_vec()).unwrap();
        assert!(report.contains("1 log line(s) dropped"), "{report}");
        assert_eq!(q.dropped(), 0);
    }

    #[test]
    fn audit_drops_become_a_dropped_record() {
        let mut q = Queue::new(4, Kind::Audit);
        q.push(b"too long\n");
        q.push(b"nope\n");
        assert!(q.pending().is_empty());
        q.consume(0);
        let rec: Value = serde_json::from_slice(q.pending()).unwrap();
        assert_eq!(rec["event"], "dropped");
        assert_eq!(rec["count"], 2);
        assert!(rec["ts"].as_str().unwrap().ends_with('Z'));
    }

    #[test]
    fn refusals_are_rate_limited_with_a_count() {
        let mut log = Log::new(false);
        let t0 = Instant::now();
        for i in 0..25 {
            log.refusal("max-clients", t0, format_args!("refused {i}"));
        }
        assert_eq!(log.suppressed("max-clients"), 15);
        let text = String::from_utf8(log.queue.pending().to_vec()).unwrap();
        assert_eq!(text.lines().count(), 10);
        log.refusal("max-clients", t0 + REFUSAL_WINDOW, format_args!("again"));
        let text = String::from_utf8(log.queue.pending().to_vec()).unwrap();
        assert!(
            text.contains("15 more refusal(s) of max-clients were not logged"),
            "{text}"
        );
        assert!(text.ends_with("execd: again\n"));
    }

    #[test]
    fn log_lines_are_stamped_unless_asked_not_to() {
        let mut log = Log::new(true);
        log.line(format_args!("hello"));
        let text = String::from_utf8(log.queue.pending().to_vec()).unwrap();
        assert!(text.ends_with("Z execd: hello\n"), "{text}");
        assert!(text.starts_with("20"), "{text}");
    }

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
