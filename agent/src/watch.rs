//! inotify as a speed-up, never as the source of truth: an event only makes
//! the next reconcile come sooner. Correctness comes from the periodic,
//! level-triggered reconcile, so a watch that fails to arm, overflows or
//! misses an event costs at most one resync period.
//!
//! Events are sorted by what they call for ([`Wanted`]): a network config
//! written, renamed or removed in the conf dir calls for the chain alone,
//! at once (a pod created right after the primary's write must find the
//! chain repaired); anything else (the kubeconfig, the persisted entry,
//! binaries, credentials, the template, the container runtime's settings)
//! for a whole pass.
//!
//! Raw inotify through `nix` (already our syscall crate for the signalfd
//! and poll the main loop needs) rather than a watcher crate: the loop polls
//! the inotify fd together with the signalfd, with no thread and no runtime.

use std::os::fd::{AsFd, BorrowedFd};
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify, WatchDescriptor};

use linkerd_cni_chain::is_config_name;
use linkerd_cni_chain::write::is_temp_name;

/// Which names in a watched directory matter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Filter {
    /// Network configs (any name the runtime would load: chain events) and
    /// these names.
    ConfigsAnd(Vec<String>),
    /// Only these names.
    Names(Vec<String>),
    /// Every change (the service-account dir: the kubelet swaps `..data`).
    Any,
    /// The container runtime's settings: names matching these patterns
    /// (an imports glob's last part, as [`crate::runtime::name_matches`]),
    /// once written. `auto` mode re-decides in a whole pass.
    Settings(Vec<String>),
}

/// What the events read so far call for.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Wanted {
    /// A network config in the conf dir changed: reconcile the chain now.
    pub chain: bool,
    /// Something else changed (or events were lost): a whole pass.
    pub full: bool,
}

impl Wanted {
    /// A whole pass, not the chain alone.
    const FULL: Wanted = Wanted {
        chain: false,
        full: true,
    };

    fn add(&mut self, other: Wanted) {
        self.chain |= other.chain;
        self.full |= other.full;
    }
}

/// The events on a network config that call for the chain: a write
/// completed, a rename, a removal, a permission change. A file being
/// created or written (IN_CREATE, IN_MODIFY) is not finished yet: reading
/// it then would find it empty or half-written; its IN_CLOSE_WRITE or the
/// rename that publishes it follows.
fn chain_event(mask: AddWatchFlags) -> bool {
    mask.intersects(
        AddWatchFlags::IN_CLOSE_WRITE
            | AddWatchFlags::IN_MOVED_TO
            | AddWatchFlags::IN_MOVED_FROM
            | AddWatchFlags::IN_DELETE
            | AddWatchFlags::IN_ATTRIB,
    )
}

impl Filter {
    /// What an event (`mask`) on `name` calls for.
    fn wants(&self, name: &str, mask: AddWatchFlags) -> Wanted {
        let none = Wanted::default();
        let os_name = std::ffi::OsStr::new(name);
        if is_temp_name(os_name) {
            return none;
        }
        match self {
            // Any name the runtime would load (the chain library's rule).
            Filter::ConfigsAnd(_) if is_config_name(os_name) => Wanted {
                chain: chain_event(mask),
                full: false,
            },
            Filter::ConfigsAnd(names) | Filter::Names(names) if names.iter().any(|n| n == name) => {
                Wanted::FULL
            }
            Filter::ConfigsAnd(_) | Filter::Names(_) => none,
            Filter::Any => Wanted::FULL,
            // Written, like a network config: read half-written, a file
            // would select inline mode for a moment. A directory (CRI-O's
            // drop-ins) is complete once created.
            Filter::Settings(patterns)
                if patterns
                    .iter()
                    .any(|p| crate::runtime::name_matches(p, name) == Some(true))
                    && (chain_event(mask)
                        || mask.contains(AddWatchFlags::IN_CREATE | AddWatchFlags::IN_ISDIR)) =>
            {
                Wanted::FULL
            }
            Filter::Settings(_) => none,
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

    /// Adds the runtime's settings directories ([`Filter::Settings`]): the
    /// files they hold change as its config does (an import added), so
    /// they are looked up again each whole pass. Added only: a directory
    /// no longer read costs at most a pass when it changes.
    pub fn add_settings(&mut self, dirs: Vec<(PathBuf, Vec<String>)>) {
        for (dir, names) in dirs {
            let existing = self.targets.iter_mut().find_map(|t| match &mut t.filter {
                Filter::Settings(have) if t.dir == dir => Some(have),
                _ => None,
            });
            match existing {
                Some(have) => {
                    for n in names {
                        if !have.contains(&n) {
                            have.push(n);
                        }
                    }
                }
                None => self.targets.push(Target {
                    dir,
                    filter: Filter::Settings(names),
                    wd: None,
                    failed: None,
                }),
            }
        }
    }

    /// Arms every watch not armed yet. Called before every reconcile, so a
    /// watch lost with its directory comes back when the directory does.
    /// Returns the directories it could not arm (one may not exist yet)
    /// and why, unless reported before.
    pub fn arm(&mut self) -> Vec<(PathBuf, Errno)> {
        let mut new_failures = vec![];
        for t in self.targets.iter_mut().filter(|t| t.wd.is_none()) {
            match self.inotify.add_watch(&t.dir, mask()) {
                Ok(wd) => {
                    t.wd = Some(wd);
                    t.failed = None;
                }
                Err(errno) => {
                    if t.failed != Some(errno) {
                        new_failures.push((t.dir.clone(), errno));
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

    /// Reads every pending event; what they call for together.
    pub fn drain(&mut self) -> Wanted {
        let mut wanted = Wanted::default();
        loop {
            let events = match self.inotify.read_events() {
                Ok(ev) if !ev.is_empty() => ev,
                // EAGAIN: nothing more to read. Other errors are not expected
                // on an inotify fd; the periodic reconcile covers for them.
                _ => return wanted,
            };
            for ev in events {
                if ev.mask.contains(AddWatchFlags::IN_Q_OVERFLOW) {
                    // Events were lost, a config's among them perhaps.
                    wanted.add(Wanted {
                        chain: true,
                        full: true,
                    });
                    continue;
                }
                let gone = ev.mask.intersects(
                    AddWatchFlags::IN_IGNORED
                        | AddWatchFlags::IN_DELETE_SELF
                        | AddWatchFlags::IN_MOVE_SELF,
                );
                for t in self.targets.iter_mut().filter(|t| t.wd == Some(ev.wd)) {
                    if gone {
                        // Re-armed before the next pass, on whatever
                        // directory then has this path.
                        t.wd = None;
                        wanted.add(Wanted::FULL);
                    } else if let Some(name) = &ev.name {
                        wanted.add(t.filter.wants(&name.to_string_lossy(), ev.mask));
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

    const CHAIN: Wanted = Wanted {
        chain: true,
        full: false,
    };
    const FULL: Wanted = Wanted {
        chain: false,
        full: true,
    };
    const NONE: Wanted = Wanted {
        chain: false,
        full: false,
    };

    #[test]
    fn filters() {
        use AddWatchFlags as F;
        let f = Filter::ConfigsAnd(vec!["ZZZ-linkerd-cni-kubeconfig".into()]);
        let n = Filter::Names(vec!["linkerd-cni".into()]);
        let s = Filter::Settings(vec![
            "config.toml".into(),
            "*.toml".into(),
            "crio.conf.d".into(),
        ]);
        let conf = "10-calico.conflist";
        let kc = "ZZZ-linkerd-cni-kubeconfig";
        for (filter, name, mask, want) in [
            (&f, conf, F::IN_MOVED_TO, CHAIN),
            (&f, conf, F::IN_CLOSE_WRITE, CHAIN),
            (&f, conf, F::IN_DELETE, CHAIN),
            // Still being written: its close or its rename follows.
            (&f, conf, F::IN_MODIFY, NONE),
            (&f, conf, F::IN_CREATE, NONE),
            (&f, kc, F::IN_MOVED_TO, FULL),
            (&f, kc, F::IN_MODIFY, FULL),
            (&f, "README", F::IN_MOVED_TO, NONE),
            // Our own temp files never wake a pass, whatever the filter.
            (&f, ".linkerd-cni-tmp-1-2-3", F::IN_MOVED_TO, NONE),
            (&Filter::Any, ".linkerd-cni-tmp-1-2-3", F::IN_MOVED_TO, NONE),
            (&n, "linkerd-cni", F::IN_MOVED_TO, FULL),
            (&n, "calico", F::IN_MOVED_TO, NONE),
            // Only the conf dir's filter knows network configs.
            (&n, conf, F::IN_MOVED_TO, NONE),
            (&Filter::Any, "..data", F::IN_MOVED_TO, FULL),
            // The runtime's settings: once written, by pattern.
            (&s, "config.toml", F::IN_CLOSE_WRITE, FULL),
            (&s, "config.toml", F::IN_MODIFY, NONE),
            (&s, "10-cni.toml", F::IN_MOVED_TO, FULL),
            (&s, "10-cni.toml", F::IN_DELETE, FULL),
            (&s, "10-cni.toml.tmp", F::IN_MOVED_TO, NONE),
            (&s, "crio.conf.d", F::IN_CREATE | F::IN_ISDIR, FULL),
            (&s, "crio.conf.d", F::IN_CREATE, NONE),
            (&s, "certs", F::IN_CREATE | F::IN_ISDIR, NONE),
        ] {
            assert_eq!(filter.wants(name, mask), want, "{filter:?} {name} {mask:?}");
        }
    }

    #[test]
    fn settings_dirs_are_added_merged_and_reported_once() {
        let dir = std::env::temp_dir().join(format!("lcni-watch-s-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir(&dir).unwrap();
        let gone = dir.join("absent");
        let mut w = Watcher::new(vec![]).unwrap();
        w.add_settings(vec![(dir.clone(), vec!["config.toml".into()])]);
        // Looked up again each pass: merged, not doubled.
        w.add_settings(vec![
            (dir.clone(), vec!["config.toml".into(), "*.conf".into()]),
            (gone.clone(), vec!["x".into()]),
        ]);
        assert_eq!(w.dirs().count(), 2);
        // One that cannot be armed: said once, then left to the resync.
        let failed: Vec<PathBuf> = w.arm().into_iter().map(|(dir, _)| dir).collect();
        assert_eq!(failed, [gone]);
        assert!(w.arm().is_empty());

        std::fs::write(dir.join("other.txt"), "x").unwrap();
        assert_eq!(w.drain(), NONE);
        std::fs::write(dir.join("10-a.conf"), "x").unwrap();
        assert_eq!(w.drain(), FULL);
        std::fs::write(dir.join("config.toml"), "x").unwrap();
        assert_eq!(w.drain(), FULL);
        std::fs::remove_dir_all(&dir).unwrap();
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
        assert_eq!(w.drain(), NONE);
        std::fs::write(dir.join("10-calico.conflist"), "{}").unwrap();
        assert_eq!(w.drain(), CHAIN);
        std::fs::write(dir.join("kc"), "x").unwrap();
        assert_eq!(w.drain(), FULL);
        assert_eq!(w.drain(), NONE);
        std::fs::write(dir.join("kc"), "y").unwrap();
        std::fs::rename(dir.join("README"), dir.join("05-x.conf")).unwrap();
        assert_eq!(
            w.drain(),
            Wanted {
                chain: true,
                full: true
            }
        );

        // The directory goes away and comes back: the watch follows.
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(w.drain().full);
        std::fs::create_dir(&dir).unwrap();
        assert!(w.arm().is_empty());
        std::fs::write(dir.join("05-cilium.conflist"), "{}").unwrap();
        assert_eq!(w.drain(), CHAIN);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
