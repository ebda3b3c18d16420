//! linkerd-cni last in chains of the reference plugins, driven by libcni as
//! a runtime drives them: ADD hands back the primary's result untouched,
//! leaves no rules in pods it does not mesh, and CHECK and DEL pass,
//! including DEL after the netns is gone and DEL twice.
//!
//! Part 1 of the conformance work: pods here need no Kubernetes API (no
//! pod identity in CNI_ARGS, or the exempt kube-system namespace), and
//! `chain_heal` is off. Meshed pods and healing come with part 2.

use conformance::chains::{self, CHAIN_VERSIONS, Primary};
use conformance::results::{exact, masked};
use conformance::{Backend, Completed, Family, NatTable, Node, Pod, PodSpec};
use serde_json::Value;

/// CHECK exists from spec 0.4.0 on; libcni refuses it for older lists.
fn has_check(version: &str) -> bool {
    version != "0.3.1"
}

/// linkerd-cni's entry for these tests: chain healing is issue 3's work and
/// is switched on by part 2.
fn linkerd_entry(node: &Node) -> Value {
    let mut e = chains::linkerd_entry(node);
    e["chain_heal"] = false.into();
    e
}

/// The commands and plugins libcni ran, in order.
fn steps(run: &Completed) -> Vec<(String, String)> {
    run.trace
        .iter()
        .map(|e| (e.command.clone(), e.plugin.clone()))
        .collect()
}

fn expect_steps(run: &Completed, command: &str, plugins: &[&str]) {
    let want: Vec<(String, String)> = plugins
        .iter()
        .map(|p| (command.to_string(), p.to_string()))
        .collect();
    assert_eq!(steps(run), want, "{run:?}");
}

/// The heart of "ADD returns the primary's result unchanged", checked on
/// what libcni actually exchanged with the plugins:
/// - linkerd-cni printed exactly the prevResult libcni gave it (same keys,
///   same order, same numbers), at the list's cniVersion;
/// - that prevResult is the previous plugin's result, and not an empty one;
/// - what libcni returned to the runtime is what linkerd-cni printed.
fn expect_pass_through(run: &Completed, version: &str) {
    let (last, before) = match run.trace.as_slice() {
        [.., before, last] => (last, before),
        _ => panic!("linkerd-cni was not chained: {run:?}"),
    };
    assert_eq!(last.plugin, "linkerd-cni", "{run:?}");
    assert_eq!(last.error, None, "{run:?}");
    let prev = last
        .prev_result()
        .unwrap_or_else(|| panic!("libcni gave linkerd-cni no prevResult: {run:?}"));
    let printed = last
        .stdout_json()
        .unwrap_or_else(|| panic!("linkerd-cni printed no JSON: {:?}", last.stdout));
    assert_eq!(
        exact(&printed),
        exact(prev),
        "linkerd-cni changed the result"
    );
    assert_eq!(printed["cniVersion"], version);

    let primary_result = before.stdout_json().expect("previous plugin's result");
    assert_eq!(prev, &primary_result, "libcni's prevResult for linkerd-cni");
    assert!(
        prev["ips"].as_array().is_some_and(|ips| !ips.is_empty()),
        "an empty prevResult proves nothing: {prev}"
    );
    assert_eq!(run.json(), printed, "libcni's result differs from ours");
}

/// The primary's address is really on the pod's interface.
fn expect_address_in_pod(pod: &Pod, result: &Value) {
    let addr = result["ips"][0]["address"].as_str().expect("an address");
    let have = pod.ipv4_addrs("eth0");
    assert!(
        have.iter().any(|a| a == addr),
        "{addr} not on eth0: {have:?}"
    );
}

/// Nothing of ours (and, with this chain, nothing at all) in the pod's nat
/// table, for either backend and family.
fn expect_no_nat_rules(pod: &Pod) {
    for table in pod.nat_tables() {
        assert!(table.linkerd_lines().is_empty(), "{table}");
        assert!(table.rules().is_empty(), "{table}");
        assert!(
            !table.chains().iter().any(|c| c.starts_with("PROXY_INIT")),
            "{table}"
        );
    }
}

/// host-local keeps one file per reserved address: none may be left after
/// every pod's DEL (a blocked DEL leaks pod IPs).
fn expect_no_reserved_ips(node: &Node, network: &str) {
    let dir = node.ipam_dir().join(network);
    let left: Vec<String> = std::fs::read_dir(&dir)
        .map(|rd| {
            rd.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.parse::<std::net::IpAddr>().is_ok())
                .collect()
        })
        .unwrap_or_default();
    assert!(left.is_empty(), "addresses still reserved: {left:?}");
}

/// The node's nat tables (portmap writes with whichever iptables the node's
/// `iptables` is).
fn node_nat(node: &Node) -> String {
    Backend::ALL
        .iter()
        .map(|b| NatTable::read(node.netns(), *b, Family::V4).text)
        .collect()
}

fn run_chain(primary: Primary, version: &str) {
    let node = Node::new();
    let net = node.network_name(primary.plugin_type());
    let plugins = chains::typical_chain(&node, primary, Some(linkerd_entry(&node)));
    node.write_conf(
        &format!("10-{net}.conflist"),
        &chains::conflist(&net, version, plugins),
    );
    let add_order = [primary.plugin_type(), "portmap", "tuning", "linkerd-cni"];
    let del_order = ["linkerd-cni", "tuning", "portmap", primary.plugin_type()];

    // The same chain without linkerd-cni, on a twin node with the same
    // subnet: what a runtime would get if linkerd-cni were not installed.
    let twin = Node::with_subnet(node.subnet());
    twin.write_conf(
        &format!("10-{net}.conflist"),
        &chains::conflist(&net, version, chains::typical_chain(&twin, primary, None)),
    );

    // An exempt-namespace pod, checked with CHECK. No host port for this
    // one: Debian's portmap (1.1.1) fails CHECK for any IPv4-only pod with
    // port mappings, looking for IPv6 rules it never wrote
    // (containernetworking/plugins#819, fixed upstream later).
    let spec = PodSpec::kubernetes("kube-system", "coredns-5d78c9869d-abcde");
    let pod = node.pod(spec.clone());
    let added = node.add(&net, &pod).unwrap();
    expect_steps(&added, "ADD", &add_order);
    expect_pass_through(&added, version);
    let without = twin.add(&net, &twin.pod(spec)).unwrap();
    assert_eq!(
        masked(&added.json()),
        masked(&without.json()),
        "the result with linkerd-cni differs from the chain without it"
    );
    expect_address_in_pod(&pod, &added.json());
    expect_no_nat_rules(&pod);

    if has_check(version) {
        let checked = node.check(&net, &pod).unwrap();
        expect_steps(&checked, "CHECK", &add_order);
        let ours = checked.execs("linkerd-cni").next().unwrap();
        assert_eq!(
            ours.prev_result(),
            Some(&added.json()),
            "CHECK's prevResult is the cached ADD result"
        );
    }
    let deleted = node.del(&net, &pod).unwrap();
    expect_steps(&deleted, "DEL", &del_order);
    node.del(&net, &pod)
        .unwrap_or_else(|e| panic!("second DEL: {e}"));

    // A sandbox without pod identity that publishes a host port, and whose
    // netns is gone before its DEL. The DEL must still reach portmap (after
    // linkerd-cni, in reverse order) and remove its rules from the node.
    let mut bare = node.pod(PodSpec::bare().capability_args(chains::port_mapping(18080)));
    let added = node.add(&net, &bare).unwrap();
    expect_steps(&added, "ADD", &add_order);
    expect_pass_through(&added, version);
    expect_address_in_pod(&bare, &added.json());
    expect_no_nat_rules(&bare);
    assert!(
        node_nat(&node).contains(":CNI-DN-"),
        "portmap wrote no DNAT chain"
    );
    bare.remove_netns();
    let deleted = node
        .del(&net, &bare)
        .unwrap_or_else(|e| panic!("DEL after the netns is gone: {e}"));
    expect_steps(&deleted, "DEL", &del_order);
    node.del(&net, &bare)
        .unwrap_or_else(|e| panic!("second DEL after the netns is gone: {e}"));
    let nat = node_nat(&node);
    assert!(
        !nat.contains(":CNI-DN-"),
        "portmap's DNAT chain survived DEL: {nat}"
    );

    expect_no_reserved_ips(&node, &net);
}

#[test]
fn bridge_chain_0_3_1() {
    run_chain(Primary::Bridge, CHAIN_VERSIONS[0]);
}

#[test]
fn bridge_chain_0_4_0() {
    run_chain(Primary::Bridge, CHAIN_VERSIONS[1]);
}

#[test]
fn bridge_chain_1_0_0() {
    run_chain(Primary::Bridge, CHAIN_VERSIONS[2]);
}

#[test]
fn ptp_chain_0_3_1() {
    run_chain(Primary::Ptp, CHAIN_VERSIONS[0]);
}

#[test]
fn ptp_chain_0_4_0() {
    run_chain(Primary::Ptp, CHAIN_VERSIONS[1]);
}

#[test]
fn ptp_chain_1_0_0() {
    run_chain(Primary::Ptp, CHAIN_VERSIONS[2]);
}

/// A single-plugin `.conf` (what kube-router and older flannel installs
/// ship), found by name and upgraded to a list by libcni. linkerd-cni is not
/// in it and must not be run; part 2 runs the same file with chain healing,
/// which turns it into a `.conflist` ending with linkerd-cni.
#[test]
fn single_plugin_conf_without_linkerd() {
    let node = Node::new();
    let net = node.network_name("single");
    let conf = node.write_conf(
        &format!("10-{net}.conf"),
        &chains::single_conf(&net, "0.4.0", Primary::Ptp.entry(&node)),
    );
    assert_eq!(node.active_conf(), Some(conf));
    let pod = node.pod(PodSpec::kubernetes("kube-system", "coredns-1"));
    let added = node.add(&net, &pod).unwrap();
    expect_steps(&added, "ADD", &["ptp"]);
    expect_address_in_pod(&pod, &added.json());
    expect_no_nat_rules(&pod);
    expect_steps(&node.check(&net, &pod).unwrap(), "CHECK", &["ptp"]);
    node.del(&net, &pod).unwrap();
    node.del(&net, &pod).unwrap();
    expect_no_reserved_ips(&node, &net);
}

/// A linkerd-cni ADD that fails (here: a bad config value) fails the whole
/// ADD with our CNI error, and the runtime's DEL that follows still runs
/// every plugin, so the primary frees the pod's address.
#[test]
fn failed_add_reports_our_error_and_del_still_frees_the_address() {
    let node = Node::new();
    let net = node.network_name("failing");
    let mut entry = linkerd_entry(&node);
    entry["linkerd"]["proxy-uid"] = "not-a-number".into();
    node.write_conf(
        &format!("10-{net}.conflist"),
        &chains::conflist(&net, "1.0.0", vec![Primary::Bridge.entry(&node), entry]),
    );
    let pod = node.pod(PodSpec::bare());
    let failed = node.add(&net, &pod).unwrap_err();
    assert_eq!(failed.code, Some(7), "{failed}");
    assert!(
        failed
            .msg
            .as_deref()
            .is_some_and(|m| m.contains("\"linkerd.proxy-uid\"")),
        "{failed}"
    );
    assert!(
        failed.error.starts_with("plugin type=\"linkerd-cni\""),
        "{failed}"
    );
    let deleted = node.del(&net, &pod).unwrap();
    expect_steps(&deleted, "DEL", &["linkerd-cni", "bridge"]);
    expect_no_reserved_ips(&node, &net);
}
