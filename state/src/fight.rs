//! The plugin's repair history between ADDs: the keeper's wall-clock
//! [`FightHistory`] (how often one content of one file was repaired), kept
//! in [`FIGHT_STATE_FILE`] in the plugin's state dir. The plugin is a
//! process per ADD; without the file it could not tell another agent
//! undoing its repairs again and again from a one-off.
//!
//! Best effort throughout: losing it only delays detection. To record a
//! repair, load and record while still holding the conf-dir lock the repair
//! took (the keeper does: [`RepairLimit::record`]): the file is read,
//! updated and replaced as a whole, so two plugins doing that concurrently
//! would lose one record. Loaded on first use: an ADD that repairs nothing
//! never reads it.

use std::cell::OnceCell;
use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use linkerd_cni_chain::{FightHistory, RepairLimit};
use serde_json::Value;

/// The history file in the plugin's state dir.
pub const FIGHT_STATE_FILE: &str = "chain-repairs.json";

/// At most this many files' histories are read back...
const MAX_HISTORIES: usize = 1024;
/// ...each of at most this many repairs (far above any threshold).
const MAX_HISTORY_LEN: usize = 64;

/// The plugin's history, read on first use and saved after each record.
#[derive(Debug, Clone)]
pub struct PersistedFights {
    path: PathBuf,
    window: Duration,
    threshold: u32,
    history: OnceCell<FightHistory>,
}

impl PersistedFights {
    /// The history saved in `state_dir`; empty when absent or unreadable.
    /// Read on first use.
    pub fn load(state_dir: &Path, window: Duration, threshold: u32) -> Self {
        PersistedFights {
            path: state_dir.join(FIGHT_STATE_FILE),
            window,
            threshold,
            history: OnceCell::new(),
        }
    }

    /// Forgets what was read: the next use reads the file again.
    pub fn reload(&mut self) {
        self.history = OnceCell::new();
    }

    fn history(&self) -> &FightHistory {
        self.history
            .get_or_init(|| read_history(&self.path, self.window, self.threshold))
    }

    /// Whether a repair of `file` from content with `digest` is allowed now.
    pub fn allow_of(&self, file: &Path, digest: &str) -> bool {
        self.history().allow_of(file, digest)
    }

    /// Records a repair of `file` from content with `digest` and saves;
    /// the warning when it is a fight.
    pub fn record_of(&mut self, file: &Path, digest: &str) -> Option<String> {
        self.history();
        let history = self.history.get_mut().expect("initialised just above");
        let warning = history.record_of(file, digest);
        if let Err(e) = self.save() {
            log::debug!("cannot save {}: {e}", self.path.display());
        }
        warning
    }

    fn save(&self) -> Result<(), linkerd_cni_chain::ChainError> {
        let dir = self.path.parent().unwrap_or(Path::new("."));
        fs::create_dir_all(dir)
            .map_err(|e| linkerd_cni_chain::ChainError::io("create the state dir", dir, e))?;
        let m: serde_json::Map<String, Value> = self
            .history()
            .times()
            .map(|(k, ts)| (k.to_string(), ts.into_iter().map(Value::from).collect()))
            .collect();
        let text = Value::Object(m).to_string();
        linkerd_cni_chain::write::write_atomic(&self.path, text.as_bytes(), 0o600)
    }
}

impl RepairLimit for PersistedFights {
    fn allow(&self, file: &Path, digest: &str, _: Instant) -> bool {
        self.allow_of(file, digest)
    }

    fn next_allowed(&self, _: &Path, _: &str, _: Instant) -> Option<Instant> {
        None
    }

    /// Reloads the history first: it is read, updated and saved under the
    /// lock, so concurrent ADDs each leave their record.
    fn record(&mut self, file: &Path, digest: &str, _: Instant) -> Option<String> {
        self.reload();
        self.record_of(file, digest)
    }
}

/// The history in `path`; empty when absent or unreadable.
fn read_history(path: &Path, window: Duration, threshold: u32) -> FightHistory {
    let history = FightHistory::new(window, threshold);
    let bytes = match crate::statefile::read(path) {
        Ok(b) => b,
        Err(e) => {
            if e.kind() != std::io::ErrorKind::NotFound {
                log::warn!("the repair history {}: {e}", path.display());
            }
            return history;
        }
    };
    let Ok(Value::Object(m)) = serde_json::from_slice::<Value>(&bytes) else {
        return history;
    };
    // Bounded: a history holds the last `threshold` repairs of the few
    // files and contents one node has.
    history.with_times(m.into_iter().take(MAX_HISTORIES).filter_map(|(k, v)| {
        let Value::Array(ts) = v else { return None };
        let ts: Vec<f64> = ts
            .iter()
            .filter_map(Value::as_f64)
            .filter(|t| t.is_finite())
            .collect();
        let skip = ts.len().saturating_sub(MAX_HISTORY_LEN);
        Some((k, ts[skip..].to_vec()))
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn persisted_history_is_per_content() {
        let dir = std::env::temp_dir().join(format!("lcni-fight-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        let f = Path::new("/x/a.conflist");
        let mut p = PersistedFights::load(&dir, Duration::from_secs(600), 2);
        assert_eq!(p.record_of(f, "one"), None);
        assert_eq!(p.record_of(f, "two"), None);
        let mut p = PersistedFights::load(&dir, Duration::from_secs(600), 2);
        assert!(p.allow_of(f, "three"));
        assert!(p.record_of(f, "one").is_some());
        assert!(!p.allow_of(f, "one"));
        assert!(p.allow_of(f, "four"));
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
        assert_eq!(p.record_of(f, "one"), None);
        assert!(p.record_of(f, "one").is_some());
        let file = tmp.path().join(FIGHT_STATE_FILE);
        let fighting =
            || !PersistedFights::load(tmp.path(), Duration::from_secs(600), 2).allow_of(f, "one");
        assert!(fighting(), "root's own history holds the repair back");
        fs::set_permissions(&file, fs::Permissions::from_mode(0o666)).unwrap();
        assert!(!fighting(), "writable by others");
        fs::set_permissions(&file, fs::Permissions::from_mode(0o600)).unwrap();
        std::os::unix::fs::chown(&file, Some(1000), None).unwrap();
        assert!(!fighting(), "owned by uid 1000");
    }
}
