//! linkerd-cni's two chain modes, for running the same test in both: how a
//! node's conf dir is laid out in each, what the desired entry is, and the
//! installer's setting.
//!
//! Inline: our entry last in the primary's own file. Owned: the primary's
//! file without us, and linkerd-cni's own `<stem>-linkerd-cni.conflist`
//! sorting before it, made here by `linkerd-cni chain repair` (what the
//! installer and the plugin do on a node), not by the test.

use std::path::PathBuf;
use std::process::Command;

use serde_json::Value;

use crate::node::Node;
use crate::{artifacts, sys};

/// The entry key selecting the mode, and the key of the marker our entry
/// carries in an owned file (the plugin's names, restated as an
/// independent oracle).
pub const MODE_KEY: &str = "chain_mode";
pub const MARKER_KEY: &str = "owned_copy_of";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChainMode {
    Inline,
    Owned,
}

impl ChainMode {
    pub const ALL: [ChainMode; 2] = [ChainMode::Inline, ChainMode::Owned];

    pub fn as_str(self) -> &'static str {
        match self {
            ChainMode::Inline => "inline",
            ChainMode::Owned => "owned",
        }
    }

    /// `LINKERD_CNI_CHAIN_MODE` for the installer (inline: empty, which
    /// is unset, so the entry is exactly as before owned mode existed).
    pub fn installer_env(self) -> (&'static str, &'static str) {
        match self {
            ChainMode::Inline => ("LINKERD_CNI_CHAIN_MODE", ""),
            ChainMode::Owned => ("LINKERD_CNI_CHAIN_MODE", "owned"),
        }
    }

    /// `entry` selecting this mode (inline: unchanged, as today).
    pub fn entry(self, mut entry: Value) -> Value {
        if self == ChainMode::Owned {
            entry[MODE_KEY] = self.as_str().into();
        }
        entry
    }

    /// The name of our own file for a primary named `primary` (owned mode).
    pub fn owned_name(primary: &str) -> String {
        let stem = primary.rsplit_once('.').map_or(primary, |(s, _)| s);
        format!("{stem}-linkerd-cni.conflist")
    }

    /// Writes `conf` (a conflist whose last plugin is the linkerd-cni
    /// entry, in this mode's form) as `file`, laid out as this mode keeps a
    /// node. Returns the primary's file.
    pub fn write_chained(self, node: &Node, file: &str, conf: &Value) -> PathBuf {
        match self {
            ChainMode::Inline => node.write_conf(file, conf),
            ChainMode::Owned => {
                let mut primary = conf.clone();
                let plugins = primary["plugins"].as_array_mut().expect("a conflist");
                let entry = plugins.pop().expect("the linkerd-cni entry last");
                assert_eq!(entry["type"], "linkerd-cni", "{conf}");
                let path = node.write_conf(file, &primary);
                chain_repair(node, &entry);
                let ours = node.conf_dir().join(Self::owned_name(file));
                assert!(
                    ours.exists(),
                    "chain repair made no {}: {:?}",
                    ours.display(),
                    node.conf_dir_names()
                );
                path
            }
        }
    }
}

/// `linkerd-cni chain repair --conf-dir <node's> --entry <entry>`, as an
/// operator (or the installer) brings the conf dir to the entry's mode.
pub fn chain_repair(node: &Node, entry: &Value) {
    let f = node
        .scratch_dir()
        .join(format!("entry-{}.json", testkit::names::unique_id()));
    std::fs::write(&f, entry.to_string()).expect("write the entry");
    let out = sys::output(
        Command::new(artifacts::linkerd_cni())
            .args(["chain", "repair", "--conf-dir"])
            .arg(node.conf_dir())
            .arg("--entry")
            .arg(&f)
            .env_clear()
            .env("PATH", testkit::child_path()),
    );
    let _ = std::fs::remove_file(&f);
    assert!(
        out.status.success(),
        "chain repair: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
