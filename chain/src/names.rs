//! What a conf dir entry is, by its name alone: a config the runtime loads
//! (containerd's rules, as Go's `filepath.Ext` sees the extension), how the
//! runtime reads it ([`Kind`]), and the shape of owned mode's file names.
//! Nothing here opens a file: a name that looks like ours is confirmed by
//! its marker, in [`crate::owned`].

use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::Path;

/// The extensions runtimes load.
pub const CONFIG_EXTENSIONS: [&str; 3] = [".conf", ".conflist", ".json"];

/// Our file is the primary's stem followed by this.
pub const OWNED_SUFFIX: &str = "-linkerd-cni.conflist";

/// A path's file name, for messages and markers (the whole path when it
/// has none).
pub(crate) fn file_name(p: &Path) -> String {
    p.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| p.display().to_string())
}

/// Go's `filepath.Ext`: from the last `.` of the name (so `.conf` alone has
/// the extension `.conf`).
pub fn is_config_name(name: &OsStr) -> bool {
    let b = name.as_bytes();
    match b.iter().rposition(|&c| c == b'.').and_then(|i| b.get(i..)) {
        Some(ext) => CONFIG_EXTENSIONS.iter().any(|e| e.as_bytes() == ext),
        None => false,
    }
}

/// How a runtime reads a config file: a list only from `.conflist`; `.conf`
/// and `.json` hold a single plugin (containerd and CRI-O both reject a list
/// in them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    List,
    Single,
}

impl Kind {
    pub(crate) fn of(path: &Path) -> Kind {
        if path.as_os_str().as_bytes().ends_with(b".conflist") {
            Kind::List
        } else {
            Kind::Single
        }
    }
}

/// Our file's name for a primary named `primary`: its stem (up to its last
/// `.`) followed by [`OWNED_SUFFIX`].
pub fn owned_name(primary: &OsStr) -> OsString {
    let b = primary.as_bytes();
    let stem = match b.iter().rposition(|&c| c == b'.') {
        Some(i) => b.get(..i).unwrap_or_default(),
        None => b,
    };
    let mut name = stem.to_vec();
    name.extend_from_slice(OWNED_SUFFIX.as_bytes());
    OsString::from_vec(name)
}

/// Whether a config name has the shape of ours (to be confirmed by the
/// marker inside).
pub(crate) fn is_owned_name(name: &OsStr) -> bool {
    name.as_bytes().ends_with(OWNED_SUFFIX.as_bytes())
}

/// Whether a name that is no config looks like one of our files renamed by
/// appending something (`…-linkerd-cni.conflist.cilium_bak`).
pub(crate) fn is_renamed_owned_name(name: &OsStr) -> bool {
    let b = name.as_bytes();
    let s = OWNED_SUFFIX.as_bytes();
    b.windows(s.len())
        .position(|w| w == s)
        .is_some_and(|i| b.len() > i + s.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn extensions_as_go_sees_them() {
        for yes in [
            "10-calico.conflist",
            "a.conf",
            "x.json",
            ".conf",
            ".hidden.conflist",
            "a.b.conf",
        ] {
            assert!(is_config_name(OsStr::new(yes)), "{yes}");
        }
        for no in [
            "10-calico.conflist.bak",
            "conf",
            "a.CONF",
            "a.conf~",
            "a.cilium_bak",
            "ZZZ-linkerd-cni-kubeconfig",
            ".linkerd-cni-tmp-1-2",
            "a.conflist.tmp",
        ] {
            assert!(!is_config_name(OsStr::new(no)), "{no}");
        }
    }
}
