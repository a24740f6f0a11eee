//! Ending things: `kill`, `release` and `sessions` (list, close, prune).
//!
//! `kill` without a signal is the daemon's kill as a person expects it: SIGTERM, and
//! SIGKILL for what outlives the grace; it says which one ended each command, and that a
//! command had already exited (not an error). With a signal it sends that one only. It
//! works alike on terminals (`terminal/kill` with the `_meta.execd.signal` extension) and
//! bash commands (`bash/kill`).

use serde_json::{json, Value};

use super::args::Args;
use super::connect::{self, Ctx, Target};
use super::errors::{Fail, Res, EXIT_FAILURE};
use super::output::{self, warn};
use crate::client::Client;

/// Splits `-9`, `-KILL` and `-SIGKILL` (before `--`) from the other arguments of `kill`.
pub fn signal_shorthand(args: &[String]) -> (Option<String>, Vec<String>) {
    let mut signal = None;
    let mut rest = Vec::new();
    let mut raw = false;
    for a in args {
        let name = a.strip_prefix('-').filter(|n| {
            !raw && !n.is_empty()
                && (n.bytes().all(|b| b.is_ascii_digit())
                    || n.bytes()
                        .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit()))
        });
        match name {
            Some(n) => signal = Some(n.to_string()),
            None => {
                raw |= a == "--";
                rest.push(a.clone());
            }
        }
    }
    (signal, rest)
}

/// A signal given as a number, `KILL` or `SIGKILL` (any case), as the daemon names it.
pub fn signal_name(given: &str) -> Res<String> {
    let name = match given.parse::<i32>() {
        Ok(n) => crate::types::signal_name(n),
        Err(_) => {
            let upper = given.to_ascii_uppercase();
            if upper.starts_with("SIG") {
                upper
            } else {
                format!("SIG{upper}")
            }
        }
    };
    match crate::types::signal_by_name(&name) {
        Some(_) => Ok(name),
        None => Err(Fail::usage(format!(
            "cannot send signal {given}; use TERM, KILL, INT, HUP, QUIT, USR1, USR2, STOP or CONT (or their numbers)"
        ))),
    }
}

/// What became of one id.
struct Outcome {
    id: String,
    sent: Vec<String>,
    already_exited: bool,
    entry: Value,
}

/// The exit of a terminal, as its listing shows it after the kill.
fn terminal_exit(c: &mut Client, id: &str, session: &str) -> Value {
    c.call(
        "terminal/output",
        json!({"sessionId": session, "terminalId": id, "_meta": {"execd": {"length": 0}}}),
    )
    .map(|r| r["exitStatus"].clone())
    .unwrap_or(Value::Null)
}

/// Sends `signal` (or SIGTERM then SIGKILL when `None`) to one process.
fn kill_one(c: &mut Client, id: &str, signal: Option<&str>) -> Res<Outcome> {
    let (target, entry) = connect::locate(c, id)?;
    let running = match &target {
        Target::Terminal { .. } => entry["exitStatus"].is_null(),
        Target::Bash { .. } => entry["status"] == "running",
        // A shell session's shell: its running command is what is killed.
        Target::Shell { .. } => !entry["current_command"].is_null(),
    };
    let mut out = Outcome {
        id: id.to_string(),
        sent: Vec::new(),
        already_exited: !running,
        entry: Value::Null,
    };
    if let (Target::Shell { session, .. }, false) = (&target, running) {
        return Err(Fail::new(format!(
            "{id}: nothing runs in shell session {session}; its shell stays (execctl release \
             {id} closes the session)"
        )));
    }
    if let Target::Shell { session, .. } = &target {
        // A shell session's command is interrupted as Ctrl-C would (SIGINT), then ended
        // with its shell after the grace: `shell/kill`, whatever signal was named.
        out.sent.push("SIGINT".into());
        c.call("shell/kill", json!({"id": session}))
            .map_err(connect::about(id))?;
    } else if running {
        let first = signal.unwrap_or("SIGTERM");
        out.sent.push(first.to_string());
        if !send(c, &target, first)? && signal.is_none() {
            out.sent.push("SIGKILL".into());
            send(c, &target, "SIGKILL")?;
        }
    }
    // The state as it stands now.
    out.entry = match &target {
        Target::Terminal { id, session } => {
            let exit = terminal_exit(c, id, session);
            json!({"state": super::ps::state(exit.is_null(), None, &exit["signal"]),
                   "exit_code": exit["exitCode"], "signal": exit["signal"]})
        }
        Target::Bash { .. } => {
            let cmds = connect::commands(c)?;
            let b = connect::locate_in(&[], &cmds, id)
                .map(|(_, b)| b)
                .unwrap_or(entry);
            let p = super::ps::bash_process(&b);
            json!({"state": p["state"], "exit_code": p["exit_code"], "signal": p["signal"]})
        }
        Target::Shell { session, .. } => {
            let r = c
                .call("shell/wait", json!({"id": session, "seconds": 0}))
                .unwrap_or(Value::Null);
            let state = if r["status"] == "running" {
                "running"
            } else {
                "killed"
            };
            json!({"state": state, "exit_code": r["exit_code"], "signal": Value::Null})
        }
    };
    Ok(out)
}

/// Sends one signal; whether the command has exited afterwards (the daemon waits for
/// that up to its kill grace).
fn send(c: &mut Client, target: &Target, signal: &str) -> Res<bool> {
    let about = connect::about(target.id());
    match target {
        Target::Terminal { id, session } => {
            let r = c
                .call(
                    "terminal/kill",
                    json!({"sessionId": session, "terminalId": id,
                           "_meta": {"execd": {"signal": signal}}}),
                )
                .map_err(about)?;
            Ok(r["_meta"]["execd"]["exited"] != false)
        }
        Target::Bash { id, session } => {
            let r = c
                .call(
                    "bash/kill",
                    json!({"session_id": session, "command_id": id, "signal": signal}),
                )
                .map_err(about)?;
            Ok(r["status"] != "running")
        }
        Target::Shell { session, .. } => {
            c.call("shell/kill", json!({"id": session}))
                .map_err(about)?;
            Ok(true)
        }
    }
}

fn describe(o: &Outcome) -> String {
    let e = &o.entry;
    let how = match (&e["exit_code"], &e["signal"]) {
        (Value::Number(n), _) => format!("exit code {n}"),
        (_, Value::String(s)) => s.clone(),
        _ => "?".into(),
    };
    if o.already_exited {
        return format!("{}: had already exited ({how})", o.id);
    }
    if e["state"] == "running" {
        return format!(
            "{}: sent {}; it is still running",
            o.id,
            o.sent.join(", then ")
        );
    }
    match o.sent.as_slice() {
        [_, kill] => format!("{}: outlived SIGTERM; {kill} ended it ({how})", o.id),
        [sig] => format!("{}: sent {sig}; it ended ({how})", o.id),
        _ => format!("{}: ended ({how})", o.id),
    }
}

/// `execctl kill [-s SIGNAL | -SIGNAL] ID...`.
pub fn kill(ctx: &Ctx, p: &Args, shorthand: Option<String>) -> Res<u8> {
    if p.operands.is_empty() {
        return Err(Fail::usage(
            "kill needs one or more process ids; list them with: execctl ps",
        ));
    }
    let signal = match (shorthand, p.value("--signal")) {
        (Some(_), Some(_)) => {
            return Err(Fail::usage(
                "give the signal once: -s SIGNAL or -SIGNAL, not both",
            ))
        }
        (Some(s), None) => Some(signal_name(&s)?),
        (None, Some(s)) => Some(signal_name(s)?),
        (None, None) => None,
    };
    let mut c = ctx.connect()?;
    let mut code = 0;
    let mut results = Vec::new();
    for id in &p.operands {
        match kill_one(&mut c, id, signal.as_deref()) {
            Ok(o) => {
                if ctx.json {
                    results.push(
                        json!({"id": o.id, "sent": o.sent, "already_exited": o.already_exited,
                        "state": o.entry["state"], "exit_code": o.entry["exit_code"],
                        "signal": o.entry["signal"]}),
                    );
                } else {
                    output::print(&format!("{}\n", describe(&o)))?;
                }
            }
            Err(f) => {
                code = EXIT_FAILURE;
                if ctx.json {
                    results.push(json!({"id": id, "error": f.message}));
                } else {
                    warn(&f.text(ctx.verbose));
                }
            }
        }
    }
    if ctx.json {
        output::print_json(&json!({ "processes": results }))?;
    }
    Ok(code)
}

/// `execctl release ID...`.
pub fn release(ctx: &Ctx, p: &Args) -> Res<u8> {
    if p.operands.is_empty() {
        return Err(Fail::usage(
            "release needs one or more process ids; list them with: execctl ps",
        ));
    }
    let mut c = ctx.connect()?;
    let mut code = 0;
    for id in &p.operands {
        let done = match connect::locate(&mut c, id) {
            Ok((Target::Terminal { id, session }, _)) => c
                .call(
                    "terminal/release",
                    json!({"sessionId": session, "terminalId": id}),
                )
                .map(|_| ())
                .map_err(connect::about(&id)),
            Ok((Target::Bash { session, .. }, _)) => Err(Fail::new(format!(
                "{id} is a bash command; it is freed with its session: execctl sessions close {session}"
            ))),
            // A shell session's shell goes with its session.
            Ok((Target::Shell { id, session }, _)) => c
                .call("shell/sessions/close", json!({"id": session}))
                .map(|_| ())
                .map_err(connect::about(&id)),
            Err(f) => Err(f),
        };
        if let Err(f) = done {
            code = EXIT_FAILURE;
            warn(&f.text(ctx.verbose));
        }
    }
    Ok(code)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn signal_forms() {
        assert_eq!(signal_name("9").ok().as_deref(), Some("SIGKILL"));
        assert_eq!(signal_name("KILL").ok().as_deref(), Some("SIGKILL"));
        assert_eq!(signal_name("sigterm").ok().as_deref(), Some("SIGTERM"));
        assert_eq!(signal_name("2").ok().as_deref(), Some("SIGINT"));
        assert!(signal_name("SEGV").is_err());
        assert!(signal_name("nope").is_err());
        let (s, rest) = signal_shorthand(&strings(&["-9", "cmd_1", "-v"]));
        assert_eq!(s.as_deref(), Some("9"));
        assert_eq!(rest, ["cmd_1", "-v"]);
        let (s, rest) = signal_shorthand(&strings(&["-KILL", "--", "-HUP"]));
        assert_eq!(s.as_deref(), Some("KILL"));
        assert_eq!(rest, ["--", "-HUP"]);
        let (s, _) = signal_shorthand(&strings(&["-s", "9"]));
        assert_eq!(s, None);
    }
}
