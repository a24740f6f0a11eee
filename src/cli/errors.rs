//! execctl's failures and its exit statuses, in one place.
//!
//! Exit statuses follow docker's: a command's own status passes through (128+N when
//! signal N ended it); 125 is execctl's own failure (bad usage included) or the daemon's;
//! 126 a command that cannot be executed; 127 one that is not found; 124 a `--timeout`.
//!
//! A `Fail` is one sentence that says what went wrong and what to do. The JSON-RPC code
//! and data behind it are kept aside: `--verbose` appends them, `--json` prints them as an
//! object. No message ever shows a raw `(-32002)` by default.

use std::io;

use serde_json::{json, Value};

use crate::client::CallError;
use crate::wire::rpc::rule_words;

/// The command's status passes through; these are execctl's own.
pub const EXIT_TIMEOUT: u8 = 124;
/// execctl's own error, a usage error, or an error from the daemon.
pub const EXIT_FAILURE: u8 = 125;
/// The command was found but cannot be executed.
pub const EXIT_CANNOT_EXECUTE: u8 = 126;
/// The command was not found.
pub const EXIT_NOT_FOUND: u8 = 127;
/// execctl's output was closed under it (`| head`): as if SIGPIPE had ended it.
pub const EXIT_BROKEN_PIPE: u8 = 141;

/// A failure that ends execctl (or one item of a command that takes several).
#[derive(Debug)]
pub struct Fail {
    /// One sentence saying what to do; no trailing period needed, none added.
    pub message: String,
    /// The exit status it leads to.
    pub code: u8,
    /// The JSON-RPC error behind it, for `--verbose` and `--json` (boxed: a `Fail`
    /// travels in every `Err`).
    pub rpc: Option<Box<RpcDetail>>,
}

/// The JSON-RPC error a `Fail` came from.
#[derive(Debug, Clone)]
pub struct RpcDetail {
    pub code: i64,
    pub message: String,
    pub data: Option<Value>,
}

/// A result that may end execctl.
pub type Res<T> = Result<T, Fail>;

impl Fail {
    /// A failure of execctl itself (exit 125).
    pub fn new(message: impl Into<String>) -> Fail {
        Fail {
            message: message.into(),
            code: EXIT_FAILURE,
            rpc: None,
        }
    }

    /// Bad usage (exit 125, as docker's); the message says where the help is.
    pub fn usage(message: impl Into<String>) -> Fail {
        Fail::new(message)
    }

    /// The same failure with another exit status.
    pub fn with_code(mut self, code: u8) -> Fail {
        self.code = code;
        self
    }

    /// The error as `--json` prints it on stderr.
    pub fn to_json(&self) -> Value {
        let mut v = json!({ "error": { "message": self.message, "exit_status": self.code } });
        if let Some(r) = &self.rpc {
            v["error"]["rpc"] = json!({ "code": r.code, "message": r.message, "data": r.data });
        }
        v
    }

    /// The error as a person reads it; `verbose` adds the JSON-RPC error behind it.
    pub fn text(&self, verbose: bool) -> String {
        let mut s = self.message.clone();
        // A message that shows the error itself (`execctl call`) is not given it twice.
        let shown = |r: &RpcDetail| s.contains(&format!("error {}: {}", r.code, r.message));
        if let (true, Some(r)) = (verbose, self.rpc.as_ref().filter(|r| !shown(r))) {
            s.push_str(&format!(" [execd error {}: {}", r.code, r.message));
            if let Some(d) = &r.data {
                s.push_str(&format!(" {d}"));
            }
            s.push(']');
        }
        s
    }
}

impl From<io::Error> for Fail {
    fn from(e: io::Error) -> Self {
        // The transport said why the connection ended (an ssh link that failed, a daemon
        // that refused the peer): its words are the message.
        if let Some(why) = crate::client::closed_reason(&e) {
            return Fail::new(why);
        }
        Fail::new(format!(
            "{}; check that execd is still running (execctl status)",
            crate::wire::rpc::os_error_text(&e)
        ))
    }
}

impl From<CallError> for Fail {
    fn from(e: CallError) -> Self {
        daemon_error(e, None)
    }
}

/// The detail of a JSON-RPC error, if it is one.
pub fn detail(e: &CallError) -> Option<Box<RpcDetail>> {
    match e {
        CallError::Rpc {
            code,
            message,
            data,
        } => Some(Box::new(RpcDetail {
            code: *code,
            message: message.clone(),
            data: data.clone(),
        })),
        CallError::Io(_) => None,
    }
}

/// A field of an error's `data` as text.
fn data_str<'a>(data: &'a Option<Value>, field: &str) -> Option<&'a str> {
    data.as_ref()?.get(field)?.as_str()
}

/// Turns a daemon error into one sentence. `what` names the id or command the request
/// was about, when the caller knows it.
pub fn daemon_error(e: CallError, what: Option<&str>) -> Fail {
    let rpc = detail(&e);
    let (code, message, data) = match e {
        CallError::Io(e) => {
            return match e.kind() {
                _ if crate::client::closed_reason(&e).is_some() => Fail::from(e),
                io::ErrorKind::UnexpectedEof => Fail::new(
                    "execd closed the connection (it may have stopped or restarted); check it with: execctl status",
                ),
                _ => Fail::from(e),
            }
        }
        CallError::Rpc {
            code,
            message,
            data,
        } => (code, message, data),
    };
    let mut exit = EXIT_FAILURE;
    let text = match code {
        -32002 => match what {
            Some(id) => format!("no process or session {id:?} of yours; list them with: execctl ps"),
            None => format!("{message}; list processes with: execctl ps"),
        },
        -32003 => {
            let limit = data_str(&data, "limit").unwrap_or("a limit");
            let value = data
                .as_ref()
                .and_then(|d| d.get("value"))
                .map(|v| format!(" ({v})"))
                .unwrap_or_default();
            format!("execd refused: its {limit} limit{value} is reached; wait for commands to finish or raise it with execd --{limit}")
        }
        -32004 => {
            let program = data_str(&data, "program")
                .or(what)
                .unwrap_or("the command")
                .to_string();
            match data_str(&data, "errno") {
                Some("ENOENT") => {
                    exit = EXIT_NOT_FOUND;
                    format!("{program}: command not found")
                }
                Some("EACCES") | Some("EPERM") => {
                    exit = EXIT_CANNOT_EXECUTE;
                    format!("{program}: permission denied; check that it is executable")
                }
                Some("ENOEXEC") => {
                    exit = EXIT_CANNOT_EXECUTE;
                    format!("{program}: not an executable format; run scripts through an interpreter or add a #! line")
                }
                Some("EISDIR") => {
                    exit = EXIT_CANNOT_EXECUTE;
                    format!("{program}: is a directory")
                }
                _ => {
                    exit = EXIT_CANNOT_EXECUTE;
                    format!("{program}: cannot be started: {message}")
                }
            }
        }
        -32005 => {
            let rule = rule_words(data_str(&data, "rule").unwrap_or("?"));
            match data_str(&data, "justification") {
                Some(j) => format!("denied by {rule}: {j}"),
                None => format!("denied by {rule}; see it with: execctl policy check"),
            }
        }
        -32006 => {
            let rule = rule_words(data_str(&data, "rule").unwrap_or("?"));
            match data_str(&data, "reason") {
                Some("no approver") => format!(
                    "{rule} asks for approval and no approver is connected; start one with: execctl approve"
                ),
                Some("timeout") => format!(
                    "{rule} asks for approval and nobody answered in time; try again while an approver watches (execctl approve)"
                ),
                _ => match data_str(&data, "feedback") {
                    Some(f) => format!("not approved ({rule}): {f}"),
                    None => format!("not approved ({rule}); ask the approver or change the command"),
                },
            }
        }
        -32007 => "execd is shutting down; start it again and retry".to_string(),
        -32601 => format!(
            "{message}: this execd does not offer it; it may be older than execctl (compare execd --version)"
        ),
        -32602 => match (data_str(&data, "field"), data_str(&data, "reason")) {
            (Some(f), Some(r)) => format!("execd refused {f}: {r}"),
            _ => format!("execd refused the request: {message}"),
        },
        -32800 => "the request was cancelled".to_string(),
        _ => format!("execd: {message}"),
    };
    Fail {
        message: text,
        code: exit,
        rpc,
    }
}

/// The shell convention: the exit code, or 128+N when signal N ended the command.
pub fn exit_status(exit_code: &Value, signal: &Value) -> u8 {
    if let Some(c) = exit_code.as_i64() {
        return c.clamp(0, 255) as u8;
    }
    let n = signal
        .as_str()
        .and_then(crate::types::signal_number)
        .unwrap_or(0);
    if n == 0 {
        return EXIT_FAILURE;
    }
    (128 + n).clamp(0, 255) as u8
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rpc(code: i64, data: Value) -> CallError {
        CallError::Rpc {
            code,
            message: "m".into(),
            data: Some(data),
        }
    }

    #[test]
    fn exit_status_follows_the_shell() {
        assert_eq!(exit_status(&json!(3), &Value::Null), 3);
        assert_eq!(exit_status(&Value::Null, &json!("SIGKILL")), 137);
        assert_eq!(exit_status(&Value::Null, &json!("SIGSEGV")), 139);
        assert_eq!(exit_status(&Value::Null, &json!("SIGINT")), 130);
        assert_eq!(exit_status(&Value::Null, &Value::Null), EXIT_FAILURE);
    }

    #[test]
    fn spawn_errors_become_126_and_127_with_the_program_named() {
        let f = daemon_error(
            rpc(-32004, json!({"program": "nosuchcmd", "errno": "ENOENT"})),
            None,
        );
        assert_eq!(
            (f.code, f.message.as_str()),
            (127, "nosuchcmd: command not found")
        );
        let f = daemon_error(
            rpc(-32004, json!({"program": "/etc/passwd", "errno": "EACCES"})),
            None,
        );
        assert_eq!(f.code, 126);
        assert!(f.message.starts_with("/etc/passwd: permission denied"));
    }

    #[test]
    fn messages_hide_codes_unless_verbose() {
        let f = daemon_error(rpc(-32002, json!(null)), Some("term_9"));
        assert_eq!(f.code, EXIT_FAILURE);
        assert!(!f.text(false).contains("-32002"), "{}", f.text(false));
        assert!(f.text(true).contains("-32002"), "{}", f.text(true));
        assert_eq!(f.to_json()["error"]["rpc"]["code"], -32002);
        // A message that shows the error already (execctl call) says it once with -v.
        let mut f = daemon_error(rpc(-32002, json!(null)), None);
        f.message = "execd answered error -32002: m null".into();
        assert_eq!(f.text(true), f.message);
        // The directory case of a failed spawn.
        let f = daemon_error(
            rpc(-32004, json!({"program": "/tmp", "errno": "EISDIR"})),
            None,
        );
        assert_eq!((f.code, f.message.as_str()), (126, "/tmp: is a directory"));
    }
}
