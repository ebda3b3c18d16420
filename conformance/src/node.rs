//! A throwaway node and its pods.
//!
//! A [`Node`] is a network namespace standing in for the host, plus a temp
//! dir holding its conf dir (`net.d`), bin dir (the Debian reference plugins
//! and our `linkerd-cni`), libcni's result cache and host-local's IPAM
//! state. The libcni driver runs inside the node namespace, so the links
//! that bridge and ptp create, and the rules portmap writes, land there and
//! never on the machine running the tests.
//!
//! A [`Pod`] is one more namespace with a container ID and the `CNI_ARGS` a
//! kubelet would pass.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};

use serde_json::{Value, json};

use crate::artifacts;
use crate::driver::{self, Exec, Outcome};
use testkit::iptables::{Backend, Family, NatTable};
use testkit::names::unique_id;
use testkit::{TempDir, TestNetns, child_path};

use crate::sys;

/// Where Debian's containernetworking-plugins installs the plugins.
pub const REFERENCE_PLUGIN_DIR: &str = "/usr/lib/cni";

/// The reference plugins the tests chain with linkerd-cni.
pub const REFERENCE_PLUGINS: [&str; 6] = [
    "bridge",
    "ptp",
    "host-local",
    "portmap",
    "tuning",
    "loopback",
];

static SUBNETS: AtomicU64 = AtomicU64::new(0);

/// A throwaway node. Everything it made is removed on drop, also when the
/// test panics. `Sync`: pods can be added from many threads at once.
#[derive(Debug)]
pub struct Node {
    id: String,
    // Dropped in this order: the namespace (and the links in it), then the
    // files.
    netns: TestNetns,
    dir: TempDir,
    subnet: String,
    calls: AtomicU64,
}

impl Node {
    /// A new node. Panics with what is missing when the machine cannot run
    /// the tests (not root, packages missing), so nothing passes by accident.
    pub fn new() -> Node {
        Self::build(next_subnet(), true)
    }

    /// A new node whose pods get addresses from `subnet` (a /24), e.g. to
    /// compare its results with another node's.
    pub fn with_subnet(subnet: &str) -> Node {
        Self::build(subnet.to_string(), true)
    }

    /// A new node whose bin dir holds only the reference plugins: putting
    /// `linkerd-cni` there is left to the installer under test.
    pub fn without_linkerd_cni() -> Node {
        Self::build(next_subnet(), false)
    }

    fn build(subnet: String, with_linkerd_cni: bool) -> Node {
        sys::require_environment();
        let id = unique_id();
        let netns = TestNetns::new("node")
            .unwrap_or_else(|e| panic!("cannot create the node's network namespace: {e}"));
        let dir = TempDir::new("node")
            .unwrap_or_else(|e| panic!("cannot create the node's temp dir: {e}"));
        let node = Node {
            id,
            netns,
            dir,
            subnet,
            calls: AtomicU64::new(0),
        };
        for d in [
            node.conf_dir(),
            node.bin_dir(),
            node.cache_dir(),
            node.ipam_dir(),
            node.scratch_dir(),
            node.state_dir(),
        ] {
            std::fs::create_dir(&d)
                .unwrap_or_else(|e| panic!("cannot create {}: {e}", d.display()));
        }
        for plugin in REFERENCE_PLUGINS {
            node.install_bin(plugin, &Path::new(REFERENCE_PLUGIN_DIR).join(plugin));
        }
        if with_linkerd_cni {
            node.install_bin("linkerd-cni", &artifacts::linkerd_cni());
        }
        node
    }

    /// Makes `target` available in the bin dir as `name` (a symlink: the
    /// build output stays the one source of truth).
    pub fn install_bin(&self, name: &str, target: &Path) {
        let link = self.bin_dir().join(name);
        std::os::unix::fs::symlink(target, &link).unwrap_or_else(|e| {
            panic!(
                "cannot link {} -> {}: {e}",
                link.display(),
                target.display()
            )
        });
    }

    /// `<pid>-<n>`: unique on this machine, for names derived from the node.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The namespace standing in for the host.
    pub fn netns(&self) -> &TestNetns {
        &self.netns
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The CNI conf dir (`/etc/cni/net.d` of this node).
    pub fn conf_dir(&self) -> PathBuf {
        self.dir().join("net.d")
    }

    /// The CNI bin dir (`/opt/cni/bin` of this node).
    pub fn bin_dir(&self) -> PathBuf {
        self.dir().join("bin")
    }

    /// libcni's result cache (`/var/lib/cni` of this node).
    pub fn cache_dir(&self) -> PathBuf {
        self.dir().join("cache")
    }

    /// host-local's `dataDir`.
    pub fn ipam_dir(&self) -> PathBuf {
        self.dir().join("ipam")
    }

    /// Harness files (traces, staged configs, logs): never read by a
    /// runtime.
    pub fn scratch_dir(&self) -> PathBuf {
        self.dir().join("scratch")
    }

    /// linkerd-cni's `state_dir` on this node (its repair history), so that
    /// no test writes the machine's `/run/linkerd-cni`.
    pub fn state_dir(&self) -> PathBuf {
        self.dir().join("state")
    }

    /// Where the installer writes the plugin's kubeconfig (its default
    /// `KUBECONFIG_FILE_NAME` in the conf dir), and where
    /// [`crate::chains::linkerd_entry`] points the plugin.
    pub fn kubeconfig_path(&self) -> PathBuf {
        self.conf_dir().join("ZZZ-linkerd-cni-kubeconfig")
    }

    /// The pod subnet, `10.x.y.0/24`.
    pub fn subnet(&self) -> &str {
        &self.subnet
    }

    /// A network name unique to this node: `<label>-<node id>`.
    pub fn network_name(&self, label: &str) -> String {
        format!("{label}-{}", self.id)
    }

    /// Writes `conf` as `file_name` into the conf dir the way a CNI's
    /// installer does: staged outside the conf dir, then renamed in, so a
    /// reader never sees half a file.
    pub fn write_conf(&self, file_name: &str, conf: &Value) -> PathBuf {
        let staged = self.scratch_dir().join(format!("conf-{}", unique_id()));
        let mut text = serde_json::to_string_pretty(conf).unwrap_or_default();
        text.push('\n');
        std::fs::write(&staged, text)
            .unwrap_or_else(|e| panic!("cannot write {}: {e}", staged.display()));
        let target = self.conf_dir().join(file_name);
        std::fs::rename(&staged, &target)
            .unwrap_or_else(|e| panic!("cannot rename to {}: {e}", target.display()));
        target
    }

    /// The file a runtime uses (containerd's rule): the first `*.conf`,
    /// `*.conflist` or `*.json` in bytewise name order, the extension as
    /// Go's `filepath.Ext` sees it (so `.conflist` alone counts), directories
    /// skipped. Written here from the spec rather than taken from the
    /// plugin, as an independent oracle.
    pub fn active_conf(&self) -> Option<PathBuf> {
        let mut names: Vec<_> = std::fs::read_dir(self.conf_dir())
            .ok()?
            .flatten()
            .filter(|e| e.file_type().is_ok_and(|t| !t.is_dir()))
            .map(|e| e.file_name())
            .filter(|n| {
                let b = n.as_encoded_bytes();
                let ext = b.iter().rposition(|&c| c == b'.').map(|i| &b[i..]);
                matches!(ext, Some(b".conf" | b".conflist" | b".json"))
            })
            .collect();
        names.sort_by(|a, b| a.as_encoded_bytes().cmp(b.as_encoded_bytes()));
        names.first().map(|n| self.conf_dir().join(n))
    }

    /// host-local IPAM for this node's subnet, state under [`Node::ipam_dir`].
    pub fn host_local(&self) -> Value {
        json!({
            "type": "host-local",
            "ranges": [[{"subnet": self.subnet}]],
            "routes": [{"dst": "0.0.0.0/0"}],
            "dataDir": self.ipam_dir(),
        })
    }

    /// A new pod namespace, not yet added to any network.
    pub fn pod(&self, spec: PodSpec) -> Pod {
        Pod {
            netns: TestNetns::new("pod")
                .unwrap_or_else(|e| panic!("cannot create a pod's network namespace: {e}")),
            container_id: format!("Ctr_{}.{}", self.id, unique_id()),
            spec,
        }
    }

    /// `cnidriver <args>` inside the node namespace, with the node's conf
    /// dir, bin dir and cache, and nothing else of this process's
    /// environment but PATH. Also for callers that time or script the driver
    /// themselves (benchmarks).
    pub fn driver_command<I, S>(&self, args: I) -> Command
    where
        I: IntoIterator<Item = S>,
        S: AsRef<std::ffi::OsStr>,
    {
        let mut cmd = self.netns.command(artifacts::cnidriver());
        cmd.env_clear()
            .env("PATH", child_path())
            .env("NETCONFPATH", self.conf_dir())
            .env("CNI_PATH", self.bin_dir())
            .env("CNI_CACHE_DIR", self.cache_dir())
            .arg("-error-json")
            .args(args);
        cmd
    }

    fn run(&self, mut cmd: Command) -> Outcome {
        let trace = self.scratch_dir().join(format!(
            "trace-{}.json",
            self.calls.fetch_add(1, Ordering::Relaxed)
        ));
        cmd.env("CNIDRIVER_TRACE", &trace);
        driver::run(cmd, &trace)
    }

    fn pod_command(&self, verb: &str, network: &str, pod: &Pod) -> Outcome {
        let mut cmd = self.driver_command([verb, network]);
        cmd.arg(pod.netns_path())
            .env("CNI_CONTAINERID", &pod.container_id)
            .env("CNI_IFNAME", &pod.spec.ifname)
            .env("CNI_ARGS", pod.cni_args());
        if let Some(cap) = &pod.spec.capability_args {
            cmd.env("CAP_ARGS", cap.to_string());
        }
        self.run(cmd)
    }

    /// A runtime's ADD of `pod` to `network` (libcni `AddNetworkList`).
    pub fn add(&self, network: &str, pod: &Pod) -> Outcome {
        self.pod_command("add", network, pod)
    }

    /// A runtime's CHECK (libcni `CheckNetworkList`, with the cached result).
    pub fn check(&self, network: &str, pod: &Pod) -> Outcome {
        self.pod_command("check", network, pod)
    }

    /// A runtime's DEL (libcni `DelNetworkList`, plugins in reverse).
    pub fn del(&self, network: &str, pod: &Pod) -> Outcome {
        self.pod_command("del", network, pod)
    }

    /// libcni's `GetVersionInfo` for plugin `plugin_type` of the bin dir:
    /// `{"supportedVersions": [...], "requested": "<libcni's version>",
    /// "libcniVersions": [<versions libcni itself can parse results of>]}`.
    pub fn version_info(&self, plugin_type: &str) -> Outcome {
        self.run(self.driver_command(["version", plugin_type]))
    }

    /// libcni's `ValidateNetworkList`: every plugin of the list exists and
    /// answers VERSION with the list's `cniVersion` among its versions.
    pub fn validate(&self, network: &str) -> Outcome {
        self.run(self.driver_command(["validate", network]))
    }

    /// Runs one traced plugin execution again, directly (not through
    /// libcni), with the same environment and stdin, inside the node: to see
    /// the bytes a failed plugin printed, which libcni does not hand back.
    /// Only for executions whose outcome depends on their input alone.
    pub fn replay(&self, exec: &Exec) -> std::process::Output {
        let mut cmd = self.netns.command(self.bin_dir().join(&exec.plugin));
        cmd.env_clear()
            .env("PATH", child_path())
            .envs(exec.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run {}: {e}", exec.plugin));
        let stdin = exec.stdin.to_string();
        if let Some(mut pipe) = child.stdin.take() {
            // A plugin that exits without reading stdin closes the pipe;
            // its output is what matters.
            let _ = pipe.write_all(stdin.as_bytes());
        }
        child
            .wait_with_output()
            .unwrap_or_else(|e| panic!("waiting for {}: {e}", exec.plugin))
    }

    /// Runs `f` inside the node namespace; see [`TestNetns::enter`].
    pub fn enter<T: Send>(&self, f: impl FnOnce() -> T + Send) -> T {
        self.netns.enter(f)
    }
}

impl Default for Node {
    fn default() -> Self {
        Node::new()
    }
}

/// `10.x.y.0/24`, different for every node of this process and, most of the
/// time, from other processes' (each node is its own namespace, so an
/// overlap would not even matter).
fn next_subnet() -> String {
    let n = SUBNETS.fetch_add(1, Ordering::Relaxed);
    let x = 100 + u64::from(std::process::id()) % 100;
    format!("10.{x}.{}.0/24", n % 256)
}

/// What a kubelet tells CNI about a pod.
#[derive(Debug, Clone)]
pub struct PodSpec {
    /// Namespace and name, passed as `K8S_POD_NAMESPACE`/`K8S_POD_NAME`.
    pub kubernetes: Option<(String, String)>,
    pub ifname: String,
    /// libcni capability args (e.g. `portMappings`), as `CAP_ARGS`.
    pub capability_args: Option<Value>,
}

impl PodSpec {
    /// A sandbox without Kubernetes identity: empty `CNI_ARGS`.
    pub fn bare() -> PodSpec {
        PodSpec {
            kubernetes: None,
            ifname: "eth0".into(),
            capability_args: None,
        }
    }

    /// A Kubernetes pod `namespace/name`.
    pub fn kubernetes(namespace: &str, name: &str) -> PodSpec {
        PodSpec {
            kubernetes: Some((namespace.into(), name.into())),
            ..PodSpec::bare()
        }
    }

    pub fn capability_args(mut self, args: Value) -> PodSpec {
        self.capability_args = Some(args);
        self
    }
}

/// A pod sandbox: its namespace is deleted on drop.
#[derive(Debug)]
pub struct Pod {
    netns: TestNetns,
    container_id: String,
    spec: PodSpec,
}

impl Pod {
    pub fn netns(&self) -> &TestNetns {
        &self.netns
    }

    pub fn netns_path(&self) -> &Path {
        self.netns.path()
    }

    /// Upper case, `_` and `.` on purpose: real runtimes' IDs have them.
    pub fn container_id(&self) -> &str {
        &self.container_id
    }

    pub fn spec(&self) -> &PodSpec {
        &self.spec
    }

    /// `CNI_ARGS` as a kubelet builds them.
    pub fn cni_args(&self) -> String {
        match &self.spec.kubernetes {
            None => String::new(),
            Some((ns, name)) => format!(
                "IgnoreUnknown=1;K8S_POD_NAMESPACE={ns};K8S_POD_NAME={name};\
                 K8S_POD_INFRA_CONTAINER_ID={}",
                self.container_id
            ),
        }
    }

    /// Deletes the namespace, as when a sandbox dies before its DEL.
    pub fn remove_netns(&mut self) {
        self.netns
            .remove()
            .unwrap_or_else(|e| panic!("cannot delete the pod's network namespace: {e}"));
    }

    /// `iptables-save -t nat` (or ip6tables) of one backend in the pod.
    pub fn nat(&self, backend: Backend, family: Family) -> NatTable {
        NatTable::read(&self.netns, backend, family)
    }

    /// The nat table of every backend and family, for "no rules" checks.
    pub fn nat_tables(&self) -> Vec<NatTable> {
        NatTable::read_all(&self.netns)
    }

    /// Deletes one nat rule in the pod with `backend`'s tools, as another
    /// agent tampering with the pod's rules would: `rule` is a `-A CHAIN
    /// ...` line as `*-save` prints it.
    pub fn delete_nat_rule(&self, backend: Backend, family: Family, rule: &str) {
        let rest = rule
            .strip_prefix("-A ")
            .unwrap_or_else(|| panic!("not an -A line: {rule}"));
        let (chain, spec) = rest.split_once(' ').unwrap_or((rest, ""));
        testkit::iptables::delete_rule(&self.netns, backend.tool(family), chain, spec);
    }

    /// The IPv4 addresses (`a.b.c.d/len`) on `ifname` in the pod.
    pub fn ipv4_addrs(&self, ifname: &str) -> Vec<String> {
        let out = sys::checked(
            self.netns
                .command("ip")
                .args(["-4", "-o", "addr", "show", "dev", ifname]),
        );
        out.lines()
            .filter_map(|l| {
                let mut it = l.split_whitespace();
                it.position(|w| w == "inet")?;
                it.next().map(String::from)
            })
            .collect()
    }
}
