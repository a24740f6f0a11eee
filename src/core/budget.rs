//! The output memory budget (`--max-output-memory`, PROTOCOL 8): rings grow only with
//! what the budget grants; past it, retained output of exited commands is given back
//! first (oldest first, from the owner holding the most), then running rings stop growing
//! and wrap within what they hold. A non-root owner holds at most half.

use serde_json::json;

use super::table::Key;
use super::Core;
use crate::wire::rpc::RpcError;

impl Core {
    /// Makes room for a command record of `bytes` in `owner`'s share of the budget by
    /// giving back retained output of exited commands; `-32003` when the records `owner`
    /// keeps already fill it (release some terminals).
    pub(super) fn room_for_record(&mut self, owner: u32, bytes: usize) -> Result<(), RpcError> {
        let max = self.cfg.max_output_memory;
        let share = if self.shares(owner) { max / 2 } else { max };
        let used = self.table.memory.of(owner);
        if used + bytes > share {
            self.release_retained(Some(owner), used + bytes - share, Key(0));
        }
        let total = self.table.memory.total;
        if total + bytes > max {
            self.release_retained(None, total + bytes - max, Key(0));
        }
        if self.table.memory.of(owner) + bytes > share || self.table.memory.total + bytes > max {
            return Err(RpcError::limit("max-output-memory", max).with_data(json!({
                "limit": "max-output-memory",
                "value": max,
                "reason": "the commands this uid keeps fill its share; release some",
            })));
        }
        Ok(())
    }

    /// Appends bytes read from output stream `stream` of `key` to its ring. A ring that
    /// needs more storage asks the output memory budget; what the budget cannot give, the
    /// ring does without (it wraps within what it holds).
    pub fn output(&mut self, key: Key, stream: usize, data: &[u8]) {
        let Some(p) = self.table.get(key) else { return };
        let Some(s) = p.streams.get(stream) else {
            return;
        };
        let owner = p.owner;
        let shell = p.family.is_shell();
        let offset = s.ring.end();
        let want = s.ring.growth_for(data.len());
        let granted = if want > 0 {
            self.grant(owner, key, want)
        } else {
            0
        };
        let Some(ring) = self
            .table
            .get_mut(key)
            .and_then(|p| p.streams.get_mut(stream))
            .map(|s| &mut s.ring)
        else {
            return;
        };
        if granted > 0 {
            let before = ring.committed();
            ring.grow(granted);
            let grown = ring.committed() - before;
            ring.append(data);
            self.table.memory.add(owner, grown);
            if grown > 0 {
                self.table.retain_output(key);
            }
        } else {
            ring.append(data);
        }
        let Some(p) = self.table.get_mut(key) else {
            return;
        };
        p.quiet_since = self.now;
        if let Some(screen) = p.tty.as_mut().and_then(|t| t.screen.as_mut()) {
            screen.feed(data);
        }
        if p.waiting_for_input {
            self.set_waiting(key, false);
        }
        if shell {
            self.shell_output(key, offset, data);
        }
    }

    /// How much of `want` more bytes `owner`'s command `key` may commit. Past the budget
    /// (all of `--max-output-memory`, half of it for a non-root owner) the retained output
    /// of exited commands is given back first: the owner's own when its share is the
    /// limit, else the oldest of the owner holding the most.
    pub(super) fn grant(&mut self, owner: u32, key: Key, want: usize) -> usize {
        let max = self.cfg.max_output_memory;
        let share = if self.shares(owner) { max / 2 } else { max };
        let used = self.table.memory.of(owner);
        if used + want > share {
            self.release_retained(Some(owner), used + want - share, key);
        }
        let total = self.table.memory.total;
        if total + want > max {
            self.release_retained(None, total + want - max, key);
        }
        let room_owner = share.saturating_sub(self.table.memory.of(owner));
        let room_total = max.saturating_sub(self.table.memory.total);
        want.min(room_owner).min(room_total)
    }

    /// Gives back the output of exited commands (never `except`) until `need` bytes are
    /// freed or none is left: oldest exit first, from `only`, or else from whichever owner
    /// holds the most at each step.
    pub(super) fn release_retained(&mut self, only: Option<u32>, need: usize, except: Key) {
        let mut freed = 0;
        while freed < need {
            let Some(victim) = self.table.take_retained(only, except) else {
                break;
            };
            freed += self.discard_output(victim);
        }
    }

    /// Gives back all output memory of `key`; its bytes count as dropped from now on.
    pub(super) fn discard_output(&mut self, key: Key) -> usize {
        let Some(p) = self.table.get_mut(key) else {
            return 0;
        };
        let owner = p.owner;
        let freed: usize = p.streams.iter_mut().map(|s| s.ring.discard()).sum();
        self.table.memory.sub(owner, freed);
        self.table.memory.released += freed as u64;
        freed
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::testkit::*;

    const MIB: usize = 1 << 20;
    /// Room the command records of a budget test take besides their output.
    const HEADROOM: usize = 64 << 10;

    /// Bytes the records of every command hold besides output.
    fn records(c: &Core) -> usize {
        c.table.procs.values().map(|p| p.meta).sum()
    }

    fn terminal_of(c: &mut Core, owner: u32, limit: usize) -> Key {
        let mut req = request(
            Family::Terminal {
                session_id: "s".into(),
            },
            Stdio3::Merged,
        );
        req.peer.uid = owner;
        req.ring_capacity = limit;
        let (key, id) = c.table.next_ids("term");
        c.started(&req, key, id, key.0 as i32 + 1000, req.peer.uid);
        key
    }

    fn budget_core(max: usize) -> Core {
        let cfg = Config {
            max_output_memory: max,
            ..Config::default()
        };
        {
            let (now, wall) = crate::types::test_clock();
            Core::new(cfg, now, wall, Log::new(false))
        }
    }

    #[test]
    fn the_budget_releases_retained_output_oldest_first_from_the_biggest_owner() {
        // Records take a little of the budget too (HEADROOM covers them).
        let mut c = budget_core(8 * MIB + HEADROOM);
        // Root holds 3 MiB of exited output, uid 1000 holds 2 MiB in two commands.
        let r1 = terminal_of(&mut c, 0, MIB);
        let r2 = terminal_of(&mut c, 0, 2 * MIB);
        let u1 = terminal_of(&mut c, 1000, MIB);
        let u2 = terminal_of(&mut c, 1000, MIB);
        for (k, n) in [(r1, MIB), (u1, MIB), (r2, 2 * MIB), (u2, MIB)] {
            c.output(k, 0, &vec![b'x'; n]);
            later(&mut c, Duration::from_millis(10));
            c.exited(k, Ended::Code(0), Usage::default(), None);
        }
        assert_eq!(c.table.memory.total, 5 * MIB + records(&c));
        // A running command of uid 2000 wants 4 MiB: 1 MiB must go. Root holds the most,
        // and its oldest exited command is r1.
        let run = terminal_of(&mut c, 2000, 4 * MIB);
        c.output(run, 0, &vec![b'y'; 4 * MIB]);
        assert_eq!(c.table.get(r1).unwrap().committed(), 0, "r1 released");
        assert_eq!(c.table.get(r2).unwrap().committed(), 2 * MIB, "r2 kept");
        assert_eq!(c.table.get(u1).unwrap().committed(), MIB, "u1 kept");
        assert_eq!(
            c.table.get(run).unwrap().streams[0].ring.retained(),
            4 * MIB
        );
        assert!(c.table.memory.total <= 8 * MIB + HEADROOM);
        // A later read says what was dropped.
        let ring = &c.table.get(r1).unwrap().streams[0].ring;
        assert_eq!((ring.start(), ring.end()), (MIB as u64, MIB as u64));
        assert_eq!(c.table.memory.released, MIB as u64);
    }

    #[test]
    fn a_non_root_owner_holds_at_most_half_the_budget() {
        let mut c = budget_core(8 * MIB + HEADROOM);
        let old = terminal_of(&mut c, 1000, 2 * MIB);
        c.output(old, 0, &vec![b'a'; 2 * MIB]);
        c.exited(old, Ended::Code(0), Usage::default(), None);
        let run = terminal_of(&mut c, 1000, 8 * MIB);
        c.output(run, 0, &vec![b'b'; 6 * MIB]);
        // Its own exited output went first; then its running ring stopped growing.
        assert_eq!(c.table.get(old).unwrap().committed(), 0);
        assert!(c.table.memory.of(1000) <= 4 * MIB + HEADROOM / 2);
        let ring = &c.table.get(run).unwrap().streams[0].ring;
        assert_eq!(ring.end(), 6 * MIB as u64);
        assert!(ring.start() > 0, "truncated, as a full ring is");
        assert_eq!(ring.retained(), ring.committed());
        // Root may use the rest.
        let root = terminal_of(&mut c, 0, 4 * MIB);
        c.output(root, 0, &vec![b'c'; 4 * MIB]);
        assert_eq!(c.table.get(root).unwrap().committed(), 4 * MIB);
    }

    #[test]
    fn running_commands_alone_at_the_budget_keep_their_tails_and_nothing_is_refused() {
        let mut c = budget_core(2 * MIB + HEADROOM);
        let a = terminal_of(&mut c, 0, 2 * MIB);
        let b = terminal_of(&mut c, 0, 2 * MIB);
        c.output(a, 0, &vec![b'a'; 3 * MIB / 2]);
        c.output(b, 0, &vec![b'b'; 3 * MIB / 2]);
        c.output(b, 0, b"tail");
        assert!(c.table.memory.total <= 2 * MIB + HEADROOM);
        let rb = &c.table.get(b).unwrap().streams[0].ring;
        let (s, e) = (rb.start(), rb.end());
        assert_eq!(&rb.text(e - 4, e), "tail");
        assert!(s > 0);
        // Forgetting a command gives its memory back.
        c.exited(a, Ended::Code(0), Usage::default(), None);
        c.release(a, KillReason::Release);
        c.sweep();
        let b = c.table.get(b).unwrap();
        assert_eq!(c.table.memory.total, b.committed() + b.meta);
    }

    #[test]
    fn records_count_in_the_budget_and_a_uid_whose_records_fill_its_share_is_refused() {
        let mut c = budget_core(64 << 10);
        c.daemon_uid = 0;
        let mut req = crate::core::testkit::request(
            Family::Terminal {
                session_id: "s".into(),
            },
            Stdio3::Merged,
        );
        req.command = "x".repeat(12 << 10);
        // uid 1000's share is 32 KiB: two 12 KiB records fit, a third does not.
        for _ in 0..2 {
            c.may_start(&req).unwrap();
            let (key, id) = c.table.next_ids("term");
            c.started(&req, key, id, key.0 as i32 + 1000, 1000);
        }
        let e = c.may_start(&req).unwrap_err();
        assert_eq!(e.code, crate::wire::rpc::LIMIT_REACHED);
        assert_eq!(e.data.unwrap()["limit"], "max-output-memory");
        assert!(c.table.memory.of(1000) > 20 << 10);
        // Root's share is the whole budget.
        req.peer.uid = 0;
        assert!(c.may_start(&req).is_ok());
    }
}
