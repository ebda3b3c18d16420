//! Whether the DaemonSet that owns a pod is gone: the question the
//! installer asks (through `linkerd-cni kube daemonset-gone`) when it gets
//! SIGTERM, to tell an uninstall (uninstall the node) from a rolling update
//! or a restart (leave everything).
//!
//! Only a definite answer counts: the pod's controlling DaemonSet is
//! NotFound, or it carries a `deletionTimestamp` (a foreground cascade
//! deletes the pods before the DaemonSet). Anything else, credentials
//! rejected, RBAC without `get daemonsets`, an API server down, a pod not
//! owned by a DaemonSet, is "cannot tell", and the caller leaves the node as
//! it is.

use std::fmt;

use super::{ApiError, Client};

/// The DaemonSet owning a pod, as far as the API can tell.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OwnerState {
    /// It exists and is not being deleted.
    Present { daemonset: String },
    /// NotFound, or recreated under another uid: the pod's owner is gone.
    Gone { daemonset: String, why: String },
    /// It exists with a `deletionTimestamp`.
    Deleting { daemonset: String },
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
/// DaemonSet's state.
pub fn daemonset_of(client: &Client, namespace: &str, pod: &str) -> Result<OwnerState, OwnerError> {
    let pod_id = format!("{namespace}/{pod}");
    let p = client
        .pod(namespace, pod)
        .map_err(|source| OwnerError::Pod {
            pod: pod_id.clone(),
            source,
        })?;
    let owner = p
        .metadata
        .owner_references
        .iter()
        .find(|o| o.kind == "DaemonSet" && o.controller == Some(true) && !o.name.is_empty())
        .ok_or(OwnerError::NotOwned { pod: pod_id })?;
    let daemonset = format!("{namespace}/{}", owner.name);
    match client.daemonset(namespace, &owner.name) {
        Err(ApiError::NotFound { .. }) => Ok(OwnerState::Gone {
            daemonset,
            why: "not found".into(),
        }),
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
