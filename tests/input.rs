//! Commands waiting for input (PROTOCOL.md section 12.3): a command blocked reading its
//! stdin pipe or its terminal is reported (bash results, sessions, `terminal/output`,
//! `Input` events, `execctl ps`), cleared once it is given input, never reported for a
//! command that only sleeps, and a synchronous `bash/exec` answers as soon as its command
//! waits instead of sitting out its timeout; looking costs the daemon next to nothing.

use std::time::{Duration, Instant};

use crate::util::cli::*;
use crate::util::*;

/// Starts `line` in session `session` (async), with a terminal when `tty`.
fn start(c: &mut Client, session: &str, line: &str, tty: bool) -> String {
    ok(
        c,
        "bash/exec",
        json!({"command": line, "session_id": session, "async_mode": true, "tty": tty}),
    )["command_id"]
        .as_str()
        .expect("command_id")
        .to_string()
}

/// `bash/output` of `session` from its start.
fn out(c: &mut Client, session: &str) -> Value {
    ok(c, "bash/output", json!({"session_id": session}))
}

#[test]
fn a_read_on_a_pipe_or_a_terminal_is_reported_and_cleared_by_input() {
    let d = Daemon::start(&[]);
    let mut c = d.client();
    for (session, tty) in [("pipe", false), ("pty", true)] {
        start(&mut c, session, "read -r x; echo got:$x; sleep 30", tty);
        wait_until(&format!("{session}: waiting for input"), || {
            out(&mut c, session)["waiting_for_input"] == true
        });
        let o = out(&mut c, session);
        assert_eq!(o["command"]["status"], "running");
        assert_eq!(o["command"]["waiting_for_input"], true);
        let sessions = ok(&mut c, "bash/sessions", json!({}));
        let s = sessions
            .as_array()
            .and_then(|a| a.iter().find(|s| s["session_id"] == session))
            .cloned()
            .expect("the session");
        assert_eq!(s["waiting_for_input"], true);
        // Given a line, it reads it and goes on: no longer waiting.
        ok(
            &mut c,
            "bash/write",
            json!({"session_id": session, "input": "hi\n"}),
        );
        assert_eq!(out(&mut c, session)["waiting_for_input"], false);
        wait_until(&format!("{session}: it read the line"), || {
            out(&mut c, session)["stdout"]
                .as_str()
                .is_some_and(|s| s.contains("got:hi"))
        });
        // And stays not waiting (it sleeps now): looked at again, still false.
        std::thread::sleep(Duration::from_millis(1200));
        assert_eq!(out(&mut c, session)["waiting_for_input"], false);
    }
}

#[test]
fn a_command_that_only_sleeps_is_never_waiting() {
    let d = Daemon::start(&[]);
    let mut c = d.client();
    start(&mut c, "s", "sleep 3", false);
    let until = Instant::now() + Duration::from_millis(2500);
    while Instant::now() < until {
        assert_eq!(out(&mut c, "s")["waiting_for_input"], false);
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn a_synchronous_exec_answers_once_its_command_waits_for_input() {
    if !have(&["python3"]) {
        return skip("python3 is not installed");
    }
    let d = Daemon::start(&[]);
    let mut c = d.client();
    let t = Instant::now();
    let r = ok(
        &mut c,
        "bash/exec",
        json!({"command": "python3 -c 'input()'", "session_id": "p", "timeout": 30}),
    );
    let took = t.elapsed();
    assert_eq!(r["status"], "running", "{r}");
    assert_eq!(r["waiting_for_input"], true, "{r}");
    // Long before its 30 s timeout (the spec says within a second of blocking).
    assert!(took < Duration::from_secs(25), "answered after {took:?}");
    eprintln!("a synchronous exec waiting for input answered in {took:?}");
    // The command keeps running: given input, it ends.
    ok(
        &mut c,
        "bash/write",
        json!({"session_id": "p", "input": "\n"}),
    );
    wait_until("python ends", || {
        out(&mut c, "p")["command"]["status"] == "completed"
    });
}

#[test]
fn subscribers_terminals_and_ps_hear_of_it() {
    let d = Daemon::start(&[]);
    let mut c = d.client();
    let id = create_with(
        &mut c,
        json!({"sessionId": "s", "command": "sh", "args": ["-c", "read x"],
               "_meta": {"execd": {"stdin": true}}}),
    );
    ok(&mut c, "events/subscribe", json!({"id": id}));
    let deadline = Instant::now() + WAIT;
    loop {
        assert!(Instant::now() < deadline, "no Input event");
        let m = c.next_notification(Some(WAIT)).expect("an event");
        if m["params"]["type"] == "Input" {
            assert_eq!(m["params"]["payload"], json!({"id": id, "waiting": true}));
            break;
        }
    }
    let o = output(&mut c, &id);
    assert_eq!(o["_meta"]["execd"]["waitingForInput"], true);
    let listed = terminal_entry(&mut c, &id);
    assert_eq!(listed["_meta"]["execd"]["waitingForInput"], true);
    let ps = ctl_code(&d, &["ps", "--json"], 0).stdout;
    let ps = parse_json(&ps);
    let me = ps["processes"]
        .as_array()
        .and_then(|a| a.iter().find(|p| p["id"] == id.as_str()))
        .cloned()
        .expect("in ps");
    assert_eq!(me["state"], "input");
    // Input clears it, and says so.
    ok(
        &mut c,
        "terminal/write",
        json!({"sessionId": "s", "terminalId": id, "input": "x\n"}),
    );
    loop {
        assert!(Instant::now() < deadline, "no Input event clearing it");
        let m = c.next_notification(Some(WAIT)).expect("an event");
        if m["params"]["type"] == "Input" {
            assert_eq!(m["params"]["payload"], json!({"id": id, "waiting": false}));
            break;
        }
    }
}

#[test]
fn two_hundred_quiet_commands_holding_stdin_cost_the_daemon_next_to_nothing() {
    let d = Daemon::start(&[]);
    let mut c = d.client();
    for i in 0..200 {
        start(&mut c, &format!("c{i}"), "cat", false);
    }
    // Every one is found waiting (looked at at least once).
    wait_until("all 200 found waiting", || {
        let sessions = ok(&mut c, "bash/sessions", json!({}));
        sessions
            .as_array()
            .is_some_and(|a| a.iter().filter(|s| s["waiting_for_input"] == true).count() == 200)
    });
    // Then the daemon's CPU over ten seconds of looking, its off-loop reader's (which
    // does the looking) included: under 1% of a core.
    const SECS: u64 = 10;
    let reader = reader_of(d.pid()).expect("the daemon's reader runs");
    let ticks = || (cpu_ticks(d.pid()), cpu_ticks(reader));
    let before = ticks();
    std::thread::sleep(Duration::from_secs(SECS));
    let after = ticks();
    assert_eq!(
        reader_of(d.pid()),
        Some(reader),
        "the same reader throughout"
    );
    let (daemon, looking) = (after.0 - before.0, after.1 - before.1);
    let used = daemon + looking;
    // SAFETY: sysconf takes an integer and touches no memory.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as u64;
    eprintln!(
        "200 quiet cats: {used} ticks ({daemon} daemon, {looking} reader) in {SECS} s at {hz} Hz"
    );
    assert!(
        used * 100 < SECS * hz,
        "{used} ticks in {SECS} s at {hz} Hz is 1% of a core or more"
    );
}
