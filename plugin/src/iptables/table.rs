//! The live nat table as `*-save -t nat` prints it, and the two things we do
//! with it: compute the `*-restore --noflush` batch that brings it to a rule
//! set, and list how it differs from one (for CHECK).
//!
//! With `--noflush`, declaring a user chain that exists flushes it, so our
//! chains are emptied and refilled in one atomic batch: no window without
//! redirection, and a second ADD converges on the same rules. The jumps live
//! in built-in chains we must not flush, so they are added only when absent.

use std::collections::{BTreeMap, HashSet};

use super::rules::{JUMPS, RuleSet};

/// The most differences listed (the rest are counted): the list goes into
/// a CNI error, and a table can hold any number of foreign rules.
pub const MAX_DIFFERENCES: usize = 20;

/// The nat table of one family, as read from `*-save -t nat`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NatTable {
    /// Declared chains, in the order printed.
    chains: Vec<String>,
    /// Rule specs (the text after `-A <chain> `) per chain, in order.
    rules: BTreeMap<String, Vec<String>>,
}

impl NatTable {
    /// Reads the `*nat` section of `iptables-save` output. Comments, other
    /// tables and packet counters are ignored.
    pub fn parse(save: &str) -> NatTable {
        let mut t = NatTable::default();
        let mut in_nat = false;
        for line in save.lines() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            if let Some(table) = line.strip_prefix('*') {
                in_nat = table == "nat";
                continue;
            }
            if !in_nat {
                continue;
            }
            if line == "COMMIT" {
                in_nat = false;
            } else if let Some(decl) = line.strip_prefix(':') {
                if let Some(name) = decl.split_whitespace().next() {
                    t.add_chain(name);
                }
            } else {
                // `iptables-save -c` prefixes `[pkts:bytes] `.
                let rule = match line.strip_prefix('[') {
                    Some(rest) => rest.split_once("] ").map_or(line, |(_, r)| r.trim_start()),
                    None => line,
                };
                if let Some(rest) = rule.strip_prefix("-A ")
                    && let Some((chain, spec)) = rest.split_once(' ')
                {
                    t.add_rule(chain, spec.trim().to_string());
                }
            }
        }
        t
    }

    /// Declares `chain` (a view of a table read otherwise than from `*-save`).
    pub fn add_chain(&mut self, chain: &str) {
        self.chains.push(chain.to_string());
    }

    /// Appends `spec` to `chain`'s rules.
    pub fn add_rule(&mut self, chain: &str, spec: String) {
        self.rules.entry(chain.to_string()).or_default().push(spec);
    }

    pub fn has_chain(&self, chain: &str) -> bool {
        self.chains.iter().any(|c| c == chain)
    }

    /// The rule specs of `chain`, in order (empty if it has none).
    pub fn rules(&self, chain: &str) -> &[String] {
        self.rules.get(chain).map_or(&[], Vec::as_slice)
    }
}

/// The `iptables-restore --noflush` input that makes `current` hold exactly
/// `set`'s chains and jumps.
pub fn restore_batch(set: &RuleSet, current: &NatTable) -> String {
    let mut b = String::from("*nat\n");
    let chains = set.chains();
    for (chain, _) in &chains {
        b.push_str(&format!(":{chain} - [0:0]\n"));
    }
    for (chain, specs) in &chains {
        for spec in specs {
            b.push_str(&format!("-A {chain} {spec}\n"));
        }
    }
    for jump in JUMPS {
        let spec = jump.spec();
        if !current.rules(jump.from).contains(&spec) {
            b.push_str(&format!("-A {} {spec}\n", jump.from));
        }
    }
    b.push_str("COMMIT\n");
    b
}

/// How `current` differs from what `set` installs, one line per problem;
/// empty when it matches.
pub fn differences(set: &RuleSet, current: &NatTable) -> Vec<String> {
    let mut diffs = Vec::new();
    let fam = set.family;
    for (chain, want) in set.chains() {
        if !current.has_chain(chain) {
            diffs.push(format!("{fam} chain {chain} is missing"));
            continue;
        }
        let have = current.rules(chain);
        if have == want.as_slice() {
            continue;
        }
        let before = diffs.len();
        // Sets: a live chain can hold any number of rules.
        let have_set: HashSet<&str> = have.iter().map(String::as_str).collect();
        let want_set: HashSet<&str> = want.iter().map(String::as_str).collect();
        for spec in &want {
            if !have_set.contains(spec.as_str()) {
                diffs.push(format!("{fam} chain {chain} lacks rule: {spec}"));
            }
        }
        for spec in have {
            if !want_set.contains(spec.as_str()) {
                diffs.push(format!(
                    "{fam} chain {chain} has an unexpected rule: {spec}"
                ));
            }
        }
        if diffs.len() == before {
            diffs.push(format!(
                "{fam} chain {chain} has its rules in a different order or repeated ({} rules, {} wanted): have [{}], want [{}]",
                have.len(),
                want.len(),
                have.iter().take(MAX_DIFFERENCES).cloned().collect::<Vec<_>>().join(" | "),
                want.join(" | ")
            ));
        }
    }
    for jump in JUMPS {
        let spec = jump.spec();
        if !current.rules(jump.from).contains(&spec) {
            diffs.push(format!(
                "{fam} chain {} lacks the jump to {}: {spec}",
                jump.from, jump.to
            ));
        }
    }
    if diffs.len() > MAX_DIFFERENCES {
        let more = diffs.len() - MAX_DIFFERENCES;
        diffs.truncate(MAX_DIFFERENCES);
        diffs.push(format!("and {more} more differences"));
    }
    diffs
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::iptables::rules::{Family, RedirectSpec};

    use testkit::iptables::default_rule;

    /// An `iptables-save` dump of a meshed pod: testkit's reference rules
    /// for the defaults, with what a real dump adds around them (comments,
    /// a rule counter, another table).
    fn saved() -> String {
        format!(
            "# Generated by iptables-save v1.8.9 on Mon Nov 30 04:22:47 2026\n\
             {}\
             # Completed on Mon Nov 30 04:22:47 2026\n\
             *filter\n:INPUT ACCEPT [0:0]\n-A INPUT -j DROP\nCOMMIT\n",
            testkit::iptables::default_save().replacen("-A PREROUTING", "[3:180] -A PREROUTING", 1)
        )
    }

    fn defaults() -> RuleSet {
        RuleSet::build(&RedirectSpec::default(), Family::V4)
    }

    #[test]
    fn parse_reads_only_nat_and_drops_counters() {
        let t = NatTable::parse(&saved());
        assert!(t.has_chain("PROXY_INIT_REDIRECT"));
        assert!(!t.has_chain("FORWARD"));
        assert_eq!(t.rules("PREROUTING").len(), 1);
        assert!(t.rules("PREROUTING")[0].starts_with("-m comment"));
        assert!(t.rules("INPUT").is_empty());
        assert_eq!(t.rules("PROXY_INIT_OUTPUT").len(), 3);
    }

    #[test]
    fn empty_table_gets_chains_and_jumps() {
        let b = restore_batch(
            &defaults(),
            &NatTable::parse("*nat\n:PREROUTING ACCEPT [0:0]\nCOMMIT\n"),
        );
        assert!(b.starts_with("*nat\n:PROXY_INIT_REDIRECT - [0:0]\n:PROXY_INIT_OUTPUT - [0:0]\n"));
        assert!(b.ends_with(&format!(
            "{}\n{}\nCOMMIT\n",
            default_rule("install-proxy-init-prerouting"),
            default_rule("install-proxy-init-output")
        )));
        assert_eq!(
            b.lines()
                .filter(|l| l.starts_with("-A PROXY_INIT_"))
                .count(),
            5
        );
    }

    #[test]
    fn installed_table_gets_chains_refilled_but_no_second_jump() {
        let b = restore_batch(&defaults(), &NatTable::parse(&saved()));
        assert!(!b.contains("-A PREROUTING"));
        assert!(!b.contains("-A OUTPUT"));
        assert!(b.contains(":PROXY_INIT_OUTPUT - [0:0]\n"));
        assert_eq!(
            b.lines()
                .filter(|l| l.starts_with("-A PROXY_INIT_"))
                .count(),
            5
        );
    }

    #[test]
    fn many_foreign_rules_give_a_bounded_report() {
        let mut saved = saved().replace("COMMIT\n# Completed", "COMMIT-MARK\n# Completed");
        let extra: String = (0..20_000)
            .map(|i| {
                format!(
                    "-A PROXY_INIT_OUTPUT -d 10.{}.{}.1/32 -j RETURN\n",
                    i / 256,
                    i % 256
                )
            })
            .collect();
        saved = saved.replacen("COMMIT-MARK\n", &format!("{extra}COMMIT\n"), 1);
        let d = differences(&defaults(), &NatTable::parse(&saved));
        assert!(d.len() <= MAX_DIFFERENCES + 1, "{} lines", d.len());
        assert!(
            d.last().unwrap().contains("and 19980 more"),
            "{:?}",
            d.last()
        );
    }

    #[test]
    fn differences_say_what_is_wrong() {
        assert!(differences(&defaults(), &NatTable::parse(&saved())).is_empty());

        let saved = saved();
        let loopback = default_rule("ignore-loopback");
        let uid = default_rule("ignore-proxy-user-id");
        let no_loopback = saved.replace(&format!("{loopback}\n"), "");
        let d = differences(&defaults(), &NatTable::parse(&no_loopback));
        assert_eq!(d.len(), 1, "{d:?}");
        assert!(
            d[0].contains("PROXY_INIT_OUTPUT lacks rule: -o lo"),
            "{d:?}"
        );

        let no_jump = saved.replace("[3:180] -A PREROUTING", "-A OTHER");
        let d = differences(&defaults(), &NatTable::parse(&no_jump));
        assert_eq!(d.len(), 1, "{d:?}");
        assert!(d[0].contains("PREROUTING lacks the jump to PROXY_INIT_REDIRECT"));

        let other_port = saved.replace("--to-ports 4140", "--to-ports 4000");
        let d = differences(&defaults(), &NatTable::parse(&other_port));
        assert_eq!(d.len(), 2, "{d:?}");
        assert!(d[1].contains("unexpected rule") && d[1].contains("4000"));

        let d = differences(&defaults(), &NatTable::parse("*nat\nCOMMIT\n"));
        assert_eq!(d.len(), 4, "{d:?}");
        assert!(d[0].ends_with("PROXY_INIT_REDIRECT is missing"));

        let swapped = saved.replace(
            &format!("{uid}\n{loopback}\n"),
            &format!("{loopback}\n{uid}\n"),
        );
        let d = differences(&defaults(), &NatTable::parse(&swapped));
        assert_eq!(d.len(), 1, "{d:?}");
        assert!(d[0].contains("different order"));
    }
}
