//! An interrupted demo leaves nothing behind: started as `./demo.sh` starts
//! it, interrupted mid-story by a terminal's Ctrl-C (SIGINT to its whole
//! process group, children included) or by SIGTERM to it alone, it exits
//! 130, its own Drop guards remove every network namespace, temp dir and
//! process it made (its final check finds nothing), and a look from the
//! outside agrees.
//!
//! Needs root (the demo makes network namespaces) and the workspace's
//! binaries built (`cargo build --workspace --bins`, as ./test.sh does).

use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Generous: a debug-built demo on a loaded 2-core machine.
const REACH: Duration = Duration::from_secs(180);
const EXIT: Duration = Duration::from_secs(60);

struct Demo {
    child: Child,
    lines: mpsc::Receiver<String>,
    stdout: Vec<String>,
    stderr: std::path::PathBuf,
    _stderr_dir: testkit::TempDir,
}

impl Demo {
    /// The demo in its own process group, as a shell's job is.
    fn start() -> Demo {
        testkit::require_root("runs the demo, which creates network namespaces");
        let dir = testkit::TempDir::new("demo-interrupt").expect("temp dir");
        let stderr = dir.path().join("stderr");
        let mut child = Command::new(env!("CARGO_BIN_EXE_demo"))
            .process_group(0)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&stderr).expect("stderr file"))
            .spawn()
            .expect("start the demo");
        let out = child.stdout.take().expect("stdout");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        Demo {
            child,
            lines,
            stdout: Vec::new(),
            stderr,
            _stderr_dir: dir,
        }
    }

    fn pid(&self) -> i32 {
        i32::try_from(self.child.id()).expect("pid fits")
    }

    fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }

    /// Reads its stdout until a line starts with `prefix`.
    fn reach(&mut self, prefix: &str) {
        let deadline = Instant::now() + REACH;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    let hit = line.trim_start().starts_with(prefix);
                    self.stdout.push(line);
                    if hit {
                        return;
                    }
                }
                Err(_) => panic!(
                    "the demo did not reach {prefix:?} within {REACH:?}\nstdout:\n{}\nstderr:\n{}",
                    self.stdout.join("\n"),
                    self.stderr()
                ),
            }
        }
    }

    /// Waits for the exit; its code.
    fn wait(&mut self) -> Option<i32> {
        let deadline = Instant::now() + EXIT;
        loop {
            if let Some(s) = self.child.try_wait().expect("wait") {
                // The rest of stdout, now that the pipe is closed.
                while let Ok(l) = self.lines.recv_timeout(Duration::from_secs(5)) {
                    self.stdout.push(l);
                }
                return s.code();
            }
            assert!(
                Instant::now() < deadline,
                "the demo did not exit within {EXIT:?} of the signal\nstderr:\n{}",
                self.stderr()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Demo {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// What of process `pid` is still on the machine, found by the harness's
/// naming (`lcnic-<kind>-<pid>-<n>`) without the harness's code: network
/// namespaces, temp dirs, and live processes of its process group or whose
/// environment names one of its temp dirs.
fn left_behind(pid: i32) -> Vec<String> {
    let tag = format!("-{pid}-");
    let ours = |name: &str| name.starts_with("lcnic-") && name.contains(&tag);
    let mut left = Vec::new();
    for dir in ["/run/netns".into(), std::env::temp_dir()] {
        for e in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            if ours(&e.file_name().to_string_lossy()) {
                left.push(e.path().display().to_string());
            }
        }
    }
    let temp = format!("{}/lcnic-", std::env::temp_dir().display());
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(p) = e.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else {
            continue;
        };
        let stat = std::fs::read_to_string(format!("/proc/{p}/stat")).unwrap_or_default();
        // Fields after the command's closing parenthesis: state, ppid, pgrp.
        let after = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
        let fields: Vec<&str> = after.split_whitespace().collect();
        if fields.first() == Some(&"Z") {
            continue;
        }
        let in_group = fields.get(2) == Some(&pid.to_string().as_str());
        let environ = std::fs::read(format!("/proc/{p}/environ")).unwrap_or_default();
        let environ = String::from_utf8_lossy(&environ);
        let names_ours = environ
            .match_indices(&temp)
            .any(|(i, _)| environ[i..].split(['/', '\0']).nth(2).is_some_and(ours));
        if in_group || names_ours {
            left.push(format!("process {p}: {stat}"));
        }
    }
    left
}

fn interrupted_run(signal_at: &str, signal: impl FnOnce(i32)) {
    let mut demo = Demo::start();
    demo.reach(signal_at);
    let pid = demo.pid();
    signal(pid);
    let code = demo.wait();
    let stderr = demo.stderr();
    assert_eq!(
        code,
        Some(130),
        "an interrupted demo exits 130\nstdout:\n{}\nstderr:\n{stderr}",
        demo.stdout.join("\n")
    );
    assert!(
        demo.stdout.iter().any(|l| l.contains("Interrupted")),
        "the demo says it was interrupted\nstdout:\n{}",
        demo.stdout.join("\n")
    );
    // Its guards removed everything: its own final check found nothing to
    // remove.
    assert!(
        stderr.contains("clean-up checked: no process, network namespace or temp dir"),
        "the demo's guards left something for its final check:\n{stderr}"
    );
    let left = left_behind(pid);
    assert!(left.is_empty(), "left behind: {left:#?}\nstderr:\n{stderr}");
}

fn kill(pid: i32, sig: libc::c_int) {
    // SAFETY: kill(2) has no memory-safety preconditions; the pid (or
    // process group) is the demo we started and have not reaped.
    let rc = unsafe { libc::kill(pid, sig) };
    assert_eq!(
        rc,
        0,
        "kill({pid}, {sig}): {}",
        std::io::Error::last_os_error()
    );
}

/// A terminal's Ctrl-C reaches the demo and every child of its job (the
/// libcni driver, the plugin, `ip`, the installer), here while the first
/// pod is being added.
#[test]
fn ctrl_c_while_a_pod_is_added_leaves_nothing() {
    interrupted_run("3. ", |pid| kill(-pid, libc::SIGINT));
}

/// SIGTERM to the demo alone, while the installer starts.
#[test]
fn sigterm_while_the_installer_starts_leaves_nothing() {
    interrupted_run("2. ", |pid| kill(pid, libc::SIGTERM));
}

/// SIGTERM to the demo alone while the node agent (a process of its own,
/// outside the node's namespace) answers: its guard stops it too.
#[test]
fn sigterm_while_the_node_agent_runs_leaves_nothing() {
    interrupted_run("✓ it answers on", |pid| kill(pid, libc::SIGTERM));
}
