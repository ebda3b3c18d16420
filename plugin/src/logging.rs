//! The plugin's logger: one line per record on stderr (formatted by
//! `linkerd_cni_logline`, as the installer's are),
//! and a copy to syslog when `/dev/log` exists (it does not in containers or
//! CI; then stderr alone is used, silently).
//!
//! Never stdout: for the plugin, stdout carries the CNI result.

use std::io::Write;
use std::os::unix::net::UnixDatagram;
use std::sync::{Mutex, OnceLock};
use std::time::SystemTime;

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
    fn enabled(&self, m: &Metadata) -> bool {
        linkerd_cni_logline::enabled(m)
    }

    fn log(&self, record: &Record) {
        if !self.enabled(record.metadata()) {
            return;
        }
        let ctx = self.context.lock().map(|c| c.clone()).unwrap_or_default();
        let sep = if ctx.is_empty() { "" } else { " " };
        let pid = std::process::id();
        let line = linkerd_cni_logline::line(
            SystemTime::now(),
            record.level(),
            self.program,
            pid,
            &ctx,
            record.args(),
        );
        let _ = std::io::stderr().lock().write_all(line.as_bytes());
        if let Some(sock) = &self.syslog {
            // RFC 3164 without a timestamp: syslog daemons stamp it.
            let pri = 8 /* facility user */ + severity(record.level());
            let msg = format!(
                "<{pri}>{}[{pid}]: {ctx}{sep}{}",
                self.program,
                record.args()
            );
            let _ = sock.send(msg.as_bytes());
        }
    }

    fn flush(&self) {
        let _ = std::io::stderr().flush();
    }
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
    fn levels_as_upstream() {
        assert_eq!(level_from_config(Some("debug")), LevelFilter::Debug);
        assert_eq!(level_from_config(Some("info")), LevelFilter::Info);
        assert_eq!(level_from_config(Some("trace")), LevelFilter::Warn);
        assert_eq!(level_from_config(None), LevelFilter::Warn);
    }
}
