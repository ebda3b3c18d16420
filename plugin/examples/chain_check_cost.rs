//! What the healthy-path chain check costs an ADD: `heal_on_add` (entry file
//! and diagnosis) on a conf dir holding a realistic Calico conflist with the
//! linkerd-cni entry last, plus Calico's kubeconfig and our entry file.
//!
//! `cargo run --release -p linkerd-cni --example chain_check_cost [ITERATIONS]`
//!
//! A measurement for people, not a test: it prints the median and the 99th
//! percentile and asserts nothing about them.

use std::fs;
use std::time::{Duration, Instant};

use linkerd_cni::cni::NetConf;
use linkerd_cni::config::PluginConfig;
use linkerd_cni::heal;
use linkerd_cni_chain::{self as chain, Entry};
use serde_json::Value;

const CALICO: &str = include_str!("../../chain/tests/fixtures/chain/calico/in/10-calico.conflist");
const ENTRY: &str = include_str!("../../chain/tests/fixtures/chain/entry.json");

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted.get(i).copied().unwrap_or_default()
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let n: usize = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(20_000);
    let dir = std::env::temp_dir().join(format!("lcni-check-cost-{}", std::process::id()));
    fs::create_dir_all(&dir)?;
    let entry = Entry::parse(ENTRY.as_bytes(), "entry.json")?;
    fs::write(dir.join("10-calico.conflist"), CALICO)?;
    fs::write(
        dir.join("calico-kubeconfig"),
        "apiVersion: v1\nkind: Config\n",
    )?;
    chain::persist_entry(&dir, &entry)?;
    chain::repair(&dir, &entry, &chain::RepairOptions::default())?;

    let mut stdin = entry.clone().into_map();
    stdin.insert("cni_conf_dir".into(), dir.to_string_lossy().into());
    stdin.insert("name".into(), "k8s-pod-network".into());
    stdin.insert("cniVersion".into(), "0.3.1".into());
    let conf = NetConf::parse(Value::Object(stdin).to_string().as_bytes())?;
    let config = PluginConfig::from_netconf(&conf)?;
    assert!(chain::diagnose(&dir, &entry)?.is_healthy());

    for (what, f) in [
        (
            "heal_on_add (healthy)",
            &(|| heal::heal_on_add(&conf, &config)) as &dyn Fn(),
        ),
        ("diagnose alone", &|| {
            let _ = chain::diagnose(&dir, &entry);
        }),
    ] {
        let mut t = Vec::with_capacity(n);
        for _ in 0..n {
            let s = Instant::now();
            f();
            t.push(s.elapsed());
        }
        t.sort();
        println!(
            "{what}: median {:?}, p99 {:?} over {n} runs",
            percentile(&t, 0.5),
            percentile(&t, 0.99)
        );
    }
    fs::remove_dir_all(&dir)?;
    Ok(())
}
