//! Stopping a story early and cleanly: on SIGINT (Ctrl-C), SIGTERM or
//! SIGHUP a flag is set, the story notices it between steps
//! ([`checkpoint`], [`sleep`]) and returns [`Stop::Interrupted`], and the
//! Drop guards of everything it made run as its frames unwind.
//!
//! The signals are blocked and read from a signalfd by a thread of ours, so
//! no handler ever runs in signal context and no `unsafe` is needed. They
//! must be blocked before any other thread starts (threads inherit the
//! mask): [`catch_signals`] comes first in `main`. Children do not inherit
//! the block: the standard library resets the signal mask of every process
//! it spawns.

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::sys::signal::{SigSet, Signal};
use nix::sys::signalfd::{SfdFlags, SignalFd};

static INTERRUPTED: AtomicBool = AtomicBool::new(false);

/// Routes SIGINT, SIGTERM and SIGHUP to the stop flag. Call it first thing
/// in `main`, before any thread is spawned.
pub fn catch_signals() -> Result<(), String> {
    let mut set = SigSet::empty();
    for sig in [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP] {
        set.add(sig);
    }
    set.thread_block()
        .map_err(|e| format!("cannot block SIGINT/SIGTERM/SIGHUP: {e}"))?;
    let fd = SignalFd::with_flags(&set, SfdFlags::SFD_CLOEXEC)
        .map_err(|e| format!("cannot create a signalfd: {e}"))?;
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            loop {
                match fd.read_signal() {
                    Ok(Some(_)) => INTERRUPTED.store(true, Ordering::SeqCst),
                    Ok(None) | Err(Errno::EINTR) => {}
                    Err(_) => return,
                }
            }
        })
        .map_err(|e| format!("cannot start the signal thread: {e}"))?;
    Ok(())
}

/// Whether the story was asked to stop.
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
    /// (a Ctrl-C reaches the story's children too, so the failure is then
    /// most likely its consequence).
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

/// Runs `story` and turns a panic into [`Stop`]: the panic has unwound
/// through the story's frames, so its guards have run. A panic after a
/// signal (a harness step whose child the Ctrl-C killed) is an
/// interruption, not a failure.
pub fn run_story(story: impl FnOnce() -> Result<(), Stop>) -> Result<(), Stop> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(story)) {
        Ok(r) => r,
        Err(panic) => {
            let why = panic
                .downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| panic.downcast_ref::<&str>().copied())
                .unwrap_or("a step panicked");
            Err(Stop::failed(why.to_string()))
        }
    }
}
