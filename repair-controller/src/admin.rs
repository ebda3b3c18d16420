//! The admin server: `/live` (the process answers), `/ready` (the first
//! list of this node's pods has been processed) and `/metrics`
//! (Prometheus text), as the chart's probes and scrapers expect them.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;

/// What the admin server reports.
#[derive(Clone)]
pub struct AdminState {
    pub ready: Arc<AtomicBool>,
    pub registry: Arc<Registry>,
}

/// Binds `addr`; the returned listener is served by [`serve`].
pub async fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    TcpListener::bind(addr).await
}

/// Serves the admin endpoints until the task is dropped.
pub async fn serve(listener: TcpListener, state: AdminState) {
    loop {
        let (tcp, _) = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                // Out of file descriptors and the like: try again shortly
                // instead of spinning or giving up the probes.
                tracing::warn!(error = %e, "admin server cannot accept");
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                continue;
            }
        };
        let state = state.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req| {
                let state = state.clone();
                async move { Ok::<_, Infallible>(respond(&req, &state)) }
            });
            let conn = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(tcp), service);
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, "admin connection");
            }
        });
    }
}

fn respond(req: &Request<Incoming>, state: &AdminState) -> Response<Full<Bytes>> {
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return text(StatusCode::METHOD_NOT_ALLOWED, "method not allowed\n");
    }
    match req.uri().path() {
        "/live" => text(StatusCode::OK, "live\n"),
        "/ready" if state.ready.load(Ordering::SeqCst) => text(StatusCode::OK, "ready\n"),
        "/ready" => text(StatusCode::SERVICE_UNAVAILABLE, "not ready\n"),
        "/metrics" => {
            let body = crate::metrics::encode(&state.registry);
            let mut r = Response::new(Full::new(Bytes::from(body)));
            r.headers_mut().insert(
                hyper::header::CONTENT_TYPE,
                hyper::header::HeaderValue::from_static(
                    "application/openmetrics-text; version=1.0.0; charset=utf-8",
                ),
            );
            r
        }
        _ => text(StatusCode::NOT_FOUND, "not found\n"),
    }
}

fn text(status: StatusCode, body: &'static str) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from_static(body.as_bytes())));
    *r.status_mut() = status;
    r
}
