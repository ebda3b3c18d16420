//! Helpers shared by the plugin's integration tests.
#![allow(dead_code)] // each test file uses a different subset

use std::collections::HashMap;
use std::ffi::OsString;
use std::io::Write;
use std::path::Path;
use std::process::{Command, Output, Stdio};

use linkerd_cni::cni::{Env, Invocation, NetConf};
use serde_json::{Value, json};

pub const BIN: &str = env!("CARGO_BIN_EXE_linkerd-cni");

/// The linkerd-cni entry of a conflist as the chart renders it, with chain
/// healing off (another part of the plugin, tested elsewhere), as a runtime
/// passes it to the last plugin of a Calico chain.
pub fn netconf(kubeconfig: &Path, linkerd: Value) -> Value {
    let mut l = json!({
        "incoming-proxy-port": 4143, "outgoing-proxy-port": 4140, "proxy-uid": 2102,
        "ports-to-redirect": [], "inbound-ports-to-ignore": ["4191", "4190"],
        "outbound-ports-to-ignore": [], "simulate": false,
        // Other suites on this machine may hold the legacy xtables lock.
        "use-wait-flag": true,
        "iptables-mode": "legacy", "ipv6": false
    });
    if let (Some(base), Value::Object(extra)) = (l.as_object_mut(), linkerd) {
        base.extend(extra);
    }
    json!({
        "cniVersion": "0.3.1",
        "name": "k8s-pod-network",
        "type": "linkerd-cni",
        "log_level": "debug",
        "chain_heal": false,
        "kubernetes": {"kubeconfig": kubeconfig.to_str().unwrap()},
        "linkerd": l,
        "prevResult": {
            "cniVersion": "0.3.1",
            "interfaces": [{"name": "cali5ad3b6c0e1f"}, {"name": "eth0", "sandbox": "/var/run/netns/x"}],
            "ips": [{"version": "4", "interface": 1, "address": "10.244.1.17/32"}],
            "dns": {}
        }
    })
}

/// The CNI_* variables of `command` for pod `namespace/name` in `netns`.
pub fn cni_env(command: &str, netns: &Path, pod: Option<(&str, &str)>) -> Vec<(String, String)> {
    let mut v = vec![
        ("CNI_COMMAND".to_string(), command.to_string()),
        ("CNI_CONTAINERID".into(), "0a1b2c3d4e5f".into()),
        ("CNI_NETNS".into(), netns.to_str().unwrap().into()),
        ("CNI_IFNAME".into(), "eth0".into()),
        ("CNI_PATH".into(), "/opt/cni/bin".into()),
    ];
    if let Some((ns, name)) = pod {
        v.push((
            "CNI_ARGS".into(),
            format!(
                "IgnoreUnknown=1;K8S_POD_NAMESPACE={ns};K8S_POD_NAME={name};K8S_POD_INFRA_CONTAINER_ID=0a1b2c3d4e5f"
            ),
        ));
    }
    v
}

/// An invocation as the protocol layer would build it.
pub fn invocation(env: &[(String, String)], conf: &Value) -> Invocation {
    let m: HashMap<&str, OsString> = env
        .iter()
        .map(|(k, v)| (k.as_str(), OsString::from(v)))
        .collect();
    Invocation {
        env: Env::from_lookup(|k| m.get(k).cloned()).expect("valid env"),
        conf: NetConf::parse(conf.to_string().as_bytes()).expect("valid conf"),
    }
}

/// Runs the plugin binary with exactly `env` (no PATH: it must find the
/// iptables binaries by itself) and `conf` on stdin.
pub fn run_plugin(env: &[(String, String)], conf: &Value) -> Output {
    let mut child = Command::new(BIN)
        .env_clear()
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn linkerd-cni");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(conf.to_string().as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}

/// Stdout as one JSON value.
pub fn stdout_json(o: &Output) -> Value {
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| {
        panic!(
            "stdout is not one JSON value ({e}): {:?}\nstderr: {}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        )
    })
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}
