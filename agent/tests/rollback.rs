//! Rolling back to upstream's linkerd-cni, in both chain modes, with the
//! real installer binary and a stand-in for upstream's installer: each
//! procedure of docs/operations.md ("Roll back to upstream") ends with
//! upstream's installer in charge, the runtime loading the primary's own
//! file (with upstream's entry in it), and no config file of ours left.
//!
//! The API server these tests run is none (see `common`): at SIGTERM the
//! installer cannot tell whether its DaemonSet is being deleted and leaves
//! the node as it is, as it does on a rolling update; the uninstall path
//! is the one `LINKERD_CNI_UNINSTALL_ON_EXIT=true` takes.

mod common;

use std::fs;
use std::time::Duration;

use nix::sys::signal::Signal;
use serde_json::{Value, json};

use common::*;
use testkit::names::file_names;

const RESYNC: Duration = Duration::from_secs(1);
const OWNED: &[(&str, &str)] = &[
    ("LINKERD_CNI_RESYNC_SECONDS", "1"),
    ("LINKERD_CNI_CHAIN_MODE", "owned"),
];
const INLINE: &[(&str, &str)] = &[
    ("LINKERD_CNI_RESYNC_SECONDS", "1"),
    ("LINKERD_CNI_CHAIN_MODE", "inline"),
];
const PRIMARY: &str = "10-calico.conflist";
const OUR_COPY: &str = "10-calico-linkerd-cni.conflist";

/// The entry upstream's chart renders (its ConfigMap, placeholders
/// substituted), `policy` block included.
fn upstream_entry() -> Value {
    json!({
        "name": "linkerd-cni",
        "type": "linkerd-cni",
        "log_level": "info",
        "policy": {
            "type": "k8s",
            "k8s_api_root": "https://__KUBERNETES_SERVICE_HOST__:__KUBERNETES_SERVICE_PORT__",
            "k8s_auth_token": "__SERVICEACCOUNT_TOKEN__"
        },
        "kubernetes": { "kubeconfig": "/etc/cni/net.d/ZZZ-linkerd-cni-kubeconfig" },
        "linkerd": {
            "incoming-proxy-port": 4143,
            "outgoing-proxy-port": 4140,
            "proxy-uid": 2102,
            "ports-to-redirect": [],
            "inbound-ports-to-ignore": ["4191", "4190"],
            "simulate": false,
            "use-wait-flag": false
        }
    })
}

/// What upstream's installer does to a conf dir when it starts: every
/// `*.conflist` gets its linkerd-cni entry last (any linkerd-cni entry
/// there replaced), every `*.conf` becomes a `.conflist` holding that
/// plugin then the entry; each written by rename. It knows nothing of
/// owned mode and leaves every other file alone.
fn upstream_installer(node: &Node) {
    for name in file_names(&node.conf_dir) {
        let is_list = name.ends_with(".conflist");
        if !is_list && !name.ends_with(".conf") {
            continue;
        }
        let text = fs::read_to_string(node.conf(&name)).unwrap();
        let v: Value = serde_json::from_str(&text).unwrap();
        let (target, mut list) = if is_list {
            (name.clone(), v)
        } else {
            let stem = name.trim_end_matches(".conf");
            (
                format!("{stem}.conflist"),
                json!({ "name": v["name"], "cniVersion": v["cniVersion"], "plugins": [v] }),
            )
        };
        let plugins = list["plugins"].as_array_mut().unwrap();
        plugins.retain(|p| p["type"] != "linkerd-cni");
        plugins.push(upstream_entry());
        node.write_by_rename(&target, &serde_json::to_string_pretty(&list).unwrap());
        if target != name {
            fs::remove_file(node.conf(&name)).unwrap();
        }
    }
}

/// Upstream's installer in charge: the runtime loads the primary's own
/// file, which is the primary's chain with upstream's entry last; no file
/// in the conf dir is a config of ours (our copy, by name or by marker).
/// Besides the configs, only upstream's kubeconfig (a name upstream shares)
/// and, where listed in `also`, files of ours no runtime loads.
fn upstream_in_charge(node: &Node, also: &[&str]) -> Result<(), String> {
    let names = file_names(&node.conf_dir);
    let active = node.active().ok_or("no active config")?;
    let active = active.file_name().unwrap().to_string_lossy().into_owned();
    if active != PRIMARY {
        return Err(format!(
            "the runtime loads {active}, not {PRIMARY}: {names:?}"
        ));
    }
    let v = node.read_conflist(PRIMARY).ok_or("primary unreadable")?;
    let mut want = calico(0);
    want["plugins"]
        .as_array_mut()
        .unwrap()
        .push(upstream_entry());
    if v != want {
        return Err(format!("{PRIMARY} is not calico + upstream's entry: {v}"));
    }
    for n in &names {
        let text = fs::read_to_string(node.conf(n)).unwrap_or_default();
        if n.ends_with("-linkerd-cni.conflist") || text.contains("owned_copy_of") {
            return Err(format!("{n} of ours is left: {names:?}"));
        }
    }
    let mut expected: Vec<&str> = vec![PRIMARY, KUBECONFIG_NAME];
    expected.extend(also);
    expected.sort();
    if names != expected {
        return Err(format!("conf dir holds {names:?}, expected {expected:?}"));
    }
    Ok(())
}

/// Upstream's kubeconfig, as its installer writes it over ours.
fn upstream_kubeconfig(node: &Node) {
    node.write_by_rename(KUBECONFIG_NAME, "# upstream's kubeconfig\n");
}

/// SIGTERM, and the exit within a bound: an uninstall keeps the binary a
/// few seconds for pod starts already on their way.
fn stop(mut inst: Installer) {
    inst.signal(Signal::SIGTERM);
    let status = inst
        .wait_exit(Duration::from_secs(15))
        .unwrap_or_else(|| panic!("still running after SIGTERM\n{}", inst.log()));
    assert!(status.success(), "{status:?}\n{}", inst.log());
}

fn owned_node(tag: &str) -> (Node, Installer) {
    let node = Node::new(tag);
    node.write_by_rename(PRIMARY, &calico_text(0));
    let inst = node.start(OWNED);
    assert!(
        wait_until(RESYNC + GRACE, || node
            .active()
            .is_some_and(|a| a.ends_with(OUR_COPY))
            && node.healthy().is_ok()
            && settled(&node.conf_dir)),
        "{:?}\n{}",
        file_names(&node.conf_dir),
        inst.log()
    );
    (node, inst)
}

/// Inline mode: the rollout replaces our installer (which leaves the node
/// chained at SIGTERM) with upstream's, which takes the entry over.
#[test]
fn rollback_from_inline_mode() {
    let node = Node::new("rollback-inline");
    node.write_by_rename(PRIMARY, &calico_text(0));
    let inst = node.start(INLINE);
    node.wait_healthy(RESYNC + GRACE).unwrap();
    stop(inst);
    upstream_installer(&node);
    upstream_kubeconfig(&node);
    upstream_in_charge(&node, &[ENTRY_FILE]).unwrap();
}

/// Owned mode, procedure 1: a rollout with `LINKERD_CNI_CHAIN_MODE=inline`
/// (each old installer leaves the node at SIGTERM, each new one moves our
/// entry into the primary's file and then removes our copy), `check` says
/// inline and ready; then the rollback as in inline mode.
#[test]
fn rollback_from_owned_mode_through_inline() {
    let (node, inst) = owned_node("rollback-owned-inline");
    stop(inst);
    let inst = node.start(INLINE);
    assert!(
        wait_until(RESYNC + GRACE, || !node.conf(OUR_COPY).exists()
            && node.healthy().is_ok()
            && settled(&node.conf_dir)),
        "{:?}\n{}",
        file_names(&node.conf_dir),
        inst.log()
    );
    let out = node.run(&["check"], INLINE);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("mode: inline"), "{text}");
    stop(inst);
    upstream_installer(&node);
    upstream_kubeconfig(&node);
    upstream_in_charge(&node, &[ENTRY_FILE]).unwrap();
}

/// Owned mode, procedure 2: uninstall (`LINKERD_CNI_UNINSTALL_ON_EXIT=true`
/// at SIGTERM, as when the DaemonSet is deleted), then upstream's install.
#[test]
fn rollback_from_owned_mode_by_uninstalling() {
    let (node, inst) = owned_node("rollback-owned-uninstall");
    stop(inst);
    let uninstall = [
        ("LINKERD_CNI_RESYNC_SECONDS", "1"),
        ("LINKERD_CNI_CHAIN_MODE", "owned"),
        ("LINKERD_CNI_UNINSTALL_ON_EXIT", "true"),
    ];
    let inst = node.start(&uninstall);
    // Signals are its own once it says it is starting.
    assert!(inst.wait_log("starting:", RESYNC + GRACE), "{}", inst.log());
    node.wait_healthy(RESYNC + GRACE).unwrap();
    stop(inst);
    assert_eq!(file_names(&node.conf_dir), vec![PRIMARY]);
    upstream_installer(&node);
    upstream_kubeconfig(&node);
    upstream_in_charge(&node, &[]).unwrap();
}

/// Why owned mode needs one of the procedures above: straight from owned
/// mode, upstream's installer patches our copy too, which still sorts
/// first, so the runtime keeps loading a copy nothing keeps in sync.
#[test]
fn rolling_back_straight_from_owned_mode_leaves_our_copy_loaded() {
    let (node, inst) = owned_node("rollback-owned-straight");
    stop(inst);
    upstream_installer(&node);
    upstream_kubeconfig(&node);
    let e = upstream_in_charge(&node, &[ENTRY_FILE]).unwrap_err();
    assert!(e.contains(&format!("loads {OUR_COPY}")), "{e}");
    // The repair by hand: an installer that replaces linkerd-cni entries,
    // as this stand-in does, took our marker with ours, so the copy goes
    // by its name.
    let copy = fs::read_to_string(node.conf(OUR_COPY)).unwrap();
    assert!(!copy.contains("owned_copy_of"), "{copy}");
    fs::remove_file(node.conf(OUR_COPY)).unwrap();
    upstream_in_charge(&node, &[ENTRY_FILE]).unwrap();
}
