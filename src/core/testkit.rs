//! What the core's unit tests share: a core on a fake clock, fake commands started in it,
//! and readers of the effects it leaves.

// The names every core test needs, so each test module imports this one room.
pub use std::time::Duration;

pub use serde_json::{json, Value};

pub use super::launch::LaunchRequest;
pub use super::log::Log;
pub use super::table::{ConnId, Family, Key, KillReason, Peer};
pub use super::vocab::After;
pub use super::{Core, Effect, Wait};
pub use crate::config::Config;
pub use crate::types::Stage;
pub use crate::types::{Ended, Program, Stdio3, Usage};
pub use crate::wire::rpc::{ReqNo, RpcError};

pub const C1: ConnId = ConnId(1);
pub const C2: ConnId = ConnId(2);

pub fn core() -> Core {
    let cfg = Config {
        kill_grace: Duration::from_secs(2),
        session_idle: Duration::from_secs(60),
        max_sessions: 6,
        ..Config::default()
    };
    let (now, wall) = crate::types::test_clock();
    Core::new(cfg, now, wall, Log::new(false))
}

pub fn request(family: Family, stdio: Stdio3) -> LaunchRequest {
    LaunchRequest {
        family,
        peer: Peer {
            uid: 1000,
            gid: 1000,
            pid: 42,
        },
        program: Program::Direct {
            program: "true".into(),
            args: vec![],
        },
        command: "true".into(),
        args: vec![],
        env: vec![],
        cwd: "/".into(),
        cwd_field: "cwd",
        stdio,
        ring_capacity: 64,
        prefix: "term",
        subscribe: None,
        kill_on_disconnect: None,
        limits: Default::default(),
        after: After::Terminal,
        admitted: None,
        origin: None,
        sandbox_asked: None,
        sandbox: None,
        ceiling: None,
        via: Default::default(),
    }
}

/// Starts a fake terminal (pid = key + 1000) and returns its key.
pub fn terminal(c: &mut Core) -> Key {
    let req = request(
        Family::Terminal {
            session_id: "s".into(),
        },
        Stdio3::Merged,
    );
    let (key, id) = c.table.next_ids("term");
    c.started(&req, key, id, key.0 as i32 + 1000, req.peer.uid);
    key
}

pub fn bash(c: &mut Core, session: &str) -> Key {
    let sk = c.open_session(1000, Some(session), None, true).unwrap();
    assert_eq!(sk.0, 1000);
    let req = request(
        Family::Bash {
            session_id: session.into(),
        },
        Stdio3::Separate,
    );
    let (key, id) = c.table.next_ids("cmd");
    c.started(&req, key, id, key.0 as i32 + 1000, req.peer.uid);
    key
}

/// The answers the core left, as the client gets them: a parked request's answer is
/// rendered by its family, as the loop does.
pub fn replies(c: &mut Core) -> Vec<(ConnId, ReqNo, Result<Value, RpcError>)> {
    let mut v = Vec::new();
    for e in std::mem::take(&mut c.out) {
        match e {
            Effect::Reply { conn, req, result } => v.push((conn, req, result)),
            Effect::Answer { conn, req, wait } => {
                v.push((conn, req, crate::methods::answer(c, &wait)))
            }
            _ => {}
        }
    }
    v
}

pub fn ends(c: &mut Core) -> Vec<(Key, Stage)> {
    std::mem::take(&mut c.out)
        .into_iter()
        .filter_map(|e| match e {
            Effect::End { key, stage, .. } => Some((key, stage)),
            _ => None,
        })
        .collect()
}

pub fn later(c: &mut Core, d: Duration) {
    let (now, wall) = (c.now + d, c.wall + d);
    c.tick(now, wall);
    c.fire_due();
}
