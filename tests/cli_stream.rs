//! `execctl run` and `exec` in the foreground, as the client issue asks: exact bytes from
//! the first, nothing lost through a slow reader; stdin forwarded and closed; Ctrl-C and
//! hang-ups kill the command, `--detach` does not; docker's exit statuses; options stop
//! at the command; both run in execctl's directory with the variables asked for.

use crate::util::cli::*;
use crate::util::*;

use std::io::Write;
use std::process::Stdio;

// ---- exact bytes, nothing lost -----------------------------------------------------------

/// A daemon whose per-connection buffer is small, so a slow reader of execctl's stdout
/// makes the daemon hold the command back (lossless) long before the output is done.
fn small_buffer_daemon() -> Daemon {
    Daemon::start(&["--client-buffer", "256K"])
}

#[test]
fn run_cat_of_64_mib_of_random_bytes_through_a_slow_reader_is_byte_identical() {
    let d = small_buffer_daemon();
    let data = random_bytes(64 << 20, 1);
    let file = d.dir.path().join("random.bin");
    std::fs::write(&file, &data).expect("write file");
    let mut cmd = command(
        Some(&d.socket),
        &["run", "--", "cat", file.to_str().expect("utf-8")],
    );
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut ctl = Ctl {
        child: cmd.spawn().expect("spawn execctl"),
    };
    let out = drain_slowly(ctl.child.stdout.take().expect("stdout"));
    let err = drain(ctl.child.stderr.take().expect("stderr"));
    let st = ctl.wait();
    let got = out.join().expect("reader");
    let err = err.join().expect("stderr");
    assert_eq!(st.code(), Some(0), "stderr: {err}");
    assert_eq!(err, "", "no warning: nothing was lost");
    assert_eq!(got.len(), data.len(), "byte count");
    assert!(got == data, "bytes differ");
}

#[test]
fn exec_keeps_64_mib_of_stdout_and_8_mib_of_stderr_apart_and_byte_identical() {
    let d = small_buffer_daemon();
    let out_data = random_bytes(64 << 20, 2);
    let err_data = random_bytes(8 << 20, 3);
    let out_file = d.dir.path().join("out.bin");
    let err_file = d.dir.path().join("err.bin");
    std::fs::write(&out_file, &out_data).expect("write");
    std::fs::write(&err_file, &err_data).expect("write");
    let line = format!(
        "cat {} >&2 & cat {}; wait",
        err_file.display(),
        out_file.display()
    );
    let mut cmd = command(Some(&d.socket), &["exec", &line]);
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut ctl = Ctl {
        child: cmd.spawn().expect("spawn execctl"),
    };
    let out = drain_slowly(ctl.child.stdout.take().expect("stdout"));
    let err = drain_bytes(ctl.child.stderr.take().expect("stderr"));
    let st = ctl.wait();
    let got_out = out.join().expect("stdout reader");
    let got_err = err.join().expect("stderr reader");
    assert_eq!(st.code(), Some(0));
    assert_eq!(got_err.len(), err_data.len(), "stderr byte count");
    assert!(got_err == err_data, "stderr bytes differ");
    assert_eq!(got_out.len(), out_data.len(), "stdout byte count");
    assert!(got_out == out_data, "stdout bytes differ");
}

/// Invalid UTF-8 and NULs come through unchanged (no U+FFFD), in both families.
#[test]
fn binary_output_is_not_reencoded() {
    let d = Daemon::start(&[]);
    let bytes: Vec<u8> = (0..=255u8).chain([0xff, 0xfe, 0xc3]).collect();
    let file = d.dir.path().join("bin");
    std::fs::write(&file, &bytes).expect("write");
    let path = file.to_str().expect("utf-8");
    for args in [vec!["run", "cat", path], vec!["exec", "cat", path]] {
        let mut cmd = command(Some(&d.socket), &args);
        cmd.stdout(Stdio::piped()).stderr(Stdio::null());
        let mut ctl = Ctl {
            child: cmd.spawn().expect("spawn"),
        };
        let out = drain_bytes(ctl.child.stdout.take().expect("stdout"));
        assert_eq!(ctl.wait().code(), Some(0), "{args:?}");
        assert_eq!(out.join().expect("reader"), bytes, "{args:?}");
    }
}

/// `seq 1 1000000` (6.9 MB) arrives whole: the first and the last line, and every count.
#[test]
fn large_line_output_arrives_whole() {
    let d = small_buffer_daemon();
    for args in [
        vec!["run", "seq", "1", "1000000"],
        vec!["exec", "seq 1 1000000"],
    ] {
        let o = ctl_code(&d, &args, 0);
        assert_eq!(o.stderr, "", "{args:?}");
        let lines: Vec<&str> = o.stdout.lines().collect();
        assert_eq!(lines.len(), 1_000_000, "{args:?}");
        assert_eq!(lines[0], "1");
        assert_eq!(lines[999_999], "1000000");
    }
}

// ---- stdin ----------------------------------------------------------------------------

#[test]
fn run_forwards_piped_stdin_and_closes_it() {
    let d = Daemon::start(&[]);
    let data = random_bytes(4 << 20, 4);
    for args in [vec!["run", "-i", "--", "cat"], vec!["run", "cat"]] {
        let mut cmd = command(Some(&d.socket), &args);
        cmd.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut ctl = Ctl {
            child: cmd.spawn().expect("spawn"),
        };
        let mut stdin = ctl.child.stdin.take().expect("stdin");
        let input = data.clone();
        let writer = std::thread::spawn(move || stdin.write_all(&input));
        let out = drain_bytes(ctl.child.stdout.take().expect("stdout"));
        let err = drain(ctl.child.stderr.take().expect("stderr"));
        let st = ctl.wait();
        assert!(writer.join().expect("writer").is_ok());
        assert_eq!(
            st.code(),
            Some(0),
            "{args:?}: {}",
            err.join().expect("stderr")
        );
        let got = out.join().expect("reader");
        assert_eq!(got.len(), data.len(), "{args:?}");
        assert!(got == data, "{args:?}: bytes differ");
    }
    // `echo hi | execctl run -- cat` prints it.
    let o = run_with_input(command(Some(&d.socket), &["run", "--", "cat"]), b"hi\n");
    assert_eq!((o.code, o.stdout.as_str()), (Some(0), "hi\n"), "{o:?}");
}

#[test]
fn exec_forwards_piped_stdin_and_closes_it() {
    let d = Daemon::start(&[]);
    // `echo hi | execctl exec cat` ends (it hung for ever before).
    let o = run_with_input(command(Some(&d.socket), &["exec", "cat"]), b"hi\n");
    assert_eq!((o.code, o.stdout.as_str()), (Some(0), "hi\n"), "{o:?}");
    let o = run_with_input(
        command(Some(&d.socket), &["exec", "wc -c; echo done >&2"]),
        &random_bytes(3 << 20, 5),
    );
    assert_eq!(o.code, Some(0), "{o:?}");
    assert_eq!(o.stdout.trim(), (3 << 20).to_string());
    assert_eq!(o.stderr, "done\n");
}

#[test]
fn exec_cat_from_dev_null_finishes() {
    let d = Daemon::start(&[]);
    // `command()` gives execctl /dev/null as stdin.
    let o = ctl_code(&d, &["exec", "cat"], 0);
    assert_eq!(o.stdout, "");
    let o = ctl_code(&d, &["run", "cat"], 0);
    assert_eq!(o.stdout, "");
}

/// With stdin a terminal and no -i, the command's stdin is closed, never left open:
/// `cat` ends at once.
#[test]
fn stdin_from_a_terminal_is_not_forwarded_and_the_commands_stdin_is_closed() {
    let d = Daemon::start(&[]);
    for args in [
        vec!["exec", "cat; echo end"],
        vec!["run", "sh", "-c", "cat; echo end"],
    ] {
        let (master, slave) = open_pty();
        let mut cmd = command(Some(&d.socket), &args);
        cmd.stdin(Stdio::from(slave));
        let o = run_cmd(cmd);
        drop(master);
        assert_eq!(o.code, Some(0), "{args:?}: {o:?}");
        assert_eq!(o.stdout, "end\n", "{args:?}");
    }
}

#[test]
fn write_feeds_a_detached_command_started_with_stdin_open() {
    let d = Daemon::start(&[]);
    let mut c = d.client();
    // A bash command.
    let o = ctl_code(&d, &["exec", "-d", "-i", "cat"], 0);
    let id = o.stdout.trim().to_string();
    ctl_code(&d, &["write", &id, "hello "], 0);
    let o = run_with_input(
        command(Some(&d.socket), &["write", "--eof", &id]),
        b"world\n",
    );
    assert_eq!(o.code, Some(0), "{o:?}");
    let info = wait_bash_done(&mut c, &id);
    assert_eq!(info["exit_code"], 0, "{info}");
    let o = ctl_code(&d, &["logs", &id], 0);
    assert_eq!(o.stdout, "hello world\n");
    // A terminal.
    let o = ctl_code(&d, &["run", "-di", "--", "cat"], 0);
    let id = o.stdout.trim().to_string();
    assert!(id.starts_with("term_"), "{o:?}");
    let o = ctl_code(&d, &["--json", "write", "--eof", &id, "line\n"], 0);
    assert_eq!(parse_json(&o.stdout)["written"], 5, "{o:?}");
    ctl_code(&d, &["wait", &id], 0);
    assert_eq!(ctl_code(&d, &["logs", &id], 0).stdout, "line\n");
    // Writing to a command whose stdin is closed says so.
    let o = ctl(&d, &["write", &id, "more"]);
    assert_eq!(o.code, Some(125), "{o:?}");
    assert!(o.stderr.contains(&id), "{o:?}");
    // A detached command without -i has its stdin closed from the start.
    let id = exec_detached(&d, "cat; echo done");
    wait_bash_done(&mut c, &id);
    assert_eq!(ctl_code(&d, &["logs", &id], 0).stdout, "done\n");
}

// ---- ending: signals, hang-ups, timeouts, detach ---------------------------------------

/// Starts `execctl ARGS` whose command prints its pid first; returns execctl and the pid.
fn start_printing_pid(d: &Daemon, args: &[&str]) -> (Ctl, i32) {
    let (ctl, rx) = spawn_lines(&mut command(Some(&d.socket), args));
    let pid: i32 = next_line(&rx)
        .trim()
        .parse()
        .unwrap_or_else(|e| panic!("no pid printed by {args:?}: {e}"));
    assert!(pid_alive(pid));
    (ctl, pid)
}

#[test]
fn ctrl_c_and_hangups_kill_the_foreground_command() {
    let d = Daemon::start(&[]);
    let cases: [(&[&str], i32, i32); 5] = [
        (&["exec", "echo $$; exec sleep 30"], libc::SIGINT, 130),
        (&["exec", "echo $$; exec sleep 30"], libc::SIGHUP, 129),
        (
            &["run", "--", "sh", "-c", "echo $$; exec sleep 30"],
            libc::SIGHUP,
            129,
        ),
        (
            &["run", "--", "sh", "-c", "echo $$; exec sleep 30"],
            libc::SIGTERM,
            143,
        ),
        // It ignores SIGTERM: SIGKILL after the daemon's grace, and its status says so.
        (
            &["exec", "trap '' TERM; echo $$; while :; do sleep 0.1; done"],
            libc::SIGTERM,
            137,
        ),
    ];
    for (args, sig, code) in cases {
        let (mut ctl, pid) = start_printing_pid(&d, args);
        if args.iter().any(|a| a.contains("exec sleep")) {
            // The signal goes to the program, not to the shell before it.
            wait_until("sleep runs", || group_runs(pid, "sleep"));
        }
        unsafe_kill(ctl.pid(), sig);
        let st = ctl.wait();
        assert_eq!(st.code(), Some(code), "{args:?} after signal {sig}");
        wait_until("the command is gone", || {
            !pid_alive(pid) && !group_alive(pid)
        });
    }
    // Nothing of execctl's is left running, and exec closed the sessions it made.
    let mut c = d.client();
    assert!(
        ok(&mut c, "bash/commands", json!({}))["commands"]
            .as_array()
            .is_some_and(|l| l.iter().all(|b| b["status"] != "running")),
        "a command still runs"
    );
    assert_eq!(ok(&mut c, "bash/sessions", json!({})), json!([]));
}

#[test]
fn detach_leaves_the_command_running_and_prints_its_id() {
    let d = Daemon::start(&[]);
    let mut c = d.client();
    let o = ctl_code(&d, &["run", "--detach", "--", "sleep", "30"], 0);
    let t = o.stdout.trim().to_string();
    let pid = pid_of(&mut c, &t);
    let b = exec_detached(&d, "sleep 30");
    let bpid = bash_command(&mut c, &b)["pid"].as_i64().expect("pid") as i32;
    assert!(
        pid_alive(pid) && pid_alive(bpid),
        "detached commands run on"
    );
    assert_eq!(bash_command(&mut c, &b)["status"], "running");
    let o = ctl_code(&d, &["--json", "run", "-d", "sleep", "30"], 0);
    let v = parse_json(&o.stdout);
    assert_eq!(v["kind"], "terminal", "{v}");
    assert_eq!(v["status"], "running", "{v}");
    ctl_code(&d, &["kill", &t, &b, v["id"].as_str().expect("id")], 0);
    wait_until("killed", || !pid_alive(pid) && !pid_alive(bpid));
}

#[test]
fn a_sigkilled_execctl_takes_its_foreground_command_along_but_not_a_detached_one() {
    let dir = TempDir::new();
    let audit = dir.path().join("audit.jsonl");
    let socket = dir.path().join("execd.sock");
    let d = Daemon::start_at(dir, socket, &["--audit", audit.to_str().expect("utf-8")]);
    let cases: [&[&str]; 2] = [
        &["run", "--", "sh", "-c", "echo $$; exec sleep 30"],
        &["exec", "echo $$; exec sleep 30"],
    ];
    for args in cases {
        let (mut ctl, pid) = start_printing_pid(&d, args);
        // execctl has no chance to ask for anything: its connection's end is the word.
        unsafe_kill(ctl.pid(), libc::SIGKILL);
        ctl.wait();
        wait_until("the command of a SIGKILLed execctl is gone", || {
            !pid_alive(pid) && !group_alive(pid)
        });
    }
    // A kill is recorded when it is decided and written by the end of that turn: the
    // process may be gone a moment before its record is in the file.
    let kills = || -> Vec<Value> {
        std::fs::read_to_string(&audit)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter(|r| r["event"] == "kill")
            .collect()
    };
    wait_until("both kills are audited", || kills().len() >= 2);
    let kills = kills();
    assert_eq!(kills.len(), 2, "{kills:?}");
    assert!(
        kills.iter().all(|k| k["reason"] == "disconnect"),
        "{kills:?}"
    );
    // A detached command outlives the execctl that started it, and its connection.
    let mut c = d.client();
    let t = ctl_code(&d, &["run", "--detach", "--", "sleep", "30"], 0)
        .stdout
        .trim()
        .to_string();
    let b = exec_detached(&d, "sleep 30");
    // Two round trips on another connection: the daemon has seen the first ones close.
    for _ in 0..2 {
        ok(&mut c, "bash/sessions", json!({}));
    }
    let pid = pid_of(&mut c, &t);
    assert!(pid_alive(pid), "a detached run runs on");
    assert_eq!(bash_command(&mut c, &b)["status"], "running");
    ctl_code(&d, &["kill", &t, &b], 0);
}

#[test]
fn a_daemon_shutting_down_under_run_or_exec_says_so() {
    for args in [
        &["run", "--", "sh", "-c", "echo started; exec sleep 30"][..],
        &["exec", "echo started; exec sleep 30"],
    ] {
        let mut d = Daemon::start(&[]);
        let mut cmd = command(Some(&d.socket), args);
        cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
        let mut ctl = Ctl {
            child: cmd.spawn().expect("spawn execctl"),
        };
        let stdout = ctl.child.stdout.take().expect("stdout");
        let lines = lines_of(stdout);
        let err = drain(ctl.child.stderr.take().expect("stderr"));
        assert_eq!(next_line(&lines), "started");
        d.terminate();
        assert_eq!(ctl.wait().code(), Some(143), "{args:?}");
        let err = err.join().expect("stderr");
        let said = format!(
            "execctl: execd at {} shut down and killed ",
            d.socket.display()
        );
        assert!(err.starts_with(&said), "{args:?}: {err:?}");
        assert!(err.trim_end().ends_with("(SIGTERM)"), "{args:?}: {err:?}");
    }
}

#[test]
fn timeout_means_kill_and_124_for_run_and_exec_and_zero_means_none() {
    let d = Daemon::start(&[]);
    let mut c = d.client();
    for (args, flag) in [
        (
            vec![
                "run",
                "--timeout",
                "2",
                "--",
                "sh",
                "-c",
                "echo $$; exec sleep 30",
            ],
            "",
        ),
        (
            vec!["exec", "--timeout", "2000ms", "echo $$; exec sleep 30"],
            "",
        ),
        (
            vec!["exec", "--hard-timeout", "2", "echo $$; exec sleep 30"],
            "alias",
        ),
    ] {
        let o = ctl_code(&d, &args, 124);
        let pid: i32 = o.stdout.trim().parse().unwrap_or_else(|_| panic!("{o:?}"));
        assert!(o.stderr.contains("timed out"), "{flag} {o:?}");
        wait_until("the timed-out command is gone", || !pid_alive(pid));
    }
    assert_eq!(
        terminals(&mut c),
        Vec::<Value>::new(),
        "run released its terminal"
    );
    // 0: no limit.
    let o = ctl_code(
        &d,
        &["run", "--timeout", "0", "sh", "-c", "sleep 0.3; echo ok"],
        0,
    );
    assert_eq!(o.stdout, "ok\n");
    let o = ctl_code(&d, &["exec", "--timeout", "0", "sleep 0.3; echo ok"], 0);
    assert_eq!(o.stdout, "ok\n");
}

/// `exec --wait SECS` is the soft timeout: it returns 0 with the command running on.
#[test]
fn exec_wait_returns_with_the_command_still_running() {
    let d = Daemon::start(&[]);
    let mut c = d.client();
    let o = ctl_code(
        &d,
        &["exec", "--wait", "2", "echo first; sleep 4; echo second"],
        0,
    );
    assert_eq!(o.stdout, "first\n");
    let id = o
        .stderr
        .split_whitespace()
        .find(|w| w.starts_with("cmd_"))
        .unwrap_or_else(|| panic!("no id on stderr: {o:?}"))
        .to_string();
    assert!(o.stderr.contains("still running"), "{o:?}");
    assert_eq!(bash_command(&mut c, &id)["status"], "running");
    ctl_code(&d, &["wait", &id], 0);
    assert_eq!(ctl_code(&d, &["logs", &id], 0).stdout, "first\nsecond\n");
}

// ---- exit statuses ------------------------------------------------------------------------

#[test]
fn exit_statuses_end_to_end() {
    let d = Daemon::start(&[]);
    ctl_code(&d, &["run", "true"], 0);
    ctl_code(&d, &["exec", "true"], 0);
    ctl_code(&d, &["run", "sh", "-c", "exit 3"], 3);
    ctl_code(&d, &["exec", "exit 3"], 3);
    ctl_code(&d, &["run", "sh", "-c", "kill -KILL $$"], 137);
    ctl_code(&d, &["exec", "kill -KILL $$"], 137);

    // 127: not found, named in one line.
    let o = ctl_code(&d, &["run", "--", "nosuchcmd"], 127);
    assert_eq!(o.stderr, "execctl: nosuchcmd: command not found\n");
    let o = ctl_code(&d, &["exec", "nosuchcmd"], 127);
    assert!(o.stderr.contains("nosuchcmd"), "{o:?}");
    // 126: a directory, said as such (the kernel says "permission denied" for it).
    let o = ctl_code(&d, &["run", "--", "/tmp"], 126);
    assert_eq!(o.stderr, "execctl: /tmp: is a directory\n");
    // 126: found, not executable.
    let file = d.dir.path().join("not-executable");
    std::fs::write(&file, "echo hi\n").expect("write");
    let path = file.to_str().expect("utf-8");
    let o = ctl_code(&d, &["run", path], 126);
    assert!(o.stderr.contains(path), "{o:?}");
    ctl_code(&d, &["exec", path], 126);

    // 125: execctl's own errors, usage included, and the daemon's; one sentence, no code.
    for args in [
        vec!["run"],
        vec!["exec"],
        vec!["run", "--timeout", "soon", "true"],
        vec!["run", "--cwdd", "/", "true"],
        vec!["run", "--cwd", "/nonexistent/dir", "true"],
        vec!["exec", "--cwd", "/nonexistent/dir", "true"],
    ] {
        let o = ctl_code(&d, &args, 125);
        assert_eq!(o.stderr.lines().count(), 1, "{args:?}: {o:?}");
        assert!(o.stderr.starts_with("execctl: "), "{args:?}: {o:?}");
        assert!(!o.stderr.contains("-326"), "no raw JSON-RPC code: {o:?}");
    }
    // --verbose adds the code; --json prints the error as JSON.
    let o = ctl_code(
        &d,
        &["--verbose", "run", "--cwd", "/nonexistent/dir", "true"],
        125,
    );
    assert!(o.stderr.contains("-32602"), "{o:?}");
    let o = ctl_code(
        &d,
        &["--json", "run", "--cwd", "/nonexistent/dir", "true"],
        125,
    );
    let v = parse_json(&o.stderr);
    assert_eq!(v["error"]["rpc"]["code"], -32602, "{v}");
    assert_eq!(v["error"]["exit_status"], 125, "{v}");
}

// ---- the command line -------------------------------------------------------------------

#[test]
fn options_stop_at_the_first_operand() {
    let d = Daemon::start(&[]);
    let o = ctl_code(&d, &["run", "echo", "--cwd", "/", "x"], 0);
    assert_eq!(o.stdout, "--cwd / x\n");
    // `execctl run git --help` passes --help on (here to a shell script).
    let o = ctl_code(
        &d,
        &["run", "sh", "-c", "echo \"$@\"", "sh", "--help", "-v"],
        0,
    );
    assert_eq!(o.stdout, "--help -v\n");
    let o = ctl_code(&d, &["exec", "echo", "--json", "-d"], 0);
    assert_eq!(o.stdout, "--json -d\n");
    // `--` still works, and options before the command are execctl's.
    let o = ctl_code(&d, &["run", "--cwd", "/", "--", "pwd"], 0);
    assert_eq!(o.stdout, "/\n");
    let o = ctl_code(&d, &["run", "--", "--weird-name"], 127);
    assert!(
        o.stderr.contains("--weird-name: command not found"),
        "{o:?}"
    );
}

#[test]
fn both_run_in_execctls_directory_with_the_variables_asked_for() {
    let d = Daemon::start(&[]);
    let here = std::fs::canonicalize(d.dir.path()).expect("canonical");
    let here = here.to_str().expect("utf-8");
    for args in [vec!["run", "pwd"], vec!["exec", "pwd"]] {
        let mut cmd = command(Some(&d.socket), &args);
        cmd.current_dir(here);
        let o = run_cmd(cmd);
        assert_eq!(o.code, Some(0), "{o:?}");
        assert_eq!(o.stdout, format!("{here}\n"), "{args:?}");
    }
    // A relative --cwd is execctl's directory joined with it.
    std::fs::create_dir(d.dir.path().join("sub")).expect("mkdir");
    let mut cmd = command(Some(&d.socket), &["exec", "--cwd", "sub", "pwd"]);
    cmd.current_dir(here);
    assert_eq!(run_cmd(cmd).stdout, format!("{here}/sub\n"));

    let env_file = d.dir.path().join("env");
    std::fs::write(
        &env_file,
        "# comment\nFROM_FILE=file value\nOVERRIDDEN=file\n",
    )
    .expect("write");
    let env_file = env_file.to_str().expect("utf-8");
    let line = "echo \"$FROM_FILE|$OVERRIDDEN|$COPIED|$SET\"";
    for args in [
        vec![
            "exec",
            "--env-file",
            env_file,
            "-e",
            "OVERRIDDEN=flag",
            "--env",
            "COPIED",
            "--env=SET=a=b",
            line,
        ],
        vec![
            "run",
            "--env-file",
            env_file,
            "-e",
            "OVERRIDDEN=flag",
            "--env",
            "COPIED",
            "--env=SET=a=b",
            "sh",
            "-c",
            line,
        ],
    ] {
        let mut cmd = command(Some(&d.socket), &args);
        cmd.env("COPIED", "from execctl");
        let o = run_cmd(cmd);
        assert_eq!(o.code, Some(0), "{o:?}");
        assert_eq!(o.stdout, "file value|flag|from execctl|a=b\n", "{args:?}");
    }
}

#[test]
fn e_path_hands_the_callers_path_to_the_command() {
    // Commands get the daemon's environment; a tool on the caller's PATH only is found
    // once -e PATH hands that PATH over.
    use std::os::unix::fs::PermissionsExt;
    let d = Daemon::start(&[]);
    let tools = TempDir::new();
    let tool = tools.path().join("execd-test-tool");
    std::fs::write(&tool, "#!/bin/sh\necho mine\n").expect("write");
    std::fs::set_permissions(&tool, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let path = format!("{}:/usr/bin:/bin", tools.path().display());
    let mut cmd = command(Some(&d.socket), &["run", "--", "execd-test-tool"]);
    cmd.env("PATH", &path);
    let o = run_cmd(cmd);
    assert_eq!(
        o.code,
        Some(127),
        "the daemon's PATH does not have it: {o:?}"
    );
    assert!(o.stderr.contains("command not found"), "{o:?}");
    let mut cmd = command(
        Some(&d.socket),
        &["run", "-e", "PATH", "--", "execd-test-tool"],
    );
    cmd.env("PATH", &path);
    let o = run_cmd(cmd);
    assert_eq!((o.code, o.stdout.as_str()), (Some(0), "mine\n"), "{o:?}");
}
