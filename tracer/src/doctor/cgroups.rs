//! OOM kills and CPU throttling of DNS server processes, from their cgroups: the cgroup of
//! each server is found from its `/proc/PID/cgroup`, then read under the host's
//! `/sys/fs/cgroup` — cgroup v2 (`memory.events` `oom_kill`, `cpu.stat` `nr_periods`,
//! `nr_throttled`, `throttled_usec`) or v1 (`memory/…/memory.oom_control` `oom_kill`,
//! `cpu/…/cpu.stat` `throttled_time` in ns). A kubelet pod's OOM history lives in its pod
//! cgroup (the container's is made anew at each restart), so the ancestors up to the pod's
//! (the path component naming its UID) are read too, never beyond: a healthy server must not
//! be blamed for its node's or its session's OOMs.
//!
//! OOM kills are counted since the cgroup was made; throttling is what grew during the watch
//! (a server under a CPU limit that it never reaches is fine).
use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
};

use super::{
    finding::{Finding, FindingKind},
    node::DnsServer,
};
use crate::{host, kube::cgroup::parse_cgroup_path};

/// Throttled periods during the watch below this are no finding…
pub const MIN_THROTTLED: u64 = 3;
/// … nor this share (percent) of the watch's CFS periods.
pub const MIN_THROTTLED_PCT: u64 = 5;
/// Ancestors read above a process's cgroup, at most.
const MAX_UP: usize = 8;

/// Counters of one cgroup directory, as far as the files exist.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CgroupCounters {
    pub oom_kill: Option<u64>,
    pub nr_periods: Option<u64>,
    pub nr_throttled: Option<u64>,
    pub throttled_us: Option<u64>,
}

/// `key value` lines (`memory.events`, `memory.oom_control`, `cpu.stat`): the value of `key`.
pub fn kv(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let mut w = l.split_whitespace();
        (w.next()? == key).then_some(())?;
        w.next()?.parse().ok()
    })
}

/// The cgroup v2 path (`0::PATH`) and the v1 paths of `memory` and `cpu` in a
/// `/proc/PID/cgroup` file.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProcCgroups {
    pub v2: Option<String>,
    pub memory: Option<String>,
    pub cpu: Option<String>,
}

pub fn parse_proc_cgroups(text: &str) -> ProcCgroups {
    let mut out = ProcCgroups::default();
    for line in text.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(id), Some(ctrls), Some(path)) = (parts.next(), parts.next(), parts.next()) else {
            continue;
        };
        if id == "0" && ctrls.is_empty() {
            out.v2 = Some(path.to_owned());
        }
        for c in ctrls.split(',') {
            match c {
                "memory" => out.memory = Some(path.to_owned()),
                "cpu" => out.cpu = Some(path.to_owned()),
                _ => {}
            }
        }
    }
    out
}

/// `path` and its ancestors up to the pod's cgroup (where the path names a kubelet pod), or
/// `path` alone.
pub fn levels(path: &str) -> Vec<String> {
    let comps: Vec<&str> = path.split('/').filter(|c| !c.is_empty()).collect();
    if comps.is_empty() || comps.iter().any(|c| *c == ".." || *c == ".") {
        return Vec::new();
    }
    let own = format!("/{}", comps.join("/"));
    let Some(pod) = parse_cgroup_path(path) else {
        return vec![own];
    };
    let mut out = Vec::new();
    for n in (1..=comps.len()).rev().take(MAX_UP) {
        let p = format!("/{}", comps[..n].join("/"));
        // Stop above the pod's own directory: the first one whose path no longer names it.
        if parse_cgroup_path(&p).is_none_or(|q| q.uid != pod.uid) {
            break;
        }
        out.push(p);
    }
    if out.is_empty() {
        out.push(own);
    }
    out
}

/// The host's cgroup mount.
fn cgroup_root() -> PathBuf {
    host::path("/sys/fs/cgroup")
}

fn read(p: &Path) -> Option<String> {
    let mut buf = Vec::new();
    use std::io::Read;
    std::fs::File::open(p)
        .ok()?
        .take(64 * 1024)
        .read_to_end(&mut buf)
        .ok()?;
    Some(String::from_utf8_lossy(&buf).into_owned())
}

/// The counters of one server's cgroups under `root`, per cgroup path read (v2 as `PATH`,
/// v1 as `memory:PATH`/`cpu:PATH`).
pub fn read_counters(root: &Path, pc: &ProcCgroups) -> BTreeMap<String, CgroupCounters> {
    let mut out: BTreeMap<String, CgroupCounters> = BTreeMap::new();
    let v2_root = [root.to_path_buf(), root.join("unified")]
        .into_iter()
        .find(|r| r.join("cgroup.controllers").exists());
    if let (Some(v2), Some(r)) = (&pc.v2, &v2_root) {
        for l in levels(v2) {
            let dir = host::under(r, &l);
            let mem = read(&dir.join("memory.events"));
            let cpu = read(&dir.join("cpu.stat"));
            if mem.is_none() && cpu.is_none() {
                continue;
            }
            let c = out.entry(l).or_default();
            c.oom_kill = mem.as_deref().and_then(|t| kv(t, "oom_kill"));
            if let Some(t) = cpu.as_deref() {
                c.nr_periods = kv(t, "nr_periods");
                c.nr_throttled = kv(t, "nr_throttled");
                c.throttled_us = kv(t, "throttled_usec");
            }
        }
    }
    if let Some(m) = &pc.memory {
        for l in levels(m) {
            let dir = host::under(&root.join("memory"), &l);
            if let Some(t) = read(&dir.join("memory.oom_control")) {
                out.entry(format!("memory:{l}")).or_default().oom_kill = kv(&t, "oom_kill");
            }
        }
    }
    if let Some(cp) = &pc.cpu {
        for l in levels(cp) {
            // v1 mounts `cpu` alone or as `cpu,cpuacct`.
            let Some(t) = ["cpu", "cpu,cpuacct", "cpuacct,cpu"]
                .iter()
                .find_map(|m| read(&host::under(&root.join(m), &l).join("cpu.stat")))
            else {
                continue;
            };
            let c = out.entry(format!("cpu:{l}")).or_default();
            c.nr_periods = kv(&t, "nr_periods");
            c.nr_throttled = kv(&t, "nr_throttled");
            c.throttled_us = kv(&t, "throttled_time").map(|ns| ns / 1000);
        }
    }
    out
}

/// One server's cgroups, read at the start of the watch and again at its end.
#[derive(Clone, Debug)]
pub struct ServerCgroups {
    pub server: String,
    pub pid: u32,
    pub before: BTreeMap<String, CgroupCounters>,
}

/// Reads each server's cgroups (the start of the watch).
pub fn sample(servers: &[DnsServer]) -> Vec<ServerCgroups> {
    let root = cgroup_root();
    servers
        .iter()
        .filter_map(|s| {
            let text = read(&host::path(&format!("/proc/{}/cgroup", s.pid)))?;
            let before = read_counters(&root, &parse_proc_cgroups(&text));
            (!before.is_empty()).then(|| ServerCgroups {
                server: s.name(),
                pid: s.pid,
                before,
            })
        })
        .collect()
}

/// Reads them again (the end of the watch) and makes the findings.
pub fn findings(sampled: &[ServerCgroups]) -> Vec<Finding> {
    let root = cgroup_root();
    let mut out = Vec::new();
    for s in sampled {
        let after = read(&host::path(&format!("/proc/{}/cgroup", s.pid)))
            .map(|t| read_counters(&root, &parse_proc_cgroups(&t)))
            .unwrap_or_default();
        out.extend(compare(&s.server, &s.before, &after));
    }
    out
}

/// Findings of one server from its counters at the start and the end of the watch (the end
/// empty if the process is gone: its OOM history is then the start's).
pub fn compare(
    server: &str,
    before: &BTreeMap<String, CgroupCounters>,
    after: &BTreeMap<String, CgroupCounters>,
) -> Vec<Finding> {
    let mut out = Vec::new();
    let last = |p: &str| after.get(p).or_else(|| before.get(p));
    // A kubelet pod's cgroup is the pod's alone: its whole OOM history counts. Any other
    // (a session's, a service's) may hold more than the server: only what grew during the
    // watch does.
    let is_pod = |p: &str| {
        let path = if p.starts_with('/') {
            p
        } else {
            p.split_once(':').map_or(p, |(_, x)| x)
        };
        parse_cgroup_path(path).is_some()
    };
    let grown = |p: &str| {
        let b = before.get(p).and_then(|c| c.oom_kill).unwrap_or(0);
        after.get(p).and_then(|c| c.oom_kill).is_some_and(|a| a > b)
    };
    let mut ooms: Vec<(&String, u64)> = before
        .keys()
        .chain(after.keys())
        .filter(|p| is_pod(p) || grown(p))
        .filter_map(|p| Some((p, last(p)?.oom_kill?)))
        .filter(|(_, n)| *n > 0)
        .collect();
    ooms.sort();
    ooms.dedup();
    if let Some(&(path, n)) = ooms.iter().max_by_key(|(_, n)| *n) {
        let grew = before
            .get(path)
            .and_then(|c| c.oom_kill)
            .map_or(0, |b| n.saturating_sub(b));
        let mut f = Finding::new(
            FindingKind::OomKilled,
            server,
            format!("the kernel OOM-killed {n} process(es) in {server}'s cgroup"),
        );
        f.count = n;
        f.why = "A DNS server at its memory limit is killed (`OOMKilled`) and restarted: while it is down its share of the cluster's queries time out, and a cache under a limit too small for the cluster's names is killed again.".into();
        for (p, k) in &ooms {
            f.evidence.push(format!("{p}: oom_kill {k}"));
        }
        if grew > 0 {
            f.evidence.push(format!("{grew} of them during the watch"));
        }
        f.fix = "Raise the pod's memory limit (CoreDNS: about 70 MiB plus its cache; `kubectl -n kube-system edit deployment coredns`), or lower the cache size; check `kubectl describe pod` for `Last State: Terminated, Reason: OOMKilled`.".into();
        out.push(f);
    }
    let mut worst: Option<(String, u64, u64, u64)> = None;
    for (p, a) in after {
        let Some(b) = before.get(p) else { continue };
        let d = |x: Option<u64>, y: Option<u64>| x.unwrap_or(0).saturating_sub(y.unwrap_or(0));
        let thr = d(a.nr_throttled, b.nr_throttled);
        let per = d(a.nr_periods, b.nr_periods);
        let us = d(a.throttled_us, b.throttled_us);
        if thr >= MIN_THROTTLED
            && thr * 100 / per.max(1) >= MIN_THROTTLED_PCT
            && worst.as_ref().is_none_or(|w| thr > w.1)
        {
            worst = Some((p.clone(), thr, per, us));
        }
    }
    if let Some((p, thr, per, us)) = worst {
        let mut f = Finding::new(
            FindingKind::CpuThrottled,
            server,
            format!(
                "{server} was CPU-throttled in {thr} of {per} scheduler periods during the watch"
            ),
        );
        f.count = thr;
        f.why = "A throttled server stops for the rest of each 100 ms period: queries wait, latency jumps by tens of milliseconds and clients with short timeouts retry, adding load.".into();
        f.evidence = vec![
            format!("{p}: nr_throttled +{thr}, nr_periods +{per}"),
            format!("throttled for {:.3} s in all", us as f64 / 1e6),
        ];
        f.fix = "Remove the CPU limit of the DNS pods (keep the request) or raise it, scale CoreDNS out (more replicas, or the cluster-proportional autoscaler), and run NodeLocal DNSCache to take load off it.".into();
        out.push(f);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_cgroup_lines_and_levels() {
        let pc = parse_proc_cgroups(
            "12:memory:/kubepods/burstable/pod0f5c5b56-4c0a-4b8e-9a55-3f1f2e0d9c11/abcd\n4:cpu,cpuacct:/x\n0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod0f5c5b56_4c0a_4b8e_9a55_3f1f2e0d9c11.slice/cri-containerd-abcd.scope\n",
        );
        assert_eq!(pc.cpu.as_deref(), Some("/x"));
        assert_eq!(
            levels(pc.memory.as_deref().unwrap()),
            [
                "/kubepods/burstable/pod0f5c5b56-4c0a-4b8e-9a55-3f1f2e0d9c11/abcd",
                "/kubepods/burstable/pod0f5c5b56-4c0a-4b8e-9a55-3f1f2e0d9c11"
            ]
        );
        assert_eq!(levels(pc.v2.as_deref().unwrap()).len(), 2);
        assert_eq!(levels("/x"), ["/x"]);
        assert!(levels("/").is_empty());
        assert!(levels("/../etc").is_empty());
    }

    #[test]
    fn counters_from_v1_and_v2_text() {
        let v1 = "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n";
        assert_eq!(kv(v1, "oom_kill"), Some(2));
        assert_eq!(kv(v1, "oom_kill_disable"), Some(0));
        let v2 = "low 0\nhigh 0\nmax 12\noom 1\noom_kill 1\noom_group_kill 0\n";
        assert_eq!(kv(v2, "oom_kill"), Some(1));
        assert_eq!(kv("garbage", "oom_kill"), None);
    }

    fn c(oom: u64, per: u64, thr: u64) -> CgroupCounters {
        CgroupCounters {
            oom_kill: Some(oom),
            nr_periods: Some(per),
            nr_throttled: Some(thr),
            throttled_us: Some(thr * 90_000),
        }
    }

    #[test]
    fn oom_and_throttling_findings_fire_and_quiet_ones_do_not() {
        let m = |x: CgroupCounters| BTreeMap::from([("memory:/p".to_owned(), x)]);
        assert!(compare("s", &m(c(0, 100, 0)), &m(c(0, 400, 1))).is_empty());
        // Throttled before the watch, not during it.
        assert!(compare("s", &m(c(0, 100, 90)), &m(c(0, 200, 91))).is_empty());
        let f = compare("s", &m(c(1, 100, 0)), &m(c(2, 200, 50)));
        let kinds: Vec<_> = f.iter().map(|f| f.kind).collect();
        assert_eq!(kinds, [FindingKind::OomKilled, FindingKind::CpuThrottled]);
        assert_eq!(f[0].count, 2);
        assert!(f[0]
            .evidence
            .contains(&"1 of them during the watch".to_owned()));
        assert_eq!(f[1].count, 50);
        // Outside a kubelet pod, an OOM before the watch is someone else's.
        assert!(compare("s", &m(c(3, 0, 0)), &m(c(3, 0, 0))).is_empty());
        // A pod's cgroup: its whole history counts, also with the process gone.
        let pod = "/kubepods/burstable/pod0f5c5b56-4c0a-4b8e-9a55-3f1f2e0d9c11";
        let p = BTreeMap::from([(format!("memory:{pod}"), c(3, 0, 0))]);
        let f = compare("s", &p, &BTreeMap::new());
        assert_eq!(f.len(), 1);
        assert_eq!(f[0].count, 3);
    }
}
