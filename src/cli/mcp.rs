//! `execctl mcp`: an MCP server on stdio whose every tool call runs through the daemon
//! (PROTOCOL 17), so an agent that takes its tools from MCP servers gets execd's policy,
//! approvals, audit, limits, PTYs and shell sessions from one line of its configuration.
//!
//! MCP here is newline-delimited JSON-RPC on stdin and stdout, written with serde_json as
//! the rest of execctl is: the official Rust SDK (`rmcp`) needs an async runtime (tokio)
//! this project does not otherwise carry, for a surface of five methods and seven tools.
//!
//! Design: three reader threads (stdin, the daemon's connection, signals) feed one
//! channel; the main thread owns all state, writes stdout and the daemon's socket, and
//! times deadlines and progress ticks with the channel's timeout. One connection to the
//! daemon carries everything: it asks in `initialize` to be told when a request waits for
//! an approver, and every `run` is a `bash/exec` in this process's own bash session,
//! created subscribed (its output, input-wait and exit come as events) and, unless
//! `background`, tied to the connection (`kill_on_disconnect`), so commands die with
//! this process however it ends.
//!
//! Invariants:
//! - Every tool call is answered exactly once, unless the client cancelled it
//!   (`notifications/cancelled`), and never later than its `yield_ms` (or `wait_ms`)
//!   plus the daemon's own answer time, so MCP clients' request timeouts are not hit
//!   while a person decides on an approval: the call answers `waiting_for_approval`, and
//!   `read` on the approval id picks the outcome up later.
//! - What a command wrote reaches the client once, in order (stdout and stderr as the
//!   daemon read them), bounded per command by head and tail (`text::Unread`).
//! - `--cwd`, `--sandbox` and `--max-output-bytes` are ceilings: a call's directory must
//!   lie inside `--cwd`; every call is sent with `sandbox_ceiling` S, which the daemon
//!   meets with the sandbox in force (so a call never runs wider than S, and never wider
//!   than the policy lets it either), and a `run` asking for a sandbox wider than S is a
//!   tool error naming S; no answer is longer than `--max-output-bytes` of output.
//! - Every call says `via: "mcp"`, so the audit says which door a command came through.

mod text;
mod tools;

use std::collections::{BTreeMap, HashMap};
use std::io::{self, BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{sync_channel, Receiver, RecvTimeoutError, SyncSender};
use std::time::{Duration, Instant};

use serde_json::{json, Map, Value};

use super::args::Args;
use super::connect::{Ctx, Host};
use super::errors::{Fail, Res};
use super::foreground::approval_notices;
use text::Unread;
use tools::{Bad, Call as ToolCall};

/// The MCP revisions spoken, newest first: an `initialize` offering one of them is
/// answered with it, anything else with the newest.
pub const VERSIONS: &[&str] = &["2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05"];
/// The first revision with output schemas and `structuredContent`.
const STRUCTURED_SINCE: &str = "2025-06-18";
/// How often a call waiting for an approver reports progress.
const PROGRESS_EVERY: Duration = Duration::from_secs(5);
/// The longest line read from the client; a longer one is refused (`-32600`).
const MAX_LINE: usize = 16 << 20;
/// Largest piece of input sent to a command in one `bash/write`.
const INPUT_CHUNK: usize = 32 << 10;
/// How long leaving waits for the daemon to close this client's sessions.
const CLEANUP_WAIT: Duration = Duration::from_secs(2);
/// Most events kept for commands whose start has not been answered yet.
const EARLY_EVENTS: usize = 1024;

/// What the reader threads report.
enum Input {
    /// A line from the client.
    Line(Vec<u8>),
    /// The client closed stdin: it is gone, or shutting us down.
    StdinEnd,
    /// A message from the daemon.
    Daemon(Value),
    /// The daemon's connection ended.
    DaemonEnd(String),
    /// SIGTERM, SIGINT or SIGHUP.
    Signal,
}

/// The ceilings a call cannot lift.
#[derive(Debug, Clone)]
struct Ceilings {
    /// `--cwd`: calls run here or in a directory inside it.
    cwd: Option<PathBuf>,
    /// Where a call without `cwd` runs: `--cwd`, else execctl's own directory (none for
    /// a daemon on another host, which uses its own default).
    default_cwd: Option<PathBuf>,
    /// `--max-output-bytes`.
    max_output: usize,
    /// `--sandbox`: as sent (`sandbox_ceiling`), and as a template to hold a call's
    /// `sandbox` against.
    sandbox: Option<(Value, crate::policy::sandbox::Template)>,
    /// The daemon is on this host: directories can be resolved here.
    local: bool,
}

/// `execctl mcp`.
pub fn mcp(ctx: &Ctx, p: &Args) -> Res<u8> {
    if let Some(a) = p.operands.first() {
        return Err(Fail::usage(format!("mcp takes no operand, got {a:?}")));
    }
    let max_output = match p.value("--max-output-bytes") {
        Some(v) => crate::config::parse_size(v)
            .ok()
            .filter(|n| *n >= 64)
            .ok_or_else(|| {
                Fail::usage(format!(
                    "--max-output-bytes: {v:?} is not a size of 64 or more (30000, 64K)"
                ))
            })?,
        None => tools::DEFAULT_MAX_OUTPUT,
    };
    let local = matches!(ctx.host, Host::Local(_));
    let cwd = match p.value("--cwd") {
        Some(d) if local => Some(
            std::fs::canonicalize(d)
                .ok()
                .filter(|d| d.is_dir())
                .ok_or_else(|| Fail::usage(format!("--cwd {d}: not a directory here")))?,
        ),
        Some(d) if d.starts_with('/') => Some(PathBuf::from(d)),
        Some(d) => {
            return Err(Fail::usage(format!(
                "--cwd {d}: a directory on another host is named by its absolute path"
            )))
        }
        None => None,
    };
    let default_cwd = cwd
        .clone()
        .or_else(|| local.then(|| std::env::current_dir().ok()).flatten());
    let sandbox = match p.value("--sandbox") {
        None => None,
        Some(v) => {
            let value = super::run::sandbox_value(v)?;
            let shape = crate::policy::sandbox::parse(&value)
                .map_err(|e| Fail::usage(format!("--sandbox {v}: {e}")))?;
            Some((value, shape.over(&crate::policy::sandbox::Template::off())))
        }
    };
    let ceilings = Ceilings {
        cwd,
        default_cwd,
        max_output,
        local,
        sandbox,
    };
    // An MCP client shows a server's stderr at best in a log: one line, exit 1.
    let link = ctx.open().map_err(|f| f.with_code(1))?;
    let (tx, rx) = sync_channel::<Input>(1024);
    let reader = link
        .stream
        .try_clone()
        .map_err(|e| Fail::new(e.to_string()))?;
    spawn_daemon_reader(reader, tx.clone());
    spawn_stdin_reader(tx.clone());
    spawn_signal_watch(tx);
    let mut server = Server::new(link.stream, ceilings);
    server.send_daemon("initialize", approval_notices(), Pending::Ignore);
    let code = server.serve(&rx);
    drop(link.transport);
    Ok(code)
}

fn spawn_daemon_reader(stream: UnixStream, tx: SyncSender<Input>) {
    std::thread::spawn(move || {
        let mut r = BufReader::with_capacity(256 << 10, stream);
        let mut line = Vec::new();
        loop {
            line.clear();
            match r.read_until(b'\n', &mut line) {
                Ok(0) => {
                    let _ = tx.send(Input::DaemonEnd("execd closed the connection".into()));
                    return;
                }
                Ok(_) => match serde_json::from_slice(&line) {
                    Ok(v) => {
                        if tx.send(Input::Daemon(v)).is_err() {
                            return;
                        }
                    }
                    Err(e) => {
                        let _ = tx.send(Input::DaemonEnd(format!("bad JSON from execd: {e}")));
                        return;
                    }
                },
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    let _ = tx.send(Input::DaemonEnd(e.to_string()));
                    return;
                }
            }
        }
    });
}

fn spawn_stdin_reader(tx: SyncSender<Input>) {
    std::thread::spawn(move || {
        let stdin = io::stdin();
        let mut r = stdin.lock();
        let mut line = Vec::new();
        loop {
            line.clear();
            // Bounded: a line past MAX_LINE is passed on cut, and refused.
            match io::Read::take(&mut r, MAX_LINE as u64 + 1).read_until(b'\n', &mut line) {
                Ok(0) => break,
                Ok(_) => {
                    if line.len() > MAX_LINE {
                        // Skip the rest of the line.
                        let mut rest = Vec::new();
                        let _ = r.read_until(b'\n', &mut rest);
                    }
                    if tx.send(Input::Line(std::mem::take(&mut line))).is_err() {
                        return;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => break,
            }
        }
        let _ = tx.send(Input::StdinEnd);
    });
}

fn spawn_signal_watch(tx: SyncSender<Input>) {
    use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
    if let Ok(mut signals) = signal_hook::iterator::Signals::new([SIGINT, SIGHUP, SIGTERM]) {
        std::thread::spawn(move || {
            if signals.forever().next().is_some() {
                let _ = tx.send(Input::Signal);
            }
        });
    }
}

/// What a request to the daemon is for.
enum Pending {
    /// Nothing waits on its answer.
    Ignore,
    /// Starts what a `run` or `shell` call asked (a `Launch` under the same number).
    Launch,
    /// A piece of input for a command; the rest follows when it is taken.
    Feed(Feed),
    /// A daemon call whose answer is a tool call's result.
    Answer { call: Value, render: Render },
    /// Closing a session as this client leaves.
    Cleanup,
}

/// How a daemon answer becomes a tool result.
#[derive(Debug, Clone)]
enum Render {
    Kill { id: String },
    ShellKill { session: String },
    ShellWrite { session: String },
    ShellView { session: String, max: usize },
}

/// Input on its way to a command, one chunk at a time (each waits for room).
struct Feed {
    cmd: String,
    rest: Vec<u8>,
    eof: bool,
    written: u64,
    /// The `write` call to answer once all is written.
    call: Option<Value>,
}

/// A `run` or `shell` on its way through the gate.
struct Launch {
    what: Launched,
    /// The approval it waits for, once the daemon said so: id and rules.
    approval: Option<(String, Vec<String>)>,
    asked_at: Instant,
    /// How it was decided, once it was.
    done: Option<Decided>,
}

#[derive(Debug, Clone)]
enum Launched {
    Run {
        command: String,
        background: bool,
        tty: bool,
        stdin: Option<String>,
    },
    Shell {
        session: String,
    },
}

#[derive(Debug, Clone)]
enum Decided {
    /// It runs as this command.
    Started(String),
    /// A shell session's answer.
    Shell(Value),
    /// It will not run: the result to give (an error result).
    Refused(Value),
}

/// A command this client started.
struct Cmd {
    command: String,
    background: bool,
    tty: bool,
    started: Instant,
    unread: Unread,
    exit: Option<Exit>,
    waiting_input: bool,
    approval: Option<String>,
}

struct Exit {
    status: &'static str,
    exit_code: Value,
    signal: Value,
    duration_ms: u64,
}

/// What a tool call waits for.
#[derive(Debug, Clone)]
enum Wait {
    /// A launch to be decided: `run` (then its command), `shell`, or `read` of a
    /// pending approval (`owner` false: cancelling it only stops the wait).
    Launch { rpc: u64, run: bool, owner: bool },
    /// A command's output: new output (or the exit, or input wanted) unless
    /// `until_exit`, then only the exit (or input wanted).
    Cmd { id: String, until_exit: bool },
    /// A daemon answer (`Pending::Answer`).
    Daemon,
}

/// A tool call not answered yet.
struct Open {
    wait: Wait,
    deadline: Option<Instant>,
    /// The deadline passed while nothing could be answered yet (a launch the daemon has
    /// not answered nor said is at an approver): answer as soon as something can be.
    overdue: bool,
    max_output: usize,
    progress: Option<Progress>,
}

struct Progress {
    token: Value,
    /// When the next report is due (once an approval is pending).
    next: Option<Instant>,
    count: u64,
}

/// The server's whole state (main thread only).
struct Server {
    daemon: UnixStream,
    daemon_gone: Option<String>,
    next_rpc: u64,
    pending: HashMap<u64, Pending>,
    launches: HashMap<u64, Launch>,
    by_approval: HashMap<String, u64>,
    cmds: BTreeMap<String, Cmd>,
    /// Events for commands whose start was not answered yet.
    early: Vec<Value>,
    /// Open tool calls, by their JSON-RPC id as text.
    calls: HashMap<String, (Value, Open)>,
    bash_session: String,
    /// This client's own shell session, once it has one.
    shell_session: Option<String>,
    named_shells: Vec<String>,
    shell_made: bool,
    /// Shell lines waiting for the line before them in their session to be answered.
    held: HashMap<String, std::collections::VecDeque<(u64, Value)>>,
    version: Option<String>,
    log_level: usize,
    ceilings: Ceilings,
    stdin_open: bool,
    stdout_gone: bool,
}

/// MCP's log levels, lowest first.
const LEVELS: &[&str] = &[
    "debug",
    "info",
    "notice",
    "warning",
    "error",
    "critical",
    "alert",
    "emergency",
];

fn key(id: &Value) -> String {
    id.to_string()
}

impl Server {
    fn new(daemon: UnixStream, ceilings: Ceilings) -> Server {
        let stamp = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis())
            .unwrap_or(0);
        Server {
            daemon,
            daemon_gone: None,
            next_rpc: 0,
            pending: HashMap::new(),
            launches: HashMap::new(),
            by_approval: HashMap::new(),
            cmds: BTreeMap::new(),
            early: Vec::new(),
            calls: HashMap::new(),
            bash_session: format!("mcp-{}-{stamp}", std::process::id()),
            shell_session: None,
            named_shells: Vec::new(),
            shell_made: false,
            held: HashMap::new(),
            version: None,
            log_level: 1,
            ceilings,
            stdin_open: true,
            stdout_gone: false,
        }
    }

    /// Serves until the client has gone and nothing it asked waits; returns the exit code.
    fn serve(&mut self, rx: &Receiver<Input>) -> u8 {
        loop {
            if (!self.stdin_open && self.calls.is_empty()) || self.stdout_gone {
                break;
            }
            let now = Instant::now();
            let input = match self.next_due() {
                Some(at) => rx.recv_timeout(at.saturating_duration_since(now)),
                None => rx.recv().map_err(|_| RecvTimeoutError::Disconnected),
            };
            match input {
                Ok(Input::Line(line)) => self.on_line(&line),
                Ok(Input::StdinEnd) => self.stdin_open = false,
                Ok(Input::Daemon(msg)) => self.on_daemon(msg),
                Ok(Input::DaemonEnd(why)) => self.lost_daemon(why),
                Ok(Input::Signal) => break,
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => break,
            }
            self.settle(Instant::now());
        }
        self.leave(rx);
        0
    }

    /// The earliest deadline or progress report due.
    fn next_due(&self) -> Option<Instant> {
        self.calls
            .values()
            .flat_map(|(_, o)| [o.deadline, o.progress.as_ref().and_then(|p| p.next)])
            .flatten()
            .min()
    }

    // ---- writing ---------------------------------------------------------------------

    fn write_out(&mut self, msg: &Value) {
        if self.stdout_gone {
            return;
        }
        let mut line = serde_json::to_vec(msg).unwrap_or_default();
        line.push(b'\n');
        let mut out = io::stdout().lock();
        if out.write_all(&line).and_then(|_| out.flush()).is_err() {
            // The client stopped reading: it is gone.
            self.stdout_gone = true;
        }
    }

    fn reply(&mut self, id: &Value, result: Value) {
        self.write_out(&json!({"jsonrpc": "2.0", "id": id, "result": result}));
    }

    fn error(&mut self, id: &Value, code: i64, message: &str) {
        self.write_out(
            &json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}}),
        );
    }

    fn notify(&mut self, method: &str, params: Value) {
        self.write_out(&json!({"jsonrpc": "2.0", "method": method, "params": params}));
    }

    /// A log message to the client at `level`, if it asked for that level.
    fn log(&mut self, level: &str, text: &str) {
        let rank = LEVELS.iter().position(|l| *l == level).unwrap_or(3);
        if self.version.is_some() && rank >= self.log_level {
            self.notify(
                "notifications/message",
                json!({"level": level, "logger": "execctl", "data": text}),
            );
        }
    }

    /// Sends a request to the daemon; returns its number.
    fn send_daemon(&mut self, method: &str, params: Value, why: Pending) -> u64 {
        self.next_rpc += 1;
        let id = self.next_rpc;
        self.pending.insert(id, why);
        let msg = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        self.send_raw(&msg);
        id
    }

    fn send_raw(&mut self, msg: &Value) {
        if self.daemon_gone.is_some() {
            return;
        }
        let mut line = serde_json::to_vec(msg).unwrap_or_default();
        line.push(b'\n');
        if let Err(e) = self.daemon.write_all(&line) {
            self.lost_daemon(format!("writing to execd: {e}"));
        }
    }

    /// Whether tool results carry `structuredContent` (and tools an output schema).
    fn structured(&self) -> bool {
        self.version
            .as_deref()
            .is_some_and(|v| v >= STRUCTURED_SINCE)
    }

    /// A tool result: `structured` as `structuredContent` and as its JSON text.
    fn tool_result(&self, structured: Value, is_error: bool) -> Value {
        let text = serde_json::to_string(&structured).unwrap_or_default();
        let mut r = json!({"content": [{"type": "text", "text": text}], "isError": is_error});
        if self.structured() {
            r["structuredContent"] = structured;
        }
        r
    }

    /// A tool error said in words (a bad argument, a daemon error).
    fn tool_error(text: &str) -> Value {
        json!({"content": [{"type": "text", "text": text}], "isError": true})
    }

    /// Answers open call `id` (if still open) with `result`.
    fn answer(&mut self, id: &str, result: Value) {
        if let Some((rid, _)) = self.calls.remove(id) {
            self.reply(&rid, result);
        }
    }

    // ---- the client --------------------------------------------------------------------

    fn on_line(&mut self, line: &[u8]) {
        if line.len() > MAX_LINE {
            self.error(&Value::Null, -32600, "message too long");
            return;
        }
        let text = line.strip_suffix(b"\n").unwrap_or(line);
        let text = text.strip_suffix(b"\r").unwrap_or(text);
        if text.iter().all(u8::is_ascii_whitespace) {
            return;
        }
        let msg: Value = match serde_json::from_slice(text) {
            Ok(v) => v,
            Err(e) => {
                self.error(&Value::Null, -32700, &format!("parse error: {e}"));
                return;
            }
        };
        let Value::Object(m) = msg else {
            let why = if msg.is_array() {
                "batches are not supported: send one message a line"
            } else {
                "a message is a JSON object"
            };
            self.error(&Value::Null, -32600, why);
            return;
        };
        let id = m.get("id").cloned();
        let valid_id = matches!(id, None | Some(Value::String(_) | Value::Number(_)));
        if m.get("jsonrpc") != Some(&json!("2.0")) || !valid_id {
            self.error(
                &id.filter(|_| valid_id).unwrap_or(Value::Null),
                -32600,
                "not a JSON-RPC 2.0 message",
            );
            return;
        }
        let Some(method) = m.get("method").and_then(Value::as_str) else {
            // A response to a request of ours (we send none) or junk: nothing to say.
            return;
        };
        let params = m.get("params").cloned().unwrap_or(Value::Null);
        match id {
            Some(id) => self.on_request(id, method, params),
            None => self.on_notification(method, &params),
        }
    }

    fn on_notification(&mut self, method: &str, params: &Value) {
        if method == "notifications/cancelled" {
            if let Some(id) = params.get("requestId") {
                self.cancel(&key(id));
            }
        }
        // notifications/initialized and the rest need nothing.
    }

    fn on_request(&mut self, id: Value, method: &str, params: Value) {
        const KNOWN: &[&str] = &[
            "initialize",
            "ping",
            "tools/list",
            "tools/call",
            "logging/setLevel",
        ];
        if !KNOWN.contains(&method) {
            // server/discover among them: the SDKs' probe falls back to initialize.
            self.error(&id, -32601, &format!("method not found: {method}"));
            return;
        }
        if self.version.is_none() && !matches!(method, "initialize" | "ping") {
            self.error(&id, -32600, "not initialized: send initialize first");
            return;
        }
        match method {
            "initialize" => {
                let offered = params.get("protocolVersion").and_then(Value::as_str);
                let version = VERSIONS
                    .iter()
                    .find(|v| Some(**v) == offered)
                    .unwrap_or(&VERSIONS[0]);
                self.version = Some(version.to_string());
                let result = json!({
                    "protocolVersion": version,
                    "capabilities": {"tools": {"listChanged": false}, "logging": {}},
                    "serverInfo": {"name": "execd", "version": env!("CARGO_PKG_VERSION")},
                    "instructions": INSTRUCTIONS,
                });
                self.reply(&id, result);
            }
            "ping" => self.reply(&id, json!({})),
            "tools/list" => {
                let tools = tools::list(self.structured());
                self.reply(&id, json!({ "tools": tools }));
            }
            "logging/setLevel" => {
                match params
                    .get("level")
                    .and_then(Value::as_str)
                    .and_then(|l| LEVELS.iter().position(|x| *x == l))
                {
                    Some(rank) => {
                        self.log_level = rank;
                        self.reply(&id, json!({}));
                    }
                    None => self.error(&id, -32602, "level must be one of debug ... emergency"),
                }
            }
            _ => self.tool_call(id, &params),
        }
    }

    fn tool_call(&mut self, id: Value, params: &Value) {
        let name = params.get("name").and_then(Value::as_str).unwrap_or("");
        let call = match tools::parse(name, params.get("arguments")) {
            Ok(c) => c,
            Err(Bad::Tool(why)) => return self.error(&id, -32602, &why),
            Err(Bad::Argument(why)) => return self.reply(&id, Self::tool_error(&why)),
        };
        if self.calls.contains_key(&key(&id)) {
            return self.error(&id, -32600, "a request with this id is still open");
        }
        if let Some(why) = self.daemon_gone.clone() {
            let text = format!("execd is gone ({why}); restart the MCP server once it runs");
            return self.reply(&id, Self::tool_error(&text));
        }
        let progress = params
            .get("_meta")
            .and_then(|m| m.get("progressToken"))
            .filter(|t| t.is_string() || t.is_number())
            .map(|t| Progress {
                token: t.clone(),
                next: None,
                count: 0,
            });
        let now = Instant::now();
        let max = |m: Option<usize>| {
            m.unwrap_or(self.ceilings.max_output)
                .min(self.ceilings.max_output)
        };
        match call {
            ToolCall::Run(r) => {
                let max_output = max(r.max_output);
                let deadline = now + Duration::from_millis(r.yield_ms);
                match self.run_params(&r) {
                    Err(why) => self.reply(&id, Self::tool_error(&why)),
                    Ok(p) => {
                        let rpc = self.send_daemon("bash/exec", p, Pending::Launch);
                        self.launches.insert(
                            rpc,
                            Launch {
                                what: Launched::Run {
                                    command: r.command.clone(),
                                    background: r.background,
                                    tty: r.tty,
                                    stdin: r.stdin.clone(),
                                },
                                approval: None,
                                asked_at: now,
                                done: None,
                            },
                        );
                        self.open(
                            id,
                            Wait::Launch {
                                rpc,
                                run: true,
                                owner: true,
                            },
                            Some(deadline),
                            max_output,
                            progress,
                        );
                    }
                }
            }
            ToolCall::Read {
                id: what,
                wait_ms,
                until_exit,
                max_output,
            } => {
                let deadline = Some(now + Duration::from_millis(wait_ms));
                let max_output = max(max_output);
                if self.cmds.contains_key(&what) {
                    self.open(
                        id,
                        Wait::Cmd {
                            id: what,
                            until_exit,
                        },
                        deadline,
                        max_output,
                        progress,
                    );
                } else if let Some(rpc) = self.by_approval.get(&what).copied() {
                    self.open(
                        id,
                        Wait::Launch {
                            rpc,
                            run: false,
                            owner: false,
                        },
                        deadline,
                        max_output,
                        progress,
                    );
                } else {
                    let text = format!(
                        "no command {what:?} of this client; list shows them (a shell session is read with shell_view)"
                    );
                    self.reply(&id, Self::tool_error(&text));
                }
            }
            ToolCall::Write {
                id: what,
                input,
                eof,
            } => self.write(id, what, input, eof),
            ToolCall::Kill { id: what, signal } => self.kill(id, what, signal),
            ToolCall::List => {
                let list = self.list();
                let r = self.tool_result(list, false);
                self.reply(&id, r);
            }
            ToolCall::Shell {
                command,
                session,
                yield_ms,
                max_output,
            } => {
                let max_output = max(max_output);
                let deadline = now + Duration::from_millis(yield_ms);
                let (session, params) = self.shell_params(command, session, yield_ms);
                // One line at a time per session: a line sent while another is still
                // being answered would be refused as "a command is running".
                self.next_rpc += 1;
                let rpc = self.next_rpc;
                self.pending.insert(rpc, Pending::Launch);
                let busy = self.launches.values().any(|l| {
                    l.done.is_none()
                        && matches!(&l.what, Launched::Shell { session: s } if *s == session)
                });
                if busy {
                    self.held
                        .entry(session.clone())
                        .or_default()
                        .push_back((rpc, params));
                } else {
                    self.send_raw(&json!({"jsonrpc": "2.0", "id": rpc, "method": "shell/exec", "params": params}));
                }
                self.launches.insert(
                    rpc,
                    Launch {
                        what: Launched::Shell { session },
                        approval: None,
                        asked_at: now,
                        done: None,
                    },
                );
                self.open(
                    id,
                    Wait::Launch {
                        rpc,
                        run: false,
                        owner: true,
                    },
                    Some(deadline),
                    max_output,
                    progress,
                );
            }
            ToolCall::ShellView { session } => {
                let Some(session) = session.or_else(|| self.shell_session.clone()) else {
                    let text = "no shell session yet: the shell tool makes this client's own";
                    return self.reply(&id, Self::tool_error(text));
                };
                let max = self.ceilings.max_output;
                self.daemon_answer(
                    id,
                    "shell/view",
                    json!({"id": session}),
                    Render::ShellView { session, max },
                );
            }
        }
    }

    fn open(
        &mut self,
        id: Value,
        wait: Wait,
        deadline: Option<Instant>,
        max_output: usize,
        progress: Option<Progress>,
    ) {
        let k = key(&id);
        self.calls.insert(
            k,
            (
                id,
                Open {
                    wait,
                    deadline,
                    overdue: false,
                    max_output,
                    progress,
                },
            ),
        );
    }

    /// Asks the daemon `method`; its answer, rendered, answers tool call `id`.
    fn daemon_answer(&mut self, id: Value, method: &str, params: Value, render: Render) {
        self.open(id.clone(), Wait::Daemon, None, 0, None);
        self.send_daemon(method, params, Pending::Answer { call: id, render });
    }

    /// The `bash/exec` of a `run`, or why the call may not run.
    fn run_params(&self, r: &tools::Run) -> Result<Value, String> {
        let dir = self.directory(r.cwd.as_deref())?;
        let mut p = json!({
            "command": r.command,
            "session_id": self.bash_session,
            "async_mode": true,
            "subscribe": {},
            "max_output_length": 1,
            "via": "mcp",
        });
        if let Some((bound, template)) = &self.ceilings.sandbox {
            p["sandbox_ceiling"] = bound.clone();
            if let Some(asked) = &r.sandbox {
                if !within(asked, template) {
                    return Err(format!(
                        "sandbox {asked} is wider than this server's --sandbox {bound}"
                    ));
                }
            }
        }
        if let Some(asked) = &r.sandbox {
            p["sandbox"] = asked.clone();
        }
        if !r.background {
            p["kill_on_disconnect"] = json!(true);
        }
        if let Some(d) = dir {
            p["exec_dir"] = json!(d.display().to_string());
        }
        if !r.env.is_empty() {
            p["env"] = json!(r.env);
        }
        if r.tty {
            p["tty"] = json!(true);
        }
        if let Some(t) = r.timeout_ms {
            p["hard_timeout"] = json!(t as f64 / 1000.0);
        }
        Ok(p)
    }

    /// Where a call runs: `cwd` (absolute, or relative to the default), which must lie
    /// inside the `--cwd` ceiling; else the default.
    fn directory(&self, cwd: Option<&str>) -> Result<Option<PathBuf>, String> {
        let Some(cwd) = cwd.filter(|c| !c.is_empty()) else {
            return Ok(self.ceilings.default_cwd.clone());
        };
        let asked = match (&self.ceilings.default_cwd, Path::new(cwd).is_absolute()) {
            (_, true) => PathBuf::from(cwd),
            (Some(base), false) => base.join(cwd),
            (None, false) => return Err(format!("cwd {cwd:?}: give an absolute path")),
        };
        let Some(ceiling) = &self.ceilings.cwd else {
            return Ok(Some(asked));
        };
        // Symlinks and `..` resolved, so neither leads outside. On another host only
        // `..` can be seen from here, and is refused.
        let real = if self.ceilings.local {
            std::fs::canonicalize(&asked)
                .map_err(|e| format!("cwd {cwd:?}: {}", crate::wire::rpc::os_error_text(&e)))?
        } else if asked
            .components()
            .any(|c| c == std::path::Component::ParentDir)
        {
            return Err(format!(
                "cwd {cwd:?}: name it without \"..\" (the daemon is on another host)"
            ));
        } else {
            asked
        };
        if !real.starts_with(ceiling) {
            return Err(format!(
                "cwd {cwd:?} is outside {}, the directory this server may run commands in (--cwd)",
                ceiling.display()
            ));
        }
        Ok(Some(real))
    }

    /// The `shell/exec` of a `shell` call, and the session it goes to.
    fn shell_params(
        &mut self,
        command: String,
        session: Option<String>,
        yield_ms: u64,
    ) -> (String, Value) {
        let mut p = json!({
            "command": command,
            "timeout": yield_ms as f64 / 1000.0,
            "truncate": false,
            "via": "mcp",
        });
        if let Some((bound, _)) = &self.ceilings.sandbox {
            p["sandbox_ceiling"] = bound.clone();
        }
        let session = match session {
            Some(s) => {
                if !self.named_shells.contains(&s) {
                    self.named_shells.push(s.clone());
                }
                s
            }
            None => {
                let own = self
                    .shell_session
                    .get_or_insert_with(|| format!("{}-shell", self.bash_session))
                    .clone();
                // The first line makes the session, in the directory calls run in.
                if !self.shell_made {
                    self.shell_made = true;
                    if let Some(d) = &self.ceilings.default_cwd {
                        p["exec_dir"] = json!(d.display().to_string());
                    }
                }
                own
            }
        };
        p["id"] = json!(session);
        (session, p)
    }

    fn write(&mut self, id: Value, what: String, input: String, eof: bool) {
        if let Some(cmd) = self.cmds.get(&what) {
            if cmd.exit.is_some() {
                let text = format!("{what} has ended; its input is closed");
                return self.reply(&id, Self::tool_error(&text));
            }
            self.open(id.clone(), Wait::Daemon, None, 0, None);
            self.feed(Feed {
                cmd: what,
                rest: input.into_bytes(),
                eof,
                written: 0,
                call: Some(id),
            });
        } else if self.is_shell(&what) {
            let mut params = json!({"id": what, "input": input, "press_enter": false});
            if let Some((bound, _)) = &self.ceilings.sandbox {
                params["sandbox_ceiling"] = bound.clone();
            }
            self.daemon_answer(
                id,
                "shell/write",
                params,
                Render::ShellWrite { session: what },
            );
        } else {
            let text = format!("no command {what:?} of this client; list shows them");
            self.reply(&id, Self::tool_error(&text));
        }
    }

    /// Sends the next piece of `f`'s input (waiting for room in the command's stdin).
    fn feed(&mut self, mut f: Feed) {
        let n = f.rest.len().min(INPUT_CHUNK);
        let chunk: Vec<u8> = f.rest.drain(..n).collect();
        let last = f.rest.is_empty();
        let mut b64 = Vec::new();
        crate::wire::encode::base64_encode(&mut b64, &chunk);
        let params = json!({
            "session_id": self.bash_session,
            "command_id": f.cmd,
            "input": String::from_utf8(b64).unwrap_or_default(),
            "encoding": "base64",
            "eof": last && f.eof,
            "wait": true,
        });
        let mut params = params;
        if let Some((bound, _)) = &self.ceilings.sandbox {
            params["sandbox_ceiling"] = bound.clone();
        }
        self.send_daemon("bash/write", params, Pending::Feed(f));
    }

    fn is_shell(&self, name: &str) -> bool {
        self.shell_session.as_deref() == Some(name) || self.named_shells.iter().any(|s| s == name)
    }

    fn kill(&mut self, id: Value, what: String, signal: String) {
        // A pending approval is withdrawn; one decided already means its command.
        let what = match self
            .by_approval
            .get(&what)
            .and_then(|r| self.launches.get(r))
        {
            Some(Launch {
                done: Some(Decided::Started(cmd)),
                ..
            }) => cmd.clone(),
            Some(Launch { done: None, .. }) => {
                let rpc = self.by_approval[&what];
                self.send_raw(&json!({"jsonrpc": "2.0", "method": "$/cancel_request",
                                      "params": {"requestId": rpc}}));
                let r = self.tool_result(json!({"id": what, "status": "withdrawn"}), false);
                return self.reply(&id, r);
            }
            _ => what,
        };
        if self.cmds.contains_key(&what) {
            let params =
                json!({"session_id": self.bash_session, "command_id": what, "signal": signal});
            self.daemon_answer(id, "bash/kill", params, Render::Kill { id: what });
        } else if self.is_shell(&what) {
            self.daemon_answer(
                id,
                "shell/kill",
                json!({"id": what}),
                Render::ShellKill { session: what },
            );
        } else {
            let text = format!("no command {what:?} of this client; list shows them");
            self.reply(&id, Self::tool_error(&text));
        }
    }

    fn list(&self) -> Value {
        let mut commands: Vec<Value> = self
            .cmds
            .iter()
            .map(|(id, c)| {
                let mut v = json!({
                    "id": id, "command": c.command, "status": status_of(c),
                    "background": c.background, "tty": c.tty,
                    "unread_output": !c.unread.is_empty(),
                });
                if let Some(e) = &c.exit {
                    v["exit_code"] = e.exit_code.clone();
                    v["signal"] = e.signal.clone();
                }
                if let Some(a) = &c.approval {
                    v["approval"] = json!(a);
                }
                v
            })
            .collect();
        let mut waiting: Vec<(&String, &u64)> = self.by_approval.iter().collect();
        waiting.sort();
        for (appr, rpc) in waiting {
            if let Some(Launch {
                what:
                    Launched::Run {
                        command,
                        background,
                        tty,
                        ..
                    },
                done: None,
                ..
            }) = self.launches.get(rpc)
            {
                commands.push(json!({"id": appr, "command": command,
                    "status": "waiting_for_approval", "background": background, "tty": tty,
                    "approval": appr}));
            }
        }
        let mut shells: Vec<String> = self.shell_session.iter().cloned().collect();
        shells.extend(self.named_shells.iter().cloned());
        json!({"commands": commands, "shell_sessions": shells})
    }

    /// `notifications/cancelled`: the call is not answered; a launch it waits on that an
    /// approver has not decided is withdrawn (a started command keeps running).
    fn cancel(&mut self, id: &str) {
        let Some((_, open)) = self.calls.remove(id) else {
            return;
        };
        if let Wait::Launch {
            rpc, owner: true, ..
        } = open.wait
        {
            let held = self.held.values_mut().find_map(|q| {
                let i = q.iter().position(|(r, _)| *r == rpc)?;
                q.remove(i)
            });
            if held.is_some() {
                // Never sent: it is forgotten.
                self.launches.remove(&rpc);
                self.pending.remove(&rpc);
            } else if self.launches.get(&rpc).is_some_and(|l| l.done.is_none()) {
                self.send_raw(&json!({"jsonrpc": "2.0", "method": "$/cancel_request",
                                      "params": {"requestId": rpc}}));
            }
        }
    }

    // ---- the daemon --------------------------------------------------------------------

    fn on_daemon(&mut self, msg: Value) {
        if msg.get("method").is_some() {
            if msg["method"] == "event" {
                self.on_event(&msg["params"]);
            } else if msg["method"] == "_execd/approval_pending" {
                self.on_pending(&msg["params"]);
            }
            return;
        }
        let Some(rpc) = msg["id"].as_u64() else {
            return;
        };
        let Some(why) = self.pending.remove(&rpc) else {
            return;
        };
        let result = match msg.get("error") {
            Some(e) => Err(e.clone()),
            None => Ok(msg.get("result").cloned().unwrap_or(Value::Null)),
        };
        match why {
            Pending::Ignore | Pending::Cleanup => {}
            Pending::Launch => self.launched(rpc, result),
            Pending::Feed(f) => self.fed(f, result),
            Pending::Answer { call, render } => {
                let r = match result {
                    Ok(v) => self.render(&render, v),
                    Err(e) => Self::tool_error(&daemon_error_text(&e)),
                };
                self.answer(&key(&call), r);
            }
        }
    }

    /// `_execd/approval_pending`: a launch waits for an approver.
    fn on_pending(&mut self, p: &Value) {
        let Some(rpc) = p["requestId"].as_u64() else {
            return;
        };
        let (Some(appr), Some(l)) = (p["approval"].as_str(), self.launches.get_mut(&rpc)) else {
            return;
        };
        let rules: Vec<String> = p["rules"]
            .as_array()
            .map(|r| {
                r.iter()
                    .filter_map(|x| x.as_str().map(String::from))
                    .collect()
            })
            .unwrap_or_default();
        l.approval = Some((appr.to_string(), rules));
        self.by_approval.insert(appr.to_string(), rpc);
        // The call waiting on it reports progress from now on.
        let now = Instant::now();
        for (_, o) in self.calls.values_mut() {
            if matches!(o.wait, Wait::Launch { rpc: r, .. } if r == rpc) {
                if let Some(p) = &mut o.progress {
                    p.next = Some(now);
                }
            }
        }
    }

    /// The answer to a launch: started, refused, or (shell) its result.
    fn launched(&mut self, rpc: u64, result: Result<Value, Value>) {
        let Some(l) = self.launches.get_mut(&rpc) else {
            return;
        };
        let approval = l.approval.clone();
        let waited = l.asked_at.elapsed().as_millis() as u64;
        let decided = match (&l.what, result) {
            (Launched::Run { .. }, Ok(v)) => {
                Decided::Started(v["command_id"].as_str().unwrap_or_default().to_string())
            }
            (Launched::Shell { .. }, Ok(v)) => Decided::Shell(v),
            (_, Err(e)) => Decided::Refused(match refusal(&e, approval.as_ref(), waited) {
                Some(r) => self_tool_result(r, self.version.as_deref()),
                None => Self::tool_error(&daemon_error_text(&e)),
            }),
        };
        l.done = Some(decided.clone());
        let what = l.what.clone();
        if let Launched::Shell { session } = &what {
            // The session's next line goes now.
            if let Some((next, params)) = self.held.get_mut(session).and_then(|q| q.pop_front()) {
                self.send_raw(&json!({"jsonrpc": "2.0", "id": next, "method": "shell/exec", "params": params}));
            }
        }
        if let (
            Decided::Started(id),
            Launched::Run {
                command,
                background,
                tty,
                stdin,
            },
        ) = (&decided, what)
        {
            self.cmds.insert(
                id.clone(),
                Cmd {
                    command,
                    background,
                    tty,
                    started: Instant::now(),
                    unread: Unread::new(self.ceilings.max_output),
                    exit: None,
                    waiting_input: false,
                    approval: approval.map(|a| a.0),
                },
            );
            // Events that came before the answer are this command's, in order.
            let early = std::mem::take(&mut self.early);
            for ev in early {
                self.on_event(&ev);
            }
            if let Some(input) = stdin {
                self.feed(Feed {
                    cmd: id.clone(),
                    rest: input.into_bytes(),
                    eof: true,
                    written: 0,
                    call: None,
                });
            }
        }
    }

    fn fed(&mut self, f: Feed, result: Result<Value, Value>) {
        match result {
            Ok(v) => {
                let f = Feed {
                    written: f.written + v["written"].as_u64().unwrap_or(0),
                    ..f
                };
                if f.rest.is_empty() {
                    if let Some(call) = &f.call {
                        let r = self.tool_result(json!({"id": f.cmd, "written": f.written}), false);
                        self.answer(&key(call), r);
                    }
                } else {
                    self.feed(f);
                }
            }
            Err(e) => {
                if let Some(call) = &f.call {
                    let text = format!("{}: {}", f.cmd, daemon_error_text(&e));
                    self.answer(&key(call), Self::tool_error(&text));
                }
            }
        }
    }

    fn on_event(&mut self, params: &Value) {
        let p = &params["payload"];
        let Some(id) = p["id"].as_str() else {
            return;
        };
        let Some(cmd) = self.cmds.get_mut(id) else {
            if self.early.len() < EARLY_EVENTS {
                self.early.push(params.clone());
            }
            return;
        };
        match params["type"].as_str() {
            Some("Output") if cmd.exit.is_none() => {
                cmd.unread.push(p["data"].as_str().unwrap_or(""));
            }
            Some("Gap") => {
                let skipped = p["skipped"].as_u64().unwrap_or(0);
                cmd.unread.lose(skipped);
                let text = format!("{id}: execd dropped {skipped} bytes of its output");
                self.log("warning", &text);
            }
            Some("Input") => cmd.waiting_input = p["waiting"] == true,
            Some("Exit") => {
                cmd.waiting_input = false;
                cmd.exit = Some(Exit {
                    status: match p["status"].as_str() {
                        Some("timed_out") => "timeout",
                        Some("killed") => "killed",
                        _ => "completed",
                    },
                    exit_code: p["exitCode"].clone(),
                    signal: p["signal"].clone(),
                    duration_ms: p["durationMs"]
                        .as_u64()
                        .unwrap_or_else(|| cmd.started.elapsed().as_millis() as u64),
                });
            }
            _ => {}
        }
    }

    fn lost_daemon(&mut self, why: String) {
        if self.daemon_gone.is_some() {
            return;
        }
        self.daemon_gone = Some(why.clone());
        let text =
            format!("lost the connection to execd ({why}); its commands of this client are killed");
        self.log("error", &text);
        let open: Vec<String> = self.calls.keys().cloned().collect();
        for k in open {
            self.answer(&k, Self::tool_error(&text));
        }
    }

    /// A daemon answer as a tool result.
    fn render(&mut self, render: &Render, v: Value) -> Value {
        match render {
            Render::Kill { id } => {
                let status = match v["status"].as_str() {
                    Some("timed_out") => "timeout",
                    Some(s) => s,
                    None => "running",
                };
                let mut r = json!({"id": id, "status": status, "exit_code": v["exit_code"]});
                if let Some(s) = v.get("signal") {
                    r["signal"] = s.clone();
                }
                self.tool_result(r, false)
            }
            Render::ShellKill { session } => self.tool_result(
                json!({"id": session, "status": shell_status(&v), "exit_code": v["exit_code"]}),
                false,
            ),
            Render::ShellWrite { session } => {
                let written = v["written"].as_u64().unwrap_or(0);
                self.tool_result(
                    json!({"id": session, "written": written, "status": v["status"]}),
                    false,
                )
            }
            Render::ShellView { session, max } => {
                let (output, truncated) =
                    text::cut(v["output"].as_str().unwrap_or("").to_string(), *max);
                self.tool_result(
                    json!({"session": session, "status": shell_status(&v), "command": v["command"],
                           "exit_code": v["exit_code"], "output": output, "truncated": truncated,
                           "working_dir": v["working_dir"].as_str().unwrap_or(""),
                           "waiting_for_input": v["waiting_for_input"] == true}),
                    false,
                )
            }
        }
    }

    // ---- answering when a wait is over ---------------------------------------------------

    /// Answers every open call whose wait is over; reports progress that is due.
    fn settle(&mut self, now: Instant) {
        let ids: Vec<String> = self.calls.keys().cloned().collect();
        for k in ids {
            self.settle_one(&k, now);
        }
    }

    fn settle_one(&mut self, k: &str, now: Instant) {
        let Some((_, open)) = self.calls.get(k) else {
            return;
        };
        let expired = open.overdue || open.deadline.is_some_and(|d| d <= now);
        let max = open.max_output;
        match open.wait.clone() {
            Wait::Daemon => {}
            Wait::Cmd { id, until_exit } => {
                let Some(cmd) = self.cmds.get(&id) else {
                    let text = format!("execd started no command for this call ({id:?})");
                    self.answer(k, Self::tool_error(&text));
                    return;
                };
                let ready = cmd.exit.is_some()
                    || cmd.waiting_input
                    || (!until_exit && !cmd.unread.is_empty())
                    || expired;
                if ready {
                    let r = self.command_result(&id, max);
                    self.answer(k, r);
                }
            }
            Wait::Launch { rpc, run, .. } => {
                let Some(l) = self.launches.get(&rpc) else {
                    return;
                };
                match l.done.clone() {
                    Some(Decided::Started(id)) if run => {
                        // Started: from now on it waits for the command itself.
                        if let Some((_, o)) = self.calls.get_mut(k) {
                            o.wait = Wait::Cmd {
                                id,
                                until_exit: true,
                            };
                            o.progress = None;
                        }
                        self.settle_one(k, now);
                    }
                    Some(Decided::Started(id)) => {
                        let r = self.command_result(&id, max);
                        self.answer(k, r);
                    }
                    Some(Decided::Shell(v)) => {
                        let session = match &l.what {
                            Launched::Shell { session } => session.clone(),
                            Launched::Run { .. } => String::new(),
                        };
                        let waited = l.asked_at.elapsed().as_millis() as u64;
                        let r = self.shell_result(&session, &v, max, waited);
                        self.answer(k, r);
                    }
                    Some(Decided::Refused(r)) => self.answer(k, r),
                    None => {
                        let Some((appr, rules)) = l.approval.clone() else {
                            // Not at an approver: the daemon's answer comes soon.
                            if expired {
                                if let Some((_, o)) = self.calls.get_mut(k) {
                                    o.deadline = None;
                                    o.overdue = true;
                                }
                            }
                            return;
                        };
                        let waited = l.asked_at.elapsed();
                        if expired {
                            let mut r = json!({"id": appr, "status": "waiting_for_approval",
                                "approval": appr, "rules": rules, "output": "", "truncated": false,
                                "duration_ms": waited.as_millis() as u64});
                            if let Launched::Shell { session } = &l.what {
                                r["session"] = json!(session);
                            }
                            let r = self.tool_result(r, false);
                            self.answer(k, r);
                            return;
                        }
                        self.report_progress(k, &appr, &rules, waited, now);
                    }
                }
            }
        }
    }

    /// `notifications/progress` for call `k` if one is due.
    fn report_progress(
        &mut self,
        k: &str,
        appr: &str,
        rules: &[String],
        waited: Duration,
        now: Instant,
    ) {
        let Some((_, o)) = self.calls.get_mut(k) else {
            return;
        };
        let Some(p) = &mut o.progress else {
            return;
        };
        if p.next.is_none_or(|t| t > now) {
            return;
        }
        p.next = Some(now + PROGRESS_EVERY);
        p.count += 1;
        // Progress must grow: seconds waited, and never the same twice.
        let progress = (waited.as_secs_f64() * 10.0).round() / 10.0 + p.count as f64 * 1e-3;
        let token = p.token.clone();
        let rules = match rules {
            [one] => format!(" (rule {one})"),
            [] => String::new(),
            many => format!(" (rules {})", many.join(", ")),
        };
        self.notify(
            "notifications/progress",
            json!({"progressToken": token, "progress": progress,
                   "message": format!("waiting for approval {appr}{rules}")}),
        );
    }

    /// A command's state and what it wrote since the last answer.
    fn command_result(&mut self, id: &str, max: usize) -> Value {
        let Some(cmd) = self.cmds.get_mut(id) else {
            return Self::tool_error(&format!("no command {id:?}"));
        };
        let (output, truncated) = cmd.unread.take(max);
        let mut r = json!({"id": id, "status": status_of(cmd), "output": output,
                           "truncated": truncated});
        match &cmd.exit {
            Some(e) => {
                r["exit_code"] = e.exit_code.clone();
                r["signal"] = e.signal.clone();
                r["duration_ms"] = json!(e.duration_ms);
            }
            None => r["duration_ms"] = json!(cmd.started.elapsed().as_millis() as u64),
        }
        if let Some(a) = &cmd.approval {
            r["approval"] = json!(a);
        }
        self.tool_result(r, false)
    }

    /// A shell session's answer as a tool result.
    fn shell_result(&self, session: &str, v: &Value, max: usize, waited: u64) -> Value {
        let (output, truncated) = text::cut(v["output"].as_str().unwrap_or("").to_string(), max);
        let status = shell_status(v);
        let mut r = json!({"session": session, "status": status, "output": output,
                           "truncated": truncated, "duration_ms": waited,
                           "exit_code": v["exit_code"]});
        if status == "running" || status == "waiting_for_input" {
            r["exit_code"] = Value::Null;
        }
        self.tool_result(r, false)
    }

    // ---- leaving -----------------------------------------------------------------------

    /// Closes what this client made and nothing outlives it for: its own shell session,
    /// and its bash session unless a background command still runs there. Foreground
    /// commands die with the connection (`kill_on_disconnect`).
    fn leave(&mut self, rx: &Receiver<Input>) {
        if self.daemon_gone.is_some() {
            return;
        }
        if let Some(s) = self.shell_session.clone().filter(|_| self.shell_made) {
            self.send_daemon("shell/sessions/close", json!({"id": s}), Pending::Cleanup);
        }
        let background = self.cmds.values().any(|c| c.background && c.exit.is_none());
        if !self.cmds.is_empty() && !background {
            let s = self.bash_session.clone();
            self.send_daemon(
                "bash/sessions/close",
                json!({"session_id": s}),
                Pending::Cleanup,
            );
        }
        let deadline = Instant::now() + CLEANUP_WAIT;
        while self.pending.values().any(|p| matches!(p, Pending::Cleanup)) {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok(Input::Daemon(msg)) => self.on_daemon(msg),
                Ok(Input::DaemonEnd(_)) | Err(_) => return,
                Ok(_) => {}
            }
        }
    }
}

/// What a model is told about this server (`instructions`).
const INSTRUCTIONS: &str = "Commands run through execd: its policy may deny a line \
(the result names the rule) or ask a person to approve it (status waiting_for_approval: \
call read with the approval id later). run answers when the command ends, after yield_ms \
(status running: call read with its id, wait_ms to wait), or at once when it waits for \
input (call write). shell keeps cd and variables between calls.";

/// A command's status as tools show it.
fn status_of(c: &Cmd) -> &'static str {
    match &c.exit {
        Some(e) => e.status,
        None if c.waiting_input => "waiting_for_input",
        None => "running",
    }
}

/// A shell session's status as tools show it.
fn shell_status(v: &Value) -> &'static str {
    match v["status"].as_str() {
        Some("completed") => "completed",
        Some("hard_timeout") => "timeout",
        Some("terminated") => "killed",
        _ if v["waiting_for_input"] == true => "waiting_for_input",
        _ => "running",
    }
}

/// A daemon error in one sentence.
fn daemon_error_text(e: &Value) -> String {
    let message = e["message"].as_str().unwrap_or("error");
    match e.get("data").filter(|d| !d.is_null()) {
        Some(d) => format!("execd: {message} ({d})"),
        None => format!("execd: {message}"),
    }
}

/// The structured result of a launch the gate refused: denied by the policy, not
/// approved, withdrawn; `None` for any other error (a bad directory, a limit, a failed
/// spawn), which is said in words.
fn refusal(e: &Value, approval: Option<&(String, Vec<String>)>, waited: u64) -> Option<Value> {
    let data = e.get("data").cloned().unwrap_or(Value::Null);
    let mut r = Map::new();
    let status = match e["code"].as_i64() {
        Some(-32005) => "denied",
        Some(-32006) => "rejected",
        Some(-32800) => {
            r.insert("reason".into(), "withdrawn".into());
            "rejected"
        }
        _ => return None,
    };
    r.insert("status".into(), status.into());
    for f in ["rule", "justification", "reason", "feedback"] {
        if let Some(s) = data.get(f).and_then(Value::as_str) {
            r.insert(f.into(), s.into());
        }
    }
    if let Some((appr, _)) = approval {
        r.insert("id".into(), appr.clone().into());
        r.insert("approval".into(), appr.clone().into());
    }
    r.insert("output".into(), "".into());
    r.insert("truncated".into(), false.into());
    r.insert("duration_ms".into(), waited.into());
    Some(Value::Object(r))
}

/// `Server::tool_result` for an error result, where the server is borrowed.
fn self_tool_result(structured: Value, version: Option<&str>) -> Value {
    let text = serde_json::to_string(&structured).unwrap_or_default();
    let mut r = json!({"content": [{"type": "text", "text": text}], "isError": true});
    if version.is_some_and(|v| v >= STRUCTURED_SINCE) {
        r["structuredContent"] = structured;
    }
    r
}

/// Whether sandbox `asked` (a shape `tools::parse` accepted; fields left out are the
/// ceiling's) is within `ceiling`, whatever `$CWD`, `$HOME` and `$TMPDIR` stand for: both
/// are resolved with the same stand-ins and compared.
fn within(asked: &Value, ceiling: &crate::policy::sandbox::Template) -> bool {
    use crate::policy::sandbox::Names;
    let Ok(shape) = crate::policy::sandbox::parse(asked) else {
        return false;
    };
    let (cwd, home, tmp) = (
        Path::new("/\u{1}cwd"),
        Path::new("/\u{1}home"),
        Path::new("/\u{1}tmp"),
    );
    let names = Names {
        cwd: Some(cwd),
        home: Some(home),
        tmpdir: Some(tmp),
        real: None,
    };
    let (asked, _) = shape.over(ceiling).resolve(&names);
    let (bound, _) = ceiling.resolve(&names);
    asked.within(&bound)
}
