//! Service-account tokens: the claims of one (who it is for, when it was
//! issued and expires), read without verifying it, to decide whether to
//! keep it.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine;
use serde::Deserialize;

/// What a service-account token says about itself (its JWT claims).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claims {
    /// `system:serviceaccount:<namespace>:<name>`.
    pub subject: String,
    pub issued_at: SystemTime,
    pub expires_at: SystemTime,
    /// The Node it is bound to, if any.
    pub node: Option<String>,
    /// The Pod it is bound to, if any (a projected token).
    pub pod: Option<String>,
}

impl Claims {
    /// The lifetime it was issued with.
    pub fn lifetime(&self) -> Duration {
        self.expires_at
            .duration_since(self.issued_at)
            .unwrap_or_default()
    }

    /// What is left of it at `now`.
    pub fn remaining(&self, now: SystemTime) -> Duration {
        self.expires_at.duration_since(now).unwrap_or_default()
    }
}

/// The subject of ServiceAccount `namespace/name`'s tokens.
pub fn subject(namespace: &str, name: &str) -> String {
    format!("system:serviceaccount:{namespace}:{name}")
}

#[derive(Deserialize)]
struct RawClaims {
    sub: String,
    iat: u64,
    exp: u64,
    #[serde(rename = "kubernetes.io", default)]
    kubernetes: Option<KubernetesClaims>,
}

#[derive(Deserialize, Default)]
struct KubernetesClaims {
    node: Option<Named>,
    pod: Option<Named>,
}

#[derive(Deserialize)]
struct Named {
    name: String,
}

/// The claims of `token` when it is a JWT with `sub`, `iat` and `exp`;
/// None for anything else. Unverified: only the API server can tell
/// whether it is valid, this only tells whether it is worth keeping.
pub fn claims(token: &str) -> Option<Claims> {
    let mut parts = token.trim().split('.');
    let (_header, payload, _sig) = (parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some() {
        return None;
    }
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(payload.trim_end_matches('='))
        .ok()?;
    let raw: RawClaims = serde_json::from_slice(&bytes).ok()?;
    let kubernetes = raw.kubernetes.unwrap_or_default();
    Some(Claims {
        subject: raw.sub,
        issued_at: unix_time(raw.iat)?,
        expires_at: unix_time(raw.exp)?,
        node: kubernetes.node.map(|n| n.name),
        pod: kubernetes.pod.map(|n| n.name),
    })
}

/// `secs` after the epoch, if the system's time can hold it: a claim is
/// anything the token's issuer (or whoever wrote the file it was read
/// from) put there, and adding a Duration past that range panics.
pub fn unix_time(secs: u64) -> Option<SystemTime> {
    UNIX_EPOCH.checked_add(Duration::from_secs(secs))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn jwt(payload: &serde_json::Value) -> String {
        let b = |s: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(s);
        format!(
            "{}.{}.{}",
            b(br#"{"alg":"RS256"}"#),
            b(payload.to_string().as_bytes()),
            b(b"sig")
        )
    }

    #[test]
    fn claims_of_a_token() {
        let t = jwt(&json!({
            "sub": "system:serviceaccount:linkerd-cni:linkerd-cni-plugin",
            "iat": 1000, "exp": 4600,
            "kubernetes.io": {"namespace": "linkerd-cni", "node": {"name": "n1", "uid": "u"}},
        }));
        let c = claims(&t).unwrap();
        assert_eq!(c.subject, subject("linkerd-cni", "linkerd-cni-plugin"));
        assert_eq!(c.lifetime(), Duration::from_secs(3600));
        assert_eq!(c.node.as_deref(), Some("n1"));
        assert_eq!(
            c.remaining(UNIX_EPOCH + Duration::from_secs(4000)),
            Duration::from_secs(600)
        );
        assert_eq!(
            c.remaining(UNIX_EPOCH + Duration::from_secs(5000)),
            Duration::ZERO
        );
        let unbound = jwt(&json!({"sub": "s", "iat": 1, "exp": 2}));
        assert_eq!(claims(&unbound).unwrap().node, None);
        for not in ["", "opaque-token", "a.b.c", "a.b", &format!("{t}.x")] {
            assert_eq!(claims(not), None, "{not}");
        }
    }

    /// Times past what the system's clock can hold are no claims (adding
    /// them to the epoch would panic, and the release build aborts): such
    /// a token is not worth keeping, and whoever reads it replaces it.
    #[test]
    fn claims_out_of_the_clock_range_are_none() {
        let big = 1u64 << 63;
        for (iat, exp) in [(big, big + 1), (1000, big), (1000, u64::MAX), (u64::MAX, 1)] {
            let t = jwt(&json!({"sub": "s", "iat": iat, "exp": exp}));
            assert_eq!(claims(&t), None, "iat {iat}, exp {exp}");
        }
        // The largest the clock holds still reads.
        let max = (1u64 << 63) - 1;
        let t = jwt(&json!({"sub": "s", "iat": 1000, "exp": max}));
        assert_eq!(claims(&t).unwrap().expires_at, unix_time(max).unwrap());
    }
}
