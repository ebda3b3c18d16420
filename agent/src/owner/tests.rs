//! The decision over forced answers: every answer the API server, a proxy
//! or an outage can give to each of the three calls. Only the API
//! server's own word uninstalls.

use std::time::Duration;

use serde_json::{Value, json};

use super::*;
use linkerd_cni_kube::error::Method;

const NS: &str = "linkerd-cni";
const POD: &str = "linkerd-cni-x7k2p";
const DS: &str = "linkerd-cni";
const UID: &str = "1b2c3d4e-0000-4000-8000-000000000001";

/// The three calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Call {
    Pod,
    DaemonSet,
    Namespace,
}

impl Call {
    fn path(self) -> String {
        match self {
            Call::Pod => format!("/api/v1/namespaces/{NS}/pods/{POD}"),
            Call::DaemonSet => format!("/apis/apps/v1/namespaces/{NS}/daemonsets/{DS}"),
            Call::Namespace => format!("/api/v1/namespaces/{NS}"),
        }
    }

    /// The resource's name in a Status body's details.
    fn kind(self) -> &'static str {
        match self {
            Call::Pod => "pods",
            Call::DaemonSet => "daemonsets",
            Call::Namespace => "namespaces",
        }
    }
}

/// A failed answer to `call`: how it failed, as the client reports it.
#[derive(Debug, Clone, Copy)]
enum Fail {
    Timeout,
    Http(u16, Body),
}

/// The body of a failed answer.
#[derive(Debug, Clone, Copy)]
enum Body {
    /// The API server's own `Status`, about the call's object.
    Status,
    /// A `Status` about another object.
    StatusOther,
    /// A proxy's page.
    Html,
    Empty,
    /// JSON, but not a `Status`.
    OtherJson,
}

fn error(call: Call, fail: Fail) -> ApiError {
    let path = call.path();
    let (status, body) = match fail {
        Fail::Timeout => {
            return ApiError::TimedOut {
                server: "https://127.0.0.1:6443".into(),
                method: Method::Get,
                path,
                budget: Duration::from_secs(5),
                last: Some("connected, but no answer within 5.0 s".into()),
            };
        }
        Fail::Http(status, body) => (status, body),
    };
    let reason = match status {
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "NotFound",
        429 => "TooManyRequests",
        _ => "ServiceUnavailable",
    };
    let text = match body {
        Body::Status => json!({
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "reason": reason, "code": status, "message": "forced",
            "details": {"name": DS, "kind": call.kind()},
        })
        .to_string(),
        Body::StatusOther => json!({
            "kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": reason,
            "code": status, "details": {"name": "something-else", "kind": "configmaps"},
        })
        .to_string(),
        Body::Html => format!("<html><body><h1>{status} {reason}</h1></body></html>"),
        Body::Empty => String::new(),
        Body::OtherJson => json!({"error": reason}).to_string(),
    };
    match status {
        401 | 403 => ApiError::Unauthorized {
            status,
            method: Method::Get,
            path,
            kubeconfig: "/var/run/secrets/kubernetes.io/serviceaccount/token".into(),
            reason: StatusBody::parse(text.as_bytes()).map(|s| s.reason),
        },
        404 => ApiError::NotFound {
            method: Method::Get,
            path,
            status: StatusBody::parse(text.as_bytes()).map(Box::new),
        },
        _ => ApiError::Status {
            method: Method::Get,
            path,
            status,
            message: text,
        },
    }
}

fn object<T: serde::de::DeserializeOwned>(v: Value) -> T {
    serde_json::from_value(v).unwrap()
}

fn owned_pod(kind: &str, controller: bool) -> Pod {
    object(
        json!({"metadata": {"name": POD, "namespace": NS, "ownerReferences": [
        {"kind": kind, "name": DS, "uid": UID, "controller": controller}]}}),
    )
}

fn ds(uid: &str, deleting: bool) -> DaemonSet {
    let mut v = json!({"metadata": {"name": DS, "namespace": NS, "uid": uid}});
    if deleting {
        v["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z".into();
    }
    object(v)
}

fn namespace(timestamp: bool, phase: &str) -> Namespace {
    let mut v = json!({"metadata": {"name": NS}, "status": {"phase": phase}});
    if timestamp {
        v["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z".into();
    }
    object(v)
}

/// A DaemonSet pod whose DaemonSet exists, in a namespace that stays: a
/// rolling update.
fn present() -> Answers {
    Answers {
        namespace: NS.into(),
        pod: POD.into(),
        pod_get: Ok(owned_pod("DaemonSet", true)),
        daemonset_get: Some(Ok(ds(UID, false))),
        namespace_get: Ok(namespace(false, "Active")),
    }
}

/// [`present`] with `call` failing as `fail`; a failed pod GET asks no
/// DaemonSet, as [`ask`] does.
fn failing(call: Call, fail: Fail) -> Answers {
    let mut a = present();
    let e = error(call, fail);
    match call {
        Call::Pod => {
            a.pod_get = Err(e);
            a.daemonset_get = None;
        }
        Call::DaemonSet => a.daemonset_get = Some(Err(e)),
        Call::Namespace => a.namespace_get = Err(e),
    }
    a
}

/// What a case expects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Want {
    Uninstall,
    Present,
    CannotTell,
}

fn cases() -> Vec<(String, Answers, Want)> {
    use Body::*;
    use Want::*;
    let mut cases: Vec<(String, Answers, Want)> = vec![
        ("the DaemonSet present".into(), present(), Present),
        (
            "the DaemonSet recreated under its name".into(),
            Answers {
                daemonset_get: Some(Ok(ds("1b2c3d4e-0000-4000-8000-000000000002", false))),
                ..present()
            },
            Present,
        ),
        (
            "404 on the DaemonSet with a Status body".into(),
            failing(Call::DaemonSet, Fail::Http(404, Status)),
            Uninstall,
        ),
        (
            "404 on the DaemonSet with a Status body without details".into(),
            Answers {
                daemonset_get: Some(Err(ApiError::NotFound {
                    method: Method::Get,
                    path: Call::DaemonSet.path(),
                    status: StatusBody::parse(br#"{"kind":"Status","reason":"NotFound"}"#)
                        .map(Box::new),
                })),
                ..present()
            },
            Uninstall,
        ),
        (
            "404 on the DaemonSet with a Status body about another object".into(),
            failing(Call::DaemonSet, Fail::Http(404, StatusOther)),
            CannotTell,
        ),
        (
            "404 on the DaemonSet with HTML".into(),
            failing(Call::DaemonSet, Fail::Http(404, Html)),
            CannotTell,
        ),
        (
            "404 on the DaemonSet with an empty body".into(),
            failing(Call::DaemonSet, Fail::Http(404, Empty)),
            CannotTell,
        ),
        (
            "404 on the DaemonSet with JSON that is no Status".into(),
            failing(Call::DaemonSet, Fail::Http(404, OtherJson)),
            CannotTell,
        ),
        (
            "the DaemonSet with a deletionTimestamp".into(),
            Answers {
                daemonset_get: Some(Ok(ds(UID, true))),
                ..present()
            },
            Uninstall,
        ),
        (
            "the DaemonSet with a deletionTimestamp, the namespace unanswered".into(),
            Answers {
                daemonset_get: Some(Ok(ds(UID, true))),
                ..failing(Call::Namespace, Fail::Timeout)
            },
            Uninstall,
        ),
        (
            "the namespace Terminating while the DaemonSet answers".into(),
            Answers {
                namespace_get: Ok(namespace(true, "Terminating")),
                ..present()
            },
            Uninstall,
        ),
        (
            "the namespace's phase Terminating alone".into(),
            Answers {
                namespace_get: Ok(namespace(false, "Terminating")),
                ..present()
            },
            Uninstall,
        ),
        (
            "the namespace's deletionTimestamp alone".into(),
            Answers {
                namespace_get: Ok(namespace(true, "")),
                ..present()
            },
            Uninstall,
        ),
        (
            "the namespace Terminating, the DaemonSet forbidden (the chart's RBAC)".into(),
            Answers {
                namespace_get: Ok(namespace(true, "Terminating")),
                ..failing(Call::DaemonSet, Fail::Http(403, Status))
            },
            Uninstall,
        ),
        (
            "the namespace Terminating, the pod gone".into(),
            Answers {
                namespace_get: Ok(namespace(true, "Terminating")),
                ..failing(Call::Pod, Fail::Http(404, Status))
            },
            Uninstall,
        ),
        (
            "the namespace Terminating, the pod of no DaemonSet".into(),
            Answers {
                pod_get: Ok(object(json!({"metadata": {"name": POD}}))),
                daemonset_get: None,
                namespace_get: Ok(namespace(true, "Terminating")),
                ..present()
            },
            CannotTell,
        ),
        (
            "a pod of no DaemonSet".into(),
            Answers {
                pod_get: Ok(object(json!({"metadata": {"name": POD}}))),
                daemonset_get: None,
                ..present()
            },
            CannotTell,
        ),
        (
            "a pod a ReplicaSet controls".into(),
            Answers {
                pod_get: Ok(owned_pod("ReplicaSet", true)),
                daemonset_get: None,
                ..present()
            },
            CannotTell,
        ),
        (
            "a pod a DaemonSet owns but does not control".into(),
            Answers {
                pod_get: Ok(owned_pod("DaemonSet", false)),
                daemonset_get: None,
                ..present()
            },
            CannotTell,
        ),
        (
            "404 on the pod with a Status body (force-deleted)".into(),
            failing(Call::Pod, Fail::Http(404, Status)),
            CannotTell,
        ),
        (
            "404 on the pod with HTML".into(),
            failing(Call::Pod, Fail::Http(404, Html)),
            CannotTell,
        ),
        (
            "every token rejected (an authenticator outage)".into(),
            Answers {
                pod_get: Err(error(Call::Pod, Fail::Http(401, Status))),
                daemonset_get: None,
                namespace_get: Err(error(Call::Namespace, Fail::Http(401, Status))),
                ..present()
            },
            CannotTell,
        ),
        (
            "every call forbidden (the RBAC deleted)".into(),
            Answers {
                pod_get: Err(error(Call::Pod, Fail::Http(403, Status))),
                daemonset_get: None,
                namespace_get: Err(error(Call::Namespace, Fail::Http(403, Status))),
                ..present()
            },
            CannotTell,
        ),
        (
            "the token rejected on the DaemonSet and the namespace after a 200 on the pod".into(),
            Answers {
                daemonset_get: Some(Err(error(Call::DaemonSet, Fail::Http(401, Status)))),
                namespace_get: Err(error(Call::Namespace, Fail::Http(401, Status))),
                ..present()
            },
            CannotTell,
        ),
    ];
    // No answer, a refusal, a proxy's refusal: on each call in turn.
    let fails = [
        Fail::Timeout,
        Fail::Http(503, Status),
        Fail::Http(503, Html),
        Fail::Http(429, Status),
        Fail::Http(401, Status),
        Fail::Http(401, Html),
        Fail::Http(403, Status),
        Fail::Http(403, Html),
        Fail::Http(404, Html),
        Fail::Http(404, Empty),
    ];
    for call in [Call::Pod, Call::DaemonSet, Call::Namespace] {
        for fail in fails {
            let want = match (call, fail) {
                // The namespace alone unanswered: the DaemonSet still says
                // it is there.
                (Call::Namespace, _) => Present,
                _ => CannotTell,
            };
            cases.push((format!("{fail:?} on {call:?}"), failing(call, fail), want));
        }
    }
    cases
}

/// Every forced answer: 0 false uninstalls, 0 missed, and each answer
/// in its right class.
#[test]
fn forced_answers() {
    let cases = cases();
    let (mut false_uninstalls, mut missed, mut misclassed) = (vec![], vec![], vec![]);
    for (what, answers, want) in &cases {
        let v = verdict(answers);
        eprintln!("{what}: {v:?}");
        match (matches!(v, Verdict::Uninstall(_)), *want == Want::Uninstall) {
            (true, false) => false_uninstalls.push(format!("{what}: {v}")),
            (false, true) => missed.push(format!("{what}: {v}")),
            _ => {}
        }
        let got = match v {
            Verdict::Uninstall(_) => Want::Uninstall,
            Verdict::Present(_) => Want::Present,
            Verdict::CannotTell(_) => Want::CannotTell,
        };
        if got != *want {
            misclassed.push(format!("{what}: want {want:?}, got {v:?}"));
        }
    }
    eprintln!(
        "{} forced answers: {} false uninstalls, {} missed, {} in the wrong class",
        cases.len(),
        false_uninstalls.len(),
        missed.len(),
        misclassed.len()
    );
    assert!(false_uninstalls.is_empty(), "{false_uninstalls:#?}");
    assert!(missed.is_empty(), "{missed:#?}");
    assert!(misclassed.is_empty(), "{misclassed:#?}");
    assert!(cases.len() >= 50, "{}", cases.len());
}

/// Each verdict says what the API said, and "cannot tell" says what to do,
/// fitting the cause: RBAC advice only when RBAC refused.
#[test]
fn verdicts_say_why() {
    let says = |a: Answers, text: &[&str], not: &[&str]| {
        let v = verdict(&a).to_string();
        for t in text {
            assert!(v.contains(t), "{t:?} not in: {v}");
        }
        for t in not {
            assert!(!v.contains(t), "{t:?} in: {v}");
        }
    };
    says(
        present(),
        &["DaemonSet linkerd-cni/linkerd-cni exists and is not being deleted"],
        &["recreated"],
    );
    says(
        Answers {
            daemonset_get: Some(Ok(ds("other-uid", false))),
            ..failing(Call::Namespace, Fail::Timeout)
        },
        &[
            "recreated: uid other-uid",
            "namespace linkerd-cni could not be read",
        ],
        &[],
    );
    says(
        failing(Call::DaemonSet, Fail::Http(404, Body::Status)),
        &["DaemonSet linkerd-cni/linkerd-cni is gone", "NotFound"],
        &[],
    );
    says(
        Answers {
            namespace_get: Ok(namespace(true, "Terminating")),
            ..present()
        },
        &["namespace linkerd-cni is being deleted (deletionTimestamp set)"],
        &[],
    );
    for fail in [
        Fail::Timeout,
        Fail::Http(503, Body::Status),
        Fail::Http(429, Body::Html),
    ] {
        says(
            failing(Call::DaemonSet, fail),
            &["is unavailable or did not answer in time"],
            &["`get` on daemonsets"],
        );
    }
    says(
        failing(Call::DaemonSet, Fail::Http(403, Body::Status)),
        &["HTTP 403", "`get` on daemonsets"],
        &[],
    );
    says(
        failing(Call::Pod, Fail::Http(401, Body::Status)),
        &[
            "cannot get pod linkerd-cni/linkerd-cni-x7k2p",
            "rejects this pod's token",
        ],
        &["`get` on"],
    );
    says(
        failing(Call::DaemonSet, Fail::Http(404, Body::Html)),
        &["without the API server's Status body"],
        &[],
    );
    says(
        failing(Call::Pod, Fail::Http(404, Body::Status)),
        &["This pod is gone"],
        &[],
    );
}
