//! The node agent answering the plugin's pod lookups, through libcni: a
//! burst of pods started while the agent runs makes no request with the
//! plugin's own credentials, and every meshed pod gets its rules.
//!
//! Two fake API servers, so that each caller's requests are counted apart:
//! the agent's (the stateful one, watched) on the host's loopback, and the
//! plugin's direct path (the one its kubeconfig names) inside the node.

use std::time::Duration;

use conformance::agent::AgentProcess;
use conformance::chains::{self, Primary};
use conformance::kube::APP_NAMESPACE;
use conformance::{Backend, Family, Node, PodSpec};
use testkit::WatchApiServer;
use testkit::objects::{Pod as ApiPod, namespace, on_node};

const DEADLINE: Duration = Duration::from_secs(60);
const PODS: usize = 50;

#[test]
fn a_burst_of_pods_makes_no_request_with_the_plugins_token() {
    let node = Node::new();
    let plugin_api = node.start_api_server();
    let cluster = WatchApiServer::start();
    let node_name = node.kube_name();
    cluster.put_object("namespaces", namespace(APP_NAMESPACE, &[]));
    let agent = AgentProcess::start(&cluster, &node_name, &node.conf_dir(), &node.state_dir())
        .unwrap_or_else(|e| panic!("{e}"));

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
    cluster.put_pod(on_node(
        ApiPod::new(APP_NAMESPACE, "probe").json(),
        &node_name,
    ));
    agent
        .wait_answering(APP_NAMESPACE, "probe", DEADLINE)
        .unwrap_or_else(|e| panic!("{e}"));
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
