//! The entry the installer renders from the chart's template is a config the
//! plugin accepts. The installer does not depend on this crate, so the check
//! lives here, on the template of `deploy/linkerd-cni.yaml` (the chart's
//! default), rendered the way the installer renders it: the kubeconfig
//! placeholder replaced, `cni_conf_dir` added.

use std::path::Path;

use linkerd_cni::config::{IptablesMode, PluginConfig};
use linkerd_cni_chain::Entry;

/// The `cni_network_config` block of the deploy manifest's ConfigMap.
fn deploy_template() -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/linkerd-cni.yaml");
    let yaml = std::fs::read_to_string(&path).unwrap();
    let mut lines = yaml
        .lines()
        .skip_while(|l| l.trim() != "cni_network_config: |-");
    assert!(lines.next().is_some(), "no cni_network_config in {path:?}");
    lines
        .take_while(|l| l.starts_with("    ") || l.is_empty())
        .map(|l| l.get(4..).unwrap_or_default())
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn the_chart_entry_as_rendered_is_a_plugin_config() {
    let text = deploy_template().replace(
        "__KUBECONFIG_FILEPATH__",
        "/etc/cni/net.d/ZZZ-linkerd-cni-kubeconfig",
    );
    let entry = Entry::parse(text.as_bytes(), "deploy/linkerd-cni.yaml")
        .unwrap()
        .with("cni_conf_dir", "/etc/cni/net.d")
        .unwrap();
    let c = PluginConfig::from_map(&entry).unwrap();
    assert_eq!(c.cni_conf_dir, Path::new("/etc/cni/net.d"));
    // The linkerd2-cni chart's default iptablesMode.
    assert_eq!(c.proxy.iptables_mode, IptablesMode::Nft);
    assert_eq!(
        c.kubeconfig.as_deref(),
        Some(Path::new("/etc/cni/net.d/ZZZ-linkerd-cni-kubeconfig"))
    );
}
