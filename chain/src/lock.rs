//! The conf-dir lock that serialises every linkerd-cni writer: plugin
//! invocations, the installer and the CLI.
//!
//! An exclusive `flock` on the conf directory itself: a rename never replaces
//! it (a lock on the conflist would be dropped by our own rename), and no lock
//! file appears in the conf dir (containerd reloads on any write there). The
//! kernel releases it when the holder dies, so a killed repair never leaves
//! it held; it is respected across bind mounts and mount namespaces, so the
//! installer's container and the host's plugin share it.

use std::fs::{File, OpenOptions, TryLockError};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::time::{Duration, Instant};

use nix::fcntl::OFlag;

use super::ChainError;

/// Held until dropped.
#[derive(Debug)]
pub struct DirLock {
    _dir: File,
}

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
    let file = open_dir(dir).map_err(|e| ChainError::io("open the conf dir to lock it", dir, e))?;
    // Polling rather than a blocking flock: std has no flock with a timeout,
    // and a signal-based one would disturb the host process (the installer).
    let mut pause = Duration::from_millis(1);
    loop {
        match file.try_lock() {
            Ok(()) => return Ok(DirLock { _dir: file }),
            Err(TryLockError::WouldBlock) => {}
            Err(TryLockError::Error(e)) => return Err(ChainError::io("lock", dir, e)),
        }
        let now = Instant::now();
        if now >= end {
            return Err(ChainError::LockTimeout {
                dir: dir.to_path_buf(),
                waited: now - start,
            });
        }
        std::thread::sleep(pause.min(end - now));
        pause = (pause * 2).min(Duration::from_millis(20));
    }
}

/// What `still` returns, called while the lock is held shared, or `None`
/// when a writer holds it now. For readers judging temp files: those of a
/// repair in progress (ours between its exchange and its fsync) are not
/// leftovers, and while the lock is held shared no writer can start or
/// finish. An unopenable dir has no writer to wait for.
pub(crate) fn unless_writing<T>(dir: &Path, still: impl FnOnce() -> T) -> Option<T> {
    let Ok(file) = open_dir(dir) else {
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
