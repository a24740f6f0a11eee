//! `execctl ps`: the caller's processes, terminals, bash commands and shell sessions'
//! shells alike.
//!
//! One shape per thing, whatever family it comes from: a process is
//! `{id, kind, session, pid, state, exit_code, signal, started_at, duration_ms, cwd,
//! command, argv}` with `state` one of running, input (running, and waiting for input
//! nobody gave it: PROTOCOL 12.3), exited, killed, timed_out. `--json`
//! output uses snake_case keys and puts lists under a named key (`processes`).

use std::time::{Duration, SystemTime};

use serde_json::{json, Value};

use super::args::Args;
use super::connect::{self, Ctx};
use super::errors::{Fail, Res};
use super::output::{self};
use crate::client::Client;

/// The one state vocabulary: running, exited, killed, timed_out.
pub fn state(running: bool, status: Option<&str>, signal: &Value) -> &'static str {
    match (running, status) {
        (true, _) => "running",
        (_, Some("timed_out")) => "timed_out",
        (_, Some("killed")) => "killed",
        _ if !signal.is_null() => "killed",
        _ => "exited",
    }
}

/// How long it has run: its recorded duration once exited, else since its start.
fn duration_ms(started_at: &Value, recorded: &Value) -> Value {
    if recorded.is_u64() {
        return recorded.clone();
    }
    let started = started_at
        .as_str()
        .and_then(crate::wire::encode::parse_rfc3339);
    match started {
        Some(t) => json!(SystemTime::now()
            .duration_since(t)
            .unwrap_or_default()
            .as_millis() as u64),
        None => Value::Null,
    }
}

/// `running`, or `input` when the command waits for input.
fn live(state: &'static str, waiting: bool) -> &'static str {
    if state == "running" && waiting {
        "input"
    } else {
        state
    }
}

/// A terminal as `ps` shows it.
pub fn terminal_process(t: &Value) -> Value {
    let exit = &t["exitStatus"];
    let mut argv = vec![t["command"].clone()];
    argv.extend(t["args"].as_array().cloned().unwrap_or_default());
    let words: Vec<&str> = argv.iter().map(|a| a.as_str().unwrap_or("")).collect();
    json!({
        "id": t["terminalId"], "kind": "terminal", "session": t["sessionId"], "pid": t["pid"],
        "state": live(
            state(exit.is_null(), None, &exit["signal"]),
            t["_meta"]["execd"]["waitingForInput"] == true,
        ),
        "exit_code": exit["exitCode"], "signal": exit["signal"],
        "started_at": t["startedAt"],
        "duration_ms": duration_ms(&t["startedAt"], &exit["_meta"]["execd"]["durationMs"]),
        "cwd": t["cwd"],
        "command": output::quoted_line(words.iter().copied()),
        "argv": argv,
        "sandbox": t["_meta"]["execd"]["sandbox"],
    })
}

/// A bash command as `ps` shows it.
pub fn bash_process(b: &Value) -> Value {
    let signal = b.get("signal").cloned().unwrap_or(Value::Null);
    json!({
        "id": b["command_id"], "kind": "bash", "session": b["session_id"], "pid": b["pid"],
        "state": live(
            state(b["status"] == "running", b["status"].as_str(), &signal),
            b["waiting_for_input"] == true,
        ),
        "exit_code": b["exit_code"], "signal": signal,
        "started_at": b["started_at"],
        "duration_ms": duration_ms(&b["started_at"], &b["_meta"]["execd"]["durationMs"]),
        "cwd": b["cwd"],
        "command": b["command"],
        "argv": Value::Null,
        "sandbox": b["sandbox"],
    })
}

/// A shell session's shell as `ps` shows it: running while the session has one, its
/// command the one running in it (or none).
pub fn shell_process(id: &str, s: &Value) -> Value {
    let running = !s["process_id"].is_null();
    let command = match s["current_command"].as_str() {
        Some(c) => c.to_string(),
        None => "(shell at its prompt)".to_string(),
    };
    json!({
        "id": s["process_id"], "kind": "shell", "session": id, "pid": s["pid"],
        "state": state(running, Some(if running { "running" } else { "completed" }), &Value::Null),
        "exit_code": Value::Null, "signal": Value::Null,
        "started_at": s["created_at"],
        "duration_ms": duration_ms(&s["created_at"], &Value::Null),
        "cwd": s["working_dir"],
        "command": command,
        "argv": Value::Null,
        "sandbox": s["sandbox"],
    })
}

/// Every process of the caller, newest first (optionally of one session only).
pub fn processes(c: &mut Client, session: Option<&str>) -> Res<Vec<Value>> {
    let (tf, bf) = match session {
        Some(s) => (json!({"sessionId": s}), json!({"session_id": s})),
        None => (json!({}), json!({})),
    };
    let terms = connect::list_all(c, "terminal/list", "terminals", tf)?;
    let cmds = connect::list_all(c, "bash/commands", "commands", bf)?;
    let mut all: Vec<Value> = terms.iter().map(terminal_process).collect();
    all.extend(cmds.iter().map(bash_process));
    let shells = c.call("shell/sessions", json!({}))?;
    if let Some(m) = shells["sessions"].as_object() {
        all.extend(
            m.iter()
                .filter(|(id, _)| session.is_none_or(|s| s == id.as_str()))
                .map(|(id, s)| shell_process(id, s)),
        );
    }
    let number = |v: &Value| {
        v["id"]
            .as_str()
            .and_then(|s| s.rsplit('_').next()?.parse::<u64>().ok())
    };
    all.sort_by(|a, b| {
        b["started_at"]
            .as_str()
            .cmp(&a["started_at"].as_str())
            .then_with(|| number(b).cmp(&number(a)))
    });
    Ok(all)
}

pub fn no_operands(p: &Args, what: &str) -> Res<()> {
    match p.operands.first() {
        Some(a) => Err(Fail::usage(format!(
            "{what} takes no operand, got {a:?}; see: execctl help {what}"
        ))),
        None => Ok(()),
    }
}

/// `execctl ps`.
pub fn ps(ctx: &Ctx, p: &Args) -> Res<u8> {
    no_operands(p, "ps")?;
    let mut c = ctx.connect()?;
    let mut all = processes(&mut c, p.value("--session"))?;
    if p.has("--running") {
        all.retain(|x| x["state"] == "running" || x["state"] == "input");
    }
    if p.has("--quiet") {
        let ids: String = all
            .iter()
            .map(|x| format!("{}\n", x["id"].as_str().unwrap_or("")))
            .collect();
        output::print(&ids)?;
        return Ok(0);
    }
    if ctx.json {
        output::print_json(&json!({ "processes": all }))?;
        return Ok(0);
    }
    let long = p.has("--long");
    let rows: Vec<Vec<String>> = all
        .iter()
        .map(|x| {
            let exit = match (&x["exit_code"], &x["signal"]) {
                (Value::Number(n), _) => n.to_string(),
                (_, Value::String(s)) => s.clone(),
                _ => "-".into(),
            };
            let duration = x["duration_ms"].as_u64().map_or("-".into(), |ms| {
                output::human_duration(Duration::from_millis(ms))
            });
            // Session ids and commands are whatever the agent sent: shown escaped, so a
            // newline or an escape sequence cannot forge or hide a row.
            let shown = |k: &str| output::visible(x[k].as_str().unwrap_or(""));
            let mut row = vec![
                shown("id"),
                shown("session"),
                x["pid"].to_string(),
                x["state"].as_str().unwrap_or("").into(),
                exit,
                output::age(x["started_at"].as_str().unwrap_or("")),
                duration,
            ];
            if long {
                row.push(sandbox_cell(&x["sandbox"]));
            }
            row.push(shown("command"));
            row
        })
        .collect();
    if long {
        output::table(
            &[
                "ID", "SESSION", "PID", "STATE", "EXIT", "AGE", "DURATION", "SANDBOX", "COMMAND",
            ],
            &rows,
            Some(3),
            &[1, 6, 5, 2],
        )?;
        return Ok(0);
    }
    output::table(
        &[
            "ID", "SESSION", "PID", "STATE", "EXIT", "AGE", "DURATION", "COMMAND",
        ],
        &rows,
        Some(3),
        // On a narrow terminal the command stays, cut: SESSION, DURATION, AGE and PID
        // give way first.
        &[1, 6, 5, 2],
    )?;
    Ok(0)
}

/// A sandbox as `ps -l` shows it: its name and `$CWD` (`workspace:/w`), `off`, or `-`
/// when the daemon does not say.
fn sandbox_cell(s: &Value) -> String {
    match (s["name"].as_str(), s["cwd"].as_str()) {
        (None, _) => "-".into(),
        (Some(n), Some(cwd)) => output::visible(&format!("{n}:{cwd}")),
        (Some(n), None) => output::visible(n),
    }
}

pub fn one_id<'a>(p: &'a Args, what: &str) -> Res<&'a str> {
    match p.operands.as_slice() {
        [id] => Ok(id),
        [] => Err(Fail::usage(format!(
            "{what} needs a process id; list them with: execctl ps"
        ))),
        _ => Err(Fail::usage(format!("{what} takes one process id"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_state_vocabulary() {
        assert_eq!(state(true, Some("running"), &Value::Null), "running");
        assert_eq!(state(false, Some("completed"), &Value::Null), "exited");
        assert_eq!(state(false, Some("completed"), &json!("SIGKILL")), "killed");
        assert_eq!(
            state(false, Some("timed_out"), &json!("SIGTERM")),
            "timed_out"
        );
        assert_eq!(state(false, None, &json!("SIGTERM")), "killed");
        let t = terminal_process(&json!({"terminalId": "term_1", "sessionId": "s",
            "command": "sh", "args": ["-c", "exit 5"], "pid": 9, "startedAt": "x",
            "exitStatus": {"exitCode": 5, "signal": null, "_meta": {"execd": {"durationMs": 7}}}}));
        assert_eq!(t["command"], "sh -c 'exit 5'");
        assert_eq!(t["state"], "exited");
        assert_eq!(t["duration_ms"], 7);
    }
}
