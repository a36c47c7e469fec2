//! The pipeline's own records folded into findings: runtime loops, race drops, kernel drops
//! of DNS by namespace and reason, unanswered and SERVFAIL per server, answers after the
//! client gave up, and ndots amplification (NXDOMAINs per search-list lookup). Thresholds
//! keep a healthy node under load quiet: a single lost datagram is no finding.
use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    net::SocketAddr,
};

use super::{
    causes::{self, CausedBy},
    finding::{Finding, FindingKind},
    servers::{Failure, PerServer},
};
use crate::{
    correlate::record::{Outcome, Summary, TransactionRecord},
    decode::record::DropRecord,
    detect::{
        loops::{peer, LoopKind, LoopRecord},
        race::{RaceRecord, RaceVerdict},
    },
};

/// A server with fewer unanswered queries is not reported.
pub const MIN_UNANSWERED: u64 = 3;
/// … nor one with fewer than this share of its queries unanswered (percent).
pub const MIN_UNANSWERED_PCT: u64 = 5;
/// Lookups with at least this many NXDOMAINs before their answer are amplified…
pub const NDOTS_NXDOMAINS: u64 = 2;
/// … and a client with at least this many such lookups is reported.
pub const NDOTS_MIN_LOOKUPS: u64 = 10;
/// Names kept per group as examples.
const EXAMPLES: usize = 3;
/// Most lookups followed per client; later ones are not counted (the finding's count is then
/// a lower bound, and says so).
const MAX_LOOKUPS: usize = 65_536;
/// Most servers followed (the addresses queries went to); transactions to more are not
/// counted ([`TrafficFolder::untracked`]).
pub const MAX_SERVERS: usize = 4_096;

#[derive(Default)]
struct ServerAgg {
    queries: u64,
    unanswered: u64,
    servfail: u64,
    /// Names of queries it failed on its own…
    names: BTreeSet<String>,
    /// … and of those another server's failure caused.
    names_caused: BTreeSet<String>,
    /// Of `unanswered` and `servfail`, those another server's failure caused (the joined
    /// legs say so: [`causes::root_causes`]).
    caused: CausedBy,
}

impl ServerAgg {
    fn failed(&self, how: Failure) -> u64 {
        match how {
            Failure::Unanswered => self.unanswered,
            Failure::Servfail => self.servfail,
        }
    }

    /// Its failures of kind `how` that were its own (no other server's caused them).
    fn own(&self, how: Failure) -> u64 {
        let caused: u64 = self
            .caused
            .iter()
            .filter(|((k, _, _), _)| *k == how)
            .map(|(_, n)| n)
            .sum();
        self.failed(how).saturating_sub(caused)
    }
}

#[derive(Default)]
struct DropAgg {
    packets: u64,
    /// `--record`: a flight-recorder file holding some of them.
    evidence: Option<String>,
    srcs: BTreeSet<String>,
    names: BTreeSet<String>,
    pod: Option<String>,
    /// (source, DNS id) of the packets, to tell the conntrack race's drops apart.
    keys: Vec<(String, u16)>,
}

/// Most (source, DNS id) pairs kept per drop group and of race drops.
const MAX_KEYS: usize = 4096;

#[derive(Default)]
struct LateAgg {
    count: u64,
    evidence: Option<String>,
    servers: BTreeSet<SocketAddr>,
    names: BTreeSet<String>,
    answer_ns: Vec<u64>,
    gave_up_ns: Option<u64>,
}

#[derive(Default)]
struct ClientAgg {
    pod: Option<String>,
    dropped: u64,
    /// By the correlator's own lookup ids (a counter): a fast hasher is safe.
    lookups: HashMap<u64, LookupAgg, foldhash::fast::RandomState>,
    /// Lookups not followed: more than [`MAX_LOOKUPS`].
    untracked: u64,
    names: BTreeSet<String>,
}

/// One search-list lookup of a client: its queries, and what a trailing dot or a lower
/// `ndots` would have saved of them.
#[derive(Default)]
struct LookupAgg {
    queries: u64,
    nxdomains: u64,
    /// The first name answered NXDOMAIN (a search-list expansion of the name asked).
    first_nx: Option<Box<str>>,
    /// The first name answered with data.
    answered: Option<Box<str>>,
}

impl LookupAgg {
    /// Dots of the name as the client asked it, when that name (not one of its search-list
    /// expansions) is what was answered: a trailing dot would have asked it first.
    fn asked_dots(&self) -> Option<usize> {
        let answered = self.answered.as_deref()?.trim_end_matches('.');
        let first = self.first_nx.as_deref()?;
        let expansion = first
            .strip_prefix(answered)
            .is_some_and(|rest| rest.starts_with('.') && rest.len() > 1);
        expansion.then(|| answered.matches('.').count())
    }
}

/// Folds records as they come; [`TrafficFolder::findings`] at the end.
#[derive(Default)]
pub struct TrafficFolder {
    loops: BTreeMap<u64, LoopRecord>,
    races: BTreeMap<String, (u64, BTreeSet<String>)>,
    /// (client, DNS id) of queries the race detector says conntrack dropped.
    race_keys: BTreeSet<(String, u16)>,
    drops: BTreeMap<(String, String, String), DropAgg>,
    /// Legs to servers beyond [`MAX_SERVERS`] are refused.
    servers: PerServer<SocketAddr, ServerAgg>,
    late: BTreeMap<String, LateAgg>,
    clients: BTreeMap<String, ClientAgg>,
    pub transactions: u64,
}

fn add_example(set: &mut BTreeSet<String>, name: &str) {
    if set.len() < EXAMPLES {
        set.insert(name.to_owned());
    }
}

/// A way a server fails its clients, reported when it is frequent enough (at least
/// [`MIN_UNANSWERED`] queries and [`MIN_UNANSWERED_PCT`] of them).
struct ServerFailure {
    kind: FindingKind,
    how: Failure,
    /// What was seen, from the server, the count, its queries and the share in percent.
    seen: fn(&SocketAddr, u64, u64, u64) -> String,
    /// What the example names are, in the evidence.
    label: &'static str,
    why: &'static str,
    fix: &'static str,
}

const UNANSWERED: ServerFailure = ServerFailure {
    kind: FindingKind::UnansweredQueries,
    how: Failure::Unanswered,
    seen: |server, n, queries, pct| {
        format!("{server} left {n} of {queries} queries unanswered ({pct}%)")
    },
    label: "unanswered",
    why: "Clients wait their whole timeout (5 s by default) and retry; lookups fail when every try does.",
    fix: "Check the server is up and reachable (its pod, its Service endpoints, NetworkPolicies on port 53), and its own upstream.",
};

const SERVFAIL: ServerFailure = ServerFailure {
    kind: FindingKind::Servfail,
    how: Failure::Servfail,
    seen: |server, n, queries, _| format!("{server} answered SERVFAIL to {n} of {queries} queries"),
    label: "SERVFAIL",
    why: "SERVFAIL is a failed lookup: the server could not get an answer from its upstream.",
    fix: "Look at the server's upstream (its `forward` targets) and its logs (`kubectl logs`, the errors plugin).",
};

/// `n` failures of `queries` are frequent enough to report.
fn frequent(n: u64, queries: u64) -> bool {
    n >= MIN_UNANSWERED && n * 100 / queries.max(1) >= MIN_UNANSWERED_PCT
}

/// A server whose failures another's caused, folded under that cause's finding: how it
/// failed, how often, of how many queries.
struct Symptom {
    server: SocketAddr,
    how: Failure,
    n: u64,
    queries: u64,
}

impl ServerFailure {
    /// The finding of `n` of `server`'s failures, with `symptoms`: the failures of the
    /// servers in front of it that its own caused, said after it (cause first).
    /// `caused_too`: some of the `n` were caused by another server (one too quiet to be
    /// reported), so their names are examples too.
    fn finding(
        &self,
        server: &SocketAddr,
        (n, caused_too): (u64, bool),
        s: &ServerAgg,
        symptoms: &[Symptom],
    ) -> Option<Finding> {
        if !frequent(n, s.queries) {
            return None;
        }
        let pct = n * 100 / s.queries.max(1);
        let mut seen = (self.seen)(server, n, s.queries, pct);
        if !symptoms.is_empty() {
            let words: Vec<String> = symptoms
                .iter()
                .map(|y| causes::symptom_words(&y.server, y.how, y.n, y.queries))
                .collect();
            seen.push_str(", and so ");
            seen.push_str(&words.join(" and "));
        }
        let mut f = Finding::new(self.kind, server.to_string(), seen);
        f.count = n;
        f.why = self.why.into();
        for y in symptoms {
            f.evidence.push(format!(
                "symptom: {}: each forwarded on to {server}, where {} (joined legs)",
                causes::symptom_words(&y.server, y.how, y.n, y.queries),
                causes::failed_words(self.how)
            ));
        }
        if !symptoms.is_empty() {
            f.why.push_str(" The servers that forwarded these queries to it failed them because it did: their failures are its symptom, not faults of their own, and are not reported again.");
        }
        let label = self.label;
        let caused = s.names_caused.iter().filter(|_| caused_too);
        f.evidence.extend(
            s.names
                .iter()
                .chain(caused)
                .map(|n| format!("{label}: {n}")),
        );
        f.fix = self.fix.into();
        Some(f)
    }
}

fn secs(ns: u64) -> String {
    format!("{:.2} s", ns as f64 / 1e9)
}

impl TrafficFolder {
    pub fn loop_record(&mut self, l: &LoopRecord) {
        let keep = self
            .loops
            .get(&l.id)
            .is_none_or(|old| l.packets >= old.packets);
        if keep {
            self.loops.insert(l.id, l.clone());
        }
    }

    pub fn race(&mut self, r: &RaceRecord) {
        if r.verdict != RaceVerdict::RaceDrop {
            return;
        }
        if let (Some(c), Some(q)) = (r.client, &r.dropped) {
            if self.race_keys.len() < MAX_KEYS {
                self.race_keys.insert((c.to_string(), q.dns_id));
            }
        }
        let who = r.pod.pod.clone().unwrap_or_else(|| r.client_netns.clone());
        let e = self.races.entry(who).or_default();
        e.0 += 1;
        if let Some(q) = &r.dropped {
            add_example(
                &mut e.1,
                &format!("{} {}", q.question.name, q.question.qtype),
            );
        }
    }

    pub fn drop(&mut self, d: &DropRecord) {
        // Normal socket life, and answers to a closed socket (reported as late answers).
        if d.benign.is_some() || d.reason == "NO_SOCKET" {
            return;
        }
        // conntrack's confirmation failed: the insert race (its own finding), no rule.
        if d.confirm_failed == Some(true) {
            return;
        }
        let key = (d.netns.to_string(), d.reason.clone(), d.location.clone());
        let e = self.drops.entry(key).or_default();
        e.packets += 1;
        if let Some(m) = &d.dns {
            if e.keys.len() < MAX_KEYS {
                e.keys.push((d.src.clone(), m.id));
            }
        }
        add_example(&mut e.srcs, &format!("{} > {}", d.src, d.dst));
        if let Some(q) = d.dns.as_ref().and_then(|m| m.questions.first()) {
            add_example(&mut e.names, &q.name);
        }
        if e.pod.is_none() {
            e.pod = d.pod.as_ref().and_then(|p| p.pod.clone());
        }
        if e.evidence.is_none() {
            e.evidence.clone_from(&d.evidence);
        }
    }

    pub fn transaction(&mut self, t: &TransactionRecord) {
        self.transactions += 1;
        let causes = causes::root_causes(t);
        for (leg, cause) in t.legs.iter().zip(causes) {
            let Some(s) = self.servers.tally(leg.server, MAX_SERVERS) else {
                continue;
            };
            s.queries += 1;
            if let Some(failure) = Failure::of_leg(leg) {
                match failure {
                    Failure::Unanswered => s.unanswered += 1,
                    Failure::Servfail => s.servfail += 1,
                }
                let by = cause
                    .and_then(|c| t.legs.get(c))
                    .and_then(|c| Some((c.server, Failure::of_leg(c)?)))
                    .filter(|(server, _)| *server != leg.server);
                let key = by
                    .map(|(server, how)| (failure, server, how))
                    .filter(|key| {
                        s.caused.len() < causes::MAX_CAUSES || s.caused.contains_key(key)
                    });
                match key {
                    Some(key) => {
                        *s.caused.entry(key).or_default() += 1;
                        add_example(&mut s.names_caused, &t.question.name);
                    }
                    None => add_example(&mut s.names, &t.question.name),
                }
            }
        }
        if t.outcome == Outcome::Late {
            let e = self.late.entry(t.client_netns.to_string()).or_default();
            e.count += 1;
            if e.evidence.is_none() {
                e.evidence.clone_from(&t.evidence);
            }
            if let Some(l) = t.legs.first() {
                e.servers.insert(l.server);
            }
            add_example(&mut e.names, &t.question.name);
            if let Summary::Late {
                answer_ns,
                gave_up_ns,
                ..
            } = &t.summary
            {
                e.answer_ns.push(*answer_ns);
                e.gave_up_ns = e.gave_up_ns.or(*gave_up_ns);
            }
        }
        // Looked up by reference: a client's key is allocated once, not per transaction.
        let c = match self.clients.get_mut(&*t.client_netns) {
            Some(c) => c,
            None => self.clients.entry(t.client_netns.to_string()).or_default(),
        };
        if c.pod.is_none() {
            c.pod = t.pod.pod.clone();
        }
        if t.outcome == Outcome::Dropped {
            c.dropped += 1;
        }
        if c.lookups.len() >= MAX_LOOKUPS && !c.lookups.contains_key(&t.lookup.id) {
            c.untracked += 1;
            return;
        }
        let l = c.lookups.entry(t.lookup.id).or_default();
        l.queries += 1;
        match t.rcode.as_deref() {
            Some("NXDOMAIN") => {
                l.nxdomains += 1;
                if l.first_nx.is_none() {
                    l.first_nx = Some(t.question.name.as_str().into());
                }
                add_example(&mut c.names, &t.question.name);
            }
            Some("NOERROR") if !t.answers.is_empty() && l.answered.is_none() => {
                l.answered = Some(t.question.name.as_str().into());
            }
            _ => {}
        }
    }

    /// Legs and lookups not followed because their table was full.
    pub fn untracked(&self) -> u64 {
        self.servers.refused() + self.clients.values().map(|c| c.untracked).sum::<u64>()
    }

    pub fn findings(&self) -> Vec<Finding> {
        let mut out = Vec::new();
        self.loop_findings(&mut out);
        self.drop_findings(&mut out);
        for (who, (n, names)) in &self.races {
            let mut f = Finding::new(
                FindingKind::ConntrackRace,
                who.clone(),
                format!("{n} queries of {who} were dropped by the conntrack A/AAAA insert race"),
            );
            f.count = *n;
            f.why = "Each costs the client a 5 s timeout and a retry: the classic \"DNS takes 5 seconds\".".into();
            f.evidence = names.iter().map(|q| format!("dropped: {q}")).collect();
            f.fix = "Add `options single-request-reopen` (glibc) to the pod's dnsConfig, run NodeLocal DNSCache (no DNAT for pod queries), or use a kernel ≥ 5.6 whose clash resolution keeps both.".into();
            out.push(f);
        }
        self.server_findings(&mut out);
        for (client, l) in &self.late {
            let servers: Vec<String> = l.servers.iter().map(ToString::to_string).collect();
            let mut f = Finding::new(
                FindingKind::LateAnswers,
                client.clone(),
                format!(
                    "{} answers to {client} came after the client had given up (from {})",
                    l.count,
                    servers.join(", ")
                ),
            );
            f.count = l.count;
            f.why = "The server did answer, but slower than the client waits: the client retries or fails although the server works — the upstream is slow, not down.".into();
            for n in &l.names {
                f.evidence.push(format!("late: {n}"));
            }
            if let Some(max) = l.answer_ns.iter().max() {
                f.evidence.push(format!("answer came at +{}", secs(*max)));
            }
            if let Some(g) = l.gave_up_ns {
                f.evidence.push(format!("client's own timeout {}", secs(g)));
            }
            if let Some(e) = &l.evidence {
                f.evidence.push(format!("packets: {e}"));
            }
            f.fix = "Find why the upstream is slow (its own upstream, load, packet loss); raise the client's `options timeout:` only as a stopgap.".into();
            out.push(f);
        }
        for (client, c) in &self.clients {
            let amplified: Vec<&LookupAgg> = c
                .lookups
                .values()
                .filter(|l| l.nxdomains >= NDOTS_NXDOMAINS)
                .collect();
            let n = amplified.len() as u64;
            if n < NDOTS_MIN_LOOKUPS {
                continue;
            }
            let nx: u64 = amplified.iter().map(|l| l.nxdomains).sum();
            let queries: u64 = amplified.iter().map(|l| l.queries).sum();
            let who = c.pod.clone().unwrap_or_else(|| client.clone());
            let mut f = Finding::new(
                FindingKind::NdotsAmplification,
                who.clone(),
                format!(
                    "{n} lookups of {who} went through {nx} NXDOMAINs of the search list first"
                ),
            );
            f.count = n;
            f.why = "With `ndots:5` every name with fewer than 5 dots is tried with each search domain first: 3–4 extra queries (×2 for A and AAAA) per external lookup, load on CoreDNS and latency.".into();
            f.evidence = c.names.iter().map(|n| format!("NXDOMAIN: {n}")).collect();
            f.evidence.push(format!(
                "{queries} queries for these {n} lookups ({:.1} per lookup), {nx} of them NXDOMAIN",
                queries as f64 / n as f64
            ));
            let saved = |min_dots: usize| -> u64 {
                amplified
                    .iter()
                    .filter(|l| l.asked_dots().is_some_and(|d| d >= min_dots))
                    .map(|l| l.nxdomains)
                    .sum()
            };
            let pct = |k: u64| k * 100 / queries.max(1);
            let dot = saved(0);
            if dot > 0 {
                let two = saved(2);
                f.evidence.push(format!(
                    "a trailing dot on the names asked would save {dot} of the {queries} queries ({}%); `ndots:2` would save {two} ({}%)",
                    pct(dot),
                    pct(two)
                ));
            }
            if c.untracked > 0 {
                f.evidence.push(format!(
                    "at least: {} more queries of lookups past the first {MAX_LOOKUPS} were not counted",
                    c.untracked
                ));
            }
            f.fix = "Use fully qualified names with a trailing dot (`api.example.com.`), or set `dnsConfig.options: [{name: ndots, value: \"2\"}]` on the pod.".into();
            out.push(f);
        }
        out
    }

    /// Unanswered and SERVFAIL per server, following the tree: a server whose own failures
    /// are frequent is a cause, and the failures of the servers in front of it that it caused
    /// are folded under its finding; what is left of theirs (their own, or caused by a server
    /// too quiet to report) is theirs.
    fn server_findings(&self, out: &mut Vec<Finding>) {
        let is_cause = |server: &SocketAddr, how: Failure| {
            self.servers
                .get(server)
                .is_some_and(|s| frequent(s.own(how), s.queries))
        };
        for (server, s) in self.servers.iter() {
            for kind in [&UNANSWERED, &SERVFAIL] {
                let folded: u64 = s
                    .caused
                    .iter()
                    .filter(|((how, by, by_how), _)| *how == kind.how && is_cause(by, *by_how))
                    .map(|(_, n)| n)
                    .sum();
                let n = s.failed(kind.how).saturating_sub(folded);
                let caused_too = n > s.own(kind.how);
                let symptoms: Vec<Symptom> = if is_cause(server, kind.how) {
                    self.servers
                        .iter()
                        .flat_map(|(front, f)| {
                            f.caused
                                .iter()
                                .filter(|((_, by, by_how), _)| by == server && *by_how == kind.how)
                                .map(|((how, _, _), &n)| Symptom {
                                    server: *front,
                                    how: *how,
                                    n,
                                    queries: f.queries,
                                })
                        })
                        .collect()
                } else {
                    Vec::new()
                };
                out.extend(kind.finding(server, (n, caused_too), s, &symptoms));
            }
        }
    }

    fn loop_findings(&self, out: &mut Vec<Finding>) {
        // One finding per cycle: each question that entered it is one loop record, whichever
        // server of the cycle it entered at (A → B and B → A are one cycle).
        let mut by_cycle: BTreeMap<Vec<String>, Vec<&LoopRecord>> = BTreeMap::new();
        for l in self.loops.values() {
            let path: Vec<String> = l
                .cycle
                .iter()
                .map(|h| {
                    let at = h
                        .pod
                        .pod
                        .clone()
                        .or_else(|| h.at.as_ref().map(|a| a.0.clone()));
                    match at {
                        Some(at) => format!("{} ({at})", peer(&h.backend)),
                        None => peer(&h.backend),
                    }
                })
                .collect();
            by_cycle.entry(from_least(path)).or_default().push(l);
        }
        for (path, loops) in by_cycle {
            let Some(first) = loops.first() else { continue };
            let packets: u64 = loops.iter().map(|l| l.packets).sum();
            let questions: Vec<String> = loops
                .iter()
                .take(EXAMPLES)
                .map(|l| format!("{} {}", l.question.name, l.question.qtype))
                .collect();
            let what = match first.kind {
                LoopKind::Cycle => "a forwarding loop",
                LoopKind::Amplification => "an amplification storm",
            };
            let mut f = Finding::new(
                FindingKind::RuntimeLoop,
                path.first().cloned().unwrap_or_default(),
                format!(
                    "{what}: {} question(s) ({}) went round {} for {packets} packets",
                    loops.len(),
                    questions.join(", "),
                    path.join(" → "),
                ),
            );
            f.count = packets;
            f.why = "A question that comes back to the server that forwarded it is forwarded again without end: the servers burn CPU, their upstream never sees it, and every client of them times out. CoreDNS's loop plugin exits on it (CrashLoopBackOff).".into();
            f.evidence = vec![format!("cycle: {}", path.join(" → "))];
            for l in loops.iter().take(EXAMPLES) {
                let c: Vec<String> = l
                    .clients
                    .iter()
                    .take(EXAMPLES)
                    .map(ToString::to_string)
                    .collect();
                f.evidence.push(format!(
                    "{} {}: {} hop{}, {} packets/s at the last count, clients {}",
                    l.question.name,
                    l.question.qtype,
                    l.hop_count,
                    if l.hop_count == 1 { "" } else { "s" },
                    l.rate_pps,
                    if c.is_empty() {
                        "-".to_owned()
                    } else {
                        c.join(", ")
                    }
                ));
                if l.loop_plugin_probe {
                    f.evidence
                        .push("the question is CoreDNS's loop plugin probe (HINFO)".into());
                }
                if let Some(e) = &l.evidence {
                    f.evidence.push(format!("packets: {e}"));
                }
            }
            f.fix = "Make the servers of the cycle forward to a real upstream: not the cluster DNS Service, not 127.0.0.53, not a resolv.conf that leads back (see the static finding for the config line).".into();
            out.push(f);
        }
    }

    fn drop_findings(&self, out: &mut Vec<Finding>) {
        let mut dropped_clients: Vec<String> = self
            .clients
            .iter()
            .filter(|(_, c)| c.dropped > 0)
            .map(|(ns, c)| match &c.pod {
                Some(p) => format!("{ns} ({p}): {} lookups", c.dropped),
                None => format!("{ns}: {} lookups", c.dropped),
            })
            .collect();
        dropped_clients.truncate(10);
        for ((netns, reason, location), d) in &self.drops {
            // The conntrack race's own drops are its finding, not a firewall's.
            let raced = d
                .keys
                .iter()
                .filter(|k| self.race_keys.contains(*k))
                .count() as u64;
            let packets = d.packets.saturating_sub(raced);
            if packets == 0 {
                continue;
            }
            let place = d.pod.clone().unwrap_or_else(|| netns.clone());
            let mut f = Finding::new(
                FindingKind::KernelDrops,
                place.clone(),
                format!(
                    "the kernel dropped {packets} DNS packets in {place} ({reason} at {location})"
                ),
            );
            f.count = packets;
            f.why = "A dropped query is a lookup that times out: a firewall or NetworkPolicy rule on port 53 (NETFILTER_DROP at nft_do_chain/nf_hook_slow is its signature) cuts those clients off DNS.".into();
            f.evidence = d.srcs.iter().map(|s| format!("dropped: {s}")).collect();
            f.evidence
                .extend(d.names.iter().map(|n| format!("question: {n}")));
            f.evidence.push(format!("network namespace: {netns}"));
            if let Some(e) = &d.evidence {
                f.evidence.push(format!("packets: {e}"));
            }
            for c in &dropped_clients {
                f.evidence.push(format!("client namespace: {c}"));
            }
            f.fix = "Allow DNS: a NetworkPolicy egress rule to kube-dns on UDP and TCP 53 for the client namespace (and ingress to CoreDNS); check `iptables-save`/`nft list ruleset` for DROP/REJECT on port 53.".into();
            out.push(f);
        }
    }
}

/// A cycle's servers from its least (by name), so that each rotation of one cycle is one key.
fn from_least(mut path: Vec<String>) -> Vec<String> {
    let least = path
        .iter()
        .enumerate()
        .min_by(|a, b| a.1.cmp(b.1))
        .map_or(0, |(i, _)| i);
    path.rotate_left(least);
    path
}

#[cfg(test)]
#[path = "traffic_tests.rs"]
mod tests;
