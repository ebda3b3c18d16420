//! The `linkerd-cni` binary. Run by a container runtime (`CNI_COMMAND` set) it
//! is a CNI plugin; run by a person it is a small diagnostic tool.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use linkerd_cni::cni::{self, CniError, code};
use linkerd_cni::config::{DEFAULT_CONF_DIR, PluginConfig};
use linkerd_cni::logging;
use linkerd_cni::plugin::LinkerdCni;
use linkerd_cni_chain::{self as chain, Context, ENTRY_FILE, Entry, ModeChoice, NoLimit};

const USAGE: &str = "\
linkerd-cni: chained CNI plugin that redirects meshed pods' traffic through
the Linkerd proxy, and keeps itself chained in the node's active conflist.

The container runtime runs it with CNI_COMMAND set and the network config on
stdin. Run by hand:

USAGE:
    linkerd-cni version     print the version and the CNI versions supported
    linkerd-cni --help      print this help
    linkerd-cni chain status [--conf-dir DIR] [--entry FILE]
                            show the chain mode (the entry's chain_mode:
                            inline or owned), the active network config and
                            whether the linkerd-cni entry is in place; in
                            owned mode our file, the primary's and whether
                            the copy is current (exit 0 healthy, 1 not
                            healthy, 2 error)
    linkerd-cni chain repair [--conf-dir DIR] [--entry FILE]
                            put the linkerd-cni entry last in the active
                            config (inline mode) or bring linkerd-cni's own
                            config up to date (owned mode), under the
                            conf-dir lock, atomically, and print what changed (exit 0 healthy afterwards,
                            1 cannot be made healthy, 2 error)

    --conf-dir DIR   the runtime's CNI conf dir (default /etc/cni/net.d)
    --entry FILE     JSON file holding the desired linkerd-cni entry (default:
                     the installer's ZZZ-linkerd-cni-entry in the conf dir)

SETTINGS:
    The plugin reads no environment of its own (besides the CNI_* variables
    the runtime sets): its settings are the keys of its entry in the network
    config (top level, `kubernetes`, `linkerd`), rendered by the installer
    from its template, and the pods' and namespaces' config.linkerd.io/*
    annotations. Each key with its default and meaning: docs/configuration.md
    (\"Plugin config keys\") in the linkerd-cni repository.
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
        // Exit 0 healthy, 1 not, 2 error (said on stderr).
        ["chain", rest @ ..] => {
            logging::init("linkerd-cni", log::LevelFilter::Warn);
            chain_command(rest).unwrap_or_else(|msg| {
                eprintln!("linkerd-cni chain: {msg}");
                ExitCode::from(2)
            })
        }
        _ => {
            eprintln!("linkerd-cni: unknown arguments {args:?}\n\n{USAGE}");
            ExitCode::from(2)
        }
    }
}

/// `linkerd-cni chain status|repair`, its errors as values.
fn chain_command(args: &[&str]) -> Result<ExitCode, String> {
    let Some((&cmd, rest)) = args.split_first() else {
        return Err(format!("expected status or repair\n\n{USAGE}"));
    };
    let mut conf_dir = PathBuf::from(DEFAULT_CONF_DIR);
    let mut entry_file: Option<PathBuf> = None;
    let mut rest = rest.iter();
    while let Some(&flag) = rest.next() {
        // `--name=value`, or `--name` followed by the value.
        let (name, value) = match flag.split_once('=') {
            Some(name_value) => name_value,
            None => (
                flag,
                *rest.next().ok_or_else(|| format!("{flag} needs a value"))?,
            ),
        };
        match name {
            "--conf-dir" => conf_dir = PathBuf::from(value),
            "--entry" => entry_file = Some(PathBuf::from(value)),
            _ => return Err(format!("unknown argument {flag:?}\n\n{USAGE}")),
        }
    }
    // Before the entry: a missing conf dir would otherwise be reported as
    // a missing entry file in it.
    conf_dir_usable(&conf_dir)?;
    let desired = desired_entry(&conf_dir, entry_file.as_deref())?;
    let mode = ModeChoice::of_entry(&desired).map_err(|e| e.to_string())?;
    // As the plugin itself would repair: the entry's own settings; bounded
    // by the lock's usual wait, without a limit on repeated repairs.
    let mut ctx = Context::new(&conf_dir, desired, mode, CLI_BUDGET);
    ctx.opts.write_outside_conf_dir =
        PluginConfig::from_map(&ctx.desired).is_ok_and(|c| c.chain_write_outside_conf_dir);
    match cmd {
        "status" => status(&ctx),
        "repair" => {
            // An operator's repair first waits for a repair in flight (an
            // ADD's or the installer's) to finish, as it always has: between
            // a writer's exchange and its put-back the conf dir shows a
            // state nobody wrote, and a lock-free look at it would judge
            // (and race) that instead of the settled result.
            let in_flight_done = chain::lock_dir(&conf_dir, CLI_BUDGET, Some(ctx.deadline))
                .map_err(|e| e.to_string())?;
            // Released at once: the keeper takes the lock itself.
            drop(in_flight_done);
            repair(&ctx)
        }
        other => Err(format!(
            "unknown chain command {other:?}: expected status or repair"
        )),
    }
}

/// `chain repair`: the keeper without a repair limit, then the status.
fn repair(ctx: &Context) -> Result<ExitCode, String> {
    let r = chain::keep(ctx, &mut NoLimit).map_err(|e| e.to_string())?;
    println!("{r}");
    if let Some(e) = r.errors.first() {
        return Err(e.to_string());
    }
    status(ctx)
}

/// How long `chain repair` waits for the conf-dir lock and works, at most.
const CLI_BUDGET: std::time::Duration = std::time::Duration::from_secs(5);

/// Prints the chain's health in the context's mode: exit 0 healthy, 1 not.
fn status(ctx: &Context) -> Result<ExitCode, String> {
    let h = chain::health(ctx).map_err(|e| e.to_string())?;
    let text = h.to_string();
    // The mode and why, then how the entry reaches the API, then the chain.
    let mut lines = text.split_inclusive('\n');
    for line in lines.by_ref().take(2) {
        print!("{line}");
    }
    print_transport_warnings(&ctx.desired);
    for line in lines {
        print!("{line}");
    }
    Ok(ExitCode::from(u8::from(!h.is_healthy())))
}

/// How the entry's kubeconfig reaches the API server, when that is weak
/// (plain http, TLS verification off). Informational: the exit code stays
/// the chain's.
fn print_transport_warnings(desired: &Entry) {
    let Ok(config) = PluginConfig::from_map(desired) else {
        return;
    };
    let Some(path) = config.kubeconfig else {
        return;
    };
    match linkerd_cni_kube::kubeconfig::load(&path) {
        Ok(api) => {
            for w in api.transport_warnings() {
                println!("warning: {w}");
            }
            if api.is_plain_http() && !config.allow_plain_http {
                println!(
                    "warning: the plugin refuses this plain http:// server (kubernetes.allow-plain-http is not set)"
                );
            }
        }
        Err(e) => println!("warning: {e}"),
    }
}

/// The conf dir exists and is a directory, or what to do about it.
fn conf_dir_usable(dir: &Path) -> Result<(), String> {
    match std::fs::metadata(dir) {
        Ok(m) if m.is_dir() => Ok(()),
        Ok(_) => Err(format!(
            "the conf dir {} is not a directory; pass --conf-dir DIR, the container runtime's CNI conf dir",
            dir.display()
        )),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(format!(
            "the conf dir {} does not exist; pass --conf-dir DIR, the container runtime's CNI conf dir \
             (containerd's and CRI-O's default is {DEFAULT_CONF_DIR}; some distributions move it)",
            dir.display()
        )),
        Err(e) => Err(format!("cannot read the conf dir {}: {e}", dir.display())),
    }
}

/// `--entry FILE`, else the installer's entry file in the conf dir.
fn desired_entry(conf_dir: &Path, file: Option<&Path>) -> Result<Entry, String> {
    match file {
        Some(f) => {
            let bytes =
                chain::read_file(f).map_err(|e| format!("cannot read {}: {e}", f.display()))?;
            Entry::parse(&bytes, &f.display().to_string()).map_err(|e| e.to_string())
        }
        None => match chain::load_entry(conf_dir) {
            Ok(Some(e)) => Ok(e),
            Ok(None) => Err(format!(
                "no desired entry: {} does not exist; pass --entry FILE (a JSON file holding the linkerd-cni plugin object) or run the linkerd-cni installer, which writes it",
                conf_dir.join(ENTRY_FILE).display()
            )),
            Err(e) => Err(e.to_string()),
        },
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
        let _ = std::io::stdout().write_all(&cni::Reply::error(&e, cni::version::LATEST).stdout);
    }));

    let outcome = match cni::read_stdin(std::io::stdin().lock()) {
        Ok(stdin) => cni::run(|k| std::env::var_os(k), &stdin, &LinkerdCni),
        Err(e) => cni::Reply::error(&e, cni::version::LATEST),
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
