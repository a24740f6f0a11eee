//! `events/subscribe` and `events/unsubscribe`: a connection follows a command's output
//! as Wire-style `event` notifications, which `core::pump` delivers.

use serde_json::json;

use crate::core::table::SubOpts;
use crate::core::{Caller, Core, Effect, Step};
use crate::wire::rpc::{Params, RpcError};

/// A subscription's options from `lossless` and `encoding` (`"text"` or `"base64"`) of
/// `p`: the params of `events/subscribe`, or the `subscribe` object of a create.
pub fn sub_opts(p: &Params) -> Result<SubOpts, RpcError> {
    let base64 = match p.opt_str("encoding")? {
        None | Some("text") => false,
        Some("base64") => true,
        Some(other) => {
            return Err(RpcError::invalid_params(
                "encoding",
                format!("{other:?} is neither \"text\" nor \"base64\""),
            ))
        }
    };
    Ok(SubOpts {
        lossless: p.opt_bool("lossless")?.unwrap_or(false),
        base64,
    })
}

/// `events/subscribe {id, offset?, stderr_offset?, lossless?, encoding?}`.
pub fn subscribe(core: &mut Core, caller: &Caller, p: &Params) -> Result<Step, RpcError> {
    let id = p.str("id")?;
    let next = [
        p.opt_u64("offset")?.unwrap_or(0),
        p.opt_u64("stderr_offset")?.unwrap_or(0),
    ];
    let opts = sub_opts(p)?;
    let key = core
        .table
        .find(id, caller.uid)
        .ok_or_else(|| RpcError::not_found("terminal or command", id))?;
    core.touch_session_of(key);
    core.table.subscribe(key, caller.conn, next, opts);
    // Delivery starts after the response is queued.
    core.out.push(Effect::Pump(key));
    Ok(Step::Done(json!({})))
}

/// `events/unsubscribe {id}`.
pub fn unsubscribe(core: &mut Core, caller: &Caller, p: &Params) -> Result<Step, RpcError> {
    let id = p.str("id")?;
    let key = core
        .table
        .find(id, caller.uid)
        .ok_or_else(|| RpcError::not_found("terminal or command", id))?;
    core.table.unsubscribe(key, caller.conn);
    // A lossless subscriber leaving may free its command's pipes.
    core.out.push(Effect::Pump(key));
    Ok(Step::Done(json!({})))
}
