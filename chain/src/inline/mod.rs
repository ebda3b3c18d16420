//! Inline layout: our entry, last, in the primary CNI's own file.
//!
//! The diagnosis of the active file ([`Diagnosis`]) and the repair that
//! puts the entry last in it ([`repair`]), and on uninstall takes it out
//! ([`remove_entries`]). Which file is active is decided as the runtime
//! decides it, minus owned mode's own files (recognised by their marker in
//! [`crate::owned`]): this layout is about the primary's file.

mod repair;

use std::fmt;
use std::path::{Path, PathBuf};

use crate::names::{Kind, file_name};
#[cfg(test)]
use crate::{ChainError, RepairOptions, owned};
use crate::{ChainState, Entry, PLUGIN_TYPE, plan, scan};

#[cfg(test)]
pub(crate) use repair::{RepairReport, repair, testing};
pub(crate) use repair::{remove_entries, repair_locked};

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
    /// Owned mode's files, in load order: not the primary's, so never the
    /// file this layout repairs (but what the runtime loads if one sorts
    /// first).
    pub owned: Vec<PathBuf>,
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

    /// The file the runtime loads: the first config file by bytewise name,
    /// ours (owned mode's) included.
    pub fn runtime_active(&self) -> Option<PathBuf> {
        match (self.owned.first(), &self.active) {
            (Some(o), Some(a)) if o.file_name() < a.file_name() => Some(o.clone()),
            (Some(o), None) => Some(o.clone()),
            (_, a) => a.clone(),
        }
    }

    /// What [`repair`] would do, for people.
    pub fn remedy(&self) -> String {
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
                file_name(&active.with_extension("conflist")),
                file_name(active)
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
        // The file the runtime loads, which is ours while one of our
        // owned-mode files sorts first (a node switching back to inline
        // mode, before the switch removes it): never the primary's then.
        match (self.runtime_active(), &self.active) {
            (Some(loaded), Some(a)) if loaded != *a => {
                writeln!(
                    f,
                    "active config: {} (linkerd-cni's own, from owned mode)",
                    loaded.display()
                )?;
                writeln!(f, "primary:       {}", a.display())?;
            }
            (Some(loaded), None) => writeln!(
                f,
                "active config: {} (linkerd-cni's own, from owned mode; no primary config)",
                loaded.display()
            )?,
            (Some(loaded), Some(_)) => writeln!(f, "active config: {}", loaded.display())?,
            (None, _) => writeln!(f, "active config: none")?,
        }
        if !self.plugins.is_empty() {
            writeln!(f, "chain:         {}", self.plugins.join(" -> "))?;
        }
        writeln!(f, "state:         {}", self.state)?;
        if let (Some(why), true) = (&self.refused, self.state.is_repairable()) {
            writeln!(f, "refused:       will not rewrite it: {why}")?;
        }
        if !self.is_healthy() {
            let mut remedy = vec![];
            if self.state != ChainState::Healthy {
                remedy.push(self.remedy());
            }
            if !self.leftovers.is_empty() {
                remedy.push("remove the leftover temp files".into());
            }
            writeln!(f, "repair would:  {}", remedy.join("; "))?;
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

/// Read-only diagnosis of the primary's file (no lock, no write), as the
/// plugin on the host sees it with default options.
#[cfg(test)]
pub(crate) fn diagnose(conf_dir: &Path, desired: &Entry) -> Result<Diagnosis, ChainError> {
    diagnose_with(conf_dir, desired, &RepairOptions::default())
}

/// The diagnosis as a repair with `opts` would see the conf dir: symlinks
/// resolved under `opts.host_root`, and a write outside the conf dir
/// refused unless `opts.write_outside_conf_dir`.
#[cfg(test)]
pub(crate) fn diagnose_with(
    conf_dir: &Path,
    desired: &Entry,
    opts: &RepairOptions,
) -> Result<Diagnosis, ChainError> {
    let listing = owned::list(conf_dir, opts)?;
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
        owned: listing.owned.iter().map(|o| o.path.clone()).collect(),
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
                    reason: format!("cannot read it: {e}{}", crate::error::permission_hint(&e)),
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
    plan::mentions(&bytes, PLUGIN_TYPE)
        && plan::parse(Kind::of(path), &bytes)
            .is_ok_and(|top| plan::holds_ours(Kind::of(path), &top))
}
