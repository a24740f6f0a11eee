//! `execctl shell` on a terminal (issue 22): driven through a pseudo-terminal the test
//! opens, as a person types: lines at the prompt through `shell/exec` and the gate, keys
//! byte for byte to a running program (Ctrl-C, raw-mode programs), resizes, and the
//! terminal's modes on every way out.

use std::time::Duration;

use crate::util::cli::*;
use crate::util::*;

/// What the session's shell writes after each prompt (the marker its PS1 ends with,
/// passed to execctl's terminal with the rest of the raw bytes).
const PROMPT: &str = "\x1b]6973;p;";

/// `execctl shell ID` on a terminal of its own.
struct ShellTty {
    t: OnTty,
    sid: String,
    /// Prompts seen so far.
    prompts: usize,
}

impl ShellTty {
    /// Opens session `sid` (made in `/tmp` if new) on a `size` terminal; waits for its
    /// first prompt.
    #[track_caller]
    fn open(d: &Daemon, sid: &str, size: (u16, u16)) -> ShellTty {
        let t = OnTty::spawn(&d.socket, &["shell", sid, "--cwd", "/tmp"], size);
        t.wait_raw();
        let mut s = ShellTty {
            t,
            sid: sid.to_string(),
            prompts: 0,
        };
        s.prompted();
        s
    }

    /// Waits for the next prompt; returns what the screen shows since the one before,
    /// without the session's markers.
    #[track_caller]
    fn prompted(&mut self) -> String {
        self.prompts += 1;
        let screen = self.t.screen.wait_for(PROMPT, self.prompts);
        let part = screen
            .split(PROMPT)
            .nth(self.prompts - 1)
            .unwrap_or_default();
        // The first part of one after a prompt is the rest of that prompt's marker.
        let part = match self.prompts {
            1 => part,
            _ => part.split_once('\x07').map_or(part, |(_, rest)| rest),
        };
        without_markers(part)
    }

    /// Waits until the screen shows `needle` after its first `from` bytes.
    #[track_caller]
    fn wait_after(&self, from: usize, needle: &str) -> String {
        let mut text = String::new();
        wait_until(&format!("{needle:?} on the terminal"), || {
            text = self
                .t
                .screen
                .text()
                .get(from..)
                .unwrap_or_default()
                .to_string();
            text.contains(needle)
        });
        text
    }

    /// Types `line` and Enter at the prompt and waits for the next one: what the terminal
    /// showed in between (the line's echo, its output, the prompt).
    #[track_caller]
    fn line(&mut self, line: &str) -> String {
        self.t.type_keys(format!("{line}\r").as_bytes());
        self.prompted()
    }

    /// The session as `shell/view` shows it.
    fn view(&self, c: &mut Client) -> Value {
        ok(c, "shell/view", json!({"id": self.sid}))
    }

    /// The pid of the session's shell (its terminal session's leader).
    fn shell_pid(&self, c: &mut Client) -> i32 {
        let l = ok(c, "shell/sessions", json!({}));
        l["sessions"][&self.sid]["pid"].as_i64().expect("pid") as i32
    }

    /// Waits until `comm` runs as the session's command.
    #[track_caller]
    fn wait_runs(&self, c: &mut Client, comm: &str) {
        let pid = self.shell_pid(c);
        wait_until(&format!("{comm} runs in the session"), || {
            session_runs(pid, comm)
        });
    }
}

/// `text` without the OSC sequences (`ESC ] ... BEL`) the session's shell prints.
fn without_markers(text: &str) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(at) = rest.find("\x1b]") {
        out.push_str(&rest[..at]);
        rest = rest[at..].split_once('\x07').map_or("", |(_, r)| r);
    }
    out.push_str(rest);
    out
}

/// Whether `text` ends with the session's prompt in `/tmp` (`$`, or `#` for root).
fn ends_at_prompt(text: &str) -> bool {
    text.ends_with(":/tmp$ ") || text.ends_with(":/tmp# ")
}

#[test]
fn lines_run_in_one_shell_whose_state_persists() {
    let d = Daemon::start(&[]);
    let mut s = ShellTty::open(&d, "persist", (24, 80));
    s.line("cd /");
    let out = s.line("cd /tmp");
    assert!(out.starts_with("cd /tmp\r\n"), "the line's echo: {out:?}");
    let out = s.line("pwd");
    assert!(out.contains("pwd\r\n/tmp\r\n"), "{out:?}");
    s.line("export X=1");
    let out = s.line("echo $X");
    assert!(out.contains("echo $X\r\n1\r\n"), "{out:?}");
    s.line("false");
    let out = s.line("echo $?");
    assert!(out.contains("echo $?\r\n1\r\n"), "{out:?}");
    // The prompt is the shell's own, directory and all.
    assert!(ends_at_prompt(&out), "{out:?}");
    // An empty line shows the prompt again; the line editor's keys work.
    let from = s.t.screen.text().len();
    s.t.type_keys(b"\r");
    s.wait_after(from, "\r\n");
    wait_until("the prompt again", || ends_at_prompt(&s.t.screen.text()));
    let out = s.line("echo nope\x15echo yes\x7f\x7f\x7fyes");
    assert!(out.contains("\r\nyes\r\n"), "{out:?}");
    let mut c = d.client();
    assert_eq!(s.view(&mut c)["command"], "echo yes");
    // The daemon's editor for sessions: the cursor moves (Ctrl-A, Left), and Up brings
    // back a line sent before.
    let out = s.line(&format!("cho moved\x01e{}\x7fO", "\x1b[C".repeat(6)));
    assert!(out.contains("\r\nmOved\r\n"), "{out:?}");
    let out = s.line("\x1b[A");
    assert!(out.contains("\r\nmOved\r\n"), "{out:?}");
    assert_eq!(s.view(&mut c)["command"], "echo mOved");
    // Ctrl-D at the prompt leaves; the session stays.
    s.t.type_keys(b"\x04");
    s.t.exits(0);
    assert_eq!(s.view(&mut c)["working_dir"], "/tmp");
    assert_no_panic(&d);
}

#[test]
fn a_program_reading_a_line_gets_it_and_it_shows_once() {
    let d = Daemon::start(&[]);
    let mut s = ShellTty::open(&d, "read", (24, 80));
    s.t.type_keys(b"read x; echo got:$x\r");
    let mut c = d.client();
    s.t.screen.wait_for("read x; echo got:$x\r\n", 1);
    s.t.type_keys(b"hello\r");
    let out = s.prompted();
    // Echoed once (by the session's terminal), read once.
    assert_eq!(out.matches("hello").count(), 2, "{out:?}");
    assert_eq!(out.matches("got:hello").count(), 1, "{out:?}");
    assert!(out.contains("hello\r\ngot:hello\r\n"), "{out:?}");
    assert_eq!(s.view(&mut c)["exit_code"], 0);
    s.t.type_keys(b"\x04");
    s.t.exits(0);
}

#[test]
fn ctrl_c_interrupts_the_running_command_and_the_session_goes_on() {
    let d = Daemon::start(&[]);
    let mut s = ShellTty::open(&d, "intr", (24, 80));
    let mut c = d.client();
    s.t.type_keys(b"sleep 30\r");
    s.wait_runs(&mut c, "sleep");
    s.t.type_keys(b"\x03");
    s.prompted();
    let v = s.view(&mut c);
    assert_eq!(
        (v["command"].as_str(), v["exit_code"].as_i64()),
        (Some("sleep 30"), Some(130)),
        "{v}"
    );
    let pid = s.shell_pid(&mut c);
    assert!(!session_runs(pid, "sleep"));
    let out = s.line("echo $? still");
    assert!(out.contains("\r\n130 still\r\n"), "{out:?}");
    // Ctrl-C at the prompt drops the line and runs nothing.
    s.t.type_keys(b"echo dropped\x03");
    s.t.screen.wait_for("echo dropped^C\r\n", 1);
    let out = s.line("echo kept");
    assert!(out.contains("\r\nkept\r\n"), "{out:?}");
    assert!(!s.t.screen.text().contains("\r\ndropped"));
    s.t.type_keys(b"\x04");
    s.t.exits(0);
}

/// A paste far larger than the daemon's input buffer, into a program that does not read
/// it (`cat`, stopped, on a raw terminal, whose line discipline drops nothing): Ctrl-\
/// typed after it still leaves at once (keys are read as they come and sent by a thread
/// of their own), and so execctl never stops reading the terminal.
#[test]
fn ctrl_backslash_leaves_behind_a_paste_the_program_does_not_read() {
    let d = Daemon::start(&["--kill-grace", "300ms"]);
    let mut s = ShellTty::open(&d, "paste", (24, 80));
    let mut c = d.client();
    // cat under a shell of its own: its stop is not a stopped job for the session's
    // shell (which would take the terminal back at once), only a reader gone quiet.
    s.t.type_keys(b"sh -c 'stty raw -echo; cat; true'\r");
    s.wait_runs(&mut c, "cat");
    let shell = s.shell_pid(&mut c);
    let cats = in_session(shell, "cat");
    assert_eq!(cats.len(), 1, "{cats:?}");
    unsafe_kill(cats[0], libc::SIGSTOP);
    // 1 MiB of lines, then Ctrl-\, written by a thread: a terminal whose reader stops
    // reading blocks the writer.
    let mut master = s.t.master.try_clone().expect("dup");
    let typist = std::thread::spawn(move || {
        use std::io::Write;
        let line = [b'x'; 1023];
        for _ in 0..1024 {
            master.write_all(&line).expect("paste");
            master.write_all(b"\r").expect("paste");
        }
        master.write_all(b"\x1c").expect("Ctrl-\\");
    });
    let screen = s.t.exits(0);
    assert!(
        screen.contains("left shell session paste; it goes on"),
        "{:?}",
        &screen[screen.len().saturating_sub(300)..]
    );
    typist.join().expect("typist");
    // Ctrl-C behind such a paste drops what waits and interrupts the command (which,
    // stopped, is ended with its shell after the grace); the session's prompt comes back.
    let mut s = OnTty::spawn(&d.socket, &["shell", "paste"], (24, 80));
    s.wait_raw();
    s.screen.wait_for("runs in session paste", 1);
    let mut master = s.master.try_clone().expect("dup");
    let typist = std::thread::spawn(move || {
        use std::io::Write;
        master.write_all(&[b'y'; 1 << 20]).expect("paste");
        master.write_all(b"\x03").expect("Ctrl-C");
    });
    wait_until("the command is interrupted", || {
        ok(&mut c, "shell/view", json!({"id": "paste"}))["status"] != "running"
    });
    typist.join().expect("typist");
    s.screen.wait_for(PROMPT, 1);
    s.type_keys(b"\x04");
    s.exits(0);
    wait_until("cat is gone", || !pid_alive(cats[0]));
    ok(&mut c, "shell/sessions/close", json!({"id": "paste"}));
    assert_no_panic(&d);
}

#[test]
fn a_raw_mode_program_gets_each_key_as_typed() {
    if !have(&["python3"]) {
        return skip("python3 is not installed: no raw-mode program to run");
    }
    let d = Daemon::start(&[]);
    let mut s = ShellTty::open(&d, "raw", (24, 80));
    // The program puts the session's terminal in raw mode, reads one key, puts the
    // modes back and shows what it read.
    s.t.type_keys(
        b"python3 -c \"import sys,termios,tty; a=termios.tcgetattr(0); tty.setraw(0); \
print('ready', end='', flush=True); k=sys.stdin.read(1); \
termios.tcsetattr(0, termios.TCSADRAIN, a); print(' key', repr(k))\"\r",
    );
    s.t.screen.wait_for("ready", 2);
    // Ctrl-C is a key like any other for it: no SIGINT, no echo.
    s.t.type_keys(b"\x03");
    let out = s.prompted();
    assert!(out.contains("ready key '\\x03'\r\n"), "{out:?}");
    let mut c = d.client();
    assert_eq!(s.view(&mut c)["exit_code"], 0);
    let out = s.line("echo after");
    assert!(out.contains("\r\nafter\r\n"), "{out:?}");
    s.t.type_keys(b"\x04");
    s.t.exits(0);
}

#[test]
fn the_session_takes_the_terminals_size_and_follows_its_resizes() {
    let d = Daemon::start(&[]);
    let mut s = ShellTty::open(&d, "winch", (30, 90));
    let out = s.line("stty size");
    assert!(out.contains("\r\n30 90\r\n"), "{out:?}");
    // The kernel sends SIGWINCH to execctl, the foreground group of its terminal.
    set_window_size(&s.t.master, 40, 120);
    let mut c = d.client();
    wait_until("the session's terminal resized", || {
        ok(&mut c, "shell/sessions", json!({}))["sessions"]["winch"]["size"]
            == json!({"rows": 40, "cols": 120})
    });
    let out = s.line("stty size");
    assert!(out.contains("\r\n40 120\r\n"), "{out:?}");
    s.t.type_keys(b"\x04");
    s.t.exits(0);
}

#[test]
fn a_denied_line_is_refused_with_a_message_and_nothing_runs() {
    let dir = TempDir::new();
    let policy = dir.path().join("policy.json");
    std::fs::write(
        &policy,
        r#"{"rules": [{"name": "no-rm", "pattern": ["rm"], "decision": "deny",
             "justification": "nothing is removed here"}]}"#,
    )
    .expect("policy");
    let victim = dir.path().join("keep");
    std::fs::write(&victim, "x").expect("victim");
    let socket = dir.path().join("execd.sock");
    let d = Daemon::start_at(dir, socket, &["--policy", policy.to_str().expect("utf-8")]);
    let mut s = ShellTty::open(&d, "gate", (24, 80));
    let mut c = d.client();
    s.line("echo before");
    let from = s.t.screen.text().len();
    s.t.type_keys(format!("rm -f {}\r", victim.display()).as_bytes());
    let shown = s.wait_after(
        from,
        "execctl: denied by policy rule no-rm: nothing is removed here\r\n",
    );
    // The prompt again, and the session as it was.
    wait_until("the prompt again", || ends_at_prompt(&s.t.screen.text()));
    assert!(shown.starts_with("rm -f "), "{shown:?}");
    assert!(victim.exists());
    assert_eq!(s.view(&mut c)["command"], "echo before");
    let out = s.line("echo after");
    assert!(out.contains("\r\nafter\r\n"), "{out:?}");
    s.t.type_keys(b"\x04");
    s.t.exits(0);
    assert!(victim.exists());
}

#[test]
fn the_terminal_comes_back_as_it_was_and_the_session_goes_on_after_every_way_out() {
    let d = Daemon::start(&[]);
    let mut c = d.client();
    // SIGTERM and SIGHUP while a command runs: it goes on.
    for (sig, code) in [(libc::SIGTERM, 143), (libc::SIGHUP, 129)] {
        let sid = format!("out{sig}");
        let mut s = ShellTty::open(&d, &sid, (24, 80));
        s.t.type_keys(b"sleep 30\r");
        s.wait_runs(&mut c, "sleep");
        unsafe_kill(s.t.ctl.pid(), sig);
        let screen = s.t.exits(code);
        assert!(
            screen.contains(&format!("left shell session {sid}; it goes on")),
            "{screen:?}"
        );
        assert_eq!(s.view(&mut c)["status"], "running");
        ok(&mut c, "shell/kill", json!({"id": sid}));
    }
    // Ctrl-\ while a command runs leaves it running; execctl shell comes back to it.
    let mut s = ShellTty::open(&d, "back", (24, 80));
    s.t.type_keys(b"sleep 30\r");
    s.wait_runs(&mut c, "sleep");
    s.t.type_keys(b"\x1c");
    s.t.exits(0);
    assert_eq!(s.view(&mut c)["status"], "running");
    let mut s = OnTty::spawn(&d.socket, &["shell", "back"], (24, 80));
    s.wait_raw();
    s.screen.wait_for("\"sleep 30\" runs in session back", 1);
    s.type_keys(b"\x03");
    s.screen.wait_for(PROMPT, 1);
    s.type_keys(b"echo back\r");
    s.screen.wait_for(PROMPT, 2);
    let shown = without_markers(&s.screen.text());
    assert!(shown.contains("echo back\r\nback\r\n"), "{shown:?}");
    s.type_keys(b"\x04");
    s.exits(0);
    // The daemon gone from under it: 125, one line saying so.
    let mut d2 = Daemon::start(&[]);
    let mut s = ShellTty::open(&d2, "gone", (24, 80));
    let mut c2 = d2.client();
    let shell = s.shell_pid(&mut c2);
    let mut daemon = d2.child.take().expect("daemon");
    daemon.kill().expect("kill execd");
    daemon.wait().expect("reap execd");
    let screen = s.t.exits(125);
    assert!(screen.contains("execd closed the connection"), "{screen:?}");
    unsafe_kill(shell, libc::SIGKILL);
    // The session closed from elsewhere: execctl says so and leaves.
    let mut s = ShellTty::open(&d, "closed", (24, 80));
    ok(&mut c, "shell/sessions/close", json!({"id": "closed"}));
    let screen = s.t.exits(0);
    assert!(
        screen.contains("shell session closed was closed"),
        "{screen:?}"
    );
    // A shell that dies (exit typed) is followed to the next one.
    let mut s = ShellTty::open(&d, "again", (24, 80));
    s.t.type_keys(b"exit\r");
    s.prompted();
    let out = s.line("echo $((6 * 7))");
    assert!(out.contains("\r\n42\r\n"), "{out:?}");
    s.t.type_keys(b"\x04");
    s.t.exits(0);
    std::thread::sleep(Duration::from_millis(50));
    assert_no_panic(&d);
}
