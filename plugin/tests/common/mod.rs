//! Helpers shared by the plugin's integration tests (each test file uses a
//! different subset): running the plugin binary as a runtime does, the
//! entry and environment a runtime passes. Temp dirs, namespaces and the
//! chain fixtures are testkit's.
#![allow(dead_code)]

use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use linkerd_cni::cni::{CniError, Env, Invocation, NetConf};
use linkerd_cni::pod::{Plan, Stop};
use serde_json::{Value, json};
use testkit::{FakeApiServer, TempDir};

pub const BIN: &str = env!("CARGO_BIN_EXE_linkerd-cni");

/// A fake API server and a kubeconfig for it, in a temp dir that lives as
/// long as the cluster.
pub struct Cluster {
    pub api: FakeApiServer,
    pub kubeconfig: PathBuf,
    _dir: TempDir,
}

impl Cluster {
    /// Starts the server and writes its kubeconfig into a new temp dir
    /// named after `prefix`.
    pub fn start(prefix: &str) -> Cluster {
        let api = FakeApiServer::start();
        let dir = TempDir::new(prefix).unwrap();
        let kubeconfig = api.write_kubeconfig(dir.path()).unwrap();
        Cluster {
            api,
            kubeconfig,
            _dir: dir,
        }
    }
}

/// The linkerd-cni entry of a conflist as the installer renders the
/// shipped manifest's template, with chain healing off (another part of the
/// plugin, tested elsewhere), `state_dir` the kubeconfig's dir and
/// `linkerd` keys of `linkerd` on top, as a
/// runtime passes it to the last plugin of a Calico chain.
pub fn netconf(kubeconfig: &Path, linkerd: Value) -> Value {
    let mut c = testkit::chart::template_json();
    c["cniVersion"] = "0.3.1".into();
    c["name"] = "k8s-pod-network".into();
    c["log_level"] = "debug".into();
    c["chain_heal"] = false.into();
    c["kubernetes"]["kubeconfig"] = kubeconfig.to_str().unwrap().into();
    // The kubeconfig's own dir, not the machine's /run/linkerd-cni: no
    // installer heartbeat there unless a test writes one.
    if let Some(dir) = kubeconfig.parent() {
        c["state_dir"] = dir.to_str().unwrap().into();
    }
    c["linkerd"]["outbound-ports-to-ignore"] = json!([]);
    // Other suites on this machine may hold the legacy xtables lock.
    c["linkerd"]["use-wait-flag"] = true.into();
    if let (Some(base), Value::Object(extra)) = (c["linkerd"].as_object_mut(), linkerd) {
        base.extend(extra);
    }
    c["prevResult"] = json!({
        "cniVersion": "0.3.1",
        "interfaces": [{"name": "cali5ad3b6c0e1f"}, {"name": "eth0", "sandbox": "/var/run/netns/x"}],
        "ips": [{"version": "4", "interface": 1, "address": "10.244.1.17/32"}],
        "dns": {}
    });
    c
}

/// The CNI_* variables of `command` for a pod of an exempt namespace
/// (`kube-system`): the pass-through path, which needs no API server.
pub fn exempt_env(command: &str) -> Vec<(&str, &str)> {
    vec![
        ("CNI_COMMAND", command),
        ("CNI_CONTAINERID", "3f1c2b9a7e"),
        ("CNI_NETNS", "/var/run/netns/cni-1234"),
        ("CNI_IFNAME", "eth0"),
        ("CNI_PATH", "/opt/cni/bin"),
        (
            "CNI_ARGS",
            "IgnoreUnknown=1;K8S_POD_NAMESPACE=kube-system;K8S_POD_NAME=coredns-1",
        ),
    ]
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

/// Runs the plugin binary with exactly `vars` (no PATH unless given: it
/// must find the iptables binaries by itself) and `stdin`.
pub fn run<K: AsRef<OsStr>, V: AsRef<OsStr>>(vars: &[(K, V)], stdin: &[u8]) -> Output {
    let mut child = Command::new(BIN)
        .env_clear()
        .envs(vars.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn linkerd-cni");
    // A plugin that exits without reading stdin closes the pipe; its
    // output is what the tests judge.
    let _ = child.stdin.take().unwrap().write_all(stdin);
    child.wait_with_output().unwrap()
}

/// Runs the plugin binary in a private mount namespace after `setup`
/// (shell, `$1`.. being `args`), with exactly `env` plus a standard PATH
/// and `conf` on stdin: for a node whose files differ from this machine's.
pub fn run_in_mount_ns(
    setup: &str,
    args: &[&OsStr],
    env: &[(String, String)],
    conf: &Value,
) -> Output {
    testkit::require_root("runs the plugin in a private mount namespace");
    let n = args.len() + 1;
    let mut child = Command::new("unshare")
        .args(["--mount", "--propagation", "private", "--", "/bin/sh", "-c"])
        .arg(format!("{setup} && exec \"${{{n}}}\""))
        .arg("sh")
        .args(args)
        .arg(BIN)
        .env_clear()
        .envs(env.iter().map(|(k, v)| (k, v)))
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("cannot run unshare (util-linux): this test needs it, and root");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(conf.to_string().as_bytes())
        .unwrap();
    let o = child.wait_with_output().unwrap();
    assert!(
        !stderr(&o).contains("unshare failed") && !stderr(&o).contains("mount:"),
        "cannot set up the private mount namespace (needs root): {}",
        stderr(&o)
    );
    o
}

/// [`run`] with `conf` on stdin.
pub fn run_plugin(env: &[(String, String)], conf: &Value) -> Output {
    run(env, conf.to_string().as_bytes())
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

/// `linkerd-cni chain ARGS`, as an operator runs it (no environment).
pub fn chain(args: &[&str]) -> Output {
    Command::new(BIN)
        .arg("chain")
        .args(args)
        .env_clear()
        .output()
        .expect("run linkerd-cni chain")
}

/// Exit code, stdout and stderr of `o`, for assertion messages.
pub fn text(o: &Output) -> String {
    format!(
        "exit {:?}\nstdout:\n{}\nstderr:\n{}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// The plan of a decision that meshes the pod; panics with the reason of a
/// pass-through.
pub fn mesh(d: Result<Plan, Stop>) -> Plan {
    match d {
        Ok(p) => p,
        Err(Stop::PassThrough { why, .. }) => {
            panic!("expected a meshed pod, got pass-through: {why}")
        }
        Err(Stop::Failed(e)) => panic!("expected a meshed pod, got {e}"),
    }
}

/// The error a pod's decision failed with.
pub fn failed(d: Result<Plan, Stop>) -> CniError {
    match d {
        Err(Stop::Failed(e)) => e,
        other => panic!("expected an error, got {other:?}"),
    }
}

/// A plan's outbound ports to ignore, as `a,b-c`.
pub fn outbound_ignored(plan: &Plan) -> String {
    plan.spec
        .outbound_ports_to_ignore
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(",")
}
