//! The plugin's question to the node agent, and the agent's answer.
//!
//! The agent (the DaemonSet's long-running program) keeps this node's pods,
//! the cluster's namespaces and Service `default/kubernetes` in memory from
//! watches. A pod start that asks it pays for a Unix-socket round trip
//! instead of a TLS handshake and two or three GETs against the API server.
//!
//! The protocol, version [`VERSION`]: the plugin connects to [`SOCKET`] in
//! its state dir, writes one [`Request`] as a JSON line, reads one
//! [`Answer`] as a JSON line, and the agent closes the connection. Both
//! sides bound what they read ([`MAX_REQUEST`], [`MAX_ANSWER`]) and how long
//! they wait. The socket is root's alone: the agent creates it mode 0600,
//! and the plugin talks only to a socket file owned by root whose peer runs
//! as root, since the answer decides whether a pod's traffic is redirected.
//!
//! Anything but a well-formed answer of this version (no socket, a refused
//! or slow connection, another version, garbage) is an [`AskError`]: the
//! plugin then takes its direct path to the API server, so an agent that is
//! missing, restarting or older or newer than the plugin never fails a pod.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;

mod client;
pub use client::ask;

/// Set (non-empty) on linkerd's control-plane pods, which skip the API
/// server's ports: the agent sends Service `default/kubernetes` with their
/// answer, fetched when its watch has not seen it.
pub const CONTROL_PLANE_LABEL: &str = "linkerd.io/control-plane-component";

/// The socket's file name in the plugin's state dir.
pub const SOCKET: &str = "agent.sock";
/// The protocol's version; a peer answering another one is not used.
pub const VERSION: u32 = 1;
/// The most a request may take: two names and a uid, with room to spare.
pub const MAX_REQUEST: usize = 4 << 10;
/// The most an answer may take: a pod's annotations may hold 256 KiB, a
/// namespace's as much; the rest is small.
pub const MAX_ANSWER: usize = 2 << 20;

/// What the plugin asks: the pod of one sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Request {
    pub v: u32,
    pub namespace: String,
    pub name: String,
    /// `K8S_POD_UID` when the runtime passes it: a pod of the same name
    /// but another uid (a StatefulSet's pod recreated) is not the one asked
    /// for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
    /// How long the plugin waits for the answer, so that the agent gives
    /// up (and says so) before the plugin does.
    pub budget_ms: u64,
}

/// How the agent knew the pod: the acceptance tests and the metrics tell
/// lookups served from the watch from those that had to wait or fetch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Source {
    /// In the watch's store when asked.
    Watch,
    /// Arrived through the watch while the question waited.
    Waited,
    /// Not seen in time by the watch: fetched with a GET.
    Fetched,
}

/// The agent's answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Answer {
    pub v: u32,
    #[serde(flatten)]
    pub body: Body,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "answer", rename_all = "snake_case")]
pub enum Body {
    /// The pod, as the API server has it (the fields the plugin reads),
    /// its namespace (metadata and annotations) when known, and Service
    /// `default/kubernetes` when known.
    Pod {
        pod: Value,
        namespace: Option<Value>,
        service: Option<Value>,
        source: Source,
    },
    /// The API server said the pod does not exist (or exists with another
    /// uid): the agent's own GET, not merely a watch that has not seen it.
    NotFound { message: String },
    /// The agent cannot say now (its API calls failed or timed out): the
    /// plugin asks the API server itself.
    Unavailable { message: String },
}

impl Answer {
    pub fn new(body: Body) -> Answer {
        Answer { v: VERSION, body }
    }

    /// One JSON line.
    pub fn encode(&self) -> Vec<u8> {
        line(self)
    }
}

impl Request {
    /// One JSON line.
    pub fn encode(&self) -> Vec<u8> {
        line(self)
    }

    /// A request line as the agent reads it; refused when too long, not
    /// JSON, of another version or naming no pod.
    pub fn decode(bytes: &[u8]) -> Result<Request, AskError> {
        if bytes.len() > MAX_REQUEST {
            return Err(AskError::TooLarge { limit: MAX_REQUEST });
        }
        let r: Request =
            serde_json::from_slice(bytes).map_err(|e| AskError::Malformed(e.to_string()))?;
        if r.v != VERSION {
            return Err(AskError::Version(r.v));
        }
        if r.namespace.is_empty() || r.name.is_empty() {
            return Err(AskError::Malformed("no pod namespace or name".into()));
        }
        Ok(r)
    }
}

fn line(v: &impl Serialize) -> Vec<u8> {
    // Serializing these types cannot fail: string keys, no maps of
    // non-string keys, no custom serializers.
    let mut out = serde_json::to_vec(v).unwrap_or_default();
    out.push(b'\n');
    out
}

/// Why the agent could not be asked, or its answer not used. Every variant
/// means the same to the plugin (take the direct path); they differ in
/// what the log says.
#[derive(Debug, thiserror::Error)]
pub enum AskError {
    #[error("no node agent listens at {0}")]
    NoAgent(String),
    #[error("{0} is not a socket owned by root; not asking it")]
    NotTrusted(String),
    #[error("the node agent's peer runs as uid {0}, not root; not trusting its answer")]
    PeerNotRoot(u32),
    #[error("cannot talk to the node agent: {0}")]
    Io(#[from] std::io::Error),
    #[error("the node agent did not answer within {0:?}")]
    TimedOut(Duration),
    #[error("the node agent's message exceeds {limit} bytes")]
    TooLarge { limit: usize },
    #[error("the node agent's message is malformed: {0}")]
    Malformed(String),
    #[error("the node agent speaks protocol version {0}, this plugin {VERSION}")]
    Version(u32),
}
