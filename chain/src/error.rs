//! The chain module's error type.
//!
//! Every variant names the file or directory involved and, where there is
//! one, what a person can do about it: these errors end up in the plugin's
//! log, the installer's log and the `chain` CLI's output.

use std::io;
use std::path::PathBuf;
use std::time::Duration;

#[derive(Debug, thiserror::Error)]
pub enum ChainError {
    /// A file-system operation failed.
    #[error("cannot {action} {}: {source}{}", path.display(), permission_hint(source))]
    Io {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },

    /// Another repair (plugin, installer or CLI) held the conf-dir lock for
    /// longer than we were allowed to wait.
    #[error(
        "timed out after {waited:?} waiting for the lock on {}: another linkerd-cni repair holds it; try again",
        dir.display()
    )]
    LockTimeout { dir: PathBuf, waited: Duration },

    /// The caller's deadline passed before the repair could finish. Nothing
    /// half-done is left behind: either the file was replaced or it was not.
    #[error("deadline reached before {} could be repaired; it was left as it was", path.display())]
    Deadline { path: PathBuf },

    /// The desired entry (from the entry file, `--entry` or stdin) is unusable.
    #[error("invalid linkerd-cni entry from {origin}: {problem}")]
    InvalidEntry {
        origin: String,
        #[source]
        problem: EntryProblem,
    },

    /// A repair would destroy or shadow something that is not ours.
    #[error("will not repair {}: {reason}", path.display())]
    Refused { path: PathBuf, reason: String },

    /// Another writer kept changing the file faster than we could repair it.
    #[error(
        "{} changed {attempts} times while being repaired; another agent is rewriting it, try again later",
        path.display()
    )]
    Contended { path: PathBuf, attempts: u32 },
}

/// Why a JSON value is not a linkerd-cni entry.
#[derive(Debug, thiserror::Error)]
pub enum EntryProblem {
    #[error("not valid JSON: {0}")]
    Json(#[source] serde_json::Error),
    #[error("not a JSON object")]
    NotAnObject,
    #[error("\"type\" must be {:?}, found {found}", crate::PLUGIN_TYPE)]
    WrongType { found: String },
    #[error("{key:?} must be \"inline\" or \"owned\", found {found}")]
    UnknownMode { key: &'static str, found: String },
}

impl ChainError {
    /// An I/O error of `action` on `path`: also the state crate's, for the
    /// files it writes through this crate.
    pub fn io(action: &'static str, path: impl Into<PathBuf>, source: io::Error) -> Self {
        ChainError::Io {
            action,
            path: path.into(),
            source,
        }
    }
}

/// What a permission error means for linkerd-cni, which runs as uid 0:
/// the installer's and the repair controller's containers have only the
/// capabilities deploy/ grants, so root is bound by owners and modes like
/// any user (empty for other errors). Reading is not fixed by granting
/// CAP_DAC_READ_SEARCH: with it the runtime's default seccomp profile
/// allows open_by_handle_at, which opens any file of the host's file system
/// behind the conf dir's mount.
pub(crate) fn permission_hint(e: &io::Error) -> &'static str {
    match e.raw_os_error() {
        Some(code) if code == nix::errno::Errno::EACCES as i32 => {
            " (root without CAP_DAC_READ_SEARCH may read only what a file's owner and mode \
             allow, and deploy/linkerd-cni.yaml grants that capability to no container: with \
             it, open_by_handle_at reaches every file of the host. The plugin, which the \
             runtime runs as root, repairs the file at each ADD that runs it; to chain it now, \
             run `linkerd-cni chain repair` as root on the node, or let root read the file)"
        }
        Some(code) if code == nix::errno::Errno::EPERM as i32 => {
            " (keeping the owner of a file another uid owns takes CAP_CHOWN: grant the \
             installer's container that capability, as deploy/linkerd-cni.yaml does)"
        }
        _ => "",
    }
}
