//! linkerd-cni under containerd's CRI, driven as the kubelet drives it:
//! RunPodSandbox / PodSandboxStatus / StopPodSandbox / RemovePodSandbox
//! with the pod's Kubernetes identity, on a node whose containerd has its
//! own root, socket, config and CNI dirs. Each test ends by shutting its
//! node down and checking that nothing of it is left on the machine.

use conformance::Node;
use conformance::chains::{self, Primary};
use conformance::cri::CriNode;
use conformance::expect::reserved_ips;
use conformance::kube::{self, APP_NAMESPACE};
use testkit::FakeApiServer;

/// A CRI node with the API server running and the typical chain, linkerd-cni
/// last, loaded by containerd.
fn meshing_node() -> (CriNode, FakeApiServer, String) {
    // In place before containerd starts, as on a node whose CNI is
    // installed (a file moved into the conf dir from elsewhere, as
    // Node::write_conf does, is an inotify "create", which containerd
    // ignores; CriNode::replace_conf is for a running node).
    let node = Node::new();
    let api = node.start_api_server();
    let net = node.network_name("cri");
    let plugins = chains::typical_chain(&node, Primary::Ptp, Some(chains::linkerd_entry(&node)));
    node.write_conf(
        &format!("10-{net}.conflist"),
        &chains::conflist(&net, "1.0.0", plugins),
    );
    let node = CriNode::start(node);
    node.wait_cni_loaded("the chain with linkerd-cni", |s| {
        s.iter()
            .any(|t| t.contains(&net) && t.contains("linkerd-cni"))
    });
    (node, api, net)
}

/// Shuts the node down and fails on anything it left behind.
fn shutdown_clean(node: CriNode) {
    let left = node.shutdown();
    assert!(left.is_empty(), "left behind: {left:#?}");
}

#[test]
fn meshed_pod_gets_the_reference_rules_and_unmeshed_none() {
    let (node, api, net) = meshing_node();
    kube::serve_meshed(&api, "web-0");
    kube::serve_unmeshed(&api, "db-0");

    let meshed = node.run_pod(APP_NAMESPACE, "web-0").unwrap();
    let unmeshed = node.run_pod(APP_NAMESPACE, "db-0").unwrap();
    for (sbx, name) in [(&meshed, "web-0"), (&unmeshed, "db-0")] {
        let st = sbx.status();
        assert!(st.ready, "{st:?}");
        assert_eq!(
            (st.namespace.as_str(), st.name.as_str()),
            (APP_NAMESPACE, name)
        );
        let ns = sbx.netns();
        assert_eq!(ns.ipv4_addrs("eth0"), [format!("{}/24", st.ip)], "{st:?}");
    }
    meshed.netns().expect_reference_rules();
    unmeshed.netns().expect_no_rules();
    // The plugin asked the API about both pods: containerd passed their
    // identity.
    assert_eq!(api.requests(&kube::pod_path("web-0")), 1);
    assert_eq!(api.requests(&kube::pod_path("db-0")), 1);
    assert_eq!(reserved_ips(&node, &net).len(), 2);

    meshed.stop_and_remove().unwrap();
    unmeshed.stop_and_remove().unwrap();
    assert_eq!(
        reserved_ips(&node, &net),
        Vec::<String>::new(),
        "addresses leaked"
    );
    drop(api);
    shutdown_clean(node);
}

#[test]
fn stop_releases_the_address_and_remove_forgets_the_sandbox() {
    let (node, api, net) = meshing_node();
    kube::serve_meshed(&api, "web-0");
    let sbx = node.run_pod(APP_NAMESPACE, "web-0").unwrap();
    let ip = sbx.status().ip;
    assert_eq!(reserved_ips(&node, &net), vec![ip.clone()]);
    sbx.stop().unwrap();
    assert!(
        reserved_ips(&node, &net).is_empty(),
        "StopPodSandbox kept {ip}"
    );
    let id = sbx.id().to_string();
    assert!(!sbx.status().ready);
    sbx.stop_and_remove().unwrap();
    assert!(
        node.cri().pod_sandbox_status(&id).is_err(),
        "{id} still known"
    );
    assert!(node.cri().list_pod_sandbox_ids().unwrap().is_empty());
    drop(api);
    shutdown_clean(node);
}
