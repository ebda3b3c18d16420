//! The readiness gate at node start, with the real installer, the real
//! plugin binary (which the installer runs for the API call) and the fake
//! API server inside the node:
//!
//! - a node registered with the startup taint keeps it while the node is
//!   not ready (no kubeconfig yet; no healthy chain yet), and loses it,
//!   and only it, once the node is ready;
//! - a node without the taint costs one GET and no write, and is not asked
//!   about again;
//! - an API that refuses the patch (403, the linkerd2-cni chart's RBAC) is
//!   one clear log line, and the installer keeps chaining the node;
//! - without a node name (the linkerd2-cni chart sets none) the installer
//!   says so once and never asks.
//!
//! Bounds are "within a few resyncs" plus a grace for a loaded, shared
//! machine: they bound the scenario, they do not time the installer.

use std::path::{Path, PathBuf};
use std::time::Duration;

use conformance::Node;
use conformance::chains::{self, Primary};
use conformance::installer::{self, Installer};
use serde_json::Value;
use testkit::FakeApiServer;
use testkit::objects::{node as node_object, node_path, taint_keys};

const RESYNC: Duration = Duration::from_secs(1);
/// Scheduling slack on a small shared machine running other tests.
const GRACE: Duration = Duration::from_secs(10);
const KEY: &str = "linkerd.io/cni-not-ready";
const NODE: &str = "worker-1";
const WAITING: &str = "keeping startup taint linkerd.io/cni-not-ready on node worker-1";

struct Setup {
    node: Node,
    api: FakeApiServer,
    net: String,
    conf: Value,
    /// The service-account dir the installer reads (token, CA).
    sa_dir: PathBuf,
}

fn setup(taints: &[(&str, &str)]) -> Setup {
    let node = Node::without_linkerd_cni();
    let api = node.start_api_server_only();
    api.set(&node_path(NODE), node_object(NODE, taints));
    let net = node.network_name("taint");
    let conf = chains::conflist(
        &net,
        "1.0.0",
        chains::typical_chain(&node, Primary::Ptp, None),
    );
    let sa_dir = node.scratch_dir().join("serviceaccount");
    std::fs::create_dir(&sa_dir).unwrap();
    Setup {
        node,
        api,
        net,
        conf,
        sa_dir,
    }
}

impl Setup {
    /// The kubelet mounts the service account's token and CA.
    fn mount_token(&self) {
        write(&self.sa_dir.join("ca.crt"), self.api.ca_pem());
        write(&self.sa_dir.join("namespace"), "linkerd-cni");
        write(&self.sa_dir.join("token"), self.api.token());
    }

    /// The primary CNI writes its config.
    fn write_primary(&self) {
        self.node
            .write_conf(&format!("10-{}.conflist", self.net), &self.conf);
    }

    fn start(&self, node_name: Option<&str>) -> Installer {
        let resync = RESYNC.as_secs().to_string();
        let sa = self.sa_dir.display().to_string();
        let mut extra = vec![
            ("LINKERD_CNI_RESYNC_SECONDS", resync.as_str()),
            ("LINKERD_CNI_SERVICE_ACCOUNT_DIR", sa.as_str()),
        ];
        if let Some(n) = node_name {
            extra.push(("LINKERD_CNI_NODE_NAME", n));
        }
        installer::start(&self.node, &self.api, &extra)
    }

    fn wait_chained(&self, inst: &Installer) {
        self.node
            .wait_healthy(
                &installer::expected_entry(&self.node),
                &self.conf,
                RESYNC * 3 + GRACE,
            )
            .unwrap_or_else(|e| panic!("{e}\n{}", inst.log()));
    }

    fn taints(&self) -> Vec<String> {
        taint_keys(&self.api.object(&node_path(NODE)).unwrap())
    }

    fn patches(&self) -> usize {
        self.api.patches(&node_path(NODE)).len()
    }

    fn node_requests(&self) -> usize {
        self.api.requests(&node_path(NODE))
    }

    /// The primary rewrites its config without linkerd-cni; waits until
    /// the installer has chained it again: at least one more pass ran.
    fn another_pass(&self, inst: &Installer) {
        self.write_primary();
        self.wait_chained(inst);
    }
}

/// Writes `p` whole at once (temp file, rename), as the kubelet's atomic
/// writer does: the installer never reads a half-written token or CA.
fn write(p: &Path, content: &str) {
    let tmp = p.with_extension("tmp");
    std::fs::write(&tmp, content)
        .and_then(|()| std::fs::rename(&tmp, p))
        .unwrap_or_else(|e| panic!("cannot write {}: {e}", p.display()));
}

fn wait_log(inst: &Installer, needle: &str) {
    assert!(
        inst.wait_log(needle, RESYNC * 3 + GRACE),
        "the installer never logged {needle:?}:\n{}",
        inst.log()
    );
}

/// The log line holding `needle`.
fn log_line(inst: &Installer, needle: &str) -> String {
    let log = inst.log();
    log.lines()
        .find(|l| l.contains(needle))
        .unwrap_or_else(|| panic!("no line with {needle:?}:\n{log}"))
        .to_string()
}

/// No kubeconfig can be written (the token is not mounted yet): the
/// taint stays, and no API call is made; once the token is there, the
/// kubeconfig is written, the node chained and the taint removed, the
/// other taints kept.
#[test]
fn taint_stays_until_the_kubeconfig_is_usable() {
    let s = setup(&[
        ("node.kubernetes.io/not-ready", "NoSchedule"),
        (KEY, "NoSchedule"),
    ]);
    s.write_primary();
    let inst = s.start(Some(NODE));
    wait_log(&inst, WAITING);
    let line = log_line(&inst, WAITING);
    assert!(
        line.contains("kubeconfig"),
        "not waiting for the kubeconfig: {line}"
    );
    assert_eq!(s.node_requests(), 0, "no API call before the node is ready");
    assert!(!s.node.kubeconfig_path().exists());

    s.mount_token();
    wait_log(&inst, "startup taint: removed: ");
    assert_eq!(s.taints(), ["node.kubernetes.io/not-ready"]);
    assert_eq!(s.patches(), 1);
    assert!(s.node.kubeconfig_path().exists());
    s.node
        .wait_healthy(&installer::expected_entry(&s.node), &s.conf, Duration::ZERO)
        .unwrap();

    // Removed: never asked again, whatever the passes.
    let requests = s.node_requests();
    s.another_pass(&inst);
    s.another_pass(&inst);
    assert_eq!(s.node_requests(), requests);
}

/// No primary CNI config yet (the chain cannot be healthy): the taint
/// stays; once the primary writes its config and the installer chains it,
/// the taint goes.
#[test]
fn taint_stays_until_the_chain_is_healthy() {
    let s = setup(&[(KEY, "NoSchedule")]);
    s.mount_token();
    let inst = s.start(Some(NODE));
    wait_log(&inst, WAITING);
    let line = log_line(&inst, WAITING);
    assert!(line.contains("chain"), "not waiting for the chain: {line}");
    assert!(s.node.kubeconfig_path().exists(), "{}", inst.log());
    assert_eq!(s.node_requests(), 0, "no API call before the node is ready");
    assert_eq!(s.taints(), [KEY]);

    s.write_primary();
    s.wait_chained(&inst);
    wait_log(&inst, "startup taint: removed: ");
    assert!(s.taints().is_empty());
    assert_eq!(s.patches(), 1);
}

/// A node without the taint: one GET, no write, not asked again.
#[test]
fn absent_taint_is_one_read_and_no_write() {
    let s = setup(&[("example.com/gpu", "NoSchedule")]);
    s.mount_token();
    s.write_primary();
    let inst = s.start(Some(NODE));
    s.wait_chained(&inst);
    wait_log(&inst, "startup taint: absent: ");
    assert_eq!(s.node_requests(), 1);
    s.another_pass(&inst);
    s.another_pass(&inst);
    assert_eq!(
        s.node_requests(),
        1,
        "asked again after the taint was absent"
    );
    assert_eq!(s.api.total_patches(), 0);
    assert_eq!(s.taints(), ["example.com/gpu"]);
}

/// RBAC with get but not patch on nodes (the linkerd2-cni chart's): one
/// warning naming the 403 and what to do, and the installer keeps chaining
/// the node.
#[test]
fn refused_patch_is_one_log_line_and_the_node_stays_chained() {
    let s = setup(&[(KEY, "NoSchedule")]);
    s.api.forbid_patch(&node_path(NODE));
    s.mount_token();
    s.write_primary();
    let inst = s.start(Some(NODE));
    s.wait_chained(&inst);
    wait_log(&inst, "cannot remove startup taint");
    for _ in 0..3 {
        s.another_pass(&inst);
    }
    let log = inst.log();
    let lines: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("cannot remove startup taint"))
        .collect();
    assert_eq!(lines.len(), 1, "{log}");
    for needle in [
        "HTTP 403",
        "kubectl taint nodes worker-1 linkerd.io/cni-not-ready-",
    ] {
        assert!(lines[0].contains(needle), "{needle:?} not in {}", lines[0]);
    }
    assert_eq!(s.taints(), [KEY]);
    assert_eq!(s.patches(), 1, "the 403 is not retried at once");
}

/// The linkerd2-cni chart gives the installer no node name: said once,
/// never asked.
#[test]
fn without_a_node_name_nothing_is_asked() {
    let s = setup(&[(KEY, "NoSchedule")]);
    s.mount_token();
    s.write_primary();
    let inst = s.start(None);
    s.wait_chained(&inst);
    wait_log(&inst, "LINKERD_CNI_NODE_NAME is not set");
    s.another_pass(&inst);
    assert_eq!(s.node_requests(), 0);
    assert_eq!(s.taints(), [KEY]);
}
