//! Reaching the daemon: the global options (`Ctx`), connecting, reading paged listings to
//! their end, and finding which family and session an id belongs to.

use std::path::PathBuf;

use serde_json::{json, Value};

use super::errors::{daemon_error, Fail, Res};
use crate::client::Client;

/// The global options every subcommand sees.
#[derive(Debug, Clone)]
pub struct Ctx {
    /// The daemon's socket, resolved as execd resolves it.
    pub socket: PathBuf,
    /// `--json`: results and errors as JSON.
    pub json: bool,
    /// `--verbose`: errors carry the daemon's code and data.
    pub verbose: bool,
}

impl Ctx {
    /// A connection with no read timeout (execctl waits as long as its command runs).
    pub fn connect(&self) -> Res<Client> {
        match Client::connect(&self.socket) {
            Ok(mut c) => {
                c.timeout = None;
                Ok(c)
            }
            Err(e) => Err(self.unreachable(&e)),
        }
    }

    /// Why connecting to the socket failed, said so a person knows what to do: no daemon
    /// there (start one), or a daemon that does not let this user in (who may).
    pub fn unreachable(&self, e: &std::io::Error) -> Fail {
        let path = self.socket.display();
        let why = crate::wire::rpc::os_error_text(e);
        if e.kind() != std::io::ErrorKind::PermissionDenied {
            return Fail::new(format!(
                "cannot connect to execd at {path} ({why}); start it with: execd --socket {path}"
            ));
        }
        use std::os::unix::fs::MetadataExt;
        let uid = crate::sys::ids::current_uid();
        let owner = std::fs::metadata(&self.socket)
            .map(|m| {
                format!(
                    " (mode {:04o}, owner uid {}, group {})",
                    m.mode() & 0o7777,
                    m.uid(),
                    m.gid()
                )
            })
            .unwrap_or_default();
        Fail::new(format!(
            "execd's socket at {path}{owner} does not let uid {uid} in ({why}); its owner can \
             allow it: execd --allow-uid {uid}, or --socket-mode 0660 with --socket-group GROUP"
        ))
    }
}

/// Which family a process belongs to, with the session its methods need.
#[derive(Debug, Clone)]
pub enum Target {
    Terminal { id: String, session: String },
    Bash { id: String, session: String },
}

impl Target {
    pub fn id(&self) -> &str {
        match self {
            Target::Terminal { id, .. } | Target::Bash { id, .. } => id,
        }
    }
}

/// Every entry of a paged listing (`terminal/list` under `terminals`, `bash/commands`
/// under `commands`), following its cursor to the end. `filter` adds params (a session).
pub fn list_all(c: &mut Client, method: &str, key: &str, filter: Value) -> Res<Vec<Value>> {
    let next_field = if method == "terminal/list" {
        "nextCursor"
    } else {
        "next_cursor"
    };
    let mut all = Vec::new();
    let mut cursor: Option<Value> = None;
    loop {
        let mut params = filter.clone();
        params["limit"] = json!(4096);
        if let Some(c) = cursor.take() {
            params["cursor"] = c;
        }
        let page = c.call(method, params)?;
        all.extend(page[key].as_array().cloned().unwrap_or_default());
        match page.get(next_field) {
            Some(Value::String(next)) => cursor = Some(json!(next)),
            _ => break,
        }
    }
    Ok(all)
}

/// Every terminal of the caller.
pub fn terminals(c: &mut Client) -> Res<Vec<Value>> {
    list_all(c, "terminal/list", "terminals", json!({}))
}

/// Every bash command of the caller.
pub fn commands(c: &mut Client) -> Res<Vec<Value>> {
    list_all(c, "bash/commands", "commands", json!({}))
}

/// A process as a listing shows it, with the family it came from.
pub fn locate_in(terms: &[Value], cmds: &[Value], id: &str) -> Option<(Target, Value)> {
    if let Some(t) = terms.iter().find(|t| t["terminalId"] == id) {
        let target = Target::Terminal {
            id: id.to_string(),
            session: t["sessionId"].as_str().unwrap_or_default().to_string(),
        };
        return Some((target, t.clone()));
    }
    let b = cmds.iter().find(|b| b["command_id"] == id)?;
    let target = Target::Bash {
        id: id.to_string(),
        session: b["session_id"].as_str().unwrap_or_default().to_string(),
    };
    Some((target, b.clone()))
}

/// Finds the process `id`: its family, session and listing entry.
pub fn locate(c: &mut Client, id: &str) -> Res<(Target, Value)> {
    // Ids name their family (`term_`, `cmd_`); list only that one when they do.
    let terms = if id.starts_with("cmd_") {
        Vec::new()
    } else {
        terminals(c)?
    };
    let cmds = if id.starts_with("term_") {
        Vec::new()
    } else {
        commands(c)?
    };
    locate_in(&terms, &cmds, id).ok_or_else(|| not_found(id))
}

/// The failure for an id that names nothing of the caller's.
pub fn not_found(id: &str) -> Fail {
    Fail::new(format!(
        "no process {id:?} of yours; list them with: execctl ps"
    ))
}

/// A daemon error about `id`, in one sentence.
pub fn about(id: &str) -> impl Fn(crate::client::CallError) -> Fail + '_ {
    move |e| daemon_error(e, Some(id))
}
