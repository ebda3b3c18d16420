//! The per-pod work of ADD and CHECK: find out from the Kubernetes API
//! whether the pod is meshed and with which settings, then install (ADD) or
//! verify (CHECK) linkerd's redirect rules in its network namespace.
//!
//! Upstream's decision and semantics are kept: a pod is meshed when it has
//! a `linkerd-proxy` container (or native-sidecar init container) and no
//! `linkerd-init` init container; annotations are looked up on the pod,
//! then on its namespace; a control-plane pod also skips the API server's
//! ports. Unlike upstream, the namespace is fetched at most once, pods in
//! exempt namespaces never cause an API call, every API call fits one
//! budget, and bad annotations are errors rather than silently skipped.
//!
//! Safe by construction when the plugin's credentials are gone: when the
//! kubeconfig does not exist (an uninstall under way), or the API server
//! keeps rejecting them (401, or 403 without RBAC) and no installer is
//! alive on the node to renew them, the plugin cannot tell whether the pod
//! is meshed and passes it through without rules, logging why. A meshed pod
//! then starts unredirected and linkerd's network-validator init container
//! refuses it (fail closed for the mesh), while every other pod on the node
//! starts normally. Rejected credentials with an installer alive (a rolling
//! update) are retried, then "try again later" ([`credentials`]); so is an
//! API server that is down or slow: that is transient, and meshed pods must
//! not start unredirected because of it.
//!
//! One deadline bounds everything an ADD does ([`add_until`]): each API call
//! and iptables command gets the smaller of its own bound and what is left.

mod agent;
mod credentials;

use std::collections::BTreeMap;
use std::time::Instant;

use crate::cni::{CniArgs, CniError, Invocation, code};
use crate::config::{self, PluginConfig, ProxyInit};
use crate::iptables::rules::{self, PortRange, RedirectSpec, RuleSet, Subnet};
use crate::iptables::{Driver, Family, IptablesError, table};
use linkerd_cni_kube::objects::{Pod, PodSpec, Service};
use linkerd_cni_kube::{self as k8s, ApiError, Client};
use linkerd_cni_state::outcomes::{Outcome, RetryCause};
use serde_json::Value;

pub use credentials::CONFIRM_ATTEMPTS;

/// The proxy container linkerd's injector adds.
pub const PROXY_CONTAINER: &str = "linkerd-proxy";
/// The init container of pods injected without CNI: they set up their own
/// rules.
pub const INIT_CONTAINER: &str = "linkerd-init";
/// Outbound ports a control-plane pod skips when Service `default/kubernetes`
/// cannot be read (upstream's fallback).
pub const FALLBACK_API_PORTS: [u16; 2] = [443, 6443];

/// The pod annotations that override config keys.
pub mod annotation {
    /// Replaces `outbound-ports-to-ignore`.
    pub const SKIP_OUTBOUND_PORTS: &str = "config.linkerd.io/skip-outbound-ports";
    /// Appended to `inbound-ports-to-ignore`.
    pub const SKIP_INBOUND_PORTS: &str = "config.linkerd.io/skip-inbound-ports";
    /// Replaces `subnets-to-ignore`.
    pub const SKIP_SUBNETS: &str = "config.linkerd.io/skip-subnets";
    /// Replaces `proxy-uid`.
    pub const PROXY_UID: &str = "config.linkerd.io/proxy-uid";
    /// Replaces `proxy-gid`.
    pub const PROXY_GID: &str = "config.linkerd.io/proxy-gid";

    pub const ALL: [&str; 5] = [
        SKIP_OUTBOUND_PORTS,
        SKIP_INBOUND_PORTS,
        SKIP_SUBNETS,
        PROXY_UID,
        PROXY_GID,
    ];
}

/// The rules for a meshed pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// `namespace/name`.
    pub pod: String,
    /// The effective settings (config keys with annotations applied).
    pub spec: RedirectSpec,
    /// One per family to program: IPv4, and IPv6 with `ipv6: true`.
    pub rule_sets: Vec<RuleSet>,
}

/// ADD: installs the rules when the pod is meshed, every step ending by
/// `deadline`.
pub fn add_until(
    inv: &Invocation,
    config: &PluginConfig,
    deadline: Instant,
) -> Result<Outcome, CniError> {
    let plan = match plan(inv, config, deadline) {
        Ok(plan) => plan,
        Err(Stop::PassThrough { cause, why }) => {
            log::info!("ADD: nothing to do: {why}");
            return Ok(cause);
        }
        Err(Stop::Failed(e)) => return Err(e),
    };
    if config.proxy.simulate {
        for set in &plan.rule_sets {
            log::info!(
                "ADD {}: simulate is on, not applying the {} batch:\n{}",
                plan.pod,
                set.family,
                table::restore_batch(set, &Default::default())
            );
        }
        return Ok(Outcome::Meshed);
    }
    let netns = netns_of(inv)?;
    driver(config)
        .until(deadline)
        .apply(netns, &plan.rule_sets)
        .map_err(|e| {
            let e = iptables_error("set up", &plan.pod, netns, e);
            past_deadline(config, deadline, "installing linkerd's iptables rules", e)
        })?;
    log::info!(
        "ADD {}: installed linkerd's redirect rules in {}",
        plan.pod,
        netns.display()
    );
    Ok(Outcome::Meshed)
}

/// CHECK: for a meshed pod, the rules in its netns must be exactly what ADD
/// installs.
pub fn check(inv: &Invocation, config: &PluginConfig) -> Result<(), CniError> {
    let plan = match decide(inv, config) {
        Ok(plan) => plan,
        Err(Stop::PassThrough { why, .. }) => {
            log::debug!("CHECK: nothing to verify: {why}");
            return Ok(());
        }
        Err(Stop::Failed(e)) => return Err(e),
    };
    if config.proxy.simulate {
        return Ok(());
    }
    let netns = netns_of(inv)?;
    let diffs = driver(config)
        .verify(netns, &plan.rule_sets)
        .map_err(|e| iptables_error("verify", &plan.pod, netns, e))?;
    if diffs.is_empty() {
        return Ok(());
    }
    Err(CniError::new(
        code::RULES_MISMATCH,
        format!(
            "linkerd's iptables rules for pod {} in {} differ from what ADD installs",
            plan.pod,
            netns.display()
        ),
        diffs.join("; "),
    ))
}

/// STATUS: never fails (a failing STATUS marks the node's network not ready,
/// which would also stop the installer pod that can repair things), but
/// says when the kubeconfig is unusable.
pub fn status(config: &PluginConfig) {
    if config.agent_only {
        // No kubeconfig by design: the node agent answers for pods.
        return;
    }
    match &config.kubeconfig {
        None => {
            log::warn!("STATUS: no kubernetes.kubeconfig configured: meshed pods cannot be set up")
        }
        Some(path) => {
            if let Err(e) = usable_kubeconfig(path, config) {
                log::warn!("STATUS: {e}: meshed pods cannot be set up")
            }
        }
    }
}

/// Decides what to do for the pod of `inv`, making the API calls needed
/// (none for a pass-through by CNI_ARGS or exempt namespace), within
/// `add_deadline_seconds` from now.
pub fn decide(inv: &Invocation, config: &PluginConfig) -> Result<Plan, Stop> {
    plan(inv, config, Instant::now() + config.add_deadline)
}

/// Why a pod gets no plan: it is not ours to mesh (or cannot be told to
/// be), or something failed.
#[derive(Debug)]
pub enum Stop {
    /// Nothing to do: pass the result through. `why` is for the log,
    /// `cause` the ADD's outcome counter (exempt, unmeshed, or passed
    /// through when it cannot be told whether the pod is meshed).
    PassThrough {
        cause: Outcome,
        why: String,
    },
    Failed(CniError),
}

impl From<CniError> for Stop {
    fn from(e: CniError) -> Stop {
        Stop::Failed(e)
    }
}

/// The phases of [`decide`]: which pod, its facts (from the node agent
/// when one answers, else from the API server), whether it is meshed, its
/// effective settings, its rules.
fn plan(inv: &Invocation, config: &PluginConfig, deadline: Instant) -> Result<Plan, Stop> {
    let (namespace, name) = pod_in_args(&inv.env.args, config)?;
    let pod_id = format!("{namespace}/{name}");
    if let Some(plan) = agent::plan(inv, config, (namespace, name), &pod_id, deadline)? {
        return Ok(plan);
    }
    if config.agent_only {
        return Err(credentials::no_agent(config, &pod_id));
    }
    let api_failed = |what: &str, e: ApiError| {
        past_deadline(
            config,
            deadline,
            "asking the Kubernetes API",
            api_error(what, e),
        )
    };
    let (client, pod) = get_pod(config, (namespace, name), &pod_id, deadline, &api_failed)?;
    let namespace_annotations = || {
        client
            .namespace(namespace)
            .map(|ns| ns.metadata.annotations)
            .map_err(|e| api_failed(&format!("namespace {namespace} of pod {pod_id}"), e))
    };
    let api_server_ports = || {
        client
            .kubernetes_service()
            .map(|svc| service_ports(&svc))
            .map_err(|e| e.to_string())
    };
    plan_for(
        &pod,
        namespace_annotations,
        api_server_ports,
        config,
        &pod_id,
    )
}

/// The one decision, whatever the source of the facts: meshed or not, and
/// with which rules (the config keys, overridden by the pod's or its
/// namespace's annotations; a control-plane pod also skips the API
/// server's ports). What it reads beyond the pod, the annotations of its
/// namespace and the ports and numeric target ports of Service
/// `default/kubernetes`, is asked for only when the pod needs it: the node
/// agent's answer carries it, the API server is asked for it then.
fn plan_for(
    pod: &Pod,
    namespace_annotations: impl FnOnce() -> Result<BTreeMap<String, String>, CniError>,
    api_server_ports: impl FnOnce() -> Result<Vec<u16>, String>,
    config: &PluginConfig,
    pod_id: &str,
) -> Result<Plan, Stop> {
    check_meshed(&pod.spec, pod_id)?;
    let mut spec = base_spec(&config.proxy)?;
    let pod_ann = &pod.metadata.annotations;
    // One namespace lookup covers every annotation the pod lacks.
    let ns_ann = if annotation::ALL.iter().any(|k| !pod_ann.contains_key(*k)) {
        namespace_annotations()?
    } else {
        BTreeMap::new()
    };
    apply_annotations(&mut spec, pod_ann, &ns_ann, pod_id)?;
    if pod
        .metadata
        .labels
        .get(linkerd_cni_lookup::CONTROL_PLANE_LABEL)
        .is_some_and(|v| !v.is_empty())
    {
        let ports = api_server_ports().unwrap_or_else(|e| {
            log::warn!(
                "pod {pod_id}: cannot read Service default/kubernetes ({e}); skipping outbound ports {FALLBACK_API_PORTS:?}"
            );
            FALLBACK_API_PORTS.to_vec()
        });
        spec.outbound_ports_to_ignore
            .extend(ports.into_iter().map(PortRange::from));
    }
    // One rule set per family to program.
    let families = if config.proxy.ipv6 {
        &[Family::V4, Family::V6][..]
    } else {
        &[Family::V4]
    };
    Ok(Plan {
        pod: pod_id.to_string(),
        rule_sets: families.iter().map(|f| RuleSet::build(&spec, *f)).collect(),
        spec,
    })
}

/// The pod, and the client that got it. Rejected credentials are retried
/// within the deadline with the kubeconfig read anew on every attempt (the
/// installer may have just rewritten it), then answered as
/// [`credentials`] decides.
fn get_pod(
    config: &PluginConfig,
    (namespace, name): (&str, &str),
    pod_id: &str,
    deadline: Instant,
    api_failed: &dyn Fn(&str, ApiError) -> CniError,
) -> Result<(Client, Pod), Stop> {
    let mut retry = credentials::Retry::new(config, deadline);
    loop {
        let client = api_client(config, pod_id, deadline)?;
        retry.attempts += 1;
        match client.pod(namespace, name) {
            Ok(pod) => {
                if retry.attempts > 1 {
                    log::info!(
                        "pod {pod_id}: the Kubernetes API accepted linkerd-cni's credentials \
                         on attempt {}",
                        retry.attempts
                    );
                }
                return Ok((client, pod));
            }
            Err(ApiError::Unauthorized {
                status, kubeconfig, ..
            }) => {
                let installer = credentials::installer(config);
                match retry.after_rejection(status, &installer) {
                    Some(d) => {
                        log::info!(
                            "pod {pod_id}: the Kubernetes API rejected linkerd-cni's \
                             credentials (HTTP {status}, attempt {}); reading {} again in \
                             {} ms",
                            retry.attempts,
                            kubeconfig.display(),
                            d.as_millis()
                        );
                        std::thread::sleep(d);
                    }
                    None => {
                        return Err(retry.give_up(pod_id, status, &kubeconfig, &installer));
                    }
                }
            }
            Err(e) => return Err(Stop::Failed(api_failed(&format!("pod {pod_id}"), e))),
        }
    }
}

/// The pod's namespace and name from CNI_ARGS; a pass-through when the
/// invocation is not for a Kubernetes pod or its namespace is exempt.
fn pod_in_args<'a>(args: &'a CniArgs, config: &PluginConfig) -> Result<(&'a str, &'a str), Stop> {
    let (Some(namespace), Some(name)) = (args.pod_namespace(), args.pod_name()) else {
        return Err(Stop::PassThrough {
            cause: Outcome::Exempt,
            why: "no K8S_POD_NAMESPACE and K8S_POD_NAME in CNI_ARGS: not a Kubernetes pod".into(),
        });
    };
    if config.exempt_namespaces.iter().any(|n| n == namespace) {
        return Err(Stop::PassThrough {
            cause: Outcome::Exempt,
            why: format!("namespace {namespace:?} is exempt (exempt-namespaces)"),
        });
    }
    for (key, value) in [("K8S_POD_NAMESPACE", namespace), ("K8S_POD_NAME", name)] {
        if !k8s::names::is_dns_subdomain(value) {
            return Err(Stop::Failed(CniError::new(
                code::INVALID_ENV,
                format!("invalid {key} {value:?} in CNI_ARGS"),
                "a Kubernetes name holds only lower-case letters, digits, '-' and '.'",
            )));
        }
    }
    Ok((namespace, name))
}

/// A client for the configured kubeconfig, to look up `pod_id` by
/// `deadline`; a pass-through when the kubeconfig is known to be absent.
fn api_client(config: &PluginConfig, pod_id: &str, deadline: Instant) -> Result<Client, Stop> {
    let path = config.kubeconfig.as_deref().ok_or_else(|| {
        CniError::new(
            code::INVALID_CONFIG,
            format!(
                "cannot look up pod {pod_id}: no kubernetes.kubeconfig in the linkerd-cni config"
            ),
            "the linkerd-cni installer sets kubernetes.kubeconfig to the kubeconfig it writes",
        )
    })?;
    // Only a kubeconfig known to be absent: one that cannot be checked
    // (permissions) is an error below, like any unusable one.
    if matches!(path.try_exists(), Ok(false)) {
        return Err(credentials::kubeconfig_missing(config, pod_id, path));
    }
    let api = usable_kubeconfig(path, config)?;
    let remaining = deadline.saturating_duration_since(Instant::now());
    Ok(Client::new(api, config.api_budget.min(remaining)))
}

/// A pass-through unless the pod has linkerd's proxy and no init container
/// of its own.
fn check_meshed(spec: &PodSpec, pod_id: &str) -> Result<(), Stop> {
    let has_proxy = spec
        .containers
        .iter()
        .chain(&spec.init_containers)
        .any(|c| c.name == PROXY_CONTAINER);
    if !has_proxy {
        return Err(Stop::PassThrough {
            cause: Outcome::Unmeshed,
            why: format!("pod {pod_id} has no {PROXY_CONTAINER} container"),
        });
    }
    if spec
        .init_containers
        .iter()
        .any(|c| c.name == INIT_CONTAINER)
    {
        return Err(Stop::PassThrough {
            cause: Outcome::Unmeshed,
            why: format!(
                "pod {pod_id} has a {INIT_CONTAINER} init container, which sets up its own rules"
            ),
        });
    }
    Ok(())
}

/// The kubeconfig at `path`, refused when it would send the token over
/// plain http without `kubernetes.allow-plain-http`; its transport
/// weaknesses are logged as warnings on every use.
fn usable_kubeconfig(
    path: &std::path::Path,
    config: &PluginConfig,
) -> Result<k8s::ApiConfig, CniError> {
    let api = k8s::kubeconfig::load(path).map_err(|e| {
        CniError::new(
            code::KUBERNETES,
            e.to_string(),
            "the linkerd-cni installer DaemonSet writes this file: check that its pod runs on this node",
        )
    })?;
    if api.is_plain_http() && !config.allow_plain_http {
        return Err(CniError::new(
            code::KUBERNETES,
            format!(
                "refusing plain http:// to the Kubernetes API at {} (kubeconfig {}): the bearer \
                 token would cross the network unencrypted",
                api.server,
                path.display()
            ),
            "use an https:// server address; to accept plain http anyway, set \
             kubernetes.allow-plain-http: true in the linkerd-cni config",
        ));
    }
    for w in api.transport_warnings() {
        log::warn!("{w}");
    }
    Ok(api)
}

/// The settings from the config keys alone.
pub fn base_spec(p: &ProxyInit) -> Result<RedirectSpec, CniError> {
    // Blank items are skipped, as upstream does.
    fn list<T>(
        key: &str,
        items: &[String],
        parse: impl Fn(&str) -> Result<T, rules::ParseError>,
    ) -> Result<Vec<T>, CniError> {
        rules::check_list_size(items.len()).map_err(|e| invalid_config(key, e))?;
        items
            .iter()
            .filter(|s| !s.trim().is_empty())
            .map(|s| parse(s))
            .collect::<Result<_, _>>()
            .map_err(|e| invalid_config(key, e))
    }
    Ok(RedirectSpec {
        incoming_proxy_port: p.incoming_proxy_port,
        outgoing_proxy_port: p.outgoing_proxy_port,
        proxy_uid: p.proxy_uid,
        proxy_gid: p.proxy_gid,
        ports_to_redirect: p.ports_to_redirect.clone(),
        inbound_ports_to_ignore: list(
            "linkerd.inbound-ports-to-ignore",
            &p.inbound_ports_to_ignore,
            PortRange::parse,
        )?,
        outbound_ports_to_ignore: list(
            "linkerd.outbound-ports-to-ignore",
            &p.outbound_ports_to_ignore,
            PortRange::parse,
        )?,
        subnets_to_ignore: list(
            "linkerd.subnets-to-ignore",
            &p.subnets_to_ignore,
            Subnet::parse,
        )?,
    })
}

/// Applies the annotations, each looked up on the pod, then the namespace.
/// An empty value counts as absent, as upstream treats it.
pub fn apply_annotations(
    spec: &mut RedirectSpec,
    pod: &BTreeMap<String, String>,
    namespace: &BTreeMap<String, String>,
    pod_id: &str,
) -> Result<(), CniError> {
    let lookup = |key: &str| -> Option<(&str, &'static str)> {
        match pod.get(key) {
            Some(v) => Some((v.as_str(), "pod")),
            None => namespace.get(key).map(|v| (v.as_str(), "namespace")),
        }
        .filter(|(v, _)| !v.trim().is_empty())
    };
    let ns_name = pod_id.split_once('/').map_or(pod_id, |(ns, _)| ns);
    let bad = |key: &str, value: &str, on: &str, why: String| {
        let (whose, fix) = if on == "pod" {
            (format!("pod {pod_id}"), "recreate the pod")
        } else {
            (
                format!("namespace {ns_name} (read for pod {pod_id})"),
                "recreate the pod (the namespace's annotations apply to pods created afterwards)",
            )
        };
        // The value is the pod author's: quoted, but not at any length.
        let shown = match value.char_indices().nth(64) {
            Some((i, _)) => format!("{:?}... ({} bytes)", &value[..i], value.len()),
            None => format!("{value:?}"),
        };
        CniError::new(
            code::INVALID_ANNOTATION,
            format!("invalid annotation {key}={shown} on {whose}"),
            format!("{why}; fix or remove the annotation and {fix}"),
        )
    };

    if let Some((v, on)) = lookup(annotation::SKIP_OUTBOUND_PORTS) {
        spec.outbound_ports_to_ignore = rules::parse_port_list(v)
            .map_err(|e| bad(annotation::SKIP_OUTBOUND_PORTS, v, on, e.to_string()))?;
    }
    if let Some((v, on)) = lookup(annotation::SKIP_INBOUND_PORTS) {
        let more = rules::parse_port_list(v)
            .map_err(|e| bad(annotation::SKIP_INBOUND_PORTS, v, on, e.to_string()))?;
        spec.inbound_ports_to_ignore.extend(more);
    }
    if let Some((v, on)) = lookup(annotation::SKIP_SUBNETS) {
        spec.subnets_to_ignore = rules::parse_subnet_list(v)
            .map_err(|e| bad(annotation::SKIP_SUBNETS, v, on, e.to_string()))?;
    }
    for (key, field) in [
        (annotation::PROXY_UID, &mut spec.proxy_uid),
        (annotation::PROXY_GID, &mut spec.proxy_gid),
    ] {
        if let Some((v, on)) = lookup(key) {
            let want = || format!("expected {}", config::owner_id_want());
            *field = config::owner_id(&Value::from(v)).ok_or_else(|| bad(key, v, on, want()))?;
        }
    }
    Ok(())
}

/// The ports and numeric target ports of a Service.
fn service_ports(svc: &Service) -> Vec<u16> {
    let mut ports = Vec::new();
    for p in &svc.spec.ports {
        if let Ok(port) = u16::try_from(p.port)
            && port > 0
        {
            ports.push(port);
        }
        if let Some(t) = p.target_port_number() {
            ports.push(t);
        }
    }
    ports
}

fn driver(config: &PluginConfig) -> Driver {
    Driver::new(config.proxy.iptables_mode, config.proxy.use_wait_flag)
}

fn netns_of(inv: &Invocation) -> Result<&std::path::Path, CniError> {
    inv.env
        .netns
        .as_deref()
        .ok_or_else(|| crate::cni::env::missing("CNI_NETNS"))
}

fn invalid_config(key: &str, e: rules::ParseError) -> CniError {
    CniError::new(
        code::INVALID_CONFIG,
        format!("invalid linkerd-cni config key {key:?}"),
        e.to_string(),
    )
}

/// `what`: what was being read, e.g. "pod ns/name". An unreachable, slow
/// or overloaded server is "try again later" (code 11), which is what it is.
fn api_error(what: &str, e: ApiError) -> CniError {
    let msg = format!("cannot get {what}: {e}");
    if e.transient() {
        CniError::try_again(RetryCause::ApiUnavailable, msg, e.hint())
    } else {
        CniError::new(code::KUBERNETES, msg, e.hint())
    }
}

/// `e`, or, when the ADD's deadline has passed, the error that says so
/// (code 11: the kubelet retries the pod), with `e` as the details.
fn past_deadline(config: &PluginConfig, deadline: Instant, doing: &str, e: CniError) -> CniError {
    if Instant::now() < deadline {
        return e;
    }
    CniError::try_again(
        RetryCause::Deadline,
        format!(
            "linkerd-cni's ADD deadline of {} s (add_deadline_seconds) ran out while {doing}",
            config.add_deadline.as_secs_f32()
        ),
        format!("{}: {}", e.msg, e.details),
    )
}

/// `doing`: "set up" (ADD) or "verify" (CHECK).
fn iptables_error(
    doing: &str,
    pod_id: &str,
    netns: &std::path::Path,
    e: IptablesError,
) -> CniError {
    CniError::new(
        code::IPTABLES,
        format!(
            "cannot {doing} linkerd's iptables rules for pod {pod_id} in {}",
            netns.display()
        ),
        e.to_string(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(kv: &[(&str, &str)]) -> BTreeMap<String, String> {
        kv.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn ports(s: &str) -> Vec<PortRange> {
        rules::parse_port_list(s).unwrap()
    }

    #[test]
    fn annotations_follow_upstream_semantics() {
        let mut spec = base_spec(&ProxyInit {
            inbound_ports_to_ignore: vec!["4191".into(), "4190".into()],
            outbound_ports_to_ignore: vec!["25".into()],
            subnets_to_ignore: vec!["10.0.0.0/8".into()],
            ..ProxyInit::default()
        })
        .unwrap();
        let pod = map(&[
            (annotation::SKIP_OUTBOUND_PORTS, "3306, 5432"),
            (annotation::SKIP_INBOUND_PORTS, "8000-8100"),
            (annotation::PROXY_UID, "1234"),
        ]);
        let ns = map(&[
            (annotation::SKIP_SUBNETS, "192.168.0.0/16,fd00::/8"),
            (annotation::PROXY_UID, "999"),
            (annotation::PROXY_GID, "4321"),
        ]);
        apply_annotations(&mut spec, &pod, &ns, "ns/p").unwrap();
        assert_eq!(
            spec.outbound_ports_to_ignore,
            ports("3306,5432"),
            "replaced"
        );
        assert_eq!(
            spec.inbound_ports_to_ignore,
            ports("4191,4190,8000-8100"),
            "appended"
        );
        assert_eq!(
            spec.subnets_to_ignore
                .iter()
                .map(|s| s.given.as_str())
                .collect::<Vec<_>>(),
            ["192.168.0.0/16", "fd00::/8"],
            "replaced, from the namespace"
        );
        assert_eq!(spec.proxy_uid, 1234, "the pod's wins");
        assert_eq!(spec.proxy_gid, 4321);
    }

    #[test]
    fn empty_annotations_count_as_absent() {
        let mut spec = base_spec(&ProxyInit {
            outbound_ports_to_ignore: vec!["25".into()],
            ..ProxyInit::default()
        })
        .unwrap();
        let before = spec.clone();
        let pod = map(&[(annotation::SKIP_OUTBOUND_PORTS, " ")]);
        let ns = map(&[(annotation::SKIP_OUTBOUND_PORTS, "")]);
        apply_annotations(&mut spec, &pod, &ns, "ns/p").unwrap();
        assert_eq!(spec, before);
    }

    #[test]
    fn malformed_annotations_are_named() {
        for (key, value) in [
            (annotation::SKIP_OUTBOUND_PORTS, "http"),
            (annotation::SKIP_INBOUND_PORTS, "10-5"),
            (annotation::SKIP_SUBNETS, "10.0.0.0/40"),
            (annotation::PROXY_UID, "root"),
            (annotation::PROXY_GID, "99999999999"),
        ] {
            let mut spec = RedirectSpec::default();
            let e = apply_annotations(&mut spec, &map(&[(key, value)]), &BTreeMap::new(), "ns/p")
                .unwrap_err();
            assert_eq!(e.code, code::INVALID_ANNOTATION);
            assert!(
                e.msg.contains(key) && e.msg.contains(&format!("{value:?}")),
                "{}",
                e.msg
            );
            assert!(e.msg.ends_with("on pod ns/p"), "{}", e.msg);
        }
    }

    #[test]
    fn long_lists_are_refused_with_a_short_message() {
        let many_ports = (1..=5000)
            .map(|p| p.to_string())
            .collect::<Vec<_>>()
            .join(",");
        let many_subnets = (0..=255)
            .flat_map(|a| (0..4).map(move |b| format!("10.{a}.{b}.0/24")))
            .collect::<Vec<_>>()
            .join(",");
        let huge = "1,".repeat(128 << 10);
        for (key, value) in [
            (annotation::SKIP_OUTBOUND_PORTS, &many_ports),
            (annotation::SKIP_INBOUND_PORTS, &huge),
            (annotation::SKIP_SUBNETS, &many_subnets),
        ] {
            let mut spec = RedirectSpec::default();
            let e = apply_annotations(&mut spec, &map(&[(key, value)]), &BTreeMap::new(), "ns/p")
                .unwrap_err();
            assert_eq!(e.code, code::INVALID_ANNOTATION, "{key}");
            assert!(e.msg.contains(key), "{}", e.msg);
            assert!(e.details.contains("at most"), "{}", e.details);
            assert!(
                e.msg.len() + e.details.len() < 1024,
                "{key}: {} bytes",
                e.msg.len() + e.details.len()
            );
        }
        let e = base_spec(&ProxyInit {
            outbound_ports_to_ignore: many_ports.split(',').map(String::from).collect(),
            ..ProxyInit::default()
        })
        .unwrap_err();
        assert_eq!(e.code, code::INVALID_CONFIG);
        assert!(e.details.contains("at most"), "{}", e.details);
    }

    #[test]
    fn out_of_range_annotation_ids_are_refused() {
        for v in ["4294967295", "-2"] {
            let mut spec = RedirectSpec::default();
            let e = apply_annotations(
                &mut spec,
                &map(&[(annotation::PROXY_UID, v)]),
                &BTreeMap::new(),
                "ns/p",
            )
            .unwrap_err();
            assert_eq!(e.code, code::INVALID_ANNOTATION, "{v}");
        }
    }

    #[test]
    fn namespace_annotations_name_the_namespace() {
        let mut spec = RedirectSpec::default();
        let e = apply_annotations(
            &mut spec,
            &BTreeMap::new(),
            &map(&[(annotation::PROXY_UID, "root")]),
            "emojivoto/bad-1",
        )
        .unwrap_err();
        assert!(
            e.msg
                .ends_with("on namespace emojivoto (read for pod emojivoto/bad-1)"),
            "{}",
            e.msg
        );
    }

    #[test]
    fn bad_config_lists_are_invalid_config() {
        let e = base_spec(&ProxyInit {
            inbound_ports_to_ignore: vec!["4191".into(), "x".into()],
            ..ProxyInit::default()
        })
        .unwrap_err();
        assert_eq!(e.code, code::INVALID_CONFIG);
        assert!(e.msg.contains("linkerd.inbound-ports-to-ignore"));
        let e = base_spec(&ProxyInit {
            subnets_to_ignore: vec!["nope".into()],
            ..ProxyInit::default()
        })
        .unwrap_err();
        assert!(e.msg.contains("linkerd.subnets-to-ignore"));
    }

    #[test]
    fn chart_config_gives_the_reference_spec() {
        let spec = base_spec(&ProxyInit {
            inbound_ports_to_ignore: vec!["4191".into(), "4190".into()],
            ..ProxyInit::default()
        })
        .unwrap();
        assert_eq!(spec, RedirectSpec::default());
    }

    #[test]
    fn names() {
        let valid_name = k8s::names::is_dns_subdomain;
        assert!(valid_name("emojivoto"));
        assert!(valid_name("web-7d9f8b6c5-x2x4z"));
        assert!(!valid_name("a/b"));
        assert!(!valid_name("../x"));
        assert!(!valid_name(".."));
        assert!(!valid_name(""));
        assert!(!valid_name("Web"));
        // As the API server has them: each dot-separated label a DNS
        // label of its own.
        assert!(!valid_name("a..b"));
        assert!(!valid_name("a.-b"));
        assert!(!valid_name(&format!("{}.b", "a".repeat(64))));
    }
}
