//! Spawning off the loop and holding many commands (PROTOCOL.md sections 3 and 8): a
//! spawn that fails still answers as it always did and leaves nothing behind (no record,
//! no zombie, no descriptor), and thousands of running commands leave the loop answering.
//! The pipelined burst and the connection that never reads are in `backlog`; a cwd whose
//! lookup hangs is in `slow_cwd`.

use std::os::unix::fs::PermissionsExt;

use crate::util::cli::*;
use crate::util::*;

/// Descriptors process `pid` holds.
fn open_fds(pid: i32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, Iterator::count)
}

/// Commands running now, as `initialize` counts them.
fn running(c: &mut Client) -> u64 {
    let init = ok(c, "initialize", json!({"protocolVersion": 1}));
    init["_meta"]["execd"]["running"].as_u64().expect("running")
}

#[test]
fn spawn_failures_answer_as_before_and_leave_nothing_behind() {
    let d = Daemon::start(&["--socket-mode", "0666", "--allow-uid", "65534"]);
    let mut c = d.client();
    // One command first, so that whatever the daemon opens once (`/dev/null`) is in the
    // baseline.
    let id = create(&mut c, "true", &[]);
    wait_exit(&mut c, &id);
    ok(
        &mut c,
        "terminal/release",
        json!({"sessionId": "s", "terminalId": id}),
    );
    let fds = open_fds(d.pid());

    let dir = TempDir::new();
    let not_executable = dir.path().join("not-executable");
    std::fs::write(&not_executable, b"#!/bin/sh\n").expect("write");
    let create_err = |c: &mut Client, extra: Value| {
        let mut p = json!({"sessionId": "s", "command": "true"});
        for (k, v) in extra.as_object().expect("object") {
            p[k] = v.clone();
        }
        err(c, "terminal/create", p)
    };
    let (code, msg, _) = create_err(&mut c, json!({"command": "no-such-program-execd"}));
    assert_eq!((code, msg.as_str()), (-32004, "No such file or directory"));
    let (code, msg, _) = create_err(&mut c, json!({"command": not_executable, "args": []}));
    assert_eq!((code, msg.as_str()), (-32004, "Permission denied"));
    // A directory that does not exist, or is not one, is the request's mistake.
    for cwd in [dir.path().join("absent"), not_executable.clone()] {
        let (code, _, data) = create_err(&mut c, json!({ "cwd": cwd }));
        assert_eq!(code, -32602, "{}", cwd.display());
        assert_eq!(data.expect("data")["field"], "cwd");
    }
    let (code, _, data) = err(
        &mut c,
        "bash/exec",
        json!({"command": "true", "exec_dir": dir.path().join("absent")}),
    );
    assert_eq!(code, -32602);
    assert_eq!(data.expect("data")["field"], "exec_dir");
    // One the command's user may not enter is found by the child, after the user switch:
    // a spawn failure.
    if running_as_root() {
        let closed = dir.path().join("closed");
        std::fs::create_dir(&closed).expect("mkdir");
        std::fs::set_permissions(&closed, std::fs::Permissions::from_mode(0o700)).expect("chmod");
        d.let_others_in();
        let mut nobody = d.client_in_other_process_as(Some(65534));
        let (code, msg, _) = create_err(&mut nobody, json!({ "cwd": closed }));
        assert_eq!((code, msg.as_str()), (-32004, "Permission denied"));
        drop(nobody);
    }

    // Nothing is left: no terminal, no bash session or command, nothing running, no
    // zombie, no descriptor.
    assert_eq!(
        ok(&mut c, "terminal/list", json!({}))["terminals"],
        json!([])
    );
    assert_eq!(ok(&mut c, "bash/sessions", json!({})), json!([]));
    assert_eq!(running(&mut c), 0);
    wait_until("no zombie left by the failed spawns", || {
        zombie_children(d.pid()).is_empty()
    });
    wait_until("the descriptors the spawns took are back", || {
        open_fds(d.pid()) <= fds
    });
    // And spawning goes on.
    let id = create(&mut c, "true", &[]);
    assert_eq!(wait_exit(&mut c, &id)["exitCode"], 0);
    assert_no_panic(&d);
}

/// 2,000 commands running at once (10,000 in `cargo bench`): the loop still answers a
/// ping on its own connection, `execctl status` counts them, and all are reaped once
/// released.
#[test]
fn two_thousand_running_commands_leave_the_loop_answering() {
    const N: usize = 2000;
    const CONNS: usize = 4;
    let d = Daemon::start(&["--max-processes", "2100", "--max-retained", "2100"]);
    let socket = d.socket.clone();
    let starters: Vec<_> = (0..CONNS)
        .map(|_| {
            let socket = socket.clone();
            std::thread::spawn(move || {
                let mut c = Client::connect(&socket).expect("connect");
                c.timeout = Some(WAIT);
                (0..N / CONNS)
                    .map(|_| create(&mut c, "sleep", &["60"]))
                    .collect::<Vec<String>>()
            })
        })
        .collect();
    // Pings while they start, each answered (bounded by WAIT; no timing threshold here:
    // `cargo bench` measures the latency).
    let mut ping = d.client();
    while !starters.iter().all(std::thread::JoinHandle::is_finished) {
        ok(&mut ping, "initialize", json!({"protocolVersion": 1}));
    }
    let ids: Vec<String> = starters
        .into_iter()
        .flat_map(|t| t.join().expect("a starter failed"))
        .collect();
    assert_eq!(ids.len(), N);
    assert_eq!(running(&mut ping) as usize, N);
    // A listing page is the page, not all of them.
    let page = ok(&mut ping, "terminal/list", json!({"limit": 10}));
    assert_eq!(page["terminals"].as_array().map(Vec::len), Some(10));
    assert!(page["nextCursor"].is_string(), "{}", page["nextCursor"]);
    let status = parse_json(&ctl_code(&d, &["status", "--json"], 0).stdout);
    assert_eq!(status["running"], N as u64);
    assert!(
        status["descriptors"]["terminals"].as_u64() >= Some(N as u64),
        "{}",
        status["descriptors"]
    );

    // Released, every one is ended and reaped.
    let mut c = d.client();
    for id in &ids {
        c.send(
            "terminal/release",
            json!({"sessionId": "s", "terminalId": id}),
        )
        .expect("send");
    }
    wait_until("every command is reaped", || running(&mut ping) == 0);
    wait_until("no zombie", || zombie_children(d.pid()).is_empty());
    assert_no_panic(&d);
}
