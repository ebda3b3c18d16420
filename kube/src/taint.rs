//! Removing a startup taint from a node: what the installer asks once the
//! node is chained, so that a node registered with that taint starts
//! receiving ordinary pods only when linkerd-cni can serve them.
//!
//! Only the taints with the given key are removed, and only while they are
//! where the node was read: the JSON patch tests the key at each index
//! before removing it, so a concurrent change of the taint list (another
//! controller adding or removing its own taint) makes the patch fail as a
//! whole instead of removing someone else's taint; the node is then read
//! again and the patch rebuilt, a few times at most. No `resourceVersion`
//! precondition: the kubelet updates its node all the time, and only the
//! taint list matters here.

use std::fmt;

use serde::Deserialize;
use serde_json::{Value, json};

use crate::{ApiError, Client};

/// Reads of the node (and patches) before giving up on a node whose taint
/// list keeps changing under us.
const MAX_ROUNDS: u32 = 5;

/// The fields of a Node this reads.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
struct Node {
    spec: NodeSpec,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
struct NodeSpec {
    /// Kept as JSON: only `key` and `effect` are read.
    #[serde(deserialize_with = "nullable_list")]
    taints: Vec<Value>,
}

fn nullable_list<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<Value>, D::Error> {
    Ok(Option::<Vec<Value>>::deserialize(d)?.unwrap_or_default())
}

fn key_of(taint: &Value) -> &str {
    taint.get("key").and_then(Value::as_str).unwrap_or_default()
}

/// `key[=value]:Effect`, as kubectl shows a taint.
fn describe(taint: &Value) -> String {
    let value = match taint.get("value").and_then(Value::as_str) {
        Some(v) if !v.is_empty() => format!("={v}"),
        _ => String::new(),
    };
    let effect = taint.get("effect").and_then(Value::as_str).unwrap_or("");
    format!("{}{value}:{effect}", key_of(taint))
}

/// The API path of a node (its name one encoded segment).
pub fn node_path(node: &str) -> String {
    format!("/api/v1/nodes/{}", crate::names::segment(node))
}

/// What happened to the taint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TaintOutcome {
    /// Removed now; the taints as `key[=value]:Effect`.
    Removed { node: String, taints: Vec<String> },
    /// The node has no taint with that key (any more).
    Absent { node: String, key: String },
}

impl fmt::Display for TaintOutcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TaintOutcome::Removed { node, taints } => {
                write!(f, "taint {} from node {node}", taints.join(", "))
            }
            TaintOutcome::Absent { node, key } => {
                write!(f, "node {node} has no taint {key}")
            }
        }
    }
}

/// How a failure should be treated by the caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureKind {
    /// Try again later: the API server was unreachable, slow or
    /// overloaded, or the node kept changing.
    Transient,
    /// HTTP 403: the service account may not get or patch nodes.
    Forbidden,
    /// HTTP 401: the token was refused.
    Unauthorized,
    /// Anything else (no such node, an unexpected answer, TLS).
    Other,
}

/// Why the taint could not be removed.
#[derive(Debug, thiserror::Error)]
pub enum TaintError {
    #[error("cannot read node {node}: {source}")]
    Get {
        node: String,
        key: String,
        #[source]
        source: Box<ApiError>,
    },
    #[error("cannot patch node {node} to remove taint {key}: {source}")]
    Patch {
        node: String,
        key: String,
        #[source]
        source: Box<ApiError>,
    },
    #[error(
        "the taints of node {node} changed under every one of {rounds} attempts to remove {key}"
    )]
    Contended {
        node: String,
        key: String,
        rounds: u32,
    },
}

impl TaintError {
    pub fn kind(&self) -> FailureKind {
        match self {
            TaintError::Get { source, .. } | TaintError::Patch { source, .. } => match &**source {
                ApiError::Unauthorized { status: 403, .. } => FailureKind::Forbidden,
                ApiError::Unauthorized { .. } => FailureKind::Unauthorized,
                e if e.transient() => FailureKind::Transient,
                _ => FailureKind::Other,
            },
            TaintError::Contended { .. } => FailureKind::Transient,
        }
    }

    /// What an operator should do about it.
    pub fn hint(&self) -> String {
        match self.kind() {
            FailureKind::Forbidden => format!(
                "the linkerd-cni service account needs get and patch on nodes \
                 (deploy/linkerd-cni.yaml grants them; the linkerd2-cni chart does not); \
                 until then remove the taint by hand: kubectl taint nodes {} {}-",
                self.node(),
                self.key()
            ),
            FailureKind::Unauthorized => {
                "the token in the kubeconfig was refused: the installer rewrites it when the \
                 kubelet rotates the service account's token"
                    .into()
            }
            FailureKind::Transient => "retried later".into(),
            FailureKind::Other => match self {
                TaintError::Get { source, .. } if matches!(**source, ApiError::NotFound { .. }) => {
                    "check the node name the installer was given (LINKERD_CNI_NODE_NAME, \
                      from the downward API's spec.nodeName)"
                        .into()
                }
                _ => "see the message".into(),
            },
        }
    }

    fn node(&self) -> &str {
        match self {
            TaintError::Get { node, .. }
            | TaintError::Patch { node, .. }
            | TaintError::Contended { node, .. } => node,
        }
    }

    fn key(&self) -> &str {
        match self {
            TaintError::Get { key, .. }
            | TaintError::Patch { key, .. }
            | TaintError::Contended { key, .. } => key,
        }
    }
}

/// The JSON patch removing the taints at `indices` (ascending), each after
/// testing that its key is still `key` there. Highest index first, so each
/// removal leaves the lower indices where they were.
fn removal_patch(indices: &[usize], key: &str) -> Value {
    let ops: Vec<Value> = indices
        .iter()
        .rev()
        .flat_map(|i| {
            [
                json!({"op": "test", "path": format!("/spec/taints/{i}/key"), "value": key}),
                json!({"op": "remove", "path": format!("/spec/taints/{i}")}),
            ]
        })
        .collect();
    Value::Array(ops)
}

/// Removes every taint with `key` (whatever its effect) from `node`; never
/// adds one. Bounded by the client's budget.
pub fn remove_taint(client: &Client, node: &str, key: &str) -> Result<TaintOutcome, TaintError> {
    let path = node_path(node);
    for round in 1..=MAX_ROUNDS {
        let n: Node = client.get(&path).map_err(|source| TaintError::Get {
            node: node.into(),
            key: key.into(),
            source: Box::new(source),
        })?;
        let indices: Vec<usize> = n
            .spec
            .taints
            .iter()
            .enumerate()
            .filter(|(_, t)| key_of(t) == key)
            .map(|(i, _)| i)
            .collect();
        if indices.is_empty() {
            return Ok(TaintOutcome::Absent {
                node: node.into(),
                key: key.into(),
            });
        }
        let removed = indices
            .iter()
            .map(|&i| describe(&n.spec.taints[i]))
            .collect();
        match client.json_patch::<Value>(&path, &removal_patch(&indices, key)) {
            Ok(_) => {
                return Ok(TaintOutcome::Removed {
                    node: node.into(),
                    taints: removed,
                });
            }
            // A failed `test` (422) or a conflict (409): the taint list
            // changed since the read. Read it again.
            Err(ApiError::Status {
                status: 409 | 422,
                message,
                ..
            }) => {
                log::info!(
                    "node {node} changed while removing taint {key} ({message}); reading it again (round {round})"
                );
            }
            Err(source) => {
                return Err(TaintError::Patch {
                    node: node.into(),
                    key: key.into(),
                    source: Box::new(source),
                });
            }
        }
    }
    Err(TaintError::Contended {
        node: node.into(),
        key: key.into(),
        rounds: MAX_ROUNDS,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patch_tests_each_key_and_removes_highest_first() {
        let p = removal_patch(&[1, 3], "linkerd.io/cni-not-ready");
        assert_eq!(
            p,
            json!([
                {"op": "test", "path": "/spec/taints/3/key", "value": "linkerd.io/cni-not-ready"},
                {"op": "remove", "path": "/spec/taints/3"},
                {"op": "test", "path": "/spec/taints/1/key", "value": "linkerd.io/cni-not-ready"},
                {"op": "remove", "path": "/spec/taints/1"},
            ])
        );
    }

    #[test]
    fn reads_null_and_missing_taints() {
        for body in [r#"{"spec":{"taints":null}}"#, r#"{"spec":{}}"#, "{}"] {
            let n: Node = serde_json::from_str(body).unwrap();
            assert!(n.spec.taints.is_empty(), "{body}");
        }
        let t = json!({"key": "k", "value": "v", "effect": "NoSchedule"});
        assert_eq!(describe(&t), "k=v:NoSchedule");
        assert_eq!(
            describe(&json!({"key": "k", "effect": "NoExecute"})),
            "k:NoExecute"
        );
    }
}
