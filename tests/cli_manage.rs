//! Managing what runs: `kill` (several ids, signals by number and name, terminals too),
//! `sessions close`/`prune`, `logs` (what is no longer retained, `--tail`, `-f`), `ps`
//! filters and widths, and the command line's help, suggestions and completions.

use crate::util::cli::*;
use crate::util::*;

use std::fs::File;
use std::os::fd::AsRawFd;
use std::process::Stdio;

// ---- kill ---------------------------------------------------------------------------------

#[test]
fn kill_takes_several_ids_and_signals_by_number_or_name_on_both_families() {
    let d = Daemon::start(&[]);
    let mut c = d.client();
    let forms: [&[&str]; 4] = [&["-9"], &["-s", "9"], &["-KILL"], &["-s", "KILL"]];
    for form in forms {
        let t = create(&mut c, "sleep", &["30"]);
        let b = exec_detached(&d, "sleep 30");
        let mut args = vec!["kill"];
        args.extend_from_slice(form);
        args.extend([t.as_str(), b.as_str()]);
        let o = ctl_code(&d, &args, 0);
        assert_eq!(o.stdout.lines().count(), 2, "one line per id: {o:?}");
        assert!(o.stdout.contains(&format!("{t}: sent SIGKILL")), "{o:?}");
        let st = wait_exit(&mut c, &t);
        assert_eq!(st["signal"], "SIGKILL", "{form:?}: {st}");
        let info = wait_bash_done(&mut c, &b);
        assert_eq!(info["signal"], "SIGKILL", "{form:?}: {info}");
    }
    // A signal that does not end the command: said so.
    let t = create(
        &mut c,
        "sh",
        &[
            "-c",
            "trap 'echo usr1' USR1; echo ready; while :; do sleep 0.05; done",
        ],
    );
    wait_until("the trap is set", || {
        output(&mut c, &t)["output"] == "ready\n"
    });
    let o = ctl_code(&d, &["kill", "-s", "USR1", &t], 0);
    assert!(o.stdout.contains("still running"), "{o:?}");
    ctl_code(&d, &["kill", "-s", "SIGKILL", &t], 0);
    // An unknown signal is a usage error.
    let o = ctl_code(&d, &["kill", "-s", "SEGV", &t], 125);
    assert!(o.stderr.contains("TERM, KILL"), "{o:?}");
}

#[test]
fn kill_says_when_the_command_had_exited_and_when_it_outlived_sigterm() {
    let d = Daemon::start(&[]);
    let mut c = d.client();
    let done = create(&mut c, "sh", &["-c", "exit 4"]);
    wait_exit(&mut c, &done);
    let stubborn = create(
        &mut c,
        "sh",
        &[
            "-c",
            "trap '' TERM; echo ready; while :; do sleep 0.05; done",
        ],
    );
    wait_until("the trap is set", || {
        output(&mut c, &stubborn)["output"] == "ready\n"
    });
    let polite = exec_detached(&d, "sleep 30");
    let o = ctl_code(&d, &["kill", &done, &stubborn, &polite], 0);
    let lines: Vec<&str> = o.stdout.lines().collect();
    assert_eq!(
        lines[0],
        format!("{done}: had already exited (exit code 4)"),
        "{o:?}"
    );
    assert!(
        lines[1].starts_with(&format!("{stubborn}: outlived SIGTERM; SIGKILL ended it")),
        "{o:?}"
    );
    assert!(
        lines[2].starts_with(&format!("{polite}: sent SIGTERM; it ended")),
        "{o:?}"
    );
    // --json: one object per id under "processes"; an unknown id fails the whole (125).
    let t = create(&mut c, "sleep", &["30"]);
    let o = ctl_code(&d, &["--json", "kill", &t, "term_4242"], 125);
    let v = parse_json(&o.stdout);
    let list = v["processes"].as_array().expect("processes");
    assert_eq!(list[0]["id"], t.as_str(), "{v}");
    assert_eq!(list[0]["sent"], json!(["SIGTERM"]), "{v}");
    assert_eq!(list[0]["state"], "killed", "{v}");
    assert_eq!(list[0]["signal"], "SIGTERM", "{v}");
    assert_eq!(list[0]["already_exited"], false, "{v}");
    assert!(
        list[1]["error"]
            .as_str()
            .is_some_and(|e| e.contains("term_4242")),
        "{v}"
    );
}

// ---- sessions -----------------------------------------------------------------------------

#[test]
fn sessions_close_and_prune() {
    let d = Daemon::start(&[]);
    let mut c = d.client();
    ctl_code(&d, &["exec", "--session", "a", "true"], 0);
    ctl_code(&d, &["exec", "--session", "b", "true"], 0);
    ctl_code(&d, &["exec", "--session", "c", "true"], 0);
    let busy = ctl_code(&d, &["exec", "-d", "--session", "busy", "sleep 30"], 0);
    let busy = busy.stdout.trim().to_string();
    let names = |c: &mut Client| -> Vec<String> {
        let mut v: Vec<String> = ok(c, "bash/sessions", json!({}))
            .as_array()
            .expect("sessions")
            .iter()
            .map(|s| s["session_id"].as_str().unwrap_or("").to_string())
            .collect();
        v.sort();
        v
    };
    let o = ctl_code(&d, &["sessions", "close", "a"], 0);
    assert_eq!(o.stdout, "a\n");
    assert_eq!(names(&mut c), ["b", "busy", "c"]);
    let o = ctl_code(&d, &["sessions", "close", "nosuch", "b"], 125);
    assert_eq!(o.stdout, "b\n", "the others are still closed: {o:?}");
    assert!(o.stderr.contains("nosuch"), "{o:?}");
    // prune: every session with nothing running, not the busy one.
    let o = ctl_code(&d, &["--json", "sessions", "prune"], 0);
    assert_eq!(parse_json(&o.stdout), json!({"closed": ["c"]}));
    assert_eq!(names(&mut c), ["busy"]);
    assert_eq!(bash_command(&mut c, &busy)["status"], "running");
    // close kills what runs.
    ctl_code(&d, &["sessions", "close", "busy"], 0);
    assert_eq!(names(&mut c), Vec::<String>::new());
    // A mistyped action gets a suggestion.
    let o = ctl_code(&d, &["sessions", "prnue"], 125);
    assert!(o.stderr.contains("did you mean prune?"), "{o:?}");
}

// ---- logs ---------------------------------------------------------------------------------

#[test]
fn logs_says_how_much_older_output_is_no_longer_retained() {
    let d = Daemon::start(&["--output-limit", "1K"]);
    let mut c = d.client();
    // A terminal that wrote 4096 bytes into a 1 KiB ring: 3072 are gone.
    let t = create(
        &mut c,
        "sh",
        &["-c", "seq 1000 1999 | tr -d '\\n'; seq 1000 1023"],
    );
    wait_exit(&mut c, &t);
    let o = ctl_code(&d, &["logs", &t], 0);
    assert_eq!(o.stdout.len(), 1024, "{o:?}");
    assert!(o.stdout.ends_with("1022\n1023\n"), "{o:?}");
    assert_eq!(
        o.stderr,
        format!("execctl: the first {} bytes of {t}'s output are no longer retained by execd; showing the rest\n", 4000 + 120 - 1024)
    );
    // A bash command: per stream.
    let b = exec_detached(
        &d,
        "head -c 5000 /dev/zero | tr '\\0' o; head -c 3000 /dev/zero | tr '\\0' e >&2",
    );
    wait_bash_done(&mut c, &b);
    let o = ctl_code(&d, &["logs", &b], 0);
    assert!(
        o.stdout.len() == 1024 && o.stdout.bytes().all(|x| x == b'o'),
        "{o:?}"
    );
    assert!(
        o.stderr
            .contains(&format!("the first 3976 bytes of {b}'s stdout")),
        "{o:?}"
    );
    assert!(
        o.stderr
            .contains(&format!("the first 1976 bytes of {b}'s stderr")),
        "{o:?}"
    );
    assert!(o.stderr.ends_with(&"e".repeat(1024)), "{o:?}");
    // --tail asks for the end only: no word about a head nobody asked for.
    let o = ctl_code(&d, &["logs", "--tail", "2", &t], 0);
    assert_eq!((o.stdout.as_str(), o.stderr.as_str()), ("1022\n1023\n", ""));
    // --json: one object, what is gone counted in it.
    let o = ctl_code(&d, &["--json", "logs", &b], 0);
    assert_eq!(o.stderr, "", "{o:?}");
    let v = parse_json(&o.stdout);
    assert_eq!(v["id"], b.as_str(), "{v}");
    assert_eq!(v["kind"], "bash");
    assert_eq!(v["stdout"], "o".repeat(1024));
    assert_eq!(v["stderr"], "e".repeat(1024));
    assert_eq!(v["not_retained_bytes"], 3976 + 1976);
    assert_eq!(v["lost_bytes"], 0);
    let v = parse_json(&ctl_code(&d, &["--json", "logs", "--tail", "1", &t], 0).stdout);
    assert_eq!(v["output"], "1023\n", "{v}");
}

#[test]
fn logs_tail_and_follow() {
    let d = Daemon::start(&[]);
    let mut c = d.client();
    let t = create(&mut c, "seq", &["1", "10"]);
    wait_exit(&mut c, &t);
    assert_eq!(
        ctl_code(&d, &["logs", "--tail", "3", &t], 0).stdout,
        "8\n9\n10\n"
    );
    assert_eq!(ctl_code(&d, &["logs", "--tail", "0", &t], 0).stdout, "");
    assert_eq!(
        ctl_code(&d, &["logs", "--tail", "50", &t], 0)
            .stdout
            .lines()
            .count(),
        10
    );
    let b = exec_detached(&d, "seq 1 5; seq 6 8 >&2");
    wait_bash_done(&mut c, &b);
    let o = ctl_code(&d, &["logs", "--tail", "2", &b], 0);
    assert_eq!((o.stdout.as_str(), o.stderr.as_str()), ("4\n5\n", "7\n8\n"));

    // -f with --tail: the last lines so far, then live output until the exit. The live
    // line waits until the follower has printed its tail, however slow its start.
    let go = d.dir.path().join("go-live");
    let b = exec_detached(
        &d,
        &format!(
            "seq 1 5; while [ ! -e '{}' ]; do sleep 0.02; done; echo live",
            go.display()
        ),
    );
    let session = bash_command(&mut c, &b)["session_id"].clone();
    wait_until("the first lines", || {
        ok(
            &mut c,
            "bash/output",
            json!({"session_id": session, "command_id": b}),
        )["stdout"]
            .as_str()
            .is_some_and(|s| s.ends_with("5\n"))
    });
    let (mut follower, lines) = spawn_lines(&mut command(
        Some(&d.socket),
        &["logs", "-f", "--tail", "1", &b],
    ));
    assert_eq!(next_line(&lines), "5");
    File::create(&go).expect("let the live line out");
    assert_eq!(next_line(&lines), "live");
    assert!(follower.wait().success());
    assert!(lines.recv_timeout(WAIT).is_err(), "nothing after the exit");

    // -f is lossless: a follower reading a fast writer's 20 MB gets every byte.
    let b = exec_detached(&d, "sleep 0.2; seq 1 2500000");
    let mut cmd = command(Some(&d.socket), &["logs", "-f", &b]);
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut ctl = Ctl {
        child: cmd.spawn().expect("spawn"),
    };
    let out = drain_slowly(ctl.child.stdout.take().expect("stdout"));
    let err = drain(ctl.child.stderr.take().expect("stderr"));
    assert_eq!(ctl.wait().code(), Some(0));
    let got = out.join().expect("reader");
    let expected: String = (1..=2_500_000).map(|n| format!("{n}\n")).collect();
    assert_eq!(err.join().expect("stderr"), "");
    assert_eq!(got.len(), expected.len());
    assert!(got == expected.as_bytes(), "bytes differ");
}

// ---- ps ----------------------------------------------------------------------------------

#[test]
fn ps_filters_and_quiet() {
    let d = Daemon::start(&[]);
    let mut c = d.client();
    let done = create(&mut c, "true", &[]);
    wait_exit(&mut c, &done);
    let t = create(&mut c, "sleep", &["30"]);
    let b = ctl_code(&d, &["exec", "-d", "--session", "mine", "sleep 30"], 0);
    let b = b.stdout.trim().to_string();
    assert_eq!(
        ctl_code(&d, &["ps", "-q"], 0).stdout,
        format!("{b}\n{t}\n{done}\n")
    );
    assert_eq!(
        ctl_code(&d, &["ps", "-q", "--running"], 0).stdout,
        format!("{b}\n{t}\n")
    );
    assert_eq!(
        ctl_code(&d, &["ps", "--quiet", "--session", "mine"], 0).stdout,
        format!("{b}\n")
    );
    assert_eq!(
        ctl_code(&d, &["ps", "-q", "--session", "s"], 0).stdout,
        format!("{t}\n{done}\n")
    );
    let v = parse_json(&ctl_code(&d, &["ps", "--json", "--running"], 0).stdout);
    let states: Vec<&str> = v["processes"]
        .as_array()
        .expect("processes")
        .iter()
        .map(|p| p["state"].as_str().unwrap_or(""))
        .collect();
    assert_eq!(states, ["running", "running"]);
}

/// Sets the window size of the pseudo-terminal whose slave is `tty`.
fn set_columns(tty: &File, cols: u16) {
    let ws = libc::winsize {
        ws_row: 24,
        ws_col: cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCSWINSZ reads a winsize from the live pointer; the fd is open.
    let rc = unsafe { libc::ioctl(tty.as_raw_fd(), libc::TIOCSWINSZ, &ws) };
    assert_eq!(rc, 0, "TIOCSWINSZ: {}", std::io::Error::last_os_error());
}

#[test]
fn ps_rows_fit_the_terminal_width() {
    let d = Daemon::start(&[]);
    let mut c = d.client();
    let long = "x".repeat(300);
    create(&mut c, "echo", &[&long, "with spaces"]);
    exec_detached(&d, &format!("sleep 30 # {long}"));
    for cols in [60u16, 100] {
        let (master, slave) = open_pty();
        set_columns(&slave, cols);
        let screen = Screen::watch(master);
        let mut cmd = command(Some(&d.socket), &["ps"]);
        cmd.env("NO_COLOR", "1")
            .stdout(Stdio::from(slave))
            .stderr(Stdio::null());
        let mut ctl = Ctl {
            child: cmd.spawn().expect("spawn"),
        };
        drop(cmd);
        assert_eq!(ctl.wait().code(), Some(0));
        let text = screen.wait_for("\n", 3);
        for line in text.lines() {
            assert!(
                line.trim_end_matches('\r').chars().count() <= cols as usize,
                "{} columns > {cols}: {line:?}",
                line.chars().count()
            );
        }
        assert!(
            text.contains('\u{2026}'),
            "a cut line ends with an ellipsis: {text:?}"
        );
        // The command stays, cut, on a narrow terminal too: other columns give way.
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[0].contains("COMMAND"), "{cols} columns: {text:?}");
        assert!(
            lines.iter().any(|l| l.contains("echo xxx"))
                && lines.iter().any(|l| l.contains("sleep 30")),
            "{cols} columns: {text:?}"
        );
    }
    // Not a terminal: nothing is cut, and arguments are quoted.
    let o = ctl_code(&d, &["ps"], 0);
    assert!(
        o.stdout.contains(&format!("echo {long} 'with spaces'")),
        "{}",
        o.stdout
    );
}

/// `ps` and `sessions` show what an agent sent (session ids, directories, commands)
/// escaped: a newline cannot start a row of its own, nor a carriage return or an escape
/// sequence redraw one. Not a terminal here, so nothing is cut.
#[test]
fn ps_and_sessions_show_an_agents_control_characters_escaped() {
    let d = Daemon::start(&[]);
    let dir = TempDir::new();
    let cwd = dir.path().join("d\u{1b}[2Kir");
    std::fs::create_dir(&cwd).expect("mkdir");
    let session = "s\u{1b}]0;x\u{7}\u{202e}";
    let line = "sleep 30 #\r\u{1b}[2K\nsleep 1";
    let o = ctl_code(
        &d,
        &[
            "exec",
            "-d",
            "--session",
            session,
            "--cwd",
            cwd.to_str().expect("utf-8"),
            line,
        ],
        0,
    );
    let id = o.stdout.trim();
    let clean = |what: &str, text: &str| {
        assert!(
            !text.contains(['\u{1b}', '\r', '\u{7}', '\u{202e}']),
            "{what}: raw controls in {text:?}"
        );
    };
    let ps = ctl_code(&d, &["ps"], 0).stdout;
    clean("ps", &ps);
    assert_eq!(ps.lines().count(), 2, "a header and one row: {ps}");
    let row = ps.lines().nth(1).unwrap_or_default();
    assert!(row.starts_with(id), "{row}");
    assert!(row.contains(r"s\x1b]0;x\x07\u{202e}"), "{row}");
    assert!(row.ends_with(r"sleep 30 #\r\x1b[2K\nsleep 1"), "{row}");

    let sessions = ctl_code(&d, &["sessions"], 0).stdout;
    clean("sessions", &sessions);
    assert_eq!(sessions.lines().count(), 2, "{sessions}");
    let row = sessions.lines().nth(1).unwrap_or_default();
    assert!(row.starts_with(r"s\x1b]0;x\x07\u{202e}"), "{row}");
    assert!(row.contains(r"/d\x1b[2Kir"), "{row}");
    assert!(row.ends_with(r"sleep 30 #\r\x1b[2K\nsleep 1"), "{row}");

    let closed = ctl_code(&d, &["sessions", "close", session], 0).stdout;
    assert_eq!(closed, "s\\x1b]0;x\\x07\\u{202e}\n");
}

// ---- the command line ----------------------------------------------------------------------

#[test]
fn mistyped_commands_and_options_get_a_suggestion() {
    let nowhere = Some(std::path::Path::new("/nonexistent/x.sock"));
    for (args, hint) in [
        (vec!["sesions"], "did you mean sessions?"),
        (vec!["stauts"], "did you mean status?"),
        (vec!["run", "--cdw", "/", "true"], "did you mean --cwd?"),
        (vec!["logs", "--tial", "3", "x"], "did you mean --tail?"),
        (vec!["--jsno", "ps"], "did you mean --json?"),
        (vec!["help", "exce"], "did you mean exec?"),
        (vec!["policy", "chek"], "did you mean check?"),
    ] {
        let o = run_cmd(command(nowhere, &args));
        assert_eq!(o.code, Some(125), "{args:?}: {o:?}");
        assert!(o.stderr.contains(hint), "{args:?}: {o:?}");
        assert_eq!(o.stderr.lines().count(), 1, "{args:?}: {o:?}");
    }
    let o = run_cmd(command(nowhere, &["--version"]));
    assert_eq!(o.stdout, format!("execctl {}\n", env!("CARGO_PKG_VERSION")));
}

#[test]
fn completions_are_valid_scripts_that_name_every_command() {
    let nowhere = Some(std::path::Path::new("/nonexistent/x.sock"));
    for shell in ["bash", "zsh", "fish"] {
        let o = run_cmd(command(nowhere, &["completions", shell]));
        assert_eq!(o.code, Some(0), "{o:?}");
        for sub in [
            "run",
            "exec",
            "logs",
            "kill",
            "approve",
            "policy",
            "completions",
        ] {
            assert!(o.stdout.contains(sub), "{shell} lacks {sub}");
        }
        assert!(o.stdout.contains("cwd"), "{shell} lacks run's flags");
        // Syntax-check with the shell itself where it is installed.
        let checker = std::process::Command::new(shell)
            .arg("-n")
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn();
        if let Ok(mut child) = checker {
            use std::io::Write;
            let mut stdin = child.stdin.take().expect("stdin");
            stdin.write_all(o.stdout.as_bytes()).expect("feed script");
            drop(stdin);
            let out = child.wait_with_output().expect("syntax check");
            assert!(
                out.status.success(),
                "{shell} -n: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        } else {
            assert_ne!(shell, "bash", "bash must be there to check its script");
        }
    }
    let o = run_cmd(command(nowhere, &["completions", "tcsh"]));
    assert_eq!(o.code, Some(125), "{o:?}");
}

// ---- every id ps shows ------------------------------------------------------------------

/// Every id `ps` shows works with the commands that take an id: a terminal's, a bash
/// command's, and a shell session's shell (`sh_N`, whose logs are its terminal's output,
/// whose kill interrupts its running command and whose release closes its session).
#[test]
fn every_id_ps_shows_is_taken_by_logs_kill_wait_and_release() {
    let d = Daemon::start(&[]);
    let mut c = d.client();
    let t = create(&mut c, "echo", &["from a terminal"]);
    wait_exit(&mut c, &t);
    ok(&mut c, "bash/exec", json!({"command": "echo from bash"}));
    ok(
        &mut c,
        "shell/exec",
        json!({"id": "sh", "command": "echo from a shell"}),
    );
    let ps = parse_json(&ctl_code(&d, &["--json", "ps"], 0).stdout);
    let ids: Vec<String> = ps["processes"]
        .as_array()
        .expect("processes")
        .iter()
        .map(|p| p["id"].as_str().expect("id").to_string())
        .collect();
    assert_eq!(ids.len(), 3, "{ps}");
    for id in &ids {
        let o = ctl_code(&d, &["logs", id], 0);
        assert!(o.stdout.contains("from "), "{id}: {o:?}");
    }
    let shell = ids.iter().find(|i| i.starts_with("sh_")).expect("a shell");
    // Waiting on it waits for its running command; killing it interrupts that.
    ok(
        &mut c,
        "shell/exec",
        json!({"id": "sh", "command": "sleep 30", "async_mode": true}),
    );
    let o = ctl_code(&d, &["kill", shell], 0);
    assert!(o.stdout.contains(&format!("{shell}: sent SIGINT")), "{o:?}");
    let o = ctl(&d, &["wait", shell]);
    assert_eq!(o.code, Some(130), "sleep ended by SIGINT: {o:?}");
    let o = ctl(&d, &["kill", shell]);
    assert_eq!(o.code, Some(125), "{o:?}");
    assert!(
        o.stderr.contains("nothing runs in shell session sh"),
        "{o:?}"
    );
    // Releasing it closes its session.
    ctl_code(&d, &["release", shell], 0);
    let l = ok(&mut c, "shell/sessions", json!({}));
    assert_eq!(l["sessions"], json!({}), "{l}");
    let o = ctl(&d, &["logs", shell]);
    assert!(
        o.stderr.contains(&format!("no process \"{shell}\"")),
        "{o:?}"
    );
    assert_no_panic(&d);
}
