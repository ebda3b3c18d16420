//! Kubernetes Events on the installer's Node, for what an operator must
//! know about it without reading its log: a fight with another agent (and
//! with what), owned mode falling back to inline, the plugin's credential
//! rejected, the startup taint removed, and the uninstall decided at
//! SIGTERM (and why).
//!
//! Each kind is rate-limited on its own: at most one Event per
//! [`INTERVAL`]; occurrences in between are counted and the next Event says
//! how many were not reported. Events are sent by a thread of their own
//! through a small queue, so an API server that is slow or down never
//! delays a pass; the uninstall's Event is sent at once, within
//! [`API_TIMEOUT`], since the process exits right after.
//! With the installer's own credential (its service-account token, as the
//! taint removal uses); a failure is logged and that Event is lost.
//!
//! Events are `events.k8s.io/v1`, about the Node, in the `default`
//! namespace (where `kubectl describe node` finds them). Each is a new
//! Event, never a patch of an earlier series (as kube-rs's `Recorder`
//! would make): `create` is the only right needed. The repair controller's
//! Events about pods are built the same way ([`Notice::about`]).

use std::collections::HashMap;
use std::sync::mpsc::{self, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;

use crate::notes::Throttle;

/// At most one Event of a kind per this long.
pub const INTERVAL: Duration = Duration::from_secs(600);
/// The most one Event's API call may take.
pub const API_TIMEOUT: Duration = Duration::from_secs(5);
/// Events waiting for the sender; more are dropped (and logged).
const QUEUE: usize = 8;

/// What an Event reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    Fight,
    OwnedFallback,
    CredentialRejected,
    TaintRemoved,
    Uninstall,
}

impl Kind {
    /// What the Event of this kind says: why (its reason), what was done
    /// (its action), and `note`.
    fn notice(self, note: String) -> Notice {
        let (reason, action) = match self {
            Kind::Fight => ("LinkerdCNIChainFight", "LimitRepairs"),
            Kind::OwnedFallback => ("LinkerdCNIOwnedModeFallback", "UseInlineMode"),
            Kind::CredentialRejected => ("LinkerdCNICredentialRejected", "PassThroughPods"),
            Kind::TaintRemoved => ("LinkerdCNIStartupTaintRemoved", "RemoveTaint"),
            Kind::Uninstall => ("LinkerdCNIUninstall", "Uninstall"),
        };
        Notice {
            reason,
            action,
            warning: !matches!(self, Kind::TaintRemoved | Kind::Uninstall),
            note,
        }
    }
}

/// The namespace of Events about cluster-scoped objects such as Nodes.
const NODE_EVENTS_NAMESPACE: &str = "default";
/// `reportingController` of every Event the installer creates.
const REPORTER: &str = "linkerd.io/linkerd-cni-installer";
/// `reportingInstance` when the installer's pod name is not known.
const REPORTER_POD: &str = "linkerd-cni-installer";
/// The API limits an Event's note to 1 kB.
const MAX_NOTE: usize = 1024;

/// What an Event says: the installer's about its Node, and the repair
/// controller's about pods.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Notice {
    /// Why, in CamelCase: what alerts match on.
    pub reason: &'static str,
    /// What was done about it, in CamelCase.
    pub action: &'static str,
    /// `Warning` rather than `Normal`.
    pub warning: bool,
    /// For a person: what happened and what to do (cut to [`MAX_NOTE`]).
    pub note: String,
}

impl Notice {
    /// The Event about `node`, reported by `instance` (the installer's
    /// pod) at `now`.
    fn to_event(&self, node: &str, instance: &str, now: Timestamp) -> Event {
        let node = ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Node".into()),
            name: Some(node.into()),
            ..ObjectReference::default()
        };
        let namespace = Some(NODE_EVENTS_NAMESPACE.into());
        self.about(node, namespace, REPORTER, instance, now)
    }

    /// The `events.k8s.io/v1` Event saying this about `regarding`, in
    /// `namespace`, reported by `instance` of `controller` at `now`, named
    /// after `regarding` and `now`.
    pub fn about(
        &self,
        regarding: ObjectReference,
        namespace: Option<String>,
        controller: &str,
        instance: &str,
        now: Timestamp,
    ) -> Event {
        let mut note = self.note.clone();
        if note.len() > MAX_NOTE {
            note.truncate(note.floor_char_boundary(MAX_NOTE - 3));
            note.push_str("...");
        }
        let name = regarding.name.as_deref().unwrap_or_default();
        Event {
            metadata: ObjectMeta {
                name: Some(format!("{name}.{:x}", now.as_nanosecond())),
                namespace,
                ..ObjectMeta::default()
            },
            event_time: Some(MicroTime(now)),
            reporting_controller: Some(controller.into()),
            reporting_instance: Some(instance.into()),
            action: Some(self.action.into()),
            reason: Some(self.reason.into()),
            type_: Some(if self.warning { "Warning" } else { "Normal" }.into()),
            note: Some(note),
            regarding: Some(regarding),
            ..Event::default()
        }
    }
}

/// Where Events go (created one by one): the API server, or a test's list.
pub type Sink = Arc<dyn Fn(&Notice) -> Result<(), String> + Send + Sync>;

/// The API server, with the installer's own credential (its
/// service-account token, read at each Event: the kubelet rotates it),
/// about `cfg`'s node, reported by its pod.
pub fn api_sink(cfg: crate::config::Config) -> Sink {
    Arc::new(move |event| {
        let config = crate::kubeconfig::own_api(&cfg)?;
        let node = cfg.node_name.as_deref().unwrap_or_default();
        let instance = cfg.pod_name.as_deref().unwrap_or(REPORTER_POD);
        let body = serde_json::to_value(event.to_event(node, instance, Timestamp::now()))
            .map_err(|e| e.to_string())?;
        let path = format!("/apis/events.k8s.io/v1/namespaces/{NODE_EVENTS_NAMESPACE}/events");
        // An Event whose answer was lost may be created twice: harmless.
        crate::api::blocking(config, API_TIMEOUT, async |api| {
            api.create::<serde_json::Value>(&path, &body).await
        })
        .and_then(|r| r)
        .map(drop)
        .map_err(|e| e.to_string())
    })
}

/// The installer's Events.
pub struct Events {
    sink: Sink,
    /// Per kind.
    limiter: Mutex<HashMap<Kind, Throttle>>,
    queue: SyncSender<Notice>,
}

impl Events {
    pub fn new(sink: Sink) -> Events {
        let (queue, rx) = mpsc::sync_channel::<Notice>(QUEUE);
        let to = sink.clone();
        let spawned = std::thread::Builder::new()
            .name("events".into())
            .spawn(move || rx.iter().for_each(|e| send(&to, &e)));
        if let Err(e) = spawned {
            tracing::warn!("cannot start the thread that sends Events: {e}");
        }
        Events {
            sink,
            limiter: Mutex::default(),
            queue,
        }
    }

    /// The Event for `kind`, unless one was sent within [`INTERVAL`].
    fn admitted(&self, kind: Kind, note: String) -> Option<Notice> {
        let skipped = crate::metrics::lock(&self.limiter)
            .entry(kind)
            .or_insert_with(|| Throttle::new(INTERVAL))
            .allow(Instant::now())?;
        let note = match skipped {
            0 => note,
            n => format!(
                "{note} ({n} more like this since the last such Event, not reported: at most one per {} min)",
                INTERVAL.as_secs() / 60
            ),
        };
        Some(kind.notice(note))
    }

    /// Queues the Event for `kind` (rate-limited); never waits.
    pub fn emit(&self, kind: Kind, note: String) {
        let Some(event) = self.admitted(kind, note) else {
            return;
        };
        if let Err(TrySendError::Full(e) | TrySendError::Disconnected(e)) =
            self.queue.try_send(event)
        {
            tracing::warn!("Event {} not sent: the queue is full", e.reason)
        }
    }

    /// Sends the Event for `kind` (rate-limited) now, within
    /// [`API_TIMEOUT`]: for the last thing the process does.
    pub fn emit_now(&self, kind: Kind, note: String) {
        if let Some(event) = self.admitted(kind, note) {
            send(&self.sink, &event);
        }
    }
}

fn send(sink: &Sink, e: &Notice) {
    match sink(e) {
        Ok(()) => tracing::debug!("Event {} created", e.reason),
        Err(err) => tracing::warn!("cannot create Event {} on this node: {err}", e.reason),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What [`Events`] admits: one throttle per kind.
    #[derive(Default)]
    struct Limiter(HashMap<Kind, Throttle>);
    impl Limiter {
        fn admit(&mut self, kind: Kind, now: Instant) -> Option<u64> {
            let t = self.0.entry(kind);
            t.or_insert_with(|| Throttle::new(INTERVAL)).allow(now)
        }
    }

    #[test]
    fn one_event_per_kind_per_interval_and_the_skipped_ones_said() {
        let mut l = Limiter::default();
        let t0 = Instant::now();
        assert_eq!(l.admit(Kind::Fight, t0), Some(0));
        assert_eq!(l.admit(Kind::Fight, t0 + Duration::from_secs(1)), None);
        assert_eq!(
            l.admit(Kind::Fight, t0 + INTERVAL - Duration::from_millis(1)),
            None
        );
        // Another kind has its own limit.
        assert_eq!(l.admit(Kind::TaintRemoved, t0), Some(0));
        assert_eq!(l.admit(Kind::Fight, t0 + INTERVAL), Some(2));
        assert_eq!(l.admit(Kind::Fight, t0 + INTERVAL * 2), Some(0));
    }

    #[test]
    fn shape_of_a_node_event() {
        let e = Notice {
            reason: "ChainFight",
            action: "RepairLimited",
            warning: true,
            note: "é".repeat(600),
        };
        let at = Timestamp::new(1_764_581_400, 123_456_789).unwrap();
        let v = serde_json::to_value(e.to_event("worker-1", "linkerd-cni-x1", at)).unwrap();
        assert_eq!(v["eventTime"], "2025-12-01T09:30:00.123456Z");
        assert_eq!(
            v["regarding"],
            serde_json::json!({"apiVersion": "v1", "kind": "Node", "name": "worker-1"})
        );
        assert_eq!(v["apiVersion"], "events.k8s.io/v1");
        assert_eq!(v["kind"], "Event");
        assert_eq!(v["metadata"]["namespace"], "default");
        assert!(
            v["metadata"]["name"]
                .as_str()
                .unwrap()
                .starts_with("worker-1.")
        );
        assert_eq!(v["type"], "Warning");
        assert_eq!(v["reportingController"], REPORTER);
        assert_eq!(v["reportingInstance"], "linkerd-cni-x1");
        let note = v["note"].as_str().unwrap();
        assert!(
            note.len() <= MAX_NOTE && note.ends_with("..."),
            "{}",
            note.len()
        );
    }

    #[test]
    fn emit_now_sends_once_within_the_interval() {
        let list = Arc::new(Mutex::new(Vec::<Notice>::new()));
        let to = list.clone();
        let events = Events::new(Arc::new(move |e: &Notice| {
            to.lock().unwrap().push(e.clone());
            Ok(())
        }));
        events.emit_now(Kind::Uninstall, "the DaemonSet is gone".into());
        events.emit_now(Kind::Uninstall, "again".into());
        let sent = list.lock().unwrap().clone();
        assert_eq!(sent.len(), 1);
        assert_eq!(sent[0].reason, "LinkerdCNIUninstall");
        assert_eq!(sent[0].note, "the DaemonSet is gone");
        assert!(!sent[0].warning);
    }
}
