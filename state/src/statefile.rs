//! The files that steer linkerd-cni's decisions from outside its input: the
//! plugin's state dir (the installer's heartbeat, the healthy-chain memo,
//! the ADD counters, the repair and retry histories) and the conf-dir lock
//! file. Whoever can write one of them can make an ADD skip a repair, pass
//! a meshed pod through, or hold every ADD; so each is trusted only as
//! root's own: a regular file (not a link to one: opened with
//! `O_NOFOLLOW`), owned by uid 0, and writable by nobody else (no group or
//! other write bit). Anything else is treated as absent and said so, for
//! reading and for writing alike. Checked on the open descriptor (`fstat`),
//! so that the name cannot be swapped between the check and the use.
//!
//! linkerd-cni always runs as root (the runtime runs the plugin as root;
//! the installer runs as uid 0), and writes these files with explicit
//! modes: a file that fails the check was not written by it.

use std::fs::{File, Metadata, OpenOptions};
use std::io::{self, Read};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::Path;

use nix::fcntl::OFlag;

/// The largest state file read: the memo and the histories are a few KiB.
pub const MAX_STATE_SIZE: u64 = 1 << 20;

/// Whether `meta` (of an open descriptor) is a file only root can have
/// written: `Err` says what is wrong and what to do.
pub fn trusted(meta: &Metadata) -> io::Result<()> {
    let why = if !meta.is_file() {
        "not a regular file".to_string()
    } else if meta.uid() != 0 {
        format!("owned by uid {}, not root", meta.uid())
    } else if meta.mode() & 0o022 != 0 {
        format!(
            "writable by group or others (mode {:04o})",
            meta.mode() & 0o7777
        )
    } else {
        return Ok(());
    };
    Err(io::Error::new(
        io::ErrorKind::PermissionDenied,
        format!("{why}: not trusted, so ignored (remove it; linkerd-cni writes its own)"),
    ))
}

/// Opens a state file for reading; refused unless [`trusted`]. A symlink
/// in its place is refused (`ELOOP`), not followed.
pub fn open(path: &Path) -> io::Result<File> {
    open_with(OpenOptions::new().read(true), path)
}

/// Opens a state file for reading and writing in place, created with
/// `mode` when missing; refused unless [`trusted`].
pub fn open_rw(path: &Path, mode: u32) -> io::Result<File> {
    let mut options = OpenOptions::new();
    options.read(true).write(true).create(true).truncate(false);
    open_with(options.mode(mode), path)
}

/// Opens `path` as `options` say, never through a symlink, never blocking
/// on a FIFO, never taking a terminal (std adds `O_CLOEXEC`); refused
/// unless [`trusted`].
fn open_with(options: &mut OpenOptions, path: &Path) -> io::Result<File> {
    let flags = OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_NOCTTY;
    let f = options
        .custom_flags(flags.bits())
        .open(path)
        .map_err(untrusted_link)?;
    trusted(&f.metadata()?)?;
    Ok(f)
}

/// Reads a state file ([`open`]): at most [`MAX_STATE_SIZE`] bytes.
pub fn read(path: &Path) -> io::Result<Vec<u8>> {
    let f = open(path)?;
    let mut buf = Vec::new();
    f.take(MAX_STATE_SIZE + 1).read_to_end(&mut buf)?;
    if buf.len() as u64 > MAX_STATE_SIZE {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("larger than {MAX_STATE_SIZE} bytes"),
        ));
    }
    Ok(buf)
}

/// `ELOOP` from an `O_NOFOLLOW` open: a symlink where a state file belongs.
fn untrusted_link(e: io::Error) -> io::Error {
    if e.raw_os_error() == Some(nix::errno::Errno::ELOOP as i32) {
        io::Error::new(
            io::ErrorKind::PermissionDenied,
            "a symlink: not followed (remove it; linkerd-cni writes its own)",
        )
    } else {
        e
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn only_roots_own_regular_files_are_trusted() {
        let tmp = testkit::TempDir::new("statefile").unwrap();
        let p = tmp.path().join("f");
        std::fs::write(&p, "x").unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert_eq!(read(&p).unwrap(), b"x");
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o666)).unwrap();
        let e = read(&p).unwrap_err().to_string();
        assert!(e.contains("writable by group or others (mode 0666)"), "{e}");
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o620)).unwrap();
        assert!(read(&p).is_err());
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
        std::os::unix::fs::chown(&p, Some(1000), None).unwrap();
        let e = read(&p).unwrap_err().to_string();
        assert!(e.contains("owned by uid 1000"), "{e}");
        assert!(open_rw(&p, 0o600).is_err());
        // A link to a trusted file is not followed, for reading or writing.
        let good = tmp.path().join("good");
        std::fs::write(&good, "y").unwrap();
        let link = tmp.path().join("link");
        std::os::unix::fs::symlink(&good, &link).unwrap();
        let e = read(&link).unwrap_err().to_string();
        assert!(e.contains("symlink"), "{e}");
        let dangling = tmp.path().join("dangling");
        std::os::unix::fs::symlink(tmp.path().join("target"), &dangling).unwrap();
        assert!(open_rw(&dangling, 0o600).is_err());
        assert!(
            !tmp.path().join("target").exists(),
            "no file made through it"
        );
        // A directory.
        assert!(read(tmp.path()).is_err());
    }
}
