//! Shell sessions in the core (PROTOCOL 12.2): one long-lived interactive bash per session,
//! in a PTY, running the session's command lines one at a time, each found in the
//! terminal's byte stream by markers the shell prints itself.
//!
//! How a line runs:
//! - The bash (`bash --noprofile --norc --noediting -i`) reads its commands from a Unix
//!   socket that only the daemon writes (`Stdio3::Shell`): its end is shut for writing and
//!   cannot be opened again through `/proc/PID/fd`, and bash's saved copies of it are
//!   close-on-exec, so no program a line runs can put a command there. Its terminal is a
//!   PTY whose master the daemon holds. Input for programs (`shell/write`) goes to the
//!   terminal, which the shell never reads commands from, so nothing but a line that
//!   passed the gate can ever run as a command, whatever is typed when.
//! - Once started, the shell is sent a setup line (the daemon's own, not a request's)
//!   that defines the prompt and three read-only functions (`setup_line`). A command
//!   line is then ` \__execd_pre SEQ 'CMD' 'DIR' STRICT PHYS; \__execd_st STATUS &&
//!   \builtin :; \builtin eval -- "$__execd_c" 0<>TTY 1>&0 2>&0` (`command_line`): the
//!   command and its `exec_dir` travel as `\xNN` escapes, so the line holds no character
//!   the shell gives a meaning to and no fragment of it could ever run as something else;
//!   every word in command position is quoted, so no alias applies. `__execd_pre` resets
//!   what would make later words mean more than they say (`set -k`, `set -a`, the command
//!   hash, alias expansion), decodes the command, adds it to history, enters `exec_dir`
//!   and prints the start marker; `__execd_st` gives `$?` the last command's status as
//!   the daemon read it (`false`, then `echo $?` shows 1; `&& :` keeps a failing status
//!   from `set -e` and ERR traps); `eval` runs the command at the top level (so `cd`,
//!   `export`, `declare`, functions persist as if typed) with the terminal, opened afresh
//!   by its `/dev/pts` path, as stdin, stdout and stderr: `tty` names it, and what a line
//!   redirects (`exec >file`) ends with it.
//! - Markers are OSC sequences `ESC ] 6973 ; KIND ; NONCE [; FIELD...] BEL`, written to
//!   `/dev/tty`. Text replies strip every escape sequence, so they are never shown. The
//!   nonce is random per shell and lives only in a read-only shell variable and the
//!   prompt: a program printing a marker cannot know it, so it cannot end its command
//!   early or fake an exit code. (A line that expands it itself can; that is its owner's
//!   own line, and it only misleads its own session.) Kinds: `s;N;SEQ` the command
//!   started, `e;N;STATUS;HEXDIR` a command ended (PROMPT_COMMAND, before each prompt: `$?`
//!   and `$PWD`), `p;N` the prompt is shown (the end of PS1), `x;N` `exec_dir` is missing
//!   and `strict` was asked.
//! - Where the shell is comes from the kernel, never from a marker: at each end marker
//!   the loop reads `/proc/PID/cwd` (`Effect::ShellDir`; the marker's `$PWD` is taken
//!   instead only when symlinks are kept and it names the same directory), and no line is
//!   sent until that is known. At each prompt the terminal's unread input is discarded
//!   (`Effect::DiscardInput`).
//!
//! A session's shell: spawning (being started) -> starting (setup sent, first prompt
//! awaited) -> at the prompt <-> busy; back to spawning when it dies (restarted in the
//! session's last directory); failed when it cannot be started.
//! A record (one `exec`): queued (no prompt yet) -> sent (written to the channel) -> running
//! (start marker) -> done (end marker, the shell's death, or it never ran).
//!
//! Invariants:
//! - At most one record of a session is not done, and it is the newest.
//! - Input for a program reaches the terminal only while its record runs (after the start
//!   marker): before, the shell may still be reading the line, and a Ctrl-C then would
//!   cut it; after the end marker, what was not delivered is dropped, never left for the
//!   next program.
//! - The console keeps at most `CONSOLE_RECORDS` records; its memory (command lines and
//!   prompts) counts against `--max-output-memory`, and its output is read from the
//!   shells' rings (an exited shell is kept while a record refers to it).

use std::collections::{HashMap, VecDeque};
use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime};

use serde_json::json;

use super::launch::{LaunchRequest, Origin};
use super::table::{Key, KillReason, Peer, Proc, SessionKey};
use super::timers::TimerId;
use super::vocab::{LineOpts, ShellExec, ShellThen, ShellWait, Via};
use super::{Core, Effect, Timer};
use crate::types::{Ended, WinSize};
use crate::wire::rpc::RpcError;

pub mod carry;
pub mod editor;
pub mod follow;
mod markers;
pub mod watch;
use markers::nonce;
pub use markers::{command_line, setup_line, Marker, Scanner};

/// Records a session's console keeps, oldest dropped first.
pub const CONSOLE_RECORDS: usize = 32;
/// `no_change_timeout` when neither the request nor the session names one.
pub const DEFAULT_NO_CHANGE: Duration = Duration::from_secs(30);
/// Where `output` is cut when `truncate` (the default) is asked: characters kept.
pub const TRUNCATE_AT: usize = 30_000;
/// The longest prompt text kept for a record (`ps1`).
const PS1_MAX: usize = 256;
/// Bytes a record's bookkeeping counts besides its command line and prompt.
const RECORD_BYTES: usize = 256;
/// How soon a shell's terminal is looked at again after a SIGINT it may have held
/// (`Core::shell_interrupted`); each later look waits twice as long, up to 64 times this.
const SIGINT_LOOK: Duration = Duration::from_millis(2);
/// A shell that dies this many times in a row before its first prompt is not started
/// again: the session is failed.
const STARTS_BEFORE_FAILING: u32 = 2;
/// How a session counts as active in its stats: used within this long.
pub const ACTIVE_WITHIN: Duration = Duration::from_secs(300);

/// Where a session's shell is.
#[derive(Debug, Clone, PartialEq)]
pub enum Phase {
    /// Its bash is being started.
    Spawning,
    /// Started and sent its setup; the first prompt is awaited.
    Starting,
    /// At the prompt: a line may be sent.
    Prompt,
    /// A line was sent; the next prompt is awaited.
    Busy,
    /// It could not be started; the reason.
    Failed(String),
}

/// How a command ended (the API's statuses besides `running`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ending {
    Completed,
    /// Killed (`shell/kill`), or its shell died under it (`exit`, a signal).
    Terminated,
    /// Killed at its `hard_timeout`.
    HardTimeout,
}

impl Ending {
    pub fn as_str(self) -> &'static str {
        match self {
            Ending::Completed => "completed",
            Ending::Terminated => "terminated",
            Ending::HardTimeout => "hard_timeout",
        }
    }
}

/// Where a record is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecordStep {
    /// Waits for the shell's prompt.
    Queued,
    /// Written to the shell; its start marker is awaited.
    Sent,
    /// Started: its output is being written.
    Running,
    Done(Ending),
}

/// Whether a request waiting on command `seq` of `s` for `what` may be answered now.
pub fn wait_over(s: &ShellSession, seq: u64, what: ShellWait) -> bool {
    let Some(r) = s.record(seq) else {
        return true; // dropped from the console: long over
    };
    r.done() || (matches!(what, ShellWait::Exec { .. }) && (r.quiet || r.waiting_for_input))
}

/// One command of a session (a console record).
#[derive(Debug)]
pub struct Record {
    pub seq: u64,
    /// Its public id, as approvers and the audit log name it.
    pub id: String,
    pub peer: Peer,
    /// How the gate let it through (`allow`, `approve`, ...) and the rule that decided,
    /// for its audit `start` record.
    pub admitted: (&'static str, String),
    /// The prompt it was typed at.
    pub ps1: String,
    pub command: String,
    pub opts: LineOpts,
    /// The shell it ran in, whose ring holds its output.
    pub shell: Option<Key>,
    /// Its output's first byte in that ring (after the start marker), and the end marker.
    pub from: Option<u64>,
    pub to: Option<u64>,
    pub step: RecordStep,
    pub exit_code: Option<i32>,
    /// A kill asked for (`shell/kill`, `hard_timeout`): how it is to be reported.
    pub kill: Option<Ending>,
    /// The kill went past SIGINT: the shell is being ended.
    pub escalated: bool,
    /// The process group the kill's SIGINT went to last (`Core::shell_interrupted`).
    pub sigint_to: Option<i32>,
    /// How many times its terminal's foreground was looked at for the kill.
    pub sigint_looks: u32,
    pub created: Instant,
    /// When output last arrived while it was current.
    pub last_change: Instant,
    /// Its `no_change_timeout`, armed for a synchronous `exec`.
    pub quiet_after: Option<Duration>,
    /// No output for `quiet_after`: a synchronous `exec` answers `no_change_timeout`.
    pub quiet: bool,
    /// Waiting for input (PROTOCOL 12.3; `Core::input_wanted`).
    pub waiting_for_input: bool,
    /// `exec_dir` did not exist under `strict`: answered `-32602`.
    pub no_dir: bool,
    /// What execd adds to its output (the shell died under it).
    pub note: Option<String>,
    /// Said in its `exec` answer: its session had been closed by the daemon and was made
    /// again for it (PROTOCOL 8).
    pub notice: Option<String>,
    /// Input written before it started (`shell/write`): its terminal gets it at the start
    /// marker. At most `--stdin-buffer`.
    pub input: Vec<u8>,
    /// Its timers (hard timeout, quiet, kill escalation), cancelled when it ends.
    pub timers: Vec<TimerId>,
    /// Bytes counted against the output memory budget.
    pub bytes: usize,
    /// The front door its line came through (`ws`: typed by a person at the prompt).
    pub via: Via,
}

impl Record {
    pub fn done(&self) -> bool {
        matches!(self.step, RecordStep::Done(_))
    }

    /// The API's status word.
    pub fn status(&self) -> &'static str {
        match self.step {
            RecordStep::Done(e) => e.as_str(),
            _ => "running",
        }
    }
}

/// A shell session.
#[derive(Debug)]
pub struct ShellSession {
    pub id: String,
    pub owner: u32,
    /// The shell's directory at its last prompt, as the kernel says (`/proc/PID/cwd`, or
    /// the logical `$PWD` when symlinks are kept and it is the same directory): what
    /// approvers and the audit see, and where a restart starts.
    pub workdir: PathBuf,
    /// The shell's directory is being read (an end marker came; `shell_dir` ends it): no
    /// line is sent until it is known.
    pub dir_pending: bool,
    /// The exit status of the last command, from the last end marker: what `$?` says
    /// when the next line starts.
    pub last_status: i32,
    pub created_wall: SystemTime,
    pub created: Instant,
    pub last_used: Instant,
    pub last_used_wall: SystemTime,
    pub no_change_timeout: Duration,
    pub keep_symlinks: bool,
    /// Its terminal's window size (`shell/resize`): a shell started again gets it too.
    pub size: WinSize,
    /// The shell now (none while one is being started).
    pub shell: Option<Key>,
    pub phase: Phase,
    pub nonce: String,
    scan: Scanner,
    /// Where the text of the prompt being shown begins (after the last end marker).
    prompt_from: Option<u64>,
    /// The prompt last shown.
    pub ps1: String,
    pub records: VecDeque<Record>,
    /// Shells started after the first one died, and the last death in words.
    pub restarts: u64,
    pub notice: Option<String>,
    /// Deaths before a first prompt, in a row.
    failed_starts: u32,
    /// Who asked for it and whence: restarts run its shell as the first one ran.
    pub peer: Peer,
    pub origin: Option<Origin>,
    /// Its sandbox, fixed when it was made and kept across restarts and upgrades: its
    /// shell and every line typed into it run in it (PROTOCOL 16).
    pub sandbox: Option<crate::policy::sandbox::Given>,
    pub idle_timer: Option<TimerId>,
    /// Requests parked on it.
    pub waiters: Vec<super::table::ParkId>,
    /// Its shells that died, kept while a record's output is in their rings.
    pub old: Vec<Key>,
    /// Made by an `exec` that named no session, and never named since: it may be closed
    /// to make room, and is idle after a sixth of `--session-idle` (PROTOCOL 8).
    pub oneshot: bool,
    /// The daemon had closed a session of this name and this one was made again in its
    /// place: what the call that made it answers, taken once.
    pub reopened: Option<String>,
}

impl ShellSession {
    /// The record not done yet, if any (always the newest).
    pub fn current(&self) -> Option<&Record> {
        self.records.back().filter(|r| !r.done())
    }

    pub fn current_mut(&mut self) -> Option<&mut Record> {
        self.records.back_mut().filter(|r| !r.done())
    }

    pub fn record(&self, seq: u64) -> Option<&Record> {
        self.records.iter().rev().find(|r| r.seq == seq)
    }

    fn record_mut(&mut self, seq: u64) -> Option<&mut Record> {
        self.records.iter_mut().rev().find(|r| r.seq == seq)
    }

    /// Whether a command runs (or waits to).
    pub fn busy(&self) -> bool {
        self.current().is_some()
    }
}

/// Every shell session, and what makes their names and nonces.
#[derive(Debug, Default)]
pub struct Shells {
    pub map: HashMap<SessionKey, ShellSession>,
    next_id: u64,
    next_seq: u64,
    nonces: u64,
    /// The daemon's random secret (the loop sets it at start, an upgrade carries it):
    /// shell nonces are made from it, and so are the tags of commands' cookies
    /// (`sys::cookie::tag`).
    pub secret: [u8; 32],
    /// The people watching sessions, by session (PROTOCOL 12.5; `watch`).
    pub people: HashMap<SessionKey, watch::Desk>,
    /// Requests that stream a command's lines as server-sent events (`follow`).
    pub follows: Vec<follow::Follow>,
}

impl Shells {
    /// A fresh session name (`shell_N`) that `owner` does not use.
    pub fn new_id(&mut self, owner: u32) -> String {
        loop {
            self.next_id += 1;
            let id = format!("shell_{}", self.next_id);
            if !self.map.contains_key(&(owner, id.clone())) {
                return id;
            }
        }
    }

    fn nonce(&mut self) -> String {
        self.nonces += 1;
        nonce(&self.secret, self.nonces)
    }

    /// Sessions of `owner`.
    pub fn of(&self, owner: u32) -> impl Iterator<Item = &ShellSession> {
        self.map.values().filter(move |s| s.owner == owner)
    }
}

/// The session a shell (a `Family::Shell` process) belongs to.
pub fn session_of(p: &Proc) -> Option<SessionKey> {
    match &p.family {
        crate::core::table::Family::Shell { session_id } => Some((p.owner, session_id.clone())),
        _ => None,
    }
}

/// `text` cut to at most `max` bytes at a character boundary.
fn cut(text: &str, max: usize) -> String {
    let mut end = text.len().min(max);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].to_string()
}

/// The arguments a session's bash runs with: no profile or rc file (the user's could
/// change the prompt the markers live in), no line editing (commands come from a pipe,
/// and readline would echo them), interactive (prompts, job control, history).
pub const SHELL_ARGS: [&str; 4] = ["--noprofile", "--norc", "--noediting", "-i"];

impl Core {
    /// The program a session's shell is: `--shell` when it is a bash, else `bash` from
    /// PATH (the markers need bash's PROMPT_COMMAND and `printf -v`).
    pub fn shell_program(&self) -> String {
        let shell = &self.cfg.shell;
        if shell.file_name().is_some_and(|n| n == "bash") {
            shell.display().to_string()
        } else {
            "bash".into()
        }
    }

    /// What starts the shell of session `key` (in its last directory, as its first shell
    /// ran), then does `then`.
    pub fn shell_launch(&self, key: &SessionKey, then: ShellThen) -> Option<LaunchRequest> {
        let s = self.shells.map.get(key)?;
        let program = self.shell_program();
        let args: Vec<String> = SHELL_ARGS.iter().map(|a| a.to_string()).collect();
        // No prompt before the setup (so the terminal shows only the session's own), and
        // nothing of the daemon's environment runs before it.
        let mut env = vec![
            ("PS1".to_string(), String::new()),
            ("PROMPT_COMMAND".to_string(), String::new()),
        ];
        super::launch::default_term(&mut env);
        Some(LaunchRequest {
            family: super::table::Family::Shell {
                session_id: key.1.clone(),
            },
            peer: s.peer,
            program: crate::types::Program::Direct {
                program: program.clone(),
                args: args.clone(),
            },
            command: program,
            args,
            env,
            cwd: s.workdir.clone(),
            cwd_field: "exec_dir",
            stdio: crate::types::Stdio3::Shell(s.size),
            ring_capacity: self.cfg.output_limit,
            prefix: "sh",
            subscribe: None,
            kill_on_disconnect: None,
            limits: self.cfg.limits,
            after: super::vocab::After::ShellStart(then),
            admitted: None,
            origin: s.origin.clone(),
            sandbox_asked: None,
            sandbox: s.sandbox.clone(),
            ceiling: None,
            via: Default::default(),
        })
    }

    /// Forgets a session made for a request whose shell never started: nothing ran in it.
    pub fn forget_shell(&mut self, key: &SessionKey) {
        self.people_gone(key);
        let Some(s) = self.shells.map.remove(key) else {
            return;
        };
        if let Some(t) = s.idle_timer {
            self.timers.cancel(t);
        }
        let bytes: usize = s.records.iter().map(|r| r.bytes).sum();
        self.table.memory.sub(key.0, bytes);
        for r in &s.records {
            for t in &r.timers {
                self.timers.cancel(*t);
            }
        }
        for id in &s.waiters {
            self.resolve(*id, true);
        }
    }

    /// A new shell session of `owner` named `id`, in `dir`, its shell not started yet
    /// (`oneshot`: the request named none). Makes room at `--max-sessions` as bash
    /// sessions do (PROTOCOL 12.2: the two share the count). A name the daemon closed
    /// keeps the notice for the call that made it again (`reopened`).
    pub fn open_shell(
        &mut self,
        owner: u32,
        (id, oneshot): (&str, bool),
        dir: PathBuf,
        peer: Peer,
        (no_change_timeout, keep_symlinks): (Option<Duration>, bool),
    ) -> Result<SessionKey, RpcError> {
        let key = (owner, id.to_string());
        if self.shells.map.contains_key(&key) {
            return Ok(key);
        }
        self.room_for_session(owner)?;
        let reopened = self.closed.take(owner, true, id).map(|c| {
            self.log.line(format_args!(
                "shell session {id:?} of uid {owner} made again ({})",
                c.by.words()
            ));
            c.reopened()
        });
        let idle = if oneshot {
            super::sessions::oneshot_idle(self.cfg.session_idle)
        } else {
            self.cfg.session_idle
        };
        let t = self
            .timers
            .add(self.now + idle, Timer::ShellIdle(key.clone()));
        self.shells.map.insert(
            key.clone(),
            ShellSession {
                id: id.to_string(),
                owner,
                workdir: dir,
                dir_pending: false,
                last_status: 0,
                created_wall: self.wall,
                created: self.now,
                last_used: self.now,
                last_used_wall: self.wall,
                no_change_timeout: no_change_timeout.unwrap_or(DEFAULT_NO_CHANGE),
                keep_symlinks,
                size: WinSize::DEFAULT,
                shell: None,
                phase: Phase::Spawning,
                nonce: String::new(),
                scan: Scanner::default(),
                prompt_from: None,
                ps1: String::new(),
                records: VecDeque::new(),
                restarts: 0,
                notice: None,
                failed_starts: 0,
                peer,
                origin: None,
                sandbox: None,
                idle_timer: Some(t),
                waiters: Vec::new(),
                old: Vec::new(),
                oneshot,
                reopened,
            },
        );
        self.log
            .debug(format_args!("shell session {id:?} of uid {owner} opened"));
        Ok(key)
    }

    /// A request named shell session `key`: it counts as use, and the session is a named
    /// one from now on (never closed to make room, PROTOCOL 8).
    pub fn name_shell(&mut self, key: &SessionKey) {
        if let Some(s) = self.shells.map.get_mut(key) {
            s.oneshot = false;
        }
        self.touch_shell(key);
    }

    /// Counts a request on a shell session as use.
    pub fn touch_shell(&mut self, key: &SessionKey) {
        if let Some(s) = self.shells.map.get_mut(key) {
            s.last_used = self.now;
            s.last_used_wall = self.wall;
        }
    }

    /// The shell of session `key` was started as process `shell`: it is sent its setup,
    /// and what was queued waits for its first prompt.
    pub fn shell_started(&mut self, key: &SessionKey, shell: Key, origin: Option<Origin>) {
        let nonce = self.shells.nonce();
        let Some(s) = self.shells.map.get_mut(key) else {
            return;
        };
        s.shell = Some(shell);
        s.phase = Phase::Starting;
        s.scan = Scanner::default();
        s.prompt_from = None;
        s.nonce = nonce;
        s.dir_pending = false;
        s.last_status = 0;
        if origin.is_some() {
            s.origin = origin;
        }
        let line = setup_line(&s.nonce, &s.workdir, s.keep_symlinks);
        if let Some(r) = s.current_mut() {
            r.shell = Some(shell);
        }
        self.people_new_shell(key);
        self.send_to_shell(shell, &line);
    }

    /// The loop opened the terminal of command `key` (a shell's) at `path`: its command
    /// lines open it for each command.
    pub fn tty_path(&mut self, key: Key, path: PathBuf) {
        if let Some(t) = self.table.get_mut(key).and_then(|p| p.tty.as_mut()) {
            t.path = Some(path);
        }
    }

    /// Queues `line` for the command channel of `shell` (sized for the longest line).
    fn send_to_shell(&mut self, shell: Key, line: &[u8]) {
        let Some(c) = self.table.get_mut(shell).and_then(|p| p.commands.as_mut()) else {
            return;
        };
        if !c.open {
            return;
        }
        c.buf.extend(line);
        self.out.push(Effect::FlushCommands(shell));
    }

    /// Adds command `command` to the session as its current record (queued), counting its
    /// memory. The caller has checked that nothing else runs there.
    pub fn shell_queue(
        &mut self,
        key: &SessionKey,
        (id, peer, admitted, via): (String, Peer, (&'static str, String), Via),
        command: &str,
        opts: LineOpts,
    ) -> Result<u64, RpcError> {
        let ps1 = self.shells.map.get(key).map_or(0, |s| s.ps1.len());
        let bytes = RECORD_BYTES + command.len() + ps1;
        self.room_for_record(key.0, bytes)?;
        self.shells.next_seq += 1;
        let seq = self.shells.next_seq;
        let now = self.now;
        let Some(s) = self.shells.map.get_mut(key) else {
            return Err(RpcError::not_found("shell session", &key.1));
        };
        s.records.push_back(Record {
            seq,
            id,
            peer,
            admitted,
            ps1: s.ps1.clone(),
            command: command.to_string(),
            opts,
            shell: s.shell,
            from: None,
            to: None,
            step: RecordStep::Queued,
            exit_code: None,
            kill: None,
            escalated: false,
            sigint_to: None,
            sigint_looks: 0,
            created: now,
            last_change: now,
            quiet_after: None,
            quiet: false,
            waiting_for_input: false,
            no_dir: false,
            note: None,
            notice: s.reopened.take(),
            input: Vec::new(),
            timers: Vec::new(),
            bytes,
            via,
        });
        self.table.memory.add(key.0, bytes);
        if let Some(h) = self.shells.map[key]
            .records
            .back()
            .and_then(|r| r.opts.hard_timeout)
        {
            let t = self.timers.add(now + h, Timer::ShellHard(key.clone(), seq));
            if let Some(r) = self.shells.map.get_mut(key).and_then(|s| s.current_mut()) {
                r.timers.push(t);
            }
        }
        self.trim_console(key);
        self.shell_send(key);
        Ok(seq)
    }

    /// Arms command `seq`'s `no_change_timeout` (a synchronous `exec` waits on it).
    pub fn shell_watch_quiet(&mut self, key: &SessionKey, seq: u64, after: Duration) {
        let at = self.now + after;
        let t = self.timers.add(at, Timer::ShellQuiet(key.clone(), seq));
        if let Some(r) = self.shells.map.get_mut(key).and_then(|s| s.record_mut(seq)) {
            r.quiet_after = Some(after);
            r.timers.push(t);
        }
    }

    /// Sends the queued record, if the shell is at its prompt and where it is is known.
    /// A shell with no terminal path (carried by an upgrade from an image whose shells
    /// read their lines from a pipe, with that image's helper) is started again first.
    fn shell_send(&mut self, key: &SessionKey) {
        let Some(s) = self.shells.map.get_mut(key) else {
            return;
        };
        let Some(shell) = s.shell else { return };
        if s.phase != Phase::Prompt || s.dir_pending {
            return;
        }
        if !s.current().is_some_and(|r| r.step == RecordStep::Queued) {
            return;
        }
        let Some(tty) = self
            .table
            .get(shell)
            .and_then(|p| p.tty.as_ref()?.path.clone())
        else {
            self.log.line(format_args!(
                "the shell of session {:?} (uid {}) reads its lines the old way: starting \
                 another before its next line",
                key.1, key.0
            ));
            if let Some(s) = self.shells.map.get_mut(key) {
                s.phase = Phase::Busy;
            }
            self.kill(shell, KillReason::Request);
            return;
        };
        let Some(s) = self.shells.map.get_mut(key) else {
            return;
        };
        let status = s.last_status;
        let ps1 = s.ps1.clone();
        let Some(r) = s.current_mut() else { return };
        r.step = RecordStep::Sent;
        r.shell = Some(shell);
        r.last_change = self.now;
        // The prompt it is typed at is the one shown now.
        r.ps1 = ps1;
        // Only a line that is not a plain script can `exec`, `set` or close bash's saved
        // descriptors: those are run guarded (`command_line`).
        let session = crate::policy::Reading {
            session: true,
            ..Default::default()
        };
        let guarded = crate::policy::split_line_as(&r.command, session).unparsed;
        let line = command_line(r.seq, &r.command, &r.opts, (&tty, status), guarded);
        let (id, peer, command, via) = (r.id.clone(), r.peer, r.command.clone(), r.via);
        let (decision, rule) = r.admitted.clone();
        let cwd = r
            .opts
            .exec_dir
            .clone()
            .unwrap_or_else(|| s.workdir.display().to_string());
        s.phase = Phase::Busy;
        let sandbox = s.sandbox.as_ref().map_or_else(
            || crate::policy::sandbox::Given::off().to_json(),
            |g| g.to_json(),
        );
        let runs_as = self.table.get(shell).map_or(peer.uid, |p| p.runs_as);
        // Into the room found for it when the line was admitted (or past the queue's
        // capacity): it is typed now, so it is recorded now.
        self.record_queued(
            "start",
            Some(peer),
            json!({ "id": id, "session": key.1, "line": command, "cwd": cwd,
                    "uid": runs_as, "decision": decision, "rule": rule,
                    "shell": true, "sandbox": sandbox, "via": via.as_str() }),
            crate::core::Queued::Promised(0),
        );
        self.people_line_sent(key, &command, via);
        self.send_to_shell(shell, &line);
    }

    /// Where shell `shell` is now, as the loop read it for an end marker (`None`: it
    /// could not be read, the shell being gone): the session's directory from now on.
    /// Then the line waiting for it is sent.
    pub fn shell_dir(&mut self, shell: Key, dir: Option<PathBuf>) {
        let Some(sk) = self.table.get(shell).and_then(session_of) else {
            return;
        };
        let Some(s) = self.shells.map.get_mut(&sk) else {
            return;
        };
        if s.shell != Some(shell) {
            return;
        }
        if let Some(dir) = dir {
            s.workdir = dir;
        }
        s.dir_pending = false;
        self.shell_send(&sk);
    }

    /// Output of shell `key` arrived at stream offset `offset`: markers move its session
    /// on, and any output counts as change for the current command.
    pub(super) fn shell_output(&mut self, key: Key, offset: u64, data: &[u8]) {
        let Some(sk) = self.table.get(key).and_then(session_of) else {
            return;
        };
        let Some(s) = self.shells.map.get_mut(&sk) else {
            return;
        };
        if s.shell != Some(key) {
            return; // an old shell's descendants still writing
        }
        let now = self.now;
        if let Some(r) = s.current_mut() {
            r.last_change = now;
        }
        let nonce = s.nonce.clone();
        let found = s.scan.feed(&nonce, offset, data);
        // People see the output before what its markers do (a prompt, then a line), and
        // requests that stream get the lines before an end marker answers them.
        self.people_output(&sk, data);
        let end = found
            .iter()
            .find_map(|(m, start, _)| matches!(m, Marker::End { .. }).then_some(*start));
        self.follow_output(&sk, end);
        for (m, start, end) in found {
            self.on_marker(&sk, key, m, start, end);
        }
        if end.is_none() {
            // A command that started in this output has its first lines in it.
            self.follow_output(&sk, None);
        }
    }

    fn on_marker(&mut self, sk: &SessionKey, shell: Key, m: Marker, start: u64, end: u64) {
        let Some(s) = self.shells.map.get_mut(sk) else {
            return;
        };
        match m {
            Marker::Start { seq } => {
                if let Some(r) = s.current_mut().filter(|r| r.seq == seq) {
                    if r.step == RecordStep::Sent {
                        r.step = RecordStep::Running;
                        r.from = Some(end);
                        // A running line may wait for input: looked at again.
                        self.input_watch = true;
                        // Input written while the line was being read goes now; a kill
                        // asked for meanwhile is carried out now.
                        let kill = r.kill.is_some();
                        let input = std::mem::take(&mut r.input);
                        if !input.is_empty() {
                            // It fitted the buffer when it was taken, which is empty now
                            // (cleared at the last command's end).
                            let _ = self.table.queue_stdin(shell, &input, false);
                        }
                        // Whatever read the terminal before belonged to an earlier command.
                        self.set_waiting(shell, false);
                        self.out.push(Effect::FlushStdin(shell));
                        if kill {
                            self.out.push(Effect::Interrupt {
                                key: shell,
                                spared: None,
                            });
                        }
                    }
                }
            }
            Marker::NoDir => {
                if let Some(r) = s.current_mut() {
                    r.no_dir = true;
                }
            }
            Marker::End { status, dir } => {
                use std::os::unix::ffi::OsStringExt;
                s.prompt_from = Some(end);
                s.last_status = status;
                // Where the shell is comes from the kernel, never from what a marker (or a
                // line's `PWD=`) says; the `$PWD` it names is only a candidate for the
                // name shown when symlinks are kept.
                let keep = s.keep_symlinks
                    || s.current()
                        .is_some_and(|r| r.opts.keep_symlinks == Some(true));
                let logical = (keep && !dir.is_empty())
                    .then(|| PathBuf::from(std::ffi::OsString::from_vec(dir)));
                s.dir_pending = true;
                self.out.push(Effect::ShellDir {
                    key: shell,
                    logical,
                });
                let Some(s) = self.shells.map.get_mut(sk) else {
                    return;
                };
                // Only a command that started (or was refused its exec_dir) ends here: a
                // prompt cycle before a line sent was read (a repeated prompt) is not its.
                let seq = s
                    .current()
                    .filter(|r| {
                        r.step == RecordStep::Running || (r.step == RecordStep::Sent && r.no_dir)
                    })
                    .map(|r| r.seq);
                if let Some(seq) = seq {
                    self.finish(sk, seq, Some(status), Some(start), None);
                }
            }
            Marker::Prompt => {
                let ps1 = match (s.prompt_from, self.table.get(shell)) {
                    (Some(from), Some(p)) if from <= start => {
                        let st = &p.streams[0];
                        let from = from.max(st.ring.start());
                        let text = st.text(from, start.max(from));
                        let last = text.rsplit('\n').next().unwrap_or("").to_string();
                        cut(&last, PS1_MAX)
                    }
                    _ => String::new(),
                };
                let Some(s) = self.shells.map.get_mut(sk) else {
                    return;
                };
                s.ps1 = ps1;
                if s.phase == Phase::Starting {
                    s.failed_starts = 0;
                }
                // A command that started and is still not done at a prompt lost its end
                // marker (a Ctrl-C that cut PROMPT_COMMAND short): it is over all the same.
                let seq = s
                    .current()
                    .filter(|r| r.step == RecordStep::Running)
                    .map(|r| r.seq);
                s.phase = Phase::Prompt;
                // What the last command left unread in the terminal (or a program pushed
                // there) is not the next one's input.
                self.out.push(Effect::DiscardInput(shell));
                if let Some(seq) = seq {
                    self.finish(sk, seq, None, Some(start), None);
                }
                self.shell_send(sk);
                self.people_prompt(sk);
            }
        }
    }

    /// Command `seq` of session `sk` is over: `status` its exit code if known, `to` where
    /// its output ends in its shell's ring, `note` what execd adds to it.
    fn finish(
        &mut self,
        sk: &SessionKey,
        seq: u64,
        status: Option<i32>,
        to: Option<u64>,
        note: Option<String>,
    ) {
        let Some(s) = self.shells.map.get_mut(sk) else {
            return;
        };
        let Some(r) = s.record_mut(seq) else { return };
        if r.done() {
            return;
        }
        let sent = matches!(r.step, RecordStep::Sent | RecordStep::Running);
        let ending = r.kill.unwrap_or(Ending::Completed);
        r.step = RecordStep::Done(ending);
        r.exit_code = status;
        r.to = to.or(r.to);
        if note.is_some() {
            r.note = note;
        }
        let timers = std::mem::take(&mut r.timers);
        let (id, peer, shell, created) = (r.id.clone(), r.peer, r.shell, r.created);
        for t in timers {
            self.timers.cancel(t);
        }
        if let Some(shell) = shell {
            // Input the command did not take is not left for the next program.
            if let Some(stdin) = self.table.get_mut(shell).and_then(|p| p.stdin.as_mut()) {
                stdin.undelivered += stdin.buf.len() as u64;
                stdin.buf.clear();
            }
            self.set_waiting(shell, false);
        }
        if sent {
            self.record(
                "exit",
                Some(peer),
                json!({ "id": id, "session": sk.1, "status": ending.as_str(),
                        "exit_code": status, "signal": null,
                        "duration_ms": self.now.saturating_duration_since(created).as_millis() as u64 }),
            );
        }
        self.wake_shell(sk);
    }

    /// Re-checks every request parked on session `sk`.
    pub(super) fn wake_shell(&mut self, sk: &SessionKey) {
        let waiters = self
            .shells
            .map
            .get(sk)
            .map(|s| s.waiters.clone())
            .unwrap_or_default();
        for id in waiters {
            self.resolve(id, false);
        }
    }

    /// A shell exited (after its output was read): the command it ran is over, and a new
    /// shell is started in the session's last directory, unless the session is closing,
    /// the daemon is stopping, or the shell keeps dying before its first prompt.
    pub(super) fn shell_exited(&mut self, key: Key, ended: Ended) {
        let Some(sk) = self.table.get(key).and_then(session_of) else {
            return;
        };
        let end = self.table.get(key).map(|p| p.streams[0].ring.end());
        let how = match ended {
            Ended::Code(c) => format!("exited with status {c}"),
            Ended::Signal(sig) => format!("was killed by {}", crate::types::signal_name(sig)),
        };
        let Some(s) = self.shells.map.get_mut(&sk) else {
            return;
        };
        if s.shell != Some(key) {
            return;
        }
        let was_starting = s.phase == Phase::Starting;
        s.shell = None;
        s.old.push(key);
        s.phase = Phase::Spawning;
        if was_starting {
            s.failed_starts += 1;
        }
        let dir = s.workdir.display().to_string();
        let current = s.current().map(|r| (r.seq, r.step));
        let give_up = s.failed_starts >= STARTS_BEFORE_FAILING;
        let restart = !self.stopping && !give_up;
        let note = if restart {
            format!("[execd: the shell {how}; a new shell was started in {dir}]")
        } else {
            format!("[execd: the shell {how}]")
        };
        s.notice = Some(note.clone());
        match current {
            Some((seq, RecordStep::Sent | RecordStep::Running)) => {
                if let Some(r) = s.record_mut(seq) {
                    r.kill.get_or_insert(Ending::Terminated);
                }
                let code = match ended {
                    Ended::Code(c) => Some(c),
                    Ended::Signal(_) => None,
                };
                self.finish(&sk, seq, code, end, Some(note));
            }
            // A command queued for a shell that never reached its prompt waits for the
            // next one, unless there will be none.
            Some((seq, _)) if give_up => {
                if let Some(r) = self.shells.map.get_mut(&sk).and_then(|s| s.record_mut(seq)) {
                    r.kill = Some(Ending::Terminated);
                }
                self.finish(&sk, seq, None, None, Some(note.clone()));
            }
            _ => {}
        }
        self.log.line(format_args!(
            "the shell of session {:?} (uid {}) {how}{}",
            sk.1,
            sk.0,
            if restart { "; starting another" } else { "" }
        ));
        let Some(s) = self.shells.map.get_mut(&sk) else {
            return;
        };
        if give_up {
            s.phase = Phase::Failed(format!(
                "its shell {how} before its first prompt {STARTS_BEFORE_FAILING} times in a row"
            ));
        }
        self.drop_unreferenced_shells(&sk);
        let Some(s) = self.shells.map.get_mut(&sk) else {
            return;
        };
        if restart {
            s.restarts += 1;
            if let Some(launch) = self.shell_launch(&sk, ShellThen::Restart { fallback: false }) {
                self.out.push(Effect::Spawn(Box::new(launch)));
            }
        }
    }

    /// The shell of a session could not be started: `why`. A session that had one already
    /// (a restart) is failed; `exec` says so.
    pub fn shell_spawn_failed(&mut self, key: &SessionKey, why: &str) {
        let Some(s) = self.shells.map.get_mut(key) else {
            return;
        };
        s.phase = Phase::Failed(format!("its shell could not be started: {why}"));
        let seq = s.current().map(|r| r.seq);
        if let Some(seq) = seq {
            if let Some(r) = s.record_mut(seq) {
                r.kill = Some(Ending::Terminated);
            }
            self.finish(key, seq, None, None, Some(format!("[execd: {why}]")));
        }
    }

    /// Stops the current command of session `key`: SIGINT to its terminal's foreground
    /// job now (once it has started), and after `--kill-grace` the section 3 kill of the
    /// whole shell, which is then started again. `how` is what it will be reported as.
    pub fn shell_kill(&mut self, key: &SessionKey, how: Ending) -> Option<u64> {
        let grace = self.cfg.kill_grace;
        let s = self.shells.map.get_mut(key)?;
        let shell = s.shell;
        let r = s.current_mut()?;
        let seq = r.seq;
        if r.kill.is_some() {
            return Some(seq); // already being stopped
        }
        r.kill = Some(how);
        let step = r.step;
        match step {
            RecordStep::Queued => {
                // It never reached the shell: it is over now.
                self.finish(key, seq, None, None, None);
                return Some(seq);
            }
            RecordStep::Running => {
                if let Some(shell) = shell {
                    self.out.push(Effect::Interrupt {
                        key: shell,
                        spared: None,
                    });
                }
            }
            // Interrupted once the start marker says the shell has read the line.
            RecordStep::Sent | RecordStep::Done(_) => {}
        }
        let t = self
            .timers
            .add(self.now + grace, Timer::ShellKill(key.clone(), seq));
        if let Some(r) = self.shells.map.get_mut(key).and_then(|s| s.record_mut(seq)) {
            r.timers.push(t);
        }
        Some(seq)
    }

    /// The SIGINT of a kill for shell `shell`'s command went to process group `sent`
    /// of its terminal (None: it went nowhere, the group had it or could not take it);
    /// `held`: the foreground may have kept it without acting on it (bash takes a SIGINT
    /// that comes while it starts a job as its own, and the job runs regardless). The
    /// terminal's foreground is then looked at again shortly, and a job that has taken
    /// it since gets a SIGINT too: each group gets one, as from a person who pressed
    /// Ctrl-C once the job was there. Looks go on, further apart each time, until the
    /// command ends or the grace ends the shell.
    pub fn shell_interrupted(&mut self, shell: Key, sent: Option<i32>, held: bool) {
        let Some(key) = self.table.get(shell).and_then(session_of) else {
            return;
        };
        let now = self.now;
        let Some(r) = self.shells.map.get_mut(&key).and_then(|s| s.current_mut()) else {
            return;
        };
        if r.done() || r.escalated || r.kill.is_none() {
            return;
        }
        r.sigint_to = sent.or(r.sigint_to);
        let looks = r.sigint_looks;
        r.sigint_looks += 1;
        if held {
            let t = self.timers.add(
                now + SIGINT_LOOK * 2u32.pow(looks.min(6)),
                Timer::ShellInterrupt(key, r.seq),
            );
            r.timers.push(t);
        }
    }

    /// Timer: command `seq`'s SIGINT may have been held: its terminal's foreground job is
    /// sent one unless it is the group that had it.
    pub(super) fn shell_interrupt_again(&mut self, key: &SessionKey, seq: u64) {
        let Some(s) = self.shells.map.get(key) else {
            return;
        };
        let Some(r) = s.current().filter(|r| r.seq == seq) else {
            return;
        };
        if r.done() || r.escalated {
            return;
        }
        if let Some(shell) = s.shell {
            self.out.push(Effect::Interrupt {
                key: shell,
                spared: r.sigint_to,
            });
        }
    }

    /// Timer: command `seq` did not stop at SIGINT within the grace: its shell is ended
    /// (and started again).
    pub(super) fn shell_kill_escalate(&mut self, key: &SessionKey, seq: u64) {
        let Some(s) = self.shells.map.get_mut(key) else {
            return;
        };
        let shell = s.shell;
        let Some(r) = s.record_mut(seq) else { return };
        if r.done() {
            return;
        }
        r.escalated = true;
        let reason = match r.kill {
            Some(Ending::HardTimeout) => KillReason::Timeout,
            _ => KillReason::Request,
        };
        if let Some(shell) = shell {
            self.kill(shell, reason);
        }
    }

    /// Timer: command `seq`'s `no_change_timeout` may have passed.
    pub(super) fn shell_quiet_check(&mut self, key: &SessionKey, seq: u64) {
        let now = self.now;
        let Some(s) = self.shells.map.get_mut(key) else {
            return;
        };
        let Some(r) = s.record_mut(seq) else { return };
        let Some(after) = r.quiet_after else { return };
        if r.done() || r.quiet {
            return;
        }
        let due = r.last_change + after;
        if due > now {
            let t = self.timers.add(due, Timer::ShellQuiet(key.clone(), seq));
            if let Some(r) = self.shells.map.get_mut(key).and_then(|s| s.record_mut(seq)) {
                r.timers.push(t);
            }
            return;
        }
        r.quiet = true;
        self.wake_shell(key);
    }

    /// The hook for PROTOCOL 12.3's detector: shell `key`'s terminal is being read by a
    /// process of its tree (`waiting`), or no longer. While its current command waits
    /// for input, a synchronous `shell/exec` answers `no_change_timeout` at once (with
    /// `waiting_for_input: true`) instead of sitting out its timeout; the command keeps
    /// running. A shell at its prompt never reads its terminal (it reads its command
    /// pipe), so only programs of a running command can set it.
    /// Called from `set_waiting`, with what the loop's look (`sys::waiting`) found.
    pub fn input_wanted(&mut self, key: Key, waiting: bool) {
        let Some(sk) = self.table.get(key).and_then(session_of) else {
            return;
        };
        let Some(r) = self.shells.map.get_mut(&sk).and_then(|s| s.current_mut()) else {
            return;
        };
        if r.step != RecordStep::Running || r.waiting_for_input == waiting {
            return;
        }
        r.waiting_for_input = waiting;
        if waiting {
            self.wake_shell(&sk);
        }
    }

    /// Input for the running program of session `key` (`shell/write`): written to its
    /// terminal once the command has started, held in its record until then (the shell
    /// may still be reading the line, or be starting). `-32000` with nothing running: at
    /// the prompt the shell takes commands only from `exec`. `-32003` past
    /// `--stdin-buffer`.
    pub fn shell_write(&mut self, key: &SessionKey, data: &[u8]) -> Result<&'static str, RpcError> {
        let cap = self.cfg.stdin_buffer;
        let s = self
            .shells
            .map
            .get_mut(key)
            .ok_or_else(|| RpcError::not_found("shell session", &key.1))?;
        let shell = s.shell;
        let Some(r) = s.current_mut() else {
            return Err(RpcError::invalid_state(format!(
                "no running command in shell session {}; use exec",
                key.1
            )));
        };
        r.waiting_for_input = false;
        let running = r.step == RecordStep::Running;
        match shell.filter(|_| running) {
            Some(shell) => {
                if self.table.queue_stdin(shell, data, false)?.is_none() {
                    return Err(RpcError::limit("stdin-buffer", cap));
                }
                self.out.push(Effect::FlushStdin(shell));
                // Input given: whatever waited for it is not waiting any more.
                self.set_waiting(shell, false);
            }
            None => {
                if r.input.len() + data.len() > cap {
                    return Err(RpcError::limit("stdin-buffer", cap));
                }
                r.input.extend_from_slice(data);
            }
        }
        Ok("running")
    }

    /// Sets the window size of session `key`'s terminal (`shell/resize`): its running
    /// shell's PTY now (the kernel sends SIGWINCH to the foreground job), and the shell
    /// started next, should this one die.
    pub fn shell_resize(&mut self, key: &SessionKey, size: WinSize) -> Result<(), RpcError> {
        let s = self
            .shells
            .map
            .get_mut(key)
            .ok_or_else(|| RpcError::not_found("shell session", &key.1))?;
        s.size = size;
        match s
            .shell
            .filter(|k| self.table.get(*k).is_some_and(Proc::running))
        {
            Some(shell) => self.resize(shell, size),
            // Being started: it starts with this size.
            None => Ok(()),
        }
    }

    /// Drops console records beyond `CONSOLE_RECORDS` (never the current one), and the
    /// exited shells no record refers to any more.
    fn trim_console(&mut self, key: &SessionKey) {
        let Some(s) = self.shells.map.get_mut(key) else {
            return;
        };
        let mut freed = 0;
        while s.records.len() > CONSOLE_RECORDS && s.records.front().is_some_and(Record::done) {
            if let Some(r) = s.records.pop_front() {
                freed += r.bytes;
            }
        }
        self.table.memory.sub(key.0, freed);
        self.drop_unreferenced_shells(key);
    }

    /// Dead shells of session `key` that no record refers to any more are dropped.
    fn drop_unreferenced_shells(&mut self, key: &SessionKey) {
        let Some(s) = self.shells.map.get_mut(key) else {
            return;
        };
        let records = &s.records;
        let (keep, gone): (Vec<Key>, Vec<Key>) = s
            .old
            .iter()
            .partition(|k| records.iter().any(|r| r.shell == Some(**k)));
        s.old = keep;
        for k in gone {
            self.drop_finished(k);
        }
    }

    /// Closes shell session `key`: its command is over, its shell's whole tree is ended
    /// (SIGHUP, which bash passes to its jobs, then the section 3 kill), its records and
    /// old shells dropped. Requests waiting on it are answered that it is gone.
    pub fn close_shell(&mut self, key: &SessionKey) {
        let Some(s) = self.shells.map.get(key) else {
            return;
        };
        let current = s.current().map(|r| r.seq);
        let shells: Vec<Key> = s.old.iter().copied().chain(s.shell).collect();
        if let Some(seq) = current {
            if let Some(r) = self.shells.map.get_mut(key).and_then(|s| s.record_mut(seq)) {
                r.kill.get_or_insert(Ending::Terminated);
            }
            self.finish(key, seq, None, None, None);
        }
        let Some(s) = self.shells.map.remove(key) else {
            return;
        };
        // Requests waiting on it learn it is gone.
        for id in &s.waiters {
            self.resolve(*id, true);
        }
        if let Some(t) = s.idle_timer {
            self.timers.cancel(t);
        }
        let bytes: usize = s.records.iter().map(|r| r.bytes).sum();
        self.table.memory.sub(key.0, bytes);
        for r in &s.records {
            for t in &r.timers {
                self.timers.cancel(*t);
            }
        }
        self.people_gone(key);
        let session_ref = format!("shell:{}", key.1);
        self.end_members(key.0, shells, &session_ref);
        self.approvals.end_session(key.0, &session_ref);
        self.log
            .debug(format_args!("shell session {:?} closed", key.1));
        self.record(
            "session_close",
            None,
            json!({ "session": key.1, "uid": key.0, "shell": true }),
        );
    }

    /// Timer: is shell session `key` idle (unused for `--session-idle`, or a sixth of it
    /// for a one-shot session, and nothing running)? Then it is closed; else looked at
    /// again when it could be.
    pub(super) fn shell_idle_check(&mut self, key: &SessionKey) {
        let now = self.now;
        let full = self.cfg.session_idle;
        // A session a person watches is in use (PROTOCOL 12.5).
        let watched = self.watched(key);
        let Some(s) = self.shells.map.get_mut(key) else {
            return;
        };
        let idle = if s.oneshot {
            super::sessions::oneshot_idle(full)
        } else {
            full
        };
        s.idle_timer = None;
        if watched {
            s.last_used = now;
        }
        if !s.busy() && now.saturating_duration_since(s.last_used) >= idle {
            self.log.line(format_args!(
                "shell session {:?} idle for {} s",
                key.1,
                super::sessions::seconds(idle)
            ));
            self.close_shell(key);
            self.closed_by_daemon(key, true, super::sessions::ClosedBy::Idle(idle));
            return;
        }
        let next = if s.busy() {
            now + idle
        } else {
            s.last_used + idle
        };
        let t = self.timers.add(
            next.max(now + Duration::from_millis(10)),
            Timer::ShellIdle(key.clone()),
        );
        if let Some(s) = self.shells.map.get_mut(key) {
            s.idle_timer = Some(t);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::markers::*;
    use super::*;
    use crate::core::testkit::{self, later, C1};
    use crate::core::Wait;
    use crate::types::{Stdio3, Usage, WinSize};
    use crate::wire::rpc::ReqNo;
    use serde_json::Value;
    use std::path::Path;

    const N: &str = "abc123";

    const PEER: Peer = Peer {
        uid: 1000,
        gid: 1000,
        pid: 42,
    };

    /// A core with shell session `s` whose (fake) shell is started: its key.
    fn with_shell(c: &mut Core) -> (SessionKey, Key) {
        let key = c
            .open_shell(1000, ("s", false), "/".into(), PEER, (None, false))
            .expect("open");
        let key2 = start_shell(c, &key);
        (key, key2)
    }

    /// Starts a fake shell for session `key` (as the loop would after a spawn).
    fn start_shell(c: &mut Core, key: &SessionKey) -> Key {
        let mut req = testkit::request(
            crate::core::table::Family::Shell {
                session_id: key.1.clone(),
            },
            Stdio3::Shell(WinSize::DEFAULT),
        );
        req.ring_capacity = 1 << 16;
        let (k, id) = c.table.next_ids("sh");
        c.started(&req, k, id, k.0 as i32 + 1000, 1000);
        c.tty_path(k, "/dev/pts/7".into());
        c.shell_started(key, k, None);
        k
    }

    fn nonce_of(c: &Core, key: &SessionKey) -> String {
        c.shells.map[key].nonce.clone()
    }

    /// Where the (fake) kernel says every shell is.
    const KERNEL_DIR: &str = "/real/dir";

    /// Feeds the shell `k` what it would print, and answers what the loop would read at
    /// once (where a shell is, after an end marker): the marker's logical `$PWD` when one
    /// is asked about (the fake kernel agrees it names the directory), else `KERNEL_DIR`.
    fn print(c: &mut Core, k: Key, text: &str) {
        c.output(k, 0, text.as_bytes());
        serve_dirs(c);
    }

    /// Answers every `ShellDir` the core asked for, as the loop would.
    fn serve_dirs(c: &mut Core) {
        let asked: Vec<(Key, Option<PathBuf>)> = c
            .out
            .iter()
            .filter_map(|e| match e {
                Effect::ShellDir { key, logical } => Some((*key, logical.clone())),
                _ => None,
            })
            .collect();
        c.out.retain(|e| !matches!(e, Effect::ShellDir { .. }));
        for (key, logical) in asked {
            c.shell_dir(key, Some(logical.unwrap_or_else(|| KERNEL_DIR.into())));
        }
    }

    fn mark(c: &Core, key: &SessionKey, body: &str) -> String {
        let (kind, rest) = body.split_at(1);
        format!("\x1b]6973;{kind};{}{rest}\x07", nonce_of(c, key))
    }

    /// Feeds the shell `k` the marker `body` (kind first, nonce inserted).
    fn say(c: &mut Core, key: &SessionKey, k: Key, body: &str) {
        let m = mark(c, key, body);
        print(c, k, &m);
    }

    /// What waits for the shell's command channel, as text.
    fn piped(c: &mut Core, k: Key) -> String {
        let buf = &mut c.table.get_mut(k).unwrap().commands.as_mut().unwrap().buf;
        String::from_utf8(buf.drain(..).collect()).unwrap()
    }

    fn record<'a>(c: &'a Core, key: &SessionKey, seq: u64) -> &'a Record {
        c.shells.map[key].record(seq).unwrap()
    }

    fn queue(c: &mut Core, key: &SessionKey, command: &str) -> u64 {
        c.shell_queue(
            key,
            (
                "shcmd_1".into(),
                PEER,
                ("allow", "default".into()),
                Via::Rpc,
            ),
            command,
            LineOpts::default(),
        )
        .unwrap()
    }

    #[test]
    fn a_line_waits_for_the_prompt_runs_and_ends_at_its_markers() {
        let mut c = testkit::core();
        let (key, k) = with_shell(&mut c);
        assert!(piped(&mut c, k).starts_with(" set +o history +H; unset HISTFILE"));
        let seq = queue(&mut c, &key, "echo hi");
        assert_eq!(
            record(&c, &key, seq).step,
            RecordStep::Queued,
            "no prompt yet"
        );
        assert!(piped(&mut c, k).is_empty());
        let (e, p) = (mark(&c, &key, "e;0;2f746d70"), mark(&c, &key, "p"));
        print(&mut c, k, &format!("bash-5.2$ {e}u@h:/tmp$ {p}"));
        assert_eq!(c.shells.map[&key].ps1, "u@h:/tmp$ ");
        // The marker's `$PWD` is not where the shell is: the kernel says.
        assert_eq!(c.shells.map[&key].workdir, PathBuf::from(KERNEL_DIR));
        assert_eq!(record(&c, &key, seq).step, RecordStep::Sent);
        assert!(piped(&mut c, k).starts_with(&format!(" \\__execd_pre {seq} '\\x65")));
        assert_eq!(record(&c, &key, seq).ps1, "u@h:/tmp$ ");
        // A prompt cycle before the line is read (a repeated prompt) ends nothing.
        let (e0, p0) = (mark(&c, &key, "e;0;2f746d70"), mark(&c, &key, "p"));
        print(&mut c, k, &format!("{e0}u@h:/tmp$ {p0}"));
        assert_eq!(record(&c, &key, seq).step, RecordStep::Sent);
        assert!(piped(&mut c, k).is_empty(), "sent once");
        // A marker with another nonce is output like any other: it ends nothing.
        let s = mark(&c, &key, &format!("s;{seq}"));
        print(&mut c, k, &format!("{s}hi\r\n\x1b]6973;e;forged;0;2f\x07"));
        assert_eq!(record(&c, &key, seq).step, RecordStep::Running);
        let e = mark(&c, &key, "e;3;2f");
        print(&mut c, k, &format!("{e}u@h:/$ {p}"));
        let r = record(&c, &key, seq);
        assert_eq!(
            (r.step, r.exit_code),
            (RecordStep::Done(Ending::Completed), Some(3))
        );
        let (from, to) = (r.from.unwrap(), r.to.unwrap());
        let text = c.table.get(k).unwrap().streams[0].text(from, to);
        assert_eq!(text, "hi\n");
        assert_eq!(c.shells.map[&key].phase, Phase::Prompt);
    }

    #[test]
    fn no_output_for_no_change_timeout_answers_a_waiting_exec() {
        let mut c = testkit::core();
        let (key, k) = with_shell(&mut c);
        let p = mark(&c, &key, "p");
        print(&mut c, k, &p);
        let seq = queue(&mut c, &key, "sleep 9");
        say(&mut c, &key, k, &format!("s;{seq}"));
        c.shell_watch_quiet(&key, seq, Duration::from_secs(5));
        let wait = Wait::Shell {
            session: key.clone(),
            seq,
            what: ShellWait::Exec { truncate: true },
        };
        c.park(C1, ReqNo(1), wait, None);
        later(&mut c, Duration::from_secs(3));
        print(&mut c, k, "tick\r\n");
        later(&mut c, Duration::from_secs(3));
        assert!(testkit::replies(&mut c).is_empty(), "output 3 s ago");
        later(&mut c, Duration::from_secs(2));
        let r = testkit::replies(&mut c);
        assert_eq!(r.len(), 1);
        let v = r[0].2.as_ref().unwrap();
        assert_eq!(v["status"], "no_change_timeout", "{v}");
        assert_eq!(v["output"], "tick\n");
        assert_eq!(
            record(&c, &key, seq).step,
            RecordStep::Running,
            "it goes on"
        );
    }

    #[test]
    fn waiting_for_input_answers_a_waiting_exec_at_once() {
        let mut c = testkit::core();
        let (key, k) = with_shell(&mut c);
        say(&mut c, &key, k, "p");
        let seq = queue(&mut c, &key, "read x");
        c.input_seen(k, true); // not started yet: nothing to say
        say(&mut c, &key, k, &format!("s;{seq}"));
        c.shell_watch_quiet(&key, seq, Duration::from_secs(30));
        let wait = Wait::Shell {
            session: key.clone(),
            seq,
            what: ShellWait::Exec { truncate: true },
        };
        c.park(C1, ReqNo(1), wait, None);
        assert!(testkit::replies(&mut c).is_empty());
        // What the loop's look finds (`sys::waiting`), through the core's one entry.
        c.input_seen(k, true);
        let r = testkit::replies(&mut c);
        let v = r[0].2.as_ref().unwrap();
        assert_eq!(v["status"], "no_change_timeout", "{v}");
        assert_eq!(v["waiting_for_input"], true, "{v}");
        // Input written clears it.
        c.shell_write(&key, b"x\r").unwrap();
        assert!(!record(&c, &key, seq).waiting_for_input);
    }

    #[test]
    fn input_waits_for_the_start_marker_and_is_dropped_at_the_end() {
        let mut c = testkit::core();
        let (key, k) = with_shell(&mut c);
        let err = c.shell_write(&key, b"ls\r").unwrap_err();
        assert_eq!(err.code, crate::wire::rpc::INVALID_STATE, "nothing runs");
        // Queued before the first prompt: its input is taken, and held.
        let seq = queue(&mut c, &key, "cat");
        c.shell_write(&key, b"queued ").unwrap();
        say(&mut c, &key, k, "p");
        assert_eq!(record(&c, &key, seq).step, RecordStep::Sent);
        c.out.clear();
        c.shell_write(&key, b"early\r").unwrap();
        assert!(
            !c.out.iter().any(|e| matches!(e, Effect::FlushStdin(_))),
            "the shell may still be reading the line"
        );
        let stdin = |c: &Core| -> Vec<u8> {
            let p = c.table.get(k).unwrap();
            p.stdin.as_ref().unwrap().buf.iter().copied().collect()
        };
        assert!(stdin(&c).is_empty());
        say(&mut c, &key, k, &format!("s;{seq}"));
        assert!(c
            .out
            .iter()
            .any(|e| matches!(e, Effect::FlushStdin(x) if *x == k)));
        assert_eq!(stdin(&c), b"queued early\r");
        c.shell_write(&key, b"late").unwrap();
        say(&mut c, &key, k, "e;0;2f");
        let stdin = c.table.get(k).unwrap().stdin.as_ref().unwrap();
        assert!(stdin.buf.is_empty(), "not left for the next program");
    }

    /// The session's directory is the kernel's, read for every end marker before the next
    /// line goes (so its audit `cwd` and what approvers are shown are where it runs); the
    /// marker's `$PWD` is only offered as the logical name when symlinks are kept.
    #[test]
    fn the_directory_is_read_from_the_kernel_before_the_next_line_goes() {
        let mut c = testkit::core();
        c.cfg.audit = Some(crate::config::AuditTarget::Stderr);
        let mut c = Core::new(c.cfg, c.now, c.wall, crate::core::log::Log::new(false));
        let (key, k) = with_shell(&mut c);
        piped(&mut c, k);
        let seq = queue(&mut c, &key, "rm -rf build");
        // A line said `PWD=/tmp/harmless`: the marker names it.
        let e = mark(&c, &key, "e;0;2f746d702f6861726d6c657373");
        let p = mark(&c, &key, "p");
        c.output(k, 0, format!("{e}$ {p}").as_bytes());
        let asked: Vec<_> = c
            .out
            .iter()
            .filter_map(|e| match e {
                Effect::ShellDir { key: x, logical } if *x == k => Some(logical.clone()),
                _ => None,
            })
            .collect();
        assert_eq!(
            asked,
            vec![None],
            "no logical name without preserve_symlinks"
        );
        assert!(c
            .out
            .iter()
            .any(|e| matches!(e, Effect::DiscardInput(x) if *x == k)));
        assert_eq!(record(&c, &key, seq).step, RecordStep::Queued, "not before");
        assert!(piped(&mut c, k).is_empty());
        c.out.clear();
        c.shell_dir(k, Some("/home/u/V".into()));
        assert_eq!(record(&c, &key, seq).step, RecordStep::Sent);
        assert_eq!(c.shells.map[&key].workdir, PathBuf::from("/home/u/V"));
        let audit = String::from_utf8(c.log.queue.pending().to_vec()).unwrap();
        let start: Value = audit
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .find(|r| r["event"] == "start" && r["shell"] == true)
            .expect("a start record");
        assert_eq!(start["cwd"], "/home/u/V");
        // A shell that could not be read keeps the last directory known.
        say(&mut c, &key, k, &format!("s;{seq}"));
        let e = mark(&c, &key, "e;0;2f");
        c.output(k, 0, e.as_bytes());
        c.shell_dir(k, None);
        assert_eq!(c.shells.map[&key].workdir, PathBuf::from("/home/u/V"));
        // With symlinks kept, the marker's `$PWD` is offered to the loop to check.
        let kept = c
            .open_shell(1000, ("k", false), "/".into(), PEER, (None, true))
            .expect("open");
        let k2 = start_shell(&mut c, &kept);
        c.out.clear();
        let e = mark(&c, &kept, "e;0;2f6c");
        c.output(k2, 0, e.as_bytes());
        assert!(c.out.iter().any(|e| matches!(e,
            Effect::ShellDir { key: x, logical: Some(l) } if *x == k2 && l == Path::new("/l"))));
    }

    /// `$?` when a line starts is the last command's status as its end marker said, put
    /// there by the line itself (no variable of the shell holds it between lines).
    #[test]
    fn a_line_starts_with_the_last_status() {
        let mut c = testkit::core();
        let (key, k) = with_shell(&mut c);
        piped(&mut c, k); // the setup
        say(&mut c, &key, k, "p");
        let seq = queue(&mut c, &key, "false");
        assert!(!piped(&mut c, k).contains("__execd_st"), "0 needs nothing");
        say(&mut c, &key, k, &format!("s;{seq}"));
        say(&mut c, &key, k, "e;1;2f");
        say(&mut c, &key, k, "p");
        queue(&mut c, &key, "echo $?");
        assert!(piped(&mut c, k).contains(" \\__execd_st 1 && "));
    }

    /// A shell an upgrade carried from an image whose shells read a pipe (with that
    /// image's helper) has no terminal path: it is started again before it gets a line,
    /// and the line goes to the new shell.
    #[test]
    fn a_shell_of_the_old_kind_is_started_again_before_its_next_line() {
        let mut c = testkit::core();
        let (key, k) = with_shell(&mut c);
        if let Some(t) = c.table.get_mut(k).and_then(|p| p.tty.as_mut()) {
            t.path = None;
        }
        say(&mut c, &key, k, "e;0;2f");
        say(&mut c, &key, k, "p");
        piped(&mut c, k);
        c.out.clear();
        let seq = queue(&mut c, &key, "echo hi");
        assert!(piped(&mut c, k).is_empty(), "nothing for the old shell");
        assert!(c
            .out
            .iter()
            .any(|e| matches!(e, Effect::End { key: x, .. } if *x == k)));
        c.exited(k, Ended::Signal(libc::SIGHUP), Usage::default(), None);
        assert_eq!(record(&c, &key, seq).step, RecordStep::Queued);
        assert!(c.out.iter().any(|e| matches!(e, Effect::Spawn(_))));
        let k2 = start_shell(&mut c, &key);
        piped(&mut c, k2);
        say(&mut c, &key, k2, "e;0;2f");
        say(&mut c, &key, k2, "p");
        assert_eq!(record(&c, &key, seq).step, RecordStep::Sent);
        assert!(piped(&mut c, k2).contains("\\__execd_pre"));
    }

    /// A shell at its prompt that has started `command` (its start marker read), with
    /// the effects so far cleared: the session, the shell and the command's seq.
    fn started(c: &mut Core, command: &str) -> (SessionKey, Key, u64) {
        let (key, k) = with_shell(c);
        say(c, &key, k, "p");
        let seq = queue(c, &key, command);
        say(c, &key, k, &format!("s;{seq}"));
        c.out.clear();
        (key, k, seq)
    }

    #[test]
    fn a_kill_interrupts_then_ends_the_shell_which_starts_again() {
        let mut c = testkit::core();
        let (key, k, seq) = started(&mut c, "trap '' INT; sleep 60");
        assert_eq!(c.shell_kill(&key, Ending::Terminated), Some(seq));
        assert!(c
            .out
            .iter()
            .any(|e| matches!(e, Effect::Interrupt { key: x, spared: None } if *x == k)));
        c.out.clear();
        later(&mut c, Duration::from_secs(2)); // the grace: it did not stop
        let effects = std::mem::take(&mut c.out);
        assert!(effects.iter().any(
            |e| matches!(e, Effect::Signal { key: x, sig } if *x == k && *sig == libc::SIGHUP)
        ));
        assert!(effects
            .iter()
            .any(|e| matches!(e, Effect::End { key: x, .. } if *x == k)));
        c.exited(k, Ended::Signal(libc::SIGHUP), Usage::default(), None);
        let r = record(&c, &key, seq);
        assert_eq!(r.step, RecordStep::Done(Ending::Terminated));
        assert!(r.note.as_deref().unwrap().contains("SIGHUP"));
        let spawn = c.out.iter().find_map(|e| match e {
            Effect::Spawn(l) => Some(l.clone()),
            _ => None,
        });
        let spawn = spawn.expect("a new shell is started");
        assert_eq!(spawn.cwd, PathBuf::from("/"));
        assert_eq!(c.shells.map[&key].restarts, 1);
        // The old shell is kept while a record's output is in it.
        assert!(c.shells.map[&key].old.contains(&k));
    }

    #[test]
    fn a_shell_at_its_prompt_is_not_looked_at_for_input_a_running_line_is() {
        let mut c = testkit::core();
        let (key, k) = with_shell(&mut c);
        say(&mut c, &key, k, "p");
        later(&mut c, crate::core::input::QUIET);
        let looked = |c: &Core| c.input_candidates().iter().any(|(x, _)| *x == k);
        assert!(!looked(&c), "a shell at its prompt is not looked at");
        assert!(
            !c.input_watch(),
            "nothing to look at: the loop stops looking"
        );
        let seq = queue(&mut c, &key, "read x");
        say(&mut c, &key, k, &format!("s;{seq}"));
        assert!(c.input_watch(), "a line that runs is looked at again");
        later(&mut c, crate::core::input::QUIET);
        assert!(looked(&c));
        // Found waiting, then the line ends: its markers (output) clear the mark, and
        // the shell at its prompt is not looked at again.
        c.input_seen(k, true);
        say(&mut c, &key, k, "e;0;2f");
        say(&mut c, &key, k, "p");
        later(&mut c, crate::core::input::QUIET);
        assert!(!c.table.get(k).unwrap().waiting_for_input);
        assert!(!looked(&c));
        assert!(!c.input_watch());
        // A look's late answer marks the shell at its prompt: the looks go on until a
        // look clears it.
        c.input_seen(k, true);
        assert!(c.input_watch(), "a mark re-arms the looks");
        assert!(looked(&c), "still marked waiting: looked at");
        c.input_seen(k, false);
        assert!(!looked(&c));
        assert!(!c.input_watch());
    }

    /// The interrupts of a kill in `c.out`, as `spared`.
    fn interrupts(c: &mut Core, k: Key) -> Vec<Option<i32>> {
        std::mem::take(&mut c.out)
            .into_iter()
            .filter_map(|e| match e {
                Effect::Interrupt { key, spared } if key == k => Some(spared),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn a_sigint_the_starting_shell_may_hold_is_sent_again_to_the_job_that_takes_the_terminal() {
        let mut c = testkit::core();
        let (key, k) = with_shell(&mut c);
        say(&mut c, &key, k, "p");
        let seq = queue(&mut c, &key, "sleep 60");
        // Killed while the line is being read: interrupted at the start marker.
        c.out.clear();
        c.shell_kill(&key, Ending::Terminated);
        assert_eq!(interrupts(&mut c, k), []);
        say(&mut c, &key, k, &format!("s;{seq}"));
        assert_eq!(interrupts(&mut c, k), [None]);
        // It went to the shell itself (group 100), which may hold it: looked at again.
        c.shell_interrupted(k, Some(100), true);
        later(&mut c, Duration::from_millis(1));
        assert_eq!(interrupts(&mut c, k), [], "not before the first look");
        later(&mut c, Duration::from_millis(2));
        assert_eq!(interrupts(&mut c, k), [Some(100)], "the shell is spared");
        // A forked child with the shell's handlers: nothing sent, looked at again later.
        c.shell_interrupted(k, None, true);
        later(&mut c, Duration::from_millis(3));
        assert_eq!(
            interrupts(&mut c, k),
            [],
            "the second look waits twice as long"
        );
        later(&mut c, Duration::from_millis(2));
        assert_eq!(interrupts(&mut c, k), [Some(100)]);
        // The job (group 200) has the terminal and got it: no more looks.
        c.shell_interrupted(k, Some(200), false);
        assert_eq!(record(&c, &key, seq).sigint_to, Some(200));
        later(&mut c, Duration::from_millis(500));
        assert_eq!(interrupts(&mut c, k), []);
        // It ends of it: the kill is over, the shell stays.
        say(&mut c, &key, k, "e;130;2f");
        let r = record(&c, &key, seq);
        assert_eq!(r.step, RecordStep::Done(Ending::Terminated));
        assert_eq!(r.exit_code, Some(130));
        later(&mut c, Duration::from_secs(2));
        assert!(!c.out.iter().any(|e| matches!(e, Effect::Signal { .. })));
    }

    #[test]
    fn a_look_after_the_command_ended_sends_nothing() {
        let mut c = testkit::core();
        let (key, k, seq) = started(&mut c, "sleep 60");
        c.shell_kill(&key, Ending::Terminated);
        assert_eq!(interrupts(&mut c, k), [None]);
        c.shell_interrupted(k, Some(100), true);
        say(&mut c, &key, k, "e;130;2f"); // bash acted on it: the line was abandoned
        later(&mut c, Duration::from_millis(200));
        assert_eq!(interrupts(&mut c, k), []);
        // And a report that comes after the end arms nothing.
        c.shell_interrupted(k, Some(100), true);
        later(&mut c, Duration::from_millis(200));
        assert_eq!(interrupts(&mut c, k), []);
        assert_eq!(record(&c, &key, seq).exit_code, Some(130));
    }

    #[test]
    fn a_resize_reaches_the_shells_terminal_and_the_shell_started_next() {
        let mut c = testkit::core();
        let (key, k) = with_shell(&mut c);
        say(&mut c, &key, k, "p");
        c.out.clear();
        let size = WinSize {
            rows: 30,
            cols: 100,
        };
        c.shell_resize(&key, size).expect("resize");
        assert!(c
            .out
            .iter()
            .any(|e| matches!(e, Effect::Resize { key: x, size: s } if *x == k && *s == size)));
        assert_eq!(c.table.get(k).unwrap().tty.as_ref().unwrap().size, size);
        c.out.clear();
        c.exited(k, Ended::Code(0), Usage::default(), None);
        let spawn = c.out.iter().find_map(|e| match e {
            Effect::Spawn(l) => Some(l.clone()),
            _ => None,
        });
        assert_eq!(spawn.expect("a new shell").stdio, Stdio3::Shell(size));
        // Between two shells there is no terminal: the size waits for the next one.
        c.out.clear();
        let small = WinSize { rows: 5, cols: 7 };
        c.shell_resize(&key, small).expect("resize");
        assert!(!c.out.iter().any(|e| matches!(e, Effect::Resize { .. })));
        assert_eq!(c.shells.map[&key].size, small);
        let unknown = (1000, "nope".to_string());
        assert_eq!(c.shell_resize(&unknown, small).unwrap_err().code, -32002);
    }

    #[test]
    fn a_shell_that_dies_before_its_first_prompt_twice_fails_the_session() {
        let mut c = testkit::core();
        let (key, k) = with_shell(&mut c);
        let seq = queue(&mut c, &key, "true");
        c.exited(k, Ended::Code(1), Usage::default(), None);
        assert_eq!(
            record(&c, &key, seq).step,
            RecordStep::Queued,
            "it waits for the next"
        );
        let k2 = start_shell(&mut c, &key);
        c.out.clear();
        c.exited(k2, Ended::Code(1), Usage::default(), None);
        assert!(matches!(c.shells.map[&key].phase, Phase::Failed(_)));
        assert!(!c.out.iter().any(|e| matches!(e, Effect::Spawn(_))));
        assert_eq!(
            record(&c, &key, seq).step,
            RecordStep::Done(Ending::Terminated)
        );
    }

    #[test]
    fn an_idle_session_closes_and_a_busy_one_stays() {
        let mut c = testkit::core(); // --session-idle 60 s
        let (key, k) = with_shell(&mut c);
        say(&mut c, &key, k, "p");
        let seq = queue(&mut c, &key, "sleep 600");
        say(&mut c, &key, k, &format!("s;{seq}"));
        later(&mut c, Duration::from_secs(61));
        assert!(
            c.shells.map.contains_key(&key),
            "a running command keeps it"
        );
        say(&mut c, &key, k, "e;0;2f");
        c.touch_shell(&key);
        later(&mut c, Duration::from_secs(59));
        assert!(c.shells.map.contains_key(&key));
        later(&mut c, Duration::from_secs(62));
        assert!(!c.shells.map.contains_key(&key));
        assert!(
            c.table.get(k).is_some_and(|p| p.released),
            "its shell is ended"
        );
        // What its records held is given back; its shell's own record and output remain
        // until it is reaped.
        let p = c.table.get(k).unwrap();
        assert_eq!(c.table.memory.of(1000), p.meta + p.committed());
    }

    fn scan_all(chunks: &[&[u8]]) -> Vec<(Marker, u64, u64)> {
        let mut s = Scanner::default();
        let mut at = 0;
        let mut all = Vec::new();
        for c in chunks {
            all.extend(s.feed(N, at, c));
            at += c.len() as u64;
        }
        all
    }

    #[test]
    fn markers_are_found_with_their_offsets_across_reads() {
        let stream = b"hi\x1b]6973;s;abc123;7\x07out\r\n\x1b]6973;e;abc123;3;2f746d70\x07$ \x1b]6973;p;abc123\x07";
        let whole = scan_all(&[stream]);
        // Where each marker begins (its ESC) and ends (after its BEL).
        let spans: Vec<(u64, u64)> = (0..stream.len())
            .filter(|&i| stream[i..].starts_with(b"\x1b]6973"))
            .map(|i| {
                let bel = i + stream[i..].iter().position(|&b| b == 0x07).unwrap();
                (i as u64, bel as u64 + 1)
            })
            .collect();
        assert_eq!(spans.len(), 3);
        assert_eq!(
            whole,
            vec![
                (Marker::Start { seq: 7 }, spans[0].0, spans[0].1),
                (
                    Marker::End {
                        status: 3,
                        dir: b"/tmp".to_vec()
                    },
                    spans[1].0,
                    spans[1].1
                ),
                (Marker::Prompt, spans[2].0, spans[2].1),
            ]
        );
        // Cut anywhere, byte by byte: the same.
        let bytes: Vec<&[u8]> = stream.chunks(1).collect();
        assert_eq!(scan_all(&bytes), whole);
        let halves: Vec<&[u8]> = stream.chunks(10).collect();
        assert_eq!(scan_all(&halves), whole);
    }

    #[test]
    fn a_marker_with_another_nonce_or_a_broken_one_is_passed_over() {
        let forged = b"\x1b]6973;e;guess;0;2f\x07\x1b]6973;e;abc123;x;2f\x07\x1b]6973;p;abc123;extra\x07\x1b]0;title\x07\x1b]6973;e;abc123;0;2\x07";
        assert!(scan_all(&[forged]).is_empty());
        // An ESC inside a would-be marker starts a new one.
        let nested = b"\x1b]6973;e;ab\x1b]6973;p;abc123\x07";
        assert_eq!(
            scan_all(&[nested]),
            vec![(Marker::Prompt, 11, nested.len() as u64)]
        );
        // A sequence longer than any marker is dropped, and what follows still scans.
        let mut long = b"\x1b]6973;e;abc123;0;".to_vec();
        long.extend(std::iter::repeat_n(b'a', MARK_MAX));
        long.extend(b"\x07\x1b]6973;p;abc123\x07");
        let found = scan_all(&[&long]);
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].0, Marker::Prompt);
    }

    #[test]
    fn a_command_line_carries_nothing_the_shell_reads_but_escapes() {
        let opts = LineOpts {
            exec_dir: Some("/d ir".into()),
            strict: true,
            keep_symlinks: Some(false),
            ..LineOpts::default()
        };
        let tty = std::path::Path::new("/dev/pts/7");
        let line = command_line(4, "echo 'a' \"$B\"; rm -rf x\n!", &opts, (tty, 3), true);
        let text = String::from_utf8(line).unwrap();
        assert!(text.starts_with(" \\__execd_pre 4 '\\x65\\x63\\x68\\x6f\\x20"));
        let pts = "$'\\x2f\\x64\\x65\\x76\\x2f\\x70\\x74\\x73\\x2f\\x37'";
        assert!(text.ends_with(&format!(
            " s -P; __execd_chk=1; \\__execd_st 3 && \\builtin :; \\builtin eval -- \"$__execd_c\" 0<>{pts} 1>&0 2>&0\n"
        )));
        let payload = text.split('\'').nth(1).unwrap();
        assert!(payload
            .as_bytes()
            .chunks(4)
            .all(|c| c.len() == 4 && c.starts_with(b"\\x")));
        // Only its final newline ends a line.
        assert_eq!(text.matches('\n').count(), 1);
        let plain = command_line(1, "true", &LineOpts::default(), (tty, 0), false);
        assert_eq!(
            String::from_utf8(plain).unwrap(),
            format!(
                " \\__execd_pre 1 '\\x74\\x72\\x75\\x65' '' - .; \
                 \\builtin eval -- \"$__execd_c\" 0<>{pts}\n"
            )
        );
        // Every word in command position is quoted: no alias applies, and no reserved
        // word (`{`, `if`) is there for an alias of one to replace.
        for command in text
            .trim_end()
            .split(';')
            .flat_map(|c| c.split("&&"))
            .map(str::trim)
        {
            let first = command.split(' ').next().unwrap_or("");
            let quoted = first.is_empty() || first.starts_with('\\');
            assert!(quoted || first == "__execd_chk=1", "{command:?}");
        }
    }

    #[test]
    fn nonces_differ_per_shell_and_per_secret() {
        let a = nonce(&[1; 32], 1);
        assert_eq!(a.len(), 32);
        assert_ne!(a, nonce(&[1; 32], 2));
        assert_ne!(a, nonce(&[2; 32], 1));
        assert_eq!(a, nonce(&[1; 32], 1));
    }

    #[test]
    fn the_setup_is_one_line() {
        let line = setup_line("n0", std::path::Path::new("/tmp/a\nb"), false);
        assert_eq!(line.iter().filter(|&&b| b == b'\n').count(), 1);
        assert_eq!(line.last(), Some(&b'\n'));
        let text = String::from_utf8(line).unwrap();
        assert!(text.contains("\\x2f\\x74\\x6d\\x70\\x2f\\x61\\x0a\\x62"));
        assert!(text.contains("builtin set -P"));
    }
}
