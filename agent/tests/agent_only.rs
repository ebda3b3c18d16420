//! `LINKERD_CNI_AGENT_ONLY`: no credential of the plugin's on the node's
//! disk. The installer mints no token and writes no kubeconfig (and
//! removes one an earlier installer wrote), tells the plugin so in the
//! entry it chains (`kubernetes.agent-only`, no `kubernetes.kubeconfig`),
//! and still beats: the heartbeat is what tells the plugin that an agent is
//! expected.

mod common;

use std::fs;
use std::time::Duration;

use linkerd_cni_state::heartbeat::{self, Liveness};
use nix::sys::signal::Signal;
use serde_json::Value;

use common::*;

const RESYNC: Duration = Duration::from_secs(1);

/// The linkerd-cni entry of the active conflist, when it is last.
fn our_entry(node: &Node) -> Option<Value> {
    let text = fs::read_to_string(node.active()?).ok()?;
    let v: Value = serde_json::from_str(&text).ok()?;
    let last = v["plugins"].as_array()?.last()?.clone();
    (last["type"] == "linkerd-cni").then_some(last)
}

/// Every file's text under `dir`, recursively.
fn texts(dir: &std::path::Path) -> Vec<(String, String)> {
    let mut out = vec![];
    for e in fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(texts(&p));
        } else if let Ok(t) = fs::read_to_string(&p) {
            out.push((p.display().to_string(), t));
        }
    }
    out
}

#[test]
fn agent_only_puts_no_credential_on_the_node_and_says_so_in_the_entry() {
    let node = Node::new("agent-only");
    let state_dir = node.prefix.join("run/linkerd-cni");
    let beat = state_dir.join(heartbeat::HEARTBEAT_FILE);
    node.rotate_service_account("secret-token-1", "CA-1");
    // What an installer without the setting left: a kubeconfig and its token.
    node.write_by_rename(
        KUBECONFIG_NAME,
        "users: [{user: {token: secret-token-0}}]\n",
    );
    node.write_by_rename("10-calico.conflist", &calico_text(0));
    let mut inst = node.start(&[
        ("LINKERD_CNI_RESYNC_SECONDS", "1"),
        ("LINKERD_CNI_UNINSTALL_ON_EXIT", "true"),
        ("LINKERD_CNI_AGENT_ONLY", "true"),
    ]);
    assert!(
        wait_until(RESYNC * 3 + GRACE, || our_entry(&node).is_some()
            && beat.exists()),
        "{}",
        inst.log()
    );
    let entry = our_entry(&node).unwrap();
    assert_eq!(entry["kubernetes"]["agent-only"], true, "{entry}");
    assert!(
        entry["kubernetes"].get("kubeconfig").is_none(),
        "the entry names a kubeconfig: {entry}"
    );
    assert_eq!(entry["cni_conf_dir"], HOST_CONF_DIR);
    assert_eq!(node.kubeconfig(), None, "{}", inst.log());
    assert!(matches!(
        heartbeat::liveness(&state_dir, None),
        Liveness::Alive { .. }
    ));
    // Another pass changes none of it.
    std::thread::sleep(RESYNC * 2);
    assert_eq!(node.kubeconfig(), None);
    for dir in [&node.conf_dir, &state_dir] {
        for (path, text) in texts(dir) {
            assert!(!text.contains("secret-token"), "a token in {path}");
        }
    }

    inst.signal(Signal::SIGTERM);
    assert!(
        inst.wait_exit(UNINSTALL_DRAIN + Duration::from_secs(3))
            .unwrap()
            .success()
    );
    assert!(!beat.exists(), "the uninstall left the heartbeat");
    assert!(our_entry(&node).is_none(), "the uninstall left the entry");
}
