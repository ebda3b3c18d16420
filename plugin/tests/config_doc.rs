//! Every key of the plugin's network config that the plugin reads is in
//! `docs/configuration.md`, and every key listed there is read.
//!
//! Code to document: `PluginConfig` reads each key by hand
//! (`top.string("log_level")`, `k8s.seconds(...)`, `l.port(...)`), so the
//! keys are taken from those calls in its source, with the block each
//! reader stands for; the entry keys the chain library owns come from its
//! constants. Document to code: each documented key of `PluginConfig`,
//! given a value no reader accepts, must make the config invalid, naming
//! that key: a key the code does not read would be accepted silently.

use std::collections::BTreeSet;

use linkerd_cni::config::PluginConfig;
use serde_json::{Value, json};
use testkit::docs;

const SECTION: &str = "Plugin config keys";
const CONFIG_RS: &str = include_str!("../src/config.rs");

/// The readers of `Obj` in config.rs that take one key.
const READERS: [&str; 7] = [
    "string", "bool", "seconds", "strings", "port", "ports", "owner_id",
];

/// The variable each block is read through, and the block's prefix.
const BLOCKS: [(&str, &str); 3] = [("top", ""), ("k8s", "kubernetes."), ("l", "linkerd.")];

/// Keys of the entry the chain library reads (the installer writes them).
fn chain_keys() -> BTreeSet<String> {
    [
        linkerd_cni_chain::owned::MODE_KEY,
        linkerd_cni_chain::MODE_REASON_KEY,
        linkerd_cni_chain::owned::MARKER_KEY,
    ]
    .map(String::from)
    .into()
}

/// `block.reader("key")` calls in config.rs, as dotted keys.
fn read_by_plugin_config() -> BTreeSet<String> {
    let mut keys = BTreeSet::new();
    for (var, prefix) in BLOCKS {
        for reader in READERS {
            let call = format!("{var}.{reader}(\"");
            for (at, _) in CONFIG_RS.match_indices(&call) {
                // Not the tail of a longer name (`xtop.string(`).
                let before = CONFIG_RS[..at].chars().next_back();
                if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
                    continue;
                }
                let rest = &CONFIG_RS[at + call.len()..];
                if let Some((key, _)) = rest.split_once('"') {
                    keys.insert(format!("{prefix}{key}"));
                }
            }
        }
    }
    keys
}

#[test]
fn every_plugin_key_is_documented_and_every_documented_one_is_read() {
    let read = read_by_plugin_config();
    assert!(
        read.len() >= 20,
        "found only {} key reads in plugin/src/config.rs: {read:?}",
        read.len()
    );
    let code: BTreeSet<String> = read.union(&chain_keys()).cloned().collect();
    let text = docs::configuration(env!("CARGO_MANIFEST_DIR"));
    let documented = docs::names_in_column(&docs::section(&text, SECTION), 0);
    if let Some(msg) = docs::compare("plugin config keys", &code, &documented, SECTION) {
        panic!("{msg}");
    }

    // Document to code, by behaviour: a documented key of PluginConfig
    // with a value of a type no reader accepts is an error naming it.
    for key in documented.difference(&chain_keys()) {
        let wrong = json!([{ "not": "accepted" }]);
        let config = match key.split_once('.') {
            Some((block, inner)) => json!({ block: { inner: wrong } }),
            None => json!({ key: wrong }),
        };
        let Value::Object(map) = config else {
            unreachable!("built as an object")
        };
        match PluginConfig::from_map(&map) {
            Ok(_) => panic!(
                "{key} is documented in {} but PluginConfig does not read it \
                 (a wrong value was accepted)",
                docs::CONFIGURATION
            ),
            Err(e) => assert!(
                e.msg.contains(&format!("{key:?}")),
                "{key}: the error names another key: {}",
                e.msg
            ),
        }
    }
}
