//! The installer's configuration: clap arguments, each read from its
//! environment variable (or its flag).
//!
//! Variable names and defaults follow upstream's install-cni.sh and the
//! `linkerd2-cni` Helm chart, so the chart can run this image unchanged; new
//! knobs carry the `LINKERD_CNI_` prefix, and each flag is its variable
//! without that prefix, in lower case. As in the shell installer, an empty
//! variable counts as unset. Anything malformed is an error that names the
//! variable: the container then exits at once instead of running with a
//! guess.
//!
//! Paths come in two views. `DEST_CNI_NET_DIR` and `DEST_CNI_BIN_DIR` are
//! host paths: they are what the runtime and the plugin see, and what goes
//! into files the plugin reads. The installer itself reaches them under
//! `CONTAINER_MOUNT_PREFIX`.

use std::ffi::OsStr;
use std::net::SocketAddr;
use std::path::{Component, Path, PathBuf};
use std::time::Duration;

use clap::error::{ContextKind, ContextValue, ErrorKind};
use clap::{ArgMatches, FromArgMatches};
use linkerd_cni_chain::owned::{self, ChainMode};
use linkerd_cni_kube::names::{is_dns_label, is_dns_subdomain};

use crate::entry::{self, Entry};
use crate::fsutil::read_capped_text;
use crate::runtime::{self, Host};

pub const DEFAULT_KUBECONFIG_FILE_NAME: &str = "ZZZ-linkerd-cni-kubeconfig";
/// Longest accepted resync period: beyond an hour a missed event would leave
/// a node unchained for longer than anyone would wait.
const MAX_RESYNC_SECONDS: f64 = 3600.0;
/// Why a required variable is missing, in a pod and outside one.
pub const NOT_SET: &str = "not set; the kubelet sets it in every pod, set it by hand outside one";
/// Why `CNI_NETWORK_CONFIG` is missing.
pub const NO_TEMPLATE: &str = "not set, and neither is CNI_NETWORK_CONFIG_FILE: one of them must \
     hold the linkerd-cni plugin config (the chart's linkerd-cni-config ConfigMap)";

/// What SIGTERM does to the node (`LINKERD_CNI_UNINSTALL_ON_EXIT`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnExit {
    /// `auto` (default): uninstall when the API says the owning DaemonSet
    /// is gone or being deleted; otherwise (a rolling update, a restart,
    /// no answer) leave everything.
    Auto,
    /// `true`: always uninstall.
    Uninstall,
    /// `false`: always leave everything.
    Leave,
}

/// A variable that cannot be used, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid configuration: {var}: {reason}")]
pub struct ConfigError {
    pub var: String,
    pub reason: String,
}

impl ConfigError {
    pub fn new(var: impl Into<String>, reason: impl Into<String>) -> Self {
        ConfigError {
            var: var.into(),
            reason: reason.into(),
        }
    }
}

/// Everything the installer is told by its environment. The fields marked
/// `skip` are settled from others by [`Config::from_matches`].
#[derive(Debug, Clone, clap::Args)]
#[command(
    next_help_heading = "Settings (each its environment variable, or a flag before the command)"
)]
pub struct Config {
    /// The host's CNI conf dir (host path: what the runtime and the plugin see).
    #[arg(long, env = "DEST_CNI_NET_DIR", default_value = "/etc/cni/net.d", value_parser = host_dir)]
    pub dest_cni_net_dir: PathBuf,
    /// The host's CNI bin dir, where the plugin binary is copied (host path).
    #[arg(long, env = "DEST_CNI_BIN_DIR", default_value = "/opt/cni/bin", value_parser = host_dir)]
    pub dest_cni_bin_dir: PathBuf,
    /// Where the host's root is mounted in this container.
    #[arg(long = "container-mount-prefix", value_name = "PATH", env = "CONTAINER_MOUNT_PREFIX", default_value = "/host", value_parser = absolute)]
    pub mount_prefix: PathBuf,
    /// The image's binaries to install (must hold linkerd-cni).
    #[arg(long, env = "CONTAINER_CNI_BIN_DIR", default_value = "/opt/cni/bin", value_parser = absolute)]
    pub container_cni_bin_dir: PathBuf,
    /// The plugin's kubeconfig, a plain file name in the conf dir.
    #[arg(long, env = "KUBECONFIG_FILE_NAME", default_value = DEFAULT_KUBECONFIG_FILE_NAME, value_parser = kubeconfig_file_name)]
    pub kubeconfig_file_name: String,
    /// The API server's CA [default: ca.crt in the service-account dir];
    /// used only when it exists, as upstream does.
    #[arg(long = "kube-ca-file", env = "KUBE_CA_FILE", value_name = "PATH")]
    ca_file: Option<PathBuf>,
    #[arg(skip)]
    pub kube_ca_file: PathBuf,
    /// Write insecure-skip-tls-verify into the plugin's kubeconfig instead of the CA.
    #[arg(long, env = "SKIP_TLS_VERIFY", default_value = "false", value_parser = boolean, action = clap::ArgAction::Set)]
    pub skip_tls_verify: bool,
    /// The API server URL's scheme: https or http.
    #[arg(long = "kubernetes-service-protocol", env = "KUBERNETES_SERVICE_PROTOCOL", default_value = "https", value_parser = k8s_protocol)]
    pub k8s_protocol: String,
    /// The API server's host (the kubelet sets it).
    #[arg(long = "kubernetes-service-host", env = "KUBERNETES_SERVICE_HOST", value_parser = k8s_host)]
    pub k8s_host: String,
    /// The API server's port (the kubelet sets it).
    #[arg(long = "kubernetes-service-port", env = "KUBERNETES_SERVICE_PORT", value_parser = k8s_port)]
    pub k8s_port: u16,
    /// The entry template, JSON (this or the file is required).
    #[arg(
        long = "cni-network-config",
        env = "CNI_NETWORK_CONFIG",
        value_name = "JSON"
    )]
    template_text: Option<String>,
    /// The entry template's file, re-read every pass; wins over the text.
    #[arg(
        long = "cni-network-config-file",
        env = "CNI_NETWORK_CONFIG_FILE",
        value_name = "PATH"
    )]
    pub template_file: Option<PathBuf>,
    /// This pod's node (spec.nodeName): whose startup taint to remove, where
    /// to post Events; unset, neither.
    #[arg(long, env = "LINKERD_CNI_NODE_NAME", value_parser = named(is_dns_subdomain, NODE_NAME))]
    pub node_name: Option<String>,
    /// The key of the startup taint removed once the node is ready.
    #[arg(long, env = "LINKERD_CNI_STARTUP_TAINT", default_value = "linkerd.io/cni-not-ready", value_parser = named(is_qualified_name, TAINT_KEY))]
    pub startup_taint: String,
    /// The period of the full reconcile and of the heartbeat, in seconds.
    #[arg(long = "resync-seconds", value_name = "SECONDS", env = "LINKERD_CNI_RESYNC_SECONDS", default_value = "10", value_parser = resync)]
    pub resync: Duration,
    /// Watch the conf dir and the other inputs (inotify) to reconcile sooner.
    #[arg(long, env = "LINKERD_CNI_WATCH", default_value = "true", value_parser = boolean, action = clap::ArgAction::Set)]
    pub watch: bool,
    /// No token and no kubeconfig on the node's disk: the entry tells the
    /// plugin so (`kubernetes.agent-only`), and it asks the node agent alone.
    #[arg(long, env = "LINKERD_CNI_AGENT_ONLY", default_value = "false", value_parser = boolean, action = clap::ArgAction::Set)]
    pub agent_only: bool,
    /// The installer's own token, CA and namespace.
    #[arg(long, env = "LINKERD_CNI_SERVICE_ACCOUNT_DIR", default_value = "/var/run/secrets/kubernetes.io/serviceaccount", value_parser = absolute)]
    pub service_account_dir: PathBuf,
    /// At SIGTERM: auto uninstalls when the DaemonSet is gone or being
    /// deleted, true always, false never.
    #[arg(long = "uninstall-on-exit", value_name = "WHEN", env = "LINKERD_CNI_UNINSTALL_ON_EXIT", default_value = "auto", value_parser = on_exit)]
    pub on_exit: OnExit,
    /// This pod (metadata.name), to find its DaemonSet at SIGTERM
    /// [default: the host name].
    #[arg(long, env = "LINKERD_CNI_POD_NAME", value_parser = named(is_dns_subdomain, POD_NAME))]
    pub pod_name: Option<String>,
    /// This pod's namespace [default: the service account's namespace file].
    #[arg(long, env = "LINKERD_CNI_POD_NAMESPACE", value_parser = named(is_dns_label, POD_NAMESPACE))]
    pub pod_namespace: Option<String>,
    /// Repair through a symlinked config whose target lies outside the conf dir.
    #[arg(long, env = "LINKERD_CNI_CHAIN_WRITE_OUTSIDE_CONF_DIR", default_value = "false", value_parser = boolean, action = clap::ArgAction::Set)]
    pub chain_write_outside_conf_dir: bool,
    /// auto, inline or owned [default: the template's chain_mode, else inline].
    #[arg(long, env = "LINKERD_CNI_CHAIN_MODE", value_parser = chain_mode)]
    pub chain_mode: Option<ModeSetting>,
    /// IP:PORT serving /metrics (an IP literal, never a name); unset, no
    /// metrics and no socket.
    #[arg(long, env = "LINKERD_CNI_METRICS_ADDR", value_parser = metrics_addr)]
    pub metrics_addr: Option<SocketAddr>,
    /// Kubernetes Events on the node named by LINKERD_CNI_NODE_NAME.
    #[arg(long, env = "LINKERD_CNI_EVENTS", default_value = "true", value_parser = boolean, action = clap::ArgAction::Set)]
    pub events: bool,
    /// mint: a token minted (TokenRequest) for the plugin's ServiceAccount;
    /// own: this pod's projected token, as upstream writes.
    #[arg(long = "plugin-token", value_name = "PLUGIN_TOKEN", env = "LINKERD_CNI_PLUGIN_TOKEN", default_value = "mint", value_parser = plugin_token, action = clap::ArgAction::Set)]
    mint_plugin_token: bool,
    /// The ServiceAccount, in this pod's namespace, whose token is minted
    /// for the node's kubeconfig.
    #[arg(long = "plugin-service-account", value_name = "NAME", env = "LINKERD_CNI_PLUGIN_SERVICE_ACCOUNT", default_value = "linkerd-cni-plugin", value_parser = named(is_dns_subdomain, "a ServiceAccount name"))]
    plugin_account: String,
    /// The account to mint for; none with `LINKERD_CNI_PLUGIN_TOKEN=own`.
    #[arg(skip)]
    pub plugin_service_account: Option<String>,
}

/// How the operator sets the chain mode (resolved, with its reason, into
/// the chain crate's `ModeChoice`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModeSetting {
    /// This mode, whatever the runtime's settings say.
    Fixed(ChainMode),
    /// Owned where the runtime's settings prove it safe, else inline (see
    /// [`crate::runtime`]).
    Auto,
}

/// The value of `chain_mode` (the variable or the template's key) that
/// selects [`ModeSetting::Auto`]. The entry the plugin gets always holds
/// the mode it resolved to.
pub const AUTO: &str = "auto";

/// The chain mode of the desired entry, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModeNote {
    pub mode: ChainMode,
    pub why: String,
    /// Owned mode forced against runtime settings that do not allow it:
    /// what they say.
    pub conflict: Option<String>,
}

/// The variable of the setting an error of clap's is about (a value that
/// fails its check, a required one missing), with the reason; any other
/// error (`--help`, an unknown subcommand) is clap's to print.
pub fn setting_error(cmd: &clap::Command, e: clap::Error) -> Result<ConfigError, clap::Error> {
    let arg = match e.get(ContextKind::InvalidArg) {
        Some(ContextValue::String(a)) => Some(a),
        Some(ContextValue::Strings(a)) => a.first(),
        _ => None,
    };
    // "--long <VALUE>": the argument's long name leads.
    let var = arg
        .and_then(|a| a.split_whitespace().next())
        .and_then(|a| a.strip_prefix("--"))
        .and_then(|long| cmd.get_arguments().find(|a| a.get_long() == Some(long)))
        .and_then(|a| a.get_env())
        .map(|v| v.to_string_lossy().into_owned());
    match (e.kind(), var) {
        (ErrorKind::ValueValidation, Some(var)) => {
            let reason = std::error::Error::source(&e).map_or_else(String::new, |s| s.to_string());
            Ok(ConfigError::new(var, reason))
        }
        (ErrorKind::MissingRequiredArgument, Some(var)) => Ok(ConfigError::new(var, NOT_SET)),
        _ => Err(e),
    }
}

impl Config {
    /// The configuration `cmd` parsed into `matches`: what depends on more
    /// than one setting is settled, and the template read and rendered once
    /// so that a bad one stops the container at start.
    pub fn from_matches(cmd: &clap::Command, matches: &ArgMatches) -> Result<Config, ConfigError> {
        let mut c = Config::from_arg_matches(matches).map_err(|e| match setting_error(cmd, e) {
            Ok(e) => e,
            Err(e) => ConfigError::new("arguments", e.to_string()),
        })?;
        c.kube_ca_file = c
            .ca_file
            .clone()
            .unwrap_or_else(|| c.service_account_dir.join("ca.crt"));
        c.plugin_service_account = c.mint_plugin_token.then(|| c.plugin_account.clone());
        // Fail at start on a template that can never render.
        c.desired_entry()?;
        Ok(c)
    }

    /// Reads the configuration through `get`, as the command line reads
    /// the environment: empty is unset.
    #[cfg(test)]
    pub fn from_env(get: impl Fn(&str) -> Option<String>) -> Result<Config, ConfigError> {
        use clap::Args;
        let cmd = Config::augment_args(clap::Command::new("test"));
        let mut argv = vec!["test".to_string()];
        for a in cmd.get_arguments() {
            if let (Some(long), Some(var)) = (a.get_long(), a.get_env().and_then(|v| v.to_str())) {
                argv.extend(
                    get(var)
                        .filter(|v| !v.is_empty())
                        .map(|v| format!("--{long}={v}")),
                );
            }
        }
        let matches = cmd
            .clone()
            .mut_args(|a| a.env(None))
            .try_get_matches_from(argv)
            .map_err(|e| setting_error(&cmd, e).expect("an error about a setting"))?;
        Config::from_matches(&cmd, &matches)
    }

    /// The conf dir as the installer reaches it.
    pub fn conf_dir(&self) -> PathBuf {
        under_prefix(&self.mount_prefix, &self.dest_cni_net_dir)
    }

    /// The bin dir as the installer reaches it.
    pub fn bin_dir(&self) -> PathBuf {
        under_prefix(&self.mount_prefix, &self.dest_cni_bin_dir)
    }

    /// The kubeconfig as the installer reaches it.
    pub fn kubeconfig_path(&self) -> PathBuf {
        self.conf_dir().join(&self.kubeconfig_file_name)
    }

    /// The kubeconfig as the plugin, running on the host, finds it.
    pub fn kubeconfig_host_path(&self) -> PathBuf {
        self.dest_cni_net_dir.join(&self.kubeconfig_file_name)
    }

    /// The API server URL for the kubeconfig.
    pub fn server_url(&self) -> String {
        // An IPv6 literal must be bracketed in a URL; upstream brackets every
        // host, which some clients reject for names and IPv4.
        let host = if self.k8s_host.contains(':') && !self.k8s_host.starts_with('[') {
            format!("[{}]", self.k8s_host)
        } else {
            self.k8s_host.clone()
        };
        format!("{}://{host}:{}", self.k8s_protocol, self.k8s_port)
    }

    /// The variable the template comes from: the file wins when both are
    /// set, as upstream's installer has it.
    pub fn template_var(&self) -> &'static str {
        match self.template_file {
            Some(_) => "CNI_NETWORK_CONFIG_FILE",
            None => "CNI_NETWORK_CONFIG",
        }
    }

    /// The template's text, read again when it is a file (a mounted
    /// ConfigMap may change). A file that is named but missing is an error
    /// rather than upstream's silent fall-back: a typo would otherwise go
    /// unnoticed.
    fn template(&self) -> Result<String, ConfigError> {
        match (&self.template_file, &self.template_text) {
            (Some(p), _) => read_capped_text(p).map_err(|e| {
                ConfigError::new(
                    "CNI_NETWORK_CONFIG_FILE",
                    format!("cannot read {}: {e}", p.display()),
                )
            }),
            (None, Some(t)) => Ok(t.clone()),
            (None, None) => Err(ConfigError::new("CNI_NETWORK_CONFIG", NO_TEMPLATE)),
        }
    }

    /// Reads the template (again, when it is a file: a mounted ConfigMap may
    /// change) and renders the entry the active conflist must end with.
    pub fn desired_entry(&self) -> Result<Entry, ConfigError> {
        self.desired().map(|(e, _)| e)
    }

    /// [`Config::desired_entry`], and why its chain mode is what it is.
    /// `auto` reads the runtime's settings each time: they change when the
    /// runtime is reconfigured, and the mode follows.
    pub fn desired(&self) -> Result<(Entry, ModeNote), ConfigError> {
        let var = self.template_var();
        let mut e = entry::render(
            &self.template()?,
            var,
            &self.kubeconfig_host_path(),
            &self.dest_cni_net_dir,
        )?;
        if self.agent_only {
            e = entry::agent_only(e, var)?;
        }
        let template_auto = e
            .get(owned::MODE_KEY)
            .is_some_and(|v| v.as_str() == Some(AUTO));
        let (choice, source) = match self.chain_mode {
            Some(c) => (Some(c), "LINKERD_CNI_CHAIN_MODE"),
            None if template_auto => (Some(ModeSetting::Auto), var),
            None => (None, var),
        };
        let with = |e: Entry, key: &str, value: &str| {
            e.with(key, value)
                .map_err(|err| ConfigError::new(source, err.to_string()))
        };
        let selection = || {
            runtime::select(&Host {
                prefix: &self.mount_prefix,
            })
        };
        let (e, mode, why) = match choice {
            Some(ModeSetting::Auto) => {
                let sel = selection();
                let e = with(e, owned::MODE_KEY, sel.mode.as_str())?;
                let e = with(e, linkerd_cni_chain::MODE_REASON_KEY, &sel.reason)?;
                (e, sel.mode, format!("{source}=auto: {}", sel.reason))
            }
            Some(ModeSetting::Fixed(m)) => (
                with(e, owned::MODE_KEY, m.as_str())?,
                m,
                format!("set by {source}"),
            ),
            None => {
                let m =
                    owned::mode_of(&e).map_err(|err| ConfigError::new(source, err.to_string()))?;
                let why = if e.get(owned::MODE_KEY).is_some() {
                    format!("set by chain_mode in {source}")
                } else {
                    format!(
                        "the default: no chain_mode in {source}, LINKERD_CNI_CHAIN_MODE unset \
                         (auto selects owned where the runtime's settings allow it)"
                    )
                };
                (e, m, why)
            }
        };
        // Owned mode not chosen by `auto` is checked against the runtime's
        // settings all the same.
        let conflict = (mode == ChainMode::Owned && choice != Some(ModeSetting::Auto))
            .then(selection)
            .filter(|sel| sel.mode != ChainMode::Owned)
            .map(|sel| sel.reason);
        let note = ModeNote {
            mode,
            why,
            conflict,
        };
        Ok((e, note))
    }
}

/// `prefix` + `path`, as upstream concatenates them (`/host` + `/etc/cni/net.d`).
pub fn under_prefix(prefix: &Path, path: &Path) -> PathBuf {
    let relative: PathBuf = path
        .components()
        .filter(|c| !matches!(c, Component::RootDir | Component::Prefix(_)))
        .collect();
    prefix.join(relative)
}

fn absolute(v: &str) -> Result<PathBuf, String> {
    let p = PathBuf::from(v);
    if !p.is_absolute() {
        return Err(format!("expected an absolute path, got {v:?}"));
    }
    if p.components().any(|c| c == Component::ParentDir) {
        return Err(format!("{v:?} must not contain \"..\""));
    }
    // Collecting the components drops trailing and doubled slashes, so the
    // paths written into the entry are canonical in form.
    Ok(p.components().collect())
}

/// A host directory: absolute, and also usable under the mount prefix.
fn host_dir(v: &str) -> Result<PathBuf, String> {
    let p = absolute(v)?;
    if p == Path::new("/") {
        return Err("must not be the root directory".into());
    }
    Ok(p)
}

fn boolean(v: &str) -> Result<bool, String> {
    match v.trim().to_ascii_lowercase().as_str() {
        "true" => Ok(true),
        "false" => Ok(false),
        _ => Err(format!("expected true or false, got {v:?}")),
    }
}

/// `KUBECONFIG_FILE_NAME`: a plain name the runtime will not load, and
/// none of the conf dir's names linkerd-cni uses for something else (its
/// entry file would be overwritten in turns with the kubeconfig; a name
/// with the temp prefix would be removed as a leftover on every pass).
fn kubeconfig_file_name(name: &str) -> Result<String, String> {
    if !is_plain_file_name(name) {
        return Err(format!("{name:?} is not a plain file name"));
    }
    if name == linkerd_cni_chain::ENTRY_FILE {
        return Err(format!(
            "{name:?} is the installer's entry file in the same directory; pick another name \
             (the default is {DEFAULT_KUBECONFIG_FILE_NAME})"
        ));
    }
    if name.starts_with(linkerd_cni_chain::TEMP_PREFIX) {
        return Err(format!(
            "{name:?} starts with {:?}, the prefix of linkerd-cni's temp files, which are \
             removed as leftovers; pick another name (the default is \
             {DEFAULT_KUBECONFIG_FILE_NAME})",
            linkerd_cni_chain::TEMP_PREFIX
        ));
    }
    if linkerd_cni_chain::is_config_name(OsStr::new(name)) {
        // The runtime would try to load it as the node's network config.
        return Err(format!(
            "{name:?} ends in .conf, .conflist or .json, which the container runtime would \
             load as a network config; pick another name"
        ));
    }
    Ok(name.to_string())
}

fn k8s_protocol(v: &str) -> Result<String, String> {
    match v {
        "https" | "http" => Ok(v.to_string()),
        _ => Err(format!("expected https or http, got {v:?}")),
    }
}

fn k8s_host(v: &str) -> Result<String, String> {
    if v.contains(['/', ' ', '@', '?', '#']) {
        return Err(format!("{v:?} is not a host name or IP address"));
    }
    Ok(v.to_string())
}

fn k8s_port(v: &str) -> Result<u16, String> {
    v.trim()
        .parse::<u16>()
        .ok()
        .filter(|p| *p > 0)
        .ok_or_else(|| format!("expected a port number 1-65535, got {v:?}"))
}

/// `LINKERD_CNI_METRICS_ADDR`: an IP literal and a port, never a name (no
/// resolver call at start, and no doubt about which interface listens).
fn metrics_addr(v: &str) -> Result<SocketAddr, String> {
    let v = v.trim();
    let addr: SocketAddr = v.parse().map_err(|_| {
        format!(
            "expected IP:PORT (e.g. \"$(LINKERD_CNI_NODE_IP):9995\" with the node's IP from the \
             downward API's status.hostIP, or [IPv6]:PORT), got {v:?}"
        )
    })?;
    // The pod is on the host network: every address of the node would
    // serve the installer's metrics, to whoever reaches any of them.
    if addr.ip().is_unspecified() {
        return Err(format!(
            "{v:?} listens on every address of the node (the pod is on the host network): \
             set it to the node's own IP, e.g. \"$(LINKERD_CNI_NODE_IP):9995\" with \
             status.hostIP from the downward API"
        ));
    }
    Ok(addr)
}

/// A parser of object names: `v` trimmed, when `valid` holds for it; else
/// `"<v>" is not <what>`. Object names go into API paths: checked as the
/// API server checks them.
fn named(
    valid: fn(&str) -> bool,
    what: &'static str,
) -> impl Fn(&str) -> Result<String, String> + Clone + Send + Sync + 'static {
    move |v| {
        let v = v.trim();
        match valid(v) {
            true => Ok(v.to_string()),
            false => Err(format!("{v:?} is not {what}")),
        }
    }
}

const NODE_NAME: &str = "a node name (set it from the downward API's spec.nodeName)";
const POD_NAME: &str = "a pod name (a DNS-1123 subdomain: at most 253 lowercase letters, digits, \
     '-' and '.'); set it from the downward API's metadata.name";
const POD_NAMESPACE: &str = "a namespace (a DNS-1123 label: at most 63 lowercase letters, digits \
     and '-'); set it from the downward API's metadata.namespace";
const TAINT_KEY: &str = "a taint key (an optional DNS-subdomain prefix and '/', then 1-63 \
     letters, digits, '-', '_' or '.')";

/// Whether the node's kubeconfig gets a token minted for the plugin.
fn plugin_token(v: &str) -> Result<bool, String> {
    match v.trim() {
        "mint" => Ok(true),
        "own" => Ok(false),
        other => Err(format!("{other:?} is neither \"mint\" nor \"own\"")),
    }
}

fn resync(v: &str) -> Result<Duration, String> {
    v.trim()
        .parse::<f64>()
        .ok()
        .filter(|s| s.is_finite() && *s > 0.0 && *s <= MAX_RESYNC_SECONDS)
        .map(Duration::from_secs_f64)
        .ok_or_else(|| format!("expected a number of seconds in (0, 3600], got {v:?}"))
}

fn on_exit(v: &str) -> Result<OnExit, String> {
    match v.trim().to_ascii_lowercase().as_str() {
        "auto" => Ok(OnExit::Auto),
        "true" => Ok(OnExit::Uninstall),
        "false" => Ok(OnExit::Leave),
        _ => Err(format!("expected auto, true or false, got {v:?}")),
    }
}

fn chain_mode(v: &str) -> Result<ModeSetting, String> {
    match v.trim() {
        AUTO => Ok(ModeSetting::Auto),
        m => ChainMode::parse(m)
            .map(ModeSetting::Fixed)
            .ok_or_else(|| format!("expected auto, inline or owned, got {v:?}")),
    }
}

fn is_qualified_name(s: &str) -> bool {
    let (prefix, name) = match s.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, s),
    };
    let name_ok = !name.is_empty()
        && name.len() <= 63
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        && name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name.ends_with(|c: char| c.is_ascii_alphanumeric());
    name_ok && prefix.is_none_or(is_dns_subdomain)
}

fn is_plain_file_name(name: &str) -> bool {
    !name.is_empty() && name != "." && name != ".." && !name.contains('/') && !name.contains('\0')
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    const TEMPLATE: &str = r#"{"name":"linkerd-cni","type":"linkerd-cni",
        "kubernetes":{"kubeconfig":"__KUBECONFIG_FILEPATH__"}}"#;

    fn env(pairs: &[(&str, &str)]) -> Result<Config, ConfigError> {
        let mut m: HashMap<String, String> = [
            ("KUBERNETES_SERVICE_HOST", "10.96.0.1"),
            ("KUBERNETES_SERVICE_PORT", "443"),
            ("CNI_NETWORK_CONFIG", TEMPLATE),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        for (k, v) in pairs {
            m.insert(k.to_string(), v.to_string());
        }
        Config::from_env(|k| m.get(k).cloned())
    }

    #[test]
    fn defaults_match_upstream() {
        let c = env(&[]).unwrap();
        assert_eq!(c.conf_dir(), Path::new("/host/etc/cni/net.d"));
        assert_eq!(c.bin_dir(), Path::new("/host/opt/cni/bin"));
        assert_eq!(c.container_cni_bin_dir, Path::new("/opt/cni/bin"));
        assert_eq!(
            c.kubeconfig_path(),
            Path::new("/host/etc/cni/net.d/ZZZ-linkerd-cni-kubeconfig")
        );
        assert_eq!(
            c.kubeconfig_host_path(),
            Path::new("/etc/cni/net.d/ZZZ-linkerd-cni-kubeconfig")
        );
        assert_eq!(
            c.kube_ca_file,
            Path::new("/var/run/secrets/kubernetes.io/serviceaccount/ca.crt")
        );
        assert!(!c.skip_tls_verify);
        assert_eq!(c.resync, Duration::from_secs(10));
        assert!(c.watch);
        assert_eq!(c.on_exit, OnExit::Auto);
        assert_eq!(c.server_url(), "https://10.96.0.1:443");
    }

    #[test]
    fn empty_means_default_and_paths_are_normalised() {
        let c = env(&[
            (
                "DEST_CNI_NET_DIR",
                "/var/lib/rancher/k3s/agent/etc/cni/net.d/",
            ),
            ("CONTAINER_MOUNT_PREFIX", ""),
            ("LINKERD_CNI_WATCH", ""),
        ])
        .unwrap();
        assert_eq!(
            c.conf_dir(),
            Path::new("/host/var/lib/rancher/k3s/agent/etc/cni/net.d")
        );
        assert_eq!(
            c.dest_cni_net_dir,
            Path::new("/var/lib/rancher/k3s/agent/etc/cni/net.d")
        );
        assert!(c.watch);
    }

    #[test]
    fn ipv6_hosts_are_bracketed() {
        let c = env(&[("KUBERNETES_SERVICE_HOST", "fd00:10:96::1")]).unwrap();
        assert_eq!(c.server_url(), "https://[fd00:10:96::1]:443");
        let c = env(&[("KUBERNETES_SERVICE_HOST", "[fd00::1]")]).unwrap();
        assert_eq!(c.server_url(), "https://[fd00::1]:443");
        let c = env(&[("KUBERNETES_SERVICE_HOST", "kubernetes.default.svc")]).unwrap();
        assert_eq!(c.server_url(), "https://kubernetes.default.svc:443");
    }

    #[test]
    fn knobs() {
        let c = env(&[
            ("LINKERD_CNI_RESYNC_SECONDS", "0.5"),
            ("LINKERD_CNI_WATCH", "FALSE"),
            ("LINKERD_CNI_UNINSTALL_ON_EXIT", "true"),
            ("SKIP_TLS_VERIFY", "true"),
            ("KUBE_CA_FILE", "/etc/ca.pem"),
            ("LINKERD_CNI_SERVICE_ACCOUNT_DIR", "/sa"),
        ])
        .unwrap();
        assert_eq!(c.resync, Duration::from_millis(500));
        assert!(!c.watch && c.on_exit == OnExit::Uninstall && c.skip_tls_verify);
        assert_eq!(c.kube_ca_file, Path::new("/etc/ca.pem"));
        assert_eq!(c.service_account_dir, Path::new("/sa"));
        assert_eq!(c.chain_mode, None);
        assert_eq!(
            owned::mode_of(&c.desired_entry().unwrap()).unwrap(),
            ChainMode::Inline
        );
        let c = env(&[("LINKERD_CNI_CHAIN_MODE", "owned")]).unwrap();
        assert_eq!(c.chain_mode, Some(ModeSetting::Fixed(ChainMode::Owned)));
        assert_eq!(
            owned::mode_of(&c.desired_entry().unwrap()).unwrap(),
            ChainMode::Owned
        );
        assert!(env(&[("LINKERD_CNI_CHAIN_MODE", "own")]).is_err());
        // The CA default follows the service-account dir.
        let c = env(&[("LINKERD_CNI_SERVICE_ACCOUNT_DIR", "/sa")]).unwrap();
        assert_eq!(c.kube_ca_file, Path::new("/sa/ca.crt"));
    }

    #[test]
    fn auto_resolves_to_a_mode_and_says_why() {
        let empty = std::env::temp_dir().join(format!("lcni-auto-{}", std::process::id()));
        let prefix = empty.to_str().unwrap();
        // By the variable: no runtime settings under the prefix, inline.
        let c = env(&[
            ("LINKERD_CNI_CHAIN_MODE", "auto"),
            ("CONTAINER_MOUNT_PREFIX", prefix),
        ])
        .unwrap();
        assert_eq!(c.chain_mode, Some(ModeSetting::Auto));
        let (e, note) = c.desired().unwrap();
        assert_eq!(e.get(owned::MODE_KEY).unwrap(), "inline");
        let why = e.get(linkerd_cni_chain::MODE_REASON_KEY).unwrap();
        assert!(
            why.as_str()
                .unwrap()
                .contains("no containerd or CRI-O settings"),
            "{why}"
        );
        assert!(
            note.why.starts_with("LINKERD_CNI_CHAIN_MODE=auto: "),
            "{note:?}"
        );
        // By the template's key, which the variable overrides.
        let t = TEMPLATE.replacen('{', r#"{"chain_mode":"auto","#, 1);
        let c = env(&[
            ("CNI_NETWORK_CONFIG", &t),
            ("CONTAINER_MOUNT_PREFIX", prefix),
        ])
        .unwrap();
        let (e, note) = c.desired().unwrap();
        assert_eq!(e.get(owned::MODE_KEY).unwrap(), "inline");
        assert!(
            note.why.starts_with("CNI_NETWORK_CONFIG=auto: "),
            "{note:?}"
        );
        let c = env(&[
            ("CNI_NETWORK_CONFIG", &t),
            ("LINKERD_CNI_CHAIN_MODE", "owned"),
            ("CONTAINER_MOUNT_PREFIX", prefix),
        ])
        .unwrap();
        let (e, note) = c.desired().unwrap();
        assert_eq!(e.get(owned::MODE_KEY).unwrap(), "owned");
        assert!(e.get(linkerd_cni_chain::MODE_REASON_KEY).is_none());
        // Owned forced where nothing proves it safe: said.
        assert!(
            note.conflict
                .as_deref()
                .is_some_and(|c| c.contains("no containerd or CRI-O settings")),
            "{note:?}"
        );
        // Unset: inline, the upstream default, and no conflict to report.
        let (_, note) = env(&[]).unwrap().desired().unwrap();
        assert_eq!(note.mode, ChainMode::Inline);
        assert!(note.why.starts_with("the default"), "{note:?}");
        assert_eq!(note.conflict, None);
        let t = TEMPLATE.replacen('{', r#"{"chain_mode":"automatic","#, 1);
        assert!(env(&[("CNI_NETWORK_CONFIG", &t)]).is_err());
    }

    #[test]
    fn every_bad_value_names_its_variable() {
        for (var, value) in [
            ("LINKERD_CNI_RESYNC_SECONDS", "0"),
            ("LINKERD_CNI_RESYNC_SECONDS", "-3"),
            ("LINKERD_CNI_RESYNC_SECONDS", "ten"),
            ("LINKERD_CNI_RESYNC_SECONDS", "NaN"),
            ("LINKERD_CNI_RESYNC_SECONDS", "99999"),
            ("LINKERD_CNI_WATCH", "yes"),
            ("LINKERD_CNI_PLUGIN_TOKEN", "projected"),
            ("LINKERD_CNI_UNINSTALL_ON_EXIT", "1"),
            ("SKIP_TLS_VERIFY", "maybe"),
            ("KUBERNETES_SERVICE_PORT", "0"),
            ("KUBERNETES_SERVICE_PORT", "https"),
            ("KUBERNETES_SERVICE_PORT", "70000"),
            ("KUBERNETES_SERVICE_HOST", "http://x/"),
            ("KUBERNETES_SERVICE_PROTOCOL", "ftp"),
            ("DEST_CNI_NET_DIR", "etc/cni/net.d"),
            ("DEST_CNI_NET_DIR", "/"),
            ("DEST_CNI_BIN_DIR", "/opt/../bin"),
            ("CONTAINER_MOUNT_PREFIX", "host"),
            ("CONTAINER_CNI_BIN_DIR", "bin"),
            ("LINKERD_CNI_SERVICE_ACCOUNT_DIR", "sa"),
            ("KUBECONFIG_FILE_NAME", "a/b"),
            ("KUBECONFIG_FILE_NAME", "kubeconfig.json"),
            // Our own files: the entry, and the temp prefix of leftovers.
            ("KUBECONFIG_FILE_NAME", "ZZZ-linkerd-cni-entry"),
            ("KUBECONFIG_FILE_NAME", ".linkerd-cni-tmp-kc"),
            // Names that go into API paths, checked as the API server does.
            ("LINKERD_CNI_POD_NAMESPACE", "kube-system/pods/coredns?"),
            ("LINKERD_CNI_POD_NAMESPACE", "a.b"),
            ("LINKERD_CNI_POD_NAMESPACE", "Linkerd-CNI"),
            ("LINKERD_CNI_POD_NAME", "../../nodes/n1"),
            ("LINKERD_CNI_POD_NAME", "a%2Fb"),
            ("LINKERD_CNI_POD_NAME", "x?watch=1"),
            ("CNI_NETWORK_CONFIG", "[1,2]"),
            ("CNI_NETWORK_CONFIG", "{not json"),
            ("CNI_NETWORK_CONFIG", r#"{"type":"calico"}"#),
            ("LINKERD_CNI_CHAIN_MODE", "automatic"),
        ] {
            let e = env(&[(var, value)]).unwrap_err();
            assert_eq!(e.var, var, "{var}={value}: {e}");
            assert!(e.to_string().contains(var), "{e}");
        }
    }

    #[test]
    fn metrics_addr_is_an_ip_and_port() {
        assert_eq!(env(&[]).unwrap().metrics_addr, None);
        let c = env(&[("LINKERD_CNI_METRICS_ADDR", "192.0.2.7:9995")]).unwrap();
        assert_eq!(c.metrics_addr, Some("192.0.2.7:9995".parse().unwrap()));
        let c = env(&[("LINKERD_CNI_METRICS_ADDR", "[2001:db8::7]:9995")]).unwrap();
        assert_eq!(c.metrics_addr, Some("[2001:db8::7]:9995".parse().unwrap()));
        for bad in [
            "node-1:9995",
            "192.0.2.7",
            ":9995",
            "$(LINKERD_CNI_NODE_IP):9995",
        ] {
            let e = env(&[("LINKERD_CNI_METRICS_ADDR", bad)]).unwrap_err();
            assert_eq!(e.var, "LINKERD_CNI_METRICS_ADDR");
            assert!(e.reason.contains("IP:PORT"), "{e}");
        }
    }

    #[test]
    fn metrics_addr_is_never_every_address_of_the_node() {
        for bad in ["0.0.0.0:9995", "[::]:9995", " 0.0.0.0:0"] {
            let e = env(&[("LINKERD_CNI_METRICS_ADDR", bad)]).unwrap_err();
            assert_eq!(e.var, "LINKERD_CNI_METRICS_ADDR");
            assert!(e.reason.contains("every address of the node"), "{e}");
            assert!(e.reason.contains("status.hostIP"), "{e}");
        }
        let c = env(&[("LINKERD_CNI_METRICS_ADDR", "127.0.0.1:0")]).unwrap();
        assert_eq!(c.metrics_addr, Some("127.0.0.1:0".parse().unwrap()));
    }

    #[test]
    fn node_name_and_startup_taint() {
        let c = env(&[]).unwrap();
        assert_eq!(c.node_name, None);
        assert_eq!(c.startup_taint, "linkerd.io/cni-not-ready");
        let c = env(&[
            (
                "LINKERD_CNI_NODE_NAME",
                "ip-10-0-1-2.eu-west-1.compute.internal",
            ),
            ("LINKERD_CNI_STARTUP_TAINT", "example.com/net-not-ready"),
        ])
        .unwrap();
        assert_eq!(
            c.node_name.as_deref(),
            Some("ip-10-0-1-2.eu-west-1.compute.internal")
        );
        assert_eq!(c.startup_taint, "example.com/net-not-ready");
        assert_eq!(
            env(&[("LINKERD_CNI_STARTUP_TAINT", "cni-not-ready")])
                .unwrap()
                .startup_taint,
            "cni-not-ready"
        );
        for (var, value) in [
            ("LINKERD_CNI_NODE_NAME", "Node_1"),
            ("LINKERD_CNI_NODE_NAME", "../x"),
            ("LINKERD_CNI_NODE_NAME", "a/b"),
            ("LINKERD_CNI_STARTUP_TAINT", "a/b/c"),
            ("LINKERD_CNI_STARTUP_TAINT", "Example.com/x"),
            ("LINKERD_CNI_STARTUP_TAINT", "example.com/"),
            ("LINKERD_CNI_STARTUP_TAINT", "-x"),
            ("LINKERD_CNI_STARTUP_TAINT", "x y"),
        ] {
            let e = env(&[(var, value)]).unwrap_err();
            assert_eq!(e.var, var, "{var}={value}: {e}");
        }
    }

    #[test]
    fn required_variables() {
        for var in ["KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT"] {
            let e = env(&[(var, "")]).unwrap_err();
            assert_eq!(e.var, var);
        }
        let e = env(&[("CNI_NETWORK_CONFIG", "")]).unwrap_err();
        assert_eq!(e.var, "CNI_NETWORK_CONFIG");
    }

    #[test]
    fn config_extensions() {
        // The chain library's rule, which the watch follows too.
        let has_config_extension = |n: &str| linkerd_cni_chain::is_config_name(OsStr::new(n));
        assert!(has_config_extension("10-calico.conflist"));
        assert!(has_config_extension(".tmp.conf"));
        assert!(has_config_extension("x.json"));
        assert!(!has_config_extension("ZZZ-linkerd-cni-kubeconfig"));
        assert!(!has_config_extension("a.conf.bak"));
    }
}
