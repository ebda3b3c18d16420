//! The harness itself: isolation from the machine, cleanup, netns entry,
//! and the runtime's choice of config file. If these fail, no other
//! conformance result can be trusted.

use std::os::unix::fs::MetadataExt;
use std::process::Command;
use std::sync::Mutex;

use conformance::chains::{self, Primary};
use conformance::{Node, PodSpec, sys};
use serde_json::json;

fn link_exists(netns: Option<&str>, name: &str) -> bool {
    let mut cmd = Command::new("ip");
    if let Some(ns) = netns {
        cmd.args(["-n", ns]);
    }
    cmd.args(["link", "show", "dev", name]);
    sys::output(&mut cmd).status.success()
}

#[test]
fn links_and_rules_stay_in_the_node_netns() {
    let node = Node::new();
    let net = node.network_name("iso");
    node.write_conf(
        &format!("10-{net}.conflist"),
        &chains::conflist(
            &net,
            "1.0.0",
            chains::typical_chain(&node, Primary::Bridge, None),
        ),
    );
    let pod = node.pod(PodSpec::bare().capability_args(chains::port_mapping(18080)));
    let added = node.add(&net, &pod).unwrap();
    let result = added.json();

    let node_side: Vec<&str> = result["interfaces"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|i| i.get("sandbox").is_none())
        .map(|i| i["name"].as_str().unwrap())
        .collect();
    assert_eq!(node_side.len(), 2, "bridge and host veth in {result}");
    for link in node_side {
        assert!(link_exists(Some(node.netns().name()), link), "{link}");
        assert!(!link_exists(None, link), "{link} leaked onto the machine");
    }
    // portmap's DNAT chain is in the node's own table.
    let save = sys::checked(&mut node.netns().command("iptables-save"));
    assert!(save.contains("CNI-HOSTPORT-DNAT"), "{save}");
    node.del(&net, &pod).unwrap();
}

#[test]
fn everything_is_removed_on_drop_even_after_a_panic() {
    let seen = Mutex::new(None);
    let res = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let node = Node::new();
        let pod = node.pod(PodSpec::bare());
        *seen.lock().unwrap() = Some((
            node.netns().path().to_path_buf(),
            pod.netns_path().to_path_buf(),
            node.dir().to_path_buf(),
        ));
        panic!("deliberate panic: the Drop guards must still clean up");
    }));
    assert!(res.is_err());
    let (node_ns, pod_ns, dir) = seen.into_inner().unwrap().unwrap();
    assert!(!node_ns.exists(), "{} left behind", node_ns.display());
    assert!(!pod_ns.exists(), "{} left behind", pod_ns.display());
    assert!(!dir.exists(), "{} left behind", dir.display());
}

#[test]
fn enter_runs_inside_the_node_netns() {
    let node = Node::new();
    let want = std::fs::metadata(node.netns().path()).unwrap();
    let inside = node.enter(|| std::fs::metadata("/proc/thread-self/ns/net").unwrap());
    assert_eq!(
        (inside.dev(), inside.ino()),
        (want.dev(), want.ino()),
        "enter() ran outside the node netns"
    );
    let here = std::fs::metadata("/proc/thread-self/ns/net").unwrap();
    assert_ne!(here.ino(), want.ino(), "the test thread itself moved");
}

#[test]
fn active_conf_is_the_first_config_file_in_byte_order() {
    let node = Node::new();
    assert_eq!(node.active_conf(), None);
    let conf = json!({"cniVersion": "1.0.0", "name": "x", "type": "ptp"});
    node.write_conf("20-b.conflist", &conf);
    node.write_conf("10-a.txt", &conf);
    std::fs::create_dir(node.conf_dir().join("00-dir.conflist")).unwrap();
    node.write_conf("10-a.conflist", &conf);
    node.write_conf("10-a.conf", &conf);
    assert_eq!(node.active_conf(), Some(node.conf_dir().join("10-a.conf")));
    node.write_conf("Z.json", &conf);
    assert_eq!(node.active_conf(), Some(node.conf_dir().join("10-a.conf")));
    // Dotfiles are config files to a runtime too.
    node.write_conf(".tmp.conflist", &conf);
    assert_eq!(
        node.active_conf(),
        Some(node.conf_dir().join(".tmp.conflist"))
    );
}
