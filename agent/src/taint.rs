//! The readiness gate at node start: a node registered with the startup
//! taint (`LINKERD_CNI_STARTUP_TAINT`, default `linkerd.io/cni-not-ready`,
//! e.g. `kubelet --register-with-taints=linkerd.io/cni-not-ready:NoSchedule`
//! or a node pool setting) gets no ordinary pods until the installer
//! removes that taint, which it does once the node is ready: the state the
//! readiness probe (`check`) accepts, i.e. the plugin installed, the
//! kubeconfig current and the chain healthy.
//!
//! The installer never adds the taint. It asks at most once per pass, only
//! while the taint may still be there, and not at all once it is gone:
//! one GET (and one PATCH when the taint is there) per installer start in
//! the common case. Failures back off (5 s doubling to a minute); a 403
//! (RBAC without `patch` on nodes, as the linkerd2-cni chart grants) is
//! said once, then retried every 10 minutes, and the installer keeps
//! chaining the node whatever the answer.
//! The API calls use this pod's own token (the node's kubeconfig holds the
//! plugin's, which may not patch nodes), within [`API_TIMEOUT`].
//!
//! Only the taints with the key are removed, and only while they are where
//! the node was read: the JSON patch tests the key at each index before
//! removing it, so a concurrent change of the taint list (another
//! controller adding or removing its own taint) makes the patch fail as a
//! whole instead of removing someone else's taint; the node is then read
//! again and the patch rebuilt, a few times at most. No `resourceVersion`
//! precondition: the kubelet updates its node all the time, and only the
//! taint list matters here.

use std::fmt;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, Taint};
use linkerd_cni_kube::ApiError;
use serde_json::{Value, json};

use crate::api::{self, Api};
use crate::config::Config;
use crate::installer::Installer;
use crate::kubeconfig;
use crate::repair::backoff::Policy;

/// The most one removal's API calls may take together.
const API_TIMEOUT: Duration = Duration::from_secs(5);

/// After a 403: RBAC does not change by itself.
const FORBIDDEN_BACKOFF: Duration = Duration::from_secs(600);

#[derive(Debug)]
enum State {
    /// The taint may be there.
    Pending {
        /// Not before this.
        next_try: Instant,
        /// Failures in a row.
        failures: u32,
        /// The last failure said (said again only when it changes).
        said: Option<Failure>,
        /// "Waiting for the node to be ready" was said.
        said_waiting: bool,
    },
    /// Removed, found absent, or no node name: never asked (again).
    Done,
}

pub struct StartupTaint {
    node: String,
    key: String,
    cfg: Config,
    state: State,
}

impl StartupTaint {
    pub fn new(cfg: &Config) -> StartupTaint {
        let state = match &cfg.node_name {
            Some(_) => State::Pending {
                next_try: Instant::now(),
                failures: 0,
                said: None,
                said_waiting: false,
            },
            None => {
                tracing::info!(
                    "LINKERD_CNI_NODE_NAME is not set: not removing any startup taint \
                     {} from this node (set it from the downward API's spec.nodeName, as \
                     deploy/linkerd-cni.yaml does, to use one)",
                    cfg.startup_taint
                );
                State::Done
            }
        };
        StartupTaint {
            node: cfg.node_name.clone().unwrap_or_default(),
            key: cfg.startup_taint.clone(),
            cfg: cfg.clone(),
            state,
        }
    }

    /// After a reconcile pass: when the node is ready and the taint may be
    /// there, asks (at most once) for its removal, which `inst`'s Events
    /// report.
    pub fn after_pass(&mut self, inst: &Installer) {
        let State::Pending {
            next_try,
            said_waiting,
            ..
        } = &mut self.state
        else {
            return;
        };
        if Instant::now() < *next_try {
            return;
        }
        let problems = inst.check();
        if let Some(first) = problems.first() {
            if !*said_waiting {
                *said_waiting = true;
                tracing::info!(
                    "keeping startup taint {} on node {} (if it has it) until linkerd-cni is \
                     ready here: {}",
                    self.key,
                    self.node,
                    first.lines().map(str::trim).collect::<Vec<_>>().join(" ")
                );
            }
            return;
        }
        let answer = self.remove();
        if let Ok(outcome @ TaintOutcome::Removed { .. }) = &answer {
            inst.telemetry()
                .taint_removed(&format!("startup taint: {outcome}"));
        }
        self.record(answer);
    }

    /// One removal.
    fn remove(&self) -> Result<TaintOutcome, TaintError> {
        let config = kubeconfig::own_api(&self.cfg).map_err(|message| TaintError {
            kind: Failure::Other,
            message,
        })?;
        let (node, key) = (self.node.as_str(), self.key.as_str());
        api::blocking(config, API_TIMEOUT, async |api| {
            remove_taint(api, node, key).await
        })
        .map_err(|e| TaintError::api(Step::Get, node, key, e))?
    }

    fn record(&mut self, answer: Result<TaintOutcome, TaintError>) {
        let TaintError {
            kind: failure,
            message: why,
        } = match answer {
            Ok(outcome) => {
                let word = match outcome {
                    TaintOutcome::Removed { .. } => "removed",
                    TaintOutcome::Absent { .. } => "absent",
                };
                tracing::info!("startup taint: {word}: {outcome}");
                self.state = State::Done;
                return;
            }
            Err(f) => f,
        };
        let State::Pending {
            next_try,
            failures,
            said,
            ..
        } = &mut self.state
        else {
            return;
        };
        *failures += 1;
        let backoff = match failure {
            Failure::Forbidden => FORBIDDEN_BACKOFF,
            _ => Policy::INSTALLER.nominal(*failures),
        };
        *next_try = Instant::now() + backoff;
        if *said != Some(failure) {
            *said = Some(failure);
            let consequence = match failure {
                Failure::Forbidden => format!(
                    "not allowed to (HTTP 403); the node stays tainted, and linkerd-cni keeps \
                     working; asking again every {} min",
                    FORBIDDEN_BACKOFF.as_secs() / 60
                ),
                _ => "retrying with backoff; linkerd-cni keeps working".to_string(),
            };
            tracing::warn!(
                "cannot remove startup taint {} from node {}: {consequence}: {why}",
                self.key,
                self.node
            );
        }
    }

    /// Whether it may still ask the API (tests).
    #[cfg(test)]
    fn pending(&self) -> bool {
        matches!(self.state, State::Pending { .. })
    }
}

/// Reads of the node (and patches) before giving up on a node whose taint
/// list keeps changing under us.
const MAX_ROUNDS: u32 = 5;

/// The taints of `node` (none when the list is null or missing).
fn taints(node: &Node) -> &[Taint] {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_deref())
        .unwrap_or_default()
}

/// `key[=value]:Effect`, as kubectl shows a taint.
fn describe(taint: &Taint) -> String {
    let value = match taint.value.as_deref() {
        Some(v) if !v.is_empty() => format!("={v}"),
        _ => String::new(),
    };
    format!("{}{value}:{}", taint.key, taint.effect)
}

/// The API path of a node: its name one encoded segment, so that no name
/// can reach another object (the name was checked as a node name when the
/// settings were read, too).
fn node_path(node: &str) -> String {
    format!("/api/v1/nodes/{}", linkerd_cni_kube::names::segment(node))
}

/// What happened to the taint.
#[derive(Debug, Clone, PartialEq, Eq)]
enum TaintOutcome {
    /// Removed now; the taints as `key[=value]:Effect`.
    Removed { node: String, taints: Vec<String> },
    /// The node has no taint with that key (any more).
    Absent { node: String, key: String },
}

impl fmt::Display for TaintOutcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TaintOutcome::Removed { node, taints } => {
                write!(f, "taint {} from node {node}", taints.join(", "))
            }
            TaintOutcome::Absent { node, key } => {
                write!(f, "node {node} has no taint {key}")
            }
        }
    }
}

/// How a failure is treated: each kind is said once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Failure {
    /// Try again later: the API server was unreachable, slow or
    /// overloaded, or the node kept changing.
    Transient,
    /// HTTP 403: the service account may not get or patch nodes.
    Forbidden,
    /// HTTP 401: the token was refused.
    Unauthorized,
    /// Anything else (no such node, an unexpected answer, TLS).
    Other,
}

/// Why the taint could not be removed: how to treat it, and what to say
/// (what failed, then what an operator should do).
#[derive(Debug)]
struct TaintError {
    kind: Failure,
    message: String,
}

/// The API call that failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    Get,
    Patch,
}

impl TaintError {
    /// `step` of the removal of taint `key` from `node` failed with `e`.
    fn api(step: Step, node: &str, key: &str, e: ApiError) -> TaintError {
        let kind = match &e {
            ApiError::Unauthorized { status: 403, .. } => Failure::Forbidden,
            ApiError::Unauthorized { .. } => Failure::Unauthorized,
            e if e.transient() => Failure::Transient,
            _ => Failure::Other,
        };
        let hint = match kind {
            Failure::Forbidden => format!(
                "the linkerd-cni service account needs get and patch on nodes \
                 (deploy/linkerd-cni.yaml grants them; the linkerd2-cni chart does not); \
                 until then remove the taint by hand: kubectl taint nodes {node} {key}-"
            ),
            Failure::Unauthorized => {
                "the token in the kubeconfig was refused: the installer rewrites it when the \
                 kubelet rotates the service account's token"
                    .into()
            }
            Failure::Transient => "retried later".into(),
            Failure::Other if step == Step::Get && matches!(e, ApiError::NotFound { .. }) => {
                "check the node name the installer was given (LINKERD_CNI_NODE_NAME, \
                  from the downward API's spec.nodeName)"
                    .into()
            }
            Failure::Other => "see the message".into(),
        };
        let message = match step {
            Step::Get => format!("cannot read node {node}: {e}; {hint}"),
            Step::Patch => format!("cannot patch node {node} to remove taint {key}: {e}; {hint}"),
        };
        TaintError { kind, message }
    }
}

/// The JSON patch removing the taints at `indices` (ascending), each after
/// testing that its key is still `key` there. Highest index first, so each
/// removal leaves the lower indices where they were.
fn removal_patch(indices: &[usize], key: &str) -> Value {
    let ops: Vec<Value> = indices
        .iter()
        .rev()
        .flat_map(|i| {
            [
                json!({"op": "test", "path": format!("/spec/taints/{i}/key"), "value": key}),
                json!({"op": "remove", "path": format!("/spec/taints/{i}")}),
            ]
        })
        .collect();
    Value::Array(ops)
}

/// Removes every taint with `key` (whatever its effect) from `node`; never
/// adds one. Bounded by the client's budget.
async fn remove_taint(api: &Api, node: &str, key: &str) -> Result<TaintOutcome, TaintError> {
    let path = node_path(node);
    for round in 1..=MAX_ROUNDS {
        let n: Node = api
            .get(&path)
            .await
            .map_err(|e| TaintError::api(Step::Get, node, key, e))?;
        let indices: Vec<usize> = taints(&n)
            .iter()
            .enumerate()
            .filter(|(_, t)| t.key == key)
            .map(|(i, _)| i)
            .collect();
        if indices.is_empty() {
            return Ok(TaintOutcome::Absent {
                node: node.into(),
                key: key.into(),
            });
        }
        let removed = indices.iter().map(|&i| describe(&taints(&n)[i])).collect();
        match api
            .json_patch::<Value>(&path, &removal_patch(&indices, key))
            .await
        {
            Ok(_) => {
                return Ok(TaintOutcome::Removed {
                    node: node.into(),
                    taints: removed,
                });
            }
            // A failed `test` (422) or a conflict (409): the taint list
            // changed since the read. Read it again.
            Err(ApiError::Status {
                status: 409 | 422,
                message,
                ..
            }) => {
                tracing::info!(
                    "node {node} changed while removing taint {key} ({message}); reading it again (round {round})"
                );
            }
            Err(e) => return Err(TaintError::api(Step::Patch, node, key, e)),
        }
    }
    Err(TaintError {
        kind: Failure::Transient,
        message: format!(
            "the taints of node {node} changed under every one of {MAX_ROUNDS} attempts to \
             remove {key}; retried later"
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gate() -> StartupTaint {
        let cfg = Config::from_env(|k| {
            match k {
                "KUBERNETES_SERVICE_HOST" => Some("10.96.0.1"),
                "KUBERNETES_SERVICE_PORT" => Some("443"),
                "CNI_NETWORK_CONFIG" => Some(r#"{"type":"linkerd-cni"}"#),
                "LINKERD_CNI_NODE_NAME" => Some("node-1"),
                _ => None,
            }
            .map(str::to_string)
        })
        .unwrap();
        StartupTaint::new(&cfg)
    }

    fn failed(kind: Failure) -> Result<TaintOutcome, TaintError> {
        Err(TaintError {
            kind,
            message: "why".into(),
        })
    }

    fn next_try(g: &StartupTaint) -> Instant {
        match g.state {
            State::Pending { next_try, .. } => next_try,
            _ => panic!("not pending"),
        }
    }

    #[test]
    fn done_on_success_backoff_on_failure() {
        let mut g = gate();
        g.record(failed(Failure::Transient));
        let first = next_try(&g);
        assert!(first > Instant::now() + Policy::INSTALLER.initial / 2);
        g.record(failed(Failure::Transient));
        assert!(next_try(&g) > first, "the backoff grows");
        g.record(failed(Failure::Forbidden));
        assert!(next_try(&g) > Instant::now() + FORBIDDEN_BACKOFF / 2);
        assert!(g.pending());
        g.record(Ok(TaintOutcome::Absent {
            node: "node-1".into(),
            key: "k".into(),
        }));
        assert!(!g.pending(), "never asked again once removed or absent");
    }

    #[test]
    fn patch_tests_each_key_and_removes_highest_first() {
        let p = removal_patch(&[1, 3], "linkerd.io/cni-not-ready");
        assert_eq!(
            p,
            json!([
                {"op": "test", "path": "/spec/taints/3/key", "value": "linkerd.io/cni-not-ready"},
                {"op": "remove", "path": "/spec/taints/3"},
                {"op": "test", "path": "/spec/taints/1/key", "value": "linkerd.io/cni-not-ready"},
                {"op": "remove", "path": "/spec/taints/1"},
            ])
        );
    }

    #[test]
    fn reads_null_and_missing_taints() {
        for body in [r#"{"spec":{"taints":null}}"#, r#"{"spec":{}}"#, "{}"] {
            let n: Node = serde_json::from_str(body).unwrap();
            assert!(taints(&n).is_empty(), "{body}");
        }
        let taint = |v| serde_json::from_value::<Taint>(v).unwrap();
        let t = taint(json!({"key": "k", "value": "v", "effect": "NoSchedule"}));
        assert_eq!(describe(&t), "k=v:NoSchedule");
        assert_eq!(
            describe(&taint(json!({"key": "k", "effect": "NoExecute"}))),
            "k:NoExecute"
        );
    }
}

/// Against the fake API server.
#[cfg(test)]
mod api_tests;
