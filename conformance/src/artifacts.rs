//! The programs the tests run: the libcni driver (Go, built here, offline)
//! and the workspace's own binaries (built by cargo).
//!
//! Both are built once per test process and cached under the cargo target
//! directory of the running test profile, e.g.
//! `target/x86_64-unknown-linux-gnu/debug/cnidriver/`.
//!
//! Workspace binaries are built by running `cargo build -p <package> --bin
//! <bin>` for the test's own profile rather than by trusting that an earlier
//! step built them: `cargo test -p conformance` alone does not build the
//! plugin's binary, and a binary left over from an older build would test old
//! code without a word. Cargo releases its build lock before it runs test
//! binaries, so the nested build is possible; after `cargo test --workspace`
//! has built everything it is a no-op (about 0.1 s).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Mutex, OnceLock};

use serde_json::Value;

use crate::sys::{self, child_path};

/// Debian's golang-github-appc-cni-dev installs libcni's source here.
pub const GOPATH: &str = "/usr/share/gocode";

/// The driver's Go source, in this crate.
fn driver_source() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("cnidriver")
}

fn workspace_root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap_or(Path::new("."))
}

/// The running executable's profile directory (`…/debug` or `…/release`):
/// a test executable lives in its `deps/`, the demo and the benchmarks
/// (`src/bin/`) in the directory itself.
fn profile_dir() -> PathBuf {
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
    let tmp = out_dir.join(format!(".cnidriver-{}.tmp", sys::unique_id()));
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

/// A binary of this workspace, freshly built for the running profile.
pub fn workspace_bin(package: &str, bin: &str) -> PathBuf {
    try_workspace_bin(package, bin).unwrap_or_else(|e| panic!("{e}"))
}

/// [`workspace_bin`], for callers that report a failed build themselves.
pub fn try_workspace_bin(package: &str, bin: &str) -> Result<PathBuf, String> {
    static BUILT: Mutex<Vec<(String, Result<PathBuf, String>)>> = Mutex::new(Vec::new());
    let mut built = BUILT.lock().unwrap_or_else(|e| e.into_inner());
    let key = format!("{package}/{bin}");
    match built.iter().find(|(k, _)| *k == key) {
        Some((_, r)) => r.clone(),
        None => {
            let r = cargo_build(package, bin);
            built.push((key, r.clone()));
            r
        }
    }
}

/// The `linkerd-cni` plugin binary.
pub fn linkerd_cni() -> PathBuf {
    workspace_bin("linkerd-cni", "linkerd-cni")
}

fn cargo_build(package: &str, bin: &str) -> Result<PathBuf, String> {
    let profile_dir = profile_dir();
    let profile = match profile_dir.file_name().and_then(|n| n.to_str()) {
        Some("debug") => "dev".to_string(),
        Some(other) => other.to_string(),
        None => return Err(format!("odd profile dir {}", profile_dir.display())),
    };
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(cargo);
    // Cargo runs tests with the variables it sets for the crate under test
    // (CARGO_MANIFEST_DIR, CARGO_PKG_*...). Passed on, they reach build
    // scripts that rerun when one changes (ring's does), and the nested build
    // would rebuild ring and everything above it, and the next outer build
    // again: seconds per test process. The nested build gets the caller's
    // environment as a shell would have it.
    for (k, _) in std::env::vars_os() {
        let Some(k) = k.to_str() else { continue };
        if k.starts_with("CARGO_PKG_")
            || matches!(
                k,
                "CARGO_MANIFEST_DIR"
                    | "CARGO_MANIFEST_PATH"
                    | "CARGO_CRATE_NAME"
                    | "CARGO_BIN_NAME"
                    | "CARGO_PRIMARY_PACKAGE"
                    | "CARGO_TARGET_TMPDIR"
                    | "OUT_DIR"
            )
        {
            cmd.env_remove(k);
        }
    }
    let out = cmd
        .args(["build", "--message-format=json-render-diagnostics"])
        .args(["-p", package, "--bin", bin, "--profile", &profile])
        .current_dir(workspace_root())
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run cargo to build {bin}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "cargo build -p {package} --bin {bin} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    // Cargo names the executable it produced; no guessing of target dirs.
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|m| m["reason"] == "compiler-artifact" && m["target"]["name"] == bin)
        .find_map(|m| m["executable"].as_str().map(PathBuf::from))
        .ok_or_else(|| format!("cargo built no executable named {bin}"))
}
