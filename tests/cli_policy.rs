//! `execctl policy check` (offline from a file, and from the running daemon) and
//! `execctl approve` (JSON lines for scripts, and interactive through a pseudo-terminal),
//! with an agent's `execctl exec` waiting in another process.

use crate::util::cli::*;
use crate::util::*;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::mpsc;

const POLICY: &str = r#"{
  "default": "allow",
  "unparsed": "ask",
  "rules": [
    {"name": "no-force-push", "pattern": ["git", "push", ["-f", "--force"]], "decision": "deny",
     "justification": "history is shared", "match": ["git push -f origin main"]},
    {"name": "push", "pattern": ["git", "push"], "decision": "ask",
     "justification": "pushes leave this machine"},
    {"name": "read-only-git", "pattern": ["git", ["status", "log"]], "decision": "allow"},
    {"name": "rm", "pattern": ["rm"], "decision": "ask", "uids": [1000]},
    {"name": "ask-echo", "pattern": ["echo"], "decision": "ask",
     "justification": "echo needs a yes"}
  ]
}"#;

/// The policy in a file of `dir`.
fn policy_file(dir: &TempDir) -> PathBuf {
    let f = dir.path().join("policy.json");
    std::fs::write(&f, POLICY).expect("write policy");
    f
}

fn nowhere() -> Option<&'static Path> {
    Some(Path::new("/nonexistent/policy.sock"))
}

// ---- policy check ----------------------------------------------------------------------------

#[test]
fn policy_check_offline_from_a_file_human_and_json() {
    let dir = TempDir::new();
    let file = policy_file(&dir);
    let file = file.to_str().expect("utf-8");
    let check = |args: &[&str]| {
        let mut all = vec!["policy", "check", "--policy", file];
        all.extend_from_slice(args);
        let o = run_cmd(command(nowhere(), &all));
        assert_eq!(o.code, Some(0), "{args:?}: {o:?}");
        o.stdout
    };
    // A direct argv: both git rules match, the strictest decides.
    let human = check(&["--", "git", "push", "-f", "origin", "main"]);
    let lines: Vec<&str> = human.lines().collect();
    assert_eq!(lines[0], "deny (rule no-force-push)", "{human}");
    assert_eq!(lines[1], "  justification: history is shared", "{human}");
    assert_eq!(lines[2], "rules matched:", "{human}");
    assert_eq!(
        lines[3].split_whitespace().collect::<Vec<_>>(),
        [
            "no-force-push",
            "deny",
            "git",
            "push",
            "-f",
            "origin",
            "main"
        ]
    );
    assert_eq!(
        lines[4].split_whitespace().collect::<Vec<_>>(),
        ["push", "ask", "git", "push", "-f", "origin", "main"]
    );
    assert_eq!(lines[5], format!("policy: {file}"));
    let v = parse_json(&check(&[
        "--json", "--", "git", "push", "-f", "origin", "main",
    ]));
    assert_eq!(v["decision"], "deny", "{v}");
    assert_eq!(v["rule"], "no-force-push", "{v}");
    assert_eq!(v["justification"], "history is shared", "{v}");
    assert_eq!(v["unparsed"], false, "{v}");
    assert_eq!(
        v["hits"],
        json!([
            {"rule": "no-force-push", "decision": "deny", "argv": ["git", "push", "-f", "origin", "main"]},
            {"rule": "push", "decision": "ask", "argv": ["git", "push", "-f", "origin", "main"]}
        ])
    );
    // One operand is a shell line, split into its commands; rules can be per uid.
    let v = parse_json(&check(&[
        "--json",
        "--uid",
        "1000",
        "git status && rm -rf /tmp/x",
    ]));
    assert_eq!(
        (v["decision"].as_str(), v["rule"].as_str()),
        (Some("ask"), Some("rm")),
        "{v}"
    );
    assert_eq!(v["hits"].as_array().map(Vec::len), Some(2), "{v}");
    let v = parse_json(&check(&[
        "--json",
        "--uid",
        "0",
        "git status && rm -rf /tmp/x",
    ]));
    assert_eq!(
        (v["decision"].as_str(), v["rule"].as_str()),
        (Some("allow"), Some("read-only-git")),
        "{v}"
    );
    // Nothing matches: the default; a line that is not a plain script: "unparsed".
    assert!(check(&["--", "ls", "-l"])
        .starts_with("allow (no rule matched: the policy's default)\nrules matched: none\n"));
    let v = parse_json(&check(&["--json", "ls $(pwd)"]));
    assert_eq!(
        (
            v["decision"].as_str(),
            v["rule"].as_str(),
            v["unparsed"].as_bool()
        ),
        (Some("ask"), Some("unparsed"), Some(true)),
        "{v}"
    );
    // Options stop at the command.
    let v = parse_json(&check(&["--json", "echo", "--uid", "5"]));
    assert_eq!(v["hits"][0]["argv"], json!(["echo", "--uid", "5"]), "{v}");

    // A file execd would refuse is refused the same way, naming it.
    let bad = dir.path().join("bad.json");
    std::fs::write(
        &bad,
        r#"{"rules": [{"name": "x", "pattern": [], "decision": "deny"}]}"#,
    )
    .expect("write");
    let bad = bad.to_str().expect("utf-8");
    let o = run_cmd(command(
        nowhere(),
        &["policy", "check", "--policy", bad, "--", "ls"],
    ));
    assert_eq!(o.code, Some(125), "{o:?}");
    assert!(o.stderr.contains(bad) && o.stderr.contains("rule"), "{o:?}");
    assert_eq!(o.stderr.lines().count(), 1, "{o:?}");
}

#[test]
fn policy_check_asks_the_running_daemon_without_a_file() {
    let dir = TempDir::new();
    let file = policy_file(&dir);
    let d = Daemon::start(&["--policy", file.to_str().expect("utf-8")]);
    let o = ctl_code(
        &d,
        &["policy", "check", "--", "git", "push", "origin", "main"],
        0,
    );
    assert!(
        o.stdout
            .starts_with("ask (rule push)\n  justification: pushes leave this machine\n"),
        "{o:?}"
    );
    assert!(o.stdout.ends_with("policy: daemon\n"), "{o:?}");
    let v = parse_json(&ctl_code(&d, &["--json", "policy", "check", "git log | rm x"], 0).stdout);
    assert_eq!(v["decision"], "allow", "rm asks only for uid 1000: {v}");
    assert_eq!(v["source"], "daemon", "{v}");
    assert_eq!(v["hits"][0]["rule"], "read-only-git", "{v}");
    // A daemon without a policy allows everything, and says it has none.
    let plain = Daemon::start(&[]);
    let v = parse_json(
        &ctl_code(
            &plain,
            &["--json", "policy", "check", "--", "rm", "-rf", "/"],
            0,
        )
        .stdout,
    );
    assert_eq!(v["decision"], "allow", "{v}");
    assert_eq!(v["source"], "daemon (no policy file)", "{v}");
}

// ---- approve -----------------------------------------------------------------------------

/// A daemon with the policy, and the directory holding its file.
fn gated_daemon() -> (Daemon, TempDir) {
    let dir = TempDir::new();
    let file = policy_file(&dir);
    let d = Daemon::start(&["--policy", file.to_str().expect("utf-8")]);
    (d, dir)
}

/// An agent's `execctl ARGS` running on a thread; its outcome on the channel.
fn agent(d: &Daemon, args: &[&str]) -> mpsc::Receiver<Out> {
    let cmd = command(Some(&d.socket), args);
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(run_cmd(cmd));
    });
    rx
}

#[track_caller]
fn outcome(rx: &mpsc::Receiver<Out>) -> Out {
    rx.recv_timeout(WAIT)
        .unwrap_or_else(|e| panic!("the agent did not finish within {WAIT:?}: {e}"))
}

/// `execctl approve --json`: its stdin to write answers, its stdout as JSON values.
struct JsonApprover {
    ctl: Ctl,
    stdin: std::process::ChildStdin,
    lines: mpsc::Receiver<String>,
}

impl JsonApprover {
    fn start(d: &Daemon) -> JsonApprover {
        let mut cmd = command(Some(&d.socket), &["approve", "--json"]);
        cmd.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null());
        let mut ctl = Ctl {
            child: cmd.spawn().expect("spawn approver"),
        };
        let stdin = ctl.child.stdin.take().expect("stdin");
        let stdout = ctl.child.stdout.take().expect("stdout");
        let lines = lines_of(stdout);
        let mut a = JsonApprover { ctl, stdin, lines };
        assert_eq!(a.next("ready"), json!({"type": "ready"}));
        a
    }

    /// The next line of type `kind`, skipping others.
    #[track_caller]
    fn next(&mut self, kind: &str) -> Value {
        self.next_raw(kind).1
    }

    /// The next line of type `kind` as printed, and its value.
    #[track_caller]
    fn next_raw(&mut self, kind: &str) -> (String, Value) {
        loop {
            let line = next_line(&self.lines);
            let v = parse_json(&line);
            if v["type"] == kind {
                return (line, v);
            }
        }
    }

    fn answer(&mut self, v: Value) {
        writeln!(self.stdin, "{v}").expect("write an answer");
    }
}

#[test]
fn approve_json_answers_requests_for_scripts() {
    let (d, _dir) = gated_daemon();
    let mut a = JsonApprover::start(&d);

    let run = agent(&d, &["exec", "echo approved"]);
    let req = a.next("approval_request");
    let rid = req["request_id"].as_str().expect("request_id").to_string();
    assert!(rid.starts_with("appr_"), "{req}");
    assert_eq!(req["command"], "echo approved", "{req}");
    assert!(
        req["tool_call_id"]
            .as_str()
            .is_some_and(|t| t.starts_with("cmd_")),
        "{req}"
    );
    let brief = req["display"][0].as_str().expect("display");
    assert!(
        brief.starts_with("rule ask-echo: echo needs a yes;"),
        "{brief}"
    );
    assert!(
        brief.contains("cwd ") && brief.contains("session "),
        "{brief}"
    );
    a.answer(json!({"request_id": rid, "response": "approve"}));
    let o = outcome(&run);
    assert_eq!(
        (o.code, o.stdout.as_str()),
        (Some(0), "approved\n"),
        "{o:?}"
    );
    let settled = a.next("approval_resolved");
    assert_eq!(
        settled,
        json!({"type": "approval_resolved", "request_id": rid, "response": "approve"})
    );

    // A rejection with feedback reaches the agent as one sentence.
    let run = agent(&d, &["run", "echo", "rejected"]);
    let req = a.next("approval_request");
    a.answer(json!({"request_id": "appr_999", "response": "approve"}));
    let e = a.next("error");
    assert!(
        e["message"]
            .as_str()
            .is_some_and(|m| m.contains("appr_999")),
        "{e}"
    );
    a.answer(json!({"request_id": req["request_id"], "response": "maybe"}));
    a.next("error");
    a.answer(
        json!({"request_id": req["request_id"], "response": "reject", "feedback": "not today"}),
    );
    let o = outcome(&run);
    assert_eq!(o.code, Some(125), "{o:?}");
    assert_eq!(o.stdout, "");
    let rid = req["request_id"].as_str().expect("id");
    assert_eq!(
        o.stderr,
        format!(
            "execctl: waiting for approval {rid} (rule ask-echo) ...\n\
             execctl: not approved (policy rule ask-echo): not today\n"
        )
    );

    // stdin's end ends the approver.
    drop(a.stdin);
    assert_eq!(a.ctl.wait().code(), Some(0));
}

/// A command held for approval says so on stderr at once, naming the approval and its
/// rule, before anyone answers (`run` through a pipe here, `exec` on a terminal below);
/// once the requester gives up (SIGINT), the approvers see the request withdrawn.
#[test]
fn a_command_waiting_for_approval_says_so_at_once_and_a_withdrawn_one_shows_withdrawn() {
    let (d, _dir) = gated_daemon();
    let mut a = JsonApprover::start(&d);
    let t = TtyApprover::start(&d);
    let mut cmd = command(Some(&d.socket), &["run", "echo", "piped"]);
    cmd.stdout(Stdio::null()).stderr(Stdio::piped());
    let mut ctl = Ctl {
        child: cmd.spawn().expect("spawn execctl run"),
    };
    let errs = lines_of(ctl.child.stderr.take().expect("stderr"));
    let req = a.next("approval_request");
    let rid = req["request_id"].as_str().expect("id").to_string();
    let said = next_line(&errs);
    assert_eq!(
        said,
        format!("execctl: waiting for approval {rid} (rule ask-echo) ...")
    );
    t.screen.wait_for("[y]es / [n]o / [s]ession", 1);
    // Ctrl-C withdraws it: the JSON approver and the one on the terminal say so.
    unsafe_kill(ctl.pid(), libc::SIGINT);
    assert_eq!(ctl.wait().code(), Some(130));
    assert_eq!(
        a.next("approval_resolved"),
        json!({"type": "approval_resolved", "request_id": rid, "response": "reject",
               "reason": "withdrawn"})
    );
    let screen = t
        .screen
        .wait_for(&format!("{rid} was withdrawn by its requester"), 1);
    assert!(!screen.contains("answered elsewhere"), "{screen}");

    // On a terminal, exec says the same, and goes on once approved.
    let (master, slave) = open_pty();
    let screen = Screen::watch(master);
    let mut cmd = command(Some(&d.socket), &["exec", "echo on-a-tty"]);
    cmd.stdin(Stdio::null())
        .stdout(Stdio::from(slave.try_clone().expect("clone slave")))
        .stderr(Stdio::from(slave));
    let mut ctl = Ctl {
        child: cmd.spawn().expect("spawn execctl exec"),
    };
    let req = a.next("approval_request");
    let rid = req["request_id"].as_str().expect("id").to_string();
    screen.wait_for(
        &format!("waiting for approval {rid} (rule ask-echo) ..."),
        1,
    );
    a.answer(json!({"request_id": rid, "response": "approve"}));
    assert_eq!(ctl.wait().code(), Some(0));
    screen.wait_for("on-a-tty", 1);
}

/// An interactive approver on a pseudo-terminal: stdin, stdout and stderr on its slave.
struct TtyApprover {
    _ctl: Ctl,
    keys: std::fs::File,
    screen: Screen,
}

impl TtyApprover {
    fn start(d: &Daemon) -> TtyApprover {
        let (master, slave) = open_pty();
        let keys = master.try_clone().expect("clone master");
        let screen = Screen::watch(master);
        let mut cmd = command(Some(&d.socket), &["approve"]);
        cmd.stdin(Stdio::from(slave.try_clone().expect("clone slave")))
            .stdout(Stdio::from(slave.try_clone().expect("clone slave")))
            .stderr(Stdio::from(slave));
        let ctl = Ctl {
            child: cmd.spawn().expect("spawn approver"),
        };
        drop(cmd);
        let a = TtyApprover {
            _ctl: ctl,
            keys,
            screen,
        };
        a.screen.wait_for("approving requests", 1);
        a
    }

    fn type_line(&mut self, text: &str) {
        self.keys
            .write_all(format!("{text}\n").as_bytes())
            .expect("type on the terminal");
    }
}

#[test]
fn approve_asks_on_the_terminal() {
    let (d, _dir) = gated_daemon();
    let mut a = TtyApprover::start(&d);

    // y: approved.
    let run = agent(&d, &["exec", "echo via-tty"]);
    let screen = a.screen.wait_for("[y]es / [n]o / [s]ession", 1);
    for field in [
        "approval request appr_",
        "  command  echo via-tty",
        "  rule     ask-echo: echo needs a yes",
        "  uid      ",
        "  cwd      ",
        "  session  ",
    ] {
        assert!(screen.contains(field), "{field:?} missing from {screen}");
    }
    a.type_line("y");
    let o = outcome(&run);
    assert_eq!((o.code, o.stdout.as_str()), (Some(0), "via-tty\n"), "{o:?}");

    // n, with feedback.
    let run = agent(&d, &["exec", "echo refused"]);
    a.screen.wait_for("[y]es / [n]o / [s]ession", 2);
    a.type_line("n");
    a.screen.wait_for("feedback for the requester", 1);
    a.type_line("too risky");
    let o = outcome(&run);
    assert_eq!(o.code, Some(125), "{o:?}");
    assert!(o.stderr.contains("too risky"), "{o:?}");

    // s: this rule is approved for the rest of the session; the next one is not asked.
    let run = agent(&d, &["exec", "--session", "work", "echo one"]);
    a.screen.wait_for("[y]es / [n]o / [s]ession", 3);
    a.type_line("s");
    assert_eq!(outcome(&run).stdout, "one\n");
    let o = outcome(&agent(&d, &["exec", "--session", "work", "echo two"]));
    assert_eq!((o.code, o.stdout.as_str()), (Some(0), "two\n"), "{o:?}");
    assert_eq!(a.screen.text().matches("approval request appr_").count(), 3);
}

#[test]
fn a_request_answered_by_another_approver_leaves_the_prompt() {
    let (d, _dir) = gated_daemon();
    let a = TtyApprover::start(&d);
    let mut j = JsonApprover::start(&d);
    let run = agent(&d, &["exec", "echo elsewhere"]);
    let req = j.next("approval_request");
    let rid = req["request_id"].as_str().expect("id").to_string();
    a.screen.wait_for("[y]es / [n]o / [s]ession", 1);
    j.answer(json!({"request_id": rid, "response": "approve"}));
    assert_eq!(outcome(&run).stdout, "elsewhere\n");
    a.screen
        .wait_for(&format!("{rid} was answered elsewhere: approve"), 1);
}

/// What the requester wrote reaches the approver's screen escaped: in the command, the cwd
/// and the session id, a carriage return and an escape sequence cannot redraw the request
/// being decided on, nor a newline add a line of its own. `--json` carries the same text
/// as JSON escapes, nothing raw.
#[test]
fn approve_shows_the_requesters_control_characters_escaped() {
    let (d, dir) = gated_daemon();
    let mut a = TtyApprover::start(&d);
    let mut j = JsonApprover::start(&d);
    let cwd = dir.path().join("x\u{1b}[8m\ny");
    std::fs::create_dir(&cwd).expect("mkdir a directory with controls in its name");
    // Shown raw, the carriage return and "erase line" would leave `  command  ls`.
    let line = "echo safe #\r\u{1b}[2K  command  ls\nsecond";
    let run = agent(
        &d,
        &[
            "exec",
            "--session",
            "s\u{202e}1\r",
            "--cwd",
            cwd.to_str().expect("utf-8"),
            line,
        ],
    );

    let (raw, req) = j.next_raw("approval_request");
    assert_eq!(req["command"], line, "{req}");
    assert!(
        !raw.contains(['\r', '\u{1b}', '\u{202e}']),
        "raw controls in the JSON line: {raw:?}"
    );
    assert!(
        raw.contains(r"\r\u001b[2K") && raw.contains(r"\u202e"),
        "{raw}"
    );

    let screen = a.screen.wait_for("[y]es / [n]o / [s]ession", 1);
    // The terminal turns each "\n" execctl writes into "\r\n".
    for field in [
        r"  command  echo safe #\r\x1b[2K  command  ls\nsecond",
        r"/x\x1b[8m\ny",
        r"  session  s\u{202e}1\r",
    ] {
        assert!(
            screen.contains(&format!("{field}\r\n")),
            "{field:?} missing from {screen:?}"
        );
    }
    assert!(
        screen.lines().any(|l| l.starts_with("  cwd      /")),
        "{screen:?}"
    );
    assert!(
        !screen.contains('\u{1b}'),
        "raw ESC on the screen: {screen:?}"
    );
    assert!(!screen.contains('\u{202e}'), "raw bidi control: {screen:?}");
    assert!(
        !screen.replace("\r\n", "\n").contains('\r'),
        "raw carriage return on the screen: {screen:?}"
    );

    a.type_line("n");
    a.screen.wait_for("feedback for the requester", 1);
    a.type_line("");
    let o = outcome(&run);
    assert_eq!(o.code, Some(125), "{o:?}");
}

/// `execctl approve` against a daemon without a policy says there is nothing to approve
/// instead of waiting for requests that never come.
#[test]
fn approve_without_a_policy_says_so() {
    let d = Daemon::start(&[]);
    let mut cmd = command(Some(&d.socket), &["approve"]);
    cmd.stdin(Stdio::piped());
    let o = run_cmd(cmd);
    assert_eq!(o.code, Some(125), "{o:?}");
    assert!(
        o.stderr
            .contains("execd runs without a policy (--policy FILE)"),
        "{o:?}"
    );
}
