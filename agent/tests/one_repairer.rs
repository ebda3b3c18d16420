//! Exactly one process repairs a node's pods: under the linkerd2-cni
//! chart, its repair-controller container and not its install-cni
//! container (which runs the installer's command line with none of the
//! repair controller's variables); under deploy/, its one container (the
//! installer's command line, with them). Each against testkit's stateful
//! fake API server holding broken meshed pods (their
//! linkerd-network-validator terminated with 95).

mod common;
#[path = "repair_common/mod.rs"]
mod repair_common;

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::{Node, calico_text, wait_until};
use nix::sys::signal::Signal;
use repair_common::{DEADLINE, deleted_names, event_for, pod};
use serde_json::Value;
use testkit::TempDir;
use testkit::WatchApiServer;

/// How long a second repairer is given to show itself (its pod watch)
/// once the first has repaired and the installer has chained the node:
/// it starts with the installer, so it would be watching long before.
const SECOND_REPAIRER_WINDOW: Duration = Duration::from_secs(2);

/// The node as the kubelet names it under the host network: its host
/// name. A wrong design could fall back on it where the chart sets no node
/// name; with another name the test would not see that process repair.
fn node_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "node-a".into())
}

/// The repair controller's variables deploy/'s container sets, each with
/// the downward-API field it takes.
fn deploy_repair_env() -> Vec<(String, String)> {
    let docs: Vec<Value> =
        serde_saphyr::from_multiple(testkit::chart::MANIFEST).expect("deploy/ is valid YAML");
    let ds = docs
        .iter()
        .find(|d| d["kind"] == "DaemonSet")
        .expect("a DaemonSet");
    ds["spec"]["template"]["spec"]["containers"][0]["env"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| {
            let name = e["name"].as_str()?;
            name.starts_with("LINKERD_CNI_REPAIR_CONTROLLER_").then(|| {
                let field = e["valueFrom"]["fieldRef"]["fieldPath"].as_str();
                (name.to_string(), field.unwrap_or_default().to_string())
            })
        })
        .collect()
}

/// A meshed pod of `node`, made by a ReplicaSet, whose validator exited 95.
fn broken(name: &str, node: &str) -> Value {
    pod("shop", name, node, Some(95))
}

fn delete_requests(api: &WatchApiServer) -> Vec<String> {
    api.requests()
        .into_iter()
        .filter(|r| r.method == "DELETE")
        .map(|r| r.path)
        .collect()
}

/// Where a process's repair controller said its admin server listens.
fn admin_addr(log: &str) -> Option<SocketAddr> {
    log.lines().find_map(|l| {
        let rest = l.split("admin server listening").nth(1)?;
        rest.split("addr=")
            .nth(1)?
            .split_whitespace()
            .next()?
            .parse()
            .ok()
    })
}

/// The chart's repair-controller container: its command (the agent under
/// the controller's name), its arguments and its environment. One
/// deviation: the admin server on a free loopback port, not
/// `0.0.0.0:9990`, so that tests running at once do not collide.
struct ChartRepairController {
    child: Child,
    dir: TempDir,
}

impl ChartRepairController {
    fn start(node: &str, kubeconfig: &Path) -> ChartRepairController {
        let dir = TempDir::new("chart-repair").unwrap();
        let log = std::fs::File::create(dir.path().join("stderr.log")).unwrap();
        let child = repair_common::repair_controller()
            .args(["--admin-addr", "127.0.0.1:0"])
            .args(["--log-format", "plain", "--log-level", "info"])
            .env_clear()
            .env("LINKERD_CNI_REPAIR_CONTROLLER_NODE_NAME", node)
            .env(
                "LINKERD_CNI_REPAIR_CONTROLLER_POD_NAME",
                "linkerd-cni-chart",
            )
            .env("KUBECONFIG", kubeconfig)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start the chart's repair controller");
        ChartRepairController { child, dir }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("stderr.log")).unwrap_or_default()
    }
}

impl Drop for ChartRepairController {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            eprintln!("--- the chart's repair controller ---\n{}", self.log());
        }
    }
}

/// The kubeconfig every process of a test reaches the fake API server by,
/// standing in for the pod's service account (in-cluster configuration
/// reads a fixed path these tests cannot write).
fn kubeconfig(api: &WatchApiServer, dir: &Path) -> std::path::PathBuf {
    let path = dir.join("kubeconfig");
    std::fs::write(&path, api.kubeconfig_yaml()).unwrap();
    path
}

fn wait(what: &str, logs: &dyn Fn() -> String, f: impl FnMut() -> bool) {
    assert!(
        wait_until(DEADLINE, f),
        "timed out waiting for {what}:\n{}",
        logs()
    );
}

#[test]
fn under_the_chart_only_its_repair_controller_container_repairs() {
    let api = WatchApiServer::start();
    let n = node_name();
    api.put_pod(broken("web-1", &n));
    let node = Node::new("chart-one-repairer");
    node.write_by_rename("10-calico.conflist", &calico_text(1));
    let kc = kubeconfig(&api, &node.root);

    // install-cni: the chart's environment (none of the repair
    // controller's variables), the image's entrypoint.
    let mut installer = node.start(&[("KUBECONFIG", kc.to_str().unwrap())]);
    let controller = ChartRepairController::start(&n, &kc);
    let logs = || {
        format!(
            "--- install-cni ---\n{}\n--- repair-controller ---\n{}",
            installer.log(),
            controller.log()
        )
    };

    wait("the deletion of web-1", &logs, || {
        deleted_names(&api) == ["shop/web-1"]
    });
    node.wait_healthy(DEADLINE)
        .unwrap_or_else(|e| panic!("{e}\n{}", logs()));
    assert!(
        !wait_until(SECOND_REPAIRER_WINDOW, || api.open_watches() > 1),
        "a second pod watch: install-cni repairs too\n{}",
        logs()
    );
    // One more, through the watch, with both processes long settled.
    api.put_pod(broken("web-2", &n));
    wait("the event of web-2", &logs, || {
        event_for(&api.events(), "shop", "web-2").is_some()
    });

    assert_eq!(deleted_names(&api), ["shop/web-1", "shop/web-2"]);
    assert_eq!(
        delete_requests(&api),
        [
            "/api/v1/namespaces/shop/pods/web-1",
            "/api/v1/namespaces/shop/pods/web-2"
        ],
        "one DELETE per broken pod\n{}",
        logs()
    );
    assert_eq!(api.events().len(), 2, "{:#?}", api.events());
    assert_eq!(api.open_watches(), 1, "{}", logs());
    let inst_log = installer.log();
    assert!(
        admin_addr(&inst_log).is_none() && !inst_log.contains("meshed pods"),
        "install-cni runs a repair controller:\n{inst_log}"
    );
    assert!(installer.running());
}

#[test]
fn deploys_one_container_repairs_and_answers_lookups() {
    let api = WatchApiServer::start();
    let n = node_name();
    api.put_pod(broken("web-1", &n));
    let node = Node::new("deploy-one-repairer");
    node.write_by_rename("10-calico.conflist", &calico_text(1));
    let kc = kubeconfig(&api, &node.root);
    let state = node.prefix.join("run/linkerd-cni");
    std::fs::create_dir_all(&state).unwrap();
    let conf = node.conf_dir.display().to_string();
    let state_s = state.display().to_string();

    // deploy/'s container: the chart's environment plus deploy/'s repair
    // controller variables, their downward-API values this node's. The
    // conf and state dirs where this node has them (deploy/ mounts them
    // where the controller looks by default).
    let mut env: Vec<(String, String)> = deploy_repair_env()
        .into_iter()
        .map(|(k, field)| {
            let v = match field.as_str() {
                "spec.nodeName" => n.clone(),
                "metadata.name" => "linkerd-cni-deploy".into(),
                "status.hostIP" => "127.0.0.1".into(),
                other => panic!("{k}: unexpected field {other}"),
            };
            (k, v)
        })
        .collect();
    assert!(
        env.iter()
            .any(|(k, _)| k == linkerd_cni_agent::repair::cli::SWITCH),
        "deploy/ does not set {}: {env:?}",
        linkerd_cni_agent::repair::cli::SWITCH
    );
    for (k, v) in [
        ("KUBECONFIG", kc.to_str().unwrap()),
        ("LINKERD_CNI_REPAIR_CONTROLLER_CNI_NET_DIR", &conf),
        ("LINKERD_CNI_REPAIR_CONTROLLER_STATE_DIR", &state_s),
        (
            "LINKERD_CNI_REPAIR_CONTROLLER_CHAIN_CHECK_INTERVAL",
            "100ms",
        ),
    ] {
        env.push((k.into(), v.into()));
    }
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let mut installer = node.start(&env);
    let logs = || installer.log();

    wait("the event of web-1", &logs, || {
        event_for(&api.events(), "shop", "web-1").is_some()
    });
    api.put_pod(broken("web-2", &n));
    wait("the event of web-2", &logs, || {
        event_for(&api.events(), "shop", "web-2").is_some()
    });
    assert_eq!(deleted_names(&api), ["shop/web-1", "shop/web-2"]);
    assert_eq!(delete_requests(&api).len(), 2, "{}", logs());
    node.wait_healthy(DEADLINE)
        .unwrap_or_else(|e| panic!("{e}\n{}", logs()));

    // No port; the probes' answers on the admin socket.
    assert_eq!(admin_addr(&installer.log()), None, "{}", installer.log());
    let live = node.run(&["check", "--live"], &env);
    let said = String::from_utf8_lossy(&live.stdout);
    assert!(live.status.success(), "{said}\n{}", installer.log());
    assert!(said.starts_with("live: live (from "), "{said}");
    let ready = {
        use std::io::{Read, Write};
        let mut s = std::os::unix::net::UnixStream::connect(state.join("admin.sock")).unwrap();
        s.write_all(b"GET /ready HTTP/1.1\r\n\r\n").unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        out
    };
    assert!(ready.starts_with("HTTP/1.1 200"), "{ready}");
    let socket = state.join("agent.sock");
    wait("the lookup socket", &logs, || socket.exists());

    // SIGTERM: the controller beside the installer stops (its socket
    // removed) and the installer exits as always.
    installer.signal(Signal::SIGTERM);
    let status = installer.wait_exit(Duration::from_secs(15));
    assert!(
        status.is_some_and(|s| s.success()),
        "{status:?}\n{}",
        installer.log()
    );
    assert!(!socket.exists(), "{}", installer.log());
}

/// A repair variable set without the others the controller needs stops
/// the installer with a configuration error that says what is missing.
#[test]
fn the_switch_without_the_pod_name_is_a_configuration_error() {
    let node = Node::new("switch-incomplete");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_linkerd-cni-agent"));
    cmd.env_clear()
        .envs(node.env())
        .env("LINKERD_CNI_REPAIR_CONTROLLER_NODE_NAME", "n")
        .stdin(Stdio::null());
    let out = testkit::output_within(&mut cmd, DEADLINE).expect("exits at once");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("LINKERD_CNI_REPAIR_CONTROLLER_NODE_NAME is set")
            && err.contains("controller-pod-name"),
        "{err}"
    );
}

/// `GET path` at `addr`: the whole answer.
fn get(addr: SocketAddr, path: &str) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(DEADLINE)).unwrap();
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: admin\r\n\r\n").as_bytes())
        .unwrap();
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out
}

/// Every address the process said it serves `/metrics` on.
fn admin_addrs(log: &str) -> Vec<SocketAddr> {
    let served = log.lines().filter_map(|l| {
        let rest = l.split("serving /metrics on http://").nth(1)?;
        rest.split("/metrics").next()?.parse().ok()
    });
    let mut addrs: Vec<SocketAddr> = vec![];
    for a in served.chain(log.lines().filter_map(admin_addr)) {
        if !addrs.contains(&a) {
            addrs.push(a);
        }
    }
    addrs
}

/// The installer with the repair controller beside it: `extra` on top of
/// the controller's variables, with this node's dirs.
fn beside(node: &Node, kubeconfig: &Path, extra: &[(&str, &str)]) -> common::Installer {
    let state = node.prefix.join("run/linkerd-cni");
    std::fs::create_dir_all(&state).unwrap();
    let (conf, state) = (
        node.conf_dir.display().to_string(),
        state.display().to_string(),
    );
    let n = node_name();
    let mut env = vec![
        ("KUBECONFIG", kubeconfig.to_str().unwrap()),
        (linkerd_cni_agent::repair::cli::SWITCH, n.as_str()),
        (
            "LINKERD_CNI_REPAIR_CONTROLLER_POD_NAME",
            "linkerd-cni-deploy",
        ),
        ("LINKERD_CNI_REPAIR_CONTROLLER_CNI_NET_DIR", &conf),
        ("LINKERD_CNI_REPAIR_CONTROLLER_STATE_DIR", &state),
    ];
    env.extend_from_slice(extra);
    node.start(&env)
}

/// One admin server and one registry per process: the installer's and
/// the repair controller's families on one page, served on the metrics
/// address and on the controller's admin address (a listener each), and
/// on one listener when the two are the same.
#[test]
fn beside_the_installer_one_admin_server_serves_one_registry() {
    let api = WatchApiServer::start();
    let node = Node::new("one-admin");
    node.write_by_rename("10-calico.conflist", &calico_text(1));
    let kc = kubeconfig(&api, &node.root);
    let both_families = |addr: SocketAddr, log: &dyn Fn() -> String| {
        let page = get(addr, "/metrics");
        for family in [
            "# TYPE linkerd_cni_passes_total counter",
            "# TYPE linkerd_cni_repair_controller_pods_deleted_total counter",
            "# TYPE process_start_time_seconds gauge",
        ] {
            assert!(
                page.contains(family),
                "{family} at {addr}:\n{page}\n{}",
                log()
            );
        }
        wait("/ready", log, || {
            get(addr, "/ready").starts_with("HTTP/1.1 200")
        });
        assert!(get(addr, "/live").starts_with("HTTP/1.1 200"));
    };

    let any = "127.0.0.1:0";
    let two = beside(
        &node,
        &kc,
        &[
            ("LINKERD_CNI_METRICS_ADDR", any),
            ("LINKERD_CNI_REPAIR_CONTROLLER_ADMIN_ADDR", "127.0.0.2:0"),
        ],
    );
    let logs = || two.log();
    wait("two listeners", &logs, || {
        admin_addrs(&two.log()).len() == 2
    });
    for addr in admin_addrs(&two.log()) {
        both_families(addr, &logs);
    }
    drop(two);

    let port = std::net::TcpListener::bind(any)
        .unwrap()
        .local_addr()
        .unwrap();
    let same = port.to_string();
    let one = beside(
        &node,
        &kc,
        &[
            ("LINKERD_CNI_METRICS_ADDR", &same),
            ("LINKERD_CNI_REPAIR_CONTROLLER_ADMIN_ADDR", &same),
        ],
    );
    let logs = || one.log();
    wait("the listener", &logs, || {
        !admin_addrs(&one.log()).is_empty()
    });
    both_families(port, &logs);
    assert_eq!(admin_addrs(&one.log()), [port], "{}", one.log());
    assert!(!one.log().contains("cannot"), "{}", one.log());
}

/// A repair controller beside the installer that cannot start fails the
/// process's liveness, so that the kubelet restarts the container; the
/// installer keeps the chain meanwhile.
#[test]
fn a_repair_controller_that_cannot_start_fails_liveness() {
    let node = Node::new("live-no-controller");
    node.write_by_rename("10-calico.conflist", &calico_text(1));
    let missing = node.root.join("no-kubeconfig");
    let inst = beside(&node, &missing, &[]);
    let logs = || inst.log();
    let socket = node.prefix.join("run/linkerd-cni/admin.sock");
    wait(
        "the controller's failure and the admin socket",
        &logs,
        || inst.log().contains("the repair controller stopped") && socket.exists(),
    );
    let out = node.run(&["check", "--live"], &[]);
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success(), "{said}");
    assert!(
        said.contains("503 Service Unavailable: the repair controller stopped"),
        "{said}"
    );
    node.wait_healthy(DEADLINE)
        .unwrap_or_else(|e| panic!("{e}\n{}", inst.log()));
}
