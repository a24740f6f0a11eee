//! Interactive shells (PROTOCOL.md 12.2): `shell/*` over JSON-RPC, `/v1/shell/*` over HTTP
//! with the AIO sandbox's own Python SDK (`tests/sdk/shell_drive.py`, in the virtualenv
//! `util::venv::sdk_python` makes), the gate and the audit on every line, owners kept apart,
//! sessions that leave nothing behind, and a shell that dies coming back.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::util::*;

/// `shell/exec` and its result.
#[track_caller]
fn exec(c: &mut Client, params: Value) -> Value {
    ok(c, "shell/exec", params)
}

/// One HTTP request over the daemon's socket (`Connection: close`): status and body.
pub fn http(socket: &Path, method: &str, path: &str, body: &Value) -> (u16, Value) {
    let s = UnixStream::connect(socket).expect("connect");
    s.set_read_timeout(Some(WAIT)).expect("timeout");
    http_on(s, "", method, path, body)
}

/// One HTTP request over TCP to `port`, with the test front's bearer token.
fn http_tcp(port: u16, method: &str, path: &str, body: &Value) -> (u16, Value) {
    let s = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect");
    s.set_read_timeout(Some(WAIT)).expect("timeout");
    let auth = format!("Authorization: Bearer {}\r\n", crate::http::TOKEN);
    http_on(s, &auth, method, path, body)
}

/// One request (`Connection: close`) on `s`, with the header lines `extra`.
fn http_on(
    mut s: impl Read + Write,
    extra: &str,
    method: &str,
    path: &str,
    body: &Value,
) -> (u16, Value) {
    let body = body.to_string();
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: execd\r\n{extra}Content-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).expect("send");
    let mut out = Vec::new();
    let mut buf = [0u8; 65536];
    loop {
        match read_some(&mut s, &mut buf) {
            Ok(0) => break,
            Ok(n) => out.extend_from_slice(&buf[..n]),
            Err(e) => panic!("read: {e}"),
        }
    }
    let text = String::from_utf8_lossy(&out).to_string();
    let (head, body) = text.split_once("\r\n\r\n").expect("a whole response");
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .expect("status");
    (status, serde_json::from_str(body).expect("JSON body"))
}

/// Every line of an audit file, parsed.
fn audit_lines(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect()
}

/// Reads a pid a command wrote to `file` (bounded wait until it is there).
#[track_caller]
fn pid_in(file: &Path) -> i32 {
    let mut pid = 0;
    wait_until("the pid file", || {
        pid = std::fs::read_to_string(file)
            .ok()
            .and_then(|t| t.trim().parse().ok())
            .unwrap_or(0);
        pid > 0
    });
    pid
}

#[test]
fn json_rpc_shell_methods_answer_with_the_sdk_s_objects() {
    let d = Daemon::start(&[]);
    let mut c = d.client();

    // sessions/create: `{session_id, working_dir}` (and execd's fields beside them).
    let s = ok(
        &mut c,
        "shell/sessions/create",
        json!({"id": "j1", "exec_dir": "/tmp", "no_change_timeout": 5}),
    );
    assert_eq!(s["session_id"], "j1", "{s}");
    assert_eq!(s["working_dir"], "/tmp", "{s}");
    assert!(
        s["process_id"]
            .as_str()
            .is_some_and(|p| p.starts_with("sh_")),
        "{s}"
    );
    assert!(s["pid"].as_i64().is_some_and(|p| p > 0), "{s}");

    // exec: cd and export persist; exit codes; the console.
    let r = exec(
        &mut c,
        json!({"id": "j1", "command": "cd /usr && export J=1"}),
    );
    assert_eq!(
        (
            r["status"].clone(),
            r["exit_code"].clone(),
            r["output"].clone()
        ),
        (json!("completed"), json!(0), json!(""))
    );
    let r = exec(
        &mut c,
        json!({"id": "j1", "command": "pwd; echo $J; false"}),
    );
    assert_eq!(r["output"], "/usr\n1\n", "{r}");
    assert_eq!(r["exit_code"], 1, "{r}");
    assert_eq!(r["session_id"], "j1");
    assert_eq!(r["command"], "pwd; echo $J; false");
    let console = r["console"].as_array().expect("console");
    assert_eq!(console.len(), 2, "{r}");
    assert_eq!(console[0]["command"], "cd /usr && export J=1");
    assert_eq!(console[1]["output"], "/usr\n1\n");
    assert!(
        console[0]["ps1"]
            .as_str()
            .is_some_and(|p| p.ends_with("/tmp# ") || p.ends_with("/tmp$ ")),
        "the prompt it was typed at: {r}"
    );
    let r = exec(&mut c, json!({"id": "j1", "command": "(exit 3)"}));
    assert_eq!(r["exit_code"], 3, "{r}");
    // No program sees the markers' nonce: it is in no environment.
    let r = exec(&mut c, json!({"id": "j1", "command": "env | grep -c 6973"}));
    assert_eq!(
        (r["output"].clone(), r["exit_code"].clone()),
        (json!("0\n"), json!(1))
    );

    // view: the last command, the console, and where the shell is.
    let v = ok(&mut c, "shell/view", json!({"id": "j1"}));
    assert_eq!(v["status"], "completed");
    assert_eq!(v["command"], "env | grep -c 6973");
    assert_eq!(v["exit_code"], 1);
    assert_eq!(v["working_dir"], "/usr");
    assert_eq!(v["console"].as_array().map(Vec::len), Some(4));

    // async, write, wait: `{status}`.
    let r = exec(
        &mut c,
        json!({"id": "j1", "command": "read -r a; echo \"<$a>\"", "async_mode": true}),
    );
    assert_eq!(r["status"], "running", "{r}");
    assert_eq!(r["exit_code"], Value::Null, "{r}");
    let w = match c.call(
        "shell/write",
        json!({"id": "j1", "input": "typed", "press_enter": true}),
    ) {
        Ok(w) => w,
        Err(e) => panic!(
            "write: {e}; view: {}",
            ok(&mut c, "shell/view", json!({"id": "j1"}))
        ),
    };
    assert_eq!(w["status"], "running", "{w}");
    let w = ok(&mut c, "shell/wait", json!({"id": "j1", "seconds": 15}));
    assert_eq!(w["status"], "completed", "{w}");
    let v = ok(&mut c, "shell/view", json!({"id": "j1"}));
    assert!(
        v["output"]
            .as_str()
            .is_some_and(|o| o.ends_with("<typed>\n")),
        "{v}"
    );
    // Nothing runs: write is refused, wait answers at once.
    let (code, message, _) = err(&mut c, "shell/write", json!({"id": "j1", "input": "x"}));
    assert_eq!(code, -32000);
    assert!(message.contains("use exec"), "{message}");
    let w = ok(&mut c, "shell/wait", json!({"id": "j1"}));
    assert_eq!(w["status"], "completed");

    // kill: `{status, exit_code, returncode}`; the session stays usable.
    exec(
        &mut c,
        json!({"id": "j1", "command": "sleep 30", "async_mode": true}),
    );
    std::thread::sleep(Duration::from_millis(300));
    let k = ok(&mut c, "shell/kill", json!({"id": "j1"}));
    assert_eq!(
        k,
        json!({"status": "terminated", "exit_code": 130, "returncode": 130})
    );
    let r = exec(&mut c, json!({"id": "j1", "command": "echo $J"}));
    assert_eq!(r["output"], "1\n");

    // Timeouts: soft (running, goes on), no change (answered, goes on), hard (killed).
    let r = exec(
        &mut c,
        json!({"id": "j1", "command": "sleep 1; echo s", "timeout": 0.2}),
    );
    assert_eq!(r["status"], "running", "{r}");
    ok(&mut c, "shell/wait", json!({"id": "j1", "seconds": 10}));
    let t = Instant::now();
    let r = exec(
        &mut c,
        json!({"id": "j1", "command": "sleep 2", "no_change_timeout": 0.5}),
    );
    assert_eq!(r["status"], "no_change_timeout", "{r}");
    assert!(
        t.elapsed() < Duration::from_millis(1900),
        "{:?}",
        t.elapsed()
    );
    ok(&mut c, "shell/wait", json!({"id": "j1", "seconds": 10}));
    // Waiting for input: answered within a second or so, not after 30 s (PROTOCOL 12.3).
    let t = Instant::now();
    let r = exec(&mut c, json!({"id": "j1", "command": "read -r v"}));
    assert_eq!(
        (r["status"].clone(), r["waiting_for_input"].clone()),
        (json!("no_change_timeout"), json!(true)),
        "{r}"
    );
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    ok(&mut c, "shell/write", json!({"id": "j1", "input": "v\n"}));
    ok(&mut c, "shell/wait", json!({"id": "j1", "seconds": 10}));
    let r = exec(
        &mut c,
        json!({"id": "j1", "command": "sleep 30", "hard_timeout": 0.5}),
    );
    assert_eq!(r["status"], "hard_timeout", "{r}");

    // Plain text, cut in the middle unless truncate is false.
    let r = exec(
        &mut c,
        json!({"id": "j1", "command": "printf '\\033[32mgreen\\033[0m\\n'"}),
    );
    assert_eq!(r["output"], "green\n");
    let big = "head -c 31000 /dev/zero | tr '\\0' y";
    let r = exec(&mut c, json!({"id": "j1", "command": big}));
    let out = r["output"].as_str().expect("output");
    assert!(out.contains("1000 characters omitted"), "{}", out.len());
    let r = exec(
        &mut c,
        json!({"id": "j1", "command": big, "truncate": false}),
    );
    assert_eq!(r["output"].as_str().map(str::len), Some(31000));

    // exec_dir: one command there; strict refuses a missing one.
    let r = exec(
        &mut c,
        json!({"id": "j1", "command": "pwd", "exec_dir": "/"}),
    );
    assert_eq!(r["output"], "/\n");
    let r = exec(&mut c, json!({"id": "j1", "command": "pwd"}));
    assert_eq!(r["output"], "/usr\n");
    let (code, _, data) = err(
        &mut c,
        "shell/exec",
        json!({"id": "j1", "command": "pwd", "exec_dir": "/no/such", "strict": true}),
    );
    assert_eq!(
        (code, data.map(|d| d["field"].clone())),
        (-32602, Some(json!("exec_dir")))
    );

    // An exec with a new id creates the session there.
    let r = exec(
        &mut c,
        json!({"id": "j2", "command": "pwd", "exec_dir": "/tmp"}),
    );
    assert_eq!(r["output"], "/tmp\n", "{r}");

    // update, list, stats.
    let u = ok(
        &mut c,
        "shell/sessions/update",
        json!({"id": "j1", "no_change_timeout": 7}),
    );
    assert_eq!(u["no_change_timeout"], 7.0, "{u}");
    let l = ok(&mut c, "shell/sessions", json!({}));
    let sessions = l["sessions"].as_object().expect("sessions map");
    assert_eq!(sessions.len(), 2, "{l}");
    let j1 = &sessions["j1"];
    for field in [
        "working_dir",
        "created_at",
        "last_used_at",
        "age_seconds",
        "status",
    ] {
        assert!(!j1[field].is_null(), "{field}: {j1}");
    }
    assert_eq!(j1["current_command"], Value::Null);
    assert_eq!(j1["working_dir"], "/usr");
    let st = ok(&mut c, "shell/sessions/stats", json!({}));
    assert_eq!(st["total_sessions"], 2, "{st}");
    assert_eq!(st["max_sessions"], 256);
    assert_eq!(st["session_timeout"], 3600);

    // Errors: an unknown session is -32002; so is everything once closed.
    let (code, _, _) = err(&mut c, "shell/view", json!({"id": "nope"}));
    assert_eq!(code, -32002);
    let (code, _, _) = err(&mut c, "shell/exec", json!({"id": "j1", "command": ""}));
    assert_eq!(code, -32602);
    ok(&mut c, "shell/sessions/close", json!({"id": "j1"}));
    let (code, _, _) = err(&mut c, "shell/view", json!({"id": "j1"}));
    assert_eq!(code, -32002);
    let (code, _, _) = err(&mut c, "shell/sessions/close", json!({"id": "j1"}));
    assert_eq!(code, -32002);
    let all = ok(&mut c, "shell/sessions/close_all", json!({}));
    assert_eq!(all["closed"], json!(["j2"]));
    assert_eq!(
        ok(&mut c, "shell/sessions", json!({}))["sessions"],
        json!({})
    );
    assert_no_panic(&d);
}

#[test]
fn the_aio_python_sdk_drives_shells_over_the_socket_and_tcp() {
    let Some(python) = crate::util::venv::sdk_python() else {
        return;
    };
    let work = TempDir::new();
    let front = crate::http::start_front(&[]);
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/sdk/shell_drive.py");
    let runs: [(&str, Vec<String>); 2] = [
        (
            "tcp",
            vec![
                "--base-url".into(),
                format!("http://127.0.0.1:{}", front.port),
                "--token".into(),
                crate::http::TOKEN.into(),
            ],
        ),
        (
            "unix",
            vec!["--uds".into(), front.daemon.socket.display().to_string()],
        ),
    ];
    // The two transports side by side: each has its own sessions.
    let handles: Vec<_> = runs
        .into_iter()
        .map(|(name, args)| {
            let (python, script, log) = (
                python.clone(),
                script.clone(),
                work.path().join(format!("shell-drive-{name}.log")),
            );
            std::thread::spawn(move || {
                let out = crate::util::venv::run_bounded(
                    Command::new(&python)
                        .arg("-B") // no __pycache__ beside tests/sdk/checks.py
                        .arg(&script)
                        .args(&args),
                    Duration::from_secs(180),
                    &log,
                );
                (name, out)
            })
        })
        .collect();
    for h in handles {
        let (name, out) = h.join().expect("driver thread");
        assert!(
            out.status.success(),
            "shell_drive.py over {name} failed ({}):\n{}\n{}\ndaemon log:\n{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
            front.daemon.log()
        );
    }
    assert_no_panic(&front.daemon);
}

#[test]
fn a_denied_line_never_runs_and_an_allowed_one_is_audited() {
    let dir = TempDir::new();
    let policy = dir.path().join("policy.json");
    std::fs::write(
        &policy,
        r#"{"rules": [{"name": "no-touch", "pattern": ["touch"], "decision": "deny",
             "justification": "no new files"}]}"#,
    )
    .expect("policy");
    let audit = dir.path().join("audit.jsonl");
    let marker = dir.path().join("touched");
    let socket = dir.path().join("execd.sock");
    let flags = [
        "--policy",
        policy.to_str().expect("utf-8"),
        "--audit",
        audit.to_str().expect("utf-8"),
    ];
    let d = Daemon::start_at(dir, socket, &flags);
    let mut c = d.client();

    // JSON-RPC: the gate's code; a line that creates a session creates none.
    let line = format!("touch {}", marker.display());
    let (code, _, data) = err(&mut c, "shell/exec", json!({"id": "g", "command": line}));
    assert_eq!(code, -32005);
    assert_eq!(data.expect("data")["rule"], "no-touch");
    let (code, _, _) = err(&mut c, "shell/view", json!({"id": "g"}));
    assert_eq!(code, -32002, "a denied line made no session");
    // In a running session, through a shell line too (`a && b`).
    exec(&mut c, json!({"id": "g", "command": "echo allowed"}));
    let (code, _, _) = err(
        &mut c,
        "shell/exec",
        json!({"id": "g", "command": format!("true && {line}")}),
    );
    assert_eq!(code, -32005);
    // HTTP: 403.
    let (status, body) = http(
        &d.socket,
        "POST",
        "/v1/shell/exec",
        &json!({"id": "g", "command": line}),
    );
    assert_eq!(status, 403, "{body}");
    assert_eq!(body["success"], false);
    // Setting a prompt runs what it expands before each later command: not a plain line.
    let r = c.call(
        "shell/exec",
        json!({"id": "g", "command": "PS1='$(touch /x)'"}),
    );
    assert!(r.is_err(), "unparsed lines ask, and nobody approves: {r:?}");
    let v = ok(&mut c, "shell/view", json!({"id": "g"}));
    assert_eq!(v["console"].as_array().map(Vec::len), Some(1), "{v}");
    assert!(!marker.exists(), "a denied line never ran");

    // The allowed line's start and end are audited, with the line, as any command's.
    wait_until("the audit records", || {
        audit_lines(&audit)
            .iter()
            .any(|r| r["event"] == "exit" && r["session"] == "g")
    });
    let records = audit_lines(&audit);
    let start = records
        .iter()
        .find(|r| r["event"] == "start" && r["line"] == "echo allowed")
        .unwrap_or_else(|| panic!("a start record: {records:?}"));
    assert_eq!(start["session"], "g");
    assert_eq!(start["decision"], "allow");
    assert!(
        start["id"]
            .as_str()
            .is_some_and(|i| i.starts_with("shcmd_")),
        "{start}"
    );
    let exit = records
        .iter()
        .find(|r| r["event"] == "exit" && r["id"] == start["id"])
        .unwrap_or_else(|| panic!("an exit record: {records:?}"));
    assert_eq!(exit["status"], "completed");
    assert_eq!(exit["exit_code"], 0);
    let denied: Vec<&Value> = records.iter().filter(|r| r["event"] == "deny").collect();
    assert_eq!(denied.len(), 3, "{records:?}");
    assert!(denied.iter().all(|r| r["rule"] == "no-touch"));
    // The shell itself is started as what it is, not judged.
    assert!(
        records
            .iter()
            .any(|r| r["event"] == "start" && r["rule"] == "shell-session"),
        "{records:?}"
    );
    assert_no_panic(&d);
}

#[test]
fn another_uid_neither_sees_nor_reaches_a_session() {
    if !running_as_root() {
        return skip("needs root to connect as another uid");
    }
    let d = Daemon::start(&["--socket-mode", "0666", "--allow-uid", "65534"]);
    d.let_others_in();
    let mut c = d.client();
    exec(&mut c, json!({"id": "mine", "command": "echo secret"}));
    let mut nobody = d.client_in_other_process_as(Some(65534));
    assert_eq!(
        ok(&mut nobody, "shell/sessions", json!({})),
        json!({"sessions": {}})
    );
    for (method, params) in [
        ("shell/view", json!({"id": "mine"})),
        ("shell/wait", json!({"id": "mine"})),
        ("shell/write", json!({"id": "mine", "input": "x"})),
        ("shell/kill", json!({"id": "mine"})),
        (
            "shell/resize",
            json!({"id": "mine", "rows": 30, "cols": 100}),
        ),
        (
            "shell/sessions/update",
            json!({"id": "mine", "no_change_timeout": 1}),
        ),
        ("shell/sessions/close", json!({"id": "mine"})),
    ] {
        let (code, _, _) = err(&mut nobody, method, params);
        assert_eq!(code, -32002, "{method}");
    }
    assert_eq!(
        ok(&mut nobody, "shell/sessions/close_all", json!({})),
        json!({"closed": []})
    );
    let st = ok(&mut nobody, "shell/sessions/stats", json!({}));
    assert_eq!(st["total_sessions"], 0);
    // Its own session of the same name is its own: ours never sees its command.
    let r = exec(
        &mut nobody,
        json!({"id": "mine", "command": "id -u", "exec_dir": "/tmp"}),
    );
    assert_eq!(r["output"], "65534\n");
    let v = ok(&mut c, "shell/view", json!({"id": "mine"}));
    assert_eq!(v["console"].as_array().map(Vec::len), Some(1), "{v}");
    assert_eq!(v["output"], "secret\n");
    assert_no_panic(&d);
}

/// Over TCP, requests run as `--http-run-as` (nobody here): the socket's root session is
/// 404 there, and what it makes there runs as nobody.
#[test]
fn over_tcp_a_session_of_the_socket_s_peer_is_404() {
    if !running_as_root() {
        return skip("needs root to run TCP requests as nobody");
    }
    let front = crate::http::start_front(&[]);
    let (status, _) = http(
        &front.daemon.socket,
        "POST",
        "/v1/shell/exec",
        &json!({"id": "rooted", "command": "true"}),
    );
    assert_eq!(status, 200);
    let (status, body) = http_tcp(
        front.port,
        "POST",
        "/v1/shell/view",
        &json!({"id": "rooted"}),
    );
    assert_eq!(status, 404, "{body}");
    let (status, body) = http_tcp(
        front.port,
        "DELETE",
        "/v1/shell/sessions/rooted",
        &json!({}),
    );
    assert_eq!(status, 404, "{body}");
    let (status, body) = http_tcp(
        front.port,
        "POST",
        "/v1/shell/exec",
        &json!({"id": "tcp", "command": "id -u"}),
    );
    assert_eq!(
        (status, body["data"]["output"].clone()),
        (200, json!("65534\n")),
        "{body}"
    );
    let (_, body) = http_tcp(front.port, "GET", "/v1/shell/sessions", &json!({}));
    let ids: Vec<String> = body["data"]["sessions"]
        .as_object()
        .map(|m| m.keys().cloned().collect())
        .unwrap_or_default();
    assert_eq!(ids, ["tcp"]);
    assert_no_panic(&front.daemon);
}

#[test]
fn a_closed_session_leaves_no_process() {
    let d = Daemon::start(&["--session-idle", "2s"]);
    let mut c = d.client();
    let dir = d.dir.path().to_path_buf();
    for (id, close) in [("explicit", true), ("idle", false)] {
        let s = ok(&mut c, "shell/sessions/create", json!({"id": id}));
        let shell = s["pid"].as_i64().expect("pid") as i32;
        let bg = dir.join(format!("{id}-bg.pid"));
        let fg = dir.join(format!("{id}-fg.pid"));
        // A background job, and (for the explicit close) a foreground one.
        exec(
            &mut c,
            json!({"id": id, "command": format!("sleep 1000 & echo $! > {}", bg.display())}),
        );
        let mut pids = vec![shell, pid_in(&bg)];
        if close {
            exec(
                &mut c,
                json!({"id": id, "async_mode": true,
                       "command": format!("sh -c 'echo $$ > {}; exec sleep 999'", fg.display())}),
            );
            pids.push(pid_in(&fg));
            ok(&mut c, "shell/sessions/close", json!({"id": id}));
        }
        for pid in pids {
            wait_until(&format!("{id}: pid {pid} is gone"), || !pid_alive(pid));
        }
        let (code, _, _) = err(&mut c, "shell/view", json!({"id": id}));
        assert_eq!(code, -32002, "{id}");
    }
    assert!(d.log().contains("idle for 2 s"), "{}", d.log());
    assert_no_panic(&d);
}

#[test]
fn a_shell_that_dies_is_restarted_at_a_prompt_and_says_so() {
    let d = Daemon::start(&[]);
    let mut c = d.client();
    exec(
        &mut c,
        json!({"id": "r", "command": "cd /tmp && echo before"}),
    );

    // `exit` typed: that command is terminated, and a new shell waits in /tmp.
    let r = exec(&mut c, json!({"id": "r", "command": "exit 7"}));
    assert_eq!(r["status"], "terminated", "{r}");
    assert_eq!(r["exit_code"], 7, "{r}");
    let out = r["output"].as_str().expect("output");
    assert!(
        out.contains("the shell exited with status 7; a new shell was started in /tmp"),
        "{out}"
    );
    let r = exec(&mut c, json!({"id": "r", "command": "pwd"}));
    assert_eq!(r["output"], "/tmp\n", "{r}");

    // Killed by a signal while a command runs in it, asynchronously this time.
    exec(
        &mut c,
        json!({"id": "r", "command": "echo dying; kill -9 $$", "async_mode": true}),
    );
    let w = ok(&mut c, "shell/wait", json!({"id": "r", "seconds": 15}));
    assert_eq!(w["status"], "terminated", "{w}");
    let v = ok(&mut c, "shell/view", json!({"id": "r"}));
    assert_eq!(v["exit_code"], Value::Null, "{v}");
    let out = v["output"].as_str().expect("output");
    assert!(out.starts_with("dying\n"), "{out}");
    assert!(out.contains("was killed by SIGKILL"), "{out}");
    assert!(
        v["notice"].as_str().is_some_and(|n| n.contains("SIGKILL")),
        "{v}"
    );
    assert_eq!(v["restarts"], 2, "{v}");

    // What came before is kept; the session goes on.
    let console = v["console"].as_array().expect("console");
    assert_eq!(console[0]["output"], "before\n", "{v}");
    let r = exec(&mut c, json!({"id": "r", "command": "echo after; pwd"}));
    assert_eq!(r["output"], "after\n/tmp\n", "{r}");
    assert_eq!(
        ok(&mut c, "shell/sessions", json!({}))["sessions"]["r"]["restarts"],
        2
    );

    // Its last directory is gone when it dies: the next shell starts in --workdir.
    let gone = d.dir.path().join("gone");
    std::fs::create_dir(&gone).expect("mkdir");
    exec(
        &mut c,
        json!({"id": "r", "command": format!("cd {}", gone.display())}),
    );
    let r = exec(
        &mut c,
        json!({"id": "r", "command": "rmdir \"$PWD\" && exit"}),
    );
    assert_eq!(r["status"], "terminated", "{r}");
    let r = exec(&mut c, json!({"id": "r", "command": "pwd"}));
    let here = std::env::current_dir().expect("cwd");
    assert_eq!(r["output"], format!("{}\n", here.display()), "{r}");
    assert_no_panic(&d);
}

#[test]
fn a_command_that_ignores_sigint_is_ended_with_its_shell() {
    let d = Daemon::start(&[]);
    let mut c = d.client();
    exec(
        &mut c,
        json!({"id": "h", "command": "export KEEP=no; cd /tmp"}),
    );
    let t = Instant::now();
    let r = exec(
        &mut c,
        json!({"id": "h", "command": "trap '' INT; sleep 60", "hard_timeout": 0.5}),
    );
    assert_eq!(r["status"], "hard_timeout", "{r}");
    // SIGINT at 0.5 s, the shell's kill a grace (1 s) later, its SIGKILL at most one more.
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    let r = exec(
        &mut c,
        json!({"id": "h", "command": "echo \"[$KEEP]\"; pwd"}),
    );
    assert_eq!(
        r["output"], "[]\n/tmp\n",
        "a new shell, in the last directory: {r}"
    );
    assert_no_panic(&d);
}

/// A kill that comes as the shell starts the command (the start marker seen, the job not
/// yet in the terminal's foreground) reaches the command: bash keeps a SIGINT that comes
/// while it forks, so the daemon looks again and sends the job its own. Before, about one
/// in two of these left `sleep` running until the grace ended the whole shell.
///
/// An `exec` is answered at its command's end marker; the next prompt may be read a moment
/// later, and a line sent before it waits in the session's queue. A kill that finds the
/// line still queued ends it unrun (`terminated`, no exit code, the shell untouched, and
/// no `start` in the audit, which is written when a line is typed): such a round is taken
/// again, up to 40 extra tries.
#[test]
fn a_kill_as_the_command_starts_reaches_it_and_the_shell_stays() {
    let dir = TempDir::new();
    let audit = dir.path().join("audit.jsonl");
    let socket = dir.path().join("execd.sock");
    let d = Daemon::start_at(dir, socket, &["--audit", audit.to_str().expect("utf-8")]);
    let mut c = d.client();
    exec(&mut c, json!({"id": "k", "command": "true"}));
    let shell =
        |c: &mut Client| ok(c, "shell/sessions", json!({}))["sessions"]["k"]["process_id"].clone();
    let started = || {
        audit_lines(&audit)
            .iter()
            .filter(|r| r["event"] == "start" && r["line"] == "sleep 60")
            .count()
    };
    let first = shell(&mut c);
    let (mut rounds, mut tries) = (0, 0);
    while rounds < 20 {
        tries += 1;
        assert!(
            tries <= 60,
            "{rounds} rounds in {tries} tries: the line kept being queued"
        );
        // The last command's end first: the next line then waits for no more than the
        // prompt that follows it (it is seldom queued, not never).
        exec(&mut c, json!({"id": "k", "command": "true"}));
        let before = started();
        exec(
            &mut c,
            json!({"id": "k", "command": "sleep 60", "async_mode": true}),
        );
        ok(&mut c, "shell/kill", json!({"id": "k"}));
        let r = ok(&mut c, "shell/wait", json!({"id": "k", "seconds": 20}));
        assert_eq!(shell(&mut c), first, "round {rounds}: the same shell: {r}");
        // The audit is written before the answers of the turn that types a line.
        let queued = started() == before;
        if queued {
            assert_eq!(r["status"], "terminated", "round {rounds}: {r}");
            assert!(r["exit_code"].is_null(), "round {rounds}: {r}");
            continue;
        }
        assert_eq!(r["exit_code"], 130, "round {rounds}: {r}");
        rounds += 1;
    }
    assert_no_panic(&d);
}

#[test]
fn shell_and_bash_sessions_share_max_sessions() {
    let d = Daemon::start(&["--max-sessions", "2"]);
    let mut c = d.client();
    ok(
        &mut c,
        "bash/exec",
        json!({"session_id": "b", "command": "sleep 30", "async_mode": true}),
    );
    exec(
        &mut c,
        json!({"id": "s", "command": "sleep 30", "async_mode": true}),
    );
    // Both busy: a third session of either kind is refused.
    let (code, _, data) = err(&mut c, "shell/sessions/create", json!({"id": "t"}));
    assert_eq!(code, -32003);
    assert_eq!(data.expect("data")["limit"], "max-sessions");
    let (code, _, _) = err(&mut c, "bash/sessions/create", json!({"session_id": "u"}));
    assert_eq!(code, -32003);
    // The shell's command ends: a named shell session is never closed to make room
    // (its `cd` and variables are state someone built), so a third is still refused.
    ok(&mut c, "shell/kill", json!({"id": "s"}));
    let (code, _, _) = err(&mut c, "shell/sessions/create", json!({"id": "t"}));
    assert_eq!(code, -32003);
    // The bash session's command ends: it is the one that makes room.
    ok(
        &mut c,
        "bash/kill",
        json!({"session_id": "b", "signal": "SIGKILL"}),
    );
    wait_until("b's command ends", || {
        ok(&mut c, "bash/sessions", json!({}))[0]["current_command"].is_null()
    });
    ok(&mut c, "shell/sessions/create", json!({"id": "t"}));
    let l = ok(&mut c, "shell/sessions", json!({}));
    let mut names = l["sessions"]
        .as_object()
        .map(|m| m.keys().cloned().collect::<Vec<_>>())
        .unwrap_or_default();
    names.sort();
    assert_eq!(names, ["s", "t"]);
    assert!(d.log().contains("bash session \"b\" of uid"), "{}", d.log());
    assert_no_panic(&d);
}

/// A subscriber of the shell's own process gets its terminal's bytes, and the HTTP routes
/// close sessions with DELETE.
#[test]
fn the_http_routes_close_with_delete_and_an_unknown_id_is_404() {
    let d = Daemon::start(&[]);
    let (status, body) = http(
        &d.socket,
        "POST",
        "/v1/shell/sessions/create",
        &json!({"id": "h1"}),
    );
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["data"]["session_id"], "h1");
    let (status, body) = http(&d.socket, "DELETE", "/v1/shell/sessions/nope", &json!({}));
    assert_eq!(status, 404, "{body}");
    let (status, _) = http(&d.socket, "DELETE", "/v1/shell/sessions/h1", &json!({}));
    assert_eq!(status, 200);
    let (status, body) = http(&d.socket, "POST", "/v1/shell/view", &json!({"id": "h1"}));
    assert_eq!(status, 404, "{body}");
    let (status, body) = http(&d.socket, "POST", "/v1/shell/write", &json!({}));
    assert_eq!(status, 422, "{body}");
    assert_eq!(body["detail"][0]["loc"], json!(["body", "input"]));
    let (status, body) = http(&d.socket, "GET", "/v1/shell/sessions/stats", &json!({}));
    assert_eq!(
        (status, body["data"]["total_sessions"].clone()),
        (200, json!(0))
    );
    let (status, body) = http(&d.socket, "DELETE", "/v1/shell/sessions", &json!({}));
    assert_eq!(status, 200, "{body}");
    assert_no_panic(&d);
}

/// `$?` at the start of a line is the last line's status, as at a prompt, and giving it
/// back fires no ERR trap.
#[test]
fn the_last_status_carries_over_to_the_next_line() {
    let d = Daemon::start(&[]);
    let mut c = d.client();
    let out = |c: &mut Client, line: &str| {
        exec(c, json!({"id": "st", "command": line}))["output"].clone()
    };
    out(&mut c, "false");
    assert_eq!(out(&mut c, "echo $?"), "1\n");
    assert_eq!(out(&mut c, "echo $?"), "0\n");
    out(&mut c, "(exit 7)");
    assert_eq!(out(&mut c, "echo $? $?"), "7 7\n");
    out(&mut c, "trap 'echo ERR' ERR");
    assert!(out(&mut c, "false")
        .as_str()
        .is_some_and(|o| o.starts_with("ERR\n")));
    assert_eq!(out(&mut c, "echo $?"), "1\n");
    let v = ok(&mut c, "shell/view", json!({"id": "st"}));
    assert_eq!(v["restarts"], 0, "{v}");
    assert_no_panic(&d);
}

/// `shell/resize` (execd's, beside the SDK's methods): the session's terminal takes the
/// size, a shell started again keeps it, and bad sizes and unknown ids are refused as the
/// other methods refuse them.
#[test]
fn shell_resize_sets_the_sessions_terminal_size_and_refuses_what_bash_resize_refuses() {
    let d = Daemon::start(&[]);
    let mut c = d.client();
    ok(&mut c, "shell/sessions/create", json!({"id": "w"}));
    let size =
        |c: &mut Client| exec(c, json!({"id": "w", "command": "stty size"}))["output"].clone();
    assert_eq!(size(&mut c), "24 80\n");
    assert_eq!(
        ok(
            &mut c,
            "shell/resize",
            json!({"id": "w", "rows": 30, "cols": 100})
        ),
        json!({})
    );
    assert_eq!(size(&mut c), "30 100\n");
    let info = &ok(&mut c, "shell/sessions", json!({}))["sessions"]["w"];
    assert_eq!(info["size"], json!({"rows": 30, "cols": 100}));
    for bad in [
        json!({"id": "w", "rows": 0, "cols": 80}),
        json!({"id": "w", "rows": 24, "cols": 1001}),
        json!({"id": "w", "rows": 24}),
        json!({"id": "w", "rows": -1, "cols": 80}),
        json!({"id": "w", "rows": "24", "cols": 80}),
    ] {
        let (code, _, _) = err(&mut c, "shell/resize", bad.clone());
        assert_eq!(code, -32602, "{bad}");
    }
    let (code, _, _) = err(
        &mut c,
        "shell/resize",
        json!({"id": "nope", "rows": 5, "cols": 5}),
    );
    assert_eq!(code, -32002);
    let (code, _, _) = err(&mut c, "shell/view", json!({"id": "nope"}));
    assert_eq!(code, -32002, "the same answer as the other methods");
    // A shell that dies is started again at the session's size.
    let r = exec(&mut c, json!({"id": "w", "command": "exit"}));
    assert_eq!(r["status"], "terminated", "{r}");
    assert_eq!(size(&mut c), "30 100\n");
    // Bytes that are not text reach the program with encoding base64.
    exec(
        &mut c,
        json!({"id": "w", "command": "head -c 3 | od -An -tx1", "async_mode": true}),
    );
    ok(
        &mut c,
        "shell/write",
        json!({"id": "w", "input": "/wEK", "encoding": "base64"}),
    );
    ok(&mut c, "shell/wait", json!({"id": "w", "seconds": 15}));
    let v = ok(&mut c, "shell/view", json!({"id": "w"}));
    assert!(
        v["output"].as_str().is_some_and(|o| o.contains("ff 01 0a")),
        "{v}"
    );
    // HTTP: the route, and 422 / 404 as section 11 maps the codes.
    let (status, body) = http(
        &d.socket,
        "POST",
        "/v1/shell/resize",
        &json!({"id": "w", "rows": 40, "cols": 120}),
    );
    assert_eq!((status, &body["success"]), (200, &json!(true)), "{body}");
    assert_eq!(size(&mut c), "40 120\n");
    let (status, _) = http(
        &d.socket,
        "POST",
        "/v1/shell/resize",
        &json!({"id": "w", "rows": 0, "cols": 1}),
    );
    assert_eq!(status, 422);
    let (status, _) = http(
        &d.socket,
        "POST",
        "/v1/shell/resize",
        &json!({"id": "nope", "rows": 1, "cols": 1}),
    );
    assert_eq!(status, 404);
    assert_no_panic(&d);
}

#[test]
fn a_session_s_shell_can_be_watched_through_events() {
    let d = Daemon::start(&[]);
    let mut c = d.client();
    let s = ok(&mut c, "shell/sessions/create", json!({"id": "w"}));
    let id = s["process_id"].as_str().expect("process_id").to_string();
    ok(&mut c, "events/subscribe", json!({"id": id}));
    let mut other = d.client();
    exec(&mut other, json!({"id": "w", "command": "echo watched"}));
    let deadline = Instant::now() + WAIT;
    let mut text = String::new();
    while !text.contains("watched\n") {
        assert!(Instant::now() < deadline, "no output event: {text:?}");
        let m = c.read_message(Some(WAIT)).expect("an event");
        if m["params"]["type"] == "Output" {
            text.push_str(m["params"]["payload"]["data"].as_str().unwrap_or(""));
        }
    }
    // Text events are plain: the markers never show.
    assert!(!text.contains("6973"), "{text:?}");
    // Not a terminal: the ACP methods do not reach it.
    let (code, _, _) = err(
        &mut c,
        "terminal/output",
        json!({"sessionId": "w", "terminalId": id}),
    );
    assert_eq!(code, -32002);
    let l = ok(&mut c, "terminal/list", json!({}));
    assert_eq!(l["terminals"], json!([]), "{l}");
    assert_no_panic(&d);
}

// ---- execctl ---------------------------------------------------------------------------

#[test]
fn execctl_shell_runs_a_script_line_by_line_and_lists_the_session() {
    use crate::util::cli::{command, ctl_code, run_with_input};
    let d = Daemon::start(&[]);
    let script = b"cd /tmp\npwd\nexport KEEP=1\necho $((6 * 7))\n(exit 4)\n";
    let o = run_with_input(command(Some(&d.socket), &["shell", "scripted"]), script);
    assert_eq!(o.code, Some(4), "the last line's exit code: {o:?}");
    assert!(o.stdout.contains("/tmp\n"), "{o:?}");
    assert!(o.stdout.contains("42\n"), "{o:?}");
    assert!(!o.stdout.contains("6973"), "no marker shows: {o:?}");
    // The session goes on: its state is there for the next execctl.
    let o = run_with_input(
        command(Some(&d.socket), &["shell", "scripted"]),
        b"echo \"keep=$KEEP\"; pwd\n",
    );
    assert_eq!(o.code, Some(0), "{o:?}");
    assert!(o.stdout.contains("keep=1\n/tmp\n"), "{o:?}");

    // ps and sessions list it beside bash ones.
    ctl_code(&d, &["exec", "--session", "b1", "true"], 0);
    let o = ctl_code(&d, &["--json", "sessions"], 0);
    let v: Value = serde_json::from_str(&o.stdout).expect("JSON");
    let kinds: Vec<(String, String)> = v["sessions"]
        .as_array()
        .expect("sessions")
        .iter()
        .map(|s| {
            (
                s["id"].as_str().unwrap_or("").to_string(),
                s["kind"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect();
    assert!(
        kinds.contains(&("scripted".into(), "shell".into())),
        "{kinds:?}"
    );
    assert!(kinds.contains(&("b1".into(), "bash".into())), "{kinds:?}");
    let o = ctl_code(&d, &["sessions"], 0);
    assert!(
        o.stdout
            .lines()
            .any(|l| l.split_whitespace().take(2).eq(["scripted", "shell"])),
        "{}",
        o.stdout
    );
    let o = ctl_code(&d, &["--json", "ps"], 0);
    let v: Value = serde_json::from_str(&o.stdout).expect("JSON");
    let shell = v["processes"]
        .as_array()
        .expect("processes")
        .iter()
        .find(|p| p["kind"] == "shell")
        .unwrap_or_else(|| panic!("a shell row: {v}"))
        .clone();
    assert_eq!(shell["session"], "scripted");
    assert_eq!(shell["state"], "running");
    assert_eq!(shell["cwd"], "/tmp");
    // sessions close finds it by name, and prune closes the idle rest.
    let o = ctl_code(&d, &["sessions", "close", "scripted"], 0);
    assert_eq!(o.stdout, "scripted\n");
    let mut c = d.client();
    assert_eq!(
        ok(&mut c, "shell/sessions", json!({}))["sessions"],
        json!({})
    );
    assert_no_panic(&d);
}

#[test]
fn execctl_shell_at_a_terminal_sends_input_to_the_running_command_and_ctrl_c_interrupts_it() {
    use crate::util::cli::{command, open_pty, Screen};
    use std::os::fd::AsFd;
    let d = Daemon::start(&[]);
    let (master, slave) = open_pty();
    let mut cmd = command(Some(&d.socket), &["shell", "typed", "--cwd", "/tmp"]);
    cmd.stdin(std::process::Stdio::from(
        slave.as_fd().try_clone_to_owned().expect("dup"),
    ))
    .stdout(std::process::Stdio::from(
        slave.as_fd().try_clone_to_owned().expect("dup"),
    ))
    .stderr(std::process::Stdio::null());
    let mut child = cmd.spawn().expect("spawn execctl shell");
    drop(slave);
    let mut keys = master.try_clone().expect("dup master");
    let screen = Screen::watch(master);
    screen.wait_for(":/tmp", 1);
    keys.write_all(b"read -r x; echo \"got $x\"\n")
        .expect("type");
    std::thread::sleep(Duration::from_millis(300));
    keys.write_all(b"typed in\n").expect("type");
    screen.wait_for("got typed in", 1);
    // Keys typed before the command has ended are its own (as in any terminal): the
    // next line waits for the prompt.
    let mut c = d.client();
    wait_until("the prompt", || {
        ok(&mut c, "shell/view", json!({"id": "typed"}))["status"] == "completed"
    });
    keys.write_all(b"sleep 30\n").expect("type");
    wait_until("sleep runs", || {
        ok(&mut c, "shell/view", json!({"id": "typed"}))["status"] == "running"
    });
    let t = Instant::now();
    unsafe_kill(child.id() as i32, libc::SIGINT);
    wait_until("the command is interrupted", || {
        ok(&mut c, "shell/view", json!({"id": "typed"}))["status"] == "terminated"
    });
    assert!(t.elapsed() < Duration::from_secs(5));
    keys.write_all(b"echo after\n").expect("type");
    let deadline = Instant::now() + WAIT;
    // Its echo (execctl's, at the prompt) and its output.
    while screen.text().matches("after\r\n").count() < 2 {
        assert!(
            Instant::now() < deadline,
            "no output of the next command: {:?}\n{}",
            screen.text(),
            d.log()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // Ctrl-D at the prompt leaves; the session stays.
    wait_until("the prompt", || {
        ok(&mut c, "shell/view", json!({"id": "typed"}))["status"] == "completed"
    });
    keys.write_all(b"\x04").expect("type");
    let deadline = Instant::now() + WAIT;
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait") {
            break s;
        }
        assert!(Instant::now() < deadline, "execctl shell did not leave");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success(), "{status:?}: {}", screen.text());
    let v = ok(&mut c, "shell/view", json!({"id": "typed"}));
    assert_eq!(v["command"], "echo after");
    assert_no_panic(&d);
}
