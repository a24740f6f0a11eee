//! `execctl wait [--timeout D] ID...`: waits for commands to end and exits with the
//! status of the last one, as a shell's `wait` does.

use serde_json::{json, Value};

use super::args::Args;
use super::connect::{self, Ctx, Target};
use super::errors::{exit_status, Res, EXIT_TIMEOUT};
use super::output::{self};
use super::ps::{one_id, state};

/// `execctl wait ID`.
pub fn wait(ctx: &Ctx, p: &Args) -> Res<u8> {
    let id = one_id(p, "wait")?;
    let mut c = ctx.connect()?;
    let (target, _) = connect::locate(&mut c, id)?;
    let (code, signal, status) = match &target {
        Target::Terminal { id, session } => {
            let r = c
                .call(
                    "terminal/wait_for_exit",
                    json!({"sessionId": session, "terminalId": id}),
                )
                .map_err(connect::about(id))?;
            (r["exitCode"].clone(), r["signal"].clone(), None)
        }
        Target::Bash { id, session } => {
            // An offset past the end is answered at once with "" and the end offsets; from
            // there, long-poll: waiting transfers no output.
            let mut at = json!({"session_id": session, "command_id": id,
                                "offset": u64::MAX, "stderr_offset": u64::MAX});
            loop {
                let r = c
                    .call("bash/output", at.clone())
                    .map_err(connect::about(id))?;
                let cmd = &r["command"];
                if cmd["status"] != "running" {
                    break (
                        cmd["exit_code"].clone(),
                        cmd.get("signal").cloned().unwrap_or(Value::Null),
                        cmd["status"].as_str().map(str::to_string),
                    );
                }
                at["offset"] = r["offset"].clone();
                at["stderr_offset"] = r["stderr_offset"].clone();
                at["wait"] = json!(true);
                at["wait_timeout"] = json!(30);
            }
        }
        // A shell session's shell: its running command's end (at once when none runs).
        Target::Shell { id, session } => loop {
            let r = c
                .call("shell/wait", json!({"id": session, "seconds": 30}))
                .map_err(connect::about(id))?;
            if r["status"] != "running" {
                let status = if r["status"] == "completed" {
                    "completed"
                } else {
                    "killed"
                };
                break (
                    r["exit_code"].clone(),
                    Value::Null,
                    Some(status.to_string()),
                );
            }
        },
    };
    let st = state(false, status.as_deref(), &signal);
    if ctx.json {
        output::print_json(&json!({"id": id, "state": st, "exit_code": code, "signal": signal}))?;
    }
    Ok(if st == "timed_out" {
        EXIT_TIMEOUT
    } else {
        exit_status(&code, &signal)
    })
}
