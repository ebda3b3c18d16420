//! Kubernetes Events on the Node from the real installer, against the fake
//! API server inside the node: the startup taint removed, a fight with
//! another agent, the plugin's credential rejected (a real ADD through
//! libcni) and the uninstall decided at SIGTERM; each once per occurrence,
//! and a second occurrence within the rate limit not sent. Owned mode
//! falling back to inline (a meta-plugin primary) is one Event too.

use std::collections::BTreeMap;
use std::time::Duration;

use conformance::chains::{self, Primary};
use conformance::installer::{self, Installer, scrape};
use conformance::{Node, kube};
use serde_json::{Value, json};
use testkit::objects::{node as node_object, node_path};
use testkit::{FakeApiServer, Mode};

/// Scheduling slack on a small shared machine running other tests.
const GRACE: Duration = Duration::from_secs(10);
const NODE: &str = "worker-1";

/// The Events' reasons, counted.
fn reasons(api: &FakeApiServer) -> BTreeMap<String, usize> {
    let mut m = BTreeMap::new();
    for e in api.events() {
        *m.entry(e["reason"].as_str().unwrap_or_default().to_string())
            .or_default() += 1;
    }
    m
}

/// Each Event is about this node, reported by the installer.
fn expect_shape(api: &FakeApiServer) {
    for e in api.events() {
        assert_eq!(
            e["regarding"],
            json!({"apiVersion": "v1", "kind": "Node", "name": NODE})
        );
        assert_eq!(e["reportingController"], "linkerd.io/linkerd-cni-installer");
        assert!(e["note"].as_str().is_some_and(|n| !n.is_empty()), "{e}");
    }
}

fn wait_reason(api: &FakeApiServer, inst: &Installer, reason: &str, n: usize) {
    assert!(
        testkit::wait_until(GRACE, || reasons(api).get(reason) == Some(&n)),
        "no {n} {reason} Event(s): {:#?}\n{}",
        api.events(),
        inst.log()
    );
}

/// Waits until the installer ran `n` more passes.
fn passes(node: &Node, inst: &Installer, addr: std::net::SocketAddr, n: f64) {
    let key = "linkerd_cni_passes_total";
    let start = scrape(node, addr)[key];
    assert!(
        testkit::wait_until(GRACE, || scrape(node, addr)[key] >= start + n),
        "{}",
        inst.log()
    );
}

#[test]
fn each_occurrence_is_one_event_within_the_rate_limit() {
    let node = Node::without_linkerd_cni();
    let api = node.start_api_server_only();
    api.set(
        &node_path(NODE),
        node_object(NODE, &[("linkerd.io/cni-not-ready", "NoSchedule")]),
    );
    let net = node.network_name("events");
    let file = format!("10-{net}.conflist");
    let primary = chains::primary_generation(&node, &net, 0);
    node.write_conf(&file, &primary);
    // A short ADD deadline: rejected credentials are retried within it.
    let (template, desired) = installer::template_with_deadline(&node, 3);
    let mut inst = installer::start(
        &node,
        &api,
        &[
            ("LINKERD_CNI_RESYNC_SECONDS", "1"),
            ("LINKERD_CNI_NODE_NAME", NODE),
            ("LINKERD_CNI_UNINSTALL_ON_EXIT", "true"),
            ("LINKERD_CNI_METRICS_ADDR", "127.0.0.1:0"),
            ("CNI_NETWORK_CONFIG", &template),
        ],
    );
    node.wait_healthy(&desired, &primary, GRACE)
        .unwrap_or_else(|e| panic!("{e}\n{}", inst.log()));
    let addr = installer::metrics_addr(&inst, GRACE);
    wait_reason(&api, &inst, "LinkerdCNIStartupTaintRemoved", 1);

    // Another agent undoing the repair with the same content: the 10th
    // repair within 60 s is a fight (with the one this test started from).
    let again = chains::primary_generation(&node, &net, 1);
    for _ in 0..10 {
        node.write_conf(&file, &again);
        node.wait_healthy(&desired, &again, GRACE)
            .unwrap_or_else(|e| panic!("{e}\n{}", inst.log()));
    }
    wait_reason(&api, &inst, "LinkerdCNIChainFight", 1);
    // A second fight (other content) within the rate limit: no Event.
    let other = chains::primary_generation(&node, &net, 2);
    for _ in 0..10 {
        node.write_conf(&file, &other);
        node.wait_healthy(&desired, &other, GRACE)
            .unwrap_or_else(|e| panic!("{e}\n{}", inst.log()));
    }
    assert!(inst.wait_log("repairs within", GRACE));

    // The plugin's credential rejected on a real ADD (code 11: the
    // installer is alive): the next pass says so.
    api.set_mode(Mode::Unauthorized);
    let pod = node.pod(kube::serve_meshed(&api, "web-0"));
    assert!(node.add(&net, &pod).is_err());
    api.set_mode(Mode::Normal);
    wait_reason(&api, &inst, "LinkerdCNICredentialRejected", 1);
    // Again, seen by later passes: within the rate limit, no Event.
    api.set_mode(Mode::Unauthorized);
    let pod2 = node.pod(kube::serve_meshed(&api, "web-1"));
    assert!(node.add(&net, &pod2).is_err());
    api.set_mode(Mode::Normal);
    passes(&node, &inst, addr, 2.0);

    // SIGTERM with LINKERD_CNI_UNINSTALL_ON_EXIT=true: the decision is an
    // Event, sent before the process exits.
    assert_eq!(inst.stop(), Some(0), "{}", inst.log());
    let want: BTreeMap<String, usize> = [
        ("LinkerdCNIStartupTaintRemoved", 1),
        ("LinkerdCNIChainFight", 1),
        ("LinkerdCNICredentialRejected", 1),
        ("LinkerdCNIUninstall", 1),
    ]
    .into_iter()
    .map(|(r, n)| (r.to_string(), n))
    .collect();
    assert_eq!(reasons(&api), want, "{:#?}\n{}", api.events(), inst.log());
    expect_shape(&api);
    let note = |reason: &str| -> String {
        let e: Value = api
            .events()
            .into_iter()
            .find(|e| e["reason"] == reason)
            .unwrap();
        e["note"].as_str().unwrap().to_string()
    };
    assert!(note("LinkerdCNIUninstall").contains("LINKERD_CNI_UNINSTALL_ON_EXIT=true"));
    assert!(
        note("LinkerdCNIChainFight").contains(&file),
        "{}",
        note("LinkerdCNIChainFight")
    );
    for p in [&pod, &pod2] {
        let _ = node.del(&net, p);
    }
}

/// Owned mode asked for, with a meta-plugin as the primary: inline repair
/// keeps the node chained, and one Event says why, however many passes
/// see it.
#[test]
fn owned_mode_falling_back_to_inline_is_one_event() {
    let node = Node::without_linkerd_cni();
    let api = node.start_api_server_only();
    api.set(&node_path(NODE), node_object(NODE, &[]));
    let net = node.network_name("fallback");
    let file = format!("00-{net}.conflist");
    let mut plugins = chains::typical_chain(&node, Primary::Ptp, None);
    plugins[0]["delegates"] = json!([]);
    let primary = chains::conflist(&net, "1.0.0", plugins);
    node.write_conf(&file, &primary);
    let inst = installer::start(
        &node,
        &api,
        &[
            ("LINKERD_CNI_RESYNC_SECONDS", "1"),
            ("LINKERD_CNI_NODE_NAME", NODE),
            ("LINKERD_CNI_CHAIN_MODE", "owned"),
            ("LINKERD_CNI_METRICS_ADDR", "127.0.0.1:0"),
        ],
    );
    let addr = installer::metrics_addr(&inst, GRACE);
    wait_reason(&api, &inst, "LinkerdCNIOwnedModeFallback", 1);
    passes(&node, &inst, addr, 3.0);
    assert_eq!(
        reasons(&api).get("LinkerdCNIOwnedModeFallback"),
        Some(&1),
        "{:#?}",
        api.events()
    );
    let m = scrape(&node, addr);
    let mode = m
        .keys()
        .find(|k| k.starts_with("linkerd_cni_chain_mode{"))
        .unwrap();
    assert!(
        mode.starts_with(
            "linkerd_cni_chain_mode{configured=\"owned\",selected=\"inline\",reason=\""
        ),
        "{mode}"
    );
    assert_eq!(
        m["linkerd_cni_chain_healthy{mode=\"inline\"}"], 1.0,
        "{m:#?}"
    );
    expect_shape(&api);
}
