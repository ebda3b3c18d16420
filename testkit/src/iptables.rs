//! Reading a namespace's nat table with the machine's own `*-save` tools,
//! for both backends (legacy and nft) and both families; picking out
//! linkerd's part of it; and the rules linkerd installs for the default
//! config, as upstream linkerd-cni installs them.

use std::fmt;

use crate::netns::TestNetns;

/// The rules of `iptables-save -t nat` for linkerd's defaults (inbound 4143,
/// outbound 4140, uid 2102, inbound ports 4191,4190 ignored), as upstream
/// linkerd-cni installs them (linkerd2-proxy-init's `iptables` package
/// builds the same chains and comments).
pub const DEFAULT_RULES: &str = "\
:PROXY_INIT_OUTPUT - [0:0]
:PROXY_INIT_REDIRECT - [0:0]
-A PREROUTING -m comment --comment \"proxy-init/install-proxy-init-prerouting\" -j PROXY_INIT_REDIRECT
-A OUTPUT -m comment --comment \"proxy-init/install-proxy-init-output\" -j PROXY_INIT_OUTPUT
-A PROXY_INIT_OUTPUT -m owner --uid-owner 2102 -m comment --comment \"proxy-init/ignore-proxy-user-id\" -j RETURN
-A PROXY_INIT_OUTPUT -o lo -m comment --comment \"proxy-init/ignore-loopback\" -j RETURN
-A PROXY_INIT_OUTPUT -p tcp -m comment --comment \"proxy-init/redirect-all-outgoing-to-proxy-port\" -j REDIRECT --to-ports 4140
-A PROXY_INIT_REDIRECT -p tcp -m multiport --dports 4191,4190 -m comment --comment \"proxy-init/ignore-port-4191,4190\" -j RETURN
-A PROXY_INIT_REDIRECT -p tcp -m comment --comment \"proxy-init/redirect-all-incoming-to-proxy-port\" -j REDIRECT --to-ports 4143
";

/// The line of [`DEFAULT_RULES`] commented `proxy-init/<comment>`, e.g.
/// `default_rule("ignore-loopback")`.
pub fn default_rule(comment: &str) -> &'static str {
    let tag = format!("\"proxy-init/{comment}\"");
    DEFAULT_RULES
        .lines()
        .find(|l| l.contains(&tag))
        .unwrap_or_else(|| panic!("no reference rule is commented proxy-init/{comment}"))
}

/// The full `iptables-save -t nat` text expected for the defaults on a
/// namespace that had no nat rules before, counters zeroed.
pub fn default_save() -> String {
    format!(
        "*nat\n:PREROUTING ACCEPT [0:0]\n:INPUT ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n:POSTROUTING ACCEPT [0:0]\n{DEFAULT_RULES}COMMIT\n"
    )
}

/// `iptables-save` output without its `#` comment lines (timestamps,
/// warnings) and with every `[packets:bytes]` counter set to `[0:0]`: what
/// "equal apart from counters" compares.
pub fn normalize_save(save: &str) -> String {
    let mut out = String::new();
    for line in save.lines() {
        if line.starts_with('#') || line.trim().is_empty() {
            continue;
        }
        let mut l = line.to_string();
        if let (Some(open), Some(close)) = (l.rfind(" ["), l.rfind(']'))
            && l.starts_with(':')
            && close == l.len() - 1
            && open < close
        {
            l.replace_range(open + 1.., "[0:0]");
        }
        out.push_str(&l);
        out.push('\n');
    }
    out
}

/// `<save_bin> -t nat` in `ns`, normalized (see [`normalize_save`]); e.g.
/// `save_bin` = `iptables-legacy-save`.
pub fn nat_table(ns: &TestNetns, save_bin: &str) -> String {
    normalize_save(&ns.exec_ok(&[save_bin, "-t", "nat"]))
}

/// Deletes one rule (`spec` as `iptables-save` prints it after `-A CHAIN`)
/// from `chain` in `ns`, with `bin` (e.g. `iptables-nft`): to simulate
/// another agent tampering with the rules.
pub fn delete_rule(ns: &TestNetns, bin: &str, chain: &str, spec: &str) {
    rule_command(ns, bin, "-D", chain, spec);
}

/// Whether `bin -t nat -C` finds the rule (`spec` as `iptables-save`
/// prints it) in `chain` of `ns`: iptables decoding the kernel's rules and
/// comparing them with its own reading of the text.
pub fn has_rule(ns: &TestNetns, bin: &str, chain: &str, spec: &str) -> bool {
    let words = shell_words(spec);
    let mut argv = vec![bin, "-t", "nat", "-C", chain];
    argv.extend(words.iter().map(String::as_str));
    ns.exec(&argv).status.success()
}

/// `bin -t nat <op> <chain> <spec>` in `ns`, which must succeed.
fn rule_command(ns: &TestNetns, bin: &str, op: &str, chain: &str, spec: &str) {
    let mut argv = vec![bin, "-t", "nat", op, chain];
    let words = shell_words(spec);
    argv.extend(words.iter().map(String::as_str));
    ns.exec_ok(&argv);
}

/// Splits iptables-save rule text into argv words (double quotes group).
fn shell_words(s: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut cur = String::new();
    let mut quoted = false;
    let mut any = false;
    for c in s.chars() {
        match c {
            '"' => {
                quoted = !quoted;
                any = true;
            }
            c if c.is_whitespace() && !quoted => {
                if any {
                    words.push(std::mem::take(&mut cur));
                    any = false;
                }
            }
            c => {
                cur.push(c);
                any = true;
            }
        }
    }
    if any {
        words.push(cur);
    }
    words
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Legacy,
    Nft,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    V4,
    V6,
}

impl Backend {
    pub const ALL: [Backend; 2] = [Backend::Legacy, Backend::Nft];

    /// The tool that changes rules: `iptables-legacy`, `ip6tables-nft`...
    pub fn tool(self, family: Family) -> &'static str {
        match (self, family) {
            (Backend::Legacy, Family::V4) => "iptables-legacy",
            (Backend::Legacy, Family::V6) => "ip6tables-legacy",
            (Backend::Nft, Family::V4) => "iptables-nft",
            (Backend::Nft, Family::V6) => "ip6tables-nft",
        }
    }

    /// linkerd-cni's `iptables-mode` for this backend.
    pub fn mode(self) -> &'static str {
        match self {
            Backend::Legacy => "legacy",
            Backend::Nft => "nft",
        }
    }

    pub fn save_tool(self, family: Family) -> &'static str {
        match (self, family) {
            (Backend::Legacy, Family::V4) => "iptables-legacy-save",
            (Backend::Legacy, Family::V6) => "ip6tables-legacy-save",
            (Backend::Nft, Family::V4) => "iptables-nft-save",
            (Backend::Nft, Family::V6) => "ip6tables-nft-save",
        }
    }
}

impl Family {
    pub const ALL: [Family; 2] = [Family::V4, Family::V6];
}

/// One `*-save -t nat` dump.
#[derive(Debug, Clone)]
pub struct NatTable {
    pub backend: Backend,
    pub family: Family,
    /// The raw dump.
    pub text: String,
}

impl NatTable {
    /// `*-save -t nat` of `backend` and `family` in `netns`.
    pub fn read(netns: &TestNetns, backend: Backend, family: Family) -> NatTable {
        let text = netns.exec_ok(&[backend.save_tool(family), "-t", "nat"]);
        NatTable {
            backend,
            family,
            text,
        }
    }

    /// Every backend and family, for "no rules" checks.
    pub fn read_all(netns: &TestNetns) -> Vec<NatTable> {
        Backend::ALL
            .iter()
            .flat_map(|b| {
                Family::ALL
                    .iter()
                    .map(move |f| NatTable::read(netns, *b, *f))
            })
            .collect()
    }

    /// The `-A` lines.
    pub fn rules(&self) -> Vec<&str> {
        self.text.lines().filter(|l| l.starts_with("-A ")).collect()
    }

    /// The chain declarations (`:NAME POLICY [p:b]`), by name.
    pub fn chains(&self) -> Vec<&str> {
        self.text
            .lines()
            .filter_map(|l| l.strip_prefix(':'))
            .filter_map(|l| l.split_whitespace().next())
            .collect()
    }

    /// linkerd's lines, counters zeroed: the `PROXY_INIT_*` chain
    /// declarations and every rule that jumps to, lives in, or is commented
    /// as proxy-init. Comparable line for line with [`DEFAULT_RULES`].
    pub fn linkerd_lines(&self) -> Vec<String> {
        self.text
            .lines()
            .filter(|l| {
                l.starts_with(":PROXY_INIT_")
                    || (l.starts_with("-A ")
                        && (l.contains("PROXY_INIT_") || l.contains("proxy-init/")))
            })
            .map(|l| match l.split_once(" [") {
                Some((decl, _)) if l.starts_with(':') => format!("{decl} [0:0]"),
                _ => l.to_string(),
            })
            .collect()
    }
}

impl fmt::Display for NatTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "{:?}/{:?} nat table:", self.backend, self.family)?;
        f.write_str(&self.text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalize_drops_comments_and_counters() {
        let s = "# Generated by x\n*nat\n:PREROUTING ACCEPT [12:720]\n:X - [0:0]\n-A X -j RETURN\nCOMMIT\n# Completed\n";
        assert_eq!(
            normalize_save(s),
            "*nat\n:PREROUTING ACCEPT [0:0]\n:X - [0:0]\n-A X -j RETURN\nCOMMIT\n"
        );
    }

    /// A dump as iptables-legacy-save prints it for a meshed pod, with a
    /// foreign rule and counters.
    fn dump() -> NatTable {
        let text = default_save()
            .replace(":PREROUTING ACCEPT [0:0]", ":PREROUTING ACCEPT [3:180]")
            .replace(
                ":PROXY_INIT_OUTPUT - [0:0]",
                ":PROXY_INIT_OUTPUT - [7:420]\n:OTHER - [0:0]",
            )
            .replace("COMMIT", "-A OUTPUT -j OTHER\nCOMMIT");
        NatTable {
            backend: Backend::Legacy,
            family: Family::V4,
            text: format!("# Generated by iptables-save\n{text}# Completed\n"),
        }
    }

    #[test]
    fn picks_linkerd_lines_with_zeroed_counters() {
        let want: Vec<&str> = DEFAULT_RULES.lines().collect();
        assert_eq!(dump().linkerd_lines(), want);
    }

    #[test]
    fn rules_and_chains() {
        let t = dump();
        assert_eq!(t.rules().len(), 8);
        assert_eq!(
            t.chains(),
            [
                "PREROUTING",
                "INPUT",
                "OUTPUT",
                "POSTROUTING",
                "PROXY_INIT_OUTPUT",
                "OTHER",
                "PROXY_INIT_REDIRECT",
            ]
        );
        let empty = NatTable {
            text: "*nat\n:PREROUTING ACCEPT [0:0]\nCOMMIT\n".into(),
            ..t
        };
        assert!(empty.rules().is_empty() && empty.linkerd_lines().is_empty());
    }

    #[test]
    fn words_respect_quotes() {
        assert_eq!(
            shell_words("-o lo -m comment --comment \"proxy-init/a b\" -j RETURN"),
            [
                "-o",
                "lo",
                "-m",
                "comment",
                "--comment",
                "proxy-init/a b",
                "-j",
                "RETURN"
            ]
        );
    }
}
