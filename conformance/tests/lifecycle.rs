//! A node's life with the real installer, the real plugin, libcni and the
//! fake API server, where credentials come and go as in a cluster: each
//! installer pod has its own service-account token, revoked (401) once the
//! pod object is deleted; the plugin's token is minted by the installer for
//! the plugin's own ServiceAccount and dies with that account.
//!
//! - The DaemonSet is deleted (background cascade: NotFound; foreground:
//!   deletionTimestamp; the whole manifest or chart: both ServiceAccounts
//!   gone too): at SIGTERM the installer unchains the node, then the token
//!   is revoked, and pods, meshed or not, start through libcni.
//! - With the upstream chart's RBAC (no `get daemonsets`, no TokenRequest)
//!   the kubeconfig holds the installer's own token, which it says once;
//!   the installer cannot tell and leaves the node chained; once the token
//!   is revoked the plugin passes every pod through.
//! - A rolling update: the old installer stops (DaemonSet present: the
//!   node stays chained), its token is revoked, the new one starts 5 s
//!   later; the plugin's token outlives the old pod, so every meshed pod
//!   of the gap gets its rules.
//! - Forced answers at SIGTERM while the DaemonSet exists (one 401, one
//!   403, a proxy's HTML 401, a 401 on the DaemonSet after a 200 on the
//!   pod, a stale token in the node's kubeconfig): the node stays chained.
//! - Two installers on one node (a force-delete overlap): the kubeconfig
//!   is written at most 3 times in 10 s, and the node stays chained, also
//!   when the force-deleted one gets SIGTERM.

use std::time::{Duration, Instant};

use conformance::chains::{self, Primary};
use conformance::expect::*;
use conformance::installer::{self, Installer};
use conformance::{Node, kube};
use serde_json::Value;
use testkit::objects::{daemonset, daemonset_path, daemonset_pod, pod_path};
use testkit::{FakeApiServer, TokenPolicy};

const RESYNC: Duration = Duration::from_secs(2);
/// Scheduling slack on a small shared machine running other tests.
const GRACE: Duration = Duration::from_secs(5);
/// The installer's bound at SIGTERM: the API question (5 s for its calls,
/// 2 s for the check of the plugin's token), then the uninstall (a few file
/// operations).
const SIGTERM_BOUND: Duration = Duration::from_secs(7);
const NS: &str = "linkerd-cni";
const DS: &str = "linkerd-cni";
const DS_UID: &str = "5d1e8a7c-0000-4000-8000-00000000d5e7";
/// The plugin's ServiceAccount, whose token the installer mints.
const PLUGIN_SA: &str = "linkerd-cni-plugin";
/// ADDs of one pod a runtime makes when each fails with code 11 (try
/// again later), the first included.
const MAX_ATTEMPTS: u32 = 20;
/// The rolling update's gap between the old pod's end and the new one's
/// start.
const GAP: Duration = Duration::from_secs(5);

const ORDER_WITH: [&str; 4] = ["ptp", "portmap", "tuning", "linkerd-cni"];
const ORDER_WITHOUT: [&str; 3] = ["ptp", "portmap", "tuning"];

fn primary(node: &Node, net: &str) -> Value {
    chains::conflist(
        net,
        "1.0.0",
        chains::typical_chain(node, Primary::Ptp, None),
    )
}

/// An installer pod of the DaemonSet: its pod object, its own token.
struct InstallerPod {
    inst: Installer,
    token: String,
    name: String,
}

fn start_pod(node: &Node, api: &FakeApiServer, name: &str) -> InstallerPod {
    start_pod_with(node, api, name, &[])
}

/// [`start_pod`] with `extra` variables.
fn start_pod_with(
    node: &Node,
    api: &FakeApiServer,
    name: &str,
    extra: &[(&str, &str)],
) -> InstallerPod {
    api.set(&pod_path(NS, name), daemonset_pod(NS, name, DS, DS_UID));
    let token = api.issue_pod_token(NS, "linkerd-cni", name);
    let resync = RESYNC.as_secs().to_string();
    let mut vars = vec![
        ("LINKERD_CNI_RESYNC_SECONDS", resync.as_str()),
        ("LINKERD_CNI_POD_NAME", name),
        ("LINKERD_CNI_POD_NAMESPACE", NS),
    ];
    vars.extend_from_slice(extra);
    let inst = installer::start_with_token(node, api, &token, &vars);
    InstallerPod {
        inst,
        token,
        name: name.to_string(),
    }
}

impl InstallerPod {
    /// SIGTERM, then the exit within the stated bound; then the pod object
    /// goes and its token with it.
    fn stop(mut self, api: &FakeApiServer) -> String {
        let t = Instant::now();
        // SAFETY: kill(2) on our own child, not reaped yet: `self.inst`
        // owns it and only its wait_exit or drop reap it.
        let r = unsafe { libc::kill(self.inst.id() as i32, libc::SIGTERM) };
        assert_eq!(r, 0, "cannot signal the installer");
        let status = self
            .inst
            .wait_exit(SIGTERM_BOUND + GRACE)
            .unwrap_or_else(|| panic!("still running after SIGTERM:\n{}", self.inst.log()));
        eprintln!(
            "installer {} exited {:?} after SIGTERM",
            self.name,
            t.elapsed()
        );
        assert!(status.success(), "{status:?}\n{}", self.inst.log());
        api.remove(&pod_path(NS, &self.name));
        api.revoke_token(&self.token);
        self.inst.log()
    }
}

fn chained_node() -> (Node, FakeApiServer, String, Value, InstallerPod) {
    chained_node_with(TokenPolicy::default(), &[])
}

/// [`chained_node`] with the API server answering TokenRequests as
/// `tokens` says, and the installer started with `extra`.
fn chained_node_with(
    tokens: TokenPolicy,
    extra: &[(&str, &str)],
) -> (Node, FakeApiServer, String, Value, InstallerPod) {
    let node = Node::without_linkerd_cni();
    let api = node.start_api_server_only();
    api.set_tokens(tokens);
    api.set(&daemonset_path(NS, DS), daemonset(NS, DS, DS_UID, false));
    let net = node.network_name("life");
    let conf = primary(&node, &net);
    node.write_conf(&format!("10-{net}.conflist"), &conf);
    let pod = start_pod_with(&node, &api, "linkerd-cni-old", extra);
    node.wait_healthy(&installer::expected_entry(&node), &conf, RESYNC + GRACE)
        .unwrap_or_else(|e| panic!("{e}\n{}", pod.inst.log()));
    (node, api, net, conf, pod)
}

/// Adds a pod through libcni; the run's plugins, or the failure.
fn add(node: &Node, net: &str, spec: conformance::PodSpec) -> Result<Vec<String>, String> {
    let pod = node.pod(spec);
    let out = node.add(net, &pod);
    let res = match &out {
        Ok(run) => Ok(steps(run)
            .into_iter()
            .filter(|(c, _)| c == "ADD")
            .map(|(_, p)| p)
            .collect()),
        Err(f) => Err(format!("{f:?}")),
    };
    if out.is_ok() {
        let rules = pod
            .nat_tables()
            .iter()
            .any(|t| !t.linkerd_lines().is_empty());
        node.del(net, &pod).unwrap();
        if rules {
            return res.map(|mut v: Vec<String>| {
                v.push("(rules)".into());
                v
            });
        }
    }
    res
}

fn uninstalled(node: &Node, conf: &Value) {
    let on_disk: Value =
        serde_json::from_slice(&std::fs::read(node.active_conf().unwrap()).unwrap()).unwrap();
    assert_eq!(&on_disk, conf, "the primary's config, without linkerd-cni");
    assert_eq!(
        node.conf_dir_names(),
        [format!("10-{}.conflist", conf["name"].as_str().unwrap())],
        "kubeconfig and entry file removed"
    );
    assert!(
        !node.bin_dir().join("linkerd-cni").exists(),
        "binary removed"
    );
}

/// Ways a DaemonSet goes, as the installer's pods see them at SIGTERM.
#[derive(Debug, Clone, Copy)]
enum Deletion {
    /// `kubectl delete daemonset` (background cascade): NotFound.
    Background,
    /// `kubectl delete --cascade=foreground`: a deletionTimestamp.
    Foreground,
    /// `kubectl delete -f` of the manifest or `helm uninstall`: by the time
    /// the pods get SIGTERM both ServiceAccounts are gone (their tokens get
    /// 401), whatever RBAC there was (here without daemonsets) with them.
    Everything,
}

/// Each deletion: unchained at SIGTERM, within the stated bound; then, the
/// token revoked, pods start through libcni.
#[test]
fn deleting_the_daemonset_unchains_the_node() {
    for deletion in [
        Deletion::Background,
        Deletion::Foreground,
        Deletion::Everything,
    ] {
        let (node, api, net, conf, pod) = chained_node();
        let meshed = add(&node, &net, kube::serve_meshed(&api, "web-0")).unwrap();
        assert_eq!(meshed.last().map(String::as_str), Some("(rules)"));

        match deletion {
            Deletion::Background => api.remove(&daemonset_path(NS, DS)),
            Deletion::Foreground => {
                api.set(&daemonset_path(NS, DS), daemonset(NS, DS, DS_UID, true))
            }
            Deletion::Everything => {
                api.forbid(&daemonset_path(NS, DS));
                api.remove(&daemonset_path(NS, DS));
                api.revoke_token(&pod.token);
                api.delete_account(NS, PLUGIN_SA);
            }
        }
        let log = pod.stop(&api);
        assert!(log.contains("uninstalling"), "{deletion:?}: {log}");
        uninstalled(&node, &conf);

        for (spec, what) in [
            (kube::serve_unmeshed(&api, "plain-1"), "unmeshed"),
            (kube::serve_meshed(&api, "web-1"), "meshed"),
        ] {
            let steps = add(&node, &net, spec)
                .unwrap_or_else(|e| panic!("{deletion:?}: {what} pod after uninstall: {e}"));
            assert_eq!(steps, ORDER_WITHOUT, "{deletion:?}: {what}");
        }
        expect_no_reserved_ips(&node, &net);
    }
}

/// The upstream chart's RBAC has no `get daemonsets` and no TokenRequest:
/// the kubeconfig holds the installer's own token, which it says once in
/// one line. After `kubectl delete daemonset` alone (the ServiceAccount and
/// its RBAC stay) the installer cannot tell, leaves the node chained and
/// says why. Once its token is revoked, every pod still starts: the plugin
/// passes them through (a meshed one unredirected, which linkerd's
/// network-validator then refuses).
#[test]
fn without_rbac_for_daemonsets_the_plugin_passes_pods_through() {
    let (node, api, net, conf, pod) = chained_node_with(
        TokenPolicy {
            allowed: false,
            ..TokenPolicy::default()
        },
        &[],
    );
    let kubeconfig = std::fs::read_to_string(node.kubeconfig_path()).unwrap();
    assert!(kubeconfig.contains(&pod.token), "the installer's own token");
    // Another pass (the primary rewrote its file): still said once.
    node.write_conf(&format!("10-{net}.conflist"), &conf);
    node.wait_healthy(&installer::expected_entry(&node), &conf, RESYNC + GRACE)
        .unwrap();
    let said = pod.inst.log().matches("may not request a token").count();
    assert_eq!(said, 1, "{}", pod.inst.log());
    api.forbid(&daemonset_path(NS, DS));
    api.remove(&daemonset_path(NS, DS));
    api.add_namespace(NS, &[]);
    let log = pod.stop(&api);
    assert!(
        log.contains("cannot tell whether the DaemonSet is being deleted"),
        "{log}"
    );
    assert!(log.contains("HTTP 403"), "{log}");
    node.healthy_now(&conf);

    let plain = add(&node, &net, kube::serve_unmeshed(&api, "plain-0")).unwrap();
    assert_eq!(plain, ORDER_WITH);
    let meshed = add(&node, &net, kube::serve_meshed(&api, "web-0")).unwrap();
    assert_eq!(meshed, ORDER_WITH, "passed through, without rules");
    expect_no_reserved_ips(&node, &net);
}

/// Adds a pod as a runtime does: an ADD that fails with code 11 (try
/// again later) is tried again, up to [`MAX_ATTEMPTS`] in all. The last
/// outcome, and the retries.
fn add_retrying(
    node: &Node,
    net: &str,
    spec: impl Fn() -> conformance::PodSpec,
) -> (Result<Vec<String>, String>, u32) {
    let mut retries = 0;
    loop {
        let out = add(node, net, spec());
        match &out {
            Err(e) if e.contains("CNI error: code 11,") && retries + 1 < MAX_ATTEMPTS => {
                retries += 1;
            }
            _ => return (out, retries),
        }
    }
}

/// A rolling update: the old installer stops (the DaemonSet is present:
/// everything stays), its token is revoked, the new installer starts 5 s
/// later. ADDs keep coming through the gap, meshed and unmeshed: the
/// plugin's own token outlives the old pod, so no meshed pod starts
/// without its rules and none fails for good; retries (code 11) are
/// counted. The new installer keeps the plugin's token: no rewrite.
#[test]
fn rolling_update_gap() {
    let (node, api, net, conf, old) = chained_node();
    let plugin_token = std::fs::read_to_string(node.kubeconfig_path()).unwrap();
    assert!(
        !plugin_token.contains(&old.token),
        "the plugin's token, not the pod's"
    );
    let log = old.stop(&api);
    assert!(log.contains("a rolling update or a restart"), "{log}");
    node.healthy_now(&conf);

    let gap_end = Instant::now() + GAP;
    let (mut n, mut failed_meshed, mut failed_plain, mut unredirected, mut retries) =
        (0, 0, 0, 0, 0);
    while Instant::now() < gap_end {
        for meshed in [true, false] {
            let name = format!("{}-{n}", if meshed { "web" } else { "plain" });
            let spec = || {
                if meshed {
                    kube::serve_meshed(&api, &name)
                } else {
                    kube::serve_unmeshed(&api, &name)
                }
            };
            let (out, r) = add_retrying(&node, &net, spec);
            retries += r;
            match out {
                Err(e) => {
                    eprintln!("gap: {name}: {e}");
                    if meshed {
                        failed_meshed += 1;
                    } else {
                        failed_plain += 1;
                    }
                }
                Ok(steps) => {
                    if meshed && steps.last().map(String::as_str) != Some("(rules)") {
                        unredirected += 1;
                    }
                }
            }
        }
        n += 1;
    }
    eprintln!(
        "rolling update, {GAP:?} gap: {n} meshed and {n} unmeshed ADDs; failed for good: {failed_meshed} meshed, {failed_plain} unmeshed; meshed started without rules: {unredirected}; retries (code 11): {retries}"
    );
    assert!(n > 0);
    assert_eq!(failed_plain, 0, "unmeshed pods failed in the gap");
    assert_eq!(failed_meshed, 0, "meshed pods failed for good in the gap");
    assert_eq!(
        unredirected, 0,
        "meshed pods started without rules in the gap"
    );

    let new = start_pod(&node, &api, "linkerd-cni-new");
    node.wait_healthy(&installer::expected_entry(&node), &conf, RESYNC + GRACE)
        .unwrap();
    assert!(new.inst.wait_log("starting:", GRACE), "{}", new.inst.log());
    let meshed = add(&node, &net, kube::serve_meshed(&api, "web-after")).unwrap();
    assert_eq!(meshed.last().map(String::as_str), Some("(rules)"));
    assert_eq!(
        std::fs::read_to_string(node.kubeconfig_path()).unwrap(),
        plugin_token,
        "the new installer kept the plugin's token"
    );
    expect_no_reserved_ips(&node, &net);
}

/// Starts an installer with the watch off and a long resync, so that no
/// pass runs between a change the test makes and its SIGTERM.
fn quiet_node() -> (Node, FakeApiServer, String, Value, InstallerPod) {
    chained_node_with(
        TokenPolicy::default(),
        &[
            ("LINKERD_CNI_WATCH", "false"),
            ("LINKERD_CNI_RESYNC_SECONDS", "600"),
        ],
    )
}

/// Forced answers at SIGTERM while the DaemonSet exists: none uninstalls;
/// the question is asked with the pod's own token. With the DaemonSet
/// NotFound or being deleted: uninstall.
#[test]
fn forced_answers_at_sigterm() {
    type Force = fn(&FakeApiServer, &Node);
    let cases: [(&str, Force); 5] = [
        ("one 401", |api, _| {
            api.fail_next_on(&pod_path(NS, "linkerd-cni-old"), 1, 401)
        }),
        ("one 403", |api, _| {
            api.fail_next_on(&pod_path(NS, "linkerd-cni-old"), 1, 403)
        }),
        ("an HTML 401", |api, _| {
            api.fail_next_with(
                1,
                401,
                "<html><body><h1>401 Authorization Required</h1></body></html>",
            )
        }),
        ("a 401 on the DaemonSet after a 200 on the pod", |api, _| {
            api.fail_next_on(&daemonset_path(NS, DS), 1, 401)
        }),
        ("a stale node token", |api, node| {
            // A token in the node's kubeconfig that the API server rejects
            // (another installer's, since deleted).
            let stale = api.issue_token();
            api.revoke_token(&stale);
            let path = node.kubeconfig_path();
            let text = std::fs::read_to_string(&path).unwrap();
            let token = text
                .lines()
                .find_map(|l| l.strip_prefix("    token: "))
                .unwrap()
                .to_string();
            std::fs::write(&path, text.replace(&token, &format!("{stale:?}"))).unwrap();
        }),
    ];
    for (what, force) in cases {
        let (node, api, _net, conf, pod) = quiet_node();
        force(&api, &node);
        let own = pod.token.clone();
        let log = pod.stop(&api);
        assert!(log.contains("stays installed and chained"), "{what}: {log}");
        assert!(!log.contains("uninstalling"), "{what}: {log}");
        node.wait_healthy(&installer::expected_entry(&node), &conf, Duration::ZERO)
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        let asked = api.bearers(&pod_path(NS, "linkerd-cni-old"));
        assert!(
            !asked.is_empty() && asked.iter().all(|t| *t == own),
            "{what}: asked with the pod's own token only"
        );
    }
    for gone in ["not found", "being deleted"] {
        let (node, api, _net, conf, pod) = quiet_node();
        if gone == "not found" {
            api.remove(&daemonset_path(NS, DS));
        } else {
            api.set(&daemonset_path(NS, DS), daemonset(NS, DS, DS_UID, true));
        }
        let log = pod.stop(&api);
        assert!(log.contains("uninstalling"), "{gone}: {log}");
        uninstalled(&node, &conf);
    }
}

/// Kubeconfig writes an installer logged.
fn writes_in(inst: &Installer) -> usize {
    inst.log()
        .lines()
        .filter(|l| l.contains(" wrote ") && l.contains("ZZZ-linkerd-cni-kubeconfig: it was"))
        .count()
}

/// Two installers on the node for 10 s: the node must stay chained at
/// every check; at most 3 kubeconfig writes between them (`before`: the
/// first one's writes before the second started). The writes.
fn overlap_for_10_s(
    node: &Node,
    conf: &Value,
    (first, second): (&InstallerPod, &InstallerPod),
    before: usize,
) -> usize {
    let until = Instant::now() + Duration::from_secs(10);
    let mut checks = 0;
    while Instant::now() < until {
        node.wait_healthy(&installer::expected_entry(node), conf, Duration::ZERO)
            .unwrap_or_else(|e| panic!("unchained with two installers: {e}"));
        checks += 1;
        std::thread::sleep(Duration::from_millis(50));
    }
    let n = writes_in(&first.inst) + writes_in(&second.inst) - before;
    eprintln!("two installers, 10 s: {n} kubeconfig writes; chained at each of {checks} checks");
    assert!(
        n <= 3,
        "{n} kubeconfig writes:\n{}\n{}",
        first.inst.log(),
        second.inst.log()
    );
    n
}

/// Two installers on one node under the upstream chart's RBAC (no
/// TokenRequest: each has only its own pod's token): the second keeps the
/// first one's token while it is accepted, so no write for 10 s and the
/// node stays chained; once the first is force-deleted (its token
/// revoked), the second writes its own within a pass.
#[test]
fn two_installers_converge_under_the_chart_rbac() {
    let (node, api, _net, conf, first) = chained_node_with(
        TokenPolicy {
            allowed: false,
            ..TokenPolicy::default()
        },
        &[],
    );
    let before = writes_in(&first.inst);
    let second = start_pod(&node, &api, "linkerd-cni-surge");
    overlap_for_10_s(&node, &conf, (&first, &second), before);
    api.remove(&pod_path(NS, &first.name));
    api.revoke_token(&first.token);
    assert!(
        testkit::wait_until(RESYNC + GRACE, || std::fs::read_to_string(
            node.kubeconfig_path()
        )
        .is_ok_and(|k| k.contains(&second.token))),
        "the second installer did not take over:\n{}",
        second.inst.log()
    );
    drop(first);
    node.healthy_now(&conf);
}

/// Two installers on one node for 10 s (a force-delete overlap, a
/// `maxSurge` rollout): at most 3 kubeconfig writes, and the node stays
/// chained throughout; the force-deleted one (pod gone, token revoked)
/// gets SIGTERM and leaves the node to the other.
#[test]
fn two_installers_converge() {
    let (node, api, net, conf, first) = chained_node();
    let before = writes_in(&first.inst);
    assert_eq!(
        before,
        1,
        "the first installer's own write:\n{}",
        first.inst.log()
    );
    let second = start_pod(&node, &api, "linkerd-cni-surge");
    overlap_for_10_s(&node, &conf, (&first, &second), before);

    // The first is force-deleted: its pod object goes and its token with
    // it, then it gets SIGTERM while the second runs.
    api.remove(&pod_path(NS, &first.name));
    api.revoke_token(&first.token);
    let log = first.stop(&api);
    assert!(!log.contains("uninstalling"), "{log}");
    node.healthy_now(&conf);
    let meshed = add(&node, &net, kube::serve_meshed(&api, "web-overlap")).unwrap();
    assert_eq!(meshed.last().map(String::as_str), Some("(rules)"));
    drop(second);
}

trait HealthyNow {
    fn healthy_now(&self, primary: &Value);
}

impl HealthyNow for Node {
    /// Still chained, with the kubeconfig and the binary in place.
    fn healthy_now(&self, primary: &Value) {
        self.wait_healthy(&installer::expected_entry(self), primary, Duration::ZERO)
            .unwrap();
        assert!(self.kubeconfig_path().exists());
        assert!(self.bin_dir().join("linkerd-cni").exists());
    }
}

/// A server that grants 10 s tokens: the installer replaces the plugin's
/// token before it expires (past half its lifetime, at its next pass),
/// every time; the kubeconfig never holds an expired one, and each
/// replacement is one write.
#[test]
fn the_plugins_token_is_refreshed_before_expiry() {
    let lifetime = Duration::from_secs(10);
    let (node, api, _net, _conf, pod) = chained_node_with(
        TokenPolicy {
            max_lifetime: Some(lifetime),
            ..TokenPolicy::default()
        },
        &[],
    );
    let token_now = || {
        let text = std::fs::read_to_string(node.kubeconfig_path()).unwrap();
        let line = text
            .lines()
            .find_map(|l| l.strip_prefix("    token: "))
            .unwrap()
            .to_string();
        serde_json::from_str::<String>(&line).unwrap()
    };
    let mut seen = vec![token_now()];
    let until = Instant::now() + lifetime * 2;
    while Instant::now() < until {
        let t = token_now();
        let minted = api.minted();
        let m = minted
            .iter()
            .find(|m| m.token == t)
            .expect("the kubeconfig holds a minted token");
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs();
        assert!(m.expires > now, "the kubeconfig holds an expired token");
        if seen.last() != Some(&t) {
            seen.push(t);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let writes = pod
        .inst
        .log()
        .lines()
        .filter(|l| l.contains(" wrote ") && l.contains("ZZZ-linkerd-cni-kubeconfig: it was"))
        .count();
    eprintln!(
        "10 s tokens over 20 s: {} tokens in the kubeconfig, {writes} writes, {} minted",
        seen.len(),
        api.minted().len()
    );
    assert!(
        seen.len() >= 3,
        "replaced before expiry: {}",
        pod.inst.log()
    );
    assert_eq!(writes, seen.len(), "one write per token");
}
