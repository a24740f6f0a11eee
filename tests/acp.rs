//! ACP terminal methods against the real daemon: exit statuses, output limits, process
//! lifetime (grandchildren, zombies, kill, release), parked waits across connections,
//! validation of create, the command-line rule, `terminal/list`, shutdown, the socket file
//! and the configured limits (PROTOCOL.md sections 1, 3, 4 and 8).

use crate::util::*;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

// ---- helpers ---------------------------------------------------------------------------

/// Waits for the exit and returns the final `terminal/output`.
#[track_caller]
fn run_to_end(c: &mut Client, id: &str) -> Value {
    wait_exit(c, id);
    output(c, id)
}

#[track_caller]
fn release(c: &mut Client, id: &str) {
    let r = ok(
        c,
        "terminal/release",
        json!({"sessionId": "s", "terminalId": id}),
    );
    assert_eq!(r, json!({}), "release answers {{}}");
}

/// `terminal/list` in session `s`.
#[track_caller]
fn list(c: &mut Client) -> Vec<Value> {
    let r = ok(c, "terminal/list", json!({"sessionId": "s"}));
    r["terminals"]
        .as_array()
        .unwrap_or_else(|| panic!("terminals missing in {r}"))
        .clone()
}

/// A command that runs until `gate` exists, then exits 0: lets a test decide when a
/// command ends without guessing at durations.
fn gated(gate: &Path) -> Value {
    json!({
        "sessionId": "s",
        "command": "sh",
        "args": ["-c", "while [ ! -e \"$1\" ]; do sleep 0.02; done", "sh", gate],
    })
}

/// Reads the response to `id` on a client whose requests were sent with `send`.
#[track_caller]
fn answer(c: &mut Client, id: u64) -> Result<Value, CallError> {
    c.wait_response(id)
}

/// Bounded wait for a child process that is expected to exit by itself.
#[track_caller]
fn wait_child(child: &mut std::process::Child) -> std::process::ExitStatus {
    let deadline = Instant::now() + WAIT;
    loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            return status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("process did not exit within {WAIT:?}");
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

fn canonical(p: &Path) -> PathBuf {
    std::fs::canonicalize(p).expect("canonicalize")
}

// ---- exit statuses and output ----------------------------------------------------------

#[test]
fn exit_codes_and_signal_names() {
    let d = Daemon::start(&[]);
    let mut c = d.client();

    let cases: [(&str, Value); 5] = [
        ("exit 0", json!({"exitCode": 0, "signal": null})),
        ("exit 3", json!({"exitCode": 3, "signal": null})),
        ("exit 255", json!({"exitCode": 255, "signal": null})),
        (
            "kill -KILL $$",
            json!({"exitCode": null, "signal": "SIGKILL"}),
        ),
        (
            "kill -TERM $$",
            json!({"exitCode": null, "signal": "SIGTERM"}),
        ),
    ];
    for (script, want) in cases {
        let id = create(&mut c, "sh", &["-c", script]);
        let got = wait_exit(&mut c, &id);
        assert_eq!(got, want, "wait_for_exit of sh -c '{script}'");
        let out = output(&mut c, &id);
        assert_eq!(
            out["exitStatus"], want,
            "terminal/output of sh -c '{script}': {out}"
        );
        // Waiting again on an exited command answers at once with the same status.
        assert_eq!(wait_exit(&mut c, &id), want);
        release(&mut c, &id);
    }
    assert_no_panic(&d);
}

#[test]
fn output_byte_limit_keeps_a_utf8_tail() {
    let d = Daemon::start(&[]);
    let mut c = d.client();
    for ch in ['é', '€', '😀'] {
        let printed: String = std::iter::repeat_n(ch, 300).collect::<String>() + "END";
        let id = create_with(
            &mut c,
            json!({"sessionId": "s", "command": "printf", "args": ["%s", printed],
                   "outputByteLimit": 100}),
        );
        let out = run_to_end(&mut c, &id);
        let text = out["output"].as_str().expect("output is a string");
        assert!(
            text.len() <= 100,
            "{ch}: {} bytes kept, limit 100: {text:?}",
            text.len()
        );
        assert!(
            text.len() > 100 - ch.len_utf8(),
            "{ch}: only {} bytes kept; at most a partial character may be dropped: {text:?}",
            text.len()
        );
        assert!(
            !text.contains('\u{FFFD}'),
            "{ch}: starts inside a character: {text:?}"
        );
        assert!(
            text.starts_with(ch),
            "{ch}: does not start on a character boundary: {text:?}"
        );
        assert!(
            printed.ends_with(text),
            "{ch}: not a tail of what was printed: {text:?}"
        );
        assert_eq!(out["truncated"], true, "{ch}: {out}");
        assert_eq!(out["exitStatus"], json!({"exitCode": 0, "signal": null}));
        release(&mut c, &id);
    }

    // Under the limit nothing is truncated.
    let id = create_with(
        &mut c,
        json!({"sessionId": "s", "command": "printf", "args": ["%s", "ééé"],
               "outputByteLimit": 100}),
    );
    let out = run_to_end(&mut c, &id);
    assert_eq!(out["output"], "ééé");
    assert_eq!(out["truncated"], false);
    assert_no_panic(&d);
}

#[test]
fn stdout_and_stderr_are_merged_in_order() {
    let d = Daemon::start(&[]);
    let mut c = d.client();
    let id = create(
        &mut c,
        "sh",
        &[
            "-c",
            "echo 1; echo 2 >&2; echo 3; echo 4 >&2; echo 5; echo 6 >&2",
        ],
    );
    let out = run_to_end(&mut c, &id);
    assert_eq!(out["output"], "1\n2\n3\n4\n5\n6\n");
    assert_eq!(out["truncated"], false);
    release(&mut c, &id);
}

#[test]
fn incomplete_character_is_held_back_while_running_and_bad_bytes_are_replaced() {
    let d = Daemon::start(&[]);
    let dir = TempDir::new();
    let gate = dir.path().join("gate");
    let mut c = d.client();
    // "a" and the first two bytes of "€" (E2 82 AC), then the rest once the gate opens.
    let id = create_with(
        &mut c,
        json!({"sessionId": "s", "command": "sh", "args": ["-c",
            "printf 'a\\342\\202'; while [ ! -e \"$1\" ]; do sleep 0.02; done; printf '\\254b'",
            "sh", gate]}),
    );
    wait_until("the first bytes arrive", || {
        terminal_entry(&mut c, &id)["outputBytes"] == 3
    });
    let out = output(&mut c, &id);
    assert_eq!(
        out["output"], "a",
        "an incomplete character is held back: {out}"
    );
    open_gate(&gate);
    let out = run_to_end(&mut c, &id);
    assert_eq!(out["output"], "a€b");
    release(&mut c, &id);

    // Invalid bytes become U+FFFD; an incomplete character at the very end of a finished
    // stream is not held back forever.
    let id = create(&mut c, "printf", &["a\\377b\\342\\202"]);
    let out = run_to_end(&mut c, &id);
    let text = out["output"].as_str().expect("output");
    assert!(text.starts_with("a\u{FFFD}b"), "{text:?}");
    assert!(
        text.len() > "a\u{FFFD}b".len(),
        "the trailing bytes are returned: {text:?}"
    );
    release(&mut c, &id);
}

#[test]
fn output_written_right_before_exit_is_all_there() {
    let d = Daemon::start(&[]);
    let mut c = d.client();
    for _ in 0..5 {
        // More than any pipe buffer, written as fast as possible, then an immediate exit.
        let id = create(
            &mut c,
            "sh",
            &["-c", "head -c 3000000 /dev/zero | tr '\\0' x; echo END"],
        );
        wait_exit(&mut c, &id);
        let out = output(&mut c, &id);
        let text = out["output"].as_str().expect("output");
        assert!(
            text.ends_with("xxEND\n"),
            "the end of the output is missing at exit"
        );
        assert_eq!(text.len(), 1 << 20, "the default ring keeps 1 MiB");
        assert_eq!(out["truncated"], true);
        assert_eq!(terminal_entry(&mut c, &id)["outputBytes"], 3_000_004);
        release(&mut c, &id);
    }
}

// ---- process lifetime --------------------------------------------------------------------

#[test]
fn background_grandchild_does_not_delay_exit_and_release_kills_it() {
    let d = Daemon::start(&[]);
    let mut c = d.client();
    let id = create(&mut c, "sh", &["-c", "sleep 60 & echo $!; echo hi"]);
    // The leader exits at once; the sleeping grandchild still holds the pipe open.
    assert_eq!(
        wait_exit(&mut c, &id),
        json!({"exitCode": 0, "signal": null})
    );
    let out = output(&mut c, &id);
    let text = out["output"].as_str().expect("output");
    let mut lines = text.lines();
    let pid: i32 = lines
        .next()
        .and_then(|l| l.trim().parse().ok())
        .unwrap_or_else(|| panic!("no pid in output {text:?}"));
    assert_eq!(lines.next(), Some("hi"), "output {text:?}");
    assert_eq!(out["exitStatus"], json!({"exitCode": 0, "signal": null}));
    assert!(
        pid_alive(pid),
        "the background sleep should still run before release"
    );

    release(&mut c, &id);
    wait_until("release kills the background grandchild", || {
        !pid_alive(pid)
    });
    wait_until("no zombie left", || zombie_children(d.pid()).is_empty());
    assert_no_panic(&d);
}

#[test]
fn no_zombies_after_200_concurrent_terminals() {
    let d = Daemon::start(&[]);
    let mut c = d.client();
    let sent: Vec<u64> = (0..200)
        .map(|i| {
            let cmd = if i % 2 == 0 { "true" } else { "sh -c 'exit 0'" };
            c.send("terminal/create", json!({"sessionId": "s", "command": cmd}))
                .expect("send create")
        })
        .collect();
    let ids: Vec<String> = sent
        .into_iter()
        .map(|n| {
            let r = answer(&mut c, n).expect("create");
            r["terminalId"].as_str().expect("terminalId").to_string()
        })
        .collect();
    let mut unique = ids.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), 200, "terminal ids are unique");

    let waits: Vec<u64> = ids
        .iter()
        .map(|id| {
            c.send(
                "terminal/wait_for_exit",
                json!({"sessionId": "s", "terminalId": id}),
            )
            .expect("send wait")
        })
        .collect();
    for n in waits {
        let r = answer(&mut c, n).expect("wait_for_exit");
        assert_eq!(r, json!({"exitCode": 0, "signal": null}));
    }
    wait_until("the daemon has no zombie children", || {
        zombie_children(d.pid()).is_empty()
    });
    for id in &ids {
        release(&mut c, id);
    }
    assert!(list(&mut c).is_empty(), "all released");
    assert!(zombie_children(d.pid()).is_empty());
    assert_no_panic(&d);
}

#[test]
fn kill_answers_after_exit_and_output_shows_the_signal() {
    let d = Daemon::start(&[]);
    let mut c = d.client();
    let id = create(&mut c, "sleep", &["60"]);
    let pid = pid_of(&mut c, &id);
    let r = ok(
        &mut c,
        "terminal/kill",
        json!({"sessionId": "s", "terminalId": id}),
    );
    assert_eq!(r, json!({}));
    // The kill was answered only once the leader exited: the status is already there.
    let out = output(&mut c, &id);
    assert_eq!(
        out["exitStatus"],
        json!({"exitCode": null, "signal": "SIGTERM"}),
        "{out}"
    );
    assert_eq!(
        wait_exit(&mut c, &id),
        json!({"exitCode": null, "signal": "SIGTERM"})
    );
    assert!(!pid_alive(pid));
    // Killing an exited command is fine and changes nothing.
    let r = ok(
        &mut c,
        "terminal/kill",
        json!({"sessionId": "s", "terminalId": id}),
    );
    assert_eq!(r, json!({}));
    assert_eq!(output(&mut c, &id)["exitStatus"]["signal"], "SIGTERM");
    release(&mut c, &id);
}

#[test]
fn kill_escalates_to_sigkill_and_answers_only_after_the_leader_exited() {
    let d = Daemon::start(&[]);
    let mut c = d.client();
    // Ignores SIGTERM (and its children inherit that), so only the SIGKILL after
    // --kill-grace ends it.
    let id = create(
        &mut c,
        "sh",
        &[
            "-c",
            "trap '' TERM; echo ready; while :; do sleep 0.05; done",
        ],
    );
    wait_until("the trap is set", || {
        output(&mut c, &id)["output"] == "ready\n"
    });
    let r = ok(
        &mut c,
        "terminal/kill",
        json!({"sessionId": "s", "terminalId": id}),
    );
    assert_eq!(r, json!({}));
    let out = output(&mut c, &id);
    assert_eq!(
        out["exitStatus"],
        json!({"exitCode": null, "signal": "SIGKILL"}),
        "{out}"
    );
    assert_eq!(out["output"], "ready\n");
    assert_eq!(
        wait_exit(&mut c, &id),
        json!({"exitCode": null, "signal": "SIGKILL"})
    );
    release(&mut c, &id);
    assert_no_panic(&d);
}

#[test]
fn released_terminal_is_not_found_for_every_method() {
    let d = Daemon::start(&[]);
    let mut c = d.client();
    let running = create(&mut c, "sleep", &["60"]);
    let pid = pid_of(&mut c, &running);
    let exited = create(&mut c, "true", &[]);
    wait_exit(&mut c, &exited);
    for id in [&running, &exited] {
        release(&mut c, id);
        for method in [
            "terminal/output",
            "terminal/wait_for_exit",
            "terminal/kill",
            "terminal/release",
        ] {
            let (code, msg, _) = err(&mut c, method, json!({"sessionId": "s", "terminalId": id}));
            assert_eq!(code, -32002, "{method} after release: {msg}");
        }
    }
    wait_until("release killed the running command", || !pid_alive(pid));
    assert!(list(&mut c).is_empty());
    // An id that never existed is the same error.
    let (code, _, _) = err(
        &mut c,
        "terminal/output",
        json!({"sessionId": "s", "terminalId": "term-does-not-exist"}),
    );
    assert_eq!(code, -32002);
}

#[test]
fn terminal_from_another_session_is_not_found() {
    let d = Daemon::start(&[]);
    let mut c = d.client();
    let id = create(&mut c, "sleep", &["60"]);
    for method in [
        "terminal/output",
        "terminal/wait_for_exit",
        "terminal/kill",
        "terminal/release",
    ] {
        let (code, msg, _) = err(
            &mut c,
            method,
            json!({"sessionId": "other", "terminalId": id}),
        );
        assert_eq!(code, -32002, "{method} under the wrong session: {msg}");
    }
    // Nothing above touched it: it still runs under its own session.
    assert!(output(&mut c, &id).get("exitStatus").is_none());
    let other = ok(&mut c, "terminal/list", json!({"sessionId": "other"}));
    assert_eq!(other["terminals"], json!([]));
    release(&mut c, &id);
}

// ---- parked waits ------------------------------------------------------------------------

#[test]
fn parked_wait_survives_another_client_disconnecting_mid_request() {
    let d = Daemon::start(&[]);
    let dir = TempDir::new();
    let gate = dir.path().join("gate");
    let mut a = d.client();
    let id = create_with(&mut a, gated(&gate));
    let params = json!({"sessionId": "s", "terminalId": id});
    let a_wait = a
        .send("terminal/wait_for_exit", params.clone())
        .expect("send");

    // B1 sends its wait and goes away at once, without reading anything.
    let mut b1 = d.client();
    b1.send("terminal/wait_for_exit", params.clone())
        .expect("send");
    drop(b1);
    // B2's wait is certainly parked (a later request was answered) before it goes away.
    let mut b2 = d.client();
    b2.send("terminal/wait_for_exit", params.clone())
        .expect("send");
    ok(&mut b2, "terminal/list", json!({}));
    drop(b2);
    // A still works while its wait is parked.
    assert!(output(&mut a, &id).get("exitStatus").is_none());

    open_gate(&gate);
    assert_eq!(
        answer(&mut a, a_wait).expect("A's parked wait"),
        json!({"exitCode": 0, "signal": null})
    );
    // A third request from A works.
    assert_eq!(
        output(&mut a, &id)["exitStatus"],
        json!({"exitCode": 0, "signal": null})
    );
    // And the daemon still accepts new clients.
    let mut c = d.client();
    assert_eq!(terminal_entry(&mut c, &id)["exitStatus"]["exitCode"], 0);
    release(&mut a, &id);
    assert_no_panic(&d);
}

#[test]
fn any_number_of_waiters_on_two_connections_get_the_exit() {
    let d = Daemon::start(&[]);
    let dir = TempDir::new();
    let gate = dir.path().join("gate");
    let mut a = d.client();
    let mut b = d.client();
    let id = create_with(&mut a, gated(&gate));
    let params = json!({"sessionId": "s", "terminalId": id});
    let wa: Vec<u64> = (0..3)
        .map(|_| {
            a.send("terminal/wait_for_exit", params.clone())
                .expect("send")
        })
        .collect();
    let wb: Vec<u64> = (0..3)
        .map(|_| {
            b.send("terminal/wait_for_exit", params.clone())
                .expect("send")
        })
        .collect();
    // All six are parked: later requests on both connections are answered.
    ok(&mut a, "terminal/list", json!({}));
    ok(&mut b, "terminal/list", json!({}));
    open_gate(&gate);
    for n in wa {
        assert_eq!(
            answer(&mut a, n).expect("wait on A"),
            json!({"exitCode": 0, "signal": null})
        );
    }
    for n in wb {
        assert_eq!(
            answer(&mut b, n).expect("wait on B"),
            json!({"exitCode": 0, "signal": null})
        );
    }
    release(&mut a, &id);
}

#[test]
fn release_answers_parked_waiters_with_the_exit() {
    let d = Daemon::start(&[]);
    let mut a = d.client();
    let mut b = d.client();
    let id = create(&mut a, "sleep", &["60"]);
    let wait = b
        .send(
            "terminal/wait_for_exit",
            json!({"sessionId": "s", "terminalId": id}),
        )
        .expect("send");
    ok(&mut b, "terminal/list", json!({}));
    release(&mut a, &id);
    assert_eq!(
        answer(&mut b, wait).expect("parked wait after release"),
        json!({"exitCode": null, "signal": "SIGTERM"})
    );
}

// ---- terminal/create validation ----------------------------------------------------------

#[test]
fn bad_cwd_env_and_program_are_refused_and_leave_nothing_behind() {
    let d = Daemon::start(&[]);
    let dir = TempDir::new();
    let file = dir.path().join("a-file");
    std::fs::write(&file, b"x").expect("write file");
    let mut c = d.client();

    let base = |extra: Value| {
        let mut p = json!({"sessionId": "s", "command": "true"});
        for (k, v) in extra.as_object().expect("object") {
            p[k] = v.clone();
        }
        p
    };
    let cases = [
        (json!({"cwd": "relative/dir"}), "cwd"),
        (json!({"cwd": "/nonexistent-execd-test/dir"}), "cwd"),
        (json!({"cwd": file}), "cwd"),
        (json!({"env": [{"name": "A\u{0}B", "value": "x"}]}), "env"),
        (json!({"env": [{"name": "A", "value": "x\u{0}y"}]}), "env"),
        (json!({"env": [{"name": "A=B", "value": "x"}]}), "env"),
        (json!({"env": [{"name": "", "value": "x"}]}), "env"),
    ];
    for (extra, field) in cases {
        let params = base(extra.clone());
        let (code, msg, data) = err(&mut c, "terminal/create", params);
        assert_eq!(code, -32602, "{extra}: {msg}");
        let data = data.unwrap_or_else(|| panic!("{extra}: no data in the error"));
        assert_eq!(data["field"], field, "{extra}: {data}");
        assert!(
            data["reason"].as_str().is_some_and(|r| !r.is_empty()),
            "{extra}: no reason: {data}"
        );
    }

    for (command, args) in [
        ("no-such-program-execd-test", json!(null)),
        ("/nonexistent-execd-test/prog", json!(["x"])),
    ] {
        let (code, msg, _) = err(
            &mut c,
            "terminal/create",
            json!({"sessionId": "s", "command": command, "args": args}),
        );
        assert_eq!(code, -32004, "{command}");
        assert_eq!(msg, "No such file or directory", "{command}");
    }
    // A file that is not executable (the owner's execute bit matters even for root).
    let (code, msg, _) = err(
        &mut c,
        "terminal/create",
        json!({"sessionId": "s", "command": file, "args": ["x"]}),
    );
    assert_eq!((code, msg.as_str()), (-32004, "Permission denied"));

    assert_eq!(
        list(&mut c),
        Vec::<Value>::new(),
        "failed spawns leave no terminal"
    );
    let all = ok(&mut c, "terminal/list", json!({}));
    assert_eq!(all["terminals"], json!([]));
    wait_until("no zombie left by failed spawns", || {
        zombie_children(d.pid()).is_empty()
    });
    // The daemon still works.
    let id = create(&mut c, "true", &[]);
    assert_eq!(wait_exit(&mut c, &id)["exitCode"], 0);
    assert_no_panic(&d);
}

#[test]
fn env_and_cwd_are_honoured() {
    let d = Daemon::start(&[]);
    let dir = TempDir::new();
    let cwd = canonical(dir.path());
    let mut c = d.client();
    let id = create_with(
        &mut c,
        json!({
            "sessionId": "s",
            "command": "sh",
            "args": ["-c", "echo \"$EXECD_TEST_VAR\"; echo \"$SECOND\"; pwd -P"],
            "env": [
                {"name": "EXECD_TEST_VAR", "value": "hello world ü"},
                {"name": "SECOND", "value": ""},
            ],
            "cwd": cwd,
        }),
    );
    let out = run_to_end(&mut c, &id);
    assert_eq!(
        out["output"].as_str().expect("output"),
        format!("hello world ü\n\n{}\n", cwd.display())
    );
    assert_eq!(terminal_entry(&mut c, &id)["cwd"], json!(cwd));
    release(&mut c, &id);

    // The daemon's own environment is passed on under the request's variables.
    let id = create_with(
        &mut c,
        json!({"sessionId": "s", "command": "sh", "args": ["-c", "echo \"$PATH\""]}),
    );
    let out = run_to_end(&mut c, &id);
    let path = std::env::var("PATH").unwrap_or_default();
    assert_eq!(out["output"].as_str().expect("output"), format!("{path}\n"));
    release(&mut c, &id);
}

#[test]
fn command_line_rule_direct_or_shell() {
    let d = Daemon::start(&[]);
    let dir = TempDir::new();
    let cwd = canonical(dir.path());
    let mut c = d.client();

    // With args: executed directly, nothing is expanded.
    let id = create(&mut c, "echo", &["$HOME", "&&", "a  b", "*"]);
    assert_eq!(run_to_end(&mut c, &id)["output"], "$HOME && a  b *\n");
    release(&mut c, &id);

    // A plain word without args: executed directly too.
    let id = create_with(
        &mut c,
        json!({"sessionId": "s", "command": "pwd", "cwd": cwd}),
    );
    assert_eq!(
        run_to_end(&mut c, &id)["output"].as_str().expect("output"),
        format!("{}\n", cwd.display())
    );
    release(&mut c, &id);
    // ... which is why a missing plain word fails to spawn instead of a shell exiting 127.
    let (code, msg, _) = err(
        &mut c,
        "terminal/create",
        json!({"sessionId": "s", "command": "no-such-program-execd-test"}),
    );
    assert_eq!((code, msg.as_str()), (-32004, "No such file or directory"));
    // An empty args array counts as absent.
    let (code, _, _) = err(
        &mut c,
        "terminal/create",
        json!({"sessionId": "s", "command": "no-such-program-execd-test", "args": []}),
    );
    assert_eq!(code, -32004);

    // Not a plain word: run via the shell, so variables and && work.
    let id = create_with(
        &mut c,
        json!({"sessionId": "s", "command": "echo $HOME && echo x",
               "env": [{"name": "HOME", "value": "/home/execd-test"}]}),
    );
    assert_eq!(run_to_end(&mut c, &id)["output"], "/home/execd-test\nx\n");
    release(&mut c, &id);
    // Through the shell, a missing program is the shell's exit 127, not a spawn failure.
    let id = create_with(
        &mut c,
        json!({"sessionId": "s", "command": "no-such-program-execd-test --flag"}),
    );
    assert_eq!(
        wait_exit(&mut c, &id),
        json!({"exitCode": 127, "signal": null})
    );
    release(&mut c, &id);
}

#[test]
fn list_shows_pid_start_and_usage() {
    let d = Daemon::start(&[]);
    let dir = TempDir::new();
    let gate = dir.path().join("gate");
    let mut c = d.client();
    let id = create_with(&mut c, gated(&gate));

    let e = terminal_entry(&mut c, &id);
    assert_eq!(e["sessionId"], "s");
    assert_eq!(e["command"], "sh");
    assert_eq!(e["args"][0], "-c");
    let pid = e["pid"].as_i64().expect("pid") as i32;
    assert!(
        pid > 1 && pid_alive(pid),
        "pid {pid} is a live process: {e}"
    );
    let started = e["startedAt"].as_str().expect("startedAt");
    let b = started.as_bytes();
    assert!(
        started.len() >= 20
            && started.ends_with('Z')
            && b[4] == b'-'
            && b[7] == b'-'
            && b[10] == b'T'
            && b[13] == b':'
            && b[16] == b':',
        "startedAt is RFC 3339 UTC: {started}"
    );
    assert!(e["cwd"].as_str().is_some_and(|s| s.starts_with('/')), "{e}");
    assert!(
        e.get("exitStatus").is_none(),
        "running: no exitStatus yet: {e}"
    );
    assert!(e["outputBytes"].is_u64(), "{e}");

    open_gate(&gate);
    wait_exit(&mut c, &id);
    let e = terminal_entry(&mut c, &id);
    let status = &e["exitStatus"];
    assert_eq!(status["exitCode"], 0, "{e}");
    assert_eq!(status["signal"], Value::Null, "{e}");
    let usage = &status["_meta"]["execd"];
    for field in ["durationMs", "userMs", "systemMs", "maxRssKb"] {
        assert!(usage[field].is_u64(), "{field} in {e}");
    }
    assert!(
        usage["maxRssKb"].as_u64() > Some(0),
        "maxRssKb of a real process: {e}"
    );
    assert_eq!(e["pid"], pid, "the pid stays listed after exit");
    assert_eq!(e["startedAt"], started);

    // Without sessionId every session is listed; with another one, none of these.
    let other = create_with(&mut c, json!({"sessionId": "t", "command": "true"}));
    let all = ok(&mut c, "terminal/list", json!({}));
    let ids: Vec<&str> = all["terminals"]
        .as_array()
        .expect("terminals")
        .iter()
        .filter_map(|t| t["terminalId"].as_str())
        .collect();
    assert!(
        ids.contains(&id.as_str()) && ids.contains(&other.as_str()),
        "{all}"
    );
    assert!(list(&mut c).iter().all(|t| t["sessionId"] == "s"));
    release(&mut c, &id);
}

// ---- daemon lifetime and the socket ------------------------------------------------------

#[test]
fn sigterm_kills_commands_answers_parked_waits_and_removes_the_socket() {
    let mut d = Daemon::start(&[]);
    let mut c = d.client();
    let ids: Vec<String> = (0..3).map(|_| create(&mut c, "sleep", &["60"])).collect();
    // A command with a grandchild in its group, too.
    let bg = create(&mut c, "sh", &["-c", "sleep 60 & echo $!; wait"]);
    wait_until("the background pid is printed", || {
        output(&mut c, &bg)["output"]
            .as_str()
            .is_some_and(|s| s.ends_with('\n'))
    });
    let grandchild: i32 = output(&mut c, &bg)["output"]
        .as_str()
        .and_then(|s| s.trim().parse().ok())
        .expect("pid printed");
    let mut pids: Vec<i32> = ids.iter().map(|id| pid_of(&mut c, id)).collect();
    pids.push(pid_of(&mut c, &bg));
    pids.push(grandchild);
    for &p in &pids {
        assert!(pid_alive(p));
    }

    let mut w = d.client();
    let parked = w
        .send(
            "terminal/wait_for_exit",
            json!({"sessionId": "s", "terminalId": ids[0]}),
        )
        .expect("send");
    ok(&mut w, "terminal/list", json!({})); // the wait is parked

    assert_eq!(d.terminate(), Some(0), "execd exits 0 on SIGTERM");
    assert!(!d.socket.exists(), "the socket file is removed");
    for &p in &pids {
        wait_until(&format!("pid {p} killed by shutdown"), || !pid_alive(p));
    }

    // The parked wait got an answer (the exit, or -32007) before the connection closed.
    let m = w
        .read_message(Some(WAIT))
        .expect("an answer to the parked wait");
    assert_eq!(m["id"], json!(parked), "{m}");
    match (m.get("result"), m.get("error")) {
        (Some(r), None) => assert_eq!(r["exitCode"], Value::Null, "{m}"),
        (None, Some(e)) => assert_eq!(e["code"], -32007, "{m}"),
        _ => panic!("not a response: {m}"),
    }
    let after = w.read_message(Some(WAIT));
    assert!(
        after.is_err(),
        "the connection is closed after the answer: {after:?}"
    );
    let log = d.log();
    assert!(!log.contains("panicked"), "{log}");
}

#[test]
fn sigint_shuts_down_like_sigterm() {
    let mut d = Daemon::start(&[]);
    let mut c = d.client();
    let id = create(&mut c, "sleep", &["60"]);
    let pid = pid_of(&mut c, &id);
    let mut child = d.child.take().expect("daemon child");
    unsafe_kill(child.id() as i32, libc::SIGINT);
    let status = wait_child(&mut child);
    assert_eq!(status.code(), Some(0), "execd exits 0 on SIGINT");
    assert!(!d.socket.exists(), "the socket file is removed");
    wait_until("the command is killed", || !pid_alive(pid));
}

#[test]
fn second_daemon_on_a_live_socket_refuses_to_start() {
    let d = Daemon::start(&[]);
    let mut second = Command::new(env!("CARGO_BIN_EXE_execd"))
        .arg("--socket")
        .arg(&d.socket)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn second execd");
    let status = wait_child(&mut second);
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut second.stderr.take().expect("stderr"), &mut stderr)
        .expect("read stderr");
    assert_eq!(
        status.code(),
        Some(1),
        "second daemon's exit status; stderr: {stderr}"
    );
    assert!(
        stderr.contains(&d.socket.display().to_string()),
        "the refusal names the socket: {stderr:?}"
    );
    // The first daemon keeps its socket and keeps serving.
    assert!(d.socket.exists());
    let mut c = d.client();
    let id = create(&mut c, "true", &[]);
    assert_eq!(wait_exit(&mut c, &id)["exitCode"], 0);
}

#[test]
fn stale_socket_file_is_replaced() {
    let place = TempDir::new();
    let socket = place.path().join("execd.sock");
    let mut first = Daemon::start_at(TempDir::new(), socket.clone(), &[]);
    let mut child = first.child.take().expect("child");
    child.kill().expect("SIGKILL execd");
    child.wait().expect("reap execd");
    assert!(socket.exists(), "a SIGKILLed daemon leaves its socket file");
    assert!(std::os::unix::net::UnixStream::connect(&socket).is_err());

    let second = Daemon::start_at(TempDir::new(), socket.clone(), &[]);
    let mut c = second.client();
    let id = create(&mut c, "true", &[]);
    assert_eq!(
        wait_exit(&mut c, &id),
        json!({"exitCode": 0, "signal": null})
    );
}

#[test]
fn a_file_that_is_not_a_socket_is_never_replaced() {
    let place = TempDir::new();
    let path = place.path().join("precious");
    std::fs::write(&path, "keep me").expect("write file");
    let stderr = refused_start(&["--socket", path.to_str().expect("utf-8")]);
    assert!(stderr.contains("not a socket"), "{stderr:?}");
    assert_eq!(
        std::fs::read_to_string(&path).expect("still a file"),
        "keep me"
    );
}

/// A descendant that ignores SIGTERM while its leader dies of it must not outlive release
/// or shutdown: the whole group gets SIGKILL after the grace.
#[test]
fn term_ignoring_descendants_die_on_release_and_on_shutdown() {
    let script = "(trap '' TERM; exec sleep 60) & echo $!; wait";
    let mut d = Daemon::start(&[]);
    let mut c = d.client();
    let id = create(&mut c, "sh", &["-c", script]);
    let mut pid = 0;
    wait_until("the descendant's pid is printed", || {
        pid = output(&mut c, &id)["output"]
            .as_str()
            .and_then(|o| o.trim().parse().ok())
            .unwrap_or(0);
        pid > 0
    });
    release(&mut c, &id);
    wait_until(
        "the TERM-ignoring descendant is killed after release",
        || !pid_alive(pid),
    );

    let id = create(&mut c, "sh", &["-c", script]);
    let mut pid = 0;
    wait_until("the descendant's pid is printed", || {
        pid = output(&mut c, &id)["output"]
            .as_str()
            .and_then(|o| o.trim().parse().ok())
            .unwrap_or(0);
        pid > 0
    });
    assert_eq!(d.terminate(), Some(0));
    wait_until("the TERM-ignoring descendant is killed at shutdown", || {
        !pid_alive(pid)
    });
}

#[test]
fn socket_file_mode_is_0600() {
    let d = Daemon::start(&[]);
    let meta = std::fs::metadata(&d.socket).expect("socket metadata");
    assert_eq!(meta.permissions().mode() & 0o7777, 0o600);
}

// ---- limits ------------------------------------------------------------------------------

#[test]
fn max_processes_is_a_limit_error() {
    let d = Daemon::start(&["--max-processes", "3"]);
    let mut c = d.client();
    let ids: Vec<String> = (0..3).map(|_| create(&mut c, "sleep", &["60"])).collect();
    let (code, msg, data) = err(
        &mut c,
        "terminal/create",
        json!({"sessionId": "s", "command": "true"}),
    );
    assert_eq!(code, -32003, "{msg}");
    assert_eq!(data, Some(json!({"limit": "max-processes", "value": 3})));
    assert_eq!(
        list(&mut c).len(),
        3,
        "the refused create left nothing behind"
    );

    // Once one ends, there is room again.
    ok(
        &mut c,
        "terminal/kill",
        json!({"sessionId": "s", "terminalId": ids[0]}),
    );
    let id = create(&mut c, "true", &[]);
    assert_eq!(wait_exit(&mut c, &id)["exitCode"], 0);
    for id in ids.iter().chain([&id]) {
        release(&mut c, id);
    }
}

#[test]
fn exited_terminals_past_max_retained_are_released_oldest_first() {
    let d = Daemon::start(&["--max-retained", "2"]);
    let mut c = d.client();
    let running = create(&mut c, "sleep", &["60"]);
    let ids: Vec<String> = (0..3)
        .map(|_| {
            let id = create(&mut c, "true", &[]);
            wait_exit(&mut c, &id);
            id
        })
        .collect();
    let (code, _, _) = err(
        &mut c,
        "terminal/output",
        json!({"sessionId": "s", "terminalId": ids[0]}),
    );
    assert_eq!(code, -32002, "the oldest exited terminal was released");
    for id in &ids[1..] {
        assert_eq!(output(&mut c, id)["exitStatus"]["exitCode"], 0);
    }
    // A running terminal does not count against the limit and is not released.
    assert!(output(&mut c, &running).get("exitStatus").is_none());
    let mut listed: Vec<String> = list(&mut c)
        .iter()
        .filter_map(|t| t["terminalId"].as_str().map(String::from))
        .collect();
    listed.sort();
    let mut want = vec![running.clone(), ids[1].clone(), ids[2].clone()];
    want.sort();
    assert_eq!(listed, want);
    release(&mut c, &running);
}

#[test]
fn max_clients_refuses_the_extra_connection() {
    let d = Daemon::start(&["--max-clients", "2"]);
    // The harness's readiness probe may still count for a moment: retry until both slots
    // are ours.
    let connect_served = || {
        let mut out = None;
        wait_until("a served connection", || {
            let mut c = d.client();
            if c.call("terminal/list", json!({})).is_ok() {
                out = Some(c);
                true
            } else {
                false
            }
        });
        out.expect("connected")
    };
    let mut a = connect_served();
    let b = connect_served();

    let refusals = || d.log().matches(": max-clients").count();
    let before = refusals();
    let mut extra = d.client();
    let m = extra.read_message(Some(WAIT)).expect("an error line");
    assert_eq!(m["id"], Value::Null, "{m}");
    assert_eq!(m["error"]["code"], -32003, "{m}");
    assert_eq!(
        m["error"]["data"],
        json!({"limit": "max-clients", "value": 2}),
        "{m}"
    );
    // The log says so before the peer is told.
    assert_eq!(refusals(), before + 1, "logged first: {}", d.log());
    let closed = extra.read_message(Some(WAIT));
    assert!(
        closed.is_err(),
        "the extra connection is closed: {closed:?}"
    );

    // Served connections are unaffected; a freed slot can be used again.
    ok(&mut a, "terminal/list", json!({}));
    drop(b);
    let mut c = connect_served();
    ok(&mut c, "terminal/list", json!({}));
    assert_no_panic(&d);
}

#[test]
fn output_limit_default_and_max_clamp() {
    let d = Daemon::start(&["--output-limit", "1000", "--max-output-limit", "4096"]);
    let mut c = d.client();
    let script = "head -c 100000 /dev/zero | tr '\\0' a; echo END";
    for (limit, want) in [
        (json!(null), 1000),
        (json!(1_000_000), 4096),
        (json!(u64::MAX), 4096),
        (json!(4096), 4096),
        (json!(200), 200),
    ] {
        let id = create_with(
            &mut c,
            json!({"sessionId": "s", "command": "sh", "args": ["-c", script],
                   "outputByteLimit": limit}),
        );
        let out = run_to_end(&mut c, &id);
        let text = out["output"].as_str().expect("output");
        assert_eq!(
            text.len(),
            want,
            "outputByteLimit {limit}: kept {} bytes",
            text.len()
        );
        assert!(
            text.ends_with("aaaaEND\n"),
            "outputByteLimit {limit}: not the tail"
        );
        assert!(
            text.bytes().rev().skip(4).all(|b| b == b'a'),
            "outputByteLimit {limit}"
        );
        assert_eq!(out["truncated"], true, "outputByteLimit {limit}");
        release(&mut c, &id);
    }
}

/// Runs `execctl` as uid/gid 65534 (nobody) against `socket`; returns its stdout.
fn execctl_as_nobody(socket: &Path, args: &[&str]) -> String {
    use std::os::unix::process::CommandExt;
    let mut child = Command::new(env!("CARGO_BIN_EXE_execctl"))
        .arg("--socket")
        .arg(socket)
        .args(args)
        .uid(65534)
        .gid(65534)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn execctl as nobody");
    let status = wait_child(&mut child);
    let mut out = String::new();
    std::io::Read::read_to_string(&mut child.stdout.take().expect("stdout"), &mut out)
        .expect("read stdout");
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().expect("stderr"), &mut err)
        .expect("read stderr");
    assert!(
        status.success(),
        "execctl {args:?} as nobody: {status}; stderr: {err}"
    );
    out
}

/// Starts `execd` with `args` where it must refuse to start; returns its stderr after
/// checking it exited 1.
fn refused_start(args: &[&str]) -> String {
    let mut daemon = Command::new(env!("CARGO_BIN_EXE_execd"))
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn execd");
    let status = wait_child(&mut daemon);
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut daemon.stderr.take().expect("stderr"), &mut stderr)
        .expect("read stderr");
    assert_eq!(status.code(), Some(1), "execd {args:?}; stderr: {stderr}");
    stderr
}

/// A root daemon runs a non-root peer's commands as that peer, groups included.
#[test]
fn root_daemon_runs_a_peers_commands_as_the_peer() {
    if !running_as_root() {
        skip("needs root to start a daemon that switches users");
        return;
    }
    let d = Daemon::start(&["--socket-mode", "0666", "--allow-uid", "65534"]);
    d.let_others_in();
    let out = execctl_as_nobody(&d.socket, &["run", "--", "sh", "-c", "id -u; id -g; id -G"]);
    assert_eq!(
        out, "65534\n65534\n65534\n",
        "uid, gid and groups of the command"
    );
    // The daemon's own uid still runs as itself.
    let mut c = d.client();
    let id = create(&mut c, "id", &["-u"]);
    wait_exit(&mut c, &id);
    assert_eq!(output(&mut c, &id)["output"], "0\n");
}

/// `--run-as USER` replaces the peer's own identity for non-root peers.
#[test]
fn run_as_names_the_user_for_non_root_peers() {
    if !running_as_root() {
        skip("needs root to start a daemon that switches users");
        return;
    }
    let passwd = std::fs::read_to_string("/etc/passwd").unwrap_or_default();
    let Some(daemon_uid) = passwd
        .lines()
        .find(|l| l.starts_with("daemon:"))
        .and_then(|l| l.split(':').nth(2))
    else {
        skip("no 'daemon' user in /etc/passwd to run as");
        return;
    };
    let d = Daemon::start(&[
        "--socket-mode",
        "0666",
        "--allow-uid",
        "65534",
        "--run-as",
        "daemon",
    ]);
    d.let_others_in();
    let out = execctl_as_nobody(&d.socket, &["run", "--", "id", "-u"]);
    assert_eq!(out.trim(), daemon_uid);
}

#[test]
fn run_as_an_unknown_user_refuses_to_start() {
    let place = TempDir::new();
    let socket = place.path().join("s.sock");
    let stderr = refused_start(&[
        "--socket",
        socket.to_str().expect("utf-8"),
        "--run-as",
        "no-such-user-here",
    ]);
    assert!(stderr.contains("no-such-user-here"), "{stderr:?}");
    assert!(!socket.exists(), "a refused start leaves no socket file");
}

#[test]
fn rlimits_apply_to_commands_and_impossible_ones_refuse_to_start() {
    let d = Daemon::start(&["--rlimit", "nofile=64", "--rlimit", "cpu=5"]);
    let mut c = d.client();
    let id = create(&mut c, "sh", &["-c", "ulimit -n; ulimit -t"]);
    wait_exit(&mut c, &id);
    assert_eq!(output(&mut c, &id)["output"], "64\n5\n");

    let place = TempDir::new();
    let socket = place.path().join("s.sock");
    let stderr = refused_start(&[
        "--socket",
        socket.to_str().expect("utf-8"),
        "--rlimit",
        "nofile=99999999999",
    ]);
    assert!(stderr.contains("nofile"), "{stderr:?}");
    assert!(!socket.exists(), "a refused start leaves no socket file");
}

#[test]
fn a_variable_given_twice_takes_its_last_value() {
    let d = Daemon::start(&[]);
    let mut c = d.client();
    let id = create_with(
        &mut c,
        json!({"sessionId": "s", "command": "sh", "args": ["-c", "echo $A; env | grep -c '^A='"],
               "env": [{"name": "A", "value": "1"}, {"name": "A", "value": "2"}]}),
    );
    wait_exit(&mut c, &id);
    assert_eq!(output(&mut c, &id)["output"], "2\n1\n");
}

/// systemd socket activation: with `LISTEN_PID` = its pid and `LISTEN_FDS=1`, execd serves
/// the listener on fd 3 and neither creates nor removes a socket file.
#[test]
fn systemd_socket_activation_serves_fd_3() {
    use std::os::fd::AsRawFd;
    use std::os::unix::process::CommandExt;
    let place = TempDir::new();
    let path = place.path().join("activated.sock");
    let listener = std::os::unix::net::UnixListener::bind(&path).expect("bind");
    let fd = listener.as_raw_fd();
    let unused = place.path().join("never-created.sock");
    let mut cmd = Command::new("sh");
    cmd.arg("-c")
        .arg(r#"LISTEN_PID=$$ LISTEN_FDS=1 exec "$0" --socket "$1""#)
        .arg(env!("CARGO_BIN_EXE_execd"))
        .arg(&unused)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    // SAFETY: dup2 and fcntl are async-signal-safe; they put the listener on fd 3 without
    // close-on-exec (dup2 onto itself would change nothing, so then the flag is cleared).
    unsafe {
        cmd.pre_exec(move || {
            let rc = if fd == 3 {
                libc::fcntl(3, libc::F_SETFD, 0)
            } else {
                libc::dup2(fd, 3)
            };
            if rc < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let child = cmd.spawn().expect("spawn execd through sh");
    drop(listener); // the daemon holds its own copy now
    let mut d = Daemon {
        child: Some(child),
        socket: path.clone(),
        dir: TempDir::new(),
    };
    let mut c = {
        let mut client = None;
        wait_until("execd serves the activated socket", || {
            client = Client::connect(&path).ok();
            client.is_some()
        });
        client.expect("connected")
    };
    c.timeout = Some(WAIT);
    let id = create(&mut c, "echo", &["activated"]);
    wait_exit(&mut c, &id);
    assert_eq!(output(&mut c, &id)["output"], "activated\n");
    let init = ok(&mut c, "initialize", json!({"protocolVersion": 1}));
    assert_eq!(init["_meta"]["execd"]["socket"], path.display().to_string());
    assert!(!unused.exists(), "no socket file is created");
    drop(c);
    assert_eq!(d.terminate(), Some(0));
    assert!(
        path.exists(),
        "an activated socket file is not execd's to remove"
    );
}
