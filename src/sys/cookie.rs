//! The environment cookie (PROTOCOL.md section 14): how execd finds a command's processes
//! again after they left its process group, or after the daemon that started them died.
//!
//! Every command's environment carries `EXECD_TREE=<instance>:<command id>`, set last by
//! the spawn (after `--clean-env` and the request's variables, which can neither remove
//! nor change it). Descendants inherit it however they detach. `<instance>` is
//! `<path>-<pid>-<start>`: a 64-bit FNV-1a hash of the socket's canonical path (16 hex
//! digits), the daemon's pid, and its start time in clock ticks since boot (field 22 of
//! `/proc/self/stat`). Pid and start time together name one process for the life of the
//! host, so:
//! - a restart on the same socket recognises an earlier instance's cookies (same hash,
//!   another instance) and never another socket's (another hash);
//! - an earlier instance whose daemon still runs (its socket file was replaced under it)
//!   is recognised too, by that pid still having that start time, and left alone;
//! - the running instance never takes its own commands for leftovers; and an image that
//!   re-executes itself in place (PROTOCOL 13) keeps its pid and start time, hence its
//!   instance, and the commands it carries.
//!
//! A sweep reads `/proc/PID/environ` of every process (those execd may not read, EACCES,
//! are skipped: it could not signal them either) and SIGKILLs those whose first
//! `EXECD_TREE` entry is in scope. It never signals pid 1 or below, nor the process
//! sweeping. A process found carrying one is opened as `/proc/PID`, its environment read
//! again through that descriptor, and signalled through it (`pidfd_send_signal`), so a
//! pid reused since the first read is never hit.
//!
//! Reading an environment waits for the process's memory lock, which a process stuck in
//! a page fault on a hung file system can hold for ever; so sweeps run in the off-loop
//! reader (`sys::reader`), never on the loop. This module has both halves:
//! - `sweep` and `read_cookie`, what the reader process runs: a whole sweep over /proc,
//!   or one process's cookie, pinned by its pid and start time. A pid the reader is told
//!   to skip (one whose memory did not answer in time) is not read; the sweep names the
//!   ones it met, with their start times.
//! - `Sweeper`, the loop's bookkeeping: which commands' cookies the next sweep looks for,
//!   when it may start (as long after the last as that one kept the reader busy, so a
//!   stream of kills costs the reader at most half its time), the report it adds up from
//!   what the reader says, and the processes a sweep had to skip: each is asked again
//!   alone (`read_cookie` through the reader) once its back-off is over, and killed from
//!   the loop when its cookie is in the scope that skipped it (`kill_pinned`: a `/proc`
//!   descriptor and its `stat`, no memory lock). Nothing here reads a process's memory on
//!   the loop.
//!
//! Sweeps are paid for when a command is killed or released (at the SIGKILL stage after
//! the grace; at once for `bash/kill` with SIGKILL), at shutdown and at start; never per
//! spawn. Several commands killed close together share one sweep. A pass lists /proc
//! once; a process forked after the listing is caught by the next pass, which follows
//! every pass that killed something (at most `MAX_PASSES`) and reads only the pids the
//! sweep has not read yet. The sweep at start runs while the daemon already serves (what
//! it kills carries an earlier instance's cookie, never a command of this one).
//!
//! What a cookie cannot catch, and the README says: a process that clears its environment
//! (`env -i`, `sudo` resetting it) or one that changes to a uid execd may not signal. A
//! cookie is an identification, not a proof: a process that sets one itself asks to be
//! treated as that command's (it can only do so for processes it could signal anyway, or
//! programs it starts).

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::fmt;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::time::{Duration, Instant};

use crate::types::{SweepScope, Swept};

/// The variable every command's environment carries.
pub const VAR: &str = "EXECD_TREE";
/// The variable beside it that holds its tag (`tag_hex`).
pub const TAG_VAR: &str = "EXECD_TREE_TAG";

/// Most passes over /proc in one sweep.
const MAX_PASSES: usize = 8;
/// How many killed processes a sweep names in its report.
const SAMPLE: usize = 8;
/// How long a sweep the reader could not finish (it failed twice) waits to be asked again.
const LOST_AGAIN: Duration = Duration::from_secs(1);

// ---------------------------------------------------------------------------------------
// The instance and the cookie (pure)
// ---------------------------------------------------------------------------------------

/// One daemon run: which socket path, which process.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Instance {
    /// FNV-1a hash of the socket's canonical path.
    pub path: u64,
    pub pid: u32,
    /// The process's start, in clock ticks since boot.
    pub start: u64,
}

impl fmt::Display for Instance {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:016x}-{}-{}", self.path, self.pid, self.start)
    }
}

impl Instance {
    /// This process serving `socket`.
    pub fn of_self(socket: &Path) -> Instance {
        let pid = std::process::id();
        Instance {
            path: path_hash(&canonical(socket)),
            pid,
            // Without /proc there is nothing to sweep either; the wall clock still keeps
            // two runs apart.
            start: process_start(pid).unwrap_or_else(|| {
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_micros() as u64)
            }),
        }
    }

    /// Reads `<path>-<pid>-<start>`.
    pub fn parse(text: &[u8]) -> Option<Instance> {
        let text = std::str::from_utf8(text).ok()?;
        let mut parts = text.splitn(3, '-');
        let path = parts.next()?;
        if path.len() != 16 {
            return None;
        }
        Some(Instance {
            path: u64::from_str_radix(path, 16).ok()?,
            pid: parts.next()?.parse().ok()?,
            start: parts.next()?.parse().ok()?,
        })
    }

    /// The cookie value for command `id`: `<instance>:<id>`.
    pub fn cookie(&self, id: &str) -> String {
        format!("{self}:{id}")
    }
}

/// The `EXECD_TREE_TAG` value of command `id`: 16 hex digits made from `id` and the
/// daemon's secret (`tag`), set beside its cookie. It is what lets a peer be tied to
/// command `id` by its cookie (PROTOCOL 7.3), which a process can only show by having
/// inherited it.
pub fn tag_hex(secret: &[u8; 32], id: &str) -> String {
    format!("{:016x}", tag(secret, id))
}

/// The tag of command `id`'s cookie: SipHash-2-4 of a domain prefix and `id`, keyed by
/// the second half of the daemon's random secret. Command ids are sequential, so anyone
/// can name one; only a process that inherited a command's environment, may read it (a
/// process of the same uid outside any Landlock domain: every sandboxed spawn is a domain
/// of its own, and `ptrace` access does not cross out of one), or saw it printed, knows
/// its tag. It survives an upgrade in place with the secret.
pub fn tag(secret: &[u8; 32], id: &str) -> u64 {
    let half = |at: usize| {
        let mut k = [0u8; 8];
        k.copy_from_slice(&secret[at..at + 8]);
        u64::from_le_bytes(k)
    };
    let mut msg = Vec::with_capacity(16 + id.len());
    msg.extend_from_slice(b"execd-tree\0");
    msg.extend_from_slice(id.as_bytes());
    siphash24(half(16), half(24), &msg)
}

/// SipHash-2-4 (Aumasson and Bernstein), the keyed pseudo-random function the tag needs:
/// 40 lines, where a crate would bring a dependency for one call (std's keyed SipHasher
/// is deprecated).
fn siphash24(k0: u64, k1: u64, msg: &[u8]) -> u64 {
    let mut v = [
        k0 ^ 0x736f_6d65_7073_6575,
        k1 ^ 0x646f_7261_6e64_6f6d,
        k0 ^ 0x6c79_6765_6e65_7261,
        k1 ^ 0x7465_6462_7974_6573,
    ];
    fn round(v: &mut [u64; 4]) {
        v[0] = v[0].wrapping_add(v[1]);
        v[1] = v[1].rotate_left(13) ^ v[0];
        v[0] = v[0].rotate_left(32);
        v[2] = v[2].wrapping_add(v[3]);
        v[3] = v[3].rotate_left(16) ^ v[2];
        v[0] = v[0].wrapping_add(v[3]);
        v[3] = v[3].rotate_left(21) ^ v[0];
        v[2] = v[2].wrapping_add(v[1]);
        v[1] = v[1].rotate_left(17) ^ v[2];
        v[2] = v[2].rotate_left(32);
    }
    fn compress(m: u64, v: &mut [u64; 4]) {
        v[3] ^= m;
        round(v);
        round(v);
        v[0] ^= m;
    }
    let mut chunks = msg.chunks_exact(8);
    for c in chunks.by_ref() {
        let mut w = [0u8; 8];
        w.copy_from_slice(c);
        compress(u64::from_le_bytes(w), &mut v);
    }
    let rest = chunks.remainder();
    let mut last = [0u8; 8];
    last[..rest.len()].copy_from_slice(rest);
    last[7] = msg.len() as u8;
    compress(u64::from_le_bytes(last), &mut v);
    v[2] ^= 0xff;
    for _ in 0..4 {
        round(&mut v);
    }
    v[0] ^ v[1] ^ v[2] ^ v[3]
}

/// 64-bit FNV-1a: small, stable across builds and platforms, and enough to tell socket
/// paths apart (a collision would only make two sockets' leftovers look alike).
pub fn path_hash(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// The socket's path with symlinks resolved, so two spellings of one socket hash alike;
/// as given (made absolute) when it cannot be resolved.
fn canonical(socket: &Path) -> Vec<u8> {
    let resolved = std::fs::canonicalize(socket)
        .or_else(|_| std::path::absolute(socket))
        .unwrap_or_else(|_| socket.to_path_buf());
    resolved.as_os_str().as_bytes().to_vec()
}

/// The value of the first `EXECD_TREE` entry of an environment block (`NAME=value`
/// entries separated by NUL bytes), the one `getenv` would return.
pub fn find_cookie(environ: &[u8]) -> Option<&[u8]> {
    find_var(environ, VAR)
}

/// The value of the first `name` entry of an environment block.
fn find_var<'a>(environ: &'a [u8], name: &str) -> Option<&'a [u8]> {
    environ
        .split(|&b| b == 0)
        .find_map(|entry| entry.strip_prefix(name.as_bytes())?.strip_prefix(b"="))
}

/// Splits a cookie value into its instance and command id (a tag after the id, as
/// `read_cookie` reports it, is left out: a sweep needs none).
pub fn parse_cookie(value: &[u8]) -> Option<(Instance, &[u8])> {
    parse_tagged(value).map(|(inst, id, _)| (inst, id))
}

/// Splits a cookie value into its instance, command id and tag (none: an untagged
/// cookie, or a tag that is not 16 hex digits).
pub fn parse_tagged(value: &[u8]) -> Option<(Instance, &[u8], Option<u64>)> {
    let colon = value.iter().position(|&b| b == b':')?;
    let rest = &value[colon + 1..];
    // Command ids never hold a colon.
    let (id, tag) = match rest.iter().position(|&b| b == b':') {
        Some(at) => {
            let hex = &rest[at + 1..];
            let tag = (hex.len() == 16)
                .then(|| std::str::from_utf8(hex).ok())
                .flatten()
                .and_then(|h| u64::from_str_radix(h, 16).ok());
            (&rest[..at], tag)
        }
        None => (rest, None),
    };
    if id.is_empty() {
        return None;
    }
    Some((Instance::parse(&value[..colon])?, id, tag))
}

/// The command a cookie ties its process to (PROTOCOL 7.3): its id, when the cookie is
/// of instance `me` and carries the tag `secret` gives that id; else none (another
/// daemon's, an untagged or forged one).
pub fn tied_id<'a>(value: &'a [u8], me: &Instance, secret: &[u8; 32]) -> Option<&'a str> {
    let (inst, id, tag_read) = parse_tagged(value)?;
    let id = std::str::from_utf8(id).ok()?;
    (inst == *me && tag_read? == tag(secret, id)).then_some(id)
}

/// What a sweep does with a process, from its cookie alone.
#[derive(Debug, PartialEq)]
enum Fate {
    Kill,
    Leave,
    /// An earlier instance on this path: killed if its daemon is gone.
    Earlier(Instance),
}

fn judge(scope: &Scope, me: &Instance, value: &[u8]) -> Fate {
    let Some((inst, id)) = parse_cookie(value) else {
        return Fate::Leave;
    };
    if inst == *me {
        let named = std::str::from_utf8(id).is_ok_and(|id| scope.ids.contains(id));
        return if scope.every || named {
            Fate::Kill
        } else {
            Fate::Leave
        };
    }
    if scope.earlier && inst.path == me.path {
        return Fate::Earlier(inst);
    }
    Fate::Leave
}

/// What a sweep looks for: these commands of this instance, every command of it (the
/// daemon stops), and what earlier instances on this socket left (at start). One sweep
/// asks for one of the three; a process a sweep had to skip keeps the union of what every
/// sweep that skipped it asked for.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Scope {
    pub ids: BTreeSet<String>,
    pub every: bool,
    pub earlier: bool,
}

impl Scope {
    fn commands(ids: BTreeSet<String>) -> Scope {
        Scope {
            ids,
            ..Scope::default()
        }
    }

    fn every() -> Scope {
        Scope {
            every: true,
            ..Scope::default()
        }
    }

    fn earlier() -> Scope {
        Scope {
            earlier: true,
            ..Scope::default()
        }
    }

    /// Adds what `other` asks for.
    fn merge(&mut self, other: &Scope) {
        self.every |= other.every;
        self.earlier |= other.earlier;
        if self.every {
            // Every command's cookie covers the ones named.
            self.ids.clear();
        } else {
            self.ids.extend(other.ids.iter().cloned());
        }
    }

    /// How the log and the audit name it: the leftovers of an earlier instance first
    /// (their own record), then every command, then the commands named.
    fn report(&self) -> SweepScope {
        if self.earlier {
            SweepScope::Earlier
        } else if self.every {
            SweepScope::Every
        } else {
            SweepScope::Commands(self.ids.iter().cloned().collect())
        }
    }
}

// ---------------------------------------------------------------------------------------
// /proc
// ---------------------------------------------------------------------------------------

/// The start of process `pid` in clock ticks since boot (field 22 of its stat). Reading
/// `stat` takes no lock of the process's memory.
pub fn process_start(pid: u32) -> Option<u64> {
    let stat = std::fs::read(format!("/proc/{pid}/stat")).ok()?;
    parse_stat(&stat).map(|(_, start)| start)
}

/// The state letter (field 3) and the start (field 22) of a `stat` text. The name (field
/// 2) may hold spaces and parentheses: fields are counted from the last ')'.
fn parse_stat(stat: &[u8]) -> Option<(u8, u64)> {
    let rest = &stat[stat.iter().rposition(|&b| b == b')')? + 1..];
    let rest = std::str::from_utf8(rest).ok()?;
    let mut fields = rest.split_ascii_whitespace();
    let state = *fields.next()?.as_bytes().first()?;
    Some((state, fields.nth(18)?.parse().ok()?))
}

/// Every process id /proc lists now.
fn list_pids() -> Vec<i32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .collect()
}

/// Opens `name` relative to the directory `dir`, read-only and close-on-exec.
fn open_at(dir: libc::c_int, name: &std::ffi::CStr, flags: libc::c_int) -> io::Result<OwnedFd> {
    // SAFETY: a NUL-terminated name and plain flags; `dir` is a directory descriptor or
    // AT_FDCWD.
    let fd = unsafe { libc::openat(dir, name.as_ptr(), flags | libc::O_RDONLY | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: openat succeeded; the descriptor is ours alone.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Reads all of `fd` into `buf` (cleared first).
fn read_all(fd: &OwnedFd, buf: &mut Vec<u8>) -> io::Result<()> {
    buf.clear();
    loop {
        if buf.capacity() - buf.len() < 4096 {
            buf.reserve(buf.capacity().max(16 << 10));
        }
        let spare = buf.capacity() - buf.len();
        // SAFETY: reads at most `spare` bytes into the vector's spare capacity, then
        // counts exactly the bytes the kernel wrote.
        let n = unsafe {
            libc::read(
                fd.as_raw_fd(),
                buf.as_mut_ptr().add(buf.len()).cast(),
                spare,
            )
        };
        match n {
            0 => return Ok(()),
            n if n > 0 => {
                // SAFETY: the kernel initialised `n` more bytes.
                unsafe { buf.set_len(buf.len() + n as usize) };
            }
            _ => {
                let e = io::Error::last_os_error();
                if e.kind() != io::ErrorKind::Interrupted {
                    return Err(e);
                }
            }
        }
    }
}

/// SIGKILL to the process `dir` (its `/proc/PID` directory) is: through the descriptor,
/// which cannot reach a process that reused the pid; by pid on kernels before 5.1.
fn kill_process(dir: &OwnedFd, pid: i32) -> bool {
    // SAFETY: pidfd_send_signal with a /proc/PID directory descriptor, a plain signal
    // number, no siginfo and no flags.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            dir.as_raw_fd(),
            libc::SIGKILL,
            std::ptr::null::<libc::siginfo_t>(),
            0,
        )
    };
    if rc == 0 {
        return true;
    }
    if io::Error::last_os_error().raw_os_error() == Some(libc::ENOSYS) && pid > 1 {
        // SAFETY: kill with a positive pid (never a group or everything).
        return unsafe { libc::kill(pid, libc::SIGKILL) } == 0;
    }
    false
}

/// The command name of the process `dir` is, for the log.
fn comm(dir: &OwnedFd, buf: &mut Vec<u8>) -> String {
    match open_at(dir.as_raw_fd(), c"comm", 0).and_then(|f| read_all(&f, buf)) {
        Ok(()) => String::from_utf8_lossy(buf).trim_end().to_string(),
        Err(_) => String::new(),
    }
}

/// What a read of one process's `EXECD_TREE` found (`read_cookie`, run by the reader).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CookieRead {
    /// Its first `EXECD_TREE` entry holds this value (bytes: a process may set anything).
    Found(Vec<u8>),
    /// Its environment holds no `EXECD_TREE`.
    Absent,
    /// It is gone, a zombie, or the pid names another process now (another start time).
    Gone,
    /// Its environment may not be read (another user's process, for a daemon not root).
    Denied,
    /// Its memory did not answer within the reader's deadline, now or recently: not known.
    Hung,
}

// ---------------------------------------------------------------------------------------
// Sweeps, as the reader runs them
// ---------------------------------------------------------------------------------------

/// What the reader says of one sweep when it ends.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SweepStats {
    /// Environments read, over every pass.
    pub read: u64,
    /// Passes over /proc: another follows each one that killed something.
    pub passes: u32,
    /// Processes of an earlier instance left alone because its daemon still runs.
    pub spared: u64,
    /// Time the sweep took, in microseconds.
    pub micros: u64,
    /// Processes not read because the reader was told to skip them (their memory did not
    /// answer before), with their start times.
    pub skipped: Vec<(i32, u64)>,
}

/// What a sweep asks of whoever runs it, process by process.
pub trait Visit {
    /// Whether to read `pid` (false: it is skipped), asked before anything of it is read.
    fn read(&mut self, pid: i32) -> bool;
    /// `pid`, named `comm`, carried a cookie in scope and was SIGKILLed.
    fn killed(&mut self, pid: i32, comm: String);
}

/// Sweeps every process for cookies in `scope` of instance `me`, SIGKILLing those that
/// carry one, to the end (see the module doc). It runs in the reader, whose loop is its
/// own: a process whose memory hangs holds this call, never the daemon's loop.
pub fn sweep(me: &Instance, scope: &Scope, visit: &mut dyn Visit) -> SweepStats {
    let started = Instant::now();
    let mut s = Sweep {
        me,
        scope,
        buf: Vec::new(),
        stats: SweepStats {
            passes: 1,
            ..SweepStats::default()
        },
        alive: HashMap::new(),
        seen: HashSet::new(),
    };
    let mut pids = list_pids();
    loop {
        let mut killed = 0;
        for pid in pids {
            if s.visit(pid, visit) {
                killed += 1;
            }
        }
        if killed == 0 || s.stats.passes as usize == MAX_PASSES {
            break;
        }
        // Something was killed: what it forked after the listing is looked for in a fresh
        // one, among the pids not read yet.
        let seen = &s.seen;
        pids = list_pids()
            .into_iter()
            .filter(|p| !seen.contains(p))
            .collect();
        s.stats.passes += 1;
    }
    s.stats.micros = started.elapsed().as_micros() as u64;
    s.stats
}

/// One sweep in progress, in the reader.
struct Sweep<'a> {
    me: &'a Instance,
    scope: &'a Scope,
    buf: Vec<u8>,
    stats: SweepStats,
    /// Earlier instances already looked up: whether each one's daemon still runs.
    alive: HashMap<Instance, bool>,
    /// Pids met in this sweep. A later pass reads only the others: a process already
    /// read cannot have gained a cookie since (it would have to exec with one it made
    /// up), and one already killed is dying.
    seen: HashSet<i32>,
}

impl Sweep<'_> {
    /// Reads one process's environment; kills it if its cookie is in scope (returns
    /// whether it did). Most processes carry no cookie in scope, and cost one open, one
    /// read and one close; one that does is opened again as its `/proc/PID` directory,
    /// read again through it (the same process, or the open fails), and signalled
    /// through it.
    fn visit(&mut self, pid: i32, visit: &mut dyn Visit) -> bool {
        if pid <= 1 || pid as u32 == std::process::id() || !self.seen.insert(pid) {
            return false;
        }
        if !visit.read(pid) {
            if let Some(start) = process_start(pid as u32) {
                self.stats.skipped.push((pid, start));
            }
            return false;
        }
        let Ok(path) = std::ffi::CString::new(format!("/proc/{pid}/environ")) else {
            return false;
        };
        // EACCES: another user's process, which execd could not signal either; ENOENT:
        // gone.
        let Ok(env) = open_at(libc::AT_FDCWD, &path, 0) else {
            return false;
        };
        if read_all(&env, &mut self.buf).is_err() {
            return false;
        }
        drop(env);
        self.stats.read += 1;
        if !self.wanted() {
            return false;
        }
        let Ok(path) = std::ffi::CString::new(format!("/proc/{pid}")) else {
            return false;
        };
        let Ok(dir) = open_at(libc::AT_FDCWD, &path, libc::O_DIRECTORY) else {
            return false;
        };
        let still =
            open_at(dir.as_raw_fd(), c"environ", 0).and_then(|f| read_all(&f, &mut self.buf));
        if still.is_ok() && self.wanted() && kill_process(&dir, pid) {
            let name = comm(&dir, &mut self.buf);
            visit.killed(pid, name);
            return true;
        }
        false
    }

    /// Whether the environment in `buf` carries a cookie in scope (for an earlier
    /// instance: one whose daemon is gone).
    fn wanted(&mut self) -> bool {
        let Some(value) = find_cookie(&self.buf) else {
            return false;
        };
        match judge(self.scope, self.me, value) {
            Fate::Kill => true,
            Fate::Leave => false,
            Fate::Earlier(inst) => {
                let alive = *self
                    .alive
                    .entry(inst)
                    .or_insert_with(|| process_start(inst.pid) == Some(inst.start));
                if alive {
                    self.stats.spared += 1;
                }
                !alive
            }
        }
    }
}

/// The cookie of the process that is `pid` and started at `start` (as its `stat` says),
/// for the reader: its `/proc/PID` directory is opened first and everything read through
/// it, so a pid reused meanwhile is `Gone`, never another process's answer.
pub fn read_cookie(pid: i32, start: u64) -> CookieRead {
    let Some(dir) = open_pinned(pid, start) else {
        return CookieRead::Gone;
    };
    let mut buf = Vec::new();
    match open_at(dir.as_raw_fd(), c"environ", 0).and_then(|f| read_all(&f, &mut buf)) {
        // The cookie as the peer check reads it: `<cookie>:<tag>` when it has a tag.
        Ok(()) => match find_cookie(&buf) {
            Some(value) => {
                let mut found = value.to_vec();
                if let Some(tag) = find_var(&buf, TAG_VAR) {
                    found.push(b':');
                    found.extend_from_slice(tag);
                }
                CookieRead::Found(found)
            }
            None => CookieRead::Absent,
        },
        Err(e) if matches!(e.raw_os_error(), Some(libc::EACCES | libc::EPERM)) => {
            CookieRead::Denied
        }
        Err(_) => CookieRead::Gone,
    }
}

/// `/proc/PID` of `pid` while it is the live process that started at `start`: its `stat`
/// is read through the directory, so the descriptor names that process or none. Reading
/// `stat` takes no lock of the process's memory.
fn open_pinned(pid: i32, start: u64) -> Option<OwnedFd> {
    if pid <= 1 {
        return None;
    }
    let path = std::ffi::CString::new(format!("/proc/{pid}")).ok()?;
    let dir = open_at(libc::AT_FDCWD, &path, libc::O_DIRECTORY).ok()?;
    let mut buf = Vec::new();
    open_at(dir.as_raw_fd(), c"stat", 0)
        .and_then(|f| read_all(&f, &mut buf))
        .ok()?;
    match parse_stat(&buf)? {
        (b'Z' | b'X', _) => None,
        (_, s) if s == start => Some(dir),
        _ => None,
    }
}

/// SIGKILL to `pid` while it is the process that started at `start`, through its pinned
/// `/proc/PID` descriptor; its command name when it was signalled. No memory lock is
/// taken, so the loop may call it.
pub fn kill_pinned(pid: i32, start: u64) -> Option<String> {
    if pid as u32 == std::process::id() {
        return None;
    }
    let dir = open_pinned(pid, start)?;
    let mut buf = Vec::new();
    kill_process(&dir, pid).then(|| comm(&dir, &mut buf))
}

// ---------------------------------------------------------------------------------------
// Sweeps, as the loop keeps them
// ---------------------------------------------------------------------------------------

/// The sweep the reader runs: what it asks for, and what the reader said of it so far.
#[derive(Debug)]
struct Current {
    scope: Scope,
    killed: usize,
    sample: Vec<(i32, String)>,
}

/// A process a sweep had to skip (its memory did not answer): its cookie is read again
/// alone, once its back-off is over, for the union of what the sweeps that skipped it
/// asked for.
#[derive(Debug, Clone, PartialEq)]
struct Retry {
    start: u64,
    scope: Scope,
    /// Handed to the reader and not answered yet.
    asked: bool,
}

/// A sweep that happens at most once a run (of every command at shutdown, of earlier
/// instances' leftovers at start): not asked, asked, or done.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub enum Once {
    #[default]
    No,
    Asked,
    Done,
}

impl Once {
    fn name(self) -> &'static str {
        match self {
            Once::No => "no",
            Once::Asked => "asked",
            Once::Done => "done",
        }
    }

    fn named(name: &str) -> Option<Once> {
        match name {
            "no" => Some(Once::No),
            "asked" => Some(Once::Asked),
            "done" => Some(Once::Done),
            _ => None,
        }
    }
}

/// What an upgrade in place carries of the sweeps (`Sweeper::carry`).
#[derive(Debug, Clone, PartialEq)]
pub struct SweepsCarried {
    /// Commands whose cookies the next sweep looks for (those of a sweep under way too:
    /// it starts again in the new image).
    pub asked: Vec<String>,
    /// The sweep of every cookie at shutdown: `no`, `asked` or `done`.
    pub every: &'static str,
    /// The sweep of earlier instances' leftovers is still owed.
    pub earlier: bool,
    /// Processes skipped, to be read again: pid, start, and the scope they are read for.
    pub retries: Vec<(i32, u64, Scope)>,
}

/// The sweeps of one daemon run, as the loop keeps them: what is asked, what the reader
/// runs (one sweep at a time), when the next may start, and what is to be read again.
#[derive(Debug, Default)]
pub struct Sweeper {
    me: Instance,
    /// Commands killed or released since the last sweep began.
    asked: BTreeSet<String>,
    every: Once,
    earlier: Once,
    current: Option<Current>,
    /// A new sweep starts no earlier (as long after the last as that one took).
    not_before: Option<Instant>,
    retries: BTreeMap<i32, Retry>,
}

impl Sweeper {
    pub fn new(me: Instance) -> Sweeper {
        Sweeper {
            me,
            ..Sweeper::default()
        }
    }

    /// This daemon run.
    pub fn instance(&self) -> &Instance {
        &self.me
    }

    /// Command `id` was killed or released: what carries its cookie goes at the next sweep.
    pub fn ask(&mut self, id: &str) {
        if self.every != Once::Done {
            self.asked.insert(id.to_string());
        }
    }

    /// The daemon stops: everything carrying this instance's cookie goes, once.
    pub fn ask_every(&mut self) {
        if self.every == Once::No {
            self.every = Once::Asked;
        }
    }

    /// The daemon starts: what earlier instances on this socket left goes, once.
    pub fn ask_earlier(&mut self) {
        if self.earlier == Once::No {
            self.earlier = Once::Asked;
        }
    }

    /// Whether a sweep runs or waits to (the processes to read again alone are not
    /// waited for: they wait for a file system that may never answer).
    pub fn busy(&self) -> bool {
        self.current.is_some()
            || !self.asked.is_empty()
            || self.every == Once::Asked
            || self.earlier == Once::Asked
    }

    /// When `next` may hand out a sweep: None while one runs or none is asked.
    pub fn due(&self) -> Option<Instant> {
        if self.current.is_some() || !self.busy() {
            return None;
        }
        Some(self.not_before.unwrap_or_else(Instant::now))
    }

    /// The next sweep for the reader, when one is asked and may start: the leftovers of
    /// earlier instances first, then every command (which covers the ones named), then
    /// the commands named.
    pub fn next(&mut self, now: Instant) -> Option<Scope> {
        if self.current.is_some() || self.not_before.is_some_and(|t| now < t) {
            return None;
        }
        let scope = if self.earlier == Once::Asked {
            self.earlier = Once::Done;
            Scope::earlier()
        } else if self.every == Once::Asked {
            self.every = Once::Done;
            self.asked.clear();
            Scope::every()
        } else if !self.asked.is_empty() {
            Scope::commands(std::mem::take(&mut self.asked))
        } else {
            return None;
        };
        self.current = Some(Current {
            scope: scope.clone(),
            killed: 0,
            sample: Vec::new(),
        });
        Some(scope)
    }

    /// The reader killed `pid` in the sweep under way.
    pub fn killed(&mut self, pid: i32, comm: String) {
        if let Some(c) = self.current.as_mut() {
            c.killed += 1;
            if c.sample.len() < SAMPLE {
                c.sample.push((pid, comm));
            }
        }
    }

    /// The sweep under way ended: its report. The processes it skipped are read again
    /// alone later; the next sweep waits as long as this one kept the reader busy.
    pub fn done(&mut self, stats: SweepStats, now: Instant) -> Option<Swept> {
        let c = self.current.take()?;
        let busy = Duration::from_micros(stats.micros);
        self.not_before = Some(now + busy);
        for &(pid, start) in &stats.skipped {
            self.retry(pid, start, &c.scope);
        }
        Some(Swept {
            scope: c.scope.report(),
            killed: c.killed,
            sample: c.sample,
            spared: stats.spared as usize,
            read: stats.read as usize,
            passes: stats.passes as usize,
            elapsed: busy,
            skipped: stats.skipped.iter().map(|&(pid, _)| pid).collect(),
        })
    }

    /// The reader could not finish the sweep under way (it failed twice): the sweep is
    /// asked again a little later. What it killed before is reported.
    pub fn lost(&mut self, now: Instant) -> Option<Swept> {
        let c = self.current.take()?;
        if c.scope.earlier {
            self.earlier = Once::Asked;
        }
        if c.scope.every {
            self.every = Once::Asked;
        }
        self.asked.extend(c.scope.ids.iter().cloned());
        self.not_before = Some(now + LOST_AGAIN);
        (c.killed > 0).then(|| Swept {
            scope: c.scope.report(),
            killed: c.killed,
            sample: c.sample,
            spared: 0,
            read: 0,
            passes: 0,
            elapsed: Duration::ZERO,
            skipped: Vec::new(),
        })
    }

    /// Notes `pid` (started at `start`) for a read of its own, for `scope` too.
    fn retry(&mut self, pid: i32, start: u64, scope: &Scope) {
        let r = self.retries.entry(pid).or_insert_with(|| Retry {
            start,
            scope: Scope::default(),
            asked: false,
        });
        if r.start != start {
            // The pid names another process now: the one skipped is gone.
            *r = Retry {
                start,
                scope: Scope::default(),
                asked: false,
            };
        }
        r.scope.merge(scope);
    }

    /// Processes skipped by a sweep that may be read again now (`hung` says whose memory
    /// is still being waited out): each is handed out once until it is answered.
    pub fn retries_due(&mut self, hung: impl Fn(i32) -> bool) -> Vec<(i32, u64)> {
        let mut due = Vec::new();
        for (&pid, r) in &mut self.retries {
            if !r.asked && !hung(pid) {
                r.asked = true;
                due.push((pid, r.start));
            }
        }
        due
    }

    /// Whether processes skipped by a sweep are still to be read again.
    pub fn retrying(&self) -> bool {
        !self.retries.is_empty()
    }

    /// What the reader found of a process read again alone: killed from here (pinned by
    /// its start) when its cookie is in the scope that skipped it; read again later when
    /// its memory still does not answer; forgotten otherwise.
    pub fn retried(&mut self, pid: i32, start: u64, read: &CookieRead) -> Option<Swept> {
        let r = self.retries.get_mut(&pid).filter(|r| r.start == start)?;
        r.asked = false;
        let CookieRead::Found(value) = read else {
            if *read != CookieRead::Hung {
                self.retries.remove(&pid);
            }
            return None;
        };
        let r = self.retries.remove(&pid)?;
        let mut swept = Swept {
            scope: SweepScope::Earlier,
            killed: 0,
            sample: Vec::new(),
            spared: 0,
            read: 1,
            passes: 1,
            elapsed: Duration::ZERO,
            skipped: Vec::new(),
        };
        match judge(&r.scope, &self.me, value) {
            Fate::Leave => return None,
            Fate::Kill => {
                let (_, id) = parse_cookie(value)?;
                swept.scope = if r.scope.every {
                    SweepScope::Every
                } else {
                    SweepScope::Commands(vec![String::from_utf8_lossy(id).into_owned()])
                };
            }
            Fate::Earlier(inst) => {
                if process_start(inst.pid) == Some(inst.start) {
                    swept.spared = 1;
                    return Some(swept);
                }
            }
        }
        if let Some(comm) = kill_pinned(pid, start) {
            swept.killed = 1;
            swept.sample.push((pid, comm));
        }
        Some(swept)
    }

    /// What an upgrade in place carries: the sweeps asked (one under way included: it
    /// starts again in the new image) and the processes to read again.
    pub fn carry(&self) -> SweepsCarried {
        let mut asked: Vec<String> = self.asked.iter().cloned().collect();
        let (mut every, mut earlier) = (self.every, self.earlier);
        if let Some(c) = &self.current {
            asked.extend(c.scope.ids.iter().cloned());
            if c.scope.every {
                every = Once::Asked;
            }
            if c.scope.earlier {
                earlier = Once::Asked;
            }
        }
        asked.sort();
        asked.dedup();
        SweepsCarried {
            asked,
            every: every.name(),
            earlier: earlier == Once::Asked,
            retries: self
                .retries
                .iter()
                .map(|(&pid, r)| (pid, r.start, r.scope.clone()))
                .collect(),
        }
    }

    /// The sweeps `carry` described, for instance `me`.
    pub fn resume(me: Instance, carried: &SweepsCarried) -> Option<Sweeper> {
        let every = Once::named(carried.every)?;
        Some(Sweeper {
            me,
            asked: carried.asked.iter().cloned().collect(),
            every,
            earlier: if carried.earlier {
                Once::Asked
            } else {
                Once::Done
            },
            retries: carried
                .retries
                .iter()
                .map(|(pid, start, scope)| {
                    let r = Retry {
                        start: *start,
                        scope: scope.clone(),
                        asked: false,
                    };
                    (*pid, r)
                })
                .collect(),
            ..Sweeper::default()
        })
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

    #[test]
    fn an_instance_reads_back_as_written() {
        let i = me();
        assert_eq!(i.to_string(), "0123456789abcdef-4711-123456");
        assert_eq!(Instance::parse(i.to_string().as_bytes()), Some(i));
        assert_eq!(i.cookie("term_3"), "0123456789abcdef-4711-123456:term_3");
        for bad in [
            "",
            "0123456789abcdef-4711",
            "0123456789abcde-4711-1",
            "0123456789abcdeg-4711-1",
            "0123456789abcdef--1",
            "0123456789abcdef-1-x",
        ] {
            assert_eq!(Instance::parse(bad.as_bytes()), None, "{bad:?}");
        }
        // The running daemon's own start is what /proc says it is.
        let own = Instance::of_self(Path::new("/nonexistent/execd.sock"));
        assert_eq!(own.pid, std::process::id());
        assert_eq!(Some(own.start), process_start(own.pid));
    }

    #[test]
    fn siphash_matches_the_reference_vectors() {
        // The paper's key 00..0f; messages 00, 00 01, ... (its appendix A).
        let key = |at: u64| u64::from_le_bytes(std::array::from_fn(|i| (at as u8) + i as u8));
        let (k0, k1) = (key(0), key(8));
        assert_eq!(siphash24(k0, k1, b""), 0x726f_db47_dd0e_0e31);
        let msg: Vec<u8> = (0..15).collect();
        assert_eq!(siphash24(k0, k1, &msg), 0xa129_ca61_49be_45e5);
        // And std's own (deprecated) SipHasher, over lengths around a block.
        for len in 0..40u8 {
            let msg: Vec<u8> = (0..len).map(|b| b.wrapping_mul(37)).collect();
            #[allow(deprecated)]
            let mut std = std::hash::SipHasher::new_with_keys(k0 ^ 5, k1);
            std::hash::Hasher::write(&mut std, &msg);
            assert_eq!(
                siphash24(k0 ^ 5, k1, &msg),
                std::hash::Hasher::finish(&std),
                "{len}"
            );
        }
    }

    #[test]
    fn a_tagged_cookie_ties_only_with_its_own_tag() {
        let (me, secret) = (me(), [7u8; 32]);
        // As `read_cookie` reports a command's: its cookie, a colon, its tag.
        let c = format!("{}:{}", me.cookie("term_3"), tag_hex(&secret, "term_3"));
        assert_eq!(c.len(), "0123456789abcdef-4711-123456:term_3:".len() + 16);
        assert_eq!(tied_id(c.as_bytes(), &me, &secret), Some("term_3"));
        // A sweep reads it as the untagged one.
        assert_eq!(parse_cookie(c.as_bytes()), Some((me, &b"term_3"[..])));
        // Another secret, another instance, another id with this tag, no tag: none.
        assert_eq!(tied_id(c.as_bytes(), &me, &[8u8; 32]), None);
        let other = Instance { start: 1, ..me };
        assert_eq!(tied_id(c.as_bytes(), &other, &secret), None);
        let seen = &c[c.rfind(':').unwrap_or(0)..];
        let forged = format!("{}{seen}", me.cookie("term_4"));
        assert_eq!(tied_id(forged.as_bytes(), &me, &secret), None);
        assert_eq!(tied_id(me.cookie("term_3").as_bytes(), &me, &secret), None);
        assert_eq!(tied_id(format!("{c}0").as_bytes(), &me, &secret), None);
        assert_ne!(tag(&secret, "term_3"), tag(&secret, "term_4"));
    }

    #[test]
    fn the_path_hash_tells_sockets_apart_and_is_stable() {
        assert_eq!(path_hash(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(path_hash(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_ne!(path_hash(b"/run/execd.sock"), path_hash(b"/tmp/execd.sock"));
        // Two spellings of one existing path hash alike.
        let dir = std::env::temp_dir();
        assert_eq!(
            canonical(&dir.join(".").join("x.sock")),
            canonical(&dir.join("x.sock"))
        );
    }

    #[test]
    fn the_first_cookie_of_an_environment_is_the_one() {
        let env = b"A=1\0EXECD_TREEX=no\0EXECD_TREE=first\0EXECD_TREE=second\0";
        assert_eq!(find_cookie(env), Some(&b"first"[..]));
        assert_eq!(find_cookie(b"A=1\0XEXECD_TREE=no\0"), None);
        assert_eq!(find_cookie(b""), None);
        assert_eq!(find_cookie(b"EXECD_TREE="), Some(&b""[..]));
    }

    #[test]
    fn a_sweep_kills_only_what_its_scope_names() {
        let me = me();
        let ids = Scope::commands(["term_3".to_string()].into());
        let ours = me.cookie("term_3");
        let other_cmd = me.cookie("term_4");
        let restarted = Instance { start: 999, ..me };
        let same_pid_later = Instance {
            pid: 4711,
            start: 777,
            ..me
        };
        let other_socket = Instance { path: 1, ..me };
        let v = |s: &Scope, c: &str| judge(s, &me, c.as_bytes());
        assert_eq!(v(&ids, &ours), Fate::Kill);
        assert_eq!(v(&ids, &other_cmd), Fate::Leave);
        assert_eq!(v(&ids, &restarted.cookie("term_3")), Fate::Leave);
        assert_eq!(v(&Scope::every(), &other_cmd), Fate::Kill);
        assert_eq!(
            v(&Scope::every(), &other_socket.cookie("term_3")),
            Fate::Leave
        );
        // At start: earlier instances on this path, never this one, never another path.
        let earlier = Scope::earlier();
        assert_eq!(
            v(&earlier, &restarted.cookie("cmd_9")),
            Fate::Earlier(restarted)
        );
        assert_eq!(
            v(&earlier, &same_pid_later.cookie("cmd_9")),
            Fate::Earlier(same_pid_later)
        );
        assert_eq!(v(&earlier, &ours), Fate::Leave);
        assert_eq!(v(&earlier, &other_socket.cookie("x")), Fate::Leave);
        // A union (what a skipped process is read again for) asks for each part.
        let mut union = ids.clone();
        union.merge(&earlier);
        assert_eq!(v(&union, &ours), Fate::Kill);
        assert_eq!(v(&union, &other_cmd), Fate::Leave);
        assert_eq!(v(&union, &restarted.cookie("x")), Fate::Earlier(restarted));
        union.merge(&Scope::every());
        assert!(union.ids.is_empty(), "every command covers the ones named");
        assert_eq!(v(&union, &other_cmd), Fate::Kill);
        // Whatever does not read as a cookie is left alone.
        for junk in [
            "",
            "term_3",
            "x:term_3",
            &format!("{me}:"),
            &format!("{me}"),
        ] {
            assert_eq!(v(&Scope::every(), junk), Fate::Leave, "{junk:?}");
        }
    }

    #[test]
    fn stat_gives_the_state_and_the_start_whatever_the_name() {
        let stat = b"42 (a b) c)) S 1 42 42 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 98765 1 2";
        assert_eq!(parse_stat(stat), Some((b'S', 98765)));
        assert_eq!(parse_stat(b"42 (x) Z 1"), None);
        assert_eq!(parse_stat(b"no parenthesis"), None);
    }

    #[test]
    fn asked_sweeps_merge_and_every_covers_the_named() {
        let mut s = Sweeper::new(me());
        assert!(!s.busy());
        assert_eq!(s.due(), None);
        s.ask_earlier();
        s.ask("term_1");
        s.ask("term_2");
        assert!(s.busy());
        assert!(s.due().is_some());
        let now = Instant::now();
        // What earlier instances left goes first, in a sweep of its own.
        assert_eq!(s.next(now), Some(Scope::earlier()));
        assert_eq!(s.next(now), None, "one sweep at a time");
        assert_eq!(s.due(), None, "nothing to hand out while one runs");
        let r = s.done(SweepStats::default(), now).unwrap();
        assert_eq!(r.scope, SweepScope::Earlier);
        assert_eq!(
            s.next(now),
            Some(Scope::commands(
                ["term_1".to_string(), "term_2".to_string()].into()
            ))
        );
        s.done(SweepStats::default(), now);
        s.ask("term_3");
        s.ask_every();
        assert_eq!(s.next(now), Some(Scope::every()));
        assert!(s.asked.is_empty(), "every command covers term_3");
        s.done(SweepStats::default(), now);
        // After the shutdown's sweep nothing more is asked for.
        s.ask("term_4");
        s.ask_every();
        s.ask_earlier();
        assert!(!s.busy());
    }

    #[test]
    fn a_sweep_waits_as_long_after_the_last_as_that_one_kept_the_reader() {
        let mut s = Sweeper::new(me());
        let now = Instant::now();
        s.ask("term_1");
        assert!(s.next(now).is_some());
        s.killed(42, "sleep".into());
        let stats = SweepStats {
            read: 100,
            passes: 2,
            micros: 5_000,
            ..SweepStats::default()
        };
        let r = s.done(stats, now).unwrap();
        assert_eq!(
            (r.killed, r.sample.clone(), r.read, r.passes),
            (1, vec![(42, "sleep".to_string())], 100, 2)
        );
        assert_eq!(r.elapsed, Duration::from_millis(5));
        s.ask("term_2");
        assert_eq!(s.due(), Some(now + Duration::from_millis(5)));
        assert_eq!(s.next(now), None, "not yet");
        assert!(s.next(now + Duration::from_millis(5)).is_some());
    }

    #[test]
    fn a_lost_sweep_is_asked_again_with_what_it_killed_reported() {
        let mut s = Sweeper::new(me());
        let now = Instant::now();
        s.ask_every();
        assert_eq!(s.next(now), Some(Scope::every()));
        s.killed(7, "x".into());
        let r = s.lost(now).unwrap();
        assert_eq!((r.scope, r.killed), (SweepScope::Every, 1));
        assert!(s.busy());
        assert_eq!(s.next(now), None, "a little later");
        assert_eq!(s.next(now + LOST_AGAIN), Some(Scope::every()));
    }

    /// A process a sweep skipped is read again alone once its back-off is over, for what
    /// that sweep asked for; read again later while its memory still hangs; forgotten
    /// when it is gone or carries nothing in scope.
    #[test]
    fn a_skipped_process_is_read_again_and_killed_when_in_scope() {
        let me = Instance {
            path: path_hash(format!("retry-{}", std::process::id()).as_bytes()),
            ..me()
        };
        let mut kid = std::process::Command::new("sleep")
            .arg("30")
            .env(VAR, me.cookie("cmd_1"))
            .spawn()
            .expect("spawn sleep");
        let pid = kid.id() as i32;
        let start = process_start(kid.id()).unwrap();
        let mut s = Sweeper::new(me);
        let now = Instant::now();
        s.ask("cmd_1");
        s.next(now);
        let stats = SweepStats {
            skipped: vec![(pid, start), (999_999_999, 5)],
            ..SweepStats::default()
        };
        let r = s.done(stats, now).unwrap();
        assert_eq!(r.skipped, vec![pid, 999_999_999]);
        assert!(s.retrying());
        assert!(!s.busy(), "shutdown does not wait for these");
        // Still hung: not handed out.
        assert!(s.retries_due(|_| true).is_empty());
        let due = s.retries_due(|_| false);
        assert_eq!(due, vec![(pid, start), (999_999_999, 5)]);
        assert!(s.retries_due(|_| false).is_empty(), "each handed out once");
        // Hung again: handed out again later; gone: forgotten.
        assert_eq!(s.retried(pid, start, &CookieRead::Hung), None);
        assert_eq!(s.retried(999_999_999, 5, &CookieRead::Gone), None);
        assert_eq!(s.retries_due(|_| false), vec![(pid, start)]);
        // An answer for another start time is not this process's.
        let found = CookieRead::Found(me.cookie("cmd_1").into_bytes());
        assert_eq!(s.retried(pid, start + 1, &found), None);
        let r = s.retried(pid, start, &found).expect("killed");
        assert_eq!(r.scope, SweepScope::Commands(vec!["cmd_1".into()]));
        assert_eq!(r.sample, vec![(pid, "sleep".to_string())]);
        assert!(!s.retrying());
        let status = kid.wait().unwrap();
        assert_eq!(
            std::os::unix::process::ExitStatusExt::signal(&status),
            Some(libc::SIGKILL)
        );
    }

    #[test]
    fn sweeps_carried_by_an_upgrade_are_the_same_after() {
        let mut s = Sweeper::new(me());
        let now = Instant::now();
        s.ask_earlier();
        s.ask("term_9");
        s.next(now);
        s.retry(55, 66, &Scope::commands(["term_1".to_string()].into()));
        let c = s.carry();
        assert!(c.earlier, "the sweep under way starts again");
        assert_eq!(c.asked, vec!["term_9".to_string()]);
        assert_eq!(c.every, "no");
        assert_eq!(c.retries.len(), 1);
        let back = Sweeper::resume(me(), &c).unwrap();
        assert_eq!(back.carry(), c);
        let mut bad = c.clone();
        bad.every = "sometimes";
        assert!(Sweeper::resume(me(), &bad).is_none());
    }

    /// A real sweep over this host's /proc: a child carrying a cookie in scope is killed,
    /// one carrying another command's is not, and neither is this process.
    #[test]
    fn a_sweep_kills_the_processes_carrying_the_cookie() {
        let me = Instance {
            path: path_hash(format!("test-{}", std::process::id()).as_bytes()),
            ..me()
        };
        let spawn = |id: &str| {
            std::process::Command::new("sleep")
                .arg("30")
                .env(VAR, me.cookie(id))
                .spawn()
                .expect("spawn sleep")
        };
        let mut doomed = spawn("cmd_1");
        let mut spared = spawn("cmd_2");
        struct Killed(Vec<(i32, String)>);
        impl Visit for Killed {
            fn read(&mut self, _: i32) -> bool {
                true
            }
            fn killed(&mut self, pid: i32, comm: String) {
                self.0.push((pid, comm));
            }
        }
        let mut killed = Killed(Vec::new());
        let scope = Scope::commands(["cmd_1".to_string()].into());
        let stats = sweep(&me, &scope, &mut killed);
        assert_eq!(killed.0, vec![(doomed.id() as i32, "sleep".to_string())]);
        assert!(
            stats.passes >= 2,
            "a pass that killed is followed by another"
        );
        assert!(stats.read > 0 && stats.skipped.is_empty(), "{stats:?}");
        let status = doomed.wait().expect("wait");
        assert_eq!(
            std::os::unix::process::ExitStatusExt::signal(&status),
            Some(libc::SIGKILL)
        );
        assert!(
            matches!(spared.try_wait(), Ok(None)),
            "the other command's lives"
        );
        // Read alone, pinned by its start: its cookie; with another start: gone.
        let start = process_start(spared.id()).unwrap();
        assert_eq!(
            read_cookie(spared.id() as i32, start),
            CookieRead::Found(me.cookie("cmd_2").into_bytes())
        );
        assert_eq!(read_cookie(spared.id() as i32, start + 1), CookieRead::Gone);
        assert_eq!(kill_pinned(spared.id() as i32, start + 1), None);
        assert_eq!(
            kill_pinned(spared.id() as i32, start),
            Some("sleep".to_string())
        );
        let _ = spared.wait();
    }
}
