//! Whole-node scenarios for the demo and the benchmarks (`src/bin/`): the
//! release binaries, the installer as a long-lived child process, and the
//! operator's view of the chain.
//!
//! [`Binaries::find`] finds the workspace binaries where the conformance
//! harness looks for them (`demo.sh` builds them first), and
//! [`start_installer`] runs the installer the way the benchmarks need it:
//! with the host's paths as its own (mount prefix `/`), stopped with SIGTERM
//! as the kubelet stops it, its log read as it grows. The demo builds its
//! command with [`installer_command`] under a view of the host of its own
//! ([`host_mount`]), where it puts the runtime's settings that `auto` reads.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use conformance::node::Node;
use conformance::sys;
use conformance::{artifacts, installer};
use serde_json::Value;
use testkit::installer::{ChartEnv, InstallerProcess};
use testkit::{FakeApiServer, child_path};

/// The workspace binaries the scenarios run, built for the running profile.
#[derive(Debug, Clone)]
pub struct Binaries {
    pub plugin: PathBuf,
    pub installer: PathBuf,
}

impl Binaries {
    /// `linkerd-cni` and `linkerd-cni-agent` in the harness's bin dir
    /// ([`artifacts::bin_dir`]), or what to build when one is missing.
    pub fn find() -> Result<Binaries, String> {
        Ok(Binaries {
            plugin: artifacts::try_workspace_bin("linkerd-cni")?,
            installer: artifacts::try_workspace_bin("linkerd-cni-agent")?,
        })
    }
}

/// `linkerd-cni chain status --conf-dir <conf dir>`, as an operator runs it
/// on the host: its exit code (0 healthy, 1 not, 2 error) and output.
pub fn chain_status(node: &Node, plugin: &Path) -> (i32, String) {
    let out = sys::output(
        Command::new(plugin)
            .args(["chain", "status", "--conf-dir"])
            .arg(node.conf_dir())
            .env_clear()
            .env("PATH", child_path()),
    );
    let mut text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.push_str(&String::from_utf8_lossy(&out.stderr));
    (out.status.code().unwrap_or(-1), text)
}

/// The manifest's `cni_network_config` for this node
/// ([`installer::template`]) at the chart's default `log_level`, info.
pub fn chart_template(node: &Node) -> String {
    let mut t: Value = serde_json::from_str(&installer::template(node)).unwrap_or(Value::Null);
    t["log_level"] = "info".into();
    serde_json::to_string_pretty(&t).unwrap_or_default()
}

/// How the installer runs.
#[derive(Debug, Clone, Copy)]
pub struct InstallerOptions {
    /// `LINKERD_CNI_WATCH`.
    pub watch: bool,
    /// `LINKERD_CNI_RESYNC_SECONDS`.
    pub resync: Duration,
}

/// Starts `linkerd-cni-installer` in a node, as the DaemonSet's container
/// would, through testkit's launcher: the image's bin dir holds the plugin,
/// the service-account dir the API server's token and CA, the host's conf
/// and bin dirs are the node's (mount prefix `/`). `api`: the server the
/// kubeconfig it writes points at (any address when the scenario makes no
/// API call). Killed on drop, and by the kernel if the thread that started
/// it dies (`PR_SET_PDEATHSIG`).
pub fn start_installer(
    node: &Node,
    bins: &Binaries,
    api: Option<&FakeApiServer>,
    opts: InstallerOptions,
) -> Result<InstallerProcess, String> {
    start_installer_as(node, bins, api, opts, None)
}

/// An installer pod as the API server knows it: its name (in namespace
/// `linkerd-cni`) and its own service-account token.
#[derive(Debug, Clone)]
pub struct InstallerPod {
    pub name: String,
    pub token: String,
}

/// [`start_installer`] as installer pod `pod`: its token instead of the
/// API server's, its name and namespace given (as the downward API gives
/// them), so that at SIGTERM it asks about its own DaemonSet.
pub fn start_installer_as(
    node: &Node,
    bins: &Binaries,
    api: Option<&FakeApiServer>,
    opts: InstallerOptions,
    pod: Option<&InstallerPod>,
) -> Result<InstallerProcess, String> {
    let mut cmd = installer_command(node, bins, api, pod, Path::new("/"))?;
    cmd.env("LINKERD_CNI_WATCH", opts.watch.to_string()).env(
        "LINKERD_CNI_RESYNC_SECONDS",
        format!("{}", opts.resync.as_secs_f64()),
    );
    Ok(spawn_installer(node, cmd))
}

/// A mount prefix for the installer's container under the node's dir, in
/// which the node's dir appears at its own path (a symlink standing in for
/// the `/host` bind mount, as the conformance harness makes it). The
/// installer then reads the runtime's settings (for `chain_mode: auto`)
/// from under this prefix, where the caller may put them, never from the
/// machine's own /etc.
pub fn host_mount(node: &Node) -> Result<PathBuf, String> {
    let prefix = node.dir().join("host");
    let mounted = prefix.join(node.dir().strip_prefix("/").unwrap_or(node.dir()));
    if let Some(parent) = mounted.parent() {
        std::fs::create_dir_all(parent)
            .map_err(|e| format!("cannot create {}: {e}", parent.display()))?;
    }
    if !mounted.exists() {
        std::os::unix::fs::symlink(node.dir(), &mounted)
            .map_err(|e| format!("cannot link {}: {e}", mounted.display()))?;
    }
    Ok(prefix)
}

/// The installer's command in a node (any subcommand may be added), as the
/// DaemonSet's container runs it, through testkit's launcher: the image's
/// bin dir holds the plugin, the service-account dir the API server's token
/// and CA (or `pod`'s token, with its name and namespace as the downward
/// API gives them), the host's conf and bin dirs are the node's, seen
/// under `mount_prefix`. `api`: the server the kubeconfig it writes points
/// at (any address when the scenario makes no API call).
pub fn installer_command(
    node: &Node,
    bins: &Binaries,
    api: Option<&FakeApiServer>,
    pod: Option<&InstallerPod>,
    mount_prefix: &Path,
) -> Result<Command, String> {
    let io =
        |what: &str, p: &Path, e: std::io::Error| format!("cannot {what} {}: {e}", p.display());
    let image = node.dir().join("image");
    let sa = node.dir().join("serviceaccount");
    for d in [&image, &sa] {
        if !d.exists() {
            std::fs::create_dir(d).map_err(|e| io("create", d, e))?;
        }
    }
    let link = image.join("linkerd-cni");
    if !link.exists() {
        std::os::unix::fs::symlink(&bins.plugin, &link).map_err(|e| io("link", &link, e))?;
    }
    let (host, port, token, ca) = match api {
        Some(a) => (
            a.addr().ip().to_string(),
            a.addr().port(),
            pod.map_or_else(|| a.token().to_string(), |p| p.token.clone()),
            a.ca_pem().to_string(),
        ),
        // The installer writes no kubeconfig, and so no entry, without a
        // CA it can read: a throwaway one, never dialled.
        None => (
            "127.0.0.1".into(),
            1,
            "unused".into(),
            testkit::pki::TestPki::new().ca_pem,
        ),
    };
    // The installer watches this dir: a file is replaced only when its
    // content changes, and whole (a running installer must never read a
    // half-written CA when a second command is set up beside it).
    replace(&sa.join("token"), &token).map_err(|e| io("write", &sa, e))?;
    replace(&sa.join("ca.crt"), &ca).map_err(|e| io("write", &sa, e))?;
    let env = ChartEnv {
        mount_prefix: mount_prefix.to_path_buf(),
        image_bin: image,
        service_account: sa,
        dest_conf_dir: node.conf_dir(),
        dest_bin_dir: node.bin_dir(),
        api_host: host,
        api_port: port,
        template: chart_template(node),
    };
    let mut cmd = node.netns().command(&bins.installer);
    cmd.env_clear().envs(env.vars());
    if let Some(p) = pod {
        cmd.env("LINKERD_CNI_POD_NAME", &p.name)
            .env("LINKERD_CNI_POD_NAMESPACE", "linkerd-cni");
    }
    Ok(cmd)
}

/// Writes `content` to `path` through a temp file and a rename, unless it
/// already holds it.
fn replace(path: &Path, content: &str) -> std::io::Result<()> {
    if std::fs::read_to_string(path).is_ok_and(|c| c == content) {
        return Ok(());
    }
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, content)?;
    std::fs::rename(&tmp, path)
}

/// Starts the installer's reconcile loop from [`installer_command`]'s
/// `cmd`, its log in the node's dir. Killed on drop, and by the kernel if
/// the thread that started it dies (`PR_SET_PDEATHSIG`).
pub fn spawn_installer(node: &Node, mut cmd: Command) -> InstallerProcess {
    // SAFETY: prctl(PR_SET_PDEATHSIG) is async-signal-safe and touches only
    // the child being set up. `ip netns exec` execs the installer in place,
    // which keeps the setting.
    unsafe {
        cmd.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let log = node
        .dir()
        .join(format!("installer-{}.log", testkit::names::unique_id()));
    InstallerProcess::spawn(cmd, log)
}
