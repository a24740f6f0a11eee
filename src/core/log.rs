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

use std::collections::VecDeque;
use std::time::{Duration, Instant, SystemTime};

use serde_json::{Map, Value};

pub use crate::types::Level;
use crate::wire::encode::{rfc3339, write_json, write_json_str};
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

/// One line waiting in a [`Queue`]: its length, and for a report of drops the count it
/// carries (which goes back into the count if the report itself is lost).
#[derive(Debug, Clone, Copy)]
struct Line {
    len: usize,
    reports: u64,
}

/// A bounded queue of whole lines. It knows where each line ends, so a writer that stops
/// mid-line knows how much of that line went out, and one that loses what it holds (a
/// write error) counts lines, not bytes.
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
    /// Lines dropped since the last report of drops was queued.
    dropped: u64,
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
            kind,
        }
    }

    /// Queues one line (which must end in `\n`), or counts it as dropped when it does not fit.
    pub fn push(&mut self, line: &[u8]) {
        if self.buf.len() - self.pos + line.len() > self.cap {
            self.dropped += 1;
            return;
        }
        self.append(line, 0);
    }

    fn append(&mut self, line: &[u8], reports: u64) {
        if line.is_empty() {
            return;
        }
        self.buf.extend_from_slice(line);
        self.lines.push_back(Line {
            len: line.len(),
            reports,
        });
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
        self.pos == self.buf.len() && self.dropped == 0
    }

    #[cfg(test)]
    /// Lines dropped and not yet reported.
    pub fn dropped(&self) -> u64 {
        self.dropped
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
        while let Some(front) = self.lines.front() {
            if self.front_written < front.len {
                break;
            }
            self.front_written -= front.len;
            self.lines.pop_front();
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
        let lost = self.lines.len() as u64;
        for line in self.lines.drain(..) {
            self.dropped += if line.reports > 0 { line.reports } else { 1 };
        }
        self.buf.clear();
        self.pos = 0;
        self.front_written = 0;
        lost
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
        self.dropped += if front.reports > 0 { front.reports } else { 1 };
        self.buf.drain(..self.pos + front.len - self.front_written);
        self.pos = 0;
        self.front_written = 0;
        true
    }

    /// Once everything waiting is written, queues the report of the lines lost (stamped
    /// `now`): a plain line for the log, a `dropped` record for the audit. Returns whether
    /// it queued one.
    pub fn report_drops(&mut self, now: SystemTime) -> bool {
        if self.dropped == 0 || self.pos != self.buf.len() {
            return false;
        }
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
        self.append(&line, count);
        true
    }
}

impl Queue {
    /// What an upgrade in place carries: the bytes waiting, every line (partly) waiting
    /// with the drops it reports, how much of the first went out, and the drops not yet
    /// reported.
    pub fn carry(&self, blobs: &mut BlobsOut) -> QueueImage {
        QueueImage {
            pending: blobs.put(self.pending()),
            lines: self.lines.iter().map(|l| (l.len, l.reports)).collect(),
            front_written: self.front_written,
            cap: self.cap,
            dropped: self.dropped,
        }
    }

    /// The queue `carry` described, of `kind`.
    pub fn resume(img: &QueueImage, blobs: &BlobsIn, kind: Kind) -> Result<Queue, StateError> {
        let buf = blobs.get(img.pending)?.to_vec();
        let lines: VecDeque<Line> = img
            .lines
            .iter()
            .map(|&(len, reports)| Line { len, reports })
            .collect();
        let held: usize = lines.iter().map(|l| l.len).sum();
        if held != buf.len() + img.front_written {
            return Err(StateError::new(format!(
                "a queue of {} bytes whose lines hold {held}",
                buf.len() + img.front_written
            )));
        }
        Ok(Queue {
            buf,
            pos: 0,
            lines,
            front_written: img.front_written,
            cap: img.cap,
            dropped: img.dropped,
            kind,
        })
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
