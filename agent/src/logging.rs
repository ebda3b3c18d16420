//! Logs, for both command lines: stderr only (the container runtime
//! collects it; stdout is `check`'s and `status`'s report), one line per
//! event, `<time> <LEVEL> <program>[<pid>]: <message> <fields>` as the
//! plugin writes them, or JSON. kube-rs reports through `tracing`, and
//! linkerd-cni's libraries (chain, kube) through `log`, bridged here: all
//! in one log, under one filter.

use std::fmt;

use tracing::{Event, Subscriber};
use tracing_subscriber::EnvFilter;
use tracing_subscriber::filter::ParseError;
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::time::{FormatTime, SystemTime};
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

/// linkerd-cni's own steps, and only warnings from the libraries beneath
/// (the HTTP and TLS stacks log every handshake step below that).
pub const ROUTINE: &str = "linkerd_cni=info,warn";
/// Warnings and errors only.
pub const QUIET: &str = "warn";

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    Plain,
    Json,
}

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

/// Installs the global subscriber (once; a second call fails), `program`
/// naming the plain lines.
pub fn init(program: &'static str, filter: &str, format: LogFormat) -> Result<(), LoggingError> {
    let env_filter = EnvFilter::try_new(filter).map_err(|source| LoggingError::Filter {
        filter: filter.to_string(),
        source,
    })?;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(env_filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Plain => builder
            .with_ansi(false)
            .event_format(Line { program })
            .try_init(),
        LogFormat::Json => builder.json().try_init(),
    }
    .map_err(LoggingError::Install)
}

/// The plain line.
struct Line {
    program: &'static str,
}

impl<S, N> FormatEvent<S, N> for Line
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut w: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        SystemTime.format_time(&mut w)?;
        write!(
            w,
            " {:<5} {}[{}]: ",
            event.metadata().level().as_str(),
            self.program,
            std::process::id()
        )?;
        ctx.field_format().format_fields(w.by_ref(), event)?;
        writeln!(w)
    }
}
