//! Network configs built from the Debian reference plugins, the way real
//! clusters chain them, with or without linkerd-cni last.

use serde_json::{Map, Value, json};

use crate::node::Node;

/// The CNI spec versions the chain tests run at: the ones real primary CNIs
/// ship today (Calico 0.3.1, flannel/Cilium 0.3.1–1.0.0) that libcni 1.1.x
/// supports with CHECK (0.4.0+) and without (0.3.1).
pub const CHAIN_VERSIONS: [&str; 3] = ["0.3.1", "0.4.0", "1.0.0"];

/// Every released CNI spec version (containernetworking/cni's `SPEC.md`).
pub const ALL_VERSIONS: [&str; 7] = [
    "0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0",
];

/// The primary plugin that creates the pod's interface.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Primary {
    /// A Linux bridge in the node namespace plus a veth per pod.
    Bridge,
    /// A veth pair per pod, routed by the node.
    Ptp,
}

impl Primary {
    pub fn plugin_type(self) -> &'static str {
        match self {
            Primary::Bridge => "bridge",
            Primary::Ptp => "ptp",
        }
    }

    /// The primary's entry, with host-local IPAM on the node's subnet. No
    /// masquerading: nothing the chain writes needs to leave the node.
    pub fn entry(self, node: &Node) -> Value {
        match self {
            Primary::Bridge => json!({
                "type": "bridge",
                "bridge": bridge_name(node),
                "isGateway": true,
                "ipMasq": false,
                "ipam": node.host_local(),
            }),
            Primary::Ptp => json!({
                "type": "ptp",
                "ipMasq": false,
                "ipam": node.host_local(),
            }),
        }
    }
}

/// The bridge's name: a link name (at most 15 bytes), unique per node.
pub fn bridge_name(node: &Node) -> String {
    let hash = node
        .id()
        .bytes()
        .fold(0u32, |h, b| h.wrapping_mul(31).wrapping_add(u32::from(b)));
    format!("lcb{:08x}", hash)
}

/// portmap, with the `portMappings` capability the runtime fills in.
pub fn portmap() -> Value {
    json!({"type": "portmap", "capabilities": {"portMappings": true}})
}

/// tuning with one namespaced sysctl (CHECK verifies it).
pub fn tuning() -> Value {
    json!({"type": "tuning", "sysctl": {"net.core.somaxconn": "512"}})
}

/// `{"portMappings": [...]}` capability args for a pod that publishes one
/// host port (portmap then writes DNAT rules in the node namespace).
pub fn port_mapping(host_port: u16) -> Value {
    json!({"portMappings": [{"hostPort": host_port, "containerPort": 80, "protocol": "tcp"}]})
}

/// linkerd-cni's entry as the installer renders the shipped manifest's
/// template ([`testkit::chart`]), with paths pointing into the node:
/// `cni_conf_dir` is the node's conf dir and `state_dir` a node dir (so
/// nothing can ever touch the machine's /etc/cni/net.d or /run/linkerd-cni),
/// the kubeconfig is where the installer would write it, and the log level
/// is `debug` (the plugin's stderr is in every trace). Tweak keys on the
/// returned object (e.g. `chain_heal`) as a test needs.
pub fn linkerd_entry(node: &Node) -> Value {
    let mut e = testkit::chart::rendered(
        &node.kubeconfig_path().display().to_string(),
        &node.conf_dir().display().to_string(),
    );
    e["state_dir"] = node.state_dir().display().to_string().into();
    e["log_level"] = "debug".into();
    // A plugin of a list runs under the list's name: the entry as chained
    // has none of its own.
    if let Some(m) = e.as_object_mut() {
        m.remove("name");
    }
    e
}

/// A `.conflist` object.
pub fn conflist(name: &str, cni_version: &str, plugins: Vec<Value>) -> Value {
    let mut m = Map::new();
    m.insert("cniVersion".into(), cni_version.into());
    m.insert("name".into(), name.into());
    m.insert("plugins".into(), Value::Array(plugins));
    Value::Object(m)
}

/// A single-plugin `.conf` object: the plugin's entry with `name` and
/// `cniVersion` first.
pub fn single_conf(name: &str, cni_version: &str, plugin: Value) -> Value {
    let mut m = Map::new();
    m.insert("cniVersion".into(), cni_version.into());
    m.insert("name".into(), name.into());
    if let Value::Object(p) = plugin {
        m.extend(p);
    }
    Value::Object(m)
}

/// The plugins of a typical chain: the primary, portmap, tuning, and
/// `last` (linkerd-cni's entry) if given.
pub fn typical_chain(node: &Node, primary: Primary, last: Option<Value>) -> Vec<Value> {
    let mut plugins = vec![primary.entry(node), portmap(), tuning()];
    plugins.extend(last);
    plugins
}

/// A primary's config at `generation`: a ptp chain (with portmap and
/// tuning) whose MTU changes with the generation, as a primary's restart or
/// upgrade changes its file.
pub fn primary_generation(node: &Node, net: &str, generation: u64) -> Value {
    let mut plugins = typical_chain(node, Primary::Ptp, None);
    plugins[0]["mtu"] = (1400 + generation).into();
    conflist(net, "1.0.0", plugins)
}
