//! The daemon's log lines and audit records as the core makes them: bounded queues of
//! whole lines, which `sys::sinks` drains into stderr or the audit file. Time comes in
//! as an argument (the loop's wall clock), so the records are unit-tested with a fake one.
//!
//! Invariants:
//! - Queuing never blocks and never grows a queue past its capacity: a line that does not
//!   fit is counted, not kept, and once the queue drains one line says how many were lost
//!   (for the audit log, a `dropped` record).
//! - A line is queued whole or not at all, so a reader never sees half a line.

use std::time::{Duration, Instant, SystemTime};

use serde_json::{Map, Value};

use crate::wire::encode::{rfc3339, write_json, write_json_str};

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

/// A bounded queue of whole lines.
#[derive(Debug)]
pub struct Queue {
    buf: Vec<u8>,
    /// Bytes of `buf` already written.
    pos: usize,
    cap: usize,
    /// Lines dropped since the last report of drops.
    dropped: u64,
    kind: Kind,
}

impl Queue {
    pub fn new(cap: usize, kind: Kind) -> Queue {
        Queue {
            buf: Vec::new(),
            pos: 0,
            cap,
            dropped: 0,
            kind,
        }
    }

    /// Queues one line (which must end in `\n`), or counts it as dropped when it does not fit.
    pub fn push(&mut self, line: &[u8]) {
        if self.buf.len() - self.pos + line.len() > self.cap {
            self.dropped += 1;
            return;
        }
        self.buf.extend_from_slice(line);
    }

    /// The bytes waiting to be written.
    pub fn pending(&self) -> &[u8] {
        &self.buf[self.pos..]
    }

    pub fn is_empty(&self) -> bool {
        self.pos == self.buf.len() && self.dropped == 0
    }

    /// Lines dropped and not yet reported.
    pub fn dropped(&self) -> u64 {
        self.dropped
    }

    /// `n` bytes were written. Once everything is, the report of drops is queued, stamped
    /// `now`.
    pub fn consume(&mut self, n: usize, now: SystemTime) {
        self.pos = (self.pos + n).min(self.buf.len());
        if self.pos < self.buf.len() {
            if self.pos > self.buf.len() / 2 {
                self.buf.drain(..self.pos);
                self.pos = 0;
            }
            return;
        }
        self.buf.clear();
        self.pos = 0;
        if self.buf.capacity() > 64 << 10 {
            self.buf.shrink_to(64 << 10);
        }
        if self.dropped > 0 {
            let count = std::mem::take(&mut self.dropped);
            let line = match self.kind {
                Kind::Log => format!(
                    "{}execd: {count} log line(s) dropped: stderr was not taking them\n",
                    stamp_prefix(Some(now))
                )
                .into_bytes(),
                Kind::Audit => {
                    let mut fields = Map::new();
                    fields.insert("count".into(), count.into());
                    audit_line(now, "dropped", None, fields)
                }
            };
            self.buf.extend_from_slice(&line);
        }
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
    stamp: bool,
    /// The wall clock as the loop last read it: what lines are stamped with.
    pub wall: SystemTime,
    refusals: std::collections::HashMap<String, Refusals>,
}

impl Log {
    pub fn new(stamp: bool) -> Log {
        Log {
            queue: Queue::new(QUEUE_BYTES, Kind::Log),
            stamp,
            wall: SystemTime::UNIX_EPOCH,
            refusals: Default::default(),
        }
    }

    /// Queues one log line.
    pub fn line(&mut self, args: std::fmt::Arguments) {
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
            self.line(format_args!(
                "{n} more refusal(s) of {kind} were not logged"
            ));
        }
        self.line(args);
    }

    #[cfg(test)]
    /// Refusals of each kind counted but not logged yet.
    pub fn suppressed(&self, kind: &str) -> u64 {
        self.refusals.get(kind).map_or(0, |r| r.suppressed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_queue_counts_lines_and_reports_them_once_drained() {
        let mut q = Queue::new(10, Kind::Log);
        q.push(b"12345\n");
        q.push(b"abcdef\n"); // does not fit: dropped whole
        q.push(b"xyz\n");
        assert_eq!(q.pending(), b"12345\nxyz\n");
        assert_eq!(q.dropped(), 1);
        q.consume(6, crate::types::test_clock().1);
        assert_eq!(q.pending(), b"xyz\n");
        q.consume(4, crate::types::test_clock().1);
        let report = String::from_utf8(q.pending().to_vec()).unwrap();
        assert!(report.contains("1 log line(s) dropped"), "{report}");
        assert_eq!(q.dropped(), 0);
    }

    #[test]
    fn audit_drops_become_a_dropped_record() {
        let mut q = Queue::new(4, Kind::Audit);
        q.push(b"too long\n");
        q.push(b"nope\n");
        assert!(q.pending().is_empty());
        q.consume(0, crate::types::test_clock().1);
        let text = String::from_utf8(q.pending().to_vec()).unwrap();
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
}
