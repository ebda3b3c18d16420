//! The conf-dir lock that serialises every linkerd-cni writer: plugin
//! invocations, the installer and the CLI.
//!
//! An exclusive `flock` on [`LOCK_FILE`], a file in the conf dir that only
//! root can open: mode 0600, owned by root, opened with `O_NOFOLLOW` and
//! refused unless it is a regular root-owned file. A `flock` needs only an
//! open descriptor, so a lock anyone can open is a lock anyone can hold:
//! any local account, or any container with a read-only mount of the conf
//! dir, could otherwise stop every repair for as long as it liked.
//!
//! Why there: the installer and the plugin must meet on one file, and the
//! conf dir is the one place both always reach (the upstream chart mounts
//! no state dir into the installer). Its name has no config extension, so
//! no runtime loads it; but creating or removing a name in the conf dir
//! makes runtimes reload their config, so it is created once, by the first
//! writer, and never removed, except by an uninstall
//! ([`remove_lock_file`]), which leaves the conf dir as it found it. A
//! rename never replaces it (a lock on the conflist would be dropped by our
//! own rename). Removal is safe at any moment: a writer that wins the lock
//! checks that the name still leads to the file it locked, and starts over
//! when it does not.
//!
//! Older linkerd-cni versions lock the conf dir itself. Through a rolling
//! upgrade their plugins and installer still run, so a writer takes the
//! directory's `flock` too, after the file's, but waits for it at most
//! [`OLD_LOCK_WAIT`]: an old writer holds it for one repair, milliseconds,
//! while a holder that keeps it longer is not a repair at all, and must not
//! stop ours (it is said once per process; the repair then goes on without
//! it, as it would next to any writer that takes no lock, which every
//! repair is safe against).
//!
//! The kernel releases both when the holder dies, so a killed repair never
//! leaves them held; they are respected across bind mounts and mount
//! namespaces, so the installer's container and the host's plugin share
//! them.

use std::fs::{self, File, OpenOptions, TryLockError};
use std::io;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use nix::fcntl::OFlag;

use super::ChainError;

/// The lock file's name in the conf dir. Its only `.` is the first byte:
/// as Go's `filepath.Ext` sees it, no extension, so no runtime loads it.
pub const LOCK_FILE: &str = ".linkerd-cni-lock";

/// The longest a writer waits for the conf dir's own `flock`, the lock of
/// older versions, once it holds [`LOCK_FILE`].
pub const OLD_LOCK_WAIT: Duration = Duration::from_millis(200);

/// Held until dropped.
#[derive(Debug)]
pub struct DirLock {
    _file: File,
    /// The conf dir's own `flock`, when it could be had in time.
    _dir: Option<File>,
}

/// Whether the process has said that the dir's own lock was held too long.
static OLD_LOCK_SAID: AtomicBool = AtomicBool::new(false);

/// Takes the lock, waiting at most `timeout` and never past `deadline`.
pub fn lock_dir(
    dir: &Path,
    timeout: Duration,
    deadline: Option<Instant>,
) -> Result<DirLock, ChainError> {
    let start = Instant::now();
    let mut end = start + timeout;
    if let Some(d) = deadline {
        end = end.min(d);
    }
    let dir_file =
        open_dir(dir).map_err(|e| ChainError::io("open the conf dir to lock it", dir, e))?;
    let path = dir.join(LOCK_FILE);
    let file = loop {
        let file = open_lock_file(&path).map_err(|e| ChainError::io("open the lock", &path, e))?;
        if !flock_until(&file, true, end).map_err(|e| ChainError::io("lock", &path, e))? {
            return Err(ChainError::LockTimeout {
                dir: dir.to_path_buf(),
                waited: start.elapsed(),
            });
        }
        // Removed or replaced while we waited: whoever creates the next one
        // would lock another file than ours.
        if same_file(&file, &path) {
            break file;
        }
    };
    let old_end = end.min(Instant::now() + OLD_LOCK_WAIT);
    let old = match flock_until(&dir_file, true, old_end) {
        Ok(true) => Some(dir_file),
        Ok(false) => {
            if !OLD_LOCK_SAID.swap(true, Ordering::Relaxed) {
                log::warn!(
                    "the conf dir {} stayed flock'ed for {OLD_LOCK_WAIT:?} by a process that does \
                     not hold {LOCK_FILE}: not a linkerd-cni repair (an older linkerd-cni's takes \
                     milliseconds), so repairs go on without waiting for it; find it with \
                     `lsof {}` or `fuser {}` (said once per process)",
                    dir.display(),
                    dir.display(),
                    dir.display()
                );
            }
            None
        }
        Err(e) => {
            log::debug!("cannot flock the conf dir {}: {e}", dir.display());
            None
        }
    };
    Ok(DirLock {
        _file: file,
        _dir: old,
    })
}

/// Removes [`LOCK_FILE`] from `dir` under the lock (an uninstall: the conf
/// dir is left as it was before linkerd-cni). Whether there was one. A
/// writer waiting on it meanwhile sees it gone and makes a new one.
pub fn remove_lock_file(dir: &Path, timeout: Duration) -> Result<bool, ChainError> {
    let path = dir.join(LOCK_FILE);
    if matches!(fs::symlink_metadata(&path), Err(e) if e.kind() == io::ErrorKind::NotFound) {
        return Ok(false);
    }
    let _lock = lock_dir(dir, timeout, None)?;
    match fs::remove_file(&path) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(ChainError::io("remove", &path, e)),
    }
}

/// Polls for `file`'s `flock` (exclusive or shared) until `end`: whether
/// it got it; released when the file is closed. Polling rather than a
/// blocking flock: std has no flock with a timeout, and a signal-based one
/// would disturb the host process (the installer). Also the state crate's,
/// for the state dir's files.
pub fn flock_until(file: &File, exclusive: bool, end: Instant) -> io::Result<bool> {
    let mut pause = Duration::from_millis(1);
    loop {
        let got = if exclusive {
            file.try_lock()
        } else {
            file.try_lock_shared()
        };
        match got {
            Ok(()) => return Ok(true),
            Err(TryLockError::WouldBlock) => {}
            Err(TryLockError::Error(e)) => return Err(e),
        }
        let now = Instant::now();
        if now >= end {
            return Ok(false);
        }
        std::thread::sleep(pause.min(end - now));
        pause = (pause * 2).min(Duration::from_millis(20));
    }
}

/// The lock file, created (0600) when missing; refused unless a regular
/// file owned by root, and made unreadable to others should root have
/// given it a looser mode (anyone who can open it can hold it).
fn open_lock_file(path: &Path) -> io::Result<File> {
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .custom_flags((OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_NOCTTY).bits())
        .open(path)
        .map_err(|e| match e.raw_os_error() {
            // A symlink in its place (`ELOOP` from `O_NOFOLLOW`).
            Some(code) if code == nix::errno::Errno::ELOOP as i32 => io::Error::new(
                io::ErrorKind::PermissionDenied,
                format!(
                    "{} is a symlink, which is never followed; remove it (linkerd-cni creates its own)",
                    path.display()
                ),
            ),
            _ => e,
        })?;
    let meta = f.metadata()?;
    if !meta.is_file() || meta.uid() != 0 {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "{} is not a regular file owned by root, so anyone might hold it; remove it \
                 (linkerd-cni creates its own)",
                path.display()
            ),
        ));
    }
    if meta.mode() & 0o077 != 0 {
        f.set_permissions(fs::Permissions::from_mode(0o600))?;
        log::warn!(
            "{} had mode {:04o}: set to 0600, so that no other user can hold the lock",
            path.display(),
            meta.mode() & 0o7777
        );
    }
    Ok(f)
}

/// Whether `path` still names the open `file`.
fn same_file(file: &File, path: &Path) -> bool {
    match (file.metadata(), fs::symlink_metadata(path)) {
        (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
        _ => false,
    }
}

/// What `still` returns, called while the lock is held shared, or `None`
/// when a writer holds it now. For readers judging temp files: those of a
/// repair in progress (ours between its exchange and its fsync) are not
/// leftovers, and while the lock is held shared no writer can start or
/// finish. Root readers look at [`LOCK_FILE`], which every writer of this
/// version holds (through an upgrade, an older writer's temp file may then
/// be reported as a leftover for the moment its repair lasts); others (who
/// cannot open it), and any reader while no lock file exists yet, at the
/// conf dir's own lock, which writers of every version take. Nothing
/// openable: no writer to wait for.
pub(crate) fn unless_writing<T>(dir: &Path, still: impl FnOnce() -> T) -> Option<T> {
    let file = OpenOptions::new()
        .read(true)
        .custom_flags((OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_NOCTTY).bits())
        .open(dir.join(LOCK_FILE))
        .ok()
        .filter(|f| f.metadata().is_ok_and(|m| m.is_file()))
        .or_else(|| open_dir(dir).ok());
    let Some(file) = file else {
        return Some(still());
    };
    match file.try_lock_shared() {
        Ok(()) => Some(still()),
        Err(TryLockError::WouldBlock) => None,
        Err(TryLockError::Error(_)) => Some(still()),
    }
}

/// The conf dir, to lock: a directory only, opened non-blocking, since a
/// FIFO in its place would block a plain open until a writer came, and a
/// regular file would be locked as if it were the conf dir. (std adds
/// O_CLOEXEC.)
fn open_dir(dir: &Path) -> std::io::Result<File> {
    OpenOptions::new()
        .read(true)
        .custom_flags((OFlag::O_DIRECTORY | OFlag::O_NONBLOCK).bits())
        .open(dir)
}
