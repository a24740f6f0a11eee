//! The bash pipe API as JSON-RPC: `bash/exec`, `output`, `write`, `kill` and sessions. The
//! objects are those of the published API (`snake_case`); an HTTP `data` is our `result`.
//! Each method reads the core and returns a `Step`.
//!
//! A bash command always runs as `SHELL -c command` with stdin a pipe and stdout and stderr
//! in separate rings. A session is API-level state of its owner (its default directory and
//! its commands); `cd` inside a command does not carry over. Several commands of one
//! session may run at once. Finished commands beyond the newest `BASH_HISTORY` of a
//! session are dropped oldest first.

use std::time::Duration;

use serde_json::{json, Map, Value};

use crate::core::launch::{
    default_term, requested_tty, resize_to, validate_dir, validate_env, LaunchRequest,
};
use crate::core::ring::middle_cut;
use crate::core::table::{BashSession, Family, Key, Proc, SessionKey, Tty};
use crate::core::view::{self, exit_fields, oom_killed};
use crate::core::vocab::After;
use crate::core::{Caller, Core, Step, Wait};
use crate::methods::list;
use crate::types::{Program, Stdio3};
use crate::wire::encode::rfc3339;
use crate::wire::rpc::{Params, RpcError};

/// `max_output_length` when the request names none.
pub const DEFAULT_MAX_OUTPUT_LENGTH: u64 = 50_000;
/// `wait_timeout` of `bash/output` when the request names none.
pub const DEFAULT_WAIT_TIMEOUT: f64 = 30.0;

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

/// The bash `{command_id, command, status, exit_code}` (+ `signal`, and `tty` for a
/// command in a terminal).
pub fn command_info(p: &Proc) -> Value {
    let mut v = Map::new();
    v.insert("command_id".into(), p.id.clone().into());
    v.insert("command".into(), p.command.clone().into());
    v.insert("status".into(), p.status().into());
    add_bash_exit(&mut v, p);
    if p.running() {
        v.insert("waiting_for_input".into(), p.waiting_for_input.into());
    }
    if let Some(t) = &p.tty {
        v.insert("tty".into(), tty_size(t));
    }
    Value::Object(v)
}

/// The whole retained text of one stream and the offset it reaches.
fn whole_text(p: &Proc, stream: usize) -> (String, u64) {
    let s = &p.streams[stream];
    let (from, to) = s.ring.utf8_window(s.ring.start(), s.ring.end(), s.open);
    (s.text(from, to), to)
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
    if p.running() {
        v.insert("waiting_for_input".into(), p.waiting_for_input.into());
    }
    if let Some(n) = &p.notice {
        v.insert("notice".into(), n.clone().into());
    }
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
    (s.text(ws, we), we, skipped + (ws - from))
}

/// The `bash/output` result from the given offsets.
pub fn output_result(p: &Proc, from: [u64; 2], screen: bool) -> Value {
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
    v.insert("waiting_for_input".into(), p.waiting_for_input.into());
    if screen {
        if let Some(s) = p.tty.as_ref().and_then(|t| t.screen.as_ref()) {
            v.insert("screen".into(), s.view());
        }
    }
    Value::Object(v)
}

/// A terminal's `{rows, cols}`.
pub fn tty_size(t: &Tty) -> Value {
    json!({"rows": t.size.rows, "cols": t.size.cols})
}

/// `bash/resize {session_id, command_id?, rows, cols}`: sets the window size of the
/// command's terminal (the newest running command by default).
pub fn resize(core: &mut Core, caller: &Caller, p: &Params) -> Result<Step, RpcError> {
    let size = resize_to(p)?;
    let key = running_target(core, caller, p)?;
    core.resize(key, size)?;
    Ok(Step::Done(json!({})))
}

/// The running command a write or a resize is for: `command_id`, else the session's
/// newest running command.
fn running_target(core: &mut Core, caller: &Caller, p: &Params) -> Result<Key, RpcError> {
    let session = existing_session(core, caller, p)?;
    target(core, caller, &session, p.opt_str("command_id")?, |c| {
        c.table.newest_running(&session)
    })?
    .ok_or_else(|| RpcError::invalid_state(format!("no running command in session {}", session.1)))
}

fn seconds(s: f64) -> Duration {
    Duration::from_secs_f64(s)
}

fn session_info(core: &Core, sess: &BashSession) -> Value {
    let running = sess
        .commands
        .iter()
        .rev()
        .filter_map(|k| core.table.get(*k))
        .find(|p| p.running());
    json!({
        "session_id": sess.id,
        "status": "ready",
        "working_dir": sess.workdir.display().to_string(),
        "created_at": rfc3339(sess.created_wall),
        "last_used_at": rfc3339(sess.last_used_wall),
        "current_command": running.map(|p| p.command.clone()),
        "waiting_for_input": running.is_some_and(|p| p.waiting_for_input),
        "command_count": sess.command_count,
    })
}

/// The caller's session named in `session_id` (which must exist).
fn existing_session(core: &mut Core, caller: &Caller, p: &Params) -> Result<SessionKey, RpcError> {
    core.open_session(caller.uid, Some(p.str("session_id")?), None, false)
}

/// Parses `env: {NAME: value}`.
fn env_map(p: &Params) -> Result<Vec<(String, String)>, RpcError> {
    let Some(v) = p.opt_value("env") else {
        return Ok(Vec::new());
    };
    let Value::Object(m) = v else {
        return Err(RpcError::invalid_params(
            "env",
            "expected an object of strings",
        ));
    };
    m.iter()
        .map(|(k, v)| match v {
            Value::String(s) => Ok((k.clone(), s.clone())),
            _ => Err(RpcError::invalid_params(
                "env",
                format!("value of {k:?} is not a string"),
            )),
        })
        .collect()
}

/// `bash/exec`: asks the loop to start the line in the session (created if needed).
pub fn exec(core: &mut Core, caller: &Caller, p: &Params) -> Result<Step, RpcError> {
    let command = p.str("command")?;
    if command.is_empty() {
        return Err(RpcError::invalid_params("command", "empty"));
    }
    let mut env = env_map(p)?;
    validate_env("env", &env)?;
    let size = p.opt_object("size")?.map(Params);
    let stdio = match requested_tty(p.opt_bool("tty")?, size.as_ref())? {
        Some(size) => {
            default_term(&mut env);
            Stdio3::Pty(size)
        }
        None => Stdio3::Separate,
    };
    let async_mode = p.opt_bool("async_mode")?.unwrap_or(false);
    let timeout = p.opt_seconds("timeout")?;
    let hard_timeout = p.opt_seconds("hard_timeout")?;
    let max_len = p
        .opt_u64("max_output_length")?
        .unwrap_or(DEFAULT_MAX_OUTPUT_LENGTH) as usize;
    let dir = p
        .opt_str("exec_dir")?
        .map(|d| validate_dir("exec_dir", d))
        .transpose()?;
    let subscribe = p
        .opt_object("subscribe")?
        .map(|o| crate::methods::events::sub_opts(&Params(o)))
        .transpose()?
        .map(|opts| (caller.conn, opts));
    let kill_on_disconnect = p
        .opt_bool("kill_on_disconnect")?
        .unwrap_or(false)
        .then_some(caller.conn);
    let limits = crate::core::launch::request_limits(
        p.opt_object("limits")?.map(Params).as_ref(),
        ["memory_max", "pids_max", "cpu_max"],
        &core.cfg.limits,
    )?;
    let sandbox_asked = crate::core::launch::requested_sandbox("sandbox", p.opt_value("sandbox"))?;
    // What a relaying front end says (execctl mcp): its door, and the most it lets the
    // command have.
    let via = crate::core::launch::requested_via(p.opt_str("via")?)?;
    let bound =
        crate::core::launch::requested_sandbox("sandbox_ceiling", p.opt_value("sandbox_ceiling"))?;
    let requested = p.opt_str("session_id")?.filter(|s| !s.is_empty());
    let existed = requested.is_some_and(|id| {
        core.table
            .sessions
            .contains_key(&(caller.uid, id.to_string()))
    });
    // `exec_dir` becomes the session's directory once a command has started there.
    let session = core.open_session(caller.uid, requested, None, true)?;
    let cwd = dir
        .clone()
        .unwrap_or_else(|| core.table.sessions[&session].workdir.clone());
    let ceiling = bound.map(|b| core.declared_ceiling(&b, &cwd, caller.uid));
    Ok(Step::Launch(Box::new(LaunchRequest {
        family: Family::Bash {
            session_id: session.1,
        },
        peer: caller.peer(),
        program: Program::Shell {
            shell: core.cfg.shell.clone(),
            line: command.to_string(),
        },
        command: command.to_string(),
        args: Vec::new(),
        env,
        cwd,
        cwd_field: "exec_dir",
        stdio,
        ring_capacity: core.cfg.output_limit,
        prefix: "cmd",
        subscribe,
        kill_on_disconnect,
        limits,
        admitted: None,
        origin: None,
        via,
        after: After::BashExec {
            async_mode,
            timeout,
            hard_timeout,
            max_len,
            created_session: !existed,
            exec_dir: dir,
        },
        sandbox_asked,
        sandbox: None,
        ceiling,
    })))
}

/// After `bash/exec` tried to start its command: arm the hard timeout and answer now
/// (`async_mode`) or when it exits or the soft timeout passes, counted from the start.
pub fn after_exec(
    core: &mut Core,
    req: &LaunchRequest,
    started: Result<Key, RpcError>,
) -> Result<Step, RpcError> {
    let After::BashExec {
        async_mode,
        timeout,
        hard_timeout,
        max_len,
        ..
    } = req.after
    else {
        return Err(RpcError::internal("bash/exec tail for another request"));
    };
    let key = match started {
        Ok(key) => key,
        Err(e) => {
            // A session this call made for a command that never started is not kept.
            core.launch_failed(req);
            return Err(e);
        }
    };
    let session = (req.peer.uid, req.family.session_id().to_string());
    if let Some(s) = core.table.sessions.get_mut(&session) {
        if let After::BashExec {
            exec_dir: Some(dir),
            ..
        } = &req.after
        {
            s.workdir = dir.clone();
        }
        // The command that made its session again says so in its answer.
        let notice = s.reopened.take();
        if let Some(p) = core.table.get_mut(key) {
            p.notice = notice;
        }
    }
    if let Some(h) = hard_timeout {
        core.arm_hard_timeout(key, seconds(h));
    }
    if async_mode {
        let p = core
            .table
            .get(key)
            .ok_or_else(|| RpcError::internal("command vanished"))?;
        return Ok(Step::Done(exec_result(p, max_len)));
    }
    Ok(Step::Park {
        wait: Wait::BashExec { key, max_len },
        deadline: timeout.map(|t| core.now + seconds(t)),
    })
}

/// The command a request names (`command_id`, which must be of the session), else `pick`.
fn target(
    core: &Core,
    caller: &Caller,
    session: &SessionKey,
    command_id: Option<&str>,
    pick: impl Fn(&Core) -> Option<Key>,
) -> Result<Option<Key>, RpcError> {
    match command_id {
        Some(id) => core
            .table
            .find_in(id, caller.uid, |p| {
                p.session_key().as_ref() == Some(session)
            })
            .map(Some)
            .ok_or_else(|| RpcError::not_found("command", id)),
        None => Ok(pick(core)),
    }
}

/// `bash/output`.
pub fn output(core: &mut Core, caller: &Caller, p: &Params) -> Result<Step, RpcError> {
    let from = [
        p.opt_u64("offset")?.unwrap_or(0),
        p.opt_u64("stderr_offset")?.unwrap_or(0),
    ];
    let wait = p.opt_bool("wait")?.unwrap_or(false);
    let screen = p.opt_bool("screen")?.unwrap_or(false);
    let wait_timeout = p
        .opt_seconds("wait_timeout")?
        .unwrap_or(DEFAULT_WAIT_TIMEOUT);
    let session = existing_session(core, caller, p)?;
    let key = target(core, caller, &session, p.opt_str("command_id")?, |c| {
        c.table.newest_command(&session)
    })?
    .ok_or_else(|| RpcError::invalid_state(format!("no command in session {}", session.1)))?;
    if screen {
        core.keep_screen(key)?;
    }
    if wait {
        return Ok(Step::Park {
            wait: Wait::BashOutput { key, from, screen },
            deadline: Some(core.now + seconds(wait_timeout)),
        });
    }
    let p = core
        .table
        .get(key)
        .ok_or_else(|| RpcError::internal("command vanished"))?;
    Ok(Step::Done(output_result(p, from, screen)))
}

/// The input of a write: `input` as text, or with `encoding: "base64"` its exact bytes.
pub fn write_input(p: &Params) -> Result<Vec<u8>, RpcError> {
    let input = p.str("input")?;
    match p.opt_str("encoding")? {
        None | Some("text") => Ok(input.as_bytes().to_vec()),
        Some("base64") => crate::wire::encode::base64_decode(input)
            .ok_or_else(|| RpcError::invalid_params("input", "not valid base64")),
        Some(other) => Err(RpcError::invalid_params(
            "encoding",
            format!("{other:?} is neither \"text\" nor \"base64\""),
        )),
    }
}

/// `bash/write {session_id, input, command_id?, eof?, encoding?, wait?}`: queues input
/// for the command's stdin; the loop writes it as the pipe takes it.
pub fn write(core: &mut Core, caller: &Caller, p: &Params) -> Result<Step, RpcError> {
    let data = write_input(p)?;
    let eof = p.opt_bool("eof")?.unwrap_or(false);
    let wait = p.opt_bool("wait")?.unwrap_or(false);
    let key = running_target(core, caller, p)?;
    let bound =
        crate::core::launch::requested_sandbox("sandbox_ceiling", p.opt_value("sandbox_ceiling"))?;
    super::write_stdin(core, caller, bound, key, data, eof, wait)
}

/// `bash/kill`: a signal to the command's tree.
pub fn kill(core: &mut Core, caller: &Caller, p: &Params) -> Result<Step, RpcError> {
    let name = p.opt_str("signal")?.unwrap_or("SIGTERM");
    let sig = crate::types::signal_by_name(name).ok_or_else(|| {
        RpcError::invalid_params(
            "signal",
            format!("unknown signal {name:?}; use SIGTERM, SIGKILL, SIGINT, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2, SIGSTOP or SIGCONT"),
        )
    })?;
    let session = existing_session(core, caller, p)?;
    let key = target(core, caller, &session, p.opt_str("command_id")?, |c| {
        c.table
            .newest_running(&session)
            .or_else(|| c.table.newest_command(&session))
    })?
    .ok_or_else(|| RpcError::invalid_state(format!("no command in session {}", session.1)))?;
    let running = core.table.get(key).is_some_and(|p| p.running());
    // Sent to an ended command, only SIGKILL does anything: it kills what the command
    // left (PROTOCOL 14).
    core.signal(key, sig);
    if !running || sig == libc::SIGSTOP || sig == libc::SIGCONT {
        let p = core
            .table
            .get(key)
            .ok_or_else(|| RpcError::internal("command vanished"))?;
        return Ok(Step::Done(command_info(p)));
    }
    // Answer when it ends, or after the kill grace with whatever state it is in.
    Ok(Step::Park {
        wait: Wait::BashKill(key),
        deadline: Some(core.now + core.cfg.kill_grace),
    })
}

/// `bash/commands {session_id?, limit?, cursor?}` (extension): the caller's bash
/// commands, newest first, with what `execctl ps` shows, a page at a time (`next_cursor`
/// names the next page). Long command lines are cut to a few KiB with a marker.
pub fn commands(core: &mut Core, caller: &Caller, p: &Params) -> Result<Step, RpcError> {
    let only = p.opt_str("session_id")?;
    let (list, next) = list::page_of(core, caller.uid, p, only, true, |c| {
        let mut v = match command_info(c) {
            Value::Object(m) => m,
            _ => Map::new(),
        };
        v.insert(
            "command".into(),
            list::cut_command_line(&c.command, &[]).0.into(),
        );
        v.insert("session_id".into(), c.session_id().into());
        v.insert("pid".into(), c.pid.into());
        v.insert("cwd".into(), c.cwd.display().to_string().into());
        v.insert("sandbox".into(), crate::methods::acp::sandbox_of(c));
        v.insert("started_at".into(), rfc3339(c.started_wall).into());
        v.insert("stdout_bytes".into(), c.streams[0].ring.end().into());
        v.insert("stderr_bytes".into(), c.streams[1].ring.end().into());
        if c.exit.is_some() {
            v.insert("_meta".into(), json!({ "execd": view::usage_meta(c) }));
        }
        Value::Object(v)
    })?;
    let mut out = json!({ "commands": list });
    if let Some(cursor) = next {
        out["next_cursor"] = cursor.into();
    }
    Ok(Step::Done(out))
}

/// `bash/sessions`: the caller's own sessions, oldest first.
pub fn sessions(core: &mut Core, caller: &Caller, _p: &Params) -> Result<Step, RpcError> {
    let mut list: Vec<&BashSession> = core
        .table
        .sessions
        .values()
        .filter(|x| x.owner == caller.uid)
        .collect();
    list.sort_by(|a, b| a.created_wall.cmp(&b.created_wall).then(a.id.cmp(&b.id)));
    Ok(Step::Done(Value::Array(
        list.into_iter().map(|x| session_info(core, x)).collect(),
    )))
}

/// `bash/sessions/create`: a new session, or an existing one unchanged.
pub fn create_session(core: &mut Core, caller: &Caller, p: &Params) -> Result<Step, RpcError> {
    let requested = p.opt_str("session_id")?;
    let exists = requested.is_some_and(|id| {
        core.table
            .sessions
            .contains_key(&(caller.uid, id.to_string()))
    });
    let dir = match p.opt_str("exec_dir")? {
        Some(d) if !exists => Some(validate_dir("exec_dir", d)?),
        _ => None,
    };
    let key = core.open_session(caller.uid, requested, dir, true)?;
    let notice = core
        .table
        .sessions
        .get_mut(&key)
        .and_then(|s| s.reopened.take());
    let mut answer = session_info(core, &core.table.sessions[&key]);
    if let Some(n) = notice {
        answer["notice"] = n.into();
    }
    Ok(Step::Done(answer))
}

/// `bash/sessions/close`: kills its running commands and frees it.
pub fn close_session(core: &mut Core, caller: &Caller, p: &Params) -> Result<Step, RpcError> {
    let id = p.str("session_id")?;
    let key = (caller.uid, id.to_string());
    if !core.table.sessions.contains_key(&key) {
        return Err(core.session_gone(false, caller.uid, id));
    }
    core.close_session(&key);
    Ok(Step::Done(json!({})))
}
