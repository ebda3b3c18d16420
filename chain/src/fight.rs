//! Detecting another agent that keeps undoing our repairs ("fights"), and
//! bounding how often we repair while it does.
//!
//! Some agents rewrite the active config on their own schedule: Cilium with
//! `cni.exclusive=true` renames every foreign config away, Calico's init
//! container rewrites its file on every restart, AKS may reconcile its own.
//! Repairing each time is right (the state on disk is what counts), but
//! doing it in a tight loop only churns the conf dir, reloading the runtime
//! every time; so past a threshold repairs are rate-limited and a warning
//! names the likely cause.
//!
//! A fight is the same content being undone again and again: the history is
//! kept per file AND per digest of the content a repair started from. A primary that writes new content each time is no
//! fight, however often it writes: each new content is repaired at once.
//! Only the same content coming back repeatedly is rate-limited.
//!
//! [`FightHistory`] keeps it: on the monotonic clock in memory for the
//! long-lived installer ([`FightHistory::in_memory`]); on the wall clock for
//! the plugin, a process per ADD ([`FightHistory::new`]), whose history the
//! state crate (`linkerd_cni_state`) saves in the plugin's state dir between
//! ADDs, never in the conf dir.

use std::collections::{BTreeMap, VecDeque};
use std::path::Path;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Repairs of one file, in seconds on some clock, oldest first.
#[derive(Debug, Clone, Default, PartialEq)]
struct History(VecDeque<f64>);

impl History {
    fn prune(&mut self, now: f64, window: f64) {
        // Also drops times "in the future": the wall clock went back.
        self.0.retain(|&t| t <= now && now - t < window);
    }

    fn fighting(&self, threshold: u32) -> bool {
        self.0.len() >= threshold as usize
    }

    /// While the repairs within the window are a fight, the last one and
    /// the rate they are bounded to: one repair per `window / threshold`.
    fn limited(&self, now: f64, window: f64, threshold: u32) -> Option<(f64, f64)> {
        let mut h = self.clone();
        h.prune(now, window);
        let last = *h.0.back().filter(|_| h.fighting(threshold))?;
        Some((last, window / f64::from(threshold.max(1))))
    }

    fn allow(&self, now: f64, window: f64, threshold: u32) -> bool {
        self.limited(now, window, threshold)
            .is_none_or(|(last, interval)| now - last >= interval)
    }

    /// When [`History::allow`] turns true again, in seconds from `now`
    /// (zero when it is true now).
    fn wait(&self, now: f64, window: f64, threshold: u32) -> f64 {
        self.limited(now, window, threshold)
            .map_or(0.0, |(last, interval)| (last + interval - now).max(0.0))
    }

    fn record(&mut self, now: f64, window: f64, threshold: u32) -> bool {
        self.prune(now, window);
        self.0.push_back(now);
        // Only the last `threshold` matter.
        while self.0.len() > threshold as usize {
            self.0.pop_front();
        }
        self.fighting(threshold)
    }
}

fn warning(file: &Path, threshold: u32, window: Duration) -> String {
    let interval = window / threshold.max(1);
    let primary = primary_type(file)
        .map(|t| format!(", whose first plugin is {t:?}"))
        .unwrap_or_default();
    format!(
        "{}{primary} needed {threshold} repairs within {window:?}: another agent keeps rewriting it \
         without the linkerd-cni entry (for example Cilium with cni.exclusive=true, a primary CNI's \
         init container or a cloud provider's reconciler). Repairs of it are now limited to one \
         every {interval:?}; configure that agent to leave other plugins' entries in place (for \
         Cilium: cni.exclusive=false)",
        file.display()
    )
}

/// The type of the first plugin in the config `file` (a `.conflist`'s
/// `plugins`, or a single plugin's own): which CNI the rewriting agent
/// most likely belongs to.
fn primary_type(file: &Path) -> Option<String> {
    let v: serde_json::Value = serde_json::from_slice(&crate::scan::read_file(file).ok()?).ok()?;
    let first = v.get("plugins").and_then(|p| p.get(0)).unwrap_or(&v);
    Some(first.get("type")?.as_str()?.to_string())
}

/// The SHA-256 of a file's content, the key of a repair's history (empty
/// when it cannot be read: all unreadable states count as one).
pub fn content_sha256(path: &Path) -> String {
    super::scan::read_file(path)
        .map(|b| super::sha256::hex(&b))
        .unwrap_or_default()
}

/// The seconds a history counts in.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Clock {
    /// Since this instant: a history that lives as long as its process.
    Since(Instant),
    /// Since the epoch: a history that outlives a process once saved.
    Wall,
}

/// Repairs per file and content: holds a repair back while its content is
/// fought over, and says when a repair made it a fight.
#[derive(Debug, Clone, PartialEq)]
pub struct FightHistory {
    window: Duration,
    threshold: u32,
    clock: Clock,
    repairs: BTreeMap<String, History>,
}

impl FightHistory {
    /// A fight is `threshold` repairs of one content within `window`; on
    /// the wall clock, for a history saved between processes.
    pub fn new(window: Duration, threshold: u32) -> Self {
        FightHistory {
            window,
            threshold: threshold.max(1),
            clock: Clock::Wall,
            repairs: BTreeMap::new(),
        }
    }

    /// [`FightHistory::new`] on the monotonic clock, for a history kept in
    /// memory only: it also tells when a held-back repair is allowed.
    pub fn in_memory(window: Duration, threshold: u32) -> Self {
        FightHistory {
            clock: Clock::Since(Instant::now()),
            ..FightHistory::new(window, threshold)
        }
    }

    /// The history with these repair times (seconds since the epoch) per
    /// key, as [`FightHistory::times`] gave them; times not finite are no
    /// times.
    pub fn with_times(mut self, times: impl IntoIterator<Item = (String, Vec<f64>)>) -> Self {
        for (k, ts) in times {
            let ts = ts.into_iter().filter(|t| t.is_finite()).collect();
            self.repairs.insert(k, History(ts));
        }
        self
    }

    /// The repair times per key, oldest first.
    pub fn times(&self) -> impl Iterator<Item = (&str, Vec<f64>)> {
        self.repairs
            .iter()
            .map(|(k, h)| (k.as_str(), h.0.iter().copied().collect()))
    }

    fn secs(&self, now: Instant) -> f64 {
        match self.clock {
            Clock::Since(origin) => now.saturating_duration_since(origin).as_secs_f64(),
            Clock::Wall => SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_secs_f64())
                .unwrap_or_default(),
        }
    }
}

/// The history key of a file's content.
fn key(file: &Path, digest: &str) -> String {
    format!("{}#{digest}", file.to_string_lossy())
}

impl crate::RepairLimit for FightHistory {
    fn allow(&self, file: &Path, digest: &str, now: Instant) -> bool {
        self.repairs
            .get(&key(file, digest))
            .is_none_or(|h| h.allow(self.secs(now), self.window.as_secs_f64(), self.threshold))
    }

    /// In memory only: up to 2 ms after the exact time (rounded up, so that
    /// float rounding never gives a time at which `allow` still says no).
    fn next_allowed(&self, file: &Path, digest: &str, now: Instant) -> Option<Instant> {
        let Clock::Since(_) = self.clock else {
            return None;
        };
        let wait = self.repairs.get(&key(file, digest)).map_or(0.0, |h| {
            h.wait(self.secs(now), self.window.as_secs_f64(), self.threshold)
        });
        if wait <= 0.0 {
            return Some(now);
        }
        Some(now + Duration::from_millis((wait * 1000.0).ceil() as u64 + 1))
    }

    /// Only repairs of the same content count towards a fight; histories
    /// past the window are dropped, so the map stays small.
    fn record(&mut self, file: &Path, digest: &str, now: Instant) -> Option<String> {
        let (t, w) = (self.secs(now), self.window.as_secs_f64());
        self.repairs.retain(|_, h| {
            h.prune(t, w);
            !h.0.is_empty()
        });
        let fighting =
            self.repairs
                .entry(key(file, digest))
                .or_default()
                .record(t, w, self.threshold);
        fighting.then(|| warning(file, self.threshold, self.window))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::RepairLimit;

    /// The warning (and the installer's Event) names what the file runs
    /// first: the CNI whose agent most likely rewrites it.
    #[test]
    fn the_fight_warning_names_the_primary() {
        let d = crate::testutil::TempDir::new("fight-warning");
        let list = d.write("10-calico.conflist", testkit::chain::CALICO);
        let w = warning(&list, 3, Duration::from_secs(60));
        assert!(w.contains("whose first plugin is \"calico\""), "{w}");
        let single = d.write("10-flannel.conf", r#"{"type":"flannel","name":"cbr0"}"#);
        let w = warning(&single, 3, Duration::from_secs(60));
        assert!(w.contains("whose first plugin is \"flannel\""), "{w}");
        let gone = d.path().join("gone.conflist");
        let w = warning(&gone, 3, Duration::from_secs(60));
        assert!(
            w.starts_with(&format!("{} needed 3 repairs", gone.display())),
            "{w}"
        );
    }

    #[test]
    fn repeated_repairs_are_a_fight_and_get_rate_limited() {
        let f = Path::new("/x/10-calico.conflist");
        let mut d = FightHistory::in_memory(Duration::from_secs(60), 3);
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        assert!(d.allow(f, "c", at(0)));
        assert_eq!(d.record(f, "c", at(0)), None);
        assert_eq!(d.record(f, "c", at(1)), None);
        assert!(d.allow(f, "c", at(2)));
        let w = d
            .record(f, "c", at(2))
            .expect("third repair in a minute is a fight");
        assert!(w.contains("cni.exclusive"), "{w}");
        // One repair per 20 s while fighting.
        assert!(!d.allow(f, "c", at(3)));
        assert!(!d.allow(f, "c", at(21)));
        assert!(d.allow(f, "c", at(22)));
        // The next allowed time is the first at which `allow` holds.
        let next = d.next_allowed(f, "c", at(3)).unwrap();
        assert!(next >= at(22) && next <= at(22) + Duration::from_millis(2));
        assert!(d.allow(f, "c", next));
        assert!(!d.allow(f, "c", at(22) - Duration::from_millis(1)));
        assert_eq!(d.next_allowed(f, "c", at(30)).unwrap(), at(30));
        assert_eq!(
            d.next_allowed(Path::new("/x/other.conflist"), "c", at(3))
                .unwrap(),
            at(3)
        );
        // Another file is not affected.
        assert!(d.allow(Path::new("/x/other.conflist"), "c", at(3)));
        // Once the other agent stops, the window empties and limits go.
        assert!(d.allow(f, "c", at(200)));
        assert_eq!(d.record(f, "c", at(200)), None);
    }

    #[test]
    fn new_content_each_time_is_no_fight_the_same_content_again_is() {
        let f = Path::new("/x/10-calico.conflist");
        let mut d = FightHistory::in_memory(Duration::from_secs(60), 3);
        let t0 = Instant::now();
        // A primary writing new content every 200 ms: every repair allowed.
        for i in 0..100u64 {
            let now = t0 + Duration::from_millis(200 * i);
            let digest = format!("content-{i}");
            assert!(d.allow(f, &digest, now), "write {i}");
            assert_eq!(d.record(f, &digest, now), None, "write {i}");
        }
        // The same content undone again and again: a fight, rate-limited.
        let t1 = t0 + Duration::from_secs(30);
        let at = |ms: u64| t1 + Duration::from_millis(ms);
        assert_eq!(d.record(f, "same", at(0)), None);
        assert_eq!(d.record(f, "same", at(100)), None);
        assert!(d.record(f, "same", at(200)).is_some());
        assert!(!d.allow(f, "same", at(300)));
        // ...while a new content is still repaired at once.
        assert!(d.allow(f, "newer", at(300)));
        // Old histories are pruned: the map stays small.
        d.record(f, "late", t1 + Duration::from_secs(120));
        assert_eq!(d.repairs.len(), 1);
    }

    #[test]
    fn spaced_repairs_are_no_fight() {
        let f = Path::new("/x/a.conflist");
        let mut d = FightHistory::in_memory(Duration::from_secs(10), 2);
        let t0 = Instant::now();
        for i in 0..10 {
            let now = t0 + Duration::from_secs(11 * i);
            assert!(d.allow(f, "c", now));
            assert_eq!(d.record(f, "c", now), None);
        }
    }
}
