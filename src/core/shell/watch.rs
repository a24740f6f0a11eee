//! People at a shell session (PROTOCOL 12.5): the connections watching it (`/v1/shell/ws`),
//! the one line editor they share at its prompt, and what they see: the terminal's output
//! without execd's markers, with the editor's echo and the lines `exec` runs shown after
//! the prompt, as one stream (`Effect::Show`) and as a screen (a terminal emulator fed that
//! stream, for a watcher that comes later and for screen frames).
//!
//! - Keys: at the prompt they go to the editor; a line ended with Enter goes to the gate as
//!   a `shell/exec` line of the peer that pressed it (`Effect::Line`; the loop calls the
//!   method, so the gate, the audit and the approvals are the ones every line passes).
//!   Keys after an Enter wait (the rest of a multi-line paste) until the next prompt,
//!   where each line is gated on its own. While a command runs, keys are its input;
//!   Ctrl-C then also drops what waits (as a terminal flushes its input on an interrupt).
//! - The screen is fed lazily: the stream since it was last brought up to date is kept
//!   (the last `UNFED_MAX` bytes of it) and fed when someone looks, so a session that
//!   streams a flood costs a copy per read, not an emulator's work per byte. A flood past
//!   `UNFED_MAX` between two looks shows its last part, from a line start.
//!
//! Invariants:
//! - `Show` never carries a marker (every `ESC ] 6973 ; ... BEL`, whatever its nonce, is
//!   dropped, however the bytes were split) nor half a character.
//! - A watcher is a connection of the session's owner; when it closes it is forgotten,
//!   with the keys it left waiting. A session with a watcher is in use (not idle).
//! - A desk (what the people of a session share) lives from the first watcher to the
//!   session's end; its memory (screen and unfed bytes) counts against the owner's
//!   output budget.

use std::collections::VecDeque;

use serde_json::Value;

use super::editor::{Done, Editor};
use super::markers::{BEL, MARK, MARK_MAX};
use super::{Phase, ShellSession};
use crate::core::screen::Screen;
use crate::core::table::{ConnId, SessionKey};
use crate::core::vocab::Via;
use crate::core::{Core, Effect};
use crate::types::WinSize;
use crate::wire::rpc::RpcError;

/// The most of the stream kept unfed to the screen.
pub const UNFED_MAX: usize = 64 << 10;
/// How much of what came since the screen's last look is fed to it, in screenfuls of
/// cells (a full-screen program's redraw, escapes included, fits).
const SCREENFULS: usize = 4;
/// The most bytes of keys waiting for the next prompt, per session.
pub const QUEUED_MAX: usize = 64 << 10;

/// One watcher of a session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Watcher {
    pub conn: ConnId,
    /// It takes screen frames rather than the raw stream.
    pub screen: bool,
}

/// What the people of one session share.
#[derive(Debug)]
pub struct Desk {
    pub watchers: Vec<Watcher>,
    pub editor: Editor,
    /// A line ended with Enter by this connection is with the gate or an approver: keys
    /// wait until it is answered.
    pub judging: Option<ConnId>,
    /// Keys typed after an Enter, with who typed them, for the next prompt.
    queue: VecDeque<(ConnId, String)>,
    queued: usize,
    strip: Strip,
    /// The end of the output that is not a whole character yet.
    tail: Vec<u8>,
    screen: Screen,
    /// The stream not fed to the screen yet; `cut` when its front was dropped.
    unfed: Vec<u8>,
    cut: bool,
    /// Bytes counted against the owner's output memory.
    bytes: usize,
}

/// Drops execd's markers from a terminal's output, across reads.
#[derive(Debug, Default)]
struct Strip {
    /// Bytes that may begin a marker (`ESC`, `ESC ]`, ... up to `MARK`), held back.
    held: Vec<u8>,
    /// Inside a marker (its `MARK` seen): dropping until BEL; how many bytes so far.
    inside: Option<usize>,
}

impl Strip {
    fn feed(&mut self, data: &[u8], out: &mut Vec<u8>) {
        let mut i = 0;
        while i < data.len() {
            if let Some(n) = self.inside.as_mut() {
                match data[i..].iter().position(|&b| b == BEL) {
                    Some(p) => {
                        self.inside = None;
                        i += p + 1;
                    }
                    None => {
                        *n += data.len() - i;
                        if *n > MARK_MAX {
                            self.inside = None; // not one of ours after all: shown from here
                        }
                        return;
                    }
                }
                continue;
            }
            if self.held.is_empty() {
                match data[i..].iter().position(|&b| b == 0x1b) {
                    Some(p) => {
                        out.extend_from_slice(&data[i..i + p]);
                        self.held.push(0x1b);
                        i += p + 1;
                    }
                    None => {
                        out.extend_from_slice(&data[i..]);
                        return;
                    }
                }
                continue;
            }
            let b = data[i];
            if b == MARK[self.held.len()] {
                self.held.push(b);
                i += 1;
                if self.held.len() == MARK.len() {
                    self.held.clear();
                    self.inside = Some(0);
                }
            } else {
                // Not a marker: what was held is output, and this byte is looked at again.
                out.append(&mut self.held);
            }
        }
    }
}

/// Appends `bytes` to `tail` and takes the whole characters off its front as text (bytes
/// that are no character become U+FFFD); an incomplete character at the end stays.
fn whole_text(tail: &mut Vec<u8>, bytes: &[u8]) -> String {
    tail.extend_from_slice(bytes);
    let mut text = String::new();
    let mut rest: &[u8] = tail;
    loop {
        match std::str::from_utf8(rest) {
            Ok(s) => {
                text.push_str(s);
                rest = &[];
                break;
            }
            Err(e) => {
                let (good, bad) = rest.split_at(e.valid_up_to());
                text.push_str(std::str::from_utf8(good).unwrap_or_default());
                match e.error_len() {
                    Some(n) => {
                        text.push('\u{fffd}');
                        rest = &bad[n..];
                    }
                    None => {
                        rest = bad;
                        break;
                    }
                }
            }
        }
    }
    let keep = rest.to_vec();
    *tail = keep;
    text
}

impl Desk {
    /// Adds `text` to what the screen has not seen, keeping the last `UNFED_MAX` bytes.
    fn unfed(&mut self, text: &[u8]) {
        self.unfed.extend_from_slice(text);
        if self.unfed.len() > UNFED_MAX {
            let drop = self.unfed.len() - UNFED_MAX / 2;
            self.unfed.drain(..drop);
            self.cut = true;
        }
    }

    /// Brings the screen up to date. What came since the last look beyond a few
    /// screenfuls (a flood) is passed over: its last screenfuls, from a line start, are
    /// what a terminal would show after it.
    fn sync(&mut self) {
        let size = self.screen.size();
        let keep = (SCREENFULS * usize::from(size.rows) * usize::from(size.cols)).max(4096);
        let mut from = 0;
        if self.unfed.len() > keep {
            from = self.unfed.len() - keep;
            self.cut = true;
        }
        if std::mem::take(&mut self.cut) {
            // The front was dropped: start at a line, not inside an escape sequence.
            from += self.unfed[from..]
                .iter()
                .position(|&b| b == b'\n')
                .map_or(self.unfed.len() - from, |p| p + 1);
        }
        self.screen.feed(&self.unfed[from..]);
        self.unfed.clear();
    }
}

/// What a refused line shows at the prompt.
pub fn refusal_text(e: &RpcError) -> String {
    let data = e.data.as_ref();
    let field = |f: &str| data.and_then(|d| d.get(f)).and_then(Value::as_str);
    match e.code {
        crate::wire::rpc::DENIED => {
            let rule = field("rule").unwrap_or("?");
            match field("justification") {
                Some(j) => format!("denied by rule {rule}: {j}"),
                None => format!("denied by rule {rule}"),
            }
        }
        crate::wire::rpc::NOT_APPROVED => {
            let rule = field("rule").unwrap_or("?");
            let reason = field("reason").unwrap_or("rejected");
            match field("feedback") {
                Some(f) => format!("not approved (rule {rule}): {reason}: {f}"),
                None => format!("not approved (rule {rule}): {reason}"),
            }
        }
        _ => format!("execd: {}", e.message),
    }
}

/// Where keys go now.
enum Keys {
    /// The editor, at the prompt.
    Edit,
    /// The running command.
    Program,
    /// Nowhere yet: they wait for the next prompt.
    Wait,
}

fn keys_go(s: &ShellSession, d: &Desk) -> Keys {
    if d.judging.is_some() || !d.queue.is_empty() {
        return Keys::Wait;
    }
    match s.current() {
        Some(_) => Keys::Program,
        None if s.phase == Phase::Prompt => Keys::Edit,
        None => Keys::Wait,
    }
}

/// The session's history as the editor walks it: its console's lines, oldest first, one
/// line each, a line repeated once.
fn history(s: &ShellSession) -> Vec<&str> {
    let mut h: Vec<&str> = Vec::new();
    for r in &s.records {
        let line = r.command.as_str();
        if !line.contains('\n') && h.last() != Some(&line) {
            h.push(line);
        }
    }
    h
}

impl Core {
    /// Connection `conn` watches session `sk` (its owner's, checked by the caller):
    /// the desk is made on the first watcher, its screen from what the session's terminal
    /// shows. `-32003` when its memory does not fit the owner's budget.
    pub fn watch(&mut self, sk: &SessionKey, conn: ConnId, screen: bool) -> Result<(), RpcError> {
        let Some(size) = self.shells.map.get(sk).map(|s| s.size) else {
            return Err(RpcError::not_found("shell session", &sk.1));
        };
        if !self.shells.people.contains_key(sk) {
            let bytes = Screen::bytes_for(size) + UNFED_MAX;
            self.room_for_record(sk.0, bytes)?;
            let Some(s) = self.shells.map.get(sk) else {
                return Err(RpcError::not_found("shell session", &sk.1));
            };
            let mut desk = Desk {
                watchers: Vec::new(),
                editor: Editor::default(),
                judging: None,
                queue: VecDeque::new(),
                queued: 0,
                strip: Strip::default(),
                tail: Vec::new(),
                screen: Screen::blank(size),
                unfed: Vec::new(),
                cut: false,
                bytes,
            };
            // What its terminal shows now: the last of its output, from a line start.
            if let Some(p) = s.shell.and_then(|k| self.table.get(k)) {
                let ring = &p.streams[0].ring;
                let from = ring
                    .end()
                    .saturating_sub(UNFED_MAX as u64)
                    .max(ring.start());
                let (a, b) = ring.slices(from, ring.end());
                let mut out = Vec::new();
                desk.strip.feed(&[a, b].concat(), &mut out);
                desk.cut = from > ring.start();
                let text = whole_text(&mut desk.tail, &out);
                desk.unfed(text.as_bytes());
                // A marker begun and not finished: the stripper is inside it too.
                if !s.scan.carry().0.is_empty() && desk.strip.inside.is_none() {
                    desk.strip.held.clear();
                    desk.strip.inside = Some(0);
                }
            }
            self.table.memory.add(sk.0, bytes);
            self.shells.people.insert(sk.clone(), desk);
        }
        if let Some(d) = self.shells.people.get_mut(sk) {
            d.watchers.retain(|w| w.conn != conn);
            d.watchers.push(Watcher { conn, screen });
        }
        self.touch_shell(sk);
        Ok(())
    }

    /// Connection `conn` closed: it watches nothing, and its waiting keys are dropped.
    pub fn unwatch(&mut self, conn: ConnId) {
        let mut left = Vec::new();
        for (sk, d) in self.shells.people.iter_mut() {
            let before = d.watchers.len();
            d.watchers.retain(|w| w.conn != conn);
            if d.watchers.len() == before {
                continue;
            }
            d.queue.retain(|(c, _)| *c != conn);
            d.queued = d.queue.iter().map(|(_, k)| k.len()).sum();
            let judged = std::mem::take(&mut d.judging);
            d.judging = judged.filter(|c| *c != conn);
            left.push((sk.clone(), judged == Some(conn)));
        }
        for (sk, replay) in left {
            // It was in use until now: idle from here.
            self.touch_shell(&sk);
            if replay {
                self.replay(&sk);
            }
        }
    }

    /// The watchers of session `sk`.
    pub fn watchers(&self, sk: &SessionKey) -> &[Watcher] {
        self.shells
            .people
            .get(sk)
            .map_or(&[], |d| d.watchers.as_slice())
    }

    /// Whether a person watches session `sk` (it is then in use, never idle).
    pub fn watched(&self, sk: &SessionKey) -> bool {
        !self.watchers(sk).is_empty()
    }

    /// What a watcher that takes the raw stream is sent first: the screen painted.
    pub fn paint(&mut self, sk: &SessionKey) -> Vec<u8> {
        let Some(d) = self.shells.people.get_mut(sk) else {
            return Vec::new();
        };
        d.sync();
        let mut out = d.screen.paint();
        // The line being typed is on the screen already; the cursor is where it was.
        out.shrink_to_fit();
        out
    }

    /// A screen frame for a watcher that has seen `seen` (`Screen::frame`).
    pub fn screen_frame(&mut self, sk: &SessionKey, seen: &mut Vec<u64>) -> Option<Value> {
        let d = self.shells.people.get_mut(sk)?;
        d.sync();
        d.screen.frame(seen)
    }

    /// Shows `bytes` (the daemon's own text: echo, notes) to the people of `sk`.
    pub(super) fn say(&mut self, sk: &SessionKey, bytes: &[u8]) {
        let Some(d) = self.shells.people.get_mut(sk) else {
            return;
        };
        if bytes.is_empty() {
            return;
        }
        d.unfed(bytes);
        if !d.watchers.is_empty() {
            self.out.push(Effect::Show {
                session: sk.clone(),
                text: String::from_utf8_lossy(bytes).into_owned(),
            });
        }
    }

    /// Shows a note on a line of its own, then the prompt and the line being typed.
    fn note(&mut self, sk: &SessionKey, note: &str) {
        let ps1 = self.shells.map.get(sk).map(|s| s.ps1.clone());
        let mut out = Vec::new();
        if !note.is_empty() {
            out.extend_from_slice(note.replace('\n', "\r\n").as_bytes());
            out.extend_from_slice(b"\r\n");
        }
        if let (Some(ps1), Some(d)) = (ps1, self.shells.people.get(sk)) {
            out.extend_from_slice(ps1.as_bytes());
            d.editor.show(&mut out);
        }
        self.say(sk, &out);
    }

    /// The hook on a session's terminal output (before its markers move the session on):
    /// shown to its people without the markers.
    pub(super) fn people_output(&mut self, sk: &SessionKey, data: &[u8]) {
        let Some(d) = self.shells.people.get_mut(sk) else {
            return;
        };
        let mut out = Vec::with_capacity(data.len());
        d.strip.feed(data, &mut out);
        let text = whole_text(&mut d.tail, &out);
        if text.is_empty() {
            return;
        }
        d.unfed(text.as_bytes());
        if !d.watchers.is_empty() {
            self.out.push(Effect::Show {
                session: sk.clone(),
                text,
            });
        }
    }

    /// The hook on a new shell of session `sk` (a restart): its output is a new stream.
    pub(super) fn people_new_shell(&mut self, sk: &SessionKey) {
        if let Some(d) = self.shells.people.get_mut(sk) {
            d.strip = Strip::default();
            d.tail.clear();
        }
    }

    /// The hook on a line sent to the shell: one that did not come from the editor (an
    /// agent's `exec`) is shown after the prompt, as if typed, where the line being typed
    /// was (it comes back at the next prompt).
    pub(super) fn people_line_sent(&mut self, sk: &SessionKey, command: &str, via: Via) {
        let Some(d) = self.shells.people.get(sk) else {
            return;
        };
        if via == Via::Ws {
            return; // typed into the editor: shown as it was typed
        }
        let mut out = Vec::new();
        d.editor.hide(&mut out);
        out.extend_from_slice(command.replace('\n', "\r\n").as_bytes());
        out.extend_from_slice(b"\r\n");
        self.say(sk, &out);
    }

    /// The hook on a prompt of session `sk`: with nothing to run, the line being typed is
    /// shown after it and the keys that waited are typed.
    pub(super) fn people_prompt(&mut self, sk: &SessionKey) {
        let Some((s, d)) = self.shells.map.get(sk).zip(self.shells.people.get(sk)) else {
            return;
        };
        if s.current().is_some() || d.judging.is_some() {
            return;
        }
        let mut out = Vec::new();
        d.editor.show(&mut out);
        self.say(sk, &out);
        self.replay(sk);
    }

    /// The hook on session `sk` closing: its watchers are told and let go.
    pub(super) fn people_gone(&mut self, sk: &SessionKey) {
        let Some(d) = self.shells.people.remove(sk) else {
            return;
        };
        self.table.memory.sub(sk.0, d.bytes);
        for w in d.watchers {
            self.out.push(Effect::Unwatch {
                conn: w.conn,
                code: crate::wire::ws::CLOSE_NORMAL,
                reason: "the shell session was closed".into(),
            });
        }
    }

    /// Keys from watcher `conn` of session `sk` (`{"type":"input"}`).
    pub fn people_keys(&mut self, sk: &SessionKey, conn: ConnId, keys: &str) {
        let Some((s, d)) = self.shells.map.get(sk).zip(self.shells.people.get_mut(sk)) else {
            return;
        };
        if !d.watchers.iter().any(|w| w.conn == conn) {
            return;
        }
        let keys = d.editor.after_enter(keys);
        if keys.is_empty() {
            return;
        }
        match keys_go(s, d) {
            Keys::Edit => self.edit(sk, conn, keys),
            Keys::Program => {
                // What the program does not take is dropped at its end (`finish`).
                let _ = self.shell_write(sk, keys.as_bytes());
            }
            Keys::Wait if keys.contains('\u{03}') => {
                // Ctrl-C: what waits is dropped, a running command interrupted, a line
                // waiting for an approver withdrawn.
                d.queue.clear();
                d.queued = 0;
                let judged = d.judging;
                if s.current().is_some() {
                    let _ = self.shell_write(sk, b"\x03");
                }
                if let Some(c) = judged {
                    self.withdraw_line(sk, c);
                }
            }
            Keys::Wait => {
                if d.queued + keys.len() > QUEUED_MAX {
                    return; // a paste larger than anyone waits for: dropped
                }
                d.queued += keys.len();
                d.queue.push_back((conn, keys.to_string()));
            }
        }
    }

    /// Types `keys` of `conn` into the editor of `sk` (at its prompt): a line ended with
    /// Enter goes to the gate, and the keys after it wait.
    fn edit(&mut self, sk: &SessionKey, conn: ConnId, keys: &str) {
        let mut keys = keys.to_string();
        while !keys.is_empty() {
            let Some((s, d)) = self.shells.map.get(sk).zip(self.shells.people.get_mut(sk)) else {
                return;
            };
            let history = history(s);
            let mut echo = Vec::new();
            let (used, done) = d.editor.feed(&keys, &history, &mut echo);
            let rest = keys.split_off(used);
            self.say(sk, &echo);
            match done {
                None => return,
                Some(Done::Line(line)) if line.trim().is_empty() => self.note(sk, ""),
                Some(Done::Line(line)) => {
                    if let Some(d) = self.shells.people.get_mut(sk) {
                        d.judging = Some(conn);
                        if !rest.is_empty() {
                            d.queued += rest.len();
                            d.queue.push_front((conn, rest));
                        }
                    }
                    self.out.push(Effect::Line {
                        conn,
                        session: sk.clone(),
                        line,
                    });
                    return;
                }
                Some(Done::Cancelled) => self.note(sk, ""),
                Some(Done::Clear) => {
                    self.say(sk, b"\x1b[H\x1b[2J");
                    self.note(sk, "");
                }
            }
            keys = rest;
        }
    }

    /// Types what waited, at a prompt, until a line goes to the gate or nothing waits.
    fn replay(&mut self, sk: &SessionKey) {
        loop {
            let Some((s, d)) = self.shells.map.get(sk).zip(self.shells.people.get_mut(sk)) else {
                return;
            };
            let at_prompt =
                d.judging.is_none() && s.current().is_none() && s.phase == Phase::Prompt;
            if !at_prompt {
                return;
            }
            let Some((conn, keys)) = d.queue.pop_front() else {
                return;
            };
            d.queued = d.queued.saturating_sub(keys.len());
            if d.watchers.iter().any(|w| w.conn == conn) {
                let keys = d.editor.after_enter(&keys).to_string();
                self.edit(sk, conn, &keys);
            }
        }
    }

    /// Withdraws the approval a line of `conn` at session `sk` waits for, if any (its
    /// answer then comes back as not approved: "withdrawn").
    fn withdraw_line(&mut self, sk: &SessionKey, conn: ConnId) {
        let pending: Vec<String> = self
            .approvals
            .pending
            .values()
            .filter(|p| p.conn == conn && p.launch.peer.uid == sk.0)
            .filter(|p| p.launch.family.session_id() == sk.1)
            .map(|p| p.id.clone())
            .collect();
        for id in pending {
            self.resolve_approval(&id, crate::core::vocab::Answer::Reject, "withdrawn", None);
        }
    }

    /// The line watcher `conn` of `sk` sent to the gate was answered: queued to run
    /// (`Ok`), or refused (the reason is shown, then a new prompt and what waited).
    pub fn people_answered(
        &mut self,
        sk: &SessionKey,
        conn: ConnId,
        result: Result<(), &RpcError>,
    ) {
        let Some(d) = self.shells.people.get_mut(sk) else {
            return;
        };
        if d.judging != Some(conn) {
            return;
        }
        d.judging = None;
        match result {
            Ok(()) => {
                // Queued behind nothing: it runs, or ran already; what waits is typed at
                // the prompt after it.
                let idle = self
                    .shells
                    .map
                    .get(sk)
                    .is_some_and(|s| s.current().is_none());
                if idle {
                    self.replay(sk);
                }
            }
            Err(e) => {
                let text = refusal_text(e);
                self.note(sk, &text);
                self.replay(sk);
            }
        }
    }

    /// A line of watcher `conn` went to an approver as approval `id` under `rule`: the
    /// people are told it waits.
    pub fn people_asked(&mut self, conn: ConnId, req: crate::wire::rpc::ReqNo) {
        let found = self
            .approvals
            .pending
            .values()
            .find(|p| p.conn == conn && p.req == Some(req))
            .map(|p| {
                let sk = (p.launch.peer.uid, p.launch.family.session_id().to_string());
                (
                    sk,
                    format!("waiting for approval {} (rule {})", p.id, p.asked.rule),
                )
            });
        if let Some((sk, text)) = found {
            let mut out = text.into_bytes();
            out.extend_from_slice(b"\r\n");
            self.say(&sk, &out);
        }
    }

    /// A watcher resized its window: the session's terminal (and the shell started next)
    /// and its screen take the size.
    pub fn people_resize(&mut self, sk: &SessionKey, size: WinSize) -> Result<(), RpcError> {
        self.shell_resize(sk, size)?;
        if let Some(d) = self.shells.people.get_mut(sk) {
            d.sync();
            let before = Screen::bytes_for(d.screen.size());
            d.screen.resize(size);
            let after = Screen::bytes_for(size);
            d.bytes = d.bytes - before + after;
            if after > before {
                self.table.memory.add(sk.0, after - before);
            } else {
                self.table.memory.sub(sk.0, before - after);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::shell::LineOpts;
    use crate::core::table::{Family, Key, Peer};
    use crate::core::testkit::{self, C1, C2};
    use crate::types::Stdio3;

    const PEER: Peer = Peer {
        uid: 1000,
        gid: 1000,
        pid: 42,
    };

    /// A core with session `s` whose fake shell is at its prompt `u@h:/$ `, watched by C1
    /// (raw) and C2 (screen).
    fn watched() -> (Core, SessionKey, Key) {
        let mut c = testkit::core();
        let key = c
            .open_shell(1000, ("s", false), "/".into(), PEER, (None, false))
            .expect("open");
        let mut req = testkit::request(
            Family::Shell {
                session_id: "s".into(),
            },
            Stdio3::Shell(WinSize::DEFAULT),
        );
        req.ring_capacity = 1 << 16;
        let (k, id) = c.table.next_ids("sh");
        c.started(&req, k, id, 4242, 1000);
        c.tty_path(k, "/dev/pts/7".into());
        c.shell_started(&key, k, None);
        c.output(k, 0, b"old output\r\n");
        c.watch(&key, C1, false).expect("watch");
        c.watch(&key, C2, true).expect("watch");
        prompt(&mut c, &key, k);
        c.out.clear();
        (c, key, k)
    }

    fn mark(c: &Core, key: &SessionKey, body: &str) -> String {
        let (kind, rest) = body.split_at(1);
        format!("\x1b]6973;{kind};{}{rest}\x07", c.shells.map[key].nonce)
    }

    /// The shell's prompt, and where it is answered as the loop reads it (`/`).
    fn prompt(c: &mut Core, key: &SessionKey, k: Key) {
        let text = format!("{}u@h:/$ {}", mark(c, key, "e;0;2f"), mark(c, key, "p"));
        c.output(k, 0, text.as_bytes());
        let mut asked = Vec::new();
        c.out.retain(|e| match e {
            Effect::ShellDir { key, .. } => {
                asked.push(*key);
                false
            }
            _ => true,
        });
        for shell in asked {
            c.shell_dir(shell, Some("/".into()));
        }
    }

    /// What the people were shown since the last look, as one string.
    fn shown(c: &mut Core) -> String {
        let mut text = String::new();
        c.out.retain(|e| match e {
            Effect::Show { text: t, .. } => {
                text.push_str(t);
                false
            }
            _ => true,
        });
        text
    }

    /// The lines sent to the gate since the last look.
    fn lines(c: &mut Core) -> Vec<(ConnId, String)> {
        let mut v = Vec::new();
        c.out.retain(|e| match e {
            Effect::Line { conn, line, .. } => {
                v.push((*conn, line.clone()));
                false
            }
            _ => true,
        });
        v
    }

    /// Runs `line` for the session as the loop would once the gate let it through.
    fn admit(c: &mut Core, key: &SessionKey, line: &str, via: Via) -> u64 {
        c.shell_queue(
            key,
            ("shcmd_1".into(), PEER, ("allow", "default".into()), via),
            line,
            LineOpts::default(),
        )
        .expect("queued")
    }

    #[test]
    fn what_the_shell_prints_is_shown_without_its_markers_and_the_screen_has_it() {
        let (mut c, key, k) = watched();
        let s = mark(&c, &key, "s;7");
        c.output(k, 0, format!("a{s}b\x1b]6973;").as_bytes());
        c.output(k, 0, b"e;xx;0;2f\x07c");
        assert_eq!(shown(&mut c), "abc");
        let mut seen = Vec::new();
        let frame = c.screen_frame(&key, &mut seen).expect("a frame");
        let text: Vec<&str> = frame["lines"]
            .as_array()
            .unwrap()
            .iter()
            .map(|l| l["text"].as_str().unwrap())
            .collect();
        assert_eq!(&text[..2], &["old output", "u@h:/$ abc"]);
        let paint = String::from_utf8(c.paint(&key)).unwrap();
        assert!(
            paint.contains("old output") && !paint.contains("6973"),
            "{paint:?}"
        );
    }

    #[test]
    fn keys_at_the_prompt_are_edited_and_enter_sends_the_line_to_the_gate() {
        let (mut c, key, _) = watched();
        c.people_keys(&key, C1, "ech");
        c.people_keys(&key, C2, "o hi\x7fi");
        assert_eq!(
            shown(&mut c),
            "echo hi\x08 \x08i",
            "every watcher edits the one line"
        );
        c.people_keys(&key, C2, "\r\n");
        assert_eq!(lines(&mut c), vec![(C2, "echo hi".to_string())]);
        assert_eq!(shown(&mut c), "\r\n");
        // A stranger's keys do nothing.
        c.people_keys(&key, ConnId(77), "x");
        assert_eq!(shown(&mut c), "");
    }

    #[test]
    fn a_refused_line_says_why_and_shows_a_new_prompt() {
        let (mut c, key, _) = watched();
        c.people_keys(&key, C1, "git push\r");
        assert_eq!(lines(&mut c).len(), 1);
        shown(&mut c);
        // Keys while it is judged wait.
        c.people_keys(&key, C1, "ls");
        assert_eq!(shown(&mut c), "");
        let e = RpcError::denied("push", Some("pushes leave this machine"));
        c.people_answered(&key, C1, Err(&e));
        assert_eq!(
            shown(&mut c),
            "denied by rule push: pushes leave this machine\r\nu@h:/$ ls"
        );
    }

    #[test]
    fn a_paste_runs_line_by_line_each_at_its_own_prompt() {
        let (mut c, key, k) = watched();
        c.people_keys(&key, C1, "echo one\necho two\necho th");
        assert_eq!(lines(&mut c), vec![(C1, "echo one".to_string())]);
        admit(&mut c, &key, "echo one", Via::Ws);
        c.people_answered(&key, C1, Ok(()));
        assert!(lines(&mut c).is_empty(), "the rest waits for the prompt");
        // Keys typed while it runs go after what waits, not to the program.
        c.people_keys(&key, C1, "ree\n");
        let st = mark(&c, &key, "s;1");
        c.output(k, 0, format!("{st}one\r\n").as_bytes());
        prompt(&mut c, &key, k);
        assert_eq!(lines(&mut c), vec![(C1, "echo two".to_string())]);
        admit(&mut c, &key, "echo two", Via::Ws);
        c.people_answered(&key, C1, Ok(()));
        let st = mark(&c, &key, "s;2");
        c.output(k, 0, format!("{st}two\r\n").as_bytes());
        prompt(&mut c, &key, k);
        assert_eq!(lines(&mut c), vec![(C1, "echo three".to_string())]);
    }

    #[test]
    fn while_a_command_runs_keys_are_its_input_and_ctrl_c_drops_what_waits() {
        let (mut c, key, k) = watched();
        admit(&mut c, &key, "cat", Via::Rpc);
        assert!(
            shown(&mut c).ends_with("cat\r\n"),
            "an agent's line is shown as typed"
        );
        let st = mark(&c, &key, "s;1");
        c.output(k, 0, st.as_bytes());
        c.people_keys(&key, C1, "abc\r");
        let stdin = &c.table.get(k).unwrap().stdin.as_ref().unwrap().buf;
        assert_eq!(stdin.iter().copied().collect::<Vec<u8>>(), b"abc\r");
        assert!(lines(&mut c).is_empty());
    }

    #[test]
    fn an_agent_line_hides_the_line_being_typed_until_the_next_prompt() {
        let (mut c, key, k) = watched();
        c.people_keys(&key, C1, "ab");
        shown(&mut c);
        admit(&mut c, &key, "pwd", Via::Rpc);
        assert_eq!(shown(&mut c), "\x08\x08  \x08\x08pwd\r\n");
        let st = mark(&c, &key, "s;1");
        c.output(k, 0, format!("{st}/\r\n").as_bytes());
        prompt(&mut c, &key, k);
        assert_eq!(shown(&mut c), "/\r\nu@h:/$ ab");
    }

    #[test]
    fn a_watcher_that_leaves_takes_its_waiting_keys_and_the_session_stays_in_use() {
        let (mut c, key, _) = watched();
        assert!(c.watched(&key));
        c.people_keys(&key, C1, "true\rfalse\r");
        assert_eq!(lines(&mut c).len(), 1);
        c.disconnected(C1);
        assert_eq!(c.watchers(&key).len(), 1);
        c.disconnected(C2);
        assert!(!c.watched(&key));
        // Its line was withdrawn with it: nothing more is typed at the prompt.
        c.people_answered(&key, C1, Ok(()));
        assert!(lines(&mut c).is_empty());
    }

    #[test]
    fn a_closed_session_lets_its_watchers_go() {
        let (mut c, key, _) = watched();
        c.close_shell(&key);
        let gone: Vec<ConnId> = c
            .out
            .iter()
            .filter_map(|e| match e {
                Effect::Unwatch { conn, .. } => Some(*conn),
                _ => None,
            })
            .collect();
        assert_eq!(gone, vec![C1, C2]);
        assert!(c.shells.people.is_empty());
    }

    fn stripped(chunks: &[&[u8]]) -> Vec<u8> {
        let mut s = Strip::default();
        let mut out = Vec::new();
        for c in chunks {
            s.feed(c, &mut out);
        }
        out
    }

    #[test]
    fn markers_are_dropped_however_the_bytes_are_split() {
        let stream = b"a\x1b[1mb\x1b]6973;p;nonce\x07c\x1b]0;title\x07d\x1b]6973;e;n;0;2f\x07\x1b";
        let want = b"a\x1b[1mbc\x1b]0;title\x07d";
        assert_eq!(stripped(&[stream]), want);
        for cut in 0..stream.len() {
            assert_eq!(
                stripped(&[&stream[..cut], &stream[cut..]]),
                want,
                "cut at {cut}"
            );
        }
        let bytes: Vec<&[u8]> = stream.chunks(1).collect();
        assert_eq!(stripped(&bytes), want);
        // An escape that turns out to be no marker is shown whole.
        assert_eq!(stripped(&[b"\x1b]69", b"7x"]), b"\x1b]697x");
        assert_eq!(stripped(&[b"\x1b\x1b]6973;s;n;1\x07z"]), b"\x1bz");
    }

    #[test]
    fn text_never_splits_a_character() {
        let mut tail = Vec::new();
        let e = "é".as_bytes();
        assert_eq!(whole_text(&mut tail, &[b'a', e[0]]), "a");
        assert_eq!(whole_text(&mut tail, &[e[1], b'b']), "éb");
        assert_eq!(whole_text(&mut tail, b"\xff\xfec"), "\u{fffd}\u{fffd}c");
        assert!(tail.is_empty());
    }

    #[test]
    fn refusals_are_said_in_one_line() {
        let denied = RpcError::denied("push", Some("pushes leave this machine"));
        assert_eq!(
            refusal_text(&denied),
            "denied by rule push: pushes leave this machine"
        );
        let rejected = RpcError::not_approved("push", "no approver", None);
        assert_eq!(
            refusal_text(&rejected),
            "not approved (rule push): no approver"
        );
    }
}
