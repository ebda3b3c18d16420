//! The CNI error object and its codes.
//!
//! Errors are the only structured channel back to a runtime: libcni drops a
//! failed plugin's stderr, so everything an operator needs goes in `msg`
//! (what failed) and `details` (why, and what to do).

use std::fmt;

use linkerd_cni_state::outcomes::RetryCause;
use serde_json::{Value, json};

/// Error codes from the CNI specification, plus ours from 100 up.
pub mod code {
    /// The config's `cniVersion` is not one we speak.
    pub const INCOMPATIBLE_VERSION: u32 = 1;
    /// A required `CNI_*` environment variable is missing or malformed.
    pub const INVALID_ENV: u32 = 4;
    /// Reading stdin or another local I/O failed.
    pub const IO: u32 = 5;
    /// Stdin is not valid JSON.
    pub const DECODE: u32 = 6;
    /// Stdin is JSON but not a valid config for this plugin.
    pub const INVALID_CONFIG: u32 = 7;
    /// A transient condition; the runtime should retry.
    pub const TRY_AGAIN_LATER: u32 = 11;
    /// The Kubernetes API could not be used (unreachable, refused, bad answer).
    pub const KUBERNETES: u32 = 100;
    /// Installing or verifying the pod's iptables rules failed.
    pub const IPTABLES: u32 = 101;
    /// A pod annotation carries a value we cannot use.
    pub const INVALID_ANNOTATION: u32 = 102;
    /// CHECK found the pod's rules missing or different from what ADD installs.
    pub const RULES_MISMATCH: u32 = 103;
    /// The plugin failed in a way it did not anticipate (a bug).
    pub const INTERNAL: u32 = 199;
}

/// A CNI error result: printed as JSON on stdout, with a non-zero exit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CniError {
    pub code: u32,
    pub msg: String,
    pub details: String,
    /// For code 11, why: what the ADD's outcome counter records (never
    /// sent to the runtime).
    pub retry_cause: Option<RetryCause>,
}

impl CniError {
    pub fn new(code: u32, msg: impl Into<String>, details: impl Into<String>) -> Self {
        CniError {
            code,
            msg: msg.into(),
            details: details.into(),
            retry_cause: None,
        }
    }

    /// Code 11 ("try again later") for `cause`.
    pub fn try_again(
        cause: RetryCause,
        msg: impl Into<String>,
        details: impl Into<String>,
    ) -> Self {
        CniError {
            retry_cause: Some(cause),
            ..CniError::new(code::TRY_AGAIN_LATER, msg, details)
        }
    }

    /// The error object as the spec shapes it, tagged with `cni_version`.
    pub fn to_json(&self, cni_version: &str) -> Value {
        let mut v = json!({ "cniVersion": cni_version, "code": self.code, "msg": self.msg });
        if !self.details.is_empty() {
            v["details"] = json!(self.details);
        }
        v
    }
}

impl fmt::Display for CniError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let sep = if self.details.is_empty() { "" } else { ": " };
        write!(
            f,
            "{}{sep}{} (CNI error {})",
            self.msg, self.details, self.code
        )
    }
}

impl std::error::Error for CniError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_shape_follows_the_spec() {
        let e = CniError::new(code::DECODE, "cannot decode config", "line 1");
        let v = e.to_json("0.3.1");
        assert_eq!(
            serde_json::to_string(&v).unwrap(),
            r#"{"cniVersion":"0.3.1","code":6,"msg":"cannot decode config","details":"line 1"}"#
        );
    }

    #[test]
    fn empty_details_are_omitted() {
        let v = CniError::new(code::IO, "x", "").to_json("1.1.0");
        assert!(v.get("details").is_none());
        assert_eq!(v["code"], 5);
    }
}
