//! The gate's subjects never operate the gate (PROTOCOL.md 7.3, 7.4, 8, 13), against the
//! real daemon: a process a command started (directly, through a `setsid` double fork, or
//! with its environment cleared) is never an approver and never upgrades the daemon, and
//! its SIGHUP and SIGUSR2 are ignored and audited; an upgrade's binary must be one nobody
//! else could have written; one uid's flood of denials loses only its own records and no
//! command runs unrecorded; approvers read invisible characters escaped; and two shared
//! uids cannot lock root out.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::util::*;

/// Asks for `rm`, denies `shutdown`, allows the rest.
const POLICY: &str = r#"{"default": "allow", "unparsed": "allow", "rules": [
    {"name": "rm", "pattern": ["rm"], "decision": "ask"},
    {"name": "no-shutdown", "pattern": ["shutdown"], "decision": "deny"}
]}"#;

const EXECCTL: &str = env!("CARGO_BIN_EXE_execctl");

/// A daemon with `POLICY`, an audit file and `extra` flags; its audit file's path.
fn daemon(extra: &[&str]) -> (Daemon, PathBuf) {
    with_policy(POLICY, extra)
}

fn audit_lines(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect()
}

/// Runs `line` as a command of the daemon (`bash/exec`, synchronous) and returns it.
#[track_caller]
fn run(c: &mut Client, line: &str) -> Value {
    let r = ok(c, "bash/exec", json!({"command": line, "timeout": 30}));
    assert_eq!(r["status"], "completed", "{r}");
    r
}

/// `execctl approve --json` as `how` starts it from a command of `d`: directly, through
/// a `setsid` double fork, or with `env -i`. Waits (bounded) for it to end; returns its
/// exit status and what it printed on stdout and stderr.
#[track_caller]
fn approver_run_by_a_command(d: &Daemon, c: &mut Client, how: &str) -> (String, String, String) {
    let out = d.dir.path().join(format!("approve-{how}"));
    let _ = std::fs::remove_file(out.with_extension("rc"));
    let approve = format!(
        "{EXECCTL} --socket {} --json approve </dev/null >{o}.out 2>{o}.err; echo $? >{o}.tmp; \
         mv {o}.tmp {o}.rc",
        d.socket.display(),
        o = out.display()
    );
    let line = match how {
        "direct" => approve,
        "double-fork" => {
            format!("(setsid sh -c '{approve}' </dev/null >/dev/null 2>&1 &) ; true")
        }
        "env-i" => format!("env -i /bin/sh -c '{approve}'"),
        _ => unreachable!(),
    };
    run(c, &line);
    let rc = out.with_extension("rc");
    wait_until("the approver ended", || rc.exists());
    let read = |ext: &str| std::fs::read_to_string(out.with_extension(ext)).unwrap_or_default();
    (read("rc").trim().to_string(), read("out"), read("err"))
}

/// An approver started by a command, however it left the command's tree, is refused
/// (`-32002`): with process groups it is found by its chain of parents, in cgroups by its
/// cgroup. One from outside still approves.
#[test]
fn an_approver_started_by_a_command_is_refused_however_it_detached() {
    let cg = match TestCgroup::new("subjects") {
        Ok(cg) => Some(cg),
        Err(why) => {
            skip(&why);
            None
        }
    };
    let mut modes = vec![vec!["--cgroup", "off"]];
    if let Some(cg) = &cg {
        modes.push(vec!["--cgroup", cg.path()]);
    }
    for flags in modes {
        let (d, audit) = daemon(&flags);
        let mut c = d.client();
        for how in ["direct", "double-fork", "env-i"] {
            let (rc, out, err) = approver_run_by_a_command(&d, &mut c, how);
            assert_ne!(rc, "0", "{flags:?} {how}: {out} {err}");
            assert!(
                !out.contains("ready"),
                "{flags:?} {how} became an approver: {out}"
            );
            assert!(
                err.contains("not for a process execd runs"),
                "{flags:?} {how}: {err}"
            );
        }
        let refusals: Vec<Value> = audit_lines(&audit)
            .into_iter()
            .filter(|r| r["event"] == "refuse" && r["method"] == "approvals/subscribe")
            .collect();
        assert_eq!(refusals.len(), 3, "{flags:?} {refusals:?}");
        if flags[1] != "off" {
            for r in &refusals {
                assert!(r["tie"].as_str().unwrap().ends_with("(cgroup)"), "{r}");
            }
        }
        // From outside, an approver it is.
        let mut a = d.client_in_other_process();
        ok(&mut a, "approvals/subscribe", json!({}));
        let id = c
            .send("bash/exec", json!({"command": "rm -f /nonexistent-x"}))
            .expect("send");
        let req = next_request(&mut a);
        let m = json!({"jsonrpc": "2.0", "id": req["id"],
            "result": {"request_id": req["id"], "response": "approve"}});
        a.send_line(m.to_string().as_bytes()).expect("answer");
        assert_eq!(
            c.wait_response(id).expect("approved")["status"],
            "completed"
        );
        assert_no_panic(&d);
    }
}

/// The attack: the agent runs `execctl approve --json` through execd and answers its own
/// asks with `bash/write`. The approver is refused, so the ask finds no approver and the
/// victim stays.
#[test]
fn an_agent_cannot_answer_its_own_asks_through_an_approver_it_runs() {
    let (d, _) = daemon(&["--cgroup", "off"]);
    let victim = d.dir.path().join("victim");
    std::fs::create_dir_all(victim.join("inside")).expect("victim");
    let mut agent = d.client();
    let started = ok(
        &mut agent,
        "bash/exec",
        json!({"command": format!("{EXECCTL} --socket {} --json approve", d.socket.display()),
               "session_id": "agent", "async_mode": true}),
    );
    let approver = started["command_id"].as_str().expect("id").to_string();
    let look = |c: &mut Client| {
        ok(
            c,
            "bash/output",
            json!({"session_id": "agent", "command_id": approver}),
        )
    };
    // It either subscribed (says `ready`) or was refused and ended.
    wait_until("the approver subscribed or ended", || {
        let o = look(&mut agent);
        o["stdout"].as_str().unwrap_or("").contains("ready") || o["command"]["status"] != "running"
    });
    let mut asker = d.client();
    let ask = asker
        .send(
            "bash/exec",
            json!({"command": format!("rm -rf {}", victim.display())}),
        )
        .expect("send");
    // Were it an approver, the request would reach it: answer it as the agent would.
    let deadline = std::time::Instant::now() + Duration::from_secs(3);
    while std::time::Instant::now() < deadline {
        let o = look(&mut agent);
        let text = o["stdout"].as_str().unwrap_or("").to_string();
        if let Some(req) = text
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .find(|v| v["type"] == "approval_request")
        {
            let answer = json!({"request_id": req["request_id"], "response": "approve"});
            ok(
                &mut agent,
                "bash/write",
                json!({"session_id": "agent", "command_id": approver,
                       "input": format!("{answer}\n")}),
            );
            break;
        }
        if o["command"]["status"] != "running" {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    match asker.wait_response(ask) {
        Err(CallError::Rpc { code, data, .. }) => {
            assert_eq!(code, -32006);
            assert_eq!(data.expect("data")["reason"], "no approver");
        }
        other => panic!("the agent's own ask went through: {other:?}"),
    }
    assert!(victim.join("inside").exists(), "the victim is gone");
}

/// `execctl upgrade` run by a command is refused, and the daemon does not change.
#[test]
fn a_command_never_upgrades_the_daemon() {
    let (d, audit) = daemon(&["--cgroup", "off"]);
    let mut c = d.client();
    let r = run(
        &mut c,
        &format!("{EXECCTL} --socket {} upgrade", d.socket.display()),
    );
    assert_eq!(r["exit_code"], 1, "{r}");
    assert!(
        r["stderr"]
            .as_str()
            .unwrap()
            .contains("not for a process execd runs"),
        "{r}"
    );
    let init = ok(&mut c, "initialize", json!({"protocolVersion": 1}));
    assert_eq!(init["_meta"]["execd"]["upgrades"], 0);
    let records = audit_lines(&audit);
    assert!(records
        .iter()
        .any(|r| r["event"] == "refuse" && r["method"] == "daemon/upgrade"));
    assert!(!records.iter().any(|r| r["event"] == "upgrade"));
}

/// The attack: under a policy that denies everything, `daemon/upgrade` named a script in
/// a directory anyone may write, and the pre-flight ran it. It is refused before it runs
/// (`-32602` naming `binary`): its marker never appears, and the record names who asked.
#[test]
fn an_upgrade_binary_others_could_write_is_never_run() {
    let dir = TempDir::new();
    let policy = dir.path().join("policy.json");
    std::fs::write(&policy, r#"{"default": "deny", "rules": []}"#).expect("policy");
    let audit = dir.path().join("audit.jsonl");
    let socket = dir.path().join("execd.sock");
    let flags = [
        "--policy",
        policy.to_str().unwrap(),
        "--audit",
        audit.to_str().unwrap(),
    ];
    let d = Daemon::start_at(dir, socket, &flags);
    let open = d.dir.path().join("open");
    std::fs::create_dir(&open).expect("mkdir");
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).expect("chmod");
    let marker = d.dir.path().join("ran");
    let script = open.join("script");
    std::fs::write(
        &script,
        format!("#!/bin/sh\necho ran > {}\n", marker.display()),
    )
    .expect("write");
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let mut c = d.client();
    let (code, message, data) = err(&mut c, "daemon/upgrade", json!({"binary": script}));
    assert_eq!(code, -32602, "{message}");
    assert_eq!(data.expect("data")["field"], "binary");
    assert!(message.contains("may write"), "{message}");
    std::thread::sleep(Duration::from_millis(200));
    assert!(!marker.exists(), "the script ran");
    let failed = audit_lines(&audit)
        .into_iter()
        .find(|r| r["event"] == "upgrade_failed")
        .expect("upgrade_failed");
    assert_eq!(failed["peer"]["pid"], std::process::id());
    // The same script in a directory only root may write is run (and refused for not
    // answering as execd does).
    let safe = d.dir.path().join("safe");
    std::fs::create_dir(&safe).expect("mkdir");
    std::fs::set_permissions(&safe, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    std::fs::rename(&script, safe.join("script")).expect("move");
    let (code, message, _) = err(
        &mut c,
        "daemon/upgrade",
        json!({"binary": safe.join("script")}),
    );
    assert_eq!(code, -32000, "{message}");
    assert!(marker.exists(), "a binary in a safe place is run");
}

/// SIGHUP and SIGUSR2 sent by a command are ignored, logged and audited as `refuse
/// {signal, pid}`; sent from outside they still reload and upgrade, and the upgrade's
/// record names the signal and its sender.
#[test]
fn signals_from_a_command_are_ignored_and_from_outside_still_work() {
    let (d, audit) = daemon(&["--cgroup", "off"]);
    let mut c = d.client();
    let pid = d.pid();
    run(&mut c, &format!("kill -HUP {pid}; kill -USR2 {pid}"));
    wait_until("both refusals audited", || {
        audit_lines(&audit)
            .iter()
            .filter(|r| r["event"] == "refuse" && r.get("signal").is_some())
            .count()
            == 2
    });
    let records = audit_lines(&audit);
    let refused: Vec<&Value> = records
        .iter()
        .filter(|r| r["event"] == "refuse" && r.get("signal").is_some())
        .collect();
    assert_eq!(refused[0]["signal"], "SIGHUP");
    assert_eq!(refused[1]["signal"], "SIGUSR2");
    assert!(refused[0]["pid"].as_i64().unwrap() > 0);
    assert!(!records.iter().any(|r| r["event"] == "policy_reload"));
    let log = d.log();
    assert!(log.contains("SIGHUP from pid"), "{log}");
    let init = ok(&mut c, "initialize", json!({"protocolVersion": 1}));
    assert_eq!(init["_meta"]["execd"]["upgrades"], 0);
    // From outside: reloaded, and upgraded.
    unsafe_kill(pid, libc::SIGHUP);
    wait_until("the reload", || {
        audit_lines(&audit)
            .iter()
            .any(|r| r["event"] == "policy_reload")
    });
    unsafe_kill(pid, libc::SIGUSR2);
    wait_until("the upgrade", || {
        audit_lines(&audit).iter().any(|r| r["event"] == "upgrade")
    });
    let up = audit_lines(&audit)
        .into_iter()
        .find(|r| r["event"] == "upgrade")
        .expect("upgrade");
    assert_eq!(up["signal"], "SIGUSR2");
    assert_eq!(up["pid"], std::process::id());
    assert_no_panic(&d);
}

/// Signals whose sender the daemon cannot know are never acted on: a queued one (its pid
/// is the sender's to write, here the test's own, from outside) and one raised by I/O on
/// a descriptor a command gave the daemon as owner (`F_SETOWN` + `F_SETSIG`).
#[test]
fn queued_and_io_raised_signals_are_never_acted_on() {
    let (d, audit) = daemon(&["--cgroup", "off"]);
    let mut c = d.client();
    let pid = d.pid();
    // SAFETY: sigqueue with a plain value to the daemon this test started.
    let r = unsafe {
        libc::sigqueue(
            pid,
            libc::SIGUSR2,
            libc::sigval {
                sival_ptr: std::ptr::null_mut(),
            },
        )
    };
    assert_eq!(r, 0, "sigqueue: {}", std::io::Error::last_os_error());
    if have(&["python3"]) {
        let line = format!(
            "python3 -c 'import fcntl, os, signal, time\n\
             r, w = os.pipe()\n\
             fcntl.fcntl(r, fcntl.F_SETOWN, {pid})\n\
             fcntl.fcntl(r, 10, signal.SIGHUP)\n\
             fcntl.fcntl(r, fcntl.F_SETFL, fcntl.fcntl(r, fcntl.F_GETFL) | os.O_ASYNC)\n\
             os.write(w, b\"x\")\n\
             time.sleep(0.2)'"
        );
        run(&mut c, &line);
    }
    let want = if have(&["python3"]) { 2 } else { 1 };
    wait_until("the refusals audited", || {
        audit_lines(&audit)
            .iter()
            .filter(|r| r["event"] == "refuse" && r["why"] == "not sent by kill")
            .count()
            >= want
    });
    let init = ok(&mut c, "initialize", json!({"protocolVersion": 1}));
    assert_eq!(init["_meta"]["execd"]["upgrades"], 0);
    let records = audit_lines(&audit);
    assert!(
        !records.iter().any(|r| r["event"] == "policy_reload"),
        "{records:?}"
    );
    assert!(d.log().contains("not sent by kill"));
    assert_no_panic(&d);
}

/// A FIFO as the audit target, opened for reading but not read: the daemon's records
/// wait in its queue.
struct StalledAudit {
    reader: std::fs::File,
    text: Vec<u8>,
}

impl StalledAudit {
    fn new(fifo: &Path) -> StalledAudit {
        use std::os::unix::fs::OpenOptionsExt;
        let reader = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(fifo)
            .expect("open fifo");
        // The smallest pipe: what the daemon waits to write stays in its queue.
        use std::os::fd::AsRawFd;
        // SAFETY: F_SETPIPE_SZ on a descriptor we own, with a plain size.
        unsafe { libc::fcntl(reader.as_raw_fd(), libc::F_SETPIPE_SZ, 4096) };
        StalledAudit {
            reader,
            text: Vec::new(),
        }
    }

    /// Reads what is there; with `until`, until a record holds it (poking the daemon's
    /// loop with `c` meanwhile).
    fn drain(&mut self, c: &mut Client, until: impl Fn(&Value) -> bool) -> Vec<Value> {
        let mut buf = vec![0u8; 1 << 16];
        wait_until("the audit record", || {
            let _ = ok(c, "terminal/list", json!({}));
            while let Ok(n) = self.reader.read(&mut buf) {
                if n == 0 {
                    break;
                }
                self.text.extend_from_slice(&buf[..n]);
            }
            self.records().iter().any(&until)
        });
        self.records()
    }

    fn records(&self) -> Vec<Value> {
        String::from_utf8_lossy(&self.text)
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }
}

/// The attack: one uid's 900 KB denied lines grew the audit by hundreds of MB and made
/// `dropped` records that lost other users' records. Now every record is at most 16 KiB,
/// the flooding uid holds at most half of the queue while the target stalls and loses only
/// its own records (`dropped {count, uid}`), another uid's denial and root's commands are
/// recorded, and once the queue is full no command starts unrecorded (`-32003` `audit`).
#[test]
fn a_flood_from_one_uid_loses_only_its_own_records_and_nothing_runs_unrecorded() {
    if !running_as_root() {
        skip("connecting as other uids needs root");
        return;
    }
    let dir = TempDir::new();
    let policy = dir.path().join("policy.json");
    std::fs::write(&policy, POLICY).expect("write policy");
    let fifo = dir.path().join("audit.fifo");
    let path = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: a valid path for mkfifo(3).
    assert_eq!(unsafe { libc::mkfifo(path.as_ptr(), 0o600) }, 0);
    let socket = dir.path().join("execd.sock");
    let flags = [
        "--policy",
        policy.to_str().unwrap(),
        "--audit",
        fifo.to_str().unwrap(),
        "--socket-mode",
        "0666",
        "--allow-uid",
        "65534",
        "--allow-uid",
        "65533",
    ];
    let d = Daemon::start_at(dir, socket, &flags);
    d.let_others_in();
    let mut audit = StalledAudit::new(&fifo);
    let mut flood = d.client_in_other_process_as(Some(65534));
    // Each of these makes a record of 16 KiB: half of the 1 MiB queue holds 32.
    let huge = format!("shutdown {}", "x".repeat(100 << 10));
    const FLOOD: u64 = 60;
    for _ in 0..FLOOD {
        let (code, _, _) = err(&mut flood, "bash/exec", json!({"command": huge}));
        assert_eq!(code, -32005);
    }
    let mut other = d.client_in_other_process_as(Some(65533));
    let (code, _, _) = err(&mut other, "bash/exec", json!({"command": "shutdown now"}));
    assert_eq!(code, -32005);
    // Root's commands run and are recorded while its own denials fill the rest; once
    // nothing more fits, a command is refused rather than run unrecorded.
    let mut root = d.client();
    let mut ran = Vec::new();
    let mut refused = None;
    for _ in 0..200 {
        match root.call("bash/exec", json!({"command": "true"})) {
            Ok(r) => ran.push(r["command_id"].as_str().unwrap().to_string()),
            Err(CallError::Rpc { code, data, .. }) => {
                refused = Some((code, data));
                break;
            }
            Err(e) => panic!("{e:?}"),
        }
        let _ = err(&mut root, "bash/exec", json!({"command": huge}));
    }
    assert!(!ran.is_empty());
    let (code, data) = refused.expect("a start refused for want of audit room");
    assert_eq!(code, -32003);
    assert_eq!(data.expect("data")["limit"], "audit");
    // The target takes records again: everything that happened is there.
    let records = audit.drain(&mut root, |r| r["event"] == "dropped" && r["uid"] == 65534);
    for r in &records {
        assert!(r.to_string().len() <= 16 << 10, "{:.200}", r.to_string());
    }
    let of = |uid: u32, event: &str| {
        records
            .iter()
            .filter(|r| r["peer"]["uid"] == uid && r["event"] == event)
            .count() as u64
    };
    let dropped: u64 = records
        .iter()
        .filter(|r| r["event"] == "dropped" && r["uid"] == 65534)
        .map(|r| r["count"].as_u64().unwrap())
        .sum();
    assert!(dropped > 0 && of(65534, "deny") <= 32, "its half, no more");
    assert_eq!(
        of(65534, "deny") + dropped,
        FLOOD,
        "what it lost is counted"
    );
    assert_eq!(of(65533, "deny"), 1, "another uid's record is kept");
    let denied = records
        .iter()
        .find(|r| r["peer"]["uid"] == 65534 && r["event"] == "deny")
        .expect("a deny of the flood");
    assert_eq!(denied["line_bytes"], huge.len());
    for id in &ran {
        assert!(
            records
                .iter()
                .any(|r| r["event"] == "start" && r["id"] == *id),
            "{id} ran unrecorded"
        );
    }
    assert_no_panic(&d);
}

/// Two paths that look alike read apart: the daemon escapes U+200B and U+FEFF in the
/// display texts, and `execctl approve` (human and `--json`) prints them escaped.
#[test]
fn invisible_characters_are_escaped_for_approvers() {
    let (d, _) = daemon(&[]);
    let mut approve = Command::new(EXECCTL)
        .arg("--socket")
        .arg(&d.socket)
        .arg("approve")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("execctl approve");
    let errs = lines_of(approve.stderr.take().expect("stderr"));
    errs.recv_timeout(WAIT).expect("approve is ready");
    let mut wire = d.client_in_other_process();
    ok(&mut wire, "approvals/subscribe", json!({}));
    let mut c = d.client();
    let target = "/tmp/a\u{200b}b";
    let id = c
        .send(
            "terminal/create",
            json!({"sessionId": "s", "command": "rm", "args": ["-rf", target, "\u{feff}c"]}),
        )
        .expect("send");
    let req = next_request(&mut wire);
    let texts: Vec<String> = req["params"]["payload"]["display"]
        .as_array()
        .expect("display")
        .iter()
        .filter_map(|b| b["text"].as_str().map(str::to_string))
        .collect();
    let all = texts.join("\n");
    assert!(all.contains(r"/tmp/a\u{200b}b"), "{all}");
    assert!(all.contains(r"\u{feff}c"), "{all}");
    assert!(!all.contains(['\u{200b}', '\u{feff}']), "{all}");
    assert!(
        req["params"]["payload"]["description"]
            .as_str()
            .unwrap()
            .contains(target),
        "the description is the exact line"
    );
    // execctl approve shows it escaped.
    let mut out = approve.stdout.take().expect("stdout");
    let mut shown = Vec::new();
    let mut buf = [0u8; 4096];
    let deadline = std::time::Instant::now() + WAIT;
    while !String::from_utf8_lossy(&shown).contains("[y]es") {
        assert!(std::time::Instant::now() < deadline, "no prompt");
        let n = read_some(&mut out, &mut buf).expect("read");
        assert!(n > 0, "execctl approve ended");
        shown.extend_from_slice(&buf[..n]);
    }
    let shown = String::from_utf8_lossy(&shown).to_string();
    assert!(shown.contains(r"/tmp/a\u{200b}b"), "{shown}");
    assert!(shown.contains(r"\u{feff}c"), "{shown}");
    assert!(!shown.contains(['\u{200b}', '\u{feff}']), "{shown}");
    let mut input = approve.stdin.take().expect("stdin");
    input.write_all(b"n\n\n").expect("reject");
    drop(input);
    match c.wait_response(id) {
        Err(CallError::Rpc { code, .. }) => assert_eq!(code, -32006),
        other => panic!("{other:?}"),
    }
    let _ = approve.kill();
    let _ = approve.wait();
    // --json: the same characters as JSON escapes, the value unchanged.
    let mut json_approve = Command::new(EXECCTL)
        .arg("--socket")
        .arg(&d.socket)
        .args(["--json", "approve"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("execctl approve --json");
    let lines = lines_of(json_approve.stdout.take().expect("stdout"));
    assert!(lines.recv_timeout(WAIT).expect("ready").contains("ready"));
    let id = c
        .send(
            "terminal/create",
            json!({"sessionId": "s", "command": "rm", "args": ["-rf", target]}),
        )
        .expect("send");
    let line = lines.recv_timeout(WAIT).expect("the request");
    assert!(line.contains(r"\u200b"), "{line}");
    assert!(!line.contains('\u{200b}'), "{line}");
    let v: Value = serde_json::from_str(&line).expect("JSON");
    assert!(v["command"].as_str().unwrap().contains(target));
    let _ = next_request(&mut wire);
    let answer = json!({"request_id": v["request_id"], "response": "reject"});
    json_approve
        .stdin
        .as_mut()
        .expect("stdin")
        .write_all(format!("{answer}\n").as_bytes())
        .expect("answer");
    match c.wait_response(id) {
        Err(CallError::Rpc { code, .. }) => assert_eq!(code, -32006),
        other => panic!("{other:?}"),
    }
    let _ = json_approve.kill();
    let _ = json_approve.wait();
}

/// Two shared uids together hold at most seven eighths of `--max-processes`: root still
/// starts a command.
#[test]
fn two_shared_uids_cannot_lock_root_out() {
    if !running_as_root() {
        skip("connecting as other uids needs root");
        return;
    }
    let (d, _) = daemon(&[
        "--max-processes",
        "8",
        "--socket-mode",
        "0666",
        "--allow-uid",
        "65534",
        "--allow-uid",
        "65533",
    ]);
    d.let_others_in();
    let mut started = 0;
    let mut refusals = Vec::new();
    // Their connections stay open (and their commands run) while root tries.
    let mut held = Vec::new();
    for uid in [65534, 65533] {
        let mut c = d.client_in_other_process_as(Some(uid));
        for _ in 0..5 {
            let create = json!({"sessionId": "s", "command": "sleep", "args": ["30"]});
            match c.call("terminal/create", create) {
                Ok(_) => started += 1,
                Err(CallError::Rpc { code, data, .. }) => {
                    assert_eq!(code, -32003);
                    refusals.push((uid, data.expect("data")["limit"].clone()));
                }
                Err(e) => panic!("{e:?}"),
            }
        }
        held.push(c);
    }
    assert_eq!(started, 7, "{refusals:?}");
    assert!(
        refusals.contains(&(65534, json!("max-processes-per-uid"))),
        "{refusals:?}"
    );
    assert!(
        refusals.contains(&(65533, json!("max-processes-shared"))),
        "{refusals:?}"
    );
    let mut root = d.client();
    let id = create(&mut root, "true", &[]);
    assert_eq!(wait_exit(&mut root, &id)["exitCode"], 0);
    drop(held);
}
