//! The ACP terminal methods (protocol v1): `initialize`, `terminal/create`, `output`,
//! `wait_for_exit`, `kill`, `release`, and the `terminal/list` extension. Each reads the
//! core and returns a `Step`; starting a command is a `Step::Launch` the loop carries out.
//!
//! A terminal merges stdout and stderr into one pipe so their order is kept, retains the
//! newest `outputByteLimit` bytes, and belongs to the `sessionId` it was created under:
//! naming it with another session is `-32002`, like a foreign or unknown id.

use serde_json::{json, Map, Value};

use crate::core::launch::{
    default_term, plain_word, requested_tty, resize_to, validate_dir, validate_env, LaunchRequest,
};
use crate::core::table::Proc;
use crate::core::table::{Family, Key, KillReason};
use crate::core::view::{self, exit_fields, oom_killed};
use crate::core::vocab::After;
use crate::core::{Caller, Core, Step, Wait};
use crate::methods::{events, list};
use crate::types::{Program, Stdio3};
use crate::wire::rpc::{Params, RpcError};

/// The ACP protocol version spoken.
pub const PROTOCOL_VERSION: u64 = 1;

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

/// The answer to a `terminal/kill` that sent one signal (`_meta.execd.signal`): whether
/// the leader has exited.
pub fn signalled(exited: bool) -> Value {
    json!({ "_meta": { "execd": { "exited": exited } } })
}

/// Descriptors a limit of `nofile` leaves for commands, after what the daemon keeps for
/// itself (listeners, log and audit files, spawns in flight, the spawns' 64 slots) and a
/// socket per client. A terminal holds one in the daemon (its output), a bash command up
/// to three (stdout, stderr, stdin).
fn command_descriptors(nofile: u64, max_clients: usize) -> u64 {
    const OWN: u64 = 128;
    nofile.saturating_sub(OWN + max_clients as u64)
}

/// What `initialize` says of sandboxes (PROTOCOL 16): what the kernel offers, the
/// workspaces `$CWD` may stand for, `$TMPDIR`, and the default in force.
fn sandbox_meta(core: &Core) -> Value {
    let s = &core.sandboxing;
    let mut v = s.kernel.to_json();
    v["workspaces"] = s
        .workspaces
        .iter()
        .map(|(_, real)| real.display().to_string())
        .collect::<Vec<_>>()
        .into();
    v["tmpdir"] = s.tmpdir.display().to_string().into();
    let top = core.top_sandbox();
    let name = crate::policy::sandbox::PRESETS
        .iter()
        .find(|n| crate::policy::sandbox::Template::preset(n).as_ref() == Some(&top))
        .copied()
        .unwrap_or("custom");
    let mut default = top.to_json();
    default["name"] = name.into();
    v["default"] = default;
    v["escalation"] = if core.policy.escalation_denied() {
        "deny"
    } else {
        "ask"
    }
    .into();
    v
}

/// `initialize`: what execd is and what it allows. Counts are the whole daemon's for
/// root and the daemon's own uid, and the caller's own for every other uid (PROTOCOL 8).
pub fn initialize(core: &mut Core, caller: &Caller, p: &Params) -> Result<Step, RpcError> {
    if p.opt_value("protocolVersion").is_some() {
        p.opt_u64("protocolVersion")?;
    }
    // A requester may ask to be told when a request of its waits for an approver.
    let notices = p
        .opt_object("_meta")?
        .and_then(|m| m.get("execd"))
        .and_then(|e| e.get("approvalNotices"))
        .and_then(Value::as_bool)
        .unwrap_or(false);
    core.approvals.set_notices(caller.conn, notices);
    let own = core.shares(caller.uid).then_some(caller.uid);
    let mine = |uid: u32| own.is_none_or(|o| o == uid);
    let running = own.map_or(core.table.running(), |o| core.table.running_of(o));
    let sessions = core.table.sessions.keys().filter(|k| mine(k.0)).count();
    let clients = core.clients.values().filter(|p| mine(p.uid)).count();
    let approvers = core
        .approvals
        .approvers
        .values()
        .filter(|a| mine(a.uid))
        .count();
    let pending = core
        .approvals
        .pending
        .values()
        .filter(|p| mine(p.launch.peer.uid))
        .count();
    let memory = own.map_or(core.table.memory.total, |o| core.table.memory.of(o));
    let released = own.is_none().then_some(core.table.memory.released);
    let c = &core.cfg;
    Ok(Step::Done(json!({
        "protocolVersion": PROTOCOL_VERSION,
        "clientCapabilities": { "terminal": true },
        "serverInfo": { "name": "execd", "version": env!("CARGO_PKG_VERSION") },
        "limits": {
            "maxClients": c.max_clients,
            "maxProcesses": c.max_processes,
            "maxRetained": c.max_retained,
            "maxMessage": c.max_message,
            "maxBatch": c.max_batch,
            "clientBuffer": c.client_buffer,
            "outputLimit": c.output_limit,
            "maxOutputLimit": c.max_output_limit,
            "maxOutputMemory": c.max_output_memory,
            "stdinBuffer": c.stdin_buffer,
            "killGraceMs": c.kill_grace.as_millis() as u64,
            "sessionIdleMs": c.session_idle.as_millis() as u64,
            "maxSessions": c.max_sessions,
            "approvalTimeoutMs": c.approval_timeout.as_millis() as u64,
            "maxPendingApprovals": c.max_pending_approvals,
            "memoryMax": c.limits.memory_max,
            "pidsMax": c.limits.pids_max,
            "cpuMaxPercent": c.limits.cpu_max,
        },
        "_meta": { "execd": {
            "uptimeMs": core.now.duration_since(core.started).as_millis() as u64,
            "upgrades": core.upgrades,
            "pid": std::process::id(),
            "socket": c.socket.display().to_string(),
            "running": running,
            "sessions": sessions,
            "clients": clients,
            "policy": {
                "loaded": c.policy.is_some(),
                "path": c.policy.as_ref().map(|p| p.display().to_string()),
                "rules": core.policy.rule_count(),
            },
            "approvers": approvers,
            "pendingApprovals": pending,
            "containment": {
                "kind": core.containment.kind,
                "detail": core.containment.detail,
                "cookie": core.containment.cookie,
            },
            "sandbox": sandbox_meta(core),
            "descriptors": {
                "limit": core.nofile,
                "terminals": command_descriptors(core.nofile, c.max_clients),
                "bashCommands": command_descriptors(core.nofile, c.max_clients) / 3,
            },
            "audit": match &c.audit {
                None => Value::Null,
                Some(crate::config::AuditTarget::Stderr) => "-".into(),
                Some(crate::config::AuditTarget::File(p)) => p.display().to_string().into(),
            },
            "outputMemory": {
                "used": memory,
                "budget": c.max_output_memory,
                "released": released,
            },
        }},
    })))
}

/// Parses ACP's `env: [{name, value}]`.
fn env_list(p: &Params) -> Result<Vec<(String, String)>, RpcError> {
    let Some(v) = p.opt_value("env") else {
        return Ok(Vec::new());
    };
    let Value::Array(items) = v else {
        return Err(RpcError::invalid_params(
            "env",
            "expected an array of {name, value}",
        ));
    };
    items
        .iter()
        .map(|item| {
            let name = item.get("name").and_then(Value::as_str);
            let value = item.get("value").and_then(Value::as_str);
            match (name, value) {
                (Some(n), Some(v)) => Ok((n.to_string(), v.to_string())),
                _ => Err(RpcError::invalid_params(
                    "env",
                    "each entry must be {\"name\": string, \"value\": string}",
                )),
            }
        })
        .collect()
}

/// `terminal/create`: asks the loop to start the command; answered with its id at once.
pub fn create(core: &mut Core, caller: &Caller, p: &Params) -> Result<Step, RpcError> {
    let session_id = p.str("sessionId")?;
    let command = p.str("command")?;
    if command.is_empty() {
        return Err(RpcError::invalid_params("command", "empty"));
    }
    let args: Vec<String> = p
        .opt_str_array("args")?
        .unwrap_or_default()
        .into_iter()
        .map(String::from)
        .collect();
    let mut env = env_list(p)?;
    validate_env("env", &env)?;
    let cwd = match p.opt_str("cwd")? {
        Some(dir) => validate_dir("cwd", dir)?,
        None => core.cfg.workdir.clone(),
    };
    let ring_capacity = match p.opt_u64("outputByteLimit")? {
        Some(n) => n.min(core.cfg.max_output_limit as u64) as usize,
        None => core.cfg.output_limit,
    };
    // execd's extensions under `_meta.execd`: a subscription from the first byte, a
    // stdin pipe the client feeds with `terminal/write`, limits, `killOnDisconnect`.
    let meta = execd_meta(p)?;
    let m = Params(&meta);
    let subscribe = m
        .opt_object("subscribe")?
        .map(|o| events::sub_opts(&Params(o)))
        .transpose()?
        .map(|opts| (caller.conn, opts));
    let limits = crate::core::launch::request_limits(
        m.opt_object("limits")?.map(Params).as_ref(),
        ["memoryMax", "pidsMax", "cpuMax"],
        &core.cfg.limits,
    )?;
    // The creating connection's close kills the command: a client that dies takes its
    // foreground command with it (ACP has no such notion; execctl run asks for it).
    let kill_on_disconnect = m
        .opt_bool("killOnDisconnect")?
        .unwrap_or(false)
        .then_some(caller.conn);
    let size = m.opt_object("size")?.map(Params);
    let stdio = match requested_tty(m.opt_bool("tty")?, size.as_ref())? {
        Some(size) => {
            default_term(&mut env);
            Stdio3::Pty(size)
        }
        None if m.opt_bool("stdin")?.unwrap_or(false) => Stdio3::MergedWithStdin,
        None => Stdio3::Merged,
    };
    let sandbox_asked =
        crate::core::launch::requested_sandbox("_meta.execd.sandbox", m.opt_value("sandbox"))?;
    let program = if !args.is_empty() || plain_word(command) {
        Program::Direct {
            program: command.to_string(),
            args: args.clone(),
        }
    } else {
        Program::Shell {
            shell: core.cfg.shell.clone(),
            line: command.to_string(),
        }
    };
    Ok(Step::Launch(Box::new(LaunchRequest {
        family: Family::Terminal {
            session_id: session_id.to_string(),
        },
        peer: caller.peer(),
        program,
        command: command.to_string(),
        args,
        env,
        cwd,
        cwd_field: "cwd",
        stdio,
        ring_capacity,
        prefix: "term",
        subscribe,
        kill_on_disconnect,
        limits,
        admitted: None,
        origin: None,
        via: Default::default(),
        after: After::Terminal,
        sandbox_asked,
        sandbox: None,
        ceiling: None,
    })))
}

/// After `terminal/create` started its command: `{terminalId}`.
pub fn after_create(core: &mut Core, key: Key) -> Result<Step, RpcError> {
    let id = core
        .table
        .get(key)
        .map(|p| p.id.clone())
        .ok_or_else(|| RpcError::internal("terminal vanished"))?;
    Ok(Step::Done(json!({ "terminalId": id })))
}

/// Finds the caller's terminal named by `terminalId` under `sessionId`.
fn lookup(core: &Core, caller: &Caller, p: &Params) -> Result<Key, RpcError> {
    let session_id = p.str("sessionId")?;
    let terminal_id = p.str("terminalId")?;
    core.table
        .find_in(
            terminal_id,
            caller.uid,
            |t| matches!(&t.family, Family::Terminal { session_id: sid } if sid == session_id),
        )
        .ok_or_else(|| RpcError::not_found("terminal", terminal_id))
}

/// The `_meta.execd` object of a request (empty when absent).
fn execd_meta(p: &Params) -> Result<Map<String, Value>, RpcError> {
    match p.opt_object("_meta")?.and_then(|m| m.get("execd")) {
        None | Some(Value::Null) => Ok(Map::new()),
        Some(Value::Object(m)) => Ok(m.clone()),
        Some(_) => Err(RpcError::invalid_params(
            "_meta.execd",
            "expected an object",
        )),
    }
}

/// `terminal/write {sessionId, terminalId, input, encoding?, eof?, wait?}` (extension):
/// input for a terminal created with `_meta.execd.stdin`, as `bash/write` takes it.
pub fn write(core: &mut Core, caller: &Caller, p: &Params) -> Result<Step, RpcError> {
    let key = lookup(core, caller, p)?;
    let data = crate::methods::bash::write_input(p)?;
    let eof = p.opt_bool("eof")?.unwrap_or(false);
    let wait = p.opt_bool("wait")?.unwrap_or(false);
    let bound =
        crate::core::launch::requested_sandbox("sandbox_ceiling", p.opt_value("sandbox_ceiling"))?;
    super::write_stdin(core, caller, bound, key, data, eof, wait)
}

/// `terminal/output`: the retained tail, never blocking. An execd extension reads a slice:
/// `_meta.execd.offset` (absolute, like bash output offsets) and `_meta.execd.length`
/// (at most that many bytes), for clients whose line length is bounded. Every answer says
/// in `_meta.execd` where its text starts and ends and how many bytes are no longer
/// retained (`dropped`).
pub fn output(core: &mut Core, caller: &Caller, p: &Params) -> Result<Step, RpcError> {
    let key = lookup(core, caller, p)?;
    let meta = execd_meta(p)?;
    let m = Params(&meta);
    let (offset, length) = (m.opt_u64("offset")?, m.opt_u64("length")?);
    let screen = m.opt_bool("screen")?.unwrap_or(false);
    if screen {
        core.keep_screen(key)?;
    }
    let t = core
        .table
        .get(key)
        .ok_or_else(|| RpcError::internal("terminal vanished"))?;
    let stream = &t.streams[0];
    let ring = &stream.ring;
    let from = offset.unwrap_or(0).max(ring.start());
    let to = match length {
        Some(n) => from.saturating_add(n).min(ring.end()),
        None => ring.end(),
    };
    let (from, to) = ring.utf8_window(from, to, stream.open || to < ring.end());
    let mut out = Map::new();
    out.insert("output".into(), stream.text(from, to).into());
    out.insert("truncated".into(), (ring.start() > 0).into());
    if t.exit.is_some() {
        out.insert("exitStatus".into(), exit_status(t));
    }
    let mut execd = json!({
        "offset": from,
        "nextOffset": to,
        "end": ring.end(),
        "dropped": ring.start(),
    });
    if t.running() {
        execd["waitingForInput"] = t.waiting_for_input.into();
    }
    if let Some(tty) = &t.tty {
        execd["tty"] = crate::methods::bash::tty_size(tty);
        if let Some(s) = tty.screen.as_ref().filter(|_| screen) {
            execd["screen"] = s.view();
        }
    }
    out.insert("_meta".into(), json!({ "execd": execd }));
    Ok(Step::Done(Value::Object(out)))
}

/// `terminal/wait_for_exit`: parked until the command exits.
pub fn wait_for_exit(core: &mut Core, caller: &Caller, p: &Params) -> Result<Step, RpcError> {
    let key = lookup(core, caller, p)?;
    Ok(Step::Park {
        wait: Wait::Exit(key),
        deadline: None,
    })
}

/// `terminal/kill`: SIGTERM to the tree, SIGKILL to what is left after the grace;
/// answered once the leader exited. With the extension `_meta.execd.signal` (a name as
/// `bash/kill` takes), that one signal instead, answered when the leader exits or after
/// the grace, with `_meta.execd.exited` saying which.
pub fn kill(core: &mut Core, caller: &Caller, p: &Params) -> Result<Step, RpcError> {
    let key = lookup(core, caller, p)?;
    let meta = execd_meta(p)?;
    if let Some(name) = Params(&meta).opt_str("signal")? {
        let sig = crate::types::signal_by_name(name).ok_or_else(|| {
            RpcError::invalid_params("_meta.execd.signal", format!("unknown signal {name:?}"))
        })?;
        let running = core.table.get(key).is_some_and(|t| t.running());
        if !running {
            return Ok(Step::Done(signalled(true)));
        }
        core.signal(key, sig);
        if sig == libc::SIGSTOP || sig == libc::SIGCONT {
            return Ok(Step::Done(signalled(false)));
        }
        return Ok(Step::Park {
            wait: Wait::Signalled(key),
            deadline: Some(core.now + core.cfg.kill_grace),
        });
    }
    core.kill(key, KillReason::Request);
    // An exited terminal's leftovers die with it (PROTOCOL 14).
    core.end_leftovers(key);
    Ok(Step::Park {
        wait: Wait::Killed(key),
        deadline: None,
    })
}

/// `terminal/resize {sessionId, terminalId, rows, cols}` (extension): sets the window
/// size of the terminal's PTY; `-32602` naming `tty` for one without.
pub fn resize(core: &mut Core, caller: &Caller, p: &Params) -> Result<Step, RpcError> {
    let key = lookup(core, caller, p)?;
    let size = resize_to(p)?;
    core.resize(key, size)?;
    Ok(Step::Done(json!({})))
}

/// `terminal/release`: kills what runs and forgets the id.
pub fn release(core: &mut Core, caller: &Caller, p: &Params) -> Result<Step, RpcError> {
    let key = lookup(core, caller, p)?;
    core.release(key, KillReason::Release);
    Ok(Step::Done(json!({})))
}

/// The sandbox a command runs in, as command objects show it.
pub fn sandbox_of(p: &crate::core::table::Proc) -> Value {
    p.sandbox.as_ref().map_or_else(
        || crate::policy::sandbox::Given::off().to_json(),
        |g| g.to_json(),
    )
}

/// `terminal/list` (extension): the caller's terminals, newest first, a page at a time
/// (`limit`, default 256; `cursor` from the previous page's `nextCursor`). Long command
/// lines are cut to a few KiB with a marker.
pub fn list(core: &mut Core, caller: &Caller, p: &Params) -> Result<Step, RpcError> {
    let only = p.opt_str("sessionId")?;
    let (terminals, next) = list::page_of(core, caller.uid, p, only, false, |t| {
        let (command, args) = list::cut_command_line(&t.command, &t.args);
        let mut v = json!({
            "terminalId": t.id,
            "sessionId": t.session_id(),
            "command": command,
            "args": args,
            "cwd": t.cwd.display().to_string(),
            "pid": t.pid,
            "startedAt": crate::wire::encode::rfc3339(t.started_wall),
            "outputBytes": t.output_bytes(),
        });
        if let Some(tty) = &t.tty {
            v["_meta"]["execd"]["tty"] = crate::methods::bash::tty_size(tty);
        }
        v["_meta"]["execd"]["sandbox"] = sandbox_of(t);
        if t.running() && t.waiting_for_input {
            v["_meta"]["execd"]["waitingForInput"] = true.into();
        }
        if t.exit.is_some() {
            let mut status = exit_status(t);
            status["_meta"] = json!({ "execd": view::usage_meta(t) });
            v["exitStatus"] = status;
        }
        v
    })?;
    let mut out = json!({ "terminals": terminals });
    if let Some(cursor) = next {
        out["nextCursor"] = cursor.into();
    }
    Ok(Step::Done(out))
}
