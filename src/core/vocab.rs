//! The core's shared vocabulary: the words several rooms of `core/` pass to each other (what
//! a family does after a launch, what a parked request waits for, an approver's answer, a
//! shell line's options), kept below all of them so the core reads top to bottom with no
//! import circle: `gate`, `life`, `park`, `shell` and `launch` all take these from here,
//! and this room takes nothing from them (sozu's `command/` types crate is the model).

use std::path::PathBuf;
use std::time::Duration;

use serde_json::Value;

use super::table::{Key, SessionKey};

// Whence a request came.

/// The front door a request came through, as the audit's `via` says it (PROTOCOL 7.4):
/// JSON-RPC, HTTP, a WebSocket (a person at `/v1/shell/ws`), or `execctl mcp`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Via {
    #[default]
    Rpc,
    Http,
    Ws,
    Mcp,
}

impl Via {
    pub fn as_str(self) -> &'static str {
        match self {
            Via::Rpc => "rpc",
            Via::Http => "http",
            Via::Ws => "ws",
            Via::Mcp => "mcp",
        }
    }

    /// The door `as_str` names; an unknown name is `rpc` (an older state says none).
    pub fn named(name: &str) -> Via {
        [Via::Http, Via::Ws, Via::Mcp]
            .into_iter()
            .find(|v| v.as_str() == name)
            .unwrap_or(Via::Rpc)
    }
}

// What follows a launch.

/// What the family does once the command is started (or failed to start).
#[derive(Debug, Clone)]
pub enum After {
    /// ACP `terminal/create`: answer `{terminalId}`.
    Terminal,
    /// A line for a shell session (`shell/exec`, PROTOCOL 12.2): nothing is spawned for it;
    /// once admitted it is typed into the session's shell (started first if need be).
    ShellLine(Box<ShellExec>),
    /// A shell session's own bash, and what follows once it runs. The gate does not judge
    /// it: it runs nothing but the lines typed into it, each judged on its own.
    ShellStart(ShellThen),
    /// `bash/exec`.
    BashExec {
        async_mode: bool,
        /// Soft timeout in seconds: answer `running` after it (synchronous only).
        timeout: Option<f64>,
        /// Kill after this many seconds.
        hard_timeout: Option<f64>,
        max_len: usize,
        /// The call created its session: a failed start does not keep it.
        created_session: bool,
        /// `exec_dir`: the session's directory from now on, once the command started there.
        exec_dir: Option<PathBuf>,
    },
}

/// What an `exec` asked for besides its command.
#[derive(Debug, Clone, Default)]
pub struct LineOpts {
    pub exec_dir: Option<String>,
    /// `exec_dir` becomes the session's directory (the line opens the session).
    pub enter: bool,
    pub strict: bool,
    pub keep_symlinks: Option<bool>,
    pub hard_timeout: Option<Duration>,
}

/// An `exec` on its way through the gate: what its tail needs once the line is admitted.
#[derive(Debug, Clone)]
pub struct ShellExec {
    pub session_id: String,
    /// The session did not exist when it was asked for: the line creates it, in `dir`.
    pub creates: bool,
    /// The request named no session: the one it creates is one-shot (PROTOCOL 8).
    pub unnamed: bool,
    pub dir: PathBuf,
    pub async_mode: bool,
    /// Soft timeout: answer `running` after it (synchronous only).
    pub timeout: Option<Duration>,
    /// Its own `no_change_timeout`, else the session's.
    pub no_change_timeout: Option<Duration>,
    /// Cut `output` to `TRUNCATE_AT` characters.
    pub truncate: bool,
    pub opts: LineOpts,
}

/// What follows once a shell session's bash is started.
#[derive(Debug, Clone)]
pub enum ShellThen {
    /// `shell/sessions/create`: answer the session.
    Create,
    /// An `exec` whose line is queued in the session (`seq`): answer it, or wait.
    Exec(Box<ShellExec>, u64),
    /// The session's shell died and is started again; nobody waits for it. `fallback`:
    /// this is the second try, in `--workdir`, the last directory having failed.
    Restart { fallback: bool },
}

// What parked requests wait for.

/// What a parked request waits for.
#[derive(Debug, Clone)]
pub enum Wait {
    /// `terminal/wait_for_exit`.
    Exit(Key),
    /// `terminal/kill`: answered `{}` once the leader exited.
    Killed(Key),
    /// Synchronous `bash/exec`.
    BashExec { key: Key, max_len: usize },
    /// `bash/output` with `wait`.
    /// `screen`: the answer carries the command's screen (it keeps one: `keep_screen`).
    BashOutput {
        key: Key,
        from: [u64; 2],
        screen: bool,
    },
    /// `bash/kill`: answered once the command ended or the grace passed.
    BashKill(Key),
    /// `terminal/kill` with a signal of the client's: answered once the leader exited or
    /// the grace passed, saying which.
    Signalled(Key),
    /// A write with `wait`: answered once its input fits the stdin buffer.
    StdinRoom { key: Key, data: Vec<u8>, eof: bool },
    /// A request on command `seq` of a shell session (`shell/exec`, `wait`, `kill`): it
    /// waits on the session, whose shell may be restarted meanwhile.
    Shell {
        session: SessionKey,
        seq: u64,
        what: ShellWait,
    },
}

impl Wait {
    /// The process it waits on (none for a shell session's requests).
    pub fn key(&self) -> Option<Key> {
        match self {
            Wait::Exit(k) | Wait::Killed(k) | Wait::BashKill(k) | Wait::Signalled(k) => Some(*k),
            Wait::BashExec { key, .. }
            | Wait::BashOutput { key, .. }
            | Wait::StdinRoom { key, .. } => Some(*key),
            Wait::Shell { .. } => None,
        }
    }
}

/// What a request parked on a shell session waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShellWait {
    /// A synchronous `exec`: the command's end, its `no_change_timeout`, or it waiting
    /// for input. `truncate`: its answer's output is cut.
    Exec { truncate: bool },
    /// `wait`: the command's end.
    End,
    /// `kill`: the command's end.
    Kill,
    /// `view` following the command to its end (server-sent events): the view then.
    View,
}

// Approvals.

/// An approver's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    Approve,
    ApproveForSession,
    Reject,
}

impl Answer {
    pub fn as_str(self) -> &'static str {
        match self {
            Answer::Approve => "approve",
            Answer::ApproveForSession => "approve_for_session",
            Answer::Reject => "reject",
        }
    }

    /// Reads a Wire response to request `id`: `{request_id, response, feedback?}`. An error
    /// response, a malformed result, another `request_id` or an unknown `response` is a
    /// reject. Returns the answer and the feedback.
    pub fn from_response(id: &str, result: &Result<Value, Value>) -> (Answer, Option<String>) {
        let Ok(r) = result else {
            return (Answer::Reject, None);
        };
        let feedback = r
            .get("feedback")
            .and_then(Value::as_str)
            .map(|f| f.chars().take(4096).collect());
        let same = r.get("request_id").and_then(Value::as_str) == Some(id);
        let answer = match r.get("response").and_then(Value::as_str) {
            Some("approve") if same => Answer::Approve,
            Some("approve_for_session") if same => Answer::ApproveForSession,
            _ => Answer::Reject,
        };
        (answer, feedback)
    }
}

// Shell sessions' command channel.

/// The longest command an `exec` may send, in bytes (the line is four times as long).
pub const MAX_COMMAND: usize = 128 << 10;
/// The command channel's buffer: one command line, escaped, and room to spare.
pub const COMMAND_PIPE_BUFFER: usize = 4 * MAX_COMMAND + (16 << 10);
