//! inotify as a speed-up, never as the source of truth: an event only makes
//! the next reconcile come sooner. Correctness comes from the periodic,
//! level-triggered reconcile, so a watch that fails to arm, overflows or
//! misses an event costs at most one resync period.
//!
//! Raw inotify through `nix` (already our syscall crate for the signalfd
//! and poll the main loop needs) rather than a watcher crate: the loop polls
//! the inotify fd together with the signalfd, with no thread and no runtime.

use std::os::fd::{AsFd, BorrowedFd};
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify, WatchDescriptor};

use linkerd_cni_chain::write::is_temp_name;

use crate::config::has_config_extension;

/// Which names in a watched directory matter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Filter {
    /// Network configs (any name the runtime would load) and these names.
    ConfigsAnd(Vec<String>),
    /// Only these names.
    Names(Vec<String>),
    /// Every change (the service-account dir: the kubelet swaps `..data`).
    Any,
}

impl Filter {
    fn matches(&self, name: &str) -> bool {
        if is_temp_name(std::ffi::OsStr::new(name)) {
            return false;
        }
        match self {
            Filter::ConfigsAnd(names) => {
                has_config_extension(name) || names.iter().any(|n| n == name)
            }
            Filter::Names(names) => names.iter().any(|n| n == name),
            Filter::Any => true,
        }
    }
}

#[derive(Debug)]
struct Target {
    dir: PathBuf,
    filter: Filter,
    wd: Option<WatchDescriptor>,
    /// The last error arming it, so that it is reported once.
    failed: Option<Errno>,
}

/// A watch that could not be armed (the directory may not exist yet).
#[derive(Debug)]
pub struct ArmError {
    pub dir: PathBuf,
    pub errno: Errno,
}

#[derive(Debug)]
pub struct Watcher {
    inotify: Inotify,
    targets: Vec<Target>,
}

fn mask() -> AddWatchFlags {
    AddWatchFlags::IN_CREATE
        | AddWatchFlags::IN_CLOSE_WRITE
        | AddWatchFlags::IN_MODIFY
        | AddWatchFlags::IN_ATTRIB
        | AddWatchFlags::IN_MOVED_FROM
        | AddWatchFlags::IN_MOVED_TO
        | AddWatchFlags::IN_DELETE
        | AddWatchFlags::IN_DELETE_SELF
        | AddWatchFlags::IN_MOVE_SELF
        | AddWatchFlags::IN_ONLYDIR
}

impl Watcher {
    pub fn new(targets: Vec<(PathBuf, Filter)>) -> Result<Watcher, Errno> {
        let inotify = Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC)?;
        Ok(Watcher {
            inotify,
            targets: targets
                .into_iter()
                .map(|(dir, filter)| Target {
                    dir,
                    filter,
                    wd: None,
                    failed: None,
                })
                .collect(),
        })
    }

    /// Arms every watch not armed yet. Called before every reconcile, so a
    /// watch lost with its directory comes back when the directory does.
    /// Returns the failures not reported before.
    pub fn arm(&mut self) -> Vec<ArmError> {
        let mut new_failures = vec![];
        for t in self.targets.iter_mut().filter(|t| t.wd.is_none()) {
            match self.inotify.add_watch(&t.dir, mask()) {
                Ok(wd) => {
                    t.wd = Some(wd);
                    t.failed = None;
                }
                Err(errno) => {
                    if t.failed != Some(errno) {
                        new_failures.push(ArmError {
                            dir: t.dir.clone(),
                            errno,
                        });
                    }
                    t.failed = Some(errno);
                }
            }
        }
        new_failures
    }

    pub fn fd(&self) -> BorrowedFd<'_> {
        self.inotify.as_fd()
    }

    /// Reads every pending event; true when one of them matters.
    pub fn drain(&mut self) -> bool {
        let mut relevant = false;
        loop {
            let events = match self.inotify.read_events() {
                Ok(ev) if !ev.is_empty() => ev,
                // EAGAIN: nothing more to read. Other errors are not expected
                // on an inotify fd; the periodic reconcile covers for them.
                _ => return relevant,
            };
            for ev in events {
                if ev.mask.contains(AddWatchFlags::IN_Q_OVERFLOW) {
                    relevant = true;
                    continue;
                }
                let gone = ev.mask.intersects(
                    AddWatchFlags::IN_IGNORED
                        | AddWatchFlags::IN_DELETE_SELF
                        | AddWatchFlags::IN_MOVE_SELF,
                );
                for t in self.targets.iter_mut().filter(|t| t.wd == Some(ev.wd)) {
                    if gone {
                        // Re-armed before the next reconcile, on whatever
                        // directory then has this path.
                        t.wd = None;
                        relevant = true;
                    } else if let Some(name) = &ev.name
                        && t.filter.matches(&name.to_string_lossy())
                    {
                        relevant = true;
                    }
                }
            }
        }
    }

    /// The watched directories, for the start-up log line.
    pub fn dirs(&self) -> impl Iterator<Item = &Path> {
        self.targets.iter().map(|t| t.dir.as_path())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filters() {
        let f = Filter::ConfigsAnd(vec!["ZZZ-linkerd-cni-kubeconfig".into()]);
        assert!(f.matches("10-calico.conflist"));
        assert!(f.matches("ZZZ-linkerd-cni-kubeconfig"));
        assert!(!f.matches("README"));
        // Our own temp files never wake a pass, whatever the filter.
        assert!(!f.matches(".linkerd-cni-tmp-1-2-3"));
        assert!(!Filter::Any.matches(".linkerd-cni-tmp-1-2-3"));
        let n = Filter::Names(vec!["linkerd-cni".into()]);
        assert!(n.matches("linkerd-cni"));
        assert!(!n.matches("calico"));
        assert!(Filter::Any.matches("..data"));
    }

    #[test]
    fn relevant_events_and_rearm_after_the_dir_comes_back() {
        let dir = std::env::temp_dir().join(format!("lcni-watch-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let mut w =
            Watcher::new(vec![(dir.clone(), Filter::ConfigsAnd(vec!["kc".into()]))]).unwrap();
        // Not there yet: reported once, retried silently.
        assert_eq!(w.arm().len(), 1);
        assert!(w.arm().is_empty());
        std::fs::create_dir(&dir).unwrap();
        assert!(w.arm().is_empty());

        std::fs::write(dir.join("README"), "x").unwrap();
        assert!(!w.drain());
        std::fs::write(dir.join("10-calico.conflist"), "{}").unwrap();
        assert!(w.drain());
        std::fs::write(dir.join("kc"), "x").unwrap();
        assert!(w.drain());
        assert!(!w.drain());

        // The directory goes away and comes back: the watch follows.
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(w.drain());
        std::fs::create_dir(&dir).unwrap();
        assert!(w.arm().is_empty());
        std::fs::write(dir.join("05-cilium.conflist"), "{}").unwrap();
        assert!(w.drain());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
