//! The real `linkerd-cni-installer` as a child process, the way the
//! DaemonSet's container runs it: the chart's environment ([`ChartEnv`]),
//! stdin and stdout closed, stderr to a log file that tests read as it
//! grows ([`InstallerProcess`]). Killed on drop, and its log printed when
//! the test is failing.

use std::fs::File;
use std::io::{BufRead, BufReader, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

/// The environment the linkerd2-cni chart gives the installer's container:
/// the container's view (mount prefix, image bin dir, service account) and
/// the host's (conf and bin dirs, as the entry must name them).
#[derive(Debug, Clone)]
pub struct ChartEnv {
    /// `CONTAINER_MOUNT_PREFIX`: where the host's paths are mounted.
    pub mount_prefix: PathBuf,
    /// `CONTAINER_CNI_BIN_DIR`: the image's binaries.
    pub image_bin: PathBuf,
    /// `LINKERD_CNI_SERVICE_ACCOUNT_DIR`: token and CA.
    pub service_account: PathBuf,
    /// `DEST_CNI_NET_DIR`: the host's conf dir.
    pub dest_conf_dir: PathBuf,
    /// `DEST_CNI_BIN_DIR`: the host's bin dir.
    pub dest_bin_dir: PathBuf,
    /// `KUBERNETES_SERVICE_HOST` and `_PORT`.
    pub api_host: String,
    pub api_port: u16,
    /// `CNI_NETWORK_CONFIG`: by default the manifest's
    /// ([`crate::chart::template`]).
    pub template: String,
}

impl ChartEnv {
    /// The variables, PATH included: all the installer gets.
    pub fn vars(&self) -> Vec<(String, String)> {
        let path = |p: &Path| p.display().to_string();
        vec![
            ("CONTAINER_MOUNT_PREFIX".into(), path(&self.mount_prefix)),
            ("CONTAINER_CNI_BIN_DIR".into(), path(&self.image_bin)),
            (
                "LINKERD_CNI_SERVICE_ACCOUNT_DIR".into(),
                path(&self.service_account),
            ),
            ("DEST_CNI_NET_DIR".into(), path(&self.dest_conf_dir)),
            ("DEST_CNI_BIN_DIR".into(), path(&self.dest_bin_dir)),
            ("KUBERNETES_SERVICE_HOST".into(), self.api_host.clone()),
            ("KUBERNETES_SERVICE_PORT".into(), self.api_port.to_string()),
            ("CNI_NETWORK_CONFIG".into(), self.template.clone()),
            ("PATH".into(), crate::child_path()),
        ]
    }
}

/// A running installer.
#[derive(Debug)]
pub struct InstallerProcess {
    child: Child,
    log: PathBuf,
    read: u64,
    /// When it was started.
    pub started: Instant,
}

impl InstallerProcess {
    /// Starts `cmd` (the installer, or `ip netns exec <ns> <installer>`,
    /// which execs it in place) with stdin and stdout closed and stderr
    /// written to `log`.
    pub fn spawn(mut cmd: Command, log: PathBuf) -> InstallerProcess {
        let stderr =
            File::create(&log).unwrap_or_else(|e| panic!("cannot create {}: {e}", log.display()));
        let child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start the installer {cmd:?}: {e}"));
        InstallerProcess {
            child,
            log,
            read: 0,
            started: Instant::now(),
        }
    }

    pub fn id(&self) -> u32 {
        self.child.id()
    }

    /// Its stderr so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Whole log lines written since the last call.
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

    /// Waits until its log holds `needle` (it has reached a point).
    pub fn wait_log(&self, needle: &str, within: Duration) -> bool {
        crate::wait_until(within, || self.log().contains(needle))
    }

    /// Whether it is still running (it exits only on a signal or a bad
    /// configuration).
    pub fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Sends it `sig`.
    pub fn signal(&self, sig: Signal) {
        let pid = Pid::from_raw(i32::try_from(self.child.id()).expect("pid fits in i32"));
        kill(pid, sig).unwrap_or_else(|e| panic!("kill {pid} {sig}: {e}"));
    }

    /// Waits for it to end, at most `within`.
    pub fn wait_exit(&mut self, within: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + within;
        loop {
            if let Ok(Some(s)) = self.child.try_wait() {
                return Some(s);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// SIGTERM, as the kubelet stops it (it then exits and leaves
    /// everything installed, or uninstalls, which keeps the plugin binary
    /// 5 s after the unchain), SIGKILL if it has not exited within 15 s
    /// (the chart's preStop). Its exit code.
    pub fn stop(&mut self) -> Option<i32> {
        if self.running() {
            let _ = kill(
                Pid::from_raw(i32::try_from(self.child.id()).ok()?),
                Signal::SIGTERM,
            );
        }
        match self.wait_exit(Duration::from_secs(15)) {
            Some(s) => s.code(),
            None => {
                let _ = self.child.kill();
                self.child.wait().ok().and_then(|s| s.code())
            }
        }
    }
}

impl Drop for InstallerProcess {
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
