//! Prometheus metrics, under upstream's names (prefix
//! `linkerd_cni_repair_controller_`), so that dashboards and alerts made
//! for upstream's controller keep working; and the plugin's pod lookups'
//! (`linkerd_cni_agent_pod_lookup*`).

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// The prefix of every metric.
pub const PREFIX: &str = "linkerd_cni_repair_controller";

/// Latency buckets in seconds: Prometheus' customary defaults.
const BUCKETS: [f64; 11] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

#[derive(Clone, Debug)]
pub struct Metrics {
    pub queue_overflow: Counter,
    pub pods_deleted: Counter,
    pub pods_delete_latency_seconds: Histogram,
    pub pods_delete_errors: Counter,
    pub pods_delete_timeouts: Counter,
    pub events_publish_latency_seconds: Histogram,
    pub events_publish_errors: Counter,
    pub events_publish_timeouts: Counter,
    /// Pods waiting for a repair (for the chain, or their backoff).
    pub pods_pending: Gauge,
    /// 1 while the node's chain holds repairs back.
    pub chain_broken: Gauge,
    /// Pods that needed a repair but were left in place: no controller
    /// would create them again (static pods' mirror pods included).
    pub pods_unowned: Counter,
    /// The plugin's pod lookups answered, by `result`: watch, waited,
    /// fetched, not_found, unavailable, refused.
    pub pod_lookups: Family<Vec<(String, String)>, Counter>,
    pub pod_lookup_seconds: Histogram,
}

impl Metrics {
    /// Registers every metric under [`PREFIX`] in `registry`.
    pub fn register(registry: &mut Registry) -> Metrics {
        let reg = registry.sub_registry_with_prefix(PREFIX);
        let m = Metrics {
            queue_overflow: Counter::default(),
            pods_deleted: Counter::default(),
            pods_delete_latency_seconds: Histogram::new(BUCKETS),
            pods_delete_errors: Counter::default(),
            pods_delete_timeouts: Counter::default(),
            events_publish_latency_seconds: Histogram::new(BUCKETS),
            events_publish_errors: Counter::default(),
            events_publish_timeouts: Counter::default(),
            pods_pending: Gauge::default(),
            chain_broken: Gauge::default(),
            pods_unowned: Counter::default(),
            pod_lookups: Family::default(),
            pod_lookup_seconds: Histogram::new([
                0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
            ]),
        };
        reg.register(
            "queue_overflow",
            "Pods dropped because too many were waiting for a repair",
            m.queue_overflow.clone(),
        );
        reg.register(
            "pods_deleted",
            "Pods deleted by the controller",
            m.pods_deleted.clone(),
        );
        reg.register(
            "pods_delete_latency_seconds",
            "Latency of pod deletions",
            m.pods_delete_latency_seconds.clone(),
        );
        reg.register(
            "pods_delete_errors",
            "Pod deletions the API refused or failed",
            m.pods_delete_errors.clone(),
        );
        reg.register(
            "pods_delete_timeout",
            "Pod deletions that did not complete in time",
            m.pods_delete_timeouts.clone(),
        );
        reg.register(
            "events_publish_latency_seconds",
            "Latency of publishing Events",
            m.events_publish_latency_seconds.clone(),
        );
        reg.register(
            "events_publish_errors",
            "Events the API refused or failed to store",
            m.events_publish_errors.clone(),
        );
        reg.register(
            "events_publish_timeouts",
            "Events whose publication did not complete in time",
            m.events_publish_timeouts.clone(),
        );
        reg.register(
            "pods_pending",
            "Pods waiting for a repair, for the chain or for their backoff",
            m.pods_pending.clone(),
        );
        reg.register(
            "chain_broken",
            "1 while this node's chain is broken and repairs wait",
            m.chain_broken.clone(),
        );
        reg.register(
            "pods_unowned",
            "Pods that started without linkerd-cni's rules but were not deleted because no controller would create them again (no controller owner, or a static pod's mirror pod); recreate or restart them by hand",
            m.pods_unowned.clone(),
        );
        // The agent's name: the installer's process answers them too.
        let reg = registry.sub_registry_with_prefix("linkerd_cni_agent");
        reg.register(
            "pod_lookups",
            "The plugin's pod lookups answered, by result: watch (from memory), waited (for the watch), fetched (GET), not_found, unavailable, refused",
            m.pod_lookups.clone(),
        );
        reg.register(
            "pod_lookup_seconds",
            "Time to answer a pod lookup",
            m.pod_lookup_seconds.clone(),
        );
        m
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upstream_names() {
        let mut registry = Registry::default();
        let m = Metrics::register(&mut registry);
        m.pods_deleted.inc();
        let text =
            crate::repair::admin::encode(&registry, crate::repair::admin::Format::OpenMetrics).0;
        for name in [
            "linkerd_cni_repair_controller_queue_overflow_total",
            "linkerd_cni_repair_controller_pods_deleted_total 1",
            "linkerd_cni_repair_controller_pods_delete_latency_seconds_bucket",
            "linkerd_cni_repair_controller_pods_delete_errors_total",
            "linkerd_cni_repair_controller_pods_delete_timeout_total",
            "linkerd_cni_repair_controller_events_publish_latency_seconds_bucket",
            "linkerd_cni_repair_controller_events_publish_errors_total",
            "linkerd_cni_repair_controller_events_publish_timeouts_total",
        ] {
            assert!(text.contains(name), "{name} missing from:\n{text}");
        }
    }
}
