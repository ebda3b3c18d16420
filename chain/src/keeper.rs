//! The keeper: the one caller that sequences the layouts. Every program
//! that keeps the chain (the plugin at ADD, the installer's pass, the
//! `chain repair` command) builds a [`Context`] and calls [`keep`]; every
//! program that judges it (`chain status`, the installer's readiness check,
//! the repair controller's gate) calls [`health`]. What varies between them
//! is how often a repair may be repeated, which is the [`RepairLimit`] they
//! pass: the installer's in memory, the plugin's on the wall clock
//! ([`crate::FightHistory`] both; the state crate keeps the plugin's in its
//! state dir, recorded under the conf-dir lock), none for the CLI
//! ([`NoLimit`]).
//!
//! The order is what keeps the runtime's active file chained through every
//! transition: a layout's own file is retired only once the other layout
//! holds linkerd-cni. Inline mode repairs the primary's file, then removes
//! our owned files; owned mode writes our file, then takes inline mode's
//! entry out of the primary's. Owned mode falls back to inline repair where
//! it does not apply (a meta-plugin, a primary holding only linkerd-cni,
//! another agent renaming or deleting our file, our file that cannot be
//! written), and our file stays until that repair has put the entry into
//! the primary's file: a refused repair (a fight, a lock held too long, the
//! kubeconfig gone) leaves the node on our copy, never on a chain without
//! linkerd-cni.
//!
//! Everything runs under one deadline, an instant: each step's lock wait
//! and write end by then.

use std::fmt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::fight::content_sha256;
use crate::inline::{self, Diagnosis};
use crate::owned::{self, ChainMode, Marker, OwnedDiagnosis, OwnedState};
use crate::scan::Listing;
use crate::{ChainError, ChainState, Entry, RepairOptions};

/// The mode to keep, and why it was chosen (said by `chain status` and the
/// installer's `check`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModeChoice {
    pub mode: ChainMode,
    pub reason: String,
}

impl ModeChoice {
    pub fn new(mode: ChainMode, reason: impl Into<String>) -> ModeChoice {
        ModeChoice {
            mode,
            reason: reason.into(),
        }
    }

    /// The mode the entry's `chain_mode` selects, and why: the installer's
    /// `auto` records the runtime settings' verdict in the entry
    /// ([`crate::MODE_REASON_KEY`]).
    pub fn of_entry(entry: &Entry) -> Result<ModeChoice, ChainError> {
        let mode = owned::mode_of(entry)?;
        let auto = entry
            .get(crate::MODE_REASON_KEY)
            .and_then(serde_json::Value::as_str);
        let reason = match (auto, entry.get(owned::MODE_KEY)) {
            (Some(why), _) => format!("auto, from the runtime's settings: {why}"),
            (None, Some(_)) => format!("set in the entry ({})", owned::MODE_KEY),
            (None, None) => format!("inline, the default (no {} in the entry)", owned::MODE_KEY),
        };
        Ok(ModeChoice { mode, reason })
    }
}

impl fmt::Display for ModeChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.mode, self.reason)
    }
}

/// What the caller wants kept, and within which bounds.
#[derive(Debug, Clone)]
pub struct Context {
    pub conf_dir: PathBuf,
    pub desired: Entry,
    pub mode: ModeChoice,
    /// Where symlinks lead, whether to write outside the conf dir, and the
    /// file that must exist for anything to be written (the plugin's
    /// kubeconfig). Its lock timeout and deadline are the keeper's: see
    /// [`Context::deadline`].
    pub opts: RepairOptions,
    /// Everything ends by then: lock waits and writes included.
    pub deadline: Instant,
    /// The marker of the owned file the runtime ran, when the plugin was
    /// invoked from one (its stdin): the report says whether that chain
    /// was stale.
    pub ran: Option<Marker>,
}

impl Context {
    /// A context with the default options, ending `budget` from now.
    pub fn new(conf_dir: &Path, desired: Entry, mode: ModeChoice, budget: Duration) -> Context {
        Context {
            conf_dir: conf_dir.to_path_buf(),
            desired,
            mode,
            opts: RepairOptions::default(),
            deadline: Instant::now() + budget,
            ran: None,
        }
    }

    /// The conf dir as this context's repairs see it (symlinks resolved
    /// under its `host_root`), for a diagnosis.
    fn listing(&self) -> Result<Listing, ChainError> {
        owned::list(&self.conf_dir, &self.opts)
    }

    /// The options of one step: its lock wait and its work end at the
    /// deadline.
    fn step(&self) -> RepairOptions {
        RepairOptions {
            lock_timeout: self.deadline.saturating_duration_since(Instant::now()),
            deadline: Some(self.deadline),
            ..self.opts.clone()
        }
    }
}

/// How often a repair of the same content may be repeated: the one thing
/// that differs between the programs that keep the chain.
pub trait RepairLimit {
    /// Whether a repair of `file` from content with `digest` may run now.
    /// Asked without the conf-dir lock: at worst one repair more is made.
    fn allow(&self, file: &Path, digest: &str, now: Instant) -> bool;

    /// When a repair held back by [`RepairLimit::allow`] is allowed again,
    /// if that is known (by default it is not).
    fn next_allowed(&self, _file: &Path, _digest: &str, _now: Instant) -> Option<Instant> {
        None
    }

    /// Records a repair of `file` from content with `digest`, made now;
    /// called while the conf-dir lock is still held. Returns a warning when
    /// this is a fight with another agent.
    fn record(&mut self, file: &Path, digest: &str, now: Instant) -> Option<String>;
}

/// No limit: every repair is made (the `chain repair` command, run by a
/// person).
#[derive(Debug, Clone, Copy, Default)]
pub struct NoLimit;

impl RepairLimit for NoLimit {
    fn allow(&self, _: &Path, _: &str, _: Instant) -> bool {
        true
    }

    fn record(&mut self, _: &Path, _: &str, _: Instant) -> Option<String> {
        None
    }
}

/// Where linkerd-cni's entry is kept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Layout {
    /// Our entry, last, in the primary's file.
    Inline,
    /// Our own file, a copy of the primary's chain.
    Owned,
    /// Owned mode does not apply: inline repair instead, for this reason.
    Fallback(String),
}

/// One change the keeper made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// The inline repair rewrote `file`, which was in state `cause`.
    Repaired { file: PathBuf, cause: ChainState },
    /// Owned mode's file written from the primary's.
    Copied {
        file: PathBuf,
        from: PathBuf,
        created: bool,
    },
    /// One of our owned files removed, and why.
    Retired { file: PathBuf, why: Retired },
    /// Inline mode's entry taken out of `file`, once our own file held us.
    EntryTakenOut { file: PathBuf },
    /// Leftover temp files of a killed write removed.
    Leftovers(usize),
    /// Someone's content displaced by a killed write put back.
    Restored(String),
}

/// Why one of our owned files went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Retired {
    /// The primary's file holds linkerd-cni now (inline mode, or a fallback).
    InlineChained,
    /// Its primary is gone: so must be its copy.
    PrimaryGone,
    /// It copied a file that is no longer the primary.
    Replaced,
}

/// A change that was due and was not made now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeldBack {
    /// The file it was for.
    pub file: PathBuf,
    pub cause: HoldCause,
}

/// Why a change was held back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HoldCause {
    /// The same content was repaired again and again: another agent undoes
    /// it (rate-limited; allowed again at `until`, when known).
    Fight { until: Option<Instant> },
    /// Another linkerd-cni writer held the conf-dir lock past the deadline.
    LockTimeout(String),
    /// The deadline came first.
    Deadline,
    /// The file linkerd-cni writes only while it exists is gone (uninstall,
    /// or an installer that has not run yet).
    Requirement(PathBuf),
    /// Another writer kept changing the file while it was being written.
    Contended(String),
}

/// What [`keep`] found and did, as data: callers log it (see
/// [`Report::lines`]) and count it.
#[derive(Debug)]
pub struct Report {
    pub mode: ModeChoice,
    pub layout: Layout,
    /// What changed, in order, each once.
    pub actions: Vec<Action>,
    pub held_back: Vec<HeldBack>,
    /// Warnings of fights detected by this run's repairs.
    pub fights: Vec<String>,
    /// Steps that failed (the keeper went on where that was safe).
    pub errors: Vec<ChainError>,
    /// Why nothing could be written that would chain the node, when so (no
    /// primary config yet, an unusable one, a repair refused for a reason
    /// a person must address).
    pub waiting: Option<String>,
    /// The file that holds linkerd-cni for the runtime afterwards, when
    /// the keeper knows one does.
    pub chained_in: Option<PathBuf>,
    /// Why the chain the ADD ran (its [`Context::ran`]) is stale, if it is.
    pub stale: Option<String>,
}

impl Report {
    fn new(mode: ModeChoice) -> Report {
        let layout = match mode.mode {
            ChainMode::Inline => Layout::Inline,
            ChainMode::Owned => Layout::Owned,
        };
        Report {
            mode,
            layout,
            actions: vec![],
            held_back: vec![],
            fights: vec![],
            errors: vec![],
            waiting: None,
            chained_in: None,
            stale: None,
        }
    }

    /// Whether anything in the conf dir changed.
    pub fn changed(&self) -> bool {
        !self.actions.is_empty()
    }

    /// When a held-back repair may run again, if known.
    pub fn retry_at(&self) -> Option<Instant> {
        self.held_back
            .iter()
            .filter_map(|h| match h.cause {
                HoldCause::Fight { until } => until,
                _ => None,
            })
            .min()
    }

    /// Whether a person should hear about this run (a change, a hold, a
    /// fight, an error, a fallback or a wait).
    pub fn is_news(&self) -> bool {
        self.changed()
            || !self.held_back.is_empty()
            || !self.fights.is_empty()
            || !self.errors.is_empty()
            || self.waiting.is_some()
            || matches!(self.layout, Layout::Fallback(_))
    }

    /// Whether this is a healthy verdict with nothing done, held or
    /// pending: the same look at the same files gives the same answer
    /// (what the plugin's memo in its state dir remembers).
    pub fn is_steady(&self) -> bool {
        !self.is_news() && self.stale.is_none() && self.chained_in.is_some()
    }

    /// One line per fact, each once, for logs.
    pub fn lines(&self) -> Vec<String> {
        let fallback = match &self.layout {
            Layout::Fallback(why) => Some(format!(
                "owned mode does not apply, using inline repair: {why}"
            )),
            _ => None,
        };
        let facts = fallback
            .into_iter()
            .chain(self.actions.iter().map(Action::to_string))
            .chain(self.held_back.iter().map(HeldBack::to_string))
            .chain(self.fights.iter().cloned())
            .chain(self.errors.iter().map(ChainError::to_string))
            .chain(self.waiting.clone())
            .chain(
                self.stale
                    .iter()
                    .map(|s| format!("the chain that ran was stale: {s}")),
            );
        let mut out: Vec<String> = Vec::new();
        for s in facts {
            if !out.contains(&s) {
                out.push(s);
            }
        }
        out
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let lines = self.lines();
        if lines.is_empty() {
            return match &self.chained_in {
                Some(p) => write!(
                    f,
                    "linkerd-cni is chained in {}; nothing written",
                    p.display()
                ),
                None => f.write_str("nothing written"),
            };
        }
        f.write_str(&lines.join("; "))
    }
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Action::Repaired { file, cause } => write!(
                f,
                "repaired {}: {cause}; the linkerd-cni entry is now last and up to date",
                file.display()
            ),
            Action::Copied { file, from, .. } => {
                write!(f, "wrote {} from {}", file.display(), from.display())
            }
            Action::Retired { file, why } => {
                let why = match why {
                    Retired::InlineChained => {
                        " (the primary's file holds linkerd-cni, so no file of our own is needed)"
                    }
                    Retired::PrimaryGone => ": the primary's config is gone, so must be its copy",
                    Retired::Replaced => " (its primary is gone or replaced)",
                };
                write!(f, "removed {}{why}", file.display())
            }
            Action::EntryTakenOut { file } => write!(
                f,
                "took inline mode's linkerd-cni entry out of {} (our own file holds it)",
                file.display()
            ),
            Action::Leftovers(n) => write!(f, "removed {n} leftover temp file(s)"),
            Action::Restored(note) => f.write_str(note),
        }
    }
}

impl fmt::Display for HeldBack {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let file = self.file.display();
        match &self.cause {
            HoldCause::Fight { .. } => write!(
                f,
                "{file}: not repairing it again yet: another agent keeps undoing it (see the fight warning); retrying as soon as the rate limit allows"
            ),
            HoldCause::LockTimeout(e) | HoldCause::Contended(e) => {
                write!(f, "{file}: not repaired now: {e}")
            }
            HoldCause::Deadline => write!(f, "{file}: not repaired now: the deadline came first"),
            HoldCause::Requirement(r) => write!(
                f,
                "{file}: not writing: {} is gone (linkerd-cni is being uninstalled, or its installer has not run yet)",
                r.display()
            ),
        }
    }
}

/// Brings the conf dir to the state `ctx` asks for, with `limit` on
/// repeated repairs. `Err` only when the conf dir cannot even be looked at;
/// every later trouble is in the report.
pub fn keep(ctx: &Context, limit: &mut dyn RepairLimit) -> Result<Report, ChainError> {
    let mut run = Run {
        ctx,
        limit,
        report: Report::new(ctx.mode.clone()),
    };
    let owned_mode = ctx.mode.mode == ChainMode::Owned;
    // The owned view also tells whether the chain the ADD ran is stale.
    let d = (owned_mode || ctx.ran.is_some())
        .then(|| Ok(owned::diagnose_listing(&ctx.listing()?, &ctx.desired)))
        .transpose()?;
    if let (Some(ran), Some(d)) = (&ctx.ran, &d) {
        run.report.stale = d.stale(ran);
    }
    match d.filter(|_| owned_mode) {
        Some(d) => run.owned(d)?,
        None => run.inline()?,
    }
    Ok(run.report)
}

/// Removes linkerd-cni from the conf dir (uninstall): our own files first,
/// so the primary's becomes the active file again, then every entry of
/// ours from every config. Returns what was removed, one line each.
pub fn unchain(conf_dir: &Path, opts: &RepairOptions) -> Result<Vec<String>, ChainError> {
    let mut lines = Vec::new();
    for f in owned::retire(conf_dir, opts)? {
        lines.push(format!("removed {}", f.display()));
    }
    for f in inline::remove_entries(conf_dir, opts)? {
        lines.push(format!(
            "removed the linkerd-cni entry from {}",
            f.display()
        ));
    }
    Ok(lines)
}

struct Run<'a> {
    ctx: &'a Context,
    limit: &'a mut dyn RepairLimit,
    report: Report,
}

impl Run<'_> {
    /// A failed step: held back when it is a bound being reached, an
    /// error otherwise.
    fn failed(&mut self, file: &Path, e: ChainError) {
        let cause = match &e {
            ChainError::LockTimeout { .. } => HoldCause::LockTimeout(e.to_string()),
            ChainError::Deadline { .. } => HoldCause::Deadline,
            ChainError::Contended { .. } => HoldCause::Contended(e.to_string()),
            _ => {
                self.report.errors.push(e);
                return;
            }
        };
        self.report.held_back.push(HeldBack {
            file: file.to_path_buf(),
            cause,
        });
    }

    /// Inline layout: the entry into the primary's file, then our owned
    /// files out, once the primary's file holds it.
    fn inline(&mut self) -> Result<(), ChainError> {
        let ctx = self.ctx;
        let diag = inline::diagnose_listing(&ctx.listing()?, &ctx.desired).0;
        let chained = if diag.is_healthy() {
            true
        } else if let (Some(why), true, Some(active)) =
            (&diag.refused, diag.state.is_repairable(), &diag.active)
        {
            // A repair is due and may not be made here: a person must act.
            self.report.errors.push(ChainError::Refused {
                path: active.clone(),
                reason: why.clone(),
            });
            false
        } else if !diag.needs_repair() {
            self.report.waiting = Some(waiting(&ctx.conf_dir, &diag));
            false
        } else {
            self.repair(&diag)
        };
        if chained {
            self.report.chained_in = diag.active.clone();
        }
        if diag.owned.is_empty() {
            return Ok(());
        }
        // Our own file is what the runtime loads until the primary's holds
        // linkerd-cni: it goes only then.
        let now = inline::diagnose_listing(&ctx.listing()?, &ctx.desired).0;
        if now.state != ChainState::Healthy {
            self.report.chained_in = diag.owned.first().cloned();
            return Ok(());
        }
        self.report.chained_in = now.active.clone();
        match owned::retire(&ctx.conf_dir, &ctx.step()) {
            Ok(files) => {
                self.report
                    .actions
                    .extend(files.into_iter().map(|file| Action::Retired {
                        file,
                        why: Retired::InlineChained,
                    }))
            }
            Err(e) => {
                let at = diag.owned.first().cloned().unwrap_or_default();
                self.failed(&at, e);
            }
        }
        Ok(())
    }

    /// The inline repair of the active file, within the limit. Whether the
    /// primary's file holds the entry afterwards.
    fn repair(&mut self, diag: &Diagnosis) -> bool {
        let ctx = self.ctx;
        let active = diag.active.clone().unwrap_or_else(|| ctx.conf_dir.clone());
        let now = Instant::now();
        // A fight is the same content undone again and again: keyed by what
        // the repair starts from, so new content is repaired at once.
        let digest = content_sha256(&active);
        if diag.state.is_repairable() && !self.limit.allow(&active, &digest, now) {
            self.report.held_back.push(HeldBack {
                file: active.clone(),
                cause: HoldCause::Fight {
                    until: self.limit.next_allowed(&active, &digest, now),
                },
            });
            return false;
        }
        match inline::repair_locked(&ctx.conf_dir, &ctx.desired, &ctx.step()) {
            Ok((r, _lock)) => {
                self.report.actions.extend(r.recovery);
                if let Some(req) = r.withheld {
                    self.report.held_back.push(HeldBack {
                        file: active,
                        cause: HoldCause::Requirement(req),
                    });
                    return false;
                }
                let Some(file) = r.file else {
                    // Another writer fixed it meanwhile, or only leftovers.
                    return r.before == ChainState::Healthy;
                };
                self.report.actions.push(Action::Repaired {
                    file: file.clone(),
                    cause: r.before,
                });
                // Recorded while the lock is still held.
                if let Some(w) = self.limit.record(&active, &digest, now) {
                    self.report.fights.push(w);
                }
                self.report.chained_in = Some(file);
                true
            }
            Err(e) => {
                self.failed(&active, e);
                false
            }
        }
    }

    /// Owned layout, from the first look `d`.
    fn owned(&mut self, d: OwnedDiagnosis) -> Result<(), ChainError> {
        match &d.state {
            OwnedState::Fallback { reason } => return self.fall_back(reason.clone()),
            OwnedState::PrimaryInvalid { reason } => {
                self.report.waiting = Some(format!(
                    "{}: {reason}; linkerd-cni's own config is left as it is until the primary's is loadable again",
                    d.primary
                        .as_ref()
                        .map_or(String::new(), |p| p.display().to_string())
                ));
                return Ok(());
            }
            OwnedState::Current if d.is_current() => {
                self.report.chained_in = d.ours.clone();
                return Ok(());
            }
            OwnedState::Current => self.report.chained_in = d.ours.clone(),
            OwnedState::NoPrimary if d.is_current() => {
                self.report.waiting = Some(OwnedState::NoPrimary.to_string());
                return Ok(());
            }
            _ => {}
        }
        // Our file removed again and again with the primary's chain the
        // same (repairs of our file are keyed by the marker's digest): an
        // agent that deletes foreign configs. Inline repair rather than a
        // fight.
        if d.state == OwnedState::Missing
            && let (Some(ours), Some(m)) = (&d.ours, &d.marker)
            && !self.limit.allow(ours, &m.sha256, Instant::now())
        {
            return self.fall_back(format!(
                "{} keeps being removed by another agent (Cilium with cni.exclusive=true does this); \
                 configure that agent to leave other configs in place (for Cilium: cni.exclusive=false)",
                ours.display()
            ));
        }
        if d.state != OwnedState::Current && !self.sync(&d)? {
            return Ok(());
        }
        // Our file holds linkerd-cni: inline mode's entry leaves the
        // primary's file (it only matters to runtimes that load every file).
        let ctx = self.ctx;
        match inline::remove_entries(&ctx.conf_dir, &ctx.step()) {
            Ok(files) => self
                .report
                .actions
                .extend(files.into_iter().map(|file| Action::EntryTakenOut { file })),
            Err(e) => self.failed(&ctx.conf_dir, e),
        }
        Ok(())
    }

    /// Writes our file; whether it is current afterwards (`Ok(false)` also
    /// when the keeper fell back to inline repair).
    fn sync(&mut self, d: &OwnedDiagnosis) -> Result<bool, ChainError> {
        let ctx = self.ctx;
        let ours = d.ours.clone().unwrap_or_else(|| ctx.conf_dir.clone());
        let now = Instant::now();
        let r = match owned::sync(&ctx.conf_dir, &ctx.desired, &ctx.step()) {
            Ok(r) => r,
            Err(
                e @ (ChainError::LockTimeout { .. }
                | ChainError::Deadline { .. }
                | ChainError::Contended { .. }),
            ) => {
                self.failed(&ours, e);
                return Ok(false);
            }
            // Our file cannot be written (a directory squatting its name,
            // a full or read-only file system): inline repair keeps the
            // node chained meanwhile.
            Err(e) => {
                let why = format!("linkerd-cni's own config cannot be written: {e}");
                return self.fall_back(why).map(|()| false);
            }
        };
        self.report.actions.extend(r.actions);
        if r.created
            && let (Some(ours), Some(m)) = (&d.ours, &d.marker)
            && let Some(w) = self.limit.record(ours, &m.sha256, now)
        {
            self.report.fights.push(w);
        }
        if let Some(req) = r.withheld {
            self.report.held_back.push(HeldBack {
                file: ours,
                cause: HoldCause::Requirement(req),
            });
            return Ok(false);
        }
        match r.after {
            OwnedState::Current => {
                self.report.chained_in = Some(ours);
                Ok(true)
            }
            OwnedState::Fallback { reason } => self.fall_back(reason).map(|()| false),
            OwnedState::NoPrimary => {
                self.report.waiting = Some(OwnedState::NoPrimary.to_string());
                Ok(false)
            }
            other => {
                self.report.waiting = Some(format!("owned mode: {other}"));
                Ok(false)
            }
        }
    }

    fn fall_back(&mut self, reason: String) -> Result<(), ChainError> {
        self.report.layout = Layout::Fallback(reason);
        self.inline()
    }
}

/// Why the inline layout cannot chain the node now.
fn waiting(conf_dir: &Path, d: &Diagnosis) -> String {
    match (&d.active, &d.state) {
        (None, _) => format!(
            "no primary CNI config in {} yet: waiting for the primary CNI to write one (nothing written)",
            conf_dir.display()
        ),
        (Some(a), state) => format!("{}: {state}; repair would do {}", a.display(), d.remedy()),
    }
}

/// The chain as the runtime will load it, judged in the context's mode:
/// the one definition of healthy.
#[derive(Debug, Clone)]
pub struct Health {
    pub mode: ModeChoice,
    pub layout: Layout,
    /// The inline layout's view (the primary's file).
    pub inline: Diagnosis,
    /// The owned layout's view, in owned mode.
    pub owned: Option<OwnedDiagnosis>,
    chained: bool,
    healthy: bool,
}

impl Health {
    /// Nothing for [`keep`] to do: linkerd-cni is chained in the mode's
    /// layout, and nothing of ours is left to clean (leftover temp files,
    /// files of the other layout).
    pub fn is_healthy(&self) -> bool {
        self.healthy
    }

    /// The runtime's active file holds linkerd-cni last: pods started now
    /// get their rules (leftovers and files still to retire do not change
    /// that). What the repair controller waits for before deleting pods.
    pub fn is_chained(&self) -> bool {
        self.chained
    }

    /// One line for people: what is wrong, or that nothing is.
    pub fn summary(&self) -> String {
        if self.healthy {
            return format!("healthy ({} mode)", self.mode.mode);
        }
        match (&self.layout, &self.owned) {
            (Layout::Owned, Some(o)) => format!("owned mode: {}", o.state),
            _ => match &self.inline.active {
                Some(a) => format!("{}: {}", a.display(), self.inline.state),
                None => self.inline.state.to_string(),
            },
        }
    }
}

impl fmt::Display for Health {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "mode:          {}", self.mode.mode)?;
        writeln!(f, "mode chosen:   {}", self.mode.reason)?;
        match (&self.layout, &self.owned) {
            (Layout::Inline, _) | (_, None) => {
                write!(f, "{}", self.inline)?;
                if !self.inline.owned.is_empty() {
                    writeln!(
                        f,
                        "note:          linkerd-cni's own config (owned mode) is still in place; repair removes it once the primary's file is chained"
                    )?;
                }
            }
            (Layout::Owned, Some(o)) => write!(f, "{o}")?,
            (Layout::Fallback(_), Some(o)) => {
                write!(f, "{o}")?;
                writeln!(f, "inline chain (used instead):")?;
                write!(f, "{}", self.inline)?;
            }
        }
        Ok(())
    }
}

/// Judges the conf dir in the context's mode (read-only: no lock, no
/// write).
pub fn health(ctx: &Context) -> Result<Health, ChainError> {
    let mut listing = ctx.listing()?;
    if !listing.leftovers.is_empty() {
        // A repair's temp files exist until its content is on disk, after
        // the runtime already loads it: while a writer holds the lock they
        // are in flight, not left over.
        let seen = std::mem::take(&mut listing.leftovers);
        listing.leftovers = crate::lock::unless_writing(&ctx.conf_dir, || {
            seen.into_iter()
                .filter(|p| p.symlink_metadata().is_ok())
                .collect()
        })
        .unwrap_or_default();
    }
    let inline = inline::diagnose_listing(&listing, &ctx.desired).0;
    let runtime_active = inline.runtime_active();
    let ours_active = runtime_active.is_some() && runtime_active != inline.active;
    let inline_chained = inline.state == ChainState::Healthy || ours_active;
    let (layout, owned, chained, healthy) = match ctx.mode.mode {
        ChainMode::Inline => (
            Layout::Inline,
            None,
            inline_chained,
            inline.is_healthy() && inline.owned.is_empty(),
        ),
        ChainMode::Owned => {
            let o = owned::diagnose_listing(&listing, &ctx.desired);
            match &o.state {
                OwnedState::Fallback { reason } => {
                    let healthy = inline.is_healthy() && o.owned.is_empty();
                    (
                        Layout::Fallback(reason.clone()),
                        Some(o),
                        inline_chained,
                        healthy,
                    )
                }
                state => {
                    let chained =
                        ours_active && matches!(state, OwnedState::Current | OwnedState::Outdated);
                    // No primary config is not healthy either: nothing is
                    // chained.
                    let healthy = *state == OwnedState::Current && o.is_current();
                    (Layout::Owned, Some(o), chained, healthy)
                }
            }
        }
    };
    Ok(Health {
        mode: ctx.mode.clone(),
        layout,
        inline,
        owned,
        chained,
        healthy,
    })
}

#[cfg(test)]
mod tests;
