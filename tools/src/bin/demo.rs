//! `demo`: the story `./demo.sh` tells. A node made of a network namespace
//! and a temp dir, a primary CNI (bridge + host-local + portmap), the fake
//! Kubernetes API server, the real installer and plugin, and libcni (the
//! library containerd and CRI-O embed) adding pods: the upstream installer
//! race, meshed and unmeshed pods with their iptables rules, the chain
//! healing after the primary rewrites its conflist, and a rolling update
//! of the installer during which a meshed pod still gets its rules.
//!
//! Run as root after building the release binaries (demo.sh does both).
//! Nothing outside its namespaces and temp dir is touched, and everything is
//! removed at the end, also on Ctrl-C, SIGTERM, a failed step or a panic
//! (Drop guards; see the crate's doc), then checked to be gone.

use std::io::IsTerminal;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use conformance::iptables::{Family, NatTable};
use conformance::{Completed, Node, Pod, PodSpec, artifacts};
use linkerd_cni_tools::scenario::{self, Binaries, InstallerOptions, InstallerPod};
use linkerd_cni_tools::stop::{self, Stop, checkpoint};
use serde_json::{Value, json};
use testkit::FakeApiServer;
use testkit::installer::InstallerProcess;
use testkit::objects;

/// The network name, as a Calico node has it.
const NETWORK: &str = "k8s-pod-network";
/// The primary's conflist.
const PRIMARY_FILE: &str = "10-k8s-pod-network.conflist";
/// The installer's resync period in this demo (10 s in the chart).
const RESYNC: Duration = Duration::from_secs(3);
/// The installer's DaemonSet, in namespace linkerd-cni, as the API server
/// knows it.
const DS: &str = "linkerd-cni";
const DS_UID: &str = "0d5e7a1c-0000-4000-8000-000000000001";
/// The gap of the rolling update: the old installer pod is gone, the new
/// one not started yet.
const GAP: Duration = Duration::from_secs(3);
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

fn run(o: &Out) -> Result<(), Stop> {
    let started = Instant::now();
    let bins = intro(o)?;
    checkpoint()?;
    let (node, n, api) = step1_node(o);
    checkpoint()?;
    let first = installer_pod(&api, "linkerd-cni-7xk2p");
    let mut installer = step2_installer_before_primary(o, &node, &bins, &api, &first, &n)?;
    checkpoint()?;
    let (web, batch) = step3_two_pods(o, &node, &api, &n)?;
    checkpoint()?;
    step4_primary_rewrite(o, &node, &bins, &mut installer, &n)?;
    checkpoint()?;
    let (mut installer, web3) =
        step5_rolling_update(o, &node, &bins, &api, (installer, &first), &n)?;
    checkpoint()?;
    let web2 = step6_add_heals(o, &node, &bins, &mut installer, &n)?;
    checkpoint()?;
    step7_clean_up(o, node, api, installer, [web, batch, web2, web3])?;
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
         Nothing touches this machine's /etc/cni/net.d, /opt/cni/bin or network, \
         and everything is removed at the end (also on Ctrl-C).",
    );
    let bins = Binaries::find().map_err(Stop::failed)?;
    // Built on first use; a cold Go cache takes a while, so say so.
    o.dim("(building the libcni driver, a small Go program, against Debian's libcni...)");
    let _ = artifacts::cnidriver();
    Ok(bins)
}

/// Step 1: the node, its (empty) conf dir, and the API server's pods.
fn step1_node(o: &Out) -> (Node, Names, FakeApiServer) {
    o.section(1, "A node, its primary CNI, and a Kubernetes API server");
    let node = Node::without_linkerd_cni();
    let n = Names::new(&node);
    // The installer writes the kubeconfig, as on a real node.
    let api = node.start_api_server_only();
    api.add_namespace("demo", &[]);
    api.add_pod(&objects::Pod::meshed("demo", "web"));
    api.add_pod(&objects::Pod::new("demo", "batch"));
    api.add_pod(&objects::Pod::meshed("demo", "web-2"));
    api.add_pod(&objects::Pod::meshed("demo", "web-3"));
    api.set(
        &objects::daemonset_path("linkerd-cni", DS),
        objects::daemonset("linkerd-cni", DS, DS_UID, false),
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
    o.kv(
        "API server",
        &format!("{} inside the node (TLS, bearer token)", api.url()),
    );
    o.kv("", "a stand-in for Kubernetes, serving:");
    o.kv("", "pod demo/web    has a linkerd-proxy container: meshed");
    o.kv("", "pod demo/batch  has none: not meshed");
    o.kv("", "pod demo/web-3  meshed too (step 5)");
    o.kv("", "pod demo/web-2  meshed too (step 6)");
    o.kv(
        "",
        "DaemonSet linkerd-cni/linkerd-cni and its installer pods",
    );
    (node, n, api)
}

/// Step 2: the installer starts before the primary CNI writes its config,
/// with no file watcher; its periodic pass chains it.
fn step2_installer_before_primary(
    o: &Out,
    node: &Node,
    bins: &Binaries,
    api: &FakeApiServer,
    pod: &InstallerPod,
    n: &Names,
) -> Result<InstallerProcess, Stop> {
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
         only after the installer started.",
    );
    o.cmd(&format!(
        "LINKERD_CNI_WATCH=false LINKERD_CNI_RESYNC_SECONDS={} linkerd-cni-installer",
        RESYNC.as_secs()
    ));
    let mut installer = start_as(node, bins, api, pod)?;
    wait_for(Duration::from_secs(10), || {
        node.conf_dir().join("ZZZ-linkerd-cni-entry").exists()
    })
    .map_err(|_| {
        Stop::failed(format!(
            "the installer did not complete its first pass within 10 s; its log:\n{}",
            installer.new_log_lines().join("\n")
        ))
    })?;
    stop::sleep(Duration::from_millis(200))?;
    o.logs("installer", &installer.new_log_lines(), n);
    o.say(&format!(
        "Its first pass installed the binary and the kubeconfig, and wrote no network \
         config: there is no primary config to chain yet. Files: {}.",
        node.conf_dir_names()
            .iter()
            .map(|f| format!("net.d/{f}"))
            .collect::<Vec<_>>()
            .join(", ")
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
    show_status(o, node, bins, n);
    o.say("No event will come. The installer's next periodic pass has to find it...");
    let healed = wait_for(RESYNC + Duration::from_secs(5), || node.linkerd_last())
        .map_err(|_| Stop::failed("the installer did not chain the primary's config"))?;
    o.good(&format!(
        "chained {:.1} s after the primary wrote its config, by the periodic reconcile \
         (no file event was involved):",
        (healed - written).as_secs_f64()
    ));
    o.logs("installer", &installer.new_log_lines(), n);
    o.cmd("linkerd-cni chain status --conf-dir $NODE/net.d");
    show_status(o, node, bins, n);
    Ok(installer)
}

/// Step 3: a meshed and an unmeshed pod, added through libcni.
fn step3_two_pods(
    o: &Out,
    node: &Node,
    api: &FakeApiServer,
    n: &Names,
) -> Result<(Pod, Pod), Stop> {
    o.section(3, "Two pods, added the way containerd and CRI-O add them");
    o.say(
        "Each pod is a network namespace. The libcni driver runs the active conflist \
         for it, plugin after plugin, as the container runtime would, with the \
         kubelet's CNI_ARGS naming the pod.",
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

/// Step 4: the primary rewrites its conflist without linkerd-cni; the
/// installer repairs it.
fn step4_primary_rewrite(
    o: &Out,
    node: &Node,
    bins: &Binaries,
    installer: &mut InstallerProcess,
    n: &Names,
) -> Result<(), Stop> {
    o.section(
        4,
        "The primary CNI rewrites its conflist without linkerd-cni",
    );
    o.say(
        "Calico's installer, for one, rewrites its file on every restart. This new \
         version also changes the bridge's MTU, and drops linkerd-cni:",
    );
    let rewritten = primary_conflist(node, true);
    node.write_conf(PRIMARY_FILE, &rewritten);
    let written = Instant::now();
    o.out(
        &format!(
            "plugins: {}   (bridge \"mtu\": 1400)",
            types(node).join(" -> ")
        ),
        n,
    );
    o.cmd("linkerd-cni chain status --conf-dir $NODE/net.d");
    show_status(o, node, bins, n);
    o.say(
        "A pod started now would get no rules: the runtime never calls a plugin that \
         is not in the chain. The installer's next pass repairs it...",
    );
    let healed = wait_for(RESYNC + Duration::from_secs(5), || node.linkerd_last())
        .map_err(|_| Stop::failed("the installer did not repair the chain"))?;
    o.good(&format!(
        "repaired {:.1} s after the rewrite, keeping the primary's new content:",
        (healed - written).as_secs_f64()
    ));
    o.logs("installer", &installer.new_log_lines(), n);
    o.out(
        &format!(
            "plugins: {}   (bridge \"mtu\": {})",
            types(node).join(" -> "),
            active_json(node)["plugins"][0]["mtu"]
        ),
        n,
    );
    Ok(())
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

/// Starts the installer as `pod`, with no file watcher (see step 2).
fn start_as(
    node: &Node,
    bins: &Binaries,
    api: &FakeApiServer,
    pod: &InstallerPod,
) -> Result<InstallerProcess, Stop> {
    scenario::start_installer_as(
        node,
        bins,
        Some(api),
        InstallerOptions {
            watch: false,
            resync: RESYNC,
        },
        Some(pod),
    )
    .map_err(Stop::failed)
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

/// Step 5: a rolling update of the installer: the old pod goes (its token
/// with it), a gap, the new one starts; a meshed pod added in the gap gets
/// its rules.
fn step5_rolling_update(
    o: &Out,
    node: &Node,
    bins: &Binaries,
    api: &FakeApiServer,
    (mut old, old_pod): (InstallerProcess, &InstallerPod),
    n: &Names,
) -> Result<(InstallerProcess, Pod), Stop> {
    o.section(5, "A rolling update of the installer, and a pod in its gap");
    o.say(&format!(
        "The kubeconfig the plugin uses does not hold the installer pod's token: it holds          {}, minted by the installer through the TokenRequest API for the plugin's own          ServiceAccount, which may only read pods, namespaces and the kubernetes Service.",
        kubeconfig_subject(node, "")
    ));
    o.say(
        "A rolling update stops the old installer pod (SIGTERM). Its DaemonSet is still          there, so it leaves everything installed:",
    );
    let code = old.stop();
    o.logs("installer", &old.new_log_lines(), n);
    o.dim(&format!("  (installer exit code {})", fmt_code(code)));
    drop(old);
    api.remove(&objects::pod_path("linkerd-cni", &old_pod.name));
    api.revoke_token(&old_pod.token);
    o.say(&format!(
        "Its pod object is deleted, which revokes its token (the API server answers 401          to it from now on). The new pod starts {} s later. Meanwhile a meshed pod starts:",
        GAP.as_secs()
    ));
    let web3 = node.pod(PodSpec::kubernetes("demo", "web-3"));
    let gap_started = Instant::now();
    add(o, node, &web3, "demo/web-3 (meshed, no installer running)")?;
    expect_reference_rules(o, &web3)?;
    o.good("it got its rules: the plugin's token outlived the installer pod");
    stop::sleep(GAP.saturating_sub(gap_started.elapsed()))?;
    o.say("The new installer pod starts:");
    let pod = installer_pod(api, "linkerd-cni-q4m9z");
    let mut new = start_as(node, bins, api, &pod)?;
    wait_for(Duration::from_secs(10), || {
        new.log().contains("starting:") && node.linkerd_last()
    })
    .map_err(|_| Stop::failed("the new installer did not start"))?;
    stop::sleep(Duration::from_millis(500))?;
    o.logs("installer", &new.new_log_lines(), n);
    o.say(&format!(
        "It keeps the plugin's token ({}) instead of writing one of its own: nothing          in the conf dir changed, so the runtime had nothing to reload.",
        kubeconfig_subject(node, &pod.token)
    ));
    Ok((new, web3))
}

/// Step 6: with the installer stopped, a pod's ADD heals the chain.
fn step6_add_heals(
    o: &Out,
    node: &Node,
    bins: &Binaries,
    installer: &mut InstallerProcess,
    n: &Names,
) -> Result<Pod, Stop> {
    o.section(6, "No installer running: a pod ADD heals the chain");
    o.say(
        "The installer stops (SIGTERM: it exits and leaves everything installed, so a \
         restart or an upgrade never unchains pods).",
    );
    let code = installer.stop();
    o.logs("installer", &installer.new_log_lines(), n);
    o.dim(&format!("  (installer exit code {})", fmt_code(code)));
    o.say(
        "Now the primary upgrades: its new conflist keeps the entries it does not know \
         but appends a new plugin of its own (tuning) after them, so linkerd-cni is no \
         longer last and would see an unfinished result:",
    );
    let upgraded = upgraded_conflist(node);
    node.write_conf(PRIMARY_FILE, &upgraded);
    o.out(&format!("plugins: {}", types(node).join(" -> ")), n);
    o.cmd("linkerd-cni chain status --conf-dir $NODE/net.d");
    show_status(o, node, bins, n);
    o.say(
        "The plugin checks the chain on every ADD (read-only and lock-free when \
         healthy) and repairs it under a lock, atomically. A meshed pod starts:",
    );
    let web2 = node.pod(PodSpec::kubernetes("demo", "web-2"));
    let done = add(o, node, &web2, "demo/web-2 (meshed)")?;
    let plugin_log: Vec<String> = done
        .execs("linkerd-cni")
        .flat_map(|e| e.stderr.lines().map(String::from).collect::<Vec<_>>())
        .collect();
    o.logs("linkerd-cni", &plugin_log, n);
    expect_reference_rules(o, &web2)?;
    o.say("The chain is healthy again:");
    o.cmd("linkerd-cni chain status --conf-dir $NODE/net.d");
    show_status(o, node, bins, n);
    o.say(
        "(A conflist without linkerd-cni at all never runs the plugin: that blind spot \
         is why the installer also reconciles on a timer, as in steps 2 and 4.)",
    );
    Ok(web2)
}

/// Step 7: DEL of every pod, then everything the demo made is removed (in
/// the order the guards need: pods, API server, installer, node).
fn step7_clean_up(
    o: &Out,
    node: Node,
    api: FakeApiServer,
    installer: InstallerProcess,
    pods: [Pod; 4],
) -> Result<(), Stop> {
    let [web, batch, web2, web3] = pods;
    o.section(7, "Clean-up");
    let mut dels = Vec::new();
    for (pod, name) in [
        (&web, "demo/web"),
        (&batch, "demo/batch"),
        (&web2, "demo/web-2"),
        (&web3, "demo/web-3"),
    ] {
        match node.del(NETWORK, pod) {
            Ok(_) => dels.push(format!("{name} ok")),
            Err(f) => return Err(Stop::failed(format!("DEL {name} failed: {f}"))),
        }
    }
    o.say(&format!(
        "DEL through libcni (plugins in reverse order): {}.",
        dels.join(", ")
    ));
    let netns = [
        node.netns().name().to_string(),
        web.netns().name().to_string(),
        batch.netns().name().to_string(),
        web2.netns().name().to_string(),
        web3.netns().name().to_string(),
    ];
    let dir = node.dir().display().to_string();
    drop((web, batch, web2, web3));
    drop(api);
    drop(installer);
    drop(node);
    o.say(&format!(
        "Removed the network namespaces {} (with the bridge and veths inside), and {dir}.",
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

/// The active conflist with `tuning` appended after everything, as a
/// primary's upgrade that keeps foreign entries would write it.
fn upgraded_conflist(node: &Node) -> Value {
    let mut v = active_json(node);
    if let Some(p) = v.get_mut("plugins").and_then(Value::as_array_mut) {
        p.push(json!({"type": "tuning", "sysctl": {"net.core.somaxconn": "1024"}}));
    }
    v
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
    let ran: Vec<String> = done
        .trace
        .iter()
        .map(|e| format!("{} ({} ms)", e.plugin, e.duration.as_millis()))
        .collect();
    o.say(&format!("libcni ran: {}.", ran.join(" -> ")));
    Ok(done)
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

/// Polls `f` every 10 ms until it holds (returns when) or `limit` passes.
fn wait_for(limit: Duration, mut f: impl FnMut() -> bool) -> Result<Instant, Stop> {
    let end = Instant::now() + limit;
    loop {
        if f() {
            return Ok(Instant::now());
        }
        checkpoint()?;
        if Instant::now() > end {
            return Err(Stop::failed("timed out"));
        }
        std::thread::sleep(Duration::from_millis(10));
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

    fn short(&self, s: &str) -> String {
        s.replace(&self.dir, "$NODE")
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
