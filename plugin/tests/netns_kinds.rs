//! A `CNI_NETNS` that names something other than a network namespace (a
//! FIFO, a socket, a device, a directory, a regular file, a dangling
//! symlink) is refused at once, by a meshed ADD and a CHECK alike, with an
//! error naming the path; never a hang (opening a FIFO blocks until a
//! writer comes).

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use serde_json::{Value, json};
use testkit::TempDir;
use testkit::objects::Pod;

use common::{BIN, Cluster, cni_env, netconf, stderr};

/// Far past what a refusal takes, far below the kubelet's 2 minutes.
const LIMIT: Duration = Duration::from_secs(30);

/// Runs the plugin; `None` when it was still running after [`LIMIT`]
/// (then killed).
fn run_bounded(env: &[(String, String)], conf: &Value) -> Option<Output> {
    let dir = TempDir::new("lcni-netns-out").unwrap();
    let stdin = std::fs::File::open(write_conf(dir.path(), conf)).unwrap();
    let mut cmd = Command::new(BIN);
    cmd.env_clear()
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(stdin);
    testkit::output_within(&mut cmd, LIMIT)
}

fn write_conf(dir: &Path, conf: &Value) -> PathBuf {
    let p = dir.join("stdin.json");
    std::fs::write(&p, conf.to_string()).unwrap();
    p
}

#[test]
fn a_cni_netns_that_is_not_a_network_namespace_is_refused_at_once() {
    let cluster = Cluster::start("lcni-netns-kinds");
    cluster.api.add_pod(&Pod::meshed("emojivoto", "web-0"));
    cluster.api.add_namespace("emojivoto", &[]);
    let dir = TempDir::new("lcni-netns-kinds-files").unwrap();
    let fifo = dir.path().join("fifo");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    let socket = dir.path().join("socket");
    let _listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
    let regular = dir.path().join("regular");
    std::fs::write(&regular, "not a namespace").unwrap();
    let dangling = dir.path().join("dangling");
    std::os::unix::fs::symlink(dir.path().join("missing"), &dangling).unwrap();
    let kinds = [
        ("a FIFO", fifo),
        ("a socket", socket),
        ("a device", PathBuf::from("/dev/zero")),
        ("a directory", dir.path().to_path_buf()),
        ("a regular file", regular),
        ("a dangling symlink", dangling),
    ];
    let conf = netconf(&cluster.kubeconfig, json!({}));
    for (kind, path) in &kinds {
        for command in ["ADD", "CHECK"] {
            let env = cni_env(command, path, Some(("emojivoto", "web-0")));
            let out = run_bounded(&env, &conf)
                .unwrap_or_else(|| panic!("{command} with {kind} as CNI_NETNS hung"));
            assert!(!out.status.success(), "{command} {kind}: passed");
            let v: Value = serde_json::from_slice(&out.stdout)
                .unwrap_or_else(|e| panic!("{command} {kind}: {e}: {}", stderr(&out)));
            let text = format!("{} {}", v["msg"], v["details"]);
            assert!(
                text.contains(path.to_str().unwrap()),
                "{command} {kind}: {text}"
            );
            let expected = if *kind == "a dangling symlink" {
                "cannot open network namespace"
            } else {
                "not a network namespace"
            };
            assert!(text.contains(expected), "{command} {kind}: {text}");
        }
    }
}
