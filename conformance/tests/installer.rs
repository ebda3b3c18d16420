//! The real installer on a node, then pods through libcni: a primary that
//! replaces its file without linkerd-cni while the installer runs is
//! chained again; the upstream seed race with the watch disabled is chained
//! within a resync; and on both nodes a pod added through libcni, with the
//! binary, kubeconfig and entry the installer put there, is meshed.
//!
//! Bounds are "within one resync" (or the watch's debounce) plus a grace for
//! a loaded, shared CI machine: they bound the scenario, they do not time
//! the installer.

use std::os::unix::fs::PermissionsExt;
use std::time::{Duration, Instant};

use conformance::chains;
use conformance::expect::*;
use conformance::installer;
use conformance::{Node, artifacts, kube};
use serde_json::Value;

/// The installer's resync period in these tests.
const RESYNC: Duration = Duration::from_secs(2);
/// Scheduling slack on a small shared machine running other tests.
const GRACE: Duration = Duration::from_secs(5);

/// What the installer put on the node, checked: the plugin binary (a copy
/// of the build, executable), the kubeconfig (0600, naming the API server),
/// and the desired entry rendered with host paths.
fn expect_installed(node: &Node, api: &testkit::FakeApiServer) {
    let bin = node.bin_dir().join("linkerd-cni");
    let meta = std::fs::symlink_metadata(&bin).unwrap();
    assert!(meta.is_file(), "{} is not a regular file", bin.display());
    assert_eq!(meta.permissions().mode() & 0o111, 0o111);
    assert_eq!(
        std::fs::read(&bin).unwrap(),
        std::fs::read(artifacts::linkerd_cni()).unwrap(),
        "the installed plugin is not the build"
    );
    let kc = node.kubeconfig_path();
    assert_eq!(
        std::fs::metadata(&kc).unwrap().permissions().mode() & 0o777,
        0o600
    );
    let text = std::fs::read_to_string(&kc).unwrap();
    assert!(text.contains(&format!("https://{}", api.addr())), "{text}");
    let entry: Value = serde_json::from_slice(
        &std::fs::read(node.conf_dir().join("ZZZ-linkerd-cni-entry")).unwrap(),
    )
    .unwrap();
    assert_eq!(entry, installer::expected_entry(node));
}

/// A meshed and an unmeshed pod through libcni on the installed node.
fn pods_on_installed_node(node: &Node, api: &testkit::FakeApiServer, net: &str) {
    let order = ["ptp", "portmap", "tuning", "linkerd-cni"];
    let meshed = node.pod(kube::serve_meshed(api, "web-0"));
    let added = node
        .add(net, &meshed)
        .unwrap_or_else(|e| panic!("ADD of a meshed pod: {e}"));
    expect_steps(&added, "ADD", &order);
    expect_pass_through(&added, "1.0.0");
    expect_reference_rules(&meshed, testkit::chart::backend());
    assert_eq!(api.requests(&kube::pod_path("web-0")), 1);
    node.check(net, &meshed).unwrap();

    let plain = node.pod(kube::serve_unmeshed(api, "plain-0"));
    let added = node.add(net, &plain).unwrap();
    expect_steps(&added, "ADD", &order);
    expect_no_nat_rules(&plain);

    for pod in [&meshed, &plain] {
        node.del(net, pod).unwrap();
        node.del(net, pod).unwrap();
    }
    expect_no_reserved_ips(node, net);
}

/// Waits for the installer's first pass (binary and kubeconfig in place).
fn wait_first_pass(node: &Node, inst: &installer::Installer) {
    let deadline = Instant::now() + RESYNC + GRACE;
    while !(node.bin_dir().join("linkerd-cni").is_file() && node.kubeconfig_path().exists()) {
        assert!(
            Instant::now() < deadline,
            "no first pass within {:?}:\n{}",
            RESYNC + GRACE,
            inst.log()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The primary replaces its file, without our entry, while the installer
/// runs with its watch: chained again, the primary's new content kept; by
/// rename, then by truncate-and-write (no rename event).
#[test]
fn primary_rewrite_is_chained_again_while_the_installer_runs() {
    let node = Node::without_linkerd_cni();
    let api = node.start_api_server_only();
    let net = node.network_name("inst");
    let file = format!("10-{net}.conflist");
    let primary = chains::primary_generation(&node, &net, 0);
    let mut inst = installer::start_and_chain(&node, &api, &file, &primary, RESYNC, RESYNC + GRACE);
    let desired = installer::expected_entry(&node);
    expect_installed(&node, &api);

    for generation in 1..=2 {
        let conf = chains::primary_generation(&node, &net, generation);
        if generation == 1 {
            node.write_conf(&file, &conf);
        } else {
            let mut text = serde_json::to_string_pretty(&conf).unwrap();
            text.push('\n');
            std::fs::write(node.conf_dir().join(&file), text).unwrap();
        }
        let t = Instant::now();
        node.wait_healthy(&desired, &conf, RESYNC + GRACE)
            .unwrap_or_else(|e| panic!("generation {generation}: {e}\n{}", inst.log()));
        eprintln!(
            "primary rewrite {generation}: chained again after {:?}",
            t.elapsed()
        );
    }
    assert!(inst.running(), "{}", inst.log());
    pods_on_installed_node(&node, &api, &net);
}

/// The upstream seed race, with no watch at all: the installer starts
/// before the primary has written anything; the primary's config appears
/// only after the installer's first pass, and is rewritten without our
/// entry right after the installer chained it. Each time the node is
/// chained within a resync, from the state on disk alone; then a pod added
/// through libcni on that node is meshed.
#[test]
fn seed_race_without_watch_is_chained_within_a_resync() {
    let node = Node::without_linkerd_cni();
    let api = node.start_api_server_only();
    let net = node.network_name("seed");
    let file = format!("10-{net}.conflist");
    let mut inst = installer::start(
        &node,
        &api,
        &[
            ("LINKERD_CNI_WATCH", "false"),
            ("LINKERD_CNI_RESYNC_SECONDS", &RESYNC.as_secs().to_string()),
        ],
    );
    wait_first_pass(&node, &inst);
    // No primary config: nothing written but the installer's own files.
    assert_eq!(node.active_conf(), None, "{:?}", node.conf_dir_names());

    let desired = installer::expected_entry(&node);
    let first = chains::primary_generation(&node, &net, 0);
    node.write_conf(&file, &first);
    let t = Instant::now();
    node.wait_healthy(&desired, &first, RESYNC + GRACE)
        .unwrap_or_else(|e| panic!("first write: {e}\n{}", inst.log()));
    eprintln!(
        "seed race: chained {:?} after the primary wrote",
        t.elapsed()
    );

    // The primary undoes the installer's write at once.
    let second = chains::primary_generation(&node, &net, 1);
    node.write_conf(&file, &second);
    let t = Instant::now();
    node.wait_healthy(&desired, &second, RESYNC + GRACE)
        .unwrap_or_else(|e| panic!("after the rewrite: {e}\n{}", inst.log()));
    eprintln!(
        "seed race: chained again {:?} after the rewrite",
        t.elapsed()
    );
    expect_installed(&node, &api);
    assert!(inst.running(), "{}", inst.log());
    pods_on_installed_node(&node, &api, &net);
}

/// `SKIP_TLS_VERIFY=true` concerns the kubeconfig written for the plugin
/// only: the installer, pointed at an API server that its service
/// account's CA did not sign, sends it nothing (no TokenRequest carrying
/// its token, so nothing of its answers to act on), says why, and still
/// chains the node with a kubeconfig that skips verification, as asked.
#[test]
fn skip_tls_verify_leaves_the_installers_own_calls_verified() {
    let node = Node::without_linkerd_cni();
    // The service account's CA is this server's...
    let trusted = node.start_api_server_only();
    // ...and the installer is pointed at another, signed by another CA.
    let other = node.start_api_server_only();
    for api in [&trusted, &other] {
        api.set_tokens(testkit::TokenPolicy::default());
    }
    let net = node.network_name("skiptls");
    let file = format!("10-{net}.conflist");
    let primary = chains::primary_generation(&node, &net, 0);
    node.write_conf(&file, &primary);
    let port = other.addr().port().to_string();
    let mut inst = installer::start(
        &node,
        &trusted,
        &[
            ("SKIP_TLS_VERIFY", "true"),
            ("KUBERNETES_SERVICE_PORT", &port),
            ("LINKERD_CNI_RESYNC_SECONDS", &RESYNC.as_secs().to_string()),
        ],
    );
    node.wait_healthy(&installer::expected_entry(&node), &primary, RESYNC + GRACE)
        .unwrap_or_else(|e| panic!("{e}\n{}", inst.log()));
    assert!(
        inst.wait_log("cannot mint the plugin's token", RESYNC + GRACE),
        "{}",
        inst.log()
    );
    assert!(
        other.connections() > 0,
        "the installer never tried the server\n{}",
        inst.log()
    );
    assert_eq!(
        other.total_requests(),
        0,
        "a request reached a server the CA did not sign\n{}",
        inst.log()
    );
    assert!(other.minted().is_empty() && trusted.minted().is_empty());
    let kc: Value =
        serde_json::from_str(&std::fs::read_to_string(node.kubeconfig_path()).unwrap()).unwrap();
    assert_eq!(
        kc["clusters"][0]["cluster"]["insecure-skip-tls-verify"], true,
        "{kc}"
    );
    assert!(kc["users"][0]["user"].get("token").is_none(), "{kc}");
    assert!(inst.running(), "{}", inst.log());
}
