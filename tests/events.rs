//! Live output events (PROTOCOL.md section 6): `events/subscribe`, `events/unsubscribe`,
//! and the `Output`, `Gap` and `Exit` notifications, against the real daemon.
//!
//! Commands that must not start producing before the test has subscribed wait for a gate
//! file (`gate`), so no test depends on how fast a command or the daemon runs.

use crate::util::*;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// Bytes in the big streams.
const MIB: u64 = 1 << 20;

/// One notification, checked for the wire shape, split into type and payload.
#[track_caller]
fn next_event(c: &mut Client) -> (String, Value) {
    let n = c
        .next_notification(Some(WAIT))
        .unwrap_or_else(|e| panic!("no event within {WAIT:?}: {e}"));
    assert_eq!(n["jsonrpc"], "2.0", "{n}");
    assert_eq!(n["method"], "event", "{n}");
    assert!(n.get("id").is_none(), "a notification has no id: {n}");
    let kind = n["params"]["type"]
        .as_str()
        .unwrap_or_else(|| panic!("event without a type: {n}"))
        .to_string();
    (kind, n["params"]["payload"].clone())
}

/// What one stream of a subscription delivered.
#[derive(Default, Debug)]
struct StreamLog {
    /// The offset the next event must carry: data bytes plus skipped bytes so far.
    pos: u64,
    /// Concatenated `Output` data (only when the subscription keeps data).
    data: Vec<u8>,
    /// Data bytes received.
    data_bytes: u64,
    /// `(offset, skipped)` of each `Gap`.
    gaps: Vec<(u64, u64)>,
    /// Number of `Output` events.
    outputs: usize,
    /// Offset of the first `Output`.
    first_output: Option<u64>,
}

type Check = Box<dyn FnMut(&str, u64, &str)>;

/// One subscription's events, with offsets checked as they arrive: each `Output` and
/// `Gap` must start where the previous data and gaps of its stream ended.
struct Subscription {
    id: String,
    streams: BTreeMap<String, StreamLog>,
    /// Event types in arrival order.
    kinds: Vec<String>,
    exit: Option<Value>,
    keep: bool,
    check: Option<Check>,
}

impl Subscription {
    fn new(id: &str) -> Subscription {
        Subscription {
            id: id.to_string(),
            streams: BTreeMap::new(),
            kinds: Vec::new(),
            exit: None,
            keep: true,
            check: None,
        }
    }

    /// Expect `stream`'s first event at `offset` (the subscribe offset).
    fn from(mut self, stream: &str, offset: u64) -> Subscription {
        self.streams.entry(stream.to_string()).or_default().pos = offset;
        self
    }

    /// Check data chunk by chunk instead of keeping it.
    fn checking(mut self, check: impl FnMut(&str, u64, &str) + 'static) -> Subscription {
        self.keep = false;
        self.check = Some(Box::new(check));
        self
    }

    /// Reads and accounts for one event.
    #[track_caller]
    fn take(&mut self, c: &mut Client) {
        let (kind, p) = next_event(c);
        assert_eq!(
            p["id"],
            self.id.as_str(),
            "event for another id: {kind} {p}"
        );
        assert!(
            self.exit.is_none(),
            "{kind} after Exit: {p} (exit was {:?})",
            self.exit
        );
        self.kinds.push(kind.clone());
        match kind.as_str() {
            "Output" => {
                let stream = p["stream"].as_str().expect("stream").to_string();
                let offset = p["offset"].as_u64().expect("offset");
                let data = p["data"].as_str().expect("data");
                assert!(!data.is_empty(), "empty Output: {p}");
                let log = self.streams.entry(stream.clone()).or_default();
                assert_eq!(
                    offset, log.pos,
                    "Output offset on {stream} must continue from data + gaps so far"
                );
                if let Some(check) = &mut self.check {
                    check(&stream, offset, data);
                }
                if self.keep {
                    log.data.extend_from_slice(data.as_bytes());
                }
                log.first_output.get_or_insert(offset);
                log.data_bytes += data.len() as u64;
                log.outputs += 1;
                log.pos += data.len() as u64;
            }
            "Gap" => {
                let stream = p["stream"].as_str().expect("stream").to_string();
                let offset = p["offset"].as_u64().expect("offset");
                let skipped = p["skipped"].as_u64().expect("skipped");
                let log = self.streams.entry(stream.clone()).or_default();
                assert_eq!(
                    offset, log.pos,
                    "Gap offset on {stream} must continue from data + gaps so far"
                );
                assert!(skipped > 0, "a Gap that skips nothing: {p}");
                log.gaps.push((offset, skipped));
                log.pos += skipped;
            }
            "Exit" => {
                for k in [
                    "exitCode",
                    "signal",
                    "status",
                    "durationMs",
                    "userMs",
                    "systemMs",
                    "maxRssKb",
                ] {
                    assert!(p.get(k).is_some(), "Exit without {k}: {p}");
                }
                for k in ["durationMs", "userMs", "systemMs", "maxRssKb"] {
                    assert!(p[k].is_u64(), "Exit {k} is not a count: {p}");
                }
                self.exit = Some(p);
            }
            other => panic!("unknown event type {other}: {p}"),
        }
    }

    /// Reads events until `done` holds (bounded: each read waits at most `WAIT`, and the
    /// whole loop at most `limit`).
    #[track_caller]
    fn until(
        &mut self,
        c: &mut Client,
        what: &str,
        limit: Duration,
        done: impl Fn(&Subscription) -> bool,
    ) {
        let deadline = Instant::now() + limit;
        while !done(self) {
            assert!(
                Instant::now() < deadline,
                "timed out after {limit:?} waiting for {what}; events so far: {:?}",
                self.kinds.len()
            );
            self.take(c);
        }
    }

    /// Reads events until `Exit`; returns its payload.
    #[track_caller]
    fn until_exit(&mut self, c: &mut Client) -> Value {
        self.until(c, "Exit", WAIT, |s| s.exit.is_some());
        self.exit.clone().expect("exit")
    }

    fn log(&self, stream: &str) -> &StreamLog {
        self.streams
            .get(stream)
            .unwrap_or_else(|| panic!("no events on stream {stream}"))
    }

    fn text(&self, stream: &str) -> String {
        String::from_utf8(self.log(stream).data.clone()).expect("UTF-8")
    }
}

/// `events/subscribe` with the given params; checks the `{}` answer comes before any event.
#[track_caller]
fn subscribe(c: &mut Client, params: Value) {
    let r = ok(c, "events/subscribe", params.clone());
    assert_eq!(r, json!({}), "subscribe {params}");
    assert!(
        c.notifications.is_empty(),
        "events arrived before the subscribe response: {:?}",
        c.notifications
    );
}

/// Creates a terminal in session `s` running `sh -c script`, with optional ring capacity.
#[track_caller]
fn create_sh(c: &mut Client, script: &str, limit: Option<u64>) -> String {
    let mut params = json!({"sessionId": "s", "command": "sh", "args": ["-c", script]});
    if let Some(l) = limit {
        params["outputByteLimit"] = json!(l);
    }
    let r = ok(c, "terminal/create", params);
    r["terminalId"].as_str().expect("terminalId").to_string()
}

/// The byte at `offset` of `yes abcdefghij`.
fn yes_byte(offset: u64) -> u8 {
    b"abcdefghij\n"[(offset % 11) as usize]
}

// ---- a reader that keeps up ----------------------------------------------------------------

/// 50 MiB through the default daemon to a subscriber reading as fast as it can.
///
/// A Gap is legitimate here and therefore allowed (but accounted for): with the default
/// 1 MiB ring and 4 MiB `--client-buffer`, `yes` can outrun a debug-build test decoding
/// JSON, and section 6 says a subscriber that reads too slowly gets a `Gap` instead of
/// making the daemon buffer. Every byte that does arrive must be the right byte at its
/// offset, and data plus skipped bytes must add up to exactly 50 MiB. The exact,
/// gap-free reassembly is asserted by the next test, whose reader cannot fall behind.
#[test]
fn fifty_mib_arrive_in_order_with_consistent_offsets() {
    let d = Daemon::start(&[]);
    let mut c = d.client();
    let total = 50 * MIB;
    let (go, wait) = gate(&d, "go");
    let id = create_sh(
        &mut c,
        &format!("{wait}; yes abcdefghij | head -c {total}"),
        None,
    );
    subscribe(&mut c, json!({"id": id}));
    open_gate(&go);
    let mut sub = Subscription::new(&id).checking(|stream, offset, data| {
        assert_eq!(stream, "output");
        for (i, b) in data.bytes().enumerate() {
            let at = offset + i as u64;
            if b != yes_byte(at) {
                panic!("wrong byte {b:#x} at offset {at}");
            }
        }
    });
    sub.until(&mut c, "Exit", WAIT * 6, |s| s.exit.is_some());
    let exit = sub.exit.clone().expect("exit");
    assert_eq!(exit["exitCode"], 0, "{exit}");
    assert_eq!(exit["signal"], Value::Null, "{exit}");
    assert_eq!(exit["status"], "completed", "{exit}");
    let log = sub.log("output");
    let skipped: u64 = log.gaps.iter().map(|g| g.1).sum();
    assert_eq!(log.pos, total, "data + gaps must cover the whole stream");
    assert_eq!(log.data_bytes + skipped, total);
    assert!(log.data_bytes > 0);
    if !log.gaps.is_empty() {
        eprintln!(
            "note: the reader fell behind: {} gap(s), {skipped} bytes skipped",
            log.gaps.len()
        );
    }
    assert_eq!(sub.streams.len(), 1, "a terminal has one stream");
}

/// A reader that keeps up, with the default 1 MiB ring, gets everything: no Gap, and the
/// reassembled stream equals `yes abcdefghij | head -c 50M` byte for byte.
///
/// "Keeps up" as the daemon sees it: the connection buffer (`--client-buffer 64M`) holds
/// the whole encoded stream (about 55 MiB), so the subscriber never lags, whatever the
/// speed of this debug-build reader. A Gap could then only come from the daemon letting
/// the ring overwrite bytes it had not yet handed to a subscriber with room.
#[test]
fn fifty_mib_reassembled_byte_for_byte_by_a_reader_that_keeps_up() {
    let d = Daemon::start(&["--client-buffer", "64M"]);
    let mut c = d.client();
    let total = 50 * MIB;
    let (go, wait) = gate(&d, "go");
    let id = create_sh(
        &mut c,
        &format!("{wait}; yes abcdefghij | head -c {total}"),
        None,
    );
    subscribe(&mut c, json!({"id": id}));
    open_gate(&go);
    let mut sub = Subscription::new(&id);
    sub.until(&mut c, "Exit", WAIT * 6, |s| s.exit.is_some());
    let exit = sub.exit.clone().expect("exit");
    assert_eq!(exit["exitCode"], 0, "{exit}");
    assert_eq!(exit["status"], "completed", "{exit}");
    let log = sub.log("output");
    assert!(
        log.gaps.is_empty(),
        "Gaps for a subscriber that never lagged (the ring overflowed between pumps): {:?}",
        log.gaps
    );
    assert_eq!(log.first_output, Some(0));
    let expected: Vec<u8> = (0..total).map(yes_byte).collect();
    assert_eq!(log.data.len(), expected.len(), "reassembled length");
    if let Some(i) = log.data.iter().zip(&expected).position(|(a, b)| a != b) {
        panic!("reassembled stream differs from the expected bytes at offset {i}");
    }
}

// ---- a subscriber that does not read ---------------------------------------------------------

/// Connection A subscribes and then reads nothing while 200 MiB flow. The daemon must stay
/// small, keep answering B, and when A finally reads it gets what fit in its buffer, one
/// Gap for the rest, then live output and the Exit.
#[test]
fn stalled_subscriber_gets_a_gap_and_does_not_bloat_the_daemon() {
    let d = Daemon::start(&["--client-buffer", "1M"]);
    let total: u64 = 200 * MIB;
    let (go, wait_go) = gate(&d, "go");
    let (fin, wait_fin) = gate(&d, "fin");
    let mut b = d.client();
    let id = create_sh(
        &mut b,
        &format!(
            "{wait_go}; head -c {total} /dev/zero | tr '\\0' x; {wait_fin}; printf END; exit 0"
        ),
        None,
    );
    let mut a = d.client();
    subscribe(&mut a, json!({"id": id}));
    open_gate(&go);

    // B polls while the output flows; A reads nothing.
    let bound_kb = 64 * 1024;
    let mut max_rss = 0;
    let mut answers = 0u64;
    let mut last_bytes = 0;
    let deadline = Instant::now() + WAIT * 6;
    loop {
        let t = terminal_entry(&mut b, &id);
        answers += 1;
        let rss = d.rss_kb();
        assert!(rss > 0, "cannot read the daemon's RSS");
        max_rss = max_rss.max(rss);
        assert!(
            rss < bound_kb,
            "daemon RSS {rss} KiB past {bound_kb} KiB with a stalled subscriber"
        );
        assert!(
            t.get("exitStatus").is_none_or(Value::is_null),
            "the command ended early: {t}"
        );
        let bytes = t["outputBytes"].as_u64().expect("outputBytes");
        assert!(bytes >= last_bytes, "outputBytes went back: {t}");
        last_bytes = bytes;
        if bytes == total {
            break;
        }
        assert!(bytes < total, "more output than written: {t}");
        assert!(
            Instant::now() < deadline,
            "200 MiB did not flow in time; at {bytes}"
        );
    }
    eprintln!("B got {answers} answers during the flow; daemon max RSS {max_rss} KiB");
    // The flow is over and A still has not read: B is answered all the same.
    let r = ok(
        &mut b,
        "terminal/output",
        json!({"sessionId": "s", "terminalId": id}),
    );
    assert_eq!(r["truncated"], true);

    // Now A reads: what was queued for it, then a Gap up to the live edge.
    let mut sub = Subscription::new(&id).checking(|_, offset, data| {
        assert!(
            data.bytes().all(|b| b == b'x'),
            "non-x data at offset {offset} before the end"
        );
    });
    sub.until(&mut a, "the Gap up to the live edge", WAIT * 3, |s| {
        s.streams.get("output").is_some_and(|l| l.pos == total)
    });
    let log = sub.log("output");
    assert!(
        !log.gaps.is_empty(),
        "A cannot have received 200 MiB through a 1 MiB buffer without a Gap"
    );
    let skipped: u64 = log.gaps.iter().map(|g| g.1).sum();
    assert_eq!(log.data_bytes + skipped, total);
    assert!(sub.exit.is_none());

    // Live output after the Gap, then the exit.
    open_gate(&fin);
    let mut sub = Subscription::new(&id).from("output", total);
    let exit = sub.until_exit(&mut a);
    assert_eq!(sub.text("output"), "END");
    assert_eq!(sub.log("output").first_output, Some(total));
    assert!(sub.log("output").gaps.is_empty());
    assert_eq!(exit["exitCode"], 0, "{exit}");
    assert_eq!(exit["status"], "completed", "{exit}");
    // A's connection still works.
    let t = terminal_entry(&mut a, &id);
    assert_eq!(t["outputBytes"], total + 3);
    assert!(d.rss_kb() < bound_kb);
}

/// The command exits while its subscriber is stalled past the smallest `--client-buffer`:
/// the subscriber's own request and the Exit still come through, after one accounting Gap.
#[test]
fn stalled_subscriber_still_gets_its_answers_and_the_exit() {
    let d = Daemon::start(&["--client-buffer", "64K"]);
    let total: u64 = 20 * MIB;
    let (go, wait_go) = gate(&d, "go");
    let mut b = d.client();
    let id = create_sh(
        &mut b,
        &format!("{wait_go}; head -c {total} /dev/zero | tr '\\0' y; exit 3"),
        None,
    );
    let mut a = d.client();
    subscribe(&mut a, json!({"id": id}));
    open_gate(&go);
    // A asks something and reads nothing while the command runs to its end.
    let asked = a.send("terminal/list", json!({})).expect("send");
    let st = wait_exit(&mut b, &id);
    assert_eq!(st["exitCode"], 3);
    let mut sub = Subscription::new(&id).checking(|_, offset, data| {
        assert!(data.bytes().all(|b| b == b'y'), "bad data at {offset}");
    });
    let exit = sub.until_exit(&mut a);
    assert_eq!(exit["exitCode"], 3, "{exit}");
    let log = sub.log("output");
    assert!(!log.gaps.is_empty(), "20 MiB cannot fit a 64 KiB buffer");
    assert_eq!(log.pos, total);
    let skipped: u64 = log.gaps.iter().map(|g| g.1).sum();
    assert_eq!(log.data_bytes + skipped, total);
    let r = a.wait_response(asked).expect("A's request was answered");
    assert!(r["terminals"]
        .as_array()
        .is_some_and(|t| t.iter().any(|t| t["terminalId"] == id.as_str())));
}

// ---- subscribing later, from elsewhere ---------------------------------------------------------

/// The command outlives the connection that started it; another connection subscribes
/// and gets the retained output, the live rest and the exit.
#[test]
fn second_connection_subscribes_after_the_first_disconnected() {
    let d = Daemon::start(&[]);
    let (go, wait) = gate(&d, "go");
    let mut c1 = d.client();
    let id = create_sh(
        &mut c1,
        &format!("printf 'one\\ntwo\\n'; {wait}; printf three; exit 7"),
        None,
    );
    wait_until("the first output is retained", || {
        output(&mut c1, &id)["output"] == "one\ntwo\n"
    });
    drop(c1);
    let mut c2 = d.client();
    wait_until("the first connection is closed", || {
        ok(&mut c2, "initialize", json!({"protocolVersion": 1}))["_meta"]["execd"]["clients"] == 1
    });
    subscribe(&mut c2, json!({"id": id}));
    let mut sub = Subscription::new(&id);
    sub.until(&mut c2, "the retained output", WAIT, |s| {
        s.streams.get("output").is_some_and(|l| l.pos >= 8)
    });
    assert_eq!(sub.text("output"), "one\ntwo\n");
    open_gate(&go);
    let exit = sub.until_exit(&mut c2);
    assert_eq!(sub.text("output"), "one\ntwo\nthree");
    assert!(sub.log("output").gaps.is_empty());
    assert_eq!(exit["exitCode"], 7, "{exit}");
    assert_eq!(exit["signal"], Value::Null);
    assert_eq!(exit["status"], "completed");

    // After the exit, a fresh connection still gets everything and the exit.
    let mut c3 = d.client();
    subscribe(&mut c3, json!({"id": id}));
    let mut sub = Subscription::new(&id);
    let exit = sub.until_exit(&mut c3);
    assert_eq!(sub.text("output"), "one\ntwo\nthree");
    assert_eq!(exit["exitCode"], 7);
}

// ---- text ---------------------------------------------------------------------------------------

/// 200000 '€' (3 bytes each): chunk and pipe-read boundaries fall inside characters, yet
/// every Output holds whole characters at byte offsets and the concatenation is exact.
#[test]
fn multibyte_characters_survive_chunking() {
    let d = Daemon::start(&[]);
    let expected = "€".repeat(200_000);
    let file = d.dir.path().join("euros.txt");
    std::fs::write(&file, &expected).expect("write input");
    let (go, wait) = gate(&d, "go");
    let mut c = d.client();
    let id = create_sh(&mut c, &format!("{wait}; cat '{}'", file.display()), None);
    subscribe(&mut c, json!({"id": id}));
    open_gate(&go);
    let mut sub = Subscription::new(&id).checking(|_, offset, data| {
        assert_eq!(
            offset % 3,
            0,
            "Output starts inside a character at {offset}"
        );
        assert!(
            data.chars().all(|ch| ch == '€'),
            "Output at {offset} holds something else than whole '€' (split or U+FFFD)"
        );
    });
    sub.keep = true;
    let exit = sub.until_exit(&mut c);
    assert_eq!(exit["exitCode"], 0);
    let log = sub.log("output");
    assert!(log.gaps.is_empty(), "{:?}", log.gaps);
    assert_eq!(log.pos, expected.len() as u64);
    assert_eq!(sub.text("output"), expected);
    eprintln!("{} Output events", log.outputs);

    // A late subscriber to a ring of 100000 bytes (not a multiple of 3): its first Output
    // starts on a character boundary after Gaps that cover the rest exactly.
    let id = create_sh(&mut c, &format!("cat '{}'", file.display()), Some(100_000));
    wait_exit(&mut c, &id);
    let mut c2 = d.client();
    subscribe(&mut c2, json!({"id": id}));
    let mut sub = Subscription::new(&id);
    sub.until_exit(&mut c2);
    let log = sub.log("output");
    let first = log.first_output.expect("some output");
    assert_eq!(first % 3, 0, "first Output inside a character");
    assert!(
        (500_000..=500_003).contains(&first),
        "first Output at {first}, retained starts at 500000"
    );
    assert_eq!(log.gaps.iter().map(|g| g.1).sum::<u64>(), first);
    assert_eq!(log.gaps[0].0, 0);
    assert_eq!(sub.text("output"), expected[first as usize..]);
}

// ---- bash streams ------------------------------------------------------------------------------

/// A bash command's stdout and stderr come as two streams with their own offsets;
/// `offset` and `stderr_offset` each resume their own stream.
#[test]
fn bash_command_has_separate_streams_and_offsets() {
    let d = Daemon::start(&[]);
    let mut c = d.client();
    let (go, wait) = gate(&d, "go");
    let r = ok(
        &mut c,
        "bash/exec",
        json!({
            "command": format!("{wait}; for i in 1 2 3; do echo out$i; echo error$i >&2; done; exit 3"),
            "async_mode": true,
        }),
    );
    assert_eq!(r["status"], "running", "{r}");
    let id = r["command_id"].as_str().expect("command_id").to_string();
    subscribe(&mut c, json!({"id": id}));
    open_gate(&go);
    let mut sub = Subscription::new(&id);
    let exit = sub.until_exit(&mut c);
    assert_eq!(
        sub.streams.keys().collect::<Vec<_>>(),
        ["stderr", "stdout"],
        "bash streams are stdout and stderr"
    );
    assert_eq!(sub.text("stdout"), "out1\nout2\nout3\n");
    assert_eq!(sub.text("stderr"), "error1\nerror2\nerror3\n");
    assert_eq!(sub.log("stdout").first_output, Some(0));
    assert_eq!(sub.log("stderr").first_output, Some(0));
    assert!(sub.log("stdout").gaps.is_empty() && sub.log("stderr").gaps.is_empty());
    assert_eq!(exit["exitCode"], 3, "{exit}");
    assert_eq!(exit["status"], "completed", "{exit}");

    // Resume each stream from its own offset, from another connection.
    let mut c2 = d.client();
    subscribe(&mut c2, json!({"id": id, "offset": 5, "stderr_offset": 14}));
    let mut sub = Subscription::new(&id).from("stdout", 5).from("stderr", 14);
    let exit = sub.until_exit(&mut c2);
    assert_eq!(sub.text("stdout"), "out2\nout3\n");
    assert_eq!(sub.text("stderr"), "error3\n");
    assert_eq!(sub.log("stdout").first_output, Some(5));
    assert_eq!(sub.log("stderr").first_output, Some(14));
    assert_eq!(exit["exitCode"], 3);

    // Only stderr_offset: stdout from 0.
    let mut c3 = d.client();
    subscribe(&mut c3, json!({"id": id, "stderr_offset": 7}));
    let mut sub = Subscription::new(&id).from("stderr", 7);
    sub.until_exit(&mut c3);
    assert_eq!(sub.text("stdout"), "out1\nout2\nout3\n");
    assert_eq!(sub.text("stderr"), "error2\nerror3\n");
    assert_eq!(sub.log("stderr").first_output, Some(7));
}

// ---- offsets -----------------------------------------------------------------------------------

/// "0000\n" .. "0999\n": 5000 bytes.
fn numbered_lines() -> String {
    (0..1000).map(|i| format!("{i:04}\n")).collect()
}

const NUMBERED: &str = "i=0; while [ $i -lt 1000 ]; do printf '%04d\\n' $i; i=$((i+1)); done";

/// An offset inside what is retained resumes there; one older than the retained window
/// gets a Gap first, then the oldest retained byte on.
#[test]
fn subscribe_offsets_resume_and_stale_ones_gap() {
    let d = Daemon::start(&[]);
    let mut c = d.client();
    let expected = numbered_lines();
    let id = create_sh(&mut c, NUMBERED, Some(1000));
    let st = wait_exit(&mut c, &id);
    assert_eq!(st["exitCode"], 0);

    // Inside the retained window (4000..5000).
    let mut c1 = d.client();
    subscribe(&mut c1, json!({"id": id, "offset": 4500}));
    let mut sub = Subscription::new(&id).from("output", 4500);
    sub.until_exit(&mut c1);
    assert_eq!(sub.kinds[0], "Output", "{:?}", sub.kinds);
    assert_eq!(sub.log("output").first_output, Some(4500));
    assert_eq!(sub.text("output"), expected[4500..]);

    // Older than retained: a Gap from 100 to 4000 first.
    let mut c2 = d.client();
    subscribe(&mut c2, json!({"id": id, "offset": 100}));
    let mut sub = Subscription::new(&id).from("output", 100);
    sub.until_exit(&mut c2);
    assert_eq!(sub.kinds[0], "Gap", "{:?}", sub.kinds);
    assert_eq!(sub.log("output").gaps, vec![(100, 3900)]);
    assert_eq!(sub.log("output").first_output, Some(4000));
    assert_eq!(sub.text("output"), expected[4000..]);

    // Default offset 0 on the same command: Gap 0..4000.
    let mut c3 = d.client();
    subscribe(&mut c3, json!({"id": id}));
    let mut sub = Subscription::new(&id);
    sub.until_exit(&mut c3);
    assert_eq!(sub.log("output").gaps, vec![(0, 4000)]);
    assert_eq!(sub.text("output"), expected[4000..]);

    // A running command: resume mid-stream, then live output.
    let (go, wait) = gate(&d, "go");
    let id = create_sh(
        &mut c,
        &format!("printf 0123456789; {wait}; printf abcdef"),
        None,
    );
    wait_until("ten bytes are out", || {
        terminal_entry(&mut c, &id)["outputBytes"] == 10
    });
    let mut c4 = d.client();
    subscribe(&mut c4, json!({"id": id, "offset": 4}));
    let mut sub = Subscription::new(&id).from("output", 4);
    sub.until(&mut c4, "the retained rest", WAIT, |s| {
        s.streams.get("output").is_some_and(|l| l.pos == 10)
    });
    assert_eq!(sub.text("output"), "456789");
    open_gate(&go);
    let exit = sub.until_exit(&mut c4);
    assert_eq!(sub.text("output"), "456789abcdef");
    assert_eq!(sub.log("output").first_output, Some(4));
    assert_eq!(exit["exitCode"], 0);
}

// ---- ending subscriptions ---------------------------------------------------------------------

/// After `events/unsubscribe` answers, no more events for that id arrive on that
/// connection, and requests are still answered.
#[test]
fn unsubscribe_stops_events() {
    let d = Daemon::start(&[]);
    let mut c = d.client();
    let id = create_sh(&mut c, "while :; do echo tick; sleep 0.02; done", None);
    subscribe(&mut c, json!({"id": id}));
    let mut sub = Subscription::new(&id);
    sub.until(&mut c, "two ticks", WAIT, |s| {
        s.streams.get("output").is_some_and(|l| l.pos >= 10)
    });
    let r = ok(&mut c, "events/unsubscribe", json!({"id": id}));
    assert_eq!(r, json!({}));
    // Events queued while waiting for that answer were sent before it: fine.
    c.notifications.clear();
    // Ticks come every 20 ms; an active subscription would deliver one in this window.
    match c.next_notification(Some(Duration::from_millis(500))) {
        Err(CallError::Io(e)) if execd::client::is_timeout(&e) => {}
        other => panic!("event after unsubscribe: {other:?}"),
    }
    let before = output(&mut c, &id)["output"].as_str().unwrap_or("").len();
    assert!(before >= 10);
    assert!(
        c.notifications.is_empty(),
        "events after unsubscribe: {:?}",
        c.notifications
    );
    // The command goes on; killing it sends nothing to this connection either.
    ok(
        &mut c,
        "terminal/kill",
        json!({"sessionId": "s", "terminalId": id}),
    );
    let st = wait_exit(&mut c, &id);
    assert_eq!(st["signal"], "SIGTERM");
    assert!(c.notifications.is_empty(), "{:?}", c.notifications);
    // Unsubscribing from an unknown id is -32002; from a known one without a subscription, {}.
    assert_eq!(
        err(&mut c, "events/unsubscribe", json!({"id": "term_999999"})).0,
        -32002
    );
    assert_eq!(
        ok(&mut c, "events/unsubscribe", json!({"id": id})),
        json!({})
    );
}

/// Releasing a terminal ends its subscription with an Exit; the id is then unknown.
#[test]
fn release_ends_subscription_with_exit() {
    let d = Daemon::start(&[]);
    let mut c = d.client();
    let id = create_sh(&mut c, "echo ready; exec sleep 30", None);
    subscribe(&mut c, json!({"id": id}));
    let mut sub = Subscription::new(&id);
    sub.until(&mut c, "ready", WAIT, |s| {
        s.streams.get("output").is_some_and(|l| l.pos >= 6)
    });
    assert_eq!(sub.text("output"), "ready\n");
    let r = ok(
        &mut c,
        "terminal/release",
        json!({"sessionId": "s", "terminalId": id}),
    );
    assert_eq!(r, json!({}));
    let exit = sub.until_exit(&mut c);
    assert_eq!(exit["exitCode"], Value::Null, "{exit}");
    assert_eq!(exit["signal"], "SIGTERM", "{exit}");
    assert_eq!(exit["status"], "killed", "{exit}");
    // Nothing after the Exit, and the id is gone.
    let (code, _, _) = err(&mut c, "events/subscribe", json!({"id": id}));
    assert_eq!(code, -32002);
    assert!(c.notifications.is_empty(), "{:?}", c.notifications);
}

#[test]
fn subscribe_to_unknown_id_is_not_found() {
    let d = Daemon::start(&[]);
    let mut c = d.client();
    for id in ["term_424242", "cmd_424242", "nope", ""] {
        let (code, _, _) = err(&mut c, "events/subscribe", json!({"id": id}));
        assert_eq!(code, -32002, "subscribe to {id:?}");
    }
    let (code, _, data) = err(&mut c, "events/subscribe", json!({}));
    assert_eq!(code, -32602);
    assert_eq!(data.expect("data")["field"], "id");
    assert!(c.notifications.is_empty());
}

/// Closing a bash session kills its running command; subscribers get an Exit with status
/// "killed".
#[test]
fn closing_a_bash_session_ends_its_subscriptions() {
    let d = Daemon::start(&[]);
    let mut c = d.client();
    let r = ok(
        &mut c,
        "bash/exec",
        json!({"command": "echo started; sleep 30", "session_id": "closing", "async_mode": true}),
    );
    let id = r["command_id"].as_str().expect("command_id").to_string();
    let mut watcher = d.client();
    subscribe(&mut watcher, json!({"id": id}));
    let mut sub = Subscription::new(&id);
    sub.until(&mut watcher, "started", WAIT, |s| {
        s.streams.get("stdout").is_some_and(|l| l.pos >= 8)
    });
    let r = ok(
        &mut c,
        "bash/sessions/close",
        json!({"session_id": "closing"}),
    );
    assert_eq!(r, json!({}));
    let exit = sub.until_exit(&mut watcher);
    assert_eq!(exit["status"], "killed", "{exit}");
    assert_eq!(exit["exitCode"], Value::Null, "{exit}");
    assert!(exit["signal"].is_string(), "{exit}");
    assert_eq!(sub.text("stdout"), "started\n");
    // The session and the command are gone.
    let (code, _, _) = err(&mut watcher, "events/subscribe", json!({"id": id}));
    assert_eq!(code, -32002);
}
