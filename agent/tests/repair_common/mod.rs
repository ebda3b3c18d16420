//! The repair controller's test harness: its binary as a child process
//! against testkit's stateful fake API server, and a node's conf dir.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::Value;
use testkit::WatchApiServer;
use testkit::objects::{Pod, on_node, owned_by, with_init_status};
use testkit::{TempDir, wait_until};

pub const NODE: &str = "node-a";
pub const VALIDATOR: &str = "linkerd-network-validator";
pub const DEADLINE: Duration = Duration::from_secs(30);

pub const ENTRY: &str = r#"{"name":"linkerd-cni","type":"linkerd-cni","kubernetes":{"kubeconfig":"/etc/cni/net.d/ZZZ-linkerd-cni-kubeconfig"}}"#;

/// A meshed pod of `node` whose validator last exited with `exit`, made
/// by a ReplicaSet (which creates it again once deleted).
pub fn pod(ns: &str, name: &str, node: &str, exit: Option<i32>) -> Value {
    owned_by(bare(ns, name, node, exit), "ReplicaSet", "web-5d8f", true)
}

/// The same without any owner: nothing creates it again.
pub fn bare(ns: &str, name: &str, node: &str, exit: Option<i32>) -> Value {
    let p = Pod::meshed(ns, name).label("linkerd.io/control-plane-ns", "linkerd");
    with_init_status(on_node(p.json(), node), VALIDATOR, exit)
}

pub fn broken(ns: &str, name: &str) -> Value {
    pod(ns, name, NODE, Some(95))
}

/// A node's conf dir: the installer's entry file and a primary conflist,
/// chained or not.
pub struct ConfDir {
    dir: TempDir,
}

impl ConfDir {
    pub fn new(chained: bool) -> ConfDir {
        let dir = TempDir::new("repair-confdir").unwrap();
        std::fs::write(dir.path().join("ZZZ-linkerd-cni-entry"), ENTRY).unwrap();
        let c = ConfDir { dir };
        c.set_chained(chained);
        c
    }

    pub fn set_chained(&self, chained: bool) {
        let mut plugins = vec![r#"{"type":"ptp","ipam":{"type":"host-local"}}"#];
        if chained {
            plugins.push(ENTRY);
        }
        let text = format!(
            r#"{{"cniVersion":"0.3.1","name":"k8s","plugins":[{}]}}"#,
            plugins.join(",")
        );
        // Atomically, as CNI plugins write their configs.
        let tmp = self.dir.path().join(".tmp-10-ptp");
        std::fs::write(&tmp, text).unwrap();
        std::fs::rename(tmp, self.dir.path().join("10-ptp.conflist")).unwrap();
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }
}

/// The controller process; killed on drop.
pub struct Controller {
    pub child: Child,
    log: PathBuf,
    pub admin: SocketAddr,
    _dir: TempDir,
}

impl Controller {
    pub fn start(api: &WatchApiServer, conf_dir: &Path, extra: &[&str]) -> Controller {
        let dir = TempDir::new("repair-ctl").unwrap();
        let kubeconfig = dir.path().join("kubeconfig");
        std::fs::write(&kubeconfig, api.kubeconfig_yaml()).unwrap();
        let log = dir.path().join("stderr.log");
        let mut cmd = repair_controller();
        // Hermetic: only what the test sets.
        for (k, _) in std::env::vars_os() {
            if k.to_string_lossy()
                .starts_with("LINKERD_CNI_REPAIR_CONTROLLER_")
                || k == "KUBECONFIG"
            {
                cmd.env_remove(k);
            }
        }
        // Node and pod names from the environment, as the chart sets them.
        cmd.env("LINKERD_CNI_REPAIR_CONTROLLER_NODE_NAME", NODE)
            .env("LINKERD_CNI_REPAIR_CONTROLLER_POD_NAME", "linkerd-cni-test")
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .args(["--admin-addr", "127.0.0.1:0", "--log-format", "plain"])
            .args(["--log-level", "linkerd_cni_agent=debug,warn"])
            .arg("--cni-net-dir")
            .arg(conf_dir)
            .args(["--chain-check-interval", "100ms"])
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap());
        let child = cmd.spawn().expect("start linkerd-cni-repair-controller");
        let mut c = Controller {
            child,
            log,
            admin: "0.0.0.0:0".parse().unwrap(),
            _dir: dir,
        };
        let mut admin = None;
        let found = wait_until(DEADLINE, || {
            admin = c.log_text().lines().find_map(|l| {
                let rest = l.split("admin server listening").nth(1)?;
                let addr = rest.split("addr=").nth(1)?;
                addr.split_whitespace().next()?.parse().ok()
            });
            admin.is_some()
        });
        assert!(found, "no admin address logged:\n{}", c.log_text());
        c.admin = admin.unwrap();
        c
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// (status, body) of a GET on the admin server.
    pub fn get(&self, path: &str) -> (u16, String) {
        let Ok(mut s) = TcpStream::connect(self.admin) else {
            return (0, String::new());
        };
        let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
        let req = format!("GET {path} HTTP/1.1\r\nHost: admin\r\nConnection: close\r\n\r\n");
        if s.write_all(req.as_bytes()).is_err() {
            return (0, String::new());
        }
        let mut out = String::new();
        let _ = s.read_to_string(&mut out);
        let status = out
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .unwrap_or(0);
        let body = out.split_once("\r\n\r\n").map(|(_, b)| b).unwrap_or("");
        (status, body.to_string())
    }

    /// A metric's value (the first sample whose name matches exactly).
    pub fn metric(&self, name: &str) -> Option<f64> {
        let (_, body) = self.get("/metrics");
        body.lines().find_map(|l| {
            let (n, v) = l.split_once(' ')?;
            (n == name).then(|| v.trim().parse().ok())?
        })
    }

    pub fn wait_ready(&self) {
        let ok = wait_until(DEADLINE, || self.get("/ready").0 == 200);
        assert!(ok, "never ready:\n{}", self.log_text());
    }

    /// Ready, and its watch stream open.
    pub fn wait_watching(&self, api: &WatchApiServer) {
        self.wait_ready();
        self.wait("an open watch", || api.open_watches() == 1);
    }

    pub fn wait(&self, what: &str, f: impl FnMut() -> bool) {
        assert!(
            wait_until(DEADLINE, f),
            "timed out waiting for {what}; controller log:\n{}",
            self.log_text()
        );
    }
}

impl Drop for Controller {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn deleted_names(api: &WatchApiServer) -> Vec<String> {
    api.deletions()
        .into_iter()
        .map(|d| format!("{}/{}", d.namespace, d.name))
        .collect()
}

pub fn event_for<'a>(events: &'a [Value], ns: &str, name: &str) -> Option<&'a Value> {
    events.iter().find(|e| {
        e.pointer("/regarding/name").and_then(Value::as_str) == Some(name)
            && e.pointer("/regarding/namespace").and_then(Value::as_str) == Some(ns)
    })
}

/// The agent, run under the name the chart's repair-controller container
/// runs it by, so that it takes that controller's command line.
pub fn repair_controller() -> Command {
    use std::os::unix::process::CommandExt;
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_linkerd-cni-agent"));
    cmd.arg0(linkerd_cni_agent::REPAIR_CONTROLLER);
    cmd
}
