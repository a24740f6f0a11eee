//! Parked requests: a request whose answer waits for a command (its exit, output past an
//! offset, room in its stdin buffer) or a deadline. Each is answered exactly once: when
//! its condition holds, its deadline passes, its command is forgotten, or the daemon
//! stops; a request whose connection closed is dropped unanswered. The core decides when;
//! the family renders what (`methods::answer`).

use std::time::Instant;

use super::table::{ConnId, Key, ParkId};
use super::timers::TimerId;
use super::vocab::{Answer, Wait};
use super::{Core, Effect, Timer};
use crate::wire::rpc::{ReqNo, RpcError};

use super::view;

#[derive(Debug)]
pub(super) struct Parked {
    pub(super) conn: ConnId,
    pub(super) req: ReqNo,
    pub(super) wait: Wait,
    pub(super) timer: Option<TimerId>,
}

impl Core {
    #[cfg(test)]
    /// Requests of `conn` parked now.
    pub fn parked_by(&self, conn: ConnId) -> usize {
        self.parked_of
            .get(&conn)
            .map_or(0, std::collections::BTreeSet::len)
    }

    /// Parks request `req` of `conn` until `wait` holds or `deadline` passes. It may hold
    /// already (an exited command, output already past the offset): then it is answered now.
    pub fn park(&mut self, conn: ConnId, req: ReqNo, wait: Wait, deadline: Option<Instant>) {
        let id = ParkId(self.next_park);
        self.next_park += 1;
        let key = wait.key();
        let session = match &wait {
            Wait::Shell { session, .. } => Some(session.clone()),
            _ => None,
        };
        let timer = deadline.map(|at| self.timers.add(at, Timer::Deadline(id)));
        self.parked_of.entry(conn).or_default().insert(id);
        self.parked.insert(
            id,
            Parked {
                conn,
                req,
                wait,
                timer,
            },
        );
        if let Some(session) = session {
            match self.shells.map.get_mut(&session) {
                Some(s) => {
                    s.waiters.push(id);
                    self.resolve(id, false);
                }
                None => self.resolve(id, true),
            }
            return;
        }
        match key.and_then(|k| self.table.get_mut(k)) {
            Some(p) => {
                p.waiters.push(id);
                self.resolve(id, false);
            }
            None => self.resolve(id, true),
        }
    }

    /// Answers parked request `id` if its condition holds (or `expired`); its family
    /// renders the answer (`Effect::Answer`). A command already forgotten answers
    /// `-32002`.
    pub(super) fn resolve(&mut self, id: ParkId, expired: bool) {
        let Some(p) = self.parked.get(&id) else {
            return;
        };
        if let Wait::StdinRoom { key, data, eof } = &p.wait {
            let result = match self.table.queue_stdin(*key, data, *eof) {
                Ok(None) => return, // still no room
                Ok(Some(_)) => {
                    self.out.push(Effect::FlushStdin(*key));
                    Ok(())
                }
                Err(e) => Err(e),
            };
            if let Some(p) = self.unpark(id) {
                self.out.push(match result {
                    Ok(()) => Effect::Answer {
                        conn: p.conn,
                        req: p.req,
                        wait: p.wait,
                    },
                    Err(e) => Effect::Reply {
                        conn: p.conn,
                        req: p.req,
                        result: Err(e),
                    },
                });
            }
            return;
        }
        if let Wait::Shell { session, seq, what } = &p.wait {
            let over = self
                .shells
                .map
                .get(session)
                .map(|s| expired || super::shell::wait_over(s, *seq, *what));
            if over == Some(false) {
                return;
            }
            let gone = RpcError::not_found("shell session", &session.1);
            if let Some(p) = self.unpark(id) {
                self.out.push(match over {
                    Some(_) => Effect::Answer {
                        conn: p.conn,
                        req: p.req,
                        wait: p.wait,
                    },
                    None => Effect::Reply {
                        conn: p.conn,
                        req: p.req,
                        result: Err(gone),
                    },
                });
            }
            return;
        }
        let Some(key) = p.wait.key() else { return };
        let done = self.table.get(key).map(|c| match &p.wait {
            Wait::Exit(_) | Wait::Killed(_) => c.exit.is_some(),
            Wait::BashOutput { from, .. } => {
                expired || c.exit.is_some() || view::has_output_past(c, *from)
            }
            // A synchronous exec whose command waits for input answers at once, running
            // (PROTOCOL 12.3): nobody would give it input while the request waits.
            Wait::BashExec { .. } => expired || c.exit.is_some() || c.waiting_for_input,
            Wait::BashKill(_) | Wait::Signalled(_) => expired || c.exit.is_some(),
            Wait::StdinRoom { .. } | Wait::Shell { .. } => false, // handled above
        });
        if done == Some(false) {
            return;
        }
        if let Some(p) = self.unpark(id) {
            self.out.push(match done {
                Some(_) => Effect::Answer {
                    conn: p.conn,
                    req: p.req,
                    wait: p.wait,
                },
                None => Effect::Reply {
                    conn: p.conn,
                    req: p.req,
                    result: Err(RpcError::not_found("process", "released")),
                },
            });
        }
    }

    /// `$/cancel_request`: ends request `req` of `conn` with `-32800` if it is parked, or
    /// withdraws it if it waits for an approver (nothing starts).
    pub fn cancel(&mut self, conn: ConnId, req: ReqNo) {
        let asked = self
            .approvals
            .pending
            .values()
            .find(|p| p.conn == conn && p.req == Some(req))
            .map(|p| p.id.clone());
        if let Some(id) = asked {
            if let Some(p) = self.approvals.pending.get_mut(&id) {
                p.req = None; // answered below with -32800, not with the reject
            }
            self.resolve_approval(&id, Answer::Reject, super::gate::WITHDRAWN, None);
            self.out.push(Effect::Reply {
                conn,
                req,
                result: Err(RpcError::cancelled()),
            });
            return;
        }
        let found = self
            .parked
            .iter()
            .find(|(_, p)| p.conn == conn && p.req == req)
            .map(|(id, _)| *id);
        if let Some(p) = found.and_then(|id| self.unpark(id)) {
            self.out.push(Effect::Reply {
                conn: p.conn,
                req: p.req,
                result: Err(RpcError::cancelled()),
            });
        }
    }

    /// Takes a parked request out of every index: its timer and its process's waiters.
    pub(super) fn unpark(&mut self, id: ParkId) -> Option<Parked> {
        let p = self.parked.remove(&id)?;
        if let Some(ids) = self.parked_of.get_mut(&p.conn) {
            ids.remove(&id);
            if ids.is_empty() {
                self.parked_of.remove(&p.conn);
            }
        }
        if let Some(t) = p.timer {
            self.timers.cancel(t);
        }
        match &p.wait {
            Wait::Shell { session, .. } => {
                if let Some(s) = self.shells.map.get_mut(session) {
                    s.waiters.retain(|w| *w != id);
                }
            }
            wait => {
                if let Some(proc_) = wait.key().and_then(|k| self.table.get_mut(k)) {
                    proc_.waiters.retain(|w| *w != id);
                }
            }
        }
        Some(p)
    }

    /// Re-checks every parked request on process `key`.
    pub fn wake(&mut self, key: Key) {
        let Some(p) = self.table.get(key) else { return };
        if p.waiters.is_empty() {
            return;
        }
        for id in p.waiters.clone() {
            self.resolve(id, false);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::testkit::*;

    #[test]
    fn a_wait_for_exit_parks_until_the_exit() {
        let mut c = core();
        let k = terminal(&mut c);
        c.park(C1, ReqNo(7), Wait::Exit(k), None);
        assert!(replies(&mut c).is_empty(), "still running");
        assert_eq!(c.parked_by(C1), 1);
        c.exited(k, Ended::Code(3), Usage::default(), None);
        let r = replies(&mut c);
        assert_eq!(r.len(), 1);
        assert_eq!(r[0].0, C1);
        assert_eq!(r[0].1, ReqNo(7));
        assert_eq!(
            r[0].2.as_ref().unwrap(),
            &json!({"exitCode": 3, "signal": null})
        );
        assert_eq!(c.parked_by(C1), 0);
        // Already exited: answered at once.
        c.park(C2, ReqNo(1), Wait::Exit(k), None);
        assert_eq!(replies(&mut c).len(), 1);
    }

    #[test]
    fn bash_output_wait_answers_on_output_past_the_offset_or_the_deadline() {
        let mut c = core();
        let k = bash(&mut c, "w");
        let deadline = c.now + Duration::from_secs(5);
        c.park(
            C1,
            ReqNo(1),
            Wait::BashOutput {
                key: k,
                from: [0, 0],
                screen: false,
            },
            Some(deadline),
        );
        assert!(replies(&mut c).is_empty(), "nothing yet");
        c.output(k, 0, b"abc");
        c.wake(k);
        let r = replies(&mut c);
        assert_eq!(r.len(), 1);
        assert_eq!(r[0].1, ReqNo(1));
        assert_eq!(r[0].2.as_ref().unwrap()["stdout"], "abc");
        c.park(
            C1,
            ReqNo(2),
            Wait::BashOutput {
                key: k,
                from: [3, 0],
                screen: false,
            },
            Some(deadline),
        );
        assert!(replies(&mut c).is_empty(), "nothing past offset 3");
        // The other answers at its deadline, with nothing new.
        later(&mut c, Duration::from_secs(4));
        assert!(replies(&mut c).is_empty());
        later(&mut c, Duration::from_secs(1));
        let r = replies(&mut c);
        assert_eq!(r.len(), 1);
        assert_eq!(r[0].2.as_ref().unwrap()["stdout"], "");
        assert_eq!(r[0].2.as_ref().unwrap()["offset"], 3);
    }

    #[test]
    fn a_disconnected_client_leaves_nothing_parked() {
        let mut c = core();
        let k = terminal(&mut c);
        c.park(C1, ReqNo(1), Wait::Exit(k), None);
        c.park(
            C2,
            ReqNo(1),
            Wait::Exit(k),
            Some(c.now + Duration::from_secs(1)),
        );
        c.disconnected(C2);
        assert_eq!(c.parked_by(C2), 0);
        assert_eq!(c.table.get(k).unwrap().waiters.len(), 1);
        later(&mut c, Duration::from_secs(2));
        c.exited(k, Ended::Code(0), Usage::default(), None);
        let r = replies(&mut c);
        assert_eq!(r.len(), 1);
        assert_eq!(r[0].0, C1);
    }
}
