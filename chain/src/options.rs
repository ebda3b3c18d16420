//! The bounds and conditions every write to the conf dir runs under.

use std::path::PathBuf;
use std::time::{Duration, Instant};

/// Bounds and conditions for one repair.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RepairOptions {
    /// The most to wait for the conf-dir lock.
    pub lock_timeout: Duration,
    /// The whole repair ends by then (it never leaves a half-done change).
    pub deadline: Option<Instant>,
    /// Repair only while this file exists, checked under the lock. The
    /// plugin passes its kubeconfig: uninstall removes the kubeconfig and
    /// then sweeps the entries once more under the lock, so an ADD already
    /// in flight cannot chain the node again to a binary about to be removed.
    pub requires: Option<PathBuf>,
    /// Where the host's `/` is in this process: absolute symlink targets in
    /// the conf dir are resolved under it. `/` for the plugin; the host
    /// mount (`CONTAINER_MOUNT_PREFIX`) for the installer, whose own `/` is
    /// the container's.
    pub host_root: PathBuf,
    /// Whether to write through a symlinked config to a file outside the
    /// conf dir. Off by default: such a file is outside the conf dir's
    /// lock and belongs to whoever made the link, so the repair is refused
    /// with the reason in the diagnosis.
    pub write_outside_conf_dir: bool,
}

impl Default for RepairOptions {
    fn default() -> Self {
        RepairOptions {
            lock_timeout: Duration::from_secs(2),
            deadline: None,
            requires: None,
            host_root: PathBuf::from("/"),
            write_outside_conf_dir: false,
        }
    }
}

/// Whether `deadline` has come.
pub(crate) fn past(deadline: Option<Instant>) -> bool {
    deadline.is_some_and(|d| Instant::now() >= d)
}
