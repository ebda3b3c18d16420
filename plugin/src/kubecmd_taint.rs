//! `linkerd-cni kube remove-taint`: the installer's way to remove its
//! node's startup taint without linking an HTTP client itself. The exit
//! code is the answer, so the installer can act on it without parsing
//! text (the binary's usage lists them).

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use linkerd_cni::logging;
use linkerd_cni_kube::taint::{self, FailureKind};

/// Exit codes.
pub const EXIT_TRANSIENT: u8 = 1;
pub const EXIT_ERROR: u8 = 2;
pub const EXIT_FORBIDDEN: u8 = 3;
pub const EXIT_UNAUTHORIZED: u8 = 4;

const MAX_TIMEOUT_SECONDS: f64 = 300.0;

/// `args` follow `kube remove-taint`.
pub fn main(args: &[&str]) -> ExitCode {
    logging::init("linkerd-cni", log::LevelFilter::Warn);
    let fail = |code: u8, msg: &str| {
        eprintln!("linkerd-cni kube remove-taint: {msg}");
        ExitCode::from(code)
    };
    let (mut kubeconfig, mut node, mut key) = (None, None, None);
    let mut timeout = Duration::from_secs(5);
    let mut rest = args;
    while let Some((&flag, tail)) = rest.split_first() {
        let (name, inline) = match flag.split_once('=') {
            Some((n, v)) => (n, Some(v)),
            None => (flag, None),
        };
        let (value, tail) = match (inline, tail.split_first()) {
            (Some(v), _) => (v, tail),
            (None, Some((&v, t))) => (v, t),
            (None, None) => return fail(EXIT_ERROR, &format!("{name} needs a value")),
        };
        match name {
            "--kubeconfig" => kubeconfig = Some(PathBuf::from(value)),
            "--node" => node = Some(value.to_string()),
            "--key" => key = Some(value.to_string()),
            "--timeout-seconds" => match value.parse::<f64>() {
                Ok(s) if s > 0.0 && s <= MAX_TIMEOUT_SECONDS => {
                    timeout = Duration::from_secs_f64(s);
                }
                _ => {
                    return fail(
                        EXIT_ERROR,
                        &format!("--timeout-seconds {value:?}: expected 0 < N <= 300"),
                    );
                }
            },
            _ => {
                return fail(
                    EXIT_ERROR,
                    &format!("unknown argument {flag:?}\n\n{}", crate::USAGE),
                );
            }
        }
        rest = tail;
    }
    let (Some(kubeconfig), Some(node), Some(key)) = (kubeconfig, node, key) else {
        return fail(EXIT_ERROR, "--kubeconfig, --node and --key are required");
    };
    // Names go into an API path: refuse anything that could change it.
    if !is_path_segment(&node) {
        return fail(
            EXIT_ERROR,
            &format!("--node {node:?} is not a valid node name"),
        );
    }
    if key.is_empty() {
        return fail(EXIT_ERROR, "--key is empty");
    }
    let api = match linkerd_cni_kube::kubeconfig::load(&kubeconfig) {
        Ok(api) => api,
        Err(e) => return fail(EXIT_ERROR, &e.to_string()),
    };
    let client = linkerd_cni_kube::Client::new(api, timeout);
    match taint::remove_taint(&client, &node, &key) {
        // The outcome word leads stdout, for people and logs; the installer
        // goes by the exit code.
        Ok(o @ taint::TaintOutcome::Removed { .. }) => {
            println!("removed: {o}");
            ExitCode::SUCCESS
        }
        Ok(o @ taint::TaintOutcome::Absent { .. }) => {
            println!("absent: {o}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            let code = match e.kind() {
                FailureKind::Transient => EXIT_TRANSIENT,
                FailureKind::Forbidden => EXIT_FORBIDDEN,
                FailureKind::Unauthorized => EXIT_UNAUTHORIZED,
                FailureKind::Other => EXIT_ERROR,
            };
            fail(code, &format!("{e}; {}", e.hint()))
        }
    }
}

/// A node name is a DNS subdomain: lower-case alphanumerics, `-` and `.`.
fn is_path_segment(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
        && s != "."
        && s != ".."
}
