//! The pod GET when the API server rejects linkerd-cni's credentials, as
//! in a rolling update of the installer: retried within the ADD's
//! deadline with the kubeconfig read anew on every attempt; "try again
//! later" (code 11) while the installer's heartbeat is fresh; a
//! pass-through only when the credentials are known dead (no kubeconfig,
//! or no installer alive).

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use linkerd_cni::cni::code;
use linkerd_cni::config::PluginConfig;
use linkerd_cni::pod::{self, CONFIRM_ATTEMPTS, Plan, Stop};
use linkerd_cni_state::heartbeat::{self, Beat};
use serde_json::{Value, json};
use testkit::objects::Pod;
use testkit::{Mode, wait_until};

use common::{Cluster, cni_env, failed, invocation, mesh, netconf};

const RESYNC: Duration = Duration::from_secs(10);
/// Far more than any of these ADDs needs on a loaded machine.
const BOUND: Duration = Duration::from_secs(30);

fn cluster() -> Cluster {
    let c = Cluster::start("cred");
    c.api.add_pod(&Pod::meshed("emojivoto", "web-0"));
    c.api.add_namespace("emojivoto", &[]);
    c
}

fn pod_path() -> String {
    Pod::meshed("emojivoto", "web-0").path()
}

/// The state dir [`netconf`] gives the plugin.
fn state_dir(c: &Cluster) -> PathBuf {
    c.kubeconfig.parent().unwrap().to_path_buf()
}

/// An installer's heartbeat, `age` old.
fn beat(c: &Cluster, age: Duration) {
    let mut b = Beat::now(RESYNC);
    b.at =
        b.at.checked_sub(age)
            .expect("the machine has been up that long");
    linkerd_cni_state::record::write(&state_dir(c), &b).unwrap();
}

fn decide(c: &Cluster, extra: Value) -> Result<Plan, Stop> {
    let mut conf = netconf(&c.kubeconfig, json!({}));
    if let (Some(m), Value::Object(extra)) = (conf.as_object_mut(), extra) {
        m.extend(extra);
    }
    let env = cni_env(
        "ADD",
        Path::new("/run/netns/unused"),
        Some(("emojivoto", "web-0")),
    );
    let inv = invocation(&env, &conf);
    let config = PluginConfig::from_map(&inv.conf.raw)?;
    pod::decide(&inv, &config)
}

fn meshed(d: Result<Plan, Stop>) {
    assert_eq!(mesh(d).pod, "emojivoto/web-0");
}

fn passed(d: Result<Plan, Stop>) -> String {
    match d {
        Err(Stop::PassThrough { why, .. }) => why,
        other => panic!("expected pass-through, got {other:?}"),
    }
}

/// Replaces the kubeconfig the way the installer does: a new file renamed
/// over the old.
fn rewrite_kubeconfig(path: &Path, text: &str) {
    let tmp = path.with_file_name(".rewrite");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

#[test]
fn one_rejection_then_an_answer_meshes_the_pod() {
    for installer_alive in [true, false] {
        let c = cluster();
        if installer_alive {
            beat(&c, Duration::ZERO);
        }
        c.api.fail_next(1, 401);
        meshed(decide(&c, json!({})));
        assert_eq!(c.api.requests(&pod_path()), 2, "alive: {installer_alive}");
    }
}

/// The installer rewrites the kubeconfig with a new token while the pod's
/// ADD keeps getting 401 with the old one: the next attempt reads the new.
#[test]
fn a_kubeconfig_rewritten_between_attempts_is_used() {
    let c = cluster();
    beat(&c, Duration::ZERO);
    let new_token = c.api.issue_token();
    let new_text = c.api.kubeconfig_yaml().replace(c.api.token(), &new_token);
    c.api.revoke_token(c.api.token());
    std::thread::scope(|s| {
        let installer = s.spawn(|| {
            assert!(wait_until(BOUND, || c.api.requests(&pod_path()) >= 1));
            rewrite_kubeconfig(&c.kubeconfig, &new_text);
        });
        meshed(decide(&c, json!({})));
        installer.join().unwrap();
    });
    assert!(c.api.requests(&pod_path()) >= 2);
}

/// Rejected for as long as the deadline allows, with the installer alive:
/// code 11, naming the cause and what to do, so the runtime retries.
#[test]
fn lasting_rejection_with_the_installer_alive_is_try_again_later() {
    for (mode, status) in [(Mode::Unauthorized, 401), (Mode::Forbidden, 403)] {
        let c = cluster();
        beat(&c, Duration::from_secs(2));
        c.api.set_mode(mode);
        let t = Instant::now();
        // Retries for half of it: the rest is the ADD's API budget's.
        let e = failed(decide(&c, json!({"add_deadline_seconds": 6})));
        assert!(t.elapsed() < BOUND, "{:?}", t.elapsed());
        assert_eq!(e.code, code::TRY_AGAIN_LATER, "{e}");
        assert!(e.msg.contains(&format!("HTTP {status}")), "{e}");
        assert!(e.msg.contains("installer on this node is alive"), "{e}");
        assert!(e.msg.contains("try again later"), "{e}");
        assert!(e.details.contains(c.kubeconfig.to_str().unwrap()), "{e}");
        assert!(e.details.contains("the runtime retries the pod"), "{e}");
        // Retried (how often depends on the machine's speed).
        assert!(
            c.api.requests(&pod_path()) >= 2,
            "{} attempts",
            c.api.requests(&pod_path())
        );
    }
}

/// A 403 while the installer is alive but has found that the plugin's
/// credentials may not get pods (their RBAC was deleted): no new token
/// fixes that, so the pod passes through after a few attempts instead of
/// every pod of the node being retried for as long as it lasts. A 401
/// with the same finding is still the installer's to fix: code 11.
#[test]
fn lasting_403_the_installer_found_passes_the_pod_through() {
    let denied = |c: &Cluster| {
        let mut b = Beat::now(RESYNC);
        b.plugin_denied = Some("the API server says linkerd-cni-plugin may not get pods".into());
        linkerd_cni_state::record::write(&state_dir(c), &b).unwrap();
    };
    let c = cluster();
    denied(&c);
    c.api.set_mode(Mode::Forbidden);
    let why = passed(decide(&c, json!({})));
    assert!(why.contains("HTTP 403"), "{why}");
    assert!(why.contains("may not get pods"), "{why}");
    assert!(why.contains("RBAC is missing"), "{why}");
    assert!(why.contains("WITHOUT linkerd's redirect rules"), "{why}");
    assert_eq!(c.api.requests(&pod_path()), CONFIRM_ATTEMPTS as usize);

    let c = cluster();
    denied(&c);
    c.api.set_mode(Mode::Unauthorized);
    let e = failed(decide(&c, json!({"add_deadline_seconds": 6})));
    assert_eq!(e.code, code::TRY_AGAIN_LATER, "{e}");
}

/// A name, a set-up, config keys, and what the answer says.
type Case = (&'static str, fn(&Cluster), Value, &'static str);

/// No installer alive to renew the credentials (no heartbeat, an old one,
/// one from before the node's boot): they are dead, and the pod passes
/// through after a few attempts, as when the kubeconfig is gone.
#[test]
fn lasting_rejection_without_an_installer_passes_the_pod_through() {
    let cases: [Case; 3] = [
        ("absent", |_| {}, json!({}), "no installer heartbeat"),
        (
            "stale",
            |c| beat(c, Duration::from_secs(20)),
            json!({"installer_gone_after_seconds": 5}),
            "past the 5 s limit",
        ),
        (
            "another boot",
            |c| {
                let mut b = Beat::now(RESYNC);
                b.boot_id = "00000000-0000-4000-8000-000000000000".into();
                linkerd_cni_state::record::write(&state_dir(c), &b).unwrap();
            },
            json!({}),
            "before this boot",
        ),
    ];
    for (case, set_up, extra, says) in cases {
        let c = cluster();
        set_up(&c);
        c.api.set_mode(Mode::Unauthorized);
        let why = passed(decide(&c, extra));
        assert!(why.contains(says), "{case}: {why}");
        assert!(why.contains("HTTP 401"), "{case}: {why}");
        assert!(
            why.contains("WITHOUT linkerd's redirect rules"),
            "{case}: {why}"
        );
        assert_eq!(
            c.api.requests(&pod_path()),
            CONFIRM_ATTEMPTS as usize,
            "{case}"
        );
    }
}

/// No kubeconfig and no installer alive (an uninstall removes the
/// heartbeat, then the kubeconfig): a pass-through without any API call;
/// also when both go while the ADD retries.
#[test]
fn no_kubeconfig_passes_the_pod_through() {
    let c = cluster();
    let kubeconfig = std::fs::read_to_string(&c.kubeconfig).unwrap();
    std::fs::remove_file(&c.kubeconfig).unwrap();
    let why = passed(decide(&c, json!({})));
    assert!(why.contains("does not exist"), "{why}");
    assert!(why.contains("no installer heartbeat"), "{why}");
    assert_eq!(c.api.connections(), 0);

    std::fs::write(&c.kubeconfig, kubeconfig).unwrap();
    beat(&c, Duration::ZERO);
    c.api.set_mode(Mode::Unauthorized);
    std::thread::scope(|s| {
        let uninstall = s.spawn(|| {
            assert!(wait_until(BOUND, || c.api.requests(&pod_path()) >= 1));
            heartbeat::remove(&state_dir(&c)).unwrap();
            std::fs::remove_file(&c.kubeconfig).unwrap();
        });
        let why = passed(decide(&c, json!({})));
        assert!(why.contains("does not exist"), "{why}");
        uninstall.join().unwrap();
    });
}

/// No kubeconfig while the installer's heartbeat is fresh: the installer
/// is (re)writing it, so "try again later" (code 11), never a meshed pod
/// passed through by whoever could delete the file.
#[test]
fn no_kubeconfig_with_the_installer_alive_is_try_again_later() {
    let c = cluster();
    beat(&c, Duration::ZERO);
    std::fs::remove_file(&c.kubeconfig).unwrap();
    let e = failed(decide(&c, json!({})));
    assert_eq!(e.code, code::TRY_AGAIN_LATER, "{e}");
    assert!(e.msg.contains("does not exist"), "{e}");
    assert!(e.msg.contains("installer on this node is alive"), "{e}");
    assert_eq!(c.api.connections(), 0);
}

/// A heartbeat claiming a resync period of 1e9 s is no heartbeat: it
/// would keep the installer "alive" for ever, every ADD with rejected
/// credentials held to its deadline and sent back (code 11) for good.
#[test]
fn a_heartbeat_with_an_absurd_resync_is_no_heartbeat() {
    let c = cluster();
    let b = Beat::now(RESYNC);
    let text = format!(
        "{{\"boot_id\":\"{}\",\"boot_time_seconds\":{},\"resync_seconds\":1e9}}",
        b.boot_id,
        b.at.as_secs_f64()
    );
    let p = linkerd_cni_state::record::path::<heartbeat::Beat>(&state_dir(&c));
    std::fs::write(&p, text).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
    c.api.set_mode(Mode::Unauthorized);
    let t = Instant::now();
    let why = passed(decide(&c, json!({})));
    assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
    assert!(why.contains("resync_seconds"), "{why}");
    assert_eq!(c.api.requests(&pod_path()), CONFIRM_ATTEMPTS as usize);
}

/// A heartbeat that is not root's own (another owner, writable by others)
/// claims nothing: not the installer alive, nor the plugin's RBAC missing.
#[test]
fn a_heartbeat_that_is_not_roots_own_claims_nothing() {
    testkit::require_root("chown");
    for (case, set_up) in [
        (
            "owned by uid 1000",
            (|p: &Path| std::os::unix::fs::chown(p, Some(1000), Some(1000)).unwrap()) as fn(&Path),
        ),
        ("writable by group or others", |p: &Path| {
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o666)).unwrap()
        }),
    ] {
        let c = cluster();
        let mut b = Beat::now(RESYNC);
        b.plugin_denied = Some("the API server says linkerd-cni-plugin may not get pods".into());
        linkerd_cni_state::record::write(&state_dir(&c), &b).unwrap();
        set_up(&linkerd_cni_state::record::path::<heartbeat::Beat>(
            &state_dir(&c),
        ));
        c.api.set_mode(Mode::Forbidden);
        let why = passed(decide(&c, json!({})));
        assert!(why.contains(case), "{case}: {why}");
        assert!(!why.contains("RBAC is missing"), "{case}: {why}");
        // Nor an installer alive, for a 401.
        c.api.set_mode(Mode::Unauthorized);
        let why = passed(decide(&c, json!({"add_deadline_seconds": 6})));
        assert!(why.contains(case), "{case}: {why}");
    }
}
