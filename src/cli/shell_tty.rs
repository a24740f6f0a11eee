//! `execctl shell [ID]` on a terminal (stdin and stdout both one): the session's shell at
//! execctl's terminal as `ssh -t` puts a remote one there (PROTOCOL 12.2, 12.4), with
//! every command line still a `shell/exec` the daemon's gate judges.
//!
//! - The terminal is raw from the start to the end (`tty::Raw`, put back on every way
//!   out), and execctl is in one of two modes, which follow the session:
//!   - At the prompt, execctl edits the line with the daemon's own editor for sessions
//!     (`core::shell::editor`, the one a browser's terminal types into: echo, cursor
//!     moves, Backspace, Delete, Ctrl-U/K/W, Up/Down over the lines sent from here;
//!     Ctrl-C drops the line; Ctrl-L clears the screen; Ctrl-D on an empty line leaves)
//!     and sends it on Enter as `shell/exec {async_mode}`. The daemon refuses `shell/write` at the
//!     prompt by design, so nothing typed there reaches the shell except a line the gate
//!     judged; a refused line is said in one line and the prompt shown again.
//!   - While a command runs, every key goes to it byte for byte (`shell/write`, base64,
//!     no Enter added): Ctrl-C is 0x03, which the session's PTY turns into SIGINT for
//!     its foreground job, and full-screen programs get their keys. The session's PTY
//!     echoes what a program does not read raw, so nothing shows twice. The command is
//!     over when `shell/wait` says so (a waiter thread per command); keys the daemon
//!     refuses because it has just ended are the prompt's. A line refused because a
//!     command of someone else's runs in the session makes execctl follow that one.
//! - Output: the session's terminal's raw bytes, prompts and escapes as the shell wrote
//!   them (a lossless base64 subscription to its shell process), followed to the next
//!   shell when one dies (an `exit` typed).
//! - Window size: `shell/resize` at the start and on every SIGWINCH.
//! - Leaving: Ctrl-D at the prompt (0), Ctrl-\ at any time (0: a program never gets it),
//!   SIGTERM or SIGHUP (128+N): the terminal is put back and the session goes on, a
//!   running command too (`execctl shell ID` comes back to it). A SIGINT from elsewhere
//!   interrupts the running command (`shell/kill`). The daemon gone, or the session
//!   closed from elsewhere: the terminal put back, one line saying so (125, 0).
//!
//! - A paste larger than the daemon's input buffer never holds up the keyboard: keys for
//!   the running command go at once while the daemon takes them; once its buffer is
//!   full they are queued, and a sender thread sends them in order as the program reads.
//!   The main thread goes on reading, so Ctrl-\ leaves at once, and a Ctrl-C typed while
//!   keys wait drops them and interrupts the command (`shell/kill`) instead of waiting
//!   behind them.
//!
//! Threads: the main thread reads keys, edits and sends lines, and queues keys; the
//! sender sends the queued keys; the output thread writes the terminal's bytes; a waiter
//! per command; the signal thread resizes, makes the terminal raw again after SIGCONT
//! and leaves on SIGTERM or SIGHUP. Each has a connection of its own. Threads other than
//! the main one leave with `leave`.

use std::collections::VecDeque;
use std::io::{self, Read, Write};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use serde_json::{json, Value};

use super::connect::Ctx;
use super::errors::{daemon_error, Fail, Res, EXIT_FAILURE};
use super::events::{Decoded, Decoder};
use super::output::warn;
use super::run::stdin_chunk;
use super::shell::next_shell;
use super::tty::{self, Raw};
use crate::client::{CallError, Client};
use crate::core::shell::editor::{Done as EditorDone, Editor};
use crate::wire::encode::base64_encode;

/// Ctrl-\ leaves execctl, whatever runs (it is never sent to a program).
const LEAVE_KEY: u8 = 0x1c;
/// Ctrl-C: a key like others, unless keys wait to be sent (see `Outbox`).
const INTERRUPT_KEY: u8 = 0x03;

/// How long a key waits between tries while the daemon's input buffer is full.
const INPUT_RETRY: Duration = Duration::from_millis(20);

// ---- the line at the prompt ------------------------------------------------------------

/// What a key at the prompt ended in, besides what it showed.
#[derive(Debug, PartialEq)]
pub enum Done {
    /// Enter: the line to run.
    Line(String),
    /// Ctrl-C: the line is dropped.
    Cancelled,
    /// Ctrl-D on an empty line.
    Eof,
    /// Ctrl-\.
    Leave,
    /// Ctrl-L: clear the screen, show the prompt and the line again.
    Clear,
}

/// A line typed at the prompt, edited by the daemon's own line editor for sessions
/// (`core::shell::editor`, PROTOCOL 12.5: the keys a browser's terminal gets), with the
/// two keys only execctl has: Ctrl-D on an empty line leaves, Ctrl-\ leaves at any time.
/// Up and Down walk the lines sent from this execctl (the session's bash reads its
/// commands from a socket, so it keeps no history of its own to ask).
#[derive(Debug, Default)]
pub struct LineEditor {
    editor: Editor,
    history: Vec<String>,
}

impl LineEditor {
    /// Takes typed `keys` until one ends the line: what they show is added to `echo`;
    /// returns how many bytes were taken and, when one ended the line, how. The bytes of a
    /// character split across reads are left (not taken) until the rest comes; a byte
    /// that can begin no character is dropped.
    pub fn keys(&mut self, keys: &[u8], echo: &mut Vec<u8>) -> (usize, Option<Done>) {
        let (text, skip) = match std::str::from_utf8(keys) {
            Ok(text) => (text, 0),
            Err(e) => {
                let valid = e.valid_up_to();
                let text = std::str::from_utf8(&keys[..valid]).unwrap_or_default();
                (text, e.error_len().unwrap_or(0))
            }
        };
        let history: Vec<&str> = self.history.iter().map(String::as_str).collect();
        for (i, c) in text.char_indices() {
            let used = i + c.len_utf8();
            match c {
                '\u{1c}' => return (used, Some(Done::Leave)),
                '\u{04}' if self.editor.is_empty() => return (used, Some(Done::Eof)),
                _ => {}
            }
            let (_, done) = self.editor.feed(&text[i..used], &history, echo);
            let done = match done {
                None => continue,
                Some(EditorDone::Line(line)) => {
                    if !line.contains('\n')
                        && !line.trim().is_empty()
                        && self.history.last() != Some(&line)
                    {
                        self.history.push(line.clone());
                    }
                    Done::Line(line)
                }
                Some(EditorDone::Cancelled) => Done::Cancelled,
                Some(EditorDone::Clear) => Done::Clear,
            };
            return (used, Some(done));
        }
        (text.len() + skip, None)
    }

    /// Shows the line being edited (after the prompt was shown again).
    pub fn show(&self, echo: &mut Vec<u8>) {
        self.editor.show(echo);
    }
}

// ---- the session on the terminal -------------------------------------------------------

/// Where the session is, as execctl follows it.
#[derive(Default)]
struct Following {
    /// A command runs: keys are its.
    running: bool,
    /// Commands followed so far: the waiter of an earlier one changes nothing.
    generation: u64,
}

/// How one write of keys went.
enum Sent {
    Yes,
    /// No command runs any more.
    Ended,
    /// The daemon's input buffer is full.
    Full,
}

/// Keys read for the running command and not sent yet.
#[derive(Default)]
struct Outbox {
    queue: VecDeque<u8>,
    /// The sender holds keys it could not send yet (the daemon's buffer is full).
    busy: bool,
    /// A Ctrl-C dropped what waited: the sender gives up the keys it holds.
    dropped: bool,
    /// Keys the daemon refused because the command had just ended: the prompt's, taken
    /// by the main thread with the next key read.
    returned: Vec<u8>,
}

/// The session at execctl's terminal.
struct Term {
    ctx: Ctx,
    sid: String,
    mode: Mutex<Following>,
    /// The size last given to the session's terminal.
    size: Mutex<Option<(u16, u16)>>,
    outbox: Mutex<Outbox>,
    /// The sender waits on it for keys.
    queued: Condvar,
}

/// What `shell` found of the session before the terminal went raw.
pub struct Start {
    pub sid: String,
    /// Its shell process, followed from `from` on.
    pub process: String,
    pub from: u64,
    /// The prompt to show first (the shell showed it before execctl came).
    pub prompt: String,
    /// A command of the session runs already.
    pub running: Option<String>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Writes bytes to the terminal at once.
fn show(bytes: &[u8]) {
    let mut out = io::stdout().lock();
    let _ = out.write_all(bytes);
    let _ = out.flush();
}

/// One line on stderr while the terminal is raw (which does not turn `\n` into `\r\n`).
fn say(text: &str) {
    let _ = super::output::write_stderr(format!("execctl: {text}\r\n").as_bytes());
}

/// Ends execctl from any thread: the terminal put back, then `note` on a line of its own.
fn leave(code: u8, note: Option<&str>) -> ! {
    tty::restore();
    if let Some(note) = note {
        let _ = super::output::write_stderr(format!("\r\nexecctl: {note}\n").as_bytes());
    }
    std::process::exit(i32::from(code))
}

/// `execctl shell` on a terminal, from `start` on; `c` is the main thread's connection.
pub fn run(ctx: &Ctx, c: &mut Client, start: Start) -> Res<u8> {
    let t = Arc::new(Term {
        ctx: ctx.clone(),
        sid: start.sid.clone(),
        mode: Mutex::new(Following::default()),
        size: Mutex::new(None),
        outbox: Mutex::new(Outbox::default()),
        queued: Condvar::new(),
    });
    let sid = &start.sid;
    warn(&format!(
        "shell session {sid}: lines run at the prompt, keys go to the running command; \
         Ctrl-D at the prompt or Ctrl-\\ leaves (the session stays: execctl shell {sid})"
    ));
    // Signals first: from here on, whatever ends execctl puts the terminal back.
    t.watch_signals();
    let raw = Raw::enter()?;
    t.resize(c);
    t.follow(&start.process, start.from);
    t.send_queued();
    match &start.running {
        Some(command) => {
            say(&format!(
                "{command:?} runs in session {sid}: your keys go to it (Ctrl-C interrupts it)"
            ));
            t.begin();
        }
        None => show(start.prompt.as_bytes()),
    }
    let code = t.read_keys(c);
    drop(raw);
    code
}

impl Term {
    fn running(&self) -> bool {
        lock(&self.mode).running
    }

    /// A command runs from now on; a waiter says when it is over.
    fn begin(self: &Arc<Term>) {
        let generation = {
            let mut m = lock(&self.mode);
            m.running = true;
            m.generation += 1;
            m.generation
        };
        let t = self.clone();
        std::thread::spawn(move || {
            if let Ok(mut c) = t.ctx.connect() {
                loop {
                    match c.call("shell/wait", json!({ "id": t.sid, "seconds": 30 })) {
                        Ok(r) if r["status"] == "running" => {}
                        _ => break,
                    }
                }
            }
            t.ended(generation);
        });
    }

    /// Command `generation` (if it is still the one followed) is over: the prompt's turn.
    fn ended(&self, generation: u64) {
        let mut m = lock(&self.mode);
        if m.generation == generation {
            m.running = false;
        }
    }

    /// Shows the session's prompt again (after an empty line, Ctrl-C, a refused line).
    fn reprompt(&self, c: &mut Client) -> Res<()> {
        let v = c
            .call("shell/view", json!({ "id": self.sid }))
            .map_err(|e| daemon_error(e, Some(&self.sid)))?;
        show(v["prompt"].as_str().unwrap_or_default().as_bytes());
        Ok(())
    }

    /// Reads keys until execctl leaves: its exit status.
    fn read_keys(self: &Arc<Term>, c: &mut Client) -> Res<u8> {
        let mut editor = LineEditor::default();
        let mut buf = vec![0u8; stdin_chunk(c)];
        let mut stdin = io::stdin().lock();
        loop {
            let n = match stdin.read(&mut buf) {
                // The terminal is gone (hung up): so is its user.
                Ok(0) => return Ok(0),
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => return Ok(0),
            };
            let mut keys = std::mem::take(&mut lock(&self.outbox).returned);
            keys.extend_from_slice(&buf[..n]);
            while !keys.is_empty() {
                if self.running() {
                    let cut = keys.iter().position(|&b| b == LEAVE_KEY);
                    if !self.queue_keys(c, &keys[..cut.unwrap_or(keys.len())])? {
                        // It has just ended: these keys are the prompt's.
                        lock(&self.mode).running = false;
                        continue;
                    }
                    if cut.is_some() {
                        return Ok(self.left());
                    }
                    keys.clear();
                    continue;
                }
                let mut echo = Vec::new();
                let (used, done) = editor.keys(&keys, &mut echo);
                show(&echo);
                keys.drain(..used);
                match done {
                    // The first bytes of a character: the rest comes with the next read.
                    None if used == 0 => {
                        lock(&self.outbox).returned = std::mem::take(&mut keys);
                    }
                    None => {}
                    Some(Done::Clear) => {
                        show(b"\x1b[H\x1b[2J");
                        self.reprompt(c)?;
                        let mut line = Vec::new();
                        editor.show(&mut line);
                        show(&line);
                    }
                    Some(Done::Line(line)) => self.submit(c, &line)?,
                    Some(Done::Cancelled) => self.reprompt(c)?,
                    Some(Done::Eof) => {
                        show(b"\r\n");
                        return Ok(0);
                    }
                    Some(Done::Leave) => return Ok(self.left()),
                }
            }
        }
    }

    /// Ctrl-\: the session goes on without execctl.
    fn left(&self) -> u8 {
        tty::restore();
        let sid = &self.sid;
        let _ = super::output::write_stderr(
            format!("\r\nexecctl: left shell session {sid}; it goes on (execctl shell {sid})\n")
                .as_bytes(),
        );
        0
    }

    /// Runs a line typed at the prompt: `shell/exec`, through the gate.
    fn submit(self: &Arc<Term>, c: &mut Client, line: &str) -> Res<()> {
        if line.trim().is_empty() {
            return self.reprompt(c);
        }
        let r = c.call(
            "shell/exec",
            json!({ "id": self.sid, "command": line, "async_mode": true }),
        );
        match r {
            Ok(_) => self.begin(),
            Err(e @ CallError::Io(_)) => return Err(daemon_error(e, Some(&self.sid))),
            Err(e) => {
                // Someone else's command runs there (an agent's): follow it.
                let theirs = match &e {
                    CallError::Rpc {
                        code: -32000, data, ..
                    } => data
                        .as_ref()
                        .and_then(|d| d["command"].as_str())
                        .map(String::from),
                    _ => None,
                };
                say(&daemon_error(e, Some(&self.sid)).text(self.ctx.verbose));
                match theirs {
                    Some(command) => {
                        say(&format!("your keys go to {command:?} until it ends"));
                        self.begin();
                    }
                    None => self.reprompt(c)?,
                }
            }
        }
        Ok(())
    }

    /// Keys for the running command: sent now when nothing waits before them, else (or
    /// when the daemon's buffer is full) queued for the sender. A Ctrl-C while keys wait
    /// drops them and interrupts the command at once: behind a paste the program does not
    /// read, it would wait as long as they do. `false` when the command has just ended:
    /// the keys are then the prompt's.
    fn queue_keys(self: &Arc<Term>, c: &mut Client, keys: &[u8]) -> Res<bool> {
        if keys.is_empty() {
            return Ok(true);
        }
        let waiting = {
            let o = lock(&self.outbox);
            o.busy || !o.queue.is_empty()
        };
        if !waiting {
            match self.write_keys(c, keys)? {
                Sent::Yes => return Ok(true),
                Sent::Ended => return Ok(false),
                Sent::Full => {
                    let mut o = lock(&self.outbox);
                    o.queue.extend(keys);
                    self.queued.notify_one();
                    return Ok(true);
                }
            }
        }
        let mut o = lock(&self.outbox);
        for &b in keys {
            if b == INTERRUPT_KEY && (o.busy || !o.queue.is_empty()) {
                o.queue.clear();
                o.dropped = true;
                let t = self.clone();
                std::thread::spawn(move || {
                    if let Ok(mut c) = t.ctx.connect() {
                        let _ = c.call("shell/kill", json!({ "id": t.sid }));
                    }
                });
                continue;
            }
            o.queue.push_back(b);
        }
        self.queued.notify_one();
        Ok(true)
    }

    /// The sender thread: sends queued keys in order, as the daemon's input buffer takes
    /// them. Keys refused because the command has just ended go back to the prompt.
    fn send_queued(self: &Arc<Term>) {
        let t = self.clone();
        std::thread::spawn(move || {
            let mut c = match t.ctx.connect() {
                Ok(c) => c,
                Err(f) => leave(f.code, Some(&f.text(t.ctx.verbose))),
            };
            let chunk = stdin_chunk(&mut c);
            loop {
                let keys: Vec<u8> = {
                    let mut o = lock(&t.outbox);
                    while o.queue.is_empty() {
                        o = t.queued.wait(o).unwrap_or_else(|p| p.into_inner());
                    }
                    let n = o.queue.len().min(chunk);
                    o.busy = true;
                    o.dropped = false;
                    o.queue.drain(..n).collect()
                };
                let sent = t.send_keys(&mut c, &keys);
                let mut o = lock(&t.outbox);
                o.busy = false;
                match sent {
                    Ok(true) => {}
                    Ok(false) => {
                        // It has just ended: these keys, and what waited, are the
                        // prompt's.
                        lock(&t.mode).running = false;
                        let mut rest: Vec<u8> = o.queue.drain(..).collect();
                        let mut back = keys;
                        back.append(&mut rest);
                        o.returned.extend_from_slice(&back);
                    }
                    Err(f) => {
                        drop(o);
                        leave(f.code, Some(&f.text(t.ctx.verbose)));
                    }
                }
            }
        });
    }

    /// Sends keys to the running command in one try.
    fn write_keys(&self, c: &mut Client, keys: &[u8]) -> Res<Sent> {
        let mut input = Vec::new();
        base64_encode(&mut input, keys);
        let input = String::from_utf8(input).unwrap_or_default();
        let r = c.call(
            "shell/write",
            json!({ "id": self.sid, "input": input, "encoding": "base64",
                    "press_enter": false }),
        );
        match r {
            Ok(_) => Ok(Sent::Yes),
            Err(e) if e.code() == Some(-32000) => Ok(Sent::Ended),
            // The daemon's input buffer is full (a paste): it drains as the program reads.
            Err(e) if e.code() == Some(-32003) => Ok(Sent::Full),
            Err(e @ CallError::Io(_)) => Err(daemon_error(e, Some(&self.sid))),
            Err(e) => {
                say(&format!(
                    "keys not sent: {}",
                    daemon_error(e, Some(&self.sid)).text(self.ctx.verbose)
                ));
                Ok(Sent::Yes)
            }
        }
    }

    /// Sends keys to the running command, trying again while the daemon's buffer is full
    /// (unless a Ctrl-C dropped them); `false` when there is none (it has ended).
    fn send_keys(&self, c: &mut Client, keys: &[u8]) -> Res<bool> {
        loop {
            if lock(&self.outbox).dropped {
                return Ok(true);
            }
            match self.write_keys(c, keys)? {
                Sent::Yes => return Ok(true),
                Sent::Ended => return Ok(false),
                Sent::Full => std::thread::sleep(INPUT_RETRY),
            }
        }
    }

    /// Gives the session's terminal execctl's size, when it changed.
    fn resize(&self, c: &mut Client) {
        let Some(now) = tty::own_size() else { return };
        {
            let mut size = lock(&self.size);
            if *size == Some(now) {
                return;
            }
            *size = Some(now);
        }
        let (rows, cols) = now;
        // Refused (an older daemon): programs see the session's own size, nothing worse.
        let _ = c.call(
            "shell/resize",
            json!({ "id": self.sid, "rows": rows, "cols": cols }),
        );
    }

    /// SIGWINCH resizes, SIGCONT makes the terminal raw again (the shell that stopped
    /// execctl may have reset it), SIGINT (from elsewhere: Ctrl-C is a key here)
    /// interrupts the running command, SIGTERM and SIGHUP leave the session as it is.
    fn watch_signals(self: &Arc<Term>) {
        use signal_hook::consts::{SIGCONT, SIGHUP, SIGINT, SIGTERM, SIGWINCH};
        let mut signals =
            match signal_hook::iterator::Signals::new([SIGINT, SIGHUP, SIGTERM, SIGWINCH, SIGCONT])
            {
                Ok(s) => s,
                Err(e) => {
                    warn(&format!(
                        "cannot watch for signals ({e}); the session will not follow resizes"
                    ));
                    return;
                }
            };
        let t = self.clone();
        std::thread::spawn(move || {
            let mut c = None;
            for sig in signals.forever() {
                match sig {
                    SIGCONT => Raw::again(),
                    SIGWINCH | SIGINT => {
                        if c.is_none() {
                            c = t.ctx.connect().ok();
                        }
                        let Some(conn) = c.as_mut() else { continue };
                        if sig == SIGWINCH {
                            t.resize(conn);
                        } else {
                            // Asked whatever execctl's mode says (the command may have
                            // just started, or be someone else's); at the prompt the
                            // daemon answers that nothing runs.
                            let _ = conn.call("shell/kill", json!({ "id": t.sid }));
                        }
                    }
                    _ => {
                        let sid = &t.sid;
                        leave(
                            128 + sig as u8,
                            Some(&format!(
                                "left shell session {sid}; it goes on (execctl shell {sid})"
                            )),
                        );
                    }
                }
            }
        });
    }

    /// Writes the session's terminal to stdout from `from` on, following it to its next
    /// shell when one dies; leaves when the daemon goes or the session is closed.
    fn follow(self: &Arc<Term>, process: &str, from: u64) {
        let (t, mut process, mut from) = (self.clone(), process.to_string(), from);
        std::thread::spawn(move || loop {
            let mut c = match t.ctx.connect() {
                Ok(c) => c,
                Err(f) => leave(f.code, Some(&f.text(t.ctx.verbose))),
            };
            let sub = c.call(
                "events/subscribe",
                json!({ "id": process, "offset": from, "lossless": true, "encoding": "base64" }),
            );
            match sub {
                Ok(_) => t.copy_output(&mut c, &process, from),
                // Its shell is gone already: the next one is looked for below.
                Err(e) if e.code() == Some(-32002) => {}
                Err(e) => t.gone(e),
            }
            match next_shell(&mut c, &t.sid, &process) {
                Some(next) => {
                    if let Ok(v) = c.call("shell/view", json!({ "id": t.sid })) {
                        if let Some(n) = v["notice"].as_str() {
                            say(n.trim_start_matches("[execd: ").trim_end_matches(']'));
                        }
                    }
                    process = next;
                    from = 0;
                }
                None => t.closed(&mut c),
            }
        });
    }

    /// Copies the shell's output events to stdout until its `Exit`.
    fn copy_output(&self, c: &mut Client, process: &str, from: u64) {
        let mut decoder = Decoder::new(process);
        decoder.next = [from, 0];
        loop {
            let m = match c.next_notification(None) {
                Ok(m) => m,
                Err(e) => self.gone(e),
            };
            for d in decoder.decode(&m) {
                match d {
                    Decoded::Bytes { bytes, .. } => show(&bytes),
                    Decoded::Exit(_) => return,
                    Decoded::Lost { skipped, .. } => say(&format!(
                        "{skipped} bytes of the session's output were lost"
                    )),
                    Decoded::Garbled { .. } | Decoded::Input(_) | Decoded::Nothing => {}
                }
            }
        }
    }

    /// The daemon's connection failed: execctl leaves, saying why.
    fn gone(&self, e: CallError) -> ! {
        let f: Fail = daemon_error(e, Some(&self.sid));
        leave(EXIT_FAILURE, Some(&f.text(self.ctx.verbose)))
    }

    /// The session has no shell any more: closed from elsewhere, or failed.
    fn closed(&self, c: &mut Client) -> ! {
        let sid = &self.sid;
        let failed = c
            .call("shell/sessions", json!({}))
            .ok()
            .and_then(|l| l["sessions"].get(sid).map(|s| s["failed"].clone()));
        match failed {
            Some(Value::String(why)) => leave(
                EXIT_FAILURE,
                Some(&format!("shell session {sid} failed: {why}")),
            ),
            Some(_) => leave(
                EXIT_FAILURE,
                Some(&format!("the shell of session {sid} did not come back")),
            ),
            None => leave(0, Some(&format!("shell session {sid} was closed"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `keys` in one read: what was echoed, and how the line ended.
    fn typed(e: &mut LineEditor, keys: &[u8]) -> (String, Option<Done>) {
        let mut echo = Vec::new();
        let mut rest = keys;
        while !rest.is_empty() {
            let (used, done) = e.keys(rest, &mut echo);
            rest = &rest[used..];
            if done.is_some() || used == 0 {
                return (String::from_utf8_lossy(&echo).into_owned(), done);
            }
        }
        (String::from_utf8_lossy(&echo).into_owned(), None)
    }

    #[test]
    fn a_line_is_echoed_and_sent_on_enter() {
        let mut e = LineEditor::default();
        assert_eq!(
            typed(&mut e, b"echo hi\r"),
            ("echo hi\r\n".into(), Some(Done::Line("echo hi".into())))
        );
        // A newline is Enter too (a paste, a test typing "\n").
        assert_eq!(
            typed(&mut e, b"pwd\n"),
            ("pwd\r\n".into(), Some(Done::Line("pwd".into())))
        );
        assert_eq!(
            typed(&mut e, b"\r"),
            ("\r\n".into(), Some(Done::Line(String::new())))
        );
    }

    #[test]
    fn the_keys_are_the_daemons_editors() {
        let mut e = LineEditor::default();
        let (_, done) = typed(&mut e, b"lss\x7f -l\r");
        assert_eq!(done, Some(Done::Line("ls -l".into())));
        let (_, done) = typed(&mut e, b"rm -rf /\x15echo ok\r");
        assert_eq!(done, Some(Done::Line("echo ok".into())));
        let (_, done) = typed(&mut e, b"git push  \x17\x17status\r");
        assert_eq!(done, Some(Done::Line("status".into())));
        // Cursor moves, which the cooked-terminal editor execctl had did not make.
        let (_, done) = typed(&mut e, b"cho x\x1b[H\x01e\x05y\r");
        assert_eq!(done, Some(Done::Line("echo xy".into())));
        // Up walks the lines sent from here, newest first.
        let (_, done) = typed(&mut e, b"\x1b[A\x1b[A\r");
        assert_eq!(done, Some(Done::Line("status".into())));
        let (_, done) = typed(&mut e, b"\x0c");
        assert_eq!(done, Some(Done::Clear));
    }

    #[test]
    fn ctrl_c_drops_the_line_ctrl_d_leaves_only_an_empty_one() {
        let mut e = LineEditor::default();
        assert_eq!(
            typed(&mut e, b"sleep 9\x03"),
            ("sleep 9^C\r\n".into(), Some(Done::Cancelled))
        );
        assert_eq!(
            typed(&mut e, b"true\r"),
            ("true\r\n".into(), Some(Done::Line("true".into())))
        );
        // Ctrl-D on a line erases under the cursor (nothing, at its end): no leaving.
        assert_eq!(typed(&mut e, b"x\x04").1, None);
        assert_eq!(typed(&mut e, b"\x7f\x04").1, Some(Done::Eof));
        assert_eq!(typed(&mut e, b"abc\x1c").1, Some(Done::Leave));
    }

    #[test]
    fn a_character_split_across_reads_waits_for_its_rest() {
        let mut e = LineEditor::default();
        let mut echo = Vec::new();
        let bytes = "é\r".as_bytes();
        assert_eq!(e.keys(&bytes[..1], &mut echo), (0, None));
        let mut all = bytes[..1].to_vec();
        all.extend_from_slice(&bytes[1..]);
        let (_, done) = typed(&mut e, &all);
        assert_eq!(done, Some(Done::Line("é".into())));
        // A byte no character begins with is dropped.
        let (_, done) = typed(&mut e, b"a\xffb\r");
        assert_eq!(done, Some(Done::Line("ab".into())));
    }
}
