//! Test harness: start the real `execd` on a temporary socket, talk JSON to it, wait with
//! bounds, and clean up every daemon and child on drop.

pub mod cli;
pub mod fuse;
pub mod mapper;
pub mod trees;
pub mod venv;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

pub use execd::client::{CallError, Client};
pub use serde_json::{json, Value};

/// Longest any single wait in a test may take before it fails.
pub const WAIT: Duration = Duration::from_secs(20);

static NEXT_DIR: AtomicUsize = AtomicUsize::new(0);

/// A fresh private directory under the system temp dir, removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new() -> TempDir {
        let n = NEXT_DIR.fetch_add(1, Ordering::SeqCst);
        let dir = std::env::temp_dir().join(format!("execd-test-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("create temp dir");
        TempDir(dir)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A client whose connection another process made (see `Daemon::client_in_other_process`);
/// the relay is killed and reaped on drop.
pub struct Relayed {
    pub client: Client,
    pub child: Child,
}

impl Relayed {
    /// The pid of the process the daemon sees as the peer.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl std::ops::Deref for Relayed {
    type Target = Client;
    fn deref(&self) -> &Client {
        &self.client
    }
}

impl std::ops::DerefMut for Relayed {
    fn deref_mut(&mut self) -> &mut Client {
        &mut self.client
    }
}

impl Drop for Relayed {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Where the benchmarks put the binaries they measure: built as `cargo build --release`
/// builds them, without the features the tests' dev-dependencies switch on in shared
/// crates (serde_json's `preserve_order`, for one), which `cargo bench` would otherwise
/// build into `CARGO_BIN_EXE_*`. Unset for the tests.
pub const BENCH_BIN_DIR: &str = "EXECD_BENCH_BIN_DIR";

/// The daemon the harness starts.
pub fn execd_bin() -> PathBuf {
    match std::env::var_os(BENCH_BIN_DIR) {
        Some(dir) => PathBuf::from(dir).join("execd"),
        None => PathBuf::from(env!("CARGO_BIN_EXE_execd")),
    }
}

/// The client the harness runs.
pub fn execctl_bin() -> PathBuf {
    match std::env::var_os(BENCH_BIN_DIR) {
        Some(dir) => PathBuf::from(dir).join("execctl"),
        None => PathBuf::from(env!("CARGO_BIN_EXE_execctl")),
    }
}

/// A running daemon on a temporary socket.
pub struct Daemon {
    pub child: Option<Child>,
    pub socket: PathBuf,
    pub dir: TempDir,
}

impl Daemon {
    /// Starts `execd` with a short kill grace and `extra` flags; waits until it listens.
    #[track_caller]
    pub fn start(extra: &[&str]) -> Daemon {
        let dir = TempDir::new();
        let socket = dir.path().join("execd.sock");
        Daemon::start_at(dir, socket, extra)
    }

    #[track_caller]
    pub fn start_at(dir: TempDir, socket: PathBuf, extra: &[&str]) -> Daemon {
        let child = Daemon::command(dir.path(), &socket, extra)
            .spawn()
            .expect("spawn execd");
        Daemon::adopt(Some(child), socket, dir)
    }

    /// What `start_at` runs: `execd --socket SOCKET --kill-grace 1s EXTRA...`, stderr to
    /// `dir/execd.log`; for a test that changes it before spawning it and `adopt`ing it.
    #[track_caller]
    pub fn command(dir: &Path, socket: &Path, extra: &[&str]) -> Command {
        let log = std::fs::File::create(dir.join("execd.log")).expect("log file");
        let mut cmd = Command::new(execd_bin());
        cmd.arg("--socket").arg(socket).args(["--kill-grace", "1s"]);
        cmd.args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(log));
        cmd
    }

    /// A daemon started some other way (its own flags, environment or stderr), once it
    /// listens on `socket`; `child` is stopped on drop.
    #[track_caller]
    pub fn adopt(child: Option<Child>, socket: PathBuf, dir: TempDir) -> Daemon {
        let d = Daemon { child, socket, dir };
        wait_until("execd listens", || {
            std::os::unix::net::UnixStream::connect(&d.socket).is_ok()
        });
        d
    }

    pub fn pid(&self) -> i32 {
        self.child.as_ref().map_or(0, |c| c.id() as i32)
    }

    /// A new connection with a bounded read timeout.
    #[track_caller]
    pub fn client(&self) -> Client {
        let mut c = Client::connect(&self.socket).expect("connect to execd");
        c.timeout = Some(WAIT);
        c
    }

    /// A connection made by another process: an `execctl dial-stdio` relaying one end
    /// of a socket pair to the daemon, so the daemon sees a peer other than this test
    /// process (an approver must never be the requester's process).
    #[track_caller]
    pub fn client_in_other_process(&self) -> Relayed {
        self.client_in_other_process_as(None)
    }

    /// The same as another user: the relay runs as `uid` (gid the same number), so the
    /// daemon sees that user (started with `--socket-mode 0666`, after `let_others_in`).
    #[track_caller]
    pub fn client_in_other_process_as(&self, uid: Option<u32>) -> Relayed {
        let (ours, theirs) = std::os::unix::net::UnixStream::pair().expect("socketpair");
        let mut cmd = Command::new(execctl_bin());
        if let Some(uid) = uid {
            use std::os::unix::process::CommandExt;
            // SAFETY: setgroups, setgid and setuid are async-signal-safe and touch nothing
            // of the parent's.
            unsafe {
                cmd.pre_exec(move || {
                    if libc::setgroups(0, std::ptr::null()) != 0
                        || libc::setgid(uid) != 0
                        || libc::setuid(uid) != 0
                    {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
        }
        let child = cmd
            .arg("--socket")
            .arg(&self.socket)
            .arg("dial-stdio")
            .stdin(Stdio::from(std::os::fd::OwnedFd::from(
                theirs.try_clone().expect("dup"),
            )))
            .stdout(Stdio::from(std::os::fd::OwnedFd::from(theirs)))
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn execctl dial-stdio");
        let mut client = Client::from_stream(ours).expect("client");
        client.timeout = Some(WAIT);
        Relayed { client, child }
    }

    /// The daemon's stderr so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("execd.log")).unwrap_or_default()
    }

    /// Sends SIGTERM and waits (bounded) for the daemon to exit; returns its status code.
    #[track_caller]
    pub fn terminate(&mut self) -> Option<i32> {
        let mut child = self.child.take()?;
        // SAFETY-free: plain kill(2) through the libc crate on our own child.
        unsafe_kill(child.id() as i32, libc::SIGTERM);
        let deadline = Instant::now() + WAIT;
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                return status.code();
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!("execd did not exit within {WAIT:?} of SIGTERM");
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Lets other users reach the socket (started with `--socket-mode 0666`): its private
    /// directory becomes searchable.
    pub fn let_others_in(&self) {
        std::fs::set_permissions(
            self.dir.path(),
            std::os::unix::fs::PermissionsExt::from_mode(0o755),
        )
        .expect("let other users reach the socket");
    }

    /// Resident set size of the daemon in KiB, from /proc.
    pub fn rss_kb(&self) -> u64 {
        rss_kb(self.pid())
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            unsafe_kill(child.id() as i32, libc::SIGTERM);
            let deadline = Instant::now() + Duration::from_secs(5);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = child.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// kill(2) for tests; a missing process is not an error.
pub fn unsafe_kill(pid: i32, sig: i32) {
    // SAFETY: kill takes plain integers and touches no memory.
    unsafe {
        libc::kill(pid, sig);
    }
}

/// The fields of `/proc/PID/stat` after the parenthesised command name: state, ppid,
/// pgrp, ...
fn stat_fields(pid: i32) -> Option<Vec<String>> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = stat.rsplit(')').next()?;
    Some(rest.split_whitespace().map(String::from).collect())
}

/// Pids of every process on the machine.
fn all_pids() -> Vec<i32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| e.file_name().to_string_lossy().parse().ok())
        .collect()
}

fn is_live(fields: &[String]) -> bool {
    !matches!(fields.first().map(String::as_str), Some("Z" | "X"))
}

/// Whether a pid names a live (not zombie) process.
pub fn pid_alive(pid: i32) -> bool {
    stat_fields(pid).is_some_and(|f| is_live(&f))
}

/// Whether any live process is in process group `pgid`.
pub fn group_alive(pgid: i32) -> bool {
    all_pids().into_iter().any(|pid| {
        stat_fields(pid)
            .is_some_and(|f| is_live(&f) && f.get(2).and_then(|g| g.parse().ok()) == Some(pgid))
    })
}

/// Whether a live process of group `pgid` runs the program named `comm` (its
/// `/proc/PID/comm`): a shell has started it, and a signal to the group reaches it. (A
/// shell running `-c` catches SIGINT until its foreground job is started: one that comes
/// earlier is taken by the shell for itself and the job it starts then runs on, as in
/// any terminal.)
pub fn group_runs(pgid: i32, comm: &str) -> bool {
    all_pids().into_iter().any(|pid| {
        stat_fields(pid)
            .is_some_and(|f| is_live(&f) && f.get(2).and_then(|g| g.parse().ok()) == Some(pgid))
            && std::fs::read_to_string(format!("/proc/{pid}/comm"))
                .is_ok_and(|c| c.trim_end() == comm)
    })
}

/// Whether a live process of the session led by `leader` runs the program named `comm`:
/// a job a shell in its own terminal session (a shell session's bash) has started.
pub fn session_runs(leader: i32, comm: &str) -> bool {
    !in_session(leader, comm).is_empty()
}

/// The live processes of the session led by `leader` that run the program named `comm`.
pub fn in_session(leader: i32, comm: &str) -> Vec<i32> {
    all_pids()
        .into_iter()
        .filter(|&pid| {
            stat_fields(pid).is_some_and(|f| {
                is_live(&f) && f.get(3).and_then(|s| s.parse().ok()) == Some(leader)
            }) && std::fs::read_to_string(format!("/proc/{pid}/comm"))
                .is_ok_and(|c| c.trim_end() == comm)
        })
        .collect()
}

/// Resident set size of a process in KiB.
pub fn rss_kb(pid: i32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// The daemon's off-loop reader: its live child named `execd-reader`.
pub fn reader_of(daemon: i32) -> Option<i32> {
    all_pids().into_iter().find(|&p| {
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{p}/stat")) else {
            return false;
        };
        let (name, rest) = stat.rsplit_once(')').unwrap_or_default();
        let f: Vec<&str> = rest.split_whitespace().collect();
        name.ends_with("(execd-reader")
            && is_live(&f.iter().map(|s| s.to_string()).collect::<Vec<_>>())
            && f.get(1).and_then(|pp| pp.parse().ok()) == Some(daemon)
    })
}

/// Whether a daemon that answered `initialize` with `init` makes spares: everywhere but
/// where Landlock cannot scope signals (execd(8), SECURITY).
pub fn spares_expected(init: &serde_json::Value) -> bool {
    let sb = &init["_meta"]["execd"]["sandbox"];
    sb["landlockAbi"] == 0 || sb["signals"] == true
}

/// The daemon's spare children (named `execd-spare`), alive.
pub fn spares_of(daemon: i32) -> Vec<i32> {
    all_pids()
        .into_iter()
        .filter(|&p| {
            let Ok(stat) = std::fs::read_to_string(format!("/proc/{p}/stat")) else {
                return false;
            };
            let (name, rest) = stat.rsplit_once(')').unwrap_or_default();
            let f: Vec<String> = rest.split_whitespace().map(str::to_string).collect();
            name.ends_with("(execd-spare")
                && is_live(&f)
                && f.get(1).and_then(|pp| pp.parse().ok()) == Some(daemon)
        })
        .collect()
}

/// Children of `pid` that are zombies.
pub fn zombie_children(pid: i32) -> Vec<i32> {
    all_pids()
        .into_iter()
        .filter(|&p| {
            stat_fields(p).is_some_and(|f| {
                f.first().map(String::as_str) == Some("Z")
                    && f.get(1).and_then(|pp| pp.parse().ok()) == Some(pid)
            })
        })
        .collect()
}

/// 127.0.0.1:8080, the address the README's HTTP examples name, held by one test at a
/// time: the README's transcript (readme) and its Python block (http) each start a daemon
/// listening there, and every test shares this process, so they may run at once. Drop
/// the daemon before the hold (declare the hold first); dropping the hold waits, at most
/// `WAIT`, until nothing accepts there, so the next holder finds the address free.
pub struct ReadmeAddress {
    _held: std::sync::MutexGuard<'static, ()>,
}

impl ReadmeAddress {
    pub const ADDR: &'static str = "127.0.0.1:8080";

    /// Waits until no other test holds the address (each holder's own waits are bounded).
    pub fn hold() -> ReadmeAddress {
        static HELD: std::sync::Mutex<()> = std::sync::Mutex::new(());
        // A holder that failed an assertion poisoned it; the address is free all the same.
        ReadmeAddress {
            _held: HELD.lock().unwrap_or_else(|p| p.into_inner()),
        }
    }
}

impl Drop for ReadmeAddress {
    fn drop(&mut self) {
        let deadline = Instant::now() + WAIT;
        while std::net::TcpStream::connect(Self::ADDR).is_ok() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

/// Whether the tests run in CI (`CI=true`, as .ci/run is run): there every capability a
/// test needs (root, a writable cgroup2 mount, the tools .ci/run installs) must be present.
pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true")
}

/// A test cannot run here because `why`; the caller returns after this. In CI that fails
/// the test, since CI must provide what the test needs and a skip there would pass
/// without testing anything. Elsewhere it says `SKIPPED <test>: <why>` in one line on
/// the terminal of a plain `cargo test`: written to file descriptor 2 itself, past
/// libtest's capture (which takes only what `print!` and `eprint!` write), so a skip
/// never passes unseen as a success.
#[track_caller]
pub fn skip(why: &str) {
    let here = std::panic::Location::caller();
    let thread = std::thread::current();
    let test = thread.name().unwrap_or("a test");
    assert!(
        !in_ci(),
        "{test} ({here}) cannot run under CI=true: {why}; CI must provide it"
    );
    skipped(&format!("{test}: {why}"));
}

/// Says `SKIPPED <what>` in one line, on the terminal of a plain `cargo test` (see `skip`).
pub fn skipped(what: &str) {
    use std::io::Write;
    let line = format!("SKIPPED {what}\n");
    let _ = std::io::stderr().lock().write_all(line.as_bytes());
}

/// Whether each of `tools` is on `PATH`: programs beyond bash, coreutils, util-linux,
/// procps and python3, which a fresh machine may lack (CI installs them). If one is not
/// there, this `skip`s naming it, and the caller returns.
#[track_caller]
pub fn have(tools: &[&str]) -> bool {
    let missing: Vec<&str> = tools.iter().copied().filter(|t| !on_path(t)).collect();
    match missing.as_slice() {
        [] => return true,
        [one] => skip(&format!(
            "{one} is not installed (not on PATH; .ci/run installs it)"
        )),
        _ => skip(&format!(
            "{} are not installed (not on PATH; .ci/run installs them)",
            missing.join(" and ")
        )),
    }
    false
}

/// Whether `program` is an executable file in a directory of this process's `PATH`, where
/// `Command` (and a shell started with this `PATH`) looks for it.
fn on_path(program: &str) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::env::var_os("PATH").is_some_and(|path| {
        std::env::split_paths(&path).any(|dir| {
            std::fs::metadata(dir.join(program))
                .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
    })
}

/// Whether this process runs as root (needed to start a daemon that switches users, or
/// to connect as another uid).
pub fn running_as_root() -> bool {
    // SAFETY: geteuid cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// Whether a daemon this process starts may run its upgrade in real time, as the daemon
/// decides (`sys::upgrade::raise_for_swap`): it runs as root (a non-root process's
/// capabilities do not survive the daemon's exec) with `CAP_SYS_NICE` in its effective set
/// (root in a container can lack it), under the normal policy at nice 0, and the kernel
/// grants `SCHED_RR` (a cgroup without real-time runtime refuses it even so), which a
/// child started the same way tries first.
pub fn may_raise_priority() -> bool {
    use std::os::unix::process::CommandExt;
    const CAP_SYS_NICE: u32 = 23;
    let capable = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            let caps = status.lines().find_map(|l| l.strip_prefix("CapEff:"))?;
            u64::from_str_radix(caps.trim(), 16).ok()
        })
        .is_some_and(|caps| caps & (1 << CAP_SYS_NICE) != 0);
    let Some((policy, nice)) = std::fs::read_to_string("/proc/self/stat")
        .ok()
        .and_then(|s| {
            let after = s.get(s.rfind(')')? + 2..)?.to_string();
            let fields: Vec<&str> = after.split(' ').collect();
            // Fields 19 (nice) and 41 (policy), counted from 1; `after` starts at field 3.
            Some((
                fields.get(38)?.parse::<i64>().ok()?,
                fields.get(16)?.parse::<i64>().ok()?,
            ))
        })
    else {
        return false;
    };
    if !running_as_root() || !capable || policy != 0 || nice != 0 {
        return false;
    }
    let mut probe = Command::new("true");
    // SAFETY: sched_setscheduler is a system call on plain data, safe between fork and
    // exec; the child is ours alone.
    unsafe {
        probe.pre_exec(|| {
            let param = libc::sched_param { sched_priority: 1 };
            if libc::sched_setscheduler(0, libc::SCHED_RR | libc::SCHED_RESET_ON_FORK, &param) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    probe
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Has `cmd` run as uid and gid 65534 (nobody), with no other group; the test process
/// must be root (`running_as_root`).
pub fn as_nobody(cmd: &mut Command) {
    use std::os::unix::process::CommandExt;
    // SAFETY: setgroups, setgid and setuid are async-signal-safe and touch nothing of the
    // parent's; the groups go first, while the child may still set them.
    unsafe {
        cmd.pre_exec(|| {
            let groups = [65534 as libc::gid_t];
            if libc::setgroups(1, groups.as_ptr()) != 0
                || libc::setgid(65534) != 0
                || libc::setuid(65534) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// Polls `cond` every 10 ms until it holds; panics after `WAIT`.
#[track_caller]
pub fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + WAIT;
    while !cond() {
        if Instant::now() > deadline {
            panic!("timed out after {WAIT:?} waiting for: {what}");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Calls and expects success.
#[track_caller]
pub fn ok(c: &mut Client, method: &str, params: Value) -> Value {
    match c.call(method, params.clone()) {
        Ok(v) => v,
        Err(e) => panic!("{method} {params} failed: {e}"),
    }
}

/// Calls and expects a JSON-RPC error; returns `(code, message, data)`.
#[track_caller]
pub fn err(c: &mut Client, method: &str, params: Value) -> (i64, String, Option<Value>) {
    match c.call(method, params.clone()) {
        Ok(v) => panic!("{method} {params} unexpectedly succeeded: {v}"),
        Err(CallError::Rpc {
            code,
            message,
            data,
        }) => (code, message, data),
        Err(e) => panic!("{method} {params}: transport error {e}"),
    }
}

/// `terminal/create` with the given params; returns the terminal id.
#[track_caller]
pub fn create_with(c: &mut Client, params: Value) -> String {
    let r = ok(c, "terminal/create", params);
    r["terminalId"]
        .as_str()
        .unwrap_or_else(|| panic!("terminalId missing in {r}"))
        .to_string()
}

/// Every terminal the caller has, from `terminal/list`.
#[track_caller]
pub fn terminals(c: &mut Client) -> Vec<Value> {
    let r = ok(c, "terminal/list", json!({}));
    r["terminals"]
        .as_array()
        .unwrap_or_else(|| panic!("terminals missing in {r}"))
        .clone()
}

/// The `terminal/list` entry of one terminal.
#[track_caller]
pub fn terminal_entry(c: &mut Client, id: &str) -> Value {
    terminals(c)
        .into_iter()
        .find(|t| t["terminalId"] == id)
        .unwrap_or_else(|| panic!("{id} is not in terminal/list"))
}

/// The leader pid of a terminal, from `terminal/list`.
#[track_caller]
pub fn pid_of(c: &mut Client, id: &str) -> i32 {
    let e = terminal_entry(c, id);
    e["pid"]
        .as_i64()
        .unwrap_or_else(|| panic!("pid missing in {e}")) as i32
}

/// Creates a terminal in session `s` and returns its id.
#[track_caller]
pub fn create(c: &mut Client, command: &str, args: &[&str]) -> String {
    let r = ok(
        c,
        "terminal/create",
        json!({"sessionId": "s", "command": command, "args": args}),
    );
    r["terminalId"].as_str().expect("terminalId").to_string()
}

/// `terminal/wait_for_exit` in session `s`.
#[track_caller]
pub fn wait_exit(c: &mut Client, id: &str) -> Value {
    ok(
        c,
        "terminal/wait_for_exit",
        json!({"sessionId": "s", "terminalId": id}),
    )
}

/// `terminal/output` in session `s`.
#[track_caller]
pub fn output(c: &mut Client, id: &str) -> Value {
    ok(
        c,
        "terminal/output",
        json!({"sessionId": "s", "terminalId": id}),
    )
}

/// A request line with a numeric id (no newline), for tests that write raw lines.
pub fn request(id: u64, method: &str, params: Value) -> String {
    json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}).to_string()
}

/// The daemon's log shows no panic.
#[track_caller]
pub fn assert_no_panic(d: &Daemon) {
    let log = d.log();
    assert!(!log.contains("panicked"), "execd panicked:\n{log}");
}

/// A file the command waits for before going on, and the shell loop that waits for it.
pub fn gate(d: &Daemon, name: &str) -> (PathBuf, String) {
    let path = d.dir.path().join(name);
    let wait = format!("while [ ! -e '{}' ]; do sleep 0.01; done", path.display());
    (path, wait)
}

/// Lets the command waiting for `path` go on (see `gate`).
pub fn open_gate(path: &Path) {
    std::fs::write(path, b"").expect("create gate file");
}

/// `r.read(buf)`, again whenever a signal interrupts it. A socket read with a timeout
/// (SO_RCVTIMEO) fails with EINTR when any signal wakes its thread, even one that is then
/// ignored (signal(7)): here SIGCHLD, when a child exits while the thread that spawned it
/// has signals blocked inside `spawn`, and every test's threads spawn children in this
/// one process. (`read_to_end`, `read_line` and `write_all` retry on their own.)
pub fn read_some(r: &mut impl std::io::Read, buf: &mut [u8]) -> std::io::Result<usize> {
    loop {
        match r.read(buf) {
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            done => return done,
        }
    }
}

/// The next message sent to an approver that is a server request (has `method` and
/// `id`): an approval request.
#[track_caller]
pub fn next_request(a: &mut Client) -> Value {
    loop {
        let m = a.read_message(Some(WAIT)).expect("an approval request");
        if m.get("method").is_some() && m.get("id").is_some() {
            return m;
        }
    }
}

/// Reads raw lines until one is a response (has `id` and no `method`).
#[track_caller]
pub fn read_response(c: &mut Client) -> Value {
    loop {
        let m = c.read_message(Some(WAIT)).expect("read a message");
        if m.get("method").is_none() {
            return m;
        }
    }
}

/// CPU time (user + system) a process has used, in clock ticks, from `/proc/PID/stat`.
pub fn cpu_ticks(pid: i32) -> u64 {
    // utime and stime are fields 14 and 15 of stat; `stat_fields` starts at field 3.
    stat_fields(pid)
        .map(|f| {
            let tick = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
            tick(11) + tick(12)
        })
        .unwrap_or(0)
}

static NEXT_CGROUP: AtomicUsize = AtomicUsize::new(0);

/// A private parent cgroup under the cgroup2 mount (found in /proc/self/mountinfo) for a
/// daemon's `--cgroup`, torn down on drop: everything in it killed, every cgroup below it
/// removed, deepest first.
pub struct TestCgroup(pub PathBuf);

impl TestCgroup {
    /// `execd-KIND-PID-N` under the cgroup2 mount; why not, where there is no writable one.
    pub fn new(kind: &str) -> Result<TestCgroup, String> {
        let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        let Some(mount) = execd::cgroup2_mount(&mountinfo) else {
            return Err("no cgroup2 mount in /proc/self/mountinfo".into());
        };
        let n = NEXT_CGROUP.fetch_add(1, Ordering::SeqCst);
        let dir = mount.join(format!("execd-{kind}-{}-{n}", std::process::id()));
        std::fs::create_dir(&dir).map_err(|e| {
            format!(
                "cannot create the cgroup {}: {e} (needs root)",
                dir.display()
            )
        })?;
        Ok(TestCgroup(dir))
    }

    pub fn path(&self) -> &str {
        self.0.to_str().expect("utf-8")
    }

    /// The command cgroups execd made in it.
    pub fn command_cgroups(&self) -> Vec<PathBuf> {
        std::fs::read_dir(&self.0)
            .map(|d| {
                d.flatten()
                    .map(|e| e.path())
                    .filter(|p| {
                        p.file_name()
                            .is_some_and(|n| n.to_string_lossy().starts_with("cmd-"))
                    })
                    .collect()
            })
            .unwrap_or_default()
    }
}

impl Drop for TestCgroup {
    fn drop(&mut self) {
        // Every cgroup below, deepest first.
        let mut dirs = Vec::new();
        let mut stack = vec![self.0.clone()];
        while let Some(d) = stack.pop() {
            if let Ok(rd) = std::fs::read_dir(&d) {
                stack.extend(
                    rd.flatten()
                        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                        .map(|e| e.path()),
                );
            }
            dirs.push(d);
        }
        for d in dirs.iter().skip(1) {
            let _ = std::fs::write(d.join("cgroup.kill"), "1");
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        for d in dirs.iter().rev() {
            while std::fs::remove_dir(d).is_err() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
}

/// The lines `r` gives, on a channel, read by a thread of their own until it ends (or
/// nobody listens any more).
pub fn lines_of(r: impl std::io::Read + Send + 'static) -> std::sync::mpsc::Receiver<String> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        use std::io::BufRead;
        for line in std::io::BufReader::new(r).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

/// A child killed and reaped on drop, so a failing test leaves none behind.
pub struct Reap(pub Child);

impl Drop for Reap {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Reap {
    /// Waits for the child to exit, at most `bound`; its output then.
    #[track_caller]
    pub fn finish(mut self, bound: Duration) -> Output {
        let deadline = Instant::now() + bound;
        loop {
            if let Ok(Some(_)) = self.0.try_wait() {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "child still running after {bound:?}"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        let mut out = Vec::new();
        let mut err = Vec::new();
        use std::io::Read;
        if let Some(mut s) = self.0.stdout.take() {
            let _ = s.read_to_end(&mut out);
        }
        if let Some(mut s) = self.0.stderr.take() {
            let _ = s.read_to_end(&mut err);
        }
        let status = self.0.wait().expect("wait");
        Output {
            status,
            stdout: out,
            stderr: err,
        }
    }
}

/// A daemon with `policy` (JSON) and an audit file, and `extra` flags: the daemon and the
/// audit file's path.
pub fn with_policy(policy: &str, extra: &[&str]) -> (Daemon, PathBuf) {
    let dir = TempDir::new();
    let path = dir.path().join("policy.json");
    std::fs::write(&path, policy).expect("policy");
    let audit = dir.path().join("audit.jsonl");
    let socket = dir.path().join("execd.sock");
    let mut flags = vec![
        "--policy".to_string(),
        path.display().to_string(),
        "--audit".into(),
        audit.display().to_string(),
    ];
    flags.extend(extra.iter().map(|s| s.to_string()));
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    (Daemon::start_at(dir, socket, &flags), audit)
}
