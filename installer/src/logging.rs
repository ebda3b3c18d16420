//! The installer's logger: one line per record on stderr, which the
//! container runtime collects for a DaemonSet (no syslog in a container).
//! Never stdout: `check` prints its verdict there.
//!
//! Lines look like the plugin's, `<time> <LEVEL> <program>[<pid>]: <message>`,
//! so both read (and parse, as the demo does) alike.

use std::io::Write;
use std::time::{SystemTime, UNIX_EPOCH};

use log::{LevelFilter, Log, Metadata, Record};

const PROGRAM: &str = "linkerd-cni-installer";

struct Logger;

/// Installs the logger with `level` (once; later calls only change the
/// level).
pub fn init(level: LevelFilter) {
    // Fails only when a logger is already installed; harmless.
    let _ = log::set_logger(&Logger);
    log::set_max_level(level);
}

impl Log for Logger {
    fn enabled(&self, m: &Metadata) -> bool {
        m.level() <= log::max_level()
    }

    fn log(&self, record: &Record) {
        if !self.enabled(record.metadata()) {
            return;
        }
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        let line = format!(
            "{} {:<5} {PROGRAM}[{}]: {}\n",
            rfc3339(now.as_secs(), now.subsec_millis()),
            record.level(),
            std::process::id(),
            record.args()
        );
        let _ = std::io::stderr().lock().write_all(line.as_bytes());
    }

    fn flush(&self) {
        let _ = std::io::stderr().flush();
    }
}

/// UTC time as `YYYY-MM-DDTHH:MM:SS.mmmZ`, without a date crate.
fn rfc3339(secs: u64, millis: u32) -> String {
    let rem = secs % 86_400;
    let (y, m, d) = civil_from_days((secs / 86_400) as i64);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{millis:03}Z",
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

    #[test]
    fn timestamps() {
        assert_eq!(rfc3339(0, 0), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339(951_782_400, 5), "2000-02-29T00:00:00.005Z");
        assert_eq!(rfc3339(1_795_920_646, 123), "2026-11-29T02:50:46.123Z");
    }
}
