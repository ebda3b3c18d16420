//! linkerd-cni alone through libcni: VERSION negotiation for every spec
//! version, ADD/CHECK/DEL of a list holding only linkerd-cni at each, and
//! our CNI errors as libcni decodes them.

use conformance::chains::{self, ALL_VERSIONS};
use conformance::{Node, PodSpec};
use serde_json::{Value, json};

fn has_check(version: &str) -> bool {
    !matches!(version, "0.1.0" | "0.2.0" | "0.3.0" | "0.3.1")
}

fn alone(node: &Node, label: &str, version: &str, entry: Value) -> String {
    let net = node.network_name(label);
    node.write_conf(
        &format!("10-{net}.conflist"),
        &chains::conflist(&net, version, vec![entry]),
    );
    net
}

fn entry(node: &Node) -> Value {
    let mut e = chains::linkerd_entry(node);
    e["chain_heal"] = false.into();
    e
}

#[test]
fn get_version_info_lists_every_spec_version() {
    let node = Node::new();
    let info = node.version_info("linkerd-cni").unwrap();
    let v = info.json();
    assert_eq!(v["supportedVersions"], json!(ALL_VERSIONS), "{info:?}");
    // libcni asked in its own version and got an answer in it.
    let [exec] = info.trace.as_slice() else {
        panic!("one VERSION execution expected: {info:?}")
    };
    assert_eq!(exec.command, "VERSION");
    assert_eq!(exec.stdin["cniVersion"], v["requested"]);
    assert_eq!(exec.stdout_json().unwrap()["cniVersion"], v["requested"]);
}

#[test]
fn every_spec_version_negotiates_and_runs() {
    let node = Node::new();
    // Debian's libcni (1.1.x) predates spec 1.1.0 and refuses a 1.1.0
    // result, whoever prints it; a newer libcni would parse it.
    let libcni_versions =
        node.version_info("linkerd-cni").unwrap().json()["libcniVersions"].clone();
    let libcni_parses_results_of = |v: &str| {
        libcni_versions
            .as_array()
            .is_some_and(|a| a.iter().any(|x| x == v))
    };
    for version in ALL_VERSIONS {
        let net = alone(
            &node,
            &format!("v{}", version.replace('.', "")),
            version,
            entry(&node),
        );
        // libcni's negotiation: VERSION, then the list's version must be
        // among the answered ones.
        node.validate(&net)
            .unwrap_or_else(|e| panic!("{version}: validation: {e}"));

        let pod = node.pod(PodSpec::kubernetes("kube-system", "coredns-1"));
        let added = node.add(&net, &pod);
        let ours = match &added {
            Ok(c) => c.execs("linkerd-cni").next().cloned(),
            Err(f) => f.execs("linkerd-cni").next().cloned(),
        }
        .unwrap_or_else(|| panic!("{version}: linkerd-cni was not run: {added:?}"));
        assert_eq!(ours.error, None, "{version}: {added:?}");
        // Nothing before us: a well-formed empty result of the list's version.
        let printed = ours.stdout_json().expect("a JSON result");
        assert_eq!(printed["cniVersion"], version);
        assert!(
            printed.get("ips").is_none_or(|ips| ips == &json!([])),
            "{version}: {printed}"
        );
        if libcni_parses_results_of(version) {
            let result = added
                .unwrap_or_else(|e| panic!("{version}: ADD: {e}"))
                .json();
            assert_eq!(result["cniVersion"], version);
        } else {
            let failed = added.unwrap_err();
            assert!(
                failed.error.contains("unsupported CNI result version"),
                "{version}: expected libcni's own refusal, got {failed}"
            );
        }
        if has_check(version) && libcni_parses_results_of(version) {
            node.check(&net, &pod)
                .unwrap_or_else(|e| panic!("{version}: CHECK: {e}"));
        } else if has_check(version) {
            // libcni cached no result, so CHECK comes without prevResult,
            // which a chained plugin refuses (as the reference ones do).
            let failed = node.check(&net, &pod).unwrap_err();
            assert!(
                failed.error.contains("CHECK without prevResult"),
                "{version}: {failed}"
            );
        }
        node.del(&net, &pod)
            .unwrap_or_else(|e| panic!("{version}: DEL: {e}"));
        node.del(&net, &pod)
            .unwrap_or_else(|e| panic!("{version}: second DEL: {e}"));
    }
}

/// libcni decodes our error object exactly (code, msg, details), and a
/// runtime would see our code and message.
#[test]
fn our_errors_reach_libcni_as_cni_errors() {
    let node = Node::new();
    let bad_uid = {
        let mut e = entry(&node);
        e["linkerd"]["proxy-uid"] = "abc".into();
        e
    };
    let bad_mode = {
        let mut e = entry(&node);
        e["linkerd"]["iptables-mode"] = "ebpf".into();
        e
    };
    let cases: [(&str, &str, Value, u64, &str); 3] = [
        ("uid", "1.0.0", bad_uid, 7, "\"linkerd.proxy-uid\""),
        ("mode", "0.3.1", bad_mode, 7, "\"linkerd.iptables-mode\""),
        // A version we do not speak, in a list libcni does not validate.
        ("future", "9.9.9", entry(&node), 1, "9.9.9"),
    ];
    for (label, version, entry, code, needle) in cases {
        let net = alone(&node, label, version, entry);
        let pod = node.pod(PodSpec::bare());
        let failed = node
            .add(&net, &pod)
            .expect_err("ADD with a bad config must fail");
        assert_eq!(failed.code, Some(code), "{label}: {failed}");
        let msg = failed.msg.clone().unwrap_or_default();
        assert!(msg.contains(needle), "{label}: msg {msg:?} lacks {needle}");
        assert!(
            failed.error.starts_with("plugin type=\"linkerd-cni\""),
            "{label}: {failed}"
        );

        // Exactly what we printed, field by field: run the same input
        // again without libcni to see our bytes.
        let ours = failed.execs("linkerd-cni").next().expect("linkerd-cni ran");
        assert!(ours.error.is_some(), "{label}: {failed}");
        let replayed = node.replay(ours);
        assert!(!replayed.status.success(), "{label}: replay succeeded");
        let printed: Value = serde_json::from_slice(&replayed.stdout)
            .unwrap_or_else(|e| panic!("{label}: our stdout is no error object ({e})"));
        assert_eq!(printed["code"], code);
        assert_eq!(printed["msg"], msg.as_str());
        assert_eq!(
            printed.get("details").and_then(Value::as_str).unwrap_or(""),
            failed.details.as_deref().unwrap_or(""),
        );
        assert!(
            !failed.details.as_deref().unwrap_or("").is_empty(),
            "{label}: no details to act on: {failed}"
        );

        // The runtime's DEL after the failed ADD must not fail on the bad
        // config: a failing DEL would block the primary's.
        node.del(&net, &pod)
            .unwrap_or_else(|e| panic!("{label}: DEL: {e}"));
    }
}
