//! The demo (`src/bin/demo.rs`) and the benchmarks (`src/bin/bench.rs`):
//! whole-node scenarios on the conformance harness, outside the tests.
//!
//! Both clean up through Drop guards (network namespaces, temp dirs, the
//! installer process), which needs unwinding: they are built with the
//! workspace's `tools` profile (release optimisations, `panic = "unwind"`),
//! never with `release`, which aborts on panic for the plugin's sake. A
//! signal only asks them to stop ([`stop`]): the current short step ends,
//! the story returns, and the guards run. [`leftovers`] then checks, by the
//! names the harness gives everything, that nothing of the run is left.

pub mod cri_bench;
pub mod leftovers;
pub mod mode_bench;
pub mod scenario;
pub mod stats;
pub mod stop;

use std::process::ExitCode;

/// The `main` of a tool named `name`: routes the signals to the stop flag
/// (before any thread starts), runs `story`, then checks, with every guard
/// of the story dropped, that nothing of the run is left; a run that left
/// something fails even if its story succeeded.
pub fn main(name: &str, story: fn() -> ExitCode) -> ExitCode {
    if let Err(e) = stop::catch_signals() {
        eprintln!("{name}: {e}");
        return ExitCode::FAILURE;
    }
    let code = story();
    if !leftovers::check(name) && code == ExitCode::SUCCESS {
        return ExitCode::FAILURE;
    }
    code
}
