//! `execctl` against a real daemon: the binary is run as a user would, its exit status,
//! stdout and stderr checked. Every child is waited for with a deadline and killed if it
//! overruns (or if the test panics first). The streaming, stdin, signal and exit-status
//! cases of the client issue are in tests/cli_stream.rs; kill, sessions, logs and help in
//! tests/cli_manage.rs; policy check and approve in tests/cli_policy.rs.
//!
//! Changed by the client issue (and so here): daemon and usage errors exit 125 (were 1
//! and 2); `exec --async` (now `--detach`) prints the id on stdout; every `--json`
//! output has snake_case keys and its list under a named key; `ps` has a DURATION column
//! and quotes arguments; `status` prints limits as the daemon's flags take them.

use crate::util::cli::*;
use crate::util::*;

use std::path::Path;
use std::process::Stdio;

// ---- run ---------------------------------------------------------------------------------------

#[test]
fn run_passes_exit_codes_and_signals_through() {
    let d = Daemon::start(&[]);
    ctl_code(&d, &["run", "--", "sh", "-c", "exit 3"], 3);
    ctl_code(&d, &["run", "--", "sh", "-c", "exit 0"], 0);
    ctl_code(&d, &["run", "--", "sh", "-c", "kill -KILL $$"], 137);
    ctl_code(&d, &["run", "--", "sh", "-c", "kill -TERM $$"], 143);
    // run releases its terminals.
    let mut c = d.client();
    assert_eq!(terminals(&mut c), Vec::<Value>::new());
}

#[test]
fn run_streams_merged_output_cwd_and_env() {
    let d = Daemon::start(&[]);
    let o = ctl_code(
        &d,
        &["run", "--", "sh", "-c", "echo out; echo err >&2; echo out2"],
        0,
    );
    assert_eq!(o.stdout, "out\nerr\nout2\n");

    let dir = std::fs::canonicalize(d.dir.path()).expect("canonical dir");
    let dir = dir.to_str().expect("UTF-8 dir");
    let o = ctl_code(&d, &["run", "--cwd", dir, "--", "pwd"], 0);
    assert_eq!(o.stdout, format!("{dir}\n"));

    let o = ctl_code(
        &d,
        &[
            "run",
            "--env",
            "EXECCTL_T1=hello world",
            "--env",
            "EXECCTL_T2=x=y",
            "--",
            "sh",
            "-c",
            "echo \"$EXECCTL_T1|$EXECCTL_T2\"",
        ],
        0,
    );
    assert_eq!(o.stdout, "hello world|x=y\n");
}

#[test]
fn run_timeout_exits_124_and_kills_the_command() {
    let d = Daemon::start(&[]);
    let o = ctl_code(
        &d,
        &[
            "run",
            "--timeout",
            "2",
            "--",
            "sh",
            "-c",
            "echo $$; exec sleep 30",
        ],
        124,
    );
    let pid: i32 = o
        .stdout
        .lines()
        .next()
        .and_then(|l| l.trim().parse().ok())
        .unwrap_or_else(|| panic!("no pid printed: {o:?}"));
    wait_until("the timed-out command is gone", || !pid_alive(pid));
    let mut c = d.client();
    assert_eq!(terminals(&mut c), Vec::<Value>::new(), "terminal released");
}

#[test]
fn run_ctrl_c_exits_130_and_kills_the_command() {
    let d = Daemon::start(&[]);
    let (mut ctl, rx) = spawn_lines(&mut command(
        Some(&d.socket),
        &["run", "--", "sh", "-c", "echo started; sleep 30"],
    ));
    assert_eq!(next_line(&rx), "started");
    let mut c = d.client();
    let session = format!("execctl-{}", ctl.pid());
    let term = terminals(&mut c)
        .into_iter()
        .find(|t| t["sessionId"] == session.as_str())
        .unwrap_or_else(|| panic!("no terminal in session {session}"));
    let pid = term["pid"].as_i64().expect("pid") as i32;
    wait_until("sleep runs", || group_runs(pid, "sleep"));
    unsafe_kill(ctl.pid(), libc::SIGINT);
    let st = ctl.wait();
    assert_eq!(st.code(), Some(130), "{st:?}");
    wait_until("the interrupted command's group is gone", || {
        !group_alive(pid)
    });
    assert!(
        !terminals(&mut c)
            .iter()
            .any(|t| t["sessionId"] == session.as_str()),
        "execctl run released its terminal"
    );
}

// ---- exec --------------------------------------------------------------------------------------

#[test]
fn exec_keeps_streams_apart_and_passes_the_status() {
    let d = Daemon::start(&[]);
    let o = ctl_code(&d, &["exec", "echo out; echo err >&2; exit 4"], 4);
    assert_eq!(o.stdout, "out\n");
    assert_eq!(o.stderr, "err\n");
    let o = ctl_code(&d, &["exec", "kill -KILL $$"], 137);
    assert_eq!(o.stdout, "");

    // --async is --detach: the id on stdout, the command left running.
    let o = ctl_code(&d, &["exec", "--async", "sleep 30"], 0);
    let id = o.stdout.trim().to_string();
    let mut c = d.client();
    let b = bash_command(&mut c, &id);
    assert_eq!(b["status"], "running", "{b}");
    assert_eq!(b["command"], "sleep 30");
}

// ---- ps ----------------------------------------------------------------------------------------

/// Three processes of both kinds: a finished terminal, a running bash command, a running
/// terminal (newest). Returns their ids in creation order.
fn three_processes(d: &Daemon) -> (String, String, String) {
    let mut c = d.client();
    let t1 = ok(
        &mut c,
        "terminal/create",
        json!({"sessionId": "s1", "command": "sh", "args": ["-c", "exit 5"]}),
    )["terminalId"]
        .as_str()
        .expect("id")
        .to_string();
    ok(
        &mut c,
        "terminal/wait_for_exit",
        json!({"sessionId": "s1", "terminalId": t1}),
    );
    let r = ok(
        &mut c,
        "bash/exec",
        json!({"command": "sleep 30", "session_id": "bs", "async_mode": true}),
    );
    let b = r["command_id"].as_str().expect("id").to_string();
    let t2 = ok(
        &mut c,
        "terminal/create",
        json!({"sessionId": "s2", "command": "sleep", "args": ["30"]}),
    )["terminalId"]
        .as_str()
        .expect("id")
        .to_string();
    (t1, b, t2)
}

#[test]
fn ps_json_lists_processes_newest_first() {
    let d = Daemon::start(&[]);
    let (t1, b, t2) = three_processes(&d);
    let o = ctl_code(&d, &["ps", "--json"], 0);
    let v: Value = serde_json::from_str(&o.stdout).expect("ps --json is JSON");
    let ps = v["processes"].as_array().expect("processes");
    let ids: Vec<&str> = ps.iter().map(|p| p["id"].as_str().unwrap_or("")).collect();
    assert_eq!(ids, [t2.as_str(), b.as_str(), t1.as_str()], "newest first");
    for p in ps {
        for k in [
            "id",
            "kind",
            "session",
            "pid",
            "state",
            "exit_code",
            "signal",
            "started_at",
            "duration_ms",
            "cwd",
            "command",
            "argv",
        ] {
            assert!(p.get(k).is_some(), "{k} missing in {p}");
        }
        assert!(p["pid"].as_i64().is_some_and(|n| n > 1), "{p}");
    }
    assert_eq!(ps[0]["session"], "s2");
    assert_eq!(ps[0]["state"], "running");
    assert_eq!(ps[0]["exit_code"], Value::Null);
    assert_eq!(ps[0]["argv"], json!(["sleep", "30"]));
    assert_eq!(ps[0]["kind"], "terminal");
    assert_eq!(ps[1]["kind"], "bash");
    assert_eq!(ps[0]["command"], "sleep 30");
    assert_eq!(ps[1]["session"], "bs");
    assert_eq!(ps[1]["state"], "running");
    assert_eq!(ps[1]["command"], "sleep 30");
    assert_eq!(ps[2]["session"], "s1");
    assert_eq!(ps[2]["state"], "exited");
    assert_eq!(ps[2]["exit_code"], 5);
    assert_eq!(
        ps[2]["command"], "sh -c 'exit 5'",
        "arguments quoted as a shell needs"
    );
    assert!(ps[2]["duration_ms"].as_u64().is_some(), "{}", ps[2]);
    // The global --json before the subcommand means the same.
    let o2 = ctl_code(&d, &["--json", "ps"], 0);
    let v2: Value = serde_json::from_str(&o2.stdout).expect("JSON");
    assert_eq!(v2["processes"].as_array().map(Vec::len), Some(3));
}

#[test]
fn ps_human_output_is_aligned_and_plain() {
    let d = Daemon::start(&[]);
    let (t1, b, t2) = three_processes(&d);
    let mut c = d.client();
    let pids: Vec<String> = [&t2, &b, &t1]
        .iter()
        .map(|id| {
            let p = terminals(&mut c)
                .into_iter()
                .find(|t| t["terminalId"] == id.as_str())
                .map(|t| t["pid"].clone())
                .unwrap_or_else(|| bash_command(&mut c, id)["pid"].clone());
            p.to_string()
        })
        .collect();
    let expected_rows = [
        [t2.as_str(), "s2", &pids[0], "running", "-", "sleep 30"],
        [b.as_str(), "bs", &pids[1], "running", "-", "sleep 30"],
        [t1.as_str(), "s1", &pids[2], "exited", "5", "sh -c 'exit 5'"],
    ];
    for no_color in [false, true] {
        let mut cmd = command(Some(&d.socket), &["ps"]);
        if no_color {
            cmd.env("NO_COLOR", "1");
        }
        let o = run_cmd(cmd);
        assert_eq!(o.code, Some(0), "{o:?}");
        assert!(
            !has_ansi(&o.stdout),
            "ANSI escapes when not a terminal: {o:?}"
        );
        let lines: Vec<&str> = o.stdout.lines().collect();
        assert_eq!(lines.len(), 4, "{}", o.stdout);
        let header = lines[0];
        let names = [
            "ID", "SESSION", "PID", "STATE", "EXIT", "AGE", "DURATION", "COMMAND",
        ];
        assert_eq!(header.split_whitespace().collect::<Vec<_>>(), names);
        // Columns start where their header starts, at least two spaces apart.
        let starts: Vec<usize> = names
            .iter()
            .map(|n| {
                header
                    .match_indices(n)
                    .map(|(i, _)| i)
                    .find(|&i| i == 0 || header[..i].ends_with("  "))
                    .unwrap_or_else(|| panic!("{n} not a column in {header:?}"))
            })
            .collect();
        for (line, want) in lines[1..].iter().zip(&expected_rows) {
            let cell = |col: usize| -> &str {
                let end = starts.get(col + 1).copied().unwrap_or(line.len());
                assert!(
                    col == 0 || line[..starts[col]].ends_with("  "),
                    "column {} not aligned in {line:?}",
                    names[col]
                );
                line[starts[col]..end.min(line.len())].trim_end()
            };
            assert_eq!(cell(0), want[0], "{line:?}");
            assert_eq!(cell(1), want[1], "{line:?}");
            assert_eq!(cell(2), want[2], "{line:?}");
            assert_eq!(cell(3), want[3], "{line:?}");
            assert_eq!(cell(4), want[4], "{line:?}");
            let age = cell(5);
            assert!(
                age.len() >= 2
                    && age[..age.len() - 1].bytes().all(|b| b.is_ascii_digit())
                    && age.ends_with(['s', 'm', 'h', 'd']),
                "AGE {age:?} in {line:?}"
            );
            // DURATION: seconds with a tenth, or two units (12s, 5m03s, 2h05m).
            let duration = cell(6);
            assert!(
                duration.ends_with(['s', 'm', 'h'])
                    && duration.starts_with(|c: char| c.is_ascii_digit()),
                "DURATION {duration:?} in {line:?}"
            );
            assert_eq!(&line[starts[7]..], want[5], "{line:?}");
        }
    }
}

/// Runs `execctl ps` with stdout on a terminal; returns what it printed there.
fn ps_on_a_terminal(d: &Daemon, no_color: Option<&str>) -> String {
    let (master, slave) = open_pty();
    let mut cmd = command(Some(&d.socket), &["ps"]);
    if let Some(v) = no_color {
        cmd.env("NO_COLOR", v);
    }
    cmd.stdout(Stdio::from(slave)).stderr(Stdio::null());
    let mut ctl = Ctl {
        child: cmd.spawn().expect("spawn execctl"),
    };
    drop(cmd); // our copy of the slave: the master sees EIO once execctl closes its own
    let reader = drain(master);
    let st = ctl.wait();
    assert_eq!(st.code(), Some(0), "{st:?}");
    reader.join().expect("pty reader")
}

/// Colour only on a terminal, and not even there with NO_COLOR set.
#[test]
fn ps_colour_follows_the_terminal_and_no_color() {
    let d = Daemon::start(&[]);
    three_processes(&d);
    let coloured = ps_on_a_terminal(&d, None);
    assert!(
        coloured.contains("\x1b[32mrunning\x1b[0m"),
        "no colour on a terminal: {coloured:?}"
    );
    let plain = ps_on_a_terminal(&d, Some("1"));
    assert!(plain.contains("running"), "{plain:?}");
    assert!(!has_ansi(&plain), "ANSI escapes with NO_COLOR=1: {plain:?}");
}

// ---- logs --------------------------------------------------------------------------------------

#[test]
fn logs_prints_retained_output() {
    let d = Daemon::start(&[]);
    let mut c = d.client();
    let id = create(&mut c, "sh", &["-c", "echo one; echo two >&2"]);
    wait_exit(&mut c, &id);
    let o = ctl_code(&d, &["logs", &id], 0);
    assert_eq!(o.stdout, "one\ntwo\n");

    // A named session keeps its commands after `exec` returns.
    let b = ctl_code(
        &d,
        &["exec", "--session", "keep", "echo out1; echo err1 >&2"],
        0,
    );
    assert_eq!(b.stdout, "out1\n");
    let r = ok(&mut c, "bash/commands", json!({}));
    let id = r["commands"][0]["command_id"]
        .as_str()
        .expect("command_id")
        .to_string();
    let o = ctl_code(&d, &["logs", &id], 0);
    assert_eq!(o.stdout, "out1\n");
    assert_eq!(o.stderr, "err1\n");
    let o = ctl_code(&d, &["logs", &id, "--stderr"], 0);
    assert_eq!(o.stdout, "", "--stderr prints only stderr");
    assert_eq!(o.stderr, "err1\n");

    let o = ctl(&d, &["logs", "term_987654"]);
    assert_eq!(o.code, Some(125), "{o:?}");
    assert!(o.stderr.contains("term_987654"), "{o:?}");
    assert!(o.stderr.contains("execctl ps"), "says where ids are: {o:?}");
}

#[test]
fn logs_follow_streams_until_exit() {
    let d = Daemon::start(&[]);
    let id = exec_detached(&d, "for i in 1 2 3; do echo $i; sleep 0.2; done");
    let o = ctl_code(&d, &["logs", &id, "-f"], 0);
    assert_eq!(o.stdout, "1\n2\n3\n");

    // Following a bash command: stdout and stderr to their own streams, or only stderr.
    let id = exec_detached(
        &d,
        "for i in 1 2; do echo o$i; echo e$i >&2; sleep 0.1; done",
    );
    let o = ctl_code(&d, &["logs", "-f", &id], 0);
    assert_eq!(o.stdout, "o1\no2\n");
    assert!(o.stderr.contains("e1\ne2\n"), "{o:?}");
    let o = ctl_code(&d, &["logs", "-f", "--stderr", &id], 0);
    assert_eq!(o.stdout, "");
    assert!(o.stderr.contains("e1\ne2\n"), "{o:?}");
    assert!(
        !o.stderr.contains("o1"),
        "stdout leaked into --stderr: {o:?}"
    );

    // A terminal that is still running: -f prints the live output and returns at exit.
    let mut c = d.client();
    let id = create(&mut c, "sh", &["-c", "echo a; sleep 0.3; echo b"]);
    let o = ctl_code(&d, &["logs", &id, "-f"], 0);
    assert_eq!(o.stdout, "a\nb\n");
}

// ---- wait, kill, release ---------------------------------------------------------------------

#[test]
fn wait_exits_with_the_command_status() {
    let d = Daemon::start(&[]);
    let mut c = d.client();
    let t = create(&mut c, "sh", &["-c", "sleep 0.3; exit 6"]);
    ctl_code(&d, &["wait", &t], 6);
    let t = create(&mut c, "sh", &["-c", "kill -TERM $$"]);
    ctl_code(&d, &["wait", &t], 143);
    let b = exec_detached(&d, "sleep 0.3; exit 9");
    ctl_code(&d, &["wait", &b], 9);
    // Already finished: at once, same status.
    ctl_code(&d, &["wait", &b], 9);
    let o = ctl_code(&d, &["wait", &b, "--json"], 9);
    let v = parse_json(&o.stdout);
    assert_eq!(
        v,
        json!({"id": b, "state": "exited", "exit_code": 9, "signal": null})
    );
}

#[test]
fn kill_stops_terminals_and_bash_commands() {
    let d = Daemon::start(&[]);
    let mut c = d.client();
    let t = create(&mut c, "sleep", &["30"]);
    ctl_code(&d, &["kill", &t], 0);
    let st = wait_exit(&mut c, &t);
    assert_eq!(st["signal"], "SIGTERM", "{st}");
    assert_eq!(st["exitCode"], Value::Null);

    let b = exec_detached(&d, "sleep 30");
    ctl_code(&d, &["kill", &b, "-s", "SIGINT"], 0);
    wait_until("the bash command ended", || {
        bash_command(&mut c, &b)["status"] != "running"
    });
    let info = bash_command(&mut c, &b);
    assert_eq!(info["status"], "killed", "{info}");
    assert_eq!(info["signal"], "SIGINT", "{info}");
    assert!(!pid_alive(info["pid"].as_i64().expect("pid") as i32));

    let b = exec_detached(&d, "sleep 30");
    ctl_code(&d, &["kill", &b], 0);
    wait_until("the bash command ended", || {
        bash_command(&mut c, &b)["status"] != "running"
    });
    assert_eq!(bash_command(&mut c, &b)["signal"], "SIGTERM");

    let o = ctl(&d, &["kill", "cmd_987654"]);
    assert_eq!(o.code, Some(125), "{o:?}");
}

#[test]
fn release_forgets_a_terminal() {
    let d = Daemon::start(&[]);
    let mut c = d.client();
    let t = create(&mut c, "sleep", &["30"]);
    let pid = terminals(&mut c)[0]["pid"].as_i64().expect("pid") as i32;
    let o = ctl_code(&d, &["ps", "--json"], 0);
    assert!(o.stdout.contains(&t), "{o:?}");
    ctl_code(&d, &["release", &t], 0);
    let o = ctl_code(&d, &["ps", "--json"], 0);
    let v: Value = serde_json::from_str(&o.stdout).expect("JSON");
    assert_eq!(v["processes"], json!([]), "released terminal still listed");
    wait_until("the released command is gone", || !pid_alive(pid));
    let (code, _, _) = err(
        &mut c,
        "terminal/output",
        json!({"sessionId": "s", "terminalId": t}),
    );
    assert_eq!(code, -32002);
    let o = ctl(&d, &["release", &t]);
    assert_eq!(o.code, Some(125), "{o:?}");
}

// ---- sessions, status, call -------------------------------------------------------------------

#[test]
fn sessions_lists_bash_sessions() {
    let d = Daemon::start(&[]);
    ctl_code(&d, &["exec", "--session", "mysess", "true"], 0);
    ctl_code(&d, &["exec", "--session", "mysess", "true"], 0);
    ctl_code(&d, &["exec", "--session", "other", "true"], 0);
    let o = ctl_code(&d, &["sessions", "--json"], 0);
    let v = parse_json(&o.stdout);
    let list = v["sessions"]
        .as_array()
        .expect("sessions under a named key");
    assert_eq!(list.len(), 2, "{v}");
    let mine = list
        .iter()
        .find(|s| s["id"] == "mysess")
        .unwrap_or_else(|| panic!("mysess missing: {v}"));
    assert_eq!(mine["commands"], 2, "{mine}");
    assert_eq!(mine["running"], Value::Null, "{mine}");
    for k in ["dir", "created_at", "last_used_at"] {
        assert!(mine[k].is_string(), "{k} in {mine}");
    }
    assert!(list.iter().any(|s| s["id"] == "other"));

    let o = ctl_code(&d, &["sessions"], 0);
    assert!(!has_ansi(&o.stdout));
    let lines: Vec<&str> = o.stdout.lines().collect();
    assert_eq!(lines.len(), 3, "{}", o.stdout);
    assert_eq!(
        lines[0].split_whitespace().collect::<Vec<_>>(),
        ["SESSION", "KIND", "COMMANDS", "AGE", "IDLE", "DIR", "RUNNING"]
    );
    let row = lines
        .iter()
        .find(|l| l.starts_with("mysess "))
        .unwrap_or_else(|| panic!("no mysess row: {}", o.stdout));
    let col = lines[0].find("COMMANDS").expect("COMMANDS column");
    assert!(row[col..].starts_with("2 "), "{row:?}");
}

#[test]
fn status_shows_version_pid_socket_counts_and_limits() {
    let d = Daemon::start(&["--client-buffer", "2M"]);
    let mut c = d.client();
    create(&mut c, "sleep", &["30"]);
    ctl_code(&d, &["exec", "--session", "st", "true"], 0);
    let socket = d.socket.to_str().expect("UTF-8 socket");

    let o = ctl_code(&d, &["status", "--json"], 0);
    let v = parse_json(&o.stdout);
    assert_eq!(v["version"], env!("CARGO_PKG_VERSION"), "{v}");
    assert_eq!(v["pid"], d.pid(), "{v}");
    assert_eq!(v["socket"], socket, "{v}");
    assert_eq!(v["terminals"], 1, "{v}");
    assert_eq!(v["running_terminals"], 1, "{v}");
    assert_eq!(v["bash_commands"], 1, "{v}");
    assert_eq!(v["running_bash_commands"], 0, "{v}");
    assert!(v["uptime_ms"].as_u64().is_some(), "{v}");
    assert!(v["output_memory"]["budget"].as_u64().is_some(), "{v}");
    assert_eq!(v["sessions"], 1, "{v}");
    assert_eq!(v["running"], 1, "{v}");
    assert!(v["clients"].as_u64().is_some_and(|n| n >= 2), "{v}");
    assert_eq!(v["limits"]["client_buffer"], 2 << 20, "{v}");
    assert_eq!(v["limits"]["kill_grace_ms"], 1000, "{v}");

    let o = ctl_code(&d, &["status"], 0);
    let first = o.stdout.lines().next().unwrap_or("");
    assert_eq!(
        first,
        format!(
            "execd {} (pid {}) on {socket}",
            env!("CARGO_PKG_VERSION"),
            d.pid()
        )
    );
    assert!(o.stdout.contains("\nlimits\n"), "{}", o.stdout);
    // Limits as the daemon's flags take them.
    let limit = |flag: &str| -> Vec<String> {
        o.stdout
            .lines()
            .find(|l| l.trim_start().starts_with(&format!("{flag} ")))
            .unwrap_or_else(|| panic!("no {flag} line in {}", o.stdout))
            .split_whitespace()
            .map(String::from)
            .collect()
    };
    assert_eq!(limit("--client-buffer"), ["--client-buffer", "2M"]);
    assert_eq!(limit("--kill-grace"), ["--kill-grace", "1s"]);
    assert_eq!(limit("--session-idle"), ["--session-idle", "1h"]);
    assert_eq!(limit("--output-limit"), ["--output-limit", "1M"]);
    assert!(!has_ansi(&o.stdout));
}

#[test]
fn call_prints_results_and_errors() {
    let d = Daemon::start(&[]);
    let mut c = d.client();
    let t = create(&mut c, "sleep", &["30"]);
    let o = ctl_code(&d, &["call", "terminal/list", "{}"], 0);
    let v: Value = serde_json::from_str(&o.stdout).expect("JSON result");
    let listed = v["terminals"].as_array().expect("terminals");
    assert_eq!(listed.len(), 1, "{v}");
    assert_eq!(listed[0]["terminalId"], t.as_str());
    // Params default to {}.
    let o = ctl_code(&d, &["call", "terminal/list"], 0);
    let v2: Value = serde_json::from_str(&o.stdout).expect("JSON result");
    assert_eq!(v2["terminals"][0]["terminalId"], t.as_str());

    let o = ctl_code(&d, &["call", "nope"], 125);
    assert_eq!(o.stdout, "");
    assert!(o.stderr.contains("nope"), "{o:?}");
    assert!(o.stderr.contains("-32601"), "{o:?}");

    let o = ctl_code(
        &d,
        &[
            "call",
            "terminal/output",
            r#"{"sessionId":"s","terminalId":"term_999"}"#,
        ],
        125,
    );
    assert!(
        o.stderr.contains("-32002"),
        "the raw tool shows raw codes: {o:?}"
    );
    let o = ctl_code(&d, &["call", "terminal/list", "{not json"], 125);
    assert!(!o.stderr.is_empty());
}

// ---- no daemon ---------------------------------------------------------------------------------

/// A line of stderr names the socket path tried and says how to start the daemon
/// (execctl(1): "When nothing listens there, one line names the path tried and how to
/// start the daemon").
#[track_caller]
fn assert_no_daemon_message(o: &Out, socket: &str) {
    assert!(matches!(o.code, Some(c) if c != 0), "{o:?}");
    assert_eq!(o.stdout, "");
    assert!(
        o.stderr.lines().any(|line| line.contains(socket)
            && line.contains("execd")
            && line.to_lowercase().contains("start")),
        "no stderr line names {socket} and how to start execd: {:?}",
        o.stderr
    );
}

#[test]
fn no_daemon_names_the_socket_and_how_to_start_it() {
    let o = run_cmd(command(Some(Path::new("/nonexistent/x.sock")), &["ps"]));
    assert_no_daemon_message(&o, "/nonexistent/x.sock");

    let mut cmd = command(None, &["ps"]);
    cmd.env("EXECD_SOCKET", "/nonexistent/y.sock");
    let o = run_cmd(cmd);
    assert_no_daemon_message(&o, "/nonexistent/y.sock");

    // A stale socket file with nobody listening is the same.
    let dir = TempDir::new();
    let stale = dir.path().join("stale.sock");
    drop(std::os::unix::net::UnixListener::bind(&stale).expect("bind"));
    let o = run_cmd(command(Some(&stale), &["status"]));
    assert_no_daemon_message(&o, stale.to_str().expect("UTF-8"));
}

#[test]
fn execd_socket_env_is_honoured() {
    let d = Daemon::start(&[]);
    let mut c = d.client();
    let t = create(&mut c, "sleep", &["30"]);
    let mut cmd = command(None, &["ps", "--json"]);
    cmd.env("EXECD_SOCKET", &d.socket);
    let o = run_cmd(cmd);
    assert_eq!(o.code, Some(0), "{o:?}");
    let v = parse_json(&o.stdout);
    assert_eq!(v["processes"][0]["id"], t.as_str());
    // --socket wins over the environment.
    let mut cmd = command(Some(&d.socket), &["ps", "--json"]);
    cmd.env("EXECD_SOCKET", "/nonexistent/z.sock");
    let o = run_cmd(cmd);
    assert_eq!(o.code, Some(0), "{o:?}");
}

// ---- help --------------------------------------------------------------------------------------

#[test]
fn every_subcommand_has_help() {
    // No daemon is needed for help.
    let nowhere = Some(Path::new("/nonexistent/help.sock"));
    for flag in ["--help", "-h"] {
        let o = run_cmd(command(nowhere, &[flag]));
        assert_eq!(o.code, Some(0), "{o:?}");
        assert!(o.stdout.starts_with("usage: execctl"), "{o:?}");
    }
    let subs = [
        "run",
        "exec",
        "write",
        "ps",
        "sessions",
        "logs",
        "wait",
        "kill",
        "release",
        "status",
        "call",
        "policy",
        "approve",
        "help",
        "completions",
    ];
    let top = run_cmd(command(nowhere, &["--help"])).stdout;
    for sub in subs {
        let o = run_cmd(command(nowhere, &[sub, "--help"]));
        assert_eq!(o.code, Some(0), "{sub} --help: {o:?}");
        assert!(
            o.stdout.starts_with(&format!("usage: execctl {sub}")),
            "{sub} --help: {o:?}"
        );
        assert_eq!(o.stderr, "", "{sub} --help");
        assert!(
            top.contains(&format!("\n  {sub}")),
            "{sub} missing in usage"
        );
    }
    // `help CMD` is `CMD --help`; two-word commands too.
    for (a, b) in [
        (vec!["help", "run"], vec!["run", "--help"]),
        (
            vec!["help", "sessions", "close"],
            vec!["sessions", "close", "--help"],
        ),
        (
            vec!["help", "policy", "check"],
            vec!["policy", "check", "-h"],
        ),
    ] {
        let x = run_cmd(command(nowhere, &a));
        let y = run_cmd(command(nowhere, &b));
        assert_eq!(x.code, Some(0), "{a:?}: {x:?}");
        assert_eq!(x.stdout, y.stdout, "{a:?} and {b:?}");
    }
    // Bad usage is execctl's own error: 125.
    let o = run_cmd(command(nowhere, &["frobnicate"]));
    assert_eq!(o.code, Some(125), "{o:?}");
    let o = run_cmd(command(nowhere, &[]));
    assert_eq!(o.code, Some(125), "{o:?}");
    assert!(o.stderr.starts_with("usage: execctl"), "{o:?}");
}

/// `execctl exec` without `--session` makes a session for its one command and closes it
/// once the command is done: a loop of them never reaches `--max-sessions` (256).
#[test]
fn exec_without_a_session_leaves_no_session_behind() {
    let d = Daemon::start(&[]);
    for i in 0..300 {
        let o = ctl(&d, &["exec", &format!("echo {i}")]);
        assert_eq!(o.code, Some(0), "call {i}: {o:?}");
        assert_eq!(o.stdout, format!("{i}\n"), "call {i}");
    }
    let mut c = d.client();
    let left = ok(&mut c, "bash/sessions", json!({}));
    assert_eq!(left, json!([]), "sessions left behind");
}
