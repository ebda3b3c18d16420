//! The plugin's log line: `<time> <LEVEL> <program>[<pid>]: [<context> ]<message>`,
//! the time in UTC as `YYYY-MM-DDTHH:MM:SS.mmmZ`, and which records make
//! one. The node agent's tracing formatter writes the same shape (its time
//! with microseconds), so that both programs' lines read, and parse (the
//! demo does), alike.

use std::fmt;
use std::time::{SystemTime, UNIX_EPOCH};

/// Whether a record at `m` is logged under the current maximum level. The
/// HTTP client and TLS stack log each handshake step at debug; a debug
/// level is for linkerd-cni's own steps, so theirs need warn.
pub fn enabled(m: &log::Metadata<'_>) -> bool {
    let ours = m.target().starts_with("linkerd_cni");
    m.level() <= log::max_level() && (ours || m.level() <= log::Level::Warn)
}

/// The line for one record at `now`, newline included. `context` (e.g. the
/// pod being handled) leads the message when not empty.
pub fn line(
    now: SystemTime,
    level: log::Level,
    program: &str,
    pid: u32,
    context: &str,
    message: &fmt::Arguments<'_>,
) -> String {
    let t = now.duration_since(UNIX_EPOCH).unwrap_or_default();
    let sep = if context.is_empty() { "" } else { " " };
    format!(
        "{} {level:<5} {program}[{pid}]: {context}{sep}{message}\n",
        rfc3339(t.as_secs(), t.subsec_millis()),
    )
}

/// UTC time as `YYYY-MM-DDTHH:MM:SS.mmmZ`, without a date crate.
pub fn rfc3339(secs: u64, millis: u32) -> String {
    format!("{}.{millis:03}Z", seconds(secs))
}

/// `YYYY-MM-DDTHH:MM:SS` of `secs` since the epoch, in UTC.
fn seconds(secs: u64) -> String {
    let rem = secs % 86_400;
    let (y, m, d) = civil_from_days((secs / 86_400) as i64);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

// Howard Hinnant's days-to-civil algorithm.
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn timestamps() {
        assert_eq!(rfc3339(0, 0), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339(951_782_400, 5), "2000-02-29T00:00:00.005Z");
        assert_eq!(rfc3339(1_795_920_646, 123), "2026-11-29T02:50:46.123Z");
    }

    #[test]
    fn libraries_log_only_warnings() {
        use log::Level;
        log::set_max_level(log::LevelFilter::Debug);
        let meta = |target: &'static str, level| {
            log::Metadata::builder().target(target).level(level).build()
        };
        assert!(enabled(&meta("linkerd_cni::pod", Level::Debug)));
        assert!(enabled(&meta("linkerd_cni_installer", Level::Debug)));
        assert!(enabled(&meta("linkerd_cni_kube::client", Level::Debug)));
        assert!(!enabled(&meta("rustls::client::hs", Level::Debug)));
        assert!(!enabled(&meta("ureq::unversioned", Level::Info)));
        assert!(enabled(&meta("ureq::unversioned", Level::Warn)));
        assert!(!enabled(&meta("linkerd_cni::pod", Level::Trace)));
    }

    #[test]
    fn one_line_with_or_without_context() {
        let at = UNIX_EPOCH + Duration::from_millis(1_795_920_646_123);
        assert_eq!(
            line(at, log::Level::Info, "prog", 7, "", &format_args!("hi")),
            "2026-11-29T02:50:46.123Z INFO  prog[7]: hi\n"
        );
        assert_eq!(
            line(
                at,
                log::Level::Warn,
                "prog",
                7,
                "pod=a/b",
                &format_args!("x {}", 1)
            ),
            "2026-11-29T02:50:46.123Z WARN  prog[7]: pod=a/b x 1\n"
        );
    }
}
