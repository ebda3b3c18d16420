//! Throwaway conf dirs for the chain tests.

use serde_json::{Map, Value};

use super::Entry;

/// testkit's temp dir (removed on drop, also when the test fails), made
/// with a panic on failure: a broken test environment, not an outcome.
pub(crate) struct TempDir(testkit::TempDir);

impl TempDir {
    pub(crate) fn new(tag: &str) -> TempDir {
        TempDir(testkit::TempDir::new(&format!("chain-{tag}")).expect("create temp dir"))
    }
}

impl std::ops::Deref for TempDir {
    type Target = testkit::TempDir;

    fn deref(&self) -> &testkit::TempDir {
        &self.0
    }
}

/// A JSON object, for plugin objects that are not necessarily ours.
pub(crate) fn object(json: &str) -> Map<String, Value> {
    match serde_json::from_str(json).expect("entry json") {
        Value::Object(m) => m,
        _ => panic!("entry is not an object"),
    }
}

/// The entry the chart renders.
pub(crate) fn desired() -> Entry {
    Entry::new(testkit::chain::chart_entry(), "a test").expect("a linkerd-cni entry")
}
