//! Running the node's iptables binaries: which ones (mode, family, fallback)
//! and how (bounded in time, output captured, errors that say what ran).
//!
//! The plugin runs in the host's mount namespace and uses whatever the node
//! ships. When the configured mode's binaries are missing, we fall back in
//! upstream's order (nft, plain, legacy) and say so in the log.

use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use thiserror::Error;

use super::rules::Family;
use crate::config::IptablesMode;

/// Where binaries are looked for after `$PATH`: runtimes often run plugins
/// with a minimal PATH, and the sbin directories are where distributions put
/// iptables.
const STANDARD_DIRS: [&str; 6] = [
    "/usr/local/sbin",
    "/usr/local/bin",
    "/usr/sbin",
    "/usr/bin",
    "/sbin",
    "/bin",
];

/// How much of a failed command's stderr goes into the error.
const MAX_STDERR: usize = 2048;
/// The most stdout read from one command: a pod's nat table is a few KiB,
/// and a runaway `*-save` must not fill the plugin's memory.
pub const MAX_OUTPUT: usize = 4 << 20;
/// The most stderr kept (only an excerpt is reported).
const MAX_STDERR_READ: usize = 64 << 10;

#[derive(Debug, Error)]
pub enum ExecError {
    #[error(
        "no {family} iptables binaries found (tried modes {tried}; looked in {dirs}): install iptables on the node"
    )]
    NotFound {
        family: Family,
        tried: String,
        dirs: String,
    },
    #[error("cannot run {bin}: {source}")]
    Spawn { bin: String, source: std::io::Error },
    #[error("{bin} failed ({status}): {stderr}")]
    Failed {
        bin: String,
        status: ExitStatus,
        stderr: String,
    },
    #[error("{bin} printed more than {limit} bytes: refusing to read more")]
    TooMuchOutput { bin: String, limit: usize },
    #[error("{bin} did not finish within {} s and was killed", .after.as_secs_f32())]
    TimedOut { bin: String, after: Duration },
}

/// The `*-save` and `*-restore` pair of one mode and family.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tools {
    pub mode: IptablesMode,
    pub family: Family,
    pub save: PathBuf,
    pub restore: PathBuf,
}

/// The binary names of `mode` for `family`: (save, restore).
fn names(mode: IptablesMode, family: Family) -> (String, String) {
    let stem = family.stem();
    let infix = match mode {
        IptablesMode::Legacy => "-legacy",
        IptablesMode::Nft => "-nft",
        IptablesMode::Plain => "",
    };
    (
        format!("{stem}{infix}-save"),
        format!("{stem}{infix}-restore"),
    )
}

/// `$PATH` (as given) followed by the standard directories.
pub fn search_dirs(path_var: Option<&std::ffi::OsStr>) -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = path_var
        .map(|p| {
            std::env::split_paths(p)
                .filter(|d| d.is_absolute())
                .collect()
        })
        .unwrap_or_default();
    for d in STANDARD_DIRS {
        let d = PathBuf::from(d);
        if !dirs.contains(&d) {
            dirs.push(d);
        }
    }
    dirs
}

fn find_in(name: &str, dirs: &[PathBuf]) -> Option<PathBuf> {
    dirs.iter().map(|d| d.join(name)).find(|p| {
        p.metadata()
            .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    })
}

impl Tools {
    /// The tools for `mode`, or for the first of nft, plain, legacy whose
    /// binaries exist in `dirs`.
    pub fn find(mode: IptablesMode, family: Family, dirs: &[PathBuf]) -> Result<Tools, ExecError> {
        let mut order = vec![mode];
        for m in [IptablesMode::Nft, IptablesMode::Plain, IptablesMode::Legacy] {
            if !order.contains(&m) {
                order.push(m);
            }
        }
        for &m in &order {
            let (save, restore) = names(m, family);
            if let (Some(save), Some(restore)) = (find_in(&save, dirs), find_in(&restore, dirs)) {
                if m != mode {
                    log::warn!(
                        "iptables-mode {:?}: {} binaries for {family} not found, using mode {:?} ({})",
                        mode.as_str(),
                        names(mode, family).1,
                        m.as_str(),
                        restore.display()
                    );
                }
                return Ok(Tools {
                    mode: m,
                    family,
                    save,
                    restore,
                });
            }
        }
        Err(ExecError::NotFound {
            family,
            tried: order
                .iter()
                .map(|m| m.as_str())
                .collect::<Vec<_>>()
                .join(", "),
            dirs: dirs
                .iter()
                .map(|d| d.display().to_string())
                .collect::<Vec<_>>()
                .join(":"),
        })
    }

    /// `*-save -t nat`: the current nat table, as text.
    pub fn save(&self, timeout: Duration) -> Result<String, ExecError> {
        let mut cmd = Command::new(&self.save);
        cmd.args(["-t", "nat"]);
        let out = run(cmd, &self.save, None, timeout)?;
        // Lossy: a table we cannot read as UTF-8 then differs from ours.
        Ok(String::from_utf8_lossy(&out).into_owned())
    }

    /// `*-restore --noflush [-w]` with `batch` on stdin.
    pub fn restore(&self, batch: &str, wait: bool, timeout: Duration) -> Result<(), ExecError> {
        let mut cmd = Command::new(&self.restore);
        cmd.arg("--noflush");
        if wait {
            cmd.arg("-w");
        }
        run(cmd, &self.restore, Some(batch.as_bytes()), timeout).map(drop)
    }
}

/// Runs `cmd` with `input` on stdin, returning stdout (at most
/// [`MAX_OUTPUT`] bytes); kills it after `timeout` (e.g. when it waits
/// forever on the xtables lock).
fn run(
    cmd: Command,
    bin: &Path,
    input: Option<&[u8]>,
    timeout: Duration,
) -> Result<Vec<u8>, ExecError> {
    run_limited(cmd, bin, input, timeout, MAX_OUTPUT)
}

fn run_limited(
    mut cmd: Command,
    bin: &Path,
    input: Option<&[u8]>,
    timeout: Duration,
    max_output: usize,
) -> Result<Vec<u8>, ExecError> {
    let name = bin.display().to_string();
    cmd.stdin(if input.is_some() {
        Stdio::piped()
    } else {
        Stdio::null()
    })
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    let mut child = cmd.spawn().map_err(|source| ExecError::Spawn {
        bin: name.clone(),
        source,
    })?;

    // Pipes are drained on their own threads so that neither a large batch
    // nor a chatty child can block the wait below.
    let stdin = child.stdin.take();
    let input = input.map(<[u8]>::to_vec);
    let writer = std::thread::spawn(move || {
        if let (Some(mut s), Some(data)) = (stdin, input) {
            // A child that exits early closes the pipe; its status says why.
            let _ = s.write_all(&data);
        }
    });
    let stdout = reader(child.stdout.take(), max_output);
    let stderr = reader(child.stderr.take(), MAX_STDERR_READ);

    let status = wait_until(&mut child, Instant::now() + timeout);
    let _ = writer.join();
    let (out, overflow) = stdout.join().unwrap_or_default();
    let (err, _) = stderr.join().unwrap_or_default();
    match status {
        Some(Ok(_)) if overflow => Err(ExecError::TooMuchOutput {
            bin: name,
            limit: max_output,
        }),
        Some(Ok(status)) if status.success() => Ok(out),
        Some(Ok(status)) => Err(ExecError::Failed {
            bin: name,
            status,
            stderr: excerpt(&err),
        }),
        Some(Err(source)) => Err(ExecError::Spawn { bin: name, source }),
        None => Err(ExecError::TimedOut {
            bin: name,
            after: timeout,
        }),
    }
}

/// Reads up to `limit` bytes; the rest is drained (so the child never
/// blocks on a full pipe) and dropped. True when there was more.
fn reader<R: Read + Send + 'static>(
    r: Option<R>,
    limit: usize,
) -> std::thread::JoinHandle<(Vec<u8>, bool)> {
    std::thread::spawn(move || {
        let mut buf = Vec::new();
        let mut overflow = false;
        if let Some(mut r) = r {
            let _ = r.by_ref().take(limit as u64).read_to_end(&mut buf);
            overflow = std::io::copy(&mut r, &mut std::io::sink()).is_ok_and(|n| n > 0);
        }
        (buf, overflow)
    })
}

/// Waits for `child` until `deadline`; on expiry kills and reaps it and
/// returns None.
fn wait_until(child: &mut Child, deadline: Instant) -> Option<std::io::Result<ExitStatus>> {
    let mut pause = Duration::from_micros(500);
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return Some(Ok(status)),
            Ok(None) => {}
            Err(e) => return Some(Err(e)),
        }
        let now = Instant::now();
        if now >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(pause.min(deadline - now));
        pause = (pause * 2).min(Duration::from_millis(20));
    }
}

fn excerpt(stderr: &[u8]) -> String {
    let s = String::from_utf8_lossy(stderr);
    let s = s.trim();
    if s.is_empty() {
        return "no error output".into();
    }
    match s.char_indices().nth(MAX_STDERR) {
        Some((i, _)) => format!("{}...", &s[..i]),
        None => s.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    struct TempDir(PathBuf);
    impl TempDir {
        fn new(tag: &str) -> TempDir {
            let p = std::env::temp_dir().join(format!(
                "linkerd-cni-exec-{tag}-{}-{:?}",
                std::process::id(),
                std::thread::current().id()
            ));
            let _ = fs::remove_dir_all(&p);
            fs::create_dir_all(&p).unwrap();
            TempDir(p)
        }
        fn exe(&self, name: &str) {
            let p = self.0.join(name);
            fs::write(&p, "#!/bin/sh\n").unwrap();
            fs::set_permissions(&p, fs::Permissions::from_mode(0o755)).unwrap();
        }
    }
    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    #[test]
    fn configured_mode_wins_when_present() {
        let d = TempDir::new("present");
        for n in [
            "iptables-legacy-save",
            "iptables-legacy-restore",
            "iptables-nft-save",
            "iptables-nft-restore",
        ] {
            d.exe(n);
        }
        let t = Tools::find(IptablesMode::Legacy, Family::V4, std::slice::from_ref(&d.0)).unwrap();
        assert_eq!(t.mode, IptablesMode::Legacy);
        assert_eq!(t.restore, d.0.join("iptables-legacy-restore"));
        assert_eq!(t.save, d.0.join("iptables-legacy-save"));
    }

    #[test]
    fn fallback_order_is_nft_plain_legacy() {
        let d = TempDir::new("fallback");
        for n in [
            "ip6tables-save",
            "ip6tables-restore",
            "ip6tables-legacy-save",
            "ip6tables-legacy-restore",
            // Half a pair does not count.
            "ip6tables-nft-save",
        ] {
            d.exe(n);
        }
        let dirs = [d.0.clone()];
        let t = Tools::find(IptablesMode::Legacy, Family::V6, &dirs).unwrap();
        assert_eq!(t.mode, IptablesMode::Legacy);
        let t = Tools::find(IptablesMode::Nft, Family::V6, &dirs).unwrap();
        assert_eq!(t.mode, IptablesMode::Plain);
        assert_eq!(t.restore, d.0.join("ip6tables-restore"));
        fs::remove_file(d.0.join("ip6tables-restore")).unwrap();
        let t = Tools::find(IptablesMode::Nft, Family::V6, &dirs).unwrap();
        assert_eq!(t.mode, IptablesMode::Legacy);
        // A file without the exec bit is not a binary.
        fs::set_permissions(
            d.0.join("ip6tables-legacy-save"),
            fs::Permissions::from_mode(0o644),
        )
        .unwrap();
        let e = Tools::find(IptablesMode::Nft, Family::V6, &dirs).unwrap_err();
        let msg = e.to_string();
        assert!(
            msg.contains("IPv6") && msg.contains("nft, plain, legacy"),
            "{msg}"
        );
    }

    #[test]
    fn search_dirs_put_path_first_and_skip_relative_entries() {
        let dirs = search_dirs(Some(std::ffi::OsStr::new("/opt/x:relative::/usr/sbin")));
        assert_eq!(dirs[0], PathBuf::from("/opt/x"));
        assert!(!dirs.contains(&PathBuf::from("relative")));
        assert_eq!(dirs.iter().filter(|d| d.ends_with("usr/sbin")).count(), 1);
        assert!(search_dirs(None).contains(&PathBuf::from("/sbin")));
    }

    #[test]
    fn output_beyond_the_limit_is_an_error() {
        let mut cmd = Command::new("/bin/sh");
        cmd.args(["-c", "head -c 100000 /dev/zero"]);
        let e = run_limited(
            cmd,
            Path::new("/bin/sh"),
            None,
            Duration::from_secs(10),
            4096,
        )
        .unwrap_err();
        assert!(
            matches!(e, ExecError::TooMuchOutput { limit: 4096, .. }),
            "{e}"
        );
        assert!(e.to_string().contains("more than 4096 bytes"), "{e}");
    }

    #[test]
    fn run_reports_failure_output_and_timeouts() {
        let mut cmd = Command::new("/bin/sh");
        cmd.args(["-c", "cat; echo oops >&2; exit 3"]);
        let e = run(
            cmd,
            Path::new("/bin/sh"),
            Some(b"in"),
            Duration::from_secs(10),
        )
        .unwrap_err();
        assert!(
            matches!(&e, ExecError::Failed { stderr, .. } if stderr == "oops"),
            "{e}"
        );

        let mut cmd = Command::new("/bin/sh");
        cmd.args(["-c", "cat"]);
        let out = run(
            cmd,
            Path::new("/bin/sh"),
            Some(b"batch\n"),
            Duration::from_secs(10),
        )
        .unwrap();
        assert_eq!(out, b"batch\n");

        let mut cmd = Command::new("/bin/sleep");
        cmd.arg("5");
        let start = Instant::now();
        let e = run(
            cmd,
            Path::new("/bin/sleep"),
            None,
            Duration::from_millis(100),
        )
        .unwrap_err();
        assert!(matches!(e, ExecError::TimedOut { .. }), "{e}");
        assert!(start.elapsed() < Duration::from_secs(4));

        let e = run(
            Command::new("/nonexistent/iptables"),
            Path::new("/nonexistent/iptables"),
            None,
            Duration::from_secs(1),
        )
        .unwrap_err();
        assert!(
            e.to_string()
                .starts_with("cannot run /nonexistent/iptables")
        );
    }
}
