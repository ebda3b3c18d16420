//! The CRI `RuntimeService` calls the tests make, as the kubelet makes them
//! (`runtime.v1`), on top of [`super::grpc`] and [`super::wire`].

use std::path::Path;
use std::time::Duration;

use super::grpc::{Client, GrpcError};
use super::wire::{Fields, Msg};

const SERVICE: &str = "/runtime.v1.RuntimeService/";

/// The kubelet's default `--runtime-request-timeout`.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(120);

/// What the kubelet tells the runtime about a pod when it creates its
/// sandbox: containerd passes namespace and name to CNI as
/// `K8S_POD_NAMESPACE` / `K8S_POD_NAME`, the uid as `K8S_POD_UID`.
#[derive(Debug, Clone)]
pub struct SandboxSpec {
    pub name: String,
    pub namespace: String,
    pub uid: String,
    pub attempt: u32,
    /// `LinuxPodSandboxConfig.cgroup_parent`: the harness keeps its
    /// sandboxes' cgroups under a parent of its own, which it removes.
    pub cgroup_parent: String,
}

impl SandboxSpec {
    fn encode(&self) -> Msg {
        // PodSandboxMetadata {name 1, uid 2, namespace 3, attempt 4}
        let metadata = Msg::new()
            .string(1, &self.name)
            .string(2, &self.uid)
            .string(3, &self.namespace)
            .varint(4, u64::from(self.attempt));
        // LinuxPodSandboxConfig {cgroup_parent 1, security_context 2}; the
        // network namespace mode is POD (0): a netns of its own, set up by
        // CNI.
        let linux = Msg::new()
            .string(1, &self.cgroup_parent)
            .message(2, Msg::new().message(1, Msg::new()));
        // PodSandboxConfig {metadata 1, hostname 2, labels 6, linux 8}
        Msg::new()
            .message(1, metadata)
            .string(2, &self.name)
            .map_entry(6, "io.kubernetes.pod.name", &self.name)
            .map_entry(6, "io.kubernetes.pod.namespace", &self.namespace)
            .map_entry(6, "io.kubernetes.pod.uid", &self.uid)
            .message(8, linux)
    }
}

/// `PodSandboxStatus` as read back.
#[derive(Debug, Clone)]
pub struct SandboxStatus {
    pub id: String,
    pub name: String,
    pub namespace: String,
    /// `SANDBOX_READY` (0) or `SANDBOX_NOTREADY` (1).
    pub ready: bool,
    /// `network.ip`: the address from the CNI result ("" when none).
    pub ip: String,
    /// The verbose `info` entry (containerd: JSON with `pid`,
    /// `runtimeSpec`, ...).
    pub info: Option<serde_json::Value>,
}

impl SandboxStatus {
    /// The sandbox's (pause process') pid, from the verbose info.
    pub fn pid(&self) -> Option<u32> {
        let pid = self.info.as_ref()?.get("pid")?.as_u64()?;
        u32::try_from(pid).ok().filter(|p| *p > 0)
    }
}

/// One `RuntimeCondition` of the runtime's `Status`.
#[derive(Debug, Clone)]
pub struct Condition {
    pub kind: String,
    pub status: bool,
    pub reason: String,
    pub message: String,
}

/// The runtime's `Status` (verbose).
#[derive(Debug, Clone)]
pub struct RuntimeStatus {
    pub conditions: Vec<Condition>,
    /// containerd's verbose info: `cniconfig` (the loaded CNI networks,
    /// with each list's source text), `lastCNILoadStatus`, `config`.
    pub info: Vec<(String, String)>,
}

impl RuntimeStatus {
    /// Whether `NetworkReady` is true.
    pub fn network_ready(&self) -> bool {
        self.conditions
            .iter()
            .any(|c| c.kind == "NetworkReady" && c.status)
    }

    /// The source text of every CNI network list containerd has loaded
    /// (its own loopback network first).
    pub fn loaded_cni_sources(&self) -> Vec<String> {
        let Some((_, text)) = self.info.iter().find(|(k, _)| k == "cniconfig") else {
            return Vec::new();
        };
        let v: serde_json::Value = serde_json::from_str(text).unwrap_or_default();
        v["Networks"]
            .as_array()
            .map(|nets| {
                nets.iter()
                    .filter_map(|n| n["Config"]["Source"].as_str().map(String::from))
                    .collect()
            })
            .unwrap_or_default()
    }
}

/// A connected CRI client.
#[derive(Debug)]
pub struct Cri {
    client: Client,
}

fn malformed(e: super::wire::Malformed) -> GrpcError {
    GrpcError::Transport {
        what: "decoding the CRI answer".into(),
        detail: e.to_string(),
    }
}

impl Cri {
    pub fn connect(socket: &Path) -> Result<Cri, GrpcError> {
        Ok(Cri {
            client: Client::connect(socket)?,
        })
    }

    fn call(&self, method: &str, req: Msg, timeout: Duration) -> Result<Fields, GrpcError> {
        let answer = self
            .client
            .call(&format!("{SERVICE}{method}"), req.into_bytes(), timeout)?;
        Fields::parse(&answer).map_err(malformed)
    }

    /// `Version`: the runtime's name and version.
    pub fn version(&self) -> Result<(String, String), GrpcError> {
        let r = self.call(
            "Version",
            Msg::new().string(1, "v1"),
            Duration::from_secs(5),
        )?;
        Ok((r.string(2), r.string(3)))
    }

    /// `Status` with `verbose`.
    pub fn status(&self) -> Result<RuntimeStatus, GrpcError> {
        let r = self.call("Status", Msg::new().varint(1, 1), Duration::from_secs(10))?;
        let conditions = r
            .message(1)
            .and_then(|s| s.messages(1))
            .map_err(malformed)?
            .into_iter()
            .map(|c| Condition {
                kind: c.string(1),
                status: c.varint(2) != 0,
                reason: c.string(3),
                message: c.string(4),
            })
            .collect();
        Ok(RuntimeStatus {
            conditions,
            info: r.map(2).map_err(malformed)?,
        })
    }

    /// `RunPodSandbox`: returns the sandbox id. The CNI ADD runs inside.
    pub fn run_pod_sandbox(&self, spec: &SandboxSpec) -> Result<String, GrpcError> {
        let r = self.call(
            "RunPodSandbox",
            Msg::new().message(1, spec.encode()),
            REQUEST_TIMEOUT,
        )?;
        Ok(r.string(1))
    }

    /// `PodSandboxStatus` with `verbose`.
    pub fn pod_sandbox_status(&self, id: &str) -> Result<SandboxStatus, GrpcError> {
        let r = self.call(
            "PodSandboxStatus",
            Msg::new().string(1, id).varint(2, 1),
            Duration::from_secs(10),
        )?;
        let s = r.message(1).map_err(malformed)?;
        let meta = s.message(2).map_err(malformed)?;
        let network = s.message(5).map_err(malformed)?;
        let info = r
            .map(2)
            .map_err(malformed)?
            .into_iter()
            .find(|(k, _)| k == "info")
            .and_then(|(_, v)| serde_json::from_str(&v).ok());
        Ok(SandboxStatus {
            id: s.string(1),
            name: meta.string(1),
            namespace: meta.string(3),
            ready: s.varint(3) == 0,
            ip: network.string(1),
            info,
        })
    }

    /// `StopPodSandbox`: the CNI DEL runs inside.
    pub fn stop_pod_sandbox(&self, id: &str) -> Result<(), GrpcError> {
        self.call("StopPodSandbox", Msg::new().string(1, id), REQUEST_TIMEOUT)
            .map(drop)
    }

    /// `RemovePodSandbox`.
    pub fn remove_pod_sandbox(&self, id: &str) -> Result<(), GrpcError> {
        self.call(
            "RemovePodSandbox",
            Msg::new().string(1, id),
            REQUEST_TIMEOUT,
        )
        .map(drop)
    }

    /// `ListPodSandbox` without a filter: every sandbox's id.
    pub fn list_pod_sandbox_ids(&self) -> Result<Vec<String>, GrpcError> {
        let r = self.call("ListPodSandbox", Msg::new(), Duration::from_secs(10))?;
        Ok(r.messages(1)
            .map_err(malformed)?
            .into_iter()
            .map(|s| s.string(1))
            .collect())
    }
}
