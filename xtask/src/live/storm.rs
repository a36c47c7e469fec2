//! The storm section: a forwarding loop under `dnspath trace`, with healthy queries
//! meanwhile.
use anyhow::anyhow;
use std::{
    collections::BTreeSet,
    path::Path,
    thread,
    time::{Duration, Instant},
};

use lab::{DnsPodConfig, DnsServerKind, Lab, LabConfig, Pod};
use serde_json::Value;

use super::{
    bpf::{print_progs, prog_delta, progs, ProgCosts},
    proc::{cpu_s, vm_hwm_kib},
    thousands,
    tool::{is_stats, Tool},
    LiveOptions,
};

fn keep_storm(line: &str) -> bool {
    is_stats(line)
        || line.contains("\"type\":\"loop\"")
        || (line.contains("\"type\":\"transaction\"") && line.contains(".bench.lab.test."))
}

pub(super) fn run_storm(dnspath: &Path, o: &LiveOptions) -> crate::Result<()> {
    let mut lab = Lab::start(LabConfig::default()).map_err(|e| anyhow!("lab: {e}"))?;
    let dnspath = dnspath.to_string_lossy().into_owned();
    let node = lab.node_ns().to_owned();
    let t = Tool::start(
        &lab,
        &node,
        &[&dnspath, "trace", "-o", "json", "--view", "transactions"],
        keep_storm,
        "dnspath: tracing",
    )?;
    let pid = t.pid().to_string();
    let looping = DnsPodConfig::new(DnsServerKind::Dnsdist).forwarding_to_cluster_ip();
    let healthy = DnsPodConfig::new(DnsServerKind::Dnsdist);
    let result = (|| -> crate::Result<(f64, f64, ProgCosts, u64, u64)> {
        for i in 0..2 {
            lab.reconfigure_dns_pod(i, looping.clone())
                .map_err(|e| anyhow!("lab: {e}"))?;
        }
        let cpu0 = cpu_s(&pid, false).unwrap_or(0.0);
        let progs0 = progs(t.pid());
        let start = Instant::now();
        let _ = lab.dig(&["+time=1", "+tries=1", "storm.lab.test.", "A"]);
        // Healthy queries straight to the upstream meanwhile, one a second.
        let up = format!("@{}", lab.ip_of(Pod::Upstream));
        let (mut sent, mut answered) = (0u64, 0u64);
        while start.elapsed() < Duration::from_secs(o.storm_seconds) {
            thread::sleep(Duration::from_millis(500));
            let name = format!("h{sent}.bench.lab.test.");
            sent += 1;
            let r = lab.dig(&["+time=2", "+tries=1", &up, &name, "A"]);
            if r.status.success() {
                answered += 1;
            }
        }
        let wall = start.elapsed().as_secs_f64();
        let cpu = cpu_s(&pid, false).unwrap_or(0.0) - cpu0;
        let progs1 = progs(t.pid());
        for i in 0..2 {
            lab.reconfigure_dns_pod(i, healthy.clone())
                .map_err(|e| anyhow!("lab: {e}"))?;
        }
        // The loop ends 2 s after its last packet.
        thread::sleep(Duration::from_secs(3));
        Ok((wall, cpu, prog_delta(&progs0, &progs1), sent, answered))
    })();
    let hwm = vm_hwm_kib(t.pid());
    let stopped = t.stop(libc::SIGINT);
    let (wall, cpu, progs, sent, answered) = result?;
    let recs: Vec<Value> = stopped
        .stdout
        .iter()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    let stats = recs
        .iter()
        .rev()
        .find(|r| r["type"] == "stats")
        .ok_or_else(|| anyhow!("storm: no stats record; stderr: {}", stopped.stderr))?;
    let loops = |state: &str| -> Vec<&Value> {
        recs.iter()
            .filter(|r| r["type"] == "loop" && r["state"] == state)
            .collect()
    };
    let n = |v: &Value, k: &str| v[k].as_u64().unwrap_or(0);
    let peak = recs
        .iter()
        .filter(|r| r["type"] == "loop")
        .map(|r| n(r, "rate_pps"))
        .max()
        .unwrap_or(0);
    let traced: BTreeSet<&str> = recs
        .iter()
        .filter(|r| r["type"] == "transaction" && r["outcome"] == "answered")
        .filter_map(|r| r["question"]["name"].as_str())
        .filter(|n| n.ends_with(".bench.lab.test."))
        .collect();
    println!(
        "\nstorm: ping-pong forwarding loop through the Service (2 dnsdist pods forwarding to it), {:.0} s, \
         `dnspath trace -o json --view transactions` in the node namespace",
        wall
    );
    println!(
        "  loops detected: {}, ended: {}",
        loops("detected").len(),
        loops("ended").len()
    );
    for l in loops("ended") {
        let span_s = n(l, "last_seen_ns").saturating_sub(n(l, "detected_ns")) as f64 / 1e9;
        println!(
            "  loop {}: {} packets since detection in {span_s:.1} s = {:.0} packets/s (peak rate_pps {}); summarised {} ({:.1}%)",
            l["question"]["name"].as_str().unwrap_or("?"),
            thousands(n(l, "packets")),
            n(l, "packets") as f64 / span_s.max(1e-9),
            thousands(peak),
            thousands(n(l, "summarised")),
            100.0 * n(l, "summarised") as f64 / n(l, "packets").max(1) as f64
        );
    }
    let k = &stats["kernel"];
    println!(
        "  stats: packets {} (summarised {}), shed in the kernel {}, lost {} (ring buffer {}), kernel matched {}",
        thousands(n(stats, "packets")),
        thousands(n(stats, "summarised")),
        thousands(n(stats, "shed")),
        thousands(n(stats, "lost")),
        thousands(n(k, "packets_lost_ringbuf")),
        thousands(n(k, "packets_matched")),
    );
    println!(
        "  healthy queries meanwhile: {sent} sent, {answered} answered, {} traced as answered transactions{}",
        traced.len(),
        if traced.len() as u64 >= answered { " (all)" } else { " (NOT all)" }
    );
    println!(
        "  dnspath trace: {:.2} CPU-seconds per second of storm, VmHWM {}",
        cpu / wall.max(1e-9),
        hwm.map(|k| format!("{:.0} MiB", k as f64 / 1024.0))
            .unwrap_or_else(|| "-".into())
    );
    print_progs(&progs);
    Ok(())
}
