//! Bounds on what any client can make the daemon spend: CPU while nothing happens, memory
//! for output, the size of replies, and kills that end the whole tree (PROTOCOL.md
//! sections 2, 3 and 8).

use std::time::Duration;

use crate::util::*;

/// A subscriber of a command that writes nothing costs the daemon no CPU: the loop sleeps
/// in `epoll_wait` instead of polling with a zero timeout. Measured in ticks of CPU time
/// the daemon used (a spinning loop takes one core: about 100 ticks a second).
#[test]
fn quiet_subscribers_cost_no_cpu() {
    let d = Daemon::start(&[]);
    let mut c = d.client();
    // A terminal that said something first (its subscriber has been fed) and one that never
    // says anything; a bash command likewise.
    let t1 = create(&mut c, "sh", &["-c", "echo hi; exec sleep 30"]);
    let t2 = create(&mut c, "sleep", &["30"]);
    let b1 = ok(
        &mut c,
        "bash/exec",
        json!({"command": "echo hi; exec sleep 30", "async_mode": true}),
    )["command_id"]
        .as_str()
        .expect("command_id")
        .to_string();
    let mut subscribers = Vec::new();
    for id in [&t1, &t2, &b1] {
        for _ in 0..3 {
            let mut s = d.client();
            ok(&mut s, "events/subscribe", json!({"id": id}));
            subscribers.push(s);
        }
    }
    // Let the first output reach its subscribers, then watch the daemon do nothing.
    for s in subscribers.iter_mut().take(3) {
        let e = s.next_notification(Some(WAIT)).expect("the first Output");
        assert_eq!(e["params"]["type"], "Output", "{e}");
    }
    std::thread::sleep(Duration::from_millis(300));
    let before = cpu_ticks(d.pid());
    std::thread::sleep(Duration::from_secs(3));
    let used = cpu_ticks(d.pid()) - before;
    // Spinning would be about 300; an idle loop is 0 or 1.
    assert!(
        used <= 15,
        "the daemon used {used} ticks of CPU in 3 s with quiet subscribers"
    );
    drop(subscribers);
}

/// `--max-output-memory` bounds every ring together: twelve terminals of 64 MiB each,
/// each filled, keep the daemon under the 256 MiB budget (plus a margin for everything
/// else), and the oldest ones report what they dropped.
#[test]
fn the_output_memory_budget_bounds_retained_terminals() {
    const MIB: u64 = 1 << 20;
    let d = Daemon::start(&["--max-output-memory", "256M"]);
    let mut c = d.client();
    let mut ids = Vec::new();
    for _ in 0..12 {
        let id = create_with(
            &mut c,
            json!({"sessionId": "s", "command": "head", "args": ["-c", "67108864", "/dev/zero"],
                   "outputByteLimit": 64 * MIB}),
        );
        wait_exit(&mut c, &id);
        ids.push(id);
    }
    let rss = d.rss_kb() * 1024;
    assert!(
        rss < 256 * MIB + 48 * MIB,
        "RSS is {} MiB with a 256 MiB budget",
        rss / MIB
    );
    let init = ok(&mut c, "initialize", json!({}));
    let mem = &init["_meta"]["execd"]["outputMemory"];
    assert!(mem["used"].as_u64().unwrap() <= 256 * MIB, "{mem}");
    assert!(mem["released"].as_u64().unwrap() >= 8 * 64 * MIB, "{mem}");
    assert_eq!(init["limits"]["maxOutputMemory"], 256 * MIB);
    // The first one was given back: a read says so.
    let first = output(&mut c, &ids[0]);
    assert_eq!(first["output"], "");
    assert_eq!(first["truncated"], true);
    assert_eq!(first["_meta"]["execd"]["dropped"], 64 * MIB, "{first:.300}");
    // The newest is whole.
    let last = ok(
        &mut c,
        "terminal/output",
        json!({"sessionId": "s", "terminalId": ids[11], "_meta": {"execd": {"offset": 0, "length": 10}}}),
    );
    assert_eq!(last["output"], "\0".repeat(10));
    assert_eq!(last["_meta"]["execd"]["dropped"], 0);
}

/// Bash commands count against the same budget: three sessions of 100 commands writing
/// 2 MiB each stay within it.
#[test]
fn bash_history_stays_within_the_output_memory_budget() {
    const MIB: u64 = 1 << 20;
    let d = Daemon::start(&["--max-output-memory", "64M", "--output-limit", "2M"]);
    let mut c = d.client();
    for s in 0..3 {
        for _ in 0..100 {
            let r = ok(
                &mut c,
                "bash/exec",
                json!({"command": "head -c 2097152 /dev/zero; head -c 1000 /dev/zero >&2",
                       "session_id": format!("s{s}"), "max_output_length": 10}),
            );
            assert_eq!(r["status"], "completed", "{r}");
        }
    }
    let rss = d.rss_kb() * 1024;
    assert!(rss < 64 * MIB + 48 * MIB, "RSS is {} MiB", rss / MIB);
    // An old command's output was given back; an offset read reports the skipped bytes.
    let r = ok(
        &mut c,
        "bash/commands",
        json!({"session_id": "s0", "limit": 4096}),
    );
    let oldest = r["commands"].as_array().unwrap().last().unwrap()["command_id"].clone();
    let o = ok(
        &mut c,
        "bash/output",
        json!({"session_id": "s0", "command_id": oldest}),
    );
    assert_eq!(o["stdout_skipped"], 2 * MIB, "{o:.300}");
}

/// A batch of more elements than `--max-batch` is answered once with `-32600` naming the
/// limit, and nothing in it runs.
#[test]
fn a_batch_over_max_batch_is_refused_whole() {
    let d = Daemon::start(&["--max-batch", "10"]);
    let mut c = d.client();
    let batch: Vec<Value> = (0..11)
        .map(|i| {
            json!({"jsonrpc": "2.0", "id": i, "method": "terminal/create",
                   "params": {"sessionId": "s", "command": "true"}})
        })
        .collect();
    c.send_line(Value::Array(batch).to_string().as_bytes())
        .expect("send");
    let m = c.read_message(Some(WAIT)).expect("the refusal");
    assert_eq!(m["id"], Value::Null, "{m}");
    assert_eq!(m["error"]["code"], -32600, "{m}");
    assert_eq!(m["error"]["data"]["limit"], "max-batch", "{m}");
    assert_eq!(m["error"]["data"]["value"], 10, "{m}");
    assert!(terminals(&mut c).is_empty(), "nothing ran");
    // Ten is fine.
    let batch: Vec<Value> = (0..10)
        .map(|i| json!({"jsonrpc": "2.0", "id": i, "method": "terminal/list"}))
        .collect();
    c.send_line(Value::Array(batch).to_string().as_bytes())
        .expect("send");
    let m = c.read_message(Some(WAIT)).expect("the reply");
    assert_eq!(m.as_array().map(Vec::len), Some(10), "{m:.200}");
}

/// `terminal/list` answers a page at a time and cuts long command lines.
#[test]
fn terminal_list_pages_and_cuts_long_lines() {
    let d = Daemon::start(&[]);
    let mut c = d.client();
    let long = "z".repeat(100_000);
    let mut made = Vec::new();
    for _ in 0..7 {
        made.push(create(&mut c, "true", &[&long]));
    }
    let mut seen = Vec::new();
    let mut cursor = Value::Null;
    let mut pages = 0;
    loop {
        let r = ok(
            &mut c,
            "terminal/list",
            json!({"limit": 3, "cursor": cursor}),
        );
        pages += 1;
        let page = r["terminals"].as_array().expect("terminals").clone();
        assert!(page.len() <= 3);
        for t in &page {
            let args = t["args"].as_array().expect("args");
            let shown: usize = args.iter().map(|a| a.as_str().unwrap().len()).sum();
            assert!(shown < 5000, "a listed line is cut: {shown} bytes");
            assert!(
                args.last().unwrap().as_str().unwrap().contains("bytes cut"),
                "{:.200}",
                t
            );
            seen.push(t["terminalId"].as_str().unwrap().to_string());
        }
        match r.get("nextCursor") {
            Some(next) => cursor = next.clone(),
            None => break,
        }
    }
    assert_eq!(pages, 3);
    made.reverse();
    assert_eq!(seen, made, "newest first, each exactly once");
    let (code, _, _) = err(&mut c, "terminal/list", json!({"cursor": "bogus"}));
    assert_eq!(code, -32602);
}

/// A group member that ignores SIGTERM is SIGKILLed after the grace, although the leader
/// died of the SIGTERM at once.
#[test]
fn kill_reaches_a_term_ignoring_group_member_after_the_grace() {
    // Long enough that the check below runs inside it on a loaded machine.
    let d = Daemon::start(&["--kill-grace", "3s"]);
    let mut c = d.client();
    let id = create(
        &mut c,
        "sh",
        &["-c", "(trap '' TERM; echo started; exec sleep 1000) & wait"],
    );
    let pgid = pid_of(&mut c, &id);
    wait_until("the member starts", || {
        output(&mut c, &id)["output"] == "started\n"
    });
    ok(
        &mut c,
        "terminal/kill",
        json!({"sessionId": "s", "terminalId": id}),
    );
    assert!(
        group_alive(pgid),
        "the TERM-ignoring sleep outlives the leader"
    );
    wait_until("the group is gone after the grace", || !group_alive(pgid));
}

/// Shutdown with nothing running exits at once, not after the kill grace.
#[test]
fn shutdown_with_nothing_running_exits_at_once() {
    let mut d = Daemon::start(&["--kill-grace", "60s"]);
    let mut c = d.client();
    let id = create(&mut c, "true", &[]);
    wait_exit(&mut c, &id);
    let started = std::time::Instant::now();
    assert_eq!(d.terminate(), Some(0));
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "took {:?} with a 60 s grace",
        started.elapsed()
    );
}

/// An id is echoed exactly as sent, whatever its size.
#[test]
fn a_thirty_digit_id_comes_back_unchanged() {
    let d = Daemon::start(&[]);
    let mut c = d.client();
    c.send_line(
        br#"{"jsonrpc":"2.0","id":123456789012345678901234567890,"method":"terminal/list"}"#,
    )
    .expect("send");
    let mut raw = String::new();
    use std::io::BufRead;
    c.raw_reader().read_line(&mut raw).expect("read");
    assert!(
        raw.contains(r#""id":123456789012345678901234567890,"#),
        "{raw}"
    );
}

/// Extension methods answer under a leading `_` (how ACP SDKs send them), and
/// `$/cancel_request` ends a parked request with `-32800`.
#[test]
fn underscore_methods_and_cancel_request() {
    let d = Daemon::start(&[]);
    let mut c = d.client();
    let r = ok(&mut c, "_terminal/list", json!({}));
    assert!(r["terminals"].is_array());
    let r = ok(&mut c, "_bash/exec", json!({"command": "echo hi"}));
    assert_eq!(r["stdout"], "hi\n");
    let id = create(&mut c, "sleep", &["30"]);
    c.send_line(
        json!({"jsonrpc": "2.0", "id": "w1", "method": "terminal/wait_for_exit",
               "params": {"sessionId": "s", "terminalId": id}})
        .to_string()
        .as_bytes(),
    )
    .expect("send");
    c.send_line(
        json!({"jsonrpc": "2.0", "method": "$/cancel_request", "params": {"requestId": "w1"}})
            .to_string()
            .as_bytes(),
    )
    .expect("send");
    let m = read_response(&mut c);
    assert_eq!(m["id"], "w1");
    assert_eq!(m["error"]["code"], -32800, "{m}");
    // The command goes on.
    let out = output(&mut c, &id);
    assert!(out.get("exitStatus").is_none(), "{out}");
}

/// Two uids may both use the session name `default`; neither sees the other's.
#[test]
fn two_uids_use_one_session_name_apart() {
    if !running_as_root() {
        skip("needs root to connect as another uid");
        return;
    }
    let d = Daemon::start(&["--socket-mode", "0666", "--allow-uid", "65534"]);
    d.let_others_in();
    let mut c = d.client();
    let r = ok(
        &mut c,
        "bash/exec",
        json!({"command": "echo root", "session_id": "default"}),
    );
    assert_eq!(r["stdout"], "root\n");
    let out = call_as_nobody(
        &d.socket,
        "bash/exec",
        json!({"command": "id -u", "session_id": "default"}),
    );
    assert_eq!(out["stdout"], "65534\n", "{out}");
    assert_eq!(out["session_id"], "default");
    let theirs = call_as_nobody(&d.socket, "bash/sessions", json!({}));
    assert_eq!(theirs.as_array().map(Vec::len), Some(1), "{theirs}");
    // Root's session still has only root's command.
    let mine = ok(&mut c, "bash/commands", json!({"session_id": "default"}));
    let owners: Vec<&Value> = mine["commands"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| &c["command"])
        .collect();
    assert!(owners.contains(&&json!("echo root")), "{mine}");
    let r = ok(&mut c, "bash/output", json!({"session_id": "default"}));
    assert_eq!(
        r["stdout"], "root\n",
        "root's newest command is its own: {r}"
    );
}

/// `execctl call METHOD PARAMS` as uid 65534; returns the JSON it printed.
fn call_as_nobody(socket: &std::path::Path, method: &str, params: Value) -> Value {
    use std::os::unix::process::CommandExt;
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_execctl"))
        .arg("--socket")
        .arg(socket)
        .args(["call", method, &params.to_string()])
        .uid(65534)
        .gid(65534)
        .stdin(std::process::Stdio::null())
        .output()
        .expect("run execctl as nobody");
    assert!(out.status.success(), "{out:?}");
    serde_json::from_slice(&out.stdout).expect("JSON from execctl call")
}

/// Nothing is refused for the output budget (PROTOCOL 8): under `--max-output-memory
/// 128M`, twelve commands that each write 64 MiB into 64 MiB rings all start, as root and
/// as a uid held to half the budget; running rings give back their oldest bytes to make
/// room, and the budget holds throughout.
#[test]
fn twelve_writers_of_64_mib_all_start_under_a_128_mib_budget() {
    const MIB: u64 = 1 << 20;
    let d = Daemon::start(&[
        "--max-output-memory",
        "128M",
        "--socket-mode",
        "0666",
        "--allow-uid",
        "65534",
    ]);
    d.let_others_in();
    let mut owners: Vec<(&str, Option<u32>)> = vec![("root", None)];
    if running_as_root() {
        owners.push(("uid 65534", Some(65534)));
    } else {
        skip("the non-root half needs root to connect as another uid");
    }
    for (who, uid) in owners {
        let mut relay = d.client_in_other_process_as(uid);
        let c: &mut Client = &mut relay;
        let mut ids = Vec::new();
        for i in 0..12 {
            let params = json!({"sessionId": "s", "command": "head",
                                "args": ["-c", (64 * MIB).to_string(), "/dev/zero"],
                                "outputByteLimit": 64 * MIB});
            match c.call("terminal/create", params) {
                Ok(r) => ids.push(r["terminalId"].as_str().expect("id").to_string()),
                Err(e) => panic!("{who}: writer {i} refused: {e}"),
            }
            let used = ok(c, "initialize", json!({}))["_meta"]["execd"]["outputMemory"]["used"]
                .as_u64()
                .expect("used");
            assert!(used <= 128 * MIB, "{who}: {used} bytes held");
        }
        // (What each ring kept is not read back here: megabytes of JSON per terminal;
        // core::budget's unit tests check the truncation they report.)
        for id in &ids {
            let exit = wait_exit(c, id);
            assert_eq!(exit["exitCode"], 0, "{who}: {id}: {exit}");
        }
        let used = ok(c, "initialize", json!({}))["_meta"]["execd"]["outputMemory"]["used"]
            .as_u64()
            .expect("used");
        assert!(used <= 128 * MIB, "{who}: {used} bytes held");
        for id in &ids {
            ok(
                c,
                "terminal/release",
                json!({"sessionId": "s", "terminalId": id}),
            );
        }
    }
    assert_no_panic(&d);
}
