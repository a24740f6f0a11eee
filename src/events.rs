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

use std::io::Write;

use mio::Token;
use serde_json::{json, Value};

use crate::acp;
use crate::conn::Conn;
use crate::ring::Ring;
use crate::rpc::{self, Params, RpcError};
use crate::server::{Caller, Server};
use crate::table::{Family, Key, Proc, Sub};

/// Largest `Output` chunk, in bytes.
const CHUNK: u64 = 64 << 10;

/// `events/subscribe {id, offset?, stderr_offset?}`.
pub fn subscribe(s: &mut Server, caller: &Caller, p: &Params) -> Result<Value, RpcError> {
    let id = p.str("id")?;
    let next = [
        p.opt_u64("offset")?.unwrap_or(0),
        p.opt_u64("stderr_offset")?.unwrap_or(0),
    ];
    let key = s
        .table
        .find(id, caller.uid)
        .ok_or_else(|| RpcError::not_found("terminal or command", id))?;
    if let Family::Bash { session_id } =
        s.table
            .get(key)
            .map(|p| p.family.clone())
            .unwrap_or(Family::Terminal {
                session_id: String::new(),
            })
    {
        let now = s.now;
        s.table.touch_session(&session_id, now);
    }
    let proc_ = s
        .table
        .get_mut(key)
        .ok_or_else(|| RpcError::internal("vanished"))?;
    proc_.subs.retain(|x| x.conn != caller.conn);
    proc_.subs.push(Sub {
        conn: caller.conn,
        next,
        lagging: false,
        done: false,
    });
    if let Some(c) = s.conns.get_mut(&caller.conn) {
        if !c.subs.contains(&key) {
            c.subs.push(key);
        }
    }
    // Delivery starts after the response is queued.
    s.defer_pump(key);
    Ok(json!({}))
}

/// `events/unsubscribe {id}`.
pub fn unsubscribe(s: &mut Server, caller: &Caller, p: &Params) -> Result<Value, RpcError> {
    let id = p.str("id")?;
    let key = s
        .table
        .find(id, caller.uid)
        .ok_or_else(|| RpcError::not_found("terminal or command", id))?;
    detach(s, key, caller.conn);
    Ok(json!({}))
}

fn detach(s: &mut Server, key: Key, conn: Token) {
    if let Some(p) = s.table.get_mut(key) {
        p.subs.retain(|x| x.conn != conn);
    }
    if let Some(c) = s.conns.get_mut(&conn) {
        c.subs.retain(|k| *k != key);
    }
}

/// A connection closed: forget its subscriptions.
pub fn drop_conn(s: &mut Server, conn: Token, subs: Vec<Key>) {
    for key in subs {
        if let Some(p) = s.table.get_mut(key) {
            p.subs.retain(|x| x.conn != conn);
        }
    }
}

/// A process is being forgotten: its subscribers' connections let go of it.
pub fn drop_proc(s: &mut Server, key: Key) {
    let conns: Vec<Token> = match s.table.get(key) {
        Some(p) => p.subs.iter().map(|x| x.conn).collect(),
        None => return,
    };
    for c in conns {
        if let Some(c) = s.conns.get_mut(&c) {
            c.subs.retain(|k| *k != key);
        }
    }
}

/// A connection's buffer drained below half its cap: lagging subscribers get their `Gap`
/// and resume from the live edge.
pub fn on_room(s: &mut Server, conn: Token) {
    let Some(c) = s.conns.get(&conn) else { return };
    if !c.below_half() {
        return;
    }
    for key in c.subs.clone() {
        pump(s, key);
    }
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

fn gap_event(out: &mut Vec<u8>, id: &str, stream: &str, offset: u64, skipped: u64) {
    write_event_head(out, "Gap");
    let payload = json!({ "id": id, "stream": stream, "offset": offset, "skipped": skipped });
    rpc::write_json(out, &payload);
    out.extend_from_slice(b"}}\n");
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

/// The `Exit` payload.
pub fn exit_payload(p: &Proc) -> Value {
    let (code, signal) = p.exit_fields();
    let meta = acp::usage_meta(p);
    json!({
        "id": p.id,
        "exitCode": code,
        "signal": signal,
        "status": p.status(),
        "durationMs": meta["durationMs"],
        "userMs": meta["userMs"],
        "systemMs": meta["systemMs"],
        "maxRssKb": meta["maxRssKb"],
    })
}

/// Delivers what each subscriber of `key` is owed, as far as its connection has room.
pub fn pump(s: &mut Server, key: Key) {
    let Some(p) = s.table.procs.get_mut(&key) else {
        return;
    };
    if p.subs.is_empty() {
        return;
    }
    let mut subs = std::mem::take(&mut p.subs);
    let p = &s.table.procs[&key];
    let mut keep = Vec::with_capacity(subs.len());
    let mut touched = Vec::with_capacity(subs.len());
    for mut sub in subs.drain(..) {
        let Some(conn) = s.conns.get_mut(&sub.conn) else {
            continue; // its connection is gone
        };
        let queued_before = conn.pending_out();
        if sub.lagging && conn.below_half() {
            catch_up(p, &mut sub, conn.out_buf());
        }
        for i in 0..p.streams.len() {
            deliver(p, i, &mut sub, conn);
        }
        if p.exit.is_some() && !sub.done {
            if sub.lagging {
                catch_up(p, &mut sub, conn.out_buf());
            }
            let out = conn.out_buf();
            write_event_head(out, "Exit");
            rpc::write_json(out, &exit_payload(p));
            out.extend_from_slice(b"}}\n");
            sub.done = true;
        }
        // Only a connection that got bytes needs a flush: marking the others would make
        // the loop poll again at once, for ever, while a quiet command is watched.
        if conn.pending_out() != queued_before {
            touched.push(sub.conn);
        }
        if sub.done && p.streams.iter().all(|st| !st.open()) {
            conn.subs.retain(|k| *k != key);
            continue; // nothing more can come
        }
        keep.push(sub);
    }
    if let Some(p) = s.table.procs.get_mut(&key) {
        p.subs = keep;
    }
    for t in touched {
        s.mark_dirty(t);
    }
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
fn deliver(p: &Proc, i: usize, sub: &mut Sub, conn: &mut Conn) {
    if sub.lagging {
        return;
    }
    let st = &p.streams[i];
    let ring = &st.ring;
    let name = stream_name(p, i);
    let start = ring.start();
    if sub.next[i] < start {
        // Dropped from the ring before this subscriber got them.
        gap_event(
            conn.out_buf(),
            &p.id,
            name,
            sub.next[i],
            start - sub.next[i],
        );
        sub.next[i] = start;
    }
    let end = ring.end();
    while sub.next[i] < end {
        if !conn.has_room() {
            sub.lagging = true;
            return;
        }
        let next = sub.next[i];
        let chunk_end = end.min(next + CHUNK);
        let (ws, we) = ring.utf8_window(next, chunk_end, st.open() || chunk_end < end);
        let out = conn.out_buf();
        if ws > next {
            // Continuation bytes of a character whose start this subscriber never had.
            gap_event(out, &p.id, name, next, ws - next);
            sub.next[i] = ws;
        }
        if ws >= we {
            return; // only an incomplete character so far
        }
        output_event(out, &p.id, name, ring, ws, we);
        sub.next[i] = we;
    }
}
