//! An uninstall while pods start: no ADD or DEL fails because of it.
//!
//! A runtime loads the chain once per ADD (containerd reloads its copy 7-17
//! ms after a write), then runs the plugins one after another, looking each
//! one up in the bin dir just before it runs it. An ADD that loaded the
//! chain with linkerd-cni in it before the uninstall took the entry out
//! still runs linkerd-cni after the primary's plugins, and fails with
//! `failed to find plugin "linkerd-cni"` if the binary is gone by then.
//!
//! Here 20 pods, meshed and unmeshed, are added and deleted in a loop
//! through libcni while the real installer, started with
//! `LINKERD_CNI_UNINSTALL_ON_EXIT=true`, gets SIGTERM and uninstalls; the
//! loop goes on until the installer has exited. Several rounds, each with a
//! new installer. Every ADD and DEL must succeed (a pod whose ADD ran
//! linkerd-cni without its kubeconfig passes through), and each uninstall
//! must still end with nothing of linkerd-cni left on the node.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use conformance::chains::{self, Primary};
use conformance::installer;
use conformance::{Node, kube};
use testkit::names::LOCK_FILE;

const PODS: usize = 20;
const ROUNDS: usize = 3;
/// Pods keep starting this long before the SIGTERM.
const LEAD: Duration = Duration::from_millis(300);
/// The uninstall's bound: the unchain, the wait for ADDs that loaded the
/// old chain, the removal; with scheduling slack on a shared machine.
const EXIT_BOUND: Duration = Duration::from_secs(15);

#[test]
fn pods_starting_during_an_uninstall_never_fail() {
    let node = Node::without_linkerd_cni();
    let api = node.start_api_server_only();
    let net = node.network_name("drain");
    let file = format!("10-{net}.conflist");
    let primary = chains::conflist(
        &net,
        "1.0.0",
        chains::typical_chain(&node, Primary::Ptp, None),
    );
    node.write_conf(&file, &primary);
    let pods: Vec<_> = (0..PODS)
        .map(|i| {
            node.pod(if i % 2 == 0 {
                kube::serve_meshed(&api, &format!("web-{i}"))
            } else {
                kube::serve_unmeshed(&api, &format!("plain-{i}"))
            })
        })
        .collect();

    let (adds, dels) = (AtomicU64::new(0), AtomicU64::new(0));
    let failures = Mutex::new(Vec::new());
    for round in 0..ROUNDS {
        let mut inst = installer::start(
            &node,
            &api,
            &[
                ("LINKERD_CNI_UNINSTALL_ON_EXIT", "true"),
                ("LINKERD_CNI_RESYNC_SECONDS", "1"),
            ],
        );
        node.wait_healthy(
            &installer::expected_entry(&node),
            &primary,
            Duration::from_secs(10),
        )
        .unwrap_or_else(|e| panic!("round {round}: {e}\n{}", inst.log()));

        let stop = AtomicBool::new(false);
        let mut took = Duration::ZERO;
        std::thread::scope(|s| {
            for pod in &pods {
                let (node, net, stop) = (&node, &net, &stop);
                let (adds, dels, failures) = (&adds, &dels, &failures);
                s.spawn(move || {
                    while !stop.load(Ordering::SeqCst) {
                        adds.fetch_add(1, Ordering::Relaxed);
                        if let Err(e) = node.add(net, pod) {
                            failures
                                .lock()
                                .unwrap()
                                .push(format!("round {round}: ADD {}: {e}", pod.container_id()));
                        }
                        dels.fetch_add(1, Ordering::Relaxed);
                        if let Err(e) = node.del(net, pod) {
                            failures
                                .lock()
                                .unwrap()
                                .push(format!("round {round}: DEL {}: {e}", pod.container_id()));
                        }
                    }
                });
            }
            std::thread::sleep(LEAD);
            let t = Instant::now();
            // SAFETY: kill(2) on our own child, not reaped yet: `inst` owns
            // it and only its wait_exit or drop reap it.
            let r = unsafe { libc::kill(inst.id() as i32, libc::SIGTERM) };
            assert_eq!(r, 0, "cannot signal the installer");
            let status = inst.wait_exit(EXIT_BOUND);
            took = t.elapsed();
            stop.store(true, Ordering::SeqCst);
            let status =
                status.unwrap_or_else(|| panic!("still running after SIGTERM:\n{}", inst.log()));
            assert!(status.success(), "{status:?}\n{}", inst.log());
        });
        assert!(inst.log().contains("uninstalled"), "{}", inst.log());
        assert_eq!(
            node.conf_dir_names(),
            std::slice::from_ref(&file),
            "round {round}: kubeconfig and entry file removed"
        );
        assert!(
            !node.bin_dir().join("linkerd-cni").exists(),
            "round {round}: binary removed"
        );
        // Listings leave it out; an ADD on the old chain that took the lock
        // must not leave it behind either.
        assert!(
            !node.conf_dir().join(LOCK_FILE).exists(),
            "round {round}: the conf dir's lock file left behind"
        );
        eprintln!("round {round}: the installer exited {took:?} after SIGTERM");
    }
    let failures = failures.into_inner().unwrap();
    eprintln!(
        "{} failed of {} ADDs and {} DELs over {ROUNDS} uninstalls",
        failures.len(),
        adds.load(Ordering::Relaxed),
        dels.load(Ordering::Relaxed)
    );
    assert!(
        failures.is_empty(),
        "{} failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
