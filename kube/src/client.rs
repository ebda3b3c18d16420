//! A blocking HTTPS client for the few GETs the plugin makes, with one time
//! budget for all calls of an invocation. (The node agent's calls go
//! through kube-rs; it shares this module's errors, [`ApiError`].)
//!
//! ureq (blocking, rustls with the ring provider) rather than kube + tokio:
//! the plugin is a short-lived process, and an async runtime would cost
//! start-up time and megabytes for three GETs.
//!
//! No proxy, ever: the API server a CNI plugin talks to is the cluster's
//! own, reached over the node's network. Container runtimes often carry the
//! node's `HTTPS_PROXY`/`NO_PROXY` (whose CIDR entries HTTP clients tend to
//! ignore), and honouring them would hand the bearer token to an egress
//! proxy. So the proxy settings of the environment are ignored, and the
//! connector chain has no proxy step at all (TCP, then TLS).
//!
//! Every call is bounded: a connect timeout, a per-attempt timeout, and the
//! invocation's budget, which retries never exceed. Only transient failures
//! are retried (refused or reset connections, timeouts, 429, 5xx), a few
//! times with a short backoff, so a down API server fails an ADD in well
//! under a second rather than at the end of the budget.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::{Duration, Instant};

use serde::de::DeserializeOwned;
use thiserror::Error;
use ureq::config::Config as UreqConfig;
use ureq::http::Uri;
use ureq::tls::{Certificate, RootCerts, TlsConfig, TlsProvider};
use ureq::unversioned::resolver::{DefaultResolver, ResolvedSocketAddrs, Resolver};
use ureq::unversioned::transport::{
    ConnectionDetails, Connector, NextTimeout, RustlsConnector, TcpConnector, Transport,
};

use crate::kubeconfig::{ApiConfig, Trust};
use crate::names;
use crate::objects::{Namespace, Pod, Service};

/// The most one TCP (and TLS) connect may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// The most one attempt (connect, request, answer) may take.
const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(5);
/// Attempts per call, the first included.
const MAX_ATTEMPTS: u32 = 4;
/// Backoff before the second attempt; doubles for each further one.
const FIRST_BACKOFF: Duration = Duration::from_millis(100);
/// Pods with many containers and managed fields are large; this bounds
/// what a misbehaving server can make us read.
pub const MAX_BODY: u64 = 16 << 20;
/// Each transport's read buffer (ureq's default is 128 KiB, zero-filled per
/// connection, for both the TCP and the TLS layer): room for one TLS
/// record's plaintext and any answer's header block; bodies stream through
/// it.
const INPUT_BUFFER: usize = 16 << 10;
/// Each transport's write buffer must hold a request's head: the token plus
/// the other headers, which take well under 1 KiB.
const OUTPUT_BUFFER_SPARE: usize = 4 << 10;

/// What an [`ApiError`] ran into underneath: the HTTP, TLS or JSON stack's
/// error, or our words where the stack has no error value.
pub type Cause = Box<dyn std::error::Error + Send + Sync>;

/// The HTTP methods of the calls an [`ApiError`] is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    Get,
    Patch,
    Post,
}

impl std::fmt::Display for Method {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Method::Get => "GET",
            Method::Patch => "PATCH",
            Method::Post => "POST",
        })
    }
}

/// A failed API call.
#[derive(Debug, Error)]
pub enum ApiError {
    #[error(
        "cannot reach the Kubernetes API at {server} ({method} {path}, {attempts} attempt{}): {cause}",
        if *.attempts == 1 { "" } else { "s" }
    )]
    Unreachable {
        server: String,
        method: Method,
        path: String,
        attempts: u32,
        #[source]
        cause: Cause,
    },
    #[error(
        "no answer from the Kubernetes API at {server} to {method} {path} within linkerd-cni's {} s budget{}",
        .budget.as_secs_f32(),
        .last.as_deref().map(|l| format!(" (last attempt: {l})")).unwrap_or_default()
    )]
    TimedOut {
        server: String,
        method: Method,
        path: String,
        budget: Duration,
        /// What the last attempt ran into, when it failed before the budget
        /// ran out.
        last: Option<String>,
    },
    #[error("the Kubernetes API at {server} accepted the connection but did not answer {method} {path} within {:.1} s", .after.as_secs_f32())]
    NoAnswer {
        server: String,
        method: Method,
        path: String,
        after: Duration,
    },
    #[error(
        "the Kubernetes API {} (HTTP {status} for {method} {path})",
        if *.status == 403 {
            "does not allow linkerd-cni's service account this request"
        } else {
            "refused linkerd-cni's credentials"
        }
    )]
    Unauthorized {
        status: u16,
        method: Method,
        path: String,
        kubeconfig: PathBuf,
        /// The `reason` of the answer's Kubernetes `Status` body
        /// (`Unauthorized`, `Forbidden`); None when the body was not one
        /// (a proxy's page, say), so that a caller can tell the API
        /// server's own refusal from something in the way.
        reason: Option<String>,
    },
    #[error("{method} {path}: not found")]
    NotFound {
        method: Method,
        path: String,
        /// The answer's Kubernetes `Status` body; None when the body was
        /// not one (a proxy's page, an empty answer), so that a caller can
        /// tell the API server's own NotFound from something in the way.
        /// (Boxed: it would make every `ApiError` larger.)
        status: Option<Box<StatusBody>>,
    },
    #[error("{method} {path}: HTTP {status}: {message}")]
    Status {
        method: Method,
        path: String,
        status: u16,
        message: String,
    },
    #[error("TLS with the Kubernetes API at {server} failed: {cause}")]
    Tls {
        server: String,
        #[source]
        cause: Cause,
        /// The handshake did not finish in time (rather than failing).
        handshake_hung: bool,
    },
    #[error("{method} {path}: cannot read the answer: {cause}")]
    Decode {
        method: Method,
        path: String,
        #[source]
        cause: Cause,
    },
    /// Refused before any request: the API server would refuse it too.
    #[error("refusing {what} name {name:?}: not a valid Kubernetes name ({rule})")]
    InvalidName {
        what: &'static str,
        name: String,
        rule: &'static str,
    },
}

/// A namespace, checked and encoded for a path.
pub fn valid_namespace(name: &str) -> Result<String, ApiError> {
    if !names::is_dns_label(name) {
        return Err(ApiError::InvalidName {
            what: "namespace",
            name: name.to_string(),
            rule: "a DNS-1123 label: at most 63 lowercase letters, digits and '-'",
        });
    }
    Ok(names::segment(name))
}

/// A pod's or DaemonSet's name, checked and encoded for a path.
pub fn valid_name(what: &'static str, name: &str) -> Result<String, ApiError> {
    if !names::is_dns_subdomain(name) {
        return Err(ApiError::InvalidName {
            what,
            name: name.to_string(),
            rule: "a DNS-1123 subdomain: at most 253 lowercase letters, digits, '-' and '.'",
        });
    }
    Ok(names::segment(name))
}

impl ApiError {
    /// The failure an answer with HTTP `status` (not a success) and `body`
    /// says, to `method path` made with the credentials of `kubeconfig`.
    pub fn of_answer(
        method: Method,
        path: &str,
        status: u16,
        body: &[u8],
        kubeconfig: &std::path::Path,
    ) -> ApiError {
        match status {
            401 | 403 => ApiError::Unauthorized {
                status,
                method,
                path: path.into(),
                kubeconfig: kubeconfig.into(),
                reason: status_reason(body),
            },
            404 => ApiError::NotFound {
                method,
                path: path.into(),
                status: StatusBody::parse(body).map(Box::new),
            },
            _ => ApiError::Status {
                method,
                path: path.into(),
                status,
                message: status_message(body),
            },
        }
    }

    /// What an operator should do about it.
    pub fn hint(&self) -> String {
        match self {
            ApiError::Unreachable { .. } | ApiError::TimedOut { .. } => {
                "check that the API server is up and reachable from the node (the kubeconfig's \
                 server address); the pod start is retried by the kubelet"
                    .into()
            }
            ApiError::NoAnswer { .. } => {
                "the API server is reachable but overloaded or stuck; the pod start is retried \
                 by the kubelet"
                    .into()
            }
            ApiError::Unauthorized { kubeconfig, .. } => format!(
                "the token in {} is stale or lacks RBAC to get pods, namespaces and services; \
                 the linkerd-cni installer DaemonSet rewrites this kubeconfig from its service \
                 account: check that its pod on this node is running, or restart it \
                 (kubectl -n linkerd-cni rollout restart daemonset/linkerd-cni)",
                kubeconfig.display()
            ),
            ApiError::Tls { handshake_hung: true, .. } => {
                "something at the server address accepts TCP connections but does not speak TLS \
                 (a proxy, a firewall, a wrong port?): check the kubeconfig's server address"
                    .into()
            }
            ApiError::Tls { .. } => {
                "check the certificate-authority in the kubeconfig (the installer writes the \
                 cluster's CA) and the server address"
                    .into()
            }
            ApiError::NotFound { .. } => {
                "the object does not exist (yet, or any more); the pod start is retried by the kubelet"
                    .into()
            }
            ApiError::Status { .. } | ApiError::Decode { .. } => {
                "the API server's answer was unexpected; see the message".into()
            }
            ApiError::InvalidName { .. } => {
                "the name comes from the container runtime's CNI_ARGS (K8S_POD_NAMESPACE, \
                 K8S_POD_NAME) or the installer's environment: check what set it"
                    .into()
            }
        }
    }

    /// Worth retrying later: the server was unreachable, slow or overloaded.
    pub fn transient(&self) -> bool {
        match self {
            ApiError::Unreachable { .. }
            | ApiError::TimedOut { .. }
            | ApiError::NoAnswer { .. }
            | ApiError::Tls {
                handshake_hung: true,
                ..
            } => true,
            ApiError::Status { status, .. } => *status == 429 || *status >= 500,
            _ => false,
        }
    }
}

/// ring's provider, offering AES-128-GCM with SHA-256 first: the TLS 1.3
/// key schedule's HMACs over SHA-256 cost a short-lived client 2% of an
/// unmeshed ADD less than SHA-384's (callgrind). It is what Go's TLS stack,
/// the API server's, prefers too; the other suites stay offered.
fn provider() -> rustls::crypto::CryptoProvider {
    use rustls::CipherSuite::TLS13_AES_128_GCM_SHA256;
    let mut p = rustls::crypto::ring::default_provider();
    p.cipher_suites
        .sort_by_key(|s| s.suite() != TLS13_AES_128_GCM_SHA256);
    p
}

/// A client for one API server, with the budget of one invocation.
pub struct Client {
    agent: ureq::Agent,
    /// How far the current attempt's connection got (see [`Phase`]).
    phase: Arc<AtomicU8>,
    config: ApiConfig,
    budget: Duration,
    deadline: Instant,
}

impl Client {
    /// A client whose calls, retries included, all end within `budget` from
    /// now.
    pub fn new(config: ApiConfig, budget: Duration) -> Client {
        let provider = Arc::new(provider());
        let tls = TlsConfig::builder()
            .provider(TlsProvider::Rustls)
            .unversioned_rustls_crypto_provider(provider);
        let tls = match &config.trust {
            Trust::Insecure => tls.disable_verification(true),
            Trust::Roots(ders) => tls.root_certs(RootCerts::new_with_certs(
                &ders
                    .iter()
                    .map(|d| Certificate::from_der(d).to_owned())
                    .collect::<Vec<_>>(),
            )),
        };
        let agent_config = ureq::Agent::config_builder()
            .tls_config(tls.build())
            .proxy(None)
            .http_status_as_error(false)
            // The API server does not redirect; following one could send the
            // token elsewhere.
            .max_redirects(0)
            .timeout_connect(Some(CONNECT_TIMEOUT))
            .input_buffer_size(INPUT_BUFFER)
            .output_buffer_size(config.token.len() + OUTPUT_BUFFER_SPARE)
            .user_agent(concat!("linkerd-cni/", env!("CARGO_PKG_VERSION")))
            .build();
        let phase = Arc::new(AtomicU8::new(Phase::Pooled as u8));
        let mark = |p: Phase| Mark {
            phase: phase.clone(),
            to: p,
        };
        let connector =
            ().chain(mark(Phase::Connecting))
                .chain(TcpConnector::default())
                .chain(mark(Phase::TcpConnected))
                .chain(RustlsConnector::default())
                .chain(mark(Phase::Secured));
        let agent = ureq::Agent::with_parts(agent_config, connector, LiteralResolver::default());
        Client {
            agent,
            phase,
            config,
            budget,
            deadline: Instant::now() + budget,
        }
    }

    pub fn pod(&self, namespace: &str, name: &str) -> Result<Pod, ApiError> {
        let (ns, name) = (valid_namespace(namespace)?, valid_name("pod", name)?);
        self.get(&format!("/api/v1/namespaces/{ns}/pods/{name}"))
    }

    pub fn namespace(&self, name: &str) -> Result<Namespace, ApiError> {
        let ns = valid_namespace(name)?;
        self.get(&format!("/api/v1/namespaces/{ns}"))
    }

    /// Service `default/kubernetes`: the API server's ports.
    /// (A fixed path: no name to check.)
    pub fn kubernetes_service(&self) -> Result<Service, ApiError> {
        self.get("/api/v1/namespaces/default/services/kubernetes")
    }

    /// GETs `path` and decodes the JSON answer, retrying transient failures
    /// within the budget.
    pub fn get<T: DeserializeOwned>(&self, path: &str) -> Result<T, ApiError> {
        self.call(Method::Get, path)
    }

    fn call<T: DeserializeOwned>(&self, method: Method, path: &str) -> Result<T, ApiError> {
        let mut attempt = 1;
        loop {
            let remaining = self.deadline.saturating_duration_since(Instant::now());
            if remaining.is_zero() {
                return Err(self.timed_out(method, path, None));
            }
            let req = Req { method, path };
            let err = match self.attempt(&req, remaining.min(ATTEMPT_TIMEOUT), attempt) {
                Ok(body) => {
                    return serde_json::from_slice(&body).map_err(|e| ApiError::Decode {
                        method,
                        path: path.into(),
                        cause: e.into(),
                    });
                }
                Err(e) => e,
            };
            let backoff = FIRST_BACKOFF * 2u32.pow(attempt - 1);
            let remaining = self.deadline.saturating_duration_since(Instant::now());
            if !err.transient() || attempt >= MAX_ATTEMPTS || backoff >= remaining {
                // A timeout that used up the budget says so, whatever the
                // attempt's own error was.
                return Err(if remaining.is_zero() {
                    self.timed_out(method, path, Some(&err))
                } else {
                    err
                });
            }
            // Debug only: the error the call ends with, if it fails, counts
            // its attempts and says the last cause; one that then succeeds
            // needs nobody's attention.
            log::debug!("{method} {path} failed ({err}); retrying in {backoff:?}");
            std::thread::sleep(backoff);
            attempt += 1;
        }
    }

    /// The budget ran out; `last` is what the last attempt ran into.
    fn timed_out(&self, method: Method, path: &str, last: Option<&ApiError>) -> ApiError {
        let last = last.map(|e| match e {
            ApiError::Unreachable { cause, .. } | ApiError::Tls { cause, .. } => cause.to_string(),
            ApiError::NoAnswer { after, .. } => {
                format!(
                    "connected, but no answer within {:.1} s",
                    after.as_secs_f32()
                )
            }
            other => other.to_string(),
        });
        ApiError::TimedOut {
            server: self.config.server.clone(),
            method,
            path: path.into(),
            budget: self.budget,
            last,
        }
    }

    /// One request; the body of a 200 answer.
    fn attempt(&self, req: &Req<'_>, timeout: Duration, attempt: u32) -> Result<Vec<u8>, ApiError> {
        let (method, path) = (req.method, req.path);
        let url = format!("{}{path}", self.config.server);
        self.phase.store(Phase::Pooled as u8, Ordering::SeqCst);
        let started = Instant::now();
        // No token: an anonymous request (a kubeconfig without credentials).
        let auth = (!self.config.token.is_empty()).then(|| format!("Bearer {}", self.config.token));
        // What every call carries, whatever its method and body.
        fn common<B>(
            rb: ureq::RequestBuilder<B>,
            timeout: Duration,
            auth: Option<&str>,
        ) -> ureq::RequestBuilder<B> {
            let rb = rb
                .config()
                .timeout_global(Some(timeout))
                .timeout_connect(Some(timeout.min(CONNECT_TIMEOUT)))
                .build();
            match auth {
                Some(a) => rb.header("Authorization", a),
                None => rb,
            }
            .header("Accept", "application/json")
        }
        let res = common(self.agent.get(&url), timeout, auth.as_deref()).call();
        let mut res = res.map_err(|e| self.classify(req, e, attempt, started))?;
        let status = res.status().as_u16();
        log::debug!("{method} {path}: HTTP {status}");
        let body = res
            .body_mut()
            .with_config()
            .limit(MAX_BODY)
            .read_to_vec()
            .map_err(|e| self.classify(req, e, attempt, started))?;
        match status {
            200 | 201 => Ok(body),
            _ => Err(ApiError::of_answer(
                method,
                path,
                status,
                &body,
                &self.config.source,
            )),
        }
    }

    fn classify(&self, req: &Req<'_>, e: ureq::Error, attempts: u32, started: Instant) -> ApiError {
        let (method, path) = (req.method, req.path);
        let server = self.config.server.clone();
        let unreachable = |cause: Cause| ApiError::Unreachable {
            server: server.clone(),
            method,
            path: path.into(),
            attempts,
            cause,
        };
        match e {
            // Which timer fired says less than how far the connection got:
            // the attempt's global timer can fire in any phase, and ureq
            // counts the TLS handshake as part of connecting.
            ureq::Error::Timeout(t) => {
                let after = started.elapsed();
                let secs = after.as_secs_f32();
                match Phase::from(self.phase.load(Ordering::SeqCst)) {
                    Phase::Connecting if t == ureq::Timeout::Resolve => unreachable(
                        format!("resolving the host name timed out after {secs:.1} s").into(),
                    ),
                    Phase::Connecting => unreachable(
                        format!("the TCP connection timed out after {secs:.1} s").into(),
                    ),
                    Phase::TcpConnected => ApiError::Tls {
                        server,
                        cause: format!(
                            "the TLS handshake did not finish within {secs:.1} s of the TCP \
                             connection being made"
                        )
                        .into(),
                        handshake_hung: true,
                    },
                    Phase::Secured | Phase::Pooled => ApiError::NoAnswer {
                        server,
                        method,
                        path: path.into(),
                        after,
                    },
                }
            }
            ureq::Error::Rustls(e) => ApiError::Tls {
                server,
                cause: e.into(),
                handshake_hung: false,
            },
            ureq::Error::Tls(e) => ApiError::Tls {
                server,
                cause: e.into(),
                handshake_hung: false,
            },
            ureq::Error::Io(io) => {
                // rustls reports handshake failures (e.g. an unknown CA) as
                // I/O errors wrapping its own error.
                if let Some(inner) = io.get_ref()
                    && inner.is::<rustls::Error>()
                {
                    return ApiError::Tls {
                        server,
                        cause: inner.to_string().into(),
                        handshake_hung: false,
                    };
                }
                unreachable(io.into())
            }
            ureq::Error::HostNotFound => unreachable("host not found (DNS)".into()),
            ureq::Error::ConnectionFailed => unreachable("connection failed".into()),
            ureq::Error::Protocol(e) => ApiError::Decode {
                method,
                path: path.into(),
                cause: format!("HTTP protocol error: {e}").into(),
            },
            other => ApiError::Decode {
                method,
                path: path.into(),
                cause: other.into(),
            },
        }
    }
}

/// One request of a call: what [`Client::attempt`] sends.
struct Req<'a> {
    method: Method,
    path: &'a str,
}

/// How far an attempt's connection got, recorded by [`Mark`]s between the
/// connectors, so a timeout can name what did not happen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
enum Phase {
    /// No connector ran: a pooled connection was reused.
    Pooled,
    /// Resolving and making the TCP connection.
    Connecting,
    /// TCP connected; the TLS handshake is under way.
    TcpConnected,
    /// TLS established; the request is under way.
    Secured,
}

impl From<u8> for Phase {
    fn from(v: u8) -> Phase {
        match v {
            1 => Phase::Connecting,
            2 => Phase::TcpConnected,
            3 => Phase::Secured,
            _ => Phase::Pooled,
        }
    }
}

/// A connector that passes the transport through and records the phase.
#[derive(Debug)]
struct Mark {
    phase: Arc<AtomicU8>,
    to: Phase,
}

impl<In: Transport> Connector<In> for Mark {
    type Out = In;

    fn connect(
        &self,
        _: &ConnectionDetails,
        chained: Option<In>,
    ) -> Result<Option<In>, ureq::Error> {
        self.phase.store(self.to as u8, Ordering::SeqCst);
        Ok(chained)
    }
}

/// The most of an answer's message an error carries: it is logged, and
/// returned to the runtime as the CNI error's details.
const MAX_MESSAGE_CHARS: usize = 512;
/// A `reason` is one CamelCase word.
const MAX_REASON_CHARS: usize = 64;

/// The `reason` of a Kubernetes `Status` body, made printable; None for any
/// other body.
fn status_reason(body: &[u8]) -> Option<String> {
    let v: serde_json::Value = serde_json::from_slice(body).ok()?;
    if v.get("kind")?.as_str()? != "Status" {
        return None;
    }
    let reason = v.get("reason")?.as_str()?;
    Some(crate::text::printable(reason, MAX_REASON_CHARS))
}

/// What a Kubernetes `Status` body (`kind: Status`) says about a failed
/// call: the API server's own answer, as a proxy's page is not.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatusBody {
    /// `reason`, e.g. `NotFound` (empty when absent).
    pub reason: String,
    /// `details.kind`, the resource the answer is about (e.g. `daemonsets`).
    pub kind: Option<String>,
    /// `details.name`, the object's name.
    pub name: Option<String>,
}

impl StatusBody {
    /// The Status body in `body`; None for any other body.
    pub fn parse(body: &[u8]) -> Option<StatusBody> {
        let v: serde_json::Value = serde_json::from_slice(body).ok()?;
        if v.get("kind")?.as_str()? != "Status" {
            return None;
        }
        let text = |v: Option<&serde_json::Value>| v?.as_str().map(str::to_string);
        let details = v.get("details");
        Some(StatusBody {
            reason: text(v.get("reason")).unwrap_or_default(),
            kind: text(details.and_then(|d| d.get("kind"))),
            name: text(details.and_then(|d| d.get("name"))),
        })
    }
}

/// Resolves a server given as an IP address without a lookup: ureq's
/// resolver runs every lookup on a thread of its own (to bound it in time),
/// even for a literal, which the installer's kubeconfig always has (the
/// service's cluster IP). Host names go to ureq's resolver.
#[derive(Debug, Default)]
struct LiteralResolver {
    names: DefaultResolver,
}

impl Resolver for LiteralResolver {
    fn resolve(
        &self,
        uri: &Uri,
        config: &UreqConfig,
        timeout: NextTimeout,
    ) -> Result<ResolvedSocketAddrs, ureq::Error> {
        if let Some(addr) = literal_addr(uri) {
            let mut addrs = self.empty();
            addrs.push(addr);
            return Ok(addrs);
        }
        self.names.resolve(uri, config, timeout)
    }
}

/// The socket address of an `https` URI whose host is an IP address.
fn literal_addr(uri: &Uri) -> Option<std::net::SocketAddr> {
    if uri.scheme_str() != Some("https") {
        return None;
    }
    let authority = uri.authority()?;
    let host = authority.host();
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    let ip: std::net::IpAddr = host.parse().ok()?;
    Some(std::net::SocketAddr::new(
        ip,
        authority.port_u16().unwrap_or(443),
    ))
}

/// The `message` of a Kubernetes `Status` body, else the start of the body;
/// either made printable (one line, no terminal escapes, bounded).
fn status_message(body: &[u8]) -> String {
    if let Ok(v) = serde_json::from_slice::<serde_json::Value>(body)
        && let Some(m) = v.get("message").and_then(|m| m.as_str())
    {
        return crate::text::printable(m, MAX_MESSAGE_CHARS);
    }
    let s = String::from_utf8_lossy(body);
    match s.trim() {
        "" => "empty answer".into(),
        s => crate::text::printable(s, 200),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aes_128_is_offered_first_and_nothing_is_dropped() {
        let ours: Vec<_> = provider().cipher_suites.iter().map(|s| s.suite()).collect();
        let ring: Vec<_> = rustls::crypto::ring::default_provider()
            .cipher_suites
            .iter()
            .map(|s| s.suite())
            .collect();
        assert_eq!(ours[0], rustls::CipherSuite::TLS13_AES_128_GCM_SHA256);
        assert_eq!(ours.len(), ring.len());
        assert!(ring.iter().all(|s| ours.contains(s)));
    }

    /// What the server says in an error is logged and returned to the
    /// runtime: one line, no terminal escapes, bounded, whether it is a
    /// Status body's message or reason or any other body.
    #[test]
    fn error_bodies_become_one_printable_bounded_line() {
        let forged = "denied\n2026-01-01T00:00:00.000Z WARN  linkerd-cni[1]: \u{1b}[31mforged\r\n";
        let status = serde_json::json!({
            "kind": "Status", "reason": "Forbidden\nforged", "message": forged,
        })
        .to_string();
        for m in [
            status_message(status.as_bytes()),
            status_message(forged.as_bytes()),
            status_reason(status.as_bytes()).unwrap(),
        ] {
            assert!(!m.chars().any(char::is_control), "{m:?}");
            assert!(m.contains("\\n"), "{m:?}");
        }
        let long = serde_json::json!({"kind": "Status", "message": "x".repeat(100_000)});
        let m = status_message(long.to_string().as_bytes());
        assert_eq!(m.len(), MAX_MESSAGE_CHARS + 3, "{m}");
        assert_eq!(status_message(b"  "), "empty answer");
        assert_eq!(
            status_message(br#"{"kind":"Status","message":"pods \"p\" not found"}"#),
            r#"pods "p" not found"#
        );
    }

    #[test]
    fn literal_addresses_skip_the_lookup_and_names_do_not() {
        let addr = |u: &str| literal_addr(&u.parse().unwrap()).map(|a| a.to_string());
        assert_eq!(addr("https://127.0.0.2/api"), Some("127.0.0.2:443".into()));
        assert_eq!(
            addr("https://127.0.0.1:6443"),
            Some("127.0.0.1:6443".into())
        );
        assert_eq!(
            addr("https://[fd00::1]:6443/x"),
            Some("[fd00::1]:6443".into())
        );
        assert_eq!(addr("https://[::1]"), Some("[::1]:443".into()));
        assert_eq!(addr("https://kubernetes.default.svc:443"), None);
        assert_eq!(addr("https://127.0.0.1.nip.io"), None);
        // Plain HTTP (a test or a local proxy) keeps ureq's default port rules.
        assert_eq!(addr("http://127.0.0.1"), None);
    }
}
