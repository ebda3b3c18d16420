//! Whether the DaemonSet that owns a pod is gone: the question the
//! installer asks when it gets SIGTERM, to tell an uninstall (uninstall the
//! node) from a rolling update or a restart (leave everything).
//!
//! Gone means one of:
//! - the pod's controlling DaemonSet is NotFound, or has a
//!   `deletionTimestamp` (a foreground cascade deletes the pods first);
//! - the pod's namespace has a `deletionTimestamp` (`kubectl delete -f` of
//!   a manifest that starts with the namespace);
//! - the API server rejects the pod's own token (401) or its RBAC no longer
//!   lets it get pods (403 on its own pod), corroborated: the answer is the
//!   API server's own (a Kubernetes `Status` body with reason
//!   `Unauthorized` or `Forbidden`, not a proxy's page), the same when asked
//!   again, and agreed by a question any identity may ask (a
//!   SelfSubjectReview gets 401 too; a SelfSubjectAccessReview says `get`
//!   on the pod is not allowed). The asker is that pod, still terminating,
//!   so its pod-bound token is valid unless its ServiceAccount was deleted;
//!   and without `get pods` the plugin could not work on the node anyway.
//!   `kubectl delete -f` and `helm uninstall` delete the RBAC and the
//!   ServiceAccount right after the DaemonSet, before the pods' SIGTERM, so
//!   this is what an uninstall usually looks like.
//!
//! The DaemonSet exists (including one recreated under the same name) is
//! present. Anything else is "cannot tell", and the caller leaves the node
//! as it is: an API server down, a 403 on the DaemonSet alone (the upstream
//! chart's RBAC has no `daemonsets`) in a namespace that is not being
//! deleted, a pod not owned by a DaemonSet, a refusal not corroborated, and
//! a 401 right after a 200 with the same token (a token cannot be both
//! valid and revoked: something in between answered).

use std::fmt;
use std::time::Duration;

use crate::objects::Pod;
use crate::{ApiError, Client, review};

/// The pause before asking again about a refusal: long enough for a
/// passing glitch (an authenticator's cache, a webhook's restart) to pass.
const REPEAT_AFTER: Duration = Duration::from_millis(500);

/// The DaemonSet owning a pod, as far as the API can tell.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OwnerState {
    /// It exists and is not being deleted.
    Present { daemonset: String },
    /// NotFound: the pod's owner is gone. (One recreated under the same
    /// name, whatever its uid, is [`OwnerState::Present`]: a rolling
    /// re-apply must not uninstall the node.)
    Gone { daemonset: String, why: String },
    /// It exists with a `deletionTimestamp`.
    Deleting { daemonset: String },
    /// The namespace has a `deletionTimestamp`.
    NamespaceDeleting { namespace: String },
    /// The pod's own credentials or RBAC are gone.
    Revoked { pod: String, status: u16 },
}

impl OwnerState {
    /// Gone or being deleted: the node should be uninstalled.
    pub fn is_gone(&self) -> bool {
        !matches!(self, OwnerState::Present { .. })
    }
}

impl fmt::Display for OwnerState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OwnerState::Present { daemonset } => {
                write!(f, "DaemonSet {daemonset} exists and is not being deleted")
            }
            OwnerState::Gone { daemonset, why } => {
                write!(f, "DaemonSet {daemonset} is gone: {why}")
            }
            OwnerState::Deleting { daemonset } => {
                write!(
                    f,
                    "DaemonSet {daemonset} is being deleted (deletionTimestamp set)"
                )
            }
            OwnerState::NamespaceDeleting { namespace } => {
                write!(
                    f,
                    "namespace {namespace} is being deleted (deletionTimestamp set)"
                )
            }
            OwnerState::Revoked { pod, status: 401 } => write!(
                f,
                "the API server rejects pod {pod}'s own token (HTTP 401) while it terminates: its ServiceAccount was deleted"
            ),
            OwnerState::Revoked { pod, status } => write!(
                f,
                "pod {pod} may no longer get itself (HTTP {status}): linkerd-cni's RBAC was deleted"
            ),
        }
    }
}

/// Why the question has no answer.
#[derive(Debug, thiserror::Error)]
pub enum OwnerError {
    #[error("cannot get pod {pod}: {source}")]
    Pod {
        pod: String,
        #[source]
        source: ApiError,
    },
    #[error("pod {pod} has no controlling DaemonSet in its ownerReferences")]
    NotOwned { pod: String },
    #[error("cannot get DaemonSet {daemonset}: {source}")]
    DaemonSet {
        daemonset: String,
        #[source]
        source: ApiError,
    },
    /// A refusal (401, 403) that did not hold up, and why.
    #[error("pod {pod}: {why}")]
    Uncorroborated { pod: String, why: String },
}

impl OwnerError {
    /// What an operator can do about the open question, for this cause:
    /// RBAC advice only when RBAC was the cause.
    pub fn advice(&self) -> String {
        match self {
            OwnerError::DaemonSet {
                source: ApiError::Unauthorized { status: 403, .. },
                ..
            } => "Granting the service account `get` on daemonsets in its namespace (as \
                  deploy/linkerd-cni.yaml's Role linkerd-cni-installer does) lets the installer \
                  tell, and uninstall by itself."
                .into(),
            OwnerError::Pod { source, .. } | OwnerError::DaemonSet { source, .. }
                if source.transient() =>
            {
                "The API server is unavailable or did not answer in time: no permission is missing."
                    .into()
            }
            OwnerError::Pod { source, .. } | OwnerError::DaemonSet { source, .. } => {
                format!("To fix the cause: {}.", source.hint())
            }
            OwnerError::NotOwned { .. } => {
                "Only a pod of the linkerd-cni DaemonSet can tell; this one is not.".into()
            }
            OwnerError::Uncorroborated { .. } => {
                "The refusal may not be the API server's (a proxy or a load balancer in \
                 between?): check the kubeconfig's server address."
                    .into()
            }
        }
    }
}

/// Looks up pod `namespace/pod`, its controlling DaemonSet, and that
/// DaemonSet's state (see the module docs for what counts as gone).
pub fn daemonset_of(client: &Client, namespace: &str, pod: &str) -> Result<OwnerState, OwnerError> {
    let pod_id = format!("{namespace}/{pod}");
    let p = match client.pod(namespace, pod) {
        Ok(p) => p,
        Err(ApiError::Unauthorized { status, reason, .. }) => {
            match corroborate(client, namespace, pod, status, reason.as_deref())? {
                // Asked again, it answered: go on with that answer.
                Some(p) => p,
                None => {
                    return Ok(OwnerState::Revoked {
                        pod: pod_id,
                        status,
                    });
                }
            }
        }
        Err(source) => {
            return Err(OwnerError::Pod {
                pod: pod_id,
                source,
            });
        }
    };
    owner_of(client, namespace, &pod_id, &p)
}

/// After a 200 on the pod: its DaemonSet's state.
fn owner_of(
    client: &Client,
    namespace: &str,
    pod_id: &str,
    p: &Pod,
) -> Result<OwnerState, OwnerError> {
    let owner = p
        .metadata
        .owner_references
        .iter()
        .find(|o| o.kind == "DaemonSet" && o.controller == Some(true) && !o.name.is_empty())
        .ok_or(OwnerError::NotOwned {
            pod: pod_id.to_string(),
        })?;
    let daemonset = format!("{namespace}/{}", owner.name);
    // The token was just accepted: a 401 now is not the API server
    // revoking it.
    let contradiction = |what: &str| OwnerError::Uncorroborated {
        pod: pod_id.to_string(),
        why: format!(
            "HTTP 401 on {what} right after HTTP 200 on the pod with the same token: cannot tell"
        ),
    };
    match client.daemonset(namespace, &owner.name) {
        Err(ApiError::NotFound { .. }) => Ok(OwnerState::Gone {
            daemonset,
            why: "not found".into(),
        }),
        Err(ApiError::Unauthorized { status: 401, .. }) => {
            Err(contradiction(&format!("DaemonSet {daemonset}")))
        }
        // No RBAC for daemonsets (the upstream chart's): the namespace,
        // which every linkerd-cni RBAC may get, may still tell.
        Err(source @ ApiError::Unauthorized { status: 403, .. }) => {
            match client.namespace(namespace) {
                Ok(ns) if ns.metadata.deletion_timestamp.is_some() => {
                    Ok(OwnerState::NamespaceDeleting {
                        namespace: namespace.to_string(),
                    })
                }
                Err(ApiError::Unauthorized { status: 401, .. }) => {
                    Err(contradiction(&format!("namespace {namespace}")))
                }
                _ => Err(OwnerError::DaemonSet { daemonset, source }),
            }
        }
        Err(source) => Err(OwnerError::DaemonSet { daemonset, source }),
        Ok(ds) if ds.metadata.deletion_timestamp.is_some() => {
            Ok(OwnerState::Deleting { daemonset })
        }
        // A DaemonSet deleted and created again under the same name (helm
        // uninstall then install, kubectl replace --force) has new pods that
        // take the node over: leaving the node as it is serves them best.
        Ok(ds)
            if !owner.uid.is_empty()
                && !ds.metadata.uid.is_empty()
                && ds.metadata.uid != owner.uid =>
        {
            log::info!(
                "DaemonSet {daemonset} was recreated (uid {} instead of {}): its new pods take over",
                ds.metadata.uid,
                owner.uid
            );
            Ok(OwnerState::Present { daemonset })
        }
        Ok(_) => Ok(OwnerState::Present { daemonset }),
    }
}

/// Whether the refusal of the pod GET (HTTP `status`, the `reason` of its
/// Status body) holds up (see the module docs): Ok(None) when it does;
/// Ok(Some(pod)) when asking again got the pod; Err says why it does not.
fn corroborate(
    client: &Client,
    namespace: &str,
    pod: &str,
    status: u16,
    reason: Option<&str>,
) -> Result<Option<Pod>, OwnerError> {
    let pod_id = format!("{namespace}/{pod}");
    let open = |why: String| OwnerError::Uncorroborated {
        pod: pod_id.clone(),
        why,
    };
    let want = if status == 401 {
        "Unauthorized"
    } else {
        "Forbidden"
    };
    if reason != Some(want) {
        return Err(open(format!(
            "HTTP {status} without the API server's Status body (reason {want}; got {}): something else answered, cannot tell",
            reason.unwrap_or("no Status")
        )));
    }
    if client.remaining() <= REPEAT_AFTER {
        return Err(open(format!(
            "HTTP {status} once, and no time left to ask again"
        )));
    }
    std::thread::sleep(REPEAT_AFTER);
    match client.pod(namespace, pod) {
        Ok(p) => return Ok(Some(p)),
        Err(ApiError::Unauthorized {
            status: again,
            reason: r,
            ..
        }) if again == status && r.as_deref() == Some(want) => {}
        Err(e) => {
            return Err(open(format!(
                "HTTP {status} once, then another answer ({e}): cannot tell"
            )));
        }
    }
    if status == 401 {
        match review::who_am_i(client) {
            Err(ApiError::Unauthorized { status: 401, .. }) => Ok(None),
            Ok(user) => Err(open(format!(
                "HTTP 401 on the pod, but a SelfSubjectReview authenticates the token as {user}: cannot tell"
            ))),
            Err(e) => Err(open(format!(
                "HTTP 401 twice on the pod, not corroborated by a SelfSubjectReview ({e})"
            ))),
        }
    } else {
        match review::may(client, "get", "pods", namespace, pod) {
            Ok(false) => Ok(None),
            Ok(true) => Err(open(
                "HTTP 403 on the pod, but a SelfSubjectAccessReview says get pods is allowed: cannot tell"
                    .into(),
            )),
            Err(e) => Err(open(format!(
                "HTTP 403 twice on the pod, not corroborated by a SelfSubjectAccessReview ({e})"
            ))),
        }
    }
}
