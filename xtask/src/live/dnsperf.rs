//! dnsperf: the load, and its figures.
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
    Some(Dnsperf {
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
            "1000", "-t", "2",
        ],
    );
    let out = String::from_utf8_lossy(&o.stdout);
    match parse_dnsperf(&out) {
        Some(d) if o.status.success() => Ok(d),
        _ => Err(format!(
            "dnsperf failed ({}): {out}{}",
            o.status,
            String::from_utf8_lossy(&o.stderr)
        )),
    }
}
