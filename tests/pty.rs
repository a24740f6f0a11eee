//! A PTY per command (PROTOCOL.md section 12.1): the command sees a terminal of the size
//! asked for as its stdin, stdout, stderr and controlling terminal; text replies show the
//! plain text a terminal would, subscribers in base64 get the raw bytes; input, Ctrl-C,
//! Ctrl-D and resizes go through the terminal; the screen is a terminal emulator's.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use crate::util::*;
use execd::base64_decode;

/// Starts `line` in bash session `session` with a terminal (`size` if given), async.
fn tty_exec(c: &mut Client, session: &str, line: &str, size: Option<(u16, u16)>) -> Value {
    let mut p = json!({"command": line, "session_id": session, "tty": true, "async_mode": true});
    if let Some((rows, cols)) = size {
        p["size"] = json!({"rows": rows, "cols": cols});
    }
    ok(c, "bash/exec", p)
}

/// Waits for the newest command of `session` to end; its `bash/output` from offset 0.
fn finished(c: &mut Client, session: &str) -> Value {
    let mut out = Value::Null;
    wait_until("the command ends", || {
        out = ok(c, "bash/output", json!({"session_id": session}));
        out["command"]["status"] != "running"
    });
    out
}

/// Polls `bash/output` of `session` until its stdout contains `needle`.
fn wait_for_text(c: &mut Client, session: &str, needle: &str) -> Value {
    let mut out = Value::Null;
    wait_until(&format!("{needle:?} in the output"), || {
        out = ok(c, "bash/output", json!({"session_id": session}));
        out["stdout"].as_str().is_some_and(|s| s.contains(needle))
    });
    out
}

#[test]
fn a_pty_command_has_a_terminal_of_the_size_asked_for_as_its_controlling_terminal() {
    let d = Daemon::start(&[]);
    let mut c = d.client();
    // Session leader (its sid is its pid) with the terminal as controlling terminal
    // (tty_nr, field 7 of stat, is not 0), and the terminal on 0, 1 and 2.
    let probe = "for fd in 0 1 2; do test -t $fd && echo tty$fd; done; stty size; \
                 echo TERM=$TERM; read -r _ _ _ _ sid _ tty_nr _ < /proc/$$/stat; \
                 [ \"$sid\" = $$ ] && echo leader; [ \"$tty_nr\" != 0 ] && echo ctty";
    tty_exec(&mut c, "a", probe, Some((30, 100)));
    let out = finished(&mut c, "a");
    assert_eq!(
        out["stdout"],
        "tty0\ntty1\ntty2\n30 100\nTERM=xterm-256color\nleader\nctty\n"
    );
    assert_eq!(out["stderr"], "");
    assert_eq!(out["command"]["tty"], json!({"rows": 30, "cols": 100}));
    // 24 x 80 when no size is given; a TERM the request sets is kept.
    ok(
        &mut c,
        "bash/exec",
        json!({"command": "stty size; echo $TERM", "session_id": "b", "tty": true,
               "env": {"TERM": "vt100"}}),
    );
    assert_eq!(finished(&mut c, "b")["stdout"], "24 80\nvt100\n");
    // The same through terminal/create's _meta.
    let id = create_with(
        &mut c,
        json!({"sessionId": "s", "command": "stty", "args": ["size"],
               "_meta": {"execd": {"tty": true, "size": {"rows": 7, "cols": 9}}}}),
    );
    wait_exit(&mut c, &id);
    let out = output(&mut c, &id);
    assert_eq!(out["output"], "7 9\n");
    assert_eq!(out["_meta"]["execd"]["tty"], json!({"rows": 7, "cols": 9}));
    let listed = terminal_entry(&mut c, &id);
    assert_eq!(
        listed["_meta"]["execd"]["tty"],
        json!({"rows": 7, "cols": 9})
    );
}

#[test]
fn text_replies_show_plain_text_while_base64_subscribers_get_the_raw_bytes() {
    let d = Daemon::start(&[]);
    let mut c = d.client();
    let raw = "\x1b[1;32mgreen\x1b[0m plain\r\n 10%\r 50%\r100%\r\ndone";
    let line = "printf '\\033[1;32mgreen\\033[0m plain\\n 10%%\\r 50%%\\r100%%\\ndone'";
    let r = ok(
        &mut c,
        "bash/exec",
        json!({"command": line, "session_id": "p", "tty": true, "async_mode": true,
               "subscribe": {"lossless": true, "encoding": "base64"}}),
    );
    let id = r["command_id"].as_str().expect("id").to_string();
    let mut bytes = Vec::new();
    let deadline = Instant::now() + WAIT;
    loop {
        assert!(Instant::now() < deadline, "no Exit");
        let m = c.next_notification(Some(WAIT)).expect("an event");
        let p = &m["params"]["payload"];
        if p["id"] != id.as_str() {
            continue;
        }
        match m["params"]["type"].as_str() {
            Some("Output") => {
                assert_eq!(p["encoding"], "base64");
                assert_eq!(p["offset"], bytes.len() as u64);
                bytes.extend(base64_decode(p["data"].as_str().expect("data")).expect("b64"));
            }
            Some("Exit") => break,
            other => panic!("unexpected event {other:?}"),
        }
    }
    // The line discipline turned each \n into \r\n; nothing else touched the bytes.
    assert_eq!(String::from_utf8_lossy(&bytes), raw);
    let out = finished(&mut c, "p");
    assert_eq!(out["stdout"], "green plain\n100%\ndone");
    assert_eq!(
        out["offset"],
        raw.len() as u64,
        "offsets stay raw byte offsets"
    );
    // A window that starts inside the colour sequence starts after it.
    let from_inside = ok(
        &mut c,
        "bash/output",
        json!({"session_id": "p", "offset": 3}),
    );
    assert_eq!(from_inside["stdout"], "green plain\n100%\ndone");
}

#[test]
fn output_written_just_before_exit_is_all_there() {
    let d = Daemon::start(&[]);
    let mut c = d.client();
    // 100,000 bytes (no newline, so the terminal adds nothing), then exit at once.
    let id = create_with(
        &mut c,
        json!({"sessionId": "s", "command": "head -c 100000 /dev/zero | tr '\\0' x",
               "_meta": {"execd": {"tty": true}}}),
    );
    wait_exit(&mut c, &id);
    let out = output(&mut c, &id);
    assert_eq!(out["_meta"]["execd"]["end"], 100_000);
    let text = out["output"].as_str().expect("output");
    assert_eq!(text.len(), 100_000);
    assert!(text.bytes().all(|b| b == b'x'));
}

#[test]
fn input_ctrl_c_ctrl_d_and_resize_go_through_the_terminal() {
    let d = Daemon::start(&[]);
    let mut c = d.client();
    // A line read from the terminal (echoed, as a terminal does).
    tty_exec(&mut c, "r", "read -r x; echo got:$x", None);
    ok(
        &mut c,
        "bash/write",
        json!({"session_id": "r", "input": "hello\n"}),
    );
    let out = finished(&mut c, "r");
    assert_eq!(out["stdout"], "hello\ngot:hello\n");
    assert_eq!(out["command"]["exit_code"], 0);

    // Ctrl-C: the line discipline sends SIGINT to the foreground job.
    tty_exec(&mut c, "i", "exec sleep 30", None);
    wait_until("sleep runs", || {
        let o = ok(&mut c, "bash/output", json!({"session_id": "i"}));
        o["command"]["status"] == "running"
    });
    std::thread::sleep(Duration::from_millis(100));
    ok(
        &mut c,
        "bash/write",
        json!({"session_id": "i", "input": "\u{3}"}),
    );
    let out = finished(&mut c, "i");
    assert_eq!(out["command"]["signal"], "SIGINT", "{}", out["command"]);
    assert_eq!(out["command"]["exit_code"], Value::Null);
    assert_eq!(out["command"]["status"], "completed");

    // eof: Ctrl-D after the input ends cat.
    tty_exec(&mut c, "e", "cat", None);
    ok(
        &mut c,
        "bash/write",
        json!({"session_id": "e", "input": "abc\n", "eof": true}),
    );
    let out = finished(&mut c, "e");
    assert_eq!(out["stdout"], "abc\nabc\n");
    assert_eq!(out["command"]["exit_code"], 0);

    // Resize: stty sees it, and the foreground job gets SIGWINCH.
    tty_exec(
        &mut c,
        "w",
        "trap 'echo winch; stty size' WINCH; echo ready; while :; do sleep 0.05; done",
        None,
    );
    wait_for_text(&mut c, "w", "ready");
    ok(
        &mut c,
        "bash/resize",
        json!({"session_id": "w", "rows": 40, "cols": 120}),
    );
    wait_for_text(&mut c, "w", "winch\n40 120\n");
    ok(
        &mut c,
        "bash/kill",
        json!({"session_id": "w", "signal": "SIGKILL"}),
    );

    // terminal/resize for a terminal.
    let id = create_with(
        &mut c,
        json!({"sessionId": "s", "command": "sh", "args": ["-c", "read x; stty size"],
               "_meta": {"execd": {"tty": true}}}),
    );
    ok(
        &mut c,
        "terminal/resize",
        json!({"sessionId": "s", "terminalId": id, "rows": 5, "cols": 6}),
    );
    ok(
        &mut c,
        "terminal/write",
        json!({"sessionId": "s", "terminalId": id, "input": "\n"}),
    );
    wait_exit(&mut c, &id);
    assert_eq!(output(&mut c, &id)["output"], "\n5 6\n");
}

#[test]
fn bad_sizes_and_resizing_a_pipe_command_are_invalid_params() {
    let d = Daemon::start(&[]);
    let mut c = d.client();
    for size in [
        json!({"rows": 0, "cols": 80}),
        json!({"rows": 24, "cols": 1001}),
        json!({"rows": 24}),
        json!({"rows": "24", "cols": 80}),
    ] {
        let (code, _, data) = err(
            &mut c,
            "bash/exec",
            json!({"command": "true", "tty": true, "size": size}),
        );
        assert_eq!(code, -32602, "{size}");
        assert_eq!(data.expect("data")["field"], "size");
    }
    // A size without a terminal is a mistake, not ignored.
    let (code, _, _) = err(
        &mut c,
        "bash/exec",
        json!({"command": "true", "size": {"rows": 5, "cols": 5}}),
    );
    assert_eq!(code, -32602);
    ok(
        &mut c,
        "bash/exec",
        json!({"command": "sleep 30", "session_id": "p", "async_mode": true}),
    );
    let (code, _, data) = err(
        &mut c,
        "bash/resize",
        json!({"session_id": "p", "rows": 10, "cols": 10}),
    );
    assert_eq!(code, -32602);
    assert_eq!(data.expect("data")["field"], "tty");
    tty_exec(&mut c, "t", "sleep 30", None);
    let (code, _, data) = err(
        &mut c,
        "bash/resize",
        json!({"session_id": "t", "rows": 1001, "cols": 10}),
    );
    assert_eq!(code, -32602);
    assert_eq!(data.expect("data")["field"], "rows");
    // The screen of a pipe command: nothing to show.
    let (code, _, data) = err(
        &mut c,
        "bash/output",
        json!({"session_id": "p", "screen": true}),
    );
    assert_eq!(code, -32602);
    assert_eq!(data.expect("data")["field"], "screen");
}

#[test]
fn the_screen_is_a_terminal_emulator_s_with_its_cursor_and_alternate_screen() {
    let d = Daemon::start(&[]);
    let mut c = d.client();
    tty_exec(
        &mut c,
        "s",
        "printf '\\033[2J\\033[5;10HXY'; read x; printf '\\033[?1049h\\033[Hfull'; read x",
        None,
    );
    let mut screen = Value::Null;
    wait_until("XY is drawn", || {
        screen = ok(
            &mut c,
            "bash/output",
            json!({"session_id": "s", "screen": true}),
        )["screen"]
            .clone();
        screen["lines"][4] == "         XY"
    });
    // Row 5, column 10 in terminal terms is row 4, col 9 in the API, which counts from 0.
    assert_eq!(
        (screen["rows"].clone(), screen["cols"].clone()),
        (json!(24), json!(80))
    );
    assert_eq!(screen["cursor"], json!({"row": 4, "col": 11}));
    assert_eq!(screen["alternate"], false);
    ok(
        &mut c,
        "bash/write",
        json!({"session_id": "s", "input": "\n"}),
    );
    wait_until("the alternate screen", || {
        screen = ok(
            &mut c,
            "bash/output",
            json!({"session_id": "s", "screen": true}),
        )["screen"]
            .clone();
        screen["alternate"] == true
    });
    assert_eq!(screen["lines"][0], "full");
    // A resize reaches the screen too.
    ok(
        &mut c,
        "bash/resize",
        json!({"session_id": "s", "rows": 10, "cols": 20}),
    );
    let screen = ok(
        &mut c,
        "bash/output",
        json!({"session_id": "s", "screen": true}),
    )["screen"]
        .clone();
    assert_eq!(screen["rows"], 10);
    assert_eq!(screen["lines"].as_array().map(Vec::len), Some(10));
    // terminal/output's screen sits under _meta.execd.
    let id = create_with(
        &mut c,
        json!({"sessionId": "s", "command": "printf", "args": ["\\033[3;3Hz"],
               "_meta": {"execd": {"tty": true}}}),
    );
    wait_exit(&mut c, &id);
    let out = ok(
        &mut c,
        "terminal/output",
        json!({"sessionId": "s", "terminalId": id, "_meta": {"execd": {"screen": true}}}),
    );
    assert_eq!(out["_meta"]["execd"]["screen"]["lines"][2], "  z");
    assert_eq!(out["output"], "z", "the plain text has no cursor moves");
}

#[test]
fn http_clients_ask_for_a_terminal_with_the_same_fields() {
    let d = Daemon::start(&[]);
    let body = json!({"command": "stty size; test -t 1 && echo tty", "tty": true,
                      "size": {"rows": 12, "cols": 34}})
    .to_string();
    let mut s = UnixStream::connect(&d.socket).expect("connect");
    s.set_read_timeout(Some(WAIT)).expect("timeout");
    write!(
        s,
        "POST /v1/bash/exec HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .expect("write");
    let mut reply = String::new();
    s.read_to_string(&mut reply).expect("read");
    let json_start = reply.find("\r\n\r\n").expect("a head") + 4;
    let v: Value = serde_json::from_str(&reply[json_start..]).expect("JSON body");
    assert_eq!(v["data"]["stdout"], "12 34\ntty\n", "{v}");
}
