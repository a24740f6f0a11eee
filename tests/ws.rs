//! A person takes over (PROTOCOL.md 12.5 and the browser rule of 11): `/v1/shell/ws` driven by
//! a real WebSocket client (the pinned Python `websockets`, through `tests/sdk/ws_relay.py`)
//! over the socket and over TCP; server-sent events of `/v1/shell/exec` and `/view`; the
//! browser rule on every route. The page itself in a real browser is `tests/browser.rs`.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{ChildStdin, Command, Stdio};
use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant};

use crate::util::*;

/// A `ws_relay.py` process: one WebSocket, driven by JSON lines.
pub(crate) struct Relay {
    _child: Reap,
    stdin: ChildStdin,
    lines: Receiver<String>,
    /// Every output text seen so far, concatenated.
    pub text: String,
}

impl Relay {
    /// Connects with `args` (see ws_relay.py); the first event (`open` or `refused`).
    pub(crate) fn start(python: &Path, args: &[String]) -> (Relay, Value) {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/sdk/ws_relay.py");
        let mut child = Command::new(python)
            .arg("-B")
            .arg(script)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn ws_relay.py");
        let stdin = child.stdin.take().expect("stdin");
        let lines = lines_of(child.stdout.take().expect("stdout"));
        let mut r = Relay {
            _child: Reap(child),
            stdin,
            lines,
            text: String::new(),
        };
        let first = r.next();
        (r, first)
    }

    /// Over the daemon's socket, to `path`.
    pub(crate) fn unix(python: &Path, socket: &Path, path: &str) -> (Relay, Value) {
        Relay::start(
            python,
            &[
                "--uds".into(),
                socket.display().to_string(),
                "--path".into(),
                path.into(),
            ],
        )
    }

    /// The next event, at most `WAIT` away.
    #[track_caller]
    pub(crate) fn next(&mut self) -> Value {
        let line = self
            .lines
            .recv_timeout(WAIT)
            .unwrap_or_else(|_| panic!("no event within {WAIT:?}; output so far: {:?}", self.text));
        let v: Value = serde_json::from_str(&line).expect("a JSON event");
        if v["event"] == "message" && v["data"]["type"] == "output" {
            self.text
                .push_str(v["data"]["data"].as_str().unwrap_or_default());
        }
        v
    }

    /// Events until one satisfies `want` (which it returns), the others skipped.
    #[track_caller]
    pub(crate) fn until(&mut self, what: &str, want: impl Fn(&Value) -> bool) -> Value {
        let deadline = Instant::now() + WAIT;
        loop {
            assert!(
                Instant::now() < deadline,
                "no {what} within {WAIT:?}: {:?}",
                self.text
            );
            let v = self.next();
            if want(&v) {
                return v;
            }
            assert!(
                v["event"] != "closed" || what.contains("close"),
                "closed before {what}: {v}"
            );
        }
    }

    /// Reads until the output seen so far ends with a prompt (`$ `, or `# ` for root).
    #[track_caller]
    pub(crate) fn prompt(&mut self) {
        while !(self.text.ends_with("$ ") || self.text.ends_with("# ")) {
            let v = self.next();
            assert!(
                v["event"] != "closed",
                "closed before a prompt: {v}; {:?}",
                self.text
            );
        }
    }

    /// Reads until the output seen so far contains `needle`.
    #[track_caller]
    pub(crate) fn output_until(&mut self, needle: &str) {
        while !self.text.contains(needle) {
            let v = self.next();
            assert!(
                v["event"] != "closed",
                "closed before {needle:?}: {v}; {:?}",
                self.text
            );
        }
    }

    pub(crate) fn op(&mut self, op: Value) {
        writeln!(self.stdin, "{op}").expect("to the relay");
    }

    pub(crate) fn send(&mut self, msg: Value) {
        self.op(json!({"op": "send", "msg": msg}));
    }

    pub(crate) fn keys(&mut self, keys: &str) {
        self.send(json!({"type": "input", "data": keys}));
    }

    /// The `session_id` and `ready` messages every WebSocket starts with: the id.
    #[track_caller]
    pub(crate) fn greeting(&mut self) -> String {
        let first = self.next();
        assert_eq!(first["data"]["type"], "session_id", "{first}");
        let second = self.next();
        assert_eq!(
            second["data"],
            json!({"type": "ready", "data": "Terminal ready"})
        );
        first["data"]["data"].as_str().expect("an id").to_string()
    }
}

/// Prints the daemon's log when the test fails, for what the assertion cannot say.
struct LogOnFailure<'a>(&'a Daemon);

impl Drop for LogOnFailure<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("daemon log:\n{}", self.0.log());
        }
    }
}

/// The relay's python, or `None` after `skip`ping.
fn python() -> Option<PathBuf> {
    crate::util::venv::sdk_python()
}

/// Every line of an audit file, parsed.
fn audit_lines(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect()
}

/// One raw HTTP exchange on `s` (`Connection: close`): status, head and body.
fn raw_http(mut s: impl Read + Write, request: &str) -> (u16, String, String) {
    s.write_all(request.as_bytes()).expect("send");
    let mut out = Vec::new();
    let mut buf = [0u8; 65536];
    loop {
        match read_some(&mut s, &mut buf) {
            Ok(0) => break,
            Ok(n) => out.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => break,
            Err(e) => panic!("read: {e}"),
        }
    }
    let text = String::from_utf8_lossy(&out).to_string();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status: {text:?}"));
    (status, head.to_string(), body.to_string())
}

fn unix(socket: &Path) -> UnixStream {
    let s = UnixStream::connect(socket).expect("connect");
    s.set_read_timeout(Some(WAIT)).expect("timeout");
    s
}

fn tcp(port: u16) -> TcpStream {
    let s = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    s.set_read_timeout(Some(WAIT)).expect("timeout");
    s
}

// ---- the WebSocket --------------------------------------------------------------------------

#[test]
fn a_websocket_makes_a_session_runs_typed_lines_and_follows_the_window_size() {
    let Some(py) = python() else { return };
    let d = Daemon::start(&[]);
    let _log = LogOnFailure(&d);
    let (mut w, open) = Relay::unix(&py, &d.socket, "/v1/shell/ws");
    assert_eq!(open["event"], "open", "{open}");
    let sid = w.greeting();
    assert!(sid.starts_with("shell_"), "{sid}");
    // The prompt, then what is typed: echoed by the daemon's editor, run, its output. (A
    // person types the next line at the next prompt: keys that come while a command still
    // runs are its input, and what it does not read is dropped at its end.)
    w.prompt();
    w.keys("echo $((6*7))\r");
    w.output_until("42\r\n");
    assert!(w.text.contains("echo $((6*7))\r\n42\r\n"), "{:?}", w.text);
    assert!(!w.text.contains("6973"), "never a marker: {:?}", w.text);
    w.prompt();
    // Resize reaches the session's terminal.
    w.send(json!({"type": "resize", "data": {"cols": 111, "rows": 33}}));
    w.keys("stty size\r");
    w.output_until("33 111\r\n");
    w.prompt();
    // Keys while a command runs are its input (the terminal echoes them).
    w.keys("read -r x; echo got:$x\r");
    w.output_until("read -r x; echo got:$x\r\n");
    w.keys("hello\r");
    w.output_until("got:hello\r\n");
    w.prompt();
    // Client pings are answered; a message of an unknown type is ignored.
    w.op(json!({"op": "ping", "data": "p1"}));
    w.until("pong", |v| v["event"] == "pong");
    w.op(json!({"op": "send_text", "text": "not json"}));
    w.send(json!({"type": "nonsense"}));
    w.send(json!({"type": "pong", "data": {"timestamp": 1}}));
    w.keys("echo still\r");
    w.output_until("still\r\n");
    // The session was made by the WebSocket and outlives it.
    w.op(json!({"op": "close"}));
    w.until("close", |v| v["event"] == "closed");
    let mut c = d.client();
    let sessions = ok(&mut c, "shell/sessions", json!({}));
    assert!(sessions["sessions"][&sid].is_object(), "{sessions}");
    let v = ok(&mut c, "shell/view", json!({"id": sid}));
    let commands: Vec<&Value> = v["console"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| &r["command"])
        .collect();
    assert!(commands.contains(&&json!("echo $((6*7))")), "{v}");
    assert!(
        d.log().contains("ignored a message that is not JSON"),
        "{}",
        d.log()
    );
    assert_no_panic(&d);
}

#[test]
fn an_attached_watcher_gets_the_screen_first_and_two_watchers_share_the_prompt() {
    let Some(py) = python() else { return };
    let d = Daemon::start(&[]);
    let mut c = d.client();
    let r = ok(
        &mut c,
        "shell/exec",
        json!({"command": "echo before-attach"}),
    );
    let sid = r["session_id"].as_str().unwrap().to_string();
    let path = format!("/v1/shell/ws?session_id={sid}");
    let (mut a, _) = Relay::unix(&py, &d.socket, &path);
    assert_eq!(a.greeting(), sid);
    // The screen, painted in one output message, before anything else.
    let paint = a.next();
    assert_eq!(paint["data"]["type"], "output", "{paint}");
    let painted = paint["data"]["data"].as_str().unwrap();
    assert!(painted.contains("before-attach"), "{painted:?}");
    // A second watcher; what one types both see, and the other finishes the line.
    let (mut b, _) = Relay::unix(&py, &d.socket, &path);
    b.greeting();
    b.next();
    a.keys("echo tw");
    b.output_until("echo tw");
    b.keys("o\r");
    a.output_until("two\r\n");
    b.output_until("two\r\n");
    a.prompt();
    // An agent's exec is shown to them after the prompt, as typed.
    ok(
        &mut c,
        "shell/exec",
        json!({"id": sid, "command": "echo from-agent"}),
    );
    a.output_until("echo from-agent\r\nfrom-agent\r\n");
    // In screen mode the first frame has every row.
    let (mut s, _) = Relay::unix(&py, &d.socket, &format!("{path}&render=screen"));
    s.greeting();
    let f = s.next();
    assert_eq!(f["data"]["type"], "screen", "{f}");
    let frame = &f["data"]["data"];
    let rows = frame["rows"].as_u64().unwrap();
    assert_eq!(frame["lines"].as_array().unwrap().len() as u64, rows);
    let text: String = frame["lines"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| format!("{}\n", l["text"].as_str().unwrap()))
        .collect();
    assert!(text.contains("from-agent"), "{text}");
    // Unknown sessions are 404 before the upgrade.
    let (_, refused) = Relay::unix(&py, &d.socket, "/v1/shell/ws?session_id=nope");
    assert_eq!(refused, json!({"event": "refused", "status": 404}));
    assert_no_panic(&d);
}

#[test]
fn over_tcp_the_token_is_the_subprotocol_or_the_query_and_another_uids_session_is_404() {
    let Some(py) = python() else { return };
    let front = crate::http::start_front(&[]);
    let url = |q: &str| format!("ws://127.0.0.1:{}/v1/shell/ws{q}", front.port);
    let tok = format!("execd.token.{}", crate::http::TOKEN);
    // Without the token: 401.
    let (_, r) = Relay::start(&py, &["--url".into(), url("")]);
    assert_eq!(r, json!({"event": "refused", "status": 401}));
    let (_, r) = Relay::start(&py, &["--url".into(), url("?token=nope")]);
    assert_eq!(r["status"], 401);
    // With it, as the subprotocol: `execd` is chosen when offered, so the token is never
    // sent back.
    let args = |q: &str, protos: &[&str]| {
        let mut v = vec!["--url".to_string(), url(q)];
        for p in protos {
            v.push("--protocol".into());
            v.push(p.to_string());
        }
        v
    };
    let (mut w, open) = Relay::start(&py, &args("", &["execd", &tok]));
    assert_eq!(open, json!({"event": "open", "subprotocol": "execd"}));
    let sid = w.greeting();
    w.prompt();
    w.keys("id -u\r");
    w.output_until("65534\r\n");
    let (mut q, open) = Relay::start(
        &py,
        &args(
            &format!("?session_id={sid}&token={}", crate::http::TOKEN),
            &[],
        ),
    );
    assert_eq!(open["event"], "open");
    q.greeting();
    // A session of the socket's peer (root) is not nobody's: 404, like every route.
    let mut c = front.daemon.client();
    ok(&mut c, "shell/sessions/create", json!({"id": "roots"}));
    let (_, r) = Relay::start(&py, &args("?session_id=roots", &[&tok]));
    assert_eq!(r, json!({"event": "refused", "status": 404}));
    // `?token=` counts on /v1/shell/ws and /terminal only.
    let get = |target: &str| {
        raw_http(
            tcp(front.port),
            &format!("GET {target} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"),
        )
        .0
    };
    let t = crate::http::TOKEN;
    assert_eq!(get(&format!("/v1/shell/sessions?token={t}")), 401);
    assert_eq!(get(&format!("/v1/health?token={t}")), 401);
    assert_eq!(get(&format!("/terminal?token={t}")), 200);
    assert_eq!(get("/terminal?token=nope"), 401);
    // The query string is never logged.
    assert!(!front.daemon.log().contains(t), "{}", front.daemon.log());
    assert_no_panic(&front.daemon);
}

#[test]
fn a_watcher_that_stops_reading_is_closed_and_the_others_go_on() {
    let Some(py) = python() else { return };
    let d = Daemon::start(&["--client-buffer", "64K"]);
    let mut c = d.client();
    let r = ok(&mut c, "shell/exec", json!({"command": "true"}));
    let sid = r["session_id"].as_str().unwrap().to_string();
    let path = format!("/v1/shell/ws?session_id={sid}");
    let (mut slow, _) = Relay::unix(&py, &d.socket, &path);
    slow.greeting();
    slow.next();
    // The one that goes on takes frames, which come at their own pace.
    let (mut fine, _) = Relay::unix(&py, &d.socket, &format!("{path}&render=screen"));
    fine.greeting();
    fine.next();
    slow.op(json!({"op": "stop_reading"}));
    ok(
        &mut c,
        "shell/exec",
        json!({"id": sid, "command": "yes | head -c 2000000; echo flood-done"}),
    );
    wait_until("the slow watcher is let go", || {
        d.log().contains("it holds --client-buffer unread")
    });
    // The other is still served: it types and sees the answer.
    fine.send(json!({"type": "input", "data": "echo after-$((1+1))\r"}));
    fine.until("the line's answer on the screen", |v| {
        v["data"]["type"] == "screen"
            && v["data"]["data"]["lines"]
                .as_array()
                .is_some_and(|ls| ls.iter().any(|l| l["text"] == "after-2"))
    });
    // The slow one, reading again, finds itself closed with 1008.
    slow.op(json!({"op": "resume_reading"}));
    let closed = slow.until("its close", |v| v["event"] == "closed");
    assert_eq!(closed["code"], 1008, "{closed}");
    assert_no_panic(&d);
}

#[test]
fn a_denied_line_typed_at_the_prompt_is_refused_and_audited_with_the_peer() {
    let Some(py) = python() else { return };
    let dir = TempDir::new();
    let marker = dir.path().join("touched");
    let (d, audit) = with_policy(
        r#"{"rules": [{"name": "no-touch", "pattern": ["touch"], "decision": "deny",
            "justification": "no new files"}]}"#,
        &[],
    );
    let (mut w, _) = Relay::unix(&py, &d.socket, "/v1/shell/ws");
    w.greeting();
    w.prompt();
    w.keys(&format!("touch {}\r", marker.display()));
    w.output_until("denied by rule no-touch: no new files\r\n");
    w.prompt();
    // A new prompt follows, and the session goes on.
    w.keys("echo fine\r");
    w.output_until("fine\r\n");
    assert!(!marker.exists());
    wait_until("the audit", || {
        audit_lines(&audit)
            .iter()
            .any(|r| r["event"] == "start" && r["line"] == "echo fine")
    });
    let records = audit_lines(&audit);
    let deny = records.iter().find(|r| r["event"] == "deny").unwrap();
    assert_eq!(deny["rule"], "no-touch");
    assert_eq!(deny["via"], "ws", "{deny}");
    assert!(
        deny["peer"]["pid"].as_i64().is_some_and(|p| p > 0),
        "{deny}"
    );
    let start = records
        .iter()
        .find(|r| r["event"] == "start" && r["line"] == "echo fine")
        .unwrap_or_else(|| panic!("{records:?}"));
    assert_eq!(start["via"], "ws");
    assert_eq!(start["peer"], deny["peer"]);
    assert_no_panic(&d);
}

#[test]
fn a_line_that_needs_approval_says_it_waits_and_runs_once_approved() {
    let Some(py) = python() else { return };
    let (d, audit) = with_policy(
        r#"{"rules": [{"name": "greet", "pattern": ["echo", "hello"], "decision": "ask"}]}"#,
        &[],
    );
    let mut a = d.client();
    ok(&mut a, "approvals/subscribe", json!({}));
    let (mut w, _) = Relay::unix(&py, &d.socket, "/v1/shell/ws");
    w.greeting();
    w.prompt();
    w.keys("echo hello world\r");
    w.output_until("waiting for approval appr_1 (rule greet)\r\n");
    let ask = next_request(&mut a);
    let id = ask["id"].clone();
    let answer = json!({"jsonrpc": "2.0", "id": id,
        "result": {"request_id": id, "response": "approve"}});
    a.send_line(answer.to_string().as_bytes()).expect("answer");
    w.output_until("hello world\r\n");
    w.prompt();
    // Rejected: said, and a new prompt.
    w.keys("echo hello again\r");
    w.output_until("waiting for approval appr_2 (rule greet)\r\n");
    let ask = next_request(&mut a);
    let id = ask["id"].clone();
    let answer = json!({"jsonrpc": "2.0", "id": id,
        "result": {"request_id": id, "response": "reject", "feedback": "not now"}});
    a.send_line(answer.to_string().as_bytes()).expect("answer");
    w.output_until("not approved (rule greet): rejected: not now\r\n");
    wait_until("the audit", || {
        audit_lines(&audit).iter().any(|r| r["event"] == "reject")
    });
    let asks: Vec<Value> = audit_lines(&audit)
        .into_iter()
        .filter(|r| r["event"] == "ask")
        .collect();
    assert_eq!(asks.len(), 2);
    assert!(asks.iter().all(|r| r["via"] == "ws"), "{asks:?}");
    assert_no_panic(&d);
}

#[test]
fn a_pasted_script_runs_line_by_line_each_line_gated() {
    let Some(py) = python() else { return };
    let (d, audit) = with_policy(
        r#"{"rules": [{"name": "no-touch", "pattern": ["touch"], "decision": "deny"}]}"#,
        &[],
    );
    let (mut w, _) = Relay::unix(&py, &d.socket, "/v1/shell/ws");
    w.greeting();
    w.prompt();
    // One message, four lines: the third is refused, the others run in order, each at the
    // prompt after the one before.
    w.keys("echo one; sleep 0.2\r\necho two\ntouch /nonexistent/x\necho four\n");
    w.output_until("four\r\n");
    let text = w.text.clone();
    let at = |s: &str| {
        text.find(s)
            .unwrap_or_else(|| panic!("{s:?} not in {text:?}"))
    };
    assert!(at("one\r\n") < at("echo two\r\n"), "{text:?}");
    assert!(at("two\r\n") < at("denied by rule no-touch"), "{text:?}");
    assert!(
        at("denied by rule no-touch") < at("echo four\r\n"),
        "{text:?}"
    );
    wait_until("the audit", || {
        audit_lines(&audit)
            .iter()
            .any(|r| r["event"] == "start" && r["line"] == "echo four")
    });
    let lines: Vec<String> = audit_lines(&audit)
        .iter()
        .filter(|r| r["event"] == "start" && r["via"] == "ws" && r["shell"] == true)
        .map(|r| r["line"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(lines, ["echo one; sleep 0.2", "echo two", "echo four"]);
    assert_no_panic(&d);
}

#[test]
fn frames_a_peer_may_not_send_close_the_websocket_with_their_codes() {
    let Some(py) = python() else { return };
    let d = Daemon::start(&["--max-message", "4K"]);
    let (mut w, _) = Relay::unix(&py, &d.socket, "/v1/shell/ws");
    w.greeting();
    w.op(json!({"op": "send_binary", "data": "x"}));
    let closed = w.until("the close", |v| v["event"] == "closed");
    assert_eq!(closed["code"], 1003, "{closed}");
    let (mut w, _) = Relay::unix(&py, &d.socket, "/v1/shell/ws");
    w.greeting();
    w.keys(&"x".repeat(8000));
    let closed = w.until("the close", |v| v["event"] == "closed");
    assert_eq!(closed["code"], 1009, "{closed}");
    // A close is answered with its code.
    let (mut w, _) = Relay::unix(&py, &d.socket, "/v1/shell/ws");
    w.greeting();
    w.op(json!({"op": "close", "code": 4001}));
    let closed = w.until("the close", |v| v["event"] == "closed");
    assert_eq!(closed["code"], 4001, "{closed}");
    assert_no_panic(&d);
}

#[test]
fn the_daemon_pings_every_websocket_every_30_seconds() {
    let Some(py) = python() else { return };
    let d = Daemon::start(&[]);
    let (mut w, _) = Relay::unix(&py, &d.socket, "/v1/shell/ws");
    w.greeting();
    let started = Instant::now();
    let deadline = started + Duration::from_secs(40);
    let ping = loop {
        assert!(Instant::now() < deadline, "no ping in 40 s");
        let v = w.next_within(Duration::from_secs(40));
        if v["data"]["type"] == "ping" {
            break v;
        }
    };
    let ms = ping["data"]["timestamp"].as_u64().expect("a timestamp");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    assert!(
        ms <= now && now - ms < 60_000,
        "milliseconds since the epoch: {ms}"
    );
    w.send(json!({"type": "pong", "data": {"timestamp": ms}}));
    w.keys("echo alive\r");
    w.output_until("alive\r\n");
}

impl Relay {
    /// `next`, waiting up to `bound` rather than `WAIT`.
    #[track_caller]
    fn next_within(&mut self, bound: Duration) -> Value {
        let line = self.lines.recv_timeout(bound).expect("an event");
        serde_json::from_str(&line).expect("JSON")
    }
}

// ---- server-sent events -----------------------------------------------------------------------

/// Reads a chunked event stream from `s` until `upto` is in what was read; all of it.
#[track_caller]
fn read_until(s: &mut impl Read, got: &mut Vec<u8>, upto: &str) {
    let mut buf = [0u8; 4096];
    let deadline = Instant::now() + WAIT;
    while !String::from_utf8_lossy(got).contains(upto) {
        assert!(
            Instant::now() < deadline,
            "no {upto:?} in {:?}",
            String::from_utf8_lossy(got)
        );
        match read_some(s, &mut buf) {
            Ok(0) => panic!("closed before {upto:?}: {:?}", String::from_utf8_lossy(got)),
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) => panic!("read: {e}: {:?}", String::from_utf8_lossy(got)),
        }
    }
}

/// The events of a stream's text: (name, data).
fn events(text: &str) -> Vec<(String, Value)> {
    text.split("event: ")
        .skip(1)
        .map(|e| {
            let (name, rest) = e.split_once("\ndata: ").expect("data");
            let data = rest.split("\n\n").next().unwrap();
            (
                name.to_string(),
                serde_json::from_str(data).expect("JSON data"),
            )
        })
        .collect()
}

#[test]
fn exec_and_view_stream_lines_as_they_come_then_one_result() {
    let d = Daemon::start(&[]);
    let _log = LogOnFailure(&d);
    let dir = TempDir::new();
    let go = dir.path().join("go");
    let command = format!(
        "echo first; printf 'bar 1\\rbar 2\\n'; while [ ! -e {} ]; do sleep 0.02; done; echo second; printf unfinished",
        go.display()
    );
    let body = json!({"command": command}).to_string();
    let mut s = unix(&d.socket);
    write!(
        s,
        "POST /v1/shell/exec HTTP/1.1\r\nHost: x\r\nAccept: text/event-stream\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut got = Vec::new();
    // The first lines come while the command still runs: it waits for a file the test
    // makes only once it has them.
    read_until(&mut s, &mut got, "bar 2\\n");
    let text = String::from_utf8_lossy(&got).to_string();
    assert!(
        text.starts_with("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream"),
        "{text}"
    );
    assert!(!text.contains("event: result"));
    std::fs::write(&go, "").unwrap();
    read_until(&mut s, &mut got, "\r\n0\r\n\r\n");
    let text = String::from_utf8_lossy(&got).to_string();
    let evs = events(&text);
    let outputs: String = evs
        .iter()
        .filter(|(n, _)| n == "output")
        .map(|(_, d)| d.as_str().unwrap())
        .collect();
    assert_eq!(
        outputs, "first\nbar 2\nsecond\n",
        "redrawn in place, final state: {text}"
    );
    let (name, result) = evs.last().unwrap();
    assert_eq!(name, "result");
    assert_eq!(evs.iter().filter(|(n, _)| n == "result").count(), 1);
    assert_eq!(result["success"], true);
    assert_eq!(result["data"]["status"], "completed");
    assert!(
        result["data"]["output"]
            .as_str()
            .unwrap()
            .ends_with("unfinished"),
        "{result}"
    );
    let sid = result["data"]["session_id"].as_str().unwrap().to_string();
    // The connection is kept alive: a view with nothing running is the current output,
    // then the result.
    let body = json!({"id": sid}).to_string();
    write!(
        s,
        "POST /v1/shell/view HTTP/1.1\r\nHost: x\r\nAccept: text/event-stream\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut got = Vec::new();
    read_until(&mut s, &mut got, "\r\n0\r\n\r\n");
    let evs = events(&String::from_utf8_lossy(&got));
    assert_eq!(
        evs[0],
        ("output".to_string(), json!("first\nbar 2\nsecond\n"))
    );
    assert_eq!(evs[1].0, "result");
    assert_eq!(evs[1].1["data"]["status"], "completed");
    // A view follows a running command to its end.
    let go2 = dir.path().join("go2");
    let mut c = d.client();
    ok(
        &mut c,
        "shell/exec",
        json!({"id": sid, "async_mode": true, "command": format!(
            "echo third; while [ ! -e {} ]; do sleep 0.02; done; echo fourth", go2.display())}),
    );
    let mut v = unix(&d.socket);
    write!(
        v,
        "POST /v1/shell/view HTTP/1.1\r\nHost: x\r\nAccept: text/event-stream\r\n\
         Connection: close\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut got = Vec::new();
    read_until(&mut v, &mut got, "third");
    assert!(!String::from_utf8_lossy(&got).contains("event: result"));
    std::fs::write(&go2, "").unwrap();
    read_until(&mut v, &mut got, "\r\n0\r\n\r\n");
    let evs = events(&String::from_utf8_lossy(&got));
    let (name, result) = evs.last().unwrap();
    assert_eq!(name, "result");
    assert!(result["data"]["command"]
        .as_str()
        .unwrap()
        .contains("fourth"));
    assert!(
        result["data"]["output"]
            .as_str()
            .unwrap()
            .contains("fourth"),
        "{result}"
    );
    assert_no_panic(&d);
}

// ---- the browser rule --------------------------------------------------------------------------

#[test]
fn a_request_from_another_site_is_refused_before_anything_runs() {
    let Some(py) = python() else { return };
    let front = crate::http::start_front(&[]);
    let dir = TempDir::new();
    let marker = dir.path().join("ran");
    std::fs::set_permissions(
        dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o777),
    )
    .unwrap();
    let body = json!({"command": format!("touch {}", marker.display())}).to_string();
    let port = front.port;
    let auth = format!("Authorization: Bearer {}\r\n", crate::http::TOKEN);
    let post = |host: &str, extra: &str| {
        format!(
            "POST /v1/bash/exec HTTP/1.1\r\nHost: {host}\r\n{extra}Content-Type: text/plain\r\n\
             Connection: close\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
    };
    let here = format!("127.0.0.1:{port}");
    let cases = [
        // A page on another site posting cross-site (no preflight for text/plain).
        (here.clone(), "Origin: http://evil.example\r\n".to_string()),
        // DNS rebinding: the page's own origin, its name now 127.0.0.1.
        (
            format!("evil.example:{port}"),
            format!("Origin: http://evil.example:{port}\r\n"),
        ),
        // A browser that sends no Origin still says where it comes from.
        (here.clone(), "Sec-Fetch-Site: cross-site\r\n".to_string()),
    ];
    for (host, extra) in &cases {
        let (status, _, b) = raw_http(unix(&front.daemon.socket), &post(host, extra));
        assert_eq!(status, 403, "socket {extra}: {b}");
        let (status, _, b) = raw_http(tcp(port), &post(host, &format!("{extra}{auth}")));
        assert_eq!(status, 403, "tcp with the token {extra}: {b}");
    }
    // Without the token the token is what is refused first, but nothing runs either.
    let (status, _, _) = raw_http(tcp(port), &post(&here, "Origin: http://evil.example\r\n"));
    assert_eq!(status, 401);
    // A listener without a token refuses it too.
    let open = crate::http::start_open_front();
    let (status, _, _) = raw_http(
        tcp(open.port),
        &post(
            &format!("127.0.0.1:{}", open.port),
            "Origin: http://evil.example\r\n",
        ),
    );
    assert_eq!(status, 403);
    std::thread::sleep(Duration::from_millis(200));
    assert!(!marker.exists(), "nothing ran");
    // The WebSocket upgrade from another site: refused, no session made.
    let (_, r) = Relay::start(
        &py,
        &[
            "--url".into(),
            format!(
                "ws://127.0.0.1:{port}/v1/shell/ws?token={}",
                crate::http::TOKEN
            ),
            "--header".into(),
            "Origin: http://evil.example".into(),
        ],
    );
    assert_eq!(r, json!({"event": "refused", "status": 403}));
    let (_, r) = Relay::start(
        &py,
        &[
            "--uds".into(),
            front.daemon.socket.display().to_string(),
            "--header".into(),
            "Origin: http://evil.example".into(),
        ],
    );
    assert_eq!(r, json!({"event": "refused", "status": 403}));
    let mut c = front.daemon.client();
    let sessions = ok(&mut c, "shell/sessions", json!({}));
    assert_eq!(sessions["sessions"], json!({}), "no session was made");
    // Our own page, and clients that are no browser, are served.
    let (status, _, b) = raw_http(
        tcp(port),
        &post(
            &here,
            &format!("Origin: http://{here}\r\nSec-Fetch-Site: same-origin\r\n{auth}"),
        ),
    );
    assert_eq!(status, 200, "{b}");
    let (status, _, b) = raw_http(unix(&front.daemon.socket), &post("anything.example", ""));
    assert_eq!(status, 200, "{b}");
    wait_until("the command ran", || marker.exists());
    assert_no_panic(&front.daemon);
}

#[test]
fn http_host_names_a_host_a_browser_may_use() {
    let dir = TempDir::new();
    let socket = dir.path().join("execd.sock");
    let d = Daemon::start_at(dir, socket, &["--http-host", "box.example"]);
    let get = |host: &str| {
        raw_http(
            unix(&d.socket),
            &format!(
                "GET /v1/health HTTP/1.1\r\nHost: {host}\r\nOrigin: http://{host}\r\n\
                 Connection: close\r\n\r\n"
            ),
        )
        .0
    };
    assert_eq!(get("box.example:8080"), 200);
    assert_eq!(get("BOX.example"), 200);
    assert_eq!(get("other.example"), 403);
    assert_eq!(get("localhost:1"), 200);
    // The page is served with its policy.
    let (status, head, body) = raw_http(
        unix(&d.socket),
        "GET /terminal HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(status, 200);
    assert!(
        head.contains("Content-Type: text/html; charset=utf-8"),
        "{head}"
    );
    let csp = head
        .lines()
        .find_map(|l| l.strip_prefix("Content-Security-Policy: "))
        .expect("a CSP");
    assert!(
        csp.starts_with("default-src 'none'; script-src 'sha256-"),
        "{csp}"
    );
    assert!(
        csp.ends_with("'; style-src 'unsafe-inline'; connect-src 'self'; frame-ancestors 'none'")
    );
    assert!(body.contains("<script>") && body.len() < 40 << 10);
    assert_no_panic(&d);
}

#[test]
fn a_watched_session_is_in_use_and_closes_when_idle_once_left() {
    let Some(py) = python() else { return };
    let d = Daemon::start(&["--session-idle", "2s"]);
    let (mut w, _) = Relay::unix(&py, &d.socket, "/v1/shell/ws");
    let sid = w.greeting();
    w.prompt();
    let mut c = d.client();
    // Twice the idle time with a watcher: still there.
    std::thread::sleep(Duration::from_secs(4));
    let s = ok(&mut c, "shell/sessions", json!({}));
    assert!(s["sessions"][&sid].is_object(), "{s}");
    w.op(json!({"op": "close"}));
    w.until("close", |v| v["event"] == "closed");
    wait_until("the idle session closes", || {
        let s = ok(&mut c, "shell/sessions", json!({}));
        s["sessions"].get(&sid).is_none()
    });
}

#[test]
fn an_upgrade_in_place_closes_websockets_saying_so_and_the_session_goes_on() {
    let Some(py) = python() else { return };
    let d = Daemon::start(&[]);
    let _log = LogOnFailure(&d);
    let (mut w, _) = Relay::unix(&py, &d.socket, "/v1/shell/ws");
    let sid = w.greeting();
    w.prompt();
    w.keys("echo before-upgrade\r");
    w.output_until("before-upgrade\r\n");
    w.prompt();
    let mut c = d.client();
    unsafe_kill(d.pid(), libc::SIGUSR2);
    let closed = w.until("the close", |v| v["event"] == "closed");
    assert_eq!(closed["code"], 1012, "{closed}");
    wait_until("the new image serves", || {
        ok(&mut c, "initialize", json!({"protocolVersion": 1}))["_meta"]["execd"]["upgrades"] == 1
    });
    // Connecting again shows the session as it was, and it goes on.
    let (mut again, _) = Relay::unix(&py, &d.socket, &format!("/v1/shell/ws?session_id={sid}"));
    assert_eq!(again.greeting(), sid);
    let paint = again.next();
    assert!(
        paint["data"]["data"]
            .as_str()
            .is_some_and(|p| p.contains("before-upgrade")),
        "{paint}"
    );
    again.keys("echo after-upgrade\r");
    again.output_until("after-upgrade\r\n");
    assert_no_panic(&d);
}
