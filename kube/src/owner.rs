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
//!   lets it get pods (403 on its own pod). The asker is that pod, still
//!   terminating, so its pod-bound token is valid unless its ServiceAccount
//!   was deleted; and without `get pods` the plugin could not work on the
//!   node anyway. `kubectl delete -f` and `helm uninstall` delete the RBAC
//!   and the ServiceAccount right after the DaemonSet, before the pods'
//!   SIGTERM, so this is what an uninstall usually looks like.
//!
//! The DaemonSet exists (including one recreated under the same name) is
//! present. Anything else, an API server down, a 403 on the DaemonSet alone
//! (the upstream chart's RBAC has no `daemonsets`) in a namespace that is
//! not being deleted, a pod not owned by a DaemonSet, is "cannot tell", and
//! the caller leaves the node as it is.

use std::fmt;

use crate::{ApiError, Client};

/// The DaemonSet owning a pod, as far as the API can tell.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OwnerState {
    /// It exists and is not being deleted.
    Present { daemonset: String },
    /// NotFound, or recreated under another uid: the pod's owner is gone.
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
}

/// Looks up pod `namespace/pod`, its controlling DaemonSet, and that
/// DaemonSet's state (see the module docs for what counts as gone).
pub fn daemonset_of(client: &Client, namespace: &str, pod: &str) -> Result<OwnerState, OwnerError> {
    let pod_id = format!("{namespace}/{pod}");
    let p = match client.pod(namespace, pod) {
        Ok(p) => p,
        Err(ApiError::Unauthorized { status, .. }) => {
            return Ok(OwnerState::Revoked {
                pod: pod_id,
                status,
            });
        }
        Err(source) => {
            return Err(OwnerError::Pod {
                pod: pod_id,
                source,
            });
        }
    };
    let owner = p
        .metadata
        .owner_references
        .iter()
        .find(|o| o.kind == "DaemonSet" && o.controller == Some(true) && !o.name.is_empty())
        .ok_or(OwnerError::NotOwned {
            pod: pod_id.clone(),
        })?;
    let daemonset = format!("{namespace}/{}", owner.name);
    match client.daemonset(namespace, &owner.name) {
        Err(ApiError::NotFound { .. }) => Ok(OwnerState::Gone {
            daemonset,
            why: "not found".into(),
        }),
        // Revoked between the two calls.
        Err(ApiError::Unauthorized { status: 401, .. }) => Ok(OwnerState::Revoked {
            pod: pod_id,
            status: 401,
        }),
        // No RBAC for daemonsets (the upstream chart's): the namespace,
        // which every linkerd-cni RBAC may get, may still tell.
        Err(source @ ApiError::Unauthorized { status: 403, .. }) => {
            match client.namespace(namespace) {
                Ok(ns) if ns.metadata.deletion_timestamp.is_some() => {
                    Ok(OwnerState::NamespaceDeleting {
                        namespace: namespace.to_string(),
                    })
                }
                Err(ApiError::Unauthorized { status: 401, .. }) => Ok(OwnerState::Revoked {
                    pod: pod_id,
                    status: 401,
                }),
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
