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

use serde_json::json;

use crate::core::ring::Ring;
use crate::core::table::{ConnId, Family, Key, Proc, Sub, SubOpts, Table};
use crate::core::view;
use crate::core::{Caller, Core, Effect, Step};
use crate::wire::rpc::{self, Params, RpcError};

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

/// A subscription's options from `lossless` and `encoding` (`"text"` or `"base64"`) of
/// `p`: the params of `events/subscribe`, or the `subscribe` object of a create.
pub fn sub_opts(p: &Params) -> Result<SubOpts, RpcError> {
    let base64 = match p.opt_str("encoding")? {
        None | Some("text") => false,
        Some("base64") => true,
        Some(other) => {
            return Err(RpcError::invalid_params(
                "encoding",
                format!("{other:?} is neither \"text\" nor \"base64\""),
            ))
        }
    };
    Ok(SubOpts {
        lossless: p.opt_bool("lossless")?.unwrap_or(false),
        base64,
    })
}

/// `events/subscribe {id, offset?, stderr_offset?, lossless?, encoding?}`.
pub fn subscribe(core: &mut Core, caller: &Caller, p: &Params) -> Result<Step, RpcError> {
    let id = p.str("id")?;
    let next = [
        p.opt_u64("offset")?.unwrap_or(0),
        p.opt_u64("stderr_offset")?.unwrap_or(0),
    ];
    let opts = sub_opts(p)?;
    let key = core
        .table
        .find(id, caller.uid)
        .ok_or_else(|| RpcError::not_found("terminal or command", id))?;
    core.touch_session_of(key);
    core.table.subscribe(key, caller.conn, next, opts);
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
    // A lossless subscriber leaving may free its command's pipes.
    core.out.push(Effect::Pump(key));
    Ok(Step::Done(json!({})))
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
        (Family::Terminal { .. }, _) => "output",
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

/// An `Output` event for `[from, to)` of `ring`, escaped straight from the ring: text that
/// is valid UTF-8 in one slice (the common case) is never copied into a `String` first.
fn output_event(out: &mut Vec<u8>, id: &str, stream: &str, ring: &Ring, from: u64, to: u64) {
    output_head(out, id, stream, from);
    out.extend_from_slice(b",\"data\":");
    match ring.slices(from, to) {
        (one, []) => match std::str::from_utf8(one) {
            Ok(text) => crate::wire::encode::write_json_str(out, text),
            Err(_) => crate::wire::encode::write_json_str(out, &String::from_utf8_lossy(one)),
        },
        _ => crate::wire::encode::write_json_str(out, &ring.text(from, to)),
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
        output_event(buf, &p.id, name, ring, ws, we);
        sub.next[i] = we;
    }
    sub.next[i] >= deliverable_end(st, sub)
}

#[cfg(test)]
pub mod tests {
    use super::*;
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
}
