//! The real `linkerd-cni-installer` running against a node, as the
//! DaemonSet container runs it against the host.
//!
//! The container's view is built from temp dirs: a mount prefix
//! (`CONTAINER_MOUNT_PREFIX`) under which the node's directory appears at
//! its host path (a symlink standing in for the `/host` bind mount), the
//! image's bin dir holding the freshly built `linkerd-cni`, and a
//! service-account dir holding the fake API server's token and CA. The host
//! view (`DEST_CNI_NET_DIR`, `DEST_CNI_BIN_DIR`) is the node's conf and bin
//! dirs, which is what the installer must write into the entry and what the
//! plugin, running in the host's file system, reads.
//!
//! The process runs in the node namespace and is killed on drop (also when
//! the test fails, when its log is printed).

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};

use serde_json::Value;
use testkit::FakeApiServer;

use crate::artifacts;
use crate::chains;
use crate::node::Node;
use crate::sys::{self, child_path};

/// The placeholder the chart's template holds for the kubeconfig's path.
pub const KUBECONFIG_PLACEHOLDER: &str = "__KUBECONFIG_FILEPATH__";

/// A running installer.
#[derive(Debug)]
pub struct Installer {
    child: Child,
    log: PathBuf,
}

impl Installer {
    /// Starts `linkerd-cni-installer` (its reconcile loop) for `node`,
    /// talking to `api`, with the chart's environment plus `extra` (e.g.
    /// `LINKERD_CNI_WATCH`, `LINKERD_CNI_RESYNC_SECONDS`). The entry
    /// template is [`template`]`(node)`.
    pub fn start(node: &Node, api: &FakeApiServer, extra: &[(&str, &str)]) -> Installer {
        Self::start_with_token(node, api, api.token(), extra)
    }

    /// [`Installer::start`], with `token` (e.g. [`FakeApiServer::issue_token`],
    /// one per installer pod, revocable) as its service-account token.
    pub fn start_with_token(
        node: &Node,
        api: &FakeApiServer,
        token: &str,
        extra: &[(&str, &str)],
    ) -> Installer {
        let root = node.scratch_dir().join(sys::unique_name("installer"));
        let prefix = root.join("host");
        let image_bin = root.join("image-bin");
        let sa_dir = root.join("serviceaccount");
        for d in [&prefix, &image_bin, &sa_dir] {
            mkdir_p(d);
        }
        // The host's view of the node dir, under the prefix: what a /host
        // bind mount gives the container.
        let mounted = prefix.join(node.dir().strip_prefix("/").unwrap_or(node.dir()));
        if let Some(parent) = mounted.parent() {
            mkdir_p(parent);
        }
        symlink(node.dir(), &mounted);
        // The image's binaries: the plugin, freshly built.
        symlink(&artifacts::linkerd_cni(), &image_bin.join("linkerd-cni"));
        for (name, content) in [
            ("token", token),
            ("ca.crt", api.ca_pem()),
            ("namespace", "linkerd-cni"),
        ] {
            let p = sa_dir.join(name);
            std::fs::write(&p, content)
                .unwrap_or_else(|e| panic!("cannot write {}: {e}", p.display()));
        }

        let addr = api.addr();
        let template = template(node);
        let log = root.join("installer.log");
        let mut cmd = node.netns().command(artifacts::workspace_bin(
            "linkerd-cni-installer",
            "linkerd-cni-installer",
        ));
        cmd.env_clear()
            .env("PATH", child_path())
            .env("CONTAINER_MOUNT_PREFIX", &prefix)
            .env("CONTAINER_CNI_BIN_DIR", &image_bin)
            .env("LINKERD_CNI_SERVICE_ACCOUNT_DIR", &sa_dir)
            .env("DEST_CNI_NET_DIR", node.conf_dir())
            .env("DEST_CNI_BIN_DIR", node.bin_dir())
            .env("KUBERNETES_SERVICE_HOST", addr.ip().to_string())
            .env("KUBERNETES_SERVICE_PORT", addr.port().to_string())
            .env("CNI_NETWORK_CONFIG", &template)
            .envs(extra.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(
                File::create(&log)
                    .unwrap_or_else(|e| panic!("cannot create {}: {e}", log.display())),
            );
        let child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start the installer: {e}"));
        Installer { child, log }
    }

    /// Its stderr so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Sends SIGTERM, as the kubelet does when the pod is deleted.
    pub fn terminate(&self) {
        // SAFETY: kill(2) on our own child, which is not reaped yet (this
        // owns it, and only `wait_exit` and drop reap it).
        let r = unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        assert_eq!(r, 0, "cannot signal the installer");
    }

    /// Waits at most `within` for it to exit.
    pub fn wait_exit(&mut self, within: std::time::Duration) -> Option<std::process::ExitStatus> {
        let deadline = std::time::Instant::now() + within;
        loop {
            if let Ok(Some(s)) = self.child.try_wait() {
                return Some(s);
            }
            if std::time::Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    }

    /// Whether it is still running (it must be: it exits only on a signal
    /// or a bad configuration).
    pub fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }
}

impl Drop for Installer {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
        if std::thread::panicking() {
            eprintln!(
                "--- installer log {} ---\n{}",
                self.log.display(),
                self.log()
            );
        }
    }
}

/// The chart's `cni_network_config` for this node: [`chains::linkerd_entry`]
/// with the kubeconfig path left as the chart's placeholder and without
/// `cni_conf_dir`, both of which the installer fills in.
pub fn template(node: &Node) -> String {
    let mut t = chains::linkerd_entry(node);
    t["kubernetes"]["kubeconfig"] = KUBECONFIG_PLACEHOLDER.into();
    if let Some(m) = t.as_object_mut() {
        m.remove("cni_conf_dir");
    }
    serde_json::to_string_pretty(&t).unwrap_or_default()
}

/// What the installer must render from [`template`] for this node: host
/// paths, not the container's.
pub fn expected_entry(node: &Node) -> Value {
    chains::linkerd_entry(node)
}

fn mkdir_p(d: &Path) {
    std::fs::create_dir_all(d).unwrap_or_else(|e| panic!("cannot create {}: {e}", d.display()));
}

fn symlink(target: &Path, link: &Path) {
    std::os::unix::fs::symlink(target, link).unwrap_or_else(|e| {
        panic!(
            "cannot link {} -> {}: {e}",
            link.display(),
            target.display()
        )
    });
}
