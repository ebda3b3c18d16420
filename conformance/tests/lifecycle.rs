//! A node's life with the real installer, the real plugin, libcni and the
//! fake API server, where credentials come and go as in a cluster: each
//! installer pod has its own service-account token, revoked (401) once the
//! pod object is deleted.
//!
//! - The DaemonSet is deleted (background cascade: NotFound; foreground:
//!   deletionTimestamp; the whole manifest or chart: the ServiceAccount gone
//!   too): at SIGTERM the installer unchains the node, then the token is
//!   revoked, and pods, meshed or not, start through libcni.
//! - With the upstream chart's RBAC (no `get daemonsets`) the installer
//!   cannot tell and leaves the node chained; once the token is revoked
//!   the plugin passes every pod through.
//! - A rolling update: the old installer stops (DaemonSet present: the
//!   node stays chained), its token is revoked, the new one starts 5 s
//!   later; pods added throughout, retried on "try again later" as the
//!   kubelet does, all start, every meshed one with its rules.

use std::time::{Duration, Instant};

use conformance::chains::{self, Primary};
use conformance::expect::*;
use conformance::installer::{self, Installer};
use conformance::{Node, kube};
use serde_json::Value;
use testkit::FakeApiServer;
use testkit::objects::{daemonset, daemonset_path, daemonset_pod, pod_path};

const RESYNC: Duration = Duration::from_secs(2);
/// Scheduling slack on a small shared machine running other tests.
const GRACE: Duration = Duration::from_secs(5);
/// The installer's bound at SIGTERM: the API question (5 s per call, the
/// child killed at 7 s), then the uninstall (a few file operations).
const SIGTERM_BOUND: Duration = Duration::from_secs(7);
const NS: &str = "linkerd-cni";
const DS: &str = "linkerd-cni";
const DS_UID: &str = "5d1e8a7c-0000-4000-8000-00000000d5e7";
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

/// Starts installer pod `name` with its own token, with `extra` added to
/// the chart's variables (or overriding them).
fn start_pod(node: &Node, api: &FakeApiServer, name: &str, extra: &[(&str, &str)]) -> InstallerPod {
    api.set(&pod_path(NS, name), daemonset_pod(NS, name, DS, DS_UID));
    let token = api.issue_token();
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
    let c = chained_node_with(&serde_json::json!({}));
    (c.node, c.api, c.net, c.conf, c.pod)
}

/// A node chained by its first installer pod.
struct Chained {
    node: Node,
    api: FakeApiServer,
    net: String,
    /// The primary's conflist.
    conf: Value,
    pod: InstallerPod,
    /// The entry the installers render.
    entry: Value,
    /// What the installers' environment adds to the chart's.
    extra: Vec<(&'static str, String)>,
}

/// [`chained_node`], with `keys` added to the entry template.
fn chained_node_with(keys: &Value) -> Chained {
    let node = Node::without_linkerd_cni();
    let api = node.start_api_server_only();
    api.set(&daemonset_path(NS, DS), daemonset(NS, DS, DS_UID, false));
    let net = node.network_name("life");
    let conf = primary(&node, &net);
    node.write_conf(&format!("10-{net}.conflist"), &conf);
    let mut entry = installer::expected_entry(&node);
    let mut extra = Vec::new();
    if let Some(keys) = keys.as_object().filter(|k| !k.is_empty()) {
        let mut template: Value = serde_json::from_str(&installer::template(&node)).unwrap();
        for (k, v) in keys {
            template[k] = v.clone();
            entry[k] = v.clone();
        }
        extra.push(("CNI_NETWORK_CONFIG", template.to_string()));
    }
    let pod = start_pod(&node, &api, "linkerd-cni-old", &vars(&extra));
    node.wait_healthy(&entry, &conf, RESYNC + GRACE)
        .unwrap_or_else(|e| panic!("{e}\n{}", pod.inst.log()));
    Chained {
        node,
        api,
        net,
        conf,
        pod,
        entry,
        extra,
    }
}

/// `extra` as `installer::start_with_token` takes it.
fn vars<'a>(extra: &'a [(&'static str, String)]) -> Vec<(&'static str, &'a str)> {
    extra.iter().map(|(k, v)| (*k, v.as_str())).collect()
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
    /// the pods get SIGTERM the ServiceAccount is gone (its tokens get 401),
    /// whatever RBAC there was (here the upstream chart's, without
    /// daemonsets) with it.
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

/// The upstream chart's RBAC has no `get daemonsets`: after
/// `kubectl delete daemonset` alone (the ServiceAccount and its RBAC stay)
/// the installer cannot tell, leaves the node chained and says why. Once
/// its token is revoked and no installer has beaten for
/// `installer_gone_after_seconds` (short here), every pod still starts:
/// the plugin passes them through (a meshed one unredirected, which
/// linkerd's network-validator then refuses).
#[test]
fn without_rbac_for_daemonsets_the_plugin_passes_pods_through() {
    let c = chained_node_with(&serde_json::json!({"installer_gone_after_seconds": 2}));
    let (node, api, net, conf, pod, entry) = (c.node, c.api, c.net, c.conf, c.pod, c.entry);
    api.forbid(&daemonset_path(NS, DS));
    api.remove(&daemonset_path(NS, DS));
    api.add_namespace(NS, &[]);
    let log = pod.stop(&api);
    assert!(
        log.contains("cannot tell whether the DaemonSet is being deleted"),
        "{log}"
    );
    assert!(log.contains("HTTP 403"), "{log}");
    node.healthy_now(&entry, &conf);

    let plain = add(&node, &net, kube::serve_unmeshed(&api, "plain-0")).unwrap();
    assert_eq!(plain, ORDER_WITH);
    let meshed = add(&node, &net, kube::serve_meshed(&api, "web-0")).unwrap();
    assert_eq!(meshed, ORDER_WITH, "passed through, without rules");
    expect_no_reserved_ips(&node, &net);
}

/// The ADD deadline of the rolling update's template: short, so that a
/// rejected token is answered with code 11 (and retried as the kubelet
/// does) rather than waited out within one ADD.
const ROLLOUT_ADD_DEADLINE: u64 = 4;
/// The kubelet's retry of a failed sandbox, shortened.
const RUNTIME_BACKOFF: Duration = Duration::from_secs(1);
/// A pod still failing this long after its first ADD failed for good.
const FOR_GOOD: Duration = Duration::from_secs(60);

/// What a rolling update's pods got.
#[derive(Debug, Default)]
struct Rollout {
    meshed: u32,
    unmeshed: u32,
    /// Code 11 answers, each retried.
    retries: u32,
    meshed_without_rules: Vec<String>,
    failed_for_good: Vec<String>,
}

/// A pod the "kubelet" keeps starting until it runs.
struct Pending {
    name: String,
    meshed: bool,
    spec: conformance::PodSpec,
    first: Instant,
    next: Instant,
}

impl Rollout {
    /// One sandbox for `p` (a new netns each time, as a new sandbox gets);
    /// whether `p` is done.
    fn try_start(&mut self, node: &Node, net: &str, p: &mut Pending) -> bool {
        let pod = node.pod(p.spec.clone());
        match node.add(net, &pod) {
            Ok(_) => {
                let rules = pod
                    .nat_tables()
                    .iter()
                    .any(|t| !t.linkerd_lines().is_empty());
                if p.meshed != rules {
                    eprintln!(
                        "rollout: {} (meshed: {}) has rules: {rules}",
                        p.name, p.meshed
                    );
                    if p.meshed {
                        self.meshed_without_rules.push(p.name.clone());
                    } else {
                        self.failed_for_good.push(format!("{}: rules", p.name));
                    }
                }
                node.del(net, &pod).unwrap();
                true
            }
            Err(f) => {
                // The runtime tears the sandbox down, then retries.
                node.del(net, &pod).unwrap();
                if f.code == Some(11) && p.first.elapsed() < FOR_GOOD {
                    self.retries += 1;
                    p.next = Instant::now() + RUNTIME_BACKOFF;
                    false
                } else {
                    eprintln!("rollout: {}: {f:?}", p.name);
                    self.failed_for_good.push(format!("{}: {f:?}", p.name));
                    true
                }
            }
        }
    }
}

/// A rolling update: the old installer stops (the DaemonSet is present:
/// everything stays), its token is revoked, the new installer starts 5 s
/// later. Pods, meshed and unmeshed, are added before, through and after
/// the gap, each retried as the kubelet does while the plugin answers
/// "try again later" (code 11; the old installer's heartbeat is fresh).
/// None fails for good and every meshed pod gets its rules; the retries
/// are counted.
#[test]
fn rolling_update_gap() {
    let Chained {
        node,
        api,
        net,
        conf,
        pod: old,
        entry,
        extra,
    } = chained_node_with(&serde_json::json!({"add_deadline_seconds": ROLLOUT_ADD_DEADLINE}));

    let mut r = Rollout::default();
    let mut pending: Vec<Pending> = Vec::new();
    let mut n = 0;
    let mut add_pods = |pending: &mut Vec<Pending>| {
        for meshed in [true, false] {
            let name = format!("{}-{n}", if meshed { "web" } else { "plain" });
            let spec = if meshed {
                kube::serve_meshed(&api, &name)
            } else {
                kube::serve_unmeshed(&api, &name)
            };
            let now = Instant::now();
            pending.push(Pending {
                name,
                meshed,
                spec,
                first: now,
                next: now,
            });
        }
        n += 1;
    };
    // Runs every pending pod due; the pods still pending.
    let run_due = |r: &mut Rollout, pending: &mut Vec<Pending>| {
        let now = Instant::now();
        let mut still = Vec::new();
        for mut p in pending.drain(..) {
            if p.next > now || !r.try_start(&node, &net, &mut p) {
                still.push(p);
            }
        }
        *pending = still;
    };

    add_pods(&mut pending);
    run_due(&mut r, &mut pending);
    let log = old.stop(&api);
    assert!(log.contains("a rolling update or a restart"), "{log}");
    node.healthy_now(&entry, &conf);
    let gap_end = Instant::now() + GAP;
    while Instant::now() < gap_end {
        add_pods(&mut pending);
        run_due(&mut r, &mut pending);
    }
    let new = start_pod(&node, &api, "linkerd-cni-new", &vars(&extra));
    let rewritten =
        || std::fs::read_to_string(node.kubeconfig_path()).is_ok_and(|k| k.contains(&new.token));
    let started = Instant::now();
    while !rewritten() && started.elapsed() < RESYNC + GRACE {
        add_pods(&mut pending);
        run_due(&mut r, &mut pending);
    }
    assert!(
        rewritten(),
        "the new installer did not rewrite the kubeconfig:\n{}",
        new.inst.log()
    );
    // A few more after, then until every pod ran or failed for good.
    for _ in 0..2 {
        add_pods(&mut pending);
        run_due(&mut r, &mut pending);
    }
    while !pending.is_empty() {
        std::thread::sleep(Duration::from_millis(50));
        run_due(&mut r, &mut pending);
    }
    r.meshed = n;
    r.unmeshed = n;
    eprintln!(
        "rolling update, {GAP:?} gap: {} meshed and {} unmeshed pods; code-11 retries: {}; \
         meshed without rules: {}; failed for good: {}",
        r.meshed,
        r.unmeshed,
        r.retries,
        r.meshed_without_rules.len(),
        r.failed_for_good.len()
    );
    assert!(
        r.meshed_without_rules.is_empty(),
        "{:?}",
        r.meshed_without_rules
    );
    assert!(r.failed_for_good.is_empty(), "{:?}", r.failed_for_good);
    assert!(
        r.retries > 0,
        "no pod was started in the gap with the old token revoked"
    );
    node.healthy_now(&entry, &conf);
    expect_no_reserved_ips(&node, &net);
}

trait HealthyNow {
    fn healthy_now(&self, entry: &Value, primary: &Value);
}

impl HealthyNow for Node {
    /// Still chained with `entry`, with the kubeconfig and the binary in
    /// place.
    fn healthy_now(&self, entry: &Value, primary: &Value) {
        self.wait_healthy(entry, primary, Duration::ZERO).unwrap();
        assert!(self.kubeconfig_path().exists());
        assert!(self.bin_dir().join("linkerd-cni").exists());
    }
}
