//! Interactive shells as JSON-RPC (`shell/*`) and, through the HTTP routes, as the AIO
//! sandbox's `/v1/shell/*` (PROTOCOL 12.2): the objects are that API's (its Python SDK's
//! `shell` client, `agent-sandbox` 0.0.30, works unmodified); an HTTP `data` is our
//! `result`. The state and its transitions live in `core::shell`; this room reads params,
//! builds what the loop starts, and renders answers.
//!
//! An `exec` line is a shell line for the gate (`Program::Shell`, judged as `bash/exec`'s
//! are), started as nothing: once admitted it is queued in its session, whose shell is
//! started first when it has none (`line_admitted`, then `after_start`).

use std::path::PathBuf;
use std::time::Duration;

use serde_json::{json, Map, Value};

use crate::core::launch::{resize_to, validate_dir, LaunchRequest};
use crate::core::ring::middle_cut;
use crate::core::shell::{self, Phase, Record, RecordStep as RecStep, ShellSession, TRUNCATE_AT};
use crate::core::table::{Family, Key, SessionKey};
use crate::core::vocab::{After, LineOpts, ShellExec, ShellThen, ShellWait, MAX_COMMAND};
use crate::core::{Caller, Core, Step, Wait};
use crate::types::{Program, Stdio3, WinSize};
use crate::wire::encode::rfc3339;
use crate::wire::rpc::{Params, RpcError};

/// `seconds` of `shell/wait` when the request names none.
pub const DEFAULT_WAIT: f64 = 30.0;

fn seconds(s: f64) -> Duration {
    Duration::from_secs_f64(s)
}

/// The caller's session `id` (which must exist, else `-32002` saying whether the daemon
/// closed it), counted as used and named.
fn existing(core: &mut Core, caller: &Caller, p: &Params) -> Result<SessionKey, RpcError> {
    let id = p.str("id")?;
    let key = (caller.uid, id.to_string());
    if !core.shells.map.contains_key(&key) {
        return Err(core.session_gone(true, caller.uid, id));
    }
    core.name_shell(&key);
    Ok(key)
}

fn session<'a>(core: &'a Core, key: &SessionKey) -> Result<&'a ShellSession, RpcError> {
    core.shells
        .map
        .get(key)
        .ok_or_else(|| RpcError::not_found("shell session", &key.1))
}

/// What a record's command printed, as plain text (PROTOCOL 12.1), cut to `TRUNCATE_AT`
/// characters in the middle when `truncate`; with what execd adds (a shell that died).
fn output_of(core: &Core, r: &Record, truncate: bool) -> String {
    let mut text = String::new();
    if let (Some(from), Some(p)) = (r.from, r.shell.and_then(|k| core.table.get(k))) {
        let st = &p.streams[0];
        let ring = &st.ring;
        let to = r.to.unwrap_or_else(|| st.text_end()).max(from);
        let start = from.max(ring.start());
        if start > from {
            text.push_str(&format!(
                "[... {} bytes of earlier output were dropped ...]\n",
                start - from
            ));
        }
        if to > start {
            let (ws, we) = ring.utf8_window(start, to.min(ring.end()), st.open || to < ring.end());
            if we > ws {
                text.push_str(&st.text(ws, we));
            }
        }
    }
    if let Some(note) = &r.note {
        if !text.is_empty() && !text.ends_with('\n') {
            text.push('\n');
        }
        text.push_str(note);
        text.push('\n');
    }
    if truncate {
        middle_cut(text, TRUNCATE_AT)
    } else {
        text
    }
}

/// The session's console records, oldest first, the last one included.
fn console(core: &Core, s: &ShellSession, truncate: bool) -> Value {
    Value::Array(
        s.records
            .iter()
            .map(|r| json!({ "ps1": r.ps1, "command": r.command, "output": output_of(core, r, truncate) }))
            .collect(),
    )
}

/// The `exec` result for command `seq`: its status (`no_change_timeout` while it runs
/// and has been quiet, or waits for input), its output and exit code, the console.
fn exec_result(core: &Core, key: &SessionKey, seq: u64, truncate: bool) -> Result<Value, RpcError> {
    let s = session(core, key)?;
    let r = s
        .record(seq)
        .ok_or_else(|| RpcError::not_found("shell command", &seq.to_string()))?;
    if r.no_dir {
        let dir = r.opts.exec_dir.as_deref().unwrap_or("");
        return Err(RpcError::invalid_params(
            "exec_dir",
            format!("{dir:?} does not exist or is not a directory (strict)"),
        ));
    }
    let status = match r.step {
        RecStep::Done(_) => r.status(),
        _ if r.quiet || r.waiting_for_input => "no_change_timeout",
        _ => "running",
    };
    let mut v = Map::new();
    v.insert("session_id".into(), key.1.clone().into());
    v.insert("command".into(), r.command.clone().into());
    v.insert("status".into(), status.into());
    v.insert("output".into(), output_of(core, r, truncate).into());
    v.insert("console".into(), console(core, s, truncate));
    v.insert(
        "exit_code".into(),
        if r.done() {
            r.exit_code.into()
        } else {
            Value::Null
        },
    );
    if !r.done() {
        v.insert("waiting_for_input".into(), r.waiting_for_input.into());
    }
    if let Some(n) = &r.notice {
        v.insert("notice".into(), n.clone().into());
    }
    Ok(Value::Object(v))
}

/// The answer to a request parked on a shell session (`methods::answer`).
pub fn answer(
    core: &Core,
    session: &SessionKey,
    seq: u64,
    what: ShellWait,
) -> Result<Value, RpcError> {
    match what {
        ShellWait::Exec { truncate } => exec_result(core, session, seq, truncate),
        ShellWait::End => {
            let s = session_of(core, session)?;
            Ok(status_of(s.record(seq)))
        }
        ShellWait::View => view_of(core, session),
        ShellWait::Kill => {
            let s = session_of(core, session)?;
            let r = s.record(seq);
            let code = r.and_then(|r| r.exit_code);
            Ok(json!({
                "status": r.map_or("terminated", Record::status),
                "exit_code": code,
                "returncode": code,
            }))
        }
    }
}

fn session_of<'a>(core: &'a Core, key: &SessionKey) -> Result<&'a ShellSession, RpcError> {
    session(core, key)
}

/// `{status, exit_code}` of a record (`wait`): `completed` when there is none.
fn status_of(r: Option<&Record>) -> Value {
    match r {
        Some(r) => json!({
            "status": r.status(),
            "exit_code": if r.done() { r.exit_code.into() } else { Value::Null },
        }),
        None => json!({ "status": "completed", "exit_code": null }),
    }
}

/// A session as `shell/sessions` lists it (the SDK's `ShellSessionInfo`, and what execd
/// adds: the shell's process id for `events/subscribe`, its pid, restarts, its
/// terminal's size).
fn session_info(core: &Core, s: &ShellSession) -> Value {
    let active = s.busy() || core.now.saturating_duration_since(s.last_used) < shell::ACTIVE_WITHIN;
    let shell = s.shell.and_then(|k| core.table.get(k));
    json!({
        "working_dir": s.workdir.display().to_string(),
        "created_at": rfc3339(s.created_wall),
        "last_used_at": rfc3339(s.last_used_wall),
        "age_seconds": core.now.saturating_duration_since(s.created).as_secs(),
        "status": if active { "active" } else { "idle" },
        "current_command": s.current().map(|r| r.command.clone()),
        "command_count": s.records.len(),
        "process_id": shell.map(|p| p.id.clone()),
        "output_bytes": shell.map_or(0, |p| p.streams[0].ring.end()),
        "pid": shell.map(|p| p.pid),
        "restarts": s.restarts,
        "size": { "rows": s.size.rows, "cols": s.size.cols },
        "failed": match &s.phase { Phase::Failed(why) => Value::from(why.clone()), _ => Value::Null },
        "sandbox": s.sandbox.as_ref().map_or_else(
            || crate::policy::sandbox::Given::off().to_json(),
            |g| g.to_json(),
        ),
    })
}

/// What `sessions/create` answers: `{session_id, working_dir}`, and the session's other
/// fields beside them.
fn created(core: &Core, key: &SessionKey) -> Result<Value, RpcError> {
    let s = session(core, key)?;
    let mut v = session_info(core, s);
    v["session_id"] = key.1.clone().into();
    Ok(v)
}

/// A `no_change_timeout` field: whole or fractional seconds, more than zero.
fn no_change(p: &Params) -> Result<Option<Duration>, RpcError> {
    match p.opt_seconds("no_change_timeout")? {
        Some(s) if s <= 0.0 => Err(RpcError::invalid_params(
            "no_change_timeout",
            "must be more than 0 seconds",
        )),
        s => Ok(s.map(seconds)),
    }
}

/// `shell/exec {command, id?, exec_dir?, async_mode?, timeout?, hard_timeout?,
/// no_change_timeout?, strict?, truncate?, preserve_symlinks?}`: the line goes to the gate
/// as a shell line; `line_admitted` takes it on.
pub fn exec(core: &mut Core, caller: &Caller, p: &Params) -> Result<Step, RpcError> {
    let command = p.str("command")?;
    if command.trim().is_empty() {
        return Err(RpcError::invalid_params("command", "empty"));
    }
    if command.len() > MAX_COMMAND {
        return Err(RpcError::invalid_params(
            "command",
            format!("at most {MAX_COMMAND} bytes, not {}", command.len()),
        ));
    }
    if command.contains('\0') {
        return Err(RpcError::invalid_params(
            "command",
            "holds NUL, which a shell cannot",
        ));
    }
    let exec_dir = p
        .opt_str("exec_dir")?
        .filter(|d| !d.is_empty())
        .map(|d| validate_dir("exec_dir", d))
        .transpose()?;
    let async_mode = p.opt_bool("async_mode")?.unwrap_or(false);
    let timeout = p.opt_seconds("timeout")?.map(seconds);
    let hard_timeout = p.opt_seconds("hard_timeout")?.map(seconds);
    let no_change_timeout = no_change(p)?;
    let strict = p.opt_bool("strict")?.unwrap_or(false);
    let truncate = p.opt_bool("truncate")?.unwrap_or(true);
    let keep_symlinks = p.opt_bool("preserve_symlinks")?;
    let sandbox_asked = crate::core::launch::requested_sandbox("sandbox", p.opt_value("sandbox"))?;
    // What a relaying front end says (execctl mcp): its door, and the most it lets the
    // line have.
    let via = crate::core::launch::requested_via(p.opt_str("via")?)?;
    let bound =
        crate::core::launch::requested_sandbox("sandbox_ceiling", p.opt_value("sandbox_ceiling"))?;
    let requested = p.opt_str("id")?.filter(|s| !s.is_empty());
    let (id, creates) = match requested {
        Some(id) => {
            let key = (caller.uid, id.to_string());
            match core.shells.map.get(&key) {
                Some(s) => {
                    refuse_if_busy(s)?;
                    (id.to_string(), false)
                }
                None => (id.to_string(), true),
            }
        }
        None => (core.shells.new_id(caller.uid), true),
    };
    let key = (caller.uid, id.clone());
    if !creates {
        core.name_shell(&key);
    }
    // What the gate and an approver see as its directory: where it will run.
    let session_dir = core
        .shells
        .map
        .get(&key)
        .map_or_else(|| core.cfg.workdir.clone(), |s| s.workdir.clone());
    let dir = exec_dir.clone().unwrap_or_else(|| session_dir.clone());
    // An existing session's `$CWD` is fixed (a `cd` never moves it): the bound's is that.
    let fixed = core
        .shells
        .map
        .get(&key)
        .and_then(|s| s.sandbox.as_ref()?.cwd_root.clone());
    let ceiling =
        bound.map(|b| core.declared_ceiling(&b, fixed.as_deref().unwrap_or(&dir), caller.uid));
    let exec = ShellExec {
        session_id: id.clone(),
        creates,
        unnamed: requested.is_none(),
        // A new session's shell starts in the session's directory; its first line enters
        // `exec_dir` for good (and a missing one is the line's to report, strict or not).
        dir: session_dir,
        async_mode,
        timeout,
        no_change_timeout,
        truncate,
        opts: LineOpts {
            exec_dir: exec_dir.map(|d| d.display().to_string()),
            enter: creates,
            strict,
            keep_symlinks,
            hard_timeout,
        },
    };
    let launch = Box::new(LaunchRequest {
        family: Family::Shell { session_id: id },
        peer: caller.peer(),
        program: Program::Shell {
            shell: core.cfg.shell.clone(),
            line: command.to_string(),
        },
        command: command.to_string(),
        args: Vec::new(),
        env: Vec::new(),
        cwd: dir,
        cwd_field: "exec_dir",
        stdio: Stdio3::Shell(WinSize::DEFAULT),
        ring_capacity: core.cfg.output_limit,
        prefix: "shcmd",
        subscribe: None,
        kill_on_disconnect: None,
        limits: core.cfg.limits,
        after: After::ShellLine(Box::new(exec)),
        admitted: None,
        origin: None,
        via,
        sandbox_asked,
        sandbox: None,
        ceiling,
    });
    // A session's sandbox is fixed when it is made: a later line may only repeat it.
    if let (false, Some(asked)) = (creates, &launch.sandbox_asked) {
        let session = core
            .shells
            .map
            .get(&key)
            .and_then(|s| s.sandbox.clone())
            .unwrap_or_else(crate::policy::sandbox::Given::off);
        core.same_as_session(caller.uid, &session, asked)?;
    }
    Ok(Step::Launch(launch))
}

/// `-32000` when the session has a command not done, or is failed.
fn refuse_if_busy(s: &ShellSession) -> Result<(), RpcError> {
    if let Phase::Failed(why) = &s.phase {
        return Err(RpcError::invalid_state(format!(
            "shell session {} failed: {why}; close it and open another",
            s.id
        )));
    }
    if let Some(r) = s.current() {
        return Err(RpcError::invalid_state(format!(
            "a command is running in shell session {} ({:?}); wait for it, write to it or kill it",
            s.id, r.command
        ))
        .with_data(json!({ "command": r.command })));
    }
    Ok(())
}

/// A line passed the gate: it is queued in its session (made now if the line creates
/// it), then answered or waited for; a session without a shell gets one started first.
pub fn line_admitted(core: &mut Core, launch: &LaunchRequest) -> Result<Step, RpcError> {
    let After::ShellLine(exec) = &launch.after else {
        return Err(RpcError::internal("shell line tail for another request"));
    };
    let key = (launch.peer.uid, exec.session_id.clone());
    // Nothing runs unrecorded: its `start` record must have room (PROTOCOL 7.4).
    core.room_for_line_record(&launch.command, &key.1)?;
    let mut fresh = false;
    match core.shells.map.get(&key) {
        Some(s) => refuse_if_busy(s)?,
        None if exec.creates => {
            core.open_shell(
                key.0,
                (&key.1, exec.unnamed),
                exec.dir.clone(),
                launch.peer,
                (
                    exec.no_change_timeout,
                    exec.opts.keep_symlinks.unwrap_or(false),
                ),
            )?;
            // The gate decided the session's sandbox with its first line. Its shell
            // starts in the session's directory, not the line's `exec_dir` that chose
            // `$CWD`, so there is nothing to check there.
            if let Some(s) = core.shells.map.get_mut(&key) {
                s.sandbox = launch
                    .sandbox
                    .clone()
                    .map(|g| crate::policy::sandbox::Given {
                        verify_cwd: false,
                        ..g
                    });
            }
            fresh = true;
        }
        // Closed while its line waited for an approver.
        None => return Err(core.session_gone(true, key.0, &key.1)),
    }
    let (id, decision, rule) = match &launch.admitted {
        Some(a) => (a.id.clone(), a.decision, a.rule.clone()),
        None => (String::new(), "allow", "default".to_string()),
    };
    let queued = core.shell_queue(
        &key,
        (id, launch.peer, (decision, rule), launch.via),
        &launch.command,
        exec.opts.clone(),
    );
    let seq = match queued {
        Ok(seq) => seq,
        Err(e) => {
            if fresh {
                core.forget_shell(&key);
            }
            return Err(e);
        }
    };
    let needs_shell = core
        .shells
        .map
        .get(&key)
        .is_some_and(|s| s.shell.is_none() && s.phase == Phase::Spawning && fresh);
    if needs_shell {
        let then = ShellThen::Exec(exec.clone(), seq);
        return match core.shell_launch(&key, then) {
            Some(l) => Ok(Step::Launch(Box::new(l))),
            None => Err(RpcError::internal("shell session vanished")),
        };
    }
    exec_step(core, &key, seq, exec)
}

/// Answers `exec` now (`async_mode`) or parks it until its command ends, is quiet for
/// its `no_change_timeout`, waits for input, or its soft `timeout` passes.
fn exec_step(
    core: &mut Core,
    key: &SessionKey,
    seq: u64,
    exec: &ShellExec,
) -> Result<Step, RpcError> {
    if exec.async_mode {
        return Ok(Step::Done(exec_result(core, key, seq, exec.truncate)?));
    }
    let quiet = exec
        .no_change_timeout
        .or_else(|| core.shells.map.get(key).map(|s| s.no_change_timeout))
        .unwrap_or(shell::DEFAULT_NO_CHANGE);
    core.shell_watch_quiet(key, seq, quiet);
    Ok(Step::Park {
        wait: Wait::Shell {
            session: key.clone(),
            seq,
            what: ShellWait::Exec {
                truncate: exec.truncate,
            },
        },
        deadline: exec.timeout.map(|t| core.now + t),
    })
}

/// The tail of a session's shell start: set it up, then answer what asked for it.
pub fn after_start(
    core: &mut Core,
    req: &LaunchRequest,
    started: Result<Key, RpcError>,
) -> Result<Step, RpcError> {
    let After::ShellStart(then) = &req.after else {
        return Err(RpcError::internal("shell start tail for another request"));
    };
    let key = (req.peer.uid, req.family.session_id().to_string());
    let key_started = match started {
        Ok(k) => k,
        Err(e) => return start_failed(core, req, &key, then, e),
    };
    if !core.shells.map.contains_key(&key) {
        // Closed while its shell was being started: end the shell.
        core.release(key_started, crate::core::table::KillReason::SessionClose);
        return Err(RpcError::not_found("shell session", &key.1));
    }
    core.shell_started(&key, key_started, req.origin.clone());
    match then {
        ShellThen::Create => {
            let notice = core
                .shells
                .map
                .get_mut(&key)
                .and_then(|s| s.reopened.take());
            let mut answer = created(core, &key)?;
            if let Some(n) = notice {
                answer["notice"] = n.into();
            }
            Ok(Step::Done(answer))
        }
        ShellThen::Exec(exec, seq) => exec_step(core, &key, *seq, exec),
        ShellThen::Restart { .. } => Ok(Step::Done(json!({}))),
    }
}

/// A session's shell could not be started.
fn start_failed(
    core: &mut Core,
    req: &LaunchRequest,
    key: &SessionKey,
    then: &ShellThen,
    e: RpcError,
) -> Result<Step, RpcError> {
    match then {
        // The last directory is gone (or is no directory now): the shell starts again in
        // `--workdir`.
        ShellThen::Restart { fallback: false }
            if e.code == crate::wire::rpc::INVALID_PARAMS && req.cwd != core.cfg.workdir =>
        {
            core.log.line(format_args!(
                "the shell of session {:?} cannot start in {}: {}; starting it in {}",
                key.1,
                req.cwd.display(),
                e.message,
                core.cfg.workdir.display()
            ));
            if let Some(s) = core.shells.map.get_mut(key) {
                s.workdir = core.cfg.workdir.clone();
            }
            match core.shell_launch(key, ShellThen::Restart { fallback: true }) {
                Some(l) => Ok(Step::Launch(Box::new(l))),
                None => Ok(Step::Done(json!({}))),
            }
        }
        ShellThen::Restart { .. } => {
            core.log.warn(format_args!(
                "the shell of session {:?} could not be started again: {}",
                key.1, e.message
            ));
            core.shell_spawn_failed(key, &e.message);
            Ok(Step::Done(json!({})))
        }
        // Nothing ran in a session made for this request: it is not kept.
        ShellThen::Create | ShellThen::Exec(..) => {
            core.forget_shell(key);
            Err(e)
        }
    }
}

/// `shell/view {id, follow?}`: what the session shows now: the running or last command's
/// output and status, the console, and (execd's) its directory and prompt. With `follow`
/// (execd's: what `Accept: text/event-stream` asks for, PROTOCOL 12.5) it is answered
/// once the running command has ended.
pub fn view(core: &mut Core, caller: &Caller, p: &Params) -> Result<Step, RpcError> {
    let key = existing(core, caller, p)?;
    let follow = p.opt_bool("follow")?.unwrap_or(false);
    if let Some(r) = session(core, &key)?.records.back().filter(|_| follow) {
        return Ok(Step::Park {
            wait: Wait::Shell {
                session: key,
                seq: r.seq,
                what: ShellWait::View,
            },
            deadline: None,
        });
    }
    Ok(Step::Done(view_of(core, &key)?))
}

/// The view of session `key` (see `view`).
fn view_of(core: &Core, key: &SessionKey) -> Result<Value, RpcError> {
    let s = session(core, key)?;
    let last = s.records.back();
    let mut v = Map::new();
    v.insert("session_id".into(), key.1.clone().into());
    v.insert(
        "output".into(),
        last.map_or_else(String::new, |r| output_of(core, r, true))
            .into(),
    );
    v.insert("console".into(), console(core, s, true));
    v.insert(
        "status".into(),
        last.map_or("completed", Record::status).into(),
    );
    v.insert("command".into(), last.map(|r| r.command.clone()).into());
    v.insert(
        "exit_code".into(),
        last.filter(|r| r.done()).and_then(|r| r.exit_code).into(),
    );
    v.insert("working_dir".into(), s.workdir.display().to_string().into());
    v.insert("prompt".into(), s.ps1.clone().into());
    v.insert(
        "waiting_for_input".into(),
        last.is_some_and(|r| !r.done() && r.waiting_for_input)
            .into(),
    );
    if let Some(n) = &s.notice {
        v.insert("notice".into(), n.clone().into());
    }
    v.insert("restarts".into(), s.restarts.into());
    Ok(Value::Object(v))
}

/// `shell/wait {id, seconds?, max_wait_seconds?}`: `{status}` once the running command
/// ends or `seconds` (capped by `max_wait_seconds`) pass.
pub fn wait(core: &mut Core, caller: &Caller, p: &Params) -> Result<Step, RpcError> {
    let key = existing(core, caller, p)?;
    let mut wait = p.opt_seconds("seconds")?.unwrap_or(DEFAULT_WAIT);
    if let Some(max) = p.opt_seconds("max_wait_seconds")? {
        wait = wait.min(max);
    }
    let s = session(core, &key)?;
    let Some(r) = s.current() else {
        return Ok(Step::Done(status_of(s.records.back())));
    };
    Ok(Step::Park {
        wait: Wait::Shell {
            session: key,
            seq: r.seq,
            what: ShellWait::End,
        },
        deadline: Some(core.now + seconds(wait)),
    })
}

/// `shell/write {id, input, press_enter?, encoding?}`: input for the running program,
/// through its terminal (`"\u0003"` is Ctrl-C); `press_enter` adds the Enter key (CR);
/// `encoding: "base64"` (execd's, as `bash/write` takes it) carries bytes that are not
/// text, such as a terminal's keys as `execctl shell` forwards them. With the shell at
/// its prompt: `-32000` (commands go through `exec` and the gate).
pub fn write(core: &mut Core, caller: &Caller, p: &Params) -> Result<Step, RpcError> {
    let mut data = super::bash::write_input(p)?;
    let enter = p.opt_bool("press_enter")?.unwrap_or(false);
    let key = existing(core, caller, p)?;
    if enter {
        data.push(b'\r');
    }
    let bound =
        crate::core::launch::requested_sandbox("sandbox_ceiling", p.opt_value("sandbox_ceiling"))?;
    let session = core.shells.map.get(&key).and_then(|s| s.sandbox.as_ref());
    core.may_feed(caller, session, bound.as_ref())?;
    let status = core.shell_write(&key, &data)?;
    Ok(Step::Done(
        json!({ "status": status, "written": data.len() }),
    ))
}

/// `shell/resize {id, rows, cols}` (execd's, as `bash/resize` is): the window size of
/// the session's terminal, 1..1000 each (`-32602` naming `rows` otherwise); kept for the
/// shell started next if this one dies.
pub fn resize(core: &mut Core, caller: &Caller, p: &Params) -> Result<Step, RpcError> {
    let size = resize_to(p)?;
    let key = existing(core, caller, p)?;
    core.shell_resize(&key, size)?;
    Ok(Step::Done(json!({})))
}

/// `shell/kill {id}`: SIGINT to the running command's foreground job, the section 3 kill
/// of the shell if it does not stop within `--kill-grace` (a new shell is then started);
/// answered `{status, exit_code, returncode}` once it has stopped.
pub fn kill(core: &mut Core, caller: &Caller, p: &Params) -> Result<Step, RpcError> {
    let key = existing(core, caller, p)?;
    let Some(seq) = core.shell_kill(&key, shell::Ending::Terminated) else {
        return Err(RpcError::invalid_state(format!(
            "no running command in shell session {}",
            key.1
        )));
    };
    // SIGINT, the grace, then the shell's own kill and its grace: answered by then
    // whatever happened.
    let bound = core.cfg.kill_grace * 2 + Duration::from_secs(1);
    Ok(Step::Park {
        wait: Wait::Shell {
            session: key,
            seq,
            what: ShellWait::Kill,
        },
        deadline: Some(core.now + bound),
    })
}

/// `shell/sessions/create {id?, exec_dir?, no_change_timeout?, preserve_symlinks?}`: a new
/// session with its shell started (answered once it runs), or the existing one.
pub fn create_session(core: &mut Core, caller: &Caller, p: &Params) -> Result<Step, RpcError> {
    let requested = p.opt_str("id")?.filter(|s| !s.is_empty());
    let sandbox_asked = crate::core::launch::requested_sandbox("sandbox", p.opt_value("sandbox"))?;
    if let Some(id) = requested {
        let key = (caller.uid, id.to_string());
        if let Some(s) = core.shells.map.get(&key) {
            // An existing session keeps its sandbox: asking for another is refused.
            if let Some(asked) = &sandbox_asked {
                let session = s
                    .sandbox
                    .clone()
                    .unwrap_or_else(crate::policy::sandbox::Given::off);
                core.same_as_session(caller.uid, &session, asked)?;
            }
            core.name_shell(&key);
            return Ok(Step::Done(created(core, &key)?));
        }
    }
    let dir: PathBuf = match p.opt_str("exec_dir")?.filter(|d| !d.is_empty()) {
        Some(d) => validate_dir("exec_dir", d)?,
        None => core.cfg.workdir.clone(),
    };
    let no_change_timeout = no_change(p)?;
    let keep = p.opt_bool("preserve_symlinks")?.unwrap_or(false);
    let id = match requested {
        Some(id) => id.to_string(),
        None => core.shells.new_id(caller.uid),
    };
    let key = core.open_shell(
        caller.uid,
        (&id, false),
        dir,
        caller.peer(),
        (no_change_timeout, keep),
    )?;
    match core.shell_launch(&key, ShellThen::Create) {
        Some(mut l) => {
            // The gate decides the session's sandbox with its first shell.
            l.sandbox_asked = sandbox_asked;
            Ok(Step::Launch(Box::new(l)))
        }
        None => Err(RpcError::internal("shell session vanished")),
    }
}

/// `shell/sessions/update {id, no_change_timeout}`: the session's default.
pub fn update_session(core: &mut Core, caller: &Caller, p: &Params) -> Result<Step, RpcError> {
    let key = existing(core, caller, p)?;
    let t = no_change(p)?;
    let s = core
        .shells
        .map
        .get_mut(&key)
        .ok_or_else(|| RpcError::not_found("shell session", &key.1))?;
    if let Some(t) = t {
        s.no_change_timeout = t;
    }
    Ok(Step::Done(json!({
        "session_id": key.1,
        "no_change_timeout": s.no_change_timeout.as_secs_f64(),
    })))
}

/// `shell/sessions`: `{sessions: {ID: info}}`, the caller's own.
pub fn sessions(core: &mut Core, caller: &Caller, _p: &Params) -> Result<Step, RpcError> {
    let mut list: Vec<&ShellSession> = core.shells.of(caller.uid).collect();
    list.sort_by(|a, b| a.created_wall.cmp(&b.created_wall).then(a.id.cmp(&b.id)));
    let map: Map<String, Value> = list
        .into_iter()
        .map(|s| (s.id.clone(), session_info(core, s)))
        .collect();
    Ok(Step::Done(json!({ "sessions": map })))
}

/// `shell/sessions/stats`: the caller's shell sessions counted, against `--max-sessions`
/// (which bash sessions share) and `--session-idle` in seconds.
pub fn stats(core: &mut Core, caller: &Caller, _p: &Params) -> Result<Step, RpcError> {
    let now = core.now;
    let mine: Vec<&ShellSession> = core.shells.of(caller.uid).collect();
    let total = mine.len();
    let active = mine
        .iter()
        .filter(|s| s.busy() || now.saturating_duration_since(s.last_used) < shell::ACTIVE_WITHIN)
        .count();
    let max = core.cfg.max_sessions;
    Ok(Step::Done(json!({
        "total_sessions": total,
        "active_sessions": active,
        "idle_sessions": total - active,
        "max_sessions": max,
        "session_timeout": core.cfg.session_idle.as_secs(),
        "usage_ratio": if max == 0 { 0.0 } else { total as f64 / max as f64 },
    })))
}

/// `shell/sessions/close {id}` (HTTP `DELETE /v1/shell/sessions/{id}`): ends its shell's
/// whole tree and frees it.
pub fn close_session(core: &mut Core, caller: &Caller, p: &Params) -> Result<Step, RpcError> {
    let id = p.str("id")?;
    let key = (caller.uid, id.to_string());
    if !core.shells.map.contains_key(&key) {
        return Err(core.session_gone(true, caller.uid, id));
    }
    core.close_shell(&key);
    Ok(Step::Done(json!({ "session_id": id })))
}

/// `shell/sessions/close_all {}` (HTTP `DELETE /v1/shell/sessions`): every one of the
/// caller's.
pub fn close_all(core: &mut Core, caller: &Caller, _p: &Params) -> Result<Step, RpcError> {
    let mut keys: Vec<SessionKey> = core
        .shells
        .of(caller.uid)
        .map(|s| (s.owner, s.id.clone()))
        .collect();
    keys.sort();
    for k in &keys {
        core.close_shell(k);
    }
    let closed: Vec<String> = keys.into_iter().map(|k| k.1).collect();
    Ok(Step::Done(json!({ "closed": closed })))
}
