//! SIGTERM and SIGINT as a readable file descriptor (signalfd), so the main
//! loop waits for them in the same `poll` as the inotify fd and the resync
//! timer: no handler runs at an arbitrary point, and no thread or async
//! runtime is needed.
//!
//! This matters for PID 1 in a container: the kernel drops signals whose
//! disposition is the default, so without this the kubelet's SIGTERM would be
//! ignored until its grace period ends in SIGKILL.

use std::os::fd::{AsFd, BorrowedFd};

use nix::errno::Errno;
use nix::sys::signal::{SigSet, Signal};
use nix::sys::signalfd::{SfdFlags, SignalFd};

#[derive(Debug)]
pub struct Signals {
    fd: SignalFd,
}

impl Signals {
    /// Blocks SIGTERM and SIGINT for this thread (call it before any other
    /// thread starts) and returns the fd they are delivered to.
    pub fn block() -> Result<Signals, Errno> {
        let mut set = SigSet::empty();
        set.add(Signal::SIGTERM);
        set.add(Signal::SIGINT);
        set.thread_block()?;
        let fd = SignalFd::with_flags(&set, SfdFlags::SFD_NONBLOCK | SfdFlags::SFD_CLOEXEC)?;
        Ok(Signals { fd })
    }

    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// The next pending signal, if any.
    pub fn pending(&self) -> Option<Signal> {
        match self.fd.read_signal() {
            Ok(Some(info)) => Signal::try_from(info.ssi_signo as i32).ok(),
            _ => None,
        }
    }
}
