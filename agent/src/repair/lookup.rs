//! The plugin's pod lookups, answered from memory.
//!
//! Three reflectors keep what the plugin's decision reads: this node's pods
//! (field selector `spec.nodeName`), the cluster's namespaces (their
//! `config.linkerd.io/` annotations only) and Service `default/kubernetes`.
//! Objects are stripped to those fields before they are stored, so that a
//! node with a hundred pods and a cluster with ten thousand namespaces cost
//! little memory.
//!
//! A question names a pod the watch usually has already (the kubelet runs
//! the sandbox after the scheduler's binding, which the watch sees first).
//! One it has not seen yet is waited for briefly, then fetched with a GET;
//! a pod of the same name but another uid than the runtime's `K8S_POD_UID`
//! is not the one asked for. Whatever the agent cannot find out within the
//! plugin's budget is answered `unavailable`, and the plugin asks the API
//! server itself. See `linkerd_cni_lookup` for the protocol.

use std::collections::BTreeMap;
use std::io;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use k8s_openapi::api::core::v1::{Container, Namespace, Pod, PodSpec, Service, ServiceSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::watcher;
use kube::{Api, Client, Resource, ResourceExt};
use linkerd_cni_lookup::{Answer, Body, CONTROL_PLANE_LABEL, MAX_REQUEST, Request, Source};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::Notify;
use tokio::time::{Instant, timeout};

use crate::repair::controller::watch;
use crate::repair::metrics::Metrics;

/// The annotations the plugin reads on a namespace all carry this prefix.
const NAMESPACE_ANNOTATIONS: &str = "config.linkerd.io/";
/// How long a question may wait for the watch before the pod is fetched:
/// long enough for the watch event that usually trails the kubelet's call
/// by milliseconds, short against the plugin's budget.
const WATCH_WAIT: Duration = Duration::from_millis(500);
/// The agent answers this much before the plugin stops waiting, so that
/// an `unavailable` reaches it rather than a timeout.
const ANSWER_MARGIN: Duration = Duration::from_millis(100);
/// A client has this long to send its question.
const READ_TIMEOUT: Duration = Duration::from_secs(1);
/// At most this many questions are answered at once; more wait in the
/// socket's backlog (and a plugin that finds it full asks the API).
const MAX_CONCURRENT: usize = 64;

/// The stores the answers come from, and what wakes a waiting question.
pub struct Facts {
    client: Client,
    pods: Store<Pod>,
    namespaces: Store<Namespace>,
    service: Store<Service>,
    changed: Arc<Notify>,
    metrics: Metrics,
    api_timeout: Duration,
}

impl Facts {
    /// Starts the three reflectors on the current runtime.
    pub fn start(
        client: Client,
        node_name: &str,
        metrics: Metrics,
        api_timeout: Duration,
    ) -> Arc<Facts> {
        let changed = Arc::new(Notify::new());
        let pods = reflect(
            Api::<Pod>::all(client.clone()),
            watcher::Config::default().fields(&format!("spec.nodeName={node_name}")),
            strip_pod,
            changed.clone(),
            "this node's pods",
        );
        let namespaces = reflect(
            Api::<Namespace>::all(client.clone()),
            watcher::Config::default(),
            strip_namespace,
            changed.clone(),
            "namespaces",
        );
        let service = reflect(
            Api::<Service>::namespaced(client.clone(), "default"),
            watcher::Config::default().fields("metadata.name=kubernetes"),
            strip_service,
            changed.clone(),
            "Service default/kubernetes",
        );
        Arc::new(Facts {
            client,
            pods,
            namespaces,
            service,
            changed,
            metrics,
            api_timeout,
        })
    }

    /// The answer to `req`, within its budget.
    pub async fn answer(&self, req: &Request) -> Body {
        let budget = Duration::from_millis(req.budget_ms).saturating_sub(ANSWER_MARGIN);
        let deadline = Instant::now() + budget;
        let key = ObjectRef::<Pod>::new(&req.name).within(&req.namespace);
        let (pod, source) = match self.pod(req, &key, deadline).await {
            Ok(found) => found,
            Err(body) => return body,
        };
        let namespace = match self.namespace(&req.namespace, deadline).await {
            Ok(ns) => ns,
            Err(message) => return Body::Unavailable { message },
        };
        let service = self.service(&pod, deadline).await;
        match serde_json::to_value(&*pod).ok() {
            Some(pod) => Body::Pod {
                pod,
                namespace: serde_json::to_value(&*namespace).ok(),
                service,
                source,
            },
            None => Body::Unavailable {
                message: "cannot encode the pod".into(),
            },
        }
    }

    async fn pod(
        &self,
        req: &Request,
        key: &ObjectRef<Pod>,
        deadline: Instant,
    ) -> Result<(Arc<Pod>, Source), Body> {
        let wanted = |p: &Pod| req.uid.is_none() || p.metadata.uid == req.uid;
        let wait_until = deadline.min(Instant::now() + WATCH_WAIT);
        let mut source = Source::Watch;
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if let Some(p) = self.pods.get(key).filter(|p| wanted(p)) {
                return Ok((p, source));
            }
            source = Source::Waited;
            tokio::select! {
                () = changed => {}
                () = tokio::time::sleep_until(wait_until) => break,
            }
        }
        let api = Api::<Pod>::namespaced(self.client.clone(), &req.namespace);
        match self.within(deadline, api.get_opt(&req.name)).await {
            Err(why) => Err(Body::Unavailable {
                message: format!(
                    "pod {}/{}: not seen by the watch, and its GET {why}",
                    req.namespace, req.name
                ),
            }),
            Ok(None) => Err(Body::NotFound {
                message: format!("pod {}/{} does not exist", req.namespace, req.name),
            }),
            Ok(Some(p)) if !wanted(&p) => Err(Body::NotFound {
                message: format!(
                    "pod {}/{} has uid {}, not {} (K8S_POD_UID): the pod asked for is gone",
                    req.namespace,
                    req.name,
                    p.metadata.uid.as_deref().unwrap_or("-"),
                    req.uid.as_deref().unwrap_or("-")
                ),
            }),
            Ok(Some(mut p)) => {
                strip_pod(&mut p);
                Ok((Arc::new(p), Source::Fetched))
            }
        }
    }

    /// `get`, a GET, within what is left before `deadline` (and the API
    /// timeout): Err says how it failed.
    async fn within<T>(
        &self,
        deadline: Instant,
        get: impl Future<Output = kube::Result<T>>,
    ) -> Result<T, String> {
        let left = deadline.saturating_duration_since(Instant::now());
        match timeout(left.min(self.api_timeout), get).await {
            Ok(answer) => answer.map_err(|e| format!("failed: {e}")),
            Err(_) => Err("did not answer in time".into()),
        }
    }

    /// Service `default/kubernetes`, for a control-plane pod: from the
    /// watch, else fetched, as the plugin's direct path would; `None` when
    /// it cannot be had (the plugin then skips upstream's fallback ports).
    async fn service(&self, pod: &Pod, deadline: Instant) -> Option<serde_json::Value> {
        if let Some(s) = self
            .service
            .get(&ObjectRef::new("kubernetes").within("default"))
        {
            return serde_json::to_value(&*s).ok();
        }
        let control_plane = pod
            .labels()
            .get(CONTROL_PLANE_LABEL)
            .is_some_and(|v| !v.is_empty());
        if !control_plane {
            return None;
        }
        let api = Api::<Service>::namespaced(self.client.clone(), "default");
        match self.within(deadline, api.get("kubernetes")).await {
            Ok(mut svc) => {
                strip_service(&mut svc);
                serde_json::to_value(&svc).ok()
            }
            Err(why) => {
                tracing::info!(
                    "cannot get Service default/kubernetes for a control-plane pod's lookup: its GET {why}"
                );
                None
            }
        }
    }

    async fn namespace(&self, name: &str, deadline: Instant) -> Result<Arc<Namespace>, String> {
        if let Some(ns) = self.namespaces.get(&ObjectRef::new(name)) {
            return Ok(ns);
        }
        let api = Api::<Namespace>::all(self.client.clone());
        let mut ns = self
            .within(deadline, api.get(name))
            .await
            .map_err(|why| format!("namespace {name}: not seen by the watch, and its GET {why}"))?;
        strip_namespace(&mut ns);
        Ok(Arc::new(ns))
    }
}

/// A store kept by a watch of `api` (see [`watch`]), each change waking the
/// questions that wait.
fn reflect<K>(
    api: Api<K>,
    config: watcher::Config,
    strip: fn(&mut K),
    changed: Arc<Notify>,
    what: &'static str,
) -> Store<K>
where
    K: Resource<DynamicType = ()> + Clone + std::fmt::Debug + Send + Sync + 'static,
    K: serde::de::DeserializeOwned,
{
    let (reader, mut writer) = reflector::store();
    tokio::spawn(async move {
        let mut events = std::pin::pin!(watch(api, config, what));
        while let Some(ev) = events.next().await {
            writer.apply_watcher_event(&ev.modify(strip));
            changed.notify_waiters();
        }
    });
    reader
}

/// The pod as the plugin reads it: names, labels, annotations, the names
/// of its containers and init containers.
fn strip_pod(pod: &mut Pod) {
    let names = |cs: Vec<Container>| -> Vec<Container> {
        cs.into_iter()
            .map(|c| Container {
                name: c.name,
                ..Container::default()
            })
            .collect()
    };
    let (meta, spec) = (std::mem::take(&mut pod.metadata), pod.spec.take());
    let spec = spec.unwrap_or_default();
    *pod = Pod {
        metadata: ObjectMeta {
            name: meta.name,
            namespace: meta.namespace,
            uid: meta.uid,
            labels: meta.labels,
            annotations: meta.annotations,
            resource_version: meta.resource_version,
            ..ObjectMeta::default()
        },
        spec: Some(PodSpec {
            containers: names(spec.containers),
            init_containers: spec.init_containers.map(names),
            ..PodSpec::default()
        }),
        status: None,
    };
}

fn strip_namespace(ns: &mut Namespace) {
    let annotations: Option<BTreeMap<String, String>> = ns.metadata.annotations.take().map(|a| {
        a.into_iter()
            .filter(|(k, _)| k.starts_with(NAMESPACE_ANNOTATIONS))
            .collect()
    });
    *ns = Namespace {
        metadata: ObjectMeta {
            name: ns.metadata.name.take(),
            resource_version: ns.metadata.resource_version.take(),
            annotations,
            ..ObjectMeta::default()
        },
        ..Namespace::default()
    };
}

fn strip_service(svc: &mut Service) {
    let ports = svc.spec.take().and_then(|s| s.ports);
    *svc = Service {
        metadata: ObjectMeta {
            name: svc.metadata.name.take(),
            namespace: svc.metadata.namespace.take(),
            resource_version: svc.metadata.resource_version.take(),
            ..ObjectMeta::default()
        },
        spec: Some(ServiceSpec {
            ports,
            ..ServiceSpec::default()
        }),
        status: None,
    };
}

/// Binds the socket `name` in `state_dir`, root's alone (mode 0600) from the
/// moment it can be connected to: bound under a temporary name, its mode
/// set, then renamed over the socket path (which also replaces an earlier
/// agent's). Refuses to replace anything at that path that is not a
/// socket.
pub fn bind(state_dir: &Path, name: &str) -> io::Result<(UnixListener, SocketGuard)> {
    let path = state_dir.join(name);
    match std::fs::symlink_metadata(&path) {
        Ok(m) if !m.file_type().is_socket() => {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                format!(
                    "{} exists and is not a socket; remove it to let the agent listen there",
                    path.display()
                ),
            ));
        }
        _ => {}
    }
    let tmp = state_dir.join(format!(".{name}.{}", std::process::id()));
    let _ = std::fs::remove_file(&tmp);
    let listener = UnixListener::bind(&tmp)?;
    let placed = std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o600))
        .and_then(|()| std::fs::rename(&tmp, &path));
    if let Err(e) = placed {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    let ino = std::fs::symlink_metadata(&path)?.ino();
    Ok((listener, SocketGuard { path, ino }))
}

/// Removes the socket when dropped, unless another agent's has replaced it
/// (a rolling update with `maxSurge` starts the new pod first): a stale
/// socket only costs the plugin a refused connection, a removed live one
/// every lookup.
pub struct SocketGuard {
    path: PathBuf,
    ino: u64,
}

impl SocketGuard {
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for SocketGuard {
    fn drop(&mut self) {
        if std::fs::symlink_metadata(&self.path).is_ok_and(|m| m.ino() == self.ino) {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// Answers questions on `listener` until the task is dropped.
pub async fn serve(listener: UnixListener, facts: Arc<Facts>) {
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONCURRENT));
    loop {
        let Ok(permit) = slots.clone().acquire_owned().await else {
            return;
        };
        let stream = match listener.accept().await {
            Ok((s, _)) => s,
            Err(e) => {
                tracing::warn!(error = %e, "cannot accept a lookup connection");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let facts = facts.clone();
        tokio::spawn(async move {
            one(stream, &facts).await;
            drop(permit);
        });
    }
}

/// One connection: a question from root, its answer.
async fn one(mut stream: UnixStream, facts: &Facts) {
    let started = Instant::now();
    let root = stream.peer_cred().is_ok_and(|c| c.uid() == 0);
    let request = if root {
        read_request(&mut stream).await
    } else {
        Err("the peer does not run as root".into())
    };
    let (body, result) = match request {
        Ok(req) => {
            let body = facts.answer(&req).await;
            let result = match &body {
                Body::Pod { source, .. } => match source {
                    Source::Watch => "watch",
                    Source::Waited => "waited",
                    Source::Fetched => "fetched",
                },
                Body::NotFound { .. } => "not_found",
                Body::Unavailable { message } => {
                    tracing::info!(%message, "pod lookup answered unavailable; the plugin asks the API server");
                    "unavailable"
                }
            };
            (body, result)
        }
        Err(message) => {
            tracing::debug!(%message, "lookup refused");
            (Body::Unavailable { message }, "refused")
        }
    };
    let metrics = &facts.metrics;
    let result = vec![("result".to_string(), result.to_string())];
    metrics.pod_lookups.get_or_create(&result).inc();
    let _ = timeout(READ_TIMEOUT, stream.write_all(&Answer::new(body).encode())).await;
    metrics
        .pod_lookup_seconds
        .observe(started.elapsed().as_secs_f64());
}

async fn read_request(stream: &mut UnixStream) -> Result<Request, String> {
    let mut line = Vec::new();
    let mut reader = BufReader::new(stream).take(MAX_REQUEST as u64 + 1);
    match timeout(READ_TIMEOUT, reader.read_until(b'\n', &mut line)).await {
        Err(_) => return Err("no question within the read timeout".into()),
        Ok(Err(e)) => return Err(format!("cannot read the question: {e}")),
        Ok(Ok(_)) => {}
    }
    if line.last() != Some(&b'\n') {
        return Err(format!("no question line of at most {MAX_REQUEST} bytes"));
    }
    line.pop();
    Request::decode(&line).map_err(|e| e.to_string())
}
