//! How a command's end looks from outside, rendered once: its exit (code or signal), its
//! resource use, the `Exit` event and log text. The families' objects (`methods::acp`,
//! `methods::bash`) and the event pump build on these, so a command that ended one way is
//! reported that way everywhere.

use serde_json::{json, Map, Value};

use crate::core::table::Proc;
use crate::types::signal_name;
use crate::types::Ended;

/// `(exit code, signal name)` as every protocol reports them: a code with no signal when
/// it exited, no code and the signal's name when a signal ended it, neither while it runs.
pub fn exit_fields(p: &Proc) -> (Option<i32>, Option<String>) {
    match p.exit.map(|e| e.ended) {
        Some(Ended::Code(c)) => (Some(c), None),
        Some(Ended::Signal(sig)) => (None, Some(signal_name(sig))),
        None => (None, None),
    }
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
        "maxRssKb": max_rss_kb(e),
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

/// The command's peak memory in KiB: its cgroup's `memory.peak` where there is one (the
/// whole tree), else the kernel's `ru_maxrss` of its leader and the children it waited
/// for. That one is at least the daemon's own high-water mark: the kernel counts, at an
/// `execve`, the memory of the image it replaces, and a command is cloned sharing the
/// daemon's memory until it execs (execd(8), "OUTPUT MEMORY").
pub fn max_rss_kb(e: &crate::core::table::Exit) -> u64 {
    e.tree
        .and_then(|t| t.memory_peak_kb)
        .unwrap_or(e.usage.max_rss_kb)
}

/// Whether the OOM killer took part of the command's tree.
pub fn oom_killed(p: &Proc) -> bool {
    p.exit.and_then(|e| e.tree).is_some_and(|t| t.oom_killed)
}

/// The `Exit` event's payload. `reason` says why execd ended the command when it did
/// (`request`, `release`, `timeout`, `session close`, `shutdown`, `disconnect`), so a
/// client can tell a command the daemon's shutdown killed from one that died of a
/// SIGTERM of its own.
pub fn exit_event(p: &Proc) -> Value {
    let (code, signal) = exit_fields(p);
    let mut v = Map::new();
    v.insert("id".into(), p.id.clone().into());
    v.insert("exitCode".into(), code.into());
    v.insert("signal".into(), signal.into());
    v.insert("status".into(), p.status().into());
    if let Some(reason) = p.kill {
        v.insert("reason".into(), reason.as_str().into());
    }
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

/// `text` cut in the middle to at most `max` bytes of it (at character boundaries), its
/// start and its end kept around a marker saying how many bytes were left out; unchanged
/// when it fits. Never cut at the end: what a text ends with (a trailing command) shows.
pub fn cut_middle(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_string();
    }
    let mut head = max / 2;
    while !text.is_char_boundary(head) {
        head -= 1;
    }
    let mut tail = text.len() - (max - max / 2);
    while !text.is_char_boundary(tail) {
        tail += 1;
    }
    format!(
        "{}[... {} bytes left out ...]{}",
        &text[..head],
        tail - head,
        &text[tail..]
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cut_middle_keeps_both_ends_and_whole_characters() {
        assert_eq!(cut_middle("short", 5), "short");
        assert_eq!(cut_middle("abcdefgh", 4), "ab[... 4 bytes left out ...]gh");
        // "é" is two bytes: a cut inside it moves out of it.
        assert_eq!(cut_middle("aébcdéf", 4), "a[... 7 bytes left out ...]f");
        let line = format!("{}\nrm -rf V", "#".repeat(17 << 10));
        assert!(cut_middle(&line, 16 << 10).ends_with("\nrm -rf V"));
    }

    #[test]
    fn max_rss_is_the_cgroup_s_peak_where_there_is_one() {
        let usage = crate::types::Usage {
            max_rss_kb: 11020,
            ..Default::default()
        };
        let mut e = crate::core::table::Exit {
            ended: Ended::Code(0),
            usage,
            tree: None,
            at: crate::types::test_clock().0,
        };
        assert_eq!(max_rss_kb(&e), 11020);
        e.tree = Some(crate::types::TreeUsage {
            cpu_ms: None,
            memory_peak_kb: Some(212),
            oom_killed: false,
        });
        assert_eq!(max_rss_kb(&e), 212);
        e.tree = Some(crate::types::TreeUsage {
            memory_peak_kb: None,
            ..e.tree.unwrap()
        });
        assert_eq!(
            max_rss_kb(&e),
            11020,
            "a cgroup without the memory controller"
        );
    }
}
