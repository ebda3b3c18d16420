//! linkerd-cni's node agent: the one program the DaemonSet runs on every
//! node. It drops in the plugin's binaries and its credential, keeps the
//! plugin chained in the node's active CNI config (through
//! `linkerd-cni-chain`'s keeper, level-triggered, see [`run`]), removes the
//! startup taint, shows the node's state (metrics, Events, `status`),
//! repairs pods that started without the plugin's rules, and answers the
//! plugin's pod lookups from its watches ([`repair`]).
//!
//! One binary, two command lines, chosen by the name it runs under: as
//! `linkerd-cni-repair-controller` (the path the linkerd2-cni chart's
//! repair-controller container runs) it takes that controller's flags
//! ([`repair::cli`]); under any other name (the image's entrypoint,
//! `linkerd-cni-installer`), the installer's environment variables
//! ([`cli`]).

use std::ffi::OsStr;
use std::path::Path;
use std::process::ExitCode;

mod binaries;
mod cli;
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
mod signals;
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
