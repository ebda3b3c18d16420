//! The rule model: what linkerd's redirect rules are, as data, and how each
//! one reads in `iptables-save` form.
//!
//! Chain names, matches, rule order and comments follow upstream
//! proxy-init exactly, so `linkerd` tooling and docs that grep for them keep
//! working. Every rule is rendered in the canonical form `iptables-save`
//! prints, so the same text serves as `iptables-restore` input and as the
//! expectation CHECK compares the live table with.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use thiserror::Error;

/// Inbound chain, jumped to from PREROUTING.
pub const REDIRECT_CHAIN: &str = "PROXY_INIT_REDIRECT";
/// Outbound chain, jumped to from OUTPUT.
pub const OUTPUT_CHAIN: &str = "PROXY_INIT_OUTPUT";

/// iptables' multiport match takes at most 15 ports; a range counts as 2.
const MULTIPORT_UNITS: usize = 15;

/// The largest uid or gid iptables' owner match accepts (`(uid_t)-1`
/// means "none" to the kernel).
pub const MAX_OWNER_ID: i64 = u32::MAX as i64 - 1;
/// The smallest accepted: -1 (like 0) means "no rule", as upstream reads it.
pub const MIN_OWNER_ID: i64 = -1;

/// Most entries one port or subnet list may have (a config key or an
/// annotation). Each subnet is a rule per family, every 15 ports one; real
/// lists have a few dozen entries, and a bigger one makes every retry of a
/// pod start ship a huge batch to iptables and CHECK compare it.
pub const MAX_LIST_ITEMS: usize = 256;
/// Longest list text parsed (an annotation value can be 256 KiB).
pub const MAX_LIST_TEXT: usize = 16 << 10;

/// An address family, and with it the iptables flavour that programs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Family {
    V4,
    V6,
}

impl Family {
    /// `iptables` or `ip6tables`: the stem of the family's binaries.
    pub fn stem(self) -> &'static str {
        match self {
            Family::V4 => "iptables",
            Family::V6 => "ip6tables",
        }
    }
}

impl fmt::Display for Family {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Family::V4 => "IPv4",
            Family::V6 => "IPv6",
        })
    }
}

/// A value that cannot become a rule: a port or a CIDR.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ParseError {
    #[error("{0:?} is not a port (0-65535) or a port range (a-b with a <= b)")]
    Port(String),
    #[error("{0:?} is not an IPv4 or IPv6 address or CIDR")]
    Cidr(String),
    #[error("the list has {got} entries; at most {MAX_LIST_ITEMS} are accepted")]
    TooMany { got: usize },
    #[error("the list is {got} bytes long; at most {MAX_LIST_TEXT} are accepted")]
    TooLong { got: usize },
}

/// Errs when a list of `count` entries is over the cap.
pub fn check_list_size(count: usize) -> Result<(), ParseError> {
    if count > MAX_LIST_ITEMS {
        return Err(ParseError::TooMany { got: count });
    }
    Ok(())
}

/// The non-empty items of a comma-separated list, after the size checks.
fn list_items(s: &str) -> Result<Vec<&str>, ParseError> {
    if s.len() > MAX_LIST_TEXT {
        return Err(ParseError::TooLong { got: s.len() });
    }
    let items: Vec<&str> = s.split(',').filter(|p| !p.trim().is_empty()).collect();
    check_list_size(items.len())?;
    Ok(items)
}

/// A port or an inclusive port range, as in `4190` or `1000-2000`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PortRange {
    pub low: u16,
    pub high: u16,
}

impl From<u16> for PortRange {
    /// The one port `p`.
    fn from(p: u16) -> PortRange {
        PortRange { low: p, high: p }
    }
}

impl PortRange {
    /// Parses `p` or `a-b` (surrounding whitespace ignored), as upstream's
    /// `ParsePortRange` does.
    pub fn parse(s: &str) -> Result<PortRange, ParseError> {
        let t = s.trim();
        let bad = || ParseError::Port(s.to_string());
        let num = |p: &str| crate::decimal::<u16>(p).ok_or_else(bad);
        let (low, high) = match t.split_once('-') {
            Some((a, b)) => (num(a)?, num(b)?),
            None => return num(t).map(PortRange::from),
        };
        if low > high {
            return Err(bad());
        }
        Ok(PortRange { low, high })
    }

    /// Multiport units this entry uses.
    fn units(self) -> usize {
        if self.low == self.high { 1 } else { 2 }
    }
}

impl fmt::Display for PortRange {
    /// iptables' form: `p` or `a:b`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.low == self.high {
            write!(f, "{}", self.low)
        } else {
            write!(f, "{}:{}", self.low, self.high)
        }
    }
}

/// Parses a comma-separated list of ports and ranges, skipping empty items
/// (as in `"4190,"`).
pub fn parse_port_list(s: &str) -> Result<Vec<PortRange>, ParseError> {
    list_items(s)?.into_iter().map(PortRange::parse).collect()
}

/// A subnet whose traffic skips the proxy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Subnet {
    /// The network address (host bits cleared, as iptables stores it).
    pub network: IpAddr,
    pub prefix: u8,
    /// The text given, which upstream puts in the rule's comment.
    pub given: String,
}

impl Subnet {
    /// Parses `addr/len` or a bare address (a host route).
    pub fn parse(s: &str) -> Result<Subnet, ParseError> {
        let t = s.trim();
        let bad = || ParseError::Cidr(s.to_string());
        let (addr, len) = match t.split_once('/') {
            Some((a, l)) => (a, Some(l)),
            None => (t, None),
        };
        let addr: IpAddr = addr.parse().map_err(|_| bad())?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = match len {
            None => max,
            Some(l) => crate::decimal::<u8>(l)
                .filter(|p| *p <= max)
                .ok_or_else(bad)?,
        };
        let network = match addr {
            IpAddr::V4(a) => {
                let mask = u32::MAX.checked_shl(32 - u32::from(prefix)).unwrap_or(0);
                IpAddr::V4(Ipv4Addr::from(u32::from(a) & mask))
            }
            IpAddr::V6(a) => {
                let mask = u128::MAX.checked_shl(128 - u32::from(prefix)).unwrap_or(0);
                IpAddr::V6(Ipv6Addr::from(u128::from(a) & mask))
            }
        };
        Ok(Subnet {
            network,
            prefix,
            given: t.to_string(),
        })
    }

    pub fn family(&self) -> Family {
        if self.network.is_ipv4() {
            Family::V4
        } else {
            Family::V6
        }
    }
}

/// Parses a comma-separated list of CIDRs, skipping empty items.
pub fn parse_subnet_list(s: &str) -> Result<Vec<Subnet>, ParseError> {
    list_items(s)?.into_iter().map(Subnet::parse).collect()
}

/// Everything the rules depend on: the config keys after the pod's and
/// namespace's annotations have been applied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RedirectSpec {
    pub incoming_proxy_port: u16,
    pub outgoing_proxy_port: u16,
    /// No rule when <= 0.
    pub proxy_uid: i64,
    /// No rule when <= 0.
    pub proxy_gid: i64,
    /// Inbound ports to redirect; empty means all.
    pub ports_to_redirect: Vec<u16>,
    pub inbound_ports_to_ignore: Vec<PortRange>,
    pub outbound_ports_to_ignore: Vec<PortRange>,
    /// Both families; each rule set takes its own.
    pub subnets_to_ignore: Vec<Subnet>,
}

impl Default for RedirectSpec {
    /// The chart's defaults.
    fn default() -> Self {
        RedirectSpec {
            incoming_proxy_port: 4143,
            outgoing_proxy_port: 4140,
            proxy_uid: 2102,
            proxy_gid: -1,
            ports_to_redirect: vec![],
            inbound_ports_to_ignore: vec![PortRange::from(4191), PortRange::from(4190)],
            outbound_ports_to_ignore: vec![],
            subnets_to_ignore: vec![],
        }
    }
}

/// One rule of linkerd's chains.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Rule {
    /// RETURN for TCP to these destination ports (one multiport chunk).
    IgnorePorts(Vec<PortRange>),
    /// RETURN for traffic from this source subnet.
    IgnoreSubnet(Subnet),
    /// Redirect TCP to one destination port to the inbound proxy port.
    RedirectPort { port: u16, to: u16 },
    /// Redirect all inbound TCP to the inbound proxy port.
    RedirectAllIncoming { to: u16 },
    /// RETURN for the proxy's own traffic, by uid.
    IgnoreUid(i64),
    /// RETURN for the proxy's own traffic, by gid.
    IgnoreGid(i64),
    /// RETURN for traffic leaving through `lo`.
    IgnoreLoopback,
    /// Redirect all outbound TCP to the outbound proxy port.
    RedirectAllOutgoing { to: u16 },
}

/// The `--comment` text, with upstream's `proxy-init/` prefix.
fn comment(c: impl fmt::Display) -> String {
    format!("-m comment --comment \"proxy-init/{c}\"")
}

impl Rule {
    /// The rule's comment, after upstream's `proxy-init/` prefix.
    pub fn comment(&self) -> String {
        match self {
            Rule::IgnorePorts(ports) => format!("ignore-port-{}", port_list(ports)),
            Rule::IgnoreSubnet(s) => format!("ignore-subnet-{}", s.given),
            Rule::RedirectPort { port, .. } => format!("redirect-port-{port}-to-proxy-port"),
            Rule::RedirectAllIncoming { .. } => "redirect-all-incoming-to-proxy-port".into(),
            Rule::IgnoreUid(_) => "ignore-proxy-user-id".into(),
            Rule::IgnoreGid(_) => "ignore-proxy-group-id".into(),
            Rule::IgnoreLoopback => "ignore-loopback".into(),
            Rule::RedirectAllOutgoing { .. } => "redirect-all-outgoing-to-proxy-port".into(),
        }
    }

    /// The rule as `iptables-save` prints it, after `-A <chain> `.
    pub fn spec(&self) -> String {
        let c = comment(self.comment());
        match self {
            Rule::IgnorePorts(ports) => format!(
                "-p tcp -m multiport --dports {} {c} -j RETURN",
                port_list(ports)
            ),
            // iptables drops a match-everything source: `-s 0.0.0.0/0`
            // reads back as no `-s` at all.
            Rule::IgnoreSubnet(s) if s.prefix == 0 => format!("{c} -j RETURN"),
            Rule::IgnoreSubnet(s) => format!("-s {}/{} {c} -j RETURN", s.network, s.prefix),
            Rule::RedirectPort { port, to } => {
                format!("-p tcp -m tcp --dport {port} {c} -j REDIRECT --to-ports {to}")
            }
            Rule::RedirectAllIncoming { to } | Rule::RedirectAllOutgoing { to } => {
                format!("-p tcp {c} -j REDIRECT --to-ports {to}")
            }
            Rule::IgnoreUid(uid) => format!("-m owner --uid-owner {uid} {c} -j RETURN"),
            Rule::IgnoreGid(gid) => format!("-m owner --gid-owner {gid} {c} -j RETURN"),
            Rule::IgnoreLoopback => format!("-o lo {c} -j RETURN"),
        }
    }
}

/// Ports as multiport lists them: `a,b:c`.
fn port_list(ports: &[PortRange]) -> String {
    ports
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

/// A jump from a built-in chain into one of ours.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Jump {
    pub from: &'static str,
    pub to: &'static str,
    /// The jump's comment, after upstream's `proxy-init/` prefix.
    pub comment: &'static str,
}

impl Jump {
    pub fn spec(&self) -> String {
        format!("{} -j {}", comment(self.comment), self.to)
    }
}

/// PREROUTING -> PROXY_INIT_REDIRECT.
pub const PREROUTING_JUMP: Jump = Jump {
    from: "PREROUTING",
    to: REDIRECT_CHAIN,
    comment: "install-proxy-init-prerouting",
};

/// OUTPUT -> PROXY_INIT_OUTPUT.
pub const OUTPUT_JUMP: Jump = Jump {
    from: "OUTPUT",
    to: OUTPUT_CHAIN,
    comment: "install-proxy-init-output",
};

/// The jumps into our chains, the same in both families.
pub const JUMPS: [Jump; 2] = [PREROUTING_JUMP, OUTPUT_JUMP];

/// The rules of one address family, in chain order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuleSet {
    pub family: Family,
    /// PROXY_INIT_REDIRECT.
    pub redirect: Vec<Rule>,
    /// PROXY_INIT_OUTPUT.
    pub output: Vec<Rule>,
}

impl RuleSet {
    /// The rules upstream proxy-init would install for `spec`, keeping only
    /// the subnets of `family` (upstream fed IPv4 CIDRs to ip6tables too, and
    /// the ADD failed).
    pub fn build(spec: &RedirectSpec, family: Family) -> RuleSet {
        let mut redirect: Vec<Rule> = multiport_chunks(&spec.inbound_ports_to_ignore)
            .into_iter()
            .map(Rule::IgnorePorts)
            .collect();
        redirect.extend(
            spec.subnets_to_ignore
                .iter()
                .filter(|s| s.family() == family)
                .cloned()
                .map(Rule::IgnoreSubnet),
        );
        let to = spec.incoming_proxy_port;
        if spec.ports_to_redirect.is_empty() {
            redirect.push(Rule::RedirectAllIncoming { to });
        } else {
            redirect.extend(
                spec.ports_to_redirect
                    .iter()
                    .map(|&port| Rule::RedirectPort { port, to }),
            );
        }

        let mut output = Vec::new();
        if spec.proxy_uid > 0 {
            output.push(Rule::IgnoreUid(spec.proxy_uid));
        }
        if spec.proxy_gid > 0 {
            output.push(Rule::IgnoreGid(spec.proxy_gid));
        }
        output.push(Rule::IgnoreLoopback);
        output.extend(
            multiport_chunks(&spec.outbound_ports_to_ignore)
                .into_iter()
                .map(Rule::IgnorePorts),
        );
        output.push(Rule::RedirectAllOutgoing {
            to: spec.outgoing_proxy_port,
        });

        RuleSet {
            family,
            redirect,
            output,
        }
    }

    /// Our chains and their rule specs, in order.
    pub fn chains(&self) -> [(&'static str, Vec<String>); 2] {
        [
            (
                REDIRECT_CHAIN,
                self.redirect.iter().map(Rule::spec).collect(),
            ),
            (OUTPUT_CHAIN, self.output.iter().map(Rule::spec).collect()),
        ]
    }
}

/// Splits ports into multiport rules of at most 15 units, in order, as
/// upstream does (a range counts 2).
pub fn multiport_chunks(ports: &[PortRange]) -> Vec<Vec<PortRange>> {
    let mut chunks = Vec::new();
    let mut current: Vec<PortRange> = Vec::new();
    let mut units = 0;
    for &p in ports {
        if units + p.units() > MULTIPORT_UNITS {
            chunks.push(std::mem::take(&mut current));
            units = 0;
        }
        current.push(p);
        units += p.units();
    }
    if !current.is_empty() {
        chunks.push(current);
    }
    chunks
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ports(s: &str) -> Vec<PortRange> {
        parse_port_list(s).unwrap()
    }

    fn subnets(s: &str) -> Vec<Subnet> {
        parse_subnet_list(s).unwrap()
    }

    /// Our chains as iptables-save lists them (sorted by name: OUTPUT first).
    fn render(set: &RuleSet) -> String {
        let mut out = String::new();
        let [(rc, r), (oc, o)] = set.chains();
        for (chain, rules) in [(oc, o), (rc, r)] {
            for spec in rules {
                out.push_str(&format!("-A {chain} {spec}\n"));
            }
        }
        out
    }

    #[test]
    fn defaults_match_upstream() {
        let set = RuleSet::build(&RedirectSpec::default(), Family::V4);
        // testkit's reference rules: the chains' rules, then the jumps.
        let reference = testkit::iptables::DEFAULT_RULES;
        let chain_rules: String = reference
            .lines()
            .filter(|l| l.starts_with("-A PROXY_INIT_"))
            .map(|l| format!("{l}\n"))
            .collect();
        assert_eq!(render(&set), chain_rules);
        let jump = |comment: &str, chain: &str| {
            let line = testkit::iptables::default_rule(comment);
            line.strip_prefix(&format!("-A {chain} ")).unwrap_or(line)
        };
        assert_eq!(
            PREROUTING_JUMP.spec(),
            jump("install-proxy-init-prerouting", "PREROUTING")
        );
        assert_eq!(
            OUTPUT_JUMP.spec(),
            jump("install-proxy-init-output", "OUTPUT")
        );
    }

    #[test]
    fn gid_follows_uid_and_nonpositive_ids_add_nothing() {
        let spec = RedirectSpec {
            proxy_gid: 2103,
            ..RedirectSpec::default()
        };
        let set = RuleSet::build(&spec, Family::V4);
        assert_eq!(
            set.output[..2],
            [Rule::IgnoreUid(2102), Rule::IgnoreGid(2103)]
        );
        assert_eq!(
            set.output[1].spec(),
            "-m owner --gid-owner 2103 -m comment --comment \"proxy-init/ignore-proxy-group-id\" -j RETURN"
        );

        let spec = RedirectSpec {
            proxy_uid: 0,
            proxy_gid: -1,
            ..RedirectSpec::default()
        };
        let set = RuleSet::build(&spec, Family::V4);
        assert_eq!(set.output[0], Rule::IgnoreLoopback);
    }

    #[test]
    fn outbound_ignores_come_after_loopback() {
        let spec = RedirectSpec {
            outbound_ports_to_ignore: ports("25,587"),
            ..RedirectSpec::default()
        };
        let set = RuleSet::build(&spec, Family::V4);
        assert_eq!(set.output.len(), 4);
        assert_eq!(set.output[1], Rule::IgnoreLoopback);
        assert_eq!(
            set.output[2].spec(),
            "-p tcp -m multiport --dports 25,587 -m comment --comment \"proxy-init/ignore-port-25,587\" -j RETURN"
        );
        assert!(matches!(
            set.output[3],
            Rule::RedirectAllOutgoing { to: 4140 }
        ));
    }

    #[test]
    fn ranges_are_written_with_a_colon() {
        let spec = RedirectSpec {
            inbound_ports_to_ignore: ports("4190, 8000-8100 ,9000-9000"),
            ..RedirectSpec::default()
        };
        let set = RuleSet::build(&spec, Family::V4);
        assert_eq!(
            set.redirect[0].spec(),
            "-p tcp -m multiport --dports 4190,8000:8100,9000 -m comment --comment \"proxy-init/ignore-port-4190,8000:8100,9000\" -j RETURN"
        );
    }

    #[test]
    fn more_than_15_units_are_chunked() {
        // 14 single ports, then a range (2 units) that no longer fits.
        let list: Vec<String> = (1..=14).map(|p| p.to_string()).collect();
        let spec = RedirectSpec {
            outbound_ports_to_ignore: ports(&format!("{},100-200,300", list.join(","))),
            ..RedirectSpec::default()
        };
        let chunks = multiport_chunks(&spec.outbound_ports_to_ignore);
        assert_eq!(chunks.len(), 2);
        assert_eq!(chunks[0].len(), 14);
        assert_eq!(
            chunks[1],
            [
                PortRange {
                    low: 100,
                    high: 200
                },
                PortRange {
                    low: 300,
                    high: 300
                }
            ]
        );
        let set = RuleSet::build(&spec, Family::V4);
        let specs: Vec<String> = set.output.iter().map(Rule::spec).collect();
        assert!(specs[2].contains("--dports 1,2,3,4,5,6,7,8,9,10,11,12,13,14 "));
        assert!(specs[3].contains("--dports 100:200,300 "));
        assert!(specs[3].contains("ignore-port-100:200,300\""));

        // Exactly 15 units fit one rule; the 16th starts another.
        let fifteen: Vec<PortRange> = (1..=15).map(|p| PortRange { low: p, high: p }).collect();
        assert_eq!(multiport_chunks(&fifteen).len(), 1);
        let mut sixteen = fifteen.clone();
        sixteen.push(PortRange { low: 16, high: 16 });
        assert_eq!(
            multiport_chunks(&sixteen)
                .iter()
                .map(Vec::len)
                .collect::<Vec<_>>(),
            [15, 1]
        );
        // Eight ranges: 7 fit (14 units), the 8th does not.
        let ranges: Vec<PortRange> = (0..8)
            .map(|i| PortRange {
                low: 1000 + i * 10,
                high: 1005 + i * 10,
            })
            .collect();
        assert_eq!(
            multiport_chunks(&ranges)
                .iter()
                .map(Vec::len)
                .collect::<Vec<_>>(),
            [7, 1]
        );
        assert!(multiport_chunks(&[]).is_empty());
    }

    #[test]
    fn ignored_subnets_follow_ignored_ports() {
        let spec = RedirectSpec {
            subnets_to_ignore: subnets("10.0.0.1/8,192.168.1.7"),
            ..RedirectSpec::default()
        };
        let set = RuleSet::build(&spec, Family::V4);
        let specs: Vec<String> = set.redirect.iter().map(Rule::spec).collect();
        assert_eq!(specs.len(), 4);
        assert!(specs[0].contains("--dports 4191,4190"));
        // The match is the network iptables stores; the comment keeps the text given.
        assert_eq!(
            specs[1],
            "-s 10.0.0.0/8 -m comment --comment \"proxy-init/ignore-subnet-10.0.0.1/8\" -j RETURN"
        );
        assert_eq!(
            specs[2],
            "-s 192.168.1.7/32 -m comment --comment \"proxy-init/ignore-subnet-192.168.1.7\" -j RETURN"
        );
        assert!(matches!(
            set.redirect[3],
            Rule::RedirectAllIncoming { to: 4143 }
        ));
    }

    #[test]
    fn a_zero_prefix_has_no_source_match() {
        let spec = RedirectSpec {
            subnets_to_ignore: subnets("0.0.0.0/0,::/0"),
            ..RedirectSpec::default()
        };
        for family in [Family::V4, Family::V6] {
            let set = RuleSet::build(&spec, family);
            assert_eq!(
                set.redirect[1].spec(),
                format!(
                    "-m comment --comment \"proxy-init/ignore-subnet-{}\" -j RETURN",
                    if family == Family::V4 {
                        "0.0.0.0/0"
                    } else {
                        "::/0"
                    }
                )
            );
        }
    }

    #[test]
    fn listed_ports_replace_redirect_all() {
        let spec = RedirectSpec {
            ports_to_redirect: vec![8080, 9090],
            ..RedirectSpec::default()
        };
        let set = RuleSet::build(&spec, Family::V4);
        let specs: Vec<String> = set.redirect.iter().map(Rule::spec).collect();
        assert_eq!(
            specs[1..],
            [
                "-p tcp -m tcp --dport 8080 -m comment --comment \"proxy-init/redirect-port-8080-to-proxy-port\" -j REDIRECT --to-ports 4143",
                "-p tcp -m tcp --dport 9090 -m comment --comment \"proxy-init/redirect-port-9090-to-proxy-port\" -j REDIRECT --to-ports 4143",
            ]
        );
        assert!(
            !set.redirect
                .iter()
                .any(|r| matches!(r, Rule::RedirectAllIncoming { .. }))
        );
    }

    #[test]
    fn control_plane_ports_extend_outbound_ignores() {
        // What the pod module appends for a control-plane pod: the API
        // server's port and targetPort, after the configured ones.
        let mut spec = RedirectSpec {
            outbound_ports_to_ignore: ports("4567"),
            ..RedirectSpec::default()
        };
        spec.outbound_ports_to_ignore.extend(ports("443,6443"));
        let set = RuleSet::build(&spec, Family::V4);
        assert_eq!(
            set.output[2].spec(),
            "-p tcp -m multiport --dports 4567,443,6443 -m comment --comment \"proxy-init/ignore-port-4567,443,6443\" -j RETURN"
        );
    }

    #[test]
    fn each_family_gets_only_its_own_cidrs() {
        let spec = RedirectSpec {
            subnets_to_ignore: subnets("10.0.0.0/8,fd00:10::/64,2001:DB8:0:0:1::1,172.16.0.0/12"),
            ..RedirectSpec::default()
        };
        let v4 = RuleSet::build(&spec, Family::V4);
        let v6 = RuleSet::build(&spec, Family::V6);
        let cidrs = |s: &RuleSet| -> Vec<String> {
            s.redirect
                .iter()
                .filter_map(|r| match r {
                    Rule::IgnoreSubnet(s) => Some(format!("{}/{}", s.network, s.prefix)),
                    _ => None,
                })
                .collect()
        };
        assert_eq!(cidrs(&v4), ["10.0.0.0/8", "172.16.0.0/12"]);
        assert_eq!(cidrs(&v6), ["fd00:10::/64", "2001:db8::1:0:0:1/128"]);
        // Everything else is the same in both families.
        assert_eq!(v4.output, v6.output);
        assert_eq!(v4.redirect.len(), v6.redirect.len());
    }

    #[test]
    fn parsing_ports() {
        assert_eq!(
            PortRange::parse(" 80 ").unwrap(),
            PortRange { low: 80, high: 80 }
        );
        assert_eq!(
            PortRange::parse("1-65535").unwrap(),
            PortRange {
                low: 1,
                high: 65535
            }
        );
        for bad in [
            "", "x", "65536", "-1", "+80", "9-8", "1-2-3", "1 - 2", "80/tcp",
        ] {
            assert!(PortRange::parse(bad).is_err(), "{bad:?}");
        }
        assert_eq!(parse_port_list("25,,587, ").unwrap().len(), 2);
        assert_eq!(
            parse_port_list("25,x").unwrap_err(),
            ParseError::Port("x".into())
        );
    }

    #[test]
    fn parsing_subnets() {
        let s = Subnet::parse("10.1.2.3/16").unwrap();
        assert_eq!(s.network.to_string(), "10.1.0.0");
        assert_eq!(s.prefix, 16);
        assert_eq!(Subnet::parse("0.0.0.0/0").unwrap().prefix, 0);
        assert_eq!(Subnet::parse("::/0").unwrap().family(), Family::V6);
        for bad in [
            "10.0.0.0/33",
            "10.0.0/8",
            "fd00::/129",
            "10.0.0.0/",
            "10.0.0.0/+8",
            "x",
            "",
        ] {
            assert!(Subnet::parse(bad).is_err(), "{bad:?}");
        }
    }
}
