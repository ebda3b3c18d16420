//! `chain_mode: auto` with the real installer binary: the runtime's
//! settings, laid out under the node's host mount as the DaemonSet mounts
//! them, select owned mode only where they prove the runtime loads the
//! first config file alone; the log, the persisted entry and `check` say
//! which mode and why. Owned mode forced against such settings is warned
//! about every pass and in `check`; a sandbox attached twice to one
//! network (libcni's result cache) makes `check` fail.
//!
//! The case-by-case rules (each setting, imports, drop-ins) are the
//! runtime module's table tests; these show the binary acting on them.

mod common;

use std::fs;
use std::time::Duration;

use serde_json::{Value, json};

use common::*;

const RESYNC: Duration = Duration::from_secs(1);
const AUTO: &[(&str, &str)] = &[
    ("LINKERD_CNI_RESYNC_SECONDS", "1"),
    ("LINKERD_CNI_CHAIN_MODE", "auto"),
];
const OURS: &str = "10-calico-linkerd-cni.conflist";

/// Writes `text` at host path `path` on `node` (under its mount prefix).
fn host_file(node: &Node, path: &str, text: &str) {
    let p = node.prefix.join(path.trim_start_matches('/'));
    fs::create_dir_all(p.parent().unwrap()).unwrap();
    fs::write(p, text).unwrap();
}

fn persisted_entry(node: &Node) -> Option<Value> {
    serde_json::from_str(&fs::read_to_string(node.conf(ENTRY_FILE)).ok()?).ok()
}

/// Starts the installer in auto mode on a node holding a Calico config;
/// waits until the persisted entry says which mode, and returns it with
/// the installer.
fn start_auto(node: &Node) -> (Installer, Value) {
    node.write_by_rename("10-calico.conflist", &calico_text(0));
    let inst = node.start(AUTO);
    assert!(
        wait_until(RESYNC + GRACE, || persisted_entry(node).is_some()
            && node.healthy().is_ok()),
        "{}",
        inst.log()
    );
    let entry = persisted_entry(node).unwrap();
    (inst, entry)
}

fn check(node: &Node, extra: &[(&str, &str)]) -> (Option<i32>, String) {
    let out = node.run(&["check"], extra);
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

const CRI_1X: &str = "[plugins.\"io.containerd.grpc.v1.cri\".cni]\n";

#[test]
fn containerd_loading_the_first_file_alone_selects_owned() {
    // k3s's path, a drop-in through a glob import setting max_conf_num 1.
    let node = Node::new("auto-owned");
    host_file(
        &node,
        "/var/lib/rancher/k3s/agent/etc/containerd/config.toml",
        "version = 2\nimports = [\"/var/lib/rancher/k3s/agent/etc/containerd/conf.d/*.toml\"]\n",
    );
    host_file(
        &node,
        "/var/lib/rancher/k3s/agent/etc/containerd/conf.d/10-cni.toml",
        &format!("{CRI_1X}max_conf_num = 1\n"),
    );
    let (inst, entry) = start_auto(&node);
    assert_eq!(entry["chain_mode"], "owned", "{entry}");
    let why = entry["chain_mode_reason"].as_str().unwrap_or_default();
    assert!(
        why.contains(
            "max_conf_num is 1 (in /var/lib/rancher/k3s/agent/etc/containerd/conf.d/10-cni.toml"
        ),
        "{why}"
    );
    assert!(
        wait_until(RESYNC + GRACE, || node
            .active()
            .is_some_and(|a| a.ends_with(OURS))),
        "{}",
        inst.log()
    );
    assert!(
        inst.log().contains(
            "chain mode owned: LINKERD_CNI_CHAIN_MODE=auto: containerd's max_conf_num is 1"
        ),
        "{}",
        inst.log()
    );
    let (code, out) = check(&node, AUTO);
    assert_eq!(code, Some(0), "{out}");
    assert!(
        out.contains("mode: owned (LINKERD_CNI_CHAIN_MODE=auto: containerd"),
        "{out}"
    );

    // Unset is the default, 1: owned as well.
    let node = Node::new("auto-unset");
    host_file(
        &node,
        "/etc/containerd/config.toml",
        &format!("version = 2\n{CRI_1X}conf_dir = \"/etc/cni/net.d\"\n"),
    );
    let (_inst, entry) = start_auto(&node);
    assert_eq!(entry["chain_mode"], "owned", "{entry}");
    assert!(
        entry["chain_mode_reason"]
            .as_str()
            .unwrap_or_default()
            .contains("unset (default 1"),
        "{entry}"
    );
}

#[test]
fn containerd_loading_several_files_selects_inline() {
    for (tag, n) in [("zero", 0), ("two", 2)] {
        let node = Node::new(&format!("auto-{tag}"));
        // The main file says 1; its drop-in overrides it.
        host_file(
            &node,
            "/etc/containerd/config.toml",
            &format!("version = 2\nimports = [\"conf.d/*.toml\"]\n{CRI_1X}max_conf_num = 1\n"),
        );
        host_file(
            &node,
            "/etc/containerd/conf.d/50-all.toml",
            &format!(
                "version = 3\n[plugins.'io.containerd.cri.v1.runtime'.cni]\nmax_conf_num = {n}\n"
            ),
        );
        let (inst, entry) = start_auto(&node);
        assert_eq!(entry["chain_mode"], "inline", "{entry}");
        let why = entry["chain_mode_reason"].as_str().unwrap_or_default();
        assert!(
            why.contains(&format!(
                "max_conf_num is {n} (in /etc/containerd/conf.d/50-all.toml)"
            )),
            "{why}"
        );
        // Inline: our entry in the primary's file, no file of ours.
        assert_eq!(node.active().unwrap(), node.conf("10-calico.conflist"));
        assert!(!node.conf(OURS).exists());
        let (code, out) = check(&node, AUTO);
        assert_eq!(code, Some(0), "{out}\n{}", inst.log());
        assert!(
            out.contains(&format!(
                "mode: inline (LINKERD_CNI_CHAIN_MODE=auto: containerd's max_conf_num is {n}"
            )),
            "{out}"
        );
    }
}

#[test]
fn crio_pinning_the_default_network_selects_inline() {
    let node = Node::new("auto-crio");
    host_file(
        &node,
        "/etc/crio/crio.conf",
        "[crio.network]\nnetwork_dir = \"/etc/cni/net.d/\"\n",
    );
    host_file(
        &node,
        "/etc/crio/crio.conf.d/10-network.conf",
        "[crio.network]\ncni_default_network = \"k8s-pod-network\"\n",
    );
    let (_inst, entry) = start_auto(&node);
    assert_eq!(entry["chain_mode"], "inline", "{entry}");
    let why = entry["chain_mode_reason"].as_str().unwrap_or_default();
    assert!(why.contains("CRI-O's cni_default_network is \"k8s-pod-network\" (in /etc/crio/crio.conf.d/10-network.conf)"), "{why}");
}

#[test]
fn unreadable_or_missing_settings_select_inline_and_say_why() {
    // Nothing mounted at all.
    let node = Node::new("auto-none");
    let (inst, entry) = start_auto(&node);
    assert_eq!(entry["chain_mode"], "inline", "{entry}");
    assert!(
        inst.log().contains(
            "chain mode inline: LINKERD_CNI_CHAIN_MODE=auto: no containerd or CRI-O settings found"
        ),
        "{}",
        inst.log()
    );

    // A config that cannot be read (a directory in its place) and one that
    // cannot be parsed.
    for (tag, make, want) in [
        (
            "dir",
            (|n: &Node| fs::create_dir_all(n.prefix.join("etc/containerd/config.toml")).unwrap())
                as fn(&Node),
            "cannot read /etc/containerd/config.toml",
        ),
        (
            "garbled",
            |n: &Node| {
                host_file(
                    n,
                    "/etc/containerd/config.toml",
                    "[plugins\nmax_conf_num = 1\n",
                )
            },
            "cannot parse /etc/containerd/config.toml (line 1)",
        ),
    ] {
        let node = Node::new(&format!("auto-{tag}"));
        make(&node);
        let (inst, entry) = start_auto(&node);
        assert_eq!(entry["chain_mode"], "inline", "{entry}");
        assert!(inst.log().contains(want), "{}", inst.log());
        let (code, out) = check(&node, AUTO);
        assert_eq!(code, Some(0), "{out}");
        assert!(out.contains(want), "{out}");
    }
}

#[test]
fn owned_forced_against_the_settings_warns_every_pass_and_in_check() {
    let node = Node::new("auto-forced");
    host_file(
        &node,
        "/etc/containerd/config.toml",
        &format!("{CRI_1X}max_conf_num = 0\n"),
    );
    node.write_by_rename("10-calico.conflist", &calico_text(0));
    let forced = [
        ("LINKERD_CNI_RESYNC_SECONDS", "0.3"),
        ("LINKERD_CNI_CHAIN_MODE", "owned"),
    ];
    let inst = node.start(&forced);
    let warning = "owned chain mode is forced, but the runtime's settings do not show";
    // Every pass, not once: three passes' worth.
    assert!(
        wait_until(RESYNC * 3 + GRACE, || inst.log().matches(warning).count()
            >= 3),
        "{}",
        inst.log()
    );
    assert!(
        inst.log()
            .contains("max_conf_num is 0 (in /etc/containerd/config.toml)"),
        "{}",
        inst.log()
    );
    assert!(wait_until(RESYNC + GRACE, || node
        .active()
        .is_some_and(|a| a.ends_with(OURS))));
    let (code, out) = check(&node, &forced);
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains(&format!("warning: {warning}")), "{out}");
    assert!(
        out.contains("mode: owned (set by LINKERD_CNI_CHAIN_MODE)"),
        "{out}"
    );
}

/// libcni's result cache entry for one attachment.
fn cache_entry(node: &Node, id: &str, ifname: &str) {
    let net = "k8s-pod-network";
    host_file(
        node,
        &format!("/var/lib/cni/results/{net}-{id}-{ifname}"),
        &json!({
            "kind": "cniCacheV1",
            "containerId": id,
            "ifName": ifname,
            "networkName": net,
            "config": "",
            "result": {"cniVersion": "1.0.0", "interfaces": [], "ips": []}
        })
        .to_string(),
    );
}

#[test]
fn a_sandbox_attached_twice_to_one_network_fails_check() {
    let node = Node::new("auto-twice");
    host_file(&node, "/etc/containerd/config.toml", "");
    let id = "0123456789abcdef";
    cache_entry(&node, id, "eth0");
    cache_entry(&node, "fedcba9876543210", "eth0");
    let (inst, _) = start_auto(&node);
    let (code, out) = check(&node, AUTO);
    assert_eq!(code, Some(0), "one attachment each: {out}");
    cache_entry(&node, id, "eth1");
    let (code, out) = check(&node, AUTO);
    assert_eq!(code, Some(1), "{out}");
    let want =
        format!("sandbox {id} is attached to network \"k8s-pod-network\" 2 times (eth0, eth1)");
    assert!(out.contains(&want), "{out}");
    assert!(
        wait_until(RESYNC + GRACE, || inst.log().contains(&want)),
        "{}",
        inst.log()
    );
}

#[test]
fn a_runtime_settings_change_switches_the_mode_before_the_resync() {
    // containerd restarted from max_conf_num 1 to 0 (and back), through a
    // drop-in its imports pull in and through its main file: the mode
    // follows at once, not at the next resync, since pods started in
    // between would be attached to the primary's network twice.
    let node = Node::new("auto-follow");
    let main = |n: u32| {
        format!("version = 2\nimports = [\"conf.d/*.toml\"]\n{CRI_1X}max_conf_num = {n}\n")
    };
    host_file(&node, "/etc/containerd/config.toml", &main(1));
    fs::create_dir_all(node.prefix.join("etc/containerd/conf.d")).unwrap();
    node.write_by_rename("10-calico.conflist", &calico_text(0));
    let slow = [
        ("LINKERD_CNI_RESYNC_SECONDS", "60"),
        ("LINKERD_CNI_CHAIN_MODE", "auto"),
    ];
    let inst = node.start(&slow);
    let mode = |want: &str| persisted_entry(&node).is_some_and(|e| e["chain_mode"] == want);
    let owned = || mode("owned") && node.active().is_some_and(|a| a.ends_with(OURS));
    let inline = || {
        mode("inline")
            && !node.conf(OURS).exists()
            && node.active() == Some(node.conf("10-calico.conflist"))
            && node.healthy().is_ok()
    };
    // Far below the resync (60 s): only the watch can explain a switch.
    let bound = Duration::from_secs(5);
    // The installer's own writes (the entry, our file) wake a whole pass
    // of their own, debounced up to a second; a change made before that
    // pass would be found by it, watch or not. So each change waits for
    // the installer to be quiet.
    let quiet = || std::thread::sleep(Duration::from_secs(2));
    assert!(wait_until(bound, owned), "{}", inst.log());
    quiet();

    // A new drop-in, written as a tool writes it (by rename).
    let drop_in = node.prefix.join("etc/containerd/conf.d/50-all.toml");
    let tmp = node.prefix.join("etc/containerd/conf.d/.50-all.toml.tmp");
    fs::write(&tmp, format!("{CRI_1X}max_conf_num = 0\n")).unwrap();
    fs::rename(&tmp, &drop_in).unwrap();
    assert!(wait_until(bound, inline), "{}", inst.log());
    assert!(
        inst.log().contains(
            "chain mode inline: LINKERD_CNI_CHAIN_MODE=auto: containerd's max_conf_num is 0 \
             (in /etc/containerd/conf.d/50-all.toml)"
        ),
        "{}",
        inst.log()
    );

    // The drop-in removed: owned again. The main file rewritten in place
    // with 0: inline again.
    quiet();
    fs::remove_file(&drop_in).unwrap();
    assert!(wait_until(bound, owned), "{}", inst.log());
    quiet();
    host_file(&node, "/etc/containerd/config.toml", &main(0));
    assert!(wait_until(bound, inline), "{}", inst.log());
}
