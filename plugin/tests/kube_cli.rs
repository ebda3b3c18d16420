//! `linkerd-cni kube daemonset-gone`, the question the installer asks at
//! SIGTERM, against the fake API server: only a definite "gone" exits 0
//! (the DaemonSet NotFound or with a deletionTimestamp, the namespace being
//! deleted, the asking pod's own token or RBAC revoked); a DaemonSet that
//! exists exits 1; everything that leaves the answer open (RBAC without
//! daemonsets in a namespace that stays, API down, no DaemonSet owner)
//! exits 2, in bounded time.

mod common;

use std::process::{Command, Output};
use std::time::{Duration, Instant};

use testkit::objects::{daemonset, daemonset_path, daemonset_pod, pod_path};
use testkit::{FakeApiServer, TempDir};

use common::{BIN, stderr};

const NS: &str = "linkerd-cni";
const POD: &str = "linkerd-cni-x7k2p";
const DS: &str = "linkerd-cni";
const UID: &str = "1b2c3d4e-0000-4000-8000-000000000001";

struct Cluster {
    api: FakeApiServer,
    _dir: TempDir,
    kubeconfig: std::path::PathBuf,
}

fn cluster() -> Cluster {
    let api = FakeApiServer::start();
    let dir = TempDir::new("lcni-kube-cli").unwrap();
    let kubeconfig = api.write_kubeconfig(dir.path()).unwrap();
    api.set(&pod_path(NS, POD), daemonset_pod(NS, POD, DS, UID));
    api.set(&daemonset_path(NS, DS), daemonset(NS, DS, UID, false));
    Cluster {
        api,
        _dir: dir,
        kubeconfig,
    }
}

impl Cluster {
    fn ask(&self, extra: &[&str]) -> Output {
        Command::new(BIN)
            .env_clear()
            .args(["kube", "daemonset-gone", "--kubeconfig"])
            .arg(&self.kubeconfig)
            .args(["--namespace", NS, "--pod", POD])
            .args(extra)
            .output()
            .unwrap()
    }
}

fn expect(o: &Output, code: i32, says: &str) {
    let out = String::from_utf8_lossy(&o.stdout);
    let text = format!("{out}{}", stderr(o));
    assert_eq!(o.status.code(), Some(code), "{text}");
    match code {
        0 => assert!(out.starts_with("gone: "), "{text}"),
        1 => assert!(out.starts_with("present: "), "{text}"),
        _ => assert!(out.is_empty(), "{text}"),
    }
    assert!(text.contains(says), "expected {says:?} in: {text}");
}

#[test]
fn present_deleting_and_gone() {
    let c = cluster();
    expect(&c.ask(&[]), 1, "DaemonSet linkerd-cni/linkerd-cni exists");
    // A foreground cascade: the DaemonSet stays, with a deletionTimestamp,
    // until its pods are gone.
    c.api
        .set(&daemonset_path(NS, DS), daemonset(NS, DS, UID, true));
    expect(&c.ask(&[]), 0, "being deleted");
    // Background cascade, kubectl delete -f, helm uninstall.
    c.api.remove(&daemonset_path(NS, DS));
    expect(&c.ask(&[]), 0, "is gone: not found");
    // Deleted and created again under the same name: its new pods take over.
    c.api.set(
        &daemonset_path(NS, DS),
        daemonset(NS, DS, "1b2c3d4e-0000-4000-8000-000000000002", false),
    );
    expect(&c.ask(&[]), 1, "exists");
}

/// What `kubectl delete -f` and `helm uninstall` leave by the time the
/// pods get SIGTERM: the ServiceAccount gone (its tokens rejected), the
/// RBAC gone, the namespace being deleted.
#[test]
fn revoked_credentials_and_a_deleted_namespace_are_gone() {
    let c = cluster();
    c.api.revoke_token(c.api.token());
    expect(&c.ask(&[]), 0, "HTTP 401");

    let c = cluster();
    c.api.forbid(&pod_path(NS, POD));
    expect(&c.ask(&[]), 0, "HTTP 403");

    let c = cluster();
    c.api.forbid(&daemonset_path(NS, DS));
    let mut ns = testkit::objects::namespace(NS, &[]);
    ns["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z".into();
    c.api.set(&testkit::objects::namespace_path(NS), ns);
    expect(&c.ask(&[]), 0, "namespace linkerd-cni is being deleted");
}

#[test]
fn open_questions_exit_2() {
    // The upstream chart's RBAC has no daemonsets, and the namespace stays.
    let c = cluster();
    c.api.forbid(&daemonset_path(NS, DS));
    c.api.add_namespace(NS, &[]);
    expect(&c.ask(&[]), 2, "HTTP 403");

    let c = cluster();
    c.api.set(
        &pod_path(NS, POD),
        testkit::objects::Pod::new(NS, POD).json(),
    );
    expect(&c.ask(&[]), 2, "no controlling DaemonSet");

    let c = cluster();
    c.api.remove(&pod_path(NS, POD));
    expect(&c.ask(&[]), 2, "not found");

    let c = cluster();
    let missing = c.kubeconfig.with_file_name("nope");
    let o = Command::new(BIN)
        .args(["kube", "daemonset-gone", "--kubeconfig"])
        .arg(&missing)
        .args(["--namespace", NS, "--pod", POD])
        .output()
        .unwrap();
    expect(&o, 2, "cannot read it");

    expect(&c.ask(&["--timeout-seconds", "0"]), 2, "--timeout-seconds");
    let o = Command::new(BIN)
        .args(["kube", "daemonset-gone"])
        .output()
        .unwrap();
    expect(&o, 2, "required");
}

#[test]
fn a_silent_api_server_is_bounded_by_the_timeout() {
    let hole = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let c = cluster();
    let text = std::fs::read_to_string(&c.kubeconfig).unwrap().replace(
        &format!("[{}]:{}", c.api.addr().ip(), c.api.addr().port()),
        &format!("[127.0.0.1]:{}", hole.local_addr().unwrap().port()),
    );
    std::fs::write(&c.kubeconfig, text).unwrap();
    let start = Instant::now();
    let o = c.ask(&["--timeout-seconds", "1"]);
    let took = start.elapsed();
    expect(&o, 2, "cannot tell");
    // One second of budget, plus start-up slack on a shared machine.
    assert!(took < Duration::from_secs(5), "took {took:?}");
    drop(hole);
}
