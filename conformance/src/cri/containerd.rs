//! A containerd node: a [`Node`] (its netns, conf dir and bin dir) with a
//! containerd of its own serving CRI, as a kubelet's node has.
//!
//! # Isolation from the machine
//!
//! containerd gets its own root, state dir, socket, config and the node's
//! CNI dirs, so the machine's `/etc/cni/net.d`, `/opt/cni/bin`,
//! `/var/lib/containerd` and any running containerd are never touched. It
//! runs inside the node's network namespace (pods' veths and the node side
//! of their routes land there, and the plugins it runs reach the fake API
//! server on the node's loopback).
//!
//! containerd 1.6 still writes a few fixed host paths whatever its root and
//! state: libcni's result cache (`/var/lib/cni/results`), shim sockets
//! (`/run/containerd/s/`), runc's root (`/run/containerd/runc/<ns>`), FIFOs
//! (`/run/containerd/fifo`), and the sandbox netns mounts
//! (`/var/run/netns/cni-*`). Rather than chase each of them, containerd is
//! started in a mount namespace of its own, with private propagation and a
//! fresh tmpfs over `/run` and over `/var/lib`: the shims and runc it starts
//! inherit that namespace, everything they write there exists only in it,
//! and it is gone when the last of them exits. No mount point has to be
//! created on the machine for that, since `/run` and `/var/lib` always
//! exist. The tests look into a sandbox's netns through its pause process
//! (`ip netns attach`, a name of this harness), and at the rest through the
//! socket.
//!
//! Sandboxes' cgroups live under a parent named like every other thing of
//! this harness (`lcnic-cri-<pid>-<n>`), removed at the end.
//!
//! # Its config, and restarts
//!
//! containerd's `config.toml` is written where the node's installers read
//! the runtime's settings: `etc/containerd/config.toml` under their mount
//! prefix ([`crate::installer::mount_prefix`]), and containerd is started
//! with `--config` pointing there, so `chain_mode: auto` decides from the
//! file containerd runs with. [`CriNode::restart_containerd`] rewrites it
//! with another `max_conf_num` (a rename within its dir, as an editor or a
//! config manager replaces it) and restarts containerd as systemd would:
//! SIGTERM, then a new containerd on the same root, state dir, socket and
//! mount namespace (the shims, the sandboxes' netns mounts and libcni's
//! result cache live there and outlive containerd, as they do on a node).
//!
//! # Teardown
//!
//! On drop (also when a test panics): every sandbox is stopped and removed
//! through CRI, containerd gets SIGTERM (then SIGKILL), any process left in
//! its mount namespace or in its cgroups (shims, pause processes) is
//! killed, the cgroups are removed, then the node. [`CriNode::shutdown`]
//! does the same and then checks that nothing is left: no process, no
//! socket, no netns, no mount, no cgroup, no temp dir. A run killed with
//! SIGKILL is cleaned up by the next one (containerd itself dies with the
//! test process: `PR_SET_PDEATHSIG`).

use std::ffi::CString;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use super::api::{Cri, RuntimeStatus, SandboxSpec};
use super::grpc::GrpcError;
use super::image::{self, Image};
use crate::node::Node;
use crate::sys;
use testkit::child_path;

/// The CRI's containerd namespace (the kubelet's images and sandboxes).
pub const K8S_NAMESPACE: &str = "k8s.io";

/// libcni's result cache, in containerd's mount namespace.
pub const RESULTS_DIR: &str = "/var/lib/cni/results";

/// How long containerd may take to start serving, on a loaded machine.
const START_DEADLINE: Duration = Duration::from_secs(60);

/// The programs the tier runs. Checked once per process: a missing one
/// fails the test and says what to install.
fn require_tools() {
    static CHECKED: OnceLock<Result<(), String>> = OnceLock::new();
    let r = CHECKED.get_or_init(|| {
        let missing: Vec<&str> = [
            "containerd",
            "containerd-shim-runc-v2",
            "ctr",
            "runc",
            "gcc",
            "sha256sum",
        ]
        .into_iter()
        .filter(|t| which(t).is_none())
        .collect();
        if missing.is_empty() {
            sweep_leftovers();
            Ok(())
        } else {
            Err(format!(
                "the CRI tier needs {}: run `bash scripts/setup.sh` as root (./test.sh does), \
                 which installs Debian's containerd, runc and gcc",
                missing.join(", ")
            ))
        }
    });
    if let Err(e) = r {
        panic!("{e}");
    }
}

fn which(tool: &str) -> Option<PathBuf> {
    child_path()
        .split(':')
        .map(|d| Path::new(d).join(tool))
        .find(|p| p.is_file())
}

/// A node with containerd serving CRI. Derefs to its [`Node`].
pub struct CriNode {
    containerd: Option<Containerd>,
    node: Node,
}

struct Containerd {
    child: Child,
    dir: PathBuf,
    config: PathBuf,
    socket: PathBuf,
    log: PathBuf,
    /// `mnt:[inode]` of containerd's mount namespace, and an open handle on
    /// it: namespace inode numbers are reused once a namespace is gone, so
    /// the handle keeps the number ours until teardown has finished
    /// matching processes by it.
    mnt_ns: String,
    mnt_ns_handle: Option<File>,
    cgroup_parent: String,
    cri: Cri,
}

impl std::fmt::Debug for CriNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CriNode")
            .field("node", &self.node.id())
            .field("socket", &self.containerd.as_ref().map(|c| &c.socket))
            .finish()
    }
}

impl std::ops::Deref for CriNode {
    type Target = Node;
    fn deref(&self) -> &Node {
        &self.node
    }
}

impl CriNode {
    /// Starts containerd on `node` and imports the pause image. Panics
    /// with what failed (a broken environment, not an outcome).
    ///
    /// containerd is killed when the thread that called this ends
    /// (`PR_SET_PDEATHSIG` follows the parent thread): keep the node on the
    /// thread that started it.
    pub fn start(node: Node) -> CriNode {
        CriNode::start_with_max_conf_num(node, 1)
    }

    /// [`CriNode::start`] with `max_conf_num` in containerd's config (1:
    /// the first config file alone; 0: every file).
    pub fn start_with_max_conf_num(node: Node, max_conf_num: u32) -> CriNode {
        require_tools();
        let dir = node.dir().join("containerd");
        std::fs::create_dir(&dir)
            .unwrap_or_else(|e| panic!("cannot create {}: {e}", dir.display()));
        let socket = dir.join("containerd.sock");
        let config = crate::installer::mount_prefix(&node).join(CONFIG_PATH);
        if let Some(parent) = config.parent() {
            std::fs::create_dir_all(parent)
                .unwrap_or_else(|e| panic!("cannot create {}: {e}", parent.display()));
        }
        let cgroup_parent = testkit::unique_name("cri");
        std::fs::write(&config, config_toml(&node, &dir, &socket, max_conf_num))
            .unwrap_or_else(|e| panic!("cannot write {}: {e}", config.display()));
        let log = dir.join("containerd.log");
        let child = spawn_containerd(&node, &config, &log, None);
        let pid = child.id();
        let mnt_ns_handle = File::open(format!("/proc/{pid}/ns/mnt")).ok();
        let mnt_ns = match &mnt_ns_handle {
            Some(_) => std::fs::read_link(format!("/proc/{pid}/ns/mnt"))
                .map(|l| l.to_string_lossy().into_owned())
                .unwrap_or_default(),
            None => String::new(),
        };
        let mut me = CriNode {
            containerd: None,
            node,
        };
        // Until the client connects, a guard without one: on failure the
        // process and its namespace are still cleaned up.
        let mut pending = PendingChild(Some(child));
        let cri = match pending.0.as_mut() {
            Some(child) => wait_serving(child, &socket, &log),
            None => unreachable!(),
        };
        me.containerd = Some(Containerd {
            child: pending.0.take().unwrap_or_else(|| unreachable!()),
            dir,
            config,
            socket,
            log,
            mnt_ns,
            mnt_ns_handle,
            cgroup_parent,
            cri,
        });
        me.import(K8S_NAMESPACE, &image::pause_image());
        me
    }

    fn containerd(&self) -> &Containerd {
        self.containerd
            .as_ref()
            .unwrap_or_else(|| panic!("containerd was shut down"))
    }

    /// Restarts containerd with `max_conf_num` in its config, as an
    /// operator does on a node: the config file replaced (a rename within
    /// its dir), then SIGTERM and a new containerd on the same root, state
    /// dir, socket and mount namespace; returns once the new one serves
    /// CRI. Running sandboxes survive, as on a node (their shims do).
    pub fn restart_containerd(&mut self, max_conf_num: u32) {
        // In place in `self` throughout: should anything here fail, the
        // node's teardown still finds containerd (old or new), its
        // namespace and cgroups.
        let Some(c) = self.containerd.as_mut() else {
            panic!("containerd was shut down");
        };
        let staged = c
            .config
            .with_file_name(format!(".config.toml.{}.tmp", testkit::names::unique_id()));
        std::fs::write(
            &staged,
            config_toml(&self.node, &c.dir, &c.socket, max_conf_num),
        )
        .unwrap_or_else(|e| panic!("cannot write {}: {e}", staged.display()));
        std::fs::rename(&staged, &c.config)
            .unwrap_or_else(|e| panic!("cannot rename to {}: {e}", c.config.display()));
        let Some(ns) = c.mnt_ns_handle.as_ref() else {
            panic!("containerd's mount namespace is not held: cannot restart into it");
        };
        terminate(&mut c.child);
        c.child = spawn_containerd(&self.node, &c.config, &c.log, Some(ns));
        // Until it serves, the old (dead) client stays.
        c.cri = wait_serving(&mut c.child, &c.socket, &c.log);
    }

    /// libcni's result cache (`/var/lib/cni/results` in containerd's mount
    /// namespace, read through its root): each entry's file name and
    /// content, sorted by name.
    pub fn cni_results(&self) -> Vec<(String, String)> {
        let dir = PathBuf::from(format!("/proc/{}/root{RESULTS_DIR}", self.containerd_pid()));
        let mut out: Vec<(String, String)> = match std::fs::read_dir(&dir) {
            Ok(rd) => rd
                .flatten()
                .filter_map(|e| {
                    let text = std::fs::read_to_string(e.path()).ok()?;
                    Some((e.file_name().to_string_lossy().into_owned(), text))
                })
                .collect(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(e) => panic!("cannot read {}: {e}", dir.display()),
        };
        out.sort();
        out
    }

    /// The CRI client (one HTTP/2 connection; usable from many threads).
    pub fn cri(&self) -> &Cri {
        &self.containerd().cri
    }

    /// containerd's socket.
    pub fn socket(&self) -> &Path {
        &self.containerd().socket
    }

    /// containerd's pid.
    pub fn containerd_pid(&self) -> u32 {
        self.containerd().child.id()
    }

    /// containerd's log so far.
    pub fn containerd_log(&self) -> String {
        std::fs::read_to_string(&self.containerd().log).unwrap_or_default()
    }

    /// The harness's dir for containerd (config, socket, FIFOs, logs).
    pub fn containerd_dir(&self) -> &Path {
        &self.containerd().dir
    }

    /// The cgroup parent of this node's sandboxes and containers.
    pub fn cgroup_parent(&self) -> &str {
        &self.containerd().cgroup_parent
    }

    /// `ctr` talking to this containerd, in containerd namespace `ns`.
    pub fn ctr(&self, ns: &str) -> Command {
        let mut cmd = Command::new("ctr");
        cmd.env_clear()
            .env("PATH", child_path())
            .arg("--address")
            .arg(self.socket())
            .args(["--namespace", ns]);
        cmd
    }

    /// `ctr images import` of `image` into namespace `ns`, unpacked for the
    /// native snapshotter (the one the config selects: no overlay mounts,
    /// which a machine that is itself a container may refuse).
    pub fn import(&self, ns: &str, image: &Image) {
        let archive = self
            .containerd_dir()
            .join(format!("image-{}.tar", testkit::names::unique_id()));
        image.write_archive(&archive);
        sys::checked(
            self.ctr(ns)
                .args(["images", "import", "--snapshotter", "native"])
                .arg(&archive),
        );
        let _ = std::fs::remove_file(&archive);
    }

    /// The runtime's status (verbose).
    pub fn status(&self) -> RuntimeStatus {
        self.cri()
            .status()
            .unwrap_or_else(|e| panic!("CRI Status: {e}"))
    }

    /// Waits until containerd has loaded a CNI config for which `pred`
    /// (given each loaded network list's source text, containerd's loopback
    /// first) holds and reports NetworkReady. Returns the sources.
    pub fn wait_cni_loaded(&self, what: &str, pred: impl Fn(&[String]) -> bool) -> Vec<String> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let st = self.status();
            let sources = st.loaded_cni_sources();
            if st.network_ready() && pred(&sources) {
                return sources;
            }
            if Instant::now() > deadline {
                panic!("containerd never loaded {what}: {st:#?}");
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// A sandbox spec for pod `namespace/name` on this node.
    pub fn sandbox_spec(&self, namespace: &str, name: &str) -> SandboxSpec {
        SandboxSpec {
            name: name.into(),
            namespace: namespace.into(),
            uid: format!("uid-{}", testkit::names::unique_id()),
            attempt: 0,
            cgroup_parent: format!("/{}", self.cgroup_parent()),
        }
    }

    /// Stops containerd and everything it started, removes the node, and
    /// returns what was found left behind (empty: clean).
    pub fn shutdown(mut self) -> Vec<String> {
        let mut left = self.teardown();
        let netns = self.node.netns().path().to_path_buf();
        let dir = self.node.dir().to_path_buf();
        drop(self);
        for p in [&netns, &dir] {
            if p.exists() {
                left.push(format!("{} still exists", p.display()));
            }
        }
        left
    }

    /// Everything but the node itself; returns what could not be cleaned.
    fn teardown(&mut self) -> Vec<String> {
        let Some(mut c) = self.containerd.take() else {
            return Vec::new();
        };
        let mut left = Vec::new();
        // As the kubelet would: stop then remove every sandbox (CNI DEL).
        match c.cri.list_pod_sandbox_ids() {
            Ok(ids) => {
                for id in ids {
                    if let Err(e) = c.cri.stop_pod_sandbox(&id) {
                        left.push(format!("StopPodSandbox {id}: {e}"));
                    }
                    if let Err(e) = c.cri.remove_pod_sandbox(&id) {
                        left.push(format!("RemovePodSandbox {id}: {e}"));
                    }
                }
            }
            Err(e) => left.push(format!("ListPodSandbox: {e}")),
        }
        drop(c.cri);
        terminate(&mut c.child);
        let dir_text = c.dir.to_string_lossy().into_owned();
        // Shims (started with `-address <our socket>`), whatever they run,
        // and containers, found by mount namespace or cgroup.
        let stray = |pid: u32| {
            let ns = std::fs::read_link(format!("/proc/{pid}/ns/mnt"))
                .map(|l| l.to_string_lossy().into_owned())
                .unwrap_or_default();
            (!c.mnt_ns.is_empty() && ns == c.mnt_ns)
                || cmdline(pid).contains(&dir_text)
                || in_cgroup(pid, &c.cgroup_parent)
        };
        // Shims exit on their own once their last task is deleted, a
        // moment after the call that deleted it returned.
        let deadline = Instant::now() + Duration::from_secs(10);
        while all_pids()
            .into_iter()
            .any(|p| p != std::process::id() && alive(p) && stray(p))
            && Instant::now() < deadline
        {
            std::thread::sleep(Duration::from_millis(10));
        }
        for pid in kill_matching(|p| alive(p) && stray(p)) {
            left.push(format!("process {pid} of containerd was still running"));
        }
        if let Some(pid) = all_pids().into_iter().find(|p| stray(*p)) {
            left.push(format!("process {pid} of containerd survived SIGKILL"));
        }
        // The namespace (and its tmpfs mounts) goes with its last user.
        drop(c.mnt_ns_handle.take());
        left.extend(remove_cgroups(&c.cgroup_parent));
        if mounted_under(&c.dir) {
            left.push(format!("mounts under {} on the machine", c.dir.display()));
        }
        if std::thread::panicking() || !left.is_empty() {
            eprintln!(
                "--- containerd log {} ---\n{}",
                c.log.display(),
                std::fs::read_to_string(&c.log).unwrap_or_default()
            );
        }
        left
    }
}

impl Drop for CriNode {
    fn drop(&mut self) {
        for problem in self.teardown() {
            eprintln!("conformance: CRI node teardown: {problem}");
        }
    }
}

/// Holds containerd until the client is connected; kills it on drop.
struct PendingChild(Option<Child>);

impl Drop for PendingChild {
    fn drop(&mut self) {
        if let Some(c) = self.0.as_mut() {
            terminate(c);
        }
    }
}

/// Where containerd's config is, relative to the installers' mount prefix
/// (the first path `chain_mode: auto` reads).
const CONFIG_PATH: &str = "etc/containerd/config.toml";

fn config_toml(node: &Node, dir: &Path, socket: &Path, max_conf_num: u32) -> String {
    let q = |p: &Path| serde_json::to_string(&p.to_string_lossy()).unwrap_or_default();
    format!(
        r#"version = 2
root = {root}
state = {state}
# Plugins that would write outside root/state (opt: /opt/containerd) or
# need kernel features this machine may lack.
disabled_plugins = [
  "io.containerd.internal.v1.opt",
  "io.containerd.internal.v1.tracing",
  "io.containerd.snapshotter.v1.aufs",
  "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.snapshotter.v1.overlayfs",
  "io.containerd.snapshotter.v1.zfs",
]

[grpc]
  address = {socket}

[ttrpc]
  address = {ttrpc}

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{pause}"
  # root here lacks CAP_SYS_RESOURCE: runc cannot lower oom_score_adj.
  restrict_oom_score_adj = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "native"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = {bin}
    conf_dir = {conf}
    max_conf_num = {max_conf_num}
"#,
        root = q(&dir.join("root")),
        state = q(&dir.join("state")),
        socket = q(socket),
        ttrpc = q(&dir.join("containerd.ttrpc.sock")),
        pause = image::PAUSE_IMAGE,
        bin = q(&node.bin_dir()),
        conf = q(&node.conf_dir()),
    )
}

/// Until containerd (`child`) serves CRI on `socket`: the client.
/// Panics with its log when it exits or takes longer than
/// [`START_DEADLINE`].
fn wait_serving(child: &mut Child, socket: &Path, log: &Path) -> Cri {
    let deadline = Instant::now() + START_DEADLINE;
    loop {
        let attempt = if socket.exists() {
            Cri::connect(socket).and_then(|c| c.version().map(|_| c))
        } else {
            Err(GrpcError::Transport {
                what: "waiting for".into(),
                detail: socket.display().to_string(),
            })
        };
        match attempt {
            Ok(c) => return c,
            Err(e) => {
                let exited = child.try_wait().ok().flatten();
                if exited.is_some() || Instant::now() > deadline {
                    panic!(
                        "containerd did not start serving CRI on {} ({e}; exit {exited:?}):\n{}",
                        socket.display(),
                        std::fs::read_to_string(log).unwrap_or_default()
                    );
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
}

/// Starts containerd in the node's netns, in a new mount namespace of its
/// own, or in `mnt_ns` (a restart: the one its predecessor made). Its
/// output is appended to `log`.
fn spawn_containerd(node: &Node, config: &Path, log: &Path, mnt_ns: Option<&File>) -> Child {
    let netns = File::open(node.netns().path())
        .unwrap_or_else(|e| panic!("cannot open {}: {e}", node.netns().path().display()));
    let out = File::options()
        .create(true)
        .append(true)
        .open(log)
        .unwrap_or_else(|e| panic!("cannot open {}: {e}", log.display()));
    let err = out
        .try_clone()
        .unwrap_or_else(|e| panic!("cannot dup {}: {e}", log.display()));
    // Prepared before fork: nothing may allocate between fork and exec.
    let cs = |s: &str| CString::new(s).unwrap_or_default();
    let (root, tmpfs, run, var_lib, opts) = (
        cs("/"),
        cs("tmpfs"),
        cs("/run"),
        cs("/var/lib"),
        cs("mode=0755"),
    );
    let fd = netns.as_raw_fd();
    let mnt_fd = mnt_ns.map(File::as_raw_fd);
    let mut cmd = Command::new("containerd");
    cmd.arg("--config")
        .arg(config)
        .env_clear()
        .env("PATH", child_path())
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err);
    // SAFETY: only async-signal-safe system calls on data prepared before
    // the fork; they change the child alone.
    unsafe {
        cmd.pre_exec(move || {
            let check = |rc: libc::c_int| {
                if rc != 0 {
                    Err(std::io::Error::last_os_error())
                } else {
                    Ok(())
                }
            };
            check(libc::setns(fd, libc::CLONE_NEWNET))?;
            if let Some(mnt) = mnt_fd {
                // Its predecessor's namespace: private, /run and /var/lib
                // already its own.
                check(libc::setns(mnt, libc::CLONE_NEWNS))?;
                return check(libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL));
            }
            check(libc::unshare(libc::CLONE_NEWNS))?;
            check(libc::mount(
                std::ptr::null(),
                root.as_ptr(),
                std::ptr::null(),
                libc::MS_REC | libc::MS_PRIVATE,
                std::ptr::null(),
            ))?;
            for target in [&run, &var_lib] {
                check(libc::mount(
                    tmpfs.as_ptr(),
                    target.as_ptr(),
                    tmpfs.as_ptr(),
                    libc::MS_NOSUID | libc::MS_NODEV,
                    opts.as_ptr().cast(),
                ))?;
            }
            check(libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL))
        });
    }
    let child = cmd.spawn().unwrap_or_else(|e| {
        panic!("cannot start containerd in its own mount namespace in the node: {e}")
    });
    drop(netns);
    child
}

/// SIGTERM, then SIGKILL after 10 s; reaped.
fn terminate(child: &mut Child) {
    if let Ok(pid) = libc::pid_t::try_from(child.id()) {
        // SAFETY: kill(2) on our own unreaped child.
        unsafe {
            libc::kill(pid, libc::SIGTERM);
        }
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match child.try_wait() {
            Ok(Some(_)) => return,
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(10)),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return;
            }
        }
    }
}

fn all_pids() -> Vec<u32> {
    std::fs::read_dir("/proc")
        .map(|rd| {
            rd.flatten()
                .filter_map(|e| e.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

fn cmdline(pid: u32) -> String {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|b| String::from_utf8_lossy(&b).replace('\0', " "))
        .unwrap_or_default()
}

fn in_cgroup(pid: u32, parent: &str) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/cgroup")).is_ok_and(|c| {
        c.lines()
            .any(|l| l.contains(&format!("/{parent}/")) || l.ends_with(&format!("/{parent}")))
    })
}

/// SIGKILLs every process for which `matches` holds and waits (bounded)
/// for them to go. Returns the pids it killed.
fn kill_matching(matches: impl Fn(u32) -> bool) -> Vec<u32> {
    let me = std::process::id();
    let pids: Vec<u32> = all_pids()
        .into_iter()
        .filter(|p| *p != me && matches(*p))
        .collect();
    for pid in &pids {
        if let Ok(p) = libc::pid_t::try_from(*pid) {
            // SAFETY: kill(2); the pid was just seen with our marks.
            unsafe {
                libc::kill(p, libc::SIGKILL);
            }
        }
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while pids.iter().any(|p| alive(*p)) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    pids
}

/// Alive and not a zombie.
fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
        s.rsplit_once(')')
            .is_some_and(|(_, rest)| !rest.trim_start().starts_with('Z'))
    })
}

/// The cgroup dirs named `parent` in every mounted hierarchy.
fn cgroup_dirs(parent: &str) -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    let Ok(mounts) = std::fs::read_to_string("/proc/self/mounts") else {
        return dirs;
    };
    for line in mounts.lines() {
        let f: Vec<&str> = line.split(' ').collect();
        if f.len() > 2 && (f[2] == "cgroup" || f[2] == "cgroup2") {
            let d = Path::new(f[1]).join(parent);
            if d.exists() {
                dirs.push(d);
            }
        }
    }
    dirs
}

/// Removes the cgroup trees named `parent` (leaves first); returns what
/// could not be removed.
fn remove_cgroups(parent: &str) -> Vec<String> {
    fn rm_tree(d: &Path) -> std::io::Result<()> {
        for e in std::fs::read_dir(d)?.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                rm_tree(&e.path())?;
            }
        }
        std::fs::remove_dir(d)
    }
    cgroup_dirs(parent)
        .into_iter()
        .filter_map(|d| {
            rm_tree(&d)
                .err()
                .map(|e| format!("cgroup {}: {e}", d.display()))
        })
        .collect()
}

/// Whether the machine's mount table has anything under `dir`.
fn mounted_under(dir: &Path) -> bool {
    std::fs::read_to_string("/proc/1/mountinfo").is_ok_and(|m| {
        m.lines().any(|l| {
            l.split(' ')
                .nth(4)
                .is_some_and(|p| Path::new(p).starts_with(dir))
        })
    })
}

/// What an earlier run killed with SIGKILL left: its shims and pause
/// processes (they outlive containerd by design) and its cgroups. Their
/// names carry the dead run's pid.
fn sweep_leftovers() {
    let dead = |pid: &str| {
        pid.parse::<u32>()
            .is_ok_and(|p| p != std::process::id() && !Path::new(&format!("/proc/{p}")).exists())
    };
    // `lcnic-<kind>-<pid>-<n>` anywhere in a word.
    let stale_name = |s: &str| -> Option<String> {
        s.split(['/', ' ', '='])
            .filter_map(|w| w.strip_prefix(testkit::names::PREFIX).map(|rest| (w, rest)))
            .find(|(_, rest)| {
                let mut parts = rest.rsplitn(3, '-');
                let (_n, pid) = (parts.next(), parts.next());
                pid.is_some_and(dead)
            })
            .map(|(w, _)| w.to_string())
    };
    let mut parents = Vec::new();
    kill_matching(|pid| {
        let cmd = cmdline(pid);
        let from_dead_run = cmd.contains("containerd") && stale_name(&cmd).is_some();
        let cg = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
        from_dead_run || stale_name(&cg).is_some()
    });
    for d in [
        "/sys/fs/cgroup/pids",
        "/sys/fs/cgroup/unified",
        "/sys/fs/cgroup",
    ] {
        if let Ok(rd) = std::fs::read_dir(d) {
            for e in rd.flatten() {
                let n = e.file_name().to_string_lossy().into_owned();
                if n.starts_with(&format!("{}cri-", testkit::names::PREFIX))
                    && stale_name(&n).is_some()
                {
                    parents.push(n);
                }
            }
        }
    }
    for p in parents {
        remove_cgroups(&p);
    }
}

impl CriNode {
    /// Writes `conf` as `file_name` in the conf dir the way a CNI's
    /// installer does on a live node, so that containerd reloads: a temp
    /// file in the conf dir under a name no runtime reads (no config
    /// extension), then a rename within the dir (inotify's "moved from",
    /// which containerd acts on; a file moved in from elsewhere is a
    /// "create", which it ignores).
    pub fn replace_conf(&self, file_name: &str, conf: &serde_json::Value) -> PathBuf {
        let staged = self
            .conf_dir()
            .join(format!(".{file_name}.{}.tmp", testkit::names::unique_id()));
        crate::node::write_then_rename(conf, &staged, self.conf_dir().join(file_name))
    }
}
