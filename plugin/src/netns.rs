//! Running code inside another network namespace without `nsenter` (absent
//! on some node OSes, e.g. Talos).
//!
//! `setns(2)` changes the namespace of the calling thread only, so the work
//! runs on a dedicated thread that enters the namespace and then exits:
//! the rest of the process never changes namespace, and processes that
//! thread spawns (iptables) start in the pod's namespace.

use std::fs::File;
use std::path::{Path, PathBuf};

use nix::sched::{CloneFlags, setns};
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
    #[error("cannot start a thread to enter network namespace {path}: {source}")]
    Thread {
        path: PathBuf,
        source: std::io::Error,
    },
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
    let ns = File::open(path).map_err(|source| NetnsError::Open {
        path: path.to_path_buf(),
        source,
    })?;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_name_the_path() {
        let e = run_in(Path::new("/nonexistent/netns/x"), || ()).unwrap_err();
        assert!(matches!(e, NetnsError::Open { .. }));
        assert!(e.to_string().contains("/nonexistent/netns/x"), "{e}");

        // A file that is not a namespace: setns refuses it (EINVAL).
        let e = run_in(Path::new("/proc/self/status"), || ()).unwrap_err();
        assert!(matches!(e, NetnsError::Enter { .. }), "{e}");
        assert!(e.to_string().contains("/proc/self/status"), "{e}");
    }

    #[test]
    fn own_namespace_runs_the_closure() {
        // Entering the namespace we are already in needs no throwaway netns.
        let v = run_in(Path::new("/proc/self/ns/net"), || 42).unwrap();
        assert_eq!(v, 42);
    }
}
