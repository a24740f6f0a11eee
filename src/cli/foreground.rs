//! Ending a foreground command as a shell would. A signal execctl gets is passed on to
//! the command, as docker passes it to its container: Ctrl-C is SIGINT, so a program that
//! handles it (a REPL, a script's cleanup) goes on or cleans up as it would in a shell;
//! SIGTERM and SIGHUP mean execctl is asked to go, so a command that outlives them by
//! the daemon's kill grace gets SIGKILL. A second signal while the first one's grace runs
//! is SIGKILL at once (a second Ctrl-C means now). A `--timeout` or a closed stdout end
//! the command (SIGTERM, then SIGKILL after the grace). execctl's exit status is the
//! command's own, except after a timeout (124) or a closed stdout (141).
//!
//! The `Killer` acts from whichever thread has a reason: the signal thread, or the main
//! thread (timeout, closed output). Each kill runs on a thread of its own with its own
//! connection, so a main thread blocked writing to a stuck stdout never delays it. A
//! reason that comes before the command exists (its create may be held for approval)
//! withdraws the create instead.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::connect::{Ctx, Target};
use super::errors::{Res, EXIT_BROKEN_PIPE, EXIT_TIMEOUT};
use super::output::{self, warn};
use crate::client::{is_timeout, CallError, Client};

/// How often the main thread looks for a signal while a create may be held for approval.
const CREATE_TICK: Duration = Duration::from_millis(100);
/// How long an interrupted create may still be answered before execctl hangs up on it.
const CANCEL_GRACE: Duration = Duration::from_millis(500);

/// Why execctl acted on the command.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Reason {
    /// execctl got this signal (and passed it on).
    Signal(i32),
    /// `--timeout` passed.
    Timeout,
    /// execctl's stdout is closed (or broken).
    OutputClosed,
}

impl Reason {
    /// execctl's exit status when the command never started: as if the reason had
    /// ended execctl itself.
    pub fn exit_code(self) -> u8 {
        match self {
            Reason::Signal(n) => (128 + n).clamp(0, 255) as u8,
            Reason::Timeout => EXIT_TIMEOUT,
            Reason::OutputClosed => EXIT_BROKEN_PIPE,
        }
    }
}

/// What one kill thread does.
#[derive(Debug, Clone, Copy, PartialEq)]
enum How {
    /// Sends this signal; SIGKILL after the grace unless it is SIGINT.
    Pass(i32),
    /// SIGTERM, then SIGKILL after the grace.
    End,
    /// SIGKILL at once.
    Now,
}

#[derive(Default)]
struct KillState {
    target: Option<Target>,
    /// What decides the exit status: the first reason, or a timeout or closed output
    /// that came after a signal.
    reason: Option<Reason>,
    /// The first reason that came before the command existed, acted on once it does.
    early: Option<Reason>,
    /// A signal was sent and its grace has not passed, or the command is being ended: a
    /// signal now means SIGKILL.
    busy: bool,
    /// The command is being ended (`How::End`); nothing but SIGKILL is left to do.
    ending: bool,
}

/// Acts on the foreground command for each reason, from whichever thread has it.
#[derive(Clone)]
pub struct Killer {
    ctx: Ctx,
    state: Arc<Mutex<KillState>>,
}

impl Killer {
    pub fn new(ctx: &Ctx) -> Killer {
        Killer {
            ctx: ctx.clone(),
            state: Arc::new(Mutex::new(KillState::default())),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, KillState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The reason that decides the exit status, if any came.
    pub fn reason(&self) -> Option<Reason> {
        self.lock().reason
    }

    /// A reason to act: a signal is passed on (SIGKILL if one is still in its grace);
    /// a timeout or a closed output ends the command.
    pub fn trigger(&self, reason: Reason) {
        let mut s = self.lock();
        let decides = match s.reason {
            None => true,
            Some(Reason::Signal(_)) => !matches!(reason, Reason::Signal(_)),
            Some(_) => false,
        };
        if decides {
            s.reason = Some(reason);
        }
        match s.target.clone() {
            Some(target) => self.act(&mut s, target, reason),
            None => {
                s.early.get_or_insert(reason);
            }
        }
    }

    /// The command exists now; a reason that came first is acted on.
    pub fn set_target(&self, target: Target) {
        let mut s = self.lock();
        s.target = Some(target.clone());
        if let Some(reason) = s.early.take() {
            self.act(&mut s, target, reason);
        }
    }

    fn act(&self, s: &mut KillState, target: Target, reason: Reason) {
        let how = match reason {
            Reason::Signal(_) if s.busy => How::Now,
            Reason::Signal(sig) => How::Pass(sig),
            _ if s.ending => return,
            _ => How::End,
        };
        s.ending |= how == How::End;
        s.busy = true;
        let killer = self.clone();
        std::thread::spawn(move || {
            let done = kill_target(&killer.ctx, &target, how);
            if let How::Pass(_) = how {
                // Its grace is over: the next signal is passed on again.
                killer.lock().busy = false;
            }
            if let Err(f) = done {
                if f.rpc.as_ref().is_none_or(|r| r.code != -32002) {
                    warn(&format!(
                        "could not signal {}: {}",
                        target.id(),
                        f.text(killer.ctx.verbose)
                    ));
                }
            }
        });
    }
}

/// Signals the command as `how` says. A call that sends one signal is answered when the
/// command exits or when the daemon's kill grace has passed, whichever is first.
fn kill_target(ctx: &Ctx, target: &Target, how: How) -> Res<()> {
    let mut c = ctx.connect()?;
    let (first, then_kill) = match how {
        How::Now => ("SIGKILL".to_string(), false),
        How::End => ("SIGTERM".to_string(), true),
        How::Pass(sig) => (crate::types::signal_name(sig), sig != libc::SIGINT),
    };
    match target {
        Target::Terminal { id, session } => {
            let params = |signal: Option<&str>| {
                let mut p = json!({"sessionId": session, "terminalId": id});
                if let Some(s) = signal {
                    p["_meta"] = json!({"execd": {"signal": s}});
                }
                p
            };
            if how == How::End {
                // ACP's own kill: SIGTERM, SIGKILL after the grace, answered at the exit.
                c.call("terminal/kill", params(None))?;
                return Ok(());
            }
            let r = c.call("terminal/kill", params(Some(&first)))?;
            if then_kill && r["_meta"]["execd"]["exited"] == false {
                c.call("terminal/kill", params(Some("SIGKILL")))?;
            }
        }
        Target::Bash { id, session } => {
            let params =
                |signal: &str| json!({"session_id": session, "command_id": id, "signal": signal});
            let r = c.call("bash/kill", params(&first))?;
            if then_kill && r["status"] == "running" {
                c.call("bash/kill", params("SIGKILL"))?;
            }
        }
        // Never in the foreground (run and exec start terminals and bash commands).
        Target::Shell { session, .. } => {
            c.call("shell/kill", json!({"id": session}))?;
        }
    }
    Ok(())
}

/// Passes SIGINT, SIGHUP and SIGTERM on to the foreground command.
pub fn watch_signals(killer: &Killer) {
    use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
    match signal_hook::iterator::Signals::new([SIGINT, SIGHUP, SIGTERM]) {
        Ok(mut signals) => {
            let killer = killer.clone();
            std::thread::spawn(move || {
                for sig in signals.forever() {
                    killer.trigger(Reason::Signal(sig));
                }
            });
        }
        Err(e) => warn(&format!(
            "cannot watch for Ctrl-C ({e}); interrupting execctl will leave the command running"
        )),
    }
}

/// The `initialize` that asks the daemon to say when a request waits for an approver
/// (PROTOCOL 7.3).
pub fn approval_notices() -> Value {
    json!({"protocolVersion": 1, "_meta": {"execd": {"approvalNotices": true}}})
}

/// What execctl says on stderr when notification `n` tells that request `id` waits for
/// an approver: `waiting for approval appr_7 (rule push) ...`.
pub fn waiting_for_approval(n: &Value, id: u64) -> Option<String> {
    if n["method"] != "_execd/approval_pending" || n["params"]["requestId"] != json!(id) {
        return None;
    }
    let p = &n["params"];
    let rules: Vec<&str> = p["rules"]
        .as_array()
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let rules = match rules.as_slice() {
        [] => String::new(),
        [one] => format!(" (rule {})", output::visible(one)),
        many => format!(" (rules {})", output::visible(&many.join(", "))),
    };
    let appr = output::visible(p["approval"].as_str().unwrap_or("?"));
    Some(format!("waiting for approval {appr}{rules} ..."))
}

/// Sends a creating request and waits for its answer. A signal meanwhile (the request
/// may be held for approval) withdraws it: `$/cancel_request` ends a parked request at
/// once; one held for approval is withdrawn when execctl hangs up, so after a short wait
/// for an answer already on its way, execctl gives up on it (as cancelled).
pub fn create(
    c: &mut Client,
    method: &str,
    params: Value,
    killer: &Killer,
) -> Result<Value, CallError> {
    // Asked first on this connection, so the daemon knows before the request comes.
    c.send("initialize", approval_notices())?;
    let id = c.send(method, params)?;
    c.timeout = Some(CREATE_TICK);
    let mut cancelled: Option<Instant> = None;
    let mut said = |n: &Value| {
        if let Some(text) = waiting_for_approval(n, id) {
            warn(&text);
        }
    };
    let answer = loop {
        match c.wait_response_watching(id, &mut said) {
            Err(CallError::Io(e)) if is_timeout(&e) => match cancelled {
                None if killer.reason().is_some() => {
                    cancelled = Some(Instant::now());
                    c.send("$/cancel_request", json!({ "requestId": id }))?;
                }
                Some(at) if at.elapsed() >= CANCEL_GRACE => {
                    break Err(CallError::Rpc {
                        code: -32800,
                        message: "request cancelled".into(),
                        data: None,
                    });
                }
                _ => {}
            },
            other => break other,
        }
    };
    c.timeout = None;
    answer
}
