//! What the soak prints: the agent's samples over time, the faults, the loops and races the
//! event stream reported, the load through the faults, what the stop left behind.
use std::{fs, path::Path};

use serde_json::Value;

use super::{
    cgroup::Cgroup,
    load::{rate_at, CHUNK_S},
    SoakOptions,
};
use crate::live::thousands;

/// One sample of the agent.
pub(super) struct Sample {
    pub(super) t_s: u64,
    pub(super) rss_kib: Option<u64>,
    pub(super) cpu_s: f64,
    pub(super) healthz: bool,
    pub(super) readyz: bool,
    /// The agent's counters; `None`: the scrape failed.
    pub(super) packets: Option<u64>,
    pub(super) lost: Option<u64>,
    pub(super) oom_kills: u64,
    /// The cgroup's charge: the most seen since the last sample (read every loop turn),
    /// and its anonymous and kernel parts now.
    pub(super) cg_max: Option<u64>,
    pub(super) anon: Option<u64>,
    pub(super) kernel: Option<u64>,
}

pub(super) struct Report<'a> {
    pub(super) o: &'a SoakOptions,
    pub(super) samples: &'a [Sample],
    pub(super) faults: &'a [(u64, String)],
    pub(super) lines: &'a [String],
    pub(super) cg: &'a Cgroup,
    pub(super) restarts: u32,
    pub(super) crashes: u32,
    pub(super) races_forced: u32,
    pub(super) pods_made: u64,
    /// dnsperf UDP's answers per second, every 10 s: (seconds into the soak, rate).
    pub(super) udp_rate: Vec<(f64, f64)>,
    /// dnsperf runs killed for not ending.
    pub(super) stuck: u64,
    pub(super) udp: &'a str,
    pub(super) tcp: &'a str,
    pub(super) end: (u64, u64),
    pub(super) record: &'a Path,
    pub(super) leftovers: Vec<String>,
    pub(super) stopped: Option<Stopped>,
}

/// The agent's SIGTERM stop at the end.
pub(super) struct Stopped {
    /// Its exit status; `None` if waiting for it failed.
    pub(super) status: Option<String>,
    pub(super) secs: f64,
    /// OOM kills in the cgroup during the stop.
    pub(super) oom_kills: u64,
    /// The cgroup's most charged memory seen during the stop.
    pub(super) cg_max: Option<u64>,
}

/// The sum of a statistic over every dnsperf run in `out`.
fn field(out: &str, label: &str) -> Option<f64> {
    out.lines()
        .filter_map(|l| l.trim_start().strip_prefix(label))
        .filter_map(|r| r.split_whitespace().next())
        .filter_map(|v| v.parse::<f64>().ok())
        .reduce(|a, b| a + b)
}

pub(super) fn report(r: &Report) {
    let mib = |k: Option<u64>| k.map_or("-".into(), |k| format!("{:.0}", k as f64 / 1024.0));
    println!(
        "\nsoak: {} min, dnsperf {} qps UDP (cached, new, NXDOMAIN, large TXT) + {} qps TCP + 1 qps unanswered, \
         `dnspath agent --record` (4 MiB tmpfs) under a {} MiB memory cgroup",
        r.o.minutes,
        r.o.qps,
        (r.o.qps / 50).max(1),
        r.o.memory_mib
    );
    println!(
        "  {:>6} {:>8} {:>8} {:>8} {:>8} {:>8} {:>7} {:>12} {:>10} {:>4} {:>8} {:>6}",
        "t s",
        "VmRSS",
        "cg max",
        "anon",
        "kernel",
        "CPU %",
        "ready",
        "packets",
        "lost",
        "OOM",
        "qps",
        "pkt/q"
    );
    let mut per_query: Vec<(u64, f64)> = Vec::new();
    let mib_b = |b: Option<u64>| b.map_or("-".into(), |b| (b >> 20).to_string());
    let mut prev: Option<&Sample> = None;
    for s in r.samples {
        // CPU per query is the run's (below): dnsperf's own rate varies with the faults.
        let cpu_pct = match prev {
            Some(p) if s.t_s > p.t_s && s.cpu_s >= p.cpu_s => {
                format!(
                    "{:.0}",
                    100.0 * (s.cpu_s - p.cpu_s) / (s.t_s - p.t_s) as f64
                )
            }
            _ => "-".into(),
        };
        // Packets the agent counted per query answered to dnsperf, over the interval
        // (not across a restart: its counter starts again).
        let qps = rate_at(&r.udp_rate, s.t_s);
        let pkt_q = match (prev.and_then(|p| Some((p.t_s, p.packets?))), s.packets, qps) {
            (Some((t0, before)), Some(now), Some(q)) if s.t_s > t0 && now >= before && q >= 1.0 => {
                let v = (now - before) as f64 / (s.t_s - t0) as f64 / q;
                per_query.push((s.t_s, v));
                format!("{v:.1}")
            }
            _ => "-".into(),
        };
        println!(
            "  {:>6} {:>8} {:>8} {:>8} {:>8} {:>8} {:>7} {:>12} {:>10} {:>4} {:>8} {:>6}",
            s.t_s,
            mib(s.rss_kib),
            mib_b(s.cg_max),
            mib_b(s.anon),
            mib_b(s.kernel),
            cpu_pct,
            format!(
                "{}/{}",
                if s.healthz { "h" } else { "-" },
                if s.readyz { "r" } else { "-" }
            ),
            s.packets.map_or("-".into(), thousands),
            s.lost.map_or("-".into(), thousands),
            s.oom_kills,
            qps.map_or("-".into(), |q| format!("{q:.0}")),
            pkt_q
        );
        prev = Some(s);
    }
    let warm = r
        .samples
        .iter()
        .filter(|s| s.t_s >= 120)
        .filter_map(|s| s.rss_kib);
    let (lo, hi) = warm.fold((u64::MAX, 0), |(lo, hi), v| (lo.min(v), hi.max(v)));
    if hi > 0 {
        println!(
            "  VmRSS after 2 min of warm-up: {:.0}–{:.0} MiB; cgroup peak {} MiB of {}; OOM kills {}",
            lo as f64 / 1024.0,
            hi as f64 / 1024.0,
            r.cg.peak().map_or("-".into(), |p| (p >> 20).to_string()),
            r.o.memory_mib,
            r.cg.oom_kills().map_or("-".into(), |k| k.to_string())
        );
    }
    load_checks(r, &per_query);
    println!("  faults:");
    for (t, what) in r.faults {
        println!("    +{t:>4} s  {what}");
    }
    let recs: Vec<Value> = r
        .lines
        .iter()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    let count =
        |ty: &str, k: &str, v: &str| recs.iter().filter(|x| x["type"] == ty && x[k] == v).count();
    let loops_started = r
        .faults
        .iter()
        .filter(|(_, w)| w.starts_with("forwarding loop started"))
        .count();
    let loops = loop_reports(&recs);
    println!(
        "  loops: {loops_started} started; detected {} (questions {}, detected again after an end {} \
         — the query file asks each name again every few seconds —, detected again while still \
         active {}: a fault if not 0), ended {} (event stream, across {} SIGKILL restart(s) and \
         {} crash(es))",
        loops.detected,
        loops.questions,
        loops.again_after_end,
        loops.again_while_active,
        count("loop", "state", "ended"),
        r.restarts,
        r.crashes
    );
    println!(
        "  races: {} forced with the A lost; race-drop events {}",
        r.races_forced,
        count("race", "verdict", "race-drop")
    );
    println!(
        "  ring-buffer loss: agent's last counter {} (since its last start); warnings in the stream {}",
        thousands(r.end.1),
        recs.iter().filter(|x| x["type"] == "warning").count()
    );
    println!(
        "  pod namespaces created and deleted meanwhile: {}",
        r.pods_made
    );
    let files = fs::read_dir(r.record).map(|d| d.count()).unwrap_or(0);
    println!("  recorder files on the 4 MiB tmpfs at the end: {files}");
    let queries = field(r.udp, "Queries completed:").unwrap_or(0.0)
        + field(r.udp, "Queries lost:").unwrap_or(0.0)
        + field(r.tcp, "Queries completed:").unwrap_or(0.0)
        + field(r.tcp, "Queries lost:").unwrap_or(0.0);
    let cpu: f64 = r
        .samples
        .windows(2)
        .map(|w| (w[1].cpu_s - w[0].cpu_s).max(0.0))
        .sum();
    println!(
        "  agent CPU: {cpu:.1} s between samples (restarts excluded) for {queries:.0} queries sent = {:.0} µs/query",
        cpu * 1e6 / queries.max(1.0)
    );
    println!(
        "  dnsperf ({CHUNK_S}-s runs; {} killed for not ending): UDP completed {}, lost {}; TCP completed {}, lost {}",
        r.stuck,
        field(r.udp, "Queries completed:").unwrap_or(0.0),
        field(r.udp, "Queries lost:").unwrap_or(0.0),
        field(r.tcp, "Queries completed:").unwrap_or(0.0),
        field(r.tcp, "Queries lost:").unwrap_or(0.0),
    );
    if let Some(st) = &r.stopped {
        println!(
            "  SIGTERM stop: {} in {:.1} s; cgroup charge up to {} MiB of {} meanwhile; OOM kills meanwhile {}",
            st.status.as_deref().unwrap_or("exit status unknown"),
            st.secs,
            mib_b(st.cg_max),
            r.o.memory_mib,
            st.oom_kills
        );
    }
    if r.leftovers.is_empty() {
        println!(
            "  left behind after SIGTERM: nothing (TC filters on the lab's veths, bpffs pins)"
        );
    } else {
        println!("  LEFT BEHIND: {}", r.leftovers.join(", "));
    }
}

/// dnsperf's rate through the faults, and the agent's packets per answered query: an
/// interval with under half the run's median (the ring buffer overflowing, the agent stopped)
/// is named with the faults around it.
fn load_checks(r: &Report, per_query: &[(u64, f64)]) {
    let median = |v: &mut Vec<f64>| -> f64 {
        v.sort_by(f64::total_cmp);
        v.get(v.len() / 2).copied().unwrap_or(0.0)
    };
    let mut q: Vec<f64> = r.udp_rate.iter().map(|(_, q)| *q).collect();
    let n = q.len();
    let low: Vec<String> = r
        .udp_rate
        .iter()
        .filter(|(_, q)| *q < f64::from(r.o.qps) / 2.0)
        .map(|(t, _)| format!("+{t:.0}"))
        .collect();
    let med = median(&mut q);
    println!(
        "  dnsperf UDP answers/s every 10 s: min {:.0}, median {med:.0}, max {:.0} of {} asked; \
         under half the rate in {} of {n} intervals{}",
        q.first().copied().unwrap_or(0.0),
        q.last().copied().unwrap_or(0.0),
        r.o.qps,
        low.len(),
        if low.is_empty() {
            String::new()
        } else {
            format!(" (ending at {} s)", low.join(", "))
        }
    );
    let mut v: Vec<f64> = per_query.iter().map(|(_, v)| *v).collect();
    let med = median(&mut v);
    let blind: Vec<String> = per_query
        .iter()
        .filter(|(_, v)| *v < med / 2.0)
        .map(|(t, v)| format!("+{t} s ({v:.1})"))
        .collect();
    println!(
        "  agent packets per answered query: median {med:.1} over {} intervals; under half of it in {}: {}",
        per_query.len(),
        blind.len(),
        if blind.is_empty() {
            "none".to_string()
        } else {
            blind.join(", ")
        }
    );
}

/// The event stream's loop reports, per question.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct LoopReports {
    pub detected: usize,
    pub questions: usize,
    /// A question detected again after its loop ended: asked again (dnsperf replays its
    /// names), a new loop — or an end reported too early.
    pub again_after_end: usize,
    /// A question detected again on the same cycle while its loop was still going on (not
    /// ended): one loop reported twice. Each agent start begins afresh (a SIGKILLed agent ends none).
    pub again_while_active: usize,
}

pub(super) fn loop_reports(recs: &[Value]) -> LoopReports {
    let mut out = LoopReports::default();
    let mut active: std::collections::BTreeMap<(String, String), usize> = Default::default();
    let mut seen: std::collections::BTreeSet<(String, String)> = Default::default();
    let mut questions: std::collections::BTreeSet<String> = Default::default();
    for x in recs {
        if x["type"] == "agent" && x["state"] == "start" {
            active.clear();
            continue;
        }
        if x["type"] != "loop" {
            continue;
        }
        let q = x["question"]["name"].as_str().unwrap_or("?").to_owned();
        // Reports are keyed by question (name, type, class: the soak asks www.lab.test. for
        // A and AAAA, two loops) and cycle: a second cycle is another loop.
        let key = (
            format!("{q} {} {}", x["question"]["type"], x["question"]["class"]),
            x["cycle"].to_string(),
        );
        match x["state"].as_str() {
            Some("detected") => {
                out.detected += 1;
                let n = active.entry(key.clone()).or_default();
                if *n > 0 {
                    out.again_while_active += 1;
                } else if seen.contains(&key) {
                    out.again_after_end += 1;
                }
                *n += 1;
                seen.insert(key);
                questions.insert(q);
            }
            Some("ended") => {
                if let Some(n) = active.get_mut(&key) {
                    *n = n.saturating_sub(1);
                }
            }
            _ => {}
        }
    }
    out.questions = questions.len();
    out
}
