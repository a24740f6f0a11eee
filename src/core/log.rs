//! The daemon's log lines and audit records as the core makes them: bounded queues of
//! whole lines, which `sys::sinks` drains into stderr or the audit file. Time comes in
//! as an argument (the loop's wall clock), so the records are unit-tested with a fake one.
//!
//! Invariants:
//! - Queuing never blocks and never grows a queue past its capacity: a line that does not
//!   fit is counted, not kept, and once the queue drains one line says how many were lost
//!   (for the audit log, a `dropped` record).
//! - A line is queued whole or not at all, so a reader never sees half a line.
//! - The queue keeps the length of every line it holds (a few bytes per line, next to
//!   records of a hundred and more), so whatever a writer loses is counted in lines (the
//!   `count` of a `dropped` record is records lost, never bytes), and a writer stopped
//!   mid-line knows how much of that line its target already holds (to take it back from
//!   a file, or to finish it on a pipe).
//! - Every line lost is counted exactly once, the report of drops included: a lost report
//!   gives its count back to the next one rather than counting as a record itself, so the
//!   records a reader sees plus the counts of the `dropped` records it sees are the records
//!   made (up to those still queued).

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::time::{Duration, Instant, SystemTime};

use serde_json::{Map, Value};

use super::view::cut_middle;
pub use crate::types::Level;
use crate::wire::encode::{rfc3339, write_json, write_json_str};
use crate::wire::sha256;
use crate::wire::state::{
    BlobsIn, BlobsOut, Clock, LogImage, QueueImage, RefusalImage, StateError,
};

/// Bytes the log and the audit queue each hold while their target does not accept them.
pub const QUEUE_BYTES: usize = 1 << 20;

/// Refusals of one kind logged in full per window; the rest are counted.
const REFUSALS_PER_WINDOW: u32 = 10;
const REFUSAL_WINDOW: Duration = Duration::from_secs(10);

/// What a queue says about the lines it had to drop.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Kind {
    /// Daemon log lines: a plain line.
    Log,
    /// Audit records: a `dropped` record.
    Audit,
}

/// One line waiting in a [`Queue`]: its length; for a record of a shared uid's own
/// share (`push_shared`), that uid; and for a report of drops the count it carries (and
/// whose drops they were), which goes back into the count if the report itself is lost.
#[derive(Debug, Clone, Copy)]
struct Line {
    len: usize,
    reports: u64,
    uid: Option<u32>,
    /// Held in `uid`'s share (a flood-class record), rather than reporting `uid`'s drops.
    shared: bool,
}

/// A bounded queue of whole lines. It knows where each line ends, so a writer that stops
/// mid-line knows how much of that line went out, and one that loses what it holds (a
/// write error) counts lines, not bytes.
///
/// Fair shares (PROTOCOL 7.4): records a shared uid causes itself (`push_shared`:
/// denials, asks, connections, exits) hold at most half of the queue per uid and seven
/// eighths for all such uids together, and never the room promised to starts in flight
/// (`reserve`), so one uid's flood loses only its own records, counted per uid.
#[derive(Debug)]
pub struct Queue {
    buf: Vec<u8>,
    /// Bytes of `buf` already written.
    pos: usize,
    /// The lines of `buf[pos - front_written..]`, oldest first.
    lines: VecDeque<Line>,
    /// Bytes of the first of `lines` already written (a partial write).
    front_written: usize,
    cap: usize,
    /// Lines dropped since the last report of drops was queued (those of no uid's share).
    dropped: u64,
    /// The same, per shared uid whose own records were dropped.
    dropped_by: BTreeMap<u32, u64>,
    /// Bytes each shared uid's records hold (whole lines, written in part or not).
    held_by: HashMap<u32, usize>,
    /// Bytes all shared uids' records hold.
    held_shared: usize,
    /// Bytes promised to records that must not be lost (`reserve`), not yet queued.
    reserved: usize,
    kind: Kind,
}

impl Queue {
    pub fn new(cap: usize, kind: Kind) -> Queue {
        Queue {
            buf: Vec::new(),
            pos: 0,
            lines: VecDeque::new(),
            front_written: 0,
            cap,
            dropped: 0,
            dropped_by: BTreeMap::new(),
            held_by: HashMap::new(),
            held_shared: 0,
            reserved: 0,
            kind,
        }
    }

    /// Bytes held: lines waiting, the one partly written included whole.
    fn held(&self) -> usize {
        self.buf.len() - self.pos + self.front_written
    }

    /// Whether `len` more bytes fit beside what is held and what is promised.
    fn fits(&self, len: usize) -> bool {
        self.held() + self.reserved + len <= self.cap
    }

    /// Queues one line (which must end in `\n`), or counts it as dropped when it does not fit.
    pub fn push(&mut self, line: &[u8]) {
        if !self.fits(line.len()) {
            self.dropped += 1;
            return;
        }
        self.append(line, 0, None, false);
    }

    /// Queues one record a shared `uid` caused itself (PROTOCOL 7.4): it
    /// must also fit that uid's half of the queue and the seven eighths all shared uids
    /// share; a record that does not is counted as that uid's drop.
    pub fn push_shared(&mut self, line: &[u8], uid: u32) {
        let own = self.held_by.get(&uid).copied().unwrap_or(0);
        let len = line.len();
        if !self.fits(len) || own + len > self.cap / 2 || self.held_shared + len > self.cap / 8 * 7
        {
            *self.dropped_by.entry(uid).or_default() += 1;
            return;
        }
        *self.held_by.entry(uid).or_default() += len;
        self.held_shared += len;
        self.append(line, 0, Some(uid), true);
    }

    /// Promises room for a record of at most `len` bytes that must not be lost (a
    /// command's `start`): false when it does not fit, and then nothing is promised.
    pub fn reserve(&mut self, len: usize) -> bool {
        if !self.fits(len) {
            return false;
        }
        self.reserved += len;
        true
    }

    /// Takes back a promise of `len` bytes that will not be used.
    pub fn unreserve(&mut self, len: usize) {
        self.reserved = self.reserved.saturating_sub(len);
    }

    /// Queues a record room was promised for (`reserve`, `len` bytes): it goes in even
    /// past the capacity, as the promise kept that room (a line longer than the promise
    /// still goes in: the promise is a bound its maker computed, and losing the record
    /// of a command that runs is worse than a queue a few bytes over).
    pub fn push_reserved(&mut self, line: &[u8], len: usize) {
        self.unreserve(len);
        self.append(line, 0, None, false);
    }

    fn append(&mut self, line: &[u8], reports: u64, uid: Option<u32>, shared: bool) {
        if line.is_empty() {
            return;
        }
        self.buf.extend_from_slice(line);
        self.lines.push_back(Line {
            len: line.len(),
            reports,
            uid,
            shared,
        });
    }

    /// A line leaves the queue (written, or lost): its uid's share is freed.
    fn release(&mut self, line: &Line) {
        if let (true, Some(uid)) = (line.shared, line.uid) {
            self.held_shared = self.held_shared.saturating_sub(line.len);
            if let Some(h) = self.held_by.get_mut(&uid) {
                *h = h.saturating_sub(line.len);
                if *h == 0 {
                    self.held_by.remove(&uid);
                }
            }
        }
    }

    /// A line is lost (a write error): counted where it was made, or, for a report of
    /// drops, its count given back to whose drops they were.
    fn count_lost(&mut self, line: &Line) {
        let n = if line.reports > 0 { line.reports } else { 1 };
        match (line.shared || line.reports > 0, line.uid) {
            (true, Some(uid)) => *self.dropped_by.entry(uid).or_default() += n,
            _ => self.dropped += n,
        }
    }

    /// The bytes waiting to be written.
    pub fn pending(&self) -> &[u8] {
        &self.buf[self.pos..]
    }

    #[cfg(test)]
    /// Whole lines (a partly written one included) waiting to be written.
    pub fn lines(&self) -> usize {
        self.lines.len()
    }

    /// Nothing waits to be written and nothing lost waits to be reported.
    pub fn is_empty(&self) -> bool {
        self.pos == self.buf.len() && self.dropped == 0 && self.dropped_by.is_empty()
    }

    #[cfg(test)]
    /// Lines dropped and not yet reported.
    pub fn dropped(&self) -> u64 {
        self.dropped + self.dropped_by.values().sum::<u64>()
    }

    /// Bytes of the first waiting line already written: nonzero when a write stopped
    /// mid-line, so the target holds the start of a line whose rest is still here.
    pub fn front_written(&self) -> usize {
        self.front_written
    }

    /// `n` bytes were written.
    pub fn consume(&mut self, n: usize) {
        let n = n.min(self.buf.len() - self.pos);
        self.pos += n;
        self.front_written += n;
        while let Some(front) = self.lines.front().copied() {
            if self.front_written < front.len {
                break;
            }
            self.front_written -= front.len;
            self.lines.pop_front();
            self.release(&front);
        }
        if self.pos == self.buf.len() {
            self.buf.clear();
            self.pos = 0;
            if self.buf.capacity() > 64 << 10 {
                self.buf.shrink_to(64 << 10);
            }
        } else if self.pos > self.buf.len() / 2 {
            self.buf.drain(..self.pos);
            self.pos = 0;
        }
    }

    /// Loses every waiting line (the target failed: a full disk, a closed pipe), a
    /// partly written one included, and counts them; a lost report of drops gives its
    /// count back instead of counting as one. Returns the lines lost.
    pub fn lose_pending(&mut self) -> u64 {
        let lost: Vec<Line> = self.lines.drain(..).collect();
        for line in &lost {
            self.release(line);
            self.count_lost(line);
        }
        self.buf.clear();
        self.pos = 0;
        self.front_written = 0;
        lost.len() as u64
    }

    /// Loses the rest of a partly written first line (its start went to a target that is
    /// gone), counted like [`Queue::lose_pending`]. Returns whether there was one.
    pub fn lose_partial(&mut self) -> bool {
        if self.front_written == 0 {
            return false;
        }
        let Some(front) = self.lines.pop_front() else {
            return false;
        };
        self.release(&front);
        self.count_lost(&front);
        self.buf.drain(..self.pos + front.len - self.front_written);
        self.pos = 0;
        self.front_written = 0;
        true
    }

    /// Once everything waiting is written, queues the reports of the lines lost (stamped
    /// `now`): a plain line for the log, a `dropped` record for the audit, one for the
    /// lines of no uid's share and one per shared uid whose own were lost (`uid`).
    /// Returns whether it queued any.
    pub fn report_drops(&mut self, now: SystemTime) -> bool {
        if (self.dropped == 0 && self.dropped_by.is_empty()) || self.pos != self.buf.len() {
            return false;
        }
        let general = std::mem::take(&mut self.dropped);
        let by = std::mem::take(&mut self.dropped_by);
        let reports = (general > 0)
            .then_some((None, general))
            .into_iter()
            .chain(by.into_iter().map(|(uid, n)| (Some(uid), n)));
        for (uid, count) in reports {
            let line = match self.kind {
                Kind::Log => {
                    let whose = uid.map_or(String::new(), |u| format!(" of uid {u}"));
                    format!(
                        "{}execd: {count} log line(s){whose} dropped: stderr was not taking \
                         them\n",
                        stamp_prefix(Some(now))
                    )
                    .into_bytes()
                }
                Kind::Audit => {
                    let mut fields = Map::new();
                    fields.insert("count".into(), count.into());
                    if let Some(u) = uid {
                        fields.insert("uid".into(), u.into());
                    }
                    audit_line(now, "dropped", None, fields)
                }
            };
            self.append(&line, count, uid, false);
        }
        true
    }
}

impl Queue {
    /// What an upgrade in place carries: the bytes waiting, every line (partly) waiting
    /// with the drops it reports and the uid it belongs to, how much of the first went
    /// out, and the drops not yet reported. Nothing is promised then (the upgrade waits
    /// for spawns in flight).
    pub fn carry(&self, blobs: &mut BlobsOut) -> QueueImage {
        QueueImage {
            pending: blobs.put(self.pending()),
            lines: self.lines.iter().map(|l| (l.len, l.reports)).collect(),
            front_written: self.front_written,
            cap: self.cap,
            dropped: self.dropped,
            uids: self.lines.iter().map(|l| (l.uid, l.shared)).collect(),
            dropped_by: self.dropped_by.iter().map(|(u, n)| (*u, *n)).collect(),
        }
    }

    /// The queue `carry` described, of `kind`.
    pub fn resume(img: &QueueImage, blobs: &BlobsIn, kind: Kind) -> Result<Queue, StateError> {
        let buf = blobs.get(img.pending)?.to_vec();
        if !img.uids.is_empty() && img.uids.len() != img.lines.len() {
            return Err(StateError::new(format!(
                "a queue of {} lines with {} owners",
                img.lines.len(),
                img.uids.len()
            )));
        }
        let lines: VecDeque<Line> = img
            .lines
            .iter()
            .enumerate()
            .map(|(i, &(len, reports))| {
                let (uid, shared) = img.uids.get(i).copied().unwrap_or((None, false));
                Line {
                    len,
                    reports,
                    uid,
                    shared,
                }
            })
            .collect();
        let held: usize = lines.iter().map(|l| l.len).sum();
        if held != buf.len() + img.front_written {
            return Err(StateError::new(format!(
                "a queue of {} bytes whose lines hold {held}",
                buf.len() + img.front_written
            )));
        }
        let mut q = Queue::new(img.cap, kind);
        for l in lines.iter().filter(|l| l.shared) {
            if let Some(uid) = l.uid {
                *q.held_by.entry(uid).or_default() += l.len;
                q.held_shared += l.len;
            }
        }
        q.buf = buf;
        q.lines = lines;
        q.front_written = img.front_written;
        q.dropped = img.dropped;
        q.dropped_by = img.dropped_by.iter().copied().collect();
        Ok(q)
    }
}

/// `2026-11-25T16:21:43.123Z ` when stamping at `at`, else nothing.
fn stamp_prefix(at: Option<SystemTime>) -> String {
    match at {
        Some(t) => format!("{} ", rfc3339(t)),
        None => String::new(),
    }
}

/// One audit record as a line: `ts` (`at`) and `event` first, `peer` when there is one,
/// then `fields` (in name order), so a person reading the file sees when and what first.
pub fn audit_line(
    at: SystemTime,
    event: &str,
    peer: Option<Value>,
    fields: Map<String, Value>,
) -> Vec<u8> {
    let mut line = Vec::with_capacity(128);
    line.extend_from_slice(b"{\"ts\":");
    write_json_str(&mut line, &rfc3339(at));
    line.extend_from_slice(b",\"event\":");
    write_json_str(&mut line, event);
    // In name order whatever the map's own order is (serde_json's `preserve_order`,
    // which a dependency may switch on, keeps insertion order).
    let mut fields: Vec<(String, Value)> = fields.into_iter().collect();
    fields.sort_by(|a, b| a.0.cmp(&b.0));
    let peer = peer.map(|p| ("peer".to_string(), p));
    for (name, value) in peer.into_iter().chain(fields) {
        line.push(b',');
        write_json_str(&mut line, &name);
        line.push(b':');
        write_json(&mut line, &value);
    }
    line.extend_from_slice(b"}\n");
    line
}

/// The most bytes one audit record takes (PROTOCOL 7.4), its newline included.
pub const RECORD_MAX: usize = 16 << 10;

/// The fields whose value is as long as a peer makes it: the command as it runs (`line`,
/// `argv`) or as it was asked for (`command`).
const LONG_FIELDS: [&str; 3] = ["line", "argv", "command"];

/// One audit record as a line of at most `RECORD_MAX` bytes: as `audit_line` when it
/// fits; else its command (`line`, `argv` or `command`) is cut in the middle, as
/// approvers see a long one, and the record says `line_bytes` and `line_sha256` of the
/// whole (an argv as `/proc/PID/cmdline` holds it: each word ended by a NUL byte).
/// Should that not do (other fields a peer made long), every long string is cut too.
pub fn bounded_audit_line(
    at: SystemTime,
    event: &str,
    peer: Option<Value>,
    mut fields: Map<String, Value>,
) -> Vec<u8> {
    // A command far past the bound is cut without being written out whole first.
    let long = LONG_FIELDS.iter().find(|k| fields.contains_key(**k));
    let far = long.is_some_and(|k| raw_len(&fields[*k]) > RECORD_MAX);
    if !far {
        let line = audit_line(at, event, peer.clone(), fields.clone());
        if line.len() <= RECORD_MAX {
            return line;
        }
    }
    if let Some(whole) = long.and_then(|k| fields.remove(*k)) {
        let key = *long.unwrap_or(&"line");
        let bytes = whole_bytes(&whole);
        fields.insert("line_bytes".into(), bytes.len().into());
        fields.insert("line_sha256".into(), sha256::hex(&bytes).into());
        // What the rest of the record takes, with room for the field's name and the
        // marker of what was cut.
        let rest = audit_line(at, event, peer.clone(), fields.clone()).len() + 128;
        let mut budget = RECORD_MAX.saturating_sub(rest).max(64);
        loop {
            fields.insert(key.into(), cut_value(&whole, budget));
            let line = audit_line(at, event, peer.clone(), fields.clone());
            if line.len() <= RECORD_MAX {
                return line;
            }
            // Escapes (`\u0000`) make a cut text longer than its bytes: cut further.
            if budget <= 64 {
                break;
            }
            budget /= 2;
        }
    }
    for max in [1 << 10, 64] {
        let cut: Map<String, Value> = fields
            .iter()
            .map(|(k, v)| (k.clone(), cut_strings(v, max)))
            .collect();
        let line = audit_line(at, event, peer.as_ref().map(|p| cut_strings(p, max)), cut);
        if line.len() <= RECORD_MAX {
            return line;
        }
    }
    let mut fields = Map::new();
    fields.insert("cut".into(), "the record could not be made to fit".into());
    audit_line(at, event, None, fields)
}

/// The bytes `line_sha256` is of: a text's own, an argv's words each ended by NUL.
fn whole_bytes(v: &Value) -> Vec<u8> {
    match v {
        Value::String(s) => s.as_bytes().to_vec(),
        Value::Array(words) => {
            let mut out = Vec::new();
            for w in words {
                match w {
                    Value::String(s) => out.extend_from_slice(s.as_bytes()),
                    other => out.extend_from_slice(other.to_string().as_bytes()),
                }
                out.push(0);
            }
            out
        }
        other => other.to_string().into_bytes(),
    }
}

/// Bytes of text `v` holds (its strings', an argv's words'), before any escaping.
fn raw_len(v: &Value) -> usize {
    match v {
        Value::String(s) => s.len(),
        Value::Array(a) => a.iter().map(raw_len).sum(),
        _ => 0,
    }
}

/// A command cut to about `max` bytes: a text in the middle; an argv keeps its first and
/// last words within half of it each (a word longer than that cut in the middle), with a
/// word saying how many were left out between them.
fn cut_value(v: &Value, max: usize) -> Value {
    match v {
        Value::String(s) => Value::String(cut_middle(s, max)),
        Value::Array(words) => {
            let words: Vec<String> = words
                .iter()
                .map(|w| w.as_str().map_or_else(|| w.to_string(), str::to_string))
                .collect();
            Value::from(cut_words(&words, max))
        }
        other => Value::String(cut_middle(&other.to_string(), max)),
    }
}

fn cut_words(words: &[String], max: usize) -> Vec<String> {
    let size = |w: &String| w.len() + 4; // quotes and a comma
    if words.iter().map(size).sum::<usize>() <= max {
        return words.to_vec();
    }
    let half = max / 2;
    let mut used = 0;
    let mut head = Vec::new();
    for w in words {
        if used + size(w) > half {
            break;
        }
        used += size(w);
        head.push(w.clone());
    }
    if head.is_empty() {
        head.push(cut_middle(&words[0], half.saturating_sub(48).max(16)));
    }
    let mut used = 0;
    let mut tail = Vec::new();
    for w in words[head.len()..].iter().rev() {
        if used + size(w) > half {
            break;
        }
        used += size(w);
        tail.push(w.clone());
    }
    if tail.is_empty() && words.len() > head.len() {
        tail.push(cut_middle(
            &words[words.len() - 1],
            half.saturating_sub(48).max(16),
        ));
    }
    tail.reverse();
    let left = words.len() - head.len() - tail.len();
    if left > 0 {
        head.push(format!("[... {left} words left out ...]"));
    }
    head.extend(tail);
    head
}

/// `v` with every string longer than `max` bytes cut in the middle.
fn cut_strings(v: &Value, max: usize) -> Value {
    match v {
        Value::String(s) => Value::String(cut_middle(s, max)),
        Value::Array(a) => Value::Array(a.iter().map(|x| cut_strings(x, max)).collect()),
        Value::Object(m) => Value::Object(
            m.iter()
                .map(|(k, x)| (cut_middle(k, max), cut_strings(x, max)))
                .collect(),
        ),
        other => other.clone(),
    }
}

/// A log of one kind of refusal, rate-limited.
#[derive(Debug, Default)]
struct Refusals {
    window_start: Option<Instant>,
    in_window: u32,
    suppressed: u64,
}

/// The daemon's log: `execd: ...` lines, stamped unless stderr is the journal (which
/// stamps them itself).
#[derive(Debug)]
pub struct Log {
    pub queue: Queue,
    /// Lines past this level are not kept (`--log-level`).
    pub level: Level,
    stamp: bool,
    /// The wall clock as the loop last read it: what lines are stamped with.
    pub wall: SystemTime,
    refusals: std::collections::HashMap<String, Refusals>,
}

impl Log {
    pub fn new(stamp: bool) -> Log {
        Log {
            queue: Queue::new(QUEUE_BYTES, Kind::Log),
            level: Level::default(),
            stamp,
            wall: SystemTime::UNIX_EPOCH,
            refusals: Default::default(),
        }
    }

    /// Queues one log line (level `info`).
    pub fn line(&mut self, args: std::fmt::Arguments) {
        self.at(Level::Info, args);
    }

    /// Queues one log line of level `error`.
    pub fn error(&mut self, args: std::fmt::Arguments) {
        self.at(Level::Error, args);
    }

    /// Queues one log line of level `warn`.
    pub fn warn(&mut self, args: std::fmt::Arguments) {
        self.at(Level::Warn, args);
    }

    /// Queues one log line of level `debug`.
    pub fn debug(&mut self, args: std::fmt::Arguments) {
        self.at(Level::Debug, args);
    }

    /// Queues one log line of `level`, if `--log-level` keeps it.
    pub fn at(&mut self, level: Level, args: std::fmt::Arguments) {
        if level > self.level {
            return;
        }
        let text = format!(
            "{}execd: {args}\n",
            stamp_prefix(self.stamp.then_some(self.wall))
        );
        self.queue.push(text.as_bytes());
    }

    /// Queues a refusal (a limit reached, a peer refused), at most a few per kind and
    /// window; the rest are counted and the count is logged when the next window opens.
    pub fn refusal(&mut self, kind: &str, now: Instant, args: std::fmt::Arguments) {
        if !self.refusals.contains_key(kind) {
            self.refusals.insert(kind.to_string(), Refusals::default());
        }
        let Some(r) = self.refusals.get_mut(kind) else {
            return;
        };
        let fresh = r
            .window_start
            .is_none_or(|s| now.saturating_duration_since(s) >= REFUSAL_WINDOW);
        let mut note = None;
        if fresh {
            if r.suppressed > 0 {
                note = Some(std::mem::take(&mut r.suppressed));
            }
            r.window_start = Some(now);
            r.in_window = 0;
        }
        if r.in_window >= REFUSALS_PER_WINDOW {
            r.suppressed += 1;
            return;
        }
        r.in_window += 1;
        if let Some(n) = note {
            self.warn(format_args!(
                "{n} more refusal(s) of {kind} were not logged"
            ));
        }
        self.warn(args);
    }

    #[cfg(test)]
    /// Refusals of each kind counted but not logged yet.
    pub fn suppressed(&self, kind: &str) -> u64 {
        self.refusals.get(kind).map_or(0, |r| r.suppressed)
    }
}

impl Log {
    /// What an upgrade in place carries: the queue, and the rate-limited refusals with
    /// their windows.
    pub fn carry(&self, clock: &Clock, blobs: &mut BlobsOut) -> LogImage {
        let mut refusals: Vec<RefusalImage> = self
            .refusals
            .iter()
            .map(|(kind, r)| RefusalImage {
                kind: kind.clone(),
                window_start: r.window_start.map(|t| clock.rel(t)),
                in_window: r.in_window,
                suppressed: r.suppressed,
            })
            .collect();
        refusals.sort_by(|a, b| a.kind.cmp(&b.kind));
        LogImage {
            queue: self.queue.carry(blobs),
            refusals,
        }
    }

    /// The log `carry` described; `stamp` as the new image decides it.
    pub fn resume(
        img: &LogImage,
        blobs: &BlobsIn,
        clock: &Clock,
        stamp: bool,
    ) -> Result<Log, StateError> {
        Ok(Log {
            queue: Queue::resume(&img.queue, blobs, Kind::Log)?,
            // The core that takes it sets it from the flags (`Core::new`).
            level: Level::default(),
            stamp,
            wall: SystemTime::UNIX_EPOCH,
            refusals: img
                .refusals
                .iter()
                .map(|r| {
                    let refusals = Refusals {
                        window_start: r.window_start.map(|t| clock.at(t)),
                        in_window: r.in_window,
                        suppressed: r.suppressed,
                    };
                    (r.kind.clone(), refusals)
                })
                .collect(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn text(q: &Queue) -> String {
        String::from_utf8(q.pending().to_vec()).unwrap()
    }

    #[test]
    fn a_full_queue_counts_lines_and_reports_them_once_drained() {
        let now = crate::types::test_clock().1;
        let mut q = Queue::new(10, Kind::Log);
        q.push(b"12345\n");
        q.push(b"abcdef\n"); // does not fit: dropped whole
        q.push(b"xyz\n");
        assert_eq!(q.pending(), b"12345\nxyz\n");
        assert_eq!((q.lines(), q.dropped()), (2, 1));
        assert!(!q.report_drops(now), "not before the queue drains");
        q.consume(6);
        assert_eq!(q.pending(), b"xyz\n");
        assert_eq!(q.lines(), 1);
        q.consume(4);
        assert!(q.report_drops(now));
        assert!(text(&q).contains("1 log line(s) dropped"), "{}", text(&q));
        assert_eq!(q.dropped(), 0);
        assert!(!q.report_drops(now), "one report per loss");
    }

    #[test]
    fn audit_drops_become_a_dropped_record() {
        let mut q = Queue::new(4, Kind::Audit);
        q.push(b"too long\n");
        q.push(b"nope\n");
        assert!(q.pending().is_empty());
        assert!(q.report_drops(crate::types::test_clock().1));
        let text = text(&q);
        assert!(
            text.starts_with(r#"{"ts":"2026-11-25T00:00:00.000Z","event":"dropped","#),
            "{text}"
        );
        let rec: Value = serde_json::from_slice(q.pending()).unwrap();
        assert_eq!(rec["event"], "dropped");
        assert_eq!(rec["count"], 2);
        assert!(rec["ts"].as_str().unwrap().ends_with('Z'));
    }

    #[test]
    fn partial_writes_are_tracked_by_line() {
        let mut q = Queue::new(100, Kind::Log);
        q.push(b"aaaa\n");
        q.push(b"bbb\n");
        q.push(b"cc\n");
        q.consume(3);
        assert_eq!((q.lines(), q.front_written()), (3, 3));
        q.consume(4); // the rest of the first line and two bytes of the second
        assert_eq!((q.lines(), q.front_written()), (2, 2));
        assert_eq!(q.pending(), b"b\ncc\n");
        q.consume(2);
        assert_eq!((q.lines(), q.front_written()), (1, 0));
        assert_eq!(q.pending(), b"cc\n");
    }

    #[test]
    fn losing_what_waits_counts_lines_not_bytes() {
        let now = crate::types::test_clock().1;
        let mut q = Queue::new(100, Kind::Audit);
        q.push(b"{\"a\":1}\n");
        q.push(b"{\"b\":2}\n");
        q.push(b"{\"c\":3}\n");
        q.consume(10); // the first line and two bytes of the second
        assert_eq!(q.lose_pending(), 2, "the partly written one counts");
        assert_eq!(q.dropped(), 2);
        assert!(q.pending().is_empty() && !q.is_empty());
        assert!(q.report_drops(now));
        // The report itself is lost: its count comes back, it does not count as a record.
        q.push(b"{\"d\":4}\n");
        assert_eq!(q.lose_pending(), 2);
        assert_eq!(
            q.dropped(),
            3,
            "2 carried by the lost report and the record after it"
        );
        assert!(q.report_drops(now));
        let rec: Value = serde_json::from_slice(q.pending()).unwrap();
        assert_eq!(rec["count"], 3);
        q.consume(q.pending().len());
        assert!(q.is_empty());
        assert_eq!(q.lines(), 0);
    }

    #[test]
    fn losing_a_partial_line_keeps_the_rest() {
        let mut q = Queue::new(100, Kind::Log);
        q.push(b"aaaa\n");
        q.push(b"bbb\n");
        assert!(!q.lose_partial(), "nothing written, nothing torn");
        q.consume(2);
        assert!(q.lose_partial());
        assert_eq!(q.pending(), b"bbb\n");
        assert_eq!((q.lines(), q.front_written(), q.dropped()), (1, 0, 1));
    }

    #[test]
    fn a_queue_of_many_lines_drains_in_order_across_compactions() {
        let mut q = Queue::new(1 << 12, Kind::Log);
        let mut out = Vec::new();
        let mut want = Vec::new();
        for i in 0..2000 {
            let line = format!("line {i}\n");
            q.push(line.as_bytes());
            want.extend_from_slice(line.as_bytes());
            // Odd-sized writes, so lines end mid-write.
            let n = q.pending().len().min(7 + i % 13);
            out.extend_from_slice(&q.pending()[..n]);
            q.consume(n);
        }
        while !q.pending().is_empty() {
            let n = q.pending().len().min(5);
            out.extend_from_slice(&q.pending()[..n]);
            q.consume(n);
        }
        assert_eq!(out, want);
        assert_eq!((q.lines(), q.front_written(), q.dropped()), (0, 0, 0));
    }

    #[test]
    fn audit_records_put_when_and_what_first() {
        let mut fields = Map::new();
        fields.insert("z".into(), 1.into());
        fields.insert("a".into(), "x\"y".into());
        let peer = serde_json::json!({"uid": 0});
        let line = audit_line(crate::types::test_clock().1, "start", Some(peer), fields);
        assert_eq!(
            String::from_utf8(line).unwrap(),
            "{\"ts\":\"2026-11-25T00:00:00.000Z\",\"event\":\"start\",\"peer\":{\"uid\":0},\"a\":\"x\\\"y\",\"z\":1}\n"
        );
    }

    fn record_of(line: &[u8]) -> Value {
        assert!(line.len() <= RECORD_MAX, "{} bytes", line.len());
        assert!(line.ends_with(b"\n"));
        serde_json::from_slice(line).unwrap()
    }

    /// A 900 KB line makes a record of at most 16 KiB: the line cut in the middle (its end
    /// kept), with the whole line's size and digest.
    #[test]
    fn a_long_command_is_cut_in_the_middle_and_named_by_its_digest() {
        let at = crate::types::test_clock().1;
        let line = format!("echo {}; rm -rf V", "x".repeat(900_000));
        let mut fields = Map::new();
        fields.insert("line".into(), line.clone().into());
        fields.insert("id".into(), "cmd_1".into());
        let rec = record_of(&bounded_audit_line(at, "start", None, fields));
        let shown = rec["line"].as_str().unwrap();
        assert!(
            shown.starts_with("echo xxx") && shown.ends_with("; rm -rf V"),
            "{shown:.40}"
        );
        assert!(shown.contains("bytes left out"));
        assert_eq!(rec["line_bytes"], line.len());
        assert_eq!(rec["line_sha256"], sha256::hex(line.as_bytes()));
        assert_eq!(rec["id"], "cmd_1");
        // One that fits is left alone, and says nothing more.
        let mut fields = Map::new();
        fields.insert("command".into(), "ls".into());
        let rec = record_of(&bounded_audit_line(at, "deny", None, fields));
        assert_eq!(rec["command"], "ls");
        assert!(rec.get("line_bytes").is_none());
    }

    #[test]
    fn a_long_argv_keeps_its_first_and_last_words_and_a_text_of_escapes_still_fits() {
        let at = crate::types::test_clock().1;
        let mut words: Vec<String> = vec!["rm".into(), "-rf".into()];
        words.extend((0..20_000).map(|i| format!("f{i}")));
        words.push("V".into());
        let mut fields = Map::new();
        fields.insert("argv".into(), json!(words));
        let rec = record_of(&bounded_audit_line(at, "start", None, fields));
        let argv: Vec<&str> = rec["argv"]
            .as_array()
            .unwrap()
            .iter()
            .map(|w| w.as_str().unwrap())
            .collect();
        assert_eq!(&argv[..2], ["rm", "-rf"]);
        assert_eq!(argv.last(), Some(&"V"));
        assert!(argv.iter().any(|w| w.contains("words left out")));
        let cmdline: Vec<u8> = words
            .iter()
            .flat_map(|w| [w.as_bytes(), b"\0"].concat())
            .collect();
        assert_eq!(rec["line_bytes"], cmdline.len());
        assert_eq!(rec["line_sha256"], sha256::hex(&cmdline));
        // Control characters take six bytes each once escaped: cut further to fit.
        let mut fields = Map::new();
        fields.insert("line".into(), "\u{1}".repeat(100_000).into());
        fields.insert("cwd".into(), "\u{2}".repeat(4096).into());
        let rec = record_of(&bounded_audit_line(at, "start", None, fields));
        assert_eq!(rec["line_bytes"], 100_000);
        // A single word of a megabyte.
        let mut fields = Map::new();
        fields.insert("argv".into(), json!(["x".repeat(1 << 20)]));
        record_of(&bounded_audit_line(at, "start", None, fields));
    }

    /// One uid's flood of denials takes at most half of the queue, and all shared uids'
    /// seven eighths: another uid's records, and root's, still go in, and what is lost is
    /// counted for the uid that made it, in its own `dropped` record.
    #[test]
    fn a_shared_uid_floods_only_its_own_share() {
        let now = crate::types::test_clock().1;
        let rec = |tag: &str| format!("{{\"r\":\"{tag}{}\"}}\n", "x".repeat(90)).into_bytes();
        let mut q = Queue::new(1000, Kind::Audit);
        let mut made = 0;
        for _ in 0..50 {
            q.push_shared(&rec("a"), 1000);
            made += 1;
        }
        assert_eq!(q.lines(), 5, "half of 1000 bytes is five records of 100");
        assert_eq!(q.dropped(), 45);
        for _ in 0..50 {
            q.push_shared(&rec("b"), 2000);
            made += 1;
        }
        assert_eq!(q.lines(), 8, "all shared uids together: seven eighths");
        q.push(&rec("z"));
        q.push(&rec("z"));
        made += 2;
        assert_eq!(q.lines(), 10, "root's records still fit");
        // A start promised room goes in even when the rest is full.
        assert!(!q.reserve(100));
        let text = String::from_utf8(q.pending().to_vec()).unwrap();
        assert_eq!(text.matches("\"r\":\"z").count(), 2, "root's");
        let n = q.pending().len();
        q.consume(n);
        assert!(q.report_drops(now));
        let reports: Vec<Value> = String::from_utf8(q.pending().to_vec())
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(reports.len(), 2);
        assert_eq!(
            (reports[0]["uid"].clone(), reports[0]["count"].clone()),
            (json!(1000), json!(45))
        );
        assert_eq!(
            (reports[1]["uid"].clone(), reports[1]["count"].clone()),
            (json!(2000), json!(47))
        );
        let counted: u64 = reports.iter().map(|r| r["count"].as_u64().unwrap()).sum();
        assert_eq!(10 + counted, made, "records present plus counted = made");
        // Written, the share is free again.
        let n = q.pending().len();
        q.consume(n);
        q.push_shared(&rec("a"), 1000);
        assert_eq!(q.lines(), 1);
    }

    /// A lost report of one uid's drops gives its count back to that uid, and lines of a
    /// uid's share lost to a write error count as its drops.
    #[test]
    fn lost_shared_lines_and_reports_count_for_their_uid() {
        let now = crate::types::test_clock().1;
        let mut q = Queue::new(1000, Kind::Audit);
        q.push_shared(b"{\"a\":1}\n", 7);
        q.push(b"{\"b\":1}\n");
        assert_eq!(q.lose_pending(), 2);
        assert!(q.report_drops(now));
        assert_eq!(q.lose_pending(), 2, "both reports lost");
        assert!(q.report_drops(now));
        let text = String::from_utf8(q.pending().to_vec()).unwrap();
        let recs: Vec<Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(recs[0]["count"], 1);
        assert!(recs[0].get("uid").is_none());
        assert_eq!(
            (recs[1]["uid"].clone(), recs[1]["count"].clone()),
            (json!(7), json!(1))
        );
        q.push_shared(
            &[b'x'; 499]
                .iter()
                .chain(b"\n")
                .copied()
                .collect::<Vec<u8>>(),
            7,
        );
        assert_eq!(
            q.dropped(),
            0,
            "its share is free: the lost line was released"
        );
    }

    #[test]
    fn room_promised_is_kept_from_others_and_given_back() {
        let mut q = Queue::new(100, Kind::Audit);
        assert!(q.reserve(60));
        q.push(&[b'x'; 49].iter().chain(b"\n").copied().collect::<Vec<u8>>());
        assert_eq!(
            (q.lines(), q.dropped()),
            (0, 1),
            "the promised room is not taken"
        );
        q.push_reserved(
            &[b'y'; 59].iter().chain(b"\n").copied().collect::<Vec<u8>>(),
            60,
        );
        assert_eq!(q.lines(), 1);
        assert!(q.reserve(40));
        assert!(!q.reserve(1));
        q.unreserve(40);
        assert!(q.reserve(40));
    }

    #[test]
    fn refusals_are_rate_limited_with_a_count() {
        let mut log = Log::new(false);
        let t0 = crate::types::test_clock().0;
        for i in 0..25 {
            log.refusal("max-clients", t0, format_args!("refused {i}"));
        }
        assert_eq!(log.suppressed("max-clients"), 15);
        let text = String::from_utf8(log.queue.pending().to_vec()).unwrap();
        assert_eq!(text.lines().count(), 10);
        log.refusal("max-clients", t0 + REFUSAL_WINDOW, format_args!("again"));
        let text = String::from_utf8(log.queue.pending().to_vec()).unwrap();
        assert!(
            text.contains("15 more refusal(s) of max-clients were not logged"),
            "{text}"
        );
        assert!(text.ends_with("execd: again\n"));
    }

    #[test]
    fn log_lines_are_stamped_unless_asked_not_to() {
        let mut log = Log::new(true);
        log.wall = crate::types::test_clock().1;
        log.line(format_args!("hello"));
        let text = String::from_utf8(log.queue.pending().to_vec()).unwrap();
        assert_eq!(text, "2026-11-25T00:00:00.000Z execd: hello\n");
        let mut log = Log::new(false);
        log.line(format_args!("hello"));
        let text = String::from_utf8(log.queue.pending().to_vec()).unwrap();
        assert_eq!(text, "execd: hello\n");
    }

    /// The log and audit queues an upgrade carries come back the same: a line half
    /// written, whole lines waiting, drops not yet reported, and the refusals' windows, so
    /// the new image writes the rest of the half line first and reports the drops once.
    #[test]
    fn queues_carried_by_an_upgrade_come_back_the_same() {
        use crate::wire::state::{BlobsIn, BlobsOut, Clock, LogImage};
        let (now, _) = crate::types::test_clock();
        let mut log = Log::new(false);
        log.queue.push(b"first line\n");
        log.queue.push(b"second\n");
        log.queue.consume(3);
        log.refusal("limit", now, format_args!("refused one"));
        log.refusal("limit", now, format_args!("refused two"));
        let clock = Clock { base: now };
        let mut blobs = BlobsOut::default();
        let img = log.carry(&clock, &mut blobs);
        let json = serde_json::to_vec(&img).expect("encode");
        let read: LogImage = serde_json::from_slice(&json).expect("decode");
        assert_eq!(read, img);
        let area = blobs.bytes().to_vec();
        let later = Clock {
            base: now + std::time::Duration::from_millis(25),
        };
        let back = Log::resume(&read, &BlobsIn(&area), &later, false).expect("resume");
        let mut again = BlobsOut::default();
        assert_eq!(
            back.carry(&later, &mut again),
            img,
            "carried again, the same"
        );
        assert_eq!(again.bytes(), blobs.bytes());
        assert_eq!(back.queue.pending(), log.queue.pending());
        assert_eq!(back.queue.front_written(), 3);
        assert_eq!(back.suppressed("limit"), log.suppressed("limit"));

        let mut audit = Queue::new(16, Kind::Audit);
        audit.push(b"{\"a\":1}\n");
        audit.push(b"{\"too long for the queue\":1}\n");
        let mut blobs = BlobsOut::default();
        let img = audit.carry(&mut blobs);
        let area = blobs.bytes().to_vec();
        let mut back = Queue::resume(&img, &BlobsIn(&area), Kind::Audit).expect("resume");
        assert_eq!((back.lines(), back.dropped()), (1, 1));
        back.consume(8);
        assert!(
            back.report_drops(crate::types::test_clock().1),
            "reported once, here"
        );
        // A queue whose lines do not add up to its bytes is refused, not trusted.
        let mut bad = img.clone();
        bad.front_written += 1;
        assert!(Queue::resume(&bad, &BlobsIn(&area), Kind::Audit).is_err());
    }
}
