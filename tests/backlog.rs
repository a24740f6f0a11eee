//! Bounds on what a client that does not read its answers can make the daemon hold:
//! pipelined HTTP requests behind a long poll, parked waits whose answers carry output,
//! and answers piling up for a connection that never reads (PROTOCOL.md sections 2, 8
//! and 11).

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
    let deadline = Instant::now() + WAIT;
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

/// Waits whose answers carry output are bounded per connection: past the bound they are
/// refused with `-32003 waiting-output`, and another connection may still wait.
#[test]
fn waits_that_answer_with_output_are_bounded_per_connection() {
    const BOUND: usize = 32;
    let d = Daemon::start(&[]);
    let mut c = d.client();
    let session = async_exec(&mut c, "sleep 30");
    let mut w = d.client();
    let params = json!({"session_id": session, "wait": true, "wait_timeout": 30});
    let ids: Vec<u64> = (0..BOUND + 3)
        .map(|_| w.send("bash/output", params.clone()).expect("send"))
        .collect();
    for &id in &ids[BOUND..] {
        let e = w.wait_response(id).expect_err("refused past the bound");
        assert_eq!(e.code(), Some(-32003), "{e:?}");
        let CallError::Rpc { data, .. } = &e else {
            panic!("{e:?}")
        };
        assert_eq!(
            data,
            &Some(json!({"limit": "waiting-output", "value": BOUND}))
        );
    }
    // A synchronous exec waits the same way and is refused before it starts.
    let e = w
        .call(
            "bash/exec",
            json!({"command": "touch started", "exec_dir": d.dir.path()}),
        )
        .expect_err("refused");
    assert_eq!(e.code(), Some(-32003), "{e:?}");
    assert!(!d.dir.path().join("started").exists(), "nothing started");
    // Other connections are not affected; the parked waits end with the command.
    let mut other = d.client();
    let id = other.send("bash/output", params.clone()).expect("send");
    ok(
        &mut c,
        "bash/kill",
        json!({"session_id": session, "signal": "SIGKILL"}),
    );
    other.wait_response(id).expect("answered at the exit");
    for &id in &ids[..BOUND] {
        w.wait_response(id).expect("answered at the exit");
    }
}

/// A connection that parks waits and never reads their answers is closed once what
/// connections are owed passes `--max-output-memory`; a client reading its answers is
/// untouched, and the daemon stays within the budget.
#[test]
fn a_client_piling_up_unread_answers_is_closed_at_the_budget() {
    let d = Daemon::start(&["--max-output-memory", "4M", "--client-buffer", "64K"]);
    let mut c = d.client();
    // When told to, writes 1 MiB in 64 KiB writes. A 64 KiB write lands in the empty
    // pipe whole before the daemon is woken, so every parked wait is answered with at
    // least 64 KiB of NULs: 384 KiB of JSON each, 12 MiB for the 32, three times the
    // budget whatever the scheduling. (`head` writes 8 KiB at a time: answered at its
    // first write, the 32 answers came to 1.5 MiB and nothing was closed.)
    let fifo = d.dir.path().join("go");
    let status = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .expect("mkfifo");
    assert!(status.success());
    let session = async_exec(
        &mut c,
        &format!(
            "read x < {}; dd if=/dev/zero bs=64k count=16 2>/dev/null; sleep 30",
            fifo.display()
        ),
    );
    let idle_kb = d.rss_kb();
    let mut piler = d.client();
    let params = json!({"session_id": session, "wait": true, "wait_timeout": 30});
    for _ in 0..32 {
        piler.send("bash/output", params.clone()).expect("send");
    }
    let mut reader = d.client();
    let id = reader.send("bash/output", params.clone()).expect("send");
    std::thread::sleep(Duration::from_millis(200)); // every wait parked
    std::fs::write(&fifo, "go\n").expect("write the fifo");

    let answer = reader
        .wait_response(id)
        .expect("the reading client is answered");
    assert!(answer["stdout"].as_str().is_some_and(|s| !s.is_empty()));
    wait_until("the piling connection is closed", || {
        d.log().contains("bytes of answers unread")
    });
    let rss_kb = d.rss_kb();
    assert!(
        rss_kb < idle_kb + 24 * 1024,
        "RSS went from {idle_kb} KiB to {rss_kb} KiB"
    );
    // Its socket reaches EOF after whatever was written before the close.
    let sock = piler.raw_reader().get_mut();
    sock.set_read_timeout(Some(WAIT)).expect("timeout");
    let mut sink = vec![0u8; 1 << 20];
    let mut total = 0u64;
    loop {
        match read_some(sock, &mut sink) {
            Ok(0) => break,
            Ok(n) => total += n as u64,
            Err(e) => panic!("no EOF after {total} bytes: {e}"),
        }
    }
    assert!(total < 32 * MIB, "{total} bytes");
    // The daemon goes on serving.
    ok(&mut c, "bash/sessions", json!({}));
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
