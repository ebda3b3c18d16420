//! Through containerd's CRI, as root (`bash scripts/tool.sh cri_bench ...`):
//!
//! - `cri_bench [PAIRS]`: sandbox creation time with and without
//!   linkerd-cni in the chain (interleaved pairs), the Markdown table of
//!   BENCHMARKS.md;
//! - `cri_bench --burst [ROUNDS]`: the conformance tests' burst of pods
//!   while the primary rewrites, each chain mode in turn: how many meshed
//!   pods came up without rules, and the retries.

use std::process::ExitCode;

fn main() -> ExitCode {
    linkerd_cni_tools::main("cri_bench", story)
}

/// The positive count in `arg`, `default` when absent.
fn count(arg: Option<&str>, default: usize, what: &str) -> Result<usize, ExitCode> {
    match arg.map(str::parse::<usize>) {
        None => Ok(default),
        Some(Ok(n)) if n > 0 => Ok(n),
        _ => {
            eprintln!("cri_bench: {what} is a positive integer, not {arg:?}");
            Err(ExitCode::from(2))
        }
    }
}

fn story() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let started = std::time::Instant::now();
    if args.first().map(String::as_str) == Some("--burst") {
        let rounds = match count(args.get(1).map(String::as_str), 2, "the number of rounds") {
            Ok(n) => n,
            Err(code) => return code,
        };
        let table = linkerd_cni_tools::cri_bench::burst(rounds);
        eprintln!("cri_bench: {rounds} rounds in {:?}", started.elapsed());
        print!("{table}");
        return ExitCode::SUCCESS;
    }
    let pairs = match count(args.first().map(String::as_str), 100, "the number of pairs") {
        Ok(n) => n,
        Err(code) => return code,
    };
    let times = linkerd_cni_tools::cri_bench::sandbox_creation(pairs);
    eprintln!("cri_bench: {pairs} pairs in {:?}", started.elapsed());
    print!("{}", times.markdown());
    ExitCode::SUCCESS
}
