//! What the healthy-path chain check costs an ADD: the chain part of the
//! plugin's ADD on a conf dir holding a realistic Calico conflist, Calico's
//! kubeconfig and our entry file, with linkerd-cni chained in the entry's
//! mode: `inline` (our entry last in Calico's file) or `owned` (our own copy
//! of Calico's chain, whose entry, marker included, is the ADD's stdin).
//!
//! `cargo run --release -p linkerd-cni --example chain_check_cost [inline|owned] [ITERATIONS] [full]`
//!
//! The files are left to settle for the memo's racy bound first, so the
//! check is answered from the memo of the last healthy look
//! (`linkerd_cni_state::memo`); with `full` it is measured at once, on new
//! files, which every check then reads, as the ADDs right after a write.
//!
//! With ITERATIONS = 1 it runs the check once, in [`measured`], for
//! `valgrind --tool=callgrind '--toggle-collect=*chain_check_cost::measured'`
//! (see BENCHMARKS.md). A measurement for people, not a test: it prints the
//! median and the 99th percentile and asserts nothing about them.

use std::fs;
use std::path::Path;
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

/// One healthy check: what is measured.
#[inline(never)]
fn measured(conf: &NetConf, config: &PluginConfig) {
    chain_part(conf, config);
}

/// The chain part of an ADD, as the plugin runs it.
#[inline(never)]
fn chain_part(conf: &NetConf, config: &PluginConfig) {
    if let Err(e) = heal::chain_on_add(conf, config, None) {
        eprintln!("{e:?}");
    }
}

/// The stdin the runtime passes: the entry as it stands in the active file.
fn active_entry(dir: &Path) -> Result<serde_json::Map<String, Value>, Box<dyn std::error::Error>> {
    let mut names: Vec<_> = fs::read_dir(dir)?
        .flatten()
        .map(|e| e.file_name())
        .filter(|n| n.to_string_lossy().ends_with(".conflist"))
        .collect();
    names.sort();
    let first = names.first().ok_or("no conflist")?;
    let v: Value = serde_json::from_slice(&fs::read(dir.join(first))?)?;
    match v["plugins"].as_array().and_then(|p| p.last()) {
        Some(Value::Object(m)) => Ok(m.clone()),
        _ => Err("no plugins".into()),
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mode = std::env::args().nth(1).unwrap_or_else(|| "inline".into());
    let n: usize = std::env::args()
        .nth(2)
        .and_then(|s| s.parse().ok())
        .unwrap_or(20_000);
    let dir = std::env::temp_dir().join(format!("lcni-check-cost-{}", std::process::id()));
    fs::create_dir_all(&dir)?;
    let entry = Entry::parse(ENTRY.as_bytes(), "entry.json")?;
    let kubeconfig = dir.join("ZZZ-linkerd-cni-kubeconfig");
    fs::write(&kubeconfig, "apiVersion: v1\nkind: Config\n")?;
    let entry = entry.with(
        "kubernetes",
        serde_json::json!({"kubeconfig": kubeconfig.to_string_lossy()}),
    )?;
    let entry = match mode.as_str() {
        "owned" => entry.with("chain_mode", "owned")?,
        _ => entry,
    };
    fs::write(dir.join("10-calico.conflist"), CALICO)?;
    fs::write(
        dir.join("calico-kubeconfig"),
        "apiVersion: v1\nkind: Config\n",
    )?;
    chain::persist_entry(&dir, &entry)?;

    let mut stdin = entry.clone().into_map();
    stdin.insert("cni_conf_dir".into(), dir.to_string_lossy().into());
    let state = std::env::temp_dir().join(format!("lcni-check-cost-state-{}", std::process::id()));
    stdin.insert("state_dir".into(), state.to_string_lossy().into());
    stdin.insert("name".into(), "k8s-pod-network".into());
    stdin.insert("cniVersion".into(), "0.3.1".into());
    let conf = NetConf::parse(Value::Object(stdin.clone()).to_string().as_bytes())?;
    let config = PluginConfig::from_map(&conf.raw)?;
    // The first ADD chains the node; every one after finds it healthy.
    chain_part(&conf, &config);
    for (k, v) in active_entry(&dir)? {
        stdin.insert(k, v);
    }
    let conf = NetConf::parse(Value::Object(stdin).to_string().as_bytes())?;
    // Once the files are older than the memo's racy bound, a look is
    // remembered. `full` measures at once instead, while the files are new:
    // every check then reads them and remembers nothing, as the ADDs in
    // the seconds after a write do.
    let full = std::env::args().nth(3).as_deref() == Some("full");
    let which = if full { "full look" } else { "remembered" };
    if !full {
        std::thread::sleep(linkerd_cni_state::memo::RACY + Duration::from_millis(100));
        chain_part(&conf, &config);
    }
    if n == 1 {
        measured(&conf, &config);
        fs::remove_dir_all(&dir)?;
        fs::remove_dir_all(&state)?;
        return Ok(());
    }
    let mut t = Vec::with_capacity(n);
    for _ in 0..n {
        let s = Instant::now();
        measured(&conf, &config);
        t.push(s.elapsed());
    }
    t.sort();
    println!(
        "chain check at ADD ({mode}, healthy, {which}): median {:?}, p99 {:?} over {n} runs",
        percentile(&t, 0.5),
        percentile(&t, 0.99)
    );
    fs::remove_dir_all(&dir)?;
    fs::remove_dir_all(&state)?;
    Ok(())
}
