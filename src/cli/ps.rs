//! Looking at processes: `ps`, `logs`, `wait` and `status`.
//!
//! One shape per thing, whatever family it comes from: a process is
//! `{id, kind, session, pid, state, exit_code, signal, started_at, duration_ms, cwd,
//! command, argv}` with `state` one of running, exited, killed, timed_out. `--json`
//! output uses snake_case keys and puts lists under a named key (`processes`).
//!
//! `logs` reads through a lossless base64 subscription from the first retained byte, so
//! what it prints is the command's exact bytes; it says how much older output is no
//! longer retained, and with `-f` goes on live until the command exits.

use std::collections::VecDeque;
use std::time::{Duration, SystemTime};

use serde_json::{json, Value};

use super::args::Args;
use super::daemon::{self, Ctx, Target};
use super::errors::{daemon_error, exit_status, Fail, Res, EXIT_FAILURE, EXIT_TIMEOUT};
use super::output::{self, warn};
use crate::client::Client;
use crate::wire::encode::base64_decode;

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

/// A terminal as `ps` shows it.
pub fn terminal_process(t: &Value) -> Value {
    let exit = &t["exitStatus"];
    let mut argv = vec![t["command"].clone()];
    argv.extend(t["args"].as_array().cloned().unwrap_or_default());
    let words: Vec<&str> = argv.iter().map(|a| a.as_str().unwrap_or("")).collect();
    json!({
        "id": t["terminalId"], "kind": "terminal", "session": t["sessionId"], "pid": t["pid"],
        "state": state(exit.is_null(), None, &exit["signal"]),
        "exit_code": exit["exitCode"], "signal": exit["signal"],
        "started_at": t["startedAt"],
        "duration_ms": duration_ms(&t["startedAt"], &exit["_meta"]["execd"]["durationMs"]),
        "cwd": t["cwd"],
        "command": output::quoted_line(words.iter().copied()),
        "argv": argv,
    })
}

/// A bash command as `ps` shows it.
pub fn bash_process(b: &Value) -> Value {
    let signal = b.get("signal").cloned().unwrap_or(Value::Null);
    json!({
        "id": b["command_id"], "kind": "bash", "session": b["session_id"], "pid": b["pid"],
        "state": state(b["status"] == "running", b["status"].as_str(), &signal),
        "exit_code": b["exit_code"], "signal": signal,
        "started_at": b["started_at"],
        "duration_ms": duration_ms(&b["started_at"], &b["_meta"]["execd"]["durationMs"]),
        "cwd": b["cwd"],
        "command": b["command"],
        "argv": Value::Null,
    })
}

/// Every process of the caller, newest first (optionally of one session only).
pub fn processes(c: &mut Client, session: Option<&str>) -> Res<Vec<Value>> {
    let (tf, bf) = match session {
        Some(s) => (json!({"sessionId": s}), json!({"session_id": s})),
        None => (json!({}), json!({})),
    };
    let terms = daemon::list_all(c, "terminal/list", "terminals", tf)?;
    let cmds = daemon::list_all(c, "bash/commands", "commands", bf)?;
    let mut all: Vec<Value> = terms.iter().map(terminal_process).collect();
    all.extend(cmds.iter().map(bash_process));
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

fn no_operands(p: &Args, what: &str) -> Res<()> {
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
        all.retain(|x| x["state"] == "running");
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
            vec![
                shown("id"),
                shown("session"),
                x["pid"].to_string(),
                x["state"].as_str().unwrap_or("").into(),
                exit,
                output::age(x["started_at"].as_str().unwrap_or("")),
                duration,
                shown("command"),
            ]
        })
        .collect();
    output::table(
        &[
            "ID", "SESSION", "PID", "STATE", "EXIT", "AGE", "DURATION", "COMMAND",
        ],
        &rows,
        Some(3),
    )?;
    Ok(0)
}

fn one_id<'a>(p: &'a Args, what: &str) -> Res<&'a str> {
    match p.operands.as_slice() {
        [id] => Ok(id),
        [] => Err(Fail::usage(format!(
            "{what} needs a process id; list them with: execctl ps"
        ))),
        _ => Err(Fail::usage(format!("{what} takes one process id"))),
    }
}

/// Where each stream of a process ends now: `[output or stdout, stderr]`, and whether it
/// has exited.
fn ends(c: &mut Client, target: &Target) -> Res<([u64; 2], bool)> {
    match target {
        Target::Terminal { id, session } => {
            let r = c
                .call(
                    "terminal/output",
                    json!({"sessionId": session, "terminalId": id, "_meta": {"execd": {"length": 0}}}),
                )
                .map_err(daemon::about(id))?;
            let end = r["_meta"]["execd"]["end"].as_u64().unwrap_or(0);
            Ok(([end, 0], r.get("exitStatus").is_some()))
        }
        Target::Bash { id, session } => {
            let r = c
                .call(
                    "bash/output",
                    json!({"session_id": session, "command_id": id,
                           "offset": u64::MAX, "stderr_offset": u64::MAX}),
                )
                .map_err(daemon::about(id))?;
            let end = |k: &str| r[k].as_u64().unwrap_or(0);
            Ok((
                [end("offset"), end("stderr_offset")],
                r["command"]["status"] != "running",
            ))
        }
    }
}

/// The last `n` lines of `bytes` (a final line without its newline counts).
fn last_lines(bytes: &[u8], n: usize) -> &[u8] {
    if n == 0 {
        return &bytes[bytes.len()..];
    }
    let body = bytes.strip_suffix(b"\n").unwrap_or(bytes);
    let mut seen = 0;
    for (i, &b) in body.iter().enumerate().rev() {
        if b == b'\n' {
            seen += 1;
            if seen == n {
                return &bytes[i + 1..];
            }
        }
    }
    bytes
}

/// What `logs` does with each stream's bytes.
struct LogOut {
    id: String,
    only_stderr: bool,
    /// `--tail N`: bytes held until the snapshot's end, then their last N lines printed.
    tail: Option<usize>,
    held: [VecDeque<u8>; 2],
    /// The snapshot's end per stream; `None` once it has been reached (live from there).
    until: Option<[u64; 2]>,
    next: [u64; 2],
    started: [bool; 2],
    lost: u64,
}

impl LogOut {
    fn emit(&mut self, stream: usize, bytes: &[u8]) -> Res<()> {
        if self.only_stderr && stream == 0 {
            return Ok(());
        }
        if self.tail.is_some() && self.until.is_some() {
            // Bounded by what execd retains of the stream (its output limit).
            self.held[stream].extend(bytes);
            return Ok(());
        }
        if stream == 1 {
            let _ = output::write_stderr(bytes);
            Ok(())
        } else {
            output::write_stdout(bytes).map_err(|e| output::stdout_failed(&e))
        }
    }

    /// The snapshot is complete: print the held tails.
    fn reach_end(&mut self) -> Res<()> {
        self.until = None;
        if let Some(n) = self.tail {
            for stream in 0..2 {
                let held: Vec<u8> = std::mem::take(&mut self.held[stream]).into();
                let last = last_lines(&held, n).to_vec();
                self.emit(stream, &last)?;
            }
        }
        Ok(())
    }

    fn reached(&self) -> bool {
        match self.until {
            Some(end) => self.next[0] >= end[0] && self.next[1] >= end[1],
            None => false,
        }
    }

    /// Handles one event; true at the `Exit`.
    fn event(&mut self, msg: &Value) -> Res<bool> {
        let params = &msg["params"];
        let payload = &params["payload"];
        if msg["method"] != "event" || payload["id"] != self.id.as_str() {
            return Ok(false);
        }
        let name = payload["stream"].as_str().unwrap_or("output");
        let stream = usize::from(name == "stderr");
        match params["type"].as_str() {
            Some("Output") => {
                let offset = payload["offset"].as_u64().unwrap_or(self.next[stream]);
                let Some(mut bytes) = payload["data"].as_str().and_then(base64_decode) else {
                    return Ok(false);
                };
                if offset < self.next[stream] {
                    let seen = ((self.next[stream] - offset) as usize).min(bytes.len());
                    bytes.drain(..seen);
                }
                // A snapshot stops at its end, even inside a chunk.
                if let Some(end) = self.until {
                    let room = end[stream].saturating_sub(offset.max(self.next[stream]));
                    bytes.truncate(room as usize);
                }
                self.started[stream] = true;
                self.next[stream] = self.next[stream].max(offset) + bytes.len() as u64;
                self.emit(stream, &bytes)?;
            }
            Some("Gap") => {
                let offset = payload["offset"].as_u64().unwrap_or(0);
                let skipped = payload["skipped"].as_u64().unwrap_or(0);
                let what = if name == "output" {
                    "output".to_string()
                } else {
                    name.to_string()
                };
                if !self.started[stream] && offset == 0 {
                    if !(self.only_stderr && stream == 0) {
                        warn(&format!(
                            "the first {skipped} bytes of {}'s {what} are no longer retained by execd; showing the rest",
                            self.id
                        ));
                    }
                } else {
                    self.lost += skipped;
                    warn(&format!(
                        "{skipped} bytes of {}'s {what} were lost at offset {offset} (execd dropped them to stay within its output memory)",
                        self.id
                    ));
                }
                self.started[stream] = true;
                self.next[stream] = self.next[stream].max(offset + skipped);
            }
            Some("Exit") => return Ok(true),
            _ => {}
        }
        Ok(false)
    }
}

/// `execctl logs [-f] [--tail N] [--stderr] ID`.
pub fn logs(ctx: &Ctx, p: &Args) -> Res<u8> {
    let id = one_id(p, "logs")?;
    let tail = p
        .value("--tail")
        .map(|v| {
            v.parse::<usize>()
                .map_err(|_| Fail::usage(format!("--tail: {v:?} is not a number of lines")))
        })
        .transpose()?;
    let follow = p.has("--follow");
    let only_stderr = p.has("--stderr");
    let mut c = ctx.connect()?;
    let (target, _) = daemon::locate(&mut c, id)?;
    if only_stderr && matches!(target, Target::Terminal { .. }) {
        return Err(Fail::usage(format!(
            "{id} is a terminal: its stdout and stderr are one stream; drop --stderr"
        )));
    }
    let (end, exited) = ends(&mut c, &target)?;
    let mut out = LogOut {
        id: id.to_string(),
        only_stderr,
        tail,
        held: [VecDeque::new(), VecDeque::new()],
        until: Some(end),
        next: [0, 0],
        started: [false, false],
        lost: 0,
    };
    if !follow && out.reached() {
        return Ok(0);
    }
    c.call(
        "events/subscribe",
        json!({"id": id, "offset": 0, "stderr_offset": 0, "lossless": true, "encoding": "base64"}),
    )
    .map_err(daemon::about(id))?;
    if out.reached() {
        // Nothing was written yet: live from the start.
        out.reach_end()?;
    }
    loop {
        let msg = c
            .next_notification(None)
            .map_err(|e| daemon_error(e, Some(id)))?;
        let exit = out.event(&msg)?;
        if out.until.is_some() && (out.reached() || exit) {
            out.reach_end()?;
            if !follow || exited {
                break;
            }
        }
        if exit {
            break;
        }
    }
    Ok(if out.lost > 0 { EXIT_FAILURE } else { 0 })
}

/// `execctl wait ID`.
pub fn wait(ctx: &Ctx, p: &Args) -> Res<u8> {
    let id = one_id(p, "wait")?;
    let mut c = ctx.connect()?;
    let (target, _) = daemon::locate(&mut c, id)?;
    let (code, signal, status) = match &target {
        Target::Terminal { id, session } => {
            let r = c
                .call(
                    "terminal/wait_for_exit",
                    json!({"sessionId": session, "terminalId": id}),
                )
                .map_err(daemon::about(id))?;
            (r["exitCode"].clone(), r["signal"].clone(), None)
        }
        Target::Bash { id, session } => {
            // An offset past the end is answered at once with "" and the end offsets; from
            // there, long-poll: waiting transfers no output.
            let mut at = json!({"session_id": session, "command_id": id,
                                "offset": u64::MAX, "stderr_offset": u64::MAX});
            loop {
                let r = c
                    .call("bash/output", at.clone())
                    .map_err(daemon::about(id))?;
                let cmd = &r["command"];
                if cmd["status"] != "running" {
                    break (
                        cmd["exit_code"].clone(),
                        cmd.get("signal").cloned().unwrap_or(Value::Null),
                        cmd["status"].as_str().map(str::to_string),
                    );
                }
                at["offset"] = r["offset"].clone();
                at["stderr_offset"] = r["stderr_offset"].clone();
                at["wait"] = json!(true);
                at["wait_timeout"] = json!(30);
            }
        }
    };
    let st = state(false, status.as_deref(), &signal);
    if ctx.json {
        output::print_json(&json!({"id": id, "state": st, "exit_code": code, "signal": signal}))?;
    }
    Ok(if st == "timed_out" {
        EXIT_TIMEOUT
    } else {
        exit_status(&code, &signal)
    })
}

/// Limits that are byte sizes (printed as `4M`).
const SIZES: &[&str] = &[
    "maxMessage",
    "clientBuffer",
    "outputLimit",
    "maxOutputLimit",
    "maxOutputMemory",
    "stdinBuffer",
    "memoryMax",
];

/// A limit of `initialize` as execd's flag and its value as the flag takes it; `none`
/// for a limit that is not set.
fn limit_line(key: &str, v: &Value) -> (String, String) {
    let flag_of = |k: &str| format!("--{}", output::snake(k).replace('_', "-"));
    let (flag, unit) = if let Some(base) = key.strip_suffix("Ms") {
        (flag_of(base), "ms")
    } else if let Some(base) = key.strip_suffix("Percent") {
        (flag_of(base), "%")
    } else if SIZES.contains(&key) {
        (flag_of(key), "bytes")
    } else {
        (flag_of(key), "")
    };
    let value = match (v.as_u64(), unit) {
        (None, _) if v.is_null() => "none".to_string(),
        (None, _) => v.to_string(),
        (Some(n), "ms") => output::flag_duration(n),
        (Some(n), "bytes") => output::size(n),
        (Some(n), _) => n.to_string(),
    };
    (flag, value)
}

/// The policy and approvals, in a line.
fn policy_line(meta: &Value) -> String {
    let p = &meta["policy"];
    let file = match p["path"].as_str() {
        Some(path) if p["loaded"] == true => {
            format!("{path} ({} rules)", p["rules"].as_u64().unwrap_or(0))
        }
        _ => "none (every command is allowed)".to_string(),
    };
    let n = |k: &str| meta[k].as_u64().unwrap_or(0);
    format!(
        "{file}; {} approvers, {} requests pending",
        n("approvers"),
        n("pendingApprovals")
    )
}

/// `execctl status`.
pub fn status(ctx: &Ctx, p: &Args) -> Res<u8> {
    no_operands(p, "status")?;
    let mut c = ctx.connect()?;
    let init = c.call(
        "initialize",
        json!({"protocolVersion": 1, "clientInfo": {"name": "execctl", "version": env!("CARGO_PKG_VERSION")}}),
    )?;
    let all = processes(&mut c, None)?;
    let sessions = c.call("bash/sessions", json!({}))?;
    let meta = &init["_meta"]["execd"];
    let count = |kind: &str, running: bool| {
        all.iter()
            .filter(|x| x["kind"] == kind && (!running || x["state"] == "running"))
            .count()
    };
    let status = json!({
        "version": init["serverInfo"]["version"],
        "pid": meta["pid"],
        "socket": meta["socket"],
        "uptime_ms": meta["uptimeMs"],
        "running": meta["running"],
        "clients": meta["clients"],
        "terminals": count("terminal", false),
        "running_terminals": count("terminal", true),
        "bash_commands": count("bash", false),
        "running_bash_commands": count("bash", true),
        "sessions": sessions.as_array().map_or(0, Vec::len),
        "output_memory": output::snake_keys(&meta["outputMemory"]),
        "policy": output::snake_keys(&meta["policy"]),
        "approvers": meta["approvers"],
        "pending_approvals": meta["pendingApprovals"],
        "containment": output::snake_keys(&meta["containment"]),
        "audit": meta["audit"],
        "limits": output::snake_keys(&init["limits"]),
    });
    if ctx.json {
        output::print_json(&status)?;
        return Ok(0);
    }
    let up = Duration::from_millis(meta["uptimeMs"].as_u64().unwrap_or(0));
    let mem = |k: &str| output::size(meta["outputMemory"][k].as_u64().unwrap_or(0));
    let containment = match meta["containment"]["detail"].as_str() {
        Some(detail) => format!(
            "{}\n            {detail}",
            meta["containment"]["kind"].as_str().unwrap_or("?")
        ),
        None => meta["containment"]["kind"]
            .as_str()
            .unwrap_or("?")
            .to_string(),
    };
    let rows = [
        ("uptime", output::human_duration(up)),
        (
            "running",
            format!(
                "{} yours ({} terminals, {} bash commands); {} in all",
                count("terminal", true) + count("bash", true),
                count("terminal", true),
                count("bash", true),
                status["running"]
            ),
        ),
        ("terminals", status["terminals"].to_string()),
        (
            "bash",
            format!(
                "{} commands in {} sessions",
                status["bash_commands"], status["sessions"]
            ),
        ),
        ("clients", status["clients"].to_string()),
        (
            "output",
            format!(
                "{} of {} held ({} released to stay within it)",
                mem("used"),
                mem("budget"),
                mem("released")
            ),
        ),
        ("policy", policy_line(meta)),
        ("containment", containment),
    ];
    let mut out = format!(
        "execd {} (pid {}) on {}\n",
        status["version"].as_str().unwrap_or("?"),
        status["pid"],
        status["socket"].as_str().unwrap_or("?"),
    );
    for (label, value) in rows {
        out.push_str(&format!("{label:<12}{value}\n"));
    }
    out.push_str("limits\n");
    let limits: Vec<(String, String)> = init["limits"]
        .as_object()
        .into_iter()
        .flatten()
        .map(|(k, v)| limit_line(k, v))
        .collect();
    let width = limits.iter().map(|(f, _)| f.len()).max().unwrap_or(0);
    for (flag, value) in limits {
        out.push_str(&format!("  {flag:<width$}  {value}\n"));
    }
    output::print(&out)?;
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tails() {
        assert_eq!(last_lines(b"a\nb\nc\n", 2), b"b\nc\n");
        assert_eq!(last_lines(b"a\nb\nc", 2), b"b\nc");
        assert_eq!(last_lines(b"a\nb\n", 5), b"a\nb\n");
        assert_eq!(last_lines(b"a\nb\n", 0), b"");
        assert_eq!(last_lines(b"", 3), b"");
    }

    #[test]
    fn limits_read_as_flags() {
        assert_eq!(
            limit_line("clientBuffer", &json!(4 << 20)),
            ("--client-buffer".into(), "4M".into())
        );
        assert_eq!(
            limit_line("killGraceMs", &json!(2000)),
            ("--kill-grace".into(), "2s".into())
        );
        assert_eq!(
            limit_line("sessionIdleMs", &json!(3_600_000)),
            ("--session-idle".into(), "1h".into())
        );
        assert_eq!(
            limit_line("maxClients", &json!(1024)),
            ("--max-clients".into(), "1024".into())
        );
        assert_eq!(
            limit_line("memoryMax", &Value::Null),
            ("--memory-max".into(), "none".into())
        );
        assert_eq!(
            limit_line("cpuMaxPercent", &json!(50)),
            ("--cpu-max".into(), "50".into())
        );
        assert_eq!(
            limit_line("approvalTimeoutMs", &json!(60_000)),
            ("--approval-timeout".into(), "1m".into())
        );
    }

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
