//! The ACP terminal methods (protocol v1): `initialize`, `terminal/create`, `output`,
//! `wait_for_exit`, `kill`, `release`, and the `terminal/list` extension. Params in, results
//! out; the server parks what has to wait.
//!
//! A terminal merges stdout and stderr into one pipe so their order is kept, retains the
//! newest `outputByteLimit` bytes, and belongs to the `sessionId` it was created under:
//! naming it with another session is `-32002`, like a foreign or unknown id.

use serde_json::{json, Map, Value};

use crate::process::{Program, Stdio3};
use crate::rpc::{Params, RpcError};
use crate::server::{validate_dir, validate_env, Caller, Launch, Outcome, Server, Wait};
use crate::table::{Family, Key, KillReason, Proc};

/// The ACP protocol version spoken.
pub const PROTOCOL_VERSION: u64 = 1;

/// Whether `command` may be executed directly without a shell: one plain word of letters,
/// digits and `_ . / + - , : @ %`.
pub fn plain_word(command: &str) -> bool {
    !command.is_empty()
        && command
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_./+-,:@%".contains(&b))
}

/// `initialize`: what execd is and what it allows.
pub fn initialize(s: &mut Server, p: &Params) -> Result<Value, RpcError> {
    if p.opt_value("protocolVersion").is_some() {
        p.opt_u64("protocolVersion")?;
    }
    let c = &s.cfg;
    Ok(json!({
        "protocolVersion": PROTOCOL_VERSION,
        "clientCapabilities": { "terminal": true },
        "serverInfo": { "name": "execd", "version": env!("CARGO_PKG_VERSION") },
        "limits": {
            "maxClients": c.max_clients,
            "maxProcesses": c.max_processes,
            "maxRetained": c.max_retained,
            "maxMessage": c.max_message,
            "clientBuffer": c.client_buffer,
            "outputLimit": c.output_limit,
            "maxOutputLimit": c.max_output_limit,
            "stdinBuffer": c.stdin_buffer,
            "killGraceMs": c.kill_grace.as_millis() as u64,
            "sessionIdleMs": c.session_idle.as_millis() as u64,
            "maxSessions": c.max_sessions,
        },
        "_meta": { "execd": {
            "uptimeMs": s.now.duration_since(s.started).as_millis() as u64,
            "pid": std::process::id(),
            "socket": s.cfg.socket.display().to_string(),
            "running": s.table.running(),
            "sessions": s.table.sessions.len(),
            "clients": s.conns.len(),
        }},
    }))
}

/// Parses ACP's `env: [{name, value}]`.
fn env_list(p: &Params) -> Result<Vec<(String, String)>, RpcError> {
    let Some(v) = p.opt_value("env") else {
        return Ok(Vec::new());
    };
    let Value::Array(items) = v else {
        return Err(RpcError::invalid_params(
            "env",
            "expected an array of {name, value}",
        ));
    };
    items
        .iter()
        .map(|item| {
            let name = item.get("name").and_then(Value::as_str);
            let value = item.get("value").and_then(Value::as_str);
            match (name, value) {
                (Some(n), Some(v)) => Ok((n.to_string(), v.to_string())),
                _ => Err(RpcError::invalid_params(
                    "env",
                    "each entry must be {\"name\": string, \"value\": string}",
                )),
            }
        })
        .collect()
}

/// `terminal/create`: starts the command and answers with its id at once.
pub fn create(s: &mut Server, caller: &Caller, p: &Params) -> Result<Value, RpcError> {
    let session_id = p.str("sessionId")?;
    let command = p.str("command")?;
    if command.is_empty() {
        return Err(RpcError::invalid_params("command", "empty"));
    }
    let args: Vec<String> = p
        .opt_str_array("args")?
        .unwrap_or_default()
        .into_iter()
        .map(String::from)
        .collect();
    let env = env_list(p)?;
    validate_env("env", &env)?;
    let cwd = match p.opt_str("cwd")? {
        Some(dir) => validate_dir("cwd", dir)?,
        None => s.cfg.workdir.clone(),
    };
    let ring_capacity = match p.opt_u64("outputByteLimit")? {
        Some(n) => n.min(s.cfg.max_output_limit as u64) as usize,
        None => s.cfg.output_limit,
    };
    let program = if !args.is_empty() || plain_word(command) {
        Program::Direct {
            program: command.to_string(),
            args: args.clone(),
        }
    } else {
        Program::Shell {
            shell: s.cfg.shell.clone(),
            line: command.to_string(),
        }
    };
    let key = s.launch(Launch {
        family: Family::Terminal {
            session_id: session_id.to_string(),
        },
        owner: caller.uid,
        conn: caller.conn,
        program,
        command: command.to_string(),
        args,
        env,
        cwd,
        stdio: Stdio3::Merged,
        ring_capacity,
        prefix: "term",
    })?;
    let id = s.table.get(key).map(|p| p.id.clone()).unwrap_or_default();
    Ok(json!({ "terminalId": id }))
}

/// Finds the caller's terminal named by `terminalId` under `sessionId`.
fn lookup(s: &Server, caller: &Caller, p: &Params) -> Result<Key, RpcError> {
    let session_id = p.str("sessionId")?;
    let terminal_id = p.str("terminalId")?;
    s.table
        .find(terminal_id, caller.uid)
        .filter(|k| {
            s.table.get(*k).is_some_and(
                |t| matches!(&t.family, Family::Terminal { session_id: sid } if sid == session_id),
            )
        })
        .ok_or_else(|| RpcError::not_found("terminal", terminal_id))
}

/// `{exitCode, signal}` of an exited process (both null while it runs).
pub fn exit_status(p: &Proc) -> Value {
    let (code, signal) = p.exit_fields();
    json!({ "exitCode": code, "signal": signal })
}

/// `terminal/output`: the retained tail, never blocking.
pub fn output(s: &mut Server, caller: &Caller, p: &Params) -> Result<Value, RpcError> {
    let key = lookup(s, caller, p)?;
    let t = s
        .table
        .get(key)
        .ok_or_else(|| RpcError::internal("terminal vanished"))?;
    let stream = &t.streams[0];
    let ring = &stream.ring;
    let (from, to) = ring.utf8_window(ring.start(), ring.end(), stream.open());
    let mut out = Map::new();
    out.insert("output".into(), ring.text(from, to).into());
    out.insert("truncated".into(), (ring.start() > 0).into());
    if t.exit.is_some() {
        out.insert("exitStatus".into(), exit_status(t));
    }
    Ok(Value::Object(out))
}

/// `terminal/wait_for_exit`: parked until the command exits.
pub fn wait_for_exit(s: &mut Server, caller: &Caller, p: &Params) -> Outcome {
    match lookup(s, caller, p) {
        Ok(key) => Outcome::Park {
            wait: Wait::Exit(key),
            deadline: None,
        },
        Err(e) => Outcome::Done(Err(e)),
    }
}

/// `terminal/kill`: group SIGTERM, SIGKILL after the grace; answered once the leader exited.
pub fn kill(s: &mut Server, caller: &Caller, p: &Params) -> Outcome {
    let key = match lookup(s, caller, p) {
        Ok(k) => k,
        Err(e) => return Outcome::Done(Err(e)),
    };
    s.kill_proc(key, KillReason::Killed);
    Outcome::Park {
        wait: Wait::Killed(key),
        deadline: None,
    }
}

/// `terminal/release`: kills what runs and forgets the id.
pub fn release(s: &mut Server, caller: &Caller, p: &Params) -> Result<Value, RpcError> {
    let key = lookup(s, caller, p)?;
    s.release(key);
    Ok(json!({}))
}

/// Rusage and duration of an exited process, under `_meta.execd`.
pub fn usage_meta(p: &Proc) -> Value {
    let Some(e) = &p.exit else { return Value::Null };
    json!({
        "durationMs": p.duration().as_millis() as u64,
        "userMs": e.usage.user.as_millis() as u64,
        "systemMs": e.usage.system.as_millis() as u64,
        "maxRssKb": e.usage.max_rss_kb,
    })
}

/// `terminal/list` (extension): the caller's terminals, newest first.
pub fn list(s: &mut Server, caller: &Caller, p: &Params) -> Result<Value, RpcError> {
    let only = p.opt_str("sessionId")?;
    let terminals: Vec<Value> = s
        .table
        .list(caller.uid)
        .into_iter()
        .filter(|t| matches!(&t.family, Family::Terminal { session_id } if only.is_none_or(|o| o == session_id)))
        .map(|t| {
            let mut v = json!({
                "terminalId": t.id,
                "sessionId": t.session_id(),
                "command": t.command,
                "args": t.args,
                "cwd": t.cwd.display().to_string(),
                "pid": t.pid,
                "startedAt": crate::rpc::rfc3339(t.started_wall),
                "outputBytes": t.output_bytes(),
            });
            if t.exit.is_some() {
                let mut status = exit_status(t);
                status["_meta"] = json!({ "execd": usage_meta(t) });
                v["exitStatus"] = status;
            }
            v
        })
        .collect();
    Ok(json!({ "terminals": terminals }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_words_run_without_a_shell() {
        for w in [
            "ls",
            "/bin/true",
            "cargo-nextest",
            "a_b.c+d,e:f@g%h",
            "x86_64",
        ] {
            assert!(plain_word(w), "{w}");
        }
        for w in ["", "ls -l", "echo $HOME", "a;b", "a|b", "a'b", "é"] {
            assert!(!plain_word(w), "{w}");
        }
    }
}
