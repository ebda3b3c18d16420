//! The real installer's `/metrics` on a node where the real plugin runs
//! through libcni: a meshed ADD, an unmeshed one, code-11 ADDs
//! (credentials rejected while the installer is alive; the API server
//! failing), a pass-through (the plugin's RBAC gone, which the installer
//! found) and a primary's rewrite each move their counter by exactly what
//! happened, and nothing else moves.
//!
//! The installer listens on the node's loopback (its namespace); the test
//! scrapes from inside it.

use std::collections::BTreeMap;
use std::time::Duration;

use conformance::installer::scrape;
use conformance::{Node, chains, installer, kube};
use testkit::Mode;

/// Scheduling slack on a small shared machine running other tests.
const GRACE: Duration = Duration::from_secs(10);

/// What moved from `before` to `after` (clocks and the pass count aside).
fn moved(before: &BTreeMap<String, f64>, after: &BTreeMap<String, f64>) -> BTreeMap<String, f64> {
    after
        .iter()
        .filter(|(k, _)| {
            !k.contains("timestamp")
                && !k.contains("_sum")
                && !k.contains("credential_age")
                && *k != "linkerd_cni_passes_total"
        })
        .filter_map(|(k, v)| {
            let d = v - before.get(k).copied().unwrap_or(0.0);
            (d != 0.0).then(|| (k.clone(), d))
        })
        .collect()
}

const REPAIRS: &str = "linkerd_cni_chain_repairs_total{cause=\"missing\"}";

fn adds(outcome: &str, cause: &str) -> String {
    format!("linkerd_cni_plugin_adds_total{{outcome=\"{outcome}\",cause=\"{cause}\"}}")
}

#[test]
fn each_add_and_repair_moves_its_counter_by_one() {
    let node = Node::without_linkerd_cni();
    let api = node.start_api_server_only();
    let net = node.network_name("metrics");
    let file = format!("10-{net}.conflist");
    let primary = chains::primary_generation(&node, &net, 0);
    node.write_conf(&file, &primary);
    // A short ADD deadline: rejected credentials are retried within it.
    let (template, desired) = installer::template_with_deadline(&node, 3);
    let inst = installer::start(
        &node,
        &api,
        &[
            ("LINKERD_CNI_RESYNC_SECONDS", "2"),
            ("LINKERD_CNI_METRICS_ADDR", "127.0.0.1:0"),
            ("CNI_NETWORK_CONFIG", &template),
        ],
    );
    node.wait_healthy(&desired, &primary, GRACE)
        .unwrap_or_else(|e| panic!("{e}\n{}", inst.log()));
    let addr = installer::metrics_addr(&inst, GRACE);
    let scrape_when = |key: &str, want: f64| {
        let mut last = BTreeMap::new();
        let reached = testkit::wait_until(GRACE, || {
            last = scrape(&node, addr);
            last.get(key).copied().unwrap_or_default() >= want
        });
        assert!(
            reached,
            "{key} never reached {want}: {last:#?}\n{}",
            inst.log()
        );
        last
    };
    scrape_when(REPAIRS, 1.0);
    // The verdict is recorded at the end of that pass.
    let start = scrape_when("linkerd_cni_chain_healthy{mode=\"inline\"}", 1.0);

    let meshed = node.pod(kube::serve_meshed(&api, "web-0"));
    node.add(&net, &meshed)
        .unwrap_or_else(|e| panic!("meshed ADD: {e}"));
    let plain = node.pod(kube::serve_unmeshed(&api, "plain-0"));
    node.add(&net, &plain)
        .unwrap_or_else(|e| panic!("unmeshed ADD: {e}"));
    // Rejected credentials while the installer is alive: code 11.
    api.set_mode(Mode::Unauthorized);
    let passed = node.pod(kube::serve_meshed(&api, "web-1"));
    let e = node
        .add(&net, &passed)
        .expect_err("the ADD with credentials rejected");
    assert_eq!(e.code, Some(11), "{e}");
    api.set_mode(Mode::Normal);
    // Every attempt of the pod GET fails (the client makes 4): code 11.
    // Only the pod GET's: the installer may ask the API server meanwhile
    // (whether the plugin's credentials, just rejected, may get pods).
    let retried = node.pod(kube::serve_meshed(&api, "web-2"));
    api.fail_next_on(
        &testkit::objects::pod_path(kube::APP_NAMESPACE, "web-2"),
        4,
        503,
    );
    let e = node
        .add(&net, &retried)
        .expect_err("the ADD with the API failing");
    assert_eq!(e.code, Some(11), "{e}");
    // The plugin's RBAC gone (its GETs of pods forbidden): an ADD is asked
    // to try again until the installer, told by the plugin's counters,
    // hears from the API server that the plugin may not get pods and says
    // so in its heartbeat; from then on ADDs pass the pod through. (The
    // installer may have looked already, set off by the rejections above:
    // then the first ADD passes through too. Each is counted as it ended.)
    let rbac_gone = [
        "/api/v1/pods".to_string(),
        testkit::objects::pod_path(kube::APP_NAMESPACE, "web-3"),
        testkit::objects::pod_path(kube::APP_NAMESPACE, "web-4"),
    ];
    for p in &rbac_gone {
        api.forbid(p);
    }
    let refused = node.pod(kube::serve_meshed(&api, "web-3"));
    let first_retried = match node.add(&net, &refused) {
        Err(e) => {
            assert_eq!(e.code, Some(11), "{e}");
            true
        }
        Ok(_) => false,
    };
    let beat = node.state_dir().join("installer-heartbeat.json");
    let denied =
        || std::fs::read_to_string(&beat).is_ok_and(|b| b.contains("\"plugin_access_denied\""));
    assert!(testkit::wait_until(GRACE, denied), "{}", inst.log());
    let through = node.pod(kube::serve_meshed(&api, "web-4"));
    node.add(&net, &through)
        .unwrap_or_else(|e| panic!("the ADD passed through: {e}"));
    assert!(
        through
            .nat_tables()
            .iter()
            .all(|t| t.linkerd_lines().is_empty()),
        "passed through without rules"
    );
    for p in &rbac_gone {
        api.unforbid(p);
    }
    assert!(testkit::wait_until(GRACE, || !denied()), "{}", inst.log());
    // The primary rewrites its file without our entry: one repair.
    node.write_conf(&file, &chains::primary_generation(&node, &net, 1));
    let after = scrape_when(REPAIRS, 2.0);

    let m = moved(&start, &after);
    let buckets: Vec<_> = m
        .keys()
        .filter(|k| k.contains("_bucket{") && !k.contains("+Inf"))
        .cloned()
        .collect();
    let mut want = BTreeMap::from([
        (adds("meshed", ""), 1.0),
        (adds("unmeshed", ""), 1.0),
        (
            adds("try_again", "credentials_rejected"),
            if first_retried { 2.0 } else { 1.0 },
        ),
        (
            adds("passed_through", "forbidden"),
            if first_retried { 1.0 } else { 2.0 },
        ),
        (adds("try_again", "api_unavailable"), 1.0),
        (REPAIRS.to_string(), 1.0),
        ("linkerd_cni_chain_heal_latency_seconds_count".into(), 1.0),
        (
            "linkerd_cni_chain_heal_latency_seconds_bucket{le=\"+Inf\"}".into(),
            1.0,
        ),
    ]);
    // The finite buckets at and above the observed latency: each by one.
    assert!(!buckets.is_empty(), "{m:#?}");
    want.extend(buckets.into_iter().map(|b| (b, 1.0)));
    assert_eq!(m, want, "{}", inst.log());

    for pod in [&meshed, &plain, &passed, &retried, &refused, &through] {
        node.del(&net, pod).unwrap();
    }
}
