//! Commands waiting for input (PROTOCOL 12.3): which commands are worth looking at, and
//! what follows when one starts or stops waiting. The looking is the loop's
//! (`sys::waiting`, reading `/proc`); the core only says whom to look at and records what
//! was found.
//!
//! Invariants:
//! - Only running commands with their stdin open and no output for `QUIET` are looked at:
//!   a command producing output costs nothing, and so does a session's shell at its
//!   prompt.
//! - `waiting_for_input` clears as soon as input is written or output arrives, and at the
//!   next look once the reader stops reading.
//! - A change is told to the command's subscribers (`Input` event) and wakes its parked
//!   requests: a synchronous `bash/exec` answers at once with the command running.

use std::time::Duration;

use serde_json::json;

use super::table::Key;
use super::{Core, Effect};

/// How long a command must have been quiet before it is looked at.
pub const QUIET: Duration = Duration::from_millis(250);

/// How often the loop looks, while any running command has its stdin open: quiet plus
/// this is within the second PROTOCOL 12.3 allows.
pub const EVERY: Duration = Duration::from_millis(700);

impl Core {
    /// Running commands with their stdin open (a session's shell only while a line of it
    /// runs), quiet for `QUIET` (or already waiting): their keys and leaders' pids, for
    /// the loop to look at.
    pub fn input_candidates(&self) -> Vec<(Key, i32)> {
        self.table
            .procs
            .values()
            .filter(|p| self.worth_looking_at(p))
            .filter(|p| {
                p.waiting_for_input || self.now.saturating_duration_since(p.quiet_since) >= QUIET
            })
            .map(|p| (p.key, p.pid))
            .collect()
    }

    /// Whether the loop should keep looking every `EVERY`: something is worth looking at
    /// (`worth_looking_at`). Set when a command with its stdin starts, when a shell's
    /// line starts and when a mark is set; the loop recomputes it at each look (one pass
    /// a look, never one per event).
    pub fn input_watch(&mut self) -> bool {
        if self.input_watch {
            self.input_watch = self.table.procs.values().any(|p| self.worth_looking_at(p));
        }
        self.input_watch
    }

    /// A running command with its stdin open; a session's shell only while a line of it
    /// runs (at its prompt the shell reads its command channel, never its terminal, so a
    /// look would find nothing, and an idle session would wake the loop and the reader
    /// every `EVERY` for ever), or while it is still marked waiting (the look clears it).
    fn worth_looking_at(&self, p: &super::table::Proc) -> bool {
        let open = p.running() && p.stdin.as_ref().is_some_and(|s| s.open);
        open && (p.waiting_for_input
            || super::shell::session_of(p)
                .is_none_or(|sk| self.shells.map.get(&sk).is_some_and(|s| s.busy())))
    }

    /// What the loop found for `key`: whether a process of its tree is blocked reading its
    /// input.
    pub fn input_seen(&mut self, key: Key, waiting: bool) {
        self.set_waiting(key, waiting);
    }

    /// Records whether `key` waits for input; on a change, tells its subscribers and
    /// wakes its parked requests.
    pub(super) fn set_waiting(&mut self, key: Key, waiting: bool) {
        let Some(p) = self.table.get_mut(key) else {
            return;
        };
        if p.waiting_for_input == waiting {
            return;
        }
        p.waiting_for_input = waiting;
        // A mark is cleared by a later look: one that came late, for a shell already
        // back at its prompt, must find the looks still going.
        self.input_watch |= waiting;
        if p.family.is_shell() {
            // A shell session's command waits for input: its synchronous `exec` answers.
            self.input_wanted(key, waiting);
        }
        let Some(p) = self.table.get(key) else {
            return;
        };
        let payload = json!({ "id": p.id, "waiting": waiting });
        let conns: Vec<_> = p.subs.iter().filter(|s| !s.done).map(|s| s.conn).collect();
        for conn in conns {
            let mut line = Vec::new();
            crate::wire::rpc::write_event(&mut line, "Input", &payload);
            self.out.push(Effect::Send { conn, line });
        }
        self.wake(key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::testkit::*;
    use crate::core::vocab::Wait;
    use crate::wire::rpc::ReqNo;

    #[test]
    fn only_quiet_commands_with_stdin_open_are_looked_at() {
        let mut c = core();
        let k = bash(&mut c, "s");
        assert!(c.input_watch());
        assert!(c.input_candidates().is_empty(), "not quiet yet");
        later(&mut c, QUIET);
        assert_eq!(c.input_candidates(), vec![(k, c.table.get(k).unwrap().pid)]);
        // Output makes it busy again.
        c.output(k, 0, b"x");
        assert!(c.input_candidates().is_empty());
        // A terminal without stdin is never looked at.
        let t = terminal(&mut c);
        later(&mut c, QUIET);
        assert!(c.input_candidates().iter().all(|(key, _)| *key != t));
    }

    #[test]
    fn a_synchronous_exec_answers_once_its_command_waits_and_writes_clear_it() {
        let mut c = core();
        let k = bash(&mut c, "s");
        c.park(
            C1,
            ReqNo(1),
            Wait::BashExec {
                key: k,
                max_len: 1000,
            },
            None,
        );
        assert!(replies(&mut c).is_empty());
        c.input_seen(k, true);
        let r = replies(&mut c);
        assert_eq!(r.len(), 1);
        let v = r[0].2.as_ref().unwrap();
        assert_eq!(v["status"], "running");
        assert_eq!(v["waiting_for_input"], true);
        // Input written clears it at once.
        c.write_stdin(k, b"y\n".to_vec(), false, false).unwrap();
        assert!(!c.table.get(k).unwrap().waiting_for_input);
    }
}
