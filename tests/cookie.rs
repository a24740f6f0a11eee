//! Containment without cgroups (PROTOCOL.md section 14): every command's environment
//! carries `EXECD_TREE=<instance>:<command id>`, and wherever a command is ended, what
//! still carries its cookie is killed too, however it left the process group; what a
//! SIGKILLed daemon left is killed by the next start on the same socket.
//!
//! Every ending runs every escape shape (`util::trees`), from `terminal/create` and from
//! `bash/exec`, twice: with `--cgroup off`, and with the default flags (which fall back
//! to process groups on a host that delegates no cgroup to the test, and would use
//! cgroups where one is delegated: 0 survivors either way). Each row prints its table of
//! survivors, then asserts it is empty. What an ended command left lives while its
//! terminal or session does, and dies with it (`an_ended_command_s_leftovers_...`).

use std::process::{Child, Command, Stdio};

use crate::util::trees::*;
use crate::util::*;

/// Short, so that the TERM ignorers do not make every row wait long.
const GRACE: &str = "300ms";

/// The daemons each row runs against.
const MODES: [(&str, &[&str]); 2] = [
    ("--cgroup off", &["--cgroup", "off"]),
    ("default flags", &[]),
];

/// One tree of one shape, started by one method.
struct Tree {
    shape: &'static str,
    /// `terminal` or `bash`.
    method: &'static str,
    marker: String,
    /// The terminal id, or the bash session the command runs in.
    handle: String,
}

/// A daemon on `socket` with `flags` and the short grace.
#[track_caller]
fn daemon_at(socket: &std::path::Path, flags: &[&str]) -> Daemon {
    let mut all = flags.to_vec();
    all.extend_from_slice(&["--kill-grace", GRACE]);
    Daemon::start_at(TempDir::new(), socket.to_path_buf(), &all)
}

/// Starts every shape as a terminal and/or as a bash command (with `bash_extra` merged
/// into its params), and waits until each tree is up.
#[track_caller]
fn start_trees(
    c: &mut Client,
    marks: &mut Marks,
    terminals: bool,
    bash: bool,
    bash_extra: Value,
) -> Vec<Tree> {
    let mut trees = Vec::new();
    for shape in SHAPES {
        if terminals {
            let m = marks.next();
            let id = create(c, "sh", &["-c", &script(shape, &m)]);
            trees.push(Tree {
                shape,
                method: "terminal",
                marker: m,
                handle: id,
            });
        }
        if bash {
            let m = marks.next();
            let session = format!("s-{}", m.replace('.', "-"));
            let mut params = json!({"command": script(shape, &m), "async_mode": true,
                                    "session_id": session});
            if let (Some(p), Some(extra)) = (params.as_object_mut(), bash_extra.as_object()) {
                p.extend(extra.clone());
            }
            ok(c, "bash/exec", params);
            trees.push(Tree {
                shape,
                method: "bash",
                marker: m,
                handle: session,
            });
        }
    }
    for t in &trees {
        wait_until(
            &format!("the {} tree ({}) is up", t.shape, t.method),
            || with_marker(&t.marker).len() >= 3,
        );
    }
    trees
}

/// Ends one tree the way `ending` says (a per-command ending).
#[track_caller]
fn end_tree(c: &mut Client, t: &Tree, ending: &str) {
    let term = json!({"sessionId": "s", "terminalId": t.handle});
    match ending {
        "terminal/release" | "terminal/kill" => {
            ok(c, ending, term);
        }
        "bash/kill" => {
            ok(
                c,
                "bash/kill",
                json!({"session_id": t.handle, "signal": "SIGKILL"}),
            );
        }
        "bash/sessions/close" => {
            ok(c, ending, json!({"session_id": t.handle}));
        }
        "hard_timeout" => {} // armed at the start
        other => panic!("no such ending {other:?}"),
    }
}

/// The trees that still have a live process once everything had the time to end (a
/// tree that is gone is never waited for longer than it takes).
fn survivors(trees: &[Tree]) -> Vec<&Tree> {
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        let left: Vec<&Tree> = trees
            .iter()
            .filter(|t| !with_marker(&t.marker).is_empty())
            .collect();
        if left.is_empty() || std::time::Instant::now() > deadline {
            return left;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// Says how many of `trees` survived `what`; returns that count.
fn report(what: &str, trees: &[Tree], left: &[&Tree]) -> usize {
    let named: Vec<String> = left
        .iter()
        .map(|t| format!("{} ({})", t.shape, t.method))
        .collect();
    eprintln!(
        "ESCAPES {what}: {}/{} trees survived{}{}",
        left.len(),
        trees.len(),
        if named.is_empty() { "" } else { ": " },
        named.join(", ")
    );
    left.len()
}

/// One row of the escape table: every shape from terminals ended by `terminal_ending`
/// and from bash commands ended by `bash_ending` (either may be absent), per mode.
fn per_command_row(row: &str, terminal_ending: Option<&str>, bash_ending: Option<&str>) {
    let mut failed = Vec::new();
    for (mode, flags) in MODES {
        let mut marks = Marks::default();
        let home = TempDir::new();
        let d = daemon_at(&home.path().join("execd.sock"), flags);
        let mut c = d.client();
        // Long enough that every tree is up before it fires, even on a loaded host.
        let extra = if bash_ending == Some("hard_timeout") {
            json!({"hard_timeout": 8})
        } else {
            json!({})
        };
        let trees = start_trees(
            &mut c,
            &mut marks,
            terminal_ending.is_some(),
            bash_ending.is_some(),
            extra,
        );
        for t in &trees {
            let ending = if t.method == "terminal" {
                terminal_ending
            } else {
                bash_ending
            };
            end_tree(&mut c, t, ending.expect("an ending"));
        }
        let left = survivors(&trees);
        if report(&format!("{row} [{mode}]"), &trees, &left) > 0 {
            failed.push(mode);
        }
        assert_no_panic(&d);
    }
    assert!(failed.is_empty(), "{row}: survivors with {failed:?}");
}

#[test]
fn release_and_bash_kill_leave_no_survivors() {
    per_command_row(
        "release + bash/kill SIGKILL",
        Some("terminal/release"),
        Some("bash/kill"),
    );
}

#[test]
fn terminal_kill_and_session_close_leave_no_survivors() {
    per_command_row(
        "terminal/kill + session close",
        Some("terminal/kill"),
        Some("bash/sessions/close"),
    );
}

#[test]
fn a_hard_timeout_leaves_no_survivors() {
    per_command_row("hard timeout", None, Some("hard_timeout"));
}

/// A process this test starts itself, outside execd; killed and reaped on drop.
struct Outside(Child);

impl Outside {
    /// `sleep MARKER` in a session of its own, with `env` added to its environment.
    fn start(marker: &str, env: &[(&str, &str)]) -> Outside {
        let child = Command::new("setsid")
            .args(["sleep", marker])
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn sleep");
        wait_until("the outside process runs", || {
            !with_marker(marker).is_empty()
        });
        Outside(child)
    }

    fn alive(&mut self) -> bool {
        matches!(self.0.try_wait(), Ok(None))
    }
}

impl Drop for Outside {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A daemon's SIGTERM ends every tree; a process started outside execd lives on.
#[test]
fn daemon_sigterm_leaves_no_survivors() {
    let mut failed = Vec::new();
    for (mode, flags) in MODES {
        let mut marks = Marks::default();
        let mut outside = Outside::start(&marks.next(), &[]);
        let home = TempDir::new();
        let mut d = daemon_at(&home.path().join("execd.sock"), flags);
        let mut c = d.client();
        let trees = start_trees(&mut c, &mut marks, true, true, json!({}));
        assert_eq!(d.terminate(), Some(0));
        let left = survivors(&trees);
        if report(&format!("daemon SIGTERM [{mode}]"), &trees, &left) > 0 {
            failed.push(mode);
        }
        assert!(
            outside.alive(),
            "a process started outside execd was killed"
        );
    }
    assert!(failed.is_empty(), "survivors with {failed:?}");
}

/// The daemon SIGKILLed while every tree runs, then started again on the same socket:
/// what it left is killed at start, logged, and audited as `leftovers {count, mode:
/// "cookie"}`; a process started outside execd lives on.
#[test]
fn daemon_sigkill_then_restart_leaves_no_survivors() {
    let mut failed = Vec::new();
    for (mode, flags) in MODES {
        let mut marks = Marks::default();
        let mut outside = Outside::start(&marks.next(), &[]);
        let home = TempDir::new();
        let socket = home.path().join("execd.sock");
        let mut d = daemon_at(&socket, flags);
        let mut c = d.client();
        let trees = start_trees(&mut c, &mut marks, true, true, json!({}));
        if let Some(mut child) = d.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        // The parent-death signal reaches only each command's leader: the rest outlives
        // a SIGKILLed daemon until the next start.
        let orphaned = trees
            .iter()
            .filter(|t| !with_marker(&t.marker).is_empty())
            .count();
        eprintln!(
            "ESCAPES daemon SIGKILL [{mode}]: {orphaned}/{} trees alive right after it",
            trees.len()
        );
        assert!(orphaned > 0, "something outlived the daemon");
        let audit = home.path().join("audit.jsonl");
        let mut again = flags.to_vec();
        again.extend_from_slice(&["--audit", audit.to_str().expect("utf-8")]);
        let restarted = daemon_at(&socket, &again);
        let left = survivors(&trees);
        if report(&format!("daemon SIGKILL + restart [{mode}]"), &trees, &left) > 0 {
            failed.push(mode);
            continue;
        }
        wait_until("the restart logs what it killed", || {
            restarted.log().contains("an earlier instance")
        });
        let records = std::fs::read_to_string(&audit).unwrap_or_default();
        let leftovers: Vec<Value> = records
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter(|r| r["event"] == "leftovers")
            .collect();
        assert_eq!(leftovers.len(), 1, "{records}");
        assert_eq!(leftovers[0]["mode"], "cookie", "{records}");
        assert!(
            leftovers[0]["count"].as_u64() >= Some(orphaned as u64),
            "{records}"
        );
        assert!(
            outside.alive(),
            "a process started outside execd was killed"
        );
    }
    assert!(failed.is_empty(), "survivors with {failed:?}");
}

/// The `EXECD_TREE` value a command of `d` sees, read through a terminal running `env`.
#[track_caller]
fn cookie_of(c: &mut Client) -> (String, String) {
    let id = create(c, "env", &[]);
    wait_exit(c, &id);
    let env = output(c, &id)["output"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let value = env
        .lines()
        .find_map(|l| l.strip_prefix("EXECD_TREE="))
        .unwrap_or_else(|| panic!("no EXECD_TREE in {env}"))
        .to_string();
    (id, value)
}

/// A daemon started on another socket after the first was SIGKILLed kills nothing the
/// first left, nor a process with another socket's cookie, nor one without a cookie; the
/// first's own socket then does.
#[test]
fn a_restart_on_another_socket_kills_nothing_of_the_first() {
    let mut marks = Marks::default();
    let home = TempDir::new();
    let socket = home.path().join("first.sock");
    let mut first = daemon_at(&socket, &["--cgroup", "off"]);
    let mut c = first.client();
    let (_, cookie) = cookie_of(&mut c);
    let trees = start_trees(&mut c, &mut marks, true, false, json!({}));
    // Another socket's cookie: the same instance text under another path's hash.
    let (_, rest) = cookie.split_once('-').expect("hash-...");
    let foreign = format!("0123456789abcdef-{rest}");
    let mut plain = Outside::start(&marks.next(), &[]);
    let mut forged = Outside::start(&marks.next(), &[("EXECD_TREE", &foreign)]);
    if let Some(mut child) = first.child.take() {
        let _ = child.kill();
        let _ = child.wait();
    }
    let escaped: Vec<&Tree> = trees
        .iter()
        .filter(|t| !with_marker(&t.marker).is_empty())
        .collect();
    assert!(!escaped.is_empty(), "something outlived the first daemon");

    // Another socket: its start-up sweep (the off-loop reader's, once it serves) ends
    // having found nothing.
    let second = daemon_at(
        &home.path().join("second.sock"),
        &["--cgroup", "off", "--log-level", "debug"],
    );
    let mut c2 = second.client();
    ok(&mut c2, "initialize", json!({}));
    // Ended, whatever it did (a sweep that killed something says so in another line).
    wait_until("the start-up sweep has ended", || {
        let log = second.log();
        log.contains("a cookie sweep of earlier instances") || log.contains("an earlier instance")
    });
    assert!(
        !second.log().contains("an earlier instance"),
        "{}",
        second.log()
    );
    for t in &escaped {
        assert!(
            !with_marker(&t.marker).is_empty(),
            "{} ({}) was killed by a daemon on another socket",
            t.shape,
            t.method
        );
    }
    drop(c2);
    drop(second);

    // The first's socket again: its leftovers go, and only those.
    let again = daemon_at(&socket, &["--cgroup", "off"]);
    let left = survivors(&trees);
    assert_eq!(report("restart on the same socket", &trees, &left), 0);
    wait_until("the count is logged", || {
        again.log().contains("an earlier instance")
    });
    assert!(plain.alive(), "a process without a cookie was killed");
    assert!(
        forged.alive(),
        "a process with another socket's cookie was killed"
    );
}

/// What still escapes, as the README and execd(8) say: a process that clears its
/// environment carries no cookie, and outlives its command's kill, while its sibling that
/// kept the environment is killed by the same sweep.
#[test]
fn an_escapee_that_clears_its_environment_is_the_documented_exception() {
    let mut marks = Marks::default();
    let d = Daemon::start(&["--cgroup", "off", "--kill-grace", GRACE]);
    let mut c = d.client();
    let (bare, kept) = (marks.next(), marks.next());
    let id = create(
        &mut c,
        "sh",
        &[
            "-c",
            &format!(
                "env -i setsid sleep {bare} & setsid sleep {kept} & echo ready; sleep {kept}; true"
            ),
        ],
    );
    // Its own sleep, and two that kept the environment: the escapee and the leader's.
    wait_until("the tree is up", || {
        sleeps(&bare).len() == 1 && sleeps(&kept).len() == 2
    });
    ok(
        &mut c,
        "terminal/release",
        json!({"sessionId": "s", "terminalId": id}),
    );
    all_gone(&kept, "the escapee that kept its environment");
    let left = sleeps(&bare);
    assert_eq!(
        left.len(),
        1,
        "the escapee without a cookie lives on: {left:?}"
    );
    let env = std::fs::read(format!("/proc/{}/environ", left[0])).unwrap_or_default();
    assert!(env.is_empty(), "it has no environment at all");
}

/// A sweep reads every process on the host: it runs for a command that left something
/// (here an escapee, re-parented to the daemon), and not for commands whose whole tree
/// ended with them (PROTOCOL 14: paid when a command is killed, never per spawn), nor
/// for them while another command's escapee lives. At `--log-level debug` the daemon
/// logs every sweep of commands, also one that killed nothing.
#[test]
fn a_release_sweeps_only_when_the_command_left_something() {
    let d = Daemon::start(&[
        "--cgroup",
        "off",
        "--kill-grace",
        GRACE,
        "--log-level",
        "debug",
    ]);
    let mut c = d.client();
    let sweeps = |d: &Daemon| {
        d.log()
            .lines()
            .filter(|l| {
                l.contains("a cookie sweep of") && l.contains(" command(s)")
                    || l.contains("that left the process group but carried")
            })
            .count()
    };
    let release = |c: &mut Client, id: &str| {
        ok(
            c,
            "terminal/release",
            json!({"sessionId": "s", "terminalId": id}),
        );
    };
    // A command that leaves nothing: created, waited for, released.
    let clean = |c: &mut Client| {
        let id = create(c, "sh", &["-c", "true"]);
        wait_exit(c, &id);
        release(c, &id);
    };
    // Ten clean commands, then ten graces and more: whether the count of sweeps is
    // still `n` (a sweep asked for would have been logged by then).
    let ten_clean_sweep_nothing = |c: &mut Client, n: usize| {
        for _ in 0..10 {
            clean(c);
        }
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(3);
        while std::time::Instant::now() < deadline && sweeps(&d) == n {
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        sweeps(&d) == n
    };
    // The sweeps below show such lines are written; the start's own sweep (of earlier
    // instances) is not one of them.
    assert!(
        ten_clean_sweep_nothing(&mut c, 0),
        "ten commands that left nothing were swept for:\n{}",
        d.log()
    );

    // An escapee of a command whose terminal is kept: a child of the daemon it did not
    // start. The first kill that meets it sweeps (whose it is is not known yet) and has
    // the reader read its cookie; after that, releases of other commands sweep nothing
    // for it, and the release of its own command sweeps and kills it.
    let mut marks = Marks::default();
    let m = marks.next();
    let id = create(&mut c, "sh", &["-c", &format!("setsid sleep {m} &")]);
    wait_exit(&mut c, &id);
    wait_until("the escapee runs", || sleeps(&m).len() == 1);
    clean(&mut c);
    wait_until("the first kill that meets the escapee sweeps", || {
        sweeps(&d) == 1
    });
    assert!(
        ten_clean_sweep_nothing(&mut c, 1),
        "another command's escapee made ten clean releases sweep:\n{}",
        d.log()
    );
    assert_eq!(
        sleeps(&m).len(),
        1,
        "the escapee lives while its terminal does"
    );
    release(&mut c, &id);
    all_gone(&m, "the escapee");
    wait_until("its sweep is logged", || sweeps(&d) == 2);

    // An escapee with children of its own (a server may run another command's
    // processes, with that command's cookie): every kill sweeps while it lives.
    let m = marks.next();
    let id = create(
        &mut c,
        "sh",
        &["-c", &format!("setsid sh -c 'sleep {m} & wait' &")],
    );
    wait_exit(&mut c, &id);
    wait_until("the escapee and its child run", || sleeps(&m).len() == 1);
    for n in 1..=2 {
        clean(&mut c);
        wait_until("the release sweeps", || sweeps(&d) == 2 + n);
    }
    release(&mut c, &id);
    all_gone(&m, "the escapee's child");
    assert_no_panic(&d);
}

/// The cookie is set last: neither a request's variables nor `--clean-env` remove or
/// change it; it names this daemon's instance (as `initialize` reports it) and the
/// command's own id.
#[test]
fn the_cookie_is_set_last_and_names_the_command() {
    for flags in [&["--cgroup", "off"][..], &["--clean-env"][..]] {
        let d = Daemon::start(flags);
        let mut c = d.client();
        let init = ok(&mut c, "initialize", json!({}));
        let containment = &init["_meta"]["execd"]["containment"];
        let instance = containment["cookie"]
            .as_str()
            .unwrap_or_else(|| panic!("no cookie in {containment}"))
            .to_string();
        assert!(
            containment["detail"]
                .as_str()
                .unwrap_or_default()
                .contains("EXECD_TREE"),
            "{containment}"
        );
        let id = create_with(
            &mut c,
            json!({"sessionId": "s", "command": "env",
                   "env": [{"name": "EXECD_TREE", "value": "forged:term_0"}]}),
        );
        wait_exit(&mut c, &id);
        let env = output(&mut c, &id)["output"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let cookies: Vec<&str> = env
            .lines()
            .filter_map(|l| l.strip_prefix("EXECD_TREE="))
            .collect();
        assert_eq!(cookies, vec![format!("{instance}:{id}")], "{env}");

        let r = ok(
            &mut c,
            "bash/exec",
            json!({"command": "env", "env": {"EXECD_TREE": "forged"}}),
        );
        let out = r["stdout"].as_str().unwrap_or_default();
        let cookies: Vec<&str> = out
            .lines()
            .filter_map(|l| l.strip_prefix("EXECD_TREE="))
            .collect();
        let cmd = r["command_id"].as_str().unwrap_or_default();
        assert_eq!(cookies, vec![format!("{instance}:{cmd}")], "{out}");
    }
}

/// How an ended command's leftovers are ended (PROTOCOL 14), each on a daemon of its own.
const ENDED_ENDINGS: [&str; 8] = [
    "terminal/release",
    "terminal/kill",
    "bash/sessions/close",
    "bash session idle",
    "bash session closed to make room",
    "bash/kill SIGKILL",
    "shell/sessions/close",
    "shutdown",
];

/// An ended command leaves `sleep M` running: it lives while its terminal or session does
/// and dies when that ends (each of `ENDED_ENDINGS`), with `--cgroup off` and with
/// cgroups (a test cgroup of this host's, where there is one).
#[test]
fn an_ended_command_s_leftovers_die_with_its_terminal_or_session() {
    let cg = match TestCgroup::new("leftovers") {
        Ok(cg) => Some(cg),
        Err(why) => {
            skip(&format!("the cgroup half: {why}"));
            None
        }
    };
    let mut modes: Vec<(&str, Vec<&str>)> = vec![("--cgroup off", vec!["--cgroup", "off"])];
    if let Some(cg) = &cg {
        modes.push(("cgroups", vec!["--cgroup", cg.path()]));
    }
    let mut failed = Vec::new();
    for (mode, flags) in &modes {
        for ending in ENDED_ENDINGS {
            let mut marks = Marks::default();
            let m = marks.next();
            let leave = format!("setsid sh -c 'sleep {m} &' &");
            let mut all = flags.clone();
            match ending {
                "bash session idle" => all.extend(["--session-idle", "2s"]),
                "bash session closed to make room" => all.extend(["--max-sessions", "2"]),
                _ => {}
            }
            let home = TempDir::new();
            let mut d = daemon_at(&home.path().join("execd.sock"), &all);
            let mut c = d.client();
            let bash = |c: &mut Client, params: Value| {
                let r = ok(c, "bash/exec", params);
                assert_eq!(r["status"], "completed", "{r}");
                r["session_id"].as_str().expect("session_id").to_string()
            };
            // The command ends at once; what it left runs on.
            let handle = match ending {
                "terminal/release" | "terminal/kill" | "shutdown" => {
                    let id = create(&mut c, "sh", &["-c", &leave]);
                    wait_exit(&mut c, &id);
                    id
                }
                "shell/sessions/close" => {
                    let r = ok(&mut c, "shell/exec", json!({"id": "sh", "command": leave}));
                    assert_eq!(r["status"], "completed", "{r}");
                    "sh".into()
                }
                // Made without a name: one-shot, the first to go.
                "bash session closed to make room" => bash(&mut c, json!({"command": leave})),
                _ => bash(&mut c, json!({"session_id": "s1", "command": leave})),
            };
            wait_until("the leftover runs", || !sleeps(&m).is_empty());
            let term = json!({"sessionId": "s", "terminalId": handle});
            match ending {
                "terminal/release" | "terminal/kill" => {
                    ok(&mut c, ending, term);
                }
                "bash/sessions/close" => {
                    ok(&mut c, ending, json!({"session_id": handle}));
                }
                "shell/sessions/close" => {
                    ok(&mut c, ending, json!({"id": handle}));
                }
                "bash/kill SIGKILL" => {
                    let r = ok(
                        &mut c,
                        "bash/kill",
                        json!({"session_id": handle, "signal": "SIGKILL"}),
                    );
                    assert_eq!(r["status"], "completed", "an ended command: {r}");
                }
                "bash session closed to make room" => {
                    ok(&mut c, "bash/sessions/create", json!({"session_id": "a"}));
                    ok(&mut c, "bash/sessions/create", json!({"session_id": "b"}));
                }
                "shutdown" => {
                    assert_eq!(d.terminate(), Some(0));
                }
                _ => {} // idle: the session closes by itself
            }
            let deadline = std::time::Instant::now() + WAIT;
            while !with_marker(&m).is_empty() && std::time::Instant::now() < deadline {
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            let left = with_marker(&m).len();
            eprintln!("LEFTOVERS {ending} [{mode}]: {left} survived");
            if left > 0 {
                failed.push(format!("{ending} [{mode}]"));
            }
            assert_no_panic(&d);
        }
    }
    assert!(failed.is_empty(), "leftovers survived: {failed:?}");
}
