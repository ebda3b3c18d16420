//! The repair controller binary against testkit's stateful fake API server
//! (loopback only): which pods it deletes, when, and how its watch
//! survives the API server's failures. Every wait is for an effect, with a
//! generous deadline.

#[path = "repair_common/mod.rs"]
mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use common::*;
use serde_json::Value;
use testkit::TempDir;
use testkit::objects::{Pod, being_deleted, on_node, owned_by, with_init_status};
use testkit::{GoneStyle, WatchApiServer};

#[test]
fn deletes_a_broken_pod_once_and_publishes_an_event_leaving_the_others() {
    let api = WatchApiServer::start();
    let conf = ConfDir::new(true);
    let uid = api.put_pod(broken("shop", "web-1"));
    // Left alone: healthy, validator failed for another reason, being
    // deleted, on another node, not meshed.
    api.put_pod(pod("shop", "healthy", NODE, None));
    api.put_pod(pod("shop", "other-exit", NODE, Some(1)));
    api.put_pod(being_deleted(broken("shop", "leaving")));
    api.put_pod(pod("shop", "elsewhere", "node-b", Some(95)));
    api.put_pod(with_init_status(
        on_node(Pod::new("shop", "unmeshed").json(), NODE),
        VALIDATOR,
        Some(95),
    ));

    let ctl = Controller::start(&api, conf.path(), &[]);
    ctl.wait("the event of web-1", || {
        event_for(&api.events(), "shop", "web-1").is_some()
    });
    assert_eq!(ctl.get("/live").0, 200);
    assert_eq!(ctl.get("/ready").0, 200);

    // A later broken pod, through the watch this time. Once it is done,
    // everything before it in the stream has been handled.
    api.put_pod(broken("shop", "web-2"));
    ctl.wait("the event of web-2", || {
        event_for(&api.events(), "shop", "web-2").is_some()
    });

    assert_eq!(deleted_names(&api), ["shop/web-1", "shop/web-2"]);
    let d = &api.deletions()[0];
    assert_eq!(d.uid, uid);
    assert_eq!(d.grace_period_seconds, Some(0));
    for name in ["healthy", "other-exit", "leaving", "elsewhere", "unmeshed"] {
        assert!(api.pod("shop", name).is_some(), "{name} was deleted");
    }

    let events = api.events();
    assert_eq!(events.len(), 2, "{events:#?}");
    let e = event_for(&events, "shop", "web-1").unwrap();
    let field = |p: &str| e.pointer(p).and_then(Value::as_str).unwrap_or("");
    assert_eq!(field("/apiVersion"), "events.k8s.io/v1");
    assert_eq!(field("/kind"), "Event");
    assert_eq!(field("/reason"), "LinkerdCNINotConfigured");
    assert_eq!(field("/action"), "Deleting");
    assert_eq!(field("/type"), "Normal");
    assert_eq!(
        field("/reportingController"),
        "linkerd-cni-repair-controller"
    );
    assert_eq!(field("/reportingInstance"), "linkerd-cni-test");
    assert_eq!(field("/regarding/kind"), "Pod");
    assert_eq!(field("/regarding/uid"), uid);
    assert_eq!(field("/metadata/namespace"), "shop");
    assert!(!field("/eventTime").is_empty());

    // The watch asked for exactly this node's meshed pods.
    let list = api
        .requests()
        .into_iter()
        .find(|r| r.path == "/api/v1/pods" && !r.is_watch())
        .expect("a list of pods");
    assert_eq!(list.param("fieldSelector"), Some("spec.nodeName=node-a"));
    assert_eq!(
        list.param("labelSelector"),
        Some("linkerd.io/control-plane-ns")
    );

    assert_eq!(
        ctl.metric("linkerd_cni_repair_controller_pods_deleted_total"),
        Some(2.0)
    );
    assert_eq!(
        ctl.metric("linkerd_cni_repair_controller_pods_delete_latency_seconds_count"),
        Some(2.0)
    );
    assert_eq!(
        ctl.metric("linkerd_cni_repair_controller_events_publish_errors_total"),
        Some(0.0)
    );
}

#[test]
fn deletes_only_pods_that_a_controller_creates_again() {
    let api = WatchApiServer::start();
    let conf = ConfDir::new(true);
    let owned = [
        ("ReplicaSet", "web-5d8f", "web-5d8f-x2x7q"),
        ("StatefulSet", "db", "db-0"),
        ("DaemonSet", "agent", "agent-k8v2p"),
        ("Job", "migrate", "migrate-9xk2w"),
    ];
    for (kind, owner, name) in owned {
        api.put_pod(owned_by(
            bare("shop", name, NODE, Some(95)),
            kind,
            owner,
            true,
        ));
    }
    // `kubectl run`, and a pod whose only owner is not its controller.
    api.put_pod(bare("shop", "debug", NODE, Some(95)));
    api.put_pod(owned_by(
        bare("shop", "adopted", NODE, Some(95)),
        "ReplicaSet",
        "web-5d8f",
        false,
    ));

    let ctl = Controller::start(&api, conf.path(), &[]);
    ctl.wait("four deletions and six events", || {
        api.deletions().len() == 4 && api.events().len() == 6
    });
    let mut deleted = deleted_names(&api);
    deleted.sort();
    let mut expected: Vec<String> = owned.iter().map(|(_, _, n)| format!("shop/{n}")).collect();
    expected.sort();
    assert_eq!(deleted, expected);
    let events = api.events();
    for name in ["debug", "adopted"] {
        assert!(api.pod("shop", name).is_some(), "{name} was deleted");
        let e = event_for(&events, "shop", name).expect("an Event");
        let field = |p: &str| e.pointer(p).and_then(Value::as_str).unwrap_or("");
        assert_eq!(field("/type"), "Warning");
        assert_eq!(field("/reason"), "LinkerdCNINotConfigured");
        assert_eq!(field("/action"), "NotDeleting");
        assert!(
            field("/note").contains("delete it and create it again"),
            "{e:#}"
        );
    }
    assert_eq!(
        ctl.metric("linkerd_cni_repair_controller_pods_unowned_total"),
        Some(2.0)
    );
    assert_eq!(
        ctl.metric("linkerd_cni_repair_controller_pods_pending"),
        Some(0.0)
    );
    let log = ctl.log_text();
    assert!(
        log.contains("pod=debug") && log.contains("delete it and create it again"),
        "{log}"
    );

    // Its validator fails again: reported once, not on every restart. The
    // deletion of a later pod shows the update was handled.
    api.put_pod(bare("shop", "debug", NODE, Some(95)));
    api.put_pod(broken("shop", "web-2"));
    ctl.wait("the deletion of web-2", || api.events().len() == 7);
    assert_eq!(
        ctl.metric("linkerd_cni_repair_controller_pods_unowned_total"),
        Some(2.0)
    );
}

/// A static pod's mirror pod, as the kubelet creates it: the mirror
/// annotation and its node as controller owner.
fn mirror(ns: &str, name: &str) -> Value {
    let p = Pod::meshed(ns, name)
        .label("linkerd.io/control-plane-ns", "linkerd")
        .annotation("kubernetes.io/config.mirror", "9b1f0c3e");
    let p = with_init_status(on_node(p.json(), NODE), VALIDATOR, Some(95));
    owned_by(p, "Node", NODE, true)
}

#[test]
fn never_deletes_a_static_pods_mirror_pod() {
    let api = WatchApiServer::start();
    let conf = ConfDir::new(true);
    api.put_pod(mirror("kube-system", "etcd-node-a"));
    // Either mark alone makes a mirror pod.
    let mut annotated = mirror("kube-system", "annotated-node-a");
    annotated["metadata"]["ownerReferences"] = Value::Array(vec![]);
    api.put_pod(owned_by(annotated, "ReplicaSet", "web-5d8f", true));
    let mut node_owned = mirror("kube-system", "node-owned-node-a");
    node_owned["metadata"]["annotations"]
        .as_object_mut()
        .unwrap()
        .remove("kubernetes.io/config.mirror");
    api.put_pod(node_owned);
    api.put_pod(broken("shop", "web-1"));

    let ctl = Controller::start(&api, conf.path(), &[]);
    // An Event per pod, whether deleted or not.
    ctl.wait("four events", || api.events().len() == 4);
    assert_eq!(deleted_names(&api), ["shop/web-1"]);
    let events = api.events();
    for name in ["etcd-node-a", "annotated-node-a", "node-owned-node-a"] {
        assert!(api.pod("kube-system", name).is_some(), "{name} was deleted");
        let e = event_for(&events, "kube-system", name).expect("an Event");
        let field = |p: &str| e.pointer(p).and_then(Value::as_str).unwrap_or("");
        assert_eq!(field("/type"), "Warning");
        assert_eq!(field("/action"), "NotDeleting");
        assert!(field("/note").contains("restart the static pod"), "{e:#}");
    }
    assert_eq!(
        ctl.metric("linkerd_cni_repair_controller_pods_unowned_total"),
        Some(3.0)
    );
    let log = ctl.log_text();
    assert!(
        log.contains("pod=etcd-node-a") && log.contains("restart the static pod"),
        "{log}"
    );

    // The kubelet updates the mirror's status as the validator fails
    // again: still not deleted, nor reported again. The deletion of a
    // later pod shows the update was handled.
    api.put_pod(mirror("kube-system", "etcd-node-a"));
    api.put_pod(broken("shop", "web-2"));
    ctl.wait("the deletion of web-2", || api.events().len() == 5);
    assert_eq!(deleted_names(&api), ["shop/web-1", "shop/web-2"]);
    assert_eq!(
        ctl.metric("linkerd_cni_repair_controller_pods_unowned_total"),
        Some(3.0)
    );
}

#[test]
fn waits_while_the_chain_is_broken_and_repairs_once_it_is_healthy() {
    let api = WatchApiServer::start();
    let conf = ConfDir::new(false);
    let ctl = Controller::start(&api, conf.path(), &[]);
    ctl.wait_ready();
    api.put_pod(broken("shop", "web-1"));
    // The controller has seen the pod and judged the chain.
    ctl.wait("the pod held for the chain", || {
        ctl.metric("linkerd_cni_repair_controller_chain_broken") == Some(1.0)
            && ctl.metric("linkerd_cni_repair_controller_pods_pending") == Some(1.0)
    });
    assert!(
        api.deletions().is_empty(),
        "deleted while the chain is broken"
    );
    assert!(
        ctl.log_text().contains("chain broken"),
        "{}",
        ctl.log_text()
    );

    conf.set_chained(true);
    ctl.wait("the deletion once chained", || {
        deleted_names(&api) == ["shop/web-1"]
    });
    ctl.wait("the event", || api.events().len() == 1);
    assert_eq!(
        ctl.metric("linkerd_cni_repair_controller_chain_broken"),
        Some(0.0)
    );
}

/// Owned mode: linkerd-cni's own file holds the chain, the primary's file
/// holds no entry of ours. The gate judges it healthy and the failing pod
/// is repaired.
#[test]
fn repairs_on_an_owned_mode_node() {
    let api = WatchApiServer::start();
    let conf = ConfDir::new(false);
    let entry = ENTRY.replacen('{', r#"{"chain_mode":"owned","#, 1);
    std::fs::write(conf.path().join("ZZZ-linkerd-cni-entry"), &entry).unwrap();
    // As the installer keeps it.
    let desired = linkerd_cni_chain::Entry::parse(entry.as_bytes(), "test").unwrap();
    let mode = linkerd_cni_chain::ModeChoice::of_entry(&desired).unwrap();
    let ctx = linkerd_cni_chain::Context::new(conf.path(), desired, mode, DEADLINE);
    linkerd_cni_chain::keep(&ctx, &mut linkerd_cni_chain::NoLimit).unwrap();
    let ours = std::fs::read_to_string(conf.path().join("10-ptp-linkerd-cni.conflist")).unwrap();
    assert!(ours.contains("owned_copy_of"), "{ours}");
    let primary = std::fs::read_to_string(conf.path().join("10-ptp.conflist")).unwrap();
    assert!(!primary.contains("linkerd-cni"), "{primary}");

    let ctl = Controller::start(&api, conf.path(), &[]);
    ctl.wait_ready();
    api.put_pod(broken("shop", "web-1"));
    ctl.wait("the deletion on the owned-mode node", || {
        deleted_names(&api) == ["shop/web-1"]
    });
    assert_eq!(
        ctl.metric("linkerd_cni_repair_controller_chain_broken"),
        Some(0.0)
    );
}

#[test]
fn without_the_host_mount_it_repairs_as_upstream_does() {
    let api = WatchApiServer::start();
    let absent = TempDir::new("repair-nomount").unwrap();
    let ctl = Controller::start(&api, &absent.path().join("etc/cni/net.d"), &[]);
    api.put_pod(broken("shop", "web-1"));
    ctl.wait("the deletion", || deleted_names(&api) == ["shop/web-1"]);
    assert!(
        ctl.log_text().contains("cannot check the chain"),
        "{}",
        ctl.log_text()
    );
}

#[test]
fn backs_off_between_deletions_of_the_same_pod() {
    let api = WatchApiServer::start();
    let conf = ConfDir::new(true);
    let backoff = Duration::from_millis(1500);
    let ctl = Controller::start(&api, conf.path(), &["--pod-backoff", "1500ms"]);
    ctl.wait_ready();
    api.put_pod(broken("db", "db-0"));
    ctl.wait("the first deletion", || api.deletions().len() == 1);
    // A StatefulSet recreates it under the same name, and it fails again.
    api.put_pod(broken("db", "db-0"));
    ctl.wait("the second deletion and its event", || {
        api.deletions().len() == 2 && api.events().len() == 2
    });
    let d = api.deletions();
    assert_ne!(d[0].uid, d[1].uid);
    let gap = d[1].at.duration_since(d[0].at);
    assert!(
        gap >= backoff,
        "deleted again after {gap:?}, backoff {backoff:?}"
    );

    // A refused deletion is retried, after the (doubled) backoff.
    api.fail_next(1, 500);
    api.put_pod(broken("db", "db-0"));
    ctl.wait("the retried deletion", || api.deletions().len() == 3);
    assert_eq!(
        ctl.metric("linkerd_cni_repair_controller_pods_delete_errors_total"),
        Some(1.0)
    );
    let d = api.deletions();
    assert!(d[2].at.duration_since(d[1].at) >= backoff * 2);
}

#[test]
fn resumes_the_watch_after_the_stream_is_cut() {
    let api = WatchApiServer::start();
    let conf = ConfDir::new(true);
    let ctl = Controller::start(&api, conf.path(), &[]);
    ctl.wait_watching(&api);
    let lists = || {
        api.requests()
            .iter()
            .filter(|r| r.path == "/api/v1/pods" && !r.is_watch())
            .count()
    };
    assert_eq!(lists(), 1);
    // The pod appears while the stream is down: only resuming shows it.
    api.disconnect(false, |c| c.put_pod(broken("shop", "web-1")));
    ctl.wait("the deletion", || deleted_names(&api) == ["shop/web-1"]);
    // Resumed from its resource version, without listing again.
    assert_eq!(lists(), 1);
    let watches = api.requests().iter().filter(|r| r.is_watch()).count();
    assert!(watches >= 2, "{watches} watches");
}

#[test]
fn watches_again_when_the_server_ends_the_watch() {
    let api = WatchApiServer::start();
    api.set_max_watch(Duration::from_millis(300));
    let conf = ConfDir::new(true);
    let ctl = Controller::start(&api, conf.path(), &[]);
    ctl.wait_ready();
    let watches = || api.requests().iter().filter(|r| r.is_watch()).count();
    ctl.wait("watches ended and started again", || watches() >= 3);
    api.put_pod(broken("shop", "web-1"));
    ctl.wait("the deletion", || deleted_names(&api) == ["shop/web-1"]);
    let lists = api
        .requests()
        .iter()
        .filter(|r| r.path == "/api/v1/pods" && !r.is_watch())
        .count();
    assert_eq!(lists, 1, "a timed-out watch resumes without a new list");
}

#[test]
fn lists_again_after_410_gone_in_the_stream() {
    relists_after_gone(GoneStyle::Event);
}

#[test]
fn lists_again_after_410_gone_as_the_answer() {
    relists_after_gone(GoneStyle::Http);
}

fn relists_after_gone(style: GoneStyle) {
    let api = WatchApiServer::start();
    api.set_gone_style(style);
    let conf = ConfDir::new(false);
    // Held by the broken chain: still pending when the watch expires.
    api.put_pod(broken("shop", "gone-meanwhile"));
    let ctl = Controller::start(&api, conf.path(), &[]);
    ctl.wait("the pod held", || {
        ctl.metric("linkerd_cni_repair_controller_pods_pending") == Some(1.0)
    });
    ctl.wait_watching(&api);
    // While the stream is down and the history expires, one pod goes and
    // another fails: only a new list tells.
    api.disconnect(true, |c| {
        c.remove_pod("shop", "gone-meanwhile");
        c.put_pod(broken("shop", "web-1"));
    });
    ctl.wait("the new list", || {
        api.requests()
            .iter()
            .filter(|r| r.path == "/api/v1/pods" && !r.is_watch())
            .count()
            >= 2
    });
    conf.set_chained(true);
    ctl.wait("the deletion", || deleted_names(&api) == ["shop/web-1"]);
    // The pod that went meanwhile was forgotten, not deleted (it would be
    // a 404) nor kept pending.
    ctl.wait("nothing pending", || {
        ctl.metric("linkerd_cni_repair_controller_pods_pending") == Some(0.0)
    });
    assert_eq!(deleted_names(&api), ["shop/web-1"]);
    if style == GoneStyle::Http {
        assert!(
            api.requests()
                .iter()
                .any(|r| r.is_watch() && r.status == 410)
        );
    }
}

#[test]
fn resumes_after_api_errors() {
    let api = WatchApiServer::start();
    let conf = ConfDir::new(true);
    // The first list fails too.
    api.fail_next(2, 503);
    let ctl = Controller::start(&api, conf.path(), &[]);
    ctl.wait_watching(&api);
    api.fail_next(3, 500);
    api.disconnect(false, |c| c.put_pod(broken("shop", "web-1")));
    ctl.wait("the deletion", || deleted_names(&api) == ["shop/web-1"]);
    let failed = api.requests().iter().filter(|r| r.status >= 500).count();
    assert_eq!(failed, 5);
}

#[test]
fn exposes_the_standard_process_metrics() {
    let api = WatchApiServer::start();
    let conf = ConfDir::new(true);
    let before = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    let ctl = Controller::start(&api, conf.path(), &[]);
    ctl.wait_ready();
    let value = |name: &str| {
        ctl.metric(name)
            .unwrap_or_else(|| panic!("no {name} in:\n{}", ctl.get("/metrics").1))
    };
    for name in [
        "process_cpu_seconds_total",
        "process_virtual_memory_max_bytes",
        "process_heap_bytes",
        "process_uptime_seconds_total",
    ] {
        assert!(value(name) >= 0.0, "{name}");
    }
    let open = value("process_open_fds");
    assert!(open >= 3.0 && value("process_max_fds") >= open);
    let rss = value("process_resident_memory_bytes");
    assert!(rss > 0.0 && value("process_virtual_memory_bytes") >= rss);
    assert!(value("process_threads") >= 1.0);
    // Started after the test asked for it (the boot time /proc counts
    // from has whole seconds), before the clock it reports.
    let start = value("process_start_time_seconds");
    assert!(start + 1.0 >= before, "{start} < {before}");
    assert!(start <= value("process_clock_time_seconds") + 1.0);
}

#[test]
fn backs_off_while_the_api_server_fails() {
    let api = WatchApiServer::start();
    let conf = ConfDir::new(true);
    // An outage: the first four lists fail.
    api.fail_next(4, 503);
    let ctl = Controller::start(&api, conf.path(), &[]);
    ctl.wait_ready();
    let lists: Vec<_> = api
        .requests()
        .into_iter()
        .filter(|r| r.path == "/api/v1/pods" && !r.is_watch())
        .collect();
    assert_eq!(lists.len(), 5, "{lists:#?}");
    // The waits double from a second, each between half and all of its
    // nominal length (jitter): at least 0.5, 1, 2 and 4 s. A constant
    // retry would list again after the same short wait every time.
    let gaps: Vec<Duration> = lists.windows(2).map(|w| w[1].at - w[0].at).collect();
    for (i, gap) in gaps.iter().enumerate() {
        let least = Duration::from_millis(500 << i);
        assert!(
            *gap >= least,
            "retry {i} after {gap:?}, at least {least:?}: {gaps:?}"
        );
    }
    // One line per failure, saying when the next attempt comes.
    let log = ctl.log_text();
    let lines = log
        .lines()
        .filter(|l| l.contains("cannot list or watch this node's pods") && l.contains("retry_in="))
        .count();
    assert_eq!(lines, 4, "{log}");
}

/// Whether the server closed `s` (EOF or reset) by `deadline`.
fn closed_by_server(s: &mut TcpStream, deadline: std::time::Instant) -> bool {
    let mut buf = [0u8; 4096];
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        if s.set_read_timeout(Some(left.max(Duration::from_millis(1))))
            .is_err()
        {
            return false;
        }
        match s.read(&mut buf) {
            Ok(0) => return true,
            // An answer (408 and the like) before the close.
            Ok(_) => continue,
            Err(e) => {
                return !matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                );
            }
        }
    }
}

#[test]
fn the_admin_server_closes_slow_and_idle_connections() {
    let api = WatchApiServer::start();
    let conf = ConfDir::new(true);
    let ctl = Controller::start(&api, conf.path(), &[]);
    ctl.wait_ready();
    // Slowloris: a head that never ends, from several peers (the per-peer
    // cap is not what closes them).
    let mut slow: Vec<TcpStream> = (2..12)
        .map(|i| {
            let mut s = testkit::connect_from([127, 0, 0, i].into(), ctl.admin).unwrap();
            s.write_all(b"GET /live HTTP/1.1\r\nHost: admin\r\nX-Slow: ")
                .unwrap();
            s
        })
        .collect();
    // Kept alive after one answered request, then idle.
    let mut idle = TcpStream::connect(ctl.admin).unwrap();
    idle.write_all(b"GET /live HTTP/1.1\r\nHost: admin\r\n\r\n")
        .unwrap();
    let mut head = [0u8; 12];
    idle.read_exact(&mut head).unwrap();
    assert_eq!(&head, b"HTTP/1.1 200");
    let deadline = std::time::Instant::now() + DEADLINE;
    for (i, s) in slow.iter_mut().enumerate() {
        assert!(
            closed_by_server(s, deadline),
            "slow connection {i} still open"
        );
    }
    assert!(
        closed_by_server(&mut idle, deadline),
        "idle connection still open"
    );
}

#[test]
fn the_admin_server_caps_connections_and_keeps_answering_probes() {
    let api = WatchApiServer::start();
    let conf = ConfDir::new(true);
    let ctl = Controller::start(&api, conf.path(), &[]);
    ctl.wait_ready();
    // One peer opens 100 connections and sends nothing; then 25 peers 4
    // each, more than the server's 64.
    let flood = (0..100)
        .map(|_| 2)
        .chain((3..28).flat_map(|i| [i; 4]))
        .map(|i| testkit::connect_from([127, 0, 0, i].into(), ctl.admin).unwrap());
    let mut held: Vec<TcpStream> = flood.collect();
    // The kubelet, from another address, is still answered.
    assert_eq!(ctl.get("/live").0, 200, "{}", ctl.log_text());
    // All but the peer's few were closed at once, and the log says why,
    // once.
    let deadline = std::time::Instant::now() + DEADLINE;
    let closed = held
        .iter_mut()
        .map(|s| closed_by_server(s, deadline))
        .filter(|c| *c)
        .count();
    assert_eq!(closed, 200, "the held ones close at the header timeout");
    ctl.wait("the warning", || {
        ctl.log_text().contains("connection limit")
    });
    let warnings = ctl.log_text().matches("connection limit").count();
    assert_eq!(warnings, 1, "{}", ctl.log_text());
}

#[test]
fn refuses_a_bad_command_line_with_a_clear_message() {
    let out = common::repair_controller()
        .env_remove("LINKERD_CNI_REPAIR_CONTROLLER_NODE_NAME")
        .env_remove("LINKERD_CNI_REPAIR_CONTROLLER_POD_NAME")
        .args(["--controller-pod-name", "p", "--log-format", "yaml"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--log-format"), "{err}");
    assert!(out.stdout.is_empty());
}

#[test]
fn refuses_an_invalid_log_filter() {
    let out = common::repair_controller()
        .args(["--node-name", "n", "--controller-pod-name", "p"])
        .args(["--log-level", "linkerd=notalevel"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("invalid --log-level"), "{err}");
}
