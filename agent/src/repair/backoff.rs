//! Backoff: per pod between deletions ([`Backoff`]), and for the watch
//! while the API server fails ([`Retry`]); and the installer's retries of
//! an API call ([`Policy::INSTALLER`]).
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

#[derive(Debug, Clone, Copy)]
struct Entry {
    attempts: u32,
    last: Instant,
}

/// The deletion history of each pod.
#[derive(Debug)]
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
            Some(e) => e.last + self.policy.nominal(e.attempts),
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

    fn expired(&self, e: &Entry, now: Instant) -> bool {
        now.saturating_duration_since(e.last) >= self.policy.max * 2
    }
}

impl Policy {
    /// The installer's retries of a failed API call (a TokenRequest, the
    /// startup taint's removal): the node waits on them (for the plugin's
    /// token, to be schedulable), so never long.
    pub const INSTALLER: Policy = Policy {
        initial: Duration::from_secs(5),
        max: Duration::from_secs(60),
    };

    /// `initial` doubled for each attempt after the first, at most `max`.
    pub fn nominal(&self, attempts: u32) -> Duration {
        let doublings = attempts.saturating_sub(1).min(31);
        self.initial.saturating_mul(1u32 << doublings).min(self.max)
    }
}

/// The waits between retries of the watch while the API server fails:
/// [`Policy::nominal`] of the consecutive failures, each cut to a random
/// point between half and all of it, so that the controllers of every node
/// do not hit a recovering API server in step. Reset by the caller on
/// progress (a listed pod, a watch event), not on the watcher's `Init`,
/// which comes before every list attempt.
#[derive(Debug)]
pub struct Retry {
    policy: Policy,
    failures: u32,
}

impl Retry {
    /// For the watch: from 1 s, as client-go's reflector starts, to 30 s.
    pub const WATCH: Policy = Policy {
        initial: Duration::from_secs(1),
        max: Duration::from_secs(30),
    };

    pub fn new(policy: Policy) -> Self {
        Retry {
            policy,
            failures: 0,
        }
    }

    /// Records a failure; the wait before the next attempt.
    pub fn failed(&mut self) -> Duration {
        self.failures = self.failures.saturating_add(1);
        jittered(self.policy.nominal(self.failures), random_fraction())
    }

    pub fn reset(&mut self) {
        self.failures = 0;
    }
}

/// `nominal` scaled to between half and all of it, by `fraction` in [0, 1].
fn jittered(nominal: Duration, fraction: f64) -> Duration {
    nominal.mul_f64(0.5 + 0.5 * fraction.clamp(0.0, 1.0))
}

/// A fraction in [0, 1] that differs between calls and processes: std's
/// hasher keys are random per process and change with each `RandomState`.
/// Jitter needs no better randomness, nor a dependency for it.
fn random_fraction() -> f64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(0);
    (h.finish() >> 11) as f64 / (1u64 << 53) as f64
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
        assert!(b.entries.is_empty());
        b.record(&"a", later);
        assert_eq!(
            b.ready_at(&"a", later),
            later + Duration::from_secs(10),
            "starts over at the initial delay"
        );
    }

    #[test]
    fn retries_double_with_jitter_up_to_the_cap_and_reset() {
        let mut r = Retry::new(policy());
        for nominal in [10, 20, 40, 60, 60, 60] {
            let nominal = Duration::from_secs(nominal);
            let d = r.failed();
            assert!(d >= nominal / 2 && d <= nominal, "{d:?} for {nominal:?}");
        }
        r.reset();
        let d = r.failed();
        assert!(d >= Duration::from_secs(5) && d <= Duration::from_secs(10));
        assert_eq!(
            jittered(Duration::from_secs(8), 0.0),
            Duration::from_secs(4)
        );
        assert_eq!(
            jittered(Duration::from_secs(8), 1.0),
            Duration::from_secs(8)
        );
        // Random: 53 bits each; equal draws would be a broken source.
        let draws: std::collections::HashSet<u64> =
            (0..16).map(|_| random_fraction().to_bits()).collect();
        assert!(draws.len() > 1);
        assert!(
            (0..100)
                .map(|_| random_fraction())
                .all(|f| (0.0..1.0).contains(&f))
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
