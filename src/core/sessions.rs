//! Bash sessions in the core: opened (and made room for at `--max-sessions`), used,
//! closed by request or after `--session-idle`, with their commands and their asks.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde_json::json;

use super::table::{BashSession, Key, KillReason, Proc, SessionKey};
use super::vocab::Answer;
use super::{Core, Timer};
use crate::wire::rpc::RpcError;

impl Core {
    /// Finds the caller's session `id`, or creates it (under that name, or a new one when
    /// `id` is absent or empty) when `create`. At `--max-sessions` (or, for a non-root
    /// owner, at half of it for its own) the owner's least recently used session running
    /// nothing is closed to make room; another owner's never is. When every session of the
    /// owner is busy the new one is refused. Counts as use; `dir` becomes its default
    /// directory.
    pub fn open_session(
        &mut self,
        owner: u32,
        id: Option<&str>,
        dir: Option<PathBuf>,
        create: bool,
    ) -> Result<SessionKey, RpcError> {
        let name = match id.filter(|i| !i.is_empty()) {
            Some(i) => i.to_string(),
            None if create => self.table.new_session_id(owner),
            None => return Err(RpcError::invalid_params("session_id", "required")),
        };
        let key = (owner, name);
        if !self.table.sessions.contains_key(&key) {
            if !create {
                return Err(RpcError::not_found("session", &key.1));
            }
            self.room_for_session(owner)?;
            let now_wall = self.wall;
            self.table.sessions.insert(
                key.clone(),
                BashSession {
                    id: key.1.clone(),
                    owner,
                    workdir: self.cfg.workdir.clone(),
                    created_wall: now_wall,
                    last_used: self.now,
                    last_used_wall: now_wall,
                    commands: Default::default(),
                    command_count: 0,
                },
            );
            self.arm_idle(&key, self.now + self.cfg.session_idle);
        }
        self.table.touch_session(&key, self.now, self.wall);
        if let (Some(dir), Some(s)) = (dir, self.table.sessions.get_mut(&key)) {
            s.workdir = dir;
        }
        Ok(key)
    }

    /// Makes room for one more session of `owner`, bash or shell (they share the count,
    /// PROTOCOL 12.2): at `--max-sessions` (or at a shared owner's fair share: half of it
    /// for its own, seven eighths for all shared owners) the owner's least recently used
    /// session running nothing is closed; another owner's never is. When every session
    /// of the owner is busy: `-32003`.
    pub fn room_for_session(&mut self, owner: u32) -> Result<(), RpcError> {
        let max = self.cfg.max_sessions;
        let total = self.table.sessions.len() + self.shells.map.len();
        let own = self.table.sessions.keys().filter(|k| k.0 == owner).count()
            + self.shells.of(owner).count();
        let shared = self
            .table
            .sessions
            .keys()
            .map(|k| k.0)
            .chain(self.shells.map.keys().map(|k| k.0))
            .filter(|&u| self.shares(u))
            .count();
        let fair = self.fair_share(owner, (own, shared), ("max-sessions", max));
        if total < max && fair.is_ok() {
            return Ok(());
        }
        // An owner with no session of its own has none to give up: said as the share
        // it is held to (all shared uids together at their seven eighths).
        if own == 0 {
            fair?;
        }
        // The least recently used quiet session of the owner, of either kind.
        let bash = self.table.lru_quiet_session(owner).and_then(|k| {
            let used = self.table.sessions.get(&k)?.last_used;
            Some((used, k, false))
        });
        let shell = self
            .shells
            .of(owner)
            .filter(|s| !s.busy())
            .min_by_key(|s| (s.last_used, s.id.clone()))
            .map(|s| (s.last_used, (s.owner, s.id.clone()), true));
        let victim = match (bash, shell) {
            (Some(b), Some(s)) => Some(if s.0 < b.0 { s } else { b }),
            (b, s) => b.or(s),
        };
        let Some((_, victim, is_shell)) = victim else {
            return Err(RpcError::limit("max-sessions", max));
        };
        self.log.line(format_args!(
            "{} session {:?} of uid {} closed to make room (max-sessions {max})",
            if is_shell { "shell" } else { "bash" },
            victim.1,
            victim.0
        ));
        if is_shell {
            self.close_shell(&victim);
        } else {
            self.close_session(&victim);
        }
        Ok(())
    }

    /// Counts a request on a bash command as use of its session.
    pub fn touch_session_of(&mut self, key: Key) {
        if let Some(sk) = self.table.get(key).and_then(Proc::session_key) {
            self.table.touch_session(&sk, self.now, self.wall);
        }
    }

    /// Ends what a closing session (bash or shell, `session_ref`, of uid `owner`) holds:
    /// its running commands are released (killed with their trees), finished ones
    /// dropped, and its commands still waiting for an approver withdrawn, since they
    /// would start in a session that no longer exists.
    pub(super) fn end_members(&mut self, owner: u32, keys: Vec<Key>, session_ref: &str) {
        for k in keys {
            if self.table.get(k).is_some_and(Proc::running) {
                self.release(k, KillReason::SessionClose);
            } else {
                self.drop_finished(k);
            }
        }
        let mut asked: Vec<String> = self
            .approvals
            .pending
            .values()
            .filter(|p| p.launch.peer.uid == owner && p.launch.session_ref() == session_ref)
            .map(|p| p.id.clone())
            .collect();
        asked.sort();
        for id in asked {
            self.resolve_approval(&id, Answer::Reject, "session closed", None);
        }
    }

    /// Frees a session: running commands are killed (and forgotten once reaped), finished
    /// ones dropped now.
    pub fn close_session(&mut self, key: &SessionKey) {
        let Some(s) = self.table.sessions.get(key) else {
            return;
        };
        let keys: Vec<Key> = s.commands.iter().copied().collect();
        let session_ref = format!("bash:{}", key.1);
        self.end_members(key.0, keys, &session_ref);
        self.forget_session(key);
        self.approvals.end_session(key.0, &session_ref);
        self.log.line(format_args!("session {:?} closed", key.1));
        self.record(
            "session_close",
            None,
            json!({ "session": key.1, "uid": key.0 }),
        );
    }

    /// Removes a session record and its idle timer (a session whose only command never
    /// started is not kept).
    pub fn forget_session(&mut self, key: &SessionKey) {
        self.table.sessions.remove(key);
        if let Some(t) = self.idle_timers.remove(key) {
            self.timers.cancel(t);
        }
    }

    /// (Re)arms a session's idle check at `at`.
    pub(super) fn arm_idle(&mut self, key: &SessionKey, at: Instant) {
        let t = self.timers.add(at, Timer::SessionIdle(key.clone()));
        if let Some(old) = self.idle_timers.insert(key.clone(), t) {
            self.timers.cancel(old);
        }
    }

    /// A session's idle timer fired: close it, or look again when it could next be idle.
    pub(super) fn check_idle(&mut self, key: &SessionKey) {
        let idle = self.cfg.session_idle;
        if self.table.session_idle(key, self.now, idle) {
            self.log.line(format_args!(
                "session {:?} idle for {} s",
                key.1,
                idle.as_secs()
            ));
            self.close_session(key);
            return;
        }
        let Some(s) = self.table.sessions.get(key) else {
            return;
        };
        let next = if self.table.session_busy(key) {
            self.now + idle
        } else {
            s.last_used + idle
        };
        self.arm_idle(key, next.max(self.now + Duration::from_millis(10)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::testkit::*;

    /// Sessions are held to fair shares too: two shared uids cannot take the last
    /// eighth, and an owner at its share gives up its own least used session.
    #[test]
    fn shared_uids_together_leave_root_a_session() {
        let mut c = core();
        c.cfg.max_sessions = 8;
        for i in 0..4 {
            c.open_session(1000, Some(&format!("a{i}")), None, true)
                .unwrap();
        }
        // At its half: its own oldest quiet session makes room.
        c.open_session(1000, Some("a4"), None, true).unwrap();
        assert!(!c.table.sessions.contains_key(&(1000, "a0".to_string())));
        for i in 0..3 {
            c.open_session(1001, Some(&format!("b{i}")), None, true)
                .unwrap();
        }
        let e = c.open_session(1002, Some("c"), None, true).unwrap_err();
        assert_eq!(e.data.unwrap()["limit"], "max-sessions-shared");
        c.open_session(0, Some("root"), None, true)
            .expect("root has room");
        assert_eq!(c.table.sessions.len(), 8);
    }

    #[test]
    fn idle_sessions_close_and_busy_ones_stay() {
        let mut c = core();
        let k = bash(&mut c, "busy");
        c.open_session(1000, Some("quiet"), None, true).unwrap();
        later(&mut c, Duration::from_secs(61));
        let quiet = (1000, "quiet".to_string());
        let busy = (1000, "busy".to_string());
        assert!(!c.table.sessions.contains_key(&quiet), "idle: closed");
        assert!(
            c.table.sessions.contains_key(&busy),
            "a running command keeps it"
        );
        c.exited(k, Ended::Code(0), Usage::default(), None);
        later(&mut c, Duration::from_secs(59));
        assert!(
            c.table.sessions.contains_key(&busy),
            "used by the exit just now"
        );
        later(&mut c, Duration::from_secs(62));
        assert!(!c.table.sessions.contains_key(&busy));
    }

    fn session_names(c: &Core) -> Vec<(u32, String)> {
        let mut v: Vec<(u32, String)> = c.table.sessions.keys().cloned().collect();
        v.sort();
        v
    }

    #[test]
    fn at_the_session_cap_the_owner_s_least_recently_used_quiet_session_makes_room() {
        let mut c = core();
        c.cfg.max_sessions = 4;
        c.open_session(0, Some("root-old"), None, true).unwrap();
        later(&mut c, Duration::from_secs(1));
        bash(&mut c, "a"); // uid 1000, busy
        c.open_session(1000, Some("b"), None, true).unwrap();
        later(&mut c, Duration::from_secs(1));
        // uid 1000 holds half the cap: its oldest quiet session makes room, not root's
        // older one.
        c.open_session(1000, Some("c"), None, true).unwrap();
        let names = session_names(&c);
        assert_eq!(
            names,
            [
                (0, "root-old".into()),
                (1000, "a".into()),
                (1000, "c".into())
            ]
        );
        // At the cap, root's own oldest quiet session goes.
        c.open_session(0, Some("root-new"), None, true).unwrap();
        c.open_session(0, Some("root-newer"), None, true).unwrap();
        let names = session_names(&c);
        assert_eq!(
            names,
            [
                (0, "root-new".into()),
                (0, "root-newer".into()),
                (1000, "a".into()),
                (1000, "c".into())
            ]
        );
        // Every session of the owner busy: refused, and nobody else's is touched.
        bash(&mut c, "c");
        let e = c.open_session(1000, Some("w"), None, true).unwrap_err();
        assert_eq!(e.code, crate::wire::rpc::LIMIT_REACHED);
        assert_eq!(session_names(&c).len(), 4);
    }

    #[test]
    fn closing_a_session_releases_running_commands_and_drops_finished_ones() {
        let mut c = core();
        let done = bash(&mut c, "s");
        let running = bash(&mut c, "s");
        c.exited(done, Ended::Code(0), Usage::default(), None);
        std::mem::take(&mut c.out);
        c.close_session(&(1000, "s".to_string()));
        assert_eq!(ends(&mut c), vec![(running, Stage::Term)]);
        c.sweep();
        assert!(c.table.get(done).is_none());
        assert!(c.table.get(running).is_some());
        c.exited(
            running,
            Ended::Signal(libc::SIGTERM),
            Usage::default(),
            None,
        );
        assert_eq!(c.table.get(running).unwrap().status(), "killed");
        c.sweep();
        assert!(c.table.get(running).is_none());
    }
}
