//! `execctl logs [-f] [--tail N] [--stderr] ID`: a command's output as it was written.
//!
//! `logs` reads through a lossless base64 subscription from the first retained byte, so
//! what it prints is the command's exact bytes; it says how much older output is no
//! longer retained (unless `--tail` asked for the end only), and with `-f` goes on live
//! until the command exits. With `--json` it prints one object at the end: the text of
//! each stream, and the bytes no longer retained or lost.

use std::collections::VecDeque;

use serde_json::{json, Value};

use super::args::Args;
use super::connect::{self, Ctx, Target};
use super::errors::{daemon_error, Fail, Res, EXIT_FAILURE};
use super::events::{Decoded, Decoder};
use super::output::{self, warn};
use super::ps::one_id;
use crate::client::Client;

/// Where each stream of a process ends now: `[output or stdout, stderr]`, and whether it
/// has exited.
fn ends(c: &mut Client, target: &Target) -> Res<([u64; 2], bool)> {
    match target {
        Target::Terminal { id, session } => {
            let r = c
                .call(
                    "terminal/output",
                    json!({"sessionId": session, "terminalId": id, "_meta": {"execd": {"length": 0}}}),
                )
                .map_err(connect::about(id))?;
            let end = r["_meta"]["execd"]["end"].as_u64().unwrap_or(0);
            Ok(([end, 0], r.get("exitStatus").is_some()))
        }
        Target::Bash { id, session } => {
            let r = c
                .call(
                    "bash/output",
                    json!({"session_id": session, "command_id": id,
                           "offset": u64::MAX, "stderr_offset": u64::MAX}),
                )
                .map_err(connect::about(id))?;
            let end = |k: &str| r[k].as_u64().unwrap_or(0);
            Ok((
                [end("offset"), end("stderr_offset")],
                r["command"]["status"] != "running",
            ))
        }
        // A shell's terminal: what it printed so far, and whether its session still has
        // it (a shell that died was replaced by another).
        Target::Shell { id, .. } => match connect::locate_shell(c, id)? {
            Some((_, s)) => Ok(([s["output_bytes"].as_u64().unwrap_or(0), 0], false)),
            None => Err(connect::not_found(id)),
        },
    }
}

/// The last `n` lines of `bytes` (a final line without its newline counts).
fn last_lines(bytes: &[u8], n: usize) -> &[u8] {
    if n == 0 {
        return &bytes[bytes.len()..];
    }
    let body = bytes.strip_suffix(b"\n").unwrap_or(bytes);
    let mut seen = 0;
    for (i, &b) in body.iter().enumerate().rev() {
        if b == b'\n' {
            seen += 1;
            if seen == n {
                return &bytes[i + 1..];
            }
        }
    }
    bytes
}

/// What `logs` does with each stream's bytes.
struct LogOut {
    id: String,
    only_stderr: bool,
    /// `--tail N`: bytes held until the snapshot's end, then their last N lines printed.
    tail: Option<usize>,
    held: [VecDeque<u8>; 2],
    /// The snapshot's end per stream; `None` once it has been reached (live from there).
    until: Option<[u64; 2]>,
    decoder: Decoder,
    started: [bool; 2],
    lost: u64,
    /// `--json`: each stream's bytes, printed as one object at the end.
    json: Option<[Vec<u8>; 2]>,
    /// Bytes at the start no longer retained by execd.
    not_retained: u64,
}

impl LogOut {
    fn emit(&mut self, stream: usize, bytes: &[u8]) -> Res<()> {
        if self.only_stderr && stream == 0 {
            return Ok(());
        }
        if self.tail.is_some() && self.until.is_some() {
            // Bounded by what execd retains of the stream (its output limit).
            self.held[stream].extend(bytes);
            return Ok(());
        }
        if let Some(kept) = &mut self.json {
            kept[stream].extend_from_slice(bytes);
            return Ok(());
        }
        if stream == 1 {
            let _ = output::write_stderr(bytes);
            Ok(())
        } else {
            output::write_stdout(bytes).map_err(|e| output::stdout_failed(&e))
        }
    }

    /// The snapshot is complete: print the held tails.
    fn reach_end(&mut self) -> Res<()> {
        self.until = None;
        if let Some(n) = self.tail {
            for stream in 0..2 {
                let held: Vec<u8> = std::mem::take(&mut self.held[stream]).into();
                let last = last_lines(&held, n).to_vec();
                self.emit(stream, &last)?;
            }
        }
        Ok(())
    }

    fn reached(&self) -> bool {
        match self.until {
            Some(end) => self.decoder.next[0] >= end[0] && self.decoder.next[1] >= end[1],
            None => false,
        }
    }

    /// Handles one event; true at the `Exit`.
    fn event(&mut self, msg: &Value) -> Res<bool> {
        for d in self.decoder.decode(msg) {
            match d {
                Decoded::Bytes {
                    stream,
                    offset,
                    mut bytes,
                } => {
                    // A snapshot stops at its end, even inside a chunk.
                    if let Some(end) = self.until {
                        bytes.truncate(end[stream].saturating_sub(offset) as usize);
                    }
                    self.started[stream] = true;
                    self.emit(stream, &bytes)?;
                }
                Decoded::Lost {
                    stream,
                    name,
                    offset,
                    skipped,
                } => {
                    let shown = !(self.only_stderr && stream == 0);
                    if !self.started[stream] && offset == 0 {
                        self.not_retained += skipped;
                        // `--tail` asked for the end only: a head gone is nobody's loss.
                        if shown && self.tail.is_none() && self.json.is_none() {
                            warn(&format!(
                                "the first {skipped} bytes of {}'s {name} are no longer retained by execd; showing the rest",
                                self.id
                            ));
                        }
                    } else {
                        self.lost += skipped;
                        if self.json.is_none() {
                            warn(&format!(
                            "{skipped} bytes of {}'s {name} were lost at offset {offset} (execd dropped them to stay within its output memory)",
                            self.id
                        ));
                        }
                    }
                    self.started[stream] = true;
                }
                Decoded::Garbled { .. } => warn(&format!(
                    "execd sent output of {} that is not base64; skipped",
                    self.id
                )),
                Decoded::Exit(_) => return Ok(true),
                Decoded::Input(_) | Decoded::Nothing => {}
            }
        }
        Ok(false)
    }
}

/// `execctl logs [-f] [--tail N] [--stderr] ID`.
pub fn logs(ctx: &Ctx, p: &Args) -> Res<u8> {
    let id = one_id(p, "logs")?;
    let tail = p
        .value("--tail")
        .map(|v| {
            v.parse::<usize>()
                .map_err(|_| Fail::usage(format!("--tail: {v:?} is not a number of lines")))
        })
        .transpose()?;
    let follow = p.has("--follow");
    let only_stderr = p.has("--stderr");
    let mut c = ctx.connect()?;
    let (target, _) = connect::locate(&mut c, id)?;
    if only_stderr && !matches!(target, Target::Bash { .. }) {
        return Err(Fail::usage(format!(
            "{id} writes one stream (a terminal's: stdout and stderr together); drop --stderr"
        )));
    }
    let (end, exited) = ends(&mut c, &target)?;
    let mut out = LogOut {
        id: id.to_string(),
        only_stderr,
        tail,
        held: [VecDeque::new(), VecDeque::new()],
        until: Some(end),
        decoder: Decoder::new(id),
        started: [false, false],
        lost: 0,
        json: ctx.json.then(Default::default),
        not_retained: 0,
    };
    if !follow && out.reached() {
        return out.finish(&target);
    }
    c.call(
        "events/subscribe",
        json!({"id": id, "offset": 0, "stderr_offset": 0, "lossless": true, "encoding": "base64"}),
    )
    .map_err(connect::about(id))?;
    if out.reached() {
        // Nothing was written yet: live from the start.
        out.reach_end()?;
    }
    loop {
        let msg = c
            .next_notification(None)
            .map_err(|e| daemon_error(e, Some(id)))?;
        let exit = out.event(&msg)?;
        if out.until.is_some() && (out.reached() || exit) {
            out.reach_end()?;
            if !follow || exited {
                break;
            }
        }
        if exit {
            break;
        }
    }
    out.finish(&target)
}

impl LogOut {
    /// The exit status (a loss fails it); with `--json`, the object printed first.
    fn finish(&self, target: &Target) -> Res<u8> {
        if let Some(kept) = &self.json {
            let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
            let mut obj = json!({"id": self.id, "kind": target.kind(),
                                 "not_retained_bytes": self.not_retained,
                                 "lost_bytes": self.lost});
            match target {
                Target::Bash { .. } => {
                    if !self.only_stderr {
                        obj["stdout"] = json!(text(&kept[0]));
                    }
                    obj["stderr"] = json!(text(&kept[1]));
                }
                _ => obj["output"] = json!(text(&kept[0])),
            }
            output::print_json(&obj)?;
        }
        Ok(if self.lost > 0 { EXIT_FAILURE } else { 0 })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tails() {
        assert_eq!(last_lines(b"a\nb\nc\n", 2), b"b\nc\n");
        assert_eq!(last_lines(b"a\nb\nc", 2), b"b\nc");
        assert_eq!(last_lines(b"a\nb\n", 5), b"a\nb\n");
        assert_eq!(last_lines(b"a\nb\n", 0), b"");
        assert_eq!(last_lines(b"", 3), b"");
    }
}
