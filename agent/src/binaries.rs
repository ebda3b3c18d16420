//! The CNI binaries shipped in the image (`CONTAINER_CNI_BIN_DIR`, at least
//! `linkerd-cni`) and their copies in the host's bin dir.
//!
//! A copy is current when it has the same bytes and is executable; anything
//! else is replaced atomically (the chain library's `write::copy_atomic`). The bytes are
//! compared once: while neither file's identity (device, inode, size,
//! modification time) changes after a comparison found them equal, a pass
//! only looks at their metadata instead of reading megabytes.

use std::cell::Cell;
use std::fmt;
use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::PathBuf;

use crate::config::{Config, ConfigError};
use crate::fsutil::{self, FsError};

/// The plugin binary; the runtime runs it by this name (the entry's `type`).
pub const PLUGIN_BINARY: &str = "linkerd-cni";

const BINARY_MODE: u32 = 0o755;

/// One binary to install.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Binary {
    pub name: String,
    /// In the image.
    pub source: PathBuf,
    /// In the host's bin dir, as the installer reaches it.
    pub dest: PathBuf,
    /// The identities of source and copy when their bytes last compared
    /// equal.
    pub verified: Cell<Option<(Stamp, Stamp)>>,
}

/// What changes whenever a file's content can have changed: a rewrite in
/// place moves the modification time (and usually the size), a replacement
/// by rename the inode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stamp {
    dev: u64,
    ino: u64,
    len: u64,
    mtime: (i64, i64),
}

impl Stamp {
    fn of(m: &fs::Metadata) -> Stamp {
        Stamp {
            dev: m.dev(),
            ino: m.ino(),
            len: m.len(),
            mtime: (m.mtime(), m.mtime_nsec()),
        }
    }
}

/// How a host copy compares with its source.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BinaryState {
    Current,
    Missing,
    Differs,
    NotExecutable,
}

impl fmt::Display for BinaryState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            BinaryState::Current => "current",
            BinaryState::Missing => "missing",
            BinaryState::Differs => "different from the image's",
            BinaryState::NotExecutable => "not executable",
        })
    }
}

/// The binary `name`, from `source` in the image to the host's bin dir.
fn binary(cfg: &Config, name: &str, source: PathBuf) -> Binary {
    Binary {
        name: name.to_string(),
        source,
        dest: cfg.bin_dir().join(name),
        verified: Cell::new(None),
    }
}

/// The plugin binary alone, without looking at the image: for the
/// commands that only read or remove the host's copy (`status`,
/// `uninstall`) when `CONTAINER_CNI_BIN_DIR` cannot be listed.
pub fn plugin_only(cfg: &Config) -> Vec<Binary> {
    let source = cfg.container_cni_bin_dir.join(PLUGIN_BINARY);
    vec![binary(cfg, PLUGIN_BINARY, source)]
}

/// Lists the regular files of `CONTAINER_CNI_BIN_DIR` (by name order). The
/// image is immutable, so this is read once at start.
pub fn list(cfg: &Config) -> Result<Vec<Binary>, ConfigError> {
    const VAR: &str = "CONTAINER_CNI_BIN_DIR";
    let dir = &cfg.container_cni_bin_dir;
    let unlisted =
        |e: std::io::Error| ConfigError::new(VAR, format!("cannot list {}: {e}", dir.display()));
    let mut out = vec![];
    for entry in fs::read_dir(dir).map_err(unlisted)? {
        let entry = entry.map_err(unlisted)?;
        // Symlinks are followed: the image may link a binary into place.
        let is_file = fs::metadata(entry.path()).is_ok_and(|m| m.is_file());
        match entry.file_name().to_str() {
            Some(name) if is_file && !name.starts_with('.') => {
                out.push(binary(cfg, name, entry.path()))
            }
            _ => {}
        }
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    if !out.iter().any(|b| b.name == PLUGIN_BINARY) {
        return Err(ConfigError::new(
            VAR,
            format!(
                "{} holds no {PLUGIN_BINARY} binary; it must point at the image's CNI binaries",
                dir.display()
            ),
        ));
    }
    Ok(out)
}

pub fn state(b: &Binary) -> Result<BinaryState, FsError> {
    let meta = match fs::metadata(&b.dest) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(BinaryState::Missing),
        Err(e) => return Err(FsError::new("cannot stat", &b.dest, e)),
    };
    let stamps = fs::metadata(&b.source)
        .ok()
        .map(|src| (Stamp::of(&src), Stamp::of(&meta)));
    if stamps.is_none() || b.verified.get() != stamps {
        if !fsutil::same_content(&b.source, &b.dest)? {
            b.verified.set(None);
            return Ok(BinaryState::Differs);
        }
        b.verified.set(stamps);
    }
    if !meta.is_file() || meta.permissions().mode() & 0o111 != 0o111 {
        return Ok(BinaryState::NotExecutable);
    }
    Ok(BinaryState::Current)
}

/// Makes the host copy current; returns the state it was in when it had to
/// write, None when it was already current.
pub fn ensure(b: &Binary) -> Result<Option<BinaryState>, FsError> {
    match state(b)? {
        BinaryState::Current => Ok(None),
        before => {
            linkerd_cni_chain::write::copy_atomic(&b.source, &b.dest, BINARY_MODE)?;
            Ok(Some(before))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unchanged_copy_is_not_read_again_and_any_change_is_seen() {
        let dir = testkit::TempDir::new("inst-bin").unwrap();
        let b = Binary {
            name: PLUGIN_BINARY.into(),
            source: dir.write("src", "#!/bin/sh\nexit 0\n"),
            dest: dir.join("dest"),
            verified: Cell::new(None),
        };
        assert_eq!(ensure(&b).unwrap(), Some(BinaryState::Missing));
        assert_eq!(state(&b).unwrap(), BinaryState::Current);
        let stamps = b.verified.get();
        assert!(stamps.is_some(), "compared once, remembered");
        assert_eq!(state(&b).unwrap(), BinaryState::Current);
        assert_eq!(b.verified.get(), stamps);
        // Rewritten in place, same size: the modification time moves.
        std::thread::sleep(std::time::Duration::from_millis(10));
        fs::write(&b.dest, "#!/bin/sh\nexit 1\n").unwrap();
        assert_eq!(state(&b).unwrap(), BinaryState::Differs);
        assert_eq!(ensure(&b).unwrap(), Some(BinaryState::Differs));
        assert_eq!(state(&b).unwrap(), BinaryState::Current);
    }
}
