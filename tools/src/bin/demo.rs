//! `demo`: the story `./demo.sh` tells. A node made of a network namespace
//! and a temp dir, with containerd's settings where the installer's
//! container sees the host; a primary CNI (bridge + host-local + portmap),
//! the fake Kubernetes API server, the real installer, plugin and node
//! agent, and libcni (the library containerd and CRI-O embed) adding pods:
//! owned mode chosen from the runtime's settings, upstream's lost-event race
//! chained anyway, the startup taint removed with its Event, meshed and
//! unmeshed pods with their iptables rules, a rolling update of the
//! installer with a pod in its gap, the primary's rewrite healed within
//! milliseconds, the installer's `status` and `/metrics`, a pod whose facts
//! come from the node agent, and a stale chain caught by a pod's ADD.
//!
//! What the story prints about a process is printed once, after the effect
//! it reports was seen: the story waits for the effect (a file, an Event),
//! then for the installer's log to reach the line that says it, and prints
//! each log line once. So two runs print the same lines (times and counts
//! aside), also on a loaded machine.
//!
//! Run as root after building the release binaries (demo.sh does both).
//! Nothing outside its namespaces and temp dir is touched, and everything is
//! removed at the end, also on Ctrl-C, SIGTERM, a failed step or a panic
//! (Drop guards; see the crate's doc), then checked to be gone.

use std::collections::VecDeque;
use std::io::{IsTerminal, Read, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use conformance::agent::AgentProcess;
use conformance::iptables::{Family, NatTable};
use conformance::{Completed, Node, Pod, PodSpec, artifacts, sys};
use linkerd_cni_tools::scenario::{self, Binaries, InstallerPod};
use linkerd_cni_tools::stop::{self, Stop, checkpoint};
use serde_json::{Value, json};
use testkit::installer::InstallerProcess;
use testkit::{FakeApiServer, WatchApiServer, objects};

/// The network name, as a Calico node has it.
const NETWORK: &str = "k8s-pod-network";
/// The primary's conflist.
const PRIMARY_FILE: &str = "10-k8s-pod-network.conflist";
/// linkerd-cni's own conflist in owned mode: the primary's name with
/// `-linkerd-cni` before the extension, so that it sorts first.
const OWNED_FILE: &str = "10-k8s-pod-network-linkerd-cni.conflist";
/// The installer's resync period in step 2 (10 s in the chart).
const RESYNC: Duration = Duration::from_secs(3);
/// The installer's DaemonSet, in namespace linkerd-cni, as the API server
/// knows it.
const DS: &str = "linkerd-cni";
const DS_UID: &str = "0d5e7a1c-0000-4000-8000-000000000001";
/// The node, as the API server knows it, and the taint it registers with.
const NODE_NAME: &str = "worker-1";
const TAINT: &str = "linkerd.io/cni-not-ready";
/// Where the installer serves `/metrics`: loopback inside the node's
/// network namespace (deploy/ puts it on the node's IP, port 9995).
const METRICS: &str = "127.0.0.1:9995";
/// containerd's config.toml, host path, and what this node's says: one
/// config file loaded (containerd's default, written out).
const CONTAINERD_CONFIG: &str = "/etc/containerd/config.toml";
const CONTAINERD_TOML: &str = "\
version = 2

[plugins.\"io.containerd.grpc.v1.cri\".cni]
  bin_dir = \"/opt/cni/bin\"
  conf_dir = \"/etc/cni/net.d\"
  max_conf_num = 1
";
/// The gap of the rolling update: the old installer pod is gone, the new
/// one not started yet.
const GAP: Duration = Duration::from_secs(2);
/// The most the story waits for a process to do what it reports (a loaded
/// 2-core machine included).
const LIMIT: Duration = Duration::from_secs(15);
const WIDTH: usize = 78;

fn main() -> ExitCode {
    linkerd_cni_tools::main("demo", story)
}

fn story() -> ExitCode {
    let o = Out::new();
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("demo: run me as root (sudo ./demo.sh): I create network namespaces");
        return ExitCode::from(2);
    }
    match stop::run_story(|| run(&o)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(Stop::Interrupted) => {
            o.line("");
            o.line("Interrupted: everything the demo made has been removed.");
            ExitCode::from(130)
        }
        Err(Stop::Failed(why)) => {
            eprintln!("\ndemo: a step failed: {why}");
            eprintln!("demo: everything the demo made has been removed.");
            ExitCode::FAILURE
        }
    }
}

/// What every step works on.
struct Ctx<'a> {
    o: &'a Out,
    node: &'a Node,
    n: &'a Names,
    bins: &'a Binaries,
    api: &'a FakeApiServer,
    /// The installer container's mount prefix (its view of the host).
    mount: &'a Path,
}

fn run(o: &Out) -> Result<(), Stop> {
    let started = Instant::now();
    let bins = intro(o)?;
    checkpoint()?;
    let (node, n, api, mount) = step1_node(o)?;
    let c = Ctx {
        o,
        node: &node,
        n: &n,
        bins: &bins,
        api: &api,
        mount: &mount,
    };
    checkpoint()?;
    let first = installer_pod(&api, "linkerd-cni-7xk2p");
    let installer = step2_installer_before_primary(&c, &first)?;
    checkpoint()?;
    let (web, batch) = step3_two_pods(&c)?;
    checkpoint()?;
    let (mut installer, web3, pod) = step4_rolling_update(&c, (installer, &first))?;
    checkpoint()?;
    step5_primary_rewrite(&c, &mut installer, &pod)?;
    checkpoint()?;
    let (agent, web4) = step6_agent(&c)?;
    checkpoint()?;
    let web2 = step7_add_heals(&c, &mut installer)?;
    checkpoint()?;
    step8_clean_up(
        o,
        node,
        api,
        installer,
        agent,
        [web, batch, web3, web4, web2],
    )?;
    o.good(&format!(
        "Done in {:.1} s.",
        started.elapsed().as_secs_f64()
    ));
    Ok(())
}

/// What the demo is, and the binaries it drives.
fn intro(o: &Out) -> Result<Binaries, Stop> {
    o.banner("linkerd-cni demo: a node in a network namespace, no cluster needed");
    o.say(
        "Everything below runs in throwaway network namespaces and one temp dir. \
         Nothing touches this machine's /etc/cni/net.d, /opt/cni/bin, /etc/containerd \
         or network, and everything is removed at the end (also on Ctrl-C).",
    );
    let bins = Binaries::find().map_err(Stop::failed)?;
    // Built on first use; a cold Go cache takes a while, so say so.
    o.dim("(building the libcni driver, a small Go program, against Debian's libcni...)");
    let _ = artifacts::cnidriver();
    Ok(bins)
}

/// Step 1: the node, its runtime's settings, its (empty) conf dir, and the
/// API server's objects.
fn step1_node(o: &Out) -> Result<(Node, Names, FakeApiServer, PathBuf), Stop> {
    o.section(
        1,
        "A node, its container runtime, and a Kubernetes API server",
    );
    let node = Node::without_linkerd_cni();
    let n = Names::new(&node);
    let mount = scenario::host_mount(&node).map_err(Stop::failed)?;
    let toml = mount.join(CONTAINERD_CONFIG.trim_start_matches('/'));
    if let Some(dir) = toml.parent() {
        std::fs::create_dir_all(dir)
            .map_err(|e| Stop::failed(format!("cannot create {}: {e}", dir.display())))?;
    }
    std::fs::write(&toml, CONTAINERD_TOML)
        .map_err(|e| Stop::failed(format!("cannot write {}: {e}", toml.display())))?;
    // The installer writes the kubeconfig, as on a real node.
    let api = node.start_api_server_only();
    api.add_namespace("demo", &[]);
    api.add_namespace("linkerd-cni", &[]);
    for (name, meshed) in [
        ("web", true),
        ("batch", false),
        ("web-2", true),
        ("web-3", true),
    ] {
        api.add_pod(&if meshed {
            objects::Pod::meshed("demo", name)
        } else {
            objects::Pod::new("demo", name)
        });
    }
    api.set(
        &objects::daemonset_path("linkerd-cni", DS),
        objects::daemonset("linkerd-cni", DS, DS_UID, false),
    );
    api.set(
        &objects::node_path(NODE_NAME),
        objects::node(NODE_NAME, &[(TAINT, "NoSchedule")]),
    );
    o.kv(
        "node",
        &format!("network namespace {}", node.netns().name()),
    );
    o.kv("$NODE", &node.dir().display().to_string());
    o.kv(
        "conf dir",
        "$NODE/net.d   (the node's /etc/cni/net.d: empty for now)",
    );
    o.kv(
        "bin dir",
        "$NODE/bin     (the node's /opt/cni/bin: Debian's reference plugins)",
    );
    o.kv("runtime", &format!("containerd, its {CONTAINERD_CONFIG}:"));
    o.out(CONTAINERD_TOML.trim_end(), &n);
    o.kv(
        "/host",
        "the host as the installer's container mounts it: $NODE/host here",
    );
    o.kv(
        "API server",
        &format!("{} inside the node (TLS, bearer token)", api.url()),
    );
    o.kv("", "a stand-in for Kubernetes, serving:");
    o.kv(
        "",
        &format!("Node {NODE_NAME}, tainted {TAINT}:NoSchedule by its kubelet"),
    );
    o.kv("", "pod demo/web    has a linkerd-proxy container: meshed");
    o.kv("", "pod demo/batch  has none: not meshed");
    o.kv(
        "",
        "pods demo/web-2, demo/web-3: meshed too (steps 4 and 7)",
    );
    o.kv(
        "",
        "DaemonSet linkerd-cni/linkerd-cni and its installer pods",
    );
    Ok((node, n, api, mount))
}

/// A running installer and the part of its log not printed yet.
struct Installer {
    process: InstallerProcess,
    unread: VecDeque<String>,
}

impl Installer {
    /// Its log up to the line holding the last of `needles` to appear
    /// (each must appear), waiting for them; later lines stay for the next
    /// call, so that each line is printed once and where it belongs.
    fn until(&mut self, needles: &[&str]) -> Result<Vec<String>, Stop> {
        let end = Instant::now() + LIMIT;
        loop {
            self.unread.extend(self.process.new_log_lines());
            let found: Option<Vec<usize>> = needles
                .iter()
                .map(|needle| self.unread.iter().position(|l| l.contains(needle)))
                .collect();
            if let Some(last) = found.and_then(|at| at.into_iter().max()) {
                return Ok(self.unread.drain(..=last).collect());
            }
            checkpoint()?;
            if Instant::now() > end {
                return Err(Stop::failed(format!(
                    "the installer did not log {needles:?} within {LIMIT:?}; its log:\n{}",
                    self.process.log()
                )));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// SIGTERM, as the kubelet stops it: its exit code and the log lines
    /// not printed yet.
    fn stop(&mut self) -> (Option<i32>, Vec<String>) {
        let code = self.process.stop();
        self.unread.extend(self.process.new_log_lines());
        (code, self.unread.drain(..).collect())
    }
}

/// The installer's environment beyond the chart's, as deploy/ sets it;
/// `deployed: false` is step 2's: no file watcher, a short resync, no
/// metrics.
fn installer_env(deployed: bool) -> Vec<(&'static str, String)> {
    let mut env = vec![
        ("LINKERD_CNI_CHAIN_MODE", "auto".to_string()),
        ("LINKERD_CNI_NODE_NAME", NODE_NAME.to_string()),
    ];
    if deployed {
        env.push(("LINKERD_CNI_METRICS_ADDR", METRICS.to_string()));
    } else {
        env.push(("LINKERD_CNI_WATCH", "false".to_string()));
        env.push(("LINKERD_CNI_RESYNC_SECONDS", RESYNC.as_secs().to_string()));
    }
    env
}

/// Starts the installer as `pod`.
fn start_installer(c: &Ctx, pod: &InstallerPod, deployed: bool) -> Result<Installer, Stop> {
    let mut cmd = scenario::installer_command(c.node, c.bins, Some(c.api), Some(pod), c.mount)
        .map_err(Stop::failed)?;
    cmd.envs(installer_env(deployed));
    Ok(Installer {
        process: scenario::spawn_installer(c.node, cmd),
        unread: VecDeque::new(),
    })
}

/// Step 2: the installer starts before the primary CNI writes its config,
/// with no file watcher; its periodic pass chains it, in owned mode, and
/// the node's startup taint goes.
fn step2_installer_before_primary(c: &Ctx, pod: &InstallerPod) -> Result<Installer, Stop> {
    let (o, node, n) = (c.o, c.node, c.n);
    o.section(
        2,
        "The installer starts before the primary CNI, with no file watcher",
    );
    o.say(
        "Upstream's installer started a file watcher in the background, then touched \
         the conflist to wake it. When the watcher was slow, the event was lost and \
         the node stayed unchained for good. Here events are only a speed-up: the \
         installer reconciles the state on disk at start and on a timer. To show it, \
         this one runs with no watcher at all, and the primary CNI writes its config \
         only after the installer started. The rest is as deploy/linkerd-cni.yaml \
         runs it: chain mode auto, and the node's name from the downward API.",
    );
    let env: Vec<String> = installer_env(false)
        .into_iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    o.cmd(&format!("{} linkerd-cni-installer", env.join(" ")));
    let mut installer = start_installer(c, pod, false)?;
    // The first pass ends with the taint's verdict: kept, not ready yet.
    let lines = installer.until(&["keeping startup taint"])?;
    o.logs("installer", &lines, n);
    if !lines.iter().any(|l| l.contains("chain mode owned")) {
        return Err(Stop::failed(format!(
            "auto did not select owned mode from {CONTAINERD_CONFIG}; the installer's log:\n{}",
            lines.join("\n")
        )));
    }
    o.say(&format!(
        "auto read containerd's settings under the host mount: containerd loads the \
         first config file alone, so the installer chose owned mode. linkerd-cni will \
         keep a conflist of its own ({OWNED_FILE}) in front of the primary's, and \
         leave the primary's file as the primary wrote it. Its first pass installed \
         the binary and the kubeconfig and wrote no network config: there is no \
         primary config to chain yet. Files: {}.",
        conf_files(node)
    ));
    stop::sleep(Duration::from_secs(1))?;
    o.say(&format!(
        "One second later the primary CNI writes {PRIMARY_FILE} (bridge + host-local IPAM, portmap):"
    ));
    let primary = primary_conflist(node, false);
    node.write_conf(PRIMARY_FILE, &primary);
    let written = Instant::now();
    o.out(&pretty(&n.short_json(&primary), 0, 0), n);
    o.cmd("linkerd-cni chain status --conf-dir $NODE/net.d");
    show_status(o, node, c.bins, n);
    o.say("No event will come. The installer's next periodic pass has to find it...");
    let healed = wait_for(RESYNC + LIMIT, Duration::from_millis(10), || {
        node.linkerd_last()
    })
    .map_err(|_| Stop::failed("the installer did not chain the primary's config"))?;
    o.good(&format!(
        "chained {:.1} s after the primary wrote its config, by the periodic reconcile \
         (no file event was involved):",
        (healed - written).as_secs_f64()
    ));
    // The pass that chained it ends with the taint's removal.
    o.logs(
        "installer",
        &installer.until(&["startup taint: removed"])?,
        n,
    );
    o.say(&format!("Files: {}.", conf_files(node)));
    o.cmd("linkerd-cni chain status --conf-dir $NODE/net.d");
    show_status(o, node, c.bins, n);
    let event = wait_for(LIMIT, Duration::from_millis(10), || {
        taint_event(c.api).is_some()
    })
    .ok()
    .and_then(|_| taint_event(c.api))
    .ok_or_else(|| Stop::failed("the installer posted no Event for the startup taint"))?;
    o.say(&format!(
        "The node was ready, so the installer removed the kubelet's startup taint \
         (pods may be scheduled here now), and said so in an Event on Node \
         {NODE_NAME}, as `kubectl describe node {NODE_NAME}` shows it:"
    ));
    let field = |k: &str| event[k].as_str().unwrap_or("?").to_string();
    o.out(
        &format!(
            "Type:    {}\nReason:  {}\nFrom:    {}\nMessage: {}",
            field("type"),
            field("reason"),
            field("reportingController"),
            wrap(&field("note"), WIDTH - 13).join("\n         ")
        ),
        n,
    );
    let taints = c
        .api
        .object(&objects::node_path(NODE_NAME))
        .map(|v| v["spec"]["taints"].clone())
        .unwrap_or(Value::Null);
    let left = taints.as_array().map_or(0, Vec::len);
    if left != 0 {
        return Err(Stop::failed(format!(
            "Node {NODE_NAME} still has taints: {taints}"
        )));
    }
    o.good(&format!("Node {NODE_NAME} has no taint left"));
    Ok(installer)
}

/// The startup taint's Event, once posted.
fn taint_event(api: &FakeApiServer) -> Option<Value> {
    api.events()
        .into_iter()
        .find(|e| e["reason"] == "LinkerdCNIStartupTaintRemoved")
}

fn conf_files(node: &Node) -> String {
    node.conf_dir_names()
        .iter()
        .map(|f| format!("net.d/{f}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Step 3: a meshed and an unmeshed pod, added through libcni.
fn step3_two_pods(c: &Ctx) -> Result<(Pod, Pod), Stop> {
    let (o, node, api, n) = (c.o, c.node, c.api, c.n);
    o.section(3, "Two pods, added the way containerd and CRI-O add them");
    o.say(
        "Each pod is a network namespace. The libcni driver runs the active conflist \
         (linkerd-cni's own file, the first) for it, plugin after plugin, as the \
         container runtime would, with the kubelet's CNI_ARGS naming the pod.",
    );
    let web = node.pod(PodSpec::kubernetes("demo", "web"));
    let before = ApiCalls::count(api, "web");
    let done = add(o, node, &web, "demo/web (meshed)")?;
    o.say(&format!(
        "pod IP {}. The plugin asked the API server: {}.",
        pod_ip(&done),
        before.since(api)
    ));
    let save = testkit::chart::backend().save_tool(Family::V4);
    o.say(&format!(
        "Its nat table (iptables-mode {}, the linkerd2-cni chart's default, as in deploy/):",
        testkit::chart::backend().mode()
    ));
    o.cmd(&format!(
        "ip netns exec {} {save} -t nat",
        web.netns().name()
    ));
    show_nat(o, &web, n);
    expect_reference_rules(o, &web)?;
    o.say(
        "Inbound TCP goes to the proxy's 4143 (except its admin ports 4191 and 4190), \
         outbound TCP to 4140, except the proxy's own traffic (uid 2102) and loopback.",
    );
    checkpoint()?;

    let batch = node.pod(PodSpec::kubernetes("demo", "batch"));
    let before = ApiCalls::count(api, "batch");
    let done = add(o, node, &batch, "demo/batch (not meshed)")?;
    o.say(&format!(
        "pod IP {}. The plugin asked the API server: {}. No linkerd-proxy container: \
         it left the pod alone and passed the primary's result through.",
        pod_ip(&done),
        before.since(api)
    ));
    o.cmd(&format!(
        "ip netns exec {} {save} -t nat",
        batch.netns().name()
    ));
    show_nat(o, &batch, n);
    let touched: usize = batch
        .nat_tables()
        .iter()
        .map(|t| t.linkerd_lines().len())
        .sum();
    if touched != 0 {
        return Err(Stop::failed(format!(
            "the unmeshed pod has {touched} linkerd nat lines"
        )));
    }
    o.good("no linkerd rule in any nat table of the pod (legacy and nft, IPv4 and IPv6)");
    Ok((web, batch))
}

/// An installer pod of the DaemonSet, registered with the API server, with
/// a token of its own (revoked when the pod is deleted).
fn installer_pod(api: &FakeApiServer, name: &str) -> InstallerPod {
    api.set(
        &objects::pod_path("linkerd-cni", name),
        objects::daemonset_pod("linkerd-cni", name, DS, DS_UID),
    );
    InstallerPod {
        name: name.to_string(),
        token: api.issue_token(),
    }
}

/// The subject of the token in the node's kubeconfig, and whether it is
/// the installer pod's own.
fn kubeconfig_subject(node: &Node, own: &str) -> String {
    let text = std::fs::read_to_string(node.conf_dir().join("ZZZ-linkerd-cni-kubeconfig"))
        .unwrap_or_default();
    // The installer writes the kubeconfig as JSON.
    let token = serde_json::from_str::<serde_json::Value>(&text)
        .ok()
        .and_then(|d| d["users"][0]["user"]["token"].as_str().map(str::to_string))
        .unwrap_or_default();
    if token == own {
        return "the installer pod's own token".into();
    }
    match linkerd_cni_kube::token::claims(&token) {
        Some(c) => format!(
            "a token of {}, valid for {} h",
            c.subject,
            c.lifetime().as_secs() / 3600
        ),
        None => "no token linkerd-cni minted".into(),
    }
}

/// Step 4: a rolling update of the installer: the old pod goes (its token
/// with it), a gap, the new one starts, as deployed (file watcher and
/// metrics on); a meshed pod added in the gap gets its rules.
fn step4_rolling_update(
    c: &Ctx,
    (mut old, old_pod): (Installer, &InstallerPod),
) -> Result<(Installer, Pod, InstallerPod), Stop> {
    let (o, node, api, n) = (c.o, c.node, c.api, c.n);
    o.section(4, "A rolling update of the installer, and a pod in its gap");
    o.say(&format!(
        "The kubeconfig the plugin uses does not hold the installer pod's token: it holds \
         {}, minted by the installer through the TokenRequest API for the plugin's own \
         ServiceAccount, which may only read pods, namespaces and the kubernetes Service.",
        kubeconfig_subject(node, "")
    ));
    o.say(
        "A rolling update stops the old installer pod (SIGTERM). Its DaemonSet is still \
         there, so it leaves everything installed:",
    );
    let (code, lines) = old.stop();
    o.logs("installer", &lines, n);
    o.dim(&format!("  (installer exit code {})", fmt_code(code)));
    drop(old);
    api.remove(&objects::pod_path("linkerd-cni", &old_pod.name));
    api.revoke_token(&old_pod.token);
    o.say(&format!(
        "Its pod object is deleted, which revokes its token (the API server answers 401 \
         to it from now on). The new pod starts {} s later. Meanwhile a meshed pod starts:",
        GAP.as_secs()
    ));
    let web3 = node.pod(PodSpec::kubernetes("demo", "web-3"));
    let gap_started = Instant::now();
    add(o, node, &web3, "demo/web-3 (meshed, no installer running)")?;
    expect_reference_rules(o, &web3)?;
    o.good("it got its rules: the plugin's token outlived the installer pod");
    stop::sleep(GAP.saturating_sub(gap_started.elapsed()))?;
    o.say(&format!(
        "The new installer pod starts as deployed: its file watcher on (the default), \
         its metrics on {METRICS} in the node:"
    ));
    let env: Vec<String> = installer_env(true)
        .into_iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    o.cmd(&format!("{} linkerd-cni-installer", env.join(" ")));
    let pod = installer_pod(api, "linkerd-cni-q4m9z");
    let mut new = start_installer(c, &pod, true)?;
    // Its first pass ends with the taint's verdict: already gone.
    o.logs(
        "installer",
        &new.until(&["serving /metrics", "startup taint: absent"])?,
        n,
    );
    o.say(&format!(
        "It keeps the plugin's token ({}) instead of writing one of its own: nothing \
         in the conf dir changed, so the runtime had nothing to reload.",
        kubeconfig_subject(node, &pod.token)
    ));
    Ok((new, web3, pod))
}

/// Step 5: the primary rewrites its conflist; the installer's watcher
/// follows it within milliseconds. Then its `status` and `/metrics`.
fn step5_primary_rewrite(
    c: &Ctx,
    installer: &mut Installer,
    pod: &InstallerPod,
) -> Result<(), Stop> {
    let (o, node, n) = (c.o, c.node, c.n);
    o.section(5, "The primary CNI rewrites its conflist");
    o.say(
        "Calico's installer, for one, rewrites its file on every restart. This new \
         version also changes the bridge's MTU. linkerd-cni's own file is now a stale \
         copy: a pod started on it would not get the new MTU.",
    );
    let rewritten = primary_conflist(node, true);
    node.write_conf(PRIMARY_FILE, &rewritten);
    let written = Instant::now();
    o.out(
        &format!("{PRIMARY_FILE}: plugins bridge -> portmap   (bridge \"mtu\": 1400)"),
        n,
    );
    // Polled often: the watcher's repair takes milliseconds.
    let healed = wait_for(LIMIT, Duration::from_millis(1), || {
        node.linkerd_last() && active_json(node)["plugins"][0]["mtu"] == 1400
    })
    .map_err(|_| Stop::failed("the installer did not follow the primary's rewrite"))?;
    o.good(&format!(
        "followed {} ms after the rewrite, on the file watcher's event:",
        (healed - written).as_millis()
    ));
    o.logs("installer", &installer.until(&[OWNED_FILE])?, n);
    o.out(
        &format!(
            "{OWNED_FILE}: plugins {}   (bridge \"mtu\": {})",
            types(node).join(" -> "),
            active_json(node)["plugins"][0]["mtu"]
        ),
        n,
    );
    o.say(
        "(Without the watcher, as in step 2, the next periodic pass does it: 10 s at \
         most with the chart's resync period.) What the node's installer reports:",
    );
    o.cmd(&format!(
        "kubectl exec -n linkerd-cni {} -- linkerd-cni-installer status",
        pod.name
    ));
    let (code, text) = installer_status(c, pod)?;
    o.out(text.trim_end(), n);
    match code {
        0 => o.good("exit 0: healthy"),
        _ => {
            return Err(Stop::failed(format!(
                "linkerd-cni-installer status: exit {code}:\n{text}"
            )));
        }
    }
    o.cmd(&format!(
        "curl -s http://{METRICS}/metrics | grep -E 'chain_(mode|healthy|repairs_total|fights_total)'"
    ));
    let metrics = scrape(node)?;
    let shown: Vec<&str> = metrics
        .lines()
        .filter(|l| {
            [
                "linkerd_cni_chain_mode{",
                "linkerd_cni_chain_healthy{",
                "linkerd_cni_chain_repairs_total{",
                "linkerd_cni_chain_fights_total",
            ]
            .iter()
            .any(|m| l.starts_with(m))
                && !l.ends_with(" 0")
        })
        .collect();
    o.out(&shown.join("\n"), n);
    o.dim("    (series at 0 left out)");
    Ok(())
}

/// `linkerd-cni-installer status` in the node, with the running
/// installer's environment: its exit code and output.
fn installer_status(c: &Ctx, pod: &InstallerPod) -> Result<(i32, String), Stop> {
    let mut cmd = scenario::installer_command(c.node, c.bins, Some(c.api), Some(pod), c.mount)
        .map_err(Stop::failed)?;
    cmd.envs(installer_env(true)).arg("status");
    let out = sys::output(&mut cmd);
    let mut text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.push_str(&String::from_utf8_lossy(&out.stderr));
    Ok((out.status.code().unwrap_or(-1), text))
}

/// One GET of the installer's `/metrics`, from inside the node.
fn scrape(node: &Node) -> Result<String, Stop> {
    let text = node.enter(|| -> std::io::Result<String> {
        let addr: std::net::SocketAddr = METRICS.parse().map_err(std::io::Error::other)?;
        let mut s = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
        s.set_read_timeout(Some(Duration::from_secs(2)))?;
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: node\r\nConnection: close\r\n\r\n")?;
        let mut text = String::new();
        s.take(4 << 20).read_to_string(&mut text)?;
        Ok(text)
    });
    let text = text.map_err(|e| Stop::failed(format!("GET http://{METRICS}/metrics: {e}")))?;
    match text.split_once("\r\n\r\n") {
        Some((head, body)) if head.starts_with("HTTP/1.1 200") => Ok(body.to_string()),
        _ => Err(Stop::failed(format!(
            "GET http://{METRICS}/metrics: not a 200 answer:\n{text}"
        ))),
    }
}

/// The node agent (the repair controller's binary) answering the plugin's
/// pod lookups; killed on drop, and by the kernel if the demo dies.
struct Agent {
    _process: AgentProcess,
    /// The API server it watches: dropped after it.
    _cluster: WatchApiServer,
}

/// Step 6: the node agent answers the plugin's pod lookup from its watch:
/// a meshed pod starts with no API request from the plugin.
fn step6_agent(c: &Ctx) -> Result<(Agent, Pod), Stop> {
    let (o, node, api) = (c.o, c.node, c.api);
    o.section(6, "The node agent answers the plugin's pod lookups");
    o.say(&format!(
        "Each meshed pod so far cost two API requests (its pod, its namespace). The \
         node agent (the repair controller's binary, a DaemonSet) watches the pods of \
         its node and answers the plugin on a root-only Unix socket in the plugin's \
         state dir. (It watches a second stand-in API server here, on this machine's \
         loopback: the first one cannot serve watches.) Pod demo/web-4 is scheduled on \
         {NODE_NAME}:"
    ));
    let cluster = WatchApiServer::start();
    cluster.put_object("namespaces", objects::namespace("demo", &[]));
    // web-2 too: the agent answers for it in step 7.
    for name in ["web-4", "web-2"] {
        cluster.put_pod(objects::on_node(
            objects::Pod::meshed("demo", name).json(),
            NODE_NAME,
        ));
    }
    o.cmd(&format!(
        "linkerd-cni-repair-controller --node-name {NODE_NAME} --state-dir $NODE/state \
         --cni-net-dir $NODE/net.d --kubeconfig ..."
    ));
    let process = AgentProcess::start(&cluster, NODE_NAME, &node.conf_dir(), &node.state_dir())
        .map_err(Stop::failed)?;
    process
        .wait_answering("demo", "web-4", LIMIT)
        .map_err(Stop::failed)?;
    let agent = Agent {
        _process: process,
        _cluster: cluster,
    };
    o.good(&format!(
        "it answers on $NODE/state/{}",
        linkerd_cni_lookup::SOCKET
    ));
    let web4 = node.pod(PodSpec::kubernetes("demo", "web-4"));
    let before = ApiCalls::count(api, "web-4");
    let total = api.total_requests();
    add(o, node, &web4, "demo/web-4 (meshed)")?;
    expect_reference_rules(o, &web4)?;
    let asked = before.since(api);
    if api.total_requests() != total {
        return Err(Stop::failed(format!(
            "the plugin asked the API server with the agent running: {asked}"
        )));
    }
    o.good(&format!(
        "the pod's facts came from the agent: the plugin asked the API server {asked}"
    ));
    Ok((agent, web4))
}

/// Step 7: with the installer stopped, the primary changes its chain; the
/// next pod's ADD, which ran the stale copy, repairs it and asks the
/// runtime to try again, and the retry runs the current chain.
fn step7_add_heals(c: &Ctx, installer: &mut Installer) -> Result<Pod, Stop> {
    let (o, node, n) = (c.o, c.node, c.n);
    o.section(7, "No installer running: a pod ADD catches a stale chain");
    o.say(
        "The installer stops (SIGTERM: it exits and leaves everything installed, so a \
         restart or an upgrade never unchains pods).",
    );
    let (code, lines) = installer.stop();
    o.logs("installer", &lines, n);
    o.dim(&format!("  (installer exit code {})", fmt_code(code)));
    o.say("Now the primary upgrades, and appends a new plugin of its own (tuning):");
    let upgraded = upgraded_conflist(&primary_conflist(node, true));
    node.write_conf(PRIMARY_FILE, &upgraded);
    o.out(
        &format!(
            "{PRIMARY_FILE}: plugins {}",
            plugin_types(&upgraded).join(" -> ")
        ),
        n,
    );
    o.cmd("linkerd-cni chain status --conf-dir $NODE/net.d");
    show_status(o, node, c.bins, n);
    o.say(
        "The runtime still loads linkerd-cni's file, the first, which lacks tuning. The \
         plugin checks the chain on every ADD (read-only and lock-free when healthy). A \
         meshed pod starts:",
    );
    let web2 = node.pod(PodSpec::kubernetes("demo", "web-2"));
    o.step("ADD demo/web-2 (meshed)");
    let failed = match node.add(NETWORK, &web2) {
        Ok(_) => {
            return Err(Stop::failed(
                "the ADD that ran a stale chain was not sent back",
            ));
        }
        Err(f) => f,
    };
    o.say(&format!("libcni ran: {}.", ran(&failed.trace)));
    let stale_log: Vec<String> = failed
        .execs("linkerd-cni")
        .flat_map(|e| e.stderr.lines().map(String::from).collect::<Vec<_>>())
        .collect();
    o.logs("linkerd-cni", &stale_log, n);
    if failed.code != Some(11) {
        return Err(Stop::failed(format!(
            "the ADD that ran a stale chain failed with {failed}, not code 11"
        )));
    }
    o.bad(&format!(
        "CNI error code 11 (try again later): {}",
        failed.msg.as_deref().unwrap_or("")
    ));
    o.out(
        &wrap(failed.details.as_deref().unwrap_or(""), WIDTH - 6).join("\n"),
        n,
    );
    o.say(
        "The plugin rewrote linkerd-cni's file under a lock, atomically, and sent the \
         pod back: the kubelet tears the sandbox down (DEL) and starts it again:",
    );
    node.del(NETWORK, &web2)
        .map_err(|f| Stop::failed(format!("DEL demo/web-2 failed: {f}")))?;
    let done = add(o, node, &web2, "demo/web-2 (meshed), again")?;
    let plugin_log: Vec<String> = done
        .execs("linkerd-cni")
        .flat_map(|e| e.stderr.lines().map(String::from).collect::<Vec<_>>())
        .collect();
    o.logs("linkerd-cni", &plugin_log, n);
    expect_reference_rules(o, &web2)?;
    o.cmd("linkerd-cni chain status --conf-dir $NODE/net.d");
    show_status(o, node, c.bins, n);
    o.say(
        "(A chain that never runs the plugin cannot be caught at ADD: that blind spot is \
         why the installer also reconciles on a timer, as in step 2.)",
    );
    Ok(web2)
}

/// Step 8: DEL of every pod, then everything the demo made is removed (in
/// the order the guards need: pods, API server, agent, installer, node).
fn step8_clean_up(
    o: &Out,
    node: Node,
    api: FakeApiServer,
    installer: Installer,
    agent: Agent,
    pods: [Pod; 5],
) -> Result<(), Stop> {
    o.section(8, "Clean-up");
    let names = [
        "demo/web",
        "demo/batch",
        "demo/web-3",
        "demo/web-4",
        "demo/web-2",
    ];
    let mut dels = Vec::new();
    for (pod, name) in pods.iter().zip(names) {
        match node.del(NETWORK, pod) {
            Ok(_) => dels.push(format!("{name} ok")),
            Err(f) => return Err(Stop::failed(format!("DEL {name} failed: {f}"))),
        }
    }
    o.say(&format!(
        "DEL through libcni (plugins in reverse order): {}.",
        dels.join(", ")
    ));
    let mut netns = vec![node.netns().name().to_string()];
    netns.extend(pods.iter().map(|p| p.netns().name().to_string()));
    let dir = node.dir().display().to_string();
    drop(pods);
    drop(api);
    drop(agent);
    drop(installer);
    drop(node);
    o.say(&format!(
        "Stopped the node agent. Removed the network namespaces {} (with the bridge and \
         veths inside), and {dir}.",
        netns.join(", ")
    ));
    Ok(())
}

/// The primary's conflist: bridge (host-local IPAM on the node's subnet)
/// and portmap, as a bridge-based primary CNI writes it; `rewritten` adds
/// an MTU, so the new content is recognisable after the repair.
fn primary_conflist(node: &Node, rewritten: bool) -> Value {
    let mut bridge = json!({
        "type": "bridge",
        "bridge": format!("lcd{}", std::process::id() % 100_000),
        "isGateway": true,
        "ipMasq": false,
    });
    if rewritten && let Some(m) = bridge.as_object_mut() {
        m.insert("mtu".into(), 1400.into());
    }
    if let Some(m) = bridge.as_object_mut() {
        m.insert("ipam".into(), node.host_local());
    }
    json!({
        "cniVersion": "1.0.0",
        "name": NETWORK,
        "plugins": [bridge, {"type": "portmap", "capabilities": {"portMappings": true}}],
    })
}

/// `primary` with `tuning` appended, as a primary's upgrade writes it.
fn upgraded_conflist(primary: &Value) -> Value {
    let mut v = primary.clone();
    if let Some(p) = v.get_mut("plugins").and_then(Value::as_array_mut) {
        p.push(json!({"type": "tuning", "sysctl": {"net.core.somaxconn": "1024"}}));
    }
    v
}

fn plugin_types(conf: &Value) -> Vec<String> {
    conf["plugins"]
        .as_array()
        .map(|p| {
            p.iter()
                .map(|x| x["type"].as_str().unwrap_or("?").to_string())
                .collect()
        })
        .unwrap_or_default()
}

fn active_json(node: &Node) -> Value {
    node.read_active().map_or(Value::Null, |a| a.json)
}

fn types(node: &Node) -> Vec<String> {
    node.read_active().map(|a| a.types()).unwrap_or_default()
}

/// One libcni ADD, with the plugins it ran and their times.
fn add(o: &Out, node: &Node, pod: &Pod, label: &str) -> Result<Completed, Stop> {
    o.step(&format!("ADD {label}"));
    let done = node
        .add(NETWORK, pod)
        .map_err(|f| Stop::failed(format!("ADD {label} failed: {f}")))?;
    o.say(&format!("libcni ran: {}.", ran(&done.trace)));
    Ok(done)
}

/// The plugins libcni ran, with their times.
fn ran(trace: &[conformance::Exec]) -> String {
    trace
        .iter()
        .map(|e| format!("{} ({} ms)", e.plugin, e.duration.as_millis()))
        .collect::<Vec<_>>()
        .join(" -> ")
}

fn pod_ip(done: &Completed) -> String {
    done.json()["ips"][0]["address"]
        .as_str()
        .unwrap_or("?")
        .to_string()
}

/// The API requests for one pod and its namespace, counted before an ADD.
struct ApiCalls {
    paths: [String; 2],
    counts: [usize; 2],
}

impl ApiCalls {
    fn count(api: &FakeApiServer, pod: &str) -> ApiCalls {
        let paths = [
            objects::pod_path("demo", pod),
            objects::namespace_path("demo"),
        ];
        let counts = [api.requests(&paths[0]), api.requests(&paths[1])];
        ApiCalls { paths, counts }
    }

    /// What was requested since [`ApiCalls::count`].
    fn since(&self, api: &FakeApiServer) -> String {
        let calls: Vec<String> = self
            .paths
            .iter()
            .zip(self.counts)
            .filter(|(p, n)| api.requests(p) > *n)
            .map(|(p, _)| format!("GET {p}"))
            .collect();
        if calls.is_empty() {
            "nothing".into()
        } else {
            calls.join(", then ")
        }
    }
}

/// JSON for reading: a value that fits on the line is written on one line
/// (`{"k": v, ...}`), a longer one with one member per line. `indent` is
/// the current line's indent, `col` the column the value starts at.
fn pretty(v: &Value, indent: usize, col: usize) -> String {
    let flat = flat(v);
    if col + flat.chars().count() <= WIDTH - 4 {
        return flat;
    }
    let inner = indent + 2;
    let pad = " ".repeat(inner);
    let close = " ".repeat(indent);
    match v {
        Value::Object(m) if !m.is_empty() => {
            let members: Vec<String> = m
                .iter()
                .map(|(k, x)| {
                    let key = Value::from(k.as_str()).to_string();
                    let at = inner + key.chars().count() + 2;
                    format!("{pad}{key}: {}", pretty(x, inner, at))
                })
                .collect();
            format!("{{\n{}\n{close}}}", members.join(",\n"))
        }
        Value::Array(a) if !a.is_empty() => {
            let items: Vec<String> = a
                .iter()
                .map(|x| format!("{pad}{}", pretty(x, inner, inner)))
                .collect();
            format!("[\n{}\n{close}]", items.join(",\n"))
        }
        _ => flat,
    }
}

fn flat(v: &Value) -> String {
    match v {
        Value::Object(m) => {
            let members: Vec<String> = m
                .iter()
                .map(|(k, x)| format!("{}: {}", Value::from(k.as_str()), flat(x)))
                .collect();
            format!("{{{}}}", members.join(", "))
        }
        Value::Array(a) => {
            let items: Vec<String> = a.iter().map(flat).collect();
            format!("[{}]", items.join(", "))
        }
        other => other.to_string(),
    }
}

fn show_status(o: &Out, node: &Node, bins: &Binaries, n: &Names) {
    let (code, text) = scenario::chain_status(node, &bins.plugin);
    o.out(text.trim_end(), n);
    let verdict = match code {
        0 => "exit 0: healthy",
        1 => "exit 1: not healthy",
        _ => "exit 2: error",
    };
    if code == 0 {
        o.good(verdict);
    } else {
        o.bad(verdict);
    }
}

fn show_nat(o: &Out, pod: &Pod, n: &Names) {
    let t = NatTable::read(pod.netns(), testkit::chart::backend(), Family::V4);
    let text: Vec<&str> = t.text.lines().filter(|l| !l.starts_with('#')).collect();
    o.out(&text.join("\n"), n);
}

/// Fails unless `pod`'s linkerd lines are the reference rules for the
/// defaults, as upstream linkerd2-proxy-init's iptables package writes them.
fn expect_reference_rules(o: &Out, pod: &Pod) -> Result<(), Stop> {
    let mut got = pod
        .nat(testkit::chart::backend(), Family::V4)
        .linkerd_lines()
        .join("\n");
    got.push('\n');
    if got != testkit::iptables::DEFAULT_RULES {
        return Err(Stop::failed(format!(
            "the pod's linkerd rules differ from the reference:\n{got}\nexpected:\n{}",
            testkit::iptables::DEFAULT_RULES
        )));
    }
    o.good(
        "its PROXY_INIT chains and rules are identical, line by line, to those upstream \
         linkerd-cni installs for the default config",
    );
    Ok(())
}

fn fmt_code(c: Option<i32>) -> String {
    c.map_or("none (killed)".into(), |c| c.to_string())
}

/// Polls `f` every `poll` until it holds (returns when) or `limit` passes.
fn wait_for(limit: Duration, poll: Duration, mut f: impl FnMut() -> bool) -> Result<Instant, Stop> {
    let end = Instant::now() + limit;
    loop {
        if f() {
            return Ok(Instant::now());
        }
        checkpoint()?;
        if Instant::now() > end {
            return Err(Stop::failed("timed out"));
        }
        std::thread::sleep(poll);
    }
}

/// Long paths shortened for reading.
struct Names {
    dir: String,
}

impl Names {
    fn new(node: &Node) -> Names {
        Names {
            dir: node.dir().display().to_string(),
        }
    }

    /// The node's dir as `$NODE`; the installer's view of it, under the
    /// mount prefix that stands for its container's `/host`, as
    /// `/host$NODE`.
    fn short(&self, s: &str) -> String {
        s.replace(&format!("{}/host", self.dir), "/host")
            .replace(&self.dir, "$NODE")
    }

    fn short_json(&self, v: &Value) -> Value {
        match v {
            Value::String(s) => Value::String(self.short(s)),
            Value::Array(a) => a.iter().map(|x| self.short_json(x)).collect(),
            Value::Object(m) => Value::Object(
                m.iter()
                    .map(|(k, x)| (k.clone(), self.short_json(x)))
                    .collect(),
            ),
            other => other.clone(),
        }
    }
}

/// The demo's output: sections, wrapped prose, commands and their output,
/// bold/dim/colour only on a terminal.
struct Out {
    tty: bool,
}

impl Out {
    fn new() -> Out {
        Out {
            tty: std::io::stdout().is_terminal(),
        }
    }

    fn style(&self, code: &str, s: &str) -> String {
        if self.tty {
            format!("\x1b[{code}m{s}\x1b[0m")
        } else {
            s.to_string()
        }
    }

    fn line(&self, s: &str) {
        println!("{s}");
    }

    fn banner(&self, s: &str) {
        println!("{}", self.style("1", s));
        println!("{}", "=".repeat(s.chars().count()));
    }

    fn section(&self, n: u32, title: &str) {
        println!();
        println!("{}", self.style("1;34", &format!("{n}. {title}")));
    }

    fn step(&self, s: &str) {
        println!();
        println!("  {}", self.style("1", &format!("> {s}")));
    }

    fn say(&self, text: &str) {
        for l in wrap(text, WIDTH - 2) {
            println!("  {l}");
        }
    }

    fn kv(&self, k: &str, v: &str) {
        println!("  {k:<11} {v}");
    }

    fn cmd(&self, c: &str) {
        println!("  {}", self.style("1", &format!("$ {c}")));
    }

    fn out(&self, text: &str, n: &Names) {
        for l in text.lines() {
            println!("    {}", self.style("2", &n.short(l)));
        }
    }

    fn dim(&self, s: &str) {
        println!("{}", self.style("2", s));
    }

    fn logs(&self, who: &str, lines: &[String], n: &Names) {
        for l in lines {
            // "<time> <LEVEL> <program>[<pid>]: <message>" -> level + message.
            let (head, msg) = l.split_once("]: ").unwrap_or(("", l));
            let level = head.split_whitespace().nth(1).unwrap_or("");
            let text = n.short(&format!("{who} {level:<5} {msg}"));
            for (i, w) in wrap(&text, WIDTH - 6).into_iter().enumerate() {
                let indent = if i == 0 { "    " } else { "        " };
                println!("{indent}{}", self.style("2", &w));
            }
        }
    }

    fn good(&self, s: &str) {
        self.mark("32", "✓", s);
    }

    fn bad(&self, s: &str) {
        self.mark("31", "✗", s);
    }

    fn mark(&self, colour: &str, sign: &str, s: &str) {
        for (i, l) in wrap(s, WIDTH - 4).into_iter().enumerate() {
            let lead = if i == 0 { sign } else { " " };
            println!("  {}", self.style(colour, &format!("{lead} {l}")));
        }
    }
}

/// Greedy word wrap.
fn wrap(text: &str, width: usize) -> Vec<String> {
    let mut lines = Vec::new();
    let mut cur = String::new();
    for w in text.split_whitespace() {
        if !cur.is_empty() && cur.chars().count() + 1 + w.chars().count() > width {
            lines.push(std::mem::take(&mut cur));
        }
        if !cur.is_empty() {
            cur.push(' ');
        }
        cur.push_str(w);
    }
    if !cur.is_empty() {
        lines.push(cur);
    }
    lines
}
