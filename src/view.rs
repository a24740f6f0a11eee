//! How a command looks from outside, rendered once: its exit (code or signal), its status
//! word, its resource use, and the result objects that carry them (ACP's `exitStatus`,
//! the bash command and output objects, the `Exit` event, log text). Every method family,
//! the core's parked answers and the event pump render through here, so a command that
//! ended one way is reported that way everywhere.

use serde_json::{json, Map, Value};

use crate::process::{signal_name, Ended};
use crate::ring::middle_cut;
use crate::table::Proc;

/// `(exit code, signal name)` as every protocol reports them: a code with no signal when
/// it exited, no code and the signal's name when a signal ended it, neither while it runs.
pub fn exit_fields(p: &Proc) -> (Option<i32>, Option<String>) {
    match p.exit.map(|e| e.ended) {
        Some(Ended::Code(c)) => (Some(c), None),
        Some(Ended::Signal(sig)) => (None, Some(signal_name(sig))),
        None => (None, None),
    }
}

/// ACP `{exitCode, signal}` (both null while it runs).
pub fn exit_status(p: &Proc) -> Value {
    let (code, signal) = exit_fields(p);
    json!({ "exitCode": code, "signal": signal })
}

/// Rusage and duration of an exited process, for `_meta.execd` (null while it runs).
pub fn usage_meta(p: &Proc) -> Value {
    let Some(e) = &p.exit else { return Value::Null };
    json!({
        "durationMs": p.duration().as_millis() as u64,
        "userMs": e.usage.user.as_millis() as u64,
        "systemMs": e.usage.system.as_millis() as u64,
        "maxRssKb": e.usage.max_rss_kb,
    })
}

/// The `Exit` event's payload.
pub fn exit_event(p: &Proc) -> Value {
    let (code, signal) = exit_fields(p);
    let mut v = Map::new();
    v.insert("id".into(), p.id.clone().into());
    v.insert("exitCode".into(), code.into());
    v.insert("signal".into(), signal.into());
    v.insert("status".into(), p.status().into());
    if let Value::Object(usage) = usage_meta(p) {
        v.extend(usage);
    }
    Value::Object(v)
}

/// "exit 3", "signal SIGKILL" or "running", for log lines.
pub fn describe_exit(p: &Proc) -> String {
    match exit_fields(p) {
        (Some(c), _) => format!("exit {c}"),
        (_, Some(sig)) => format!("signal {sig}"),
        _ => "running".into(),
    }
}

/// `exit_code`, and `signal` only when a signal ended the command (bash objects).
fn add_bash_exit(v: &mut Map<String, Value>, p: &Proc) {
    let (code, signal) = exit_fields(p);
    v.insert("exit_code".into(), code.into());
    if let Some(sig) = signal {
        v.insert("signal".into(), sig.into());
    }
}

/// The bash `{command_id, command, status, exit_code}` (+ `signal`).
pub fn command_info(p: &Proc) -> Value {
    let mut v = Map::new();
    v.insert("command_id".into(), p.id.clone().into());
    v.insert("command".into(), p.command.clone().into());
    v.insert("status".into(), p.status().into());
    add_bash_exit(&mut v, p);
    Value::Object(v)
}

/// The whole retained text of one stream and the offset it reaches.
fn whole_text(p: &Proc, stream: usize) -> (String, u64) {
    let s = &p.streams[stream];
    let (from, to) = s.ring.utf8_window(s.ring.start(), s.ring.end(), s.open);
    (s.ring.text(from, to), to)
}

/// The `bash/exec` result for a command as it stands.
pub fn exec_result(p: &Proc, max_len: usize) -> Value {
    let (stdout, offset) = whole_text(p, 0);
    let (stderr, stderr_offset) = whole_text(p, 1);
    let mut v = Map::new();
    v.insert("session_id".into(), p.session_id().into());
    v.insert("command_id".into(), p.id.clone().into());
    v.insert("command".into(), p.command.clone().into());
    v.insert("status".into(), p.status().into());
    v.insert("stdout".into(), middle_cut(stdout, max_len).into());
    v.insert("stderr".into(), middle_cut(stderr, max_len).into());
    add_bash_exit(&mut v, p);
    v.insert("offset".into(), offset.into());
    v.insert("stderr_offset".into(), stderr_offset.into());
    Value::Object(v)
}

/// What one stream holds past `from`: `(text, next offset, skipped)`.
fn read_from(p: &Proc, stream: usize, from: u64) -> (String, u64, u64) {
    let s = &p.streams[stream];
    let ring = &s.ring;
    let start = ring.start();
    let skipped = start.saturating_sub(from);
    let from = from.max(start);
    if from >= ring.end() {
        // Past the end: nothing, and the end to continue from.
        return (String::new(), s.text_end().min(from), skipped);
    }
    let (ws, we) = ring.utf8_window(from, ring.end(), s.open);
    if ws >= we {
        // Continuation bytes of a character begun before `from` are passed over.
        return (String::new(), ws, skipped + (ws - from));
    }
    (ring.text(ws, we), we, skipped + (ws - from))
}

/// Whether `bash/output` with `wait` has something to answer with: text past the offset,
/// bytes skipped (an offset older than what is retained), or an offset past the end
/// (a stale one, answered at once with `""` and the end).
pub fn has_output_past(p: &Proc, from: [u64; 2]) -> bool {
    p.streams.iter().zip(from).any(|(s, from)| {
        let ring = &s.ring;
        if from < ring.start() || from > ring.end() {
            return true;
        }
        let (ws, we) = ring.utf8_window(from, ring.end(), s.open);
        ws < we
    })
}

/// The `bash/output` result from the given offsets.
pub fn output_result(p: &Proc, from: [u64; 2]) -> Value {
    const NAMES: [(&str, &str); 2] = [("stdout", "offset"), ("stderr", "stderr_offset")];
    let mut v = Map::new();
    v.insert("session_id".into(), p.session_id().into());
    for (i, (name, offset_field)) in NAMES.iter().enumerate() {
        let (text, next, skipped) = read_from(p, i, from[i]);
        v.insert((*name).into(), text.into());
        v.insert((*offset_field).into(), next.into());
        if skipped > 0 {
            v.insert(format!("{name}_skipped"), skipped.into());
        }
    }
    v.insert("command".into(), command_info(p));
    Value::Object(v)
}
