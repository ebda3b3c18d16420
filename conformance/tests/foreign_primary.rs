//! A primary conflist that another uid owns with mode 0600, on a node whose
//! installer runs as deploy/ runs it: uid 0 with CHOWN alone (no
//! DAC_READ_SEARCH: with it, open_by_handle_at reaches every file of the
//! host). The installer cannot read the primary and says so, naming the
//! file and how to chain it; the plugin, which the runtime runs as root
//! with every capability, keeps the chain at ADD: in owned mode the runtime
//! runs our copy, and the plugin brings it up to the primary's new content
//! (answering code 11 to an ADD that ran the stale copy, which the kubelet
//! retries).

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::time::Duration;

use conformance::chains::{self, Primary};
use conformance::installer;
use conformance::modes::ChainMode;
use conformance::{Completed, Node, Pod, kube};
use serde_json::Value;

/// A primary CNI agent's uid, not root.
const AGENT_UID: u32 = 1000;
/// Scheduling slack on a small shared machine running other tests.
const GRACE: Duration = Duration::from_secs(10);

fn primary_conf(node: &Node, net: &str, generation: u64) -> Value {
    let mut plugins = chains::typical_chain(node, Primary::Ptp, None);
    plugins[0]["mtu"] = (1400 + generation).into();
    chains::conflist(net, "1.0.0", plugins)
}

fn generation_ran(run: &Completed) -> Option<u64> {
    run.execs("ptp")
        .next()
        .and_then(|e| e.stdin["mtu"].as_u64())
        .map(|m| m - 1400)
}

/// ADD as a kubelet retries a sandbox: code 11 means DEL and ADD again.
fn add_as_kubelet(node: &Node, net: &str, pod: &Pod) -> Completed {
    for _ in 0..5 {
        match node.add(net, pod) {
            Ok(run) => return run,
            Err(f) if f.code == Some(11) => {
                node.del(net, pod)
                    .unwrap_or_else(|e| panic!("DEL after code 11: {e}"));
            }
            Err(f) => panic!("ADD failed: {f}"),
        }
    }
    panic!("ADD answered code 11 five times");
}

#[test]
fn a_foreign_0600_primary_is_named_by_the_installer_and_kept_by_the_plugin() {
    let node = Node::without_linkerd_cni();
    let api = node.start_api_server_only();
    let net = node.network_name("foreign");
    let file = format!("10-{net}.conflist");
    let first = primary_conf(&node, &net, 0);
    let path = node.write_conf(&file, &first);
    let inst = installer::start_confined(
        &node,
        &api,
        &["CHOWN"],
        &[
            ChainMode::Owned.installer_env(),
            ("LINKERD_CNI_RESYNC_SECONDS", "1"),
        ],
    );
    let desired = ChainMode::Owned.entry(installer::expected_entry(&node));
    node.wait_healthy(&desired, &first, GRACE)
        .unwrap_or_else(|e| panic!("{e}\n{}", inst.log()));

    // The primary's agent, running as another uid, rewrites its file with
    // mode 0600, atomically.
    let second = primary_conf(&node, &net, 1);
    let tmp = node.conf_dir().join(format!(".{file}.tmp"));
    std::fs::write(&tmp, serde_json::to_string_pretty(&second).unwrap()).unwrap();
    std::os::unix::fs::chown(&tmp, Some(AGENT_UID), Some(AGENT_UID)).unwrap();
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o600)).unwrap();
    std::fs::rename(&tmp, &path).unwrap();

    // The installer cannot read it, and says which file and what to do.
    assert!(
        inst.wait_log("linkerd-cni chain repair", GRACE),
        "{}",
        inst.log()
    );
    let log = inst.log();
    assert!(
        log.contains(&file) && log.contains("CAP_DAC_READ_SEARCH"),
        "{log}"
    );

    // A pod's ADD: the plugin (root, every capability) reads the primary
    // and runs its current chain, with linkerd-cni.
    let pod = node.pod(kube::serve_unmeshed(&api, "plain"));
    let run = add_as_kubelet(&node, &net, &pod);
    assert_eq!(generation_ran(&run), Some(1), "the primary's new chain ran");
    assert!(run.execs("linkerd-cni").next().is_some(), "linkerd-cni ran");
    node.wait_healthy(&desired, &second, GRACE)
        .unwrap_or_else(|e| panic!("{e}\n{}", inst.log()));
    // The primary's file is still its agent's.
    let m = std::fs::metadata(&path).unwrap();
    assert_eq!((m.uid(), m.mode() & 0o7777), (AGENT_UID, 0o600));
    node.del(&net, &pod).unwrap_or_else(|e| panic!("DEL: {e}"));
}
