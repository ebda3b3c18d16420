//! One deadline per ADD (`add_deadline_seconds`): a black-holed API server
//! (accepts connections, never answers) and a held xtables lock each end the
//! ADD by the deadline, with code 11 and an error naming the deadline.
//!
//! The xtables lock is machine-wide (`/run/xtables.lock`) and other suites
//! run at the same time: the plugin runs in a private mount namespace where
//! a file of this test's own is bind-mounted over it, and this test holds
//! that file's lock. Needs root (namespaces, mounts).

mod common;

use std::fs::File;
use std::net::TcpListener;
use std::path::Path;
use std::process::Output;
use std::time::{Duration, Instant};

use linkerd_cni_state::outcomes::{self, Outcome, RetryCause};
use serde_json::{Value, json};
use testkit::iptables::nat_table;
use testkit::objects::Pod;
use testkit::{FakeApiServer, TempDir, TestNetns};

use common::{cni_env, netconf, stderr, stdout_json};

const XTABLES_LOCK: &str = "/run/xtables.lock";
/// The deadline under test.
const DEADLINE_SECONDS: u64 = 3;
/// Scheduling slack on a small shared machine: the bound is the design's,
/// not a speed measurement.
const GRACE: Duration = Duration::from_secs(4);

/// Runs the plugin in a private mount namespace in which `lock` is bind
/// mounted over the machine's xtables lock file.
fn run_plugin_with_lock(lock: &Path, env: &[(String, String)], conf: &Value) -> Output {
    assert!(
        Path::new(XTABLES_LOCK).exists() || File::create(XTABLES_LOCK).is_ok(),
        "cannot create {XTABLES_LOCK} (the bind-mount target): this test needs root"
    );
    common::run_in_mount_ns(
        r#"mount --bind "$1" /run/xtables.lock"#,
        &[lock.as_os_str()],
        env,
        conf,
    )
}

/// ADD of the pod `emojivoto/web-0` in `netns`, with `lock` as the
/// xtables lock.
fn add_web0(lock: &Path, netns: &Path, conf: &Value) -> Output {
    let env = cni_env("ADD", netns, Some(("emojivoto", "web-0")));
    run_plugin_with_lock(lock, &env, conf)
}

/// [`add_web0`], which must end at the deadline; the error result.
fn add_past_deadline(lock: &Path, netns: &Path, conf: &Value) -> Value {
    let start = Instant::now();
    let o = add_web0(lock, netns, conf);
    expect_deadline_error(&o, start.elapsed())
}

fn expect_deadline_error(o: &Output, took: Duration) -> Value {
    assert!(!o.status.success(), "the ADD succeeded: {}", stderr(o));
    let e = stdout_json(o);
    assert_eq!(e["code"], 11, "{e}\n{}", stderr(o));
    let msg = e["msg"].as_str().unwrap_or_default();
    assert!(
        msg.contains(&format!(
            "ADD deadline of {DEADLINE_SECONDS} s (add_deadline_seconds) ran out"
        )),
        "{e}"
    );
    eprintln!(
        "ADD ended after {took:?} (deadline {DEADLINE_SECONDS} s): {}",
        e["msg"]
    );
    let bound = Duration::from_secs(DEADLINE_SECONDS) + GRACE;
    assert!(took < bound, "the ADD took {took:?}, past {bound:?}");
    e
}

/// A listener that accepts (the kernel completes the handshake into its
/// backlog) and never answers: the TLS handshake waits forever.
#[test]
fn black_holed_api_server_ends_at_the_deadline() {
    let hole = TcpListener::bind("127.0.0.1:0").unwrap();
    let api = FakeApiServer::start();
    let dir = TempDir::new("lcni-deadline-api").unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        api.kubeconfig_yaml().replace(
            &format!("[{}]:{}", api.addr().ip(), api.addr().port()),
            &format!("[127.0.0.1]:{}", hole.local_addr().unwrap().port()),
        ),
    )
    .unwrap();
    let lock = dir.path().join("xtables.lock");
    File::create(&lock).unwrap();
    let ns = TestNetns::new("lcni-deadline-api").unwrap();
    let mut conf = netconf(&kubeconfig, json!({}));
    conf["add_deadline_seconds"] = json!(DEADLINE_SECONDS);
    // Longer than the deadline: the deadline must cut it.
    conf["kubernetes"]["api-budget-seconds"] = json!(100);
    let e = add_past_deadline(&lock, ns.path(), &conf);
    let details = e["details"].as_str().unwrap_or_default();
    assert!(details.contains("emojivoto/web-0"), "{e}");
    assert_eq!(api.total_requests(), 0);
    // Counted as a retry on the deadline, once, and as nothing else.
    let counted: Vec<_> = outcomes::read(Path::new(conf["state_dir"].as_str().unwrap()))
        .unwrap()
        .into_iter()
        .filter(|(_, n)| *n > 0)
        .collect();
    assert_eq!(counted, vec![(Outcome::TryAgain(RetryCause::Deadline), 1)]);
    drop(hole);
}

/// A meshed pod whose `iptables-legacy-restore -w` waits on a lock this test
/// holds: killed at the deadline, nothing applied.
#[test]
fn held_xtables_lock_ends_at_the_deadline() {
    let api = FakeApiServer::start();
    api.add_pod(&Pod::meshed("emojivoto", "web-0"));
    api.add_namespace("emojivoto", &[]);
    let dir = TempDir::new("lcni-deadline-lock").unwrap();
    let kubeconfig = api.write_kubeconfig(dir.path()).unwrap();
    let lock = dir.path().join("xtables.lock");
    let held = File::create(&lock).unwrap();
    held.lock().expect("flock on the test's own lock file");
    let ns = TestNetns::new("lcni-deadline-lock").unwrap();
    let before = nat_table(&ns, "iptables-legacy-save");
    // The xtables lock is legacy iptables' (nft has none): that backend,
    // whatever the manifest's default.
    let mut conf = netconf(
        &kubeconfig,
        json!({"use-wait-flag": true, "iptables-mode": "legacy"}),
    );
    conf["add_deadline_seconds"] = json!(DEADLINE_SECONDS);
    let e = add_past_deadline(&lock, ns.path(), &conf);
    let msg = e["msg"].as_str().unwrap_or_default();
    assert!(msg.contains("installing linkerd's iptables rules"), "{e}");
    let details = e["details"].as_str().unwrap_or_default();
    assert!(
        details.contains("iptables-legacy-restore") && details.contains("did not finish"),
        "{e}"
    );
    assert_eq!(nat_table(&ns, "iptables-legacy-save"), before);

    // Released: the same ADD goes through, so it was the lock that held it.
    held.unlock().unwrap();
    let o = add_web0(&lock, ns.path(), &conf);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_ne!(nat_table(&ns, "iptables-legacy-save"), before);
}
