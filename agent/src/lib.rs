//! linkerd-cni's node agent: the one program the DaemonSet runs on every
//! node. It drops in the plugin's binaries and its credential, keeps the
//! plugin chained in the node's active CNI config (through
//! `linkerd-cni-chain`'s keeper, level-triggered, see `run.rs`), removes the
//! startup taint, shows the node's state (metrics, Events, `status`),
//! repairs pods that started without the plugin's rules, and answers the
//! plugin's pod lookups from its watches ([`repair`]).
//!
//! One binary, two command lines, chosen by the name it runs under: as
//! `linkerd-cni-repair-controller` (the path the linkerd2-cni chart's
//! repair-controller container runs) it takes that controller's flags
//! ([`repair::cli`]); under any other name (the image's entrypoint,
//! `linkerd-cni-installer`), the installer's environment variables
//! ([`cli`]). With `LINKERD_CNI_REPAIR_CONTROLLER_NODE_NAME` set (deploy/'s
//! one container) the installer's command line also repairs pods and
//! answers lookups; the chart's install-cni container sets none of the
//! controller's variables, so exactly one process repairs a given pod.
//!
//! Two kinds of work, each on its own side: the chain's file work (the
//! keeper's passes, inotify) is synchronous, on the main thread; everything
//! that talks to the API server, serves HTTP or watches runs on one tokio
//! runtime (`api.rs`), which the synchronous side reaches through bounded
//! calls.

use std::ffi::OsStr;
use std::path::Path;
use std::process::ExitCode;

mod api;
mod binaries;
pub mod cli;
mod config;
mod credential;
mod entry;
mod events;
mod fsutil;
mod installer;
mod kubeconfig;
mod logging;
mod metrics;
mod notes;
mod owner;
pub mod repair;
mod run;
mod runtime;
mod status;
mod taint;
mod watch;

/// The name the chart's repair-controller container runs this program by.
pub const REPAIR_CONTROLLER: &str = "linkerd-cni-repair-controller";

/// Runs the command line the program was started as.
pub fn main() -> ExitCode {
    let argv0 = std::env::args_os().next().unwrap_or_default();
    if Path::new(&argv0).file_name() == Some(OsStr::new(REPAIR_CONTROLLER)) {
        repair::cli::main()
    } else {
        cli::main()
    }
}
