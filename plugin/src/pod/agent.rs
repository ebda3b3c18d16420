//! The pod's facts from the node agent, when one answers.
//!
//! The agent (the DaemonSet's long-running program) answers from watches
//! over a root-only Unix socket in the state dir, which spares a pod start
//! the TLS handshake and the GETs of the direct path. Its answer feeds the
//! same decision ([`super::plan_for`]). No agent, or any answer that cannot
//! be used, sends the plugin down the direct path to the API server, so a
//! node without an agent (or with an older or newer one) works as before.

use std::time::{Duration, Instant};

use linkerd_cni_kube::objects::{Namespace, Pod, Service};
use linkerd_cni_kube::text::printable;
use linkerd_cni_lookup::{self as lookup, AskError, Body, Request};

use super::{Plan, Stop, plan_for, service_ports};
use crate::cni::{CniError, Invocation, code};
use crate::config::PluginConfig;

/// The longest the plugin waits for the agent before it asks the API
/// server itself: the agent's own bound on a pod it has to fetch (a wait
/// for its watch, then a GET) fits in it with room to answer.
pub const BUDGET: Duration = Duration::from_secs(3);
/// The agent's messages carry the API server's error text: they become
/// one printable line of at most this many characters in the plugin's
/// logs and errors.
const MAX_MESSAGE: usize = 512;

/// The plan from the agent's answer; `None` when no agent answered usably.
pub fn plan(
    inv: &Invocation,
    config: &PluginConfig,
    (namespace, name): (&str, &str),
    pod_id: &str,
    deadline: Instant,
) -> Result<Option<Plan>, Stop> {
    let budget = BUDGET.min(deadline.saturating_duration_since(Instant::now()));
    let request = Request {
        v: lookup::VERSION,
        namespace: namespace.to_string(),
        name: name.to_string(),
        uid: inv
            .env
            .args
            .get("K8S_POD_UID")
            .filter(|u| !u.is_empty())
            .map(String::from),
        budget_ms: u64::try_from(budget.as_millis()).unwrap_or(u64::MAX),
    };
    let socket = config.state_dir.join(lookup::SOCKET);
    let direct = |why: &dyn std::fmt::Display| {
        log::info!("pod {pod_id}: {why}; asking the Kubernetes API");
        Ok(None)
    };
    let answer = match lookup::ask(&socket, &request, budget) {
        Ok(a) => a,
        Err(AskError::NoAgent(_)) => {
            log::debug!("pod {pod_id}: no node agent at {}", socket.display());
            return Ok(None);
        }
        Err(e) => return direct(&e),
    };
    match answer.body {
        Body::Pod {
            pod,
            namespace,
            service,
            source,
        } => {
            let parsed = serde_json::from_value::<Pod>(pod).and_then(|pod| {
                let ns = namespace
                    .map(serde_json::from_value::<Namespace>)
                    .transpose()?;
                let svc = service.map(serde_json::from_value::<Service>).transpose()?;
                Ok((pod, ns, svc))
            });
            let (pod, Some(ns), service) = (match parsed {
                Ok(p) => p,
                Err(e) => return direct(&format!("the node agent's answer is malformed ({e})")),
            }) else {
                return direct(&"the node agent's answer lacks the pod's namespace");
            };
            log::debug!("pod {pod_id}: facts from the node agent ({source:?})");
            let api_server_ports = || {
                service
                    .as_ref()
                    .map(service_ports)
                    .ok_or_else(|| "the node agent has not seen it".to_string())
            };
            let namespace_annotations = || Ok(ns.metadata.annotations);
            plan_for(
                &pod,
                namespace_annotations,
                api_server_ports,
                config,
                pod_id,
            )
            .map(Some)
        }
        Body::NotFound { message } => Err(Stop::Failed(CniError::new(
            code::KUBERNETES,
            format!(
                "cannot get pod {pod_id}: {}",
                printable(&message, MAX_MESSAGE)
            ),
            "the pod was deleted or recreated while its sandbox started; the kubelet starts \
             the current pod's sandbox anew",
        ))),
        Body::Unavailable { message } => direct(&format!(
            "the node agent cannot answer now ({})",
            printable(&message, MAX_MESSAGE)
        )),
    }
}
