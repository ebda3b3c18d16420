//! A blocking HTTPS client for the few GETs the plugin makes, with one time
//! budget for all calls of an invocation. (The node agent's calls go
//! through kube-rs, and it builds this crate without this module: feature
//! `client`.)
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

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use serde::de::DeserializeOwned;
use ureq::config::Config as UreqConfig;
use ureq::http::Uri;
use ureq::tls::{Certificate, RootCerts, TlsConfig, TlsProvider};
use ureq::unversioned::resolver::{DefaultResolver, ResolvedSocketAddrs, Resolver};
use ureq::unversioned::transport::{
    ConnectionDetails, Connector, NextTimeout, RustlsConnector, TcpConnector, Transport,
};

use crate::error::{
    ATTEMPT_TIMEOUT, ApiError, CONNECT_TIMEOUT, Cause, MAX_BODY, Method, retry_after, valid_name,
    valid_namespace,
};
use crate::kubeconfig::{ApiConfig, Trust};
use crate::objects::{Namespace, Pod, Service};

/// Each transport's read buffer (ureq's default is 128 KiB, zero-filled per
/// connection, for both the TCP and the TLS layer): room for one TLS
/// record's plaintext and any answer's header block; bodies stream through
/// it.
const INPUT_BUFFER: usize = 16 << 10;
/// Each transport's write buffer must hold a request's head: the token plus
/// the other headers, which take well under 1 KiB.
const OUTPUT_BUFFER_SPARE: usize = 4 << 10;

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
    phase: Arc<Mutex<Phase>>,
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
        let phase = Arc::new(Mutex::new(Phase::Connected));
        let mark = |p: Phase| Mark {
            phase: phase.clone(),
            to: p,
        };
        let connector =
            ().chain(mark(Phase::Connecting))
                .chain(TcpConnector::default())
                .chain(mark(Phase::TcpConnected))
                .chain(RustlsConnector::default())
                .chain(mark(Phase::Connected));
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
        let method = Method::Get;
        let mut attempt = 1;
        loop {
            let remaining = self.deadline.saturating_duration_since(Instant::now());
            if remaining.is_zero() {
                return Err(self.timed_out(method, path, None));
            }
            let err = match self.attempt(path, remaining.min(ATTEMPT_TIMEOUT), attempt) {
                Ok(body) => {
                    return serde_json::from_slice(&body).map_err(|e| ApiError::Decode {
                        method,
                        path: path.into(),
                        cause: e.into(),
                    });
                }
                Err(e) => e,
            };
            let remaining = self.deadline.saturating_duration_since(Instant::now());
            let Some(backoff) = retry_after(&err, attempt, remaining) else {
                // A timeout that used up the budget says so, whatever the
                // attempt's own error was.
                return Err(if remaining.is_zero() {
                    self.timed_out(method, path, Some(&err))
                } else {
                    err
                });
            };
            // Debug only: the error the call ends with, if it fails, counts
            // its attempts and says the last cause; one that then succeeds
            // needs nobody's attention.
            log::debug!("{method} {path} failed ({err}); retrying in {backoff:?}");
            std::thread::sleep(backoff);
            attempt += 1;
        }
    }

    fn timed_out(&self, method: Method, path: &str, last: Option<&ApiError>) -> ApiError {
        ApiError::timed_out(&self.config.server, method, path, self.budget, last)
    }

    /// One GET of `path`; the body of a 200 answer.
    fn attempt(&self, path: &str, timeout: Duration, attempt: u32) -> Result<Vec<u8>, ApiError> {
        let method = Method::Get;
        set(&self.phase, Phase::Connected);
        let started = Instant::now();
        let rb = self
            .agent
            .get(format!("{}{path}", self.config.server))
            .config()
            .timeout_global(Some(timeout))
            .timeout_connect(Some(timeout.min(CONNECT_TIMEOUT)))
            .build()
            .header("Accept", "application/json");
        // No token: an anonymous request (a kubeconfig without credentials).
        let rb = match self.config.token.as_str() {
            "" => rb,
            token => rb.header("Authorization", format!("Bearer {token}")),
        };
        let mut res = rb
            .call()
            .map_err(|e| self.classify(path, e, attempt, started))?;
        let status = res.status().as_u16();
        log::debug!("{method} {path}: HTTP {status}");
        let body = res
            .body_mut()
            .with_config()
            .limit(MAX_BODY)
            .read_to_vec()
            .map_err(|e| self.classify(path, e, attempt, started))?;
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

    fn classify(&self, path: &str, e: ureq::Error, attempts: u32, started: Instant) -> ApiError {
        let method = Method::Get;
        let server = self.config.server.clone();
        let unreachable = |cause: Cause| ApiError::Unreachable {
            server: server.clone(),
            method,
            path: path.into(),
            attempts,
            cause,
        };
        let tls = |cause: Cause, handshake_hung| ApiError::Tls {
            server: server.clone(),
            cause,
            handshake_hung,
        };
        let decode = |cause: Cause| ApiError::Decode {
            method,
            path: path.into(),
            cause,
        };
        match e {
            // Which timer fired says less than how far the connection got:
            // the attempt's global timer can fire in any phase, and ureq
            // counts the TLS handshake as part of connecting.
            ureq::Error::Timeout(t) => {
                let after = started.elapsed();
                let secs = after.as_secs_f32();
                match *self.phase.lock().unwrap_or_else(PoisonError::into_inner) {
                    Phase::Connecting if t == ureq::Timeout::Resolve => unreachable(
                        format!("resolving the host name timed out after {secs:.1} s").into(),
                    ),
                    Phase::Connecting => unreachable(
                        format!("the TCP connection timed out after {secs:.1} s").into(),
                    ),
                    Phase::TcpConnected => tls(
                        format!(
                            "the TLS handshake did not finish within {secs:.1} s of the TCP \
                             connection being made"
                        )
                        .into(),
                        true,
                    ),
                    Phase::Connected => ApiError::NoAnswer {
                        server,
                        method,
                        path: path.into(),
                        after,
                    },
                }
            }
            ureq::Error::Rustls(e) => tls(e.into(), false),
            ureq::Error::Tls(e) => tls(e.into(), false),
            ureq::Error::Io(io) => {
                // rustls reports handshake failures (e.g. an unknown CA) as
                // I/O errors wrapping its own error.
                if let Some(inner) = io.get_ref()
                    && inner.is::<rustls::Error>()
                {
                    return tls(inner.to_string().into(), false);
                }
                unreachable(io.into())
            }
            ureq::Error::HostNotFound => unreachable("host not found (DNS)".into()),
            ureq::Error::ConnectionFailed => unreachable("connection failed".into()),
            ureq::Error::Protocol(e) => decode(format!("HTTP protocol error: {e}").into()),
            other => decode(other.into()),
        }
    }
}

/// How far an attempt's connection got, recorded by [`Mark`]s between the
/// connectors, so a timeout can name what did not happen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Resolving and making the TCP connection.
    Connecting,
    /// TCP connected; the TLS handshake is under way.
    TcpConnected,
    /// The request is under way: on a new connection once TLS is up, or
    /// on a pooled one (no connector ran, so no mark moved it).
    Connected,
}

/// Records that the attempt's connection got to `to` (a poisoned lock
/// still holds a phase).
fn set(phase: &Mutex<Phase>, to: Phase) {
    *phase.lock().unwrap_or_else(PoisonError::into_inner) = to;
}

/// A connector that passes the transport through and records the phase.
#[derive(Debug)]
struct Mark {
    phase: Arc<Mutex<Phase>>,
    to: Phase,
}

impl<In: Transport> Connector<In> for Mark {
    type Out = In;

    fn connect(
        &self,
        _: &ConnectionDetails,
        chained: Option<In>,
    ) -> Result<Option<In>, ureq::Error> {
        set(&self.phase, self.to);
        Ok(chained)
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
    // An IPv6 host comes in its URI brackets.
    let ip: std::net::IpAddr = authority.host().trim_matches(['[', ']']).parse().ok()?;
    Some(std::net::SocketAddr::new(
        ip,
        authority.port_u16().unwrap_or(443),
    ))
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
