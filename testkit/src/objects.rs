//! JSON for the Kubernetes objects the plugin reads, shaped as the API
//! server returns them (only the fields that matter, plus a few that do not,
//! so that readers must tolerate extra fields).

use serde_json::{Map, Value, json};

/// A pod under construction; [`Pod::json`] renders it.
#[derive(Debug, Clone)]
pub struct Pod {
    namespace: String,
    name: String,
    containers: Vec<Value>,
    init_containers: Vec<Value>,
    annotations: Map<String, Value>,
    labels: Map<String, Value>,
}

impl Pod {
    /// A pod with one application container named `app`.
    pub fn new(namespace: &str, name: &str) -> Pod {
        Pod {
            namespace: namespace.into(),
            name: name.into(),
            containers: vec![container("app", None)],
            init_containers: vec![],
            annotations: Map::new(),
            labels: Map::new(),
        }
    }

    /// A pod as linkerd's injector makes it in CNI mode: `linkerd-proxy`
    /// as a regular container.
    pub fn meshed(namespace: &str, name: &str) -> Pod {
        Pod::new(namespace, name).container("linkerd-proxy")
    }

    pub fn container(mut self, name: &str) -> Pod {
        self.containers.push(container(name, None));
        self
    }

    /// A classic init container (runs to completion).
    pub fn init_container(mut self, name: &str) -> Pod {
        self.init_containers.push(container(name, None));
        self
    }

    /// A native sidecar: an init container with `restartPolicy: Always`.
    pub fn native_sidecar(mut self, name: &str) -> Pod {
        self.init_containers.push(container(name, Some("Always")));
        self
    }

    pub fn annotation(mut self, key: &str, value: &str) -> Pod {
        self.annotations.insert(key.into(), value.into());
        self
    }

    pub fn label(mut self, key: &str, value: &str) -> Pod {
        self.labels.insert(key.into(), value.into());
        self
    }

    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The API path of this pod.
    pub fn path(&self) -> String {
        pod_path(&self.namespace, &self.name)
    }

    pub fn json(&self) -> Value {
        let mut spec = Map::new();
        spec.insert("containers".into(), Value::Array(self.containers.clone()));
        if !self.init_containers.is_empty() {
            spec.insert(
                "initContainers".into(),
                Value::Array(self.init_containers.clone()),
            );
        }
        spec.insert("restartPolicy".into(), "Always".into());
        json!({
            "kind": "Pod",
            "apiVersion": "v1",
            "metadata": {
                "name": self.name,
                "namespace": self.namespace,
                "uid": "0d8d5a1e-3b7c-4f1e-9c1e-5b8a2f6c7d90",
                "labels": self.labels,
                "annotations": self.annotations,
                "managedFields": [{"manager": "kubectl", "operation": "Update"}],
            },
            "spec": spec,
            "status": {"phase": "Pending"},
        })
    }
}

fn container(name: &str, restart_policy: Option<&str>) -> Value {
    let mut c = json!({
        "name": name,
        "image": format!("example/{name}:1.0"),
        "ports": [{"containerPort": 8080, "protocol": "TCP"}],
    });
    if let (Some(rp), Some(m)) = (restart_policy, c.as_object_mut()) {
        m.insert("restartPolicy".into(), rp.into());
    }
    c
}

pub fn pod_path(namespace: &str, name: &str) -> String {
    format!("/api/v1/namespaces/{namespace}/pods/{name}")
}

pub fn namespace_path(name: &str) -> String {
    format!("/api/v1/namespaces/{name}")
}

/// The API path of a node.
pub fn node_path(name: &str) -> String {
    format!("/api/v1/nodes/{name}")
}

/// A node with `taints` as (key, effect), in that order, and the fields a
/// real node answer carries around them (a `resourceVersion`, the
/// kubelet's `timeAdded`-less startup taints, status).
pub fn node(name: &str, taints: &[(&str, &str)]) -> Value {
    let taints: Vec<Value> = taints
        .iter()
        .map(|(key, effect)| json!({"key": key, "effect": effect}))
        .collect();
    json!({
        "kind": "Node",
        "apiVersion": "v1",
        "metadata": {
            "name": name, "uid": "3e5f7a9b-0000-4000-8000-00000000n0de",
            "resourceVersion": "1000",
            "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux"},
        },
        "spec": {"podCIDR": "10.244.1.0/24", "taints": taints},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    })
}

/// The keys of a node's taints, in order.
pub fn taint_keys(node: &Value) -> Vec<String> {
    node["spec"]["taints"]
        .as_array()
        .map(|ts| {
            ts.iter()
                .filter_map(|t| t["key"].as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

/// The path of Service `default/kubernetes`.
pub const KUBERNETES_SERVICE_PATH: &str = "/api/v1/namespaces/default/services/kubernetes";

/// A namespace with `annotations`.
pub fn namespace(name: &str, annotations: &[(&str, &str)]) -> Value {
    let ann: Map<String, Value> = annotations
        .iter()
        .map(|(k, v)| (k.to_string(), Value::from(*v)))
        .collect();
    json!({
        "kind": "Namespace",
        "apiVersion": "v1",
        "metadata": {"name": name, "annotations": ann, "labels": {"kubernetes.io/metadata.name": name}},
        "spec": {"finalizers": ["kubernetes"]},
        "status": {"phase": "Active"},
    })
}

/// Service `default/kubernetes` with `ports`: (port, targetPort), where
/// targetPort is a JSON number or string (or null to omit it).
pub fn kubernetes_service(ports: &[(u16, Value)]) -> Value {
    let ports: Vec<Value> = ports
        .iter()
        .map(|(port, target)| {
            let mut p = json!({"name": "https", "protocol": "TCP", "port": port});
            if let (false, Some(m)) = (target.is_null(), p.as_object_mut()) {
                m.insert("targetPort".into(), target.clone());
            }
            p
        })
        .collect();
    json!({
        "kind": "Service",
        "apiVersion": "v1",
        "metadata": {"name": "kubernetes", "namespace": "default"},
        "spec": {"clusterIP": "10.96.0.1", "type": "ClusterIP", "ports": ports},
    })
}

/// `pod` scheduled on `node` (`spec.nodeName`).
pub fn on_node(mut pod: Value, node: &str) -> Value {
    if let Some(spec) = pod.get_mut("spec").and_then(Value::as_object_mut) {
        spec.insert("nodeName".into(), node.into());
    }
    pod
}

/// `pod` with the status of init container `container`: running after a
/// previous run that exited with `last_exit_code` (as the kubelet reports a
/// restarted container), or never terminated when None.
pub fn with_init_status(mut pod: Value, container: &str, last_exit_code: Option<i32>) -> Value {
    let mut status = json!({
        "name": container,
        "ready": false,
        "restartCount": if last_exit_code.is_some() { 1 } else { 0 },
        "image": format!("example/{container}:1.0"),
        "imageID": "",
        "state": {"waiting": {"reason": "CrashLoopBackOff"}},
        "lastState": {},
    });
    if let Some(code) = last_exit_code {
        status["lastState"] = json!({"terminated": {
            "exitCode": code, "reason": "Error",
            "startedAt": "2026-01-01T00:00:00Z", "finishedAt": "2026-01-01T00:00:01Z",
        }});
    }
    if let Some(st) = pod.get_mut("status").and_then(Value::as_object_mut) {
        let list = st
            .entry("initContainerStatuses")
            .or_insert_with(|| Value::Array(vec![]));
        if let Some(list) = list.as_array_mut() {
            list.push(status);
        }
    }
    pod
}

/// `pod` being deleted (`metadata.deletionTimestamp` set).
pub fn being_deleted(mut pod: Value) -> Value {
    if let Some(meta) = pod.get_mut("metadata").and_then(Value::as_object_mut) {
        meta.insert("deletionTimestamp".into(), "2026-01-01T00:00:00Z".into());
        meta.insert("deletionGracePeriodSeconds".into(), 30.into());
    }
    pod
}

/// The API path of a DaemonSet.
pub fn daemonset_path(namespace: &str, name: &str) -> String {
    format!("/apis/apps/v1/namespaces/{namespace}/daemonsets/{name}")
}

/// A DaemonSet; `deleting` sets a `deletionTimestamp` and the finalizer a
/// foreground cascade leaves on it while its pods go.
pub fn daemonset(namespace: &str, name: &str, uid: &str, deleting: bool) -> Value {
    let mut meta = json!({
        "name": name, "namespace": namespace, "uid": uid, "generation": 1,
        "labels": {"k8s-app": name},
    });
    if deleting && let Some(m) = meta.as_object_mut() {
        m.insert("deletionTimestamp".into(), "2026-01-01T00:00:00Z".into());
        m.insert("finalizers".into(), json!(["foregroundDeletion"]));
    }
    json!({
        "kind": "DaemonSet",
        "apiVersion": "apps/v1",
        "metadata": meta,
        "spec": {"selector": {"matchLabels": {"k8s-app": name}}},
        "status": {"desiredNumberScheduled": 1, "numberReady": 1},
    })
}

/// The installer's own pod, owned (as its controller) by DaemonSet
/// `daemonset` with `uid`.
pub fn daemonset_pod(namespace: &str, name: &str, daemonset: &str, uid: &str) -> Value {
    json!({
        "kind": "Pod",
        "apiVersion": "v1",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": "6a1f0c2e-8d4b-4e5f-a1b2-c3d4e5f60718",
            "ownerReferences": [{
                "apiVersion": "apps/v1", "kind": "DaemonSet", "name": daemonset,
                "uid": uid, "controller": true, "blockOwnerDeletion": true,
            }],
        },
        "spec": {"containers": [container("install-cni", None)]},
        "status": {"phase": "Running"},
    })
}

/// `pod` with an owner reference to `kind` `name` (`apps/v1` for the
/// workload controllers, `batch/v1` for Jobs and CronJobs, else `v1`);
/// `controller` marks it as the pod's managing controller.
pub fn owned_by(mut pod: Value, kind: &str, name: &str, controller: bool) -> Value {
    let api_version = match kind {
        "ReplicaSet" | "StatefulSet" | "DaemonSet" | "Deployment" => "apps/v1",
        "Job" | "CronJob" => "batch/v1",
        _ => "v1",
    };
    let reference = json!({
        "apiVersion": api_version, "kind": kind, "name": name,
        "uid": format!("owner-uid-{}", name), "controller": controller,
        "blockOwnerDeletion": true,
    });
    if let Some(meta) = pod.get_mut("metadata").and_then(Value::as_object_mut) {
        let list = meta
            .entry("ownerReferences")
            .or_insert_with(|| Value::Array(vec![]));
        if let Some(list) = list.as_array_mut() {
            list.push(reference);
        }
    }
    pod
}
