//! The node agent (the repair controller's binary) as a child process,
//! answering a node's pod lookups from its watch of testkit's
//! [`testkit::WatchApiServer`]: the conformance tests, the demo and the
//! benchmark start it alike. [`answers_from_watch`] probes any agent's
//! socket, also the one an installer serves when it runs the agent too
//! ([`crate::installer::agent_vars`]).

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use linkerd_cni_lookup::{self as lookup, Body, Request, Source};
use testkit::{TempDir, WatchApiServer};

use crate::artifacts;

/// The agent; killed on drop, and by the kernel when the thread that
/// started it dies (a test's or a tool's panic never leaves it running).
pub struct AgentProcess {
    child: Child,
    log: PathBuf,
    socket: PathBuf,
    _dir: TempDir,
}

impl AgentProcess {
    /// Starts it as node `node_name`'s agent watching `api`, binding its
    /// socket in `state_dir` (created), with `conf_dir` as the node's conf
    /// dir. Only what this sets reaches it: no `KUBECONFIG` or
    /// `LINKERD_CNI_REPAIR_CONTROLLER_*` of the caller's.
    pub fn start(
        api: &WatchApiServer,
        node_name: &str,
        conf_dir: &Path,
        state_dir: &Path,
    ) -> Result<AgentProcess, String> {
        let bin = artifacts::try_workspace_bin("linkerd-cni-agent")?;
        let dir = TempDir::new("agent").map_err(|e| format!("cannot make a temp dir: {e}"))?;
        let kubeconfig = dir.path().join("kubeconfig");
        std::fs::write(&kubeconfig, api.kubeconfig_yaml())
            .map_err(|e| format!("cannot write {}: {e}", kubeconfig.display()))?;
        std::fs::create_dir_all(state_dir)
            .map_err(|e| format!("cannot create {}: {e}", state_dir.display()))?;
        let log = dir.path().join("agent.log");
        let log_file = std::fs::File::create(&log)
            .map_err(|e| format!("cannot create {}: {e}", log.display()))?;
        let mut cmd = Command::new(&bin);
        // The repair controller's command line, as the chart runs it.
        cmd.arg0("linkerd-cni-repair-controller");
        cmd.env_clear()
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .args(["--node-name", node_name, "--controller-pod-name", "agent"])
            .args(["--admin-addr", "127.0.0.1:0"])
            .args(["--log-level", "linkerd_cni_agent=info,warn"])
            .arg("--cni-net-dir")
            .arg(conf_dir)
            .arg("--state-dir")
            .arg(state_dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log_file);
        // SAFETY: prctl(PR_SET_PDEATHSIG) is async-signal-safe and touches
        // only the child being set up.
        unsafe {
            cmd.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = cmd
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", bin.display()))?;
        Ok(AgentProcess {
            child,
            log,
            socket: state_dir.join(lookup::SOCKET),
            _dir: dir,
        })
    }

    /// Waits until it answers for pod `namespace/name` from its watch.
    pub fn wait_answering(
        &self,
        namespace: &str,
        name: &str,
        within: Duration,
    ) -> Result<(), String> {
        if wait_answering(&self.socket, namespace, name, within) {
            return Ok(());
        }
        Err(format!(
            "the node agent never answered for {namespace}/{name} from its watch; its log:\n{}",
            self.log_text()
        ))
    }

    /// Its socket.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// How many lookups it answered with `result`, from its metrics.
    pub fn lookups(&self, result: &str) -> u64 {
        use std::io::{Read, Write};
        let addr = self.log_text().lines().find_map(|l| {
            let rest = l.split("admin server listening").nth(1)?;
            rest.split("addr=")
                .nth(1)?
                .split_whitespace()
                .next()
                .map(String::from)
        });
        let Some(Ok(mut s)) = addr.map(std::net::TcpStream::connect) else {
            return 0;
        };
        let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
        let _ = s.write_all(b"GET /metrics HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n");
        let mut out = String::new();
        let _ = s.read_to_string(&mut out);
        let name = format!("linkerd_cni_agent_pod_lookups_total{{result=\"{result}\"}}");
        out.lines()
            .find_map(|l| l.strip_prefix(&name)?.trim().parse().ok())
            .unwrap_or(0)
    }

    /// Its CPU time so far (user + system), from /proc.
    pub fn cpu(&self) -> Duration {
        let stat =
            std::fs::read_to_string(format!("/proc/{}/stat", self.child.id())).unwrap_or_default();
        let fields: Vec<&str> = stat
            .rsplit_once(')')
            .map_or(vec![], |(_, rest)| rest.split_whitespace().collect());
        // utime and stime: fields 14 and 15, 12 and 13 after the command.
        let ticks: u64 = [11, 12]
            .iter()
            .filter_map(|&i| fields.get(i)?.parse::<u64>().ok())
            .sum();
        Duration::from_millis(ticks * 10)
    }

    /// Its resident memory, from /proc.
    pub fn rss_kib(&self) -> u64 {
        std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))
            .unwrap_or_default()
            .lines()
            .find_map(|l| {
                l.strip_prefix("VmRSS:")?
                    .trim()
                    .strip_suffix("kB")?
                    .trim()
                    .parse()
                    .ok()
            })
            .unwrap_or(0)
    }
}

/// Whether a node agent answers on `socket` for pod `namespace/name` from
/// its watch now (within a second): whichever process it runs in, this
/// one's or an installer's.
pub fn answers_from_watch(socket: &Path, namespace: &str, name: &str) -> bool {
    let question = Request {
        v: lookup::VERSION,
        namespace: namespace.into(),
        name: name.into(),
        uid: None,
        budget_ms: 1000,
    };
    matches!(
        lookup::ask(socket, &question, Duration::from_secs(1)).map(|a| a.body),
        Ok(Body::Pod {
            source: Source::Watch,
            ..
        })
    )
}

/// Waits (at most `within`) until [`answers_from_watch`]; whether it did.
pub fn wait_answering(socket: &Path, namespace: &str, name: &str, within: Duration) -> bool {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        if answers_from_watch(socket, namespace, name) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

impl Drop for AgentProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
