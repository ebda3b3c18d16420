//! Owned chain mode with the real installer binary: our own conflist in
//! front of the primary's, following it, going with it, switching modes on
//! a running node without an unchained moment, and uninstall leaving the
//! conf dir as it was.

mod common;

use std::collections::BTreeMap;
use std::fs;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::Duration;

use nix::sys::signal::Signal;
use serde_json::Value;

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
const OURS: &str = "10-calico-linkerd-cni.conflist";

fn snapshot(node: &Node) -> BTreeMap<String, Vec<u8>> {
    file_names(&node.conf_dir)
        .into_iter()
        .map(|n| {
            let b = fs::read(node.conf(&n)).unwrap();
            (n, b)
        })
        .collect()
}

/// Healthy and a copy of exactly this primary content.
fn owned_copy_of(node: &Node, primary: &Value) -> Result<(), String> {
    let v = node.healthy()?;
    let active = node.active().unwrap();
    if active.file_name().unwrap() != OURS {
        return Err(format!("active config is {}", active.display()));
    }
    if primary_part(&v) != *primary {
        return Err(format!("copy differs from the primary: {v}"));
    }
    Ok(())
}

#[test]
fn owned_mode_copies_follows_and_uninstalls_to_the_bytes() {
    let node = Node::new("owned-life");
    let text0 = calico_text(0);
    node.write_by_rename("10-calico.conflist", &text0);
    node.write_by_rename("99-other.conf", r#"{"name":"o","type":"bridge"}"#);
    let before = snapshot(&node);

    let mut inst = node.start(OWNED);
    assert!(wait_until(RESYNC + GRACE, || owned_copy_of(
        &node,
        &calico(0)
    )
    .is_ok()));
    // The primary's file was only read.
    assert_eq!(
        fs::read_to_string(node.conf("10-calico.conflist")).unwrap(),
        text0
    );

    // The primary rewrites its file: the copy follows.
    node.write_by_rename("10-calico.conflist", &calico_text(1));
    assert!(
        wait_until(RESYNC + GRACE, || owned_copy_of(&node, &calico(1)).is_ok()),
        "{:?}",
        owned_copy_of(&node, &calico(1))
    );
    node.write_in_place("10-calico.conflist", &calico_text(2));
    assert!(wait_until(RESYNC + GRACE, || owned_copy_of(
        &node,
        &calico(2)
    )
    .is_ok()));
    node.write_by_rename("10-calico.conflist", &text0);
    assert!(wait_until(RESYNC + GRACE, || owned_copy_of(
        &node,
        &calico(0)
    )
    .is_ok()));

    // `check` agrees.
    let out = node.run(&["check"], OWNED);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );

    inst.signal(Signal::SIGTERM);
    assert!(inst.wait_exit(Duration::from_secs(2)).unwrap().success());
    assert!(node.conf(OURS).exists(), "SIGTERM leaves everything");
    let out = node.run(&["uninstall"], OWNED);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(snapshot(&node), before);
}

#[test]
fn the_primary_gone_takes_our_file_at_once() {
    let node = Node::new("owned-gone");
    node.write_by_rename("10-calico.conflist", &calico_text(0));
    let _inst = node.start(&[
        ("LINKERD_CNI_RESYNC_SECONDS", "30"),
        ("LINKERD_CNI_CHAIN_MODE", "owned"),
    ]);
    assert!(wait_until(RESYNC + GRACE, || owned_copy_of(
        &node,
        &calico(0)
    )
    .is_ok()));
    fs::remove_file(node.conf("10-calico.conflist")).unwrap();
    // On the watch event, not the 30 s resync.
    assert!(
        wait_until(GRACE, || !node.conf(OURS).exists()),
        "{:?}",
        file_names(&node.conf_dir)
    );
    assert_eq!(node.active(), None);
    // The primary back: so is our copy.
    node.write_by_rename("10-calico.conflist", &calico_text(3));
    assert!(wait_until(GRACE, || owned_copy_of(&node, &calico(3)).is_ok()));
}

/// Samples the active config as fast as it can while `f` runs; returns
/// the unhealthy samples.
fn watch_active(node: &Node, f: impl FnOnce()) -> Vec<String> {
    let stop = Arc::new(AtomicBool::new(false));
    thread::scope(|s| {
        let stop2 = stop.clone();
        let h = s.spawn(move || {
            let mut bad = vec![];
            let mut n = 0u64;
            while !stop2.load(Ordering::Relaxed) {
                n += 1;
                if let Err(e) = node.healthy() {
                    // A file half-read during a rename is not an unchained
                    // moment: look again once.
                    if let Err(e2) = node.healthy() {
                        bad.push(format!("{e} / {e2}"));
                    } else {
                        let _ = e;
                    }
                }
            }
            assert!(n > 10, "sampled only {n} times");
            bad
        });
        f();
        stop.store(true, Ordering::Relaxed);
        h.join().unwrap()
    })
}

#[test]
fn switching_modes_on_a_running_node_never_unchains_it() {
    let node = Node::new("owned-switch");
    let text0 = calico_text(0);
    node.write_by_rename("10-calico.conflist", &text0);
    let mut inst = node.start(INLINE);
    node.wait_healthy(RESYNC + GRACE).unwrap();
    assert_eq!(file_names(&node.conf_dir).len(), 3);

    // inline -> owned
    let bad = watch_active(&node, || {
        inst.signal(Signal::SIGTERM);
        assert!(inst.wait_exit(Duration::from_secs(2)).unwrap().success());
        inst = node.start(OWNED);
        assert!(
            wait_until(RESYNC + GRACE, || {
                owned_copy_of(&node, &calico(0)).is_ok()
                    && fs::read_to_string(node.conf("10-calico.conflist")).unwrap() == text0
            }),
            "{:?}",
            file_names(&node.conf_dir)
        );
    });
    assert!(bad.is_empty(), "unchained moments: {bad:?}");

    // owned -> inline
    let bad = watch_active(&node, || {
        inst.signal(Signal::SIGTERM);
        assert!(inst.wait_exit(Duration::from_secs(2)).unwrap().success());
        inst = node.start(INLINE);
        assert!(
            wait_until(RESYNC + GRACE, || !node.conf(OURS).exists()
                && node.healthy().is_ok()),
            "{:?}",
            file_names(&node.conf_dir)
        );
    });
    assert!(bad.is_empty(), "unchained moments: {bad:?}");
    assert_eq!(
        node.active().unwrap().file_name().unwrap(),
        "10-calico.conflist"
    );
    drop(inst);
}

#[test]
fn a_meta_plugin_in_front_is_chained_inline_and_says_so() {
    let node = Node::new("owned-multus");
    node.write_by_rename(
        "00-multus.conf",
        r#"{"cniVersion":"0.3.1","name":"multus-cni-network","type":"multus","delegates":[{"name":"k8s-pod-network","cniVersion":"0.3.1","plugins":[{"type":"calico"}]}]}"#,
    );
    node.write_by_rename("10-calico.conflist", &calico_text(0));
    let inst = node.start(OWNED);
    // Inline repair of the multus config (converted to a conflist).
    node.wait_healthy(RESYNC + GRACE).unwrap();
    assert_eq!(
        node.active().unwrap().file_name().unwrap(),
        "00-multus.conflist"
    );
    assert!(!node.conf(OURS).exists());
    assert!(inst.wait_log("meta-plugin", GRACE), "{}", inst.log());
}
