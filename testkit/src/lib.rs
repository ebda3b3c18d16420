//! Test fixtures shared by linkerd-cni's test suites (the plugin's own tests
//! and the end-to-end conformance tests). A dev-dependency only.
//!
//! - [`api`]: [`FakeApiServer`], a Kubernetes API server stand-in over real
//!   TLS with a bearer token, serving the pods, namespaces and services a
//!   test registers, counting requests, and able to fail on purpose (401,
//!   slow, down, 5xx). It can listen inside a network namespace.
//! - [`api_watch`]: [`WatchApiServer`], a stateful one for long-running
//!   clients: pods listed and watched with selectors, bookmarks and
//!   `410 Gone`, deleted; Events posted; nodes patched; streams cut on
//!   purpose.
//! - [`objects`]: JSON builders for the pods, namespaces and services the
//!   plugin reads.
//! - [`pki`]: a throwaway CA and server certificate.
//! - [`netns`]: throwaway network namespaces ([`TestNetns`]) and running
//!   code inside one; [`NamedNetns`] lets the helpers here work on other
//!   harnesses' namespaces (the conformance tests keep their own guard).
//! - [`iptables`]: reading a netns' nat table for comparisons, and the
//!   reference rules for linkerd's defaults.
//! - [`TempDir`] and [`unique_name`]: unique, self-cleaning names, because
//!   other suites run at the same time on the same machine.
//!
//! Everything that creates something on the machine removes it on drop,
//! also when a test fails.

pub mod api;
pub mod api_watch;
pub mod iptables;
pub mod netns;
pub mod objects;
pub mod pki;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

pub use api::{FakeApiServer, Mode};
pub use api_watch::WatchApiServer;
pub use netns::{NamedNetns, TestNetns};

/// `prefix-<pid>-<n>`: unique on the machine for the life of this process.
pub fn unique_name(prefix: &str) -> String {
    static COUNTER: AtomicUsize = AtomicUsize::new(0);
    format!(
        "{prefix}-{}-{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    )
}

/// A uniquely named directory under the system temp dir, removed on drop.
#[derive(Debug)]
pub struct TempDir {
    path: PathBuf,
}

impl TempDir {
    pub fn new(prefix: &str) -> std::io::Result<TempDir> {
        let path = std::env::temp_dir().join(unique_name(prefix));
        std::fs::create_dir_all(&path)?;
        Ok(TempDir { path })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// Polls `f` until it returns true or `within` has passed; its last answer.
/// For waiting on an effect another thread or process produces, with a
/// generous deadline instead of a fixed sleep.
pub fn wait_until(within: Duration, mut f: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + within;
    loop {
        if f() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}
