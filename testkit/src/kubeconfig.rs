//! Kubeconfig text in the layout the installer writes (upstream
//! linkerd2's `linkerd-cni` installer script, which ours follows): one
//! cluster `local`, one user `linkerd-cni` with an inline token, and the
//! context `linkerd-cni-context`, current.

/// The installer's kubeconfig for `server`, with `tls` as the cluster's
/// trust line (e.g. `certificate-authority-data: …` or
/// `insecure-skip-tls-verify: true`) and `token` as the user's.
pub fn installer_text(server: &str, tls: &str, token: &str) -> String {
    format!(
        "# Kubeconfig file for linkerd CNI plugin.
apiVersion: v1
kind: Config
clusters:
- name: local
  cluster:
    server: {server}
    {tls}
users:
- name: linkerd-cni
  user:
    token: {token}
contexts:
- name: linkerd-cni-context
  context:
    cluster: local
    user: linkerd-cni
current-context: linkerd-cni-context
"
    )
}
