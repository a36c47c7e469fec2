//! `cargo xtask bench`, live and storm sections, in a lab of our own (network namespaces,
//! real servers; traffic only to addresses inside them).
//!
//! Live: dnsperf in the client pod sends to the ClusterIP at fixed rates, two dnsmasq pods
//! behind it answer (from their cache after a warm-up), under nothing, `dnspath trace
//! --all-netns -o json`, `dnspath agent`, and `tcpdump -w` on the node's hops followed by
//! `tshark -r` of the file. For each: CPU per query of the tool and of the dnsmasq pods in
//! the same window (utime+stime from /proc/PID/stat), dnsperf's figures, packets captured
//! and lost, peak RSS (VmHWM) and bpf_stats ns/run of each program of the tool.
//!
//! Scale: the agent idle on a node of 110 pod namespaces, then 20 pods replaced (scale.rs).
//!
//! Storm: the ping-pong forwarding loop of tests/tests/lab/loops.rs (both dnsdist pods forward
//! to their own Service) with `dnspath trace` running, and healthy queries meanwhile.
//!
//! Figures only: nothing is asserted on timing.
use std::path::Path;

mod bpf;
mod dnsperf;
mod phoenix;
mod proc;
mod rates;
pub mod scale;
pub mod soak;
mod storm;
mod tool;
mod truth;

use bpf::BpfStats;

/// What the live and storm sections run.
#[derive(Debug, Clone)]
pub struct LiveOptions {
    /// dnsperf's rates (`-Q`), queries/s.
    pub rates: Vec<u32>,
    /// Seconds of dnsperf per rate and tool.
    pub seconds: u64,
    /// Seconds of forwarding loop.
    pub storm_seconds: u64,
}

impl Default for LiveOptions {
    fn default() -> Self {
        Self {
            rates: vec![2_000, 10_000, 20_000],
            seconds: 10,
            storm_seconds: 10,
        }
    }
}

/// One of the project's performance goals (docs/performance.md, "Targets") next to the figure
/// measured: `value` against `target` (`at_most`: lower is better), with how far it is missed.
pub(crate) fn goal(what: &str, shown: &str, value: f64, target: f64, at_most: bool) -> String {
    let met = if at_most {
        value <= target
    } else {
        value >= target
    };
    let verdict = if met {
        "met".to_string()
    } else if at_most {
        format!("missed by {:.2}×", value / target.max(1e-9))
    } else {
        format!("missed by {:.2}×", target / value.max(1e-9))
    };
    format!("  goal: {what:<52} {shown:>18}  {verdict}")
}

/// A goal of nothing lost: `lost` of `of`.
pub(crate) fn goal_no_loss(what: &str, lost: u64, of: u64) -> String {
    let verdict = if lost == 0 { "met" } else { "missed" };
    let shown = format!("{} of {} lost", thousands(lost), thousands(of));
    format!("  goal: {what:<52} {shown:>18}  {verdict}")
}

fn thousands(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

fn opt_u64(v: Option<u64>) -> String {
    v.map(thousands).unwrap_or_else(|| "-".into())
}

/// Live and storm sections, with bpf_stats on for their duration.
pub fn run(dnspath: &Path, o: &LiveOptions, live: bool, storm: bool) -> crate::Result<()> {
    let _stats = BpfStats::enable();
    if live {
        rates::run_live(dnspath, o)?;
    }
    if storm {
        storm::run_storm(dnspath, o)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests;
