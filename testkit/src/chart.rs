//! The linkerd-cni entry template as the shipped manifest holds it: the
//! `cni_network_config` of the ConfigMap in `deploy/linkerd-cni.yaml`, the
//! linkerd2-cni chart's default. Tests derive every entry they write or
//! expect from it, so a change to the manifest reaches them all.
//!
//! Read from the manifest's text (compiled in) without a YAML parser: the
//! value is a literal block scalar (`|-`), so it is the lines after its key
//! that are indented deeper than the key.

use std::sync::OnceLock;

use serde_json::Value;

/// `deploy/linkerd-cni.yaml`, as shipped.
pub const MANIFEST: &str = include_str!("../../deploy/linkerd-cni.yaml");

/// The placeholder the template holds for the kubeconfig's path, which the
/// installer replaces.
pub const KUBECONFIG_PLACEHOLDER: &str = "__KUBECONFIG_FILEPATH__";

/// The template's text, exactly as the installer gets it in
/// `CNI_NETWORK_CONFIG`.
pub fn template() -> &'static str {
    static TEXT: OnceLock<String> = OnceLock::new();
    TEXT.get_or_init(|| {
        block_scalar(MANIFEST, "cni_network_config").unwrap_or_else(|| {
            panic!("deploy/linkerd-cni.yaml has no cni_network_config: |- block")
        })
    })
}

/// The template parsed.
pub fn template_json() -> Value {
    serde_json::from_str(template())
        .unwrap_or_else(|e| panic!("the manifest's cni_network_config is not JSON: {e}"))
}

/// The entry the installer renders from the template: `kubeconfig` in
/// place of the placeholder, `cni_conf_dir` set to the host's conf dir.
pub fn rendered(kubeconfig: &str, conf_dir: &str) -> Value {
    let mut e = template_json();
    e["kubernetes"]["kubeconfig"] = kubeconfig.into();
    e["cni_conf_dir"] = conf_dir.into();
    e
}

/// The iptables backend the template's `iptables-mode` selects (the
/// chart's default is `nft`; no mode is the plugin's `legacy`): what the
/// nat tables of pods added with it are read with.
pub fn backend() -> crate::iptables::Backend {
    match template_json()["linkerd"]["iptables-mode"].as_str() {
        Some("nft") => crate::iptables::Backend::Nft,
        Some("legacy" | "") | None => crate::iptables::Backend::Legacy,
        Some(other) => panic!("the manifest's iptables-mode {other:?} has no backend here"),
    }
}

/// The lines of the `key: |-` literal block in `yaml`, de-indented.
fn block_scalar(yaml: &str, key: &str) -> Option<String> {
    let mut lines = yaml.lines();
    let head = lines.find(|l| l.trim_start().starts_with(&format!("{key}: |")))?;
    let key_indent = head.len() - head.trim_start().len();
    let body: Vec<&str> = lines
        .take_while(|l| l.trim().is_empty() || l.len() - l.trim_start().len() > key_indent)
        .collect();
    let indent = body
        .iter()
        .filter(|l| !l.trim().is_empty())
        .map(|l| l.len() - l.trim_start().len())
        .min()?;
    let text: Vec<&str> = body.iter().map(|l| l.get(indent..).unwrap_or("")).collect();
    Some(text.join("\n").trim_end().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_block_and_nothing_after_it() {
        let yaml = "data:\n  other: 1\n  cni_network_config: |-\n    {\n      \"a\": 1\n    }\n---\nkind: X\n";
        assert_eq!(
            block_scalar(yaml, "cni_network_config").as_deref(),
            Some("{\n  \"a\": 1\n}")
        );
        assert_eq!(block_scalar(yaml, "missing"), None);
    }

    #[test]
    fn the_manifest_template_is_the_charts_default() {
        let t = template_json();
        assert_eq!(t["type"], "linkerd-cni");
        assert_eq!(t["kubernetes"]["kubeconfig"], KUBECONFIG_PLACEHOLDER);
        assert_eq!(t["linkerd"]["proxy-uid"], 2102);
        assert_eq!(backend(), crate::iptables::Backend::Nft, "iptablesMode");
        assert!(t.get("cni_conf_dir").is_none());
    }
}
