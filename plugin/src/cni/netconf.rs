//! The network config a runtime passes on stdin: the members the spec defines
//! for every plugin, and the raw object for everything plugin-specific.
//!
//! The raw object is kept verbatim (serde_json with `preserve_order` and
//! `arbitrary_precision`) because a chained plugin must hand `prevResult` back
//! unchanged and the chain code derives our desired entry from it.

use serde_json::{Map, Value};

use super::error::{CniError, code};
use super::version;

/// Stdin configs larger than this are refused rather than read into memory.
pub const MAX_STDIN: usize = 16 << 20;

/// The parsed stdin config.
#[derive(Debug, Clone, PartialEq)]
pub struct NetConf {
    /// `cniVersion`, or the implicit "0.1.0" when absent (as libcni reads it).
    pub cni_version: String,
    pub prev_result: Option<Value>,
    /// The whole object, in its original order.
    pub raw: Map<String, Value>,
}

impl NetConf {
    /// Parses stdin. Not JSON is a decode error (6); JSON of the wrong shape
    /// is an invalid config (7); an unknown `cniVersion` is code 1.
    pub fn parse(stdin: &[u8]) -> Result<NetConf, CniError> {
        if stdin.iter().all(u8::is_ascii_whitespace) {
            return Err(CniError::new(
                code::DECODE,
                "no network config on stdin",
                "the runtime passes the plugin's config as JSON on stdin",
            ));
        }
        let value: Value = serde_json::from_slice(stdin).map_err(|e| {
            CniError::new(
                code::DECODE,
                "network config on stdin is not valid JSON",
                e.to_string(),
            )
        })?;
        let Value::Object(raw) = value else {
            return Err(invalid("the network config must be a JSON object", ""));
        };
        let cni_version = match raw.get("cniVersion") {
            Some(Value::String(s)) if !s.is_empty() => s.clone(),
            None | Some(Value::Null | Value::String(_)) => version::IMPLICIT.to_string(),
            Some(other) => {
                return Err(invalid(
                    "cniVersion must be a string",
                    format!("got {}", short(other)),
                ));
            }
        };
        // Nothing reads them, but they are strings in every valid config.
        for key in ["name", "type"] {
            if let Some(other) = raw.get(key).filter(|v| !v.is_null() && !v.is_string()) {
                return Err(invalid(
                    format!("{key} must be a string"),
                    format!("got {}", short(other)),
                ));
            }
        }
        let prev_result = match raw.get("prevResult") {
            None | Some(Value::Null) => None,
            Some(v @ Value::Object(_)) => Some(v.clone()),
            Some(other) => {
                return Err(invalid(
                    "prevResult must be a JSON object",
                    format!("got {}", short(other)),
                ));
            }
        };
        Ok(NetConf {
            cni_version,
            prev_result,
            raw,
        })
    }

    /// Code 1 when we do not speak the config's version.
    pub fn check_version(&self) -> Result<(), CniError> {
        if version::SUPPORTED.contains(&self.cni_version.as_str()) {
            Ok(())
        } else {
            Err(CniError::new(
                code::INCOMPATIBLE_VERSION,
                format!("unsupported cniVersion {:?}", self.cni_version),
                format!("linkerd-cni supports {}", version::SUPPORTED.join(", ")),
            ))
        }
    }

    /// What a chained ADD prints: the prevResult as received, with its
    /// `cniVersion` set to the config's (in place, so key order is kept), or an
    /// empty result when there was none.
    pub fn pass_through_result(&self) -> Value {
        match &self.prev_result {
            None => version::empty_result(&self.cni_version),
            Some(prev) => {
                let mut prev = prev.clone();
                if let Value::Object(m) = &mut prev {
                    let want = Value::String(self.cni_version.clone());
                    match m.get_mut("cniVersion") {
                        Some(v) => *v = want,
                        None => {
                            // Insert first, where every runtime writes it.
                            let mut out = Map::with_capacity(m.len() + 1);
                            out.insert("cniVersion".into(), want);
                            out.extend(std::mem::take(m));
                            *m = out;
                        }
                    }
                }
                prev
            }
        }
    }
}

fn invalid(msg: impl Into<String>, details: impl Into<String>) -> CniError {
    CniError::new(code::INVALID_CONFIG, msg, details)
}

/// A value shortened for an error message.
pub fn short(v: &Value) -> String {
    let s = v.to_string();
    if s.len() <= 80 {
        s
    } else {
        format!("{}...", &s[..s.floor_char_boundary(80)])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prev_result_passes_through_byte_for_byte() {
        let stdin = br#"{"cniVersion":"0.3.1","name":"k8s-pod-network","type":"linkerd-cni",
            "prevResult":{"cniVersion":"0.3.1","interfaces":[{"name":"cali1","sandbox":"/x"}],
            "ips":[{"version":"4","address":"10.0.0.5/32","gateway":"10.0.0.1"}],
            "zz":1.50000000000000000001,"aa":{"b":18446744073709551617},"dns":{}}}"#;
        let c = NetConf::parse(stdin).unwrap();
        let out = serde_json::to_string(&c.pass_through_result()).unwrap();
        assert_eq!(
            out,
            r#"{"cniVersion":"0.3.1","interfaces":[{"name":"cali1","sandbox":"/x"}],"ips":[{"version":"4","address":"10.0.0.5/32","gateway":"10.0.0.1"}],"zz":1.50000000000000000001,"aa":{"b":18446744073709551617},"dns":{}}"#
        );
    }

    #[test]
    fn prev_result_version_follows_the_config() {
        let c = NetConf::parse(
            br#"{"cniVersion":"1.0.0","prevResult":{"ips":[],"cniVersion":"0.4.0"}}"#,
        )
        .unwrap();
        assert_eq!(
            c.pass_through_result().to_string(),
            r#"{"ips":[],"cniVersion":"1.0.0"}"#
        );
        let c = NetConf::parse(br#"{"cniVersion":"1.0.0","prevResult":{"ips":[]}}"#).unwrap();
        assert_eq!(
            c.pass_through_result().to_string(),
            r#"{"cniVersion":"1.0.0","ips":[]}"#
        );
    }

    #[test]
    fn decode_and_shape_errors() {
        assert_eq!(NetConf::parse(b"").unwrap_err().code, code::DECODE);
        assert_eq!(NetConf::parse(b"{oops").unwrap_err().code, code::DECODE);
        assert_eq!(
            NetConf::parse(b"[1,2]").unwrap_err().code,
            code::INVALID_CONFIG
        );
        assert_eq!(
            NetConf::parse(br#"{"cniVersion":3}"#).unwrap_err().code,
            code::INVALID_CONFIG
        );
        assert_eq!(
            NetConf::parse(br#"{"prevResult":"x"}"#).unwrap_err().code,
            code::INVALID_CONFIG
        );
    }

    #[test]
    fn version_is_checked_separately() {
        let c = NetConf::parse(br#"{"cniVersion":"9.9.9"}"#).unwrap();
        assert_eq!(
            c.check_version().unwrap_err().code,
            code::INCOMPATIBLE_VERSION
        );
        let c = NetConf::parse(br#"{"name":"x"}"#).unwrap();
        assert_eq!(c.cni_version, "0.1.0");
        c.check_version().unwrap();
    }
}
