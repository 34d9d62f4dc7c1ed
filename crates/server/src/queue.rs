//! The admission queue's rule: who may wait, and in which order they run.
//!
//! A waiting request costs the session-cache rows it will hold once it
//! runs: its prompt tokens plus its output limit (already clamped to the
//! context, so never more than the context). The queue holds requests while
//! the sum of their costs stays within `max_tokens` (`--max-queue-tokens`)
//! and, when set, their number within `max_count` (`--max-queue`). The
//! bound is memory, not a count: many short requests wait where few long
//! ones would. Two rules keep it fair:
//!
//! - an empty queue takes any request, however large (a request bigger
//!   than the whole budget would otherwise never run; it waits alone), so
//!   a 503 always means someone else is waiting;
//! - the order is first in, first out: a lane that frees up takes the
//!   oldest request, so a long request is never overtaken by a stream of
//!   short ones, and short ones wait behind at most the requests that came
//!   before them.
//!
//! A continuation of an admitted turn (the second job of a reasoning
//! budget) is part of a turn the server already accepted: it is always
//! queued. Requests whose client left are dropped from the queue at once
//! (`remove`, `retain`), so they free their share immediately.

use std::collections::VecDeque;

/// The configured capacity.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueLimits {
    /// Session-cache rows (tokens) the waiting requests may reserve.
    pub max_tokens: usize,
    /// Waiting requests at most (`None`: only the token budget).
    pub max_count: Option<usize>,
}

/// Why a request was not queued.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Full {
    pub waiting: usize,
    pub reserved_tokens: usize,
}

/// The waiting requests, oldest first, with their costs.
#[derive(Debug)]
pub struct WaitQueue<T> {
    limits: QueueLimits,
    entries: VecDeque<(u64, usize, T)>,
    reserved: usize,
}

impl<T> WaitQueue<T> {
    pub fn new(limits: QueueLimits) -> Self {
        Self {
            limits,
            entries: VecDeque::new(),
            reserved: 0,
        }
    }

    pub fn limits(&self) -> QueueLimits {
        self.limits
    }

    /// Queue `item` (id `id`, `cost` tokens) at the back, or say why not.
    /// `always`: a continuation of an admitted turn.
    pub fn push(&mut self, id: u64, cost: usize, item: T, always: bool) -> Result<(), (Full, T)> {
        if !always && !self.entries.is_empty() {
            let over_tokens = self.reserved.saturating_add(cost) > self.limits.max_tokens;
            let over_count = self
                .limits
                .max_count
                .is_some_and(|n| self.entries.len() >= n);
            if over_tokens || over_count {
                return Err((self.full(), item));
            }
        }
        self.reserved += cost;
        self.entries.push_back((id, cost, item));
        Ok(())
    }

    /// The oldest waiting request.
    pub fn pop(&mut self) -> Option<(u64, T)> {
        let (id, cost, item) = self.entries.pop_front()?;
        self.reserved -= cost;
        Some((id, item))
    }

    /// Take request `id` out (its client left). Whether it was waiting.
    pub fn remove(&mut self, id: u64) -> Option<T> {
        let at = self.entries.iter().position(|(i, _, _)| *i == id)?;
        let (_, cost, item) = self.entries.remove(at)?;
        self.reserved -= cost;
        Some(item)
    }

    /// Keep only the requests `keep` accepts; returns how many left.
    pub fn retain(&mut self, mut keep: impl FnMut(&T) -> bool) -> usize {
        let before = self.entries.len();
        let mut reserved = 0;
        self.entries.retain(|(_, cost, item)| {
            let k = keep(item);
            if k {
                reserved += cost;
            }
            k
        });
        self.reserved = reserved;
        before - self.entries.len()
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Tokens the waiting requests reserve.
    pub fn reserved(&self) -> usize {
        self.reserved
    }

    fn full(&self) -> Full {
        Full {
            waiting: self.entries.len(),
            reserved_tokens: self.reserved,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn queue(max_tokens: usize, max_count: Option<usize>) -> WaitQueue<&'static str> {
        WaitQueue::new(QueueLimits {
            max_tokens,
            max_count,
        })
    }

    #[test]
    fn the_token_budget_bounds_the_queue_not_a_count() {
        let mut q = queue(100, None);
        for i in 0..10 {
            assert!(q.push(i, 10, "short", false).is_ok(), "request {i}");
        }
        assert_eq!(q.reserved(), 100);
        // Full only now: one token more does not fit.
        let Err((full, _)) = q.push(10, 1, "one more", false) else {
            panic!("over the budget")
        };
        assert_eq!(
            full,
            Full {
                waiting: 10,
                reserved_tokens: 100
            }
        );
        // A continuation of an admitted turn always waits.
        assert!(q.push(11, 50, "continuation", true).is_ok());
        // One leaving frees its share at once.
        assert_eq!(q.remove(3), Some("short"));
        assert_eq!(q.reserved(), 140);
        assert_eq!(q.remove(3), None);
    }

    #[test]
    fn an_empty_queue_takes_a_request_larger_than_the_budget() {
        let mut q = queue(100, None);
        assert!(q.push(0, 1000, "long", false).is_ok());
        assert!(q.push(1, 1, "short", false).is_err());
        assert_eq!(q.pop(), Some((0, "long")));
        assert!(q.push(1, 1, "short", false).is_ok());
    }

    #[test]
    fn the_count_cap_still_applies_when_set() {
        let mut q = queue(1 << 20, Some(2));
        assert!(q.push(0, 1, "a", false).is_ok());
        assert!(q.push(1, 1, "b", false).is_ok());
        assert!(q.push(2, 1, "c", false).is_err());
        // Even a cap of 0 lets one request wait when none does.
        let mut none = queue(1 << 20, Some(0));
        assert!(none.push(0, 1, "a", false).is_ok());
        assert!(none.push(1, 1, "b", false).is_err());
    }

    /// First in, first out, whatever the costs: a long request is not
    /// overtaken by the short ones behind it, nor the short ones by a long
    /// one that came later.
    #[test]
    fn order_is_first_come_first_served() {
        let mut q = queue(10_000, None);
        q.push(0, 10, "short 0", false).unwrap();
        q.push(1, 4000, "long 1", false).unwrap();
        for i in 2..6 {
            q.push(i, 10, "short", false).unwrap();
        }
        q.push(6, 4000, "long 6", false).unwrap();
        let order: Vec<u64> = std::iter::from_fn(|| q.pop().map(|(id, _)| id)).collect();
        assert_eq!(order, [0, 1, 2, 3, 4, 5, 6]);
        assert_eq!(q.reserved(), 0);
    }

    #[test]
    fn retain_drops_the_requests_whose_clients_left() {
        let mut q = queue(100, None);
        q.push(0, 30, "gone", false).unwrap();
        q.push(1, 30, "here", false).unwrap();
        q.push(2, 30, "gone", false).unwrap();
        assert_eq!(q.retain(|s| *s == "here"), 2);
        assert_eq!((q.len(), q.reserved()), (1, 30));
        assert!(q.push(3, 70, "fits again", false).is_ok());
    }
}
