//! The chain modes side by side, for the benchmarks (`src/bin/bench.rs`):
//! how long after the primary's write the config a runtime loads is healthy
//! and current (each mode, with and without the installer's watch), and
//! what the healthy check costs an ADD in each mode (owned mode reads two
//! files: the primary's and its own copy).
//!
//! Every variant runs on its own node, all at the same time, the variants'
//! order rotated each round. Results print as Markdown tables on stdout.

use std::io::Write;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};
use serde_json::{Value, json};

use conformance::chains::{self, Primary};
use conformance::installer::{self, Installer};
use conformance::modes::ChainMode;
use conformance::{Node, Pod, PodSpec, artifacts};
use testkit::child_path;

use crate::stats::{Samples, fmt_num, paired_differences, ratio};
use crate::stop::{Stop, checkpoint};

fn fail(s: impl Into<String>) -> Stop {
    Stop::failed(s)
}

fn primary_conf(node: &Node, net: &str, generation: u64) -> Value {
    let mut plugins = chains::typical_chain(node, Primary::Bridge, None)[..2].to_vec();
    plugins[0]["mtu"] = (1400 + generation).into();
    chains::conflist(net, "1.0.0", plugins)
}

/// What [`start_node`] sets up: the installer, the API server, the node
/// (drop them in that order), the network's name, the primary's file name,
/// the desired entry.
type Started = (
    Installer,
    testkit::FakeApiServer,
    Node,
    String,
    String,
    Value,
);

/// A node whose primary (`tag` network, generation 0) is chained by the
/// real installer in `mode`, run with `env`, within `within`.
fn start_node(
    mode: ChainMode,
    tag: &str,
    env: &[(&str, &str)],
    within: Duration,
) -> Result<Started, Stop> {
    let node = Node::without_linkerd_cni();
    let api = node.start_api_server_only();
    let net = node.network_name(tag);
    let file = format!("10-{net}.conflist");
    node.write_conf(&file, &primary_conf(&node, &net, 0));
    let mut env = env.to_vec();
    env.push(mode.installer_env());
    let inst = installer::start(&node, &api, &env);
    let desired = mode.entry(installer::expected_entry(&node));
    node.wait_healthy(&desired, &primary_conf(&node, &net, 0), within)
        .map_err(|e| {
            fail(format!(
                "{} mode set-up: {e}\n{}",
                mode.as_str(),
                inst.log()
            ))
        })?;
    Ok((inst, api, node, net, file, desired))
}

/// Dropped in field order: the installer before the node it writes into.
struct HealVariant {
    _installer: Installer,
    _api: testkit::FakeApiServer,
    label: String,
    node: Node,
    net: String,
    file: String,
    desired: Value,
    samples: Samples,
}

/// Time from the primary's write (a rename, as most primaries write) to
/// the first moment the config a runtime would load is healthy and holds
/// the primary's new content, polled as fast as the files can be read.
/// `rounds` writes per variant; the resync-only variants wait up to one
/// `resync` period.
pub fn heal_latency(rounds: usize, resync: Duration) -> Result<(), Stop> {
    let mut variants = Vec::new();
    for mode in ChainMode::ALL {
        for watch in [true, false] {
            let secs = format!("{}", resync.as_secs_f64());
            let (inst, api, node, net, file, desired) = start_node(
                mode,
                "heal",
                &[
                    ("LINKERD_CNI_RESYNC_SECONDS", &secs),
                    ("LINKERD_CNI_WATCH", if watch { "true" } else { "false" }),
                ],
                resync + Duration::from_secs(5),
            )?;
            variants.push(HealVariant {
                _installer: inst,
                _api: api,
                label: format!(
                    "{}, {}",
                    mode.as_str(),
                    if watch { "watch" } else { "resync only" }
                ),
                node,
                net,
                file,
                desired,
                samples: Samples::new(),
            });
        }
    }
    let n = variants.len();
    let mut rng = testkit::names::unique_id()
        .bytes()
        .fold(0x9e37_79b9_7f4a_7c15_u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
        })
        | 1;
    for round in 0..rounds {
        for k in 0..n {
            checkpoint()?;
            let Some(v) = variants.get_mut((round + k) % n) else {
                continue;
            };
            let generation = (round + 1) as u64;
            let want = primary_conf(&v.node, &v.net, generation);
            // A random phase against the installers' resync timers: the
            // write lands anywhere in a period, as a primary's would.
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            let phase = resync.mul_f64((rng % 1000) as f64 / 1000.0);
            crate::stop::sleep(phase)?;
            let t = Instant::now();
            v.node.write_conf(&v.file, &want);
            let deadline = t + resync * 2 + Duration::from_secs(5);
            loop {
                if v.node
                    .read_active()
                    .is_ok_and(|a| a.healthy_with(&v.desired, &want).is_ok())
                {
                    v.samples.push_duration(t.elapsed());
                    break;
                }
                if Instant::now() > deadline {
                    return Err(fail(format!(
                        "{}: not healthy and current {:?} after the primary's write",
                        v.label,
                        t.elapsed()
                    )));
                }
                std::hint::spin_loop();
            }
        }
    }
    println!();
    println!("### Chain modes: primary's write to a healthy, current config");
    println!();
    println!(
        "The primary rewrites its conflist by rename (new content each time, {rounds} writes per \
         variant, resync period {:.0} s); the time until the config a runtime would load (the \
         first in byte order) ends with linkerd-cni and holds the primary's new chain, polled \
         without pause. Inline: our entry back in the primary's file. Owned: linkerd-cni's \
         own copy following the primary's file.",
        resync.as_secs_f64()
    );
    println!();
    println!("| variant | median [p10–p90] | p99 | max |");
    println!("|---|---|---|---|");
    for v in &variants {
        println!(
            "| {} | {} | {} ms | {} ms |",
            v.label,
            v.samples.summary("ms"),
            fmt_num(v.samples.quantile(0.99)),
            fmt_num(v.samples.max()),
        );
    }
    Ok(())
}

/// One node and installer per mode for [`heal_at_spacing`].
struct SpacingNode {
    _installer: Installer,
    _api: testkit::FakeApiServer,
    mode: ChainMode,
    node: Node,
    net: String,
    file: String,
    desired: Value,
    generation: u64,
    changes: DirChanges,
}

/// Entries of a directory changing (inotify), waited for without spinning:
/// a poller spinning on one of two cores would take the CPU the installer
/// it times needs.
struct DirChanges(Inotify);

impl DirChanges {
    fn watch(dir: &Path) -> Result<DirChanges, Stop> {
        let inotify = Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC)
            .map_err(|e| fail(format!("inotify: {e}")))?;
        let mask = AddWatchFlags::IN_CREATE
            | AddWatchFlags::IN_CLOSE_WRITE
            | AddWatchFlags::IN_MOVED_TO
            | AddWatchFlags::IN_MOVED_FROM
            | AddWatchFlags::IN_DELETE;
        inotify
            .add_watch(dir, mask)
            .map_err(|e| fail(format!("inotify watch on {}: {e}", dir.display())))?;
        Ok(DirChanges(inotify))
    }

    /// Waits for the next change, or `deadline`: whether there was one
    /// (every change since the last call counts).
    fn wait_until(&self, deadline: Instant) -> Result<bool, Stop> {
        loop {
            match self.0.read_events() {
                Ok(events) if !events.is_empty() => return Ok(true),
                Ok(_) | Err(Errno::EAGAIN) => {}
                Err(e) => return Err(fail(format!("inotify read: {e}"))),
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(false);
            }
            let ms = u16::try_from(left.as_millis() + 1).unwrap_or(u16::MAX);
            let mut fds = [PollFd::new(self.0.as_fd(), PollFlags::POLLIN)];
            match poll(&mut fds, PollTimeout::from(ms)) {
                Ok(_) | Err(Errno::EINTR) => {}
                Err(e) => return Err(fail(format!("poll: {e}"))),
            }
        }
    }
}

/// Heal time per write when the primary writes again and again, `spacing`
/// apart: bursts of `burst` renames of new content, `bursts` per mode and
/// spacing, the modes alternating burst by burst. Each write's heal time is
/// from its rename to the first moment the config a runtime would load is
/// healthy and holds that write, checked at each change of the conf dir;
/// a write not healed when the next is due counts as unhealed (its time,
/// then, is more than the spacing).
pub fn heal_at_spacing(spacings: &[Duration], bursts: usize, burst: usize) -> Result<(), Stop> {
    let mut nodes = Vec::new();
    for mode in ChainMode::ALL {
        // A long resync: the watch alone heals.
        let (inst, api, node, net, file, desired) = start_node(
            mode,
            "spacing",
            &[("LINKERD_CNI_RESYNC_SECONDS", "60")],
            Duration::from_secs(5),
        )?;
        let changes = DirChanges::watch(&node.conf_dir())?;
        nodes.push(SpacingNode {
            _installer: inst,
            _api: api,
            mode,
            node,
            net,
            file,
            desired,
            generation: 0,
            changes,
        });
    }
    // (spacing, mode) -> (heal times of healed writes, unhealed writes)
    let mut results: Vec<(Duration, ChainMode, Samples, usize)> = Vec::new();
    for &spacing in spacings {
        let mut per_mode: Vec<(Samples, usize)> =
            nodes.iter().map(|_| (Samples::new(), 0)).collect();
        for b in 0..bursts {
            for k in 0..nodes.len() {
                let i = (b + k) % nodes.len();
                let (Some(v), Some((samples, unhealed))) = (nodes.get_mut(i), per_mode.get_mut(i))
                else {
                    continue;
                };
                // Quiet before the burst: the previous one's last heal.
                crate::stop::sleep(Duration::from_millis(300))?;
                let start = Instant::now();
                for w in 0..burst {
                    checkpoint()?;
                    v.generation += 1;
                    let want = primary_conf(&v.node, &v.net, v.generation);
                    let due = start + spacing * u32::try_from(w).unwrap_or(u32::MAX);
                    crate::stop::sleep(due.saturating_duration_since(Instant::now()))?;
                    let t = Instant::now();
                    v.node.write_conf(&v.file, &want);
                    // The last write of a burst gets one spacing too.
                    let next = t + spacing;
                    loop {
                        if v.node
                            .read_active()
                            .is_ok_and(|a| a.healthy_with(&v.desired, &want).is_ok())
                        {
                            samples.push_duration(t.elapsed());
                            break;
                        }
                        if !v.changes.wait_until(next)? {
                            // Its heal time is at least this: counted so
                            // in the quantiles, a lower bound.
                            samples.push_duration(spacing);
                            *unhealed += 1;
                            break;
                        }
                    }
                }
            }
        }
        for (v, (samples, unhealed)) in nodes.iter().zip(per_mode) {
            results.push((spacing, v.mode, samples, unhealed));
        }
    }
    println!();
    println!("### Chain modes: heal time per write, writes close together");
    println!();
    println!(
        "The primary renames new content (without linkerd-cni) into place again and again, at \
         a fixed spacing: bursts of {burst} writes, {bursts} bursts per mode and spacing, the \
         modes alternating burst by burst; the installer watches (resync 60 s). Heal time: from \
         a write to the first moment the config a runtime would load ends with linkerd-cni and \
         holds that write, checked at each change in the conf dir (inotify: no poller spinning \
         beside the installer). A write not healed when the next one is due \
         is counted as unhealed, and in the quantiles as healed after one spacing (a lower \
         bound)."
    );
    println!();
    println!("| spacing | mode | writes | unhealed | median [p10–p90] | p99 | max |");
    println!("|---|---|---|---|---|---|---|");
    for (spacing, mode, samples, unhealed) in &results {
        println!(
            "| {} ms | {} | {} | {unhealed} | {} | {} ms | {} ms |",
            spacing.as_millis(),
            mode.as_str(),
            samples.len(),
            samples.summary("ms"),
            fmt_num(samples.quantile(0.99)),
            fmt_num(samples.max()),
        );
    }
    Ok(())
}

/// One prepared plugin ADD for an exempt-namespace pod: no API call, no
/// iptables, so what differs between the modes is the chain check.
struct DirectAdd {
    plugin: PathBuf,
    env: Vec<(String, String)>,
    stdin: Vec<u8>,
}

impl DirectAdd {
    fn run(&self) -> Result<Duration, Stop> {
        let start = Instant::now();
        let mut child = Command::new(&self.plugin)
            .env_clear()
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| fail(format!("cannot run {}: {e}", self.plugin.display())))?;
        if let Some(mut p) = child.stdin.take() {
            let _ = p.write_all(&self.stdin);
        }
        let out = child
            .wait_with_output()
            .map_err(|e| fail(format!("waiting for the plugin: {e}")))?;
        let took = start.elapsed();
        if !out.status.success() {
            return Err(fail(format!(
                "ADD failed: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            )));
        }
        Ok(took)
    }
}

/// Dropped in field order: the pod's netns before the node.
struct CheckNode {
    _pod: Pod,
    add: DirectAdd,
    node: Node,
}

fn check_node(mode: ChainMode, plugin: &Path) -> Result<CheckNode, Stop> {
    let node = Node::without_linkerd_cni();
    let net = node.network_name("check");
    let file = format!("10-{net}.conflist");
    let mut entry = mode.entry(chains::linkerd_entry(&node));
    entry["log_level"] = "info".into();
    let mut plugins = chains::typical_chain(&node, Primary::Bridge, None)[..2].to_vec();
    plugins.push(entry);
    mode.write_chained(&node, &file, &chains::conflist(&net, "1.0.0", plugins));
    // The plugin's stdin as libcni builds it from the file the runtime
    // loaded: our entry there (with the marker, in owned mode).
    let active = node
        .read_active()
        .map_err(|e| fail(format!("{} mode: {e}", mode.as_str())))?;
    let mut stdin = active
        .plugins()
        .last()
        .cloned()
        .cloned()
        .unwrap_or(Value::Null);
    stdin["name"] = net.clone().into();
    stdin["cniVersion"] = "1.0.0".into();
    stdin["prevResult"] = json!({"cniVersion": "1.0.0", "interfaces": [], "ips": []});
    let pod = node.pod(PodSpec::kubernetes("kube-system", "coredns-0"));
    let add = DirectAdd {
        plugin: plugin.to_path_buf(),
        env: vec![
            ("CNI_COMMAND".into(), "ADD".into()),
            ("CNI_CONTAINERID".into(), pod.container_id().into()),
            ("CNI_NETNS".into(), pod.netns_path().display().to_string()),
            ("CNI_IFNAME".into(), "eth0".into()),
            (
                "CNI_ARGS".into(),
                "IgnoreUnknown=1;K8S_POD_NAMESPACE=kube-system;K8S_POD_NAME=coredns-0".into(),
            ),
            ("CNI_PATH".into(), node.bin_dir().display().to_string()),
            ("PATH".into(), child_path()),
        ],
        stdin: stdin.to_string().into_bytes(),
    };
    Ok(CheckNode {
        _pod: pod,
        add,
        node,
    })
}

/// The plugin's ADD for an exempt pod on a healthy chain, inline vs owned,
/// in pairs, alternating which runs first; the files of both conf dirs are
/// checked unchanged afterwards (the healthy path writes nothing).
pub fn check_cost(pairs: usize) -> Result<(), Stop> {
    let plugin = artifacts::try_workspace_bin("linkerd-cni").map_err(fail)?;
    let inline = check_node(ChainMode::Inline, &plugin)?;
    let owned = check_node(ChainMode::Owned, &plugin)?;
    let snapshot = |n: &Node| -> Vec<(String, Vec<u8>)> {
        n.conf_dir_names()
            .into_iter()
            .map(|f| {
                let b = std::fs::read(n.conf_dir().join(&f)).unwrap_or_default();
                (f, b)
            })
            .collect()
    };
    let (before_i, before_o) = (snapshot(&inline.node), snapshot(&owned.node));
    // Warm-up: page cache, the binary.
    inline.add.run()?;
    owned.add.run()?;
    let (mut si, mut so) = (Samples::new(), Samples::new());
    for i in 0..pairs {
        checkpoint()?;
        if i % 2 == 0 {
            si.push_duration(inline.add.run()?);
            so.push_duration(owned.add.run()?);
        } else {
            so.push_duration(owned.add.run()?);
            si.push_duration(inline.add.run()?);
        }
    }
    if snapshot(&inline.node) != before_i || snapshot(&owned.node) != before_o {
        return Err(fail("a healthy chain was rewritten by an ADD"));
    }
    let diff = paired_differences(&so, &si);
    println!();
    println!("### Chain modes: the plugin's ADD on a healthy chain");
    println!();
    println!(
        "A direct plugin ADD for an exempt-namespace pod (no API call, no iptables: the chain \
         check is the work), {pairs} pairs. Inline reads the active file; owned lists the conf \
         dir, reads the primary's file and its own copy, and compares the digest it was invoked \
         with."
    );
    println!();
    println!("| mode | ADD, median [p10–p90] |");
    println!("|---|---|");
    println!("| inline | {} |", si.summary("ms"));
    println!("| owned | {} |", so.summary("ms"));
    println!();
    println!(
        "Owned / inline: {}x; per-pair difference (owned − inline): {}.",
        fmt_num(ratio(&so, &si)),
        diff.summary("ms")
    );
    Ok(())
}

struct PodVariant {
    _installer: Installer,
    api: testkit::FakeApiServer,
    mode: ChainMode,
    node: Node,
    net: String,
    file: String,
    first_unmeshed: usize,
    retried: usize,
    stale: usize,
    runs: usize,
}

/// A meshed pod added 0–100 ms (random) after the primary rewrote its
/// config without linkerd-cni (new content each time), on a node whose
/// installer watches the conf dir: how often its first ADD ran without
/// linkerd-cni (inline mode's blind spot), how often an ADD was answered
/// code 11 and retried (owned mode), how often the pod ended on a primary
/// config older than the one on disk when it was added.
pub fn pod_after_rewrite(rounds: usize) -> Result<(), Stop> {
    let mut variants = Vec::new();
    for mode in ChainMode::ALL {
        let (inst, api, node, net, file, _) = start_node(
            mode,
            "pods",
            &[("LINKERD_CNI_RESYNC_SECONDS", "2")],
            Duration::from_secs(7),
        )?;
        variants.push(PodVariant {
            _installer: inst,
            api,
            mode,
            node,
            net,
            file,
            first_unmeshed: 0,
            retried: 0,
            stale: 0,
            runs: 0,
        });
    }
    let mut rng = testkit::names::unique_id()
        .bytes()
        .fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
        })
        | 1;
    for round in 0..rounds {
        for k in 0..variants.len() {
            checkpoint()?;
            let n = variants.len();
            let Some(v) = variants.get_mut((round + k) % n) else {
                continue;
            };
            let generation = (round + 1) as u64;
            v.node
                .write_conf(&v.file, &primary_conf(&v.node, &v.net, generation));
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            crate::stop::sleep(Duration::from_millis(rng % 101))?;
            let name = format!("web-{round}");
            let pod = v.node.pod(conformance::kube::serve_meshed(&v.api, &name));
            let mut attempts = 0;
            let run = loop {
                attempts += 1;
                match v.node.add(&v.net, &pod) {
                    Ok(run) => break run,
                    Err(f) if f.code == Some(11) && attempts < 5 => {
                        v.retried += 1;
                        let _ = v.node.del(&v.net, &pod);
                    }
                    Err(f) => {
                        return Err(fail(format!("{} mode: ADD failed: {f}", v.mode.as_str())));
                    }
                }
            };
            // Only a completed ADD can run without us: retries ran with us.
            if run.execs("linkerd-cni").next().is_none() {
                v.first_unmeshed += 1;
            }
            let ran = run
                .execs("bridge")
                .next()
                .and_then(|e| e.stdin["mtu"].as_u64())
                .map(|m| m - 1400);
            if ran != Some(generation) {
                v.stale += 1;
            }
            v.runs += 1;
            v.node
                .del(&v.net, &pod)
                .map_err(|e| fail(format!("DEL: {e}")))?;
        }
    }
    println!();
    println!("### Chain modes: a meshed pod added right after the primary's rewrite");
    println!();
    println!(
        "The primary rewrites its conflist by rename without linkerd-cni (new content each \
         time); a meshed pod is added through libcni 0–100 ms later (uniformly random); the \
         installer watches the conf dir (resync 2 s). An ADD answered code 11 is retried as a \
         kubelet retries a sandbox (DEL, ADD)."
    );
    println!();
    println!(
        "| mode | pods | first ADD without linkerd-cni | ADDs retried (code 11) | ended on a stale primary config |"
    );
    println!("|---|---|---|---|---|");
    for v in &variants {
        println!(
            "| {} | {} | {} | {} | {} |",
            v.mode.as_str(),
            v.runs,
            v.first_unmeshed,
            v.retried,
            v.stale
        );
    }
    Ok(())
}
