//! Which pods need a repair: a meshed pod of this node whose network
//! validator found no redirect, and that nobody is deleting yet; and which
//! of them a deletion repairs (a controller creates them again).

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::ResourceExt;

/// The init container linkerd's injector adds to meshed pods in CNI mode.
pub const VALIDATOR_CONTAINER: &str = "linkerd-network-validator";

/// The validator's exit code when outbound traffic is not redirected
/// (EOPNOTSUPP): the pod's network was set up without linkerd-cni.
pub const VALIDATOR_FAILED_EXIT_CODE: i32 = 95;

/// The label linkerd's injector puts on every meshed pod.
pub const DATA_PLANE_LABEL: &str = "linkerd.io/control-plane-ns";

/// Whether `pod`, scheduled on `node`, should be deleted. The watch's
/// selectors already restrict to meshed pods of this node; they are checked
/// again so that a pod the API sends us by mistake is never deleted.
pub fn needs_repair(pod: &Pod, node: &str) -> bool {
    if pod.metadata.deletion_timestamp.is_some() || !pod.labels().contains_key(DATA_PLANE_LABEL) {
        return false;
    }
    if pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) != Some(node) {
        return false;
    }
    // The last termination, as upstream judges it: after a failed run the
    // kubelet restarts the init container, and `lastState` keeps the
    // failure while the restart waits in CrashLoopBackOff.
    pod.status
        .as_ref()
        .and_then(|s| s.init_container_statuses.as_ref())
        .into_iter()
        .flatten()
        .filter(|c| c.name == VALIDATOR_CONTAINER)
        .filter_map(|c| c.last_state.as_ref()?.terminated.as_ref())
        .any(|t| t.exit_code == VALIDATOR_FAILED_EXIT_CODE)
}

/// The annotation the kubelet puts on a static pod's mirror pod.
pub const MIRROR_ANNOTATION: &str = "kubernetes.io/config.mirror";

/// What deleting a pod that needs a repair would do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Remedy {
    /// Its controller creates it again, through the node's chain this time.
    Delete,
    /// Nothing would create it again (a bare pod, `kubectl run`, a pod a
    /// script made, or one whose owners merely reference it): a deletion
    /// loses it for good.
    NoController,
    /// A static pod's mirror pod: the kubelet runs the static pod from a
    /// file on the node and only creates the mirror again, so a deletion
    /// restarts nothing and would be repeated after every backoff.
    MirrorPod,
}

/// Whether deleting `pod` repairs it. A mirror pod's owner reference (its
/// Node, marked `controller`) does not count: no controller of the API
/// recreates the pod itself.
pub fn remedy(pod: &Pod) -> Remedy {
    if is_mirror_pod(pod) {
        Remedy::MirrorPod
    } else if controller_of(pod).is_some() {
        Remedy::Delete
    } else {
        Remedy::NoController
    }
}

/// A static pod's mirror pod, as the kubelet marks it: the annotation, or
/// an owner reference to a Node (the API server's NodeRestriction requires
/// one on the mirror pods a kubelet creates). Either suffices, so that a
/// pod the admission policy refuses to let us delete is never tried.
pub fn is_mirror_pod(pod: &Pod) -> bool {
    pod.annotations().contains_key(MIRROR_ANNOTATION)
        || pod
            .owner_references()
            .iter()
            .any(|o| o.kind == "Node" && o.api_version == "v1")
}

/// The controller that creates `pod` again once it is deleted: its owner
/// reference marked `controller` (a ReplicaSet, StatefulSet, DaemonSet,
/// Job...), or none.
pub fn controller_of(pod: &Pod) -> Option<&OwnerReference> {
    pod.owner_references()
        .iter()
        .find(|o| o.controller == Some(true))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{
        ContainerState, ContainerStateTerminated, ContainerStatus, PodSpec, PodStatus,
    };
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};

    fn pod(node: &str, meshed: bool, container: &str, exit: Option<i32>) -> Pod {
        let labels = meshed.then(|| {
            [(DATA_PLANE_LABEL.to_string(), "linkerd".to_string())]
                .into_iter()
                .collect()
        });
        Pod {
            metadata: ObjectMeta {
                name: Some("p".into()),
                namespace: Some("ns".into()),
                labels,
                ..Default::default()
            },
            spec: Some(PodSpec {
                node_name: Some(node.into()),
                ..Default::default()
            }),
            status: Some(PodStatus {
                init_container_statuses: Some(vec![ContainerStatus {
                    name: container.into(),
                    last_state: exit.map(|code| ContainerState {
                        terminated: Some(ContainerStateTerminated {
                            exit_code: code,
                            ..Default::default()
                        }),
                        ..Default::default()
                    }),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
        }
    }

    #[test]
    fn a_failed_validator_needs_repair() {
        assert!(needs_repair(
            &pod("n1", true, VALIDATOR_CONTAINER, Some(95)),
            "n1"
        ));
    }

    #[test]
    fn other_pods_do_not() {
        // Another exit code, no termination yet, another container.
        assert!(!needs_repair(
            &pod("n1", true, VALIDATOR_CONTAINER, Some(1)),
            "n1"
        ));
        assert!(!needs_repair(
            &pod("n1", true, VALIDATOR_CONTAINER, None),
            "n1"
        ));
        assert!(!needs_repair(&pod("n1", true, "app-init", Some(95)), "n1"));
        // Not meshed, another node, no status at all.
        assert!(!needs_repair(
            &pod("n1", false, VALIDATOR_CONTAINER, Some(95)),
            "n1"
        ));
        assert!(!needs_repair(
            &pod("n2", true, VALIDATOR_CONTAINER, Some(95)),
            "n1"
        ));
        let mut p = pod("n1", true, VALIDATOR_CONTAINER, Some(95));
        p.status = None;
        assert!(!needs_repair(&p, "n1"));
    }

    #[test]
    fn only_a_controller_reference_counts_as_an_owner() {
        let reference = |controller| OwnerReference {
            api_version: "apps/v1".into(),
            kind: "ReplicaSet".into(),
            name: "web-5d8f".into(),
            uid: "u".into(),
            controller,
            block_owner_deletion: None,
        };
        let mut p = pod("n1", true, VALIDATOR_CONTAINER, Some(95));
        assert!(controller_of(&p).is_none());
        p.metadata.owner_references = Some(vec![reference(None), reference(Some(false))]);
        assert!(controller_of(&p).is_none());
        p.metadata
            .owner_references
            .as_mut()
            .unwrap()
            .push(reference(Some(true)));
        assert_eq!(
            controller_of(&p).map(|o| o.kind.as_str()),
            Some("ReplicaSet")
        );
    }

    fn reference(api_version: &str, kind: &str, controller: Option<bool>) -> OwnerReference {
        OwnerReference {
            api_version: api_version.into(),
            kind: kind.into(),
            name: "owner".into(),
            uid: "u".into(),
            controller,
            block_owner_deletion: None,
        }
    }

    #[test]
    fn only_a_controller_recreates_a_pod() {
        let mut p = pod("n1", true, VALIDATOR_CONTAINER, Some(95));
        assert_eq!(remedy(&p), Remedy::NoController);
        p.metadata.owner_references = Some(vec![reference("apps/v1", "ReplicaSet", Some(false))]);
        assert_eq!(remedy(&p), Remedy::NoController);
        p.metadata.owner_references = Some(vec![reference("apps/v1", "ReplicaSet", Some(true))]);
        assert_eq!(remedy(&p), Remedy::Delete);
        // A custom resource named Node is a controller like any other.
        p.metadata.owner_references = Some(vec![reference("example.com/v1", "Node", Some(true))]);
        assert_eq!(remedy(&p), Remedy::Delete);
    }

    #[test]
    fn a_mirror_pod_is_never_deleted() {
        // As the kubelet creates it: the annotation and its Node as
        // controller.
        let mut p = pod("n1", true, VALIDATOR_CONTAINER, Some(95));
        p.metadata.annotations = Some(
            [(MIRROR_ANNOTATION.to_string(), "3f2a".to_string())]
                .into_iter()
                .collect(),
        );
        p.metadata.owner_references = Some(vec![reference("v1", "Node", Some(true))]);
        assert!(needs_repair(&p, "n1"));
        assert_eq!(remedy(&p), Remedy::MirrorPod);
        // Either mark alone, whatever other controller it names.
        let mut annotated = p.clone();
        annotated.metadata.owner_references =
            Some(vec![reference("apps/v1", "ReplicaSet", Some(true))]);
        assert_eq!(remedy(&annotated), Remedy::MirrorPod);
        let mut node_owned = p.clone();
        node_owned.metadata.annotations = None;
        assert_eq!(remedy(&node_owned), Remedy::MirrorPod);
        node_owned.metadata.owner_references = Some(vec![
            reference("apps/v1", "ReplicaSet", Some(true)),
            reference("v1", "Node", None),
        ]);
        assert_eq!(remedy(&node_owned), Remedy::MirrorPod);
    }

    #[test]
    fn a_pod_being_deleted_does_not() {
        let mut p = pod("n1", true, VALIDATOR_CONTAINER, Some(95));
        p.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::now()));
        assert!(!needs_repair(&p, "n1"));
    }
}
