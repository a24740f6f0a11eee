//! Living under systemd (PROTOCOL.md sections 1 and 10): the variables of its protocol
//! never reach a command.

mod common;

use std::process::{Command, Stdio};

use common::*;

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
    let d = Daemon {
        child: None,
        socket: socket.clone(),
        dir,
    };
    wait_until("execd listens", || {
        std::os::unix::net::UnixStream::connect(&socket).is_ok()
    });
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
