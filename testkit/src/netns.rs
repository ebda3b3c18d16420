//! Throwaway network namespaces made with `ip netns add` (so they have a
//! path under /run/netns, as a runtime's CNI_NETNS does), with loopback up,
//! deleted on drop; commands and code run inside one.

use std::ffi::OsStr;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use nix::sched::{CloneFlags, setns};

use crate::names::{NETNS_DIR, sweep_stale, unique_name};

/// A named network namespace, deleted on drop (also when the test panics).
#[derive(Debug)]
pub struct TestNetns {
    name: String,
    path: PathBuf,
    removed: bool,
}

impl TestNetns {
    /// Creates `lcnic-<kind>-<pid>-<n>` with its loopback up. Panics when
    /// not root, saying so.
    pub fn new(kind: &str) -> std::io::Result<TestNetns> {
        crate::require_root("creates network namespaces (`ip netns add`)");
        sweep_stale();
        let name = unique_name(kind);
        ip(&["netns", "add", &name])?;
        let ns = TestNetns {
            path: Path::new(NETNS_DIR).join(&name),
            name,
            removed: false,
        };
        // Dropped (and deleted) if this fails.
        ip(&["-n", &ns.name, "link", "set", "lo", "up"])?;
        Ok(ns)
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// `/run/netns/<name>`: what a runtime passes as CNI_NETNS. Stays valid
    /// as a string after [`TestNetns::remove`], for a DEL after the netns
    /// is gone.
    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn exists(&self) -> bool {
        self.path.exists()
    }

    /// `program` to run inside this namespace (`ip netns exec`).
    pub fn command(&self, program: impl AsRef<OsStr>) -> Command {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.name])
            .arg(program)
            .env("PATH", crate::child_path());
        cmd
    }

    /// Runs `argv` inside the namespace, e.g. to look at its iptables
    /// rules; panics if it cannot be started.
    pub fn exec(&self, argv: &[&str]) -> Output {
        let (program, args) = argv.split_first().expect("a program to run");
        self.command(program)
            .args(args)
            .output()
            .unwrap_or_else(|e| panic!("ip netns exec {} {argv:?}: {e}", self.name))
    }

    /// Runs `argv` inside the namespace and returns its stdout; panics with
    /// its stderr when it fails.
    pub fn exec_ok(&self, argv: &[&str]) -> String {
        let o = self.exec(argv);
        assert!(
            o.status.success(),
            "{argv:?} in netns {} failed: {}",
            self.name,
            String::from_utf8_lossy(&o.stderr)
        );
        String::from_utf8_lossy(&o.stdout).into_owned()
    }

    /// Deletes the namespace now, as a runtime does when a pod sandbox goes
    /// away before its DEL.
    pub fn remove(&mut self) -> std::io::Result<()> {
        if !self.removed {
            ip(&["netns", "del", &self.name])?;
            self.removed = true;
        }
        Ok(())
    }

    /// Runs `f` on a thread that has entered this namespace and returns its
    /// result; see [`run_in`].
    pub fn enter<T: Send>(&self, f: impl FnOnce() -> T + Send) -> T {
        run_in(&self.path, f).unwrap_or_else(|e| panic!("cannot enter netns {}: {e}", self.name))
    }
}

impl Drop for TestNetns {
    fn drop(&mut self) {
        if self.removed {
            return;
        }
        if let Err(e) = ip(&["netns", "del", &self.name])
            && self.path.exists()
        {
            // Never panic in drop (it may run during a panic): say it.
            eprintln!("testkit: {e}");
        }
    }
}

fn ip(args: &[&str]) -> std::io::Result<()> {
    let o = Command::new("ip")
        .args(args)
        .env("PATH", crate::child_path())
        .output()?;
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
/// `path`, and returns its result; a panic in `f` goes on in the caller.
/// Sockets created inside keep the namespace for their whole life, whichever
/// thread uses them later, and threads spawned inside start in it: the way
/// to run a server that plugins running in that namespace can reach.
pub fn run_in<T: Send>(path: &Path, f: impl FnOnce() -> T + Send) -> std::io::Result<T> {
    run_in_file(std::fs::File::open(path)?, f)
}

/// Like [`run_in`], with the namespace given as an open file (which keeps
/// it alive, whether or not its name still exists).
pub fn run_in_file<T: Send>(ns: File, f: impl FnOnce() -> T + Send) -> std::io::Result<T> {
    std::thread::scope(|s| {
        match s
            .spawn(move || {
                setns(&ns, CloneFlags::CLONE_NEWNET).map_err(std::io::Error::from)?;
                Ok(f())
            })
            .join()
        {
            Ok(r) => r,
            Err(panic) => std::panic::resume_unwind(panic),
        }
    })
}

/// Like [`run_in_file`], but the thread keeps running `f` in the background.
#[cfg(feature = "api")]
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

#[cfg(test)]
mod tests {
    use super::*;

    const CHILD: &str = "TESTKIT_UNPRIVILEGED_CHILD";

    /// A root-only fixture run without root fails (never skips), and its
    /// message names what needs root and how to run the tests. Checked by
    /// running this very test again as `nobody`.
    #[test]
    fn root_only_fixture_fails_unprivileged_saying_so() {
        if std::env::var_os(CHILD).is_some() {
            let _ = TestNetns::new("unprivileged");
            return;
        }
        crate::require_root("re-runs itself as nobody (setpriv)");
        let exe = std::env::current_exe().expect("own executable");
        let out = Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
            .arg(&exe)
            .args([
                "--exact",
                "netns::tests::root_only_fixture_fails_unprivileged_saying_so",
            ])
            .env(CHILD, "1")
            .output()
            .expect("run setpriv");
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(!out.status.success(), "passed without root:\n{text}");
        assert!(
            text.contains("this test must run as root: it creates network namespaces")
                && text.contains("sudo ./test.sh"),
            "{text}"
        );
    }
}
