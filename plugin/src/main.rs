//! The `linkerd-cni` binary. Run by a container runtime (`CNI_COMMAND` set) it
//! is a CNI plugin; run by a person it is a small diagnostic tool.

use std::io::Write;
use std::process::ExitCode;

use linkerd_cni::cni::{self, CniError, code};
use linkerd_cni::logging;
use linkerd_cni::plugin::LinkerdCni;

const USAGE: &str = "\
linkerd-cni: chained CNI plugin that redirects meshed pods' traffic through
the Linkerd proxy, and keeps itself chained in the node's active conflist.

The container runtime runs it with CNI_COMMAND set and the network config on
stdin. Run by hand:

USAGE:
    linkerd-cni version     print the version and the CNI versions supported
    linkerd-cni --help      print this help
";

fn main() -> ExitCode {
    if std::env::var_os("CNI_COMMAND").is_some() {
        return run_cni();
    }
    let args: Vec<String> = std::env::args().skip(1).collect();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    match args.as_slice() {
        [] | ["-h" | "--help" | "help"] => {
            print!("{USAGE}");
            ExitCode::SUCCESS
        }
        ["version" | "--version" | "-V"] => {
            println!(
                "linkerd-cni {} (CNI {})",
                env!("CARGO_PKG_VERSION"),
                cni::version::SUPPORTED.join(", ")
            );
            ExitCode::SUCCESS
        }
        _ => {
            eprintln!("linkerd-cni: unknown arguments {args:?}\n\n{USAGE}");
            ExitCode::from(2)
        }
    }
}

fn run_cni() -> ExitCode {
    logging::init("linkerd-cni", log::LevelFilter::Warn);
    // A bug must still reach the runtime as a CNI error, not as an empty
    // stdout that it cannot parse.
    std::panic::set_hook(Box::new(|info| {
        let e = CniError::new(
            code::INTERNAL,
            "linkerd-cni crashed",
            format!("{info}; please report this bug"),
        );
        log::error!("{e}");
        let _ = std::io::stdout().write_all(&cni::Outcome::error(&e, cni::version::LATEST).stdout);
    }));

    let outcome = match cni::read_stdin(std::io::stdin().lock()) {
        Ok(stdin) => cni::run(|k| std::env::var_os(k), &stdin, &LinkerdCni),
        Err(e) => cni::Outcome::error(&e, cni::version::LATEST),
    };
    let mut out = std::io::stdout().lock();
    if out
        .write_all(&outcome.stdout)
        .and_then(|()| out.flush())
        .is_err()
    {
        log::error!("cannot write the result to stdout");
        return ExitCode::FAILURE;
    }
    ExitCode::from(outcome.exit_code)
}
