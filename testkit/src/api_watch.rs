//! [`WatchApiServer`]: a stateful stand-in for the Kubernetes API server,
//! for long-running clients (the repair controller, the installer's node
//! patch) rather than the plugin's one-shot GETs that [`crate::api`] serves.
//!
//! It keeps pods, namespaces, services and nodes with resource versions
//! and a history of changes, over real TLS with a bearer token, and serves:
//!
//! - pods: list and watch (all namespaces or one) with label selectors
//!   (`key`, `!key`, `key=value`, `key!=value`) and field selectors
//!   (`path=value`, `path!=value` on any dotted path, e.g.
//!   `spec.nodeName`); GET and DELETE of one pod (`DeleteOptions` body:
//!   `gracePeriodSeconds` recorded, `preconditions.uid` enforced with 409);
//! - namespaces and services: list, watch (the same selectors) and GET;
//! - watch streams as the real server sends them: chunked JSON lines,
//!   `BOOKMARK`s while idle when asked for, an `ERROR` event with `410 Gone`
//!   for an expired resource version (or, with [`GoneStyle::Http`], an HTTP
//!   410 answer), the end of the stream at `timeoutSeconds` (which
//!   [`WatchApiServer::set_max_watch`] can shorten);
//! - `events.k8s.io/v1` Events: POST, kept for the test to read;
//! - nodes: GET and PATCH (JSON merge patch, strategic merge patch as a
//!   merge patch, JSON patch with add, remove, replace and test).
//!
//! Tests make things go wrong with [`WatchApiServer::fail_next`] (the next
//! requests get an error status), [`WatchApiServer::disconnect`] (every open
//! watch is cut mid-stream, optionally with the history expired so that
//! resuming gets `410 Gone`), and read what happened with
//! [`WatchApiServer::requests`], [`WatchApiServer::deletions`] and
//! [`WatchApiServer::events`].
//!
//! HTTP/1.1 only, keep-alive, one thread per connection.

use std::collections::{BTreeMap, VecDeque};
use std::io::Write;
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rustls::ServerConfig;
use serde_json::{Map, Value, json};

use crate::http::{Request, Tls, lock, read_request, status_json, write_json};
use crate::pki::TestPki;

/// How an expired resource version is answered on a watch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GoneStyle {
    /// `200`, then an `ERROR` event holding a 410 `Status`, as
    /// kube-apiserver does.
    Event,
    /// An HTTP `410` answer to the watch request itself.
    Http,
}

/// One request, as received.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestRecord {
    pub method: String,
    pub path: String,
    /// Decoded query parameters, in order.
    pub query: Vec<(String, String)>,
    /// The status it was answered with.
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

/// The server's objects; changed through [`WatchApiServer::with_cluster`]
/// or the shortcuts on the server.
#[derive(Debug)]
pub struct Cluster {
    rv: u64,
    next_uid: u64,
    pods: BTreeMap<(String, String), Value>,
    nodes: BTreeMap<String, Value>,
    /// Namespaces and services, by (resource, namespace, name); a
    /// namespace's own namespace is "".
    others: BTreeMap<(&'static str, String, String), Value>,
    /// Objects only GETs find (see [`Cluster::put_object_unwatched`]).
    unwatched: BTreeMap<(&'static str, String, String), Value>,
    /// Changes of pods, namespaces and services: (resource version, watch
    /// event type, resource, object).
    history: Vec<(u64, &'static str, &'static str, Value)>,
    /// Watches from a version older than this get 410 Gone.
    oldest_rv: u64,
    events: Vec<Value>,
    deletions: Vec<Deletion>,
    node_patches: Vec<(String, String, Value)>,
}

impl Cluster {
    fn bump(&mut self) -> u64 {
        self.rv += 1;
        self.rv
    }

    /// Creates or replaces a pod (by namespace and name). A new pod gets a
    /// fresh UID (whatever the JSON says); a replaced one keeps its UID.
    /// Returns the UID.
    pub fn put_pod(&mut self, mut pod: Value) -> String {
        let ns = str_at(&pod, &["metadata", "namespace"]).to_string();
        let name = str_at(&pod, &["metadata", "name"]).to_string();
        let key = (ns, name);
        let (kind, uid) = match self.pods.get(&key) {
            Some(old) => ("MODIFIED", str_at(old, &["metadata", "uid"]).to_string()),
            None => {
                self.next_uid += 1;
                ("ADDED", format!("testkit-uid-{}", self.next_uid))
            }
        };
        let rv = self.bump();
        if let Some(meta) = pod.get_mut("metadata").and_then(Value::as_object_mut) {
            meta.insert("uid".into(), uid.clone().into());
            meta.insert("resourceVersion".into(), rv.to_string().into());
        }
        self.history.push((rv, kind, "pods", pod.clone()));
        self.pods.insert(key, pod);
        uid
    }

    /// Removes a pod as a deletion completing would. Whether it existed.
    pub fn remove_pod(&mut self, namespace: &str, name: &str) -> bool {
        let Some(mut pod) = self.pods.remove(&(namespace.into(), name.into())) else {
            return false;
        };
        let rv = self.bump();
        if let Some(meta) = pod.get_mut("metadata").and_then(Value::as_object_mut) {
            meta.insert("resourceVersion".into(), rv.to_string().into());
        }
        self.history.push((rv, "DELETED", "pods", pod));
        true
    }

    pub fn pod(&self, namespace: &str, name: &str) -> Option<Value> {
        self.pods.get(&(namespace.into(), name.into())).cloned()
    }

    /// Creates or replaces a namespace (`resource` "namespaces") or a
    /// service ("services"), as watches see it.
    pub fn put_object(&mut self, resource: &'static str, mut obj: Value) {
        let key = object_key(resource, &obj);
        let kind = if self.others.contains_key(&key) {
            "MODIFIED"
        } else {
            "ADDED"
        };
        let rv = self.bump();
        if let Some(meta) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
            meta.insert("resourceVersion".into(), rv.to_string().into());
        }
        self.history.push((rv, kind, resource, obj.clone()));
        self.others.insert(key, obj);
    }

    /// Creates a namespace or service that GETs find but no list or watch
    /// has shown yet: a watch that has not caught up.
    pub fn put_object_unwatched(&mut self, resource: &'static str, obj: Value) {
        self.unwatched.insert(object_key(resource, &obj), obj);
    }

    pub fn put_node(&mut self, mut node: Value) {
        let name = str_at(&node, &["metadata", "name"]).to_string();
        let rv = self.bump();
        if let Some(meta) = node.get_mut("metadata").and_then(Value::as_object_mut) {
            meta.insert("resourceVersion".into(), rv.to_string().into());
        }
        self.nodes.insert(name, node);
    }

    pub fn node(&self, name: &str) -> Option<Value> {
        self.nodes.get(name).cloned()
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
    cluster: Mutex<Cluster>,
    changed: Condvar,
    requests: Mutex<Vec<RequestRecord>>,
    fail_next: Mutex<VecDeque<u16>>,
    gone_style: Mutex<GoneStyle>,
    bookmark_interval: Mutex<Duration>,
    /// Caps every watch's `timeoutSeconds`.
    max_watch: Mutex<Option<Duration>>,
    /// Watch streams being served now.
    open_watches: AtomicUsize,
    /// Bumped by `disconnect`: watches of an older generation are cut.
    generation: AtomicUsize,
    stopped: AtomicBool,
}

/// The stateful fake API server; stops on drop.
pub struct WatchApiServer {
    addr: SocketAddr,
    token: String,
    pki: TestPki,
    state: Arc<State>,
    accept: Option<JoinHandle<()>>,
}

impl WatchApiServer {
    /// Listens on 127.0.0.1, a free port.
    pub fn start() -> WatchApiServer {
        let pki = TestPki::new();
        let tls = crate::http::server_tls(&pki).expect("TLS server config");
        let state = Arc::new(State {
            cluster: Mutex::new(Cluster {
                rv: 100,
                next_uid: 0,
                pods: BTreeMap::new(),
                nodes: BTreeMap::new(),
                others: BTreeMap::new(),
                unwatched: BTreeMap::new(),
                history: vec![],
                oldest_rv: 0,
                events: vec![],
                deletions: vec![],
                node_patches: vec![],
            }),
            changed: Condvar::new(),
            requests: Mutex::new(vec![]),
            fail_next: Mutex::new(VecDeque::new()),
            gone_style: Mutex::new(GoneStyle::Event),
            bookmark_interval: Mutex::new(Duration::from_millis(200)),
            max_watch: Mutex::new(None),
            open_watches: AtomicUsize::new(0),
            generation: AtomicUsize::new(0),
            stopped: AtomicBool::new(false),
        });
        let token = format!("testkit-token-{}", crate::unique_name("w"));
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
        let addr = listener.local_addr().expect("local addr");
        let (st, tok) = (state.clone(), token.clone());
        let accept = std::thread::spawn(move || accept_loop(listener, st, tls, tok));
        WatchApiServer {
            addr,
            token,
            pki,
            state,
            accept: Some(accept),
        }
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `https://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("https://{}", self.addr)
    }

    pub fn token(&self) -> &str {
        &self.token
    }

    pub fn ca_pem(&self) -> &str {
        &self.pki.ca_pem
    }

    /// A kubeconfig for this server (server URL with the plain IP, inline
    /// CA and token), for clients such as kube-rs.
    pub fn kubeconfig_yaml(&self) -> String {
        use base64::Engine;
        format!(
            "apiVersion: v1
kind: Config
clusters:
- name: testkit
  cluster:
    server: {}
    certificate-authority-data: {}
users:
- name: testkit
  user:
    token: {}
contexts:
- name: testkit
  context:
    cluster: testkit
    user: testkit
current-context: testkit
",
            self.url(),
            base64::engine::general_purpose::STANDARD.encode(self.pki.ca_pem.as_bytes()),
            self.token
        )
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
        *lock(&self.state.gone_style) = style;
    }

    /// How long an idle watch waits before a BOOKMARK (default 200 ms).
    pub fn set_bookmark_interval(&self, d: Duration) {
        *lock(&self.state.bookmark_interval) = d;
    }

    /// Ends every watch cleanly after at most `d`, as kube-apiserver ends
    /// them at their `timeoutSeconds` (which clients set to minutes).
    pub fn set_max_watch(&self, d: Duration) {
        *lock(&self.state.max_watch) = Some(d);
    }

    /// The next `n` requests get `status` (e.g. 500, 503, 429).
    pub fn fail_next(&self, n: usize, status: u16) {
        lock(&self.state.fail_next).extend(std::iter::repeat_n(status, n));
    }

    /// Watch streams open now (a test that cuts streams waits for one, so
    /// that it cuts a live stream rather than racing its start).
    pub fn open_watches(&self) -> usize {
        self.state.open_watches.load(Ordering::SeqCst)
    }

    /// Every request so far.
    pub fn requests(&self) -> Vec<RequestRecord> {
        lock(&self.state.requests).clone()
    }

    /// Pod deletions carried out so far.
    pub fn deletions(&self) -> Vec<Deletion> {
        lock(&self.state.cluster).deletions.clone()
    }

    /// Events POSTed so far, as stored.
    pub fn events(&self) -> Vec<Value> {
        lock(&self.state.cluster).events.clone()
    }

    /// Node PATCHes so far: (node, content type, patch body).
    pub fn node_patches(&self) -> Vec<(String, String, Value)> {
        lock(&self.state.cluster).node_patches.clone()
    }

    /// Stops listening; open connections end. Idempotent.
    pub fn stop(&mut self) {
        if self.state.stopped.swap(true, Ordering::SeqCst) {
            return;
        }
        self.state.changed.notify_all();
        if TcpStream::connect(self.addr).is_ok()
            && let Some(h) = self.accept.take()
        {
            let _ = h.join();
        }
    }
}

impl Drop for WatchApiServer {
    fn drop(&mut self) {
        self.stop();
    }
}

fn accept_loop(listener: TcpListener, state: Arc<State>, tls: Arc<ServerConfig>, token: String) {
    crate::http::accept_until(listener, &state.stopped, |tcp| {
        let (state, tls, token) = (state.clone(), tls.clone(), token.clone());
        std::thread::spawn(move || {
            let _ = serve_connection(tcp, &state, tls, &token);
        });
    });
}

enum Answer {
    Json(u16, Value),
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

fn serve_connection(
    tcp: TcpStream,
    state: &State,
    tls: Arc<ServerConfig>,
    token: &str,
) -> std::io::Result<()> {
    let mut stream = crate::http::accept_tls(tcp, tls)?;
    loop {
        if state.stopped.load(Ordering::SeqCst) {
            return Ok(());
        }
        let Some(req) = read_request(&mut stream)? else {
            return Ok(());
        };
        let at = Instant::now();
        let answer = answer(state, &req, token);
        let status = match &answer {
            Answer::Json(s, _) => *s,
            Answer::Watch(_) => 200,
        };
        lock(&state.requests).push(RequestRecord {
            method: req.method.clone(),
            path: req.path.clone(),
            query: req.query.clone(),
            status,
            at,
        });
        match answer {
            Answer::Json(status, body) => write_json(stream.get_mut(), status, &body)?,
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
    let started = Instant::now();
    let deadline = started + req.timeout;
    w.write_all(
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n",
    )?;
    w.flush()?;
    let mut cursor = req.from_rv;
    let mut last_sent = Instant::now();
    let bookmark_every = *lock(&state.bookmark_interval);
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

fn answer(state: &State, req: &Request, token: &str) -> Answer {
    if let Some(code) = lock(&state.fail_next).pop_front() {
        return Answer::Json(code, status_json(code, "injected failure"));
    }
    if req.authorization.as_deref() != Some(&format!("Bearer {token}")) {
        return Answer::Json(401, status_json(401, "Unauthorized"));
    }
    let segs: Vec<&str> = req.path.trim_matches('/').split('/').collect();
    match (req.method.as_str(), segs.as_slice()) {
        ("GET", ["api", "v1", "pods"]) => list_or_watch(state, req, "pods", None),
        ("GET", ["api", "v1", "namespaces", ns, "pods"]) => {
            list_or_watch(state, req, "pods", Some(ns.to_string()))
        }
        ("GET", ["api", "v1", "namespaces"]) => list_or_watch(state, req, "namespaces", None),
        ("GET", ["api", "v1", "namespaces", ns, "services"]) => {
            list_or_watch(state, req, "services", Some(ns.to_string()))
        }
        ("GET", ["api", "v1", "namespaces", name]) => {
            other(state, ("namespaces", String::new(), name.to_string()))
        }
        ("GET", ["api", "v1", "namespaces", ns, "services", name]) => {
            other(state, ("services", ns.to_string(), name.to_string()))
        }
        ("GET", ["api", "v1", "namespaces", ns, "pods", name]) => {
            match lock(&state.cluster).pod(ns, name) {
                Some(p) => Answer::Json(200, p),
                None => not_found("pods", name),
            }
        }
        ("DELETE", ["api", "v1", "namespaces", ns, "pods", name]) => {
            delete_pod(state, ns, name, &req.body)
        }
        ("POST", ["apis", "events.k8s.io", "v1", "namespaces", ns, "events"]) => {
            post_event(state, ns, &req.body)
        }
        ("GET", ["api", "v1", "nodes", name]) => match lock(&state.cluster).node(name) {
            Some(n) => Answer::Json(200, n),
            None => not_found("nodes", name),
        },
        ("PATCH", ["api", "v1", "nodes", name]) => {
            patch_node(state, name, &req.content_type, &req.body)
        }
        _ => Answer::Json(
            404,
            status_json(404, &format!("{} {} is not served", req.method, req.path)),
        ),
    }
}

/// A namespace's or service's key in [`Cluster`]: (resource, namespace,
/// name), a namespace's own namespace being "".
fn object_key(resource: &'static str, obj: &Value) -> (&'static str, String, String) {
    let ns = if resource == "namespaces" {
        String::new()
    } else {
        str_at(obj, &["metadata", "namespace"]).to_string()
    };
    (resource, ns, str_at(obj, &["metadata", "name"]).to_string())
}

fn other(state: &State, key: (&'static str, String, String)) -> Answer {
    let c = lock(&state.cluster);
    match c.others.get(&key).or_else(|| c.unwatched.get(&key)) {
        Some(o) => Answer::Json(200, o.clone()),
        None => not_found(key.0, &key.2),
    }
}

fn list_or_watch(
    state: &State,
    req: &Request,
    resource: &'static str,
    namespace: Option<String>,
) -> Answer {
    let param = |k: &str| param(req, k);
    let selector = match Selector::parse(
        param("labelSelector").unwrap_or(""),
        param("fieldSelector").unwrap_or(""),
    ) {
        Ok(s) => s,
        Err(e) => return Answer::Json(400, status_json(400, &e)),
    };
    if matches!(param("watch"), Some("true" | "1")) {
        let rv = param("resourceVersion").unwrap_or("");
        let from_rv = match rv {
            // "Any": from now, as kube-apiserver starts from its cache.
            "" | "0" => lock(&state.cluster).rv,
            v => match v.parse::<u64>() {
                Ok(v) => v,
                Err(_) => {
                    return Answer::Json(400, status_json(400, "invalid resourceVersion"));
                }
            },
        };
        if from_rv < lock(&state.cluster).oldest_rv && *lock(&state.gone_style) == GoneStyle::Http {
            return Answer::Json(410, status_json(410, "too old resource version"));
        }
        let mut timeout = param("timeoutSeconds")
            .and_then(|t| t.parse().ok())
            .map_or(Duration::from_secs(300), Duration::from_secs);
        if let Some(max) = *lock(&state.max_watch) {
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
    let items: Vec<Value> = match resource {
        "pods" => c.pods.values().collect::<Vec<_>>(),
        _ => c
            .others
            .iter()
            .filter(|((r, _, _), _)| *r == resource)
            .map(|(_, o)| o)
            .collect(),
    }
    .into_iter()
    .filter(|p| in_namespace(p, &namespace) && selector.matches(p))
    .cloned()
    .collect();
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
        return not_found("pods", name);
    };
    let uid = str_at(&pod, &["metadata", "uid"]).to_string();
    if let Some(want) = opts.pointer("/preconditions/uid").and_then(Value::as_str)
        && want != uid
    {
        let msg =
            format!("Precondition failed: UID in precondition: {want}, UID in object meta: {uid}");
        return Answer::Json(409, status_json(409, &msg));
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
        return Answer::Json(400, status_json(400, "the body is not JSON"));
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

fn patch_node(state: &State, name: &str, content_type: &str, body: &[u8]) -> Answer {
    let Ok(patch) = serde_json::from_slice::<Value>(body) else {
        return Answer::Json(400, status_json(400, "the patch is not JSON"));
    };
    let mut c = lock(&state.cluster);
    let Some(mut node) = c.node(name) else {
        return not_found("nodes", name);
    };
    let kind = content_type.split(';').next().unwrap_or("").trim();
    let result = match kind {
        "application/merge-patch+json" | "application/strategic-merge-patch+json" => {
            merge_patch(&mut node, &patch);
            Ok(())
        }
        "application/json-patch+json" => json_patch(&mut node, &patch),
        other => Err((415, format!("unsupported patch type {other:?}"))),
    };
    c.node_patches.push((name.into(), kind.into(), patch));
    match result {
        Ok(()) => {
            c.put_node(node);
            let node = c.node(name).unwrap_or(Value::Null);
            drop(c);
            state.changed.notify_all();
            Answer::Json(200, node)
        }
        Err((code, msg)) => Answer::Json(code, status_json(code, &msg)),
    }
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
pub(crate) fn json_patch(target: &mut Value, patch: &Value) -> Result<(), (u16, String)> {
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

fn param<'a>(req: &'a Request, key: &str) -> Option<&'a str> {
    req.query
        .iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
}

fn not_found(kind: &str, name: &str) -> Answer {
    Answer::Json(
        404,
        status_json(404, &format!("{kind} \"{name}\" not found")),
    )
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
    use std::io::{BufRead, BufReader, Read};

    /// A minimal HTTPS client: one request, the raw answer as lines.
    struct Client {
        stream: BufReader<rustls::StreamOwned<rustls::ClientConnection, TcpStream>>,
    }

    impl Client {
        fn connect(api: &WatchApiServer) -> Client {
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
            api: &WatchApiServer,
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
