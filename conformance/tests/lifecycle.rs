//! A node's life with the real installer, the real plugin, libcni and the
//! fake API server, where credentials come and go as in a cluster: each
//! installer pod has its own service-account token, revoked (401) once the
//! pod object is deleted; the plugin's token is minted by the installer for
//! the plugin's own ServiceAccount and dies with that account.
//!
//! - The DaemonSet is deleted (background cascade: NotFound; foreground:
//!   deletionTimestamp; `helm uninstall`: NotFound and the namespace being
//!   deleted; `kubectl delete -f`: the namespace being deleted while the
//!   DaemonSet still answers): at SIGTERM the installer unchains the node,
//!   then the token is revoked, and pods, meshed or not, start through
//!   libcni.
//! - The ServiceAccounts deleted before the pod's SIGTERM (its token
//!   rejected): the installer cannot tell an uninstall from a force-delete
//!   and leaves the node chained, saying how to clean it; once no installer
//!   beats the plugin passes pods through.
//! - With the upstream chart's RBAC (no `get daemonsets`, no TokenRequest)
//!   the kubeconfig holds the installer's own token, which it says once;
//!   the installer cannot tell and leaves the node chained; once the token
//!   is revoked and the heartbeat is stale the plugin passes every pod
//!   through.
//! - A rolling update: the old installer stops (DaemonSet present: the
//!   node stays chained), its token is revoked, the new one starts 5 s
//!   later; pods added throughout, retried on "try again later" as the
//!   kubelet does, all start, every meshed one with its rules: with the
//!   plugin's minted token, which outlives the old pod, and under the
//!   chart's RBAC, where the plugin answers code 11 until the new
//!   installer writes its own token. Each also with the installers running
//!   the node agent (the pods started while one is up make no request with
//!   the plugin's credentials), and with `LINKERD_CNI_AGENT_ONLY` (no
//!   kubeconfig: through the gap every ADD answers code 11 and the API
//!   server hears nothing, until the new agent answers).
//! - Forced answers at SIGTERM while the DaemonSet exists (one 401, one
//!   403, a proxy's HTML 401, a 401 on the DaemonSet after a 200 on the
//!   pod, a stale token in the node's kubeconfig, a proxy's 404 on the
//!   DaemonSet): the node stays chained.
//! - Two installers on one node (a force-delete overlap): the kubeconfig
//!   is written at most 3 times in 10 s, and the node stays chained, also
//!   when the force-deleted one gets SIGTERM.

use std::time::{Duration, Instant};

use conformance::agent;
use conformance::chains::{self, Primary};
use conformance::expect::*;
use conformance::installer::{self, Installer};
use conformance::{Node, kube};
use serde_json::{Value, json};
use testkit::objects::{
    Pod as ApiPod, daemonset, daemonset_path, daemonset_pod, namespace_path, pod_path,
};
use testkit::{FakeApiServer, TokenPolicy};

const RESYNC: Duration = Duration::from_secs(2);
/// Scheduling slack on a small shared machine running other tests.
const GRACE: Duration = Duration::from_secs(5);
/// The installer's bound at SIGTERM: the API question (5 s for its calls),
/// then the uninstall (a few file operations, then 5 s more for the
/// binary, for pod starts that loaded the old chain), with room to spare.
const SIGTERM_BOUND: Duration = Duration::from_secs(12);
const NS: &str = "linkerd-cni";
const DS: &str = "linkerd-cni";
const DS_UID: &str = "5d1e8a7c-0000-4000-8000-00000000d5e7";
/// The plugin's ServiceAccount, whose token the installer mints.
const PLUGIN_SA: &str = "linkerd-cni-plugin";
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
    /// When it runs the node agent too: the agent's token (see
    /// [`installer::agent_vars`]), revoked with the pod.
    agent_token: Option<String>,
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
        agent_token: None,
    }
}

/// [`start_pod_with`], the installer running the node agent too when
/// `answering` says so.
fn start_pod_answering(
    node: &Node,
    api: &FakeApiServer,
    name: &str,
    extra: &[(&str, &str)],
    answering: Answering,
) -> InstallerPod {
    if answering == Answering::Api {
        return start_pod_with(node, api, name, extra);
    }
    let agent_token = api.issue_token();
    let agent = installer::agent_vars(node, api, name, &agent_token);
    let mut all = extra.to_vec();
    all.extend(agent.iter().map(|(k, v)| (*k, v.as_str())));
    InstallerPod {
        agent_token: Some(agent_token),
        ..start_pod_with(node, api, name, &all)
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
        if let Some(t) = &self.agent_token {
            api.revoke_token(t);
        }
        self.inst.log()
    }
}

fn chained_node() -> (Node, FakeApiServer, String, Value, InstallerPod) {
    let c = chained_node_with(TokenPolicy::default(), &json!({}), &[]);
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
    answering: Answering,
}

/// Who answers the plugin's pod lookups.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Answering {
    /// The API server alone, asked with the kubeconfig's token: the
    /// installer runs no node agent (the chart's install-cni container).
    Api,
    /// The node agent, which the installers run too (deploy/'s one
    /// container); the API server when none answers.
    Agent,
    /// The node agent alone, with `LINKERD_CNI_AGENT_ONLY`: no kubeconfig
    /// on the node; when no agent answers while the heartbeat is live, the
    /// plugin answers "try again later".
    AgentOnly,
}

/// A pod of [`kube::APP_NAMESPACE`] on every node, which an agent's
/// watch shows once the agent is up.
const PROBE: &str = "agent-probe";

/// [`chained_node`] with the API server answering TokenRequests as
/// `tokens` says, `keys` added to the entry template and `env` to the
/// installers' environment.
fn chained_node_with(tokens: TokenPolicy, keys: &Value, env: &[(&'static str, &str)]) -> Chained {
    chained_node_answering(tokens, keys, env, Answering::Api)
}

/// [`chained_node_with`], with the lookups answered as `answering` says;
/// with an agent, it answers (from its watch) before this returns.
fn chained_node_answering(
    tokens: TokenPolicy,
    keys: &Value,
    env: &[(&'static str, &str)],
    answering: Answering,
) -> Chained {
    let node = Node::without_linkerd_cni();
    let api = node.start_api_server_only();
    api.set_tokens(tokens);
    api.set(&daemonset_path(NS, DS), daemonset(NS, DS, DS_UID, false));
    let net = node.network_name("life");
    let conf = primary(&node, &net);
    node.write_conf(&format!("10-{net}.conflist"), &conf);
    let mut entry = installer::expected_entry(&node);
    let mut extra: Vec<(&'static str, String)> =
        env.iter().map(|(k, v)| (*k, v.to_string())).collect();
    if let Some(keys) = keys.as_object().filter(|k| !k.is_empty()) {
        let mut template: Value = serde_json::from_str(&installer::template(&node)).unwrap();
        for (k, v) in keys {
            template[k] = v.clone();
            entry[k] = v.clone();
        }
        extra.push(("CNI_NETWORK_CONFIG", template.to_string()));
    }
    if answering == Answering::AgentOnly {
        extra.push(("LINKERD_CNI_AGENT_ONLY", "true".into()));
        let k8s = entry["kubernetes"].as_object_mut().expect("an object");
        k8s.remove("kubeconfig");
        k8s.insert("agent-only".into(), true.into());
    }
    let pod = start_pod_answering(&node, &api, "linkerd-cni-old", &vars(&extra), answering);
    node.wait_healthy(&entry, &conf, RESYNC + GRACE)
        .unwrap_or_else(|e| panic!("{e}\n{}", pod.inst.log()));
    if answering != Answering::Api {
        kube::serve_on(&api, &node, &ApiPod::new(kube::APP_NAMESPACE, PROBE));
        assert!(
            agent::wait_answering(
                &installer::agent_socket(&node),
                kube::APP_NAMESPACE,
                PROBE,
                RESYNC + GRACE
            ),
            "the installer's node agent never answered:\n{}",
            pod.inst.log()
        );
    }
    Chained {
        node,
        api,
        net,
        conf,
        pod,
        entry,
        extra,
        answering,
    }
}

/// Whether the node agent an installer runs answers now.
fn agent_answers(node: &Node) -> bool {
    agent::answers_from_watch(&installer::agent_socket(node), kube::APP_NAMESPACE, PROBE)
}

/// `extra` as `installer::start_with_token` takes it.
fn vars<'a>(extra: &'a [(&'static str, String)]) -> Vec<(&'static str, &'a str)> {
    extra.iter().map(|(k, v)| (*k, v.as_str())).collect()
}

/// The upstream chart's RBAC: no TokenRequest.
fn chart_rbac() -> TokenPolicy {
    TokenPolicy {
        allowed: false,
        ..TokenPolicy::default()
    }
}

/// The token in the node's kubeconfig, as the installer writes it (JSON).
fn kubeconfig_token(node: &Node) -> String {
    let text = std::fs::read_to_string(node.kubeconfig_path()).unwrap();
    let doc: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
    doc["users"][0]["user"]["token"]
        .as_str()
        .unwrap_or_else(|| panic!("no token: {text}"))
        .to_string()
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
    /// `helm uninstall`: the DaemonSet deleted first (NotFound), the
    /// chart's namespace last (being deleted), while the pod's token is
    /// still accepted.
    HelmUninstall,
    /// `kubectl delete -f deploy/linkerd-cni.yaml`: the namespace first
    /// (being deleted), while the DaemonSet still answers.
    DeleteManifest,
}

/// Namespace `linkerd-cni` being deleted, as the API server shows it.
fn terminating_namespace(api: &FakeApiServer) {
    let mut ns = testkit::objects::namespace(NS, &[]);
    ns["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z".into();
    ns["status"] = json!({"phase": "Terminating"});
    api.set(&namespace_path(NS), ns);
}

/// `deletion`: unchained at SIGTERM, within the stated bound; then, the
/// token revoked, pods start through libcni.
fn deletion_unchains_the_node(deletion: Deletion) {
    let (node, api, net, conf, pod) = chained_node();
    let meshed = add(&node, &net, kube::serve_meshed(&api, "web-0")).unwrap();
    assert_eq!(meshed.last().map(String::as_str), Some("(rules)"));

    match deletion {
        Deletion::Background => api.remove(&daemonset_path(NS, DS)),
        Deletion::Foreground => api.set(&daemonset_path(NS, DS), daemonset(NS, DS, DS_UID, true)),
        Deletion::HelmUninstall => {
            api.remove(&daemonset_path(NS, DS));
            terminating_namespace(&api);
        }
        Deletion::DeleteManifest => terminating_namespace(&api),
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

#[test]
fn deleting_the_daemonset_unchains_the_node() {
    deletion_unchains_the_node(Deletion::Background);
    deletion_unchains_the_node(Deletion::Foreground);
}

#[test]
fn helm_uninstall_unchains_the_node() {
    deletion_unchains_the_node(Deletion::HelmUninstall);
}

#[test]
fn kubectl_delete_manifest_unchains_the_node() {
    deletion_unchains_the_node(Deletion::DeleteManifest);
}

/// `kubectl delete -f` or `helm uninstall` that deleted both
/// ServiceAccounts (and the RBAC) before the pod's SIGTERM: its token is
/// rejected, as a force-deleted pod's is, and the installer cannot tell
/// them apart. It leaves the node chained and says how to clean it; once
/// no installer has beaten for `installer_gone_after_seconds` (short
/// here), the plugin, its token rejected too, passes every pod through.
#[test]
fn a_revoked_token_at_sigterm_leaves_the_node_installed() {
    let Chained {
        node,
        api,
        net,
        conf,
        pod,
        entry,
        ..
    } = chained_node_with(
        TokenPolicy::default(),
        &json!({"installer_gone_after_seconds": 2}),
        &[],
    );
    api.forbid(&daemonset_path(NS, DS));
    api.remove(&daemonset_path(NS, DS));
    api.revoke_token(&pod.token);
    api.delete_account(NS, PLUGIN_SA);
    let log = pod.stop(&api);
    assert!(!log.contains("uninstalling"), "{log}");
    assert!(
        log.contains("cannot tell whether the DaemonSet is being deleted"),
        "{log}"
    );
    assert!(log.contains("HTTP 401"), "{log}");
    assert!(log.contains("linkerd-cni-installer uninstall"), "{log}");
    node.healthy_now_with(&entry, &conf);

    std::thread::sleep(Duration::from_secs(3));
    let plain = add(&node, &net, kube::serve_unmeshed(&api, "plain-0")).unwrap();
    assert_eq!(plain, ORDER_WITH);
    let meshed = add(&node, &net, kube::serve_meshed(&api, "web-0")).unwrap();
    assert_eq!(meshed, ORDER_WITH, "passed through, without rules");
    expect_no_reserved_ips(&node, &net);
}

/// The upstream chart's RBAC has no `get daemonsets` and no TokenRequest:
/// the kubeconfig holds the installer's own token, which it says once in
/// one line. After `kubectl delete daemonset` alone (the ServiceAccount and
/// its RBAC stay) the installer cannot tell, leaves the node chained and
/// says why. Once its token is revoked and no installer has beaten for
/// `installer_gone_after_seconds` (short here), every pod still starts:
/// the plugin passes them through (a meshed one unredirected, which
/// linkerd's network-validator then refuses).
#[test]
fn without_rbac_for_daemonsets_the_plugin_passes_pods_through() {
    let Chained {
        node,
        api,
        net,
        conf,
        pod,
        entry,
        ..
    } = chained_node_with(
        chart_rbac(),
        &json!({"installer_gone_after_seconds": 2}),
        &[],
    );
    assert_eq!(
        kubeconfig_token(&node),
        pod.token,
        "the installer's own token"
    );
    // Another pass (the primary rewrote its file): still said once.
    node.write_conf(&format!("10-{net}.conflist"), &conf);
    node.wait_healthy(&entry, &conf, RESYNC + GRACE).unwrap();
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
    node.healthy_now_with(&entry, &conf);

    let plain = add(&node, &net, kube::serve_unmeshed(&api, "plain-0")).unwrap();
    assert_eq!(plain, ORDER_WITH);
    let meshed = add(&node, &net, kube::serve_meshed(&api, "web-0")).unwrap();
    assert_eq!(meshed, ORDER_WITH, "passed through, without rules");
    expect_no_reserved_ips(&node, &net);
}

/// The ADD deadline of the rolling updates' template: short, so that a
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
    /// The kubeconfig's text once every pod ran, if any.
    kubeconfig: Option<String>,
    /// Whether a node agent answers now; pods first added meanwhile.
    agent_up: bool,
    while_agent_up: Vec<String>,
    /// The plugin's GETs of pods (any token but the agents'): of those
    /// first added while an agent was up, and of the others.
    plugin_gets_while_agent_up: usize,
    plugin_gets_otherwise: usize,
    /// From the old installer's exit (its token revoked) to the new one's
    /// start: whether it is now; the ADDs tried then, those that started,
    /// and the API requests received then (method and path).
    in_gap: bool,
    gap_adds: u32,
    gap_started: Vec<String>,
    gap_requests: Vec<String>,
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
        let out = node.add(net, &pod);
        self.gap_adds += u32::from(self.in_gap);
        match out {
            Ok(_) => {
                if self.in_gap {
                    self.gap_started.push(p.name.clone());
                }
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

/// A rolling update of the installer on a node chained with
/// [`ROLLOUT_ADD_DEADLINE`]: the old installer stops (the DaemonSet is
/// present: everything stays), its token is revoked, the new installer
/// starts [`GAP`] later. Pods, meshed and unmeshed, are added before,
/// through and after the gap (until `ready` says the new installer took
/// over, and, with an agent, the new agent answers), each retried as the
/// kubelet does while the plugin answers "try again later" (code 11),
/// until every one ran or failed for good. What they got.
fn rolling_update(c: Chained, ready: impl Fn(&Node, &InstallerPod) -> bool) -> Rollout {
    let Chained {
        node,
        api,
        net,
        conf,
        pod: old,
        entry,
        extra,
        answering,
    } = c;
    let with_agent = answering != Answering::Api;
    let mut r = Rollout {
        agent_up: with_agent,
        ..Rollout::default()
    };
    let mut pending: Vec<Pending> = Vec::new();
    let mut n = 0;
    let mut add_pods = |r: &mut Rollout, pending: &mut Vec<Pending>| {
        for meshed in [true, false] {
            let name = format!("{}-{n}", if meshed { "web" } else { "plain" });
            let pod = if meshed {
                ApiPod::meshed(kube::APP_NAMESPACE, &name)
            } else {
                ApiPod::new(kube::APP_NAMESPACE, &name)
            };
            let spec = kube::serve_on(&api, &node, &pod);
            if r.agent_up {
                r.while_agent_up.push(name.clone());
            }
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

    add_pods(&mut r, &mut pending);
    run_due(&mut r, &mut pending);
    let mut agent_tokens: Vec<String> = old.agent_token.iter().cloned().collect();
    let log = old.stop(&api);
    r.agent_up = false;
    assert!(log.contains("a rolling update or a restart"), "{log}");
    node.healthy_now_with(&entry, &conf);
    let gap_start = Instant::now();
    let gap_end = gap_start + GAP;
    r.in_gap = true;
    while Instant::now() < gap_end {
        add_pods(&mut r, &mut pending);
        run_due(&mut r, &mut pending);
    }
    r.in_gap = false;
    let new_start = Instant::now();
    let new = start_pod_answering(&node, &api, "linkerd-cni-new", &vars(&extra), answering);
    agent_tokens.extend(new.agent_token.iter().cloned());
    let took_over = || ready(&node, &new) && (!with_agent || agent_answers(&node));
    while !took_over() && new_start.elapsed() < RESYNC + GRACE {
        add_pods(&mut r, &mut pending);
        run_due(&mut r, &mut pending);
    }
    assert!(
        took_over(),
        "the new installer did not take over:\n{}",
        new.inst.log()
    );
    r.agent_up = with_agent;
    // A few more after, then until every pod ran or failed for good.
    for _ in 0..2 {
        add_pods(&mut r, &mut pending);
        run_due(&mut r, &mut pending);
    }
    while !pending.is_empty() {
        std::thread::sleep(Duration::from_millis(50));
        run_due(&mut r, &mut pending);
    }
    r.meshed = n;
    r.unmeshed = n;
    r.kubeconfig = std::fs::read_to_string(node.kubeconfig_path()).ok();
    for req in api.request_log() {
        if (gap_start..new_start).contains(&req.at) {
            r.gap_requests.push(format!("{} {}", req.method, req.path));
        }
        let Some(name) = req.path.strip_prefix(&kube::pod_path("")) else {
            continue;
        };
        if req.method != "GET" || agent_tokens.contains(&req.bearer) {
            continue;
        }
        if r.while_agent_up.iter().any(|n| n == name) {
            r.plugin_gets_while_agent_up += 1;
        } else {
            r.plugin_gets_otherwise += 1;
        }
    }
    eprintln!(
        "rolling update ({answering:?}), {GAP:?} gap: {} meshed and {} unmeshed pods; \
         code-11 retries: {}; meshed without rules: {}; failed for good: {}; \
         ADDs in the gap: {} ({} started); pods started with an agent up: {}, \
         the plugin's pod GETs for them: {}, for the others: {}",
        r.meshed,
        r.unmeshed,
        r.retries,
        r.meshed_without_rules.len(),
        r.failed_for_good.len(),
        r.gap_adds,
        r.gap_started.len(),
        r.while_agent_up.len(),
        r.plugin_gets_while_agent_up,
        r.plugin_gets_otherwise,
    );
    assert!(
        r.meshed_without_rules.is_empty(),
        "meshed pods started without rules: {:?}",
        r.meshed_without_rules
    );
    assert!(r.failed_for_good.is_empty(), "{:?}", r.failed_for_good);
    node.healthy_now_with(&entry, &conf);
    expect_no_reserved_ips(&node, &net);
    r
}

/// The RBAC the API server grants.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Rbac {
    /// deploy/'s: the installer mints the plugin's own token.
    Deploy,
    /// The upstream chart's: no TokenRequest, so the kubeconfig holds the
    /// installer pod's own token, revoked with its pod.
    Chart,
}

/// A rolling update ([`rolling_update`]) under `rbac`, the lookups
/// answered as `answering` says. In every case no meshed pod starts
/// without its rules and none fails for good; besides:
///
/// - deploy/'s RBAC: the plugin's minted token outlives the old pod, and
///   the new installer keeps it (no rewrite).
/// - The chart's RBAC: through the gap the plugin, asking the API server,
///   answers "try again later" (code 11: the old installer's heartbeat is
///   fresh) until the new installer writes its own token; the retries are
///   counted.
/// - With the agent: the pods started while one was up made no request
///   with the plugin's credentials (the agent answered them), while those
///   of the gap did (no agent: the plugin asked the API server).
/// - Agent-only: no kubeconfig ever; through the gap every ADD answers
///   code 11, none starts and the API server hears nothing at all; once
///   the new agent answers, the retried pods start, the meshed ones with
///   their rules.
fn rolling_update_as(rbac: Rbac, answering: Answering) {
    let tokens = match rbac {
        Rbac::Deploy => TokenPolicy::default(),
        Rbac::Chart => chart_rbac(),
    };
    let c = chained_node_answering(
        tokens,
        &json!({"add_deadline_seconds": ROLLOUT_ADD_DEADLINE}),
        &[],
        answering,
    );
    let kubeconfig = std::fs::read_to_string(c.node.kubeconfig_path()).ok();
    let r = match (answering, rbac) {
        (Answering::AgentOnly, _) => {
            assert_eq!(kubeconfig, None, "a kubeconfig with LINKERD_CNI_AGENT_ONLY");
            rolling_update(c, |_, new| new.inst.log().contains("starting:"))
        }
        (_, Rbac::Deploy) => {
            let text = kubeconfig
                .clone()
                .expect("the installer wrote the kubeconfig");
            assert!(
                !text.contains(&c.pod.token),
                "the plugin's token, not the pod's"
            );
            rolling_update(c, |_, new| new.inst.log().contains("starting:"))
        }
        (_, Rbac::Chart) => {
            assert_eq!(kubeconfig_token(&c.node), c.pod.token);
            rolling_update(c, |node, new| {
                std::fs::read_to_string(node.kubeconfig_path())
                    .is_ok_and(|k| k.contains(&new.token))
            })
        }
    };
    match (answering, rbac) {
        (Answering::AgentOnly, _) => {}
        (_, Rbac::Deploy) => assert_eq!(
            r.kubeconfig, kubeconfig,
            "the new installer kept the plugin's token"
        ),
        (_, Rbac::Chart) => assert!(
            r.retries > 0,
            "no pod was started in the gap with the old token revoked"
        ),
    }
    match answering {
        Answering::Api => {}
        Answering::Agent => {
            assert!(!r.while_agent_up.is_empty());
            assert_eq!(
                r.plugin_gets_while_agent_up, 0,
                "pods started while an agent was up were looked up with the plugin's credentials"
            );
            assert!(
                r.plugin_gets_otherwise > 0,
                "with no agent up the plugin never asked the API server"
            );
        }
        Answering::AgentOnly => {
            assert_eq!(
                r.kubeconfig, None,
                "a kubeconfig with LINKERD_CNI_AGENT_ONLY"
            );
            assert!(r.gap_adds > 0, "no ADD in the gap");
            assert!(
                r.gap_started.is_empty(),
                "pods started in the gap, with no agent up: {:?}",
                r.gap_started
            );
            assert!(
                r.gap_requests.is_empty(),
                "API requests in the gap: {:?}",
                r.gap_requests
            );
            assert!(r.retries > 0, "no pod was retried");
            assert_eq!(r.plugin_gets_while_agent_up + r.plugin_gets_otherwise, 0);
        }
    }
}

#[test]
fn rolling_update_gap() {
    rolling_update_as(Rbac::Deploy, Answering::Api);
}

#[test]
fn rolling_update_gap_under_the_chart_rbac() {
    rolling_update_as(Rbac::Chart, Answering::Api);
}

#[test]
fn rolling_update_gap_with_the_agent() {
    rolling_update_as(Rbac::Deploy, Answering::Agent);
}

#[test]
fn rolling_update_gap_with_the_agent_under_the_chart_rbac() {
    rolling_update_as(Rbac::Chart, Answering::Agent);
}

#[test]
fn rolling_update_gap_agent_only() {
    rolling_update_as(Rbac::Deploy, Answering::AgentOnly);
}

#[test]
fn rolling_update_gap_agent_only_under_the_chart_rbac() {
    rolling_update_as(Rbac::Chart, Answering::AgentOnly);
}

/// Starts an installer with the watch off and a long resync, so that no
/// pass runs between a change the test makes and its SIGTERM.
fn quiet_node() -> (Node, FakeApiServer, String, Value, InstallerPod) {
    let c = chained_node_with(
        TokenPolicy::default(),
        &json!({}),
        &[
            ("LINKERD_CNI_WATCH", "false"),
            ("LINKERD_CNI_RESYNC_SECONDS", "600"),
        ],
    );
    (c.node, c.api, c.net, c.conf, c.pod)
}

/// Forced answers at SIGTERM while the DaemonSet exists (or, for a proxy's
/// 404, whatever it is): none uninstalls; the question is asked with the
/// pod's own token. With the DaemonSet NotFound (the API server's Status
/// body) or being deleted, or the namespace being deleted: uninstall.
#[test]
fn forced_answers_at_sigterm() {
    type Force = fn(&FakeApiServer, &Node);
    let cases: [(&str, Force); 7] = [
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
            let token = kubeconfig_token(node);
            std::fs::write(&path, text.replace(&token, &stale)).unwrap();
            assert_eq!(kubeconfig_token(node), stale);
        }),
        ("a proxy's HTML 404 on the DaemonSet", |api, _| {
            api.fail_next_on_with(
                &daemonset_path(NS, DS),
                1,
                404,
                "<html><body><h1>404 Not Found</h1></body></html>",
            )
        }),
        ("an empty 404 on the DaemonSet", |api, _| {
            api.fail_next_on_with(&daemonset_path(NS, DS), 1, 404, "")
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
    for gone in ["not found", "being deleted", "namespace being deleted"] {
        let (node, api, _net, conf, pod) = quiet_node();
        match gone {
            "not found" => api.remove(&daemonset_path(NS, DS)),
            "being deleted" => api.set(&daemonset_path(NS, DS), daemonset(NS, DS, DS_UID, true)),
            _ => terminating_namespace(&api),
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
/// node stays chained. Then the first is force-deleted (its token
/// revoked) and gets SIGTERM at once: its rejected token is no uninstall,
/// and the second writes its own token within a pass.
#[test]
fn two_installers_converge_under_the_chart_rbac() {
    let c = chained_node_with(chart_rbac(), &json!({}), &[]);
    let (node, api, conf, first) = (c.node, c.api, c.conf, c.pod);
    let before = writes_in(&first.inst);
    let second = start_pod(&node, &api, "linkerd-cni-surge");
    overlap_for_10_s(&node, &conf, (&first, &second), before);
    api.remove(&pod_path(NS, &first.name));
    api.revoke_token(&first.token);
    let log = first.stop(&api);
    assert!(!log.contains("uninstalling"), "{log}");
    let why = log
        .lines()
        .find(|l| l.contains("stays installed and chained"))
        .unwrap_or_default()
        .to_string();
    eprintln!("the force-deleted installer at SIGTERM: {why}");
    node.healthy_now(&conf);
    assert!(
        testkit::wait_until(RESYNC + GRACE, || std::fs::read_to_string(
            node.kubeconfig_path()
        )
        .is_ok_and(|k| k.contains(&second.token))),
        "the second installer did not take over:\n{}",
        second.inst.log()
    );
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
    fn healthy_now_with(&self, entry: &Value, primary: &Value);
}

impl HealthyNow for Node {
    /// Still chained with the default entry, with the kubeconfig and the
    /// binary in place.
    fn healthy_now(&self, primary: &Value) {
        self.healthy_now_with(&installer::expected_entry(self), primary);
    }

    /// [`HealthyNow::healthy_now`], chained with `entry`; without a
    /// kubeconfig when `entry` names none (`kubernetes.agent-only`).
    fn healthy_now_with(&self, entry: &Value, primary: &Value) {
        self.wait_healthy(entry, primary, Duration::ZERO).unwrap();
        let named = entry["kubernetes"].get("kubeconfig").is_some();
        assert_eq!(self.kubeconfig_path().exists(), named);
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
    let c = chained_node_with(
        TokenPolicy {
            max_lifetime: Some(lifetime),
            ..TokenPolicy::default()
        },
        &json!({}),
        &[],
    );
    let (node, api, pod) = (c.node, c.api, c.pod);
    let token_now = || kubeconfig_token(&node);
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

/// The plugin's RBAC deleted while its installer runs (its ClusterRole or
/// binding gone): every pod GET is forbidden, which no new token fixes.
/// The first ADD is answered "try again" (a 403 the installer might still
/// fix); the installer, told by the plugin's counters, asks the API server
/// whether the plugin's token may get pods, hears no, and says so in its
/// heartbeat. From then on pods pass through (the node's other pods start)
/// instead of every pod being retried for as long as it lasts. With the
/// RBAC back, the installer's next look clears it and pods are meshed
/// again.
#[test]
fn the_plugins_rbac_deleted_passes_pods_through_until_it_is_back() {
    let c = chained_node_with(
        TokenPolicy::default(),
        &json!({"add_deadline_seconds": ROLLOUT_ADD_DEADLINE}),
        &[],
    );
    let (node, api, net) = (&c.node, &c.api, &c.net);
    let beat = node.state_dir().join("installer-heartbeat.json");
    let denied =
        || std::fs::read_to_string(&beat).is_ok_and(|b| b.contains("\"plugin_access_denied\""));
    assert!(
        testkit::wait_until(RESYNC + GRACE, || beat.exists()),
        "no heartbeat: {}",
        c.pod.inst.log()
    );
    assert!(!denied(), "{}", c.pod.inst.log());
    let rbac_gone = [
        "/api/v1/pods".to_string(),
        pod_path(kube::APP_NAMESPACE, "web-1"),
        pod_path(kube::APP_NAMESPACE, "web-2"),
    ];
    for p in &rbac_gone {
        api.forbid(p);
    }
    let pod = node.pod(kube::serve_meshed(api, "web-1"));
    let first = node
        .add(net, &pod)
        .map(|r| format!("{r:?}"))
        .map_err(|f| format!("{f:?}"));
    assert!(
        first.as_ref().is_err_and(|e| e.contains("try again later")),
        "{first:?}"
    );
    // A failed ADD is the runtime's to undo.
    node.del(net, &pod).unwrap();
    assert!(
        testkit::wait_until(RESYNC * 2 + GRACE, denied),
        "{}",
        c.pod.inst.log()
    );
    assert!(
        c.pod.inst.log().contains("may not read pods"),
        "{}",
        c.pod.inst.log()
    );
    let second = add(node, net, kube::serve_meshed(api, "web-2")).unwrap();
    assert_eq!(second, ORDER_WITH, "passed through, without rules");

    for p in &rbac_gone {
        api.unforbid(p);
    }
    assert!(
        testkit::wait_until(RESYNC * 2 + GRACE, || !denied()),
        "{}",
        c.pod.inst.log()
    );
    let third = add(node, net, kube::serve_meshed(api, "web-2")).unwrap();
    assert_eq!(
        third,
        [&ORDER_WITH[..], &["(rules)"]].concat(),
        "meshed again"
    );
    expect_no_reserved_ips(node, net);
}

/// The plugin's token revoked while its installer runs (its ServiceAccount
/// deleted and created again): the plugin's GETs get 401 and the ADD is
/// answered "try again". The installer, told by the plugin's counters,
/// asks a review with that token, gets 401, and mints another within a
/// pass or two instead of keeping the revoked one for half its lifetime;
/// the pod, retried, gets its rules.
#[test]
fn a_revoked_plugin_token_is_replaced_once_the_plugin_is_refused() {
    let c = chained_node_with(
        TokenPolicy::default(),
        &json!({"add_deadline_seconds": ROLLOUT_ADD_DEADLINE}),
        &[],
    );
    let (node, api, net) = (&c.node, &c.api, &c.net);
    let beat = node.state_dir().join("installer-heartbeat.json");
    assert!(
        testkit::wait_until(RESYNC + GRACE, || beat.exists()),
        "no heartbeat: {}",
        c.pod.inst.log()
    );
    let file_token = || {
        let text = std::fs::read_to_string(node.kubeconfig_path()).unwrap_or_default();
        let doc: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
        doc["users"][0]["user"]["token"]
            .as_str()
            .map(str::to_string)
    };
    let first = file_token().expect("the plugin's token in the kubeconfig");
    assert_eq!(api.minted().len(), 1);
    api.revoke_token(&first);
    let pod = node.pod(kube::serve_meshed(api, "web-1"));
    let refused = node
        .add(net, &pod)
        .map(|r| format!("{r:?}"))
        .map_err(|f| format!("{f:?}"));
    assert!(
        refused
            .as_ref()
            .is_err_and(|e| e.contains("try again later")),
        "{refused:?}"
    );
    node.del(net, &pod).unwrap();
    assert!(
        testkit::wait_until(RESYNC * 2 + GRACE, || {
            api.minted().len() == 2 && file_token().is_some_and(|t| t != first)
        }),
        "no new token: {}",
        c.pod.inst.log()
    );
    assert_eq!(
        file_token().as_deref(),
        Some(api.minted()[1].token.as_str())
    );
    let again = add(node, net, kube::serve_meshed(api, "web-1")).unwrap();
    assert_eq!(again, [&ORDER_WITH[..], &["(rules)"]].concat(), "meshed");
}

/// The installer cannot mint the plugin's token when it starts (the API
/// server answers its first two TokenRequests 404: the plugin's
/// ServiceAccount not created yet, as when the DaemonSet is applied
/// first; not retried within one request, unlike a 503): the kubeconfig is
/// written without a token, never with the installer's own (which under
/// deploy/'s RBAC may delete pods and patch Nodes), and the node is
/// chained all the same. A meshed pod added meanwhile is asked to try
/// again (the plugin's requests are anonymous and refused, and the
/// installer is alive), never passed through without rules; once the
/// token is minted, it gets its rules.
#[test]
fn until_the_plugins_token_is_minted_the_kubeconfig_holds_none() {
    let node = Node::without_linkerd_cni();
    let api = node.start_api_server_only();
    api.set_tokens(TokenPolicy::default());
    api.set(&daemonset_path(NS, DS), daemonset(NS, DS, DS_UID, false));
    let token_path = format!("/api/v1/namespaces/{NS}/serviceaccounts/{PLUGIN_SA}/token");
    api.fail_next_on(&token_path, 2, 404);
    let net = node.network_name("notoken");
    let conf = primary(&node, &net);
    node.write_conf(&format!("10-{net}.conflist"), &conf);
    let keys = json!({"add_deadline_seconds": ROLLOUT_ADD_DEADLINE});
    let mut template: Value = serde_json::from_str(&installer::template(&node)).unwrap();
    let mut entry = installer::expected_entry(&node);
    for (k, v) in keys.as_object().unwrap() {
        template[k] = v.clone();
        entry[k] = v.clone();
    }
    let template = template.to_string();
    let pod = start_pod_with(
        &node,
        &api,
        "linkerd-cni-a",
        &[("CNI_NETWORK_CONFIG", template.as_str())],
    );
    node.wait_healthy(&entry, &conf, RESYNC + GRACE)
        .unwrap_or_else(|e| panic!("{e}\n{}", pod.inst.log()));
    let user = || {
        let text = std::fs::read_to_string(node.kubeconfig_path()).unwrap();
        assert!(
            !text.contains(&pod.token),
            "the installer's own token is on the node's disk:\n{text}"
        );
        let doc: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
        doc["users"][0]["user"].clone()
    };
    assert_eq!(user(), json!({}), "{}", pod.inst.log());
    assert!(
        pod.inst.log().contains("no token for the plugin yet"),
        "{}",
        pod.inst.log()
    );

    let web = node.pod(kube::serve_meshed(&api, "web-1"));
    let first = node.add(&net, &web).map_err(|f| format!("{f:?}"));
    assert!(
        first.as_ref().is_err_and(|e| e.contains("try again later")),
        "{first:?}\n{}",
        pod.inst.log()
    );
    node.del(&net, &web).unwrap();

    // Minted at the third try, after 5 s and 10 s of backoff.
    assert!(
        testkit::wait_until(Duration::from_secs(15) + RESYNC + GRACE * 2, || {
            user().get("token").is_some()
        }),
        "{}",
        pod.inst.log()
    );
    let minted = api.minted();
    assert_eq!(
        user()["token"].as_str(),
        minted.last().map(|m| m.token.as_str()),
        "the plugin's minted token"
    );
    let second = add(&node, &net, kube::serve_meshed(&api, "web-2")).unwrap();
    assert_eq!(second, [&ORDER_WITH[..], &["(rules)"]].concat());
    expect_no_reserved_ips(&node, &net);
}
