//! [`FakeApiServer`]: the one stand-in for the Kubernetes API server, over
//! real TLS (its own throwaway CA), requiring a bearer token. It serves the
//! plugin's one-shot GETs and the long-running clients (the installer, the
//! repair controller) alike, from one set of objects kept by API path.
//!
//! Objects: [`FakeApiServer::set`] serves any JSON at a path as it is;
//! [`FakeApiServer::with_cluster`] and its shortcuts ([`Cluster::put_pod`],
//! `put_object`, `put_node`) keep pods, namespaces, services and nodes with
//! UIDs, resource versions and a history of changes, which serves:
//!
//! - lists and watches of pods (all namespaces or one), namespaces and
//!   services, with label selectors (`key`, `!key`, `key=value`,
//!   `key!=value`) and field selectors (`path=value`, `path!=value` on any
//!   dotted path, e.g. `spec.nodeName`);
//! - watch streams as the real server sends them: chunked JSON lines,
//!   `BOOKMARK`s while idle when asked for, an `ERROR` event with `410 Gone`
//!   for an expired resource version (or, with [`GoneStyle::Http`], an HTTP
//!   410 answer), the end of the stream at `timeoutSeconds` (which
//!   [`FakeApiServer::set_max_watch`] can shorten);
//!   [`FakeApiServer::disconnect`] cuts every open watch, optionally with
//!   the history expired;
//! - DELETE of a pod (`gracePeriodSeconds` recorded, `preconditions.uid`
//!   enforced with 409), for [`FakeApiServer::deletions`];
//! - PATCH of any object: JSON patch (RFC 6902: add, remove, replace, test;
//!   all or nothing, a failed `test` answers 422), JSON merge patch and
//!   strategic merge patch (as a merge patch); [`FakeApiServer::patches`]
//!   lists what was sent, [`FakeApiServer::forbid_patch`] answers 403 to
//!   PATCHes of one path (RBAC with `get` but not `patch`, as the
//!   linkerd2-cni chart grants on nodes), and
//!   [`FakeApiServer::change_before_next_patch`] stands in for another
//!   writer that changes the object between a client's read and its patch;
//! - `events.k8s.io/v1` Events POSTed, for [`FakeApiServer::events`].
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
//! forbidden (asked cluster-wide: `/api/v1/pods`), and `create` on
//! `serviceaccounts/token` as [`FakeApiServer::set_tokens`] says.
//! [`FakeApiServer::issue_token`] adds a valid token (a second
//! service-account pod's), [`FakeApiServer::revoke_token`] makes one get 401
//! from then on (its pod was deleted); [`FakeApiServer::forbid`] answers 403
//! on one path (RBAC that lacks that resource).
//!
//! Failures, one way for every request: [`Mode`] (401 or 403 for every
//! request, or slow answers), forced answers ([`FakeApiServer::fail_next`]
//! and its variants: the next requests, of any path or of one, get an error
//! status or a raw page, then normal service resumes), and
//! [`FakeApiServer::stop`] (the listener closes: connections are refused
//! from then on). Every request is logged with its caller's token and its
//! answer's status: [`FakeApiServer::requests`] counts them per path,
//! [`FakeApiServer::bearers`] and [`FakeApiServer::request_log`] read them.
//!
//! It can listen inside a network namespace ([`FakeApiServer::start_in_netns`])
//! for tests that run the plugin in a "node" namespace whose loopback is
//! not the host's. [`WatchApiServer`] is the same server under the names the
//! long-running clients' tests use.
//!
//! HTTP/1.1 only, keep-alive, one thread per connection.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::io::Write;
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::ops::{Deref, DerefMut};
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use base64::Engine;
use rustls::ServerConfig;
use serde_json::{Map, Value, json};

use crate::http::{Request, Tls, lock, read_request, status_json, write_json, write_raw};
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

/// How an expired resource version is answered on a watch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GoneStyle {
    /// `200`, then an `ERROR` event holding a 410 `Status`, as
    /// kube-apiserver does.
    Event,
    /// An HTTP `410` answer to the watch request itself.
    Http,
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

/// One request, as received.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestRecord {
    pub method: String,
    pub path: String,
    /// Decoded query parameters, in order.
    pub query: Vec<(String, String)>,
    /// The bearer token it came with ("" without one): who asked.
    pub bearer: String,
    /// The status it was answered with (0 while the answer is being made).
    pub status: u16,
    /// When it was read.
    pub at: Instant,
}

impl RequestRecord {
    pub fn param(&self, key: &str) -> Option<&str> {
        self.query
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    pub fn is_watch(&self) -> bool {
        matches!(self.param("watch"), Some("true" | "1"))
    }
}

/// One pod deletion the server carried out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Deletion {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub grace_period_seconds: Option<i64>,
    /// When the server carried it out.
    pub at: Instant,
}

/// The server's objects, by API path, and what was done to them; changed
/// through [`FakeApiServer::with_cluster`] or the shortcuts on the server.
#[derive(Debug)]
pub struct Cluster {
    rv: u64,
    next_uid: u64,
    objects: BTreeMap<String, Value>,
    /// Paths that GETs find but no list or watch has shown yet (see
    /// [`Cluster::put_object_unwatched`]).
    unlisted: BTreeSet<String>,
    /// Changes of pods, namespaces and services: (resource version, watch
    /// event type, resource, object).
    history: Vec<(u64, &'static str, &'static str, Value)>,
    /// Watches from a version older than this get 410 Gone.
    oldest_rv: u64,
    events: Vec<Value>,
    deletions: Vec<Deletion>,
    /// (path, content type, body) of every PATCH received, in order.
    patches: Vec<(String, String, Value)>,
    /// Objects stored just before the next PATCH of their path is applied.
    races: HashMap<String, Value>,
}

impl Cluster {
    fn new() -> Cluster {
        Cluster {
            rv: 100,
            next_uid: 0,
            objects: BTreeMap::new(),
            unlisted: BTreeSet::new(),
            history: vec![],
            oldest_rv: 0,
            events: vec![],
            deletions: vec![],
            patches: vec![],
            races: HashMap::new(),
        }
    }

    fn bump(&mut self) -> u64 {
        self.rv += 1;
        self.rv
    }

    /// Gives `obj` a new resource version, as every write makes one.
    fn stamp(&mut self, obj: &mut Value) -> u64 {
        let rv = self.bump();
        if let Some(meta) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
            meta.insert("resourceVersion".into(), rv.to_string().into());
        }
        rv
    }

    /// Creates or replaces a pod (by namespace and name). A new pod gets a
    /// fresh UID (whatever the JSON says); a replaced one keeps its UID.
    /// Returns the UID.
    pub fn put_pod(&mut self, mut pod: Value) -> String {
        let path = crate::objects::pod_path(
            str_at(&pod, &["metadata", "namespace"]),
            str_at(&pod, &["metadata", "name"]),
        );
        let (kind, uid) = match self.objects.get(&path) {
            Some(old) => ("MODIFIED", str_at(old, &["metadata", "uid"]).to_string()),
            None => {
                self.next_uid += 1;
                ("ADDED", format!("testkit-uid-{}", self.next_uid))
            }
        };
        if let Some(meta) = pod.get_mut("metadata").and_then(Value::as_object_mut) {
            meta.insert("uid".into(), uid.clone().into());
        }
        let rv = self.stamp(&mut pod);
        self.history.push((rv, kind, "pods", pod.clone()));
        self.objects.insert(path, pod);
        uid
    }

    /// Removes a pod as a deletion completing would. Whether it existed.
    pub fn remove_pod(&mut self, namespace: &str, name: &str) -> bool {
        let path = crate::objects::pod_path(namespace, name);
        let Some(mut pod) = self.objects.remove(&path) else {
            return false;
        };
        let rv = self.stamp(&mut pod);
        self.history.push((rv, "DELETED", "pods", pod));
        true
    }

    pub fn pod(&self, namespace: &str, name: &str) -> Option<Value> {
        self.objects
            .get(&crate::objects::pod_path(namespace, name))
            .cloned()
    }

    /// Creates or replaces a namespace (`resource` "namespaces") or a
    /// service ("services"), as watches see it.
    pub fn put_object(&mut self, resource: &'static str, mut obj: Value) {
        let path = object_path(resource, &obj);
        let kind = if self.objects.contains_key(&path) && !self.unlisted.contains(&path) {
            "MODIFIED"
        } else {
            "ADDED"
        };
        let rv = self.stamp(&mut obj);
        self.history.push((rv, kind, resource, obj.clone()));
        self.unlisted.remove(&path);
        self.objects.insert(path, obj);
    }

    /// Creates a namespace or service that GETs find but no list or watch
    /// has shown yet: a watch that has not caught up.
    pub fn put_object_unwatched(&mut self, resource: &'static str, obj: Value) {
        let path = object_path(resource, &obj);
        if self.unlisted.contains(&path) || !self.objects.contains_key(&path) {
            self.unlisted.insert(path.clone());
            self.objects.insert(path, obj);
        }
    }

    pub fn put_node(&mut self, mut node: Value) {
        let path = crate::objects::node_path(str_at(&node, &["metadata", "name"]));
        self.stamp(&mut node);
        self.objects.insert(path, node);
    }

    pub fn node(&self, name: &str) -> Option<Value> {
        self.objects.get(&crate::objects::node_path(name)).cloned()
    }

    /// Forgets the history: a watch resuming from any version seen so far
    /// gets 410 Gone and must list again.
    pub fn expire_history(&mut self) {
        self.bump();
        self.oldest_rv = self.rv;
        self.history.clear();
    }
}

#[derive(Debug)]
struct State {
    /// The bearer token it requires.
    token: String,
    cluster: Mutex<Cluster>,
    /// Wakes the watches after a change, a cut or the stop.
    changed: Condvar,
    log: Mutex<Vec<RequestRecord>>,
    forced: Mutex<VecDeque<Forced>>,
    mode: Mutex<Mode>,
    access: Mutex<Access>,
    tokens: Mutex<Tokens>,
    watch: Mutex<WatchSettings>,
    connections: AtomicUsize,
    /// Watch streams being served now.
    open_watches: AtomicUsize,
    /// Bumped by `disconnect`: watches of an older generation are cut.
    generation: AtomicUsize,
    stopped: AtomicBool,
}

/// An answer forced on one of the next requests.
#[derive(Debug)]
struct Forced {
    /// Only a request of this path takes it; None: the next of any path.
    path: Option<String>,
    status: u16,
    /// Sent as it is (text/html); None: a `Status` object.
    body: Option<String>,
}

/// Tokens and RBAC.
#[derive(Debug, Default)]
struct Access {
    /// Valid besides the server's own token.
    extra_tokens: Vec<String>,
    /// Rejected with 401, whatever else says.
    revoked: Vec<String>,
    /// Paths answered with 403.
    forbidden: Vec<String>,
    /// Paths whose PATCHes get 403.
    forbidden_patch: Vec<String>,
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

#[derive(Debug)]
struct WatchSettings {
    gone_style: GoneStyle,
    bookmark_interval: Duration,
    /// Caps every watch's `timeoutSeconds`.
    max: Option<Duration>,
}

/// The fake Kubernetes API server; stops on drop.
pub struct FakeApiServer {
    addr: SocketAddr,
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
        Self::start_on(None, TestPki::new()).expect("start the fake API server")
    }

    /// Listens on 127.0.0.1 inside the network namespace at `netns_path`
    /// (whose loopback must be up, as [`crate::TestNetns`] leaves it). The
    /// plugin must then run in that namespace to reach it.
    pub fn start_in_netns(netns_path: &Path) -> std::io::Result<FakeApiServer> {
        Self::start_on(Some(netns_path.to_path_buf()), TestPki::new())
    }

    /// [`FakeApiServer::start`], serving `pki`'s certificate (e.g.
    /// [`TestPki::rsa`]).
    pub fn start_with(pki: TestPki) -> FakeApiServer {
        Self::start_on(None, pki).expect("start the fake API server")
    }

    /// [`FakeApiServer::start_in_netns`], serving `pki`'s certificate
    /// (e.g. [`TestPki::rsa`]).
    pub fn start_in_netns_with(netns_path: &Path, pki: TestPki) -> std::io::Result<FakeApiServer> {
        Self::start_on(Some(netns_path.to_path_buf()), pki)
    }

    fn start_on(netns: Option<PathBuf>, pki: TestPki) -> std::io::Result<FakeApiServer> {
        let tls = crate::http::server_tls(&pki)?;
        let state = Arc::new(State {
            token: format!("testkit-token-{}", crate::unique_name("t")),
            cluster: Mutex::new(Cluster::new()),
            changed: Condvar::new(),
            log: Mutex::new(vec![]),
            forced: Mutex::new(VecDeque::new()),
            mode: Mutex::new(Mode::Normal),
            access: Mutex::new(Access::default()),
            tokens: Mutex::new(Tokens::default()),
            watch: Mutex::new(WatchSettings {
                gone_style: GoneStyle::Event,
                bookmark_interval: Duration::from_millis(200),
                max: None,
            }),
            connections: AtomicUsize::new(0),
            open_watches: AtomicUsize::new(0),
            generation: AtomicUsize::new(0),
            stopped: AtomicBool::new(false),
        });

        type Bound = (SocketAddr, OwnedFd, TcpListener);
        let (tx, rx) = std::sync::mpsc::channel::<std::io::Result<Bound>>();
        let st = state.clone();
        // The sockets are made on the thread, which is in the namespace.
        let serve = move || {
            let bound = listen_reserved().and_then(|(port, listener)| {
                let addr = listener.local_addr()?;
                Ok((addr, port, listener.try_clone()?, listener))
            });
            match bound {
                Ok((addr, port, ours, listener)) => {
                    let _ = tx.send(Ok((addr, port, ours)));
                    accept_loop(listener, st, tls);
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
        &self.state.token
    }

    /// The CA that signed its certificate, PEM.
    pub fn ca_pem(&self) -> &str {
        &self.pki.ca_pem
    }

    /// Serves `body` with 200 at `path` (e.g. `/api/v1/namespaces/x`), as
    /// it is (no resource version, no watch event).
    pub fn set(&self, path: &str, body: Value) {
        self.with_cluster(|c| {
            c.unlisted.remove(path);
            c.objects.insert(path.to_string(), body)
        });
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

    /// Stops serving `path` (404 from now on), as when the object is deleted.
    pub fn remove(&self, path: &str) {
        lock(&self.state.cluster).objects.remove(path);
    }

    /// The object served at `path` now (after any PATCHes).
    pub fn object(&self, path: &str) -> Option<Value> {
        lock(&self.state.cluster).objects.get(path).cloned()
    }

    /// Changes the objects under the server's lock, then wakes the watches.
    pub fn with_cluster<T>(&self, f: impl FnOnce(&mut Cluster) -> T) -> T {
        let out = f(&mut lock(&self.state.cluster));
        self.state.changed.notify_all();
        out
    }

    /// Creates or replaces a pod; returns its UID.
    pub fn put_pod(&self, pod: Value) -> String {
        self.with_cluster(|c| c.put_pod(pod))
    }

    pub fn remove_pod(&self, namespace: &str, name: &str) -> bool {
        self.with_cluster(|c| c.remove_pod(namespace, name))
    }

    pub fn pod(&self, namespace: &str, name: &str) -> Option<Value> {
        lock(&self.state.cluster).pod(namespace, name)
    }

    pub fn put_object(&self, resource: &'static str, obj: Value) {
        self.with_cluster(|c| c.put_object(resource, obj))
    }

    pub fn put_node(&self, node: Value) {
        self.with_cluster(|c| c.put_node(node))
    }

    pub fn node(&self, name: &str) -> Option<Value> {
        lock(&self.state.cluster).node(name)
    }

    /// Cuts every open watch mid-stream (no final chunk, the TCP connection
    /// shut), after applying `f` to the objects under the same lock, so that
    /// no watch sees `f`'s changes live. With `expire`, the history is
    /// expired after `f`: resuming gets 410 Gone, and only a new list
    /// shows `f`'s changes.
    pub fn disconnect<T>(&self, expire: bool, f: impl FnOnce(&mut Cluster) -> T) -> T {
        let out = {
            let mut c = lock(&self.state.cluster);
            self.state.generation.fetch_add(1, Ordering::SeqCst);
            let out = f(&mut c);
            if expire {
                c.expire_history();
            }
            out
        };
        self.state.changed.notify_all();
        out
    }

    pub fn set_gone_style(&self, style: GoneStyle) {
        lock(&self.state.watch).gone_style = style;
    }

    /// How long an idle watch waits before a BOOKMARK (default 200 ms).
    pub fn set_bookmark_interval(&self, d: Duration) {
        lock(&self.state.watch).bookmark_interval = d;
    }

    /// Ends every watch cleanly after at most `d`, as kube-apiserver ends
    /// them at their `timeoutSeconds` (which clients set to minutes).
    pub fn set_max_watch(&self, d: Duration) {
        lock(&self.state.watch).max = Some(d);
    }

    /// Watch streams open now (a test that cuts streams waits for one, so
    /// that it cuts a live stream rather than racing its start).
    pub fn open_watches(&self) -> usize {
        self.state.open_watches.load(Ordering::SeqCst)
    }

    pub fn set_mode(&self, mode: Mode) {
        *lock(&self.state.mode) = mode;
    }

    /// The next `n` requests get `status` (e.g. 503, 429), whatever the mode.
    pub fn fail_next(&self, n: usize, status: u16) {
        self.force(None, n, status, None);
    }

    /// The next `n` requests of `path` get `status` (with a Status body).
    pub fn fail_next_on(&self, path: &str, n: usize, status: u16) {
        self.force(Some(path), n, status, None);
    }

    /// The next `n` requests get `status` with `body` as it is (e.g. an
    /// HTML page, as a proxy in the way answers).
    pub fn fail_next_with(&self, n: usize, status: u16, body: &str) {
        self.force(None, n, status, Some(body));
    }

    /// The next `n` requests of `path` get `status` with `body` as it is
    /// (a proxy's page, an empty answer).
    pub fn fail_next_on_with(&self, path: &str, n: usize, status: u16, body: &str) {
        self.force(Some(path), n, status, Some(body));
    }

    fn force(&self, path: Option<&str>, n: usize, status: u16, body: Option<&str>) {
        let mut forced = lock(&self.state.forced);
        for _ in 0..n {
            forced.push_back(Forced {
                path: path.map(str::to_string),
                status,
                body: body.map(str::to_string),
            });
        }
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
        self.accept_token(&t);
        t
    }

    /// A new valid bearer token, as a second pod of the service account gets.
    pub fn issue_token(&self) -> String {
        let t = format!("testkit-token-{}", crate::unique_name("t"));
        self.accept_token(&t);
        t
    }

    /// Accepts `token` too (e.g. one of an unusual length).
    pub fn accept_token(&self, token: &str) {
        lock(&self.state.access)
            .extra_tokens
            .push(token.to_string());
    }

    /// From now on `token` gets 401, as a pod-bound token once its pod is
    /// deleted.
    pub fn revoke_token(&self, token: &str) {
        lock(&self.state.access).revoked.push(token.to_string());
    }

    /// From now on requests for `path` get 403 (an RBAC role without it).
    pub fn forbid(&self, path: &str) {
        lock(&self.state.access).forbidden.push(path.to_string());
    }

    /// Serves `path` again after [`FakeApiServer::forbid`], as when the
    /// RBAC that was missing is restored.
    pub fn unforbid(&self, path: &str) {
        lock(&self.state.access).forbidden.retain(|p| p != path);
    }

    /// From now on PATCHes of `path` get 403 (GETs are still served).
    pub fn forbid_patch(&self, path: &str) {
        lock(&self.state.access)
            .forbidden_patch
            .push(path.to_string());
    }

    /// The patches received for `path`, in order (whatever the answer).
    pub fn patches(&self, path: &str) -> Vec<Value> {
        lock(&self.state.cluster)
            .patches
            .iter()
            .filter(|(p, _, _)| p == path)
            .map(|(_, _, v)| v.clone())
            .collect()
    }

    /// PATCHes received in all, whatever the path.
    pub fn total_patches(&self) -> usize {
        lock(&self.state.cluster).patches.len()
    }

    /// Node PATCHes so far: (node, content type, patch body).
    pub fn node_patches(&self) -> Vec<(String, String, Value)> {
        lock(&self.state.cluster)
            .patches
            .iter()
            .filter_map(|(p, kind, v)| {
                let name = p.strip_prefix("/api/v1/nodes/")?;
                Some((name.to_string(), kind.clone(), v.clone()))
            })
            .collect()
    }

    /// Another writer's change: `object` is stored at `path` right before
    /// the next PATCH of that path is applied, as if it had been written
    /// between the client's GET and its PATCH.
    pub fn change_before_next_patch(&self, path: &str, object: Value) {
        lock(&self.state.cluster)
            .races
            .insert(path.to_string(), object);
    }

    /// Pod deletions carried out so far.
    pub fn deletions(&self) -> Vec<Deletion> {
        lock(&self.state.cluster).deletions.clone()
    }

    /// The `events.k8s.io/v1` Events created so far, in order, as stored.
    pub fn events(&self) -> Vec<Value> {
        lock(&self.state.cluster).events.clone()
    }

    /// Requests received for `path` (whatever the answer, also while it is
    /// being made).
    pub fn requests(&self, path: &str) -> usize {
        lock(&self.state.log)
            .iter()
            .filter(|r| r.path == path)
            .count()
    }

    /// Requests received in all.
    pub fn total_requests(&self) -> usize {
        lock(&self.state.log).len()
    }

    /// The bearer tokens `path` was asked with, in order.
    pub fn bearers(&self, path: &str) -> Vec<String> {
        lock(&self.state.log)
            .iter()
            .filter(|r| r.path == path)
            .map(|r| r.bearer.clone())
            .collect()
    }

    /// Every request answered so far, in the order they were received.
    pub fn request_log(&self) -> Vec<RequestRecord> {
        lock(&self.state.log)
            .iter()
            .filter(|r| r.status != 0)
            .cloned()
            .collect()
    }

    /// TCP connections accepted (including ones that never sent a request).
    pub fn connections(&self) -> usize {
        self.state.connections.load(Ordering::SeqCst)
    }

    /// Closes the listener: from now on connections are refused, as when
    /// the API server is down, and open ones end (watches at once, others
    /// at their next request). Idempotent.
    pub fn stop(&mut self) {
        if self.state.stopped.swap(true, Ordering::SeqCst) {
            return;
        }
        self.state.changed.notify_all();
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
            &format!("certificate-authority-data: {}", self.ca_base64()),
            self.token(),
        )
    }

    /// The same kubeconfig as JSON, as the installer writes it now.
    pub fn kubeconfig_json(&self) -> String {
        crate::kubeconfig::installer_json(
            &format!("https://[{}]:{}", self.addr.ip(), self.addr.port()),
            ("certificate-authority-data", self.ca_base64().into()),
            self.token(),
        )
    }

    /// A kubeconfig for this server with the plain IP in its URL, for
    /// clients such as kube-rs, with `token` as the user's (e.g. one of
    /// [`Self::issue_token`]'s, so that its requests are told apart).
    pub fn client_kubeconfig(&self, token: &str) -> String {
        crate::kubeconfig::installer_text(
            &self.url(),
            &format!("certificate-authority-data: {}", self.ca_base64()),
            token,
        )
    }

    fn ca_base64(&self) -> String {
        base64::engine::general_purpose::STANDARD.encode(self.pki.ca_pem.as_bytes())
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

/// [`FakeApiServer`] under the names the long-running clients' tests use:
/// [`WatchApiServer::requests`] is the request log, and the kubeconfig is a
/// plain one for clients such as kube-rs.
pub struct WatchApiServer(FakeApiServer);

impl WatchApiServer {
    /// Listens on 127.0.0.1, a free port.
    pub fn start() -> WatchApiServer {
        WatchApiServer(FakeApiServer::start())
    }

    /// Every request answered so far.
    pub fn requests(&self) -> Vec<RequestRecord> {
        self.0.request_log()
    }

    /// A kubeconfig for this server with the plain IP in its URL, for
    /// clients such as kube-rs.
    pub fn kubeconfig_yaml(&self) -> String {
        self.0.client_kubeconfig(self.token())
    }
}

impl Deref for WatchApiServer {
    type Target = FakeApiServer;
    fn deref(&self) -> &FakeApiServer {
        &self.0
    }
}

impl DerefMut for WatchApiServer {
    fn deref_mut(&mut self) -> &mut FakeApiServer {
        &mut self.0
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

fn accept_loop(listener: TcpListener, state: Arc<State>, tls: Arc<ServerConfig>) {
    crate::http::accept_until(listener, &state.stopped, |tcp| {
        state.connections.fetch_add(1, Ordering::SeqCst);
        let (state, tls) = (state.clone(), tls.clone());
        std::thread::spawn(move || {
            let _ = serve_connection(tcp, &state, tls);
        });
    });
}

enum Answer {
    Json(u16, Value),
    /// A forced page, as it is.
    Raw(u16, String),
    Watch(WatchRequest),
}

struct WatchRequest {
    resource: &'static str,
    namespace: Option<String>,
    selector: Selector,
    from_rv: u64,
    bookmarks: bool,
    timeout: Duration,
}

fn serve_connection(tcp: TcpStream, state: &State, tls: Arc<ServerConfig>) -> std::io::Result<()> {
    let mut stream = crate::http::accept_tls(tcp, tls)?;
    loop {
        if state.stopped.load(Ordering::SeqCst) {
            return Ok(());
        }
        let Some(req) = read_request(&mut stream)? else {
            return Ok(());
        };
        let entry = {
            let mut log = lock(&state.log);
            log.push(RequestRecord {
                method: req.method.clone(),
                path: req.path.clone(),
                query: req.query.clone(),
                bearer: bearer(&req).unwrap_or_default().to_string(),
                status: 0,
                at: Instant::now(),
            });
            log.len() - 1
        };
        let mode = *lock(&state.mode);
        if let Mode::Slow(d) = mode {
            std::thread::sleep(d);
        }
        let answer = answer(state, &req);
        lock(&state.log)[entry].status = match &answer {
            Answer::Json(s, _) | Answer::Raw(s, _) => *s,
            Answer::Watch(_) => 200,
        };
        match answer {
            Answer::Json(status, body) => write_json(stream.get_mut(), status, &body)?,
            Answer::Raw(status, body) => write_raw(stream.get_mut(), status, "text/html", &body)?,
            Answer::Watch(w) => {
                if !serve_watch(stream.get_mut(), state, w)? {
                    // Cut on purpose: no final chunk, the connection shut.
                    let _ = stream.get_mut().sock.shutdown(Shutdown::Both);
                    return Ok(());
                }
            }
        }
    }
}

fn bearer(req: &Request) -> Option<&str> {
    req.authorization.as_deref()?.strip_prefix("Bearer ")
}

/// The forced answer `path` takes now, if any: raw pages before `Status`
/// answers, and among each, those for any path before those for one path.
fn take_forced(state: &State, path: &str) -> Option<Forced> {
    let mut forced = lock(&state.forced);
    let rank = |f: &Forced| 2 * u8::from(f.body.is_none()) + u8::from(f.path.is_some());
    let i = (0..4).find_map(|r| {
        forced
            .iter()
            .position(|f| rank(f) == r && f.path.as_deref().is_none_or(|p| p == path))
    })?;
    forced.remove(i)
}

fn answer(state: &State, req: &Request) -> Answer {
    if let Some(f) = take_forced(state, &req.path) {
        return match f.body {
            Some(body) => Answer::Raw(f.status, body),
            None => failure(f.status, "injected failure"),
        };
    }
    match *lock(&state.mode) {
        Mode::Unauthorized => return failure(401, "Unauthorized"),
        Mode::Forbidden => return failure(403, "forbidden: User cannot get resource"),
        Mode::Normal | Mode::Slow(_) => {}
    }
    let bearer = bearer(req);
    let minted = bearer.and_then(|b| valid_minted(state, b));
    let (forbidden, forbidden_patch) = {
        let access = lock(&state.access);
        let valid = bearer.is_some_and(|b| {
            (b == state.token || access.extra_tokens.iter().any(|t| t == b) || minted.is_some())
                && !access.revoked.iter().any(|t| t == b)
        });
        if !valid {
            return failure(401, "Unauthorized");
        }
        (
            access.forbidden.contains(&req.path),
            access.forbidden_patch.contains(&req.path),
        )
    };
    if req.method == "POST" && req.path == SELF_SUBJECT_ACCESS_REVIEW {
        return access_review(state, req);
    }
    // The plugin's role: GETs of pods, namespaces and services.
    if minted.is_some() && (req.method != "GET" || !req.path.starts_with("/api/v1/namespaces/")) {
        return failure(403, "forbidden: the plugin's role does not allow this");
    }
    if req.method == "POST"
        && let Some(account) = token_request_account(&req.path)
    {
        return token_request(state, req, &account);
    }
    if forbidden {
        return failure(403, "forbidden: User cannot get resource");
    }
    let segs = segments(&req.path);
    match (req.method.as_str(), segs.as_slice()) {
        ("GET", ["api", "v1", "pods"]) => list_or_watch(state, req, "pods", None),
        ("GET", ["api", "v1", "namespaces", ns, "pods"]) => {
            list_or_watch(state, req, "pods", Some(ns.to_string()))
        }
        ("GET", ["api", "v1", "namespaces"]) => list_or_watch(state, req, "namespaces", None),
        ("GET", ["api", "v1", "namespaces", ns, "services"]) => {
            list_or_watch(state, req, "services", Some(ns.to_string()))
        }
        ("GET", _) => match lock(&state.cluster).objects.get(&req.path) {
            Some(o) => Answer::Json(200, o.clone()),
            None => not_found(&req.path),
        },
        ("DELETE", ["api", "v1", "namespaces", ns, "pods", name]) => {
            delete_pod(state, ns, name, &req.body)
        }
        ("POST", ["apis", "events.k8s.io", "v1", "namespaces", ns, "events"]) => {
            post_event(state, ns, &req.body)
        }
        ("PATCH", _) => patch(state, req, forbidden_patch),
        _ => failure(405, "method not allowed"),
    }
}

fn failure(code: u16, message: &str) -> Answer {
    Answer::Json(code, status_json(code, message))
}

/// As kube-apiserver words it: `pods "web-1" not found`.
fn not_found(path: &str) -> Answer {
    let mut segs = path.trim_matches('/').rsplit('/');
    let (name, resource) = (segs.next().unwrap_or(""), segs.next().unwrap_or(""));
    failure(404, &format!("{resource} \"{name}\" not found"))
}

fn segments(path: &str) -> Vec<&str> {
    path.trim_matches('/').split('/').collect()
}

/// The path of a namespace (`resource` "namespaces") or a namespaced
/// object.
fn object_path(resource: &str, obj: &Value) -> String {
    let name = str_at(obj, &["metadata", "name"]);
    match resource {
        "namespaces" => crate::objects::namespace_path(name),
        _ => format!(
            "/api/v1/namespaces/{}/{resource}/{name}",
            str_at(obj, &["metadata", "namespace"])
        ),
    }
}

/// The resource whose lists show the object at `path`, if any.
fn listed_as(path: &str) -> Option<&'static str> {
    match segments(path).as_slice() {
        ["api", "v1", "namespaces", _] => Some("namespaces"),
        ["api", "v1", "namespaces", _, "pods", _] => Some("pods"),
        ["api", "v1", "namespaces", _, "services", _] => Some("services"),
        _ => None,
    }
}

/// Streams watch events; Ok(true) after a clean end (timeout), Ok(false)
/// when the stream is to be cut.
fn serve_watch(w: &mut Tls, state: &State, req: WatchRequest) -> std::io::Result<bool> {
    struct Open<'a>(&'a AtomicUsize);
    impl Drop for Open<'_> {
        fn drop(&mut self) {
            self.0.fetch_sub(1, Ordering::SeqCst);
        }
    }
    let generation = state.generation.load(Ordering::SeqCst);
    state.open_watches.fetch_add(1, Ordering::SeqCst);
    let _open = Open(&state.open_watches);
    let deadline = Instant::now() + req.timeout;
    w.write_all(
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n",
    )?;
    w.flush()?;
    let mut cursor = req.from_rv;
    let mut last_sent = Instant::now();
    let bookmark_every = lock(&state.watch).bookmark_interval;
    loop {
        let lines = {
            let mut c = lock(&state.cluster);
            loop {
                if state.stopped.load(Ordering::SeqCst)
                    || state.generation.load(Ordering::SeqCst) != generation
                {
                    return Ok(false);
                }
                if cursor < c.oldest_rv {
                    let status = status_json(
                        410,
                        &format!("too old resource version: {cursor} ({})", c.oldest_rv),
                    );
                    drop(c);
                    write_chunk(w, &json!({"type": "ERROR", "object": status}))?;
                    w.write_all(b"0\r\n\r\n")?;
                    w.flush()?;
                    return Ok(true);
                }
                let mut lines: Vec<Value> = c
                    .history
                    .iter()
                    .filter(|(rv, _, resource, obj)| {
                        *rv > cursor
                            && *resource == req.resource
                            && in_namespace(obj, &req.namespace)
                            && req.selector.matches(obj)
                    })
                    .map(|(_, kind, _, obj)| json!({"type": kind, "object": obj}))
                    .collect();
                let now = Instant::now();
                if lines.is_empty()
                    && req.bookmarks
                    && now.duration_since(last_sent) >= bookmark_every
                {
                    lines.push(json!({
                        "type": "BOOKMARK",
                        "object": {"kind": "Pod", "apiVersion": "v1",
                                   "metadata": {"resourceVersion": c.rv.to_string()}},
                    }));
                }
                if !lines.is_empty() {
                    cursor = c.rv;
                    break lines;
                }
                if now >= deadline {
                    drop(c);
                    w.write_all(b"0\r\n\r\n")?;
                    w.flush()?;
                    return Ok(true);
                }
                let wait = (deadline - now).min(Duration::from_millis(50));
                c = state
                    .changed
                    .wait_timeout(c, wait)
                    .unwrap_or_else(|p| p.into_inner())
                    .0;
            }
        };
        for line in &lines {
            write_chunk(w, line)?;
        }
        w.flush()?;
        last_sent = Instant::now();
    }
}

fn write_chunk(w: &mut Tls, v: &Value) -> std::io::Result<()> {
    let line = format!("{v}\n");
    w.write_all(format!("{:x}\r\n{line}\r\n", line.len()).as_bytes())
}

fn list_or_watch(
    state: &State,
    req: &Request,
    resource: &'static str,
    namespace: Option<String>,
) -> Answer {
    let param = |key: &str| {
        req.query
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    };
    let selector = match Selector::parse(
        param("labelSelector").unwrap_or(""),
        param("fieldSelector").unwrap_or(""),
    ) {
        Ok(s) => s,
        Err(e) => return failure(400, &e),
    };
    if matches!(param("watch"), Some("true" | "1")) {
        let from_rv = match param("resourceVersion").unwrap_or("") {
            // "Any": from now, as kube-apiserver starts from its cache.
            "" | "0" => lock(&state.cluster).rv,
            v => match v.parse::<u64>() {
                Ok(v) => v,
                Err(_) => return failure(400, "invalid resourceVersion"),
            },
        };
        let (gone_style, max) = {
            let w = lock(&state.watch);
            (w.gone_style, w.max)
        };
        if from_rv < lock(&state.cluster).oldest_rv && gone_style == GoneStyle::Http {
            return failure(410, "too old resource version");
        }
        let mut timeout = param("timeoutSeconds")
            .and_then(|t| t.parse().ok())
            .map_or(Duration::from_secs(300), Duration::from_secs);
        if let Some(max) = max {
            timeout = timeout.min(max);
        }
        return Answer::Watch(WatchRequest {
            resource,
            namespace,
            selector,
            from_rv,
            bookmarks: matches!(param("allowWatchBookmarks"), Some("true" | "1")),
            timeout,
        });
    }
    let c = lock(&state.cluster);
    let mut items: Vec<&Value> = c
        .objects
        .iter()
        .filter(|(path, o)| {
            listed_as(path) == Some(resource)
                && !c.unlisted.contains(*path)
                && in_namespace(o, &namespace)
                && selector.matches(o)
        })
        .map(|(_, o)| o)
        .collect();
    let key = |o: &Value| {
        (
            str_at(o, &["metadata", "namespace"]).to_string(),
            str_at(o, &["metadata", "name"]).to_string(),
        )
    };
    items.sort_by_cached_key(|o| key(o));
    let list_kind = match resource {
        "pods" => "PodList",
        "namespaces" => "NamespaceList",
        _ => "ServiceList",
    };
    Answer::Json(
        200,
        json!({
            "kind": list_kind, "apiVersion": "v1",
            "metadata": {"resourceVersion": c.rv.to_string()},
            "items": items,
        }),
    )
}

/// DELETE of a pod: removed at once (as with grace period 0), the
/// deletion recorded.
fn delete_pod(state: &State, ns: &str, name: &str, body: &[u8]) -> Answer {
    let opts: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    let mut c = lock(&state.cluster);
    let Some(pod) = c.pod(ns, name) else {
        return not_found(&crate::objects::pod_path(ns, name));
    };
    let uid = str_at(&pod, &["metadata", "uid"]).to_string();
    if let Some(want) = opts.pointer("/preconditions/uid").and_then(Value::as_str)
        && want != uid
    {
        let msg =
            format!("Precondition failed: UID in precondition: {want}, UID in object meta: {uid}");
        return failure(409, &msg);
    }
    c.remove_pod(ns, name);
    c.deletions.push(Deletion {
        namespace: ns.into(),
        name: name.into(),
        uid: uid.clone(),
        grace_period_seconds: opts.get("gracePeriodSeconds").and_then(Value::as_i64),
        at: Instant::now(),
    });
    drop(c);
    state.changed.notify_all();
    Answer::Json(
        200,
        json!({
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
            "details": {"name": name, "kind": "pods", "uid": uid},
        }),
    )
}

fn post_event(state: &State, ns: &str, body: &[u8]) -> Answer {
    let Ok(mut ev) = serde_json::from_slice::<Value>(body) else {
        return failure(400, "the body is not JSON");
    };
    let mut c = lock(&state.cluster);
    let rv = c.bump();
    if let Some(meta) = ev.get_mut("metadata").and_then(Value::as_object_mut) {
        meta.insert("namespace".into(), ns.into());
        meta.insert("resourceVersion".into(), rv.to_string().into());
        meta.insert("uid".into(), format!("testkit-event-{rv}").into());
    }
    c.events.push(ev.clone());
    Answer::Json(201, ev)
}

/// A PATCH of any object: recorded, then applied all or nothing.
fn patch(state: &State, req: &Request, forbidden: bool) -> Answer {
    let body = match serde_json::from_slice::<Value>(&req.body) {
        Ok(v) => v,
        Err(e) => return failure(400, &format!("the patch is not JSON: {e}")),
    };
    let kind = req.content_type.split(';').next().unwrap_or("").trim();
    let mut c = lock(&state.cluster);
    c.patches
        .push((req.path.clone(), kind.to_string(), body.clone()));
    if forbidden {
        return failure(403, "forbidden: User cannot patch resource");
    }
    if let Some(other) = c.races.remove(&req.path) {
        c.objects.insert(req.path.clone(), other);
    }
    let Some(mut obj) = c.objects.get(&req.path).cloned() else {
        return not_found(&req.path);
    };
    let applied = match kind {
        "application/merge-patch+json" | "application/strategic-merge-patch+json" => {
            merge_patch(&mut obj, &body);
            Ok(())
        }
        "application/json-patch+json" => json_patch(&mut obj, &body),
        other => Err((415, format!("unsupported patch type {other:?}"))),
    };
    if let Err((code, msg)) = applied {
        return failure(code, &msg);
    }
    c.stamp(&mut obj);
    c.objects.insert(req.path.clone(), obj.clone());
    drop(c);
    state.changed.notify_all();
    Answer::Json(200, obj)
}

/// RFC 7386.
fn merge_patch(target: &mut Value, patch: &Value) {
    let Value::Object(p) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    if let Value::Object(t) = target {
        for (k, v) in p {
            if v.is_null() {
                t.remove(k);
            } else {
                merge_patch(t.entry(k.clone()).or_insert(Value::Null), v);
            }
        }
    }
}

/// RFC 6902, the operations a client removing a taint uses: add, remove,
/// replace, test. All or nothing.
fn json_patch(target: &mut Value, patch: &Value) -> Result<(), (u16, String)> {
    let Some(ops) = patch.as_array() else {
        return Err((400, "a JSON patch is an array".into()));
    };
    let mut work = target.clone();
    for op in ops {
        let path = op.get("path").and_then(Value::as_str).unwrap_or("");
        let value = op.get("value").cloned().unwrap_or(Value::Null);
        let (parent, last) = match path.rsplit_once('/') {
            Some((p, l)) => (p, l.replace("~1", "/").replace("~0", "~")),
            None => return Err((422, format!("invalid path {path:?}"))),
        };
        match op.get("op").and_then(Value::as_str) {
            Some("test") => {
                if work.pointer(path) != Some(&value) {
                    return Err((422, format!("test failed at {path}")));
                }
            }
            Some(kind @ ("add" | "remove" | "replace")) => {
                let Some(p) = work.pointer_mut(parent) else {
                    return Err((422, format!("no parent for {path}")));
                };
                match (p, kind) {
                    (Value::Object(m), "add") => {
                        m.insert(last, value);
                    }
                    (Value::Object(m), "replace") if m.contains_key(&last) => {
                        m.insert(last, value);
                    }
                    (Value::Object(m), "remove") if m.contains_key(&last) => {
                        m.remove(&last);
                    }
                    (Value::Array(a), "add") if last == "-" => a.push(value),
                    (Value::Array(a), k) => {
                        let i: usize = last
                            .parse()
                            .map_err(|_| (422, format!("invalid index in {path}")))?;
                        match k {
                            "add" if i <= a.len() => a.insert(i, value),
                            "replace" if i < a.len() => a[i] = value,
                            "remove" if i < a.len() => {
                                a.remove(i);
                            }
                            _ => return Err((422, format!("index out of range in {path}"))),
                        }
                    }
                    _ => return Err((422, format!("cannot {kind} at {path}"))),
                }
            }
            other => return Err((422, format!("unsupported op {other:?}"))),
        }
    }
    *target = work;
    Ok(())
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

fn token_request(state: &State, req: &Request, account: &str) -> Answer {
    let body: Value = serde_json::from_slice(&req.body).unwrap_or(Value::Null);
    let mut tokens = lock(&state.tokens);
    tokens.requests.push(body.clone());
    let policy = tokens.policy;
    if !policy.allowed {
        return failure(
            403,
            "forbidden: cannot create resource serviceaccounts/token",
        );
    }
    if tokens.deleted.iter().any(|a| a == account) {
        return failure(404, "serviceaccount not found");
    }
    let spec = &body["spec"];
    let node = match &spec["boundObjectRef"] {
        Value::Null => None,
        r if r["kind"] == "Node" && policy.node_binding => r["name"].as_str().map(str::to_string),
        r => {
            return failure(
                400,
                &format!("cannot bind token for object of type {}", r["kind"]),
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
    Answer::Json(
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

/// Allows everything but `get` of a forbidden path, and `create` of
/// `serviceaccounts/token` as the [`TokenPolicy`] says.
fn access_review(state: &State, req: &Request) -> Answer {
    let body: Value = serde_json::from_slice(&req.body).unwrap_or(Value::Null);
    let a = &body["spec"]["resourceAttributes"];
    let s = |k: &str| a[k].as_str().unwrap_or_default().to_string();
    if s("resource") == "serviceaccounts" && s("subresource") == "token" {
        let allowed = lock(&state.tokens).policy.allowed;
        return Answer::Json(201, json!({"status": {"allowed": allowed}}));
    }
    let path = match s("resource").as_str() {
        // Cluster-wide: every namespace, any name.
        "pods" if s("namespace").is_empty() && s("name").is_empty() => "/api/v1/pods".into(),
        "pods" => crate::objects::pod_path(&s("namespace"), &s("name")),
        "daemonsets" => crate::objects::daemonset_path(&s("namespace"), &s("name")),
        _ => String::new(),
    };
    let allowed = !lock(&state.access).forbidden.contains(&path);
    Answer::Json(201, json!({"status": {"allowed": allowed}}))
}

fn in_namespace(obj: &Value, ns: &Option<String>) -> bool {
    ns.as_deref()
        .is_none_or(|ns| str_at(obj, &["metadata", "namespace"]) == ns)
}

fn str_at<'a>(v: &'a Value, path: &[&str]) -> &'a str {
    path.iter()
        .try_fold(v, |v, k| v.get(k))
        .and_then(Value::as_str)
        .unwrap_or("")
}

/// Label and field selectors, the equality-based subset.
#[derive(Debug, Default)]
struct Selector {
    labels: Vec<Term>,
    fields: Vec<Term>,
}

#[derive(Debug)]
enum Term {
    Exists(String),
    NotExists(String),
    Eq(String, String),
    NotEq(String, String),
}

impl Term {
    fn holds(&self, get: &dyn Fn(&str) -> Option<String>) -> bool {
        match self {
            Term::Exists(k) => get(k).is_some(),
            Term::NotExists(k) => get(k).is_none(),
            Term::Eq(k, v) => get(k).as_deref() == Some(v.as_str()),
            Term::NotEq(k, v) => get(k).as_deref() != Some(v.as_str()),
        }
    }
}

impl Selector {
    fn parse(labels: &str, fields: &str) -> Result<Selector, String> {
        let terms = |s: &str, allow_exists: bool| -> Result<Vec<Term>, String> {
            s.split(',')
                .map(str::trim)
                .filter(|t| !t.is_empty())
                .map(|t| {
                    if t.contains(" in ") || t.contains(" notin ") || t.contains('(') {
                        return Err(format!("set-based selector {t:?} is not supported"));
                    }
                    if let Some((k, v)) = t.split_once("!=") {
                        Ok(Term::NotEq(k.trim().into(), v.trim().into()))
                    } else if let Some((k, v)) = t.split_once("==").or_else(|| t.split_once('=')) {
                        Ok(Term::Eq(k.trim().into(), v.trim().into()))
                    } else if !allow_exists {
                        Err(format!("invalid field selector {t:?}"))
                    } else if let Some(k) = t.strip_prefix('!') {
                        Ok(Term::NotExists(k.trim().into()))
                    } else {
                        Ok(Term::Exists(t.into()))
                    }
                })
                .collect()
        };
        Ok(Selector {
            labels: terms(labels, true)?,
            fields: terms(fields, false)?,
        })
    }

    fn matches(&self, obj: &Value) -> bool {
        let label = |k: &str| {
            obj.pointer("/metadata/labels")
                .and_then(|l| l.get(k))
                .and_then(Value::as_str)
                .map(str::to_string)
        };
        let field = |k: &str| {
            let path: Vec<&str> = k.split('.').collect();
            Some(str_at(obj, &path).to_string())
        };
        self.labels.iter().all(|t| t.holds(&label)) && self.fields.iter().all(|t| t.holds(&field))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::TestNetns;
    use std::io::{BufRead, BufReader, Read};

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

    /// A minimal HTTPS client: one request, the raw answer as lines.
    struct Client {
        stream: BufReader<rustls::StreamOwned<rustls::ClientConnection, TcpStream>>,
    }

    impl Client {
        fn connect(api: &FakeApiServer) -> Client {
            let mut roots = rustls::RootCertStore::empty();
            let der =
                rustls::pki_types::CertificateDer::from(pem_to_der(api.ca_pem()).expect("CA PEM"));
            roots.add(der).unwrap();
            let provider = Arc::new(rustls::crypto::ring::default_provider());
            let config = rustls::ClientConfig::builder_with_provider(provider)
                .with_safe_default_protocol_versions()
                .unwrap()
                .with_root_certificates(roots)
                .with_no_client_auth();
            let name = rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
            let conn = rustls::ClientConnection::new(Arc::new(config), name).unwrap();
            let tcp = TcpStream::connect(api.addr()).unwrap();
            tcp.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            Client {
                stream: BufReader::new(rustls::StreamOwned::new(conn, tcp)),
            }
        }

        fn send(
            &mut self,
            api: &FakeApiServer,
            method: &str,
            target: &str,
            ctype: &str,
            body: &str,
        ) {
            let req = format!(
                "{method} {target} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\n\r\n{body}",
                api.token(),
                body.len()
            );
            self.stream.get_mut().write_all(req.as_bytes()).unwrap();
        }

        /// Status and JSON body of a Content-Length answer.
        fn answer(&mut self) -> (u16, Value) {
            let (status, headers) = self.head();
            let len: usize = headers
                .iter()
                .find_map(|h| h.strip_prefix("Content-Length: "))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0);
            let mut body = vec![0; len];
            self.stream.read_exact(&mut body).unwrap();
            (status, serde_json::from_slice(&body).unwrap_or(Value::Null))
        }

        fn head(&mut self) -> (u16, Vec<String>) {
            let mut lines = vec![];
            loop {
                let mut l = String::new();
                self.stream.read_line(&mut l).unwrap();
                if l.trim().is_empty() {
                    break;
                }
                lines.push(l.trim_end().to_string());
            }
            let status = lines[0].split_whitespace().nth(1).unwrap().parse().unwrap();
            (status, lines)
        }

        /// The next watch event of a chunked stream; None at its end.
        fn event(&mut self) -> Option<Value> {
            let mut size = String::new();
            self.stream.read_line(&mut size).ok()?;
            let n = usize::from_str_radix(size.trim(), 16).ok()?;
            if n == 0 {
                // The empty trailer.
                let mut crlf = String::new();
                let _ = self.stream.read_line(&mut crlf);
                return None;
            }
            let mut chunk = vec![0; n + 2];
            self.stream.read_exact(&mut chunk).ok()?;
            serde_json::from_slice(&chunk[..n]).ok()
        }
    }

    fn pem_to_der(pem: &str) -> Option<Vec<u8>> {
        use base64::Engine;
        let b64: String = pem.lines().filter(|l| !l.starts_with("-----")).collect();
        base64::engine::general_purpose::STANDARD.decode(b64).ok()
    }

    fn pod(ns: &str, name: &str, node: &str, meshed: bool) -> Value {
        let mut p = crate::objects::Pod::new(ns, name);
        if meshed {
            p = p.label("linkerd.io/control-plane-ns", "linkerd");
        }
        crate::objects::on_node(p.json(), node)
    }

    fn names(list: &Value) -> Vec<String> {
        list["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["metadata"]["name"].as_str().unwrap().to_string())
            .collect()
    }

    /// Objects registered as they are and objects kept with versions are
    /// one store, and forced answers and the request log cover lists as
    /// they cover GETs.
    #[test]
    fn one_store_one_log_one_way_to_fail() {
        let api = FakeApiServer::start();
        api.add_pod(&crate::objects::Pod::new("a", "set"));
        let uid = api.put_pod(pod("a", "put", "n1", true));
        let put = api.object(&crate::objects::pod_path("a", "put")).unwrap();
        assert_eq!(put["metadata"]["uid"], uid.as_str());
        let pods = "/api/v1/namespaces/a/pods";
        api.fail_next_on(pods, 1, 503);
        let mut c = Client::connect(&api);
        let mut list = || {
            c.send(&api, "GET", pods, "application/json", "");
            c.answer()
        };
        assert_eq!(list().0, 503);
        let (s, l) = list();
        assert_eq!((s, names(&l)), (200, vec!["put".into(), "set".into()]));
        assert_eq!(api.requests(pods), 2);
        let log: Vec<_> = api
            .request_log()
            .into_iter()
            .map(|r| (r.path, r.status, r.bearer))
            .collect();
        let who = api.token().to_string();
        assert_eq!(
            log,
            [(pods.into(), 503, who.clone()), (pods.into(), 200, who)]
        );
    }

    #[test]
    fn lists_with_label_and_field_selectors() {
        let api = WatchApiServer::start();
        api.put_pod(pod("a", "p1", "n1", true));
        api.put_pod(pod("a", "p2", "n2", true));
        api.put_pod(pod("b", "p3", "n1", false));
        let mut c = Client::connect(&api);
        let list = |c: &mut Client, target: &str| {
            c.send(&api, "GET", target, "application/json", "");
            c.answer()
        };
        let (s, all) = list(&mut c, "/api/v1/pods");
        assert_eq!(
            (s, names(&all)),
            (200, vec!["p1".into(), "p2".into(), "p3".into()])
        );
        let (_, l) = list(
            &mut c,
            "/api/v1/pods?fieldSelector=spec.nodeName%3Dn1&labelSelector=linkerd.io%2Fcontrol-plane-ns",
        );
        assert_eq!(names(&l), ["p1"]);
        let (_, l) = list(
            &mut c,
            "/api/v1/pods?labelSelector=%21linkerd.io%2Fcontrol-plane-ns",
        );
        assert_eq!(names(&l), ["p3"]);
        let (_, l) = list(
            &mut c,
            "/api/v1/namespaces/a/pods?fieldSelector=spec.nodeName!%3Dn1",
        );
        assert_eq!(names(&l), ["p2"]);
        let (s, _) = list(&mut c, "/api/v1/pods?labelSelector=x+in+(a)");
        assert_eq!(s, 400);
        assert!(all["metadata"]["resourceVersion"].as_str().is_some());
    }

    #[test]
    fn watch_sends_changes_bookmarks_and_gone() {
        let api = WatchApiServer::start();
        api.put_pod(pod("a", "p1", "n1", true));
        let rv = lock(&api.state.cluster).rv;
        let mut c = Client::connect(&api);
        c.send(
            &api,
            "GET",
            &format!("/api/v1/pods?watch=true&resourceVersion={rv}&allowWatchBookmarks=true&fieldSelector=spec.nodeName%3Dn1"),
            "application/json",
            "",
        );
        assert_eq!(c.head().0, 200);
        api.put_pod(pod("a", "p2", "n2", true));
        api.put_pod(pod("a", "p3", "n1", true));
        // (A bookmark may come first when this thread is slow.)
        let e = std::iter::from_fn(|| c.event())
            .find(|e| e["type"] != "BOOKMARK")
            .unwrap();
        assert_eq!(e["type"], "ADDED");
        assert_eq!(e["object"]["metadata"]["name"], "p3");
        let e = c.event().unwrap();
        assert_eq!(e["type"], "BOOKMARK");
        let rv_now = lock(&api.state.cluster).rv.to_string();
        assert_eq!(e["object"]["metadata"]["resourceVersion"], rv_now.as_str());

        // Cut: the stream ends without its last chunk.
        api.disconnect(false, |_| ());
        assert!(c.event().is_none());

        // Resuming from an expired version: 410 in the stream.
        api.disconnect(true, |_| ());
        let mut c = Client::connect(&api);
        let resume = format!("/api/v1/pods?watch=1&resourceVersion={rv}");
        c.send(&api, "GET", &resume, "application/json", "");
        assert_eq!(c.head().0, 200);
        let e = c.event().unwrap();
        assert_eq!(e["type"], "ERROR");
        assert_eq!(e["object"]["code"], 410);
        assert!(c.event().is_none());

        // Or as the answer.
        api.set_gone_style(GoneStyle::Http);
        c.send(&api, "GET", &resume, "application/json", "");
        assert_eq!(c.answer().0, 410);
    }

    #[test]
    fn delete_honours_the_uid_precondition() {
        let api = WatchApiServer::start();
        let uid = api.put_pod(pod("a", "p1", "n1", true));
        let mut c = Client::connect(&api);
        let body = r#"{"gracePeriodSeconds":0,"preconditions":{"uid":"other"}}"#;
        c.send(
            &api,
            "DELETE",
            "/api/v1/namespaces/a/pods/p1",
            "application/json",
            body,
        );
        assert_eq!(c.answer().0, 409);
        let body = format!(r#"{{"gracePeriodSeconds":0,"preconditions":{{"uid":"{uid}"}}}}"#);
        c.send(
            &api,
            "DELETE",
            "/api/v1/namespaces/a/pods/p1",
            "application/json",
            &body,
        );
        assert_eq!(c.answer().0, 200);
        c.send(
            &api,
            "DELETE",
            "/api/v1/namespaces/a/pods/p1",
            "application/json",
            "{}",
        );
        assert_eq!(c.answer().0, 404);
        let d = api.deletions();
        assert_eq!(d.len(), 1);
        assert_eq!(
            (d[0].uid.as_str(), d[0].grace_period_seconds),
            (uid.as_str(), Some(0))
        );
        assert!(api.pod("a", "p1").is_none());
    }

    #[test]
    fn patches_nodes() {
        let api = WatchApiServer::start();
        api.put_node(json!({"kind": "Node", "apiVersion": "v1", "metadata": {"name": "n1"},
            "spec": {"taints": [{"key": "a", "effect": "NoSchedule"}, {"key": "b", "effect": "NoSchedule"}]}}));
        let mut c = Client::connect(&api);
        // JSON patch with a test: all or nothing.
        let bad = r#"[{"op":"test","path":"/spec/taints/0/key","value":"b"},{"op":"remove","path":"/spec/taints/0"}]"#;
        c.send(
            &api,
            "PATCH",
            "/api/v1/nodes/n1",
            "application/json-patch+json",
            bad,
        );
        assert_eq!(c.answer().0, 422);
        let good = r#"[{"op":"test","path":"/spec/taints/0/key","value":"a"},{"op":"remove","path":"/spec/taints/0"}]"#;
        c.send(
            &api,
            "PATCH",
            "/api/v1/nodes/n1",
            "application/json-patch+json",
            good,
        );
        let (s, node) = c.answer();
        assert_eq!(s, 200);
        assert_eq!(
            node["spec"]["taints"],
            json!([{"key": "b", "effect": "NoSchedule"}])
        );
        c.send(
            &api,
            "PATCH",
            "/api/v1/nodes/n1",
            "application/merge-patch+json",
            r#"{"spec":{"taints":null}}"#,
        );
        assert_eq!(c.answer().0, 200);
        assert_eq!(api.node("n1").unwrap()["spec"], json!({}));
        assert_eq!(api.node_patches().len(), 3);
        c.send(
            &api,
            "PATCH",
            "/api/v1/nodes/n2",
            "application/merge-patch+json",
            "{}",
        );
        assert_eq!(c.answer().0, 404);
    }
}
