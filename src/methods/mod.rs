//! The tables a newcomer looks for: which function serves each method, and which tail a
//! started command's family runs. Every front end (JSON-RPC lines today) calls through
//! here, so a method behaves the same whoever asks.

pub mod acp;
pub mod approvals;
pub mod bash;
pub mod daemon;
pub mod events;
pub mod list;
pub mod shell;

use serde_json::{json, Map, Value};

use crate::core::launch::LaunchRequest;
use crate::core::table::Key;
use crate::core::vocab::After;
use crate::core::{Caller, Core, Step, Wait};
use crate::wire::rpc::{Params, RpcError};

/// A method: reads and changes the core, returns what to do with the request.
pub type Method = fn(&mut Core, &Caller, &Params) -> Result<Step, RpcError>;

/// The method called `name`. Every method is also found under its name with a leading
/// `_`, the form ACP SDKs give extension methods (`ext_method("bash/exec")` sends
/// `_bash/exec`).
pub fn method(name: &str) -> Option<Method> {
    let name = name.strip_prefix('_').unwrap_or(name);
    Some(match name {
        "initialize" => acp::initialize,
        "terminal/create" => acp::create,
        "terminal/output" => acp::output,
        "terminal/wait_for_exit" => acp::wait_for_exit,
        "terminal/kill" => acp::kill,
        "terminal/release" => acp::release,
        "terminal/list" => acp::list,
        "terminal/write" => acp::write,
        "terminal/resize" => acp::resize,
        "bash/exec" => bash::exec,
        "bash/output" => bash::output,
        "bash/write" => bash::write,
        "bash/kill" => bash::kill,
        "bash/resize" => bash::resize,
        "bash/sessions" => bash::sessions,
        "bash/commands" => bash::commands,
        "bash/sessions/create" => bash::create_session,
        "bash/sessions/close" => bash::close_session,
        "shell/exec" => shell::exec,
        "shell/view" => shell::view,
        "shell/wait" => shell::wait,
        "shell/write" => shell::write,
        "shell/kill" => shell::kill,
        "shell/resize" => shell::resize,
        "shell/sessions" => shell::sessions,
        "shell/sessions/create" => shell::create_session,
        "shell/sessions/update" => shell::update_session,
        "shell/sessions/stats" => shell::stats,
        "shell/sessions/close" => shell::close_session,
        "shell/sessions/close_all" => shell::close_all,
        "events/subscribe" => events::subscribe,
        "events/unsubscribe" => events::unsubscribe,
        "approvals/subscribe" => approvals::subscribe,
        "approvals/unsubscribe" => approvals::unsubscribe,
        "policy/check" => approvals::check,
        "daemon/upgrade" => daemon::upgrade,
        _ => return None,
    })
}

/// Runs method `name` for `caller`.
pub fn call(
    core: &mut Core,
    caller: &Caller,
    name: &str,
    params: &Map<String, Value>,
) -> Result<Step, RpcError> {
    if core.stopping {
        return Err(RpcError::shutting_down());
    }
    let f = method(name).ok_or_else(|| RpcError::method_not_found(name))?;
    f(core, caller, &Params(params))
}

/// The answer to a parked request whose wait is over, rendered by its family from the
/// command's state as it is now: the wait -> answer table.
pub fn answer(core: &Core, wait: &Wait) -> Result<Value, RpcError> {
    if let Wait::Shell { session, seq, what } = wait {
        return shell::answer(core, session, *seq, *what);
    }
    let p = wait
        .key()
        .and_then(|k| core.table.get(k))
        .ok_or_else(|| RpcError::not_found("process", "released"))?;
    Ok(match wait {
        Wait::Exit(_) => acp::exit_status(p),
        Wait::Killed(_) => json!({}),
        Wait::Signalled(_) => acp::signalled(p.exit.is_some()),
        Wait::BashExec { max_len, .. } => bash::exec_result(p, *max_len),
        Wait::BashOutput { from, screen, .. } => bash::output_result(p, *from, *screen),
        Wait::BashKill(_) => bash::command_info(p),
        Wait::StdinRoom { data, .. } => written(data.len()),
        Wait::Shell { .. } => return Err(RpcError::internal("shell wait rendered above")),
    })
}

/// What `bash/write` and `terminal/write` answer once their input is in the buffer.
fn written(n: usize) -> Value {
    json!({ "written": n })
}

/// Queues input for command `key` (`bash/write`, `terminal/write`): answered `{written}`
/// now, or, with `wait`, once it fits the stdin buffer.
pub fn write_stdin(
    core: &mut Core,
    caller: &Caller,
    bound: Option<crate::policy::sandbox::Partial>,
    key: Key,
    data: Vec<u8>,
    eof: bool,
    wait: bool,
) -> Result<Step, RpcError> {
    core.may_feed(
        caller,
        core.table.get(key).and_then(|p| p.sandbox.as_ref()),
        bound.as_ref(),
    )?;
    let n = data.len();
    Ok(match core.write_stdin(key, data, eof, wait)? {
        None => Step::Done(written(n)),
        Some(wait) => Step::Park {
            wait,
            deadline: None,
        },
    })
}

/// The family's tail once the loop tried to start `req`: what to answer, or to wait for.
pub fn after_launch(
    core: &mut Core,
    req: &LaunchRequest,
    started: Result<Key, RpcError>,
) -> Result<Step, RpcError> {
    match req.after {
        After::Terminal => acp::after_create(core, started?),
        After::BashExec { .. } => bash::after_exec(core, req, started),
        After::ShellStart(_) => shell::after_start(core, req, started),
        // A line is typed, never spawned (`shell::line_admitted`).
        After::ShellLine(_) => Err(RpcError::internal("a shell line was spawned")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_method_is_found_with_and_without_a_leading_underscore() {
        for name in [
            "initialize",
            "terminal/create",
            "bash/exec",
            "events/subscribe",
        ] {
            assert!(method(name).is_some(), "{name}");
            assert!(method(&format!("_{name}")).is_some(), "_{name}");
        }
        assert!(method("nope").is_none());
        assert!(method("__bash/exec").is_none(), "one underscore only");
    }

    #[test]
    fn unknown_methods_are_method_not_found_and_a_stopping_daemon_takes_nothing() {
        let mut core = crate::core::testkit::core();
        let caller = Caller {
            conn: crate::core::testkit::C1,
            uid: 1000,
            gid: 1000,
            pid: 42,
            tie: crate::core::tie::Tie::outside(),
        };
        for name in ["terminal/nope", "", "_"] {
            let e = call(&mut core, &caller, name, &Map::new()).unwrap_err();
            assert_eq!(e.code, crate::wire::rpc::METHOD_NOT_FOUND, "{name:?}");
        }
        assert!(call(&mut core, &caller, "terminal/list", &Map::new()).is_ok());
        core.stopping = true;
        let e = call(&mut core, &caller, "terminal/list", &Map::new()).unwrap_err();
        assert_eq!(e.code, crate::wire::rpc::SHUTTING_DOWN);
    }
}
