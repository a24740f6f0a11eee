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
//! `EXECD_TREE` entry is in scope. It never signals pid 1 or below, nor the daemon itself.
//! A process found carrying one is opened as `/proc/PID`, its environment read again
//! through that descriptor, and signalled through it (`pidfd_send_signal`), so a pid
//! reused since the first read is never hit.
//!
//! Sweeps are paid for when a command is killed or released (at the SIGKILL stage after
//! the grace; at once for `bash/kill` with SIGKILL), at shutdown and at start; never per
//! spawn. Several commands killed close together share one sweep. The loop runs a sweep
//! in chunks (`CHUNK_PIDS`, `CHUNK_TIME`) between its other work, and waits as long as
//! the last sweep took before starting the next, so a stream of kills costs at most half
//! of the loop's time. A pass lists /proc once; a process forked after the listing is
//! caught by the next pass, which follows every pass that killed something (at most
//! `MAX_PASSES`) and reads only the pids the sweep has not read yet. The sweep at start
//! runs to its end before the daemon listens.
//!
//! What a cookie cannot catch, and the README says: a process that clears its environment
//! (`env -i`, `sudo` resetting it) or one that changes to a uid execd may not signal. A
//! cookie is an identification, not a proof: a process that sets one itself asks to be
//! treated as that command's (it can only do so for processes it could signal anyway, or
//! programs it starts).

use std::collections::{BTreeSet, HashMap, HashSet};
use std::fmt;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::time::{Duration, Instant};

use crate::types::{SweepScope, Swept};

/// The variable every command's environment carries.
pub const VAR: &str = "EXECD_TREE";

/// Most processes one chunk of a sweep reads before the loop takes its turn.
const CHUNK_PIDS: usize = 256;
/// Longest one chunk of a sweep holds the loop (checked every few processes).
const CHUNK_TIME: Duration = Duration::from_millis(2);
/// Most passes over /proc in one sweep.
const MAX_PASSES: usize = 8;
/// How many killed processes a sweep names in its report.
const SAMPLE: usize = 8;

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
    environ
        .split(|&b| b == 0)
        .find_map(|entry| entry.strip_prefix(VAR.as_bytes())?.strip_prefix(b"="))
}

/// Splits a cookie value into its instance and command id.
pub fn parse_cookie(value: &[u8]) -> Option<(Instance, &[u8])> {
    let colon = value.iter().position(|&b| b == b':')?;
    let id = &value[colon + 1..];
    if id.is_empty() {
        return None;
    }
    Some((Instance::parse(&value[..colon])?, id))
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
    match scope {
        Scope::Commands(ids) if inst == *me => match std::str::from_utf8(id) {
            Ok(id) if ids.contains(id) => Fate::Kill,
            _ => Fate::Leave,
        },
        Scope::Every if inst == *me => Fate::Kill,
        Scope::Earlier if inst.path == me.path && inst != *me => Fate::Earlier(inst),
        _ => Fate::Leave,
    }
}

/// What a sweep looks for (its ids in a set, for lookups).
#[derive(Debug, Clone, PartialEq)]
enum Scope {
    Commands(BTreeSet<String>),
    Every,
    Earlier,
}

impl Scope {
    fn report(&self) -> SweepScope {
        match self {
            Scope::Commands(ids) => SweepScope::Commands(ids.iter().cloned().collect()),
            Scope::Every => SweepScope::Every,
            Scope::Earlier => SweepScope::Earlier,
        }
    }
}

// ---------------------------------------------------------------------------------------
// /proc
// ---------------------------------------------------------------------------------------

/// The start of process `pid` in clock ticks since boot (field 22 of its stat).
fn process_start(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The name (field 2) may hold spaces and parentheses: count from the last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(19)?.parse().ok()
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

// ---------------------------------------------------------------------------------------
// Sweeps
// ---------------------------------------------------------------------------------------

/// One sweep in progress.
#[derive(Debug)]
struct Sweep {
    scope: Scope,
    /// This pass's listing of /proc, and where the pass is in it.
    pids: Vec<i32>,
    next: usize,
    killed_this_pass: usize,
    passes: usize,
    read: usize,
    killed: usize,
    sample: Vec<(i32, String)>,
    spared: usize,
    /// Earlier instances already looked up: whether each one's daemon still runs.
    alive: HashMap<Instance, bool>,
    /// Pids read in this sweep. A later pass reads only the others: a process already
    /// read cannot have gained a cookie since (it would have to exec with one it made
    /// up), and one already killed is dying.
    seen: HashSet<i32>,
    started: Instant,
    /// Time spent reading and killing, without the loop's turns in between.
    busy: Duration,
}

impl Sweep {
    fn new(scope: Scope, now: Instant) -> Sweep {
        Sweep {
            scope,
            pids: list_pids(),
            next: 0,
            killed_this_pass: 0,
            passes: 1,
            read: 0,
            killed: 0,
            sample: Vec::new(),
            spared: 0,
            alive: HashMap::new(),
            seen: HashSet::new(),
            started: now,
            busy: Duration::ZERO,
        }
    }

    /// Reads up to `max` processes (or for `time`); returns whether the sweep is over.
    fn run(&mut self, me: &Instance, buf: &mut Vec<u8>, max: usize, time: Duration) -> bool {
        let t0 = Instant::now();
        let mut done = 0;
        loop {
            if self.next == self.pids.len() {
                if self.killed_this_pass == 0 || self.passes == MAX_PASSES {
                    self.busy += t0.elapsed();
                    return true;
                }
                // Something was killed: what it forked after the listing is looked for
                // in a fresh one, among the pids not read yet.
                let seen = &self.seen;
                self.pids = list_pids()
                    .into_iter()
                    .filter(|p| !seen.contains(p))
                    .collect();
                self.next = 0;
                self.killed_this_pass = 0;
                self.passes += 1;
            }
            let pid = self.pids[self.next];
            self.next += 1;
            self.visit(pid, me, buf);
            done += 1;
            if done >= max || (done % 16 == 0 && t0.elapsed() >= time) {
                self.busy += t0.elapsed();
                return false;
            }
        }
    }

    /// Reads one process's environment; kills it if its cookie is in scope. Most
    /// processes carry no cookie in scope, and cost one open, one read and one close;
    /// one that does is opened again as its `/proc/PID` directory, read again through it
    /// (the same process, or the open fails), and signalled through it.
    fn visit(&mut self, pid: i32, me: &Instance, buf: &mut Vec<u8>) {
        if pid <= 1 || pid as u32 == std::process::id() || !self.seen.insert(pid) {
            return;
        }
        let Ok(path) = std::ffi::CString::new(format!("/proc/{pid}/environ")) else {
            return;
        };
        // EACCES: another user's process, which execd could not signal either; ENOENT:
        // gone.
        let Ok(env) = open_at(libc::AT_FDCWD, &path, 0) else {
            return;
        };
        if read_all(&env, buf).is_err() {
            return;
        }
        drop(env);
        self.read += 1;
        if !self.wanted(me, buf) {
            return;
        }
        let Ok(path) = std::ffi::CString::new(format!("/proc/{pid}")) else {
            return;
        };
        let Ok(dir) = open_at(libc::AT_FDCWD, &path, libc::O_DIRECTORY) else {
            return;
        };
        let still = open_at(dir.as_raw_fd(), c"environ", 0).and_then(|f| read_all(&f, buf));
        if still.is_ok() && self.wanted(me, buf) && kill_process(&dir, pid) {
            self.killed += 1;
            self.killed_this_pass += 1;
            if self.sample.len() < SAMPLE {
                let name = comm(&dir, buf);
                self.sample.push((pid, name));
            }
        }
    }

    /// Whether the environment in `buf` carries a cookie in scope (for an earlier
    /// instance: one whose daemon is gone).
    fn wanted(&mut self, me: &Instance, buf: &[u8]) -> bool {
        let Some(value) = find_cookie(buf) else {
            return false;
        };
        match judge(&self.scope, me, value) {
            Fate::Kill => true,
            Fate::Leave => false,
            Fate::Earlier(inst) => {
                let alive = *self
                    .alive
                    .entry(inst)
                    .or_insert_with(|| process_start(inst.pid) == Some(inst.start));
                if alive {
                    self.spared += 1;
                }
                !alive
            }
        }
    }

    fn report(self) -> Swept {
        Swept {
            scope: self.scope.report(),
            killed: self.killed,
            sample: self.sample,
            spared: self.spared,
            read: self.read,
            passes: self.passes,
            elapsed: self.started.elapsed(),
        }
    }
}

/// Whether a shutdown's sweep of every command was asked for, and done.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
enum Every {
    #[default]
    No,
    Asked,
    Done,
}

/// The sweeps of one daemon run: what is asked, what runs, when the next may start.
#[derive(Debug, Default)]
pub struct Sweeper {
    me: Instance,
    /// Commands killed or released since the last sweep began.
    asked: BTreeSet<String>,
    every: Every,
    current: Option<Sweep>,
    /// A new sweep starts no earlier (as long after the last as that one took).
    not_before: Option<Instant>,
    /// When the loop last ran a chunk or asked for a sweep: a due time in the past.
    stepped: Option<Instant>,
    buf: Vec<u8>,
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
        if self.every != Every::Done {
            self.asked.insert(id.to_string());
            self.stepped.get_or_insert_with(Instant::now);
        }
    }

    /// The daemon stops: everything carrying this instance's cookie goes, once.
    pub fn ask_every(&mut self) {
        if self.every == Every::No {
            self.every = Every::Asked;
            self.stepped.get_or_insert_with(Instant::now);
        }
    }

    /// Whether a sweep runs or waits to.
    pub fn busy(&self) -> bool {
        self.current.is_some() || !self.asked.is_empty() || self.every == Every::Asked
    }

    /// When the loop should run `step` next: None when nothing is asked.
    pub fn due(&self) -> Option<Instant> {
        if self.current.is_some() {
            return self.stepped;
        }
        if !self.busy() {
            return None;
        }
        match (self.not_before, self.stepped) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        }
    }

    /// Starts the next sweep when one is asked and may start.
    fn start(&mut self, now: Instant) -> bool {
        if self.current.is_some() {
            return true;
        }
        if self.not_before.is_some_and(|t| now < t) {
            return false;
        }
        let scope = if self.every == Every::Asked {
            // Every command's cookie covers the ones asked for by name.
            self.every = Every::Done;
            self.asked.clear();
            Scope::Every
        } else if !self.asked.is_empty() {
            Scope::Commands(std::mem::take(&mut self.asked))
        } else {
            return false;
        };
        self.current = Some(Sweep::new(scope, now));
        true
    }

    /// Runs one chunk of the current sweep (starting one if asked and due); returns the
    /// report of a sweep that ended.
    pub fn step(&mut self, now: Instant) -> Option<Swept> {
        self.stepped = Some(now);
        if !self.start(now) {
            return None;
        }
        let sweep = self.current.as_mut()?;
        if !sweep.run(&self.me, &mut self.buf, CHUNK_PIDS, CHUNK_TIME) {
            return None;
        }
        let sweep = self.current.take()?;
        self.not_before = Some(Instant::now() + sweep.busy);
        self.stepped = None;
        if self.busy() {
            self.stepped = Some(now);
        }
        Some(sweep.report())
    }

    /// Runs what is asked to its end now, whatever the time (the daemon is about to exit).
    pub fn finish(&mut self) -> Vec<Swept> {
        self.not_before = None;
        let mut done = Vec::new();
        while self.start(Instant::now()) {
            if let Some(mut sweep) = self.current.take() {
                while !sweep.run(&self.me, &mut self.buf, usize::MAX, Duration::MAX) {}
                done.push(sweep.report());
            }
        }
        self.stepped = None;
        done
    }

    /// At start, before anything is spawned: kills what earlier instances on this socket
    /// left, to the end.
    pub fn sweep_earlier(&mut self) -> Swept {
        let mut sweep = Sweep::new(Scope::Earlier, Instant::now());
        while !sweep.run(&self.me, &mut self.buf, usize::MAX, Duration::MAX) {}
        sweep.report()
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
        let ids = Scope::Commands(["term_3".to_string()].into());
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
        assert_eq!(v(&Scope::Every, &other_cmd), Fate::Kill);
        assert_eq!(
            v(&Scope::Every, &other_socket.cookie("term_3")),
            Fate::Leave
        );
        // At start: earlier instances on this path, never this one, never another path.
        assert_eq!(
            v(&Scope::Earlier, &restarted.cookie("cmd_9")),
            Fate::Earlier(restarted)
        );
        assert_eq!(
            v(&Scope::Earlier, &same_pid_later.cookie("cmd_9")),
            Fate::Earlier(same_pid_later)
        );
        assert_eq!(v(&Scope::Earlier, &ours), Fate::Leave);
        assert_eq!(v(&Scope::Earlier, &other_socket.cookie("x")), Fate::Leave);
        // Whatever does not read as a cookie is left alone.
        for junk in [
            "",
            "term_3",
            "x:term_3",
            &format!("{me}:"),
            &format!("{me}"),
        ] {
            assert_eq!(v(&Scope::Every, junk), Fate::Leave, "{junk:?}");
        }
    }

    #[test]
    fn asked_sweeps_merge_and_every_covers_the_named() {
        let mut s = Sweeper::new(me());
        assert!(!s.busy());
        assert_eq!(s.due(), None);
        s.ask("term_1");
        s.ask("term_2");
        assert!(s.busy());
        assert!(s.due().is_some());
        let now = Instant::now();
        assert!(s.start(now));
        assert_eq!(
            s.current.as_ref().map(|c| c.scope.clone()),
            Some(Scope::Commands(
                ["term_1".to_string(), "term_2".to_string()].into()
            ))
        );
        s.current = None;
        s.ask("term_3");
        s.ask_every();
        assert!(s.start(now));
        assert_eq!(
            s.current.as_ref().map(|c| c.scope.clone()),
            Some(Scope::Every)
        );
        assert!(s.asked.is_empty(), "every command covers term_3");
        s.current = None;
        // After the shutdown's sweep nothing more is asked for.
        s.ask("term_4");
        s.ask_every();
        assert!(!s.busy());
    }

    #[test]
    fn a_sweep_waits_as_long_after_the_last_as_that_one_took() {
        let mut s = Sweeper::new(me());
        let now = Instant::now();
        s.not_before = Some(now + Duration::from_millis(5));
        s.ask("term_1");
        assert_eq!(s.due(), Some(now + Duration::from_millis(5)));
        assert!(s.step(now).is_none(), "not yet");
        assert!(s.current.is_none());
        assert!(s.busy());
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
        let mut s = Sweeper::new(me);
        s.ask("cmd_1");
        let reports = s.finish();
        assert_eq!(reports.len(), 1);
        let r = &reports[0];
        assert_eq!(r.scope, SweepScope::Commands(vec!["cmd_1".into()]));
        assert_eq!(r.killed, 1, "{r:?}");
        assert_eq!(r.sample, vec![(doomed.id() as i32, "sleep".to_string())]);
        assert!(r.passes >= 2, "a pass that killed is followed by another");
        let status = doomed.wait().expect("wait");
        assert_eq!(
            std::os::unix::process::ExitStatusExt::signal(&status),
            Some(libc::SIGKILL)
        );
        assert!(
            matches!(spared.try_wait(), Ok(None)),
            "the other command's lives"
        );
        let _ = spared.kill();
        let _ = spared.wait();
    }
}
