//! The kubeconfig the installer writes (or any kubeconfig a person points
//! the plugin at): which server, which token, which CA.
//!
//! Only what linkerd-cni needs is read: the context `linkerd-cni-context`
//! (else `current-context`), its cluster's `server`,
//! `certificate-authority[-data]` and `insecure-skip-tls-verify`, and its
//! user's `token` or `tokenFile`. Relative paths are relative to the
//! kubeconfig's directory, as kubectl reads them.
//!
//! A cluster's `proxy-url` is refused rather than ignored: the plugin never
//! reaches the API server through a proxy (see [`crate::client`]), and a
//! kubeconfig that asks for one would otherwise be silently half-applied.
//!
//! Every file read here (the kubeconfig, its tokenFile and CA file, the
//! system bundle) is read as the chain crate reads its input files
//! (`read_file`): a regular file, opened without blocking (a FIFO would
//! block the open until a writer comes, past the ADD deadline), and
//! bounded in size.

use std::path::{Path, PathBuf};

use base64::Engine;
use linkerd_cni_chain::read_file;
use serde::Deserialize;
use thiserror::Error;

/// The context the installer names; preferred over `current-context`.
pub const CONTEXT: &str = "linkerd-cni-context";

/// Where distributions keep the system CA bundle, for a kubeconfig that
/// names no CA (as kubectl would use the system roots).
const SYSTEM_BUNDLES: [&str; 4] = [
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/pki/tls/certs/ca-bundle.crt",
    "/etc/ssl/ca-bundle.pem",
    "/etc/ssl/cert.pem",
];

/// A kubeconfig that cannot be used: the file and the problem (an I/O
/// error's text included).
#[derive(Debug, Error)]
#[error("kubeconfig {path}: {problem}")]
pub struct KubeconfigError {
    pub path: PathBuf,
    pub problem: String,
}

/// How to trust the API server's certificate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Trust {
    /// These CA certificates (DER).
    Roots(Vec<Vec<u8>>),
    /// `insecure-skip-tls-verify: true`.
    Insecure,
}

/// Everything needed to call the API server.
#[derive(Clone, PartialEq, Eq)]
pub struct ApiConfig {
    /// The kubeconfig this came from (for error messages).
    pub source: PathBuf,
    /// `https://host:port[/prefix]`, without a trailing slash.
    pub server: String,
    pub token: String,
    pub trust: Trust,
}

impl ApiConfig {
    /// `http://`: the bearer token crosses the network in clear text.
    pub fn is_plain_http(&self) -> bool {
        self.server.starts_with("http://")
    }

    /// What is weak about how this config reaches the API server, one
    /// sentence each; empty when it uses verified TLS. For logs and status
    /// output (`linkerd-cni chain status` shows them; the installer's checks
    /// can run that).
    pub fn transport_warnings(&self) -> Vec<String> {
        let mut w = Vec::new();
        if self.is_plain_http() {
            w.push(format!(
                "kubeconfig {}: the API server {} is reached over plain http://: the bearer \
                 token crosses the network unencrypted",
                self.source.display(),
                self.server
            ));
        } else if self.trust == Trust::Insecure {
            w.push(format!(
                "kubeconfig {}: TLS verification is off (insecure-skip-tls-verify): the API \
                 server {} is not authenticated and anyone in the path can take the bearer token",
                self.source.display(),
                self.server
            ));
        }
        w
    }
}

impl std::fmt::Debug for ApiConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiConfig")
            .field("source", &self.source)
            .field("server", &self.server)
            .field("token", &"<redacted>")
            .field("trust", &self.trust)
            .finish()
    }
}

#[derive(Debug, Deserialize, Default)]
#[serde(default, rename_all = "kebab-case")]
struct File {
    clusters: Vec<Named<Cluster>>,
    users: Vec<Named<User>>,
    contexts: Vec<Named<Context>>,
    current_context: Option<String>,
}

#[derive(Debug, Deserialize)]
struct Named<T> {
    name: String,
    #[serde(alias = "cluster", alias = "context", alias = "user")]
    value: Option<T>,
}

#[derive(Debug, Deserialize, Default)]
#[serde(default, rename_all = "kebab-case")]
struct Cluster {
    server: Option<String>,
    certificate_authority: Option<String>,
    certificate_authority_data: Option<String>,
    insecure_skip_tls_verify: Option<bool>,
    proxy_url: Option<String>,
}

#[derive(Debug, Deserialize, Default)]
#[serde(default, rename_all = "kebab-case")]
struct User {
    token: Option<String>,
    #[serde(rename = "tokenFile")]
    token_file: Option<String>,
    client_certificate: Option<String>,
    client_certificate_data: Option<String>,
}

#[derive(Debug, Deserialize, Default)]
#[serde(default)]
struct Context {
    cluster: Option<String>,
    user: Option<String>,
}

/// Reads and checks the kubeconfig at `path`, including the CA and token
/// files it names.
pub fn load(path: &Path) -> Result<ApiConfig, KubeconfigError> {
    let text = read_file(path)
        .map_err(|e| format!("cannot read it: {e}"))
        .and_then(|t| String::from_utf8(t).map_err(|_| "it is not UTF-8 text".to_string()));
    text.and_then(|t| parse(&t, path))
        .map_err(|problem| KubeconfigError {
            path: path.to_path_buf(),
            problem,
        })
}

/// Reads kubeconfig `text` already in memory (the installer's own
/// in-cluster identity, rendered as the file it writes); `source` names it
/// in messages and resolves relative file names.
pub fn from_text(text: &str, source: &Path) -> Result<ApiConfig, KubeconfigError> {
    parse(text, source).map_err(|problem| KubeconfigError {
        path: source.to_path_buf(),
        problem,
    })
}

/// Parses kubeconfig text read from `source`, whose directory resolves
/// relative file names.
fn parse(text: &str, source: &Path) -> Result<ApiConfig, String> {
    let base = source.parent().unwrap_or(Path::new("/"));
    if text.trim().is_empty() {
        return Err("it is empty".into());
    }
    let file = match from_json(text) {
        Some(file) => file,
        None => {
            let options = serde_saphyr::options! { with_snippet: false };
            serde_saphyr::from_str_with_options(text, options).map_err(|e| yaml_problem(&e))?
        }
    };
    let (name, ctx) = context(&file)?;
    let (cluster_name, cluster) = named(&file.clusters, "cluster", ctx.cluster.as_deref(), name)?;
    let (user_name, user) = named(&file.users, "user", ctx.user.as_deref(), name)?;
    Ok(ApiConfig {
        source: source.to_path_buf(),
        server: server(cluster_name, cluster)?,
        token: token(user_name, user, base)?,
        trust: trust(cluster_name, cluster, base)?,
    })
}

/// The file read as JSON, which the installer writes (and which is YAML
/// too): a tenth of the YAML parser's work. None for anything else, which
/// the YAML parser then reads, or reports with its line and column.
fn from_json(text: &str) -> Option<File> {
    if !text.trim_start().starts_with('{') {
        return None;
    }
    serde_json::from_str(text).ok()
}

/// The context the installer names, else the current one. Of contexts of
/// one name, the last counts.
fn context(file: &File) -> Result<(&str, &Context), String> {
    let find = |name: &str| file.contexts.iter().rev().find(|c| c.name == name);
    let found = match (find(CONTEXT), file.current_context.as_deref()) {
        (Some(c), _) => c,
        (None, Some(name)) if !name.is_empty() => find(name)
            .ok_or_else(|| format!("current-context {name:?} is not among its contexts"))?,
        (None, _) => return Err(format!("no context {CONTEXT:?} and no current-context")),
    };
    let name = &found.name;
    let ctx = found
        .value
        .as_ref()
        .ok_or_else(|| format!("context {name:?} is empty"))?;
    Ok((name, ctx))
}

/// The `what` (a cluster or a user) context `context` names `name`, with
/// its name.
fn named<'a, T>(
    list: &'a [Named<T>],
    what: &str,
    name: Option<&'a str>,
    context: &str,
) -> Result<(&'a str, &'a T), String> {
    let name = name.ok_or_else(|| format!("context {context:?} names no {what}"))?;
    let value = list
        .iter()
        .find(|c| c.name == name)
        .ok_or_else(|| format!("{what} {name:?} (of context {context:?}) is not defined"))?
        .value
        .as_ref()
        .ok_or_else(|| format!("{what} {name:?} is empty"))?;
    Ok((name, value))
}

/// The cluster's server, normalized; a cluster that asks for a proxy is
/// refused.
fn server(cluster_name: &str, cluster: &Cluster) -> Result<String, String> {
    if cluster
        .proxy_url
        .as_deref()
        .is_some_and(|p| !p.trim().is_empty())
    {
        return Err(format!(
            "cluster {cluster_name:?} sets proxy-url, which linkerd-cni does not support: it \
             always connects to the API server directly; remove proxy-url"
        ));
    }
    normalize_server(
        cluster
            .server
            .as_deref()
            .ok_or_else(|| format!("cluster {cluster_name:?} has no server"))?,
    )
    .map_err(|e| format!("cluster {cluster_name:?}: {e}"))
}

/// The user's bearer token, inline or from its `tokenFile`; empty for a
/// user without credentials, whose requests are anonymous (as with
/// kubectl): the installer writes one until it has minted the plugin's
/// token, and the API server refuses what it asks.
fn token(user_name: &str, user: &User, base: &Path) -> Result<String, String> {
    let token = match (&user.token, &user.token_file) {
        (Some(t), _) if !t.trim().is_empty() => t.trim().to_string(),
        (_, Some(f)) if !f.is_empty() => {
            let p = base.join(f);
            let t =
                read_file(&p).map_err(|e| format!("cannot read tokenFile {}: {e}", p.display()))?;
            let t = String::from_utf8_lossy(&t).trim().to_string();
            if t.is_empty() {
                return Err(format!("tokenFile {} is empty", p.display()));
            }
            t
        }
        _ if user.client_certificate.is_some() || user.client_certificate_data.is_some() => {
            return Err(format!(
                "user {user_name:?} uses a client certificate; linkerd-cni supports bearer tokens (token or tokenFile) only"
            ));
        }
        (None, None) => String::new(),
        _ => return Err(format!("user {user_name:?} has an empty token")),
    };
    Ok(token)
}

/// How to trust the server: not at all when asked, else the cluster's CA
/// (inline or from a file), else the system's bundle.
fn trust(cluster_name: &str, cluster: &Cluster, base: &Path) -> Result<Trust, String> {
    let trust = if cluster.insecure_skip_tls_verify == Some(true) {
        Trust::Insecure
    } else if let Some(data) = cluster
        .certificate_authority_data
        .as_deref()
        .filter(|d| !d.trim().is_empty())
    {
        // Line breaks in the base64 are common in hand-written files.
        let compact: String = data.chars().filter(|c| !c.is_whitespace()).collect();
        let pem = base64::engine::general_purpose::STANDARD
            .decode(compact)
            .map_err(|e| format!("certificate-authority-data is not valid base64: {e}"))?;
        Trust::Roots(certificates(&pem).map_err(|e| format!("certificate-authority-data: {e}"))?)
    } else if let Some(f) = cluster
        .certificate_authority
        .as_deref()
        .filter(|f| !f.is_empty())
    {
        let p = base.join(f);
        let pem = read_file(&p)
            .map_err(|e| format!("cannot read certificate-authority {}: {e}", p.display()))?;
        Trust::Roots(
            certificates(&pem)
                .map_err(|e| format!("certificate-authority {}: {e}", p.display()))?,
        )
    } else {
        system_roots().ok_or_else(|| {
            format!(
                "cluster {cluster_name:?} names no certificate-authority and no system CA bundle was found ({})",
                SYSTEM_BUNDLES.join(", ")
            )
        })?
    };
    Ok(trust)
}

/// A YAML error as line, column and what was expected, never quoting the
/// input: the parser's own text can hold source snippets or the offending
/// value, and a kubeconfig holds a bearer token. The error reaches pod
/// events, which anyone who can list events in the pod's namespace reads.
fn yaml_problem(e: &serde_saphyr::Error) -> String {
    use serde_saphyr::Error as E;
    let at = e
        .location()
        .filter(|l| l.line() > 0)
        .map(|l| format!(" at line {}, column {}", l.line(), l.column()))
        .unwrap_or_default();
    let what = match e.without_snippet() {
        E::Unexpected { expected, .. } => format!("expected {expected}"),
        E::Eof { .. } => "unexpected end of input".into(),
        E::MultipleDocuments { .. } => "more than one YAML document".into(),
        E::Message { msg, .. } => serde_message(msg),
        E::ExternalMessage { msg, .. } if plain_words(msg) => msg.clone(),
        _ => String::new(),
    };
    if what.is_empty() {
        format!("invalid YAML{at}")
    } else {
        format!("invalid YAML{at}: {what}")
    }
}

/// serde's messages without the value they quote: `invalid type: string
/// "…", expected a sequence` becomes `invalid type, expected a sequence`.
fn serde_message(msg: &str) -> String {
    if let Some((head, expected)) = msg.rsplit_once(", expected ") {
        let kind = head.split(':').next().unwrap_or_default();
        if matches!(kind, "invalid type" | "invalid value" | "invalid length") {
            return format!("{kind}, expected {expected}");
        }
    }
    if let Some(field) = msg.strip_prefix("missing field ")
        && plain_words(field.trim_matches('`'))
    {
        return msg.to_string();
    }
    if plain_words(msg) {
        msg.to_string()
    } else {
        String::new()
    }
}

/// Text that cannot be a token or key: lower-case words and punctuation,
/// no digits, no quotes.
fn plain_words(s: &str) -> bool {
    s.len() <= 120
        && s.chars()
            .all(|c| c.is_ascii_lowercase() || matches!(c, ' ' | ',' | ';' | '-' | '(' | ')'))
}

/// The DER certificates in PEM text; at least one, each a certificate
/// rustls can use as a root (checked now: the TLS stack would silently skip
/// a bad one and every call would then fail with an unknown issuer).
fn certificates(pem: &[u8]) -> Result<Vec<Vec<u8>>, String> {
    use rustls::pki_types::{CertificateDer, pem::PemObject};
    let mut out = Vec::new();
    for cert in CertificateDer::pem_slice_iter(pem) {
        let der = cert.map_err(|e| format!("invalid PEM: {e}"))?;
        rustls::RootCertStore::empty()
            .add(der.clone())
            .map_err(|e| format!("certificate {} is not usable as a CA: {e}", out.len() + 1))?;
        out.push(der.to_vec());
    }
    if out.is_empty() {
        return Err("no PEM certificate found".into());
    }
    Ok(out)
}

fn system_roots() -> Option<Trust> {
    SYSTEM_BUNDLES.iter().find_map(|p| {
        let pem = read_file(Path::new(p)).ok()?;
        certificates(&pem).ok().map(Trust::Roots)
    })
}

/// Checks the scheme and host of `server` and brings it to a form the HTTP
/// client takes. The installer writes `https://[HOST]:PORT` for every
/// host, and brackets are only valid around IPv6 addresses, so they are
/// dropped around anything else.
fn normalize_server(server: &str) -> Result<String, String> {
    let s = server.trim();
    let (scheme, rest) = s
        .split_once("://")
        .ok_or_else(|| format!("server {s:?} is not a URL (expected https://host:port)"))?;
    let scheme = scheme.to_ascii_lowercase();
    if scheme != "https" && scheme != "http" {
        return Err(format!("server {s:?}: scheme must be https or http"));
    }
    let (authority, path) = match rest.find(['/', '?', '#']) {
        Some(i) => rest.split_at(i),
        None => (rest, ""),
    };
    if path.contains(['?', '#']) {
        return Err(format!("server {s:?} must not have a query or fragment"));
    }
    if authority.contains('@') {
        return Err(format!("server {s:?} must not carry credentials"));
    }
    // No port and an empty one (`host:`) read alike: the scheme's.
    let (host, port) = match authority.strip_prefix('[') {
        Some(inner) => {
            let (h, after) = inner
                .split_once(']')
                .ok_or_else(|| format!("server {s:?}: unbalanced '['"))?;
            let port = match after {
                "" => "",
                p => p
                    .strip_prefix(':')
                    .ok_or_else(|| format!("server {s:?}: junk after ']'"))?,
            };
            (h, port)
        }
        None => authority.rsplit_once(':').unwrap_or((authority, "")),
    };
    if host.is_empty()
        || !host
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | ':' | '_'))
    {
        return Err(format!("server {s:?} has an invalid host {host:?}"));
    }
    let host = if host.contains(':') {
        host.parse::<std::net::Ipv6Addr>()
            .map_err(|_| format!("server {s:?} has an invalid host {host:?}"))?;
        format!("[{host}]")
    } else {
        host.to_string()
    };
    let port = match port {
        "" => String::new(),
        p => {
            let n: u16 = p
                .parse()
                .ok()
                .filter(|n| *n > 0)
                .ok_or_else(|| format!("server {s:?} has an invalid port {p:?}"))?;
            format!(":{n}")
        }
    };
    Ok(format!(
        "{scheme}://{host}{port}{}",
        path.trim_end_matches('/')
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ca_pem() -> &'static str {
        static PEM: std::sync::OnceLock<String> = std::sync::OnceLock::new();
        PEM.get_or_init(|| testkit::pki::TestPki::new().ca_pem)
    }

    fn b64(s: &str) -> String {
        base64::engine::general_purpose::STANDARD.encode(s)
    }

    /// What the installer writes, with the token the tests look for.
    fn installer(server: &str, tls: &str) -> String {
        testkit::kubeconfig::installer_text(server, tls, "abc.def.ghi")
    }

    #[test]
    fn installer_kubeconfig_with_ca_data() {
        let text = installer(
            "https://[10.96.0.1]:443",
            &format!("certificate-authority-data: {}", b64(ca_pem())),
        );
        let c = parse(&text, Path::new("/etc/cni/net.d")).unwrap();
        assert_eq!(c.server, "https://10.96.0.1:443");
        assert_eq!(c.token, "abc.def.ghi");
        assert!(matches!(&c.trust, Trust::Roots(r) if r.len() == 1));
        assert!(
            !format!("{c:?}").contains("abc.def"),
            "token leaks in Debug"
        );
    }

    #[test]
    fn insecure_and_ipv6_server() {
        let text = installer(
            "https://[fd00:10:96::1]:443/",
            "insecure-skip-tls-verify: true",
        );
        let c = parse(&text, Path::new("/")).unwrap();
        assert_eq!(c.server, "https://[fd00:10:96::1]:443");
        assert_eq!(c.trust, Trust::Insecure);
    }

    #[test]
    fn relative_files_and_current_context() {
        let tmp = testkit::TempDir::new("lcni-kubeconfig").unwrap();
        let dir = tmp.path();
        std::fs::write(dir.join("ca.crt"), ca_pem()).unwrap();
        std::fs::write(dir.join("token"), "  tok-from-file\n").unwrap();
        let text = "
clusters:
- name: c
  cluster: {server: 'https://api.example.com:6443/prefix/', certificate-authority: ca.crt}
users:
- name: u
  user: {tokenFile: token}
contexts:
- {name: other, context: {cluster: c, user: u}}
current-context: other
";
        let c = parse(text, &dir.join("kubeconfig")).unwrap();
        assert_eq!(c.server, "https://api.example.com:6443/prefix");
        assert_eq!(c.token, "tok-from-file");
        assert!(matches!(c.trust, Trust::Roots(_)));
    }

    #[test]
    fn problems_are_named() {
        let ok_tls = format!("certificate-authority-data: {}", b64(ca_pem()));
        for (text, want) in [
            ("", "empty".to_string()),
            ("clusters: [", "invalid YAML".to_string()),
            ("clusters: 5", "invalid YAML".to_string()),
            ("kind: Config\n", "no context".to_string()),
            (
                &installer("10.96.0.1:443", &ok_tls),
                "not a URL".to_string(),
            ),
            (
                &installer("ftp://x:1", &ok_tls),
                "scheme must be https".to_string(),
            ),
            (
                &installer("https://x:99999", &ok_tls),
                "invalid port".to_string(),
            ),
            (
                &installer("https://[10.0.0.1:443", &ok_tls),
                "unbalanced".to_string(),
            ),
            (
                &installer("https://x:443", "certificate-authority-data: '!!'"),
                "not valid base64".to_string(),
            ),
            (
                &installer(
                    "https://x:443",
                    &format!("certificate-authority-data: {}", b64("hello")),
                ),
                "no PEM certificate".to_string(),
            ),
            (
                &installer(
                    "https://x:443",
                    &format!(
                        "certificate-authority-data: {}",
                        b64(
                            "-----BEGIN CERTIFICATE-----\naGVsbG8gd29ybGQ=\n-----END CERTIFICATE-----\n"
                        )
                    ),
                ),
                "not usable as a CA".to_string(),
            ),
            (
                &installer(
                    "https://x:443",
                    "certificate-authority: /nonexistent/ca.crt",
                ),
                "cannot read certificate-authority /nonexistent/ca.crt".to_string(),
            ),
            (
                &installer("https://x", &ok_tls)
                    .replace("token: abc.def.ghi", "tokenFile: /nonexistent/t"),
                "cannot read tokenFile /nonexistent/t".to_string(),
            ),
            (
                &installer("https://x", &ok_tls)
                    .replace("token: abc.def.ghi", "client-certificate-data: eA=="),
                "bearer tokens".to_string(),
            ),
            (
                &installer("https://x:443", "proxy-url: http://127.0.0.1:3128"),
                "sets proxy-url, which linkerd-cni does not support".to_string(),
            ),
            (
                &installer("https://x", &ok_tls).replace("cluster: local", "cluster: elsewhere"),
                "\"elsewhere\" (of context \"linkerd-cni-context\") is not defined".to_string(),
            ),
        ] {
            let e = parse(text, Path::new("/")).unwrap_err();
            assert!(e.contains(&want), "{text:?}: {e}");
        }
    }

    /// Broken kubeconfigs around a token and a client key: no error may
    /// quote either (errors reach pod events and logs).
    #[test]
    fn no_error_quotes_the_token_or_key_material() {
        const TOKEN: &str = "eyJhbGciOiJSUzI1NiJ9.SeCrEtToKeN0123456789.sig";
        const KEY: &str = "LS0tLS1CRUdJTiBSU0EgUFJJVkFURSBLRVktLS0tLQpzZWNyZXRrZXk=";
        let good = testkit::kubeconfig::installer_text(
            "https://10.96.0.1:443",
            &format!("certificate-authority-data: {}", b64(ca_pem())),
            TOKEN,
        )
        .replace(
            &format!("    token: {TOKEN}\n"),
            &format!("    token: {TOKEN}\n    client-key-data: {KEY}\n"),
        );
        let token_line = format!("    token: {TOKEN}");
        let key_line = format!("    client-key-data: {KEY}");
        let mut corpus: Vec<String> = vec![
            // Syntax errors on, before and after the secret lines.
            good.replace(&token_line, &format!("    token: [{TOKEN}")),
            good.replace(&token_line, &format!("    token: \"{TOKEN}")),
            good.replace(&token_line, &format!("    token: '{TOKEN}")),
            good.replace(&token_line, &format!("  token: {TOKEN}\n   x: : :")),
            good.replace(&token_line, &format!("\ttoken: {TOKEN}")),
            good.replace(&token_line, &format!("    token: {{{TOKEN}")),
            good.replace(&token_line, &format!("    token: {TOKEN}\n  - bad")),
            good.replace(&key_line, &format!("    client-key-data: [{KEY}")),
            good.replace(&key_line, &format!("    client-key-data: \"{KEY}\"x")),
            good.replace("  user:\n", "  user: [\n"),
            good.replace("contexts:", "contexts: ]"),
            good.replace("current-context:", "current-context: : :"),
            // Type errors: the secret where another type is expected.
            good.replace(&token_line, &format!("    token: {{a: {TOKEN}}}")),
            good.replace(&token_line, &format!("    token: [{TOKEN}]")),
            good.replace("  user:\n", &format!("  user: {TOKEN}\n")),
            good.replace("users:\n", &format!("users: {TOKEN}\n")),
            good.replace(&token_line, &format!("    tokenFile: [{TOKEN}]")),
            good.replace(&key_line, &format!("    client-key-data: {{k: {KEY}}}")),
            good.replace("- name: linkerd-cni\n", &format!("- name: [{TOKEN}]\n")),
            good.replace(&token_line, &format!("    token: !!binary {TOKEN}")),
            good.replace(&token_line, &format!("    token: !!int {TOKEN}")),
            good.replace(&token_line, &format!("    token: &a {TOKEN}\n    x: *b")),
            good.replace(
                &token_line,
                &format!("    token: {TOKEN}\n    token: {TOKEN}"),
            ),
            format!("{good}\n---\n{good}"),
            good.replace(&token_line, &format!("    token: |\n  {TOKEN}")),
            good.replace(&token_line, &format!("    token: >\n     {TOKEN}\n   x")),
            good.replace(&token_line, &format!("    token: \"{TOKEN}\\q\"")),
        ];
        // Every prefix of the file, cut inside and after the secrets.
        for cut in [token_line.len(), key_line.len()] {
            let at = good
                .find(if cut == token_line.len() {
                    &token_line
                } else {
                    &key_line
                })
                .unwrap();
            for extra in [4, 12, 20, cut - 3] {
                corpus.push(format!("{}\n  - [", &good[..at + extra]));
            }
        }
        // Each variant differs from the good text (else a replace missed).
        assert!(corpus.iter().all(|t| *t != good));
        let mut seen_errors = 0;
        for text in &corpus {
            let Err(e) = parse(text, Path::new("/")) else {
                continue;
            };
            seen_errors += 1;
            for secret in [TOKEN, KEY, "SeCrEtToKeN", "LS0tLS1C"] {
                assert!(
                    !e.contains(secret),
                    "error quotes {secret:?}: {e}\ninput:\n{text}"
                );
            }
            if e.starts_with("invalid YAML") {
                assert!(e.contains("line "), "no line number: {e}");
            }
        }
        assert!(
            seen_errors >= corpus.len() - 3,
            "{seen_errors} of {}",
            corpus.len()
        );
    }

    /// JSON (what the installer writes) and YAML read alike: the same
    /// files in either syntax give the same settings.
    #[test]
    fn json_and_yaml_read_alike() {
        let tmp = testkit::TempDir::new("lcni-kubeconfig-json").unwrap();
        let dir = tmp.path();
        let source = &dir.join("kubeconfig");
        std::fs::write(dir.join("ca.crt"), ca_pem()).unwrap();
        std::fs::write(dir.join("token"), "tok-from-file\n").unwrap();
        let yamls = [
            installer(
                "https://[10.96.0.1]:443",
                &format!("certificate-authority-data: {}", b64(ca_pem())),
            ),
            installer(
                "https://[fd00:10:96::1]:443/",
                "insecure-skip-tls-verify: true",
            ),
            "clusters:\n- name: c\n  cluster: {server: 'https://api.example.com:6443/p/', \
             certificate-authority: ca.crt}\nusers:\n- name: u\n  user: {tokenFile: token}\n\
             contexts:\n- {name: other, context: {cluster: c, user: u}}\ncurrent-context: other\n"
                .to_string(),
        ];
        for yaml in &yamls {
            let value: serde_json::Value = serde_saphyr::from_str(yaml).unwrap();
            let json = serde_json::to_string_pretty(&value).unwrap();
            assert!(from_json(&json).is_some(), "not read as JSON: {json}");
            assert_eq!(
                parse(&json, source).unwrap(),
                parse(yaml, source).unwrap(),
                "{json}"
            );
        }
        let json = testkit::kubeconfig::installer_json(
            "https://[10.96.0.1]:443",
            ("certificate-authority-data", b64(ca_pem()).into()),
            "abc.def.ghi",
        );
        assert_eq!(
            parse(&json, source).unwrap(),
            parse(&yamls[0], source).unwrap()
        );
        // YAML, even when it opens with a brace, still goes to the YAML
        // parser: a flow mapping with a comment after it is not JSON.
        let flow = format!("{} # hand-edited\n", json.trim_end());
        assert!(from_json(&flow).is_none());
        assert_eq!(
            parse(&flow, source).unwrap(),
            parse(&yamls[0], source).unwrap()
        );
    }

    /// Broken JSON around the token: the YAML parser reports it (with its
    /// line and column), and no error quotes the token.
    #[test]
    fn broken_json_errors_quote_no_secret() {
        const TOKEN: &str = "eyJhbGciOiJSUzI1NiJ9.SeCrEtToKeN0123456789.sig";
        let good = testkit::kubeconfig::installer_json(
            "https://10.96.0.1:443",
            ("certificate-authority-data", b64(ca_pem()).into()),
            TOKEN,
        );
        let token_field = format!("\"token\": \"{TOKEN}\"");
        assert!(good.contains(&token_field), "{good}");
        let mut corpus = vec![
            good.replace(&token_field, &format!("\"token\": [\"{TOKEN}\"]")),
            good.replace(&token_field, &format!("\"token\": {{\"a\": \"{TOKEN}\"}}")),
            good.replace(&token_field, &format!("\"token\": \"{TOKEN}\" \"x\"")),
            good.replace(&token_field, &format!("\"token\": \"{TOKEN}\\q\"")),
            good.replace(&token_field, &format!("\"token\": {TOKEN}")),
            good.replace("\"users\": [", &format!("\"users\": \"{TOKEN}\", \"x\": [")),
            good.replace(&token_field, &format!("{token_field}, {token_field}")),
        ];
        let at = good.find(&token_field).unwrap();
        for extra in [3, 12, 20, token_field.len() - 2, token_field.len()] {
            corpus.push(good[..at + extra].to_string());
        }
        assert!(corpus.iter().all(|t| *t != good));
        let mut errors = 0;
        for text in &corpus {
            let Err(e) = parse(text, Path::new("/")) else {
                continue;
            };
            errors += 1;
            assert!(
                !e.contains("SeCrEtToKeN"),
                "error quotes the token: {e}\ninput:\n{text}"
            );
            if e.starts_with("invalid YAML") {
                assert!(e.contains("line "), "no line number: {e}");
            }
        }
        assert!(errors >= corpus.len() - 1, "{errors} of {}", corpus.len());
    }

    use testkit::bounded;

    /// Far longer than a refusal takes.
    const WITHIN: std::time::Duration = std::time::Duration::from_secs(20);

    #[test]
    fn files_that_are_not_regular_are_refused_without_blocking() {
        let tmp = testkit::TempDir::new("lcni-kubeconfig-kinds").unwrap();
        let dir = tmp.path().to_path_buf();
        let fifo = dir.join("fifo");
        testkit::mkfifo(&fifo);
        std::fs::write(dir.join("ca.crt"), ca_pem()).unwrap();
        std::fs::write(dir.join("token"), "tok").unwrap();
        let kubeconfig = |ca: &str, token: &str| {
            format!(
                "clusters:\n- name: c\n  cluster: {{server: 'https://127.0.0.1:6443', certificate-authority: '{ca}'}}\n\
                 users:\n- name: u\n  user: {{tokenFile: '{token}'}}\n\
                 contexts:\n- {{name: linkerd-cni-context, context: {{cluster: c, user: u}}}}\n"
            )
        };
        // The kubeconfig itself.
        let f = fifo.clone();
        let e = bounded("a FIFO kubeconfig", WITHIN, move || load(&f)).unwrap_err();
        assert!(e.to_string().contains("not a regular file"), "{e}");
        // Its tokenFile and certificate-authority: a FIFO, a device, a
        // directory.
        for (what, ca, token) in [
            ("a FIFO tokenFile", "ca.crt", "fifo"),
            ("a FIFO certificate-authority", "fifo", "token"),
            ("a device tokenFile", "ca.crt", "/dev/zero"),
            ("a directory certificate-authority", ".", "token"),
        ] {
            let text = kubeconfig(ca, token);
            let source = dir.join("kubeconfig");
            let e = bounded(what, WITHIN, move || parse(&text, &source)).unwrap_err();
            assert!(e.contains("not a regular file"), "{what}: {e}");
        }
    }

    #[test]
    fn of_contexts_of_one_name_the_last_counts() {
        let text = |contexts: &str| {
            format!(
                "clusters:\n- name: c\n  cluster: {{server: 'https://10.0.0.1', insecure-skip-tls-verify: true}}\n\
                 users:\n- name: u\n  user: {{token: t}}\ncontexts:\n{contexts}"
            )
        };
        let full = "- {name: linkerd-cni-context, context: {cluster: c, user: u}}\n";
        let empty = "- {name: linkerd-cni-context}\n";
        assert!(parse(&text(&format!("{empty}{full}")), Path::new("/")).is_ok());
        let e = parse(&text(&format!("{full}{empty}")), Path::new("/")).unwrap_err();
        assert!(e.contains("is empty"), "{e}");
    }

    #[test]
    fn load_names_the_file() {
        let e = load(Path::new("/nonexistent/ZZZ-linkerd-cni-kubeconfig")).unwrap_err();
        assert_eq!(
            e.path,
            PathBuf::from("/nonexistent/ZZZ-linkerd-cni-kubeconfig")
        );
        let msg = e.to_string();
        assert!(
            msg.starts_with("kubeconfig /nonexistent/ZZZ-linkerd-cni-kubeconfig: cannot read it"),
            "{msg}"
        );
    }
}
