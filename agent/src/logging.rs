//! The installer's logger: one line per record on stderr, which the
//! container runtime collects for a DaemonSet (no syslog in a container).
//! Never stdout: `check` prints its verdict there.
//!
//! Lines are formatted as the plugin's are, by `linkerd_cni_logline`.

use std::io::Write;
use std::time::SystemTime;

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
        linkerd_cni_logline::enabled(m)
    }

    fn log(&self, record: &Record) {
        if !self.enabled(record.metadata()) {
            return;
        }
        let line = linkerd_cni_logline::line(
            SystemTime::now(),
            record.level(),
            PROGRAM,
            std::process::id(),
            "",
            record.args(),
        );
        let _ = std::io::stderr().lock().write_all(line.as_bytes());
    }

    fn flush(&self) {
        let _ = std::io::stderr().flush();
    }
}
