//! execctl: flags -> client calls -> human or `--json` output.
//!
//! Exit status: the command's own for `run`, `exec` and `wait` (128+N when signal N ended
//! it; 130 after Ctrl-C, 124 after `--timeout`); otherwise 0 on success, 1 on a failure
//! (daemon error, no daemon), 2 on bad usage.

use std::io::{self, IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use execd::client::{is_timeout, CallError, Client};
use execd::config::{default_socket, parse_duration, parse_size};
use serde_json::{json, Value};

const USAGE: &str = "\
usage: execctl [--socket PATH] COMMAND [ARGS...]

Talks to a running execd over its Unix socket (--socket, else $EXECD_SOCKET, else the
daemon's default path). See execctl(1).

commands:
  run [--cwd DIR] [--env K=V]... [--limit BYTES] [--timeout SECS] -- CMD [ARGS...]
                  run a command in a terminal, stream its output, exit with its status
  exec [--session ID] [--cwd DIR] [--timeout S] [--hard-timeout S] [--async] 'LINE'
                  run a shell line through bash/exec; stdout and stderr kept apart
  ps [--json]     processes, newest first
  sessions [--json]
                  bash sessions
  logs ID [-f] [--stderr]
                  print a process's output; -f follows it live until it exits
  wait ID         wait for a process to exit; exit with its status
  kill ID [-s SIGNAL]
                  stop a process (terminals: SIGTERM then SIGKILL)
  release ID      kill if running and forget a terminal
  status [--json] version, uptime, socket, counts and limits
  call METHOD [JSON]
                  send one raw request; print the result or the error

Every command takes --help.
";

/// A failure that ends execctl: message for stderr and exit status.
struct Fail(String, u8);

type Res<T> = Result<T, Fail>;

fn usage_err(msg: impl Into<String>) -> Fail {
    Fail(msg.into(), 2)
}

impl From<CallError> for Fail {
    fn from(e: CallError) -> Self {
        Fail(e.to_string(), 1)
    }
}

impl From<io::Error> for Fail {
    fn from(e: io::Error) -> Self {
        Fail(e.to_string(), 1)
    }
}

/// Global options and the connection factory.
struct Ctx {
    socket: PathBuf,
    json: bool,
}

impl Ctx {
    fn connect(&self) -> Res<Client> {
        match Client::connect(&self.socket) {
            Ok(mut c) => {
                c.timeout = None;
                Ok(c)
            }
            Err(e) => Err(Fail(
                format!(
                    "cannot connect to execd at {} ({}); start it with: execd --socket {}",
                    self.socket.display(),
                    execd::rpc::os_error_text(&e),
                    self.socket.display()
                ),
                1,
            )),
        }
    }
}

/// Subcommand arguments: flags with values, boolean switches, positionals.
struct Args {
    items: Vec<String>,
}

impl Args {
    /// Every value of a repeatable flag (`--name V` or `--name=V`), in order.
    fn take_all(&mut self, names: &[&str]) -> Res<Vec<String>> {
        let mut found = Vec::new();
        let mut i = 0;
        while i < self.items.len() {
            let a = &self.items[i];
            if a == "--" {
                break;
            }
            if let Some((k, v)) = a.split_once('=') {
                if names.contains(&k) {
                    found.push(v.to_string());
                    self.items.remove(i);
                    continue;
                }
            }
            if names.contains(&a.as_str()) {
                if i + 1 >= self.items.len() {
                    return Err(usage_err(format!("{a} needs a value")));
                }
                self.items.remove(i);
                found.push(self.items.remove(i));
                continue;
            }
            i += 1;
        }
        Ok(found)
    }

    /// A single-valued flag; given twice, the last wins.
    fn take_flag(&mut self, names: &[&str]) -> Res<Option<String>> {
        Ok(self.take_all(names)?.pop())
    }

    fn take_switch(&mut self, names: &[&str]) -> bool {
        let end = self
            .items
            .iter()
            .position(|a| a == "--")
            .unwrap_or(self.items.len());
        match self.items[..end]
            .iter()
            .position(|a| names.contains(&a.as_str()))
        {
            Some(i) => {
                self.items.remove(i);
                true
            }
            None => false,
        }
    }

    /// What is left: positionals (an unknown `-x` before `--` is an error).
    fn rest(self) -> Res<Vec<String>> {
        let mut out = Vec::new();
        let mut raw = false;
        for a in self.items {
            if !raw && a == "--" {
                raw = true;
                continue;
            }
            if !raw && a.starts_with('-') && a.len() > 1 && out.is_empty() {
                return Err(usage_err(format!("unknown option {a}")));
            }
            out.push(a);
        }
        Ok(out)
    }
}

fn main() -> ExitCode {
    let mut argv: Vec<String> = std::env::args().skip(1).collect();
    let mut socket = None;
    let mut json = false;
    // Global options come before the subcommand.
    while let Some(a) = argv.first().cloned() {
        match a.as_str() {
            "-h" | "--help" => {
                print!("{USAGE}");
                return ExitCode::SUCCESS;
            }
            "-V" | "--version" => {
                println!("execctl {}", env!("CARGO_PKG_VERSION"));
                return ExitCode::SUCCESS;
            }
            "--json" => {
                json = true;
                argv.remove(0);
            }
            "--socket" if argv.len() > 1 => {
                socket = Some(PathBuf::from(argv.remove(1)));
                argv.remove(0);
            }
            s if s.starts_with("--socket=") => {
                socket = Some(PathBuf::from(&s["--socket=".len()..]));
                argv.remove(0);
            }
            _ => break,
        }
    }
    if argv.is_empty() {
        eprint!("{USAGE}");
        return ExitCode::from(2);
    }
    let sub = argv.remove(0);
    let mut args = Args { items: argv };
    if args.take_switch(&["--json"]) {
        json = true;
    }
    let ctx = Ctx {
        socket: default_socket(socket),
        json,
    };
    if args.take_switch(&["-h", "--help"]) {
        return match help(&sub) {
            Some(h) => {
                print!("{h}");
                ExitCode::SUCCESS
            }
            None => {
                eprintln!("execctl: unknown command {sub:?}\n{USAGE}");
                ExitCode::from(2)
            }
        };
    }
    let result = match sub.as_str() {
        "run" => cmd_run(&ctx, args),
        "exec" => cmd_exec(&ctx, args),
        "ps" => cmd_ps(&ctx, args),
        "sessions" => cmd_sessions(&ctx, args),
        "logs" => cmd_logs(&ctx, args),
        "wait" => cmd_wait(&ctx, args),
        "kill" => cmd_kill(&ctx, args),
        "release" => cmd_release(&ctx, args),
        "status" => cmd_status(&ctx, args),
        "call" => cmd_call(&ctx, args),
        other => Err(usage_err(format!(
            "unknown command {other:?} (see execctl --help)"
        ))),
    };
    match result {
        Ok(code) => ExitCode::from(code),
        Err(Fail(msg, code)) => {
            eprintln!("execctl: {msg}");
            ExitCode::from(code)
        }
    }
}

fn help(sub: &str) -> Option<&'static str> {
    Some(match sub {
        "run" => "usage: execctl run [--cwd DIR] [--env K=V]... [--limit BYTES] [--timeout SECS] -- CMD [ARGS...]\n\nRuns CMD in a terminal (stdout and stderr merged), streams its output live, releases\nthe terminal and exits with the command's status (128+N for signal N). Ctrl-C or\n--timeout kills it and prints what arrived; the exit status is then 130 or 124.\n--limit sets the retained output (outputByteLimit).\n",
        "exec" => "usage: execctl exec [--session ID] [--cwd DIR] [--timeout S] [--hard-timeout S] [--async] 'SHELL LINE'\n\nRuns the line through bash/exec. stdout and stderr go to their own streams; the exit\nstatus is the command's. If it is still running (--async, or --timeout passed), its\nsession and command ids are printed to stderr and execctl exits 0.\n",
        "ps" => "usage: execctl ps [--json]\n\nOne row per process, newest first: ID, SESSION, PID, STATE, EXIT, AGE, COMMAND.\n",
        "sessions" => "usage: execctl sessions [--json]\n\nThe bash sessions: SESSION, COMMANDS, AGE, IDLE, DIR, RUNNING.\n",
        "logs" => "usage: execctl logs ID [-f] [--stderr]\n\nPrints the retained output of a terminal or bash command. -f follows it live until it\nexits. For bash commands stdout and stderr go to their own streams; --stderr prints\nonly stderr.\n",
        "wait" => "usage: execctl wait ID\n\nWaits until the process exits; exits with its status (128+N for signal N).\n",
        "kill" => "usage: execctl kill ID [-s SIGNAL]\n\nTerminals get SIGTERM, then SIGKILL after the daemon's grace. Bash commands get SIGNAL\n(default SIGTERM) sent to their process group.\n",
        "release" => "usage: execctl release ID\n\nKills a terminal if it still runs and forgets it.\n",
        "status" => "usage: execctl status [--json]\n\nVersion, uptime, socket, counts and limits of the daemon.\n",
        "call" => "usage: execctl call METHOD [JSON]\n\nSends one request with JSON as params (default {}) and prints the result, or the\nerror on stderr with exit status 1.\n",
        _ => return None,
    })
}

// ---- helpers ------------------------------------------------------------------------------

/// The shell convention: the exit code, or 128+N when signal N ended the command.
fn exit_status(exit_code: &Value, signal: &Value) -> u8 {
    if let Some(c) = exit_code.as_i64() {
        return c.clamp(0, 255) as u8;
    }
    let Some(name) = signal.as_str() else {
        return 1;
    };
    let n = execd::process::signal_number(name).unwrap_or(0);
    (128 + n).clamp(0, 255) as u8
}

fn write_out(stream: &str, data: &str) {
    let r = if stream == "stderr" {
        let mut e = io::stderr().lock();
        e.write_all(data.as_bytes()).and_then(|_| e.flush())
    } else {
        let mut o = io::stdout().lock();
        o.write_all(data.as_bytes()).and_then(|_| o.flush())
    };
    if r.is_err() {
        // Our reader went away (e.g. `| head`): stop quietly like other tools.
        std::process::exit(141);
    }
}

fn print_json(v: &Value) {
    let text = serde_json::to_string_pretty(v).unwrap_or_default();
    write_out("stdout", &format!("{text}\n"));
}

fn use_color() -> bool {
    io::stdout().is_terminal() && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
}

fn parse_secs(flag: &str, v: &str) -> Res<f64> {
    parse_duration(v)
        .map(|d| d.as_secs_f64())
        .map_err(|e| usage_err(format!("{flag}: {e}")))
}

/// Installs Ctrl-C handling: a flag the loops poll.
fn interrupt_flag() -> Arc<AtomicBool> {
    let flag = Arc::new(AtomicBool::new(false));
    let _ = signal_hook::flag::register(signal_hook::consts::SIGINT, Arc::clone(&flag));
    let _ = signal_hook::flag::register(signal_hook::consts::SIGTERM, Arc::clone(&flag));
    flag
}

/// Where a process lives: its family and session.
enum Target {
    Terminal { id: String, session: String },
    Bash { id: String, session: String },
}

/// Every entry of a paged listing (`terminal/list` under `terminals`, `bash/commands`
/// under `commands`), following its cursor to the end, wrapped as the first page was.
fn list_all(c: &mut Client, method: &str, key: &str) -> Res<Value> {
    let next_field = if method == "terminal/list" {
        "nextCursor"
    } else {
        "next_cursor"
    };
    let mut all = Vec::new();
    let mut cursor: Option<Value> = None;
    loop {
        let mut params = json!({ "limit": 4096 });
        if let Some(c) = cursor.take() {
            params["cursor"] = c;
        }
        let page = c.call(method, params)?;
        all.extend(page[key].as_array().cloned().unwrap_or_default());
        match page.get(next_field) {
            Some(Value::String(next)) => cursor = Some(json!(next)),
            _ => break,
        }
    }
    Ok(json!({ key: all }))
}

fn locate(c: &mut Client, id: &str) -> Res<Target> {
    let terms = list_all(c, "terminal/list", "terminals")?;
    if let Some(t) = terms["terminals"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|t| t["terminalId"] == id)
    {
        return Ok(Target::Terminal {
            id: id.to_string(),
            session: t["sessionId"].as_str().unwrap_or_default().to_string(),
        });
    }
    let cmds = list_all(c, "bash/commands", "commands")?;
    if let Some(b) = cmds["commands"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|b| b["command_id"] == id)
    {
        return Ok(Target::Bash {
            id: id.to_string(),
            session: b["session_id"].as_str().unwrap_or_default().to_string(),
        });
    }
    Err(Fail(format!("no process {id:?} (see execctl ps)"), 1))
}

/// Streams events for `id` until `Exit`, printing output. Returns the Exit payload, or
/// `None` if `stop` was raised first (the caller then kills and streams the rest).
fn follow(
    c: &mut Client,
    id: &str,
    only_stderr: bool,
    stop: Option<(&AtomicBool, Option<Instant>)>,
) -> Res<Option<Value>> {
    loop {
        if let Some((flag, deadline)) = stop {
            if flag.load(Ordering::Relaxed) || deadline.is_some_and(|d| Instant::now() >= d) {
                return Ok(None);
            }
        }
        let ev = match c.next_notification(Some(Duration::from_millis(100))) {
            Ok(ev) => ev,
            Err(CallError::Io(e)) if is_timeout(&e) => continue,
            Err(e) => return Err(e.into()),
        };
        if ev["method"] != "event" || ev["params"]["payload"]["id"] != id {
            continue;
        }
        let payload = &ev["params"]["payload"];
        match ev["params"]["type"].as_str() {
            Some("Output") => {
                let stream = payload["stream"].as_str().unwrap_or("output");
                if only_stderr && stream != "stderr" {
                    continue;
                }
                write_out(stream, payload["data"].as_str().unwrap_or(""));
            }
            Some("Gap") => {
                eprintln!(
                    "execctl: [{} bytes of {} skipped at offset {}]",
                    payload["skipped"],
                    payload["stream"].as_str().unwrap_or("output"),
                    payload["offset"]
                );
            }
            Some("Exit") => return Ok(Some(payload.clone())),
            _ => {}
        }
    }
}

// ---- subcommands --------------------------------------------------------------------------

fn cmd_run(ctx: &Ctx, mut args: Args) -> Res<u8> {
    let cwd = args.take_flag(&["--cwd"])?;
    let envs = args.take_all(&["--env", "-e"])?;
    let limit = args
        .take_flag(&["--limit"])?
        .map(|v| parse_size(&v).map_err(usage_err))
        .transpose()?;
    let timeout = args
        .take_flag(&["--timeout"])?
        .map(|v| parse_secs("--timeout", &v))
        .transpose()?;
    let argv = args.rest()?;
    let Some((command, cmd_args)) = argv.split_first() else {
        return Err(usage_err(
            "run needs a command (execctl run -- CMD [ARGS...])",
        ));
    };
    let mut env = Vec::new();
    for kv in envs {
        let (k, v) = kv
            .split_once('=')
            .ok_or_else(|| usage_err(format!("--env expects K=V, got {kv:?}")))?;
        env.push(json!({"name": k, "value": v}));
    }
    let cwd = match cwd {
        Some(d) => Some(std::fs::canonicalize(&d).map_err(|e| Fail(format!("--cwd {d}: {e}"), 1))?),
        None => std::env::current_dir().ok(),
    };
    let interrupted = interrupt_flag();
    let mut c = ctx.connect()?;
    let session = format!("execctl-{}", std::process::id());
    let mut params =
        json!({"sessionId": session, "command": command, "args": cmd_args, "env": env});
    if let Some(d) = cwd {
        params["cwd"] = json!(d.display().to_string());
    }
    if let Some(l) = limit {
        params["outputByteLimit"] = json!(l);
    }
    let id = c.call("terminal/create", params)?["terminalId"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let ids = json!({"sessionId": session, "terminalId": id});
    c.call("events/subscribe", json!({"id": id}))?;
    let deadline = timeout.map(|t| Instant::now() + Duration::from_secs_f64(t));
    let exit = follow(&mut c, &id, false, Some((&interrupted, deadline)))?;
    let code = match exit {
        Some(exit) => exit_status(&exit["exitCode"], &exit["signal"]),
        None => {
            // Interrupted or timed out: kill, then print what still arrives until Exit.
            let timed_out = !interrupted.load(Ordering::Relaxed);
            let kill = c.send("terminal/kill", ids.clone())?;
            follow(&mut c, &id, false, None)?;
            let _ = c.wait_response(kill);
            if timed_out {
                eprintln!("execctl: timed out; {id} killed");
                124
            } else {
                130
            }
        }
    };
    let _ = c.call("terminal/release", ids);
    Ok(code)
}

fn cmd_exec(ctx: &Ctx, mut args: Args) -> Res<u8> {
    let session = args.take_flag(&["--session"])?;
    let cwd = args.take_flag(&["--cwd"])?;
    let timeout = args
        .take_flag(&["--timeout"])?
        .map(|v| parse_secs("--timeout", &v))
        .transpose()?;
    let hard = args
        .take_flag(&["--hard-timeout"])?
        .map(|v| parse_secs("--hard-timeout", &v))
        .transpose()?;
    let async_mode = args.take_switch(&["--async"]);
    let line = args.rest()?.join(" ");
    if line.is_empty() {
        return Err(usage_err("exec needs a shell line (execctl exec 'LINE')"));
    }
    let cwd = match cwd {
        Some(d) => Some(std::fs::canonicalize(&d).map_err(|e| Fail(format!("--cwd {d}: {e}"), 1))?),
        None => None,
    };
    let mut c = ctx.connect()?;
    let mut params = json!({
        "command": line,
        "async_mode": async_mode,
        "max_output_length": 0,
    });
    let own_session = session.is_none();
    if let Some(s) = session {
        params["session_id"] = json!(s);
    }
    if let Some(d) = cwd {
        params["exec_dir"] = json!(d.display().to_string());
    }
    if let Some(t) = timeout {
        params["timeout"] = json!(t);
    }
    if let Some(h) = hard {
        params["hard_timeout"] = json!(h);
    }
    let r = c.call("bash/exec", params)?;
    // A session made for this one command goes with it once the command is done; one
    // still running keeps it (the daemon closes it when idle, or evicts it at the cap).
    if own_session && r["status"] != "running" {
        let _ = c.call(
            "bash/sessions/close",
            json!({"session_id": r["session_id"]}),
        );
    }
    if ctx.json {
        print_json(&r);
    } else {
        write_out("stdout", r["stdout"].as_str().unwrap_or(""));
        write_out("stderr", r["stderr"].as_str().unwrap_or(""));
    }
    match r["status"].as_str() {
        Some("running") => {
            eprintln!(
                "execctl: {} still running in session {}; follow it with: execctl logs {} -f",
                r["command_id"].as_str().unwrap_or("?"),
                r["session_id"].as_str().unwrap_or("?"),
                r["command_id"].as_str().unwrap_or("?"),
            );
            Ok(0)
        }
        Some("timed_out") => {
            eprintln!(
                "execctl: hard timeout; {} killed",
                r["command_id"].as_str().unwrap_or("?")
            );
            Ok(124)
        }
        _ => Ok(exit_status(
            &r["exit_code"],
            r.get("signal").unwrap_or(&Value::Null),
        )),
    }
}

/// "3s", "5m", "2h", "4d".
fn age(started: &str) -> String {
    let Some(t) = parse_rfc3339(started) else {
        return "?".into();
    };
    let secs = SystemTime::now()
        .duration_since(t)
        .unwrap_or_default()
        .as_secs();
    match secs {
        s if s < 60 => format!("{s}s"),
        s if s < 3600 => format!("{}m", s / 60),
        s if s < 86_400 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86_400),
    }
}

/// Parses the daemon's own RFC 3339 form (`YYYY-MM-DDTHH:MM:SS.mmmZ`).
fn parse_rfc3339(s: &str) -> Option<SystemTime> {
    let b = s.as_bytes();
    if b.len() < 20 || b[4] != b'-' || b[10] != b'T' {
        return None;
    }
    let num = |r: std::ops::Range<usize>| s.get(r)?.parse::<i64>().ok();
    let (y, mo, d) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (h, mi, se) = (num(11..13)?, num(14..16)?, num(17..19)?);
    // Days from civil (Howard Hinnant's algorithm).
    let y2 = if mo <= 2 { y - 1 } else { y };
    let era = y2.div_euclid(400);
    let yoe = y2 - era * 400;
    let mp = (mo + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    let secs = days * 86_400 + h * 3600 + mi * 60 + se;
    Some(SystemTime::UNIX_EPOCH + Duration::from_secs(secs.max(0) as u64))
}

/// Prints rows as aligned columns; the last column is shortened to the terminal width.
fn table(headers: &[&str], rows: &[Vec<String>], color_col: Option<usize>) {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.len()).collect();
    for r in rows {
        for (i, cell) in r.iter().enumerate() {
            widths[i] = widths[i].max(cell.chars().count());
        }
    }
    let color = use_color();
    let term = if io::stdout().is_terminal() {
        execd::process::terminal_width()
    } else {
        None
    };
    let mut out = String::new();
    let last = headers.len() - 1;
    let line = |cells: Vec<String>, out: &mut String, is_header: bool| {
        let mut used = 0;
        for (i, cell) in cells.into_iter().enumerate() {
            if i == last {
                let room = term.map(|w| w.saturating_sub(used).max(8));
                let text = match room {
                    Some(room) if cell.chars().count() > room => {
                        let mut t: String = cell.chars().take(room - 1).collect();
                        t.push('\u{2026}');
                        t
                    }
                    _ => cell,
                };
                out.push_str(&text);
            } else {
                let pad = widths[i] - cell.chars().count();
                let painted = match (color && !is_header && Some(i) == color_col, cell.as_str()) {
                    (true, "running") => format!("\x1b[32m{cell}\x1b[0m"),
                    (true, "killed" | "timed_out" | "failed") => format!("\x1b[31m{cell}\x1b[0m"),
                    _ => cell,
                };
                out.push_str(&painted);
                out.push_str(&" ".repeat(pad + 2));
                used += widths[i] + 2;
            }
        }
        out.push('\n');
    };
    line(
        headers.iter().map(|h| h.to_string()).collect(),
        &mut out,
        true,
    );
    for r in rows {
        line(r.clone(), &mut out, false);
    }
    write_out("stdout", &out);
}

fn cmd_ps(ctx: &Ctx, args: Args) -> Res<u8> {
    args.rest()?.first().map_or(Ok(()), |a| {
        Err(usage_err(format!("unexpected argument {a:?}")))
    })?;
    let mut c = ctx.connect()?;
    let terms = list_all(&mut c, "terminal/list", "terminals")?;
    let cmds = list_all(&mut c, "bash/commands", "commands")?;
    let mut all: Vec<Value> = Vec::new();
    for t in terms["terminals"].as_array().into_iter().flatten() {
        let exit = &t["exitStatus"];
        let state = if exit.is_null() {
            "running"
        } else if exit["signal"].is_null() {
            "exited"
        } else {
            "killed"
        };
        let command = std::iter::once(t["command"].as_str().unwrap_or("").to_string())
            .chain(
                t["args"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|a| a.as_str().unwrap_or("").to_string()),
            )
            .collect::<Vec<_>>()
            .join(" ");
        all.push(json!({
            "id": t["terminalId"], "kind": "terminal", "session": t["sessionId"], "pid": t["pid"],
            "state": state, "exitCode": exit["exitCode"], "signal": exit["signal"],
            "startedAt": t["startedAt"], "command": command,
        }));
    }
    for b in cmds["commands"].as_array().into_iter().flatten() {
        all.push(json!({
            "id": b["command_id"], "kind": "bash", "session": b["session_id"], "pid": b["pid"],
            "state": b["status"], "exitCode": b["exit_code"], "signal": b.get("signal").cloned().unwrap_or(Value::Null),
            "startedAt": b["started_at"], "command": b["command"],
        }));
    }
    all.sort_by(|a, b| {
        b["startedAt"]
            .as_str()
            .cmp(&a["startedAt"].as_str())
            .then_with(|| {
                let n = |v: &Value| {
                    v["id"]
                        .as_str()
                        .and_then(|s| s.rsplit('_').next()?.parse::<u64>().ok())
                };
                n(b).cmp(&n(a))
            })
    });
    if ctx.json {
        print_json(&json!({ "processes": all }));
        return Ok(0);
    }
    let rows: Vec<Vec<String>> = all
        .iter()
        .map(|p| {
            let exit = match (&p["exitCode"], &p["signal"]) {
                (Value::Number(n), _) => n.to_string(),
                (_, Value::String(s)) => s.clone(),
                _ => "-".into(),
            };
            vec![
                p["id"].as_str().unwrap_or("").into(),
                p["session"].as_str().unwrap_or("").into(),
                p["pid"].to_string(),
                p["state"].as_str().unwrap_or("").into(),
                exit,
                age(p["startedAt"].as_str().unwrap_or("")),
                p["command"].as_str().unwrap_or("").replace('\n', " "),
            ]
        })
        .collect();
    table(
        &["ID", "SESSION", "PID", "STATE", "EXIT", "AGE", "COMMAND"],
        &rows,
        Some(3),
    );
    Ok(0)
}

fn cmd_sessions(ctx: &Ctx, args: Args) -> Res<u8> {
    args.rest()?.first().map_or(Ok(()), |a| {
        Err(usage_err(format!("unexpected argument {a:?}")))
    })?;
    let mut c = ctx.connect()?;
    let list = c.call("bash/sessions", json!({}))?;
    if ctx.json {
        print_json(&list);
        return Ok(0);
    }
    let rows: Vec<Vec<String>> = list
        .as_array()
        .into_iter()
        .flatten()
        .map(|s| {
            vec![
                s["session_id"].as_str().unwrap_or("").into(),
                s["command_count"].to_string(),
                age(s["created_at"].as_str().unwrap_or("")),
                age(s["last_used_at"].as_str().unwrap_or("")),
                s["working_dir"].as_str().unwrap_or("").into(),
                s["current_command"]
                    .as_str()
                    .unwrap_or("-")
                    .replace('\n', " "),
            ]
        })
        .collect();
    table(
        &["SESSION", "COMMANDS", "AGE", "IDLE", "DIR", "RUNNING"],
        &rows,
        None,
    );
    Ok(0)
}

fn one_id(args: Args, what: &str) -> Res<String> {
    let rest = args.rest()?;
    match rest.as_slice() {
        [id] => Ok(id.clone()),
        [] => Err(usage_err(format!(
            "{what} needs a process id (see execctl ps)"
        ))),
        _ => Err(usage_err(format!("{what} takes one process id"))),
    }
}

fn cmd_logs(ctx: &Ctx, mut args: Args) -> Res<u8> {
    let follow_live = args.take_switch(&["-f", "--follow"]);
    let only_stderr = args.take_switch(&["--stderr"]);
    let id = one_id(args, "logs")?;
    let mut c = ctx.connect()?;
    let target = locate(&mut c, &id)?;
    if follow_live {
        c.call("events/subscribe", json!({"id": id}))?;
        let interrupted = interrupt_flag();
        follow(&mut c, &id, only_stderr, Some((&interrupted, None)))?;
        return Ok(if interrupted.load(Ordering::Relaxed) {
            130
        } else {
            0
        });
    }
    match target {
        Target::Terminal { id, session } => {
            let r = c.call(
                "terminal/output",
                json!({"sessionId": session, "terminalId": id}),
            )?;
            if r["truncated"] == true {
                eprintln!("execctl: [older output was dropped; showing the retained tail]");
            }
            if !only_stderr {
                write_out("stdout", r["output"].as_str().unwrap_or(""));
            }
        }
        Target::Bash { id, session } => {
            let r = c.call(
                "bash/output",
                json!({"session_id": session, "command_id": id}),
            )?;
            if !only_stderr {
                write_out("stdout", r["stdout"].as_str().unwrap_or(""));
            }
            write_out("stderr", r["stderr"].as_str().unwrap_or(""));
        }
    }
    Ok(0)
}

fn cmd_wait(ctx: &Ctx, args: Args) -> Res<u8> {
    let id = one_id(args, "wait")?;
    let mut c = ctx.connect()?;
    let (code, signal) = match locate(&mut c, &id)? {
        Target::Terminal { id, session } => {
            let r = c.call(
                "terminal/wait_for_exit",
                json!({"sessionId": session, "terminalId": id}),
            )?;
            (r["exitCode"].clone(), r["signal"].clone())
        }
        Target::Bash { id, session } => {
            // An offset past the end is answered at once with "" and the end offsets; from
            // there, long-poll: waiting transfers no output.
            let mut at = json!({"session_id": session, "command_id": id, "offset": u64::MAX, "stderr_offset": u64::MAX});
            loop {
                let r = c.call("bash/output", at.clone())?;
                let cmd = &r["command"];
                if cmd["status"] != "running" {
                    break (
                        cmd["exit_code"].clone(),
                        cmd.get("signal").cloned().unwrap_or(Value::Null),
                    );
                }
                at["offset"] = r["offset"].clone();
                at["stderr_offset"] = r["stderr_offset"].clone();
                at["wait"] = json!(true);
                at["wait_timeout"] = json!(30);
            }
        }
    };
    if ctx.json {
        print_json(&json!({"exitCode": code, "signal": signal}));
    }
    Ok(exit_status(&code, &signal))
}

fn cmd_kill(ctx: &Ctx, mut args: Args) -> Res<u8> {
    let signal = args.take_flag(&["-s", "--signal"])?;
    let id = one_id(args, "kill")?;
    let mut c = ctx.connect()?;
    match locate(&mut c, &id)? {
        Target::Terminal { id, session } => {
            if signal
                .as_deref()
                .is_some_and(|s| !matches!(s.to_ascii_uppercase().as_str(), "TERM" | "SIGTERM"))
            {
                return Err(usage_err(
                    "terminals are killed with SIGTERM, then SIGKILL; -s applies to bash commands",
                ));
            }
            c.call(
                "terminal/kill",
                json!({"sessionId": session, "terminalId": id}),
            )?;
        }
        Target::Bash { id, session } => {
            let r = c.call(
                "bash/kill",
                json!({"session_id": session, "command_id": id, "signal": signal.unwrap_or_else(|| "SIGTERM".into())}),
            )?;
            if ctx.json {
                print_json(&r);
            }
        }
    }
    Ok(0)
}

fn cmd_release(ctx: &Ctx, args: Args) -> Res<u8> {
    let id = one_id(args, "release")?;
    let mut c = ctx.connect()?;
    match locate(&mut c, &id)? {
        Target::Terminal { id, session } => {
            c.call("terminal/release", json!({"sessionId": session, "terminalId": id}))?;
            Ok(0)
        }
        Target::Bash { session, .. } => Err(Fail(
            format!("{id} is a bash command; bash commands are freed with their session (execctl call bash/sessions/close '{{\"session_id\":\"{session}\"}}')"),
            1,
        )),
    }
}

fn cmd_status(ctx: &Ctx, args: Args) -> Res<u8> {
    args.rest()?.first().map_or(Ok(()), |a| {
        Err(usage_err(format!("unexpected argument {a:?}")))
    })?;
    let mut c = ctx.connect()?;
    let init = c.call("initialize", json!({"protocolVersion": 1, "clientInfo": {"name": "execctl", "version": env!("CARGO_PKG_VERSION")}}))?;
    let terms = list_all(&mut c, "terminal/list", "terminals")?;
    let cmds = list_all(&mut c, "bash/commands", "commands")?;
    let sessions = c.call("bash/sessions", json!({}))?;
    let meta = &init["_meta"]["execd"];
    let count = |v: &Value| v.as_array().map_or(0, Vec::len);
    let running_terms = terms["terminals"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|t| t["exitStatus"].is_null())
        .count();
    let running_cmds = cmds["commands"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|b| b["status"] == "running")
        .count();
    let status = json!({
        "version": init["serverInfo"]["version"],
        "pid": meta["pid"],
        "uptimeMs": meta["uptimeMs"],
        "socket": meta["socket"],
        "running": meta["running"],
        "clients": meta["clients"],
        "terminals": count(&terms["terminals"]),
        "runningTerminals": running_terms,
        "bashCommands": count(&cmds["commands"]),
        "runningBashCommands": running_cmds,
        "sessions": count(&sessions),
        "outputMemory": meta["outputMemory"],
        "limits": init["limits"],
    });
    if ctx.json {
        print_json(&status);
        return Ok(0);
    }
    let up = meta["uptimeMs"].as_u64().unwrap_or(0) / 1000;
    let mut out = format!(
        "execd {} (pid {}) on {}\nuptime      {}h{:02}m{:02}s\nrunning     {} ({} terminals, {} bash commands; all users: {})\nterminals   {}\nbash        {} commands in {} sessions\nclients     {}\noutput      {} of {} bytes held ({} released to stay within it)\nlimits\n",
        status["version"].as_str().unwrap_or("?"),
        status["pid"],
        status["socket"].as_str().unwrap_or("?"),
        up / 3600,
        up / 60 % 60,
        up % 60,
        running_terms + running_cmds,
        running_terms,
        running_cmds,
        status["running"],
        status["terminals"],
        status["bashCommands"],
        status["sessions"],
        status["clients"],
        meta["outputMemory"]["used"],
        meta["outputMemory"]["budget"],
        meta["outputMemory"]["released"],
    );
    if let Some(limits) = init["limits"].as_object() {
        for (k, v) in limits {
            out.push_str(&format!("  {k:<16}{v}\n"));
        }
    }
    write_out("stdout", &out);
    Ok(0)
}

fn cmd_call(ctx: &Ctx, args: Args) -> Res<u8> {
    let rest = args.rest()?;
    let (method, params) = match rest.as_slice() {
        [m] => (m.clone(), json!({})),
        [m, p] => (
            m.clone(),
            serde_json::from_str(p).map_err(|e| usage_err(format!("params are not JSON: {e}")))?,
        ),
        _ => return Err(usage_err("usage: execctl call METHOD [JSON]")),
    };
    let mut c = ctx.connect()?;
    let r = c.call(&method, params)?;
    print_json(&r);
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_status_rules() {
        assert_eq!(exit_status(&json!(3), &Value::Null), 3);
        assert_eq!(exit_status(&Value::Null, &json!("SIGKILL")), 137);
        assert_eq!(exit_status(&Value::Null, &json!("SIGSEGV")), 139);
        assert_eq!(exit_status(&Value::Null, &json!("SIGINT")), 130);
    }

    #[test]
    fn rfc3339_round_trip() {
        let t = SystemTime::UNIX_EPOCH + Duration::from_secs(951_782_400);
        assert_eq!(parse_rfc3339(&execd::rpc::rfc3339(t)), Some(t));
        assert_eq!(parse_rfc3339("nope"), None);
    }

    #[test]
    fn args_split_flags_and_positionals() {
        let mut a = Args {
            items: ["--cwd", "/x", "--env", "A=1", "-e=B=2", "--", "ls", "--cwd"]
                .map(String::from)
                .to_vec(),
        };
        assert_eq!(
            a.take_flag(&["--cwd"]).ok().flatten().as_deref(),
            Some("/x")
        );
        assert_eq!(
            a.take_all(&["--env", "-e"]).ok(),
            Some(vec!["A=1".to_string(), "B=2".to_string()])
        );
        assert_eq!(
            a.rest().ok(),
            Some(vec!["ls".to_string(), "--cwd".to_string()])
        );
    }
}
