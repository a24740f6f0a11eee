//! Many hosts, the docker way (PROTOCOL.md section 15): `execctl -H ssh://...` runs every
//! subcommand against an execd elsewhere through the user's own ssh, and `execctl
//! dial-stdio` is the relay at the far end.
//!
//! As docker's own tests do, most tests put a stand-in `ssh` first on execctl's `PATH`: a
//! script that records its arguments and runs the remote command here, so "the remote
//! host" is this one and "its daemon" a test daemon. One test goes through a real `sshd`
//! started for it when one is installed, and says it skipped otherwise.

use std::io::Write;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::util::cli::*;
use crate::util::*;

/// The stand-in for ssh: one line of `[arg]`s per call in `$FAKE_SSH_LOG`; with
/// `$FAKE_SSH_FAIL` set, that line on stderr and exit 255 (as ssh fails); else the words
/// after `--` run as the remote command, through `sh -c` as sshd runs them, with
/// `$FAKE_SSH_REMOTE_PATH` as its `PATH` when set (a host without execctl).
const FAKE_SSH: &str = r#"#!/bin/sh
{ printf '[%s]' "$@"; printf '\n'; } >> "$FAKE_SSH_LOG"
if [ -n "$FAKE_SSH_FAIL" ]; then
    printf '%s\n' "$FAKE_SSH_FAIL" >&2
    exit 255
fi
while [ $# -gt 0 ] && [ "$1" != "--" ]; do shift; done
shift
if [ -n "$FAKE_SSH_REMOTE_PATH" ]; then
    PATH=$FAKE_SSH_REMOTE_PATH
    export PATH
fi
exec sh -c "$*"
"#;

/// A directory holding the stand-in `ssh` and an `execctl` (the one under test), and
/// the log of ssh's calls.
struct FakeSsh {
    dir: TempDir,
}

impl FakeSsh {
    fn new() -> FakeSsh {
        let dir = TempDir::new();
        let bin = dir.path().join("bin");
        std::fs::create_dir(&bin).expect("mkdir bin");
        write_script(&bin.join("ssh"), FAKE_SSH);
        std::os::unix::fs::symlink(CTL, bin.join("execctl")).expect("link execctl");
        std::fs::write(dir.path().join("ssh.log"), "").expect("log");
        FakeSsh { dir }
    }

    fn bin(&self) -> PathBuf {
        self.dir.path().join("bin")
    }

    fn log(&self) -> PathBuf {
        self.dir.path().join("ssh.log")
    }

    /// ssh's calls so far, one line of `[arg]`s each.
    fn calls(&self) -> Vec<String> {
        std::fs::read_to_string(self.log())
            .unwrap_or_default()
            .lines()
            .map(String::from)
            .collect()
    }

    /// `execctl ARGS` with the stand-in first on its `PATH`, no socket or host from the
    /// environment, stdin /dev/null.
    fn execctl(&self, args: &[&str]) -> Command {
        let mut cmd = command(None, args);
        cmd.env("PATH", format!("{}:/usr/bin:/bin", self.bin().display()))
            .env("FAKE_SSH_LOG", self.log())
            .env_remove("EXECD_HOST")
            .env_remove("FAKE_SSH_FAIL")
            .env_remove("FAKE_SSH_REMOTE_PATH");
        cmd
    }
}

fn write_script(path: &Path, text: &str) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(path, text).expect("write script");
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
}

/// `ssh://user@box/SOCKET` for a test daemon.
fn url(d: &Daemon) -> String {
    format!("ssh://user@box{}", d.socket.display())
}

/// Live processes whose command line holds `needle` (a test's own socket path).
fn processes_with(needle: &str) -> Vec<i32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            pid_alive(*pid)
                && std::fs::read(format!("/proc/{pid}/cmdline"))
                    .is_ok_and(|c| String::from_utf8_lossy(&c).contains(needle))
        })
        .collect()
}

/// Every ssh link of a test (its `dial-stdio` at the far end) has ended. The daemon's
/// spare shares its memory, so its command line is the daemon's: it is not a link.
#[track_caller]
fn links_gone(d: &Daemon) {
    let socket = d.socket.display().to_string();
    wait_until("every ssh link and its dial-stdio ended", || {
        let daemon = d.pid();
        let spares = spares_of(daemon);
        processes_with(&socket)
            .into_iter()
            .all(|pid| pid == daemon || spares.contains(&pid))
    });
}

// ---- the transport -------------------------------------------------------------------

#[test]
fn an_ssh_url_becomes_the_ssh_command_docker_would_run() {
    let d = Daemon::start(&[]);
    let ssh = FakeSsh::new();
    let sock = d.socket.display().to_string();
    let o = run_cmd(ssh.execctl(&["-H", &format!("ssh://user@host:2222{sock}"), "status"]));
    assert_eq!(o.code, Some(0), "{o:?}");
    assert!(o.stdout.contains(&format!("on {sock}")), "{}", o.stdout);
    assert_eq!(
        ssh.calls(),
        [format!(
            "[-T][-p][2222][user@host][--][execctl][dial-stdio][--socket][{sock}]"
        )]
    );
    // EXECD_HOST says the same; without a socket in the URL the remote execctl finds its
    // own (here through the EXECD_SOCKET the stand-in's remote command inherits).
    let mut cmd = ssh.execctl(&["status", "--path"]);
    cmd.env("EXECD_HOST", "ssh://box")
        .env("EXECD_SOCKET", &d.socket);
    let o = run_cmd(cmd);
    assert_eq!((o.code, o.stdout.trim()), (Some(0), sock.as_str()), "{o:?}");
    assert_eq!(
        ssh.calls().last().map(String::as_str),
        Some("[-T][box][--][execctl][dial-stdio]")
    );
    // A flag beats the environment: --socket is this host's socket, -H beats EXECD_HOST.
    let mut cmd = ssh.execctl(&["--socket", &sock, "status", "--path"]);
    cmd.env("EXECD_HOST", "ssh://nowhere.invalid");
    let o = run_cmd(cmd);
    assert_eq!((o.code, o.stdout.trim()), (Some(0), sock.as_str()), "{o:?}");
    let mut cmd = ssh.execctl(&["-H", &format!("unix://{sock}"), "status", "--path"]);
    cmd.env("EXECD_HOST", "ssh://nowhere.invalid");
    let o = run_cmd(cmd);
    assert_eq!((o.code, o.stdout.trim()), (Some(0), sock.as_str()), "{o:?}");
    assert_eq!(ssh.calls().len(), 2, "no ssh for a local socket");
    // Both at once, or a URL that is none, is a usage error.
    for args in [
        vec!["-H", "ssh://box", "--socket", "/x", "status"],
        vec!["-H", "tcp://box:2375", "status"],
        vec!["-H", "ssh://-oProxyCommand=sh", "status"],
    ] {
        let o = run_cmd(ssh.execctl(&args));
        assert_eq!(o.code, Some(125), "{args:?}: {o:?}");
        assert_eq!(o.stderr.lines().count(), 1, "{args:?}: {o:?}");
    }
    links_gone(&d);
}

#[test]
fn run_and_exec_on_another_host_behave_as_here() {
    let d = Daemon::start(&[]);
    let ssh = FakeSsh::new();
    let h = url(&d);
    // Exit codes, and stdout and stderr apart (exec) or merged (run).
    let o = run_cmd(ssh.execctl(&["-H", &h, "run", "--", "sh", "-c", "echo out; exit 3"]));
    assert_eq!((o.code, o.stdout.as_str()), (Some(3), "out\n"), "{o:?}");
    let o = run_cmd(ssh.execctl(&["-H", &h, "exec", "echo out; echo err >&2; exit 4"]));
    assert_eq!(
        (o.code, o.stdout.as_str(), o.stderr.as_str()),
        (Some(4), "out\n", "err\n"),
        "{o:?}"
    );
    let o = run_cmd(ssh.execctl(&["-H", &h, "run", "--", "no-such-command-here"]));
    assert_eq!(o.code, Some(127), "{o:?}");
    let o = run_cmd(ssh.execctl(&["-H", &h, "exec", "kill -KILL $$"]));
    assert_eq!(o.code, Some(137), "{o:?}");
    // stdin is forwarded and closed at its end, 1 MB of it through the relay.
    let input = random_bytes(1 << 20, 3);
    let mut cmd = ssh.execctl(&["-H", &h, "exec", "wc -c; head -c 0"]);
    cmd.stdin(Stdio::piped());
    let o = run_with_input(cmd, &input);
    assert_eq!((o.code, o.stdout.trim()), (Some(0), "1048576"), "{o:?}");
    // 3 MB of binary output, byte for byte.
    let file = d.dir.path().join("blob");
    let blob = random_bytes(3_000_000, 7);
    std::fs::write(&file, &blob).expect("write blob");
    let mut cmd = ssh.execctl(&["-H", &h, "run", "--", "cat", file.to_str().expect("utf-8")]);
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut ctl = Ctl {
        child: cmd.spawn().expect("spawn execctl"),
    };
    let out = drain_bytes(ctl.child.stdout.take().expect("stdout"));
    let err = drain(ctl.child.stderr.take().expect("stderr"));
    assert_eq!(ctl.wait().code(), Some(0));
    let out = out.join().expect("stdout");
    assert!(
        out == blob,
        "{} bytes came, not the 3 MB written",
        out.len()
    );
    assert_eq!(err.join().expect("stderr"), "");
    // -e and --env-file are read here, and reach the remote command.
    let env_file = d.dir.path().join("env");
    std::fs::write(&env_file, "FROM_FILE=file value\n").expect("write");
    let mut cmd = ssh.execctl(&[
        "-H",
        &h,
        "exec",
        "-e",
        "SET=a=b",
        "-e",
        "COPIED",
        "--env-file",
        env_file.to_str().expect("utf-8"),
        "echo \"$SET|$COPIED|$FROM_FILE\"",
    ]);
    cmd.env("COPIED", "from the caller");
    let o = run_cmd(cmd);
    assert_eq!(o.stdout, "a=b|from the caller|file value\n", "{o:?}");
    links_gone(&d);
}

#[test]
fn a_remote_command_runs_in_the_remote_daemon_s_directory_unless_told() {
    let dir = TempDir::new();
    let work = dir.path().join("work");
    std::fs::create_dir(&work).expect("mkdir");
    let socket = dir.path().join("execd.sock");
    let d = Daemon::start_at(dir, socket, &["--workdir", work.to_str().expect("utf-8")]);
    let ssh = FakeSsh::new();
    let h = url(&d);
    for (args, want) in [
        (vec!["run", "pwd"], work.display().to_string()),
        (vec!["exec", "pwd"], work.display().to_string()),
        (vec!["run", "-w", "/", "pwd"], "/".to_string()),
        (vec!["exec", "--cwd", "/", "pwd"], "/".to_string()),
    ] {
        // execctl's own directory (/tmp here) means nothing on the daemon's host.
        let mut full = vec!["-H", h.as_str()];
        full.extend(&args);
        let mut cmd = ssh.execctl(&full);
        cmd.current_dir("/tmp");
        let o = run_cmd(cmd);
        assert_eq!(
            (o.code, o.stdout.trim()),
            (Some(0), want.as_str()),
            "{args:?}: {o:?}"
        );
    }
    let o = run_cmd(ssh.execctl(&["-H", &h, "run", "-w", "sub", "pwd"]));
    assert_eq!(o.code, Some(125), "{o:?}");
    assert!(o.stderr.contains("absolute"), "{}", o.stderr);
}

#[test]
fn ctrl_c_at_the_terminal_kills_the_remote_command() {
    let d = Daemon::start(&[]);
    let ssh = FakeSsh::new();
    let h = url(&d);
    for args in [
        vec!["run", "--", "sh", "-c", "echo $$; exec sleep 30"],
        vec!["exec", "echo $$; exec sleep 30"],
    ] {
        let mut full = vec!["-H", h.as_str()];
        full.extend(&args);
        let mut cmd = ssh.execctl(&full);
        // A terminal's Ctrl-C goes to its whole foreground group: execctl and its ssh
        // links alike.
        cmd.process_group(0);
        let (mut ctl, rx) = spawn_lines(&mut cmd);
        let pid: i32 = next_line(&rx).trim().parse().expect("a pid");
        assert!(pid_alive(pid));
        unsafe_kill(-ctl.pid(), libc::SIGINT);
        assert_eq!(ctl.wait().code(), Some(130), "{args:?}");
        wait_until("the remote command is gone", || {
            !pid_alive(pid) && !group_alive(pid)
        });
    }
    links_gone(&d);
}

#[test]
fn a_sigkilled_execctl_on_another_host_takes_its_command_along() {
    let d = Daemon::start(&[]);
    let ssh = FakeSsh::new();
    let h = url(&d);
    let (mut ctl, rx) = spawn_lines(&mut ssh.execctl(&[
        "-H",
        &h,
        "run",
        "--",
        "sh",
        "-c",
        "echo $$; exec sleep 30",
    ]));
    let pid: i32 = next_line(&rx).trim().parse().expect("a pid");
    unsafe_kill(ctl.pid(), libc::SIGKILL);
    ctl.wait();
    // The link's end reaches the daemon through ssh and dial-stdio; the daemon kills.
    wait_until("the remote command is gone", || {
        !pid_alive(pid) && !group_alive(pid)
    });
    links_gone(&d);
}

#[test]
fn a_remote_daemon_shutting_down_under_run_is_said_with_its_host() {
    let mut d = Daemon::start(&[]);
    let ssh = FakeSsh::new();
    let h = url(&d);
    let mut cmd = ssh.execctl(&[
        "-H",
        &h,
        "run",
        "--",
        "sh",
        "-c",
        "echo started; exec sleep 30",
    ]);
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut ctl = Ctl {
        child: cmd.spawn().expect("spawn execctl"),
    };
    let stdout = ctl.child.stdout.take().expect("stdout");
    let lines = lines_of(stdout);
    let err = drain(ctl.child.stderr.take().expect("stderr"));
    assert_eq!(next_line(&lines), "started");
    d.terminate();
    assert_eq!(ctl.wait().code(), Some(143));
    let err = err.join().expect("stderr");
    assert!(
        err.starts_with(&format!("execctl: execd on {h} shut down and killed term_")),
        "{err:?}"
    );
}

#[test]
fn failures_name_the_host_and_the_step_and_exit_125() {
    let d = Daemon::start(&[]);
    let ssh = FakeSsh::new();
    let one_line = |cmd: Command, want: &str| {
        let o = run_cmd(cmd);
        assert_eq!(o.code, Some(125), "{o:?}");
        assert_eq!(o.stderr.lines().count(), 1, "one line: {o:?}");
        assert!(o.stderr.contains(want), "{want:?} in {:?}", o.stderr);
    };
    // ssh is not installed.
    let empty = TempDir::new();
    let mut cmd = ssh.execctl(&["-H", "ssh://box", "status"]);
    cmd.env("PATH", empty.path());
    one_line(
        cmd,
        "execctl: cannot reach execd on ssh://box: ssh is not installed here",
    );
    // ssh failed: its last line says why.
    let mut cmd = ssh.execctl(&["-H", "ssh://box:2222", "run", "true"]);
    cmd.env(
        "FAKE_SSH_FAIL",
        "ssh: connect to host box port 2222: Connection refused",
    );
    one_line(
        cmd,
        "execctl: cannot reach execd on ssh://box:2222: ssh failed: ssh: connect to host box port 2222: Connection refused",
    );
    // execctl is not installed on the host.
    let mut cmd = ssh.execctl(&["-H", &url(&d), "ps"]);
    cmd.env("FAKE_SSH_REMOTE_PATH", "/usr/bin:/bin");
    one_line(cmd, "execctl is not installed on box");
    // No daemon runs there.
    let none = d.dir.path().join("none.sock");
    let gone = format!("ssh://box{}", none.display());
    one_line(
        ssh.execctl(&["-H", &gone, "exec", "true"]),
        &format!(
            "cannot reach execd on {gone}: execd is not running on box: cannot connect to execd at {}",
            none.display()
        ),
    );
    links_gone(&d);
}

#[test]
fn a_remote_daemon_that_keeps_the_ssh_user_out_says_who_may_connect() {
    if !running_as_root() {
        return skip("needs root to connect as another uid");
    }
    // The socket's mode keeps the ssh user out, or the daemon closes its connection at
    // once: dial-stdio says which, on the far side, and execctl names the host.
    for (extra, said) in [
        (
            &[][..],
            "execd on box does not let the ssh user in: execd's socket at ",
        ),
        (
            &["--socket-mode", "0666"][..],
            "execd on box does not let the ssh user in: execd at ",
        ),
    ] {
        let d = Daemon::start(extra);
        d.let_others_in();
        let ssh = FakeSsh::new();
        std::fs::set_permissions(
            ssh.log(),
            std::os::unix::fs::PermissionsExt::from_mode(0o666),
        )
        .expect("chmod");
        let mut cmd = ssh.execctl(&["-H", &url(&d), "status"]);
        as_nobody(&mut cmd);
        let o = run_cmd(cmd);
        assert_eq!(o.code, Some(125), "{o:?}");
        assert_eq!(o.stderr.lines().count(), 1, "{o:?}");
        assert!(o.stderr.contains(said), "{extra:?}: {o:?}");
        assert!(o.stderr.contains("--allow-uid 65534"), "{o:?}");
        links_gone(&d);
    }
}

// ---- dial-stdio, the relay -------------------------------------------------------------

/// Runs `cmd` (a dial-stdio, direct or through the stand-in ssh) with `input` on its
/// stdin, closed after it (a half-close), and returns its exit code and stdout.
fn relay(mut cmd: Command, input: &[u8]) -> (Option<i32>, String) {
    let o = {
        cmd.stdin(Stdio::piped());
        run_with_input(cmd, input)
    };
    (o.code, o.stdout)
}

#[test]
fn dial_stdio_carries_json_rpc_and_http_with_half_close() {
    let d = Daemon::start(&[]);
    let ssh = FakeSsh::new();
    let sock = d.socket.display().to_string();
    let line = format!("{}\n", request(7, "bash/sessions", json!({})));
    let http = b"GET /v1/bash/sessions HTTP/1.1\r\nHost: execd\r\n\r\n";
    // Straight, and as a program would use it through ssh: `ssh HOST execctl dial-stdio`.
    let through_ssh = |input: &[u8]| {
        let mut cmd = Command::new(ssh.bin().join("ssh"));
        cmd.args(["box", "--", "execctl", "dial-stdio", "--socket", &sock])
            .env("PATH", format!("{}:/usr/bin:/bin", ssh.bin().display()))
            .env("FAKE_SSH_LOG", ssh.log())
            .env_remove("FAKE_SSH_FAIL")
            .env_remove("FAKE_SSH_REMOTE_PATH");
        relay(cmd, input)
    };
    for (code, out) in [
        relay(command(Some(&d.socket), &["dial-stdio"]), line.as_bytes()),
        through_ssh(line.as_bytes()),
    ] {
        assert_eq!(code, Some(0), "{out}");
        let v = parse_json(out.trim());
        assert_eq!((&v["id"], &v["result"]), (&json!(7), &json!([])), "{v}");
    }
    for (code, out) in [
        relay(command(Some(&d.socket), &["dial-stdio"]), http),
        through_ssh(http),
    ] {
        assert_eq!(code, Some(0), "{out}");
        assert!(out.starts_with("HTTP/1.1 200"), "{out}");
        assert!(out.contains("\"success\":true"), "{out}");
    }
    // The daemon's end ends dial-stdio, even with its stdin still open.
    let mut ctl = Ctl {
        child: command(Some(&d.socket), &["dial-stdio"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn dial-stdio"),
    };
    let out = drain(ctl.child.stdout.take().expect("stdout"));
    let mut stdin = ctl.child.stdin.take().expect("stdin");
    stdin
        .write_all(b"GET /v1/bash/sessions HTTP/1.1\r\nHost: execd\r\nConnection: close\r\n\r\n")
        .expect("write");
    assert_eq!(
        ctl.wait().code(),
        Some(0),
        "dial-stdio waited for its stdin"
    );
    let out = out.join().expect("stdout");
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    drop(stdin);
}

// ---- a real sshd ---------------------------------------------------------------------

/// An `sshd` started for one test on a loopback port, killed on drop.
struct Sshd {
    child: std::process::Child,
    port: u16,
}

impl Drop for Sshd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn sh(cmd: &str) -> String {
    let o = Command::new("sh")
        .args(["-c", cmd])
        .stdin(Stdio::null())
        .output()
        .expect("sh");
    assert!(o.status.success(), "{cmd}: {o:?}");
    String::from_utf8_lossy(&o.stdout).trim().to_string()
}

/// Starts `sshd` (at `program`) with a host key, one authorized key and a `PATH` that
/// finds the execctl under test, all in `dir`.
fn start_sshd(program: &Path, dir: &Path, path: &str) -> Result<Sshd, String> {
    if running_as_root() && !Path::new("/run/sshd").is_dir() {
        // Its privilege separation directory, which its service unit would make.
        std::fs::create_dir_all("/run/sshd").map_err(|e| format!("mkdir /run/sshd: {e}"))?;
    }
    let d = dir.display();
    sh(&format!(
        "ssh-keygen -q -t ed25519 -N '' -f {d}/host_key && ssh-keygen -q -t ed25519 -N '' -f {d}/user_key && cp {d}/user_key.pub {d}/authorized_keys"
    ));
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map_err(|e| format!("no free port: {e}"))?
        .port();
    let config = format!(
        "Port {port}\nListenAddress 127.0.0.1\nHostKey {d}/host_key\n\
         AuthorizedKeysFile {d}/authorized_keys\nPidFile none\nStrictModes no\nUsePAM no\n\
         PasswordAuthentication no\nKbdInteractiveAuthentication no\n\
         PermitRootLogin prohibit-password\nSetEnv PATH={path}\nLogLevel ERROR\n"
    );
    std::fs::write(dir.join("sshd_config"), config).map_err(|e| e.to_string())?;
    let log = std::fs::File::create(dir.join("sshd.log")).map_err(|e| e.to_string())?;
    let child = Command::new(program)
        .args(["-D", "-e", "-f"])
        .arg(dir.join("sshd_config"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::from(log))
        .spawn()
        .map_err(|e| format!("cannot start {}: {e}", program.display()))?;
    let sshd = Sshd { child, port };
    let deadline = std::time::Instant::now() + WAIT;
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        if std::time::Instant::now() > deadline {
            let log = std::fs::read_to_string(dir.join("sshd.log")).unwrap_or_default();
            return Err(format!("sshd did not listen on {port}: {log}"));
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    Ok(sshd)
}

#[test]
fn through_a_real_sshd_when_one_is_installed() {
    let Some(program) = ["/usr/sbin/sshd", "/usr/local/sbin/sshd", "/sbin/sshd"]
        .iter()
        .map(Path::new)
        .find(|p| p.exists())
    else {
        return skip("sshd is not installed (package openssh-server; .ci/run installs it)");
    };
    if !have(&["ssh", "ssh-keygen"]) {
        return;
    }
    let d = Daemon::start(&[]);
    let ssh = FakeSsh::new();
    let dir = TempDir::new();
    let remote_path = format!("{}:/usr/bin:/bin", ssh.bin().display());
    let sshd = match start_sshd(program, dir.path(), &remote_path) {
        Ok(s) => s,
        Err(why) => return skip(&format!("cannot run a private sshd here: {why}")),
    };
    // The user's own ssh, configured as a user would: an alias with its key and port.
    let user = sh("id -un");
    let dd = dir.path().display();
    std::fs::write(
        dir.path().join("ssh_config"),
        format!(
            "Host execd-test\n  HostName 127.0.0.1\n  Port {}\n  User {user}\n  \
             IdentityFile {dd}/user_key\n  IdentitiesOnly yes\n  BatchMode yes\n  \
             StrictHostKeyChecking no\n  UserKnownHostsFile /dev/null\n  LogLevel ERROR\n",
            sshd.port
        ),
    )
    .expect("ssh_config");
    let real = TempDir::new();
    let ssh_program = sh("command -v ssh");
    write_script(
        &real.path().join("ssh"),
        &format!("#!/bin/sh\nexec {ssh_program} -F {dd}/ssh_config \"$@\"\n"),
    );
    let run = |args: &[&str]| {
        let h = format!("ssh://execd-test{}", d.socket.display());
        let mut full = vec!["-H", h.as_str()];
        full.extend(args);
        let mut cmd = command(None, &full);
        cmd.env("PATH", format!("{}:/usr/bin:/bin", real.path().display()))
            .env_remove("EXECD_HOST");
        run_cmd(cmd)
    };
    let o = run(&["run", "--", "sh", "-c", "echo through sshd; exit 7"]);
    assert_eq!(
        (o.code, o.stdout.as_str()),
        (Some(7), "through sshd\n"),
        "{o:?}"
    );
    let o = run(&["exec", "echo out; echo err >&2"]);
    assert_eq!(
        (o.code, o.stdout.as_str(), o.stderr.as_str()),
        (Some(0), "out\n", "err\n")
    );
    let o = run(&["status", "--path"]);
    assert_eq!(o.stdout.trim(), d.socket.display().to_string(), "{o:?}");
    eprintln!(
        "through_a_real_sshd_when_one_is_installed: ran through {} on 127.0.0.1:{}",
        program.display(),
        sshd.port
    );
    links_gone(&d);
}
