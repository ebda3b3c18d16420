//! The keeper over every transition, with each program's limit, and with
//! the inline repair refused in each way it can be: after every step the
//! file the runtime loads holds linkerd-cni last (judged here by name order
//! and the last plugin's type, without the library's own diagnosis).

use std::fs;
use std::path::Path;
use std::time::{Duration, Instant};

use testkit::chain::runtime_active;

use crate::FightHistory;

use super::super::testutil::{TempDir, desired};
use super::*;

const CALICO: &str = r#"{
  "name": "k8s-pod-network",
  "cniVersion": "0.3.1",
  "plugins": [
    {"type": "calico", "mtu": 1440, "ipam": {"type": "calico-ipam"}},
    {"type": "portmap", "snat": true, "capabilities": {"portMappings": true}}
  ]
}
"#;

const FLANNEL: &str = r#"{"name":"cbr0","cniVersion":"0.3.1","plugins":[{"type":"flannel","delegate":{"isDefaultGateway":true}},{"type":"portmap","capabilities":{"portMappings":true}}]}"#;

const MULTUS: &str = r#"{"cniVersion":"0.3.1","name":"multus-cni-network","plugins":[{"type":"multus","kubeconfig":"/etc/cni/net.d/multus.d/multus.kubeconfig","delegates":[{"cniVersion":"0.3.1","name":"k8s-pod-network","plugins":[{"type":"calico"}]}]}]}"#;

/// The programs that keep the chain, by the limit they pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Program {
    Cli,
    Installer,
    Plugin,
}

/// How the inline repair is refused in a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Refusal {
    None,
    /// The limit holds repairs of the primary's current content back.
    Fight,
    /// Another writer holds the conf-dir lock past the deadline.
    Lock,
    /// The file the keeper writes only while it exists is gone.
    Requirement,
}

struct Node {
    conf: TempDir,
    state: TempDir,
    program: Program,
    detector: FightHistory,
    history: FightHistory,
}

impl Node {
    fn new(program: Program) -> Node {
        let n = Node {
            conf: TempDir::new("keeper-conf"),
            state: TempDir::new("keeper-state"),
            program,
            detector: FightHistory::in_memory(Duration::from_secs(60), 3),
            history: plugin_history(),
        };
        n.state.write("kubeconfig", "apiVersion: v1\n");
        n
    }

    fn limit(&mut self) -> Box<dyn RepairLimit + '_> {
        match self.program {
            Program::Cli => Box::new(NoLimit),
            Program::Installer => Box::new(Wrap(&mut self.detector)),
            Program::Plugin => Box::new(Wrap(&mut self.history)),
        }
    }

    /// Makes the limit refuse a repair of `file` as it is now: three
    /// repairs of that content recorded just before.
    fn exhaust(&mut self, file: &Path) {
        let digest = content_sha256(file);
        let now = Instant::now();
        let mut limit = self.limit();
        for _ in 0..3 {
            limit.record(file, &digest, now);
        }
        assert!(!limit.allow(file, &digest, now), "the limit refuses now");
    }

    fn keep(&mut self, mode: ChainMode, refusal: Refusal) -> Report {
        let mut entry = desired();
        if mode == ChainMode::Owned {
            entry = entry.with(owned::MODE_KEY, "owned").unwrap();
        }
        let mode = ModeChoice::of_entry(&entry).unwrap();
        let mut ctx = Context::new(self.conf.path(), entry, mode, Duration::from_secs(30));
        ctx.opts.requires = Some(self.state.path().join("kubeconfig"));
        if refusal == Refusal::Requirement {
            ctx.opts.requires = Some(self.state.path().join("gone"));
        }
        let holder = (refusal == Refusal::Lock).then(|| {
            ctx.deadline = Instant::now() + Duration::from_millis(200);
            crate::lock_dir(self.conf.path(), Duration::from_secs(1), None).unwrap()
        });
        let mut limit = self.limit();
        let r = keep(&ctx, &mut *limit).unwrap();
        drop(holder);
        r
    }

    fn write(&self, name: &str, text: &str) {
        // By rename, as primaries write.
        let tmp = self.conf.write(".primary-tmp", text);
        fs::rename(tmp, self.conf.path().join(name)).unwrap();
    }
}

/// The plugin's history (as the state crate loads it for an ADD).
fn plugin_history() -> FightHistory {
    FightHistory::new(Duration::from_secs(600), 3)
}

/// The installer's detector or the plugin's history, borrowed.
struct Wrap<'a, L>(&'a mut L);

impl<L: RepairLimit> RepairLimit for Wrap<'_, L> {
    fn allow(&self, file: &Path, digest: &str, now: Instant) -> bool {
        RepairLimit::allow(&*self.0, file, digest, now)
    }
    fn next_allowed(&self, file: &Path, digest: &str, now: Instant) -> Option<Instant> {
        RepairLimit::next_allowed(self.0, file, digest, now)
    }
    fn record(&mut self, file: &Path, digest: &str, now: Instant) -> Option<String> {
        RepairLimit::record(self.0, file, digest, now)
    }
}

/// After a step: the runtime loads a chain ending with linkerd-cni (or no
/// config at all, when the primary has none).
fn assert_chained(n: &Node, step: &str, r: &Report) {
    match runtime_active(n.conf.path()) {
        None => {}
        Some((file, last)) => assert_eq!(
            last,
            crate::PLUGIN_TYPE,
            "{step}: the runtime loads {file}, which ends with {last}\nreport: {r}\nfiles: {:?}",
            n.conf.names()
        ),
    }
}

/// One transition: what happens to the node (by the primary, another
/// agent or the operator), then the mode the keeper keeps.
struct Transition {
    name: &'static str,
    /// The state before: built with no refusal.
    setup: fn(&mut Node),
    /// What changes on the node.
    change: fn(&Node),
    mode: ChainMode,
    /// Whether the change itself leaves the runtime on a chain without
    /// linkerd-cni (another agent renaming our file away): a refused repair
    /// cannot help that, and must say so.
    unchains: bool,
    /// What the node must look like once the keeper may do its work.
    settled: fn(&Node),
}

fn owned_current(n: &mut Node) {
    n.write("10-calico.conflist", CALICO);
    n.keep(ChainMode::Owned, Refusal::None);
    assert!(
        n.conf
            .path()
            .join("10-calico-linkerd-cni.conflist")
            .exists()
    );
}

fn inline_healthy(n: &mut Node) {
    n.write("10-calico.conflist", CALICO);
    n.keep(ChainMode::Inline, Refusal::None);
    assert!(n.conf.read("10-calico.conflist").contains("linkerd-cni"));
}

fn fallback_renamed(n: &mut Node) {
    owned_current(n);
    fs::rename(
        n.conf.path().join("10-calico-linkerd-cni.conflist"),
        n.conf
            .path()
            .join("10-calico-linkerd-cni.conflist.cilium_bak"),
    )
    .unwrap();
    let r = n.keep(ChainMode::Owned, Refusal::None);
    assert!(matches!(r.layout, Layout::Fallback(_)), "{r}");
    assert!(n.conf.read("10-calico.conflist").contains("linkerd-cni"));
}

fn nothing(_: &Node) {}

fn ends_with_us(n: &Node, file: &str) {
    let (active, last) = runtime_active(n.conf.path()).expect("a config");
    assert_eq!((active.as_str(), last.as_str()), (file, crate::PLUGIN_TYPE));
}

const TRANSITIONS: &[Transition] = &[
    Transition {
        name: "inline to owned",
        setup: inline_healthy,
        change: nothing,
        mode: ChainMode::Owned,
        unchains: false,
        settled: |n| {
            ends_with_us(n, "10-calico-linkerd-cni.conflist");
            assert!(!n.conf.read("10-calico.conflist").contains("linkerd-cni"));
        },
    },
    Transition {
        name: "owned to inline",
        setup: owned_current,
        change: nothing,
        mode: ChainMode::Inline,
        unchains: false,
        settled: |n| {
            ends_with_us(n, "10-calico.conflist");
            assert_eq!(n.conf.names(), ["10-calico.conflist"]);
        },
    },
    Transition {
        name: "owned to fallback (our file renamed away)",
        setup: owned_current,
        change: |n| {
            fs::rename(
                n.conf.path().join("10-calico-linkerd-cni.conflist"),
                n.conf
                    .path()
                    .join("10-calico-linkerd-cni.conflist.cilium_bak"),
            )
            .unwrap();
        },
        mode: ChainMode::Owned,
        unchains: true,
        settled: |n| ends_with_us(n, "10-calico.conflist"),
    },
    Transition {
        name: "fallback to owned",
        setup: fallback_renamed,
        change: |n| {
            fs::remove_file(
                n.conf
                    .path()
                    .join("10-calico-linkerd-cni.conflist.cilium_bak"),
            )
            .unwrap();
        },
        mode: ChainMode::Owned,
        unchains: false,
        settled: |n| {
            ends_with_us(n, "10-calico-linkerd-cni.conflist");
            assert!(!n.conf.read("10-calico.conflist").contains("linkerd-cni"));
        },
    },
    Transition {
        name: "primary gone",
        setup: owned_current,
        change: |n| fs::remove_file(n.conf.path().join("10-calico.conflist")).unwrap(),
        mode: ChainMode::Owned,
        unchains: false,
        settled: |n| assert!(n.conf.names().is_empty(), "{:?}", n.conf.names()),
    },
    Transition {
        name: "primary renamed",
        setup: |n| {
            n.write("20-flannel.conflist", FLANNEL);
            owned_current(n);
        },
        change: |n| {
            fs::rename(
                n.conf.path().join("10-calico.conflist"),
                n.conf.path().join("10-calico.conflist.bak"),
            )
            .unwrap();
        },
        mode: ChainMode::Owned,
        unchains: false,
        settled: |n| {
            ends_with_us(n, "20-flannel-linkerd-cni.conflist");
            assert!(
                !n.conf
                    .path()
                    .join("10-calico-linkerd-cni.conflist")
                    .exists()
            );
        },
    },
    Transition {
        name: "primary turned meta-plugin while our copy is active",
        setup: owned_current,
        change: |n| n.write("10-calico.conflist", MULTUS),
        mode: ChainMode::Owned,
        unchains: false,
        settled: |n| {
            ends_with_us(n, "10-calico.conflist");
            assert!(
                !n.conf
                    .path()
                    .join("10-calico-linkerd-cni.conflist")
                    .exists()
            );
        },
    },
];

#[test]
fn every_transition_with_each_limit_keeps_the_runtime_chained() {
    for t in TRANSITIONS {
        for program in [Program::Cli, Program::Installer, Program::Plugin] {
            for refusal in [
                Refusal::None,
                Refusal::Fight,
                Refusal::Lock,
                Refusal::Requirement,
            ] {
                // The CLI has no limit to refuse with.
                if program == Program::Cli && refusal == Refusal::Fight {
                    continue;
                }
                let step = format!("{} ({program:?}, refused: {refusal:?})", t.name);
                let mut n = Node::new(program);
                (t.setup)(&mut n);
                (t.change)(&n);
                if refusal == Refusal::Fight {
                    // Whichever file the step would repair: every config
                    // on the node, as it is now.
                    for name in n.conf.names() {
                        if crate::is_config_name(std::ffi::OsStr::new(&name)) {
                            n.exhaust(&n.conf.path().join(name));
                        }
                    }
                }
                let r = n.keep(t.mode, refusal);
                if t.unchains && refusal != Refusal::None {
                    assert!(!r.held_back.is_empty(), "{step}: says why: {r}");
                } else {
                    assert_chained(&n, &step, &r);
                }
                if refusal != Refusal::None && !t.unchains {
                    // Refused twice: still chained, nothing lost.
                    let r = n.keep(t.mode, refusal);
                    assert_chained(&n, &format!("{step}, again"), &r);
                }
                // Once nothing refuses any more (the fight's rate limit
                // aside, which only an undone repair would meet again),
                // the node settles in the mode's layout.
                let mut again = Node {
                    detector: FightHistory::in_memory(Duration::from_secs(60), 3),
                    history: plugin_history(),
                    ..n
                };
                let r = again.keep(t.mode, Refusal::None);
                assert_chained(&again, &format!("{step}, settled"), &r);
                (t.settled)(&again);
                let r = again.keep(t.mode, Refusal::None);
                assert!(!r.changed(), "{step}: settled, yet it wrote: {r}");
            }
        }
    }
}

#[test]
fn the_report_says_why_a_repair_was_held_back() {
    let mut n = Node::new(Program::Installer);
    n.write("10-calico.conflist", CALICO);
    let r = n.keep(ChainMode::Inline, Refusal::Requirement);
    assert!(
        r.held_back
            .iter()
            .any(|h| matches!(h.cause, HoldCause::Requirement(_))),
        "{r:?}"
    );
    let r = n.keep(ChainMode::Inline, Refusal::Lock);
    assert!(
        r.held_back
            .iter()
            .any(|h| matches!(h.cause, HoldCause::LockTimeout(_))),
        "{r:?}"
    );
    assert!(r.to_string().contains("lock"), "{r}");
    n.exhaust(&n.conf.path().join("10-calico.conflist"));
    let r = n.keep(ChainMode::Inline, Refusal::Fight);
    assert!(
        matches!(
            r.held_back.as_slice(),
            [HeldBack {
                cause: HoldCause::Fight { until: Some(_) },
                ..
            }]
        ),
        "{r:?}"
    );
    assert!(r.retry_at().is_some());
    // The repair that finally runs is reported with its cause.
    n.detector = FightHistory::in_memory(Duration::from_secs(60), 3);
    let r = n.keep(ChainMode::Inline, Refusal::None);
    assert!(
        matches!(
            r.actions.as_slice(),
            [Action::Repaired {
                cause: ChainState::Missing,
                ..
            }]
        ),
        "{r:?}"
    );
}

#[test]
fn health_is_judged_in_the_mode() {
    let mut n = Node::new(Program::Cli);
    owned_current(&mut n);
    let entry = desired().with(owned::MODE_KEY, "owned").unwrap();
    let ctx = Context::new(
        n.conf.path(),
        entry.clone(),
        ModeChoice::of_entry(&entry).unwrap(),
        Duration::from_secs(1),
    );
    let h = health(&ctx).unwrap();
    assert!(h.is_healthy() && h.is_chained(), "{h}");
    assert!(h.to_string().contains("mode chosen:"), "{h}");
    // The same node judged in inline mode: the primary's file lacks us,
    // yet the runtime loads our file, which holds us.
    let ctx = Context::new(
        n.conf.path(),
        desired(),
        ModeChoice::new(ChainMode::Inline, "a test"),
        Duration::from_secs(1),
    );
    let h = health(&ctx).unwrap();
    assert!(!h.is_healthy() && h.is_chained(), "{h}");
}

#[test]
fn a_repair_in_progress_has_no_leftovers() {
    let mut n = Node::new(Program::Cli);
    inline_healthy(&mut n);
    let ctx = Context::new(
        n.conf.path(),
        desired(),
        ModeChoice::new(ChainMode::Inline, "a test"),
        Duration::from_secs(1),
    );
    assert!(health(&ctx).unwrap().is_healthy());
    // A swap's displaced version, as a live repair leaves it between its
    // exchange and its fsync.
    let displaced = n
        .conf
        .path()
        .join(format!("{}swap-n-in-flight", crate::write::TEMP_PREFIX));
    fs::write(&displaced, "{}").unwrap();
    {
        let _writer = crate::lock_dir(n.conf.path(), Duration::from_secs(1), None).unwrap();
        let h = health(&ctx).unwrap();
        assert!(h.is_healthy(), "a writer holds the lock: {h}");
    }
    // Nobody holds it: an interrupted repair's, left for the next.
    let h = health(&ctx).unwrap();
    assert!(!h.is_healthy(), "{h}");
    assert!(h.to_string().contains("left over"), "{h}");
}

#[test]
fn our_file_that_cannot_be_written_falls_back_to_inline_repair() {
    // A directory squats our file's name: owned mode cannot write it, so
    // inline repair keeps the node chained, every pass, and says why.
    let mut n = Node::new(Program::Installer);
    n.write("10-calico.conflist", CALICO);
    fs::create_dir(n.conf.path().join("10-calico-linkerd-cni.conflist")).unwrap();
    let r = n.keep(ChainMode::Owned, Refusal::None);
    assert!(
        matches!(&r.layout, Layout::Fallback(why) if why.contains("cannot be written")),
        "{r}"
    );
    assert_chained(&n, "squatted", &r);
    ends_with_us(&n, "10-calico.conflist");
    let r = n.keep(ChainMode::Owned, Refusal::None);
    assert!(matches!(r.layout, Layout::Fallback(_)), "{r}");
    assert!(!r.changed(), "{r}");
    // The directory gone, owned mode applies again.
    fs::remove_dir(n.conf.path().join("10-calico-linkerd-cni.conflist")).unwrap();
    n.keep(ChainMode::Owned, Refusal::None);
    ends_with_us(&n, "10-calico-linkerd-cni.conflist");
}

#[test]
fn each_fact_is_said_once() {
    let mut r = Report::new(ModeChoice::new(ChainMode::Owned, "a test"));
    let wrote = Action::Copied {
        file: "/x/10-a-linkerd-cni.conflist".into(),
        from: "/x/10-a.conflist".into(),
        created: false,
    };
    // The primary rewrote its file while it was copied: written again.
    r.actions = vec![wrote.clone(), wrote.clone(), wrote];
    assert_eq!(r.lines().len(), 1, "{r}");
    assert_eq!(r.to_string().matches("wrote").count(), 1, "{r}");
}

/// A stale linkerd-cni entry in the primary that carries a meta-plugin's
/// key (`delegates`) does not make owned mode take the primary for a
/// meta-plugin's config: one pass makes our copy the active file and takes
/// the stale entry out of the primary, rather than repairing it inline.
#[test]
fn a_stale_entry_of_ours_with_delegates_does_not_stop_owned_mode() {
    let mut n = Node::new(Program::Installer);
    let mut stale = desired().as_map().clone();
    stale.insert("delegates".into(), serde_json::json!([{"type": "calico"}]));
    let calico = CALICO.replacen(
        "\"plugins\": [\n",
        &format!(
            "\"plugins\": [\n    {},\n",
            serde_json::Value::Object(stale)
        ),
        1,
    );
    n.write("10-calico.conflist", &calico);
    let r = n.keep(ChainMode::Owned, Refusal::None);
    assert!(!matches!(r.layout, Layout::Fallback(_)), "{r}");
    ends_with_us(&n, "10-calico-linkerd-cni.conflist");
    let primary = n.conf.read("10-calico.conflist");
    assert!(!primary.contains("linkerd-cni"), "{primary}");
    assert!(
        !n.conf
            .read("10-calico-linkerd-cni.conflist")
            .contains("delegates")
    );
}
