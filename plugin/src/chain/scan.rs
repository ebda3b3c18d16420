//! Which files a runtime loads from a conf dir, in which order, and reading
//! them without ever blocking or slurping something huge.
//!
//! The rules are containerd's (libcni `ConfFiles` + go-cni): top-level
//! entries whose extension, as Go's `filepath.Ext` sees it, is `.conf`,
//! `.conflist` or `.json`; dotfiles included; directories skipped (a symlink
//! to a directory is not skipped, and then fails to load, as in containerd);
//! bytewise order of names. The first one is the active config.

use std::ffi::OsStr;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use nix::fcntl::OFlag;

use super::ChainError;
use super::write::TEMP_PREFIX;

/// The extensions runtimes load.
pub const CONFIG_EXTENSIONS: [&str; 3] = [".conf", ".conflist", ".json"];

/// Larger files are reported rather than read: no real network config comes
/// near this, and the plugin must stay quick whatever lies in the conf dir.
pub const MAX_CONFIG_SIZE: u64 = 1 << 20;

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

/// The conf dir as the runtime and the repair see it.
#[derive(Debug, Default)]
pub(crate) struct Listing {
    /// Config files, in load order: the first is the active one.
    pub configs: Vec<PathBuf>,
    /// Our temp files (from a repair that was killed, or one in progress).
    pub leftovers: Vec<PathBuf>,
    /// Owned mode's files (recognised by the marker inside), in load order:
    /// never a primary, so not among `configs`.
    pub owned: Vec<PathBuf>,
    /// Names that are no config but look like one of our files renamed by
    /// another agent (confirmed by the marker in [`super::owned`]).
    pub renamed: Vec<PathBuf>,
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

pub(crate) fn list(dir: &Path) -> Result<Listing, ChainError> {
    let rd = fs::read_dir(dir).map_err(|e| ChainError::io("read the conf dir", dir, e))?;
    let mut configs = Vec::new();
    let mut leftovers = Vec::new();
    let mut owned = Vec::new();
    let mut renamed = Vec::new();
    for ent in rd {
        let ent = ent.map_err(|e| ChainError::io("read the conf dir", dir, e))?;
        let name = ent.file_name();
        if name.as_bytes().starts_with(TEMP_PREFIX.as_bytes()) {
            leftovers.push(ent.path());
            continue;
        }
        if !is_config_name(&name) {
            if super::owned::is_renamed_owned_name(&name) {
                renamed.push(ent.path());
            }
            continue;
        }
        if super::owned::is_owned_name(&name) && super::owned::is_owned_file(&ent.path()) {
            owned.push(ent.path());
            continue;
        }
        // Like Go's DirEntry.IsDir: the entry itself, not a symlink's target.
        // A file that vanished meanwhile is simply not listed.
        match ent.file_type() {
            Ok(t) if t.is_dir() => continue,
            Ok(_) => configs.push(ent.path()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(ChainError::io("read the conf dir", dir, e)),
        }
    }
    configs.sort_by(|a, b| {
        let a = a.file_name().map(OsStrExt::as_bytes).unwrap_or_default();
        let b = b.file_name().map(OsStrExt::as_bytes).unwrap_or_default();
        a.cmp(b)
    });
    leftovers.sort();
    owned.sort_by(|a, b| a.as_os_str().as_bytes().cmp(b.as_os_str().as_bytes()));
    renamed.sort();
    Ok(Listing {
        configs,
        leftovers,
        owned,
        renamed,
    })
}

/// Reads a config (or entry) file through symlinks: regular files only (a
/// FIFO must not hang the plugin), at most [`MAX_CONFIG_SIZE`] bytes.
pub(crate) fn read_file(path: &Path) -> io::Result<Vec<u8>> {
    let mut f: File = OpenOptions::new()
        .read(true)
        .custom_flags((OFlag::O_NONBLOCK | OFlag::O_NOCTTY).bits())
        .open(path)?;
    let meta = f.metadata()?;
    if !meta.is_file() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "not a regular file",
        ));
    }
    if meta.len() > MAX_CONFIG_SIZE {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("larger than {MAX_CONFIG_SIZE} bytes"),
        ));
    }
    let mut buf = Vec::with_capacity(meta.len() as usize + 1);
    f.by_ref().take(MAX_CONFIG_SIZE + 1).read_to_end(&mut buf)?;
    if buf.len() as u64 > MAX_CONFIG_SIZE {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("larger than {MAX_CONFIG_SIZE} bytes"),
        ));
    }
    Ok(buf)
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
