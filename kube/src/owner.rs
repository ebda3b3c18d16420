//! At SIGTERM: is this an uninstall (uninstall the node) or a rolling
//! update, a restart, a force-delete (leave everything)? [`ask`] makes the
//! calls and records the answers; [`verdict`], a pure function of them,
//! decides.
//!
//! Only the API server's own word uninstalls:
//! - the pod's controlling DaemonSet answers NotFound with a Kubernetes
//!   `Status` body (reason `NotFound`, about `daemonsets` when it says);
//! - the DaemonSet has a `deletionTimestamp` (a foreground cascade, or the
//!   garbage collector still at work);
//! - the pod's namespace is being deleted (`deletionTimestamp`, phase
//!   `Terminating`): everything in it goes, the DaemonSet included.
//!
//! Everything else leaves the node installed: the DaemonSet present (or
//! one recreated under the same name), and every answer that is no answer
//! (a timeout, a 5xx, a 429, a 404 without a Status body: a proxy's or a
//! load balancer's), a pod without a controlling DaemonSet, and a refused
//! token or RBAC (401, 403), whatever the body says. A refusal tells this
//! pod's credentials apart, not the DaemonSet: a force-deleted or evicted
//! pod's token is rejected while linkerd-cni stays installed, and so is
//! every token while an authenticator is out. The cost is asymmetric: an
//! uninstall missed leaves a node the plugin passes pods through once no
//! installer beats on it (and `linkerd-cni-installer uninstall` cleans);
//! an uninstall made wrongly starts meshed pods without their rules.

use std::fmt;

use crate::client::StatusBody;
use crate::objects::{DaemonSet, Namespace, OwnerReference, Pod};
use crate::{ApiError, Client};

/// What the API server answered to the question's calls.
#[derive(Debug)]
pub struct Answers {
    /// The asking pod's namespace (its DaemonSet's too) and name.
    pub namespace: String,
    pub pod: String,
    /// The GET of the pod.
    pub pod_get: Result<Pod, ApiError>,
    /// The GET of the DaemonSet the pod names as its controller; None when
    /// not asked (the pod's GET failed, or it names none).
    pub daemonset_get: Option<Result<DaemonSet, ApiError>>,
    /// The GET of the namespace.
    pub namespace_get: Result<Namespace, ApiError>,
}

/// The decision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// The API server says the DaemonSet is gone or being deleted: how.
    Uninstall(String),
    /// The DaemonSet is there (a rolling update, a restart): leave
    /// everything. What the API said.
    Present(String),
    /// No word from the API server either way: leave everything. Why, and
    /// what an operator can do.
    CannotTell(String),
}

impl Verdict {
    pub fn uninstalls(&self) -> bool {
        matches!(self, Verdict::Uninstall(_))
    }
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Verdict::Uninstall(s) | Verdict::Present(s) | Verdict::CannotTell(s) => f.write_str(s),
        }
    }
}

/// Asks about pod `namespace/pod`: its GET, then its controlling
/// DaemonSet's (when it names one), then the namespace's, all within the
/// client's budget. Whatever each answers is recorded, for [`verdict`].
pub fn ask(client: &Client, namespace: &str, pod: &str) -> Answers {
    let pod_get = client.pod(namespace, pod);
    let daemonset_get = pod_get
        .as_ref()
        .ok()
        .and_then(controller)
        .map(|o| client.daemonset(namespace, &o.name));
    let namespace_get = client.namespace(namespace);
    Answers {
        namespace: namespace.to_string(),
        pod: pod.to_string(),
        pod_get,
        daemonset_get,
        namespace_get,
    }
}

/// The pod's controlling DaemonSet, as its ownerReferences name it.
fn controller(p: &Pod) -> Option<&OwnerReference> {
    p.metadata
        .owner_references
        .iter()
        .find(|o| o.kind == "DaemonSet" && o.controller == Some(true) && !o.name.is_empty())
}

/// The decision over the recorded answers (see the module docs).
pub fn verdict(a: &Answers) -> Verdict {
    let ns = &a.namespace;
    let pod_id = format!("{ns}/{}", a.pod);
    // None: the pod's GET failed; Some(None): the pod names no DaemonSet.
    let owner = a.pod_get.as_ref().ok().map(controller);
    let ns_deleting = a.namespace_get.as_ref().ok().and_then(deleting);
    if let Some(how) = &ns_deleting
        && !matches!(owner, Some(None))
    {
        return Verdict::Uninstall(format!(
            "namespace {ns} is being deleted ({how}): so is everything in it"
        ));
    }
    let owner = match (&a.pod_get, owner.flatten()) {
        (Err(e), _) => {
            return Verdict::CannotTell(format!(
                "cannot get pod {pod_id}: {e}. {}",
                advice(e, "pods")
            ));
        }
        (Ok(_), None) => {
            return Verdict::CannotTell(format!(
                "pod {pod_id} has no controlling DaemonSet in its ownerReferences. Only a pod \
                 of the linkerd-cni DaemonSet can tell; this one is not."
            ));
        }
        (Ok(_), Some(o)) => o,
    };
    let ds_id = format!("{ns}/{}", owner.name);
    let Some(answer) = &a.daemonset_get else {
        return Verdict::CannotTell(format!("DaemonSet {ds_id} was not asked about"));
    };
    match answer {
        Ok(ds) if ds.metadata.deletion_timestamp.is_some() => Verdict::Uninstall(format!(
            "DaemonSet {ds_id} is being deleted (deletionTimestamp set)"
        )),
        Err(ApiError::NotFound {
            status: Some(s), ..
        }) if not_found(s, &owner.name) => Verdict::Uninstall(format!(
            "DaemonSet {ds_id} is gone: the API server answers NotFound"
        )),
        Ok(ds) => {
            let mut s = format!("DaemonSet {ds_id} exists and is not being deleted");
            // Deleted and created again under the same name (helm
            // uninstall then install, kubectl replace --force): its new
            // pods take the node over, so leaving it serves them best.
            if !owner.uid.is_empty() && !ds.metadata.uid.is_empty() && ds.metadata.uid != owner.uid
            {
                s += &format!(
                    " (recreated: uid {} instead of {}; its new pods take over)",
                    ds.metadata.uid, owner.uid
                );
            }
            if let Err(e) = &a.namespace_get {
                s += &format!("; namespace {ns} could not be read: {e}");
            }
            Verdict::Present(s)
        }
        Err(e) => Verdict::CannotTell(format!(
            "cannot get DaemonSet {ds_id}: {e}. {}",
            advice(e, "daemonsets")
        )),
    }
}

/// How namespace `n` is being deleted, if it is.
fn deleting(n: &Namespace) -> Option<&'static str> {
    if n.metadata.deletion_timestamp.is_some() {
        Some("deletionTimestamp set")
    } else if n.status.phase == "Terminating" {
        Some("phase Terminating")
    } else {
        None
    }
}

/// Whether Status body `s` is the API server's NotFound of DaemonSet
/// `name` (its details, when it has them, must name that DaemonSet).
fn not_found(s: &StatusBody, name: &str) -> bool {
    s.reason == "NotFound"
        && s.kind.as_deref().is_none_or(|k| k == "daemonsets")
        && s.name.as_deref().is_none_or(|n| n == name)
}

/// What an operator can do about a failed GET of `resource`: RBAC advice
/// only when RBAC refused it.
fn advice(e: &ApiError, resource: &str) -> String {
    match e {
        _ if e.transient() => {
            "The API server is unavailable or did not answer in time: no permission is missing."
                .into()
        }
        ApiError::Unauthorized { status: 401, .. } => {
            "The API server rejects this pod's token: its ServiceAccount was deleted (an \
             uninstall), this pod was force-deleted, or the authenticator fails; a refusal \
             does not tell which."
                .into()
        }
        ApiError::Unauthorized { .. } => format!(
            "Granting the service account `get` on {resource} in its namespace (as \
             deploy/linkerd-cni.yaml's Role linkerd-cni-installer does) lets the installer tell; \
             a refusal also follows the deletion of that RBAC (an uninstall), which it does not \
             tell apart."
        ),
        ApiError::NotFound { status: None, .. } => {
            "The 404 came without the API server's Status body: something else answered (a \
             proxy or a load balancer in between?): check the kubeconfig's server address."
                .into()
        }
        ApiError::NotFound { .. } if resource == "pods" => {
            "This pod is gone (force-deleted?): without it the installer cannot tell which \
             DaemonSet owned it."
                .into()
        }
        ApiError::NotFound {
            status: Some(s), ..
        } => format!(
            "The 404's Status body (reason {:?}, about {} {}) is not the API server's NotFound of \
             this DaemonSet.",
            s.reason,
            s.kind.as_deref().unwrap_or("?"),
            s.name.as_deref().unwrap_or("?")
        ),
        _ => format!("To fix the cause: {}.", e.hint()),
    }
}

#[cfg(test)]
mod tests;
