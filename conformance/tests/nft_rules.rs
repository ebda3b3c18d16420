//! `iptables-mode: nft` (the chart's default) through libcni: the plugin
//! programs the rules itself over netlink, and what a pod's namespace
//! holds is exactly what `iptables-nft-restore` installs for the same rule
//! text in a second fresh namespace, for every rule variant (ports and
//! ranges past a multiport chunk, subnets of both families, uid and gid,
//! listed redirect ports, a control-plane pod's API server ports, IPv6),
//! and again after a re-ADD on a namespace that already holds the rules.
//! Compared: `iptables-nft-save`/`ip6tables-nft-save` line for line
//! (against the rule text written out here, as upstream proxy-init builds
//! it), and the kernel's objects as `nft --debug=netlink list ruleset`
//! prints them (chains with their hooks and priorities, rule handles, native
//! and xt compat expressions with their revisions). Then CHECK, a rule
//! deleted with `iptables-nft -D`, CHECK's code 103, and the repair.

use conformance::chains::{self, Primary};
use conformance::kube::APP_NAMESPACE;
use conformance::{Node, Pod, PodSpec};
use serde_json::{Value, json};
use testkit::TestNetns;
use testkit::iptables::{has_rule, normalize_save};
use testkit::objects::{KUBERNETES_SERVICE_PATH, Pod as ApiPod, kubernetes_service};

/// One rule variant: what the config and the pod say, and the rule text
/// upstream's proxy-init gives for it (`-A` lines in `*-save` order).
struct Variant {
    label: &'static str,
    linkerd: Value,
    annotations: &'static [(&'static str, &'static str)],
    control_plane: bool,
    v4: &'static str,
    /// None: IPv6 off, no ip6tables rules at all.
    v6: Option<&'static str>,
}

const JUMPS: &str = "\
-A PREROUTING -m comment --comment \"proxy-init/install-proxy-init-prerouting\" -j PROXY_INIT_REDIRECT
-A OUTPUT -m comment --comment \"proxy-init/install-proxy-init-output\" -j PROXY_INIT_OUTPUT
";

fn variants() -> Vec<Variant> {
    vec![
        Variant {
            label: "defaults",
            linkerd: json!({}),
            annotations: &[],
            control_plane: false,
            v4: "\
-A PROXY_INIT_OUTPUT -m owner --uid-owner 2102 -m comment --comment \"proxy-init/ignore-proxy-user-id\" -j RETURN
-A PROXY_INIT_OUTPUT -o lo -m comment --comment \"proxy-init/ignore-loopback\" -j RETURN
-A PROXY_INIT_OUTPUT -p tcp -m comment --comment \"proxy-init/redirect-all-outgoing-to-proxy-port\" -j REDIRECT --to-ports 4140
-A PROXY_INIT_REDIRECT -p tcp -m multiport --dports 4191,4190 -m comment --comment \"proxy-init/ignore-port-4191,4190\" -j RETURN
-A PROXY_INIT_REDIRECT -p tcp -m comment --comment \"proxy-init/redirect-all-incoming-to-proxy-port\" -j REDIRECT --to-ports 4143
",
            v6: None,
        },
        Variant {
            label: "ports-and-ranges",
            linkerd: json!({
                "inbound-ports-to-ignore": ["4191", "4190", "1000-2000"],
                "outbound-ports-to-ignore": ["25"],
            }),
            annotations: &[
                (
                    "config.linkerd.io/skip-inbound-ports",
                    "8000-8100,9000,1,2,3,4,5,6,7,8,9,10",
                ),
                ("config.linkerd.io/skip-outbound-ports", "587,3306-3310"),
            ],
            control_plane: false,
            v4: "\
-A PROXY_INIT_OUTPUT -m owner --uid-owner 2102 -m comment --comment \"proxy-init/ignore-proxy-user-id\" -j RETURN
-A PROXY_INIT_OUTPUT -o lo -m comment --comment \"proxy-init/ignore-loopback\" -j RETURN
-A PROXY_INIT_OUTPUT -p tcp -m multiport --dports 587,3306:3310 -m comment --comment \"proxy-init/ignore-port-587,3306:3310\" -j RETURN
-A PROXY_INIT_OUTPUT -p tcp -m comment --comment \"proxy-init/redirect-all-outgoing-to-proxy-port\" -j REDIRECT --to-ports 4140
-A PROXY_INIT_REDIRECT -p tcp -m multiport --dports 4191,4190,1000:2000,8000:8100,9000,1,2,3,4,5,6,7,8 -m comment --comment \"proxy-init/ignore-port-4191,4190,1000:2000,8000:8100,9000,1,2,3,4,5,6,7,8\" -j RETURN
-A PROXY_INIT_REDIRECT -p tcp -m multiport --dports 9,10 -m comment --comment \"proxy-init/ignore-port-9,10\" -j RETURN
-A PROXY_INIT_REDIRECT -p tcp -m comment --comment \"proxy-init/redirect-all-incoming-to-proxy-port\" -j REDIRECT --to-ports 4143
",
            v6: None,
        },
        Variant {
            label: "subnets-ipv6",
            linkerd: json!({"ipv6": true, "subnets-to-ignore": ["10.9.0.0/16"]}),
            annotations: &[(
                "config.linkerd.io/skip-subnets",
                "10.1.2.3/8,172.16.0.0/12,192.168.1.7,fd00::/13,fd00:1::5/64,2001:DB8::1",
            )],
            control_plane: false,
            v4: "\
-A PROXY_INIT_OUTPUT -m owner --uid-owner 2102 -m comment --comment \"proxy-init/ignore-proxy-user-id\" -j RETURN
-A PROXY_INIT_OUTPUT -o lo -m comment --comment \"proxy-init/ignore-loopback\" -j RETURN
-A PROXY_INIT_OUTPUT -p tcp -m comment --comment \"proxy-init/redirect-all-outgoing-to-proxy-port\" -j REDIRECT --to-ports 4140
-A PROXY_INIT_REDIRECT -p tcp -m multiport --dports 4191,4190 -m comment --comment \"proxy-init/ignore-port-4191,4190\" -j RETURN
-A PROXY_INIT_REDIRECT -s 10.0.0.0/8 -m comment --comment \"proxy-init/ignore-subnet-10.1.2.3/8\" -j RETURN
-A PROXY_INIT_REDIRECT -s 172.16.0.0/12 -m comment --comment \"proxy-init/ignore-subnet-172.16.0.0/12\" -j RETURN
-A PROXY_INIT_REDIRECT -s 192.168.1.7/32 -m comment --comment \"proxy-init/ignore-subnet-192.168.1.7\" -j RETURN
-A PROXY_INIT_REDIRECT -p tcp -m comment --comment \"proxy-init/redirect-all-incoming-to-proxy-port\" -j REDIRECT --to-ports 4143
",
            v6: Some("\
-A PROXY_INIT_OUTPUT -m owner --uid-owner 2102 -m comment --comment \"proxy-init/ignore-proxy-user-id\" -j RETURN
-A PROXY_INIT_OUTPUT -o lo -m comment --comment \"proxy-init/ignore-loopback\" -j RETURN
-A PROXY_INIT_OUTPUT -p tcp -m comment --comment \"proxy-init/redirect-all-outgoing-to-proxy-port\" -j REDIRECT --to-ports 4140
-A PROXY_INIT_REDIRECT -p tcp -m multiport --dports 4191,4190 -m comment --comment \"proxy-init/ignore-port-4191,4190\" -j RETURN
-A PROXY_INIT_REDIRECT -s fd00::/13 -m comment --comment \"proxy-init/ignore-subnet-fd00::/13\" -j RETURN
-A PROXY_INIT_REDIRECT -s fd00:1::/64 -m comment --comment \"proxy-init/ignore-subnet-fd00:1::5/64\" -j RETURN
-A PROXY_INIT_REDIRECT -s 2001:db8::1/128 -m comment --comment \"proxy-init/ignore-subnet-2001:DB8::1\" -j RETURN
-A PROXY_INIT_REDIRECT -p tcp -m comment --comment \"proxy-init/redirect-all-incoming-to-proxy-port\" -j REDIRECT --to-ports 4143
"),
        },
        Variant {
            label: "uid-gid-redirect-ports",
            linkerd: json!({
                "ipv6": true,
                "ports-to-redirect": [8080, 9090],
                "incoming-proxy-port": 14143,
                "outgoing-proxy-port": 14140,
            }),
            annotations: &[
                ("config.linkerd.io/proxy-uid", "4321"),
                ("config.linkerd.io/proxy-gid", "4322"),
            ],
            control_plane: false,
            v4: UID_GID,
            v6: Some(UID_GID),
        },
        Variant {
            label: "control-plane",
            linkerd: json!({"outbound-ports-to-ignore": ["4567"]}),
            annotations: &[],
            control_plane: true,
            v4: "\
-A PROXY_INIT_OUTPUT -m owner --uid-owner 2102 -m comment --comment \"proxy-init/ignore-proxy-user-id\" -j RETURN
-A PROXY_INIT_OUTPUT -o lo -m comment --comment \"proxy-init/ignore-loopback\" -j RETURN
-A PROXY_INIT_OUTPUT -p tcp -m multiport --dports 4567,443,6443 -m comment --comment \"proxy-init/ignore-port-4567,443,6443\" -j RETURN
-A PROXY_INIT_OUTPUT -p tcp -m comment --comment \"proxy-init/redirect-all-outgoing-to-proxy-port\" -j REDIRECT --to-ports 4140
-A PROXY_INIT_REDIRECT -p tcp -m multiport --dports 4191,4190 -m comment --comment \"proxy-init/ignore-port-4191,4190\" -j RETURN
-A PROXY_INIT_REDIRECT -p tcp -m comment --comment \"proxy-init/redirect-all-incoming-to-proxy-port\" -j REDIRECT --to-ports 4143
",
            v6: None,
        },
    ]
}

const UID_GID: &str = "\
-A PROXY_INIT_OUTPUT -m owner --uid-owner 4321 -m comment --comment \"proxy-init/ignore-proxy-user-id\" -j RETURN
-A PROXY_INIT_OUTPUT -m owner --gid-owner 4322 -m comment --comment \"proxy-init/ignore-proxy-group-id\" -j RETURN
-A PROXY_INIT_OUTPUT -o lo -m comment --comment \"proxy-init/ignore-loopback\" -j RETURN
-A PROXY_INIT_OUTPUT -p tcp -m comment --comment \"proxy-init/redirect-all-outgoing-to-proxy-port\" -j REDIRECT --to-ports 14140
-A PROXY_INIT_REDIRECT -p tcp -m multiport --dports 4191,4190 -m comment --comment \"proxy-init/ignore-port-4191,4190\" -j RETURN
-A PROXY_INIT_REDIRECT -p tcp -m tcp --dport 8080 -m comment --comment \"proxy-init/redirect-port-8080-to-proxy-port\" -j REDIRECT --to-ports 14143
-A PROXY_INIT_REDIRECT -p tcp -m tcp --dport 9090 -m comment --comment \"proxy-init/redirect-port-9090-to-proxy-port\" -j REDIRECT --to-ports 14143
";

/// The whole `*-save -t nat` text for `rules` (our chains' `-A` lines).
fn save_text(rules: &str) -> String {
    format!(
        "*nat\n:PREROUTING ACCEPT [0:0]\n:INPUT ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n\
         :POSTROUTING ACCEPT [0:0]\n:PROXY_INIT_OUTPUT - [0:0]\n:PROXY_INIT_REDIRECT - [0:0]\n\
         {JUMPS}{rules}COMMIT\n"
    )
}

/// The `iptables-nft-restore --noflush` input linkerd-cni's restore path
/// writes for `rules`: chains, their rules, then the jumps when wanted.
fn restore_input(rules: &str, jumps: bool) -> String {
    let of = |chain: &str| -> String {
        rules
            .lines()
            .filter(|l| l.starts_with(&format!("-A {chain} ")))
            .map(|l| format!("{l}\n"))
            .collect()
    };
    format!(
        "*nat\n:PROXY_INIT_REDIRECT - [0:0]\n:PROXY_INIT_OUTPUT - [0:0]\n{}{}{}COMMIT\n",
        of("PROXY_INIT_REDIRECT"),
        of("PROXY_INIT_OUTPUT"),
        if jumps { JUMPS } else { "" }
    )
}

fn restore(ns: &TestNetns, bin: &str, input: &str) {
    use std::io::Write;
    let mut child = ns
        .command(bin)
        .arg("--noflush")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{bin}: {e}"));
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    let o = child.wait_with_output().unwrap();
    assert!(
        o.status.success(),
        "{bin} --noflush failed: {}\n{input}",
        String::from_utf8_lossy(&o.stderr)
    );
}

/// `v`'s rules in `ns` with iptables-nft-restore (and ip6tables-nft-restore
/// when it has IPv6 rules), as linkerd-cni's restore path would write them.
fn restore_variant(ns: &TestNetns, v: &Variant, jumps: bool) {
    restore(ns, "iptables-nft-restore", &restore_input(v.v4, jumps));
    if let Some(v6) = v.v6 {
        restore(ns, "ip6tables-nft-restore", &restore_input(v6, jumps));
    }
}

/// The kernel's objects in `ns` as nft lists them, counter values zeroed
/// (a pod's interface may see packets).
fn kernel_objects(ns: &TestNetns) -> String {
    let text = ns.exec_ok(&["nft", "--debug=netlink", "list", "ruleset"]);
    text.lines()
        .map(|l| match l.find("counter pkts") {
            Some(at) if l.trim_start().starts_with('[') => format!("{}counter ]", &l[..at]),
            _ => match l.find("counter packets") {
                Some(at) => format!("{}counter", &l[..at]),
                None => l.to_string(),
            },
        })
        .collect::<Vec<_>>()
        .join("\n")
}

fn nft_saves(ns: &TestNetns) -> [String; 2] {
    ["iptables-nft-save", "ip6tables-nft-save"]
        .map(|b| normalize_save(&ns.exec_ok(&[b, "-t", "nat"])))
}

/// Pod `ours` (rules by linkerd-cni) and namespace `theirs` (rules by
/// iptables-nft-restore) hold the same, and that is `v`'s text.
fn assert_same(v: &Variant, ours: &Pod, theirs: &TestNetns, when: &str) {
    let label = format!("{} ({when})", v.label);
    let [v4, v6] = nft_saves(ours.netns());
    assert_eq!(v4, save_text(v.v4), "{label}: iptables-nft-save");
    let want_v6 = match v.v6 {
        Some(rules) => save_text(rules),
        None => normalize_save(
            "*nat\n:PREROUTING ACCEPT [0:0]\n:INPUT ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n:POSTROUTING ACCEPT [0:0]\nCOMMIT\n",
        ),
    };
    assert_eq!(v6, want_v6, "{label}: ip6tables-nft-save");
    assert_eq!([v4, v6], nft_saves(theirs), "{label}: *-save vs restore");
    // iptables-nft -C decodes each of the kernel's rules and finds ours.
    for (bin, rules) in [("iptables-nft", Some(v.v4)), ("ip6tables-nft", v.v6)] {
        let Some(rules) = rules else { continue };
        for line in rules.lines().chain(JUMPS.lines()) {
            let (chain, spec) = line[3..].split_once(' ').unwrap();
            assert!(
                has_rule(ours.netns(), bin, chain, spec),
                "{label}: {bin} -C {line}"
            );
        }
    }
    let (a, b) = (kernel_objects(ours.netns()), kernel_objects(theirs));
    assert!(a.contains("[ match name comment rev 0 ]"), "{label}: {a}");
    assert_eq!(a, b, "{label}: kernel objects vs iptables-nft-restore's");
    // Nothing went to the legacy tables.
    for bin in ["iptables-legacy-save", "ip6tables-legacy-save"] {
        let t = ours.netns().exec_ok(&[bin, "-t", "nat"]);
        assert!(!t.contains("PROXY_INIT"), "{label}: {bin}: {t}");
    }
}

fn serve(api: &testkit::FakeApiServer, v: &Variant, name: &str) -> PodSpec {
    let mut pod = ApiPod::meshed(APP_NAMESPACE, name);
    for (k, val) in v.annotations {
        pod = pod.annotation(k, val);
    }
    if v.control_plane {
        pod = pod.label("linkerd.io/control-plane-component", "destination");
    }
    api.add_pod(&pod);
    PodSpec::kubernetes(APP_NAMESPACE, name)
}

#[test]
fn every_variant_holds_what_iptables_nft_restore_installs() {
    let node = Node::new();
    let api = node.start_api_server();
    api.set(
        KUBERNETES_SERVICE_PATH,
        kubernetes_service(&[(443, json!(6443))]),
    );
    for (i, v) in variants().iter().enumerate() {
        let net = node.network_name(&format!("nft{i}"));
        let mut entry = chains::linkerd_entry(&node);
        entry["linkerd"]["iptables-mode"] = "nft".into();
        if let (Some(l), Some(over)) = (entry["linkerd"].as_object_mut(), v.linkerd.as_object()) {
            l.extend(over.clone());
        }
        node.write_conf(
            &format!("10-{net}.conflist"),
            &chains::conflist(
                &net,
                "1.0.0",
                chains::typical_chain(&node, Primary::Bridge, Some(entry)),
            ),
        );
        let name = format!("web-{i}");
        let mut pod = node.pod(serve(&api, v, &name));
        node.add(&net, &pod)
            .unwrap_or_else(|e| panic!("{}: ADD: {e}", v.label));

        let theirs = TestNetns::new("nftref").unwrap();
        restore_variant(&theirs, v, true);
        assert_same(v, &pod, &theirs, "first ADD");

        // A runtime retry (DEL, then ADD again) on a namespace that holds
        // the rules (DEL leaves them, as upstream's does); the restore
        // path on the same table leaves out the jumps it finds.
        node.del(&net, &pod)
            .unwrap_or_else(|e| panic!("{}: DEL: {e}", v.label));
        node.add(&net, &pod)
            .unwrap_or_else(|e| panic!("{}: second ADD: {e}", v.label));
        restore_variant(&theirs, v, false);
        assert_same(v, &pod, &theirs, "re-ADD");

        node.check(&net, &pod)
            .unwrap_or_else(|e| panic!("{}: CHECK: {e}", v.label));
        let loopback =
            v.v4.lines()
                .find(|l| l.contains("ignore-loopback"))
                .unwrap();
        pod.delete_nat_rule(conformance::Backend::Nft, conformance::Family::V4, loopback);
        let failed = node
            .check(&net, &pod)
            .expect_err("CHECK after iptables-nft -D must fail");
        assert_eq!(failed.code, Some(103), "{}: {failed}", v.label);
        assert!(
            failed
                .details
                .as_deref()
                .is_some_and(|d| d.contains("ignore-loopback")),
            "{}: {failed}",
            v.label
        );
        node.del(&net, &pod).unwrap();
        node.add(&net, &pod)
            .unwrap_or_else(|e| panic!("{}: repairing ADD: {e}", v.label));
        node.check(&net, &pod)
            .unwrap_or_else(|e| panic!("{}: CHECK after repair: {e}", v.label));
        assert_eq!(nft_saves(pod.netns())[0], save_text(v.v4), "{}", v.label);

        node.del(&net, &pod).unwrap();
        pod.remove_netns();
    }
}
