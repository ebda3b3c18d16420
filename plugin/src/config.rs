//! linkerd-cni's own config keys, read from the network config the runtime
//! passes on stdin ([`crate::cni::netconf`] parses the members every plugin
//! has; this module, those that are linkerd-cni's).
//!
//! Keys and meaning follow upstream linkerd-cni and the `linkerd2-cni` Helm
//! chart, so existing configs work unchanged; new keys are ours and optional.
//! Each key is read by hand rather than by serde derive so that a bad value
//! yields an error naming the key and the value.
//!
//! Where upstream's Go struct would silently read an absent port as 0 (a
//! REDIRECT to port 0), we default to the chart's values instead.

use std::path::PathBuf;
use std::time::Duration;

use log::LevelFilter;
use serde_json::{Map, Value};

use crate::cni::netconf::short;
use crate::cni::{CniError, code};
use crate::iptables::rules::{MAX_OWNER_ID, MIN_OWNER_ID};
use crate::logging;

pub const DEFAULT_CONF_DIR: &str = "/etc/cni/net.d";
pub use linkerd_cni_state::heartbeat::DEFAULT_STATE_DIR;
pub const DEFAULT_EXEMPT_NAMESPACES: [&str; 2] = ["linkerd-cni", "kube-system"];
pub const DEFAULT_API_BUDGET: Duration = Duration::from_secs(10);
pub const DEFAULT_REPAIR_BUDGET: Duration = Duration::from_secs(2);
/// Well under the kubelet's 2-minute runtime request timeout, so that the
/// runtime always gets our answer rather than abandoning the call and
/// retrying while we still run.
pub const DEFAULT_ADD_DEADLINE: Duration = Duration::from_secs(60);
/// `add_deadline_seconds` must leave the runtime time to act on our answer
/// before the kubelet's 120 s timeout.
pub const MAX_ADD_DEADLINE: Duration = Duration::from_secs(110);

/// Which iptables binaries to drive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IptablesMode {
    /// `iptables-legacy` (upstream's default; also what "" means).
    Legacy,
    /// `iptables-nft`.
    Nft,
    /// Plain `iptables`, whatever the node links it to.
    Plain,
}

impl IptablesMode {
    pub fn as_str(self) -> &'static str {
        match self {
            IptablesMode::Legacy => "legacy",
            IptablesMode::Nft => "nft",
            IptablesMode::Plain => "plain",
        }
    }
}

/// The `linkerd` block: what proxy-init would have been told.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProxyInit {
    pub incoming_proxy_port: u16,
    pub outgoing_proxy_port: u16,
    /// Traffic of this uid skips the proxy; no rule when <= 0.
    pub proxy_uid: i64,
    /// Traffic of this gid skips the proxy; no rule when <= 0.
    pub proxy_gid: i64,
    /// Inbound ports to redirect; empty means all.
    pub ports_to_redirect: Vec<u16>,
    /// Ports or `a-b` ranges, as given (validated when rules are built).
    pub inbound_ports_to_ignore: Vec<String>,
    pub outbound_ports_to_ignore: Vec<String>,
    /// CIDRs, as given.
    pub subnets_to_ignore: Vec<String>,
    pub simulate: bool,
    pub use_wait_flag: bool,
    pub iptables_mode: IptablesMode,
    pub ipv6: bool,
}

impl Default for ProxyInit {
    fn default() -> Self {
        ProxyInit {
            incoming_proxy_port: 4143,
            outgoing_proxy_port: 4140,
            proxy_uid: 2102,
            proxy_gid: -1,
            ports_to_redirect: vec![],
            inbound_ports_to_ignore: vec![],
            outbound_ports_to_ignore: vec![],
            subnets_to_ignore: vec![],
            simulate: false,
            use_wait_flag: false,
            iptables_mode: IptablesMode::Legacy,
            ipv6: false,
        }
    }
}

/// Everything linkerd-cni reads from its stdin config.
#[derive(Debug, Clone, PartialEq)]
pub struct PluginConfig {
    pub log_level: LevelFilter,
    /// `kubernetes.kubeconfig`.
    pub kubeconfig: Option<PathBuf>,
    /// `kubernetes.api-budget-seconds`: total time for all API calls of one ADD.
    pub api_budget: Duration,
    /// `kubernetes.allow-plain-http`: accept an `http://` API server (the
    /// token then crosses the network in clear). Default false.
    pub allow_plain_http: bool,
    /// `kubernetes.agent-only`: the node holds no credential of the
    /// plugin's (the installer writes none); the pod's facts come from the
    /// node agent alone, never from the API server. Default false.
    pub agent_only: bool,
    pub proxy: ProxyInit,
    /// `exempt-namespaces`: pods here pass through without any API call.
    pub exempt_namespaces: Vec<String>,
    /// `cni_conf_dir`: where the active conflist lives.
    pub cni_conf_dir: PathBuf,
    /// `chain_heal`: check (and repair) the chain on every ADD.
    pub chain_heal: bool,
    /// `chain_repair_budget_seconds`: the most an ADD spends repairing.
    pub chain_repair_budget: Duration,
    /// `add_deadline_seconds`: the most one ADD takes, all steps included
    /// (chain check and repair, API calls, every iptables command); each
    /// step gets the smaller of its own bound and what is left.
    pub add_deadline: Duration,
    /// `chain_write_outside_conf_dir`: repair through a symlinked config to
    /// a file outside the conf dir. Default false: refused, and said so.
    pub chain_write_outside_conf_dir: bool,
    /// `state_dir`: where the plugin keeps what it remembers between
    /// invocations (repair history for fight detection). Outside the conf
    /// dir, where every write would make runtimes reload.
    pub state_dir: PathBuf,
    /// `installer_gone_after_seconds`: how old the installer's heartbeat
    /// in `state_dir` may be before the installer is taken for gone (a
    /// rejected token then passes pods through instead of asking the
    /// runtime to retry). None: three of the installer's resync periods
    /// plus 30 s (see `linkerd_cni_state::heartbeat`).
    pub installer_gone_after: Option<Duration>,
}

impl Default for PluginConfig {
    fn default() -> Self {
        PluginConfig {
            log_level: LevelFilter::Warn,
            kubeconfig: None,
            api_budget: DEFAULT_API_BUDGET,
            allow_plain_http: false,
            agent_only: false,
            proxy: ProxyInit::default(),
            exempt_namespaces: DEFAULT_EXEMPT_NAMESPACES.map(String::from).to_vec(),
            cni_conf_dir: PathBuf::from(DEFAULT_CONF_DIR),
            chain_heal: true,
            chain_repair_budget: DEFAULT_REPAIR_BUDGET,
            add_deadline: DEFAULT_ADD_DEADLINE,
            chain_write_outside_conf_dir: false,
            state_dir: PathBuf::from(DEFAULT_STATE_DIR),
            installer_gone_after: None,
        }
    }
}

impl PluginConfig {
    /// Reads our keys from a network config's JSON object (the stdin
    /// config's, or an entry of a conflist); a present key with a bad value
    /// is an invalid config (code 7) naming the key. An old `policy` block
    /// is ignored, like upstream.
    pub fn from_map(raw: &Map<String, Value>) -> Result<PluginConfig, CniError> {
        let mut c = PluginConfig::default();
        let top = Obj { map: raw, path: "" };
        c.read_top_level(&top)?;
        if let Some(k8s) = top.object("kubernetes")? {
            c.read_kubernetes(&k8s)?;
        }
        if let Some(l) = top.object("linkerd")? {
            c.proxy.read(&l)?;
        }
        Ok(c)
    }

    /// The keys outside the `kubernetes` and `linkerd` blocks.
    fn read_top_level(&mut self, top: &Obj) -> Result<(), CniError> {
        self.log_level = logging::level_from_config(top.string("log_level")?.as_deref());
        if let Some(dir) = top.string("cni_conf_dir")?
            && !dir.is_empty()
        {
            self.cni_conf_dir = PathBuf::from(dir);
        }
        // Type-checked like every key; where it may be is the heartbeat's
        // rule, shared with the installer.
        top.string("state_dir")?;
        let (dir, refused) =
            linkerd_cni_state::heartbeat::state_dir_of(top.map, &self.cni_conf_dir);
        if let Some(why) = refused {
            log::warn!("{why}");
        }
        self.state_dir = dir;
        self.installer_gone_after = top.seconds("installer_gone_after_seconds")?;
        set(
            &mut self.exempt_namespaces,
            top.strings("exempt-namespaces")?,
        );
        set(&mut self.chain_heal, top.bool("chain_heal")?);
        set(
            &mut self.chain_repair_budget,
            top.seconds("chain_repair_budget_seconds")?,
        );
        set(
            &mut self.chain_write_outside_conf_dir,
            top.bool("chain_write_outside_conf_dir")?,
        );
        if let Some(d) = top.seconds("add_deadline_seconds")? {
            if d > MAX_ADD_DEADLINE {
                return Err(bad(
                    "add_deadline_seconds",
                    &Value::from(d.as_secs_f64()),
                    "at most 110 seconds (the kubelet abandons a runtime call after 120 s)",
                ));
            }
            self.add_deadline = d;
        }
        Ok(())
    }

    /// The `kubernetes` block.
    fn read_kubernetes(&mut self, k8s: &Obj) -> Result<(), CniError> {
        if let Some(path) = k8s.string("kubeconfig")?
            && !path.is_empty()
        {
            self.kubeconfig = Some(PathBuf::from(path));
        }
        set(&mut self.api_budget, k8s.seconds("api-budget-seconds")?);
        set(&mut self.allow_plain_http, k8s.bool("allow-plain-http")?);
        set(&mut self.agent_only, k8s.bool("agent-only")?);
        Ok(())
    }
}

impl ProxyInit {
    /// The `linkerd` block: proxy-init's settings.
    fn read(&mut self, l: &Obj) -> Result<(), CniError> {
        set(
            &mut self.incoming_proxy_port,
            l.port("incoming-proxy-port")?,
        );
        set(
            &mut self.outgoing_proxy_port,
            l.port("outgoing-proxy-port")?,
        );
        set(&mut self.proxy_uid, l.owner_id("proxy-uid")?);
        set(&mut self.proxy_gid, l.owner_id("proxy-gid")?);
        set(&mut self.ports_to_redirect, l.ports("ports-to-redirect")?);
        set(
            &mut self.inbound_ports_to_ignore,
            l.strings("inbound-ports-to-ignore")?,
        );
        set(
            &mut self.outbound_ports_to_ignore,
            l.strings("outbound-ports-to-ignore")?,
        );
        set(&mut self.subnets_to_ignore, l.strings("subnets-to-ignore")?);
        set(&mut self.simulate, l.bool("simulate")?);
        set(&mut self.use_wait_flag, l.bool("use-wait-flag")?);
        if let Some(v) = l.string("iptables-mode")? {
            self.iptables_mode = match v.as_str() {
                "" | "legacy" => IptablesMode::Legacy,
                "nft" => IptablesMode::Nft,
                "plain" => IptablesMode::Plain,
                _ => {
                    return Err(bad(
                        "linkerd.iptables-mode",
                        &Value::String(v.clone()),
                        "one of \"legacy\", \"nft\", \"plain\"",
                    ));
                }
            };
        }
        set(&mut self.ipv6, l.bool("ipv6")?);
        Ok(())
    }
}

/// A JSON object being read, with its path for error messages. `null` reads as
/// absent, as Go's decoder treats it.
struct Obj<'a> {
    map: &'a Map<String, Value>,
    path: &'a str,
}

impl<'a> Obj<'a> {
    fn key(&self, k: &str) -> String {
        if self.path.is_empty() {
            k.to_string()
        } else {
            format!("{}.{k}", self.path)
        }
    }

    fn get(&self, k: &str) -> Option<&'a Value> {
        self.map.get(k).filter(|v| !v.is_null())
    }

    fn object(&self, k: &'a str) -> Result<Option<Obj<'a>>, CniError> {
        match self.get(k) {
            None => Ok(None),
            Some(Value::Object(map)) => Ok(Some(Obj { map, path: k })),
            Some(v) => Err(bad(&self.key(k), v, "an object")),
        }
    }

    /// The value of `k` as `read` takes it; a value it refuses is an error
    /// saying it expected `want`.
    fn scalar<T>(
        &self,
        k: &str,
        want: &str,
        read: impl FnOnce(&Value) -> Option<T>,
    ) -> Result<Option<T>, CniError> {
        match self.get(k) {
            None => Ok(None),
            Some(v) => read(v).map(Some).ok_or_else(|| bad(&self.key(k), v, want)),
        }
    }

    fn string(&self, k: &str) -> Result<Option<String>, CniError> {
        self.scalar(k, "a string", |v| v.as_str().map(String::from))
    }

    fn bool(&self, k: &str) -> Result<Option<bool>, CniError> {
        self.scalar(k, "true or false", Value::as_bool)
    }

    fn owner_id(&self, k: &str) -> Result<Option<i64>, CniError> {
        self.scalar(k, &owner_id_want(), owner_id)
    }

    fn port(&self, k: &str) -> Result<Option<u16>, CniError> {
        self.scalar(k, "a port number 1-65535", port_of)
    }

    fn ports(&self, k: &str) -> Result<Option<Vec<u16>>, CniError> {
        match self.get(k) {
            None => Ok(None),
            Some(Value::Array(items)) => items
                .iter()
                .map(|v| port_of(v).ok_or_else(|| bad(&self.key(k), v, "port numbers 1-65535")))
                .collect::<Result<Vec<_>, _>>()
                .map(Some),
            Some(v) => Err(bad(&self.key(k), v, "a list of port numbers")),
        }
    }

    /// A list of strings; numbers are taken as their decimal text, because
    /// hand-written configs often list ports as numbers.
    fn strings(&self, k: &str) -> Result<Option<Vec<String>>, CniError> {
        match self.get(k) {
            None => Ok(None),
            Some(Value::Array(items)) => items
                .iter()
                .map(|v| match v {
                    Value::String(s) => Ok(s.clone()),
                    Value::Number(n) if int_of(v).is_some() => Ok(n.to_string()),
                    _ => Err(bad(&self.key(k), v, "a list of strings")),
                })
                .collect::<Result<Vec<_>, _>>()
                .map(Some),
            Some(v) => Err(bad(&self.key(k), v, "a list of strings")),
        }
    }

    fn seconds(&self, k: &str) -> Result<Option<Duration>, CniError> {
        self.scalar(k, "a number of seconds in (0, 3600]", |v| {
            v.as_f64()
                .filter(|s| s.is_finite() && *s > 0.0 && *s <= 3600.0)
                .map(Duration::from_secs_f64)
        })
    }
}

/// A key that is present replaces the default.
fn set<T>(slot: &mut T, value: Option<T>) {
    if let Some(v) = value {
        *slot = v;
    }
}

fn int_of(v: &Value) -> Option<i64> {
    match v {
        Value::Number(n) => n.as_i64(),
        Value::String(s) => s.trim().parse().ok(),
        _ => None,
    }
}

/// A uid or gid iptables' owner match takes, or -1/0 for none (a config
/// key or a pod's annotation): a value iptables refuses would otherwise
/// fail every meshed pod's ADD.
pub fn owner_id(v: &Value) -> Option<i64> {
    int_of(v).filter(|id| (MIN_OWNER_ID..=MAX_OWNER_ID).contains(id))
}

/// What [`owner_id`] takes, for the error about a value it refuses.
pub fn owner_id_want() -> String {
    format!("an integer id from {MIN_OWNER_ID} to {MAX_OWNER_ID} (-1 or 0: none)")
}

fn port_of(v: &Value) -> Option<u16> {
    int_of(v)
        .and_then(|i| u16::try_from(i).ok())
        .filter(|p| *p > 0)
}

fn bad(key: &str, v: &Value, want: &str) -> CniError {
    CniError::new(
        code::INVALID_CONFIG,
        format!("invalid linkerd-cni config key {key:?}"),
        format!("expected {want}, got {}", short(v)),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(json: &str) -> Result<PluginConfig, CniError> {
        let Value::Object(m) = serde_json::from_str(json).unwrap() else {
            panic!("not an object")
        };
        PluginConfig::from_map(&m)
    }

    /// The config the linkerd2-cni Helm chart renders by default.
    const CHART: &str = r#"{
        "name": "linkerd-cni", "type": "linkerd-cni", "log_level": "info",
        "policy": {"type": "k8s", "k8s_api_root": "https://10.96.0.1:443", "k8s_auth_token": "x"},
        "kubernetes": {"kubeconfig": "/etc/cni/net.d/ZZZ-linkerd-cni-kubeconfig"},
        "linkerd": {
            "incoming-proxy-port": 4143, "outgoing-proxy-port": 4140, "proxy-uid": 2102,
            "ports-to-redirect": [], "inbound-ports-to-ignore": ["4191","4190"],
            "outbound-ports-to-ignore": [], "simulate": false, "use-wait-flag": false,
            "iptables-mode": "legacy", "ipv6": false
        }
    }"#;

    #[test]
    fn chart_default_config() {
        let c = parse(CHART).unwrap();
        assert_eq!(c.log_level, LevelFilter::Info);
        assert_eq!(
            c.kubeconfig.as_deref(),
            Some(std::path::Path::new(
                "/etc/cni/net.d/ZZZ-linkerd-cni-kubeconfig"
            ))
        );
        assert_eq!(c.proxy.inbound_ports_to_ignore, ["4191", "4190"]);
        assert_eq!(c.proxy.proxy_uid, 2102);
        assert_eq!(c.proxy.iptables_mode, IptablesMode::Legacy);
        assert_eq!(c.cni_conf_dir, PathBuf::from(DEFAULT_CONF_DIR));
        assert_eq!(c.state_dir, PathBuf::from(DEFAULT_STATE_DIR));
        assert_eq!(c.installer_gone_after, None);
        assert_eq!(c.exempt_namespaces, ["linkerd-cni", "kube-system"]);
        let c = parse(r#"{"installer_gone_after_seconds": 90}"#).unwrap();
        assert_eq!(c.installer_gone_after, Some(Duration::from_secs(90)));
    }

    #[test]
    fn a_state_dir_inside_the_conf_dir_is_not_used() {
        let c = parse(r#"{"state_dir": "/run/elsewhere"}"#).unwrap();
        assert_eq!(c.state_dir, PathBuf::from("/run/elsewhere"));
        for bad in [
            r#"{"state_dir": "/etc/cni/net.d/linkerd"}"#,
            r#"{"cni_conf_dir": "/host/net.d", "state_dir": "/host/net.d/s"}"#,
            r#"{"state_dir": "relative"}"#,
        ] {
            assert_eq!(
                parse(bad).unwrap().state_dir,
                PathBuf::from(DEFAULT_STATE_DIR),
                "{bad}"
            );
        }
        assert!(
            parse(r#"{"state_dir": 3}"#).is_err(),
            "a wrong type is a config error"
        );
    }

    #[test]
    fn nulls_read_as_absent_and_numbers_as_strings() {
        let c = parse(
            r#"{"linkerd":{"proxy-gid":"2103","inbound-ports-to-ignore":[4191,"4000-5000"],
                "ports-to-redirect":null,"iptables-mode":""}}"#,
        )
        .unwrap();
        assert_eq!(c.proxy.proxy_gid, 2103);
        assert_eq!(c.proxy.inbound_ports_to_ignore, ["4191", "4000-5000"]);
        assert!(c.proxy.ports_to_redirect.is_empty());
    }

    #[test]
    fn bad_values_name_the_key() {
        for (json, key) in [
            (r#"{"linkerd":{"proxy-uid":"abc"}}"#, "linkerd.proxy-uid"),
            (
                r#"{"linkerd":{"incoming-proxy-port":70000}}"#,
                "linkerd.incoming-proxy-port",
            ),
            (
                r#"{"linkerd":{"iptables-mode":"ebpf"}}"#,
                "linkerd.iptables-mode",
            ),
            (
                r#"{"linkerd":{"ports-to-redirect":[80,"x"]}}"#,
                "linkerd.ports-to-redirect",
            ),
            (r#"{"linkerd":[]}"#, "linkerd"),
            (
                r#"{"kubernetes":{"kubeconfig":5}}"#,
                "kubernetes.kubeconfig",
            ),
            (
                r#"{"chain_repair_budget_seconds":-1}"#,
                "chain_repair_budget_seconds",
            ),
            (r#"{"add_deadline_seconds":0}"#, "add_deadline_seconds"),
            (
                r#"{"installer_gone_after_seconds":"soon"}"#,
                "installer_gone_after_seconds",
            ),
            (r#"{"add_deadline_seconds":120}"#, "add_deadline_seconds"),
        ] {
            let e = parse(json).unwrap_err();
            assert_eq!(e.code, code::INVALID_CONFIG);
            assert!(e.msg.contains(&format!("{key:?}")), "{json}: {}", e.msg);
        }
    }

    #[test]
    fn proxy_ids_are_range_checked() {
        for v in ["4294967295", "99999999999", "-2", "\"4294967296\""] {
            for key in ["proxy-uid", "proxy-gid"] {
                let e = parse(&format!(r#"{{"linkerd":{{"{key}":{v}}}}}"#)).unwrap_err();
                assert_eq!(e.code, code::INVALID_CONFIG, "{key}={v}");
                assert!(e.msg.contains(&format!("linkerd.{key}")), "{}", e.msg);
                assert!(e.details.contains("-1 to 4294967294"), "{}", e.details);
            }
        }
        let c = parse(r#"{"linkerd":{"proxy-uid":4294967294,"proxy-gid":-1}}"#).unwrap();
        assert_eq!((c.proxy.proxy_uid, c.proxy.proxy_gid), (4294967294, -1));
    }

    mod fuzz {
        use super::*;
        use proptest::prelude::*;

        const KEYS: [&str; 20] = [
            "add_deadline_seconds",
            "log_level",
            "kubernetes",
            "kubeconfig",
            "api-budget-seconds",
            "linkerd",
            "incoming-proxy-port",
            "proxy-uid",
            "proxy-gid",
            "ports-to-redirect",
            "inbound-ports-to-ignore",
            "iptables-mode",
            "ipv6",
            "exempt-namespaces",
            "cni_conf_dir",
            "chain_heal",
            "chain_repair_budget_seconds",
            "chain_write_outside_conf_dir",
            "state_dir",
            "installer_gone_after_seconds",
        ];

        fn value() -> impl Strategy<Value = Value> {
            let leaf = prop_oneof![
                Just(Value::Null),
                any::<bool>().prop_map(Value::Bool),
                any::<i64>().prop_map(Value::from),
                any::<f64>().prop_map(Value::from),
                ".{0,8}".prop_map(Value::String),
            ];
            leaf.prop_recursive(3, 24, 4, |inner| {
                prop_oneof![
                    proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
                    proptest::collection::vec((proptest::sample::select(&KEYS[..]), inner), 0..5)
                        .prop_map(|kv| Value::Object(
                            kv.into_iter().map(|(k, v)| (k.to_string(), v)).collect()
                        )),
                ]
            })
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(3000))]
            /// Any JSON object: a config or an error that names a key.
            #[test]
            fn any_object_parses_or_names_the_key(
                kv in proptest::collection::vec((proptest::sample::select(&KEYS[..]), value()), 0..6)
            ) {
                let m: Map<String, Value> = kv.into_iter().map(|(k, v)| (k.to_string(), v)).collect();
                if let Err(e) = PluginConfig::from_map(&m) {
                    prop_assert_eq!(e.code, code::INVALID_CONFIG);
                    prop_assert!(e.msg.contains("config key"));
                }
            }
        }
    }
}
