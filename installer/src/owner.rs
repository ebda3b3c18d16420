//! At SIGTERM: is this an uninstall (the DaemonSet is gone or being
//! deleted) or a rolling update or restart (it is still there)?
//!
//! Asked through `linkerd_cni_kube::owner` with this pod's own current
//! token, read fresh from its mount (never the node kubeconfig's copy,
//! which is the plugin's, or stale, or another installer's), every call
//! within [`API_TIMEOUT`]. Only a definite "gone" uninstalls; anything else
//! (present, no answer, a refusal that does not hold up) leaves the node as
//! it is. One more check before a rejected token counts as an uninstall:
//! the plugin's token (a ServiceAccount of its own) is still accepted when
//! only this pod was deleted (force-deleted, evicted), which revokes this
//! pod's token but not the installation; an uninstall deletes both
//! accounts. Without a plugin token to ask with (the linkerd2-cni chart's
//! RBAC), another installer pod beating on this node says the same.

use std::path::Path;
use std::time::Duration;

use linkerd_cni_kube::owner::{self, OwnerState};
use linkerd_cni_kube::{Client, review};

use crate::config::Config;
use crate::kubeconfig;

/// The most the question's API calls may take together...
pub const API_TIMEOUT: Duration = Duration::from_secs(5);
/// ...and the check of the plugin's token after them.
const PLUGIN_CHECK_TIMEOUT: Duration = Duration::from_secs(2);

/// The answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Gone or being deleted: uninstall. Says how the API put it.
    Gone(String),
    /// Still there: leave everything.
    Present(String),
    /// No answer, and why: leave everything.
    Unknown(String),
}

/// Asks the API server, within [`API_TIMEOUT`]; `state_dir` is the
/// plugin's, where the installers' heartbeat is.
pub fn ask(cfg: &Config, state_dir: &Path) -> Verdict {
    let (namespace, pod) = match identity(cfg) {
        Ok(id) => id,
        Err(why) => return Verdict::Unknown(why),
    };
    let api = match kubeconfig::own_api(cfg) {
        Ok(api) => api,
        Err(e) => return Verdict::Unknown(format!("cannot ask with this pod's token: {e}")),
    };
    let answer = owner::daemonset_of(&Client::new(api, API_TIMEOUT), &namespace, &pod);
    if let Ok(OwnerState::Revoked { status: 401, .. }) = &answer
        && let Some(why) = plugin_token_lives(cfg).or_else(|| another_installer(state_dir, &pod))
    {
        return Verdict::Unknown(why);
    }
    verdict(answer)
}

/// Why this is no uninstall although this pod's token is rejected: another
/// installer pod beats on this node (a force-delete or `maxSurge` overlap;
/// under the linkerd2-cni chart's RBAC there is no plugin token to ask
/// with, and both may hold the same pod's token).
fn another_installer(state_dir: &Path, me: &str) -> Option<String> {
    let (other, age) = linkerd_cni_chain::heartbeat::other_installer(state_dir, me)?;
    Some(format!(
        "this pod's token is rejected (HTTP 401), but installer pod {other} beat on this node \
         {:.1} s ago: this pod was deleted (force-deleted or evicted) while linkerd-cni stays \
         installed",
        age.as_secs_f64()
    ))
}

/// Why this is no uninstall although this pod's token is rejected: the
/// plugin's token, in the node's kubeconfig, is accepted.
fn plugin_token_lives(cfg: &Config) -> Option<String> {
    let t = kubeconfig::file_token(cfg)?;
    if kubeconfig::own_token(cfg).is_ok_and(|own| own == t) {
        return None;
    }
    let api = kubeconfig::api_with(cfg, &t).ok()?;
    let user = review::who_am_i(&Client::new(api, PLUGIN_CHECK_TIMEOUT)).ok()?;
    Some(format!(
        "this pod's token is rejected (HTTP 401), but the plugin's ({user}) is accepted: this \
         pod was deleted (force-deleted or evicted) while linkerd-cni stays installed"
    ))
}

fn verdict(answer: Result<owner::OwnerState, owner::OwnerError>) -> Verdict {
    match answer {
        Ok(state) if state.is_gone() => Verdict::Gone(state.to_string()),
        Ok(state) => Verdict::Present(state.to_string()),
        Err(e) => Verdict::Unknown(format!("{e}. {}", e.advice())),
    }
}

/// This pod's namespace.
pub fn namespace(cfg: &Config) -> Result<String, String> {
    match &cfg.pod_namespace {
        Some(ns) => Ok(ns.clone()),
        None => {
            let f = cfg.service_account_dir.join("namespace");
            read_word(&f).ok_or_else(|| {
                format!(
                    "cannot tell this pod's namespace: LINKERD_CNI_POD_NAMESPACE is not set and {} is unreadable",
                    f.display()
                )
            })
        }
    }
}

/// This pod's namespace and name.
fn identity(cfg: &Config) -> Result<(String, String), String> {
    let namespace = namespace(cfg)?;
    let pod = match &cfg.pod_name {
        Some(p) => p.clone(),
        None => read_word(Path::new("/proc/sys/kernel/hostname")).ok_or(
            "cannot tell this pod's name: LINKERD_CNI_POD_NAME is not set and the host name is unreadable",
        )?,
    };
    Ok((namespace, pod))
}

fn read_word(p: &Path) -> Option<String> {
    let s = crate::fsutil::read_capped_text(p).ok()?;
    let s = s.trim();
    (!s.is_empty()).then(|| s.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use owner::{OwnerError, OwnerState};

    /// Only a state that is gone uninstalls; no answer never does.
    #[test]
    fn verdicts_from_the_answer() {
        let ds = || "linkerd-cni/linkerd-cni".to_string();
        let gone = Ok(OwnerState::Gone {
            daemonset: ds(),
            why: "not found".into(),
        });
        assert!(matches!(verdict(gone), Verdict::Gone(s) if s.contains("not found")));
        let deleting = Ok(OwnerState::Deleting { daemonset: ds() });
        assert!(matches!(verdict(deleting), Verdict::Gone(_)));
        let present = Ok(OwnerState::Present { daemonset: ds() });
        assert!(matches!(verdict(present), Verdict::Present(_)));
        let open = Err(OwnerError::NotOwned {
            pod: "linkerd-cni/x".into(),
        });
        assert!(
            matches!(verdict(open), Verdict::Unknown(s) if s.contains("no controlling DaemonSet"))
        );
    }

    /// The advice fits the cause: RBAC only when RBAC refused.
    #[test]
    fn no_answer_says_its_cause() {
        use linkerd_cni_kube::ApiError;
        use linkerd_cni_kube::client::Method;
        let path = "/apis/apps/v1/namespaces/linkerd-cni/daemonsets/linkerd-cni".to_string();
        let status = |status| ApiError::Status {
            method: Method::Get,
            path: path.clone(),
            status,
            message: "unavailable".into(),
        };
        // No answer in time, or an answer that is no answer (a 503, a 429).
        for source in [
            ApiError::TimedOut {
                server: "https://127.0.0.1:6443".into(),
                method: Method::Get,
                path: path.clone(),
                budget: API_TIMEOUT,
                last: None,
            },
            status(503),
            status(429),
        ] {
            let answer = Err(OwnerError::DaemonSet {
                daemonset: "linkerd-cni/linkerd-cni".into(),
                source,
            });
            let Verdict::Unknown(s) = verdict(answer) else {
                panic!("not unknown")
            };
            assert!(
                s.contains("is unavailable or did not answer in time"),
                "{s}"
            );
            assert!(!s.contains("`get` on daemonsets"), "{s}");
        }
        let forbidden = Err(OwnerError::DaemonSet {
            daemonset: "linkerd-cni/linkerd-cni".into(),
            source: ApiError::Unauthorized {
                status: 403,
                method: Method::Get,
                path,
                kubeconfig: "/host/etc/cni/net.d/ZZZ-linkerd-cni-kubeconfig".into(),
                reason: Some("Forbidden".into()),
            },
        });
        let Verdict::Unknown(s) = verdict(forbidden) else {
            panic!("not unknown")
        };
        assert!(s.contains("`get` on daemonsets"), "{s}");
    }
}
