//! The sandbox per command (PROTOCOL 16) against the real daemon: what the workspace
//! preset stops and lets through from every front door and every descendant, where a
//! command's sandbox comes from (the flag, the policy, its rules, the request, an
//! approver), shell sessions' fixed sandbox, and failing closed where the kernel cannot
//! give one (`--landlock-abi-max`, a seccomp filter execd is started under).
//!
//! Every daemon here runs with `--tmpdir` inside its own test directory, so that "outside
//! `$CWD` and `$TMPDIR`" can be a directory of the test's (the system's `/tmp` holds the
//! test directories themselves).
//!
//! A sandboxed command that asks execd for a command over the socket (`execctl run`,
//! `bash/exec` with `exec_dir: "/"`, a shell session) gets at most its own sandbox, and
//! a descendant tied to no command gets `read-only`.

use std::io::{Read, Write};
use std::net::{TcpListener, UdpSocket};
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::util::*;

/// A test directory with a workspace (`ws`, a git repository unless `plain`), a tmpdir
/// (`tmp`) and a directory outside both (`out`).
struct Place {
    dir: TempDir,
}

impl Place {
    fn new(git: bool) -> Place {
        let dir = TempDir::new();
        for d in ["ws", "tmp", "out"] {
            std::fs::create_dir_all(dir.path().join(d)).expect("mkdir");
        }
        let p = Place { dir };
        if git {
            p.git(&["init", "-q"]);
            std::fs::write(p.ws().join("file.txt"), "one\n").expect("write");
            p.git(&["add", "file.txt"]);
            p.git(&[
                "-c",
                "user.name=t",
                "-c",
                "user.email=t@t",
                "commit",
                "-qm",
                "one",
            ]);
            std::fs::write(p.ws().join("file.txt"), "two\n").expect("write");
        }
        p
    }

    fn git(&self, args: &[&str]) {
        let st = Command::new("git")
            .args(args)
            .current_dir(self.ws())
            .status()
            .expect("git");
        assert!(st.success(), "git {args:?}");
    }

    fn ws(&self) -> PathBuf {
        self.dir.path().join("ws")
    }
    fn tmp(&self) -> PathBuf {
        self.dir.path().join("tmp")
    }
    fn out(&self) -> PathBuf {
        self.dir.path().join("out")
    }

    /// The flags for a daemon sandboxing every command with `sandbox` in this place.
    fn flags(&self, sandbox: &str) -> Vec<String> {
        vec![
            "--sandbox".into(),
            sandbox.into(),
            "--workspace".into(),
            self.ws().display().to_string(),
            "--tmpdir".into(),
            self.tmp().display().to_string(),
            "--workdir".into(),
            self.ws().display().to_string(),
        ]
    }

    fn daemon(&self, sandbox: &str, extra: &[&str]) -> Daemon {
        let mut flags = self.flags(sandbox);
        flags.extend(extra.iter().map(|s| s.to_string()));
        let refs: Vec<&str> = flags.iter().map(String::as_str).collect();
        Daemon::start(&refs)
    }

    /// A daemon with `policy` (its JSON, written here) and no `--sandbox`: the policy's
    /// top-level sandbox is in force; the workspace and `$TMPDIR` are this place's.
    fn policy_daemon(&self, policy: &str, extra: &[&str]) -> Daemon {
        let path = self.dir.path().join("policy.json");
        std::fs::write(&path, policy).expect("policy");
        let mut flags = vec![
            "--policy".to_string(),
            s(&path),
            "--workspace".into(),
            s(&self.ws()),
            "--tmpdir".into(),
            s(&self.tmp()),
        ];
        flags.extend(extra.iter().map(|s| s.to_string()));
        let refs: Vec<&str> = flags.iter().map(String::as_str).collect();
        Daemon::start(&refs)
    }
}

fn s(p: &Path) -> String {
    p.display().to_string()
}

/// Whether the kernel has Landlock (ABI 3+ for writes), else skips the test.
fn landlock() -> bool {
    // SAFETY: landlock_create_ruleset(NULL, 0, VERSION) only reports the ABI.
    let abi = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<u8>(),
            0usize,
            1u32,
        )
    };
    if abi < 3 {
        skip("the kernel has no Landlock ABI 3+");
        return false;
    }
    if !running_as_root() {
        skip("protect needs a mount namespace: root");
        return false;
    }
    true
}

/// Runs `line` through the ACP front door (a terminal, in `cwd`): its output and exit
/// code. With `tty`, on a PTY.
fn acp(c: &mut Client, line: &str, cwd: &Path, tty: bool) -> (String, i64) {
    let mut params = json!({"sessionId": "s", "command": line, "cwd": s(cwd)});
    if tty {
        params["_meta"] = json!({"execd": {"tty": true}});
    }
    let id = create_with(c, params);
    let exit = wait_exit(c, &id);
    let out = output(c, &id);
    (
        out["output"].as_str().unwrap_or("").to_string(),
        exit["exitCode"].as_i64().unwrap_or(-1),
    )
}

/// Runs `line` through `bash/exec` (in `cwd`): stdout and stderr together, exit code.
fn bash(c: &mut Client, line: &str, cwd: &Path, extra: Value) -> (String, i64) {
    let mut params = json!({"command": line, "exec_dir": s(cwd), "hard_timeout": 60});
    if let Value::Object(m) = extra {
        for (k, v) in m {
            params[k] = v;
        }
    }
    let r = ok(c, "bash/exec", params);
    (
        format!(
            "{}{}",
            r["stdout"].as_str().unwrap_or(""),
            r["stderr"].as_str().unwrap_or("")
        ),
        r["exit_code"].as_i64().unwrap_or(-1),
    )
}

/// Runs `line` through the HTTP front end on the Unix socket (`POST /v1/bash/exec`).
fn http(d: &Daemon, line: &str, cwd: &Path) -> (String, i64) {
    let body = json!({"command": line, "exec_dir": s(cwd), "hard_timeout": 60}).to_string();
    let mut sock = std::os::unix::net::UnixStream::connect(&d.socket).expect("connect");
    sock.set_read_timeout(Some(WAIT)).expect("timeout");
    write!(
        sock,
        "POST /v1/bash/exec HTTP/1.1\r\nHost: execd\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .expect("write");
    let mut reply = String::new();
    sock.read_to_string(&mut reply).expect("read");
    let json_at = reply.find("\r\n\r\n").expect("a head") + 4;
    let v: Value = serde_json::from_str(&reply[json_at..]).expect("a JSON body");
    let data = &v["data"];
    (
        format!(
            "{}{}",
            data["stdout"].as_str().unwrap_or(""),
            data["stderr"].as_str().unwrap_or("")
        ),
        data["exit_code"].as_i64().unwrap_or(-1),
    )
}

/// Runs `line` in shell session `id` (made in `cwd` with `sandbox` when new).
fn shell(c: &mut Client, id: &str, line: &str, cwd: &Path) -> (String, i64) {
    let r = ok(
        c,
        "shell/exec",
        json!({"id": id, "command": line, "exec_dir": s(cwd), "timeout": 60}),
    );
    (
        r["output"].as_str().unwrap_or("").to_string(),
        r["exit_code"].as_i64().unwrap_or(-1),
    )
}

/// The line that tries every way out named in PROTOCOL 16 (writes into `out` by the
/// command itself, a `setsid` double fork, `python3 -c`, `env -i`, a binary it wrote
/// and ran) and the writes it must keep (`$CWD`, `$TMPDIR`, `/dev/null`), tagging each.
fn escapes(out: &Path, tag: &str) -> String {
    let o = s(out);
    format!(
        "echo x > {o}/{tag}-direct; \
         setsid sh -c '(echo x > {o}/{tag}-setsid) & wait' ; \
         python3 -c 'open(\"{o}/{tag}-python\", \"w\")' 2>&1 | tail -1; \
         env -i /bin/sh -c 'echo x > {o}/{tag}-env'; \
         cp /bin/cp ./mycp-{tag} && ./mycp-{tag} /etc/hostname {o}/{tag}-binary; \
         echo in > inside-{tag} && echo in > \"$TMPDIR/tmp-{tag}\" && echo x > /dev/null && \
         echo KEPT; \
         echo y >> .git/config; \
         echo DONE"
    )
}

/// What `escapes` must have left: nothing outside, everything inside, `.git` unchanged.
#[track_caller]
fn held(p: &Place, tag: &str, text: &str) {
    for way in ["direct", "setsid", "python", "env", "binary"] {
        let f = p.out().join(format!("{tag}-{way}"));
        assert!(!f.exists(), "{tag}: {way} wrote {f:?}:\n{text}");
    }
    assert!(
        text.contains("Permission denied"),
        "{tag}: no EACCES:\n{text}"
    );
    assert!(
        text.contains("KEPT"),
        "{tag}: writes inside failed:\n{text}"
    );
    assert!(text.contains("DONE"), "{tag}:\n{text}");
    assert!(p.ws().join(format!("inside-{tag}")).exists(), "{tag}");
    assert!(p.tmp().join(format!("tmp-{tag}")).exists(), "{tag}");
    let config = std::fs::read_to_string(p.ws().join(".git/config")).expect(".git/config");
    assert!(
        !config.lines().any(|l| l == "y"),
        "{tag}: .git/config changed:\n{config}"
    );
}

#[test]
fn the_workspace_preset_holds_from_every_front_door_and_every_descendant() {
    if !landlock() || !have(&["python3", "git", "setsid"]) {
        return;
    }
    let p = Place::new(true);
    let d = p.daemon("workspace", &[]);
    let mut c = d.client();
    let (text, _) = acp(&mut c, &escapes(&p.out(), "acp"), &p.ws(), false);
    held(&p, "acp", &text);
    let (text, _) = acp(&mut c, &escapes(&p.out(), "pty"), &p.ws(), true);
    held(&p, "pty", &text);
    let (text, _) = bash(&mut c, &escapes(&p.out(), "bash"), &p.ws(), json!({}));
    held(&p, "bash", &text);
    let (text, _) = http(&d, &escapes(&p.out(), "http"), &p.ws());
    held(&p, "http", &text);
    let (text, _) = shell(&mut c, "sh1", &escapes(&p.out(), "shell"), &p.ws());
    held(&p, "shell", &text);
    // `/tmp` itself is not `$TMPDIR` here: a write there fails too.
    let probe = format!("/tmp/execd-sandbox-probe-{}", std::process::id());
    let (text, code) = bash(&mut c, &format!("echo x > {probe}"), &p.ws(), json!({}));
    assert_ne!(code, 0, "{text}");
    assert!(!Path::new(&probe).exists());
    assert_no_panic(&d);
}

#[test]
fn a_worktrees_git_stays_read_only() {
    if !landlock() || !have(&["git"]) {
        return;
    }
    let p = Place::new(true);
    let wt = p.tmp().join("wt");
    p.git(&["worktree", "add", "-q", &s(&wt)]);
    let flags = [
        "--sandbox",
        "workspace",
        "--workspace",
        &s(&wt),
        "--tmpdir",
        &s(&p.tmp()),
    ];
    let d = Daemon::start(&flags);
    let mut c = d.client();
    // The worktree's gitdir lies in the main repository's .git, under $TMPDIR's parent:
    // here the main repository is outside every root, and the worktree's .git file and
    // everything it names stay read-only.
    let (text, code) = bash(
        &mut c,
        "echo y >> .git; git status --short >/dev/null && echo STATUS; \
         echo y >> \"$(git rev-parse --git-dir)/HEAD\"; echo DONE",
        &wt,
        json!({}),
    );
    assert!(
        text.contains("STATUS") && text.contains("DONE"),
        "{code}: {text}"
    );
    let dotgit = std::fs::read_to_string(wt.join(".git")).expect(".git");
    assert!(!dotgit.contains("\ny"), "{dotgit}");
    let gitdir = p.ws().join(".git/worktrees/wt/HEAD");
    let head = std::fs::read_to_string(&gitdir).expect("HEAD");
    assert!(!head.contains("\ny"), "{head}");
    // A worktree whose gitdir lies in a write root: kept read-only by the namespace.
    let wt2 = p.tmp().join("wt2");
    std::fs::create_dir_all(p.tmp().join("main")).expect("mkdir");
    let main = p.tmp().join("main");
    for args in [
        vec!["init", "-q"],
        vec![
            "-c",
            "user.name=t",
            "-c",
            "user.email=t@t",
            "commit",
            "-q",
            "--allow-empty",
            "-m",
            "x",
        ],
        vec!["worktree", "add", "-q", wt2.to_str().expect("utf-8")],
    ] {
        let st = Command::new("git")
            .args(&args)
            .current_dir(&main)
            .status()
            .expect("git");
        assert!(st.success());
    }
    let flags = [
        "--sandbox",
        "workspace",
        "--workspace",
        &s(&wt2),
        "--tmpdir",
        &s(&p.tmp()),
    ];
    let d2 = Daemon::start(&flags);
    let mut c2 = d2.client();
    let (text, _) = bash(
        &mut c2,
        "echo y >> \"$(git rev-parse --git-common-dir)/config\"; \
         echo y >> \"$(git rev-parse --git-dir)/HEAD\"; git log --oneline | wc -l; echo DONE",
        &wt2,
        json!({}),
    );
    assert!(text.contains("Read-only file system"), "{text}");
    let config = std::fs::read_to_string(main.join(".git/config")).expect("config");
    assert!(!config.contains("\ny"), "{config}");
    let head = std::fs::read_to_string(main.join(".git/worktrees/wt2/HEAD")).expect("HEAD");
    assert!(!head.contains("\ny"), "{head}");
}

#[test]
fn network_netlink_vsock_io_uring_and_signals_to_the_daemon_fail() {
    if !landlock() || !have(&["python3"]) {
        return;
    }
    let p = Place::new(false);
    let d = p.daemon("workspace", &[]);
    let mut c = d.client();
    let tcp = TcpListener::bind("127.0.0.1:0").expect("tcp");
    tcp.set_nonblocking(true).expect("nonblocking");
    let udp = UdpSocket::bind("127.0.0.1:0").expect("udp");
    udp.set_nonblocking(true).expect("nonblocking");
    let (tport, uport) = (
        tcp.local_addr().expect("addr").port(),
        udp.local_addr().expect("addr").port(),
    );
    let py = format!(
        r#"
import socket, ctypes, errno
def tryit(name, f):
    try:
        f(); print(name, "ok")
    except OSError as e:
        print(name, errno.errorcode.get(e.errno, e.errno))
def tcp():
    s = socket.socket(); s.settimeout(2); s.connect(("127.0.0.1", {tport}))
def udp():
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.sendto(b"x", ("127.0.0.1", {uport}))
tryit("tcp", tcp)
tryit("udp", udp)
tryit("tcp6", lambda: socket.socket(socket.AF_INET6))
tryit("netlink", lambda: socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0))
tryit("vsock", lambda: socket.socket(socket.AF_VSOCK, socket.SOCK_STREAM))
tryit("unix", lambda: socket.socket(socket.AF_UNIX))
libc = ctypes.CDLL(None, use_errno=True)
params = ctypes.create_string_buffer(120)
r = libc.syscall(425, 8, params)
print("io_uring", r, errno.errorcode.get(ctypes.get_errno()))
"#
    );
    std::fs::write(p.ws().join("net.py"), py).expect("write");
    let daemon = d.pid();
    let line = format!(
        "python3 net.py; kill -TERM {daemon}; echo kill=$?; kill -0 -1; echo all=$?; \
         grep -E '^Cap(Bnd|Eff|Prm|Inh|Amb)' /proc/self/status; \
         echo hi | cat; python3 -c 'import socket; a, b = socket.socketpair(); \
         a.send(b\"pair\"); print(b.recv(4).decode())'"
    );
    // Twice: the first command is cloned for it, the second runs in a spare cloned ahead
    // that applied the sandbox's common part before it knew its command.
    let init = ok(&mut c, "initialize", json!({"protocolVersion": 1}));
    for run in ["cloned", "spare"] {
        let mut spare = None;
        if run == "spare" && spares_expected(&init) {
            wait_until("a spare waits", || !spares_of(daemon).is_empty());
            spare = spares_of(daemon).first().copied();
        }
        let ran_in = network_and_signals_fail_in(&mut c, &line, &p, daemon, run);
        if let Some(spare) = spare {
            assert_eq!(ran_in, spare, "the command ran in the spare");
        }
    }
    assert!(tcp.accept().is_err(), "a TCP connection came through");
    let mut buf = [0u8; 8];
    assert!(udp.recv_from(&mut buf).is_err(), "a datagram came through");
}

/// Runs `line` (run `run`) and checks what it printed; returns the pid it ran as.
#[track_caller]
fn network_and_signals_fail_in(
    c: &mut Client,
    line: &str,
    p: &Place,
    daemon: i32,
    run: &str,
) -> i32 {
    let (text, _) = bash(c, &format!("echo pid=$$; {line}"), &p.ws(), json!({}));
    for want in [
        "tcp EACCES",
        "udp EACCES",
        "tcp6 EACCES",
        "netlink EACCES",
        "vsock EACCES",
        "unix ok",
        "io_uring -1 ENOSYS",
        "hi\n",
        "pair\n",
        "CapBnd:\t0000000000000000",
        "CapEff:\t0000000000000000",
        "CapAmb:\t0000000000000000",
    ] {
        assert!(text.contains(want), "{run}: no {want:?} in:\n{text}");
    }
    assert!(!text.contains("kill=0"), "{run}: {text}");
    assert!(pid_alive(daemon), "{run}: the daemon was killed");
    text.lines()
        .find_map(|l| l.strip_prefix("pid=")?.parse().ok())
        .unwrap_or_else(|| panic!("{run}: no pid in:\n{text}"))
}

#[test]
fn builds_and_git_work_inside() {
    if !landlock() || !have(&["python3", "git", "make", "cc", "cargo"]) {
        return;
    }
    let p = Place::new(true);
    let d = p.daemon("workspace", &[]);
    let mut c = d.client();
    let (text, code) = bash(
        &mut c,
        "git status --short && git diff --stat && git log --oneline | wc -l",
        &p.ws(),
        json!({}),
    );
    assert_eq!(code, 0, "{text}");
    assert!(text.contains("file.txt"), "{text}");
    std::fs::write(
        p.ws().join("hello.c"),
        "#include <stdio.h>\nint main(void) { puts(\"built\"); return 0; }\n",
    )
    .expect("write");
    std::fs::write(
        p.ws().join("Makefile"),
        "hello: hello.c\n\tcc -o hello hello.c\n",
    )
    .expect("write");
    let (text, code) = bash(&mut c, "make && ./hello", &p.ws(), json!({}));
    assert_eq!(code, 0, "{text}");
    assert!(text.contains("built"), "{text}");
    let krate = p.ws().join("tiny");
    std::fs::create_dir_all(krate.join("src")).expect("mkdir");
    std::fs::write(
        krate.join("Cargo.toml"),
        "[package]\nname = \"tiny\"\nversion = \"0.1.0\"\nedition = \"2021\"\n",
    )
    .expect("write");
    std::fs::write(
        krate.join("src/main.rs"),
        "fn main() { println!(\"tiny\"); }\n",
    )
    .expect("write");
    // Cargo keeps its own files under $CARGO_HOME: the workspace's here.
    let (text, code) = bash(
        &mut c,
        "CARGO_HOME=$PWD/.cargo-home cargo build --offline -q && ./target/debug/tiny",
        &krate,
        json!({}),
    );
    assert_eq!(code, 0, "{text}");
    assert!(text.contains("tiny"), "{text}");
    let (text, code) = bash(
        &mut c,
        "python3 -c 'import multiprocessing as m; q = m.Queue(); \
         w = m.Process(target=q.put, args=(7,)); w.start(); print(\"queue\", q.get()); w.join()'",
        &p.ws(),
        json!({}),
    );
    assert_eq!(code, 0, "{text}");
    assert!(text.contains("queue 7"), "{text}");
}

#[test]
fn a_unix_socket_reached_by_path_is_not_mediated() {
    if !landlock() || !have(&["python3"]) {
        return;
    }
    let p = Place::new(false);
    let d = p.daemon("workspace", &[]);
    let mut c = d.client();
    let path = p.out().join("agent.sock");
    let l = UnixListener::bind(&path).expect("bind");
    l.set_nonblocking(true).expect("nonblocking");
    let line = format!(
        "python3 -c 'import socket; s = socket.socket(socket.AF_UNIX); \
         s.connect(\"{}\"); s.send(b\"hello\"); print(\"connected\")'",
        s(&path)
    );
    let (text, code) = bash(&mut c, &line, &p.ws(), json!({}));
    // As the README says: Landlock does not mediate connect() to a socket by its path.
    assert_eq!(code, 0, "{text}");
    assert!(text.contains("connected"), "{text}");
    let (mut conn, _) = l.accept().expect("the command connected");
    let mut buf = [0u8; 5];
    conn.set_nonblocking(false).expect("blocking");
    conn.read_exact(&mut buf).expect("read");
    assert_eq!(&buf, b"hello");
}

#[test]
fn a_session_keeps_its_sandbox_after_cd_and_exit_and_refuses_another() {
    if !landlock() {
        return;
    }
    let p = Place::new(false);
    let policy = p.dir.path().join("policy.json");
    std::fs::write(
        &policy,
        r#"{"rules": [{"name": "ro-rm", "pattern": ["rm"], "decision": "allow",
            "sandbox": "read-only"}]}"#,
    )
    .expect("policy");
    let d = p.daemon("workspace", &["--policy", &s(&policy)]);
    let mut c = d.client();
    let (text, _) = shell(&mut c, "s1", "echo in > a && echo OK", &p.ws());
    assert!(text.contains("OK"), "{text}");
    // `cd /` then `exit`: the shell restarts in / and its sandbox is the same.
    let r = ok(
        &mut c,
        "shell/exec",
        json!({"id": "s1", "command": "cd / && exit", "timeout": 30}),
    );
    assert_eq!(r["status"], "terminated", "{r}");
    let probe = format!("/execd-sandbox-probe-{}", std::process::id());
    let r = ok(
        &mut c,
        "shell/exec",
        json!({"id": "s1", "command": format!("pwd; echo x > {probe}"), "timeout": 30}),
    );
    let text = r["output"].as_str().unwrap_or("");
    assert!(text.contains("Permission denied"), "{r}");
    assert!(!Path::new(&probe).exists());
    // A per-line sandbox other than the session's is refused; the same one is fine.
    let (code, _, data) = err(
        &mut c,
        "shell/exec",
        json!({"id": "s1", "command": "true", "sandbox": {"network": "all"}}),
    );
    assert_eq!(code, -32602);
    assert_eq!(data.expect("data")["field"], "sandbox");
    ok(
        &mut c,
        "shell/exec",
        json!({"id": "s1", "command": "true", "sandbox": "workspace", "timeout": 30}),
    );
    // A line whose rule carries a narrower sandbox than the session's: refused.
    let (code, _, data) = err(
        &mut c,
        "shell/exec",
        json!({"id": "s1", "command": "rm -f a", "timeout": 30}),
    );
    assert_eq!(code, -32005);
    let data = data.expect("data");
    assert_eq!(data["rule"], "ro-rm");
    assert_eq!(data["reason"], "sandbox");
    assert!(p.ws().join("a").exists());
    // The session says its sandbox.
    let sessions = ok(&mut c, "shell/sessions", json!({}));
    assert_eq!(sessions["sessions"]["s1"]["sandbox"]["name"], "workspace");
    // A session asked wider than in force waits for an approver; with none it is not
    // made at all.
    let (code, _, _) = err(
        &mut c,
        "shell/sessions/create",
        json!({"id": "wide", "exec_dir": s(&p.ws()), "sandbox": "off"}),
    );
    assert_eq!(code, -32006);
    let sessions = ok(&mut c, "shell/sessions", json!({}));
    assert!(sessions["sessions"].get("wide").is_none(), "{sessions}");
}

#[test]
fn two_spawns_in_two_workspaces_cannot_write_each_others() {
    if !landlock() {
        return;
    }
    let p = Place::new(false);
    let ws2 = p.dir.path().join("ws2");
    std::fs::create_dir_all(&ws2).expect("mkdir");
    let d = p.daemon("workspace", &["--workspace", &s(&ws2)]);
    let mut c = d.client();
    let (text, code) = bash(&mut c, "echo a > first", &p.ws(), json!({}));
    assert_eq!(code, 0, "{text}");
    let line = format!("echo b > {}/second; echo c > mine", s(&p.ws()));
    let (text, _) = bash(&mut c, &line, &ws2, json!({}));
    assert!(text.contains("Permission denied"), "{text}");
    assert!(!p.ws().join("second").exists());
    assert!(ws2.join("mine").exists());
    // A directory in no workspace gets no $CWD root: only $TMPDIR is writable.
    let (text, _) = bash(&mut c, "echo z > here", &p.out(), json!({}));
    assert!(text.contains("Permission denied"), "{text}");
}

#[test]
fn sandboxes_come_from_the_policy_the_rules_and_the_request() {
    if !landlock() {
        return;
    }
    let p = Place::new(false);
    let audit = p.dir.path().join("audit.log");
    // No --sandbox: the policy's top-level one is in force.
    let d = p.policy_daemon(
        r#"{"sandbox": "workspace",
            "rules": [{"name": "touchy", "pattern": ["touch"], "decision": "allow",
                       "sandbox": "read-only"}]}"#,
        &["--audit", &s(&audit)],
    );
    let mut c = d.client();
    let init = ok(&mut c, "initialize", json!({"protocolVersion": 1}));
    let sb = &init["_meta"]["execd"]["sandbox"];
    assert_eq!(sb["default"]["name"], "workspace", "{sb}");
    assert!(sb["landlockAbi"].as_u64().unwrap_or(0) >= 3, "{sb}");
    assert_eq!(
        sb["workspaces"][0],
        s(&std::fs::canonicalize(p.ws()).expect("real"))
    );
    for k in ["network", "signals", "protect"] {
        assert!(sb[k].is_boolean(), "{k}: {sb}");
    }
    // The rule's sandbox holds what it matches, and only that.
    let (text, _) = bash(&mut c, "touch t1", &p.ws(), json!({}));
    assert!(text.contains("Permission denied"), "{text}");
    let (text, code) = bash(&mut c, "echo x > t2", &p.ws(), json!({}));
    assert_eq!(code, 0, "{text}");
    // A request narrows.
    let (text, _) = bash(
        &mut c,
        "echo x > t3",
        &p.ws(),
        json!({"sandbox": "read-only"}),
    );
    assert!(text.contains("Permission denied"), "{text}");
    assert!(!p.ws().join("t3").exists());
    let id = create_with(
        &mut c,
        json!({"sessionId": "s", "command": "sh", "args": ["-c", "echo x > t4"],
               "cwd": s(&p.ws()), "_meta": {"execd": {"sandbox": {"write": ["$TMPDIR"]}}}}),
    );
    wait_exit(&mut c, &id);
    assert!(!p.ws().join("t4").exists());
    let t = terminal_entry(&mut c, &id);
    assert_eq!(t["_meta"]["execd"]["sandbox"]["name"], "custom", "{t}");
    // Unknown keys and values are refused, naming them.
    let (code, _, data) = err(
        &mut c,
        "bash/exec",
        json!({"command": "true", "sandbox": {"write": [], "netwrk": "none"}}),
    );
    assert_eq!(code, -32602);
    assert_eq!(data.expect("data")["field"], "sandbox.netwrk");
    let (code, _, data) = err(
        &mut c,
        "terminal/create",
        json!({"sessionId": "s", "command": "true",
               "_meta": {"execd": {"sandbox": "sealed"}}}),
    );
    assert_eq!(code, -32602);
    assert_eq!(data.expect("data")["field"], "_meta.execd.sandbox");
    // Command objects and the audit's start records carry the sandbox.
    let cmds = ok(&mut c, "bash/commands", json!({}));
    let names: Vec<&str> = cmds["commands"]
        .as_array()
        .expect("commands")
        .iter()
        .filter_map(|c| c["sandbox"]["name"].as_str())
        .collect();
    assert!(
        names.contains(&"workspace") && names.contains(&"read-only"),
        "{cmds}"
    );
    wait_until("the audit file has the starts", || {
        std::fs::read_to_string(&audit).is_ok_and(|t| t.matches("\"start\"").count() >= 4)
    });
    let text = std::fs::read_to_string(&audit).expect("audit");
    for l in text.lines().filter(|l| l.contains("\"event\":\"start\"")) {
        let v: Value = serde_json::from_str(l).expect("json");
        assert!(v["sandbox"]["name"].is_string(), "{l}");
    }
}

/// The seccomp filters a process runs under (`Seccomp_filters:` of its status).
fn filters_in(status: &str) -> Option<u32> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("Seccomp_filters:"))?
        .trim()
        .parse()
        .ok()
}

/// A sandboxed command runs under exactly one seccomp program more than the daemon (which
/// runs under whatever this test runs under: a container's, a unit's), with `network:
/// none` and with `network: all` alike: one program per spawn, never several (each costs
/// the spawn its JIT and its cache of calls), and the guard against other architectures'
/// calls in every sandbox.
#[test]
fn a_sandboxed_command_runs_under_one_seccomp_program() {
    if !landlock() {
        return;
    }
    let Some(own) = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| filters_in(&s))
    else {
        return skip("this kernel says nothing of seccomp filters in /proc/PID/status");
    };
    let p = Place::new(false);
    let none = p.daemon("workspace", &[]);
    let all = p.policy_daemon(
        r#"{"sandbox": {"write": ["$CWD", "$TMPDIR"], "read": "all", "exec": "all",
                        "network": "all", "protect": []}}"#,
        &[],
    );
    for (what, d) in [("network none", &none), ("network all", &all)] {
        let (status, code) = bash(&mut d.client(), "cat /proc/self/status", &p.ws(), json!({}));
        assert_eq!(code, 0, "{status}");
        assert_eq!(filters_in(&status), Some(own + 1), "{what}: {status}");
        // And it is sandboxed: a write outside its roots fails.
        let (text, _) = bash(
            &mut d.client(),
            &format!("echo x > {}/x", s(&p.out())),
            &p.ws(),
            json!({}),
        );
        assert!(text.contains("Permission denied"), "{what}: {text}");
        assert_no_panic(d);
    }
}

#[test]
fn a_wider_request_asks_an_approver_or_is_denied() {
    if !landlock() {
        return;
    }
    let p = Place::new(false);
    let d = p.daemon("workspace", &[]);
    let mut a = d.client_in_other_process();
    ok(&mut a, "approvals/subscribe", json!({}));
    let mut c = d.client();
    let out = s(&p.out());
    c.send(
        "bash/exec",
        json!({"command": format!("echo x > {out}/wide"), "exec_dir": s(&p.ws()),
               "sandbox": {"write": ["$CWD", out]}}),
    )
    .expect("send");
    let asked = next_request(&mut a);
    let display = asked["params"]["payload"]["display"].to_string();
    assert!(
        display.contains(&format!("outside the sandbox: write {out}")),
        "{display}"
    );
    let id = asked["id"].clone();
    let answer =
        json!({"jsonrpc": "2.0", "id": id, "result": {"request_id": id, "response": "approve"}});
    a.send_line(answer.to_string().as_bytes()).expect("answer");
    let r = read_response(&mut c);
    assert_eq!(r["result"]["exit_code"], 0, "{r}");
    assert!(p.out().join("wide").exists());
    drop(a);
    // Under "escalation": "deny" the same request is refused.
    let policy = p.dir.path().join("deny.json");
    std::fs::write(&policy, r#"{"escalation": "deny"}"#).expect("policy");
    let d2 = p.daemon("workspace", &["--policy", &s(&policy)]);
    let mut c2 = d2.client();
    let (code, msg, data) = err(
        &mut c2,
        "bash/exec",
        json!({"command": "true", "exec_dir": s(&p.ws()), "sandbox": {"network": "all"}}),
    );
    assert_eq!(code, -32005, "{msg}");
    assert!(msg.contains("outside the sandbox: network all"), "{msg}");
    assert_eq!(data.expect("data")["reason"], "sandbox");
}

#[test]
fn a_sandbox_the_kernel_cannot_give_is_refused() {
    let p = Place::new(false);
    // ABI 2 cannot restrict writes: execd will not start with it as the default...
    let mut flags = p.flags("workspace");
    flags.extend(["--landlock-abi-max".to_string(), "2".to_string()]);
    let out = Command::new(env!("CARGO_BIN_EXE_execd"))
        .args(&flags)
        .arg("--socket")
        .arg(p.dir.path().join("x.sock"))
        .output()
        .expect("execd");
    assert_eq!(out.status.code(), Some(1));
    let err_text = String::from_utf8_lossy(&out.stderr);
    assert!(err_text.contains("sandbox unavailable"), "{err_text}");
    // ...and without a default, a request asking for one is refused -32004.
    let d = Daemon::start(&[
        "--workspace",
        &s(&p.ws()),
        "--tmpdir",
        &s(&p.tmp()),
        "--landlock-abi-max",
        "2",
    ]);
    let mut c = d.client();
    let (code, msg, _) = err(
        &mut c,
        "bash/exec",
        json!({"command": "true", "exec_dir": s(&p.ws()), "sandbox": "workspace"}),
    );
    assert_eq!(code, -32004);
    assert!(msg.starts_with("sandbox unavailable:"), "{msg}");
    // A sandbox naming $CWD with no workspace at all: execd says to name one.
    let out = Command::new(env!("CARGO_BIN_EXE_execd"))
        .args(["--sandbox", "workspace", "--socket"])
        .arg(p.dir.path().join("y.sock"))
        .output()
        .expect("execd");
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--workspace"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn under_a_docker_like_seccomp_filter_execd_runs_commands_but_refuses_sandboxes() {
    use std::os::unix::process::CommandExt;
    let p = Place::new(false);
    // Like Docker's default profile: `landlock_*` ENOSYS, `unshare` and `clone` with new
    // namespaces EPERM, `clone3` ENOSYS.
    let programs = {
        use seccompiler::*;
        let arch: TargetArch = std::env::consts::ARCH.try_into().expect("arch");
        let ns = [
            libc::CLONE_NEWNS,
            libc::CLONE_NEWUSER,
            libc::CLONE_NEWPID,
            libc::CLONE_NEWNET,
        ];
        let with_ns = |arg: u8| -> Vec<SeccompRule> {
            ns.iter()
                .map(|&f| {
                    SeccompRule::new(vec![SeccompCondition::new(
                        arg,
                        SeccompCmpArgLen::Qword,
                        SeccompCmpOp::MaskedEq(f as u64),
                        f as u64,
                    )
                    .expect("condition")])
                    .expect("rule")
                })
                .collect()
        };
        let eperm: BpfProgram = SeccompFilter::new(
            [
                (libc::SYS_unshare, with_ns(0)),
                (libc::SYS_clone, with_ns(0)),
            ]
            .into_iter()
            .collect(),
            SeccompAction::Allow,
            SeccompAction::Errno(libc::EPERM as u32),
            arch,
        )
        .expect("filter")
        .try_into()
        .expect("bpf");
        let enosys: BpfProgram = SeccompFilter::new(
            [
                (libc::SYS_landlock_create_ruleset, vec![]),
                (libc::SYS_landlock_add_rule, vec![]),
                (libc::SYS_landlock_restrict_self, vec![]),
                (libc::SYS_clone3, vec![]),
            ]
            .into_iter()
            .collect(),
            SeccompAction::Allow,
            SeccompAction::Errno(libc::ENOSYS as u32),
            arch,
        )
        .expect("filter")
        .try_into()
        .expect("bpf");
        [eperm, enosys]
    };
    let filtered = |socket: &Path, flags: &[String]| {
        let mut cmd = Daemon::command(p.dir.path(), socket, &[]);
        cmd.args(flags);
        let programs = programs.clone();
        // SAFETY: the programs were built before the fork; loading them only makes
        // system calls.
        unsafe {
            cmd.pre_exec(move || {
                for prog in &programs {
                    seccompiler::apply_filter(prog).map_err(std::io::Error::other)?;
                }
                Ok(())
            });
        }
        cmd
    };
    // With a default sandbox it will not start: the kernel it sees has no Landlock.
    let out = filtered(&p.dir.path().join("a.sock"), &p.flags("workspace"))
        .output()
        .expect("execd");
    assert_eq!(out.status.code(), Some(1));
    let log = std::fs::read_to_string(p.dir.path().join("execd.log")).unwrap_or_default();
    assert!(log.contains("sandbox unavailable"), "{log}");
    // Without one it serves: its spawn needs neither clone3 nor a namespace.
    let socket = p.dir.path().join("b.sock");
    let flags = vec![
        "--workspace".to_string(),
        s(&p.ws()),
        "--tmpdir".into(),
        s(&p.tmp()),
    ];
    let child = filtered(&socket, &flags).spawn().expect("execd");
    let d = Daemon::adopt(Some(child), socket, TempDir::new());
    let mut c = d.client();
    let (text, code) = bash(&mut c, "echo plain", &p.ws(), json!({}));
    assert_eq!(code, 0, "{text}");
    assert!(text.contains("plain"));
    let (code, msg, _) = err(
        &mut c,
        "bash/exec",
        json!({"command": "true", "exec_dir": s(&p.ws()), "sandbox": "read-only"}),
    );
    assert_eq!(code, -32004);
    assert!(msg.contains("no Landlock"), "{msg}");
    let init = ok(&mut c, "initialize", json!({"protocolVersion": 1}));
    let sb = &init["_meta"]["execd"]["sandbox"];
    assert_eq!(sb["landlockAbi"], 0, "{sb}");
    assert_eq!(sb["protect"], false, "{sb}");
}

#[test]
fn below_landlock_6_a_seccomp_rule_keeps_signals_off_the_daemon() {
    if !landlock() {
        return;
    }
    let p = Place::new(false);
    let d = p.daemon("workspace", &["--landlock-abi-max", "5"]);
    let mut c = d.client();
    let init = ok(&mut c, "initialize", json!({"protocolVersion": 1}));
    assert_eq!(init["_meta"]["execd"]["sandbox"]["signals"], false);
    assert_eq!(init["_meta"]["execd"]["sandbox"]["landlockAbi"], 5);
    assert!(!spares_expected(&init));
    let daemon = d.pid();
    let line = format!(
        "kill -TERM {daemon}; echo pid=$?; kill -TERM -{daemon}; echo group=$?; \
         kill -0 -1; echo all=$?; echo x > {}/f; echo in > mine && echo KEPT",
        s(&p.out())
    );
    let (text, _) = bash(&mut c, &line, &p.ws(), json!({}));
    for want in ["pid=1", "group=1", "all=1", "KEPT"] {
        assert!(text.contains(want), "no {want:?} in:\n{text}");
    }
    assert!(pid_alive(daemon));
    assert!(!p.out().join("f").exists());
    assert_eq!(
        spares_of(daemon),
        Vec::<i32>::new(),
        "no spare a command could stop"
    );
    // The ways round kill: a pidfd of /proc/PID, and the daemon as the owner of a
    // descriptor's I/O signals (SIGIO's default ends a process).
    if have(&["python3"]) {
        let py = format!(
            "python3 -c 'import fcntl, os, signal\n\
             fd = os.open(\"/proc/{daemon}\", os.O_RDONLY)\n\
             try:\n    signal.pidfd_send_signal(fd, signal.SIGTERM); print(\"pidfd=0\")\n\
             except OSError as e: print(\"pidfd=%d\" % e.errno)\n\
             r, w = os.pipe()\n\
             try:\n    fcntl.fcntl(r, fcntl.F_SETOWN, {daemon}); print(\"owner=0\")\n\
             except OSError as e: print(\"owner=%d\" % e.errno)\n\
             fcntl.fcntl(r, fcntl.F_SETFL, fcntl.fcntl(r, fcntl.F_GETFL) | os.O_ASYNC)\n\
             os.write(w, b\"x\")'"
        );
        let (text, _) = bash(&mut c, &py, &p.ws(), json!({}));
        assert!(text.contains("pidfd=1"), "{text}");
        assert!(text.contains("owner=1"), "{text}");
        assert!(pid_alive(daemon), "{text}");
        ok(&mut c, "initialize", json!({"protocolVersion": 1}));
    }
}

#[test]
fn a_sandboxed_command_gets_no_way_to_the_hosts_sockets_and_the_daemons_tmpdir() {
    if !landlock() {
        return;
    }
    let p = Place::new(false);
    let mut flags = p.flags("workspace");
    flags.extend(["--socket".into(), s(&p.dir.path().join("e.sock"))]);
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_execd"));
    cmd.args(&flags)
        .args(["--kill-grace", "1s"])
        .env("SSH_AUTH_SOCK", "/nowhere/agent")
        .env("DBUS_SESSION_BUS_ADDRESS", "unix:path=/nowhere/bus")
        .env("DISPLAY", ":0")
        .env("TMUX", "/nowhere/tmux,1,0")
        .env("WAYLAND_DISPLAY", "wayland-0")
        .env("XDG_RUNTIME_DIR", "/nowhere")
        .env("KEEP_ME", "kept")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    let d = Daemon::adopt(
        Some(cmd.spawn().expect("execd")),
        p.dir.path().join("e.sock"),
        TempDir::new(),
    );
    let mut c = d.client();
    let (text, code) = bash(
        &mut c,
        "env",
        &p.ws(),
        json!({"env": {"TMPDIR": "/elsewhere", "SSH_AUTH_SOCK": "/asked"}}),
    );
    assert_eq!(code, 0, "{text}");
    for gone in [
        "SSH_AUTH_SOCK",
        "DBUS_SESSION_BUS_ADDRESS",
        "DISPLAY=",
        "TMUX=",
        "WAYLAND_DISPLAY",
        "XDG_RUNTIME_DIR",
    ] {
        assert!(!text.contains(gone), "{gone} in:\n{text}");
    }
    assert!(text.contains("KEEP_ME=kept"), "{text}");
    assert!(
        text.contains(&format!("TMPDIR={}\n", s(&p.tmp()))),
        "{text}"
    );
    // Running unsandboxed is wider than the workspace: it needs an approver.
    let (code, _, _) = err(
        &mut c,
        "bash/exec",
        json!({"command": "env", "exec_dir": s(&p.ws()), "sandbox": "off"}),
    );
    assert_eq!(code, -32006);
}

#[test]
fn a_symlink_out_of_the_workspace_is_no_way_out() {
    if !landlock() {
        return;
    }
    let p = Place::new(false);
    let d = p.daemon("workspace", &[]);
    let mut c = d.client();
    std::os::unix::fs::symlink(p.out(), p.ws().join("link")).expect("symlink");
    // A directory whose words lie in the workspace but which really lies outside: the
    // child finds it out and the start is refused, naming the field.
    let (code, msg, data) = err(
        &mut c,
        "bash/exec",
        json!({"command": "echo x > f", "exec_dir": s(&p.ws().join("link"))}),
    );
    assert_eq!(code, -32602, "{msg}");
    assert_eq!(data.expect("data")["field"], "exec_dir", "{msg}");
    assert!(!p.out().join("f").exists());
    // A root a request names through it: opened beneath the workspace, so refused.
    let (code, msg, data) = err(
        &mut c,
        "bash/exec",
        json!({"command": "echo x > link/g", "exec_dir": s(&p.ws()),
               "sandbox": {"write": ["$CWD/link"]}}),
    );
    assert_eq!(code, -32602, "{msg}");
    assert_eq!(data.expect("data")["field"], "sandbox", "{msg}");
    assert!(msg.contains("leads out"), "{msg}");
    assert!(!p.out().join("g").exists());
    // A root inside that exists narrows as asked.
    std::fs::create_dir_all(p.ws().join("sub")).expect("mkdir");
    let (text, _) = bash(
        &mut c,
        "echo x > sub/ok && echo x > notok",
        &p.ws(),
        json!({"sandbox": {"write": ["$CWD/sub"]}}),
    );
    assert!(p.ws().join("sub/ok").exists(), "{text}");
    assert!(!p.ws().join("notok").exists(), "{text}");
}

#[test]
fn an_upgrade_keeps_a_sessions_sandbox() {
    if !landlock() {
        return;
    }
    let p = Place::new(false);
    let d = p.daemon("workspace", &[]);
    let mut c = d.client();
    let r = ok(
        &mut c,
        "shell/sessions/create",
        json!({"id": "kept", "exec_dir": s(&p.ws()), "sandbox": "read-only"}),
    );
    assert_eq!(r["sandbox"]["name"], "read-only", "{r}");
    unsafe_kill(d.pid(), libc::SIGUSR2);
    wait_until("the new image serves", || {
        c.call("initialize", json!({"protocolVersion": 1}))
            .is_ok_and(|v| v["_meta"]["execd"]["upgrades"] == 1)
    });
    // Its shell, restarted after the upgrade too, runs in it still.
    shell(&mut c, "kept", "echo x > after; exit", &p.ws());
    let (text, _) = shell(&mut c, "kept", "echo x > after2", &p.ws());
    assert!(
        text.contains("Read-only file system") || text.contains("Permission denied"),
        "{text}"
    );
    assert!(!p.ws().join("after").exists() && !p.ws().join("after2").exists());
    let sessions = ok(&mut c, "shell/sessions", json!({}));
    assert_eq!(sessions["sessions"]["kept"]["sandbox"]["name"], "read-only");
}

/// `execctl` against daemon `d`, as a line a command runs.
fn execctl_line(d: &Daemon, args: &str) -> String {
    format!(
        "{} --socket {} {args}",
        env!("CARGO_BIN_EXE_execctl"),
        s(&d.socket)
    )
}

#[test]
fn a_sandboxed_command_asking_execd_gets_at_most_its_own_sandbox() {
    if !landlock() {
        return;
    }
    let p = Place::new(false);
    // Nothing is sandboxed unless asked: an outsider's command writes where it likes.
    let d = p.daemon("off", &[]);
    let mut c = d.client();
    let (text, code) = bash(
        &mut c,
        &format!("echo x > {}/plain", s(&p.out())),
        &p.ws(),
        json!({}),
    );
    assert_eq!(code, 0, "{text}");
    // A command in `workspace` asks execd, by execctl and by the socket, for commands
    // that write outside: in `/`, in `out`, and in a shell session of its own.
    let o = s(&p.out());
    let inner = [
        execctl_line(&d, &format!("run --cwd / -- sh -c 'echo x > {o}/run'")),
        execctl_line(&d, &format!("exec --cwd / 'echo x > {o}/exec'")),
        execctl_line(&d, &format!("shell --cwd {} < /dev/null", s(&p.ws()))),
    ]
    .join("; ");
    let line = format!(
        "{inner}; echo 'echo x > {o}/session' | {}; echo END",
        execctl_line(&d, "shell")
    );
    let (text, _) = bash(&mut c, &line, &p.ws(), json!({"sandbox": "workspace"}));
    assert!(text.contains("END"), "{text}");
    for f in ["run", "exec", "session"] {
        assert!(
            !p.out().join(f).exists(),
            "{f} escaped its caller's sandbox:\n{text}"
        );
    }
    assert!(text.contains("Permission denied"), "{text}");
    // What it started says so: its sandbox is the caller's.
    let listed = ok(&mut c, "bash/commands", json!({}));
    let names: Vec<&str> = listed["commands"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|cmd| cmd["sandbox"]["name"].as_str())
        .collect();
    assert!(names.contains(&"workspace"), "{listed}");
    assert_no_panic(&d);
}

#[test]
fn a_descendant_tied_to_no_command_runs_read_only() {
    if !landlock() || !have(&["setsid"]) {
        return;
    }
    let p = Place::new(false);
    let d = p.daemon("off", &[]);
    let mut c = d.client();
    // An unsandboxed command whose child outlives it and clears its environment: once
    // the command's leader is gone, the child is tied to no command (no cgroup here says
    // which, and it has no cookie), so what it asks for runs read-only, even in the
    // workspace.
    let done = p.dir.path().join("done");
    let o = s(&p.out());
    let late = format!(
        "sleep 0.5; env -i {} > {}/late.txt 2>&1; touch {}",
        execctl_line(
            &d,
            &format!(
                "exec --cwd {} 'echo x > {o}/late; echo x > here'",
                s(&p.ws())
            )
        ),
        o,
        s(&done),
    );
    let line = format!(
        "setsid sh -c '{}' < /dev/null > /dev/null 2>&1 & echo STARTED",
        late.replace('\'', "'\\''")
    );
    let (text, code) = bash(&mut c, &line, &p.ws(), json!({}));
    assert_eq!(code, 0, "{text}");
    wait_until("the orphan's execctl ends", || done.exists());
    let said = std::fs::read_to_string(p.out().join("late.txt")).unwrap_or_default();
    assert!(!p.out().join("late").exists(), "{said}");
    assert!(
        !p.ws().join("here").exists(),
        "read-only lets nothing write: {said}"
    );
    assert!(
        said.contains("Read-only file system") || said.contains("Permission denied"),
        "{said}"
    );
    assert_no_panic(&d);
}

/// A sandboxed command's `setsid` orphan, which neither a cgroup (`--cgroup off`) nor its
/// chain of parents ties to a command once the leader is gone, is tied by the cookie it
/// inherited: what it asks for runs in its command's sandbox with its `$CWD` (writes in
/// the workspace work, outside do not), not `read-only`. A cookie it rewrites to name
/// another command (an unsandboxed one) does not carry that command's tag: it ties
/// nothing, and the request runs read-only.
#[test]
fn a_descendant_is_tied_by_its_cookie_and_a_forged_one_ties_nothing() {
    if !landlock() || !have(&["setsid"]) {
        return;
    }
    let p = Place::new(false);
    let d = p.daemon("off", &["--cgroup", "off"]);
    let mut c = d.client();
    let wide = ok(
        &mut c,
        "bash/exec",
        json!({"command": "sleep 60", "async_mode": true, "exec_dir": s(&p.ws())}),
    );
    let wide = wide["command_id"].as_str().expect("command_id").to_string();
    let (ws, o) = (s(&p.ws()), s(&p.out()));
    let ask = |what: &str| {
        execctl_line(
            &d,
            &format!("exec --cwd {ws} 'echo x > {ws}/{what}; echo x > {o}/{what}'"),
        )
    };
    let late = format!(
        "sleep 0.5; {} > {ws}/tied.txt 2>&1; EXECD_TREE=${{EXECD_TREE%%:*}}:{wide} {} > \
         {ws}/forged.txt 2>&1; touch {ws}/done",
        ask("tied"),
        ask("forged"),
    );
    let line = format!(
        "setsid sh -c '{}' < /dev/null > /dev/null 2>&1 & echo STARTED",
        late.replace('\'', "'\\''")
    );
    let (text, code) = bash(&mut c, &line, &p.ws(), json!({"sandbox": "workspace"}));
    assert_eq!(code, 0, "{text}");
    wait_until("the orphan's requests end", || p.ws().join("done").exists());
    let said = |f: &str| std::fs::read_to_string(p.ws().join(f)).unwrap_or_default();
    // Tied by its cookie: its command's workspace, and no wider.
    assert!(p.ws().join("tied").exists(), "{}", said("tied.txt"));
    assert!(!p.out().join("tied").exists(), "{}", said("tied.txt"));
    // The forged cookie: read-only, neither write lands.
    assert!(!p.ws().join("forged").exists(), "{}", said("forged.txt"));
    assert!(!p.out().join("forged").exists(), "{}", said("forged.txt"));
    assert!(
        said("forged.txt").contains("Read-only file system")
            || said("forged.txt").contains("Permission denied"),
        "{}",
        said("forged.txt")
    );
    assert_no_panic(&d);
}

/// `execctl mcp` on daemon `d` with `extra` flags, driven by raw lines: each call's
/// `structuredContent` (or its error), after `initialize`.
struct Mcp {
    _ctl: cli::Ctl,
    stdin: std::process::ChildStdin,
    lines: std::sync::mpsc::Receiver<String>,
    next: u64,
}

impl Mcp {
    fn start(d: &Daemon, extra: &[&str]) -> Mcp {
        let mut args = vec!["mcp"];
        args.extend_from_slice(extra);
        let mut cmd = cli::command(Some(&d.socket), &args);
        cmd.stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null());
        let mut child = cmd.spawn().expect("spawn execctl mcp");
        let stdin = child.stdin.take().expect("stdin");
        let lines = lines_of(child.stdout.take().expect("stdout"));
        let mut m = Mcp {
            _ctl: cli::Ctl { child },
            stdin,
            lines,
            next: 1,
        };
        m.call(
            "initialize",
            json!({"protocolVersion": "2025-11-25", "capabilities": {},
            "clientInfo": {"name": "t", "version": "1"}}),
        );
        writeln!(
            m.stdin,
            "{}",
            json!({"jsonrpc": "2.0", "method": "notifications/initialized"})
        )
        .expect("write");
        m
    }

    #[track_caller]
    fn call(&mut self, method: &str, params: Value) -> Value {
        let id = self.next;
        self.next += 1;
        let msg = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        writeln!(self.stdin, "{msg}").expect("write");
        loop {
            let line = cli::next_line(&self.lines);
            let v: Value = serde_json::from_str(&line).expect("JSON");
            if v["id"] == id {
                return v;
            }
        }
    }

    #[track_caller]
    fn run(&mut self, args: Value) -> Value {
        let r = self.call("tools/call", json!({"name": "run", "arguments": args}));
        r["result"].clone()
    }
}

#[test]
fn execctl_mcp_sandbox_is_a_ceiling_and_its_calls_say_via_mcp() {
    if !landlock() {
        return;
    }
    let p = Place::new(false);
    let audit = p.dir.path().join("audit.jsonl");
    // Nothing is sandboxed by the daemon itself.
    let d = p.daemon("off", &["--audit", &s(&audit)]);
    let mut m = Mcp::start(&d, &["--cwd", &s(&p.ws()), "--sandbox", "read-only"]);
    let r = m.run(json!({"command": "echo x > made; echo x > $TMPDIR/made; echo END"}));
    let out = r["structuredContent"]["output"]
        .as_str()
        .unwrap_or("")
        .to_string();
    assert!(out.contains("END"), "{r}");
    assert!(
        !p.ws().join("made").exists(),
        "--sandbox read-only let a call write: {r}"
    );
    assert!(!p.tmp().join("made").exists(), "{r}");
    // Asking for more than the ceiling is a tool error naming it; asking for what it
    // allows runs.
    let r = m.run(json!({"command": "true", "sandbox": "off"}));
    assert_eq!(r["isError"], true, "{r}");
    let text = r["content"][0]["text"].as_str().unwrap_or("");
    assert!(text.contains("--sandbox"), "{r}");
    let r = m.run(json!({"command": "echo ok", "sandbox": "read-only"}));
    assert_ne!(r["isError"], true, "{r}");
    let r = m.run(json!({"command": "true", "sandbox": {"netwrk": "none"}}));
    assert_eq!(r["isError"], true, "{r}");
    // The shell tool's session runs under the ceiling too.
    let r = m.call(
        "tools/call",
        json!({"name": "shell", "arguments": {"command": "echo y > shellmade; echo DONE"}}),
    );
    assert!(r.to_string().contains("DONE"), "{r}");
    assert!(!p.ws().join("shellmade").exists(), "{r}");
    // A wider session of the same user (made from outside, running `cat`): the model
    // may name it, but not type into what runs there.
    ok(
        &mut d.client(),
        "shell/exec",
        json!({"id": "wide", "command": "cat", "async_mode": true, "exec_dir": s(&p.ws())}),
    );
    let r = m.call(
        "tools/call",
        json!({"name": "shell", "arguments": {"session": "wide", "command": "true"}}),
    );
    assert_eq!(r["result"]["isError"], true, "{r}");
    let r = m.call(
        "tools/call",
        json!({"name": "write", "arguments": {"id": "wide", "input": "typed\n"}}),
    );
    assert_eq!(r["result"]["isError"], true, "{r}");
    assert!(r.to_string().contains("wider than"), "{r}");
    // The audit says the door and the sandbox.
    // Its own starts: the run calls' commands and its shell session's lines.
    let starts = || -> Vec<Value> {
        std::fs::read_to_string(&audit)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter(|v| {
                v["event"] == "start"
                    && v["session"] != "wide"
                    && (v["shell"] == true
                        || v["id"].as_str().is_some_and(|i| i.starts_with("cmd_")))
            })
            .collect()
    };
    wait_until("the audit has the starts", || starts().len() >= 3);
    let text = std::fs::read_to_string(&audit).expect("audit");
    let starts = starts();
    assert_eq!(starts.len(), 3, "two run calls and a shell line:\n{text}");
    for st in &starts {
        assert_eq!(st["via"], "mcp", "{st}");
        assert_eq!(st["sandbox"]["write"], json!([]), "{st}");
    }
    assert_no_panic(&d);
}

#[test]
fn a_sandboxed_command_cannot_type_into_a_wider_program() {
    if !landlock() {
        return;
    }
    let p = Place::new(false);
    let d = p.daemon("off", &[]);
    let mut c = d.client();
    // An unsandboxed shell reading its stdin, started from outside.
    let r = ok(
        &mut c,
        "bash/exec",
        json!({"command": "sh", "session_id": "victim", "async_mode": true,
               "exec_dir": s(&p.ws())}),
    );
    let victim = r["command_id"].as_str().expect("command_id").to_string();
    // A command in `workspace` tries to type a line into it, by execctl and by a raw call.
    let o = s(&p.out());
    let typed = format!("echo x > {o}/typed\n");
    let line = format!(
        "printf '{}' | {}; echo write=$?; {}; echo call=$?",
        typed.replace('\n', "\\n"),
        execctl_line(&d, &format!("write {victim}")),
        execctl_line(
            &d,
            &format!(
                "call bash/write '{}'",
                json!({"session_id": "victim", "command_id": victim, "input": typed})
            )
        ),
    );
    let (text, _) = bash(&mut c, &line, &p.ws(), json!({"sandbox": "workspace"}));
    assert!(!text.contains("write=0"), "{text}");
    assert!(!text.contains("call=0"), "{text}");
    assert!(
        text.contains("wider than the most this caller may have"),
        "{text}"
    );
    // Nor by watching a wider session at /v1/shell/ws (keys are a running command's
    // input): the handshake is refused.
    ok(
        &mut c,
        "shell/exec",
        json!({"id": "wide", "command": "true", "exec_dir": s(&p.ws())}),
    );
    if have(&["python3"]) {
        let py = format!(
            "python3 -c 'import socket\n\
             s = socket.socket(socket.AF_UNIX); s.connect(\"{}\")\n\
             s.sendall(b\"GET /v1/shell/ws?session_id=wide HTTP/1.1\\r\\nHost: localhost\\r\\n\
             Upgrade: websocket\\r\\nConnection: Upgrade\\r\\n\
             Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\\r\\nSec-WebSocket-Version: 13\\r\\n\\r\\n\")\n\
             print(\"STATUS\", s.recv(4000).decode(errors=\"replace\"))'",
            s(&d.socket)
        );
        let (text, _) = bash(&mut c, &py, &p.ws(), json!({"sandbox": "workspace"}));
        assert!(text.contains("STATUS HTTP/1.1 "), "{text}");
        assert!(!text.contains(" 101 "), "{text}");
        assert!(
            text.contains("wider than the most this caller may have"),
            "{text}"
        );
    }
    // From outside it still takes input.
    ok(
        &mut c,
        "bash/write",
        json!({"session_id": "victim", "command_id": victim, "input": "exit 0\n"}),
    );
    wait_until("the victim ends", || {
        let r = ok(
            &mut c,
            "bash/output",
            json!({"session_id": "victim", "command_id": victim}),
        );
        r["status"] != "running"
    });
    assert!(!p.out().join("typed").exists(), "{text}");
    assert_no_panic(&d);
}

#[test]
fn execctl_http_and_ps_narrow_and_show_a_commands_sandbox() {
    if !landlock() {
        return;
    }
    let p = Place::new(false);
    let d = p.daemon("off", &[]);
    let ctl = |args: &[&str]| {
        let out = cli::command(Some(&d.socket), args)
            .current_dir(p.ws())
            .output()
            .expect("execctl");
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    };
    // execctl run, exec and shell narrow to read-only.
    let said = ctl(&[
        "run",
        "--sandbox",
        "read-only",
        "--",
        "sh",
        "-c",
        "echo x > by-run; echo RAN",
    ]);
    assert!(said.contains("RAN"), "{said}");
    assert!(!p.ws().join("by-run").exists(), "{said}");
    let said = ctl(&[
        "exec",
        "--sandbox",
        "read-only",
        "echo x > by-exec; echo RAN",
    ]);
    assert!(said.contains("RAN"), "{said}");
    assert!(!p.ws().join("by-exec").exists(), "{said}");
    let out = cli::command(Some(&d.socket), &["shell", "--sandbox", "read-only"])
        .current_dir(p.ws())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .and_then(|mut child| {
            use std::io::Write as _;
            child
                .stdin
                .take()
                .expect("stdin")
                .write_all(b"echo x > by-shell; echo RAN\n")?;
            child.wait_with_output()
        })
        .expect("execctl shell");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(said.contains("RAN"), "{said}");
    assert!(!p.ws().join("by-shell").exists(), "{said}");
    // An HTTP request narrows it the same way.
    let body = json!({"command": "echo x > by-http; echo END", "exec_dir": s(&p.ws()),
                      "sandbox": "read-only"})
    .to_string();
    let mut sock = std::os::unix::net::UnixStream::connect(&d.socket).expect("connect");
    sock.set_read_timeout(Some(WAIT)).expect("timeout");
    write!(
        sock,
        "POST /v1/bash/exec HTTP/1.1\r\nHost: execd\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .expect("write");
    let mut reply = String::new();
    sock.read_to_string(&mut reply).expect("read");
    assert!(reply.contains("END"), "{reply}");
    assert!(!p.ws().join("by-http").exists(), "{reply}");
    // Without a narrower sandbox the same line writes: the refusals above were the
    // sandbox's.
    let said = ctl(&["exec", "echo x > plain"]);
    assert!(p.ws().join("plain").exists(), "{said}");
    // ps -l says which sandbox each runs in.
    let mut c = d.client();
    ok(
        &mut c,
        "bash/exec",
        json!({"command": "sleep 30", "session_id": "ps", "async_mode": true,
               "exec_dir": s(&p.ws()), "sandbox": "read-only"}),
    );
    let listed = ctl(&["ps", "-l"]);
    assert!(listed.contains("read-only"), "{listed}");
    assert_no_panic(&d);
}

/// A daemon that is not root protects `.git` too: it makes its mount namespace inside a
/// user namespace of its own (mapping only its uid), so the workspace preset, the one
/// recommended for agents, works in a repository for the README's first setup (execd run
/// by the agent's own user). Its commands are who they were, write the workspace, and
/// cannot write `.git` or outside.
#[test]
fn a_daemon_that_is_not_root_protects_git_in_a_user_namespace() {
    if !landlock() || !running_as_root() {
        skip("needs Landlock, and root to start a daemon as another uid");
        return;
    }
    let setting = |path: &str| {
        std::fs::read_to_string(path)
            .ok()
            .and_then(|t| t.trim().parse::<u64>().ok())
    };
    if setting("/proc/sys/user/max_user_namespaces") == Some(0)
        || setting("/proc/sys/kernel/apparmor_restrict_unprivileged_userns") == Some(1)
        || setting("/proc/sys/kernel/unprivileged_userns_clone") == Some(0)
    {
        skip("this kernel forbids unprivileged user namespaces");
        return;
    }
    let p = Place::new(true);
    let nobody = 65534;
    let chown_all = Command::new("chown")
        .args(["-R", &format!("{nobody}:{nobody}"), &s(p.dir.path())])
        .status()
        .expect("chown");
    assert!(chown_all.success());
    let socket = p.dir.path().join("nobody.sock");
    let mut cmd = Daemon::command(p.dir.path(), &socket, &[]);
    cmd.args(p.flags("workspace"));
    // SAFETY: setgroups, setgid and setuid only make system calls.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut cmd, move || {
            if libc::setgroups(0, std::ptr::null()) != 0
                || libc::setgid(nobody) != 0
                || libc::setuid(nobody) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let d = Daemon::adopt(Some(cmd.spawn().expect("execd")), socket, TempDir::new());
    let mut c = d.client();
    let init = ok(&mut c, "initialize", json!({"protocolVersion": 1}));
    let sb = &init["_meta"]["execd"]["sandbox"];
    assert_eq!(sb["protect"], true, "{sb}");
    let o = s(&p.out());
    let (text, _) = bash(
        &mut c,
        &format!(
            "id -u; echo x > inside; echo x >> .git/config; echo x > .git/new; \
             echo x > {o}/escaped; git status --short; grep CapBnd /proc/self/status; \
             echo END"
        ),
        &p.ws(),
        json!({}),
    );
    assert!(text.contains("END"), "{text}");
    assert!(text.starts_with(&format!("{nobody}\n")), "{text}");
    assert!(p.ws().join("inside").exists(), "{text}");
    assert!(!p.ws().join(".git/new").exists(), "{text}");
    assert!(text.contains("Read-only file system"), "{text}");
    assert!(!p.out().join("escaped").exists(), "{text}");
    let config = std::fs::read_to_string(p.ws().join(".git/config")).unwrap_or_default();
    assert!(!config.ends_with("x\n"), "{config}");
    assert!(text.contains("?? inside"), "git works in it: {text}");
    // Entering the user namespace gave every capability in it; none is left to gain.
    assert!(text.contains("CapBnd:\t0000000000000000"), "{text}");
    assert_no_panic(&d);
}

/// The tag beside a command's cookie is what ties a process to it, so no sandboxed
/// command may read it from another command's environment: each sandboxed spawn is a
/// Landlock domain of its own, and `ptrace` access (which `/proc/PID/environ` needs) does
/// not cross out of one. An unsandboxed command of the same uid can read it (the control).
#[test]
fn a_sandboxed_command_cannot_read_another_commands_cookie_tag() {
    if !landlock() {
        return;
    }
    let p = Place::new(false);
    let d = p.daemon("off", &[]);
    let mut c = d.client();
    ok(
        &mut c,
        "bash/exec",
        json!({"command": "echo $$ > pid; exec sleep 60", "async_mode": true,
               "exec_dir": s(&p.ws())}),
    );
    wait_until("the command wrote its pid", || {
        std::fs::read_to_string(p.ws().join("pid")).is_ok_and(|t| t.ends_with('\n'))
    });
    let read = "tr '\\0' '\\n' < /proc/$(cat pid)/environ | grep -c EXECD_TREE_TAG=";
    let (text, _) = bash(&mut c, read, &p.ws(), json!({}));
    assert!(text.starts_with("1\n"), "the control reads it: {text}");
    let (text, _) = bash(&mut c, read, &p.ws(), json!({"sandbox": "workspace"}));
    assert!(!text.starts_with("1\n"), "{text}");
    assert!(text.contains("Permission denied"), "{text}");
    assert_no_panic(&d);
}
