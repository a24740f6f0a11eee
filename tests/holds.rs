//! The gate holds (PROTOCOL.md 7.3, 8, 11) against the real daemon: an approver is never
//! the requester, `--approver-uid` names who approves, approvers see what will run,
//! approvals for the session cover their rules only, a second uid holds at most half of
//! what is shared, what a peer names is bounded, listings fit the client buffer, and a
//! TCP peer without the token costs no more than its request head.

use std::io::{Read, Write};
use std::time::Duration;

use crate::util::*;

/// Asks for `true` and `rm` (two rules), allows the rest.
const POLICY: &str = r#"{"default": "allow", "unparsed": "ask", "rules": [
    {"name": "true", "pattern": ["true"], "decision": "ask"},
    {"name": "rm", "pattern": ["rm"], "decision": "ask", "justification": "deletes files"}
]}"#;

/// The daemon: `POLICY`, sockets others may reach, and `extra` flags.
fn daemon(extra: &[&str]) -> Daemon {
    let dir = TempDir::new();
    let policy = dir.path().join("policy.json");
    std::fs::write(&policy, POLICY).expect("write policy");
    let socket = dir.path().join("execd.sock");
    let mut flags = vec![
        "--policy",
        policy.to_str().expect("utf-8"),
        "--socket-mode",
        "0666",
    ];
    flags.extend_from_slice(extra);
    let d = Daemon::start_at(dir, socket, &flags);
    d.let_others_in();
    d
}

/// Makes `c` an approver.
#[track_caller]
fn subscribe(c: &mut Client) {
    ok(c, "approvals/subscribe", json!({}));
}

/// Answers an approval request.
fn answer(a: &mut Client, request: &Value, response: &str) {
    let id = &request["id"];
    let m = json!({"jsonrpc": "2.0", "id": id,
        "result": {"request_id": id, "response": response}});
    a.send_line(m.to_string().as_bytes()).expect("answer");
}

/// Sends an async `bash/exec` of `line` in session `session`.
fn exec(c: &mut Client, session: &str, line: &str) -> u64 {
    c.send(
        "bash/exec",
        json!({"command": line, "session_id": session, "async_mode": true}),
    )
    .expect("send")
}

/// A directory a command under test would delete.
fn victim(d: &Daemon, name: &str) -> std::path::PathBuf {
    let v = d.dir.path().join(name);
    std::fs::create_dir_all(v.join("inside")).expect("victim");
    v
}

#[test]
fn the_requester_s_own_process_is_never_its_approver() {
    let d = daemon(&[]);
    // An approver in this test process: the same process as the requester below.
    let mut _same = d.client();
    subscribe(&mut _same);
    let mut c = d.client();
    let (code, _, data) = err(&mut c, "bash/exec", json!({"command": "true"}));
    assert_eq!(code, -32006);
    assert_eq!(data.expect("data")["reason"], "no approver");
    // Another process is asked.
    let mut other = d.client_in_other_process();
    subscribe(&mut other);
    let id = exec(&mut c, "s", "true");
    let req = next_request(&mut other);
    answer(&mut other, &req, "approve");
    assert!(c.wait_response(id).is_ok());
}

#[test]
fn approver_uid_names_who_approves_for_everyone() {
    if !running_as_root() {
        return skip("needs root to approve as another uid");
    }
    let d = daemon(&["--approver-uid", "65534", "--allow-uid", "65534"]);
    // Root is not named: it may not approve.
    let mut root = d.client_in_other_process();
    let (code, message, _) = err(&mut root, "approvals/subscribe", json!({}));
    assert_eq!(code, -32000, "{message}");
    assert!(message.contains("--approver-uid"), "{message}");
    // nobody is: it approves root's command.
    let mut person = d.client_in_other_process_as(Some(65534));
    subscribe(&mut person);
    let mut c = d.client();
    let id = exec(&mut c, "s", "true");
    let req = next_request(&mut person);
    answer(&mut person, &req, "approve");
    let r = c.wait_response(id).expect("approved");
    // Started: an async answer says how it stands when the spawn is reported.
    assert!(
        r["status"] == "running" || r["status"] == "completed",
        "{r}"
    );
}

#[test]
fn approvers_see_the_variables_and_the_end_of_a_long_line() {
    let d = daemon(&[]);
    let mut a = d.client_in_other_process();
    subscribe(&mut a);
    let mut c = d.client();
    // A variable that changes what bash runs, on an otherwise allowed command.
    let id = c
        .send(
            "bash/exec",
            json!({"command": "curl --version", "env": {"BASH_ENV": "evil.sh"}, "async_mode": true}),
        )
        .expect("send");
    let req = next_request(&mut a);
    let display = req["params"]["payload"]["display"].to_string();
    assert!(display.contains("sets BASH_ENV=evil.sh"), "{display}");
    assert!(display.contains("unparsed"), "{display}");
    answer(&mut a, &req, "reject");
    assert!(c.wait_response(id).is_err());
    // A 17 KB comment before a trailing command: the end is shown.
    let v = victim(&d, "v1");
    let line = format!("true #{}\nrm -rf {}", "x".repeat(17 << 10), v.display());
    let id = exec(&mut c, "s", &line);
    let req = next_request(&mut a);
    let payload = &req["params"]["payload"];
    let description = payload["description"].as_str().expect("description");
    assert!(
        description.ends_with(&format!("rm -rf {}", v.display())),
        "{}",
        &description[description.len().saturating_sub(80)..]
    );
    assert!(description.contains("bytes left out"));
    assert!(
        payload["display"].to_string().contains("[rule rm (ask)]"),
        "{}",
        payload["display"]
    );
    answer(&mut a, &req, "reject");
    assert!(c.wait_response(id).is_err());
    assert!(v.exists(), "rejected: nothing ran");
}

#[test]
fn a_session_approval_covers_its_rules_only_and_never_an_unparsed_line() {
    let d = daemon(&[]);
    let mut a = d.client_in_other_process();
    subscribe(&mut a);
    let mut c = d.client();
    let id = exec(&mut c, "s", "true");
    let req = next_request(&mut a);
    answer(&mut a, &req, "approve_for_session");
    c.wait_response(id).expect("approved");
    // `true` again goes through at once; with `rm` beside it, it is asked about again.
    ok(
        &mut c,
        "bash/exec",
        json!({"command": "true", "session_id": "s", "async_mode": true}),
    );
    let v = victim(&d, "v2");
    let id = exec(&mut c, "s", &format!("true; rm -rf {}", v.display()));
    let req = next_request(&mut a);
    assert!(req["params"]["payload"]["description"]
        .as_str()
        .is_some_and(|s| s.contains("rm -rf")));
    answer(&mut a, &req, "reject");
    assert!(c.wait_response(id).is_err());
    assert!(v.exists());
    // An unparsed line approved "for the session" is approved once.
    let id = exec(&mut c, "s", "echo $(date)");
    let req = next_request(&mut a);
    answer(&mut a, &req, "approve_for_session");
    c.wait_response(id).expect("approved once");
    let id = exec(&mut c, "s", &format!("x=$(rm -rf {})", v.display()));
    let req = next_request(&mut a);
    answer(&mut a, &req, "reject");
    assert!(c.wait_response(id).is_err());
    assert!(v.exists());
}

#[test]
fn a_second_uid_holds_at_most_half_of_processes_asks_and_clients() {
    if !running_as_root() {
        return skip("needs root to connect as another uid");
    }
    let d = daemon(&[
        "--allow-uid",
        "65534",
        "--max-processes",
        "4",
        "--max-pending-approvals",
        "4",
        "--max-clients",
        "8",
    ]);
    let mut nobody = d.client_in_other_process_as(Some(65534));
    let mut root = d.client();
    // Processes: nobody's two run, a third is refused; root still starts its own.
    for _ in 0..2 {
        ok(
            &mut nobody,
            "terminal/create",
            json!({"sessionId": "n", "command": "sleep", "args": ["30"]}),
        );
    }
    let (code, _, data) = err(
        &mut nobody,
        "terminal/create",
        json!({"sessionId": "n", "command": "sleep", "args": ["30"]}),
    );
    assert_eq!(code, -32003);
    assert_eq!(data.expect("data")["limit"], "max-processes-per-uid");
    ok(
        &mut root,
        "terminal/create",
        json!({"sessionId": "r", "command": "sleep", "args": ["30"]}),
    );
    // Asks: an approver of every uid (root, in another process); nobody's two wait, a
    // third is refused.
    let mut _approver = d.client_in_other_process();
    subscribe(&mut _approver);
    let asks: Vec<u64> = (0..2)
        .map(|i| {
            nobody
                .send(
                    "bash/exec",
                    json!({"command": "true", "session_id": format!("a{i}"), "async_mode": true}),
                )
                .expect("send")
        })
        .collect();
    let (code, _, data) = err(
        &mut nobody,
        "bash/exec",
        json!({"command": "true", "session_id": "a3", "async_mode": true}),
    );
    assert_eq!(code, -32003);
    assert_eq!(
        data.expect("data")["limit"],
        "max-pending-approvals-per-uid"
    );
    drop(asks);
    // Clients: nobody holds half of 8; its fifth connection is refused, root's is not.
    let mut more: Vec<Relayed> = (0..3)
        .map(|_| d.client_in_other_process_as(Some(65534)))
        .collect();
    for r in &mut more {
        ok(r, "terminal/list", json!({}));
    }
    let mut refused = d.client_in_other_process_as(Some(65534));
    let m = refused.read_message(Some(WAIT)).expect("a refusal");
    assert_eq!(m["error"]["code"], -32003, "{m}");
    assert_eq!(m["error"]["data"]["limit"], "max-clients-per-uid", "{m}");
    ok(&mut d.client(), "terminal/list", json!({}));
}

#[test]
fn ids_paths_and_environments_are_bounded() {
    let d = daemon(&[]);
    let mut c = d.client();
    // A megabyte of id, within --max-message (1 MiB) with the rest of the request.
    let mega = "s".repeat(1000 << 10);
    for (method, params, field) in [
        (
            "bash/exec",
            json!({"command": "ls", "session_id": mega}),
            "session_id",
        ),
        (
            "terminal/create",
            json!({"sessionId": mega, "command": "ls"}),
            "sessionId",
        ),
        (
            "terminal/create",
            json!({"sessionId": "s", "command": "ls", "cwd": format!("/{}", "d/".repeat(3000))}),
            "cwd",
        ),
        (
            "terminal/create",
            json!({"sessionId": "s", "command": "ls",
                   "env": [{"name": "BIG", "value": "v".repeat(300 << 10)}]}),
            "env",
        ),
    ] {
        // Sent and read here, not through `err`: a failure must not print the megabyte.
        let id = c.send(method, params).expect("send");
        let (code, data) = match c.wait_response(id) {
            Err(CallError::Rpc { code, data, .. }) => (code, data),
            Ok(_) => panic!("{method} {field}: accepted"),
            Err(e) => panic!(
                "{method} {field}: {}",
                e.to_string().chars().take(200).collect::<String>()
            ),
        };
        assert_eq!(code, -32602, "{method} {field}");
        assert_eq!(data.expect("data")["field"], field);
    }
    let s = ok(&mut c, "bash/sessions", json!({}));
    assert_eq!(s, json!([]), "no session was made of a refused request");
}

#[test]
fn a_listing_of_thousands_of_terminals_pages_within_the_client_buffer() {
    const N: usize = 4096;
    let d = Daemon::start(&["--client-buffer", "256K", "--max-retained", "8192"]);
    let mut c = d.client();
    // Long command lines: each entry is some 4 KiB once cut.
    let long: Vec<String> = (0..8).map(|i| format!("{i}{}", "a".repeat(1000))).collect();
    let mut sent = 0;
    while sent < N {
        // 64 creates of some 8 KiB each: a batch line within --max-message.
        let batch: Vec<Value> = (sent..(sent + 64).min(N))
            .map(|i| {
                json!({"jsonrpc": "2.0", "id": i, "method": "terminal/create",
                    "params": {"sessionId": "many", "command": "true", "args": long}})
            })
            .collect();
        c.send_line(Value::Array(batch.clone()).to_string().as_bytes())
            .expect("send a batch");
        let m = c.read_message(Some(WAIT)).expect("the batch's answers");
        let answers = m.as_array().expect("an array");
        assert_eq!(answers.len(), batch.len());
        assert!(
            answers
                .iter()
                .all(|a| a["result"]["terminalId"].is_string()),
            "{m}"
        );
        sent += batch.len();
    }
    // Each page's line stays within the client buffer; the cursors cover them all.
    let mut raw = d.client();
    let mut seen = 0;
    let mut cursor: Option<String> = None;
    let mut pages = 0;
    loop {
        let mut params = json!({"sessionId": "many", "limit": 4096});
        if let Some(cur) = &cursor {
            params["cursor"] = json!(cur);
        }
        raw.send_line(
            request(pages + 1, "terminal/list", params)
                .to_string()
                .as_bytes(),
        )
        .expect("list");
        let mut line = Vec::new();
        std::io::BufRead::read_until(raw.raw_reader(), b'\n', &mut line).expect("a page");
        assert!(line.len() <= 256 << 10, "a page of {} bytes", line.len());
        let m: Value = serde_json::from_slice(&line).expect("JSON");
        let terminals = m["result"]["terminals"].as_array().expect("terminals");
        seen += terminals.len();
        pages += 1;
        match m["result"]["nextCursor"].as_str() {
            Some(next) => cursor = Some(next.to_string()),
            None => break,
        }
    }
    assert_eq!(seen, N);
    assert!(pages > 1, "one page would have passed the buffer");
}

/// A free TCP port on the loopback address (bound, then let go).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

#[test]
fn tcp_peers_without_the_token_cost_no_more_than_their_heads() {
    let dir = TempDir::new();
    let token = dir.path().join("token");
    {
        use std::os::unix::fs::OpenOptionsExt;
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&token)
            .expect("token");
        f.write_all(b"0123456789abcdef").expect("token");
    }
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let socket = dir.path().join("execd.sock");
    let me = std::process::Command::new("id")
        .arg("-un")
        .output()
        .expect("id -un");
    let me = String::from_utf8_lossy(&me.stdout).trim().to_string();
    let token_arg = token.display().to_string();
    let d = Daemon::start_at(
        dir,
        socket,
        &[
            "--http-listen",
            &addr,
            "--http-token-file",
            &token_arg,
            "--http-run-as",
            &me,
        ],
    );
    wait_until("the TCP listener accepts", || {
        std::net::TcpStream::connect(&addr).is_ok()
    });
    let before = d.rss_kb();
    // 300 peers, each announcing a 1 MiB body and sending 256 KiB of it.
    let body = vec![b'x'; 256 << 10];
    let mut conns = Vec::new();
    for _ in 0..300 {
        let mut s = std::net::TcpStream::connect(&addr).expect("connect");
        s.set_write_timeout(Some(Duration::from_secs(5)))
            .expect("timeout");
        s.set_read_timeout(Some(WAIT)).expect("timeout");
        let head = "POST /v1/bash/exec HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1048576\r\n\r\n";
        s.write_all(head.as_bytes()).expect("head");
        // The daemon may close once it has refused the head: then writing fails.
        let _ = s.write_all(&body);
        conns.push(s);
    }
    for s in &mut conns {
        let mut answer = Vec::new();
        let _ = s.read_to_end(&mut answer);
        let text = String::from_utf8_lossy(&answer);
        assert!(text.starts_with("HTTP/1.1 401 "), "{text}");
    }
    let grown = d.rss_kb().saturating_sub(before);
    // The bodies together are 75 MiB; heads cost next to nothing.
    assert!(grown < 32 << 10, "the daemon grew by {grown} KiB");
    assert_no_panic(&d);
}
