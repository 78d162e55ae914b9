//! The process collector: the `process_*` series Prometheus's client libraries export (CPU
//! time, memory, file descriptors, threads, start time), read from `/proc/self` at each scrape.
//! Elsewhere than Linux it exports nothing (the operator runs on Linux; the command line also
//! builds for macOS and Windows).

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric as _};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;

/// The series the collector exports.
pub const SERIES: [&str; 7] = [
    "process_cpu_seconds_total",
    "process_resident_memory_bytes",
    "process_virtual_memory_bytes",
    "process_threads",
    "process_open_fds",
    "process_max_fds",
    "process_start_time_seconds",
];

/// What `/proc/self` says of this process.
#[derive(Debug, Default, Clone, PartialEq)]
struct Sample {
    cpu_seconds: f64,
    resident_bytes: i64,
    virtual_bytes: i64,
    threads: i64,
    open_fds: i64,
    max_fds: i64,
    start_time_seconds: f64,
}

/// The kernel's clock ticks per second in `/proc/<pid>/stat` (`USER_HZ`): 100 on every Linux
/// architecture's user-space ABI.
#[cfg_attr(not(target_os = "linux"), allow(dead_code))]
const USER_HZ: f64 = 100.0;

impl Sample {
    /// Read from `/proc/self` and `/proc/stat`; a file that cannot be read leaves its series at 0.
    #[cfg(target_os = "linux")]
    fn read() -> Self {
        let read = |path: &str| std::fs::read_to_string(path).unwrap_or_default();
        let (stat, status, limits, system) = (
            read("/proc/self/stat"),
            read("/proc/self/status"),
            read("/proc/self/limits"),
            read("/proc/stat"),
        );
        let open_fds = std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count());
        Self::parse(&stat, &status, &limits, &system, open_fds)
    }

    #[cfg(not(target_os = "linux"))]
    fn read() -> Self {
        Self::default()
    }

    /// From the text of `/proc/self/stat`, `/proc/self/status`, `/proc/self/limits` and
    /// `/proc/stat`, and the number of open file descriptors.
    #[cfg_attr(not(target_os = "linux"), allow(dead_code))]
    fn parse(stat: &str, status: &str, limits: &str, system: &str, open_fds: usize) -> Self {
        // The command's name is in parentheses and may hold anything: fields follow the last ')'.
        let fields: Vec<&str> = stat
            .rsplit_once(')')
            .map_or("", |(_, rest)| rest)
            .split_whitespace()
            .collect();
        // Field N of proc(5) is fields[N - 3].
        let field = |n: usize| -> f64 {
            fields
                .get(n - 3)
                .and_then(|v| v.parse::<f64>().ok())
                .unwrap_or(0.0)
        };
        let kib = |key: &str| -> i64 {
            status
                .lines()
                .find_map(|l| l.strip_prefix(key))
                .and_then(|v| v.split_whitespace().next())
                .and_then(|v| v.parse::<i64>().ok())
                .unwrap_or(0)
        };
        let max_fds = limits
            .lines()
            .find_map(|l| l.strip_prefix("Max open files"))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse::<i64>().ok())
            .unwrap_or(0);
        let boot = system
            .lines()
            .find_map(|l| l.strip_prefix("btime "))
            .and_then(|v| v.trim().parse::<f64>().ok())
            .unwrap_or(0.0);
        Self {
            cpu_seconds: (field(14) + field(15)) / USER_HZ,
            resident_bytes: kib("VmRSS:") * 1024,
            virtual_bytes: kib("VmSize:") * 1024,
            threads: kib("Threads:"),
            open_fds: i64::try_from(open_fds).unwrap_or(i64::MAX),
            max_fds,
            start_time_seconds: boot + field(22) / USER_HZ,
        }
    }
}

/// Exports [`Sample`] at each scrape.
#[derive(Debug, Default)]
pub struct ProcessCollector;

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let s = Sample::read();
        let cpu = ConstCounter::new(s.cpu_seconds);
        cpu.encode(encoder.encode_descriptor(
            "process_cpu_seconds",
            "Total user and system CPU time spent in seconds",
            None,
            cpu.metric_type(),
        )?)?;
        for (name, help, value) in [
            (
                "process_resident_memory_bytes",
                "Resident memory size in bytes",
                s.resident_bytes,
            ),
            (
                "process_virtual_memory_bytes",
                "Virtual memory size in bytes",
                s.virtual_bytes,
            ),
            ("process_threads", "Number of OS threads", s.threads),
            (
                "process_open_fds",
                "Number of open file descriptors",
                s.open_fds,
            ),
            (
                "process_max_fds",
                "Maximum number of open file descriptors",
                s.max_fds,
            ),
        ] {
            let gauge = ConstGauge::new(value);
            gauge.encode(encoder.encode_descriptor(name, help, None, gauge.metric_type())?)?;
        }
        let start = ConstGauge::new(s.start_time_seconds);
        start.encode(encoder.encode_descriptor(
            "process_start_time_seconds",
            "Start time of the process since the Unix epoch in seconds",
            None,
            start.metric_type(),
        )?)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_files_are_read_as_the_kernel_writes_them() {
        // A command name with spaces and parentheses, as a process may name itself.
        let stat = "4242 (host (x) y) S 1 4242 4242 0 -1 4194560 1000 0 0 0 250 150 0 0 20 0 7 0 12345 104857600 2560 18446744073709551615";
        let status = "Name:\thost\nVmSize:\t  102400 kB\nVmRSS:\t   10240 kB\nThreads:\t7\n";
        let limits = "Limit                     Soft Limit           Hard Limit           Units\nMax open files            1024                 524288               files\n";
        let system = "cpu  1 2 3\nbtime 1700000000\nprocesses 9\n";
        let s = Sample::parse(stat, status, limits, system, 12);
        assert!(
            (s.start_time_seconds - 1_700_000_123.45).abs() < 1e-3,
            "{s:?}"
        );
        assert_eq!(
            s,
            Sample {
                cpu_seconds: 4.0,
                resident_bytes: 10 << 20,
                virtual_bytes: 100 << 20,
                threads: 7,
                open_fds: 12,
                max_fds: 1024,
                start_time_seconds: s.start_time_seconds,
            }
        );
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn this_process_reads_as_running() {
        let s = Sample::read();
        assert!(s.resident_bytes > 0 && s.threads > 0 && s.open_fds > 0 && s.max_fds > 0);
        assert!(s.start_time_seconds > 1_600_000_000.0, "{s:?}");
    }
}
