//! A repair held back by the fight rate limit (10 repairs of the same
//! content of one file within 60 s: then one per 6 s) is retried as soon as the limit allows,
//! not at the next resync.

mod common;

use std::time::{Duration, Instant};

use common::*;

/// The installer's rate limit while fighting: 60 s / 10 repairs.
const INTERVAL: Duration = Duration::from_secs(6);
/// Far longer than the interval: a wake-up at the resync would miss the
/// bound by far.
const RESYNC: &str = "60";

#[test]
fn throttled_repair_is_retried_when_the_limit_allows() {
    let node = Node::new("throttle");
    node.write_by_rename("10-calico.conflist", &calico_text(0));
    let inst = node.start(&[("LINKERD_CNI_RESYNC_SECONDS", RESYNC)]);
    node.wait_healthy(GRACE * 4)
        .unwrap_or_else(|e| panic!("{e}\n{}", inst.log()));
    // The primary undoes the entry again and again, with the same content
    // (a fight is that, not a primary writing new content): the 10th repair
    // within the window makes it a fight.
    let mut last_repair = Instant::now();
    for v in 1..=9 {
        node.write_by_rename("10-calico.conflist", &calico_text(0));
        node.wait_healthy(GRACE * 4)
            .unwrap_or_else(|e| panic!("rewrite {v}: {e}\n{}", inst.log()));
        last_repair = Instant::now();
    }
    assert!(
        inst.wait_log("repairs within", GRACE * 4),
        "no fight detected:\n{}",
        inst.log()
    );
    // Once more: held back, until INTERVAL after the last repair.
    node.write_by_rename("10-calico.conflist", &calico_text(0));
    let t = Instant::now();
    assert!(
        inst.wait_log("not repairing it again yet", GRACE * 4),
        "{}",
        inst.log()
    );
    assert!(
        wait_until(INTERVAL + GRACE * 2, || node.healthy().is_ok()),
        "not retried when the limit allowed: {:?}\n{}",
        node.healthy(),
        inst.log()
    );
    eprintln!(
        "held-back repair done {:?} after the rewrite, {:?} after the previous repair (limit {INTERVAL:?}, resync {RESYNC} s)",
        t.elapsed(),
        last_repair.elapsed()
    );
}
