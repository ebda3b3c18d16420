//! What one heal of a primary's write costs the keeper, per chain mode: the
//! primary renames a new version of a realistic Calico conflist into
//! place, and one keeper pass ([`linkerd_cni_chain::keep`]) chains
//! linkerd-cni in again, in `inline` mode (our entry last in Calico's file)
//! or `owned` (our own copy of Calico's chain).
//!
//! `cargo run --profile tools -p linkerd-cni-chain --example heal_pass [inline|owned] [ITERATIONS]`
//!
//! It prints the median and the 99th percentile of the whole pass (the
//! heal is visible before the pass returns: at the exchange or rename).
//! With ITERATIONS = 1 it runs one pass in [`measured`], for
//! `valgrind --tool=callgrind '--toggle-collect=*heal_pass::measured*'`,
//! or `strace -f -T` (the temp dir's name says which files are whose). A
//! measurement for people, not a test: it asserts nothing about figures.

use std::fs;
use std::path::Path;
use std::time::{Duration, Instant};

use linkerd_cni_chain::owned::ChainMode;
use linkerd_cni_chain::{self as chain, Context, Entry, ModeChoice, NoLimit};

const CALICO: &str = include_str!("../tests/fixtures/chain/calico/in/10-calico.conflist");
const ENTRY: &str = include_str!("../tests/fixtures/chain/entry.json");

/// The primary's write: a new version renamed into place, as most
/// installers write.
fn primary_writes(dir: &Path, generation: usize) -> std::io::Result<()> {
    let text = CALICO.replace("\"mtu\": 0", &format!("\"mtu\": {}", 1000 + generation));
    let tmp = dir.join("calico-writing");
    fs::write(&tmp, text)?;
    fs::rename(&tmp, dir.join("10-calico.conflist"))
}

/// One keeper pass: what is measured.
#[inline(never)]
fn measured(ctx: &Context) -> Result<chain::Report, chain::ChainError> {
    chain::keep(ctx, &mut NoLimit)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mode = std::env::args().nth(1).unwrap_or_else(|| "inline".into());
    let n: usize = std::env::args()
        .nth(2)
        .and_then(|s| s.parse().ok())
        .unwrap_or(200);
    let chain_mode = ChainMode::parse(&mode).ok_or("mode: inline or owned")?;
    let dir = std::env::temp_dir().join(format!("lcni-heal-pass-{mode}-{}", std::process::id()));
    fs::create_dir_all(&dir)?;
    let entry = Entry::parse(ENTRY.as_bytes(), "entry.json")?.with("chain_mode", mode.as_str())?;
    let ctx = |budget| {
        Context::new(
            &dir,
            entry.clone(),
            ModeChoice::new(chain_mode, "heal_pass"),
            budget,
        )
    };
    primary_writes(&dir, 0)?;
    measured(&ctx(Duration::from_secs(10)))?;
    let mut times = Vec::with_capacity(n);
    for g in 1..=n {
        primary_writes(&dir, g)?;
        let c = ctx(Duration::from_secs(10));
        let t = Instant::now();
        let r = measured(&c)?;
        times.push(t.elapsed());
        if r.actions.is_empty() {
            return Err(format!("pass {g} healed nothing: {r:?}").into());
        }
    }
    fs::remove_dir_all(&dir)?;
    times.sort();
    let at = |p: f64| {
        let i = ((times.len() as f64 - 1.0) * p).round() as usize;
        times.get(i).copied().unwrap_or_default()
    };
    println!(
        "{mode}: {n} passes, median {:.3} ms, p99 {:.3} ms",
        at(0.5).as_secs_f64() * 1e3,
        at(0.99).as_secs_f64() * 1e3
    );
    Ok(())
}
