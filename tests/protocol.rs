//! Framing and JSON-RPC 2.0 against the real daemon, with raw lines (PROTOCOL.md section 2):
//! message size limits, error codes and their `data`, ids, notifications, batches,
//! out-of-order answers, line endings, `null` and unknown fields.

use crate::util::*;

/// Sends one raw line.
#[track_caller]
fn send_raw(c: &mut Client, line: &str) {
    c.send_line(line.as_bytes()).expect("send line");
}

/// Reads the next raw message (response or array).
#[track_caller]
fn next(c: &mut Client) -> Value {
    c.read_message(Some(WAIT)).expect("read a message")
}

/// Checks that `m` is an error response with `code` and `id`; returns its `data`.
#[track_caller]
fn expect_error(m: &Value, code: i64, id: Value) -> Value {
    assert_eq!(m["jsonrpc"], "2.0", "{m}");
    assert_eq!(m["id"], id, "{m}");
    assert!(m.get("result").is_none(), "{m}");
    assert_eq!(m["error"]["code"], code, "{m}");
    assert!(m["error"]["message"].is_string(), "{m}");
    m["error"].get("data").cloned().unwrap_or(Value::Null)
}

/// Checks the connection still answers a normal request.
#[track_caller]
fn still_works(c: &mut Client, id: u64) {
    send_raw(c, &request(id, "terminal/list", json!({})));
    let m = next(c);
    assert_eq!(m["id"], id, "{m}");
    assert!(m["result"]["terminals"].is_array(), "{m}");
}

/// A request line of exactly `len` bytes (padding in an ignored param).
fn padded_request(id: u64, len: usize) -> String {
    let head =
        format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"terminal/list","params":{{"pad":""#);
    let tail = r#""}}"#;
    let pad = len - head.len() - tail.len();
    let line = format!("{head}{}{tail}", "x".repeat(pad));
    assert_eq!(line.len(), len);
    line
}

#[test]
fn a_2_mib_line_is_refused_and_the_connection_stays_usable() {
    let d = Daemon::start(&[]);
    let mut c = d.client();
    let line = padded_request(1, 2 << 20);
    send_raw(&mut c, &line);
    let data = expect_error(&next(&mut c), -32600, Value::Null);
    assert_eq!(data, json!({"limit": 1048576}));
    still_works(&mut c, 2);

    // Exactly at the limit is accepted.
    send_raw(&mut c, &padded_request(3, 1 << 20));
    let m = next(&mut c);
    assert_eq!(m["id"], 3, "a line of exactly 1 MiB is fine");
    assert!(m["result"].is_object(), "{m}");

    // Two in a row and a normal request, in one write: each is answered, in order.
    let big = padded_request(4, (1 << 20) + 1);
    let small = request(5, "terminal/list", json!({}));
    send_raw(&mut c, &format!("{big}\n{big}\n{small}"));
    for _ in 0..2 {
        let data = expect_error(&next(&mut c), -32600, Value::Null);
        assert_eq!(data, json!({"limit": 1048576}));
    }
    let m = next(&mut c);
    assert_eq!(m["id"], 5, "{m}");
    assert!(m["result"].is_object(), "{m}");
    still_works(&mut c, 6);
}

#[test]
fn max_message_flag_is_honoured() {
    let d = Daemon::start(&["--max-message", "1000"]);
    let mut c = d.client();
    send_raw(&mut c, &padded_request(1, 1001));
    let data = expect_error(&next(&mut c), -32600, Value::Null);
    assert_eq!(data, json!({"limit": 1000}));
    still_works(&mut c, 2);
    send_raw(&mut c, &padded_request(3, 1000));
    let m = next(&mut c);
    assert_eq!(m["id"], 3, "{m}");
    assert!(m["result"].is_object(), "{m}");
    send_raw(&mut c, &padded_request(4, 5000));
    let data = expect_error(&next(&mut c), -32600, Value::Null);
    assert_eq!(data, json!({"limit": 1000}));
    still_works(&mut c, 5);
}

#[test]
fn error_codes_for_bad_messages() {
    let d = Daemon::start(&[]);
    let mut c = d.client();

    // Not JSON.
    for bad in ["{nope", "{\"jsonrpc\":\"2.0\",\"id\":1,", "]", "\u{7f}"] {
        send_raw(&mut c, bad);
        expect_error(&next(&mut c), -32700, Value::Null);
    }
    still_works(&mut c, 100);

    // Not a JSON-RPC 2.0 request.
    send_raw(
        &mut c,
        r#"{"jsonrpc":"1.0","id":1,"method":"terminal/list"}"#,
    );
    expect_error(&next(&mut c), -32600, json!(1));
    send_raw(&mut c, r#"{"id":2,"method":"terminal/list"}"#);
    expect_error(&next(&mut c), -32600, json!(2));
    send_raw(&mut c, r#"{"jsonrpc":2.0,"id":3,"method":"terminal/list"}"#);
    expect_error(&next(&mut c), -32600, json!(3));
    send_raw(&mut c, r#"{"jsonrpc":"2.0","id":4,"method":7}"#);
    expect_error(&next(&mut c), -32600, json!(4));
    for params in ["\"x\"", "5", "true"] {
        send_raw(
            &mut c,
            &format!(r#"{{"jsonrpc":"2.0","id":5,"method":"terminal/list","params":{params}}}"#),
        );
        expect_error(&next(&mut c), -32600, json!(5));
    }
    // By position (an array) is a JSON-RPC 2.0 form execd does not take: invalid params.
    for params in ["[]", "[1,2]"] {
        send_raw(
            &mut c,
            &format!(r#"{{"jsonrpc":"2.0","id":5,"method":"terminal/list","params":{params}}}"#),
        );
        let m = next(&mut c);
        expect_error(&m, -32602, json!(5));
        assert_eq!(m["error"]["data"]["field"], "params", "{m}");
    }
    send_raw(&mut c, "42");
    expect_error(&next(&mut c), -32600, Value::Null);

    // Unknown method.
    send_raw(&mut c, &request(6, "terminal/nope", json!({})));
    expect_error(&next(&mut c), -32601, json!(6));
    send_raw(&mut c, &request(7, "", json!({})));
    expect_error(&next(&mut c), -32601, json!(7));
    still_works(&mut c, 101);
}

#[test]
fn invalid_params_name_the_field() {
    let d = Daemon::start(&[]);
    let mut c = d.client();
    let cases = [
        (
            "terminal/create",
            json!({"sessionId": "s", "command": 5}),
            "command",
        ),
        (
            "terminal/create",
            json!({"sessionId": 5, "command": "true"}),
            "sessionId",
        ),
        ("terminal/create", json!({"command": "true"}), "sessionId"),
        ("terminal/create", json!({"sessionId": "s"}), "command"),
        (
            "terminal/create",
            json!({"sessionId": "s", "command": "true", "args": "x"}),
            "args",
        ),
        (
            "terminal/create",
            json!({"sessionId": "s", "command": "true", "args": [1]}),
            "args",
        ),
        (
            "terminal/create",
            json!({"sessionId": "s", "command": "true", "env": {"A": "b"}}),
            "env",
        ),
        (
            "terminal/create",
            json!({"sessionId": "s", "command": "true", "env": [{"name": "A"}]}),
            "env",
        ),
        (
            "terminal/create",
            json!({"sessionId": "s", "command": "true", "cwd": 5}),
            "cwd",
        ),
        (
            "terminal/create",
            json!({"sessionId": "s", "command": "true", "outputByteLimit": "big"}),
            "outputByteLimit",
        ),
        (
            "terminal/create",
            json!({"sessionId": "s", "command": "true", "outputByteLimit": -1}),
            "outputByteLimit",
        ),
        ("terminal/output", json!({"sessionId": "s"}), "terminalId"),
        (
            "terminal/output",
            json!({"sessionId": "s", "terminalId": 7}),
            "terminalId",
        ),
        (
            "terminal/wait_for_exit",
            json!({"terminalId": "x"}),
            "sessionId",
        ),
        (
            "terminal/kill",
            json!({"sessionId": "s", "terminalId": []}),
            "terminalId",
        ),
        (
            "terminal/release",
            json!({"sessionId": {}, "terminalId": "x"}),
            "sessionId",
        ),
        ("terminal/list", json!({"sessionId": 1}), "sessionId"),
    ];
    for (n, (method, params, field)) in cases.into_iter().enumerate() {
        send_raw(&mut c, &request(n as u64, method, params.clone()));
        let data = expect_error(&next(&mut c), -32602, json!(n));
        assert_eq!(data["field"], field, "{method} {params}: {data}");
        assert!(
            data["reason"].as_str().is_some_and(|r| !r.is_empty()),
            "{method} {params}: a reason is given: {data}"
        );
    }
    // Absent params entirely: the required field is named.
    send_raw(
        &mut c,
        r#"{"jsonrpc":"2.0","id":"p","method":"terminal/create"}"#,
    );
    let data = expect_error(&next(&mut c), -32602, json!("p"));
    assert_eq!(data["field"], "sessionId", "{data}");
    // None of them started anything.
    send_raw(&mut c, &request(99, "terminal/list", json!({})));
    let m = next(&mut c);
    assert_eq!(m["result"]["terminals"], json!([]), "{m}");
}

/// Params that do not read because they nest past the limit are reported as exactly
/// that (`-32602` naming `params`), never as the fields they hold being missing; and the
/// connection goes on.
#[test]
fn params_nested_too_deeply_are_reported_as_such() {
    let d = Daemon::start(&[]);
    let mut c = d.client();
    let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
    let line = format!(
        r#"{{"jsonrpc":"2.0","id":1,"method":"terminal/create","params":{{"sessionId":"s","command":"true","env":{deep}}}}}"#
    );
    send_raw(&mut c, &line);
    let m = next(&mut c);
    let data = expect_error(&m, -32602, json!(1));
    assert_eq!(data["field"], "params", "{m}");
    let message = m["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("nested too deeply"), "{m}");
    assert!(!message.contains("sessionId"), "{m}");
    still_works(&mut c, 2);
    assert_no_panic(&d);
}

#[test]
fn ids_are_echoed_with_their_type() {
    let d = Daemon::start(&[]);
    let mut c = d.client();
    for id in [
        json!("abc"),
        json!("7"),
        json!(7),
        json!(0),
        json!(-3),
        json!(""),
        json!(9007199254740993u64),
        json!("ü €"),
    ] {
        let line = json!({"jsonrpc": "2.0", "id": id, "method": "terminal/list"}).to_string();
        send_raw(&mut c, &line);
        let m = next(&mut c);
        assert_eq!(m["id"], id, "id {id} echoed exactly: {m}");
        assert_eq!(m["jsonrpc"], "2.0");
        assert!(m["result"].is_object(), "{m}");
    }
    // An explicit null id is a request (not a notification) and is answered with null.
    send_raw(
        &mut c,
        r#"{"jsonrpc":"2.0","id":null,"method":"terminal/list"}"#,
    );
    let m = next(&mut c);
    assert_eq!(m["id"], Value::Null, "{m}");
    assert!(m["result"].is_object(), "{m}");
    // The id of a failed request is echoed the same way.
    send_raw(&mut c, r#"{"jsonrpc":"2.0","id":"e1","method":"nope"}"#);
    expect_error(&next(&mut c), -32601, json!("e1"));
    send_raw(&mut c, r#"{"jsonrpc":"2.0","id":12,"method":"nope"}"#);
    expect_error(&next(&mut c), -32601, json!(12));
}

#[test]
fn notifications_are_executed_and_never_answered() {
    let d = Daemon::start(&[]);
    let mut c = d.client();
    let note = json!({"jsonrpc": "2.0", "method": "terminal/create",
                      "params": {"sessionId": "n", "command": "echo", "args": ["from a notification"]}});
    send_raw(&mut c, &note.to_string());
    // Notifications that fail are not answered either.
    send_raw(&mut c, r#"{"jsonrpc":"2.0","method":"no/such/method"}"#);
    send_raw(
        &mut c,
        r#"{"jsonrpc":"2.0","method":"terminal/create","params":{"command":5}}"#,
    );
    send_raw(
        &mut c,
        &request(1, "terminal/list", json!({"sessionId": "n"})),
    );
    let m = next(&mut c);
    assert_eq!(
        m["id"], 1,
        "the next message is the answer to the next request: {m}"
    );
    let terminals = m["result"]["terminals"]
        .as_array()
        .expect("terminals")
        .clone();
    assert_eq!(terminals.len(), 1, "{m}");
    assert_eq!(terminals[0]["command"], "echo");
    let id = terminals[0]["terminalId"]
        .as_str()
        .expect("terminalId")
        .to_string();

    send_raw(
        &mut c,
        &request(
            2,
            "terminal/wait_for_exit",
            json!({"sessionId": "n", "terminalId": id}),
        ),
    );
    let m = next(&mut c);
    assert_eq!(m["id"], 2, "{m}");
    assert_eq!(m["result"]["exitCode"], 0, "{m}");
    send_raw(
        &mut c,
        &request(
            3,
            "terminal/output",
            json!({"sessionId": "n", "terminalId": id}),
        ),
    );
    let m = next(&mut c);
    assert_eq!(m["result"]["output"], "from a notification\n", "{m}");

    // Notifications of methods that would park are carried out too: a kill kills.
    send_raw(
        &mut c,
        &request(
            4,
            "terminal/create",
            json!({"sessionId": "n", "command": "sleep", "args": ["60"]}),
        ),
    );
    let m = next(&mut c);
    let sleeper = m["result"]["terminalId"]
        .as_str()
        .expect("terminalId")
        .to_string();
    let params = json!({"sessionId": "n", "terminalId": sleeper});
    for method in ["terminal/wait_for_exit", "terminal/kill"] {
        let note = json!({"jsonrpc": "2.0", "method": method, "params": params});
        send_raw(&mut c, &note.to_string());
    }
    send_raw(
        &mut c,
        &request(5, "terminal/wait_for_exit", params.clone()),
    );
    let m = next(&mut c);
    assert_eq!(m["id"], 5, "only the request is answered: {m}");
    assert_eq!(
        m["result"],
        json!({"exitCode": null, "signal": "SIGTERM"}),
        "{m}"
    );

    // Nothing else arrives.
    let extra = c.read_message(Some(std::time::Duration::from_millis(300)));
    assert!(extra.is_err(), "unexpected message: {extra:?}");
}

#[test]
fn a_client_that_closes_its_sending_side_still_gets_every_answer() {
    use std::io::{BufRead, BufReader, Write};
    let d = Daemon::start(&[]);
    let dir = TempDir::new();
    let gate = dir.path().join("gate");
    let mut c = d.client();
    let r = ok(
        &mut c,
        "terminal/create",
        json!({"sessionId": "s", "command": "sh",
               "args": ["-c", "while [ ! -e \"$1\" ]; do sleep 0.02; done", "sh", gate]}),
    );
    let id = r["terminalId"].as_str().expect("terminalId").to_string();

    let mut raw = std::os::unix::net::UnixStream::connect(&d.socket).expect("connect");
    raw.set_read_timeout(Some(WAIT)).expect("timeout");
    let params = json!({"sessionId": "s", "terminalId": id});
    let lines = format!(
        "{}\n{}\n",
        request(1, "terminal/wait_for_exit", params.clone()),
        request(2, "terminal/list", json!({})),
    );
    raw.write_all(lines.as_bytes()).expect("write");
    raw.shutdown(std::net::Shutdown::Write).expect("half close");
    let mut reader = BufReader::new(raw);
    let mut read = || {
        let mut line = String::new();
        reader.read_line(&mut line).expect("read");
        line
    };
    let first: Value = serde_json::from_str(&read()).expect("a response");
    assert_eq!(first["id"], 2, "{first}");
    std::fs::write(&gate, b"go").expect("open gate");
    let second: Value = serde_json::from_str(&read()).expect("the parked answer");
    assert_eq!(second["id"], 1, "{second}");
    assert_eq!(second["result"], json!({"exitCode": 0, "signal": null}));
    assert_eq!(read(), "", "then the daemon closes the connection");
}

#[test]
fn batches() {
    let d = Daemon::start(&[]);
    let mut c = d.client();

    // An empty batch.
    send_raw(&mut c, "[]");
    expect_error(&next(&mut c), -32600, Value::Null);

    // Two requests and a notification: one array with exactly the two responses.
    let batch = json!([
        {"jsonrpc": "2.0", "id": "a", "method": "terminal/list", "params": {}},
        {"jsonrpc": "2.0", "method": "terminal/create",
         "params": {"sessionId": "b", "command": "true"}},
        {"jsonrpc": "2.0", "id": 2, "method": "nope"},
    ]);
    send_raw(&mut c, &batch.to_string());
    let m = next(&mut c);
    let items = m.as_array().unwrap_or_else(|| panic!("not an array: {m}"));
    assert_eq!(items.len(), 2, "{m}");
    let by_id = |id: Value| {
        items
            .iter()
            .find(|r| r["id"] == id)
            .unwrap_or_else(|| panic!("no response {id} in {m}"))
    };
    assert!(by_id(json!("a"))["result"]["terminals"].is_array());
    assert_eq!(by_id(json!(2))["error"]["code"], -32601);
    // The notification in it ran.
    send_raw(
        &mut c,
        &request(3, "terminal/list", json!({"sessionId": "b"})),
    );
    let m = next(&mut c);
    assert_eq!(
        m["result"]["terminals"].as_array().map(Vec::len),
        Some(1),
        "{m}"
    );

    // Invalid elements are answered in the array.
    send_raw(
        &mut c,
        r#"[1, {"jsonrpc":"2.0","id":9,"method":"terminal/list"}]"#,
    );
    let m = next(&mut c);
    let items = m.as_array().unwrap_or_else(|| panic!("not an array: {m}"));
    assert_eq!(items.len(), 2, "{m}");
    assert!(
        items
            .iter()
            .any(|r| r["error"]["code"] == -32600 && r["id"].is_null()),
        "{m}"
    );
    assert!(
        items
            .iter()
            .any(|r| r["id"] == 9 && r["result"].is_object()),
        "{m}"
    );

    // A batch of notifications only is not answered at all.
    send_raw(&mut c, r#"[{"jsonrpc":"2.0","method":"terminal/list"}]"#);
    still_works(&mut c, 4);
}

#[test]
fn a_batch_with_a_parked_request_is_answered_once_all_are_done() {
    let d = Daemon::start(&[]);
    let dir = TempDir::new();
    let gate = dir.path().join("gate");
    let mut c = d.client();
    let r = c
        .call(
            "terminal/create",
            json!({"sessionId": "s", "command": "sh",
                   "args": ["-c", "while [ ! -e \"$1\" ]; do sleep 0.02; done; exit 4", "sh", gate]}),
        )
        .expect("create");
    let id = r["terminalId"].as_str().expect("terminalId").to_string();
    let batch = json!([
        {"jsonrpc": "2.0", "id": 1, "method": "terminal/wait_for_exit",
         "params": {"sessionId": "s", "terminalId": id}},
        {"jsonrpc": "2.0", "id": 2, "method": "terminal/output",
         "params": {"sessionId": "s", "terminalId": id}},
    ]);
    send_raw(&mut c, &batch.to_string());
    // A later request on the same connection is not held back by the batch.
    send_raw(&mut c, &request(3, "terminal/list", json!({})));
    let m = next(&mut c);
    assert_eq!(
        m["id"], 3,
        "the single request is answered before the parked batch: {m}"
    );

    std::fs::write(&gate, b"go").expect("open gate");
    let m = next(&mut c);
    let items = m.as_array().unwrap_or_else(|| panic!("not an array: {m}"));
    assert_eq!(items.len(), 2, "{m}");
    let wait = items.iter().find(|r| r["id"] == 1).expect("wait response");
    assert_eq!(
        wait["result"],
        json!({"exitCode": 4, "signal": null}),
        "{m}"
    );
    let out = items
        .iter()
        .find(|r| r["id"] == 2)
        .expect("output response");
    assert_eq!(out["result"]["output"], "", "{m}");
    assert!(
        out["result"].get("exitStatus").is_none(),
        "output ran before the exit: {m}"
    );
}

#[test]
fn responses_are_sent_as_each_request_completes() {
    let d = Daemon::start(&[]);
    let mut c = d.client();
    send_raw(
        &mut c,
        &request(
            1,
            "terminal/create",
            json!({"sessionId": "s", "command": "sleep", "args": ["2"]}),
        ),
    );
    let m = next(&mut c);
    let id = m["result"]["terminalId"]
        .as_str()
        .expect("terminalId")
        .to_string();
    send_raw(
        &mut c,
        &request(
            2,
            "terminal/wait_for_exit",
            json!({"sessionId": "s", "terminalId": id}),
        ),
    );
    send_raw(&mut c, &request(3, "terminal/list", json!({})));
    let first = next(&mut c);
    assert_eq!(first["id"], 3, "the list answer comes first: {first}");
    let second = next(&mut c);
    assert_eq!(second["id"], 2, "{second}");
    assert_eq!(second["result"], json!({"exitCode": 0, "signal": null}));
}

#[test]
fn crlf_and_blank_lines_are_accepted() {
    let d = Daemon::start(&[]);
    let mut c = d.client();
    let lines = format!(
        "\n\r\n   \n\t\n{}\r\n\n\r\n{}\r\n{}\n",
        request(1, "terminal/list", json!({})),
        request(
            2,
            "terminal/create",
            json!({"sessionId": "s", "command": "true"})
        ),
        json!({"jsonrpc": "2.0", "id": 3, "method": "terminal/list", "params": {"sessionId": "s"}}),
    );
    c.send_line(lines.trim_end_matches('\n').as_bytes())
        .expect("send");
    for want in [1, 2, 3] {
        let m = next(&mut c);
        assert_eq!(m["id"], want, "{m}");
        assert!(m["result"].is_object(), "{m}");
    }
    send_raw(&mut c, "");
    send_raw(&mut c, "\r");
    still_works(&mut c, 4);
    // Only the three requests and the check were answered.
    let extra = c.read_message(Some(std::time::Duration::from_millis(300)));
    assert!(extra.is_err(), "blank lines are not answered: {extra:?}");
}

#[test]
fn null_optional_fields_mean_absent() {
    let d = Daemon::start(&[]);
    let mut c = d.client();
    let r = ok(
        &mut c,
        "terminal/create",
        json!({"sessionId": "s", "command": "pwd", "args": null, "env": null, "cwd": null,
               "outputByteLimit": null}),
    );
    let id = r["terminalId"].as_str().expect("terminalId").to_string();
    assert_eq!(
        wait_exit(&mut c, &id),
        json!({"exitCode": 0, "signal": null})
    );
    let out = output(&mut c, &id);
    let here = std::env::current_dir().expect("cwd");
    assert_eq!(
        out["output"].as_str().map(|s| s.trim_end().to_string()),
        Some(
            std::fs::canonicalize(here)
                .expect("canonical")
                .display()
                .to_string()
        ),
        "cwd null means the daemon's working directory"
    );
    assert_eq!(out["truncated"], false);
    let r = ok(&mut c, "terminal/list", json!({"sessionId": null}));
    assert_eq!(r["terminals"].as_array().map(Vec::len), Some(1), "{r}");
    // params: null is no params.
    send_raw(
        &mut c,
        r#"{"jsonrpc":"2.0","id":"x","method":"terminal/list","params":null}"#,
    );
    let m = next(&mut c);
    assert_eq!(m["id"], "x");
    assert!(m["result"]["terminals"].is_array(), "{m}");
    // A required field given as null is missing.
    let (code, _, data) = err(
        &mut c,
        "terminal/create",
        json!({"sessionId": "s", "command": null}),
    );
    assert_eq!(code, -32602);
    assert_eq!(data.expect("data")["field"], "command");
}

#[test]
fn unknown_fields_are_ignored() {
    let d = Daemon::start(&[]);
    let mut c = d.client();
    let r = ok(
        &mut c,
        "terminal/create",
        json!({"sessionId": "s", "command": "echo", "args": ["x"], "bogus": {"deep": [1, 2]},
               "_meta": {"anything": true}, "outputbytelimit": "not a number"}),
    );
    let id = r["terminalId"].as_str().expect("terminalId").to_string();
    let r = ok(
        &mut c,
        "terminal/wait_for_exit",
        json!({"sessionId": "s", "terminalId": id, "extra": 1}),
    );
    assert_eq!(r, json!({"exitCode": 0, "signal": null}));
    let r = ok(
        &mut c,
        "terminal/output",
        json!({"sessionId": "s", "terminalId": id, "extra": null}),
    );
    assert_eq!(r["output"], "x\n");
    // Unknown top-level members of the request are ignored too.
    send_raw(
        &mut c,
        r#"{"jsonrpc":"2.0","id":5,"method":"terminal/list","params":{},"extra":"ignored"}"#,
    );
    let m = next(&mut c);
    assert_eq!(m["id"], 5, "{m}");
    assert!(m["result"]["terminals"].is_array(), "{m}");
}

/// A NUL byte in `cwd` or `exec_dir` is `-32602` naming the field (no path can hold one),
/// not a failed spawn naming the program.
#[test]
fn a_nul_byte_in_a_directory_is_invalid_params_naming_the_field() {
    let d = Daemon::start(&[]);
    let mut c = d.client();
    for (method, params, field) in [
        (
            "terminal/create",
            json!({"sessionId": "s", "command": "true", "cwd": "/tmp\u{0}x"}),
            "cwd",
        ),
        (
            "bash/exec",
            json!({"command": "true", "exec_dir": "/tmp\u{0}x"}),
            "exec_dir",
        ),
        (
            "shell/exec",
            json!({"command": "true", "exec_dir": "/tmp\u{0}x"}),
            "exec_dir",
        ),
    ] {
        let (code, _, data) = err(&mut c, method, params);
        assert_eq!(code, -32602, "{method}");
        assert_eq!(data.expect("data")["field"], field, "{method}");
    }
    assert_no_panic(&d);
}

/// `--log-level` keeps the lines of its level and those before it: `warn` keeps the
/// refusals and drops each command's start; `debug` adds releases.
#[test]
fn the_log_level_says_how_much_is_logged() {
    for (level, started, released, refused) in [
        ("warn", false, false, true),
        ("info", true, false, true),
        ("debug", true, true, true),
    ] {
        let d = Daemon::start(&["--log-level", level]);
        let mut c = d.client();
        let t = create(&mut c, "true", &[]);
        wait_exit(&mut c, &t);
        ok(
            &mut c,
            "terminal/release",
            json!({"sessionId": "s", "terminalId": t}),
        );
        let (code, _, _) = err(
            &mut c,
            "terminal/create",
            json!({"sessionId": "s", "command": "/nonexistent/x"}),
        );
        assert_eq!(code, -32004);
        wait_until("the refusal is logged", || {
            !refused || d.log().contains("could not start")
        });
        let log = d.log();
        assert_eq!(
            log.contains(&format!("{t} started")),
            started,
            "{level}: {log}"
        );
        assert_eq!(
            log.contains(&format!("{t} released")),
            released,
            "{level}: {log}"
        );
        assert_eq!(
            log.contains("listening on"),
            level != "warn",
            "{level}: {log}"
        );
    }
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_execd"))
        .args(["--log-level", "loud"])
        .output()
        .expect("run execd");
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("error, warn, info, debug"));
}
