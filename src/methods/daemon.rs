//! The daemon's own methods: `daemon/upgrade` (PROTOCOL 13), which only the daemon's own
//! uid and root may call, and never a peer that descends from the daemon (7.3); to
//! anyone else it does not exist (`-32002`).

use std::path::PathBuf;

use crate::core::{Caller, Core, Step};
use crate::wire::rpc::{Params, RpcError};

/// `daemon/upgrade {binary?}`: upgrade in place into `binary` (an absolute path), else
/// into the binary the daemon was started as. The loop runs the pre-flight and answers
/// with the error, or the new image answers `{from, to, upgrades, pause_ms}`.
pub fn upgrade(core: &mut Core, caller: &Caller, p: &Params) -> Result<Step, RpcError> {
    if caller.uid != core.daemon_uid && caller.uid != 0 {
        return Err(RpcError::not_found("method", "daemon/upgrade"));
    }
    if caller.tie.descends {
        return Err(core.subject_refused(caller, "daemon/upgrade"));
    }
    let binary = match p.opt_str("binary")? {
        None => None,
        Some(b) if b.is_empty() || !b.starts_with('/') => {
            return Err(RpcError::invalid_params(
                "binary",
                "an absolute path to the new execd",
            ))
        }
        Some(b) if b.contains('\0') => {
            return Err(RpcError::invalid_params("binary", "holds a NUL byte"))
        }
        Some(b) => Some(PathBuf::from(b)),
    };
    Ok(Step::Upgrade(binary))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::testkit::*;
    use crate::core::tie::{Tie, TieSource};
    use serde_json::Map;

    fn caller(uid: u32) -> Caller {
        Caller {
            conn: C1,
            uid,
            gid: uid,
            pid: 9,
            tie: Tie::outside(),
        }
    }

    /// A command of the daemon (or a relay it started, or a process it cannot tell from
    /// one) never upgrades it, root or not, and the refusal is audited.
    #[test]
    fn a_descendant_of_the_daemon_never_upgrades_it() {
        let mut c = core();
        c.cfg.audit = Some(crate::config::AuditTarget::File("/audit".into()));
        let mut c = Core::new(c.cfg, c.now, c.wall, crate::core::log::Log::new(false));
        c.daemon_uid = 1000;
        let none = Map::new();
        for tie in [
            Tie::descendant(Some(crate::core::table::Key(3)), TieSource::Cgroup),
            Tie::descendant(None, TieSource::Ancestry),
            Tie::unknown(),
        ] {
            for uid in [0, 1000] {
                let who = Caller { tie, ..caller(uid) };
                let e = upgrade(&mut c, &who, &Params(&none)).unwrap_err();
                assert_eq!(e.code, crate::wire::rpc::NOT_FOUND, "{tie:?}");
                assert_eq!(e.data.unwrap()["reason"], "descends from the daemon");
            }
        }
        let text = String::from_utf8(c.audit.as_ref().unwrap().pending().to_vec()).unwrap();
        let first: serde_json::Value = serde_json::from_str(text.lines().next().unwrap()).unwrap();
        assert_eq!(first["event"], "refuse");
        assert_eq!(first["method"], "daemon/upgrade");
        assert_eq!(first["tie"], "command 3 (cgroup)");
        assert_eq!(text.lines().count(), 6);
        let outsider = Caller {
            tie: Tie::remote(),
            ..caller(0)
        };
        assert!(upgrade(&mut c, &outsider, &Params(&none)).is_ok());
    }

    #[test]
    fn only_the_daemon_s_uid_and_root_may_upgrade_it_and_the_binary_is_checked() {
        let mut c = core();
        c.daemon_uid = 1000;
        let none = Map::new();
        let e = upgrade(&mut c, &caller(1001), &Params(&none)).unwrap_err();
        assert_eq!(e.code, crate::wire::rpc::NOT_FOUND);
        assert!(matches!(
            upgrade(&mut c, &caller(1000), &Params(&none)),
            Ok(Step::Upgrade(None))
        ));
        assert!(matches!(
            upgrade(&mut c, &caller(0), &Params(&none)),
            Ok(Step::Upgrade(None))
        ));
        let mut p = Map::new();
        p.insert("binary".into(), json!("/usr/local/bin/execd"));
        assert!(matches!(
            upgrade(&mut c, &caller(1000), &Params(&p)),
            Ok(Step::Upgrade(Some(b))) if b == std::path::Path::new("/usr/local/bin/execd")
        ));
        for bad in [json!("execd"), json!(""), json!(3)] {
            p.insert("binary".into(), bad.clone());
            let e = upgrade(&mut c, &caller(1000), &Params(&p)).unwrap_err();
            assert_eq!(e.code, crate::wire::rpc::INVALID_PARAMS, "{bad}");
        }
    }
}
