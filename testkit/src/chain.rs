//! The chain library's fixtures (conf dirs before and after a repair, the
//! desired entry), shared by the chain crate's tests and the plugin's tests
//! of the `linkerd-cni chain` CLI, and the tree and JSON comparisons they
//! judge repairs with.

use std::fs;
use std::path::{Path, PathBuf};

use serde_json::{Map, Value};

/// The fixture conf dirs, kept next to the chain crate's tests that own
/// them.
pub fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../chain/tests/fixtures/chain")
}

/// A Calico conflist as a node holds it before linkerd-cni is installed,
/// short: the primary and portmap.
pub const CALICO: &str = r#"{
  "name": "k8s-pod-network",
  "cniVersion": "0.3.1",
  "plugins": [
    {
      "type": "calico",
      "mtu": 1440,
      "ipam": {"type": "calico-ipam"}
    },
    {
      "type": "portmap",
      "snat": true,
      "capabilities": {"portMappings": true}
    }
  ]
}
"#;

/// The entry the chart's template renders for the installer's kubeconfig
/// in `/etc/cni/net.d`, as JSON.
pub fn chart_entry() -> Map<String, Value> {
    let mut e = crate::chart::template_json();
    e["kubernetes"]["kubeconfig"] = "/etc/cni/net.d/ZZZ-linkerd-cni-kubeconfig".into();
    match e {
        Value::Object(m) => m,
        _ => panic!("the chart's template is not a JSON object"),
    }
}

/// The desired entry of the fixtures, as JSON.
pub fn desired() -> Map<String, Value> {
    object(&fs::read_to_string(fixtures().join("entry.json")).expect("read entry.json"))
}

pub fn object(text: &str) -> Map<String, Value> {
    match serde_json::from_str(text).expect("JSON") {
        Value::Object(m) => m,
        _ => panic!("not a JSON object"),
    }
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

/// Every file of a tree, as (relative path, bytes), sorted; but the conf
/// dir's lock file ([`crate::names::LOCK_FILE`]).
pub fn tree(dir: &Path) -> Vec<(String, Vec<u8>)> {
    fn walk(root: &Path, dir: &Path, out: &mut Vec<(String, Vec<u8>)>) {
        for e in fs::read_dir(dir).unwrap() {
            let e = e.unwrap();
            if e.file_name() == crate::names::LOCK_FILE {
                continue;
            }
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

/// The file a runtime loads from `dir` (the first `*.conf`, `*.conflist`
/// or `*.json` by bytewise name, directories skipped, as containerd picks
/// it) and the `type` of its chain's last plugin ("?" when it has none),
/// judged without the chain library.
pub fn runtime_active(dir: &Path) -> Option<(String, String)> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("cannot list {}: {e}", dir.display()))
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| !t.is_dir()))
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| {
            n.rfind('.')
                .is_some_and(|i| [".conf", ".conflist", ".json"].contains(&&n[i..]))
        })
        .collect();
    names.sort_by(|a, b| a.as_bytes().cmp(b.as_bytes()));
    let first = names.first()?.clone();
    let text = std::fs::read_to_string(dir.join(&first)).unwrap_or_default();
    let v: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
    let last = v["plugins"]
        .as_array()
        .and_then(|p| p.last())
        .and_then(|p| p["type"].as_str())
        .unwrap_or("?")
        .to_string();
    Some((first, last))
}
