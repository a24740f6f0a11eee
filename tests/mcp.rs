//! `execctl mcp` (PROTOCOL 17): the official MCP SDKs, unmodified, over stdio (Python
//! `mcp` in the tests' virtualenv, `tests/sdk/mcp_drive.py`; TypeScript
//! `@modelcontextprotocol/sdk` where Node is installed), protocol edge cases by raw
//! JSON-RPC lines, and how the server finds (or refuses) a daemon.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::util::cli::*;
use crate::util::venv::{run_bounded, sdk_python};
use crate::util::*;

const POLICY: &str = r#"{
  "default": "allow",
  "rules": [
    {"name": "no-shutdown", "pattern": ["shutdown"], "decision": "deny",
     "justification": "not from an agent"},
    {"name": "echo-ask", "pattern": ["echo"], "decision": "ask"}
  ]
}"#;

/// A daemon with `POLICY` (`gated`) or none.
fn daemon(gated: bool) -> Daemon {
    if !gated {
        return Daemon::start(&[]);
    }
    let dir = TempDir::new();
    let policy = dir.path().join("policy.json");
    std::fs::write(&policy, POLICY).expect("write policy");
    let socket = dir.path().join("execd.sock");
    Daemon::start_at(dir, socket, &["--policy", policy.to_str().expect("utf-8")])
}

/// What `mcp_drive.py SCENARIO` printed: its `RESULT` objects (after checking it passed).
#[track_caller]
fn drive(python: &Path, scenario: &str, extra: &[&str], server: &[&str], log: &Path) -> Vec<Value> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/sdk/mcp_drive.py");
    let out = run_bounded(
        Command::new(python)
            .arg("-B")
            .arg(&script)
            .arg(scenario)
            .args(extra)
            .arg("--server")
            .args(server)
            // The SDK passes its own minimal environment to the server; this keeps the
            // test's own variables from reaching the script's decisions.
            .env_remove("EXECD_SOCKET")
            .env_remove("EXECD_HOST"),
        Duration::from_secs(120),
        log,
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.lines().any(|l| l == "OK"),
        "mcp_drive.py {scenario} failed ({}):\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
        .lines()
        .filter_map(|l| l.strip_prefix("RESULT "))
        .map(|l| serde_json::from_str(l).expect("a RESULT line is JSON"))
        .collect()
}

/// `execctl --socket SOCKET mcp EXTRA...` as the SDK is told to start it.
fn server(d: &Daemon, extra: &[&str]) -> Vec<String> {
    let mut v = vec![
        CTL.to_string(),
        "--socket".into(),
        d.socket.display().to_string(),
        "mcp".into(),
    ];
    v.extend(extra.iter().map(|s| s.to_string()));
    v
}

fn strs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

#[test]
fn the_python_sdk_lists_tools_with_valid_schemas_and_runs_every_tool() {
    let Some(python) = sdk_python() else {
        return;
    };
    let d = daemon(false);
    let log = d.dir.path();
    let srv = server(&d, &[]);
    for scenario in ["tools", "basics", "long_and_input"] {
        drive(
            &python,
            scenario,
            &[],
            &strs(&srv),
            &log.join(format!("{scenario}.log")),
        );
    }
    let named = "mcp-test-named";
    let r = drive(
        &python,
        "shells",
        &["--named", named],
        &strs(&srv),
        &log.join("shells.log"),
    );
    // The client's own shell session went with it; the named one stays.
    let mut c = d.client();
    let listed = ok(&mut c, "shell/sessions", json!({}));
    let own = r[0]["own"].as_str().expect("own session");
    assert!(
        listed["sessions"].get(own).is_none(),
        "{own} left open: {listed}"
    );
    assert!(
        listed["sessions"].get(named).is_some(),
        "{named} closed: {listed}"
    );
    assert_no_panic(&d);
}

/// What an approver connection heard, and answers by the command line: `APPROVE_NOW`
/// at once, `REJECT_NOW` with feedback, `APPROVE_LATER` once the file `go` exists,
/// `HOLD` never.
struct Approver {
    resolved: Arc<Mutex<Vec<Value>>>,
    requests: Arc<Mutex<Vec<Value>>>,
    _thread: std::thread::JoinHandle<()>,
}

impl Approver {
    fn start(d: &Daemon) -> Approver {
        let mut a = d.client_in_other_process();
        ok(&mut a, "approvals/subscribe", json!({}));
        let go = d.dir.path().join("go");
        let resolved = Arc::new(Mutex::new(Vec::new()));
        let requests = Arc::new(Mutex::new(Vec::new()));
        let (res, reqs) = (resolved.clone(), requests.clone());
        let thread = std::thread::spawn(move || {
            let mut later: Vec<Value> = Vec::new();
            loop {
                if go.exists() {
                    for id in later.drain(..) {
                        answer(&mut a, &id, "approve", None);
                    }
                }
                let m = match a.read_message(Some(Duration::from_millis(50))) {
                    Ok(m) => m,
                    Err(e) if execd::client::is_timeout(&e) => continue,
                    Err(_) => return,
                };
                if m["method"] == "request" {
                    let id = m["id"].clone();
                    let line = m["params"]["payload"]["description"]
                        .as_str()
                        .unwrap_or("")
                        .to_string();
                    reqs.lock().unwrap().push(m.clone());
                    if line.contains("APPROVE_NOW") {
                        answer(&mut a, &id, "approve", None);
                    } else if line.contains("REJECT_NOW") {
                        answer(&mut a, &id, "reject", Some("not today"));
                    } else if line.contains("APPROVE_LATER") {
                        later.push(id);
                    }
                } else if m["params"]["type"] == "ApprovalRequestResolved" {
                    res.lock().unwrap().push(m["params"]["payload"].clone());
                }
            }
        });
        Approver {
            resolved,
            requests,
            _thread: thread,
        }
    }
}

fn answer(a: &mut Client, id: &Value, response: &str, feedback: Option<&str>) {
    let mut result = json!({"request_id": id, "response": response});
    if let Some(f) = feedback {
        result["feedback"] = json!(f);
    }
    let msg = json!({"jsonrpc": "2.0", "id": id, "result": result});
    a.send_line(msg.to_string().as_bytes()).expect("answer");
}

#[test]
fn the_python_sdk_meets_the_gate_deny_approve_reject_yield_and_cancel() {
    let Some(python) = sdk_python() else {
        return;
    };
    let d = daemon(true);
    let approver = Approver::start(&d);
    let dir = d.dir.path().display().to_string();
    drive(
        &python,
        "gate",
        &["--dir", &dir],
        &strs(&server(&d, &[])),
        &d.dir.path().join("gate.log"),
    );
    // The cancelled call's approval was withdrawn, and the approver was told so.
    let requests = approver.requests.lock().unwrap().clone();
    let held = requests
        .iter()
        .find(|r| r["params"]["payload"]["description"] == "echo HOLD")
        .expect("the HOLD line reached the approver");
    wait_until("the held approval is resolved as withdrawn", || {
        approver
            .resolved
            .lock()
            .unwrap()
            .iter()
            .any(|r| r["request_id"] == held["id"] && r["reason"] == "withdrawn")
    });
    assert_no_panic(&d);
}

#[test]
fn client_exit_kills_foreground_commands_spares_background_ones_and_closes_its_shell() {
    let Some(python) = sdk_python() else {
        return;
    };
    let d = daemon(false);
    let named = "kept-after-exit";
    let r = drive(
        &python,
        "lifetime",
        &["--named", named],
        &strs(&server(&d, &[])),
        &d.dir.path().join("lifetime.log"),
    );
    let (fg, bg) = (
        r[0]["fg"].as_str().expect("fg"),
        r[0]["bg"].as_str().expect("bg"),
    );
    let mut c = d.client();
    wait_until("the foreground command is killed", || {
        bash_command(&mut c, fg)["status"] == "killed"
    });
    let b = bash_command(&mut c, bg);
    assert_eq!(b["status"], "running", "{b}");
    let sessions = ok(&mut c, "shell/sessions", json!({}));
    let own = r[0]["own_shell"].as_str().expect("own");
    assert!(sessions["sessions"].get(own).is_none(), "{sessions}");
    assert!(sessions["sessions"].get(named).is_some(), "{sessions}");
    let session = b["session_id"].as_str().expect("session").to_string();
    ok(
        &mut c,
        "bash/kill",
        json!({"session_id": session, "command_id": bg, "signal": "SIGKILL"}),
    );
}

#[test]
fn the_cwd_ceiling_holds_against_the_model() {
    let Some(python) = sdk_python() else {
        return;
    };
    let d = daemon(false);
    let top = TempDir::new();
    std::fs::create_dir(top.path().join("sub")).expect("mkdir");
    let real = std::fs::canonicalize(top.path()).expect("canonical");
    let real = real.display().to_string();
    drive(
        &python,
        "ceiling",
        &["--dir", &real],
        &strs(&server(&d, &["--cwd", &real])),
        &d.dir.path().join("ceiling.log"),
    );
}

/// A runtime directory the test made for uid 65534 (nobody), removed on drop.
struct RuntimeDir(PathBuf);

impl Drop for RuntimeDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// MCP clients start servers without `XDG_RUNTIME_DIR`: `execctl mcp` still finds a
/// user's daemon listening in `/run/user/UID` (section 1). The user is nobody (65534),
/// with a runtime directory this test makes and removes; the SDK's client runs as root
/// and starts the server as nobody through `setpriv`.
#[test]
fn a_user_daemon_in_run_user_is_found_without_xdg_runtime_dir() {
    if !running_as_root() {
        skip("needs root, to make /run/user/65534 and run as nobody");
        return;
    }
    if !have(&["setpriv"]) {
        return;
    }
    let Some(python) = sdk_python() else {
        return;
    };
    let _turn = NOBODYS_PLACES.lock().unwrap_or_else(|e| e.into_inner());
    let run_user = PathBuf::from("/run/user/65534");
    if run_user.exists() || !Path::new("/run/user").is_dir() {
        skip("/run/user/65534 exists already (a real session's), or /run/user is missing");
        return;
    }
    std::fs::create_dir(&run_user).expect("mkdir /run/user/65534");
    let guard = RuntimeDir(run_user.clone());
    std::os::unix::fs::chown(&run_user, Some(65534), Some(65534)).expect("chown");
    std::fs::set_permissions(
        &run_user,
        std::os::unix::fs::PermissionsExt::from_mode(0o700),
    )
    .expect("chmod");
    let dir = TempDir::new();
    std::os::unix::fs::chown(dir.path(), Some(65534), Some(65534)).expect("chown");
    let socket = run_user.join("execd.sock");
    let mut cmd = Daemon::command(dir.path(), &socket, &["--workdir", "/tmp"]);
    as_nobody(&mut cmd);
    let child = cmd.spawn().expect("spawn execd as nobody");
    let d = Daemon::adopt(Some(child), socket, dir);
    let server = [
        "setpriv",
        "--reuid=65534",
        "--regid=65534",
        "--clear-groups",
        CTL,
        "mcp",
        "--cwd",
        "/tmp",
    ];
    let r = drive(
        &python,
        "plain_run",
        &[],
        &server,
        &std::env::temp_dir().join(format!("mcp-run-user-{}.log", std::process::id())),
    );
    assert_eq!(r[0]["output"], "through-the-sdk\n65534\n", "{r:?}");
    drop(d);
    drop(guard);
}

/// A socket served by another uid than execctl's own or root is refused, in one line,
/// before anything is sent; and a daemon that is not there is one line naming where it
/// was looked for. Both exit 1.
#[test]
fn a_foreign_uid_socket_and_a_missing_daemon_are_one_line_and_exit_1() {
    if !running_as_root() {
        skip("needs root, to start a daemon as another uid");
        return;
    }
    let dir = TempDir::new();
    std::os::unix::fs::chown(dir.path(), Some(65534), Some(65534)).expect("chown");
    let socket = dir.path().join("execd.sock");
    let mut cmd = Daemon::command(dir.path(), &socket, &["--workdir", "/tmp"]);
    as_nobody(&mut cmd);
    let child = cmd.spawn().expect("spawn execd as nobody");
    let d = Daemon::adopt(Some(child), socket.clone(), dir);
    let o = run_cmd(command(Some(&socket), &["mcp"]));
    assert_eq!(o.code, Some(1), "{o:?}");
    assert_eq!(o.stderr.lines().count(), 1, "{o:?}");
    assert!(
        o.stderr
            .contains(&format!("{} is served by uid 65534", socket.display())),
        "{o:?}"
    );
    assert_eq!(o.stdout, "", "nothing was served");
    // Every command refuses it the same way.
    let o = run_cmd(command(Some(&socket), &["ps"]));
    assert!(o.stderr.contains("is served by uid 65534"), "{o:?}");
    // The daemon never heard a request from it.
    assert!(!d.log().contains("bash/exec"), "{}", d.log());

    let o = run_cmd(command(Some(Path::new("/nonexistent/mcp.sock")), &["mcp"]));
    assert_eq!(o.code, Some(1), "{o:?}");
    assert_eq!(o.stderr.lines().count(), 1, "{o:?}");
    assert!(o.stderr.contains("/nonexistent/mcp.sock"), "{o:?}");
    // Found nowhere: every place tried is named.
    let _turn = NOBODYS_PLACES.lock().unwrap_or_else(|e| e.into_inner());
    let mut cmd = command(None, &["mcp"]);
    cmd.env_clear()
        .env("PATH", "/usr/bin:/bin")
        .env("HOME", "/nonexistent");
    as_nobody(&mut cmd);
    let o = run_cmd(cmd);
    assert_eq!(o.code, Some(1), "{o:?}");
    assert_eq!(o.stderr.lines().count(), 1, "{o:?}");
    assert!(o.stderr.contains("/tmp/execd-65534/execd.sock"), "{o:?}");
}

// ---- raw JSON-RPC ------------------------------------------------------------------------

/// `execctl mcp` with pipes: lines in, lines out.
struct Raw {
    ctl: Ctl,
    stdin: std::process::ChildStdin,
    lines: std::sync::mpsc::Receiver<String>,
}

impl Raw {
    fn start(d: &Daemon) -> Raw {
        let mut cmd = command(Some(&d.socket), &["mcp"]);
        cmd.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null());
        let mut child = cmd.spawn().expect("spawn execctl mcp");
        let stdin = child.stdin.take().expect("stdin");
        let lines = lines_of(child.stdout.take().expect("stdout"));
        Raw {
            ctl: Ctl { child },
            stdin,
            lines,
        }
    }

    fn send(&mut self, v: Value) {
        writeln!(self.stdin, "{v}").expect("write a line");
    }

    fn send_text(&mut self, text: &str) {
        writeln!(self.stdin, "{text}").expect("write a line");
    }

    #[track_caller]
    fn next(&self) -> Value {
        let line = next_line(&self.lines);
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("{line:?}: {e}"))
    }

    /// The answer to request `id` (a notification in between is skipped).
    #[track_caller]
    fn answer(&self, id: u64) -> Value {
        loop {
            let m = self.next();
            if m["id"] == id {
                return m;
            }
        }
    }
}

fn req(id: u64, method: &str, params: Value) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params})
}

#[test]
fn protocol_edges_by_raw_lines() {
    let d = daemon(false);
    let mut m = Raw::start(&d);
    // The SDKs' probe of the stateless revision, and any unknown method: -32601 at once.
    m.send(req(1, "server/discover", json!({})));
    assert_eq!(m.answer(1)["error"]["code"], -32601);
    // Before initialize: only ping.
    m.send(req(2, "tools/list", json!({})));
    assert_eq!(m.answer(2)["error"]["code"], -32600);
    m.send(req(3, "ping", json!({})));
    assert_eq!(m.answer(3)["result"], json!({}));
    // A version it does not speak: answered with the newest, never an error.
    m.send(req(
        4,
        "initialize",
        json!({"protocolVersion": "2023-01-01", "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}}),
    ));
    let init = m.answer(4);
    assert_eq!(init["result"]["protocolVersion"], "2025-11-25", "{init}");
    assert_eq!(
        init["result"]["capabilities"],
        json!({"tools": {"listChanged": false}, "logging": {}})
    );
    m.send(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
    m.send(req(5, "resources/list", json!({})));
    assert_eq!(m.answer(5)["error"]["code"], -32601);
    m.send(req(51, "logging/setLevel", json!({"level": "debug"})));
    assert_eq!(m.answer(51)["result"], json!({}));
    m.send(req(52, "logging/setLevel", json!({"level": "loud"})));
    assert_eq!(m.answer(52)["error"]["code"], -32602);
    // An unknown tool is a protocol error; bad arguments are a tool error the model reads.
    m.send(req(
        6,
        "tools/call",
        json!({"name": "format_disk", "arguments": {}}),
    ));
    let e = m.answer(6);
    assert_eq!(e["error"]["code"], -32602, "{e}");
    assert!(e["error"]["message"]
        .as_str()
        .unwrap()
        .contains("format_disk"));
    for (id, args) in [
        (7, json!({})),
        (8, json!({"command": 5})),
        (9, json!({"command": "ls", "yield_ms": "soon"})),
        (10, json!({"command": "ls", "timeout": 5})),
    ] {
        m.send(req(
            id,
            "tools/call",
            json!({"name": "run", "arguments": args}),
        ));
        let r = m.answer(id);
        assert_eq!(r["result"]["isError"], true, "{args}: {r}");
        let text = r["result"]["content"][0]["text"].as_str().unwrap();
        assert!(text.starts_with("run: "), "{text}");
    }
    // Not JSON, not an object, a batch.
    m.send_text("{not json");
    assert_eq!(m.next()["error"]["code"], -32700);
    m.send_text("[]");
    assert_eq!(m.next()["error"]["code"], -32600);
    m.send_text("42");
    assert_eq!(m.next()["error"]["code"], -32600);
    // Still serving.
    m.send(req(
        11,
        "tools/call",
        json!({"name": "run", "arguments": {"command": "echo still"}}),
    ));
    let r = m.answer(11);
    assert_eq!(r["result"]["structuredContent"]["output"], "still\n", "{r}");
    // An old revision: no output schemas, no structuredContent.
    drop(m.stdin);
    assert_eq!(m.ctl.wait().code(), Some(0));
    let mut m = Raw::start(&d);
    m.send(req(
        1,
        "initialize",
        json!({"protocolVersion": "2025-03-26"}),
    ));
    assert_eq!(m.answer(1)["result"]["protocolVersion"], "2025-03-26");
    m.send(req(2, "tools/list", json!({})));
    let tools = m.answer(2);
    assert!(
        tools["result"]["tools"][0].get("outputSchema").is_none(),
        "{tools}"
    );
    m.send(req(
        3,
        "tools/call",
        json!({"name": "run", "arguments": {"command": "echo old"}}),
    ));
    let r = m.answer(3);
    assert!(r["result"].get("structuredContent").is_none(), "{r}");
    let text: Value = serde_json::from_str(r["result"]["content"][0]["text"].as_str().unwrap())
        .expect("the text block is JSON");
    assert_eq!(text["output"], "old\n");
}

// ---- the TypeScript SDK ------------------------------------------------------------------

/// The TypeScript SDK's pinned version.
const TS_SDK: &str = "1.32.2";

/// A directory holding `@modelcontextprotocol/sdk` at `TS_SDK`, installed once with npm
/// under cargo's scratch directory; `None` after `skip`ping where Node or npm is missing.
fn ts_sdk() -> Option<PathBuf> {
    static DIR: std::sync::OnceLock<Result<PathBuf, String>> = std::sync::OnceLock::new();
    if !have(&["node", "npm"]) {
        return None;
    }
    let made = DIR.get_or_init(|| {
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("ts-sdk-{TS_SDK}"));
        let marker = dir.join("installed");
        if marker.exists() {
            return Ok(dir);
        }
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
        std::fs::write(
            dir.join("package.json"),
            r#"{"name": "execd-mcp-test", "private": true, "type": "module"}"#,
        )
        .map_err(|e| e.to_string())?;
        let out = run_bounded(
            Command::new("npm")
                .args(["install", "--no-audit", "--no-fund", "--loglevel=error"])
                .arg(format!("@modelcontextprotocol/sdk@{TS_SDK}"))
                .current_dir(&dir),
            Duration::from_secs(300),
            &dir.join("npm.log"),
        );
        if !out.status.success() {
            return Err(format!(
                "npm install failed: {}",
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        std::fs::write(&marker, TS_SDK).map_err(|e| e.to_string())?;
        Ok(dir)
    });
    match made {
        Ok(d) => Some(d.clone()),
        Err(e) => panic!("{e}"),
    }
}

#[test]
fn the_typescript_sdk_initializes_lists_and_runs() {
    let Some(dir) = ts_sdk() else {
        return;
    };
    let d = daemon(false);
    let script = dir.join("drive.mjs");
    std::fs::write(&script, TS_DRIVE).expect("write drive.mjs");
    let out = run_bounded(
        Command::new("node")
            .arg(&script)
            .arg(CTL)
            .arg(&d.socket)
            .current_dir(&dir),
        Duration::from_secs(60),
        &d.dir.path().join("ts.log"),
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "drive.mjs failed: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_str(stdout.lines().last().unwrap_or("")).expect("JSON");
    assert_eq!(v["server"]["name"], "execd", "{v}");
    assert_eq!(
        v["capabilities"]["tools"],
        json!({"listChanged": false}),
        "{v}"
    );
    assert_eq!(
        v["tools"],
        json!([
            "run",
            "read",
            "write",
            "kill",
            "list",
            "shell",
            "shell_view"
        ])
    );
    assert_eq!(
        v["run"]["structuredContent"]["output"], "from node\n",
        "{v}"
    );
    assert_eq!(v["run"]["isError"], false, "{v}");
}

/// The TypeScript client: connect (initialize), list the tools, one run.
const TS_DRIVE: &str = r#"
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
const [ctl, socket] = process.argv.slice(2);
const transport = new StdioClientTransport({ command: ctl, args: ["--socket", socket, "mcp"] });
const client = new Client({ name: "execd-test", version: "1.0.0" });
await client.connect(transport);
const tools = (await client.listTools()).tools.map((t) => t.name);
const run = await client.callTool({ name: "run", arguments: { command: "echo from node" } });
console.log(JSON.stringify({ server: client.getServerVersion(), capabilities: client.getServerCapabilities(), tools, run }));
await client.close();
"#;

/// Tests that use uid 65534's own socket places (`/run/user/65534`, `/tmp/execd-65534`)
/// take turns: a daemon one starts there would answer another's "nothing there".
static NOBODYS_PLACES: Mutex<()> = Mutex::new(());

/// The last of section 1's places, `/tmp/execd-UID/execd.sock`: execd makes the
/// directory mode 0700 and uses it; one made by someone else first (another owner, or
/// writable by others) is refused, never used.
#[test]
fn the_tmp_socket_lives_in_a_directory_of_its_own() {
    if !running_as_root() {
        skip("needs root, to start execd as nobody");
        return;
    }
    let _turn = NOBODYS_PLACES.lock().unwrap_or_else(|e| e.into_inner());
    let dir = PathBuf::from("/tmp/execd-65534");
    if Path::new("/run/user/65534").exists() {
        skip("/run/user/65534 exists: nobody's socket would be there, not in /tmp");
        return;
    }
    if std::os::unix::net::UnixStream::connect(dir.join("execd.sock")).is_ok() {
        skip("an execd of uid 65534 is running here already");
        return;
    }
    let _ = std::fs::remove_dir_all(&dir);
    let _gone = RuntimeDir(dir.clone());
    let log = TempDir::new();
    let start = || {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_execd"));
        cmd.env_clear()
            .env("PATH", "/usr/bin:/bin")
            .args(["--workdir", "/tmp"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(
                std::fs::File::create(log.path().join("execd.log")).expect("log"),
            ));
        as_nobody(&mut cmd);
        cmd.spawn().expect("spawn execd as nobody")
    };
    let d = Daemon::adopt(Some(start()), dir.join("execd.sock"), TempDir::new());
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::symlink_metadata(&dir).expect("the directory");
    assert!(meta.is_dir());
    assert_eq!((meta.uid(), meta.mode() & 0o777), (65534, 0o700));
    // execctl looks there too, with nothing set.
    let mut cmd = command(None, &["status", "--path"]);
    cmd.env_clear().env("PATH", "/usr/bin:/bin");
    as_nobody(&mut cmd);
    let o = run_cmd(cmd);
    assert_eq!(
        (o.code, o.stdout.trim()),
        (Some(0), "/tmp/execd-65534/execd.sock"),
        "{o:?}"
    );
    drop(d);
    let _ = std::fs::remove_dir_all(&dir);

    // Someone else's directory, or one others may write: refused, exit 1.
    for (owner, mode, said) in [
        (0, 0o755, "is owned by uid 0"),
        (65534, 0o777, "may be written by others"),
    ] {
        std::fs::create_dir(&dir).expect("mkdir");
        std::os::unix::fs::chown(&dir, Some(owner), Some(owner)).expect("chown");
        std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(mode))
            .expect("chmod");
        let out = Reap(start()).finish(WAIT);
        let err = std::fs::read_to_string(log.path().join("execd.log")).unwrap_or_default();
        assert_eq!(out.status.code(), Some(1), "{err}");
        assert!(err.contains(&format!("/tmp/execd-65534 {said}")), "{err}");
        assert!(!dir.join("execd.sock").exists(), "{err}");
        std::fs::remove_dir_all(&dir).expect("rmdir");
    }
}
