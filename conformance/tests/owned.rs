//! Owned chain mode through libcni: a pod added right after the primary
//! rewrote its config (without linkerd-cni, as a primary always writes it
//! in this mode) is meshed and runs the primary's current chain, every
//! time; and a chain whose primary config is gone is not run.
//!
//! Each pod is added as a kubelet drives a runtime: an ADD answered "try
//! again later" (code 11: it ran a stale copy of the primary's chain) is
//! torn down (DEL) and retried. The installer runs as on a node, once with
//! its watch (it follows the primary's write at once) and once without it
//! and with a long resync, so that only the plugin's own check at ADD stands
//! between a pod and a stale or unchained config.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use conformance::chains::{self, Primary};
use conformance::expect::*;
use conformance::installer;
use conformance::modes::ChainMode;
use conformance::{Completed, Node, Pod, kube};
use serde_json::Value;

const ROUNDS: u64 = 100;
/// Scheduling slack on a small shared machine running other tests.
const GRACE: Duration = Duration::from_secs(5);

fn primary_conf(node: &Node, net: &str, generation: u64) -> Value {
    let mut plugins = chains::typical_chain(node, Primary::Ptp, None);
    plugins[0]["mtu"] = (1400 + generation).into();
    chains::conflist(net, "1.0.0", plugins)
}

fn generation_ran(run: &Completed) -> Option<u64> {
    run.execs("ptp")
        .next()
        .and_then(|e| e.stdin["mtu"].as_u64())
        .map(|m| m - 1400)
}

/// A small PRNG (xorshift), seeded from the clock and printed, so that a
/// failing sequence of delays can be read back.
struct Rng(u64);

impl Rng {
    fn new() -> Rng {
        let seed = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1)
            | 1;
        eprintln!("delay seed {seed}");
        Rng(seed)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// ADD as a kubelet retries a sandbox: code 11 means DEL and ADD again.
/// Returns the completed ADD and how many times it was answered code 11.
fn add_as_kubelet(node: &Node, net: &str, pod: &Pod) -> (Completed, u32) {
    let mut retries = 0;
    loop {
        match node.add(net, pod) {
            Ok(run) => return (run, retries),
            Err(f) if f.code == Some(11) && retries < 5 => {
                retries += 1;
                node.del(net, pod)
                    .unwrap_or_else(|e| panic!("DEL after code 11: {e}"));
            }
            Err(f) => panic!("ADD failed (after {retries} code-11 retries): {f}"),
        }
    }
}

/// DEL as a kubelet drives it: retried until it succeeds (a few times
/// here), since a failed DEL leaks the pod's address.
fn del_as_kubelet(node: &Node, net: &str, pod: &Pod, ctx: &str) {
    let mut last = None;
    for _ in 0..3 {
        match node.del(net, pod) {
            Ok(_) => return,
            Err(e) => {
                eprintln!("{ctx}: DEL failed, retrying: {e}");
                last = Some(e);
            }
        }
    }
    panic!(
        "{ctx}: DEL: {}",
        last.map(|e| e.to_string()).unwrap_or_default()
    );
}

fn rewrite_then_add(watch: bool) {
    let mode = ChainMode::Owned;
    let node = Node::without_linkerd_cni();
    let api = node.start_api_server_only();
    let net = node.network_name("owned");
    let file = format!("10-{net}.conflist");
    node.write_conf(&file, &primary_conf(&node, &net, 0));
    let resync = if watch { "1" } else { "3600" };
    let inst = installer::start(
        &node,
        &api,
        &[
            ("LINKERD_CNI_RESYNC_SECONDS", resync),
            ("LINKERD_CNI_WATCH", if watch { "true" } else { "false" }),
            mode.installer_env(),
        ],
    );
    let desired = mode.entry(installer::expected_entry(&node));
    node.wait_healthy(&desired, &primary_conf(&node, &net, 0), GRACE)
        .unwrap_or_else(|e| panic!("{e}\n{}", inst.log()));

    let mut rng = Rng::new();
    let mut retried = 0;
    let mut delays = Vec::new();
    for generation in 1..=ROUNDS {
        let conf = primary_conf(&node, &net, generation);
        if generation % 4 == 0 {
            // In place (truncate and write), as some primaries do.
            let mut text = serde_json::to_string_pretty(&conf).unwrap();
            text.push('\n');
            std::fs::write(node.conf_dir().join(&file), text).unwrap();
        } else {
            node.write_conf(&file, &conf);
        }
        let delay = Duration::from_millis(rng.below(101));
        delays.push(delay);
        // The pod comes this long after the primary's write: a scenario
        // parameter, not a wait for anything.
        std::thread::sleep(delay);
        let name = format!("web-{generation}");
        let pod = node.pod(kube::serve_meshed(&api, &name));
        let (run, retries) = add_as_kubelet(&node, &net, &pod);
        retried += retries;
        let ctx = format!("round {generation}, {delay:?} after the write, {retries} retries");
        assert!(
            run.execs("linkerd-cni").next().is_some(),
            "{ctx}: the ADD ran without linkerd-cni\n{run:?}"
        );
        assert_eq!(
            generation_ran(&run),
            Some(generation),
            "{ctx}: the pod ran a stale primary config"
        );
        expect_pass_through(&run, "1.0.0");
        expect_reference_rules(&pod, testkit::chart::backend());
        del_as_kubelet(&node, &net, &pod, &ctx);
    }
    expect_no_reserved_ips(&node, &net);
    let max = delays.iter().max().copied().unwrap_or_default();
    eprintln!(
        "owned mode, watch {watch}: {ROUNDS}/{ROUNDS} pods added 0-{max:?} after the primary's \
         rewrite were meshed on its current config; {retried} ADDs answered code 11 and retried"
    );
}

#[test]
fn a_pod_added_right_after_the_primary_rewrote_is_meshed_every_time() {
    rewrite_then_add(true);
}

#[test]
fn a_pod_added_right_after_the_primary_rewrote_is_meshed_every_time_without_the_watch() {
    rewrite_then_add(false);
}

/// The primary's config removed while the installer is not looking: the
/// next ADD, which ran linkerd-cni's copy, removes it and is answered code
/// 11; the runtime then finds no network, as the primary meant.
#[test]
fn a_chain_whose_primary_is_gone_is_not_run() {
    let mode = ChainMode::Owned;
    let node = Node::without_linkerd_cni();
    let api = node.start_api_server_only();
    let net = node.network_name("gone");
    let file = format!("10-{net}.conflist");
    node.write_conf(&file, &primary_conf(&node, &net, 0));
    let inst = installer::start(
        &node,
        &api,
        &[
            ("LINKERD_CNI_RESYNC_SECONDS", "3600"),
            ("LINKERD_CNI_WATCH", "false"),
            mode.installer_env(),
        ],
    );
    let desired = mode.entry(installer::expected_entry(&node));
    node.wait_healthy(&desired, &primary_conf(&node, &net, 0), GRACE)
        .unwrap_or_else(|e| panic!("{e}\n{}", inst.log()));
    let ours = node.conf_dir().join(ChainMode::owned_name(&file));
    assert!(ours.exists());
    // The installer's pass is over (it logs what it wrote once its sync has
    // looked again): from now on it is not looking.
    assert!(
        inst.wait_log(&format!("{} from", ChainMode::owned_name(&file)), GRACE),
        "{}",
        inst.log()
    );
    std::fs::remove_file(node.conf_dir().join(&file)).unwrap();
    let pod = node.pod(kube::serve_meshed(&api, "web-0"));
    let t = Instant::now();
    let failed = node
        .add(&net, &pod)
        .expect_err("ADD on a copy whose primary is gone");
    assert_eq!(failed.code, Some(11), "{failed}");
    assert!(
        failed
            .details
            .as_deref()
            .is_some_and(|d| d.contains("gone")),
        "{failed}"
    );
    assert!(!ours.exists(), "{:?}", node.conf_dir_names());
    node.del(&net, &pod).ok();
    let again = node.add(&net, &pod).expect_err("no network config is left");
    assert_eq!(again.trace.len(), 0, "{again}");
    eprintln!(
        "primary gone: detected and our copy removed within {:?}",
        t.elapsed()
    );
}

/// Leaving owned mode, the first step of a rollback to upstream
/// (docs/operations.md, "Roll back to upstream"): a pod added between the
/// owned installer's exit and the inline one's start runs our copy and is
/// meshed; once the inline installer has run, the runtime loads the
/// primary's own file, and pods added then are meshed from it without the
/// plugin's ADD writing a copy again (it follows the installer's entry
/// file, which now says inline).
#[test]
fn leaving_owned_mode_meshes_every_pod_and_writes_no_copy_again() {
    let node = Node::without_linkerd_cni();
    let api = node.start_api_server_only();
    let net = node.network_name("leave");
    let file = format!("10-{net}.conflist");
    let conf = primary_conf(&node, &net, 0);
    node.write_conf(&file, &conf);
    let owned = ChainMode::Owned;
    let inst = installer::start(
        &node,
        &api,
        &[("LINKERD_CNI_RESYNC_SECONDS", "1"), owned.installer_env()],
    );
    node.wait_healthy(&owned.entry(installer::expected_entry(&node)), &conf, GRACE)
        .unwrap_or_else(|e| panic!("{e}\n{}", inst.log()));
    let ours = node.conf_dir().join(ChainMode::owned_name(&file));
    assert!(ours.exists());

    // The rollout: the owned installer goes (killed: it leaves the node
    // as it is, as at SIGTERM on a rolling update)...
    drop(inst);
    let pod = node.pod(kube::serve_meshed(&api, "web-0"));
    let (run, _) = add_as_kubelet(&node, &net, &pod);
    assert!(run.execs("linkerd-cni").next().is_some(), "{run:?}");
    expect_reference_rules(&pod, testkit::chart::backend());
    del_as_kubelet(&node, &net, &pod, "between the installers");

    // ...and the inline one comes.
    let inst = installer::start(
        &node,
        &api,
        &[
            ("LINKERD_CNI_RESYNC_SECONDS", "1"),
            ChainMode::Inline.installer_env(),
        ],
    );
    node.wait_healthy(&installer::expected_entry(&node), &conf, GRACE)
        .unwrap_or_else(|e| panic!("{e}\n{}", inst.log()));
    assert!(!ours.exists(), "{:?}", node.conf_dir_names());
    for i in 1..=3 {
        let pod = node.pod(kube::serve_meshed(&api, &format!("web-{i}")));
        let (run, retries) = add_as_kubelet(&node, &net, &pod);
        let ctx = format!("pod {i} after the switch, {retries} retries");
        assert!(run.execs("linkerd-cni").next().is_some(), "{ctx}: {run:?}");
        expect_reference_rules(&pod, testkit::chart::backend());
        del_as_kubelet(&node, &net, &pod, &ctx);
        assert!(!ours.exists(), "{ctx}: {:?}", node.conf_dir_names());
        assert_eq!(
            node.active_conf()
                .and_then(|p| p.file_name().map(|n| n.to_owned())),
            Some(file.clone().into()),
            "{ctx}"
        );
    }
    expect_no_reserved_ips(&node, &net);
}
