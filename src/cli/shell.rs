//! `execctl shell [ID]`: a shell session (PROTOCOL 12.2) at execctl's terminal, line by
//! line.
//!
//! - A line typed at the prompt is a `shell/exec` of the session, so it passes the gate
//!   like any command; while a command runs, a line typed goes to it as input
//!   (`shell/write`, with Enter), and Ctrl-C interrupts it (`shell/kill`). At the prompt
//!   Ctrl-C does nothing and Ctrl-D leaves: the session goes on (`execctl sessions close
//!   ID` ends it, and `execctl shell ID` comes back to it).
//! - What the shell's terminal shows, prompts included, is printed as plain text as it
//!   comes: an `events/subscribe` of the session's shell process, followed to the next
//!   shell when one dies and the session starts another.
//! - From a pipe or a file, every line is a command, run to its end before the next is
//!   read; execctl then exits with the last one's exit code, as `bash < script` would.
//!
//! This is the line-mode client. A raw-mode terminal (keys sent one by one, window size,
//! as `execctl run -t` does for one command) is not used here: a program that echoes
//! what it reads shows a line twice, and full-screen programs are not for this client.
//!
//! Threads: the main thread reads stdin and sends commands and input; one thread prints
//! the terminal's output; one waits for each command's end; one turns Ctrl-C into a kill.
//! Each has a connection of its own.

use std::io::{self, BufRead, IsTerminal, Write};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use serde_json::json;

use super::args::Args;
use super::connect::Ctx;
use super::errors::{Fail, Res};
use super::output::warn;
use crate::client::Client;

/// How long a shell that died may take to be replaced before execctl stops following it.
const RESTART_WAIT: Duration = Duration::from_secs(10);

/// Whether a command of ours runs, and how the last one ended; and, for the end of a
/// script, whether the output thread has printed what came before (`synced`).
#[derive(Default)]
struct Foreground {
    running: bool,
    last_exit: Option<i64>,
    sync: Sync,
}

/// The main thread asks the output thread to print everything the daemon sent so far.
#[derive(Default, PartialEq)]
enum Sync {
    #[default]
    Idle,
    Asked,
    Done,
}

type Shared = Arc<(Mutex<Foreground>, Condvar)>;

fn lock(s: &Shared) -> std::sync::MutexGuard<'_, Foreground> {
    s.0.lock().unwrap_or_else(|p| p.into_inner())
}

/// `execctl shell [ID] [--cwd DIR]`.
pub fn shell(ctx: &Ctx, p: &Args) -> Res<u8> {
    let id = match p.operands.as_slice() {
        [] => None,
        [id] => Some(id.clone()),
        _ => return Err(Fail::usage("shell takes at most one session id")),
    };
    enter(ctx, id, p.value("--cwd"), p.value("--sandbox"))
}

/// Session `id` (a new one when `None`, in `cwd`, in `sandbox` when named) at execctl's terminal, or fed lines
/// from stdin (`execctl shell`, and `execctl attach` of a session's shell).
pub fn enter(ctx: &Ctx, id: Option<String>, cwd: Option<&str>, sandbox: Option<&str>) -> Res<u8> {
    let mut c = ctx.connect()?;
    let mut params = json!({});
    if let Some(id) = &id {
        params["id"] = id.clone().into();
    }
    let existed = match &id {
        Some(id) => c
            .call("shell/sessions", json!({}))?
            .get("sessions")
            .and_then(|m| m.get(id))
            .is_some(),
        None => false,
    };
    if !existed {
        if let Some(dir) = super::run::work_dir(cwd)? {
            params["exec_dir"] = dir.into();
        }
    }
    // A session's sandbox is fixed when it is made; the daemon refuses another.
    if let Some(v) = sandbox {
        params["sandbox"] = super::run::sandbox_value(v)?;
    }
    let s = c.call("shell/sessions/create", params)?;
    let sid = s["session_id"].as_str().unwrap_or_default().to_string();
    // The session named was closed by the daemon and made again (PROTOCOL 8).
    if let Some(n) = s["notice"].as_str() {
        warn(n);
    }
    if io::stdin().is_terminal() && io::stdout().is_terminal() {
        return on_terminal(ctx, &mut c, &s, existed);
    }
    let interactive = io::stdin().is_terminal();
    if interactive {
        warn(&format!(
            "shell session {sid}: a line runs as a command, or goes to the running one as \
             input; Ctrl-C interrupts it, Ctrl-D leaves (the session stays: execctl sessions \
             close {sid})"
        ));
    }
    // An existing session shows its prompt again and what comes next; a new one shows
    // all its shell printed (its first prompt).
    let (from, prompt) = if existed {
        let v = c.call("shell/view", json!({ "id": sid }))?;
        (
            s["output_bytes"].as_u64().unwrap_or(0),
            v["prompt"].as_str().unwrap_or_default().to_string(),
        )
    } else {
        (0, String::new())
    };
    print_text(&prompt);
    let shared: Shared = Arc::default();
    follow_output(
        ctx,
        &sid,
        s["process_id"].as_str().unwrap_or_default(),
        from,
        &shared,
    );
    watch_interrupts(ctx, &sid, &shared);
    let stdin = io::stdin();
    let mut lines = stdin.lock();
    let mut line = String::new();
    loop {
        line.clear();
        match lines.read_line(&mut line) {
            Ok(0) => break,
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(Fail::new(format!("reading stdin: {e}"))),
        }
        let text = line.strip_suffix('\n').unwrap_or(&line);
        let text = text.strip_suffix('\r').unwrap_or(text);
        if lock(&shared).running {
            let r = c.call(
                "shell/write",
                json!({ "id": sid, "input": text, "press_enter": true }),
            );
            match r {
                Ok(_) => continue,
                // It ended meanwhile: the line is a command after all.
                Err(e) if e.code() == Some(-32000) => {}
                Err(e) => {
                    warn(&Fail::from(e).text(ctx.verbose));
                    continue;
                }
            }
        }
        if text.trim().is_empty() {
            reprompt(&mut c, &sid);
            continue;
        }
        let r = c.call(
            "shell/exec",
            json!({ "id": sid, "command": text, "async_mode": true }),
        );
        match r {
            Ok(_) => {
                lock(&shared).running = true;
                wait_for_end(ctx, &sid, &shared);
            }
            Err(e) => {
                warn(&Fail::from(e).text(ctx.verbose));
                reprompt(&mut c, &sid);
                continue;
            }
        }
        if !interactive {
            // From a script: each line runs to its end before the next is read.
            let mut r = lock(&shared);
            while r.running {
                r = shared.1.wait(r).unwrap_or_else(|p| p.into_inner());
            }
        }
    }
    if interactive {
        print_text("\n");
        return Ok(0);
    }
    let mut r = lock(&shared);
    while r.running {
        r = shared.1.wait(r).unwrap_or_else(|p| p.into_inner());
    }
    // What the last command printed reaches stdout before execctl exits: the output
    // thread asks the daemon something on its own connection, whose answer follows every
    // event sent before it.
    r.sync = Sync::Asked;
    let deadline = Instant::now() + SYNC_WAIT;
    while r.sync != Sync::Done && Instant::now() < deadline {
        r = shared
            .1
            .wait_timeout(r, SYNC_TICK)
            .map(|(g, _)| g)
            .unwrap_or_else(|p| p.into_inner().0);
    }
    Ok(r.last_exit.map_or(0, |c| c.clamp(0, 255) as u8))
}

/// The terminal client (`shell_tty`), from the session as `shell/sessions/create`
/// answered: a new one is shown from its first byte (its first prompt); an existing one
/// from now, its prompt shown again, or its running command followed.
fn on_terminal(ctx: &Ctx, c: &mut Client, s: &serde_json::Value, existed: bool) -> Res<u8> {
    let sid = s["session_id"].as_str().unwrap_or_default().to_string();
    let mut start = super::shell_tty::Start {
        sid: sid.clone(),
        process: s["process_id"].as_str().unwrap_or_default().to_string(),
        from: 0,
        prompt: String::new(),
        running: None,
    };
    if existed {
        let v = c.call("shell/view", json!({ "id": sid }))?;
        start.from = s["output_bytes"].as_u64().unwrap_or(0);
        if v["status"] == "running" {
            start.running = Some(v["command"].as_str().unwrap_or_default().to_string());
        } else {
            start.prompt = v["prompt"].as_str().unwrap_or_default().to_string();
        }
    }
    super::shell_tty::run(ctx, c, start)
}

/// How long execctl waits at the end of a script for the output to be printed.
const SYNC_WAIT: Duration = Duration::from_secs(5);
/// How often the output thread looks whether it was asked to sync.
const SYNC_TICK: Duration = Duration::from_millis(50);

/// Writes text to stdout at once (a prompt has no newline to flush it).
fn print_text(text: &str) {
    let mut out = io::stdout().lock();
    let _ = out.write_all(text.as_bytes());
    let _ = out.flush();
}

/// Shows the session's prompt again (after an empty line or a refused one).
fn reprompt(c: &mut Client, sid: &str) {
    if let Ok(v) = c.call("shell/view", json!({ "id": sid })) {
        print_text(v["prompt"].as_str().unwrap_or_default());
    }
}

/// Prints the session's terminal as plain text from `from` on, following the session to
/// its next shell when one dies; syncs when the main thread asks.
fn follow_output(ctx: &Ctx, sid: &str, process: &str, from: u64, shared: &Shared) {
    let (ctx, sid, mut process) = (ctx.clone(), sid.to_string(), process.to_string());
    let shared = shared.clone();
    std::thread::spawn(move || {
        let mut from = from;
        loop {
            let Ok(mut c) = ctx.connect() else { return };
            if c.call("events/subscribe", json!({ "id": process, "offset": from }))
                .is_err()
            {
                return;
            }
            loop {
                let m = match c.next_notification(Some(SYNC_TICK)) {
                    Ok(m) => Some(m),
                    Err(crate::client::CallError::Io(e)) if crate::client::is_timeout(&e) => None,
                    Err(_) => return,
                };
                if m.as_ref().is_some_and(|m| shown(m, &process)) {
                    break; // its shell exited
                }
                if m.is_none() && lock(&shared).sync == Sync::Asked {
                    // The answer follows every event sent before it: those read while
                    // waiting for it are queued, and printed now.
                    let _ = c.call("shell/view", json!({ "id": sid }));
                    let mut ended = false;
                    while let Ok(m) = c.next_notification(Some(Duration::from_millis(1))) {
                        ended |= shown(&m, &process);
                    }
                    lock(&shared).sync = Sync::Done;
                    shared.1.notify_all();
                    if ended {
                        break;
                    }
                }
            }
            // Its shell died: the session starts another, which is followed from its start.
            let Some(next) = next_shell(&mut c, &sid, &process) else {
                return;
            };
            if let Ok(v) = c.call("shell/view", json!({ "id": sid })) {
                if let Some(n) = v["notice"].as_str() {
                    warn(n.trim_start_matches("[execd: ").trim_end_matches(']'));
                }
            }
            process = next;
            from = 0;
        }
    });
}

/// Prints an `Output` event of `process`; whether `m` is its `Exit`.
fn shown(m: &serde_json::Value, process: &str) -> bool {
    let payload = &m["params"]["payload"];
    if payload["id"] != process {
        return false;
    }
    match m["params"]["type"].as_str() {
        Some("Output") => {
            print_text(payload["data"].as_str().unwrap_or_default());
            false
        }
        Some("Exit") => true,
        _ => false,
    }
}

/// The session's shell process once it is another than `old` (bounded).
pub(super) fn next_shell(c: &mut Client, sid: &str, old: &str) -> Option<String> {
    let deadline = Instant::now() + RESTART_WAIT;
    while Instant::now() < deadline {
        let l = c.call("shell/sessions", json!({})).ok()?;
        let s = l["sessions"].get(sid)?;
        if let Some(p) = s["process_id"].as_str().filter(|p| *p != old) {
            return Some(p.to_string());
        }
        if !s["failed"].is_null() {
            return None;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    None
}

/// Waits, on a connection of its own, for the running command to end.
fn wait_for_end(ctx: &Ctx, sid: &str, shared: &Shared) {
    let (ctx, sid, shared) = (ctx.clone(), sid.to_string(), shared.clone());
    std::thread::spawn(move || {
        let mut exit = None;
        if let Ok(mut c) = ctx.connect() {
            loop {
                match c.call("shell/wait", json!({ "id": sid, "seconds": 30 })) {
                    Ok(r) if r["status"] == "running" => {}
                    Ok(r) => {
                        exit = r["exit_code"].as_i64();
                        break;
                    }
                    Err(_) => break,
                }
            }
        }
        let mut r = lock(&shared);
        r.running = false;
        r.last_exit = exit;
        shared.1.notify_all();
    });
}

/// Ctrl-C interrupts the running command (at the prompt it does nothing); SIGTERM and
/// SIGHUP end execctl, leaving the session as it is.
fn watch_interrupts(ctx: &Ctx, sid: &str, shared: &Shared) {
    use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
    let Ok(mut signals) = signal_hook::iterator::Signals::new([SIGINT, SIGHUP, SIGTERM]) else {
        warn("cannot watch for Ctrl-C: interrupting execctl ends it, not the command");
        return;
    };
    let (ctx, sid, shared) = (ctx.clone(), sid.to_string(), shared.clone());
    std::thread::spawn(move || {
        for sig in signals.forever() {
            if sig != SIGINT {
                std::process::exit(128 + sig);
            }
            if !lock(&shared).running {
                continue;
            }
            if let Ok(mut c) = ctx.connect() {
                let _ = c.call("shell/kill", json!({ "id": sid }));
            }
        }
    });
}
