//! Robustness against hostile or unusual conditions, against the real daemon: SIGHUP, a
//! batch whose answers would be huge, a connection parking thousands of requests, a tiny
//! ring with a subscriber, half-closed connections under back-pressure, descriptors and
//! blocked signals inherited from whoever started the daemon, and a stale `bash/output`
//! offset (PROTOCOL.md sections 2, 3, 5, 6 and 8).

use crate::util::*;

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::time::Instant;

// ---- helpers ---------------------------------------------------------------------------

/// Creates a terminal in session `s` running `sh -c script` with a ring of `limit` bytes.
#[track_caller]
fn create_sh(c: &mut Client, script: &str, limit: u64) -> String {
    create_with(
        c,
        json!({"sessionId": "s", "command": "sh", "args": ["-c", script],
               "outputByteLimit": limit}),
    )
}

/// A notification line (no id, no newline).
fn notification(method: &str, params: Value) -> String {
    json!({"jsonrpc": "2.0", "method": method, "params": params}).to_string()
}

/// Checks that `m` is a `-32003` error naming `limit`; returns its `data`.
#[track_caller]
fn expect_limit(m: &Value, limit: &str) -> Value {
    assert_eq!(m["jsonrpc"], "2.0", "{m}");
    assert!(m.get("result").is_none(), "expected an error: {m}");
    assert_eq!(m["error"]["code"], -32003, "{m}");
    assert_eq!(m["error"]["data"]["limit"], limit, "{m}");
    m["error"]["data"].clone()
}

/// A field of `/proc/PID/status` in KiB (`VmRSS`, `VmHWM`).
fn status_kb(pid: i32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find(|l| l.starts_with(&format!("{field}:")))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {field} in /proc/{pid}/status"))
}

/// A hexadecimal signal mask field of `/proc/PID/status` (`SigBlk`, ...).
fn status_mask(status: &str, field: &str) -> u64 {
    let line = status
        .lines()
        .find(|l| l.starts_with(&format!("{field}:")))
        .unwrap_or_else(|| panic!("no {field} in {status:?}"));
    let hex = line.split_whitespace().nth(1).expect("mask value");
    u64::from_str_radix(hex, 16).unwrap_or_else(|e| panic!("bad mask {line:?}: {e}"))
}

/// The bit of signal `sig` in a `/proc` signal mask.
fn sig_bit(sig: i32) -> u64 {
    1 << (sig - 1)
}

/// A raw connection with a bounded read timeout.
fn raw_connect(d: &Daemon) -> UnixStream {
    let s = UnixStream::connect(&d.socket).expect("connect to execd");
    s.set_read_timeout(Some(WAIT)).expect("read timeout");
    s
}

/// Reads until the daemon closes the connection (bounded: each read waits at most `WAIT`,
/// the whole at most `limit`); returns everything read.
#[track_caller]
fn read_to_eof(s: &mut UnixStream, limit: std::time::Duration) -> Vec<u8> {
    let deadline = Instant::now() + limit;
    let mut all = Vec::new();
    let mut buf = vec![0u8; 256 << 10];
    loop {
        assert!(
            Instant::now() < deadline,
            "execd did not close the connection within {limit:?} ({} bytes read)",
            all.len()
        );
        match read_some(s, &mut buf) {
            Ok(0) => return all,
            Ok(n) => all.extend_from_slice(&buf[..n]),
            Err(e) => panic!("reading until EOF failed after {} bytes: {e}", all.len()),
        }
    }
}

/// Splits what was read into JSON messages, one per line; every line must be complete.
#[track_caller]
fn messages(bytes: &[u8]) -> Vec<Value> {
    assert!(
        bytes.is_empty() || bytes.ends_with(b"\n"),
        "the last message is cut: ...{:?}",
        String::from_utf8_lossy(&bytes[bytes.len().saturating_sub(200)..])
    );
    bytes
        .split(|b| *b == b'\n')
        .filter(|l| !l.is_empty())
        .map(|l| {
            serde_json::from_slice(l).unwrap_or_else(|e| {
                panic!(
                    "bad JSON line from execd ({e}): {:?}",
                    String::from_utf8_lossy(&l[..l.len().min(200)])
                )
            })
        })
        .collect()
}

/// A terminal whose whole output is `n` bytes of `x`, run to its end.
#[track_caller]
fn x_terminal(c: &mut Client, n: usize) -> String {
    let id = create_sh(c, &format!("head -c {n} /dev/zero | tr '\\0' x"), 65536);
    let exit = wait_exit(c, &id);
    assert_eq!(exit["exitCode"], 0, "{exit}");
    let out = output(c, &id);
    assert_eq!(out["output"].as_str().map(str::len), Some(n), "{out}");
    id
}

// ---- 1. SIGHUP -----------------------------------------------------------------------------

/// SIGHUP is caught and logged: the daemon goes on serving, its commands go on running,
/// and it still stops cleanly on SIGTERM afterwards.
#[test]
fn sighup_does_not_stop_the_daemon_or_its_commands() {
    let mut d = Daemon::start(&[]);
    let mut c = d.client();
    let id = create(&mut c, "sleep", &["30"]);
    let pid = pid_of(&mut c, &id);
    assert!(pid_alive(pid));

    // A parked wait on another connection must survive too.
    let mut waiter = d.client();
    let wait_id = waiter
        .send(
            "terminal/wait_for_exit",
            json!({"sessionId": "s", "terminalId": id}),
        )
        .expect("send wait");

    unsafe_kill(d.pid(), libc::SIGHUP);
    wait_until("the log mentions SIGHUP", || d.log().contains("SIGHUP"));
    unsafe_kill(d.pid(), libc::SIGHUP);
    wait_until("the log mentions the second SIGHUP", || {
        d.log().matches("SIGHUP").count() >= 2
    });

    assert!(pid_alive(d.pid()), "execd died of SIGHUP:\n{}", d.log());
    // The same connection and a new one are both still served.
    let e = terminal_entry(&mut c, &id);
    assert!(e.get("exitStatus").is_none(), "command ended: {e}");
    assert!(pid_alive(pid), "the command died with the SIGHUP");
    let out = output(&mut c, &id);
    assert!(out.get("exitStatus").is_none(), "{out}");
    let mut c2 = d.client();
    let id2 = create(&mut c2, "sh", &["-c", "exit 4"]);
    assert_eq!(wait_exit(&mut c2, &id2)["exitCode"], 4);

    // The parked wait is answered once the command is killed.
    let r = ok(
        &mut c,
        "terminal/kill",
        json!({"sessionId": "s", "terminalId": id}),
    );
    assert_eq!(r, json!({}));
    let exit = waiter.wait_response(wait_id).expect("parked wait answered");
    assert_eq!(exit, json!({"exitCode": null, "signal": "SIGTERM"}));

    assert_eq!(d.terminate(), Some(0), "{}", d.log());
    assert_no_panic(&d);
}

// ---- 2. a batch whose answers would be huge ---------------------------------------------

/// One batch line of 2000 `terminal/output` requests, each answered with ~60 KB: answering
/// all would take ~120 MB. With `--client-buffer 64K` the daemon answers the first ones and
/// refuses the rest with `-32003` `client-buffer`, one reply element per request, without
/// growing; the connection keeps working.
#[test]
fn a_batch_cannot_make_the_daemon_buffer_without_bound() {
    // Over the default --max-batch, which this test raises to reach the buffer cap.
    const N: u64 = 2000;
    const SIZE: usize = 60_000;
    const CAP: u64 = 64 << 10;
    let d = Daemon::start(&["--client-buffer", "64K", "--max-batch", "5000"]);
    let mut c = d.client();
    let id = x_terminal(&mut c, SIZE);

    let batch: Vec<Value> = (1..=N)
        .map(|i| {
            json!({"jsonrpc": "2.0", "id": i, "method": "terminal/output",
                   "params": {"sessionId": "s", "terminalId": id}})
        })
        .collect();
    c.send_line(Value::Array(batch).to_string().as_bytes())
        .expect("send batch");
    let reply = c.read_message(Some(WAIT)).expect("the batch reply");
    let hwm_kb = status_kb(d.pid(), "VmHWM");
    let rss_kb = status_kb(d.pid(), "VmRSS");
    assert!(
        hwm_kb < 64 << 10,
        "execd's peak RSS reached {hwm_kb} KiB answering one batch"
    );
    assert!(rss_kb < 64 << 10, "execd's RSS is {rss_kb} KiB");

    let elems = reply
        .as_array()
        .unwrap_or_else(|| panic!("the reply to a batch is not an array: {reply:.300}"));
    assert_eq!(elems.len() as u64, N, "one reply element per request");
    let mut by_id: Vec<(u64, &Value)> = elems
        .iter()
        .map(|e| (e["id"].as_u64().unwrap_or_else(|| panic!("{e}")), e))
        .collect();
    by_id.sort_by_key(|(i, _)| *i);
    let ids: Vec<u64> = by_id.iter().map(|(i, _)| *i).collect();
    assert_eq!(ids, (1..=N).collect::<Vec<_>>(), "every id exactly once");

    // The answers carried out come first, then only refusals.
    let results = by_id
        .iter()
        .take_while(|(_, e)| e.get("result").is_some())
        .count();
    assert!(
        results >= 1,
        "the first request is answered: {}",
        by_id[0].1
    );
    for (_, e) in &by_id[..results] {
        let out = &e["result"]["output"];
        assert_eq!(out.as_str().map(str::len), Some(SIZE), "{}", e["id"]);
        assert!(out.as_str().unwrap_or("").bytes().all(|b| b == b'x'));
    }
    assert!(
        (results * SIZE) as u64 <= 2 * CAP,
        "{results} answers of {SIZE} bytes were gathered for one batch, past the 64K cap"
    );
    for (_, e) in &by_id[results..] {
        let data = expect_limit(e, "client-buffer");
        assert_eq!(data["value"], CAP, "{e}");
    }
    assert!(results < N as usize, "nothing was refused");

    // The connection keeps working, and so does the terminal.
    let out = output(&mut c, &id);
    assert_eq!(out["output"].as_str().map(str::len), Some(SIZE));
    let r = ok(&mut c, "terminal/list", json!({}));
    assert!(r["terminals"].is_array(), "{r}");
    assert_no_panic(&d);
}

// ---- 3. requests waiting per connection -------------------------------------------------

/// 4097 pipelined `terminal/wait_for_exit` on one connection: 4096 park, the last is refused
/// at once with `-32003` `waiting-requests`. At the cap requests are refused but
/// notifications are still carried out. Killing the terminal answers all 4096.
#[test]
fn waiting_requests_per_connection_are_capped() {
    const CAP: u64 = 4096;
    let d = Daemon::start(&[]);
    let mut c = d.client();
    let id = create(&mut c, "sleep", &["30"]);
    let pid = pid_of(&mut c, &id);

    let params = json!({"sessionId": "s", "terminalId": id});
    let lines: Vec<String> = (1..=CAP + 1)
        .map(|i| request(i, "terminal/wait_for_exit", params.clone()))
        .collect();
    c.send_line(lines.join("\n").as_bytes())
        .expect("send the waits");

    // Nothing but the refusal can be answered while `sleep 30` runs.
    let first = c.read_message(Some(WAIT)).expect("the refusal arrives");
    assert_eq!(
        first["id"],
        CAP + 1,
        "the first answer is for the last: {first}"
    );
    let data = expect_limit(&first, "waiting-requests");
    assert_eq!(data["value"], CAP, "{first}");

    // Still at the cap: a request that would not even wait is refused too...
    c.send_line(request(9001, "terminal/list", json!({})).as_bytes())
        .expect("send list");
    let m = c.read_message(Some(WAIT)).expect("list refused");
    assert_eq!(m["id"], 9001, "{m}");
    expect_limit(&m, "waiting-requests");
    // ...but a notification is carried out: it starts a terminal another client can see.
    c.send_line(
        notification(
            "terminal/create",
            json!({"sessionId": "s", "command": "true", "args": ["notified-at-cap"]}),
        )
        .as_bytes(),
    )
    .expect("send notification");
    let mut other = d.client();
    wait_until("the notified terminal/create ran", || {
        let r = ok(&mut other, "terminal/list", json!({"sessionId": "s"}));
        r["terminals"]
            .as_array()
            .is_some_and(|ts| ts.iter().any(|t| t["args"] == json!(["notified-at-cap"])))
    });
    assert!(pid_alive(pid), "the watched command still runs");

    // Kill it from the capped connection, as a notification too.
    c.send_line(notification("terminal/kill", params.clone()).as_bytes())
        .expect("send kill");
    let mut answered = BTreeSet::new();
    let deadline = Instant::now() + WAIT * 3;
    while answered.len() < CAP as usize {
        assert!(
            Instant::now() < deadline,
            "only {} of {CAP} parked waits answered",
            answered.len()
        );
        let m = c
            .read_message(Some(WAIT))
            .unwrap_or_else(|e| panic!("{} of {CAP} parked waits answered: {e}", answered.len()));
        assert!(m.get("method").is_none(), "unexpected notification {m}");
        let i = m["id"].as_u64().unwrap_or_else(|| panic!("{m}"));
        assert!((1..=CAP).contains(&i), "answer for unexpected id: {m}");
        assert_eq!(
            m["result"],
            json!({"exitCode": null, "signal": "SIGTERM"}),
            "{m}"
        );
        assert!(answered.insert(i), "id {i} answered twice");
    }
    // Below the cap again: the connection takes requests.
    let exit = wait_exit(&mut c, &id);
    assert_eq!(exit, json!({"exitCode": null, "signal": "SIGTERM"}));
    assert_no_panic(&d);
}

// ---- 4. a tiny ring, a subscriber, and the exit ---------------------------------------

/// What one subscription saw of one terminal.
#[derive(Default, Debug)]
struct Seen {
    /// Next expected offset: data bytes plus skipped bytes so far.
    pos: u64,
    data_bytes: u64,
    skipped: u64,
    /// The end of the data of the last `Output`.
    last_output: String,
    /// Event types in arrival order.
    kinds: Vec<String>,
    exit: Option<Value>,
}

/// Reads the subscription's events up to and including `Exit`, checking offsets.
#[track_caller]
fn events_until_exit(c: &mut Client, id: &str) -> Seen {
    let mut seen = Seen::default();
    let deadline = Instant::now() + WAIT * 3;
    while seen.exit.is_none() {
        assert!(Instant::now() < deadline, "no Exit event in time: {seen:?}");
        let n = c
            .next_notification(Some(WAIT))
            .unwrap_or_else(|e| panic!("no event within {WAIT:?}: {e}; so far {seen:?}"));
        assert_eq!(n["method"], "event", "{n}");
        let kind = n["params"]["type"]
            .as_str()
            .expect("event type")
            .to_string();
        let p = &n["params"]["payload"];
        assert_eq!(p["id"], id, "{n}");
        seen.kinds.push(kind.clone());
        match kind.as_str() {
            "Output" => {
                assert_eq!(p["stream"], "output", "{n}");
                assert_eq!(
                    p["offset"], seen.pos,
                    "Output must continue at {}",
                    seen.pos
                );
                let data = p["data"].as_str().expect("data");
                assert!(!data.is_empty(), "empty Output {n}");
                assert!(
                    data.bytes().all(|b| b"yEND\n".contains(&b)),
                    "unexpected bytes in {n}"
                );
                seen.pos += data.len() as u64;
                seen.data_bytes += data.len() as u64;
                let tail = data.len().saturating_sub(8);
                seen.last_output = format!("{}{}", seen.last_output, &data[tail..]);
                let keep = seen.last_output.len().saturating_sub(8);
                seen.last_output.drain(..keep);
            }
            "Gap" => {
                assert_eq!(p["offset"], seen.pos, "Gap must continue at {}", seen.pos);
                let skipped = p["skipped"].as_u64().expect("skipped");
                assert!(skipped > 0, "{n}");
                seen.pos += skipped;
                seen.skipped += skipped;
                // What came before the gap is no longer the tail.
                seen.last_output.clear();
            }
            "Exit" => seen.exit = Some(p.clone()),
            other => panic!("unknown event {other}: {n}"),
        }
    }
    seen
}

/// A 16 KiB ring, a subscriber, and 600 KB written as fast as the pipe takes it, ending in
/// `END`: the exit is published only after the pipe was drained, so the subscriber's data
/// and gaps cover every byte, its last `Output` ends with `END\n` before `Exit`, and
/// `terminal/output` right after `wait_for_exit` ends with `END\n` too.
#[test]
fn exit_follows_the_drained_pipe_with_a_tiny_ring_and_a_subscriber() {
    const BULK: u64 = 600_000;
    const TOTAL: u64 = BULK + 4; // "END\n"
    const RING: u64 = 16384;
    let d = Daemon::start(&[]);
    for round in 0..3 {
        let mut c = d.client();
        let mut waiter = d.client();
        let (go, wait) = gate(&d, &format!("go{round}"));
        let id = create_sh(
            &mut c,
            &format!("{wait}; head -c {BULK} /dev/zero | tr '\\0' y; echo END"),
            RING,
        );
        let r = ok(&mut c, "events/subscribe", json!({"id": id}));
        assert_eq!(r, json!({}));
        let wait_id = waiter
            .send(
                "terminal/wait_for_exit",
                json!({"sessionId": "s", "terminalId": id}),
            )
            .expect("send wait");
        open_gate(&go);

        // The waiter reads the output as soon as the exit is announced.
        let exit = waiter.wait_response(wait_id).expect("wait answered");
        assert_eq!(exit, json!({"exitCode": 0, "signal": null}));
        let out = output(&mut waiter, &id);
        let text = out["output"].as_str().expect("output");
        assert!(
            text.ends_with("yyyyEND\n"),
            "round {round}: output right after the exit ends with {:?}",
            &text[text.len().saturating_sub(20)..]
        );
        assert!(text.len() as u64 <= RING, "{} bytes retained", text.len());
        assert_eq!(out["truncated"], true);
        assert_eq!(out["exitStatus"], json!({"exitCode": 0, "signal": null}));

        let seen = events_until_exit(&mut c, &id);
        assert_eq!(
            seen.pos, TOTAL,
            "round {round}: offsets at Exit must cover every byte: {seen:?}"
        );
        assert_eq!(seen.data_bytes + seen.skipped, TOTAL, "{seen:?}");
        assert!(seen.data_bytes > 0, "{seen:?}");
        assert_eq!(
            seen.kinds.iter().rev().nth(1).map(String::as_str),
            Some("Output"),
            "round {round}: Exit comes right after the last Output: {:?}",
            &seen.kinds[seen.kinds.len().saturating_sub(5)..]
        );
        assert!(
            seen.last_output.ends_with("END\n"),
            "round {round}: the last Output ends with {:?}",
            seen.last_output
        );
        let e = seen.exit.expect("exit");
        assert_eq!(e["exitCode"], 0, "{e}");
        assert_eq!(e["status"], "completed", "{e}");
    }
    assert_no_panic(&d);
}

// ---- 5. half-closed connections ----------------------------------------------------------

/// 500 requests in one write, then the write side shut: all 500 are answered, then the
/// daemon closes.
#[test]
fn requests_buffered_at_half_close_are_all_answered() {
    const N: u64 = 500;
    let d = Daemon::start(&[]);
    let mut s = raw_connect(&d);
    let mut bytes = Vec::new();
    for i in 1..=N {
        let line = if i % 2 == 0 {
            request(i, "terminal/list", json!({}))
        } else {
            request(i, "initialize", json!({"protocolVersion": 1}))
        };
        bytes.extend_from_slice(line.as_bytes());
        bytes.push(b'\n');
    }
    s.write_all(&bytes).expect("write requests");
    s.shutdown(std::net::Shutdown::Write).expect("shutdown");
    let msgs = messages(&read_to_eof(&mut s, WAIT));
    assert_eq!(msgs.len() as u64, N, "one answer per request");
    let mut ids = BTreeSet::new();
    for m in &msgs {
        let i = m["id"].as_u64().unwrap_or_else(|| panic!("{m}"));
        assert!(m.get("error").is_none(), "{m}");
        if i % 2 == 0 {
            assert!(m["result"]["terminals"].is_array(), "{m}");
        } else {
            assert_eq!(m["result"]["protocolVersion"], 1, "{m}");
        }
        assert!(ids.insert(i), "id {i} answered twice");
    }
    assert_eq!(ids, (1..=N).collect::<BTreeSet<_>>());
    assert_no_panic(&d);
}

/// The same under back-pressure: with `--client-buffer 64K`, 500 requests whose answers
/// are ~60 KB each (30 MB in all) make the daemon stop reading and resume many times, yet
/// every one is answered before it closes the half-closed connection.
#[test]
fn half_close_under_back_pressure_still_answers_everything() {
    const N: u64 = 500;
    const SIZE: usize = 60_000;
    let d = Daemon::start(&["--client-buffer", "64K"]);
    let mut c = d.client();
    let id = x_terminal(&mut c, SIZE);

    let mut s = raw_connect(&d);
    let mut bytes = Vec::new();
    for i in 1..=N {
        let line = request(
            i,
            "terminal/output",
            json!({"sessionId": "s", "terminalId": id}),
        );
        bytes.extend_from_slice(line.as_bytes());
        bytes.push(b'\n');
    }
    s.write_all(&bytes).expect("write requests");
    s.shutdown(std::net::Shutdown::Write).expect("shutdown");
    let all = read_to_eof(&mut s, WAIT * 3);
    let hwm_kb = status_kb(d.pid(), "VmHWM");
    let msgs = messages(&all);
    assert_eq!(msgs.len() as u64, N, "one answer per request");
    let mut ids = BTreeSet::new();
    for m in &msgs {
        let i = m["id"].as_u64().unwrap_or_else(|| panic!("{}", m["id"]));
        let out = m["result"]["output"].as_str();
        assert_eq!(out.map(str::len), Some(SIZE), "answer {i}: {}", m["error"]);
        assert!(ids.insert(i), "id {i} answered twice");
    }
    assert_eq!(ids, (1..=N).collect::<BTreeSet<_>>());
    // Answering all 500 before writing would take 30 MB; honouring the 64K cap takes a
    // few MiB in all (about 4 MiB for a debug build).
    assert!(
        hwm_kb < 16 << 10,
        "execd's peak RSS reached {hwm_kb} KiB for a 64K client buffer"
    );
    // The other connection is unaffected.
    let r = ok(&mut c, "terminal/list", json!({}));
    assert!(r["terminals"].is_array(), "{r}");
    assert_no_panic(&d);
}

/// Back-pressure on a connection that stays open: the daemon stops reading while 64K of
/// answers are owed, and must resume once the client has read them, even when the
/// buffer drained completely in one go.
#[test]
fn back_pressure_resumes_reading_on_an_open_connection() {
    const N: u64 = 40;
    const SIZE: usize = 60_000;
    let d = Daemon::start(&["--client-buffer", "64K"]);
    let mut c = d.client();
    let id = x_terminal(&mut c, SIZE);
    let params = json!({"sessionId": "s", "terminalId": id});
    let lines: Vec<String> = (1..=N)
        .map(|i| request(1000 + i, "terminal/output", params.clone()))
        .collect();
    c.send_line(lines.join("\n").as_bytes())
        .expect("send requests");
    let mut ids = BTreeSet::new();
    while ids.len() < N as usize {
        let m = c.read_message(Some(WAIT)).unwrap_or_else(|e| {
            panic!("only {} of {N} pipelined requests answered: {e}", ids.len())
        });
        let i = m["id"].as_u64().unwrap_or_else(|| panic!("{}", m["id"]));
        let out = m["result"]["output"].as_str();
        assert_eq!(out.map(str::len), Some(SIZE), "answer {i}: {}", m["error"]);
        assert!(ids.insert(i), "id {i} answered twice");
    }
    assert_eq!(ids, (1001..=1000 + N).collect::<BTreeSet<_>>());
    assert_no_panic(&d);
}

/// A last request without its newline, followed by EOF, is still answered.
#[test]
fn a_last_line_without_newline_before_eof_is_answered() {
    let d = Daemon::start(&[]);
    // Alone.
    let mut s = raw_connect(&d);
    s.write_all(request(7, "terminal/list", json!({})).as_bytes())
        .expect("write");
    s.shutdown(std::net::Shutdown::Write).expect("shutdown");
    let msgs = messages(&read_to_eof(&mut s, WAIT));
    assert_eq!(msgs.len(), 1, "{msgs:?}");
    assert_eq!(msgs[0]["id"], 7, "{}", msgs[0]);
    assert!(msgs[0]["result"]["terminals"].is_array(), "{}", msgs[0]);

    // After complete lines, with a string id.
    let mut s = raw_connect(&d);
    let body = format!(
        "{}\n{}\r\n{}",
        request(1, "terminal/list", json!({})),
        request(2, "initialize", json!({"protocolVersion": 1})),
        r#"{"jsonrpc":"2.0","id":"last","method":"terminal/list","params":{}}"#
    );
    s.write_all(body.as_bytes()).expect("write");
    s.shutdown(std::net::Shutdown::Write).expect("shutdown");
    let msgs = messages(&read_to_eof(&mut s, WAIT));
    let ids: Vec<Value> = msgs.iter().map(|m| m["id"].clone()).collect();
    assert_eq!(ids, vec![json!(1), json!(2), json!("last")], "{msgs:?}");
    assert!(msgs.iter().all(|m| m.get("result").is_some()), "{msgs:?}");
    assert_no_panic(&d);
}

// ---- 6. inherited descriptors ------------------------------------------------------------

/// Descriptors of a process's `/proc/PID/fd` listing from `ls -l`: `(fd, target)`.
fn fd_listing(text: &str) -> Vec<(i32, String)> {
    text.lines()
        .filter_map(|l| {
            let (left, target) = l.split_once(" -> ")?;
            let fd = left.split_whitespace().last()?.parse().ok()?;
            Some((fd, target.trim().to_string()))
        })
        .collect()
}

/// A descriptor the daemon inherited without close-on-exec never reaches a command: only
/// 0, 1 and 2 (and `ls`'s own directory handle) are open in one.
#[test]
fn descriptors_inherited_by_the_daemon_do_not_leak_into_commands() {
    let dir = TempDir::new();
    let marker = dir.path().join("inherited-marker");
    std::fs::write(&marker, b"secret").expect("marker file");
    let file = std::fs::File::open(&marker).expect("open marker");
    let fd = file.as_raw_fd();
    let socket = marker.with_file_name("execd.sock");
    let mut cmd = Daemon::command(dir.path(), &socket, &[]);
    // SAFETY: fcntl is async-signal-safe and changes only the child's copy of the
    // descriptor: cleared in this process instead, close-on-exec would be off for as long
    // as the daemon takes to listen, and every child another test spawned meanwhile (they
    // share this process) would be handed the descriptor too.
    unsafe {
        cmd.pre_exec(move || {
            if libc::fcntl(fd, libc::F_SETFD, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let d = Daemon::adopt(Some(cmd.spawn().expect("spawn execd")), socket, dir);

    // The daemon did inherit it: otherwise this test would prove nothing.
    let inherited = std::fs::read_link(format!("/proc/{}/fd/{fd}", d.pid()))
        .unwrap_or_else(|e| panic!("execd did not inherit fd {fd}: {e}"));
    assert_eq!(inherited, marker, "fd {fd} of execd");

    let marker_s = marker.display().to_string();
    let check = |how: &str, listing: &str| {
        let fds = fd_listing(listing);
        let numbers: BTreeSet<i32> = fds.iter().map(|(n, _)| *n).collect();
        assert!(
            [0, 1, 2].iter().all(|n| numbers.contains(n)),
            "{how}: 0, 1 and 2 are open: {listing}"
        );
        for (n, target) in &fds {
            assert_ne!(target, &marker_s, "{how}: the inherited fd leaked as {n}");
            if *n > 2 {
                assert!(
                    target.starts_with("/proc/"),
                    "{how}: fd {n} -> {target} leaked into the command:\n{listing}"
                );
            }
        }
        assert!(
            fds.iter().filter(|(n, _)| *n > 2).count() <= 1,
            "{how}: more than ls's own directory handle is open:\n{listing}"
        );
    };

    let mut c = d.client();
    let id = create(&mut c, "ls", &["-l", "/proc/self/fd"]);
    let exit = wait_exit(&mut c, &id);
    assert_eq!(exit["exitCode"], 0, "{exit}");
    let out = output(&mut c, &id);
    check("terminal", out["output"].as_str().expect("output"));

    // A shell started by a bash command (stdin, stdout and stderr all pipes).
    let r = ok(
        &mut c,
        "bash/exec",
        json!({"command": "ls -l /proc/$$/fd; exit 0", "max_output_length": 0}),
    );
    assert_eq!(r["status"], "completed", "{r}");
    assert_eq!(r["exit_code"], 0, "{r}");
    let listing = r["stdout"].as_str().expect("stdout");
    let fds = fd_listing(listing);
    assert!(!fds.is_empty(), "no listing: {r}");
    for (n, target) in &fds {
        assert_ne!(target, &marker_s, "bash: the inherited fd leaked as {n}");
        assert!(
            *n <= 2,
            "bash: fd {n} -> {target} is open in the shell:\n{listing}"
        );
    }
    drop(file);
    assert_no_panic(&d);
}

// ---- 7. bash/output past the end -------------------------------------------------------

/// `bash/output` with `wait: true` and an offset past the end is answered at once with ""
/// and the real end offset, not parked for `wait_timeout`.
#[test]
fn bash_output_wait_past_the_end_answers_at_once() {
    let d = Daemon::start(&[]);
    let mut c = d.client();
    let r = ok(
        &mut c,
        "bash/exec",
        json!({"command": "printf 'hello\\n'; printf 'err\\n' >&2; exec sleep 30",
               "async_mode": true}),
    );
    assert_eq!(r["status"], "running", "{r}");
    let session = r["session_id"].as_str().expect("session_id").to_string();
    let cmd = r["command_id"].as_str().expect("command_id").to_string();
    wait_until("both lines are out", || {
        let o = ok(
            &mut c,
            "bash/output",
            json!({"session_id": session, "command_id": cmd}),
        );
        o["offset"] == 6 && o["stderr_offset"] == 4
    });

    // stdout offset past the end; stderr at its end.
    let o = ok(
        &mut c,
        "bash/output",
        json!({"session_id": session, "command_id": cmd, "offset": 1000,
               "stderr_offset": 4, "wait": true, "wait_timeout": 1000}),
    );
    assert_eq!(o["stdout"], "", "{o}");
    assert_eq!(o["offset"], 6, "the real end offset: {o}");
    assert_eq!(o["stderr"], "", "{o}");
    assert_eq!(o["stderr_offset"], 4, "{o}");
    assert_eq!(o["command"]["status"], "running", "{o}");
    assert_eq!(o["command"]["exit_code"], Value::Null, "{o}");

    // stderr offset past the end; stdout at its end.
    let o = ok(
        &mut c,
        "bash/output",
        json!({"session_id": session, "command_id": cmd, "offset": 6,
               "stderr_offset": 99999, "wait": true, "wait_timeout": 1000}),
    );
    assert_eq!(o["stdout"], "", "{o}");
    assert_eq!(o["offset"], 6, "{o}");
    assert_eq!(o["stderr"], "", "{o}");
    assert_eq!(o["stderr_offset"], 4, "the real end offset: {o}");
    assert_eq!(o["command"]["status"], "running", "{o}");

    // Without a command_id too (the session's newest command).
    let o = ok(
        &mut c,
        "bash/output",
        json!({"session_id": session, "offset": 1u64 << 40, "wait": true,
               "wait_timeout": 1000}),
    );
    assert_eq!(o["stdout"], "", "{o}");
    assert_eq!(o["offset"], 6, "{o}");
    assert_eq!(o["command"]["command_id"], cmd.as_str(), "{o}");
    assert_eq!(o["command"]["status"], "running", "{o}");
    assert_no_panic(&d);
}

// ---- 8. a daemon started with signals blocked -----------------------------------------

/// Blocks SIGCHLD, SIGTERM, SIGHUP and SIGUSR1 (which execd does not handle, so only the
/// reset in the child can unblock it) in the calling thread; for `pre_exec`.
fn block_signals() -> std::io::Result<()> {
    // SAFETY: sigset_t is plain data, initialised by sigemptyset; pthread_sigmask is
    // async-signal-safe and so allowed between fork and exec.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for sig in [libc::SIGCHLD, libc::SIGTERM, libc::SIGHUP, libc::SIGUSR1] {
            libc::sigaddset(&mut set, sig);
        }
        if libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// `command` with SIGCHLD, SIGTERM, SIGHUP and SIGUSR1 blocked when it starts.
fn with_blocked_signals(mut command: Command) -> Command {
    // SAFETY: `block_signals` only calls async-signal-safe functions.
    unsafe {
        command.pre_exec(block_signals);
    }
    command
}

/// Commands start with no signal blocked even when the daemon was started with SIGCHLD,
/// SIGTERM, SIGHUP and SIGUSR1 blocked, and such a daemon still reaps, survives SIGHUP and
/// stops on SIGTERM.
#[test]
fn a_daemon_started_with_signals_blocked_still_works_and_unblocks_commands() {
    let handled = sig_bit(libc::SIGCHLD) | sig_bit(libc::SIGTERM) | sig_bit(libc::SIGHUP);
    let wanted = handled | sig_bit(libc::SIGUSR1);
    // The setup does block them: a plain program started the same way sees them blocked.
    let mut probe = with_blocked_signals(Command::new("grep"));
    let probe = probe
        .args(["SigBlk", "/proc/self/status"])
        .stderr(Stdio::null())
        .output()
        .expect("run the probe");
    let probe_mask = status_mask(&String::from_utf8_lossy(&probe.stdout), "SigBlk");
    assert_eq!(
        probe_mask & wanted,
        wanted,
        "the probe runs with them blocked"
    );

    let dir = TempDir::new();
    let socket = dir.path().join("execd.sock");
    let log = std::fs::File::create(dir.path().join("execd.log")).expect("log file");
    let mut cmd = with_blocked_signals(Command::new(env!("CARGO_BIN_EXE_execd")));
    cmd.arg("--socket")
        .arg(&socket)
        .args(["--kill-grace", "1s"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::from(log));
    let child = cmd.spawn().expect("spawn execd");
    let mut d = Daemon {
        child: Some(child),
        socket,
        dir,
    };
    let sock = d.socket.clone();
    wait_until("execd listens", || UnixStream::connect(&sock).is_ok());
    let mut c = d.client();

    // A command sees nothing blocked.
    let id = create(&mut c, "grep", &["SigBlk", "/proc/self/status"]);
    let exit = wait_exit(&mut c, &id);
    assert_eq!(exit["exitCode"], 0, "{exit}");
    let out = output(&mut c, &id);
    let text = out["output"].as_str().expect("output");
    assert_eq!(
        status_mask(text, "SigBlk"),
        0,
        "a command's SigBlk: {text:?}"
    );
    // In a bash command too.
    let r = ok(
        &mut c,
        "bash/exec",
        json!({"command": "grep SigBlk /proc/$$/status"}),
    );
    let text = r["stdout"].as_str().expect("stdout");
    assert_eq!(
        status_mask(text, "SigBlk"),
        0,
        "a bash command's SigBlk: {r}"
    );

    // The daemon itself no longer blocks what it handles by a handler; SIGCHLD it keeps
    // blocked, on purpose: it reads it from a signalfd.
    let status = std::fs::read_to_string(format!("/proc/{}/status", d.pid())).expect("status");
    let blocked = status_mask(&status, "SigBlk");
    assert_eq!(
        blocked & (handled & !sig_bit(libc::SIGCHLD)),
        0,
        "execd still blocks SIGTERM or SIGHUP"
    );
    assert_ne!(
        blocked & sig_bit(libc::SIGCHLD),
        0,
        "SIGCHLD is read, not handled"
    );

    // It reaps: exit codes come back.
    let id = create(&mut c, "sh", &["-c", "exit 3"]);
    assert_eq!(
        wait_exit(&mut c, &id),
        json!({"exitCode": 3, "signal": null})
    );
    assert!(zombie_children(d.pid()).is_empty(), "zombies left");

    // SIGHUP is caught, not fatal and not ignored-by-mask forever.
    let sleeper = create(&mut c, "sleep", &["30"]);
    let sleeper_pid = pid_of(&mut c, &sleeper);
    unsafe_kill(d.pid(), libc::SIGHUP);
    wait_until("the log mentions SIGHUP", || d.log().contains("SIGHUP"));
    let e = terminal_entry(&mut c, &sleeper);
    assert!(e.get("exitStatus").is_none(), "{e}");

    // SIGTERM stops it cleanly, taking the running command along.
    assert_eq!(d.terminate(), Some(0), "{}", d.log());
    assert!(!pid_alive(sleeper_pid), "the command outlived the daemon");
    assert_no_panic(&d);
}

/// A daemon started with SIGCHLD ignored (which makes the kernel reap children itself,
/// leaving `wait4` nothing) puts the default back: it learns its commands' exit codes,
/// and its commands start with SIGCHLD at the default.
#[test]
fn a_daemon_started_with_sigchld_ignored_still_reaps_its_commands() {
    let dir = TempDir::new();
    let socket = dir.path().join("execd.sock");
    let mut cmd = Daemon::command(dir.path(), &socket, &[]);
    // SAFETY: signal() is async-signal-safe and touches only the child's dispositions.
    unsafe {
        cmd.pre_exec(|| {
            if libc::signal(libc::SIGCHLD, libc::SIG_IGN) == libc::SIG_ERR {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let child = cmd.spawn().expect("spawn execd");
    let d = Daemon::adopt(Some(child), socket, dir);
    let mut c = d.client();
    let id = create(&mut c, "sh", &["-c", "exit 3"]);
    assert_eq!(
        wait_exit(&mut c, &id),
        json!({"exitCode": 3, "signal": null})
    );
    // Commands start with SIGCHLD at the default, not ignored as the daemon was started.
    let id = create(&mut c, "grep", &["SigIgn", "/proc/self/status"]);
    assert_eq!(wait_exit(&mut c, &id)["exitCode"], 0);
    let out = output(&mut c, &id);
    let text = out["output"].as_str().expect("output");
    assert_eq!(
        status_mask(text, "SigIgn") & sig_bit(libc::SIGCHLD),
        0,
        "a command's SigIgn: {text:?}"
    );
    // Nor does the daemon itself ignore it any more.
    let status = std::fs::read_to_string(format!("/proc/{}/status", d.pid())).expect("status");
    assert_eq!(
        status_mask(&status, "SigIgn") & sig_bit(libc::SIGCHLD),
        0,
        "execd's SigIgn: {status}"
    );
    assert_no_panic(&d);
}

/// Running out of descriptors on accept pauses accepting (no busy loop on a listener that
/// stays readable) and recovers: connections that waited in the backlog are served as
/// descriptors free up.
#[test]
fn running_out_of_descriptors_on_accept_backs_off_and_recovers() {
    const LIMIT: libc::rlim_t = 24;
    const CONNS: usize = 40;
    let dir = TempDir::new();
    let socket = dir.path().join("execd.sock");
    let log = std::fs::File::create(dir.path().join("execd.log")).expect("log file");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_execd"));
    cmd.arg("--socket")
        .arg(&socket)
        .args(["--kill-grace", "1s"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::from(log));
    // SAFETY: setrlimit is async-signal-safe and touches only a local value.
    unsafe {
        cmd.pre_exec(|| {
            let lim = libc::rlimit {
                rlim_cur: LIMIT,
                rlim_max: LIMIT,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &lim) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let child = cmd.spawn().expect("spawn execd");
    let d = Daemon::adopt(Some(child), socket.clone(), dir);

    // Far more connections than the daemon has descriptors for; each asks one thing.
    let mut conns: Vec<UnixStream> = (0..CONNS)
        .map(|i| {
            let mut s = UnixStream::connect(&d.socket).expect("connect (the backlog takes it)");
            let line = request(i as u64, "initialize", json!({"protocolVersion": 1}));
            s.write_all(format!("{line}\n").as_bytes()).expect("send");
            s.set_read_timeout(Some(WAIT)).expect("timeout");
            s
        })
        .collect();
    wait_until("execd says it pauses accepting", || {
        d.log().contains("pausing accepts")
    });
    // Every connection is answered in turn; closing each frees a descriptor for the next.
    for (i, s) in conns.drain(..).enumerate() {
        let mut reader = std::io::BufReader::new(s);
        let mut line = String::new();
        std::io::BufRead::read_line(&mut reader, &mut line)
            .unwrap_or_else(|e| panic!("connection {i} of {CONNS} never answered: {e}"));
        let v: Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line:?}"));
        assert_eq!(v["id"], i as u64, "{v}");
        assert_eq!(v["result"]["protocolVersion"], 1, "{v}");
    }
    // And it keeps serving.
    let mut c = d.client();
    let id = create(&mut c, "true", &[]);
    assert_eq!(wait_exit(&mut c, &id)["exitCode"], 0);
}

/// The drain at exit reads to the EOF that is already there, whatever order the loop
/// sees SIGCHLD and the pipe's readiness in: a stream that ended inside a character hands
/// out U+FFFD for it instead of holding the byte back as if more could come. The bad order
/// needs a command that exits before its pipe is registered, so several clients keep the
/// daemon busy to make it likely.
#[test]
fn a_finished_stream_never_holds_back_its_last_incomplete_character() {
    let d = Daemon::start(&[]);
    let socket = d.socket.clone();
    let workers: Vec<_> = (0..4)
        .map(|w| {
            let socket = socket.clone();
            std::thread::spawn(move || {
                let mut c = Client::connect(&socket).expect("connect");
                c.timeout = Some(WAIT);
                for round in 0..60 {
                    let r = ok(&mut c, "bash/exec", json!({"command": "printf 'a\\303'"}));
                    assert_eq!(r["stdout"], "a\u{fffd}", "worker {w} round {round}: {r}");
                    assert_eq!(r["offset"], 2, "worker {w} round {round}: {r}");
                    let id = create(&mut c, "printf", &["b\\303"]);
                    wait_exit(&mut c, &id);
                    let out = output(&mut c, &id);
                    assert_eq!(
                        out["output"], "b\u{fffd}",
                        "worker {w} round {round}: {out}"
                    );
                }
            })
        })
        .collect();
    for w in workers {
        w.join().expect("a worker saw a held-back character");
    }
}

/// A daemon whose stderr is a pipe nobody reads (a stuck journal stream, a paused
/// terminal) keeps serving: its log waits in a bounded queue and what does not fit is
/// counted, then reported once the reader comes back.
#[test]
fn a_stalled_log_reader_never_stops_the_daemon() {
    use std::os::fd::FromRawFd;
    let dir = TempDir::new();
    let socket = dir.path().join("execd.sock");
    let mut fds = [0i32; 2];
    // Close-on-exec, as every descriptor std makes: children other tests spawn meanwhile
    // must not hold either end (execd gets the write end as its stderr all the same).
    // SAFETY: a valid array for pipe2(2) to fill.
    assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
    // SAFETY: pipe(2) returned two fresh descriptors that nothing else owns.
    let (mut reader, writer) = unsafe {
        (
            std::fs::File::from_raw_fd(fds[0]),
            std::fs::File::from_raw_fd(fds[1]),
        )
    };
    let child = Command::new(env!("CARGO_BIN_EXE_execd"))
        .arg("--socket")
        .arg(&socket)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::from(writer))
        .spawn()
        .expect("spawn execd");
    let d = Daemon::adopt(Some(child), socket.clone(), dir);
    let mut c = d.client();
    // Each start logs its 10 KiB argument: 200 of them are 2 MiB of log, far more than
    // the 64 KiB pipe and the 1 MiB queue hold.
    let arg = "x".repeat(10 << 10);
    for _ in 0..200 {
        let id = create(&mut c, "true", &[&arg]);
        wait_exit(&mut c, &id);
        ok(
            &mut c,
            "terminal/release",
            json!({"sessionId": "s", "terminalId": id}),
        );
    }
    let init = ok(&mut c, "initialize", json!({}));
    assert_eq!(init["protocolVersion"], 1);
    // The reader comes back: the log drains and says what it lost.
    let mut text = Vec::new();
    let mut buf = vec![0u8; 1 << 16];
    wait_until("the drop report", || {
        // Reading makes room; a request makes the loop turn and write the next part.
        let _ = ok(&mut c, "terminal/list", json!({}));
        set_nonblocking(&reader);
        while let Ok(n) = reader.read(&mut buf) {
            if n == 0 {
                break;
            }
            text.extend_from_slice(&buf[..n]);
        }
        String::from_utf8_lossy(&text).contains("log line(s) dropped")
    });
}

fn set_nonblocking(f: &std::fs::File) {
    // SAFETY: fcntl on a descriptor this test owns.
    unsafe {
        let flags = libc::fcntl(f.as_raw_fd(), libc::F_GETFL);
        libc::fcntl(f.as_raw_fd(), libc::F_SETFL, flags | libc::O_NONBLOCK);
    }
}

/// A request's environment: a name given twice takes its last value, over the daemon's
/// own; tens of thousands of names (just under the message limit) are taken in stride.
#[test]
fn a_request_environment_with_many_and_repeated_names() {
    let d = Daemon::start(&[]);
    let mut c = d.client();
    let mut env: Vec<Value> = (0..30_000)
        .map(|i| json!({"name": format!("V{i}"), "value": "x"}))
        .collect();
    env.push(json!({"name": "PATH", "value": "/nonexistent"}));
    env.push(json!({"name": "DUP", "value": "first"}));
    env.push(json!({"name": "PATH", "value": "/usr/bin:/bin"}));
    env.push(json!({"name": "DUP", "value": "last"}));
    let id = create_with(
        &mut c,
        json!({"sessionId": "s", "command": "/bin/sh",
               "args": ["-c", "echo $DUP $PATH $V29999; env | grep -c '^V'"], "env": env}),
    );
    wait_exit(&mut c, &id);
    assert_eq!(
        output(&mut c, &id)["output"],
        "last /usr/bin:/bin x\n30000\n"
    );
}

/// KiB of its own code that process `pid` (execd or its reader) has mapped: its
/// executable's `r-xp` mappings in `/proc/PID/smaps`; `None` once it is gone.
fn own_code_kb(pid: i32) -> Option<u64> {
    let smaps = std::fs::read_to_string(format!("/proc/{pid}/smaps")).ok()?;
    let exe = std::fs::read_link(format!("/proc/{pid}/exe")).ok()?;
    let exe = exe.to_string_lossy();
    let mut ours = false;
    let mut kb = 0;
    for line in smaps.lines() {
        let mut words = line.split_whitespace();
        let first = words.next().unwrap_or_default();
        if first.contains('-') && !first.ends_with(':') {
            let perms = words.next().unwrap_or_default();
            ours = perms == "r-xp" && line.ends_with(exe.as_ref());
        } else if ours && first == "Rss:" {
            kb += words
                .next()
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(0);
        }
    }
    Some(kb)
}

/// Times the threads of process `pid` were switched out, voluntarily or not.
fn switches(pid: i32) -> u64 {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return 0;
    };
    tasks
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("status")).ok())
        .flat_map(|status| {
            status
                .lines()
                .filter(|l| l.contains("ctxt_switches:"))
                .filter_map(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
                .collect::<Vec<_>>()
        })
        .sum()
}

/// A daemon that has been quiet for a while unmaps the pages of its own code and gives
/// back its read buffers, and its off-loop reader gives back its code too (execd(8),
/// IDLE): also while a command with its stdin open is looked at every 700 ms, which is
/// not activity. Once nothing runs but a shell session at its prompt, neither process
/// wakes. What comes next maps back
/// what it runs and is served as before: a command's output, both streams, a new
/// connection (whose peer the reader reads).
#[test]
fn a_quiet_daemon_gives_its_code_pages_back_sleeps_and_serves_on() {
    let d = Daemon::start(&["--log-level", "debug"]);
    let given = |d: &Daemon| d.log().matches("idle: giving back").count();
    // The reader starts for the first connection's peer; measured at once, it has not
    // been there long enough to give anything back. A reader that is not root's cannot
    // be looked at (it is undumpable) by a test that is not root.
    let mut c = d.client();
    let init = ok(&mut c, "initialize", json!({"protocolVersion": 1}));
    let reader_busy = reader_of(d.pid()).and_then(own_code_kb);
    if reader_busy.is_none() {
        eprintln!("skipped the reader's part: its /proc files are root's to read");
    }
    // Work that runs much of the daemon, measured before it has been quiet: tried again
    // in the unlikely case the give-back came between the work and the measure.
    let (mut busy, mut spares) = (0, Vec::new());
    for _ in 0..3 {
        let before = given(&d);
        let id = create(&mut c, "sh", &["-c", "echo out; echo more"]);
        wait_exit(&mut c, &id);
        assert_eq!(output(&mut c, &id)["output"], "out\nmore\n");
        ok(
            &mut c,
            "terminal/release",
            json!({"sessionId": "s", "terminalId": id}),
        );
        busy = own_code_kb(d.pid()).unwrap_or(0);
        // (Named by its first step: given a moment.)
        let named = std::time::Instant::now() + std::time::Duration::from_millis(500);
        spares = spares_of(d.pid());
        while spares.is_empty() && spares_expected(&init) && std::time::Instant::now() < named {
            std::thread::sleep(std::time::Duration::from_millis(5));
            spares = spares_of(d.pid());
        }
        if given(&d) == before {
            break;
        }
    }
    assert!(busy > 0, "the daemon's code is mapped while it works");
    if spares_expected(&init) {
        assert_eq!(
            spares.len(),
            1,
            "a spare waits for the next spawn: {spares:?}"
        );
    } else {
        eprintln!("no spares here (Landlock cannot scope signals): {init}");
    }

    // A command that waits on its open stdin: looked at every 700 ms, through the reader
    // where it may.
    let r = ok(
        &mut c,
        "bash/exec",
        json!({"command": "cat", "async_mode": true}),
    );
    let cat = r["session_id"].as_str().expect("session_id").to_string();
    let before = given(&d);
    wait_until(
        "the quiet daemon gives back while a command is looked at",
        || given(&d) > before,
    );

    // Once nothing runs, the code stays given back and neither the loop nor the reader
    // (its watchdog included) wakes for a second (one of three, should a page fault or
    // the last look still be on its way at the first).
    ok(
        &mut c,
        "bash/kill",
        json!({"session_id": cat, "signal": "SIGKILL"}),
    );
    // A shell session left open at its prompt is not looked at: it keeps nobody awake.
    let r = ok(
        &mut c,
        "shell/exec",
        json!({"id": "w", "command": "echo hi"}),
    );
    assert_eq!(r["exit_code"], 0, "{r}");
    let before = given(&d);
    wait_until(
        "the daemon gives back again after the command ended",
        || given(&d) > before,
    );
    wait_until("most of the daemon's code unmapped", || {
        own_code_kb(d.pid()).is_some_and(|kb| kb < busy / 2)
    });
    if let Some(reader_busy) = reader_busy {
        // (A reader replaced meanwhile, as one whose read took too long on a loaded host
        // is, gives back as well.)
        wait_until("most of the reader's code unmapped", || {
            reader_of(d.pid())
                .and_then(own_code_kb)
                .is_some_and(|kb| kb < reader_busy / 2)
        });
    }
    // The spare made for the next spawn stays, and sleeps too.
    let spare = spares_of(d.pid());
    if spares_expected(&init) {
        assert_eq!(spare.len(), 1, "the spare stays: {spare:?}");
    }
    let asleep = (0..3).any(|_| {
        let woke = || {
            switches(d.pid())
                + reader_of(d.pid()).map_or(0, switches)
                + spare.iter().map(|&p| switches(p)).sum::<u64>()
        };
        let at = woke();
        std::thread::sleep(std::time::Duration::from_secs(1));
        woke() == at
    });
    assert!(
        asleep,
        "an idle daemon, its reader and its spare do not wake"
    );

    let r = ok(
        &mut c,
        "bash/exec",
        json!({"command": "printf hello; printf oops >&2; exit 3"}),
    );
    assert_eq!(
        (&r["stdout"], &r["stderr"], &r["exit_code"]),
        (&json!("hello"), &json!("oops"), &json!(3)),
        "{r}"
    );
    let mut other = d.client();
    let id = create(&mut other, "echo", &["again"]);
    assert_eq!(wait_exit(&mut other, &id)["exitCode"], 0);
    assert_eq!(output(&mut other, &id)["output"], "again\n");
}
