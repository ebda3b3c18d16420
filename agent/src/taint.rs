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
//! The API call is `linkerd_cni_kube::taint::remove_taint`, with this
//! pod's own token (the node's kubeconfig holds the plugin's, which may
//! not patch nodes), within [`API_TIMEOUT`].

use std::time::{Duration, Instant};

use linkerd_cni_kube::Client;
use linkerd_cni_kube::taint::{self, FailureKind, TaintError, TaintOutcome};

use crate::config::Config;
use crate::installer::Installer;
use crate::kubeconfig;

/// The most one removal's API calls may take together.
const API_TIMEOUT: Duration = Duration::from_secs(5);

/// Backoff after the first failure, doubling per failure in a row...
const FIRST_BACKOFF: Duration = Duration::from_secs(5);
/// ...up to this: the node stays unschedulable meanwhile, so not long.
const MAX_BACKOFF: Duration = Duration::from_secs(60);
/// After a 403: RBAC does not change by itself.
const FORBIDDEN_BACKOFF: Duration = Duration::from_secs(600);

/// Why an attempt failed, for saying each kind once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Failure {
    Transient,
    Forbidden,
    Unauthorized,
    Other,
}

#[derive(Debug)]
enum State {
    /// No node name: nothing to do.
    Off,
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
    /// Removed, or found absent: never asked again.
    Done,
}

pub struct StartupTaint {
    node: String,
    key: String,
    cfg: Config,
    state: State,
    /// What the removal did, until the caller reports it ([`Self::removed`]).
    removed: Option<String>,
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
                State::Off
            }
        };
        StartupTaint {
            node: cfg.node_name.clone().unwrap_or_default(),
            key: cfg.startup_taint.clone(),
            cfg: cfg.clone(),
            state,
            removed: None,
        }
    }

    /// After a reconcile pass: when the node is ready and the taint may be
    /// there, asks (at most once) for its removal.
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
        self.record(answer);
    }

    /// The taint's removal, once, after the pass that removed it.
    pub fn removed(&mut self) -> Option<String> {
        self.removed.take()
    }

    /// One removal: Err is the failure's kind and what to say about it.
    fn remove(&self) -> Result<TaintOutcome, (Failure, String)> {
        // Names go into an API path: refuse anything that could change it.
        if !is_path_segment(&self.node) {
            return Err((
                Failure::Other,
                format!(
                    "LINKERD_CNI_NODE_NAME {:?} is not a valid node name",
                    self.node
                ),
            ));
        }
        let api = kubeconfig::own_api(&self.cfg).map_err(|e| (Failure::Other, e))?;
        let client = Client::new(api, API_TIMEOUT);
        taint::remove_taint(&client, &self.node, &self.key).map_err(|e| failure_of(&e))
    }

    fn record(&mut self, answer: Result<TaintOutcome, (Failure, String)>) {
        let (failure, why) = match answer {
            Ok(outcome) => {
                let word = match outcome {
                    TaintOutcome::Removed { .. } => "removed",
                    TaintOutcome::Absent { .. } => "absent",
                };
                tracing::info!("startup taint: {word}: {outcome}");
                if let TaintOutcome::Removed { .. } = outcome {
                    self.removed = Some(format!("startup taint: {outcome}"));
                }
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
            _ => FIRST_BACKOFF
                .saturating_mul(1 << (*failures - 1).min(16))
                .min(MAX_BACKOFF),
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

fn failure_of(e: &TaintError) -> (Failure, String) {
    let failure = match e.kind() {
        FailureKind::Transient => Failure::Transient,
        FailureKind::Forbidden => Failure::Forbidden,
        FailureKind::Unauthorized => Failure::Unauthorized,
        FailureKind::Other => Failure::Other,
    };
    (failure, format!("{e}; {}", e.hint()))
}

/// A node name is a DNS subdomain: lower-case alphanumerics, `-` and `.`.
fn is_path_segment(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
        && s != "."
        && s != ".."
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

    fn failed(failure: Failure) -> Result<TaintOutcome, (Failure, String)> {
        Err((failure, "why".into()))
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
        assert!(first > Instant::now() + FIRST_BACKOFF / 2);
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
}
