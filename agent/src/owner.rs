//! At SIGTERM: uninstall the node or leave it installed? Asked through
//! `linkerd_cni_kube::owner` (which decides: see there) with this pod's own
//! current token, read fresh from its mount (never the node kubeconfig's
//! copy, which is the plugin's, or stale, or another installer's), every
//! call within [`API_TIMEOUT`].

use std::path::Path;
use std::time::Duration;

use linkerd_cni_kube::Client;
use linkerd_cni_kube::owner::{self, Verdict};

use crate::config::Config;
use crate::kubeconfig;

/// The most the question's API calls may take together.
pub const API_TIMEOUT: Duration = Duration::from_secs(5);

/// Asks the API server, within [`API_TIMEOUT`]; without the pod's identity
/// or token, cannot tell.
pub fn ask(cfg: &Config) -> Verdict {
    let (namespace, pod) = match identity(cfg) {
        Ok(id) => id,
        Err(why) => return Verdict::CannotTell(why),
    };
    let api = match kubeconfig::own_api(cfg) {
        Ok(api) => api,
        Err(e) => return Verdict::CannotTell(format!("cannot ask with this pod's token: {e}")),
    };
    owner::verdict(&owner::ask(
        &Client::new(api, API_TIMEOUT),
        &namespace,
        &pod,
    ))
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
