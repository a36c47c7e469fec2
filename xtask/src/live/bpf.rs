//! bpf_stats: the run time and count of each eBPF program a process holds.
use std::{
    collections::{BTreeMap, BTreeSet},
    fs,
};

use super::thousands;

/// Turns `kernel.bpf_stats_enabled` on while it lives, and back to what it was on drop.
pub(super) struct BpfStats {
    old: Option<String>,
}

const BPF_STATS_SYSCTL: &str = "/proc/sys/kernel/bpf_stats_enabled";

impl BpfStats {
    pub(super) fn enable() -> Self {
        let old = fs::read_to_string(BPF_STATS_SYSCTL).ok();
        if let Err(e) = fs::write(BPF_STATS_SYSCTL, "1") {
            eprintln!("bench: cannot enable {BPF_STATS_SYSCTL}: {e}; no ns/run figures");
        }
        Self { old }
    }
}

impl Drop for BpfStats {
    fn drop(&mut self) {
        if let Some(old) = &self.old {
            if let Err(e) = fs::write(BPF_STATS_SYSCTL, old.trim()) {
                eprintln!("bench: could not restore {BPF_STATS_SYSCTL} to {old}: {e}");
            }
        }
    }
}

/// One eBPF program a process holds: run time and count so far.
#[derive(Debug, Clone, Default)]
pub(super) struct Prog {
    label: String,
    run_time_ns: u64,
    run_cnt: u64,
}

fn prog_type_name(t: &str) -> String {
    // enum bpf_prog_type (include/uapi/linux/bpf.h)
    match t {
        "2" => "kprobe".into(),
        "3" => "sched_cls".into(),
        "5" => "tracepoint".into(),
        // the only tracing programs dnspath has
        "26" => "tracing (kfree_skb)".into(),
        other => format!("prog_type {other}"),
    }
}

fn attach_type_name(t: &str) -> String {
    // enum bpf_attach_type
    match t {
        "23" => "raw_tp".into(),
        "24" => "fentry".into(),
        "26" => "tp_btf".into(),
        "46" => "tcx_ingress".into(),
        "47" => "tcx_egress".into(),
        other => format!("attach_type {other}"),
    }
}

/// The eBPF programs `pid` holds open, by id, labelled by type and by how their links
/// attach them (from the links' fdinfo: TCX ingress/egress, tracing...).
pub(super) fn progs(pid: u32) -> BTreeMap<u32, Prog> {
    let mut progs: BTreeMap<u32, Prog> = BTreeMap::new();
    let mut attach: BTreeMap<u32, BTreeSet<String>> = BTreeMap::new();
    let Ok(dir) = fs::read_dir(format!("/proc/{pid}/fdinfo")) else {
        return progs;
    };
    for e in dir.flatten() {
        let Ok(text) = fs::read_to_string(e.path()) else {
            continue;
        };
        let kv: BTreeMap<&str, &str> = text
            .lines()
            .filter_map(|l| l.split_once(':'))
            .map(|(k, v)| (k.trim(), v.trim()))
            .collect();
        let Some(id) = kv.get("prog_id").and_then(|v| v.parse::<u32>().ok()) else {
            continue;
        };
        if let Some(link) = kv.get("link_type") {
            let how = kv
                .get("attach_type")
                .map(|a| attach_type_name(a.split_whitespace().next().unwrap_or(a)))
                .unwrap_or_else(|| (*link).to_string());
            attach.entry(id).or_default().insert(how);
        } else if let (Some(t), Some(ns), Some(n)) = (
            kv.get("prog_type"),
            kv.get("run_time_ns"),
            kv.get("run_cnt"),
        ) {
            progs.insert(
                id,
                Prog {
                    label: prog_type_name(t),
                    run_time_ns: ns.parse().unwrap_or(0),
                    run_cnt: n.parse().unwrap_or(0),
                },
            );
        }
    }
    for (id, p) in progs.iter_mut() {
        if let Some(a) = attach.get(id) {
            let a: Vec<&str> = a.iter().map(String::as_str).collect();
            p.label = format!("{} {}", p.label, a.join("+"));
        }
    }
    progs
}

/// (label, ns/run, runs, programs) per kind of eBPF program.
pub(super) type ProgCosts = Vec<(String, f64, u64, usize)>;

/// ns/run of the programs that ran between the two readings, summed over programs of the
/// same label (the tracer loads its programs once per network namespace): (label, ns/run,
/// runs, programs).
pub(super) fn prog_delta(before: &BTreeMap<u32, Prog>, after: &BTreeMap<u32, Prog>) -> ProgCosts {
    let mut by_label: BTreeMap<&str, (u64, u64, usize)> = BTreeMap::new();
    for (id, a) in after {
        let b = before.get(id).cloned().unwrap_or_default();
        let runs = a.run_cnt.saturating_sub(b.run_cnt);
        if runs == 0 {
            continue;
        }
        let e = by_label.entry(&a.label).or_default();
        e.0 += a.run_time_ns.saturating_sub(b.run_time_ns);
        e.1 += runs;
        e.2 += 1;
    }
    by_label
        .into_iter()
        .map(|(label, (ns, runs, n))| (label.to_owned(), ns as f64 / runs as f64, runs, n))
        .collect()
}

pub(super) fn print_progs(progs: &ProgCosts) {
    for (label, ns, runs, n) in progs {
        println!(
            "      bpf {label}: {ns:.0} ns/run over {} runs ({n} program(s))",
            thousands(*runs)
        );
    }
}
