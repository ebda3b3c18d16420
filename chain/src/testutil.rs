//! Throwaway conf dirs for the chain tests.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

use serde_json::{Map, Value};

use super::Entry;

static N: AtomicU32 = AtomicU32::new(0);

/// A fresh directory, removed on drop (also when the test fails).
pub(crate) struct TempDir(pub PathBuf);

impl TempDir {
    pub(crate) fn new(tag: &str) -> TempDir {
        let p = std::env::temp_dir().join(format!(
            "lcni-chain-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = fs::remove_dir_all(&p);
        fs::create_dir_all(&p).expect("create temp dir");
        TempDir(p)
    }

    pub(crate) fn path(&self) -> &Path {
        &self.0
    }

    pub(crate) fn write(&self, name: &str, text: &str) -> PathBuf {
        let p = self.0.join(name);
        fs::write(&p, text).expect("write");
        p
    }

    pub(crate) fn read(&self, name: &str) -> String {
        fs::read_to_string(self.0.join(name)).expect("read")
    }

    /// File names, sorted.
    pub(crate) fn names(&self) -> Vec<String> {
        let mut v: Vec<String> = fs::read_dir(&self.0)
            .expect("read_dir")
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
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
