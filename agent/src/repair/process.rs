//! The standard `process_*` metrics, read from `/proc/self` on each
//! scrape: the set Prometheus' client library guidelines name (CPU time,
//! open and maximum fds, virtual memory and its limit, resident memory,
//! heap, start time, threads) and the two upstream's controller adds
//! through kubert (`process_clock_time_seconds`,
//! `process_uptime_seconds_total`), under the names Prometheus' Go and
//! Rust clients give them.
//!
//! Nothing here needs a dependency or `unsafe`: `/proc` reports CPU times
//! and start times in `USER_HZ` ticks, which the kernel fixes at 100 for
//! user space on every architecture this image is built for, and memory in
//! kB or bytes. A value that cannot be read is left out of that scrape
//! (and logged at debug level) rather than reported as 0.

use std::time::SystemTime;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::{Registry, Unit};

/// The kernel's clock ticks per second in `/proc/*/stat` (`USER_HZ`).
const USER_HZ: f64 = 100.0;

/// The soft `RLIMIT_NOFILE` of this process (`u64::MAX` when unlimited).
pub fn max_fds() -> Option<u64> {
    let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
    soft_limit(&limits, "Max open files")
}

/// Registers the collector under `process_` in `registry`.
pub fn register(registry: &mut Registry) {
    registry
        .sub_registry_with_prefix("process")
        .register_collector(Box::new(ProcessCollector));
}

#[derive(Debug)]
struct ProcessCollector;

/// One metric of a scrape: its name (under `process_`), help, unit, type
/// (a counter or a gauge) and value.
type Row = (&'static str, &'static str, Option<Unit>, MetricType, f64);

/// This process' numbers, in the order they are exported; a value that
/// cannot be read or parsed is left out.
fn sample() -> Vec<Row> {
    let read = |path: &str| match std::fs::read_to_string(path) {
        Ok(s) => Some(s),
        Err(e) => {
            tracing::debug!(path, error = %e, "cannot read for the process metrics");
            None
        }
    };
    let stat = read("/proc/self/stat").as_deref().and_then(Stat::parse);
    let limits = read("/proc/self/limits");
    // f64: an unlimited limit is u64::MAX, as Go's client shows it.
    let limit = |row| Some(soft_limit(limits.as_deref()?, row)? as f64);
    // Counted back from now by the process' age on the boot-time clock:
    // `btime` in /proc/stat is truncated to whole seconds and drifts from
    // the wall clock as NTP slews it, which put the start more than a
    // second off.
    let now = crate::metrics::secs(SystemTime::now());
    let uptime = read("/proc/uptime").as_deref().and_then(uptime_seconds);
    let start = stat
        .as_ref()
        .zip(uptime)
        .map(|(stat, up)| now - (up - stat.starttime as f64 / USER_HZ));
    let (seconds, bytes) = (Some(Unit::Seconds), Some(Unit::Bytes));
    use MetricType::{Counter, Gauge};
    let rows = [
        (
            "cpu",
            "Total user and system CPU time spent in seconds",
            seconds.clone(),
            Counter,
            stat.as_ref().map(|s| (s.utime + s.stime) as f64 / USER_HZ),
        ),
        (
            "open_fds",
            "Number of open file descriptors",
            None,
            Gauge,
            std::fs::read_dir("/proc/self/fd")
                .map(|d| d.filter(|e| e.is_ok()).count() as f64)
                .ok(),
        ),
        (
            "max_fds",
            "Maximum number of open file descriptors",
            None,
            Gauge,
            limit("Max open files"),
        ),
        (
            "virtual_memory",
            "Virtual memory size in bytes",
            bytes.clone(),
            Gauge,
            stat.as_ref().map(|s| s.vsize as f64),
        ),
        (
            "virtual_memory_max",
            "Maximum amount of virtual memory available in bytes",
            bytes.clone(),
            Gauge,
            limit("Max address space"),
        ),
        (
            "resident_memory",
            "Resident memory size in bytes",
            bytes.clone(),
            Gauge,
            read("/proc/self/status")
                .and_then(|s| status_kb(&s, "VmRSS"))
                .map(|kb| (kb * 1024) as f64),
        ),
        (
            "heap",
            "Process heap size in bytes (the brk heap)",
            bytes,
            Gauge,
            read("/proc/self/maps").map(|m| heap_size(&m) as f64),
        ),
        (
            "threads",
            "Number of OS threads in the process",
            None,
            Gauge,
            stat.as_ref().map(|s| s.num_threads as f64),
        ),
        (
            "start_time",
            "Start time of the process since unix epoch in seconds",
            seconds.clone(),
            Gauge,
            start,
        ),
        // Only when the start is known: never an uptime counted from the
        // epoch.
        (
            "uptime",
            "Total time since the process started (in seconds)",
            seconds.clone(),
            Counter,
            start.map(|start| (now - start).max(0.0)),
        ),
        (
            "clock_time",
            "Current system time for this process",
            seconds,
            Gauge,
            Some(now.floor()),
        ),
    ];
    rows.into_iter()
        .filter_map(|(name, help, unit, kind, value)| Some((name, help, unit, kind, value?)))
        .collect()
}

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        for (name, help, unit, kind, value) in sample() {
            let metric = encoder.encode_descriptor(name, help, unit.as_ref(), kind)?;
            match kind {
                MetricType::Counter => ConstCounter::new(value).encode(metric)?,
                _ => ConstGauge::new(value).encode(metric)?,
            }
        }
        Ok(())
    }
}

/// The fields of `/proc/self/stat` used here.
#[derive(Debug, PartialEq, Eq)]
struct Stat {
    utime: u64,
    stime: u64,
    num_threads: u64,
    starttime: u64,
    vsize: u64,
}

impl Stat {
    /// The command name (field 2) may hold spaces and parentheses: fields
    /// are counted from the last `)`.
    fn parse(text: &str) -> Option<Stat> {
        let rest = &text[text.rfind(')')? + 1..];
        let fields: Vec<&str> = rest.split_whitespace().collect();
        // Field N of proc(5) is fields[N - 3].
        let field = |n: usize| fields.get(n - 3)?.parse::<u64>().ok();
        Some(Stat {
            utime: field(14)?,
            stime: field(15)?,
            num_threads: field(20)?,
            starttime: field(22)?,
            vsize: field(23)?,
        })
    }
}

/// The first field of `/proc/uptime`: seconds since boot, to the
/// centisecond.
fn uptime_seconds(text: &str) -> Option<f64> {
    text.split_whitespace()
        .next()?
        .parse()
        .ok()
        .filter(|s: &f64| s.is_finite())
}

/// A `Key:   123 kB` line of `/proc/self/status`.
fn status_kb(text: &str, key: &str) -> Option<u64> {
    let line = text
        .lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))?;
    line.split_whitespace().next()?.parse().ok()
}

/// The soft limit of a `/proc/self/limits` row; `unlimited` is `u64::MAX`.
fn soft_limit(text: &str, row: &str) -> Option<u64> {
    let rest = text.lines().find_map(|l| l.strip_prefix(row))?;
    match rest.split_whitespace().next()? {
        "unlimited" => Some(u64::MAX),
        v => v.parse().ok(),
    }
}

/// The size of the `[heap]` mapping in `/proc/self/maps` (0 when there is
/// none, as with an allocator that only maps anonymous memory).
fn heap_size(maps: &str) -> u64 {
    maps.lines()
        .filter(|l| l.trim_end().ends_with("[heap]"))
        .filter_map(|l| {
            let (start, end) = l.split_whitespace().next()?.split_once('-')?;
            let start = u64::from_str_radix(start, 16).ok()?;
            let end = u64::from_str_radix(end, 16).ok()?;
            end.checked_sub(start)
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::UNIX_EPOCH;

    #[test]
    fn parses_proc_files() {
        let stat = "4242 (a (weird) name) S 1 4242 4242 0 -1 4194560 1000 0 0 0 \
                    250 50 0 0 20 0 3 0 12345 104857600 2560 18446744073709551615";
        assert_eq!(
            Stat::parse(stat),
            Some(Stat {
                utime: 250,
                stime: 50,
                num_threads: 3,
                starttime: 12345,
                vsize: 104857600,
            })
        );
        assert_eq!(Stat::parse("4242 (truncated) S 1"), None);
        assert_eq!(uptime_seconds("5071.37 9868.10\n"), Some(5071.37));
        assert_eq!(uptime_seconds("nan 1\n"), None);
        assert_eq!(
            status_kb("VmPeak:\t  9000 kB\nVmRSS:\t  1234 kB\n", "VmRSS"),
            Some(1234)
        );
        let limits = "Limit  Soft Limit  Hard Limit  Units\n\
                      Max open files            1024                 4096                 files\n\
                      Max address space         unlimited            unlimited            bytes\n";
        assert_eq!(soft_limit(limits, "Max open files"), Some(1024));
        assert_eq!(soft_limit(limits, "Max address space"), Some(u64::MAX));
        let maps = "55e0a0000000-55e0a0021000 rw-p 00000000 00:00 0    [heap]\n\
                    7f0000000000-7f0000001000 r--p 00000000 00:00 0    [stack]\n";
        assert_eq!(heap_size(maps), 0x21000);
    }

    #[test]
    fn reads_this_process() {
        let rows = sample();
        let value = |name: &str| {
            let row = rows.iter().find(|r| r.0 == name);
            row.unwrap_or_else(|| panic!("no {name}: {rows:?}")).4
        };
        let open = value("open_fds");
        assert!(open >= 3.0, "{rows:?}");
        assert!(value("max_fds") >= open);
        assert!(value("resident_memory") > 0.0);
        assert!(value("virtual_memory") >= value("resident_memory"));
        assert!(value("threads") >= 1.0);
        let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
        let start = value("start_time");
        assert!(start <= now.as_secs_f64() + 1.0 && start > now.as_secs_f64() - 86400.0);
        value("cpu");
    }
}
