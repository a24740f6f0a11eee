//! Ending a foreground command as a shell would: Ctrl-C, a hang-up, SIGTERM, a
//! `--timeout` or a closed stdout kill it (SIGTERM, then SIGKILL after the daemon's
//! grace; a second signal: SIGKILL at once), and execctl's exit status says why.
//!
//! The `Killer` acts once, from whichever thread first has a reason: the signal thread,
//! or the main thread (timeout, closed output). Each kill runs on a thread of its own
//! with its own connection, so a main thread blocked writing to a stuck stdout never
//! delays it. A reason that comes before the command exists (its create may be held for
//! approval) withdraws the create instead.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::connect::{Ctx, Target};
use super::errors::{Res, EXIT_BROKEN_PIPE, EXIT_TIMEOUT};
use super::output::warn;
use crate::client::{is_timeout, CallError, Client};

/// How often the main thread looks for a signal while a create may be held for approval.
const CREATE_TICK: Duration = Duration::from_millis(100);
/// How long an interrupted create may still be answered before execctl hangs up on it.
const CANCEL_GRACE: Duration = Duration::from_millis(500);

/// Why execctl ended the command.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Reason {
    /// execctl got this signal.
    Signal(i32),
    /// `--timeout` passed.
    Timeout,
    /// execctl's stdout is closed (or broken).
    OutputClosed,
}

impl Reason {
    pub fn exit_code(self) -> u8 {
        match self {
            Reason::Signal(n) => (128 + n).clamp(0, 255) as u8,
            Reason::Timeout => EXIT_TIMEOUT,
            Reason::OutputClosed => EXIT_BROKEN_PIPE,
        }
    }
}

#[derive(Default)]
struct KillState {
    target: Option<Target>,
    reason: Option<Reason>,
    started: bool,
}

/// Kills the foreground command once, from whichever thread first has a reason.
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

    pub fn reason(&self) -> Option<Reason> {
        self.lock().reason
    }

    /// Asks for the command's end. The first reason starts SIGTERM-then-SIGKILL; a later
    /// signal sends SIGKILL at once (a second Ctrl-C means now).
    pub fn trigger(&self, reason: Reason) {
        let mut s = self.lock();
        let again = s.reason.is_some();
        if !again {
            s.reason = Some(reason);
        }
        let Some(target) = s.target.clone() else {
            return;
        };
        if !s.started {
            s.started = true;
            self.spawn_kill(target, false);
        } else if again && matches!(reason, Reason::Signal(_)) {
            self.spawn_kill(target, true);
        }
    }

    /// The command exists now; a reason that came first is acted on.
    pub fn set_target(&self, target: Target) {
        let mut s = self.lock();
        s.target = Some(target.clone());
        if s.reason.is_some() && !s.started {
            s.started = true;
            self.spawn_kill(target, false);
        }
    }

    fn spawn_kill(&self, target: Target, now: bool) {
        let ctx = self.ctx.clone();
        std::thread::spawn(move || {
            if let Err(f) = kill_target(&ctx, &target, now) {
                if f.rpc.as_ref().is_none_or(|r| r.code != -32002) {
                    warn(&format!(
                        "could not kill {}: {}",
                        target.id(),
                        f.text(ctx.verbose)
                    ));
                }
            }
        });
    }
}

/// SIGTERM, then SIGKILL once the daemon's grace has passed (or SIGKILL at once).
fn kill_target(ctx: &Ctx, target: &Target, now: bool) -> Res<()> {
    let mut c = ctx.connect()?;
    match target {
        Target::Terminal { id, session } => {
            let mut params = json!({"sessionId": session, "terminalId": id});
            if now {
                params["_meta"] = json!({"execd": {"signal": "SIGKILL"}});
            }
            c.call("terminal/kill", params)?;
        }
        Target::Bash { id, session } => {
            let signal = if now { "SIGKILL" } else { "SIGTERM" };
            let r = c.call(
                "bash/kill",
                json!({"session_id": session, "command_id": id, "signal": signal}),
            )?;
            if r["status"] == "running" {
                c.call(
                    "bash/kill",
                    json!({"session_id": session, "command_id": id, "signal": "SIGKILL"}),
                )?;
            }
        }
    }
    Ok(())
}

/// Turns SIGINT, SIGHUP and SIGTERM into kills of the foreground command.
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
    let id = c.send(method, params)?;
    c.timeout = Some(CREATE_TICK);
    let mut cancelled: Option<Instant> = None;
    let answer = loop {
        match c.wait_response(id) {
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
