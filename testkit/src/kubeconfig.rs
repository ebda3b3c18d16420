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

/// The same kubeconfig as JSON, the layout the installer writes now (JSON
/// is YAML too): `tls` is the cluster's trust key and value (e.g.
/// `("certificate-authority-data", "…".into())` or
/// `("insecure-skip-tls-verify", true.into())`).
pub fn installer_json(server: &str, tls: (&str, serde_json::Value), token: &str) -> String {
    let mut cluster = serde_json::Map::new();
    cluster.insert("server".into(), server.into());
    cluster.insert(tls.0.into(), tls.1);
    let doc = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "local", "cluster": cluster}],
        "users": [{"name": "linkerd-cni", "user": {"token": token}}],
        "contexts": [{
            "name": "linkerd-cni-context",
            "context": {"cluster": "local", "user": "linkerd-cni"},
        }],
        "current-context": "linkerd-cni-context",
    });
    let mut text = serde_json::to_string_pretty(&doc).expect("a JSON value prints");
    text.push('\n');
    text
}
