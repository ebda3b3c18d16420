//! Chain integrity: keeping linkerd-cni's entry last in the node's active
//! network config, from the state on disk (never from watch events).
//!
//! Shared by the plugin (checks on every ADD, repairs within a budget), the
//! installer (reconciles at start, on a timer and on events) and the `chain`
//! CLI. This module owns:
//!
//! - which file is active, exactly as containerd picks it ([`scan`]);
//! - the typed diagnosis of that file ([`ChainState`], [`Diagnosis`]);
//! - the repair: text-preserving edit ([`plan`], [`text`]), crash-safe write
//!   ([`write`]) under the conf-dir lock ([`lock`]), safe against concurrent
//!   writers that do not take our lock ([`repair`]);
//! - the desired entry, persisted by the installer in [`ENTRY_FILE`];
//! - detection of another agent fighting our repairs ([`FightDetector`]);
//! - the plugin's invocation-time healing ([`heal_on_add`]);
//! - owned mode, where linkerd-cni keeps a conflist of its own ([`owned`]).

mod error;
pub(crate) mod fight;
mod heal;
mod lock;
pub mod owned;
mod plan;
mod repair;
mod scan;
mod sha256;
mod text;
mod write;

use std::fmt;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use serde_json::{Map, Value};

pub use error::ChainError;
pub use fight::{FightDetector, content_digest};
pub use heal::{entry_from_stdin, heal_on_add};
pub use repair::{RepairOptions, RepairReport, remove_entries, repair};
pub use scan::{CONFIG_EXTENSIONS, is_config_name};
pub use write::TEMP_PREFIX;

use scan::Kind;

/// `"type"` of our entry in a conflist's `plugins`.
pub const PLUGIN_TYPE: &str = "linkerd-cni";

/// The persisted desired entry, in the conf dir, under a name no runtime
/// loads (no `.conf`/`.conflist`/`.json` extension). JSON object text.
pub const ENTRY_FILE: &str = "ZZZ-linkerd-cni-entry";

/// A plugin object of a conflist.
pub type Entry = Map<String, Value>;

/// Checks that `entry` is one of ours: otherwise a repair would append an
/// entry it then fails to recognise, again and again.
pub fn validate_entry(entry: &Entry, origin: &str) -> Result<(), ChainError> {
    match entry.get("type") {
        Some(Value::String(t)) if t == PLUGIN_TYPE => Ok(()),
        other => Err(ChainError::InvalidEntry {
            origin: origin.to_string(),
            reason: format!(
                "\"type\" must be {PLUGIN_TYPE:?}, found {}",
                other.map_or("nothing".to_string(), Value::to_string)
            ),
        }),
    }
}

/// Parses an entry from JSON text (the entry file, `--entry FILE`).
pub fn parse_entry(bytes: &[u8], origin: &str) -> Result<Entry, ChainError> {
    let invalid = |reason: String| ChainError::InvalidEntry {
        origin: origin.to_string(),
        reason,
    };
    match serde_json::from_slice::<Value>(bytes) {
        Ok(Value::Object(m)) => {
            validate_entry(&m, origin)?;
            Ok(m)
        }
        Ok(_) => Err(invalid("not a JSON object".into())),
        Err(e) => Err(invalid(format!("not valid JSON: {e}"))),
    }
}

/// Reads [`ENTRY_FILE`] from `conf_dir`; `Ok(None)` when absent.
pub fn load_entry(conf_dir: &Path) -> Result<Option<Entry>, ChainError> {
    let path = conf_dir.join(ENTRY_FILE);
    match scan::read_file(&path) {
        Ok(bytes) => parse_entry(&bytes, &path.display().to_string()).map(Some),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(ChainError::io("read", path, e)),
    }
}

/// Writes [`ENTRY_FILE`] (temp, fsync, rename, under the conf-dir lock), only
/// when its content would change. Returns whether it wrote.
pub fn persist_entry(conf_dir: &Path, entry: &Entry) -> Result<bool, ChainError> {
    validate_entry(entry, "the entry to persist")?;
    let path = conf_dir.join(ENTRY_FILE);
    let _lock = lock::lock_dir(conf_dir, RepairOptions::default().lock_timeout, None)?;
    match load_entry(conf_dir) {
        Ok(Some(old)) if old == *entry => return Ok(false),
        // Unreadable or invalid: replaced below.
        _ => {}
    }
    let mut text = serde_json::to_string_pretty(entry)
        .map_err(|e| ChainError::io("serialize", &path, io::Error::other(e)))?;
    text.push('\n');
    let like = fs::metadata(&path).ok();
    let tmp = write::write_temp(conf_dir, text.as_bytes(), like.as_ref())
        .map_err(|e| ChainError::io("write a temp file in", conf_dir, e))?;
    if let Err(e) = fs::rename(&tmp, &path) {
        let _ = fs::remove_file(&tmp);
        return Err(ChainError::io("rename a temp file to", path, e));
    }
    write::fsync_dir(conf_dir).map_err(|e| ChainError::io("fsync", conf_dir, e))?;
    Ok(true)
}

/// Removes [`ENTRY_FILE`] (uninstall). `Ok(false)` when it was absent.
pub fn remove_entry_file(conf_dir: &Path) -> Result<bool, ChainError> {
    let path = conf_dir.join(ENTRY_FILE);
    match fs::remove_file(&path) {
        Ok(()) => {
            write::fsync_dir(conf_dir).map_err(|e| ChainError::io("fsync", conf_dir, e))?;
            Ok(true)
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(ChainError::io("remove", path, e)),
    }
}

/// The state of the active config, as far as linkerd-cni is concerned.
/// Positions are 0-based indices into the chain's `plugins`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChainState {
    /// One linkerd-cni entry, last, equal to the desired one.
    Healthy,
    /// No config file at all: the primary CNI has not written its own yet.
    NoPrimaryConfig,
    /// The active config holds no plugin but linkerd-cni: not a primary's.
    NoPrimaryPlugin,
    /// The active file cannot be read or is not a config the runtime can
    /// load. Never touched: it is reported for its owner to fix.
    Invalid { reason: String },
    /// The active file is a single-plugin `.conf` (or `.json`): it must
    /// become a `.conflist` to hold a chain.
    SingleConf,
    /// No linkerd-cni entry in the chain.
    Missing,
    /// One entry, not last.
    NotLast { position: usize, len: usize },
    /// Several entries.
    Duplicated { positions: Vec<usize>, len: usize },
    /// One entry, last, but different from the desired one in `keys`.
    Stale { position: usize, keys: Vec<String> },
}

impl ChainState {
    /// Whether [`repair`] would rewrite the active file.
    pub fn is_repairable(&self) -> bool {
        matches!(
            self,
            ChainState::SingleConf
                | ChainState::Missing
                | ChainState::NotLast { .. }
                | ChainState::Duplicated { .. }
                | ChainState::Stale { .. }
        )
    }

    /// What is wrong, for people.
    pub fn describe(&self) -> String {
        match self {
            ChainState::Healthy => "healthy: the linkerd-cni entry is last and up to date".into(),
            ChainState::NoPrimaryConfig => {
                "no network config yet (no *.conf, *.conflist or *.json file)".into()
            }
            ChainState::NoPrimaryPlugin => {
                "the active config holds no plugin but linkerd-cni (not a primary CNI's config)"
                    .into()
            }
            ChainState::Invalid { reason } => format!("the active config is unusable: {reason}"),
            ChainState::SingleConf => {
                "the active config is a single-plugin file, which cannot hold a chain".into()
            }
            ChainState::Missing => "the linkerd-cni entry is missing".into(),
            ChainState::NotLast { position, len } => format!(
                "the linkerd-cni entry is plugin {} of {len}, not last",
                position + 1
            ),
            ChainState::Duplicated { positions, len } => format!(
                "{} linkerd-cni entries, at plugins {} of {len}",
                positions.len(),
                positions
                    .iter()
                    .map(|p| (p + 1).to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            ChainState::Stale { position, keys } => format!(
                "the linkerd-cni entry (plugin {}) differs from the desired one in {}",
                position + 1,
                keys.iter()
                    .map(|k| format!("{k:?}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        }
    }
}

impl fmt::Display for ChainState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.describe())
    }
}

/// A read-only diagnosis of a conf dir.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Diagnosis {
    /// The active config file, if any.
    pub active: Option<PathBuf>,
    pub state: ChainState,
    /// Non-active config files holding linkerd-cni entries (left by an old
    /// install, or a primary that copied its config): reported, and removed
    /// only on uninstall.
    pub stray: Vec<PathBuf>,
    /// Our temp files, left by a repair that was killed (or in progress).
    pub leftovers: Vec<PathBuf>,
    /// `type` of each plugin of the active chain, in order.
    pub plugins: Vec<String>,
}

impl Diagnosis {
    /// Healthy chain and no leftovers to clean: nothing for [`repair`] to do.
    pub fn is_healthy(&self) -> bool {
        self.state == ChainState::Healthy && self.leftovers.is_empty()
    }

    /// Whether [`repair`] has anything to do (rewrite or clean up).
    pub fn needs_repair(&self) -> bool {
        self.state.is_repairable() || !self.leftovers.is_empty()
    }

    /// The file a `.conf` becomes.
    fn conflist_for(active: &Path) -> PathBuf {
        active.with_extension("conflist")
    }

    /// What [`repair`] would do, for people.
    pub fn remedy(&self) -> String {
        let name = |p: &Path| {
            p.file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default()
        };
        let active = self.active.as_deref().unwrap_or(Path::new("?"));
        let len = self.plugins.len();
        match &self.state {
            ChainState::Healthy => "nothing".into(),
            ChainState::NoPrimaryConfig | ChainState::NoPrimaryPlugin => {
                "nothing: linkerd-cni never writes a config of its own; it joins the chain once the primary CNI has written its config".into()
            }
            ChainState::Invalid { .. } => {
                "nothing: the file is left for its owner to fix (until then containerd cannot load any network)".into()
            }
            ChainState::SingleConf => format!(
                "write {} holding this plugin (same \"name\" and \"cniVersion\") followed by the linkerd-cni entry, then remove {}",
                name(&Self::conflist_for(active)),
                name(active)
            ),
            ChainState::Missing => {
                format!("append the linkerd-cni entry (plugin {} of {})", len + 1, len + 1)
            }
            ChainState::NotLast { .. } => {
                format!("move the linkerd-cni entry to the end (plugin {len} of {len}), up to date")
            }
            ChainState::Duplicated { positions, .. } => {
                let n = len + 1 - positions.len();
                format!("keep a single up-to-date linkerd-cni entry, last (plugin {n} of {n})")
            }
            ChainState::Stale { .. } => "replace the entry with the desired one".into(),
        }
    }
}

impl fmt::Display for Diagnosis {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.active {
            Some(a) => writeln!(f, "active config: {}", a.display())?,
            None => writeln!(f, "active config: none")?,
        }
        if !self.plugins.is_empty() {
            writeln!(f, "chain:         {}", self.plugins.join(" -> "))?;
        }
        writeln!(f, "state:         {}", self.state)?;
        if !self.is_healthy() {
            let mut remedy = match self.state {
                ChainState::Healthy => String::new(),
                _ => self.remedy(),
            };
            if !self.leftovers.is_empty() {
                if !remedy.is_empty() {
                    remedy.push_str("; ");
                }
                remedy.push_str("remove the leftover temp files");
            }
            writeln!(f, "repair would:  {remedy}")?;
        }
        for s in &self.stray {
            writeln!(
                f,
                "note:          {} (not active) also holds a linkerd-cni entry; repair leaves it, uninstall removes it",
                s.display()
            )?;
        }
        for l in &self.leftovers {
            writeln!(
                f,
                "note:          {} is left over from an interrupted repair",
                l.display()
            )?;
        }
        Ok(())
    }
}

/// Read-only diagnosis of the active config (no lock, no write).
pub fn diagnose(conf_dir: &Path, desired: &Entry) -> Result<Diagnosis, ChainError> {
    validate_entry(desired, "the desired entry")?;
    let listing = scan::list(conf_dir)?;
    Ok(diagnose_listing(&listing, desired).0)
}

/// The diagnosis, and the active file's bytes as read (the base a repair
/// computes from).
pub(crate) fn diagnose_listing(
    listing: &scan::Listing,
    desired: &Entry,
) -> (Diagnosis, Option<Vec<u8>>) {
    let mut d = Diagnosis {
        active: listing.configs.first().cloned(),
        state: ChainState::NoPrimaryConfig,
        stray: vec![],
        leftovers: listing.leftovers.clone(),
        plugins: vec![],
    };
    let mut base = None;
    if let Some(active) = &d.active {
        match scan::read_file(active) {
            Ok(bytes) => {
                let a = plan::analyze(Kind::of(active), &bytes, desired);
                d.state = a.state;
                d.plugins = a.plugins;
                base = Some(bytes);
            }
            Err(e) => {
                d.state = ChainState::Invalid {
                    reason: format!("cannot read it: {e}"),
                }
            }
        }
    }
    for other in listing.configs.iter().skip(1) {
        if holds_entry(other) {
            d.stray.push(other.clone());
        }
    }
    (d, base)
}

/// Whether a (non-active) config file holds a linkerd-cni entry.
fn holds_entry(path: &Path) -> bool {
    let Ok(bytes) = scan::read_file(path) else {
        return false;
    };
    // Cheap filter first: most files never mention us.
    if !bytes
        .windows(PLUGIN_TYPE.len())
        .any(|w| w == PLUGIN_TYPE.as_bytes())
    {
        return false;
    }
    match plan::parse(Kind::of(path), &bytes) {
        Ok(top) => match Kind::of(path) {
            Kind::List => top
                .get("plugins")
                .and_then(Value::as_array)
                .is_some_and(|p| p.iter().any(plan::is_ours)),
            Kind::Single => plan::is_ours(&Value::Object(top)),
        },
        Err(_) => false,
    }
}

#[cfg(test)]
mod tests;
#[cfg(test)]
pub(crate) mod testutil;
