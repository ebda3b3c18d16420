//! Running code inside another network namespace without `nsenter` (absent
//! on some node OSes, e.g. Talos).
//!
//! `setns(2)` changes the namespace of the calling thread only, so the work
//! runs on a dedicated thread that enters the namespace and then exits:
//! the rest of the process never changes namespace, and processes that
//! thread spawns (iptables) start in the pod's namespace.
//!
//! The path is opened non-blocking (a FIFO would otherwise block the open
//! until a writer comes, past every deadline) and refused unless the file
//! is a namespace (on nsfs): a FIFO, socket, device, directory or regular
//! file gets a clear error before any thread or `setns`, which then refuses
//! namespaces of other kinds. A namespace that is the plugin's own or the
//! host's (pid 1's) is refused too, by namespace identity (device and inode
//! of the nsfs file), whatever path names it: the rules would otherwise
//! redirect the node's own traffic.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use nix::fcntl::OFlag;
use nix::sched::{CloneFlags, setns};
use nix::sys::statfs::{NSFS_MAGIC, fstatfs};
use thiserror::Error;

#[derive(Debug, Error)]
pub enum NetnsError {
    #[error("cannot open network namespace {path}: {source}")]
    Open {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot enter network namespace {path}: {errno} (is it a network namespace?)")]
    Enter { path: PathBuf, errno: nix::Error },
    #[error(
        "refusing CNI_NETNS {path}: it is {what}, not a network namespace; the container \
         runtime must pass the pod's (a bind mount such as /var/run/netns/NAME, or \
         /proc/PID/ns/net)"
    )]
    NotANamespace { path: PathBuf, what: &'static str },
    #[error("cannot start a thread to enter network namespace {path}: {source}")]
    Thread {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "refusing network namespace {path}: it is {whose} network namespace, not a pod's; \
         the container runtime must pass the pod's namespace in CNI_NETNS"
    )]
    NotAPod { path: PathBuf, whose: &'static str },
    #[error("the work inside network namespace {path} panicked")]
    Panicked { path: PathBuf },
}

/// Runs `f` on a new thread that has entered the network namespace at `path`
/// (e.g. `/var/run/netns/x` or `/proc/<pid>/ns/net`).
pub fn run_in<T, F>(path: &Path, f: F) -> Result<T, NetnsError>
where
    T: Send,
    F: FnOnce() -> T + Send,
{
    // Opened here so a bad path fails before any thread exists.
    let ns = open_namespace(path)?;
    refuse_own(&ns, path)?;
    std::thread::scope(|s| {
        let handle = std::thread::Builder::new()
            .name("netns".into())
            .spawn_scoped(s, move || -> Result<T, NetnsError> {
                setns(&ns, CloneFlags::CLONE_NEWNET).map_err(|errno| NetnsError::Enter {
                    path: path.to_path_buf(),
                    errno,
                })?;
                drop(ns);
                Ok(f())
            })
            .map_err(|source| NetnsError::Thread {
                path: path.to_path_buf(),
                source,
            })?;
        handle.join().unwrap_or(Err(NetnsError::Panicked {
            path: path.to_path_buf(),
        }))
    })
}

/// Opens `path` without blocking and without becoming its controlling
/// terminal, and keeps it only if it is a namespace file.
fn open_namespace(path: &Path) -> Result<File, NetnsError> {
    let open_err = |source| NetnsError::Open {
        path: path.to_path_buf(),
        source,
    };
    let ns = OpenOptions::new()
        .read(true)
        .custom_flags((OFlag::O_NONBLOCK | OFlag::O_NOCTTY).bits())
        .open(path)
        .map_err(|e| {
            // A socket cannot be opened at all (ENXIO): say what it is.
            match std::fs::metadata(path) {
                Ok(m) if m.file_type().is_socket() => NetnsError::NotANamespace {
                    path: path.to_path_buf(),
                    what: "a socket",
                },
                _ => open_err(e),
            }
        })?;
    let meta = ns.metadata().map_err(open_err)?;
    let t = meta.file_type();
    let what = if t.is_fifo() {
        "a FIFO"
    } else if t.is_socket() {
        "a socket"
    } else if t.is_char_device() || t.is_block_device() {
        "a device"
    } else if t.is_dir() {
        "a directory"
    } else {
        // nsfs files are empty "regular" files: only the file system tells
        // them from an ordinary one.
        match fstatfs(&ns) {
            Ok(fs) if fs.filesystem_type() == NSFS_MAGIC => return Ok(ns),
            Ok(_) => "a file that is not on nsfs",
            Err(errno) => return Err(open_err(errno.into())),
        }
    };
    Err(NetnsError::NotANamespace {
        path: path.to_path_buf(),
        what,
    })
}

/// Errs when `ns` is the network namespace this process (or thread) or pid
/// 1 is in. A file whose identity cannot be read is left to `setns`, which
/// refuses anything that is not a namespace.
fn refuse_own(ns: &File, path: &Path) -> Result<(), NetnsError> {
    let Ok(target) = ns.metadata() else {
        return Ok(());
    };
    let id = |m: &std::fs::Metadata| (m.dev(), m.ino());
    for (own, whose) in [
        ("/proc/thread-self/ns/net", "linkerd-cni's own"),
        ("/proc/self/ns/net", "linkerd-cni's own"),
        ("/proc/1/ns/net", "the host's (pid 1's)"),
    ] {
        if std::fs::metadata(own).is_ok_and(|m| id(&m) == id(&target)) {
            return Err(NetnsError::NotAPod {
                path: path.to_path_buf(),
                whose,
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_name_the_path() {
        let e = run_in(Path::new("/nonexistent/netns/x"), || ()).unwrap_err();
        assert!(matches!(e, NetnsError::Open { .. }));
        assert!(e.to_string().contains("/nonexistent/netns/x"), "{e}");

        // A file that is not a namespace: refused before setns.
        let e = run_in(Path::new("/proc/self/status"), || ()).unwrap_err();
        assert!(matches!(e, NetnsError::NotANamespace { .. }), "{e}");
        assert!(e.to_string().contains("/proc/self/status"), "{e}");

        // A namespace of another kind: setns refuses it (EINVAL).
        let e = run_in(Path::new("/proc/self/ns/uts"), || ()).unwrap_err();
        assert!(matches!(e, NetnsError::Enter { .. }), "{e}");
    }

    #[test]
    fn own_and_host_namespaces_are_refused() {
        // Rules meant for a pod must never land in the node's namespace.
        for path in [
            "/proc/self/ns/net",
            "/proc/thread-self/ns/net",
            "/proc/1/ns/net",
        ] {
            let ran = std::sync::atomic::AtomicBool::new(false);
            let e = run_in(Path::new(path), || {
                ran.store(true, std::sync::atomic::Ordering::SeqCst)
            })
            .unwrap_err();
            assert!(!ran.into_inner(), "{path}: the closure ran");
            // pid 1 may be out of reach (another user namespace): then the
            // open fails, which refuses it too.
            let unreadable = path == "/proc/1/ns/net" && matches!(e, NetnsError::Open { .. });
            assert!(
                matches!(e, NetnsError::NotAPod { .. }) || unreadable,
                "{path}: {e}"
            );
            assert!(e.to_string().contains(path), "{e}");
        }
    }
}
