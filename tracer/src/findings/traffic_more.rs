//! More of the pipeline's records folded into findings (kept apart from [`super::traffic`]):
//! fragment loss (`fragment_loss` records: a hop that lets the first fragment of a large
//! answer through and loses the rest — an MTU mismatch), truncated answers the client never
//! retried over TCP (a leg `truncated` with no `TcpFallback` leg after it: old musl), and
//! client queries around NodeLocal DNSCache (legs labelled `bypass`). Queries per server are
//! kept for the Service findings ([`crate::doctor::services`]).
use std::{
    collections::{BTreeMap, BTreeSet},
    net::SocketAddr,
};

use super::{
    finding::{Finding, FindingKind},
    servers::PerServer,
};
use crate::{
    correlate::{
        record::{LegOutcome, NodeCache, TransactionRecord},
        LegRole,
    },
    decode::record::{DropRecord, FragmentLossRecord},
};

const EXAMPLES: usize = 3;
/// Client queries around the node cache below this are no finding (one `dig @pod` by hand).
pub const MIN_BYPASS: u64 = 3;

#[derive(Default)]
struct Agg {
    count: u64,
    examples: BTreeSet<String>,
    evidence: Option<String>,
    servers: BTreeSet<String>,
}

impl Agg {
    fn add(&mut self, example: String, server: String, evidence: Option<&String>) {
        self.count += 1;
        if self.examples.len() < EXAMPLES {
            self.examples.insert(example);
        }
        if self.servers.len() < EXAMPLES {
            self.servers.insert(server);
        }
        if self.evidence.is_none() {
            self.evidence = evidence.cloned();
        }
    }
}

/// Folds records as they come; [`MoreFolder::findings`] at the end.
#[derive(Default)]
pub struct MoreFolder {
    /// Kernel drops of fragments, by namespace.
    fragment_drops: BTreeMap<String, Agg>,
    /// By (namespace or pod, interface).
    fragments: BTreeMap<(String, String), Agg>,
    /// By client (pod or namespace).
    truncated: BTreeMap<String, Agg>,
    bypass: BTreeMap<String, Agg>,
    /// Client queries (first legs) per server: (queries, unanswered); those to servers
    /// beyond [`super::traffic::MAX_SERVERS`] are refused.
    per_server: PerServer<SocketAddr, (u64, u64)>,
}

/// A drop that belongs to a fragment loss: an IP fragment's, or one where the kernel was
/// fragmenting the datagram (it stops sending a datagram's fragments at the first that
/// fails).
pub fn is_fragment_drop(d: &DropRecord) -> bool {
    d.fragment.is_some()
        || d.location.starts_with("ip_do_fragment")
        || d.location.starts_with("ip6_fragment")
        || d.location.starts_with("ip_fragment")
}

impl MoreFolder {
    /// A dropped fragment: evidence of the fragment loss (by where it was dropped).
    pub fn fragment_drop(&mut self, d: &DropRecord) {
        let what = d
            .dns
            .as_ref()
            .and_then(|m| m.questions.first())
            .map(|q| format!("{} {}: ", q.name, q.qtype))
            .unwrap_or_default();
        let frag = d.fragment.as_ref().map_or_else(String::new, |f| {
            format!(", fragment at offset {}", f.offset)
        });
        let e = self.fragment_drops.entry(d.netns.to_string()).or_default();
        e.add(
            format!(
                "{what}{} > {} dropped by the kernel in {} ({}): {} at {}{frag}",
                d.src, d.dst, d.netns, d.ifname, d.reason, d.location
            ),
            format!("{} > {}", d.src, d.dst),
            None,
        );
    }

    pub fn fragment_loss(&mut self, r: &FragmentLossRecord) {
        let place = r
            .pod
            .as_ref()
            .and_then(|p| p.pod.clone())
            .unwrap_or_else(|| r.netns.to_string());
        let name = r
            .dns
            .as_ref()
            .and_then(|m| m.questions.first())
            .map(|q| format!("{} {}", q.name, q.qtype))
            .unwrap_or_else(|| format!("ip id {}", r.ip_id));
        let size = r
            .total_len
            .map_or_else(String::new, |n| format!(", {n} bytes"));
        self.fragments
            .entry((place, r.ifname.to_string()))
            .or_default()
            .add(
                format!("{name}: {} > {}{size}", r.src, r.dst),
                format!("{} > {}", r.src, r.dst),
                None,
            );
    }

    pub fn transaction(&mut self, t: &TransactionRecord) {
        // Named only for the few transactions that are kept (the agent folds every one).
        let who = || {
            t.pod
                .pod
                .clone()
                .unwrap_or_else(|| t.client_netns.to_string())
        };
        let q = || format!("{} {}", t.question.name, t.question.qtype);
        if let Some(first) = t.legs.first() {
            if let Some(e) = self
                .per_server
                .tally(first.server, super::traffic::MAX_SERVERS)
            {
                e.0 += 1;
                if first.outcome == LegOutcome::Unanswered {
                    e.1 += 1;
                }
            }
        }
        let retried = t.legs.iter().any(|l| l.role == LegRole::TcpFallback);
        if !retried {
            if let Some(l) = t
                .legs
                .iter()
                .find(|l| l.parent.is_none() && l.outcome == LegOutcome::Truncated)
            {
                self.truncated.entry(who()).or_default().add(
                    q(),
                    l.server.to_string(),
                    t.evidence.as_ref(),
                );
            }
        }
        for l in &t.legs {
            if l.parent.is_none() && l.node_cache == Some(NodeCache::Bypass) {
                self.bypass.entry(who()).or_default().add(
                    q(),
                    l.server.to_string(),
                    t.evidence.as_ref(),
                );
            }
        }
    }

    /// Client queries not counted per server: more than [`super::traffic::MAX_SERVERS`].
    pub fn untracked(&self) -> u64 {
        self.per_server.refused()
    }

    /// Client queries to `server` seen, and how many of them went unanswered.
    pub fn queries_to(&self, server: SocketAddr) -> (u64, u64) {
        self.per_server.get(&server).copied().unwrap_or_default()
    }

    pub fn findings(&self) -> Vec<Finding> {
        let mut out = Vec::new();
        // The losses seen (a hop that had the first fragment and not the rest), then the
        // kernel's drops of fragments: evidence of the first loss, or findings of their own
        // where no loss was seen (a firewall in the last hop).
        let mut places: Vec<(String, String, &Agg)> = self
            .fragments
            .iter()
            .map(|((place, ifname), a)| (place.clone(), ifname.clone(), a))
            .collect();
        if places.is_empty() {
            places = self
                .fragment_drops
                .iter()
                .map(|(ns, a)| (ns.clone(), String::new(), a))
                .collect();
        }
        for (i, (place, ifname, a)) in places.into_iter().enumerate() {
            let at = if ifname.is_empty() {
                place.clone()
            } else {
                format!("{place} ({ifname})")
            };
            let mut f = Finding::new(
                FindingKind::FragmentLoss,
                place.clone(),
                format!(
                    "{} fragmented DNS datagram(s) lost fragments at {at}",
                    a.count
                ),
            );
            f.count = a.count;
            f.why = "A large UDP answer (DNSSEC, many records, EDNS buffer above the path MTU) is fragmented; a hop that drops the later fragments (an overlay or tunnel with a smaller MTU, a firewall that drops fragments) leaves the client waiting: the lookup times out instead of being retried over TCP.".into();
            if self.fragments.is_empty() {
                f.evidence = a.examples.iter().cloned().collect();
            } else {
                f.evidence = a.examples.iter().map(|e| format!("lost: {e}")).collect();
                if i == 0 {
                    for d in self.fragment_drops.values() {
                        f.evidence.extend(d.examples.iter().cloned());
                    }
                }
            }
            f.fix = "Make the MTU agree along the path (pod interfaces ≤ the overlay's MTU), allow IP fragments through firewalls, and cap the EDNS buffer at 1232 bytes (CoreDNS `bufsize 1232`) so answers are truncated and retried over TCP instead of fragmented.".into();
            out.push(f);
        }
        for (who, a) in &self.truncated {
            let mut f = Finding::new(
                FindingKind::TruncatedNotRetried,
                who.clone(),
                format!(
                    "{} truncated answer(s) to {who} were never retried over TCP",
                    a.count
                ),
            );
            f.count = a.count;
            f.why = "An answer with TC set holds only part of the records; a resolver must ask again over TCP. Old musl (Alpine before 3.18) never does: large answers come back short or empty.".into();
            f.evidence = a
                .examples
                .iter()
                .map(|e| format!("truncated: {e}"))
                .collect();
            f.evidence.extend(
                a.servers
                    .iter()
                    .map(|s| format!("from {s}, no TCP query followed")),
            );
            if let Some(e) = &a.evidence {
                f.evidence.push(format!("packets: {e}"));
            }
            f.fix = "Upgrade the image's musl (Alpine ≥ 3.18 retries over TCP), or keep answers small: fewer records per name, CoreDNS `bufsize`; make sure TCP 53 is allowed by NetworkPolicies.".into();
            out.push(f);
        }
        for (who, a) in &self.bypass {
            if a.count < MIN_BYPASS {
                continue;
            }
            let servers: Vec<&str> = a.servers.iter().map(String::as_str).collect();
            let mut f = Finding::new(
                FindingKind::NodeCacheBypassed,
                who.clone(),
                format!(
                    "{} queries of {who} went around NodeLocal DNSCache, to {}",
                    a.count,
                    servers.join(", ")
                ),
            );
            f.count = a.count;
            f.why = "Queries that skip the node cache are DNAT'ed to CoreDNS through conntrack: no caching, the A/AAAA race is back, and CoreDNS carries the load the cache was deployed to take.".into();
            f.evidence = a
                .examples
                .iter()
                .map(|e| format!("bypassed: {e}"))
                .collect();
            if let Some(e) = &a.evidence {
                f.evidence.push(format!("packets: {e}"));
            }
            f.fix = "Give the pod the node cache's address as nameserver (kubelet `clusterDNS` set to the link-local address, e.g. 169.254.20.10, or the cache listening on the kube-dns ClusterIP); pods with `dnsPolicy: None` or hard-coded servers must be changed by hand.".into();
            out.push(f);
        }
        out
    }
}
