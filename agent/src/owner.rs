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
//!
//! The calls are made with this pod's own current token, read fresh from
//! its mount (never the node kubeconfig's copy, which is the plugin's, or
//! stale, or another installer's), all within [`API_TIMEOUT`].

use std::fmt;
use std::path::Path;
use std::time::Duration;

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use linkerd_cni_kube::ApiError;
use linkerd_cni_kube::error::{StatusBody, valid_name, valid_namespace};

use crate::api::{self, Api};
use crate::config::Config;
use crate::kubeconfig;

/// The most the question's API calls may take together.
pub const API_TIMEOUT: Duration = Duration::from_secs(5);

/// Asks the API server, within [`API_TIMEOUT`]; without the pod's identity
/// or token, cannot tell.
pub fn ask(cfg: &Config) -> Verdict {
    let (namespace, pod) = match identity(cfg) {
        Ok(id) => id,
        Err(why) => return Verdict::CannotTell(why),
    };
    let api = match kubeconfig::own_api(cfg) {
        Ok(api) => api,
        Err(e) => return Verdict::CannotTell(format!("cannot ask with this pod's token: {e}")),
    };
    let answers = api::blocking(api, API_TIMEOUT, async |api| {
        ask_api(api, &namespace, &pod).await
    });
    match answers {
        Ok(answers) => verdict(&answers),
        Err(e) => Verdict::CannotTell(format!("cannot ask the API server: {e}")),
    }
}

/// This pod's namespace.
pub fn namespace(cfg: &Config) -> Result<String, String> {
    match &cfg.pod_namespace {
        Some(ns) => Ok(ns.clone()),
        None => {
            let f = cfg.service_account_dir.join("namespace");
            read_word(&f).ok_or_else(|| {
                format!(
                    "cannot tell this pod's namespace: LINKERD_CNI_POD_NAMESPACE is not set and {} is unreadable",
                    f.display()
                )
            })
        }
    }
}

/// This pod's namespace and name.
fn identity(cfg: &Config) -> Result<(String, String), String> {
    let namespace = namespace(cfg)?;
    let pod = match &cfg.pod_name {
        Some(p) => p.clone(),
        None => read_word(Path::new("/proc/sys/kernel/hostname")).ok_or(
            "cannot tell this pod's name: LINKERD_CNI_POD_NAME is not set and the host name is unreadable",
        )?,
    };
    Ok((namespace, pod))
}

fn read_word(p: &Path) -> Option<String> {
    let s = crate::fsutil::read_capped_text(p).ok()?;
    let s = s.trim();
    (!s.is_empty()).then(|| s.to_string())
}

/// What the API server answered to the question's calls.
#[derive(Debug)]
struct Answers {
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
async fn ask_api(api: &Api, namespace: &str, pod: &str) -> Answers {
    let pod_get = get_pod(api, namespace, pod).await;
    let daemonset_get = match pod_get.as_ref().ok().and_then(controller) {
        Some(o) => Some(get_daemonset(api, namespace, &o.name).await),
        None => None,
    };
    let namespace_get = get_namespace(api, namespace).await;
    Answers {
        namespace: namespace.to_string(),
        pod: pod.to_string(),
        pod_get,
        daemonset_get,
        namespace_get,
    }
}

async fn get_pod(api: &Api, namespace: &str, name: &str) -> Result<Pod, ApiError> {
    let (ns, name) = (valid_namespace(namespace)?, valid_name("pod", name)?);
    api.get(&format!("/api/v1/namespaces/{ns}/pods/{name}"))
        .await
}

async fn get_daemonset(api: &Api, namespace: &str, name: &str) -> Result<DaemonSet, ApiError> {
    let (ns, name) = (valid_namespace(namespace)?, valid_name("DaemonSet", name)?);
    api.get(&format!("/apis/apps/v1/namespaces/{ns}/daemonsets/{name}"))
        .await
}

async fn get_namespace(api: &Api, name: &str) -> Result<Namespace, ApiError> {
    api.get(&format!("/api/v1/namespaces/{}", valid_namespace(name)?))
        .await
}

/// The pod's controlling DaemonSet, as its ownerReferences name it.
fn controller(p: &Pod) -> Option<&OwnerReference> {
    p.metadata
        .owner_references
        .iter()
        .flatten()
        .find(|o| o.kind == "DaemonSet" && o.controller == Some(true) && !o.name.is_empty())
}

/// The decision over the recorded answers (see the module docs).
fn verdict(a: &Answers) -> Verdict {
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
            if let Some(uid) = ds.metadata.uid.as_deref()
                && !owner.uid.is_empty()
                && !uid.is_empty()
                && uid != owner.uid
            {
                s += &format!(
                    " (recreated: uid {uid} instead of {}; its new pods take over)",
                    owner.uid
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
    } else if n.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Terminating") {
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

/// Against the fake API server.
#[cfg(test)]
mod api_tests;
