//! The Kubernetes side of ADD against a fake API server over real TLS: which
//! pods are meshed, with which settings, with how many API calls, and how
//! failures of the API server surface.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use linkerd_cni::cni::code;
use linkerd_cni::config::PluginConfig;
use linkerd_cni::iptables::rules::{self, Rule};
use linkerd_cni::pod::{self, Plan, Stop, annotation};
use serde_json::{Value, json};
use testkit::objects::{KUBERNETES_SERVICE_PATH, Pod, kubernetes_service, namespace_path};
use testkit::{FakeApiServer, Mode, TempDir};

use common::{Cluster, cni_env, failed, invocation, mesh, netconf, outbound_ignored};

fn cluster() -> Cluster {
    Cluster::start("kube")
}

impl Cluster {
    fn decide_with(&self, pod: Option<(&str, &str)>, conf: &Value) -> Result<Plan, Stop> {
        let env = cni_env("ADD", Path::new("/run/netns/unused"), pod);
        let inv = invocation(&env, conf);
        let config = PluginConfig::from_map(&inv.conf.raw)?;
        pod::decide(&inv, &config)
    }

    fn decide(&self, ns: &str, name: &str) -> Result<Plan, Stop> {
        self.decide_with(Some((ns, name)), &netconf(&self.kubeconfig, json!({})))
    }
}

fn pass(d: Result<Plan, Stop>) -> String {
    match d {
        Err(Stop::PassThrough { why, .. }) => why,
        other => panic!("expected pass-through, got {other:?}"),
    }
}

#[test]
fn meshed_pod_gets_the_default_rules_with_one_pod_and_one_namespace_call() {
    let c = cluster();
    let p = Pod::meshed("emojivoto", "web-0");
    c.api.add_pod(&p);
    c.api.add_namespace("emojivoto", &[]);
    let plan = mesh(c.decide("emojivoto", "web-0"));
    assert_eq!(plan.pod, "emojivoto/web-0");
    assert_eq!(plan.spec, rules::RedirectSpec::default());
    assert_eq!(plan.rule_sets.len(), 1);
    assert_eq!(c.api.requests(&p.path()), 1);
    assert_eq!(c.api.requests(&namespace_path("emojivoto")), 1);
    assert_eq!(c.api.requests(KUBERNETES_SERVICE_PATH), 0);
}

#[test]
fn pod_without_proxy_passes_through_after_one_call() {
    let c = cluster();
    let p = Pod::new("emojivoto", "plain-0");
    c.api.add_pod(&p);
    let why = pass(c.decide("emojivoto", "plain-0"));
    assert!(why.contains("no linkerd-proxy"), "{why}");
    assert_eq!(c.api.total_requests(), 1);
}

#[test]
fn pod_with_linkerd_init_passes_through() {
    let c = cluster();
    c.api
        .add_pod(&Pod::meshed("emojivoto", "old-0").init_container("linkerd-init"));
    let why = pass(c.decide("emojivoto", "old-0"));
    assert!(why.contains("linkerd-init"), "{why}");
    assert_eq!(c.api.total_requests(), 1);
}

#[test]
fn native_sidecar_proxy_is_meshed() {
    let c = cluster();
    c.api
        .add_pod(&Pod::new("emojivoto", "sidecar-0").native_sidecar("linkerd-proxy"));
    c.api.add_namespace("emojivoto", &[]);
    mesh(c.decide("emojivoto", "sidecar-0"));
}

#[test]
fn control_plane_pod_skips_the_api_server_ports() {
    let c = cluster();
    c.api.add_pod(
        &Pod::meshed("linkerd", "destination-0")
            .label("linkerd.io/control-plane-component", "destination")
            .annotation(annotation::SKIP_OUTBOUND_PORTS, "4567"),
    );
    c.api.add_namespace("linkerd", &[]);
    c.api.set(
        KUBERNETES_SERVICE_PATH,
        kubernetes_service(&[(443, json!(6443)), (8443, json!("https"))]),
    );
    let plan = mesh(c.decide("linkerd", "destination-0"));
    // Annotation first (it replaces the list), then port and numeric targetPort.
    assert_eq!(outbound_ignored(&plan), "4567,443,6443,8443");
    assert_eq!(c.api.requests(KUBERNETES_SERVICE_PATH), 1);
    assert!(
        plan.rule_sets[0]
            .output
            .iter()
            .any(|r| r.spec().contains("--dports 4567,443,6443,8443 ")),
        "{:?}",
        plan.rule_sets[0].output
    );
}

#[test]
fn control_plane_pod_falls_back_to_443_and_6443() {
    let c = cluster();
    c.api.add_pod(
        &Pod::meshed("linkerd", "identity-0")
            .label("linkerd.io/control-plane-component", "identity"),
    );
    c.api.add_namespace("linkerd", &[]);
    // No Service registered: 404.
    let plan = mesh(c.decide("linkerd", "identity-0"));
    assert_eq!(outbound_ignored(&plan), "443,6443");
    assert_eq!(c.api.requests(KUBERNETES_SERVICE_PATH), 1);
}

#[test]
fn empty_control_plane_label_is_not_control_plane() {
    let c = cluster();
    c.api
        .add_pod(&Pod::meshed("emojivoto", "x-0").label("linkerd.io/control-plane-component", ""));
    c.api.add_namespace("emojivoto", &[]);
    let plan = mesh(c.decide("emojivoto", "x-0"));
    assert_eq!(outbound_ignored(&plan), "");
    assert_eq!(c.api.requests(KUBERNETES_SERVICE_PATH), 0);
}

#[test]
fn annotations_only_on_the_namespace_are_fetched_once() {
    let c = cluster();
    c.api.add_pod(&Pod::meshed("payments", "api-0"));
    c.api.add_namespace(
        "payments",
        &[
            (annotation::SKIP_OUTBOUND_PORTS, "5432,6379"),
            (annotation::SKIP_INBOUND_PORTS, "9000-9100"),
            (annotation::SKIP_SUBNETS, "10.96.0.0/12"),
            (annotation::PROXY_UID, "3000"),
            (annotation::PROXY_GID, "3001"),
        ],
    );
    let plan = mesh(c.decide("payments", "api-0"));
    assert_eq!(c.api.requests(&namespace_path("payments")), 1);
    assert_eq!(outbound_ignored(&plan), "5432,6379");
    let set = &plan.rule_sets[0];
    assert_eq!(set.output[0], Rule::IgnoreUid(3000));
    assert_eq!(set.output[1], Rule::IgnoreGid(3001));
    let specs: Vec<String> = set.redirect.iter().map(Rule::spec).collect();
    assert!(
        specs[0].contains("--dports 4191,4190,9000:9100 "),
        "{specs:?}"
    );
    assert!(specs[1].starts_with("-s 10.96.0.0/12 "), "{specs:?}");
}

#[test]
fn all_annotations_on_the_pod_need_no_namespace_call() {
    let c = cluster();
    let mut p = Pod::meshed("payments", "full-0");
    for (k, v) in [
        (annotation::SKIP_OUTBOUND_PORTS, "1"),
        (annotation::SKIP_INBOUND_PORTS, "2"),
        (annotation::SKIP_SUBNETS, "10.0.0.0/8"),
        (annotation::PROXY_UID, "5"),
        (annotation::PROXY_GID, "6"),
    ] {
        p = p.annotation(k, v);
    }
    c.api.add_pod(&p);
    mesh(c.decide("payments", "full-0"));
    assert_eq!(c.api.requests(&namespace_path("payments")), 0);
    assert_eq!(c.api.total_requests(), 1);
}

#[test]
fn malformed_annotation_is_an_error_naming_it() {
    let c = cluster();
    c.api.add_pod(
        &Pod::meshed("emojivoto", "bad-0").annotation(annotation::SKIP_INBOUND_PORTS, "8080,http"),
    );
    c.api.add_namespace("emojivoto", &[]);
    let e = failed(c.decide("emojivoto", "bad-0"));
    assert_eq!(e.code, code::INVALID_ANNOTATION);
    assert!(
        e.msg
            .contains("config.linkerd.io/skip-inbound-ports=\"8080,http\""),
        "{e}"
    );
    assert!(e.details.contains("\"http\" is not a port"), "{e}");

    c.api
        .add_namespace("emojivoto", &[(annotation::PROXY_UID, "proxy")]);
    c.api.add_pod(&Pod::meshed("emojivoto", "bad-1"));
    let e = failed(c.decide("emojivoto", "bad-1"));
    assert_eq!(e.code, code::INVALID_ANNOTATION);
    assert!(
        e.msg
            .contains("config.linkerd.io/proxy-uid=\"proxy\" on namespace emojivoto (read for pod emojivoto/bad-1)"),
        "{e}"
    );
}

/// Rejected credentials (a revoked token, RBAC without pods) and no
/// installer alive (no heartbeat): the plugin cannot tell whether the pod
/// is meshed and passes it through after a few attempts, saying why and
/// what to do.
#[test]
fn rejected_credentials_pass_the_pod_through() {
    for (mode, status) in [(Mode::Unauthorized, "401"), (Mode::Forbidden, "403")] {
        let c = cluster();
        c.api.add_pod(&Pod::meshed("emojivoto", "web-0"));
        c.api.set_mode(mode);
        let why = pass(c.decide("emojivoto", "web-0"));
        assert!(why.contains(&format!("HTTP {status}")), "{why}");
        assert!(why.contains("WITHOUT linkerd's redirect rules"), "{why}");
        assert!(why.contains("stale or lacks RBAC"), "{why}");
        assert!(why.contains("installer"), "{why}");
        assert!(why.contains(c.kubeconfig.to_str().unwrap()), "{why}");
        assert!(why.contains("no installer heartbeat"), "{why}");
        assert_eq!(c.api.total_requests(), pod::CONFIRM_ATTEMPTS as usize);
    }
}

/// A revoked token of its own: the pod GET is refused and the pod passes.
#[test]
fn revoked_token_passes_the_pod_through() {
    let c = cluster();
    c.api.add_pod(&Pod::meshed("emojivoto", "web-0"));
    c.api.add_namespace("emojivoto", &[]);
    mesh(c.decide("emojivoto", "web-0"));
    c.api.revoke_token(c.api.token());
    let why = pass(c.decide("emojivoto", "web-0"));
    assert!(why.contains("HTTP 401"), "{why}");
}

#[test]
fn wrong_token_is_refused() {
    let c = cluster();
    c.api.add_pod(&Pod::meshed("emojivoto", "web-0"));
    let text = std::fs::read_to_string(&c.kubeconfig)
        .unwrap()
        .replace(c.api.token(), "not-the-token");
    std::fs::write(&c.kubeconfig, text).unwrap();
    let why = pass(c.decide("emojivoto", "web-0"));
    assert!(why.contains("HTTP 401"), "{why}");
}

/// The client's buffers are small, so a long token (a request head larger
/// than the smallest buffer) and a large pod (an answer many times the
/// buffer) must still go through whole.
#[test]
fn long_tokens_and_large_pods_fit_the_small_buffers() {
    let c = cluster();
    let mut pod = Pod::meshed("emojivoto", "web-0");
    let big = "v".repeat(64 << 10);
    for i in 0..32 {
        pod = pod.annotation(&format!("example.com/filler-{i}"), &big);
    }
    pod = pod.annotation(annotation::PROXY_UID, "2103");
    c.api.add_pod(&pod);
    c.api.add_namespace("emojivoto", &[]);
    let token = "t".repeat(40 << 10);
    c.api.accept_token(&token);
    let text = std::fs::read_to_string(&c.kubeconfig)
        .unwrap()
        .replace(c.api.token(), &token);
    std::fs::write(&c.kubeconfig, text).unwrap();
    let plan = mesh(c.decide("emojivoto", "web-0"));
    assert_eq!(plan.spec.proxy_uid, 2103);
}

#[test]
fn unknown_ca_is_a_tls_error() {
    let c = cluster();
    let other = testkit::pki::TestPki::new();
    let text = c.api.kubeconfig_yaml();
    let ours = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("certificate-authority-data: "))
        .unwrap()
        .to_string();
    use base64::Engine;
    let theirs = base64::engine::general_purpose::STANDARD.encode(other.ca_pem);
    std::fs::write(&c.kubeconfig, text.replace(&ours, &theirs)).unwrap();
    let e = failed(c.decide("emojivoto", "web-0"));
    assert_eq!(e.code, code::KUBERNETES);
    assert!(e.msg.contains("TLS"), "{e}");
    assert!(e.details.contains("certificate-authority"), "{e}");
}

#[test]
fn transient_errors_are_retried() {
    let c = cluster();
    let p = Pod::meshed("emojivoto", "web-0");
    c.api.add_pod(&p);
    c.api.add_namespace("emojivoto", &[]);
    c.api.fail_next(2, 503);
    mesh(c.decide("emojivoto", "web-0"));
    assert_eq!(c.api.requests(&p.path()), 3);

    c.api.fail_next(1, 429);
    mesh(c.decide("emojivoto", "web-0"));
    assert_eq!(c.api.requests(&p.path()), 5);

    // Retries are bounded: a server that keeps failing fails the ADD.
    c.api.fail_next(100, 500);
    let e = failed(c.decide("emojivoto", "web-0"));
    assert!(e.msg.contains("HTTP 500"), "{e}");
    assert_eq!(e.code, code::TRY_AGAIN_LATER);
    assert_eq!(c.api.requests(&p.path()), 5 + 4);
}

#[test]
fn slow_server_fails_within_the_budget() {
    let c = cluster();
    c.api.add_pod(&Pod::meshed("emojivoto", "web-0"));
    c.api.set_mode(Mode::Slow(Duration::from_secs(5)));
    let mut conf = netconf(&c.kubeconfig, json!({}));
    conf["kubernetes"]["api-budget-seconds"] = json!(0.5);
    let start = Instant::now();
    let e = failed(c.decide_with(Some(("emojivoto", "web-0")), &conf));
    let took = start.elapsed();
    assert_eq!(e.code, code::TRY_AGAIN_LATER);
    assert!(e.msg.contains("within linkerd-cni's 0.5 s budget"), "{e}");
    // Bounded by the budget, not by the server's 5 s.
    assert!(took < Duration::from_secs(3), "took {took:?}");
}

#[test]
fn server_down_is_unreachable() {
    let mut c = cluster();
    c.api.stop();
    let start = Instant::now();
    let e = failed(c.decide("emojivoto", "web-0"));
    let took = start.elapsed();
    assert_eq!(e.code, code::TRY_AGAIN_LATER);
    assert!(
        e.msg
            .contains("cannot reach the Kubernetes API at https://127.0.0.1:"),
        "{e}"
    );
    assert!(e.msg.contains("4 attempts"), "{e}");
    assert!(took < Duration::from_secs(10), "took {took:?}");
}

#[test]
fn exempt_namespaces_and_non_pods_make_no_call() {
    let mut c = cluster();
    let conf = netconf(&c.kubeconfig, json!({}));
    for ns in ["kube-system", "linkerd-cni"] {
        let why = pass(c.decide_with(Some((ns, "x")), &conf));
        assert!(why.contains("exempt"), "{why}");
    }
    let why = pass(c.decide_with(None, &conf));
    assert!(why.contains("CNI_ARGS"), "{why}");
    assert_eq!(c.api.connections(), 0);

    // A configured list replaces the default one.
    let mut conf = conf.clone();
    conf["exempt-namespaces"] = json!(["tools"]);
    pass(c.decide_with(Some(("tools", "x")), &conf));
    assert_eq!(c.api.connections(), 0);
    c.api.stop();
    assert!(matches!(
        c.decide_with(Some(("kube-system", "x")), &conf),
        Err(Stop::Failed(_))
    ));
}

#[test]
fn kubeconfig_problems_name_the_file() {
    let c = cluster();
    // Missing (an uninstall under way): the pod passes, saying why.
    let missing = c.kubeconfig.with_file_name("nope");
    let conf = netconf(&missing, json!({}));
    let why = pass(c.decide_with(Some(("emojivoto", "web-0")), &conf));
    assert!(why.contains(missing.to_str().unwrap()), "{why}");
    assert!(why.contains("does not exist"), "{why}");

    std::fs::write(&c.kubeconfig, "clusters: [").unwrap();
    let conf = netconf(&c.kubeconfig, json!({}));
    let e = failed(c.decide_with(Some(("emojivoto", "web-0")), &conf));
    assert!(
        e.msg.contains(c.kubeconfig.to_str().unwrap()) && e.msg.contains("YAML"),
        "{e}"
    );
    assert_eq!(c.api.connections(), 0);
}

#[test]
fn ipv6_plans_both_families_each_with_its_cidrs() {
    let c = cluster();
    c.api.add_pod(
        &Pod::meshed("emojivoto", "web-0")
            .annotation(annotation::SKIP_SUBNETS, "10.0.0.0/8,fd00::/8"),
    );
    c.api.add_namespace("emojivoto", &[]);
    let conf = netconf(&c.kubeconfig, json!({"ipv6": true}));
    let plan = mesh(c.decide_with(Some(("emojivoto", "web-0")), &conf));
    assert_eq!(plan.rule_sets.len(), 2);
    let subnets = |i: usize| -> Vec<String> {
        plan.rule_sets[i]
            .redirect
            .iter()
            .filter_map(|r| match r {
                Rule::IgnoreSubnet(s) => Some(s.given.clone()),
                _ => None,
            })
            .collect()
    };
    assert_eq!(subnets(0), ["10.0.0.0/8"]);
    assert_eq!(subnets(1), ["fd00::/8"]);
}

#[test]
fn api_server_inside_a_node_netns_is_reachable_only_from_there() {
    let node = testkit::TestNetns::new("node").unwrap();
    let mut api = FakeApiServer::start_in_netns(node.path()).unwrap();
    let dir = TempDir::new("kube-ns").unwrap();
    let kubeconfig = api.write_kubeconfig(dir.path()).unwrap();
    api.add_pod(&Pod::meshed("emojivoto", "web-0"));
    api.add_namespace("emojivoto", &[]);
    let conf = netconf(&kubeconfig, json!({}));
    let env = cni_env(
        "ADD",
        Path::new("/run/netns/unused"),
        Some(("emojivoto", "web-0")),
    );
    let decide = || {
        let inv = invocation(&env, &conf);
        pod::decide(&inv, &PluginConfig::from_map(&inv.conf.raw).unwrap())
    };

    let d = linkerd_cni::netns::run_in(node.path(), decide).unwrap();
    mesh(d);
    assert_eq!(api.total_requests(), 2);

    // The host's loopback is another one.
    let e = failed(decide());
    assert!(e.msg.contains("cannot reach"), "{e}");
    assert_eq!(api.total_requests(), 2);

    api.stop();
    let e = failed(linkerd_cni::netns::run_in(node.path(), decide).unwrap());
    assert!(e.msg.contains("cannot reach"), "{e}");
}
