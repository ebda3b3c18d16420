//! The kubeconfig the plugin uses to look pods up: the API server, a
//! bearer token (the plugin's own, see [`crate::credential`]), and how to
//! trust the server, in the shape upstream's installer writes (context
//! `linkerd-cni-context`). The same rendering with the installer's own
//! token, never written, is the installer's identity for its own API calls
//! ([`own_api`]), read fresh from the service-account mount each time.
//!
//! It is rendered at every reconcile and rewritten when the bytes differ,
//! so a CA rotated by the kubelet (which swaps the `..data` symlink) or a
//! new token reaches the node without depending on an event. It holds a
//! bearer token: mode 0600, written atomically.

use std::fmt;
use std::fs;
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use linkerd_cni_chain::write::write_atomic;
use linkerd_cni_kube::ApiConfig;
use serde_json::{Value, json};

use crate::config::Config;
use crate::fsutil::{self, FsError};

/// The most to wait for the conf-dir lock before writing; past it the pass
/// reports the error and the next one tries again.
const LOCK_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

pub const MODE: u32 = 0o600;
use linkerd_cni_kube::kubeconfig::CONTEXT;

#[derive(Debug, thiserror::Error)]
pub enum KubeconfigError {
    #[error(
        "cannot read the service-account token {}: {source}; is the service account token \
         mounted (automountServiceAccountToken) and LINKERD_CNI_SERVICE_ACCOUNT_DIR right?",
        path.display()
    )]
    Token {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("the service-account token {} is empty", path.display())]
    EmptyToken { path: PathBuf },
    #[error(
        "cannot read the API server CA {} (KUBE_CA_FILE): {source}; set KUBE_CA_FILE to the \
         cluster's CA, or SKIP_TLS_VERIFY=true",
        path.display()
    )]
    Ca {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("the API server CA {} (KUBE_CA_FILE) is empty", path.display())]
    EmptyCa { path: PathBuf },
    #[error(transparent)]
    Fs(#[from] FsError),
}

/// How the file on disk compares with what it should be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KubeconfigState {
    Current,
    Missing,
    /// The parts that differ ("server", "token", "CA", or "content").
    Stale(Vec<&'static str>),
    /// Right content, wrong permissions.
    Mode(u32),
}

impl fmt::Display for KubeconfigState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KubeconfigState::Current => f.write_str("current"),
            KubeconfigState::Missing => f.write_str("missing"),
            KubeconfigState::Stale(parts) => write!(f, "stale ({} changed)", parts.join(", ")),
            KubeconfigState::Mode(m) => write!(f, "mode {m:o} instead of {MODE:o}"),
        }
    }
}

/// The kubeconfig's content.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rendered(Value);

impl Rendered {
    /// The document for `server`, trusted through `ca_data` (the CA's PEM,
    /// base64-encoded; `None`: `insecure-skip-tls-verify`), with `token`
    /// (`None`: no credentials yet, while the plugin's token is not minted;
    /// the plugin's requests are then anonymous, which the API server
    /// refuses). Same layout as upstream's installer writes.
    fn new(server: String, ca_data: Option<String>, token: Option<String>) -> Rendered {
        let (trust, value) = match ca_data {
            Some(ca) => ("certificate-authority-data", Value::String(ca)),
            None => ("insecure-skip-tls-verify", Value::Bool(true)),
        };
        Rendered(json!({
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "local", "cluster": {"server": server, trust: value}}],
            "users": [{"name": "linkerd-cni", "user": match token {
                Some(t) => json!({"token": t}),
                None => json!({}),
            }}],
            "contexts": [{
                "name": CONTEXT,
                "context": {"cluster": "local", "user": "linkerd-cni"},
            }],
            "current-context": CONTEXT,
        }))
    }

    /// The file's text: JSON, which is YAML too (kubectl and any
    /// kubeconfig reader take it) and which the plugin parses in a tenth of
    /// the YAML parser's time.
    pub fn text(&self) -> String {
        // A map of strings always prints.
        let mut text = serde_json::to_string_pretty(&self.0).unwrap_or_default();
        text.push('\n');
        text
    }

    /// Which parts of `old` differ from this rendering.
    fn diff(&self, old: &str) -> Vec<&'static str> {
        let Ok(old) = serde_json::from_str::<Value>(old) else {
            // Not ours: an older installer wrote YAML.
            return vec!["content"];
        };
        let (cluster, was) = (
            &self.0["clusters"][0]["cluster"],
            &old["clusters"][0]["cluster"],
        );
        let mut parts = vec![];
        if was["server"] != cluster["server"] {
            parts.push("server");
        }
        if old["users"][0]["user"]["token"] != self.0["users"][0]["user"]["token"] {
            parts.push("token");
        }
        let trust = ["insecure-skip-tls-verify", "certificate-authority-data"];
        if trust.iter().any(|k| was[*k] != cluster[*k]) {
            parts.push("CA");
        }
        if parts.is_empty() {
            parts.push("content");
        }
        parts
    }
}

/// The installer's own service-account token, as its mount holds it now
/// (the kubelet rotates it).
pub fn own_token(cfg: &Config) -> Result<String, KubeconfigError> {
    let token_path = cfg.service_account_dir.join("token");
    let token = fsutil::read_capped_text(&token_path).map_err(|source| KubeconfigError::Token {
        path: token_path.clone(),
        source,
    })?;
    let token = token.trim();
    if token.is_empty() {
        return Err(KubeconfigError::EmptyToken { path: token_path });
    }
    Ok(token.to_string())
}

/// The installer's own identity for its API calls: the server and CA of
/// the configuration, its own current token.
pub fn own_api(cfg: &Config) -> Result<ApiConfig, String> {
    let token = own_token(cfg).map_err(|e| e.to_string())?;
    api_with(cfg, &token)
}

/// The server and CA of the configuration, with `token`: an identity for
/// the installer's own calls, which always verify the server with the CA
/// (`KUBE_CA_FILE`, by default the service account's `ca.crt`).
/// `SKIP_TLS_VERIFY` concerns the kubeconfig written for the plugin only,
/// as upstream's installer has it: these calls carry a token (this pod's,
/// or the plugin's it checks) and the installer acts on their answers, so
/// a server the CA does not vouch for gets neither. Without a CA they
/// fail, naming what to mount or set.
pub fn api_with(cfg: &Config, token: &str) -> Result<ApiConfig, String> {
    let ca = ca_data(cfg).map_err(|e| {
        let problem = match e {
            KubeconfigError::Ca { source, .. } => format!("cannot be read ({source})"),
            _ => "is empty".into(),
        };
        format!(
            "the installer's own API calls need the API server's CA, and {} (KUBE_CA_FILE, by \
             default the service account's ca.crt) {problem}: they always verify the server \
             they send a token to, whatever SKIP_TLS_VERIFY says (it only concerns the \
             kubeconfig written for the plugin); mount the service account's ca.crt \
             (automountServiceAccountToken, or a projected volume with the kube-root-ca.crt \
             ConfigMap) or set KUBE_CA_FILE to the cluster's CA",
            cfg.kube_ca_file.display()
        )
    })?;
    let rendered = Rendered::new(cfg.server_url(), Some(ca), Some(token.to_string()));
    linkerd_cni_kube::kubeconfig::from_text(
        &rendered.text(),
        &cfg.service_account_dir.join("token"),
    )
    .map_err(|e| e.to_string())
}

/// The token in the kubeconfig on disk, as [`Rendered::text`] writes it
/// (another layout has none this installer would keep).
pub fn file_token(cfg: &Config) -> Option<String> {
    token_in(&cfg.kubeconfig_path())
}

/// [`file_token`] of the kubeconfig at `path`.
pub fn token_in(path: &std::path::Path) -> Option<String> {
    let bytes = fsutil::read_optional(path).ok()??;
    let text = String::from_utf8(bytes).ok()?;
    let doc: Value = serde_json::from_str(&text).ok()?;
    let token = doc["users"][0]["user"]["token"].as_str()?;
    (!token.is_empty()).then(|| token.to_string())
}

/// Renders the kubeconfig from the configuration, the CA file as it is
/// now, and `token` (none: a kubeconfig without credentials).
pub fn render(cfg: &Config, token: Option<&str>) -> Result<Rendered, KubeconfigError> {
    // Skip verification when asked, else embed the CA. Unlike upstream, a
    // missing CA file is an error rather than a kubeconfig trusting the
    // system roots, which in-cluster API servers are almost never signed by:
    // the plugin could not use it, and no entry goes in without a
    // kubeconfig the plugin can use.
    let ca = (!cfg.skip_tls_verify).then(|| ca_data(cfg)).transpose()?;
    Ok(Rendered::new(
        cfg.server_url(),
        ca,
        token.map(str::to_string),
    ))
}

/// The CA file as it is now, base64-encoded.
fn ca_data(cfg: &Config) -> Result<String, KubeconfigError> {
    match linkerd_cni_chain::read_file(&cfg.kube_ca_file) {
        Ok(ca) if ca.iter().all(u8::is_ascii_whitespace) => Err(KubeconfigError::EmptyCa {
            path: cfg.kube_ca_file.clone(),
        }),
        Ok(ca) => Ok(STANDARD.encode(ca)),
        Err(source) => Err(KubeconfigError::Ca {
            path: cfg.kube_ca_file.clone(),
            source,
        }),
    }
}

/// Compares the file with `want`.
pub fn state(cfg: &Config, want: &Rendered) -> Result<KubeconfigState, FsError> {
    let path = cfg.kubeconfig_path();
    let Some(old) = fsutil::read_optional(&path)? else {
        return Ok(KubeconfigState::Missing);
    };
    let old = String::from_utf8_lossy(&old);
    if old != want.text() {
        return Ok(KubeconfigState::Stale(want.diff(&old)));
    }
    let mode = fs::metadata(&path)
        .map_err(|e| FsError::new("cannot stat", &path, e))?
        .permissions()
        .mode()
        & 0o7777;
    if mode != MODE {
        return Ok(KubeconfigState::Mode(mode));
    }
    Ok(KubeconfigState::Current)
}

/// Makes the file current with `token`; returns the state it was in when
/// it wrote.
pub fn ensure(
    cfg: &Config,
    token: Option<&str>,
) -> Result<Option<KubeconfigState>, KubeconfigError> {
    let want = render(cfg, token)?;
    match state(cfg, &want)? {
        KubeconfigState::Current => Ok(None),
        before => {
            // It lives in the conf dir, where temp files exist only under
            // the conf-dir lock (a lock holder removes any other as a
            // leftover).
            let _lock = linkerd_cni_chain::lock_dir(&cfg.conf_dir(), LOCK_TIMEOUT, None)
                .map_err(FsError::from)?;
            let path = cfg.kubeconfig_path();
            write_atomic(&path, want.text().as_bytes(), MODE).map_err(FsError::from)?;
            Ok(Some(before))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A self-signed CA certificate (its key thrown away), for a CA file
    /// the kube crate accepts.
    const TEST_CA: &str = "-----BEGIN CERTIFICATE-----\nMIIBqDCCAU2gAwIBAgIULLZsvw/Qi5P9Iw9enU/p5RK9DhEwCgYIKoZIzj0EAwIw\nKDEmMCQGA1UEAwwdbGlua2VyZC1jbmkgaW5zdGFsbGVyIHRlc3QgQ0EwIBcNMjYx\nMjAxMjI0MzI5WhgPMjEyNjExMDcyMjQzMjlaMCgxJjAkBgNVBAMMHWxpbmtlcmQt\nY25pIGluc3RhbGxlciB0ZXN0IENBMFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAE\nozjvTd+WdFrDCdJTg5bfpe1tNn0iHhRSRyjoFANbxmdyUo9KPPO5tgETM3FlL+8q\ndZ16fnOGTzTP/KfsltJBbaNTMFEwHQYDVR0OBBYEFFdelIvv1hbINRrkuzHW5IiG\nPhJwMB8GA1UdIwQYMBaAFFdelIvv1hbINRrkuzHW5IiGPhJwMA8GA1UdEwEB/wQF\nMAMBAf8wCgYIKoZIzj0EAwIDSQAwRgIhAPbDHx7F83NsI0LZHSL3/2FnY0m1HQsU\nNGcbmlvUZytLAiEAx7sX24omgQJEfq5gEqEo8IfpJCo3YX7k/ElKXmjF5zs=\n-----END CERTIFICATE-----\n";

    fn cfg(sa: &std::path::Path, skip: bool) -> Config {
        let sa = sa.display().to_string();
        Config::from_env(|k| {
            match k {
                "KUBERNETES_SERVICE_HOST" => Some("127.0.0.1"),
                "KUBERNETES_SERVICE_PORT" => Some("6443"),
                "CNI_NETWORK_CONFIG" => Some(r#"{"type":"linkerd-cni"}"#),
                "LINKERD_CNI_SERVICE_ACCOUNT_DIR" => Some(sa.as_str()),
                "SKIP_TLS_VERIFY" => Some(if skip { "true" } else { "false" }),
                _ => None,
            }
            .map(str::to_string)
        })
        .unwrap()
    }

    /// SKIP_TLS_VERIFY=true concerns the kubeconfig written for the plugin
    /// only: the installer's own calls verify the server with the service
    /// account's CA, and without a usable one they are not made.
    #[test]
    fn skip_tls_verify_never_covers_the_installers_own_calls() {
        let tmp = testkit::TempDir::new("kubeconfig-own-ca").unwrap();
        let sa = tmp.path();
        fs::write(sa.join("token"), "own-token").unwrap();
        let c = cfg(sa, true);
        let insecure = |r: &Rendered| r.text().contains("\"insecure-skip-tls-verify\": true");
        // No CA: the plugin's kubeconfig skips verification, as asked; the
        // installer's calls fail, saying why and what to do.
        assert!(insecure(&render(&c, Some("t")).unwrap()));
        for e in [api_with(&c, "t").unwrap_err(), own_api(&c).unwrap_err()] {
            assert!(e.contains(&sa.join("ca.crt").display().to_string()), "{e}");
            assert!(
                e.contains("SKIP_TLS_VERIFY") && e.contains("KUBE_CA_FILE"),
                "{e}"
            );
        }
        fs::write(sa.join("ca.crt"), "").unwrap();
        assert!(api_with(&c, "t").unwrap_err().contains("is empty"));
        // A CA file that holds no certificate is refused, not skipped.
        fs::write(sa.join("ca.crt"), "CA-1").unwrap();
        assert!(api_with(&c, "t").is_err());
        // The service account's CA: the installer's calls trust it alone.
        fs::write(sa.join("ca.crt"), TEST_CA).unwrap();
        assert!(insecure(&render(&c, Some("t")).unwrap()));
        for api in [api_with(&c, "t").unwrap(), own_api(&c).unwrap()] {
            assert!(
                matches!(&api.trust, linkerd_cni_kube::Trust::Roots(r) if r.len() == 1),
                "{api:?}"
            );
        }
        // KUBE_CA_FILE, when set, is that CA.
        let elsewhere = tmp.path().join("elsewhere.pem");
        fs::write(&elsewhere, TEST_CA).unwrap();
        fs::remove_file(sa.join("ca.crt")).unwrap();
        let mut c = cfg(sa, true);
        c.kube_ca_file = elsewhere;
        assert!(api_with(&c, "t").is_ok());
        // Without SKIP_TLS_VERIFY, the plugin's kubeconfig has the CA too.
        let c = cfg(sa, false);
        assert!(render(&c, Some("t")).is_err());
    }

    #[test]
    fn shape_and_diff() {
        let server = || "https://[fd00::1]:443".to_string();
        let ca = || Some("Q0E=".to_string());
        let r = Rendered::new(server(), ca(), Some("tok\"en".into()));
        let text = r.text();
        let doc: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(
            doc["clusters"][0]["cluster"]["server"], "https://[fd00::1]:443",
            "{text}"
        );
        assert_eq!(
            doc["clusters"][0]["cluster"]["certificate-authority-data"],
            "Q0E="
        );
        assert_eq!(doc["users"][0]["user"]["token"], "tok\"en", "{text}");
        assert_eq!(doc["current-context"], CONTEXT);
        assert_eq!(doc["contexts"][0]["name"], CONTEXT);
        assert_eq!(doc["contexts"][0]["context"]["cluster"], "local");
        assert!(text.ends_with("}\n"));

        let rotated = Rendered::new(server(), ca(), Some("new".into()));
        assert_eq!(rotated.diff(&text), ["token"]);
        let insecure = Rendered::new(server(), None, Some("tok\"en".into()));
        assert_eq!(insecure.diff(&text), ["CA"]);
        assert_eq!(r.diff(&insecure.text()), ["CA"]);
        let insecure_text = insecure.text();
        // No token yet: a user without credentials, which the plugin's
        // client reads as anonymous.
        let none = Rendered::new(server(), None, None);
        let none_text = none.text();
        let doc: Value = serde_json::from_str(&none_text).unwrap();
        assert_eq!(
            doc["users"][0]["user"],
            serde_json::json!({}),
            "{none_text}"
        );
        assert_eq!(none.diff(&insecure_text), ["token"]);
        assert_eq!(insecure.diff(&none_text), ["token"]);
        let api = linkerd_cni_kube::kubeconfig::from_text(
            &none_text,
            std::path::Path::new("/nonexistent"),
        )
        .expect("a kubeconfig without credentials is valid");
        assert!(api.token.is_empty());
        let moved = Rendered::new("https://[fd00::2]:443".into(), ca(), Some("tok\"en".into()));
        assert_eq!(moved.diff(&text), ["server"]);
        assert_eq!(
            r.diff(&text.replace("\"kind\": \"Config\"", "\"kind\": \"X\"")),
            ["content"]
        );
        // What an older installer wrote: YAML.
        assert_eq!(r.diff("apiVersion: v1\nkind: Config\n"), ["content"]);
    }
}
