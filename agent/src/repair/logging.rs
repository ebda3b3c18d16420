//! Logs on stderr, plain or JSON, filtered by upstream's `--log-level`
//! syntax. kube-rs reports through `tracing`, so its retries and watch
//! errors land in the same log.

use tracing_subscriber::EnvFilter;
use tracing_subscriber::filter::ParseError;

use crate::repair::args::LogFormat;

#[derive(Debug, thiserror::Error)]
pub enum LoggingError {
    #[error(
        "invalid --log-level {filter:?} (expected a level such as info, or directives such as linkerd_cni_agent=debug,warn): {source}"
    )]
    Filter {
        filter: String,
        #[source]
        source: ParseError,
    },
    #[error("cannot set up logging: {0}")]
    Install(#[source] Box<dyn std::error::Error + Send + Sync>),
}

/// Installs the global subscriber.
pub fn init(filter: &str, format: LogFormat) -> Result<(), LoggingError> {
    let env_filter = EnvFilter::try_new(filter).map_err(|source| LoggingError::Filter {
        filter: filter.to_string(),
        source,
    })?;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(env_filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Plain => builder.with_ansi(false).try_init(),
        LogFormat::Json => builder.json().try_init(),
    }
    .map_err(LoggingError::Install)
}
