//! The plugin's repair history between ADDs: the keeper's wall-clock
//! [`FightHistory`] (how often one content of one file was repaired), kept
//! as the record [`RepairTimes`] in [`FIGHT_STATE_FILE`] in the plugin's
//! state dir. The plugin is a process per ADD; without the file it could
//! not tell another agent undoing its repairs again and again from a
//! one-off.
//!
//! Best effort throughout: losing it only delays detection. A repair is
//! recorded by an update of the record under the state dir's lock
//! ([`crate::record::update`]), so that concurrent ADDs each leave theirs.
//! Loaded on first use: an ADD that repairs nothing never reads it.

use std::cell::OnceCell;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use linkerd_cni_chain::{FightHistory, RepairLimit};
use serde_json::{Map, Value};

use crate::record::{self, Record};

/// The history file in the plugin's state dir.
pub const FIGHT_STATE_FILE: &str = "chain-repairs.json";

/// At most this many files' histories are read back...
const MAX_HISTORIES: usize = 1024;
/// ...each of at most this many repairs (far above any threshold).
const MAX_HISTORY_LEN: usize = 64;
/// The longest a repair's record waits for another ADD's update.
const LOCK_WAIT: Duration = Duration::from_secs(1);

/// The record: repair times (seconds since the epoch) per file and content.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RepairTimes(pub Vec<(String, Vec<f64>)>);

impl Record for RepairTimes {
    const FILE: &'static str = FIGHT_STATE_FILE;
    const VERSION: u64 = 1;

    fn to_json(&self) -> Map<String, Value> {
        self.0
            .iter()
            .map(|(k, ts)| (k.clone(), ts.iter().map(|&t| Value::from(t)).collect()))
            .collect()
    }

    /// Bounded: a history holds the last `threshold` repairs of the few
    /// files and contents one node has; times not finite are no times.
    fn from_json(m: Map<String, Value>) -> Result<Self, String> {
        Ok(RepairTimes(
            m.into_iter()
                .take(MAX_HISTORIES)
                .filter_map(|(k, v)| {
                    let Value::Array(ts) = v else { return None };
                    let ts: Vec<f64> = ts
                        .iter()
                        .filter_map(Value::as_f64)
                        .filter(|t| t.is_finite())
                        .collect();
                    let skip = ts.len().saturating_sub(MAX_HISTORY_LEN);
                    Some((k, ts[skip..].to_vec()))
                })
                .collect(),
        ))
    }
}

/// The plugin's history, read on first use and saved after each record.
#[derive(Debug, Clone)]
pub struct PersistedFights {
    dir: PathBuf,
    window: Duration,
    threshold: u32,
    history: OnceCell<FightHistory>,
}

impl PersistedFights {
    /// The history saved in `state_dir`; empty when absent or unreadable.
    /// Read on first use.
    pub fn load(state_dir: &Path, window: Duration, threshold: u32) -> Self {
        PersistedFights {
            dir: state_dir.to_path_buf(),
            window,
            threshold,
            history: OnceCell::new(),
        }
    }

    fn history_of(&self, times: RepairTimes) -> FightHistory {
        FightHistory::new(self.window, self.threshold).with_times(times.0)
    }

    fn history(&self) -> &FightHistory {
        self.history
            .get_or_init(|| self.history_of(record::read_or_default(&self.dir)))
    }
}

impl RepairLimit for PersistedFights {
    fn allow(&self, file: &Path, digest: &str, now: Instant) -> bool {
        self.history().allow(file, digest, now)
    }

    /// An update of the saved history (read again, under the state dir's
    /// lock). A history that cannot be saved is kept in memory for this
    /// process.
    fn record(&mut self, file: &Path, digest: &str, now: Instant) -> Option<String> {
        let updated = record::update(&self.dir, LOCK_WAIT, |times: &mut RepairTimes| {
            let mut h = self.history_of(std::mem::take(times));
            let warning = h.record(file, digest, now);
            *times = RepairTimes(h.times().map(|(k, ts)| (k.to_string(), ts)).collect());
            (h, warning)
        });
        match updated {
            Ok((h, warning)) => {
                self.history = OnceCell::from(h);
                warning
            }
            Err(e) => {
                log::debug!("the repair history not saved: {e}");
                self.history();
                let h = self.history.get_mut().expect("initialised just above");
                h.record(file, digest, now)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    #[test]
    fn persisted_history_is_per_content() {
        let dir = std::env::temp_dir().join(format!("lcni-fight-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        let f = Path::new("/x/a.conflist");
        let mut p = PersistedFights::load(&dir, Duration::from_secs(600), 2);
        assert_eq!(p.record(f, "one", Instant::now()), None);
        assert_eq!(p.record(f, "two", Instant::now()), None);
        let mut p = PersistedFights::load(&dir, Duration::from_secs(600), 2);
        assert!(p.allow(f, "three", Instant::now()));
        assert!(p.record(f, "one", Instant::now()).is_some());
        assert!(!p.allow(f, "one", Instant::now()));
        assert!(p.allow(f, "four", Instant::now()));
        let _ = fs::remove_dir_all(&dir);
    }

    /// The persisted history holds a repair back only when it is root's
    /// own file: another's (or one anyone may write) claiming a fight is
    /// no history.
    #[test]
    fn a_persisted_history_that_is_not_roots_own_is_ignored() {
        use std::os::unix::fs::PermissionsExt;
        testkit::require_root("chown");
        let tmp = crate::testutil::TempDir::new("fight-owner");
        let f = Path::new("/x/a.conflist");
        let mut p = PersistedFights::load(tmp.path(), Duration::from_secs(600), 2);
        assert_eq!(p.record(f, "one", Instant::now()), None);
        assert!(p.record(f, "one", Instant::now()).is_some());
        let file = tmp.path().join(FIGHT_STATE_FILE);
        let fighting = || {
            !PersistedFights::load(tmp.path(), Duration::from_secs(600), 2).allow(
                f,
                "one",
                Instant::now(),
            )
        };
        assert!(fighting(), "root's own history holds the repair back");
        fs::set_permissions(&file, fs::Permissions::from_mode(0o666)).unwrap();
        assert!(!fighting(), "writable by others");
        fs::set_permissions(&file, fs::Permissions::from_mode(0o600)).unwrap();
        std::os::unix::fs::chown(&file, Some(1000), None).unwrap();
        assert!(!fighting(), "owned by uid 1000");
    }
}
