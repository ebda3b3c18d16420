//! The admin server: `/live` (the process answers), `/ready` (the first
//! list of this node's pods has been processed) and `/metrics`
//! (Prometheus text), as the chart's probes and scrapers expect them.
//!
//! It listens on the node's network (the DaemonSet uses host networking),
//! so anyone who can reach the node can reach it: [`Limits`] bounds what
//! connections can hold (slots, time), and each kind of refusal is logged
//! at most once a minute, with the count since the last line.

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tokio::time::Instant;

/// What the admin server reports.
#[derive(Clone)]
pub struct AdminState {
    pub ready: Arc<AtomicBool>,
    pub registry: Arc<Registry>,
}

/// What connections may hold. A probe or a scrape is one short request:
/// these leave room for the kubelet and Prometheus while a client that
/// opens connections and sends nothing, or a header a byte at a time,
/// holds a few slots for a few seconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Connections open at once, at most; see [`Limits::for_fd_limit`].
    pub max_connections: usize,
    /// Connections open at once from one peer address.
    pub max_per_peer: usize,
    /// The time to send a request's head, from the moment the server waits
    /// for it: also the idle timeout of a kept-alive connection.
    pub header_read_timeout: Duration,
    /// The longest a connection stays open, requests and all.
    pub max_connection_age: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_connections: 64,
            max_per_peer: 4,
            header_read_timeout: Duration::from_secs(5),
            max_connection_age: Duration::from_secs(60),
        }
    }
}

impl Limits {
    /// At most a quarter of the process' file descriptors go to admin
    /// connections, so that the watch, the API calls and the conf dir
    /// reads keep theirs under a low `RLIMIT_NOFILE`.
    pub fn for_fd_limit(self, max_fds: Option<u64>) -> Limits {
        let share = max_fds.map_or(usize::MAX, |n| usize::try_from(n / 4).unwrap_or(usize::MAX));
        Limits {
            max_connections: self.max_connections.min(share).max(1),
            ..self
        }
    }
}

/// A log line at most every `every`, counting what it left out.
#[derive(Debug)]
pub struct Throttle {
    every: Duration,
    last: Option<Instant>,
    suppressed: u64,
}

impl Throttle {
    pub fn new(every: Duration) -> Throttle {
        Throttle {
            every,
            last: None,
            suppressed: 0,
        }
    }

    /// `Some(suppressed since the last line)` when a line may be logged
    /// now, `None` when this one is to be left out.
    pub fn allow(&mut self, now: Instant) -> Option<u64> {
        match self.last {
            Some(t) if now.saturating_duration_since(t) < self.every => {
                self.suppressed += 1;
                None
            }
            _ => {
                self.last = Some(now);
                Some(std::mem::take(&mut self.suppressed))
            }
        }
    }
}

/// Connections held, in total and per peer address.
#[derive(Debug, Default)]
struct Held {
    total: usize,
    per_peer: HashMap<IpAddr, usize>,
}

/// One connection's share of [`Held`], given back on drop.
struct Slot {
    held: Arc<Mutex<Held>>,
    peer: IpAddr,
}

#[derive(Debug, PartialEq, Eq)]
enum Refusal {
    Total,
    Peer,
}

fn take_slot(held: &Arc<Mutex<Held>>, peer: IpAddr, limits: &Limits) -> Result<Slot, Refusal> {
    let mut h = held.lock().unwrap_or_else(|e| e.into_inner());
    if h.total >= limits.max_connections {
        return Err(Refusal::Total);
    }
    let n = h.per_peer.entry(peer).or_insert(0);
    if *n >= limits.max_per_peer {
        return Err(Refusal::Peer);
    }
    *n += 1;
    h.total += 1;
    Ok(Slot {
        held: held.clone(),
        peer,
    })
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut h = self.held.lock().unwrap_or_else(|e| e.into_inner());
        h.total = h.total.saturating_sub(1);
        if let Some(n) = h.per_peer.get_mut(&self.peer) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                h.per_peer.remove(&self.peer);
            }
        }
    }
}

/// Binds `addr`; the returned listener is served by [`serve`].
pub async fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    TcpListener::bind(addr).await
}

/// Serves the admin endpoints within `limits` until the task is dropped.
pub async fn serve(listener: TcpListener, state: AdminState, limits: Limits) {
    let held = Arc::new(Mutex::new(Held::default()));
    let mut accept_errors = Throttle::new(Duration::from_secs(60));
    let mut refusals = Throttle::new(Duration::from_secs(60));
    loop {
        let (tcp, peer) = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                // Out of file descriptors and the like: try again shortly
                // instead of spinning or giving up the probes.
                if let Some(suppressed) = accept_errors.allow(Instant::now()) {
                    tracing::warn!(error = %e, suppressed, "admin server cannot accept connections; the process may be out of file descriptors");
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let slot = match take_slot(&held, peer.ip(), &limits) {
            Ok(slot) => slot,
            Err(why) => {
                // Closed at once: the fd and the memory go back now.
                drop(tcp);
                if let Some(suppressed) = refusals.allow(Instant::now()) {
                    let (what, limit) = match why {
                        Refusal::Total => ("all peers", limits.max_connections),
                        Refusal::Peer => ("one peer", limits.max_per_peer),
                    };
                    tracing::warn!(%peer, suppressed, "admin server at its connection limit ({limit} for {what}): closing new connections; is something flooding port {}?", listener.local_addr().map(|a| a.port()).unwrap_or(0));
                }
                continue;
            }
        };
        let state = state.clone();
        tokio::spawn(async move {
            let _slot = slot;
            let service = hyper::service::service_fn(move |req| {
                let state = state.clone();
                async move { Ok::<_, Infallible>(respond(&req, &state)) }
            });
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(limits.header_read_timeout)
                .max_buf_size(16 * 1024)
                .serve_connection(TokioIo::new(tcp), service);
            match tokio::time::timeout(limits.max_connection_age, conn).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => tracing::debug!(error = %e, "admin connection"),
                Err(_) => tracing::debug!("admin connection open too long: closed"),
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
            let body = crate::repair::metrics::encode(&state.registry);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_per_peer_and_in_total() {
        let limits = Limits {
            max_connections: 3,
            max_per_peer: 2,
            ..Limits::default()
        };
        let held = Arc::new(Mutex::new(Held::default()));
        let a: IpAddr = "192.0.2.1".parse().unwrap();
        let b: IpAddr = "192.0.2.2".parse().unwrap();
        let a1 = take_slot(&held, a, &limits).unwrap();
        let _a2 = take_slot(&held, a, &limits).unwrap();
        assert_eq!(take_slot(&held, a, &limits).err(), Some(Refusal::Peer));
        let _b1 = take_slot(&held, b, &limits).unwrap();
        assert_eq!(take_slot(&held, b, &limits).err(), Some(Refusal::Total));
        drop(a1);
        let _b2 = take_slot(&held, b, &limits).unwrap();
        assert_eq!(held.lock().unwrap().total, 3);
    }

    #[test]
    fn a_low_fd_limit_lowers_the_cap() {
        let d = Limits::default();
        assert_eq!(d.for_fd_limit(None).max_connections, 64);
        assert_eq!(d.for_fd_limit(Some(1 << 20)).max_connections, 64);
        assert_eq!(d.for_fd_limit(Some(64)).max_connections, 16);
        assert_eq!(d.for_fd_limit(Some(2)).max_connections, 1);
    }

    #[test]
    fn throttle_logs_once_per_interval_with_the_count() {
        let t0 = Instant::now();
        let mut t = Throttle::new(Duration::from_secs(60));
        assert_eq!(t.allow(t0), Some(0));
        for s in 1..=5 {
            assert_eq!(t.allow(t0 + Duration::from_secs(s)), None);
        }
        assert_eq!(t.allow(t0 + Duration::from_secs(61)), Some(5));
        assert_eq!(t.allow(t0 + Duration::from_secs(62)), None);
    }
}
