//! How a command looks from outside, rendered once: its exit (code or signal), its status
//! word, its resource use, and the result objects that carry them (ACP's `exitStatus`,
//! the bash command and output objects, the `Exit` event, log text). Every method family,
//! the core's parked answers and the event pump render through here, so a command that
//! ended one way is reported that way everywhere.

use serde_json::{json, Map, Value};

use crate::core::ring::middle_cut;
use crate::core::table::Proc;
use crate::types::signal_name;
use crate::types::Ended;
use crate::wire::rpc::{Params, RpcError};

/// `(exit code, signal name)` as every protocol reports them: a code with no signal when
/// it exited, no code and the signal's name when a signal ended it, neither while it runs.
pub fn exit_fields(p: &Proc) -> (Option<i32>, Option<String>) {
    match p.exit.map(|e| e.ended) {
        Some(Ended::Code(c)) => (Some(c), None),
        Some(Ended::Signal(sig)) => (None, Some(signal_name(sig))),
        None => (None, None),
    }
}

/// ACP `{exitCode, signal}` (both null while it runs), and `_meta.execd.oomKilled` when
/// the OOM killer took part of the command's tree.
pub fn exit_status(p: &Proc) -> Value {
    let (code, signal) = exit_fields(p);
    let mut v = json!({ "exitCode": code, "signal": signal });
    if oom_killed(p) {
        v["_meta"] = json!({ "execd": { "oomKilled": true } });
    }
    v
}

/// Rusage and duration of an exited process, for `_meta.execd` (null while it runs);
/// with a cgroup, the whole tree's `cpuMs` and `memoryPeakKb` beside them (where the
/// kernel reports them), and `oomKilled: true` when the OOM killer took part of it.
pub fn usage_meta(p: &Proc) -> Value {
    let Some(e) = &p.exit else { return Value::Null };
    let mut v = json!({
        "durationMs": p.duration().as_millis() as u64,
        "userMs": e.usage.user.as_millis() as u64,
        "systemMs": e.usage.system.as_millis() as u64,
        "maxRssKb": e.usage.max_rss_kb,
    });
    if let Some(t) = e.tree {
        if let Some(ms) = t.cpu_ms {
            v["cpuMs"] = ms.into();
        }
        if let Some(kb) = t.memory_peak_kb {
            v["memoryPeakKb"] = kb.into();
        }
        if t.oom_killed {
            v["oomKilled"] = true.into();
        }
    }
    v
}

/// Whether the OOM killer took part of the command's tree.
pub fn oom_killed(p: &Proc) -> bool {
    p.exit.and_then(|e| e.tree).is_some_and(|t| t.oom_killed)
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

/// `exit_code`, `signal` only when a signal ended the command, and `oom_killed` only
/// when the OOM killer took part of it (bash objects).
fn add_bash_exit(v: &mut Map<String, Value>, p: &Proc) {
    let (code, signal) = exit_fields(p);
    v.insert("exit_code".into(), code.into());
    if let Some(sig) = signal {
        v.insert("signal".into(), sig.into());
    }
    if oom_killed(p) {
        v.insert("oom_killed".into(), true.into());
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

/// Bytes of a command line (the command and its arguments together) a listing shows.
pub const LISTED_LINE_MAX: usize = 4 << 10;
/// Entries of a listing page when the request names no `limit`.
pub const DEFAULT_PAGE: usize = 256;
/// The most entries of one page.
pub const MAX_PAGE: usize = 4096;

/// A listing's page: how many entries, after which one. Listings run newest first, so
/// a cursor names the key of the last entry shown and the next page starts below it.
#[derive(Debug, Clone, Copy)]
pub struct Page {
    limit: usize,
    below: Option<u64>,
}

impl Page {
    /// `limit` and the cursor field (`cursor`) of a request.
    pub fn from_params(p: &Params, cursor_field: &str) -> Result<Page, RpcError> {
        let limit = p
            .opt_u64("limit")?
            .map_or(DEFAULT_PAGE, |n| (n as usize).clamp(1, MAX_PAGE));
        let below = match p.opt_str(cursor_field)? {
            None => None,
            Some(c) => Some(
                c.strip_prefix('k')
                    .and_then(|n| n.parse::<u64>().ok())
                    .ok_or_else(|| {
                        RpcError::invalid_params(cursor_field, "not a cursor this daemon gave")
                    })?,
            ),
        };
        Ok(Page { limit, below })
    }

    /// The page of `items` (newest first) and the cursor of the next page, if any.
    pub fn take<'a>(
        &self,
        items: impl Iterator<Item = &'a Proc>,
    ) -> (Vec<&'a Proc>, Option<String>) {
        let mut page: Vec<&Proc> = items
            .filter(|p| self.below.is_none_or(|b| p.key < b))
            .take(self.limit + 1)
            .collect();
        let next = if page.len() > self.limit {
            page.truncate(self.limit);
            page.last().map(|p| format!("k{}", p.key))
        } else {
            None
        };
        (page, next)
    }
}

/// `text` cut to at most `max` bytes (at a character boundary) followed by a marker saying
/// how many bytes were cut; unchanged when it fits.
pub fn cut_text(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_string();
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}[... {} bytes cut]", &text[..end], text.len() - end)
}

/// A command line cut for a listing: at most `LISTED_LINE_MAX` bytes of the command and
/// its arguments together, the rest replaced by a marker saying how much was cut.
pub fn cut_command_line(command: &str, args: &[String]) -> (String, Vec<String>) {
    let mut left = LISTED_LINE_MAX;
    let mut cut_bytes = 0usize;
    let mut cut = |s: &str| -> String {
        if s.len() <= left {
            left -= s.len();
            return s.to_string();
        }
        let mut end = left;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        left = 0;
        cut_bytes += s.len() - end;
        s[..end].to_string()
    };
    let mut command = cut(command);
    let mut kept: Vec<String> = Vec::new();
    for a in args {
        let c = cut(a);
        if c.is_empty() && !a.is_empty() {
            continue;
        }
        kept.push(c);
    }
    if cut_bytes > 0 {
        let marker = format!("[... {cut_bytes} bytes cut]");
        if args.is_empty() {
            command.push_str(&marker);
        } else {
            kept.push(marker);
        }
    }
    (command, kept)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cut_text_keeps_whole_characters_and_says_what_it_cut() {
        assert_eq!(cut_text("short", 5), "short");
        assert_eq!(cut_text("abcdef", 4), "abcd[... 2 bytes cut]");
        // "é" is two bytes: a cut inside it moves back to its start.
        assert_eq!(cut_text("aéb", 2), "a[... 3 bytes cut]");
    }

    #[test]
    fn long_command_lines_are_cut_with_a_marker() {
        let (c, a) = cut_command_line("ls", &["-l".into()]);
        assert_eq!((c.as_str(), a), ("ls", vec!["-l".to_string()]));
        let long = "x".repeat(10_000);
        let (c, a) = cut_command_line(&long, &[]);
        assert!(c.starts_with(&"x".repeat(LISTED_LINE_MAX)));
        assert!(c.ends_with(&format!("[... {} bytes cut]", 10_000 - LISTED_LINE_MAX)));
        assert!(a.is_empty());
        let args: Vec<String> = (0..100).map(|_| "y".repeat(100)).collect();
        let (c, a) = cut_command_line("echo", &args);
        assert_eq!(c, "echo");
        let shown: usize = a[..a.len() - 1].iter().map(String::len).sum();
        assert_eq!(shown + 4, LISTED_LINE_MAX);
        assert_eq!(
            a.last().unwrap(),
            &format!("[... {} bytes cut]", 100 * 100 + 4 - LISTED_LINE_MAX)
        );
        // Never inside a character.
        let (c, _) = cut_command_line(&"é".repeat(LISTED_LINE_MAX), &[]);
        assert!(c.starts_with(&"é".repeat(LISTED_LINE_MAX / 2)));
    }
}
