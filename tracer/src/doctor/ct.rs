//! conntrack, as the runbooks read it: the table's fill (`nf_conntrack_count` against
//! `nf_conntrack_max`) and the growth of the per-CPU `insert_failed`, `drop` and
//! `clash_resolve` counters during the watch (`conntrack -S`). All of the calling thread's
//! network namespace — the node's, where kube-proxy's DNAT of pod queries happens: the
//! count and the counters are per namespace (`/proc/sys/net/netfilter` and ctnetlink answer
//! for the reader's namespace, whatever `/sys` or `/proc` is mounted).
use super::finding::{Finding, FindingKind};
use crate::{conntrack, event::CtCpuStats};

/// A table at least this full (percent) is a finding.
pub const FILL_PCT: u64 = 80;

/// One look at conntrack.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CtSample {
    pub count: Option<u64>,
    pub max: Option<u64>,
    /// Summed over CPUs; `None` without conntrack statistics (no module loaded).
    pub insert_failed: Option<u64>,
    pub drop: Option<u64>,
    pub clash_resolve: Option<u64>,
}

fn sysctl(name: &str) -> Option<u64> {
    std::fs::read_to_string(format!("/proc/sys/net/netfilter/{name}"))
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// Sums of the per-CPU counters.
pub fn totals(per_cpu: &[CtCpuStats]) -> (u64, u64, u64) {
    per_cpu.iter().fold((0, 0, 0), |(i, d, c), s| {
        (
            i.saturating_add(s.insert_failed),
            d.saturating_add(s.drop),
            c.saturating_add(s.clash_resolve),
        )
    })
}

/// Reads this namespace's conntrack.
pub fn sample() -> CtSample {
    let stats = conntrack::read_stats().ok().filter(|v| !v.is_empty());
    let t = stats.as_deref().map(totals);
    CtSample {
        count: sysctl("nf_conntrack_count"),
        max: sysctl("nf_conntrack_max"),
        insert_failed: t.map(|t| t.0),
        drop: t.map(|t| t.1),
        clash_resolve: t.map(|t| t.2),
    }
}

/// The running kernel's release, e.g. `6.1.0-18-amd64`.
pub fn kernel_release() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_owned())
        .unwrap_or_default()
}

/// `major.minor` of a release string.
pub fn version(release: &str) -> Option<(u32, u32)> {
    let mut it = release.split(|c: char| !c.is_ascii_digit());
    Some((it.next()?.parse().ok()?, it.next()?.parse().ok()?))
}

/// What grew between two samples: (insert_failed, drop, clash_resolve).
pub fn growth(before: &CtSample, after: &CtSample) -> (u64, u64, u64) {
    let d = |a: Option<u64>, b: Option<u64>| match (a, b) {
        (Some(a), Some(b)) => a.saturating_sub(b),
        _ => 0,
    };
    (
        d(after.insert_failed, before.insert_failed),
        d(after.drop, before.drop),
        d(after.clash_resolve, before.clash_resolve),
    )
}

/// The runbooks' explanation and fixes of the insert race, with the kernel's clash
/// resolution said for this kernel.
pub fn race_fix() -> &'static str {
    "Add `options single-request-reopen` (glibc; `use-vc` to go over TCP) to the pod's dnsConfig, run NodeLocal DNSCache (pods' queries are not DNAT'ed: no race), or use a kernel ≥ 5.6 whose clash resolution keeps both entries."
}

/// Evidence lines of the counters' growth.
pub fn growth_evidence(before: &CtSample, after: &CtSample, release: &str) -> Vec<String> {
    let (i, d, c) = growth(before, after);
    let mut ev = vec![format!(
        "conntrack -S during the watch: insert_failed +{i}, drop +{d}{}",
        if after.clash_resolve.is_some() {
            format!(", clash_resolve +{c}")
        } else {
            String::new()
        }
    )];
    let clash = match version(release) {
        Some(v) if v >= (5, 6) => "has the UDP clash resolution of 5.6",
        Some(_) => "predates the UDP clash resolution of 5.6",
        None => "unknown version",
    };
    ev.push(format!("kernel {release}: {clash}"));
    ev
}

/// Findings from the samples at the start and the end of the watch. `race_found`: the race
/// detector already attributed drops (its findings get the counters as evidence instead).
pub fn findings(
    before: &CtSample,
    after: &CtSample,
    release: &str,
    race_found: bool,
) -> Vec<Finding> {
    let mut out = Vec::new();
    for s in [after, before] {
        let (Some(count), Some(max)) = (s.count, s.max) else {
            continue;
        };
        if max == 0 || count * 100 / max < FILL_PCT {
            continue;
        }
        let pct = count * 100 / max;
        let mut f = Finding::new(
            FindingKind::ConntrackTableFill,
            "node",
            format!("the conntrack table is {pct}% full ({count} of {max} entries)"),
        );
        f.count = count;
        f.why = "When it is full the kernel drops the first packet of every new connection (`nf_conntrack: table full, dropping packet`): UDP DNS queries, each a new entry, are the first to go.".into();
        f.evidence = vec![format!(
            "nf_conntrack_count {count}, nf_conntrack_max {max} (this network namespace)"
        )];
        f.fix = "Raise `net.netfilter.nf_conntrack_max` (kube-proxy's `conntrack.maxPerCore`), shorten `nf_conntrack_udp_timeout`, and run NodeLocal DNSCache with its NOTRACK rules so DNS takes no entries.".into();
        out.push(f);
        break;
    }
    let (i, d, _) = growth(before, after);
    if !race_found && (i > 0 || d > 0) {
        let mut f = Finding::new(
            FindingKind::ConntrackInsertFailed,
            "node",
            format!("conntrack failed {i} insertion(s) and dropped {d} packet(s) during the watch"),
        );
        f.count = i.max(d);
        f.why = "The A/AAAA race: glibc and musl send the A and AAAA queries from one socket at once; after DNAT both want the same conntrack entry and the second insert fails — its packet is dropped and the lookup waits 5 s for a retry.".into();
        f.evidence = growth_evidence(before, after, release);
        f.fix = race_fix().into();
        out.push(f);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(count: u64, max: u64, ifail: u64) -> CtSample {
        CtSample {
            count: Some(count),
            max: Some(max),
            insert_failed: Some(ifail),
            drop: Some(ifail),
            clash_resolve: Some(0),
        }
    }

    #[test]
    fn fill_and_growth() {
        assert!(findings(&s(10, 1000, 5), &s(20, 1000, 5), "6.1.0", false).is_empty());
        let f = findings(&s(10, 1000, 5), &s(900, 1000, 7), "5.4.0-150", false);
        let kinds: Vec<_> = f.iter().map(|f| f.kind).collect();
        assert_eq!(
            kinds,
            [
                FindingKind::ConntrackTableFill,
                FindingKind::ConntrackInsertFailed
            ]
        );
        assert!(f[0].seen.contains("90% full"), "{}", f[0].seen);
        assert_eq!(f[1].count, 2);
        assert!(f[1].evidence[1].contains("predates"), "{:?}", f[1].evidence);
        // Attributed by the race detector: no second finding.
        assert!(findings(&s(10, 1000, 5), &s(20, 1000, 7), "6.1", true).is_empty());
        // No conntrack at all.
        assert!(findings(&CtSample::default(), &CtSample::default(), "", false).is_empty());
        assert_eq!(version("6.18.44-fc-v1045"), Some((6, 18)));
        assert_eq!(version("x"), None);
    }
}
