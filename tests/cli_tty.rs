//! execctl and terminals (PROTOCOL 12.4): signals passed on to the command as a shell
//! passes them, the hint when an interactive program gets no terminal, `run -t`/`exec -t`
//! driven through a pseudo-terminal the test opens (keys, Ctrl-C, resizes, the terminal's
//! modes on every way out), detaching and `attach`.

use std::io::Write;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::util::cli::*;
use crate::util::*;

/// A Python script that cleans up on Ctrl-C.
const CLEANUP: &str = "import time\n\
try:\n    print('ready', flush=True)\n    time.sleep(30)\n\
except KeyboardInterrupt:\n    print('cleanup', flush=True)\n";

#[test]
fn sigint_reaches_a_python_scripts_keyboard_interrupt_handler() {
    if !have(&["python3"]) {
        return;
    }
    let d = Daemon::start(&[]);
    let line = format!("python3 -u -c \"{CLEANUP}\"");
    for args in [
        vec!["run", "--", "python3", "-u", "-c", CLEANUP],
        vec!["exec", &line],
    ] {
        let (mut ctl, rx) = spawn_lines(&mut command(Some(&d.socket), &args));
        assert_eq!(next_line(&rx), "ready", "{args:?}");
        unsafe_kill(ctl.pid(), libc::SIGINT);
        assert_eq!(next_line(&rx), "cleanup", "{args:?}");
        // The script handled it and exited 0: execctl passes its status on.
        assert_eq!(ctl.wait().code(), Some(0), "{args:?}");
    }
}

/// What a child writes to a pipe, gathered as it comes.
fn gather(r: impl std::io::Read + Send + 'static) -> Arc<Mutex<String>> {
    let text = Arc::new(Mutex::new(String::new()));
    let t = text.clone();
    std::thread::spawn(move || {
        let mut r = r;
        let mut buf = [0u8; 4096];
        while let Ok(n) = r.read(&mut buf) {
            if n == 0 {
                break;
            }
            let s = String::from_utf8_lossy(&buf[..n]).into_owned();
            t.lock().unwrap_or_else(|p| p.into_inner()).push_str(&s);
        }
    });
    text
}

#[track_caller]
fn wait_text(text: &Mutex<String>, needle: &str) {
    wait_until(&format!("{needle:?} in execctl's output"), || {
        text.lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains(needle)
    });
}

#[test]
fn a_repl_survives_ctrl_c() {
    if !have(&["python3"]) {
        return;
    }
    let d = Daemon::start(&[]);
    let mut cmd = command(Some(&d.socket), &["run", "-i", "--", "python3", "-i"]);
    cmd.stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    let mut ctl = Ctl {
        child: cmd.spawn().expect("spawn execctl"),
    };
    let mut stdin = ctl.child.stdin.take().expect("stdin");
    let out = gather(ctl.child.stdout.take().expect("stdout"));
    stdin.write_all(b"print('up')\n").expect("write");
    wait_text(&out, "up\n");
    unsafe_kill(ctl.pid(), libc::SIGINT);
    wait_text(&out, "KeyboardInterrupt");
    // Past the grace of the first Ctrl-C: the REPL goes on.
    std::thread::sleep(Duration::from_millis(1500));
    stdin.write_all(b"print(6 * 7)\n").expect("write");
    wait_text(&out, "42\n");
    drop(stdin);
    assert_eq!(ctl.wait().code(), Some(0));
}

#[test]
fn a_second_ctrl_c_within_the_grace_kills_a_command_that_ignores_the_first() {
    let d = Daemon::start(&[]);
    let (mut ctl, rx) = spawn_lines(&mut command(
        Some(&d.socket),
        &[
            "run",
            "--",
            "sh",
            "-c",
            "trap '' INT; echo $$; exec sleep 30",
        ],
    ));
    let pid: i32 = next_line(&rx).trim().parse().expect("pid");
    unsafe_kill(ctl.pid(), libc::SIGINT);
    // The daemon's grace is 1s here; the first Ctrl-C is over after it.
    std::thread::sleep(Duration::from_millis(1500));
    assert!(ctl.child.try_wait().expect("try_wait").is_none());
    assert!(pid_alive(pid), "one ignored Ctrl-C ends nothing");
    unsafe_kill(ctl.pid(), libc::SIGINT);
    std::thread::sleep(Duration::from_millis(200));
    unsafe_kill(ctl.pid(), libc::SIGINT);
    assert_eq!(ctl.wait().code(), Some(137), "SIGKILL ended it");
    wait_until("the command is gone", || !pid_alive(pid));
}

const HINT: &str = "has no terminal";

/// A command without a terminal, run from one, is named once, and only when it waits for
/// input (PROTOCOL 12.3's `Input` event): a command that never reads says nothing.
#[test]
fn a_command_without_a_terminal_is_named_once_when_it_waits_for_input() {
    let d = Daemon::start(&[]);
    for args in [vec!["run", "--", "echo", "hi"], vec!["exec", "echo hi"]] {
        let mut t = OnTty::spawn(&d.socket, &args, (24, 80));
        let (code, screen) = t.wait();
        assert_eq!(code, Some(0), "{args:?}");
        assert!(screen.contains("hi"), "{args:?}: {screen:?}");
        assert!(
            !screen.contains(HINT),
            "it never waited: {args:?}: {screen:?}"
        );
    }
    let reader = "read x; echo got $x; read y; echo got $y";
    let held = "waits for input and has no terminal (stdin is held open, empty; -i sends it \
                what you type); use -t for an interactive program";
    let piped = "waits for input and has no terminal (stdin is a pipe from execctl); use -t \
                 for an interactive program";
    for (args, want, typed) in [
        (
            vec!["run", "--", "sh", "-c", reader],
            format!("execctl: sh {held}"),
            false,
        ),
        (vec!["exec", reader], format!("execctl: read {held}"), false),
        (
            vec!["run", "-i", "--", "sh", "-c", reader],
            format!("execctl: sh {piped}"),
            true,
        ),
    ] {
        let mut t = OnTty::spawn(&d.socket, &args, (24, 80));
        t.screen.wait_for(HINT, 1);
        if typed {
            // What is typed reaches it; it waits twice, and is named once.
            t.type_keys(b"one\n");
            t.screen.wait_for("got one", 1);
            t.type_keys(b"two\n");
            let (code, screen) = t.wait();
            assert_eq!(code, Some(0), "{args:?}: {screen:?}");
            assert!(screen.contains("got two"), "{args:?}: {screen:?}");
            assert_eq!(screen.matches(HINT).count(), 1, "{args:?}: {screen:?}");
            assert!(screen.contains(&want), "{args:?}: {screen:?}");
        } else {
            // Nothing reaches it: Ctrl-C (the terminal is cooked) ends it.
            t.type_keys(b"\x03");
            let (code, screen) = t.wait();
            assert_eq!(code, Some(130), "{args:?}: {screen:?}");
            assert_eq!(screen.matches(HINT).count(), 1, "{args:?}: {screen:?}");
            assert!(screen.contains(&want), "{args:?}: {screen:?}");
        }
    }
    // Not when stdout is not a terminal, nor for a detached command.
    let (_master, slave) = open_pty();
    let mut cmd = command(Some(&d.socket), &["run", "--", "echo", "hi"]);
    cmd.stdin(Stdio::from(slave));
    let o = run_cmd(cmd);
    assert_eq!(
        (o.code, o.stdout.as_str(), o.stderr.as_str()),
        (Some(0), "hi\n", "")
    );
    let mut t = OnTty::spawn(&d.socket, &["run", "-d", "--", "true"], (24, 80));
    let (code, screen) = t.wait();
    assert_eq!(code, Some(0));
    assert!(!screen.contains(HINT), "{screen:?}");
}

#[test]
fn tty_needs_a_terminal_and_keys_docker_can_read() {
    let d = Daemon::start(&[]);
    for args in [
        vec!["run", "-t", "--", "true"],
        vec!["exec", "-t", "true"],
        vec!["attach", "term_1"],
    ] {
        let o = ctl_code(&d, &args, 125);
        assert!(o.stderr.contains("needs a terminal"), "{args:?}: {o:?}");
    }
    for args in [
        vec!["run", "-t", "--detach-keys", "ctrl-1", "--", "true"],
        vec!["run", "--detach-keys", "ctrl-p", "--", "true"],
        vec!["attach", "--detach-keys", "xy", "term_1"],
    ] {
        let o = ctl_code(&d, &args, 125);
        assert!(o.stderr.contains("--detach-keys"), "{args:?}: {o:?}");
    }
}

#[test]
fn attach_to_a_command_without_a_terminal_says_so() {
    let d = Daemon::start(&[]);
    let id = exec_detached(&d, "sleep 30");
    let mut t = OnTty::spawn(&d.socket, &["attach", &id], (24, 80));
    let (code, screen) = t.wait();
    assert_eq!(code, Some(125), "{screen:?}");
    assert!(
        screen.contains(&format!("execctl: {id} has no terminal")),
        "{screen:?}"
    );
    let modes = t.modes();
    assert!(modes.3 & libc::ECHO != 0, "the terminal was left cooked");
    ctl_code(&d, &["kill", &id], 0);
}

// ---- run -t, exec -t, attach -------------------------------------------------------------

/// The terminal `execctl run` (pid `ctl`) made, as `terminal/list` shows it.
#[track_caller]
fn terminal_of(d: &Daemon, ctl: i32) -> Value {
    let session = format!("execctl-{ctl}");
    let mut c = d.client();
    let mut found = Value::Null;
    wait_until(&format!("a terminal in session {session}"), || {
        found = terminals(&mut c)
            .into_iter()
            .find(|t| t["sessionId"] == session.as_str())
            .unwrap_or(Value::Null);
        !found.is_null()
    });
    found
}

/// The id in execctl's line `detached from ID (execctl attach ID)`.
#[track_caller]
fn detached_id(screen: &str) -> String {
    let rest = screen
        .split("detached from ")
        .nth(1)
        .unwrap_or_else(|| panic!("no detach line: {screen:?}"));
    let id = rest.split_whitespace().next().expect("id").to_string();
    assert!(
        rest.starts_with(&format!("{id} (execctl attach {id})")),
        "{screen:?}"
    );
    id
}

#[test]
fn run_t_is_an_interactive_session() {
    let d = Daemon::start(&[]);
    let mut t = OnTty::spawn(&d.socket, &["run", "-t", "--", "sh"], (24, 80));
    t.wait_raw();
    t.type_keys(b"echo hi$((1+1)); tty\r");
    t.screen.wait_for("hi2", 1);
    // The command's own terminal is a PTY of the daemon, not execctl's.
    t.screen.wait_for("/dev/pts/", 1);
    t.type_keys(b"exit\r");
    let screen = t.exits(0);
    assert!(!screen.contains(HINT), "{screen:?}");
    // exec -t: a shell line on a terminal, reading a line typed on it.
    let mut t = OnTty::spawn(
        &d.socket,
        &["exec", "-t", "read -r x; echo \"got $x\"; exit 4"],
        (24, 80),
    );
    t.wait_raw();
    t.type_keys(b"abc\r");
    t.screen.wait_for("got abc", 1);
    t.exits(4);
}

#[test]
fn a_paste_larger_than_the_daemons_input_buffer_arrives_whole() {
    let d = Daemon::start(&["--stdin-buffer", "4K"]);
    let mut t = OnTty::spawn(
        &d.socket,
        &[
            "run",
            "-t",
            // Every byte value is typed: Ctrl-P Ctrl-Q too, which must not detach.
            "--detach-keys",
            "",
            "--",
            "sh",
            "-c",
            "stty raw -echo; echo ready; head -c 20000 | wc -c",
        ],
        (24, 80),
    );
    t.wait_raw();
    t.screen.wait_for("ready", 1);
    t.type_keys(&random_bytes(20000, 7));
    t.screen.wait_for("20000", 1);
    t.exits(0);
}

#[test]
fn ctrl_c_is_a_key_for_the_program_and_ends_sleep_with_130() {
    let d = Daemon::start(&[]);
    let mut t = OnTty::spawn(&d.socket, &["run", "-t", "--", "sleep", "30"], (24, 80));
    t.wait_raw();
    let pid = terminal_of(&d, t.ctl.pid())["pid"].as_i64().expect("pid") as i32;
    wait_until("sleep runs", || group_runs(pid, "sleep"));
    t.type_keys(b"\x03");
    t.exits(130);
    wait_until("sleep is gone", || !pid_alive(pid));
}

#[test]
fn a_resize_of_execctls_terminal_reaches_the_program() {
    let d = Daemon::start(&[]);
    let mut t = OnTty::spawn(&d.socket, &["run", "-t", "--", "sh"], (24, 80));
    t.wait_raw();
    t.type_keys(b"stty size\r");
    t.screen.wait_for("24 80", 1);
    let id = terminal_of(&d, t.ctl.pid())["terminalId"]
        .as_str()
        .expect("id")
        .to_string();
    // The kernel sends SIGWINCH to execctl, the foreground group of its terminal.
    set_window_size(&t.master, 30, 100);
    let mut c = d.client();
    wait_until("the PTY resized", || {
        terminal_entry(&mut c, &id)["_meta"]["execd"]["tty"] == json!({"rows": 30, "cols": 100})
    });
    t.type_keys(b"stty size\r");
    t.screen.wait_for("30 100", 1);
    t.type_keys(b"exit\r");
    t.exits(0);
}

#[test]
fn the_terminal_comes_back_as_it_was_after_every_way_out() {
    let d = Daemon::start(&[]);
    // SIGTERM, SIGHUP and SIGINT from elsewhere: passed on to the command (143, 129, 130).
    for (sig, code) in [
        (libc::SIGTERM, 143),
        (libc::SIGHUP, 129),
        (libc::SIGINT, 130),
    ] {
        let mut t = OnTty::spawn(&d.socket, &["run", "-t", "--", "sleep", "30"], (24, 80));
        t.wait_raw();
        let pid = terminal_of(&d, t.ctl.pid())["pid"].as_i64().expect("pid") as i32;
        wait_until("sleep runs", || group_runs(pid, "sleep"));
        unsafe_kill(t.ctl.pid(), sig);
        t.exits(code);
        wait_until("sleep is gone", || !pid_alive(pid));
    }
    // An error: the command cannot be started (127), after nothing went raw.
    let mut t = OnTty::spawn(&d.socket, &["run", "-t", "--", "nosuchcmd-tty"], (24, 80));
    let screen = t.exits(127);
    assert!(
        screen.contains("nosuchcmd-tty: command not found"),
        "{screen:?}"
    );
    // The daemon gone from under it: 125, one line saying so.
    let mut d2 = Daemon::start(&[]);
    let mut t = OnTty::spawn(&d2.socket, &["run", "-t", "--", "sleep", "30"], (24, 80));
    t.wait_raw();
    let pid = terminal_of(&d2, t.ctl.pid())["pid"].as_i64().expect("pid") as i32;
    let mut daemon = d2.child.take().expect("daemon");
    daemon.kill().expect("kill execd");
    daemon.wait().expect("reap execd");
    let screen = t.exits(125);
    assert!(screen.contains("execd closed the connection"), "{screen:?}");
    unsafe_kill(pid, libc::SIGKILL);
}

/// A SIGINT from elsewhere reaches the program and the session goes on, keys included.
#[test]
fn a_sigint_sent_to_run_t_reaches_the_program_and_the_session_goes_on() {
    if !have(&["python3"]) {
        return;
    }
    let d = Daemon::start(&[]);
    let mut t = OnTty::spawn(&d.socket, &["run", "-t", "--", "python3", "-q"], (24, 80));
    t.wait_raw();
    t.screen.wait_for(">>> ", 1);
    unsafe_kill(t.ctl.pid(), libc::SIGINT);
    t.screen.wait_for("KeyboardInterrupt", 1);
    t.wait_raw();
    t.type_keys(b"print(6 * 7)\r");
    t.screen.wait_for("42", 1);
    t.type_keys(b"exit()\r");
    t.exits(0);
}

#[test]
fn detach_leaves_the_command_running_and_attach_brings_it_back() {
    let d = Daemon::start(&[]);
    let mut c = d.client();
    let mut t = OnTty::spawn(&d.socket, &["run", "-t", "--", "sh"], (24, 80));
    t.wait_raw();
    t.type_keys(b"echo one$((0+1))\r");
    t.screen.wait_for("one1", 1);
    // Ctrl-P alone is held, then sent with the key after it.
    t.type_keys(b"\x10");
    t.type_keys(b"\x11");
    let screen = t.exits(0);
    let id = detached_id(&screen);
    assert!(id.starts_with("term_"), "{id}");
    let entry = terminal_entry(&mut c, &id);
    assert!(entry["exitStatus"].is_null(), "still running: {entry}");
    // attach: the screen first (on a terminal of another size), then it works as before.
    let mut a = OnTty::spawn(&d.socket, &["attach", &id], (30, 100));
    a.wait_raw();
    a.screen.wait_for("one1", 1);
    a.type_keys(b"echo two$((1+1)); stty size\r");
    a.screen.wait_for("two2", 1);
    a.screen.wait_for("30 100", 1);
    // Detach again with other keys, then come back and end it.
    a.type_keys(b"\x10\x11");
    assert_eq!(detached_id(&a.exits(0)), id);
    let mut a = OnTty::spawn(
        &d.socket,
        &["attach", "--detach-keys", "ctrl-x,x", &id],
        (24, 80),
    );
    a.wait_raw();
    a.screen.wait_for("two2", 1);
    // Ctrl-P Ctrl-Q are keys like others now: they reach the shell's line (Ctrl-U
    // erases it there).
    a.type_keys(b"\x10\x11\x15\x18x");
    assert_eq!(detached_id(&a.exits(0)), id);
    let mut a = OnTty::spawn(&d.socket, &["attach", &id], (24, 80));
    a.wait_raw();
    a.screen.wait_for("two2", 1);
    a.type_keys(b"exit 5\r");
    a.exits(5);
    // A bash command started with exec -t, by its id.
    let mut t = OnTty::spawn(&d.socket, &["exec", "-t", "sh"], (24, 80));
    t.wait_raw();
    t.type_keys(b"echo three$((1+2))\r");
    t.screen.wait_for("three3", 1);
    t.type_keys(b"\x10\x11");
    let id = detached_id(&t.exits(0));
    assert!(id.starts_with("cmd_"), "{id}");
    let mut a = OnTty::spawn(&d.socket, &["attach", &id], (24, 80));
    a.wait_raw();
    a.screen.wait_for("three3", 1);
    a.type_keys(b"exit 6\r");
    a.exits(6);
}

/// A detach turns off the terminal modes the program turned on (what execctl forwarded,
/// and the alternate screen an attach painted), and never with a full reset, which would
/// clear the user's scrollback.
#[test]
fn a_detach_turns_off_the_modes_the_program_turned_on() {
    let d = Daemon::start(&[]);
    // What vi does: the alternate screen, mouse reporting, keypad mode, bracketed paste,
    // a hidden cursor.
    let program = "printf '\\033[?1049h\\033[?1000h\\033[?1006h\\033=\\033[?2004h\\033[?25l'; \
                   echo ready; exec sleep 30";
    let mut t = OnTty::spawn(
        &d.socket,
        &["run", "-t", "--", "sh", "-c", program],
        (24, 80),
    );
    t.wait_raw();
    t.screen.wait_for("ready", 1);
    t.type_keys(b"\x10\x11");
    let screen = t.exits(0);
    let id = detached_id(&screen);
    let after = screen.rsplit("ready").next().expect("after ready");
    let reset = "\x1b[?1000l\x1b[?1006l\x1b[?2004l\x1b>\x1b[?25h\x1b[?1049l";
    assert!(after.contains(reset), "{after:?}");
    assert!(!screen.contains("\x1bc"), "no full reset: {screen:?}");
    // attach paints the program's screen on the alternate screen; the detach leaves it.
    let mut a = OnTty::spawn(&d.socket, &["attach", &id], (24, 80));
    a.wait_raw();
    a.screen.wait_for("ready", 1);
    a.type_keys(b"\x10\x11");
    let screen = a.exits(0);
    let after = screen.rsplit("ready").next().expect("after ready");
    assert!(after.contains("\x1b[?1049l"), "{after:?}");
    ctl_code(&d, &["kill", &id], 0);
    // A program that turned nothing on gets nothing.
    let mut t = OnTty::spawn(
        &d.socket,
        &["run", "-t", "--", "sh", "-c", "echo ready; exec sleep 30"],
        (24, 80),
    );
    t.wait_raw();
    t.screen.wait_for("ready", 1);
    t.type_keys(b"\x10\x11");
    let screen = t.exits(0);
    let id = detached_id(&screen);
    let after = screen.rsplit("ready").next().expect("after ready");
    assert!(!after.contains("\x1b["), "{after:?}");
    ctl_code(&d, &["kill", &id], 0);
}

/// A -t command is not tied to execctl's connection: an execctl killed with SIGKILL (no
/// way out it can see; the terminal stays raw, as with any program) leaves it running for
/// attach, as a detach does.
#[test]
fn a_t_command_outlives_an_execctl_killed_with_sigkill() {
    let d = Daemon::start(&[]);
    let mut t = OnTty::spawn(&d.socket, &["run", "-t", "--", "sh"], (24, 80));
    t.wait_raw();
    let id = terminal_of(&d, t.ctl.pid())["terminalId"]
        .as_str()
        .expect("id")
        .to_string();
    t.type_keys(b"echo four$((2+2))\r");
    t.screen.wait_for("four4", 1);
    unsafe_kill(t.ctl.pid(), libc::SIGKILL);
    assert_eq!(t.wait().0, None, "killed");
    // The daemon saw the connection close and kept the command.
    std::thread::sleep(Duration::from_millis(300));
    let mut c = d.client();
    assert!(
        terminal_entry(&mut c, &id)["exitStatus"].is_null(),
        "still running"
    );
    let mut a = OnTty::spawn(&d.socket, &["attach", &id], (24, 80));
    a.wait_raw();
    a.screen.wait_for("four4", 1);
    a.type_keys(b"exit 7\r");
    a.exits(7);
}

/// What a terminal of `ROWS` x 80 shows after `raw`, row by row (vt100, the emulator the
/// daemon's screens use).
fn shown_lines(raw: &str) -> Vec<String> {
    let mut p = vt100::Parser::new(ROWS, 80, 0);
    p.process(raw.as_bytes());
    p.screen()
        .contents()
        .split('\n')
        .map(String::from)
        .collect()
}

/// Rows of the README session's terminals: room for all it prints, so nothing scrolls.
const ROWS: u16 = 60;

/// The README's terminal session (the block that starts `$ execctl run -t -- python3 -q`),
/// typed as a person would: each `$ execctl ...` on a fresh terminal, `>>> TEXT` typed at
/// the prompt, `^C` (a line's start) and `^P^Q` as those keys, `...` for any lines, every other line seen
/// whole on the screen in order, and `$ echo $?` the last execctl's status. The README's
/// ids stand for the ones this daemon gives.
#[test]
fn the_readmes_terminal_session_runs_as_written() {
    if !have(&["python3"]) {
        return;
    }
    let d = Daemon::start(&[]);
    let block = crate::readme::block("$ execctl run -t -- python3 -q");
    let mut ids: Vec<(String, String)> = Vec::new();
    let mut t: Option<OnTty> = None;
    // Lines of the current terminal already matched.
    let mut seen = 0;
    let mut status: Option<i32> = None;
    let mut lines = block.lines();
    while let Some(line) = lines.next() {
        let mut line = line.to_string();
        for (readme, real) in &ids {
            line = line.replace(readme.as_str(), real);
        }
        if line == "$ echo $?" {
            let mut prev = t.take().expect("a command before echo $?");
            let code = prev.wait().0;
            assert_eq!(prev.modes(), prev.before, "modes after {line}");
            status = code;
            let want = lines.next().expect("a status after echo $?");
            assert_eq!(status.map(|c| c.to_string()).as_deref(), Some(want));
            continue;
        }
        if let Some(command) = line.strip_prefix("$ execctl ") {
            if let Some(mut prev) = t.take() {
                status = prev.wait().0;
                assert_eq!(prev.modes(), prev.before, "modes before {line}");
            }
            let args: Vec<&str> = command.split_whitespace().collect();
            let tty = OnTty::spawn(&d.socket, &args, (ROWS, 80));
            tty.wait_raw();
            t = Some(tty);
            seen = 0;
            continue;
        }
        let tty = t
            .as_mut()
            .unwrap_or_else(|| panic!("{line:?} before a command"));
        let find = |tty: &OnTty, from: usize, what: &str, ok: &dyn Fn(&str) -> bool| {
            let mut at = 0;
            wait_until(&format!("{what} on the terminal"), || {
                let shown = shown_lines(&tty.screen.text());
                match shown.iter().skip(from).position(|l| ok(l)) {
                    Some(i) => {
                        at = from + i;
                        true
                    }
                    None => false,
                }
            });
            at
        };
        if line == "..." {
            continue;
        }
        if line.starts_with("^C") {
            // The line before started the program Ctrl-C interrupts: let it run. The
            // terminal echoes ^C, and what the program prints follows on that line.
            std::thread::sleep(Duration::from_millis(300));
            tty.type_keys(b"\x03");
        }
        if let Some(typed) = line.strip_prefix(">>> ") {
            let prompt = find(tty, seen, "a prompt", &|l| l.starts_with(">>>"));
            if typed == "^P^Q" {
                tty.type_keys(b"\x10\x11");
                seen = prompt;
                continue;
            }
            tty.type_keys(format!("{typed}\r").as_bytes());
            let want = format!(">>> {typed}");
            seen = find(tty, prompt, &want, &|l| l == want) + 1;
            continue;
        }
        if let Some(readme_id) = line
            .strip_prefix("detached from ")
            .and_then(|r| r.split_whitespace().next())
            .filter(|id| !ids.iter().any(|(_, real)| real == id))
        {
            seen = find(tty, seen, "the detach line", &|l| {
                l.starts_with("detached from ")
            });
            let real = detached_id(&shown_lines(&tty.screen.text())[seen]);
            ids.push((readme_id.to_string(), real));
            seen += 1;
            continue;
        }
        seen = find(tty, seen, &line, &|l| l == line) + 1;
    }
    assert!(t.is_none(), "the session ends with echo $?");
    assert_eq!(status, Some(0));
}
