//! Whether a peer is one of the gate's subjects (PROTOCOL 7.3): a process that descends
//! from the daemon (anything a command started, however it detached) never operates the
//! gate, and the command it descends from bounds what it may ask for (16). This room holds
//! the answer as data (`Tie`, which `Caller` carries to every method family) and the walk
//! that finds it, over process facts the loop reads and passes in, so it is tested on
//! made-up process trees.
//!
//! The sources, in order: the peer's cgroup (a command cgroup names its command; the loop
//! looks it up before the walk), then its ancestry: the chain of parents from the peer
//! up to a command's leader (tied to that command), to the daemon itself (a descendant
//! tied to no command: the daemon is every descendant's subreaper, so a `setsid` double
//! fork or an `env -i` child still chains to it), or to anything else (not a
//! descendant). A third source, the `EXECD_TREE` cookie of the peer's environment, needs
//! a read of the peer's memory and so is never made on the loop; it can only add to what
//! the first two found, for a peer they tie to no command (`command: None`, not
//! `Remote`). At accept, such a connection has its peer's cookie read by the off-loop
//! reader (pinned by the peer's start time), its requests held (not read) until the
//! answer comes or `server::COOKIE_WAIT` is up (then it stays as it is); a cookie of this
//! instance naming a known command, with that command's tag (`sys::cookie::tag`, made
//! from the daemon's secret, so a process cannot name another command than one whose
//! environment it inherited), makes it `Tie::descendant(Some(command),
//! TieSource::Cookie)`. A double-forked child of a sandboxed command, which no cgroup
//! holds, so gets its command's sandbox and `$CWD` back rather than `read-only`.
//!
//! Invariants:
//! - What cannot be read is not taken for "outside": a peer whose facts are missing, a
//!   chain too long to follow, or a pid that changed hands while it was read, counts as a
//!   descendant tied to no command (`TieSource::Unknown`). Refusing to let such a peer
//!   approve or upgrade costs an outsider a retry; the opposite would let a subject through.
//! - A pid reused during the walk is noticed: a parent never starts after its child, so a
//!   "parent" that did is another process, and the child is read again (it was re-parented).
//! - The answer is made once, at accept, about the process that connected (its identity
//!   pinned by the loop, `sys::peer`), and kept with the connection: a pid reused later
//!   never changes it.

use serde_json::json;

use super::table::Key;
use super::{Caller, Core};
use crate::wire::rpc::{self, RpcError};

/// The most parents followed from a peer before the walk gives up (and the peer counts as
/// a descendant of unknown command): far deeper than any real tree.
pub const MAX_DEPTH: usize = 256;

/// The most times one step of the walk reads a process again after its parent vanished or
/// changed hands under it.
const MAX_REREADS: usize = 8;

/// How a peer's tie was found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TieSource {
    /// Its ancestry ends outside the daemon: not a descendant.
    #[default]
    Outside,
    /// Its cgroup is one of the daemon's command cgroups.
    Cgroup,
    /// Its chain of parents reaches a command's leader or the daemon.
    Ancestry,
    /// Its `EXECD_TREE` cookie names a command of this daemon.
    Cookie,
    /// Its facts could not be read, or changed hands while they were: taken as a
    /// descendant (fail closed).
    Unknown,
    /// A TCP peer of the HTTP front end: no process to look at (it runs as
    /// `--http-run-as`).
    Remote,
}

impl TieSource {
    pub fn as_str(self) -> &'static str {
        match self {
            TieSource::Outside => "outside",
            TieSource::Cgroup => "cgroup",
            TieSource::Ancestry => "ancestry",
            TieSource::Cookie => "cookie",
            TieSource::Unknown => "unknown",
            TieSource::Remote => "remote",
        }
    }

    pub fn parse(s: &str) -> Option<TieSource> {
        Some(match s {
            "outside" => TieSource::Outside,
            "cgroup" => TieSource::Cgroup,
            "ancestry" => TieSource::Ancestry,
            "cookie" => TieSource::Cookie,
            "unknown" => TieSource::Unknown,
            "remote" => TieSource::Remote,
            _ => return None,
        })
    }
}

/// What the daemon knows of a peer's descent: whether it is one of the gate's subjects,
/// and the command it is tied to. Method families read it on `Caller::tie`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Tie {
    /// The peer descends from the daemon, or relays for a process that does, or could not
    /// be shown not to: it never approves, upgrades or reloads anything.
    pub descends: bool,
    /// The command it descends from, when one was found (a descendant of a command whose
    /// leader has exited, with no cgroup to say, is tied to none).
    pub command: Option<Key>,
    pub by: TieSource,
}

impl Tie {
    /// Not a descendant.
    pub fn outside() -> Tie {
        Tie::default()
    }

    /// A descendant of command `command` (none: of the daemon, no command known).
    pub fn descendant(command: Option<Key>, by: TieSource) -> Tie {
        Tie {
            descends: true,
            command,
            by,
        }
    }

    /// Nothing could be told: a descendant of no known command.
    pub fn unknown() -> Tie {
        Tie::descendant(None, TieSource::Unknown)
    }

    /// A TCP peer: no process to trace.
    pub fn remote() -> Tie {
        Tie {
            by: TieSource::Remote,
            ..Tie::default()
        }
    }

    /// One line for the log: `outside`, `descends (ancestry)`, `command 12 (cgroup)`.
    pub fn describe(&self) -> String {
        match (self.descends, self.command) {
            (false, _) => self.by.as_str().to_string(),
            (true, None) => format!("descends ({})", self.by.as_str()),
            (true, Some(k)) => format!("command {k} ({})", self.by.as_str()),
        }
    }
}

/// What the walk needs of one process (from `/proc/PID/stat`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stat {
    pub ppid: i32,
    /// Its start, in clock ticks since boot.
    pub start: u64,
}

/// What `trace` found: the tie, and the peer's start time as it was read (for the loop to
/// check, when it has no pidfd, that the pid still names the same process).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Traced {
    pub tie: Tie,
    pub start: Option<u64>,
}

/// The most processes `Outsiders` remembers; past it, it starts again empty.
const OUTSIDERS_MAX: usize = 4096;

/// Processes known not to descend from the daemon, by pid and start time: what never
/// changes for a process (an orphan is re-parented to its nearest subreaper, which for a
/// process outside is outside too), so the next walk through one of them (an agent's
/// shell, sshd, a user's systemd) stops there rather than read its way up to init again.
#[derive(Debug, Default)]
pub struct Outsiders(std::collections::HashSet<(i32, u64)>);

impl Outsiders {
    fn knows(&self, pid: i32, s: &Stat) -> bool {
        self.0.contains(&(pid, s.start))
    }

    fn learn(&mut self, seen: &[(i32, u64)]) {
        if self.0.len() + seen.len() > OUTSIDERS_MAX {
            self.0.clear();
        }
        self.0.extend(seen.iter().copied());
    }
}

/// Follows `pid`'s parents (read with `stat`) up to a command's leader (`leader` names
/// its command), the daemon (`daemon`), a process known to be outside (`outsiders`,
/// which learns the ones this walk found outside), or anything else; `cgroup` is what the
/// peer's cgroup said (`Some(command)` for one of the daemon's command cgroups, the inner
/// `None` when that command is no longer known), and wins when it names a command.
pub fn trace(
    pid: i32,
    daemon: i32,
    cgroup: Option<Option<Key>>,
    (leader, outsiders): (impl Fn(i32) -> Option<Key>, &mut Outsiders),
    mut stat: impl FnMut(i32) -> Option<Stat>,
) -> Traced {
    if let Some(Some(k)) = cgroup {
        return Traced {
            tie: Tie::descendant(Some(k), TieSource::Cgroup),
            start: stat(pid).map(|s| s.start),
        };
    }
    // A pid of 0: the peer is in a pid namespace this one cannot see, which no descendant
    // is (a descendant's namespaces nest inside the daemon's).
    if pid <= 0 {
        return Traced {
            tie: Tie::outside(),
            start: None,
        };
    }
    let Some(first) = stat(pid) else {
        return Traced {
            tie: Tie::unknown(),
            start: None,
        };
    };
    let found = walk(pid, first, daemon, (&leader, outsiders), &mut stat);
    // Its cgroup said it is a descendant even when the walk could not name its command.
    let tie = match (cgroup, found) {
        (Some(None), t) if !t.descends => Tie::descendant(None, TieSource::Cgroup),
        (_, t) => t,
    };
    Traced {
        tie,
        start: Some(first.start),
    }
}

fn walk(
    pid: i32,
    first: Stat,
    daemon: i32,
    (leader, outsiders): (&impl Fn(i32) -> Option<Key>, &mut Outsiders),
    stat: &mut impl FnMut(i32) -> Option<Stat>,
) -> Tie {
    if pid == daemon {
        return Tie::descendant(None, TieSource::Ancestry);
    }
    // The processes passed on the way: outside, all of them, if the walk ends outside.
    let mut seen: Vec<(i32, u64)> = Vec::new();
    let outside = |o: &mut Outsiders, seen: &[(i32, u64)]| {
        o.learn(seen);
        Tie::outside()
    };
    let (mut cur, mut cur_stat) = (pid, first);
    for _ in 0..MAX_DEPTH {
        if let Some(k) = leader(cur) {
            return Tie::descendant(Some(k), TieSource::Ancestry);
        }
        if outsiders.knows(cur, &cur_stat) {
            return outside(outsiders, &seen);
        }
        seen.push((cur, cur_stat.start));
        let mut rereads = 0;
        let parent = loop {
            let ppid = cur_stat.ppid;
            // The daemon first: it may be pid 1 (a container's init).
            if ppid == daemon {
                return Tie::descendant(None, TieSource::Ancestry);
            }
            if ppid <= 1 {
                return outside(outsiders, &seen);
            }
            match stat(ppid) {
                // A parent never starts after its child.
                Some(p) if p.start <= cur_stat.start => break (ppid, p),
                // Gone, or its pid reused: `cur` was re-parented; read it again.
                _ => {
                    rereads += 1;
                    match stat(cur) {
                        Some(s) if rereads <= MAX_REREADS && s.start == cur_stat.start => {
                            cur_stat = s
                        }
                        _ => return Tie::unknown(),
                    }
                }
            }
        };
        (cur, cur_stat) = parent;
    }
    Tie::unknown()
}

impl Core {
    /// A subject of the gate (a descendant of the daemon, or a relay for one) asked to
    /// operate it with `method` (approve, upgrade): `-32002`, as if the method did not
    /// exist for it, logged (rate-limited) and audited as `refuse`.
    pub fn subject_refused(&mut self, caller: &Caller, method: &str) -> RpcError {
        let tie = caller.tie.describe();
        self.record(
            "refuse",
            Some(caller.peer()),
            json!({ "why": "descends from the daemon", "method": method, "tie": tie }),
        );
        self.log.refusal(
            "subject",
            self.now,
            format_args!(
                "refused {method} to uid {} pid {}: it descends from the daemon ({tie}); \
                 what execd runs never operates its gate",
                caller.uid, caller.pid
            ),
        );
        RpcError::new(
            rpc::NOT_FOUND,
            format!(
                "{method} is not for a process execd runs (or one relaying for it): the \
                 gate's subjects never operate it"
            ),
        )
        .with_data(json!({ "method": method, "reason": "descends from the daemon" }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    const DAEMON: i32 = 100;

    /// A made-up process table: pid -> (ppid, start).
    fn procs(list: &[(i32, i32, u64)]) -> HashMap<i32, Stat> {
        list.iter()
            .map(|&(pid, ppid, start)| (pid, Stat { ppid, start }))
            .collect()
    }

    fn leaders(list: &[(i32, u64)]) -> impl Fn(i32) -> Option<Key> + '_ {
        move |pid| list.iter().find(|l| l.0 == pid).map(|l| Key(l.1))
    }

    fn tie_of(pid: i32, table: &HashMap<i32, Stat>, lead: &[(i32, u64)]) -> Tie {
        let mut fresh = Outsiders::default();
        trace(pid, DAEMON, None, (leaders(lead), &mut fresh), |p| {
            table.get(&p).copied()
        })
        .tie
    }

    /// init 1 -> shell 50 -> daemon 100 -> leader 200 (command 7) -> sh 201 -> peer 202;
    /// a double-forked 300 re-parented to the daemon; an outsider 60 under the shell.
    fn tree() -> HashMap<i32, Stat> {
        procs(&[
            (50, 1, 10),
            (DAEMON, 50, 20),
            (200, DAEMON, 30),
            (201, 200, 31),
            (202, 201, 32),
            (300, DAEMON, 40),
            (301, 300, 41),
            (60, 50, 50),
            (61, 60, 51),
        ])
    }

    #[test]
    fn a_peer_under_a_command_is_tied_to_it() {
        let t = tree();
        let tie = tie_of(202, &t, &[(200, 7)]);
        assert_eq!(tie, Tie::descendant(Some(Key(7)), TieSource::Ancestry));
        assert_eq!(
            tie_of(200, &t, &[(200, 7)]).command,
            Some(Key(7)),
            "the leader itself"
        );
    }

    #[test]
    fn a_detached_descendant_chains_to_the_daemon_and_an_outsider_does_not() {
        let t = tree();
        let tie = tie_of(301, &t, &[(200, 7)]);
        assert_eq!(tie, Tie::descendant(None, TieSource::Ancestry));
        let out = tie_of(61, &t, &[(200, 7)]);
        assert_eq!(out, Tie::outside());
        assert!(!out.descends);
        assert_eq!(
            tie_of(50, &t, &[]),
            Tie::outside(),
            "the daemon's own parent"
        );
    }

    #[test]
    fn the_cgroup_wins_and_otherwise_still_says_descendant() {
        let t = tree();
        let traced = trace(
            61,
            DAEMON,
            Some(Some(Key(9))),
            (leaders(&[]), &mut Outsiders::default()),
            |p| t.get(&p).copied(),
        );
        assert_eq!(traced.tie, Tie::descendant(Some(Key(9)), TieSource::Cgroup));
        assert_eq!(traced.start, Some(51));
        let forgotten = trace(
            61,
            DAEMON,
            Some(None),
            (leaders(&[]), &mut Outsiders::default()),
            |p| t.get(&p).copied(),
        );
        assert_eq!(forgotten.tie, Tie::descendant(None, TieSource::Cgroup));
        // The walk can do better than a cgroup of a forgotten command.
        let better = trace(
            202,
            DAEMON,
            Some(None),
            (leaders(&[(200, 7)]), &mut Outsiders::default()),
            |p| t.get(&p).copied(),
        );
        assert_eq!(better.tie.command, Some(Key(7)));
    }

    #[test]
    fn what_cannot_be_read_is_taken_for_a_descendant() {
        let t = tree();
        assert_eq!(tie_of(999, &t, &[]), Tie::unknown(), "a peer already gone");
        // A chain longer than MAX_DEPTH.
        let mut long = vec![(1000, 1, 1)];
        for i in 1..=(MAX_DEPTH as i32 + 5) {
            long.push((1000 + i, 1000 + i - 1, 1 + i as u64));
        }
        let long = procs(&long);
        let deepest = 1000 + MAX_DEPTH as i32 + 5;
        assert_eq!(tie_of(deepest, &long, &[]), Tie::unknown());
        assert_eq!(
            tie_of(1003, &long, &[]),
            Tie::outside(),
            "a short one is followed"
        );
    }

    /// A walk that ends outside remembers the processes it passed: the next one through
    /// them stops there, and a reused pid (another start time) is not taken for them.
    #[test]
    fn processes_found_outside_are_not_read_again() {
        let t = tree();
        let mut outsiders = Outsiders::default();
        let mut reads = Vec::new();
        let look = |pid: i32, reads: &mut Vec<i32>, o: &mut Outsiders| {
            reads.clear();
            trace(pid, DAEMON, None, (leaders(&[]), o), |p| {
                reads.push(p);
                t.get(&p).copied()
            })
            .tie
        };
        assert_eq!(look(61, &mut reads, &mut outsiders), Tie::outside());
        assert_eq!(reads, [61, 60, 50]);
        let mut t2 = t.clone();
        t2.insert(
            62,
            Stat {
                ppid: 60,
                start: 52,
            },
        );
        reads.clear();
        let tie = trace(62, DAEMON, None, (leaders(&[]), &mut outsiders), |p| {
            reads.push(p);
            t2.get(&p).copied()
        })
        .tie;
        assert_eq!(tie, Tie::outside());
        assert_eq!(reads, [62, 60], "stops at its known parent");
        // Pid 60 reused by a descendant of the daemon: another start, another process.
        let mut t3 = t.clone();
        t3.insert(
            60,
            Stat {
                ppid: DAEMON,
                start: 90,
            },
        );
        t3.insert(
            63,
            Stat {
                ppid: 60,
                start: 91,
            },
        );
        let tie = trace(63, DAEMON, None, (leaders(&[]), &mut outsiders), |p| {
            t3.get(&p).copied()
        })
        .tie;
        assert_eq!(tie, Tie::descendant(None, TieSource::Ancestry));
        // Descendants are never remembered as outside.
        let _ = look(301, &mut reads, &mut outsiders);
        assert!(!outsiders.0.contains(&(301, 41)));
    }

    #[test]
    fn a_pid_of_zero_is_a_peer_of_another_namespace() {
        assert_eq!(tie_of(0, &tree(), &[]), Tie::outside());
    }

    #[test]
    fn a_daemon_that_is_pid_one_still_sees_its_descendants() {
        let t = procs(&[(5, 1, 10), (6, 5, 11)]);
        let tie = trace(6, 1, None, (leaders(&[]), &mut Outsiders::default()), |p| {
            t.get(&p).copied()
        })
        .tie;
        assert_eq!(tie, Tie::descendant(None, TieSource::Ancestry));
        let outside = procs(&[(7, 0, 10)]);
        let tie = trace(7, 1, None, (leaders(&[]), &mut Outsiders::default()), |p| {
            outside.get(&p).copied()
        })
        .tie;
        assert_eq!(tie, Tie::outside(), "a parent outside the namespace");
    }

    /// The parent of 202 (201) exits and its pid is taken by an unrelated process started
    /// later; 202, re-parented to the daemon, is read again and found a descendant.
    #[test]
    fn a_parent_pid_reused_during_the_walk_is_noticed() {
        let mut t = tree();
        t.insert(
            201,
            Stat {
                ppid: 60,
                start: 99,
            },
        ); // reused: starts after 202
        let mut reads = 0;
        let tie = trace(
            202,
            DAEMON,
            None,
            (leaders(&[]), &mut Outsiders::default()),
            |p| {
                if p == 202 {
                    reads += 1;
                    if reads > 1 {
                        // Read again: it was re-parented to its subreaper.
                        return Some(Stat {
                            ppid: DAEMON,
                            start: 32,
                        });
                    }
                }
                t.get(&p).copied()
            },
        )
        .tie;
        assert_eq!(tie, Tie::descendant(None, TieSource::Ancestry));
        // Were it read again as another process (its own pid reused), nothing is told.
        let mut reads = 0;
        let tie = trace(
            202,
            DAEMON,
            None,
            (leaders(&[]), &mut Outsiders::default()),
            |p| {
                if p == 202 {
                    reads += 1;
                    if reads > 1 {
                        return Some(Stat {
                            ppid: 1,
                            start: 500,
                        });
                    }
                }
                t.get(&p).copied()
            },
        )
        .tie;
        assert_eq!(tie, Tie::unknown());
    }

    #[test]
    fn a_tie_says_itself_in_one_line() {
        assert_eq!(Tie::outside().describe(), "outside");
        assert_eq!(Tie::unknown().describe(), "descends (unknown)");
        assert_eq!(
            Tie::descendant(Some(Key(12)), TieSource::Cgroup).describe(),
            "command 12 (cgroup)"
        );
        for s in [
            TieSource::Outside,
            TieSource::Cgroup,
            TieSource::Ancestry,
            TieSource::Cookie,
            TieSource::Unknown,
            TieSource::Remote,
        ] {
            assert_eq!(TieSource::parse(s.as_str()), Some(s));
        }
    }
}
