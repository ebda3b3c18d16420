//! The installer command line's way to the API server: one tokio runtime,
//! started with the first call on a thread of its own (the keeper loop on
//! the main thread stays synchronous, and nothing the runtime does blocks
//! it), and kube-rs clients built from the installer's settings: the
//! server (`KUBERNETES_SERVICE_HOST`/`PORT`), the CA (`KUBE_CA_FILE`, which
//! these calls always verify, whatever `SKIP_TLS_VERIFY` says) and a bearer
//! token (this pod's own, read fresh from its mount for each question, or
//! the plugin's, which the installer checks).
//!
//! Synchronous callers reach the runtime through [`run`], always with a
//! time bound. kube's own retry layer is off: [`Api::call`] retries the
//! transient failures itself, a few times within the question's budget,
//! and reports every failure as the plugin's client does ([`ApiError`]),
//! the answer's status and body read raw, so that the API server's own
//! `Status` is told from a proxy's page.

use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::Duration;

use http_body_util::{BodyExt, Limited};
use hyper::{Method as HttpMethod, Request};
use linkerd_cni_kube::error::{
    ATTEMPT_TIMEOUT, CONNECT_TIMEOUT, MAX_ATTEMPTS, MAX_BODY, Method, retry_after,
};
use linkerd_cni_kube::{ApiConfig, ApiError, Trust};
use serde::de::DeserializeOwned;
use tokio::runtime::Handle;
use tokio::time::{Instant, sleep, timeout, timeout_at};

/// The runtime's handle, the runtime started on its own thread at the
/// first call. The admin server and the watches go on it too.
pub fn handle() -> Result<Handle, String> {
    static RUNTIME: OnceLock<Result<Handle, String>> = OnceLock::new();
    RUNTIME
        .get_or_init(|| {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| e.to_string())?;
            let handle = rt.handle().clone();
            // A current-thread runtime's I/O and timers advance only while
            // its own thread drives it: this one does nothing else.
            std::thread::Builder::new()
                .name("api".into())
                .spawn(move || rt.block_on(std::future::pending::<()>()))
                .map_err(|e| e.to_string())?;
            Ok(handle)
        })
        .clone()
        .map_err(|e| format!("cannot start the installer's async runtime: {e}"))
}

/// Runs `f` on the runtime with a client for `config` whose calls all end
/// within `budget`, from a synchronous thread (never from the runtime's
/// own). Err: no client, or no run (neither happens in practice: the calls
/// keep to the budget, and the run is bounded a little past it only in
/// case one did not).
pub fn blocking<T>(
    config: ApiConfig,
    budget: Duration,
    f: impl AsyncFnOnce(&Api) -> T,
) -> Result<T, ApiError> {
    let server = config.server.clone();
    let bound = budget + Duration::from_secs(1);
    let ran = handle().and_then(|rt| {
        // The timer is made inside the runtime's context, not before it.
        let run = async move {
            let api = Api::new(config, budget)?;
            Ok(f(&api).await)
        };
        rt.block_on(async { timeout(bound, run).await })
            .map_err(|_| format!("no answer within {} s", bound.as_secs_f32()))
    });
    ran.unwrap_or_else(|cause| {
        Err(ApiError::Unreachable {
            server,
            method: Method::Get,
            path: String::new(),
            attempts: 1,
            cause: cause.into(),
        })
    })
}

/// A client for one question, whose calls all end within its budget.
pub struct Api {
    client: kube::Client,
    server: String,
    /// Where its token came from, for the errors' hints.
    source: PathBuf,
    budget: Duration,
    deadline: Instant,
}

impl Api {
    /// A client for `config` (always verifying the server: the caller's
    /// [`ApiConfig`] holds the CA), with a budget of `budget` from now.
    /// Within the runtime (kube-rs spawns its request buffer there).
    pub fn new(config: ApiConfig, budget: Duration) -> Result<Api, ApiError> {
        let tls = |cause: String| ApiError::Tls {
            server: config.server.clone(),
            cause: cause.into(),
            handshake_hung: false,
        };
        let url = config
            .server
            .parse()
            .map_err(|e| tls(format!("the server address is not a URL: {e}")))?;
        let mut kc = kube::Config::new(url);
        kc.root_cert = match &config.trust {
            Trust::Roots(ders) => Some(ders.clone()),
            Trust::Insecure => return Err(tls("no CA to verify the server with".into())),
        };
        kc.auth_info.token = (!config.token.is_empty()).then(|| config.token.clone().into());
        kc.connect_timeout = Some(CONNECT_TIMEOUT);
        // One retry policy, this module's: kube's own layer would retry a
        // 503 fifteen times, from 5 ms.
        kc.default_retry = false;
        let client = kube::Client::try_from(kc).map_err(|e| tls(causes(&e).0))?;
        Ok(Api {
            client,
            server: config.server,
            source: config.source,
            budget,
            deadline: Instant::now() + budget,
        })
    }

    /// GETs `path` and decodes the JSON answer.
    pub async fn get<T: DeserializeOwned>(&self, path: &str) -> Result<T, ApiError> {
        self.call(Method::Get, path, None).await
    }

    /// POSTs the JSON `body` to `path` (a create that may happen twice: an
    /// attempt whose answer was lost may have been applied).
    pub async fn create<T: DeserializeOwned>(
        &self,
        path: &str,
        body: &serde_json::Value,
    ) -> Result<T, ApiError> {
        let body = ("application/json", body);
        self.call(Method::Post, path, Some(body)).await
    }

    /// PATCHes `path` with a JSON patch, which must be safe to apply twice.
    pub async fn json_patch<T: DeserializeOwned>(
        &self,
        path: &str,
        patch: &serde_json::Value,
    ) -> Result<T, ApiError> {
        let body = ("application/json-patch+json", patch);
        self.call(Method::Patch, path, Some(body)).await
    }

    /// One call, with a body of its content type when it has one, retried
    /// on transient failures within the budget.
    async fn call<T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: Option<(&str, &serde_json::Value)>,
    ) -> Result<T, ApiError> {
        let decode = |cause| ApiError::Decode {
            method,
            path: path.into(),
            cause,
        };
        let http_method = match method {
            Method::Get => HttpMethod::GET,
            Method::Post => HttpMethod::POST,
            Method::Patch => HttpMethod::PATCH,
        };
        for attempt in 1..=MAX_ATTEMPTS {
            if Instant::now() >= self.deadline {
                return Err(self.timed_out(method, path, None));
            }
            let mut req = Request::builder()
                .method(http_method.clone())
                .uri(path)
                .header("accept", "application/json");
            if let Some((content_type, _)) = body {
                req = req.header("content-type", content_type);
            }
            let bytes = body.map_or_else(Vec::new, |(_, b)| b.to_string().into_bytes());
            let req = req.body(bytes).map_err(|e| decode(e.into()))?;
            let started = Instant::now();
            let bound = self.deadline.min(started + ATTEMPT_TIMEOUT);
            let err = match timeout_at(bound, self.attempt(method, path, req, attempt)).await {
                Ok(Ok(bytes)) => {
                    return serde_json::from_slice(&bytes).map_err(|e| decode(e.into()));
                }
                Ok(Err(e)) => e,
                Err(_) => ApiError::NoAnswer {
                    server: self.server.clone(),
                    method,
                    path: path.into(),
                    after: started.elapsed(),
                },
            };
            let remaining = self.deadline.saturating_duration_since(Instant::now());
            let Some(backoff) = retry_after(&err, attempt, remaining) else {
                // A failure that used up the budget says so.
                return Err(match remaining.is_zero() {
                    true => self.timed_out(method, path, Some(&err)),
                    false => err,
                });
            };
            tracing::debug!("{method} {path} failed ({err}); retrying in {backoff:?}");
            sleep(backoff).await;
        }
        Err(self.timed_out(method, path, None))
    }

    fn timed_out(&self, method: Method, path: &str, last: Option<&ApiError>) -> ApiError {
        ApiError::timed_out(&self.server, method, path, self.budget, last)
    }

    /// One request: the body of a 200 or 201 answer.
    async fn attempt(
        &self,
        method: Method,
        path: &str,
        req: Request<Vec<u8>>,
        attempt: u32,
    ) -> Result<Vec<u8>, ApiError> {
        let res = self
            .client
            .send(req.map(kube::client::Body::from))
            .await
            .map_err(|e| {
                let (cause, tls) = causes(&e);
                match tls {
                    true => ApiError::Tls {
                        server: self.server.clone(),
                        cause: cause.into(),
                        handshake_hung: false,
                    },
                    false => ApiError::Unreachable {
                        server: self.server.clone(),
                        method,
                        path: path.into(),
                        attempts: attempt,
                        cause: cause.into(),
                    },
                }
            })?;
        let status = res.status().as_u16();
        tracing::debug!("{method} {path}: HTTP {status}");
        let body = Limited::new(res.into_body(), MAX_BODY as usize)
            .collect()
            .await
            .map_err(|e| ApiError::Decode {
                method,
                path: path.into(),
                cause: e,
            })?
            .to_bytes();
        match status {
            200 | 201 => Ok(body.to_vec()),
            _ => Err(ApiError::of_answer(
                method,
                path,
                status,
                &body,
                &self.source,
            )),
        }
    }
}

/// `e` and its causes as one line, and whether TLS failed (rustls reports
/// a failed handshake inside an I/O error, which hides it from `source()`).
fn causes(e: &(dyn std::error::Error + 'static)) -> (String, bool) {
    let mut parts: Vec<String> = Vec::new();
    let mut tls = false;
    let mut next = Some(e);
    while let Some(err) = next {
        if let Some(io) = err.downcast_ref::<std::io::Error>()
            && io.get_ref().is_some_and(|i| i.is::<rustls::Error>())
        {
            tls = true;
        }
        tls |= err.is::<rustls::Error>();
        let text = err.to_string();
        // Wrappers often repeat their cause's words.
        if !parts.last().is_some_and(|p| p.contains(&text)) {
            parts.push(text);
        }
        next = err.source();
    }
    (parts.join(": "), tls)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A synchronous caller gets its answer, or, past the bound, an
    /// error, and the runtime still serves the next call.
    #[test]
    fn a_run_is_bounded_and_the_runtime_stays() {
        let server = testkit::FakeApiServer::start();
        let dir = testkit::TempDir::new("lcni-api-run").unwrap();
        let kubeconfig = server.write_kubeconfig(dir.path()).unwrap();
        let config = move || linkerd_cni_kube::kubeconfig::load(&kubeconfig).unwrap();
        let started = std::time::Instant::now();
        let r = blocking(config(), Duration::from_millis(200), async |_| {
            std::future::pending::<()>().await
        });
        assert!(
            matches!(&r, Err(ApiError::Unreachable { cause, .. }) if cause.to_string().contains("no answer within")),
            "{r:?}"
        );
        assert!(started.elapsed() < Duration::from_secs(3));
        let slept = blocking(config(), Duration::from_secs(5), async |_| {
            sleep(Duration::from_millis(10)).await;
            7
        });
        assert_eq!(slept.unwrap(), 7);
        // From another thread too (the Events' sender).
        let other = std::thread::spawn(move || {
            blocking(config(), Duration::from_secs(5), async |_| 8).unwrap()
        });
        assert_eq!(other.join().unwrap(), 8);
    }
}
