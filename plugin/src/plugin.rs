//! linkerd-cni's behaviour for each CNI command: the glue between the
//! protocol layer ([`crate::cni`]) and the work (per-pod rules, chain healing).

use serde_json::Value;

use crate::cni::{self, CniError, Invocation, NetConf};
use crate::config::PluginConfig;
use crate::logging;
use crate::pod;

/// The linkerd-cni plugin.
#[derive(Debug, Default)]
pub struct LinkerdCni;

impl cni::Plugin for LinkerdCni {
    fn configure(&self, conf: &NetConf) {
        let level = logging::level_from_config(conf.raw.get("log_level").and_then(Value::as_str));
        logging::set_level(level);
    }

    fn add(&self, inv: &Invocation) -> Result<Value, CniError> {
        let config = PluginConfig::from_netconf(&inv.conf)?;
        // Before the pod's work: an ADD that ran a stale owned copy is sent
        // back (code 11) without doing it.
        let next = crate::owned_add::before_add(&inv.conf, &config)?;
        let pod = pod::add(inv, &config);
        // Healed whatever the pod's outcome: the runtime invoked us, so the
        // node's chain matters even when this pod's rules failed.
        if next == crate::owned_add::Next::HealInline {
            crate::chain::heal_on_add(&inv.conf, &config);
        }
        pod?;
        Ok(inv.conf.pass_through_result())
    }

    fn check(&self, inv: &Invocation) -> Result<(), CniError> {
        let config = PluginConfig::from_netconf(&inv.conf)?;
        pod::check(inv, &config)
    }

    /// Always succeeds: see [`pod::status`].
    fn status(&self, inv: &Invocation) -> Result<(), CniError> {
        match PluginConfig::from_netconf(&inv.conf) {
            Ok(config) => pod::status(&config),
            Err(e) => log::warn!("STATUS: {e}"),
        }
        Ok(())
    }
}
