//! `linkerd-cni kube remove-taint`, what the installer runs once its node
//! is ready, against the fake API server: the taint goes and nothing else
//! does, also when another writer changes the taint list meanwhile; an
//! absent taint costs one GET and no write; a refused patch (403), refused
//! credentials (401), a missing node and a silent server each have their
//! exit code, in bounded time.

mod common;

use std::process::{Command, Output};
use std::time::{Duration, Instant};

use serde_json::Value;
use testkit::objects::{node, node_path, taint_keys};
use testkit::{FakeApiServer, Mode, TempDir};

use common::{BIN, stderr};

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
    fn remove(&self, extra: &[&str]) -> Output {
        Command::new(BIN)
            .env_clear()
            .args(["kube", "remove-taint", "--kubeconfig"])
            .arg(&self.kubeconfig)
            .args(["--node", NODE, "--key", KEY])
            .args(extra)
            .output()
            .unwrap()
    }

    fn keys(&self) -> Vec<String> {
        taint_keys(&self.api.object(&node_path(NODE)).unwrap())
    }
}

fn expect(o: &Output, code: i32, says: &str) {
    let out = String::from_utf8_lossy(&o.stdout);
    let text = format!("{out}{}", stderr(o));
    assert_eq!(o.status.code(), Some(code), "{text}");
    if code != 0 {
        assert!(out.is_empty(), "stdout on failure: {text}");
    }
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
        &c.remove(&[]),
        0,
        &format!("removed: taint {KEY}:NoSchedule, {KEY}:NoExecute from node {NODE}"),
    );
    assert_eq!(
        c.keys(),
        ["node.kubernetes.io/not-ready", "example.com/gpu"]
    );
    assert_eq!(c.api.patches(&node_path(NODE)).len(), 1);
    // Run again: absent, one more GET, no write.
    expect(
        &c.remove(&[]),
        0,
        &format!("absent: node {NODE} has no taint {KEY}"),
    );
    assert_eq!(c.api.patches(&node_path(NODE)).len(), 1);
}

#[test]
fn absent_taint_is_no_write() {
    for taints in [vec![], vec![("example.com/gpu", "NoSchedule")]] {
        let c = cluster(&taints);
        expect(&c.remove(&[]), 0, "absent: ");
        assert_eq!(c.api.requests(&node_path(NODE)), 1, "one GET");
        assert_eq!(c.api.total_patches(), 0);
    }
    // A node whose taints are null.
    let c = cluster(&[]);
    let mut n = node(NODE, &[]);
    n["spec"]["taints"] = Value::Null;
    c.api.set(&node_path(NODE), n);
    expect(&c.remove(&[]), 0, "absent: ");
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
    expect(&c.remove(&[]), 0, "removed: ");
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
    expect(&c.remove(&[]), 0, "absent: ");
    assert_eq!(c.keys(), ["example.com/gpu"]);
}

#[test]
fn refusals_have_their_exit_codes() {
    // RBAC with get but not patch on nodes (the linkerd2-cni chart's).
    let c = cluster(&[(KEY, "NoSchedule")]);
    c.api.forbid_patch(&node_path(NODE));
    expect(&c.remove(&[]), 3, "HTTP 403");
    let o = c.remove(&[]);
    assert!(
        stderr(&o).contains(&format!("kubectl taint nodes {NODE} {KEY}-")),
        "{}",
        stderr(&o)
    );
    assert_eq!(c.keys(), [KEY]);

    // No get on nodes either.
    let c = cluster(&[(KEY, "NoSchedule")]);
    c.api.set_mode(Mode::Forbidden);
    expect(&c.remove(&[]), 3, "HTTP 403");

    let c = cluster(&[(KEY, "NoSchedule")]);
    c.api.set_mode(Mode::Unauthorized);
    expect(&c.remove(&[]), 4, "HTTP 401");

    // Overloaded: retried within the budget, then "try again later".
    let c = cluster(&[(KEY, "NoSchedule")]);
    c.api.fail_next(100, 503);
    expect(&c.remove(&["--timeout-seconds", "1"]), 1, "HTTP 503");
    assert_eq!(c.keys(), [KEY]);

    // A wrong node name.
    let c = cluster(&[]);
    let o = Command::new(BIN)
        .args(["kube", "remove-taint", "--kubeconfig"])
        .arg(&c.kubeconfig)
        .args(["--node", "node-2", "--key", KEY])
        .output()
        .unwrap();
    expect(&o, 2, "LINKERD_CNI_NODE_NAME");
}

#[test]
fn bad_arguments_exit_2() {
    let c = cluster(&[]);
    let o = Command::new(BIN)
        .args(["kube", "remove-taint", "--node", NODE])
        .output()
        .unwrap();
    expect(&o, 2, "required");
    expect(
        &c.remove(&["--timeout-seconds", "0"]),
        2,
        "--timeout-seconds",
    );
    let o = Command::new(BIN)
        .args(["kube", "remove-taint", "--kubeconfig"])
        .arg(&c.kubeconfig)
        .args(["--node", "../namespaces/x", "--key", KEY])
        .output()
        .unwrap();
    expect(&o, 2, "not a valid node name");
    let o = Command::new(BIN)
        .args(["kube", "remove-taint", "--kubeconfig"])
        .arg(c.kubeconfig.with_file_name("nope"))
        .args(["--node", NODE, "--key", KEY])
        .output()
        .unwrap();
    expect(&o, 2, "nope");
    assert_eq!(c.api.total_requests(), 0);
}

#[test]
fn a_silent_api_server_is_bounded_by_the_timeout() {
    // Accepts connections (the kernel's backlog) and never answers.
    let hole = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let c = cluster(&[(KEY, "NoSchedule")]);
    let text = std::fs::read_to_string(&c.kubeconfig).unwrap().replace(
        &format!("[{}]:{}", c.api.addr().ip(), c.api.addr().port()),
        &format!("[127.0.0.1]:{}", hole.local_addr().unwrap().port()),
    );
    std::fs::write(&c.kubeconfig, text).unwrap();
    let start = Instant::now();
    let o = c.remove(&["--timeout-seconds", "1"]);
    let took = start.elapsed();
    expect(&o, 1, "cannot read node");
    // One second of budget, plus start-up slack on a shared machine.
    assert!(took < Duration::from_secs(5), "took {took:?}");
    drop(hole);
}
