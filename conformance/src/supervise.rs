//! Clean-up that does not depend on the story process unwinding, for the
//! demo and the benchmarks.
//!
//! Both are release binaries, and the workspace's release profile aborts on
//! panic: a harness set-up step that panics (an `ip netns add` that fails)
//! would skip every Drop guard and leave namespaces, temp dirs and an
//! installer process behind. So [`run`] re-executes the program as a child
//! (the "story") and stays behind as its supervisor:
//!
//! - The story runs in its own process group, so a Ctrl-C on the terminal
//!   reaches only the supervisor, which forwards one SIGTERM to the story.
//!   The story's handler only sets a flag ([`interrupted`]); the story
//!   finishes its current short step, returns [`Stop::Interrupted`] and its
//!   Drop guards remove what it made. Its own children (the libcni driver,
//!   `ip`, the installer) never see the signal, so an interruption never
//!   looks like a failed step.
//! - Whatever way the story ends (success, error, abort, SIGKILL after a
//!   grace period), the supervisor then looks for what is left of it by
//!   name: network namespaces and temp dirs carry the story's pid
//!   (`lcnic-<kind>-<pid>-<n>`, see [`crate::sys`]), processes are found by
//!   the node paths in their environment. It stops and removes them, and
//!   reports what it found, so "nothing left behind" is checked on every
//!   run rather than assumed.
//!
//! Only a SIGKILL of the supervisor itself escapes this; then the next run
//! of any harness user sweeps the namespaces and temp dirs of dead pids
//! ([`crate::sys::require_environment`]).

use std::collections::BTreeSet;
use std::fmt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::sys::{self, PREFIX};

/// Set in the story's environment: "you are the story, not the supervisor".
const STORY_ENV: &str = "LCNIC_STORY";

/// How long the story may take to clean up after being asked to stop.
const STOP_GRACE: Duration = Duration::from_secs(30);

const NETNS_DIR: &str = "/run/netns";

static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    // Only an atomic store: async-signal-safe.
    INTERRUPTED.store(true, Ordering::SeqCst);
}

fn catch_signals() {
    for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
        // SAFETY: a zeroed sigaction with an empty mask and a handler that
        // only stores to an atomic is a valid, async-signal-safe action.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
            sa.sa_flags = libc::SA_RESTART;
            libc::sigemptyset(&mut sa.sa_mask);
            libc::sigaction(sig, &sa, std::ptr::null_mut());
        }
    }
}

/// Whether the story was asked to stop (Ctrl-C, SIGTERM, SIGHUP).
pub fn interrupted() -> bool {
    INTERRUPTED.load(Ordering::SeqCst)
}

/// Why a story stopped early.
#[derive(Debug)]
pub enum Stop {
    /// Asked to stop by a signal.
    Interrupted,
    /// A step failed: what failed and why.
    Failed(String),
}

impl fmt::Display for Stop {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Stop::Interrupted => f.write_str("interrupted"),
            Stop::Failed(why) => f.write_str(why),
        }
    }
}

impl Stop {
    /// A failed step; reported as an interruption when a signal came first
    /// (the failure is then most likely its consequence).
    pub fn failed(why: impl Into<String>) -> Stop {
        if interrupted() {
            Stop::Interrupted
        } else {
            Stop::Failed(why.into())
        }
    }
}

/// `Err(Stop::Interrupted)` once a signal arrived: call between steps.
pub fn checkpoint() -> Result<(), Stop> {
    if interrupted() {
        Err(Stop::Interrupted)
    } else {
        Ok(())
    }
}

/// Sleeps `d`, waking early (with `Stop::Interrupted`) on a signal.
pub fn sleep(d: Duration) -> Result<(), Stop> {
    let end = Instant::now() + d;
    loop {
        checkpoint()?;
        let now = Instant::now();
        if now >= end {
            return Ok(());
        }
        std::thread::sleep((end - now).min(Duration::from_millis(20)));
    }
}

/// Runs `story` under a supervisor (see the module doc). Call it first
/// thing in `main`: in the supervisor it starts the story and cleans up
/// after it; in the story it runs `story`.
pub fn run(name: &str, story: fn() -> ExitCode) -> ExitCode {
    if std::env::var_os(STORY_ENV).is_some() {
        catch_signals();
        return story();
    }
    supervise(name)
}

fn supervise(name: &str) -> ExitCode {
    catch_signals();
    let links_before = host_links();
    let exe = match std::env::current_exe() {
        Ok(e) => e,
        Err(e) => {
            eprintln!("{name}: cannot find my own executable: {e}");
            return ExitCode::FAILURE;
        }
    };
    let child = std::os::unix::process::CommandExt::process_group(
        Command::new(&exe)
            .args(std::env::args_os().skip(1))
            .env(STORY_ENV, "1")
            .stdin(Stdio::null()),
        0,
    )
    .spawn();
    let mut child = match child {
        Ok(c) => c,
        Err(e) => {
            eprintln!("{name}: cannot start {}: {e}", exe.display());
            return ExitCode::FAILURE;
        }
    };
    let pid = child.id();
    let mut asked_at: Option<Instant> = None;
    let status = loop {
        match child.try_wait() {
            Ok(Some(s)) => break Some(s),
            Ok(None) => {}
            Err(e) => {
                eprintln!("{name}: waiting for the story: {e}");
                break None;
            }
        }
        if interrupted() && asked_at.is_none() {
            eprintln!("\n{name}: interrupted: stopping and cleaning up...");
            signal(pid, libc::SIGTERM);
            asked_at = Some(Instant::now());
        }
        if asked_at.is_some_and(|t| t.elapsed() > STOP_GRACE) {
            eprintln!("{name}: the story did not stop within {STOP_GRACE:?}: killing it");
            let _ = child.kill();
            break child.wait().ok();
        }
        std::thread::sleep(Duration::from_millis(20));
    };

    let found = sweep(pid);
    let new_links: Vec<String> = host_links().difference(&links_before).cloned().collect();
    report(name, &found, &new_links);

    let code = match status {
        Some(s) => match (s.code(), std::os::unix::process::ExitStatusExt::signal(&s)) {
            (Some(c), _) => c,
            (None, Some(sig)) => {
                eprintln!("{name}: the story died from signal {sig}");
                128 + sig
            }
            (None, None) => 1,
        },
        None => 1,
    };
    let code = if interrupted() && code == 0 {
        130
    } else {
        code
    };
    ExitCode::from(u8::try_from(code).unwrap_or(1))
}

fn signal(pid: u32, sig: libc::c_int) {
    if let Ok(pid) = libc::pid_t::try_from(pid) {
        // SAFETY: kill(2) has no memory-safety preconditions; the pid is
        // one of ours (a child we have not reaped, or found by our names).
        unsafe {
            libc::kill(pid, sig);
        }
    }
}

/// What a story left behind, found by name.
#[derive(Debug, Default)]
struct Leftovers {
    processes: Vec<(u32, String)>,
    netns: Vec<String>,
    temp: Vec<PathBuf>,
}

impl Leftovers {
    fn is_empty(&self) -> bool {
        self.processes.is_empty() && self.netns.is_empty() && self.temp.is_empty()
    }
}

/// The pid in a harness name `lcnic-<kind>-<pid>-<n>`.
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

/// Whether `text` mentions a temp path `<tmp>/lcnic-<kind>-<pid>-<n>` of
/// process `pid`.
fn mentions_temp_of(text: &str, tmp: &str, pid: u32) -> bool {
    let needle = format!("{tmp}/{PREFIX}");
    text.match_indices(&needle).any(|(i, _)| {
        let name: String = text[i + tmp.len() + 1..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '-')
            .collect();
        owner_pid(&name) == Some(pid)
    })
}

/// Finds what the story `pid` left and removes it: processes first (so
/// nothing writes into a directory being removed), then namespaces, then
/// temp dirs.
fn sweep(pid: u32) -> Leftovers {
    let tmp = std::env::temp_dir().display().to_string();
    let mut found = Leftovers {
        processes: processes_mentioning(&tmp, pid),
        ..Leftovers::default()
    };
    for (p, _) in &found.processes {
        signal(*p, libc::SIGTERM);
    }
    let deadline = Instant::now() + Duration::from_secs(3);
    while !found
        .processes
        .iter()
        .all(|(p, _)| !Path::new(&format!("/proc/{p}")).exists())
        && Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(20));
    }
    for (p, _) in &found.processes {
        signal(*p, libc::SIGKILL);
    }
    if let Ok(entries) = std::fs::read_dir(NETNS_DIR) {
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if owner_pid(&name) == Some(pid) {
                let _ = sys::output(Command::new("ip").args(["netns", "del", &name]));
                found.netns.push(name);
            }
        }
    }
    if let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) {
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if owner_pid(&name) == Some(pid) {
                let _ = std::fs::remove_dir_all(e.path());
                found.temp.push(e.path());
            }
        }
    }
    found
}

/// Processes whose command line or environment names a temp dir of the
/// story `pid` (the installer, a plugin or driver still running).
fn processes_mentioning(tmp: &str, pid: u32) -> Vec<(u32, String)> {
    let me = std::process::id();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|p| *p != me && *p != pid)
        .filter_map(|p| {
            let read = |f: &str| {
                std::fs::read(format!("/proc/{p}/{f}"))
                    .map(|b| String::from_utf8_lossy(&b).replace('\0', " "))
                    .unwrap_or_default()
            };
            let cmdline = read("cmdline");
            (mentions_temp_of(&cmdline, tmp, pid) || mentions_temp_of(&read("environ"), tmp, pid))
                .then(|| (p, cmdline.trim().to_string()))
        })
        .collect()
}

/// Link names in this (the host's) network namespace.
fn host_links() -> BTreeSet<String> {
    let out = sys::output(Command::new("ip").args(["-o", "link", "show"]));
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split(':').nth(1))
        .map(|n| n.trim().split('@').next().unwrap_or_default().to_string())
        .collect()
}

fn report(name: &str, found: &Leftovers, new_links: &[String]) {
    if found.is_empty() {
        eprintln!(
            "{name}: clean-up checked: no process, network namespace or temp dir of this run is left"
        );
    } else {
        eprintln!("{name}: the run left these behind; removed them now:");
        for (p, cmd) in &found.processes {
            eprintln!("  process {p}: {cmd}");
        }
        for n in &found.netns {
            eprintln!("  netns {n}");
        }
        for t in &found.temp {
            eprintln!("  {}", t.display());
        }
    }
    if new_links.is_empty() {
        eprintln!("{name}: host network links: unchanged");
    } else {
        // Everything here runs inside throwaway namespaces; a new host link
        // is most likely another program's, but say it.
        eprintln!(
            "{name}: links that appeared in the host namespace during the run (not made by it: \
             everything here runs in its own namespaces): {}",
            new_links.join(", ")
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owner_pid_reads_harness_names() {
        assert_eq!(owner_pid("lcnic-node-1234-7"), Some(1234));
        assert_eq!(owner_pid("lcnic-pod-99-0"), Some(99));
        assert_eq!(owner_pid("lcnic-1234-7"), None);
        assert_eq!(owner_pid("lcnic-node-x-7"), None);
        assert_eq!(owner_pid("other-node-1234-7"), None);
        assert_eq!(owner_pid("lcnic-node-1234-"), None);
    }

    #[test]
    fn finds_temp_paths_of_one_pid_only() {
        let env =
            "PATH=/bin NETCONFPATH=/tmp/lcnic-node-42-3/net.d CNI_PATH=/tmp/lcnic-node-42-3/bin";
        assert!(mentions_temp_of(env, "/tmp", 42));
        assert!(!mentions_temp_of(env, "/tmp", 4));
        assert!(!mentions_temp_of(env, "/var/tmp", 42));
        assert!(!mentions_temp_of("X=/tmp/lcnic-node-420-3", "/tmp", 42));
    }
}
