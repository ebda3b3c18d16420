//! The CNI protocol: environment, stdin config, VERSION negotiation, results
//! and errors, and the dispatch of one invocation to a [`Plugin`].
//!
//! Our own thin layer rather than the `cni-plugin` crate, which rejects
//! cniVersion 0.3.x, knows neither GC nor STATUS, refuses upper-case container
//! IDs and exits the process from inside its loader.
//!
//! [`run`] is pure apart from what the plugin does: environment and stdin go
//! in, stdout bytes and an exit code come out, so every path (including any
//! bytes at all on stdin) is testable without spawning a process.

pub mod env;
pub mod error;
pub mod netconf;
pub mod version;

use std::ffi::OsString;
use std::io::Read;

use serde_json::Value;

pub use env::{CniArgs, Command, Env};
pub use error::{CniError, code};
pub use netconf::NetConf;

/// One invocation: the parsed environment and stdin config.
#[derive(Debug, Clone)]
pub struct Invocation {
    pub env: Env,
    pub conf: NetConf,
}

/// What a plugin does for each command. Only ADD produces a result; the
/// others report success or an error. DEL and GC succeed without asking
/// it: linkerd-cni's rules live in the pod's network namespace and go with
/// it, so there is nothing to release.
pub trait Plugin {
    fn add(&self, inv: &Invocation) -> Result<Value, CniError>;
    fn check(&self, _inv: &Invocation) -> Result<(), CniError> {
        Ok(())
    }
    fn status(&self, _inv: &Invocation) -> Result<(), CniError> {
        Ok(())
    }
}

/// The answer to the runtime: the bytes for stdout (a result, an error
/// object, or nothing) and the exit code.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    pub stdout: Vec<u8>,
    pub exit_code: u8,
}

impl Reply {
    fn ok(v: Option<Value>) -> Reply {
        Reply {
            stdout: v.as_ref().map(json_line).unwrap_or_default(),
            exit_code: 0,
        }
    }

    /// The error JSON on stdout, exit 1.
    pub fn error(e: &CniError, cni_version: &str) -> Reply {
        Reply {
            stdout: json_line(&e.to_json(cni_version)),
            exit_code: 1,
        }
    }
}

/// `v` as one line of JSON.
fn json_line(v: &Value) -> Vec<u8> {
    let mut line = serde_json::to_vec(v).unwrap_or_default();
    line.push(b'\n');
    line
}

/// Reads stdin up to [`netconf::MAX_STDIN`].
pub fn read_stdin(mut r: impl Read) -> Result<Vec<u8>, CniError> {
    let mut buf = Vec::new();
    r.by_ref()
        .take(netconf::MAX_STDIN as u64 + 1)
        .read_to_end(&mut buf)
        .map_err(|e| {
            CniError::new(
                code::IO,
                "cannot read the network config from stdin",
                e.to_string(),
            )
        })?;
    if buf.len() > netconf::MAX_STDIN {
        return Err(CniError::new(
            code::INVALID_CONFIG,
            "network config on stdin is too large",
            format!("more than {} bytes", netconf::MAX_STDIN),
        ));
    }
    Ok(buf)
}

/// Runs one invocation of `plugin`.
///
/// DEL, GC and STATUS never fail over input they do not need: a failing DEL
/// blocks the primary plugin's DEL (leaking the pod's IP), and a failing
/// STATUS marks the whole node not ready. Their input problems are logged.
///
/// That includes a `cniVersion` we do not support. The spec has a plugin
/// answer code 1 to it, but for linkerd-cni DEL and GC release nothing and
/// STATUS only reports, so refusing would trade no protection for a leaked
/// pod IP or a not-ready node; a config we cannot read already failed its
/// ADD with code 1. ADD and CHECK do answer code 1.
pub fn run(lookup: impl Fn(&str) -> Option<OsString>, stdin: &[u8], plugin: &dyn Plugin) -> Reply {
    let env = match Env::from_lookup(&lookup) {
        Ok(env) => env,
        Err(e) => return Reply::error(&e, &requested_version(stdin)),
    };
    // Before anything about the invocation is logged: every line names
    // its container and pod.
    let pod = env.args.pod_namespace().zip(env.args.pod_name());
    crate::logging::set_context(crate::logging::invocation_context(
        env.container_id.as_deref(),
        pod,
    ));

    if env.command == Command::Version {
        return Reply::ok(Some(version::version_info(&requested_version(stdin))));
    }

    let tolerant = matches!(env.command, Command::Del | Command::Gc | Command::Status);
    let conf = match NetConf::parse(stdin).and_then(|c| c.check_version().map(|()| c)) {
        Ok(c) => c,
        Err(e) if tolerant => {
            log::warn!("{}: ignoring unusable network config: {e}", env.command);
            return Reply::ok(None);
        }
        Err(e) => return Reply::error(&e, &requested_version(stdin)),
    };

    let inv = Invocation { env, conf };
    let res = match inv.env.command {
        Command::Add => plugin.add(&inv).map(Some),
        Command::Del | Command::Gc => Ok(None),
        Command::Check => plugin.check(&inv).map(|()| None),
        Command::Status => plugin.status(&inv).map(|()| None),
        Command::Version => Ok(Some(version::version_info(&inv.conf.cni_version))),
    };
    match res {
        Ok(v) => Reply::ok(v),
        Err(e) => {
            log::error!("{} failed: {e}", inv.env.command);
            Reply::error(&e, &inv.conf.cni_version)
        }
    }
}

/// The `cniVersion` string of stdin, if stdin is a JSON object that has
/// one, else the latest version.
fn requested_version(stdin: &[u8]) -> String {
    serde_json::from_slice::<Value>(stdin)
        .ok()
        .and_then(|v| v.get("cniVersion")?.as_str().map(String::from))
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| version::LATEST.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    /// A chained plugin that only passes the result through.
    struct PassThrough;
    impl Plugin for PassThrough {
        fn add(&self, inv: &Invocation) -> Result<Value, CniError> {
            Ok(inv.conf.pass_through_result())
        }
    }

    fn invoke(vars: &[(&str, &str)], stdin: &[u8]) -> Reply {
        let m: HashMap<String, OsString> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), OsString::from(v)))
            .collect();
        run(|k| m.get(k).cloned(), stdin, &PassThrough)
    }

    fn json(o: &Reply) -> Value {
        serde_json::from_slice(&o.stdout).expect("stdout is one JSON value")
    }

    const ADD: &[(&str, &str)] = &[
        ("CNI_COMMAND", "ADD"),
        ("CNI_CONTAINERID", "c1"),
        ("CNI_NETNS", "/var/run/netns/c1"),
        ("CNI_IFNAME", "eth0"),
        ("CNI_PATH", "/opt/cni/bin"),
    ];

    #[test]
    fn version_echoes_the_request_or_latest() {
        let o = invoke(&[("CNI_COMMAND", "VERSION")], br#"{"cniVersion":"0.3.1"}"#);
        assert_eq!(o.exit_code, 0);
        assert_eq!(json(&o), version::version_info("0.3.1"));
        let o = invoke(&[("CNI_COMMAND", "VERSION")], b"");
        assert_eq!(json(&o)["cniVersion"], "1.1.0");
    }

    #[test]
    fn add_without_prev_result_prints_an_empty_result() {
        let o = invoke(
            ADD,
            br#"{"cniVersion":"0.4.0","name":"n","type":"linkerd-cni"}"#,
        );
        assert_eq!(o.exit_code, 0);
        assert_eq!(json(&o), version::empty_result("0.4.0"));
    }

    #[test]
    fn garbage_is_a_decode_error_on_stdout() {
        let o = invoke(ADD, b"\x00\xffnot json");
        assert_ne!(o.exit_code, 0);
        let v = json(&o);
        assert_eq!(v["code"], code::DECODE);
        assert_eq!(v["cniVersion"], version::LATEST);
    }

    #[test]
    fn errors_echo_the_config_version() {
        let o = invoke(&ADD[..1], br#"{"cniVersion":"0.3.1"}"#);
        let v = json(&o);
        assert_eq!(v["code"], code::INVALID_ENV);
        assert_eq!(v["cniVersion"], "0.3.1");
        let o = invoke(ADD, br#"{"cniVersion":"7.0.0"}"#);
        assert_eq!(json(&o)["code"], code::INCOMPATIBLE_VERSION);
    }

    #[test]
    fn del_gc_status_succeed_on_anything() {
        for cmd in ["DEL", "GC", "STATUS"] {
            for stdin in [
                &b""[..],
                b"garbage",
                br#"{"cniVersion":"0.3.1"}"#,
                br#"{"cniVersion":"9.9.9"}"#,
                br#"{"cniVersion":"1.0"}"#,
            ] {
                let o = invoke(&[("CNI_COMMAND", cmd), ("CNI_NETNS", "/nowhere")], stdin);
                assert_eq!(o.exit_code, 0, "{cmd} {stdin:?}");
                assert!(o.stdout.is_empty(), "{cmd} printed {:?}", o.stdout);
            }
        }
    }

    mod fuzz {
        use super::*;
        use proptest::prelude::*;

        fn command() -> impl Strategy<Value = String> {
            prop_oneof![
                Just("ADD".to_string()),
                Just("DEL".to_string()),
                Just("CHECK".to_string()),
                Just("VERSION".to_string()),
                Just("GC".to_string()),
                Just("STATUS".to_string()),
                ".{0,8}",
            ]
        }

        fn json_value() -> impl Strategy<Value = Value> {
            let leaf = prop_oneof![
                Just(Value::Null),
                any::<bool>().prop_map(Value::Bool),
                any::<i64>().prop_map(Value::from),
                ".{0,10}".prop_map(Value::String),
            ];
            leaf.prop_recursive(4, 32, 6, |inner| {
                prop_oneof![
                    proptest::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
                    proptest::collection::vec(
                        (
                            prop_oneof![
                                Just("cniVersion".to_string()),
                                Just("prevResult".to_string()),
                                Just("linkerd".to_string()),
                                ".{0,6}"
                            ],
                            inner,
                        ),
                        0..6
                    )
                    .prop_map(|kv| Value::Object(kv.into_iter().collect())),
                ]
            })
        }

        /// Bytes that are sometimes JSON, sometimes nearly JSON.
        fn stdin() -> impl Strategy<Value = Vec<u8>> {
            prop_oneof![
                proptest::collection::vec(any::<u8>(), 0..256),
                json_value().prop_map(|v| v.to_string().into_bytes()),
                (any::<String>(), any::<bool>(), any::<String>()).prop_map(|(v, p, junk)| {
                    let prev = if p { r#","prevResult":{"ips":[]}"# } else { "" };
                    format!(r#"{{"cniVersion":{v:?}{prev}{junk}}}"#).into_bytes()
                }),
            ]
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(2000))]
            /// Whatever arrives, the answer is one JSON value (or nothing for
            /// DEL/CHECK/GC/STATUS success) and an error exits non-zero.
            #[test]
            fn never_panics_and_stdout_is_well_formed(
                cmd in command(),
                id in ".{0,12}",
                netns in ".{0,12}",
                args in ".{0,40}",
                input in stdin(),
            ) {
                let o = invoke(
                    &[("CNI_COMMAND", &cmd), ("CNI_CONTAINERID", &id), ("CNI_NETNS", &netns),
                      ("CNI_IFNAME", "eth0"), ("CNI_ARGS", &args)],
                    &input,
                );
                if o.stdout.is_empty() {
                    prop_assert_eq!(o.exit_code, 0);
                } else {
                    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
                    prop_assert_eq!(v.get("code").is_some(), o.exit_code != 0);
                    prop_assert!(v.get("cniVersion").is_some());
                }
            }
        }
    }
}
