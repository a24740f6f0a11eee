//! The bash pipe API as JSON-RPC: `bash/exec`, `output`, `write`, `kill` and sessions. The
//! objects are those of the published API (`snake_case`); an HTTP `data` is our `result`.
//!
//! A bash command always runs as `SHELL -c command` with stdin a pipe and stdout and stderr
//! in separate rings. A session is API-level state (its default directory and its
//! commands); `cd` inside a command does not carry over. Several commands of one session
//! may run at once. Finished commands beyond the newest `BASH_HISTORY` of a session are
//! dropped oldest first.

use std::collections::VecDeque;
use std::time::{Duration, SystemTime};

use serde_json::{json, Map, Value};

use crate::config::BASH_HISTORY;
use crate::process::{self, Program, Stdio3};
use crate::ring::middle_cut;
use crate::rpc::{rfc3339, Params, RpcError};
use crate::server::{
    log, validate_dir, validate_env, Caller, Launch, Outcome, Server, Timer, Wait,
};
use crate::table::{Family, Key, KillReason, Proc, Session};

/// `max_output_length` when the request names none.
pub const DEFAULT_MAX_OUTPUT_LENGTH: u64 = 50_000;
/// `wait_timeout` of `bash/output` when the request names none.
pub const DEFAULT_WAIT_TIMEOUT: f64 = 30.0;

const STREAM_NAMES: [&str; 2] = ["stdout", "stderr"];

fn seconds(s: f64) -> Duration {
    Duration::from_secs_f64(s)
}

/// `{command_id, command, status, exit_code}` (+ `signal` when a signal ended it).
pub fn command_info(p: &Proc) -> Value {
    let mut v = Map::new();
    v.insert("command_id".into(), p.id.clone().into());
    v.insert("command".into(), p.command.clone().into());
    v.insert("status".into(), p.status().into());
    add_exit(&mut v, p);
    Value::Object(v)
}

/// `exit_code`, and `signal` only when a signal ended the command.
fn add_exit(v: &mut Map<String, Value>, p: &Proc) {
    let (code, signal) = p.exit_fields();
    v.insert("exit_code".into(), code.into());
    if let Some(sig) = signal {
        v.insert("signal".into(), sig.into());
    }
}

/// The whole retained text of one stream and the offset it reaches.
fn whole_text(p: &Proc, stream: usize) -> (String, u64) {
    let s = &p.streams[stream];
    let (from, to) = s.ring.utf8_window(s.ring.start(), s.ring.end(), s.open());
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
    add_exit(&mut v, p);
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
    let (ws, we) = ring.utf8_window(from, ring.end(), s.open());
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
        let (ws, we) = ring.utf8_window(from, ring.end(), s.open());
        ws < we
    })
}

/// The `bash/output` result from the given offsets.
pub fn output_result(p: &Proc, from: [u64; 2]) -> Value {
    let mut v = Map::new();
    v.insert("session_id".into(), p.session_id().into());
    for (i, name) in STREAM_NAMES.iter().enumerate() {
        let (text, next, skipped) = read_from(p, i, from[i]);
        let offset_field = if i == 0 { "offset" } else { "stderr_offset" };
        v.insert((*name).into(), text.into());
        v.insert(offset_field.into(), next.into());
        if skipped > 0 {
            v.insert(format!("{name}_skipped"), skipped.into());
        }
    }
    v.insert("command".into(), command_info(p));
    Value::Object(v)
}

fn session_info(s: &Server, sess: &Session) -> Value {
    let current = sess
        .commands
        .iter()
        .rev()
        .filter_map(|k| s.table.get(*k))
        .find(|p| p.running())
        .map(|p| p.command.clone());
    json!({
        "session_id": sess.id,
        "status": "ready",
        "working_dir": sess.workdir.display().to_string(),
        "created_at": rfc3339(sess.created_wall),
        "last_used_at": rfc3339(sess.last_used_wall),
        "current_command": current,
        "command_count": sess.command_count,
    })
}

/// Finds the caller's session `id`, creating it (under that id, or a new one when `id` is
/// absent or empty) when `create` allows. Marks it used.
fn open_session(
    s: &mut Server,
    caller: &Caller,
    id: Option<&str>,
    exec_dir: Option<&str>,
    create: bool,
) -> Result<String, RpcError> {
    let dir = exec_dir.map(|d| validate_dir("exec_dir", d)).transpose()?;
    let id = match id.filter(|i| !i.is_empty()) {
        Some(i) => i.to_string(),
        None if create => s.table.new_session_id(),
        None => return Err(RpcError::invalid_params("session_id", "required")),
    };
    match s.table.sessions.get(&id) {
        Some(sess) if !crate::table::visible(sess.owner, caller.uid) => {
            return Err(RpcError::not_found("session", &id));
        }
        Some(_) => {}
        None if !create => return Err(RpcError::not_found("session", &id)),
        None => {
            if s.table.sessions.len() >= s.cfg.max_sessions {
                return Err(RpcError::limit("max-sessions", s.cfg.max_sessions));
            }
            let now_wall = SystemTime::now();
            s.table.sessions.insert(
                id.clone(),
                Session {
                    id: id.clone(),
                    owner: caller.uid,
                    workdir: s.cfg.workdir.clone(),
                    created_wall: now_wall,
                    last_used: s.now,
                    last_used_wall: now_wall,
                    commands: VecDeque::new(),
                    command_count: 0,
                    idle_timer: None,
                },
            );
            arm_idle(s, &id, s.now + s.cfg.session_idle);
        }
    }
    let now = s.now;
    s.table.touch_session(&id, now);
    if let (Some(dir), Some(sess)) = (dir, s.table.sessions.get_mut(&id)) {
        sess.workdir = dir;
    }
    Ok(id)
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

/// `bash/exec`.
pub fn exec(s: &mut Server, caller: &Caller, p: &Params) -> Outcome {
    match exec_inner(s, caller, p) {
        Ok(o) => o,
        Err(e) => Outcome::Done(Err(e)),
    }
}

fn exec_inner(s: &mut Server, caller: &Caller, p: &Params) -> Result<Outcome, RpcError> {
    let command = p.str("command")?;
    if command.is_empty() {
        return Err(RpcError::invalid_params("command", "empty"));
    }
    let env = env_map(p)?;
    validate_env("env", &env)?;
    let async_mode = p.opt_bool("async_mode")?.unwrap_or(false);
    let timeout = p.opt_seconds("timeout")?;
    let hard_timeout = p.opt_seconds("hard_timeout")?;
    let max_len = p
        .opt_u64("max_output_length")?
        .unwrap_or(DEFAULT_MAX_OUTPUT_LENGTH) as usize;
    let existed = p
        .opt_str("session_id")?
        .is_some_and(|id| s.table.sessions.contains_key(id));
    let session = open_session(
        s,
        caller,
        p.opt_str("session_id")?,
        p.opt_str("exec_dir")?,
        true,
    )?;
    let cwd = s.table.sessions[&session].workdir.clone();
    let launched = s.launch(Launch {
        family: Family::Bash {
            session_id: session.clone(),
        },
        owner: caller.uid,
        conn: caller.conn,
        program: Program::Shell {
            shell: s.cfg.shell.clone(),
            line: command.to_string(),
        },
        command: command.to_string(),
        args: Vec::new(),
        env,
        cwd,
        stdio: Stdio3::Separate,
        ring_capacity: s.cfg.output_limit,
        prefix: "cmd",
    });
    let key = match launched {
        Ok(k) => k,
        Err(e) => {
            // A session this call made for a command that never started is not kept.
            if !existed {
                forget_session(s, &session);
            }
            return Err(e);
        }
    };
    if let Some(h) = hard_timeout {
        let t = s.timers.add(s.now + seconds(h), Timer::HardTimeout { key });
        if let Some(p) = s.table.get_mut(key) {
            p.hard_timer = Some(t);
        }
    }
    if async_mode {
        let p = s
            .table
            .get(key)
            .ok_or_else(|| RpcError::internal("command vanished"))?;
        return Ok(Outcome::Done(Ok(exec_result(p, max_len))));
    }
    Ok(Outcome::Park {
        wait: Wait::BashExec { key, max_len },
        deadline: timeout.map(|t| s.now + seconds(t)),
    })
}

/// The command a request names (`command_id`, which must be of the session), else `pick`.
fn target(
    s: &Server,
    caller: &Caller,
    session: &str,
    command_id: Option<&str>,
    pick: impl Fn(&Server) -> Option<Key>,
) -> Result<Option<Key>, RpcError> {
    match command_id {
        Some(id) => s
            .table
            .find(id, caller.uid)
            .filter(|k| {
                s.table.get(*k).is_some_and(
                    |p| matches!(&p.family, Family::Bash { session_id } if session_id == session),
                )
            })
            .map(Some)
            .ok_or_else(|| RpcError::not_found("command", id)),
        None => Ok(pick(s)),
    }
}

/// `bash/output`.
pub fn output(s: &mut Server, caller: &Caller, p: &Params) -> Outcome {
    match output_inner(s, caller, p) {
        Ok(o) => o,
        Err(e) => Outcome::Done(Err(e)),
    }
}

fn output_inner(s: &mut Server, caller: &Caller, p: &Params) -> Result<Outcome, RpcError> {
    let from = [
        p.opt_u64("offset")?.unwrap_or(0),
        p.opt_u64("stderr_offset")?.unwrap_or(0),
    ];
    let wait = p.opt_bool("wait")?.unwrap_or(false);
    let wait_timeout = p
        .opt_seconds("wait_timeout")?
        .unwrap_or(DEFAULT_WAIT_TIMEOUT);
    let session = open_session(s, caller, Some(p.str("session_id")?), None, false)?;
    let key = target(s, caller, &session, p.opt_str("command_id")?, |s| {
        s.table.newest_command(&session)
    })?
    .ok_or_else(|| RpcError::invalid_state(format!("no command in session {session}")))?;
    if wait {
        return Ok(Outcome::Park {
            wait: Wait::BashOutput { key, from },
            deadline: Some(s.now + seconds(wait_timeout)),
        });
    }
    let p = s
        .table
        .get(key)
        .ok_or_else(|| RpcError::internal("command vanished"))?;
    Ok(Outcome::Done(Ok(output_result(p, from))))
}

/// `bash/write`: queue input for the command's stdin.
pub fn write(s: &mut Server, caller: &Caller, p: &Params) -> Result<Value, RpcError> {
    let input = p.str("input")?;
    let eof = p.opt_bool("eof")?.unwrap_or(false);
    let session = open_session(s, caller, Some(p.str("session_id")?), None, false)?;
    let key = target(s, caller, &session, p.opt_str("command_id")?, |s| {
        s.table.newest_running(&session)
    })?
    .ok_or_else(|| RpcError::invalid_state(format!("no running command in session {session}")))?;
    let proc_ = s
        .table
        .get_mut(key)
        .ok_or_else(|| RpcError::internal("command vanished"))?;
    if !proc_.running() {
        return Err(RpcError::invalid_state(format!(
            "command {} has exited",
            proc_.id
        )));
    }
    let id = proc_.id.clone();
    let stdin = proc_
        .stdin
        .as_mut()
        .ok_or_else(|| RpcError::internal("bash command without stdin"))?;
    if stdin.fd.is_none() || stdin.eof_requested {
        return Err(closed_stdin(&id, stdin.undelivered));
    }
    if stdin.buf.len() + input.len() > stdin.capacity {
        return Err(RpcError::limit("stdin-buffer", stdin.capacity));
    }
    stdin.buf.extend(input.as_bytes());
    stdin.eof_requested = eof;
    s.flush_stdin(key);
    // The pipe may have broken just now (the command closed its stdin): say so at once.
    if let Some(stdin) = s.table.get(key).and_then(|p| p.stdin.as_ref()) {
        if stdin.fd.is_none() && stdin.undelivered > 0 {
            return Err(closed_stdin(&id, stdin.undelivered));
        }
    }
    Ok(json!({ "written": input.len() }))
}

fn closed_stdin(id: &str, undelivered: u64) -> RpcError {
    let msg = if undelivered > 0 {
        format!("stdin of {id} is closed; {undelivered} bytes of earlier input were not delivered")
    } else {
        format!("stdin of {id} is closed")
    };
    RpcError::invalid_state(msg).with_data(json!({ "undelivered": undelivered }))
}

/// `bash/kill`: a signal to the command's process group.
pub fn kill(s: &mut Server, caller: &Caller, p: &Params) -> Outcome {
    match kill_inner(s, caller, p) {
        Ok(o) => o,
        Err(e) => Outcome::Done(Err(e)),
    }
}

fn kill_inner(s: &mut Server, caller: &Caller, p: &Params) -> Result<Outcome, RpcError> {
    let name = p.opt_str("signal")?.unwrap_or("SIGTERM");
    let sig = process::signal_by_name(name).ok_or_else(|| {
        RpcError::invalid_params(
            "signal",
            format!("unknown signal {name:?}; use SIGTERM, SIGKILL, SIGINT, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2, SIGSTOP or SIGCONT"),
        )
    })?;
    let session = open_session(s, caller, Some(p.str("session_id")?), None, false)?;
    let key = target(s, caller, &session, p.opt_str("command_id")?, |s| {
        s.table
            .newest_running(&session)
            .or_else(|| s.table.newest_command(&session))
    })?
    .ok_or_else(|| RpcError::invalid_state(format!("no command in session {session}")))?;
    let proc_ = s
        .table
        .get_mut(key)
        .ok_or_else(|| RpcError::internal("command vanished"))?;
    if !proc_.running() {
        return Ok(Outcome::Done(Ok(command_info(proc_))));
    }
    process::signal_group(proc_.pid, sig);
    log(format_args!(
        "{} sent {}",
        proc_.id,
        process::signal_name(sig)
    ));
    if sig == libc::SIGSTOP || sig == libc::SIGCONT {
        return Ok(Outcome::Done(Ok(command_info(proc_))));
    }
    proc_.signalled = true;
    // Answer when it ends, or after the kill grace with whatever state it is in.
    Ok(Outcome::Park {
        wait: Wait::BashKill(key),
        deadline: Some(s.now + s.cfg.kill_grace),
    })
}

/// `bash/commands {session_id?}` (extension): the caller's bash commands, newest first,
/// with what `execctl ps` shows.
pub fn commands(s: &mut Server, caller: &Caller, p: &Params) -> Result<Value, RpcError> {
    let only = p.opt_str("session_id")?;
    let list: Vec<Value> = s
        .table
        .list(caller.uid)
        .into_iter()
        .filter(|c| matches!(&c.family, Family::Bash { session_id } if only.is_none_or(|o| o == session_id)))
        .map(|c| {
            let mut v = match command_info(c) {
                Value::Object(m) => m,
                _ => Map::new(),
            };
            v.insert("session_id".into(), c.session_id().into());
            v.insert("pid".into(), c.pid.into());
            v.insert("cwd".into(), c.cwd.display().to_string().into());
            v.insert("started_at".into(), rfc3339(c.started_wall).into());
            v.insert("stdout_bytes".into(), c.streams[0].ring.end().into());
            v.insert("stderr_bytes".into(), c.streams[1].ring.end().into());
            if c.exit.is_some() {
                v.insert("_meta".into(), json!({ "execd": crate::acp::usage_meta(c) }));
            }
            Value::Object(v)
        })
        .collect();
    Ok(json!({ "commands": list }))
}

/// `bash/sessions`: the caller's sessions, oldest first.
pub fn sessions(s: &mut Server, caller: &Caller) -> Result<Value, RpcError> {
    let mut list: Vec<&Session> = s
        .table
        .sessions
        .values()
        .filter(|x| crate::table::visible(x.owner, caller.uid))
        .collect();
    list.sort_by(|a, b| a.created_wall.cmp(&b.created_wall).then(a.id.cmp(&b.id)));
    Ok(Value::Array(
        list.into_iter().map(|x| session_info(s, x)).collect(),
    ))
}

/// `bash/sessions/create`: a new session, or an existing one unchanged.
pub fn create_session(s: &mut Server, caller: &Caller, p: &Params) -> Result<Value, RpcError> {
    let requested = p.opt_str("session_id")?;
    let exists = requested.is_some_and(|id| s.table.session(id, caller.uid).is_some());
    let exec_dir = if exists { None } else { p.opt_str("exec_dir")? };
    let id = open_session(s, caller, requested, exec_dir, true)?;
    Ok(session_info(s, &s.table.sessions[&id]))
}

/// `bash/sessions/close`: kills its running commands and frees it.
pub fn close_session(s: &mut Server, caller: &Caller, p: &Params) -> Result<Value, RpcError> {
    let id = p.str("session_id")?;
    if s.table.session(id, caller.uid).is_none() {
        return Err(RpcError::not_found("session", id));
    }
    close(s, id);
    Ok(json!({}))
}

/// Frees a session: running commands are killed (and forgotten once reaped), finished ones
/// dropped now.
fn close(s: &mut Server, id: &str) {
    let Some(sess) = s.table.sessions.get(id) else {
        return;
    };
    let keys: Vec<Key> = sess.commands.iter().copied().collect();
    for key in keys {
        let running = s.table.get(key).is_some_and(Proc::running);
        if running {
            if let Some(p) = s.table.get_mut(key) {
                p.kill = Some(KillReason::Killed);
            }
            s.release(key);
        } else {
            s.drop_finished(key);
        }
    }
    forget_session(s, id);
    log(format_args!("session {id} closed"));
}

/// Removes a session and its idle timer.
fn forget_session(s: &mut Server, id: &str) {
    if let Some(t) = s.table.sessions.remove(id).and_then(|x| x.idle_timer) {
        s.timers.cancel(t);
    }
}

/// (Re)arms a session's idle check at `at`.
fn arm_idle(s: &mut Server, id: &str, at: std::time::Instant) {
    let t = s.timers.add(
        at,
        Timer::SessionIdle {
            session: id.to_string(),
        },
    );
    if let Some(old) = s
        .table
        .sessions
        .get_mut(id)
        .and_then(|x| x.idle_timer.replace(t))
    {
        s.timers.cancel(old);
    }
}

/// Drops the session's finished commands beyond the history limit.
pub fn trim_history(s: &mut Server, session: &str) {
    for key in s.table.history_overflow(session, BASH_HISTORY) {
        s.drop_finished(key);
    }
}

/// The idle timer of a session fired: close it, or look again later.
pub fn check_idle(s: &mut Server, session: &str) {
    let idle = s.cfg.session_idle;
    if s.table
        .idle_sessions(s.now, idle)
        .iter()
        .any(|x| x == session)
    {
        log(format_args!(
            "session {session} idle for {} s",
            idle.as_secs()
        ));
        close(s, session);
        return;
    }
    let Some(sess) = s.table.sessions.get(session) else {
        return;
    };
    let next = if s.table.session_busy(session) {
        s.now + idle
    } else {
        sess.last_used + idle
    };
    arm_idle(s, session, next.max(s.now + Duration::from_millis(10)));
}
