//! Shutdown in the core: every running command killed, what exited commands left in
//! their trees ended, and everything parked answered from state where it can be, else
//! `-32007`.

use super::table::{Key, KillReason, ParkId, Proc};
use super::vocab::Answer;
use super::{Core, Effect};
use crate::wire::rpc::RpcError;

impl Core {
    /// Begins a stop: every running command is killed, and what exited commands left in
    /// their trees is ended too.
    pub fn begin_shutdown(&mut self) {
        if self.stopping {
            return;
        }
        self.stopping = true;
        self.log.line(format_args!(
            "shutting down: killing {} running command(s)",
            self.table.running()
        ));
        let mut keys: Vec<Key> = self.table.procs.keys().copied().collect();
        keys.sort_unstable();
        for key in keys {
            match self.table.get(key).map(Proc::running) {
                Some(true) => self.kill(key, KillReason::Shutdown),
                Some(false) => self.end_tree(key),
                None => {}
            }
        }
    }

    /// Answers everything still parked: from state where it can be, else `-32007`
    /// (a command still waiting for an approver never starts).
    pub fn answer_all_parked(&mut self) {
        let mut asked: Vec<String> = self.approvals.pending.keys().cloned().collect();
        asked.sort();
        for id in asked {
            let reply = self
                .approvals
                .pending
                .get_mut(&id)
                .and_then(|p| p.req.take().map(|r| (p.conn, r)));
            self.resolve_approval(&id, Answer::Reject, "shutting down", None);
            if let Some((conn, req)) = reply {
                self.out.push(Effect::Reply {
                    conn,
                    req,
                    result: Err(RpcError::shutting_down()),
                });
            }
        }
        let mut ids: Vec<ParkId> = self.parked.keys().copied().collect();
        ids.sort_unstable();
        for id in ids {
            self.resolve(id, true);
            if let Some(p) = self.unpark(id) {
                self.out.push(Effect::Reply {
                    conn: p.conn,
                    req: p.req,
                    result: Err(RpcError::shutting_down()),
                });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::core::testkit::*;

    #[test]
    fn shutdown_kills_everything_and_answers_the_parked() {
        let mut c = core();
        let a = terminal(&mut c);
        let b = terminal(&mut c);
        c.exited(b, Ended::Code(0), Usage::default(), None);
        c.park(C1, ReqNo(1), Wait::Exit(a), None);
        std::mem::take(&mut c.out);
        c.begin_shutdown();
        assert_eq!(ends(&mut c), vec![(a, Stage::Term), (b, Stage::Term)]);
        c.exited(a, Ended::Signal(libc::SIGTERM), Usage::default(), None);
        c.answer_all_parked();
        let r = replies(&mut c);
        assert_eq!(r.len(), 1);
        assert!(r[0].2.is_ok());
    }
}
