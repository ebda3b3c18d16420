//! Unique names and self-cleaning temp dirs.
//!
//! Every network namespace and temp dir a fixture creates is named
//! `lcnic-<kind>-<pid>-<n>` after the creating process, so parallel tests
//! (and the test runs of other work trees on the same machine) never
//! collide, and what a killed run left can be told apart and removed
//! ([`sweep_stale`]): Drop guards cover panics, nothing covers SIGKILL.

use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Once;
use std::sync::atomic::{AtomicU64, Ordering};

/// Start of every netns and temp dir name the fixtures create.
pub const PREFIX: &str = "lcnic-";

/// Where `ip netns add` puts its bind mounts.
pub const NETNS_DIR: &str = "/run/netns";

/// `<pid>-<n>`, unique on this machine while this process lives.
pub fn unique_id() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    format!(
        "{}-{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    )
}

/// A name `lcnic-<kind>-<pid>-<n>`.
pub fn unique_name(kind: &str) -> String {
    format!("{PREFIX}{kind}-{}", unique_id())
}

/// The pid in a name made by [`unique_name`], or None for any other name.
pub fn owner_pid(name: &str) -> Option<u32> {
    let rest = name.strip_prefix(PREFIX)?;
    let mut parts = rest.rsplitn(3, '-');
    let n = parts.next()?;
    let pid = parts.next()?;
    let kind = parts.next()?;
    if kind.is_empty() || n.is_empty() || !n.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    pid.parse().ok()
}

/// Deletes the network namespaces and temp dirs named (see [`owner_pid`])
/// for a process that `owner` selects, and returns what it deleted.
pub fn remove_named(owner: impl Fn(u32) -> bool) -> Vec<String> {
    let mut removed = Vec::new();
    let ours = |name: &str| owner_pid(name).is_some_and(&owner);
    for e in std::fs::read_dir(NETNS_DIR).into_iter().flatten().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if ours(&name) {
            let _ = Command::new("ip").args(["netns", "del", &name]).output();
            removed.push(format!("netns {name}"));
        }
    }
    for e in [std::env::temp_dir(), PathBuf::from(MEMORY_DIR)]
        .iter()
        .flat_map(std::fs::read_dir)
        .flatten()
        .flatten()
    {
        if ours(&e.file_name().to_string_lossy()) {
            let _ = std::fs::remove_dir_all(e.path());
            removed.push(e.path().display().to_string());
        }
    }
    removed
}

/// Removes, once per process, the namespaces and temp dirs of processes
/// that no longer exist.
pub fn sweep_stale() {
    static SWEPT: Once = Once::new();
    SWEPT.call_once(|| {
        let me = std::process::id();
        remove_named(|pid| pid != me && !Path::new(&format!("/proc/{pid}")).exists());
    });
}

/// A private (0700) directory `lcnic-<kind>-<pid>-<n>` under the system
/// temp dir, removed on drop.
#[derive(Debug)]
pub struct TempDir {
    path: PathBuf,
}

/// A memory file system (tmpfs) most Linux systems have.
const MEMORY_DIR: &str = "/dev/shm";

impl TempDir {
    /// Creates it.
    pub fn new(kind: &str) -> std::io::Result<TempDir> {
        Self::new_under(&std::env::temp_dir(), kind)
    }

    /// Creates it in memory (tmpfs) where the system has one, else as
    /// [`TempDir::new`]: for a test about how soon a process reacts, in
    /// which a shared disk's flush latency (an fsync under other builds'
    /// load takes tens of milliseconds) would only be noise.
    pub fn in_memory(kind: &str) -> std::io::Result<TempDir> {
        match Path::new(MEMORY_DIR).is_dir() {
            true => Self::new_under(Path::new(MEMORY_DIR), kind),
            false => Self::new(kind),
        }
    }

    fn new_under(base: &Path, kind: &str) -> std::io::Result<TempDir> {
        sweep_stale();
        let path = base.join(unique_name(kind));
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&path)
            .map_err(|e| std::io::Error::new(e.kind(), format!("{}: {e}", path.display())))?;
        Ok(TempDir { path })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn join(&self, name: impl AsRef<Path>) -> PathBuf {
        self.path.join(name)
    }

    /// Writes `text` to `name` in the dir; its path.
    pub fn write(&self, name: &str, text: &str) -> PathBuf {
        let p = self.join(name);
        std::fs::write(&p, text).unwrap_or_else(|e| panic!("cannot write {}: {e}", p.display()));
        p
    }

    /// The text of `name` in the dir.
    pub fn read(&self, name: &str) -> String {
        let p = self.join(name);
        std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("cannot read {}: {e}", p.display()))
    }

    /// The names directly in the dir, sorted.
    pub fn names(&self) -> Vec<String> {
        file_names(&self.path)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        if let Err(e) = std::fs::remove_dir_all(&self.path)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            // Never panic in drop (it may run during a panic): say it.
            eprintln!("testkit: could not remove {}: {e}", self.path.display());
        }
    }
}

/// The conf dir's lock file (`linkerd_cni_chain::LOCK_FILE`), which stays
/// in a conf dir once any repair locked it: not part of what a test judges
/// (the tests of the lock and of uninstall look for it by name).
pub const LOCK_FILE: &str = ".linkerd-cni-lock";

/// The names directly in `dir`, sorted, but the lock file; panics when it
/// cannot be read.
pub fn file_names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("cannot list {}: {e}", dir.display()))
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n != LOCK_FILE)
        .collect();
    v.sort();
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owner_pid_reads_our_names_only() {
        assert_eq!(owner_pid("lcnic-node-1234-7"), Some(1234));
        assert_eq!(owner_pid("lcnic-pod-x-99-0"), Some(99));
        assert_eq!(owner_pid(&unique_name("x")), Some(std::process::id()));
        assert_eq!(owner_pid("lcnic-1234-7"), None);
        assert_eq!(owner_pid("lcnic-node-x-7"), None);
        assert_eq!(owner_pid("other-node-1234-7"), None);
        assert_eq!(owner_pid("lcnic-node-1234-"), None);
    }

    #[test]
    fn temp_dir_is_private_and_removed() {
        use std::os::unix::fs::PermissionsExt;
        let d = TempDir::new("names-test").unwrap();
        let p = d.path().to_path_buf();
        assert_eq!(
            std::fs::metadata(&p).unwrap().permissions().mode() & 0o777,
            0o700
        );
        d.write("a", "x");
        assert_eq!(d.names(), ["a"]);
        assert_eq!(d.read("a"), "x");
        drop(d);
        assert!(!p.exists());
    }
}
