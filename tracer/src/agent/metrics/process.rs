//! The agent's own CPU and memory, read from /proc and its cgroup at each scrape: the
//! `process_*` metrics every Prometheus client library exports (same names, so dashboards
//! and habits carry over), and `dnspath_cgroup_*`: what the kernel charges the agent's
//! cgroup (the BPF maps included, which RSS leaves out; what the OOM killer acts on) and
//! the cgroup's limits, the DaemonSet's `resources.limits` as the kernel enforces them.
//! A limit that is not set (`max`) is not exported: no series, rather than an infinity.
use std::path::{Path, PathBuf};

use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeMetric},
    metrics::{counter::ConstCounter, gauge::ConstGauge},
    registry::Unit,
};

/// The families the two collectors export, as a scrape's `# TYPE` lines name them (a
/// counter without its `_total`).
#[cfg(test)]
pub(super) const COLLECTED: [&str; 6] = [
    "process_cpu_seconds",
    "process_resident_memory_bytes",
    "process_start_time_seconds",
    "dnspath_cgroup_memory_bytes",
    "dnspath_cgroup_memory_limit_bytes",
    "dnspath_cgroup_cpu_limit_cores",
];

/// What one scrape reads of the process itself.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(super) struct ProcessSample {
    pub(super) cpu_seconds: Option<f64>,
    pub(super) resident_bytes: Option<u64>,
    pub(super) start_seconds: Option<f64>,
}

/// What one scrape reads of the process's cgroup.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(super) struct CgroupSample {
    pub(super) memory_bytes: Option<u64>,
    pub(super) memory_limit_bytes: Option<u64>,
    pub(super) cpu_limit_cores: Option<f64>,
}

/// user + system CPU seconds (fields 14 and 15 of /proc/PID/stat, in clock ticks) and the
/// start time after boot (field 22), from the text after the command's closing parenthesis
/// (the command itself may hold spaces and parentheses).
pub(super) fn parse_stat(stat: &str, ticks_per_second: f64) -> Option<(f64, f64)> {
    let after = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = after.split_whitespace().collect();
    // fields[0] is field 3 (state).
    let utime: f64 = fields.get(11)?.parse().ok()?;
    let stime: f64 = fields.get(12)?.parse().ok()?;
    let start: f64 = fields.get(19)?.parse().ok()?;
    Some(((utime + stime) / ticks_per_second, start / ticks_per_second))
}

/// `VmRSS` of /proc/PID/status, in bytes.
pub(super) fn parse_rss(status: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// `btime` of /proc/stat: boot time, seconds since the epoch.
pub(super) fn parse_btime(stat: &str) -> Option<f64> {
    stat.lines()
        .find_map(|l| l.strip_prefix("btime "))?
        .trim()
        .parse()
        .ok()
}

/// A cgroup v2 `memory.max` or v1 `memory.limit_in_bytes`: `None` when unlimited (`max`,
/// or v1's page-rounded `i64::MAX`).
pub(super) fn parse_memory_limit(text: &str) -> Option<u64> {
    let n: u64 = text.trim().parse().ok()?;
    (n < 1 << 62).then_some(n)
}

/// Cores a cgroup may use: v2 `cpu.max` (`QUOTA PERIOD`, `max PERIOD` when unlimited).
pub(super) fn parse_cpu_max(text: &str) -> Option<f64> {
    let mut it = text.split_whitespace();
    let quota: f64 = it.next()?.parse().ok()?;
    let period: f64 = it.next()?.parse().ok()?;
    (quota > 0.0 && period > 0.0).then(|| quota / period)
}

/// Cores from v1 `cpu.cfs_quota_us` and `cpu.cfs_period_us` (quota -1: unlimited).
pub(super) fn parse_cfs(quota: &str, period: &str) -> Option<f64> {
    let quota: f64 = quota.trim().parse().ok()?;
    let period: f64 = period.trim().parse().ok()?;
    (quota > 0.0 && period > 0.0).then(|| quota / period)
}

/// The directories of this process's cgroups under `mount`: (v2, v1 memory, v1 cpu), from
/// /proc/self/cgroup's lines (`0::PATH` for v2, `N:CONTROLLERS:PATH` for v1).
pub(super) fn cgroup_dirs(
    proc_cgroup: &str,
    mount: &Path,
) -> (Option<PathBuf>, Option<PathBuf>, Option<PathBuf>) {
    let under = |base: PathBuf, p: &str| base.join(p.trim_start_matches('/'));
    let mut v2 = None;
    let mut memory = None;
    let mut cpu = None;
    for line in proc_cgroup.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(_), Some(controllers), Some(path)) = (parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        if path.split('/').any(|c| c == "..") {
            continue;
        }
        if controllers.is_empty() {
            v2 = Some(under(mount.to_path_buf(), path));
        }
        for c in controllers.split(',') {
            match c {
                "memory" => memory = Some(under(mount.join("memory"), path)),
                "cpu" => cpu = Some(under(mount.join("cpu"), path)),
                _ => {}
            }
        }
    }
    (v2, memory, cpu)
}

fn read(p: &Path) -> Option<String> {
    std::fs::read_to_string(p).ok()
}

/// The process's own sample, now.
fn sample_process() -> ProcessSample {
    // SAFETY: sysconf(3) reads a constant of the system; no memory is passed.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    let ticks = if ticks > 0 { ticks as f64 } else { 100.0 };
    let stat = read(Path::new("/proc/self/stat")).and_then(|s| parse_stat(&s, ticks));
    let btime = read(Path::new("/proc/stat")).and_then(|s| parse_btime(&s));
    ProcessSample {
        cpu_seconds: stat.map(|s| s.0),
        resident_bytes: read(Path::new("/proc/self/status")).and_then(|s| parse_rss(&s)),
        start_seconds: stat.zip(btime).map(|(s, b)| b + s.1),
    }
}

/// The process's cgroup, now: v2 where /proc/self/cgroup names a v2 path with a
/// `memory.current` (a container sees its own cgroup as `/`), else v1's controllers.
fn sample_cgroup() -> CgroupSample {
    let mount = Path::new("/sys/fs/cgroup");
    let Some(own) = read(Path::new("/proc/self/cgroup")) else {
        return CgroupSample::default();
    };
    let (v2, memory, cpu) = cgroup_dirs(&own, mount);
    if let Some(dir) = v2.filter(|d| d.join("memory.current").exists()) {
        return CgroupSample {
            memory_bytes: read(&dir.join("memory.current")).and_then(|t| t.trim().parse().ok()),
            memory_limit_bytes: read(&dir.join("memory.max")).and_then(|t| parse_memory_limit(&t)),
            cpu_limit_cores: read(&dir.join("cpu.max")).and_then(|t| parse_cpu_max(&t)),
        };
    }
    CgroupSample {
        memory_bytes: memory
            .as_ref()
            .and_then(|d| read(&d.join("memory.usage_in_bytes")))
            .and_then(|t| t.trim().parse().ok()),
        memory_limit_bytes: memory
            .as_ref()
            .and_then(|d| read(&d.join("memory.limit_in_bytes")))
            .and_then(|t| parse_memory_limit(&t)),
        cpu_limit_cores: cpu.as_ref().and_then(|d| {
            parse_cfs(
                &read(&d.join("cpu.cfs_quota_us"))?,
                &read(&d.join("cpu.cfs_period_us"))?,
            )
        }),
    }
}

fn gauge<V>(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    unit: Unit,
    value: Option<V>,
) -> Result<(), std::fmt::Error>
where
    ConstGauge<V>: EncodeMetric,
{
    let Some(v) = value else { return Ok(()) };
    let g = ConstGauge::new(v);
    let m = encoder.encode_descriptor(name, help, Some(&unit), g.metric_type())?;
    g.encode(m)
}

/// `process_cpu_seconds_total`, `process_resident_memory_bytes`,
/// `process_start_time_seconds` (registered without the `dnspath_` prefix).
#[derive(Debug, Default)]
pub(super) struct ProcessCollector;

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let s = sample_process();
        if let Some(cpu) = s.cpu_seconds {
            let c = ConstCounter::new(cpu);
            let m = encoder.encode_descriptor(
                "process_cpu",
                "User and system CPU time the agent spent",
                Some(&Unit::Seconds),
                c.metric_type(),
            )?;
            c.encode(m)?;
        }
        gauge(
            &mut encoder,
            "process_resident_memory",
            "Resident memory of the agent (VmRSS)",
            Unit::Bytes,
            s.resident_bytes.map(|b| b as f64),
        )?;
        gauge(
            &mut encoder,
            "process_start_time",
            "Start time of the agent, seconds since the epoch",
            Unit::Seconds,
            s.start_seconds,
        )
    }
}

/// `dnspath_cgroup_memory_bytes`, `…_memory_limit_bytes`, `…_cpu_limit_cores` (registered
/// under the `dnspath_` prefix).
#[derive(Debug, Default)]
pub(super) struct CgroupCollector;

impl Collector for CgroupCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let s = sample_cgroup();
        gauge(
            &mut encoder,
            "cgroup_memory",
            "Memory the kernel charges the agent's cgroup (memory.current; BPF maps included)",
            Unit::Bytes,
            s.memory_bytes.map(|b| b as f64),
        )?;
        gauge(
            &mut encoder,
            "cgroup_memory_limit",
            "Memory limit of the agent's cgroup (memory.max); absent when unlimited",
            Unit::Bytes,
            s.memory_limit_bytes.map(|b| b as f64),
        )?;
        gauge(
            &mut encoder,
            "cgroup_cpu_limit",
            "CPU limit of the agent's cgroup in cores (cpu.max); absent when unlimited",
            Unit::Other("cores".into()),
            s.cpu_limit_cores,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::metrics::Metrics;

    #[test]
    fn stat_status_and_cgroup_files_parse() {
        // A command with a space and a parenthesis; utime 250, stime 50, start 1000 ticks.
        let stat = "4242 (dns (path) x) S 1 4242 4242 0 -1 4194560 900 0 0 0 250 50 0 0 20 0 9 0 1000 123 456";
        assert_eq!(parse_stat(stat, 100.0), Some((3.0, 10.0)));
        assert_eq!(parse_stat("4242 (cut) S 1", 100.0), None);
        let status = "Name:\tdnspath\nVmPeak:\t  200 kB\nVmRSS:\t   48128 kB\nThreads:\t9\n";
        assert_eq!(parse_rss(status), Some(48128 * 1024));
        assert_eq!(parse_rss("Name:\tx\n"), None);
        assert_eq!(parse_btime("cpu 1 2 3\nbtime 1700000000\n"), Some(1.7e9));
        assert_eq!(parse_memory_limit("402653184\n"), Some(402_653_184));
        assert_eq!(parse_memory_limit("max\n"), None);
        // v1's "unlimited": i64::MAX rounded down to a page.
        assert_eq!(parse_memory_limit("9223372036854771712\n"), None);
        assert_eq!(parse_cpu_max("100000 100000\n"), Some(1.0));
        assert_eq!(parse_cpu_max("50000 100000\n"), Some(0.5));
        assert_eq!(parse_cpu_max("max 100000\n"), None);
        assert_eq!(parse_cfs("-1\n", "100000\n"), None);
        assert_eq!(parse_cfs("250000\n", "100000\n"), Some(2.5));
        let mount = Path::new("/sys/fs/cgroup");
        assert_eq!(
            cgroup_dirs("0::/kubepods/pod1/abc\n", mount),
            (
                Some(PathBuf::from("/sys/fs/cgroup/kubepods/pod1/abc")),
                None,
                None
            )
        );
        assert_eq!(
            cgroup_dirs("5:cpu,cpuacct:/a\n4:memory:/b\n1:name=systemd:/c\n", mount),
            (
                None,
                Some(PathBuf::from("/sys/fs/cgroup/memory/b")),
                Some(PathBuf::from("/sys/fs/cgroup/cpu/a"))
            )
        );
        // A container's own cgroup is its root.
        assert_eq!(cgroup_dirs("0::/\n", mount).0, Some(mount.to_path_buf()));
        assert_eq!(cgroup_dirs("0::/../x\n", mount).0, None);
    }

    /// The scrape carries this process's CPU and memory under their common names, and the
    /// cgroup's charge under `dnspath_`.
    #[test]
    fn the_exposition_has_the_agents_own_cpu_and_memory() {
        let text = Metrics::new().encode();
        let value = |name: &str| -> Option<f64> {
            text.lines()
                .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        };
        assert!(
            text.contains("# TYPE process_cpu_seconds counter"),
            "{text}"
        );
        assert!(
            value("process_cpu_seconds_total").is_some_and(|v| v >= 0.0),
            "{text}"
        );
        let rss = value("process_resident_memory_bytes").unwrap_or(0.0);
        assert!(rss > 1e6, "rss {rss}: {text}");
        let start = value("process_start_time_seconds").unwrap_or(0.0);
        assert!(start > 1.6e9, "start {start}: {text}");
        // The dnspath_ metrics keep their prefix beside the root's.
        assert!(text.contains("dnspath_build_info{"), "{text}");
        assert!(!text.contains("dnspath_process_"), "{text}");
        if sample_cgroup().memory_bytes.is_some() {
            assert!(
                value("dnspath_cgroup_memory_bytes").is_some_and(|v| v > 0.0),
                "{text}"
            );
        }
        assert!(text.ends_with("# EOF\n"), "{text}");
    }
}
