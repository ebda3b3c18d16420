//! Throwaway dirs for the state tests.

use linkerd_cni_chain::Entry;

/// testkit's temp dir (removed on drop, also when the test fails), made
/// with a panic on failure: a broken test environment, not an outcome.
pub(crate) struct TempDir(testkit::TempDir);

impl TempDir {
    pub(crate) fn new(tag: &str) -> TempDir {
        TempDir(testkit::TempDir::new(&format!("state-{tag}")).expect("create temp dir"))
    }
}

impl std::ops::Deref for TempDir {
    type Target = testkit::TempDir;

    fn deref(&self) -> &testkit::TempDir {
        &self.0
    }
}

/// The entry the chart renders.
pub(crate) fn desired() -> Entry {
    Entry::new(testkit::chain::chart_entry(), "a test").expect("a linkerd-cni entry")
}
