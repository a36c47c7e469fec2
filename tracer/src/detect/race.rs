//! The conntrack DNAT race (kubernetes/kubernetes#56903): two queries of one UDP socket
//! (glibc's A and AAAA) race through conntrack after DNAT; one fails to insert and is dropped,
//! and the client waits out its timeout.
//!
//! Evidence combined per drop:
//! - the drop: `NETFILTER_DROP` at `nf_hook_slow` (or the NFQUEUE variant at `nfqnl_reinject`)
//!   of a packet whose conntrack entry is **not confirmed** and has its NAT done — a failed
//!   confirm. A drop by a rule (`nft_do_chain`, a confirmed entry, NAT not done yet) is a
//!   rule drop, never a race;
//! - the per-CPU conntrack statistics of that namespace: `insert_failed`/`drop` grew on the
//!   CPU that dropped it between the samples around the drop;
//! - the sibling query from the same socket and the backend each was DNAT'd to, and the
//!   client's retry (from the transaction).
use std::{
    collections::{HashMap, VecDeque},
    net::SocketAddr,
};

use serde::{ser::SerializeMap, Serialize, Serializer};

use super::{Detected, Detection, Detector};
use crate::{
    conntrack::CtStatus,
    correlate::{
        detector::{Control, Decided, DropEvidence},
        record::QuestionRecord,
        CorrelateConfig, DropObservation,
    },
    decode::{
        dns::RrType,
        record::{Incident, Names, PodRef, RecordKind},
    },
    event::{CtCpuStats, CtSnapshot, CtStatsSample},
    show::{at, escape, wall_clock},
    time::{format_duration as dur, Clock, WallTime},
};

const SAMPLES_KEPT: usize = 64;
/// Race drops whose query no leg holds, waiting for the counters sampled after them; beyond,
/// one is reported at once without them.
const MAX_UNMATCHED: usize = 256;
/// Namespaces whose samples are kept (beyond, all are forgotten: a namespace's next sample
/// starts its history again).
const MAX_NETNS: usize = 1024;

/// Is this drop a failed conntrack confirm (a race candidate)?
///
/// `confirm_failed` is the kernel's own word where the conntrack-confirm hook is loaded:
/// `Some(true)` settles it; otherwise the drop's reason, location and entry state decide.
pub(crate) fn is_race_candidate(
    reason: &str,
    function: &str,
    ct: Option<&CtSnapshot>,
    confirm_failed: Option<bool>,
) -> bool {
    if confirm_failed == Some(true) {
        return true;
    }
    let Some(ct) = ct else { return false };
    let status = CtStatus::from_bits_retain(ct.status);
    if status.contains(CtStatus::CONFIRMED) {
        return false;
    }
    match function {
        // __nf_conntrack_confirm failed → NF_DROP → freed in nf_hook_slow, after both NAT
        // hooks ran (POSTROUTING/INPUT confirm is last). The loser may be either query of
        // the pair, DNAT'd or not (0x1a0 or 0x180).
        // Before 5.17 the kernel gives no reason: the location and the entry's state decide.
        "nf_hook_slow" => {
            (reason == "NETFILTER_DROP" || reason == crate::decode::decoder::UNKNOWN_REASON)
                && status.contains(CtStatus::SRC_NAT_DONE | CtStatus::DST_NAT_DONE)
        }
        // A verdict re-injected from NFQUEUE that then fails to confirm.
        "nfqnl_reinject" => status.contains(CtStatus::DST_NAT | CtStatus::DST_NAT_DONE),
        _ => false,
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RaceVerdict {
    /// Kernel evidence: failed confirm of a DNAT'd query (and, when sampled, the counters).
    RaceDrop,
    /// The kernel resolved a clash (`clash_resolve` grew): the race happened, nothing lost.
    ResolvedClash,
    /// An unanswered query of an A/AAAA pair retried at the timeout, with no kernel
    /// evidence (lost elsewhere, or before the tracer saw it).
    Suspected,
}

words!(RaceVerdict {
    RaceDrop => "race-drop",
    ResolvedClash => "resolved-clash",
    Suspected => "suspected",
});

#[derive(Clone, Debug, Default, Serialize)]
pub struct CounterDeltas {
    pub insert_failed: u64,
    pub drop: u64,
    pub clash_resolve: u64,
}

#[derive(Clone, Debug, Serialize)]
pub struct RaceQuery {
    pub dns_id: u16,
    pub question: QuestionRecord,
    /// Where DNAT sent it.
    #[serde(serialize_with = "crate::decode::ip::serialize_addr")]
    pub backend: SocketAddr,
    /// Time since the pair's first query.
    pub offset_ns: u64,
}

/// The namespace of a race record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RaceNetns {
    /// Not known (no drop was seen).
    Unknown,
    /// The display name of the namespace where the query was dropped.
    Name(String),
    /// The cookie of the namespace whose counters showed a resolved clash.
    Cookie(u64),
}

/// A `race` record (written by its own `Serialize`, below: its summary is made of several of
/// its fields).
#[derive(Clone, Debug)]
pub struct RaceRecord {
    pub verdict: RaceVerdict,
    pub ts_ns: u64,
    /// `ts_ns` as Unix-epoch nanoseconds (wall-clock time).
    pub wall_ns: u64,
    pub netns: RaceNetns,
    /// The client socket (none for a resolved clash).
    pub client: Option<SocketAddr>,
    pub client_netns: String,
    /// The client's pod.
    pub pod: PodRef,
    pub dropped: Option<RaceQuery>,
    pub sibling: Option<RaceQuery>,
    pub cpu: Option<u32>,
    /// Per-CPU conntrack counter growth on `cpu` around the drop (all CPUs for clashes).
    pub counters: CounterDeltas,
    /// The counters were sampled on both sides of the drop and `insert_failed` or `drop`
    /// grew on its CPU.
    pub counter_confirmed: bool,
    /// The kprobe pair on `__nf_conntrack_confirm` saw it return `NF_DROP` for the dropped
    /// packet; `null` where the kernel has no kprobes (or without the hook).
    pub kernel_confirm_failed: Option<bool>,
    pub drop_reason: Option<String>,
    pub drop_location: Option<String>,
    /// The client's retry, since its first query.
    pub retry_ns: Option<u64>,
    /// First query → answer (end to end, including the retry).
    pub total_delay_ns: Option<u64>,
    /// A race drop: when it was, since the pair's first query (for the summary).
    pub drop_offset_ns: Option<u64>,
    /// `--record`: the flight-recorder file holding this incident's packets (written once its
    /// window is over).
    pub evidence: Option<String>,
}

/// Field by field in docs/output.md: the namespace and client as text, the client's pod
/// flattened in, the summary in words; `drop_offset_ns` only in the summary.
impl Serialize for RaceRecord {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(None)?;
        m.serialize_entry("verdict", &self.verdict)?;
        m.serialize_entry("ts_ns", &self.ts_ns)?;
        m.serialize_entry("time", &WallTime(self.wall_ns))?;
        m.serialize_entry("netns", &race_netns(&self.netns))?;
        let client = self.client.map(|c| c.to_string()).unwrap_or_default();
        m.serialize_entry("client", &client)?;
        m.serialize_entry("client_netns", &self.client_netns)?;
        self.pod.serialize_entries(&mut m)?;
        m.serialize_entry("dropped", &self.dropped)?;
        m.serialize_entry("sibling", &self.sibling)?;
        m.serialize_entry("cpu", &self.cpu)?;
        m.serialize_entry("counters", &self.counters)?;
        m.serialize_entry("counter_confirmed", &self.counter_confirmed)?;
        m.serialize_entry("kernel_confirm_failed", &self.kernel_confirm_failed)?;
        m.serialize_entry("drop_reason", &self.drop_reason)?;
        m.serialize_entry("drop_location", &self.drop_location)?;
        m.serialize_entry("retry_ns", &self.retry_ns)?;
        m.serialize_entry("total_delay_ns", &self.total_delay_ns)?;
        m.serialize_entry("summary", &race_summary(self))?;
        if let Some(e) = &self.evidence {
            m.serialize_entry("evidence", e)?;
        }
        m.end()
    }
}

/// A race record in one line, e.g. `lookup of api.lab.test. took 5.00 s: A dropped by
/// conntrack race at +0.60 ms, retried at +5.00 s`.
pub fn race_summary(r: &RaceRecord) -> String {
    if r.verdict == RaceVerdict::ResolvedClash {
        return format!(
            "{} conntrack clash(es) resolved by the kernel on CPU {}: the race happened, nothing was lost",
            r.counters.clash_resolve,
            r.cpu.unwrap_or(0)
        );
    }
    let (name, qtype) = match &r.dropped {
        Some(q) => (q.question.name.as_str(), q.question.qtype.name()),
        None => ("", "".into()),
    };
    let what = match (r.verdict, r.drop_offset_ns) {
        (RaceVerdict::RaceDrop, Some(at)) => {
            format!("{qtype} dropped by conntrack race at +{}", dur(at))
        }
        // The drop of a query dnspath did not read (lost in a flood, counted): no pair,
        // retry or delay to tell.
        (RaceVerdict::RaceDrop, None) => {
            format!("{qtype} dropped by conntrack race (the query itself was not read)")
        }
        _ => format!("{qtype} unanswered, no kernel evidence (suspected race)"),
    };
    let how = match r.retry_ns {
        Some(retry) => format!(", retried at +{}", dur(retry)),
        None => ", no retry seen".to_string(),
    };
    match r.total_delay_ns {
        Some(total) => format!("lookup of {name} took {}: {what}{how}", dur(total)),
        None => format!("lookup of {name}: {what}{how}"),
    }
}

/// The namespace of a race record: its name, `netns:0x…` for a bare cookie, or empty.
pub fn race_netns(netns: &RaceNetns) -> String {
    match netns {
        RaceNetns::Unknown => String::new(),
        RaceNetns::Name(n) => n.clone(),
        RaceNetns::Cookie(c) => format!("netns:{c:#x}"),
    }
}

/// A race matches by its queries and its client's pod; it is a failure, has no rcode, and is
/// slow when its answer came late or never.
impl RecordKind for RaceRecord {
    fn any_pod(&self, f: &mut dyn FnMut(&PodRef) -> bool) -> bool {
        f(&self.pod)
    }
    fn any_question(&self, f: &mut dyn FnMut(&str, RrType) -> bool) -> bool {
        self.dropped
            .iter()
            .chain(self.sibling.iter())
            .any(|q| f(&q.question.name, q.question.qtype))
    }
    fn is_failure(&self) -> bool {
        true
    }
    fn slower_than(&self, limit_ns: u64) -> bool {
        self.total_delay_ns.is_none_or(|d| d > limit_ns)
    }
    fn annotate_pods(&mut self, names: &Names) {
        self.pod = names.pod_of(&self.client_netns, "");
    }
    /// A race drop is an incident (not a resolved clash, nor a suspected race).
    fn incident(&self) -> Option<Incident> {
        (self.verdict == RaceVerdict::RaceDrop).then(|| Incident {
            kind: RaceVerdict::RaceDrop.as_str(),
            detail: race_summary(self),
            ts_ns: self.ts_ns,
        })
    }
    fn set_evidence(&mut self, file: Option<String>) {
        self.evidence = file;
    }
}

/// A race drop is news; a resolved clash or a suspected race is counted, not told.
impl Detection for RaceRecord {
    fn text(&self) -> String {
        race_line(self)
    }
    fn failure(&self) -> Option<(&'static str, String)> {
        (self.verdict == RaceVerdict::RaceDrop).then(|| (self.verdict.as_str(), race_summary(self)))
    }
}

fn race_line(r: &RaceRecord) -> String {
    let tag = match r.verdict {
        RaceVerdict::RaceDrop => "CONNTRACK RACE",
        RaceVerdict::ResolvedClash => "conntrack clash resolved",
        RaceVerdict::Suspected => "SUSPECTED conntrack race",
    };
    let mut line = format!(
        "{} {tag}: {}",
        wall_clock(r.wall_ns),
        escape(&race_summary(r))
    );
    if let Some(client) = r.client {
        line.push_str(&format!(
            " [client {client} in {}",
            at(&r.client_netns, "", &r.pod)
        ));
        if let Some(d) = &r.dropped {
            line.push_str(&format!(
                "; {} id {} → {}",
                d.question.qtype, d.dns_id, d.backend
            ));
        }
        if let Some(s) = &r.sibling {
            line.push_str(&format!(
                "; sibling {} id {} → {}",
                s.question.qtype, s.dns_id, s.backend
            ));
        }
        if let Some(cpu) = r.cpu {
            line.push_str(&format!(
                "; CPU {cpu} insert_failed +{} drop +{}",
                r.counters.insert_failed, r.counters.drop
            ));
        }
        line.push(']');
    }
    line
}

#[derive(Clone, Debug, Default, Serialize)]
pub(crate) struct RaceStats {
    pub race_drops: u64,
    pub resolved_clashes: u64,
    pub suspected: u64,
}

/// Conntrack statistics samples per namespace, to read counter growth around a drop.
#[derive(Default)]
pub(crate) struct CtSamples {
    /// By netns cookie (the kernel's, not the wire's): a fast hasher is safe.
    by_netns: HashMap<u64, VecDeque<CtStatsSample>, foldhash::fast::RandomState>,
}

impl CtSamples {
    /// Adds a sample; returns the growth of `clash_resolve` since the previous one, per CPU.
    pub(crate) fn add(&mut self, s: CtStatsSample) -> Vec<(u32, u64)> {
        let q = self.by_netns.entry(s.netns).or_default();
        let mut clashes = Vec::new();
        if let Some(prev) = q.back() {
            for c in &s.per_cpu {
                if let Some(p) = prev.per_cpu.iter().find(|p| p.cpu == c.cpu) {
                    let d = c.clash_resolve.saturating_sub(p.clash_resolve);
                    if d > 0 {
                        clashes.push((c.cpu, d));
                    }
                }
            }
        }
        q.push_back(s);
        while q.len() > SAMPLES_KEPT {
            q.pop_front();
        }
        if self.by_netns.len() > MAX_NETNS {
            self.by_netns.clear();
        }
        clashes
    }

    /// Counter growth on `cpu` of `netns` between the last sample before `ts` and the first
    /// after it; `None` until a sample after `ts` exists.
    pub(crate) fn around(&self, netns: u64, cpu: u32, ts: u64) -> Option<CounterDeltas> {
        let q = self.by_netns.get(&netns)?;
        let before = q.iter().rev().find(|s| s.ts_ns <= ts)?;
        let after = q.iter().find(|s| s.ts_ns > ts)?;
        let at = |s: &CtStatsSample| s.per_cpu.iter().find(|c| c.cpu == cpu).copied();
        let (b, a): (CtCpuStats, CtCpuStats) = (at(before)?, at(after)?);
        Some(CounterDeltas {
            insert_failed: a.insert_failed.saturating_sub(b.insert_failed),
            drop: a.drop.saturating_sub(b.drop),
            clash_resolve: a.clash_resolve.saturating_sub(b.clash_resolve),
        })
    }

    /// Namespaces and samples kept within their bounds.
    fn check_bounds(&self) -> Result<(), String> {
        if self.by_netns.len() > MAX_NETNS {
            return Err(format!(
                "conntrack samples: {} namespaces > {MAX_NETNS}",
                self.by_netns.len()
            ));
        }
        match self.by_netns.iter().find(|(_, q)| q.len() > SAMPLES_KEPT) {
            Some((netns, q)) => Err(format!(
                "conntrack samples of {netns}: {} > {SAMPLES_KEPT}",
                q.len()
            )),
            None => Ok(()),
        }
    }

    pub(crate) fn has_after(&self, netns: u64, ts: u64) -> bool {
        self.by_netns
            .get(&netns)
            .is_some_and(|q| q.back().is_some_and(|s| s.ts_ns > ts))
    }
}

/// The race detector: keeps the evidence of failed conntrack confirms, waits for the
/// counters sampled after them, and reports race drops, suspected races (an unanswered
/// query of an A/AAAA pair retried at the timeout, no kernel evidence) and resolved clashes.
pub(crate) struct RaceDetector {
    clock: Clock,
    /// [`CorrelateConfig::counters_wait_ns`] and [`CorrelateConfig::counters_poll_ns`].
    counters_wait_ns: u64,
    counters_poll_ns: u64,
    samples: CtSamples,
    stats: RaceStats,
    /// Reported after the turn's transactions.
    out: Vec<RaceRecord>,
    /// Race drops of queries no leg holds, in arrival order: (netns cookie, its record), until
    /// the counters sampled after them come ([`Detector::tick`]).
    unmatched: VecDeque<(u64, RaceRecord)>,
}

impl RaceDetector {
    pub(crate) fn new(clock: Clock, cfg: &CorrelateConfig) -> Self {
        Self {
            clock,
            counters_wait_ns: cfg.counters_wait_ns,
            counters_poll_ns: cfg.counters_poll_ns,
            samples: CtSamples::default(),
            stats: RaceStats::default(),
            out: Vec::new(),
            unmatched: VecDeque::new(),
        }
    }

    /// An unmatched race drop's record with the counters around it (if sampled).
    fn with_counters(&mut self, netns: u64, mut r: RaceRecord) -> RaceRecord {
        if let Some(c) = r
            .cpu
            .and_then(|cpu| self.samples.around(netns, cpu, r.ts_ns))
        {
            r.counter_confirmed = c.insert_failed > 0 || c.drop > 0;
            r.counters = c;
        }
        self.stats.race_drops += 1;
        r
    }
}

impl Detector for RaceDetector {
    type Report = Detected;
    type Stats = RaceStats;

    /// Kept to confirm races; resolved clashes are reported.
    fn ct_stats(&mut self, s: &CtStatsSample) {
        let (ts, netns) = (s.ts_ns, s.netns);
        for (cpu, n) in self.samples.add(s.clone()) {
            self.stats.resolved_clashes += n;
            self.out.push(RaceRecord {
                evidence: None,
                pod: Default::default(),
                verdict: RaceVerdict::ResolvedClash,
                ts_ns: ts,
                wall_ns: self.clock.epoch_ns(ts),
                netns: RaceNetns::Cookie(netns),
                client: None,
                client_netns: String::new(),
                dropped: None,
                sibling: None,
                cpu: Some(cpu),
                counters: CounterDeltas {
                    clash_resolve: n,
                    ..Default::default()
                },
                counter_confirmed: true,
                kernel_confirm_failed: None,
                drop_reason: None,
                drop_location: None,
                retry_ns: None,
                total_delay_ns: None,
                drop_offset_ns: None,
            });
        }
    }

    fn keeps(&self, d: &DropObservation) -> bool {
        is_race_candidate(&d.reason, &d.function, d.ct.as_ref(), d.confirm_failed)
    }

    /// A race drop of a query no leg holds (not read, in a flood) is still a race drop: the
    /// kernel's evidence is the drop itself. Reported by [`Detector::tick`] once the
    /// counters after it are sampled, without the pair, retry and delay a leg would give.
    fn unmatched_drop(&mut self, d: &DropObservation, q: &QuestionRecord) {
        let (client, backend) = match &d.ct {
            Some(ct) => (ct.orig.src, ct.reply.src),
            None => (d.src, d.dst),
        };
        let r = RaceRecord {
            verdict: RaceVerdict::RaceDrop,
            ts_ns: d.ts_ns,
            wall_ns: self.clock.epoch_ns(d.ts_ns),
            netns: RaceNetns::Name(d.netns.to_string()),
            client: Some(client),
            client_netns: String::new(),
            pod: Default::default(),
            dropped: Some(RaceQuery {
                dns_id: d.msg.as_ref().map_or(0, |m| m.id),
                question: q.clone(),
                backend,
                offset_ns: 0,
            }),
            sibling: None,
            cpu: Some(d.cpu),
            counters: CounterDeltas::default(),
            counter_confirmed: false,
            kernel_confirm_failed: d.confirm_failed,
            drop_reason: Some(d.reason.clone()),
            drop_location: Some(d.location.clone()),
            retry_ns: None,
            total_delay_ns: None,
            drop_offset_ns: None,
            evidence: None,
        };
        if self.unmatched.len() >= MAX_UNMATCHED {
            // The oldest goes out now, with whatever counters there are.
            if let Some((netns, old)) = self.unmatched.pop_front() {
                let old = self.with_counters(netns, old);
                self.out.push(old);
            }
        }
        self.unmatched.push_back((d.netns_cookie, r));
    }

    fn tick(&mut self, now: u64, all: bool, out: &mut Vec<Detected>, _c: &mut Vec<Control>) {
        while let Some((netns, r)) = self.unmatched.front() {
            let ready = all
                || now >= r.ts_ns.saturating_add(self.counters_wait_ns)
                || self.samples.has_after(*netns, r.ts_ns);
            if !ready {
                break;
            }
            let Some((netns, r)) = self.unmatched.pop_front() else {
                break;
            };
            let r = self.with_counters(netns, r);
            out.push(r.into());
        }
    }

    /// A race drop is judged with the counters sampled after it (they come every 200 ms).
    fn holds(&self, e: &DropEvidence, now: u64) -> Option<u64> {
        let wait_until = e.ts + self.counters_wait_ns;
        (!self.samples.has_after(e.netns, e.ts) && now < wait_until)
            .then(|| (now + self.counters_poll_ns).min(wait_until))
    }

    /// Race records of a finished transaction: race drops with their evidence, or a
    /// suspected race.
    fn decided(&mut self, t: &Decided<'_>) {
        let total = t.record.and_then(|r| r.latency_ns);
        for l in t.attempts {
            let pair_start = l
                .sibling
                .as_ref()
                .map(|s| s.0.min(l.first_ts))
                .unwrap_or(l.first_ts);
            let sibling_rec = l.sibling.as_ref().map(|(ts, id, q, backend)| RaceQuery {
                dns_id: *id,
                question: q.clone(),
                backend: *backend,
                offset_ns: ts.saturating_sub(pair_start),
            });
            let (verdict, cpu, counters, confirmed, drop_ts, backend, confirm) = match l.evidence {
                Some(e) => {
                    let c = self.samples.around(e.netns, e.cpu, e.ts);
                    let confirmed = c
                        .as_ref()
                        .is_some_and(|c| c.insert_failed > 0 || c.drop > 0);
                    self.stats.race_drops += 1;
                    (
                        RaceVerdict::RaceDrop,
                        Some(e.cpu),
                        c.unwrap_or_default(),
                        confirmed,
                        Some(e.ts),
                        e.backend,
                        e.confirm_failed,
                    )
                }
                None if l.drop.is_none()
                    && !l.answered
                    && (t.retry_ns.is_some() || l.retransmits > 0)
                    && l.sibling.is_some() =>
                {
                    self.stats.suspected += 1;
                    (
                        RaceVerdict::Suspected,
                        None,
                        CounterDeltas::default(),
                        false,
                        None,
                        l.backend,
                        None,
                    )
                }
                None => continue,
            };
            self.out.push(RaceRecord {
                evidence: None,
                pod: Default::default(),
                verdict,
                ts_ns: drop_ts.unwrap_or(l.first_ts),
                wall_ns: self.clock.epoch_ns(drop_ts.unwrap_or(l.first_ts)),
                netns: match &l.drop {
                    Some(d) => RaceNetns::Name(d.netns.to_string()),
                    None => RaceNetns::Unknown,
                },
                client: Some(l.client),
                client_netns: l.client_netns.to_string(),
                dropped: Some(RaceQuery {
                    dns_id: l.dns_id,
                    question: l.question.clone(),
                    backend,
                    offset_ns: l.first_ts.saturating_sub(pair_start),
                }),
                sibling: sibling_rec,
                cpu,
                counters,
                counter_confirmed: confirmed,
                kernel_confirm_failed: confirm,
                drop_reason: l.drop.as_ref().map(|d| d.reason.clone()),
                drop_location: l.drop.as_ref().map(|d| d.location.clone()),
                retry_ns: t.retry_ns,
                total_delay_ns: total,
                drop_offset_ns: drop_ts.map(|ts| ts.saturating_sub(pair_start)),
            });
        }
    }

    fn settle(&mut self, out: &mut Vec<Detected>) {
        out.extend(self.out.drain(..).map(Detected::from));
    }

    fn check_bounds(&self) -> Result<(), String> {
        if self.unmatched.len() > MAX_UNMATCHED {
            return Err(format!(
                "unmatched race drops: {} > {MAX_UNMATCHED}",
                self.unmatched.len()
            ));
        }
        self.samples.check_bounds()
    }

    fn stats(&self, into: &mut RaceStats) {
        *into = self.stats.clone();
    }
}

#[cfg(test)]
#[path = "race_tests.rs"]
mod tests;
