//! Who a Unix peer is (PROTOCOL.md sections 1, 7 and 8): the supplementary groups it
//! holds when it connects, not those of its user entry, decide `--allow-gid`, policy rules
//! keyed on `gids`, and the groups its commands run with under a root daemon.

use std::os::unix::process::CommandExt;
use std::path::Path;

use crate::util::*;

/// A group no user entry lists.
const HELD: u32 = 4242;

/// `execctl call METHOD PARAMS` as uid and gid 65534 holding `groups`; returns its
/// output.
fn call_as_nobody_with(
    socket: &Path,
    groups: &[u32],
    method: &str,
    params: Value,
) -> std::process::Output {
    let groups: Vec<libc::gid_t> = groups.to_vec();
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_execctl"));
    cmd.arg("--socket")
        .arg(socket)
        .args(["call", method, &params.to_string()])
        .stdin(std::process::Stdio::null());
    // SAFETY: setgroups, setgid and setuid are async-signal-safe and touch nothing of the
    // parent's; the groups go first, while the child may still set them.
    unsafe {
        cmd.pre_exec(move || {
            if libc::setgroups(groups.len(), groups.as_ptr()) != 0
                || libc::setgid(65534) != 0
                || libc::setuid(65534) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    cmd.output().expect("run execctl as nobody")
}

#[test]
fn a_peer_s_held_groups_admit_it_judge_it_and_are_what_its_commands_get() {
    if !running_as_root() {
        return skip("needs root to connect as another uid");
    }
    let dir = TempDir::new();
    let policy = dir.path().join("policy.json");
    std::fs::write(
        &policy,
        format!(
            r#"{{"default": "allow", "rules": [
                {{"name": "held-group", "pattern": ["touch"], "decision": "deny",
                  "gids": [{HELD}]}}]}}"#
        ),
    )
    .expect("write the policy");
    let socket = dir.path().join("execd.sock");
    let policy = policy.display().to_string();
    let held = HELD.to_string();
    let d = Daemon::start_at(
        dir,
        socket,
        &[
            "--socket-mode",
            "0666",
            "--allow-gid",
            &held,
            "--policy",
            &policy,
        ],
    );
    d.let_others_in();

    // Holding the group: admitted by it, its commands hold exactly what it holds.
    let out = call_as_nobody_with(
        &d.socket,
        &[65534, HELD],
        "bash/exec",
        json!({"command": "id -u; id -G", "exec_dir": "/tmp"}),
    );
    assert!(out.status.success(), "{out:?}");
    let r: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(r["stdout"], format!("65534\n65534 {HELD}\n"), "{r}");
    // A rule keyed on a group it holds (not its primary one) applies to it.
    let out = call_as_nobody_with(
        &d.socket,
        &[65534, HELD],
        "bash/exec",
        json!({"command": "touch /tmp/never", "exec_dir": "/tmp"}),
    );
    assert!(!out.status.success(), "denied");
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(text.contains("held-group"), "{text}");

    // Without the group it is not allowed in at all.
    let out = call_as_nobody_with(&d.socket, &[65534], "bash/sessions", json!({}));
    assert!(!out.status.success(), "{out:?}");
    assert!(
        d.log().contains("peer not allowed"),
        "the refusal is logged: {}",
        d.log()
    );
}

#[test]
fn a_user_the_daemon_keeps_out_is_told_it_runs_and_who_may_connect() {
    if !running_as_root() {
        return skip("needs root to connect as another uid");
    }
    use crate::util::cli::{command, run_cmd};
    // The socket's mode keeps nobody out (EACCES), or the daemon, reached, closes the
    // connection at once (SO_PEERCRED): either way the daemon runs, and nobody is told
    // who may come in, not to start one.
    for (extra, said) in [
        (&[][..], "execd's socket at "),
        (
            &["--socket-mode", "0666"][..],
            "closed the connection before answering: it runs, but does not let uid 65534 in",
        ),
    ] {
        let d = Daemon::start(extra);
        d.let_others_in();
        for args in [&["status"][..], &["run", "true"], &["approve"]] {
            let mut cmd = command(Some(&d.socket), args);
            as_nobody(&mut cmd);
            let o = run_cmd(cmd);
            assert_eq!(o.code, Some(125), "{extra:?} {args:?}: {o:?}");
            assert_eq!(o.stderr.lines().count(), 1, "{o:?}");
            assert!(o.stderr.contains(said), "{extra:?} {args:?}: {o:?}");
            assert!(o.stderr.contains("--allow-uid 65534"), "{o:?}");
            assert!(!o.stderr.contains("start it with"), "{o:?}");
        }
    }
}
