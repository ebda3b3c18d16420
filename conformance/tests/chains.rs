//! linkerd-cni last in chains of the reference plugins, driven by libcni as
//! a runtime drives them, with the fake Kubernetes API server in the node:
//! ADD hands back the primary's result untouched; a meshed pod's netns holds
//! exactly the reference rules (legacy and nft modes), an unmeshed pod's
//! none; CHECK passes, and fails with our code 103 once a rule is gone; DEL
//! passes, also after the netns is gone and when run twice. And the
//! single-plugin `.conf`: healed into a `.conflist` that libcni then loads.
//! The chain tests run in both chain modes (inline: our entry in the
//! primary's file; owned: linkerd-cni's own file in front of it), and a
//! `.conf` primary in owned mode gets a `.conflist` copy.

use conformance::chains::{self, CHAIN_VERSIONS, Primary};
use conformance::expect::*;
use conformance::kube::{self, APP_NAMESPACE};
use conformance::modes::{self, ChainMode};
use conformance::results::{exact, masked};
use conformance::{Backend, Completed, Family, Node, PodSpec};
use serde_json::{Value, json};

/// CHECK exists from spec 0.4.0 on; libcni refuses it for older lists.
fn has_check(version: &str) -> bool {
    version != "0.3.1"
}

/// linkerd-cni's entry with `iptables-mode` for `backend`; chain healing is
/// left at its default (on), as the chart leaves it.
fn linkerd_entry(node: &Node, backend: Backend) -> Value {
    let mut e = chains::linkerd_entry(node);
    e["linkerd"]["iptables-mode"] = backend.mode().into();
    e
}

/// The reference rule a tampering agent deletes in the CHECK tests.
fn inbound_redirect_rule() -> &'static str {
    testkit::iptables::DEFAULT_RULES
        .lines()
        .find(|l| l.contains("redirect-all-incoming-to-proxy-port"))
        .expect("the reference text has the inbound redirect")
}

/// The chain tests in both chain modes: the runtime must see no
/// difference.
fn run_chain(primary: Primary, version: &str) {
    for mode in ChainMode::ALL {
        eprintln!("chain mode {}", mode.as_str());
        run_chain_in(primary, version, mode);
    }
}

fn run_chain_in(primary: Primary, version: &str, mode: ChainMode) {
    let node = Node::new();
    let api = node.start_api_server();
    let net = node.network_name(primary.plugin_type());
    let file = format!("10-{net}.conflist");
    let write_conf = |backend: Backend| {
        let entry = mode.entry(linkerd_entry(&node, backend));
        let plugins = chains::typical_chain(&node, primary, Some(entry));
        mode.write_chained(&node, &file, &chains::conflist(&net, version, plugins));
        // The file the runtime loads: the primary's (inline) or ours.
        node.active_conf().expect("an active config")
    };
    let conf = write_conf(Backend::Legacy);
    let add_order = [primary.plugin_type(), "portmap", "tuning", "linkerd-cni"];
    let del_order = ["linkerd-cni", "tuning", "portmap", primary.plugin_type()];

    // The same chain without linkerd-cni, on a twin node with the same
    // subnet: what a runtime would get if linkerd-cni were not installed.
    let twin = Node::with_subnet(node.subnet());
    twin.write_conf(
        &file,
        &chains::conflist(&net, version, chains::typical_chain(&twin, primary, None)),
    );

    // An exempt-namespace pod, checked with CHECK. No host port for this
    // one: Debian's portmap (1.1.1) fails CHECK for any IPv4-only pod with
    // port mappings, looking for IPv6 rules it never wrote
    // (a bug of containernetworking/plugins' portmap, fixed upstream later).
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
    assert_eq!(api.total_requests(), 0, "an exempt pod cost an API call");
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

    // A meshed pod per iptables mode.
    for backend in Backend::ALL {
        if backend != Backend::Legacy {
            write_conf(backend);
        }
        let before = std::fs::read(&conf).unwrap();
        let name = format!("web-{}", backend.mode());
        let mut pod = node.pod(kube::serve_meshed(&api, &name));
        let added = node
            .add(&net, &pod)
            .unwrap_or_else(|e| panic!("{backend:?}: ADD: {e}"));
        expect_steps(&added, "ADD", &add_order);
        expect_pass_through(&added, version);
        expect_address_in_pod(&pod, &added.json());
        expect_reference_rules(&pod, backend);
        assert_eq!(api.requests(&kube::pod_path(&name)), 1, "{backend:?}");

        if has_check(version) {
            let checked = node
                .check(&net, &pod)
                .unwrap_or_else(|e| panic!("{backend:?}: CHECK: {e}"));
            expect_steps(&checked, "CHECK", &add_order);
            // Another agent removes one of our rules: CHECK must say so,
            // with our code, through libcni.
            pod.delete_nat_rule(backend, Family::V4, inbound_redirect_rule());
            let failed = node
                .check(&net, &pod)
                .expect_err("CHECK after a rule was deleted must fail");
            assert_eq!(failed.code, Some(103), "{backend:?}: {failed}");
            // libcni names no plugin in a CHECK error: its trace does.
            let failing: Vec<&str> = failed
                .trace
                .iter()
                .filter(|e| e.error.is_some())
                .map(|e| e.plugin.as_str())
                .collect();
            assert_eq!(failing, ["linkerd-cni"], "{failed}");
            let msg = failed.msg.clone().unwrap_or_default();
            assert!(msg.contains(&format!("{APP_NAMESPACE}/{name}")), "{failed}");
            assert!(
                failed
                    .details
                    .as_deref()
                    .is_some_and(|d| d.contains("redirect-all-incoming-to-proxy-port")),
                "the details must name the missing rule: {failed}"
            );
        }

        // The runtime deletes the sandbox before its DEL, and DELs twice.
        pod.remove_netns();
        let deleted = node
            .del(&net, &pod)
            .unwrap_or_else(|e| panic!("{backend:?}: DEL after the netns is gone: {e}"));
        expect_steps(&deleted, "DEL", &del_order);
        node.del(&net, &pod)
            .unwrap_or_else(|e| panic!("{backend:?}: second DEL: {e}"));
        // A healthy chain is checked on every ADD but never rewritten.
        assert_eq!(std::fs::read(&conf).unwrap(), before, "{backend:?}");
    }

    // A pod the API says has no proxy: looked up, left alone.
    let mut plain = node.pod(kube::serve_unmeshed(&api, "plain-0"));
    let added = node.add(&net, &plain).unwrap();
    expect_steps(&added, "ADD", &add_order);
    expect_pass_through(&added, version);
    expect_address_in_pod(&plain, &added.json());
    expect_no_nat_rules(&plain);
    assert_eq!(api.requests(&kube::pod_path("plain-0")), 1);
    if has_check(version) {
        node.check(&net, &plain)
            .unwrap_or_else(|e| panic!("CHECK of an unmeshed pod: {e}"));
    }
    node.del(&net, &plain).unwrap();
    plain.remove_netns();
    node.del(&net, &plain)
        .unwrap_or_else(|e| panic!("DEL after the netns is gone: {e}"));

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
/// in it and must not be run (see the next test for what healing makes of
/// it).
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

/// The single-plugin `.conf` with linkerd-cni chained. A `.conf` holds one
/// plugin, so "chained" means healed into a `.conflist`. Here the primary
/// drops `05-<net>.conf` in front of the chained list the runtime has been
/// using, `10-<net>.conflist`; libcni looks networks up by name and prefers
/// a list, so it still runs that list, as a runtime runs the config it
/// loaded until its next reload. linkerd-cni's ADD finds the `.conf` active
/// and turns it into `05-<net>.conflist`: the `.conf`'s plugin untouched, its
/// name and version, then our entry; the `.conf` is gone. The next ADD
/// through libcni loads that list: the `.conf`'s plugin, then linkerd-cni,
/// with everything the chain tests ask of a chain.
#[test]
fn single_plugin_conf_is_healed_into_a_list_that_libcni_loads() {
    let node = Node::new();
    let api = node.start_api_server();
    let net = node.network_name("single");
    let version = "0.4.0";
    let entry = linkerd_entry(&node, Backend::Legacy);
    node.write_conf(
        &format!("10-{net}.conflist"),
        &chains::conflist(
            &net,
            version,
            vec![Primary::Ptp.entry(&node), entry.clone()],
        ),
    );
    // The primary's own file; its ptp is told apart by an MTU.
    let mut ptp = Primary::Ptp.entry(&node);
    ptp["mtu"] = 1400.into();
    let single = chains::single_conf(&net, version, ptp);
    let conf = node.write_conf(&format!("05-{net}.conf"), &single);
    assert_eq!(node.active_conf(), Some(conf.clone()));
    let ptp_mtu = |run: &Completed| run.execs("ptp").next().map(|e| e.stdin["mtu"].clone());

    let mut first = node.pod(kube::serve_meshed(&api, "web-0"));
    let added = node.add(&net, &first).unwrap();
    expect_steps(&added, "ADD", &["ptp", "linkerd-cni"]);
    assert_eq!(ptp_mtu(&added), Some(Value::Null), "not the old list");
    expect_pass_through(&added, version);
    expect_reference_rules(&first, Backend::Legacy);

    // What the heal left, read without the plugin's library.
    let converted = node.conf_dir().join(format!("05-{net}.conflist"));
    assert!(
        !conf.exists(),
        "the .conf is left: {:?}",
        node.conf_dir_names()
    );
    assert_eq!(node.active_conf(), Some(converted));
    let active = node.read_active().unwrap();
    active.healthy(&entry).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(active.json["name"], net.as_str());
    assert_eq!(active.json["cniVersion"], version);
    assert_eq!(
        exact(active.plugins()[0]),
        exact(&single),
        "the .conf's plugin changed"
    );

    // The runtime's next ADD loads the healed list.
    let second = node.pod(kube::serve_meshed(&api, "web-1"));
    let added = node.add(&net, &second).unwrap();
    expect_steps(&added, "ADD", &["ptp", "linkerd-cni"]);
    assert_eq!(ptp_mtu(&added), Some(json!(1400)), "not the healed list");
    expect_pass_through(&added, version);
    expect_address_in_pod(&second, &added.json());
    expect_reference_rules(&second, Backend::Legacy);
    expect_steps(
        &node.check(&net, &second).unwrap(),
        "CHECK",
        &["ptp", "linkerd-cni"],
    );
    let plain = node.pod(kube::serve_unmeshed(&api, "plain-0"));
    let added = node.add(&net, &plain).unwrap();
    expect_pass_through(&added, version);
    expect_no_nat_rules(&plain);
    node.check(&net, &plain).unwrap();

    first.remove_netns();
    for pod in [&first, &second, &plain] {
        let deleted = node.del(&net, pod).unwrap();
        expect_steps(&deleted, "DEL", &["linkerd-cni", "ptp"]);
        node.del(&net, pod).unwrap();
    }
    expect_no_reserved_ips(&node, &net);
}

/// Owned mode with a single-plugin `.conf` primary: linkerd-cni's own file
/// is a `.conflist` holding the `.conf`'s plugin (its name and version) and
/// our entry; libcni loads it for the network; the `.conf` stays untouched.
#[test]
fn single_plugin_conf_primary_in_owned_mode() {
    let node = Node::new();
    let api = node.start_api_server();
    let net = node.network_name("single");
    let version = "0.4.0";
    let mut ptp = Primary::Ptp.entry(&node);
    ptp["mtu"] = 1400.into();
    let single = chains::single_conf(&net, version, ptp);
    let file = format!("10-{net}.conf");
    let conf = node.write_conf(&file, &single);
    let bytes = std::fs::read(&conf).unwrap();
    let entry = ChainMode::Owned.entry(linkerd_entry(&node, Backend::Legacy));
    modes::chain_repair(&node, &entry);
    let ours = node.conf_dir().join(ChainMode::owned_name(&file));
    assert_eq!(node.active_conf(), Some(ours));
    let active = node.read_active().unwrap();
    active.healthy(&entry).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(active.json["name"], net.as_str());
    assert_eq!(active.json["cniVersion"], version);
    assert_eq!(exact(active.plugins()[0]), exact(&single));

    let pod = node.pod(kube::serve_meshed(&api, "web-0"));
    let added = node.add(&net, &pod).unwrap();
    expect_steps(&added, "ADD", &["ptp", "linkerd-cni"]);
    let mtu = added.execs("ptp").next().map(|e| e.stdin["mtu"].clone());
    assert_eq!(mtu, Some(json!(1400)));
    expect_pass_through(&added, version);
    expect_reference_rules(&pod, Backend::Legacy);
    expect_steps(
        &node.check(&net, &pod).unwrap(),
        "CHECK",
        &["ptp", "linkerd-cni"],
    );
    node.del(&net, &pod).unwrap();
    assert_eq!(
        std::fs::read(&conf).unwrap(),
        bytes,
        "the .conf was written"
    );
    expect_no_reserved_ips(&node, &net);
}

/// A linkerd-cni ADD that fails (here: a bad config value) fails the whole
/// ADD with our CNI error, and the runtime's DEL that follows still runs
/// every plugin, so the primary frees the pod's address.
#[test]
fn failed_add_reports_our_error_and_del_still_frees_the_address() {
    let node = Node::new();
    let net = node.network_name("failing");
    let mut entry = linkerd_entry(&node, Backend::Legacy);
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
