//! The installer's configuration, read once from the environment.
//!
//! Variable names and defaults follow upstream's install-cni.sh and the
//! `linkerd2-cni` Helm chart, so the chart can run this image unchanged; new
//! knobs carry the `LINKERD_CNI_` prefix. As in the shell installer, an empty
//! variable counts as unset. Anything malformed is an error that names the
//! variable: the container then exits at once instead of running with a
//! guess.
//!
//! Paths come in two views. `DEST_CNI_NET_DIR` and `DEST_CNI_BIN_DIR` are
//! host paths: they are what the runtime and the plugin see, and what goes
//! into files the plugin reads. The installer itself reaches them under
//! `CONTAINER_MOUNT_PREFIX`.

use linkerd_cni_kube::names::{is_dns_label, is_dns_subdomain};
use std::path::{Component, Path, PathBuf};
use std::time::Duration;

use linkerd_cni_chain::owned::{self, ChainMode};

use crate::entry::{self, Entry, Template};
use crate::runtime::{self, Host};

pub const DEFAULT_DEST_CNI_NET_DIR: &str = "/etc/cni/net.d";
pub const DEFAULT_DEST_CNI_BIN_DIR: &str = "/opt/cni/bin";
pub const DEFAULT_CONTAINER_MOUNT_PREFIX: &str = "/host";
pub const DEFAULT_CONTAINER_CNI_BIN_DIR: &str = "/opt/cni/bin";
pub const DEFAULT_KUBECONFIG_FILE_NAME: &str = "ZZZ-linkerd-cni-kubeconfig";
pub const DEFAULT_SERVICE_ACCOUNT_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";
/// The startup taint the installer removes from its node once it is ready.
pub const DEFAULT_STARTUP_TAINT: &str = "linkerd.io/cni-not-ready";
/// The ServiceAccount, in the installer's namespace, whose token the
/// installer mints for the plugin.
pub const DEFAULT_PLUGIN_SERVICE_ACCOUNT: &str = "linkerd-cni-plugin";
pub const DEFAULT_RESYNC: Duration = Duration::from_secs(10);
/// Longest accepted resync period: beyond an hour a missed event would leave
/// a node unchained for longer than anyone would wait.
const MAX_RESYNC_SECONDS: f64 = 3600.0;

/// Every variable the installer reads.
pub const VARIABLES: [&str; 27] = [
    "DEST_CNI_NET_DIR",
    "DEST_CNI_BIN_DIR",
    "CONTAINER_MOUNT_PREFIX",
    "CONTAINER_CNI_BIN_DIR",
    "KUBECONFIG_FILE_NAME",
    "KUBE_CA_FILE",
    "SKIP_TLS_VERIFY",
    "KUBERNETES_SERVICE_PROTOCOL",
    "KUBERNETES_SERVICE_HOST",
    "KUBERNETES_SERVICE_PORT",
    "CNI_NETWORK_CONFIG",
    "CNI_NETWORK_CONFIG_FILE",
    "LINKERD_CNI_NODE_NAME",
    "LINKERD_CNI_STARTUP_TAINT",
    "LINKERD_CNI_RESYNC_SECONDS",
    "LINKERD_CNI_WATCH",
    "LINKERD_CNI_SERVICE_ACCOUNT_DIR",
    "LINKERD_CNI_UNINSTALL_ON_EXIT",
    "LINKERD_CNI_POD_NAME",
    "LINKERD_CNI_POD_NAMESPACE",
    "LINKERD_CNI_CHAIN_WRITE_OUTSIDE_CONF_DIR",
    "LINKERD_CNI_CHAIN_MODE",
    "LINKERD_CNI_METRICS_ADDR",
    "LINKERD_CNI_EVENTS",
    "LINKERD_CNI_PLUGIN_SERVICE_ACCOUNT",
    "LINKERD_CNI_PLUGIN_TOKEN",
    "LINKERD_CNI_AGENT_ONLY",
];

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
    pub var: &'static str,
    pub reason: String,
}

impl ConfigError {
    pub fn new(var: &'static str, reason: impl Into<String>) -> Self {
        ConfigError {
            var,
            reason: reason.into(),
        }
    }
}

/// Everything the installer is told by its environment.
#[derive(Debug, Clone)]
pub struct Config {
    /// `DEST_CNI_NET_DIR`, host view.
    pub dest_cni_net_dir: PathBuf,
    /// `DEST_CNI_BIN_DIR`, host view.
    pub dest_cni_bin_dir: PathBuf,
    /// `CONTAINER_MOUNT_PREFIX`: where the host's root is seen.
    pub mount_prefix: PathBuf,
    /// `CONTAINER_CNI_BIN_DIR`: the binaries to install (container view).
    pub container_cni_bin_dir: PathBuf,
    /// `KUBECONFIG_FILE_NAME`: a plain file name in the conf dir.
    pub kubeconfig_file_name: String,
    /// `KUBE_CA_FILE` (container view); default `ca.crt` in the service
    /// account dir. Used only when it exists, as upstream does.
    pub kube_ca_file: PathBuf,
    /// `SKIP_TLS_VERIFY`: write `insecure-skip-tls-verify` instead of a CA.
    pub skip_tls_verify: bool,
    /// `KUBERNETES_SERVICE_PROTOCOL` (upstream's knob; default https).
    pub k8s_protocol: String,
    /// `KUBERNETES_SERVICE_HOST`.
    pub k8s_host: String,
    /// `KUBERNETES_SERVICE_PORT`.
    pub k8s_port: u16,
    /// `CNI_NETWORK_CONFIG_FILE` or `CNI_NETWORK_CONFIG`.
    pub template: Template,
    /// `LINKERD_CNI_NODE_NAME` (the downward API's `spec.nodeName`): the
    /// node whose startup taint to remove; None: remove none.
    pub node_name: Option<String>,
    /// `LINKERD_CNI_STARTUP_TAINT`: the key of that taint.
    pub startup_taint: String,
    /// `LINKERD_CNI_RESYNC_SECONDS`.
    pub resync: Duration,
    /// `LINKERD_CNI_WATCH`.
    pub watch: bool,
    /// `LINKERD_CNI_SERVICE_ACCOUNT_DIR`.
    pub service_account_dir: PathBuf,
    /// `LINKERD_CNI_UNINSTALL_ON_EXIT`.
    pub on_exit: OnExit,
    /// `LINKERD_CNI_POD_NAME` (the downward API's `metadata.name`); else
    /// the host name, which is the pod's name unless it uses the host's
    /// network.
    pub pod_name: Option<String>,
    /// `LINKERD_CNI_POD_NAMESPACE`; else the service account's `namespace`
    /// file.
    pub pod_namespace: Option<String>,
    /// `LINKERD_CNI_CHAIN_WRITE_OUTSIDE_CONF_DIR`: repair through a
    /// symlinked config to a file outside the conf dir (default false).
    pub chain_write_outside_conf_dir: bool,
    /// `LINKERD_CNI_CHAIN_MODE`: decides the entry's `chain_mode`; when
    /// unset the template's own key (if any) decides, else inline mode.
    pub chain_mode: Option<ModeSetting>,
    /// `LINKERD_CNI_METRICS_ADDR`: where to serve `/metrics` (`IP:PORT`,
    /// the node's IP from the downward API); None: no metrics, no socket.
    pub metrics_addr: Option<std::net::SocketAddr>,
    /// `LINKERD_CNI_EVENTS` (default true): Kubernetes Events on the Node
    /// named by `LINKERD_CNI_NODE_NAME` (none without a node name).
    pub events: bool,
    /// `LINKERD_CNI_PLUGIN_SERVICE_ACCOUNT`: the ServiceAccount (in this
    /// pod's namespace) whose token goes into the node's kubeconfig; none
    /// with `LINKERD_CNI_PLUGIN_TOKEN=own`: this pod's own token goes
    /// there, as upstream's installer writes.
    pub plugin_service_account: Option<String>,
    /// `LINKERD_CNI_AGENT_ONLY` (default false): no token and no kubeconfig
    /// on the node's disk; the entry tells the plugin so
    /// (`kubernetes.agent-only`), and it asks the node agent alone.
    pub agent_only: bool,
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

impl Config {
    /// Reads the configuration through `get` (the process environment in
    /// production, a map in tests). The template is read and rendered once
    /// here so that a bad one stops the container at start.
    pub fn from_env(get: impl Fn(&str) -> Option<String>) -> Result<Config, ConfigError> {
        // Upstream's `${VAR:-default}`: empty is the same as unset.
        let var = |name: &str| get(name).filter(|v| !v.is_empty());

        let places = Places::from_env(&var)?;
        let api = ApiAccess::from_env(&var)?;
        let template = Template::from_env(
            var("CNI_NETWORK_CONFIG_FILE").map(PathBuf::from),
            var("CNI_NETWORK_CONFIG"),
        )?;
        // The node, and the taint that keeps pods off it until we are ready.
        let node_name = node_name(var("LINKERD_CNI_NODE_NAME"))?;
        let startup_taint = startup_taint(var("LINKERD_CNI_STARTUP_TAINT"))?;
        let life = Lifecycle::from_env(&var)?;
        let keeping = Keeping::from_env(&var)?;

        let config = Config {
            dest_cni_net_dir: places.dest_cni_net_dir,
            dest_cni_bin_dir: places.dest_cni_bin_dir,
            mount_prefix: places.mount_prefix,
            container_cni_bin_dir: places.container_cni_bin_dir,
            kubeconfig_file_name: places.kubeconfig_file_name,
            kube_ca_file: api.kube_ca_file,
            skip_tls_verify: api.skip_tls_verify,
            k8s_protocol: api.k8s_protocol,
            k8s_host: api.k8s_host,
            k8s_port: api.k8s_port,
            template,
            node_name,
            startup_taint,
            resync: life.resync,
            watch: life.watch,
            service_account_dir: api.service_account_dir,
            on_exit: life.on_exit,
            pod_name: life.pod_name,
            pod_namespace: life.pod_namespace,
            chain_write_outside_conf_dir: keeping.chain_write_outside_conf_dir,
            chain_mode: keeping.chain_mode,
            metrics_addr: keeping.metrics_addr,
            events: keeping.events,
            plugin_service_account: keeping.plugin_service_account,
            agent_only: keeping.agent_only,
        };
        // Fail at start on a template that can never render.
        config.desired_entry()?;
        Ok(config)
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

    /// Reads the template (again, when it is a file: a mounted ConfigMap may
    /// change) and renders the entry the active conflist must end with.
    pub fn desired_entry(&self) -> Result<Entry, ConfigError> {
        self.desired().map(|(e, _)| e)
    }

    /// [`Config::desired_entry`], and why its chain mode is what it is.
    /// `auto` reads the runtime's settings each time: they change when the
    /// runtime is reconfigured, and the mode follows.
    pub fn desired(&self) -> Result<(Entry, ModeNote), ConfigError> {
        let text = self.template.read()?;
        let mut e = entry::render(
            &text,
            self.template.var(),
            &self.kubeconfig_host_path(),
            &self.dest_cni_net_dir,
        )?;
        if self.agent_only {
            e = entry::agent_only(e, self.template.var())?;
        }
        let template_auto = e
            .get(owned::MODE_KEY)
            .is_some_and(|v| v.as_str() == Some(AUTO));
        let (choice, source) = match self.chain_mode {
            Some(c) => (Some(c), "LINKERD_CNI_CHAIN_MODE"),
            None if template_auto => (Some(ModeSetting::Auto), self.template.var()),
            None => (None, self.template.var()),
        };
        let with = |e: Entry, key: &str, value: &str| {
            e.with(key, value)
                .map_err(|err| ConfigError::new(source, err.to_string()))
        };
        let (e, note) = match choice {
            Some(ModeSetting::Auto) => {
                let sel = runtime::select(&Host {
                    prefix: &self.mount_prefix,
                });
                let e = with(e, owned::MODE_KEY, sel.mode.as_str())?;
                let e = with(e, linkerd_cni_chain::MODE_REASON_KEY, &sel.reason)?;
                let note = ModeNote {
                    mode: sel.mode,
                    why: format!("{source}=auto: {}", sel.reason),
                    conflict: None,
                };
                (e, note)
            }
            Some(ModeSetting::Fixed(m)) => {
                let e = with(e, owned::MODE_KEY, m.as_str())?;
                (e, self.fixed_note(m, format!("set by {source}")))
            }
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
                (e, self.fixed_note(m, why))
            }
        };
        owned::mode_of(&e).map_err(|err| ConfigError::new(source, err.to_string()))?;
        Ok((e, note))
    }

    /// A mode not chosen by `auto`: owned mode is checked against the
    /// runtime's settings all the same.
    fn fixed_note(&self, mode: ChainMode, why: String) -> ModeNote {
        let conflict = (mode == ChainMode::Owned)
            .then(|| {
                runtime::select(&Host {
                    prefix: &self.mount_prefix,
                })
            })
            .filter(|sel| sel.mode != ChainMode::Owned)
            .map(|sel| sel.reason);
        ModeNote {
            mode,
            why,
            conflict,
        }
    }
}

/// Where the files go: host paths (what the runtime and the plugin see),
/// and the host as the container sees it (where the installer writes).
struct Places {
    dest_cni_net_dir: PathBuf,
    dest_cni_bin_dir: PathBuf,
    mount_prefix: PathBuf,
    container_cni_bin_dir: PathBuf,
    kubeconfig_file_name: String,
}

impl Places {
    fn from_env(var: &impl Fn(&str) -> Option<String>) -> Result<Places, ConfigError> {
        Ok(Places {
            dest_cni_net_dir: host_dir(
                "DEST_CNI_NET_DIR",
                var("DEST_CNI_NET_DIR"),
                DEFAULT_DEST_CNI_NET_DIR,
            )?,
            dest_cni_bin_dir: host_dir(
                "DEST_CNI_BIN_DIR",
                var("DEST_CNI_BIN_DIR"),
                DEFAULT_DEST_CNI_BIN_DIR,
            )?,
            mount_prefix: absolute(
                "CONTAINER_MOUNT_PREFIX",
                var("CONTAINER_MOUNT_PREFIX"),
                DEFAULT_CONTAINER_MOUNT_PREFIX,
            )?,
            container_cni_bin_dir: absolute(
                "CONTAINER_CNI_BIN_DIR",
                var("CONTAINER_CNI_BIN_DIR"),
                DEFAULT_CONTAINER_CNI_BIN_DIR,
            )?,
            kubeconfig_file_name: kubeconfig_file_name(var("KUBECONFIG_FILE_NAME"))?,
        })
    }
}

/// How the plugin reaches the API server: what goes into the kubeconfig
/// the installer writes for it.
struct ApiAccess {
    service_account_dir: PathBuf,
    kube_ca_file: PathBuf,
    skip_tls_verify: bool,
    k8s_protocol: String,
    k8s_host: String,
    k8s_port: u16,
}

impl ApiAccess {
    fn from_env(var: &impl Fn(&str) -> Option<String>) -> Result<ApiAccess, ConfigError> {
        let service_account_dir = absolute(
            "LINKERD_CNI_SERVICE_ACCOUNT_DIR",
            var("LINKERD_CNI_SERVICE_ACCOUNT_DIR"),
            DEFAULT_SERVICE_ACCOUNT_DIR,
        )?;
        let kube_ca_file = match var("KUBE_CA_FILE") {
            Some(p) => PathBuf::from(p),
            None => service_account_dir.join("ca.crt"),
        };
        Ok(ApiAccess {
            service_account_dir,
            kube_ca_file,
            skip_tls_verify: boolean("SKIP_TLS_VERIFY", var("SKIP_TLS_VERIFY"), false)?,
            k8s_protocol: k8s_protocol(var("KUBERNETES_SERVICE_PROTOCOL"))?,
            k8s_host: k8s_host(var("KUBERNETES_SERVICE_HOST"))?,
            k8s_port: k8s_port(var("KUBERNETES_SERVICE_PORT"))?,
        })
    }
}

/// Timing and lifecycle: how often to look again, what SIGTERM does to the
/// node, and this pod's own name (its owner decides that under `auto`).
struct Lifecycle {
    resync: Duration,
    watch: bool,
    on_exit: OnExit,
    pod_name: Option<String>,
    pod_namespace: Option<String>,
}

impl Lifecycle {
    fn from_env(var: &impl Fn(&str) -> Option<String>) -> Result<Lifecycle, ConfigError> {
        Ok(Lifecycle {
            resync: resync(var("LINKERD_CNI_RESYNC_SECONDS"))?,
            watch: boolean("LINKERD_CNI_WATCH", var("LINKERD_CNI_WATCH"), true)?,
            on_exit: on_exit(var("LINKERD_CNI_UNINSTALL_ON_EXIT"))?,
            pod_name: object_name(
                "LINKERD_CNI_POD_NAME",
                var("LINKERD_CNI_POD_NAME"),
                is_dns_subdomain,
                "a pod name (a DNS-1123 subdomain: at most 253 lowercase letters, digits, \
                 '-' and '.'); set it from the downward API's metadata.name",
            )?,
            pod_namespace: object_name(
                "LINKERD_CNI_POD_NAMESPACE",
                var("LINKERD_CNI_POD_NAMESPACE"),
                is_dns_label,
                "a namespace (a DNS-1123 label: at most 63 lowercase letters, digits and '-'); \
                 set it from the downward API's metadata.namespace",
            )?,
        })
    }
}

/// How the chain is kept, and what the installer tells about it.
struct Keeping {
    chain_write_outside_conf_dir: bool,
    chain_mode: Option<ModeSetting>,
    metrics_addr: Option<std::net::SocketAddr>,
    events: bool,
    plugin_service_account: Option<String>,
    agent_only: bool,
}

impl Keeping {
    fn from_env(var: &impl Fn(&str) -> Option<String>) -> Result<Keeping, ConfigError> {
        Ok(Keeping {
            chain_write_outside_conf_dir: boolean(
                "LINKERD_CNI_CHAIN_WRITE_OUTSIDE_CONF_DIR",
                var("LINKERD_CNI_CHAIN_WRITE_OUTSIDE_CONF_DIR"),
                false,
            )?,
            chain_mode: chain_mode(var("LINKERD_CNI_CHAIN_MODE"))?,
            metrics_addr: metrics_addr(var("LINKERD_CNI_METRICS_ADDR"))?,
            events: boolean("LINKERD_CNI_EVENTS", var("LINKERD_CNI_EVENTS"), true)?,
            plugin_service_account: plugin_service_account(
                var("LINKERD_CNI_PLUGIN_TOKEN"),
                var("LINKERD_CNI_PLUGIN_SERVICE_ACCOUNT"),
            )?,
            agent_only: boolean(
                "LINKERD_CNI_AGENT_ONLY",
                var("LINKERD_CNI_AGENT_ONLY"),
                false,
            )?,
        })
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

fn absolute(
    name: &'static str,
    value: Option<String>,
    default: &str,
) -> Result<PathBuf, ConfigError> {
    let v = value.unwrap_or_else(|| default.to_string());
    let p = PathBuf::from(&v);
    if !p.is_absolute() {
        return Err(ConfigError::new(
            name,
            format!("expected an absolute path, got {v:?}"),
        ));
    }
    if p.components().any(|c| c == Component::ParentDir) {
        return Err(ConfigError::new(
            name,
            format!("{v:?} must not contain \"..\""),
        ));
    }
    // Collecting the components drops trailing and doubled slashes, so the
    // paths written into the entry are canonical in form.
    Ok(p.components().collect())
}

/// A host directory: absolute, and also usable under the mount prefix.
fn host_dir(
    name: &'static str,
    value: Option<String>,
    default: &str,
) -> Result<PathBuf, ConfigError> {
    let p = absolute(name, value, default)?;
    if p.to_str().is_none() {
        return Err(ConfigError::new(name, "must be valid UTF-8"));
    }
    if p == Path::new("/") {
        return Err(ConfigError::new(name, "must not be the root directory"));
    }
    Ok(p)
}

fn boolean(name: &'static str, value: Option<String>, default: bool) -> Result<bool, ConfigError> {
    match value.as_deref().map(str::trim).map(str::to_ascii_lowercase) {
        None => Ok(default),
        Some(v) if v == "true" => Ok(true),
        Some(v) if v == "false" => Ok(false),
        Some(_) => Err(ConfigError::new(
            name,
            format!(
                "expected true or false, got {:?}",
                value.unwrap_or_default()
            ),
        )),
    }
}

/// `KUBECONFIG_FILE_NAME`: a plain name the runtime will not load, and
/// none of the conf dir's names linkerd-cni uses for something else (its
/// entry file would be overwritten in turns with the kubeconfig; a name
/// with the temp prefix would be removed as a leftover on every pass).
fn kubeconfig_file_name(value: Option<String>) -> Result<String, ConfigError> {
    let kubeconfig_file_name = value.unwrap_or_else(|| DEFAULT_KUBECONFIG_FILE_NAME.to_string());
    if !is_plain_file_name(&kubeconfig_file_name) {
        return Err(ConfigError::new(
            "KUBECONFIG_FILE_NAME",
            format!("{kubeconfig_file_name:?} is not a plain file name"),
        ));
    }
    if kubeconfig_file_name == linkerd_cni_chain::ENTRY_FILE {
        return Err(ConfigError::new(
            "KUBECONFIG_FILE_NAME",
            format!(
                "{kubeconfig_file_name:?} is the installer's entry file in the same directory; \
                 pick another name (the default is {DEFAULT_KUBECONFIG_FILE_NAME})"
            ),
        ));
    }
    if kubeconfig_file_name.starts_with(linkerd_cni_chain::TEMP_PREFIX) {
        return Err(ConfigError::new(
            "KUBECONFIG_FILE_NAME",
            format!(
                "{kubeconfig_file_name:?} starts with {:?}, the prefix of linkerd-cni's temp \
                 files, which are removed as leftovers; pick another name (the default is \
                 {DEFAULT_KUBECONFIG_FILE_NAME})",
                linkerd_cni_chain::TEMP_PREFIX
            ),
        ));
    }
    if has_config_extension(&kubeconfig_file_name) {
        // The runtime would try to load it as the node's network config.
        return Err(ConfigError::new(
            "KUBECONFIG_FILE_NAME",
            format!(
                "{kubeconfig_file_name:?} ends in .conf, .conflist or .json, which the \
                 container runtime would load as a network config; pick another name"
            ),
        ));
    }
    Ok(kubeconfig_file_name)
}

fn k8s_protocol(value: Option<String>) -> Result<String, ConfigError> {
    let k8s_protocol = value.unwrap_or_else(|| "https".into());
    if !matches!(k8s_protocol.as_str(), "https" | "http") {
        return Err(ConfigError::new(
            "KUBERNETES_SERVICE_PROTOCOL",
            format!("expected https or http, got {k8s_protocol:?}"),
        ));
    }
    Ok(k8s_protocol)
}

fn k8s_host(value: Option<String>) -> Result<String, ConfigError> {
    let k8s_host = value.ok_or_else(|| {
        ConfigError::new(
            "KUBERNETES_SERVICE_HOST",
            "not set; the kubelet sets it in every pod, set it by hand outside one",
        )
    })?;
    if k8s_host.contains(['/', ' ', '@', '?', '#']) {
        return Err(ConfigError::new(
            "KUBERNETES_SERVICE_HOST",
            format!("{k8s_host:?} is not a host name or IP address"),
        ));
    }
    Ok(k8s_host)
}

fn k8s_port(value: Option<String>) -> Result<u16, ConfigError> {
    let port = value.ok_or_else(|| {
        ConfigError::new(
            "KUBERNETES_SERVICE_PORT",
            "not set; the kubelet sets it in every pod, set it by hand outside one",
        )
    })?;
    port.trim()
        .parse::<u16>()
        .ok()
        .filter(|p| *p > 0)
        .ok_or_else(|| {
            ConfigError::new(
                "KUBERNETES_SERVICE_PORT",
                format!("expected a port number 1-65535, got {port:?}"),
            )
        })
}

/// `LINKERD_CNI_METRICS_ADDR`: an IP literal and a port, never a name (no
/// resolver call at start, and no doubt about which interface listens).
fn metrics_addr(value: Option<String>) -> Result<Option<std::net::SocketAddr>, ConfigError> {
    let Some(v) = value.map(|v| v.trim().to_string()) else {
        return Ok(None);
    };
    let addr: std::net::SocketAddr = v.parse().map_err(|_| {
        ConfigError::new(
            "LINKERD_CNI_METRICS_ADDR",
            format!(
                "expected IP:PORT (e.g. \"$(LINKERD_CNI_NODE_IP):9995\" with the node's IP \
                 from the downward API's status.hostIP, or [IPv6]:PORT), got {v:?}"
            ),
        )
    })?;
    // The pod is on the host network: every address of the node would
    // serve the installer's metrics, to whoever reaches any of them.
    if addr.ip().is_unspecified() {
        return Err(ConfigError::new(
            "LINKERD_CNI_METRICS_ADDR",
            format!(
                "{v:?} listens on every address of the node (the pod is on the host network): \
                 set it to the node's own IP, e.g. \"$(LINKERD_CNI_NODE_IP):9995\" with \
                 status.hostIP from the downward API"
            ),
        ));
    }
    Ok(Some(addr))
}

fn node_name(value: Option<String>) -> Result<Option<String>, ConfigError> {
    let node_name = value.map(|v| v.trim().to_string());
    if let Some(n) = &node_name
        && !is_dns_subdomain(n)
    {
        return Err(ConfigError::new(
            "LINKERD_CNI_NODE_NAME",
            format!("{n:?} is not a node name (set it from the downward API's spec.nodeName)"),
        ));
    }
    Ok(node_name)
}

/// An optional object name from `var`, trimmed, checked with `valid` as the
/// API server checks it: the name goes into API paths.
fn object_name(
    var: &'static str,
    value: Option<String>,
    valid: fn(&str) -> bool,
    expected: &str,
) -> Result<Option<String>, ConfigError> {
    let name = value.map(|v| v.trim().to_string());
    if let Some(n) = &name
        && !valid(n)
    {
        return Err(ConfigError::new(var, format!("{n:?} is not {expected}")));
    }
    Ok(name)
}

/// `LINKERD_CNI_PLUGIN_TOKEN`: `mint` (the default: a token of the
/// plugin's ServiceAccount, `LINKERD_CNI_PLUGIN_SERVICE_ACCOUNT`) or `own`
/// (this pod's projected token, as upstream's installer writes, for RBAC
/// without a plugin account): the account to mint for, or none.
fn plugin_service_account(
    how: Option<String>,
    value: Option<String>,
) -> Result<Option<String>, ConfigError> {
    match how.as_deref().map(str::trim) {
        None | Some("mint") => {}
        Some("own") => return Ok(None),
        Some(other) => {
            return Err(ConfigError::new(
                "LINKERD_CNI_PLUGIN_TOKEN",
                format!("{other:?} is neither \"mint\" nor \"own\""),
            ));
        }
    }
    let name = value.map_or_else(
        || DEFAULT_PLUGIN_SERVICE_ACCOUNT.to_string(),
        |v| v.trim().to_string(),
    );
    if !is_dns_subdomain(&name) {
        return Err(ConfigError::new(
            "LINKERD_CNI_PLUGIN_SERVICE_ACCOUNT",
            format!("{name:?} is not a ServiceAccount name"),
        ));
    }
    Ok(Some(name))
}

fn startup_taint(value: Option<String>) -> Result<String, ConfigError> {
    let startup_taint = value
        .map(|v| v.trim().to_string())
        .unwrap_or_else(|| DEFAULT_STARTUP_TAINT.to_string());
    if !is_qualified_name(&startup_taint) {
        return Err(ConfigError::new(
            "LINKERD_CNI_STARTUP_TAINT",
            format!(
                "{startup_taint:?} is not a taint key (an optional DNS-subdomain prefix and \
                 '/', then 1-63 letters, digits, '-', '_' or '.')"
            ),
        ));
    }
    Ok(startup_taint)
}

fn resync(value: Option<String>) -> Result<Duration, ConfigError> {
    Ok(match value {
        None => DEFAULT_RESYNC,
        Some(s) => s
            .trim()
            .parse::<f64>()
            .ok()
            .filter(|v| v.is_finite() && *v > 0.0 && *v <= MAX_RESYNC_SECONDS)
            .map(Duration::from_secs_f64)
            .ok_or_else(|| {
                ConfigError::new(
                    "LINKERD_CNI_RESYNC_SECONDS",
                    format!("expected a number of seconds in (0, 3600], got {s:?}"),
                )
            })?,
    })
}

fn on_exit(value: Option<String>) -> Result<OnExit, ConfigError> {
    match value
        .as_deref()
        .map(str::trim)
        .map(str::to_ascii_lowercase)
        .as_deref()
    {
        None | Some("auto") => Ok(OnExit::Auto),
        Some("true") => Ok(OnExit::Uninstall),
        Some("false") => Ok(OnExit::Leave),
        Some(_) => Err(ConfigError::new(
            "LINKERD_CNI_UNINSTALL_ON_EXIT",
            format!(
                "expected auto, true or false, got {:?}",
                value.unwrap_or_default()
            ),
        )),
    }
}

fn chain_mode(value: Option<String>) -> Result<Option<ModeSetting>, ConfigError> {
    match value {
        None => Ok(None),
        Some(v) if v.trim() == AUTO => Ok(Some(ModeSetting::Auto)),
        Some(v) => Ok(Some(ModeSetting::Fixed(
            ChainMode::parse(v.trim()).ok_or_else(|| {
                ConfigError::new(
                    "LINKERD_CNI_CHAIN_MODE",
                    format!("expected auto, inline or owned, got {v:?}"),
                )
            })?,
        ))),
    }
}

/// A qualified name, as label and taint keys are: `[prefix/]name`.
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

/// Whether a runtime would load a file of this name as a network config
/// (the chain library's rule, so both agree).
pub fn has_config_extension(name: &str) -> bool {
    linkerd_cni_chain::is_config_name(std::ffi::OsStr::new(name))
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
        assert!(has_config_extension("10-calico.conflist"));
        assert!(has_config_extension(".tmp.conf"));
        assert!(has_config_extension("x.json"));
        assert!(!has_config_extension("ZZZ-linkerd-cni-kubeconfig"));
        assert!(!has_config_extension("a.conf.bak"));
    }
}
