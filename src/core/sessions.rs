//! Bash sessions in the core: opened (and made room for at `--max-sessions`), used,
//! closed by request or after `--session-idle`, with their commands and their asks; and
//! the ids the daemon closed by itself, remembered so that a call naming one again is
//! told (PROTOCOL 8).
//!
//! Invariants:
//! - To make room, only the requesting owner's sessions are closed, never one running a
//!   command and never a shell session someone named: one-shot sessions first (made by a
//!   request that named none, and never named again), then the owner's quiet bash
//!   sessions, least recently used first within each.
//! - A one-shot session is idle after a sixth of `--session-idle`, unless an ended command
//!   of it left processes (PROTOCOL 14): those live while it does, for the full time.
//! - An id closed for idleness or to make room is remembered (the last `CLOSED_KEPT` of
//!   each owner) until a call makes a session of that name again.

use std::collections::{HashMap, VecDeque};
use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime};

use serde_json::json;

use super::table::{BashSession, Key, KillReason, Proc, SessionKey};
use super::vocab::Answer;
use super::{Core, Timer};
use crate::wire::encode::rfc3339;
use crate::wire::rpc::RpcError;
use crate::wire::state::{wall_ns, wall_of, ClosedImage, StateError};

/// Ids of sessions the daemon closed by itself that it remembers, per owner.
pub const CLOSED_KEPT: usize = 1024;

/// A one-shot session is idle after this part of `--session-idle`.
const ONESHOT_IDLE_PART: u32 = 6;

/// Why the daemon closed a session by itself.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ClosedBy {
    /// Unused for this long.
    Idle(Duration),
    /// To make room for another at `--max-sessions` (its value then).
    Room(usize),
}

impl ClosedBy {
    pub fn words(self) -> String {
        match self {
            ClosedBy::Idle(d) => format!("idle {} s", seconds(d)),
            ClosedBy::Room(max) => format!("to make room at max-sessions {max}"),
        }
    }
}

/// A session the daemon closed by itself.
#[derive(Debug, Clone, PartialEq)]
pub struct Closed {
    /// A shell session (else a bash session): the two kinds name theirs apart.
    pub shell: bool,
    pub id: String,
    pub at: SystemTime,
    pub by: ClosedBy,
}

impl Closed {
    /// What the call that makes it again answers in `notice`.
    pub fn reopened(&self) -> String {
        format!(
            "session {} was closed ({}); started again without its earlier state",
            self.id,
            self.by.words()
        )
    }

    /// What any other call on it is told in `data.notice` (with `-32002`).
    pub fn gone(&self) -> String {
        format!(
            "session {} was closed at {} ({})",
            self.id,
            rfc3339(self.at),
            self.by.words()
        )
    }
}

/// The last `CLOSED_KEPT` sessions each owner had closed by the daemon, oldest first.
#[derive(Debug, Default)]
pub struct ClosedSessions {
    pub by_owner: HashMap<u32, VecDeque<Closed>>,
}

impl ClosedSessions {
    pub fn remember(&mut self, owner: u32, closed: Closed) {
        let q = self.by_owner.entry(owner).or_default();
        q.retain(|c| !(c.shell == closed.shell && c.id == closed.id));
        if q.len() >= CLOSED_KEPT {
            q.pop_front();
        }
        q.push_back(closed);
    }

    pub fn find(&self, owner: u32, shell: bool, id: &str) -> Option<&Closed> {
        self.by_owner
            .get(&owner)?
            .iter()
            .rev()
            .find(|c| c.shell == shell && c.id == id)
    }

    /// Forgets `id` (a session of that name is made again), returning what was known.
    pub fn take(&mut self, owner: u32, shell: bool, id: &str) -> Option<Closed> {
        let q = self.by_owner.get_mut(&owner)?;
        let at = q.iter().position(|c| c.shell == shell && c.id == id)?;
        let closed = q.remove(at);
        if q.is_empty() {
            self.by_owner.remove(&owner);
        }
        closed
    }
}

impl ClosedSessions {
    /// What an upgrade in place carries: every remembered session, per owner oldest first.
    pub fn carry(&self) -> Vec<ClosedImage> {
        let mut owners: Vec<&u32> = self.by_owner.keys().collect();
        owners.sort();
        owners
            .into_iter()
            .flat_map(|owner| {
                self.by_owner[owner].iter().map(|c| ClosedImage {
                    owner: *owner,
                    shell: c.shell,
                    id: c.id.clone(),
                    at: wall_ns(c.at),
                    idle_ns: match c.by {
                        ClosedBy::Idle(d) => Some(d.as_nanos() as u64),
                        ClosedBy::Room(_) => None,
                    },
                    room: match c.by {
                        ClosedBy::Room(max) => Some(max),
                        ClosedBy::Idle(_) => None,
                    },
                })
            })
            .collect()
    }

    /// The sessions `carry` described.
    pub fn resume(img: &[ClosedImage]) -> Result<ClosedSessions, StateError> {
        let mut closed = ClosedSessions::default();
        for c in img {
            let by = match (c.idle_ns, c.room) {
                (Some(ns), None) => ClosedBy::Idle(Duration::from_nanos(ns)),
                (None, Some(max)) => ClosedBy::Room(max),
                _ => {
                    return Err(StateError::new(
                        "a closed session closed for two reasons or none",
                    ))
                }
            };
            let entry = Closed {
                shell: c.shell,
                id: c.id.clone(),
                at: wall_of(c.at),
                by,
            };
            closed.remember(c.owner, entry);
        }
        Ok(closed)
    }
}

impl Core {
    /// Finds the caller's session `id`, or creates it (under that name, or a new one when
    /// `id` is absent or empty) when `create`. Room is made at `--max-sessions` as
    /// `room_for_session` says. Naming a session counts as use (and makes a one-shot
    /// session a named one); `dir` becomes its default directory. A session made again
    /// under a name the daemon closed keeps the notice for its creator (`reopened`); an
    /// unknown name is `-32002`, saying when and why it was closed if it was.
    pub fn open_session(
        &mut self,
        owner: u32,
        id: Option<&str>,
        dir: Option<PathBuf>,
        create: bool,
    ) -> Result<SessionKey, RpcError> {
        let named = id.filter(|i| !i.is_empty());
        let name = match named {
            Some(i) => i.to_string(),
            None if create => self.table.new_session_id(owner),
            None => return Err(RpcError::invalid_params("session_id", "required")),
        };
        let key = (owner, name);
        match self.table.sessions.get_mut(&key) {
            Some(s) => s.oneshot &= named.is_none(),
            None if !create => return Err(self.session_gone(false, owner, &key.1)),
            None => {
                self.room_for_session(owner)?;
                let reopened = self.closed.take(owner, false, &key.1).map(|c| {
                    self.log.line(format_args!(
                        "session {:?} of uid {owner} made again ({})",
                        c.id,
                        c.by.words()
                    ));
                    c.reopened()
                });
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
                        oneshot: named.is_none(),
                        reopened,
                        left: Vec::new(),
                    },
                );
                let idle = self.bash_idle(&key);
                self.arm_idle(&key, self.now + idle);
            }
        }
        self.table.touch_session(&key, self.now, self.wall);
        if let (Some(dir), Some(s)) = (dir, self.table.sessions.get_mut(&key)) {
            s.workdir = dir;
        }
        Ok(key)
    }

    /// `-32002` for session `id` of `owner` (a shell session's when `shell`), with
    /// `data.notice` saying when and why the daemon closed it, if it did.
    pub fn session_gone(&self, shell: bool, owner: u32, id: &str) -> RpcError {
        let kind = if shell { "shell session" } else { "session" };
        let e = RpcError::not_found(kind, id);
        match self.closed.find(owner, shell, id) {
            Some(c) => e.with_data(json!({ "notice": c.gone() })),
            None => e,
        }
    }

    /// Makes room for one more session of `owner`, bash or shell (they share the count,
    /// PROTOCOL 12.2): at `--max-sessions` (or at a shared owner's fair share: half of it
    /// for its own, seven eighths for all shared owners) one of the owner's sessions is
    /// closed: a one-shot session running nothing, else its least recently used bash
    /// session running nothing; never a session of another owner, one running a command,
    /// or a shell session someone named. When there is none: `-32003`.
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
        let Some((victim, is_shell)) = self.room_victim(owner) else {
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
        self.closed_by_daemon(&victim, is_shell, ClosedBy::Room(max));
        Ok(())
    }

    /// The session of `owner` to close to make room, and whether it is a shell session:
    /// one-shot ones before named ones, then the least recently used.
    fn room_victim(&self, owner: u32) -> Option<(SessionKey, bool)> {
        let bash = self
            .table
            .sessions
            .iter()
            .filter(|(k, _)| k.0 == owner && !self.table.session_busy(k))
            .map(|(k, s)| ((!s.oneshot, s.last_used, k.1.clone()), false));
        let shell = self
            .shells
            .of(owner)
            .filter(|s| s.oneshot && !s.busy())
            .map(|s| ((false, s.last_used, s.id.clone()), true));
        bash.chain(shell)
            .min_by(|a, b| a.0.cmp(&b.0).then(a.1.cmp(&b.1)))
            .map(|((_, _, id), shell)| ((owner, id), shell))
    }

    /// Remembers that the daemon closed session `key` by itself, for whoever names it
    /// next.
    pub(super) fn closed_by_daemon(&mut self, key: &SessionKey, shell: bool, by: ClosedBy) {
        let closed = Closed {
            shell,
            id: key.1.clone(),
            at: self.wall,
            by,
        };
        self.closed.remember(key.0, closed);
    }

    /// How long bash session `key` may go unused: `--session-idle`, or a sixth of it for
    /// a one-shot session none of whose ended commands left processes.
    pub(super) fn bash_idle(&self, key: &SessionKey) -> Duration {
        let full = self.cfg.session_idle;
        let Some(s) = self.table.sessions.get(key) else {
            return full;
        };
        let left = s
            .commands
            .iter()
            .filter_map(|k| self.table.get(*k))
            .any(left_processes);
        if s.oneshot && !left {
            oneshot_idle(full)
        } else {
            full
        }
    }

    /// Counts a request on a bash command as use of its session.
    pub fn touch_session_of(&mut self, key: Key) {
        if let Some(sk) = self.table.get(key).and_then(Proc::session_key) {
            self.table.touch_session(&sk, self.now, self.wall);
        }
    }

    /// Ends what a closing session (bash or shell, `session_ref`, of uid `owner`) holds:
    /// its running commands are released (killed with their trees), finished ones
    /// dropped with whatever they left, and its commands still waiting for an approver withdrawn, since they
    /// would start in a session that no longer exists.
    pub(super) fn end_members(&mut self, owner: u32, keys: Vec<Key>, session_ref: &str) {
        for k in keys {
            if self.table.get(k).is_some_and(Proc::running) {
                self.release(k, KillReason::SessionClose);
            } else {
                // What it left lived while the session did (PROTOCOL 14).
                self.end_tree(k);
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
        let left = s.left.clone();
        let session_ref = format!("bash:{}", key.1);
        self.end_members(key.0, keys, &session_ref);
        for (k, id) in left {
            self.end_tree_of(k, id);
        }
        self.forget_session(key);
        self.approvals.end_session(key.0, &session_ref);
        self.log.debug(format_args!("session {:?} closed", key.1));
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
        let idle = self.bash_idle(key);
        if self.table.session_idle(key, self.now, idle) {
            self.log.line(format_args!(
                "session {:?} idle for {} s",
                key.1,
                seconds(idle)
            ));
            self.close_session(key);
            self.closed_by_daemon(key, false, ClosedBy::Idle(idle));
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

/// Whole seconds as such (`3600`), a shorter time to a tenth (`0.5`).
pub fn seconds(d: Duration) -> String {
    if d.subsec_millis() == 0 || d >= Duration::from_secs(100) {
        d.as_secs().to_string()
    } else {
        format!("{:.1}", d.as_secs_f64())
    }
}

/// Whether an ended command left processes behind: its tree still had members when its
/// leader exited, or something still holds its output open.
pub(super) fn left_processes(p: &Proc) -> bool {
    p.exit.is_some() && (p.lingers || p.streams.iter().any(|s| s.open))
}

/// A one-shot session's idle time.
pub fn oneshot_idle(full: Duration) -> Duration {
    full / ONESHOT_IDLE_PART
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

    /// A one-shot bash session (made by a request naming none) with one command started
    /// in it.
    fn oneshot(c: &mut Core) -> ((u32, String), Key) {
        let sk = c.open_session(1000, None, None, true).unwrap();
        let req = request(
            Family::Bash {
                session_id: sk.1.clone(),
            },
            Stdio3::Separate,
        );
        let (key, id) = c.table.next_ids("cmd");
        c.started(&req, key, id, key.0 as i32 + 1000, req.peer.uid);
        (sk, key)
    }

    /// The command ended and its pipes reached EOF: it left nothing behind.
    fn ended_clean(c: &mut Core, k: Key) {
        c.exited(k, Ended::Code(0), Usage::default(), None);
        c.eof(k, 0);
        c.eof(k, 1);
    }

    fn shell(c: &mut Core, id: &str, oneshot: bool) -> (u32, String) {
        let peer = Peer {
            uid: 1000,
            gid: 1000,
            pid: 42,
        };
        c.open_shell(1000, (id, oneshot), "/".into(), peer, (None, false))
            .unwrap()
    }

    #[test]
    fn one_shot_sessions_go_first_then_quiet_bash_ones_never_a_named_shell() {
        let mut c = core();
        c.cfg.max_sessions = 4;
        c.daemon_uid = 1000; // held to the cap itself, not to half of it
        let named = shell(&mut c, "named-shell", false);
        c.open_session(1000, Some("old-bash"), None, true).unwrap();
        later(&mut c, Duration::from_secs(1));
        let (first, k1) = oneshot(&mut c);
        ended_clean(&mut c, k1);
        let (busy, _) = oneshot(&mut c);
        later(&mut c, Duration::from_secs(1));
        // At the cap: the quiet one-shot session goes, though the named bash session is
        // older; the busy one-shot stays.
        c.open_session(1000, Some("new"), None, true).unwrap();
        assert!(!c.table.sessions.contains_key(&first));
        assert!(c.table.sessions.contains_key(&busy));
        // Then the least recently used quiet bash session, never the named shell.
        later(&mut c, Duration::from_secs(1));
        c.open_session(1000, Some("newer"), None, true).unwrap();
        assert!(!c.table.sessions.contains_key(&(1000, "old-bash".into())));
        assert!(c.shells.map.contains_key(&named));
        // A one-shot shell session may go; a one-shot one named again may not.
        let named_again = shell(&mut c, "shell_a", true);
        c.close_session(&(1000, "newer".into()));
        c.name_shell(&named_again);
        bash(&mut c, "new");
        let e = c.open_session(1000, Some("w"), None, true).unwrap_err();
        assert_eq!(e.code, crate::wire::rpc::LIMIT_REACHED);
        assert!(c.shells.map.contains_key(&named_again));
        assert!(c.shells.map.contains_key(&named));
        assert!(c.table.sessions.contains_key(&busy));
        // Another owner at the cap closes none of uid 1000's.
        let e = c.open_session(0, Some("root"), None, true).unwrap_err();
        assert_eq!(e.code, crate::wire::rpc::LIMIT_REACHED);
        let peer = c.shells.map[&named].peer;
        let e = c
            .open_shell(1000, ("more", false), "/".into(), peer, (None, false))
            .unwrap_err();
        assert_eq!(e.code, crate::wire::rpc::LIMIT_REACHED);
    }

    #[test]
    fn a_one_shot_session_is_idle_after_a_sixth_unless_it_left_processes_or_was_named() {
        let mut c = core(); // --session-idle 60 s
        c.cfg.max_sessions = 16;
        let (clean, k1) = oneshot(&mut c);
        ended_clean(&mut c, k1);
        let (left, k2) = oneshot(&mut c);
        // Its command ended, but something still holds its output open.
        c.exited(k2, Ended::Code(0), Usage::default(), None);
        let (lingering, k3) = oneshot(&mut c);
        c.lingers(k3);
        ended_clean(&mut c, k3);
        let (named, k4) = oneshot(&mut c);
        ended_clean(&mut c, k4);
        c.open_session(1000, Some(&named.1), None, false).unwrap();
        let s = shell(&mut c, "shell_x", true);
        later(&mut c, Duration::from_secs(9));
        assert!(c.table.sessions.contains_key(&clean));
        later(&mut c, Duration::from_secs(2));
        assert!(
            !c.table.sessions.contains_key(&clean),
            "10 s: a sixth of 60"
        );
        assert!(!c.shells.map.contains_key(&s), "the one-shot shell too");
        for k in [&left, &lingering, &named] {
            assert!(
                c.table.sessions.contains_key(k),
                "{k:?} keeps the full time"
            );
        }
        later(&mut c, Duration::from_secs(50));
        for k in [&left, &lingering, &named] {
            assert!(!c.table.sessions.contains_key(k), "{k:?} idle after 60 s");
        }
    }

    #[test]
    fn a_session_the_daemon_closed_says_so_when_named_again() {
        let mut c = core();
        c.open_session(1000, Some("work"), None, true).unwrap();
        shell(&mut c, "sh", false);
        later(&mut c, Duration::from_secs(61));
        // Any other call: -32002, saying when and why.
        let e = c.open_session(1000, Some("work"), None, false).unwrap_err();
        assert_eq!(e.code, crate::wire::rpc::NOT_FOUND);
        let notice = e.data.as_ref().unwrap()["notice"].as_str().unwrap();
        assert!(
            notice.starts_with("session work was closed at "),
            "{notice}"
        );
        assert!(notice.ends_with("(idle 60 s)"), "{notice}");
        let e = c.session_gone(true, 1000, "sh");
        assert!(e.data.unwrap()["notice"]
            .as_str()
            .unwrap()
            .ends_with("(idle 60 s)"));
        // Another owner's name, or a name never used: no notice.
        assert!(c.session_gone(false, 0, "work").data.is_none());
        assert!(c.session_gone(false, 1000, "sh").data.is_none());
        // Made again: its creator is told once, and the name is forgotten.
        let k = c.open_session(1000, Some("work"), None, true).unwrap();
        let notice = c.table.sessions.get_mut(&k).unwrap().reopened.take();
        assert_eq!(
            notice.as_deref(),
            Some("session work was closed (idle 60 s); started again without its earlier state")
        );
        assert!(c.closed.find(1000, false, "work").is_none());
        // Closed to make room, the reason says so.
        c.cfg.max_sessions = 2;
        later(&mut c, Duration::from_secs(1));
        c.open_session(1000, Some("b"), None, true).unwrap();
        c.open_session(1000, Some("c"), None, true).unwrap();
        let e = c.open_session(1000, Some("work"), None, false).unwrap_err();
        let notice = e.data.unwrap()["notice"].as_str().unwrap().to_string();
        assert!(
            notice.ends_with("(to make room at max-sessions 2)"),
            "{notice}"
        );
        // Closed by request: not the daemon's doing, nothing remembered.
        c.close_session(&(1000, "c".into()));
        assert!(c.session_gone(false, 1000, "c").data.is_none());
    }

    #[test]
    fn the_last_1024_closed_ids_of_each_owner_are_remembered() {
        let mut closed = ClosedSessions::default();
        let (_, wall) = crate::types::test_clock();
        for i in 0..CLOSED_KEPT + 5 {
            let c = Closed {
                shell: false,
                id: format!("s{i}"),
                at: wall,
                by: ClosedBy::Room(4),
            };
            closed.remember(7, c);
        }
        assert!(closed.find(7, false, "s4").is_none());
        assert!(closed.find(7, false, "s5").is_some());
        assert!(
            closed.find(7, true, "s5").is_none(),
            "a shell of that name: no"
        );
        assert_eq!(closed.by_owner[&7].len(), CLOSED_KEPT);
        let img = closed.carry();
        let back = ClosedSessions::resume(&img).unwrap();
        assert_eq!(back.by_owner[&7], closed.by_owner[&7]);
    }

    #[test]
    fn what_a_command_pushed_out_of_the_history_left_ends_with_its_session() {
        let mut c = core();
        let first = bash(&mut c, "s");
        c.lingers(first);
        c.exited(first, Ended::Code(0), Usage::default(), None);
        for _ in 0..crate::config::BASH_HISTORY {
            let k = bash(&mut c, "s");
            ended_clean(&mut c, k);
        }
        assert!(
            c.table.get(first).is_none_or(|p| p.released),
            "out of the history"
        );
        assert!(ends(&mut c).is_empty(), "what it left lives on meanwhile");
        c.close_session(&(1000, "s".to_string()));
        let ended = ends(&mut c);
        assert!(ended.contains(&(first, Stage::Term)), "{ended:?}");
        later(&mut c, Duration::from_secs(2));
        assert!(ends(&mut c).contains(&(first, Stage::Kill)));
    }

    #[test]
    fn closing_a_session_releases_running_commands_and_drops_finished_ones() {
        let mut c = core();
        let done = bash(&mut c, "s");
        let running = bash(&mut c, "s");
        c.exited(done, Ended::Code(0), Usage::default(), None);
        std::mem::take(&mut c.out);
        c.close_session(&(1000, "s".to_string()));
        // The finished command's leftovers end too (PROTOCOL 14).
        assert_eq!(
            ends(&mut c),
            vec![(done, Stage::Term), (running, Stage::Term)]
        );
        later(&mut c, Duration::from_secs(2));
        let mut killed = ends(&mut c);
        killed.sort_by_key(|(k, _)| *k);
        assert_eq!(killed, vec![(done, Stage::Kill), (running, Stage::Kill)]);
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
