//! linkerd-cni's behaviour for each CNI command: the glue between the
//! protocol layer ([`crate::cni`]) and the work (per-pod rules, chain healing).

use serde_json::Value;

use crate::cni::{self, CniError, Invocation, NetConf};
use crate::config::PluginConfig;
use crate::logging;

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
        // Per-pod work goes before this line; its error is returned only
        // after the chain has been healed.
        crate::chain::heal_on_add(&inv.conf, &config);
        Ok(inv.conf.pass_through_result())
    }

    fn check(&self, inv: &Invocation) -> Result<(), CniError> {
        PluginConfig::from_netconf(&inv.conf)?;
        Ok(())
    }
}
