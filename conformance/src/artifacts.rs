//! The programs the tests run: the workspace's own binaries, which cargo
//! builds before any test runs (`./test.sh` runs
//! `cargo build --workspace --bins` first), and the libcni driver (Go, built
//! here, offline, once per process, under the running profile's directory,
//! e.g. `target/<host triple>/debug/cnidriver/`).
//!
//! Nothing here runs cargo: a test never builds the code it tests. A missing
//! binary fails the test with the command that builds it.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use testkit::child_path;

use crate::sys;

/// Debian's golang-github-appc-cni-dev installs libcni's source here.
pub const GOPATH: &str = "/usr/share/gocode";

/// The driver's Go source, in this crate.
fn driver_source() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("cnidriver")
}

/// The running executable's profile directory (`…/debug` or `…/release`):
/// a test executable lives in its `deps/`, the demo and the benchmarks
/// (`src/bin/`) in the directory itself. Harness-built helpers (the
/// driver, the CRI pause binary) are cached under it.
pub(crate) fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap_or_else(|e| panic!("current_exe: {e}"));
    let dir = exe
        .parent()
        .unwrap_or_else(|| panic!("no directory above {}", exe.display()));
    match dir.file_name() {
        Some(n) if n == "deps" || n == "examples" => dir.parent().unwrap_or(dir).to_path_buf(),
        _ => dir.to_path_buf(),
    }
}

/// The libcni driver, built on first use in this process.
///
/// Built every time a test process starts (Go's build cache makes that a
/// relink, well under a second) so it is never stale; written to a temp name
/// and renamed so that concurrent test processes never run a half-written
/// binary.
pub fn cnidriver() -> &'static Path {
    static BIN: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    match BIN.get_or_init(build_cnidriver) {
        Ok(p) => p,
        Err(e) => panic!("{e}"),
    }
}

fn build_cnidriver() -> Result<PathBuf, String> {
    sys::require_environment();
    let out_dir = profile_dir().join("cnidriver");
    std::fs::create_dir_all(&out_dir)
        .map_err(|e| format!("cannot create {}: {e}", out_dir.display()))?;
    let bin = out_dir.join("cnidriver");
    let tmp = out_dir.join(format!(".cnidriver-{}.tmp", testkit::names::unique_id()));
    let out = Command::new("go")
        .args(["build", "-o"])
        .arg(&tmp)
        .arg(".")
        .current_dir(driver_source())
        .env_clear()
        .env("PATH", child_path())
        .env("HOME", &out_dir)
        // GOPATH mode: libcni comes from the Debian package, nothing from
        // the network (GOPROXY=off makes any attempt fail loudly).
        .env("GO111MODULE", "off")
        .env("GOPATH", GOPATH)
        .env("GOCACHE", out_dir.join("gocache"))
        .env("GOPROXY", "off")
        .env("GOFLAGS", "")
        .env("CGO_ENABLED", "0")
        .output()
        .map_err(|e| format!("cannot run `go build` for the libcni driver: {e}"))?;
    if !out.status.success() {
        let _ = std::fs::remove_file(&tmp);
        return Err(format!(
            "building the libcni driver ({}) failed: {}{}",
            driver_source().display(),
            String::from_utf8_lossy(&out.stderr),
            String::from_utf8_lossy(&out.stdout)
        ));
    }
    std::fs::rename(&tmp, &bin).map_err(|e| format!("cannot install {}: {e}", bin.display()))?;
    Ok(bin)
}

/// Names the directory the workspace binaries are taken from, instead of
/// the running executable's profile directory.
pub const BIN_DIR_ENV: &str = "LINKERD_CNI_BIN_DIR";

/// Where the workspace binaries are: `$LINKERD_CNI_BIN_DIR` when set (the
/// demo and the benchmark run the release binaries from there), else the
/// profile directory of the running executable, where
/// `cargo build --workspace --bins` put them for the same profile and
/// target.
/// Absolute, since the harness links to the binaries from other
/// directories.
pub fn bin_dir() -> PathBuf {
    match std::env::var_os(BIN_DIR_ENV) {
        Some(d) if !d.is_empty() => std::path::absolute(&d).unwrap_or_else(|_| PathBuf::from(d)),
        _ => profile_dir(),
    }
}

/// A binary of this workspace, built before the tests started; panics with
/// what to build when it is missing.
pub fn workspace_bin(bin: &str) -> PathBuf {
    try_workspace_bin(bin).unwrap_or_else(|e| panic!("{e}"))
}

/// [`workspace_bin`], for callers that report a missing binary themselves.
pub fn try_workspace_bin(bin: &str) -> Result<PathBuf, String> {
    let path = bin_dir().join(bin);
    if path.is_file() {
        Ok(path)
    } else {
        Err(format!(
            "{} is missing: build the workspace binaries first, \
             `cargo build --workspace --bins` for the tests (./test.sh does), \
             `cargo build --release -p linkerd-cni -p linkerd-cni-agent` for the \
             demo and the benchmark (./demo.sh does), or set {BIN_DIR_ENV} to the \
             directory that holds them",
            path.display()
        ))
    }
}

/// The `linkerd-cni` plugin binary.
pub fn linkerd_cni() -> PathBuf {
    workspace_bin("linkerd-cni")
}

/// The node agent's binary, `linkerd-cni-agent`: under that name it runs
/// as the installer (the image's entrypoint).
pub fn installer() -> PathBuf {
    workspace_bin("linkerd-cni-agent")
}
