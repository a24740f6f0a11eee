//! How a command's process tree is held and ended. Today: its process group (every
//! command leads its own session and group, so `kill(-pgid)` reaches it and everything it
//! started that did not leave the group).
//!
//! The core decides *when* a tree is signalled (`Effect::Kill`); this module decides *what*
//! that reaches and makes sure it never reaches anything else.
//!
//! Invariants:
//! - A group number is signalled only while it is known to be ours: while its leader
//!   runs (no other group can take the number of a live process), or after the leader's
//!   exit while the group is known to still have members. Group numbers are free for reuse
//!   once a group empties, so a group found empty is forgotten at once and never signalled.
//! - Liveness is rechecked whenever a leader exits or a re-parented descendant is reaped
//!   (the daemon is their subreaper, so the last member of a group dies as our child).

use std::collections::HashMap;

use crate::process;
use crate::table::Key;

/// The two steps of ending a tree.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// SIGTERM: a polite request.
    Term,
    /// SIGKILL to whatever of the tree is left.
    Kill,
}

/// What is known of one command's tree.
#[derive(Debug)]
struct Hold {
    pgid: i32,
    /// The leader has not been reaped.
    leader_alive: bool,
}

/// Every tree the daemon still holds.
#[derive(Debug, Default)]
pub struct Contain {
    holds: HashMap<Key, Hold>,
}

impl Contain {
    /// What is in use, for logs, `initialize` and `execctl status`.
    pub fn describe(&self) -> String {
        "process groups".into()
    }

    /// A command started: its leader `pid` leads group `pid`.
    pub fn started(&mut self, key: Key, pid: i32) {
        self.holds.insert(
            key,
            Hold {
                pgid: pid,
                leader_alive: true,
            },
        );
    }

    /// The leader was reaped: the tree is held on only while its group has members.
    pub fn leader_exited(&mut self, key: Key) {
        if let Some(h) = self.holds.get_mut(&key) {
            h.leader_alive = false;
            if !process::group_exists(h.pgid) {
                self.holds.remove(&key);
            }
        }
    }

    /// A re-parented descendant was reaped: groups that lost their last member are
    /// forgotten, so their numbers, free for reuse now, are never signalled.
    pub fn orphan_reaped(&mut self) {
        self.holds
            .retain(|_, h| h.leader_alive || process::group_exists(h.pgid));
    }

    /// Signals what is left of `key`'s tree; nothing when it is gone.
    pub fn end(&mut self, key: Key, stage: Stage) {
        let sig = match stage {
            Stage::Term => libc::SIGTERM,
            Stage::Kill => libc::SIGKILL,
        };
        self.signal(key, sig);
    }

    /// Sends `sig` to the tree of `key` (a `bash/kill`).
    pub fn signal(&mut self, key: Key, sig: i32) {
        let Some(h) = self.holds.get(&key) else {
            return;
        };
        if !h.leader_alive && !process::group_exists(h.pgid) {
            self.holds.remove(&key);
            return;
        }
        process::signal_group(h.pgid, sig);
    }

    /// Whether any tree still has members (the leader counts until reaped).
    pub fn any_left(&mut self) -> bool {
        self.orphan_reaped();
        !self.holds.is_empty()
    }

    /// SIGKILL to everything still held (the last step of a shutdown).
    pub fn kill_all(&mut self) {
        let keys: Vec<Key> = self.holds.keys().copied().collect();
        for key in keys {
            self.end(key, Stage::Kill);
        }
    }
}
