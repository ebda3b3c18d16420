//! At SIGTERM: is this an uninstall (the DaemonSet is gone or being
//! deleted) or a rolling update or restart (it is still there)?
//!
//! The installer links no HTTP or TLS code: it runs the plugin binary it
//! ships, `linkerd-cni kube daemonset-gone` (through [`crate::kubecmd`]),
//! which has the plugin's blocking HTTPS client, with the kubeconfig the
//! installer wrote (its own service account's token, still valid while its
//! pod terminates). The child is bounded in time and killed past its bound. Only exit 0 with `gone:` on
//! stdout means gone; anything else (present, no answer, a crash, a
//! missing binary) leaves the node as it is, which the plugin makes safe:
//! once the token is revoked it passes pods through.

use std::path::Path;
use std::time::Duration;

use crate::config::Config;
use crate::kubecmd;

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

/// Asks the API server, through the plugin binary, within
/// [`kubecmd::BOUND`].
pub fn ask(cfg: &Config) -> Verdict {
    let (namespace, pod) = match identity(cfg) {
        Ok(id) => id,
        Err(why) => return Verdict::Unknown(why),
    };
    let bin = kubecmd::plugin(cfg);
    let kubeconfig = cfg.kubeconfig_path();
    if !kubeconfig.exists() {
        return Verdict::Unknown(format!(
            "no kubeconfig to ask the API with ({} does not exist)",
            kubeconfig.display()
        ));
    }
    run(&bin, &kubeconfig, &namespace, &pod, kubecmd::BOUND)
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

fn run(bin: &Path, kubeconfig: &Path, namespace: &str, pod: &str, bound: Duration) -> Verdict {
    let kubeconfig = kubeconfig.to_string_lossy();
    let args = [
        "daemonset-gone",
        "--kubeconfig",
        &kubeconfig,
        "--namespace",
        namespace,
        "--pod",
        pod,
    ];
    let answer = match kubecmd::run_bounded(bin, &args, bound) {
        Ok(a) => a,
        Err(why) => return Verdict::Unknown(why),
    };
    match (answer.code, answer.stdout.trim()) {
        (Some(0), o) if o.starts_with("gone:") => Verdict::Gone(o.to_string()),
        (Some(1), o) if o.starts_with("present:") => Verdict::Present(o.to_string()),
        (code, _) => Verdict::Unknown(format!(
            "{} kube daemonset-gone ({}): {}",
            bin.display(),
            code.map_or("killed by a signal".to_string(), |c| format!("exit {c}")),
            answer.says()
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;
    use std::path::PathBuf;
    use std::time::Instant;

    /// Only exit 0 with `gone:` uninstalls; a hung child is killed at the
    /// bound.
    #[test]
    fn verdicts_from_the_childs_answer() {
        let dir = std::env::temp_dir().join(format!("lcni-owner-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let kc = dir.join("kubeconfig");
        std::fs::write(&kc, "").unwrap();
        let script = |name: &str, body: &str| {
            let p = dir.join(name);
            std::fs::write(&p, format!("#!/bin/sh\n{body}\n")).unwrap();
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
            p
        };
        let ask = |p: &PathBuf, bound| run(p, &kc, "linkerd-cni", "linkerd-cni-x", bound);
        let long = Duration::from_secs(10);
        let gone = script(
            "gone",
            r#"echo "gone: DaemonSet linkerd-cni/x is gone: not found""#,
        );
        assert!(matches!(ask(&gone, long), Verdict::Gone(s) if s.contains("not found")));
        let present = script("present", "echo 'present: exists'; exit 1");
        assert!(matches!(ask(&present, long), Verdict::Present(_)));
        // Exit 0 alone (a stand-in binary, `true`) is not an answer.
        let silent = script("silent", "exit 0");
        assert!(matches!(ask(&silent, long), Verdict::Unknown(_)));
        let wrong = script("wrong", "echo 'gone: x'; exit 1");
        assert!(matches!(ask(&wrong, long), Verdict::Unknown(_)));
        let err = script("err", "echo 'cannot tell: HTTP 403' >&2; exit 2");
        assert!(matches!(ask(&err, long), Verdict::Unknown(s) if s.contains("HTTP 403")));
        assert!(matches!(
            ask(&dir.join("missing"), long),
            Verdict::Unknown(s) if s.contains("cannot run")
        ));
        // The args it is given are the documented ones.
        let args = script(
            "args",
            r#"[ "$*" = "kube daemonset-gone --kubeconfig KC --namespace linkerd-cni --pod linkerd-cni-x --timeout-seconds 5" ] && echo 'gone: ok'"#
                .replace("KC", kc.to_str().unwrap())
                .as_str(),
        );
        assert!(matches!(ask(&args, long), Verdict::Gone(_)));
        let start = Instant::now();
        let hung = script("hung", "exec sleep 30");
        let v = ask(&hung, Duration::from_millis(300));
        assert!(
            matches!(&v, Verdict::Unknown(s) if s.contains("killed")),
            "{v:?}"
        );
        assert!(start.elapsed() < Duration::from_secs(10));
        std::fs::remove_dir_all(&dir).ok();
    }
}
