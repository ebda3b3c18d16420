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

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use testkit::FakeApiServer;

use super::containerd::CriNode;
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
    for (k, v) in [
        ("DEST_CNI_NET_DIR", node.conf_dir().display().to_string()),
        ("DEST_CNI_BIN_DIR", node.bin_dir().display().to_string()),
        ("CNI_NETWORK_CONFIG", cni_network_config.to_string()),
        ("LINKERD_CNI_RESYNC_SECONDS", "10".into()),
        // What the kubelet sets for the in-cluster API (here the fake
        // server on the node's loopback).
        ("KUBERNETES_SERVICE_HOST", addr.ip().to_string()),
        ("KUBERNETES_SERVICE_PORT", addr.port().to_string()),
    ] {
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
