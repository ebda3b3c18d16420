//! The plugin's logger: one line per record on stderr,
//! `<time> <LEVEL> <program>[<pid>]: [<context> ]<message>` with the time in
//! UTC as `YYYY-MM-DDTHH:MM:SS.mmmZ` (the node agent's tracing formatter
//! writes the same shape, so that both read, and parse, alike), and a copy
//! to syslog when `/dev/log` exists (it does not in containers or
//! CI; then stderr alone is used, silently).
//!
//! Never stdout: for the plugin, stdout carries the CNI result.

use std::io::Write;
use std::os::unix::net::UnixDatagram;
use std::sync::{Mutex, OnceLock};
use std::time::{SystemTime, UNIX_EPOCH};

use log::{Level, LevelFilter, Log, Metadata, Record};

struct Logger {
    program: &'static str,
    syslog: Option<UnixDatagram>,
    /// Prefixed to every line, e.g. the container and pod being handled.
    context: Mutex<String>,
}

static LOGGER: OnceLock<Logger> = OnceLock::new();

/// Installs the logger (once; later calls only change the level).
pub fn init(program: &'static str, level: LevelFilter) {
    let logger = LOGGER.get_or_init(|| Logger {
        program,
        syslog: connect_syslog(),
        context: Mutex::new(String::new()),
    });
    // Fails only when another logger is already installed (tests); harmless.
    let _ = log::set_logger(logger);
    log::set_max_level(level);
}

/// Sets the text every following line starts with.
pub fn set_context(ctx: impl Into<String>) {
    if let Some(l) = LOGGER.get() {
        let mut c = l.context.lock().unwrap_or_else(|p| p.into_inner());
        *c = ctx.into();
    }
}

/// The context of one CNI invocation: `container=ID pod=NAMESPACE/NAME`,
/// each part when known. The values come from the runtime's environment,
/// unchecked for DEL, GC and STATUS: shortened, and quoted when they hold
/// anything but visible ASCII, so that one record stays one line.
pub fn invocation_context(container_id: Option<&str>, pod: Option<(&str, &str)>) -> String {
    let mut parts = Vec::new();
    if let Some(id) = container_id {
        parts.push(format!("container={}", printable(id)));
    }
    if let Some((namespace, name)) = pod {
        parts.push(format!("pod={}", printable(&format!("{namespace}/{name}"))));
    }
    parts.join(" ")
}

fn printable(s: &str) -> String {
    const MAX_CHARS: usize = 128;
    let mut cut: String = s.chars().take(MAX_CHARS).collect();
    if cut.len() < s.len() {
        cut.push_str("...");
        format!("{cut:?}")
    } else if cut.chars().all(|c| c.is_ascii_graphic() && c != '"') {
        cut
    } else {
        format!("{cut:?}")
    }
}

/// `log_level` as upstream reads it: debug or info, anything else is warn.
pub fn level_from_config(s: Option<&str>) -> LevelFilter {
    match s.map(str::to_ascii_lowercase).as_deref() {
        Some("debug") => LevelFilter::Debug,
        Some("info") => LevelFilter::Info,
        _ => LevelFilter::Warn,
    }
}

fn connect_syslog() -> Option<UnixDatagram> {
    let sock = UnixDatagram::unbound().ok()?;
    sock.connect("/dev/log").ok()?;
    sock.set_nonblocking(true).ok()?;
    Some(sock)
}

impl Log for Logger {
    /// Under the maximum level; the HTTP client and TLS stack log each
    /// handshake step at debug, which is for linkerd-cni's own steps, so
    /// theirs need warn.
    fn enabled(&self, m: &Metadata) -> bool {
        let ours = m.target().starts_with("linkerd_cni");
        m.level() <= log::max_level() && (ours || m.level() <= Level::Warn)
    }

    fn log(&self, record: &Record) {
        if !self.enabled(record.metadata()) {
            return;
        }
        let ctx = self.context.lock().map(|c| c.clone()).unwrap_or_default();
        let tagged = tagged(self.program, std::process::id(), &ctx, record.args());
        let line = line(SystemTime::now(), record.level(), &tagged);
        let _ = std::io::stderr().lock().write_all(line.as_bytes());
        if let Some(sock) = &self.syslog {
            // RFC 3164 without a timestamp: syslog daemons stamp it.
            let pri = 8 /* facility user */ + severity(record.level());
            let _ = sock.send(format!("<{pri}>{tagged}").as_bytes());
        }
    }

    fn flush(&self) {
        let _ = std::io::stderr().flush();
    }
}

/// `<program>[<pid>]: [<context> ]<message>`: a record as both stderr and
/// syslog carry it.
fn tagged(program: &str, pid: u32, context: &str, message: &std::fmt::Arguments<'_>) -> String {
    let sep = if context.is_empty() { "" } else { " " };
    format!("{program}[{pid}]: {context}{sep}{message}")
}

/// The stderr line for a [`tagged`] record at `now`, newline included.
fn line(now: SystemTime, level: Level, tagged: &str) -> String {
    let t = now.duration_since(UNIX_EPOCH).unwrap_or_default();
    let time = rfc3339(t.as_secs(), t.subsec_millis());
    format!("{time} {level:<5} {tagged}\n")
}

/// UTC time as `YYYY-MM-DDTHH:MM:SS.mmmZ`; a time jiff cannot hold (past
/// the year 9999) is shown as the epoch rather than failing the line.
fn rfc3339(secs: u64, millis: u32) -> String {
    let t = i64::try_from(secs)
        .ok()
        .and_then(|s| jiff::Timestamp::new(s, i32::try_from(millis).ok()? * 1_000_000).ok())
        .unwrap_or(jiff::Timestamp::UNIX_EPOCH);
    format!("{t:.3}")
}

fn severity(l: Level) -> u8 {
    match l {
        Level::Error => 3,
        Level::Warn => 4,
        Level::Info => 6,
        Level::Debug | Level::Trace => 7,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn invocation_context_is_one_short_line() {
        assert_eq!(
            invocation_context(Some("3f1c2b9a7e"), Some(("emojivoto", "web-1"))),
            "container=3f1c2b9a7e pod=emojivoto/web-1"
        );
        assert_eq!(invocation_context(Some("c1"), None), "container=c1");
        assert_eq!(invocation_context(None, None), "");
        assert_eq!(
            invocation_context(Some("a\nb c"), None),
            r#"container="a\nb c""#
        );
        let long = "x".repeat(1000);
        let shown = invocation_context(Some(&long), None);
        assert!(shown.len() < 150 && shown.ends_with("...\""), "{shown}");
    }

    #[test]
    fn timestamps() {
        assert_eq!(rfc3339(0, 0), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339(951_782_400, 5), "2000-02-29T00:00:00.005Z");
        assert_eq!(rfc3339(1_795_920_646, 123), "2026-11-29T02:50:46.123Z");
        // A clock past what the format holds still gives a line.
        assert_eq!(rfc3339(u64::MAX, 0), "1970-01-01T00:00:00.000Z");
    }

    #[test]
    fn libraries_log_only_warnings() {
        log::set_max_level(LevelFilter::Debug);
        let logger = Logger {
            program: "test",
            syslog: None,
            context: Mutex::new(String::new()),
        };
        let enabled = |target: &'static str, level| {
            logger.enabled(&Metadata::builder().target(target).level(level).build())
        };
        assert!(enabled("linkerd_cni::pod", Level::Debug));
        assert!(enabled("linkerd_cni_installer", Level::Debug));
        assert!(enabled("linkerd_cni_kube::client", Level::Debug));
        assert!(!enabled("rustls::client::hs", Level::Debug));
        assert!(!enabled("ureq::unversioned", Level::Info));
        assert!(enabled("ureq::unversioned", Level::Warn));
        assert!(!enabled("linkerd_cni::pod", Level::Trace));
    }

    #[test]
    fn one_line_with_or_without_context() {
        let at = UNIX_EPOCH + std::time::Duration::from_millis(1_795_920_646_123);
        assert_eq!(
            line(at, Level::Info, &tagged("prog", 7, "", &format_args!("hi"))),
            "2026-11-29T02:50:46.123Z INFO  prog[7]: hi\n"
        );
        assert_eq!(
            line(
                at,
                Level::Warn,
                &tagged("prog", 7, "pod=a/b", &format_args!("x {}", 1))
            ),
            "2026-11-29T02:50:46.123Z WARN  prog[7]: pod=a/b x 1\n"
        );
    }

    #[test]
    fn levels_as_upstream() {
        assert_eq!(level_from_config(Some("debug")), LevelFilter::Debug);
        assert_eq!(level_from_config(Some("info")), LevelFilter::Info);
        assert_eq!(level_from_config(Some("trace")), LevelFilter::Warn);
        assert_eq!(level_from_config(None), LevelFilter::Warn);
    }
}
