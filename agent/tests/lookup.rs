//! The agent's answers to the plugin's pod lookups, from its watches of
//! testkit's stateful fake API server (loopback only), over the socket in
//! a temporary state dir: what it answers from memory, what it waits for,
//! what it fetches, and what it refuses.

#[path = "repair_common/mod.rs"]
mod common;

use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::*;
use linkerd_cni_lookup::{self as lookup, AskError, Body, Request, Source};
use serde_json::{Value, json};
use testkit::WatchApiServer;
use testkit::objects::{self, Pod, on_node};
use testkit::{TempDir, wait_until};

const BUDGET: Duration = Duration::from_secs(3);

fn ask(socket: &Path, ns: &str, name: &str, uid: Option<&str>) -> Result<Body, AskError> {
    let req = Request {
        v: lookup::VERSION,
        namespace: ns.into(),
        name: name.into(),
        uid: uid.map(String::from),
        budget_ms: BUDGET.as_millis() as u64,
    };
    lookup::ask(socket, &req, BUDGET).map(|a| a.body)
}

/// The GETs of one pod the agent made (not its list or watch).
fn pod_gets(api: &WatchApiServer, ns: &str, name: &str) -> usize {
    let path = objects::pod_path(ns, name);
    api.requests()
        .iter()
        .filter(|r| r.method == "GET" && r.path == path)
        .count()
}

struct Agent {
    ctl: Controller,
    socket: PathBuf,
    _state: TempDir,
    _conf: ConfDir,
}

fn start(api: &WatchApiServer) -> Agent {
    let conf = ConfDir::new(true);
    let state = TempDir::new("agent-state").unwrap();
    let dir = state.path().to_str().unwrap().to_string();
    let ctl = Controller::start(api, conf.path(), &["--state-dir", &dir]);
    let socket = state.path().join(lookup::SOCKET);
    ctl.wait("the lookup socket", || socket.exists());
    Agent {
        ctl,
        socket,
        _state: state,
        _conf: conf,
    }
}

fn cluster(api: &WatchApiServer) {
    api.put_object(
        "namespaces",
        objects::namespace(
            "shop",
            &[
                ("config.linkerd.io/skip-outbound-ports", "3306"),
                ("unrelated.example.com/note", "not for the plugin"),
            ],
        ),
    );
    api.put_object(
        "services",
        objects::kubernetes_service(&[(443, json!(6443))]),
    );
    api.put_pod(on_node(
        Pod::meshed("shop", "web-1")
            .annotation("config.linkerd.io/proxy-uid", "2103")
            .json(),
        NODE,
    ));
}

#[test]
fn answers_from_its_watches_without_an_api_call() {
    let api = WatchApiServer::start();
    cluster(&api);
    let agent = start(&api);

    let meta = std::fs::symlink_metadata(&agent.socket).unwrap();
    assert!(meta.file_type().is_socket());
    assert_eq!(meta.mode() & 0o777, 0o600, "root's alone");

    // Once the watches have listed, the pod comes from memory.
    let mut last = None;
    let served = wait_until(Duration::from_secs(30), || {
        last = Some(ask(&agent.socket, "shop", "web-1", None));
        matches!(
            last,
            Some(Ok(Body::Pod {
                source: Source::Watch,
                service: Some(_),
                ..
            }))
        )
    });
    assert!(served, "{last:?}\n{}", agent.ctl.log_text());
    let Some(Ok(Body::Pod {
        pod,
        namespace,
        service,
        ..
    })) = last
    else {
        unreachable!()
    };
    assert_eq!(pod.pointer("/metadata/name"), Some(&json!("web-1")));
    assert_eq!(
        pod.pointer("/metadata/annotations/config.linkerd.io~1proxy-uid"),
        Some(&json!("2103"))
    );
    let containers: Vec<&str> = pod["spec"]["containers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert!(containers.contains(&"linkerd-proxy"), "{containers:?}");
    assert_eq!(pod.get("status"), None, "stripped to what the plugin reads");
    let ns = namespace.expect("the namespace");
    assert_eq!(
        ns.pointer("/metadata/annotations"),
        Some(&json!({"config.linkerd.io/skip-outbound-ports": "3306"})),
        "only the annotations the plugin reads"
    );
    assert_eq!(
        service.unwrap().pointer("/spec/ports/0/targetPort"),
        Some(&json!(6443))
    );
    assert_eq!(
        pod_gets(&api, "shop", "web-1"),
        0,
        "no GET of a watched pod"
    );

    // The uid the runtime passes must match.
    let uid = pod["metadata"]["uid"].as_str().unwrap().to_string();
    assert!(matches!(
        ask(&agent.socket, "shop", "web-1", Some(&uid)),
        Ok(Body::Pod { .. })
    ));

    let metrics = agent.ctl.get("/metrics").1;
    assert!(
        metrics.contains("linkerd_cni_agent_pod_lookups_total{result=\"watch\"}"),
        "{metrics}"
    );
}

#[test]
fn a_pod_the_watch_has_not_seen_is_waited_for_then_fetched() {
    let api = WatchApiServer::start();
    cluster(&api);
    let agent = start(&api);
    agent.ctl.wait("the watch of this node's pods", || {
        matches!(
            ask(&agent.socket, "shop", "web-1", None),
            Ok(Body::Pod {
                source: Source::Watch,
                ..
            })
        )
    });

    // Not on this node: the watch never sees it, the GET finds it.
    api.put_pod(on_node(Pod::meshed("shop", "elsewhere").json(), "node-b"));
    match ask(&agent.socket, "shop", "elsewhere", None) {
        Ok(Body::Pod { source, .. }) => assert_eq!(source, Source::Fetched),
        other => panic!("{other:?}"),
    }
    assert_eq!(pod_gets(&api, "shop", "elsewhere"), 1);

    // Nowhere: the API server's own word.
    assert!(
        matches!(
            ask(&agent.socket, "shop", "ghost", None),
            Ok(Body::NotFound { .. })
        ),
        "{}",
        agent.ctl.log_text()
    );

    // Another pod of the same name: not the one the runtime asks for.
    match ask(&agent.socket, "shop", "web-1", Some("an-old-uid")) {
        Ok(Body::NotFound { message }) => assert!(message.contains("an-old-uid"), "{message}"),
        other => panic!("{other:?}"),
    }

    // A pod created now arrives through the watch while the lookup waits,
    // or is already there: never fetched.
    api.put_pod(on_node(Pod::meshed("shop", "web-2").json(), NODE));
    match ask(&agent.socket, "shop", "web-2", None) {
        Ok(Body::Pod { source, .. }) => assert_ne!(source, Source::Fetched),
        other => panic!("{other:?}"),
    }
    assert_eq!(pod_gets(&api, "shop", "web-2"), 0);
}

#[test]
fn an_api_server_that_fails_is_answered_unavailable_within_the_budget() {
    let api = WatchApiServer::start();
    cluster(&api);
    let agent = start(&api);
    agent.ctl.wait("the watch", || {
        matches!(
            ask(&agent.socket, "shop", "web-1", None),
            Ok(Body::Pod { .. })
        )
    });
    // Enough for every request in the lookup's wait (the watches reconnect
    // meanwhile), its GET included.
    api.fail_next(50, 503);
    let started = std::time::Instant::now();
    match ask(&agent.socket, "shop", "not-yet", None) {
        Ok(Body::Unavailable { message }) => assert!(message.contains("not-yet"), "{message}"),
        other => panic!("{other:?}"),
    }
    assert!(started.elapsed() < BUDGET);
}

#[test]
fn refuses_what_is_not_a_question_and_leaves_other_files_alone() {
    use std::io::{Read, Write};
    let api = WatchApiServer::start();
    cluster(&api);
    let agent = start(&api);
    let mut s = std::os::unix::net::UnixStream::connect(&agent.socket).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(b"{\"v\":99,\"namespace\":\"a\",\"name\":\"b\",\"budget_ms\":1}\n")
        .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let answer: Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(answer["answer"], "unavailable", "{out}");
    assert!(answer["message"].as_str().unwrap().contains("99"), "{out}");

    // Something else at the socket's path is never replaced.
    let state = TempDir::new("agent-state").unwrap();
    std::fs::write(state.path().join(lookup::SOCKET), "mine").unwrap();
    let conf = ConfDir::new(true);
    let dir = state.path().to_str().unwrap().to_string();
    let ctl = Controller::start(&api, conf.path(), &["--state-dir", &dir]);
    ctl.wait("the refusal", || {
        ctl.log_text().contains("exists and is not a socket")
    });
    assert_eq!(
        std::fs::read_to_string(state.path().join(lookup::SOCKET)).unwrap(),
        "mine"
    );
}

#[test]
fn a_control_plane_pods_service_is_fetched_when_the_watch_has_not_seen_it() {
    let api = WatchApiServer::start();
    api.put_object("namespaces", objects::namespace("linkerd", &[]));
    api.put_pod(on_node(
        Pod::meshed("linkerd", "destination-0")
            .label(lookup::CONTROL_PLANE_LABEL, "destination")
            .json(),
        NODE,
    ));
    api.put_pod(on_node(Pod::meshed("linkerd", "web-0").json(), NODE));
    let agent = start(&api);
    agent.ctl.wait("the watch of this node's pods", || {
        matches!(
            ask(&agent.socket, "linkerd", "web-0", None),
            Ok(Body::Pod {
                source: Source::Watch,
                ..
            })
        )
    });
    // The Service exists, but the agent's watch has not shown it yet.
    api.with_cluster(|c| {
        c.put_object_unwatched(
            "services",
            objects::kubernetes_service(&[(443, json!(8443))]),
        )
    });
    let service_gets = || {
        api.requests()
            .iter()
            .filter(|r| r.method == "GET" && r.path == objects::KUBERNETES_SERVICE_PATH)
            .count()
    };
    // Not a control-plane pod: no Service, and no GET for it.
    match ask(&agent.socket, "linkerd", "web-0", None) {
        Ok(Body::Pod { service, .. }) => assert_eq!(service, None),
        other => panic!("{other:?}"),
    }
    assert_eq!(service_gets(), 0);
    match ask(&agent.socket, "linkerd", "destination-0", None) {
        Ok(Body::Pod { service, .. }) => assert_eq!(
            service.and_then(|s| s.pointer("/spec/ports/0/targetPort").cloned()),
            Some(json!(8443)),
            "{}",
            agent.ctl.log_text()
        ),
        other => panic!("{other:?}"),
    }
    assert_eq!(service_gets(), 1);
}

/// The lookups' watches back off as the controller's does while the API
/// server fails, the waits growing from a second: a retry that starts over
/// with every list attempt would ask a recovering API server again every
/// second, from every node.
#[test]
fn the_watches_back_off_while_the_api_server_fails() {
    let api = WatchApiServer::start();
    cluster(&api);
    // An outage, as the namespaces' watch sees it: its first four lists fail.
    api.fail_next_on("/api/v1/namespaces", 4, 503);
    let agent = start(&api);
    let lists = || -> Vec<_> {
        api.requests()
            .into_iter()
            .filter(|r| r.path == "/api/v1/namespaces" && !r.is_watch())
            .collect()
    };
    agent
        .ctl
        .wait("the namespaces listed", || lists().len() == 5);
    let at: Vec<_> = lists().iter().map(|r| r.at).collect();
    let gaps: Vec<Duration> = at.windows(2).map(|w| w[1] - w[0]).collect();
    for (i, gap) in gaps.iter().enumerate() {
        let least = Duration::from_millis(500 << i);
        assert!(
            *gap >= least,
            "retry {i} after {gap:?}, at least {least:?}: {gaps:?}"
        );
    }
    let log = agent.ctl.log_text();
    let lines = log
        .lines()
        .filter(|l| l.contains("cannot list or watch namespaces"))
        .count();
    assert_eq!(lines, 4, "{log}");
}
