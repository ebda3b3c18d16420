//! Sandbox creation time through containerd's CRI, with and without
//! linkerd-cni in the chain (interleaved pairs): prints the Markdown table
//! of BENCHMARKS.md. As root: `bash scripts/tool.sh cri_bench [PAIRS]`.

use std::process::ExitCode;

fn main() -> ExitCode {
    linkerd_cni_tools::main("cri_bench", story)
}

fn story() -> ExitCode {
    let arg = std::env::args().nth(1);
    let pairs = match arg.as_deref().map(str::parse::<usize>) {
        None => 100,
        Some(Ok(n)) if n > 0 => n,
        _ => {
            eprintln!(
                "cri_bench: the argument is the number of pairs (a positive integer), not {arg:?}"
            );
            return ExitCode::from(2);
        }
    };
    let started = std::time::Instant::now();
    let times = linkerd_cni_tools::cri_bench::sandbox_creation(pairs);
    eprintln!("cri_bench: {pairs} pairs in {:?}", started.elapsed());
    print!("{}", times.markdown());
    ExitCode::SUCCESS
}
