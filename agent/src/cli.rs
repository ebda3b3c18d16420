//! The installer's command line: `linkerd-cni-installer`, as the image's
//! entrypoint (the linkerd2-cni chart's install-cni container) runs it,
//! configured by environment variables.

use std::process::ExitCode;

use log::LevelFilter;

use crate::config::{self, Config, ConfigError};
use crate::installer::Installer;
use crate::{binaries, logging, repair, run, runtime, status};

const USAGE: &str = "\
linkerd-cni-installer: installs the linkerd-cni CNI plugin on this node and
keeps it chained in the active CNI config. Configured by environment
variables (those of the linkerd2-cni Helm chart, plus LINKERD_CNI_*).

USAGE:
    linkerd-cni-installer            install, then reconcile until SIGTERM;
                                     with LINKERD_CNI_REPAIR_CONTROLLER_NODE_NAME
                                     set, also repair this node's pods and
                                     answer the plugin's lookups, as
                                     linkerd-cni-repair-controller does
    linkerd-cni-installer check      exit 0 when the node is ready (readiness
                                     probe); otherwise print why and exit 1;
                                     either way, the chain mode and why
    linkerd-cni-installer status     the node's state for a person: chain mode
                                     (and why), health, readiness, the
                                     credential, the plugin's ADD outcomes,
                                     and the running installer's repairs
                                     from its /metrics when that is on
                                     (exit 0 healthy, 1 not, 2 error)
    linkerd-cni-installer uninstall  remove the linkerd-cni entries from every
                                     config, then the heartbeat, the
                                     kubeconfig and the persisted entry,
                                     then, 5 s later, the binaries
    linkerd-cni-installer version
    linkerd-cni-installer --help
";

/// Exit code for a configuration the installer cannot run with.
const EXIT_CONFIG: u8 = 2;

/// `--help`: the usage, then the settings, named from the list the
/// installer checks at start so that none is left out.
fn help() -> String {
    let mut s = format!(
        "{USAGE}\nSETTINGS:\n    Environment variables; each with its default and meaning in\n    \
         docs/configuration.md (\"Installer environment variables\") in the\n    \
         linkerd-cni repository. run and check need them all; status and\n    \
         uninstall only where the conf and bin dirs are.\n"
    );
    let mut line = String::from("   ");
    for var in config::VARIABLES {
        if line.len() + 1 + var.len() > 78 {
            s.push_str(&line);
            s.push('\n');
            line = String::from("   ");
        }
        line.push(' ');
        line.push_str(var);
    }
    s.push_str(&line);
    s.push('\n');
    s
}

pub fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let command = match args.as_slice() {
        [] | ["run"] => Command::Run,
        ["check"] => Command::Check,
        ["status"] => Command::Status,
        ["uninstall"] => Command::Uninstall,
        ["version" | "--version" | "-V"] => {
            println!("linkerd-cni-installer {}", env!("CARGO_PKG_VERSION"));
            return ExitCode::SUCCESS;
        }
        ["-h" | "--help" | "help"] => {
            print!("{}", help());
            return ExitCode::SUCCESS;
        }
        _ => {
            eprintln!(
                "linkerd-cni-installer: unknown arguments {args:?}\n\n{}",
                help()
            );
            return ExitCode::from(EXIT_CONFIG);
        }
    };
    // `check` runs every few seconds as a probe: its stdout says why the
    // node is not ready, and routine log lines would only add noise.
    let level = match command {
        Command::Check | Command::Status => LevelFilter::Warn,
        _ => LevelFilter::Info,
    };
    logging::init(level);

    let (installer, stood_in) = match load(&command) {
        Ok(i) => i,
        Err(e) => {
            log::error!("{e}");
            return ExitCode::from(EXIT_CONFIG);
        }
    };
    match command {
        Command::Run => {
            let repair = match repair::cli::from_env() {
                Ok(r) => r,
                Err(e) => {
                    log::error!("{e}");
                    return ExitCode::from(EXIT_CONFIG);
                }
            };
            run::run(installer, repair)
        }
        Command::Check => {
            let mut problems = installer.check();
            let (lines, more) = runtime::check_report(installer.config());
            problems.extend(more);
            let code = if problems.is_empty() {
                println!("ready: linkerd-cni is installed and chained");
                ExitCode::SUCCESS
            } else {
                println!("not ready:");
                for p in problems {
                    println!("- {p}");
                }
                ExitCode::FAILURE
            };
            for l in lines {
                println!("{l}");
            }
            code
        }
        Command::Status => {
            let (text, healthy) = status::report(&installer, &stood_in);
            print!("{text}");
            if healthy {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Command::Uninstall => match installer.uninstall() {
            Ok(()) => {
                log::info!("uninstalled");
                ExitCode::SUCCESS
            }
            Err(e) => {
                log::error!("uninstall incomplete: {e}");
                ExitCode::FAILURE
            }
        },
    }
}

enum Command {
    Run,
    Check,
    Status,
    Uninstall,
}

/// What `uninstall` and `status` stand in for settings they can do
/// without when unset: the API server's address (uninstall calls no API;
/// status reads the node) and the entry template (uninstall removes every
/// linkerd-cni entry, whatever it says; status then judges the chain
/// against the entry file the installer wrote). Only so that the
/// configuration's checks pass: uninstall reads none of these values, and
/// status says which readiness checks it could not make.
fn stand_in(var: &str) -> Option<String> {
    match var {
        "KUBERNETES_SERVICE_HOST" => Some("unused.invalid".into()),
        "KUBERNETES_SERVICE_PORT" => Some("443".into()),
        "CNI_NETWORK_CONFIG" => Some(UNINSTALL_TEMPLATE.into()),
        _ => None,
    }
}

/// See [`stand_in`].
const UNINSTALL_TEMPLATE: &str = r#"{"name":"linkerd-cni","type":"linkerd-cni","kubernetes":{"kubeconfig":"__KUBECONFIG_FILEPATH__"}}"#;

/// The configuration a command needs, and nothing more: `status` and
/// `uninstall` go on without the image's binaries (`CONTAINER_CNI_BIN_DIR`:
/// status then reports the host's copy as not comparable, uninstall
/// removes the plugin binary by its name), the API server's address and
/// the template (see [`stand_in`]). With the variables stood in for.
fn load(command: &Command) -> Result<(Installer, Vec<&'static str>), ConfigError> {
    for var in config::VARIABLES {
        if std::env::var_os(var).is_some_and(|v| v.to_str().is_none()) {
            return Err(ConfigError::new(var, "not valid UTF-8"));
        }
    }
    let env = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
    let lenient = matches!(command, Command::Status | Command::Uninstall);
    let templated = env("CNI_NETWORK_CONFIG").is_some() || env("CNI_NETWORK_CONFIG_FILE").is_some();
    let mut stood_in = vec![];
    let cfg = if lenient {
        for var in ["KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT"] {
            if env(var).is_none() {
                stood_in.push(var);
            }
        }
        if !templated {
            stood_in.push("CNI_NETWORK_CONFIG");
        }
        Config::from_env(|k| {
            env(k).or_else(|| match k {
                "CNI_NETWORK_CONFIG" if templated => None,
                _ => stand_in(k),
            })
        })?
    } else {
        Config::from_env(env)?
    };
    let bins = match binaries::list(&cfg) {
        Ok(b) => b,
        Err(e) if matches!(command, Command::Status | Command::Uninstall) => {
            log::debug!("{e}; only the plugin binary is looked at");
            binaries::plugin_only(&cfg)
        }
        Err(e) => return Err(e),
    };
    // Without a template, the entry the plugin was given (its state dir is
    // where uninstall removes the heartbeat).
    let persisted = match (lenient, templated) {
        (true, false) => linkerd_cni_chain::load_entry(&cfg.conf_dir())
            .ok()
            .flatten(),
        _ => None,
    };
    let entry = match persisted {
        Some(e) => e,
        None => cfg.desired_entry()?,
    };
    Ok((Installer::new(cfg, bins, entry), stood_in))
}
