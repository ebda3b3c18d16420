//! The desired linkerd entry: rendered from the chart's template
//! (`CNI_NETWORK_CONFIG`, or the file `CNI_NETWORK_CONFIG_FILE` names), as
//! upstream's install-cni.sh does, plus the `cni_conf_dir` key our plugin
//! uses to find the conflist it keeps itself chained in.

use std::path::Path;

use serde_json::Value;

use crate::config::ConfigError;

/// linkerd-cni's element of a conflist's `plugins`.
pub use linkerd_cni_chain::Entry;
use linkerd_cni_chain::{ChainError, PLUGIN_TYPE};

/// The placeholder upstream's installer replaces with the kubeconfig's path.
pub const KUBECONFIG_PLACEHOLDER: &str = "__KUBECONFIG_FILEPATH__";

/// Renders the entry: the placeholder becomes the kubeconfig's host path,
/// `cni_conf_dir` is set to the host conf dir, and `type` must be ours.
pub fn render(
    template: &str,
    var: &'static str,
    kubeconfig_host_path: &Path,
    host_conf_dir: &Path,
) -> Result<Entry, ConfigError> {
    // Substituted as JSON string content, so a path with a quote or a
    // backslash cannot break the document.
    let path = kubeconfig_host_path.to_string_lossy();
    let quoted = Value::String(path.into_owned()).to_string();
    let inner = &quoted[1..quoted.len() - 1];
    let text = template.replace(KUBECONFIG_PLACEHOLDER, inner);

    let value: Value = serde_json::from_str(&text)
        .map_err(|e| ConfigError::new(var, format!("not valid JSON: {e}")))?;
    let Value::Object(mut entry) = value else {
        return Err(ConfigError::new(
            var,
            format!(
                "must be a JSON object (the linkerd-cni plugin config), got {}",
                kind(&value)
            ),
        ));
    };
    if !entry.contains_key("type") {
        entry.insert("type".into(), Value::String(PLUGIN_TYPE.into()));
    }
    entry.insert(
        "cni_conf_dir".into(),
        Value::String(host_conf_dir.to_string_lossy().into_owned()),
    );
    // A "type" other than ours is refused here: the chain could not
    // recognise the entry it appended.
    Entry::new(entry, var).map_err(|e| match e {
        ChainError::InvalidEntry { problem, .. } => ConfigError::new(var, problem.to_string()),
        other => ConfigError::new(var, other.to_string()),
    })
}

/// The entry for a node without the plugin's credential
/// (`LINKERD_CNI_AGENT_ONLY`): `kubernetes.agent-only` set, and no
/// `kubernetes.kubeconfig`, which names no file on such a node.
pub fn agent_only(entry: Entry, var: &'static str) -> Result<Entry, ConfigError> {
    let mut m = entry.into_map();
    let k8s = m
        .entry("kubernetes")
        .or_insert_with(|| Value::Object(Default::default()));
    let Value::Object(k8s) = k8s else {
        return Err(ConfigError::new(
            var,
            format!("kubernetes must be a JSON object, got {}", kind(k8s)),
        ));
    };
    k8s.remove("kubeconfig");
    k8s.insert("agent-only".into(), Value::Bool(true));
    Entry::new(m, var).map_err(|e| ConfigError::new(var, e.to_string()))
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What the linkerd2-cni chart renders into its ConfigMap by default.
    const CHART: &str = r#"{
      "name": "linkerd-cni",
      "type": "linkerd-cni",
      "log_level": "info",
      "kubernetes": {
          "kubeconfig": "__KUBECONFIG_FILEPATH__"
      },
      "linkerd": {
        "incoming-proxy-port": 4143,
        "outgoing-proxy-port": 4140,
        "proxy-uid": 2102,
        "ports-to-redirect": [],
        "inbound-ports-to-ignore": ["4191","4190"],
        "simulate": false,
        "use-wait-flag": false,
        "iptables-mode": "legacy",
        "ipv6": false
      }
    }"#;

    fn r(t: &str) -> Result<Entry, ConfigError> {
        render(
            t,
            "CNI_NETWORK_CONFIG",
            Path::new("/etc/cni/net.d/ZZZ-linkerd-cni-kubeconfig"),
            Path::new("/etc/cni/net.d"),
        )
    }

    #[test]
    fn chart_template() {
        let e = r(CHART).unwrap();
        assert_eq!(
            e["kubernetes"]["kubeconfig"],
            "/etc/cni/net.d/ZZZ-linkerd-cni-kubeconfig"
        );
        assert_eq!(e["cni_conf_dir"], "/etc/cni/net.d");
        // Key order is the template's, with ours appended.
        let keys: Vec<&str> = e.keys().map(String::as_str).collect();
        assert_eq!(
            keys,
            [
                "name",
                "type",
                "log_level",
                "kubernetes",
                "linkerd",
                "cni_conf_dir"
            ]
        );
        // That the plugin accepts it is checked in the plugin crate
        // (tests/installer_entry.rs), on the deploy manifest's template.
    }

    #[test]
    fn odd_paths_stay_inside_the_string() {
        let e = render(
            CHART,
            "CNI_NETWORK_CONFIG",
            Path::new("/we\"ird\\dir/kc"),
            Path::new("/we\"ird\\dir"),
        )
        .unwrap();
        assert_eq!(e["kubernetes"]["kubeconfig"], "/we\"ird\\dir/kc");
    }

    #[test]
    fn type_is_ours_and_cni_conf_dir_is_overridden() {
        let e = r(r#"{"name":"l","cni_conf_dir":"/elsewhere"}"#).unwrap();
        assert_eq!(e["type"], "linkerd-cni");
        assert_eq!(e["cni_conf_dir"], "/etc/cni/net.d");
        let err = r(r#"{"type":"calico"}"#).unwrap_err();
        assert_eq!(err.var, "CNI_NETWORK_CONFIG");
        assert!(err.reason.contains("calico"), "{err}");
    }

    #[test]
    fn not_an_object() {
        for t in ["[]", "\"x\"", "3", "null", "", "{", "{\"a\":1} trailing"] {
            let err = r(t).unwrap_err();
            assert_eq!(err.var, "CNI_NETWORK_CONFIG", "{t}");
        }
        let err = render(
            "[]",
            "CNI_NETWORK_CONFIG_FILE",
            Path::new("/k"),
            Path::new("/c"),
        )
        .unwrap_err();
        assert_eq!(err.var, "CNI_NETWORK_CONFIG_FILE");
        assert!(err.reason.contains("an array"), "{err}");
    }
}
