//! Running the plugin binary's `linkerd-cni kube ...` subcommands: the
//! installer links no HTTP or TLS code, and asks the Kubernetes API through
//! the binary it ships (`CONTAINER_CNI_BIN_DIR/linkerd-cni`), which has the
//! plugin's blocking HTTPS client, with the kubeconfig the installer wrote.
//! Every run is bounded: past its bound the child is killed.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::binaries::PLUGIN_BINARY;
use crate::config::Config;

/// The most one subcommand's API calls may take, passed to it as
/// `--timeout-seconds`.
pub const API_TIMEOUT: Duration = Duration::from_secs(5);
/// On top of [`API_TIMEOUT`], for the child's start and exit.
const SLACK: Duration = Duration::from_secs(2);
/// The longest one run may take: past it the child is killed.
pub const BOUND: Duration = API_TIMEOUT.saturating_add(SLACK);
/// What is kept of the child's stdout and stderr each.
const MAX_OUTPUT: u64 = 64 << 10;

/// How a run ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    /// The exit code; None when killed by a signal.
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

impl Answer {
    /// The child's own words: stderr, else stdout, on one line.
    pub fn says(&self) -> String {
        let text = if self.stderr.trim().is_empty() {
            &self.stdout
        } else {
            &self.stderr
        };
        text.trim().replace('\n', "; ")
    }
}

/// The plugin binary in the image.
pub fn plugin(cfg: &Config) -> PathBuf {
    cfg.container_cni_bin_dir.join(PLUGIN_BINARY)
}

/// Runs `bin kube <args> --timeout-seconds <API_TIMEOUT>`; Err says why
/// it gave no answer (could not start, killed at the bound).
pub fn run(bin: &Path, args: &[&str]) -> Result<Answer, String> {
    run_bounded(bin, args, BOUND)
}

/// [`run`] with another bound (tests use short ones).
pub fn run_bounded(bin: &Path, args: &[&str], bound: Duration) -> Result<Answer, String> {
    let what = format!("{} kube {}", bin.display(), args.first().unwrap_or(&""));
    let mut child = Command::new(bin)
        .arg("kube")
        .args(args)
        .arg("--timeout-seconds")
        .arg(API_TIMEOUT.as_secs().to_string())
        // Set, it would make the binary a CNI plugin reading stdin.
        .env_remove("CNI_COMMAND")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run {}: {e}", bin.display()))?;
    // Read both pipes while waiting, so that a chatty child cannot block
    // on a full pipe and be killed for it.
    let drain = |r: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            if let Some(r) = r {
                let mut r = r.take(MAX_OUTPUT);
                let _ = r.read_to_end(&mut buf);
                // Past the cap: keep reading into nothing until EOF.
                let _ = std::io::copy(&mut r.into_inner(), &mut std::io::sink());
            }
            String::from_utf8_lossy(&buf).into_owned()
        })
    };
    let out = drain(
        child
            .stdout
            .take()
            .map(|s| Box::new(s) as Box<dyn Read + Send>),
    );
    let err = drain(
        child
            .stderr
            .take()
            .map(|s| Box::new(s) as Box<dyn Read + Send>),
    );
    let deadline = Instant::now() + bound;
    let status = loop {
        match child.try_wait() {
            Ok(Some(s)) => break s,
            Ok(None) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(20));
            }
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!(
                    "{what} did not answer within {bound:?} and was killed"
                ));
            }
            Err(e) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("cannot wait for {what}: {e}"));
            }
        }
    };
    // The pipes close at the child's exit (it starts no grandchildren).
    Ok(Answer {
        code: status.code(),
        stdout: out.join().unwrap_or_default(),
        stderr: err.join().unwrap_or_default(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn script(dir: &Path, name: &str, body: &str) -> PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        p
    }

    #[test]
    fn answers_and_bounds() {
        let dir = testkit::TempDir::new("kubecmd").unwrap();
        let d = dir.path();
        let echo = script(d, "echo", r#"echo "out: $*"; echo "err line" >&2; exit 3"#);
        let a = run_bounded(&echo, &["remove-taint", "--node", "n"], SLACK).unwrap();
        assert_eq!(a.code, Some(3));
        assert_eq!(
            a.stdout.trim(),
            "out: kube remove-taint --node n --timeout-seconds 5"
        );
        assert_eq!(a.says(), "err line");

        // More output than a pipe holds: still answered, capped.
        let chatty = script(
            d,
            "chatty",
            "yes 0123456789abcdef | head -c 1000000 >&2; exit 0",
        );
        let a = run_bounded(&chatty, &["x"], Duration::from_secs(30)).unwrap();
        assert_eq!(a.code, Some(0));
        assert_eq!(a.stderr.len() as u64, MAX_OUTPUT);

        let hung = script(d, "hung", "exec sleep 30");
        let started = Instant::now();
        let e = run_bounded(&hung, &["x"], Duration::from_millis(300)).unwrap_err();
        assert!(e.contains("was killed"), "{e}");
        assert!(started.elapsed() < Duration::from_secs(20));

        let e = run_bounded(&d.join("missing"), &["x"], SLACK).unwrap_err();
        assert!(e.contains("cannot run"), "{e}");
    }
}
