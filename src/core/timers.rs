//! One timer structure for the whole loop: kill escalation, soft and hard timeouts, long-poll
//! deadlines, idle sessions, accept back-off, shutdown. A binary heap ordered by deadline:
//! adding is O(log n), cancelling is O(1) (the entry is forgotten and skipped when it
//! surfaces), and the loop's poll timeout is the earliest live deadline. When cancelled
//! entries outnumber live ones the heap is rebuilt, so far-off deadlines that were
//! cancelled (a `wait_timeout` of a day) cannot pile up.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::time::Instant;

/// Handle for cancelling a timer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TimerId(u64);

/// A deadline heap carrying values of type `T`.
#[derive(Debug)]
pub struct Timers<T> {
    heap: BinaryHeap<Reverse<(Instant, u64)>>,
    live: HashMap<u64, (Instant, T)>,
    next: u64,
}

impl<T> Default for Timers<T> {
    fn default() -> Self {
        Timers {
            heap: BinaryHeap::new(),
            live: HashMap::new(),
            next: 0,
        }
    }
}

impl<T> Timers<T> {
    /// Arms a timer that fires at `at`.
    pub fn add(&mut self, at: Instant, what: T) -> TimerId {
        let id = self.next;
        self.next += 1;
        self.heap.push(Reverse((at, id)));
        self.live.insert(id, (at, what));
        TimerId(id)
    }

    /// Disarms a timer; unknown or already fired ids are ignored.
    pub fn cancel(&mut self, id: TimerId) {
        if self.live.remove(&id.0).is_some() && self.heap.len() > 2 * self.live.len() + 64 {
            self.heap = self
                .live
                .iter()
                .map(|(id, (at, _))| Reverse((*at, *id)))
                .collect();
        }
    }

    /// The earliest live deadline.
    pub fn next_deadline(&mut self) -> Option<Instant> {
        while let Some(Reverse((at, id))) = self.heap.peek().copied() {
            if self.live.contains_key(&id) {
                return Some(at);
            }
            self.heap.pop();
        }
        None
    }

    /// Takes one timer due at or before `now`, earliest first.
    pub fn pop_due(&mut self, now: Instant) -> Option<T> {
        while let Some(Reverse((at, id))) = self.heap.peek().copied() {
            if at > now {
                return None;
            }
            self.heap.pop();
            if let Some((_, what)) = self.live.remove(&id) {
                return Some(what);
            }
        }
        None
    }
}

impl<T> Timers<T> {
    /// Every live timer, earliest first (ties in the order they were armed): what an
    /// upgrade in place carries.
    pub fn live(&self) -> Vec<(Instant, &T)> {
        let mut v: Vec<(Instant, u64, &T)> = self
            .live
            .iter()
            .map(|(id, (at, what))| (*at, *id, what))
            .collect();
        v.sort_by_key(|(at, id, _)| (*at, *id));
        v.into_iter().map(|(at, _, what)| (at, what)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn fires_in_deadline_order_and_skips_cancelled() {
        let t0 = crate::types::test_clock().0;
        let s = Duration::from_secs;
        let mut t = Timers::default();
        t.add(t0 + s(3), "c");
        let b = t.add(t0 + s(2), "b");
        t.add(t0 + s(1), "a");
        assert_eq!(t.next_deadline(), Some(t0 + s(1)));
        t.cancel(b);
        assert_eq!(t.live.len(), 2);
        assert_eq!(t.pop_due(t0), None);
        assert_eq!(t.pop_due(t0 + s(5)), Some("a"));
        assert_eq!(t.pop_due(t0 + s(5)), Some("c"));
        assert_eq!(t.pop_due(t0 + s(5)), None);
        assert_eq!(t.next_deadline(), None);
        assert!(t.live.is_empty());
    }

    #[test]
    fn cancelled_far_deadlines_do_not_pile_up() {
        let t0 = crate::types::test_clock().0;
        let mut t = Timers::default();
        let keep = t.add(t0 + Duration::from_secs(1), 0);
        for i in 0..10_000 {
            let id = t.add(t0 + Duration::from_secs(86_400), i);
            t.cancel(id);
        }
        assert!(t.heap.len() < 200, "heap holds {} entries", t.heap.len());
        assert_eq!(t.pop_due(t0 + Duration::from_secs(2)), Some(0));
        t.cancel(keep);
    }
}
