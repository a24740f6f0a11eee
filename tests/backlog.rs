//! Bounds on what a client that does not read its answers can make the daemon hold:
//! pipelined HTTP requests behind a long poll, and parked waits whose answers carry
//! output, rendered only when their connection has room; and pipelined bursts that all
//! complete (PROTOCOL.md sections 2, 8 and 11).

use std::io::Write;
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use crate::util::*;

const MIB: u64 = 1 << 20;

/// Starts an async bash command and returns its session id.
fn async_exec(c: &mut Client, command: &str) -> String {
    ok(
        c,
        "bash/exec",
        json!({"command": command, "async_mode": true}),
    )["session_id"]
        .as_str()
        .expect("session_id")
        .to_string()
}

/// Reads from `s` until `count` HTTP responses have arrived (bounded by `WAIT`); returns
/// their status lines in order.
fn read_statuses(s: &mut UnixStream, count: usize) -> Vec<String> {
    const STATUS: &[u8] = b"HTTP/1.1 ";
    s.set_read_timeout(Some(WAIT)).expect("read timeout");
    let mut got = Vec::new();
    let mut scanned = 0;
    let mut statuses = Vec::new();
    let mut buf = vec![0u8; 64 << 10];
    // A hundred megabytes of answers through a debug build on a loaded two-core machine
    // can take longer than one WAIT; still bounded.
    let deadline = Instant::now() + WAIT * 3;
    while statuses.len() < count {
        assert!(
            Instant::now() < deadline,
            "{} of {count} responses",
            statuses.len()
        );
        match read_some(s, &mut buf) {
            Ok(0) => panic!("closed after {} of {count} responses", statuses.len()),
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) => panic!("read after {} of {count} responses: {e}", statuses.len()),
        }
        // A body ends without CRLF, right before the next status line; a status line is
        // taken once its CRLF has arrived.
        loop {
            let Some(at) = got[scanned..]
                .windows(STATUS.len())
                .position(|w| w == STATUS)
            else {
                // Nothing up to here starts a status line: skip it next time.
                scanned = got.len().saturating_sub(STATUS.len()).max(scanned);
                break;
            };
            let start = scanned + at;
            let Some(len) = got[start..].windows(2).position(|w| w == b"\r\n") else {
                scanned = start;
                break;
            };
            statuses.push(String::from_utf8_lossy(&got[start..start + len]).into_owned());
            scanned = start + len;
        }
    }
    statuses
}

/// Requests pipelined behind a long poll are not all read and answered into memory: the
/// daemon takes a bounded number in flight (answers held behind the poll count against
/// `--client-buffer`), stays small and serves other clients, and answers every request
/// in order once the poll ends.
#[test]
fn http_requests_pipelined_behind_a_long_poll_stay_bounded() {
    const PIPELINED: usize = 200;
    let d = Daemon::start(&[]);
    let mut c = d.client();
    let quiet = async_exec(&mut c, "sleep 30");
    // Each answer about it carries 500 KB.
    let big = async_exec(&mut c, "head -c 500000 /dev/zero | tr '\\0' a; sleep 30");
    wait_until("500 KB of output", || {
        let out = ok(&mut c, "bash/output", json!({"session_id": big}));
        out["stdout"].as_str().map_or(0, str::len) == 500_000
    });
    let idle_kb = d.rss_kb();

    let mut s = UnixStream::connect(&d.socket).expect("connect");
    let post = |params: Value| {
        let body = params.to_string();
        format!(
            "POST /v1/bash/output HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
    };
    let mut bytes = post(json!({"session_id": quiet, "wait": true, "wait_timeout": 30}));
    for _ in 0..PIPELINED {
        bytes.push_str(&post(json!({"session_id": big})));
    }
    // The daemon stops reading once enough is in flight, so write from a thread.
    let mut w = s.try_clone().expect("clone");
    let writer = std::thread::spawn(move || w.write_all(bytes.as_bytes()));

    // Another client is answered meanwhile.
    ok(&mut c, "bash/sessions", json!({}));
    std::thread::sleep(Duration::from_millis(500));
    let rss_kb = d.rss_kb();
    assert!(
        rss_kb < idle_kb + 16 * 1024,
        "RSS went from {idle_kb} KiB to {rss_kb} KiB with requests pipelined behind a poll"
    );

    // Ending the command ends the poll; every request is then answered, in order.
    ok(
        &mut c,
        "bash/kill",
        json!({"session_id": quiet, "signal": "SIGKILL"}),
    );
    let statuses = read_statuses(&mut s, PIPELINED + 1);
    assert!(
        statuses.iter().all(|l| l == "HTTP/1.1 200 OK"),
        "{statuses:?}"
    );
    writer.join().expect("writer").expect("write the requests");
}

/// Writes `lines` on a second handle of `sock` from a thread (the daemon may stop reading
/// until answers are read), while the caller reads; returns the thread.
fn write_from_thread(sock: &UnixStream, lines: Vec<String>) -> std::thread::JoinHandle<()> {
    let mut w = sock.try_clone().expect("clone the socket");
    std::thread::spawn(move || {
        for l in lines {
            w.write_all(l.as_bytes()).expect("write a request");
            w.write_all(b"\n").expect("write a newline");
        }
    })
}

/// Reads responses from `sock` until `n` arrived (each read bounded by `WAIT`), keyed by id.
fn read_responses(sock: &UnixStream, n: usize) -> std::collections::HashMap<u64, Value> {
    use std::io::BufRead;
    sock.set_read_timeout(Some(WAIT)).expect("read timeout");
    let mut r = std::io::BufReader::new(sock.try_clone().expect("clone the socket"));
    let mut got = std::collections::HashMap::new();
    let mut line = String::new();
    while got.len() < n {
        line.clear();
        match r.read_line(&mut line) {
            Ok(0) => panic!("EOF after {} responses", got.len()),
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => panic!("after {} responses: {e}", got.len()),
        }
        let v: Value = serde_json::from_str(&line).expect("a JSON line");
        if let Some(id) = v["id"].as_u64() {
            got.insert(id, v);
        }
    }
    got
}

/// A burst of 1,000 synchronous `bash/exec` written at once on one connection is carried
/// out whole: every request is answered with its own command's output, none refused.
#[test]
fn a_pipelined_burst_of_a_thousand_synchronous_execs_all_complete() {
    const N: u64 = 1000;
    let d = Daemon::start(&[]);
    let sock = UnixStream::connect(&d.socket).expect("connect");
    let lines = (0..N)
        .map(|i| {
            let params = json!({"command": format!("echo {i}"), "session_id": "burst"});
            request(i, "bash/exec", params)
        })
        .collect();
    let writer = write_from_thread(&sock, lines);
    let got = read_responses(&sock, N as usize);
    writer.join().expect("writer");
    for i in 0..N {
        let r = &got[&i];
        assert!(r.get("error").is_none(), "request {i}: {r}");
        assert_eq!(r["result"]["stdout"], format!("{i}\n"), "request {i}");
        assert_eq!(r["result"]["exit_code"], 0, "request {i}");
    }
    assert_no_panic(&d);
}

/// A burst of many more cheap requests than a turn of the loop takes from one connection
/// (`REQUESTS_PER_TURN`, 64), in the socket at once, is answered whole: the loop comes
/// back for what is left in the following turns with no new event to wake it (the burst
/// is written while the daemon is stopped, so its arrival is one event).
#[test]
fn a_burst_of_fifteen_hundred_requests_is_answered_whole_across_turns() {
    const N: u64 = 1_500;
    let d = Daemon::start(&[]);
    let sock = UnixStream::connect(&d.socket).expect("connect");
    let mut other = d.client();
    ok(&mut other, "initialize", json!({}));
    let burst: String = (0..N)
        .map(|i| {
            let params = json!({"sessionId": "s", "terminalId": format!("none-{i}")});
            request(i, "terminal/output", params) + "\n"
        })
        .collect();
    // About 155 KiB, which a Unix socket's default buffer (208 KiB) holds: the write is
    // done before the daemon goes on. (Where it does not fit, the daemon goes on after
    // 2 s and the burst arrives in pieces, each an event.)
    unsafe_kill(d.pid(), libc::SIGSTOP);
    let mut w = sock.try_clone().expect("clone the socket");
    let writer = std::thread::spawn(move || w.write_all(burst.as_bytes()).expect("the burst"));
    let deadline = Instant::now() + Duration::from_secs(2);
    while !writer.is_finished() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    unsafe_kill(d.pid(), libc::SIGCONT);
    let got = read_responses(&sock, N as usize);
    writer.join().expect("writer");
    for i in 0..N {
        let e = &got[&i]["error"];
        assert!(
            e["message"]
                .as_str()
                .is_some_and(|m| m.contains(&format!("none-{i}"))),
            "request {i}: {}",
            got[&i]
        );
    }
    ok(&mut other, "initialize", json!({}));
    assert_no_panic(&d);
}

/// A peer that writes a burst of more than a turn's worth and hangs up at once has all
/// of it carried out, not a turn's worth: its last pass is not held to the budget.
#[test]
fn a_peer_that_hangs_up_after_a_burst_has_all_of_it_carried_out() {
    const N: usize = 150;
    let d = Daemon::start(&[]);
    let mut c = d.client();
    let ids: Vec<String> = (0..N).map(|_| create(&mut c, "sleep", &["60"])).collect();
    let burst: String = ids
        .iter()
        .enumerate()
        .map(|(i, id)| {
            let params = json!({"sessionId": "s", "terminalId": id});
            request(i as u64, "terminal/release", params) + "\n"
        })
        .collect();
    // Written and hung up while the daemon is stopped: it finds the burst and the
    // hang-up in one event.
    let sock = UnixStream::connect(&d.socket).expect("connect");
    unsafe_kill(d.pid(), libc::SIGSTOP);
    (&sock).write_all(burst.as_bytes()).expect("the burst");
    drop(sock);
    unsafe_kill(d.pid(), libc::SIGCONT);
    wait_until("every terminal released", || {
        ids.iter().all(|id| {
            let r = c.call(
                "terminal/output",
                json!({"sessionId": "s", "terminalId": id}),
            );
            matches!(r, Err(CallError::Rpc { .. }))
        })
    });
    assert_no_panic(&d);
}

/// A connection that parks many waits whose answers carry output and reads none of them
/// makes the daemon hold its buffer plus one answer in bytes, not one answer per wait:
/// the rest wait as references to the output. Read later, every answer arrives whole.
#[test]
fn unread_answers_cost_a_buffer_not_an_answer_each() {
    const WAITS: u64 = 100;
    let d = Daemon::start(&["--client-buffer", "64K"]);
    let mut c = d.client();
    // When told to, writes 1 MiB in 64 KiB writes. A 64 KiB write lands in the empty
    // pipe whole before the daemon is woken, so every wait is answered with at least 64
    // KiB: rendered at once, the answers would come to 100 times that (25 MiB of JSON).
    let (go, wait) = gate(&d, "go");
    let session = async_exec(
        &mut c,
        &format!("{wait}; dd if=/dev/zero bs=64k count=16 2>/dev/null; sleep 30"),
    );
    let idle_kb = d.rss_kb();
    let sock = UnixStream::connect(&d.socket).expect("connect");
    let params = json!({"session_id": session, "wait": true, "wait_timeout": 30});
    let lines = (0..WAITS)
        .map(|i| request(i, "bash/output", params.clone()))
        .collect();
    write_from_thread(&sock, lines).join().expect("writer");
    // Every wait parked, then answered while nobody reads.
    std::thread::sleep(Duration::from_millis(300));
    open_gate(&go);
    wait_until("the command wrote its output", || {
        let out = ok(&mut c, "bash/output", json!({"session_id": session}));
        out["stdout"].as_str().map_or(0, str::len) >= MIB as usize
    });
    let rss_kb = d.rss_kb();
    assert!(
        rss_kb < idle_kb + 8 * 1024,
        "RSS went from {idle_kb} KiB to {rss_kb} KiB"
    );
    // Read now: each answer is whole (its output from offset 0, at least the first write).
    let got = read_responses(&sock, WAITS as usize);
    for i in 0..WAITS {
        let r = &got[&i];
        assert!(r.get("error").is_none(), "wait {i}: {}", r["error"]);
        let out = r["result"]["stdout"].as_str().expect("stdout");
        assert!(out.len() >= 64 << 10, "wait {i}: {} bytes", out.len());
        assert!(out.bytes().all(|b| b == 0), "wait {i}");
    }
    // The daemon went on serving throughout, and goes on.
    ok(&mut c, "bash/sessions", json!({}));
    assert_no_panic(&d);
}

/// A connection held back (a full pipeline, or answers held behind a slow request that
/// fill its buffer) costs no CPU while it waits: the loop sleeps until the slow request is
/// answered instead of re-reading it every turn.
#[test]
fn a_held_back_http_connection_costs_no_cpu() {
    let d = Daemon::start(&["--client-buffer", "64K"]);
    let mut c = d.client();
    let big = async_exec(&mut c, "head -c 200000 /dev/zero | tr '\\0' a; sleep 30");
    wait_until("200 KB of output", || {
        let out = ok(&mut c, "bash/output", json!({"session_id": big}));
        out["stdout"].as_str().map_or(0, str::len) == 200_000
    });
    let post = |path: &str, params: Value| {
        let body = params.to_string();
        format!(
            "POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
    };
    let slow = post(
        "/v1/bash/exec",
        json!({"command": "sleep 4", "timeout": 30}),
    );
    // A full pipeline behind the slow request.
    let mut full = UnixStream::connect(&d.socket).expect("connect");
    let mut bytes = slow.clone();
    for _ in 0..40 {
        bytes.push_str("GET /v1/bash/sessions HTTP/1.1\r\nHost: x\r\n\r\n");
    }
    full.write_all(bytes.as_bytes()).expect("write");
    // An answer bigger than the buffer held behind the slow request.
    let mut held = UnixStream::connect(&d.socket).expect("connect");
    let bytes = slow + &post("/v1/bash/output", json!({"session_id": big}));
    held.write_all(bytes.as_bytes()).expect("write");

    std::thread::sleep(Duration::from_millis(500));
    let before = cpu_ticks(d.pid());
    std::thread::sleep(Duration::from_secs(2));
    let used = cpu_ticks(d.pid()) - before;
    // Spinning would be about 200; an idle loop is 0 or 1.
    assert!(used <= 15, "the daemon used {used} ticks of CPU in 2 s");
    assert_eq!(read_statuses(&mut full, 41).len(), 41);
    assert_eq!(read_statuses(&mut held, 2).len(), 2);
}
