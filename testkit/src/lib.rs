//! Test fixtures shared by linkerd-cni's test suites (the plugin's and the
//! installer's own tests, the end-to-end conformance tests, and the demo's
//! and benchmarks' harness). Every fixture lives here, once.
//!
//! - [`api`]: [`FakeApiServer`], the Kubernetes API server stand-in over
//!   real TLS with a bearer token, for the plugin's one-shot GETs and the
//!   long-running clients alike: objects served as registered, pods,
//!   namespaces and services listed and watched (selectors, bookmarks,
//!   `410 Gone`), pods deleted, objects patched, Events and TokenRequests
//!   posted; every request logged per path and caller, and able to fail on
//!   purpose (401, 403, slow, down, 5xx, streams cut). It can listen inside
//!   a network namespace. [`WatchApiServer`] is the same server under the
//!   long-running clients' names. Behind the default feature `api` (with
//!   [`pki`]), which the installer's tests turn off.
//! - [`objects`]: JSON builders for the pods, namespaces, services and nodes
//!   the plugin reads.
//! - [`pki`]: a throwaway CA and server certificate.
//! - [`netns`]: throwaway network namespaces ([`TestNetns`]), commands and
//!   code run inside one.
//! - [`iptables`]: reading a netns' nat table (both backends, both
//!   families), and the reference rules for linkerd's defaults.
//! - [`chain`]: the chain library's fixture conf dirs and the tree and
//!   JSON comparisons repairs are judged with.
//! - [`chart`]: the entry template the shipped manifest's ConfigMap holds.
//! - [`docs`]: the reference tables of `docs/configuration.md`, which the
//!   crates owning the settings compare with their code.
//! - [`installer`]: the real installer as a child process, with the chart's
//!   environment.
//! - [`kubeconfig`]: kubeconfig text as the installer writes it.
//! - [`names`]: unique names (`lcnic-<kind>-<pid>-<n>`), [`TempDir`], and
//!   the sweep of what a killed earlier run left.
//!
//! Everything that creates something on the machine removes it on drop,
//! also when a test fails. Set-up failures panic with what failed: they are
//! broken test environments, not outcomes. Root-only fixtures fail (never
//! skip) with a message naming what is missing ([`require_root`]).

#[cfg(feature = "api")]
pub mod api;
pub mod chain;
pub mod chart;
pub mod docs;
#[cfg(feature = "api")]
mod http;
pub mod installer;
pub mod iptables;
pub mod kubeconfig;
pub mod names;
pub mod netns;
pub mod objects;
#[cfg(feature = "api")]
pub mod pki;

use std::time::{Duration, Instant};

#[cfg(feature = "api")]
pub use api::{FakeApiServer, GoneStyle, MintedToken, Mode, TokenPolicy, WatchApiServer};
pub use names::{TempDir, unique_name};
pub use netns::TestNetns;

/// Panics unless the process runs as root, naming `needs` (what the test
/// does that takes root) and how to run it. Root-only tests call it first,
/// so an unprivileged run fails with this message rather than an `EPERM`
/// from deep inside a fixture.
pub fn require_root(needs: &str) {
    if !nix::unistd::geteuid().is_root() {
        panic!(
            "this test must run as root: it {needs}. Run it as root, e.g. \
             `sudo ./test.sh` (CI runs every test as root)"
        );
    }
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

/// Polls `f` every 10 ms until it is true or `within` has passed; whether
/// it became true. For waiting on another process's effect, never as a
/// timed assertion.
pub fn wait_until(within: Duration, mut f: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + within;
    loop {
        if f() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A TCP connection to `to` from the local address `source` (any of
/// 127.0.0.0/8 works on loopback): for servers that tell peers apart by
/// address.
pub fn connect_from(
    source: std::net::IpAddr,
    to: std::net::SocketAddr,
) -> std::io::Result<std::net::TcpStream> {
    use nix::sys::socket::{
        AddressFamily, SockFlag, SockType, SockaddrStorage, bind, connect, socket,
    };
    let family = if source.is_ipv4() {
        AddressFamily::Inet
    } else {
        AddressFamily::Inet6
    };
    let fd = socket(family, SockType::Stream, SockFlag::SOCK_CLOEXEC, None)?;
    bind(
        std::os::fd::AsRawFd::as_raw_fd(&fd),
        &SockaddrStorage::from(std::net::SocketAddr::new(source, 0)),
    )?;
    connect(
        std::os::fd::AsRawFd::as_raw_fd(&fd),
        &SockaddrStorage::from(to),
    )?;
    Ok(std::net::TcpStream::from(fd))
}

/// A FIFO at `path` (mode 0600), where a regular file is expected: a
/// plain open of it blocks until a writer comes.
pub fn mkfifo(path: &std::path::Path) {
    nix::unistd::mkfifo(path, nix::sys::stat::Mode::from_bits_truncate(0o600))
        .unwrap_or_else(|e| panic!("mkfifo {}: {e}", path.display()));
}

/// Runs `cmd` to completion with stdout and stderr to files (a pipe could
/// fill up while nobody reads it): its output, or `None` when it was still
/// running after `limit` (then killed). For inputs that must not make a
/// binary block.
pub fn output_within(
    cmd: &mut std::process::Command,
    limit: Duration,
) -> Option<std::process::Output> {
    let dir = TempDir::new("output-within").expect("temp dir");
    let (out, err) = (dir.path().join("out"), dir.path().join("err"));
    let mut child = cmd
        .stdout(std::fs::File::create(&out).expect("create stdout file"))
        .stderr(std::fs::File::create(&err).expect("create stderr file"))
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {cmd:?}: {e}"));
    let mut status = None;
    wait_until(limit, || {
        status = child.try_wait().expect("wait for the child");
        status.is_some()
    });
    let Some(status) = status else {
        let _ = child.kill();
        let _ = child.wait();
        return None;
    };
    Some(std::process::Output {
        status,
        stdout: std::fs::read(out).expect("read stdout"),
        stderr: std::fs::read(err).expect("read stderr"),
    })
}

/// Runs `f` on a thread of its own: its result, or a panic naming `what`
/// when it has not returned within `within` (for calls that must not block
/// forever, such as opening a FIFO; the blocked thread is left behind).
pub fn bounded<T: Send + 'static>(
    what: &str,
    within: Duration,
    f: impl FnOnce() -> T + Send + 'static,
) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(within)
        .unwrap_or_else(|_| panic!("{what}: still blocked after {within:?}"))
}

/// A `flock` held by another uid; released (the holder killed) on drop.
pub struct ForeignFlock(std::process::Child);

impl Drop for ForeignFlock {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Runs `flock -x <path> sleep 600` as uid 65534 (nobody), as any local
/// account (or a container with a read-only mount of the path) can; the
/// holder once it holds the lock, or `None` when it could not take it (it
/// could not open `path`). `path` and its parents must be searchable by
/// others.
pub fn flock_as_nobody(path: &std::path::Path) -> Option<ForeignFlock> {
    let child = std::process::Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .args(["flock", "-x"])
        .arg(path)
        .args(["sleep", "600"])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("setpriv and flock (util-linux) run");
    let mut held = ForeignFlock(child);
    let settled = wait_until(Duration::from_secs(20), || {
        held.0.try_wait().ok().flatten().is_some()
            || std::fs::File::open(path).is_ok_and(|f| f.try_lock_shared().is_err())
    });
    assert!(
        settled,
        "flock as nobody neither held {} nor exited",
        path.display()
    );
    match held.0.try_wait() {
        Ok(Some(_)) => None,
        _ => Some(held),
    }
}
