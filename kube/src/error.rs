//! How a failed API call is told, for the plugin's client and the node
//! agent's alike: [`ApiError`] (what failed, whether it is worth retrying,
//! what to do), from an answer's status and body read raw, so that the API
//! server's own `Status` is told from a proxy's page.

use std::path::PathBuf;
use std::time::Duration;

use thiserror::Error;

use crate::names;

/// Pods with many containers and managed fields are large; this bounds
/// what a misbehaving server can make us read.
pub const MAX_BODY: u64 = 16 << 20;

/// What an [`ApiError`] ran into underneath: the HTTP, TLS or JSON stack's
/// error, or our words where the stack has no error value.
pub type Cause = Box<dyn std::error::Error + Send + Sync>;

/// The HTTP methods of the calls an [`ApiError`] is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    Get,
    Patch,
    Post,
}

impl std::fmt::Display for Method {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Method::Get => "GET",
            Method::Patch => "PATCH",
            Method::Post => "POST",
        })
    }
}

/// A failed API call.
#[derive(Debug, Error)]
pub enum ApiError {
    #[error(
        "cannot reach the Kubernetes API at {server} ({method} {path}, {attempts} attempt{}): {cause}",
        if *.attempts == 1 { "" } else { "s" }
    )]
    Unreachable {
        server: String,
        method: Method,
        path: String,
        attempts: u32,
        #[source]
        cause: Cause,
    },
    #[error(
        "no answer from the Kubernetes API at {server} to {method} {path} within linkerd-cni's {} s budget{}",
        .budget.as_secs_f32(),
        .last.as_deref().map(|l| format!(" (last attempt: {l})")).unwrap_or_default()
    )]
    TimedOut {
        server: String,
        method: Method,
        path: String,
        budget: Duration,
        /// What the last attempt ran into, when it failed before the budget
        /// ran out.
        last: Option<String>,
    },
    #[error("the Kubernetes API at {server} accepted the connection but did not answer {method} {path} within {:.1} s", .after.as_secs_f32())]
    NoAnswer {
        server: String,
        method: Method,
        path: String,
        after: Duration,
    },
    #[error(
        "the Kubernetes API {} (HTTP {status} for {method} {path})",
        if *.status == 403 {
            "does not allow linkerd-cni's service account this request"
        } else {
            "refused linkerd-cni's credentials"
        }
    )]
    Unauthorized {
        status: u16,
        method: Method,
        path: String,
        kubeconfig: PathBuf,
        /// The `reason` of the answer's Kubernetes `Status` body
        /// (`Unauthorized`, `Forbidden`; empty when it has none), made
        /// printable; None when the body was not one (a proxy's page, say),
        /// so that a caller can tell the API server's own refusal from
        /// something in the way.
        reason: Option<String>,
    },
    #[error("{method} {path}: not found")]
    NotFound {
        method: Method,
        path: String,
        /// The answer's Kubernetes `Status` body; None when the body was
        /// not one (a proxy's page, an empty answer), so that a caller can
        /// tell the API server's own NotFound from something in the way.
        /// (Boxed: it would make every `ApiError` larger.)
        status: Option<Box<StatusBody>>,
    },
    #[error("{method} {path}: HTTP {status}: {message}")]
    Status {
        method: Method,
        path: String,
        status: u16,
        message: String,
    },
    #[error("TLS with the Kubernetes API at {server} failed: {cause}")]
    Tls {
        server: String,
        #[source]
        cause: Cause,
        /// The handshake did not finish in time (rather than failing).
        handshake_hung: bool,
    },
    #[error("{method} {path}: cannot read the answer: {cause}")]
    Decode {
        method: Method,
        path: String,
        #[source]
        cause: Cause,
    },
    /// Refused before any request: the API server would refuse it too.
    #[error("refusing {what} name {name:?}: not a valid Kubernetes name ({rule})")]
    InvalidName {
        what: &'static str,
        name: String,
        rule: &'static str,
    },
}

/// A namespace, checked and encoded for a path.
pub fn valid_namespace(name: &str) -> Result<String, ApiError> {
    if !names::is_dns_label(name) {
        return Err(ApiError::InvalidName {
            what: "namespace",
            name: name.to_string(),
            rule: "a DNS-1123 label: at most 63 lowercase letters, digits and '-'",
        });
    }
    Ok(names::segment(name))
}

/// A pod's or DaemonSet's name, checked and encoded for a path.
pub fn valid_name(what: &'static str, name: &str) -> Result<String, ApiError> {
    if !names::is_dns_subdomain(name) {
        return Err(ApiError::InvalidName {
            what,
            name: name.to_string(),
            rule: "a DNS-1123 subdomain: at most 253 lowercase letters, digits, '-' and '.'",
        });
    }
    Ok(names::segment(name))
}

impl ApiError {
    /// The failure an answer with HTTP `status` (not a success) and `body`
    /// says, to `method path` made with the credentials of `kubeconfig`.
    pub fn of_answer(
        method: Method,
        path: &str,
        status: u16,
        body: &[u8],
        kubeconfig: &std::path::Path,
    ) -> ApiError {
        match status {
            401 | 403 => ApiError::Unauthorized {
                status,
                method,
                path: path.into(),
                kubeconfig: kubeconfig.into(),
                reason: StatusBody::parse(body)
                    .map(|s| crate::text::printable(&s.reason, MAX_REASON_CHARS)),
            },
            404 => ApiError::NotFound {
                method,
                path: path.into(),
                status: StatusBody::parse(body).map(Box::new),
            },
            _ => ApiError::Status {
                method,
                path: path.into(),
                status,
                message: status_message(body),
            },
        }
    }

    /// What an operator should do about it.
    pub fn hint(&self) -> String {
        match self {
            ApiError::Unreachable { .. } | ApiError::TimedOut { .. } => {
                "check that the API server is up and reachable from the node (the kubeconfig's \
                 server address); the pod start is retried by the kubelet"
                    .into()
            }
            ApiError::NoAnswer { .. } => {
                "the API server is reachable but overloaded or stuck; the pod start is retried \
                 by the kubelet"
                    .into()
            }
            ApiError::Unauthorized { kubeconfig, .. } => format!(
                "the token in {} is stale or lacks RBAC to get pods, namespaces and services; \
                 the linkerd-cni installer DaemonSet rewrites this kubeconfig from its service \
                 account: check that its pod on this node is running, or restart it \
                 (kubectl -n linkerd-cni rollout restart daemonset/linkerd-cni)",
                kubeconfig.display()
            ),
            ApiError::Tls { handshake_hung: true, .. } => {
                "something at the server address accepts TCP connections but does not speak TLS \
                 (a proxy, a firewall, a wrong port?): check the kubeconfig's server address"
                    .into()
            }
            ApiError::Tls { .. } => {
                "check the certificate-authority in the kubeconfig (the installer writes the \
                 cluster's CA) and the server address"
                    .into()
            }
            ApiError::NotFound { .. } => {
                "the object does not exist (yet, or any more); the pod start is retried by the kubelet"
                    .into()
            }
            ApiError::Status { .. } | ApiError::Decode { .. } => {
                "the API server's answer was unexpected; see the message".into()
            }
            ApiError::InvalidName { .. } => {
                "the name comes from the container runtime's CNI_ARGS (K8S_POD_NAMESPACE, \
                 K8S_POD_NAME) or the installer's environment: check what set it"
                    .into()
            }
        }
    }

    /// The budget of `method path` to `server` ran out; `last` is what the
    /// last attempt ran into, when it failed before.
    pub fn timed_out(
        server: &str,
        method: Method,
        path: &str,
        budget: Duration,
        last: Option<&ApiError>,
    ) -> ApiError {
        let last = last.map(|e| match e {
            ApiError::Unreachable { cause, .. } | ApiError::Tls { cause, .. } => cause.to_string(),
            ApiError::NoAnswer { after, .. } => format!(
                "connected, but no answer within {:.1} s",
                after.as_secs_f32()
            ),
            other => other.to_string(),
        });
        ApiError::TimedOut {
            server: server.into(),
            method,
            path: path.into(),
            budget,
            last,
        }
    }

    /// Worth retrying later: the server was unreachable, slow or overloaded.
    pub fn transient(&self) -> bool {
        match self {
            ApiError::Unreachable { .. }
            | ApiError::TimedOut { .. }
            | ApiError::NoAnswer { .. }
            | ApiError::Tls {
                handshake_hung: true,
                ..
            } => true,
            ApiError::Status { status, .. } => *status == 429 || *status >= 500,
            _ => false,
        }
    }
}

/// The most of an answer's message an error carries: it is logged, and
/// returned to the runtime as the CNI error's details.
const MAX_MESSAGE_CHARS: usize = 512;
/// A `reason` is one CamelCase word.
const MAX_REASON_CHARS: usize = 64;

/// What a Kubernetes `Status` body (`kind: Status`) says about a failed
/// call: the API server's own answer, as a proxy's page is not.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatusBody {
    /// `reason`, e.g. `NotFound` (empty when absent).
    pub reason: String,
    /// `details.kind`, the resource the answer is about (e.g. `daemonsets`).
    pub kind: Option<String>,
    /// `details.name`, the object's name.
    pub name: Option<String>,
}

impl StatusBody {
    /// The Status body in `body`; None for any other body.
    pub fn parse(body: &[u8]) -> Option<StatusBody> {
        let v: serde_json::Value = serde_json::from_slice(body).ok()?;
        if v.get("kind")?.as_str()? != "Status" {
            return None;
        }
        let text = |pointer| v.pointer(pointer)?.as_str().map(str::to_string);
        Some(StatusBody {
            reason: text("/reason").unwrap_or_default(),
            kind: text("/details/kind"),
            name: text("/details/name"),
        })
    }
}

/// The `message` of a Kubernetes `Status` body, else the start of the body;
/// either made printable (one line, no terminal escapes, bounded).
fn status_message(body: &[u8]) -> String {
    if let Ok(v) = serde_json::from_slice::<serde_json::Value>(body)
        && let Some(m) = v.get("message").and_then(|m| m.as_str())
    {
        return crate::text::printable(m, MAX_MESSAGE_CHARS);
    }
    let s = String::from_utf8_lossy(body);
    match s.trim() {
        "" => "empty answer".into(),
        s => crate::text::printable(s, 200),
    }
}

/// The retry policy of both clients (the plugin's and the agent's): the
/// most one TCP connect (and TLS handshake) may take...
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// ...and one attempt (connect, request, answer)...
pub const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(5);
/// ...attempts per call, the first included...
pub const MAX_ATTEMPTS: u32 = 4;
/// ...and the backoff before the second, doubling for each further one.
pub const FIRST_BACKOFF: Duration = Duration::from_millis(100);

/// After attempt number `attempt` failed with `err`, with `remaining` of
/// the call's budget left: how long to wait before the next attempt, or
/// None to give up (not transient, the attempts used up, or no time for
/// the backoff). A failure that used up the budget is reported as
/// [`ApiError::timed_out`] by the caller.
pub fn retry_after(err: &ApiError, attempt: u32, remaining: Duration) -> Option<Duration> {
    let backoff = FIRST_BACKOFF * 2u32.pow(attempt.saturating_sub(1).min(16));
    (err.transient() && attempt < MAX_ATTEMPTS && backoff < remaining).then_some(backoff)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What the server says in an error is logged and returned to the
    /// runtime: one line, no terminal escapes, bounded, whether it is a
    /// Status body's message or reason or any other body.
    #[test]
    fn error_bodies_become_one_printable_bounded_line() {
        let forged = "denied\n2026-01-01T00:00:00.000Z WARN  linkerd-cni[1]: \u{1b}[31mforged\r\n";
        let status = serde_json::json!({
            "kind": "Status", "reason": "Forbidden\nforged", "message": forged,
        })
        .to_string();
        let forbidden = ApiError::of_answer(Method::Get, "/", 403, status.as_bytes(), "k".as_ref());
        let ApiError::Unauthorized {
            reason: Some(reason),
            ..
        } = forbidden
        else {
            panic!("{forbidden:?}");
        };
        for m in [
            status_message(status.as_bytes()),
            status_message(forged.as_bytes()),
            reason,
        ] {
            assert!(!m.chars().any(char::is_control), "{m:?}");
            assert!(m.contains("\\n"), "{m:?}");
        }
        // A Status body without a reason is still the API server's own
        // refusal; any other body is none.
        for (body, want) in [
            (r#"{"kind":"Status","code":403}"#, Some("")),
            ("<html>403</html>", None),
        ] {
            match ApiError::of_answer(Method::Get, "/", 403, body.as_bytes(), "k".as_ref()) {
                ApiError::Unauthorized { reason, .. } => assert_eq!(reason.as_deref(), want),
                other => panic!("{other:?}"),
            }
        }
        let long = serde_json::json!({"kind": "Status", "message": "x".repeat(100_000)});
        let m = status_message(long.to_string().as_bytes());
        assert_eq!(m.len(), MAX_MESSAGE_CHARS + 3, "{m}");
        assert_eq!(status_message(b"  "), "empty answer");
        assert_eq!(
            status_message(br#"{"kind":"Status","message":"pods \"p\" not found"}"#),
            r#"pods "p" not found"#
        );
    }
}
