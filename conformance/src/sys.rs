//! Process-level plumbing: unique names, running commands with failures that
//! say what failed, the root and package checks, and the Drop guards for
//! network namespaces and temp dirs.
//!
//! Every name this harness creates starts with [`PREFIX`] and carries the
//! creating process's pid, so parallel tests (and parallel test runs of other
//! worktrees on the same machine) never collide, and leftovers of a killed
//! run can be recognised and removed.

use std::ffi::OsStr;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

/// Start of every netns and temp dir name this harness creates.
pub const PREFIX: &str = "lcnic-";

/// Where `ip netns add` puts its bind mounts.
const NETNS_DIR: &str = "/run/netns";

static COUNTER: AtomicU64 = AtomicU64::new(0);

/// `<pid>-<n>`, unique on this machine while this process lives.
pub fn unique_id() -> String {
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

/// PATH for every child: the caller's, plus the sbin directories where
/// Debian puts `ip` and the iptables tools (not in every root PATH).
pub fn child_path() -> String {
    let mut path = std::env::var("PATH").unwrap_or_default();
    for dir in ["/usr/local/sbin", "/usr/sbin", "/sbin", "/usr/bin", "/bin"] {
        if !path.split(':').any(|p| p == dir) {
            if !path.is_empty() {
                path.push(':');
            }
            path.push_str(dir);
        }
    }
    path
}

fn describe(cmd: &Command) -> String {
    let mut s = cmd.get_program().to_string_lossy().into_owned();
    for a in cmd.get_args() {
        s.push(' ');
        s.push_str(&a.to_string_lossy());
    }
    s
}

/// Runs `cmd` to completion; panics only when it cannot be started.
pub fn output(cmd: &mut Command) -> Output {
    cmd.env("PATH", child_path());
    cmd.output()
        .unwrap_or_else(|e| panic!("cannot run `{}`: {e}", describe(cmd)))
}

/// Runs `cmd` and returns its stdout; panics with its stderr when it fails.
/// For harness set-up steps, whose failure is a broken test environment.
pub fn checked(cmd: &mut Command) -> String {
    let out = output(cmd);
    if !out.status.success() {
        panic!(
            "`{}` failed ({}): {}{}",
            describe(cmd),
            out.status,
            String::from_utf8_lossy(&out.stderr),
            String::from_utf8_lossy(&out.stdout),
        );
    }
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// What the tests need from the machine, checked once per process. Fails the
/// test (never skips it) with what is missing and how to get it.
pub fn require_environment() {
    static CHECKED: OnceLock<Result<(), String>> = OnceLock::new();
    if let Err(e) = CHECKED.get_or_init(check_environment) {
        panic!("{e}");
    }
}

fn check_environment() -> Result<(), String> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return Err(
            "the conformance tests must run as root: they create network namespaces, \
             links and iptables rules inside them. Run ./test.sh as root (CI does)."
                .into(),
        );
    }
    let mut missing = Vec::new();
    for tool in [
        "ip",
        "iptables-legacy-save",
        "iptables-nft-save",
        "ip6tables-legacy-save",
        "ip6tables-nft-save",
        "go",
    ] {
        if which(tool).is_none() {
            missing.push(tool.to_string());
        }
    }
    for plugin in crate::node::REFERENCE_PLUGINS {
        let p = Path::new(crate::node::REFERENCE_PLUGIN_DIR).join(plugin);
        if !p.exists() {
            missing.push(p.display().to_string());
        }
    }
    let libcni = Path::new(crate::artifacts::GOPATH)
        .join("src/github.com/containernetworking/cni/libcni/api.go");
    if !libcni.exists() {
        missing.push(libcni.display().to_string());
    }
    if !missing.is_empty() {
        return Err(format!(
            "the conformance tests need {}: run `bash scripts/setup.sh` as root (./test.sh does) \
             to install iptables, iproute2, containernetworking-plugins, golang-go and \
             golang-github-appc-cni-dev",
            missing.join(", ")
        ));
    }
    sweep_leftovers();
    Ok(())
}

/// The first `name` on [`child_path`], if any.
pub fn which(name: &str) -> Option<PathBuf> {
    child_path()
        .split(':')
        .map(|d| Path::new(d).join(name))
        .find(|p| p.is_file())
}

/// Removes netns and temp dirs that a killed earlier run of this harness
/// left behind (their pid is gone). Drop guards cover panics; nothing covers
/// SIGKILL, and stale namespaces would pile up on a developer's machine.
fn sweep_leftovers() {
    let me = std::process::id();
    remove_named(|pid| pid != me && !Path::new(&format!("/proc/{pid}")).exists());
}

/// Deletes the network namespaces and temp dirs this harness named for a
/// process `owner` selects (see [`owner_pid`]), and returns what it deleted:
/// namespace names, then temp dir paths.
pub fn remove_named(owner: impl Fn(u32) -> bool) -> Vec<String> {
    let mut removed = Vec::new();
    let mine = |name: &str| owner_pid(name).is_some_and(&owner);
    if let Ok(entries) = std::fs::read_dir(NETNS_DIR) {
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if mine(&name) {
                let _ = output(Command::new("ip").args(["netns", "del", &name]));
                removed.push(format!("netns {name}"));
            }
        }
    }
    if let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) {
        for e in entries.flatten() {
            if mine(&e.file_name().to_string_lossy()) {
                let _ = std::fs::remove_dir_all(e.path());
                removed.push(e.path().display().to_string());
            }
        }
    }
    removed
}

/// A network namespace made with `ip netns add`, deleted on drop (also when
/// the test panics).
#[derive(Debug)]
pub struct Netns {
    name: String,
    path: PathBuf,
    removed: bool,
}

impl Netns {
    /// A new namespace `lcnic-<kind>-<pid>-<n>` with its loopback up.
    pub fn create(kind: &str) -> Netns {
        let name = unique_name(kind);
        checked(Command::new("ip").args(["netns", "add", &name]));
        // The guard exists from here on, so a failing step below cleans up.
        let ns = Netns {
            path: Path::new(NETNS_DIR).join(&name),
            name,
            removed: false,
        };
        checked(Command::new("ip").args(["-n", &ns.name, "link", "set", "lo", "up"]));
        ns
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The path runtimes pass as `CNI_NETNS`. Stays valid as a string after
    /// [`Netns::remove`], for tests of a DEL after the netns is gone.
    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn exists(&self) -> bool {
        self.path.exists()
    }

    /// `program` run inside this namespace (`ip netns exec`).
    pub fn command(&self, program: impl AsRef<OsStr>) -> Command {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.name]).arg(program);
        cmd
    }

    /// Deletes the namespace now, as a runtime does when a pod sandbox goes
    /// away before its DEL.
    pub fn remove(&mut self) {
        if !self.removed {
            checked(Command::new("ip").args(["netns", "del", &self.name]));
            self.removed = true;
        }
    }

    /// Runs `f` on a thread that has entered this namespace (`setns`), and
    /// returns its result. Sockets created inside keep the namespace for
    /// their whole life, whichever thread uses them later, and threads
    /// spawned inside start in it: the way to run a server (e.g. the fake
    /// Kubernetes API) that plugins running in this namespace can reach.
    pub fn enter<T: Send>(&self, f: impl FnOnce() -> T + Send) -> T {
        std::thread::scope(|s| {
            let handle = s.spawn(|| {
                let ns = File::open(&self.path)
                    .unwrap_or_else(|e| panic!("cannot open {}: {e}", self.path.display()));
                // SAFETY: setns on a valid, open namespace fd; it changes only
                // the calling thread, which is ours and ends after `f`.
                let rc = unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) };
                if rc != 0 {
                    panic!(
                        "setns into {}: {}",
                        self.path.display(),
                        std::io::Error::last_os_error()
                    );
                }
                f()
            });
            match handle.join() {
                Ok(v) => v,
                Err(panic) => std::panic::resume_unwind(panic),
            }
        })
    }
}

/// So testkit's iptables readers and helpers work on this harness's
/// namespaces as on its own.
impl testkit::NamedNetns for Netns {
    fn netns_name(&self) -> &str {
        &self.name
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        if self.removed {
            return;
        }
        let out = output(Command::new("ip").args(["netns", "del", &self.name]));
        if !out.status.success() && self.path.exists() {
            // Never panic in drop (it may run during a panic): say it.
            eprintln!(
                "conformance: could not delete netns {}: {}",
                self.name,
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
}

/// A private directory under the system temp dir, removed on drop.
#[derive(Debug)]
pub struct TempDir {
    path: PathBuf,
}

impl TempDir {
    pub fn create(kind: &str) -> TempDir {
        let path = std::env::temp_dir().join(unique_name(kind));
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&path)
            .unwrap_or_else(|e| panic!("cannot create {}: {e}", path.display()));
        TempDir { path }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        if let Err(e) = std::fs::remove_dir_all(&self.path)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            eprintln!("conformance: could not remove {}: {e}", self.path.display());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owner_pid_reads_harness_names() {
        assert_eq!(owner_pid("lcnic-node-1234-7"), Some(1234));
        assert_eq!(owner_pid("lcnic-pod-99-0"), Some(99));
        assert_eq!(owner_pid(&unique_name("x")), Some(std::process::id()));
        assert_eq!(owner_pid("lcnic-1234-7"), None);
        assert_eq!(owner_pid("lcnic-node-x-7"), None);
        assert_eq!(owner_pid("other-node-1234-7"), None);
        assert_eq!(owner_pid("lcnic-node-1234-"), None);
    }
}
