//! Exact, back-pressured output and client-fed stdin (PROTOCOL.md section 6 and execd's
//! extensions): lossless and base64 subscriptions, subscriptions made at creation,
//! `terminal/write`, `terminal/kill` with a signal, and spawn failures that say why.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::time::{Duration, Instant};

use crate::util::*;
use execd::{base64_decode, base64_encode};

const MIB: usize = 1 << 20;

/// What one subscription delivered, stream by stream.
#[derive(Default, Debug)]
struct Got {
    bytes: HashMap<String, Vec<u8>>,
    gaps: u64,
    exit: Option<Value>,
}

/// Reads the events of `id` until its `Exit`, decoding base64 data, checking that every
/// chunk starts where the stream's bytes and gaps so far end. `pause` slows the reader.
#[track_caller]
fn collect(c: &mut Client, id: &str, pause: Option<Duration>) -> Got {
    let mut got = Got::default();
    let mut next: HashMap<String, u64> = HashMap::new();
    let deadline = Instant::now() + WAIT * 6;
    while got.exit.is_none() {
        assert!(Instant::now() < deadline, "no Exit in time: {got:?}");
        let m = c
            .next_notification(Some(WAIT))
            .unwrap_or_else(|e| panic!("waiting for events of {id}: {e}"));
        let p = &m["params"]["payload"];
        if p["id"] != id {
            continue;
        }
        match m["params"]["type"].as_str().unwrap_or("") {
            "Output" => {
                let stream = p["stream"].as_str().expect("stream").to_string();
                let at = next.entry(stream.clone()).or_default();
                assert_eq!(p["offset"], *at, "offsets add up: {m:.200}");
                let text = p["data"].as_str().expect("data");
                let data = if p["encoding"] == "base64" {
                    base64_decode(text).expect("base64 data")
                } else {
                    text.as_bytes().to_vec()
                };
                *at += data.len() as u64;
                got.bytes.entry(stream).or_default().extend(data);
            }
            "Gap" => {
                let stream = p["stream"].as_str().expect("stream").to_string();
                let n = p["skipped"].as_u64().expect("skipped");
                *next.entry(stream).or_default() += n;
                got.gaps += n;
            }
            "Exit" => got.exit = Some(p.clone()),
            other => panic!("unexpected event {other}: {m}"),
        }
        if let Some(d) = pause {
            std::thread::sleep(d);
        }
    }
    got
}

/// Random bytes (every value, invalid UTF-8 included), from a fixed xorshift seed.
fn random_bytes(n: usize) -> Vec<u8> {
    let mut x: u64 = 0x2545_f491_4f6c_dd1d;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

/// A terminal created subscribed, lossless, in base64, with a reader slower than the
/// command and a small client buffer: every byte of a binary file arrives, exactly,
/// with no `Gap`.
#[test]
fn a_lossless_base64_subscription_made_at_creation_loses_nothing() {
    let d = Daemon::start(&["--client-buffer", "64K"]);
    let file = d.dir.path().join("blob");
    let blob = random_bytes(4 * MIB);
    std::fs::write(&file, &blob).expect("write blob");
    let mut c = d.client();
    let r = ok(
        &mut c,
        "terminal/create",
        json!({"sessionId": "s", "command": "cat", "args": [file],
               "_meta": {"execd": {"subscribe": {"lossless": true, "encoding": "base64"}}}}),
    );
    let id = r["terminalId"].as_str().expect("id").to_string();
    let got = collect(&mut c, &id, Some(Duration::from_micros(300)));
    assert_eq!(got.gaps, 0);
    let out = got.bytes.get("output").cloned().unwrap_or_default();
    assert_eq!(out.len(), blob.len());
    assert!(out == blob, "the bytes differ");
    assert_eq!(got.exit.expect("exit")["exitCode"], 0);
}

/// `bash/exec` with `subscribe`: stdout and stderr apart, exact bytes, from the start.
#[test]
fn bash_exec_subscribed_at_creation_keeps_streams_apart_and_exact() {
    let d = Daemon::start(&["--client-buffer", "64K"]);
    let out_file = d.dir.path().join("out");
    let err_file = d.dir.path().join("err");
    // Both pipes fill while the subscriber is slow, so the exit finds them paused: every
    // byte of both must still come before the Exit event.
    let out_blob = random_bytes(6 * MIB + 7);
    let err_blob: Vec<u8> = random_bytes(3 * MIB + 1).into_iter().rev().collect();
    std::fs::write(&out_file, &out_blob).expect("write");
    std::fs::write(&err_file, &err_blob).expect("write");
    let mut c = d.client();
    let r = ok(
        &mut c,
        "bash/exec",
        json!({"command": format!("cat '{}' & cat '{}' >&2; wait", out_file.display(), err_file.display()),
               "async_mode": true,
               "subscribe": {"lossless": true, "encoding": "base64"}}),
    );
    let id = r["command_id"].as_str().expect("id").to_string();
    let got = collect(&mut c, &id, Some(Duration::from_micros(100)));
    assert_eq!(got.gaps, 0);
    assert!(got.bytes["stdout"] == out_blob, "stdout differs");
    assert!(got.bytes["stderr"] == err_blob, "stderr differs");
    assert_eq!(got.exit.expect("exit")["status"], "completed");
}

/// A lossless subscriber that never reads holds its command (by design): the command
/// blocks on its full pipe, the daemon does not buffer its output, other clients and
/// commands go on, and disconnecting releases it.
#[test]
fn a_lossless_subscriber_that_never_reads_holds_only_its_command() {
    let d = Daemon::start(&["--client-buffer", "64K"]);
    let mut c = d.client();
    // It starts writing once subscribed: what is read before that is not the point.
    let go = d.dir.path().join("go");
    let script = format!(
        "while [ ! -e '{}' ]; do sleep 0.01; done; exec head -c 104857600 /dev/zero",
        go.display()
    );
    let id = create(&mut c, "sh", &["-c", &script]);
    let mut stuck = std::os::unix::net::UnixStream::connect(&d.socket).expect("connect");
    let sub = json!({"jsonrpc": "2.0", "id": 1, "method": "events/subscribe",
                     "params": {"id": id, "lossless": true}});
    stuck
        .write_all(format!("{sub}\n").as_bytes())
        .expect("subscribe");
    stuck.set_read_timeout(Some(WAIT)).expect("timeout");
    let mut answer = Vec::new();
    let mut byte = [0u8; 1];
    while !answer.ends_with(b"\n") {
        assert_eq!(
            read_some(&mut stuck, &mut byte).expect("the subscribe answer"),
            1
        );
        answer.push(byte[0]);
    }
    let answer: Value = serde_json::from_slice(&answer).expect("JSON");
    assert!(answer.get("result").is_some(), "{answer}");
    std::fs::File::create(&go).expect("go");
    // The command stalls well short of its 100 MiB: it is not read while the subscriber
    // does not read.
    let mut last = 0;
    wait_until("the output stops growing", || {
        std::thread::sleep(Duration::from_millis(200));
        let now = terminal_entry(&mut c, &id)["outputBytes"]
            .as_u64()
            .unwrap_or(0);
        let stalled = now == last && now > 0;
        last = now;
        stalled
    });
    assert!(last < 20 * MIB as u64, "{last} bytes were read");
    assert!(terminal_entry(&mut c, &id).get("exitStatus").is_none());
    // Others are unaffected.
    let other = create(&mut c, "echo", &["still served"]);
    wait_exit(&mut c, &other);
    assert_eq!(output(&mut c, &other)["output"], "still served\n");
    // Disconnecting releases it.
    drop(stuck);
    let exit = wait_exit(&mut c, &id);
    assert_eq!(exit["exitCode"], 0, "{exit}");
    assert_eq!(terminal_entry(&mut c, &id)["outputBytes"], 100 * MIB as u64);
}

/// One command, a lossless subscriber that reads everything and a lossy one that reads
/// nothing until the end: the lossless one gets every byte, the lossy one gets `Gap`s,
/// and both see offsets that add up.
#[test]
fn lossless_and_lossy_subscribers_share_a_command() {
    let d = Daemon::start(&["--client-buffer", "64K"]);
    let mut c = d.client();
    let (go, wait) = (
        d.dir.path().join("go"),
        format!(
            "while [ ! -e '{}' ]; do sleep 0.01; done",
            d.dir.path().join("go").display()
        ),
    );
    let id = create(
        &mut c,
        "sh",
        &[
            "-c",
            &format!("{wait}; head -c 8388608 /dev/zero | tr '\\0' 'x'"),
        ],
    );
    let mut lossless = d.client();
    ok(
        &mut lossless,
        "events/subscribe",
        json!({"id": id, "lossless": true}),
    );
    let mut lossy = d.client();
    ok(&mut lossy, "events/subscribe", json!({"id": id}));
    std::fs::write(&go, b"").expect("gate");
    let all = collect(&mut lossless, &id, None);
    assert_eq!(all.gaps, 0);
    assert_eq!(all.bytes["output"].len(), 8 * MIB);
    assert!(all.bytes["output"].iter().all(|&b| b == b'x'));
    let some = collect(&mut lossy, &id, None);
    assert_eq!(
        some.bytes.get("output").map_or(0, Vec::len) as u64 + some.gaps,
        8 * MIB as u64,
        "data and gaps add up"
    );
    assert!(
        some.gaps > 0,
        "the lossy reader that did not read was not held"
    );
}

/// Encodings other than text and base64 are refused.
#[test]
fn a_subscription_names_a_known_encoding() {
    let d = Daemon::start(&[]);
    let mut c = d.client();
    let id = create(&mut c, "true", &[]);
    let (code, _, data) = err(
        &mut c,
        "events/subscribe",
        json!({"id": id, "encoding": "hex"}),
    );
    assert_eq!(code, -32602);
    assert_eq!(data.expect("data")["field"], "encoding");
}

/// A terminal created with a stdin pipe takes input through `terminal/write`: text,
/// exact bytes in base64, more than the stdin buffer holds with `wait`, then EOF.
#[test]
fn terminal_write_feeds_a_terminal_created_with_stdin() {
    let d = Daemon::start(&["--stdin-buffer", "64K"]);
    let mut c = d.client();
    let r = ok(
        &mut c,
        "terminal/create",
        json!({"sessionId": "s", "command": "sh", "args": ["-c", "head -c 6; wc -c"],
               "_meta": {"execd": {"stdin": true}}}),
    );
    let id = r["terminalId"].as_str().expect("id").to_string();
    let ids = |extra: Value| {
        let mut p = json!({"sessionId": "s", "terminalId": id});
        p.as_object_mut()
            .expect("object")
            .extend(extra.as_object().expect("object").clone());
        p
    };
    let w = ok(&mut c, "terminal/write", ids(json!({"input": "hello\n"})));
    assert_eq!(w["written"], 6);
    // 1 MiB of bytes that are not UTF-8, in chunks of 32 KiB, each waiting for room.
    let blob = random_bytes(MIB);
    for chunk in blob.chunks(32 << 10) {
        let mut text = Vec::new();
        base64_encode(&mut text, chunk);
        let w = ok(
            &mut c,
            "terminal/write",
            ids(json!({"input": String::from_utf8(text).expect("ascii"),
                       "encoding": "base64", "wait": true})),
        );
        assert_eq!(w["written"], chunk.len());
    }
    // Without `wait`, input that does not fit is refused whole.
    let (code, _, data) = err(
        &mut c,
        "terminal/write",
        ids(json!({"input": "z".repeat(65 << 10)})),
    );
    assert_eq!(code, -32003);
    assert_eq!(data.expect("data")["limit"], "stdin-buffer");
    ok(
        &mut c,
        "terminal/write",
        ids(json!({"input": "", "eof": true})),
    );
    let exit = wait_exit(&mut c, &id);
    assert_eq!(exit["exitCode"], 0);
    let out = output(&mut c, &id)["output"]
        .as_str()
        .expect("output")
        .to_string();
    assert_eq!(out, format!("hello\n{}\n", MIB));
    // Closed now.
    let (code, _, _) = err(&mut c, "terminal/write", ids(json!({"input": "late"})));
    assert_eq!(code, -32000);
    // A terminal without the extension has no stdin pipe.
    let plain = create(&mut c, "sleep", &["5"]);
    let (code, msg, _) = err(
        &mut c,
        "terminal/write",
        json!({"sessionId": "s", "terminalId": plain, "input": "x"}),
    );
    assert_eq!(code, -32000, "{msg}");
}

/// `bash/write` takes base64 input too, and `wait` for back-pressure.
#[test]
fn bash_write_takes_exact_bytes_and_waits_for_room() {
    let d = Daemon::start(&["--stdin-buffer", "64K"]);
    let mut c = d.client();
    let out = d.dir.path().join("copy");
    let r = ok(
        &mut c,
        "bash/exec",
        json!({"command": format!("cat > '{}'", out.display()), "async_mode": true}),
    );
    let session = r["session_id"].clone();
    let blob = random_bytes(MIB / 2);
    for chunk in blob.chunks(32 << 10) {
        let mut text = Vec::new();
        base64_encode(&mut text, chunk);
        ok(
            &mut c,
            "bash/write",
            json!({"session_id": session, "input": String::from_utf8(text).expect("ascii"),
                   "encoding": "base64", "wait": true}),
        );
    }
    ok(
        &mut c,
        "bash/write",
        json!({"session_id": session, "input": "", "eof": true}),
    );
    let o = ok(
        &mut c,
        "bash/output",
        json!({"session_id": session, "wait": true, "wait_timeout": 20, "offset": 0}),
    );
    assert_eq!(o["command"]["status"], "completed", "{o}");
    let mut copy = Vec::new();
    std::fs::File::open(&out)
        .expect("copy")
        .read_to_end(&mut copy)
        .expect("read");
    assert!(copy == blob, "stdin arrived changed");
}

/// `terminal/kill` with `_meta.execd.signal` sends that one signal.
#[test]
fn terminal_kill_with_a_signal_of_the_clients_choice() {
    // The grace is what the answer waits for an exit: long enough for a loaded machine.
    let d = Daemon::start(&["--kill-grace", "3s"]);
    let mut c = d.client();
    let id = create(&mut c, "sleep", &["30"]);
    let r = ok(
        &mut c,
        "terminal/kill",
        json!({"sessionId": "s", "terminalId": id, "_meta": {"execd": {"signal": "SIGINT"}}}),
    );
    assert_eq!(r["_meta"]["execd"]["exited"], true, "{r}");
    assert_eq!(
        wait_exit(&mut c, &id),
        json!({"exitCode": null, "signal": "SIGINT"})
    );
    // One that ignores it is still running when the grace is over; nothing else is sent.
    let id = create(&mut c, "sh", &["-c", "trap '' INT; echo ready; sleep 30"]);
    wait_until("the trap is set", || {
        output(&mut c, &id)["output"] == "ready\n"
    });
    let r = ok(
        &mut c,
        "terminal/kill",
        json!({"sessionId": "s", "terminalId": id, "_meta": {"execd": {"signal": "INT"}}}),
    );
    assert_eq!(r["_meta"]["execd"]["exited"], false, "{r}");
    assert!(output(&mut c, &id).get("exitStatus").is_none());
    let (code, _, _) = err(
        &mut c,
        "terminal/kill",
        json!({"sessionId": "s", "terminalId": id, "_meta": {"execd": {"signal": "SIGSEGV"}}}),
    );
    assert_eq!(code, -32602);
}

/// A command that cannot be started says which program and why, by errno name.
#[test]
fn spawn_failures_name_the_program_and_the_errno() {
    let d = Daemon::start(&[]);
    let mut c = d.client();
    let (code, msg, data) = err(
        &mut c,
        "terminal/create",
        json!({"sessionId": "s", "command": "no-such-command-here"}),
    );
    assert_eq!((code, msg.as_str()), (-32004, "No such file or directory"));
    assert_eq!(
        data,
        Some(json!({"program": "no-such-command-here", "errno": "ENOENT"}))
    );
    let file = d.dir.path().join("not-executable");
    std::fs::write(&file, "#!/bin/sh\n").expect("write");
    let (code, _, data) = err(
        &mut c,
        "terminal/create",
        json!({"sessionId": "s", "command": file}),
    );
    assert_eq!(code, -32004);
    assert_eq!(data.expect("data")["errno"], "EACCES");
}
