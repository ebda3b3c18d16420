//! Whole-node scenarios for the demo and the benchmarks (`src/bin/`): the
//! release binaries, the installer as a long-lived child process, and the
//! operator's view of the chain.
//!
//! [`Binaries::find`] finds the workspace binaries where the conformance
//! harness looks for them (`demo.sh` builds them first), and
//! [`InstallerProcess`] runs the installer. Unlike the tests' installer
//! (killed at the end of a test), it is stopped with SIGTERM, as the
//! kubelet stops it, and its log is read as it grows: the demo shows both.

use std::fs::File;
use std::io::{BufRead, BufReader, Seek, SeekFrom};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use testkit::FakeApiServer;

use conformance::node::Node;
use conformance::sys::{self, child_path};
use conformance::{artifacts, installer};

/// The workspace binaries the scenarios run, built for the running profile.
#[derive(Debug, Clone)]
pub struct Binaries {
    pub plugin: PathBuf,
    pub installer: PathBuf,
}

impl Binaries {
    /// `linkerd-cni` and `linkerd-cni-installer` in the harness's bin dir
    /// ([`artifacts::bin_dir`]), or what to build when one is missing.
    pub fn find() -> Result<Binaries, String> {
        Ok(Binaries {
            plugin: artifacts::try_workspace_bin("linkerd-cni")?,
            installer: artifacts::try_workspace_bin("linkerd-cni-installer")?,
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

/// The linkerd2-cni chart's default `cni_network_config` for this node
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

/// `linkerd-cni-installer` running in a node, as the DaemonSet's container
/// would: the image's bin dir holds the plugin, the service-account dir the
/// API server's token and CA, the host's conf and bin dirs are the node's.
/// SIGTERMed on drop (and by the kernel if the process that started it
/// dies: `PR_SET_PDEATHSIG`).
pub struct InstallerProcess {
    child: Option<Child>,
    log: PathBuf,
    read: u64,
    pub started: Instant,
}

impl InstallerProcess {
    /// Starts it. `api`: the server the kubeconfig it writes points at (any
    /// address when the scenario makes no API call).
    pub fn start(
        node: &Node,
        bins: &Binaries,
        api: Option<&FakeApiServer>,
        opts: InstallerOptions,
    ) -> Result<InstallerProcess, String> {
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
                a.token().to_string(),
                a.ca_pem().to_string(),
            ),
            None => ("127.0.0.1".into(), 1, "unused".into(), String::new()),
        };
        std::fs::write(sa.join("token"), &token).map_err(|e| io("write", &sa, e))?;
        if !ca.is_empty() {
            std::fs::write(sa.join("ca.crt"), &ca).map_err(|e| io("write", &sa, e))?;
        }
        let log = node
            .dir()
            .join(format!("installer-{}.log", sys::unique_id()));
        let stderr = File::create(&log).map_err(|e| io("create", &log, e))?;
        let mut cmd = node.netns().command(&bins.installer);
        cmd.env_clear()
            .env("PATH", child_path())
            .env("CONTAINER_MOUNT_PREFIX", "/")
            .env("CONTAINER_CNI_BIN_DIR", &image)
            .env("DEST_CNI_NET_DIR", node.conf_dir())
            .env("DEST_CNI_BIN_DIR", node.bin_dir())
            .env("LINKERD_CNI_SERVICE_ACCOUNT_DIR", &sa)
            .env("KUBERNETES_SERVICE_HOST", host)
            .env("KUBERNETES_SERVICE_PORT", port.to_string())
            .env("CNI_NETWORK_CONFIG", chart_template(node))
            .env("LINKERD_CNI_WATCH", opts.watch.to_string())
            .env(
                "LINKERD_CNI_RESYNC_SECONDS",
                format!("{}", opts.resync.as_secs_f64()),
            )
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr);
        // SAFETY: prctl(PR_SET_PDEATHSIG) is async-signal-safe and touches
        // only the child being set up. `ip netns exec` execs the installer
        // in place, which keeps the setting.
        unsafe {
            cmd.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = cmd.spawn().map_err(|e| io("start", &bins.installer, e))?;
        Ok(InstallerProcess {
            child: Some(child),
            log,
            read: 0,
            started: Instant::now(),
        })
    }

    /// Log lines written since the last call.
    pub fn new_log_lines(&mut self) -> Vec<String> {
        let Ok(mut f) = File::open(&self.log) else {
            return Vec::new();
        };
        if f.seek(SeekFrom::Start(self.read)).is_err() {
            return Vec::new();
        }
        let mut lines = Vec::new();
        let mut r = BufReader::new(f);
        let mut line = String::new();
        // Only whole lines: a line being written is read next time.
        while r.read_line(&mut line).is_ok_and(|n| n > 0) && line.ends_with('\n') {
            self.read += line.len() as u64;
            lines.push(line.trim_end().to_string());
            line.clear();
        }
        lines
    }

    /// Whether it is still running.
    pub fn running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    /// SIGTERM (the installer then exits and leaves everything installed),
    /// SIGKILL if it has not exited within 5 s. Returns its exit code.
    pub fn stop(&mut self) -> Option<i32> {
        let mut child = self.child.take()?;
        if let Ok(pid) = libc::pid_t::try_from(child.id()) {
            // SAFETY: kill(2) on our own unreaped child.
            unsafe {
                libc::kill(pid, libc::SIGTERM);
            }
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            match child.try_wait() {
                Ok(Some(s)) => return s.code(),
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(10))
                }
                _ => {
                    let _ = child.kill();
                    return child.wait().ok().and_then(|s| s.code());
                }
            }
        }
    }
}

impl Drop for InstallerProcess {
    fn drop(&mut self) {
        self.stop();
    }
}
