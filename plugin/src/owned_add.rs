//! Owned chain mode at ADD: keep our config in sync with the primary's, and
//! send back an ADD that ran a stale copy.
//!
//! The runtime hands the plugin its entry as it loaded it, marker included
//! (see `linkerd_cni_chain::owned`): the primary's file name and the digest of
//! its chain as copied. If the primary's file changed since (or is gone, or
//! another file became the primary), the pod was set up by a chain the
//! primary no longer means: the plugin brings our file up to date and
//! answers "try again later" (CNI code 11), so that the runtime tears the
//! attempt down and retries with the current chain. In inline mode, with no
//! marker on stdin, nothing here runs: the ADD costs what it always did.

use std::time::Instant;

use linkerd_cni_chain::owned::{self, ChainMode, Marker, OwnedState};
use linkerd_cni_chain::{ChainError, Entry, RepairOptions, load_entry};

use crate::cni::{CniError, NetConf};
use crate::config::PluginConfig;
use crate::heal::{entry_from_stdin, heal_on_add};
use linkerd_cni_chain::outcomes::RetryCause;

/// What the ADD does next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    /// Inline mode (or owned mode falling back to it): heal the chain after
    /// the pod's work, as always.
    HealInline,
    /// Owned mode took care of the chain.
    Done,
}

/// The desired entry: the installer's, else the one this ADD was invoked
/// with (without the marker, which belongs to the copy, not the entry).
fn desired(conf: &NetConf, config: &PluginConfig) -> Result<Entry, ChainError> {
    let from_stdin = || {
        let mut raw = conf.raw.clone();
        raw.remove(owned::MARKER_KEY);
        entry_from_stdin(&raw)
    };
    match load_entry(&config.cni_conf_dir) {
        Ok(Some(e)) => Ok(e),
        Ok(None) => from_stdin(),
        Err(e) => {
            log::warn!("chain check: {e}; using the entry this ADD was invoked with");
            from_stdin()
        }
    }
}

/// Runs before the pod's work. `Err` (code 11) when the ADD ran a stale
/// copy of the primary's chain.
pub fn before_add(conf: &NetConf, config: &PluginConfig) -> Result<Next, CniError> {
    if !config.chain_heal {
        return Ok(Next::HealInline);
    }
    let ran = Marker::of(&conf.raw);
    // Not one of ours: the inline check says why it cannot heal.
    let Ok(desired) = desired(conf, config) else {
        return Ok(Next::HealInline);
    };
    let mode = match owned::mode_of(&desired) {
        Ok(m) => m,
        Err(e) => {
            log::warn!("chain check: {e}; using inline mode");
            ChainMode::Inline
        }
    };
    if mode == ChainMode::Inline && ran.is_none() {
        return Ok(Next::HealInline);
    }
    let start = Instant::now();
    let dir = &config.cni_conf_dir;
    let base = RepairOptions {
        lock_timeout: config.chain_repair_budget,
        deadline: Some(start + config.chain_repair_budget),
        write_outside_conf_dir: config.chain_write_outside_conf_dir,
        ..RepairOptions::default()
    };
    let diag = match owned::diagnose_with(dir, &desired, &base) {
        Ok(d) => d,
        Err(e) => {
            log::warn!("owned chain check skipped: {e}");
            return Ok(match mode {
                ChainMode::Inline => Next::HealInline,
                ChainMode::Owned => Next::Done,
            });
        }
    };
    let stale = ran.as_ref().and_then(|m| diag.stale(m));
    let mut next = Next::Done;
    if mode == ChainMode::Owned {
        if let OwnedState::Fallback { reason } = &diag.state {
            log::warn!("chain: {reason}");
            next = Next::HealInline;
            if !diag.owned.is_empty() {
                // Inline repair first, so the runtime never loads a chain
                // without us, then our files (of another primary) go.
                heal_on_add(conf, config);
                match owned::retire(dir, &base) {
                    Ok(files) => {
                        for f in files {
                            log::warn!(
                                "chain: removed {} (owned mode does not apply)",
                                f.display()
                            );
                        }
                    }
                    Err(e) => log::warn!("cannot remove linkerd-cni's own config: {e}"),
                }
                next = Next::Done;
            }
        } else if !diag.is_current() {
            let opts = RepairOptions {
                requires: config.kubeconfig.clone(),
                ..base
            };
            match owned::sync(dir, &desired, &opts) {
                Ok(r) if r.changed => log::warn!("chain (owned mode): {}", r.summary),
                Ok(r) => log::info!("chain (owned mode): {}", r.summary),
                Err(e) => log::warn!("owned config sync failed (the ADD goes on): {e}"),
            }
        } else {
            log::debug!("owned chain check: current ({:?})", start.elapsed());
        }
    } else {
        next = Next::HealInline;
    }
    match stale {
        None => Ok(next),
        Some(why) => {
            if next == Next::HealInline {
                heal_on_add(conf, config);
            }
            log::warn!("the chain that ran was stale ({why}); asking the runtime to retry");
            Err(CniError::try_again(
                RetryCause::StaleOwnedCopy,
                "the network config this ADD ran is out of date; try again",
                format!(
                    "linkerd-cni owned mode: {why}; linkerd-cni's config now follows the primary's, so a retry runs the current chain"
                ),
            ))
        }
    }
}
