//! Helpers shared by the chain integration tests, here and in the plugin
//! crate (whose tests of the `linkerd-cni chain` CLI include this file):
//! throwaway directories with unique names, removed on drop (also when a
//! test fails), and the chain fixtures.

#![allow(dead_code)]

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

use serde_json::{Map, Value};

static N: AtomicU32 = AtomicU32::new(0);

pub struct TempDir(PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        let p = std::env::temp_dir().join(format!(
            "lcni-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = fs::remove_dir_all(&p);
        fs::create_dir_all(&p).expect("create temp dir");
        TempDir(p)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }

    pub fn join(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }

    pub fn write(&self, name: &str, text: &str) -> PathBuf {
        let p = self.0.join(name);
        fs::write(&p, text).expect("write");
        p
    }

    pub fn read(&self, name: &str) -> String {
        fs::read_to_string(self.0.join(name)).expect("read")
    }

    /// Top-level names, sorted.
    pub fn names(&self) -> Vec<String> {
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

/// Copies a directory tree (regular files and directories).
pub fn copy_tree(from: &Path, to: &Path) {
    fs::create_dir_all(to).unwrap();
    for e in fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let dst = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_tree(&e.path(), &dst);
        } else {
            fs::copy(e.path(), &dst).unwrap();
        }
    }
}

/// Every file of a tree, as (relative path, bytes), sorted.
pub fn tree(dir: &Path) -> Vec<(String, Vec<u8>)> {
    fn walk(root: &Path, dir: &Path, out: &mut Vec<(String, Vec<u8>)>) {
        for e in fs::read_dir(dir).unwrap() {
            let e = e.unwrap();
            let p = e.path();
            if e.file_type().unwrap().is_dir() {
                out.push((
                    format!("{}/", p.strip_prefix(root).unwrap().display()),
                    vec![],
                ));
                walk(root, &p, out);
            } else {
                let rel = p.strip_prefix(root).unwrap().display().to_string();
                out.push((rel, fs::read(&p).unwrap()));
            }
        }
    }
    let mut out = Vec::new();
    walk(dir, dir, &mut out);
    out.sort();
    out
}

pub fn object(text: &str) -> Map<String, Value> {
    match serde_json::from_str(text).expect("JSON") {
        Value::Object(m) => m,
        _ => panic!("not a JSON object"),
    }
}

/// The chain fixtures, owned by the chain crate; through its path relative to
/// the workspace, so that the plugin's tests (which include this module too)
/// find them as well.
pub fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../chain/tests/fixtures/chain")
}

/// The desired entry of the fixtures, as JSON.
pub fn desired() -> Map<String, Value> {
    object(&fs::read_to_string(fixtures().join("entry.json")).unwrap())
}

/// The desired entry of the fixtures, for the chain library.
pub fn desired_entry() -> linkerd_cni_chain::Entry {
    linkerd_cni_chain::Entry::new(desired(), "entry.json").expect("a linkerd-cni entry")
}

/// Plugin objects of a conflist's text.
pub fn plugins(text: &str) -> Vec<Value> {
    object(text)
        .get("plugins")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default()
}

pub fn is_linkerd(v: &Value) -> bool {
    v.get("type").and_then(Value::as_str) == Some("linkerd-cni")
}

/// Same values and, for objects, the same key order at every depth.
pub fn same_order(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len()
                && x.iter()
                    .zip(y)
                    .all(|((ka, va), (kb, vb))| ka == kb && same_order(va, vb))
        }
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(p, q)| same_order(p, q))
        }
        _ => a == b,
    }
}
