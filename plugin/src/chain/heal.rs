//! Invocation-time healing: the plugin checks the chain on every ADD and
//! repairs it within a budget.
//!
//! The check is read-only and lock-free, so the healthy path (almost every
//! ADD) costs a directory listing and a parse. Nothing here can fail or
//! delay the ADD beyond the budget: trouble is logged and the ADD goes on.

use std::time::{Duration, Instant};

use serde_json::{Map, Value};

use super::fight::PersistedFights;
use super::{Entry, PLUGIN_TYPE, RepairOptions, diagnose, load_entry, repair};
use crate::cni::NetConf;
use crate::config::PluginConfig;

/// Keys a runtime adds to a plugin's config when invoking it: not part of
/// the entry in the conflist.
const INJECTED: [&str; 5] = ["name", "cniVersion", "prevResult", "runtimeConfig", "args"];

/// Fight detection for the plugin: this many repairs of the same content of
/// one file in this window is a fight (then at most one repair of that
/// content per window / threshold).
const FIGHT_WINDOW: Duration = Duration::from_secs(600);
const FIGHT_THRESHOLD: u32 = 5;

/// The entry the plugin was invoked with: its stdin config minus what the
/// runtime injects.
pub fn entry_from_stdin(raw: &Map<String, Value>) -> Entry {
    raw.iter()
        .filter(|(k, _)| !INJECTED.contains(&k.as_str()))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// Checks the chain and, when unhealthy, repairs it within
/// `config.chain_repair_budget`. Never fails, never writes when healthy.
pub fn heal_on_add(conf: &NetConf, config: &PluginConfig) {
    if !config.chain_heal {
        return;
    }
    let start = Instant::now();
    let dir = &config.cni_conf_dir;
    let desired = match load_entry(dir) {
        Ok(Some(e)) => e,
        Ok(None) => entry_from_stdin(&conf.raw),
        Err(e) => {
            log::warn!("chain check: {e}; using the entry this ADD was invoked with");
            entry_from_stdin(&conf.raw)
        }
    };
    if desired.get("type").and_then(Value::as_str) != Some(PLUGIN_TYPE) {
        log::warn!(
            "chain check skipped: this plugin was invoked as type {}, not {PLUGIN_TYPE:?}, so its entry cannot be recognised in the chain",
            desired
                .get("type")
                .map_or("(none)".to_string(), Value::to_string)
        );
        return;
    }
    let diag = match diagnose(dir, &desired) {
        Ok(d) => d,
        Err(e) => {
            log::warn!("chain check skipped: {e}");
            return;
        }
    };
    if diag.is_healthy() {
        log::debug!("chain check: healthy ({:?})", start.elapsed());
        return;
    }
    if !diag.needs_repair() {
        // Invalid or no primary config: nothing for us to write.
        log::warn!(
            "chain check: {}: {}; not repairing",
            diag.active
                .as_deref()
                .map_or_else(|| dir.display().to_string(), |p| p.display().to_string()),
            diag.state
        );
        return;
    }
    let active = diag.active.clone().unwrap_or_else(|| dir.clone());
    let mut fights = PersistedFights::load(&config.state_dir, FIGHT_WINDOW, FIGHT_THRESHOLD);
    // A fight is the same content undone again and again: keyed by what
    // the repair starts from, so a primary writing new content is repaired
    // at once each time.
    let digest = super::fight::content_digest(&active);
    if diag.state.is_repairable() && !fights.allow_of(&active, &digest) {
        log::warn!(
            "chain check: {}: {}; repair postponed: this file is being rewritten again and again by another agent (see earlier warnings)",
            active.display(),
            diag.state
        );
        return;
    }
    let budget = config.chain_repair_budget.saturating_sub(start.elapsed());
    let opts = RepairOptions {
        lock_timeout: budget,
        deadline: Some(start + config.chain_repair_budget),
        requires: config.kubeconfig.clone(),
    };
    match repair(dir, &desired, &opts) {
        Ok(r) if r.changed => {
            log::warn!("chain {}", r.summary);
            if let Some(w) = fights.record_of(&active, &digest) {
                log::warn!("{w}");
            }
        }
        Ok(r) => log::info!("chain check: {}", r.summary),
        Err(e) => log::warn!("chain repair failed (the ADD goes on): {e}"),
    }
}
