//! [`ask_api`] and [`verdict`], the question the installer asks at
//! SIGTERM, against the fake API server: only the API server's own word
//! uninstalls (the DaemonSet NotFound with a Status body or with a
//! deletionTimestamp, the namespace being deleted); a DaemonSet that
//! exists is present; everything else (RBAC without daemonsets in a
//! namespace that stays, a refused token, a proxy's 404, the API down, no
//! DaemonSet owner) cannot tell, in bounded time.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use linkerd_cni_kube::kubeconfig;

use super::{Verdict, ask_api, verdict};
use crate::api;
use testkit::objects::{daemonset, daemonset_path, daemonset_pod, namespace_path, pod_path};
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
    api.add_namespace(NS, &[]);
    Cluster {
        api,
        kubeconfig,
        _dir: dir,
    }
}

impl Cluster {
    fn ask_within(&self, budget: Duration) -> Verdict {
        let api = kubeconfig::load(&self.kubeconfig).unwrap();
        api::blocking(api, budget, async |a| verdict(&ask_api(a, NS, POD).await)).unwrap()
    }

    fn ask(&self) -> Verdict {
        self.ask_within(Duration::from_secs(5))
    }

    /// The namespace is being deleted, as the API server shows it.
    fn terminating(&self) {
        let mut ns = testkit::objects::namespace(NS, &[]);
        ns["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z".into();
        ns["status"] = serde_json::json!({"phase": "Terminating"});
        self.api.set(&namespace_path(NS), ns);
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Want {
    Uninstall,
    Present,
    CannotTell,
}

/// The verdict is `want`, and says `says`.
fn expect(v: Verdict, want: Want, says: &str) {
    let got = match &v {
        Verdict::Uninstall(_) => Want::Uninstall,
        Verdict::Present(_) => Want::Present,
        Verdict::CannotTell(_) => Want::CannotTell,
    };
    assert_eq!(got, want, "{v}");
    assert!(v.to_string().contains(says), "expected {says:?} in: {v}");
}

#[test]
fn present_deleting_and_gone() {
    let c = cluster();
    expect(
        c.ask(),
        Want::Present,
        "DaemonSet linkerd-cni/linkerd-cni exists",
    );
    // A foreground cascade: the DaemonSet stays, with a deletionTimestamp,
    // until its pods are gone.
    c.api
        .set(&daemonset_path(NS, DS), daemonset(NS, DS, UID, true));
    expect(c.ask(), Want::Uninstall, "being deleted");
    // Background cascade, helm uninstall: NotFound, with the API server's
    // Status body.
    c.api.remove(&daemonset_path(NS, DS));
    expect(c.ask(), Want::Uninstall, "is gone");
    // Deleted and created again under the same name: its new pods take over.
    c.api.set(
        &daemonset_path(NS, DS),
        daemonset(NS, DS, "1b2c3d4e-0000-4000-8000-000000000002", false),
    );
    expect(c.ask(), Want::Present, "recreated");
}

/// `kubectl delete -f`: the namespace is being deleted; the DaemonSet may
/// still answer (its deletion comes after), or be forbidden (the chart's
/// RBAC), or gone.
#[test]
fn a_deleted_namespace_uninstalls() {
    let c = cluster();
    c.terminating();
    expect(
        c.ask(),
        Want::Uninstall,
        "namespace linkerd-cni is being deleted",
    );

    let c = cluster();
    c.terminating();
    c.api.forbid(&daemonset_path(NS, DS));
    expect(
        c.ask(),
        Want::Uninstall,
        "namespace linkerd-cni is being deleted",
    );
}

/// A refused token or RBAC tells this pod's credentials apart, not the
/// DaemonSet: a force-deleted pod, an authenticator outage and an
/// uninstall look alike. None of them uninstalls.
#[test]
fn refusals_cannot_tell() {
    let c = cluster();
    c.api.revoke_token(c.api.token());
    expect(c.ask(), Want::CannotTell, "HTTP 401");

    let c = cluster();
    c.api.forbid(&pod_path(NS, POD));
    expect(c.ask(), Want::CannotTell, "HTTP 403");

    // One refusal, even while all else answers.
    for status in [401, 403] {
        let c = cluster();
        c.api.fail_next_on(&pod_path(NS, POD), 1, status);
        expect(c.ask(), Want::CannotTell, &format!("HTTP {status}"));
        let c = cluster();
        c.api.fail_next_on(&daemonset_path(NS, DS), 1, status);
        expect(c.ask(), Want::CannotTell, &format!("HTTP {status}"));
    }
    // A proxy's refusal.
    let c = cluster();
    c.api.fail_next_with(
        1,
        401,
        "<html><body>401 Authorization Required</body></html>",
    );
    expect(c.ask(), Want::CannotTell, "HTTP 401");
}

/// A 404 that is not the API server's (no Status body: a proxy's page, an
/// empty answer) is no NotFound.
#[test]
fn a_proxys_404_is_not_gone() {
    for body in ["<html><body><h1>404 Not Found</h1></body></html>", ""] {
        let c = cluster();
        c.api.remove(&daemonset_path(NS, DS));
        c.api
            .fail_next_on_with(&daemonset_path(NS, DS), 1, 404, body);
        expect(
            c.ask(),
            Want::CannotTell,
            "without the API server's Status body",
        );
    }
}

#[test]
fn open_questions_have_no_answer() {
    // The upstream chart's RBAC has no daemonsets, and the namespace stays.
    let c = cluster();
    c.api.forbid(&daemonset_path(NS, DS));
    expect(c.ask(), Want::CannotTell, "HTTP 403");

    let c = cluster();
    c.api.set(
        &pod_path(NS, POD),
        testkit::objects::Pod::new(NS, POD).json(),
    );
    expect(c.ask(), Want::CannotTell, "no controlling DaemonSet");

    let c = cluster();
    c.api.remove(&pod_path(NS, POD));
    expect(c.ask(), Want::CannotTell, "not found");

    // The API server overloaded on the DaemonSet's GET, each attempt.
    for status in [503, 429] {
        let c = cluster();
        c.api.fail_next_on(&daemonset_path(NS, DS), 100, status);
        expect(
            c.ask_within(Duration::from_millis(1500)),
            Want::CannotTell,
            "is unavailable or did not answer in time",
        );
    }
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
    expect(answer, Want::CannotTell, "cannot get pod");
    // One second of budget, plus slack on a shared machine.
    assert!(took < Duration::from_secs(5), "took {took:?}");
    drop(hole);
}

/// A name cannot make the path reach another object: refused before any
/// request.
#[test]
fn a_name_cannot_reach_another_object() {
    let c = cluster();
    let api = kubeconfig::load(&c.kubeconfig).unwrap();
    let got = api::blocking(api, Duration::from_secs(5), async |a| {
        let ds = super::get_daemonset(a, "kube-system/pods/coredns?", "x").await;
        let pod = super::get_pod(a, NS, "coredns?x=1").await;
        let ns = super::get_namespace(a, "..").await;
        (ds.is_err(), pod.is_err(), ns.is_err())
    })
    .unwrap();
    assert_eq!(got, (true, true, true));
}
