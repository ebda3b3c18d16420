//! The real `linkerd-cni-installer` running against a node, as the
//! DaemonSet container runs it against the host, through testkit's
//! launcher.
//!
//! The container's view is built from temp dirs: a mount prefix
//! (`CONTAINER_MOUNT_PREFIX`) under which the node's directory appears at
//! its host path (a symlink standing in for the `/host` bind mount), the
//! image's bin dir holding the built `linkerd-cni`, and a service-account
//! dir holding the fake API server's token and CA. The host view
//! (`DEST_CNI_NET_DIR`, `DEST_CNI_BIN_DIR`) is the node's conf and bin
//! dirs, which is what the installer must write into the entry and what the
//! plugin, running in the host's file system, reads.
//!
//! The process runs in the node namespace and is killed on drop (also when
//! the test fails, when its log is printed).

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::Value;
use testkit::FakeApiServer;
use testkit::chart::KUBECONFIG_PLACEHOLDER;
use testkit::installer::{ChartEnv, InstallerProcess};

use crate::artifacts;
use crate::chains;
use crate::node::Node;

/// A running installer: testkit's launcher.
pub type Installer = InstallerProcess;

/// Starts `linkerd-cni-installer` (its reconcile loop) for `node`, talking
/// to `api`, with the chart's environment plus `extra` (e.g.
/// `LINKERD_CNI_WATCH`, `LINKERD_CNI_RESYNC_SECONDS`). The entry template
/// is [`template`]`(node)`.
pub fn start(node: &Node, api: &FakeApiServer, extra: &[(&str, &str)]) -> Installer {
    start_with_token(node, api, api.token(), extra)
}

/// [`start`], with `token` (e.g. [`FakeApiServer::issue_token`], one per
/// installer pod, revocable) as its service-account token.
pub fn start_with_token(
    node: &Node,
    api: &FakeApiServer,
    token: &str,
    extra: &[(&str, &str)],
) -> Installer {
    spawn(node, api, token, extra, None)
}

/// [`start`], confined as deploy/ runs it: uid 0 with only the
/// capabilities `caps` (names without `CAP_`, e.g. `CHOWN`), through
/// util-linux's `setpriv`, so that root is bound by owners and modes.
pub fn start_confined(
    node: &Node,
    api: &FakeApiServer,
    caps: &[&str],
    extra: &[(&str, &str)],
) -> Installer {
    spawn(node, api, api.token(), extra, Some(caps))
}

fn spawn(
    node: &Node,
    api: &FakeApiServer,
    token: &str,
    extra: &[(&str, &str)],
    caps: Option<&[&str]>,
) -> Installer {
    let root = node.scratch_dir().join(testkit::unique_name("installer"));
    let prefix = mount_prefix(node);
    let image_bin = root.join("image-bin");
    let sa_dir = root.join("serviceaccount");
    for d in [&prefix, &image_bin, &sa_dir] {
        mkdir_p(d);
    }
    // The host's view of the node dir, under the prefix: what a /host bind
    // mount gives the container. Made by the node's first installer.
    let mounted = prefix.join(node.dir().strip_prefix("/").unwrap_or(node.dir()));
    if let Some(parent) = mounted.parent() {
        mkdir_p(parent);
    }
    if let Err(e) = std::os::unix::fs::symlink(node.dir(), &mounted)
        && e.kind() != std::io::ErrorKind::AlreadyExists
    {
        panic!(
            "cannot link {} -> {}: {e}",
            mounted.display(),
            node.dir().display()
        );
    }
    // The image's binaries: the plugin, as built.
    symlink(&artifacts::linkerd_cni(), &image_bin.join("linkerd-cni"));
    for (name, content) in [
        ("token", token),
        ("ca.crt", api.ca_pem()),
        ("namespace", "linkerd-cni"),
    ] {
        let p = sa_dir.join(name);
        std::fs::write(&p, content).unwrap_or_else(|e| panic!("cannot write {}: {e}", p.display()));
    }
    let env = ChartEnv {
        mount_prefix: prefix,
        image_bin,
        service_account: sa_dir,
        dest_conf_dir: node.conf_dir(),
        dest_bin_dir: node.bin_dir(),
        api_host: api.addr().ip().to_string(),
        api_port: api.addr().port(),
        template: template(node),
    };
    let mut cmd = match caps {
        None => node.netns().command(artifacts::installer()),
        Some(caps) => {
            let bounding = std::iter::once("-all".to_string())
                .chain(caps.iter().map(|c| format!("+{}", c.to_ascii_lowercase())))
                .collect::<Vec<_>>()
                .join(",");
            // By its path: the environment is cleared below.
            let setpriv = ["/usr/bin/setpriv", "/bin/setpriv"]
                .into_iter()
                .find(|p| Path::new(p).is_file())
                .expect("setpriv (util-linux) installed");
            let mut c = node.netns().command(setpriv);
            c.args(["--inh-caps=-all", "--ambient-caps=-all"])
                .arg(format!("--bounding-set={bounding}"))
                .arg("--")
                .arg(artifacts::installer());
            c
        }
    };
    cmd.env_clear().envs(env.vars()).envs(extra.iter().copied());
    InstallerProcess::spawn(cmd, root.join("installer.log"))
}

/// The variables that make an installer the node agent too, as deploy/'s
/// one container runs it: the repair controller beside the loop, as pod
/// `pod` on this node, answering the plugin's lookups on
/// [`agent_socket`]. Its API client authenticates with `token`: kube-rs
/// would read a pod's token at the fixed in-cluster path, which this
/// harness cannot mount, so a kubeconfig (`KUBECONFIG`, which the installer
/// itself ignores) carries it; give the agent a token of its own to tell
/// its requests from the plugin's.
pub fn agent_vars(
    node: &Node,
    api: &FakeApiServer,
    pod: &str,
    token: &str,
) -> Vec<(&'static str, String)> {
    let kubeconfig = node
        .scratch_dir()
        .join(testkit::unique_name("agent-kubeconfig"));
    std::fs::write(&kubeconfig, api.client_kubeconfig(token))
        .unwrap_or_else(|e| panic!("cannot write {}: {e}", kubeconfig.display()));
    let path = |p: &Path| p.display().to_string();
    vec![
        ("LINKERD_CNI_REPAIR_CONTROLLER_NODE_NAME", node.kube_name()),
        ("LINKERD_CNI_REPAIR_CONTROLLER_POD_NAME", pod.to_string()),
        // Loopback, any port: the admin server's default is every address
        // on 9990.
        (
            "LINKERD_CNI_REPAIR_CONTROLLER_ADMIN_ADDR",
            "127.0.0.1:0".into(),
        ),
        (
            "LINKERD_CNI_REPAIR_CONTROLLER_CNI_NET_DIR",
            path(&node.conf_dir()),
        ),
        (
            "LINKERD_CNI_REPAIR_CONTROLLER_STATE_DIR",
            path(&node.state_dir()),
        ),
        ("KUBECONFIG", path(&kubeconfig)),
    ]
}

/// Where an installer started with [`agent_vars`] answers the plugin's
/// lookups: the socket in the plugin's state dir.
pub fn agent_socket(node: &Node) -> PathBuf {
    node.state_dir().join(linkerd_cni_lookup::SOCKET)
}

/// The host's root as `node`'s installers see it, their
/// `CONTAINER_MOUNT_PREFIX` (one per node, shared by its installers): the
/// node's dir at its host path, and what a test puts there for them to
/// read, such as a containerd node's config
/// ([`crate::cri::CriNode::start`]).
pub fn mount_prefix(node: &Node) -> PathBuf {
    node.scratch_dir().join("host")
}

/// Writes the primary's `conf` as `file`, starts the installer with its
/// watch and a `resync` period, and waits (at most `within`) until the file
/// is chained; panics with the installer's log otherwise.
pub fn start_and_chain(
    node: &Node,
    api: &FakeApiServer,
    file: &str,
    conf: &Value,
    resync: Duration,
    within: Duration,
) -> Installer {
    node.write_conf(file, conf);
    let inst = start(
        node,
        api,
        &[("LINKERD_CNI_RESYNC_SECONDS", &resync.as_secs().to_string())],
    );
    node.wait_healthy(&expected_entry(node), conf, within)
        .unwrap_or_else(|e| panic!("{e}\n{}", inst.log()));
    inst
}

/// The manifest's `cni_network_config` for this node: the chart's template
/// with the node's `state_dir` (so nothing writes the machine's
/// /run/linkerd-cni) and [`chains::linkerd_entry`]'s log level; the
/// kubeconfig path stays the placeholder and `cni_conf_dir` unset, both of
/// which the installer fills in.
pub fn template(node: &Node) -> String {
    let mut t = chains::linkerd_entry(node);
    t["kubernetes"]["kubeconfig"] = KUBECONFIG_PLACEHOLDER.into();
    if let Some(m) = t.as_object_mut() {
        m.remove("cni_conf_dir");
    }
    serde_json::to_string_pretty(&t).unwrap_or_default()
}

/// [`template`] with `add_deadline_seconds` (e.g. short, so that an ADD
/// whose credentials are rejected ends soon in code 11), and what the
/// installer renders from it.
pub fn template_with_deadline(node: &Node, seconds: u64) -> (String, Value) {
    let mut t: Value = serde_json::from_str(&template(node)).unwrap_or_default();
    t["add_deadline_seconds"] = seconds.into();
    let mut desired = expected_entry(node);
    desired["add_deadline_seconds"] = seconds.into();
    (t.to_string(), desired)
}

/// What the installer must render from [`template`] for this node: host
/// paths, not the container's.
pub fn expected_entry(node: &Node) -> Value {
    chains::linkerd_entry(node)
}

fn mkdir_p(d: &Path) {
    std::fs::create_dir_all(d).unwrap_or_else(|e| panic!("cannot create {}: {e}", d.display()));
}

fn symlink(target: &Path, link: &Path) {
    std::os::unix::fs::symlink(target, link).unwrap_or_else(|e| {
        panic!(
            "cannot link {} -> {}: {e}",
            link.display(),
            target.display()
        )
    });
}

/// The address an installer started with `LINKERD_CNI_METRICS_ADDR`
/// (port 0: any) says it serves `/metrics` on, once it has said so.
pub fn metrics_addr(inst: &Installer, within: Duration) -> SocketAddr {
    let needle = "serving /metrics on http://";
    assert!(inst.wait_log(needle, within), "{}", inst.log());
    let log = inst.log();
    let rest = &log[log.find(needle).unwrap_or_default() + needle.len()..];
    rest[..rest.find("/metrics").unwrap_or_default()]
        .parse()
        .unwrap_or_else(|e| panic!("the address in {rest:?}: {e}"))
}

/// One scrape of `/metrics` from inside `node` (where the installer
/// listens): each sample as `name{labels}` -> value.
pub fn scrape(node: &Node, addr: SocketAddr) -> BTreeMap<String, f64> {
    let text = node.enter(|| {
        let mut s = TcpStream::connect(addr).unwrap_or_else(|e| panic!("connect {addr}: {e}"));
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: node\r\n\r\n")
            .and_then(|()| {
                let mut text = String::new();
                s.read_to_string(&mut text).map(|_| text)
            })
            .unwrap_or_else(|e| panic!("GET /metrics from {addr}: {e}"))
    });
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or_default();
    assert!(head.starts_with("HTTP/1.1 200 OK"), "{text}");
    body.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .filter_map(|l| {
            let (k, v) = l.rsplit_once(' ')?;
            Some((k.to_string(), v.parse().ok()?))
        })
        .collect()
}
