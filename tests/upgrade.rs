//! Upgrading in place (PROTOCOL.md section 13), against the real daemon: `SIGUSR2` and
//! `execctl upgrade` swap the binary under the same pid and every command, byte,
//! connection, parked request and pending approval carries over; refusals (a missing
//! binary, one that does not answer the pre-flight, a new image that refuses the state, a
//! caller who may not) leave the old daemon serving everything; twenty upgrades in a row
//! leave nothing behind.
//!
//! What must happen during the swap (a command exiting while no image serves) cannot be
//! placed exactly, so those tests cover the window: commands exit every few milliseconds
//! from before the signal until after the new image serves, and every one of them must be
//! reported once, with its code.

use std::io::Write;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::util::*;

const POLICY: &str =
    r#"{"unparsed": "allow", "rules": [{"name": "rm", "pattern": ["rm"], "decision": "ask"}]}"#;

/// How an upgrade is asked for.
#[derive(Clone, Copy, Debug)]
enum Trigger {
    Signal,
    Execctl,
}

/// A daemon with `POLICY` and an audit file (and `extra` flags), and its audit file.
fn daemon(extra: &[&str]) -> (Daemon, PathBuf) {
    daemon_with_env(extra, &[])
}

/// `daemon` with variables set in its environment.
fn daemon_with_env(extra: &[&str], env: &[(&str, &str)]) -> (Daemon, PathBuf) {
    let dir = TempDir::new();
    let policy = dir.path().join("policy.json");
    std::fs::write(&policy, POLICY).expect("write policy");
    let audit = dir.path().join("audit.jsonl");
    let socket = dir.path().join("execd.sock");
    let mut flags = vec![
        "--policy".to_string(),
        policy.display().to_string(),
        "--audit".to_string(),
        audit.display().to_string(),
    ];
    flags.extend(extra.iter().map(|s| s.to_string()));
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let mut cmd = Daemon::command(dir.path(), &socket, &flags);
    cmd.envs(env.iter().copied());
    let child = cmd.spawn().expect("spawn execd");
    (Daemon::adopt(Some(child), socket, dir), audit)
}

/// `initialize`'s `_meta.execd`.
#[track_caller]
fn meta(c: &mut Client) -> Value {
    ok(c, "initialize", json!({"protocolVersion": 1}))["_meta"]["execd"].clone()
}

/// Upgrades `d` as `how` says and waits until the new image serves; returns what
/// execctl printed (nothing for the signal).
#[track_caller]
fn upgrade(d: &Daemon, c: &mut Client, how: Trigger, before: u64) -> String {
    match how {
        Trigger::Signal => {
            unsafe_kill(d.pid(), libc::SIGUSR2);
            wait_until("the new image serves", || {
                meta(c)["upgrades"].as_u64() == Some(before + 1)
            });
            String::new()
        }
        Trigger::Execctl => {
            let (code, out, err) = execctl(d, &["upgrade"]);
            assert_eq!(code, Some(0), "execctl upgrade: {out} {err}");
            out
        }
    }
}

/// Runs execctl against `d`: its exit status, stdout and stderr.
#[track_caller]
fn execctl(d: &Daemon, args: &[&str]) -> (Option<i32>, String, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_execctl"))
        .arg("--socket")
        .arg(&d.socket)
        .args(args)
        .stdin(std::process::Stdio::null())
        .output()
        .expect("run execctl");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A lossless base64 subscription's stream, checked as it arrives: every `Output` starts
/// where the last one ended, and a `Gap` fails the test.
struct Follow {
    id: String,
    next: u64,
    data: Vec<u8>,
    exit: Option<Value>,
}

impl Follow {
    fn new(id: &str) -> Follow {
        Follow {
            id: id.to_string(),
            next: 0,
            data: Vec::new(),
            exit: None,
        }
    }

    /// Reads events until `done` holds of the bytes so far.
    #[track_caller]
    fn until(&mut self, c: &mut Client, what: &str, done: impl Fn(&[u8]) -> bool) {
        let deadline = Instant::now() + WAIT;
        while !done(&self.data) {
            let left = deadline.saturating_duration_since(Instant::now());
            assert!(
                !left.is_zero(),
                "timed out waiting for {what} on {}",
                self.id
            );
            let n = c
                .next_notification(Some(left))
                .unwrap_or_else(|e| panic!("waiting for {what} on {}: {e}", self.id));
            let p = &n["params"]["payload"];
            if p["id"] != self.id.as_str() {
                continue;
            }
            match n["params"]["type"].as_str() {
                Some("Output") => {
                    assert_eq!(
                        p["offset"].as_u64(),
                        Some(self.next),
                        "{}: an Output that does not continue the stream: {n}",
                        self.id
                    );
                    let bytes =
                        execd::base64_decode(p["data"].as_str().expect("data")).expect("base64");
                    self.next += bytes.len() as u64;
                    self.data.extend_from_slice(&bytes);
                }
                Some("Gap") => panic!("{}: a lossless stream got a Gap: {n}", self.id),
                Some("Exit") => self.exit = Some(p.clone()),
                _ => {}
            }
        }
    }

    /// The ticks (`tick N` lines) received, which must be 1, 2, 3, ... with none missing.
    #[track_caller]
    fn ticks(&self) -> u64 {
        let text = String::from_utf8_lossy(&self.data);
        let mut n = 0;
        for line in text.split_terminator('\n') {
            let Some(t) = line.strip_prefix("tick ") else {
                panic!("{}: an unexpected line {line:?}", self.id)
            };
            n += 1;
            assert_eq!(
                t.parse::<u64>().ok(),
                Some(n),
                "{}: tick after {}",
                self.id,
                n - 1
            );
        }
        n
    }
}

/// Whether `data` holds at least `n` whole tick lines.
fn has_ticks(data: &[u8], n: usize) -> bool {
    data.iter().filter(|b| **b == b'\n').count() >= n
}

/// Reads for a moment more on `c`: no second answer to request `id` may come.
#[track_caller]
fn answered_once(c: &mut Client, id: u64) {
    let until = Instant::now() + Duration::from_millis(300);
    while let Some(left) = until.checked_duration_since(Instant::now()) {
        match c.read_message(Some(left)) {
            Ok(m) => assert_ne!(m["id"], json!(id), "request {id} answered twice: {m}"),
            Err(_) => return,
        }
    }
}

/// One HTTP request on a raw connection: the status and the body.
#[track_caller]
fn http(s: &mut UnixStream, request: &str) -> (u16, Value) {
    s.write_all(request.as_bytes()).expect("send HTTP");
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let (head_end, len) = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..i]).to_lowercase();
            let len = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse::<usize>().ok())
                .expect("content-length");
            break (i + 4, len);
        }
        let n = read_some(s, &mut chunk).expect("read HTTP");
        assert!(n > 0, "closed before a whole head");
        buf.extend_from_slice(&chunk[..n]);
    };
    while buf.len() < head_end + len {
        let n = read_some(s, &mut chunk).expect("read HTTP body");
        assert!(n > 0, "closed before the whole body");
        buf.extend_from_slice(&chunk[..n]);
    }
    let status = String::from_utf8_lossy(&buf[9..12])
        .parse()
        .expect("status");
    let body = serde_json::from_slice(&buf[head_end..head_end + len]).expect("JSON body");
    (status, body)
}

const SESSIONS: &str = "GET /v1/bash/sessions HTTP/1.1\r\nHost: execd\r\n\r\n";

/// The number of a public id (`term_7`, `cmd_7`).
fn number(id: &str) -> u64 {
    id.rsplit('_')
        .next()
        .and_then(|n| n.parse().ok())
        .expect("an id")
}

/// An approver connection made by another process.
fn approver(d: &Daemon) -> Relayed {
    let mut a = d.client_in_other_process();
    ok(&mut a, "approvals/subscribe", json!({}));
    a
}

/// `bash/output` until the command is no longer running.
#[track_caller]
fn bash_finished(c: &mut Client, session: &str, id: &str) -> Value {
    let mut last = Value::Null;
    wait_until(&format!("{id} ends"), || {
        last = ok(
            c,
            "bash/output",
            json!({"session_id": session, "command_id": id}),
        );
        last["command"]["status"] != "running"
    });
    last
}

/// Everything a daemon may hold, held across an upgrade made as `how`.
fn everything_carries_over(how: Trigger) {
    let (d, audit) = daemon_with_env(&[], &[("EXECD_TEST_SWAP_PAUSE_MS", "1000")]);
    let pid = d.pid();
    let mut c = d.client();
    let mut ids: Vec<String> = Vec::new();

    // A streaming terminal with a lossless subscriber from its first byte.
    let mut sub = d.client();
    let r = ok(
        &mut sub,
        "terminal/create",
        json!({"sessionId": "s", "command": "bash",
               "args": ["-c", "i=0; while :; do i=$((i+1)); echo tick $i; sleep 0.005; done"],
               "_meta": {"execd": {"subscribe": {"lossless": true, "encoding": "base64"}}}}),
    );
    let stream_id = r["terminalId"].as_str().expect("id").to_string();
    ids.push(stream_id.clone());
    let mut follow = Follow::new(&stream_id);
    follow.until(&mut sub, "ten ticks", |d| has_ticks(d, 10));

    // A command reading its stdin, given some of it.
    let r = ok(
        &mut c,
        "bash/exec",
        json!({"command": "cat", "session_id": "in", "async_mode": true}),
    );
    let cat = r["command_id"].as_str().expect("id").to_string();
    ids.push(cat.clone());
    ok(
        &mut c,
        "bash/write",
        json!({"session_id": "in", "command_id": cat, "input": "before\n"}),
    );

    // A sleep, and a PTY command (cat on a terminal) that was typed to.
    let sleeper = create(&mut c, "sleep", &["60"]);
    ids.push(sleeper.clone());
    let sleeper_pid = pid_of(&mut c, &sleeper);
    let r = ok(
        &mut c,
        "bash/exec",
        json!({"command": "cat", "session_id": "tty", "async_mode": true, "tty": true}),
    );
    let pty = r["command_id"].as_str().expect("id").to_string();
    ids.push(pty.clone());
    ok(
        &mut c,
        "bash/write",
        json!({"session_id": "tty", "command_id": pty, "input": "hello\n"}),
    );
    wait_until("the PTY echoes", || {
        let r = ok(
            &mut c,
            "bash/output",
            json!({"session_id": "tty", "command_id": pty}),
        );
        r["stdout"].as_str().unwrap_or("").matches("hello").count() >= 2
    });

    // Parked waits on commands that end after the upgrade: a wait_for_exit, and a
    // bash/output with wait.
    let (gate1, wait1) = gate(&d, "gate1");
    let gated = create(&mut c, "sh", &["-c", &format!("{wait1}; exit 3")]);
    ids.push(gated.clone());
    let mut w1 = d.client();
    let w1_id = w1
        .send(
            "terminal/wait_for_exit",
            json!({"sessionId": "s", "terminalId": gated}),
        )
        .expect("send");
    let (gate2, wait2) = gate(&d, "gate2");
    let r = ok(
        &mut c,
        "bash/exec",
        json!({"command": format!("{wait2}; echo gated"), "session_id": "out",
               "async_mode": true}),
    );
    let quiet = r["command_id"].as_str().expect("id").to_string();
    ids.push(quiet.clone());
    let mut w2 = d.client();
    let w2_id = w2
        .send(
            "bash/output",
            json!({"session_id": "out", "command_id": quiet, "wait": true,
                   "wait_timeout": 60}),
        )
        .expect("send");

    // A shell session whose state (directory, variables) a command changed, and a
    // command of it running across the upgrade.
    let r = ok(
        &mut c,
        "shell/exec",
        json!({"id": "sh1", "command": "cd /tmp && export UPGRADE_KEPT=yes"}),
    );
    assert_eq!(r["status"], "completed", "{r}");
    let (gate3, wait3) = gate(&d, "gate3");
    let r = ok(
        &mut c,
        "shell/exec",
        json!({"id": "sh1", "command": format!("{wait3}; echo across"), "async_mode": true}),
    );
    assert_eq!(r["status"], "running", "{r}");

    // An approver with a pending ask.
    let mut a = approver(&d);
    let victim = d.dir.path().join("victim");
    std::fs::write(&victim, "x").expect("write");
    let mut rq = d.client();
    let rq_id = rq
        .send(
            "bash/exec",
            json!({"command": format!("rm {} && echo removed", victim.display()),
                   "session_id": "ask"}),
        )
        .expect("send");
    let ask = next_request(&mut a);
    let tool_call = ask["params"]["payload"]["tool_call_id"]
        .as_str()
        .expect("tool_call_id")
        .to_string();
    ids.push(tool_call.clone());

    // An HTTP keep-alive connection on the socket, and idle ones.
    let mut web = UnixStream::connect(&d.socket).expect("connect");
    web.set_read_timeout(Some(WAIT)).expect("timeout");
    let (status, _) = http(&mut web, SESSIONS);
    assert_eq!(status, 200);
    let mut idle: Vec<Client> = (0..3).map(|_| d.client()).collect();
    meta(&mut idle[0]);

    // Commands that exit while no image serves (released once the old image has handed
    // its state over; the new one waits `EXECD_TEST_SWAP_PAUSE_MS` before it rebuilds),
    // and commands exiting every few milliseconds from before the upgrade to after it;
    // each waited for.
    let mut exits = d.client();
    let mut ending = Vec::new();
    let (swap_gate, wait_swap) = gate(&d, "swap");
    let mut swapped = Vec::new();
    for k in 0..40u64 {
        let script = if k < 20 {
            format!("{wait_swap}; exit {}", k + 10)
        } else {
            format!("sleep 0.{:03}; exit {}", 8 * k, k + 10)
        };
        let id = create(&mut c, "sh", &["-c", &script]);
        if k < 20 {
            swapped.push(pid_of(&mut c, &id));
        }
        let req = exits
            .send(
                "terminal/wait_for_exit",
                json!({"sessionId": "s", "terminalId": id}),
            )
            .expect("send");
        ids.push(id.clone());
        ending.push((id, req, k + 10));
    }
    let newest_before = ids.iter().map(|i| number(i)).max().expect("ids");

    let mut asked = match how {
        Trigger::Signal => {
            unsafe_kill(d.pid(), libc::SIGUSR2);
            None
        }
        Trigger::Execctl => Some(
            std::process::Command::new(env!("CARGO_BIN_EXE_execctl"))
                .arg("--socket")
                .arg(&d.socket)
                .arg("upgrade")
                .stdin(std::process::Stdio::null())
                .stdout(std::process::Stdio::piped())
                .spawn()
                .expect("run execctl upgrade"),
        ),
    };
    wait_until("the old image hands its state over", || {
        d.log().contains("upgrade: handing")
    });
    open_gate(&swap_gate);
    // They exit and wait as zombies of the same pid while no image serves.
    wait_until("the commands released at the swap have exited", || {
        let z = zombie_children(d.pid());
        swapped.iter().all(|p| z.contains(p))
    });
    assert!(
        !d.log().contains("upgraded in place"),
        "the new image served before they exited: the test's pause is too short here"
    );
    match asked.take() {
        Some(child) => {
            let out = child.wait_with_output().expect("execctl upgrade");
            let said = String::from_utf8_lossy(&out.stdout).into_owned();
            assert_eq!(out.status.code(), Some(0), "{said}");
            assert!(
                said.starts_with("upgraded execd ") && said.ends_with(" ms)\n"),
                "one line: {said:?}"
            );
            assert_eq!(said.lines().count(), 1, "{said:?}");
        }
        None => wait_until("the new image serves", || meta(&mut c)["upgrades"] == 1),
    }
    assert!(
        zombie_children(d.pid()).is_empty(),
        "the new image reaped them"
    );

    // The same daemon process, upgraded once.
    let m = meta(&mut c);
    assert_eq!(m["pid"].as_i64(), Some(i64::from(pid)), "{m}");
    assert_eq!(m["upgrades"], 1, "{m}");

    // The lossless stream goes on at the exact offset, every tick there once.
    let before = follow.ticks();
    follow.until(&mut sub, "ticks after the upgrade", |d| {
        has_ticks(d, before as usize + 50)
    });
    assert!(follow.ticks() >= before + 50);
    let all = output(&mut c, &stream_id);
    assert!(
        all["output"]
            .as_str()
            .unwrap_or("")
            .starts_with("tick 1\ntick 2\n"),
        "retained output from offset 0: {all}"
    );

    // Every exit during the swap is reported, once, with its code.
    for (id, req, code) in &ending {
        let r = exits.wait_response(*req).expect("an exit");
        assert_eq!(r["exitCode"].as_u64(), Some(*code), "{id}: {r}");
    }
    answered_once(&mut exits, ending.last().expect("one").1);

    // Input written after the upgrade reaches the command that read before it.
    ok(
        &mut c,
        "bash/write",
        json!({"session_id": "in", "command_id": cat, "input": "after\n", "eof": true}),
    );
    let r = bash_finished(&mut c, "in", &cat);
    assert_eq!(r["stdout"], "before\nafter\n", "{r}");
    assert_eq!(r["command"]["exit_code"], 0, "{r}");

    // The sleep still runs, as the same process.
    let e = terminal_entry(&mut c, &sleeper);
    assert!(e.get("exitStatus").is_none(), "{e}");
    assert_eq!(pid_of(&mut c, &sleeper), sleeper_pid);
    assert!(pid_alive(sleeper_pid));

    // The PTY takes input and keeps its screen.
    ok(
        &mut c,
        "bash/write",
        json!({"session_id": "tty", "command_id": pty, "input": "world\n"}),
    );
    wait_until("the PTY echoes after the upgrade", || {
        let r = ok(
            &mut c,
            "bash/output",
            json!({"session_id": "tty", "command_id": pty, "screen": true}),
        );
        let lines = r["screen"]["lines"].to_string();
        lines.contains("hello") && lines.contains("world")
    });

    // The parked waits are answered once, when their commands end.
    open_gate(&gate1);
    let r = w1.wait_response(w1_id).expect("wait_for_exit");
    assert_eq!(r["exitCode"], 3, "{r}");
    answered_once(&mut w1, w1_id);
    open_gate(&gate2);
    let r = w2.wait_response(w2_id).expect("bash/output wait");
    assert_eq!(r["stdout"], "gated\n", "{r}");
    answered_once(&mut w2, w2_id);

    // The shell session's command ends after the upgrade, and the shell kept its state.
    open_gate(&gate3);
    let r = ok(
        &mut c,
        "shell/wait",
        json!({"id": "sh1", "seconds": WAIT.as_secs()}),
    );
    assert_eq!(r["status"], "completed", "{r}");
    let r = ok(&mut c, "shell/view", json!({"id": "sh1"}));
    assert!(r["output"].as_str().unwrap_or("").contains("across"), "{r}");
    let r = ok(
        &mut c,
        "shell/exec",
        json!({"id": "sh1", "command": "pwd; echo $UPGRADE_KEPT"}),
    );
    assert_eq!(r["status"], "completed", "{r}");
    assert_eq!(
        r["output"].as_str().map(str::trim),
        Some("/tmp\nyes"),
        "{r}"
    );

    // The pending approval is answered after the upgrade, and its command runs.
    let answer = json!({"jsonrpc": "2.0", "id": ask["id"],
        "result": {"request_id": ask["id"], "response": "approve"}});
    a.send_line(answer.to_string().as_bytes()).expect("answer");
    let r = rq.wait_response(rq_id).expect("the approved command");
    assert_eq!(r["stdout"], "removed\n", "{r}");
    assert_eq!(r["command_id"], tool_call.as_str());
    assert!(!victim.exists());

    // The HTTP connection, the idle ones, the subscriber's: all open and answering.
    let (status, body) = http(&mut web, SESSIONS);
    assert_eq!(status, 200, "{body}");
    for i in idle.iter_mut() {
        meta(i);
    }
    meta(&mut sub);
    meta(&mut a);

    // Ids go on from where they were.
    let next = create(&mut c, "true", &[]);
    assert!(
        number(&next) > newest_before,
        "{next} after {newest_before}"
    );

    // The upgrade was audited by the image that serves.
    let log = std::fs::read_to_string(&audit).unwrap_or_default();
    let record: Value = log
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|r| r["event"] == "upgrade")
        .unwrap_or_else(|| panic!("no upgrade record in {log}"));
    assert!(
        record["commands"].as_u64().unwrap_or(0) >= ids.len() as u64 - 1,
        "{record}"
    );
    assert!(record["connections"].as_u64().unwrap_or(0) >= 9, "{record}");
    assert!(record["pause_ms"].as_f64().is_some(), "{record}");
    assert_no_panic(&d);
}

#[test]
fn sigusr2_carries_every_command_byte_connection_and_request() {
    everything_carries_over(Trigger::Signal);
}

#[test]
fn execctl_upgrade_carries_every_command_byte_connection_and_request() {
    everything_carries_over(Trigger::Execctl);
}

/// A package manager renames a new file over the path execd was started from: the
/// upgrade executes the new file, not the running (now deleted) one.
#[test]
fn a_binary_renamed_over_the_path_is_the_one_executed() {
    use std::os::unix::fs::MetadataExt;
    let dir = TempDir::new();
    let bin = dir.path().join("execd");
    std::fs::copy(env!("CARGO_BIN_EXE_execd"), &bin).expect("copy execd");
    let socket = dir.path().join("execd.sock");
    let log = std::fs::File::create(dir.path().join("execd.log")).expect("log");
    let child = std::process::Command::new(&bin)
        .arg("--socket")
        .arg(&socket)
        .args(["--kill-grace", "1s"])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(log)
        .spawn()
        .expect("start execd from the copy");
    let d = Daemon::adopt(Some(child), socket, dir);
    let mut c = d.client();
    let sleeper = create(&mut c, "sleep", &["60"]);
    let exe = |pid: i32| std::fs::metadata(format!("/proc/{pid}/exe")).map(|m| m.ino());
    let running = exe(d.pid()).expect("the daemon's executable");
    // What a package manager does: the new version beside it, renamed over it.
    let staged = d.dir.path().join(".execd.new");
    std::fs::copy(env!("CARGO_BIN_EXE_execd"), &staged).expect("stage");
    std::fs::rename(&staged, &bin).expect("rename over");
    let new = std::fs::metadata(&bin).expect("the new file").ino();
    assert_ne!(new, running);
    upgrade(&d, &mut c, Trigger::Signal, 0);
    assert_eq!(exe(d.pid()).expect("the executable now"), new);
    let e = terminal_entry(&mut c, &sleeper);
    assert!(e.get("exitStatus").is_none(), "the sleep goes on: {e}");
    assert_no_panic(&d);
}

/// What an old daemon serves before and after a refusal: a streaming command with its
/// lossless subscriber, a parked wait, a sleep.
struct Serving {
    sub: Client,
    follow: Follow,
    waiter: Client,
    wait_req: u64,
    gate: PathBuf,
    sleeper: String,
}

impl Serving {
    fn start(d: &Daemon) -> Serving {
        let mut sub = d.client();
        let r = ok(
            &mut sub,
            "terminal/create",
            json!({"sessionId": "s", "command": "bash",
                   "args": ["-c", "i=0; while :; do i=$((i+1)); echo tick $i; sleep 0.01; done"],
                   "_meta": {"execd": {"subscribe": {"lossless": true, "encoding": "base64"}}}}),
        );
        let mut follow = Follow::new(r["terminalId"].as_str().expect("id"));
        follow.until(&mut sub, "five ticks", |d| has_ticks(d, 5));
        let mut c = d.client();
        let (gate, wait) = gate(d, "gate");
        let gated = create(&mut c, "sh", &["-c", &format!("{wait}; exit 5")]);
        let mut waiter = d.client();
        let wait_req = waiter
            .send(
                "terminal/wait_for_exit",
                json!({"sessionId": "s", "terminalId": gated}),
            )
            .expect("send");
        let sleeper = create(&mut c, "sleep", &["60"]);
        Serving {
            sub,
            follow,
            waiter,
            wait_req,
            gate,
            sleeper,
        }
    }

    /// Everything goes on: the stream at its offset, the sleep, the parked wait.
    #[track_caller]
    fn goes_on(mut self, d: &Daemon) {
        let before = self.follow.ticks();
        self.follow.until(&mut self.sub, "more ticks", |x| {
            has_ticks(x, before as usize + 10)
        });
        self.follow.ticks();
        let mut c = d.client();
        let e = terminal_entry(&mut c, &self.sleeper);
        assert!(e.get("exitStatus").is_none(), "{e}");
        open_gate(&self.gate);
        let r = self.waiter.wait_response(self.wait_req).expect("the wait");
        assert_eq!(r["exitCode"], 5);
        answered_once(&mut self.waiter, self.wait_req);
        assert_eq!(meta(&mut c)["pid"].as_i64(), Some(i64::from(d.pid())));
        assert_no_panic(d);
    }
}

/// `execctl upgrade --binary BIN` is refused: exit 1 with one line saying why, which
/// contains `says`, and the old daemon serves on.
#[track_caller]
fn refused(d: &Daemon, bin: &Path, says: &str) {
    let bin = bin.display().to_string();
    let (code, out, err) = execctl(d, &["upgrade", "--binary", &bin]);
    assert_eq!(code, Some(1), "{out} {err}");
    assert!(out.is_empty(), "{out}");
    assert!(err.contains(says), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    let mut c = d.client();
    assert_eq!(meta(&mut c)["upgrades"], 0);
    let log = d.log();
    assert!(log.contains("upgrade refused"), "{log}");
}

#[test]
fn a_missing_binary_is_refused_and_nothing_changes() {
    let (d, audit) = daemon(&[]);
    let serving = Serving::start(&d);
    refused(
        &d,
        &d.dir.path().join("no-such-execd"),
        "No such file or directory",
    );
    let log = std::fs::read_to_string(&audit).unwrap_or_default();
    assert!(
        log.lines()
            .any(|l| l.contains("\"event\":\"upgrade_failed\"")),
        "{log}"
    );
    serving.goes_on(&d);
}

#[test]
fn a_binary_that_does_not_answer_the_pre_flight_is_refused_after_five_seconds() {
    let (d, _) = daemon(&[]);
    let serving = Serving::start(&d);
    let script = d.dir.path().join("mute");
    std::fs::write(&script, "#!/bin/sh\nexec sleep 10\n").expect("write");
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .expect("chmod");
    let before = sched_of(d.pid()).expect("the daemon's policy and nice");
    let started = Instant::now();
    // The daemon serves while it waits for the pre-flight.
    let mut asked = d.client();
    let req = asked
        .send("daemon/upgrade", json!({"binary": script}))
        .expect("send");
    let mut other = d.client();
    if may_raise_priority() {
        // Where the daemon may, the pre-flight and the daemon waiting for it run in real
        // time (SCHED_RR), and a command started meanwhile does not.
        wait_until("the pre-flight runs", || {
            child_running(d.pid(), "sleep 10").is_some()
        });
        let probe = child_running(d.pid(), "sleep 10").expect("the pre-flight");
        assert_eq!(sched_of(probe).map(|s| s.0), Some(2), "the pre-flight");
        assert_eq!(sched_of(d.pid()).map(|s| s.0), Some(2), "the daemon");
        let r = ok(
            &mut other,
            "bash/exec",
            json!({"command": "cut -d' ' -f41 /proc/self/stat"}),
        );
        assert_eq!(r["stdout"].as_str().map(str::trim), Some("0"), "{r}");
    }
    for _ in 0..5 {
        meta(&mut other);
        std::thread::sleep(Duration::from_millis(100));
    }
    match asked.wait_response(req) {
        Err(CallError::Rpc { code, message, .. }) => {
            assert_eq!(code, -32000);
            assert!(message.contains("within 5 s"), "{message}");
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(4900) && took < Duration::from_secs(9),
        "{took:?}"
    );
    // The pre-flight is gone.
    wait_until("the pre-flight is ended", || {
        zombie_children(d.pid()).is_empty() && !any_child_runs(d.pid(), "sleep 10")
    });
    refused(&d, &script, "did not answer --upgrade-check");
    assert_eq!(sched_of(d.pid()), Some(before), "the priority is put back");
    serving.goes_on(&d);
}

/// Whether a child of `pid` runs a command line starting with `cmdline` (words apart).
fn any_child_runs(pid: i32, cmdline: &str) -> bool {
    child_running(pid, cmdline).is_some()
}

/// A child of `pid` that runs a command line starting with `cmdline` (words apart).
fn child_running(pid: i32, cmdline: &str) -> Option<i32> {
    let dir = std::fs::read_dir("/proc").ok()?;
    dir.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .find(|&p| {
            let stat = std::fs::read_to_string(format!("/proc/{p}/stat")).unwrap_or_default();
            let ppid = stat
                .rsplit(')')
                .next()
                .and_then(|r| r.split_whitespace().nth(1))
                .and_then(|v| v.parse::<i32>().ok());
            let line = std::fs::read(format!("/proc/{p}/cmdline"))
                .unwrap_or_default()
                .split(|b| *b == 0)
                .map(|w| String::from_utf8_lossy(w).into_owned())
                .collect::<Vec<_>>()
                .join(" ");
            ppid == Some(pid) && line.starts_with(cmdline)
        })
}

/// The new image refuses the state (`EXECD_TEST_REFUSE_STATE=1`): it hands it back to the
/// old one, which resumes with everything and answers the upgrade with the reason. The
/// state went through two images; the stream is still exact.
#[test]
fn a_state_the_new_image_refuses_is_handed_back_and_the_old_image_serves_on() {
    let dir = TempDir::new();
    let socket = dir.path().join("execd.sock");
    let mut cmd = Daemon::command(dir.path(), &socket, &[]);
    cmd.env("EXECD_TEST_REFUSE_STATE", "1");
    let d = Daemon::adopt(Some(cmd.spawn().expect("spawn execd")), socket, dir);
    let serving = Serving::start(&d);
    let own = PathBuf::from(env!("CARGO_BIN_EXE_execd"));
    refused(
        &d,
        &own,
        "the new image refused the state: EXECD_TEST_REFUSE_STATE=1 is set",
    );
    let log = d.log();
    assert!(log.contains("it was handed back to the old image"), "{log}");
    // The signal path is refused the same way.
    unsafe_kill(d.pid(), libc::SIGUSR2);
    wait_until("the second refusal is logged", || {
        d.log().matches("the new image refused the state").count() >= 2
    });
    serving.goes_on(&d);
}

/// Only the daemon's own uid and root may upgrade it: to anyone else the method does not
/// exist (-32002).
#[test]
fn a_caller_who_is_not_the_owner_may_not_upgrade() {
    if !running_as_root() {
        skip("connecting as another uid needs root");
        return;
    }
    let (d, _) = daemon(&["--socket-mode", "0666", "--allow-uid", "65534"]);
    d.let_others_in();
    let mut nobody = d.client_in_other_process_as(Some(65534));
    let (code, _, _) = err(&mut nobody, "daemon/upgrade", json!({}));
    assert_eq!(code, -32002);
    let mut c = d.client();
    assert_eq!(meta(&mut c)["upgrades"], 0);
    meta(&mut nobody);
}

/// The number of descriptors `pid` holds.
fn descriptors(pid: i32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| d.count())
        .unwrap_or(0)
}

/// Twenty upgrades in a row with commands and connections held: the descriptors and the
/// memory come back to where the first upgrade left them, no zombie is left, and SIGTERM
/// afterwards stops the daemon cleanly.
#[test]
fn twenty_upgrades_in_a_row_leave_nothing_behind() {
    let (mut d, _) = daemon(&[]);
    let pid = d.pid();
    let serving = Serving::start(&d);
    let mut c = d.client();
    let mut others: Vec<Client> = (0..5).map(|_| d.client()).collect();
    for o in others.iter_mut() {
        meta(o);
    }
    for i in 0..3 {
        create(&mut c, "sh", &["-c", &format!("echo {i}; sleep 60")]);
    }
    upgrade(&d, &mut c, Trigger::Signal, 0);
    let (fds, rss) = (descriptors(pid), d.rss_kb());
    for n in 1..20 {
        upgrade(&d, &mut c, Trigger::Execctl, n);
    }
    assert_eq!(meta(&mut c)["upgrades"], 20);
    // The new image's reader may not have reported its exec yet (its report pipe is open
    // until then): the count comes back once it has, a leak never does.
    let deadline = Instant::now() + WAIT;
    while descriptors(pid) != fds && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(descriptors(pid), fds, "descriptors after 20 upgrades");
    let now = d.rss_kb();
    assert!(
        now <= rss + rss / 2 + 2048,
        "RSS {now} KiB after 20 upgrades, {rss} KiB after the first"
    );
    // The old image's reader, killed just before the last swap, may be dying still: it
    // is reaped as it goes.
    wait_until("no zombie is left", || zombie_children(pid).is_empty());
    for o in others.iter_mut() {
        meta(o);
    }
    serving.goes_on(&d);
    assert_eq!(d.terminate(), Some(0), "a clean stop after the upgrades");
    assert!(!pid_alive(pid));
}

/// `--upgrade-check` says which states the binary takes, in one JSON line.
/// The off-loop reader does not cross an upgrade: the old image's is killed (and reaped
/// by the new image, no zombie), the new image starts its own, and a kill's cookie sweep
/// after the upgrade finds a command's escapee as before.
#[test]
fn the_new_image_runs_its_own_reader_and_sweeps_on() {
    let (d, _) = daemon(&[]);
    let mut c = d.client();
    let id = create(
        &mut c,
        "sh",
        &["-c", "setsid sleep 600 & echo $!; exec sleep 600"],
    );
    let mut escapee = None;
    wait_until("the escapee's pid", || {
        escapee = output(&mut c, &id)["output"]
            .as_str()
            .and_then(|o| o.lines().next()?.trim().parse::<i32>().ok());
        escapee.is_some()
    });
    let escapee = escapee.unwrap_or_default();
    let before = reader_of(d.pid()).expect("a reader runs");
    upgrade(&d, &mut c, Trigger::Signal, 0);
    wait_until("the new image's reader runs", || {
        reader_of(d.pid()).is_some_and(|r| r != before)
    });
    wait_until("the old reader is gone, reaped", || {
        !pid_alive(before) && zombie_children(d.pid()).is_empty()
    });
    ok(
        &mut c,
        "terminal/kill",
        json!({"sessionId": "s", "terminalId": id}),
    );
    wait_until("the escapee is swept", || !pid_alive(escapee));
}

#[test]
fn upgrade_check_prints_the_version_and_the_states_taken() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_execd"))
        .arg("--upgrade-check")
        .output()
        .expect("run execd --upgrade-check");
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).expect("UTF-8");
    assert_eq!(text.lines().count(), 1, "{text}");
    let v: Value = serde_json::from_str(&text).expect("JSON");
    assert_eq!(v["version"], env!("CARGO_PKG_VERSION"));
    assert!(v["states"].as_array().expect("states").contains(&json!(1)));
}

/// Under systemd the pid stays the MainPID: `RELOADING=1` with `MONOTONIC_USEC` when the
/// swap begins, `READY=1` when the new image serves.
#[test]
fn systemd_hears_reloading_then_ready() {
    let dir = TempDir::new();
    let notify = dir.path().join("notify");
    let rx = std::os::unix::net::UnixDatagram::bind(&notify).expect("bind");
    rx.set_read_timeout(Some(Duration::from_millis(200)))
        .expect("timeout");
    let socket = dir.path().join("execd.sock");
    let mut cmd = Daemon::command(dir.path(), &socket, &[]);
    cmd.env("NOTIFY_SOCKET", &notify);
    let d = Daemon::adopt(Some(cmd.spawn().expect("spawn execd")), socket, dir);
    let mut seen: Vec<String> = Vec::new();
    let until = |seen: &mut Vec<String>, what: &str| {
        let deadline = Instant::now() + WAIT;
        let mut buf = [0u8; 4096];
        while !seen.iter().any(|m| m.contains(what)) {
            assert!(Instant::now() < deadline, "no {what}: {seen:?}");
            if let Ok(n) = rx.recv(&mut buf) {
                seen.push(String::from_utf8_lossy(&buf[..n]).into_owned());
            }
        }
    };
    until(&mut seen, "READY=1");
    seen.clear();
    let mut c = d.client();
    upgrade(&d, &mut c, Trigger::Execctl, 0);
    until(&mut seen, "READY=1");
    let reloading = seen
        .iter()
        .position(|m| m.contains("RELOADING=1"))
        .unwrap_or_else(|| panic!("no RELOADING=1: {seen:?}"));
    let ready = seen
        .iter()
        .position(|m| m.contains("READY=1"))
        .expect("ready");
    assert!(reloading < ready, "{seen:?}");
    let usec: u64 = seen[reloading]
        .lines()
        .find_map(|l| l.strip_prefix("MONOTONIC_USEC="))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no MONOTONIC_USEC: {seen:?}"));
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes a timespec we own.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut now) };
    let now_usec = now.tv_sec as u64 * 1_000_000 + now.tv_nsec as u64 / 1000;
    assert!(usec <= now_usec && now_usec - usec < WAIT.as_micros() as u64);
}

/// The HTTP front end's TCP listener and a keep-alive connection on it carry over.
#[test]
fn tcp_listeners_and_their_connections_carry_over() {
    let dir = TempDir::new();
    let token = dir.path().join("token");
    std::fs::write(&token, "s3cret\n").expect("token");
    std::fs::set_permissions(&token, std::os::unix::fs::PermissionsExt::from_mode(0o600))
        .expect("chmod");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let listen = format!("127.0.0.1:{port}");
    let token_arg = token.display().to_string();
    let socket = dir.path().join("execd.sock");
    // Requests over TCP run as this test's own user (a root daemon must be told whom).
    let me = execd::current_uid().to_string();
    let d = Daemon::start_at(
        dir,
        socket,
        &[
            "--http-listen",
            &listen,
            "--http-token-file",
            &token_arg,
            "--http-run-as",
            &me,
        ],
    );
    let request = "GET /v1/bash/sessions HTTP/1.1\r\nHost: execd\r\n\
                   Authorization: Bearer s3cret\r\n\r\n";
    let ask = |s: &mut std::net::TcpStream| -> u16 {
        s.write_all(request.as_bytes()).expect("send");
        let mut buf = Vec::new();
        let mut chunk = [0u8; 4096];
        loop {
            if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = String::from_utf8_lossy(&buf[..i]).to_lowercase();
                let len: usize = head
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length:"))
                    .and_then(|v| v.trim().parse().ok())
                    .expect("length");
                while buf.len() < i + 4 + len {
                    let n = read_some(s, &mut chunk).expect("read");
                    assert!(n > 0, "closed mid-body");
                    buf.extend_from_slice(&chunk[..n]);
                }
                return String::from_utf8_lossy(&buf[9..12])
                    .parse()
                    .expect("status");
            }
            let n = read_some(s, &mut chunk).expect("read");
            assert!(n > 0, "closed before a head");
            buf.extend_from_slice(&chunk[..n]);
        }
    };
    let mut kept = std::net::TcpStream::connect(&listen).expect("connect");
    kept.set_read_timeout(Some(WAIT)).expect("timeout");
    assert_eq!(ask(&mut kept), 200);
    let mut c = d.client();
    upgrade(&d, &mut c, Trigger::Signal, 0);
    assert_eq!(ask(&mut kept), 200, "the same TCP connection");
    let mut fresh = std::net::TcpStream::connect(&listen).expect("connect again");
    fresh.set_read_timeout(Some(WAIT)).expect("timeout");
    assert_eq!(ask(&mut fresh), 200, "the listener");
    assert_no_panic(&d);
}

/// Commands in cgroups of their own carry over with them: nothing is swept as a
/// leftover, and a kill after the upgrade still ends the tree and removes its cgroup.
#[test]
fn commands_in_cgroups_carry_over() {
    let cg = match TestCgroup::new("upgrade") {
        Ok(cg) => cg,
        Err(why) => return skip(&why),
    };
    let d = Daemon::start(&["--cgroup", cg.path()]);
    let mut c = d.client();
    let id = create(&mut c, "sh", &["-c", "sleep 60 & sleep 60 & wait"]);
    wait_until("its cgroup holds the tree", || {
        cg.command_cgroups().iter().any(|p| {
            std::fs::read_to_string(p.join("cgroup.procs")).is_ok_and(|t| t.lines().count() >= 3)
        })
    });
    upgrade(&d, &mut c, Trigger::Signal, 0);
    let e = terminal_entry(&mut c, &id);
    assert!(e.get("exitStatus").is_none(), "the tree goes on: {e}");
    assert!(!d.log().contains("leftover"), "{}", d.log());
    assert_eq!(cg.command_cgroups().len(), 1);
    ok(
        &mut c,
        "terminal/kill",
        json!({"sessionId": "s", "terminalId": id}),
    );
    wait_until("its cgroup is removed", || cg.command_cgroups().is_empty());
    assert_no_panic(&d);
}

/// A new binary that answers the pre-flight but does not take the daemon's flags (a flag
/// its release dropped): it cannot parse them, hands the state back, and the old image,
/// taking its flags from the state it wrote, resumes with everything.
#[test]
fn a_new_image_that_does_not_take_the_flags_hands_the_state_back() {
    let (d, _) = daemon(&[]);
    let serving = Serving::start(&d);
    let script = d.dir.path().join("picky");
    let real = env!("CARGO_BIN_EXE_execd");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\ncase \"$1\" in --upgrade-check) exec '{real}' --upgrade-check ;; esac\n\
             exec '{real}' \"$@\" --no-such-flag\n"
        ),
    )
    .expect("write");
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .expect("chmod");
    refused(&d, &script, "the flags do not parse");
    assert!(d.log().contains("--no-such-flag"), "{}", d.log());
    // The old image still has its own flags: its policy asks, as before.
    let mut c = d.client();
    let (code, _, _) = err(
        &mut c,
        "bash/exec",
        json!({"command": "rm -f /nonexistent"}),
    );
    assert_eq!(code, -32006, "no approver: the policy is still in force");
    serving.goes_on(&d);
}

/// What the daemon remembers of the sessions it closed, and which sessions are one-shot,
/// carries over (PROTOCOL 8): after an upgrade a closed session still answers with its
/// notice, and a one-shot session is still the first to go to make room.
#[test]
fn closed_sessions_and_one_shot_sessions_carry_over() {
    let (d, _) = daemon(&["--max-sessions", "3"]);
    let mut c = d.client();
    for s in ["a", "b", "gone"] {
        ok(&mut c, "bash/sessions/create", json!({"session_id": s}));
    }
    // "gone" is closed to make room for a one-shot session ("a" is used again first).
    ok(&mut c, "bash/sessions/create", json!({"session_id": "a"}));
    ok(&mut c, "bash/sessions/create", json!({"session_id": "b"}));
    let r = ok(&mut c, "bash/exec", json!({"command": "true"}));
    let oneshot = r["session_id"].as_str().expect("session_id").to_string();
    upgrade(&d, &mut c, Trigger::Execctl, 0);
    let (code, _, data) = err(&mut c, "bash/output", json!({"session_id": "gone"}));
    assert_eq!(code, -32002);
    let notice = data.expect("data")["notice"]
        .as_str()
        .unwrap_or("")
        .to_string();
    assert!(
        notice.ends_with("(to make room at max-sessions 3)"),
        "{notice}"
    );
    // The one-shot session goes before the older named ones.
    ok(&mut c, "bash/sessions/create", json!({"session_id": "new"}));
    let l = ok(&mut c, "bash/sessions", json!({}));
    let ids: Vec<&str> = l
        .as_array()
        .expect("list")
        .iter()
        .filter_map(|s| s["session_id"].as_str())
        .collect();
    assert!(!ids.contains(&oneshot.as_str()), "{ids:?}");
    assert!(ids.contains(&"a") && ids.contains(&"b"), "{ids:?}");
    assert_no_panic(&d);
}

/// A shell session's command channel carries over as what it is, a socket the shell
/// cannot write into, with its terminal's path (PROTOCOL 12.2, 13): after the upgrade the
/// session's lines run on the same terminal, and a line still cannot put a command into
/// the channel through `/proc`.
#[test]
fn a_shell_sessions_channel_and_terminal_carry_over() {
    let d = Daemon::start(&[]);
    let mut c = d.client();
    let victim = d.dir.path().join("victim");
    std::fs::create_dir_all(&victim).expect("victim");
    let tty = |c: &mut Client| {
        let r = ok(c, "shell/exec", json!({"id": "door", "command": "tty"}));
        assert_eq!(r["status"], "completed", "{r}");
        r["output"].as_str().unwrap_or_default().trim().to_string()
    };
    let before = tty(&mut c);
    assert!(before.starts_with("/dev/pts/"), "{before}");
    upgrade(&d, &mut c, Trigger::Signal, 0);
    assert_eq!(tty(&mut c), before, "the same terminal, by its path");
    let attack = format!("echo 'rm -rf {}' > /proc/$$/fd/10", victim.display());
    ok(
        &mut c,
        "shell/exec",
        json!({"id": "door", "command": attack}),
    );
    let r = ok(
        &mut c,
        "shell/exec",
        json!({"id": "door", "command": "echo next"}),
    );
    assert_eq!(r["output"].as_str().map(str::trim), Some("next"), "{r}");
    assert!(
        victim.exists(),
        "a line wrote a command into the carried channel"
    );
}

/// Field `n` of `/proc/PID/stat` (1-based, as proc(5) counts).
fn stat_field(pid: i32, n: usize) -> Option<i64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = &stat[stat.rfind(')')? + 2..];
    after.split(' ').nth(n - 3)?.parse().ok()
}

/// The scheduling policy (0 normal, 2 `SCHED_RR`) and nice value of process `pid`.
fn sched_of(pid: i32) -> Option<(i64, i64)> {
    Some((stat_field(pid, 41)?, stat_field(pid, 19)?))
}

/// Where the daemon may (`may_raise_priority`), it runs the swap in real time (`SCHED_RR`),
/// so the new image does not queue for a CPU behind the clients it serves: raised while the
/// new image is paused before it rebuilds, kept while it catches up with what queued during
/// the pause, back to the normal policy and its nice once it has; and no command it starts
/// inherits it, not even one asked for during the pause and started as the new image
/// catches up. A refused upgrade puts it back too.
#[test]
fn the_swap_runs_at_a_raised_priority_and_puts_it_back() {
    if !may_raise_priority() {
        skip("real time for the swap needs root with CAP_SYS_NICE, nice 0 and SCHED_RR granted");
        return;
    }
    let (d, _audit) = daemon_with_env(&[], &[("EXECD_TEST_SWAP_PAUSE_MS", "1500")]);
    let pid = d.pid();
    let mut c = d.client();
    let before = sched_of(pid).expect("the daemon's policy and nice");
    assert_eq!(before.0, 0, "it runs under the normal policy");
    let policy_and_nice = json!({"command": "cut -d' ' -f19,41 /proc/self/stat"});
    // Connected and served before the upgrade: carried, not accepted by the new image.
    meta(&mut c);
    unsafe_kill(pid, libc::SIGUSR2);
    // Real time (SCHED_RR) for the swap, as the daemon may here.
    wait_until("the swap runs raised", || {
        sched_of(pid).is_some_and(|(policy, _)| policy == 2)
    });
    // Once the old image has handed over, the new one is paused before it rebuilds: this
    // waits in the socket, and is started in the new image's first turn, while it still
    // runs in real time.
    wait_until("the old image hands over", || {
        d.log().contains("upgrade: handing")
    });
    c.send("bash/exec", policy_and_nice.clone()).expect("send");
    let queued = read_response(&mut c);
    assert_eq!(
        queued["result"]["stdout"].as_str().map(str::trim),
        Some(format!("{} 0", before.1).as_str()),
        "a command started as the new image catches up: {queued}"
    );
    assert_eq!(meta(&mut c)["upgrades"], 1, "the new image serves");
    wait_until(
        "the priority is put back once the new image caught up",
        || sched_of(pid) == Some(before),
    );
    // It was kept into the new image's loop, and given back as it caught up.
    wait_until("the new image says when it gave real time back", || {
        d.log().contains("upgrade: real time given back after")
    });
    let log = d.log();
    let given = log
        .lines()
        .find(|l| l.contains("upgrade: real time given back after"))
        .unwrap_or_default();
    assert!(given.ends_with("(caught up)"), "{given}");
    let r = ok(&mut c, "bash/exec", policy_and_nice);
    assert_eq!(
        r["stdout"].as_str().map(str::trim),
        Some(format!("{} 0", before.1).as_str())
    );
    assert_no_panic(&d);
    // A new image that refuses the state hands it back: the old image puts its priority
    // back as it serves on.
    let dir = TempDir::new();
    let socket = dir.path().join("execd.sock");
    let mut cmd = Daemon::command(dir.path(), &socket, &[]);
    cmd.env("EXECD_TEST_REFUSE_STATE", "1");
    let d = Daemon::adopt(Some(cmd.spawn().expect("spawn execd")), socket, dir);
    let mut c = d.client();
    meta(&mut c);
    unsafe_kill(d.pid(), libc::SIGUSR2);
    wait_until("the refusal is logged", || {
        d.log().contains("the new image refused the state")
    });
    meta(&mut c);
    wait_until(
        "the old image puts its priority back once it caught up",
        || sched_of(d.pid()) == Some(before),
    );
    assert_no_panic(&d);
}
