//! `run`, `exec` and `write`: a command in the foreground, as a shell runs one.
//!
//! - Output: the command is created subscribed (`lossless`, `base64`), so every byte from
//!   the first arrives exactly, and a slow reader of execctl's stdout slows the command
//!   instead of losing output. A `Gap` (bytes the daemon had to drop for its memory
//!   budget) is reported in one line and makes the exit status non-zero.
//! - Input: execctl's stdin is forwarded when it is not a terminal (or with `-i`), in
//!   chunks that each wait for room in the daemon's stdin buffer (back-pressure), and
//!   closed at its end. On a terminal without `-t` or `-i` the command's stdin is a pipe
//!   execctl holds open and never writes: a program that waits for input then says so
//!   (PROTOCOL 12.3), and execctl prints once that it has no terminal. Otherwise (and
//!   when execctl's stdin is `/dev/null`, which has nothing to forward) the command's
//!   stdin is closed from the start.
//! - Lifetime: a foreground command is created with `killOnDisconnect`, so it dies with
//!   execctl's connection even when execctl cannot ask (SIGKILL, a broken ssh link);
//!   `--detach`, `exec --wait` and `-t` (whose detach keys leave it running, and which
//!   `attach` comes back to) leave it running on purpose.
//! - Where: execctl's directory and `-e NAME` values are this host's. On another host
//!   (`-H ssh://`) the command runs in the remote daemon's default directory unless
//!   `-w DIR` names one there: execctl's own directory means nothing on that host.
//! - Ending (`foreground`): signals, `--timeout` or a closed stdout kill the command;
//!   execctl still reads until the `Exit` event, so what the command wrote while dying
//!   is printed, then releases what it made (the terminal, or the session it created).
//!
//! Threads: the main thread reads the connection and writes output; the stdin forwarder
//! and the killers (`foreground`) use connections of their own.

use std::io::{self, IsTerminal, Read};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Map, Value};

use super::args::Args;
use super::connect::{self, Ctx, Host, Target};
use super::errors::{self, daemon_error, exit_status, Fail, Res, EXIT_FAILURE, EXIT_TIMEOUT};
use super::events::{Decoded, Decoder};
use super::foreground::{create, watch_signals, Killer, Reason};
use super::output::{self, warn};
use super::tty;
use super::tty::{Session, TtyOpts};
use crate::client::{is_timeout, CallError, Client};
use crate::config::{parse_duration, parse_size};
use crate::wire::encode::base64_encode;

/// Largest stdin chunk sent in one write; each waits for its answer (back-pressure).
const STDIN_CHUNK: usize = 32 << 10;

/// What `run` and `exec` share.
struct Common {
    cwd: Option<String>,
    env: Vec<(String, String)>,
    timeout: Option<Duration>,
    detach: bool,
    /// execctl's stdin goes to the command.
    forward_stdin: bool,
    /// The command gets a stdin pipe: forwarded, or (`-d -i`) left open for `execctl write`,
    /// or held open for the hint.
    stdin_pipe: bool,
    /// execctl sits on a terminal and the command has none: its stdin pipe is held open
    /// unwritten (unless forwarded), and if it waits for input, execctl says why once.
    no_terminal: bool,
    /// `-t`: a PTY, and (unless detached) execctl's terminal in raw mode for it.
    tty: Option<TtyOpts>,
}

/// What execctl says, once, when a command without a terminal waits for input while
/// execctl sits on one (`-t` was not given): an interactive program would otherwise wait
/// silently, or see no prompt. `None` when there is nothing to say.
fn terminal_hint(o: &Common, command: &str) -> Option<String> {
    if !o.no_terminal {
        return None;
    }
    let program = command.split_whitespace().next().unwrap_or(command);
    let stdin = if o.forward_stdin {
        "stdin is a pipe from execctl"
    } else {
        "stdin is held open, empty; -i sends it what you type"
    };
    Some(format!(
        "{program} waits for input and has no terminal ({stdin}); use -t for an interactive program"
    ))
}

/// The PTY session of a foreground `-t` command: it watches signals from now on, in
/// place of `watch_signals`.
fn foreground_signals(ctx: &Ctx, o: &Common, killer: &Killer) -> Option<Arc<Session>> {
    if o.detach {
        return None;
    }
    match &o.tty {
        Some(t) => Some(Session::watch(ctx, t, Some(killer))),
        None => {
            watch_signals(killer);
            None
        }
    }
}

/// `--json` collects output into one object; a terminal session has nowhere to put it.
fn tty_json(ctx: &Ctx, o: &Common) -> Res<()> {
    if ctx.json && o.tty.is_some() && !o.detach {
        return Err(Fail::usage(
            "-t puts the command on your terminal; --json goes only with -d -t",
        ));
    }
    Ok(())
}

fn seconds(flag: &str, v: &str) -> Res<Option<Duration>> {
    let d = parse_duration(v).map_err(|e| {
        Fail::usage(format!(
            "{flag}: {e}; give seconds (5, 1.5) or 500ms, 2m, 1h"
        ))
    })?;
    Ok((!d.is_zero()).then_some(d))
}

fn common(ctx: &Ctx, p: &Args, timeout_flags: &[&str]) -> Res<Common> {
    let detach = p.has("--detach") || p.has("--async");
    let mut timeout = None;
    for f in timeout_flags {
        if let Some(v) = p.value(f) {
            timeout = seconds(f, v)?;
        }
    }
    let interactive = p.has("--interactive");
    let tty = tty::options(p, detach)?;
    // With -t the keys go to the PTY (`tty::Session`), not through a pipe.
    let forward_stdin =
        tty.is_none() && !detach && !stdin_is_null() && (interactive || !io::stdin().is_terminal());
    let no_terminal = tty.is_none()
        && !detach
        && !ctx.json
        && io::stdin().is_terminal()
        && io::stdout().is_terminal();
    let cwd = match &ctx.host {
        Host::Local(_) => work_dir(p.value("--cwd"))?,
        Host::Ssh(remote) => remote_dir(p.value("--cwd"), &remote.host)?,
    };
    Ok(Common {
        stdin_pipe: forward_stdin || (detach && interactive) || tty.is_some() || no_terminal,
        no_terminal,
        tty,
        cwd,
        env: env_vars(&p.values("--env-file"), &p.values("--env"))?,
        timeout,
        detach,
        forward_stdin,
    })
}

/// Whether execctl's stdin is `/dev/null`: nothing to forward, so no stdin pipe and no
/// connection to feed it (a script's `execctl run ... </dev/null` costs one link, not two).
fn stdin_is_null() -> bool {
    use std::os::fd::AsFd;
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let Ok(fd) = io::stdin().as_fd().try_clone_to_owned() else {
        return false;
    };
    let (Ok(ours), Ok(null)) = (
        std::fs::File::from(fd).metadata(),
        std::fs::metadata("/dev/null"),
    ) else {
        return false;
    };
    ours.file_type().is_char_device() && ours.rdev() == null.rdev()
}

/// `-w DIR` on another host: absolute, since execctl's directory means nothing there;
/// none means the remote daemon's default directory.
fn remote_dir(flag: Option<&str>, host: &str) -> Res<Option<String>> {
    match flag {
        None => Ok(None),
        Some(d) if d.starts_with('/') => Ok(Some(d.to_string())),
        Some(d) => Err(Fail::usage(format!(
            "-w/--cwd {d} is relative, and the command runs on {host}: give an absolute path there"
        ))),
    }
}

/// `--cwd` made absolute against execctl's directory; by default execctl's directory.
pub(super) fn work_dir(flag: Option<&str>) -> Res<Option<String>> {
    let here = std::env::current_dir();
    let dir = match (flag, here) {
        (Some(d), _) if d.starts_with('/') => return Ok(Some(d.to_string())),
        (Some(d), Ok(here)) => here.join(d),
        (Some(d), Err(e)) => {
            return Err(Fail::new(format!(
                "--cwd {d} is relative and execctl's own directory is unreadable ({e}); give an absolute path"
            )))
        }
        (None, Ok(here)) => here,
        (None, Err(e)) => {
            warn(&format!(
                "execctl's working directory is unreadable ({e}); the command runs in the daemon's"
            ));
            return Ok(None);
        }
    };
    match dir.to_str() {
        Some(s) => Ok(Some(s.to_string())),
        None => Err(Fail::new(format!(
            "the directory {} is not valid UTF-8; pass one with --cwd",
            dir.display()
        ))),
    }
}

/// `NAME=value` or `NAME` (execctl's own value, skipped when unset, as docker does).
fn env_item(item: &str, origin: &str, out: &mut Vec<(String, String)>) -> Res<()> {
    let (name, value) = match item.split_once('=') {
        Some((k, v)) => (k, Some(v.to_string())),
        None => (item, None),
    };
    if name.is_empty() || name.contains(char::is_whitespace) {
        return Err(Fail::usage(format!(
            "{origin}: {item:?} is not NAME=value or NAME"
        )));
    }
    let value = match value {
        Some(v) => v,
        None => match std::env::var(name) {
            Ok(v) => v,
            Err(_) => return Ok(()),
        },
    };
    out.retain(|(k, _)| k != name);
    out.push((name.to_string(), value));
    Ok(())
}

/// The variables of `--env-file`s, then of `--env`s (later ones win).
fn env_vars(files: &[&str], items: &[&str]) -> Res<Vec<(String, String)>> {
    let mut out = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(file).map_err(|e| {
            Fail::new(format!(
                "--env-file {file}: {}",
                crate::wire::rpc::os_error_text(&e)
            ))
        })?;
        for (n, line) in text.lines().enumerate() {
            let line = line.trim_start();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            env_item(line, &format!("{file} line {}", n + 1), &mut out)?;
        }
    }
    for item in items {
        env_item(item, "--env", &mut out)?;
    }
    Ok(out)
}

/// The subscription every foreground command is created with.
fn subscription() -> Value {
    json!({ "lossless": true, "encoding": "base64" })
}

// ---- input -----------------------------------------------------------------------------

/// The stdin chunk the daemon takes in one write: its stdin buffer, at most 32 KiB.
pub(super) fn stdin_chunk(c: &mut Client) -> usize {
    c.call("initialize", json!({"protocolVersion": 1}))
        .ok()
        .and_then(|r| r["limits"]["stdinBuffer"].as_u64())
        .map_or(STDIN_CHUNK, |n| (n as usize).clamp(1, STDIN_CHUNK))
}

/// Writes one chunk to the command's stdin, waiting for room.
pub(super) fn write_chunk(
    c: &mut Client,
    target: &Target,
    data: &[u8],
    eof: bool,
) -> Result<u64, CallError> {
    let mut input = Vec::new();
    base64_encode(&mut input, data);
    let input = String::from_utf8(input).unwrap_or_default();
    let r = match target {
        Target::Terminal { id, session } => c.call(
            "terminal/write",
            json!({"sessionId": session, "terminalId": id, "input": input,
                   "encoding": "base64", "eof": eof, "wait": true}),
        )?,
        Target::Bash { id, session } => c.call(
            "bash/write",
            json!({"session_id": session, "command_id": id, "input": input,
                   "encoding": "base64", "eof": eof, "wait": true}),
        )?,
        // A shell session's running program reads its terminal: Ctrl-D is its end.
        Target::Shell { session, .. } => {
            let mut r = c.call(
                "shell/write",
                json!({"id": session, "input": input, "encoding": "base64"}),
            )?;
            if eof {
                r = c.call("shell/write", json!({"id": session, "input": "\u{4}"}))?;
                r["written"] = json!(data.len());
            }
            r
        }
    };
    Ok(r["written"].as_u64().unwrap_or(0))
}

/// Copies `input` to the command's stdin until its end (then closes the command's stdin
/// when `eof`). Returns the bytes written.
fn copy_input(
    c: &mut Client,
    target: &Target,
    mut input: impl Read,
    eof: bool,
) -> Result<u64, CallError> {
    let mut buf = vec![0u8; stdin_chunk(c)];
    let mut total = 0;
    loop {
        let n = match input.read(&mut buf) {
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => {
                warn(&format!("reading stdin: {e}; closing the command's stdin"));
                0
            }
        };
        if n == 0 {
            if eof {
                write_chunk(c, target, &[], true)?;
            }
            return Ok(total);
        }
        total += write_chunk(c, target, &buf[..n], false)?;
    }
}

/// Forwards execctl's stdin to the command on a thread of its own, then closes it.
fn forward_stdin(ctx: &Ctx, target: &Target) {
    let ctx = ctx.clone();
    let target = target.clone();
    std::thread::spawn(move || {
        let Ok(mut c) = ctx.connect() else { return };
        if let Err(e) = copy_input(&mut c, &target, io::stdin().lock(), true) {
            // The command exited or closed its stdin: what it did not read is moot.
            if !matches!(e.code(), Some(-32000 | -32002)) {
                warn(&format!(
                    "stdin not forwarded to {}: {}",
                    target.id(),
                    daemon_error(e, Some(target.id())).text(ctx.verbose)
                ));
            }
        }
    });
}

// ---- output ----------------------------------------------------------------------------

/// Where a foreground command's output goes, and what was seen of it.
pub(super) struct OutputSink {
    id: String,
    /// `--json`: output is collected for the final object instead of printed.
    collect: bool,
    kept: [Vec<u8>; 2],
    decoder: Decoder,
    /// Bytes that never arrived (`Gap`s, or offsets that jumped).
    lost: u64,
    /// stdout failed: nothing more is written to it.
    stdout_closed: bool,
    /// Said once when the command waits for input (`terminal_hint`).
    pub(super) hint: Option<String>,
    /// A command on execctl's terminal (`-t`, `attach`): the modes its output turned on,
    /// which a detach turns off again.
    pub(super) modes: Option<super::modes::Modes>,
}

impl OutputSink {
    pub(super) fn new(id: &str, collect: bool) -> OutputSink {
        OutputSink {
            id: id.to_string(),
            collect,
            kept: [Vec::new(), Vec::new()],
            decoder: Decoder::new(id),
            lost: 0,
            stdout_closed: false,
            hint: None,
            modes: None,
        }
    }

    /// What turns off the terminal modes the command turned on (nothing when it was not
    /// on execctl's terminal).
    pub(super) fn reset_modes(&self) -> Vec<u8> {
        self.modes
            .as_ref()
            .map(super::modes::Modes::reset)
            .unwrap_or_default()
    }

    /// Follows output from these offsets on (what came before was shown otherwise).
    pub(super) fn starting_at(mut self, next: [u64; 2]) -> OutputSink {
        self.decoder.next = next;
        self
    }

    fn put(&mut self, stream: usize, bytes: &[u8], killer: &Killer) {
        if self.collect {
            self.kept[stream].extend_from_slice(bytes);
            return;
        }
        if stream == 1 {
            // A closed stderr is nobody's concern but the reader's.
            let _ = output::write_stderr(bytes);
            return;
        }
        if self.stdout_closed {
            return;
        }
        if let Some(m) = &mut self.modes {
            m.feed(bytes);
        }
        if let Err(e) = output::write_stdout(bytes) {
            self.stdout_closed = true;
            if e.kind() != io::ErrorKind::BrokenPipe {
                warn(&format!("cannot write to standard output: {e}"));
            }
            killer.trigger(Reason::OutputClosed);
        }
    }

    fn lose(&mut self, stream: &str, offset: u64, skipped: u64) {
        self.lost += skipped;
        warn(&format!(
            "{skipped} bytes of {}'s {stream} were lost at offset {offset} (execd dropped them to stay within its output memory)",
            self.id
        ));
    }

    /// Handles one message; returns the `Exit` payload when it is the exit.
    fn event(&mut self, msg: &Value, killer: &Killer) -> Option<Value> {
        for d in self.decoder.decode(msg) {
            match d {
                Decoded::Bytes { stream, bytes, .. } => self.put(stream, &bytes, killer),
                Decoded::Lost {
                    name,
                    offset,
                    skipped,
                    ..
                } => self.lose(&name, offset, skipped),
                Decoded::Garbled { .. } => warn(&format!(
                    "execd sent output of {} that is not base64; skipped",
                    self.id
                )),
                Decoded::Exit(payload) => return Some(payload),
                Decoded::Input(true) => {
                    if let Some(h) = self.hint.take() {
                        warn(&h);
                    }
                }
                Decoded::Input(false) | Decoded::Nothing => {}
            }
        }
        None
    }
}

/// How a foreground command ended, as execctl saw it.
pub(super) enum RunEnd {
    Exit {
        payload: Value,
        reason: Option<Reason>,
    },
    /// `--wait` passed with the command still running.
    StillRunning,
}

/// Reads events until the command's `Exit`. At `deadline`, a `--timeout` kills the
/// command (and reading goes on); a `--wait` returns with it still running.
pub(super) fn follow(
    c: &mut Client,
    sink: &mut OutputSink,
    killer: &Killer,
    mut deadline: Option<(Instant, bool)>,
) -> Res<RunEnd> {
    loop {
        let wait = deadline.map(|(at, _)| {
            at.saturating_duration_since(Instant::now())
                .max(Duration::from_millis(1))
        });
        match c.next_notification(wait) {
            Ok(msg) => {
                if let Some(payload) = sink.event(&msg, killer) {
                    return Ok(RunEnd::Exit {
                        payload,
                        reason: killer.reason(),
                    });
                }
            }
            Err(CallError::Io(e)) if is_timeout(&e) => match deadline.take() {
                Some((_, true)) => killer.trigger(Reason::Timeout),
                Some((_, false)) => return Ok(RunEnd::StillRunning),
                None => {}
            },
            Err(e) => return Err(daemon_error(e, Some(&sink.id))),
        }
    }
}

/// The state word of an `Exit` payload: exited, killed or timed_out.
fn exit_state(payload: &Value) -> &'static str {
    match payload["status"].as_str() {
        Some("timed_out") => "timed_out",
        Some("killed") => "killed",
        _ if !payload["signal"].is_null() => "killed",
        _ => "exited",
    }
}

/// What to say when execd ended the command and execctl did not ask: its `Exit` says
/// why (`reason`). Without it, a daemon's shutdown looked like the command's own SIGTERM.
fn ended_by_daemon(ctx: &Ctx, id: &str, payload: &Value) -> Option<String> {
    let daemon = ctx.host.describe();
    let how = match &payload["signal"] {
        Value::String(s) => format!(" ({s})"),
        _ => String::new(),
    };
    Some(match payload["reason"].as_str()? {
        "shutdown" => format!("{daemon} shut down and killed {id}{how}"),
        "session close" => format!("{id} was killed{how}: its session was closed"),
        "release" => format!("{id} was killed{how}: it was released"),
        "request" => format!("{id} was killed{how} (execctl kill, from elsewhere)"),
        other => format!("{id} was killed{how} by execd ({other})"),
    })
}

/// The exit status, the messages around it, and the `--json` object.
fn finish(ctx: &Ctx, target: &Target, sink: &OutputSink, ended: &RunEnd, o: &Common) -> Res<u8> {
    let timeout = o.timeout;
    let (kind, session) = (target.kind(), target.session());
    let id = target.id();
    let mut obj = json!({"id": id, "kind": kind, "session": session});
    let code = match ended {
        RunEnd::StillRunning => {
            obj["status"] = json!("running");
            if !ctx.json {
                let how = if o.tty.is_some() { "attach" } else { "logs -f" };
                warn(&format!(
                    "{id} is still running in session {session}; follow it with: execctl {how} {id}"
                ));
            }
            0
        }
        RunEnd::Exit { payload, reason } => {
            obj["status"] = json!(exit_state(payload));
            obj["exit_code"] = payload["exitCode"].clone();
            obj["signal"] = payload["signal"].clone();
            obj["duration_ms"] = payload["durationMs"].clone();
            let after = timeout.map(output::human_duration).unwrap_or_default();
            match reason {
                Some(Reason::Timeout) => {
                    obj["status"] = json!("timed_out");
                    if !ctx.json {
                        warn(&format!("{id} timed out after {after} and was killed"));
                    }
                    EXIT_TIMEOUT
                }
                Some(r @ Reason::OutputClosed) => r.exit_code(),
                // A signal execctl passed on: the command's status says what it did.
                Some(Reason::Signal(_)) | None if payload["status"] == "timed_out" => {
                    if !ctx.json {
                        warn(&format!("{id} timed out after {after} and was killed"));
                    }
                    EXIT_TIMEOUT
                }
                Some(Reason::Signal(_)) => exit_status(&payload["exitCode"], &payload["signal"]),
                None => {
                    if let (false, Some(why)) = (ctx.json, ended_by_daemon(ctx, id, payload)) {
                        warn(&why);
                    }
                    exit_status(&payload["exitCode"], &payload["signal"])
                }
            }
        }
    };
    if sink.lost > 0 {
        obj["lost_bytes"] = json!(sink.lost);
    }
    if ctx.json {
        let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
        match target {
            Target::Terminal { .. } | Target::Shell { .. } => {
                obj["output"] = json!(text(&sink.kept[0]))
            }
            Target::Bash { .. } => {
                obj["stdout"] = json!(text(&sink.kept[0]));
                obj["stderr"] = json!(text(&sink.kept[1]));
            }
        }
        output::print_json(&obj)?;
    }
    // Output that never arrived fails a command that otherwise succeeded.
    Ok(if sink.lost > 0 && code == 0 {
        EXIT_FAILURE
    } else {
        code
    })
}

/// Prints the id of a command started with `--detach`.
fn detached(ctx: &Ctx, target: &Target) -> Res<u8> {
    let (kind, session) = (target.kind(), target.session());
    if ctx.json {
        output::print_json(
            &json!({"id": target.id(), "kind": kind, "session": session, "status": "running"}),
        )?;
    } else {
        output::print(&format!("{}\n", target.id()))?;
    }
    Ok(0)
}

// ---- the subcommands -------------------------------------------------------------------

/// `--sandbox SPEC`: a preset's name, a JSON object, or a file holding one. The daemon
/// checks it (an unknown key or value is its error, naming it).
pub fn sandbox_value(v: &str) -> Res<Value> {
    if v.trim_start().starts_with('{') {
        return serde_json::from_str(v)
            .map_err(|e| Fail::usage(format!("--sandbox: not a JSON object: {e}")));
    }
    if !v.contains('/') && !std::path::Path::new(v).exists() {
        return Ok(json!(v));
    }
    let text = std::fs::read_to_string(v)
        .map_err(|e| Fail::usage(format!("--sandbox: cannot read {v}: {e}")))?;
    serde_json::from_str(&text).map_err(|e| Fail::usage(format!("--sandbox: {v}: not JSON: {e}")))
}

/// `execctl run [OPTIONS] [--] COMMAND [ARGS...]`.
pub fn run(ctx: &Ctx, p: &Args) -> Res<u8> {
    let Some((command, args)) = p.operands.split_first() else {
        return Err(Fail::usage(
            "run needs a command: execctl run [OPTIONS] COMMAND [ARGS...]",
        ));
    };
    let o = common(ctx, p, &["--timeout"])?;
    if o.detach && o.timeout.is_some() {
        return Err(Fail::usage(
            "run --detach cannot enforce --timeout once execctl has gone; use exec --detach --timeout, which the daemon enforces",
        ));
    }
    let limit = p
        .value("--limit")
        .map(|v| {
            parse_size(v).map_err(|e| Fail::usage(format!("--limit: {e}; give bytes or 64K, 4M")))
        })
        .transpose()?;
    tty_json(ctx, &o)?;
    let killer = Killer::new(ctx);
    let on_tty = foreground_signals(ctx, &o, &killer);
    let mut c = ctx.connect()?;
    let session = format!("execctl-{}", std::process::id());
    let env: Vec<Value> = o
        .env
        .iter()
        .map(|(k, v)| json!({"name": k, "value": v}))
        .collect();
    let mut params = json!({"sessionId": session, "command": command, "args": args, "env": env});
    if let Some(d) = &o.cwd {
        params["cwd"] = json!(d);
    }
    if let Some(l) = limit {
        params["outputByteLimit"] = json!(l);
    }
    params["_meta"] = if o.detach {
        json!({"execd": {"stdin": o.stdin_pipe}})
    } else {
        json!({"execd": {"subscribe": subscription(), "stdin": o.stdin_pipe,
                         "killOnDisconnect": true}})
    };
    if let Some(v) = p.value("--sandbox") {
        params["_meta"]["execd"]["sandbox"] = sandbox_value(v)?;
    }
    if let Some(t) = &o.tty {
        t.request(&mut params["_meta"]["execd"]);
        // A -t command outlives execctl: a detach leaves it running, and so does a lost
        // execctl (SIGKILL, a broken link), for attach to come back to.
        params["_meta"]["execd"]["killOnDisconnect"] = json!(false);
    }
    let created = match create(&mut c, "terminal/create", params, &killer) {
        Ok(r) => r,
        Err(e) if e.code() == Some(-32800) => {
            return Ok(killer.reason().map_or(EXIT_FAILURE, Reason::exit_code))
        }
        Err(e) => return Err(daemon_error(e, Some(command))),
    };
    let id = created["terminalId"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let target = Target::Terminal {
        id: id.clone(),
        session: session.clone(),
    };
    if o.detach {
        return detached(ctx, &target);
    }
    killer.set_target(target.clone());
    let release = |c: &mut Client| {
        let _ = c.call(
            "terminal/release",
            json!({"sessionId": session, "terminalId": id}),
        );
    };
    let raw = match &on_tty {
        Some(s) => match s.begin(&target, &c) {
            Ok(raw) => Some(raw),
            Err(f) => {
                release(&mut c);
                return Err(f);
            }
        },
        None => None,
    };
    if o.forward_stdin {
        forward_stdin(ctx, &target);
    }
    let mut sink = OutputSink::new(&id, ctx.json);
    sink.hint = terminal_hint(&o, command);
    if o.tty.is_some() {
        sink.modes = Some(super::modes::Modes::default());
    }
    let deadline = o.timeout.map(|t| (Instant::now() + t, true));
    let ended = follow(&mut c, &mut sink, &killer, deadline);
    drop(raw);
    if let Some(code) = on_tty.and_then(|s| s.detached(&target, &sink.reset_modes())) {
        return Ok(code);
    }
    let ended = ended?;
    release(&mut c);
    finish(ctx, &target, &sink, &ended, &o)
}

/// `execctl exec [OPTIONS] [--] 'SHELL LINE'`.
pub fn exec(ctx: &Ctx, p: &Args) -> Res<u8> {
    let line = p.operands.join(" ");
    if line.trim().is_empty() {
        return Err(Fail::usage(
            "exec needs a shell line: execctl exec [OPTIONS] 'LINE'",
        ));
    }
    let o = common(ctx, p, &["--timeout", "--hard-timeout"])?;
    let soft = match p.value("--wait") {
        Some(v) => seconds("--wait", v)?,
        None => None,
    };
    if o.detach && soft.is_some() {
        return Err(Fail::usage(
            "--wait and --detach do not go together: --detach returns at once",
        ));
    }
    tty_json(ctx, &o)?;
    let killer = Killer::new(ctx);
    let on_tty = foreground_signals(ctx, &o, &killer);
    let mut c = ctx.connect()?;
    let env: Map<String, Value> = o.env.iter().map(|(k, v)| (k.clone(), json!(v))).collect();
    let mut params = json!({"command": line, "env": env, "async_mode": true});
    let own_session = p.value("--session").is_none();
    if let Some(s) = p.value("--session") {
        params["session_id"] = json!(s);
    }
    if let Some(d) = &o.cwd {
        params["exec_dir"] = json!(d);
    }
    if let Some(t) = o.timeout {
        params["hard_timeout"] = json!(t.as_secs_f64());
    }
    if let Some(v) = p.value("--sandbox") {
        params["sandbox"] = sandbox_value(v)?;
    }
    if !o.detach {
        params["subscribe"] = subscription();
    }
    if let Some(t) = &o.tty {
        t.request(&mut params);
    }
    // `--wait` returns with the command still running, on purpose: only a command
    // followed to its end dies with execctl. A -t command outlives execctl too: a
    // detach leaves it running, and so does a lost terminal (attach comes back).
    if !o.detach && soft.is_none() && o.tty.is_none() {
        params["kill_on_disconnect"] = json!(true);
    }
    let r = match create(&mut c, "bash/exec", params, &killer) {
        Ok(r) => r,
        Err(e) if e.code() == Some(-32800) => {
            return Ok(killer.reason().map_or(EXIT_FAILURE, Reason::exit_code))
        }
        Err(e) => return Err(daemon_error(e, None)),
    };
    let id = r["command_id"].as_str().unwrap_or_default().to_string();
    let session = r["session_id"].as_str().unwrap_or_default().to_string();
    // The session named was closed by the daemon and made again (PROTOCOL 8).
    if let (Some(n), false) = (r["notice"].as_str(), ctx.json) {
        warn(n);
    }
    let target = Target::Bash {
        id: id.clone(),
        session: session.clone(),
    };
    let close_stdin = |c: &mut Client| {
        // On a PTY, EOF is a Ctrl-D typed: never sent for the user.
        if o.tty.is_some() {
            return;
        }
        // Answered or refused (already exited): either way nothing waits on it.
        let _ = c.send(
            "bash/write",
            json!({"session_id": session, "command_id": id, "input": "", "eof": true}),
        );
    };
    if o.detach {
        if !o.stdin_pipe {
            close_stdin(&mut c);
        }
        return detached(ctx, &target);
    }
    killer.set_target(target.clone());
    let raw = match &on_tty {
        Some(s) => match s.begin(&target, &c) {
            Ok(raw) => Some(raw),
            Err(f) => {
                let _ = c.call(
                    "bash/kill",
                    json!({"session_id": session, "command_id": id, "signal": "SIGKILL"}),
                );
                return Err(f);
            }
        },
        None => None,
    };
    if o.forward_stdin {
        forward_stdin(ctx, &target);
    } else if !o.no_terminal {
        close_stdin(&mut c);
    }
    let mut sink = OutputSink::new(&id, ctx.json);
    sink.hint = terminal_hint(&o, &line);
    if o.tty.is_some() {
        sink.modes = Some(super::modes::Modes::default());
    }
    let deadline = soft.map(|t| (Instant::now() + t, false));
    let ended = follow(&mut c, &mut sink, &killer, deadline);
    drop(raw);
    if let Some(code) = on_tty.and_then(|s| s.detached(&target, &sink.reset_modes())) {
        return Ok(code);
    }
    let ended = ended?;
    match ended {
        RunEnd::StillRunning => close_stdin(&mut c),
        // A session made for this one command goes with it.
        RunEnd::Exit { .. } if own_session => {
            let _ = c.call("bash/sessions/close", json!({"session_id": session}));
        }
        RunEnd::Exit { .. } => {}
    }
    finish(ctx, &target, &sink, &ended, &o)
}

/// `execctl write [--eof] ID [TEXT]`.
pub fn write(ctx: &Ctx, p: &Args) -> Res<u8> {
    let (id, text) = match p.operands.as_slice() {
        [id] => (id, None),
        [id, text] => (id, Some(text)),
        [] => {
            return Err(Fail::usage(
                "write needs a process id: execctl write [--eof] ID [TEXT]",
            ))
        }
        _ => {
            return Err(Fail::usage(
                "write takes one id and at most one TEXT; quote TEXT that has spaces",
            ))
        }
    };
    let eof = p.has("--eof");
    let mut c = ctx.connect()?;
    let (target, _) = connect::locate(&mut c, id)?;
    let written = match text {
        Some(t) => copy_input(&mut c, &target, t.as_bytes(), eof),
        None => copy_input(&mut c, &target, io::stdin().lock(), eof),
    }
    .map_err(|e| match e {
        // Exited, stdin closed, or never had one: say what takes input.
        CallError::Rpc {
            code: -32000,
            ref message,
            ..
        } => {
            let detail = errors::detail(&e);
            Fail {
                rpc: detail,
                ..Fail::new(format!(
                    "{message}; only a running command with an open stdin takes input (start one with execctl run -d -i or exec -d -i)"
                ))
            }
        }
        other => daemon_error(other, Some(id)),
    })?;
    if ctx.json {
        output::print_json(&json!({"id": id, "written": written, "eof": eof}))?;
    }
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn env_items_and_files() {
        let dir = std::env::temp_dir().join(format!("execctl-env-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let file = dir.join("env");
        std::fs::write(
            &file,
            "# comment\n\nA=1\nB=two words\nPATH\nEXECCTL_SURELY_UNSET_VAR\n",
        )
        .expect("write");
        let f = file.to_str().expect("utf-8");
        let env = env_vars(&[f], &["A=3", "C=x=y"]).expect("parses");
        let get = |k: &str| env.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
        assert_eq!(get("A"), Some("3"), "later wins");
        assert_eq!(get("B"), Some("two words"));
        assert_eq!(get("C"), Some("x=y"));
        assert_eq!(get("PATH").map(str::to_string), std::env::var("PATH").ok());
        assert_eq!(get("EXECCTL_SURELY_UNSET_VAR"), None);
        assert!(env_vars(&[], &["=x"]).is_err());
        assert!(env_vars(&["/nonexistent/env"], &[]).is_err());
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn sink_counts_gaps_and_skips_repeats() {
        let killer = Killer::new(&Ctx {
            host: super::super::connect::Host::Local("/nonexistent".into()),
            tried: Vec::new(),
            json: true,
            verbose: false,
        });
        let mut sink = OutputSink::new("cmd_1", true);
        let ev = |kind: &str, payload: Value| json!({"jsonrpc": "2.0", "method": "event", "params": {"type": kind, "payload": payload}});
        let out = |offset: u64, text: &[u8]| {
            let mut b = Vec::new();
            base64_encode(&mut b, text);
            ev(
                "Output",
                json!({"id": "cmd_1", "stream": "stdout", "offset": offset,
                                "data": String::from_utf8(b).expect("ascii")}),
            )
        };
        assert!(sink.event(&out(0, b"abc"), &killer).is_none());
        assert!(sink.event(&out(1, b"bcd"), &killer).is_none());
        assert!(sink
            .event(
                &ev(
                    "Gap",
                    json!({"id": "cmd_1", "stream": "stdout", "offset": 4, "skipped": 10})
                ),
                &killer
            )
            .is_none());
        assert!(sink.event(&out(14, b"\xff\x00"), &killer).is_none());
        assert!(
            sink.event(&out(20, b"z"), &killer).is_none(),
            "a jump is a loss too"
        );
        assert_eq!(sink.kept[0], b"abcd\xff\x00z");
        assert_eq!(sink.lost, 14);
        // Other ids and other messages are not ours.
        assert!(sink
            .event(
                &out(0, b"x")
                    .to_string()
                    .replace("cmd_1", "cmd_2")
                    .parse::<Value>()
                    .expect("json"),
                &killer
            )
            .is_none());
        let exit = sink.event(&ev("Exit", json!({"id": "cmd_1", "exitCode": 0})), &killer);
        assert_eq!(exit.map(|e| e["exitCode"].clone()), Some(json!(0)));
    }
}
