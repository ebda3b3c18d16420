//! The CRI benchmark's measurement works on a real containerd (its figures
//! are for BENCHMARKS.md; no test asserts on time). Root, like the
//! conformance CRI tier it builds on.

use linkerd_cni_tools::cri_bench;

/// The benchmark's measurement works (its figures are for BENCHMARKS.md;
/// no test asserts on time).
#[test]
fn sandbox_creation_benchmark_measures_both_chains() {
    testkit::require_root("starts containerd in network and mount namespaces");
    let times = cri_bench::sandbox_creation(2);
    for s in [&times.with_linkerd, &times.without_linkerd] {
        assert_eq!(s.len(), 2);
        assert!(s.values().iter().all(|v| v.is_finite() && *v > 0.0));
    }
    assert!(times.markdown().contains("Ratio of medians"));
}
