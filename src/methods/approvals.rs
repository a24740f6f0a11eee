//! The methods of the gate (PROTOCOL.md 7.3, 7.5): `approvals/subscribe` and
//! `approvals/unsubscribe` make a connection an approver, and `policy/check` shows what
//! the loaded policy decides for a command without running it. Answers to approval
//! requests are Wire responses, not methods: the loop routes them to the core by id.

use serde_json::{json, Value};

use crate::core::gate::{may_approve, Approver};
use crate::core::{Caller, Core, Step};
use crate::policy::{split_line, Subject};
use crate::types::Program;
use crate::wire::rpc::{Params, RpcError};

/// `approvals/subscribe {}`: this connection approves commands of its own uid (root's of
/// every uid), receiving each as a Wire `request`. Never a peer that descends from the
/// daemon, or relays for one (7.3): what the gate holds never operates it (`-32002`).
pub fn subscribe(core: &mut Core, caller: &Caller, _p: &Params) -> Result<Step, RpcError> {
    if caller.tie.descends {
        return Err(core.subject_refused(caller, "approvals/subscribe"));
    }
    let approver = Approver {
        uid: caller.uid,
        gids: core.groups_of(caller),
        pid: caller.pid,
    };
    let named = (
        core.cfg.approver_uids.as_slice(),
        core.cfg.approver_gids.as_slice(),
    );
    // With named approvers, anyone else subscribing would wait for requests that never
    // come: say so instead.
    if !named.0.is_empty() || !named.1.is_empty() {
        let allowed = may_approve(&approver, u32::MAX, named);
        if !allowed {
            return Err(RpcError::invalid_state(format!(
                "uid {} may not approve: approvers are named by --approver-uid/--approver-gid",
                caller.uid
            )));
        }
    }
    core.approvals.approvers.insert(caller.conn, approver);
    // Without a policy nothing ever asks: the approver is told rather than left waiting.
    Ok(Step::Done(json!({ "policy": core.cfg.policy.is_some() })))
}

/// `approvals/unsubscribe {}`.
pub fn unsubscribe(core: &mut Core, caller: &Caller, _p: &Params) -> Result<Step, RpcError> {
    core.approvals.remove(caller.conn);
    Ok(Step::Done(json!({})))
}

/// `policy/check {command, args?, uid?, gid?}`: the decision the daemon's policy gives a
/// command (a direct argv when `args` is given, else a shell line) and every rule that
/// matched. `uid` and `gid` (root callers only) judge it as another peer would be judged.
pub fn check(core: &mut Core, caller: &Caller, p: &Params) -> Result<Step, RpcError> {
    let command = p.str("command")?;
    // The variables the command would run with: some change what runs (PATH, BASH_ENV).
    let env: Vec<(String, String)> = match p.opt_object("env")? {
        None => Vec::new(),
        Some(m) => m
            .iter()
            .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_string()))
            .collect(),
    };
    let args = p.opt_str_array("args")?;
    let uid = match p.opt_u64("uid")? {
        None => caller.uid,
        Some(u) if caller.uid == 0 => {
            u32::try_from(u).map_err(|_| RpcError::invalid_params("uid", "not a uid"))?
        }
        Some(_) => {
            return Err(RpcError::invalid_params(
                "uid",
                "only root may judge as another uid",
            ))
        }
    };
    let program = match args {
        Some(a) => Program::Direct {
            program: command.to_string(),
            args: a.into_iter().map(String::from).collect(),
        },
        None => Program::Shell {
            shell: core.cfg.shell.clone(),
            line: command.to_string(),
        },
    };
    // The gate matches `gids` against the peer's group from its socket credentials; for
    // another uid, the caller may say which group (`gid`), else no group rule applies.
    let gids: Vec<u32> = match p.opt_u64("gid")? {
        Some(g) if caller.uid == 0 => {
            vec![u32::try_from(g).map_err(|_| RpcError::invalid_params("gid", "not a gid"))?]
        }
        Some(_) => {
            return Err(RpcError::invalid_params(
                "gid",
                "only root may judge as another group",
            ))
        }
        None if uid == caller.uid => vec![caller.gid],
        None => Vec::new(),
    };
    let v = core
        .policy
        .judge_program(&program, &env, &Subject { uid, gids: &gids });
    let hits: Vec<Value> = v
        .hits
        .iter()
        .map(|h| json!({ "rule": h.rule, "decision": h.decision.as_str(), "argv": h.argv }))
        .collect();
    let split = match &program {
        Program::Shell { line, .. } => json!(split_line(line).commands),
        Program::Direct { .. } => json!([program.argv()]),
    };
    Ok(Step::Done(json!({
        "decision": v.decision.as_str(),
        "rule": v.rule,
        "justification": v.justification,
        "unparsed": v.unparsed,
        "hits": hits,
        "commands": split,
        "policy_loaded": core.cfg.policy.is_some(),
    })))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::testkit::{core, C1};
    use crate::core::tie::{Tie, TieSource};
    use serde_json::Map;

    /// Whatever its uid, a peer that descends from the daemon never becomes an approver:
    /// the agent cannot answer its own asks through a process it ran through execd.
    #[test]
    fn a_descendant_of_the_daemon_never_approves() {
        let mut c = core();
        let none = Map::new();
        let agent = |tie| Caller {
            conn: C1,
            uid: 0,
            gid: 0,
            pid: 77,
            tie,
        };
        for tie in [
            Tie::descendant(Some(crate::core::table::Key(5)), TieSource::Ancestry),
            Tie::descendant(None, TieSource::Cgroup),
            Tie::unknown(),
        ] {
            let e = subscribe(&mut c, &agent(tie), &Params(&none)).unwrap_err();
            assert_eq!(e.code, crate::wire::rpc::NOT_FOUND, "{tie:?}");
            assert!(c.approvals.approvers.is_empty());
        }
        assert!(subscribe(&mut c, &agent(Tie::outside()), &Params(&none)).is_ok());
        assert_eq!(c.approvals.approvers.len(), 1);
    }
}
