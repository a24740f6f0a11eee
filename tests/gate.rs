//! The gate (PROTOCOL.md section 7): policy decisions, Wire approvals and the audit log,
//! against the real daemon.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::util::*;

const POLICY: &str = r#"{
  "default": "allow",
  "unparsed": "ask",
  "rules": [
    {"name": "no-force-push", "pattern": ["git", "push", ["-f", "--force"]], "decision": "deny",
     "justification": "history is shared",
     "match": ["git push -f origin main"], "not_match": ["git push origin main"]},
    {"name": "rm", "pattern": ["rm"], "decision": "ask",
     "justification": "deletes files"},
    {"name": "echo-ask", "pattern": ["echo", "ask"], "decision": "ask"}
  ]
}"#;

/// A daemon with `POLICY` (and `extra` flags); returns it and the policy file's path.
fn daemon_with_policy(extra: &[&str]) -> (Daemon, PathBuf) {
    daemon_with_policy_in(TempDir::new(), extra)
}

/// `daemon_with_policy` in `dir`.
fn daemon_with_policy_in(dir: TempDir, extra: &[&str]) -> (Daemon, PathBuf) {
    let policy = dir.path().join("policy.json");
    std::fs::write(&policy, POLICY).expect("write policy");
    let socket = dir.path().join("execd.sock");
    let mut flags = vec!["--policy", policy.to_str().expect("utf-8")];
    flags.extend_from_slice(extra);
    let d = Daemon::start_at(dir, socket, &flags);
    (d, policy)
}

/// A connection subscribed as an approver, made by another process: the daemon never
/// sends a request to the requester's own process.
fn approver(d: &Daemon) -> Relayed {
    let mut a = d.client_in_other_process();
    ok(&mut a, "approvals/subscribe", json!({}));
    a
}

/// The next `ApprovalRequestResolved` event an approver gets.
#[track_caller]
fn next_resolved(a: &mut Client) -> Value {
    loop {
        let m = a.read_message(Some(WAIT)).expect("a resolved event");
        if m["params"]["type"] == "ApprovalRequestResolved" {
            return m;
        }
    }
}

/// Sends an approver's Wire response.
fn answer(a: &mut Client, id: &Value, response: &str, feedback: Option<&str>) {
    let mut result = json!({"request_id": id, "response": response});
    if let Some(f) = feedback {
        result["feedback"] = json!(f);
    }
    let msg = json!({"jsonrpc": "2.0", "id": id, "result": result});
    a.send_line(msg.to_string().as_bytes()).expect("answer");
}

/// Sends a request without waiting for its answer; returns its id.
fn send(c: &mut Client, method: &str, params: Value) -> u64 {
    c.send(method, params).expect("send")
}

#[test]
fn deny_names_the_rule_and_starts_nothing() {
    let (d, _) = daemon_with_policy(&[]);
    let mut c = d.client();
    let (code, _, data) = err(
        &mut c,
        "bash/exec",
        json!({"command": "cd /tmp && git push --force origin main"}),
    );
    assert_eq!(code, -32005);
    let data = data.expect("data");
    assert_eq!(data["rule"], "no-force-push");
    assert_eq!(data["justification"], "history is shared");
    let (code, _, _) = err(
        &mut c,
        "terminal/create",
        json!({"sessionId": "s", "command": "/usr/bin/git", "args": ["push", "-f"]}),
    );
    assert_eq!(code, -32005, "basename matching");
    assert!(terminals(&mut c).is_empty());
    // A session made for the denied command alone is not kept.
    assert_eq!(ok(&mut c, "bash/sessions", json!({})), json!([]));
    // Allowed ones run.
    let r = ok(&mut c, "bash/exec", json!({"command": "echo fine"}));
    assert_eq!(r["stdout"], "fine\n");
}

#[test]
fn ask_with_no_approver_is_refused_at_once() {
    let (d, _) = daemon_with_policy(&[]);
    let mut c = d.client();
    let (code, _, data) = err(
        &mut c,
        "bash/exec",
        json!({"command": "rm -f /tmp/nothing"}),
    );
    assert_eq!(code, -32006);
    assert_eq!(data.expect("data")["reason"], "no approver");
}

/// Approved: a synchronous `bash/exec` goes on exactly as without the gate; the
/// approver saw the command, the rule and its justification.
#[test]
fn ask_and_approve_a_synchronous_bash_exec() {
    let (d, _) = daemon_with_policy(&[]);
    let mut a = approver(&d);
    let mut c = d.client();
    let file = d.dir.path().join("victim");
    std::fs::write(&file, "x").expect("write");
    let line = format!("rm {} && echo removed", file.display());
    let id = send(
        &mut c,
        "bash/exec",
        json!({"command": line, "session_id": "s1"}),
    );
    let req = next_request(&mut a);
    let p = &req["params"]["payload"];
    assert_eq!(req["method"], "request");
    assert_eq!(req["params"]["type"], "ApprovalRequest");
    assert_eq!(p["id"], req["id"]);
    assert_eq!(p["description"], line);
    assert_eq!(p["sender"], "execd");
    assert_eq!(p["action"], "run command");
    assert!(p["tool_call_id"].as_str().unwrap().starts_with("cmd_"));
    let brief = p["display"][0]["text"].as_str().expect("brief");
    assert_eq!(p["display"][0]["type"], "brief");
    assert!(brief.contains("rule rm: deletes files"), "{brief}");
    assert!(brief.contains("session s1"), "{brief}");
    assert!(file.exists(), "nothing ran before the answer");
    answer(&mut a, &req["id"], "approve", None);
    let r = c.wait_response(id).expect("the exec result");
    assert_eq!(r["stdout"], "removed\n");
    assert_eq!(r["status"], "completed");
    assert_eq!(
        r["command_id"], p["tool_call_id"],
        "the id the approver saw"
    );
    assert!(!file.exists());
    let resolved = next_resolved(&mut a);
    assert_eq!(resolved["params"]["payload"]["request_id"], req["id"]);
    assert_eq!(resolved["params"]["payload"]["response"], "approve");
}

#[test]
fn ask_and_approve_an_async_bash_exec_and_an_acp_terminal() {
    let (d, _) = daemon_with_policy(&[]);
    let mut a = approver(&d);
    let mut c = d.client();
    let id = send(
        &mut c,
        "bash/exec",
        json!({"command": "echo ask async", "async_mode": true}),
    );
    let req = next_request(&mut a);
    answer(&mut a, &req["id"], "approve", None);
    let r = c.wait_response(id).expect("async result");
    // Started: an async answer says how it stands when the spawn is reported.
    assert!(
        r["status"] == "running" || r["status"] == "completed",
        "{r}"
    );
    let id = send(
        &mut c,
        "terminal/create",
        json!({"sessionId": "acp", "command": "rm", "args": ["-f", "/nonexistent-file"]}),
    );
    let req = next_request(&mut a);
    assert_eq!(
        req["params"]["payload"]["description"],
        "rm -f /nonexistent-file"
    );
    answer(&mut a, &req["id"], "approve", None);
    let r = c.wait_response(id).expect("terminal id");
    let tid = r["terminalId"].as_str().expect("terminalId").to_string();
    assert_eq!(r["terminalId"], req["params"]["payload"]["tool_call_id"]);
    let exit = ok(
        &mut c,
        "terminal/wait_for_exit",
        json!({"sessionId": "acp", "terminalId": tid}),
    );
    assert_eq!(exit["exitCode"], 0);
}

#[test]
fn reject_with_feedback_and_an_error_response() {
    let (d, _) = daemon_with_policy(&[]);
    let mut a = approver(&d);
    let mut c = d.client();
    let id = send(&mut c, "bash/exec", json!({"command": "rm -rf /tmp/x"}));
    let req = next_request(&mut a);
    answer(&mut a, &req["id"], "reject", Some("not today"));
    match c.wait_response(id) {
        Err(CallError::Rpc { code, data, .. }) => {
            assert_eq!(code, -32006);
            let data = data.expect("data");
            assert_eq!(data["reason"], "rejected");
            assert_eq!(data["feedback"], "not today");
            assert_eq!(data["rule"], "rm");
        }
        other => panic!("expected -32006, got {other:?}"),
    }
    // An error response counts as a reject.
    let id = send(&mut c, "bash/exec", json!({"command": "rm -rf /tmp/y"}));
    let req = next_request(&mut a);
    let msg = json!({"jsonrpc": "2.0", "id": req["id"], "error": {"code": -1, "message": "no"}});
    a.send_line(msg.to_string().as_bytes()).expect("send");
    assert!(matches!(
        c.wait_response(id),
        Err(CallError::Rpc { code: -32006, .. })
    ));
}

#[test]
fn an_unanswered_ask_times_out() {
    let (d, _) = daemon_with_policy(&["--approval-timeout", "300ms"]);
    let mut a = approver(&d);
    let mut c = d.client();
    let (code, _, data) = err(&mut c, "bash/exec", json!({"command": "rm -f /tmp/z"}));
    assert_eq!(code, -32006);
    assert_eq!(data.expect("data")["reason"], "timeout");
    let req = next_request(&mut a);
    let resolved = next_resolved(&mut a);
    assert_eq!(resolved["params"]["payload"]["request_id"], req["id"]);
    assert_eq!(resolved["params"]["payload"]["response"], "reject");
}

/// Two approvers: both get the request, the first answer wins, the second is ignored,
/// and both hear how it ended.
#[test]
fn two_approvers_first_answer_wins() {
    let (d, _) = daemon_with_policy(&[]);
    let mut a1 = approver(&d);
    let mut a2 = approver(&d);
    let mut c = d.client();
    let id = send(&mut c, "bash/exec", json!({"command": "echo ask first"}));
    let r1 = next_request(&mut a1);
    let r2 = next_request(&mut a2);
    assert_eq!(r1, r2);
    answer(&mut a2, &r2["id"], "approve", None);
    // The two approvers reach the daemon through two relay processes, which keep no
    // order between them: the second answer goes once the first has been taken.
    let resolved = next_resolved(&mut a2);
    assert_eq!(resolved["params"]["payload"]["response"], "approve");
    answer(&mut a1, &r1["id"], "reject", None);
    let r = c.wait_response(id).expect("approved by the first answer");
    assert_eq!(r["stdout"], "ask first\n");
    let resolved = next_resolved(&mut a1);
    assert_eq!(resolved["params"]["payload"]["response"], "approve");
}

/// `approve_for_session` approves later commands of the same rule in the same session,
/// and not in another session.
#[test]
fn approve_for_session_covers_the_session_only() {
    let (d, _) = daemon_with_policy(&[]);
    let mut a = approver(&d);
    let mut c = d.client();
    let id = send(
        &mut c,
        "bash/exec",
        json!({"command": "rm -f /tmp/a1", "session_id": "one"}),
    );
    let req = next_request(&mut a);
    answer(&mut a, &req["id"], "approve_for_session", None);
    c.wait_response(id).expect("approved");
    // Same rule, same session: no question asked.
    let r = ok(
        &mut c,
        "bash/exec",
        json!({"command": "rm -f /tmp/a2 && echo again", "session_id": "one"}),
    );
    assert_eq!(r["stdout"], "again\n");
    // Another session: asked again.
    let id = send(
        &mut c,
        "bash/exec",
        json!({"command": "rm -f /tmp/a3", "session_id": "two"}),
    );
    let req2 = next_request(&mut a);
    assert_ne!(req2["id"], req["id"]);
    answer(&mut a, &req2["id"], "reject", None);
    assert!(c.wait_response(id).is_err());
    // Another rule in the first session: asked too.
    let id = send(
        &mut c,
        "bash/exec",
        json!({"command": "echo ask other", "session_id": "one"}),
    );
    let req3 = next_request(&mut a);
    assert!(req3["params"]["payload"]["display"][0]["text"]
        .as_str()
        .unwrap()
        .contains("rule echo-ask"));
    answer(&mut a, &req3["id"], "approve", None);
    c.wait_response(id).expect("approved");
}

/// A requester that leaves while its command waits for approval withdraws it: nothing
/// starts, even if an approver says yes afterwards.
#[test]
fn a_requester_that_disconnects_withdraws_its_ask() {
    let (d, _) = daemon_with_policy(&[]);
    let mut a = approver(&d);
    let marker = d.dir.path().join("ran");
    let mut c = d.client();
    send(
        &mut c,
        "bash/exec",
        json!({"command": format!("rm -f /nonexistent; touch '{}'", marker.display())}),
    );
    let req = next_request(&mut a);
    drop(c);
    let resolved = next_resolved(&mut a);
    assert_eq!(resolved["params"]["payload"]["request_id"], req["id"]);
    assert_eq!(resolved["params"]["payload"]["response"], "reject");
    answer(&mut a, &req["id"], "approve", None);
    std::thread::sleep(Duration::from_millis(300));
    assert!(!marker.exists(), "a withdrawn command never starts");
    let mut c = d.client();
    assert!(ok(&mut c, "bash/commands", json!({}))["commands"]
        .as_array()
        .unwrap()
        .is_empty());
}

#[test]
fn pending_approvals_are_capped() {
    let (d, _) = daemon_with_policy(&["--max-pending-approvals", "2"]);
    let _a = approver(&d);
    let mut c = d.client();
    send(&mut c, "bash/exec", json!({"command": "rm -f /tmp/p1"}));
    send(&mut c, "bash/exec", json!({"command": "rm -f /tmp/p2"}));
    let (code, _, data) = err(&mut c, "bash/exec", json!({"command": "rm -f /tmp/p3"}));
    assert_eq!(code, -32003);
    assert_eq!(data.expect("data")["limit"], "max-pending-approvals");
}

/// `policy/check` answers what the daemon's policy decides, without running anything.
#[test]
fn policy_check_shows_the_decision_and_the_rules() {
    let (d, _) = daemon_with_policy(&[]);
    let mut c = d.client();
    let r = ok(
        &mut c,
        "policy/check",
        json!({"command": "git status && git push -f"}),
    );
    assert_eq!(r["decision"], "deny");
    assert_eq!(r["rule"], "no-force-push");
    assert_eq!(r["policy_loaded"], true);
    assert_eq!(r["hits"][0]["rule"], "no-force-push");
    let r = ok(
        &mut c,
        "policy/check",
        json!({"command": "echo", "args": ["$(id)"]}),
    );
    assert_eq!(
        r["decision"], "allow",
        "a direct argv is not a shell line: {r}"
    );
    let r = ok(&mut c, "policy/check", json!({"command": "echo $(id)"}));
    assert_eq!(r["decision"], "ask");
    assert_eq!(r["rule"], "unparsed");
    assert!(terminals(&mut c).is_empty());
}

/// `execd --check-policy` validates a file, its examples included.
#[test]
fn check_policy_validates_a_file_and_its_examples() {
    let dir = TempDir::new();
    let good = dir.path().join("good.json");
    std::fs::write(&good, POLICY).expect("write");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_execd"))
        .arg("--check-policy")
        .arg(&good)
        .output()
        .expect("run");
    assert!(out.status.success(), "{out:?}");
    let bad = dir.path().join("bad.json");
    std::fs::write(
        &bad,
        POLICY.replace("git push origin main", "git push -f x"),
    )
    .expect("write");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_execd"))
        .arg("--check-policy")
        .arg(&bad)
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no-force-push"), "{err}");
    // A daemon refuses to start with it.
    let socket = dir.path().join("s.sock");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_execd"))
        .arg("--socket")
        .arg(&socket)
        .arg("--policy")
        .arg(&bad)
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(1));
    assert!(!socket.exists());
}

// ---- audit --------------------------------------------------------------------------------

/// Every line of the audit file, parsed.
fn audit_lines(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect()
}

/// A daemon with `POLICY` and an audit file; returns it, the policy's path and the audit
/// file's.
fn daemon_with_audit() -> (Daemon, PathBuf, PathBuf) {
    let dir = TempDir::new();
    let audit = dir.path().join("audit.jsonl");
    let (d, policy) = daemon_with_policy_in(dir, &["--audit", audit.to_str().expect("utf-8")]);
    (d, policy, audit)
}

/// A scripted session read back from the audit file: every line is valid JSON with `ts`
/// and `event`, and each event carries its fields.
#[test]
fn the_audit_log_records_every_decision_start_and_end() {
    let (d, _, audit) = daemon_with_audit();
    let mut a = approver(&d);
    let mut c = d.client();
    let id = create(&mut c, "sh", &["-c", "echo hi; exit 3"]);
    wait_exit(&mut c, &id);
    ok(
        &mut c,
        "terminal/release",
        json!({"sessionId": "s", "terminalId": id}),
    );
    let _ = err(&mut c, "bash/exec", json!({"command": "git push -f"}));
    let rq = send(
        &mut c,
        "bash/exec",
        json!({"command": "rm -f /tmp/aud", "session_id": "w"}),
    );
    let req = next_request(&mut a);
    answer(&mut a, &req["id"], "approve", None);
    c.wait_response(rq).expect("approved");
    let rq = send(&mut c, "bash/exec", json!({"command": "rm -f /tmp/aud2"}));
    let req2 = next_request(&mut a);
    answer(&mut a, &req2["id"], "reject", Some("no"));
    let _ = c.wait_response(rq);
    let slow = create(&mut c, "sleep", &["30"]);
    ok(
        &mut c,
        "terminal/kill",
        json!({"sessionId": "s", "terminalId": slow}),
    );
    ok(&mut c, "bash/sessions/close", json!({"session_id": "w"}));
    wait_until("the audit file has the session close", || {
        audit_lines(&audit)
            .iter()
            .any(|r| r["event"] == "session_close")
    });
    let lines = audit_lines(&audit);
    for r in &lines {
        let ts = r["ts"].as_str().expect("ts");
        assert!(ts.len() == 24 && ts.ends_with('Z'), "{r}");
        assert!(r["event"].is_string(), "{r}");
    }
    let of =
        |event: &str| -> Vec<&Value> { lines.iter().filter(|r| r["event"] == event).collect() };
    let me = std::process::id();
    let connect = of("connect");
    assert!(
        connect.iter().any(|r| r["peer"]["pid"] == me),
        "{connect:?}"
    );
    let start = of("start");
    let first = start
        .iter()
        .find(|r| r["id"] == id)
        .expect("start of the terminal");
    assert_eq!(first["argv"], json!(["sh", "-c", "echo hi; exit 3"]));
    assert_eq!(first["decision"], "allow");
    assert_eq!(first["rule"], "default");
    assert_eq!(first["session"], "s");
    assert!(first["cwd"].is_string() && first["uid"].is_u64());
    assert_eq!(first["peer"]["uid"], 0);
    let exit = of("exit");
    let e = exit
        .iter()
        .find(|r| r["id"] == id)
        .expect("exit of the terminal");
    assert_eq!(e["status"], "completed");
    assert_eq!(e["exit_code"], 3);
    assert_eq!(e["signal"], Value::Null);
    assert_eq!(e["stdout_bytes"], 3);
    for k in ["duration_ms", "cpu_ms", "max_rss_kb"] {
        assert!(e[k].is_u64(), "{k}: {e}");
    }
    assert!(of("release").iter().any(|r| r["id"] == id));
    let deny = of("deny");
    assert_eq!(deny[0]["rule"], "no-force-push");
    let ask = of("ask");
    assert_eq!(ask.len(), 2);
    assert_eq!(ask[0]["rule"], "rm");
    let approve = of("approve");
    // The approver is another process: the relay execctl that made its connection.
    assert_eq!(approve[0]["approver"]["pid"], a.pid());
    assert_ne!(approve[0]["approver"]["pid"], me);
    assert_eq!(approve[0]["id"], req["params"]["payload"]["tool_call_id"]);
    let approved_start = start
        .iter()
        .find(|r| r["id"] == req["params"]["payload"]["tool_call_id"])
        .expect("start after approval");
    assert_eq!(approved_start["decision"], "approve");
    assert_eq!(approved_start["line"], "rm -f /tmp/aud");
    let reject = of("reject");
    assert_eq!(reject[0]["reason"], "rejected");
    assert_eq!(reject[0]["feedback"], "no");
    let kill = of("kill");
    assert!(kill
        .iter()
        .any(|r| r["id"] == slow && r["reason"] == "request"));
    assert_eq!(of("session_close")[0]["session"], "w");
}

/// Log rotation: rename the file, SIGHUP, and nothing is lost; new records go to the new
/// file. A bad policy on SIGHUP keeps the old one, and says so.
#[test]
fn sighup_reopens_the_audit_file_and_reloads_the_policy() {
    let (d, policy, audit) = daemon_with_audit();
    let mut c = d.client();
    let a = create(&mut c, "true", &[]);
    wait_exit(&mut c, &a);
    let rotated = d.dir.path().join("audit.jsonl.1");
    std::fs::rename(&audit, &rotated).expect("rotate");
    let b = create(&mut c, "true", &[]);
    wait_exit(&mut c, &b);
    // A bad policy: the old one stays in force.
    std::fs::write(&policy, "{ not json").expect("write");
    unsafe_kill(d.pid(), libc::SIGHUP);
    wait_until("the new audit file exists", || audit.exists());
    let c2 = create(&mut c, "true", &[]);
    wait_exit(&mut c, &c2);
    let (code, _, _) = err(&mut c, "bash/exec", json!({"command": "git push -f"}));
    assert_eq!(code, -32005, "the old policy is still in force");
    wait_until("records in the new file", || {
        audit_lines(&audit).iter().any(|r| r["id"] == c2)
    });
    let old = audit_lines(&rotated);
    let new = audit_lines(&audit);
    assert!(old.iter().any(|r| r["id"] == a && r["event"] == "exit"));
    assert!(
        old.iter().any(|r| r["id"] == b && r["event"] == "exit"),
        "written before the HUP"
    );
    assert!(!new.iter().any(|r| r["id"] == b));
    let reload = new
        .iter()
        .find(|r| r["event"] == "policy_reload")
        .expect("the reload is audited");
    assert_eq!(reload["ok"], false);
    assert!(
        reload["error"].as_str().unwrap().contains("policy.json"),
        "{reload}"
    );
    assert!(d.log().contains("policy not reloaded"), "{}", d.log());
    // A good policy now: reloaded.
    std::fs::write(&policy, r#"{"rules": []}"#).expect("write");
    unsafe_kill(d.pid(), libc::SIGHUP);
    wait_until("the reload", || {
        audit_lines(&audit)
            .iter()
            .any(|r| r["event"] == "policy_reload" && r["ok"] == true)
    });
    let r = ok(&mut c, "bash/exec", json!({"command": "echo git push -f"}));
    assert_eq!(r["status"], "completed");
}

/// An audit target that stops taking writes (a FIFO whose reader is paused) does not
/// stop the daemon serving: commands are refused once their start records no longer fit,
/// and once it drains, a `dropped` record says what was lost.
#[test]
fn a_stalled_audit_target_never_stops_the_daemon() {
    use std::io::Read;
    let dir = TempDir::new();
    let fifo = dir.path().join("audit.fifo");
    let path = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: a valid path for mkfifo(3).
    assert_eq!(unsafe { libc::mkfifo(path.as_ptr(), 0o600) }, 0);
    let socket = dir.path().join("execd.sock");
    let flags = ["--audit", fifo.to_str().unwrap()];
    let d = Daemon::start_at(dir, socket, &flags);
    // The reader opens the FIFO and then reads nothing for a while.
    let mut reader = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags_nonblock()
        .open(&fifo)
        .expect("open fifo");
    let mut c = d.client();
    let long = "y".repeat(8 << 10);
    // Commands run while their start records fit; then they are refused (-32003
    // `audit`), never run unrecorded (PROTOCOL 7.4).
    let mut refused = 0;
    for _ in 0..300 {
        let created = c.call(
            "terminal/create",
            json!({"sessionId": "s", "command": "true", "args": [long]}),
        );
        let id = match created {
            Ok(r) => r["terminalId"].as_str().expect("id").to_string(),
            Err(CallError::Rpc { code, data, .. }) => {
                assert_eq!(
                    (code, data.expect("data")["limit"].clone()),
                    (-32003, json!("audit"))
                );
                refused += 1;
                continue;
            }
            Err(e) => panic!("{e:?}"),
        };
        wait_exit(&mut c, &id);
        ok(
            &mut c,
            "terminal/release",
            json!({"sessionId": "s", "terminalId": id}),
        );
    }
    assert!(
        refused > 0,
        "300 records of 8 KiB do not fit a stalled 1 MiB queue"
    );
    // Records that may be lost (connections', more than the room a start record did not
    // find) are counted once the queue is full.
    for _ in 0..100 {
        drop(d.client());
    }
    assert_eq!(ok(&mut c, "initialize", json!({}))["protocolVersion"], 1);
    let mut text = Vec::new();
    let mut buf = vec![0u8; 1 << 16];
    wait_until("a dropped record", || {
        let _ = ok(&mut c, "terminal/list", json!({}));
        while let Ok(n) = reader.read(&mut buf) {
            if n == 0 {
                break;
            }
            text.extend_from_slice(&buf[..n]);
        }
        String::from_utf8_lossy(&text).contains("\"event\":\"dropped\"")
    });
    let all = String::from_utf8_lossy(&text).to_string();
    let dropped: Value = all
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|r| r["event"] == "dropped")
        .expect("dropped record");
    assert!(dropped["count"].as_u64().unwrap() > 0);
}

trait NonBlock {
    fn custom_flags_nonblock(&mut self) -> &mut Self;
}

impl NonBlock for std::fs::OpenOptions {
    fn custom_flags_nonblock(&mut self) -> &mut Self {
        use std::os::unix::fs::OpenOptionsExt;
        self.custom_flags(libc::O_NONBLOCK)
    }
}

/// `$/cancel_request` withdraws a request that waits for an approver: it is answered
/// `-32800`, the approvers hear it is over, and nothing starts.
#[test]
fn cancel_request_withdraws_an_ask() {
    let (d, _) = daemon_with_policy(&[]);
    let mut a = approver(&d);
    let marker = d.dir.path().join("ran");
    let mut c = d.client();
    let id = send(
        &mut c,
        "bash/exec",
        json!({"command": format!("rm -f /nonexistent; touch '{}'", marker.display())}),
    );
    let req = next_request(&mut a);
    let cancel =
        json!({"jsonrpc": "2.0", "method": "$/cancel_request", "params": {"requestId": id}});
    c.send_line(cancel.to_string().as_bytes()).expect("cancel");
    match c.wait_response(id) {
        Err(CallError::Rpc { code, .. }) => assert_eq!(code, -32800),
        other => panic!("expected -32800, got {other:?}"),
    }
    let resolved = next_resolved(&mut a);
    assert_eq!(resolved["params"]["payload"]["request_id"], req["id"]);
    assert_eq!(resolved["params"]["payload"]["response"], "reject");
    answer(&mut a, &req["id"], "approve", None);
    std::thread::sleep(Duration::from_millis(300));
    assert!(!marker.exists(), "a cancelled ask never starts");
}

/// Shutdown answers a request that waits for an approver with `-32007`, and an answer
/// that comes late starts nothing.
#[test]
fn shutdown_answers_what_waits_for_an_approver() {
    let (mut d, _) = daemon_with_policy(&[]);
    let mut a = approver(&d);
    let marker = d.dir.path().join("ran");
    let mut c = d.client();
    let id = send(
        &mut c,
        "bash/exec",
        json!({"command": format!("rm -f /nonexistent; touch '{}'", marker.display())}),
    );
    let req = next_request(&mut a);
    unsafe_kill(d.pid(), libc::SIGTERM);
    match c.wait_response(id) {
        Err(CallError::Rpc { code, .. }) => assert_eq!(code, -32007),
        other => panic!("expected -32007, got {other:?}"),
    }
    // A late approval starts nothing. With nothing running the daemon may already have
    // finished and closed the approver's socket, so the write itself may fail.
    let late = json!({"jsonrpc": "2.0", "id": req["id"],
                      "result": {"request_id": req["id"], "response": "approve"}});
    let _ = a.send_line(late.to_string().as_bytes());
    assert_eq!(d.terminate(), Some(0));
    assert!(!marker.exists(), "nothing starts during shutdown");
}

/// Closing a session withdraws its commands still waiting for an approver: the requester
/// is answered `-32006` and a later approval starts nothing.
#[test]
fn closing_a_session_withdraws_its_asks() {
    let (d, _) = daemon_with_policy(&[]);
    let mut a = approver(&d);
    let marker = d.dir.path().join("ran");
    let mut c = d.client();
    ok(&mut c, "bash/sessions/create", json!({"session_id": "s"}));
    let id = send(
        &mut c,
        "bash/exec",
        json!({"command": format!("rm -f /nonexistent; touch '{}'", marker.display()),
               "session_id": "s"}),
    );
    let req = next_request(&mut a);
    let mut other = d.client();
    ok(
        &mut other,
        "bash/sessions/close",
        json!({"session_id": "s"}),
    );
    match c.wait_response(id) {
        Err(CallError::Rpc { code, data, .. }) => {
            assert_eq!(code, -32006);
            assert_eq!(data.expect("data")["reason"], "session closed");
        }
        other => panic!("expected -32006, got {other:?}"),
    }
    let resolved = next_resolved(&mut a);
    assert_eq!(resolved["params"]["payload"]["request_id"], req["id"]);
    answer(&mut a, &req["id"], "approve", None);
    std::thread::sleep(Duration::from_millis(300));
    assert!(!marker.exists(), "a withdrawn ask never starts");
    assert_eq!(
        ok(&mut c, "bash/commands", json!({}))["commands"],
        json!([])
    );
}

/// An approver that does not read what it is sent counts as absent once its buffer is
/// full (asks are refused "no approver" instead of piling up for it), and is asked again
/// once it reads. A long command line reaches it cut in the middle, with a marker, its
/// end still there.
#[test]
fn an_approver_that_stops_reading_is_asked_nothing() {
    let (d, _) = daemon_with_policy(&["--client-buffer", "64K"]);
    let mut a = approver(&d);
    let mut c = d.client();
    let long = format!("rm -f /nonexistent/{}end", "x".repeat(100_000));
    let mut asked = 0;
    loop {
        assert!(asked < 2000, "still asked after {asked} unread requests");
        let id = send(&mut c, "bash/exec", json!({"command": long}));
        // Withdrawn at once when it was asked; refused at once when nobody listens.
        let cancel =
            json!({"jsonrpc": "2.0", "method": "$/cancel_request", "params": {"requestId": id}});
        c.send_line(cancel.to_string().as_bytes()).expect("cancel");
        match c.wait_response(id) {
            Err(CallError::Rpc { code: -32800, .. }) => asked += 1,
            Err(CallError::Rpc {
                code: -32006, data, ..
            }) => {
                assert_eq!(data.expect("data")["reason"], "no approver");
                break;
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    assert!(asked > 0);
    // Each request it was sent is some 16 KiB, not the 100 KB command line, cut in the
    // middle: how it ends is still shown.
    let first = next_request(&mut a);
    let description = first["params"]["payload"]["description"]
        .as_str()
        .expect("description");
    assert!(
        description.len() < 17 << 10
            && description.contains("bytes left out")
            && description.starts_with("rm -f /nonexistent/")
            && description.ends_with("xxend"),
        "{} bytes: {}",
        description.len(),
        &description[description.len().saturating_sub(40)..]
    );
    // Reading all it was sent makes it an approver again.
    let mut seen = 1;
    while seen < asked {
        let m = a.read_message(Some(WAIT)).expect("what it was sent");
        if m.get("method").is_some() && m.get("id").is_some() {
            seen += 1;
        }
    }
    wait_until("the approver is asked again", || {
        let id = send(
            &mut c,
            "bash/exec",
            json!({"command": "rm -f /nonexistent"}),
        );
        let cancel =
            json!({"jsonrpc": "2.0", "method": "$/cancel_request", "params": {"requestId": id}});
        c.send_line(cancel.to_string().as_bytes()).expect("cancel");
        matches!(
            c.wait_response(id),
            Err(CallError::Rpc { code: -32800, .. })
        )
    });
}
