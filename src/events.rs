//! Live output as Wire-style `event` notifications: `events/subscribe`, `unsubscribe`, and
//! the pump that turns ring contents into `Output`, `Gap` and `Exit` events.
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

use serde_json::{json, Value};

use crate::core::{Caller, Core, Effect, Step};
use crate::ring::Ring;
use crate::rpc::{self, Params, RpcError};
use crate::table::{ConnId, Family, Key, Proc, Sub, Table};
use crate::view;

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

/// `events/subscribe {id, offset?, stderr_offset?}`.
pub fn subscribe(core: &mut Core, caller: &Caller, p: &Params) -> Result<Step, RpcError> {
    let id = p.str("id")?;
    let next = [
        p.opt_u64("offset")?.unwrap_or(0),
        p.opt_u64("stderr_offset")?.unwrap_or(0),
    ];
    let key = core
        .table
        .find(id, caller.uid)
        .ok_or_else(|| RpcError::not_found("terminal or command", id))?;
    core.touch_session_of(key);
    core.table.subscribe(key, caller.conn, next);
    // Delivery starts after the response is queued.
    core.out.push(Effect::Pump(key));
    Ok(Step::Done(json!({})))
}

/// `events/unsubscribe {id}`.
pub fn unsubscribe(core: &mut Core, caller: &Caller, p: &Params) -> Result<Step, RpcError> {
    let id = p.str("id")?;
    let key = core
        .table
        .find(id, caller.uid)
        .ok_or_else(|| RpcError::not_found("terminal or command", id))?;
    core.table.unsubscribe(key, caller.conn);
    Ok(Step::Done(json!({})))
}

/// A connection's buffer drained below half its cap: lagging subscribers get their `Gap`
/// and resume from the live edge. Returns the connections that got bytes.
pub fn on_room(table: &mut Table, conn: ConnId, outs: &mut dyn Outboxes) -> Vec<ConnId> {
    let below_half = outs.outbox(conn).is_some_and(|o| o.below_half());
    if !below_half {
        return Vec::new();
    }
    let keys = table.subs_of.get(&conn).cloned().unwrap_or_default();
    let mut touched = Vec::new();
    for key in keys {
        touched.extend(pump(table, key, outs));
    }
    touched.sort_unstable();
    touched.dedup();
    touched
}

fn stream_name(p: &Proc, stream: usize) -> &'static str {
    match (&p.family, stream) {
        (Family::Terminal { .. }, _) => "output",
        (Family::Bash { .. }, 0) => "stdout",
        (Family::Bash { .. }, _) => "stderr",
    }
}

fn write_event_head(out: &mut Vec<u8>, kind: &str) {
    out.extend_from_slice(b"{\"jsonrpc\":\"2.0\",\"method\":\"event\",\"params\":{\"type\":\"");
    out.extend_from_slice(kind.as_bytes());
    out.extend_from_slice(b"\",\"payload\":");
}

/// Appends a whole `event` notification with a JSON payload.
pub fn write_event(out: &mut Vec<u8>, kind: &str, payload: &Value) {
    write_event_head(out, kind);
    rpc::write_json(out, payload);
    out.extend_from_slice(b"}}\n");
}

fn gap_event(out: &mut Vec<u8>, id: &str, stream: &str, offset: u64, skipped: u64) {
    let payload = json!({ "id": id, "stream": stream, "offset": offset, "skipped": skipped });
    write_event(out, "Gap", &payload);
}

/// An `Output` event for `[from, to)` of `ring`, escaped straight from the ring: text that
/// is valid UTF-8 in one slice (the common case) is never copied into a `String` first.
fn output_event(out: &mut Vec<u8>, id: &str, stream: &str, ring: &Ring, from: u64, to: u64) {
    write_event_head(out, "Output");
    out.extend_from_slice(b"{\"id\":");
    rpc::write_json_str(out, id);
    out.extend_from_slice(b",\"stream\":\"");
    out.extend_from_slice(stream.as_bytes());
    out.extend_from_slice(b"\",\"offset\":");
    let _ = write!(out, "{from}");
    out.extend_from_slice(b",\"data\":");
    match ring.slices(from, to) {
        (one, []) => match std::str::from_utf8(one) {
            Ok(text) => rpc::write_json_str(out, text),
            Err(_) => rpc::write_json_str(out, &String::from_utf8_lossy(one)),
        },
        _ => rpc::write_json_str(out, &ring.text(from, to)),
    }
    out.extend_from_slice(b"}}}\n");
}

/// Delivers what each subscriber of `key` is owed, as far as its connection has room.
/// Returns the connections it queued bytes for (those, and only those, need a flush).
pub fn pump(table: &mut Table, key: Key, outs: &mut dyn Outboxes) -> Vec<ConnId> {
    let Some(p) = table.procs.get_mut(&key) else {
        return Vec::new();
    };
    if p.subs.is_empty() {
        return Vec::new();
    }
    let mut subs = std::mem::take(&mut p.subs);
    let p = &table.procs[&key];
    let mut keep = Vec::with_capacity(subs.len());
    let mut touched = Vec::new();
    let mut finished = Vec::new();
    for mut sub in subs.drain(..) {
        let Some(out) = outs.outbox(sub.conn) else {
            continue; // its connection is gone
        };
        let before = out.pending();
        if sub.lagging && out.below_half() {
            catch_up(p, &mut sub, out.buf());
        }
        for i in 0..p.streams.len() {
            deliver(p, i, &mut sub, out);
        }
        if p.exit.is_some() && !sub.done {
            if sub.lagging {
                catch_up(p, &mut sub, out.buf());
            }
            write_event(out.buf(), "Exit", &view::exit_event(p));
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
    if let Some(p) = table.procs.get_mut(&key) {
        p.subs = keep;
    }
    for conn in finished {
        table.unlink_sub(conn, key);
    }
    touched
}

/// Announces everything a lagging subscriber missed as one `Gap` per stream and moves it
/// to the live edge.
fn catch_up(p: &Proc, sub: &mut Sub, out: &mut Vec<u8>) {
    for (i, st) in p.streams.iter().enumerate() {
        let end = st.text_end();
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
fn deliver(p: &Proc, i: usize, sub: &mut Sub, out: &mut dyn Outbox) {
    if sub.lagging {
        return;
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
            sub.lagging = true;
            return;
        }
        let next = sub.next[i];
        let chunk_end = end.min(next + CHUNK);
        let (ws, we) = ring.utf8_window(next, chunk_end, st.open || chunk_end < end);
        let buf = out.buf();
        if ws > next {
            // Continuation bytes of a character whose start this subscriber never had.
            gap_event(buf, &p.id, name, next, ws - next);
            sub.next[i] = ws;
        }
        if ws >= we {
            return; // only an incomplete character so far
        }
        output_event(buf, &p.id, name, ring, ws, we);
        sub.next[i] = we;
    }
}

#[cfg(test)]
pub mod tests {
    use super::*;
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
}
