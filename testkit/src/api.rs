//! [`FakeApiServer`]: a stand-in for the Kubernetes API server, over real TLS
//! (its own throwaway CA), requiring a bearer token, serving the JSON a test
//! registers per path, and counting the requests it gets per path so tests
//! can assert "no API call" or "the namespace was fetched once".
//!
//! Failure modes: [`Mode::Unauthorized`] (401 for every request),
//! [`Mode::Forbidden`] (403), [`Mode::Slow`] (answers after a delay),
//! [`FakeApiServer::fail_next`] (the next requests get an error status, e.g.
//! 503 or 429, then normal service resumes), and [`FakeApiServer::stop`]
//! (the listener closes: connections are refused from then on).
//! Credentials: [`FakeApiServer::issue_token`] adds a valid token (a
//! second service-account pod's), [`FakeApiServer::revoke_token`] makes one
//! get 401 from then on (its pod was deleted); [`FakeApiServer::forbid`]
//! answers 403 on one path (RBAC that lacks that resource).
//!
//! Writes: PATCH with a JSON patch (RFC 6902) applies it to the stored
//! object, all or nothing (a failed `test` answers 422, as the API server
//! does); [`FakeApiServer::patches`] lists what was sent,
//! [`FakeApiServer::forbid_patch`] answers 403 to PATCHes of one path
//! (RBAC with `get` but not `patch`, as the linkerd2-cni chart grants on
//! nodes), and [`FakeApiServer::change_before_next_patch`] stands in for
//! another writer that changes the object between a client's read and its
//! patch. `events.k8s.io/v1` Events POSTed are kept, for
//! [`FakeApiServer::events`].
//!
//! Tokens and reviews: `POST .../serviceaccounts/{name}/token` (the
//! TokenRequest API) mints a JWT-shaped token for that ServiceAccount, with
//! `sub`, `iat`, `exp` and, when bound to a Node, `kubernetes.io.node`
//! claims; [`FakeApiServer::set_tokens`] chooses how it answers (refused
//! with 403 as under the linkerd2-cni chart's RBAC, without node binding as
//! an older server, a capped lifetime), [`FakeApiServer::delete_account`]
//! revokes every token minted for an account. A minted token may only GET
//! under `/api/v1/namespaces/` (the plugin's role).
//! SelfSubjectAccessReview allows `get` on a pod unless its path is
//! forbidden (asked cluster-wide: `/api/v1/pods`).
//! [`FakeApiServer::fail_next_on`] fails the next requests of one path,
//! [`FakeApiServer::fail_next_with`] with any body (a proxy's HTML page),
//! [`FakeApiServer::fail_next_on_with`] both on one path,
//! and [`FakeApiServer::bearers`] lists the tokens a path was asked with.
//!
//! It can listen inside a network namespace ([`FakeApiServer::start_in_netns`])
//! for tests that run the plugin in a "node" namespace whose loopback is
//! not the host's.
//!
//! A deliberately small HTTP/1.1 server: GET, PATCH and those POSTs (and
//! Events') only, keep-alive, one thread per connection.

use std::collections::{HashMap, VecDeque};
use std::io::Write;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use base64::Engine;
use rustls::ServerConfig;
use serde_json::{Value, json};

use crate::http::{Request, lock, read_request, status_json, write_json, write_raw};
use crate::pki::TestPki;

/// How the server answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Registered objects with 200, anything else 404.
    Normal,
    /// 401 Unauthorized to every request, as for a stale token.
    Unauthorized,
    /// 403 Forbidden to every request, as for missing RBAC.
    Forbidden,
    /// As `Normal`, but each answer only after this delay.
    Slow(Duration),
}

#[derive(Debug)]
struct State {
    objects: Mutex<HashMap<String, Value>>,
    counts: Mutex<HashMap<String, usize>>,
    mode: Mutex<Mode>,
    fail_next: Mutex<VecDeque<u16>>,
    connections: AtomicUsize,
    stopped: AtomicBool,
    /// Valid besides the server's own token.
    extra_tokens: Mutex<Vec<String>>,
    /// Rejected with 401, whatever else says.
    revoked: Mutex<Vec<String>>,
    /// Paths answered with 403.
    forbidden: Mutex<Vec<String>>,
    writes: Writes,
    /// `events.k8s.io/v1` Events POSTed, as received.
    events: Mutex<Vec<Value>>,
    tokens: Mutex<Tokens>,
    /// Per path: statuses for its next requests.
    fail_path: Mutex<HashMap<String, VecDeque<u16>>>,
    /// The next requests get this status and raw body.
    fail_raw: Mutex<VecDeque<(u16, String)>>,
    /// Per path: status and raw body for its next requests.
    fail_raw_path: Mutex<HashMap<String, VecDeque<(u16, String)>>>,
    /// (path, bearer token) of every request, in order.
    bearers: Mutex<Vec<(String, String)>>,
}

/// How TokenRequests are answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TokenPolicy {
    /// false: 403, as without `create` on `serviceaccounts/token` (the
    /// linkerd2-cni chart's RBAC).
    pub allowed: bool,
    /// false: a request bound to a Node gets 400, as a server without
    /// node-bound tokens answers.
    pub node_binding: bool,
    /// The most lifetime granted, whatever was asked for (the API server's
    /// `--service-account-max-token-expiration`).
    pub max_lifetime: Option<Duration>,
}

impl Default for TokenPolicy {
    fn default() -> Self {
        TokenPolicy {
            allowed: true,
            node_binding: true,
            max_lifetime: None,
        }
    }
}

/// A token the server minted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MintedToken {
    pub token: String,
    /// `namespace/name` of its ServiceAccount.
    pub account: String,
    pub node: Option<String>,
    /// Seconds since the epoch.
    pub expires: u64,
}

#[derive(Debug, Default)]
struct Tokens {
    policy: TokenPolicy,
    minted: Vec<MintedToken>,
    /// Accounts deleted: their tokens get 401, their TokenRequests 404.
    deleted: Vec<String>,
    /// The bodies of the TokenRequests received, in order.
    requests: Vec<Value>,
}

/// What PATCH requests see and leave.
#[derive(Debug, Default)]
struct Writes {
    /// (path, JSON patch) of every PATCH received, in order.
    received: Mutex<Vec<(String, Value)>>,
    /// Paths whose PATCHes get 403.
    forbidden: Mutex<Vec<String>>,
    /// Objects stored just before the next PATCH of their path is applied.
    races: Mutex<HashMap<String, Value>>,
}

/// A fake Kubernetes API server; stops on drop.
pub struct FakeApiServer {
    addr: SocketAddr,
    token: String,
    pki: TestPki,
    state: Arc<State>,
    /// The accept thread's listener (another descriptor of it), to shut it
    /// down on stop.
    listener: Option<TcpListener>,
    /// Holds the port from start to drop, so that no other socket of the
    /// machine (another test's server, a connect's source port) takes it
    /// once the listener is stopped: the address then refuses connections.
    _port: OwnedFd,
    accept: Option<JoinHandle<()>>,
}

impl FakeApiServer {
    /// Listens on 127.0.0.1 (a free port) in the caller's network namespace.
    pub fn start() -> FakeApiServer {
        Self::start_on(None).expect("start fake API server")
    }

    /// Listens on 127.0.0.1 inside the network namespace at `netns_path`
    /// (whose loopback must be up, as [`crate::TestNetns`] leaves it). The
    /// plugin must then run in that namespace to reach it.
    pub fn start_in_netns(netns_path: &Path) -> std::io::Result<FakeApiServer> {
        Self::start_on(Some(netns_path.to_path_buf()))
    }

    /// [`FakeApiServer::start`], serving `pki`'s certificate (e.g.
    /// [`TestPki::rsa`]).
    pub fn start_with(pki: TestPki) -> FakeApiServer {
        Self::start_with_pki(None, pki).expect("start the fake API server")
    }

    /// [`FakeApiServer::start_in_netns`], serving `pki`'s certificate
    /// (e.g. [`TestPki::rsa`]).
    pub fn start_in_netns_with(netns_path: &Path, pki: TestPki) -> std::io::Result<FakeApiServer> {
        Self::start_with_pki(Some(netns_path.to_path_buf()), pki)
    }

    fn start_on(netns: Option<PathBuf>) -> std::io::Result<FakeApiServer> {
        Self::start_with_pki(netns, TestPki::new())
    }

    fn start_with_pki(netns: Option<PathBuf>, pki: TestPki) -> std::io::Result<FakeApiServer> {
        let tls = crate::http::server_tls(&pki)?;
        let state = Arc::new(State {
            objects: Mutex::new(HashMap::new()),
            counts: Mutex::new(HashMap::new()),
            mode: Mutex::new(Mode::Normal),
            fail_next: Mutex::new(VecDeque::new()),
            connections: AtomicUsize::new(0),
            stopped: AtomicBool::new(false),
            extra_tokens: Mutex::new(Vec::new()),
            revoked: Mutex::new(Vec::new()),
            forbidden: Mutex::new(Vec::new()),
            writes: Writes::default(),
            events: Mutex::new(Vec::new()),
            tokens: Mutex::new(Tokens::default()),
            fail_path: Mutex::new(HashMap::new()),
            fail_raw: Mutex::new(VecDeque::new()),
            fail_raw_path: Mutex::new(HashMap::new()),
            bearers: Mutex::new(Vec::new()),
        });
        let token = format!("testkit-token-{}", crate::unique_name("t"));

        type Bound = (SocketAddr, OwnedFd, TcpListener);
        let (tx, rx) = std::sync::mpsc::channel::<std::io::Result<Bound>>();
        let st = state.clone();
        let tok = token.clone();
        // The sockets are made on the thread, which is in the namespace.
        let serve = move || {
            let bound = listen_reserved().and_then(|(port, listener)| {
                let addr = listener.local_addr()?;
                Ok((addr, port, listener.try_clone()?, listener))
            });
            match bound {
                Ok((addr, port, ours, listener)) => {
                    let _ = tx.send(Ok((addr, port, ours)));
                    accept_loop(listener, st, tls, tok);
                }
                Err(e) => {
                    let _ = tx.send(Err(e));
                }
            }
        };
        let accept = match netns {
            Some(p) => crate::netns::spawn_in(std::fs::File::open(p)?, serve)?,
            None => std::thread::spawn(serve),
        };
        let (addr, port, listener) = rx
            .recv()
            .map_err(|_| std::io::Error::other("fake API server thread died"))??;
        Ok(FakeApiServer {
            addr,
            token,
            pki,
            state,
            listener: Some(listener),
            _port: port,
            accept: Some(accept),
        })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `https://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("https://{}", self.addr)
    }

    /// The bearer token it requires.
    pub fn token(&self) -> &str {
        &self.token
    }

    /// The CA that signed its certificate, PEM.
    pub fn ca_pem(&self) -> &str {
        &self.pki.ca_pem
    }

    /// Serves `body` with 200 at `path` (e.g. `/api/v1/namespaces/x`).
    pub fn set(&self, path: &str, body: Value) {
        lock(&self.state.objects).insert(path.to_string(), body);
    }

    /// Serves `pod` at its path.
    pub fn add_pod(&self, pod: &crate::objects::Pod) {
        self.set(&pod.path(), pod.json());
    }

    /// Serves a namespace with `annotations`.
    pub fn add_namespace(&self, name: &str, annotations: &[(&str, &str)]) {
        self.set(
            &crate::objects::namespace_path(name),
            crate::objects::namespace(name, annotations),
        );
    }

    pub fn set_mode(&self, mode: Mode) {
        *lock(&self.state.mode) = mode;
    }

    /// The next `n` requests get `status` (e.g. 503, 429), whatever the mode.
    pub fn fail_next(&self, n: usize, status: u16) {
        lock(&self.state.fail_next).extend(std::iter::repeat_n(status, n));
    }

    /// The next `n` requests of `path` get `status` (with a Status body).
    pub fn fail_next_on(&self, path: &str, n: usize, status: u16) {
        lock(&self.state.fail_path)
            .entry(path.to_string())
            .or_default()
            .extend(std::iter::repeat_n(status, n));
    }

    /// The next `n` requests get `status` with `body` as it is (e.g. an
    /// HTML page, as a proxy in the way answers).
    pub fn fail_next_with(&self, n: usize, status: u16, body: &str) {
        lock(&self.state.fail_raw).extend(std::iter::repeat_n((status, body.to_string()), n));
    }

    /// The next `n` requests of `path` get `status` with `body` as it is
    /// (a proxy's page, an empty answer).
    pub fn fail_next_on_with(&self, path: &str, n: usize, status: u16, body: &str) {
        lock(&self.state.fail_raw_path)
            .entry(path.to_string())
            .or_default()
            .extend(std::iter::repeat_n((status, body.to_string()), n));
    }

    /// How TokenRequests are answered from now on.
    pub fn set_tokens(&self, policy: TokenPolicy) {
        lock(&self.state.tokens).policy = policy;
    }

    /// The tokens minted so far, in order.
    pub fn minted(&self) -> Vec<MintedToken> {
        lock(&self.state.tokens).minted.clone()
    }

    /// The bodies of the TokenRequests received, in order.
    pub fn token_requests(&self) -> Vec<Value> {
        lock(&self.state.tokens).requests.clone()
    }

    /// ServiceAccount `namespace/name` is deleted: every token minted for
    /// it gets 401 from now on, and its TokenRequests 404.
    pub fn delete_account(&self, namespace: &str, name: &str) {
        lock(&self.state.tokens)
            .deleted
            .push(format!("{namespace}/{name}"));
    }

    /// The bearer tokens `path` was asked with, in order.
    pub fn bearers(&self, path: &str) -> Vec<String> {
        lock(&self.state.bearers)
            .iter()
            .filter(|(p, _)| p == path)
            .map(|(_, t)| t.clone())
            .collect()
    }

    /// A new valid projected token of pod `namespace/pod` for ServiceAccount
    /// `account` (JWT-shaped, with the pod's claim, valid an hour), revocable
    /// as [`Self::issue_token`]'s.
    pub fn issue_pod_token(&self, namespace: &str, account: &str, pod: &str) -> String {
        let iat = now_secs();
        let t = jwt(&json!({
            "sub": format!("system:serviceaccount:{namespace}:{account}"),
            "iat": iat, "exp": iat + 3600,
            "kubernetes.io": {"namespace": namespace, "pod": {"name": pod},
                              "serviceaccount": {"name": account}},
        }));
        lock(&self.state.extra_tokens).push(t.clone());
        t
    }

    /// A new valid bearer token, as a second pod of the service account gets.
    pub fn issue_token(&self) -> String {
        let t = format!("testkit-token-{}", crate::unique_name("t"));
        lock(&self.state.extra_tokens).push(t.clone());
        t
    }

    /// Accepts `token` too (e.g. one of an unusual length).
    pub fn accept_token(&self, token: &str) {
        lock(&self.state.extra_tokens).push(token.to_string());
    }

    /// From now on `token` gets 401, as a pod-bound token once its pod is
    /// deleted.
    pub fn revoke_token(&self, token: &str) {
        lock(&self.state.revoked).push(token.to_string());
    }

    /// From now on requests for `path` get 403 (an RBAC role without it).
    pub fn forbid(&self, path: &str) {
        lock(&self.state.forbidden).push(path.to_string());
    }

    /// Serves `path` again after [`FakeApiServer::forbid`], as when the
    /// RBAC that was missing is restored.
    pub fn unforbid(&self, path: &str) {
        lock(&self.state.forbidden).retain(|p| p != path);
    }

    /// Stops serving `path` (404 from now on), as when the object is deleted.
    pub fn remove(&self, path: &str) {
        lock(&self.state.objects).remove(path);
    }

    /// The object served at `path` now (after any PATCHes).
    pub fn object(&self, path: &str) -> Option<Value> {
        lock(&self.state.objects).get(path).cloned()
    }

    /// From now on PATCHes of `path` get 403 (GETs are still served).
    pub fn forbid_patch(&self, path: &str) {
        lock(&self.state.writes.forbidden).push(path.to_string());
    }

    /// The JSON patches received for `path`, in order (whatever the answer).
    pub fn patches(&self, path: &str) -> Vec<Value> {
        lock(&self.state.writes.received)
            .iter()
            .filter(|(p, _)| p == path)
            .map(|(_, v)| v.clone())
            .collect()
    }

    /// PATCHes received in all, whatever the path.
    pub fn total_patches(&self) -> usize {
        lock(&self.state.writes.received).len()
    }

    /// Another writer's change: `object` is stored at `path` right before
    /// the next PATCH of that path is applied, as if it had been written
    /// between the client's GET and its PATCH.
    pub fn change_before_next_patch(&self, path: &str, object: Value) {
        lock(&self.state.writes.races).insert(path.to_string(), object);
    }

    /// The `events.k8s.io/v1` Events created so far, in order.
    pub fn events(&self) -> Vec<Value> {
        lock(&self.state.events).clone()
    }

    /// Requests received for `path` (whatever the answer).
    pub fn requests(&self, path: &str) -> usize {
        lock(&self.state.counts).get(path).copied().unwrap_or(0)
    }

    /// Requests received in all.
    pub fn total_requests(&self) -> usize {
        lock(&self.state.counts).values().sum()
    }

    /// TCP connections accepted (including ones that never sent a request).
    pub fn connections(&self) -> usize {
        self.state.connections.load(Ordering::SeqCst)
    }

    /// Closes the listener: from now on connections are refused, as when
    /// the API server is down. Idempotent.
    pub fn stop(&mut self) {
        if self.state.stopped.swap(true, Ordering::SeqCst) {
            return;
        }
        // shutdown(), not close(): it takes the socket itself out of the
        // LISTEN state, whoever else holds a descriptor of it. Closing ours
        // is not enough: a child that another test is spawning holds copies
        // of all our descriptors between its fork and its exec, and the
        // socket would go on accepting until then. It also wakes the thread
        // blocked in accept() (which then fails with EINVAL), from any
        // namespace.
        if let Some(l) = self.listener.take() {
            let _ = nix::sys::socket::shutdown(l.as_raw_fd(), nix::sys::socket::Shutdown::Both);
        }
        if let Some(h) = self.accept.take() {
            let _ = h.join();
        }
    }

    /// A kubeconfig for this server, as the installer writes it (context
    /// `linkerd-cni-context`, `certificate-authority-data`, inline token).
    pub fn kubeconfig_yaml(&self) -> String {
        crate::kubeconfig::installer_text(
            &format!("https://[{}]:{}", self.addr.ip(), self.addr.port()),
            &format!(
                "certificate-authority-data: {}",
                base64::engine::general_purpose::STANDARD.encode(self.pki.ca_pem.as_bytes())
            ),
            &self.token,
        )
    }

    /// The same kubeconfig as JSON, as the installer writes it now.
    pub fn kubeconfig_json(&self) -> String {
        crate::kubeconfig::installer_json(
            &format!("https://[{}]:{}", self.addr.ip(), self.addr.port()),
            (
                "certificate-authority-data",
                base64::engine::general_purpose::STANDARD
                    .encode(self.pki.ca_pem.as_bytes())
                    .into(),
            ),
            &self.token,
        )
    }

    /// Writes [`Self::kubeconfig_json`] (the installer's format) to
    /// `<dir>/ZZZ-linkerd-cni-kubeconfig` (mode 0600) and returns its path.
    pub fn write_kubeconfig(&self, dir: &Path) -> std::io::Result<PathBuf> {
        use std::os::unix::fs::OpenOptionsExt;
        let path = dir.join("ZZZ-linkerd-cni-kubeconfig");
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&path)?;
        f.write_all(self.kubeconfig_json().as_bytes())?;
        Ok(path)
    }
}

impl Drop for FakeApiServer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A listener on a free port of 127.0.0.1, and a second socket bound to
/// the same port (both SO_REUSEPORT) that never listens: it keeps the port
/// taken after the listener is shut down, so the address refuses
/// connections instead of reaching whatever else could bind it.
fn listen_reserved() -> std::io::Result<(OwnedFd, TcpListener)> {
    use nix::sys::socket::{
        AddressFamily, Backlog, SockFlag, SockType, SockaddrIn, bind, getsockname, listen,
        setsockopt, socket, sockopt::ReusePort,
    };
    let new = || -> nix::Result<OwnedFd> {
        let fd = socket(
            AddressFamily::Inet,
            SockType::Stream,
            SockFlag::SOCK_CLOEXEC,
            None,
        )?;
        setsockopt(&fd, ReusePort, &true)?;
        Ok(fd)
    };
    let port = new()?;
    bind(port.as_raw_fd(), &SockaddrIn::new(127, 0, 0, 1, 0))?;
    let addr: SockaddrIn = getsockname(port.as_raw_fd())?;
    let listener = new()?;
    bind(listener.as_raw_fd(), &addr)?;
    listen(&listener, Backlog::MAXCONN)?;
    Ok((port, TcpListener::from(listener)))
}

fn accept_loop(listener: TcpListener, state: Arc<State>, tls: Arc<ServerConfig>, token: String) {
    crate::http::accept_until(listener, &state.stopped, |tcp| {
        state.connections.fetch_add(1, Ordering::SeqCst);
        let (state, tls, token) = (state.clone(), tls.clone(), token.clone());
        std::thread::spawn(move || {
            let _ = serve_connection(tcp, &state, tls, &token);
        });
    });
}

fn serve_connection(
    tcp: TcpStream,
    state: &State,
    tls: Arc<ServerConfig>,
    token: &str,
) -> std::io::Result<()> {
    let mut stream = crate::http::accept_tls(tcp, tls)?;
    loop {
        let Some(req) = read_request(&mut stream)? else {
            return Ok(());
        };
        *lock(&state.counts).entry(req.path.clone()).or_default() += 1;
        let bearer = req
            .authorization
            .as_deref()
            .and_then(|a| a.strip_prefix("Bearer "))
            .unwrap_or_default()
            .to_string();
        lock(&state.bearers).push((req.path.clone(), bearer));
        let raw = lock(&state.fail_raw).pop_front().or_else(|| {
            lock(&state.fail_raw_path)
                .get_mut(&req.path)
                .and_then(VecDeque::pop_front)
        });
        let mode = *lock(&state.mode);
        if let Mode::Slow(d) = mode {
            std::thread::sleep(d);
        }
        match raw {
            Some((status, body)) => write_raw(stream.get_mut(), status, "text/html", &body)?,
            None => {
                let (status, body) = answer(state, &req, token);
                write_json(stream.get_mut(), status, &body)?;
            }
        }
    }
}

fn answer(state: &State, req: &Request, token: &str) -> (u16, Value) {
    if let Some(code) = lock(&state.fail_next).pop_front() {
        return (code, status_json(code, "injected failure"));
    }
    if let Some(code) = lock(&state.fail_path)
        .get_mut(&req.path)
        .and_then(VecDeque::pop_front)
    {
        return (code, status_json(code, "injected failure"));
    }
    match *lock(&state.mode) {
        Mode::Unauthorized => return (401, status_json(401, "Unauthorized")),
        Mode::Forbidden => {
            return (403, status_json(403, "forbidden: User cannot get resource"));
        }
        Mode::Normal | Mode::Slow(_) => {}
    }
    let bearer = req
        .authorization
        .as_deref()
        .and_then(|a| a.strip_prefix("Bearer "));
    let minted = bearer.and_then(|b| valid_minted(state, b));
    let valid = bearer.is_some_and(|b| {
        (b == token || lock(&state.extra_tokens).iter().any(|t| t == b) || minted.is_some())
            && !lock(&state.revoked).iter().any(|t| t == b)
    });
    if !valid {
        return (401, status_json(401, "Unauthorized"));
    }
    if req.method == "POST" && req.path == SELF_SUBJECT_ACCESS_REVIEW {
        return access_review(state, req);
    }
    // The plugin's role: GETs of pods, namespaces and services.
    if minted.is_some() && (req.method != "GET" || !req.path.starts_with("/api/v1/namespaces/")) {
        return (
            403,
            status_json(403, "forbidden: the plugin's role does not allow this"),
        );
    }
    if req.method == "POST"
        && let Some(account) = token_request_account(&req.path)
    {
        return token_request(state, req, &account);
    }
    if lock(&state.forbidden).contains(&req.path) {
        return (403, status_json(403, "forbidden: User cannot get resource"));
    }
    if req.method == "PATCH" {
        return patch(state, req);
    }
    if req.method == "POST"
        && let ["apis", "events.k8s.io", "v1", "namespaces", _, "events"] = req
            .path
            .trim_matches('/')
            .split('/')
            .collect::<Vec<_>>()
            .as_slice()
    {
        return match serde_json::from_slice::<Value>(&req.body) {
            Ok(ev) => {
                lock(&state.events).push(ev.clone());
                (201, ev)
            }
            Err(_) => (400, status_json(400, "the body is not JSON")),
        };
    }
    if req.method != "GET" {
        return (405, status_json(405, "method not allowed"));
    }
    match lock(&state.objects).get(&req.path) {
        Some(v) => (200, v.clone()),
        None => (404, status_json(404, &format!("{} not found", req.path))),
    }
}

const SELF_SUBJECT_ACCESS_REVIEW: &str = "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews";

/// The minted token `bearer`, when valid now.
fn valid_minted(state: &State, bearer: &str) -> Option<MintedToken> {
    let tokens = lock(&state.tokens);
    let m = tokens.minted.iter().find(|m| m.token == bearer)?;
    (m.expires > now_secs() && !tokens.deleted.contains(&m.account)).then(|| m.clone())
}

fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs()
}

/// `namespace/name` of a TokenRequest path.
fn token_request_account(path: &str) -> Option<String> {
    let rest = path.strip_prefix("/api/v1/namespaces/")?;
    let (ns, rest) = rest.split_once("/serviceaccounts/")?;
    let name = rest.strip_suffix("/token")?;
    (!ns.contains('/') && !name.contains('/')).then(|| format!("{ns}/{name}"))
}

fn token_request(state: &State, req: &Request, account: &str) -> (u16, Value) {
    let body: Value = serde_json::from_slice(&req.body).unwrap_or(Value::Null);
    let mut tokens = lock(&state.tokens);
    tokens.requests.push(body.clone());
    let policy = tokens.policy;
    if !policy.allowed {
        return (
            403,
            status_json(
                403,
                "forbidden: cannot create resource serviceaccounts/token",
            ),
        );
    }
    if tokens.deleted.iter().any(|a| a == account) {
        return (404, status_json(404, "serviceaccount not found"));
    }
    let spec = &body["spec"];
    let node = match &spec["boundObjectRef"] {
        Value::Null => None,
        r if r["kind"] == "Node" && policy.node_binding => r["name"].as_str().map(str::to_string),
        r => {
            return (
                400,
                status_json(
                    400,
                    &format!("cannot bind token for object of type {}", r["kind"]),
                ),
            );
        }
    };
    let asked = spec["expirationSeconds"].as_u64().unwrap_or(3600);
    let lifetime = policy
        .max_lifetime
        .map_or(asked, |m| asked.min(m.as_secs().max(1)));
    let iat = now_secs();
    let (ns, name) = account.split_once('/').unwrap_or_default();
    let mut claims = json!({
        "sub": format!("system:serviceaccount:{ns}:{name}"),
        "iat": iat, "exp": iat + lifetime,
        "jti": crate::unique_name("jti"),
        "kubernetes.io": {"namespace": ns, "serviceaccount": {"name": name}},
    });
    if let Some(n) = &node {
        claims["kubernetes.io"]["node"] = json!({"name": n});
    }
    let token = jwt(&claims);
    tokens.minted.push(MintedToken {
        token: token.clone(),
        account: account.to_string(),
        node,
        expires: iat + lifetime,
    });
    (
        201,
        json!({"kind": "TokenRequest", "apiVersion": "authentication.k8s.io/v1",
               "status": {"token": token, "expirationTimestamp": ""}}),
    )
}

/// A JWT-shaped token holding `claims` (signed by nobody).
fn jwt(claims: &Value) -> String {
    let b64 = |b: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b);
    format!(
        "{}.{}.{}",
        b64(br#"{"alg":"RS256","kid":"testkit"}"#),
        b64(claims.to_string().as_bytes()),
        b64(b"testkit-signature")
    )
}

/// Allows everything but `get` of a forbidden path.
fn access_review(state: &State, req: &Request) -> (u16, Value) {
    let body: Value = serde_json::from_slice(&req.body).unwrap_or(Value::Null);
    let a = &body["spec"]["resourceAttributes"];
    let s = |k: &str| a[k].as_str().unwrap_or_default().to_string();
    let path = match s("resource").as_str() {
        // Cluster-wide: every namespace, any name.
        "pods" if s("namespace").is_empty() && s("name").is_empty() => "/api/v1/pods".into(),
        "pods" => format!("/api/v1/namespaces/{}/pods/{}", s("namespace"), s("name")),
        "daemonsets" => format!(
            "/apis/apps/v1/namespaces/{}/daemonsets/{}",
            s("namespace"),
            s("name")
        ),
        _ => String::new(),
    };
    let allowed = !lock(&state.forbidden).contains(&path);
    (201, json!({"status": {"allowed": allowed}}))
}

/// A JSON patch: recorded, then applied all or nothing.
fn patch(state: &State, req: &Request) -> (u16, Value) {
    let ops: Value = match serde_json::from_slice(&req.body) {
        Ok(v) => v,
        Err(e) => return (400, status_json(400, &format!("invalid JSON patch: {e}"))),
    };
    lock(&state.writes.received).push((req.path.clone(), ops.clone()));
    if lock(&state.writes.forbidden).contains(&req.path) {
        return (
            403,
            status_json(403, "forbidden: User cannot patch resource"),
        );
    }
    let mut objects = lock(&state.objects);
    if let Some(other) = lock(&state.writes.races).remove(&req.path) {
        objects.insert(req.path.clone(), other);
    }
    let Some(obj) = objects.get_mut(&req.path) else {
        return (404, status_json(404, &format!("{} not found", req.path)));
    };
    if let Err((code, e)) = crate::api_watch::json_patch(obj, &ops) {
        return (code, status_json(code, &e));
    }
    // A write makes a new version, as resourceVersion does.
    if let Some(meta) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
        let next = meta
            .get("resourceVersion")
            .and_then(Value::as_str)
            .and_then(|v| v.parse::<u64>().ok())
            .map_or(1, |v| v + 1);
        meta.insert("resourceVersion".into(), next.to_string().into());
    }
    (200, obj.clone())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::TestNetns;

    #[test]
    fn stops_after_its_netns_name_is_deleted() {
        let ns = TestNetns::new("testkit-api").unwrap();
        let mut api = FakeApiServer::start_in_netns(ns.path()).unwrap();
        drop(ns);
        // Must return (the thread is woken through the held namespace fd).
        api.stop();
        assert!(api.accept.is_none());
    }

    #[test]
    fn stopped_server_refuses_connections() {
        let mut api = FakeApiServer::start();
        assert!(TcpStream::connect(api.addr()).is_ok());
        api.stop();
        let e = TcpStream::connect(api.addr()).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::ConnectionRefused);
    }
}
