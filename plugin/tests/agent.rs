//! The pod's facts from the node agent: the plugin asks the socket in its
//! state dir first, decides from the answer exactly as from the API server,
//! and takes its direct path to the API server whenever the agent cannot
//! answer. The agent here is a stand-in thread that answers what a test
//! tells it to; the real agent's answers are tested with its crate.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use linkerd_cni::cni::code;
use linkerd_cni::config::PluginConfig;
use linkerd_cni::pod::{self, Plan, Stop};
use linkerd_cni_lookup::{self as lookup, Answer, Body, Request, Source};
use serde_json::{Value, json};
use testkit::TestNetns;
use testkit::iptables::{default_save, nat_table};
use testkit::objects::{Pod, kubernetes_service, namespace};

use common::{
    Cluster, cni_env, failed, invocation, mesh, netconf, outbound_ignored, run_plugin, stderr,
};

/// A stand-in agent at the state dir's socket: answers every question with
/// what `answer` makes of it, and records the questions.
struct Agent {
    questions: Arc<Mutex<Vec<Request>>>,
}

impl Agent {
    fn start(state_dir: &Path, answer: impl Fn(&Request) -> Vec<u8> + Send + 'static) -> Agent {
        let path = state_dir.join(lookup::SOCKET);
        let _ = std::fs::remove_file(&path);
        let listener = UnixListener::bind(&path).unwrap();
        let questions = Arc::new(Mutex::new(Vec::new()));
        let seen = questions.clone();
        std::thread::spawn(move || {
            for s in listener.incoming() {
                let Ok(s) = s else { return };
                let mut line = String::new();
                let _ = BufReader::new(&s).read_line(&mut line);
                let Ok(q) = Request::decode(line.trim_end().as_bytes()) else {
                    continue;
                };
                let reply = answer(&q);
                seen.lock().unwrap().push(q);
                let _ = (&s).write_all(&reply);
            }
        });
        Agent { questions }
    }

    fn asked(&self) -> Vec<Request> {
        self.questions.lock().unwrap().clone()
    }
}

fn pod_answer(pod: &Pod, ns: Value, service: Option<Value>) -> Vec<u8> {
    Answer::new(Body::Pod {
        pod: pod.json(),
        namespace: Some(ns),
        service,
        source: Source::Watch,
    })
    .encode()
}

fn state_dir(c: &Cluster) -> PathBuf {
    c.kubeconfig.parent().unwrap().to_path_buf()
}

fn decide(c: &Cluster, ns: &str, name: &str) -> Result<Plan, Stop> {
    let env = cni_env("ADD", Path::new("/run/netns/unused"), Some((ns, name)));
    let inv = invocation(&env, &netconf(&c.kubeconfig, json!({})));
    let config = PluginConfig::from_map(&inv.conf.raw)?;
    pod::decide(&inv, &config)
}

#[test]
fn the_agents_answer_decides_without_an_api_call() {
    let c = Cluster::start("agent");
    let web = Pod::meshed("shop", "web-1").annotation("config.linkerd.io/proxy-uid", "2103");
    let plain = Pod::new("shop", "plain-1");
    let control = Pod::meshed("linkerd", "destination-0")
        .label("linkerd.io/control-plane-component", "destination");
    let agent = Agent::start(&state_dir(&c), move |q| match q.name.as_str() {
        "web-1" => pod_answer(
            &web,
            namespace("shop", &[("config.linkerd.io/skip-outbound-ports", "3306")]),
            None,
        ),
        "plain-1" => pod_answer(&plain, namespace("shop", &[]), None),
        _ => pod_answer(
            &control,
            namespace("linkerd", &[]),
            Some(kubernetes_service(&[(443, json!(6443))])),
        ),
    });

    let plan = mesh(decide(&c, "shop", "web-1"));
    assert_eq!(plan.spec.proxy_uid, 2103, "the pod's annotation");
    assert_eq!(
        outbound_ignored(&plan),
        "3306",
        "the namespace's annotation"
    );
    match decide(&c, "shop", "plain-1") {
        Err(Stop::PassThrough { why, .. }) => assert!(why.contains("no linkerd-proxy"), "{why}"),
        other => panic!("expected pass-through, got {other:?}"),
    }
    let plan = mesh(decide(&c, "linkerd", "destination-0"));
    assert_eq!(outbound_ignored(&plan), "443,6443", "the Service's ports");

    assert_eq!(c.api.total_requests(), 0, "no API call at all");
    let asked = agent.asked();
    assert_eq!(asked.len(), 3);
    assert_eq!(
        (asked[0].namespace.as_str(), asked[0].name.as_str()),
        ("shop", "web-1")
    );
    assert!(asked[0].budget_ms > 0 && asked[0].budget_ms <= 3000);
}

#[test]
fn an_agent_that_cannot_answer_sends_the_plugin_to_the_api_server() {
    let c = Cluster::start("agent-direct");
    let p = Pod::meshed("shop", "web-1");
    c.api.add_pod(&p);
    c.api
        .add_namespace("shop", &[("config.linkerd.io/skip-outbound-ports", "25")]);
    let answers: Vec<Vec<u8>> = vec![
        Answer::new(Body::Unavailable {
            message: "API server down".into(),
        })
        .encode(),
        b"<html>502 Bad Gateway</html>\n".to_vec(),
        br#"{"v":2,"answer":"not_found","message":"a newer agent"}
"#
        .to_vec(),
        // A pod answer without the namespace cannot be decided on.
        Answer::new(Body::Pod {
            pod: p.json(),
            namespace: None,
            service: None,
            source: Source::Watch,
        })
        .encode(),
    ];
    for (i, answer) in answers.into_iter().enumerate() {
        let before = c.api.requests(&p.path());
        let _agent = Agent::start(&state_dir(&c), move |_| answer.clone());
        let plan = mesh(decide(&c, "shop", "web-1"));
        assert_eq!(outbound_ignored(&plan), "25", "answer {i}");
        assert_eq!(c.api.requests(&p.path()), before + 1, "answer {i}");
    }
    // No agent at all: the direct path, as before there was one.
    std::fs::remove_file(state_dir(&c).join(lookup::SOCKET)).unwrap();
    mesh(decide(&c, "shop", "web-1"));
}

#[test]
fn a_pod_the_api_server_says_is_gone_fails_the_add() {
    let c = Cluster::start("agent-gone");
    let _agent = Agent::start(&state_dir(&c), |_| {
        Answer::new(Body::NotFound {
            message: "pod shop/web-1 does not exist".into(),
        })
        .encode()
    });
    let e = failed(decide(&c, "shop", "web-1"));
    assert_eq!(e.code, code::KUBERNETES);
    assert!(e.msg.contains("does not exist"), "{}", e.msg);
    assert_eq!(c.api.total_requests(), 0);
}

/// The agent's message carries the API server's text: it reaches the
/// plugin's error as one printable, bounded line.
#[test]
fn the_agents_message_cannot_forge_lines() {
    let c = Cluster::start("agent-text");
    let _agent = Agent::start(&state_dir(&c), |_| {
        Answer::new(Body::NotFound {
            message: format!(
                "gone\nlinkerd-cni ERROR forged\u{1b}[31m{}",
                "x".repeat(10_000)
            ),
        })
        .encode()
    });
    let e = failed(decide(&c, "shop", "web-1"));
    assert!(
        !e.msg.contains('\n') && !e.msg.contains('\u{1b}'),
        "{}",
        e.msg
    );
    assert!(e.msg.len() < 1024, "{} bytes", e.msg.len());
}

#[test]
fn the_binary_installs_the_rules_from_the_agents_answer() {
    let c = Cluster::start("agent-bin");
    let ns = TestNetns::new("agent-add").unwrap();
    let web = Pod::meshed("shop", "web-1");
    let agent = Agent::start(&state_dir(&c), move |_| {
        pod_answer(&web, namespace("shop", &[]), None)
    });
    let conf = netconf(&c.kubeconfig, json!({"iptables-mode": "nft"}));
    let mut env = cni_env("ADD", ns.path(), Some(("shop", "web-1")));
    for (k, v) in &mut env {
        if k == "CNI_ARGS" {
            v.push_str(";K8S_POD_UID=uid-7");
        }
    }
    let o = run_plugin(&env, &conf);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(nat_table(&ns, "iptables-nft-save"), default_save());
    assert_eq!(c.api.total_requests(), 0);
    assert_eq!(agent.asked()[0].uid.as_deref(), Some("uid-7"));
}

/// `kubernetes.agent-only`: the node holds no credential of the plugin's,
/// so when no agent answers the plugin never asks the API server. While
/// the DaemonSet is alive (its installer's heartbeat is live) every pod,
/// meshed or not, is sent back with code 11 to wait for the agent; once it
/// is gone (no heartbeat) pods pass through. An agent that answers still
/// decides.
#[test]
fn agent_only_waits_for_the_agent_while_the_daemonset_lives_then_passes_through() {
    use linkerd_cni_state::heartbeat::{self, Beat};
    use linkerd_cni_state::outcomes::{PassCause, RetryCause};

    let c = Cluster::start("agent-only");
    let web = Pod::meshed("shop", "web-1");
    c.api.add_pod(&web);
    c.api.add_pod(&Pod::new("shop", "plain-1"));
    c.api.add_namespace("shop", &[]);
    let decide = |name: &str| {
        let env = cni_env("ADD", Path::new("/run/netns/unused"), Some(("shop", name)));
        let mut conf = netconf(&c.kubeconfig, json!({}));
        conf["kubernetes"]["agent-only"] = true.into();
        let inv = invocation(&env, &conf);
        let config = PluginConfig::from_map(&inv.conf.raw)?;
        assert!(config.agent_only);
        pod::decide(&inv, &config)
    };

    linkerd_cni_state::record::write(
        &state_dir(&c),
        &Beat::now(std::time::Duration::from_secs(10)),
    )
    .unwrap();
    for name in ["web-1", "plain-1"] {
        let e = failed(decide(name));
        assert_eq!(e.code, code::TRY_AGAIN_LATER, "{name}: {e}");
        assert_eq!(e.retry_cause, Some(RetryCause::NoAgent), "{name}");
        assert!(e.msg.contains("agent-only"), "{name}: {}", e.msg);
    }
    // An agent that cannot answer is no answer either.
    let unavailable = Agent::start(&state_dir(&c), |_| {
        Answer::new(Body::Unavailable {
            message: "starting".into(),
        })
        .encode()
    });
    assert_eq!(failed(decide("web-1")).code, code::TRY_AGAIN_LATER);
    assert_eq!(unavailable.asked().len(), 1);
    drop(unavailable);
    std::fs::remove_file(state_dir(&c).join(lookup::SOCKET)).unwrap();

    // The DaemonSet is gone: the uninstall removed the heartbeat.
    assert!(heartbeat::remove(&state_dir(&c)).unwrap());
    for name in ["web-1", "plain-1"] {
        match decide(name) {
            Err(Stop::PassThrough { cause, why }) => {
                assert_eq!(
                    cause,
                    linkerd_cni_state::outcomes::Outcome::PassedThrough(PassCause::NoAgent)
                );
                assert!(why.contains("no linkerd-cni DaemonSet"), "{why}");
            }
            other => panic!("expected pass-through, got {other:?}"),
        }
    }
    assert_eq!(c.api.total_requests(), 0, "never the API server");

    // The agent's answer decides, as without the setting.
    let _agent = Agent::start(&state_dir(&c), move |_| {
        pod_answer(&web, namespace("shop", &[]), None)
    });
    mesh(decide("web-1"));
    assert_eq!(c.api.total_requests(), 0, "never the API server");
}
