//! Throwaway network namespaces made with `ip netns add` (so they have a
//! path under /run/netns, as a runtime's CNI_NETNS does), with loopback up,
//! deleted on drop.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use nix::sched::{CloneFlags, setns};

/// A named network namespace, deleted on drop.
#[derive(Debug)]
pub struct TestNetns {
    name: String,
    path: PathBuf,
}

impl TestNetns {
    /// Creates `<prefix>-<pid>-<n>` with its loopback up. Needs root.
    pub fn new(prefix: &str) -> std::io::Result<TestNetns> {
        let name = crate::unique_name(prefix);
        ip(&["netns", "add", &name])?;
        let ns = TestNetns {
            path: PathBuf::from("/run/netns").join(&name),
            name,
        };
        // Dropped (and deleted) if this fails.
        ip(&["-n", &ns.name, "link", "set", "lo", "up"])?;
        Ok(ns)
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// `/run/netns/<name>`: what a runtime passes as CNI_NETNS.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Runs `argv` inside the namespace (`ip netns exec`), e.g. to look at
    /// its iptables rules; panics if it cannot be started.
    pub fn exec(&self, argv: &[&str]) -> Output {
        exec(self, argv)
    }

    /// Runs `argv` inside the namespace and returns its stdout; panics with
    /// its stderr when it fails.
    pub fn exec_ok(&self, argv: &[&str]) -> String {
        exec_ok(self, argv)
    }
}

/// A namespace `ip netns` knows by name. The readers and helpers of this
/// crate take any of them, so the conformance harness, whose namespace
/// guard has duties of its own (sweeping what a killed run left, deleting a
/// pod's netns before its DEL), uses them on its namespaces too.
pub trait NamedNetns {
    fn netns_name(&self) -> &str;
}

impl NamedNetns for TestNetns {
    fn netns_name(&self) -> &str {
        &self.name
    }
}

/// Runs `argv` inside `ns` (`ip netns exec`); panics if it cannot be started.
pub fn exec(ns: &(impl NamedNetns + ?Sized), argv: &[&str]) -> Output {
    let name = ns.netns_name();
    Command::new("ip")
        .args(["netns", "exec", name])
        .args(argv)
        .output()
        .unwrap_or_else(|e| panic!("ip netns exec {name} {argv:?}: {e}"))
}

/// Runs `argv` inside `ns` and returns its stdout; panics with its stderr
/// when it fails.
pub fn exec_ok(ns: &(impl NamedNetns + ?Sized), argv: &[&str]) -> String {
    let o = exec(ns, argv);
    assert!(
        o.status.success(),
        "{argv:?} in netns {} failed: {}",
        ns.netns_name(),
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

impl Drop for TestNetns {
    fn drop(&mut self) {
        let _ = ip(&["netns", "del", &self.name]);
    }
}

fn ip(args: &[&str]) -> std::io::Result<()> {
    let o = Command::new("ip").args(args).output()?;
    if o.status.success() {
        Ok(())
    } else {
        Err(std::io::Error::other(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&o.stderr).trim()
        )))
    }
}

/// Runs `f` on a new thread that has entered the network namespace at
/// `path`; sockets it creates (and threads it spawns) belong to that
/// namespace.
pub fn run_in<T: Send>(path: &Path, f: impl FnOnce() -> T + Send) -> std::io::Result<T> {
    run_in_file(std::fs::File::open(path)?, f)
}

/// Like [`run_in`], with the namespace given as an open file (which keeps
/// it alive, whether or not its name still exists).
pub fn run_in_file<T: Send>(ns: File, f: impl FnOnce() -> T + Send) -> std::io::Result<T> {
    std::thread::scope(|s| {
        s.spawn(move || {
            setns(&ns, CloneFlags::CLONE_NEWNET).map_err(std::io::Error::from)?;
            Ok(f())
        })
        .join()
        .unwrap_or_else(|_| Err(std::io::Error::other("thread in netns panicked")))
    })
}

/// Like [`run_in_file`], but the thread keeps running `f` in the background.
pub(crate) fn spawn_in(
    ns: File,
    f: impl FnOnce() + Send + 'static,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    let (tx, rx) = std::sync::mpsc::channel();
    let handle = std::thread::spawn(move || match setns(&ns, CloneFlags::CLONE_NEWNET) {
        Ok(()) => {
            let _ = tx.send(Ok(()));
            f();
        }
        Err(e) => {
            let _ = tx.send(Err(std::io::Error::from(e)));
        }
    });
    rx.recv()
        .unwrap_or_else(|_| Err(std::io::Error::other("netns thread died")))?;
    Ok(handle)
}
