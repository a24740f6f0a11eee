//! The loop's side of the off-loop reader (`sys::reader`): the process that makes every
//! read of another process which may wait for that process's memory lock (a cookie sweep,
//! a process's cookie, a look at a poll or select set), so a process whose memory hangs (a
//! page fault on a dead NFS or FUSE mapping, an `mmap` queued behind it) holds only what
//! asked about it, never the loop.
//!
//! The loop never waits for the reader: requests go into an outbox written as its stdin
//! pipe takes them, answers are read as its stdout pipe has them (both pipes watched
//! like a command's), and each request is answered later, through `take_heard`.
//!
//! Deadlines: the reader reports a read that has lasted `sys::reader::DEADLINE` (500 ms)
//! as stuck on a pid. That pid is remembered as hung (pinned by its start time) for a
//! back-off of 1 s, doubling each time it is found hung again, up to 60 s; the reader is
//! SIGKILLed (it waits killably) and another started at once, told to skip every pid
//! still in its back-off, and sent again every request not answered yet. A cookie read of
//! a hung pid is answered `Hung` at once. Should the reader say nothing for `BACKSTOP`
//! while it owes answers, or die, it is replaced the same way, and the oldest request it
//! owed counts a strike: at the second it is given up (a sweep is asked again later, a
//! look is "not known", a cookie read `Hung`). A reader that dies before it says hello
//! (it cannot be started) is started again after a back-off of 100 ms doubling up to 30 s.
//!
//! API for a read of a process's cookie (the peer checks of PROTOCOL 7.3 use it for the
//! step that needs a process's environment):
//! - `Reader::ask_cookie(pid, start, asker)`: read the `EXECD_TREE` of the process `pid`
//!   whose start time (field 22 of `/proc/PID/stat`, which the caller reads on the loop:
//!   no memory lock) is `start`, and tell `asker` later. Returns at once; never blocks.
//! - The answer comes back, exactly once per ask, as `Heard::Cookie {asker, pid, start,
//!   read}` from `take_heard` (which `server::children` drains after every call into the
//!   reader and routes by `asker`): `read` is `Found(value)`, `Absent`, `Gone` (exited, a
//!   zombie, or the pid names another process now), `Denied` (not ours to read), or
//!   `Hung` (its memory did not answer within the deadline, now or in its back-off).
//! - `Asker` names who asked and carries what it needs to act on the answer (a sweep's
//!   retry, or a connection's peer check, `Asker::Peer(token)`), routed by
//!   `Children::hear`. The core never calls the reader: a check in the core asks through
//!   an `Effect` the loop turns into `ask_cookie`, and hears back through a `Core` method
//!   the loop calls with the `Heard::Cookie`.
//! - Asks do not survive an upgrade in place: the old image's reader is killed before the
//!   `execve` and the new image starts its own. An asker that must hear back carries what
//!   it asked and asks again (as the sweeps carry the processes they still have to read).

use std::collections::{HashMap, VecDeque};
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::time::{Duration, Instant};

use mio::unix::SourceFd;
use mio::{Interest, Registry, Token};

use crate::core::table::Key;
use crate::sys::cookie::{CookieRead, Instance, Scope, SweepStats};
use crate::sys::reader::{self as proto, Answer, Frames, Message, Request};
use crate::sys::spawn::{InFlight, Spawner};
use crate::sys::waiting::InputFile;

/// How long the reader may say nothing while it owes answers before it is replaced (its
/// watchdog reports a stuck read long before; this is for a reader that broke).
const BACKSTOP: Duration = Duration::from_secs(10);
/// The back-off of a pid found hung, first and most.
const HUNG_FIRST: Duration = Duration::from_secs(1);
const HUNG_MOST: Duration = Duration::from_secs(60);
/// A pid whose back-off ended this long ago is forgotten.
const HUNG_FORGET: Duration = Duration::from_secs(120);
/// The wait before starting a reader again after one that could not start, first and most.
const RESTART_FIRST: Duration = Duration::from_millis(100);
const RESTART_MOST: Duration = Duration::from_secs(30);
/// Strikes a request may take (its reader died or went silent while it was the oldest
/// owed) before it is given up.
const STRIKES: u8 = 2;

/// Who asked for a process's cookie, and what it needs to act on the answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Asker {
    /// A cookie sweep that had to skip the process reads it again alone.
    Sweep,
    /// The connection `Token` waits to know whether its peer's cookie ties it to a
    /// command (PROTOCOL 7.3).
    Peer(mio::Token),
    /// A child of the daemon it did not start (an orphan): whose command's tree it is
    /// (`Children::tree_may_remain`).
    Orphan,
}

/// What the reader said (or what became of a request), for `Children::hear`.
#[derive(Debug, Clone, PartialEq)]
pub enum Heard {
    /// The sweep under way SIGKILLed `pid`.
    Killed { pid: i32, comm: String },
    /// The sweep under way ended.
    Swept(SweepStats),
    /// The sweep under way was given up (its readers died twice).
    SweepLost,
    /// A look at `key`'s tree: waiting, not waiting, or not known.
    Looked { key: Key, waiting: Option<bool> },
    /// A cookie read, for `asker`.
    Cookie {
        asker: Asker,
        pid: i32,
        start: u64,
        read: CookieRead,
    },
    /// A read of `pid` outlasted the deadline: the reader was replaced, and `pid` is
    /// skipped for `backoff`.
    Stuck { pid: i32, backoff: Duration },
    /// The reader ended on its own (`why`), or could not be started; another is started
    /// after `again`.
    Ended { why: String, again: Duration },
}

/// A request and what it is for.
#[derive(Debug)]
enum Job {
    Sweep {
        me: Instance,
        scope: Scope,
    },
    Look {
        key: Key,
        pid: i32,
        input: InputFile,
    },
    Cookie {
        pid: i32,
        start: u64,
        asker: Asker,
    },
}

/// A request not answered yet.
#[derive(Debug)]
struct Pending {
    id: u64,
    job: Job,
    strikes: u8,
}

impl Pending {
    fn request(&self) -> Request {
        let id = self.id;
        match &self.job {
            Job::Sweep { me, scope } => Request::Sweep {
                id,
                me: *me,
                scope: scope.clone(),
            },
            Job::Look { pid, input, .. } => Request::Look {
                id,
                pid: *pid,
                input: *input,
            },
            Job::Cookie { pid, start, .. } => Request::Cookie {
                id,
                pid: *pid,
                start: *start,
            },
        }
    }
}

/// The reader that runs.
#[derive(Debug)]
struct Running {
    pid: i32,
    /// Its stdin (requests) and stdout (answers), non-blocking.
    to: File,
    from: File,
    to_token: Token,
    from_token: Token,
    /// `to` is registered for writability (the outbox did not fit in the pipe).
    writable: bool,
    /// Its spawn's report pipe and the memory its child reads until it execs (freed at
    /// its hello).
    report: OwnedFd,
    memory: Option<InFlight>,
    hello: bool,
}

/// A process whose memory did not answer.
#[derive(Debug, Clone, Copy)]
struct Hung {
    start: u64,
    until: Instant,
    backoff: Duration,
}

/// The off-loop reader as the loop holds it; see the module doc.
#[derive(Debug)]
pub struct Reader {
    running: Option<Running>,
    /// Readers killed or ended, not reaped yet, with what their child reads until then.
    retired: HashMap<i32, Option<InFlight>>,
    pending: VecDeque<Pending>,
    /// Requests encoded for the running reader, and how much of them it has.
    outbox: Vec<u8>,
    written: usize,
    frames: Frames,
    next_id: u64,
    hung: HashMap<i32, Hung>,
    /// The skip list the running reader was last sent.
    skip_sent: Vec<i32>,
    /// When the reader last said something (or was first owed something).
    last_heard: Instant,
    /// Readers in a row that died before their hello.
    failures: u32,
    /// No reader runs: when to start one.
    restart_at: Option<Instant>,
    heard: Vec<Heard>,
    scratch: Vec<u8>,
}

impl Default for Reader {
    fn default() -> Reader {
        Reader {
            running: None,
            retired: HashMap::new(),
            pending: VecDeque::new(),
            outbox: Vec::new(),
            written: 0,
            frames: Frames::default(),
            next_id: 1,
            hung: HashMap::new(),
            skip_sent: Vec::new(),
            last_heard: Instant::now(),
            failures: 0,
            restart_at: None,
            heard: Vec::new(),
            scratch: Vec::new(),
        }
    }
}

impl Reader {
    /// The running reader's pid.
    pub fn pid(&self) -> Option<i32> {
        self.running.as_ref().map(|r| r.pid)
    }

    /// Whether `token` is one of the running reader's pipes.
    pub fn owns(&self, token: Token) -> bool {
        self.running
            .as_ref()
            .is_some_and(|r| r.from_token == token || r.to_token == token)
    }

    /// Whether `pid`'s memory did not answer and its back-off runs.
    pub fn hung(&self, pid: i32, now: Instant) -> bool {
        self.hung.get(&pid).is_some_and(|h| now < h.until)
    }

    /// What was heard since the last call.
    pub fn take_heard(&mut self) -> Vec<Heard> {
        std::mem::take(&mut self.heard)
    }

    /// A cookie sweep for instance `me`, answered by `Heard::Killed` as it kills and
    /// `Heard::Swept` (or `SweepLost`) at its end.
    pub fn ask_sweep(&mut self, me: Instance, scope: Scope) {
        self.push(Job::Sweep { me, scope });
    }

    /// Whether a process of `key`'s tree, led by `pid`, waits for `input`: answered by
    /// `Heard::Looked`.
    pub fn ask_look(&mut self, key: Key, pid: i32, input: InputFile) {
        self.push(Job::Look { key, pid, input });
    }

    /// The cookie of the process `pid` that started at `start`, for `asker`: answered by
    /// `Heard::Cookie`, at once (`Hung`) when `pid`'s memory is in its back-off.
    pub fn ask_cookie(&mut self, pid: i32, start: u64, asker: Asker) {
        if self.hung(pid, Instant::now()) {
            self.heard.push(Heard::Cookie {
                asker,
                pid,
                start,
                read: CookieRead::Hung,
            });
            return;
        }
        self.push(Job::Cookie { pid, start, asker });
    }

    fn push(&mut self, job: Job) {
        let p = Pending {
            id: self.next_id,
            job,
            strikes: 0,
        };
        self.next_id += 1;
        if self.pending.is_empty() {
            // Owed nothing until now: silence counts from here.
            self.last_heard = Instant::now();
        }
        if self.running.is_some() {
            self.refresh_skip(Instant::now());
            p.request().encode(&mut self.outbox);
        }
        self.pending.push_back(p);
    }

    /// Sends the running reader the pids to skip, when that list changed.
    fn refresh_skip(&mut self, now: Instant) {
        let mut skip: Vec<i32> = self
            .hung
            .iter()
            .filter(|(_, h)| now < h.until)
            .map(|(&pid, _)| pid)
            .collect();
        skip.sort_unstable();
        if skip != self.skip_sent {
            Request::Skip(skip.clone()).encode(&mut self.outbox);
            self.skip_sent = skip;
        }
    }

    /// When the loop should call `step` next: to start a reader, to give up on a silent
    /// one, or as a back-off ends (a process to read again).
    pub fn due(&self, now: Instant) -> Option<Instant> {
        let start = match &self.running {
            None => Some(self.restart_at.unwrap_or(now)),
            Some(_) if !self.pending.is_empty() => Some(self.last_heard + BACKSTOP),
            Some(_) => None,
        };
        let thaw = self
            .hung
            .values()
            .map(|h| h.until)
            .filter(|&t| t > now)
            .min();
        start.into_iter().chain(thaw).min()
    }

    /// Once a turn: starts a reader when none runs (and its back-off is over), replaces
    /// one silent for `BACKSTOP` while it owes answers, forgets hung pids whose back-off
    /// ended long ago, and writes what the outbox holds.
    pub fn step(
        &mut self,
        spawner: &mut Spawner,
        registry: &Registry,
        next_token: &mut usize,
        now: Instant,
    ) {
        // A pid's back-off is remembered a while after it ended (found hung again, it
        // doubles); one that names another process by then starts over (`stuck`).
        self.hung.retain(|_, h| now < h.until + HUNG_FORGET);
        if self.running.is_some() && !self.pending.is_empty() && now >= self.last_heard + BACKSTOP {
            let why = format!("said nothing for {} s", BACKSTOP.as_secs());
            self.died(registry, now, why);
        }
        if self.running.is_none() && self.restart_at.is_none_or(|t| now >= t) {
            self.start(spawner, registry, next_token, now);
        }
        self.flush(registry, now);
    }

    /// Starts a reader and sends it everything owed.
    fn start(
        &mut self,
        spawner: &mut Spawner,
        registry: &Registry,
        next_token: &mut usize,
        now: Instant,
    ) {
        self.restart_at = None;
        let spawned = match spawner.spawn_reader() {
            Ok(s) => s,
            Err(e) => {
                self.failed_start(now, format!("could not be started: {e}"));
                return;
            }
        };
        let (Some(to), from) = (spawned.ends.stdin, spawned.ends.out) else {
            return;
        };
        let running = Running {
            pid: spawned.pid,
            to: File::from(to),
            from: File::from(from),
            to_token: Token(*next_token + 1),
            from_token: Token(*next_token),
            writable: false,
            report: spawned.report,
            memory: Some(spawned.memory),
            hello: false,
        };
        *next_token += 2;
        self.adopt(running, registry, now);
    }

    /// Watches a reader just started and sends it everything owed.
    fn adopt(&mut self, running: Running, registry: &Registry, now: Instant) {
        let watched = registry.register(
            &mut SourceFd(&running.from.as_raw_fd()),
            running.from_token,
            Interest::READABLE,
        );
        self.running = Some(running);
        if let Err(e) = watched {
            self.died(registry, now, format!("could not be watched: {e}"));
            return;
        }
        self.frames = Frames::default();
        self.outbox.clear();
        self.written = 0;
        self.skip_sent.clear();
        self.refresh_skip(now);
        for p in &self.pending {
            p.request().encode(&mut self.outbox);
        }
        self.last_heard = now;
    }

    /// A start that failed: the next one waits longer.
    fn failed_start(&mut self, now: Instant, why: String) {
        self.failures += 1;
        let again = RESTART_FIRST
            .saturating_mul(1 << (self.failures - 1).min(16))
            .min(RESTART_MOST);
        self.restart_at = Some(now + again);
        self.heard.push(Heard::Ended { why, again });
    }

    /// Writes what the outbox holds, as far as the pipe takes it.
    fn flush(&mut self, registry: &Registry, now: Instant) {
        let Some(r) = self.running.as_mut() else {
            return;
        };
        while self.written < self.outbox.len() {
            match r.to.write(&self.outbox[self.written..]) {
                Ok(n) => self.written += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) => {
                    self.died(registry, now, format!("its stdin: {e}"));
                    return;
                }
            }
        }
        let done = self.written == self.outbox.len();
        if done {
            self.outbox.clear();
            self.written = 0;
        }
        let fd = r.to.as_raw_fd();
        let changed = if !done && !r.writable {
            registry.register(&mut SourceFd(&fd), r.to_token, Interest::WRITABLE)
        } else if done && r.writable {
            registry.deregister(&mut SourceFd(&fd))
        } else {
            return;
        };
        r.writable = !done;
        if let Err(e) = changed {
            self.died(
                registry,
                now,
                format!("its stdin could not be watched: {e}"),
            );
        }
    }

    /// One of the reader's pipes is ready: answers are read, requests written.
    pub fn ready(&mut self, token: Token, registry: &Registry, now: Instant) {
        let Some(r) = self.running.as_mut() else {
            return;
        };
        if token == r.to_token {
            self.flush(registry, now);
            return;
        }
        if self.scratch.len() < 64 << 10 {
            self.scratch.resize(64 << 10, 0);
        }
        loop {
            let Some(r) = self.running.as_mut() else {
                return;
            };
            match r.from.read(&mut self.scratch) {
                Ok(0) => {
                    self.died(registry, now, "closed its stdout".into());
                    return;
                }
                Ok(n) => {
                    self.frames.push(&self.scratch[..n]);
                    if !self.take_answers(registry, now) {
                        return;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) => {
                    self.died(registry, now, format!("its stdout: {e}"));
                    return;
                }
            }
        }
    }

    /// Acts on every whole answer read; false once this reader was let go.
    fn take_answers(&mut self, registry: &Registry, now: Instant) -> bool {
        loop {
            match self.frames.next::<Answer>() {
                Ok(Some(answer)) => {
                    self.last_heard = now;
                    if !self.answer(answer, registry, now) {
                        return false;
                    }
                }
                Ok(None) => return true,
                Err(e) => {
                    self.died(registry, now, format!("wrote a bad frame: {e}"));
                    return false;
                }
            }
        }
    }

    /// Removes and returns the request `id`.
    fn take(&mut self, id: u64) -> Option<Pending> {
        let at = self.pending.iter().position(|p| p.id == id)?;
        self.pending.remove(at)
    }

    /// One answer; false when it let this reader go (a stuck read).
    fn answer(&mut self, answer: Answer, registry: &Registry, now: Instant) -> bool {
        match answer {
            Answer::Hello { version, .. } => {
                if version != proto::VERSION {
                    let why = format!("speaks version {version}, not {}", proto::VERSION);
                    self.died(registry, now, why);
                    return false;
                }
                if let Some(r) = self.running.as_mut() {
                    // It exec'd: what its child read is ours to free.
                    r.hello = true;
                    r.memory = None;
                }
                self.failures = 0;
            }
            Answer::Killed { id, pid, comm } => {
                if self.pending.iter().any(|p| p.id == id) {
                    self.heard.push(Heard::Killed { pid, comm });
                }
            }
            Answer::Swept { id, stats } => {
                if self.take(id).is_some() {
                    self.heard.push(Heard::Swept(stats));
                }
            }
            Answer::Looked { id, waiting } => {
                if let Some(Pending {
                    job: Job::Look { key, .. },
                    ..
                }) = self.take(id)
                {
                    self.heard.push(Heard::Looked { key, waiting });
                }
            }
            Answer::Cookie { id, read } => {
                if let Some(Pending {
                    job: Job::Cookie { pid, start, asker },
                    ..
                }) = self.take(id)
                {
                    if read != CookieRead::Hung {
                        self.hung.remove(&pid);
                    }
                    self.heard.push(Heard::Cookie {
                        asker,
                        pid,
                        start,
                        read,
                    });
                }
            }
            Answer::Stuck { id, pid, start } => {
                self.stuck(id, pid, start, now);
                // It waits killably: SIGKILL gets it out, and another takes over.
                self.retire(registry, false);
                return false;
            }
        }
        true
    }

    /// Request `id` waited too long on `pid`: `pid` is remembered as hung, and a cookie
    /// read of it is answered so; a sweep or a look is sent again, with `pid` skipped.
    fn stuck(&mut self, id: u64, pid: i32, start: u64, now: Instant) {
        let backoff = match self.hung.get(&pid) {
            Some(h) if h.start == start => h.backoff.saturating_mul(2).min(HUNG_MOST),
            _ => HUNG_FIRST,
        };
        self.hung.insert(
            pid,
            Hung {
                start,
                until: now + backoff,
                backoff,
            },
        );
        self.heard.push(Heard::Stuck { pid, backoff });
        let is_cookie = self
            .pending
            .iter()
            .any(|p| p.id == id && matches!(p.job, Job::Cookie { .. }));
        if is_cookie {
            if let Some(Pending {
                job: Job::Cookie { pid, start, asker },
                ..
            }) = self.take(id)
            {
                self.heard.push(Heard::Cookie {
                    asker,
                    pid,
                    start,
                    read: CookieRead::Hung,
                });
            }
        }
    }

    /// Lets the running reader go: SIGKILLed (it may be asleep in a read) unless it was
    /// reaped already (its pid may be another process's now), its pipes closed, kept
    /// among the retired until reaped. The next `step` starts another.
    fn retire(&mut self, registry: &Registry, reaped: bool) {
        let Some(r) = self.running.take() else {
            return;
        };
        let _ = registry.deregister(&mut SourceFd(&r.from.as_raw_fd()));
        if r.writable {
            let _ = registry.deregister(&mut SourceFd(&r.to.as_raw_fd()));
        }
        if !reaped {
            let _ = crate::sys::reap::signal_pid(r.pid as u32, libc::SIGKILL);
            self.retired.insert(r.pid, r.memory);
        }
        self.frames = Frames::default();
        self.outbox.clear();
        self.written = 0;
    }

    /// The running reader died, broke or went silent (`why`): replaced, and the oldest
    /// request it owed takes a strike.
    fn died(&mut self, registry: &Registry, now: Instant, why: String) {
        self.ended(registry, now, why, false);
    }

    /// As `died`, for a reader that may have been reaped already.
    fn ended(&mut self, registry: &Registry, now: Instant, why: String, reaped: bool) {
        let Some(hello) = self.running.as_ref().map(|r| r.hello) else {
            return;
        };
        let report = self
            .running
            .as_ref()
            .and_then(|r| spawn_failure(r.report.as_raw_fd()));
        self.retire(registry, reaped);
        if let Some(head) = self.pending.front_mut() {
            head.strikes += 1;
            if head.strikes >= STRIKES {
                if let Some(p) = self.pending.pop_front() {
                    self.give_up(p);
                }
            }
        }
        if hello {
            self.heard.push(Heard::Ended {
                why,
                again: Duration::ZERO,
            });
        } else {
            self.failed_start(now, report.unwrap_or(why));
        }
    }

    /// A request no reader could answer.
    fn give_up(&mut self, p: Pending) {
        self.heard.push(match p.job {
            Job::Sweep { .. } => Heard::SweepLost,
            Job::Look { key, .. } => Heard::Looked { key, waiting: None },
            Job::Cookie { pid, start, asker } => Heard::Cookie {
                asker,
                pid,
                start,
                read: CookieRead::Hung,
            },
        });
    }

    /// A child was reaped: whether it was a reader (the running one ended, `how`).
    pub fn reaped(&mut self, pid: i32, how: &str, registry: &Registry, now: Instant) -> bool {
        if self.retired.remove(&pid).is_some() {
            return true;
        }
        if self.pid() == Some(pid) {
            self.ended(registry, now, how.to_string(), true);
            return true;
        }
        false
    }

    /// Kills the running reader (the daemon is about to re-execute itself); what it owes
    /// stays owed, for the next reader of this image if the `execve` fails.
    pub fn stop(&mut self, registry: &Registry) {
        self.retire(registry, false);
    }
}

/// What a reader's spawn report says went wrong before its exec, if anything.
fn spawn_failure(report: std::os::fd::RawFd) -> Option<String> {
    match crate::sys::spawn::read_report(report, None) {
        crate::sys::spawn::Report::Failed(_, e) => Some(format!("could not be started: {e}")),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::ExitStatusExt;

    /// A reader stood in for by the test: a `sleep` as its process (so a SIGKILL hits
    /// something of ours), and the far ends of its two pipes.
    struct Stand {
        kid: std::process::Child,
        requests: File,
        answers: File,
    }

    impl Stand {
        fn new(reader: &mut Reader, registry: &Registry, token: usize) -> Stand {
            let pipe = crate::sys::spawn::pipe;
            let ((req_r, req_w), (ans_r, ans_w)) = (pipe().unwrap(), pipe().unwrap());
            crate::sys::spawn::set_nonblocking(req_w.as_raw_fd()).unwrap();
            crate::sys::spawn::set_nonblocking(ans_r.as_raw_fd()).unwrap();
            crate::sys::spawn::set_nonblocking(req_r.as_raw_fd()).unwrap();
            // A report pipe that says nothing: the spawn went well.
            let (report, _) = pipe().unwrap();
            let kid = std::process::Command::new("sleep")
                .arg("30")
                .spawn()
                .unwrap();
            let running = Running {
                pid: kid.id() as i32,
                to: File::from(req_w),
                from: File::from(ans_r),
                to_token: Token(token + 1),
                from_token: Token(token),
                writable: false,
                report,
                memory: None,
                hello: false,
            };
            reader.adopt(running, registry, Instant::now());
            Stand {
                kid,
                requests: File::from(req_r),
                answers: File::from(ans_w),
            }
        }

        /// What the reader was sent since the last call.
        fn sent(&mut self, reader: &mut Reader, registry: &Registry) -> Vec<Request> {
            reader.flush(registry, Instant::now());
            let mut bytes = vec![0u8; 1 << 16];
            let n = self.requests.read(&mut bytes).unwrap_or(0);
            let mut frames = Frames::default();
            frames.push(&bytes[..n]);
            std::iter::from_fn(|| frames.next::<Request>().unwrap()).collect()
        }

        /// The reader says `answers`.
        fn says(&mut self, reader: &mut Reader, registry: &Registry, answers: &[Answer]) {
            let mut bytes = Vec::new();
            answers.iter().for_each(|a| a.encode(&mut bytes));
            self.answers.write_all(&bytes).unwrap();
            let token = reader.running.as_ref().unwrap().from_token;
            reader.ready(token, registry, Instant::now());
        }

        /// The stand-in was SIGKILLed.
        fn killed(mut self) -> bool {
            self.kid.wait().unwrap().signal() == Some(libc::SIGKILL)
        }
    }

    impl Drop for Stand {
        fn drop(&mut self) {
            let _ = self.kid.kill();
            let _ = self.kid.wait();
        }
    }

    /// What is heard once the reader's stdout is seen closed (a process another test
    /// forks meanwhile may hold a copy of its write end until it execs: read again).
    fn ended(r: &mut Reader, registry: &Registry, token: Token) -> Vec<Heard> {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            r.ready(token, registry, Instant::now());
            let heard = r.take_heard();
            if !heard.is_empty() || Instant::now() > deadline {
                return heard;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    fn input() -> InputFile {
        InputFile {
            dev: 1,
            ino: 2,
            tty: None,
        }
    }

    #[test]
    fn answers_reach_their_askers_in_order() {
        let poll = mio::Poll::new().unwrap();
        let registry = poll.registry();
        let mut r = Reader::default();
        // Asked before any reader runs: sent once one does.
        r.ask_look(Key(7), 42, input());
        let mut stand = Stand::new(&mut r, registry, 100);
        r.ask_cookie(43, 9, Asker::Sweep);
        let sent = stand.sent(&mut r, registry);
        assert_eq!(
            sent,
            [
                Request::Look {
                    id: 1,
                    pid: 42,
                    input: input()
                },
                Request::Cookie {
                    id: 2,
                    pid: 43,
                    start: 9
                }
            ]
        );
        stand.says(
            &mut r,
            registry,
            &[
                Answer::Hello {
                    pid: 1,
                    version: proto::VERSION,
                },
                Answer::Looked {
                    id: 1,
                    waiting: Some(true),
                },
                Answer::Cookie {
                    id: 2,
                    read: CookieRead::Absent,
                },
                // An answer to nothing asked is ignored.
                Answer::Looked {
                    id: 99,
                    waiting: Some(true),
                },
            ],
        );
        assert_eq!(
            r.take_heard(),
            [
                Heard::Looked {
                    key: Key(7),
                    waiting: Some(true)
                },
                Heard::Cookie {
                    asker: Asker::Sweep,
                    pid: 43,
                    start: 9,
                    read: CookieRead::Absent
                }
            ]
        );
        assert!(r.pending.is_empty());
        assert_eq!(r.due(Instant::now()), None, "owed nothing, nothing hung");
    }

    /// A read stuck on a pid: that pid is skipped for a back-off that doubles, the reader
    /// is killed, the cookie read of it answered `Hung`, and what else was owed is sent
    /// again to the next reader, after the list of pids to skip.
    #[test]
    fn a_stuck_read_replaces_the_reader_and_skips_the_pid() {
        let poll = mio::Poll::new().unwrap();
        let registry = poll.registry();
        let mut r = Reader::default();
        let mut stand = Stand::new(&mut r, registry, 100);
        let me = Instance::default();
        r.ask_sweep(me, Scope::default());
        r.ask_cookie(55, 7, Asker::Sweep);
        r.ask_look(Key(1), 56, input());
        assert_eq!(stand.sent(&mut r, registry).len(), 3);
        stand.says(
            &mut r,
            registry,
            &[
                Answer::Killed {
                    id: 1,
                    pid: 60,
                    comm: "x".into(),
                },
                Answer::Swept {
                    id: 1,
                    stats: SweepStats::default(),
                },
                Answer::Stuck {
                    id: 2,
                    pid: 55,
                    start: 7,
                },
                // Said after the stuck read by a reader being let go: not heard.
                Answer::Looked {
                    id: 3,
                    waiting: Some(true),
                },
            ],
        );
        assert_eq!(
            r.take_heard(),
            [
                Heard::Killed {
                    pid: 60,
                    comm: "x".into()
                },
                Heard::Swept(SweepStats::default()),
                Heard::Stuck {
                    pid: 55,
                    backoff: HUNG_FIRST
                },
                Heard::Cookie {
                    asker: Asker::Sweep,
                    pid: 55,
                    start: 7,
                    read: CookieRead::Hung
                }
            ]
        );
        assert!(r.running.is_none());
        assert!(stand.killed(), "the stuck reader is SIGKILLed");
        let now = Instant::now();
        assert!(r.hung(55, now));
        assert!(r.due(now).is_some_and(|t| t <= now), "another at once");
        // Asked again while it is in its back-off: answered at once, nothing sent.
        r.ask_cookie(55, 7, Asker::Sweep);
        assert_eq!(
            r.take_heard(),
            [Heard::Cookie {
                asker: Asker::Sweep,
                pid: 55,
                start: 7,
                read: CookieRead::Hung
            }]
        );
        let mut next = Stand::new(&mut r, registry, 200);
        assert_eq!(
            next.sent(&mut r, registry),
            [
                Request::Skip(vec![55]),
                Request::Look {
                    id: 3,
                    pid: 56,
                    input: input()
                }
            ]
        );
        // Stuck on the same process again: twice the back-off.
        next.says(
            &mut r,
            registry,
            &[Answer::Stuck {
                id: 3,
                pid: 55,
                start: 7,
            }],
        );
        assert_eq!(
            r.take_heard(),
            [Heard::Stuck {
                pid: 55,
                backoff: HUNG_FIRST * 2
            }]
        );
        assert_eq!(r.pending.len(), 1, "the look is still owed");
    }

    /// A reader that dies costs the oldest request it owed a strike; at the second that
    /// request is given up.
    #[test]
    fn a_request_two_readers_died_on_is_given_up() {
        let poll = mio::Poll::new().unwrap();
        let registry = poll.registry();
        let mut r = Reader::default();
        r.ask_look(Key(3), 70, input());
        r.ask_cookie(71, 1, Asker::Sweep);
        for round in 0..2 {
            let mut stand = Stand::new(&mut r, registry, 100 + round * 10);
            stand.says(
                &mut r,
                registry,
                &[Answer::Hello {
                    pid: 1,
                    version: proto::VERSION,
                }],
            );
            // Its stdout closes: it died.
            let token = r.running.as_ref().unwrap().from_token;
            drop(std::mem::replace(
                &mut stand.answers,
                File::from(crate::sys::spawn::pipe().unwrap().1),
            ));
            let heard = ended(&mut r, registry, token);
            assert!(
                heard
                    .iter()
                    .any(|h| matches!(h, Heard::Ended { again, .. } if again.is_zero())),
                "started again at once: {heard:?}"
            );
            let given_up = Heard::Looked {
                key: Key(3),
                waiting: None,
            };
            assert_eq!(heard.contains(&given_up), round == 1, "{heard:?}");
        }
        assert_eq!(r.pending.len(), 1, "the cookie read is still owed");
        // A reader that dies before its hello could not start: the next waits.
        let stand = Stand::new(&mut r, registry, 300);
        let token = r.running.as_ref().unwrap().from_token;
        drop(stand);
        assert!(matches!(
            ended(&mut r, registry, token).first(),
            Some(Heard::Ended { again, .. }) if *again == RESTART_FIRST
        ));
        assert!(r.restart_at.is_some());
    }
}
