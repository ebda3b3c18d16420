//! Chain integrity: keeping linkerd-cni's entry last in the node's active
//! network config, from the state on disk (never from watch events).
//!
//! Shared by the plugin (checks on every ADD, repairs within a budget), the
//! installer (reconciles at start, on a timer and on events) and the plugin
//! binary's `chain` CLI. A crate of its own so that the installer gets it
//! without the plugin's Kubernetes client, TLS and YAML: it needs only the
//! file system. This crate owns:
//!
//! - which file is active, exactly as containerd picks it (`scan`,
//!   [`is_config_name`]);
//! - the typed diagnosis of that file ([`ChainState`], [`Diagnosis`]);
//! - the repair: text-preserving edit (`plan`, `text`), crash-safe write
//!   ([`mod@write`], also the installer's for its binaries and kubeconfig)
//!   under the conf-dir lock ([`lock_dir`]), safe against concurrent
//!   writers that do not take our lock ([`repair()`]);
//! - the desired entry ([`Entry`], which is always one of ours), persisted
//!   by the installer in [`ENTRY_FILE`];
//! - detection of another agent fighting our repairs ([`FightDetector`],
//!   and [`PersistedFights`] for the short-lived plugin);
//! - owned mode, where linkerd-cni keeps a conflist of its own ([`owned`]);
//! - the installer's heartbeat in the plugin's state dir, which tells the
//!   plugin whether an installer is alive to rewrite rejected credentials
//!   ([`heartbeat`]);
//! - the plugin's ADD outcome counters in its state dir ([`outcomes`]),
//!   which the installer exports.

mod entry;
mod error;
mod fight;
pub mod heartbeat;
mod lock;
pub mod outcomes;
pub mod owned;
mod plan;
mod repair;
mod scan;
mod sha256;
mod text;
pub mod write;

use std::fmt;
use std::path::{Path, PathBuf};

use serde_json::Value;

pub use entry::{ENTRY_FILE, Entry, PLUGIN_TYPE, load_entry, persist_entry, remove_entry_file};
pub use error::{ChainError, EntryProblem};
pub use fight::{FIGHT_STATE_FILE, FightDetector, PersistedFights, content_digest};
pub use lock::{DirLock, lock_dir};
pub use repair::{RepairOptions, RepairReport, remove_entries, repair, repair_locked};
pub use scan::{CONFIG_EXTENSIONS, is_config_name};
pub use write::TEMP_PREFIX;

use scan::Kind;

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
    /// Why a repair will not rewrite the active config although its state
    /// calls for it (a symlink leading outside the conf dir).
    pub refused: Option<String>,
}

impl Diagnosis {
    /// Healthy chain and no leftovers to clean: nothing for [`repair`] to do.
    pub fn is_healthy(&self) -> bool {
        self.state == ChainState::Healthy && self.leftovers.is_empty()
    }

    /// Whether [`repair`] has anything to do (rewrite or clean up).
    pub fn needs_repair(&self) -> bool {
        (self.state.is_repairable() && self.refused.is_none()) || !self.leftovers.is_empty()
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
        if let (Some(why), true) = (&self.refused, self.state.is_repairable()) {
            return format!("nothing: {why}");
        }
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
        if let (Some(why), true) = (&self.refused, self.state.is_repairable()) {
            writeln!(f, "refused:       will not rewrite it: {why}")?;
        }
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

/// Read-only diagnosis of the active config (no lock, no write), as the
/// plugin on the host sees it with default options.
pub fn diagnose(conf_dir: &Path, desired: &Entry) -> Result<Diagnosis, ChainError> {
    diagnose_with(conf_dir, desired, &RepairOptions::default())
}

/// [`diagnose`] as a repair with `opts` would see the conf dir: symlinks
/// resolved under `opts.host_root`, and a write outside the conf dir
/// refused unless `opts.write_outside_conf_dir`.
pub fn diagnose_with(
    conf_dir: &Path,
    desired: &Entry,
    opts: &RepairOptions,
) -> Result<Diagnosis, ChainError> {
    let listing = scan::list(conf_dir, opts.link_rule())?;
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
        refused: None,
    };
    let mut base = None;
    if let Some(active) = &d.active {
        match listing.read(active) {
            Ok(bytes) => {
                let a = plan::analyze(Kind::of(active), &bytes, desired);
                d.state = a.state;
                d.plugins = a.plugins;
                base = Some(bytes);
                // A single-plugin file is converted into a new list in the
                // conf dir: its target is never written.
                if d.state.is_repairable() && Kind::of(active) == Kind::List {
                    d.refused = listing.refused(active);
                }
            }
            Err(e) => {
                d.state = ChainState::Invalid {
                    reason: format!("cannot read it: {e}"),
                }
            }
        }
    }
    for other in listing.configs.iter().skip(1) {
        if holds_entry(listing, other) {
            d.stray.push(other.clone());
        }
    }
    (d, base)
}

/// Whether a (non-active) config file holds a linkerd-cni entry.
fn holds_entry(listing: &scan::Listing, path: &Path) -> bool {
    let Ok(bytes) = listing.read(path) else {
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
