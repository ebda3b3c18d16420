//! The command line: upstream's flags and environment variables (the
//! `linkerd2-cni` chart passes `--admin-addr`, `--log-format`,
//! `--log-level` and sets `LINKERD_CNI_REPAIR_CONTROLLER_NODE_NAME` and
//! `_POD_NAME`), its kubeconfig flags, and this controller's own settings,
//! each with a `LINKERD_CNI_REPAIR_CONTROLLER_*` variable.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use k8s_openapi::jiff::fmt::friendly::SpanParser;

pub use crate::logging::LogFormat;

/// Deletes this node's meshed pods whose linkerd-network-validator failed
/// (exit code 95, started without linkerd-cni's rules), once the node's
/// chain is healthy, so that their owners create them again.
#[derive(Debug, Clone, Parser)]
#[command(
    name = "linkerd-cni-repair-controller",
    version,
    after_help = "Each flag, its variable and its default, with what it does: \
                  docs/configuration.md (\"Repair controller flags\") in the linkerd-cni repository."
)]
pub struct Args {
    /// Log filter: a level (`info`) or per-target directives
    /// (`linkerd_cni_agent=debug,warn`). The default is the installer's:
    /// linkerd-cni's crates at info, others' warnings.
    #[arg(
        long,
        env = "LINKERD_CNI_REPAIR_CONTROLLER_LOG_LEVEL",
        default_value = crate::logging::ROUTINE
    )]
    pub log_level: String,

    #[arg(
        long,
        env = "LINKERD_CNI_REPAIR_CONTROLLER_LOG_FORMAT",
        value_enum,
        default_value = "plain"
    )]
    pub log_format: LogFormat,

    /// The node whose pods this controller repairs.
    #[arg(long, env = "LINKERD_CNI_REPAIR_CONTROLLER_NODE_NAME")]
    pub node_name: String,

    /// This controller's pod, named as the reporting instance of Events.
    #[arg(long, env = "LINKERD_CNI_REPAIR_CONTROLLER_POD_NAME")]
    pub controller_pod_name: String,

    /// Serves `/live`, `/ready` and `/metrics`.
    #[arg(
        long,
        env = "LINKERD_CNI_REPAIR_CONTROLLER_ADMIN_ADDR",
        default_value = "0.0.0.0:9990"
    )]
    pub admin_addr: SocketAddr,

    /// Listen on this address, with `--admin-addr`'s port. deploy/ sets the
    /// node's IP (`status.hostIP`): on the host network `0.0.0.0` would
    /// open the port on every address of the node.
    #[arg(long, env = "LINKERD_CNI_REPAIR_CONTROLLER_ADMIN_IP")]
    pub admin_ip: Option<IpAddr>,

    /// The node's CNI conf dir as mounted in this container. While the chain
    /// there is broken, no pod is deleted. When the directory does not
    /// exist, pods are deleted without this check, as upstream does.
    #[arg(
        long,
        env = "LINKERD_CNI_REPAIR_CONTROLLER_CNI_NET_DIR",
        default_value = "/host/etc/cni/net.d"
    )]
    pub cni_net_dir: PathBuf,

    /// How often to look at the chain again while it holds repairs back.
    #[arg(
        long,
        env = "LINKERD_CNI_REPAIR_CONTROLLER_CHAIN_CHECK_INTERVAL",
        default_value = "2s",
        value_parser = parse_duration
    )]
    pub chain_check_interval: Duration,

    /// The wait before deleting the same pod (namespace and name) again;
    /// it doubles with every deletion.
    #[arg(
        long,
        env = "LINKERD_CNI_REPAIR_CONTROLLER_POD_BACKOFF",
        default_value = "10s",
        value_parser = parse_duration
    )]
    pub pod_backoff: Duration,

    /// The longest wait between deletions of the same pod.
    #[arg(
        long,
        env = "LINKERD_CNI_REPAIR_CONTROLLER_POD_BACKOFF_MAX",
        default_value = "5m",
        value_parser = parse_duration
    )]
    pub pod_backoff_max: Duration,

    /// The time allowed for one deletion and for one Event.
    #[arg(
        long,
        env = "LINKERD_CNI_REPAIR_CONTROLLER_API_TIMEOUT",
        default_value = "5s",
        value_parser = parse_duration
    )]
    pub api_timeout: Duration,

    /// The plugin's state dir as mounted in this container. When it exists,
    /// the controller answers the plugin's pod lookups on a root-only socket
    /// there (`agent.sock`), from watches, so that a pod start needs no API
    /// call; without it (the linkerd2-cni chart mounts no state dir) the
    /// plugin asks the API server itself.
    #[arg(
        long,
        env = "LINKERD_CNI_REPAIR_CONTROLLER_STATE_DIR",
        default_value = "/host/run/linkerd-cni"
    )]
    pub state_dir: PathBuf,

    /// The kubeconfig to use; without it, `$KUBECONFIG` or
    /// `~/.kube/config` when present, else the pod's service account.
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,

    /// The kubeconfig context to use.
    #[arg(long)]
    pub context: Option<String>,

    /// The kubeconfig cluster to use.
    #[arg(long)]
    pub cluster: Option<String>,

    /// The kubeconfig user to use.
    #[arg(long)]
    pub user: Option<String>,
}

impl Args {
    /// Where the admin server listens.
    pub fn admin_listen(&self) -> SocketAddr {
        match self.admin_ip {
            Some(ip) => SocketAddr::new(ip, self.admin_addr.port()),
            None => self.admin_addr,
        }
    }
}

/// `500ms`, `2s`, `5m`, `1h30m` (jiff's friendly format: units up to
/// hours), or bare seconds (`1.5`).
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    static PARSER: SpanParser = SpanParser::new();
    let s = s.trim();
    let parsed = match s.parse::<f64>() {
        Ok(secs) => Duration::try_from_secs_f64(secs).ok(),
        Err(_) => PARSER.parse_unsigned_duration(s).ok(),
    };
    parsed.ok_or_else(|| format!("{s:?} is not a duration (like 500ms, 2s, 5m or 1h)"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("2s"), Ok(Duration::from_secs(2)));
        assert_eq!(parse_duration("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(parse_duration("1.5"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("1h30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_duration("2 minutes"), Ok(Duration::from_secs(120)));
        assert!(parse_duration("-1s").is_err());
        assert!(parse_duration("2 weeks").is_err());
        assert!(parse_duration("").is_err());
    }

    #[test]
    fn the_charts_command_line() {
        let a = Args::try_parse_from([
            "linkerd-cni-repair-controller",
            "--admin-addr",
            "[::]:9990",
            "--log-format",
            "json",
            "--log-level",
            "info",
            "--node-name=n1",
            "--controller-pod-name",
            "linkerd-cni-abcde",
        ])
        .unwrap();
        assert_eq!(a.admin_addr, "[::]:9990".parse().unwrap());
        assert_eq!(a.log_format, LogFormat::Json);
        assert_eq!(a.log_level, "info");
        assert_eq!(a.node_name, "n1");
        assert_eq!(a.controller_pod_name, "linkerd-cni-abcde");
        assert_eq!(a.cni_net_dir, PathBuf::from("/host/etc/cni/net.d"));
        assert_eq!(a.admin_ip, None);
        assert_eq!(a.admin_listen(), "[::]:9990".parse().unwrap());
    }

    #[test]
    fn the_admin_ip_replaces_the_address_not_the_port() {
        let a = Args::try_parse_from([
            "linkerd-cni-repair-controller",
            "--node-name=n1",
            "--controller-pod-name=p",
            "--admin-addr=0.0.0.0:9990",
            "--admin-ip=fd00::7",
        ])
        .unwrap();
        assert_eq!(a.admin_listen(), "[fd00::7]:9990".parse().unwrap());
    }

    #[test]
    fn node_and_pod_names_are_required() {
        // (Unless the environment gives them, which tests do not set.)
        let e = Args::try_parse_from(["linkerd-cni-repair-controller"]).unwrap_err();
        assert!(e.to_string().contains("--node-name"), "{e}");
    }
}
