//! Self-heal through libcni, chain healing on (its default), with the
//! kubeconfig in place (the plugin repairs only while it exists).
//!
//! A runtime's ADD on a chain whose linkerd-cni entry is stale, duplicated
//! or not last leaves the active file healthy. "Healthy" is judged by
//! `conformance::active`, which reads the file as a runtime does, not by the
//! plugin's chain library; and then proven by the runtime's next ADD, which
//! must run linkerd-cni exactly once, last, and mesh its pod.

use conformance::chains::{self, Primary};
use conformance::expect::*;
use conformance::kube;
use conformance::{Node, Pod};
use serde_json::{Value, json};

/// The installer's persisted desired entry, written as it writes it.
const ENTRY_FILE: &str = "ZZZ-linkerd-cni-entry";
const KUBECONFIG: &str = "ZZZ-linkerd-cni-kubeconfig";

/// How the linkerd-cni entries sit in the broken chain.
#[derive(Debug, Clone, Copy)]
enum Broken {
    /// Last, but an older rendering than the installer's desired entry.
    Stale,
    /// Twice: after the primary and at the end.
    Duplicated,
    /// Right after the primary, before portmap and tuning.
    NotLast,
}

/// The entry an older chart rendered: other log level, the long-gone
/// `policy` block. Same rules, so pods are meshed alike either way.
fn stale_entry(node: &Node) -> Value {
    let mut e = chains::linkerd_entry(node);
    e["log_level"] = "info".into();
    e["policy"] = json!({"type": "k8s", "k8s_api_root": "https://10.96.0.1:443"});
    e
}

/// Runs one self-heal scenario at `version`. With `persisted`, the desired
/// entry comes from the installer's entry file (the stale case needs it:
/// otherwise the entry the plugin was invoked with is the desired one).
fn heal(broken: Broken, version: &str, persisted: bool) {
    let node = Node::new();
    let api = node.start_api_server();
    let net = node.network_name("heal");
    let file = format!("10-{net}.conflist");
    let desired = chains::linkerd_entry(&node);
    if persisted {
        let mut text = serde_json::to_string_pretty(&desired).unwrap();
        text.push('\n');
        std::fs::write(node.conf_dir().join(ENTRY_FILE), text).unwrap();
    }

    // What the primary owns, and the broken chain made from it.
    let primary = chains::conflist(
        &net,
        version,
        chains::typical_chain(&node, Primary::Ptp, None),
    );
    let mut plugins = chains::typical_chain(&node, Primary::Ptp, None);
    let first_run: Vec<&str> = match broken {
        Broken::Stale => {
            plugins.push(stale_entry(&node));
            vec!["ptp", "portmap", "tuning", "linkerd-cni"]
        }
        Broken::Duplicated => {
            plugins.insert(1, desired.clone());
            plugins.push(desired.clone());
            vec!["ptp", "linkerd-cni", "portmap", "tuning", "linkerd-cni"]
        }
        Broken::NotLast => {
            plugins.insert(1, desired.clone());
            vec!["ptp", "linkerd-cni", "portmap", "tuning"]
        }
    };
    node.write_conf(&file, &chains::conflist(&net, version, plugins));
    let broken_state = node.read_active().unwrap();
    assert!(
        broken_state.healthy(&desired).is_err(),
        "{broken:?}: the set-up is not broken"
    );

    // The runtime's ADD, on the broken chain.
    let first = node.pod(kube::serve_meshed(&api, "web-0"));
    let added = node
        .add(&net, &first)
        .unwrap_or_else(|e| panic!("{broken:?}: ADD on the broken chain: {e}"));
    expect_steps(&added, "ADD", &first_run);
    // However often and wherever it ran, the pod has the rules once.
    expect_reference_rules(&first, testkit::chart::backend());
    assert!(
        added
            .execs("linkerd-cni")
            .any(|e| e.stderr.contains("chain repaired")),
        "{broken:?}: no linkerd-cni run says it repaired the chain: {added:?}"
    );

    // The file, as a runtime would now read it.
    let healed = node.read_active().unwrap();
    healed
        .healthy_with(&desired, &primary)
        .unwrap_or_else(|e| panic!("{broken:?}: after the ADD: {e}\n{}", healed.text));
    let mut expected_names = vec![file.clone(), KUBECONFIG.to_string()];
    if persisted {
        expected_names.push(ENTRY_FILE.to_string());
    }
    expected_names.sort();
    assert_eq!(node.conf_dir_names(), expected_names, "{broken:?}");

    // The runtime's next ADD runs the healed chain, and changes nothing.
    let bytes = std::fs::read(&healed.path).unwrap();
    let second = node.pod(kube::serve_meshed(&api, "web-1"));
    let added = node.add(&net, &second).unwrap();
    expect_steps(&added, "ADD", &["ptp", "portmap", "tuning", "linkerd-cni"]);
    expect_pass_through(&added, version);
    expect_reference_rules(&second, testkit::chart::backend());
    assert_eq!(std::fs::read(&healed.path).unwrap(), bytes, "{broken:?}");

    del_all(&node, &net, [&first, &second]);
}

fn del_all<'a>(node: &Node, net: &str, pods: impl IntoIterator<Item = &'a Pod>) {
    for pod in pods {
        node.del(net, pod)
            .unwrap_or_else(|e| panic!("DEL {}: {e}", pod.container_id()));
    }
    expect_no_reserved_ips(node, net);
}

#[test]
fn stale_entry_is_replaced() {
    heal(Broken::Stale, "0.3.1", true);
}

#[test]
fn duplicated_entry_is_made_single() {
    heal(Broken::Duplicated, "0.4.0", true);
}

#[test]
fn duplicated_entry_is_made_single_without_entry_file() {
    heal(Broken::Duplicated, "1.0.0", false);
}

#[test]
fn entry_not_last_is_moved_last() {
    heal(Broken::NotLast, "1.0.0", true);
}

#[test]
fn entry_not_last_is_moved_last_without_entry_file() {
    heal(Broken::NotLast, "0.4.0", false);
}

/// Without the kubeconfig (the installer has not run yet, or is
/// uninstalling) the plugin leaves the chain alone, and says why.
#[test]
fn no_repair_without_the_kubeconfig() {
    let node = Node::new();
    let net = node.network_name("nokc");
    let mut plugins = chains::typical_chain(&node, Primary::Ptp, None);
    plugins.insert(1, chains::linkerd_entry(&node));
    let conf = node.write_conf(
        &format!("10-{net}.conflist"),
        &chains::conflist(&net, "1.0.0", plugins),
    );
    let before = std::fs::read(&conf).unwrap();
    // An exempt pod: no API needed for the ADD itself.
    let pod = node.pod(conformance::PodSpec::kubernetes("kube-system", "dns-0"));
    let added = node.add(&net, &pod).unwrap();
    let ours = added.execs("linkerd-cni").next().unwrap();
    assert!(ours.stderr.contains("not repairing"), "{added:?}");
    assert_eq!(std::fs::read(&conf).unwrap(), before);
    del_all(&node, &net, [&pod]);
}
