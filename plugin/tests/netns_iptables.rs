//! The rules in real network namespaces (root): applied through the
//! library's driver in legacy mode (iptables-legacy-restore) and nft mode
//! (nf_tables over netlink), compared with `iptables-save` byte for byte
//! apart from counters, re-applied, and verified.

use linkerd_cni::config::IptablesMode;
use linkerd_cni::iptables::rules::{self, RedirectSpec, RuleSet};
use linkerd_cni::iptables::{Driver, Family};
use testkit::TestNetns;
use testkit::iptables::{default_save, delete_rule, nat_table};

const MODES: [(IptablesMode, &str); 2] =
    [(IptablesMode::Legacy, "legacy"), (IptablesMode::Nft, "nft")];

fn driver(mode: IptablesMode) -> Driver {
    // -w: other test suites on this machine may hold the legacy xtables lock.
    Driver::new(mode, true)
}

fn defaults() -> Vec<RuleSet> {
    vec![RuleSet::build(&RedirectSpec::default(), Family::V4)]
}

#[test]
fn defaults_match_the_reference_rules_in_both_modes() {
    for (mode, name) in MODES {
        let ns = TestNetns::new("ipt").unwrap();
        driver(mode).apply(ns.path(), &defaults()).unwrap();
        assert_eq!(
            nat_table(&ns, &format!("iptables-{name}-save")),
            default_save(),
            "mode {name}"
        );
        assert!(
            driver(mode)
                .verify(ns.path(), &defaults())
                .unwrap()
                .is_empty(),
            "mode {name}"
        );
    }
}

#[test]
fn second_apply_leaves_exactly_the_same_rules() {
    for (mode, name) in MODES {
        let ns = TestNetns::new("idem").unwrap();
        let save = format!("iptables-{name}-save");
        driver(mode).apply(ns.path(), &defaults()).unwrap();
        let first = nat_table(&ns, &save);
        driver(mode).apply(ns.path(), &defaults()).unwrap();
        driver(mode).apply(ns.path(), &defaults()).unwrap();
        assert_eq!(nat_table(&ns, &save), first, "mode {name}");
        assert_eq!(first, default_save());
    }
}

#[test]
fn apply_converges_from_other_settings() {
    // A pod whose rules were installed with other settings (e.g. by an older
    // config) ends up with exactly the new ones, jumps not duplicated.
    for (mode, name) in MODES {
        let ns = TestNetns::new("conv").unwrap();
        let other = RedirectSpec {
            proxy_gid: 7,
            outbound_ports_to_ignore: rules::parse_port_list("25,3306").unwrap(),
            ..RedirectSpec::default()
        };
        driver(mode)
            .apply(ns.path(), &[RuleSet::build(&other, Family::V4)])
            .unwrap();
        driver(mode).apply(ns.path(), &defaults()).unwrap();
        assert_eq!(
            nat_table(&ns, &format!("iptables-{name}-save")),
            default_save(),
            "mode {name}"
        );
    }
}

#[test]
fn verify_detects_a_deleted_rule_and_a_deleted_jump() {
    for (mode, name) in MODES {
        let ns = TestNetns::new("chk").unwrap();
        let d = driver(mode);
        d.apply(ns.path(), &defaults()).unwrap();
        let bin = format!("iptables-{name}");

        delete_rule(
            &ns,
            &bin,
            "PROXY_INIT_OUTPUT",
            "-o lo -m comment --comment \"proxy-init/ignore-loopback\" -j RETURN",
        );
        let diffs = d.verify(ns.path(), &defaults()).unwrap();
        assert_eq!(diffs.len(), 1, "mode {name}: {diffs:?}");
        assert!(
            diffs[0].contains("PROXY_INIT_OUTPUT lacks rule: -o lo"),
            "{diffs:?}"
        );

        delete_rule(
            &ns,
            &bin,
            "PREROUTING",
            "-m comment --comment \"proxy-init/install-proxy-init-prerouting\" -j PROXY_INIT_REDIRECT",
        );
        let diffs = d.verify(ns.path(), &defaults()).unwrap();
        assert_eq!(diffs.len(), 2, "mode {name}: {diffs:?}");
        assert!(diffs[1].contains("PREROUTING lacks the jump"), "{diffs:?}");

        // ADD repairs both.
        d.apply(ns.path(), &defaults()).unwrap();
        assert!(d.verify(ns.path(), &defaults()).unwrap().is_empty());
    }
}

#[test]
fn every_rule_shape_round_trips_through_iptables() {
    // What iptables prints back must be exactly what we render, or CHECK
    // would report differences on a correct table.
    let spec = RedirectSpec {
        proxy_gid: 2103,
        ports_to_redirect: vec![8080, 9090],
        inbound_ports_to_ignore: rules::parse_port_list(
            "4191,4190,1-2,3,4,5,6,7,8,9,10,11,12,13,14,20000-30000",
        )
        .unwrap(),
        outbound_ports_to_ignore: rules::parse_port_list("443,6443,10000-10100").unwrap(),
        subnets_to_ignore: rules::parse_subnet_list(
            "10.1.2.3/8,192.168.7.7,fd00:1::5/64,2001:DB8:0:0:1::1",
        )
        .unwrap(),
        ..RedirectSpec::default()
    };
    let sets = [
        RuleSet::build(&spec, Family::V4),
        RuleSet::build(&spec, Family::V6),
    ];
    for (mode, name) in MODES {
        let ns = TestNetns::new("shape").unwrap();
        let d = driver(mode);
        d.apply(ns.path(), &sets).unwrap();
        let diffs = d.verify(ns.path(), &sets).unwrap();
        assert!(diffs.is_empty(), "mode {name}: {diffs:#?}");

        let v4 = nat_table(&ns, &format!("iptables-{name}-save"));
        let v6 = nat_table(&ns, &format!("ip6tables-{name}-save"));
        assert!(v4.contains(
            "-s 10.0.0.0/8 -m comment --comment \"proxy-init/ignore-subnet-10.1.2.3/8\""
        ));
        assert!(!v4.contains("fd00"), "{v4}");
        assert!(v6.contains("-s fd00:1::/64 "), "{v6}");
        assert!(v6.contains("-s 2001:db8::1:0:0:1/128 "), "{v6}");
        assert!(!v6.contains("10.0.0.0"), "{v6}");
        // 4191,4190 + 12 singles + ranges: chunked at 15 units.
        assert!(
            v4.contains("--dports 4191,4190,1:2,3,4,5,6,7,8,9,10,11,12,13 "),
            "{v4}"
        );
        assert!(v4.contains("--dports 14,20000:30000 "), "{v4}");
    }
}

#[test]
fn ipv6_also_programs_ip6tables() {
    for (mode, name) in MODES {
        let ns = TestNetns::new("v6").unwrap();
        let sets = [
            RuleSet::build(&RedirectSpec::default(), Family::V4),
            RuleSet::build(&RedirectSpec::default(), Family::V6),
        ];
        driver(mode).apply(ns.path(), &sets).unwrap();
        assert_eq!(
            nat_table(&ns, &format!("ip6tables-{name}-save")),
            default_save()
        );
        assert_eq!(
            nat_table(&ns, &format!("iptables-{name}-save")),
            default_save()
        );
    }
}

#[test]
fn a_missing_netns_is_named_in_the_error() {
    let e = driver(IptablesMode::Nft)
        .apply(
            std::path::Path::new("/run/netns/lcni-does-not-exist"),
            &defaults(),
        )
        .unwrap_err();
    assert!(
        e.to_string().contains("/run/netns/lcni-does-not-exist"),
        "{e}"
    );
}
