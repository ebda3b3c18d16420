//! Logs on stderr, plain or JSON, filtered by upstream's `--log-level`
//! syntax. kube-rs reports through `tracing`, so its retries and watch
//! errors land in the same log.

use tracing_subscriber::EnvFilter;

use crate::args::LogFormat;

/// Installs the global subscriber. Fails on an invalid filter, naming it.
pub fn init(filter: &str, format: LogFormat) -> Result<(), String> {
    let filter =
        EnvFilter::try_new(filter).map_err(|e| format!("invalid --log-level {filter:?}: {e}"))?;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let result = match format {
        LogFormat::Plain => builder.with_ansi(false).try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
    result.map_err(|e| format!("cannot set up logging: {e}"))
}
