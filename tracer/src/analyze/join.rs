//! `analyze` of several nodes' captures: a query that crossed nodes, decided by each node's
//! own correlator as two halves — the client's question on its node, the query served on
//! another — joined into one transaction by the key its OTLP trace id is made from
//! (`output::otlp::ids`: client address and port, transport, DNS id, question), as a
//! tracing backend joins the spans of both nodes into one trace.
//!
//! A served half joins the client half of another node with the same query key whose
//! lifetime it falls in, give or take [`ids::EPOCH_GUARD_NS`] (the tolerance the spans'
//! neighbouring-epoch link has for clocks and network time). Its legs are appended to the
//! client half's, each naming its node; its first leg's parent is the client's leg that sent
//! that query (same socket, transport and DNS id). A query key reused by a query outside that
//! window stays a transaction of its own.
use std::collections::{BTreeMap, HashMap};

use crate::output::{
    otlp::{
        ids::{self, IdKey},
        spans::{client_is_local, trace_ids},
    },
    record::TransactionRecord,
};

/// At most this many transactions wait for their other half; beyond, the oldest is written
/// as it is (counted in [`NodeJoin::written_early`]).
pub(super) const MAX_HELD: usize = 65_536;

struct Held {
    node: usize,
    tx: TransactionRecord,
    query_key: [u8; 16],
    /// The client's half (its question was asked on this node).
    local: bool,
    /// Wall-clock span of what this node saw of it.
    start: u64,
    end: u64,
    /// When it is written, in capture time.
    until: u64,
}

/// The join stage: transactions of several nodes in, transactions out, each joined with its
/// other halves where there are any. Per transaction O(transactions with its query key).
pub(super) struct NodeJoin {
    key: IdKey,
    nodes: Vec<std::sync::Arc<str>>,
    hold_ns: u64,
    next: u64,
    held: BTreeMap<u64, Held>,
    by_key: HashMap<[u8; 16], Vec<u64>>,
    /// Transactions that joined another (served halves appended to a client half).
    pub(super) joined: u64,
    /// Written before their hold ended, for [`MAX_HELD`].
    pub(super) written_early: u64,
}

/// The wall-clock time of the last thing seen of a transaction.
fn end_of(tx: &TransactionRecord) -> u64 {
    let last = tx
        .legs
        .iter()
        .flat_map(|l| l.hops.iter().map(|h| h.ts_ns))
        .max()
        .unwrap_or(tx.ts_ns);
    tx.wall_ns
        .saturating_add(last.saturating_sub(tx.ts_ns))
        .max(tx.wall_ns)
}

impl NodeJoin {
    /// `nodes`: the nodes' names, by index; `hold_ns`: how long a transaction waits (in
    /// capture time, after it was decided) for the other halves to be decided.
    pub(super) fn new(key: IdKey, nodes: Vec<std::sync::Arc<str>>, hold_ns: u64) -> Self {
        Self {
            key,
            nodes,
            hold_ns,
            next: 0,
            held: BTreeMap::new(),
            by_key: HashMap::new(),
            joined: 0,
            written_early: 0,
        }
    }

    /// A transaction node `node`'s correlator decided at capture time `now`.
    pub(super) fn push(
        &mut self,
        node: usize,
        mut tx: TransactionRecord,
        now: u64,
        out: &mut Vec<(usize, TransactionRecord)>,
    ) {
        let name = self.nodes.get(node).cloned();
        for l in &mut tx.legs {
            l.node = name.clone();
        }
        tx.nodes = name.into_iter().collect();
        let query_key = trace_ids(&self.key, &tx).query_key;
        let mut h = Held {
            node,
            local: client_is_local(&tx),
            start: tx.wall_ns,
            end: end_of(&tx),
            until: now.saturating_add(self.hold_ns),
            tx,
            query_key,
        };
        let candidates: Vec<u64> = self.by_key.get(&query_key).cloned().unwrap_or_default();
        if h.local {
            // Served halves already decided join it now.
            for seq in candidates {
                let fits = self
                    .held
                    .get(&seq)
                    .is_some_and(|s| !s.local && s.node != h.node && within(&h, s.start));
                if fits {
                    if let Some(s) = self.remove(seq) {
                        merge(&mut h.tx, s.tx);
                        h.end = h.end.max(s.end);
                        self.joined += 1;
                    }
                }
            }
        } else {
            // A client half already decided: this half joins it.
            let client = candidates
                .into_iter()
                .filter(|seq| {
                    self.held
                        .get(seq)
                        .is_some_and(|c| c.local && c.node != h.node && within(c, h.start))
                })
                .min_by_key(|seq| {
                    self.held
                        .get(seq)
                        .map_or(u64::MAX, |c| c.start.abs_diff(h.start))
                });
            if let Some(c) = client.and_then(|seq| self.held.get_mut(&seq)) {
                c.end = c.end.max(h.end);
                merge(&mut c.tx, h.tx);
                self.joined += 1;
                return;
            }
        }
        let seq = self.next;
        self.next += 1;
        self.by_key.entry(query_key).or_default().push(seq);
        self.held.insert(seq, h);
        while self.held.len() > MAX_HELD {
            let Some((&oldest, _)) = self.held.first_key_value() else {
                break;
            };
            if let Some(o) = self.remove(oldest) {
                self.written_early += 1;
                out.push((o.node, o.tx));
            }
        }
    }

    /// Transactions whose hold is over at capture time `now` (`None`: every one, the
    /// input ended), oldest first, with the node each is written as (its client's).
    pub(super) fn ready(&mut self, now: Option<u64>, out: &mut Vec<(usize, TransactionRecord)>) {
        // Held in the order they came, each for the same time: the due ones are first.
        while let Some((&seq, h)) = self.held.first_key_value() {
            if now.is_some_and(|n| h.until > n) {
                break;
            }
            if let Some(h) = self.remove(seq) {
                out.push((h.node, h.tx));
            }
        }
    }

    fn remove(&mut self, seq: u64) -> Option<Held> {
        let h = self.held.remove(&seq)?;
        if let Some(v) = self.by_key.get_mut(&h.query_key) {
            v.retain(|&s| s != seq);
            if v.is_empty() {
                self.by_key.remove(&h.query_key);
            }
        }
        Some(h)
    }
}

/// Whether a half seen first at `start` falls in the client half `c`'s lifetime, give or
/// take [`ids::EPOCH_GUARD_NS`].
fn within(c: &Held, start: u64) -> bool {
    start.saturating_add(ids::EPOCH_GUARD_NS) >= c.start
        && start <= c.end.saturating_add(ids::EPOCH_GUARD_NS)
}

/// Appends the served half `s`'s legs to the client half `c`: `s`'s own legs keep their
/// tree, its first legs hang under the client's leg that sent the query.
fn merge(c: &mut TransactionRecord, s: TransactionRecord) {
    let base = c.legs.len();
    let sender = |l: &crate::output::record::LegRecord| {
        c.legs
            .iter()
            .position(|k| k.client == l.client && k.proto == l.proto && k.dns_id == l.dns_id)
    };
    let roots: Vec<Option<usize>> = s
        .legs
        .iter()
        .map(|l| if l.parent.is_none() { sender(l) } else { None })
        .collect();
    for (j, mut l) in s.legs.into_iter().enumerate() {
        l.parent = match l.parent {
            Some(p) => Some(base + p),
            None => roots.get(j).copied().flatten(),
        };
        if let Some(lp) = l.closes_loop.as_mut() {
            for k in &mut lp.cycle {
                *k += base;
            }
        }
        c.legs.push(l);
    }
    for n in s.nodes {
        if !c.nodes.contains(&n) {
            c.nodes.push(n);
        }
    }
}

#[cfg(test)]
#[path = "join_tests.rs"]
mod tests;
