//! Every ADD adds one to the counter of how it ended, in the plugin's
//! state dir, and to no other: each outcome driven through the whole plugin
//! (`cni::run`, as the binary runs it) against a fake API server.

mod common;

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use linkerd_cni::cni;
use linkerd_cni::plugin::LinkerdCni;
use linkerd_cni::pod::annotation;
use linkerd_cni_state::outcomes::{self, Outcome, PassCause, RetryCause};
use serde_json::{Value, json};
use testkit::Mode;
use testkit::objects::Pod;

use common::{Cluster, cni_env, netconf};

fn state_dir(conf: &Value) -> PathBuf {
    PathBuf::from(conf["state_dir"].as_str().unwrap())
}

/// One ADD of `pod` in-process; its exit code.
fn add(conf: &Value, pod: Option<(&str, &str)>) -> u8 {
    let env = cni_env("ADD", Path::new("/run/netns/unused"), pod);
    let lookup = |k: &str| {
        env.iter()
            .find(|(n, _)| n == k)
            .map(|(_, v)| OsString::from(v))
    };
    cni::run(lookup, conf.to_string().as_bytes(), &LinkerdCni).exit_code
}

/// The counters that are not zero.
fn counted(conf: &Value) -> Vec<(Outcome, u64)> {
    outcomes::read(&state_dir(conf))
        .unwrap()
        .into_iter()
        .filter(|(_, n)| *n > 0)
        .collect()
}

/// A cluster where `emojivoto/web-0` is meshed and `emojivoto/plain-0`
/// is not; ADDs are simulated (no netns needed).
fn cluster() -> (Cluster, Value) {
    let c = Cluster::start("outcomes");
    c.api.add_pod(&Pod::meshed("emojivoto", "web-0"));
    c.api.add_pod(&Pod::new("emojivoto", "plain-0"));
    c.api.add_namespace("emojivoto", &[]);
    let conf = netconf(&c.kubeconfig, json!({"simulate": true}));
    (c, conf)
}

/// What is tested, the pod, what to change before the ADD, the outcome.
type Case = (
    &'static str,
    Option<(&'static str, &'static str)>,
    Setup,
    Outcome,
);
type Setup = fn(&Cluster, &mut Value);

#[test]
fn each_add_counts_once_under_its_outcome() {
    let web = Some(("emojivoto", "web-0"));
    let cases: [Case; 10] = [
        ("meshed", web, |_, _| {}, Outcome::Meshed),
        (
            "unmeshed",
            Some(("emojivoto", "plain-0")),
            |_, _| {},
            Outcome::Unmeshed,
        ),
        (
            "exempt",
            Some(("kube-system", "coredns-1")),
            |_, _| {},
            Outcome::Exempt,
        ),
        ("not a pod", None, |_, _| {}, Outcome::Exempt),
        (
            "401",
            web,
            |c, _| c.api.set_mode(Mode::Unauthorized),
            Outcome::PassedThrough(PassCause::Unauthorized),
        ),
        (
            "403",
            web,
            |c, _| c.api.set_mode(Mode::Forbidden),
            Outcome::PassedThrough(PassCause::Forbidden),
        ),
        (
            "no kubeconfig",
            web,
            |c, _| std::fs::remove_file(&c.kubeconfig).unwrap(),
            Outcome::PassedThrough(PassCause::KubeconfigMissing),
        ),
        (
            "API server failing",
            web,
            |c, _| c.api.fail_next(100, 500),
            Outcome::TryAgain(RetryCause::ApiUnavailable),
        ),
        (
            "bad annotation",
            web,
            |c, _| {
                c.api.add_pod(
                    &Pod::meshed("emojivoto", "web-0")
                        .annotation(annotation::SKIP_INBOUND_PORTS, "http"),
                )
            },
            Outcome::Failed(cni::code::INVALID_ANNOTATION),
        ),
        (
            "bad config key",
            web,
            |_, conf| conf["linkerd"]["proxy-uid"] = json!("root"),
            Outcome::Failed(cni::code::INVALID_CONFIG),
        ),
    ];
    for (what, pod, setup, want) in cases {
        let (c, mut conf) = cluster();
        setup(&c, &mut conf);
        assert_eq!(counted(&conf), vec![], "{what}: counted before any ADD");
        let rc = add(&conf, pod);
        assert_eq!(
            rc != 0,
            matches!(want, Outcome::TryAgain(_) | Outcome::Failed(_))
        );
        assert_eq!(counted(&conf), vec![(want, 1)], "{what}");
        add(&conf, pod);
        assert_eq!(counted(&conf), vec![(want, 2)], "{what}, twice");
    }
}

/// A count never fails the ADD: a state dir that is a file loses the count
/// and the pod is meshed all the same.
#[test]
fn an_unusable_state_dir_never_fails_the_add() {
    let (c, mut conf) = cluster();
    let file = c.kubeconfig.parent().unwrap().join("not-a-dir");
    std::fs::write(&file, "").unwrap();
    conf["state_dir"] = file.to_str().unwrap().into();
    assert_eq!(add(&conf, Some(("emojivoto", "web-0"))), 0);
    assert!(outcomes::read(&file).is_err());
}

/// A counter file that is not a regular file (a FIFO, which a plain open
/// would wait on) loses the count, at once, and the pod is meshed all the
/// same.
#[test]
fn a_fifo_counter_file_never_holds_up_the_add() {
    let (c, conf) = cluster();
    let dir = state_dir(&conf);
    std::fs::create_dir_all(&dir).unwrap();
    testkit::mkfifo(&dir.join(outcomes::OUTCOMES_FILE));
    let within = std::time::Duration::from_secs(20);
    let rc = testkit::bounded("an ADD counting into a FIFO", within, move || {
        add(&conf, Some(("emojivoto", "web-0")))
    });
    assert_eq!(rc, 0);
    let read = testkit::bounded("a read of a FIFO", within, move || outcomes::read(&dir));
    assert!(read.is_err());
    drop(c);
}
