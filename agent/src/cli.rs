//! The installer's command line: `linkerd-cni-installer`, as the image's
//! entrypoint (the linkerd2-cni chart's install-cni container) runs it,
//! configured by environment variables (see [`crate::config`]).

use std::process::ExitCode;

use clap::parser::ValueSource;
use clap::{Args, FromArgMatches, Subcommand};

use crate::config::{self, Config, ConfigError};
use crate::installer::Installer;
use crate::logging::LogFormat;
use crate::{binaries, logging, repair, run, runtime, status};

const PROGRAM: &str = "linkerd-cni-installer";

/// Exit code for a configuration the installer cannot run with (clap's
/// for a bad command line, too).
const EXIT_CONFIG: u8 = 2;

const USAGE: &str = "\
linkerd-cni-installer [run]
       linkerd-cni-installer check [--live]
       linkerd-cni-installer status
       linkerd-cni-installer uninstall
       linkerd-cni-installer version";

#[derive(Debug, Clone, Copy, PartialEq, Eq, Subcommand)]
enum Command {
    /// Install, then reconcile until SIGTERM (the default); with
    /// LINKERD_CNI_REPAIR_CONTROLLER_NODE_NAME set, also repair this node's
    /// pods and answer the plugin's lookups, as
    /// linkerd-cni-repair-controller does
    Run,
    /// Exit 0 when the node is ready (readiness probe); otherwise print why
    /// and exit 1; either way, the chain mode and why
    Check {
        /// Instead: exit 0 when the running installer answers on its admin
        /// socket in the state dir within 3 s (liveness probe; served with
        /// metrics on or the repair controller beside it); otherwise print
        /// why and exit 1
        #[arg(long)]
        live: bool,
    },
    /// The node's state for a person: chain mode (and why), health,
    /// readiness, the credential, the plugin's ADD outcomes, and the running
    /// installer's repairs from its /metrics when that is on (exit 0
    /// healthy, 1 not, 2 error)
    Status,
    /// Remove the linkerd-cni entries from every config, then the heartbeat,
    /// the kubeconfig and the persisted entry, then, 5 s later, the binaries
    Uninstall,
    /// Print the version
    Version,
}

/// The command line: the subcommands and every setting, each with its
/// variable (clap's `--help` lists them all).
pub fn command() -> clap::Command {
    let cmd = clap::Command::new(PROGRAM)
        .bin_name(PROGRAM)
        .version(env!("CARGO_PKG_VERSION"))
        .override_usage(USAGE)
        .after_help(
            "Each setting, its default and what it does: docs/configuration.md \
             (\"Installer environment variables\") in the linkerd-cni repository. run and \
             check need them all; status and uninstall only where the conf and bin dirs are.",
        );
    // After the settings, whose struct's doc would be the about otherwise.
    let cmd = Config::augment_args(Command::augment_subcommands(cmd))
        .about(
            "Installs the linkerd-cni CNI plugin on this node and keeps it chained in the \
             active CNI config. Configured by environment variables: those of the linkerd2-cni \
             Helm chart, plus LINKERD_CNI_*. An empty variable counts as unset.",
        )
        // Values stay out of `--help`: a template, a path are nobody's
        // business there.
        .mut_args(|a| a.hide_env_values(true));
    // Which command it is is known only once parsed: the settings status
    // and uninstall can do without get their stand-ins, which run and
    // check refuse (see `load`).
    STAND_INS.iter().fold(cmd, |cmd, (id, _, value)| {
        cmd.mut_arg(id, |a| {
            a.required(false)
                .default_value(value)
                .hide_default_value(true)
        })
    })
}

pub fn main() -> ExitCode {
    // Empty is unset, as upstream's `${VAR:-default}` has it (clap would
    // take "" for a value); a value that is not UTF-8 is refused by name.
    let mut not_utf8 = None;
    let cmd = command().mut_args(|a| {
        match a.get_env().map(|v| (v.to_os_string(), std::env::var_os(v))) {
            Some((_, Some(value))) if value.is_empty() => a.env(None),
            Some((var, Some(value))) if value.to_str().is_none() => {
                not_utf8.get_or_insert(ConfigError::new(var.to_string_lossy(), "not valid UTF-8"));
                a
            }
            _ => a,
        }
    });
    if let Some(e) = not_utf8 {
        return refuse(e);
    }
    let matches = match cmd.clone().try_get_matches() {
        Ok(m) => m,
        Err(e) => match config::setting_error(&cmd, e) {
            Ok(e) => return refuse(e),
            // --help, --version, a bad command line: clap prints it.
            Err(e) => e.exit(),
        },
    };
    let command = match matches.subcommand_name() {
        None => Command::Run,
        Some(_) => Command::from_arg_matches(&matches).unwrap_or_else(|e| e.exit()),
    };
    if command == Command::Version {
        println!("{PROGRAM} {}", env!("CARGO_PKG_VERSION"));
        return ExitCode::SUCCESS;
    }
    // With the repair controller beside the loop, its log settings are the
    // process's: one log, under one filter.
    let repair = match command {
        Command::Run => match repair::cli::from_env() {
            Ok(r) => r,
            Err(e) => return refuse(e),
        },
        _ => None,
    };
    // `check` runs every few seconds as a probe: its stdout says why the
    // node is not ready, and routine log lines would only add noise.
    let (filter, format) = match (&repair, command) {
        (Some(args), _) => (args.log_level.as_str(), args.log_format),
        (None, Command::Check { .. } | Command::Status) => (logging::QUIET, LogFormat::Plain),
        (None, _) => (logging::ROUTINE, LogFormat::Plain),
    };
    if let Err(e) = logging::init(PROGRAM, filter, format) {
        eprintln!("{PROGRAM}: {e}");
        return ExitCode::from(EXIT_CONFIG);
    }

    let (installer, stood_in) = match load(command, &cmd, &matches) {
        Ok(i) => i,
        Err(e) => {
            tracing::error!("{e}");
            return ExitCode::from(EXIT_CONFIG);
        }
    };
    match command {
        Command::Run => run::run(installer, repair),
        Command::Check { live: true } => match status::live(&installer.state_dir()) {
            Ok(said) => {
                println!("live: {said}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                println!("not live: {e}");
                ExitCode::FAILURE
            }
        },
        Command::Check { live: false } => {
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
        Command::Uninstall => run::uninstall(&installer, "uninstalled"),
        Command::Version => ExitCode::SUCCESS,
    }
}

/// A setting the installer cannot run with: said on stderr, exit 2.
fn refuse(e: impl std::fmt::Display) -> ExitCode {
    // A fixed, valid filter, installed once: this cannot fail.
    let _ = logging::init(PROGRAM, logging::QUIET, LogFormat::Plain);
    tracing::error!("{e}");
    ExitCode::from(EXIT_CONFIG)
}

/// What `uninstall` and `status` stand in for settings they can do
/// without when unset (argument, variable, value): the API server's
/// address (uninstall calls no API; status reads the node) and the entry
/// template (uninstall removes every linkerd-cni entry, whatever it says;
/// status then judges the chain against the entry file the installer
/// wrote). Only so that the configuration's checks pass: uninstall reads
/// none of these values, and status says which readiness checks it could
/// not make.
const STAND_INS: [(&str, &str, &str); 3] = [
    ("k8s_host", "KUBERNETES_SERVICE_HOST", "unused.invalid"),
    ("k8s_port", "KUBERNETES_SERVICE_PORT", "443"),
    ("template_text", "CNI_NETWORK_CONFIG", UNINSTALL_TEMPLATE),
];

/// See [`STAND_INS`].
const UNINSTALL_TEMPLATE: &str = r#"{"name":"linkerd-cni","type":"linkerd-cni","kubernetes":{"kubeconfig":"__KUBECONFIG_FILEPATH__"}}"#;

/// The configuration a command needs, and nothing more: `status` and
/// `uninstall` go on without the image's binaries (`CONTAINER_CNI_BIN_DIR`:
/// status then reports the host's copy as not comparable, uninstall
/// removes the plugin binary by its name), the API server's address and
/// the template (see [`STAND_INS`]). With the variables stood in for.
fn load(
    command: Command,
    cmd: &clap::Command,
    matches: &clap::ArgMatches,
) -> Result<(Installer, Vec<&'static str>), ConfigError> {
    let lenient = matches!(command, Command::Status | Command::Uninstall);
    let set = |id: &str| {
        matches
            .value_source(id)
            .is_some_and(|s| s != ValueSource::DefaultValue)
    };
    let templated = set("template_text") || set("template_file");
    let stood_in: Vec<&'static str> = STAND_INS
        .iter()
        .filter(|(id, _, _)| !set(id) && (*id != "template_text" || !templated))
        .map(|(_, var, _)| *var)
        .collect();
    // The API server's address first, as STAND_INS lists it.
    if !lenient && let Some(var) = stood_in.first() {
        let why = match *var {
            "CNI_NETWORK_CONFIG" => config::NO_TEMPLATE,
            _ => config::NOT_SET,
        };
        return Err(ConfigError::new(*var, why));
    }
    let cfg = Config::from_matches(cmd, matches)?;
    let bins = match binaries::list(&cfg) {
        Ok(b) => b,
        Err(e) if lenient => {
            tracing::debug!("{e}; only the plugin binary is looked at");
            binaries::plugin_only(&cfg)
        }
        Err(e) => return Err(e),
    };
    // Without a template, the entry the plugin was given (its state dir is
    // where uninstall removes the heartbeat).
    let persisted = (lenient && !templated).then(|| linkerd_cni_chain::load_entry(&cfg.conf_dir()));
    let entry = match persisted {
        Some(Ok(Some(e))) => e,
        _ => cfg.desired_entry()?,
    };
    Ok((Installer::new(cfg, bins, entry), stood_in))
}
