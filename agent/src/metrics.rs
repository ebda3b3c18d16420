//! What the node is doing, for operators: the facts each pass records
//! ([`Telemetry`]), kept as prometheus-client metrics that the process's
//! one admin server ([`crate::repair::admin`], started by [`setup`])
//! serves on `/metrics`, which `linkerd-cni-installer status` reads too.
//!
//! Opt-in (`LINKERD_CNI_METRICS_ADDR`): with metrics off the installer holds
//! a [`Telemetry`] that records nothing, so a pass does no extra work.
//! With metrics on, a pass moves a few counters and records its verdict;
//! everything else (the plugin's ADD counters, the credential's age) is
//! read when scraped ([`NodeCollector`]), never per pass, and nothing is
//! ever written.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{SystemTime, UNIX_EPOCH};

use linkerd_cni_chain::owned::ChainMode;
use linkerd_cni_chain::{self as chain, ChainState, Context, Layout, ModeChoice};
use linkerd_cni_kube::token::unix_time;
use linkerd_cni_state::outcomes;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use crate::events::{Events, Kind};
use crate::repair::admin::{self, AdminState, Format, Listener};
use crate::repair::cli::Beside;
use crate::repair::lookup::{self, SocketGuard};

/// Upper bounds of the heal-latency histogram's buckets, in seconds: a
/// watch-driven repair takes milliseconds, one found by the resync seconds.
pub const HEAL_BUCKETS: [f64; 13] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];

/// The causes a repair counts under, each exported from the start (at 0).
pub const REPAIR_CAUSES: [&str; 7] = [
    "missing",
    "not_last",
    "duplicated",
    "stale",
    "single_conf",
    "owned_missing",
    "owned_outdated",
];

/// The cause an inline repair of a chain found in `state` counts under.
pub fn repair_cause(state: &ChainState) -> &'static str {
    match state {
        ChainState::Missing => "missing",
        ChainState::NotLast { .. } => "not_last",
        ChainState::Duplicated { .. } => "duplicated",
        ChainState::Stale { .. } => "stale",
        ChainState::SingleConf => "single_conf",
        // Not repairable: never counted, but a name all the same.
        ChainState::Healthy
        | ChainState::NoPrimaryConfig
        | ChainState::NoPrimaryPlugin
        | ChainState::Invalid { .. } => "other",
    }
}

/// The chain's state in a conf dir, as `/metrics` and `status` show it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    /// The mode the entry asks for.
    pub configured: ChainMode,
    /// The mode the chain is kept in: inline where owned mode does not
    /// apply.
    pub selected: ChainMode,
    /// Why `selected` is what it is: owned mode's fallback, else the
    /// entry's mode choice (the installer's `auto` verdict included).
    pub reason: Option<String>,
    /// What keeps the chain from being healthy; `None`: healthy.
    pub problem: Option<String>,
}

impl Verdict {
    pub fn healthy(&self) -> bool {
        self.problem.is_none()
    }

    /// The mode `layout` keeps the chain in (`mode` asking for one), and
    /// why.
    fn in_layout(mode: &ModeChoice, layout: &Layout, problem: Option<String>) -> Verdict {
        let (selected, reason) = match layout {
            Layout::Owned => (ChainMode::Owned, mode.reason.clone()),
            Layout::Inline => (ChainMode::Inline, mode.reason.clone()),
            Layout::Fallback(why) => (ChainMode::Inline, why.clone()),
        };
        Verdict {
            configured: mode.mode,
            selected,
            reason: Some(reason),
            problem,
        }
    }
}

/// The chain as `ctx` would keep it, judged by the chain crate's one
/// definition of healthy (the readiness check's too).
pub fn verdict(ctx: &Context) -> Verdict {
    match chain::health(ctx) {
        Ok(h) => Verdict::in_layout(&h.mode, &h.layout, (!h.is_healthy()).then(|| h.summary())),
        Err(e) => Verdict {
            configured: ctx.mode.mode,
            selected: ctx.mode.mode,
            reason: None,
            problem: Some(e.to_string()),
        },
    }
}

/// A repair's cause, as its one label.
type Cause = [(&'static str, &'static str); 1];

/// The chain at the end of the last pass, and when that pass ended:
/// exported only once a pass has decided them, so a scrape before the
/// first pass claims nothing.
type LastPass = Arc<Mutex<Option<(Verdict, SystemTime)>>>;

/// What the passes count, registered in the admin server's registry.
struct Counters {
    repairs: Family<Cause, Counter>,
    fights: Counter,
    held_back: Counter,
    heal_latency: Histogram,
    passes: Counter,
    /// What the collector reads of the last pass.
    last: LastPass,
}

impl Counters {
    /// The counters in `registry`, with what a scrape reads then (from
    /// the last pass and from `sources`).
    fn register(registry: &mut Registry, sources: Sources) -> Counters {
        let c = Counters {
            repairs: Family::default(),
            fights: Counter::default(),
            held_back: Counter::default(),
            heal_latency: Histogram::new(HEAL_BUCKETS),
            passes: Counter::default(),
            last: LastPass::default(),
        };
        // Each cause exported from the start, at 0.
        for cause in REPAIR_CAUSES {
            let _ = c.repairs.get_or_create(&[("cause", cause)]);
        }
        // prometheus-client ends each help with a period and each counter's
        // name with `_total`.
        registry.register(
            "linkerd_cni_chain_repairs",
            "Repairs of the chain by this installer, by what the repair found",
            c.repairs.clone(),
        );
        registry.register(
            "linkerd_cni_chain_fights",
            "Times another agent was found undoing the same repair again and again",
            c.fights.clone(),
        );
        registry.register(
            "linkerd_cni_chain_repairs_held_back",
            "Repairs postponed by the fight rate limit",
            c.held_back.clone(),
        );
        registry.register(
            "linkerd_cni_chain_heal_latency_seconds",
            "From the write that unchained a config (its mtime) to the repair that chained it again",
            c.heal_latency.clone(),
        );
        registry.register(
            "linkerd_cni_passes",
            "Reconcile passes since the installer started",
            c.passes.clone(),
        );
        registry.register_collector(Box::new(NodeCollector {
            last: c.last.clone(),
            sources,
        }));
        c
    }
}

/// Where the passes record what they did, for `/metrics` and for Events;
/// when both are off, as by default, it keeps nothing of a keeper's
/// report (no allocation, no look at the conf dir).
#[derive(Default)]
pub struct Telemetry {
    /// What `/metrics` serves, when it is on.
    metrics: Option<Counters>,
    events: Option<Events>,
    seen: Seen,
    /// The config files' mtimes before the keeper ran (metrics on): when
    /// the write it repaired was made.
    written: BTreeMap<PathBuf, SystemTime>,
    /// The verdict of this pass's keeper when its run was steady (see
    /// `Report::is_steady`: healthy, nothing done or pending), which
    /// [`verdict`] would give on the same files without looking again.
    steady: Option<Verdict>,
}

/// What was reported already, so that each occurrence counts (and makes an
/// Event) once, however many passes see it.
#[derive(Default)]
struct Seen {
    /// The repair (file and content) in a fight now.
    fighting: Option<String>,
    /// The repair held back now.
    holding: Option<String>,
    /// Why owned mode does not apply now.
    fallback: Option<String>,
    /// The plugin's credential rejections counted so far (None: not read
    /// yet; those before the installer started are not news).
    rejections: Option<u64>,
}

/// Whether `now` is news after `seen`, which holds it from then on.
fn news(seen: &mut Option<String>, now: &str) -> bool {
    seen.replace(now.to_string()).as_deref() != Some(now)
}

impl Telemetry {
    /// Keeps the metrics in the registry when given (with those read when
    /// scraped from the sources) and sends `events`; off with neither.
    pub fn new(metrics: Option<(&mut Registry, Sources)>, events: Option<Events>) -> Telemetry {
        Telemetry {
            metrics: metrics.map(|(registry, sources)| Counters::register(registry, sources)),
            events,
            ..Telemetry::default()
        }
    }

    fn event(&self, kind: Kind, note: String) {
        if let Some(e) = &self.events {
            e.emit(kind, note);
        }
    }

    /// The startup taint is gone from the node (`how`).
    pub fn taint_removed(&self, how: &str) {
        self.event(Kind::TaintRemoved, how.to_string());
    }

    /// SIGTERM: the node is being uninstalled, `why`. Sent before the
    /// uninstall starts, within the Event's API timeout.
    pub fn uninstalling(&self, why: &str) {
        if let Some(e) = &self.events {
            e.emit_now(
                Kind::Uninstall,
                format!("linkerd-cni is being removed from this node: {why}"),
            );
        }
    }

    /// After each pass, for `/metrics`: the pass count and time, and the
    /// chain as the pass left it (its keeper's steady verdict, else
    /// `judge`'s, asked only when metrics are on: the collector is the
    /// verdict's only reader).
    pub fn pass_done(&mut self, judge: impl FnOnce() -> Verdict) {
        if let Some(m) = &self.metrics {
            let v = self.steady.take().unwrap_or_else(judge);
            m.passes.inc();
            *lock(&m.last) = Some((v, SystemTime::now()));
        }
    }

    /// Before the keeper runs on `dir`: the config files' mtimes, when
    /// metrics are on (a listing and a stat each), for the heal latency.
    pub fn before_keep(&mut self, dir: &Path) {
        self.steady = None;
        if self.metrics.is_none() {
            return;
        }
        self.written = std::fs::read_dir(dir)
            .into_iter()
            .flatten()
            .flatten()
            .filter(|e| linkerd_cni_chain::is_config_name(&e.file_name()))
            .filter_map(|e| Some((e.path(), e.metadata().ok()?.modified().ok()?)))
            .collect();
    }

    /// What the keeper did in this pass, from its report.
    pub fn report(&mut self, r: &linkerd_cni_chain::Report) {
        use linkerd_cni_chain::{Action, HoldCause};
        if self.metrics.is_none() && self.events.is_none() {
            return;
        }
        if r.is_steady() && self.metrics.is_some() {
            self.steady = Some(Verdict::in_layout(&r.mode, &r.layout, None));
        }
        for a in &r.actions {
            match a {
                Action::Repaired { file, cause } => self.repaired(repair_cause(cause), Some(file)),
                Action::Copied { created: true, .. } => self.repaired("owned_missing", None),
                Action::Copied { from, .. } => self.repaired("owned_outdated", Some(from)),
                _ => {}
            }
        }
        match r.fights.first() {
            Some(w) => self.fight(w),
            // A repair that was not a fight.
            None if r.changed() => self.seen.fighting = None,
            None => {}
        }
        for h in &r.held_back {
            if let HoldCause::Fight { .. } = h.cause {
                self.held_back(&h.file.display().to_string());
            }
        }
        match (&r.layout, r.mode.mode) {
            (Layout::Fallback(why), _) => self.owned_fallback(why),
            // Owned mode applies again.
            (_, ChainMode::Owned) => self.seen.fallback = None,
            _ => {}
        }
    }

    /// A repair that rewrote a file: counted under `cause`, and its heal
    /// latency observed from `file`'s last write before the repair (its
    /// mtime then, in [`Telemetry::written`]; the primary's write) to now.
    fn repaired(&mut self, cause: &'static str, file: Option<&PathBuf>) {
        self.seen.holding = None;
        let Some(m) = &self.metrics else { return };
        m.repairs.get_or_create(&[("cause", cause)]).inc();
        // The first pass's repairs are no samples (a node chained at start,
        // after hours without an installer).
        let written = file.and_then(|f| self.written.get(f));
        if let Some(w) = written.filter(|_| m.passes.get() > 0) {
            let latency = SystemTime::now().duration_since(*w).unwrap_or_default();
            m.heal_latency.observe(latency.as_secs_f64());
        }
    }

    /// Repairs are a fight, as `warning` (which names the file and the
    /// content they start from) says: counted (and an Event) once until a
    /// repair that is not one.
    fn fight(&mut self, warning: &str) {
        if news(&mut self.seen.fighting, warning) {
            if let Some(m) = &self.metrics {
                m.fights.inc();
            }
            self.event(Kind::Fight, warning.to_string());
        }
    }

    /// The repair of `what` held back by the fight limit: counted once
    /// until a repair is made.
    fn held_back(&mut self, what: &str) {
        if news(&mut self.seen.holding, what)
            && let Some(m) = &self.metrics
        {
            m.held_back.inc();
        }
    }

    /// The entry asks for owned mode, which does not apply here (`why`):
    /// the inline repair keeps the chain. An Event once per reason.
    fn owned_fallback(&mut self, why: &str) {
        if news(&mut self.seen.fallback, why) {
            self.event(
                Kind::OwnedFallback,
                format!("owned chain mode does not apply on this node, inline repair keeps linkerd-cni chained: {why}"),
            );
        }
    }

    /// The plugin's count of ADDs whose pod GET the API server refused
    /// its credentials for, `now`, as a pass's beat read it: an Event for
    /// those since the last.
    pub fn plugin_rejections(&mut self, now: u64) {
        let before = self.seen.rejections.replace(now);
        if let Some(before) = before
            && now > before
        {
            self.event(
                Kind::CredentialRejected,
                format!(
                    "the Kubernetes API rejected linkerd-cni's credentials (HTTP 401 or 403) for {} \
                     pod ADD(s) since the installer's last pass: those pods were passed through \
                     without linkerd's rules or retried; check that the token in the node's \
                     kubeconfig is current and that its RBAC allows get on pods",
                    now - before
                ),
            );
        }
    }
}

/// The mutex's data, also after a panic elsewhere: what it guards are
/// counters, not invariants.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The installer's credential: when it was issued and when it is
/// refreshed next, when known.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Credential {
    pub issued: SystemTime,
    pub next_refresh: Option<SystemTime>,
}

/// What a scrape reads besides the pass's state.
#[derive(Debug, Clone)]
pub struct Sources {
    /// The plugin's state dir (container view), for its ADD counters.
    pub plugin_state_dir: PathBuf,
    /// The installer's own service-account token.
    pub token_file: PathBuf,
    /// The node's kubeconfig, whose token the plugin uses.
    pub kubeconfig: PathBuf,
}

impl Sources {
    /// The credential the plugin uses now (the token in the node's
    /// kubeconfig), from the token's own claims. Minted for the plugin, the
    /// installer replaces it past half its lifetime; the installer's own
    /// projected token (the fallback) is refreshed by the kubelet once 80%
    /// of its lifetime has passed, or after 24 hours.
    pub fn credential(&self) -> Option<Credential> {
        let token = crate::kubeconfig::token_in(&self.kubeconfig)?;
        let (iat, exp) = token_times(&token)?;
        let own =
            crate::fsutil::read_capped_text(&self.token_file).is_ok_and(|t| t.trim() == token);
        // The claims are whatever the file holds: saturating arithmetic and
        // checked times, for a token claiming times no clock can hold.
        let ttl = exp.saturating_sub(iat);
        let refresh = match own {
            true => iat.saturating_add((ttl.saturating_mul(8) / 10).min(24 * 3600)),
            false => iat.saturating_add(ttl / 2),
        };
        Some(Credential {
            issued: unix_time(iat)?,
            next_refresh: unix_time(refresh),
        })
    }
}

/// `iat` and `exp` of a JWT's payload (not verified: they only inform).
pub fn token_times(token: &str) -> Option<(u64, u64)> {
    use base64::Engine;
    let payload = token.split('.').nth(1)?;
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(payload.trim_end_matches('='))
        .ok()?;
    let v: serde_json::Value = serde_json::from_slice(&bytes).ok()?;
    Some((v.get("iat")?.as_u64()?, v.get("exp")?.as_u64()?))
}

/// `t` as Unix seconds, as every time on the admin page is.
pub(crate) fn secs(t: SystemTime) -> f64 {
    t.duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs_f64()
}

/// What a scrape reads when it happens: the last pass's verdict and time,
/// the credential (from the node's files) and the plugin's ADD counters
/// (from its state dir).
#[derive(Debug)]
struct NodeCollector {
    last: LastPass,
    sources: Sources,
}

/// One gauge without labels.
fn gauge(e: &mut DescriptorEncoder, name: &str, help: &str, v: f64) -> std::fmt::Result {
    let g = ConstGauge::new(v);
    g.encode(e.encode_descriptor(name, help, None, g.metric_type())?)
}

impl Collector for NodeCollector {
    fn encode(&self, mut e: DescriptorEncoder) -> std::fmt::Result {
        let last = lock(&self.last).clone();
        if let Some((v, _)) = &last {
            let healthy = ConstGauge::new(i64::from(v.healthy()));
            let mut f = e.encode_descriptor(
                "linkerd_cni_chain_healthy",
                "Whether linkerd-cni was chained at the end of the last pass, in the mode it was kept in.",
                None,
                MetricType::Gauge,
            )?;
            healthy.encode(f.encode_family(&[("mode", v.selected.as_str())])?)?;
            let mut f = e.encode_descriptor(
                "linkerd_cni_chain_mode",
                "The chain mode the entry asks for and the one selected, and why they differ (1 per node).",
                None,
                MetricType::Gauge,
            )?;
            let labels = [
                ("configured", v.configured.as_str()),
                ("selected", v.selected.as_str()),
                ("reason", v.reason.as_deref().unwrap_or("")),
            ];
            ConstGauge::new(1i64).encode(f.encode_family(&labels)?)?;
        }
        // Without a token we can read, no age at all: 0 would claim a fresh one.
        if let Some(c) = self.sources.credential() {
            let age = SystemTime::now()
                .duration_since(c.issued)
                .unwrap_or_default();
            gauge(
                &mut e,
                "linkerd_cni_credential_age_seconds",
                "Age of the token in the plugin's kubeconfig.",
                age.as_secs_f64(),
            )?;
            if let Some(r) = c.next_refresh {
                gauge(
                    &mut e,
                    "linkerd_cni_credential_next_refresh_timestamp_seconds",
                    "When that token is refreshed next (Unix time).",
                    secs(r),
                )?;
            }
        }
        if let Some((_, t)) = last {
            gauge(
                &mut e,
                "linkerd_cni_last_pass_timestamp_seconds",
                "When the last reconcile pass ended (Unix time).",
                secs(t),
            )?;
        }
        // Each exported (at 0 before any ADD); nothing when the plugin's
        // state dir cannot be read (see `unreadable_adds`).
        let Ok(counts) = outcomes::read(&self.sources.plugin_state_dir) else {
            return Ok(());
        };
        let mut f = e.encode_descriptor(
            "linkerd_cni_plugin_adds",
            "ADDs the plugin answered on this node, by outcome (meshed, unmeshed, exempt, \
             passed_through, try_again, failed) and cause (the CNI error code for failed).",
            None,
            MetricType::Counter,
        )?;
        for (outcome, n) in counts {
            let cause = outcome.cause();
            let labels = [("outcome", outcome.kind()), ("cause", cause.as_str())];
            ConstCounter::new(n).encode(f.encode_family(&labels)?)?;
        }
        Ok(())
    }
}

/// The page's note when the plugin's ADD counters in `dir` cannot be read.
fn unreadable_adds(dir: &Path) -> String {
    match outcomes::read(dir) {
        Ok(_) => String::new(),
        Err(e) => format!(
            "# the plugin's ADD counters in {} cannot be read: {}\n",
            dir.join(outcomes::OUTCOMES_FILE).display(),
            e.to_string().replace('\n', " ")
        ),
    }
}

/// The process's one admin server, when metrics are on or a repair
/// controller runs beside the installer: one registry (the installer's
/// metrics and the controller's), served on `LINKERD_CNI_METRICS_ADDR` and
/// on the controller's admin address when set (one listener when they are
/// the same), each listener with its own connection budget, and on a
/// root-only socket in the state dir, for deploy/'s liveness probe
/// (removed when the returned guard drops). The installer records metrics
/// only when a port serves them; with a node name (and
/// `LINKERD_CNI_EVENTS` not false), Events on the Node. Neither metrics
/// nor a controller: no server (no socket, no thread). An address that
/// cannot be bound is logged, and the installer runs on without it:
/// keeping the node chained matters more.
pub fn setup(
    inst: &mut crate::installer::Installer,
    mut registry: Registry,
    repair: Option<&Beside>,
) -> Option<SocketGuard> {
    let cfg = inst.config().clone();
    let sources = inst.metrics_sources();
    let events = (cfg.node_name.is_some() && cfg.events)
        .then(|| Events::new(crate::events::api_sink(cfg.clone())));
    let rt = match (cfg.metrics_addr.is_some() || repair.is_some()).then(crate::api::handle) {
        Some(Ok(rt)) => rt,
        other => {
            if let Some(Err(e)) = other {
                tracing::error!("no admin server, no metrics: {e}");
            }
            inst.set_telemetry(Telemetry::new(None, events));
            return None;
        }
    };
    let repair_addr = repair.and_then(|r| r.admin_addr);
    let ports = [
        (cfg.metrics_addr, "LINKERD_CNI_METRICS_ADDR"),
        (
            repair_addr.filter(|a| cfg.metrics_addr != Some(*a)),
            "LINKERD_CNI_REPAIR_CONTROLLER_ADMIN_ADDR, _ADMIN_IP",
        ),
    ];
    let mut listeners = vec![];
    for (addr, var) in ports {
        let Some(addr) = addr else { continue };
        match rt.block_on(tokio::net::TcpListener::bind(addr)) {
            Ok(l) => {
                if let Ok(local) = l.local_addr() {
                    tracing::info!("serving /metrics on http://{local}/metrics");
                }
                listeners.push(Listener::Tcp(l));
            }
            Err(e) => tracing::error!(
                "cannot serve /metrics on {addr} ({var}): {e}; running without it: set it to \
                 this node's IP (status.hostIP) and a free port"
            ),
        }
    }
    let dir = sources.plugin_state_dir.clone();
    let metrics = (!listeners.is_empty()).then_some((&mut registry, sources));
    inst.set_telemetry(Telemetry::new(metrics, events));
    let socket = linkerd_cni_state::record::create_dir(&dir)
        .map_err(|e| e.to_string())
        .and_then(|()| {
            let _in = rt.enter();
            lookup::bind(&dir, admin::SOCKET).map_err(|e| e.to_string())
        });
    let guard = match socket {
        Ok((l, guard)) => {
            listeners.push(Listener::Unix(l));
            Some(guard)
        }
        Err(e) => {
            tracing::error!(
                "cannot answer liveness probes on {} ({e}): `check --live` fails",
                dir.join(admin::SOCKET).display()
            );
            None
        }
    };
    let state = AdminState {
        ready: repair.map(|r| r.ready.clone()),
        live: repair.map_or_else(|| Arc::new(AtomicBool::new(true)), |r| r.live.clone()),
        registry: Arc::new(registry),
        format: Format::Prometheus,
        notes: Some(Arc::new(move || unreadable_adds(&dir))),
    };
    admin::start(&rt, listeners, state);
    guard
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn sources(dir: &Path) -> Sources {
        Sources {
            plugin_state_dir: dir.join("state"),
            token_file: dir.join("token"),
            kubeconfig: dir.join("kubeconfig"),
        }
    }

    /// Metrics on, read from `dir`.
    fn registered(dir: &Path) -> (Telemetry, Registry) {
        let mut r = Registry::default();
        let t = Telemetry::new(Some((&mut r, sources(dir))), None);
        (t, r)
    }

    /// The page the installer's `/metrics` serves.
    fn page(r: &Registry) -> String {
        admin::encode(r, Format::Prometheus).0
    }

    /// The verdict is the chain crate's `health`: in inline mode, our
    /// owned file still in place is not healthy (the readiness check says
    /// so too), though the primary's file holds linkerd-cni.
    #[test]
    fn the_verdict_is_the_one_definition_of_healthy() {
        use linkerd_cni_chain::{Entry, ModeChoice, NoLimit, keep};
        let calico = testkit::chain::CALICO;
        let entry = Entry::new(testkit::chain::chart_entry(), "a test").unwrap();
        let owned_entry = entry.with("chain_mode", "owned").unwrap();
        let ctx = |dir: &Path, e: &Entry| {
            let mode = ModeChoice::of_entry(e).unwrap();
            Context::new(dir, e.clone(), mode, Duration::from_secs(5))
        };
        // Our owned copy of Calico's chain, made in a dir of its own.
        let owned_dir = testkit::TempDir::new("metrics-owned").unwrap();
        owned_dir.write("10-calico.conflist", calico);
        keep(&ctx(owned_dir.path(), &owned_entry), &mut NoLimit).unwrap();
        let ours = "10-calico-linkerd-cni.conflist";
        // A node chained inline, then the copy left beside it.
        let dir = testkit::TempDir::new("metrics-inline").unwrap();
        dir.write("10-calico.conflist", calico);
        keep(&ctx(dir.path(), &entry), &mut NoLimit).unwrap();
        let inline = ctx(dir.path(), &entry);
        assert!(verdict(&inline).healthy(), "{:?}", verdict(&inline));
        dir.write(ours, &owned_dir.read(ours));
        let v = verdict(&inline);
        assert!(!v.healthy(), "{v:?}");
        assert_eq!(v.selected, ChainMode::Inline);
        // A steady run of the keeper gives the verdict a look would.
        let (mut t, _registry) = registered(dir.path());
        for e in [&entry, &owned_entry] {
            let c = ctx(dir.path(), e);
            keep(&c, &mut NoLimit).unwrap();
            t.before_keep(dir.path());
            let r = keep(&c, &mut NoLimit).unwrap();
            assert!(r.is_steady(), "{r}");
            t.report(&r);
            assert_eq!(t.steady.take(), Some(verdict(&c)));
        }
        // Owned mode on that dir: our copy is the active file and current.
        let owned = verdict(&ctx(dir.path(), &owned_entry));
        assert_eq!(owned.selected, ChainMode::Owned, "{owned:?}");
        // Under `auto`, why: the runtime settings' verdict the installer
        // recorded in the entry.
        let auto = owned_entry
            .with(
                linkerd_cni_chain::MODE_REASON_KEY,
                "containerd loads one config file (max_conf_num unset)",
            )
            .unwrap();
        let v = verdict(&ctx(dir.path(), &auto));
        assert_eq!(
            v.reason.as_deref(),
            Some(
                "auto, from the runtime's settings: containerd loads one config file (max_conf_num unset)"
            ),
            "{v:?}"
        );
    }

    #[test]
    fn the_first_pass_is_no_heal_latency_sample() {
        let tmp = testkit::TempDir::new("metrics-first").unwrap();
        let (mut t, r) = registered(tmp.path());
        let file = PathBuf::from("10-calico.conflist");
        let hour_ago = SystemTime::now() - Duration::from_secs(3600);
        t.written.insert(file.clone(), hour_ago);
        t.repaired("missing", Some(&file));
        t.pass_done(verdict_for_test);
        t.written.insert(file.clone(), SystemTime::now());
        t.repaired("missing", Some(&file));
        let text = page(&r);
        assert!(
            text.contains("\nlinkerd_cni_chain_repairs_total{cause=\"missing\"} 2\n"),
            "{text}"
        );
        assert!(
            text.contains("\nlinkerd_cni_chain_heal_latency_seconds_count 1\n"),
            "only the later pass's repair: {text}"
        );
    }

    fn verdict_for_test() -> Verdict {
        Verdict {
            configured: ChainMode::Inline,
            selected: ChainMode::Inline,
            reason: None,
            problem: None,
        }
    }

    #[test]
    fn off_records_nothing() {
        use linkerd_cni_chain::{Action, Report};
        let mut t = Telemetry::default();
        let r = Report {
            mode: ModeChoice::new(ChainMode::Owned, "a test"),
            layout: Layout::Fallback("a test".into()),
            actions: vec![Action::Repaired {
                file: "10-calico.conflist".into(),
                cause: ChainState::Missing,
            }],
            held_back: vec![],
            fights: vec!["w".into()],
            errors: vec![],
            waiting: None,
            chained_in: None,
            stale: None,
        };
        t.before_keep(Path::new("/"));
        t.report(&r);
        t.pass_done(|| unreachable!("no verdict with metrics off"));
        assert!(t.metrics.is_none() && t.events.is_none());
        assert!(t.seen.fighting.is_none() && t.seen.fallback.is_none() && t.written.is_empty());
        let off = Telemetry::new(None, None);
        assert!(off.metrics.is_none() && off.events.is_none());
    }

    /// The installer's own token is read non-blocking: a FIFO in its place
    /// is no token of ours, and the scrape (and `status`) go on.
    #[test]
    fn a_token_file_that_is_not_regular_does_not_block_the_credential() {
        let tmp = testkit::TempDir::new("metrics-fifo").unwrap();
        testkit::mkfifo(&tmp.path().join("token"));
        use base64::Engine;
        let claims = r#"{"iat":1000,"exp":11000}"#;
        let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(claims);
        std::fs::write(
            tmp.path().join("kubeconfig"),
            format!(r#"{{"users":[{{"name":"x","user":{{"token":"h.{b64}.s"}}}}]}}"#),
        )
        .unwrap();
        let src = sources(tmp.path());
        let c = testkit::bounded("a FIFO token", Duration::from_secs(20), move || {
            src.credential()
        })
        .unwrap();
        // Not the installer's own token: refreshed at half its lifetime.
        assert_eq!(c.next_refresh, Some(UNIX_EPOCH + Duration::from_secs(6000)));
    }

    /// Claimed times past what the clock can hold (2^63 s and more) are
    /// read without a panic (the release build aborts on one, and the
    /// kubeconfig holding such a token would abort every scrape and
    /// `status`): no credential when its issue time cannot be held, no
    /// next refresh when that cannot.
    #[test]
    fn token_times_out_of_the_clock_range_do_not_panic() {
        use base64::Engine;
        let tmp = testkit::TempDir::new("metrics-huge").unwrap();
        let big = 1u64 << 63;
        for (iat, exp, own, want) in [
            (big, big + 10, false, None),
            (u64::MAX, u64::MAX, true, None),
            (1000, u64::MAX, false, Some((1000, None))),
            // The installer's own token: 80% of a lifetime this long would
            // overflow a u64.
            (1000, u64::MAX, true, Some((1000, Some(1000 + 24 * 3600)))),
            (1000, big, true, Some((1000, Some(1000 + 24 * 3600)))),
        ] {
            let claims = format!(r#"{{"iat":{iat},"exp":{exp}}}"#);
            let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(claims);
            let token = format!("h.{b64}.s");
            let own_file = match own {
                true => token.clone(),
                false => "another".into(),
            };
            std::fs::write(tmp.path().join("token"), own_file).unwrap();
            std::fs::write(
                tmp.path().join("kubeconfig"),
                format!(r#"{{"users":[{{"name":"x","user":{{"token":"{token}"}}}}]}}"#),
            )
            .unwrap();
            let src = sources(tmp.path());
            let at = |s: u64| UNIX_EPOCH + Duration::from_secs(s);
            let got = src.credential();
            assert_eq!(
                got,
                want.map(|(i, r): (u64, Option<u64>)| Credential {
                    issued: at(i),
                    next_refresh: r.map(at),
                }),
                "iat {iat}, exp {exp}, own {own}"
            );
            let mut r = Registry::default();
            let _t = Telemetry::new(Some((&mut r, src)), None);
            let text = page(&r);
            assert_eq!(
                text.contains("linkerd_cni_credential_age_seconds "),
                want.is_some(),
                "{text}"
            );
        }
    }

    #[test]
    fn rendering_names_every_family_with_its_values() {
        let tmp = testkit::TempDir::new("metrics").unwrap();
        let (mut t, r) = registered(tmp.path());
        // Past the first pass: every write reported is a heal-latency
        // sample.
        t.pass_done(|| Verdict {
            configured: ChainMode::Owned,
            selected: ChainMode::Inline,
            reason: Some("a \"multus\" primary".into()),
            problem: None,
        });
        let ago = SystemTime::now() - Duration::from_millis(30);
        let file = PathBuf::from("10-calico.conflist");
        t.written.insert(file.clone(), ago);
        t.repaired("missing", Some(&file));
        t.repaired("not_last", None);
        // One fight and one held-back repair, however many passes see
        // them.
        for _ in 0..3 {
            t.fight("w");
            t.held_back("f@1");
        }
        outcomes::count(&tmp.path().join("state"), outcomes::Outcome::Failed(101)).unwrap();
        // A token issued an hour ago for 10 hours: refreshed at 8 h.
        use base64::Engine;
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs();
        let claims = format!(r#"{{"iat":{},"exp":{}}}"#, now - 3600, now - 3600 + 36000);
        let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(claims);
        // The installer's own token, in the kubeconfig too (the fallback).
        let token = format!("h.{b64}.s");
        std::fs::write(tmp.path().join("token"), format!("{token}\n")).unwrap();
        std::fs::write(
            tmp.path().join("kubeconfig"),
            format!(r#"{{"users":[{{"name":"x","user":{{"token":"{token}"}}}}]}}"#),
        )
        .unwrap();

        let text = page(&r);
        for line in [
            "linkerd_cni_chain_healthy{mode=\"inline\"} 1",
            "linkerd_cni_chain_mode{configured=\"owned\",selected=\"inline\",reason=\"a \\\"multus\\\" primary\"} 1",
            "linkerd_cni_chain_repairs_total{cause=\"missing\"} 1",
            "linkerd_cni_chain_repairs_total{cause=\"not_last\"} 1",
            "linkerd_cni_chain_repairs_total{cause=\"stale\"} 0",
            "linkerd_cni_chain_fights_total 1",
            "linkerd_cni_chain_repairs_held_back_total 1",
            "linkerd_cni_chain_heal_latency_seconds_bucket{le=\"0.025\"} 0",
            "linkerd_cni_chain_heal_latency_seconds_bucket{le=\"+Inf\"} 1",
            "linkerd_cni_chain_heal_latency_seconds_count 1",
            "linkerd_cni_passes_total 1",
            "linkerd_cni_plugin_adds_total{outcome=\"failed\",cause=\"101\"} 1",
            "linkerd_cni_plugin_adds_total{outcome=\"meshed\",cause=\"\"} 0",
            "linkerd_cni_plugin_adds_total{outcome=\"try_again\",cause=\"stale_owned_copy\"} 0",
        ] {
            assert!(text.lines().any(|l| l == line), "no {line:?} in\n{text}");
        }
        let bucket = |le: &str| {
            text.lines()
                .find_map(|l| {
                    l.strip_prefix(&format!(
                        "linkerd_cni_chain_heal_latency_seconds_bucket{{le=\"{le}\"}} "
                    ))
                })
                .unwrap()
                .to_string()
        };
        assert_eq!(bucket("60"), "1");
        let age: f64 = text
            .lines()
            .find_map(|l| l.strip_prefix("linkerd_cni_credential_age_seconds "))
            .unwrap()
            .parse()
            .unwrap();
        assert!((3600.0..3700.0).contains(&age), "{age}");
        let refresh: u64 = text
            .lines()
            .find_map(|l| l.strip_prefix("linkerd_cni_credential_next_refresh_timestamp_seconds "))
            .unwrap()
            .parse::<f64>()
            .unwrap() as u64;
        assert_eq!(refresh, now - 3600 + 28800);
        // Every sample line belongs to a family declared before it.
        let mut declared = vec![];
        for l in text.lines() {
            if let Some(rest) = l.strip_prefix("# TYPE ") {
                declared.push(rest.split(' ').next().unwrap().to_string());
            } else if !l.starts_with('#') {
                let name = l.split(['{', ' ']).next().unwrap();
                assert!(declared.iter().any(|d| name.starts_with(d.as_str())), "{l}");
            }
        }
    }

    #[test]
    fn nothing_before_the_first_pass_and_no_credential_without_a_token() {
        let tmp = testkit::TempDir::new("metrics").unwrap();
        let (_t, r) = registered(tmp.path());
        let text = page(&r);
        assert!(!text.contains("linkerd_cni_chain_healthy{"), "{text}");
        assert!(
            !text.contains("linkerd_cni_credential_age_seconds"),
            "{text}"
        );
        assert!(
            !text.contains("linkerd_cni_last_pass_timestamp_seconds "),
            "{text}"
        );
        assert!(text.contains("linkerd_cni_chain_repairs_total{cause=\"missing\"} 0"));
        assert!(text.contains("linkerd_cni_plugin_adds_total{outcome=\"meshed\",cause=\"\"} 0"));
    }
}
