//! dnsperf: the load, and its figures.
use anyhow::anyhow;
use std::path::Path;

use lab::Lab;

#[derive(Debug, Default, Clone)]
pub(super) struct Dnsperf {
    pub(super) completed: u64,
    pub(super) lost: u64,
    pub(super) qps: f64,
    pub(super) avg_ms: f64,
    pub(super) max_ms: f64,
    pub(super) stddev_ms: f64,
    /// Median and 99th percentile of the answered queries' latencies (from `-v`'s line per
    /// query; dnsperf 2.10 prints no percentiles of its own); 0 when none was answered.
    pub(super) p50_ms: f64,
    pub(super) p99_ms: f64,
}

/// The latencies, in seconds, of the answered queries of `dnsperf -v`'s per-query lines
/// (`> NOERROR www.example.com A 0.000164`; a timed-out query's line is `> T name type`).
fn latencies(out: &str) -> Vec<f64> {
    out.lines()
        .filter_map(|l| l.strip_prefix("> "))
        .filter(|l| !l.starts_with("T "))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .collect()
}

/// The `q`-quantile (0..=1) of `v` by nearest rank; 0 for none.
fn quantile(v: &[f64], q: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    let rank = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len());
    v[rank - 1]
}

/// The number after `label` on the line that starts with it (after leading spaces).
fn field(out: &str, label: &str) -> Option<f64> {
    out.lines()
        .find_map(|l| l.trim_start().strip_prefix(label))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|v| v.parse().ok())
}

pub(super) fn parse_dnsperf(out: &str) -> Option<Dnsperf> {
    let max_s = out
        .lines()
        .find_map(|l| l.trim_start().strip_prefix("Average Latency (s):"))
        .and_then(|r| r.split("max ").nth(1))
        .and_then(|r| r.trim_end_matches(')').trim().parse::<f64>().ok())
        .unwrap_or(0.0);
    let mut lat = latencies(out);
    lat.sort_by(f64::total_cmp);
    Some(Dnsperf {
        p50_ms: quantile(&lat, 0.50) * 1e3,
        p99_ms: quantile(&lat, 0.99) * 1e3,
        completed: field(out, "Queries completed:")? as u64,
        lost: field(out, "Queries lost:")? as u64,
        qps: field(out, "Queries per second:")?,
        avg_ms: field(out, "Average Latency (s):")? * 1e3,
        max_ms: max_s * 1e3,
        stddev_ms: field(out, "Latency StdDev (s):").unwrap_or(0.0) * 1e3,
    })
}

pub(super) fn dnsperf(
    lab: &Lab,
    queries: &Path,
    rate: u32,
    seconds: u64,
) -> crate::Result<Dnsperf> {
    let server = lab.cluster_ip().to_string();
    let file = queries.to_string_lossy().into_owned();
    let (rate, seconds) = (rate.to_string(), seconds.to_string());
    let o = lab.exec(
        lab.client_ns(),
        &[
            "dnsperf", "-s", &server, "-d", &file, "-Q", &rate, "-l", &seconds, "-c", "8", "-q",
            "1000", "-t", "2", "-v",
        ],
    );
    let out = String::from_utf8_lossy(&o.stdout);
    match parse_dnsperf(&out) {
        Some(d) if o.status.success() => Ok(d),
        _ => Err(anyhow!(
            "dnsperf failed ({}): {out}{}",
            o.status,
            String::from_utf8_lossy(&o.stderr)
        )),
    }
}
