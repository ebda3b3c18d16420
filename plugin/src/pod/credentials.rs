//! What ADD and CHECK do when the API server rejects linkerd-cni's
//! credentials (401, or 403) for the pod GET, or when there are none.
//!
//! The token in the node's kubeconfig is the installer's to renew: a
//! rolling update, a restart or an expiry leaves it rejected until an
//! installer rewrites the kubeconfig. So a rejection is retried within the
//! ADD's deadline, re-reading the kubeconfig on every attempt; what
//! follows when it lasts depends on whether anyone will fix it:
//!
//! - an installer is alive on the node (its heartbeat, see
//!   `linkerd_cni_state::heartbeat`, is fresh): "try again later" (code
//!   11), so that the runtime retries the pod once the kubeconfig is
//!   current. A meshed pod started during a rollout gets its rules, after
//!   a retry at worst, and never a wedged network-validator;
//! - no installer is alive (no heartbeat, or one older than the limit): the
//!   credentials are dead, and the pod passes through without rules, as it
//!   does when the kubeconfig is gone (an uninstall): every other pod on
//!   the node starts, and a meshed one is refused by linkerd's
//!   network-validator. A single rejection is not taken for dead:
//!   [`CONFIRM_ATTEMPTS`] are;
//! - no kubeconfig at all: passed through when no installer is alive (an
//!   uninstall removes its heartbeat with it), but "try again later" while
//!   one is (it writes the kubeconfig: the pod gets its rules on a retry,
//!   and nobody who can only remove the file can let a meshed pod start
//!   without them);
//! - a 403 while the installer is alive but has found, by asking the API
//!   server, that the plugin's credentials may not get pods (their RBAC is
//!   missing, which no new token fixes): passed through as when no
//!   installer is alive. Otherwise every pod of the node would be retried
//!   for as long as the RBAC stays missing, unmeshed ones included.

use std::path::Path;
use std::time::{Duration, Instant};

use linkerd_cni_state::heartbeat::{self, Liveness};
use linkerd_cni_state::outcomes::{Outcome, PassCause, RetryCause};

use super::Stop;
use crate::cni::CniError;
use crate::config::PluginConfig;

/// Rejections in a row, with no installer alive, before the credentials
/// are taken for dead: a lone 401 (an API server that has not yet seen a
/// just-minted token, an authenticator's hiccup) is not.
pub const CONFIRM_ATTEMPTS: u32 = 3;
/// The wait before the second attempt; doubles up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_millis(100);
const MAX_BACKOFF: Duration = Duration::from_secs(1);

/// The pacing of the attempts of one pod GET whose credentials were
/// rejected.
pub(super) struct Retry {
    started: Instant,
    /// No attempt starts after this: what is left of the deadline then is
    /// the rest of the ADD's (the namespace GET, the iptables commands).
    until: Instant,
    /// Attempts made so far, counted by the caller as it makes them.
    pub(super) attempts: u32,
    backoff: Duration,
}

impl Retry {
    /// Attempts end by `deadline`, less what the rest of the ADD needs:
    /// its API budget, or half of what is left when that is less.
    pub(super) fn new(config: &PluginConfig, deadline: Instant) -> Retry {
        let now = Instant::now();
        let left = deadline.saturating_duration_since(now);
        Retry {
            started: now,
            until: deadline
                .checked_sub(config.api_budget.min(left / 2))
                .unwrap_or(deadline),
            attempts: 0,
            backoff: FIRST_BACKOFF,
        }
    }

    /// After a rejection (HTTP `status`), with the installer as its
    /// heartbeat says: how long to wait before trying again, or `None` to
    /// stop.
    pub(super) fn after_rejection(
        &mut self,
        status: u16,
        installer: &Liveness,
    ) -> Option<Duration> {
        if !will_be_renewed(status, installer) && self.attempts >= CONFIRM_ATTEMPTS {
            return None;
        }
        let wait = self.backoff;
        if Instant::now() + wait > self.until {
            return None;
        }
        self.backoff = (self.backoff * 2).min(MAX_BACKOFF);
        Some(wait)
    }

    /// The pod's answer once the retries stop: a pass-through when no
    /// installer is alive, else "try again later".
    pub(super) fn give_up(
        &self,
        pod_id: &str,
        status: u16,
        kubeconfig: &Path,
        installer: &Liveness,
    ) -> Stop {
        let tried = format!(
            "HTTP {status}, {} attempt{} over {:.1} s",
            self.attempts,
            if self.attempts == 1 { "" } else { "s" },
            self.started.elapsed().as_secs_f64()
        );
        match installer {
            // A 403 the installer confirmed: no new token fixes missing
            // RBAC, so retrying would hold back every pod of the node,
            // unmeshed ones included.
            Liveness::Alive {
                plugin_denied: Some(found),
                ..
            } if !will_be_renewed(status, installer) => pass_through(
                PassCause::Forbidden,
                format!(
                    "cannot tell whether pod {pod_id} is meshed: the Kubernetes API forbids \
                     linkerd-cni's credentials to read it ({tried}), and the linkerd-cni \
                     installer on this node found the same ({found}): their RBAC is missing, \
                     which no new token fixes, so the pod starts WITHOUT linkerd's redirect \
                     rules (a meshed pod's linkerd-network-validator refuses to start); fix: \
                     restore the ClusterRole and ClusterRoleBinding of the plugin's \
                     ServiceAccount (deploy/linkerd-cni.yaml), then restart the pods that \
                     started meanwhile (the repair controller restarts meshed ones)"
                ),
            ),
            // Nobody is left to renew the credentials: the pod passes
            // through, as when the kubeconfig is gone, so that the node's
            // other pods start.
            Liveness::Gone(gone) => pass_through(
                match status {
                    403 => PassCause::Forbidden,
                    _ => PassCause::Unauthorized,
                },
                format!(
                    "cannot tell whether pod {pod_id} is meshed: the Kubernetes API rejected \
                     linkerd-cni's credentials ({tried}) and no linkerd-cni installer is alive \
                     on this node to renew them ({gone}), so the pod starts WITHOUT linkerd's \
                     redirect rules (a meshed pod's linkerd-network-validator refuses to start); \
                     fix: the token in {} is stale or lacks RBAC to get pods: check that the \
                     linkerd-cni installer pod runs on this node (it rewrites the kubeconfig), \
                     or, if linkerd-cni was uninstalled, remove the linkerd-cni entry from the \
                     node's CNI config",
                    kubeconfig.display()
                ),
            ),
            // A live installer will rewrite the kubeconfig: the runtime's
            // retry then gives a meshed pod its rules instead of a wedged
            // network-validator.
            Liveness::Alive { age, .. } => try_again(
                RetryCause::CredentialsRejected,
                format!(
                    "cannot tell yet whether pod {pod_id} is meshed: the Kubernetes API \
                     rejected linkerd-cni's credentials ({tried}) while the linkerd-cni \
                     installer on this node is alive (last heartbeat {:.0} s ago) to renew \
                     them; try again later",
                    age.as_secs_f64()
                ),
                format!(
                    "the token in {} is stale (a rolling update or a restart of the \
                     linkerd-cni DaemonSet, or its expiry) until the installer rewrites the \
                     kubeconfig; the runtime retries the pod. If this lasts, read the \
                     installer's log (kubectl -n linkerd-cni logs daemonset/linkerd-cni -c \
                     install-cni) and check that the kubeconfig's ServiceAccount may get \
                     pods, namespaces and Service default/kubernetes",
                    kubeconfig.display()
                ),
            ),
        }
    }
}

/// A pod that cannot be told meshed or not starts without rules: said at
/// error level, since a meshed one is then refused by its
/// network-validator.
fn pass_through(cause: PassCause, why: String) -> Stop {
    log::error!("{why}");
    Stop::PassThrough {
        cause: Outcome::PassedThrough(cause),
        why,
    }
}

/// "Try again later" (code 11), said at warn level: the runtime retries.
fn try_again(cause: RetryCause, msg: String, details: impl Into<String>) -> Stop {
    let e = CniError::try_again(cause, msg, details);
    log::warn!("{}: {}", e.msg, e.details);
    Stop::Failed(e)
}

/// No kubeconfig at `path`: a pass-through when no installer is alive to
/// write it (an uninstall, which removes the heartbeat too, or no
/// installer ever ran here), else "try again later" while it does.
pub(super) fn kubeconfig_missing(config: &PluginConfig, pod_id: &str, path: &Path) -> Stop {
    match installer(config) {
        Liveness::Alive { age, .. } => try_again(
            RetryCause::KubeconfigMissing,
            format!(
                "cannot tell yet whether pod {pod_id} is meshed: the kubeconfig {} does not \
                 exist while the linkerd-cni installer on this node is alive (last heartbeat \
                 {:.0} s ago) to write it; try again later",
                path.display(),
                age.as_secs_f64()
            ),
            "the installer writes the kubeconfig on its next pass; the runtime retries the \
             pod. If this lasts, read the installer's log (kubectl -n linkerd-cni logs \
             daemonset/linkerd-cni -c install-cni)",
        ),
        Liveness::Gone(gone) => pass_through(
            PassCause::KubeconfigMissing,
            format!(
                "cannot tell whether pod {pod_id} is meshed: the kubeconfig {} does not exist \
                 and no linkerd-cni installer is alive on this node to write it ({gone}): \
                 linkerd-cni is being uninstalled, or its installer has not run on this node; \
                 the pod starts without linkerd's redirect rules",
                path.display()
            ),
        ),
    }
}

/// No node agent answered for `pod_id`, and the node holds no credential
/// of the plugin's (`kubernetes.agent-only`), so the API server cannot be
/// asked: "try again later" while the installer's heartbeat says the
/// DaemonSet is there (its agent is starting, restarting or rolling over),
/// meshed pod or not, since which it is cannot be told; a pass-through once
/// it is gone (an uninstall removes the heartbeat), as when the kubeconfig
/// is gone, so that no pod of the node waits for an agent that will not
/// come.
pub(super) fn no_agent(config: &PluginConfig, pod_id: &str) -> Stop {
    match installer(config) {
        Liveness::Alive { age, .. } => try_again(
            RetryCause::NoAgent,
            format!(
                "cannot tell yet whether pod {pod_id} is meshed: no linkerd-cni node agent \
                 answered, and kubernetes.agent-only keeps the plugin off the Kubernetes \
                 API, while the linkerd-cni DaemonSet is alive on this node (last heartbeat \
                 {:.0} s ago); try again later",
                age.as_secs_f64()
            ),
            "the node agent answers once it runs; the runtime retries the pod. If this \
             lasts, read the DaemonSet's log (kubectl -n linkerd-cni logs \
             daemonset/linkerd-cni)",
        ),
        Liveness::Gone(gone) => pass_through(
            PassCause::NoAgent,
            format!(
                "cannot tell whether pod {pod_id} is meshed: no linkerd-cni node agent answered, \
                 kubernetes.agent-only keeps the plugin off the Kubernetes API, and no \
                 linkerd-cni DaemonSet is alive on this node ({gone}): linkerd-cni is being \
                 uninstalled; the pod starts without linkerd's redirect rules"
            ),
        ),
    }
}

/// Whether a rejection with `status` is worth retrying for the installer
/// to fix: it is alive, and this is not a 403 of credentials it found
/// without the RBAC to get pods.
fn will_be_renewed(status: u16, installer: &Liveness) -> bool {
    match installer {
        Liveness::Gone(_) => false,
        Liveness::Alive { plugin_denied, .. } => status != 403 || plugin_denied.is_none(),
    }
}

/// Whether an installer is alive on this node, by its heartbeat in the
/// plugin's state dir.
pub(super) fn installer(config: &PluginConfig) -> Liveness {
    heartbeat::liveness(&config.state_dir, config.installer_gone_after)
}
