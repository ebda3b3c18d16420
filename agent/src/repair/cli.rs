//! The repair controller's command line: `linkerd-cni-repair-controller`,
//! as the linkerd2-cni chart's repair-controller container runs it.

use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use crate::repair::admin::{self, AdminState, Limits};
use crate::repair::args::Args;
use crate::repair::backoff::Policy;
use crate::repair::controller::{Controller, Settings};
use crate::repair::logging;
use crate::repair::lookup::{self, Facts, LookupMetrics};
use crate::repair::metrics::Metrics;
use crate::repair::process;
use clap::Parser;
use kube::config::{KubeConfigOptions, Kubeconfig};
use prometheus_client::registry::Registry;
use tokio::signal::unix::{SignalKind, signal};

pub fn main() -> ExitCode {
    let args = Args::parse();
    if let Err(e) = logging::init(&args.log_level, args.log_format) {
        eprintln!("linkerd-cni-repair-controller: {e}");
        return ExitCode::from(2);
    }
    // One thread: the controller never blocks it (file reads go to the
    // blocking pool), so the admin server answers probes between its awaits.
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            tracing::error!("cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(run(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e}");
            ExitCode::FAILURE
        }
    }
}

async fn run(args: Args) -> Result<(), String> {
    let client = client(&args).await?;

    let mut registry = Registry::default();
    let metrics = Metrics::register(&mut registry);
    let lookup_metrics = LookupMetrics::register(&mut registry);
    process::register(&mut registry);
    let ready = Arc::new(AtomicBool::new(false));
    let admin_addr = args.admin_listen();
    let listener = admin::bind(admin_addr)
        .await
        .map_err(|e| format!("cannot listen on {admin_addr} (--admin-addr, --admin-ip): {e}"))?;
    let local = listener
        .local_addr()
        .map_err(|e| format!("cannot read the admin address: {e}"))?;
    tracing::info!(addr = %local, "admin server listening");
    let limits = Limits::default().for_fd_limit(process::max_fds());
    tokio::spawn(admin::serve(
        listener,
        AdminState {
            ready: ready.clone(),
            registry: Arc::new(registry),
        },
        limits,
    ));

    let _socket = answer_lookups(&args, &client, lookup_metrics);

    let mut term =
        signal(SignalKind::terminate()).map_err(|e| format!("cannot handle SIGTERM: {e}"))?;
    let mut int =
        signal(SignalKind::interrupt()).map_err(|e| format!("cannot handle SIGINT: {e}"))?;
    let shutdown = async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
        tracing::info!("shutting down");
    };

    let settings = Settings {
        node_name: args.node_name,
        controller_pod_name: args.controller_pod_name,
        cni_net_dir: args.cni_net_dir,
        chain_check_interval: args.chain_check_interval,
        backoff: Policy {
            initial: args.pod_backoff,
            max: args.pod_backoff_max.max(args.pod_backoff),
        },
        api_timeout: args.api_timeout,
    };
    Controller::new(client, settings, metrics, ready)
        .run(shutdown)
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
    metrics: LookupMetrics,
) -> Option<lookup::SocketGuard> {
    if !args.state_dir.is_dir() {
        tracing::info!(
            state_dir = %args.state_dir.display(),
            "no state dir mounted: not answering the plugin's pod lookups (the plugin asks the API server)"
        );
        return None;
    }
    match lookup::bind(&args.state_dir) {
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
