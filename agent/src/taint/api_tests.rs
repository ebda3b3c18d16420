//! [`remove_taint`], what the installer calls once its node is ready,
//! against the fake API server: the taint goes and nothing else does, also
//! when another writer changes the taint list meanwhile; an absent taint
//! costs one GET and no write; a refused patch (403), refused credentials
//! (401), a missing node and a silent server each have their failure kind,
//! in bounded time.

use std::time::{Duration, Instant};

use linkerd_cni_kube::kubeconfig;

use super::{Failure as FailureKind, TaintError, TaintOutcome, remove_taint};
use crate::api;
use serde_json::Value;
use testkit::objects::{node, node_path, taint_keys};
use testkit::{FakeApiServer, Mode, TempDir};

const NODE: &str = "node-1";
const KEY: &str = "linkerd.io/cni-not-ready";

struct Cluster {
    api: FakeApiServer,
    _dir: TempDir,
    kubeconfig: std::path::PathBuf,
}

fn cluster(taints: &[(&str, &str)]) -> Cluster {
    let api = FakeApiServer::start();
    let dir = TempDir::new("lcni-kube-taint").unwrap();
    let kubeconfig = api.write_kubeconfig(dir.path()).unwrap();
    api.set(&node_path(NODE), node(NODE, taints));
    Cluster {
        api,
        _dir: dir,
        kubeconfig,
    }
}

impl Cluster {
    fn remove_from(&self, node: &str, budget: Duration) -> Result<TaintOutcome, TaintError> {
        let api = kubeconfig::load(&self.kubeconfig).unwrap();
        api::blocking(api, budget, async |a| remove_taint(a, node, KEY).await).unwrap()
    }

    fn remove(&self) -> Result<TaintOutcome, TaintError> {
        self.remove_from(NODE, Duration::from_secs(5))
    }

    fn keys(&self) -> Vec<String> {
        taint_keys(&self.api.object(&node_path(NODE)).unwrap())
    }
}

/// Removed or absent (`None`), or failed with `kind`; the outcome, or the
/// error and its hint, say `says`.
fn expect(answer: Result<TaintOutcome, TaintError>, kind: Option<FailureKind>, says: &str) {
    let (got, text) = match &answer {
        Ok(o @ TaintOutcome::Removed { .. }) => (None, format!("removed: {o}")),
        Ok(o @ TaintOutcome::Absent { .. }) => (None, format!("absent: {o}")),
        Err(e) => (Some(e.kind), e.message.clone()),
    };
    assert_eq!(got, kind, "{text}");
    assert!(text.contains(says), "expected {says:?} in: {text}");
}

#[test]
fn removes_only_its_taint() {
    let c = cluster(&[
        ("node.kubernetes.io/not-ready", "NoSchedule"),
        (KEY, "NoSchedule"),
        ("example.com/gpu", "NoSchedule"),
        // The same key with another effect goes too: the key is ours.
        (KEY, "NoExecute"),
    ]);
    expect(
        c.remove(),
        None,
        &format!("removed: taint {KEY}:NoSchedule, {KEY}:NoExecute from node {NODE}"),
    );
    assert_eq!(
        c.keys(),
        ["node.kubernetes.io/not-ready", "example.com/gpu"]
    );
    assert_eq!(c.api.patches(&node_path(NODE)).len(), 1);
    // Run again: absent, one more GET, no write.
    expect(
        c.remove(),
        None,
        &format!("absent: node {NODE} has no taint {KEY}"),
    );
    assert_eq!(c.api.patches(&node_path(NODE)).len(), 1);
}

#[test]
fn absent_taint_is_no_write() {
    for taints in [vec![], vec![("example.com/gpu", "NoSchedule")]] {
        let c = cluster(&taints);
        expect(c.remove(), None, "absent: ");
        assert_eq!(c.api.requests(&node_path(NODE)), 1, "one GET");
        assert_eq!(c.api.total_patches(), 0);
    }
    // A node whose taints are null.
    let c = cluster(&[]);
    let mut n = node(NODE, &[]);
    n["spec"]["taints"] = Value::Null;
    c.api.set(&node_path(NODE), n);
    expect(c.remove(), None, "absent: ");
    assert_eq!(c.api.total_patches(), 0);
}

/// Another controller inserts its taint at the front between our GET and
/// our PATCH: the test op fails (422), the node is read again, and only
/// our taint goes.
#[test]
fn concurrent_change_of_the_taints_is_kept() {
    let c = cluster(&[(KEY, "NoSchedule"), ("example.com/gpu", "NoSchedule")]);
    c.api.change_before_next_patch(
        &node_path(NODE),
        node(
            NODE,
            &[
                ("other.io/startup", "NoSchedule"),
                (KEY, "NoSchedule"),
                ("example.com/gpu", "NoSchedule"),
            ],
        ),
    );
    expect(c.remove(), None, "removed: ");
    assert_eq!(c.keys(), ["other.io/startup", "example.com/gpu"]);
    assert_eq!(
        c.api.patches(&node_path(NODE)).len(),
        2,
        "one refused, one applied"
    );

    // The taint removed by someone else meanwhile: absent, nothing else
    // touched.
    let c = cluster(&[(KEY, "NoSchedule"), ("example.com/gpu", "NoSchedule")]);
    c.api.change_before_next_patch(
        &node_path(NODE),
        node(NODE, &[("example.com/gpu", "NoSchedule")]),
    );
    expect(c.remove(), None, "absent: ");
    assert_eq!(c.keys(), ["example.com/gpu"]);
}

#[test]
fn refusals_have_their_kinds() {
    // RBAC with get but not patch on nodes (the linkerd2-cni chart's).
    let c = cluster(&[(KEY, "NoSchedule")]);
    c.api.forbid_patch(&node_path(NODE));
    expect(c.remove(), Some(FailureKind::Forbidden), "HTTP 403");
    expect(
        c.remove(),
        Some(FailureKind::Forbidden),
        &format!("kubectl taint nodes {NODE} {KEY}-"),
    );
    assert_eq!(c.keys(), [KEY]);

    // No get on nodes either.
    let c = cluster(&[(KEY, "NoSchedule")]);
    c.api.set_mode(Mode::Forbidden);
    expect(c.remove(), Some(FailureKind::Forbidden), "HTTP 403");

    let c = cluster(&[(KEY, "NoSchedule")]);
    c.api.set_mode(Mode::Unauthorized);
    expect(c.remove(), Some(FailureKind::Unauthorized), "HTTP 401");

    // Overloaded: retried (a few attempts, well within the budget, so that
    // the answer is the server's and not the budget's), then "try again
    // later".
    let c = cluster(&[(KEY, "NoSchedule")]);
    c.api.fail_next(100, 503);
    expect(c.remove(), Some(FailureKind::Transient), "HTTP 503");
    assert!(c.api.requests(&node_path(NODE)) > 1, "retried");
    assert_eq!(c.keys(), [KEY]);

    // A wrong node name.
    let c = cluster(&[]);
    expect(
        c.remove_from("node-2", Duration::from_secs(5)),
        Some(FailureKind::Other),
        "LINKERD_CNI_NODE_NAME",
    );
}

#[test]
fn a_silent_api_server_is_bounded_by_the_budget() {
    // Accepts connections (the kernel's backlog) and never answers.
    let hole = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let c = cluster(&[(KEY, "NoSchedule")]);
    let text = std::fs::read_to_string(&c.kubeconfig).unwrap().replace(
        &format!("[{}]:{}", c.api.addr().ip(), c.api.addr().port()),
        &format!("[127.0.0.1]:{}", hole.local_addr().unwrap().port()),
    );
    std::fs::write(&c.kubeconfig, text).unwrap();
    let start = Instant::now();
    let answer = c.remove_from(NODE, Duration::from_secs(1));
    let took = start.elapsed();
    expect(answer, Some(FailureKind::Transient), "cannot read node");
    // One second of budget, plus slack on a shared machine.
    assert!(took < Duration::from_secs(5), "took {took:?}");
    drop(hole);
}
