//! `execctl sessions` (list, close, prune): the caller's bash and shell sessions.

use serde_json::{json, Value};

use super::args::Args;
use super::connect::Ctx;
use super::errors::{Fail, Res, EXIT_FAILURE};
use super::output::{self, warn};
use crate::client::Client;

/// A bash session as `sessions` shows it.
fn session_view(s: &Value) -> Value {
    json!({
        "id": s["session_id"], "kind": "bash", "dir": s["working_dir"],
        "commands": s["command_count"], "running": s["current_command"],
        "created_at": s["created_at"], "last_used_at": s["last_used_at"],
    })
}

/// A shell session (`shell/sessions` gives them by id) as `sessions` shows it.
fn shell_view(id: &str, s: &Value) -> Value {
    json!({
        "id": id, "kind": "shell", "dir": s["working_dir"],
        "commands": s["command_count"], "running": s["current_command"],
        "created_at": s["created_at"], "last_used_at": s["last_used_at"],
    })
}

/// Every session of the caller, bash ones then shell ones.
fn all_sessions(c: &mut Client) -> Res<Vec<Value>> {
    let list = c.call("bash/sessions", json!({}))?;
    let mut sessions: Vec<Value> = list
        .as_array()
        .into_iter()
        .flatten()
        .map(session_view)
        .collect();
    let shells = c.call("shell/sessions", json!({}))?;
    if let Some(m) = shells["sessions"].as_object() {
        sessions.extend(m.iter().map(|(id, s)| shell_view(id, s)));
    }
    Ok(sessions)
}

/// `execctl sessions`.
pub fn list(ctx: &Ctx, p: &Args) -> Res<u8> {
    if let Some(a) = p.operands.first() {
        let known = ["close", "prune", "list", "ls"];
        let hint = super::args::did_you_mean(a, known.into_iter())
            .map(|s| format!("did you mean {s}?"))
            .unwrap_or_else(|| "use: execctl sessions [close ID... | prune]".into());
        return Err(Fail::usage(format!(
            "unknown sessions action {a:?}; {hint}"
        )));
    }
    let mut c = ctx.connect()?;
    let sessions = all_sessions(&mut c)?;
    if ctx.json {
        output::print_json(&json!({ "sessions": sessions }))?;
        return Ok(0);
    }
    let rows: Vec<Vec<String>> = sessions
        .iter()
        .map(|s| {
            // Ids, directories and commands are whatever the agent sent: shown escaped,
            // so a newline or an escape sequence cannot forge or hide a row.
            let shown = |k: &str, none: &str| output::visible(s[k].as_str().unwrap_or(none));
            vec![
                shown("id", ""),
                shown("kind", ""),
                s["commands"].to_string(),
                output::age(s["created_at"].as_str().unwrap_or("")),
                output::age(s["last_used_at"].as_str().unwrap_or("")),
                shown("dir", ""),
                shown("running", "-"),
            ]
        })
        .collect();
    output::table(
        &[
            "SESSION", "KIND", "COMMANDS", "AGE", "IDLE", "DIR", "RUNNING",
        ],
        &rows,
        None,
        &[],
    )?;
    Ok(0)
}

/// Closes sessions by id; prints each one closed. Exit 125 if any could not be.
fn close_all(ctx: &Ctx, c: &mut Client, ids: &[String]) -> Res<u8> {
    let mut code = 0;
    let mut closed = Vec::new();
    for id in ids {
        // A bash session of that name first, else a shell session.
        let answer = match c.call("bash/sessions/close", json!({"session_id": id})) {
            Err(e) if e.code() == Some(-32002) => c.call("shell/sessions/close", json!({"id": id})),
            other => other,
        };
        match answer {
            Ok(_) => {
                if !ctx.json {
                    output::print(&format!("{}\n", output::visible(id)))?;
                }
                closed.push(id.clone());
            }
            Err(e) => {
                code = EXIT_FAILURE;
                let f = match e.code() {
                    Some(-32002) => Fail::new(format!(
                        "no session {id:?} of yours; list them with: execctl sessions"
                    )),
                    _ => Fail::from(e),
                };
                warn(&f.text(ctx.verbose));
            }
        }
    }
    if ctx.json {
        output::print_json(&json!({ "closed": closed }))?;
    }
    Ok(code)
}

/// `execctl sessions close ID...`.
pub fn close(ctx: &Ctx, p: &Args) -> Res<u8> {
    if p.operands.is_empty() {
        return Err(Fail::usage(
            "sessions close needs session ids; list them with: execctl sessions",
        ));
    }
    let mut c = ctx.connect()?;
    close_all(ctx, &mut c, &p.operands)
}

/// `execctl sessions prune`: closes every session of the caller with nothing running.
pub fn prune(ctx: &Ctx, p: &Args) -> Res<u8> {
    if let Some(a) = p.operands.first() {
        return Err(Fail::usage(format!(
            "sessions prune takes no operand, got {a:?}"
        )));
    }
    let mut c = ctx.connect()?;
    let idle: Vec<String> = all_sessions(&mut c)?
        .iter()
        .filter(|s| s["running"].is_null())
        .filter_map(|s| s["id"].as_str().map(str::to_string))
        .collect();
    close_all(ctx, &mut c, &idle)
}
