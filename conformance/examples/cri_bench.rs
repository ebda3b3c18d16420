//! Sandbox creation time through containerd's CRI, with and without
//! linkerd-cni in the chain (interleaved pairs): prints the Markdown table
//! of BENCHMARKS.md. As root:
//!
//! ```sh
//! cargo run --release -p conformance --example cri_bench -- 100
//! ```

fn main() {
    let pairs = std::env::args()
        .nth(1)
        .map(|a| {
            a.parse().unwrap_or_else(|e| {
                eprintln!("cri_bench: the number of pairs, not {a:?}: {e}");
                std::process::exit(2)
            })
        })
        .unwrap_or(100);
    let started = std::time::Instant::now();
    let times = conformance::cri::measure::sandbox_creation(pairs);
    eprintln!("cri_bench: {pairs} pairs in {:?}", started.elapsed());
    print!("{}", times.markdown());
}
