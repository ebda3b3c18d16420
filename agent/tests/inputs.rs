//! The real installer with each of its input files replaced by a FIFO
//! (whose plain open blocks until a writer comes): the service-account
//! token, the CA, the namespace file, the entry template file, the
//! plugin's counter file. The installer never blocks on one: its loop goes
//! on, `status` and a SIGTERM return, and the log says which file is wrong.

mod common;

use std::fs;
use std::io::{Read, Write};
use std::path::PathBuf;
use std::time::Duration;

use nix::sys::signal::Signal;

use common::*;

/// Far past what a refusal takes.
const LIMIT: Duration = Duration::from_secs(20);

/// Replaces the file the service-account dir's `name` points at with a
/// FIFO; the path the installer reads (through the symlinks).
fn fifo_in_service_account(node: &Node, name: &str) -> PathBuf {
    let target = node.sa_dir.join("..data").join(name);
    fs::remove_file(&target).unwrap();
    testkit::mkfifo(&target);
    node.sa_dir.join(name)
}

/// `status`, which must return within [`LIMIT`]: its stdout.
fn status(node: &Node) -> String {
    let o = node
        .run_within(&["status"], LIMIT)
        .expect("status still running after 20 s");
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// The installer, started, logs `needle` within [`LIMIT`] and is still
/// running.
fn logs_and_runs_on(node: &Node, needle: &str) {
    let mut inst = node.start(&[]);
    assert!(
        inst.wait_log(needle, LIMIT),
        "no {needle:?} in\n{}",
        inst.log()
    );
    assert!(inst.running(), "{}", inst.log());
}

/// The token and the CA, read at every pass to write the kubeconfig.
#[test]
fn a_fifo_token_or_ca_is_refused_and_named() {
    for (name, what) in [
        ("token", "the service-account token {}"),
        ("ca.crt", "the API server CA {} (KUBE_CA_FILE)"),
    ] {
        let node = Node::new("fifo-sa");
        node.write_by_rename("10-calico.conflist", &calico_text(0));
        let path = fifo_in_service_account(&node, name);
        let what = what.replace("{}", &path.display().to_string());
        logs_and_runs_on(&node, &format!("cannot read {what}: not a regular file"));
        status(&node);
    }
}

/// At start, a configuration error (the installer exits); later, read at
/// every pass, one pass's error (it runs on).
#[test]
fn a_fifo_template_file_is_refused_and_named() {
    let node = Node::new("fifo-template");
    node.write_by_rename("10-calico.conflist", &calico_text(0));
    let template = node.root.join("template.json");
    testkit::mkfifo(&template);
    let needle = format!("cannot read {}: not a regular file", template.display());
    let file = [
        ("CNI_NETWORK_CONFIG_FILE", template.to_str().unwrap()),
        ("LINKERD_CNI_RESYNC_SECONDS", "1"),
    ];
    let mut inst = node.start(&file);
    let exit = inst.wait_exit(LIMIT);
    assert!(
        exit.is_some_and(|s| !s.success()),
        "{exit:?}\n{}",
        inst.log()
    );
    assert!(
        inst.log().contains(&needle),
        "no {needle:?} in\n{}",
        inst.log()
    );
    assert!(node.read_conflist(ENTRY_FILE).is_none());

    fs::remove_file(&template).unwrap();
    fs::write(&template, testkit::chart::template()).unwrap();
    let inst = node.start(&file);
    node.wait_healthy(LIMIT)
        .unwrap_or_else(|e| panic!("{e}\n{}", inst.log()));
    fs::remove_file(&template).unwrap();
    testkit::mkfifo(&template);
    assert!(
        inst.wait_log(&needle, LIMIT),
        "no {needle:?} in\n{}",
        inst.log()
    );
    let mut inst = inst;
    assert!(inst.running(), "{}", inst.log());
    node.healthy().unwrap();
}

/// The namespace is read on SIGTERM, to ask whether the DaemonSet is
/// being deleted: a FIFO there is no answer, and the installer exits
/// leaving everything installed.
#[test]
fn a_fifo_namespace_file_does_not_hold_up_the_exit() {
    let node = Node::new("fifo-namespace");
    node.write_by_rename("10-calico.conflist", &calico_text(0));
    let namespace = fifo_in_service_account(&node, "namespace");
    let mut inst = node.start(&[]);
    node.wait_healthy(LIMIT)
        .unwrap_or_else(|e| panic!("{e}\n{}", inst.log()));
    inst.signal(Signal::SIGTERM);
    let exit = inst.wait_exit(LIMIT);
    assert!(
        exit.is_some(),
        "still running 20 s after SIGTERM\n{}",
        inst.log()
    );
    let needle = format!("{} is unreadable", namespace.display());
    assert!(
        inst.log().contains(&needle),
        "no {needle:?} in\n{}",
        inst.log()
    );
    node.healthy().unwrap();
}

/// The plugin's counter file, read after every pass (for its credential
/// rejections) and by `status`.
#[test]
fn a_fifo_counter_file_holds_up_neither_the_loop_nor_status() {
    let node = Node::new("fifo-outcomes");
    node.write_by_rename("10-calico.conflist", &calico_text(0));
    let state = node.prefix.join("run/linkerd-cni");
    fs::create_dir_all(&state).unwrap();
    let counters = state.join(linkerd_cni_state::outcomes::OUTCOMES_FILE);
    testkit::mkfifo(&counters);
    let inst = node.start(&[("LINKERD_CNI_METRICS_ADDR", "127.0.0.1:0")]);
    node.wait_healthy(LIMIT)
        .unwrap_or_else(|e| panic!("{e}\n{}", inst.log()));
    // The heartbeat is written after the counters are read.
    let beat = linkerd_cni_state::record::path::<linkerd_cni_state::heartbeat::Beat>(&state);
    assert!(
        wait_until(LIMIT, || beat.exists()),
        "no heartbeat\n{}",
        inst.log()
    );
    let text = status(&node);
    let needle = format!("cannot read {}: not a regular file", counters.display());
    assert!(text.contains(&needle), "no {needle:?} in\n{text}");
    // A scrape, which reads them too, is answered.
    let text = scrape(&inst);
    let needle = format!(
        "# the plugin's ADD counters in {} cannot be read: not a regular file",
        counters.display()
    );
    assert!(text.contains(&needle), "no {needle:?} in\n{text}");
}

/// One `/metrics` scrape of `inst`, which must answer within [`LIMIT`].
fn scrape(inst: &Installer) -> String {
    let needle = "serving /metrics on http://";
    assert!(inst.wait_log(needle, LIMIT), "{}", inst.log());
    let log = inst.log();
    let rest = &log[log.find(needle).unwrap() + needle.len()..];
    let addr: std::net::SocketAddr = rest[..rest.find("/metrics").unwrap()].parse().unwrap();
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(LIMIT)).unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: node\r\n\r\n")
        .unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text)
        .unwrap_or_else(|e| panic!("no answer to a scrape: {e}"));
    text
}
