//! Measurements through CRI that the tests make (the benchmark of sandbox
//! creation is the tools crate's `cri_bench`).
//!
//! - [`primary_rewrites`]: the primary CNI rewrites its config without
//!   linkerd-cni's entry (as Calico's init container does on every restart)
//!   and a meshed pod is created right after: how many such pods came up
//!   without their rules. Parameterised by how the chain is kept
//!   ([`ChainKeeping`]), so every chain mode the project has is measured the
//!   same way.

use std::any::Any;

use serde_json::Value;
use testkit::FakeApiServer;

use super::containerd::CriNode;
use super::pods::SandboxNetns;
use crate::chains::{self, Primary};
use crate::kube::{self, APP_NAMESPACE};
use crate::modes::{ChainMode, MARKER_KEY};
use crate::node::Node;

/// One way of keeping linkerd-cni's entry in the node's active chain.
pub trait ChainKeeping {
    /// For reports, e.g. "inline".
    fn name(&self) -> String;

    /// Starts keeping the chain of `node` (its primary's config is in
    /// place, the fake API server `api` runs in the node, the node's bin
    /// dir has no linkerd-cni yet). The returned guard stops it on drop.
    fn start(&self, node: &CriNode, api: &FakeApiServer) -> Box<dyn Any>;

    /// Whether `source`, a network list containerd loaded, chains
    /// linkerd-cni as this mode intends (the meshing chain).
    fn is_meshing(&self, source: &Value) -> bool {
        source["plugins"]
            .as_array()
            .and_then(|p| p.last())
            .is_some_and(|last| last["type"] == "linkerd-cni")
    }
}

/// Today's mode: linkerd-cni's entry inline in the primary's list, kept
/// there by the installer (inotify watch plus resync) and healed by the
/// plugin during a pod's ADD.
#[derive(Debug, Clone, Copy)]
pub struct Inline;

impl ChainKeeping for Inline {
    fn name(&self) -> String {
        "inline".into()
    }

    fn start(&self, node: &CriNode, api: &FakeApiServer) -> Box<dyn Any> {
        Box::new(crate::installer::start(
            node,
            api,
            &[
                ("LINKERD_CNI_WATCH", "true"),
                ("LINKERD_CNI_RESYNC_SECONDS", "1"),
            ],
        ))
    }
}

/// Owned mode: linkerd-cni keeps its own conflist, a copy of the
/// primary's chain with its entry last, sorting before the primary's file,
/// so the runtime never loads the primary's rewrite without linkerd-cni;
/// an ADD that ran a copy older than the primary's file is answered "try
/// again later" (CNI code 11) and retried, as the kubelet retries a sandbox.
#[derive(Debug, Clone, Copy)]
pub struct Owned;

impl ChainKeeping for Owned {
    fn name(&self) -> String {
        ChainMode::Owned.as_str().into()
    }

    fn start(&self, node: &CriNode, api: &FakeApiServer) -> Box<dyn Any> {
        Box::new(crate::installer::start(
            node,
            api,
            &[
                ("LINKERD_CNI_WATCH", "true"),
                ("LINKERD_CNI_RESYNC_SECONDS", "1"),
                ChainMode::Owned.installer_env(),
            ],
        ))
    }

    /// Our own file: linkerd-cni last, carrying the marker of the
    /// primary's chain it copies.
    fn is_meshing(&self, source: &Value) -> bool {
        source["plugins"]
            .as_array()
            .and_then(|p| p.last())
            .is_some_and(|last| last["type"] == "linkerd-cni" && last[MARKER_KEY].is_object())
    }
}

/// RunPodSandbox attempts per pod: a failure whose message asks to try
/// again (CNI code 11) is retried with the same pod, as the kubelet
/// retries a sandbox. More than the plugin's bound on retries per pod, so
/// that a pod sent back too often shows as such, not as a failure.
const ATTEMPTS: usize = 8;

/// RunPodSandbox for pod `name`, retried while it asks to try again, at
/// most [`ATTEMPTS`] calls in all: the last answer, and the retries.
pub fn run_retried<'a>(
    node: &'a CriNode,
    name: &str,
) -> (
    Result<super::pods::Sandbox<'a>, super::grpc::GrpcError>,
    usize,
) {
    let spec = node.sandbox_spec(APP_NAMESPACE, name);
    let mut run = node.run_pod_spec(&spec);
    let mut retried = 0;
    for _ in 1..ATTEMPTS {
        match &run {
            Err(e) if e.to_string().contains("try again") => {
                retried += 1;
                run = node.run_pod_spec(&spec);
            }
            _ => break,
        }
    }
    (run, retried)
}

/// What [`primary_rewrites`] or [`primary_burst`] saw.
#[derive(Debug, Clone)]
pub struct RewriteReport {
    pub keeping: String,
    /// How the pods were created, for the report.
    pub scenario: &'static str,
    /// Meshed pods created.
    pub pods: usize,
    /// Of those, the ones whose sandbox has no linkerd-cni rules.
    pub unmeshed: usize,
    /// RunPodSandbox calls that failed asking to try again (CNI code 11)
    /// and were retried.
    pub retried: usize,
    /// The most retries one pod needed.
    pub most_retries: usize,
    /// Pods whose sandbox had some but not exactly the reference rules, or
    /// whose RunPodSandbox failed: never acceptable.
    pub broken: Vec<String>,
    /// What the node's teardown found left behind.
    pub left_behind: Vec<String>,
}

impl std::fmt::Display for RewriteReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}: {} of {} meshed pods {} came up unmeshed; {} RunPodSandbox calls answered \"try again\" and retried ({:.2} per pod, at most {} for one pod)",
            self.keeping,
            self.unmeshed,
            self.pods,
            self.scenario,
            self.retried,
            self.retried as f64 / self.pods.max(1) as f64,
            self.most_retries
        )
    }
}

impl RewriteReport {
    fn new(keeping: &dyn ChainKeeping, scenario: &'static str) -> RewriteReport {
        RewriteReport {
            keeping: keeping.name(),
            scenario,
            pods: 0,
            unmeshed: 0,
            retried: 0,
            most_retries: 0,
            broken: Vec::new(),
            left_behind: Vec::new(),
        }
    }

    /// A meshed pod's sandbox: unmeshed without rules, broken with some
    /// but not exactly the reference rules.
    fn judge_meshed(&mut self, name: &str, ns: &SandboxNetns) {
        if !ns.has_linkerd_rules() {
            self.unmeshed += 1;
        } else if let Err(e) = std::panic::catch_unwind(|| ns.expect_reference_rules()) {
            self.broken.push(format!("{name}: partial rules: {e:?}"));
        }
    }
}

/// A containerd node whose primary (`tag` network, generation 0) is kept
/// by `keeping`: the node, the API server, the network's name, the
/// primary's file name, and the keeper's guard (drop it before the node's
/// shutdown).
fn start_kept(
    keeping: &dyn ChainKeeping,
    tag: &str,
) -> (CriNode, FakeApiServer, String, String, Box<dyn Any>) {
    let node = Node::without_linkerd_cni();
    let api = node.start_api_server_only();
    let net = node.network_name(tag);
    let file = format!("10-{net}.conflist");
    node.write_conf(&file, &primary_conf(&node, &net, 0));
    let node = CriNode::start(node);
    let keeper = keeping.start(&node, &api);
    (node, api, net, file, keeper)
}

/// Until containerd has loaded a chain of `net` that `keeping` calls
/// meshing.
fn wait_meshing(node: &CriNode, keeping: &dyn ChainKeeping, net: &str) {
    node.wait_cni_loaded("a meshing chain", |sources| {
        sources
            .iter()
            .filter_map(|s| serde_json::from_str::<Value>(s).ok())
            .any(|v| v["name"] == net && keeping.is_meshing(&v))
    });
}

/// The primary's own list (no linkerd-cni), different at each
/// `generation` as a real rewrite after an upgrade would be.
fn primary_conf(node: &Node, net: &str, generation: u64) -> Value {
    let mut plugins = chains::typical_chain(node, Primary::Ptp, None);
    plugins[0]["mtu"] = (1400 + generation).into();
    chains::conflist(net, "1.0.0", plugins)
}

/// Starts a containerd node kept by `keeping`, then `rounds` times: the
/// primary rewrites its config without linkerd-cni (rename within the conf
/// dir, as its installer does), a meshed pod is created through CRI at
/// once, its sandbox's rules are read, it is removed, and the next round
/// waits for the chain to be meshing again. Rounds stay below the
/// installer's and the plugin's fight thresholds.
pub fn primary_rewrites(keeping: &dyn ChainKeeping, rounds: usize) -> RewriteReport {
    let (node, api, net, file, keeper) = start_kept(keeping, "rewrite");
    let mut report = RewriteReport::new(keeping, "created right after the primary's rewrite");
    let meshing = |node: &CriNode| wait_meshing(node, keeping, &net);
    for round in 0..rounds {
        meshing(&node);
        node.replace_conf(&file, &primary_conf(&node, &net, round as u64 + 1));
        let name = format!("web-{round}");
        kube::serve_meshed(&api, &name);
        report.pods += 1;
        let (run, retried) = run_retried(&node, &name);
        report.retried += retried;
        report.most_retries = report.most_retries.max(retried);
        match run {
            Ok(sbx) => {
                report.judge_meshed(&name, &sbx.netns());
                if let Err(e) = sbx.stop_and_remove() {
                    report.broken.push(format!("{name}: stop/remove: {e}"));
                }
            }
            Err(e) => report.broken.push(format!("{name}: RunPodSandbox: {e}")),
        }
    }
    meshing(&node);
    drop(keeper);
    report.left_behind = node.shutdown();
    report
}

/// The CRI tier's burst, which the tests assert on and the benchmark
/// (`cri_bench --burst`) counts: 10 times, 20 pods (every other one
/// meshed) while the primary rewrites its config 5 times 50 ms apart.
pub fn tier_burst(keeping: &dyn ChainKeeping) -> RewriteReport {
    primary_burst(keeping, 10, 20, 5, std::time::Duration::from_millis(50))
}

/// The primary's rewrites in a burst: `repetitions` times, once the chain
/// is meshing, `pods` pods (every other one meshed: the meshed ones are
/// counted) are created through CRI at once while
/// the primary rewrites its config without linkerd-cni `rewrites` times,
/// `spacing` apart (rename within the conf dir, new content each time);
/// each pod's rules are read, then all are removed. A RunPodSandbox that
/// asks to try again is retried, as the kubelet would. New content each
/// time is no fight, so neither keeper rate-limits its repairs.
pub fn primary_burst(
    keeping: &dyn ChainKeeping,
    repetitions: usize,
    pods: usize,
    rewrites: usize,
    spacing: std::time::Duration,
) -> RewriteReport {
    let (node, api, net, file, keeper) = start_kept(keeping, "burst");
    let mut report = RewriteReport::new(keeping, "created in bursts while the primary rewrote");
    let meshing = |node: &CriNode| wait_meshing(node, keeping, &net);
    let mut generation = 0;
    for rep in 0..repetitions {
        meshing(&node);
        let names: Vec<(String, bool)> = (0..pods)
            .map(|i| (format!("web-{rep}-{i}"), i % 2 == 0))
            .collect();
        for (n, meshed) in &names {
            if *meshed {
                kube::serve_meshed(&api, n);
            } else {
                kube::serve_unmeshed(&api, n);
            }
        }
        let first = generation + 1;
        generation += rewrites as u64;
        let outcomes = std::thread::scope(|s| {
            let node = &node;
            let (net, file) = (&net, &file);
            s.spawn(move || {
                for g in first..first + rewrites as u64 {
                    node.replace_conf(file, &primary_conf(node, net, g));
                    std::thread::sleep(spacing);
                }
            });
            let handles: Vec<_> = names
                .iter()
                .map(|(name, meshed)| {
                    s.spawn(move || {
                        let (run, retried) = run_retried(node, name);
                        (name.clone(), *meshed, run, retried)
                    })
                })
                .collect();
            handles
                .into_iter()
                .filter_map(|h| h.join().ok())
                .collect::<Vec<_>>()
        });
        let mut sandboxes = Vec::new();
        for (name, meshed, run, retried) in outcomes {
            report.retried += retried;
            report.most_retries = report.most_retries.max(retried);
            report.pods += usize::from(meshed);
            match run {
                Ok(sbx) => {
                    let ns = sbx.netns();
                    if meshed {
                        report.judge_meshed(&name, &ns);
                    } else if ns.has_linkerd_rules() {
                        report.broken.push(format!("{name}: unmeshed, with rules"));
                    }
                    drop(ns);
                    sandboxes.push((name, sbx));
                }
                Err(e) => report.broken.push(format!("{name}: RunPodSandbox: {e}")),
            }
        }
        let removed: Vec<String> = std::thread::scope(|s| {
            let handles: Vec<_> = sandboxes
                .into_iter()
                .map(|(name, sbx)| {
                    s.spawn(move || {
                        sbx.stop_and_remove()
                            .err()
                            .map(|e| format!("{name}: stop/remove: {e}"))
                    })
                })
                .collect();
            handles
                .into_iter()
                .filter_map(|h| h.join().ok().flatten())
                .collect()
        });
        report.broken.extend(removed);
    }
    meshing(&node);
    drop(keeper);
    report.left_behind = node.shutdown();
    report
}
