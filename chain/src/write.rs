//! Crash-safe file replacement in a conf dir.
//!
//! A file is never written in place: the new content goes to a temp file in
//! the same directory (same file system, so the rename is atomic), under a
//! name no runtime loads, created exclusively, fully written, given the
//! original's mode and owner, and fsynced; only then is it renamed over the
//! target and the directory fsynced. A reader (or a runtime reloading on the
//! rename) sees the old file or the new one, never a mix, even if we are
//! killed at any point. What a kill leaves behind is a temp file, which the
//! next repair removes.

use std::fs::{self, File, Metadata, OpenOptions, Permissions};
use std::io::{self, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use nix::errno::Errno;
use nix::fcntl::{self, RenameFlags};

/// Our temp files start with this. Its only `.` is the first byte, so as
/// Go's `filepath.Ext` sees it the name has no config extension.
pub const TEMP_PREFIX: &str = ".linkerd-cni-tmp-";

static COUNTER: AtomicU32 = AtomicU32::new(0);

/// A temp file name unique to this process and call.
pub(crate) fn temp_path(dir: &Path) -> PathBuf {
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or_default();
    dir.join(format!("{TEMP_PREFIX}{}-{n}-{nanos:x}", std::process::id()))
}

/// Writes `content` to a new temp file in `dir`, with `like`'s mode and
/// owner (or 0644 and ours), fsynced. Returns its path; on error nothing is
/// left behind.
pub(crate) fn write_temp(
    dir: &Path,
    content: &[u8],
    like: Option<&Metadata>,
) -> io::Result<PathBuf> {
    let mode = like.map_or(0o644, |m| m.mode() & 0o7777);
    let mut attempts = 0;
    let (path, mut file) = loop {
        let path = temp_path(dir);
        match OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .open(&path)
        {
            Ok(f) => break (path, f),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists && attempts < 8 => attempts += 1,
            Err(e) => return Err(e),
        }
    };
    let res = (|| {
        file.write_all(content)?;
        if let Some(m) = like {
            let meta = file.metadata()?;
            if meta.uid() != m.uid() || meta.gid() != m.gid() {
                std::os::unix::fs::fchown(&file, Some(m.uid()), Some(m.gid()))?;
            }
        }
        // After the chown (which may clear set-id bits), and exact: the
        // create mode went through the umask.
        file.set_permissions(Permissions::from_mode(mode))?;
        file.sync_all()
    })();
    if let Err(e) = res {
        let _ = fs::remove_file(&path);
        return Err(e);
    }
    Ok(path)
}

fn renameat2(from: &Path, to: &Path, flags: RenameFlags) -> io::Result<()> {
    // AT_FDCWD: relative paths are relative to the working directory, as
    // std's rename treats them.
    fcntl::renameat2(fcntl::AT_FDCWD, from, fcntl::AT_FDCWD, to, flags).map_err(io::Error::from)
}

/// Whether an error means the file system (or kernel) lacks a renameat2 flag.
pub(crate) fn unsupported(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(code) if [Errno::EINVAL, Errno::ENOSYS, Errno::EOPNOTSUPP].contains(&Errno::from_raw(code))
    )
}

/// Atomically swaps two directory entries (`RENAME_EXCHANGE`): afterwards
/// `b` holds what `a` held and `a` holds what `b` held. This lets a repair
/// see exactly what it replaced.
pub(crate) fn exchange(a: &Path, b: &Path) -> io::Result<()> {
    renameat2(a, b, RenameFlags::RENAME_EXCHANGE)
}

/// Renames `from` to `to` only if `to` does not exist (`AlreadyExists`
/// otherwise). Falls back to link + unlink where `RENAME_NOREPLACE` is not
/// supported: same guarantee, briefly two names.
pub(crate) fn rename_noreplace(from: &Path, to: &Path) -> io::Result<()> {
    match renameat2(from, to, RenameFlags::RENAME_NOREPLACE) {
        Err(e) if unsupported(&e) => {
            fs::hard_link(from, to)?;
            fs::remove_file(from)
        }
        r => r,
    }
}

/// Makes renames and removals in `dir` durable.
pub(crate) fn fsync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// The directory holding `path` (`.` for a bare name).
pub(crate) fn parent(path: &Path) -> &Path {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn temp_files_get_the_original_mode_and_never_collide() {
        let dir = std::env::temp_dir().join(format!("lcni-write-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let orig = dir.join("10-x.conflist");
        fs::write(&orig, "{}").unwrap();
        fs::set_permissions(&orig, Permissions::from_mode(0o600)).unwrap();
        let like = fs::metadata(&orig).unwrap();
        let a = write_temp(&dir, b"one", Some(&like)).unwrap();
        let b = write_temp(&dir, b"two", Some(&like)).unwrap();
        assert_ne!(a, b);
        assert_eq!(fs::metadata(&a).unwrap().mode() & 0o7777, 0o600);
        assert!(!crate::scan::is_config_name(a.file_name().unwrap()));
        exchange(&a, &orig).unwrap();
        assert_eq!(fs::read(&orig).unwrap(), b"one");
        assert_eq!(fs::read(&a).unwrap(), b"{}");
        assert_eq!(
            rename_noreplace(&b, &orig).unwrap_err().kind(),
            io::ErrorKind::AlreadyExists
        );
        fs::remove_dir_all(&dir).unwrap();
    }
}
