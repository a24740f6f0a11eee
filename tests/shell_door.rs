//! The shell door shut (issue 28, PROTOCOL.md 7.2 and 12.2): what a shell session's lines
//! could do to the shell that runs them, through `shell/*` over JSON-RPC and `/v1/shell/*`
//! over HTTP. The policy denies `rm`; every attack would delete the victim directory,
//! which must survive. Under `STRICT` (unparsed lines asked, nobody to ask) the attacks
//! are refused at the gate; under `LENIENT` (unparsed lines allowed) they run, and the
//! shell itself must hold: its command channel takes no line from a program, its helper
//! takes no orders from a variable, its prompts run nothing a line put there.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use crate::util::*;

/// Unparsed lines are asked (and nobody approves): the gate refuses them.
const STRICT: &str = r#"{"default": "allow", "unparsed": "ask", "rules": [
    {"name": "no-rm", "pattern": ["rm"], "decision": "deny", "justification": "keeps files"}
]}"#;
/// Unparsed lines run: what holds is the shell.
const LENIENT: &str = r#"{"default": "allow", "unparsed": "allow", "rules": [
    {"name": "no-rm", "pattern": ["rm"], "decision": "deny", "justification": "keeps files"}
]}"#;

/// A front door of `exec`.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Via {
    Rpc,
    Http,
}

const BOTH: [Via; 2] = [Via::Rpc, Via::Http];

/// A daemon with a policy, a working directory holding a victim, and an audit file.
struct Door {
    d: Daemon,
    /// The directory sessions start in (`--workdir`), where relative paths land.
    work: PathBuf,
    victim: PathBuf,
    audit: PathBuf,
}

impl Door {
    fn start(policy: Option<&str>) -> Door {
        let dir = TempDir::new();
        let work = dir.path().join("work");
        std::fs::create_dir_all(&work).expect("work");
        std::fs::set_permissions(&work, std::fs::Permissions::from_mode(0o777)).expect("chmod");
        let audit = dir.path().join("audit.jsonl");
        let socket = dir.path().join("execd.sock");
        let policy_file = dir.path().join("policy.json");
        let mut flags = vec![
            "--workdir".to_string(),
            work.display().to_string(),
            "--audit".into(),
            audit.display().to_string(),
        ];
        if let Some(p) = policy {
            std::fs::write(&policy_file, p).expect("policy");
            flags.extend(["--policy".into(), policy_file.display().to_string()]);
        }
        let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
        let d = Daemon::start_at(dir, socket, &flags);
        let victim = work.join("victim");
        let door = Door {
            d,
            work,
            victim,
            audit,
        };
        door.plant();
        door
    }

    fn plant(&self) {
        std::fs::create_dir_all(&self.victim).expect("victim");
        std::fs::write(self.victim.join("precious"), b"x").expect("precious");
    }

    /// `template` with `V` standing for the victim's path.
    fn line(&self, template: &str) -> String {
        template.replace("%V%", &self.victim.display().to_string())
    }

    #[track_caller]
    fn survived(&self, what: &str) {
        assert!(
            self.victim.join("precious").exists(),
            "the victim was deleted by {what:?}; execd log:\n{}",
            self.d.log()
        );
    }

    /// `shell/exec` of `command` in session `id` through `via`: its result, or the error
    /// code (JSON-RPC) or HTTP status with what came with it.
    fn exec(
        &self,
        c: &mut Client,
        via: Via,
        id: &str,
        command: &str,
    ) -> Result<Value, (i64, Value)> {
        let params = json!({"id": id, "command": command});
        match via {
            Via::Rpc => match c.call("shell/exec", params) {
                Ok(v) => Ok(v),
                Err(CallError::Rpc {
                    code,
                    message,
                    data,
                }) => Err((code, json!({"message": message, "data": data}))),
                Err(e) => panic!("shell/exec {command:?}: {e}"),
            },
            Via::Http => {
                let (status, body) = http(&self.d.socket, "/v1/shell/exec", &params);
                if status == 200 {
                    Ok(body["data"].clone())
                } else {
                    Err((i64::from(status), body))
                }
            }
        }
    }

    /// `exec` that must complete; its output.
    #[track_caller]
    fn run(&self, c: &mut Client, via: Via, id: &str, command: &str) -> String {
        match self.exec(c, via, id, command) {
            Ok(r) => {
                assert_eq!(r["status"], "completed", "{command:?} via {via:?}: {r}");
                r["output"].as_str().unwrap_or_default().to_string()
            }
            Err(e) => panic!("{command:?} via {via:?} refused: {e:?}"),
        }
    }

    /// `exec` that the gate must refuse (denied, or asked with nobody to ask).
    #[track_caller]
    fn refused(&self, c: &mut Client, via: Via, id: &str, command: &str) {
        match self.exec(c, via, id, command) {
            Ok(r) => panic!("{command:?} via {via:?} ran: {r}"),
            Err((code, _)) => assert!(
                matches!(code, -32005 | -32006 | 403),
                "{command:?} via {via:?}: {code}"
            ),
        }
    }
}

/// One POST over the daemon's socket (`Connection: close`): status and JSON body.
fn http(socket: &Path, path: &str, body: &Value) -> (u16, Value) {
    crate::shell::http(socket, "POST", path, body)
}

/// Every audit record so far.
fn audit(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

/// The red team's first: `echo 'rm -rf V' > /proc/self/fd/10` was judged `echo` and the
/// shell read `rm -rf V` from its own command pipe. The channel is a socket now: it
/// cannot be opened through `/proc`, a copy of it (bash's saved one, or one taken with
/// `pidfd_getfd`) writes nothing, and in a session the line is unparsed anyway.
#[test]
fn a_line_cannot_write_a_command_into_the_shells_channel() {
    for (policy, strict) in [(STRICT, true), (LENIENT, false)] {
        let door = Door::start(Some(policy));
        let mut c = door.d.client();
        for via in BOTH {
            let id = format!("chan-{via:?}");
            door.run(&mut c, via, &id, "true");
            for attack in [
                "echo 'rm -rf %V%' > /proc/self/fd/10",
                "echo 'rm -rf %V%' > /proc/self/fd/0",
                "echo 'rm -rf %V%' > /proc/$$/fd/0",
                "echo 'rm -rf %V%' >&10",
                "echo 'rm -rf %V%' > /dev/fd/10",
            ] {
                let line = door.line(attack);
                match door.exec(&mut c, via, &id, &line) {
                    Ok(r) => assert!(!strict, "{line:?} ran under the strict policy: {r}"),
                    Err((code, _)) => {
                        assert!(matches!(code, -32006 | 403), "{line:?} via {via:?}: {code}")
                    }
                }
                // The next line is the daemon's, and the session goes on.
                assert_eq!(door.run(&mut c, via, &id, "echo next").trim(), "next");
                door.survived(&line);
            }
        }
        assert_no_panic(&door.d);
    }
}

/// A program the shell runs takes the shell's stdin with `pidfd_getfd` and writes a
/// command into it: the socket is shut for writing on the shell's side, so the write fails
/// (`EPIPE`), whoever holds the copy.
#[test]
fn a_stolen_copy_of_the_shells_stdin_takes_no_writes() {
    if !have(&["python3"]) {
        return;
    }
    let door = Door::start(Some(STRICT));
    let mut c = door.d.client();
    // bash's stdin is the terminal while a line runs; the channel is the copy bash saved
    // (fd 10). Each descriptor of the shell is taken until a socket turns up.
    let script = door.line(
        "import os, ctypes, errno, stat\n\
         libc = ctypes.CDLL(None, use_errno=True)\n\
         pidfd = libc.syscall(434, os.getppid(), 0)\n\
         socket = None\n\
         for n in range(256):\n\
         \x20   fd = libc.syscall(438, pidfd, n, 0)\n\
         \x20   if fd >= 0 and stat.S_ISSOCK(os.fstat(fd).st_mode):\n\
         \x20       socket = fd\n\
         \x20       break\n\
         print(\"stolen\" if socket is not None else \"no socket\")\n\
         try:\n\
         \x20   os.write(socket, b\"rm -rf %V%\\n\")\n\
         \x20   print(\"WROTE\")\n\
         except OSError as e:\n\
         \x20   print(\"refused\", errno.errorcode[e.errno])\n",
    );
    let path = door.work.join("steal.py");
    std::fs::write(&path, script).expect("script");
    for via in BOTH {
        let id = format!("steal-{via:?}");
        let out = door.run(&mut c, via, &id, "python3 steal.py");
        assert!(out.contains("stolen"), "{out}");
        assert!(!out.contains("WROTE"), "{out}");
        assert!(out.contains("refused EPIPE"), "{out}");
        assert_eq!(door.run(&mut c, via, &id, "echo next").trim(), "next");
        door.survived("a stolen stdin");
    }
}

/// `__execd_was=-k` was a plain line; the prompt then ran `set -k`, and `bash -c true
/// BASH_ENV=evil.sh` (split as `true`) ran evil.sh. Now the helper's names are unparsed in
/// a session, its state is checked before use, `set -k` (even an approved one) is undone
/// before the next line, and its fixed state and the prompts are read-only.
#[test]
fn what_a_line_assigns_never_steers_the_helper() {
    for (policy, strict) in [(STRICT, true), (LENIENT, false)] {
        let door = Door::start(Some(policy));
        std::fs::write(door.work.join("evil.sh"), door.line("rm -rf %V%\n")).expect("evil");
        let mut c = door.d.client();
        for via in BOTH {
            let id = format!("helper-{via:?}");
            door.run(&mut c, via, &id, "true");
            let attacks = [
                "__execd_was=-k",
                "set -k",
                "__execd_back=/; __execd_was=2",
                "__execd_n=x",
                "PROMPT_COMMAND='rm -rf %V%'",
                "PS1='$(rm -rf %V%)'",
                "PS0='$(rm -rf %V%)'",
                "PS4='$(rm -rf %V%)'; set -x",
                "hash -p /bin/rm ls",
                "shopt -s expand_aliases; alias ls='rm -rf %V% #'",
                "set -a",
            ];
            for attack in attacks {
                let line = door.line(attack);
                if strict {
                    door.refused(&mut c, via, &id, &line);
                } else {
                    let _ = door.exec(&mut c, via, &id, &line);
                }
                for after in ["bash -c true BASH_ENV=./evil.sh", "ls %V%", "true"] {
                    let after = door.line(after);
                    door.run(&mut c, via, &id, &after);
                    door.survived(&format!("{line} then {after}"));
                }
                // Back where evil.sh is, whatever the attack did to the directory.
                door.run(&mut c, via, &id, &format!("cd {}", door.work.display()));
            }
            if !strict {
                door.run(&mut c, via, &id, "set +x");
            }
            // The session's own code still works: markers, status.
            let r = door.exec(&mut c, via, &id, "false").expect("false");
            assert_eq!(r["exit_code"], 1, "{r}");
            if !strict {
                let out = door.run(&mut c, via, &id, "echo $?");
                assert_eq!(out.trim(), "1", "{out}");
            }
        }
        assert_no_panic(&door.d);
    }
}

/// `MAILPATH='f?$(rm -rf V)'` was plain; an interactive bash runs the `$(...)` at a later
/// prompt once `f` changes. A session line assigning one of bash's own variables is
/// unparsed now, and the session's shell never checks mail (`MAILCHECK` unset and
/// read-only), so even an approved one does nothing.
#[test]
fn mail_path_runs_nothing_at_a_later_prompt() {
    for (policy, strict) in [(STRICT, true), (LENIENT, false)] {
        let door = Door::start(Some(policy));
        let mut c = door.d.client();
        for via in BOTH {
            let id = format!("mail-{via:?}");
            door.run(&mut c, via, &id, "true");
            for line in ["MAILCHECK=0", "MAILPATH='f?$(rm -rf %V%)'", "MAIL=f"] {
                let line = door.line(line);
                if strict {
                    door.refused(&mut c, via, &id, &line);
                } else {
                    let _ = door.exec(&mut c, via, &id, &line);
                }
            }
            // bash compares the file's times in whole seconds: a second between the
            // assignment, the mail and the check.
            for line in ["sleep 1.1", "echo x >> f", "sleep 1.1", "true", "true"] {
                door.run(&mut c, via, &id, line);
            }
            door.survived("MAILPATH");
        }
    }
}

/// `echo 'rm -rf V' > h/.bash_profile; HOME=h bash -lc true` was allowed as `echo` and
/// `true`, and ran rm from the profile. A login shell is unparsed now (unless the policy
/// says `"login_shell": "split"`), in a session and in `bash/exec` alike; so is `bash`
/// without `-c` in a session, and zsh told where to find its `.zshenv`.
#[test]
fn a_login_shell_or_a_shell_reading_its_terminal_is_unparsed() {
    let door = Door::start(Some(STRICT));
    let mut c = door.d.client();
    std::fs::create_dir_all(door.work.join("h")).expect("h");
    std::fs::write(door.work.join("h/.bash_profile"), door.line("rm -rf %V%\n")).expect("profile");
    std::fs::write(door.work.join("h/.zshenv"), door.line("rm -rf %V%\n")).expect("zshenv");
    for via in BOTH {
        let id = format!("login-{via:?}");
        door.run(&mut c, via, &id, "true");
        for line in [
            "echo 'rm -rf %V%' > h/.bash_profile; HOME=h bash -lc true",
            "HOME=h bash -lc true",
            "bash -lc true",
            "bash -l -c true",
            "sh -lc true",
            "bash --login -c true",
            "bash -ic true",
            "bash",
            "sh",
            "bash -s",
            "ZDOTDIR=h zsh -c true",
            "HOME=h zsh -c true",
        ] {
            door.refused(&mut c, via, &id, &door.line(line));
            door.survived(line);
        }
    }
    // `bash/exec` lines too.
    for line in [
        "echo 'rm -rf %V%' > h/.bash_profile; HOME=h bash -lc true",
        "bash -lc true",
    ] {
        let params = json!({"command": door.line(line), "exec_dir": door.work});
        let (code, _, _) = err(&mut c, "bash/exec", params);
        assert_eq!(code, -32006, "{line}");
        door.survived(line);
    }
    if std::process::Command::new("zsh")
        .arg("-fc")
        .arg("true")
        .output()
        .is_ok()
    {
        // With zsh here, the same line run anyway would have deleted the victim.
        let out = std::process::Command::new("zsh")
            .args(["-c", "true"])
            .env("ZDOTDIR", door.work.join("h"))
            .output()
            .expect("zsh");
        assert!(out.status.success());
        assert!(
            !door.victim.exists(),
            "zsh read .zshenv: the test's premise"
        );
    }
}

/// `cd V && PWD=/tmp/harmless`, then an asked `rm -rf build`: the approver and the audit
/// saw `cwd /tmp/harmless`. The session's directory is the shell's `/proc/PID/cwd` now.
#[test]
fn approvers_and_the_audit_see_where_the_shell_really_is() {
    const ASK: &str = r#"{"default": "allow", "unparsed": "ask", "rules": [
        {"name": "rm", "pattern": ["rm"], "decision": "ask"}
    ]}"#;
    let door = Door::start(Some(ASK));
    let real = door.work.join("real");
    std::fs::create_dir_all(real.join("build")).expect("real/build");
    let real = std::fs::canonicalize(&real).expect("canonical");
    let mut a = door.d.client_in_other_process();
    ok(&mut a, "approvals/subscribe", json!({}));
    for via in BOTH {
        let id = format!("cwd-{via:?}");
        let mut c = door.d.client();
        door.run(&mut c, via, &id, "true");
        // Asked (it assigns PWD), and approved.
        let line = format!("cd {} && PWD=/tmp/harmless", real.display());
        let waiter = send_exec(&door, via, &id, &line);
        let req = next_request(&mut a);
        answer(&mut a, &req["id"], "approve");
        let r = waiter.join().expect("exec thread");
        assert_eq!(r.map(|r| r["status"].clone()), Ok(json!("completed")));
        // Asked by rule: the approver sees where it would run.
        let waiter = send_exec(&door, via, &id, "rm -rf build");
        let req = next_request(&mut a);
        let display = &req["params"]["payload"]["display"];
        let data = display
            .as_array()
            .and_then(|d| d.iter().find(|b| b["type"] == "execd"))
            .map(|b| &b["data"])
            .expect("the execd block");
        assert_eq!(data["cwd"], real.display().to_string(), "{display}");
        assert!(!display.to_string().contains("harmless"), "{display}");
        answer(&mut a, &req["id"], "reject");
        assert!(waiter.join().expect("exec thread").is_err());
        assert!(real.join("build").exists(), "rejected: nothing ran");
        // What the session reports, and what the audit records for its next line.
        let sessions = ok(&mut c, "shell/sessions", json!({}));
        let found = sessions.to_string();
        assert!(found.contains(&real.display().to_string()), "{sessions}");
        assert!(!found.contains("harmless"), "{sessions}");
        door.run(&mut c, via, &id, "echo here");
        wait_until("the audit record", || {
            audit(&door.audit)
                .iter()
                .any(|r| r["event"] == "start" && r["line"] == "echo here" && r["session"] == id)
        });
        let start = audit(&door.audit)
            .into_iter()
            .find(|r| r["event"] == "start" && r["line"] == "echo here" && r["session"] == id)
            .expect("its start record");
        assert_eq!(start["cwd"], real.display().to_string(), "{start}");
        assert_eq!(
            door.run(&mut c, via, &id, "pwd").trim(),
            real.display().to_string()
        );
    }
}

/// `shell/exec` in a thread (it waits for an approval): its result or error.
fn send_exec(
    door: &Door,
    via: Via,
    id: &str,
    line: &str,
) -> std::thread::JoinHandle<Result<Value, i64>> {
    let socket = door.d.socket.clone();
    let (id, line) = (id.to_string(), line.to_string());
    std::thread::spawn(move || {
        let params = json!({"id": id, "command": line});
        match via {
            Via::Rpc => {
                let mut c = Client::connect(&socket).expect("connect");
                c.timeout = Some(WAIT);
                c.call("shell/exec", params).map_err(|e| match e {
                    CallError::Rpc { code, .. } => code,
                    _ => 0,
                })
            }
            Via::Http => {
                let (status, body) = http(&socket, "/v1/shell/exec", &params);
                if status == 200 {
                    Ok(body["data"].clone())
                } else {
                    Err(i64::from(status))
                }
            }
        }
    })
}

/// An approver's Wire answer.
fn answer(a: &mut Client, id: &Value, response: &str) {
    let msg = json!({"jsonrpc": "2.0", "id": id,
                     "result": {"request_id": id, "response": response}});
    a.send_line(msg.to_string().as_bytes()).expect("answer");
}

/// Commands get the terminal itself as stdin, stdout, stderr and controlling terminal
/// (`tty` prints `/dev/pts/N`, not `/dev/tty`), opened afresh for each line: what one line
/// redirects or closes (`exec >file`, `exec 2>&-`, even bash's saved copy of its stdin) is
/// not what the next line gets.
#[test]
fn commands_run_on_the_terminal_itself_and_a_line_redirects_only_itself() {
    let door = Door::start(None);
    let mut c = door.d.client();
    for via in BOTH {
        let id = format!("tty-{via:?}");
        let tty = door.run(&mut c, via, &id, "tty");
        let tty = tty.trim();
        assert!(
            tty.starts_with("/dev/pts/") && tty["/dev/pts/".len()..].parse::<u32>().is_ok(),
            "{tty:?}"
        );
        let fds = door.run(
            &mut c,
            via,
            &id,
            "readlink /proc/self/fd/0 /proc/self/fd/1 /proc/self/fd/2; (exec 3</dev/tty) && echo ctty",
        );
        assert_eq!(
            fds.split_whitespace().collect::<Vec<_>>(),
            [tty, tty, tty, "ctty"],
            "{fds}"
        );
        // No descriptor of the shell's own but the three.
        let fds = door.run(&mut c, via, &id, "ls /proc/self/fd | wc -l");
        assert_eq!(fds.trim(), "4", "0, 1, 2 and ls's own directory");
        door.run(&mut c, via, &id, "exec >out.txt; echo into-file");
        assert_eq!(door.run(&mut c, via, &id, "echo shown").trim(), "shown");
        door.run(&mut c, via, &id, "exec 2>&-");
        let out = door.run(
            &mut c,
            via,
            &id,
            "ls /nonexistent-dir 2>&1 >/dev/null | wc -l; ls /nonexistent-dir",
        );
        assert!(
            out.contains("No such file"),
            "stderr is the terminal again: {out}"
        );
        // Closing bash's saved copy of its stdin would leave it reading commands from
        // the terminal: the shell ends itself instead, and the session starts another.
        let r = door.exec(&mut c, via, &id, "exec 10>&-").expect("ran");
        assert_ne!(r["status"], "running", "{r}");
        assert_eq!(door.run(&mut c, via, &id, "echo alive").trim(), "alive");
        let again = door.run(&mut c, via, &id, "tty");
        assert!(again.trim().starts_with("/dev/pts/"), "{again}");
    }
    assert_no_panic(&door.d);
}

/// At every prompt the terminal's unread input is discarded: what one command never read
/// (written with `shell/write`, or pushed with `TIOCSTI`) never reaches the next.
#[test]
fn input_left_unread_never_reaches_the_next_command() {
    let door = Door::start(None);
    let mut c = door.d.client();
    for via in BOTH {
        let id = format!("unread-{via:?}");
        door.run(&mut c, via, &id, "true");
        let r = match via {
            Via::Rpc => ok(
                &mut c,
                "shell/exec",
                json!({"id": id, "command": "sleep 1", "async_mode": true}),
            ),
            Via::Http => {
                let (status, body) = http(
                    &door.d.socket,
                    "/v1/shell/exec",
                    &json!({"id": id, "command": "sleep 1", "async_mode": true}),
                );
                assert_eq!(status, 200, "{body}");
                body["data"].clone()
            }
        };
        assert_eq!(r["status"], "running", "{r}");
        let write = json!({"id": id, "input": "leftover", "press_enter": true});
        match via {
            Via::Rpc => {
                ok(&mut c, "shell/write", write);
            }
            Via::Http => {
                let (status, body) = http(&door.d.socket, "/v1/shell/write", &write);
                assert_eq!(status, 200, "{body}");
            }
        }
        let wait = json!({"id": id, "seconds": 10});
        match via {
            Via::Rpc => {
                ok(&mut c, "shell/wait", wait);
            }
            Via::Http => {
                http(&door.d.socket, "/v1/shell/wait", &wait);
            }
        }
        let out = read_line(&door, &mut c, via, &id);
        assert!(
            out.contains("[]"),
            "the leftover reached the next command: {out}"
        );
        assert!(!out.contains("[leftover]"), "{out}");
        if on_path_python() {
            let pushed = door.run(
                &mut c,
                via,
                &id,
                "python3 -c 'import fcntl, termios\nfor c in b\"pushed\\n\": fcntl.ioctl(0, termios.TIOCSTI, bytes([c]))\nprint(\"done\")'",
            );
            if pushed.contains("done") {
                let out = read_line(&door, &mut c, via, &id);
                assert!(
                    !out.contains("[pushed]"),
                    "a pushed line reached the next command: {out}"
                );
                assert!(out.contains("[]"), "{out}");
            } else {
                eprintln!("TIOCSTI refused here: {pushed}");
            }
        }
    }
}

/// Runs `read -t 1 x; echo "[$x]"` (which waits for input, so `exec` answers at once)
/// to its end; its output.
fn read_line(door: &Door, c: &mut Client, via: Via, id: &str) -> String {
    let r = door
        .exec(c, via, id, "read -t 1 x; echo \"[$x]\"")
        .expect("read ran");
    if r["status"] != "completed" {
        ok(c, "shell/wait", json!({"id": id, "seconds": 10}));
    }
    let v = ok(c, "shell/view", json!({"id": id}));
    assert_eq!(v["status"], "completed", "{v}");
    v["output"].as_str().unwrap_or_default().to_string()
}

fn on_path_python() -> bool {
    std::process::Command::new("python3")
        .arg("-c")
        .arg("pass")
        .output()
        .is_ok_and(|o| o.status.success())
}
