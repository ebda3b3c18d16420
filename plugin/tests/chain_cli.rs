//! `linkerd-cni chain status|repair` and healing through the real binary,
//! as a person and a runtime run it: the self-heal scenarios.

mod common;

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::Duration;

use serde_json::Value;
use testkit::TempDir;
use testkit::chain::{desired, fixtures, is_linkerd, object, plugins, same_order, tree};

use common::{chain, text};

fn calico(dir: &TempDir) -> PathBuf {
    let src = fixtures().join("calico/in/10-calico.conflist");
    let dst = dir.join("10-calico.conflist");
    fs::copy(src, &dst).unwrap();
    dst
}

/// The fixture entry, written into `dir`.
fn entry_fixture(dir: &TempDir) -> PathBuf {
    let entry = fs::read_to_string(fixtures().join("entry.json")).unwrap();
    dir.write("entry.json", &entry)
}

/// `--conf-dir` `conf_dir` `--entry` `entry_file`.
fn dir_args<'a>(conf_dir: &'a TempDir, entry_file: &'a Path) -> [&'a str; 4] {
    let (dir, entry) = (conf_dir.path(), entry_file);
    [
        "--conf-dir",
        dir.to_str().unwrap(),
        "--entry",
        entry.to_str().unwrap(),
    ]
}

/// Acceptance: status says missing (1), repair fixes it, status 0, a second
/// repair writes nothing.
#[test]
fn status_repair_status_repair() {
    let d = TempDir::new("cli").unwrap();
    let f = calico(&d);
    let entry = TempDir::new("cli-entry").unwrap();
    let entry_file = entry_fixture(&entry);
    let args = dir_args(&d, &entry_file);

    let o = chain(&[&["status"][..], &args].concat());
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("10-calico.conflist"), "{out}");
    assert!(out.contains("missing"), "{out}");
    assert!(
        out.contains("append the linkerd-cni entry (plugin 4 of 4)"),
        "{out}"
    );
    assert!(out.contains("calico -> bandwidth -> portmap"), "{out}");

    let o = chain(&[&["repair"][..], &args].concat());
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("repaired"),
        "{}",
        text(&o)
    );

    let o = chain(&[&["status"][..], &args].concat());
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(String::from_utf8_lossy(&o.stdout).contains("healthy"));

    let m1 = fs::metadata(&f).unwrap();
    std::thread::sleep(Duration::from_millis(20));
    let o = chain(&[&["repair"][..], &args].concat());
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("nothing written"),
        "{}",
        text(&o)
    );
    let m2 = fs::metadata(&f).unwrap();
    assert_eq!(
        (m1.ino(), m1.mtime(), m1.mtime_nsec()),
        (m2.ino(), m2.mtime(), m2.mtime_nsec())
    );
    assert_eq!(d.names(), ["10-calico.conflist"]);
}

#[test]
fn entry_file_in_the_conf_dir_is_the_default() {
    let d = TempDir::new("cli-default").unwrap();
    calico(&d);
    let o = chain(&["status", "--conf-dir", d.path().to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("--entry") && err.contains("installer"),
        "{err}"
    );
    linkerd_cni_chain::persist_entry(
        d.path(),
        &linkerd_cni_chain::Entry::new(desired(), "entry.json").unwrap(),
    )
    .unwrap();
    let conf_dir = format!("--conf-dir={}", d.path().display());
    let o = chain(&["repair", &conf_dir]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let o = chain(&["status", &conf_dir]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
}

#[test]
fn not_repairable_is_1_and_bad_usage_is_2() {
    let d = TempDir::new("cli-bad").unwrap();
    let entry = TempDir::new("cli-bad-entry").unwrap();
    let good = entry.write("e.json", &Value::Object(desired()).to_string());
    let dir = d.path().to_str().unwrap();
    // No primary config: nothing to do, not healthy.
    let o = chain(&[
        "repair",
        "--conf-dir",
        dir,
        "--entry",
        good.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(d.names().is_empty());
    d.write("10-calico.conflist", "{\"name\":");
    let o = chain(&[
        "status",
        "--conf-dir",
        dir,
        "--entry",
        good.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("not valid JSON"),
        "{}",
        text(&o)
    );

    let not_ours = entry.write("n.json", r#"{"type":"calico"}"#);
    for args in [
        vec![
            "status",
            "--conf-dir",
            dir,
            "--entry",
            not_ours.to_str().unwrap(),
        ],
        vec![
            "status",
            "--conf-dir",
            dir,
            "--entry",
            "/nonexistent/entry.json",
        ],
        vec![
            "status",
            "--conf-dir",
            "/nonexistent/dir",
            "--entry",
            good.to_str().unwrap(),
        ],
        vec!["status", "--conf-dir"],
        vec!["status", "--frobnicate", "x"],
        vec!["fix"],
        vec![],
    ] {
        let o = chain(&args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", text(&o));
        assert!(!o.stderr.is_empty(), "{args:?}");
    }
}

fn run_cni(command: &str, stdin: &[u8]) -> Output {
    common::run(&common::exempt_env(command), stdin)
}

/// Points the entry's kubeconfig at a file in `dir`: the plugin heals only
/// while the kubeconfig it names exists.
fn with_kubeconfig(e: &mut serde_json::Map<String, Value>, dir: &TempDir) {
    let path = dir.write("kubeconfig", "apiVersion: v1\n");
    e.insert(
        "kubernetes".into(),
        serde_json::json!({ "kubeconfig": path }),
    );
}

/// The desired entry, healing the conf dir `conf_dir` with its state in
/// `state` (and its kubeconfig there).
fn healing_entry(conf_dir: &TempDir, state: &TempDir) -> serde_json::Map<String, Value> {
    let mut e = desired();
    e.insert(
        "cni_conf_dir".into(),
        conf_dir.path().to_string_lossy().into(),
    );
    e.insert("state_dir".into(), state.path().to_string_lossy().into());
    with_kubeconfig(&mut e, state);
    e
}

/// The plugin's config as the runtime passes it for the entry `e`.
fn add_stdin(e: &serde_json::Map<String, Value>) -> (Vec<u8>, Value) {
    let prev: Value = serde_json::from_str(
        r#"{"cniVersion": "0.3.1",
        "interfaces": [{"name": "cali5ad3b6c0e1f"}, {"name": "eth0", "sandbox": "/var/run/netns/cni-1234"}],
        "ips": [{"version": "4", "interface": 1, "address": "10.244.1.17/32"}],
        "dns": {}, "x": 0.30000000000000000004}"#,
    )
    .unwrap();
    let mut m = e.clone();
    m.insert("name".into(), "k8s-pod-network".into());
    m.insert("cniVersion".into(), "0.3.1".into());
    m.insert("prevResult".into(), prev.clone());
    (Value::Object(m).to_string().into_bytes(), prev)
}

/// Acceptance: the linkerd entry first and stale; after one ADD it is last
/// and the desired one, and the ADD printed the prevResult.
#[test]
fn add_heals_a_stale_first_entry() {
    let d = TempDir::new("add").unwrap();
    let state = TempDir::new("add-state").unwrap();
    let e = healing_entry(&d, &state);
    // What the conflist holds: an older version of the entry, first.
    let mut stale = e.clone();
    stale.insert("log_level".into(), "debug".into());
    let linkerd_first =
        fs::read_to_string(fixtures().join("linkerd-first/in/10-calico.conflist")).unwrap();
    let mut top = object(&linkerd_first);
    let mut list = plugins(&linkerd_first);
    list[0] = Value::Object(stale);
    top.insert("plugins".into(), Value::Array(list));
    let f = d.write(
        "10-calico.conflist",
        &serde_json::to_string_pretty(&top).unwrap(),
    );

    let (stdin, prev) = add_stdin(&e);
    let o = run_cni("ADD", &stdin);
    assert!(o.status.success(), "{}", text(&o));
    let out: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(out.to_string(), prev.to_string());

    let after = fs::read_to_string(&f).unwrap();
    let list = plugins(&after);
    let ours: Vec<usize> = (0..list.len()).filter(|&i| is_linkerd(&list[i])).collect();
    assert_eq!(ours, [list.len() - 1], "{after}");
    let mut want = e.clone();
    want.shift_remove("name");
    assert!(
        same_order(list.last().unwrap(), &Value::Object(want)),
        "{after}"
    );
    assert_eq!(list.len(), 3);
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("repaired"),
        "{}",
        text(&o)
    );
    assert_eq!(d.names(), ["10-calico.conflist"]);
}

/// Only ADD ever writes: the others leave an unhealthy conf dir as it is.
#[test]
fn other_commands_never_write() {
    let d = TempDir::new("readonly").unwrap();
    let state = TempDir::new("readonly-state").unwrap();
    calico(&d);
    let before = tree(d.path());
    let e = healing_entry(&d, &state);
    let (stdin, _) = add_stdin(&e);
    for cmd in ["VERSION", "DEL", "CHECK", "GC", "STATUS"] {
        let o = run_cni(cmd, &stdin);
        assert!(o.status.success(), "{cmd}: {}", text(&o));
        assert_eq!(tree(d.path()), before, "{cmd} wrote to the conf dir");
    }
    assert_eq!(state.names(), ["kubeconfig"], "only ADD records repairs");
    let o = run_cni("ADD", &stdin);
    assert!(o.status.success(), "{}", text(&o));
    assert_ne!(tree(d.path()), before);
}

/// The ADD ends within the budget when another repair holds the lock.
#[test]
fn add_is_not_delayed_past_the_budget() {
    let d = TempDir::new("budget").unwrap();
    let state = TempDir::new("budget-state").unwrap();
    let f = calico(&d);
    let mut e = healing_entry(&d, &state);
    e.insert("chain_repair_budget_seconds".into(), Value::from(0.5));
    let _holder = linkerd_cni_chain::lock_dir(d.path(), Duration::from_secs(1), None).unwrap();
    let start = std::time::Instant::now();
    let (stdin, prev) = add_stdin(&e);
    let o = run_cni("ADD", &stdin);
    let took = start.elapsed();
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(
        serde_json::from_slice::<Value>(&o.stdout)
            .unwrap()
            .to_string(),
        prev.to_string()
    );
    assert!(took < Duration::from_secs(5), "{took:?}");
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("lock"),
        "{}",
        text(&o)
    );
    assert!(!fs::read_to_string(&f).unwrap().contains("linkerd-cni"));
}

/// Any uid can `flock` the conf dir, which older versions locked: held by
/// another user (here nobody), it must not stop the ADD-time repair of a
/// primary that rewrote its file without linkerd-cni.
#[test]
fn an_add_heals_while_another_user_flocks_the_conf_dir() {
    testkit::require_root("flock as nobody");
    let d = TempDir::new("nobody-flock").unwrap();
    let state = TempDir::new("nobody-flock-state").unwrap();
    fs::set_permissions(d.path(), fs::Permissions::from_mode(0o755)).unwrap();
    let f = calico(&d);
    let e = healing_entry(&d, &state);
    let (stdin, _) = add_stdin(&e);
    let o = run_cni("ADD", &stdin);
    assert!(o.status.success(), "{}", text(&o));
    assert!(fs::read_to_string(&f).unwrap().contains("linkerd-cni"));
    let _holder = testkit::flock_as_nobody(d.path()).expect("nobody can flock the conf dir");
    // The primary rewrites its file without us.
    let rewritten = d.write(
        ".calico-new",
        &fs::read_to_string(fixtures().join("calico/in/10-calico.conflist")).unwrap(),
    );
    fs::rename(&rewritten, &f).unwrap();
    let start = std::time::Instant::now();
    let o = run_cni("ADD", &stdin);
    let took = start.elapsed();
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        fs::read_to_string(&f).unwrap().contains("linkerd-cni"),
        "not healed: {}",
        text(&o)
    );
    assert!(took < Duration::from_secs(5), "{took:?}");
}

/// A symlinked conflist leading outside the conf dir: status says the
/// repair is refused and why; repair refuses and writes nothing there.
#[test]
fn status_and_repair_refuse_a_symlink_leading_outside() {
    let d = TempDir::new("cli-link").unwrap();
    let elsewhere = TempDir::new("cli-link-target").unwrap();
    let target = calico(&elsewhere);
    let before = fs::read(&target).unwrap();
    std::os::unix::fs::symlink(&target, d.join("10-calico.conflist")).unwrap();
    let entry = TempDir::new("cli-link-entry").unwrap();
    let entry_file = entry_fixture(&entry);
    let args = dir_args(&d, &entry_file);
    let o = chain(&[&["status"][..], &args].concat());
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.contains("refused:") && out.contains("outside the conf dir"),
        "{out}"
    );
    assert!(out.contains("chain_write_outside_conf_dir"), "{out}");
    let o = chain(&[&["repair"][..], &args].concat());
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("outside the conf dir"),
        "{}",
        text(&o)
    );
    assert_eq!(fs::read(&target).unwrap(), before);
    assert_eq!(elsewhere.names(), ["10-calico.conflist"]);
}

/// `chain status` says why the mode is what it is: the installer's `auto`
/// records the runtime settings' verdict in the entry.
#[test]
fn status_says_why_the_mode_is_what_it_is() {
    let d = TempDir::new("cli-why").unwrap();
    calico(&d);
    let entry = TempDir::new("cli-why-entry").unwrap();
    let mut e: Value =
        serde_json::from_str(&fs::read_to_string(fixtures().join("entry.json")).unwrap()).unwrap();
    let cases = [
        (
            None,
            None,
            "inline, the default (no chain_mode in the entry)",
        ),
        (Some("inline"), None, "set in the entry (chain_mode)"),
        (
            Some("inline"),
            Some("containerd's max_conf_num is 0"),
            "auto, from the runtime's settings: containerd's max_conf_num is 0",
        ),
    ];
    for (mode, reason, want) in cases {
        if let Some(m) = mode {
            e["chain_mode"] = m.into();
        }
        if let Some(r) = reason {
            e["chain_mode_reason"] = r.into();
        }
        let file = entry.write("entry.json", &e.to_string());
        let o = chain(&[&["status"][..], &dir_args(&d, &file)].concat());
        let out = String::from_utf8_lossy(&o.stdout);
        assert!(out.contains(&format!("mode chosen:   {want}")), "{out}");
    }
}

#[test]
fn an_entry_file_that_is_not_regular_is_refused_without_blocking() {
    let dir = TempDir::new("lcni-cli-fifo").unwrap();
    let fifo = dir.path().join("entry");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    // Bounded by coreutils' timeout: a blocked open would never return.
    let o = std::process::Command::new("timeout")
        .args(["20", common::BIN, "chain", "status", "--conf-dir"])
        .arg(dir.path())
        .arg("--entry")
        .arg(&fifo)
        .env_clear()
        .output()
        .expect("run timeout (coreutils)");
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    let out = text(&o);
    assert!(
        out.contains("not a regular file") && out.contains(fifo.to_str().unwrap()),
        "{out}"
    );
}

/// A conf dir that does not exist is named as such, with what to do; not
/// reported as a missing entry file in it.
#[test]
fn a_missing_conf_dir_is_said_to_be_missing() {
    let d = TempDir::new("cli-noconf").unwrap();
    let missing = d.join("net.d");
    let entry_file = entry_fixture(&d);
    let dir = missing.to_str().unwrap();
    for cmd in ["status", "repair"] {
        for extra in [&[][..], &["--entry", entry_file.to_str().unwrap()][..]] {
            let o = chain(&[&[cmd, "--conf-dir", dir][..], extra].concat());
            assert_eq!(o.status.code(), Some(2), "{}", text(&o));
            let err = String::from_utf8_lossy(&o.stderr);
            assert!(
                err.contains(&format!("the conf dir {dir} does not exist"))
                    && err.contains("--conf-dir DIR"),
                "{err}"
            );
            assert!(!err.contains("ZZZ-linkerd-cni-entry"), "{err}");
        }
    }
    assert!(!missing.exists());
}
