//! `iptables-mode: nft` in-process (root, real network namespaces): for
//! every rule shape, the rules programmed over netlink are exactly those
//! `iptables-nft-restore` installs from the same batch in a second fresh
//! namespace: the same `iptables-nft-save` text, the same chains (hooks,
//! priorities, policies), the same rules in the same order with the same
//! handles and expression bytes (counter values aside), and the same
//! `nft --debug=netlink list ruleset`. iptables-nft deletes and flushes
//! them as its own, and a second apply converges on the same table.

use std::time::Duration;

use linkerd_cni::config::IptablesMode;
use linkerd_cni::iptables::exec::{self, Tools};
use linkerd_cni::iptables::nft::{self, Listing};
use linkerd_cni::iptables::rules::{self, RedirectSpec, RuleSet};
use linkerd_cni::iptables::{Family, NatTable, table};
use linkerd_cni::netns;
use testkit::TestNetns;
use testkit::iptables::{default_save, delete_rule, has_rule, nat_table};

const T: Duration = Duration::from_secs(20);

/// Every rule shape: ports and ranges (chunked), subnets of every prefix
/// kind in both families (/0, byte-aligned, masked, host), uid and gid,
/// listed redirect ports, outbound ignores as a control-plane pod gets them.
fn variants() -> Vec<(&'static str, RedirectSpec)> {
    let ports = |s| rules::parse_port_list(s).unwrap();
    vec![
        ("defaults", RedirectSpec::default()),
        (
            "ports-and-ranges",
            RedirectSpec {
                inbound_ports_to_ignore: ports(
                    "4191,4190,1-2,3,4,5,6,7,8,9,10,11,12,13,14,20000-30000",
                ),
                outbound_ports_to_ignore: ports("25,587,10000-10100"),
                ..RedirectSpec::default()
            },
        ),
        (
            "subnets",
            RedirectSpec {
                subnets_to_ignore: rules::parse_subnet_list(
                    "10.1.2.3/8,172.16.0.0/12,192.168.7.7,10.128.0.0/9,0.0.0.0/0,\
                     fd00:1::5/64,2001:DB8:0:0:1::1,fd00::/13,::/0",
                )
                .unwrap(),
                ..RedirectSpec::default()
            },
        ),
        (
            "uid-gid-redirect-ports",
            RedirectSpec {
                proxy_uid: 4294967294,
                proxy_gid: 2103,
                ports_to_redirect: vec![8080, 9090],
                incoming_proxy_port: 14143,
                outgoing_proxy_port: 14140,
                ..RedirectSpec::default()
            },
        ),
        (
            "no-uid",
            RedirectSpec {
                proxy_uid: 0,
                ..RedirectSpec::default()
            },
        ),
        (
            "control-plane",
            RedirectSpec {
                outbound_ports_to_ignore: ports("4567,4568,443,6443"),
                ..RedirectSpec::default()
            },
        ),
    ]
}

fn sets(spec: &RedirectSpec) -> [RuleSet; 2] {
    [
        RuleSet::build(spec, Family::V4),
        RuleSet::build(spec, Family::V6),
    ]
}

fn in_process(ns: &TestNetns, sets: &[RuleSet]) {
    netns::run_in(ns.path(), || {
        for s in sets {
            nft::apply(s, T, None).unwrap_or_else(|e| panic!("{}: {e}", s.family));
        }
    })
    .unwrap();
}

/// What the restore path does, with iptables-nft-save and -restore.
fn restored(ns: &TestNetns, sets: &[RuleSet]) {
    let dirs = exec::search_dirs(std::env::var_os("PATH").as_deref());
    netns::run_in(ns.path(), || {
        for s in sets {
            let t = Tools::find(IptablesMode::Nft, s.family, &dirs).unwrap();
            assert_eq!(t.mode, IptablesMode::Nft, "iptables-nft is needed");
            let current = NatTable::parse(&t.save(T).unwrap());
            let batch = table::restore_batch(s, &current);
            t.restore(&batch, false, T).unwrap();
        }
    })
    .unwrap();
}

fn listing(ns: &TestNetns, family: Family) -> Listing {
    netns::run_in(ns.path(), || nft::dump(family, T, None))
        .unwrap()
        .unwrap()
}

fn nft_debug(ns: &TestNetns) -> String {
    ns.exec_ok(&["nft", "--debug=netlink", "list", "ruleset"])
}

fn saves(ns: &TestNetns) -> [String; 2] {
    [
        nat_table(ns, "iptables-nft-save"),
        nat_table(ns, "ip6tables-nft-save"),
    ]
}

fn assert_same(label: &str, ours: &TestNetns, theirs: &TestNetns) {
    assert_eq!(saves(ours), saves(theirs), "{label}: *-save");
    for family in [Family::V4, Family::V6] {
        let (a, b) = (listing(ours, family), listing(theirs, family));
        assert!(!b.rules.is_empty(), "{label}: restore installed nothing");
        // Generations count the transactions, which differ by design
        // (iptables-nft-restore also probes the revisions it uses).
        assert_eq!(
            Listing { genid: 0, ..a },
            Listing { genid: 0, ..b },
            "{label}: {family} kernel objects"
        );
    }
    assert_eq!(nft_debug(ours), nft_debug(theirs), "{label}: nft --debug");
}

#[test]
fn every_variant_is_byte_for_byte_what_iptables_nft_restore_installs() {
    for (label, spec) in variants() {
        let sets = sets(&spec);
        let ours = TestNetns::new("nftA").unwrap();
        let theirs = TestNetns::new("nftB").unwrap();
        in_process(&ours, &sets);
        restored(&theirs, &sets);
        assert_same(label, &ours, &theirs);
        // The netlink path reads every rule back as one of ours, whoever
        // wrote it.
        for ns in [&ours, &theirs] {
            for s in &sets {
                let d = netns::run_in(ns.path(), || nft::verify(s, T, None))
                    .unwrap()
                    .unwrap();
                assert!(d.is_empty(), "{label}: {d:?}");
            }
        }
        // And iptables-nft reads it back as our rule text.
        let v4 = saves(&ours)[0].clone();
        for (chain, specs) in sets[0].chains() {
            for s in specs {
                let line = format!("-A {chain} {s}\n");
                assert!(v4.contains(&line), "{label}: no {line} in\n{v4}");
            }
        }
    }
}

#[test]
fn defaults_read_back_as_the_reference_text_and_verify() {
    let ns = TestNetns::new("nftR").unwrap();
    let sets = [RuleSet::build(&RedirectSpec::default(), Family::V4)];
    in_process(&ns, &sets);
    assert_eq!(nat_table(&ns, "iptables-nft-save"), default_save());
    let d = netns::run_in(ns.path(), || nft::verify(&sets[0], T, None))
        .unwrap()
        .unwrap();
    assert!(d.is_empty(), "{d:?}");
    // Nothing in IPv6 nor in the legacy tables.
    assert!(listing(&ns, Family::V6).rules.is_empty());
    assert!(!nat_table(&ns, "iptables-legacy-save").contains("PROXY_INIT"));
}

#[test]
fn a_second_apply_on_a_netns_holding_the_rules_changes_nothing() {
    for (label, spec) in variants() {
        let sets = sets(&spec);
        let twice = TestNetns::new("nft2").unwrap();
        let theirs = TestNetns::new("nftB").unwrap();
        in_process(&twice, &sets);
        let first = [listing(&twice, Family::V4), listing(&twice, Family::V6)];
        in_process(&twice, &sets);
        in_process(&twice, &sets);
        // The restore path's re-ADD on the same table, for comparison.
        restored(&theirs, &sets);
        restored(&theirs, &sets);
        assert_eq!(saves(&twice), saves(&theirs), "{label}");
        for (f, before) in [Family::V4, Family::V6].into_iter().zip(first) {
            let after = listing(&twice, f);
            let strip = |l: &Listing| -> Vec<_> {
                l.rules
                    .iter()
                    .map(|r| (r.chain.clone(), r.raw.clone()))
                    .collect()
            };
            assert_eq!(strip(&after), strip(&before), "{label} {f}");
            assert_eq!(after.chains, before.chains, "{label} {f}");
            assert_eq!(strip(&after), strip(&listing(&theirs, f)), "{label} {f}");
        }
    }
}

#[test]
fn apply_converges_from_other_settings_and_from_restored_rules() {
    let other = RedirectSpec {
        proxy_gid: 7,
        outbound_ports_to_ignore: rules::parse_port_list("25,3306").unwrap(),
        ..RedirectSpec::default()
    };
    let defaults = [RuleSet::build(&RedirectSpec::default(), Family::V4)];
    // Rules left by another config, in-process or by iptables-nft-restore.
    let a = TestNetns::new("nftC").unwrap();
    in_process(&a, &[RuleSet::build(&other, Family::V4)]);
    in_process(&a, &defaults);
    let b = TestNetns::new("nftC").unwrap();
    restored(&b, &[RuleSet::build(&other, Family::V4)]);
    in_process(&b, &defaults);
    for ns in [&a, &b] {
        assert_eq!(nat_table(ns, "iptables-nft-save"), default_save());
    }
}

#[test]
fn iptables_nft_deletes_and_flushes_our_rules() {
    let ns = TestNetns::new("nftD").unwrap();
    let sets = [RuleSet::build(&RedirectSpec::default(), Family::V4)];
    in_process(&ns, &sets);
    let verify = || {
        netns::run_in(ns.path(), || nft::verify(&sets[0], T, None))
            .unwrap()
            .unwrap()
    };
    // iptables-nft -C finds every rule of ours, the jumps included; and not
    // one that differs in a port.
    for (chain, specs) in sets[0].chains() {
        for spec in specs {
            assert!(
                has_rule(&ns, "iptables-nft", chain, &spec),
                "-C {chain} {spec}"
            );
        }
    }
    for j in rules::JUMPS {
        assert!(
            has_rule(&ns, "iptables-nft", j.from, &j.spec()),
            "-C {}",
            j.from
        );
    }
    let other = sets[0].chains()[1].1[2].replace("4140", "4141");
    assert!(
        !has_rule(&ns, "iptables-nft", "PROXY_INIT_OUTPUT", &other),
        "{other}"
    );
    delete_rule(
        &ns,
        "iptables-nft",
        "PROXY_INIT_OUTPUT",
        "-o lo -m comment --comment \"proxy-init/ignore-loopback\" -j RETURN",
    );
    let d = verify();
    assert_eq!(d.len(), 1, "{d:?}");
    assert!(
        d[0].contains("PROXY_INIT_OUTPUT lacks rule: -o lo"),
        "{d:?}"
    );
    delete_rule(
        &ns,
        "iptables-nft",
        "PREROUTING",
        "-m comment --comment \"proxy-init/install-proxy-init-prerouting\" -j PROXY_INIT_REDIRECT",
    );
    let d = verify();
    assert!(
        d.iter().any(|l| l.contains("PREROUTING lacks the jump")),
        "{d:?}"
    );
    // A rule someone else appended to our chain is named, not hidden.
    ns.exec_ok(&[
        "iptables-nft",
        "-t",
        "nat",
        "-A",
        "PROXY_INIT_REDIRECT",
        "-p",
        "udp",
        "-j",
        "RETURN",
    ]);
    let d = verify();
    assert!(
        d.iter()
            .any(|l| l.contains("unexpected rule") && l.contains("did not write")),
        "{d:?}"
    );
    in_process(&ns, &sets);
    assert!(verify().is_empty());
    assert_eq!(nat_table(&ns, "iptables-nft-save"), default_save());

    // -F and -X as an operator would clean up: nothing of ours is left.
    for args in [
        ["-F", "PROXY_INIT_OUTPUT"],
        ["-F", "PROXY_INIT_REDIRECT"],
        ["-F", "PREROUTING"],
        ["-F", "OUTPUT"],
        ["-X", "PROXY_INIT_OUTPUT"],
        ["-X", "PROXY_INIT_REDIRECT"],
    ] {
        ns.exec_ok(&["iptables-nft", "-t", "nat", args[0], args[1]]);
    }
    let left = nat_table(&ns, "iptables-nft-save");
    assert!(
        !left.contains("PROXY_INIT") && !left.contains("-A "),
        "{left}"
    );
    assert_eq!(verify().len(), 4);
}

#[test]
fn an_empty_nat_table_is_known_without_save() {
    let ns = TestNetns::new("nftE").unwrap();
    let empty = |f| {
        netns::run_in(ns.path(), || nft::dump(f, T, None).map(|l| l.is_empty()))
            .unwrap()
            .unwrap()
    };
    assert!(empty(Family::V4) && empty(Family::V6));
    // Base chains alone (as `iptables-nft -L` leaves them) are still empty.
    ns.exec_ok(&["iptables-nft", "-t", "nat", "-L", "-n"]);
    assert!(empty(Family::V4));
    ns.exec_ok(&["iptables-nft", "-t", "nat", "-N", "SOMEONE"]);
    assert!(!empty(Family::V4));
    assert!(empty(Family::V6));
    ns.exec_ok(&["ip6tables-nft", "-t", "nat", "-A", "OUTPUT", "-j", "RETURN"]);
    assert!(!empty(Family::V6));

    let legacy =
        |f| netns::run_in(ns.path(), || linkerd_cni::iptables::legacy::nat_is_empty(f)).unwrap();
    assert!(legacy(Family::V4).unwrap() && legacy(Family::V6).unwrap());
    ns.exec_ok(&["iptables-legacy", "-t", "nat", "-N", "SOMEONE"]);
    assert!(!legacy(Family::V4).unwrap());
    ns.exec_ok(&[
        "ip6tables-legacy",
        "-t",
        "nat",
        "-A",
        "OUTPUT",
        "-j",
        "RETURN",
    ]);
    assert!(!legacy(Family::V6).unwrap());
}

#[test]
fn nothing_runs_past_the_deadline() {
    // A deadline already gone: the netlink step refuses to wait, the
    // fallback's binaries get no time either, and nothing is installed.
    let ns = TestNetns::new("nftT").unwrap();
    let sets = [RuleSet::build(&RedirectSpec::default(), Family::V4)];
    let start = std::time::Instant::now();
    let e = linkerd_cni::iptables::Driver::new(IptablesMode::Nft, false)
        .until(start)
        .apply(ns.path(), &sets)
        .unwrap_err();
    assert!(start.elapsed() < Duration::from_secs(10), "{e}");
    assert!(e.to_string().contains("did not finish within"), "{e}");
    assert!(!nat_table(&ns, "iptables-nft-save").contains("PROXY_INIT"));
}

#[test]
fn a_batch_is_refused_whole_on_a_moved_generation_and_names_a_refused_command() {
    use nft::netlink::{
        NFT_MSG_NEWCHAIN, NFT_MSG_NEWTABLE, NLM_F_ACK, NLM_F_CREATE, NLM_F_EXCL, NLM_F_REQUEST,
        Socket,
    };
    let ns = TestNetns::new("nftG").unwrap();
    ns.exec_ok(&["iptables-nft", "-t", "nat", "-N", "SOMEONE"]);
    // Creates table nat, then chain SOMEONE (refused: it exists).
    let commit = |sock: &mut Socket, genid: u32| {
        let mut w = sock.writer();
        w.batch_begin(genid);
        let ack = NLM_F_REQUEST | NLM_F_ACK;
        let table = w.begin(NFT_MSG_NEWTABLE, ack | NLM_F_CREATE, 2);
        w.put_str(1, "nat");
        w.end();
        let chain = w.begin(NFT_MSG_NEWCHAIN, ack | NLM_F_EXCL, 2);
        w.put_str(1, "nat");
        w.put_str(3, "SOMEONE");
        w.end();
        w.batch_end();
        let commands = [
            (table, "creating nat".into()),
            (chain, "declaring SOMEONE".into()),
        ];
        sock.commit(&w, &commands, "test batch")
    };
    netns::run_in(ns.path(), || {
        let mut sock = Socket::open(T, None).unwrap();
        let stale = sock.generation().unwrap();
        ns.exec_ok(&["iptables-nft", "-t", "nat", "-N", "OTHER"]);
        let e = commit(&mut sock, stale).unwrap_err();
        assert!(matches!(e, nft::NftError::Changed), "{e}");
        let genid = sock.generation().unwrap();
        assert_ne!(genid, stale);
        let e = commit(&mut sock, genid).unwrap_err().to_string();
        assert_eq!(
            e,
            "nf_tables refused declaring SOMEONE: EEXIST: File exists"
        );
    })
    .unwrap();
}
