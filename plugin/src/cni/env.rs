//! The `CNI_*` environment a runtime invokes a plugin with.
//!
//! Parsing is separated from the process environment (`Env::from_lookup`) so
//! that tests and the fuzz property can feed any bytes at all.

use std::ffi::OsString;
use std::fmt;
use std::path::PathBuf;

use super::error::{CniError, code};

/// The operation a runtime asks for: each variant is the spec's name of
/// it, written in upper case.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command {
    Add,
    Del,
    Check,
    Version,
    Gc,
    Status,
}

impl Command {
    const ALL: [Command; 6] = [
        Command::Add,
        Command::Del,
        Command::Check,
        Command::Version,
        Command::Gc,
        Command::Status,
    ];

    pub fn parse(s: &str) -> Option<Command> {
        Command::ALL.into_iter().find(|c| c.to_string() == s)
    }
}

impl fmt::Display for Command {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&format!("{self:?}").to_ascii_uppercase())
    }
}

/// `CNI_ARGS`: `K=V;K=V`, in the order given.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CniArgs {
    pairs: Vec<(String, String)>,
}

impl CniArgs {
    /// Parses `K=V;K=V`. Empty segments are tolerated (a trailing `;` is
    /// common); a segment without `=` or with an empty key is an error, as in
    /// libcni.
    pub fn parse(s: &str) -> Result<CniArgs, CniError> {
        let mut pairs = Vec::new();
        for seg in s.split(';') {
            if seg.is_empty() {
                continue;
            }
            match seg.split_once('=') {
                Some((k, v)) if !k.is_empty() => pairs.push((k.to_string(), v.to_string())),
                _ => {
                    return Err(CniError::new(
                        code::INVALID_ENV,
                        "invalid CNI_ARGS",
                        format!("segment {seg:?} is not of the form KEY=VALUE"),
                    ));
                }
            }
        }
        Ok(CniArgs { pairs })
    }

    /// The last value given for `key` (later pairs override earlier ones).
    pub fn get(&self, key: &str) -> Option<&str> {
        self.pairs
            .iter()
            .rev()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// `K8S_POD_NAMESPACE`, when present and not empty.
    pub fn pod_namespace(&self) -> Option<&str> {
        self.get("K8S_POD_NAMESPACE").filter(|s| !s.is_empty())
    }

    /// `K8S_POD_NAME`, when present and not empty.
    pub fn pod_name(&self) -> Option<&str> {
        self.get("K8S_POD_NAME").filter(|s| !s.is_empty())
    }

    /// What names the pod across its sandboxes: `K8S_POD_UID` when given,
    /// else `namespace/name`. A runtime gives every RunPodSandbox attempt
    /// a new container id, so the container id cannot follow one pod
    /// through the kubelet's retries.
    pub fn pod_key(&self) -> Option<String> {
        if let Some(uid) = self.get("K8S_POD_UID").filter(|s| !s.is_empty()) {
            return Some(format!("uid:{uid}"));
        }
        Some(format!("{}/{}", self.pod_namespace()?, self.pod_name()?))
    }
}

/// The parsed environment of one invocation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Env {
    pub command: Command,
    /// `CNI_CONTAINERID`; validated for ADD and CHECK.
    pub container_id: Option<String>,
    /// `CNI_NETNS`; required for ADD and CHECK, may be empty or stale on DEL.
    pub netns: Option<PathBuf>,
    pub args: CniArgs,
}

impl Env {
    /// Reads and validates the environment through `lookup` (e.g.
    /// `std::env::var_os`).
    ///
    /// Only what the command needs is required: DEL, GC and STATUS must not
    /// fail over variables they never use (a failing DEL in a chain blocks the
    /// primary's DEL and leaks the pod's IP).
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<OsString>) -> Result<Env, CniError> {
        let command = command(&lookup)?;
        let strict = matches!(command, Command::Add | Command::Check);
        let text = |name: &str| -> Result<Option<String>, CniError> {
            match lookup(name) {
                None => Ok(None),
                Some(v) => match v.into_string() {
                    Ok(s) => Ok(Some(s)),
                    Err(_) if strict => Err(CniError::new(
                        code::INVALID_ENV,
                        format!("{name} is not valid UTF-8"),
                        "",
                    )),
                    Err(v) => Ok(Some(v.to_string_lossy().into_owned())),
                },
            }
        };

        let container_id = text("CNI_CONTAINERID")?.filter(|s| !s.is_empty());
        let netns = lookup("CNI_NETNS")
            .filter(|v| !v.is_empty())
            .map(PathBuf::from);
        let ifname = text("CNI_IFNAME")?.filter(|s| !s.is_empty());
        let args = match CniArgs::parse(&text("CNI_ARGS")?.unwrap_or_default()) {
            Ok(a) => a,
            Err(e) if strict => return Err(e),
            Err(_) => CniArgs::default(),
        };

        // What ADD and CHECK need and DEL, GC and STATUS may lack.
        if strict {
            match container_id.as_deref() {
                None => return Err(missing("CNI_CONTAINERID")),
                Some(id) if !valid_container_id(id) => {
                    return Err(CniError::new(
                        code::INVALID_ENV,
                        format!("invalid CNI_CONTAINERID {id:?}"),
                        "a container ID starts with a letter or digit and holds only letters, digits, '_', '.' and '-'",
                    ));
                }
                Some(_) => {}
            }
            if netns.is_none() {
                return Err(missing("CNI_NETNS"));
            }
            if ifname.is_none() {
                return Err(missing("CNI_IFNAME"));
            }
        }

        Ok(Env {
            command,
            container_id,
            netns,
            args,
        })
    }
}

/// `CNI_COMMAND`, which every invocation needs.
fn command(lookup: impl Fn(&str) -> Option<OsString>) -> Result<Command, CniError> {
    let Some(raw) = lookup("CNI_COMMAND") else {
        return Err(CniError::new(
            code::INVALID_ENV,
            "CNI_COMMAND is not set",
            "linkerd-cni is a CNI plugin: the container runtime runs it with CNI_COMMAND set",
        ));
    };
    let s = raw.to_string_lossy();
    Command::parse(&s).ok_or_else(|| {
        CniError::new(
            code::INVALID_ENV,
            format!("unknown CNI_COMMAND {s:?}"),
            "expected one of ADD, DEL, CHECK, VERSION, GC, STATUS",
        )
    })
}

/// The error for a `CNI_*` variable this command needs.
pub(crate) fn missing(name: &str) -> CniError {
    CniError::new(
        code::INVALID_ENV,
        format!("{name} is not set"),
        "the container runtime must set it for this command",
    )
}

/// The spec's rule, upper case included (runtimes other than containerd use
/// it).
pub fn valid_container_id(id: &str) -> bool {
    let mut chars = id.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphanumeric())
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env(vars: &[(&str, &str)]) -> Result<Env, CniError> {
        let m: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Env::from_lookup(|k| m.get(k).map(OsString::from))
    }

    const ADD: &[(&str, &str)] = &[
        ("CNI_COMMAND", "ADD"),
        ("CNI_CONTAINERID", "Abc-1_2.3"),
        ("CNI_NETNS", "/var/run/netns/x"),
        ("CNI_IFNAME", "eth0"),
        ("CNI_PATH", "/opt/cni/bin::/usr/lib/cni"),
        (
            "CNI_ARGS",
            "IgnoreUnknown=1;K8S_POD_NAMESPACE=emojivoto;K8S_POD_NAME=web-1;K8S_POD_INFRA_CONTAINER_ID=abc;",
        ),
    ];

    #[test]
    fn full_add_environment() {
        let e = env(ADD).unwrap();
        assert_eq!(e.command, Command::Add);
        assert_eq!(e.container_id.as_deref(), Some("Abc-1_2.3"));
        assert_eq!(e.args.pod_namespace(), Some("emojivoto"));
        assert_eq!(e.args.pod_name(), Some("web-1"));
        assert_eq!(e.args.get("IgnoreUnknown"), Some("1"));
    }

    #[test]
    fn add_requires_what_it_uses() {
        for drop in ["CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME"] {
            let vars: Vec<_> = ADD.iter().copied().filter(|(k, _)| *k != drop).collect();
            let err = env(&vars).unwrap_err();
            assert_eq!(err.code, code::INVALID_ENV, "{drop}");
            assert!(err.msg.contains(drop), "{}", err.msg);
        }
    }

    #[test]
    fn del_tolerates_missing_and_empty_netns() {
        let e = env(&[("CNI_COMMAND", "DEL"), ("CNI_NETNS", "")]).unwrap();
        assert_eq!(e.command, Command::Del);
        assert_eq!(e.netns, None);
        let e = env(&[("CNI_COMMAND", "DEL"), ("CNI_ARGS", "garbage")]).unwrap();
        assert_eq!(e.args, CniArgs::default());
    }

    #[test]
    fn bad_command_and_args_are_env_errors() {
        assert_eq!(env(&[]).unwrap_err().code, code::INVALID_ENV);
        assert_eq!(
            env(&[("CNI_COMMAND", "add")]).unwrap_err().code,
            code::INVALID_ENV
        );
        let mut vars = ADD.to_vec();
        vars.retain(|(k, _)| *k != "CNI_ARGS");
        vars.push(("CNI_ARGS", "A=1;novalue"));
        assert_eq!(env(&vars).unwrap_err().code, code::INVALID_ENV);
    }

    #[test]
    fn container_id_rules() {
        assert!(valid_container_id("ABCdef0123"));
        assert!(valid_container_id("a.b_c-d"));
        assert!(!valid_container_id("-abc"));
        assert!(!valid_container_id("a/b"));
        assert!(!valid_container_id(""));
    }

    #[test]
    fn a_pod_is_named_by_its_uid_else_by_namespace_and_name() {
        let key = |s: &str| CniArgs::parse(s).unwrap().pod_key();
        assert_eq!(
            key("K8S_POD_NAMESPACE=a;K8S_POD_NAME=b;K8S_POD_UID=u-1;K8S_POD_INFRA_CONTAINER_ID=c"),
            Some("uid:u-1".into())
        );
        assert_eq!(
            key("K8S_POD_NAMESPACE=a;K8S_POD_NAME=b;K8S_POD_UID="),
            Some("a/b".into())
        );
        assert_eq!(key("K8S_POD_NAME=b"), None);
        assert_eq!(key(""), None);
    }

    #[test]
    fn later_args_override_earlier() {
        let a = CniArgs::parse("K8S_POD_NAME=a;K8S_POD_NAME=b;X=").unwrap();
        assert_eq!(a.pod_name(), Some("b"));
        assert_eq!(a.get("X"), Some(""));
        assert_eq!(CniArgs::parse("=v").unwrap_err().code, code::INVALID_ENV);
    }
}
