//! Owned chain mode through the real binary: `chain status` and `chain
//! repair` as an operator runs them, and ADDs as a runtime runs them from
//! linkerd-cni's own file, current or stale.

mod common;

use std::fs;

use serde_json::Value;
use testkit::TempDir;
use testkit::chain::{desired, fixtures};

use common::{chain, text};
const OURS: &str = "10-calico-linkerd-cni.conflist";

/// The owned-mode entry for a conf dir, its kubeconfig present (the
/// plugin writes only while it exists), as a JSON file for `--entry`.
struct Setup {
    conf: TempDir,
    _aux: TempDir,
    entry_file: std::path::PathBuf,
}

fn setup(tag: &str) -> Setup {
    let conf = TempDir::new(tag).unwrap();
    fs::copy(
        fixtures().join("calico/in/10-calico.conflist"),
        conf.join("10-calico.conflist"),
    )
    .unwrap();
    let aux = TempDir::new(&format!("{tag}-aux")).unwrap();
    let mut entry = desired();
    entry.insert("chain_mode".into(), "owned".into());
    entry.insert("cni_conf_dir".into(), conf.path().to_string_lossy().into());
    entry.insert("state_dir".into(), aux.path().to_string_lossy().into());
    let kc = aux.write("kubeconfig", "apiVersion: v1\n");
    entry.insert("kubernetes".into(), serde_json::json!({ "kubeconfig": kc }));
    let entry_file = aux.write("entry.json", &Value::Object(entry.clone()).to_string());
    Setup {
        conf,
        _aux: aux,
        entry_file,
    }
}

/// [`setup`], then `chain repair`: our copy in place, as the runtime
/// loads it.
fn repaired(tag: &str) -> Setup {
    let s = setup(tag);
    let o = chain(&s.args("repair"));
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    s
}

/// A repaired node whose primary the test rewrites: the primary's path,
/// and its text, whose `"mtu": 0` the rewrites replace.
fn rewriting(tag: &str) -> (Setup, std::path::PathBuf, String) {
    let s = repaired(tag);
    let p = s.conf.join("10-calico.conflist");
    let base = fs::read_to_string(&p).unwrap();
    assert!(base.contains("\"mtu\": 0"), "the fixture's MTU changed");
    (s, p, base)
}

impl Setup {
    fn args<'a>(&'a self, cmd: &'a str) -> Vec<&'a str> {
        vec![
            cmd,
            "--conf-dir",
            self.conf.path().to_str().unwrap(),
            "--entry",
            self.entry_file.to_str().unwrap(),
        ]
    }

    /// Our entry as the runtime hands it to the plugin, loaded from our file.
    fn stdin_from_ours(&self) -> Vec<u8> {
        let ours: Value =
            serde_json::from_str(&fs::read_to_string(self.conf.join(OURS)).unwrap()).unwrap();
        let mut e = ours["plugins"].as_array().unwrap().last().unwrap().clone();
        e["name"] = ours["name"].clone();
        e["cniVersion"] = ours["cniVersion"].clone();
        e["prevResult"] = serde_json::json!({"cniVersion": "0.3.1", "interfaces": [], "ips": []});
        e.to_string().into_bytes()
    }
}

/// A node switching from owned back to inline mode (the entry asks for
/// inline, our file not yet removed): the runtime loads our file, and
/// `chain status` names that one as the active config, the primary's apart.
#[test]
fn status_names_the_file_the_runtime_loads_while_leaving_owned_mode() {
    let s = repaired("owned-leaving");
    let mut e: Value = serde_json::from_str(&fs::read_to_string(&s.entry_file).unwrap()).unwrap();
    e["chain_mode"] = "inline".into();
    fs::write(&s.entry_file, e.to_string()).unwrap();
    assert_eq!(
        testkit::chain::runtime_active(s.conf.path()).map(|(name, _)| name),
        Some(OURS.to_string())
    );
    let o = chain(&s.args("status"));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("mode:          inline"), "{}", text(&o));
    let active = out
        .lines()
        .find(|l| l.starts_with("active config:"))
        .unwrap_or_else(|| panic!("{}", text(&o)));
    assert!(active.contains(OURS), "{}", text(&o));
    let primary = out
        .lines()
        .find(|l| l.starts_with("primary:"))
        .unwrap_or_else(|| panic!("{}", text(&o)));
    assert!(primary.ends_with("/10-calico.conflist"), "{}", text(&o));
}

#[test]
fn status_and_repair_in_owned_mode() {
    let s = setup("owned-cli");
    let primary = fs::read(s.conf.join("10-calico.conflist")).unwrap();
    let o = chain(&s.args("status"));
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("mode:          owned"), "{}", text(&o));
    assert!(out.contains("our file is missing"), "{}", text(&o));

    let o = chain(&s.args("repair"));
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(s.conf.join(OURS).exists());
    assert_eq!(
        fs::read(s.conf.join("10-calico.conflist")).unwrap(),
        primary
    );

    let o = chain(&s.args("status"));
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("10-calico.conflist"), "{}", text(&o));
    assert!(out.contains(OURS), "{}", text(&o));
    assert!(out.contains("current"), "{}", text(&o));
}

#[test]
fn an_add_from_a_current_copy_passes_one_from_a_stale_copy_is_retried() {
    let s = repaired("owned-add");
    let current = s.stdin_from_ours();
    let o = common::run(&common::exempt_env("ADD"), &current);
    assert!(o.status.success(), "{}", text(&o));

    // The primary rewrites its file after the runtime loaded our copy.
    let p = s.conf.join("10-calico.conflist");
    let newer = fs::read_to_string(&p)
        .unwrap()
        .replace("\"mtu\": 0", "\"mtu\": 1450");
    assert!(newer.contains("1450"), "the fixture's MTU changed");
    fs::write(&p, newer).unwrap();
    let o = common::run(&common::exempt_env("ADD"), &current);
    assert!(!o.status.success(), "{}", text(&o));
    let err: Value = serde_json::from_slice(&o.stdout).unwrap_or(Value::Null);
    assert_eq!(err["code"], 11, "{}", text(&o));
    assert!(
        err["details"]
            .as_str()
            .unwrap_or_default()
            .contains("changed"),
        "{}",
        text(&o)
    );
    // The copy follows, and the retry (from the new copy) passes.
    let ours = fs::read_to_string(s.conf.join(OURS)).unwrap();
    assert!(ours.contains("1450"), "{ours}");
    let o = common::run(&common::exempt_env("ADD"), &s.stdin_from_ours());
    assert!(o.status.success(), "{}", text(&o));
}

/// An ADD from `ran` of exempt pod `kube-system/<pod>` in sandbox
/// `sandbox`, as a runtime retrying a pod runs it (each attempt a new
/// container id): true when accepted, false when sent back with code 11.
fn add_in_sandbox(pod: &str, sandbox: &str, ran: &[u8]) -> bool {
    let args = format!("IgnoreUnknown=1;K8S_POD_NAMESPACE=kube-system;K8S_POD_NAME={pod}");
    let mut env = common::exempt_env("ADD");
    env.retain(|(k, _)| *k != "CNI_CONTAINERID" && *k != "CNI_ARGS");
    env.push(("CNI_CONTAINERID", sandbox));
    env.push(("CNI_ARGS", &args));
    let o = common::run(&env, ran);
    if o.status.success() {
        return true;
    }
    let err: Value = serde_json::from_slice(&o.stdout).unwrap_or(Value::Null);
    assert_eq!(err["code"], 11, "{}", text(&o));
    false
}

/// The file the runtime loads and whether its chain ends with linkerd-cni.
fn runtime_active_holds_us(dir: &std::path::Path) -> (String, bool) {
    match testkit::chain::runtime_active(dir) {
        Some((file, last)) => (file, last == "linkerd-cni"),
        None => ("none".into(), false),
    }
}

/// The primary turns into a meta-plugin's config while our copy is what
/// the runtime loads, and the ADD cannot repair inline (the kubeconfig it
/// requires is gone): our copy stays until the primary's file holds
/// linkerd-cni, so the runtime never loads a chain without it.
#[test]
fn a_fallback_keeps_our_file_until_the_primary_holds_us() {
    let s = repaired("owned-fallback");
    let ran = s.stdin_from_ours();
    let multus = r#"{"cniVersion":"0.3.1","name":"multus-cni-network","plugins":[{"type":"multus","kubeconfig":"/etc/cni/net.d/multus.d/multus.kubeconfig","delegates":[{"cniVersion":"0.3.1","name":"k8s-pod-network","plugins":[{"type":"calico"}]}]}]}"#;
    fs::write(s.conf.join("10-calico.conflist"), multus).unwrap();
    let entry: Value = serde_json::from_str(&fs::read_to_string(&s.entry_file).unwrap()).unwrap();
    let kubeconfig = entry["kubernetes"]["kubeconfig"]
        .as_str()
        .unwrap()
        .to_string();
    fs::remove_file(&kubeconfig).unwrap();
    let _ = common::run(&common::exempt_env("ADD"), &ran);
    let (active, ours) = runtime_active_holds_us(s.conf.path());
    assert!(ours, "the runtime loads {active}, without linkerd-cni");
    // With the kubeconfig back, the ADD chains the primary's file, and only
    // then our copy goes.
    fs::write(&kubeconfig, "apiVersion: v1\n").unwrap();
    let _ = common::run(&common::exempt_env("ADD"), &ran);
    let (active, ours) = runtime_active_holds_us(s.conf.path());
    assert!(ours, "the runtime loads {active}, without linkerd-cni");
    assert_eq!(active, "10-calico.conflist");
    assert!(!s.conf.join(OURS).exists());
}

/// The primary rewrites its file (new content each time) faster than a
/// pod starts: each retry of the pod's sandbox runs a copy that is stale
/// again. Each retry is a new sandbox with a new container id, as the
/// kubelet's RunPodSandbox retries are; the pod is the same. After a
/// bounded number of retries, the ADD is accepted on the copy it ran (which
/// holds linkerd-cni): the pod starts.
#[test]
fn a_sandbox_is_retried_a_bounded_number_of_times_whatever_the_write_rate() {
    let (s, p, base) = rewriting("owned-storm");
    let mut codes = vec![];
    for attempt in 1..=5 {
        // The runtime loads our copy; the primary writes before the ADD.
        let ran = s.stdin_from_ours();
        fs::write(
            &p,
            base.replace("\"mtu\": 0", &format!("\"mtu\": {}", 1400 + attempt)),
        )
        .unwrap();
        if add_in_sandbox("coredns-1", &format!("sandbox-{attempt}"), &ran) {
            break;
        }
        codes.push(11);
    }
    assert_eq!(
        codes.len(),
        2,
        "retries before the ADD was accepted: {codes:?}"
    );
    // The copy follows the primary all the same.
    let ours = fs::read_to_string(s.conf.join(OURS)).unwrap();
    assert!(ours.contains("\"mtu\": 1403"), "{ours}");
}

/// Pods (exempt ones: no API call) whose ADDs all ran the same stale copy,
/// at once: each pod is sent
/// back exactly as often as the bound says, no more (concurrent ADDs each
/// count their own pod's retry, none overwrites another's).
#[test]
fn concurrent_pods_each_keep_their_own_retry_count() {
    const PODS: usize = 8;
    let s = repaired("owned-concurrent");
    let ran = s.stdin_from_ours();
    let p = s.conf.join("10-calico.conflist");
    let newer = fs::read_to_string(&p)
        .unwrap()
        .replace("\"mtu\": 0", "\"mtu\": 1450");
    assert!(newer.contains("1450"), "the fixture's MTU changed");
    fs::write(&p, newer).unwrap();
    let retries: Vec<usize> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..PODS)
            .map(|pod| {
                let ran = &ran;
                scope.spawn(move || {
                    let name = format!("coredns-{pod}");
                    let mut sent_back = 0;
                    for attempt in 0..6 {
                        let sandbox = format!("pod-{pod}-sandbox-{attempt}");
                        if add_in_sandbox(&name, &sandbox, ran) {
                            return sent_back;
                        }
                        sent_back += 1;
                    }
                    sent_back
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(retries, vec![2; PODS], "retries per pod");
}

/// The primary renames new content into place every 100 ms for 10 s, and
/// pods start one after another meanwhile, each retry a new sandbox of the
/// same pod. Each ADD runs 150 ms after the runtime loaded the copy it
/// runs (a sandbox's set-up before linkerd-cni), longer than the primary
/// takes to write again, so the copy it ran is almost always stale. Every
/// pod starts within the plugin's bound of two retries, and every copy it
/// ran holds linkerd-cni. Before the bound, no pod started while the
/// primary rewrote faster than an ADD completed.
#[test]
fn every_pod_starts_during_a_rename_storm() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::{Duration, Instant};

    let (s, p, base) = rewriting("owned-rename-storm");
    let stop = AtomicBool::new(false);
    let (pods, retries) = std::thread::scope(|scope| {
        let writer = scope.spawn(|| {
            let start = Instant::now();
            let mut version = 0u32;
            while start.elapsed() < Duration::from_secs(10) {
                version += 1;
                let staged = s.conf.join(format!(".storm-{version}.tmp"));
                let text = base.replace("\"mtu\": 0", &format!("\"mtu\": {}", 1000 + version));
                fs::write(&staged, text).unwrap();
                fs::rename(&staged, &p).unwrap();
                let due = start + Duration::from_millis(100) * version;
                std::thread::sleep(due.saturating_duration_since(Instant::now()));
            }
            stop.store(true, Ordering::Relaxed);
        });
        let mut pods = 0;
        let mut retries: Vec<usize> = vec![];
        while !stop.load(Ordering::Relaxed) {
            pods += 1;
            let name = format!("dns-{pods}");
            let mut sent_back = 0;
            for attempt in 0..4 {
                let (active, ours) = runtime_active_holds_us(s.conf.path());
                assert!(ours, "the runtime would load {active}, without linkerd-cni");
                let ran = s.stdin_from_ours();
                std::thread::sleep(Duration::from_millis(150));
                if add_in_sandbox(&name, &format!("pod-{pods}-sandbox-{attempt}"), &ran) {
                    break;
                }
                sent_back += 1;
            }
            retries.push(sent_back);
        }
        writer.join().unwrap();
        (pods, retries)
    });
    assert!(pods > 0);
    let most = retries.iter().copied().max().unwrap_or(0);
    eprintln!(
        "{pods} pods during the storm, {} retries in all, at most {most} for one pod",
        retries.iter().sum::<usize>()
    );
    assert!(most <= 2, "retries per pod: {retries:?}");
}

/// The primary rewrites its file with the same chain in other bytes (its
/// own serializer, another indentation): an ADD that ran the copy made
/// before is accepted, not sent back; the copy follows the new bytes all
/// the same.
#[test]
fn a_reformatting_rewrite_does_not_send_the_pod_back() {
    let s = repaired("owned-reformat");
    let ran = s.stdin_from_ours();
    let p = s.conf.join("10-calico.conflist");
    let before = fs::read_to_string(&p).unwrap();
    let compact = serde_json::from_str::<Value>(&before).unwrap().to_string();
    assert_ne!(compact, before, "the fixture is already compact");
    fs::write(&p, &compact).unwrap();
    let o = common::run(&common::exempt_env("ADD"), &ran);
    assert!(o.status.success(), "{}", text(&o));
    let ours = fs::read_to_string(s.conf.join(OURS)).unwrap();
    assert!(ours.starts_with(&compact[..compact.len() - 2]), "{ours}");
}
