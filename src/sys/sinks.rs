//! The writers that drain the log and audit queues (`core::log`) into stderr or the audit
//! file as fast as those accept.
//!
//! Invariants:
//! - The writer never blocks: it writes through a descriptor of its own in non-blocking
//!   mode (a fresh open of stderr, so the flag touches no other process's copy), and what
//!   the target does not take waits in the queue for the next turn.
//! - It never spins either. A target that can be polled (a pipe, a FIFO, a terminal, a
//!   socket) and would block is written again only after the loop saw it WRITABLE: until
//!   then the loop sleeps as if the sink were not there. A regular file cannot be polled
//!   (epoll refuses it) and never blocks, so it is simply written each turn that has
//!   something for it.
//! - A descriptor is registered with the loop at most once, the first time it would block,
//!   and stays registered (for WRITABLE, edge-triggered, as mio registers everything) until
//!   it is replaced. Registering it again would fail (`EEXIST`); taking that failure for
//!   "cannot be polled" and deregistering would leave a stalled FIFO that no event ever
//!   wakes again. Registering late rather than at open costs nothing: epoll reports a
//!   target that became writable before the registration at once, and every wakeup after
//!   it (a reader emptying a full pipe) as an edge, so no resumption is missed. The sink
//!   only remembers whether it waits for that edge (`ready`) and whether it is registered.
//! - Nothing written is ever torn. A pipe or FIFO may take part of a line: the rest stays
//!   queued and follows on the next write, so the reader sees it whole. A regular file that
//!   takes part of a line and then fails (`ENOSPC`: a full disk) has that part taken back:
//!   the file is appended to (`O_APPEND`), so the part is its last bytes, and `ftruncate`
//!   to its size less the bytes of the line the queue says went out leaves whole lines
//!   only. This is done when the write fails rather than by remembering an offset after
//!   each line: a partial line never outlives one `drain` (a regular file either takes
//!   more at once or fails at once), so the file's size then is the only offset needed.
//!   It assumes nobody else appends to the audit file between those two writes. A reader
//!   of the file at that moment (between the write and the `ftruncate`, microseconds) can
//!   see the part before it is taken back: what stays in the file is whole.
//! - Every loss is counted in lines. A write error (`ENOSPC`, `EIO`, `EPIPE`) loses what is
//!   queued, counted line by line by the queue, which reports the count (a `dropped`
//!   record for the audit, a plain line for the log) once a later write gets everything
//!   through. What is queued is lost at once rather than kept: a full disk would only fill
//!   the queue, and counting now keeps the count exact whatever happens next. Nothing is
//!   retried for ever, nor on a timer: the next turn with something to write tries again
//!   (a record to write, or the report still owed), so a disk that frees space takes
//!   records again and hears what it missed with the next thing the daemon does.
//! - An audit file that starts failing says so once in the log (and once more when it
//!   takes records again); the log cannot say that about itself.
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
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::Path;
use std::time::SystemTime;

use crate::core::log::{Log, Queue};

/// What kind of target a descriptor writes to, which decides how it fails and waits.
#[derive(Debug, Clone, Copy, PartialEq)]
enum TargetKind {
    /// A regular file: never blocks, cannot be polled, may fail part-way (a full disk).
    File,
    /// A pipe, FIFO, terminal or character device: may block; a partial write is
    /// finished by the next one.
    Stream,
    /// A socket shared with no one but written with `MSG_DONTWAIT`: a stream socket (the
    /// journal's stdout stream) cannot be reopened through `/proc`.
    Socket,
}

/// At most this much goes to a terminal shared with whoever started execd in one write:
/// a terminal that polls writable has room for that much.
const TTY_CHUNK: usize = 256;

/// Where a queue's bytes go: a descriptor of our own, written without ever blocking.
#[derive(Debug)]
pub struct Out {
    file: File,
    target: TargetKind,
    /// Partial lines taken back from a regular file after a failed write.
    taken_back: u64,
    /// The inherited description, left blocking (its mode is shared with other
    /// processes): written only when `poll` says it takes this many bytes.
    shared: Option<usize>,
}

/// How a `drain` ended.
#[derive(Debug, PartialEq)]
pub enum Drained {
    /// Everything queued was written.
    Empty,
    /// The target takes no more for now (it can be polled for WRITABLE).
    Blocked,
    /// The write failed: the queue lost (and counted) `lost` lines.
    Failed { lost: u64, error: String },
}

impl Out {
    /// A descriptor of our own, already non-blocking.
    fn new(file: File) -> io::Result<Out> {
        let kind = file.metadata()?.file_type();
        let target = if kind.is_file() {
            TargetKind::File
        } else if kind.is_socket() {
            TargetKind::Socket
        } else {
            TargetKind::Stream
        };
        Ok(Out {
            file,
            target,
            taken_back: 0,
            shared: None,
        })
    }

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
            return Out::new(inherited()?);
        }
        let mut opts = OpenOptions::new();
        opts.write(true)
            .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC);
        // A file is appended to (reopening it without O_APPEND would write from its start).
        if meta.is_file() {
            opts.append(true);
        }
        match opts.open(target) {
            Ok(file) => Out::new(file),
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
                let mut out = Out::new(inherited()?)?;
                out.shared = Some(chunk);
                Ok(out)
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
        Out::new(opts.open(path)?)
    }

    pub fn fd(&self) -> RawFd {
        self.file.as_raw_fd()
    }

    /// Device and inode: whether two opens reach the same file.
    fn identity(&self) -> Option<(u64, u64)> {
        self.file.metadata().ok().map(|m| (m.dev(), m.ino()))
    }

    /// Writes what the queue holds, and then the report of what it lost, until the target
    /// would block or fails. A failure loses (and counts) everything queued, after taking
    /// back from a regular file the start of a line it took only in part.
    pub fn drain(&mut self, q: &mut Queue) -> Drained {
        loop {
            if q.pending().is_empty() && !q.report_drops(SystemTime::now()) {
                return Drained::Empty;
            }
            let r = match (self.target, self.shared) {
                (TargetKind::Socket, _) => {
                    crate::sys::socket::send_nonblocking(self.file.as_raw_fd(), q.pending())
                }
                (_, Some(chunk)) => {
                    if has_room(self.file.as_raw_fd()) {
                        let n = q.pending().len().min(chunk);
                        self.file.write(&q.pending()[..n])
                    } else {
                        Err(io::ErrorKind::WouldBlock.into())
                    }
                }
                _ => self.file.write(q.pending()),
            };
            let error = match r {
                Ok(0) => io::Error::new(io::ErrorKind::WriteZero, "the target took nothing"),
                Ok(n) => {
                    q.consume(n);
                    continue;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Drained::Blocked,
                Err(e) => e,
            };
            // A target that fails (ENOSPC, EIO, EPIPE): what it would have taken is lost
            // either way; count it rather than retry for ever.
            let mut error = error.to_string();
            if self.target == TargetKind::File && q.front_written() > 0 {
                match self.take_back(q.front_written()) {
                    Ok(()) => self.taken_back += 1,
                    Err(e) => error = format!("{error}; a partial line stays: {e}"),
                }
            }
            let lost = q.lose_pending();
            return Drained::Failed { lost, error };
        }
    }

    /// Cuts the last `partial` bytes (the start of a line whose rest failed) off the
    /// regular file: appended to, the file ends with them.
    fn take_back(&self, partial: usize) -> io::Result<()> {
        let size = self.file.metadata()?.len();
        self.file.set_len(size.saturating_sub(partial as u64))
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

/// One queue's target and its standing with the loop.
#[derive(Debug)]
pub struct Sink {
    out: Out,
    token: mio::Token,
    /// The descriptor is registered for WRITABLE under `token` (once, then kept).
    registered: bool,
    /// Worth writing: it has not blocked since the last WRITABLE edge (or it cannot be
    /// polled, and is tried every turn).
    ready: bool,
    /// The last write failed (said once in the log for the audit file).
    failing: bool,
}

impl Sink {
    pub fn new(out: Out, token: mio::Token) -> Sink {
        Sink {
            out,
            token,
            registered: false,
            ready: true,
            failing: false,
        }
    }

    /// Writes `q` as far as the target takes it, unless the sink waits for WRITABLE.
    /// Returns how the writing ended, if it wrote.
    pub fn write(&mut self, q: &mut Queue, registry: &mio::Registry) -> Option<Drained> {
        if q.is_empty() || !self.ready {
            return None;
        }
        let drained = self.out.drain(q);
        if drained == Drained::Blocked {
            self.ready = false;
            if !self.registered {
                let fd = self.out.fd();
                match registry.register(
                    &mut mio::unix::SourceFd(&fd),
                    self.token,
                    mio::Interest::WRITABLE,
                ) {
                    Ok(()) => self.registered = true,
                    // Cannot be polled after all: tried again next turn.
                    Err(_) => self.ready = true,
                }
            }
        }
        Some(drained)
    }

    /// The loop saw an event for the sink: its target may take more (or has an error the
    /// next write meets).
    fn wake(&mut self) {
        self.ready = true;
    }

    /// Leaves the loop (before the descriptor is replaced).
    fn deregister(&mut self, registry: &mio::Registry) {
        if std::mem::take(&mut self.registered) {
            let _ = registry.deregister(&mut mio::unix::SourceFd(&self.out.fd()));
        }
    }
}

/// The descriptors the log and the audit records are written to.
#[derive(Debug)]
pub struct Sinks {
    log: Option<Sink>,
    audit: Option<Sink>,
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
            Some(path) => Some(Sink::new(
                Out::file(path).map_err(|e| {
                    io::Error::new(e.kind(), format!("--audit {}: {e}", path.display()))
                })?,
                audit_token,
            )),
            None => None,
        };
        Ok(Sinks {
            log: Out::stderr().ok().map(|o| Sink::new(o, log_token)),
            audit,
            audit_token,
        })
    }

    /// The audit file's descriptor, which an upgrade in place carries (the new image goes
    /// on writing the same file, rotated or not).
    pub fn audit_fd(&self) -> Option<RawFd> {
        self.audit.as_ref().map(|s| s.out.fd())
    }

    /// Sinks after an upgrade in place: stderr opened again for the log, the audit file
    /// the one carried.
    pub fn resume(
        audit: Option<std::os::fd::OwnedFd>,
        log_token: mio::Token,
        audit_token: mio::Token,
    ) -> io::Result<Sinks> {
        let audit = match audit {
            Some(fd) => Some(Sink::new(Out::new(File::from(fd))?, audit_token)),
            None => None,
        };
        Ok(Sinks {
            log: Out::stderr().ok().map(|o| Sink::new(o, log_token)),
            audit,
            audit_token,
        })
    }

    /// An event for `token`: its target may take more now (WRITABLE, or an error that the
    /// next write will meet).
    pub fn writable(&mut self, token: mio::Token) {
        for sink in [&mut self.log, &mut self.audit].into_iter().flatten() {
            if sink.token == token {
                sink.wake();
            }
        }
    }

    /// Writes the queues as far as their targets take them (see the module's notes). An
    /// audit file that starts or stops failing is logged.
    pub fn write(&mut self, registry: &mio::Registry, log: &mut Log, audit: Option<&mut Queue>) {
        if let (Some(sink), Some(q)) = (self.audit.as_mut(), audit) {
            match sink.write(q, registry) {
                Some(Drained::Failed { lost, error }) if !sink.failing => {
                    sink.failing = true;
                    log.error(format_args!(
                        "audit file: {error}; {lost} record(s) lost, and records are counted \
                         until it takes them again"
                    ));
                }
                Some(Drained::Empty | Drained::Blocked) if sink.failing => {
                    sink.failing = false;
                    log.line(format_args!("audit file takes records again"));
                }
                _ => {}
            }
        }
        if let Some(sink) = self.log.as_mut() {
            sink.write(&mut log.queue, registry);
        }
    }

    /// Reopens the audit file at `path` (log rotation): what the old one had not taken yet
    /// goes to the new one. A line the old one took in part (a FIFO) is finished only if
    /// the new one is the same; otherwise its rest is counted as lost rather than start
    /// the new file with half a line. On failure the old one stays.
    pub fn reopen_audit(
        &mut self,
        registry: &mio::Registry,
        path: &Path,
        q: Option<&mut Queue>,
    ) -> io::Result<()> {
        let out = Out::file(path)?;
        if let Some(mut old) = self.audit.take() {
            old.deregister(registry);
            if let Some(q) = q {
                if old.out.identity().is_none() || old.out.identity() != out.identity() {
                    q.lose_partial();
                }
            }
        }
        self.audit = Some(Sink::new(out, self.audit_token));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::log::{audit_line, Kind, Queue, QUEUE_BYTES};
    use serde_json::{Map, Value};
    use std::io::Read;
    use std::os::fd::OwnedFd;
    use std::path::PathBuf;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::{Duration, Instant};

    const TOKEN: mio::Token = mio::Token(7);

    static NEXT: AtomicUsize = AtomicUsize::new(0);

    /// A private directory, removed on drop.
    struct Dir(PathBuf);

    impl Dir {
        fn new(tag: &str) -> Dir {
            let n = NEXT.fetch_add(1, Ordering::SeqCst);
            let dir =
                std::env::temp_dir().join(format!("execd-sinks-{tag}-{}-{n}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).unwrap();
            Dir(dir)
        }
    }

    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    /// A test cannot run here: fails under `CI=true` (CI must provide what it needs),
    /// else says so on stderr.
    fn skip(why: &str) {
        assert!(
            std::env::var("CI").map_or(true, |v| v != "true"),
            "cannot run under CI=true: {why}"
        );
        eprintln!("SKIPPED: {why}");
    }

    /// A small tmpfs mounted on a private directory, unmounted on drop.
    struct Tmpfs(Dir);

    impl Tmpfs {
        /// `None` (after `skip`) where mounting is not permitted.
        fn mount(size: &str) -> Option<Tmpfs> {
            let dir = Dir::new("tmpfs");
            let c = |s: &str| std::ffi::CString::new(s).unwrap();
            let (target, fs, data) = (
                c(dir.0.to_str().unwrap()),
                c("tmpfs"),
                c(&format!("size={size},mode=0700")),
            );
            // SAFETY: valid NUL-terminated strings for mount(2).
            let rc = unsafe {
                libc::mount(
                    fs.as_ptr(),
                    target.as_ptr(),
                    fs.as_ptr(),
                    libc::MS_NOSUID | libc::MS_NODEV,
                    data.as_ptr().cast(),
                )
            };
            if rc != 0 {
                skip(&format!(
                    "cannot mount a tmpfs (needs root): {}",
                    io::Error::last_os_error()
                ));
                return None;
            }
            Some(Tmpfs(dir))
        }

        fn path(&self) -> &Path {
            &self.0 .0
        }
    }

    impl Drop for Tmpfs {
        fn drop(&mut self) {
            let target = std::ffi::CString::new(self.path().to_str().unwrap()).unwrap();
            // SAFETY: a valid NUL-terminated path for umount2(2).
            unsafe {
                libc::umount2(target.as_ptr(), libc::MNT_DETACH);
            }
        }
    }

    /// Audit record `seq`, padded to about `size` bytes.
    fn record(seq: u64, size: usize) -> Vec<u8> {
        let mut fields = Map::new();
        fields.insert("seq".into(), seq.into());
        fields.insert("pad".into(), "p".repeat(size.saturating_sub(80)).into());
        audit_line(SystemTime::now(), "start", None, fields)
    }

    /// What a reader got: the `seq` of every record in order and the counts of the
    /// `dropped` records. Panics on a line that is not whole JSON.
    fn parse_audit(bytes: &[u8]) -> (Vec<u64>, Vec<u64>) {
        let text = std::str::from_utf8(bytes).unwrap();
        assert!(
            text.is_empty() || text.ends_with('\n'),
            "ends mid-line: {:?}",
            &text[text.len().saturating_sub(80)..]
        );
        let (mut seqs, mut dropped) = (Vec::new(), Vec::new());
        for line in text.lines() {
            let rec: Value = serde_json::from_str(line)
                .unwrap_or_else(|e| panic!("a torn line ({e}): {line:?}"));
            match rec["event"].as_str() {
                Some("dropped") => dropped.push(rec["count"].as_u64().unwrap()),
                Some("start") => seqs.push(rec["seq"].as_u64().unwrap()),
                _ => panic!("unexpected record {line}"),
            }
        }
        (seqs, dropped)
    }

    fn nonblocking_reader(fd: &OwnedFd) {
        crate::sys::spawn::set_nonblocking(fd.as_raw_fd()).unwrap();
    }

    /// Reads what `r` holds now.
    fn read_available(r: &mut File, into: &mut Vec<u8>) {
        let mut buf = vec![0u8; 64 << 10];
        loop {
            match r.read(&mut buf) {
                Ok(0) => return,
                Ok(n) => into.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) => panic!("read: {e}"),
            }
        }
    }

    #[test]
    fn a_pipe_nobody_reads_never_blocks_the_writer() {
        let (r, w) = crate::sys::spawn::pipe().unwrap();
        crate::sys::spawn::set_nonblocking(w.as_raw_fd()).unwrap();
        let mut out = Out::new(File::from(w)).unwrap();
        assert_eq!(out.target, TargetKind::Stream);
        let mut q = Queue::new(QUEUE_BYTES, Kind::Log);
        let line = [b'x'; 1023];
        let mut last = Drained::Empty;
        for _ in 0..200 {
            let mut l = line.to_vec();
            l.push(b'\n');
            q.push(&l);
            last = out.drain(&mut q);
        }
        assert_eq!(last, Drained::Blocked, "a 64 KiB pipe cannot take 200 KiB");
        drop(r);
    }

    /// The writer on a stalled target `out` (whose other end is `reader`): `made` records
    /// of about 1 KiB, written as the loop would (one `write` per record), overflow the
    /// queue; while the reader stalls, the loop would sleep (no event); then the reader
    /// reads, and each round it empties the pipe brings a WRITABLE edge (the descriptor
    /// stays registered), until the queue and its `dropped` record are through. Returns
    /// what the reader got.
    fn stall_then_resume(out: Out, mut reader: File, made: u64) -> Vec<u8> {
        let mut poll = mio::Poll::new().unwrap();
        let mut events = mio::Events::with_capacity(16);
        let mut sink = Sink::new(out, TOKEN);
        let mut q = Queue::new(QUEUE_BYTES, Kind::Audit);
        for seq in 0..made {
            q.push(&record(seq, 1024));
            sink.write(&mut q, poll.registry());
        }
        assert!(q.dropped() > 0, "2 MiB cannot fit a 1 MiB queue and a pipe");
        assert!(sink.registered && !sink.ready, "it waits for WRITABLE");
        // A stalled target wakes no one: the loop would sleep.
        poll.poll(&mut events, Some(Duration::from_millis(200)))
            .unwrap();
        assert!(events.is_empty(), "an event while the reader stalls");
        let mut got = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(20);
        let mut rounds = 0;
        while !q.is_empty() {
            assert!(Instant::now() < deadline, "stuck after {rounds} rounds");
            read_available(&mut reader, &mut got);
            poll.poll(&mut events, Some(Duration::from_secs(5)))
                .unwrap();
            assert!(
                events.iter().any(|e| e.token() == TOKEN),
                "no WRITABLE edge in round {rounds} after the reader emptied the pipe"
            );
            sink.wake();
            sink.write(&mut q, poll.registry());
            rounds += 1;
        }
        assert!(rounds > 10, "1 MiB through a 64 KiB pipe takes many rounds");
        // Resumed: a fresh record goes straight through.
        q.push(&record(made, 100));
        assert_eq!(sink.write(&mut q, poll.registry()), Some(Drained::Empty));
        read_available(&mut reader, &mut got);
        got
    }

    /// Every record the reader got is whole, in order, and those present plus the counts
    /// of the `dropped` records are every record made.
    fn check_accounting(got: &[u8], made: u64) {
        let (seqs, dropped) = parse_audit(got);
        assert!(seqs.windows(2).all(|w| w[0] < w[1]), "out of order");
        assert_eq!(dropped.len(), 1, "one dropped record: {dropped:?}");
        assert_eq!(
            seqs.len() as u64 + dropped.iter().sum::<u64>(),
            made + 1,
            "{} present, {dropped:?} counted dropped, {} made",
            seqs.len(),
            made + 1
        );
        assert_eq!(seqs.last(), Some(&made), "the fresh record arrived last");
    }

    #[test]
    fn a_stalled_pipe_resumes_on_its_writable_edge_and_counts_what_it_dropped() {
        let (r, w) = crate::sys::spawn::pipe().unwrap();
        crate::sys::spawn::set_nonblocking(w.as_raw_fd()).unwrap();
        nonblocking_reader(&r);
        let got = stall_then_resume(Out::new(File::from(w)).unwrap(), File::from(r), 2000);
        check_accounting(&got, 2000);
    }

    #[test]
    fn a_stalled_fifo_resumes_on_its_writable_edge_and_counts_what_it_dropped() {
        let dir = Dir::new("fifo");
        let fifo = dir.0.join("audit.fifo");
        let path = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: a valid NUL-terminated path for mkfifo(3).
        assert_eq!(unsafe { libc::mkfifo(path.as_ptr(), 0o600) }, 0);
        let out = Out::file(&fifo).unwrap();
        assert_eq!(out.target, TargetKind::Stream);
        let reader = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(&fifo)
            .unwrap();
        let got = stall_then_resume(out, reader, 2000);
        check_accounting(&got, 2000);
    }

    #[test]
    fn a_log_on_a_stalled_pipe_reports_its_drops_as_a_line() {
        let (r, w) = crate::sys::spawn::pipe().unwrap();
        crate::sys::spawn::set_nonblocking(w.as_raw_fd()).unwrap();
        nonblocking_reader(&r);
        let (mut reader, mut out) = (File::from(r), Out::new(File::from(w)).unwrap());
        let mut q = Queue::new(4096, Kind::Log);
        let made = 500;
        for i in 0..made {
            q.push(format!("execd: line {i:04} {}\n", "l".repeat(200)).as_bytes());
            out.drain(&mut q);
        }
        let mut got = Vec::new();
        while !q.is_empty() {
            read_available(&mut reader, &mut got);
            out.drain(&mut q);
        }
        read_available(&mut reader, &mut got);
        let text = String::from_utf8(got).unwrap();
        let mut present = 0;
        let mut dropped = 0;
        for line in text.lines() {
            if let Some(n) = line.strip_suffix(" log line(s) dropped: stderr was not taking them") {
                dropped += n.rsplit(' ').next().unwrap().parse::<u64>().unwrap();
            } else {
                assert!(
                    line.starts_with("execd: line ") && line.len() == 217,
                    "{line}"
                );
                present += 1;
            }
        }
        assert!(dropped > 0);
        assert_eq!(present + dropped, made);
    }

    #[test]
    fn a_closed_pipe_loses_and_counts_every_line() {
        let (r, w) = crate::sys::spawn::pipe().unwrap();
        crate::sys::spawn::set_nonblocking(w.as_raw_fd()).unwrap();
        drop(r);
        let mut out = Out::new(File::from(w)).unwrap();
        let mut q = Queue::new(QUEUE_BYTES, Kind::Audit);
        for seq in 0..5 {
            q.push(&record(seq, 200));
        }
        match out.drain(&mut q) {
            Drained::Failed { lost, .. } => assert_eq!(lost, 5),
            other => panic!("{other:?}"),
        }
        assert_eq!(q.dropped(), 5);
        // Every later try fails too; the count carries over, one per record.
        q.push(&record(5, 200));
        assert!(matches!(out.drain(&mut q), Drained::Failed { .. }));
        assert_eq!(q.dropped(), 6);
    }

    /// Records into an audit file on a 64 KiB tmpfs, one write per record as the loop
    /// does: the disk fills (a record half taken and then `ENOSPC`), the file keeps whole
    /// lines only, and once space is freed the records resume with a `dropped` record
    /// whose count, with the records present, is every record made.
    #[test]
    fn a_full_disk_keeps_whole_lines_and_counts_what_it_lost() {
        let Some(fs) = Tmpfs::mount("64k") else {
            return;
        };
        // Room to free later.
        std::fs::write(fs.path().join("filler"), vec![0u8; 16 << 10]).unwrap();
        let path = fs.path().join("audit.jsonl");
        let mut sink = Sink::new(Out::file(&path).unwrap(), TOKEN);
        assert_eq!(sink.out.target, TargetKind::File);
        let poll = mio::Poll::new().unwrap();
        let mut q = Queue::new(QUEUE_BYTES, Kind::Audit);
        let mut seq = 0;
        let mut failures = 0;
        // 300-byte records do not divide a 4 KiB page: the one crossing into a page the
        // disk does not have is taken in part.
        while failures < 20 {
            q.push(&record(seq, 300));
            seq += 1;
            if let Some(Drained::Failed { lost, .. }) = sink.write(&mut q, poll.registry()) {
                assert!(lost >= 1);
                failures += 1;
            }
            assert!(seq < 10_000, "the disk never filled");
        }
        // Several records queued before a failing write are all counted.
        for _ in 0..5 {
            q.push(&record(seq, 300));
            seq += 1;
        }
        match sink.write(&mut q, poll.registry()) {
            Some(Drained::Failed { lost, .. }) => assert_eq!(lost, 5),
            other => panic!("{other:?}"),
        }
        assert!(sink.out.taken_back > 0, "no partial line was taken back");
        let full = std::fs::read(&path).unwrap();
        let (seqs, dropped) = parse_audit(&full);
        assert!(dropped.is_empty(), "no report fits a full disk");
        assert_eq!(seqs.len() as u64 + q.dropped(), seq);
        // Space comes back; the next record brings the report and itself.
        std::fs::remove_file(fs.path().join("filler")).unwrap();
        q.push(&record(seq, 300));
        seq += 1;
        assert_eq!(sink.write(&mut q, poll.registry()), Some(Drained::Empty));
        let (seqs, dropped) = parse_audit(&std::fs::read(&path).unwrap());
        assert_eq!(dropped.len(), 1);
        assert_eq!(
            seqs.len() as u64 + dropped[0],
            seq,
            "{} present, {} counted dropped, {seq} made",
            seqs.len(),
            dropped[0]
        );
        assert!(seqs.windows(2).all(|w| w[0] < w[1]));
        assert_eq!(seqs.last(), Some(&(seq - 1)));
        assert!(!sink.registered, "a regular file is never registered");
    }

    /// The log says once that the audit file fails, and once that it recovers.
    #[test]
    fn an_audit_file_that_fails_is_logged_once() {
        let Some(fs) = Tmpfs::mount("16k") else {
            return;
        };
        std::fs::write(fs.path().join("filler"), vec![0u8; 8 << 10]).unwrap();
        let path = fs.path().join("audit.jsonl");
        let poll = mio::Poll::new().unwrap();
        let mut sinks = Sinks {
            log: None,
            audit: Some(Sink::new(Out::file(&path).unwrap(), TOKEN)),
            audit_token: TOKEN,
        };
        let mut log = Log::new(false);
        let mut q = Queue::new(QUEUE_BYTES, Kind::Audit);
        for seq in 0..100 {
            q.push(&record(seq, 300));
            sinks.write(poll.registry(), &mut log, Some(&mut q));
        }
        std::fs::remove_file(fs.path().join("filler")).unwrap();
        q.push(&record(100, 300));
        sinks.write(poll.registry(), &mut log, Some(&mut q));
        let text = String::from_utf8(log.queue.pending().to_vec()).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 2, "{text}");
        assert!(lines[0].starts_with("execd: audit file: No space left on device"));
        assert_eq!(lines[1], "execd: audit file takes records again");
    }

    /// A stderr execd may not reopen is written through the inherited, blocking
    /// descriptor: in pieces that fit, and not at all while the pipe is full.
    #[test]
    fn a_shared_blocking_pipe_is_written_only_when_it_has_room() {
        let (r, w) = crate::sys::spawn::pipe().unwrap();
        let mut out = Out::new(File::from(w)).unwrap();
        out.shared = Some(libc::PIPE_BUF);
        let mut q = Queue::new(QUEUE_BYTES, Kind::Log);
        let mut line = vec![b'y'; 1023];
        line.push(b'\n');
        for _ in 0..200 {
            q.push(&line);
        }
        // This would hang on a blocking write of the whole queue.
        assert_eq!(
            out.drain(&mut q),
            Drained::Blocked,
            "a 64 KiB pipe cannot take 200 KiB"
        );
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
