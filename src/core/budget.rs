//! The output memory budget (`--max-output-memory`, PROTOCOL 8): rings grow only with
//! what the budget grants; past it, retained output of exited commands is given back
//! first (oldest first, from the owner holding the most), then running rings stop growing
//! and wrap within what they hold. A non-root owner holds at most half.
//!
//! Nothing is refused for the budget: a new command's record (and a ring that holds less
//! than its floor) is made room for by running rings giving back their oldest bytes,
//! the biggest ring first, each halved at most per step and never below the floor
//! (`ring_floor`: 64 KiB, or the budget divided by the running commands when that is
//! smaller, never below 4 KiB). What a ring gives back counts as dropped (truncation).

use serde_json::json;

use super::table::Key;
use super::Core;
use crate::wire::rpc::RpcError;

/// What a running ring keeps at least when rings give back memory for others.
pub const RING_FLOOR: usize = 64 << 10;
/// The floor's own floor, however many commands run.
pub const RING_FLOOR_MIN: usize = 4 << 10;

/// The least a running ring is made to keep: `RING_FLOOR`, or `budget` divided by the
/// `running` commands when that is smaller, never below `RING_FLOOR_MIN`.
pub fn ring_floor(budget: usize, running: usize) -> usize {
    (budget / running.max(1)).clamp(RING_FLOOR_MIN, RING_FLOOR)
}

impl Core {
    /// Makes room for a command record of `bytes` in `owner`'s share of the budget: the
    /// retained output of exited commands is given back first, then running rings give
    /// back their oldest bytes down to their floor. `-32003` only when the records kept
    /// fill the share with every ring at its floor.
    pub(super) fn room_for_record(&mut self, owner: u32, bytes: usize) -> Result<(), RpcError> {
        let max = self.cfg.max_output_memory;
        let share = if self.shares(owner) { max / 2 } else { max };
        for only in [Some(owner), None] {
            let (used, limit) = match only {
                Some(o) => (self.table.memory.of(o), share),
                None => (self.table.memory.total, max),
            };
            if used + bytes > limit {
                let need = used + bytes - limit;
                self.release_retained(only, need, Key(0));
            }
            let used = match only {
                Some(o) => self.table.memory.of(o),
                None => self.table.memory.total,
            };
            if used + bytes > limit {
                self.reclaim_running(only, used + bytes - limit, Key(0));
            }
        }
        if self.table.memory.of(owner) + bytes > share || self.table.memory.total + bytes > max {
            return Err(RpcError::limit("max-output-memory", max).with_data(json!({
                "limit": "max-output-memory",
                "value": max,
                "reason": "the records of the commands this uid keeps fill its share; \
                           release some",
            })));
        }
        Ok(())
    }

    /// Running rings (of `only`, else of anyone; never `except`'s) give back their oldest
    /// bytes until `need` bytes are freed: the ring committing the most first, halved at
    /// most per step (a record's few hundred bytes do not cost a copy of a whole ring
    /// each), never below the floor. Returns the bytes freed.
    pub(super) fn reclaim_running(&mut self, only: Option<u32>, need: usize, except: Key) -> usize {
        let floor = ring_floor(self.cfg.max_output_memory, self.table.running());
        let mut freed = 0;
        while freed < need {
            let biggest = self
                .table
                .procs
                .values()
                .filter(|p| p.running() && p.key != except && only.is_none_or(|o| p.owner == o))
                .flat_map(|p| {
                    p.streams
                        .iter()
                        .enumerate()
                        .map(move |(i, s)| (s.ring.committed(), p.key, i))
                })
                .filter(|(committed, _, _)| *committed > floor)
                .max();
            let Some((committed, key, stream)) = biggest else {
                break;
            };
            let keep = committed
                .saturating_sub(need - freed)
                .min(committed / 2)
                .max(floor);
            let Some(p) = self.table.get_mut(key) else {
                break;
            };
            let owner = p.owner;
            let got = p.streams[stream].ring.shrink_to(keep);
            self.table.memory.sub(owner, got);
            freed += got;
            if got == 0 {
                break;
            }
        }
        freed
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
        let has = s.ring.committed();
        let granted = if want > 0 {
            self.grant(owner, key, want, has)
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

    /// How much of `want` more bytes `owner`'s command `key`, whose ring commits `has`,
    /// may commit. Past the budget (all of `--max-output-memory`, half of it for a
    /// non-root owner) the retained output of exited commands is given back first: the
    /// owner's own when its share is the limit, else the oldest of the owner holding the
    /// most. A ring below its floor is then brought up to it by rings above theirs giving
    /// back; past its floor, a ring only grows into free room.
    pub(super) fn grant(&mut self, owner: u32, key: Key, want: usize, has: usize) -> usize {
        let max = self.cfg.max_output_memory;
        let share = if self.shares(owner) { max / 2 } else { max };
        let floor = ring_floor(max, self.table.running());
        for only in [Some(owner), None] {
            let (used, limit) = match only {
                Some(o) => (self.table.memory.of(o), share),
                None => (self.table.memory.total, max),
            };
            if used + want > limit {
                self.release_retained(only, used + want - limit, key);
            }
            let used = match only {
                Some(o) => self.table.memory.of(o),
                None => self.table.memory.total,
            };
            let up_to_floor = floor.saturating_sub(has).min(want);
            let room = limit.saturating_sub(used);
            if up_to_floor > room {
                self.reclaim_running(only, up_to_floor - room, key);
            }
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
    fn the_floor_is_64_kib_or_the_budget_per_running_command_never_below_4_kib() {
        assert_eq!(ring_floor(128 * MIB, 12), 64 << 10);
        assert_eq!(ring_floor(128 * MIB, 0), 64 << 10);
        assert_eq!(ring_floor(MIB, 64), 16 << 10);
        assert_eq!(ring_floor(MIB, 10_000), 4 << 10);
    }

    /// Twelve commands each writing four times their share of the budget: every one
    /// starts (its record fits) and gets a ring, the budget holds, and the rings that
    /// gave back report it as truncation.
    #[test]
    fn twelve_big_writers_all_start_and_running_rings_give_back_down_to_their_floor() {
        for owner in [0, 1000] {
            let max = 8 * MIB;
            let mut c = budget_core(max);
            let mut req = request(
                Family::Terminal {
                    session_id: "s".into(),
                },
                Stdio3::Merged,
            );
            req.peer.uid = owner;
            req.ring_capacity = 4 * MIB;
            let mut keys = Vec::new();
            for i in 0..12 {
                c.may_start(&req)
                    .unwrap_or_else(|e| panic!("uid {owner}: command {i} refused: {e:?}"));
                let (key, id) = c.table.next_ids("term");
                c.started(&req, key, id, key.0 as i32 + 1000, owner);
                for _ in 0..4 {
                    c.output(key, 0, &vec![b'x'; MIB]);
                }
                keys.push(key);
                let share = if owner == 0 { max } else { max / 2 };
                assert!(c.table.memory.total <= share, "uid {owner}: {i}");
            }
            let floor = ring_floor(max, 12);
            for (i, k) in keys.iter().enumerate() {
                let ring = &c.table.get(*k).unwrap().streams[0].ring;
                assert!(
                    ring.committed() >= floor,
                    "uid {owner}: ring {i} below the floor"
                );
                assert_eq!(ring.end(), 4 * MIB as u64);
                assert!(ring.start() > 0, "uid {owner}: ring {i} reports truncation");
                assert_eq!(ring.retained(), ring.committed());
            }
        }
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
