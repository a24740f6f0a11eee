//! The pump: ring contents turned into Wire-style `Output`, `Gap` and `Exit` events for
//! each subscriber, as far as its connection has room (`methods::events` subscribes).
//!
//! Invariants:
//! - A subscriber gets its stream's bytes in order, each `Output` carrying the offset of
//!   its first byte; chunks never split a UTF-8 character. Bytes it will not get are
//!   announced by one `Gap` with their count, so `offset`s always add up.
//! - Output events are queued only while the connection's outgoing buffer is under
//!   `--client-buffer`. Past it the subscriber is `lagging`: nothing more is queued for it
//!   until the buffer drains below half, then one `Gap` covers what it missed and delivery
//!   resumes from the live edge. `Exit` and responses always go through.
//! - `Exit` follows everything the command wrote before it exited. Output that lingering
//!   descendants write later still follows as `Output` until the pipe closes.
//! - The pump reports only the connections it queued bytes for: a subscriber with nothing
//!   to send asks the loop for nothing (no flush, no wake-up).

use std::io::Write;

use serde_json::json;

use crate::core::ring::Ring;
use crate::core::table::{ConnId, Family, Key, Proc, Stream, Sub, Table};
use crate::core::view;
use crate::wire::rpc;

/// Largest `Output` chunk, in bytes.
const CHUNK: u64 = 64 << 10;

/// A connection's outgoing buffer as the pump sees it.
pub trait Outbox {
    /// Under the cap: room for output events.
    fn has_room(&self) -> bool;
    /// Below half the cap: a lagging subscriber may resume.
    fn below_half(&self) -> bool;
    /// Bytes queued and not yet written.
    fn pending(&self) -> usize;
    /// The buffer itself, for events written in place.
    fn buf(&mut self) -> &mut Vec<u8>;
}

/// The outboxes of every connection, by id.
pub trait Outboxes {
    fn outbox(&mut self, conn: ConnId) -> Option<&mut dyn Outbox>;
}

/// What a pump did.
#[derive(Debug, Default, PartialEq)]
pub struct Pumped {
    /// Connections it queued bytes for (those, and only those, need a flush).
    pub touched: Vec<ConnId>,
    /// The command's pipes were paused for a lossless subscriber and may be read again.
    pub resumed: Vec<Key>,
}

/// A connection's buffer drained below half its cap: lagging subscribers get their `Gap`
/// and resume from the live edge, lossless ones take what waited for them.
pub fn on_room(table: &mut Table, conn: ConnId, outs: &mut dyn Outboxes) -> Pumped {
    let below_half = outs.outbox(conn).is_some_and(|o| o.below_half());
    if !below_half {
        return Pumped::default();
    }
    let keys = table.subs_of.get(&conn).cloned().unwrap_or_default();
    let mut all = Pumped::default();
    for key in keys {
        let one = pump(table, key, outs);
        all.touched.extend(one.touched);
        all.resumed.extend(one.resumed);
    }
    all.touched.sort_unstable();
    all.touched.dedup();
    all
}

fn stream_name(p: &Proc, stream: usize) -> &'static str {
    match (&p.family, stream) {
        (Family::Terminal { .. } | Family::Shell { .. }, _) => "output",
        (Family::Bash { .. }, 0) => "stdout",
        (Family::Bash { .. }, _) => "stderr",
    }
}

fn gap_event(out: &mut Vec<u8>, id: &str, stream: &str, offset: u64, skipped: u64) {
    let payload = json!({ "id": id, "stream": stream, "offset": offset, "skipped": skipped });
    rpc::write_event(out, "Gap", &payload);
}

/// The start of an `Output` event, up to and including its offset.
fn output_head(out: &mut Vec<u8>, id: &str, stream: &str, from: u64) {
    rpc::write_event_head(out, "Output");
    out.extend_from_slice(b"{\"id\":");
    crate::wire::encode::write_json_str(out, id);
    out.extend_from_slice(b",\"stream\":\"");
    out.extend_from_slice(stream.as_bytes());
    out.extend_from_slice(b"\",\"offset\":");
    let _ = write!(out, "{from}");
}

/// An `Output` event of a base64 subscription: the exact bytes of `[from, to)`.
fn base64_event(out: &mut Vec<u8>, id: &str, stream: &str, ring: &Ring, from: u64, to: u64) {
    output_head(out, id, stream, from);
    out.extend_from_slice(b",\"encoding\":\"base64\",\"data\":\"");
    match ring.slices(from, to) {
        (one, []) => crate::wire::encode::base64_encode(out, one),
        (a, b) => crate::wire::encode::base64_encode(out, &[a, b].concat()),
    }
    out.extend_from_slice(b"\"}}}\n");
}

/// An `Output` event for `[from, to)` of stream `st`, escaped straight from the ring: text
/// that is valid UTF-8 in one slice (the common case) is never copied into a `String`
/// first. A PTY's events carry its plain text.
fn output_event(out: &mut Vec<u8>, id: &str, stream: &str, st: &Stream, from: u64, to: u64) {
    output_head(out, id, stream, from);
    out.extend_from_slice(b",\"data\":");
    match st.ring.slices(from, to) {
        (one, []) if !st.plain => match std::str::from_utf8(one) {
            Ok(text) => crate::wire::encode::write_json_str(out, text),
            Err(_) => crate::wire::encode::write_json_str(out, &String::from_utf8_lossy(one)),
        },
        _ => crate::wire::encode::write_json_str(out, &st.text(from, to)),
    }
    out.extend_from_slice(b"}}}\n");
}

/// Delivers what each subscriber of `key` is owed, as far as its connection has room,
/// and pauses or resumes the command's pipes for its lossless subscribers.
pub fn pump(table: &mut Table, key: Key, outs: &mut dyn Outboxes) -> Pumped {
    let Some(p) = table.procs.get_mut(&key) else {
        return Pumped::default();
    };
    let was_paused = p.paused;
    if p.subs.is_empty() {
        p.paused = false;
        return Pumped {
            touched: Vec::new(),
            resumed: if was_paused { vec![key] } else { Vec::new() },
        };
    }
    let mut subs = std::mem::take(&mut p.subs);
    let p = &table.procs[&key];
    let mut keep = Vec::with_capacity(subs.len());
    let mut touched = Vec::new();
    let mut finished = Vec::new();
    let mut behind = false;
    for mut sub in subs.drain(..) {
        let Some(out) = outs.outbox(sub.conn) else {
            continue; // its connection is gone
        };
        let before = out.pending();
        if sub.lagging && out.below_half() {
            catch_up(p, &mut sub, out.buf());
        }
        let mut caught_up = true;
        for i in 0..p.streams.len() {
            caught_up &= deliver(p, i, &mut sub, out);
        }
        if sub.opts.lossless && !caught_up {
            behind = true;
        }
        // Exit follows everything read before it; a lossless subscriber gets it only
        // once it has every byte.
        let exit_due = p.exit.is_some() && p.drained && !sub.done;
        if exit_due && (caught_up || !sub.opts.lossless) {
            if sub.lagging {
                catch_up(p, &mut sub, out.buf());
            }
            rpc::write_event(out.buf(), "Exit", &view::exit_event(p));
            sub.done = true;
        }
        if out.pending() != before {
            touched.push(sub.conn);
        }
        if sub.done && p.streams.iter().all(|st| !st.open) {
            finished.push(sub.conn);
            continue; // nothing more can come
        }
        keep.push(sub);
    }
    let mut resumed = Vec::new();
    if let Some(p) = table.procs.get_mut(&key) {
        p.subs = keep;
        p.paused = behind;
        if was_paused && !behind {
            resumed.push(key);
        }
    }
    for conn in finished {
        table.unlink_sub(conn, key);
    }
    Pumped { touched, resumed }
}

/// The end of what a subscriber may be handed of a stream now: every byte for base64,
/// else up to the last complete character of a stream that may still grow.
fn deliverable_end(st: &crate::core::table::Stream, sub: &Sub) -> u64 {
    if sub.opts.base64 {
        st.ring.end()
    } else {
        st.text_end()
    }
}

/// Announces everything a lagging subscriber missed as one `Gap` per stream and moves it
/// to the live edge.
fn catch_up(p: &Proc, sub: &mut Sub, out: &mut Vec<u8>) {
    for (i, st) in p.streams.iter().enumerate() {
        let end = deliverable_end(st, sub);
        if sub.next[i] < end {
            gap_event(
                out,
                &p.id,
                stream_name(p, i),
                sub.next[i],
                end - sub.next[i],
            );
            sub.next[i] = end;
        }
    }
    sub.lagging = false;
}

/// Queues `Output` events for one stream until it is caught up or the connection is full.
/// Returns whether the subscriber has everything deliverable now. A lossy subscriber
/// that finds no room becomes `lagging`; a lossless one just waits.
fn deliver(p: &Proc, i: usize, sub: &mut Sub, out: &mut dyn Outbox) -> bool {
    if sub.lagging {
        return false;
    }
    let st = &p.streams[i];
    let ring = &st.ring;
    let name = stream_name(p, i);
    let start = ring.start();
    if sub.next[i] < start {
        // Dropped from the ring before this subscriber got them.
        gap_event(out.buf(), &p.id, name, sub.next[i], start - sub.next[i]);
        sub.next[i] = start;
    }
    let end = ring.end();
    while sub.next[i] < end {
        if !out.has_room() {
            if !sub.opts.lossless {
                sub.lagging = true;
            }
            return false;
        }
        let next = sub.next[i];
        let chunk_end = end.min(next + CHUNK);
        if sub.opts.base64 {
            base64_event(out.buf(), &p.id, name, ring, next, chunk_end);
            sub.next[i] = chunk_end;
            continue;
        }
        let (ws, we) = ring.utf8_window(next, chunk_end, st.open || chunk_end < end);
        let buf = out.buf();
        if ws > next {
            // Continuation bytes of a character whose start this subscriber never had.
            gap_event(buf, &p.id, name, next, ws - next);
            sub.next[i] = ws;
        }
        if ws >= we {
            break; // only an incomplete character so far
        }
        output_event(buf, &p.id, name, st, ws, we);
        sub.next[i] = we;
    }
    sub.next[i] >= deliverable_end(st, sub)
}

#[cfg(test)]
pub mod tests {
    use super::*;
    use crate::core::table::KillReason;
    use crate::core::table::SubOpts;
    use crate::core::testkit::*;
    use crate::core::Effect;
    use crate::types::{Ended, Usage};
    use serde_json::Value;
    use std::collections::HashMap;

    /// A connection's outgoing buffer with a cap, and nothing behind it.
    #[derive(Default)]
    pub struct FakeOut {
        pub buf: Vec<u8>,
        pub cap: usize,
    }

    impl Outbox for FakeOut {
        fn has_room(&self) -> bool {
            self.buf.len() < self.cap
        }
        fn below_half(&self) -> bool {
            self.buf.len() < self.cap / 2
        }
        fn pending(&self) -> usize {
            self.buf.len()
        }
        fn buf(&mut self) -> &mut Vec<u8> {
            &mut self.buf
        }
    }

    #[derive(Default)]
    pub struct FakeOuts(pub HashMap<ConnId, FakeOut>);

    impl Outboxes for FakeOuts {
        fn outbox(&mut self, conn: ConnId) -> Option<&mut dyn Outbox> {
            self.0.get_mut(&conn).map(|o| o as &mut dyn Outbox)
        }
    }

    impl FakeOuts {
        pub fn with(conns: &[(usize, usize)]) -> FakeOuts {
            FakeOuts(
                conns
                    .iter()
                    .map(|&(c, cap)| {
                        (
                            ConnId(c),
                            FakeOut {
                                buf: Vec::new(),
                                cap,
                            },
                        )
                    })
                    .collect(),
            )
        }

        /// Takes the events queued for `conn` so far (as the socket would).
        pub fn drain(&mut self, conn: usize) -> Vec<Value> {
            let out = self.0.get_mut(&ConnId(conn)).expect("conn");
            let text = String::from_utf8(std::mem::take(&mut out.buf)).expect("utf-8");
            text.lines()
                .map(|l| serde_json::from_str(l).expect("json"))
                .collect()
        }
    }

    #[test]
    fn a_subscriber_with_nothing_to_send_asks_for_no_wake_up() {
        let mut c = core();
        let k = terminal(&mut c);
        c.table.subscribe(k, C1, [0, 0], SubOpts::default());
        let mut outs = FakeOuts::with(&[(1, 1 << 20)]);
        assert!(
            pump(&mut c.table, k, &mut outs).touched.is_empty(),
            "nothing written: no connection to flush"
        );
        assert!(on_room(&mut c.table, C1, &mut outs).touched.is_empty());
        c.output(k, 0, b"hi\n");
        assert_eq!(pump(&mut c.table, k, &mut outs).touched, vec![C1]);
        let ev = outs.drain(1);
        assert_eq!(ev[0]["params"]["payload"]["data"], "hi\n");
        // Caught up: quiet again.
        assert!(pump(&mut c.table, k, &mut outs).touched.is_empty());
        assert!(on_room(&mut c.table, C1, &mut outs).touched.is_empty());
    }

    #[test]
    fn a_lagging_subscriber_gets_one_gap_and_resumes_at_the_live_edge() {
        let mut c = core();
        let k = terminal(&mut c); // ring of 64 bytes
        c.table.subscribe(k, C1, [0, 0], SubOpts::default());
        let mut outs = FakeOuts::with(&[(1, 200)]);
        c.output(k, 0, &[b'a'; 60]);
        pump(&mut c.table, k, &mut outs);
        c.output(k, 0, &[b'b'; 60]);
        pump(&mut c.table, k, &mut outs);
        // Over the cap of 200 now: lagging, more output is not queued.
        let queued = outs.0[&C1].buf.len();
        assert!(queued >= 200, "{queued}");
        c.output(k, 0, &[b'c'; 60]);
        assert!(pump(&mut c.table, k, &mut outs).touched.is_empty());
        assert!(c.table.get(k).unwrap().subs[0].lagging);
        // The socket takes it all: one Gap for what was missed, then live output.
        let seen = outs.drain(1);
        assert_eq!(seen.len(), 2);
        assert_eq!(on_room(&mut c.table, C1, &mut outs).touched, vec![C1]);
        let ev = outs.drain(1);
        assert_eq!(ev.len(), 1);
        assert_eq!(ev[0]["params"]["type"], "Gap");
        assert_eq!(ev[0]["params"]["payload"]["offset"], 120);
        assert_eq!(ev[0]["params"]["payload"]["skipped"], 60);
        c.output(k, 0, b"d");
        pump(&mut c.table, k, &mut outs);
        let ev = outs.drain(1);
        assert_eq!(ev[0]["params"]["payload"]["offset"], 180);
        assert_eq!(ev[0]["params"]["payload"]["data"], "d");
    }

    #[test]
    fn exit_reaches_subscribers_of_a_released_command_before_it_is_forgotten() {
        let mut c = core();
        let k = terminal(&mut c);
        c.table.subscribe(k, C1, [0, 0], SubOpts::default());
        c.release(k, KillReason::Release);
        c.exited(k, Ended::Signal(libc::SIGTERM), Usage::default(), None);
        let mut outs = FakeOuts::with(&[(1, 1 << 20)]);
        for e in std::mem::take(&mut c.out) {
            if let Effect::Pump(key) = e {
                pump(&mut c.table, key, &mut outs);
            }
        }
        c.sweep();
        assert!(c.table.get(k).is_none());
        assert!(c.table.subs_of.is_empty(), "the subscription went with it");
        let ev = outs.drain(1);
        assert_eq!(ev.last().unwrap()["params"]["type"], "Exit");
    }
}
