//! Kubernetes Events about a Node (`events.k8s.io/v1`), as the installer
//! reports what it decided or found: the object, and one create call.
//!
//! Node events live in the `default` namespace (where `kubectl describe
//! node` finds them) and regard the Node by name. Each is a new Event,
//! never a patch of an earlier series: `create` is the only right needed.
//! The caller rate-limits.

use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};

use crate::client::{ApiError, Client};

/// The namespace of Events about cluster-scoped objects such as Nodes.
pub const NODE_EVENTS_NAMESPACE: &str = "default";
/// `reportingController` of every Event the installer creates.
pub const REPORTER: &str = "linkerd.io/linkerd-cni-installer";
/// The API limits an Event's note to 1 kB.
pub const MAX_NOTE: usize = 1024;

/// One Event about a Node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeEvent {
    /// Why, in CamelCase (`ChainFight`, ...): what alerts match on.
    pub reason: &'static str,
    /// What was done about it, in CamelCase.
    pub action: &'static str,
    /// `Warning` rather than `Normal`.
    pub warning: bool,
    /// For a person: what happened and what to do (cut to [`MAX_NOTE`]).
    pub note: String,
}

impl NodeEvent {
    /// The `events.k8s.io/v1` object for `node`, reported by `instance`
    /// (e.g. the installer's pod name) at `now`.
    pub fn to_json(&self, node: &str, instance: &str, now: SystemTime) -> Value {
        let t = now.duration_since(UNIX_EPOCH).unwrap_or_default();
        let mut note = self.note.clone();
        if note.len() > MAX_NOTE {
            let mut cut = MAX_NOTE - 3;
            while !note.is_char_boundary(cut) {
                cut -= 1;
            }
            note.truncate(cut);
            note.push_str("...");
        }
        json!({
            "apiVersion": "events.k8s.io/v1",
            "kind": "Event",
            "metadata": {
                "name": format!("{node}.{:x}", t.as_nanos()),
                "namespace": NODE_EVENTS_NAMESPACE,
            },
            "eventTime": linkerd_cni_logline::rfc3339_micros(t.as_secs(), t.subsec_micros()),
            "reportingController": REPORTER,
            "reportingInstance": instance,
            "action": self.action,
            "reason": self.reason,
            "type": if self.warning { "Warning" } else { "Normal" },
            "note": note,
            "regarding": {"apiVersion": "v1", "kind": "Node", "name": node},
        })
    }
}

/// Creates `event` about `node` (retried on transient failures within the
/// client's budget: an Event whose answer was lost may be created twice,
/// which is harmless).
pub fn create_node_event(
    client: &Client,
    node: &str,
    instance: &str,
    event: &NodeEvent,
) -> Result<(), ApiError> {
    let path = format!("/apis/events.k8s.io/v1/namespaces/{NODE_EVENTS_NAMESPACE}/events");
    client
        .create::<Value>(&path, &event.to_json(node, instance, SystemTime::now()))
        .map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn shape_of_a_node_event() {
        let e = NodeEvent {
            reason: "ChainFight",
            action: "RepairLimited",
            warning: true,
            note: "é".repeat(600),
        };
        let at = UNIX_EPOCH + Duration::new(1_764_581_400, 123_456_789);
        let v = e.to_json("worker-1", "linkerd-cni-x1", at);
        assert_eq!(v["eventTime"], "2025-12-01T09:30:00.123456Z");
        assert_eq!(
            v["regarding"],
            json!({"apiVersion": "v1", "kind": "Node", "name": "worker-1"})
        );
        assert_eq!(v["metadata"]["namespace"], "default");
        assert!(
            v["metadata"]["name"]
                .as_str()
                .unwrap()
                .starts_with("worker-1.")
        );
        assert_eq!(v["type"], "Warning");
        assert_eq!(v["reportingController"], REPORTER);
        let note = v["note"].as_str().unwrap();
        assert!(
            note.len() <= MAX_NOTE && note.ends_with("..."),
            "{}",
            note.len()
        );
    }
}
