//! linkerd-cni's behaviour for each CNI command: the glue between the
//! protocol layer ([`crate::cni`]) and the work (per-pod rules, chain healing).

use std::path::Path;
use std::time::Instant;

use serde_json::Value;

use crate::cni::{self, CniError, Invocation};
use crate::config::{DEFAULT_CONF_DIR, PluginConfig};
use crate::outcome;
use crate::pod;
use linkerd_cni_state::heartbeat;
use linkerd_cni_state::outcomes::Outcome;

/// The linkerd-cni plugin.
#[derive(Debug, Default)]
pub struct LinkerdCni;

impl cni::Plugin for LinkerdCni {
    /// Every ADD's outcome is counted in the state dir (see
    /// [`crate::outcome`]).
    fn add(&self, inv: &Invocation) -> Result<Value, CniError> {
        let config = config(inv).inspect_err(|e| {
            // The state dir of a config that did not parse: its
            // `state_dir` string when it has one, else the default.
            let (dir, _) = heartbeat::state_dir_of(&inv.conf.raw, Path::new(DEFAULT_CONF_DIR));
            outcome::count(&dir, &Err(e.clone()))
        })?;
        let added = add_pod(inv, &config);
        outcome::count(&config.state_dir, &added);
        added.map(|_| inv.conf.pass_through_result())
    }

    /// A chained plugin's CHECK verifies against the ADD result the runtime
    /// passes back; without it, refused, as the reference chained plugins
    /// (portmap, tuning, bandwidth) do.
    fn check(&self, inv: &Invocation) -> Result<(), CniError> {
        if inv.conf.prev_result.is_none() {
            return Err(CniError::new(
                cni::code::INVALID_CONFIG,
                "CHECK without prevResult",
                "linkerd-cni is a chained plugin: the runtime must pass the result of the \
                 network's ADD as prevResult on CHECK",
            ));
        }
        pod::check(inv, &config(inv)?)
    }

    /// Always succeeds: see [`pod::status`].
    fn status(&self, inv: &Invocation) -> Result<(), CniError> {
        match config(inv) {
            Ok(config) => pod::status(&config),
            Err(e) => log::warn!("STATUS: {e}"),
        }
        Ok(())
    }
}

/// Our keys of the invocation's config; its `log_level` applies from here
/// on (nothing before logs below warn).
fn config(inv: &Invocation) -> Result<PluginConfig, CniError> {
    let config = PluginConfig::from_map(&inv.conf.raw)?;
    log::set_max_level(config.log_level);
    Ok(config)
}

/// One deadline (`add_deadline_seconds`) covers the whole ADD. The chain
/// comes first, with the smaller of its own budget and the deadline:
/// healing the node matters whatever happens to this pod, and a slow API
/// server or a held xtables lock must not starve it. An ADD that ran a
/// stale owned copy is sent back (code 11) without the pod's work.
fn add_pod(inv: &Invocation, config: &PluginConfig) -> Result<Outcome, CniError> {
    let deadline = Instant::now() + config.add_deadline;
    let mut heal = config.clone();
    heal.chain_repair_budget = heal.chain_repair_budget.min(config.add_deadline);
    let pod = inv
        .env
        .args
        .pod_key()
        .or_else(|| inv.env.container_id.clone());
    crate::heal::chain_on_add(&inv.conf, &heal, pod.as_deref())?;
    pod::add_until(inv, config, deadline)
}
