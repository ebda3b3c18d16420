//! The node agent answering the plugin's pod lookups, through libcni: a
//! burst of pods started while the agent runs makes no request with the
//! plugin's own credentials, and every meshed pod gets its rules.
//!
//! Two fake API servers, so that each caller's requests are counted apart:
//! the agent's (the stateful one, watched) on the host's loopback, and the
//! plugin's direct path (the one its kubeconfig names) inside the node.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use conformance::chains::{self, Primary};
use conformance::kube::APP_NAMESPACE;
use conformance::{Backend, Family, Node, PodSpec, artifacts};
use linkerd_cni_lookup::{self as lookup, Body, Request};
use testkit::api_watch::WatchApiServer;
use testkit::objects::{Pod as ApiPod, namespace, on_node};
use testkit::{TempDir, wait_until};

const DEADLINE: Duration = Duration::from_secs(60);
const PODS: usize = 50;

/// The agent (the repair controller's binary) for `node`; killed on drop.
struct Agent {
    child: Child,
    log: PathBuf,
    _dir: TempDir,
}

impl Agent {
    fn start(api: &WatchApiServer, node: &Node, node_name: &str) -> Agent {
        let dir = TempDir::new("conf-agent").unwrap();
        let kubeconfig = dir.path().join("kubeconfig");
        std::fs::write(&kubeconfig, api.kubeconfig_yaml()).unwrap();
        let log = dir.path().join("agent.log");
        std::fs::create_dir_all(node.state_dir()).unwrap();
        let mut cmd = Command::new(artifacts::workspace_bin("linkerd-cni-repair-controller"));
        for (k, _) in std::env::vars_os() {
            if k.to_string_lossy()
                .starts_with("LINKERD_CNI_REPAIR_CONTROLLER_")
            {
                cmd.env_remove(k);
            }
        }
        cmd.arg("--kubeconfig")
            .arg(&kubeconfig)
            .args(["--node-name", node_name, "--controller-pod-name", "agent"])
            .args(["--admin-addr", "127.0.0.1:0"])
            .args(["--log-level", "linkerd_cni_repair_controller=debug,warn"])
            .arg("--cni-net-dir")
            .arg(node.conf_dir())
            .arg("--state-dir")
            .arg(node.state_dir())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap());
        Agent {
            child: cmd.spawn().expect("start the agent"),
            log,
            _dir: dir,
        }
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// How many lookups it answered with `result`, from its metrics.
    fn lookups(&self, result: &str) -> u64 {
        let addr = self.log_text().lines().find_map(|l| {
            let rest = l.split("admin server listening").nth(1)?;
            rest.split("addr=")
                .nth(1)?
                .split_whitespace()
                .next()
                .map(String::from)
        });
        let Some(addr) = addr else { return 0 };
        let Ok(mut s) = std::net::TcpStream::connect(addr) else {
            return 0;
        };
        use std::io::{Read, Write};
        let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
        let _ = s.write_all(b"GET /metrics HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n");
        let mut out = String::new();
        let _ = s.read_to_string(&mut out);
        let name = format!("linkerd_cni_agent_pod_lookups_total{{result=\"{result}\"}}");
        out.lines()
            .find_map(|l| l.strip_prefix(&name)?.trim().parse().ok())
            .unwrap_or(0)
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn a_burst_of_pods_makes_no_request_with_the_plugins_token() {
    let node = Node::new();
    let plugin_api = node.start_api_server();
    let cluster = WatchApiServer::start();
    let node_name = format!("node-{}", node.id());
    cluster.put_object("namespaces", namespace(APP_NAMESPACE, &[]));
    let agent = Agent::start(&cluster, &node, &node_name);

    let net = node.network_name("agent");
    let mut entry = chains::linkerd_entry(&node);
    entry["linkerd"]["iptables-mode"] = Backend::Nft.mode().into();
    node.write_conf(
        &format!("10-{net}.conflist"),
        &chains::conflist(
            &net,
            "1.0.0",
            chains::typical_chain(&node, Primary::Bridge, Some(entry)),
        ),
    );

    // The agent is up once it answers from its watch.
    let socket = node.state_dir().join(lookup::SOCKET);
    cluster.put_pod(on_node(
        ApiPod::new(APP_NAMESPACE, "probe").json(),
        &node_name,
    ));
    let up = wait_until(DEADLINE, || {
        let q = Request {
            v: lookup::VERSION,
            namespace: APP_NAMESPACE.into(),
            name: "probe".into(),
            uid: None,
            budget_ms: 1000,
        };
        matches!(
            lookup::ask(&socket, &q, Duration::from_secs(1)).map(|a| a.body),
            Ok(Body::Pod { .. })
        )
    });
    assert!(up, "the agent never answered:\n{}", agent.log_text());
    let before = ["watch", "waited", "fetched"].map(|r| agent.lookups(r));

    // Each pod is created (the scheduler's binding, which the agent's
    // watch sees) right before the runtime's ADD, all at once.
    let pods: Vec<(conformance::Pod, ApiPod, bool)> = (0..PODS)
        .map(|i| {
            let meshed = i % 2 == 0;
            let name = format!("burst-{i}");
            let api_pod = if meshed {
                ApiPod::meshed(APP_NAMESPACE, &name)
            } else {
                ApiPod::new(APP_NAMESPACE, &name)
            };
            let pod = node.pod(PodSpec::kubernetes(APP_NAMESPACE, &name));
            (pod, api_pod, meshed)
        })
        .collect();
    let failures: Vec<String> = std::thread::scope(|s| {
        let handles: Vec<_> = pods
            .iter()
            .map(|(pod, api_pod, _)| {
                let (node, net, cluster, node_name) = (&node, &net, &cluster, &node_name);
                s.spawn(move || {
                    cluster.put_pod(on_node(api_pod.json(), node_name));
                    node.add(net, pod).err().map(|e| e.to_string())
                })
            })
            .collect();
        handles
            .into_iter()
            .filter_map(|h| h.join().unwrap())
            .collect()
    });
    assert!(failures.is_empty(), "ADDs failed:\n{}", failures.join("\n"));

    assert_eq!(
        plugin_api.total_requests(),
        0,
        "requests made with the plugin's credentials"
    );
    for (pod, _, meshed) in &pods {
        let lines = pod.nat(Backend::Nft, Family::V4).linkerd_lines();
        let want = if *meshed { 9 } else { 0 };
        assert_eq!(lines.len(), want, "{}: {lines:?}", pod.container_id());
    }
    let after = ["watch", "waited", "fetched"].map(|r| agent.lookups(r));
    let counts: Vec<u64> = after.iter().zip(before).map(|(a, b)| a - b).collect();
    eprintln!(
        "{PODS} lookups: {} from the watch, {} waited for it, {} fetched",
        counts[0], counts[1], counts[2]
    );
    assert_eq!(counts.iter().sum::<u64>(), PODS as u64, "{counts:?}");
    for (pod, _, _) in &pods {
        node.del(&net, pod)
            .unwrap_or_else(|e| panic!("DEL {}: {e}", pod.container_id()));
    }
}
