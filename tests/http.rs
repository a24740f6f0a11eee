//! The HTTP front end (PROTOCOL.md section 11) end to end, against the real daemon, with
//! the bash pipe API's own clients: `curl` running the seed document's examples
//! (`shared/seeds/bash-pipe-api.zh.md`) changed only in their address, raw sockets for
//! what curl will not send, and the API's Python SDK (`agent-sandbox` from PyPI, driven by
//! `tests/sdk/drive.py` in a virtualenv made for the run).
//!
//! Every daemon here listens on its temp socket and, where TCP matters, on a free loopback
//! port with a bearer token; the tests run as root, so TCP requests run as `nobody`
//! (`--http-run-as`). Each wait is bounded: curl by `--max-time`, sockets by a read timeout,
//! children by a deadline, and every daemon and child is ended on drop.

use crate::util::venv::{run_bounded, sdk_python};
use crate::util::*;

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The bearer token of the TCP listeners: long, and unlike anything a log would print.
pub(crate) const TOKEN: &str = "tok-5d1c7e0b9a4f-http-tests-3e8a";

/// uid and gid of `nobody`, whom TCP requests run as and who plays the foreign peer.
const NOBODY: u32 = 65534;

/// Bound on one curl call (`--max-time`, seconds): longer than any wait a test asks of the
/// daemon, so only a hang reaches it.
const CURL_MAX_TIME: &str = "30";

/// The placeholder `matches` accepts for any non-empty string (generated ids).
const ANY_ID: &str = "<any id>";
/// The placeholder `matches` accepts for an RFC 3339 UTC timestamp.
const ANY_TIME: &str = "<any RFC 3339 UTC time>";
const EXEC_SCHEMA: &str = "Response_BashExecResult_";
const OUTPUT_SCHEMA: &str = "Response_BashOutputResult_";
const SESSION_SCHEMA: &str = "Response_BashSessionInfo_";
const SESSIONS_SCHEMA: &str = "Response_list_BashSessionInfo__";

// ---- starting daemons ------------------------------------------------------------------

/// A loopback port nobody listens on (free when asked; `start_front` retries if another
/// process takes it before execd binds it).
fn free_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind an ephemeral port");
    l.local_addr().expect("local addr").port()
}

/// Starts execd on `dir/execd.sock` with `args` (stderr to `dir/execd.log`) and waits,
/// bounded, until it accepts on the socket: `Ok` then, or `Err((exit code, log))` if it
/// exited first.
fn launch(dir: TempDir, args: &[String]) -> Result<Daemon, (Option<i32>, String)> {
    launch_on(dir, "execd.sock", args)
}

/// `launch` with the socket at `dir/name`.
fn launch_on(dir: TempDir, name: &str, args: &[String]) -> Result<Daemon, (Option<i32>, String)> {
    let socket = dir.path().join(name);
    let log = std::fs::File::create(dir.path().join("execd.log")).expect("log file");
    let child = Command::new(env!("CARGO_BIN_EXE_execd"))
        .arg("--socket")
        .arg(&socket)
        .args(["--kill-grace", "1s"])
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::from(log))
        .spawn()
        .expect("spawn execd");
    let mut d = Daemon {
        child: Some(child),
        socket,
        dir,
    };
    let deadline = Instant::now() + WAIT;
    loop {
        if UnixStream::connect(&d.socket).is_ok() {
            return Ok(d);
        }
        let exited = d.child.as_mut().and_then(|c| c.try_wait().ok().flatten());
        if let Some(status) = exited {
            d.child = None;
            return Err((status.code(), d.log()));
        }
        assert!(
            Instant::now() < deadline,
            "execd neither listened nor exited within {WAIT:?}; log:\n{}",
            d.log()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Starts execd with the flags `make(dir, port)` returns for a free loopback port, trying
/// another port if that one was taken in between.
#[track_caller]
fn start_on_free_port(make: impl Fn(&Path, u16) -> Vec<String>) -> (Daemon, u16) {
    let mut last = String::new();
    for _ in 0..5 {
        let dir = TempDir::new();
        let port = free_port();
        let args = make(dir.path(), port);
        match launch(dir, &args) {
            Ok(d) => {
                wait_until("the HTTP listener accepts", || {
                    TcpStream::connect(("127.0.0.1", port)).is_ok()
                });
                return (d, port);
            }
            Err((_, log)) if log.contains("Address already in use") => last = log,
            Err((code, log)) => panic!("execd {args:?} exited with {code:?}:\n{log}"),
        }
    }
    panic!("no free port in 5 tries; last log:\n{last}");
}

/// Writes the token file, mode 0600 as section 11 asks.
fn token_file(dir: &Path) -> PathBuf {
    let path = dir.join("token");
    std::fs::write(&path, format!("{TOKEN}\n")).expect("write token");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    path
}

/// A daemon serving HTTP on its socket and on a loopback port with `TOKEN`.
pub(crate) struct Front {
    pub(crate) daemon: Daemon,
    pub(crate) port: u16,
}

impl Front {
    fn unix(&self) -> Via {
        Via::Unix(self.daemon.socket.clone())
    }

    fn tcp(&self) -> Via {
        Via::Tcp(self.port)
    }

    fn both(&self) -> [Via; 2] {
        [self.unix(), self.tcp()]
    }

    fn dir(&self) -> &Path {
        self.daemon.dir.path()
    }
}

/// execd with `--http-listen 127.0.0.1:PORT`, the token, TCP requests run as `nobody`, a
/// default directory `nobody` may enter (the temp dir), and `extra`.
#[track_caller]
pub(crate) fn start_front(extra: &[&str]) -> Front {
    let (daemon, port) = start_on_free_port(|dir, port| {
        let token = token_file(dir);
        let mut args: Vec<String> = vec![
            "--http-listen".into(),
            format!("127.0.0.1:{port}"),
            "--http-token-file".into(),
            token.display().to_string(),
            "--http-run-as".into(),
            "nobody".into(),
            "--workdir".into(),
            dir.display().to_string(),
        ];
        args.extend(extra.iter().map(|s| s.to_string()));
        args
    });
    Front { daemon, port }
}

/// execd with `--http-listen 127.0.0.1:PORT --http-no-auth` (no token), TCP requests run as
/// `nobody` in the temp dir.
#[track_caller]
pub(crate) fn start_open_front() -> Front {
    let (daemon, port) = start_on_free_port(|dir, port| {
        vec![
            "--http-listen".into(),
            format!("127.0.0.1:{port}"),
            "--http-no-auth".into(),
            "--http-run-as".into(),
            "nobody".into(),
            "--workdir".into(),
            dir.display().to_string(),
        ]
    });
    Front { daemon, port }
}

/// Runs execd with `args` expecting it to refuse to start: its exit code and log.
#[track_caller]
fn refused(args: &[String]) -> (Option<i32>, String) {
    match launch(TempDir::new(), args) {
        Ok(d) => panic!("execd {args:?} started; log:\n{}", d.log()),
        Err(refusal) => refusal,
    }
}

// ---- transports and replies ------------------------------------------------------------

/// How a request reaches the daemon.
#[derive(Clone, Debug)]
enum Via {
    /// The JSON-RPC socket, as `curl --unix-socket SOCK http://execd/...`.
    Unix(PathBuf),
    /// The TCP listener on this loopback port, with `Authorization: Bearer TOKEN`.
    Tcp(u16),
}

impl Via {
    fn url(&self, path: &str) -> String {
        match self {
            Via::Unix(_) => format!("http://execd{path}"),
            Via::Tcp(port) => format!("http://127.0.0.1:{port}{path}"),
        }
    }

    /// What curl needs besides the URL: the socket, or the token.
    fn curl_args(&self) -> Vec<String> {
        match self {
            Via::Unix(sock) => vec!["--unix-socket".into(), sock.display().to_string()],
            Via::Tcp(_) => vec!["-H".into(), format!("Authorization: Bearer {TOKEN}")],
        }
    }

    /// The header lines a raw request carries on this transport.
    fn auth_header(&self) -> String {
        match self {
            Via::Unix(_) => String::new(),
            Via::Tcp(_) => format!("Authorization: Bearer {TOKEN}\r\n"),
        }
    }

    fn name(&self) -> &'static str {
        match self {
            Via::Unix(_) => "unix",
            Via::Tcp(_) => "tcp",
        }
    }
}

/// One HTTP response: status, header fields (names lower-cased) and body.
struct Reply {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl std::fmt::Debug for Reply {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} {:?} {}",
            self.status,
            self.headers,
            String::from_utf8_lossy(&self.body)
        )
    }
}

impl Reply {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    #[track_caller]
    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {self:?}"))
    }
}

/// Parses one response head (`HTTP/1.1 200 OK\r\n...\r\n\r\n`): status and fields.
#[track_caller]
fn parse_head(head: &str) -> (u16, Vec<(String, String)>) {
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    let mut parts = status_line.splitn(3, ' ');
    assert_eq!(
        parts.next(),
        Some("HTTP/1.1"),
        "status line {status_line:?}"
    );
    let status = parts
        .next()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("status line {status_line:?}"));
    let headers = lines
        .filter(|l| !l.is_empty())
        .map(|l| {
            let (n, v) = l.split_once(':').unwrap_or_else(|| panic!("header {l:?}"));
            (n.trim().to_ascii_lowercase(), v.trim().to_string())
        })
        .collect();
    (status, headers)
}

/// Runs curl (no config file, silent but showing errors, bounded) and returns its output;
/// panics if curl itself failed.
#[track_caller]
fn curl_raw(args: &[String]) -> Output {
    let out = Command::new("curl")
        .args(["-q", "-sS", "--max-time", CURL_MAX_TIME])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run curl (is it installed?)");
    assert!(
        out.status.success(),
        "curl {args:?} failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Parses what `curl -i` printed: interim `1xx` responses are skipped; the final response
/// must be whole (`Content-Length` matches the body).
#[track_caller]
fn parse_curl_i(stdout: &[u8]) -> Reply {
    let mut rest = stdout;
    loop {
        let end = rest
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .unwrap_or_else(|| panic!("no head in {:?}", String::from_utf8_lossy(stdout)));
        let head = String::from_utf8_lossy(&rest[..end]).into_owned();
        let (status, headers) = parse_head(&head);
        rest = &rest[end + 4..];
        if (100..200).contains(&status) {
            continue;
        }
        let reply = Reply {
            status,
            headers,
            body: rest.to_vec(),
        };
        let length = reply.header("content-length").map(str::to_string);
        assert_eq!(
            length,
            Some(reply.body.len().to_string()),
            "Content-Length against the body: {reply:?}"
        );
        return reply;
    }
}

/// `curl -i` through `via` with `args` (URL included): the final response.
#[track_caller]
fn curl(via: &Via, args: &[&str]) -> Reply {
    let mut all = vec!["-i".to_string()];
    all.extend(via.curl_args());
    all.extend(args.iter().map(|s| s.to_string()));
    parse_curl_i(&curl_raw(&all).stdout)
}

/// One of the seed's examples, changed only in its address:
/// `curl -X POST "URL" -H "Content-Type: application/json" -d 'BODY'`.
#[track_caller]
fn seed_post(via: &Via, path: &str, body: &str) -> Reply {
    let url = via.url(path);
    curl(
        via,
        &[
            "-X",
            "POST",
            &url,
            "-H",
            "Content-Type: application/json",
            "-d",
            body,
        ],
    )
}

/// `GET path`.
#[track_caller]
fn get(via: &Via, path: &str) -> Reply {
    curl(via, &[&via.url(path)])
}

/// `POST path` with a JSON body (not one of the seed's examples).
#[track_caller]
fn post(via: &Via, path: &str, body: &Value) -> Reply {
    seed_post(via, path, &body.to_string())
}

// ---- checking responses ----------------------------------------------------------------

/// The published OpenAPI components of the bash pipe API (a copy shared with bash.rs).
const COMPONENTS: &str = include_str!("data/bash-openapi-components.json");

/// Validators of the response envelopes, by schema name.
fn validators() -> &'static HashMap<&'static str, jsonschema::Validator> {
    static V: OnceLock<HashMap<&'static str, jsonschema::Validator>> = OnceLock::new();
    V.get_or_init(|| {
        let doc: Value = serde_json::from_str(COMPONENTS).expect("components JSON parses");
        [EXEC_SCHEMA, OUTPUT_SCHEMA, SESSION_SCHEMA, SESSIONS_SCHEMA]
            .into_iter()
            .map(|name| {
                let root = json!({
                    "$ref": format!("#/components/schemas/{name}"),
                    "components": doc["components"],
                });
                let v = jsonschema::options()
                    .build(&root)
                    .unwrap_or_else(|e| panic!("schema {name} compiles: {e}"));
                (name, v)
            })
            .collect()
    })
}

#[track_caller]
fn json_content_type(r: &Reply) {
    assert_eq!(
        r.header("content-type"),
        Some("application/json; charset=utf-8"),
        "{r:?}"
    );
}

#[track_caller]
fn keys(v: &Value) -> Vec<&str> {
    let mut k: Vec<&str> = v
        .as_object()
        .unwrap_or_else(|| panic!("not an object: {v}"))
        .keys()
        .map(String::as_str)
        .collect();
    k.sort_unstable();
    k
}

/// A success: 200, JSON, the envelope `{success: true, message, data, hint: null}` and
/// nothing else, valid against `schema` when given. Returns `data`.
#[track_caller]
fn ok_data(r: &Reply, schema: Option<&str>) -> Value {
    assert_eq!(r.status, 200, "{r:?}");
    json_content_type(r);
    let v = r.json();
    assert_eq!(keys(&v), ["data", "hint", "message", "success"], "{v}");
    assert_eq!(v["success"], true, "{v}");
    assert!(v["message"].is_string(), "{v}");
    assert_eq!(v["hint"], Value::Null, "{v}");
    if let Some(name) = schema {
        let errors: Vec<String> = validators()[name]
            .iter_errors(&v)
            .map(|e| e.to_string())
            .collect();
        assert!(errors.is_empty(), "{name}: {errors:?}\n{v}");
    }
    v["data"].clone()
}

/// A failure with the envelope `{success: false, message, data, hint: null}` and `status`.
/// Returns `(message, data)`.
#[track_caller]
fn failure(r: &Reply, status: u16) -> (String, Value) {
    assert_eq!(r.status, status, "{r:?}");
    json_content_type(r);
    let v = r.json();
    assert_eq!(keys(&v), ["data", "hint", "message", "success"], "{v}");
    assert_eq!(v["success"], false, "{v}");
    assert_eq!(v["hint"], Value::Null, "{v}");
    let message = v["message"]
        .as_str()
        .unwrap_or_else(|| panic!("message: {v}"))
        .to_string();
    assert!(!message.is_empty(), "{v}");
    (message, v["data"].clone())
}

/// A 422 in FastAPI's shape, one error at `loc`.
#[track_caller]
fn unprocessable(r: &Reply, loc: Value) {
    assert_eq!(r.status, 422, "{r:?}");
    json_content_type(r);
    let v = r.json();
    assert_eq!(keys(&v), ["detail"], "{v}");
    let detail = v["detail"].as_array().expect("detail is an array");
    assert_eq!(detail.len(), 1, "{v}");
    assert_eq!(keys(&detail[0]), ["loc", "msg", "type"], "{v}");
    assert_eq!(detail[0]["loc"], loc, "{v}");
    assert!(
        detail[0]["msg"].as_str().is_some_and(|m| !m.is_empty()),
        "{v}"
    );
    assert_eq!(detail[0]["type"], "value_error", "{v}");
}

/// `YYYY-MM-DDTHH:MM:SS[.fraction]Z`.
fn is_rfc3339_utc(s: &str) -> bool {
    let b = s.as_bytes();
    let digits =
        |r: std::ops::Range<usize>| b.get(r).is_some_and(|d| d.iter().all(u8::is_ascii_digit));
    let at = |i: usize, c: u8| b.get(i) == Some(&c);
    let fixed = digits(0..4)
        && at(4, b'-')
        && digits(5..7)
        && at(7, b'-')
        && digits(8..10)
        && at(10, b'T')
        && digits(11..13)
        && at(13, b':')
        && digits(14..16)
        && at(16, b':')
        && digits(17..19);
    let tail = &s[19.min(s.len())..];
    let fraction_ok = match tail.strip_suffix('Z') {
        Some("") => true,
        Some(f) => f.len() > 1 && f.starts_with('.') && f[1..].bytes().all(|d| d.is_ascii_digit()),
        None => false,
    };
    fixed && fraction_ok
}

/// Compares `actual` with `expected` field by field, every key on both sides, where the
/// placeholders `ANY_ID` and `ANY_TIME` stand for what they name. `waiting_for_input:
/// false`, which section 12.3 adds to the seed's objects, matches its absence. An empty stream is
/// `""`: the seed's first example shows `"stderr": null`, and execd answers `""`, which its OpenAPI schema
/// allows too (an output result's streams are strings, so one form serves both).
#[track_caller]
fn matches(actual: &Value, expected: &Value) {
    fn walk(a: &Value, e: &Value, path: &str) -> Result<(), String> {
        match (a, e) {
            (_, Value::String(p)) if p == ANY_ID => match a.as_str() {
                Some(s) if !s.is_empty() => Ok(()),
                _ => Err(format!("{path}: {a} is not a non-empty string")),
            },
            (_, Value::String(p)) if p == ANY_TIME => match a.as_str() {
                Some(s) if is_rfc3339_utc(s) => Ok(()),
                _ => Err(format!("{path}: {a} is not an RFC 3339 UTC time")),
            },
            (Value::Object(am), Value::Object(em)) => {
                // execd's own addition; whether a command waits for input yet (past the
                // 250 ms it takes to tell) depends on how loaded the machine is.
                let added = |k: &String| {
                    k == "waiting_for_input" && !em.contains_key(k) && am[k].is_boolean()
                };
                let mut ak: Vec<&String> = am.keys().filter(|k| !added(k)).collect();
                let mut ek: Vec<&String> = em.keys().collect();
                ak.sort_unstable();
                ek.sort_unstable();
                if ak != ek {
                    return Err(format!("{path}: keys {ak:?}, expected {ek:?}"));
                }
                for (k, ev) in em {
                    walk(&am[k], ev, &format!("{path}.{k}"))?;
                }
                Ok(())
            }
            (Value::Array(av), Value::Array(ev)) => {
                if av.len() != ev.len() {
                    return Err(format!("{path}: {} items, expected {}", av.len(), ev.len()));
                }
                for (i, (x, y)) in av.iter().zip(ev).enumerate() {
                    walk(x, y, &format!("{path}[{i}]"))?;
                }
                Ok(())
            }
            _ if a == e => Ok(()),
            _ => Err(format!("{path}: {a}, expected {e}")),
        }
    }
    if let Err(e) = walk(actual, expected, "data") {
        panic!("{e}\n  actual:   {actual}\n  expected: {expected}");
    }
}

#[track_caller]
fn string(v: &Value, field: &str) -> String {
    v[field]
        .as_str()
        .unwrap_or_else(|| panic!("{field} is not a string in {v}"))
        .to_string()
}

/// Long-polls a command's output from `offsets` until it has ended, checking every answer
/// field by field; returns what it printed on each stream and the final `command` object.
#[track_caller]
fn output_until_ended(
    via: &Via,
    session: &str,
    command_id: &str,
    command: &str,
    mut offsets: [u64; 2],
) -> (String, String, Value) {
    let mut printed = [String::new(), String::new()];
    let deadline = Instant::now() + WAIT;
    loop {
        assert!(Instant::now() < deadline, "{command} still running");
        let r = post(
            via,
            "/v1/bash/output",
            &json!({"session_id": session, "command_id": command_id, "offset": offsets[0],
                    "stderr_offset": offsets[1], "wait": true, "wait_timeout": 10}),
        );
        let d = ok_data(&r, Some(OUTPUT_SCHEMA));
        let out = string(&d, "stdout");
        let err = string(&d, "stderr");
        offsets[0] += out.len() as u64;
        offsets[1] += err.len() as u64;
        printed[0].push_str(&out);
        printed[1].push_str(&err);
        let cmd = d["command"].clone();
        let status = cmd["status"].as_str().unwrap_or_default().to_string();
        let mut command_obj = json!({"command_id": command_id, "command": command,
                                     "status": status, "exit_code": cmd["exit_code"]});
        if cmd.get("signal").is_some() {
            command_obj["signal"] = cmd["signal"].clone();
        }
        matches(
            &d,
            &json!({"session_id": session, "stdout": out, "stderr": err,
                    "offset": offsets[0], "stderr_offset": offsets[1], "command": command_obj}),
        );
        if status != "running" {
            let [o, e] = printed;
            return (o, e, cmd);
        }
        assert_eq!(cmd["exit_code"], Value::Null, "{d}");
    }
}

/// `initialize` over the JSON-RPC connection `c`: how many other clients the daemon has.
#[track_caller]
fn clients(c: &mut Client) -> u64 {
    let r = ok(c, "initialize", json!({"protocolVersion": 1}));
    // `c` counts itself.
    r["_meta"]["execd"]["clients"]
        .as_u64()
        .unwrap_or_else(|| panic!("clients in {r}"))
        - 1
}

/// File descriptors the daemon holds.
fn fd_count(pid: i32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count())
}

// ---- 1. the seed's curl examples -------------------------------------------------------

/// `exec_dir` of the seed's first example: the sandbox user's home. Made here if missing
/// (the tests run as root), so the example's body runs unchanged.
fn seed_home() {
    std::fs::create_dir_all("/home/gem").expect("create /home/gem");
}

/// Every curl example of the seed, in its order, through `via`; SESSION_ID is the id the
/// example before returned. `workdir` is the daemon's default directory.
fn seed_examples(via: &Via, workdir: &Path) {
    seed_home();

    // 执行短命令.
    let body = r#"{
"command": "pwd && ls -la",
"exec_dir": "/home/gem",
"timeout": 30,
"hard_timeout": 120
}"#;
    let d = ok_data(&seed_post(via, "/v1/bash/exec", body), Some(EXEC_SCHEMA));
    let stdout = string(&d, "stdout");
    assert!(stdout.starts_with("/home/gem\ntotal "), "{d}");
    assert!(stdout.contains(" .\n") && stdout.contains(" ..\n"), "{d}");
    matches(
        &d,
        &json!({"session_id": ANY_ID, "command_id": ANY_ID, "command": "pwd && ls -la",
                "status": "completed", "stdout": stdout, "stderr": "", "exit_code": 0,
                "offset": stdout.len(), "stderr_offset": 0}),
    );
    let first_session = string(&d, "session_id");

    // The SDK example's command, over curl: both streams apart.
    let body = r#"{"command": "printf \"out\\n\" && printf \"err\\n\" >&2", "timeout": 30, "hard_timeout": 120}"#;
    let d = ok_data(&seed_post(via, "/v1/bash/exec", body), Some(EXEC_SCHEMA));
    matches(
        &d,
        &json!({"session_id": ANY_ID, "command_id": ANY_ID,
                "command": "printf \"out\\n\" && printf \"err\\n\" >&2", "status": "completed",
                "stdout": "out\n", "stderr": "err\n", "exit_code": 0, "offset": 4,
                "stderr_offset": 4}),
    );
    assert_ne!(
        d["session_id"],
        first_session.as_str(),
        "a new session each time"
    );

    // 长命令与增量输出: running after the soft timeout, then the rest by long poll.
    let body = r#"{
"command": "sleep 3; echo done",
"timeout": 1,
"hard_timeout": 30
}"#;
    let d = ok_data(&seed_post(via, "/v1/bash/exec", body), Some(EXEC_SCHEMA));
    matches(
        &d,
        &json!({"session_id": ANY_ID, "command_id": ANY_ID, "command": "sleep 3; echo done",
                "status": "running", "stdout": "", "stderr": "",
                "exit_code": null, "offset": 0, "stderr_offset": 0}),
    );
    let (sid, cid) = (string(&d, "session_id"), string(&d, "command_id"));
    let body = r#"{
"session_id": "SESSION_ID",
"offset": 0,
"stderr_offset": 0,
"wait": true,
"wait_timeout": 10
}"#
    .replace("SESSION_ID", &sid);
    let d = ok_data(
        &seed_post(via, "/v1/bash/output", &body),
        Some(OUTPUT_SCHEMA),
    );
    // "done\n" and the exit come together: the answer may see the command running still.
    let ended = d["command"]["status"] == "completed";
    matches(
        &d,
        &json!({"session_id": sid, "stdout": "done\n", "stderr": "", "offset": 5,
                "stderr_offset": 0, "command": {"command_id": cid, "command": "sleep 3; echo done",
                "status": if ended { "completed" } else { "running" },
                "exit_code": if ended { json!(0) } else { Value::Null }}}),
    );
    let (rest, err, cmd) = output_until_ended(via, &sid, &cid, "sleep 3; echo done", [5, 0]);
    assert_eq!((rest.as_str(), err.as_str()), ("", ""));
    matches(
        &cmd,
        &json!({"command_id": cid, "command": "sleep 3; echo done", "status": "completed",
                "exit_code": 0}),
    );

    // 长驻进程: a server started async, its log read, then killed. The port is a free one
    // (the seed's 3000 may be taken); the server gets one request so that it logs a line.
    let port = free_port();
    let command = format!("python3 -m http.server {port} --directory /tmp");
    let body = format!(
        r#"{{
"command": "{command}",
"async_mode": true,
"hard_timeout": 3600
}}"#
    );
    let d = ok_data(&seed_post(via, "/v1/bash/exec", &body), Some(EXEC_SCHEMA));
    matches(
        &d,
        &json!({"session_id": ANY_ID, "command_id": ANY_ID, "command": command,
                "status": "running", "stdout": "", "stderr": "",
                "exit_code": null, "offset": 0, "stderr_offset": 0}),
    );
    let (sid, cid) = (string(&d, "session_id"), string(&d, "command_id"));
    wait_until("the http.server listens", || {
        TcpStream::connect(("127.0.0.1", port)).is_ok()
    });
    let page = curl_raw(&[
        "-o".into(),
        "/dev/null".into(),
        "-w".into(),
        "%{http_code}".into(),
        format!("http://127.0.0.1:{port}/"),
    ]);
    assert_eq!(String::from_utf8_lossy(&page.stdout), "200");
    let body = r#"{
"session_id": "SESSION_ID",
"offset": 0,
"stderr_offset": 0,
"wait": true,
"wait_timeout": 5
}"#
    .replace("SESSION_ID", &sid);
    let d = ok_data(
        &seed_post(via, "/v1/bash/output", &body),
        Some(OUTPUT_SCHEMA),
    );
    // Its request log goes to stderr; its banner to stdout, which Python holds in its
    // buffer unless PYTHONUNBUFFERED is set: either is right.
    let out = string(&d, "stdout");
    let err = string(&d, "stderr");
    assert!(out.is_empty() || out.starts_with("Serving HTTP on "), "{d}");
    assert!(err.contains("\"GET / HTTP/1.1\" 200"), "{d}");
    matches(
        &d,
        &json!({"session_id": sid, "stdout": out, "stderr": err, "offset": out.len(),
                "stderr_offset": err.len(), "command": {"command_id": cid, "command": command,
                "status": "running", "exit_code": null}}),
    );
    let body = r#"{
"session_id": "SESSION_ID",
"signal": "SIGTERM"
}"#
    .replace("SESSION_ID", &sid);
    let d = ok_data(&seed_post(via, "/v1/bash/kill", &body), None);
    matches(
        &d,
        &json!({"command_id": cid, "command": command, "status": "killed", "exit_code": null,
                "signal": "SIGTERM"}),
    );
    assert!(
        TcpStream::connect(("127.0.0.1", port)).is_err(),
        "the server is gone once kill answered"
    );

    // 写入 stdin: cat, fed a line, echoes it.
    let body = r#"{
"command": "cat",
"async_mode": true,
"hard_timeout": 120
}"#;
    let d = ok_data(&seed_post(via, "/v1/bash/exec", body), Some(EXEC_SCHEMA));
    matches(
        &d,
        &json!({"session_id": ANY_ID, "command_id": ANY_ID, "command": "cat",
                "status": "running", "stdout": "", "stderr": "",
                "exit_code": null, "offset": 0, "stderr_offset": 0}),
    );
    let (cat_sid, cat_cid) = (string(&d, "session_id"), string(&d, "command_id"));
    let body = r#"{
"session_id": "SESSION_ID",
"input": "hello from stdin\n"
}"#
    .replace("SESSION_ID", &cat_sid);
    let d = ok_data(&seed_post(via, "/v1/bash/write", &body), None);
    matches(&d, &json!({"written": 17}));
    let body = r#"{
"session_id": "SESSION_ID",
"offset": 0,
"wait": true,
"wait_timeout": 5
}"#
    .replace("SESSION_ID", &cat_sid);
    let d = ok_data(
        &seed_post(via, "/v1/bash/output", &body),
        Some(OUTPUT_SCHEMA),
    );
    matches(
        &d,
        &json!({"session_id": cat_sid, "stdout": "hello from stdin\n", "stderr": "",
                "offset": 17, "stderr_offset": 0, "command": {"command_id": cat_cid,
                "command": "cat", "status": "running", "exit_code": null}}),
    );

    // Session 状态: exec_dir sets the session's directory; a later command in the same
    // session starts there, and what a command exported is gone.
    let body = r#"{
"command": "pwd",
"exec_dir": "/tmp"
}"#;
    let d = ok_data(&seed_post(via, "/v1/bash/exec", body), Some(EXEC_SCHEMA));
    matches(
        &d,
        &json!({"session_id": ANY_ID, "command_id": ANY_ID, "command": "pwd",
                "status": "completed", "stdout": "/tmp\n", "stderr": "",
                "exit_code": 0, "offset": 5, "stderr_offset": 0}),
    );
    let (dir_sid, first_cid) = (string(&d, "session_id"), string(&d, "command_id"));
    let body = r#"{
"session_id": "SESSION_ID",
"command": "pwd && echo ${MY_VAR:-unset}"
}"#
    .replace("SESSION_ID", &dir_sid);
    let d = ok_data(&seed_post(via, "/v1/bash/exec", &body), Some(EXEC_SCHEMA));
    matches(
        &d,
        &json!({"session_id": dir_sid, "command_id": ANY_ID,
                "command": "pwd && echo ${MY_VAR:-unset}", "status": "completed",
                "stdout": "/tmp\nunset\n", "stderr": "", "exit_code": 0,
                "offset": 11, "stderr_offset": 0}),
    );
    assert_ne!(d["command_id"], first_cid.as_str());

    // 错误处理 (the requests example): HTTP 200 and success, the failure is the exit code.
    let d = post(
        via,
        "/v1/bash/exec",
        &json!({"command": "python3 missing.py", "timeout": 30}),
    );
    let d = ok_data(&d, Some(EXEC_SCHEMA));
    let err = string(&d, "stderr");
    assert!(
        err.contains("can't open file") && err.contains("missing.py"),
        "{d}"
    );
    matches(
        &d,
        &json!({"session_id": ANY_ID, "command_id": ANY_ID, "command": "python3 missing.py",
                "status": "completed", "stdout": "", "stderr": err, "exit_code": 2,
                "offset": 0, "stderr_offset": err.len()}),
    );

    // 相关接口: the sessions list, create and close.
    let d = ok_data(&get(via, "/v1/bash/sessions"), Some(SESSIONS_SCHEMA));
    let list = d.as_array().unwrap_or_else(|| panic!("a list: {d}"));
    let entry = |id: &str| -> Value {
        list.iter()
            .find(|s| s["session_id"] == id)
            .unwrap_or_else(|| panic!("{id} not in {d}"))
            .clone()
    };
    matches(
        &entry(&dir_sid),
        &json!({"session_id": dir_sid, "status": "ready", "working_dir": "/tmp",
                "created_at": ANY_TIME, "last_used_at": ANY_TIME, "current_command": null,
                "command_count": 2}),
    );
    matches(
        &entry(&first_session),
        &json!({"session_id": first_session, "status": "ready", "working_dir": "/home/gem",
                "created_at": ANY_TIME, "last_used_at": ANY_TIME, "current_command": null,
                "command_count": 1}),
    );
    matches(
        &entry(&cat_sid),
        &json!({"session_id": cat_sid, "status": "ready",
                "working_dir": workdir.display().to_string(),
                "created_at": ANY_TIME, "last_used_at": ANY_TIME, "current_command": "cat",
                "command_count": 1}),
    );

    let d = ok_data(
        &post(
            via,
            "/v1/bash/sessions/create",
            &json!({"session_id": "seed-made", "exec_dir": "/tmp"}),
        ),
        Some(SESSION_SCHEMA),
    );
    matches(
        &d,
        &json!({"session_id": "seed-made", "status": "ready", "working_dir": "/tmp",
                "created_at": ANY_TIME, "last_used_at": ANY_TIME, "current_command": null,
                "command_count": 0}),
    );
    for id in ["seed-made", cat_sid.as_str()] {
        let r = curl(
            via,
            &[
                "-X",
                "POST",
                &via.url(&format!("/v1/bash/sessions/{id}/close")),
            ],
        );
        matches(&ok_data(&r, None), &json!({}));
    }
    let d = ok_data(&get(via, "/v1/bash/sessions"), Some(SESSIONS_SCHEMA));
    let ids: Vec<&Value> = d
        .as_array()
        .expect("a list")
        .iter()
        .map(|s| &s["session_id"])
        .collect();
    assert!(!ids.contains(&&json!("seed-made")), "{d}");
    assert!(!ids.contains(&&json!(cat_sid)), "{d}");
    // Closing the session ended its cat.
    let r = post(
        via,
        "/v1/bash/output",
        &json!({"session_id": cat_sid, "command_id": cat_cid}),
    );
    failure(&r, 404);
}

#[test]
fn seed_curl_examples_over_the_unix_socket() {
    if !have(&["curl"]) {
        return;
    }
    let front = start_front(&[]);
    seed_examples(&front.unix(), front.dir());
}

#[test]
fn seed_curl_examples_over_tcp() {
    if !have(&["curl"]) {
        return;
    }
    let front = start_front(&[]);
    seed_examples(&front.tcp(), front.dir());
}

/// Error statuses of section 11, over both transports.
#[test]
fn errors_map_to_their_statuses() {
    if !have(&["curl"]) {
        return;
    }
    let front = start_front(&[]);
    for via in front.both() {
        // -32002: 404 with the failure envelope.
        let r = post(&via, "/v1/bash/output", &json!({"session_id": "no-such"}));
        let (_, data) = failure(&r, 404);
        assert_eq!(data, Value::Null);
        // -32602: 422 naming the field.
        unprocessable(
            &post(&via, "/v1/bash/exec", &json!({"command": 5})),
            json!(["body", "command"]),
        );
        unprocessable(
            &post(&via, "/v1/bash/exec", &json!({})),
            json!(["body", "command"]),
        );
        // -32700: 422 at the body.
        let r = curl(
            &via,
            &["-X", "POST", &via.url("/v1/bash/exec"), "-d", "{not json"],
        );
        unprocessable(&r, json!(["body"]));
        let r = curl(
            &via,
            &["-X", "POST", &via.url("/v1/bash/exec"), "-d", "[1, 2]"],
        );
        unprocessable(&r, json!(["body"]));
        // -32000 (nothing running to write to): 400.
        let d = ok_data(
            &post(&via, "/v1/bash/exec", &json!({"command": "true"})),
            Some(EXEC_SCHEMA),
        );
        let sid = string(&d, "session_id");
        let r = post(
            &via,
            "/v1/bash/write",
            &json!({"session_id": sid, "input": "x"}),
        );
        failure(&r, 400);
        // An unknown signal: 422 naming it.
        let r = post(
            &via,
            "/v1/bash/kill",
            &json!({"session_id": sid, "signal": "SIGBOGUS"}),
        );
        unprocessable(&r, json!(["body", "signal"]));
        // A directory that is not there: 422 for the field.
        unprocessable(
            &post(
                &via,
                "/v1/bash/exec",
                &json!({"command": "pwd", "exec_dir": "/no/such/dir"}),
            ),
            json!(["body", "exec_dir"]),
        );
    }
}

// ---- 2. keep-alive ---------------------------------------------------------------------

#[test]
fn curl_reuses_one_connection_for_two_requests() {
    if !have(&["curl"]) {
        return;
    }
    let audit = TempDir::new();
    let audit_file = audit.path().join("audit.jsonl");
    let audit_arg = audit_file.display().to_string();
    let front = start_front(&["--audit", &audit_arg]);
    let connects = || {
        std::fs::read_to_string(&audit_file)
            .unwrap_or_default()
            .lines()
            .filter(|l| l.contains("\"event\":\"connect\""))
            .count()
    };
    // The probes that saw the daemon listen, one on each transport, are accepted (and
    // audited) when the loop gets to them: count from after both.
    wait_until("the start-up probes are audited", || connects() == 2);
    for via in front.both() {
        let dir = TempDir::new();
        let (a, b) = (dir.path().join("a"), dir.path().join("b"));
        let before = connects();
        let mut args = vec!["-v".to_string()];
        args.extend(via.curl_args());
        args.extend([
            via.url("/v1/health"),
            "-o".into(),
            a.display().to_string(),
            via.url("/v1/bash/sessions"),
            "-o".into(),
            b.display().to_string(),
            "-w".into(),
            "%{num_connects}\n".into(),
        ]);
        let out = curl_raw(&args);
        // num_connects: new connections each transfer made.
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            "1\n0\n",
            "{}",
            via.name()
        );
        let trace = String::from_utf8_lossy(&out.stderr);
        assert!(
            trace.contains("Re-using existing connection"),
            "{}: {trace}",
            via.name()
        );
        let health: Value =
            serde_json::from_slice(&std::fs::read(&a).expect("a")).expect("health JSON");
        assert_eq!(health, json!({"status": "ok"}));
        let sessions: Value =
            serde_json::from_slice(&std::fs::read(&b).expect("b")).expect("sessions JSON");
        assert_eq!(sessions["success"], true);
        assert!(sessions["data"].is_array());
        // The daemon saw one connection for the two requests.
        wait_until("the audit records the connection", || connects() > before);
        assert_eq!(connects(), before + 1, "{}", via.name());
    }
}

// ---- 3. a long poll answered by output -------------------------------------------------

#[test]
fn a_long_poll_is_answered_when_the_command_writes() {
    if !have(&["curl"]) {
        return;
    }
    let front = start_front(&[]);
    let mut rpc = front.daemon.client();
    for via in front.both() {
        let gate = front.dir().join(format!("gate-{}", via.name()));
        let command = format!(
            "while [ ! -e {} ]; do sleep 0.02; done; echo ready",
            gate.display()
        );
        let d = ok_data(
            &post(
                &via,
                "/v1/bash/exec",
                &json!({"command": command, "async_mode": true}),
            ),
            Some(EXEC_SCHEMA),
        );
        let (sid, cid) = (string(&d, "session_id"), string(&d, "command_id"));

        // The long poll, by curl in the background; its trace says when the request is
        // sent whole ("} [N bytes data]").
        let body = json!({"session_id": sid, "offset": 0, "stderr_offset": 0, "wait": true,
                          "wait_timeout": 60})
        .to_string();
        let mut args = vec![
            "-q".to_string(),
            "-sS".into(),
            "-v".into(),
            "-i".into(),
            "--max-time".into(),
            CURL_MAX_TIME.into(),
        ];
        args.extend(via.curl_args());
        args.extend([
            "-X".into(),
            "POST".into(),
            via.url("/v1/bash/output"),
            "-H".into(),
            "Content-Type: application/json".into(),
            "-d".into(),
            body,
        ]);
        let mut poll = Reap(
            Command::new("curl")
                .args(&args)
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("spawn curl"),
        );
        let mut trace = BufReader::new(poll.0.stderr.take().expect("stderr"));
        let mut seen = String::new();
        loop {
            let mut line = String::new();
            let n = trace.read_line(&mut line).expect("read curl's trace");
            assert!(n > 0, "curl ended before sending its request: {seen}");
            seen.push_str(&line);
            if line.starts_with("} [") {
                break;
            }
        }
        // A JSON-RPC round trip after the request's bytes are in: the daemon reads in
        // readiness order and writes answers at the end of a turn, so by this answer it
        // has parked the poll.
        wait_until("the long poll's client is connected", || {
            clients(&mut rpc) == 1
        });
        std::fs::write(&gate, "").expect("open the gate");
        let out = poll.finish(WAIT);
        let mut rest = Vec::new();
        let _ = trace.read_to_end(&mut rest);
        assert!(
            out.status.success(),
            "curl: {}{}",
            seen,
            String::from_utf8_lossy(&rest)
        );
        let d = ok_data(&parse_curl_i(&out.stdout), Some(OUTPUT_SCHEMA));
        let ended = d["command"]["status"] == "completed";
        matches(
            &d,
            &json!({"session_id": sid, "stdout": "ready\n", "stderr": "", "offset": 6,
                    "stderr_offset": 0, "command": {"command_id": cid, "command": command,
                    "status": if ended { "completed" } else { "running" },
                    "exit_code": if ended { json!(0) } else { Value::Null }}}),
        );
    }
}

// ---- 4. a client that leaves during a long poll ----------------------------------------

/// A raw connection (Unix or TCP) with a bounded read timeout.
enum Sock {
    Unix(UnixStream),
    Tcp(TcpStream),
}

impl Read for Sock {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Sock::Unix(s) => s.read(buf),
            Sock::Tcp(s) => s.read(buf),
        }
    }
}

impl Write for Sock {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            Sock::Unix(s) => s.write(buf),
            Sock::Tcp(s) => s.write(buf),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A raw HTTP/1.1 connection: bytes out, responses parsed in.
struct Raw {
    sock: Sock,
    buf: Vec<u8>,
}

impl Raw {
    #[track_caller]
    fn open(via: &Via) -> Raw {
        let sock = match via {
            Via::Unix(path) => {
                let s = UnixStream::connect(path).expect("connect");
                s.set_read_timeout(Some(WAIT)).expect("timeout");
                Sock::Unix(s)
            }
            Via::Tcp(port) => {
                let s = TcpStream::connect(("127.0.0.1", *port)).expect("connect");
                s.set_read_timeout(Some(WAIT)).expect("timeout");
                Sock::Tcp(s)
            }
        };
        Raw {
            sock,
            buf: Vec::new(),
        }
    }

    #[track_caller]
    fn send(&mut self, bytes: &[u8]) {
        self.sock.write_all(bytes).expect("send");
    }

    /// Reads more bytes; false at EOF (or a reset, which is how some peers close).
    #[track_caller]
    fn fill(&mut self) -> bool {
        let mut chunk = [0u8; 16384];
        match read_some(&mut self.sock, &mut chunk) {
            Ok(0) => false,
            Ok(n) => {
                self.buf.extend_from_slice(&chunk[..n]);
                true
            }
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => false,
            Err(e) => panic!("read: {e} (after {:?})", String::from_utf8_lossy(&self.buf)),
        }
    }

    /// The next response (a `1xx` included), whole.
    #[track_caller]
    fn response(&mut self) -> Reply {
        let end = loop {
            if let Some(i) = self.buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break i;
            }
            assert!(
                self.fill(),
                "closed before a whole head: {:?}",
                String::from_utf8_lossy(&self.buf)
            );
        };
        let head = String::from_utf8_lossy(&self.buf[..end]).into_owned();
        let (status, headers) = parse_head(&head);
        let length: usize = headers
            .iter()
            .find(|(n, _)| n == "content-length")
            .map_or(0, |(_, v)| v.parse().expect("Content-Length"));
        while self.buf.len() < end + 4 + length {
            assert!(self.fill(), "closed inside a body");
        }
        let body = self.buf[end + 4..end + 4 + length].to_vec();
        self.buf.drain(..end + 4 + length);
        Reply {
            status,
            headers,
            body,
        }
    }

    /// The daemon closes the connection with nothing more to say.
    #[track_caller]
    fn closed(&mut self) {
        while self.fill() {}
        assert!(
            self.buf.is_empty(),
            "more after the last answer: {:?}",
            String::from_utf8_lossy(&self.buf)
        );
    }
}

/// A request with `Content-Length`, and the token on TCP.
fn request(via: &Via, method: &str, path: &str, body: &str) -> Vec<u8> {
    format!(
        "{method} {path} HTTP/1.1\r\nHost: execd\r\n{}Content-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n{body}",
        via.auth_header(),
        body.len()
    )
    .into_bytes()
}

fn a_client_that_leaves_a_long_poll_leaks_nothing(via_of: impl Fn(&Front) -> Via) {
    let front = start_front(&[]);
    let via = via_of(&front);
    let d = &front.daemon;
    let gate = front.dir().join("gate");
    let command = format!(
        "while [ ! -e {} ]; do sleep 0.02; done; echo finished",
        gate.display()
    );
    let r = post(
        &via,
        "/v1/bash/exec",
        &json!({"command": command, "async_mode": true}),
    );
    let e = ok_data(&r, Some(EXEC_SCHEMA));
    let (sid, cid) = (string(&e, "session_id"), string(&e, "command_id"));
    let mut rpc = d.client();
    wait_until("curl's connection is gone", || clients(&mut rpc) == 0);
    let fds = fd_count(d.pid());

    let mut raw = Raw::open(&via);
    let body = json!({"session_id": sid, "wait": true, "wait_timeout": 60}).to_string();
    raw.send(&request(&via, "POST", "/v1/bash/output", &body));
    // Parked (see a_long_poll_is_answered_when_the_command_writes for why a round trip
    // after the request is enough).
    wait_until("the long poll's client is connected", || {
        clients(&mut rpc) == 1
    });
    drop(raw);

    wait_until("the daemon lets the long poll's client go", || {
        clients(&mut rpc) == 0
    });
    wait_until(
        "the daemon holds no more descriptors than before the poll",
        || fd_count(d.pid()) <= fds,
    );
    // It keeps serving, on both transports.
    for v in front.both() {
        let r = get(&v, "/v1/health");
        assert_eq!(r.status, 200, "{r:?}");
        assert_eq!(r.json(), json!({"status": "ok"}));
    }
    // The command was not touched: it goes on, and ends normally once let through.
    let r = post(
        &via,
        "/v1/bash/output",
        &json!({"session_id": sid, "command_id": cid}),
    );
    let o = ok_data(&r, Some(OUTPUT_SCHEMA));
    assert_eq!(o["command"]["status"], "running", "{o}");
    std::fs::write(&gate, "").expect("open the gate");
    let (out, err, cmd) = output_until_ended(&via, &sid, &cid, &command, [0, 0]);
    assert_eq!((out.as_str(), err.as_str()), ("finished\n", ""));
    matches(
        &cmd,
        &json!({"command_id": cid, "command": command, "status": "completed", "exit_code": 0}),
    );
    assert!(!d.log().contains("panic"), "{}", d.log());
}

#[test]
fn a_client_that_leaves_a_long_poll_leaks_nothing_over_the_unix_socket() {
    if !have(&["curl"]) {
        return;
    }
    a_client_that_leaves_a_long_poll_leaks_nothing(Front::unix);
}

/// Over TCP a peer's close arrives as a FIN only: epoll reports the read side closed
/// (EPOLLRDHUP), never EPOLLHUP, so `server.rs` (`on_ready`'s `hung_up` is
/// `is_write_closed()`) takes it for a half-close, and `Conn::finished` keeps a connection
/// whose request is parked. The long poll then holds the connection, counted as a client,
/// until its `wait_timeout`; a synchronous exec without `timeout`, until its command exits.
/// HTTP/1.1 clients do not half-close: EOF with a request parked is the client leaving.
#[test]
fn a_client_that_leaves_a_long_poll_leaks_nothing_over_tcp() {
    if !have(&["curl"]) {
        return;
    }
    a_client_that_leaves_a_long_poll_leaks_nothing(Front::tcp);
}

// ---- 5. the token ----------------------------------------------------------------------

#[test]
fn tcp_needs_the_token_and_never_shows_it() {
    if !have(&["curl"]) {
        return;
    }
    let audit = TempDir::new();
    let audit_file = audit.path().join("audit.jsonl");
    let audit_arg = audit_file.display().to_string();
    let front = start_front(&["--audit", &audit_arg]);
    let token_path = front.dir().join("token");
    let mode = std::fs::metadata(&token_path)
        .expect("token")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);

    // TCP commands run as nobody: the marker goes where nobody may write.
    let shared = front.dir().join("shared");
    std::fs::create_dir(&shared).expect("mkdir");
    std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o777)).expect("chmod");
    let marker = shared.join("ran");
    let body = json!({"command": format!("touch {}", marker.display())}).to_string();
    let url = format!("http://127.0.0.1:{}/v1/bash/exec", front.port);
    let wrong = format!("Authorization: Bearer {}x", TOKEN);
    let short = format!("Authorization: Bearer {}", &TOKEN[..TOKEN.len() - 1]);
    let basic = format!("Authorization: Basic {TOKEN}");
    let refusals: [&[&str]; 5] = [
        &[],
        &["-H", &wrong],
        &["-H", &short],
        &["-H", &basic],
        &["-H", "Authorization: Bearer"],
    ];
    for extra in refusals {
        let mut args = vec!["-i", "-X", "POST", url.as_str(), "-d", body.as_str()];
        args.extend(extra);
        let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        let r = parse_curl_i(&curl_raw(&args).stdout);
        let (_, data) = failure(&r, 401);
        assert_eq!(data, Value::Null);
        assert_eq!(r.header("www-authenticate"), Some("Bearer"), "{r:?}");
    }
    // Also for paths that do not exist: no route is told apart before the token.
    let r = parse_curl_i(
        &curl_raw(&[
            "-i".into(),
            format!("http://127.0.0.1:{}/v1/nowhere", front.port),
        ])
        .stdout,
    );
    failure(&r, 401);
    assert!(!marker.exists(), "a refused request ran its command");

    // The right token, in any case of the scheme.
    for scheme in ["Bearer", "bearer"] {
        let auth = format!("Authorization: {scheme} {TOKEN}");
        let args: Vec<String> = ["-i", "-X", "POST", &url, "-H", &auth, "-d", &body]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let r = parse_curl_i(&curl_raw(&args).stdout);
        let d = ok_data(&r, Some(EXEC_SCHEMA));
        assert_eq!(d["exit_code"], 0, "{d}");
    }
    assert!(marker.exists());

    // Nowhere to be read back: not in initialize, the log or the audit.
    let mut c = front.daemon.client();
    let init = ok(&mut c, "initialize", json!({}));
    assert!(!init.to_string().contains(TOKEN), "{init}");
    let log = front.daemon.log();
    assert!(log.contains("bearer token required"), "{log}");
    assert!(!log.contains(TOKEN), "{log}");
    let audit_text = std::fs::read_to_string(&audit_file).unwrap_or_default();
    assert!(audit_text.contains("\"event\":\"start\""), "{audit_text}");
    assert!(!audit_text.contains(TOKEN), "{audit_text}");
}

#[test]
fn a_token_file_others_may_read_or_an_empty_one_is_refused() {
    for (content, mode, why) in [(TOKEN, 0o644, "readable by others"), ("\n", 0o600, "empty")] {
        let dir = TempDir::new();
        let path = dir.path().join("token");
        std::fs::write(&path, content).expect("write");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).expect("chmod");
        let args: Vec<String> = vec![
            "--http-listen".into(),
            format!("127.0.0.1:{}", free_port()),
            "--http-token-file".into(),
            path.display().to_string(),
            "--http-run-as".into(),
            "nobody".into(),
        ];
        let (code, log) = refused(&args);
        assert_eq!(code, Some(1), "{log}");
        assert!(
            log.contains("--http-token-file") && log.contains(why),
            "{log}"
        );
        assert!(!log.contains(TOKEN), "{log}");
    }
    let (code, log) = refused(&[
        "--http-listen".into(),
        format!("127.0.0.1:{}", free_port()),
        "--http-token-file".into(),
        "/nonexistent/token".into(),
        "--http-run-as".into(),
        "nobody".into(),
    ]);
    assert_eq!(code, Some(1), "{log}");
    assert!(log.contains("/nonexistent/token"), "{log}");
}

// ---- 6. --http-no-auth -----------------------------------------------------------------

#[test]
fn http_no_auth_is_for_loopback_only_and_warned_about() {
    if !have(&["curl"]) {
        return;
    }
    for addr in ["0.0.0.0", "192.0.2.1", "[::]"] {
        let (code, log) = refused(&[
            "--http-listen".into(),
            format!("{addr}:{}", free_port()),
            "--http-no-auth".into(),
            "--http-run-as".into(),
            "nobody".into(),
        ]);
        assert_eq!(code, Some(2), "a flag error: {log}");
        assert!(
            log.contains("--http-no-auth") && log.contains("loopback"),
            "{log}"
        );
    }
    let (daemon, port) = start_on_free_port(|_, port| {
        vec![
            "--http-listen".into(),
            format!("127.0.0.1:{port}"),
            "--http-no-auth".into(),
            "--http-run-as".into(),
            "nobody".into(),
            "--workdir".into(),
            "/tmp".into(),
        ]
    });
    // The socket takes connections before the loop's first turn writes the log.
    wait_until("the --http-no-auth warning is logged", || {
        daemon
            .log()
            .lines()
            .any(|l| l.contains("warning") && l.contains("--http-no-auth"))
    });
    let r = parse_curl_i(
        &curl_raw(&[
            "-i".into(),
            "-X".into(),
            "POST".into(),
            format!("http://127.0.0.1:{port}/v1/bash/exec"),
            "-d".into(),
            r#"{"command": "id -u"}"#.into(),
        ])
        .stdout,
    );
    let d = ok_data(&r, Some(EXEC_SCHEMA));
    assert_eq!(d["stdout"], "65534\n", "{d}");
}

// ---- 7. --http-run-as ------------------------------------------------------------------

#[test]
fn tcp_requests_run_as_the_http_run_as_user() {
    if !have(&["curl"]) {
        return;
    }
    let front = start_front(&[]);
    let id = |via: &Via| {
        let d = ok_data(
            &post(via, "/v1/bash/exec", &json!({"command": "id -u; id -g"})),
            Some(EXEC_SCHEMA),
        );
        (string(&d, "stdout"), string(&d, "session_id"))
    };
    let (tcp_ids, tcp_session) = id(&front.tcp());
    assert_eq!(tcp_ids, format!("{NOBODY}\n{NOBODY}\n"));
    let (unix_ids, unix_session) = id(&front.unix());
    assert_eq!(unix_ids, "0\n0\n", "the socket's root peer runs as root");
    // Each session is owned by whom it ran as: neither sees the other's.
    let listed = |via: &Via| -> Vec<Value> {
        let d = ok_data(&get(via, "/v1/bash/sessions"), Some(SESSIONS_SCHEMA));
        d.as_array()
            .expect("list")
            .iter()
            .map(|s| s["session_id"].clone())
            .collect()
    };
    let tcp_list = listed(&front.tcp());
    assert!(tcp_list.contains(&json!(tcp_session)) && !tcp_list.contains(&json!(unix_session)));
    let unix_list = listed(&front.unix());
    assert!(unix_list.contains(&json!(unix_session)) && !unix_list.contains(&json!(tcp_session)));
}

/// `--run-as` is for Unix peers that are not root; a request over TCP still runs as
/// `--http-run-as`.
#[test]
fn run_as_does_not_override_http_run_as() {
    if !have(&["curl"]) {
        return;
    }
    let front = start_front(&["--run-as", "daemon"]);
    let d = ok_data(
        &post(&front.tcp(), "/v1/bash/exec", &json!({"command": "id -u"})),
        Some(EXEC_SCHEMA),
    );
    assert_eq!(d["stdout"], format!("{NOBODY}\n"), "{d}");
}

#[test]
fn a_root_daemon_with_http_listen_needs_http_run_as() {
    assert_eq!(
        execd::current_uid(),
        0,
        "this test runs as root (as CI does)"
    );
    let dir = TempDir::new();
    let token = token_file(dir.path());
    let (code, log) = refused(&[
        "--http-listen".into(),
        format!("127.0.0.1:{}", free_port()),
        "--http-token-file".into(),
        token.display().to_string(),
    ]);
    assert_eq!(code, Some(1), "{log}");
    assert!(log.contains("--http-run-as"), "{log}");
}

// ---- 8. another owner's session --------------------------------------------------------

#[test]
fn a_foreign_uid_on_the_socket_sees_404_for_another_owners_session() {
    if !have(&["curl"]) {
        return;
    }
    let d = Daemon::start(&["--socket-mode", "0666", "--allow-uid", "65534"]);
    std::fs::set_permissions(d.dir.path(), std::fs::Permissions::from_mode(0o755))
        .expect("chmod the temp dir");
    let root = Via::Unix(d.socket.clone());
    let made = ok_data(
        &post(
            &root,
            "/v1/bash/sessions/create",
            &json!({"session_id": "mine", "exec_dir": "/tmp"}),
        ),
        Some(SESSION_SCHEMA),
    );
    assert_eq!(made["session_id"], "mine");
    let e = ok_data(
        &post(
            &root,
            "/v1/bash/exec",
            &json!({"session_id": "mine", "command": "echo secret"}),
        ),
        Some(EXEC_SCHEMA),
    );
    assert_eq!(e["stdout"], "secret\n");

    // curl as uid/gid 65534.
    let as_nobody = |args: &[&str]| -> Reply {
        let out = Command::new("curl")
            .args([
                "-q",
                "-sS",
                "-i",
                "--max-time",
                CURL_MAX_TIME,
                "--unix-socket",
            ])
            .arg(&d.socket)
            .args(args)
            .uid(NOBODY)
            .gid(NOBODY)
            .stdin(Stdio::null())
            .output()
            .expect("curl as nobody");
        assert!(
            out.status.success(),
            "curl as nobody: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        parse_curl_i(&out.stdout)
    };
    let output = r#"{"session_id": "mine", "offset": 0, "stderr_offset": 0}"#;
    let r = as_nobody(&["-X", "POST", "http://execd/v1/bash/output", "-d", output]);
    let (_, data) = failure(&r, 404);
    assert_eq!(data, Value::Null);
    let r = as_nobody(&["-X", "POST", "http://execd/v1/bash/sessions/mine/close"]);
    failure(&r, 404);
    let r = as_nobody(&[
        "-X",
        "POST",
        "http://execd/v1/bash/kill",
        "-d",
        r#"{"session_id": "mine"}"#,
    ]);
    failure(&r, 404);
    let r = as_nobody(&["http://execd/v1/bash/sessions"]);
    assert_eq!(ok_data(&r, Some(SESSIONS_SCHEMA)), json!([]));
    // Its own commands run as itself.
    let r = as_nobody(&[
        "-X",
        "POST",
        "http://execd/v1/bash/exec",
        "-d",
        r#"{"command": "id -u", "exec_dir": "/tmp"}"#,
    ]);
    assert_eq!(ok_data(&r, Some(EXEC_SCHEMA))["stdout"], "65534\n");

    // The owner's session is as it was.
    let o = ok_data(
        &post(&root, "/v1/bash/output", &json!({"session_id": "mine"})),
        Some(OUTPUT_SCHEMA),
    );
    assert_eq!(o["stdout"], "secret\n");
}

// ---- 9. malformed and unusual input, over raw sockets ----------------------------------

#[test]
fn a_request_line_that_does_not_parse_is_400_and_closes() {
    let front = start_front(&[]);
    for via in front.both() {
        for line in [
            "GARBAGE",
            "G(T /v1/health HTTP/1.1",
            "GET /v1/health HTTP/1.1 x",
        ] {
            let mut raw = Raw::open(&via);
            // A good request after the bad line is never answered.
            raw.send(
                format!("{line}\r\nHost: execd\r\n\r\nGET /v1/health HTTP/1.1\r\n\r\n").as_bytes(),
            );
            let r = raw.response();
            failure(&r, 400);
            assert_eq!(r.header("connection"), Some("close"), "{r:?}");
            raw.closed();
        }
    }
}

/// RFC 9112 §3: a request line whose version is not `HTTP/DIGIT.DIGIT` is an invalid
/// request line (400); 505 is for a version that parses but is not supported.
#[test]
fn a_request_line_with_a_malformed_version_is_400_not_505() {
    let front = start_front(&[]);
    for line in ["GET /v1 /health HTTP/1.1", "GET /v1/health FOO"] {
        let mut raw = Raw::open(&front.unix());
        raw.send(format!("{line}\r\nHost: execd\r\n\r\n").as_bytes());
        let r = raw.response();
        assert_eq!(r.status, 400, "{line:?}: {r:?}");
        raw.closed();
    }
}

#[test]
fn headers_over_64_kib_or_100_fields_are_431() {
    let front = start_front(&[]);
    for via in front.both() {
        let mut raw = Raw::open(&via);
        let big = format!(
            "GET /v1/health HTTP/1.1\r\n{}X-Big: {}\r\n\r\n",
            via.auth_header(),
            "a".repeat(64 * 1024)
        );
        raw.send(big.as_bytes());
        let r = raw.response();
        let (_, data) = failure(&r, 431);
        assert_eq!(data, json!({"max_bytes": 65536, "max_fields": 100}));
        assert_eq!(r.header("connection"), Some("close"));
        raw.closed();

        let mut raw = Raw::open(&via);
        let fields: String = (0..101).map(|i| format!("X-F{i}: v\r\n")).collect();
        raw.send(
            format!(
                "GET /v1/health HTTP/1.1\r\n{}{fields}\r\n",
                via.auth_header()
            )
            .as_bytes(),
        );
        failure(&raw.response(), 431);
        raw.closed();

        // Just under both bounds is fine.
        let mut raw = Raw::open(&via);
        // Host, X-Big, the token on TCP and these: at most 100 fields.
        let fields: String = (0..96).map(|i| format!("X-F{i}: v\r\n")).collect();
        raw.send(
            format!(
                "GET /v1/health HTTP/1.1\r\nHost: execd\r\n{}{fields}X-Big: {}\r\n\r\n",
                via.auth_header(),
                "a".repeat(60 * 1024)
            )
            .as_bytes(),
        );
        assert_eq!(raw.response().status, 200);
    }
}

#[test]
fn a_body_over_max_message_is_413() {
    if !have(&["curl"]) {
        return;
    }
    let front = start_front(&["--max-message", "1K"]);
    for via in front.both() {
        // Refused on its declared length, before the body is read.
        let mut raw = Raw::open(&via);
        raw.send(
            format!(
                "POST /v1/bash/exec HTTP/1.1\r\nHost: execd\r\n{}Content-Length: 1025\r\n\r\n",
                via.auth_header()
            )
            .as_bytes(),
        );
        let r = raw.response();
        let (_, data) = failure(&r, 413);
        assert_eq!(data, json!({"limit": 1024}));
        assert_eq!(r.header("connection"), Some("close"));
        raw.closed();

        // Chunked: refused when a chunk would pass the limit.
        let mut raw = Raw::open(&via);
        raw.send(
            format!(
                "POST /v1/bash/exec HTTP/1.1\r\nHost: execd\r\n{}Transfer-Encoding: chunked\r\n\r\n\
                 200\r\n{}\r\n201\r\n",
                via.auth_header(),
                " ".repeat(0x200)
            )
            .as_bytes(),
        );
        let (_, data) = failure(&raw.response(), 413);
        assert_eq!(data, json!({"limit": 1024}));
        raw.closed();

        // By curl, with the whole body sent.
        let body = json!({"command": format!("echo {}", "x".repeat(1100))}).to_string();
        let r = curl(
            &via,
            &["-X", "POST", &via.url("/v1/bash/exec"), "-d", &body],
        );
        failure(&r, 413);

        // At the limit it is taken.
        let command = format!("printf %s {}", "y".repeat(1024 - 30));
        let body = json!({"command": command}).to_string();
        let body = format!("{body}{}", " ".repeat(1024 - body.len()));
        assert_eq!(body.len(), 1024);
        let r = curl(
            &via,
            &["-X", "POST", &via.url("/v1/bash/exec"), "-d", &body],
        );
        let d = ok_data(&r, Some(EXEC_SCHEMA));
        assert_eq!(d["stdout"], "y".repeat(1024 - 30).as_str());
    }
}

#[test]
fn http2_and_http3_are_505() {
    let front = start_front(&[]);
    for via in front.both() {
        for preface in [
            "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_string(),
            format!(
                "GET /v1/health HTTP/3.0\r\nHost: execd\r\n{}\r\n",
                via.auth_header()
            ),
        ] {
            let mut raw = Raw::open(&via);
            raw.send(preface.as_bytes());
            let r = raw.response();
            failure(&r, 505);
            assert_eq!(r.header("connection"), Some("close"));
            raw.closed();
        }
    }
}

#[test]
fn expect_100_continue_gets_continue_then_the_answer() {
    if !have(&["curl"]) {
        return;
    }
    let front = start_front(&[]);
    for via in front.both() {
        let body = r#"{"command": "echo continued"}"#;
        let mut raw = Raw::open(&via);
        raw.send(
            format!(
                "POST /v1/bash/exec HTTP/1.1\r\nHost: execd\r\n{}Content-Type: application/json\r\n\
                 Expect: 100-continue\r\nContent-Length: {}\r\n\r\n",
                via.auth_header(),
                body.len()
            )
            .as_bytes(),
        );
        let r = raw.response();
        assert_eq!(r.status, 100, "{r:?}");
        assert!(r.headers.is_empty() && r.body.is_empty(), "{r:?}");
        raw.send(body.as_bytes());
        let d = ok_data(&raw.response(), Some(EXEC_SCHEMA));
        assert_eq!(d["stdout"], "continued\n");
        // The connection goes on.
        raw.send(&request(&via, "GET", "/v1/health", ""));
        assert_eq!(raw.response().json(), json!({"status": "ok"}));

        // And with curl asking for it.
        let out = curl_raw(
            &[
                vec!["-i".to_string()],
                via.curl_args(),
                vec![
                    "-X".into(),
                    "POST".into(),
                    via.url("/v1/bash/exec"),
                    "-H".into(),
                    "Expect: 100-continue".into(),
                    "-d".into(),
                    body.into(),
                ],
            ]
            .concat(),
        );
        assert!(
            String::from_utf8_lossy(&out.stdout).starts_with("HTTP/1.1 100 Continue\r\n\r\n"),
            "{}",
            String::from_utf8_lossy(&out.stdout)
        );
        let d = ok_data(&parse_curl_i(&out.stdout), Some(EXEC_SCHEMA));
        assert_eq!(d["stdout"], "continued\n");
    }
}

#[test]
fn a_chunked_body_works() {
    if !have(&["curl"]) {
        return;
    }
    let front = start_front(&[]);
    for via in front.both() {
        let (a, b) = (r#"{"command":"#, r#" "echo chunked"}"#);
        let mut raw = Raw::open(&via);
        raw.send(
            format!(
                "POST /v1/bash/exec HTTP/1.1\r\nHost: execd\r\n{}Transfer-Encoding: chunked\r\n\r\n\
                 {:x};name=value\r\n{a}\r\n{:X}\r\n{b}\r\n0\r\nX-Trailer: t\r\n\r\n",
                via.auth_header(),
                a.len(),
                b.len()
            )
            .as_bytes(),
        );
        let d = ok_data(&raw.response(), Some(EXEC_SCHEMA));
        assert_eq!(d["stdout"], "chunked\n", "{d}");
        assert_eq!(d["command"], "echo chunked");

        let r = curl(
            &via,
            &[
                "-X",
                "POST",
                &via.url("/v1/bash/exec"),
                "-H",
                "Transfer-Encoding: chunked",
                "-d",
                r#"{"command": "echo by curl"}"#,
            ],
        );
        let d = ok_data(&r, Some(EXEC_SCHEMA));
        assert_eq!(d["stdout"], "by curl\n", "{d}");
    }
}

#[test]
fn pipelined_requests_are_answered_in_order() {
    let front = start_front(&[]);
    let mut rpc = front.daemon.client();
    for via in front.both() {
        let gate = front.dir().join(format!("pipeline-{}", via.name()));
        let first = json!({"command": format!(
            "while [ ! -e {} ]; do sleep 0.02; done; echo first", gate.display())})
        .to_string();
        let third = json!({"command": "echo third"}).to_string();
        let mut all = request(&via, "POST", "/v1/bash/exec", &first);
        all.extend(request(&via, "GET", "/v1/health", ""));
        all.extend(request(&via, "POST", "/v1/bash/exec", &third));
        let mut raw = Raw::open(&via);
        raw.send(&all);
        // The three are read and the first is parked before the gate opens (see
        // a_long_poll_is_answered_when_the_command_writes); the other two are done at
        // once, and still wait their turn.
        let _ = ok(&mut rpc, "initialize", json!({}));
        std::fs::write(&gate, "").expect("open the gate");
        let d = ok_data(&raw.response(), Some(EXEC_SCHEMA));
        assert_eq!(d["stdout"], "first\n", "{d}");
        let r = raw.response();
        assert_eq!(r.status, 200);
        assert_eq!(r.json(), json!({"status": "ok"}));
        let d = ok_data(&raw.response(), Some(EXEC_SCHEMA));
        assert_eq!(d["stdout"], "third\n", "{d}");
    }
}

#[test]
fn connection_close_and_http_1_0_close_after_the_answer() {
    let front = start_front(&[]);
    for via in front.both() {
        for (version, extra) in [("HTTP/1.1", "Connection: close\r\n"), ("HTTP/1.0", "")] {
            let mut raw = Raw::open(&via);
            raw.send(
                format!(
                    "GET /v1/health {version}\r\nHost: execd\r\n{}{extra}\r\nGET /v1/health HTTP/1.1\r\n\r\n",
                    via.auth_header()
                )
                .as_bytes(),
            );
            let r = raw.response();
            assert_eq!(r.status, 200, "{r:?}");
            assert_eq!(r.header("connection"), Some("close"), "{r:?}");
            raw.closed();
        }
        // HTTP/1.0 asking for keep-alive keeps it.
        let mut raw = Raw::open(&via);
        let ask = format!(
            "GET /v1/health HTTP/1.0\r\n{}Connection: keep-alive\r\n\r\n",
            via.auth_header()
        );
        raw.send(ask.as_bytes());
        assert_eq!(raw.response().header("connection"), Some("keep-alive"));
        raw.send(ask.as_bytes());
        assert_eq!(raw.response().status, 200);
    }
}

#[test]
fn routes_paths_and_bodies() {
    if !have(&["curl"]) {
        return;
    }
    let front = start_front(&[]);
    for via in front.both() {
        // GET /v1/health.
        let r = get(&via, "/v1/health");
        assert_eq!(r.status, 200);
        json_content_type(&r);
        assert_eq!(r.json(), json!({"status": "ok"}));

        // Unknown paths: 404 with the failure envelope.
        for path in ["/v1/nowhere", "/v1/bash/exec/", "/v1/bash", "/"] {
            let r = curl(&via, &["-X", "POST", &via.url(path), "-d", "{}"]);
            let (_, data) = failure(&r, 404);
            assert_eq!(data, Value::Null);
            assert_eq!(r.header("allow"), None);
        }

        // Known path, other method: 405 with Allow.
        for (method, path, allow) in [
            ("GET", "/v1/bash/exec", "POST"),
            ("PUT", "/v1/bash/output", "POST"),
            ("POST", "/v1/bash/sessions", "GET"),
            ("GET", "/v1/bash/sessions/x/close", "POST"),
            ("POST", "/v1/health", "GET"),
        ] {
            let r = curl(&via, &["-X", method, &via.url(path)]);
            failure(&r, 405);
            assert_eq!(r.header("allow"), Some(allow), "{method} {path}: {r:?}");
        }

        // An empty body is `{}`: sessions/create makes a session with a new id.
        let r = curl(&via, &["-X", "POST", &via.url("/v1/bash/sessions/create")]);
        let d = ok_data(&r, Some(SESSION_SCHEMA));
        matches(
            &d,
            &json!({"session_id": ANY_ID, "status": "ready", "working_dir": front.dir()
                    .display().to_string(), "created_at": ANY_TIME, "last_used_at": ANY_TIME,
                    "current_command": null, "command_count": 0}),
        );
        // ... and exec without a body is missing its command.
        let r = curl(&via, &["-X", "POST", &via.url("/v1/bash/exec")]);
        unprocessable(&r, json!(["body", "command"]));

        // snapshot_path is refused: execd does not source snapshots.
        let r = post(
            &via,
            "/v1/bash/sessions/create",
            &json!({"session_id": "snap", "snapshot_path": "/tmp/snapshot.sh"}),
        );
        unprocessable(&r, json!(["body", "snapshot_path"]));
        let r = post(&via, "/v1/bash/output", &json!({"session_id": "snap"}));
        failure(&r, 404);
        // null means absent.
        let r = post(
            &via,
            "/v1/bash/sessions/create",
            &json!({"session_id": "snap", "snapshot_path": null}),
        );
        assert_eq!(ok_data(&r, Some(SESSION_SCHEMA))["session_id"], "snap");

        // A percent-encoded session id in the close path.
        let r = post(
            &via,
            "/v1/bash/sessions/create",
            &json!({"session_id": "a b"}),
        );
        assert_eq!(ok_data(&r, Some(SESSION_SCHEMA))["session_id"], "a b");
        let close = via.url("/v1/bash/sessions/a%20b/close");
        let r = curl(&via, &["-X", "POST", &close]);
        matches(&ok_data(&r, None), &json!({}));
        let d = ok_data(&get(&via, "/v1/bash/sessions"), Some(SESSIONS_SCHEMA));
        assert!(
            !d.as_array()
                .expect("list")
                .iter()
                .any(|s| s["session_id"] == "a b"),
            "{d}"
        );
        let r = curl(&via, &["-X", "POST", &close]);
        failure(&r, 404);
        // A bad escape is no route at all.
        let r = curl(
            &via,
            &["-X", "POST", &via.url("/v1/bash/sessions/a%zzb/close")],
        );
        failure(&r, 404);
    }
}

// ---- 10. the Python SDK ----------------------------------------------------------------

#[test]
fn the_python_sdk_end_to_end() {
    let work = TempDir::new();
    let Some(python) = sdk_python() else {
        return;
    };

    let front = start_front(&[]);
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/sdk/drive.py");
    let runs: [(&str, Vec<String>); 2] = [
        (
            "tcp",
            vec![
                "--base-url".into(),
                format!("http://127.0.0.1:{}", front.port),
                "--token".into(),
                TOKEN.into(),
            ],
        ),
        (
            "unix",
            vec!["--uds".into(), front.daemon.socket.display().to_string()],
        ),
    ];
    for (name, args) in runs {
        let out = run_bounded(
            Command::new(&python)
                .arg("-B") // no __pycache__ beside tests/sdk/checks.py
                .arg(&script)
                .args(&args),
            Duration::from_secs(120),
            &work.path().join(format!("drive-{name}.log")),
        );
        assert!(
            out.status.success(),
            "drive.py over {name} failed ({}):\n{}\n{}\ndaemon log:\n{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
            front.daemon.log()
        );
    }
    drop(front);
    readme_python_runs_as_written(&python, work.path());
}

/// The README's ```python block, run verbatim beside a daemon started with the flags of
/// the README's HTTP transcript (`--socket $PWD/http.sock --http-listen 127.0.0.1:8080
/// --http-token-file token --http-run-as "$(id -un)"`, the token in `$PWD/token`),
/// prints what its two execs echo.
fn readme_python_runs_as_written(python: &Path, work: &Path) {
    let readme = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md"))
        .expect("read README.md");
    let block: String = readme
        .split("```python\n")
        .nth(1)
        .and_then(|rest| rest.split("```").next())
        .expect("README has a ```python block")
        .to_string();
    let me = Command::new("id").arg("-un").output().expect("id -un");
    let me = String::from_utf8_lossy(&me.stdout).trim().to_string();
    // The readme area's transcript listens there too; this hold outlives the daemon.
    let _address = ReadmeAddress::hold();
    let dir = TempDir::new();
    let cwd = dir.path().to_path_buf();
    // As the README makes it: only its owner may read it.
    let token = cwd.join("token");
    {
        use std::os::unix::fs::OpenOptionsExt;
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&token)
            .expect("token file");
        std::io::Write::write_all(&mut f, b"0123456789abcdef0123456789abcdef").expect("token");
    }
    let args: Vec<String> = vec![
        "--http-listen".into(),
        ReadmeAddress::ADDR.into(),
        "--http-token-file".into(),
        token.display().to_string(),
        "--http-run-as".into(),
        me,
    ];
    let daemon = match launch_on(dir, "http.sock", &args) {
        Ok(d) => d,
        Err((code, log)) => panic!("execd {args:?} exited with {code:?}:\n{log}"),
    };
    wait_until("the README's HTTP listener accepts", || {
        TcpStream::connect(ReadmeAddress::ADDR).is_ok()
    });
    let out = run_bounded(
        Command::new(python).arg("-c").arg(&block).current_dir(&cwd),
        Duration::from_secs(120),
        &work.join("readme-python.log"),
    );
    assert!(
        out.status.success(),
        "the README's python block failed ({}):\n{block}\n{}\n{}\ndaemon log:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
        daemon.log()
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "over tcp\n\nover the socket\n\n",
        "the README's python block printed something else"
    );
}

/// TCP peers, who need no credentials to connect, take at most half of `--max-clients`:
/// idle TCP connections cannot lock the Unix socket out. A TCP connection that sends no
/// request for `--http-idle` is closed; one with a request in flight is not.
#[test]
fn tcp_connections_have_half_the_slots_and_close_when_idle() {
    if !have(&["curl"]) {
        return;
    }
    // The sleeps below stay well inside the idle time, so a loaded machine does not
    // turn them into idleness.
    let front = start_front(&["--max-clients", "4", "--http-idle", "3s"]);
    // A connection known to hold a slot: it was answered (the listener probe of
    // `start_front` may still hold one for a moment, hence the retry).
    let held = || {
        let via = front.tcp();
        let mut tries = 0;
        loop {
            let mut raw = Raw::open(&via);
            raw.send(&request(&via, "GET", "/v1/health", ""));
            if raw.response().status == 200 {
                return raw;
            }
            tries += 1;
            assert!(tries < 100, "no TCP slot");
            std::thread::sleep(Duration::from_millis(10));
        }
    };
    let mut idle = vec![held(), held()];
    let mut third = Raw::open(&front.tcp());
    let (_, data) = failure(&third.response(), 429);
    assert_eq!(data, json!({"limit": "tcp-clients", "value": 2}));
    third.closed();
    // The Unix socket still has its half.
    ok_data(
        &get(&front.unix(), "/v1/bash/sessions"),
        Some(SESSIONS_SCHEMA),
    );

    // The idle connections are closed; a long poll outlives the idle time.
    for raw in &mut idle {
        raw.closed();
    }
    let via = front.tcp();
    let session = ok_data(
        &post(
            &via,
            "/v1/bash/exec",
            &json!({"command": "sleep 30", "async_mode": true}),
        ),
        Some(EXEC_SCHEMA),
    )["session_id"]
        .clone();
    let mut polling = Raw::open(&via);
    let body = json!({"session_id": session, "wait": true, "wait_timeout": 5}).to_string();
    polling.send(&request(&via, "POST", "/v1/bash/output", &body));
    let d = ok_data(&polling.response(), Some(OUTPUT_SCHEMA));
    assert_eq!(d["command"]["status"], "running", "{d}");
    // Its idle time starts when that answer is written: a request soon after is served.
    std::thread::sleep(Duration::from_millis(500));
    polling.send(&request(&via, "GET", "/v1/health", ""));
    assert_eq!(polling.response().status, 200);
    // Requests answered without a command (health) count as requests: polled more often
    // than the idle time, the connection stays open well past it.
    for _ in 0..8 {
        std::thread::sleep(Duration::from_millis(500));
        polling.send(&request(&via, "GET", "/v1/health", ""));
        assert_eq!(polling.response().status, 200);
    }
    // Idle again afterwards: closed.
    polling.closed();
}
