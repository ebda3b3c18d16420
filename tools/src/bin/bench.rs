//! `bench`: linkerd-cni's costs, each measured side by side with what it is
//! compared to, in one run, variants interleaved (ABAB, or rotated for
//! more than two) so that the machine's slow phases hit all of them.
//!
//! ```text
//! bash scripts/tool.sh bench [--modes | --add] [--quick] [--baseline PLUGIN_DIR]
//! ```
//!
//! Run as root (throwaway network namespaces, as the conformance tests);
//! how and for how long: the README's "Benchmarks"; the method and the
//! figures of a run: BENCHMARKS.md, which quotes the Markdown this prints
//! on stdout (progress goes to stderr). Not run in CI: figures need a quiet
//! machine and minutes, and the tests never assert on time.
//!
//! The sections, in the order printed (`// N ---` below): 1. a meshed ADD
//! through libcni with and without linkerd-cni; 2. pass-through ADDs vs
//! Debian's `tuning`; 3. the healthy chain check's cost; 4. heal times;
//! 5. throughput of concurrent ADDs; 7. a meshed ADD's instructions per
//! process; 8. its wall time run directly; 9. upstream's per-pod command
//! sequence vs ours; 10. a meshed ADD in nft mode in-process vs the restore
//! path; 11. a meshed ADD with its facts from the node agent vs the direct
//! path vs `tuning` (then the chain modes, `mode_bench`; 6 is
//! `cri_bench`'s). `--nft` prints 10 only, `--agent` 11 only; `--add` prints
//! 2, 3, 7, 8 and 9 only; `--baseline` adds another build's plugin (e.g.
//! main's) to 7 and 8, interleaved with this one.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Output, Stdio};
use std::sync::Barrier;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use conformance::agent::AgentProcess;
use conformance::chains::{self, Primary};
use conformance::iptables::{Backend, Family};
use conformance::{Completed, Node, PodSpec, artifacts};
use linkerd_cni::config::IptablesMode;
use linkerd_cni::iptables::Driver;
use linkerd_cni::iptables::rules::{Family as IptFamily, JUMPS, RedirectSpec, RuleSet};
use linkerd_cni_tools::mode_bench;
use linkerd_cni_tools::scenario::{self, Binaries, InstallerOptions};
use linkerd_cni_tools::stats::{Samples, fmt_num, paired_differences, ratio};
use linkerd_cni_tools::stop::{self, Stop, checkpoint};
use serde_json::{Value, json};
use testkit::child_path;
use testkit::installer::InstallerProcess;
use testkit::{FakeApiServer, objects};

const WITH: &str = "with-linkerd";
const WITHOUT: &str = "without-linkerd";
const WITH_FILE: &str = "10-with-linkerd.conflist";
const WITHOUT_FILE: &str = "20-without-linkerd.conflist";
/// The installers' resync period in benchmark 4 (10 s in the chart): the
/// resync-only heal time is uniform over one period, so a short one keeps
/// the run short without changing what is shown.
const RESYNC: Duration = Duration::from_secs(2);
/// Heals per installer process: its fight detector rate-limits a file
/// repaired 10 times within 60 s, which a benchmark would reach but a
/// primary restarting now and then never does.
const HEALS_PER_INSTALLER: usize = 8;

/// The primary's write spacings of the close-writes heal benchmark.
const SPACINGS: [Duration; 4] = [
    Duration::from_millis(50),
    Duration::from_millis(100),
    Duration::from_millis(200),
    Duration::from_millis(500),
];

struct Plan {
    libcni_pairs: usize,
    direct_rounds: usize,
    repair_pairs: usize,
    installer_heals: usize,
    /// Bursts of writes per mode and spacing.
    spacing_bursts: usize,
    concurrency: Vec<(usize, usize)>,
    callgrind_runs: usize,
}

impl Plan {
    fn full() -> Plan {
        Plan {
            libcni_pairs: 200,
            direct_rounds: 400,
            repair_pairs: 200,
            installer_heals: 24,
            spacing_bursts: 6,
            concurrency: vec![(1, 24), (2, 16), (8, 8), (32, 5)],
            callgrind_runs: 3,
        }
    }

    /// A smoke run: every benchmark, few iterations.
    fn quick() -> Plan {
        Plan {
            libcni_pairs: 10,
            direct_rounds: 20,
            repair_pairs: 10,
            installer_heals: 3,
            spacing_bursts: 1,
            concurrency: vec![(1, 3), (8, 2)],
            callgrind_runs: 1,
        }
    }
}

fn main() -> ExitCode {
    linkerd_cni_tools::main("bench", story)
}

/// Which sections a run prints.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Sections {
    All,
    /// `--modes`: only the chain modes' side-by-side figures.
    Modes,
    /// `--spacing`: only their heal times per write at each spacing.
    Spacing,
    /// `--add`: only what one ADD costs (sections 2, 3, 7, 8, 9).
    Add,
    /// `--nft`: only nft mode in-process vs the restore path (section 10).
    Nft,
    /// `--agent`: only the ADD through the node agent (section 11).
    Agent,
}

const USAGE: &str = "usage: bench [--modes | --spacing | --add | --nft | --agent] [--quick] [--rsa] \
                     [--baseline PLUGIN_DIR]";

/// `--rsa`: the fake API server's CA and certificate have RSA-2048 keys
/// (kubeadm's default) rather than ECDSA P-256 (testkit's default). What a
/// TLS client spends verifying them differs several times over.
static RSA_API_SERVER: AtomicBool = AtomicBool::new(false);

fn api_server_key() -> &'static str {
    if RSA_API_SERVER.load(Ordering::Relaxed) {
        "RSA-2048 (`--rsa`)"
    } else {
        "ECDSA P-256"
    }
}

fn story() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (mut sections, mut quick, mut baseline) = (Sections::All, false, None);
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--modes" => sections = Sections::Modes,
            "--spacing" => sections = Sections::Spacing,
            "--add" => sections = Sections::Add,
            "--nft" => sections = Sections::Nft,
            "--agent" => sections = Sections::Agent,
            "--quick" => quick = true,
            "--rsa" => RSA_API_SERVER.store(true, Ordering::Relaxed),
            // The directory of another build's plugin (e.g. the main
            // branch's), measured interleaved with this one in 7 and 8.
            "--baseline" => match it.next() {
                Some(dir) => baseline = Some(PathBuf::from(dir)),
                None => {
                    eprintln!("{USAGE}");
                    return ExitCode::from(2);
                }
            },
            _ => {
                eprintln!("{USAGE}");
                return ExitCode::from(2);
            }
        }
    }
    let plan = if quick { Plan::quick() } else { Plan::full() };
    if let Some(dir) = &baseline
        && !dir.join("linkerd-cni").is_file()
    {
        eprintln!("bench: no linkerd-cni in {}", dir.display());
        return ExitCode::from(2);
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("bench: run me as root: I create network namespaces");
        return ExitCode::from(2);
    }
    let baseline = baseline.as_deref();
    let result = match sections {
        Sections::Modes => stop::run_story(|| run_modes(&plan)),
        Sections::Spacing => stop::run_story(|| standalone(|_| spacing(&plan))),
        Sections::Add => stop::run_story(|| run_add(&plan, baseline)),
        Sections::Nft => stop::run_story(|| run_nft(&plan)),
        Sections::Agent => {
            stop::run_story(|| standalone(|bins| agent_add(&BenchNode::new(bins)?, &plan)))
        }
        Sections::All => stop::run_story(|| run(&plan, baseline)),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(Stop::Interrupted) => {
            eprintln!("bench: interrupted");
            ExitCode::from(130)
        }
        Err(Stop::Failed(why)) => {
            eprintln!("bench: {why}");
            ExitCode::FAILURE
        }
    }
}

/// Round `i`'s order of the two networks: alternated, so that neither
/// always runs first.
fn abab(i: usize) -> [&'static str; 2] {
    if i.is_multiple_of(2) {
        [WITH, WITHOUT]
    } else {
        [WITHOUT, WITH]
    }
}

fn progress(s: &str) {
    eprintln!("bench: {s}");
}

fn fail(s: impl Into<String>) -> Stop {
    Stop::failed(s)
}

fn run(plan: &Plan, baseline: Option<&Path>) -> Result<(), Stop> {
    let started = Instant::now();
    let cpus = pin_two_cpus();
    let bins = Binaries::find().map_err(fail)?;
    progress("building the libcni driver");
    let _ = artifacts::cnidriver();
    let load_before = loadavg();
    print_machine(&cpus, &bins);

    let bench = BenchNode::new(&bins)?;
    checkpoint()?;

    progress("1/5 meshed ADD through libcni, with vs without linkerd-cni");
    libcni_add(&bench, plan)?;
    progress("2/5 + 3/5 pass-through ADDs and the healthy chain check");
    pass_through(&bench, plan)?;
    progress("4/5 heal time: installer watch vs resync; plugin repair");
    installer_heal(&bins, plan)?;
    plugin_repair(&bench, plan)?;
    progress("5/5 concurrent ADDs");
    throughput(&bench, plan)?;
    add_cost(&bench, plan, baseline)?;
    progress("nft mode: in-process vs the restore path");
    nft_mode(&bench, plan)?;
    progress("a meshed ADD through the node agent");
    agent_add(&bench, plan)?;
    modes(plan)?;

    footer(&load_before, started);
    Ok(())
}

/// Sections 2, 3, 7, 8 and 9 alone (`--add`).
fn run_add(plan: &Plan, baseline: Option<&Path>) -> Result<(), Stop> {
    let started = Instant::now();
    let cpus = pin_two_cpus();
    let bins = Binaries::find().map_err(fail)?;
    let load_before = loadavg();
    print_machine(&cpus, &bins);
    if let Some(dir) = baseline {
        println!(
            "| baseline plugin | {} |",
            dir.join("linkerd-cni").display()
        );
    }
    let bench = BenchNode::new(&bins)?;
    progress("2/5 + 3/5 pass-through ADDs and the healthy chain check");
    pass_through(&bench, plan)?;
    add_cost(&bench, plan, baseline)?;
    footer(&load_before, started);
    Ok(())
}

/// Sections 7, 8 and 9: where a meshed ADD goes.
fn add_cost(bench: &BenchNode, plan: &Plan, baseline: Option<&Path>) -> Result<(), Stop> {
    progress("7 instructions of a meshed ADD, per process");
    add_instructions(bench, plan, baseline)?;
    progress("8 wall time of a direct meshed ADD");
    add_wall_time(bench, plan, baseline)?;
    progress("9 upstream's command sequence vs ours");
    upstream_sequence(bench, plan)
}

/// The run's last line: the load around it and its length.
fn footer(load_before: &str, started: Instant) {
    println!();
    println!(
        "Load average before: {load_before}; after: {}. Whole run: {:.0} s.",
        loadavg(),
        started.elapsed().as_secs_f64()
    );
}

/// The chain modes side by side (`linkerd_cni_tools::mode_bench`).
fn modes(plan: &Plan) -> Result<(), Stop> {
    progress("chain modes: heal latency, inline vs owned, watch vs resync");
    mode_bench::heal_latency(plan.installer_heals, RESYNC)?;
    spacing(plan)?;
    progress("chain modes: the healthy check per ADD, inline vs owned");
    mode_bench::check_cost(plan.repair_pairs)?;
    progress("chain modes: a meshed pod right after the primary's rewrite");
    mode_bench::pod_after_rewrite(plan.installer_heals * 2)
}

fn spacing(plan: &Plan) -> Result<(), Stop> {
    progress("chain modes: heal time per write at 50, 100, 200 and 500 ms spacing");
    mode_bench::heal_at_spacing(&SPACINGS, plan.spacing_bursts, 10)
}

fn run_modes(plan: &Plan) -> Result<(), Stop> {
    standalone(|_| modes(plan))
}

fn run_nft(plan: &Plan) -> Result<(), Stop> {
    standalone(|bins| nft_mode(&BenchNode::new(bins)?, plan))
}

/// One section alone, between the machine's description and the footer.
fn standalone(section: impl FnOnce(&Binaries) -> Result<(), Stop>) -> Result<(), Stop> {
    let started = Instant::now();
    let cpus = pin_two_cpus();
    let bins = Binaries::find().map_err(fail)?;
    let _ = artifacts::cnidriver();
    let load_before = loadavg();
    print_machine(&cpus, &bins);
    section(&bins)?;
    footer(&load_before, started);
    Ok(())
}

/// The node most benchmarks share: the reference plugins and linkerd-cni
/// in its bin dir, the fake API server inside, two networks that differ
/// only by linkerd-cni, a pod netns with an interface for the direct runs.
struct BenchNode {
    // Dropped in this order: the pod netns, the server, the node.
    direct_pod: conformance::Pod,
    api: FakeApiServer,
    node: Node,
    plugin: PathBuf,
    /// linkerd-cni's entry in the `with` chain.
    entry: Value,
    /// The bridge result of `direct_pod`: `prevResult` of the direct runs.
    prev_result: Value,
}

impl BenchNode {
    fn new(bins: &Binaries) -> Result<BenchNode, Stop> {
        let node = Node::without_linkerd_cni();
        node.install_bin("linkerd-cni", &bins.plugin);
        let api = if RSA_API_SERVER.load(Ordering::Relaxed) {
            node.start_api_server_with(testkit::pki::TestPki::rsa())
        } else {
            node.start_api_server()
        };
        api.add_namespace("bench", &[]);
        api.add_pod(&objects::Pod::meshed("bench", "meshed"));
        api.add_pod(&objects::Pod::new("bench", "plain"));
        let mut entry = chains::linkerd_entry(&node);
        entry["log_level"] = "info".into();
        node.write_conf(WITH_FILE, &with_chain(&node, &entry));
        // The desired entry as the installer persists it on every node it
        // runs on: the plugin's healthy check then remembers its verdict
        // (see linkerd_cni_state::memo).
        node.write_conf(linkerd_cni_chain::ENTRY_FILE, &entry);
        node.write_conf(
            WITHOUT_FILE,
            &chains::conflist(
                WITHOUT,
                "1.0.0",
                chains::typical_chain(&node, Primary::Bridge, None)[..2].to_vec(),
            ),
        );
        let direct_pod = node.pod(PodSpec::kubernetes("bench", "direct"));
        let done = node
            .add(WITHOUT, &direct_pod)
            .map_err(|f| fail(format!("set-up ADD failed: {f}")))?;
        let prev_result = done.json();
        Ok(BenchNode {
            direct_pod,
            api,
            node,
            plugin: bins.plugin.clone(),
            entry,
            prev_result,
        })
    }

    /// One direct ADD of `program` with `conf` (the plugin's entry) as
    /// libcni would run it for `direct_pod` in pod `ns/name`.
    fn invocation(&self, program: &Path, conf: &Value, ns: &str, name: &str) -> Invocation {
        self.invocation_in(&self.direct_pod, program, conf, ns, name)
    }

    /// The same, for the pod netns of `pod`.
    fn invocation_in(
        &self,
        pod: &conformance::Pod,
        program: &Path,
        conf: &Value,
        ns: &str,
        name: &str,
    ) -> Invocation {
        let mut stdin = conf.clone();
        if let Some(m) = stdin.as_object_mut() {
            m.insert("cniVersion".into(), "1.0.0".into());
            m.insert("name".into(), WITH.into());
            m.insert("prevResult".into(), self.prev_result.clone());
        }
        Invocation {
            program: program.to_path_buf(),
            env: vec![
                ("CNI_COMMAND".into(), "ADD".into()),
                ("CNI_CONTAINERID".into(), pod.container_id().into()),
                ("CNI_NETNS".into(), pod.netns_path().display().to_string()),
                ("CNI_IFNAME".into(), "eth0".into()),
                (
                    "CNI_ARGS".into(),
                    format!("IgnoreUnknown=1;K8S_POD_NAMESPACE={ns};K8S_POD_NAME={name}"),
                ),
                ("CNI_PATH".into(), self.node.bin_dir().display().to_string()),
                ("PATH".into(), child_path()),
            ],
            stdin: stdin.to_string().into_bytes(),
        }
    }
}

fn with_chain(node: &Node, entry: &Value) -> Value {
    let mut plugins = chains::typical_chain(node, Primary::Bridge, None)[..2].to_vec();
    plugins.push(entry.clone());
    chains::conflist(WITH, "1.0.0", plugins)
}

/// A plugin execution prepared by hand, byte for byte what libcni runs.
struct Invocation {
    program: PathBuf,
    env: Vec<(String, String)>,
    stdin: Vec<u8>,
}

impl Invocation {
    fn command(&self, wrapper: &[&str]) -> Command {
        let mut cmd = match wrapper.split_first() {
            Some((w, rest)) => {
                let mut c = Command::new(w);
                c.args(rest).arg(&self.program);
                c
            }
            None => Command::new(&self.program),
        };
        cmd.env_clear()
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        cmd
    }

    /// Runs it (the caller is in the node's netns) and times spawn to exit.
    fn run(&self) -> Result<(Duration, Output), Stop> {
        let start = Instant::now();
        let out = spawn_with_stdin(self.command(&[]), &self.stdin)?;
        Ok((start.elapsed(), out))
    }

    /// `run`, requiring success and a JSON result on stdout.
    fn run_ok(&self, what: &str) -> Result<(Duration, Output), Stop> {
        let (d, out) = self.run()?;
        let json_ok = serde_json::from_slice::<Value>(&out.stdout).is_ok();
        if !out.status.success() || !json_ok {
            return Err(fail(format!(
                "{what}: {} {}: {}{}",
                self.program.display(),
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            )));
        }
        Ok((d, out))
    }
}

fn spawn_with_stdin(mut cmd: Command, stdin: &[u8]) -> Result<Output, Stop> {
    let mut child = cmd
        .spawn()
        .map_err(|e| fail(format!("cannot run {:?}: {e}", cmd.get_program())))?;
    if let Some(mut pipe) = child.stdin.take() {
        // A plugin that exits without reading closes the pipe: its output
        // is what matters.
        let _ = pipe.write_all(stdin);
    }
    child
        .wait_with_output()
        .map_err(|e| fail(format!("waiting for {:?}: {e}", cmd.get_program())))
}

// 1 ----------------------------------------------------------------------

/// Time libcni spent running the chain's plugins for one ADD (its own
/// timing of each execution): what a pod start costs a runtime that embeds
/// libcni, without the driver's process start-up.
fn chain_time(done: &Completed) -> Duration {
    done.trace
        .iter()
        .filter(|e| e.command == "ADD")
        .map(|e| e.duration)
        .sum()
}

fn libcni_add(b: &BenchNode, plan: &Plan) -> Result<(), Stop> {
    let node = &b.node;
    meshed_add_works(node)?;

    let mut with = Samples::new();
    let mut without = Samples::new();
    let mut linkerd = Samples::new();
    let mut bridge = Samples::new();
    let (mut wall_with, mut wall_without) = (Samples::new(), Samples::new());
    let requests = b.api.total_requests();
    let warmup = 3;
    for i in 0..plan.libcni_pairs + warmup {
        checkpoint()?;
        let order = abab(i);
        for net in order {
            let pod = node.pod(PodSpec::kubernetes("bench", "meshed"));
            let t0 = Instant::now();
            let done = node
                .add(net, &pod)
                .map_err(|f| fail(format!("ADD {net} failed: {f}")))?;
            let wall = t0.elapsed();
            node.del(net, &pod)
                .map_err(|f| fail(format!("DEL {net} failed: {f}")))?;
            if i < warmup {
                continue;
            }
            if net == WITH {
                wall_with.push_duration(wall);
                with.push_duration(chain_time(&done));
                for e in done.execs("linkerd-cni").filter(|e| e.command == "ADD") {
                    linkerd.push_duration(e.duration);
                }
            } else {
                wall_without.push_duration(wall);
                without.push_duration(chain_time(&done));
                for e in done.execs("bridge").filter(|e| e.command == "ADD") {
                    bridge.push_duration(e.duration);
                }
            }
        }
    }
    let gets = b.api.total_requests() - requests;
    report_libcni_add(
        [
            &with,
            &without,
            &linkerd,
            &bridge,
            &wall_with,
            &wall_without,
        ],
        gets as f64 / (with.len() + warmup) as f64,
    );
    Ok(())
}

/// Sanity first: the meshed pod gets linkerd's rules through this chain.
fn meshed_add_works(node: &Node) -> Result<(), Stop> {
    let pod = node.pod(PodSpec::kubernetes("bench", "meshed"));
    node.add(WITH, &pod)
        .map_err(|f| fail(format!("ADD failed: {f}")))?;
    let lines = pod
        .nat(testkit::chart::backend(), Family::V4)
        .linkerd_lines();
    if lines.len() != 9 {
        return Err(fail(format!(
            "the meshed pod did not get linkerd's 9 nat lines: {lines:?}"
        )));
    }
    let _ = node.del(WITH, &pod);
    Ok(())
}

/// Section 1 of the report: `gets_per_add`, API requests per meshed ADD.
fn report_libcni_add(samples: [&Samples; 6], gets_per_add: f64) {
    let [with, without, linkerd, bridge, wall_with, wall_without] = samples;
    println!();
    println!("## 1. Meshed pod ADD through libcni");
    println!();
    println!(
        "{} pairs, interleaved. Time = libcni's own timing of each plugin execution of the \
         ADD, summed (what a runtime embedding libcni waits for).",
        with.len()
    );
    println!();
    println!("| chain | median [p10–p90] |");
    println!("|---|---|");
    println!(
        "| bridge → portmap → linkerd-cni (meshed pod: GET pod + namespace, rules) | {} |",
        with.summary("ms")
    );
    println!("| bridge → portmap | {} |", without.summary("ms"));
    println!(
        "| *linkerd-cni's execution alone* | {} |",
        linkerd.summary("ms")
    );
    println!("| *bridge's execution alone* | {} |", bridge.summary("ms"));
    println!(
        "| *whole driver run with linkerd-cni (+ `ip netns exec`, Go start-up, result \
         cache)* | {} |",
        wall_with.summary("ms")
    );
    println!(
        "| *whole driver run without* | {} |",
        wall_without.summary("ms")
    );
    println!();
    println!(
        "Ratio of medians with / without: **{:.2}×**; per-pair difference (linkerd-cni's \
         added latency): {}. API requests: {:.1} per meshed ADD.",
        ratio(with, without),
        paired_differences(with, without).summary("ms"),
        gets_per_add
    );
}

// 2 and 3 ----------------------------------------------------------------

fn pass_through(b: &BenchNode, plan: &Plan) -> Result<(), Stop> {
    let node = &b.node;
    let active = node.active_conf().ok_or_else(|| fail("no active config"))?;
    let active_before = std::fs::read(&active).map_err(|e| fail(e.to_string()))?;

    let mut heal_off_entry = b.entry.clone();
    heal_off_entry["chain_heal"] = false.into();
    let tuning_conf = json!({"type": "tuning", "dataDir": node.dir().join("tuning")});
    let tuning = node.bin_dir().join("tuning");
    let variants = [
        (
            "linkerd-cni, exempt pod (kube-system: no API call), chain check on",
            b.invocation(&b.plugin, &b.entry, "kube-system", "coredns"),
        ),
        (
            "linkerd-cni, exempt pod, chain check off (`chain_heal: false`)",
            b.invocation(&b.plugin, &heal_off_entry, "kube-system", "coredns"),
        ),
        (
            "linkerd-cni, unmeshed pod (GET pod: no linkerd-proxy)",
            b.invocation(&b.plugin, &b.entry, "bench", "plain"),
        ),
        (
            "tuning (Go reference plugin), no settings",
            b.invocation(&tuning, &tuning_conf, "bench", "direct"),
        ),
    ];
    let n = variants.len();
    let rounds = plan.direct_rounds;
    let requests = b.api.total_requests();
    // The steady state of a node: its files older than the memo's racy
    // bound, so that the warm-up ADD remembers the healthy verdict.
    std::thread::sleep(linkerd_cni_state::memo::RACY + Duration::from_millis(100));
    let samples: Vec<Samples> = node.netns().enter(|| {
        let mut s = vec![Samples::new(); n];
        for warm in &variants {
            warm.1.run_ok(warm.0)?;
        }
        for i in 0..rounds {
            checkpoint()?;
            // Rotate the order: each variant runs first as often as the others.
            for k in 0..n {
                let v = (i + k) % n;
                let (name, inv) = &variants[v];
                let (d, out) = inv.run_ok(name)?;
                let stderr = String::from_utf8_lossy(&out.stderr);
                if stderr.contains("chain") {
                    return Err(fail(format!("{name}: unexpected chain log: {stderr}")));
                }
                s[v].push_duration(d);
            }
        }
        Ok::<_, Stop>(s)
    })?;
    let gets = b.api.total_requests() - requests;
    if gets != rounds + 1 {
        return Err(fail(format!(
            "expected one API request per unmeshed run ({}), the server got {gets}",
            rounds + 1
        )));
    }
    let active_after = std::fs::read(&active).map_err(|e| fail(e.to_string()))?;
    if active_after != active_before {
        return Err(fail("a healthy chain check rewrote the active config"));
    }

    let names: Vec<&str> = variants.iter().map(|(name, _)| *name).collect();
    report_pass_through(&names, &samples, rounds);
    let unmeshed_off = b.invocation(&b.plugin, &heal_off_entry, "bench", "plain");
    callgrind(
        node,
        plan,
        &[
            ("exempt pod, chain check on", &variants[0].1),
            ("exempt pod, chain check off", &variants[1].1),
            ("unmeshed pod (one GET), chain check on", &variants[2].1),
            ("unmeshed pod, chain check off", &unmeshed_off),
        ],
    )?;
    Ok(())
}

/// Sections 2 and 3 of the report: `samples[i]` are the runs of
/// `names[i]`; the first two are the chain check on and off, the fourth
/// tuning.
fn report_pass_through(names: &[&str], samples: &[Samples], rounds: usize) {
    println!();
    println!("## 2. Pass-through ADD vs a Go reference plugin (process start-up floor)");
    println!();
    println!(
        "{rounds} rounds, order rotated. Each plugin is spawned directly in the node with \
         the environment and stdin libcni builds (prevResult from a bridge ADD), timed from \
         spawn to exit."
    );
    println!();
    println!("| plugin execution | median [p10–p90] | vs tuning |");
    println!("|---|---|---|");
    let tuning_s = &samples[3];
    for (name, s) in names.iter().zip(samples) {
        println!(
            "| {name} | {} | {:.2}× |",
            s.summary("ms"),
            ratio(s, tuning_s)
        );
    }
    println!();
    println!("## 3. The healthy chain check's cost per ADD");
    println!();
    let diff = paired_differences(&samples[0], &samples[1]);
    println!(
        "Same runs as above, `chain_heal` on vs off (exempt pod, so nothing else differs): \
         ratio of medians **{:.3}×**, per-round difference {} (once the conf dir's files are \
         older than the memo's racy bound, the verdict of the last healthy look, checked by \
         the files' stamps; before, a full look: the entry file and the active file read and \
         parsed. No lock, no write into the conf dir: the active file was byte-identical \
         after all {} runs).",
        ratio(&samples[0], &samples[1]),
        diff.summary("ms"),
        rounds
    );
}

/// Instruction counts of the plugin under callgrind: repeatable where
/// wall time is noisy.
fn callgrind(node: &Node, plan: &Plan, variants: &[(&str, &Invocation)]) -> Result<(), Stop> {
    let Some(valgrind) = conformance::sys::which("valgrind") else {
        println!();
        println!("(valgrind is not installed: no instruction counts; `apt-get install valgrind`.)");
        return Ok(());
    };
    let valgrind = valgrind.display().to_string();
    let out_file = node.dir().join("callgrind.out");
    let out_arg = format!("--callgrind-out-file={}", out_file.display());
    let counts: Vec<Samples> = node.netns().enter(|| {
        let mut all = Vec::new();
        for (name, inv) in variants {
            let mut s = Samples::new();
            for _ in 0..plan.callgrind_runs {
                checkpoint()?;
                let cmd = inv.command(&[&valgrind, "--tool=callgrind", &out_arg]);
                let out = spawn_with_stdin(cmd, &inv.stdin)?;
                let stderr = String::from_utf8_lossy(&out.stderr);
                let collected = stderr
                    .lines()
                    .find_map(|l| l.split("Collected :").nth(1))
                    .and_then(|n| n.trim().parse::<f64>().ok());
                match (out.status.success(), collected) {
                    (true, Some(n)) => s.push(n),
                    _ => return Err(fail(format!("callgrind of {name} failed: {stderr}"))),
                }
            }
            all.push(s);
        }
        Ok::<_, Stop>(all)
    })?;
    let _ = std::fs::remove_file(&out_file);
    println!();
    println!(
        "Instructions executed by the whole plugin process (`valgrind --tool=callgrind`, \
         median of {} run(s) each):",
        plan.callgrind_runs
    );
    println!();
    println!("| variant | instructions |");
    println!("|---|---|");
    for ((name, _), s) in variants.iter().zip(&counts) {
        println!("| {name} | {:.0} |", s.median());
    }
    if let [on, off, unmeshed_on, unmeshed_off] = counts.as_slice() {
        let check = on.median() - off.median();
        let unmeshed_check = unmeshed_on.median() - unmeshed_off.median();
        println!();
        println!(
            "The check costs {check:.0} instructions ({:.1}% of the exempt ADD); in the \
             unmeshed ADD {unmeshed_check:.0} ({:.1}% of it).",
            100.0 * check / on.median(),
            100.0 * unmeshed_check / unmeshed_on.median()
        );
    }
    Ok(())
}

// 4 ----------------------------------------------------------------------

/// A node with an installer and a primary config, for heal times.
struct HealNode {
    installer: Option<InstallerProcess>,
    node: Node,
    opts: InstallerOptions,
    heals: usize,
}

impl HealNode {
    fn new(bins: &Binaries, watch: bool) -> Result<HealNode, Stop> {
        let node = Node::without_linkerd_cni();
        node.write_conf("10-primary.conflist", &primary(&node));
        let opts = InstallerOptions {
            watch,
            resync: RESYNC,
        };
        let mut h = HealNode {
            installer: None,
            node,
            opts,
            heals: 0,
        };
        h.restart(bins)?;
        Ok(h)
    }

    /// A fresh installer (fresh fight history), started and chained.
    fn restart(&mut self, bins: &Binaries) -> Result<(), Stop> {
        drop(self.installer.take());
        let mut inst =
            scenario::start_installer(&self.node, bins, None, self.opts).map_err(fail)?;
        let end = Instant::now() + Duration::from_secs(10);
        while !self.node.linkerd_last() {
            checkpoint()?;
            if Instant::now() > end || !inst.running() {
                return Err(fail(format!(
                    "the installer did not chain the node: {}",
                    inst.new_log_lines().join("\n")
                )));
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        self.installer = Some(inst);
        Ok(())
    }

    /// The primary rewrites its conflist without linkerd-cni; returns the
    /// time until the active file ends with linkerd-cni again.
    fn measure(&mut self, bins: &Binaries, phase: Duration) -> Result<Duration, Stop> {
        if self.heals == HEALS_PER_INSTALLER {
            self.restart(bins)?;
            self.heals = 0;
            // Past its first pass (milliseconds), which would otherwise
            // catch the rewrite below at start-up.
            stop::sleep(Duration::from_millis(300))?;
        }
        stop::sleep(phase)?;
        self.node
            .write_conf("10-primary.conflist", &primary(&self.node));
        let t0 = Instant::now();
        let limit = RESYNC * 3 + Duration::from_secs(2);
        while !self.node.linkerd_last() {
            checkpoint()?;
            if t0.elapsed() > limit {
                let log = self
                    .installer
                    .as_mut()
                    .map(|i| i.new_log_lines().join("\n"))
                    .unwrap_or_default();
                return Err(fail(format!("no heal within {limit:?}: {log}")));
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        self.heals += 1;
        Ok(t0.elapsed())
    }
}

fn primary(node: &Node) -> Value {
    chains::conflist(
        "k8s-pod-network",
        "1.0.0",
        chains::typical_chain(node, Primary::Bridge, None)[..2].to_vec(),
    )
}

fn installer_heal(bins: &Binaries, plan: &Plan) -> Result<(), Stop> {
    let mut watch = HealNode::new(bins, true)?;
    let mut resync = HealNode::new(bins, false)?;
    let mut rng = XorShift::seeded();
    let (mut w, mut r) = (Samples::new(), Samples::new());
    for i in 0..plan.installer_heals {
        for k in 0..2 {
            // A random phase against the installer's timer, as a real
            // primary's restart has.
            let phase = RESYNC.mul_f64(rng.unit());
            if (i + k) % 2 == 0 {
                w.push_duration(watch.measure(bins, phase)?);
            } else {
                r.push_duration(resync.measure(bins, phase)?);
            }
        }
    }
    println!();
    println!("## 4. Heal time after the primary rewrites its conflist without linkerd-cni");
    println!();
    println!(
        "Installer: {} rewrites per variant, interleaved, each at a random phase of the \
         installer's {} s resync timer (the chart's default is 10 s); time from the \
         primary's rename to the active file ending with linkerd-cni again (polled every \
         1 ms).",
        w.len(),
        RESYNC.as_secs()
    );
    println!();
    println!("| installer | median [p10–p90] | max |");
    println!("|---|---|---|");
    println!(
        "| watch on (inotify, 100 ms debounce) + resync | {} | {} ms |",
        w.summary("ms"),
        fmt_num(w.max())
    );
    println!(
        "| resync only (`LINKERD_CNI_WATCH=false`) | {} | {} ms |",
        r.summary("ms"),
        fmt_num(r.max())
    );
    println!();
    println!(
        "Ratio of medians resync-only / watch: {:.1}×. Resync-only heal time is spread over \
         the whole period, as expected of a timer: its median is about half the period.",
        ratio(&r, &w)
    );
    Ok(())
}

fn plugin_repair(b: &BenchNode, plan: &Plan) -> Result<(), Stop> {
    let node = &b.node;
    let active = node.conf_dir().join(WITH_FILE);
    let healthy = with_chain(node, &b.entry);
    let mut broken = healthy.clone();
    if let Some(p) = broken["plugins"].as_array_mut() {
        p.push(json!({"type": "tuning"}));
    }
    let state = node.state_dir().join("chain-repairs.json");
    let inv = b.invocation(&b.plugin, &b.entry, "kube-system", "coredns");
    let (mut repaired, mut plain) = (Samples::new(), Samples::new());
    node.netns().enter(|| {
        for i in 0..plan.repair_pairs + 2 {
            checkpoint()?;
            for k in 0..2 {
                let repair = (i + k) % 2 == 0;
                // Untimed: the primary's write, and a clean fight history
                // (the plugin would rightly back off after 5 repairs).
                node.write_conf(WITH_FILE, if repair { &broken } else { &healthy });
                let _ = std::fs::remove_file(&state);
                let (d, out) = inv.run_ok("repair run")?;
                let stderr = String::from_utf8_lossy(&out.stderr);
                if repair != stderr.contains("chain: repaired") || !node.linkerd_last() {
                    return Err(fail(format!(
                        "{} run: unexpected outcome: {stderr}",
                        if repair { "repair" } else { "healthy" }
                    )));
                }
                if i >= 2 {
                    if repair {
                        repaired.push_duration(d);
                    } else {
                        plain.push_duration(d);
                    }
                }
            }
        }
        Ok::<_, Stop>(())
    })?;
    node.write_conf(WITH_FILE, &healthy);
    if node.active_conf().as_deref() != Some(active.as_path()) {
        return Err(fail("the with-linkerd conflist is not the active one"));
    }
    println!();
    println!(
        "Plugin: an exempt-pod ADD (run directly, as in 2) while linkerd-cni is not last in \
         the active file (a primary appended a plugin after it), vs the same ADD on a healthy \
         file; {} pairs, interleaved. The repair (lock, re-read, atomic exchange, fsync) is \
         done before the ADD returns, so the ADD's time bounds the heal time.",
        repaired.len()
    );
    println!();
    println!("| ADD | median [p10–p90] |");
    println!("|---|---|");
    println!("| with a repair | {} |", repaired.summary("ms"));
    println!("| healthy chain | {} |", plain.summary("ms"));
    println!();
    println!(
        "Repair cost per ADD (per-pair difference): {}; ratio {:.2}×.",
        paired_differences(&repaired, &plain).summary("ms"),
        ratio(&repaired, &plain)
    );
    Ok(())
}

// 5 ----------------------------------------------------------------------

fn throughput(b: &BenchNode, plan: &Plan) -> Result<(), Stop> {
    let node = &b.node;
    let mut rows = Vec::new();
    for &(n, rounds) in &plan.concurrency {
        let (mut with, mut without) = (Samples::new(), Samples::new());
        for i in 0..rounds {
            checkpoint()?;
            let order = abab(i);
            for net in order {
                let pods: Vec<_> = (0..n)
                    .map(|_| node.pod(PodSpec::kubernetes("bench", "meshed")))
                    .collect();
                let barrier = Barrier::new(n + 1);
                let (elapsed, failures) = std::thread::scope(|s| {
                    let handles: Vec<_> = pods
                        .iter()
                        .map(|p| {
                            let barrier = &barrier;
                            s.spawn(move || {
                                barrier.wait();
                                node.add(net, p).is_ok()
                            })
                        })
                        .collect();
                    barrier.wait();
                    let t0 = Instant::now();
                    let ok = handles
                        .into_iter()
                        .map(|h| h.join().unwrap_or(false))
                        .filter(|ok| !ok)
                        .count();
                    (t0.elapsed(), ok)
                });
                std::thread::scope(|s| {
                    for p in &pods {
                        s.spawn(move || {
                            let _ = node.del(net, p);
                        });
                    }
                });
                drop(pods);
                if failures > 0 {
                    return Err(fail(format!("{failures} of {n} concurrent ADDs failed")));
                }
                let rate = n as f64 / elapsed.as_secs_f64();
                if net == WITH {
                    with.push(rate);
                } else {
                    without.push(rate);
                }
            }
        }
        rows.push((n, rounds, with, without));
    }
    println!();
    println!("## 5. Throughput: N concurrent ADDs of meshed pods through libcni");
    println!();
    println!(
        "Each ADD is one libcni driver process (so its Go start-up is included, unlike in a \
         runtime that embeds libcni); N started together, pods/s = N / time until the last \
         one finished. Rounds interleaved with / without linkerd-cni. CPUs: 2."
    );
    println!();
    println!(
        "| N | rounds | with linkerd-cni, pods/s median [min–max] | without, pods/s | with / without |"
    );
    println!("|---|---|---|---|---|");
    for (n, rounds, with, without) in rows {
        println!(
            "| {n} | {rounds} | {} [{}–{}] | {} [{}–{}] | {:.2} |",
            fmt_num(with.median()),
            fmt_num(with.min()),
            fmt_num(with.max()),
            fmt_num(without.median()),
            fmt_num(without.min()),
            fmt_num(without.max()),
            ratio(&with, &without)
        );
    }
    Ok(())
}

// nft --------------------------------------------------------------------

/// A meshed ADD per iptables mode, each on a fresh pod netns: nft mode
/// programming nf_tables in-process, against the restore path for the
/// same nf_tables rules (mode `plain`, where Debian's `iptables` is
/// iptables-nft: `iptables-nft-save` then `iptables-nft-restore`, what nft
/// mode ran before), and legacy for reference. Wall time spawn to exit,
/// rounds rotated; instructions across the process tree (the plugin and
/// every iptables it runs) under callgrind.
fn nft_mode(b: &BenchNode, plan: &Plan) -> Result<(), Stop> {
    let iptables = std::fs::canonicalize("/usr/sbin/iptables").unwrap_or_default();
    if !iptables.ends_with("xtables-nft-multi") {
        return Err(fail(format!(
            "/usr/sbin/iptables is {}, not iptables-nft: mode plain would not be nft's restore path",
            iptables.display()
        )));
    }
    let variants = [
        ("nft, in-process (netlink)", "nft"),
        (
            "restore path: `iptables-nft-save` + `iptables-nft-restore` (mode plain)",
            "plain",
        ),
        ("legacy: `iptables-legacy-restore`", "legacy"),
    ];
    let entries: Vec<Value> = variants
        .iter()
        .map(|(_, mode)| {
            let mut e = b.entry.clone();
            e["linkerd"]["iptables-mode"] = (*mode).into();
            e
        })
        .collect();
    let invocation = |k: usize, ns: &testkit::TestNetns| {
        let mut inv = b.invocation(&b.plugin, &entries[k], "bench", "meshed");
        for (key, v) in &mut inv.env {
            if key == "CNI_NETNS" {
                *v = ns.path().display().to_string();
            }
        }
        inv
    };
    let backend = |k: usize| {
        if variants[k].1 == "legacy" {
            Backend::Legacy
        } else {
            Backend::Nft
        }
    };
    let names: Vec<&str> = variants.iter().map(|(name, _)| *name).collect();
    let rounds = plan.direct_rounds / 4;
    let samples = rotated_adds(b, &names, rounds, &invocation, &|k| Some(backend(k)))?;
    println!();
    println!("## 10. Meshed ADD: nft mode in-process vs the restore path");
    println!();
    println!(
        "{rounds} rounds, order rotated, a fresh pod netns per ADD. The plugin spawned \
         directly in the node (GET pod + namespace from the fake API server, then the rules), \
         timed from spawn to exit."
    );
    println!();
    println!("| iptables-mode | median [p10–p90] | vs nft in-process |");
    println!("|---|---|---|");
    for ((name, _), smp) in variants.iter().zip(&samples) {
        println!(
            "| {name} | {} | {:.2}× |",
            smp.summary("ms"),
            ratio(smp, &samples[0])
        );
    }
    println!();
    println!(
        "Per-round difference restore path − in-process: {}.",
        paired_differences(&samples[1], &samples[0]).summary("ms")
    );

    let Some(counts) = tree_instructions(b, plan, &names, &invocation)? else {
        return Ok(());
    };
    println!();
    println!(
        "Instructions (`valgrind --tool=callgrind --trace-children=yes`, median of {} run(s)):",
        plan.callgrind_runs
    );
    println!();
    println!(
        "| iptables-mode | processes | whole process tree | the plugin process | vs nft in-process (tree) |"
    );
    println!("|---|---|---|---|---|");
    for ((name, _), c) in variants.iter().zip(&counts) {
        println!(
            "| {name} | {} | {:.0} | {:.0} | {:.2}× |",
            c.processes,
            c.tree.median(),
            c.plugin.median(),
            c.tree.median() / counts[0].tree.median()
        );
    }
    Ok(())
}

// 11 ---------------------------------------------------------------------

/// 11: a meshed ADD (nft mode) whose pod facts come from the node agent
/// over its socket, beside the same ADD on the direct path (GET pod and
/// namespace over TLS from the fake API server) and Debian's `tuning`.
/// Wall time spawn to exit, rounds rotated; instructions across the
/// process tree under callgrind; the agent's own CPU per lookup.
fn agent_add(b: &BenchNode, plan: &Plan) -> Result<(), Stop> {
    let cluster = testkit::WatchApiServer::start();
    let node_name = "bench-node";
    cluster.put_object("namespaces", objects::namespace("bench", &[]));
    cluster.put_pod(objects::on_node(
        objects::Pod::meshed("bench", "meshed").json(),
        node_name,
    ));
    let state = b.node.dir().join("agent-state");
    let agent =
        AgentProcess::start(&cluster, node_name, &b.node.conf_dir(), &state).map_err(fail)?;
    agent
        .wait_answering("bench", "meshed", Duration::from_secs(30))
        .map_err(fail)?;
    let socket = agent.socket().to_path_buf();
    let question = linkerd_cni_lookup::Request {
        v: linkerd_cni_lookup::VERSION,
        namespace: "bench".into(),
        name: "meshed".into(),
        uid: None,
        budget_ms: 1000,
    };

    let mut via_agent = b.entry.clone();
    via_agent["state_dir"] = state.display().to_string().into();
    via_agent["linkerd"]["iptables-mode"] = "nft".into();
    let mut direct = b.entry.clone();
    direct["linkerd"]["iptables-mode"] = "nft".into();
    let tuning_conf = json!({"type": "tuning", "dataDir": b.node.dir().join("tuning")});
    let tuning = b.node.bin_dir().join("tuning");
    let direct_name = format!(
        "linkerd-cni, meshed pod, direct: GET pod + namespace over TLS ({})",
        api_server_key()
    );
    let variants: [(&str, Option<&Value>); 3] = [
        (
            "linkerd-cni, meshed pod, facts from the node agent",
            Some(&via_agent),
        ),
        (&direct_name, Some(&direct)),
        ("tuning (Go reference plugin), no settings", None),
    ];
    let invocation = |k: usize, ns: &testkit::TestNetns| match variants[k].1 {
        Some(entry) => {
            let mut inv = b.invocation(&b.plugin, entry, "bench", "meshed");
            for (key, v) in &mut inv.env {
                if key == "CNI_NETNS" {
                    *v = ns.path().display().to_string();
                }
            }
            inv
        }
        None => {
            let mut inv = b.invocation(&tuning, &tuning_conf, "bench", "direct");
            // Go's preemption signals crash valgrind now and then; a
            // process of a few milliseconds is not preempted anyway.
            inv.env.push(("GODEBUG".into(), "asyncpreemptoff=1".into()));
            inv
        }
    };
    // The steady state of a node: its files older than the memo's racy
    // bound, so that the warm-up ADD remembers the healthy verdict.
    std::thread::sleep(linkerd_cni_state::memo::RACY + Duration::from_millis(100));
    let names: Vec<&str> = variants.iter().map(|(name, _)| *name).collect();
    let rounds = plan.direct_rounds / 4;
    let requests = b.api.total_requests();
    let cpu_before = agent.cpu();
    let samples = rotated_adds(b, &names, rounds, &invocation, &|k| {
        variants[k].1.map(|_| Backend::Nft)
    })?;
    let agent_cpu = agent.cpu().saturating_sub(cpu_before);
    // Two GETs (pod, namespace) per direct ADD, none through the agent.
    let gets = b.api.total_requests() - requests;
    if gets != 2 * (rounds + 2) {
        return Err(fail(format!(
            "expected two API requests per direct ADD and none through the agent ({}), the \
             plugin's API server got {gets}",
            2 * (rounds + 2)
        )));
    }
    println!();
    println!("## 11. Meshed ADD: facts from the node agent vs the direct path vs `tuning`");
    println!();
    println!(
        "{rounds} rounds, order rotated, a fresh pod netns per linkerd-cni ADD (nft mode). The \
         plugin spawned directly in the node, timed from spawn to exit; the agent (the repair \
         controller's binary) answers from its watch of a fake API server on loopback."
    );
    println!();
    println!("| plugin execution | median [p10–p90] | vs tuning |");
    println!("|---|---|---|");
    for ((name, _), smp) in variants.iter().zip(&samples) {
        println!(
            "| {name} | {} | {:.2}× |",
            smp.summary("ms"),
            ratio(smp, &samples[2])
        );
    }
    // The agent's own cost per lookup, over enough questions for /proc's
    // 10 ms ticks, asked back to back from here.
    const ASKED: usize = 2000;
    let cpu_before = agent.cpu();
    let started = Instant::now();
    for _ in 0..ASKED {
        linkerd_cni_lookup::ask(&socket, &question, Duration::from_secs(1))
            .map_err(|e| fail(format!("lookup: {e}")))?;
    }
    let asked_wall = started.elapsed();
    let asked_cpu = agent.cpu().saturating_sub(cpu_before);
    println!();
    println!(
        "The agent's own CPU: {:.0} ms over the {} lookups above; over {ASKED} lookups asked \
         back to back, {:.0} µs per lookup (/proc ticks of 10 ms: ±{:.0} µs), {:.0} µs round \
         trip each as the asker sees it. Its resident memory: {} KiB.",
        agent_cpu.as_secs_f64() * 1e3,
        rounds + 2,
        asked_cpu.as_secs_f64() * 1e6 / ASKED as f64,
        10e3 / ASKED as f64,
        asked_wall.as_secs_f64() * 1e6 / ASKED as f64,
        agent.rss_kib()
    );

    let Some(counts) = tree_instructions(b, plan, &names, &invocation)? else {
        return Ok(());
    };
    println!();
    println!(
        "Instructions (`valgrind --tool=callgrind --trace-children=yes`, median of {} run(s)):",
        plan.callgrind_runs
    );
    println!();
    println!("| plugin execution | processes | whole process tree | vs tuning |");
    println!("|---|---|---|---|");
    for ((name, _), c) in variants.iter().zip(&counts) {
        println!(
            "| {name} | {} | {:.0} | {:.2}× |",
            c.processes,
            c.tree.median(),
            c.tree.median() / counts[2].tree.median()
        );
    }
    agent_scale(&agent, &cluster, &socket, node_name)
}

/// The agent at a node's and a large cluster's scale: its memory and idle
/// CPU with 110 pods on its node (the kubelet's default maximum) and
/// 10,000 namespaces, and what its watches cost the API server while idle.
fn agent_scale(
    agent: &AgentProcess,
    cluster: &testkit::WatchApiServer,
    socket: &Path,
    node_name: &str,
) -> Result<(), Stop> {
    const PODS: usize = 110;
    const NAMESPACES: usize = 10_000;
    const IDLE: Duration = Duration::from_secs(20);
    let (rss_small, watches) = (agent.rss_kib(), cluster.open_watches());
    for i in 0..NAMESPACES {
        cluster.put_object(
            "namespaces",
            objects::namespace(
                &format!("team-{i}"),
                &[
                    ("config.linkerd.io/skip-outbound-ports", "3306"),
                    (
                        "kubectl.kubernetes.io/last-applied-configuration",
                        &"x".repeat(512),
                    ),
                ],
            ),
        );
    }
    for i in 1..PODS {
        let ns = format!("team-{}", i * NAMESPACES / PODS);
        cluster.put_pod(objects::on_node(
            objects::Pod::meshed(&ns, &format!("web-{i}"))
                .annotation(
                    "kubectl.kubernetes.io/last-applied-configuration",
                    &"y".repeat(2048),
                )
                .json(),
            node_name,
        ));
    }
    let last = linkerd_cni_lookup::Request {
        v: linkerd_cni_lookup::VERSION,
        namespace: format!("team-{}", (PODS - 1) * NAMESPACES / PODS),
        name: format!("web-{}", PODS - 1),
        uid: None,
        budget_ms: 1000,
    };
    let synced = testkit::wait_until(Duration::from_secs(60), || {
        matches!(
            linkerd_cni_lookup::ask(socket, &last, Duration::from_secs(1)).map(|a| a.body),
            Ok(linkerd_cni_lookup::Body::Pod {
                source: linkerd_cni_lookup::Source::Watch,
                namespace: Some(_),
                ..
            })
        )
    });
    if !synced {
        return Err(fail("the agent never saw the 110th pod"));
    }
    std::thread::sleep(Duration::from_secs(2));
    let requests = cluster.requests().len();
    let cpu = agent.cpu();
    std::thread::sleep(IDLE);
    let idle_cpu = agent.cpu().saturating_sub(cpu);
    let idle_requests = cluster.requests().len() - requests;
    println!();
    println!("### The agent at scale");
    println!();
    println!(
        "| agent | resident memory | idle CPU over {:.0} s | API requests while idle | open watches |",
        IDLE.as_secs_f64()
    );
    println!("|---|---|---|---|---|");
    println!("| 1 pod, 1 namespace | {rss_small} KiB | | | {watches} |");
    println!(
        "| {PODS} pods on its node, {NAMESPACES} namespaces (each with a 512-byte annotation it does not keep) | {} KiB | {:.0} ms | {idle_requests} | {} |",
        agent.rss_kib(),
        idle_cpu.as_secs_f64() * 1e3,
        cluster.open_watches()
    );
    Ok(())
}

/// `rounds` of ADDs in the node, each in a fresh pod netns, the variants'
/// order rotated, after two warm-up rounds: the wall time of each. On the
/// first round, a variant for which `backend` names a table must have left
/// linkerd's 9 nat lines there.
fn rotated_adds(
    b: &BenchNode,
    names: &[&str],
    rounds: usize,
    invocation: &(dyn Fn(usize, &testkit::TestNetns) -> Invocation + Sync),
    backend: &(dyn Fn(usize) -> Option<Backend> + Sync),
) -> Result<Vec<Samples>, Stop> {
    let n = names.len();
    b.node.netns().enter(|| {
        let mut s = vec![Samples::new(); n];
        for i in 0..rounds + 2 {
            checkpoint()?;
            for k in 0..n {
                let v = (i + k) % n;
                let ns = testkit::TestNetns::new("bench-add").map_err(|e| fail(e.to_string()))?;
                let (d, _) = invocation(v, &ns).run_ok(names[v])?;
                if let (0, Some(backend)) = (i, backend(v)) {
                    let lines =
                        conformance::NatTable::read(&ns, backend, Family::V4).linkerd_lines();
                    if lines.len() != 9 {
                        return Err(fail(format!(
                            "{}: not linkerd's 9 nat lines: {lines:?}",
                            names[v]
                        )));
                    }
                }
                if i >= 2 {
                    s[v].push_duration(d);
                }
            }
        }
        Ok::<_, Stop>(s)
    })
}

/// Instructions of one variant's runs under callgrind.
struct Counted {
    /// The whole process tree's.
    tree: Samples,
    /// The plugin process's alone.
    plugin: Samples,
    /// How many processes the tree had.
    processes: usize,
}

/// Instructions of each variant's ADD under callgrind, in a fresh pod netns
/// per run, or `None` (said on stdout) without valgrind.
fn tree_instructions(
    b: &BenchNode,
    plan: &Plan,
    names: &[&str],
    invocation: &(dyn Fn(usize, &testkit::TestNetns) -> Invocation + Sync),
) -> Result<Option<Vec<Counted>>, Stop> {
    let Some(valgrind) = conformance::sys::which("valgrind") else {
        println!();
        println!("(valgrind is not installed: no instruction counts; `apt-get install valgrind`.)");
        return Ok(None);
    };
    let valgrind = valgrind.display().to_string();
    let out_arg = format!(
        "--callgrind-out-file={}",
        b.node.dir().join("add.%p.callgrind").display()
    );
    b.node.netns().enter(|| {
        let mut all = Vec::new();
        for (k, name) in names.iter().enumerate() {
            let (mut tree, mut plugin) = (Samples::new(), Samples::new());
            let mut processes = 0;
            for _ in 0..plan.callgrind_runs {
                checkpoint()?;
                let ns = testkit::TestNetns::new("bench-add").map_err(|e| fail(e.to_string()))?;
                let inv = invocation(k, &ns);
                let cmd = inv.command(&[
                    &valgrind,
                    "--tool=callgrind",
                    "--trace-children=yes",
                    &out_arg,
                ]);
                let out = spawn_with_stdin(cmd, &inv.stdin)?;
                if !out.status.success() {
                    let stderr = String::from_utf8_lossy(&out.stderr);
                    return Err(fail(format!("callgrind of {name} failed: {stderr}")));
                }
                // One output file per process (children's valgrind
                // output goes to the pipes the plugin reads): its command
                // and its total.
                let (mut sum, mut own) = (0.0, 0.0);
                let outputs = callgrind_outputs(b.node.dir());
                processes = outputs.len();
                for (cmd, total) in outputs {
                    sum += total;
                    if cmd.contains("linkerd-cni") {
                        own += total;
                    }
                }
                tree.push(sum);
                plugin.push(own);
            }
            all.push(Counted {
                tree,
                plugin,
                processes,
            });
        }
        Ok::<_, Stop>(Some(all))
    })
}

/// The `(cmd, total instructions)` of every `*.callgrind` file in `dir`,
/// each removed once read.
fn callgrind_outputs(dir: &Path) -> Vec<(String, f64)> {
    let mut out = Vec::new();
    let Ok(rd) = std::fs::read_dir(dir) else {
        return out;
    };
    for e in rd.flatten() {
        if !e.file_name().to_string_lossy().ends_with(".callgrind") {
            continue;
        }
        let text = std::fs::read_to_string(e.path()).unwrap_or_default();
        let _ = std::fs::remove_file(e.path());
        let field = |k: &str| text.lines().find_map(|l| l.strip_prefix(k)).map(str::trim);
        let total = field("totals:")
            .or_else(|| field("summary:"))
            .and_then(|n| n.parse::<f64>().ok())
            .unwrap_or(0.0);
        out.push((field("cmd:").unwrap_or_default().to_string(), total));
    }
    out
}

// machine ----------------------------------------------------------------

/// Restricts this process (and so every child) to two CPUs of those it may
/// use, as the figures are stated for 2 cores. Returns the CPUs used.
fn pin_two_cpus() -> Vec<usize> {
    // SAFETY: cpu_set_t is plain data; sched_{get,set}affinity get a valid
    // pointer and its size.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return Vec::new();
        }
        let allowed: Vec<usize> = (0..libc::CPU_SETSIZE as usize)
            .filter(|&c| libc::CPU_ISSET(c, &set))
            .collect();
        let used: Vec<usize> = allowed.into_iter().take(2).collect();
        let mut two: libc::cpu_set_t = std::mem::zeroed();
        for &c in &used {
            libc::CPU_SET(c, &mut two);
        }
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &two);
        used
    }
}

fn text_of(cmd: &mut Command) -> String {
    cmd.output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default()
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

fn print_machine(cpus: &[usize], bins: &Binaries) {
    let lscpu = text_of(&mut Command::new("lscpu"));
    let field = |k: &str| {
        lscpu
            .lines()
            .find_map(|l| l.strip_prefix(k).map(|v| v.trim_start_matches(':').trim()))
            .unwrap_or("?")
            .to_string()
    };
    let pkg = |p: &str| text_of(Command::new("dpkg-query").args(["-W", "-f=${Version}", p]));
    let version = |bin: &Path| text_of(Command::new(bin).arg("version"));
    println!("# linkerd-cni benchmark run");
    println!();
    println!("| | |");
    println!("|---|---|");
    println!(
        "| CPU | {} ({} CPUs, {} per core; hypervisor {}) |",
        field("Model name"),
        field("CPU(s)"),
        field("Thread(s) per core"),
        field("Hypervisor vendor")
    );
    println!(
        "| CPUs used | {} |",
        cpus.iter()
            .map(usize::to_string)
            .collect::<Vec<_>>()
            .join(", ")
    );
    println!(
        "| kernel | {} |",
        text_of(Command::new("uname").args(["-sr"]))
    );
    println!("| rustc | {} |", text_of(Command::new("rustc").arg("-V")));
    println!("| go | {} |", text_of(Command::new("go").arg("version")));
    println!(
        "| libcni (golang-github-appc-cni-dev) | {} |",
        pkg("golang-github-appc-cni-dev")
    );
    println!(
        "| reference plugins (containernetworking-plugins) | {} |",
        pkg("containernetworking-plugins")
    );
    println!("| iptables | {} |", pkg("iptables"));
    println!("| plugin | {} |", version(&bins.plugin));
    println!("| installer | {} |", version(&bins.installer));
    println!("| fake API server's keys | {} |", api_server_key());
    println!("| load average at start | {} |", loadavg());
}

/// A tiny PRNG for the random phases of benchmark 4 (no crate for this).
struct XorShift(u64);

impl XorShift {
    fn seeded() -> XorShift {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        XorShift(nanos | 1)
    }

    /// Uniform in [0, 1).
    fn unit(&mut self) -> f64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 >> 11) as f64 / (1u64 << 53) as f64
    }
}

// 7, 8, 9 ----------------------------------------------------------------

/// The plugin builds a meshed ADD is measured with: this tree's, and with
/// `--baseline DIR` the one in DIR (e.g. the main branch's), interleaved.
fn plugin_variants(b: &BenchNode, baseline: Option<&Path>) -> Vec<(&'static str, PathBuf)> {
    let mut v = vec![("this build", b.plugin.clone())];
    if let Some(dir) = baseline {
        v.push(("baseline", dir.join("linkerd-cni")));
    }
    v
}

/// A fresh pod netns and the direct meshed ADD of `program` into it.
fn fresh_meshed(b: &BenchNode, program: &Path) -> (conformance::Pod, Invocation) {
    let pod = b.node.pod(PodSpec::kubernetes("bench", "meshed"));
    let inv = b.invocation_in(&pod, program, &b.entry, "bench", "meshed");
    (pod, inv)
}

/// linkerd's nat lines in `pod`, which must be the 9 of a meshed pod.
fn meshed_lines(pod: &conformance::Pod, what: &str) -> Result<Vec<String>, Stop> {
    // The upstream sequence programs legacy tables; the plugin, the
    // manifest's backend.
    let mut lines = pod.nat(Backend::Legacy, Family::V4).linkerd_lines();
    if lines.is_empty() {
        lines = pod.nat(Backend::Nft, Family::V4).linkerd_lines();
    }
    if lines.len() != 9 {
        return Err(fail(format!(
            "{what}: the pod did not get linkerd's 9 nat lines: {lines:?}"
        )));
    }
    Ok(lines)
}

/// 7: instructions of a meshed ADD, per process of the tree the plugin
/// starts (`valgrind --tool=callgrind --trace-children=yes`).
fn add_instructions(b: &BenchNode, plan: &Plan, baseline: Option<&Path>) -> Result<(), Stop> {
    let Some(valgrind) = conformance::sys::which("valgrind") else {
        println!();
        println!("(valgrind is not installed: no instruction counts; `apt-get install valgrind`.)");
        return Ok(());
    };
    let variants = plugin_variants(b, baseline);
    let dir = b.node.dir().join("callgrind-tree");
    // Per variant: (process, median instructions), in the order they ran.
    let mut tables: Vec<Vec<(String, f64)>> = Vec::new();
    for (name, program) in &variants {
        let mut runs: Vec<Vec<(String, u64)>> = Vec::new();
        for _ in 0..plan.callgrind_runs {
            checkpoint()?;
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).map_err(|e| fail(e.to_string()))?;
            let (pod, inv) = fresh_meshed(b, program);
            let out_arg = format!("--callgrind-out-file={}/cg.%p", dir.display());
            let cmd = inv.command(&[
                &valgrind.display().to_string(),
                "--tool=callgrind",
                "--trace-children=yes",
                &out_arg,
            ]);
            let out = b.node.enter(|| spawn_with_stdin(cmd, &inv.stdin))?;
            if !out.status.success() {
                return Err(fail(format!(
                    "callgrind of the {name} meshed ADD failed: {}",
                    String::from_utf8_lossy(&out.stderr)
                )));
            }
            meshed_lines(&pod, name)?;
            runs.push(process_counts(&dir)?);
            keep_callgrind_files(&dir, name)?;
        }
        tables.push(median_parts(&runs));
    }
    let _ = std::fs::remove_dir_all(&dir);

    println!();
    println!("## 7. Where a meshed ADD's instructions go");
    println!();
    println!(
        "A direct meshed ADD (pod + namespace GET, rules into a fresh pod netns in the \
         manifest's iptables mode, nft: over netlink, in-process) under `valgrind \
         --tool=callgrind --trace-children=yes`: instructions per \
         process of the tree, median of {} run(s). Unlike wall time, the count does not \
         depend on the machine's load.",
        plan.callgrind_runs
    );
    println!();
    let header: Vec<&str> = variants.iter().map(|(n, _)| *n).collect();
    println!("| process | {} |", header.join(" | "));
    println!("|---|{}", "---|".repeat(header.len()));
    let mut names: Vec<String> = Vec::new();
    for t in &tables {
        for (p, _) in t {
            if !names.contains(p) {
                names.push(p.clone());
            }
        }
    }
    // The plugin first, then its children (pid order can wrap).
    names.sort_by_key(|p| p != "linkerd-cni");
    let cell = |t: &Vec<(String, f64)>, p: &str| {
        t.iter()
            .find(|(q, _)| q == p)
            .map_or("–".to_string(), |(_, n)| format!("{:.2} M", n / 1e6))
    };
    for p in &names {
        let cells: Vec<String> = tables.iter().map(|t| cell(t, p)).collect();
        println!("| `{p}` | {} |", cells.join(" | "));
    }
    let totals: Vec<f64> = tables
        .iter()
        .map(|t| t.iter().map(|(_, n)| n).sum())
        .collect();
    println!(
        "| **whole ADD** | {} |",
        totals
            .iter()
            .map(|n| format!("**{:.2} M**", n / 1e6))
            .collect::<Vec<_>>()
            .join(" | ")
    );
    if let [now, base] = totals.as_slice() {
        println!();
        println!("This build / baseline: {:.2}×.", now / base);
    }
    Ok(())
}

/// With `BENCH_CALLGRIND_DIR` set, the run's callgrind files are copied
/// there (prefixed with the variant), for `callgrind_annotate` (of a build
/// with symbols: the release profile strips them).
fn keep_callgrind_files(dir: &Path, variant: &str) -> Result<(), Stop> {
    let Some(keep) = std::env::var_os("BENCH_CALLGRIND_DIR") else {
        return Ok(());
    };
    let keep = PathBuf::from(keep);
    let copy = || -> std::io::Result<()> {
        std::fs::create_dir_all(&keep)?;
        for e in std::fs::read_dir(dir)? {
            let e = e?;
            let name = format!(
                "{}.{}",
                variant.replace(' ', "-"),
                e.file_name().to_string_lossy()
            );
            std::fs::copy(e.path(), keep.join(name))?;
        }
        Ok(())
    };
    copy().map_err(|e| {
        fail(format!(
            "cannot keep the callgrind files in {}: {e}",
            keep.display()
        ))
    })
}

/// (program, instructions) of each callgrind output file in `dir`, one per
/// process, in pid order.
fn process_counts(dir: &Path) -> Result<Vec<(String, u64)>, Stop> {
    let mut files: Vec<(u64, PathBuf)> = std::fs::read_dir(dir)
        .map_err(|e| fail(e.to_string()))?
        .filter_map(Result::ok)
        .filter_map(|e| {
            let pid = e.file_name().to_str()?.strip_prefix("cg.")?.parse().ok()?;
            Some((pid, e.path()))
        })
        .collect();
    files.sort();
    let mut counts = Vec::new();
    for (_, path) in files {
        let text = std::fs::read_to_string(&path).map_err(|e| fail(e.to_string()))?;
        let field = |key: &str| text.lines().find_map(|l| l.strip_prefix(key));
        let program = field("cmd: ")
            .and_then(|c| c.split_whitespace().next())
            .map(|p| p.rsplit('/').next().unwrap_or(p).to_string())
            .ok_or_else(|| fail(format!("{}: no cmd line", path.display())))?;
        let n = field("summary: ")
            .or_else(|| field("totals: "))
            .and_then(|n| n.trim().parse().ok())
            .ok_or_else(|| fail(format!("{}: no instruction total", path.display())))?;
        counts.push((program, n));
    }
    Ok(counts)
}

/// Per process name (summed over processes of one name), the median over
/// runs.
fn median_parts(runs: &[Vec<(String, u64)>]) -> Vec<(String, f64)> {
    let mut names: Vec<String> = Vec::new();
    for r in runs {
        for (p, _) in r {
            if !names.contains(p) {
                names.push(p.clone());
            }
        }
    }
    names
        .into_iter()
        .map(|p| {
            let mut s = Samples::new();
            for r in runs {
                s.push(
                    r.iter()
                        .filter(|(q, _)| *q == p)
                        .map(|(_, n)| *n as f64)
                        .sum(),
                );
            }
            (p, s.median())
        })
        .collect()
}

/// 8: wall time of a direct meshed ADD, this build vs the baseline,
/// interleaved.
fn add_wall_time(b: &BenchNode, plan: &Plan, baseline: Option<&Path>) -> Result<(), Stop> {
    let variants = plugin_variants(b, baseline);
    let n = variants.len();
    let mut samples = vec![Samples::new(); n];
    let warmup = 1;
    for i in 0..plan.direct_rounds / 2 + warmup {
        checkpoint()?;
        for k in 0..n {
            let v = (i + k) % n;
            let (name, program) = &variants[v];
            let (pod, inv) = fresh_meshed(b, program);
            let (d, _) = b.node.enter(|| inv.run_ok(name))?;
            meshed_lines(&pod, name)?;
            if i >= warmup {
                samples[v].push_duration(d);
            }
        }
    }
    println!();
    println!("## 8. Meshed ADD, run directly");
    println!();
    println!(
        "{} rounds, order alternated: a direct meshed ADD (spawn to exit; pod + namespace \
         GET over TLS, the rules into a fresh pod netns in the manifest's iptables mode, \
         nft).",
        samples[0].len()
    );
    println!();
    println!("| plugin | median [p10–p90] |");
    println!("|---|---|");
    for ((name, _), s) in variants.iter().zip(&samples) {
        println!("| {name} | {} |", s.summary("ms"));
    }
    if let [now, base] = samples.as_slice() {
        println!();
        println!(
            "This build / baseline: **{:.2}×**; per-pair difference {}.",
            ratio(now, base),
            paired_differences(now, base).summary("ms")
        );
    }
    Ok(())
}

/// Upstream's command sequence for `set` in the netns at `netns`, as its
/// proxy-init package runs it in CNI mode: `*-save`, one `iptables` per
/// chain and rule, `*-save` again, each through `nsenter`.
fn upstream_commands(set: &RuleSet, netns: &Path) -> Vec<Command> {
    let mut argvs: Vec<Vec<String>> = vec![vec![
        "iptables-legacy-save".into(),
        "-t".into(),
        "nat".into(),
    ]];
    let ipt = |args: &[&str], spec: &str| {
        let mut v: Vec<String> = ["iptables-legacy", "-t", "nat"]
            .iter()
            .chain(args)
            .map(|s| s.to_string())
            .collect();
        // Comments have no spaces: the spec splits like a shell would.
        v.extend(
            spec.split_whitespace()
                .map(|w| w.trim_matches('"').to_string()),
        );
        v
    };
    for ((chain, specs), jump) in set.chains().iter().zip(JUMPS) {
        argvs.push(ipt(&["-N", *chain], ""));
        for spec in specs {
            argvs.push(ipt(&["-A", *chain], spec));
        }
        argvs.push(ipt(&["-A", jump.from], &jump.spec()));
    }
    argvs.push(argvs[0].clone());
    argvs
        .into_iter()
        .map(|argv| {
            let mut c = Command::new("nsenter");
            c.arg(format!("--net={}", netns.display()))
                .arg("--")
                .args(argv)
                .env("PATH", child_path())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
            c
        })
        .collect()
}

/// 9: upstream's per-pod command sequence vs ours, same rules, same run.
fn upstream_sequence(b: &BenchNode, plan: &Plan) -> Result<(), Stop> {
    let set = RuleSet::build(&RedirectSpec::default(), IptFamily::V4);
    let driver = Driver::new(IptablesMode::Legacy, false);
    // What each variant leaves must be what the plugin's ADD leaves.
    let (pod, inv) = fresh_meshed(b, &b.plugin);
    b.node.enter(|| inv.run_ok("meshed ADD"))?;
    let want = meshed_lines(&pod, "the plugin")?;
    drop(pod);

    let names = [
        "ours: `*-save` + one `*-restore` in the pod netns (the plugin's code, in-process)",
        "upstream: 11 `nsenter` processes, one iptables command each",
        "our whole meshed ADD (process, API calls, rules)",
    ];
    let mut samples = vec![Samples::new(); names.len()];
    let warmup = 1;
    for i in 0..plan.direct_rounds / 2 + warmup {
        checkpoint()?;
        for k in 0..names.len() {
            let v = (i + k) % names.len();
            let pod = b.node.pod(PodSpec::kubernetes("bench", "meshed"));
            let d = match v {
                0 => {
                    let t0 = Instant::now();
                    driver
                        .apply(pod.netns_path(), std::slice::from_ref(&set))
                        .map_err(|e| fail(format!("{}: {e}", names[v])))?;
                    t0.elapsed()
                }
                1 => {
                    let mut cmds = upstream_commands(&set, pod.netns_path());
                    let t0 = Instant::now();
                    for c in &mut cmds {
                        let out = c.output().map_err(|e| fail(format!("nsenter: {e}")))?;
                        if !out.status.success() {
                            return Err(fail(format!(
                                "{:?}: {}",
                                c.get_args().collect::<Vec<_>>(),
                                String::from_utf8_lossy(&out.stderr)
                            )));
                        }
                    }
                    t0.elapsed()
                }
                _ => {
                    let inv = b.invocation_in(&pod, &b.plugin, &b.entry, "bench", "meshed");
                    b.node.enter(|| inv.run_ok(names[v]))?.0
                }
            };
            let got = meshed_lines(&pod, names[v])?;
            if got != want {
                return Err(fail(format!(
                    "{}: other rules than the plugin's: {got:?} vs {want:?}",
                    names[v]
                )));
            }
            if i >= warmup {
                samples[v].push_duration(d);
            }
        }
    }
    println!();
    println!("## 9. Upstream's per-pod command sequence vs ours");
    println!();
    println!(
        "{} rounds, order rotated, each on a fresh pod netns; all three leave the same 9 \
         nat lines (checked after every run). Upstream's linkerd-cni runs proxy-init's \
         sequence: `iptables-legacy-save -t nat`, one `iptables-legacy -t nat -N/-A` per \
         chain and rule, `iptables-legacy-save -t nat` again, each as `nsenter --net=NETNS \
         -- ...`.",
        samples[0].len()
    );
    println!();
    println!("| variant | median [p10–p90] |");
    println!("|---|---|");
    for (name, s) in names.iter().zip(&samples) {
        println!("| {name} | {} |", s.summary("ms"));
    }
    println!();
    println!(
        "Upstream's sequence / our netns work: **{:.1}×**; / our whole ADD: **{:.1}×**.",
        ratio(&samples[1], &samples[0]),
        ratio(&samples[1], &samples[2])
    );
    Ok(())
}
