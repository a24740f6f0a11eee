//! Living under systemd (PROTOCOL.md sections 1 and 10): the variables of its protocol
//! never reach a command.

use std::process::{Command, Stdio};

use crate::util::*;

/// Started with `NOTIFY_SOCKET`, `LISTEN_*` and `WATCHDOG_*` set (for another pid, so
/// they are not meant for it), the daemon hands none of them to a command; other
/// variables pass as before.
#[test]
fn systemd_variables_never_reach_a_command() {
    let dir = TempDir::new();
    let socket = dir.path().join("execd.sock");
    let log = std::fs::File::create(dir.path().join("log")).expect("log");
    let mut child = Command::new(env!("CARGO_BIN_EXE_execd"))
        .arg("--socket")
        .arg(&socket)
        .env("NOTIFY_SOCKET", dir.path().join("notify"))
        .env("LISTEN_PID", "1")
        .env("LISTEN_FDS", "1")
        .env("LISTEN_FDNAMES", "execd.socket")
        .env("WATCHDOG_PID", "1")
        .env("WATCHDOG_USEC", "30000000")
        .env("EXECD_TEST_KEEP", "kept")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::from(log))
        .spawn()
        .expect("spawn execd");
    let d = Daemon::adopt(None, socket.clone(), dir);
    let mut c = d.client();
    let id = create(&mut c, "env", &[]);
    wait_exit(&mut c, &id);
    let env = output(&mut c, &id)["output"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let r = ok(&mut c, "bash/exec", json!({"command": "env"}));
    let bash_env = r["stdout"].as_str().unwrap_or_default().to_string();
    unsafe_kill(child.id() as i32, libc::SIGTERM);
    let _ = child.wait();
    for text in [&env, &bash_env] {
        assert!(text.contains("EXECD_TEST_KEEP=kept"), "{text}");
        for var in [
            "NOTIFY_SOCKET",
            "LISTEN_PID",
            "LISTEN_FDS",
            "LISTEN_FDNAMES",
            "WATCHDOG_PID",
            "WATCHDOG_USEC",
        ] {
            assert!(
                !text.lines().any(|l| l.starts_with(&format!("{var}="))),
                "{var} reached a command: {text}"
            );
        }
    }
}

/// Reads datagrams from `rx` until `pred` holds for one; returns every message seen.
#[track_caller]
fn notifications_until(
    rx: &std::os::unix::net::UnixDatagram,
    pred: impl Fn(&str) -> bool,
) -> Vec<String> {
    let mut seen = Vec::new();
    let deadline = std::time::Instant::now() + WAIT;
    let mut buf = vec![0u8; 4096];
    loop {
        assert!(
            std::time::Instant::now() < deadline,
            "timed out; notifications so far: {seen:?}"
        );
        rx.set_read_timeout(Some(std::time::Duration::from_millis(200)))
            .expect("timeout");
        if let Ok(n) = rx.recv(&mut buf) {
            let msg = String::from_utf8_lossy(&buf[..n]).to_string();
            let done = pred(&msg);
            seen.push(msg);
            if done {
                return seen;
            }
        }
    }
}

/// Starts execd with `NOTIFY_SOCKET` (and `WATCHDOG_USEC`) set.
fn notified_daemon(dir: TempDir, notify: &str, watchdog_usec: Option<&str>) -> Daemon {
    let socket = dir.path().join("execd.sock");
    let log = std::fs::File::create(dir.path().join("execd.log")).expect("log");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_execd"));
    cmd.arg("--socket")
        .arg(&socket)
        .env("NOTIFY_SOCKET", notify)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::from(log));
    if let Some(us) = watchdog_usec {
        cmd.env("WATCHDOG_USEC", us);
    }
    let child = cmd.spawn().expect("spawn execd");
    Daemon::adopt(Some(child), socket, dir)
}

/// sd_notify without libsystemd: READY=1 once it accepts, STATUS= with counts as they
/// change, WATCHDOG=1 while the loop turns, STOPPING=1 when shutdown begins; and the
/// variables never reach a command.
#[test]
fn readiness_status_watchdog_and_stopping_reach_notify_socket() {
    let dir = TempDir::new();
    let path = dir.path().join("notify");
    let rx = std::os::unix::net::UnixDatagram::bind(&path).expect("bind");
    let mut d = notified_daemon(dir, path.to_str().unwrap(), Some("400000"));
    let seen = notifications_until(&rx, |m| m.contains("READY=1"));
    assert!(seen.iter().any(|m| m.contains("STATUS=")), "{seen:?}");
    // Two watchdog pings (every 200 ms, half of WATCHDOG_USEC).
    notifications_until(&rx, |m| m == "WATCHDOG=1");
    notifications_until(&rx, |m| m == "WATCHDOG=1");
    // A client and a running command change the status.
    let mut c = d.client();
    let id = create(&mut c, "sleep", &["30"]);
    notifications_until(&rx, |m| m.contains("STATUS=1 client(s), 1 running"));
    // Commands do not see the variables.
    let env = create(&mut c, "env", &[]);
    wait_exit(&mut c, &env);
    let text = output(&mut c, &env)["output"]
        .as_str()
        .unwrap_or("")
        .to_string();
    assert!(
        !text.contains("NOTIFY_SOCKET") && !text.contains("WATCHDOG_USEC"),
        "{text}"
    );
    let _ = id;
    unsafe_kill(d.pid(), libc::SIGTERM);
    notifications_until(&rx, |m| m.contains("STOPPING=1"));
    assert_eq!(d.terminate(), Some(0));
}

/// `STATUS=` goes with `READY=1` and then only when the counts change: the first turns
/// of the loop send no second copy of the same status (it was sent twice in the same
/// second at start).
#[test]
fn status_is_not_repeated_at_start() {
    let dir = TempDir::new();
    let path = dir.path().join("notify");
    let rx = std::os::unix::net::UnixDatagram::bind(&path).expect("bind");
    let d = notified_daemon(dir, path.to_str().unwrap(), Some("400000"));
    let mut seen = notifications_until(&rx, |m| m.contains("READY=1"));
    // Two watchdog pings: the loop has turned, and its status would have gone out.
    seen.extend(notifications_until(&rx, |m| m == "WATCHDOG=1"));
    seen.extend(notifications_until(&rx, |m| m == "WATCHDOG=1"));
    let statuses: Vec<&str> = seen
        .iter()
        .filter_map(|m| m.lines().find_map(|l| l.strip_prefix("STATUS=")))
        .collect();
    assert!(!statuses.is_empty(), "{seen:?}");
    assert!(
        seen.iter()
            .find(|m| m.contains("STATUS="))
            .is_some_and(|m| m.contains("READY=1")),
        "the first status rides with READY=1: {seen:?}"
    );
    for pair in statuses.windows(2) {
        assert_ne!(pair[0], pair[1], "the same status twice: {seen:?}");
    }
    drop(d);
}

/// An abstract (`@name`) notification socket works too.
#[test]
fn readiness_reaches_an_abstract_notify_socket() {
    use std::os::linux::net::SocketAddrExt;
    let name = format!("execd-test-notify-{}", std::process::id());
    let addr = std::os::unix::net::SocketAddr::from_abstract_name(&name).expect("addr");
    let rx = std::os::unix::net::UnixDatagram::bind_addr(&addr).expect("bind");
    let d = notified_daemon(TempDir::new(), &format!("@{name}"), None);
    notifications_until(&rx, |m| m.contains("READY=1"));
    drop(d);
}

/// Socket activation checks fd 3 before trusting it: a file that is not a listening
/// socket makes execd refuse to start, saying so.
#[test]
fn an_activated_fd_that_is_not_a_listening_socket_is_refused() {
    use std::os::unix::process::CommandExt;
    let dir = TempDir::new();
    let file = std::fs::File::create(dir.path().join("not-a-socket")).expect("file");
    let fd = std::os::fd::AsRawFd::as_raw_fd(&file);
    let mut cmd = Command::new("sh");
    cmd.args([
        "-c",
        "LISTEN_PID=$$ LISTEN_FDS=1 exec \"$0\"",
        env!("CARGO_BIN_EXE_execd"),
    ])
    .stdin(Stdio::null())
    .stdout(Stdio::null())
    .stderr(Stdio::piped());
    // SAFETY: dup2 and fcntl are async-signal-safe; in the child before exec, on
    // descriptors it owns, they put the file on fd 3 without close-on-exec. The file may
    // be fd 3 already (which number it gets depends on what else this process, shared by
    // every test, has open), and dup2 onto itself would leave the flag set: then it is
    // cleared.
    unsafe {
        cmd.pre_exec(move || {
            let rc = if fd == 3 {
                libc::fcntl(3, libc::F_SETFD, 0)
            } else {
                libc::dup2(fd, 3)
            };
            if rc < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let out = cmd.output().expect("run");
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("fd 3") && err.contains("not"), "{err}");
}

/// The units `execd --print-unit` prints (what ships, `systemd/`) pass `systemd-analyze
/// verify`, with `ExecStart` pointing at the binary this build made (/usr/local/bin/execd
/// is not installed here). CI installs systemd-analyze; elsewhere the test says it skipped.
#[test]
fn the_printed_units_pass_systemd_analyze_verify() {
    let available = Command::new("systemd-analyze")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !available {
        skip("systemd-analyze is not installed (.ci/run installs package systemd)");
        return;
    }
    let printed = |unit: &str| {
        let out = Command::new(env!("CARGO_BIN_EXE_execd"))
            .args(["--print-unit", unit])
            .output()
            .expect("run execd --print-unit");
        assert!(out.status.success(), "{out:?}");
        String::from_utf8(out.stdout).expect("UTF-8")
    };
    let dir = TempDir::new();
    let service = printed("service").replace("/usr/local/bin/execd", env!("CARGO_BIN_EXE_execd"));
    assert!(service.contains("Type=notify") && service.contains("Delegate=yes"));
    assert!(service.contains("ExecReload="));
    std::fs::write(dir.path().join("execd.service"), service).expect("write");
    std::fs::write(dir.path().join("execd.socket"), printed("socket")).expect("write");
    let out = Command::new("systemd-analyze")
        .args(["verify", "--man=no", "execd.socket", "execd.service"])
        .current_dir(dir.path())
        .output()
        .expect("run systemd-analyze");
    assert!(
        out.status.success() && out.stderr.is_empty(),
        "systemd-analyze verify: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let out = Command::new(env!("CARGO_BIN_EXE_execd"))
        .args(["--print-unit", "timer"])
        .output()
        .expect("run execd");
    assert_eq!(out.status.code(), Some(2), "{out:?}");
}
