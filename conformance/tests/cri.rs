//! linkerd-cni under containerd's CRI, driven as the kubelet drives it:
//! RunPodSandbox / PodSandboxStatus / StopPodSandbox / RemovePodSandbox
//! with the pod's Kubernetes identity, on a node whose containerd has its
//! own root, socket, config and CNI dirs. Each test ends by shutting its
//! node down and checking that nothing of it is left on the machine.

use conformance::chains::{self, Primary};
use conformance::cri::CriNode;
use conformance::cri::grpc::GrpcError;
use conformance::cri::{daemonset, measure};
use conformance::expect::reserved_ips;
use conformance::kube::{self, APP_NAMESPACE};
use conformance::modes::MARKER_KEY;
use conformance::{Node, PodSpec};
use conformance::{artifacts, installer};
use serde_json::Value;
use std::collections::BTreeMap;
use std::time::Duration;
use testkit::{FakeApiServer, objects};

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

/// A node without linkerd-cni (its API server running), the primary's
/// chain alone in place under network `tag`: what an installer meets.
fn primary_only_node(tag: &str, primary: Primary) -> (Node, FakeApiServer, String) {
    let node = Node::without_linkerd_cni();
    let api = node.start_api_server_only();
    let net = node.network_name(tag);
    let plugins = chains::typical_chain(&node, primary, None);
    node.write_conf(
        &format!("10-{net}.conflist"),
        &chains::conflist(&net, "1.0.0", plugins),
    );
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

fn types(conf: &Value) -> Vec<String> {
    conf["plugins"]
        .as_array()
        .map(|p| {
            p.iter()
                .filter_map(|e| e["type"].as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default()
}

/// The network list named `net` among those containerd has loaded now.
fn loaded(node: &CriNode, net: &str) -> Value {
    node.status()
        .loaded_cni_sources()
        .iter()
        .filter_map(|s| serde_json::from_str::<Value>(s).ok())
        .find(|v| v["name"] == net)
        .unwrap_or_else(|| panic!("containerd has no network {net} loaded"))
}

/// A plugin appended after linkerd-cni (the primary's installer added one,
/// the installer is not running): the meshed pod's ADD heals the file, and
/// containerd already runs the healed chain when RunPodSandbox returns.
#[test]
fn self_heal_during_add_is_loaded_before_run_pod_sandbox_returns() {
    let node = Node::new();
    let api = node.start_api_server();
    let net = node.network_name("heal");
    let file = format!("10-{net}.conflist");
    let desired = chains::linkerd_entry(&node);
    let primary = chains::conflist(
        &net,
        "1.0.0",
        chains::typical_chain(&node, Primary::Ptp, None),
    );
    // linkerd-cni, then tuning appended after it.
    let mut plugins = chains::typical_chain(&node, Primary::Ptp, None);
    plugins.insert(2, desired.clone());
    node.write_conf(&file, &chains::conflist(&net, "1.0.0", plugins));
    let node = CriNode::start(node);
    node.wait_cni_loaded("the broken chain", |s| s.len() == 2);
    assert_eq!(
        types(&loaded(&node, &net)),
        ["ptp", "portmap", "linkerd-cni", "tuning"]
    );

    kube::serve_meshed(&api, "web-0");
    let first = node.run_pod(APP_NAMESPACE, "web-0").unwrap();
    // No wait: what containerd has loaded the moment the call returned.
    assert_eq!(
        types(&loaded(&node, &net)),
        ["ptp", "portmap", "tuning", "linkerd-cni"],
        "containerd had not reloaded the healed chain when RunPodSandbox returned"
    );
    first.netns().expect_reference_rules();
    let healed = node.read_active().unwrap();
    healed
        .healthy_with(&desired, &primary)
        .unwrap_or_else(|e| panic!("after the ADD: {e}\n{}", healed.text));
    let bytes = std::fs::read(&healed.path).unwrap();

    // The next pod runs the healed chain and changes nothing.
    kube::serve_meshed(&api, "web-1");
    let second = node.run_pod(APP_NAMESPACE, "web-1").unwrap();
    second.netns().expect_reference_rules();
    assert_eq!(std::fs::read(&healed.path).unwrap(), bytes);

    first.stop_and_remove().unwrap();
    second.stop_and_remove().unwrap();
    assert!(reserved_ips(&node, &net).is_empty());
    drop(api);
    shutdown_clean(node);
}

/// The API server does not know the pod: the plugin fails the ADD, and the
/// kubelet sees the plugin's own error in RunPodSandbox's.
#[test]
fn failed_api_lookup_shows_the_plugins_error_in_the_cri_error() {
    let (node, api, net) = meshing_node();
    // The plugin's error for this pod, straight from libcni on the same
    // node and chain.
    let probe = node.pod(PodSpec::kubernetes(APP_NAMESPACE, "ghost-0"));
    let direct = node.add(&net, &probe).unwrap_err();
    let msg = direct.msg.clone().unwrap_or_else(|| panic!("{direct}"));
    // libcni leaves a failed ADD to the runtime's DEL, as containerd does.
    node.del(&net, &probe).unwrap();
    drop(probe);

    let err = node.run_pod(APP_NAMESPACE, "ghost-0").unwrap_err();
    let GrpcError::Status { code, message } = &err else {
        panic!("not a gRPC status: {err}");
    };
    assert_eq!(*code, 2, "{err}");
    assert!(
        message.contains("plugin type=\"linkerd-cni\"") && message.contains(&msg),
        "the CRI error does not carry linkerd-cni's error {msg:?}: {message}"
    );
    // Nothing of the failed sandbox holds an address.
    assert!(reserved_ips(&node, &net).is_empty(), "addresses leaked");
    assert!(node.cri().list_pod_sandbox_ids().unwrap().is_empty());
    drop(api);
    shutdown_clean(node);
}

const CONCURRENT: usize = 20;

#[test]
fn twenty_concurrent_sandboxes_are_all_meshed_and_released() {
    let (node, api, net) = meshing_node();
    for i in 0..CONCURRENT {
        kube::serve_meshed(&api, &format!("web-{i}"));
    }
    let sandboxes: Vec<_> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..CONCURRENT)
            .map(|i| {
                let node = &node;
                s.spawn(move || node.run_pod(APP_NAMESPACE, &format!("web-{i}")))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap().unwrap())
            .collect()
    });
    let mut ips: Vec<String> = sandboxes.iter().map(|s| s.status().ip).collect();
    ips.sort();
    ips.dedup();
    assert_eq!(ips.len(), CONCURRENT, "addresses not distinct: {ips:?}");
    assert_eq!(reserved_ips(&node, &net).len(), CONCURRENT);
    for sbx in &sandboxes {
        sbx.netns().expect_reference_rules();
    }
    std::thread::scope(|s| {
        for sbx in sandboxes {
            s.spawn(move || sbx.stop_and_remove().unwrap());
        }
    });
    assert!(reserved_ips(&node, &net).is_empty(), "addresses leaked");
    drop(api);
    shutdown_clean(node);
}

/// The primary's rewrite without linkerd-cni, measured in today's (inline)
/// mode: a meshed pod created right after the rewrite may run the chain
/// before it is healed. The count is reported (expected nonzero inline);
/// what must hold in any mode: every sandbox came up, with exactly the
/// reference rules or none, and the chain is meshing again afterwards.
#[test]
fn primary_rewrite_without_linkerd_cni_measured_inline() {
    let report = measure::primary_rewrites(&measure::Inline, 6);
    eprintln!("primary rewrites, {report}");
    assert_eq!(report.pods, 6);
    assert!(report.broken.is_empty(), "{:#?}", report.broken);
    assert!(report.left_behind.is_empty(), "{:#?}", report.left_behind);
}

/// The same rewrites in owned mode: the runtime loads linkerd-cni's own
/// file, never the primary's rewrite, so no meshed pod comes up unmeshed
/// (an ADD that ran an outdated copy is retried on the current one).
#[test]
fn primary_rewrite_without_linkerd_cni_measured_owned() {
    let report = measure::primary_rewrites(&measure::Owned, 6);
    eprintln!("primary rewrites, {report}");
    assert_eq!(report.pods, 6);
    assert!(report.broken.is_empty(), "{:#?}", report.broken);
    assert_eq!(report.unmeshed, 0, "{report}");
    assert!(report.left_behind.is_empty(), "{:#?}", report.left_behind);
}

/// The burst both modes are measured with ([`measure::tier_burst`]: 10
/// times, 20 pods, every other one meshed, while the primary rewrites 5
/// times 50 ms apart). Every sandbox came up, meshed ones with exactly the
/// reference rules or none, unmeshed ones with none, and nothing is left
/// behind.
fn burst(keeping: &dyn measure::ChainKeeping) -> measure::RewriteReport {
    let report = measure::tier_burst(keeping);
    eprintln!("primary burst, {report}");
    assert_eq!(report.pods, 10 * 20 / 2);
    assert!(report.broken.is_empty(), "{:#?}", report.broken);
    assert!(report.left_behind.is_empty(), "{:#?}", report.left_behind);
    report
}

/// A burst of 20 pods (10 meshed) while the primary rewrites its config 5
/// times 50 ms apart, 10 times over, in inline mode. Inline mode has a
/// window by design: from a primary write until containerd reloads the
/// repaired file, the runtime runs the primary's chain alone, and a pod
/// whose ADD starts then comes up without its rules (owned mode closes it;
/// the repair controller restarts such pods). How many pods land in it
/// depends on whether the burst's ADDs overlap the rewrites and on how
/// soon the installer gets a CPU on a saturated node: on 2 cores, 0 to 10
/// of the 100 in most runs, up to 18 (the repair no longer waits for an
/// fsync before it is in place; before, up to 21). That count is reported
/// here and benchmarked in BENCHMARKS.md, not bounded tightly: a timed
/// bound would fail with the machine's load, not with the design. What
/// the bound below does catch is a keeper that no longer acts on the
/// watch: with the watch off (resync only) 92 of 100 come up unmeshed.
/// Every sandbox comes up, meshed ones with exactly the reference rules or
/// none, unmeshed ones with none.
#[test]
fn burst_while_the_primary_rewrites_inline() {
    let report = burst(&measure::Inline);
    assert!(
        report.unmeshed <= 40,
        "{report}: more than a late heal explains; is the installer acting on its watch?"
    );
}

/// The same burst in owned mode: the runtime loads linkerd-cni's own copy
/// of the primary's chain, never the primary's rewrite alone, so no meshed
/// pod comes up without its rules, whatever the load. An ADD that ran a
/// copy older than the primary's file is sent back (code 11) and retried,
/// as the kubelet retries a sandbox, and the plugin sends one pod back at
/// most twice (then accepts the copy it ran, which holds linkerd-cni).
#[test]
fn burst_while_the_primary_rewrites_owned() {
    let report = burst(&measure::Owned);
    assert_eq!(report.unmeshed, 0, "{report}");
    assert!(report.most_retries <= 2, "{report}");
}

/// linkerd-cni's image, run as a DaemonSet runs it (the installer alone, as
/// the linkerd2-cni chart's install-cni container), installs the plugin
/// and its entry; its readiness probe passes inside the container; then
/// pods created through CRI are meshed.
#[test]
fn the_image_run_as_the_daemonset_runs_it_meshes_pods() {
    let (node, api, net) = primary_only_node("ds", Primary::Ptp);
    let node = CriNode::start(node);
    node.wait_cni_loaded("the primary's chain", |s| s.len() == 2);

    let mut ds = daemonset::start(&node, &api, &installer::template(&node), |name| {
        artifacts::workspace_bin(name)
    });
    ds.wait_ready(Duration::from_secs(60))
        .unwrap_or_else(|e| panic!("readiness probe: {e}"));

    // Started as the manifest says: read-only root, no capability, host
    // network, the /host mounts.
    let info: Value =
        serde_json::from_str(&daemonset::ctr_ok(&node, &["containers", "info", ds.id()])).unwrap();
    let spec = &info["Spec"];
    assert_eq!(spec["root"]["readonly"], true, "{spec}");
    for set in [
        "bounding",
        "effective",
        "permitted",
        "inheritable",
        "ambient",
    ] {
        let caps = spec["process"]["capabilities"][set].as_array();
        assert!(caps.is_none_or(|c| c.is_empty()), "{set}: {caps:?}");
    }
    let namespaces: Vec<&str> = spec["linux"]["namespaces"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|n| n["type"].as_str())
        .collect();
    assert!(
        !namespaces.contains(&"network"),
        "not host network: {namespaces:?}"
    );
    let pid = ds.pid().expect("the container's pid");
    for (k, v) in daemonset::capabilities(pid) {
        if k != "CapAmb" || !v.is_empty() {
            assert_eq!(
                u64::from_str_radix(&v, 16).unwrap(),
                0,
                "{k} of the installer"
            );
        }
    }
    assert_eq!(
        std::fs::read_link(format!("/proc/{pid}/ns/net")).unwrap(),
        std::fs::read_link(format!("/proc/{}/ns/net", node.containerd_pid())).unwrap(),
        "the installer is not in the node's network namespace"
    );

    // What it installed: the plugin (a copy, not a link), its entry last,
    // loaded by containerd.
    let plugin = node.bin_dir().join("linkerd-cni");
    assert!(plugin.symlink_metadata().unwrap().file_type().is_file());
    assert_eq!(
        std::fs::read(&plugin).unwrap(),
        std::fs::read(artifacts::linkerd_cni()).unwrap()
    );
    let chain = node.wait_cni_loaded("the chain with linkerd-cni", |s| {
        s.iter().any(|t| t.contains("linkerd-cni"))
    });
    let ours: Value = serde_json::from_str(&chain[1]).unwrap();
    assert_eq!(types(&ours), ["ptp", "portmap", "tuning", "linkerd-cni"]);

    kube::serve_meshed(&api, "web-0");
    kube::serve_unmeshed(&api, "db-0");
    let meshed = node.run_pod(APP_NAMESPACE, "web-0").unwrap();
    let unmeshed = node.run_pod(APP_NAMESPACE, "db-0").unwrap();
    meshed.netns().expect_reference_rules();
    unmeshed.netns().expect_no_rules();
    meshed.stop_and_remove().unwrap();
    unmeshed.stop_and_remove().unwrap();
    assert!(reserved_ips(&node, &net).is_empty());
    // Still ready after serving pods.
    assert_eq!(ds.probe().0, 0, "{}", ds.log());
    drop(ds);
    drop(api);
    shutdown_clean(node);
}

/// A process's identity: pid and start time (pids are reused).
fn process_identity(pid: u32) -> Option<(u32, String)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, rest) = stat.rsplit_once(')')?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // After the command: state is field 3, starttime field 22.
    (fields.first() != Some(&"Z")).then(|| (pid, fields.get(19).unwrap_or(&"").to_string()))
}

/// A test that fails half-way (a sandbox running, containerd serving)
/// still leaves nothing: the Drop guards stop and remove it all.
#[test]
fn a_failing_test_leaves_nothing_behind() {
    let seen = std::sync::Mutex::new(None);
    let res = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let (node, api, _net) = meshing_node();
        kube::serve_meshed(&api, "web-0");
        let sbx = node.run_pod(APP_NAMESPACE, "web-0").unwrap();
        let pause = sbx.status().pid().unwrap();
        *seen.lock().unwrap() = Some((
            [node.containerd_pid(), pause].map(|p| process_identity(p).unwrap()),
            node.dir().to_path_buf(),
            node.netns().path().to_path_buf(),
            node.cgroup_parent().to_string(),
        ));
        panic!("deliberate panic: the Drop guards must still clean up");
    }));
    assert!(res.is_err());
    let (processes, dir, netns, cgroup) = seen.into_inner().unwrap().unwrap();
    for (pid, started) in processes {
        assert_ne!(
            process_identity(pid),
            Some((pid, started)),
            "process {pid} still running"
        );
    }
    for p in [&dir, &netns] {
        assert!(!p.exists(), "{} left behind", p.display());
    }
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap();
    for line in mounts.lines().filter(|l| l.contains(" cgroup")) {
        let mnt = line.split(' ').nth(1).unwrap();
        let d = std::path::Path::new(mnt).join(&cgroup);
        assert!(!d.exists(), "{} left behind", d.display());
    }
    assert!(
        !mounts.contains(&dir.display().to_string()),
        "mounts under {} left behind",
        dir.display()
    );
}

/// Whether `source`, a network list containerd loaded, is `net` with
/// linkerd-cni last, in owned mode (our own copy, carrying the marker) or
/// inline (the primary's file).
fn meshing_in(source: &str, net: &str, owned: bool) -> bool {
    serde_json::from_str::<Value>(source).is_ok_and(|v| {
        v["name"] == net
            && v["plugins"]
                .as_array()
                .and_then(|p| p.last())
                .is_some_and(|last| {
                    last["type"] == "linkerd-cni" && last[MARKER_KEY].is_object() == owned
                })
    })
}

/// What is wrong with the node's attachments now: a sandbox that libcni's
/// result cache shows attached to one network more than once, a running
/// sandbox of `live` that has no entry for `net`, or whose netns has more
/// or fewer than one link and one address but loopback's.
fn double_attachments(node: &CriNode, net: &str, live: &[(String, String)]) -> Vec<String> {
    let mut seen: BTreeMap<(String, String), Vec<String>> = BTreeMap::new();
    for (file, text) in node.cni_results() {
        let v: Value = serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("result cache entry {file}: {e}: {text}"));
        let field = |k: &str| v[k].as_str().unwrap_or_default().to_string();
        seen.entry((field("containerId"), field("networkName")))
            .or_default()
            .push(field("ifName"));
    }
    let mut problems: Vec<String> = seen
        .iter()
        .filter(|(_, ifs)| ifs.len() != 1)
        .map(|((id, n), ifs)| {
            format!(
                "sandbox {id}: {} cache entries for {n:?}: {ifs:?}",
                ifs.len()
            )
        })
        .collect();
    for (name, id) in live {
        if !seen.contains_key(&(id.clone(), net.to_string())) {
            problems.push(format!("{name} ({id}): no cache entry for {net:?}"));
        }
        let sbx = node.sandbox(id.clone());
        let ns = sbx.netns();
        let (links, addrs) = (ns.links(), ns.ipv4_addrs_all());
        if links.len() != 1 || addrs.len() != 1 {
            problems.push(format!(
                "{name} ({id}): links {links:?}, addresses {addrs:?}"
            ));
        }
        drop(ns);
        sbx.detach();
    }
    problems
}

/// `count` pods (every other one meshed) created at once through CRI,
/// retried while the plugin asks to, as the kubelet would: each pod's name
/// and sandbox id. A failed RunPodSandbox or a pod with the wrong rules is
/// pushed to `problems`; a meshed pod that came up without rules counts in
/// the returned total (reported, not asserted: the mode switch's window).
fn burst_of_pods(
    node: &CriNode,
    api: &FakeApiServer,
    tag: &str,
    count: usize,
    problems: &mut Vec<String>,
) -> (Vec<(String, String)>, usize) {
    let names: Vec<(String, bool)> = (0..count)
        .map(|i| (format!("{tag}-{i}"), i % 2 == 0))
        .collect();
    for (n, meshed) in &names {
        if *meshed {
            kube::serve_meshed(api, n);
        } else {
            kube::serve_unmeshed(api, n);
        }
    }
    let outcomes: Vec<_> = std::thread::scope(|s| {
        let handles: Vec<_> = names
            .iter()
            .map(|(name, meshed)| {
                s.spawn(move || (name, *meshed, measure::run_retried(node, name).0))
            })
            .collect();
        handles.into_iter().filter_map(|h| h.join().ok()).collect()
    });
    let (mut live, mut unmeshed) = (Vec::new(), 0);
    for (name, meshed, run) in outcomes {
        match run {
            Ok(sbx) => {
                let ns = sbx.netns();
                if meshed && !ns.has_linkerd_rules() {
                    unmeshed += 1;
                } else if meshed {
                    if let Err(e) = std::panic::catch_unwind(|| ns.expect_reference_rules()) {
                        problems.push(format!("{name}: partial rules: {e:?}"));
                    }
                } else if ns.has_linkerd_rules() {
                    problems.push(format!("{name}: unmeshed, with rules"));
                }
                drop(ns);
                live.push((name.clone(), sbx.detach()));
            }
            Err(e) => problems.push(format!("{name}: RunPodSandbox: {e}")),
        }
    }
    (live, unmeshed)
}

/// `chain_mode: auto` follows containerd's `max_conf_num` across restarts.
/// At 1 the installer picks owned mode (its own copy of the primary's
/// network sorts first); containerd is then restarted with 0, which loads
/// every file, and 10 pods are created the moment it serves CRI: had our
/// copy still been there, each would be attached to the network twice
/// (two interfaces, two host-local addresses, two result-cache entries).
/// The installer watches containerd's config and leaves owned mode before
/// the restarted containerd runs a pod. Then back to 1, and 10 more pods.
/// Every sandbox, those from before the restarts too, has one interface
/// and one address and one cache entry for the network; once all are
/// removed, no address and no cache entry is left.
#[test]
fn containerd_restarted_with_another_max_conf_num_attaches_no_pod_twice() {
    let (node, api, net) = primary_only_node("mcn", Primary::Bridge);
    let mut node = CriNode::start_with_max_conf_num(node, 1);
    let inst = installer::start(
        &node,
        &api,
        &[
            ("LINKERD_CNI_CHAIN_MODE", "auto"),
            ("LINKERD_CNI_WATCH", "true"),
            ("LINKERD_CNI_RESYNC_SECONDS", "10"),
        ],
    );
    let owned = |node: &CriNode| {
        node.wait_cni_loaded("linkerd-cni's own copy (owned mode)", |s| {
            s.len() == 2 && meshing_in(&s[1], &net, true)
        })
    };
    owned(&node);

    let mut problems = Vec::new();
    kube::serve_meshed(&api, "web-0");
    kube::serve_unmeshed(&api, "db-0");
    let web = node.run_pod(APP_NAMESPACE, "web-0").unwrap();
    let db = node.run_pod(APP_NAMESPACE, "db-0").unwrap();
    web.netns().expect_reference_rules();
    db.netns().expect_no_rules();
    let mut live = vec![
        ("web-0".to_string(), web.detach()),
        ("db-0".to_string(), db.detach()),
    ];
    assert_eq!(double_attachments(&node, &net, &live), Vec::<String>::new());

    let mut unmeshed = Vec::new();
    for (max_conf_num, tag) in [(0, "to-all"), (1, "to-first")] {
        node.restart_containerd(max_conf_num);
        let (pods, n) = burst_of_pods(&node, &api, tag, 10, &mut problems);
        unmeshed.push((max_conf_num, n));
        live.extend(pods);
        // Once each: a pod attached twice stays so.
        for p in double_attachments(&node, &net, &live) {
            if !problems.iter().any(|seen| seen.ends_with(&p)) {
                problems.push(format!(
                    "after the restart to max_conf_num {max_conf_num}: {p}"
                ));
            }
        }
        if max_conf_num == 0 {
            node.wait_cni_loaded(
                "the primary's file with linkerd-cni (inline mode) alone",
                |s| s.len() == 2 && meshing_in(&s[1], &net, false),
            );
        }
    }
    owned(&node);
    eprintln!(
        "meshed pods of each burst that came up without rules (max_conf_num, count): {unmeshed:?}"
    );

    // Removed before judging, so that a failure also shows what a double
    // attachment leaks.
    let removals: Vec<Option<String>> = std::thread::scope(|s| {
        let handles: Vec<_> = live
            .iter()
            .map(|(name, id)| {
                let sbx = node.sandbox(id.clone());
                s.spawn(move || {
                    sbx.stop_and_remove()
                        .err()
                        .map(|e| format!("{name}: stop/remove: {e}"))
                })
            })
            .collect();
        handles.into_iter().filter_map(|h| h.join().ok()).collect()
    });
    problems.extend(removals.into_iter().flatten());
    let leaked = reserved_ips(&node, &net);
    if !leaked.is_empty() {
        problems.push(format!(
            "host-local addresses left after removal: {leaked:?}"
        ));
    }
    let cached: Vec<String> = node.cni_results().into_iter().map(|(f, _)| f).collect();
    if !cached.is_empty() {
        problems.push(format!(
            "result cache entries left after removal: {cached:?}"
        ));
    }
    assert!(
        problems.is_empty(),
        "{problems:#?}\n--- installer log ---\n{}",
        inst.log()
    );
    drop(inst);
    drop(api);
    shutdown_clean(node);
}

/// linkerd-cni's image run as `deploy/linkerd-cni.yaml` runs it: one
/// container, every variable the manifest sets (the repair controller's
/// too), the plugin's state dir and the runtime's settings mounted. It
/// picks owned mode from the node's containerd config (max_conf_num 1),
/// answers the plugin's pod lookups from its watch (a meshed pod started
/// through containerd gets its rules with no request made with the
/// plugin's own token), and deletes a meshed pod whose
/// linkerd-network-validator exited 95, once.
#[test]
fn the_image_run_as_deploy_runs_it_answers_lookups_and_repairs_pods() {
    let (node, api, net) = primary_only_node("deploy", Primary::Ptp);
    let node = CriNode::start(node);
    node.wait_cni_loaded("the primary's chain", |s| s.len() == 2);
    let deployed = daemonset::Deployed {
        node_name: node.kube_name(),
        pod_name: "linkerd-cni-x7k2p".into(),
    };
    api.put_node(objects::node(&deployed.node_name, &[]));

    let mut ds = daemonset::start_deployed(
        &node,
        &api,
        &installer::template(&node),
        artifacts::workspace_bin,
        &deployed,
    );
    ds.wait_ready(Duration::from_secs(30))
        .unwrap_or_else(|e| panic!("readiness probe: {e}"));
    node.wait_cni_loaded("linkerd-cni's own copy (owned mode)", |s| {
        s.len() == 2 && meshing_in(&s[1], &net, true)
    });
    let socket = node.state_dir().join(linkerd_cni_lookup::SOCKET);
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !socket.exists() {
        assert!(
            std::time::Instant::now() < deadline,
            "no lookup socket at {}:\n{}",
            socket.display(),
            ds.log()
        );
        std::thread::sleep(Duration::from_millis(20));
    }

    let on_node = |p: objects::Pod| objects::on_node(p.json(), &deployed.node_name);
    // The kubelet passes the pod's UID, which the agent checks its answer
    // against.
    let run = |pod: objects::Pod, name: &str| {
        let mut spec = node.sandbox_spec(APP_NAMESPACE, name);
        spec.uid = api.put_pod(on_node(pod));
        node.run_pod_spec(&spec).unwrap()
    };
    let meshed = run(objects::Pod::meshed(APP_NAMESPACE, "web-0"), "web-0");
    let unmeshed = run(objects::Pod::new(APP_NAMESPACE, "db-0"), "db-0");
    meshed.netns().expect_reference_rules();
    unmeshed.netns().expect_no_rules();
    let plugin_tokens: Vec<String> = api
        .minted()
        .into_iter()
        .filter(|m| m.account.ends_with("/linkerd-cni-plugin"))
        .map(|m| m.token)
        .collect();
    assert!(!plugin_tokens.is_empty(), "no token minted for the plugin");
    for name in ["web-0", "db-0"] {
        let by_plugin = api
            .bearers(&kube::pod_path(name))
            .iter()
            .filter(|b| plugin_tokens.contains(b))
            .count();
        assert_eq!(
            by_plugin,
            0,
            "{name} was asked for with the plugin's token: the agent did not answer\n{}",
            ds.log()
        );
    }

    // A meshed pod of this node whose validator found no redirect.
    let validator = "linkerd-network-validator";
    let broken = objects::owned_by(
        objects::with_init_status(
            on_node(
                objects::Pod::meshed(APP_NAMESPACE, "web-broken")
                    .label("linkerd.io/control-plane-ns", "linkerd"),
            ),
            validator,
            Some(95),
        ),
        "ReplicaSet",
        "web-5d8f",
        true,
    );
    api.put_pod(broken);
    let deleted = || {
        api.deletions()
            .iter()
            .filter(|d| d.name == "web-broken")
            .count()
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    while deleted() == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "web-broken was not deleted:\n{}",
            ds.log()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // Time for a second deletion, were there one.
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(deleted(), 1, "{:?}", api.deletions());

    meshed.stop_and_remove().unwrap();
    unmeshed.stop_and_remove().unwrap();
    assert!(reserved_ips(&node, &net).is_empty());
    assert_eq!(ds.probe().0, 0, "{}", ds.log());
    drop(ds);
    drop(api);
    shutdown_clean(node);
}
