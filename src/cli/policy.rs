//! The policy from the user's side: `policy check` (what would the policy decide, and
//! which rules matched) and `approve` (answer the daemon's approval requests).
//!
//! `policy check --policy FILE` judges offline with the daemon's own library
//! (`execd::policy`), so a file can be tried before execd loads it; without `--policy` it
//! asks the running daemon (`policy/check`). Both print one shape.
//!
//! `approve` speaks Wire: after `approvals/subscribe`, the daemon sends each request as a
//! JSON-RPC request *from the server* (`method: "request"` with an `id`), answered with a
//! response carrying `{request_id, response, feedback?}`; `ApprovalRequestResolved`
//! events say when a request was settled, by us or by another approver. A reader thread
//! for the socket and one for stdin feed one channel, so a request answered elsewhere
//! while the prompt waits is withdrawn from the screen at once.

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::mpsc;

use serde_json::{json, Value};

use super::args::Args;
use super::connect::{Ctx, Host};
use super::errors::{Fail, Res};
use super::output::{self, warn};
use crate::client::Transport;
use crate::policy::{Judged, Policy, Subject};

/// This process's groups (primary and supplementary), from `/proc/self/status`.
fn own_groups() -> Vec<u32> {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let mut gids = Vec::new();
    for line in status.lines() {
        let nums = |rest: &str| -> Vec<u32> {
            rest.split_whitespace()
                .filter_map(|n| n.parse().ok())
                .collect()
        };
        if let Some(rest) = line.strip_prefix("Gid:") {
            gids.extend(nums(rest).into_iter().take(1));
        } else if let Some(rest) = line.strip_prefix("Groups:") {
            gids.extend(nums(rest));
        }
    }
    gids.sort_unstable();
    gids.dedup();
    gids
}

fn number(flag: &str, v: &str) -> Res<u32> {
    v.parse()
        .map_err(|_| Fail::usage(format!("{flag}: {v:?} is not a number")))
}

/// Judges with a policy file, offline.
fn check_file(file: &str, operands: &[String], uid: Option<u32>, gids: Vec<u32>) -> Res<Value> {
    let policy = Policy::load(Path::new(file)).map_err(Fail::new)?;
    let me = crate::sys::ids::current_uid();
    let uid = uid.unwrap_or(me);
    let gids = if gids.is_empty() && uid == me {
        own_groups()
    } else {
        gids
    };
    let peer = Subject { uid, gids: &gids };
    let verdict = match operands {
        [line] => policy.judge(&Judged::Line(line), &[], &peer),
        argv => policy.judge(&Judged::Argv(argv), &[], &peer),
    };
    let hits: Vec<Value> = verdict
        .hits
        .iter()
        .map(|h| json!({"rule": h.rule, "decision": h.decision.as_str(), "argv": h.argv}))
        .collect();
    Ok(json!({
        "decision": verdict.decision.as_str(),
        "rule": verdict.rule,
        "justification": verdict.justification,
        "unparsed": verdict.unparsed,
        "hits": hits,
        "uid": uid,
        "source": file,
    }))
}

/// Asks the running daemon.
fn check_daemon(ctx: &Ctx, operands: &[String], uid: Option<u32>) -> Res<Value> {
    let mut params = match operands {
        [line] => json!({"command": line}),
        [command, args @ ..] => json!({"command": command, "args": args}),
        [] => json!({}),
    };
    if let Some(u) = uid {
        params["uid"] = json!(u);
    }
    let mut c = ctx.connect()?;
    let r = c.call("policy/check", params)?;
    let loaded = r["policy_loaded"].as_bool().unwrap_or(true);
    Ok(json!({
        "decision": r["decision"],
        "rule": r["rule"],
        "justification": r["justification"],
        "unparsed": r["unparsed"],
        "hits": r["hits"],
        // Judged as the peer the daemon sees: on another host that is the ssh user,
        // whose uid only that host knows.
        "uid": match (uid, &ctx.host) {
            (Some(u), _) => json!(u),
            (None, Host::Local(_)) => json!(crate::sys::ids::current_uid()),
            (None, Host::Ssh(_)) => Value::Null,
        },
        "source": if loaded { "daemon" } else { "daemon (no policy file)" },
    }))
}

/// The verdict for a person.
fn describe(v: &Value) -> String {
    let decision = v["decision"].as_str().unwrap_or("?");
    let rule = v["rule"].as_str().unwrap_or("?");
    let mut s = match rule {
        "default" => format!("{decision} (no rule matched: the policy's default)\n"),
        "unparsed" => format!(
            "{decision} (the line is not a plain script; the policy's \"unparsed\" decision)\n"
        ),
        _ => format!("{decision} (rule {rule})\n"),
    };
    if let Some(j) = v["justification"].as_str() {
        s.push_str(&format!("  justification: {j}\n"));
    }
    if v["unparsed"] == true && rule != "unparsed" {
        s.push_str("  part of the line is not a plain script and was not read\n");
    }
    let hits = v["hits"].as_array().cloned().unwrap_or_default();
    if hits.is_empty() {
        s.push_str("rules matched: none\n");
    } else {
        s.push_str("rules matched:\n");
        let width = hits
            .iter()
            .map(|h| h["rule"].as_str().unwrap_or("").chars().count())
            .max()
            .unwrap_or(0);
        for h in &hits {
            let argv: Vec<&str> = h["argv"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|a| a.as_str().unwrap_or(""))
                .collect();
            s.push_str(&format!(
                "  {:<width$}  {:<5}  {}\n",
                h["rule"].as_str().unwrap_or(""),
                h["decision"].as_str().unwrap_or(""),
                output::quoted_line(argv)
            ));
        }
    }
    s.push_str(&format!(
        "policy: {}\n",
        v["source"].as_str().unwrap_or("?")
    ));
    s
}

/// `execctl policy check [--policy FILE] [--uid N] [--gid N] [--] COMMAND... | 'LINE'`.
pub fn check(ctx: &Ctx, p: &Args) -> Res<u8> {
    if p.operands.is_empty() {
        return Err(Fail::usage(
            "policy check needs a command: execctl policy check -- git push origin main, or 'SHELL LINE'",
        ));
    }
    let uid = p.value("--uid").map(|v| number("--uid", v)).transpose()?;
    let gids = p
        .values("--gid")
        .into_iter()
        .map(|v| number("--gid", v))
        .collect::<Res<Vec<u32>>>()?;
    let verdict = match p.value("--policy") {
        Some(file) => check_file(file, &p.operands, uid, gids)?,
        None => {
            if !gids.is_empty() {
                return Err(Fail::usage(
                    "--gid goes with --policy; the daemon knows the groups of a uid itself",
                ));
            }
            check_daemon(ctx, &p.operands, uid)?
        }
    };
    if ctx.json {
        output::print_json(&verdict)?;
    } else {
        output::print(&describe(&verdict))?;
    }
    Ok(0)
}

// ---- approve ---------------------------------------------------------------------------

/// What the main loop of `approve` hears.
enum Heard {
    /// A message from the daemon.
    Daemon(Value),
    /// The daemon closed the connection.
    DaemonGone,
    /// A line typed (or piped) on stdin.
    Line(String),
    /// stdin ended.
    InputGone,
}

/// One pending approval request.
struct ApprovalAsk {
    /// The JSON-RPC id the answer must carry, exactly as received.
    rpc_id: Value,
    request_id: String,
    payload: Value,
}

/// The connection's writing half, and what relays it.
struct Wire<'a> {
    out: UnixStream,
    transport: &'a mut dyn Transport,
    /// The daemon has answered the subscription.
    answered: bool,
}

impl Wire<'_> {
    fn send(&mut self, v: &Value) -> Res<()> {
        let mut line = v.to_string();
        line.push('\n');
        match self.out.write_all(line.as_bytes()) {
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::BrokenPipe | std::io::ErrorKind::ConnectionReset
                ) =>
            {
                Err(self.gone().unwrap_or_else(|| Fail::from(e)))
            }
            done => done.map_err(Fail::from),
        }
    }

    /// Why the connection ended, when its transport knows (an ssh link that failed, a
    /// daemon that refused this peer).
    fn gone(&mut self) -> Option<Fail> {
        self.transport.why_closed(!self.answered).map(Fail::new)
    }

    fn answer(&mut self, r: &ApprovalAsk, response: &str, feedback: Option<&str>) -> Res<()> {
        let mut result = json!({"request_id": r.request_id, "response": response});
        if let Some(f) = feedback.filter(|f| !f.is_empty()) {
            result["feedback"] = json!(f);
        }
        self.send(&json!({"jsonrpc": "2.0", "id": r.rpc_id, "result": result}))
    }
}

/// Starts the two reader threads.
fn listen(stream: &UnixStream) -> Res<mpsc::Receiver<Heard>> {
    let (tx, rx) = mpsc::channel();
    let reader = stream.try_clone()?;
    let to_main = tx.clone();
    std::thread::spawn(move || {
        for line in BufReader::new(reader).lines() {
            let Ok(line) = line else { break };
            if line.trim().is_empty() {
                continue;
            }
            let Ok(v) = serde_json::from_str::<Value>(&line) else {
                continue;
            };
            if to_main.send(Heard::Daemon(v)).is_err() {
                return;
            }
        }
        let _ = to_main.send(Heard::DaemonGone);
    });
    std::thread::spawn(move || {
        let stdin = std::io::stdin();
        for line in stdin.lock().lines() {
            let Ok(line) = line else { break };
            if tx.send(Heard::Line(line)).is_err() {
                return;
            }
        }
        let _ = tx.send(Heard::InputGone);
    });
    Ok(rx)
}

/// A request as `approve --json` prints it.
fn request_json(r: &ApprovalAsk) -> Value {
    let p = &r.payload;
    let display: Vec<Value> = p["display"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|d| d.get("text").cloned())
        .collect();
    json!({
        "type": "approval_request",
        "request_id": r.request_id,
        "tool_call_id": p["tool_call_id"],
        "sender": p["sender"],
        "action": p["action"],
        "command": p["description"],
        "display": display,
        "details": details(p).cloned().unwrap_or(Value::Null),
    })
}

/// The `execd` display block of a request: what will run, as data.
fn details(payload: &Value) -> Option<&Value> {
    payload["display"]
        .as_array()?
        .iter()
        .find(|d| d["type"] == "execd")
        .map(|d| &d["data"])
}

/// A request as a person reads it: id, command, each simple command with the rules it
/// matched, the variables it sets, rule and justification, uid, cwd and session, each on
/// its line. Every value is shown through `output::visible`: the command, variables, cwd
/// and session are the requester's, and a carriage return or an escape sequence in them
/// must not redraw what the approver is deciding on.
fn request_text(r: &ApprovalAsk) -> String {
    let p = &r.payload;
    let shown = output::visible;
    let mut s = format!("\napproval request {}", shown(&r.request_id));
    if let Some(t) = p["tool_call_id"].as_str() {
        s.push_str(&format!(" (command id {})", shown(t)));
    }
    s.push('\n');
    let mut line = |label: &str, value: &str| {
        s.push_str(&format!("  {label:<8} {}\n", shown(value)));
    };
    line("command", p["description"].as_str().unwrap_or("?"));
    let Some(d) = details(p) else {
        // Another sender's request: its brief lines as they are.
        for b in p["display"].as_array().into_iter().flatten() {
            if let Some(text) = b["text"].as_str() {
                line("", text);
            }
        }
        return s;
    };
    let str_of = |v: &Value| v.as_str().unwrap_or_default().to_string();
    for c in d["commands"].as_array().into_iter().flatten() {
        let rules: Vec<String> = c["rules"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|r| format!("{} ({})", str_of(&r["rule"]), str_of(&r["decision"])))
            .collect();
        let rules = if rules.is_empty() {
            "no rule".to_string()
        } else {
            format!("rule {}", rules.join(", "))
        };
        line("runs", &format!("{}    [{rules}]", str_of(&c["command"])));
    }
    if let Some(n) = d["commands_left_out"].as_u64().filter(|n| *n > 0) {
        line("runs", &format!("... {n} more simple commands ..."));
    }
    if d["unparsed"] == true {
        line(
            "unparsed",
            "the policy cannot read all that this runs; read the command itself",
        );
    }
    for e in d["env"].as_array().into_iter().flatten() {
        line(
            "sets",
            &format!("{}={}", str_of(&e["name"]), str_of(&e["value"])),
        );
    }
    if let Some(n) = d["env_left_out"].as_u64().filter(|n| *n > 0) {
        line("sets", &format!("... {n} more variables ..."));
    }
    // What it may touch (PROTOCOL 16), and what approving lets it touch beyond that.
    let outside: Vec<String> = d["outside"]
        .as_array()
        .into_iter()
        .flatten()
        .map(str_of)
        .collect();
    if !outside.is_empty() {
        line("outside", &format!("the sandbox: {}", outside.join(", ")));
    }
    let sb = &d["sandbox"];
    if sb.is_object() && sb["name"] != "off" {
        let paths = |v: &Value| match v {
            Value::Array(a) if a.is_empty() => "nothing".to_string(),
            Value::Array(a) => a.iter().map(str_of).collect::<Vec<_>>().join(" "),
            other => str_of(other),
        };
        line(
            "sandbox",
            &format!(
                "{}: write {}; network {}",
                str_of(&sb["name"]),
                paths(&sb["write"]),
                str_of(&sb["network"])
            ),
        );
    }
    let rule = match d["justification"].as_str() {
        Some(j) => format!("{}: {j}", str_of(&d["rule"])),
        None => str_of(&d["rule"]),
    };
    line("rule", &rule);
    line("uid", &format!("{} (pid {})", d["uid"], d["pid"]));
    line("cwd", &str_of(&d["cwd"]));
    line("session", &str_of(&d["session"]));
    s
}

const PROMPT: &str = "approve? [y]es / [n]o / [s]ession: ";
const FEEDBACK: &str = "feedback for the requester (Enter for none): ";

/// `execctl approve [--json]`.
pub fn approve(ctx: &Ctx, p: &Args) -> Res<u8> {
    if let Some(a) = p.operands.first() {
        return Err(Fail::usage(format!("approve takes no operand, got {a:?}")));
    }
    let link = ctx.open()?;
    let (stream, mut transport) = (link.stream, link.transport);
    let done = approve_on(ctx, &stream, transport.as_mut());
    // The reader thread holds a copy of the stream: the end must reach the daemon (or
    // the ssh relaying it) before the transport waits for it.
    let _ = stream.shutdown(std::net::Shutdown::Both);
    drop(transport);
    done
}

/// `approve` over an open connection.
fn approve_on(ctx: &Ctx, stream: &UnixStream, transport: &mut dyn Transport) -> Res<u8> {
    let mut wire = Wire {
        out: stream.try_clone()?,
        transport,
        answered: false,
    };
    let heard = listen(stream)?;
    wire.send(&json!({"jsonrpc": "2.0", "id": "subscribe", "method": "approvals/subscribe", "params": {}}))?;
    let mut queue: VecDeque<ApprovalAsk> = VecDeque::new();
    // The request whose answer is `n` and whose feedback is being typed.
    let mut feedback_for: Option<ApprovalAsk> = None;
    let mut subscribed = false;
    // stdin ended before the daemon answered the subscription: its answer (or its
    // close) still says how this ends.
    let mut input_gone = false;
    let show = |queue: &VecDeque<ApprovalAsk>, json: bool| -> Res<()> {
        if json {
            return Ok(());
        }
        match queue.front() {
            Some(r) => output::print(&format!("{}{PROMPT}", request_text(r))),
            None => Ok(()),
        }
    };
    loop {
        let Ok(msg) = heard.recv() else { break };
        match msg {
            Heard::DaemonGone => {
                if let Some(f) = wire.gone() {
                    return Err(f);
                }
                return Err(Fail::new(
                    "execd closed the connection; pending requests are rejected. Start execctl approve again once execd runs",
                ));
            }
            Heard::InputGone if subscribed => break,
            Heard::InputGone => input_gone = true,
            Heard::Daemon(v) => {
                if v["id"] == "subscribe" && v.get("method").is_none() {
                    if let Some(e) = v.get("error") {
                        let err = crate::client::CallError::Rpc {
                            code: e["code"].as_i64().unwrap_or(0),
                            message: e["message"].as_str().unwrap_or("").to_string(),
                            data: e.get("data").cloned(),
                        };
                        return Err(Fail::from(err));
                    }
                    if v["result"]["policy"] == false {
                        return Err(Fail::new(
                            "execd runs without a policy (--policy FILE), so no command ever \
                             asks for approval: there is nothing to approve",
                        ));
                    }
                    subscribed = true;
                    wire.answered = true;
                    // Scripts may start their agents once this line is out.
                    if ctx.json {
                        output::print_json_line(&json!({"type": "ready"}))?;
                    } else {
                        warn("approving requests of the policy; Ctrl-C to stop");
                    }
                    if input_gone {
                        break;
                    }
                    continue;
                }
                match v["method"].as_str() {
                    Some("request") if v.get("id").is_some() => {
                        let payload = v["params"]["payload"].clone();
                        let request_id = payload["id"]
                            .as_str()
                            .map(str::to_string)
                            .or_else(|| v["id"].as_str().map(str::to_string))
                            .unwrap_or_else(|| v["id"].to_string());
                        let r = ApprovalAsk {
                            rpc_id: v["id"].clone(),
                            request_id,
                            payload,
                        };
                        if ctx.json {
                            output::print_json_line(&request_json(&r))?;
                        }
                        queue.push_back(r);
                        if queue.len() == 1 && feedback_for.is_none() {
                            show(&queue, ctx.json)?;
                        }
                    }
                    Some("event") if v["params"]["type"] == "ApprovalRequestResolved" => {
                        let payload = &v["params"]["payload"];
                        let rid = payload["request_id"].as_str().unwrap_or("");
                        let response = payload["response"].as_str().unwrap_or("?");
                        let withdrawn = payload["reason"] == "withdrawn";
                        if ctx.json {
                            let mut line = json!({"type": "approval_resolved",
                                "request_id": rid, "response": response});
                            if withdrawn {
                                line["reason"] = json!("withdrawn");
                            }
                            output::print_json_line(&line)?;
                        }
                        let Some(i) = queue.iter().position(|r| r.request_id == rid) else {
                            continue; // ours, already answered
                        };
                        queue.remove(i);
                        if feedback_for.as_ref().is_some_and(|r| r.request_id == rid) {
                            feedback_for = None;
                        }
                        if !ctx.json {
                            let lead = if i == 0 { "\n" } else { "" };
                            let how = if withdrawn {
                                "was withdrawn by its requester".to_string()
                            } else {
                                format!("was answered elsewhere: {}", output::visible(response))
                            };
                            output::print(&format!("{lead}{} {how}\n", output::visible(rid)))?;
                            if i == 0 && feedback_for.is_none() {
                                show(&queue, false)?;
                            }
                        }
                    }
                    _ => {}
                }
            }
            Heard::Line(line) if ctx.json => {
                if let Err(f) = json_answer(&mut wire, &mut queue, &line) {
                    output::print_json_line(&json!({"type": "error", "message": f.message}))?;
                }
            }
            Heard::Line(line) => {
                if let Some(r) = feedback_for.take() {
                    wire.answer(&r, "reject", Some(line.trim()))?;
                    output::print(&format!("{}: rejected\n", output::visible(&r.request_id)))?;
                    show(&queue, false)?;
                    continue;
                }
                if queue.is_empty() {
                    if !line.trim().is_empty() {
                        output::print("no request is waiting\n")?;
                    }
                    continue;
                }
                let response = match line.trim().to_ascii_lowercase().as_str() {
                    "y" | "yes" => "approve",
                    "s" | "session" => "approve_for_session",
                    "n" | "no" => {
                        feedback_for = queue.pop_front();
                        output::print(FEEDBACK)?;
                        continue;
                    }
                    _ => {
                        output::print(&format!("answer y, n or s\n{PROMPT}"))?;
                        continue;
                    }
                };
                if let Some(r) = queue.pop_front() {
                    wire.answer(&r, response, None)?;
                    let said = if response == "approve" {
                        "approved".to_string()
                    } else {
                        "approved for the rest of its session".to_string()
                    };
                    output::print(&format!("{}: {said}\n", output::visible(&r.request_id)))?;
                }
                show(&queue, false)?;
            }
        }
    }
    if !subscribed {
        return Err(Fail::new(
            "execd did not answer approvals/subscribe; it may be older than execctl",
        ));
    }
    Ok(0)
}

/// One answer line of `approve --json`: `{request_id, response, feedback?}`.
fn json_answer(wire: &mut Wire, queue: &mut VecDeque<ApprovalAsk>, line: &str) -> Res<()> {
    if line.trim().is_empty() {
        return Ok(());
    }
    let v: Value = serde_json::from_str(line)
        .map_err(|e| Fail::new(format!("an answer must be one JSON object a line: {e}")))?;
    let rid = v["request_id"].as_str().unwrap_or("");
    let response = v["response"].as_str().unwrap_or("");
    if !matches!(response, "approve" | "approve_for_session" | "reject") {
        return Err(Fail::new(format!(
            "response must be approve, approve_for_session or reject, got {}",
            v["response"]
        )));
    }
    let Some(i) = queue.iter().position(|r| r.request_id == rid) else {
        return Err(Fail::new(format!(
            "no pending request {rid:?} (answered elsewhere, withdrawn, or never sent)"
        )));
    };
    let r = queue
        .remove(i)
        .ok_or_else(|| Fail::new("request vanished"))?;
    wire.answer(&r, response, v["feedback"].as_str())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_include_the_primary_gid() {
        let g = own_groups();
        assert!(!g.is_empty());
    }

    /// A request as the daemon sends it: `description`, a brief, and the `execd` block.
    fn asked(description: &str, data: Value) -> ApprovalAsk {
        ApprovalAsk {
            rpc_id: json!("appr_7"),
            request_id: "appr_7".into(),
            payload: json!({"id": "appr_7", "tool_call_id": "cmd_12", "description": description,
                "display": [{"type": "brief", "text": "rule push: ..."}, {"type": "execd", "data": data}]}),
        }
    }

    #[test]
    fn a_request_reads_as_lines() {
        let r = asked(
            "git push origin main",
            json!({"rule": "push", "justification": "pushes leave this machine",
                "commands": [{"command": "git push origin main", "rules": [{"rule": "push", "decision": "ask"}]},
                             {"command": "ls", "rules": []}],
                "commands_left_out": 0, "unparsed": false,
                "env": [{"name": "BASH_ENV", "value": "evil.sh"}], "env_left_out": 0,
                "cwd": "/r", "uid": 1000, "pid": 4242, "session": "s1"}),
        );
        let t = request_text(&r);
        assert!(
            t.contains("approval request appr_7 (command id cmd_12)"),
            "{t}"
        );
        assert!(t.contains("  command  git push origin main\n"), "{t}");
        assert!(
            t.contains("  runs     git push origin main    [rule push (ask)]\n"),
            "{t}"
        );
        assert!(t.contains("  runs     ls    [no rule]\n"), "{t}");
        assert!(t.contains("  sets     BASH_ENV=evil.sh\n"), "{t}");
        assert!(
            t.contains("  rule     push: pushes leave this machine\n"),
            "{t}"
        );
        assert!(t.contains("  uid      1000 (pid 4242)\n"), "{t}");
        assert!(t.contains("  cwd      /r\n"), "{t}");
        assert!(t.contains("  session  s1\n"), "{t}");
        let j = request_json(&r);
        assert_eq!(j["command"], "git push origin main");
        assert_eq!(j["details"]["env"][0]["name"], "BASH_ENV");
        assert_eq!(
            j["display"][0].as_str().map(|s| s.starts_with("rule push")),
            Some(true)
        );
    }

    #[test]
    fn what_the_requester_wrote_cannot_redraw_the_request() {
        // A carriage return and "erase line" would leave the approver reading `ls`.
        let r = asked(
            "rm -rf ~ #\r\u{1b}[2K  command  ls\nsecond",
            json!({"rule": "rm", "commands": [{"command": "rm -rf ~", "rules": []}],
                "env": [{"name": "X", "value": "a\rb"}],
                "cwd": "/t\u{1b}[8m\nx", "uid": 0, "pid": 9, "session": "s\u{202e}1\r"}),
        );
        let t = request_text(&r);
        assert!(
            t.contains("  command  rm -rf ~ #\\r\\x1b[2K  command  ls\\nsecond\n"),
            "{t}"
        );
        assert!(t.contains("  cwd      /t\\x1b[8m\\nx\n"), "{t}");
        assert!(t.contains("  session  s\\u{202e}1\\r\n"), "{t}");
        assert!(t.contains("  sets     X=a\\rb\n"), "{t}");
        assert!(!t.contains(['\r', '\u{1b}', '\u{202e}']), "{t:?}");
        // Another sender's request: its briefs shown whole, escaped the same way.
        let other = ApprovalAsk {
            rpc_id: json!("r"),
            request_id: "r".into(),
            payload: json!({"description": "ls", "display": [{"type": "brief", "text": "not ours\u{1b}[2J"}]}),
        };
        let t = request_text(&other);
        assert!(t.ends_with("           not ours\\x1b[2J\n"), "{t:?}");
    }
}
