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

#[test]
fn a_command_without_a_terminal_is_named_once_when_execctl_sits_on_one() {
    let d = Daemon::start(&[]);
    for (args, want) in [
        (
            vec!["run", "--", "echo", "hi"],
            "execctl: echo has no terminal (stdin is empty); use -t for an interactive program",
        ),
        (
            vec!["exec", "echo hi"],
            "execctl: echo has no terminal (stdin is empty); use -t for an interactive program",
        ),
        (
            vec!["run", "-i", "--", "echo", "hi"],
            "execctl: echo has no terminal (stdin is a pipe from execctl); use -t for an interactive program",
        ),
    ] {
        let mut t = OnTty::spawn(&d.socket, &args, (24, 80));
        let (code, _) = t.wait();
        assert_eq!(code, Some(0), "{args:?}");
        let screen = t.screen.wait_for("hi", 1);
        assert_eq!(screen.matches(HINT).count(), 1, "{args:?}: {screen:?}");
        assert!(screen.contains(want), "{args:?}: {screen:?}");
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
