//! Tests of the chain module against real directories.

use super::testutil::{TempDir, desired};
use super::*;

const CALICO: &str = r#"{
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

#[test]
fn missing_entry_is_repaired_once() {
    let d = TempDir::new("basic");
    d.write("10-calico.conflist", CALICO);
    let want = desired();
    let diag = diagnose(d.path(), &want).unwrap();
    assert_eq!(diag.state, ChainState::Missing);
    let r = repair(d.path(), &want, &RepairOptions::default()).unwrap();
    assert!(r.changed);
    assert_eq!(r.before, ChainState::Missing);
    assert!(diagnose(d.path(), &want).unwrap().is_healthy());
    let again = repair(d.path(), &want, &RepairOptions::default()).unwrap();
    assert!(!again.changed);
    assert_eq!(d.names(), ["10-calico.conflist"]);
}

#[test]
fn entry_file_round_trip() {
    let d = TempDir::new("entry");
    assert_eq!(load_entry(d.path()).unwrap(), None);
    assert!(persist_entry(d.path(), &desired()).unwrap());
    assert!(!persist_entry(d.path(), &desired()).unwrap());
    assert_eq!(load_entry(d.path()).unwrap(), Some(desired()));
    assert!(!d.read(ENTRY_FILE).is_empty());
    assert!(remove_entry_file(d.path()).unwrap());
    assert!(!remove_entry_file(d.path()).unwrap());
}
