//! The real installer with each of its input files replaced by a FIFO
//! (whose plain open blocks until a writer comes). The installer never
//! blocks on one: its loop goes on, `status` returns, and it says which
//! file is wrong.

mod common;

use std::fs;
use std::time::Duration;

use common::*;

/// Far past what a refusal takes.
const LIMIT: Duration = Duration::from_secs(20);

/// `status`, which must return within [`LIMIT`]: its stdout.
fn status(node: &Node) -> String {
    let o = node
        .run_within(&["status"], LIMIT)
        .expect("status still running after 20 s");
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// The plugin's counter file, read after every pass (for its credential
/// rejections) and by `status`.
#[test]
fn a_fifo_counter_file_holds_up_neither_the_loop_nor_status() {
    let node = Node::new("fifo-outcomes");
    node.write_by_rename("10-calico.conflist", &calico_text(0));
    let state = node.prefix.join("run/linkerd-cni");
    fs::create_dir_all(&state).unwrap();
    let counters = state.join(linkerd_cni_chain::outcomes::OUTCOMES_FILE);
    testkit::mkfifo(&counters);
    let inst = node.start(&[]);
    node.wait_healthy(LIMIT)
        .unwrap_or_else(|e| panic!("{e}\n{}", inst.log()));
    // The heartbeat is written after the counters are read.
    let beat = linkerd_cni_chain::heartbeat::path(&state);
    assert!(
        wait_until(LIMIT, || beat.exists()),
        "no heartbeat\n{}",
        inst.log()
    );
    let text = status(&node);
    let needle = format!("cannot read {}: not a regular file", counters.display());
    assert!(text.contains(&needle), "no {needle:?} in\n{text}");
}
