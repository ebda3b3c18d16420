//! The watch of this node's meshed pods and the repair loop.
//!
//! One task does everything, in order: it applies watch events to the set
//! of pods waiting for a repair, and when one is due (its backoff elapsed)
//! and the node's chain allows it, deletes it and publishes an Event. A pod
//! that a deletion would not repair is never deleted: one without a
//! controller owner reference (nothing would create it again) or a static
//! pod's mirror pod (the kubelet creates the mirror again and restarts
//! nothing). It is reported once instead, with a Warning Event, a metric
//! and a log line telling the operator what to do. Pods
//! are kept in a set keyed by namespace and name, not in a queue: a pod
//! that fails again and again is one entry, and a burst of watch events
//! cannot crowd out other pods.
//!
//! The watch is kube-runtime's `watcher`, kept going by [`watch`] (the
//! plugin's lookups watch through it too): after an error, a timeout or a
//! dropped stream it resumes from the last resource version it saw
//! (bookmarks included), and after `410 Gone` it lists again. A re-list
//! replaces the whole set at its end, so pods deleted while the watch was
//! down are forgotten and pods that failed meanwhile are found.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures_util::{Stream, StreamExt};
use k8s_openapi::api::core::v1::{ObjectReference, Pod};
use k8s_openapi::api::events::v1::Event as K8sEvent;
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, PostParams, Preconditions};
use kube::runtime::watcher;
use kube::{Api, Client, Resource, ResourceExt};
use tokio::time::Instant;

use crate::events::Notice;
use crate::repair::args::Args;
use crate::repair::backoff::{Backoff, Policy, Retry};
use crate::repair::chain_gate::{self, Verdict};
use crate::repair::metrics::Metrics;
use crate::repair::pod::{DATA_PLANE_LABEL, Remedy, needs_repair, remedy};

/// `reportingController` of the Events, as upstream's controller names it.
pub const REPORTER: &str = "linkerd-cni-repair-controller";
/// Event reason, as upstream's.
pub const EVENT_REASON: &str = "LinkerdCNINotConfigured";
/// Event action, as upstream's.
pub const EVENT_ACTION: &str = "Deleting";
/// Event action for a pod left in place: nothing would create it again.
pub const EVENT_ACTION_UNOWNED: &str = "NotDeleting";

/// At most this many pods wait for a repair; more are dropped and counted
/// in `queue_overflow` (a node runs a few hundred pods at most; a pod
/// dropped here comes back with its next restart of the validator).
pub const MAX_PENDING: usize = 4096;

/// How long a deleted pod's UID is remembered, so that a stale watch event
/// of the deleted pod does not cause a second deletion.
const DELETED_MEMORY: Duration = Duration::from_secs(600);

type Key = (String, String);

#[derive(Debug, Clone)]
struct Candidate {
    /// The pod, its UID included.
    reference: ObjectReference,
    /// Whether deleting it repairs it.
    remedy: Remedy,
}

/// A (re-)list in progress: the pods needing a repair, and the UIDs of
/// every pod listed.
#[derive(Debug, Default)]
struct Relist {
    pending: BTreeMap<Key, Candidate>,
    seen: HashSet<String>,
}

pub struct Controller {
    client: Client,
    /// Its command line (or the installer's repair variables).
    args: Args,
    metrics: Metrics,
    ready: Arc<AtomicBool>,
    pending: BTreeMap<Key, Candidate>,
    /// Filled between `Init` and `InitDone` of a (re-)list.
    relist: Option<Relist>,
    backoff: Backoff<Key>,
    deleted: HashMap<String, Instant>,
    /// UIDs of pods that a deletion would not repair and that were
    /// reported: once each, for as long as they exist.
    reported: HashSet<String>,
    /// While the chain holds repairs back: when to look again.
    chain_recheck_at: Option<Instant>,
    last_verdict: Option<Verdict>,
}

impl Controller {
    pub fn new(client: Client, args: Args, metrics: Metrics, ready: Arc<AtomicBool>) -> Self {
        let backoff = Backoff::new(Policy {
            initial: args.pod_backoff,
            max: args.pod_backoff_max.max(args.pod_backoff),
        });
        Controller {
            client,
            args,
            metrics,
            ready,
            pending: BTreeMap::new(),
            relist: None,
            backoff,
            deleted: HashMap::new(),
            reported: HashSet::new(),
            chain_recheck_at: None,
            last_verdict: None,
        }
    }

    /// Runs until `shutdown` completes.
    pub async fn run(mut self, shutdown: impl Future<Output = ()>) {
        tokio::pin!(shutdown);
        let api: Api<Pod> = Api::all(self.client.clone());
        let config = watcher::Config::default()
            .labels(DATA_PLANE_LABEL)
            .fields(&format!("spec.nodeName={}", self.args.node_name));
        let mut events = std::pin::pin!(watch(api, config, "this node's pods"));
        tracing::info!(
            node = %self.args.node_name,
            conf_dir = %self.args.cni_net_dir.display(),
            "watching this node's meshed pods"
        );
        loop {
            let far = Instant::now() + Duration::from_secs(3600);
            let wake = self.next_wake(Instant::now()).unwrap_or(far);
            tokio::select! {
                () = &mut shutdown => return,
                Some(ev) = events.next() => self.on_event(ev),
                () = tokio::time::sleep_until(wake) => self.repair_due().await,
            }
        }
    }

    fn on_event(&mut self, ev: watcher::Event<Pod>) {
        match ev {
            watcher::Event::Init => self.relist = Some(Relist::default()),
            watcher::Event::InitApply(pod) => {
                if let Some(mut list) = self.relist.take() {
                    self.classify(&mut list.pending, &pod);
                    list.seen.extend(pod.metadata.uid.clone());
                    self.relist = Some(list);
                }
            }
            watcher::Event::InitDone => {
                if let Some(list) = self.relist.take() {
                    tracing::debug!(pods = list.pending.len(), "listed this node's pods");
                    self.pending = list.pending;
                    self.reported.retain(|uid| list.seen.contains(uid));
                }
                if !self.ready.swap(true, Ordering::SeqCst) {
                    tracing::info!(waiting = self.pending.len(), "initial list done");
                }
            }
            watcher::Event::Apply(pod) => {
                let mut set = std::mem::take(&mut self.pending);
                self.classify(&mut set, &pod);
                self.pending = set;
            }
            watcher::Event::Delete(pod) => {
                self.pending.remove(&key_of(&pod));
                if let Some(uid) = &pod.metadata.uid {
                    self.reported.remove(uid);
                }
            }
        }
        self.metrics.pods_pending.set(self.pending.len() as i64);
    }

    /// Puts `pod` in `set` when it needs a repair, takes it out otherwise.
    fn classify(&self, set: &mut BTreeMap<Key, Candidate>, pod: &Pod) {
        let key = key_of(pod);
        let already_done = pod
            .metadata
            .uid
            .as_ref()
            .is_some_and(|u| self.deleted.contains_key(u) || self.reported.contains(u));
        if !needs_repair(pod, &self.args.node_name) || already_done {
            set.remove(&key);
            return;
        }
        if !set.contains_key(&key) {
            if set.len() >= MAX_PENDING {
                self.metrics.queue_overflow.inc();
                tracing::warn!(namespace = %key.0, pod = %key.1, "too many pods waiting for a repair; dropped");
                return;
            }
            // Once per pod, not again when a new list finds it still waiting.
            if !self.pending.contains_key(&key) {
                tracing::info!(namespace = %key.0, pod = %key.1, "pod started without linkerd-cni's rules (linkerd-network-validator exited 95)");
            }
        }
        set.insert(
            key,
            Candidate {
                reference: pod.object_ref(&()),
                remedy: remedy(pod),
            },
        );
    }

    /// When the next repair may happen, if any pod waits.
    fn next_wake(&self, now: Instant) -> Option<Instant> {
        let earliest = self
            .pending
            .keys()
            .map(|k| self.backoff.ready_at(k, now))
            .min()?;
        Some(match self.chain_recheck_at {
            Some(t) if t > earliest => t,
            _ => earliest,
        })
    }

    async fn repair_due(&mut self) {
        let now = Instant::now();
        let due: Vec<Key> = self
            .pending
            .keys()
            .filter(|k| self.backoff.ready_at(k, now) <= now)
            .cloned()
            .collect();
        if due.is_empty() {
            return;
        }
        if !self.chain_allows_repair().await {
            self.chain_recheck_at = Some(Instant::now() + self.args.chain_check_interval);
            return;
        }
        self.chain_recheck_at = None;
        for key in due {
            let Some(c) = self.pending.get(&key).cloned() else {
                continue;
            };
            if c.remedy != Remedy::Delete {
                self.pending.remove(&key);
                self.report_not_deleted(&key, &c).await;
                continue;
            }
            self.delete(&key, &c).await;
        }
        let now = Instant::now();
        self.backoff.prune(now);
        self.deleted
            .retain(|_, t| now.saturating_duration_since(*t) < DELETED_MEMORY);
        self.metrics.pods_pending.set(self.pending.len() as i64);
    }

    /// Judges the chain (off the async threads: it reads files) and logs
    /// when the verdict changes.
    async fn chain_allows_repair(&mut self) -> bool {
        let dir = self.args.cni_net_dir.clone();
        let verdict = tokio::task::spawn_blocking(move || chain_gate::check(&dir))
            .await
            .unwrap_or_else(|e| Verdict::Broken(format!("the chain check failed: {e}")));
        if self.last_verdict.as_ref() != Some(&verdict) {
            match &verdict {
                Verdict::Healthy if self.last_verdict.is_some() => {
                    tracing::info!(
                        waiting = self.pending.len(),
                        "chain healthy: repairing pods"
                    )
                }
                Verdict::Healthy => {}
                Verdict::Broken(why) => tracing::warn!(
                    waiting = self.pending.len(),
                    "chain broken, pods wait for it to be repaired: {why}"
                ),
                Verdict::Unchecked(why) => tracing::warn!(
                    "cannot check the chain, repairing pods without waiting for it: {why}"
                ),
            }
            self.last_verdict = Some(verdict.clone());
        }
        self.metrics
            .chain_broken
            .set(i64::from(!verdict.allows_repair()));
        verdict.allows_repair()
    }

    /// Deletes the pod and publishes its Event. A deletion that failed
    /// leaves it pending: the backoff spaces the next attempt.
    async fn delete(&mut self, key: &Key, c: &Candidate) {
        let (ns, name) = key;
        let api: Api<Pod> = Api::namespaced(self.client.clone(), ns);
        let params = DeleteParams {
            grace_period_seconds: Some(0),
            // Never the newer pod of the same name the watch has not shown
            // us yet.
            preconditions: c.reference.uid.clone().map(|uid| Preconditions {
                uid: Some(uid),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        let t0 = Instant::now();
        let outcome = tokio::time::timeout(self.args.api_timeout, api.delete(name, &params)).await;
        // From the end of the attempt: the next one then reaches the API
        // server at least one backoff after this one did.
        self.backoff.record(key, Instant::now());
        match outcome {
            Ok(Ok(_)) => {
                self.metrics.pods_deleted.inc();
                self.metrics
                    .pods_delete_latency_seconds
                    .observe(t0.elapsed().as_secs_f64());
                tracing::info!(namespace = %ns, pod = %name, "deleted pod so that it starts again with linkerd-cni's rules");
                self.pending.remove(key);
                if let Some(uid) = &c.reference.uid {
                    self.deleted.insert(uid.clone(), Instant::now());
                }
                let instance = &self.args.controller_pod_name;
                let event = event_for(&c.reference, instance, Remedy::Delete);
                self.publish(key, event).await;
            }
            // Gone already, or replaced by a newer pod of the same name:
            // nothing to repair any more.
            Ok(Err(kube::Error::Api(s))) if s.code == 404 || s.code == 409 => {
                tracing::debug!(namespace = %ns, pod = %name, code = s.code, "pod already gone or replaced");
                self.pending.remove(key);
            }
            Ok(Err(e)) => {
                self.metrics.pods_delete_errors.inc();
                tracing::warn!(namespace = %ns, pod = %name, error = %e, "cannot delete pod; will retry");
            }
            Err(_) => {
                self.metrics.pods_delete_timeouts.inc();
                tracing::warn!(namespace = %ns, pod = %name, timeout = ?self.args.api_timeout, "pod deletion timed out; will retry");
            }
        }
    }

    /// A pod that needs a repair but that a deletion would not repair:
    /// left in place, and the operator told what to do.
    async fn report_not_deleted(&mut self, key: &Key, c: &Candidate) {
        let (ns, name) = key;
        if let Some(uid) = &c.reference.uid {
            self.reported.insert(uid.clone());
        }
        self.metrics.pods_unowned.inc();
        let instance = &self.args.controller_pod_name;
        let event = event_for(&c.reference, instance, c.remedy);
        // The Event's words: what happened, and what to do about it.
        let note = event.note.as_deref().unwrap_or_default();
        tracing::warn!(namespace = %ns, pod = %name, "{note}");
        self.publish(key, event).await;
    }

    async fn publish(&self, (ns, name): &Key, event: K8sEvent) {
        let api: Api<K8sEvent> = Api::namespaced(self.client.clone(), ns);
        let t0 = Instant::now();
        match tokio::time::timeout(
            self.args.api_timeout,
            api.create(&PostParams::default(), &event),
        )
        .await
        {
            Ok(Ok(_)) => self
                .metrics
                .events_publish_latency_seconds
                .observe(t0.elapsed().as_secs_f64()),
            Ok(Err(e)) => {
                self.metrics.events_publish_errors.inc();
                tracing::warn!(namespace = %ns, pod = %name, error = %e, "cannot publish the Event about this pod");
            }
            Err(_) => {
                self.metrics.events_publish_timeouts.inc();
                tracing::warn!(namespace = %ns, pod = %name, "publishing the Event about this pod timed out");
            }
        }
    }
}

fn key_of(pod: &Pod) -> Key {
    (pod.namespace().unwrap_or_default(), pod.name_any())
}

/// The events of a watch of `api` that never ends: after an error or the
/// end of the watch it goes on after [`Retry`]'s wait, from where it was
/// (kube's `watcher` resumes or lists again as it must), or with a new
/// watcher when the watch request itself was answered `410 Gone` (the
/// watcher would retry that expired resource version forever). Every
/// event but `Init` resets the wait: the watcher sends `Init` before each
/// list attempt, so kube's own backoff, which any event resets, never grows
/// while the lists fail.
pub fn watch<K>(
    api: Api<K>,
    config: watcher::Config,
    what: &'static str,
) -> impl Stream<Item = watcher::Event<K>> + Send
where
    K: Resource<DynamicType = ()> + Clone + std::fmt::Debug + Send + Sync + 'static,
    K: serde::de::DeserializeOwned,
{
    let start = move || watcher(api.clone(), config.clone()).boxed();
    let events = start();
    futures_util::stream::unfold(
        (events, Retry::new(Retry::WATCH), start),
        move |(mut events, mut retry, start)| async move {
            loop {
                let ev = events.next().await.transpose();
                if let Ok(Some(ev)) = ev {
                    if !matches!(ev, watcher::Event::Init) {
                        retry.reset();
                    }
                    return Some((ev, (events, retry, start)));
                }
                let wait = retry.failed();
                match ev {
                    Err(watcher::Error::WatchStartFailed(kube::Error::Api(s))) if s.code == 410 => {
                        tracing::info!(what, retry_in = ?wait, "watch resource version expired: listing again");
                        events = start();
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, retry_in = ?wait, "cannot list or watch {what}; trying again");
                    }
                    // The watch ended.
                    Ok(_) => {
                        tracing::warn!(retry_in = ?wait, "watch of {what} ended; starting again");
                        events = start();
                    }
                }
                tokio::time::sleep(wait).await;
            }
        },
    )
}

/// The `events.k8s.io/v1` Event about `regarding`, a pod that needs a
/// repair, as its `remedy` has it: its deletion; or, a Warning, why it is
/// left in place (no controller would create it again; a static pod's
/// mirror pod, whose deletion would not restart the static pod). Always a
/// new Event (never a patch of an earlier series), so that the chart's
/// RBAC (`create` only) suffices.
pub fn event_for(regarding: &ObjectReference, instance: &str, remedy: Remedy) -> K8sEvent {
    let (action, note) = match remedy {
        Remedy::Delete => (
            EVENT_ACTION,
            "Deleting the pod: its linkerd-network-validator found no proxy redirect (exit code 95), so it started without linkerd-cni's rules; its owner creates it again",
        ),
        Remedy::NoController => (
            EVENT_ACTION_UNOWNED,
            "Not deleting the pod although its linkerd-network-validator found no proxy redirect (exit code 95), so it started without linkerd-cni's rules: it has no controller owner to create it again. Now that the node's chain is healthy, delete it and create it again",
        ),
        Remedy::MirrorPod => (
            EVENT_ACTION_UNOWNED,
            "Not deleting the pod although its linkerd-network-validator found no proxy redirect (exit code 95), so it started without linkerd-cni's rules: it is a static pod's mirror pod, which the kubelet would only create again. Now that the node's chain is healthy, restart the static pod on the node (move its manifest out of the kubelet's static pod directory and back)",
        ),
    };
    let notice = Notice {
        reason: EVENT_REASON,
        action,
        warning: remedy != Remedy::Delete,
        note: note.into(),
    };
    let namespace = regarding.namespace.clone();
    notice.about(
        regarding.clone(),
        namespace,
        REPORTER,
        instance,
        Timestamp::now(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_shape() {
        let pod = ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Pod".into()),
            name: Some("web-1".into()),
            namespace: Some("shop".into()),
            uid: Some("u1".into()),
            ..ObjectReference::default()
        };
        let e = event_for(&pod, "linkerd-cni-x1", Remedy::Delete);
        assert_eq!(e.reason.as_deref(), Some(EVENT_REASON));
        assert_eq!(e.action.as_deref(), Some(EVENT_ACTION));
        assert_eq!(e.reporting_controller.as_deref(), Some(REPORTER));
        assert_eq!(e.reporting_instance.as_deref(), Some("linkerd-cni-x1"));
        assert_eq!(e.metadata.namespace.as_deref(), Some("shop"));
        assert!(e.metadata.name.unwrap().starts_with("web-1."));
        assert!(
            e.note.unwrap().len() <= 1024,
            "the API limits notes to 1 kB"
        );
        assert_eq!(e.regarding, Some(pod.clone()));

        for w in [
            event_for(&pod, "linkerd-cni-x1", Remedy::NoController),
            event_for(&pod, "linkerd-cni-x1", Remedy::MirrorPod),
        ] {
            assert_eq!(w.type_.as_deref(), Some("Warning"));
            assert_eq!(w.action.as_deref(), Some(EVENT_ACTION_UNOWNED));
            assert!(w.note.unwrap().len() <= 1024);
        }
    }
}
