//! Per-pod backoff between deletions.
//!
//! Keyed by namespace and name, not by UID: a StatefulSet recreates a pod
//! under the same name, and if that pod fails again (the validator can fail
//! for reasons the chain check cannot see) the controller must slow down
//! instead of deleting it on every restart of its init container. The
//! first deletion of a pod is never delayed.

use std::collections::HashMap;
use std::time::Duration;

use tokio::time::Instant;

/// Delays between deletions of the same pod: `initial`, then doubling, at
/// most `max`. A pod not deleted for `2 * max` starts over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Policy {
    pub initial: Duration,
    pub max: Duration,
}

impl Default for Policy {
    fn default() -> Self {
        Policy {
            initial: Duration::from_secs(10),
            max: Duration::from_secs(300),
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Entry {
    attempts: u32,
    last: Instant,
}

/// The deletion history of each pod.
#[derive(Debug, Default)]
pub struct Backoff<K> {
    policy: Policy,
    entries: HashMap<K, Entry>,
}

impl<K: std::hash::Hash + Eq + Clone> Backoff<K> {
    pub fn new(policy: Policy) -> Self {
        Backoff {
            policy,
            entries: HashMap::new(),
        }
    }

    /// The earliest time `key` may be deleted (now or in the past when it
    /// may go at once).
    pub fn ready_at(&self, key: &K, now: Instant) -> Instant {
        match self.entries.get(key) {
            None => now,
            Some(e) if self.expired(e, now) => now,
            Some(e) => e.last + self.delay(e.attempts),
        }
    }

    /// Records a deletion attempt of `key` at `now` (successful or not).
    pub fn record(&mut self, key: &K, now: Instant) {
        let attempts = match self.entries.get(key) {
            Some(e) if !self.expired(e, now) => e.attempts.saturating_add(1),
            _ => 1,
        };
        self.entries.insert(
            key.clone(),
            Entry {
                attempts,
                last: now,
            },
        );
    }

    /// Forgets pods not deleted for long, so the map stays as small as the
    /// set of pods that failed recently.
    pub fn prune(&mut self, now: Instant) {
        let policy = self.policy;
        self.entries
            .retain(|_, e| now.saturating_duration_since(e.last) < policy.max * 2);
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    fn expired(&self, e: &Entry, now: Instant) -> bool {
        now.saturating_duration_since(e.last) >= self.policy.max * 2
    }

    /// The wait after `attempts` deletions.
    fn delay(&self, attempts: u32) -> Duration {
        let doublings = attempts.saturating_sub(1).min(31);
        self.policy
            .initial
            .saturating_mul(1u32 << doublings)
            .min(self.policy.max)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> Policy {
        Policy {
            initial: Duration::from_secs(10),
            max: Duration::from_secs(60),
        }
    }

    #[test]
    fn first_deletion_is_immediate_then_doubles_up_to_max() {
        let t0 = Instant::now();
        let mut b = Backoff::new(policy());
        assert_eq!(b.ready_at(&"a", t0), t0);
        let mut now = t0;
        for expected in [10, 20, 40, 60, 60] {
            b.record(&"a", now);
            assert_eq!(b.ready_at(&"a", now), now + Duration::from_secs(expected));
            now += Duration::from_secs(expected);
        }
        // Other pods are not affected.
        assert_eq!(b.ready_at(&"b", now), now);
    }

    #[test]
    fn quiet_pods_start_over_and_are_pruned() {
        let t0 = Instant::now();
        let mut b = Backoff::new(policy());
        b.record(&"a", t0);
        b.record(&"a", t0 + Duration::from_secs(10));
        let later = t0 + Duration::from_secs(10 + 120);
        assert_eq!(b.ready_at(&"a", later), later);
        b.prune(later);
        assert!(b.is_empty());
        b.record(&"a", later);
        assert_eq!(
            b.ready_at(&"a", later),
            later + Duration::from_secs(10),
            "starts over at the initial delay"
        );
    }

    #[test]
    fn huge_attempt_counts_do_not_overflow() {
        let t0 = Instant::now();
        let mut b = Backoff::new(policy());
        for _ in 0..100 {
            b.record(&"a", t0);
        }
        assert_eq!(b.ready_at(&"a", t0), t0 + Duration::from_secs(60));
    }
}
