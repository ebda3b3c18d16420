//! The CNI binaries shipped in the image (`CONTAINER_CNI_BIN_DIR`, at least
//! `linkerd-cni`) and their copies in the host's bin dir.
//!
//! A copy is current when it has the same bytes and is executable; anything
//! else is replaced atomically (see [`crate::fsutil`]).

use std::fmt;
use std::fs;
use std::os::unix::fs::PermissionsExt;
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

/// Lists the regular files of `CONTAINER_CNI_BIN_DIR` (by name order). The
/// image is immutable, so this is read once at start.
pub fn list(cfg: &Config) -> Result<Vec<Binary>, ConfigError> {
    const VAR: &str = "CONTAINER_CNI_BIN_DIR";
    let dir = &cfg.container_cni_bin_dir;
    let entries = fs::read_dir(dir)
        .map_err(|e| ConfigError::new(VAR, format!("cannot list {}: {e}", dir.display())))?;
    let dest_dir = cfg.bin_dir();
    let mut out = vec![];
    for entry in entries {
        let entry = entry
            .map_err(|e| ConfigError::new(VAR, format!("cannot list {}: {e}", dir.display())))?;
        let Ok(name) = entry.file_name().into_string() else {
            continue;
        };
        // Symlinks are followed: the image may link a binary into place.
        let is_file = fs::metadata(entry.path()).is_ok_and(|m| m.is_file());
        if name.starts_with('.') || !is_file {
            continue;
        }
        out.push(Binary {
            dest: dest_dir.join(&name),
            source: entry.path(),
            name,
        });
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
    if !fsutil::same_content(&b.source, &b.dest)? {
        return Ok(BinaryState::Differs);
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
            fsutil::copy_atomic(&b.source, &b.dest, BINARY_MODE)?;
            Ok(Some(before))
        }
    }
}

/// Removes the host copy (uninstall); Ok(false) when it was absent.
pub fn remove(b: &Binary) -> Result<bool, FsError> {
    fsutil::remove(&b.dest)
}
