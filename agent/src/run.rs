//! The DaemonSet's long-running loop.
//!
//! Level-triggered: a full reconcile at start, then every resync period, and
//! soon after any relevant file-system event. The watch is armed before the
//! first reconcile, so a change made while that reconcile runs wakes the loop
//! again; and a change no event reports (a lost or overflowed event, a watch
//! that could not be armed, the seed bug upstream had) waits at most one
//! resync period. A repair held back by the fight rate limit wakes the
//! loop at the time the limit allows it. After a full pass, the
//! installer's heartbeat is written (see [`Installer::beat`]) and the
//! startup taint's gate (see [`crate::taint`]) looks at the node once.
//!
//! A network config written in the conf dir is acted on at once, every
//! time, with the chain alone: a pod created right after the primary's
//! write must find the chain repaired, however soon the primary writes
//! again. Our own repair writes wake the loop too; that pass finds the
//! chain healthy and writes nothing, so it costs a read of the conf dir and
//! never delays the next repair. Events are read in batches, so a writer
//! faster than a pass costs one pass at a time, not one per event. Other
//! events (kubeconfig, binaries, credentials, template, the runtime's
//! settings `auto` reads) are debounced: the first after a quiet spell is
//! acted on at once, so a runtime reconfigured from loading one config
//! file to loading several has its mode re-decided within a second, before
//! pods started meanwhile are attached twice.

use std::os::fd::AsFd;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::signal::{SigSet, Signal};
use nix::sys::signalfd::{SfdFlags, SignalFd};

use crate::config::OnExit;
use crate::installer::Installer;
use crate::owner::{self, Verdict};
use crate::repair::args::Args;
use crate::repair::cli::Beside;
use crate::taint::StartupTaint;
use crate::watch::Watcher;

/// For the events that call for a whole pass (see [`crate::watch::Wanted`]):
/// the first after a quiet spell is acted on at once; those that follow
/// within this much of it (the rest of a burst: the kubelet swapping a
/// secret, a binary copied in several steps) wait for this much quiet, so
/// a burst costs one more pass rather than one per event.
const DEBOUNCE: Duration = Duration::from_millis(100);
/// ...but never wait longer than this after the first event of a burst.
const DEBOUNCE_MAX: Duration = Duration::from_secs(1);

enum Wake {
    /// A network config changed: the chain, now.
    Chain,
    /// A whole pass: the resync period is over, a held-back repair is due,
    /// or something else changed.
    Full,
    Signal(Signal),
}

/// The debounce of whole-pass events, kept across chain passes.
#[derive(Default)]
struct Debounce {
    /// When such an event last woke the loop.
    last_woke: Option<Instant>,
    /// A burst waiting for quiet: (its first event, its last event).
    burst: Option<(Instant, Instant)>,
}

impl Debounce {
    /// An event calling for a whole pass, at `now`: whether to act at once.
    fn event(&mut self, now: Instant) -> bool {
        if self.burst.is_none()
            && self
                .last_woke
                .is_none_or(|t| now.duration_since(t) >= DEBOUNCE)
        {
            self.last_woke = Some(now);
            return true;
        }
        self.burst = Some(self.burst.map_or((now, now), |(first, _)| (first, now)));
        false
    }

    /// When the burst waiting for quiet is due, if one is.
    fn due(&self) -> Option<Instant> {
        self.burst
            .map(|(first, last)| (last + DEBOUNCE).min(first + DEBOUNCE_MAX))
    }

    /// A whole pass is starting: it covers the burst.
    fn covered(&mut self, now: Instant) {
        if self.burst.take().is_some() {
            self.last_woke = Some(now);
        }
    }
}

/// The loop; with `repair`, the repair controller beside it (see
/// [`crate::repair::cli::from_env`]), stopped before SIGTERM's uninstall.
pub fn run(mut inst: Installer, repair: Option<Args>) -> ExitCode {
    let signals = match block_signals() {
        Ok(s) => s,
        Err(e) => {
            tracing::error!("cannot set up signal handling: {e}");
            return ExitCode::FAILURE;
        }
    };
    // After the signals are blocked: its thread inherits that.
    let mut registry = prometheus_client::registry::Registry::default();
    let repair = match repair.map(|a| Beside::start(a, &mut registry)).transpose() {
        Ok(r) => r,
        Err(e) => {
            tracing::error!("{e}");
            return ExitCode::FAILURE;
        }
    };
    let cfg = inst.config().clone();
    let mut watcher = cfg
        .watch
        .then(|| Watcher::new(inst.watch_targets()))
        .transpose()
        .unwrap_or_else(|e| {
            tracing::warn!(
                "cannot use inotify ({e}); relying on the periodic reconcile every {:?}",
                cfg.resync
            );
            None
        });
    tracing::info!(
        "starting: conf dir {}, bin dir {}, resync every {:?}, watch {}",
        cfg.conf_dir().display(),
        cfg.bin_dir().display(),
        cfg.resync,
        match &watcher {
            Some(w) => format!(
                "on ({})",
                w.dirs()
                    .map(|d| d.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            None => "off".into(),
        }
    );
    inst.clean_stale_temps();
    let mut taint = StartupTaint::new(&cfg);
    let _admin = crate::metrics::setup(&mut inst, registry, repair.as_ref());

    let mut debounce = Debounce::default();
    let mut full = true;
    let mut last_full = Instant::now();
    loop {
        if let Some(w) = watcher.as_mut() {
            if full {
                // Before the pass reads them: a change while it runs wakes
                // the loop again.
                w.add_settings(crate::runtime::settings_watch(&cfg));
            }
            for (dir, errno) in w.arm() {
                tracing::warn!(
                    "cannot watch {} ({errno}); changes there are picked up by the periodic reconcile",
                    dir.display()
                );
            }
        }
        if full {
            last_full = Instant::now();
            debounce.covered(last_full);
            inst.reconcile();
            inst.beat();
            taint.after_pass(&inst);
        } else {
            inst.reconcile_chain_now();
        }
        inst.after_pass();
        // A repair held back by the rate limit is retried as soon as the
        // limit allows, not a whole resync later.
        let resync = last_full + cfg.resync;
        let next = inst.retry_at().map_or(resync, |t| t.min(resync));
        full = match wait(&signals, watcher.as_mut(), next, &mut debounce) {
            Wake::Full => true,
            Wake::Chain => false,
            Wake::Signal(sig) => {
                // Stopped (within its bound) before the uninstall starts.
                drop(repair);
                return shutdown(&inst, sig);
            }
        };
    }
}

/// SIGTERM and SIGINT blocked for this thread (before any other thread
/// starts: they inherit that), and the readable file descriptor (signalfd)
/// they are delivered to, so the loop waits for them in the same `poll` as
/// the inotify fd and the resync timer: no handler runs at an arbitrary
/// point, and no thread or async runtime is needed. This matters for PID 1
/// in a container: the kernel drops signals whose disposition is the
/// default, so without this the kubelet's SIGTERM would be ignored until
/// its grace period ends in SIGKILL.
fn block_signals() -> Result<SignalFd, Errno> {
    let set = SigSet::from_iter([Signal::SIGTERM, Signal::SIGINT]);
    set.thread_block()?;
    SignalFd::with_flags(&set, SfdFlags::SFD_NONBLOCK | SfdFlags::SFD_CLOEXEC)
}

/// SIGTERM: uninstall only when the API server says the DaemonSet is gone
/// or being deleted (or always, or never, as configured); otherwise leave
/// everything (and say why), so that a rolling update, a restart or a
/// force-delete never unchains pods.
fn shutdown(inst: &Installer, sig: Signal) -> ExitCode {
    // Err: why everything stays.
    let why = match inst.config().on_exit {
        OnExit::Leave => Err("LINKERD_CNI_UNINSTALL_ON_EXIT=false".to_string()),
        OnExit::Uninstall => Ok("LINKERD_CNI_UNINSTALL_ON_EXIT=true".to_string()),
        OnExit::Auto => match owner::ask(inst.config()) {
            Verdict::Uninstall(how) => Ok(how),
            Verdict::Present(how) => Err(format!("{how}: a rolling update or a restart")),
            Verdict::CannotTell(why) => {
                let why = why.trim_end_matches('.');
                tracing::warn!(
                    "{sig}: exiting; linkerd-cni stays installed and chained: cannot tell whether \
                     the DaemonSet is being deleted: {why}. If it is being deleted (an uninstall), \
                     the plugin passes pods through once no installer beats on this node; remove \
                     what is left by running `linkerd-cni-installer uninstall` on the node, or by \
                     deleting the linkerd-cni entry from the node's CNI config and the \
                     ZZZ-linkerd-cni-* files next to it."
                );
                return ExitCode::SUCCESS;
            }
        },
    };
    let why = match why {
        Ok(why) => why,
        Err(stay) => {
            tracing::info!("{sig}: exiting; linkerd-cni stays installed and chained ({stay})");
            return ExitCode::SUCCESS;
        }
    };
    tracing::info!("{sig}: uninstalling ({why})");
    inst.telemetry().uninstalling(&why);
    uninstall(inst, "uninstalled; exiting")
}

/// [`Installer::uninstall`], its outcome the exit code: `done` logged when
/// it is complete.
pub fn uninstall(inst: &Installer, done: &str) -> ExitCode {
    match inst.uninstall() {
        Ok(()) => {
            tracing::info!("{done}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            tracing::error!("uninstall incomplete: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Sleeps until the resync deadline, a signal, or a relevant event,
/// whichever comes first: at once for a network config's change; for the
/// other events, at once for the first after a quiet spell, debounced
/// within a burst.
fn wait(
    signals: &SignalFd,
    mut watcher: Option<&mut Watcher>,
    deadline: Instant,
    debounce: &mut Debounce,
) -> Wake {
    loop {
        if let Ok(Some(info)) = signals.read_signal()
            && let Ok(sig) = Signal::try_from(info.ssi_signo as i32)
        {
            return Wake::Signal(sig);
        }
        // The resync deadline, or the end of a burst's debounce.
        let until = debounce.due().map_or(deadline, |t| t.min(deadline));
        let now = Instant::now();
        if now >= until {
            return Wake::Full;
        }
        let timeout = PollTimeout::try_from(until - now).unwrap_or(PollTimeout::MAX);
        let mut fds = vec![PollFd::new(signals.as_fd(), PollFlags::POLLIN)];
        if let Some(w) = watcher.as_deref() {
            fds.push(PollFd::new(w.fd(), PollFlags::POLLIN));
        }
        match poll(&mut fds, timeout) {
            Ok(_) | Err(Errno::EINTR) => {}
            Err(e) => {
                // Should not happen; fall back to sleeping to the deadline in
                // small steps rather than spinning.
                tracing::warn!("poll failed: {e}");
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        drop(fds);
        // Whatever woke the poll: reading an inotify fd never blocks.
        let wanted = watcher
            .as_deref_mut()
            .map(Watcher::drain)
            .unwrap_or_default();
        if wanted.full && debounce.event(Instant::now()) {
            return Wake::Full;
        }
        if wanted.chain {
            return Wake::Chain;
        }
    }
}
