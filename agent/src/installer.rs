//! One reconcile pass, the readiness check, and uninstall.
//!
//! A pass recomputes everything from the state on disk, in the order the
//! node needs it: binaries, kubeconfig, persisted entry, chain. Nothing is
//! remembered between passes except what to log (see [`crate::notes`]) and
//! the repair history that detects a fight with another agent; so whatever
//! happened in between (a missed event, a restart, a rotated token), the
//! pass converges on the right state.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use linkerd_cni_chain::owned::ChainMode;
use linkerd_cni_chain::{
    self as chain, Context, FightHistory, Layout, ModeChoice, RepairOptions, Report, write,
};
use linkerd_cni_state::{heartbeat, record};
use tracing::Level;

use crate::binaries::{self, Binary, PLUGIN_BINARY};
use crate::config::{self, Config};
use crate::credential::{self, Credential};
use crate::entry::Entry;
use crate::fsutil;
use crate::kubeconfig::{self, KubeconfigError, KubeconfigState};
use crate::metrics::{self, Telemetry};
use crate::notes::Notes;
use crate::watch::Filter;

/// The longest a pass may spend repairing the chain: a pass must stay short
/// so that SIGTERM is answered promptly.
const REPAIR_BUDGET: Duration = Duration::from_secs(3);

/// How long an uninstall keeps the plugin binary after taking the last
/// entry out of the configs. A runtime loads the chain once per ADD (or
/// DEL), then runs its plugins one after another, looking each up in the
/// bin dir just before running it: an ADD that loaded the chain before the
/// unchain reaches linkerd-cni after the runtime's reload (containerd:
/// 7-17 ms) and the primary's own plugins (an IPAM call can take seconds on
/// a busy node), and fails with `failed to find plugin "linkerd-cni"` if
/// the binary is gone by then. The plugin cannot announce such an ADD: the
/// window is before its process exists (once running, it no longer needs
/// the file), so the bound is a time. Meanwhile the kubeconfig is gone, so
/// a late ADD passes its pod through. 5 s keeps the whole SIGTERM (at most
/// 5 s of API questions, then this) within the chart's preStop
/// (`kill -15 1; sleep 15s`) and the default 30 s grace period; a SIGKILL
/// during the wait leaves the binary and no config naming it: harmless,
/// and the next install overwrites it.
const UNINSTALL_DRAIN: Duration = Duration::from_secs(5);
/// This many repairs of the same content of one file within the window is a
/// fight; repairs of that content are then limited to one per window /
/// threshold (6 s). A primary writing new content is repaired at once each
/// time; one that rewrites the same content now and then (a restart, an
/// upgrade) stays far below.
const FIGHT_WINDOW: Duration = Duration::from_secs(60);
const FIGHT_THRESHOLD: u32 = 10;

pub struct Installer {
    cfg: Config,
    bins: Vec<Binary>,
    notes: Notes,
    fights: FightHistory,
    /// The last entry rendered successfully: used while a template file is
    /// unreadable or broken, so a bad ConfigMap edit does not unchain pods.
    last_entry: Entry,
    /// Whether the previous pass got as far as the chain (binaries
    /// installed, kubeconfig written).
    chained_last_pass: bool,
    /// Whether the last pass left the kubeconfig current: the heartbeat
    /// ([`Installer::beat`]) promises the plugin that it is.
    kubeconfig_current: bool,
    /// When the last pass held a repair back (another agent keeps undoing
    /// it), the time it is allowed again: the loop wakes then rather than
    /// at the next resync.
    retry_at: Option<Instant>,
    /// What the passes did, for `/metrics` (records nothing when off).
    telemetry: Telemetry,
    /// The plugin's token for the kubeconfig.
    credential: Credential,
    /// What the last look at the plugin's access found (see
    /// [`credential::plugin_access`]): told to the plugin in the heartbeat.
    plugin_denied: Option<String>,
    /// The plugin's count of ADDs with rejected credentials, at the last
    /// look: a change is what makes the installer look again.
    rejections_seen: Option<u64>,
}

impl Installer {
    pub fn new(cfg: Config, bins: Vec<Binary>, entry: Entry) -> Installer {
        Installer {
            cfg,
            bins,
            notes: Notes::default(),
            fights: FightHistory::in_memory(FIGHT_WINDOW, FIGHT_THRESHOLD),
            last_entry: entry,
            chained_last_pass: false,
            kubeconfig_current: false,
            retry_at: None,
            telemetry: Telemetry::default(),
            credential: Credential::default(),
            plugin_denied: None,
            rejections_seen: None,
        }
    }

    /// Records what each pass does into `t` from now on.
    pub fn set_telemetry(&mut self, t: Telemetry) {
        self.telemetry = t;
    }

    pub fn telemetry(&self) -> &Telemetry {
        &self.telemetry
    }

    /// What a scrape reads besides the passes' state: the plugin's state
    /// dir (the entry's `state_dir`, on the host) and the token.
    pub fn metrics_sources(&self) -> metrics::Sources {
        metrics::Sources {
            plugin_state_dir: self.state_dir(),
            token_file: self.cfg.service_account_dir.join("token"),
            kubeconfig: self.cfg.kubeconfig_path(),
        }
    }

    /// When the last pass held a repair back, when to try again.
    pub fn retry_at(&self) -> Option<Instant> {
        self.retry_at
    }

    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// The directories a watch covers, and what matters in each (the
    /// runtime's settings as they are now: the loop adds those it reads
    /// later).
    pub fn watch_targets(&self) -> Vec<(PathBuf, Filter)> {
        let cfg = &self.cfg;
        let mut targets = vec![
            (
                cfg.conf_dir(),
                Filter::ConfigsAnd(vec![
                    cfg.kubeconfig_file_name.clone(),
                    chain::ENTRY_FILE.to_string(),
                ]),
            ),
            (
                cfg.bin_dir(),
                Filter::Names(self.bins.iter().map(|b| b.name.clone()).collect()),
            ),
            (cfg.service_account_dir.clone(), Filter::Any),
        ];
        let mut extra = |p: &Path| {
            if let Some(dir) = p.parent()
                && !targets.iter().any(|(d, _)| d == dir)
            {
                targets.push((dir.to_path_buf(), Filter::Any));
            }
        };
        extra(&cfg.kube_ca_file);
        if let Some(f) = &cfg.template_file {
            extra(f);
        }
        let settings = crate::runtime::settings_watch(cfg).into_iter();
        targets.extend(settings.map(|(dir, names)| (dir, Filter::Settings(names))));
        targets
    }

    /// Removes temp files a crashed predecessor left behind. In the conf dir
    /// under its lock: a plugin's repair may be writing one there right now.
    pub fn clean_stale_temps(&self) {
        let conf_dir = self.cfg.conf_dir();
        let mut removed = write::remove_leftovers(&self.cfg.bin_dir());
        match chain::lock_dir(&conf_dir, RepairOptions::default().lock_timeout, None) {
            Ok(_lock) => removed.extend(write::remove_leftovers(&conf_dir)),
            // The next repair removes them, under the lock.
            Err(e) => tracing::warn!(
                "leftover temp files in {} stay for now: {e}",
                conf_dir.display()
            ),
        }
        for p in removed {
            tracing::info!(
                "removed {}: a temp file left by an interrupted write",
                p.display()
            );
        }
    }

    /// One pass. Never fails: every problem is logged (once) and retried on
    /// the next pass.
    pub fn reconcile(&mut self) {
        self.retry_at = None;
        // The chain first when the previous pass got as far as the chain:
        // a pod created right after the primary's write must find the chain
        // repaired, and comparing the binaries reads megabytes. The full
        // order (binaries and kubeconfig before any config names them)
        // holds whenever it did not.
        if std::mem::take(&mut self.chained_last_pass) {
            self.reconcile_chain();
        }
        let bins_ok = self.reconcile_binaries();
        self.kubeconfig_current = self.reconcile_kubeconfig();
        if !self.kubeconfig_current {
            // The plugin could not look any pod up: every ADD outside the
            // exempt namespaces would fail. Chain nothing (what is already
            // there stays: with no heartbeat after this pass, the plugin
            // passes pods through once their credentials are rejected and
            // the last beat is stale).
            self.notes.log_change(
                "chain",
                Level::WARN,
                "writing no entry and leaving the chain alone until the kubeconfig can be written"
                    .to_string(),
            );
            return;
        }
        self.reconcile_entry();
        if !bins_ok {
            // A conflist must never name a plugin the node does not have.
            self.notes.log_change(
                "chain",
                Level::WARN,
                format!("leaving the chain alone until {PLUGIN_BINARY} is installed"),
            );
            return;
        }
        self.reconcile_chain();
        self.chained_last_pass = true;
    }

    /// The chain alone, with the last entry rendered: what a network
    /// config's change calls for. The whole pass instead while the last one
    /// did not get as far as the chain (binaries and kubeconfig come first).
    pub fn reconcile_chain_now(&mut self) {
        if !self.chained_last_pass {
            return self.reconcile();
        }
        self.retry_at = None;
        self.reconcile_chain();
    }

    fn reconcile_binaries(&mut self) -> bool {
        let mut ok = true;
        for b in &self.bins {
            let topic = format!("binary {}", b.name);
            match binaries::ensure(b) {
                Ok(None) => self
                    .notes
                    .clear(&topic, || format!("{} is installed", b.dest.display())),
                Ok(Some(before)) => {
                    tracing::info!(
                        "installed {} from {}: the node's copy was {before}",
                        b.dest.display(),
                        b.source.display()
                    );
                    self.notes.clear_silently(&topic);
                }
                Err(e) => {
                    ok = false;
                    self.notes.log_change(
                        &topic,
                        Level::ERROR,
                        format!("cannot install {}: {e}", b.dest.display()),
                    );
                }
            }
        }
        ok
    }

    /// Whether the kubeconfig is current.
    fn reconcile_kubeconfig(&mut self) -> bool {
        let path = self.cfg.kubeconfig_path();
        if self.cfg.agent_only {
            return self.no_kubeconfig(&path);
        }
        let written = self
            .credential
            .token(&self.cfg)
            .and_then(|token| kubeconfig::ensure(&self.cfg, token.as_deref()));
        match written {
            Ok(None) => {
                self.notes
                    .clear("kubeconfig", || format!("{} is current", path.display()));
                true
            }
            Ok(Some(before)) => {
                tracing::info!("wrote {}: it was {before}", path.display());
                self.notes.clear_silently("kubeconfig");
                true
            }
            Err(e) => {
                self.notes.log_change(
                    "kubeconfig",
                    Level::ERROR,
                    format!("cannot write the kubeconfig {}: {e}", path.display()),
                );
                false
            }
        }
    }

    /// With `LINKERD_CNI_AGENT_ONLY`, no credential of the plugin's on the
    /// node's disk: none minted, none written, and one an earlier installer
    /// wrote removed. Whether none is left.
    fn no_kubeconfig(&mut self, path: &Path) -> bool {
        match std::fs::remove_file(path) {
            Ok(()) => tracing::info!(
                "removed {}: LINKERD_CNI_AGENT_ONLY keeps no credential on the node",
                path.display()
            ),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                self.notes.log_change(
                    "kubeconfig",
                    Level::ERROR,
                    format!(
                        "cannot remove {} (LINKERD_CNI_AGENT_ONLY keeps no credential on the \
                         node): {e}",
                        path.display()
                    ),
                );
                return false;
            }
        }
        self.notes.clear_silently("kubeconfig");
        true
    }

    /// The entry the template renders (else the last that rendered),
    /// persisted in the conf dir.
    fn reconcile_entry(&mut self) {
        match self.cfg.desired() {
            Ok((e, mode)) => {
                self.notes.clear("template", || {
                    format!("{} renders again", self.cfg.template_var())
                });
                crate::runtime::log_mode(&mut self.notes, &mode, &self.cfg.mount_prefix);
                self.last_entry = e;
            }
            Err(e) => self.notes.log_change(
                "template",
                Level::ERROR,
                format!("{e}; keeping the last entry that rendered"),
            ),
        }
        let dir = self.cfg.conf_dir();
        match chain::persist_entry(&dir, &self.last_entry) {
            Ok(None) => self.notes.clear("entry", || {
                format!("the desired entry is persisted in {}", dir.display())
            }),
            Ok(Some(why)) => {
                tracing::info!(
                    "wrote the desired entry to {}: {why}",
                    dir.join(chain::ENTRY_FILE).display()
                );
                self.notes.clear_silently("entry");
            }
            Err(e) => self.notes.log_change(
                "entry",
                Level::ERROR,
                format!("cannot persist the desired entry in {}: {e}", dir.display()),
            ),
        }
    }

    /// The plugin's state dir as the installer reaches it: where the
    /// plugin looks (the entry's `state_dir`, by the one rule both follow),
    /// under the mount prefix.
    pub fn state_dir(&self) -> PathBuf {
        let (host, _) =
            heartbeat::state_dir_of(self.last_entry.as_map(), &self.cfg.dest_cni_net_dir);
        config::under_prefix(&self.cfg.mount_prefix, &host)
    }

    /// After a pass: tells the plugin, through the heartbeat in its state
    /// dir (never in the conf dir), that an installer is alive here and the
    /// kubeconfig current, so that a token the API server rejects is worth
    /// retrying. Nothing after a pass that could not write the kubeconfig:
    /// the plugin then takes the installer for gone once the last beat is
    /// old enough.
    pub fn beat(&mut self) {
        let dir = self.state_dir();
        // The plugin's counters, read once per full pass: for the look at
        // its RBAC here and for the Event.
        let rejections = credential::plugin_rejections(&dir);
        if let Some(n) = rejections {
            self.telemetry.plugin_rejections(n);
        }
        if !self.kubeconfig_current {
            return;
        }
        self.look_at_plugin_access(rejections);
        let beat = heartbeat::Beat {
            plugin_denied: self.plugin_denied.clone(),
            ..heartbeat::Beat::now(self.cfg.resync)
        };
        match record::write(&dir, &beat) {
            Ok(()) => self.notes.clear("heartbeat", || {
                format!("the heartbeat in {} is written again", dir.display())
            }),
            Err(e) => self.notes.log_change(
                "heartbeat",
                Level::WARN,
                format!(
                    "cannot write the heartbeat in {}: {e}; the plugin takes this installer for \
                     gone and passes pods through when the API server rejects its token \
                     (mount the host's {} into the installer container)",
                    dir.display(),
                    heartbeat::DEFAULT_STATE_DIR
                ),
            ),
        }
    }

    /// Asks whether the plugin's token may get pods when the plugin has
    /// counted new ADDs with rejected credentials since the last
    /// look, and on every pass while the answer was no (until the RBAC is
    /// back): one API call then, none on a node where nothing is rejected
    /// (nor at start).
    fn look_at_plugin_access(&mut self, rejections: Option<u64>) {
        let first_look = self.rejections_seen.is_none();
        if rejections == self.rejections_seen && self.plugin_denied.is_none() {
            return;
        }
        self.rejections_seen = rejections;
        if first_look {
            // What was counted before this installer started is no news.
            return;
        }
        let was = self.plugin_denied.clone();
        self.plugin_denied =
            credential::plugin_access(&mut self.credential, &self.cfg, was.clone());
        match (&was, &self.plugin_denied) {
            (None, Some(why)) => tracing::error!(
                "the plugin's credentials may not read pods: {why}; pods on this node pass \
                 through without linkerd's rules until the plugin's ClusterRole and \
                 ClusterRoleBinding are restored (deploy/linkerd-cni.yaml)"
            ),
            (Some(_), None) => {
                tracing::info!("the plugin's credentials may read pods again")
            }
            _ => {}
        }
    }

    /// The chain as a pass would keep it now, judged (read-only), for the
    /// entry this installer was made with: the template's, or without a
    /// template the entry the running installer wrote.
    pub fn chain_verdict(&self) -> metrics::Verdict {
        metrics::verdict(&context(&self.cfg, &self.last_entry))
    }

    /// The chain, kept in the entry's mode; what the keeper did, logged
    /// once per change.
    fn reconcile_chain(&mut self) {
        let ctx = context(&self.cfg, &self.last_entry);
        self.telemetry.before_keep(&ctx.conf_dir);
        match chain::keep(&ctx, &mut self.fights) {
            Ok(report) => self.log_report(&report),
            Err(e) => self.notes.log_change(
                "chain",
                Level::ERROR,
                format!(
                    "cannot read the CNI configs in {}: {e}",
                    ctx.conf_dir.display()
                ),
            ),
        }
    }

    /// After each pass, however it ended: what `/metrics` shows of it (the
    /// chain as the pass left it, diagnosed only when metrics are on).
    pub fn after_pass(&mut self) {
        let (cfg, entry) = (&self.cfg, &self.last_entry);
        self.telemetry
            .pass_done(|| metrics::verdict(&context(cfg, entry)));
    }

    fn log_report(&mut self, r: &Report) {
        self.retry_at = r.retry_at();
        for a in &r.actions {
            tracing::info!("{a}");
        }
        self.telemetry.report(r);
        match (&r.layout, r.mode.mode) {
            (Layout::Fallback(why), _) => {
                self.notes
                    .log_change("owned", Level::WARN, format!("{why}; using inline repair"))
            }
            (_, ChainMode::Owned) => self
                .notes
                .clear("owned", || "owned mode applies again".to_string()),
            _ => {}
        }
        match r.fights.first() {
            Some(w) => self.notes.log_change("fight", Level::WARN, w.clone()),
            None if r.changed() => self.notes.clear("fight", || {
                "the chain no longer needs repeated repairs".to_string()
            }),
            None => {}
        }
        let trouble: Vec<String> = r
            .held_back
            .iter()
            .map(ToString::to_string)
            .chain(
                r.errors
                    .iter()
                    .map(|e| format!("cannot repair the chain: {e}")),
            )
            .collect();
        if !trouble.is_empty() {
            let level = match r.errors.is_empty() {
                true => Level::WARN,
                false => Level::ERROR,
            };
            self.notes.log_change("chain", level, trouble.join("; "));
        } else if let Some(w) = &r.waiting {
            self.notes.log_change("chain", Level::WARN, w.clone());
        } else if let Some(f) = &r.chained_in {
            let note = healthy_note(f, &r.layout);
            if r.changed() {
                // Said by the actions above: nothing more to say.
                self.notes.mark_logged("chain", Level::INFO, note);
            } else {
                self.notes.log_change("chain", Level::INFO, note);
            }
        }
    }

    /// What keeps the node from being ready; empty when it is.
    pub fn check(&self) -> Vec<String> {
        let mut problems = vec![];
        for b in &self.bins {
            match binaries::state(b) {
                Ok(binaries::BinaryState::Current) => {}
                Ok(s) => problems.push(format!("binary {} is {s}", b.dest.display())),
                Err(e) => problems.push(format!("binary {}: {e}", b.dest.display())),
            }
        }
        // With LINKERD_CNI_AGENT_ONLY there is no kubeconfig to be current.
        if !self.cfg.agent_only {
            let path = self.cfg.kubeconfig_path();
            // Rendered with the token it holds: the server, the CA and the mode
            // must be current, and the token one this installer would keep. A
            // kubeconfig without a token is not ready either: the plugin's token
            // has not been minted yet.
            let token = kubeconfig::file_token(&self.cfg);
            let state = || -> Result<KubeconfigState, KubeconfigError> {
                // Without a token of its own, none is written (see
                // `Credential::token`): that is what is missing.
                if token.is_none() {
                    kubeconfig::own_token(&self.cfg)?;
                }
                let want = kubeconfig::render(&self.cfg, token.as_deref())?;
                Ok(kubeconfig::state(&self.cfg, &want)?)
            };
            let problem = match (state(), &token) {
                (Ok(KubeconfigState::Current), Some(t)) => {
                    credential::problem(&self.cfg, t).map(|why| format!(": {why}"))
                }
                (Ok(KubeconfigState::Current), None) => Some(
                    " holds no token yet: the plugin's could not be minted (the installer's log \
                     says why); pods are retried meanwhile"
                        .to_string(),
                ),
                (Ok(s), _) => Some(format!(" is {s}")),
                (Err(e), _) => Some(format!(": {e}")),
            };
            problems.extend(problem.map(|p| format!("kubeconfig {}{p}", path.display())));
        }
        let entry = match self.cfg.desired_entry() {
            Ok(e) => e,
            Err(e) => {
                problems.push(e.to_string());
                self.last_entry.clone()
            }
        };
        let dir = self.cfg.conf_dir();
        match chain::load_entry(&dir) {
            Ok(Some(persisted)) if persisted == entry => {}
            Ok(Some(_)) => problems.push(format!(
                "the entry persisted in {} differs from the template",
                dir.join(chain::ENTRY_FILE).display()
            )),
            Ok(None) => problems.push(format!(
                "the desired entry is not persisted in {}",
                dir.join(chain::ENTRY_FILE).display()
            )),
            Err(e) => problems.push(format!("the persisted entry: {e}")),
        }
        match chain::health(&context(&self.cfg, &entry)) {
            Ok(h) if h.is_healthy() => {}
            Ok(h) => problems.push(format!(
                "the chain is not healthy:\n    {}",
                h.to_string().trim_end().replace('\n', "\n    ")
            )),
            Err(e) => problems.push(format!("chain in {}: {e}", dir.display())),
        }
        problems
    }

    /// Uninstall, in the order that never leaves a config naming a missing
    /// binary, nor a pod start that loaded one without it: linkerd entries
    /// out of every config first; then the kubeconfig and the persisted
    /// entry; then, [`UNINSTALL_DRAIN`] later, the binaries.
    pub fn uninstall(&self) -> Result<(), String> {
        let dir = self.cfg.conf_dir();
        let opts = repair_options(&self.cfg);
        let unchain = |pass: &str| -> Result<(), String> {
            if !dir.is_dir() {
                // No conf dir: no config can name the plugin.
                return Ok(());
            }
            // Our own files first: the primary's (without our entry in
            // owned mode) becomes the active config again; then every entry.
            let removed = chain::unchain(&dir, &opts).map_err(|e| {
                format!(
                    "cannot remove linkerd-cni from the configs in {}: {e}; \
                     leaving the binary in place so no config names a missing plugin",
                    dir.display()
                )
            })?;
            for line in removed {
                tracing::info!("{line} ({pass})");
            }
            Ok(())
        };
        unchain("uninstall")?;

        // The heartbeat before the kubeconfig: while it is fresh, an ADD
        // that finds no kubeconfig is sent back to wait for one.
        let state_dir = self.state_dir();
        let beat = record::path::<heartbeat::Beat>(&state_dir);
        if let Err(e) = removed(&beat, heartbeat::remove(&state_dir)) {
            tracing::error!("{e}");
        }
        let kc = self.cfg.kubeconfig_path();
        if let Err(e) = removed(&kc, fsutil::remove(&kc)) {
            tracing::error!("{e}");
        }
        let entry_file = dir.join(chain::ENTRY_FILE);
        if let Err(e) = removed(&entry_file, chain::remove_entry_file(&dir)) {
            tracing::error!("cannot remove the persisted entry: {e}");
        }
        // A plugin ADD that ran meanwhile may have healed the chain from its
        // own config. Plugins repair only while their kubeconfig exists,
        // checked under the conf-dir lock, so after this sweep (which takes
        // the lock) no ADD can chain the node again.
        unchain("second sweep")?;

        let present: Vec<_> = self
            .bins
            .iter()
            .filter(|b| b.dest.symlink_metadata().is_ok())
            .map(|b| b.dest.display().to_string())
            .collect();
        if !present.is_empty() {
            tracing::info!(
                "keeping {} for {} s: pod starts that loaded the chain before linkerd-cni \
                 left it still run it (they pass their pods through)",
                present.join(", "),
                UNINSTALL_DRAIN.as_secs()
            );
            std::thread::sleep(UNINSTALL_DRAIN);
        }
        // Last in the conf dir, after the wait: every sweep above took the
        // lock, and so may a pod start on the old chain (its plugin checks
        // the chain, finds no kubeconfig under the lock, and repairs
        // nothing), which would create the file again.
        if dir.is_dir() {
            let lock = chain::remove_lock_file(&dir, RepairOptions::default().lock_timeout);
            if let Err(e) = removed(&dir.join(chain::LOCK_FILE), lock) {
                tracing::warn!("the conf dir's lock file stays: {e}");
            }
        }
        let failed: Vec<String> = self
            .bins
            .iter()
            .filter_map(|b| removed(&b.dest, fsutil::remove(&b.dest)).err())
            .map(|e| e.to_string())
            .collect();
        match failed.is_empty() {
            true => Ok(()),
            false => Err(failed.join("; ")),
        }
    }
}

/// The chain library's options for this installer: symlinks in the conf
/// dir resolve as on the host (absolute targets under the host mount, not
/// the container's root).
fn repair_options(cfg: &Config) -> RepairOptions {
    RepairOptions {
        host_root: cfg.mount_prefix.clone(),
        write_outside_conf_dir: cfg.chain_write_outside_conf_dir,
        ..RepairOptions::default()
    }
}

/// The keeper's context for `entry`: its mode, this pass's deadline.
fn context(cfg: &Config, entry: &Entry) -> Context {
    let mode = ModeChoice::of_entry(entry).unwrap_or_else(|e| {
        ModeChoice::new(ChainMode::Inline, format!("{e}; inline mode used instead"))
    });
    Context {
        opts: repair_options(cfg),
        ..Context::new(&cfg.conf_dir(), entry.clone(), mode, REPAIR_BUDGET)
    }
}

/// An uninstall's removal of `path`: said when it removed the file.
fn removed<E>(path: &Path, result: Result<bool, E>) -> Result<(), E> {
    if result? {
        tracing::info!("removed {} (uninstall)", path.display());
    }
    Ok(())
}

fn healthy_note(file: &Path, layout: &Layout) -> String {
    match layout {
        Layout::Owned => format!(
            "linkerd-cni is chained in its own {}, a current copy of the primary's config",
            file.display()
        ),
        _ => format!("linkerd-cni is chained in {}", file.display()),
    }
}
