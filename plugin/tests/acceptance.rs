//! The plugin's acceptance scenarios through its binary, as a runtime
//! runs it: a kubeconfig pointing at a fake API server over TLS, a pod
//! netns made with `ip netns add`, and the rules read back with
//! `iptables-save`.

mod common;

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use testkit::iptables::{default_save, delete_rule, nat_table};
use testkit::objects::Pod;
use testkit::{TempDir, TestNetns};

use common::{Cluster, cni_env, netconf, run_plugin, stderr, stdout_json};

fn node() -> Cluster {
    Cluster::start("acc")
}

fn assert_ok(o: &std::process::Output) {
    assert!(
        o.status.success(),
        "exit {:?}\nstdout: {}\nstderr: {}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        stderr(o)
    );
}

fn assert_prev_result_printed(o: &std::process::Output, conf: &Value) {
    assert_ok(o);
    assert_eq!(stdout_json(o), conf["prevResult"]);
}

/// The nat table of a netns nobody touched.
fn untouched() -> String {
    "*nat\n:PREROUTING ACCEPT [0:0]\n:INPUT ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n:POSTROUTING ACCEPT [0:0]\nCOMMIT\n"
        .to_string()
}

#[test]
fn meshed_pod_add_installs_the_reference_rules_in_both_modes() {
    for mode in ["legacy", "nft"] {
        let n = node();
        let ns = TestNetns::new("acc-add").unwrap();
        n.api.add_pod(&Pod::meshed("emojivoto", "web-0"));
        n.api.add_namespace("emojivoto", &[]);
        let conf = netconf(&n.kubeconfig, json!({"iptables-mode": mode}));
        let env = cni_env("ADD", ns.path(), Some(("emojivoto", "web-0")));

        let o = run_plugin(&env, &conf);
        assert_prev_result_printed(&o, &conf);
        let save = format!("iptables-{mode}-save");
        assert_eq!(nat_table(&ns, &save), default_save(), "mode {mode}");

        // A second ADD (a runtime retry) leaves exactly the same rules.
        let o = run_plugin(&env, &conf);
        assert_prev_result_printed(&o, &conf);
        assert_eq!(nat_table(&ns, &save), default_save(), "mode {mode}");

        // CHECK agrees; DEL is a no-op that succeeds.
        let o = run_plugin(
            &cni_env("CHECK", ns.path(), Some(("emojivoto", "web-0"))),
            &conf,
        );
        assert_ok(&o);
        assert!(o.stdout.is_empty());
        let o = run_plugin(
            &cni_env("DEL", ns.path(), Some(("emojivoto", "web-0"))),
            &conf,
        );
        assert_ok(&o);
        assert_eq!(
            nat_table(&ns, &save),
            default_save(),
            "DEL leaves the rules"
        );
    }
}

#[test]
fn check_reports_a_deleted_rule() {
    let n = node();
    let ns = TestNetns::new("acc-chk").unwrap();
    n.api.add_pod(&Pod::meshed("emojivoto", "web-0"));
    n.api.add_namespace("emojivoto", &[]);
    let conf = netconf(&n.kubeconfig, json!({"iptables-mode": "nft"}));
    assert_ok(&run_plugin(
        &cni_env("ADD", ns.path(), Some(("emojivoto", "web-0"))),
        &conf,
    ));

    delete_rule(
        &ns,
        "iptables-nft",
        "PROXY_INIT_REDIRECT",
        "-p tcp -m comment --comment \"proxy-init/redirect-all-incoming-to-proxy-port\" -j REDIRECT --to-ports 4143",
    );
    let o = run_plugin(
        &cni_env("CHECK", ns.path(), Some(("emojivoto", "web-0"))),
        &conf,
    );
    assert!(!o.status.success());
    let e = stdout_json(&o);
    assert_eq!(e["code"], 103);
    assert_eq!(e["cniVersion"], "0.3.1");
    assert!(
        e["msg"].as_str().unwrap().contains("emojivoto/web-0"),
        "{e}"
    );
    let details = e["details"].as_str().unwrap();
    assert!(
        details.contains("PROXY_INIT_REDIRECT lacks rule: -p tcp -m comment --comment \"proxy-init/redirect-all-incoming-to-proxy-port\""),
        "{details}"
    );
}

#[test]
fn unmeshed_pod_gets_no_rules() {
    let n = node();
    let ns = TestNetns::new("acc-plain").unwrap();
    n.api.add_pod(&Pod::new("emojivoto", "vote-bot-0"));
    let conf = netconf(&n.kubeconfig, json!({}));
    let o = run_plugin(
        &cni_env("ADD", ns.path(), Some(("emojivoto", "vote-bot-0"))),
        &conf,
    );
    assert_prev_result_printed(&o, &conf);
    assert_eq!(nat_table(&ns, "iptables-legacy-save"), untouched());
    assert_eq!(nat_table(&ns, "iptables-nft-save"), untouched());
    let o = run_plugin(
        &cni_env("CHECK", ns.path(), Some(("emojivoto", "vote-bot-0"))),
        &conf,
    );
    assert_ok(&o);
}

#[test]
fn exempt_pod_passes_with_the_api_down_and_no_call() {
    let mut n = node();
    n.api.stop();
    let ns = TestNetns::new("acc-exempt").unwrap();
    let conf = netconf(&n.kubeconfig, json!({}));
    for namespace in ["linkerd-cni", "kube-system"] {
        let o = run_plugin(&cni_env("ADD", ns.path(), Some((namespace, "x-0"))), &conf);
        assert_prev_result_printed(&o, &conf);
    }
    assert_eq!(n.api.connections(), 0);
    assert_eq!(nat_table(&ns, "iptables-legacy-save"), untouched());
}

#[test]
fn meshed_pod_with_the_api_down_fails_within_the_budget() {
    let mut n = node();
    n.api.stop();
    let ns = TestNetns::new("acc-down").unwrap();
    let conf = netconf(&n.kubeconfig, json!({}));
    let start = Instant::now();
    let o = run_plugin(
        &cni_env("ADD", ns.path(), Some(("emojivoto", "web-0"))),
        &conf,
    );
    let took = start.elapsed();
    assert!(!o.status.success());
    let e = stdout_json(&o);
    // Transient: "try again later".
    assert_eq!(e["code"], 11);
    let msg = e["msg"].as_str().unwrap();
    assert!(msg.contains("cannot reach the Kubernetes API"), "{msg}");
    assert!(msg.contains("emojivoto/web-0"), "{msg}");
    // The default budget is 10 s.
    assert!(took < Duration::from_secs(10), "took {took:?}");
    assert_eq!(nat_table(&ns, "iptables-legacy-save"), untouched());
}

#[test]
fn simulate_applies_nothing() {
    let n = node();
    let ns = TestNetns::new("acc-sim").unwrap();
    n.api.add_pod(&Pod::meshed("emojivoto", "web-0"));
    n.api.add_namespace("emojivoto", &[]);
    let conf = netconf(&n.kubeconfig, json!({"simulate": true}));
    let mut conf_info = conf.clone();
    conf_info["log_level"] = json!("info");
    let o = run_plugin(
        &cni_env("ADD", ns.path(), Some(("emojivoto", "web-0"))),
        &conf_info,
    );
    assert_prev_result_printed(&o, &conf_info);
    assert!(
        stderr(&o).contains("-A PROXY_INIT_OUTPUT -o lo"),
        "{}",
        stderr(&o)
    );
    assert_eq!(nat_table(&ns, "iptables-legacy-save"), untouched());
}

#[test]
fn status_succeeds_even_without_a_usable_kubeconfig() {
    let dir = TempDir::new("acc-status").unwrap();
    let ns_path = std::path::Path::new("/run/netns/unused");
    for kubeconfig in [dir.path().join("missing"), dir.path().join("garbage")] {
        std::fs::write(dir.path().join("garbage"), "{{{").unwrap();
        let mut conf = netconf(&kubeconfig, json!({}));
        conf["cniVersion"] = json!("1.1.0");
        conf.as_object_mut().unwrap().remove("prevResult");
        let o = run_plugin(&cni_env("STATUS", ns_path, None), &conf);
        assert_ok(&o);
        assert!(o.stdout.is_empty());
        assert!(stderr(&o).contains("STATUS: kubeconfig"), "{}", stderr(&o));
        let o = run_plugin(&cni_env("GC", ns_path, None), &conf);
        assert_ok(&o);
    }
}

#[test]
fn malformed_annotation_fails_the_add_with_code_102() {
    let n = node();
    let ns = TestNetns::new("acc-ann").unwrap();
    n.api.add_pod(
        &Pod::meshed("emojivoto", "web-0").annotation("config.linkerd.io/proxy-gid", "wheel"),
    );
    n.api.add_namespace("emojivoto", &[]);
    let conf = netconf(&n.kubeconfig, json!({}));
    let o = run_plugin(
        &cni_env("ADD", ns.path(), Some(("emojivoto", "web-0"))),
        &conf,
    );
    assert!(!o.status.success());
    let e = stdout_json(&o);
    assert_eq!(e["code"], 102);
    assert!(
        e["msg"]
            .as_str()
            .unwrap()
            .contains("config.linkerd.io/proxy-gid=\"wheel\""),
        "{e}"
    );
}

/// Runs the plugin in a private mount namespace with an empty tmpfs over
/// `/usr/sbin` (where Debian keeps every iptables binary; `/sbin` links
/// there): a node without the host's iptables.
fn run_plugin_without_iptables(env: &[(String, String)], conf: &Value) -> std::process::Output {
    common::run_in_mount_ns("mount -t tmpfs none /usr/sbin", &[], env, conf)
}

#[test]
fn nft_mode_needs_no_iptables_binary_on_the_node() {
    let n = node();
    n.api.add_pod(&Pod::meshed("emojivoto", "web-0"));
    n.api.add_namespace("emojivoto", &[]);
    let env = |cmd, ns: &TestNetns| cni_env(cmd, ns.path(), Some(("emojivoto", "web-0")));

    let ns = TestNetns::new("acc-nobin").unwrap();
    let conf = netconf(&n.kubeconfig, json!({"iptables-mode": "nft", "ipv6": true}));
    let o = run_plugin_without_iptables(&env("ADD", &ns), &conf);
    assert_prev_result_printed(&o, &conf);
    assert_eq!(nat_table(&ns, "iptables-nft-save"), default_save());
    assert_eq!(nat_table(&ns, "ip6tables-nft-save"), default_save());
    // A retry, then CHECK, still without binaries.
    assert_prev_result_printed(&run_plugin_without_iptables(&env("ADD", &ns), &conf), &conf);
    assert_eq!(nat_table(&ns, "iptables-nft-save"), default_save());
    assert_ok(&run_plugin_without_iptables(&env("CHECK", &ns), &conf));
    delete_rule(
        &ns,
        "iptables-nft",
        "PROXY_INIT_OUTPUT",
        "-o lo -m comment --comment \"proxy-init/ignore-loopback\" -j RETURN",
    );
    let o = run_plugin_without_iptables(&env("CHECK", &ns), &conf);
    assert_eq!(stdout_json(&o)["code"], 103, "{}", stderr(&o));

    // The binaries really are hidden: legacy mode has nothing to run.
    let ns = TestNetns::new("acc-nobin").unwrap();
    let conf = netconf(&n.kubeconfig, json!({"iptables-mode": "legacy"}));
    let o = run_plugin_without_iptables(&env("ADD", &ns), &conf);
    let e = stdout_json(&o);
    assert_eq!(e["code"], 101, "{e}");
    assert!(
        e.to_string().contains("install iptables on the node"),
        "{e}"
    );
}
