//! The off-loop reader's own side: `execd --reader`, a second process of the daemon that
//! makes every read of another process that may wait for that process's memory lock, and
//! the small framed messages it and the loop exchange over its stdin and stdout. The
//! loop's side (starting it, its deadline, restarts, who asked what) is `server::reader`.
//!
//! Why a process: reading `/proc/PID/environ` (a cookie sweep, PROTOCOL 14; a peer's
//! cookie, 7.3) or a task's memory (its poll or select set, 12.3) takes the target's
//! memory lock. A process with one thread stuck in a page fault on a hung FUSE or NFS
//! mapping while another waits to write-lock it (an `mmap`) makes every such read wait,
//! as `ps` hangs on such hosts. A thread of the daemon stuck there could not be got back;
//! these reads wait killably, so a process doing them can be SIGKILLed out of the wait and
//! another started in its place. What needs no memory lock (`/proc/PID/stat`, cgroup
//! files, a pidfd's signal) stays on the loop.
//!
//! The reader is single-threaded for the work, one request at a time in the order sent,
//! and has a watchdog thread: before anything of a process is read, the work notes its
//! pid and the time (`Guard::at`, two atomic stores); the watchdog looks every `TICK`,
//! and a read that has lasted `DEADLINE` is reported as `Stuck {id, pid, start}` (written
//! after every answer the work already made, so the loop knows exactly what was done).
//! The loop then kills this process and starts another, which is told to skip that pid.
//! Answers are buffered and written when the reader has no request left to read.
//!
//! Messages (integers little-endian): a frame is `len: u32` (of what follows), `kind: u8`,
//! then the fields of the kind. A byte string is `len: u32` and its bytes; a list is
//! `count: u32` and its items. Requests (loop to reader): `Skip` (the pids not to read
//! from now on, replacing the last list), `Sweep`, `Look`, `Cookie`. Answers: `Hello` (once,
//! first: the reader runs), `Killed` (during a sweep), `Swept`, `Looked`, `Cookie`, `Stuck`.
//! A frame the reader cannot read ends it; one the loop cannot read ends that reader.
//!
//! Invariants:
//! - The reader inherits nothing it should not: the spawn gives it its two pipes and
//!   `/dev/null` as stderr and closes every other descriptor, an empty environment (no
//!   `EXECD_TREE`: no sweep takes it for a command's), no resource limit of commands, its
//!   own session, and the parent-death signal; it makes itself undumpable, as its memory
//!   holds other processes' environments.
//! - It never signals anything but what a sweep found carrying a cookie in scope.
//! - It exits when its stdin ends (the daemon closed it, exited, or re-executed itself).

use std::collections::{BTreeSet, HashSet};
use std::io::{self, Read, Write};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::cookie::{self, CookieRead, Instance, Scope, SweepStats};
use super::waiting::{self, InputFile};

/// The flag `execd` runs as the reader with.
pub const FLAG: &str = "--reader";

/// The reader's name in `ps` (its `comm`).
const NAME: &std::ffi::CStr = c"execd-reader";

/// How long one read of a process may take before it counts as hung.
pub const DEADLINE: Duration = Duration::from_millis(500);

/// How often the watchdog looks.
const TICK: Duration = Duration::from_millis(50);

/// The messages this build speaks (`Hello` says it).
pub const VERSION: u32 = 1;

/// Where Yama's `ptrace_scope` is read: 1 lets a process attach only to its descendants
/// (reading a task's `syscall` or memory is attaching, as far as the check goes).
const YAMA: &str = "/proc/sys/kernel/yama/ptrace_scope";

/// The largest frame either side takes.
pub const MAX_FRAME: usize = 4 << 20;

/// Answers buffered past this are written at once.
const FLUSH_AT: usize = 32 << 10;

// ---------------------------------------------------------------------------------------
// Messages
// ---------------------------------------------------------------------------------------

/// What the loop asks the reader.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    /// From now on, read nothing of these processes (their memory did not answer).
    Skip(Vec<i32>),
    /// A cookie sweep (`cookie::sweep`) for instance `me`.
    Sweep { id: u64, me: Instance, scope: Scope },
    /// Whether the tree led by `pid` waits for `input` (`waiting::look`).
    Look { id: u64, pid: i32, input: InputFile },
    /// The cookie of the process `pid` that started at `start` (`cookie::read_cookie`).
    Cookie { id: u64, pid: i32, start: u64 },
}

/// What the reader says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// It runs (the first frame it writes).
    Hello { pid: u32, version: u32 },
    /// Sweep `id` SIGKILLed `pid`, named `comm`.
    Killed { id: u64, pid: i32, comm: String },
    /// Sweep `id` ended.
    Swept { id: u64, stats: SweepStats },
    /// Look `id`: waiting, not waiting, or not known (`None`: a process of the tree was
    /// skipped and nothing else was found).
    Looked { id: u64, waiting: Option<bool> },
    /// Cookie read `id`.
    Cookie { id: u64, read: CookieRead },
    /// Request `id` has waited `DEADLINE` on `pid` (started at `start`; 0 if unknown).
    Stuck { id: u64, pid: i32, start: u64 },
}

/// A frame that cannot be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FrameError(pub &'static str);

impl std::fmt::Display for FrameError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0)
    }
}

const SKIP: u8 = 1;
const SWEEP: u8 = 2;
const LOOK: u8 = 3;
const COOKIE: u8 = 4;
const HELLO: u8 = 0x81;
const KILLED: u8 = 0x82;
const SWEPT: u8 = 0x83;
const LOOKED: u8 = 0x84;
const COOKIE_READ: u8 = 0x85;
const STUCK: u8 = 0x86;

/// A message of one side or the other.
pub trait Message: Sized {
    /// Appends the whole frame to `out`.
    fn encode(&self, out: &mut Vec<u8>);
    /// Reads the fields of a frame of `kind`.
    fn decode(kind: u8, body: &[u8]) -> Result<Self, FrameError>;
}

/// Writes a frame: its length, then what `fields` writes.
fn frame(out: &mut Vec<u8>, kind: u8, fields: impl FnOnce(&mut Vec<u8>)) {
    let at = out.len();
    out.extend_from_slice(&[0; 4]);
    out.push(kind);
    fields(out);
    let len = (out.len() - at - 4) as u32;
    out[at..at + 4].copy_from_slice(&len.to_le_bytes());
}

fn put_u32(out: &mut Vec<u8>, v: u32) {
    out.extend_from_slice(&v.to_le_bytes());
}

fn put_u64(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(&v.to_le_bytes());
}

fn put_i32(out: &mut Vec<u8>, v: i32) {
    out.extend_from_slice(&v.to_le_bytes());
}

fn put_bytes(out: &mut Vec<u8>, b: &[u8]) {
    put_u32(out, b.len() as u32);
    out.extend_from_slice(b);
}

/// Reads the fields of one frame, in order.
struct Fields<'a>(&'a [u8]);

impl<'a> Fields<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], FrameError> {
        if self.0.len() < n {
            return Err(FrameError("a frame ends inside a field"));
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }

    fn u8(&mut self) -> Result<u8, FrameError> {
        Ok(self.take(1)?[0])
    }

    fn u32(&mut self) -> Result<u32, FrameError> {
        let b = self.take(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn u64(&mut self) -> Result<u64, FrameError> {
        let mut a = [0u8; 8];
        a.copy_from_slice(self.take(8)?);
        Ok(u64::from_le_bytes(a))
    }

    fn i32(&mut self) -> Result<i32, FrameError> {
        Ok(self.u32()? as i32)
    }

    fn bool(&mut self) -> Result<bool, FrameError> {
        match self.u8()? {
            0 => Ok(false),
            1 => Ok(true),
            _ => Err(FrameError("a flag is neither 0 nor 1")),
        }
    }

    fn bytes(&mut self) -> Result<&'a [u8], FrameError> {
        let n = self.u32()? as usize;
        self.take(n)
    }

    fn string(&mut self) -> Result<String, FrameError> {
        let b = self.bytes()?;
        String::from_utf8(b.to_vec()).map_err(|_| FrameError("a name is not UTF-8"))
    }

    /// A count of items at least `each` bytes long: never more than what is left could
    /// hold, so a bad count allocates nothing.
    fn count(&mut self, each: usize) -> Result<usize, FrameError> {
        let n = self.u32()? as usize;
        if n.saturating_mul(each) > self.0.len() {
            return Err(FrameError("a list is longer than its frame"));
        }
        Ok(n)
    }

    /// The frame is read to its end.
    fn end(&self) -> Result<(), FrameError> {
        if self.0.is_empty() {
            Ok(())
        } else {
            Err(FrameError("a frame has bytes past its fields"))
        }
    }
}

impl Message for Request {
    fn encode(&self, out: &mut Vec<u8>) {
        match self {
            Request::Skip(pids) => frame(out, SKIP, |o| {
                put_u32(o, pids.len() as u32);
                pids.iter().for_each(|&p| put_i32(o, p));
            }),
            Request::Sweep { id, me, scope } => frame(out, SWEEP, |o| {
                put_u64(o, *id);
                put_u64(o, me.path);
                put_u32(o, me.pid);
                put_u64(o, me.start);
                put_u32(o, scope.ids.len() as u32);
                scope.ids.iter().for_each(|i| put_bytes(o, i.as_bytes()));
                o.push(u8::from(scope.every));
                o.push(u8::from(scope.earlier));
            }),
            Request::Look { id, pid, input } => frame(out, LOOK, |o| {
                put_u64(o, *id);
                put_i32(o, *pid);
                put_u64(o, input.dev);
                put_u64(o, input.ino);
                o.push(u8::from(input.tty.is_some()));
                put_u64(o, input.tty.unwrap_or(0));
            }),
            Request::Cookie { id, pid, start } => frame(out, COOKIE, |o| {
                put_u64(o, *id);
                put_i32(o, *pid);
                put_u64(o, *start);
            }),
        }
    }

    fn decode(kind: u8, body: &[u8]) -> Result<Request, FrameError> {
        let mut f = Fields(body);
        let req = match kind {
            SKIP => {
                let n = f.count(4)?;
                Request::Skip((0..n).map(|_| f.i32()).collect::<Result<_, _>>()?)
            }
            SWEEP => {
                let id = f.u64()?;
                let me = Instance {
                    path: f.u64()?,
                    pid: f.u32()?,
                    start: f.u64()?,
                };
                let n = f.count(4)?;
                let ids = (0..n)
                    .map(|_| f.string())
                    .collect::<Result<BTreeSet<_>, _>>()?;
                let scope = Scope {
                    ids,
                    every: f.bool()?,
                    earlier: f.bool()?,
                };
                Request::Sweep { id, me, scope }
            }
            LOOK => {
                let id = f.u64()?;
                let pid = f.i32()?;
                let (dev, ino) = (f.u64()?, f.u64()?);
                let is_tty = f.bool()?;
                let tty = f.u64()?;
                let input = InputFile {
                    dev,
                    ino,
                    tty: is_tty.then_some(tty),
                };
                Request::Look { id, pid, input }
            }
            COOKIE => Request::Cookie {
                id: f.u64()?,
                pid: f.i32()?,
                start: f.u64()?,
            },
            _ => return Err(FrameError("a request of an unknown kind")),
        };
        f.end()?;
        Ok(req)
    }
}

impl Message for Answer {
    fn encode(&self, out: &mut Vec<u8>) {
        match self {
            Answer::Hello { pid, version } => frame(out, HELLO, |o| {
                put_u32(o, *pid);
                put_u32(o, *version);
            }),
            Answer::Killed { id, pid, comm } => frame(out, KILLED, |o| {
                put_u64(o, *id);
                put_i32(o, *pid);
                put_bytes(o, comm.as_bytes());
            }),
            Answer::Swept { id, stats } => frame(out, SWEPT, |o| {
                put_u64(o, *id);
                put_u64(o, stats.read);
                put_u32(o, stats.passes);
                put_u64(o, stats.spared);
                put_u64(o, stats.micros);
                put_u32(o, stats.skipped.len() as u32);
                for &(pid, start) in &stats.skipped {
                    put_i32(o, pid);
                    put_u64(o, start);
                }
            }),
            Answer::Looked { id, waiting } => frame(out, LOOKED, |o| {
                put_u64(o, *id);
                o.push(match waiting {
                    Some(false) => 0,
                    Some(true) => 1,
                    None => 2,
                });
            }),
            Answer::Cookie { id, read } => frame(out, COOKIE_READ, |o| {
                put_u64(o, *id);
                match read {
                    CookieRead::Found(value) => {
                        o.push(0);
                        put_bytes(o, value);
                    }
                    CookieRead::Absent => o.push(1),
                    CookieRead::Gone => o.push(2),
                    CookieRead::Denied => o.push(3),
                    CookieRead::Hung => o.push(4),
                }
            }),
            Answer::Stuck { id, pid, start } => frame(out, STUCK, |o| {
                put_u64(o, *id);
                put_i32(o, *pid);
                put_u64(o, *start);
            }),
        }
    }

    fn decode(kind: u8, body: &[u8]) -> Result<Answer, FrameError> {
        let mut f = Fields(body);
        let answer = match kind {
            HELLO => Answer::Hello {
                pid: f.u32()?,
                version: f.u32()?,
            },
            KILLED => Answer::Killed {
                id: f.u64()?,
                pid: f.i32()?,
                comm: String::from_utf8_lossy(f.bytes()?).into_owned(),
            },
            SWEPT => {
                let id = f.u64()?;
                let (read, passes, spared, micros) = (f.u64()?, f.u32()?, f.u64()?, f.u64()?);
                let n = f.count(12)?;
                let skipped = (0..n)
                    .map(|_| Ok((f.i32()?, f.u64()?)))
                    .collect::<Result<_, FrameError>>()?;
                let stats = SweepStats {
                    read,
                    passes,
                    spared,
                    micros,
                    skipped,
                };
                Answer::Swept { id, stats }
            }
            LOOKED => Answer::Looked {
                id: f.u64()?,
                waiting: match f.u8()? {
                    0 => Some(false),
                    1 => Some(true),
                    2 => None,
                    _ => return Err(FrameError("a look's answer is not 0, 1 or 2")),
                },
            },
            COOKIE_READ => {
                let id = f.u64()?;
                let read = match f.u8()? {
                    0 => CookieRead::Found(f.bytes()?.to_vec()),
                    1 => CookieRead::Absent,
                    2 => CookieRead::Gone,
                    3 => CookieRead::Denied,
                    4 => CookieRead::Hung,
                    _ => return Err(FrameError("a cookie read of an unknown kind")),
                };
                Answer::Cookie { id, read }
            }
            STUCK => Answer::Stuck {
                id: f.u64()?,
                pid: f.i32()?,
                start: f.u64()?,
            },
            _ => return Err(FrameError("an answer of an unknown kind")),
        };
        f.end()?;
        Ok(answer)
    }
}

/// Bytes read from a pipe, cut into whole frames as they arrive.
#[derive(Debug, Default)]
pub struct Frames {
    buf: Vec<u8>,
    /// Where the first frame not taken yet starts.
    at: usize,
}

impl Frames {
    /// What was read.
    pub fn push(&mut self, bytes: &[u8]) {
        if self.at == self.buf.len() {
            self.buf.clear();
            self.at = 0;
        }
        self.buf.extend_from_slice(bytes);
    }

    /// The next whole message, `None` until one has arrived whole.
    pub fn next<M: Message>(&mut self) -> Result<Option<M>, FrameError> {
        let rest = &self.buf[self.at..];
        if rest.len() < 4 {
            return Ok(None);
        }
        let len = u32::from_le_bytes([rest[0], rest[1], rest[2], rest[3]]) as usize;
        if len == 0 || len > MAX_FRAME {
            return Err(FrameError("a frame of no kind, or larger than the largest"));
        }
        if rest.len() < 4 + len {
            return Ok(None);
        }
        let message = M::decode(rest[4], &rest[5..4 + len])?;
        self.at += 4 + len;
        if self.at == self.buf.len() {
            self.buf.clear();
            self.at = 0;
        } else if self.at > 64 << 10 {
            // A long stream of frames: what was taken goes, so the buffer stays small.
            self.buf.drain(..self.at);
            self.at = 0;
        }
        Ok(Some(message))
    }
}

// ---------------------------------------------------------------------------------------
// Whether the looks can be the reader's
// ---------------------------------------------------------------------------------------

/// Whether the reader may make the looks for input: reading a task's `syscall` and memory
/// needs the right to attach to it. Root has it. Otherwise the commands run as the
/// daemon's own user, and where Yama's `ptrace_scope` (`yama`, as its file reads) is 1
/// only their ancestor, the daemon, may attach: the reader is their sibling. (At 2 or 3
/// nobody without `CAP_SYS_PTRACE` may, the daemon neither.)
pub fn looks_off_loop(euid: u32, yama: Option<&str>) -> bool {
    euid == 0 || yama.is_none_or(|scope| scope.trim() != "1")
}

/// This host's Yama `ptrace_scope`, as its file reads (none without Yama).
pub fn yama_scope() -> Option<String> {
    std::fs::read_to_string(YAMA).ok()
}

// ---------------------------------------------------------------------------------------
// The reader process
// ---------------------------------------------------------------------------------------

/// What the work is reading, for the watchdog.
struct Guard {
    epoch: Instant,
    /// The request being served.
    req: AtomicU64,
    /// The process being read; 0 between reads.
    pid: AtomicI32,
    /// Since when, in ms from `epoch`.
    since: AtomicU64,
    /// This read was reported.
    told: AtomicBool,
    /// The reader is done: the watchdog ends.
    done: AtomicBool,
    /// The watchdog, which sleeps while nothing is read (woken by `at`).
    watchdog: std::sync::OnceLock<std::thread::Thread>,
}

impl Guard {
    fn new() -> Guard {
        Guard {
            epoch: Instant::now(),
            req: AtomicU64::new(0),
            pid: AtomicI32::new(0),
            since: AtomicU64::new(0),
            told: AtomicBool::new(false),
            done: AtomicBool::new(false),
            watchdog: std::sync::OnceLock::new(),
        }
    }

    fn ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    fn begin(&self, req: u64) {
        self.req.store(req, Ordering::Relaxed);
    }

    /// Something of `pid` is about to be read.
    fn at(&self, pid: i32) {
        self.since.store(self.ms(), Ordering::Relaxed);
        self.told.store(false, Ordering::Relaxed);
        self.pid.store(pid, Ordering::Release);
        // An atomic swap; a system call only when the watchdog sleeps.
        if let Some(watchdog) = self.watchdog.get() {
            watchdog.unpark();
        }
    }

    /// Nothing is being read.
    fn idle(&self) {
        self.pid.store(0, Ordering::Release);
    }
}

/// The answers, buffered; written by the work when it has nothing left to read, and by
/// the watchdog after a `Stuck`.
struct Out {
    state: Mutex<(Vec<u8>, Box<dyn Write + Send>)>,
}

impl Out {
    fn lock(&self) -> std::sync::MutexGuard<'_, (Vec<u8>, Box<dyn Write + Send>)> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn send(&self, answer: &Answer) {
        let mut state = self.lock();
        answer.encode(&mut state.0);
        if state.0.len() >= FLUSH_AT {
            let _ = write_out(&mut state);
        }
    }

    fn flush(&self) -> io::Result<()> {
        write_out(&mut self.lock())
    }
}

fn write_out((buf, sink): &mut (Vec<u8>, Box<dyn Write + Send>)) -> io::Result<()> {
    sink.write_all(buf)?;
    sink.flush()?;
    buf.clear();
    Ok(())
}

/// The reader's main (`execd --reader`): serves requests from stdin until it ends.
/// Returns the exit code.
pub fn serve() -> i32 {
    name_self();
    serve_on(
        Requests {
            mapped_since: Some(Instant::now()),
        },
        Box::new(io::stdout()),
    )
}

/// The reader's stdin, read straight from descriptor 0. Once `host::IDLE_GIVE_BACK`
/// has passed since the first request after the last give-back (or the start), the
/// reader gives back what it does not need while it waits (its code pages, its free heap)
/// as soon as nothing is left to read: at most once in that time, so the input checks
/// the loop asks for every 700 ms while a command has its stdin open cannot keep it from
/// it.
struct Requests {
    /// When the reader last began to need its pages again; `None` once given back.
    mapped_since: Option<Instant>,
}

impl Read for Requests {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if let Some(since) = self.mapped_since {
            let left =
                (since + super::host::IDLE_GIVE_BACK).saturating_duration_since(Instant::now());
            let mut stdin = libc::pollfd {
                fd: 0,
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one pollfd that lives across the call.
            if unsafe { libc::poll(&mut stdin, 1, left.as_millis() as libc::c_int) } == 0 {
                super::host::trim_heap();
                super::host::unmap_own_code();
                self.mapped_since = None;
            }
        }
        // SAFETY: `buf` is writable for its length.
        let n = unsafe { libc::read(0, buf.as_mut_ptr().cast(), buf.len()) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        if n > 0 && self.mapped_since.is_none() {
            self.mapped_since = Some(Instant::now());
        }
        Ok(n as usize)
    }
}

/// Serves the requests read from `input` until it ends, answering on `output`.
fn serve_on(input: impl Read, output: Box<dyn Write + Send>) -> i32 {
    let out = Arc::new(Out {
        state: Mutex::new((Vec::new(), output)),
    });
    let guard = Arc::new(Guard::new());
    let code = serve_with(input, &out, &guard);
    guard.done.store(true, Ordering::Relaxed);
    if let Some(watchdog) = guard.watchdog.get() {
        watchdog.unpark();
    }
    code
}

fn serve_with(mut input: impl Read, out: &Arc<Out>, guard: &Arc<Guard>) -> i32 {
    let watchdog = {
        let (out, guard) = (out.clone(), guard.clone());
        std::thread::Builder::new()
            .name("watchdog".into())
            .spawn(move || watch(&guard, &out))
    };
    let Ok(watchdog) = watchdog else {
        return 1;
    };
    // Known before the first read begins, so that its `at` wakes the watchdog.
    let _ = guard.watchdog.set(watchdog.thread().clone());
    out.send(&Answer::Hello {
        pid: std::process::id(),
        version: VERSION,
    });
    if out.flush().is_err() {
        return 1;
    }
    let mut skip: HashSet<i32> = HashSet::new();
    let mut frames = Frames::default();
    let mut chunk = vec![0u8; 64 << 10];
    loop {
        let n = match input.read(&mut chunk) {
            Ok(0) => return 0,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => return 1,
        };
        frames.push(&chunk[..n]);
        loop {
            match frames.next::<Request>() {
                Ok(Some(req)) => serve_one(req, &mut skip, guard, out),
                Ok(None) => break,
                Err(_) => return 2,
            }
        }
        if out.flush().is_err() {
            return 1;
        }
    }
}

/// A sweep as the reader runs it: skipped pids are not read, every other one is noted
/// for the watchdog first, and each kill is told at once.
struct Visiting<'a> {
    id: u64,
    skip: &'a HashSet<i32>,
    guard: &'a Guard,
    out: &'a Out,
}

impl cookie::Visit for Visiting<'_> {
    fn read(&mut self, pid: i32) -> bool {
        if self.skip.contains(&pid) {
            return false;
        }
        self.guard.at(pid);
        true
    }

    fn killed(&mut self, pid: i32, comm: String) {
        self.out.send(&Answer::Killed {
            id: self.id,
            pid,
            comm,
        });
    }
}

fn serve_one(req: Request, skip: &mut HashSet<i32>, guard: &Guard, out: &Out) {
    let answer = match req {
        Request::Skip(pids) => {
            *skip = pids.into_iter().collect();
            return;
        }
        Request::Sweep { id, me, scope } => {
            guard.begin(id);
            let mut visiting = Visiting {
                id,
                skip,
                guard,
                out,
            };
            let stats = cookie::sweep(&me, &scope, &mut visiting);
            Answer::Swept { id, stats }
        }
        Request::Look { id, pid, input } => {
            guard.begin(id);
            let waiting = waiting::look(pid, input, &mut |p| {
                if skip.contains(&p) {
                    return false;
                }
                guard.at(p);
                true
            });
            Answer::Looked { id, waiting }
        }
        Request::Cookie { id, pid, start } => {
            let read = if skip.contains(&pid) {
                CookieRead::Hung
            } else {
                guard.begin(id);
                guard.at(pid);
                cookie::read_cookie(pid, start)
            };
            Answer::Cookie { id, read }
        }
    };
    guard.idle();
    out.send(&answer);
}

/// The watchdog: a read that has lasted `DEADLINE` is reported once. Should the loop's
/// end of the pipe be gone, the reader ends.
fn watch(guard: &Guard, out: &Out) {
    while !guard.done.load(Ordering::Relaxed) {
        // Between reads the watchdog sleeps until the next one begins: an idle reader
        // wakes nobody (a wake-up that `at` gave before this looked is not lost: `park`
        // returns at once then).
        if guard.pid.load(Ordering::Acquire) == 0 {
            std::thread::park();
            continue;
        }
        std::thread::sleep(TICK);
        let pid = guard.pid.load(Ordering::Acquire);
        if pid == 0 || guard.told.load(Ordering::Relaxed) {
            continue;
        }
        let since = guard.since.load(Ordering::Relaxed);
        if guard.ms().saturating_sub(since) < DEADLINE.as_millis() as u64 {
            continue;
        }
        guard.told.store(true, Ordering::Relaxed);
        let stuck = Answer::Stuck {
            id: guard.req.load(Ordering::Relaxed),
            pid,
            start: cookie::process_start(pid as u32).unwrap_or(0),
        };
        out.send(&stuck);
        if out.flush().is_err() {
            std::process::exit(1);
        }
    }
}

/// Names the process `execd-reader` (its `comm`, what `ps` shows) and makes it
/// undumpable: no core file and no ptrace by its own uid, as its memory holds other
/// processes' environments.
fn name_self() {
    // SAFETY: prctl with a NUL-terminated name of at most 16 bytes, and plain integers.
    unsafe {
        libc::prctl(libc::PR_SET_NAME, NAME.as_ptr(), 0, 0, 0);
        libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn me() -> Instance {
        Instance {
            path: 0x0123_4567_89ab_cdef,
            pid: 4711,
            start: 123_456,
        }
    }

    fn requests() -> Vec<Request> {
        vec![
            Request::Skip(vec![]),
            Request::Skip(vec![1, -2, i32::MAX]),
            Request::Sweep {
                id: 7,
                me: me(),
                scope: Scope {
                    ids: ["term_1".to_string(), "sh_ü".to_string()].into(),
                    every: false,
                    earlier: true,
                },
            },
            Request::Sweep {
                id: u64::MAX,
                me: me(),
                scope: Scope::default(),
            },
            Request::Look {
                id: 1,
                pid: 42,
                input: InputFile {
                    dev: 5,
                    ino: u64::MAX,
                    tty: None,
                },
            },
            Request::Look {
                id: 2,
                pid: 43,
                input: InputFile {
                    dev: 0,
                    ino: 9,
                    tty: Some(0x8802),
                },
            },
            Request::Cookie {
                id: 3,
                pid: 1234,
                start: 99,
            },
        ]
    }

    fn answers() -> Vec<Answer> {
        vec![
            Answer::Hello {
                pid: 77,
                version: VERSION,
            },
            Answer::Killed {
                id: 7,
                pid: 1234,
                comm: "sleep".into(),
            },
            Answer::Swept {
                id: 7,
                stats: SweepStats {
                    read: 1000,
                    passes: 2,
                    spared: 1,
                    micros: 5500,
                    skipped: vec![(55, 66), (77, 88)],
                },
            },
            Answer::Looked {
                id: 1,
                waiting: Some(true),
            },
            Answer::Looked {
                id: 2,
                waiting: Some(false),
            },
            Answer::Looked {
                id: 3,
                waiting: None,
            },
            Answer::Cookie {
                id: 4,
                read: CookieRead::Found(b"0123456789abcdef-1-2:term_1\xff".to_vec()),
            },
            Answer::Cookie {
                id: 5,
                read: CookieRead::Absent,
            },
            Answer::Cookie {
                id: 6,
                read: CookieRead::Gone,
            },
            Answer::Cookie {
                id: 7,
                read: CookieRead::Denied,
            },
            Answer::Cookie {
                id: 8,
                read: CookieRead::Hung,
            },
            Answer::Stuck {
                id: 9,
                pid: 4242,
                start: 31337,
            },
        ]
    }

    /// Every message, encoded one after another and fed back in pieces cut at `cut`,
    /// reads back as written.
    fn round_trip<M: Message + PartialEq + std::fmt::Debug>(messages: &[M], cut: usize) {
        let mut bytes = Vec::new();
        for m in messages {
            m.encode(&mut bytes);
        }
        let mut frames = Frames::default();
        let mut got = Vec::new();
        for piece in bytes.chunks(cut.max(1)) {
            frames.push(piece);
            while let Some(m) = frames.next::<M>().expect("a good frame") {
                got.push(m);
            }
        }
        assert_eq!(got, messages, "cut at {cut}");
    }

    #[test]
    fn the_looks_stay_on_the_loop_only_where_only_an_ancestor_may_attach() {
        assert!(
            looks_off_loop(0, Some("1\n")),
            "root may attach to anything"
        );
        assert!(looks_off_loop(1000, None), "no Yama");
        assert!(looks_off_loop(1000, Some("0\n")));
        assert!(!looks_off_loop(1000, Some("1\n")), "only the daemon may");
        // Nobody may but CAP_SYS_PTRACE: the daemon cannot either; nothing hangs the loop.
        assert!(looks_off_loop(1000, Some("2\n")));
        assert!(looks_off_loop(1000, Some("3\n")));
    }

    #[test]
    fn messages_read_back_as_written_however_the_bytes_arrive() {
        let (reqs, answers) = (requests(), answers());
        let len = |ms: &[Request]| {
            let mut b = Vec::new();
            ms.iter().for_each(|m| m.encode(&mut b));
            b.len()
        };
        for cut in 1..=len(&reqs) + 1 {
            round_trip(&reqs, cut);
        }
        for cut in [1, 2, 3, 4, 5, 7, 13, 64, 4096] {
            round_trip(&answers, cut);
        }
    }

    #[test]
    fn a_frame_that_cannot_be_read_is_an_error_never_a_panic() {
        let bad = |bytes: &[u8]| {
            let mut frames = Frames::default();
            frames.push(bytes);
            frames.next::<Request>()
        };
        // Unknown kind; a length of zero; a length past the largest frame.
        assert!(bad(&[1, 0, 0, 0, 0x7f]).is_err());
        assert!(bad(&[0, 0, 0, 0]).is_err());
        assert!(bad(&((MAX_FRAME as u32 + 1).to_le_bytes())).is_err());
        // A frame whose fields end early, or that has bytes past them.
        let mut b = Vec::new();
        Request::Cookie {
            id: 1,
            pid: 2,
            start: 3,
        }
        .encode(&mut b);
        let mut short = b.clone();
        short[0] -= 1;
        short.pop();
        assert!(bad(&short).is_err());
        let mut long = b.clone();
        long[0] += 1;
        long.push(0);
        assert!(bad(&long).is_err());
        // A list that says it is longer than its frame allocates nothing.
        let mut huge = Vec::new();
        frame(&mut huge, SKIP, |o| put_u32(o, u32::MAX));
        assert!(bad(&huge).is_err());
        // A flag that is neither 0 nor 1; a name that is not UTF-8.
        let mut flag = Vec::new();
        Request::Look {
            id: 1,
            pid: 1,
            input: InputFile {
                dev: 1,
                ino: 1,
                tty: None,
            },
        }
        .encode(&mut flag);
        let at = flag.len() - 9;
        flag[at] = 2;
        assert!(bad(&flag).is_err());
        let mut name = Vec::new();
        frame(&mut name, SWEEP, |o| {
            put_u64(o, 1);
            put_u64(o, 1);
            put_u32(o, 1);
            put_u64(o, 1);
            put_u32(o, 1);
            put_bytes(o, b"\xff");
            o.push(0);
            o.push(0);
        });
        assert!(bad(&name).is_err());
        // Answers are not requests.
        let mut hello = Vec::new();
        answers()[0].encode(&mut hello);
        assert!(bad(&hello).is_err());
        // Half a frame is not an error: the rest may come.
        assert_eq!(bad(&b[..b.len() - 1]), Ok(None));
        // Arbitrary bytes never panic.
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..2000 {
            let mut junk = Vec::new();
            for _ in 0..(seed % 64) {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                junk.push(seed as u8);
            }
            let head = junk.len().min(4);
            junk[..head].fill(0);
            if junk.len() >= 4 {
                junk[0] = (junk.len() - 4) as u8;
            }
            let mut frames = Frames::default();
            frames.push(&junk);
            let _ = frames.next::<Request>();
            let mut frames = Frames::default();
            frames.push(&junk);
            let _ = frames.next::<Answer>();
        }
    }

    /// A shared sink the test reads back.
    #[derive(Clone, Default)]
    struct Sink(Arc<Mutex<Vec<u8>>>);

    impl Write for Sink {
        fn write(&mut self, b: &[u8]) -> io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    /// The reader's loop over real processes: a cookie read pinned by pid and start, a
    /// look at a `cat` blocked on its stdin, a sweep that kills the process carrying a
    /// cookie in scope, and what it is told to skip left unread.
    #[test]
    fn the_reader_answers_each_request_in_order() {
        use std::os::unix::process::ExitStatusExt;
        let me = Instance {
            path: cookie::path_hash(format!("reader-test-{}", std::process::id()).as_bytes()),
            ..me()
        };
        let spawn = |id: &str| {
            std::process::Command::new("sleep")
                .arg("30")
                .env(cookie::VAR, me.cookie(id))
                .spawn()
                .expect("spawn sleep")
        };
        let mut doomed = spawn("cmd_1");
        let mut skipped = spawn("cmd_1");
        let mut cat = std::process::Command::new("cat")
            .stdin(std::process::Stdio::piped())
            .spawn()
            .expect("spawn cat");
        let input = {
            use std::os::fd::AsRawFd;
            InputFile::of_fd(cat.stdin.as_ref().unwrap().as_raw_fd()).unwrap()
        };
        let start = |pid: u32| cookie::process_start(pid).unwrap();
        // Until cat sleeps in its read, a look may find it running.
        let deadline = Instant::now() + Duration::from_secs(10);
        while !std::fs::read_to_string(format!("/proc/{}/syscall", cat.id()))
            .is_ok_and(|s| s.starts_with(&format!("{} ", libc::SYS_read)))
        {
            assert!(Instant::now() < deadline, "cat never blocked in read");
            std::thread::sleep(Duration::from_millis(5));
        }
        let mut bytes = Vec::new();
        let requests = [
            Request::Skip(vec![skipped.id() as i32]),
            Request::Cookie {
                id: 1,
                pid: doomed.id() as i32,
                start: start(doomed.id()),
            },
            Request::Cookie {
                id: 2,
                pid: doomed.id() as i32,
                start: start(doomed.id()) + 1,
            },
            Request::Cookie {
                id: 3,
                pid: cat.id() as i32,
                start: start(cat.id()),
            },
            Request::Cookie {
                id: 4,
                pid: skipped.id() as i32,
                start: start(skipped.id()),
            },
            Request::Look {
                id: 5,
                pid: cat.id() as i32,
                input,
            },
            Request::Look {
                id: 6,
                pid: doomed.id() as i32,
                input,
            },
            Request::Sweep {
                id: 7,
                me,
                scope: Scope {
                    ids: ["cmd_1".to_string()].into(),
                    ..Scope::default()
                },
            },
        ];
        for r in &requests {
            r.encode(&mut bytes);
        }
        let sink = Sink::default();
        assert_eq!(serve_on(&bytes[..], Box::new(sink.clone())), 0);
        let mut frames = Frames::default();
        frames.push(&sink.0.lock().unwrap());
        let mut got = Vec::new();
        while let Some(a) = frames.next::<Answer>().unwrap() {
            got.push(a);
        }
        let cookie_of = |id: &str| CookieRead::Found(me.cookie(id).into_bytes());
        assert!(
            matches!(
                got[0],
                Answer::Hello {
                    version: VERSION,
                    ..
                }
            ),
            "{got:?}"
        );
        assert_eq!(
            got[1..6],
            [
                Answer::Cookie {
                    id: 1,
                    read: cookie_of("cmd_1")
                },
                Answer::Cookie {
                    id: 2,
                    read: CookieRead::Gone
                },
                Answer::Cookie {
                    id: 3,
                    read: CookieRead::Absent
                },
                Answer::Cookie {
                    id: 4,
                    read: CookieRead::Hung
                },
                Answer::Looked {
                    id: 5,
                    waiting: Some(true)
                },
            ]
        );
        assert_eq!(
            got[6],
            Answer::Looked {
                id: 6,
                waiting: Some(false)
            }
        );
        assert_eq!(
            got[7],
            Answer::Killed {
                id: 7,
                pid: doomed.id() as i32,
                comm: "sleep".into()
            }
        );
        let Answer::Swept { id: 7, stats } = &got[8] else {
            panic!("{got:?}");
        };
        assert_eq!(
            stats.skipped,
            vec![(skipped.id() as i32, start(skipped.id()))]
        );
        assert_eq!(got.len(), 9, "{got:?}");
        let status = doomed.wait().unwrap();
        assert_eq!(status.signal(), Some(libc::SIGKILL));
        assert!(
            matches!(skipped.try_wait(), Ok(None)),
            "the skipped one lives"
        );
        for kid in [&mut skipped, &mut cat] {
            let _ = kid.kill();
            let _ = kid.wait();
        }
    }
}
