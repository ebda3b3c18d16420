//! `owner::daemonset_of`, the question the installer asks at SIGTERM,
//! against the fake API server: only a definite "gone" is gone (the
//! DaemonSet NotFound or with a deletionTimestamp, the namespace being
//! deleted, the asking pod's own token or RBAC revoked); a DaemonSet that
//! exists is present; everything that leaves the answer open (RBAC without
//! daemonsets in a namespace that stays, API down, no DaemonSet owner) is
//! an error, in bounded time.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use linkerd_cni_kube::owner::{self, OwnerError, OwnerState};
use linkerd_cni_kube::{Client, kubeconfig};
use testkit::objects::{daemonset, daemonset_path, daemonset_pod, pod_path};
use testkit::{FakeApiServer, TempDir};

const NS: &str = "linkerd-cni";
const POD: &str = "linkerd-cni-x7k2p";
const DS: &str = "linkerd-cni";
const UID: &str = "1b2c3d4e-0000-4000-8000-000000000001";

struct Cluster {
    api: FakeApiServer,
    kubeconfig: PathBuf,
    _dir: TempDir,
}

fn cluster() -> Cluster {
    let api = FakeApiServer::start();
    let dir = TempDir::new("lcni-kube-owner").unwrap();
    let kubeconfig = api.write_kubeconfig(dir.path()).unwrap();
    api.set(&pod_path(NS, POD), daemonset_pod(NS, POD, DS, UID));
    api.set(&daemonset_path(NS, DS), daemonset(NS, DS, UID, false));
    Cluster {
        api,
        kubeconfig,
        _dir: dir,
    }
}

impl Cluster {
    fn ask_within(&self, budget: Duration) -> Result<OwnerState, Box<OwnerError>> {
        let api = kubeconfig::load(&self.kubeconfig).unwrap();
        owner::daemonset_of(&Client::new(api, budget), NS, POD).map_err(Box::new)
    }

    fn ask(&self) -> Result<OwnerState, Box<OwnerError>> {
        self.ask_within(Duration::from_secs(5))
    }
}

/// The answer is gone (`Some(true)`), present (`Some(false)`) or open
/// (`None`), and says `says`.
fn expect(answer: Result<OwnerState, Box<OwnerError>>, gone: Option<bool>, says: &str) {
    let (got, text) = match &answer {
        Ok(s) => (Some(s.is_gone()), s.to_string()),
        Err(e) => (None, e.to_string()),
    };
    assert_eq!(got, gone, "{text}");
    assert!(text.contains(says), "expected {says:?} in: {text}");
}

#[test]
fn present_deleting_and_gone() {
    let c = cluster();
    expect(
        c.ask(),
        Some(false),
        "DaemonSet linkerd-cni/linkerd-cni exists",
    );
    // A foreground cascade: the DaemonSet stays, with a deletionTimestamp,
    // until its pods are gone.
    c.api
        .set(&daemonset_path(NS, DS), daemonset(NS, DS, UID, true));
    expect(c.ask(), Some(true), "being deleted");
    // Background cascade, kubectl delete -f, helm uninstall.
    c.api.remove(&daemonset_path(NS, DS));
    expect(c.ask(), Some(true), "is gone: not found");
    // Deleted and created again under the same name: its new pods take over.
    c.api.set(
        &daemonset_path(NS, DS),
        daemonset(NS, DS, "1b2c3d4e-0000-4000-8000-000000000002", false),
    );
    expect(c.ask(), Some(false), "exists");
}

/// What `kubectl delete -f` and `helm uninstall` leave by the time the
/// pods get SIGTERM: the ServiceAccount gone (its tokens rejected), the
/// RBAC gone, the namespace being deleted.
#[test]
fn revoked_credentials_and_a_deleted_namespace_are_gone() {
    let c = cluster();
    c.api.revoke_token(c.api.token());
    expect(c.ask(), Some(true), "HTTP 401");

    let c = cluster();
    c.api.forbid(&pod_path(NS, POD));
    expect(c.ask(), Some(true), "HTTP 403");

    let c = cluster();
    c.api.forbid(&daemonset_path(NS, DS));
    let mut ns = testkit::objects::namespace(NS, &[]);
    ns["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z".into();
    c.api.set(&testkit::objects::namespace_path(NS), ns);
    expect(
        c.ask(),
        Some(true),
        "namespace linkerd-cni is being deleted",
    );
}

#[test]
fn open_questions_have_no_answer() {
    // The upstream chart's RBAC has no daemonsets, and the namespace stays.
    let c = cluster();
    c.api.forbid(&daemonset_path(NS, DS));
    c.api.add_namespace(NS, &[]);
    expect(c.ask(), None, "HTTP 403");

    let c = cluster();
    c.api.set(
        &pod_path(NS, POD),
        testkit::objects::Pod::new(NS, POD).json(),
    );
    expect(c.ask(), None, "no controlling DaemonSet");

    let c = cluster();
    c.api.remove(&pod_path(NS, POD));
    expect(c.ask(), None, "not found");
}

#[test]
fn a_silent_api_server_is_bounded_by_the_budget() {
    let hole = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let c = cluster();
    let text = std::fs::read_to_string(&c.kubeconfig).unwrap().replace(
        &format!("[{}]:{}", c.api.addr().ip(), c.api.addr().port()),
        &format!("[127.0.0.1]:{}", hole.local_addr().unwrap().port()),
    );
    std::fs::write(&c.kubeconfig, text).unwrap();
    let start = Instant::now();
    let answer = c.ask_within(Duration::from_secs(1));
    let took = start.elapsed();
    expect(answer, None, "cannot get pod");
    // One second of budget, plus slack on a shared machine.
    assert!(took < Duration::from_secs(5), "took {took:?}");
    drop(hole);
}

/// Refusals that do not hold up leave the answer open, or get the answer
/// they hid; none of them is gone while the DaemonSet exists.
#[test]
fn forced_refusals_are_not_gone() {
    // One 401, one 403: asked again, the pod is there, and so is the
    // DaemonSet.
    for status in [401, 403] {
        let c = cluster();
        c.api.fail_next_on(&pod_path(NS, POD), 1, status);
        expect(c.ask(), Some(false), "exists");
    }
    // A 401 that is not the API server's (a proxy's page).
    let c = cluster();
    c.api.fail_next_with(
        1,
        401,
        "<html><body>401 Authorization Required</body></html>",
    );
    expect(c.ask(), None, "without the API server's Status body");
    // A 401 on the DaemonSet right after a 200 on the pod.
    let c = cluster();
    c.api.fail_next_on(&daemonset_path(NS, DS), 1, 401);
    expect(c.ask(), None, "right after HTTP 200 on the pod");
    // Repeated, but the reviews disagree: the token is valid, get pods is
    // allowed.
    let c = cluster();
    c.api.fail_next_on(&pod_path(NS, POD), 2, 401);
    expect(c.ask(), None, "SelfSubjectReview authenticates the token");
    let c = cluster();
    c.api.fail_next_on(&pod_path(NS, POD), 2, 403);
    expect(
        c.ask(),
        None,
        "SelfSubjectAccessReview says get pods is allowed",
    );
    // The pod forbidden, repeated, but the review cannot be made (503,
    // retried until the budget runs out).
    let c = cluster();
    c.api.forbid(&pod_path(NS, POD));
    c.api.fail_next_on(
        linkerd_cni_kube::review::SELF_SUBJECT_ACCESS_REVIEW_PATH,
        100,
        503,
    );
    let answer = c.ask_within(Duration::from_millis(1500));
    assert!(answer.is_err(), "{answer:?}");
}
