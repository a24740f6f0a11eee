//! Containment (PROTOCOL.md section 9): a cgroup per command, so that nothing a command
//! starts outlives it, whatever it does to leave its process group. These tests run as
//! root against the machine's real cgroup2 mount (found in /proc/self/mountinfo), each
//! in a parent cgroup of its own that is removed afterwards, even when a test fails.

use crate::util::trees::*;
use crate::util::*;

/// A private parent cgroup for one test, or `None` (skipped: `skip` fails it in CI).
#[track_caller]
fn test_cgroup() -> Option<TestCgroup> {
    match TestCgroup::new("test") {
        Ok(cg) => Some(cg),
        Err(why) => {
            skip(&why);
            None
        }
    }
}

/// Every escape shape, each with a marker of its own: (shape, marker, script).
fn marked_escapes(marks: &mut Marks) -> Vec<(&'static str, String, String)> {
    SHAPES
        .into_iter()
        .map(|shape| {
            let m = marks.next();
            let s = script(shape, &m);
            (shape, m, s)
        })
        .collect()
}

/// Starts a terminal of `script` and waits until it printed `ready` and its marked
/// processes exist.
#[track_caller]
fn start_tree(c: &mut Client, script: &str, m: &str) -> String {
    let id = create(c, "sh", &["-c", script]);
    wait_until("the tree is up", || {
        output(c, &id)["output"] == "ready\n" && with_marker(m).len() >= 3
    });
    id
}

fn cgroup_daemon(cg: &TestCgroup, extra: &[&str]) -> Daemon {
    let mut flags = vec!["--cgroup", cg.path(), "--kill-grace", "300ms"];
    flags.extend_from_slice(extra);
    Daemon::start(&flags)
}

/// Release, kill, and a daemon's SIGTERM end every shape of escape, for terminals.
#[test]
fn terminal_release_kill_and_shutdown_leave_nothing_alive() {
    let Some(cg) = test_cgroup() else { return };
    for ending in ["terminal/release", "terminal/kill", "shutdown"] {
        let mut d = cgroup_daemon(&cg, &[]);
        let mut c = d.client();
        let mut guard = Marks::default();
        let mut marks = Vec::new();
        for (shape, m, script) in marked_escapes(&mut guard) {
            let id = start_tree(&mut c, &script, &m);
            marks.push((shape, m, id));
        }
        for (_, _, id) in &marks {
            match ending {
                "shutdown" => {}
                method => {
                    ok(&mut c, method, json!({"sessionId": "s", "terminalId": id}));
                }
            }
        }
        if ending == "shutdown" {
            assert_eq!(d.terminate(), Some(0));
        }
        for (shape, m, _) in &marks {
            all_gone(m, &format!("{shape}, {ending}"));
        }
        drop(d);
    }
}

/// `bash/kill` with SIGKILL, a hard timeout and session close end every shape too.
#[test]
fn bash_kill_hard_timeout_and_session_close_leave_nothing_alive() {
    let Some(cg) = test_cgroup() else { return };
    let d = cgroup_daemon(&cg, &[]);
    let mut c = d.client();
    let mut guard = Marks::default();
    for ending in ["bash/kill", "hard_timeout", "bash/sessions/close"] {
        for (shape, m, script) in marked_escapes(&mut guard) {
            let session = format!("{}-{}", ending.replace('/', "-"), m);
            let mut params = json!({"command": script, "async_mode": true, "session_id": session});
            if ending == "hard_timeout" {
                params["hard_timeout"] = json!(3);
            }
            ok(&mut c, "bash/exec", params);
            wait_until("the tree is up", || with_marker(&m).len() >= 3);
            match ending {
                "bash/kill" => {
                    ok(
                        &mut c,
                        "bash/kill",
                        json!({"session_id": session, "signal": "SIGKILL"}),
                    );
                }
                "bash/sessions/close" => {
                    ok(&mut c, ending, json!({"session_id": session}));
                }
                _ => {}
            }
            all_gone(&m, &format!("{shape}, {ending}"));
        }
    }
}

/// The daemon killed with SIGKILL while such trees run, then started again on the same
/// cgroup: what it left is killed at start, and the count is logged.
#[test]
fn leftovers_of_a_killed_daemon_are_gone_at_the_next_start() {
    let Some(cg) = test_cgroup() else { return };
    let mut d = cgroup_daemon(&cg, &[]);
    let mut c = d.client();
    let mut guard = Marks::default();
    let mut marks = Vec::new();
    for (_, m, script) in marked_escapes(&mut guard) {
        start_tree(&mut c, &script, &m);
        marks.push(m);
    }
    if let Some(mut child) = d.child.take() {
        let _ = child.kill();
        let _ = child.wait();
    }
    // The escapees outlive a SIGKILLed daemon (the parent-death signal reaches only its
    // direct children).
    assert!(
        marks.iter().any(|m| !with_marker(m).is_empty()),
        "something outlived the daemon"
    );
    let again = cgroup_daemon(&cg, &[]);
    for m in &marks {
        all_gone(m, "after the restart");
    }
    wait_until("the count is logged", || {
        again.log().contains("a previous instance left")
    });
    assert!(
        cg.command_cgroups().is_empty(),
        "{:?}",
        cg.command_cgroups()
    );
}

/// A second daemon started on the same `--cgroup` while the first runs takes none of it.
/// On the first's socket it stops before touching a cgroup; on a socket of its own it
/// finds the first in the `daemon` leaf and falls back to process groups, saying why.
/// Either way the first's commands and their cgroups live on.
#[test]
fn a_second_daemon_on_the_same_cgroup_kills_nothing_of_the_first() {
    let Some(cg) = test_cgroup() else { return };
    let first = cgroup_daemon(&cg, &[]);
    let mut c = first.client();
    let mut guard = Marks::default();
    let m = guard.next();
    let id = start_tree(
        &mut c,
        &format!("sleep {m} & echo ready; sleep {m}; true"),
        &m,
    );
    let held = cg.command_cgroups();
    assert_eq!(held.len(), 1, "{held:?}");

    // The same socket: refused, before containment is chosen.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_execd"))
        .arg("--socket")
        .arg(&first.socket)
        .args(["--cgroup", cg.path()])
        .stdin(std::process::Stdio::null())
        .output()
        .expect("run a second execd");
    assert!(!out.status.success(), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("another execd is listening"), "{stderr}");
    assert!(
        with_marker(&m).len() >= 2,
        "the refused daemon killed nothing"
    );
    assert_eq!(cg.command_cgroups(), held);

    // A socket of its own: it runs, on process groups.
    let second = cgroup_daemon(&cg, &[]);
    wait_until("the second says why it holds no cgroup", || {
        second.log().contains("already holds pid")
    });
    let mut c2 = second.client();
    let init = ok(&mut c2, "initialize", json!({"protocolVersion": 1}));
    let containment = init["_meta"]["execd"]["containment"].to_string();
    assert!(containment.contains("process"), "{containment}");
    drop(c2);
    drop(second);

    assert!(with_marker(&m).len() >= 2, "the first's command lives on");
    assert_eq!(cg.command_cgroups(), held);
    assert!(output(&mut c, &id).get("exitStatus").is_none());
    ok(
        &mut c,
        "terminal/release",
        json!({"sessionId": "s", "terminalId": id}),
    );
    all_gone(&m, "released by the first daemon");
}

/// A command's cgroup goes once its tree is empty: 500 commands leave none behind.
#[test]
fn five_hundred_commands_leave_no_cgroup_behind() {
    let Some(cg) = test_cgroup() else { return };
    let d = cgroup_daemon(&cg, &["--max-processes", "600"]);
    let mut c = d.client();
    let sent: Vec<u64> = (0..500)
        .map(|_| {
            c.send(
                "terminal/create",
                json!({"sessionId": "s", "command": "sh", "args": ["-c", "true & true"]}),
            )
            .expect("send")
        })
        .collect();
    let ids: Vec<String> = sent
        .into_iter()
        .map(|id| {
            c.wait_response(id).expect("created")["terminalId"]
                .as_str()
                .expect("id")
                .to_string()
        })
        .collect();
    for id in &ids {
        wait_exit(&mut c, id);
    }
    wait_until("every command cgroup is removed", || {
        cg.command_cgroups().is_empty()
    });
    let init = ok(&mut c, "initialize", json!({}));
    assert_eq!(init["_meta"]["execd"]["containment"]["kind"], "cgroup");
}

/// A tree that outlives its leader keeps its cgroup until the tree empties, and loses it
/// then, even when the daemon reaps nothing at that moment: the last process is reaped by
/// a parent that left the cgroup, so only the cgroup's `cgroup.events`, watched from the
/// leader's exit on, says it emptied.
#[test]
fn a_cgroup_outliving_its_leader_goes_when_its_tree_empties() {
    let Some(cg) = test_cgroup() else { return };
    let outside = cg.0.join("outside");
    std::fs::create_dir(&outside).expect("a cgroup beside the daemon's");
    let d = cgroup_daemon(&cg, &[]);
    let mut c = d.client();
    // The leader starts B and exits. B starts C (`sleep 1`, in the command's cgroup),
    // moves itself out, reaps C, and lives on outside.
    let b = format!(
        "sleep 1 & echo $$ > {}/cgroup.procs; wait; exec sleep 60",
        outside.display()
    );
    let id = create(
        &mut c,
        "sh",
        &["-c", &format!("sh -c '{b}' & echo started")],
    );
    wait_exit(&mut c, &id);
    let b_pid = || {
        std::fs::read_to_string(outside.join("cgroup.procs"))
            .unwrap_or_default()
            .trim()
            .to_string()
    };
    wait_until("B left the command's cgroup", || !b_pid().is_empty());
    // The cgroup stays while C runs; C is a second at most.
    wait_until("the command's cgroup is removed once C has ended", || {
        cg.command_cgroups().is_empty()
    });
    assert!(
        !b_pid().is_empty(),
        "B, its parent, still runs outside: the daemon reaped nothing"
    );
}

/// Whole-tree accounting: `cpuMs` from the cgroup beside the leader's rusage.
#[test]
fn exit_reports_the_whole_trees_cpu() {
    let Some(cg) = test_cgroup() else { return };
    let d = cgroup_daemon(&cg, &[]);
    let mut c = d.client();
    let id = create(&mut c, "sh", &["-c", "true"]);
    wait_exit(&mut c, &id);
    let t = terminal_entry(&mut c, &id);
    let meta = &t["exitStatus"]["_meta"]["execd"];
    assert!(meta["cpuMs"].is_u64(), "{t}");
}

/// Limits need their controllers: on a cgroup that has none, a request for one is a
/// `-32003` naming the controller, and so is a daemon-wide flag at start.
#[test]
fn limits_without_their_controller_are_refused_by_name() {
    let Some(cg) = test_cgroup() else { return };
    let controllers = std::fs::read_to_string(cg.0.join("cgroup.controllers")).unwrap_or_default();
    let d = cgroup_daemon(&cg, &[]);
    let mut c = d.client();
    for (method, params, controller) in [
        (
            "terminal/create",
            json!({"sessionId": "s", "command": "true",
                   "_meta": {"execd": {"limits": {"memoryMax": 1048576}}}}),
            "memory",
        ),
        (
            "bash/exec",
            json!({"command": "true", "limits": {"pids_max": 10}}),
            "pids",
        ),
        (
            "bash/exec",
            json!({"command": "true", "limits": {"cpu_max": 50}}),
            "cpu",
        ),
    ] {
        if controllers.split_whitespace().any(|w| w == controller) {
            continue; // this host has it: the limit works and is tested below
        }
        let (code, msg, data) = err(&mut c, method, params);
        assert_eq!(code, -32003, "{msg}");
        assert_eq!(data.expect("data")["controller"], controller);
        assert!(msg.contains(controller), "{msg}");
    }
    // A daemon-wide limit without its controller refuses to start, saying why, and
    // leaves no socket file behind.
    if !controllers.split_whitespace().any(|w| w == "memory") {
        let socket = d.dir.path().join("refused.sock");
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_execd"))
            .arg("--socket")
            .arg(&socket)
            .args(["--cgroup", cg.path(), "--memory-max", "64M"])
            .stdin(std::process::Stdio::null())
            .output()
            .expect("run");
        assert_eq!(out.status.code(), Some(1));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("memory controller"), "{err}");
        assert!(
            !socket.exists(),
            "the refused daemon's socket file is removed"
        );
    }
    // Process groups can enforce none.
    let plain = Daemon::start(&["--cgroup", "off"]);
    let mut c = plain.client();
    let (code, _, data) = err(
        &mut c,
        "bash/exec",
        json!({"command": "true", "limits": {"memory_max": 1048576}}),
    );
    assert_eq!(code, -32003);
    assert_eq!(data.expect("data")["controller"], "memory");
}

/// `--cgroup off`, and a cgroup execd may not use, fall back to process groups and say
/// why.
#[test]
fn fallbacks_to_process_groups_say_why() {
    let d = Daemon::start(&["--cgroup", "off"]);
    let mut c = d.client();
    let init = ok(&mut c, "initialize", json!({}));
    let containment = &init["_meta"]["execd"]["containment"];
    assert_eq!(containment["kind"], "process-group");
    assert!(
        containment["detail"]
            .as_str()
            .unwrap()
            .contains("--cgroup off"),
        "{containment}"
    );
    assert!(
        d.log().contains("containment: process groups"),
        "{}",
        d.log()
    );
    // A path that is no cgroup.
    let dir = TempDir::new();
    let d = Daemon::start(&["--cgroup", dir.path().to_str().unwrap()]);
    let mut c = d.client();
    let init = ok(&mut c, "initialize", json!({}));
    let containment = &init["_meta"]["execd"]["containment"];
    assert_eq!(containment["kind"], "process-group");
    let detail = containment["detail"].as_str().unwrap();
    assert!(
        detail.contains("falling back to process groups"),
        "{detail}"
    );
    // And the daemon works.
    let id = create(&mut c, "echo", &["fine"]);
    wait_exit(&mut c, &id);
    assert_eq!(output(&mut c, &id)["output"], "fine\n");
}

/// A `--cgroup PATH` the daemon may not write (it runs as `nobody`, the cgroup is
/// root's) falls back to process groups with the promised log line saying why and how to
/// delegate one, even though the daemon may not open its stderr (a root-owned file) again.
#[test]
fn a_cgroup_the_daemon_may_not_write_falls_back_saying_why_in_the_log() {
    use std::os::unix::process::CommandExt;
    if !running_as_root() {
        skip("needs root, to start execd as nobody");
        return;
    }
    let Some(cg) = test_cgroup() else { return };
    let dir = TempDir::new();
    std::fs::set_permissions(
        dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o777),
    )
    .expect("let nobody make its socket");
    let socket = dir.path().join("execd.sock");
    let mut cmd = Daemon::command(dir.path(), &socket, &["--cgroup", cg.path()]);
    cmd.uid(65534).gid(65534);
    let child = cmd.spawn().expect("spawn execd as nobody");
    let d = Daemon::adopt(Some(child), socket, dir);
    wait_until("the start is logged", || d.log().contains("listening on"));
    let log = d.log();
    assert!(
        log.contains(&format!("{} is not writable by execd", cg.path())),
        "{log}"
    );
    assert!(log.contains("falling back to process groups"), "{log}");
    assert!(log.contains("Delegate=yes"), "{log}");
    assert!(cg.command_cgroups().is_empty());
    drop(d);
}

/// Where the machine has a controller, its limit really holds: a fork bomb stays within
/// `pids.max`, and an OOM kill is reported as such.
#[test]
fn limits_hold_where_controllers_exist() {
    let Some(cg) = test_cgroup() else { return };
    let controllers = std::fs::read_to_string(cg.0.join("cgroup.controllers")).unwrap_or_default();
    let has = |c: &str| controllers.split_whitespace().any(|w| w == c);
    // Which controllers a cgroup2 mount offers is the host's setup (a hybrid v1/v2 host
    // has none there), not something CI can install: a missing one is said, and is not a
    // failure even in CI, as the test's name promises.
    let missing: Vec<&str> = ["pids", "memory"].into_iter().filter(|c| !has(c)).collect();
    if !missing.is_empty() {
        let thread = std::thread::current();
        skipped(&format!(
            "{} for {}: not enabled on this host's cgroup2 ({controllers:?})",
            thread.name().unwrap_or("a test"),
            missing.join(" and ")
        ));
    }
    if missing.len() == 2 {
        return;
    }
    let d = cgroup_daemon(&cg, &[]);
    let mut c = d.client();
    if has("pids") {
        let r = ok(
            &mut c,
            "bash/exec",
            json!({"command": "for i in $(seq 50); do sleep 5 & done; wait", "limits": {"pids_max": 10},
                   "hard_timeout": 10}),
        );
        assert!(
            r["stderr"].as_str().unwrap().contains("fork")
                || r["stderr"].as_str().unwrap().contains("Resource"),
            "{r}"
        );
    }
    if has("memory") {
        let r = ok(
            &mut c,
            "bash/exec",
            json!({"command": "head -c 200000000 /dev/zero | tail", "limits": {"memory_max": 33554432}}),
        );
        assert_eq!(r["oom_killed"], true, "{r}");
    }
}
