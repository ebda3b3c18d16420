//! At SIGTERM: is this an uninstall (the DaemonSet is gone or being
//! deleted) or a rolling update or restart (it is still there)?
//!
//! Asked through `linkerd_cni_kube::owner` with the kubeconfig the
//! installer wrote (its own service account's token, still valid while its
//! pod terminates), every call within [`API_TIMEOUT`]. Only a definite
//! "gone" uninstalls; anything else (present, no answer, no kubeconfig)
//! leaves the node as it is, which the plugin makes safe: once the token is
//! revoked it passes pods through.

use std::path::Path;
use std::time::Duration;

use linkerd_cni_kube::{Client, kubeconfig, owner};

use crate::config::Config;

/// The most the question's API calls may take together.
pub const API_TIMEOUT: Duration = Duration::from_secs(5);

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

/// Asks the API server, within [`API_TIMEOUT`].
pub fn ask(cfg: &Config) -> Verdict {
    let (namespace, pod) = match identity(cfg) {
        Ok(id) => id,
        Err(why) => return Verdict::Unknown(why),
    };
    let path = cfg.kubeconfig_path();
    if !path.exists() {
        return Verdict::Unknown(format!(
            "no kubeconfig to ask the API with ({} does not exist)",
            path.display()
        ));
    }
    let api = match kubeconfig::load(&path) {
        Ok(api) => api,
        Err(e) => return Verdict::Unknown(e.to_string()),
    };
    verdict(owner::daemonset_of(
        &Client::new(api, API_TIMEOUT),
        &namespace,
        &pod,
    ))
}

fn verdict(answer: Result<owner::OwnerState, owner::OwnerError>) -> Verdict {
    match answer {
        Ok(state) if state.is_gone() => Verdict::Gone(state.to_string()),
        Ok(state) => Verdict::Present(state.to_string()),
        Err(e) => Verdict::Unknown(e.to_string()),
    }
}

/// This pod's namespace and name.
fn identity(cfg: &Config) -> Result<(String, String), String> {
    let namespace = match &cfg.pod_namespace {
        Some(ns) => ns.clone(),
        None => {
            let f = cfg.service_account_dir.join("namespace");
            read_word(&f).ok_or_else(|| {
                format!(
                    "cannot tell this pod's namespace: LINKERD_CNI_POD_NAMESPACE is not set and {} is unreadable",
                    f.display()
                )
            })?
        }
    };
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
}
