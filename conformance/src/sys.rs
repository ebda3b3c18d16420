//! Process-level plumbing: running commands with failures that say what
//! failed, and the root and package checks. The guards for network
//! namespaces and temp dirs, and their unique names, are testkit's.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

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
    cmd.env("PATH", testkit::child_path());
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
    testkit::require_root(
        "creates network namespaces, links and iptables rules inside them (conformance)",
    );
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
    testkit::names::sweep_stale();
    Ok(())
}

/// The first `name` on [`testkit::child_path`], if any.
pub fn which(name: &str) -> Option<PathBuf> {
    testkit::child_path()
        .split(':')
        .map(|d| Path::new(d).join(name))
        .find(|p| p.is_file())
}
