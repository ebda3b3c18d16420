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

/// What one scrape read; `None` where a file could not be read or parsed.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Sample {
    pub cpu_seconds: Option<f64>,
    pub open_fds: Option<u64>,
    pub max_fds: Option<u64>,
    pub virtual_memory_bytes: Option<u64>,
    pub virtual_memory_max_bytes: Option<u64>,
    pub resident_memory_bytes: Option<u64>,
    pub heap_bytes: Option<u64>,
    pub start_time_seconds: Option<f64>,
    pub threads: Option<u64>,
}

impl Sample {
    /// Reads this process' numbers.
    pub fn read() -> Sample {
        let read = |path: &str| match std::fs::read_to_string(path) {
            Ok(s) => Some(s),
            Err(e) => {
                tracing::debug!(path, error = %e, "cannot read for the process metrics");
                None
            }
        };
        let mut s = Sample::default();
        if let Some(stat) = read("/proc/self/stat").as_deref().and_then(Stat::parse) {
            s.cpu_seconds = Some((stat.utime + stat.stime) as f64 / USER_HZ);
            s.threads = Some(stat.num_threads);
            s.virtual_memory_bytes = Some(stat.vsize);
            // Counted back from now by the process' age on the boot-time
            // clock: `btime` in /proc/stat is truncated to whole seconds and
            // drifts from the wall clock as NTP slews it, which put the start
            // more than a second off.
            let uptime = read("/proc/uptime").as_deref().and_then(uptime_seconds);
            let now = crate::metrics::secs(SystemTime::now());
            s.start_time_seconds = uptime.map(|up| now - (up - stat.starttime as f64 / USER_HZ));
        }
        if let Some(status) = read("/proc/self/status") {
            s.resident_memory_bytes = status_kb(&status, "VmRSS").map(|kb| kb * 1024);
        }
        if let Some(limits) = read("/proc/self/limits") {
            // (One read for both rows; `max_fds` is for callers outside a
            // scrape.)
            s.max_fds = soft_limit(&limits, "Max open files");
            s.virtual_memory_max_bytes = soft_limit(&limits, "Max address space");
        }
        if let Some(maps) = read("/proc/self/maps") {
            s.heap_bytes = Some(heap_size(&maps));
        }
        s.open_fds = std::fs::read_dir("/proc/self/fd")
            .map(|d| d.filter(|e| e.is_ok()).count() as u64)
            .ok();
        s
    }
}

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let s = Sample::read();
        let now = crate::metrics::secs(SystemTime::now());
        if let Some(v) = s.cpu_seconds {
            let m = ConstCounter::new(v);
            m.encode(encoder.encode_descriptor(
                "cpu",
                "Total user and system CPU time spent in seconds",
                Some(&Unit::Seconds),
                MetricType::Counter,
            )?)?;
        }
        for (name, help, unit, value) in s.gauges() {
            if let Some(v) = value {
                // f64: an unlimited limit is u64::MAX, as Go's client shows it.
                ConstGauge::new(v as f64).encode(encoder.encode_descriptor(
                    name,
                    help,
                    unit.as_ref(),
                    MetricType::Gauge,
                )?)?;
            }
        }
        encode_times(&mut encoder, s.start_time_seconds, now)
    }
}

/// A gauge's name, help, unit and value (`None`: left out of this scrape).
type GaugeRow = (&'static str, &'static str, Option<Unit>, Option<u64>);

impl Sample {
    /// The gauges read from `/proc`, in the order they are exported.
    fn gauges(&self) -> [GaugeRow; 7] {
        [
            (
                "open_fds",
                "Number of open file descriptors",
                None,
                self.open_fds,
            ),
            (
                "max_fds",
                "Maximum number of open file descriptors",
                None,
                self.max_fds,
            ),
            (
                "virtual_memory",
                "Virtual memory size in bytes",
                Some(Unit::Bytes),
                self.virtual_memory_bytes,
            ),
            (
                "virtual_memory_max",
                "Maximum amount of virtual memory available in bytes",
                Some(Unit::Bytes),
                self.virtual_memory_max_bytes,
            ),
            (
                "resident_memory",
                "Resident memory size in bytes",
                Some(Unit::Bytes),
                self.resident_memory_bytes,
            ),
            (
                "heap",
                "Process heap size in bytes (the brk heap)",
                Some(Unit::Bytes),
                self.heap_bytes,
            ),
            (
                "threads",
                "Number of OS threads in the process",
                None,
                self.threads,
            ),
        ]
    }
}

/// The process' start, its uptime (only when the start is known: never
/// an uptime counted from the epoch) and the clock they were read by.
fn encode_times(
    encoder: &mut DescriptorEncoder,
    start: Option<f64>,
    now: f64,
) -> Result<(), std::fmt::Error> {
    let seconds = Some(Unit::Seconds);
    if let Some(start) = start {
        ConstGauge::new(start).encode(encoder.encode_descriptor(
            "start_time",
            "Start time of the process since unix epoch in seconds",
            seconds.as_ref(),
            MetricType::Gauge,
        )?)?;
        ConstCounter::new((now - start).max(0.0)).encode(encoder.encode_descriptor(
            "uptime",
            "Total time since the process started (in seconds)",
            seconds.as_ref(),
            MetricType::Counter,
        )?)?;
    }
    ConstGauge::new(now.floor()).encode(encoder.encode_descriptor(
        "clock_time",
        "Current system time for this process",
        seconds.as_ref(),
        MetricType::Gauge,
    )?)?;
    Ok(())
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
        let s = Sample::read();
        let open = s.open_fds.expect("open fds");
        assert!(open >= 3, "{s:?}");
        assert!(s.max_fds.expect("max fds") >= open);
        assert!(s.resident_memory_bytes.expect("rss") > 0);
        assert!(s.virtual_memory_bytes.expect("vsize") >= s.resident_memory_bytes.unwrap());
        assert!(s.threads.expect("threads") >= 1);
        let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
        let start = s.start_time_seconds.expect("start time");
        assert!(start <= now.as_secs_f64() + 1.0 && start > now.as_secs_f64() - 86400.0);
        assert!(s.cpu_seconds.is_some());
    }
}
