//! Running the node's iptables binaries: which ones (mode, family, fallback)
//! and how (bounded in time, output captured, errors that say what ran).
//!
//! The plugin runs in the host's mount namespace and uses whatever the node
//! ships. When the configured mode's binaries are missing, we fall back in
//! upstream's order (nft, plain, legacy) and say so in the log.

use std::io::{ErrorKind, Read, Write};
use std::os::fd::{AsFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStderr, ChildStdin, ChildStdout, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::fcntl::{FcntlArg, OFlag, fcntl};
use nix::libc;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
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
        let out = run(cmd, None, timeout)?;
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
        run(cmd, Some(batch.as_bytes()), timeout).map(drop)
    }
}

/// Runs `cmd` with `input` on stdin, returning stdout (at most
/// [`MAX_OUTPUT`] bytes); kills it after `timeout` (e.g. when it waits
/// forever on the xtables lock).
fn run(cmd: Command, input: Option<&[u8]>, timeout: Duration) -> Result<Vec<u8>, ExecError> {
    run_child(cmd, input, timeout, MAX_OUTPUT, Exit::Pidfd)
}

/// How the end of a child is noticed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Exit {
    /// Its pidfd, where the kernel has them (Linux 5.3 and later).
    Pidfd,
    /// Polling for it once its pipes are closed: what happens on older
    /// kernels, whose path the tests take on any kernel.
    #[cfg_attr(not(test), expect(dead_code, reason = "chosen by tests only"))]
    Polled,
}

fn run_child(
    mut cmd: Command,
    input: Option<&[u8]>,
    timeout: Duration,
    max_output: usize,
    exit: Exit,
) -> Result<Vec<u8>, ExecError> {
    let name = Path::new(cmd.get_program()).display().to_string();
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
    let deadline = Instant::now() + timeout;
    let outcome = Pipes::new(&mut child, input, max_output, exit).and_then(|mut pipes| {
        let exited = pipes.pump(&mut child, deadline)?;
        Ok((exited, pipes))
    });
    let (status, pipes) = match outcome {
        Ok((Some(status), pipes)) => (status, pipes),
        unfinished => {
            let _ = child.kill();
            let _ = child.wait();
            return Err(match unfinished {
                Err(source) => ExecError::Spawn { bin: name, source },
                _ => ExecError::TimedOut {
                    bin: name,
                    after: timeout,
                },
            });
        }
    };
    match status {
        _ if pipes.stdout.overflow => Err(ExecError::TooMuchOutput {
            bin: name,
            limit: max_output,
        }),
        status if status.success() => Ok(pipes.stdout.buf),
        status => Err(ExecError::Failed {
            bin: name,
            status,
            stderr: excerpt(&pipes.stderr.buf),
        }),
    }
}

/// A child's pipes and its pidfd, served by one `poll` loop in the calling
/// thread: the batch is written while the output is read, so neither a
/// large batch nor a chatty child can block the other side, and the child's
/// exit wakes the loop at once (no thread per pipe, no sleeping).
struct Pipes<'a> {
    stdin: Option<ChildStdin>,
    input: &'a [u8],
    stdout: Capture<ChildStdout>,
    stderr: Capture<ChildStderr>,
    /// None on kernels before 5.3 (no `pidfd_open`): the exit is then
    /// polled for once the output pipes are closed.
    pidfd: Option<OwnedFd>,
}

/// One output pipe, read up to a limit; the rest is drained (so the child
/// never blocks on a full pipe) and dropped.
struct Capture<R> {
    pipe: Option<R>,
    buf: Vec<u8>,
    limit: usize,
    /// The child wrote more than `limit`.
    overflow: bool,
}

impl<R: Read + AsFd> Capture<R> {
    fn new(pipe: Option<R>, limit: usize) -> std::io::Result<Capture<R>> {
        if let Some(p) = &pipe {
            nonblocking(p.as_fd())?;
        }
        Ok(Capture {
            pipe,
            buf: Vec::new(),
            limit,
            overflow: false,
        })
    }

    /// Reads what is there; closes the pipe at EOF.
    fn read_available(&mut self) -> std::io::Result<()> {
        let Some(pipe) = &mut self.pipe else {
            return Ok(());
        };
        loop {
            let room = self.limit - self.buf.len();
            // Straight into the buffer's spare capacity, which std's
            // read_to_end does not zero (a zeroed scratch buffer per wake-up
            // cost more than the reads).
            let read = if room > 0 {
                let before = self.buf.len();
                pipe.by_ref()
                    .take(room as u64)
                    .read_to_end(&mut self.buf)
                    .map(|_| self.buf.len() - before)
            } else {
                let mut drain = [0u8; 512];
                pipe.read(&mut drain).inspect(|&n| self.overflow |= n > 0)
            };
            match read {
                // EOF (when the take's limit was not what stopped it).
                Ok(n) if n < room || (room == 0 && n == 0) => {
                    self.pipe = None;
                    return Ok(());
                }
                Ok(_) => {}
                Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(()),
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }
}

impl<'a> Pipes<'a> {
    fn new(
        child: &mut Child,
        input: Option<&'a [u8]>,
        max_output: usize,
        exit: Exit,
    ) -> std::io::Result<Self> {
        let stdin = child.stdin.take();
        if let Some(s) = &stdin {
            nonblocking(s.as_fd())?;
        }
        Ok(Pipes {
            stdin,
            input: input.unwrap_or_default(),
            stdout: Capture::new(child.stdout.take(), max_output)?,
            stderr: Capture::new(child.stderr.take(), MAX_STDERR_READ)?,
            pidfd: (exit == Exit::Pidfd)
                .then(|| pidfd_open(child.id()))
                .flatten(),
        })
    }

    /// Feeds stdin, reads stdout and stderr, until the child has exited and
    /// closed both; None when `deadline` came first.
    fn pump(
        &mut self,
        child: &mut Child,
        deadline: Instant,
    ) -> std::io::Result<Option<ExitStatus>> {
        let mut status = None;
        // Without a pidfd, the exit is polled for with a back-off once the
        // pipes are closed.
        let mut pause = Duration::from_micros(200);
        loop {
            if self.stdin.is_some() && self.input.is_empty() {
                // EOF for the child.
                self.stdin = None;
            }
            if status.is_none() {
                status = child.try_wait()?;
            }
            let open =
                self.stdin.is_some() || self.stdout.pipe.is_some() || self.stderr.pipe.is_some();
            if status.is_some() && !open {
                return Ok(status);
            }
            let now = Instant::now();
            if now >= deadline {
                return Ok(None);
            }
            let left = deadline - now;
            let pidfd = self.pidfd.as_ref().filter(|_| status.is_none());
            if !open && pidfd.is_none() {
                std::thread::sleep(pause.min(left));
                pause = (pause * 2).min(Duration::from_millis(20));
                continue;
            }
            self.wait(pidfd, left)?;
            self.write_available()?;
            self.stdout.read_available()?;
            self.stderr.read_available()?;
        }
    }

    /// Blocks until a pipe is ready, `pidfd`'s process exits, or `left`
    /// passes.
    fn wait(&self, pidfd: Option<&OwnedFd>, left: Duration) -> std::io::Result<()> {
        let mut fds = Vec::with_capacity(4);
        if let Some(s) = &self.stdin {
            fds.push(PollFd::new(s.as_fd(), PollFlags::POLLOUT));
        }
        if let Some(p) = &self.stdout.pipe {
            fds.push(PollFd::new(p.as_fd(), PollFlags::POLLIN));
        }
        if let Some(p) = &self.stderr.pipe {
            fds.push(PollFd::new(p.as_fd(), PollFlags::POLLIN));
        }
        if let Some(p) = pidfd {
            fds.push(PollFd::new(p.as_fd(), PollFlags::POLLIN));
        }
        // Rounded up, so that a wait never ends just before the deadline and
        // spins.
        let ms = left.as_micros().div_ceil(1000);
        let timeout = PollTimeout::try_from(ms).unwrap_or(PollTimeout::MAX);
        match poll(&mut fds, timeout) {
            Ok(_) | Err(Errno::EINTR) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// Writes as much of the batch as the pipe takes.
    fn write_available(&mut self) -> std::io::Result<()> {
        let Some(s) = &mut self.stdin else {
            return Ok(());
        };
        while !self.input.is_empty() {
            match s.write(self.input) {
                Ok(n) => self.input = &self.input[n..],
                Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(()),
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                // A child that exits early closes the pipe; its status says
                // why.
                Err(e) if e.kind() == ErrorKind::BrokenPipe => {
                    self.input = &[];
                }
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
}

fn nonblocking(fd: BorrowedFd<'_>) -> std::io::Result<()> {
    let flags = OFlag::from_bits_retain(fcntl(fd, FcntlArg::F_GETFL)?);
    fcntl(fd, FcntlArg::F_SETFL(flags | OFlag::O_NONBLOCK))?;
    Ok(())
}

/// A pidfd for the (not yet reaped) child `pid`: readable once it exits.
/// None where the kernel lacks `pidfd_open` (before Linux 5.3).
fn pidfd_open(pid: u32) -> Option<OwnedFd> {
    let pid = libc::pid_t::try_from(pid).ok()?;
    // SAFETY: pidfd_open takes a pid and flags and returns a new file
    // descriptor or -1; it touches no memory of ours.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    let fd = std::os::fd::RawFd::try_from(fd)
        .ok()
        .filter(|fd| *fd >= 0)?;
    // SAFETY: the syscall just returned this descriptor, which nothing else
    // owns.
    Some(unsafe { OwnedFd::from_raw_fd(fd) })
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

    /// A bin dir of fake executables: testkit's temp dir.
    struct TempDir {
        _removed_on_drop: testkit::TempDir,
        path: PathBuf,
    }
    impl TempDir {
        fn new(tag: &str) -> TempDir {
            let t = testkit::TempDir::new(&format!("exec-{tag}")).unwrap();
            TempDir {
                path: t.path().to_path_buf(),
                _removed_on_drop: t,
            }
        }
        fn exe(&self, name: &str) {
            let p = self.path.join(name);
            fs::write(&p, "#!/bin/sh\n").unwrap();
            fs::set_permissions(&p, fs::Permissions::from_mode(0o755)).unwrap();
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
        let t = Tools::find(
            IptablesMode::Legacy,
            Family::V4,
            std::slice::from_ref(&d.path),
        )
        .unwrap();
        assert_eq!(t.mode, IptablesMode::Legacy);
        assert_eq!(t.restore, d.path.join("iptables-legacy-restore"));
        assert_eq!(t.save, d.path.join("iptables-legacy-save"));
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
        let dirs = [d.path.clone()];
        let t = Tools::find(IptablesMode::Legacy, Family::V6, &dirs).unwrap();
        assert_eq!(t.mode, IptablesMode::Legacy);
        let t = Tools::find(IptablesMode::Nft, Family::V6, &dirs).unwrap();
        assert_eq!(t.mode, IptablesMode::Plain);
        assert_eq!(t.restore, d.path.join("ip6tables-restore"));
        fs::remove_file(d.path.join("ip6tables-restore")).unwrap();
        let t = Tools::find(IptablesMode::Nft, Family::V6, &dirs).unwrap();
        assert_eq!(t.mode, IptablesMode::Legacy);
        // A file without the exec bit is not a binary.
        fs::set_permissions(
            d.path.join("ip6tables-legacy-save"),
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
        let e = run_child(cmd, None, Duration::from_secs(10), 4096, Exit::Pidfd).unwrap_err();
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
        let e = run(cmd, Some(b"in"), Duration::from_secs(10)).unwrap_err();
        assert!(
            matches!(&e, ExecError::Failed { stderr, .. } if stderr == "oops"),
            "{e}"
        );

        let mut cmd = Command::new("/bin/sh");
        cmd.args(["-c", "cat"]);
        let out = run(cmd, Some(b"batch\n"), Duration::from_secs(10)).unwrap();
        assert_eq!(out, b"batch\n");

        let mut cmd = Command::new("/bin/sleep");
        cmd.arg("5");
        let start = Instant::now();
        let e = run(cmd, None, Duration::from_millis(100)).unwrap_err();
        assert!(matches!(e, ExecError::TimedOut { .. }), "{e}");
        assert!(start.elapsed() < Duration::from_secs(4));

        let e = run(
            Command::new("/nonexistent/iptables"),
            None,
            Duration::from_secs(1),
        )
        .unwrap_err();
        assert!(
            e.to_string()
                .starts_with("cannot run /nonexistent/iptables")
        );
    }

    fn sh(script: &str) -> Command {
        let mut cmd = Command::new("/bin/sh");
        cmd.args(["-c", script]);
        cmd
    }

    #[test]
    fn a_large_batch_and_output_flow_at_once_with_either_exit_watch() {
        // More than any pipe buffer in both directions: a runner that wrote
        // all of stdin before reading stdout would deadlock with `cat`.
        let batch: Vec<u8> = (0..3 << 20).map(|i| (i % 251) as u8).collect();
        for exit in [Exit::Pidfd, Exit::Polled] {
            let out = run_child(
                sh("cat; echo done >&2"),
                Some(&batch),
                Duration::from_secs(60),
                MAX_OUTPUT,
                exit,
            )
            .unwrap();
            assert!(out == batch, "{exit:?}: {} bytes back", out.len());
        }
    }

    #[test]
    fn a_child_that_ignores_its_input_reports_its_own_status() {
        let batch = vec![b'x'; 1 << 20];
        for exit in [Exit::Pidfd, Exit::Polled] {
            let e = run_child(
                sh("echo refused >&2; exit 2"),
                Some(&batch),
                Duration::from_secs(60),
                MAX_OUTPUT,
                exit,
            )
            .unwrap_err();
            assert!(
                matches!(&e, ExecError::Failed { status, stderr, .. }
                    if status.code() == Some(2) && stderr == "refused"),
                "{exit:?}: {e}"
            );
        }
    }

    #[test]
    fn an_exited_child_whose_pipe_lives_on_times_out() {
        // The grandchild keeps stdout open: the output is not complete, so
        // it is not used, and the wait still ends at the deadline.
        for exit in [Exit::Pidfd, Exit::Polled] {
            let e = run_child(
                sh("sleep 3 & echo partial"),
                None,
                Duration::from_millis(300),
                MAX_OUTPUT,
                exit,
            )
            .unwrap_err();
            assert!(matches!(e, ExecError::TimedOut { .. }), "{exit:?}: {e}");
        }
    }
}
