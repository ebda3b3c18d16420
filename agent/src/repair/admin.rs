//! The one admin server of a process: `/metrics` (one registry, the
//! installer's and the repair controller's families), `/live` (the process
//! answers, and the repair controller beside the installer has not
//! stopped) and, with a repair controller, `/ready` (the first list of this
//! node's pods has been processed), as the chart's probes and scrapers
//! expect them. One request per connection, on each of its listeners.
//!
//! A TCP listener is on the node's network (the DaemonSet uses host
//! networking), so any pod can reach it: [`Limits`] bounds what connections
//! can hold (slots, time), each listener its own. When they are all taken,
//! the oldest connection that has not sent a whole request head makes room
//! for the new one, so that silent connections cannot blind a probe or a
//! scrape; each kind of refusal is logged at most once a minute, with the
//! count since the last line. The installer also accepts on a root-only
//! socket in its state dir ([`SOCKET`]), which no pod can reach: deploy/'s
//! liveness probe asks there (`linkerd-cni-installer check --live`).

use std::convert::Infallible;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use prometheus_client::registry::Registry;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, UnixListener};
use tokio::sync::oneshot;

use crate::notes::Throttle;

/// The installer's admin socket, in its state dir.
pub const SOCKET: &str = "admin.sock";

/// What the admin server reports.
#[derive(Clone)]
pub struct AdminState {
    /// Serves `/ready` (from this) when set: a repair controller's.
    pub ready: Option<Arc<AtomicBool>>,
    /// `/live` answers 200 while this holds: cleared when the repair
    /// controller beside the installer stops, so that the kubelet restarts
    /// the container.
    pub live: Arc<AtomicBool>,
    pub registry: Arc<Registry>,
    pub format: Format,
    /// Comment lines the page ends with (Prometheus' format only), made
    /// when it is scraped: what the metrics cannot say, such as a file
    /// that could not be read.
    pub notes: Option<Notes>,
}

/// See [`AdminState::notes`].
pub type Notes = Arc<dyn Fn() -> String + Send + Sync>;

/// The text format `/metrics` is served in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// OpenMetrics 1.0, as upstream's repair controller serves it.
    OpenMetrics,
    /// Prometheus' text format 0.0.4, as the installer always served it.
    Prometheus,
}

/// The registry as a page in `format`, and its content type.
pub fn encode(registry: &Registry, format: Format) -> (String, &'static str) {
    use prometheus_client::encoding::{prometheus_text, text};
    let mut out = String::new();
    // Writing to a String cannot fail.
    let content_type = match format {
        Format::OpenMetrics => {
            let _ = text::encode(&mut out, registry);
            "application/openmetrics-text; version=1.0.0; charset=utf-8"
        }
        Format::Prometheus => {
            let _ = prometheus_text::encode(&mut out, registry);
            prometheus_text::CONTENT_TYPE
        }
    };
    (out, content_type)
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
    /// The longest request head read (hyper's least is 8 KiB): 431 past it.
    pub max_head: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_connections: 64,
            max_per_peer: 4,
            header_read_timeout: Duration::from_secs(5),
            max_connection_age: Duration::from_secs(60),
            max_head: 16 * 1024,
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

/// The connections held, oldest first.
type Held = Vec<Held1>;

#[derive(Debug)]
struct Held1 {
    peer: IpAddr,
    /// Set once the whole request head is in: no longer a candidate to make
    /// room. Its allocation is the connection's identity.
    head: Arc<AtomicBool>,
    /// Closes the connection to make room for a new one.
    evict: oneshot::Sender<()>,
}

/// One connection's place in [`Held`], given back on drop.
struct Slot {
    held: Arc<Mutex<Held>>,
    head: Arc<AtomicBool>,
    evicted: oneshot::Receiver<()>,
}

/// Which limit a new connection met.
#[derive(Debug, PartialEq, Eq, Clone, Copy)]
enum AtLimit {
    Total,
    Peer,
}

/// A place for a connection from `peer`, and the limit it met, if any. At
/// a limit, the oldest connection (from `peer`, at its own limit) that has
/// not sent a whole request head is closed to make room; when every one
/// has, the new connection is refused.
fn take_slot(
    held: &Arc<Mutex<Held>>,
    peer: IpAddr,
    limits: &Limits,
) -> Result<(Slot, Option<AtLimit>), AtLimit> {
    let mut h = crate::metrics::lock(held);
    let full = if h.iter().filter(|c| c.peer == peer).count() >= limits.max_per_peer {
        Some(AtLimit::Peer)
    } else if h.len() >= limits.max_connections {
        Some(AtLimit::Total)
    } else {
        None
    };
    if let Some(why) = full {
        let silent = h.iter().position(|c| {
            (why == AtLimit::Total || c.peer == peer) && !c.head.load(Ordering::SeqCst)
        });
        let evicted = h.remove(silent.ok_or(why)?);
        let _ = evicted.evict.send(());
    }
    let (evict, evicted) = oneshot::channel();
    let head = Arc::new(AtomicBool::new(false));
    h.push(Held1 {
        peer,
        head: head.clone(),
        evict,
    });
    let slot = Slot {
        held: held.clone(),
        head,
        evicted,
    };
    Ok((slot, full))
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut h = crate::metrics::lock(&self.held);
        h.retain(|c| !Arc::ptr_eq(&c.head, &self.head));
    }
}

/// Where the server accepts connections.
pub enum Listener {
    Tcp(TcpListener),
    /// Only root can connect: its connections count as one peer's, the
    /// oldest silent one making room for a new one.
    Unix(UnixListener),
}

/// Serves `state` on each of `listeners`, as tasks on `rt`: a quarter of
/// the process' file descriptors (see [`Limits::for_fd_limit`]), shared by
/// the listeners.
pub fn start(rt: &tokio::runtime::Handle, listeners: Vec<Listener>, state: AdminState) {
    let n = listeners.len().max(1) as u64;
    let limits = Limits::default().for_fd_limit(crate::repair::process::max_fds().map(|m| m / n));
    for l in listeners {
        rt.spawn(serve(l, state.clone(), limits));
    }
}

/// Serves the admin endpoints on `listener` within `limits` until the task
/// is dropped.
async fn serve(listener: Listener, state: AdminState, limits: Limits) {
    let held = Arc::new(Mutex::new(Held::default()));
    let mut accept_errors = Throttle::new(Duration::from_secs(60));
    let mut refusals = Throttle::new(Duration::from_secs(60));
    let place = match &listener {
        Listener::Tcp(l) => format!("port {}", l.local_addr().map(|a| a.port()).unwrap_or(0)),
        Listener::Unix(_) => "its socket".into(),
    };
    loop {
        let accepted = match &listener {
            Listener::Tcp(l) => l.accept().await.map(|(s, a)| (Ok(s), a.ip())),
            Listener::Unix(l) => l
                .accept()
                .await
                .map(|(s, _)| (Err(s), Ipv4Addr::UNSPECIFIED.into())),
        };
        let (stream, peer) = match accepted {
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
        let taken = take_slot(&held, peer, &limits);
        if let Err(why) | Ok((_, Some(why))) = taken
            && let Some(suppressed) = refusals.allow(Instant::now())
        {
            let (what, limit) = match why {
                AtLimit::Total => ("all peers", limits.max_connections),
                AtLimit::Peer => ("one peer", limits.max_per_peer),
            };
            let done = match taken {
                Ok(_) => "closing the oldest that has sent no request",
                Err(_) => "closing new connections (each has sent a request)",
            };
            tracing::warn!(%peer, suppressed, "admin server at its connection limit ({limit} for {what}): {done}; is something flooding {place}?");
        }
        // Refused: closed at once, the fd and the memory go back now.
        let Ok((slot, _)) = taken else { continue };
        match stream {
            Ok(tcp) => tokio::spawn(connection(tcp, slot, state.clone(), limits)),
            Err(unix) => tokio::spawn(connection(unix, slot, state.clone(), limits)),
        };
    }
}

/// One connection, until answered, timed out or evicted.
async fn connection<S>(io: S, mut slot: Slot, state: AdminState, limits: Limits)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let head = slot.head.clone();
    let service = hyper::service::service_fn(move |req| {
        head.store(true, Ordering::SeqCst);
        let state = state.clone();
        async move { Ok::<_, Infallible>(respond(&req, &state)) }
    });
    let conn = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        .keep_alive(false)
        .max_buf_size(limits.max_head)
        .serve_connection(TokioIo::new(io), service);
    tokio::select! {
        r = tokio::time::timeout(limits.max_connection_age, conn) => match r {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::debug!(error = %e, "admin connection"),
            Err(_) => tracing::debug!("admin connection open too long: closed"),
        },
        _ = &mut slot.evicted => tracing::debug!("admin connection silent while the server was full: closed"),
    }
}

fn respond(req: &Request<Incoming>, state: &AdminState) -> Response<Full<Bytes>> {
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return text(StatusCode::METHOD_NOT_ALLOWED, "method not allowed\n");
    }
    match (req.uri().path(), &state.ready) {
        ("/live", _) if state.live.load(Ordering::SeqCst) => text(StatusCode::OK, "live\n"),
        ("/live", _) => text(
            StatusCode::SERVICE_UNAVAILABLE,
            "the repair controller stopped: see the log\n",
        ),
        ("/ready", Some(r)) if r.load(Ordering::SeqCst) => text(StatusCode::OK, "ready\n"),
        ("/ready", Some(_)) => text(StatusCode::SERVICE_UNAVAILABLE, "not ready\n"),
        ("/metrics", _) => {
            let (mut body, content_type) = encode(&state.registry, state.format);
            if let (Some(notes), Format::Prometheus) = (&state.notes, state.format) {
                body.push_str(&notes());
            }
            let mut r = Response::new(Full::new(Bytes::from(body)));
            r.headers_mut().insert(
                hyper::header::CONTENT_TYPE,
                hyper::header::HeaderValue::from_static(content_type),
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
    use std::net::SocketAddr;

    /// A place taken, its request head in already.
    fn answered(held: &Arc<Mutex<Held>>, peer: IpAddr, limits: &Limits) -> Result<Slot, AtLimit> {
        let (slot, _) = take_slot(held, peer, limits)?;
        slot.head.store(true, Ordering::SeqCst);
        Ok(slot)
    }

    fn total(held: &Arc<Mutex<Held>>) -> usize {
        held.lock().unwrap().len()
    }

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
        let a1 = answered(&held, a, &limits).unwrap();
        let _a2 = answered(&held, a, &limits).unwrap();
        assert_eq!(answered(&held, a, &limits).err(), Some(AtLimit::Peer));
        let _b1 = answered(&held, b, &limits).unwrap();
        assert_eq!(answered(&held, b, &limits).err(), Some(AtLimit::Total));
        drop(a1);
        let _b2 = answered(&held, b, &limits).unwrap();
        assert_eq!(total(&held), 3);
    }

    /// At a limit, the oldest connection that has sent no request head
    /// makes room (one of the peer's own at the peer's limit), and is told
    /// to close.
    #[test]
    fn at_a_limit_the_oldest_silent_connection_makes_room() {
        let limits = Limits {
            max_connections: 3,
            max_per_peer: 2,
            ..Limits::default()
        };
        let held = Arc::new(Mutex::new(Held::default()));
        let [a, b, c]: [IpAddr; 3] =
            ["192.0.2.1", "192.0.2.2", "192.0.2.3"].map(|s| s.parse().unwrap());
        let (mut a1, _) = take_slot(&held, a, &limits).unwrap();
        let _a2 = answered(&held, a, &limits).unwrap();
        let (mut b1, _) = take_slot(&held, b, &limits).unwrap();
        // Full: a1, the oldest silent one, goes.
        let (_c1, at) = take_slot(&held, c, &limits).unwrap();
        assert_eq!(at, Some(AtLimit::Total));
        assert_eq!(a1.evicted.try_recv(), Ok(()));
        assert!(b1.evicted.try_recv().is_err());
        // Full again: b1 goes.
        let (mut a3, at) = take_slot(&held, a, &limits).unwrap();
        assert_eq!(at, Some(AtLimit::Total));
        assert_eq!(b1.evicted.try_recv(), Ok(()));
        // `a` at its own limit: its own silent one goes, not c's.
        let (_a4, at) = take_slot(&held, a, &limits).unwrap();
        assert_eq!(at, Some(AtLimit::Peer));
        assert_eq!(a3.evicted.try_recv(), Ok(()));
        assert_eq!(total(&held), 3);
        // Every one of `a`'s has sent its request: refused.
        drop(_a4);
        let _a5 = answered(&held, a, &limits).unwrap();
        assert_eq!(answered(&held, a, &limits).err(), Some(AtLimit::Peer));
        // Dropping an evicted slot gives back nothing twice.
        drop(a1);
        assert_eq!(total(&held), 3);
    }

    /// A server on loopback serving `ready` (installer-style without it),
    /// in `format`, within `limits`, on a runtime of its own.
    fn server(ready: Option<bool>, format: Format, limits: Limits) -> SocketAddr {
        let mut registry = Registry::default();
        let passes = prometheus_client::metrics::counter::Counter::<u64>::default();
        registry.register("linkerd_cni_passes", "Passes", passes.clone());
        passes.inc_by(3);
        let state = AdminState {
            ready: ready.map(|r| Arc::new(AtomicBool::new(r))),
            live: Arc::new(AtomicBool::new(true)),
            registry: Arc::new(registry),
            format,
            notes: Some(Arc::new(|| "# a note\n".into())),
        };
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let listener = rt.block_on(TcpListener::bind("127.0.0.1:0")).unwrap();
        let addr = listener.local_addr().unwrap();
        std::thread::spawn(move || rt.block_on(serve(Listener::Tcp(listener), state, limits)));
        addr
    }

    /// `request` sent from `from`; what comes back until the server closes
    /// (nothing when it closed without answering).
    fn exchange(from: [u8; 4], addr: SocketAddr, request: &str) -> String {
        use std::io::{Read, Write};
        let mut s = testkit::connect_from(from.into(), addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let _ = s.write_all(request.as_bytes());
        let mut out = String::new();
        let _ = s.read_to_string(&mut out);
        out
    }

    #[test]
    fn serves_the_installer_its_metrics_and_liveness() {
        let addr = server(None, Format::Prometheus, Limits::default());
        let get = |r: &str| exchange([127, 0, 0, 1], addr, r);
        let r = get("GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
        assert!(r.starts_with("HTTP/1.1 200 OK\r\n"), "{r}");
        assert!(r.contains("text/plain; version=0.0.4"), "{r}");
        assert!(r.ends_with("\r\n\r\n# HELP linkerd_cni_passes_total Passes.\n# TYPE linkerd_cni_passes_total counter\nlinkerd_cni_passes_total 3\n# a note\n"), "{r}");
        let r = get("HEAD /metrics HTTP/1.1\r\n\r\n");
        assert!(
            r.starts_with("HTTP/1.1 200 OK") && r.ends_with("\r\n\r\n"),
            "{r}"
        );
        // hyper answers an HTTP/1.0 request in HTTP/1.0.
        assert!(get("GET /metrics?x=1 HTTP/1.0\r\n\r\n").starts_with("HTTP/1.0 200 OK"));
        assert!(get("GET /live HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 200"));
        for path in ["/", "/ready"] {
            let r = get(&format!("GET {path} HTTP/1.1\r\n\r\n"));
            assert!(r.starts_with("HTTP/1.1 404"), "{path}: {r}");
        }
        assert!(get("POST /metrics HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 405"));
        let big = format!(
            "GET /metrics HTTP/1.1\r\nX: {}\r\n\r\n",
            "a".repeat(16 * 1024)
        );
        assert!(get(&big).starts_with("HTTP/1.1 431"));
        // The repair controller's probes, and its OpenMetrics page.
        let addr = server(Some(true), Format::OpenMetrics, Limits::default());
        let get = |r: &str| exchange([127, 0, 0, 1], addr, r);
        assert!(get("GET /live HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 200"));
        assert!(get("GET /ready HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 200"));
        let r = get("GET /metrics HTTP/1.1\r\n\r\n");
        assert!(
            r.contains("application/openmetrics-text") && r.ends_with("# EOF\n"),
            "{r}"
        );
    }

    /// Silent connections filling the server from several addresses, the
    /// prober's among them, do not keep the liveness probe from its answer;
    /// the ones that made room are closed at once, not at the header
    /// timeout.
    #[test]
    fn silent_connections_do_not_blind_a_probe() {
        use std::io::Read;
        let limits = Limits {
            max_connections: 6,
            max_per_peer: 3,
            ..Limits::default()
        };
        let addr = server(None, Format::Prometheus, limits);
        let silent = |last: u8| testkit::connect_from([127, 0, 0, last].into(), addr).unwrap();
        let started = std::time::Instant::now();
        let flood = [2, 3, 4, 5].iter().flat_map(|&a| [a; 3]);
        let mut held: Vec<std::net::TcpStream> = flood.map(silent).collect();
        let live = "GET /live HTTP/1.1\r\n\r\n";
        // From an address outside the flood, and from one in it (the
        // kubelet shares the node's address with host-network pods).
        for from in [1, 5, 2] {
            assert!(exchange([127, 0, 0, from], addr, live).starts_with("HTTP/1.1 200"));
            held.push(silent(from));
        }
        // The oldest were closed to make room.
        for s in &mut held[..6] {
            s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
            assert_eq!(s.read(&mut [0u8; 64]).unwrap_or(0), 0);
        }
        assert!(
            started.elapsed() < limits.header_read_timeout,
            "{:?}",
            started.elapsed()
        );
    }

    #[test]
    fn a_low_fd_limit_lowers_the_cap() {
        let d = Limits::default();
        assert_eq!(d.for_fd_limit(None).max_connections, 64);
        assert_eq!(d.for_fd_limit(Some(1 << 20)).max_connections, 64);
        assert_eq!(d.for_fd_limit(Some(64)).max_connections, 16);
        assert_eq!(d.for_fd_limit(Some(2)).max_connections, 1);
    }
}
