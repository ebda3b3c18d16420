//! The repair controller's command line: `linkerd-cni-repair-controller`,
//! as the linkerd2-cni chart's repair-controller container runs it; and the
//! same controller beside the installer ([`Beside`]), when the installer's
//! environment asks for it ([`from_env`]): deploy/'s one container.

use std::ffi::OsString;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::Duration;

use crate::logging;
use crate::repair::admin::{self, AdminState, Format, Listener};
use crate::repair::args::Args;
use crate::repair::controller::Controller;
use crate::repair::lookup::{self, Facts};
use crate::repair::metrics::Metrics;
use crate::repair::process;
use clap::Parser;
use kube::config::{KubeConfigOptions, Kubeconfig};
use prometheus_client::registry::Registry;
use tokio::signal::unix::{SignalKind, signal};

/// The variable that makes the installer's command line repair pods too.
/// The chart's install-cni container never sets it (the chart's own
/// repair-controller container repairs, when enabled), deploy/'s one
/// container does: so exactly one process repairs a node's pods.
pub const SWITCH: &str = "LINKERD_CNI_REPAIR_CONTROLLER_NODE_NAME";

/// How long the installer waits, at SIGTERM, for the controller beside it
/// to stop (its watch closed, the lookup socket removed).
const STOP_WITHIN: Duration = Duration::from_secs(5);

pub fn main() -> ExitCode {
    let args = Args::parse();
    if let Err(e) = logging::init(crate::REPAIR_CONTROLLER, &args.log_level, args.log_format) {
        eprintln!("linkerd-cni-repair-controller: {e}");
        return ExitCode::from(2);
    }
    let result = runtime().and_then(|rt| {
        rt.block_on(async {
            let shutdown = signalled()?;
            let mut registry = Registry::default();
            let parts = register(&mut registry);
            let addr = args.admin_listen();
            let listener = tokio::net::TcpListener::bind(addr)
                .await
                .map_err(|e| format!("cannot listen on {addr} (--admin-addr, --admin-ip): {e}"))?;
            let local = listener
                .local_addr()
                .map_err(|e| format!("cannot read the admin address: {e}"))?;
            tracing::info!(addr = %local, "admin server listening");
            let state = AdminState {
                ready: Some(parts.1.clone()),
                live: Arc::new(AtomicBool::new(true)),
                registry: Arc::new(registry),
                format: Format::OpenMetrics,
                notes: None,
            };
            let rt = tokio::runtime::Handle::current();
            admin::start(&rt, vec![Listener::Tcp(listener)], state);
            run(args, parts, shutdown).await
        })
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e}");
            ExitCode::FAILURE
        }
    }
}

/// One thread: the controller never blocks it (file reads go to the
/// blocking pool), so the admin server answers probes between its awaits.
fn runtime() -> Result<tokio::runtime::Runtime, String> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the async runtime: {e}"))
}

/// SIGTERM or SIGINT, handled from now on.
fn signalled() -> Result<impl Future<Output = ()>, String> {
    let mut term =
        signal(SignalKind::terminate()).map_err(|e| format!("cannot handle SIGTERM: {e}"))?;
    let mut int =
        signal(SignalKind::interrupt()).map_err(|e| format!("cannot handle SIGINT: {e}"))?;
    Ok(async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
    })
}

/// The repair controller's settings for the installer's command line,
/// from the repair controller's variables (no flags: the installer's are
/// its own settings), or `None` when [`SWITCH`] is unset or empty: then the
/// installer repairs nothing and answers no lookups. The caller sets up
/// logging as its log variables say.
pub fn from_env() -> Result<Option<Args>, String> {
    if std::env::var_os(SWITCH).is_none_or(|v| v.is_empty()) {
        return Ok(None);
    }
    let argv: [OsString; 1] = [crate::REPAIR_CONTROLLER.into()];
    let args = Args::try_parse_from(argv).map_err(|e| {
        // Only the error: clap's usage and its hint at --help are the
        // controller's command line, which the installer does not take.
        let e = e.render().to_string();
        let e = e
            .split("\n\n")
            .next()
            .unwrap_or_default()
            .replace('\n', " ");
        format!(
            "{SWITCH} is set, so this installer also repairs pods, with the repair \
             controller's variables (docs/configuration.md, \"Repair controller flags\"), \
             but they are not valid: {}",
            e.trim()
        )
    })?;
    Ok(Some(args))
}

/// The repair controller beside the installer's loop, as a task on the
/// agent's one runtime (see [`crate::api`]), reporting on the installer's
/// admin server. Stopped on drop, waiting a bounded time.
pub struct Beside {
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    done: mpsc::Receiver<()>,
    /// Its admin address, when set (`LINKERD_CNI_REPAIR_CONTROLLER_ADMIN_ADDR`
    /// or `_ADMIN_IP`): the installer's admin server listens there too.
    /// Unset, no port: the standalone controller's default is for the
    /// chart's container.
    pub admin_addr: Option<SocketAddr>,
    /// Its `/ready`.
    pub ready: Arc<AtomicBool>,
    /// Cleared when it stops on an error: `/live` fails.
    pub live: Arc<AtomicBool>,
}

impl Beside {
    /// Starts it, its metrics in `registry`. The caller has blocked SIGTERM
    /// and SIGINT before the runtime's thread started (it inherits that),
    /// so that they reach the installer's loop alone.
    pub fn start(args: Args, registry: &mut Registry) -> Result<Beside, String> {
        let rt = crate::api::handle()?;
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let (finished, done) = mpsc::channel();
        let set = |v: &str| std::env::var_os(v).is_some_and(|v| !v.is_empty());
        let admin_addr = (set("LINKERD_CNI_REPAIR_CONTROLLER_ADMIN_ADDR")
            || set("LINKERD_CNI_REPAIR_CONTROLLER_ADMIN_IP"))
        .then(|| args.admin_listen());
        let parts = register(registry);
        let (ready, live) = (parts.1.clone(), Arc::new(AtomicBool::new(true)));
        let failed = live.clone();
        rt.spawn(async move {
            // A failure leaves the installer running without repairs (its
            // chain work does not depend on them) but fails `/live`, so
            // that the kubelet restarts the container.
            let stopped = async {
                let _ = stopped.await;
            };
            if let Err(e) = run(args, parts, stopped).await {
                tracing::error!("the repair controller stopped: {e}");
                failed.store(false, Ordering::SeqCst);
            }
            let _ = finished.send(());
        });
        Ok(Beside {
            stop: Some(stop),
            done,
            admin_addr,
            ready,
            live,
        })
    }
}

impl Drop for Beside {
    fn drop(&mut self) {
        // The controller's shutdown future ends once the sender is gone.
        drop(self.stop.take());
        if let Err(mpsc::RecvTimeoutError::Timeout) = self.done.recv_timeout(STOP_WITHIN) {
            tracing::warn!("the repair controller did not stop within {STOP_WITHIN:?}");
        }
    }
}

/// What the controller reports (its metrics, its lookups', its `/ready`),
/// registered in the process's one registry.
type Parts = (Metrics, Arc<AtomicBool>);

fn register(registry: &mut Registry) -> Parts {
    let parts = (Metrics::register(registry), Arc::default());
    process::register(registry);
    parts
}

async fn run(args: Args, parts: Parts, shutdown: impl Future<Output = ()>) -> Result<(), String> {
    let client = client(&args).await?;
    let (metrics, ready) = parts;
    let _socket = answer_lookups(&args, &client, metrics.clone());
    Controller::new(client, args, metrics, ready)
        .run(async {
            shutdown.await;
            tracing::info!("shutting down");
        })
        .await;
    Ok(())
}

/// The client: the kubeconfig flags when given, else `$KUBECONFIG` or
/// `~/.kube/config`, else the pod's service account.
async fn client(args: &Args) -> Result<kube::Client, String> {
    let options = KubeConfigOptions {
        context: args.context.clone(),
        cluster: args.cluster.clone(),
        user: args.user.clone(),
    };
    let mut config = match &args.kubeconfig {
        Some(path) => {
            let kc = Kubeconfig::read_from(path)
                .map_err(|e| format!("cannot read --kubeconfig {}: {e}", path.display()))?;
            kube::Config::from_custom_kubeconfig(kc, &options)
                .await
                .map_err(|e| format!("invalid kubeconfig {}: {e}", path.display()))?
        }
        None if options.context.is_some()
            || options.cluster.is_some()
            || options.user.is_some() =>
        {
            kube::Config::from_kubeconfig(&options)
                .await
                .map_err(|e| format!("cannot load the kubeconfig: {e}"))?
        }
        None => kube::Config::infer().await.map_err(|e| {
            format!("cannot configure the Kubernetes client (no kubeconfig and not in a pod?): {e}")
        })?,
    };
    // One retry policy per call, the controller's: the watch's backoff
    // and the per-pod one for deletions. kube's own layer would retry a
    // 503 fifteen times, from 5 ms, below them.
    config.default_retry = false;
    kube::Client::try_from(config).map_err(|e| format!("cannot create the Kubernetes client: {e}"))
}

/// Answers the plugin's pod lookups when the state dir is mounted; the
/// socket is removed when the returned guard drops (at exit), unless a
/// newer agent has replaced it meanwhile.
fn answer_lookups(
    args: &Args,
    client: &kube::Client,
    metrics: Metrics,
) -> Option<lookup::SocketGuard> {
    if !args.state_dir.is_dir() {
        tracing::info!(
            state_dir = %args.state_dir.display(),
            "no state dir mounted: not answering the plugin's pod lookups (the plugin asks the API server)"
        );
        return None;
    }
    match lookup::bind(&args.state_dir, linkerd_cni_lookup::SOCKET) {
        Ok((listener, guard)) => {
            tracing::info!(socket = %guard.path().display(), "answering the plugin's pod lookups");
            let facts = Facts::start(client.clone(), &args.node_name, metrics, args.api_timeout);
            tokio::spawn(lookup::serve(listener, facts));
            Some(guard)
        }
        Err(e) => {
            tracing::warn!(
                state_dir = %args.state_dir.display(),
                error = %e,
                "cannot answer the plugin's pod lookups (the plugin asks the API server)"
            );
            None
        }
    }
}
