//! linkerd-cni's image run by a node's containerd the way the DaemonSet in
//! `deploy/linkerd-cni.yaml` runs it: built from this workspace's binaries
//! with the Dockerfile's layout, started with `ctr run` with host networking
//! (the node's netns, where containerd runs), a read-only root, every
//! capability dropped, the `/host/...` bind mounts of the node's CNI dirs,
//! the service-account files, and the manifest's environment. The readiness
//! probe is the manifest's: `linkerd-cni-installer check` inside the
//! container (`ctr task exec`).
//!
//! Where the node's dirs are not `/etc/cni/net.d` and `/opt/cni/bin` (they
//! are temp dirs here), the mounts follow the chart's rule: the host path
//! `P` appears at `/host/P`, and `DEST_CNI_*` name the host paths.
//!
//! [`start`] runs it as the linkerd2-cni chart's install-cni container
//! (the installer alone); [`start_deployed`] as `deploy/linkerd-cni.yaml`'s
//! one container: every variable the manifest sets, read from the manifest
//! (downward-API fields filled from [`Deployed`]), so the installer also
//! repairs the node's pods and answers the plugin's lookups on a socket in
//! the plugin's state dir, mounted as the manifest mounts it, with the
//! runtime's settings (the node's containerd config, libcni's result
//! cache) mounted read-only.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use testkit::FakeApiServer;

use super::containerd::{CriNode, RESULTS_DIR};
use super::image::{self, DockerfileLayout};
use crate::sys;

/// The containerd namespace of the DaemonSet's container (not the CRI's:
/// the test starts it directly, as the kubelet would through CRI).
pub const NAMESPACE: &str = "lcnic";

/// The image's reference in the node's containerd.
pub const IMAGE: &str = "lcnic.local/linkerd-cni:test";

/// Where the kubelet mounts the service account's token and CA.
const SERVICE_ACCOUNT_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

/// Capabilities of containerd's default spec, all dropped (the manifest's
/// `drop: [ALL]`; ctr's `--cap-drop` takes names, not `ALL`). The manifest
/// adds none back: the installer runs as uid 0 and writes root-owned dirs
/// as their owner.
const DEFAULT_CAPS: [&str; 14] = [
    "CAP_CHOWN",
    "CAP_DAC_OVERRIDE",
    "CAP_FSETID",
    "CAP_FOWNER",
    "CAP_MKNOD",
    "CAP_NET_RAW",
    "CAP_SETGID",
    "CAP_SETUID",
    "CAP_SETFCAP",
    "CAP_SETPCAP",
    "CAP_NET_BIND_SERVICE",
    "CAP_SYS_CHROOT",
    "CAP_KILL",
    "CAP_AUDIT_WRITE",
];

/// The running container; killed (SIGTERM, then SIGKILL) and deleted on
/// drop.
#[derive(Debug)]
pub struct DaemonSetPod<'a> {
    node: &'a CriNode,
    id: String,
    installer: String,
    log: PathBuf,
    fifo_dir: PathBuf,
    probes: u32,
}

/// Builds the image from `binary(name)` for each file the Dockerfile
/// copies (`name` is the COPY source's file name), imports it, and starts
/// the container on `node` against `api`. `cni_network_config` is the
/// ConfigMap's `cni_network_config`.
pub fn start<'a>(
    node: &'a CriNode,
    api: &FakeApiServer,
    cni_network_config: &str,
    binary: impl Fn(&str) -> PathBuf,
) -> DaemonSetPod<'a> {
    start_as(node, api, cni_network_config, binary, None)
}

/// What the downward API gives `deploy/linkerd-cni.yaml`'s container.
#[derive(Debug, Clone)]
pub struct Deployed {
    /// `spec.nodeName`: the node whose pods it repairs and whose taint it
    /// removes.
    pub node_name: String,
    /// `metadata.name`: the DaemonSet pod's.
    pub pod_name: String,
}

/// The DaemonSet pod's namespace (`metadata.namespace`).
pub const POD_NAMESPACE: &str = "linkerd-cni";

/// [`start`], as `deploy/linkerd-cni.yaml` runs the image: its variables
/// (the repair controller's too), the plugin's state dir, containerd's
/// config dir and libcni's result cache mounted.
pub fn start_deployed<'a>(
    node: &'a CriNode,
    api: &FakeApiServer,
    cni_network_config: &str,
    binary: impl Fn(&str) -> PathBuf,
    deployed: &Deployed,
) -> DaemonSetPod<'a> {
    start_as(node, api, cni_network_config, binary, Some(deployed))
}

/// One variable of the manifest's container: its name and where its value
/// comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ManifestVar {
    /// `value:`, unquoted.
    Literal(String, String),
    /// `valueFrom.configMapKeyRef.key`.
    ConfigMap(String, String),
    /// `valueFrom.fieldRef.fieldPath`.
    Field(String, String),
}

/// The variables `deploy/linkerd-cni.yaml`'s install-cni container sets
/// (commented-out ones are not set), in order. A line scan of the
/// manifest's `env:` list, enough for its flat entries: a form it does not
/// know is a panic naming the variable.
pub fn manifest_env() -> Vec<ManifestVar> {
    let lines: Vec<&str> = testkit::chart::MANIFEST.lines().collect();
    let start = lines
        .iter()
        .position(|l| l.trim() == "env:")
        .unwrap_or_else(|| panic!("deploy/linkerd-cni.yaml has no env: list"));
    let indent = |l: &str| l.len() - l.trim_start().len();
    let list_indent = indent(lines[start]);
    let mut vars = Vec::new();
    let mut name: Option<String> = None;
    for line in &lines[start + 1..] {
        let t = line.trim();
        if t.is_empty() || t.starts_with('#') {
            continue;
        }
        if indent(line) <= list_indent && !t.starts_with("- ") {
            break;
        }
        let value = |key: &str| {
            t.strip_prefix(key)
                .map(|v| v.trim().trim_matches('"').to_string())
        };
        if let Some(n) = value("- name:") {
            if let Some(n) = name.replace(n) {
                panic!("deploy/linkerd-cni.yaml: {n} has no value the harness knows");
            }
        } else if let Some(v) = value("value:") {
            vars.extend(name.take().map(|n| ManifestVar::Literal(n, v)));
        } else if let Some(v) = value("key:") {
            vars.extend(name.take().map(|n| ManifestVar::ConfigMap(n, v)));
        } else if let Some(v) = value("fieldPath:") {
            vars.extend(name.take().map(|n| ManifestVar::Field(n, v)));
        }
    }
    if let Some(n) = name {
        panic!("deploy/linkerd-cni.yaml: {n} has no value the harness knows");
    }
    vars
}

fn start_as<'a>(
    node: &'a CriNode,
    api: &FakeApiServer,
    cni_network_config: &str,
    binary: impl Fn(&str) -> PathBuf,
    deployed: Option<&Deployed>,
) -> DaemonSetPod<'a> {
    let layout = DockerfileLayout::of_repository();
    let installer = layout
        .entrypoint
        .first()
        .cloned()
        .unwrap_or_else(|| panic!("the Dockerfile has no ENTRYPOINT"));
    node.import(NAMESPACE, &image::project_image(IMAGE, &layout, binary));

    let dir = node.containerd_dir().join(testkit::unique_name("ds"));
    let sa = dir.join("serviceaccount");
    let fifo_dir = dir.join("fifo");
    for d in [&sa, &fifo_dir] {
        std::fs::create_dir_all(d).unwrap_or_else(|e| panic!("cannot create {}: {e}", d.display()));
    }
    for (name, content) in [
        ("token", api.token()),
        ("ca.crt", api.ca_pem()),
        ("namespace", "linkerd-cni"),
    ] {
        std::fs::write(sa.join(name), content)
            .unwrap_or_else(|e| panic!("cannot write {}: {e}", sa.display()));
    }
    let log = dir.join("install-cni.log");
    let id = testkit::unique_name("install-cni");
    let host = |p: &Path| format!("/host{}", p.display());
    let bind = |src: &Path, dst: &str, mode: &str| {
        format!(
            "type=bind,src={},dst={dst},options=rbind:{mode}",
            src.display()
        )
    };
    let addr = api.addr();
    let mut cmd = node.ctr(NAMESPACE);
    cmd.args(["run", "--detach", "--snapshotter", "native"])
        .args(["--net-host", "--read-only"])
        .arg("--cgroup")
        .arg(format!("/{}/{id}", node.cgroup_parent()))
        .arg("--fifo-dir")
        .arg(&fifo_dir)
        .arg("--log-uri")
        .arg(format!("file://{}", log.display()));
    for cap in DEFAULT_CAPS {
        cmd.args(["--cap-drop", cap]);
    }
    cmd.arg("--mount")
        .arg(bind(&node.bin_dir(), &host(&node.bin_dir()), "rw"))
        .arg("--mount")
        .arg(bind(&node.conf_dir(), &host(&node.conf_dir()), "rw"))
        .arg("--mount")
        .arg(bind(&sa, SERVICE_ACCOUNT_DIR, "ro"));
    let mut env: Vec<(String, String)> = match deployed {
        None => [
            ("DEST_CNI_NET_DIR", node.conf_dir().display().to_string()),
            ("DEST_CNI_BIN_DIR", node.bin_dir().display().to_string()),
            ("CNI_NETWORK_CONFIG", cni_network_config.to_string()),
            ("LINKERD_CNI_RESYNC_SECONDS", "10".into()),
        ]
        .map(|(k, v)| (k.to_string(), v))
        .to_vec(),
        Some(d) => {
            // The node's IP as the pod sees it (status.hostIP): the address
            // the node's API server listens on, in the node's netns.
            let host_ip = addr.ip().to_string();
            let mut env: Vec<(String, String)> = manifest_env()
                .into_iter()
                .map(|var| match var {
                    ManifestVar::Literal(k, v) => (k, v),
                    ManifestVar::ConfigMap(k, key) => {
                        let v = match key.as_str() {
                            "dest_cni_net_dir" => node.conf_dir().display().to_string(),
                            "dest_cni_bin_dir" => node.bin_dir().display().to_string(),
                            "cni_network_config" => cni_network_config.to_string(),
                            _ => panic!("{k}: ConfigMap key {key} unknown to the harness"),
                        };
                        (k, v)
                    }
                    ManifestVar::Field(k, path) => {
                        let v = match path.as_str() {
                            "spec.nodeName" => d.node_name.clone(),
                            "metadata.name" => d.pod_name.clone(),
                            "metadata.namespace" => POD_NAMESPACE.to_string(),
                            "status.hostIP" => host_ip.clone(),
                            _ => panic!("{k}: field {path} unknown to the harness"),
                        };
                        (k, v)
                    }
                })
                .collect();
            // The node's dirs are not the manifest's: the repair controller
            // finds them where the mounts below put them (its defaults are
            // /host/etc/cni/net.d and /host/run/linkerd-cni).
            env.extend([
                (
                    "LINKERD_CNI_REPAIR_CONTROLLER_CNI_NET_DIR".to_string(),
                    host(&node.conf_dir()),
                ),
                (
                    "LINKERD_CNI_REPAIR_CONTROLLER_STATE_DIR".to_string(),
                    host(&node.state_dir()),
                ),
            ]);
            env
        }
    };
    // What the kubelet sets for the in-cluster API (here the fake server
    // on the node's loopback).
    env.extend([
        ("KUBERNETES_SERVICE_HOST".to_string(), addr.ip().to_string()),
        (
            "KUBERNETES_SERVICE_PORT".to_string(),
            addr.port().to_string(),
        ),
    ]);
    if deployed.is_some() {
        // The manifest's other mounts: the plugin's state dir, and the
        // runtime's settings read-only (where the node's containerd reads
        // its config, and libcni's result cache, which lives in
        // containerd's mount namespace: the bind's source is resolved
        // there, by runc).
        let state = node.state_dir();
        let settings = crate::installer::mount_prefix(node).join("etc/containerd");
        let results = PathBuf::from(format!("/proc/{}/root{RESULTS_DIR}", node.containerd_pid()));
        for d in [&state, &results] {
            std::fs::create_dir_all(d)
                .unwrap_or_else(|e| panic!("cannot create {}: {e}", d.display()));
        }
        cmd.arg("--mount")
            .arg(bind(&state, &host(&state), "rw"))
            .arg("--mount")
            .arg(bind(&settings, "/host/etc/containerd", "ro"))
            .arg("--mount")
            .arg(bind(
                Path::new(RESULTS_DIR),
                &format!("/host{RESULTS_DIR}"),
                "ro",
            ));
    }
    for (k, v) in env {
        cmd.arg("--env").arg(format!("{k}={v}"));
    }
    cmd.args([IMAGE, &id]);
    sys::checked(&mut cmd);
    DaemonSetPod {
        node,
        id,
        installer,
        log,
        fifo_dir,
        probes: 0,
    }
}

impl DaemonSetPod<'_> {
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The container's output so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The readiness probe, `<installer> check` inside the container:
    /// its exit code and output.
    pub fn probe(&mut self) -> (i32, String) {
        self.probes += 1;
        let out = sys::output(
            self.node
                .ctr(NAMESPACE)
                .args(["task", "exec", "--fifo-dir"])
                .arg(&self.fifo_dir)
                .args(["--exec-id", &format!("probe-{}", self.probes)])
                .args([&self.id, &self.installer, "check"]),
        );
        let mut text = String::from_utf8_lossy(&out.stdout).into_owned();
        text.push_str(&String::from_utf8_lossy(&out.stderr));
        (out.status.code().unwrap_or(-1), text)
    }

    /// Probes until ready, as the kubelet does (within `within`); returns
    /// the number of probes, or the last answer.
    pub fn wait_ready(&mut self, within: Duration) -> Result<u32, String> {
        let deadline = Instant::now() + within;
        loop {
            let (code, text) = self.probe();
            if code == 0 {
                return Ok(self.probes);
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "not ready within {within:?}: exit {code}: {text}\n--- container log ---\n{}",
                    self.log()
                ));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The container's main process as the host sees it.
    pub fn pid(&self) -> Option<u32> {
        let out = sys::output(self.node.ctr(NAMESPACE).args(["task", "ls"]));
        String::from_utf8_lossy(&out.stdout).lines().find_map(|l| {
            let mut w = l.split_whitespace();
            (w.next() == Some(self.id.as_str()))
                .then(|| w.next()?.parse().ok())
                .flatten()
        })
    }

    /// Whether the task is running.
    pub fn running(&self) -> bool {
        let out = sys::output(self.node.ctr(NAMESPACE).args(["task", "ls"]));
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .any(|l| l.split_whitespace().next() == Some(self.id.as_str()) && l.contains("RUNNING"))
    }

    /// SIGTERM (how the kubelet stops it), SIGKILL after 10 s, then the
    /// task and container deleted.
    fn stop(&self) {
        let ctr = |args: &[&str]| sys::output(self.node.ctr(NAMESPACE).args(args));
        ctr(&["task", "kill", "--signal", "SIGTERM", &self.id]);
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.running() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        if self.running() {
            ctr(&["task", "kill", "--signal", "SIGKILL", &self.id]);
        }
        ctr(&["task", "delete", "--force", &self.id]);
        ctr(&["container", "delete", &self.id]);
    }
}

impl Drop for DaemonSetPod<'_> {
    fn drop(&mut self) {
        self.stop();
        if std::thread::panicking() {
            eprintln!("--- install-cni log ---\n{}", self.log());
        }
    }
}

/// The capability sets of process `pid` (`CapEff`, `CapPrm`, `CapBnd` as
/// hex), from `/proc/<pid>/status`.
pub fn capabilities(pid: u32) -> Vec<(String, String)> {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.starts_with("Cap")
                .then(|| (k.to_string(), v.trim().to_string()))
        })
        .collect()
}

/// `ctr` exit status helper for tests that inspect the container further.
pub fn ctr_ok(node: &CriNode, args: &[&str]) -> String {
    sys::checked(node.ctr(NAMESPACE).args(args))
}
