//! Sandbox creation time through containerd's CRI, with and without
//! linkerd-cni in the chain, interleaved: RunPodSandbox wall time on two
//! containerd nodes of the conformance harness that differ only in
//! linkerd-cni's entry at the end of the chain.

use std::time::Instant;

use conformance::chains::{self, Primary};
use conformance::cri::containerd::CriNode;
use conformance::kube::{self, APP_NAMESPACE};
use conformance::node::Node;

use crate::stats::{self, Samples};

/// [`sandbox_creation`]'s samples, in milliseconds.
#[derive(Debug, Clone)]
pub struct CreationTimes {
    /// RunPodSandbox of a meshed pod, linkerd-cni last in the chain.
    pub with_linkerd: Samples,
    /// RunPodSandbox on the same chain without linkerd-cni.
    pub without_linkerd: Samples,
}

/// RunPodSandbox wall time through CRI, on two containerd nodes that differ
/// only in linkerd-cni's entry at the end of the chain; `pairs` pairs,
/// interleaved (the order alternates each pair), each sandbox stopped and
/// removed before the next. Panics on any failure: a benchmark of failing
/// calls measures nothing.
pub fn sandbox_creation(pairs: usize) -> CreationTimes {
    let with = {
        let node = Node::new();
        let api = node.start_api_server();
        let net = node.network_name("bench");
        let plugins =
            chains::typical_chain(&node, Primary::Ptp, Some(chains::linkerd_entry(&node)));
        node.write_conf(
            &format!("10-{net}.conflist"),
            &chains::conflist(&net, "1.0.0", plugins),
        );
        (CriNode::start(node), api)
    };
    let without = {
        let node = Node::new();
        let net = node.network_name("bench");
        let plugins = chains::typical_chain(&node, Primary::Ptp, None);
        node.write_conf(
            &format!("10-{net}.conflist"),
            &chains::conflist(&net, "1.0.0", plugins),
        );
        CriNode::start(node)
    };
    for n in [&with.0, &without] {
        n.wait_cni_loaded("the benchmark chain", |s| s.len() == 2);
    }
    let time = |node: &CriNode, name: &str| {
        let started = Instant::now();
        let sbx = node
            .run_pod(APP_NAMESPACE, name)
            .unwrap_or_else(|e| panic!("RunPodSandbox {name}: {e}"));
        let took = started.elapsed();
        sbx.stop_and_remove()
            .unwrap_or_else(|e| panic!("removing {name}: {e}"));
        took
    };
    let mut times = CreationTimes {
        with_linkerd: Samples::new(),
        without_linkerd: Samples::new(),
    };
    for i in 0..pairs {
        let name = format!("web-{i}");
        kube::serve_meshed(&with.1, &name);
        if i % 2 == 0 {
            times.with_linkerd.push_duration(time(&with.0, &name));
            times.without_linkerd.push_duration(time(&without, &name));
        } else {
            times.without_linkerd.push_duration(time(&without, &name));
            times.with_linkerd.push_duration(time(&with.0, &name));
        }
    }
    let (node, api) = with;
    drop(api);
    for left in [node.shutdown(), without.shutdown()] {
        assert!(left.is_empty(), "left behind: {left:?}");
    }
    times
}

impl CreationTimes {
    /// The benchmark's table, in the format of BENCHMARKS.md.
    pub fn markdown(&self) -> String {
        let (a, b) = (&self.with_linkerd, &self.without_linkerd);
        let diff = stats::paired_differences(a, b);
        format!(
            "| chain (containerd CRI, RunPodSandbox of a pod) | median [p10–p90] |\n\
             |---|---|\n\
             | ptp → portmap → tuning → linkerd-cni (meshed pod) | {} |\n\
             | ptp → portmap → tuning | {} |\n\n\
             {} pairs, interleaved. Ratio of medians with / without: **{}×**; \
             per-pair difference: {}.\n",
            a.summary("ms"),
            b.summary("ms"),
            a.len(),
            stats::fmt_num(stats::ratio(a, b)),
            diff.summary("ms"),
        )
    }
}

/// The CRI tier's burst ([`measure::tier_burst`]) on the binaries under
/// measurement (the shipped ones, through `scripts/tool.sh`): `rounds`
/// times, each chain mode in turn (the order alternating each round). One
/// line per mode and round, then the totals, as Markdown.
pub fn burst(rounds: usize) -> String {
    use conformance::cri::measure::{self, ChainKeeping};
    let modes: [&dyn ChainKeeping; 2] = [&measure::Inline, &measure::Owned];
    let mut rows = Vec::new();
    for round in 0..rounds {
        for k in 0..modes.len() {
            let Some(keeping) = modes.get((round + k) % modes.len()).copied() else {
                continue;
            };
            let r = measure::tier_burst(keeping);
            assert!(r.broken.is_empty(), "{r}: {:#?}", r.broken);
            assert!(r.left_behind.is_empty(), "{r}: {:#?}", r.left_behind);
            eprintln!("cri_bench: round {}: {r}", round + 1);
            rows.push((round + 1, r));
        }
    }
    let mut out = String::from(
        "| round | mode | meshed pods without rules | RunPodSandbox retries | most for one pod |\n|---|---|---|---|---|\n",
    );
    for (round, r) in &rows {
        out.push_str(&format!(
            "| {round} | {} | {} of {} | {} | {} |\n",
            r.keeping, r.unmeshed, r.pods, r.retried, r.most_retries
        ));
    }
    for keeping in modes {
        let name = keeping.name();
        let of: Vec<_> = rows
            .iter()
            .map(|(_, r)| r)
            .filter(|r| r.keeping == name)
            .collect();
        let (unmeshed, pods, retried) = of.iter().fold((0, 0, 0), |(u, p, t), r| {
            (u + r.unmeshed, p + r.pods, t + r.retried)
        });
        let counts: Vec<String> = of.iter().map(|r| r.unmeshed.to_string()).collect();
        out.push_str(&format!(
            "\n{name}: {unmeshed} of {pods} meshed pods without rules (per 100: {}), {retried} retries.",
            counts.join(", ")
        ));
    }
    out.push('\n');
    out
}
