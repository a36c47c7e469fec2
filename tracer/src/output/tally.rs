//! What the run summary (`summary` record) and `dnspath top` count records by: a bounded
//! latency histogram with percentiles, who a transaction's client is, and the servers its
//! legs went to (with a forwarder's own time against its upstream's). Read from the records'
//! typed fields, never from their words.
use std::{collections::HashMap, hash::Hash, net::SocketAddr, sync::Arc};

use serde::Serialize;

use crate::{
    correlate::record::{LegOutcome, LegRecord, TransactionRecord},
    decode::dns::Rcode,
};

/// Buckets of a [`Latency`] histogram: 8 a power of two of microseconds, exact below 8 µs,
/// up to 2^35 µs (nine hours); above, the last bucket.
const BUCKETS: usize = 8 + 33 * 8;

/// Latencies in microsecond buckets of 1/8 of a power of two (a percentile is within 6.25 %
/// of the true one), at most [`BUCKETS`] counters, grown as larger values come.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Latency {
    counts: Vec<u32>,
    n: u64,
}

fn bucket(us: u64) -> usize {
    if us < 8 {
        return us as usize;
    }
    let octave = 63 - us.leading_zeros() as usize;
    let sub = ((us >> (octave - 3)) & 7) as usize;
    (8 + (octave - 3) * 8 + sub).min(BUCKETS - 1)
}

/// The middle of bucket `i`, in microseconds.
fn middle(i: usize) -> f64 {
    if i < 8 {
        return i as f64 + 0.5;
    }
    let octave = (i - 8) / 8 + 3;
    let sub = ((i - 8) % 8) as u64;
    let width = 1u64 << (octave - 3);
    ((8 + sub) * width) as f64 + width as f64 / 2.0
}

impl Latency {
    pub fn add(&mut self, ns: u64) {
        let i = bucket(ns / 1000);
        if self.counts.len() <= i {
            self.counts.resize(i + 1, 0);
        }
        self.counts[i] = self.counts[i].saturating_add(1);
        self.n += 1;
    }

    pub fn count(&self) -> u64 {
        self.n
    }

    /// The `p`-th quantile (0 < p ≤ 1) in milliseconds; `None` with no value.
    pub fn quantile_ms(&self, p: f64) -> Option<f64> {
        if self.n == 0 {
            return None;
        }
        let rank = ((p * self.n as f64).ceil() as u64).clamp(1, self.n);
        let mut seen = 0u64;
        for (i, c) in self.counts.iter().enumerate() {
            seen += u64::from(*c);
            if seen >= rank {
                return Some(middle(i).round() / 1000.0);
            }
        }
        None
    }

    /// Adds `other`'s values.
    pub fn merge(&mut self, other: &Latency) {
        if self.counts.len() < other.counts.len() {
            self.counts.resize(other.counts.len(), 0);
        }
        for (a, b) in self.counts.iter_mut().zip(&other.counts) {
            *a = a.saturating_add(*b);
        }
        self.n += other.n;
    }
}

/// p50 and p99 of a histogram, milliseconds (as the tables and the summary show them).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Percentiles {
    pub p50_ms: Option<f64>,
    pub p99_ms: Option<f64>,
}

impl From<&Latency> for Percentiles {
    fn from(l: &Latency) -> Self {
        Self {
            p50_ms: l.quantile_ms(0.5),
            p99_ms: l.quantile_ms(0.99),
        }
    }
}

/// Who asked: the client's pod (`namespace/name`) where it is known, else its network
/// namespace and address (`client-ns/10.244.1.2`).
pub fn client_of(t: &TransactionRecord) -> String {
    match &t.pod.pod {
        Some(p) => p.clone(),
        None => format!("{}/{}", t.client_netns, t.client.ip()),
    }
}

/// What a server is to the leg that reached it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ServerRole {
    /// Reached through a DNAT (a Service's ClusterIP): a CoreDNS pod.
    Service,
    /// Asked by a server that forwards (its upstream).
    Upstream,
    /// A loopback server: a node-local cache or an in-pod stub.
    Stub,
    /// Asked where the client sent its query, without NAT.
    Direct,
}

words!(ServerRole {
    Service => "service",
    Upstream => "upstream",
    Stub => "stub",
    Direct => "direct",
});

/// Where a leg's query went, from its typed fields.
pub fn role_of(leg: &LegRecord) -> ServerRole {
    if leg.backend.ip().is_loopback() {
        ServerRole::Stub
    } else if leg.parent.is_some() {
        ServerRole::Upstream
    } else if leg.server != leg.backend {
        ServerRole::Service
    } else {
        ServerRole::Direct
    }
}

/// One leg as a server's table counts it.
#[derive(Clone, Debug)]
pub struct ServedLeg {
    /// Where the query was delivered.
    pub backend: SocketAddr,
    /// The pod it was delivered to, where known (the last hop of the query there).
    pub pod: Option<String>,
    pub role: ServerRole,
    pub outcome: LegOutcome,
    pub rcode: Option<Rcode>,
    pub latency_ns: Option<u64>,
    /// A forwarder's leg answered after asking on: its time (the leg's latency less its
    /// upstream's) and its upstream's (the longest of the legs it sent).
    pub split: Option<(u64, u64)>,
}

/// The legs of `t`, each as the server it reached counts it.
pub fn served_legs(t: &TransactionRecord) -> impl Iterator<Item = ServedLeg> + '_ {
    t.legs.iter().enumerate().map(move |(i, leg)| {
        let pod = leg
            .hops
            .iter()
            .rev()
            .find(|h| !h.qr && h.dst == leg.backend)
            .and_then(|h| h.pod_ref().pod.clone());
        let upstream = t
            .legs
            .iter()
            .filter(|c| c.parent == Some(i))
            .filter_map(|c| c.latency_ns)
            .max();
        let split = match (leg.latency_ns, upstream) {
            (Some(total), Some(up)) => Some((total.saturating_sub(up), up.min(total))),
            _ => None,
        };
        ServedLeg {
            backend: leg.backend,
            pod,
            role: role_of(leg),
            outcome: leg.outcome,
            rcode: leg.rcode.clone(),
            latency_ns: leg.latency_ns,
            split,
        }
    })
}

/// A map of at most `cap` keys; a key that comes when it is full is counted in the shared
/// row `other` (and in `folded`) instead of getting its own.
#[derive(Clone, Debug)]
pub struct Capped<K, V> {
    rows: HashMap<K, V>,
    other: V,
    cap: usize,
    folded: u64,
}

impl<K: Eq + Hash, V: Default> Capped<K, V> {
    pub fn new(cap: usize) -> Self {
        Self {
            rows: HashMap::new(),
            other: V::default(),
            cap,
            folded: 0,
        }
    }

    /// The row of `key`, or `other` when the table is full (counted).
    pub fn row(&mut self, key: K) -> &mut V {
        if self.rows.len() >= self.cap && !self.rows.contains_key(&key) {
            self.folded += 1;
            return &mut self.other;
        }
        self.rows.entry(key).or_default()
    }

    /// The row of `key` when it is there, without making one.
    pub fn get_mut(&mut self, key: &K) -> Option<&mut V> {
        self.rows.get_mut(key)
    }

    pub fn rows(&self) -> impl Iterator<Item = (&K, &V)> {
        self.rows.iter()
    }

    /// Every row's counts, `other`'s too, to change.
    pub fn rows_mut(&mut self) -> impl Iterator<Item = &mut V> {
        self.rows
            .values_mut()
            .chain(std::iter::once(&mut self.other))
    }

    /// What came when the table was full: its counts, and how many times.
    pub fn other(&self) -> (&V, u64) {
        (&self.other, self.folded)
    }

    pub fn len(&self) -> usize {
        self.rows.len()
    }

    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    pub fn cap(&self) -> usize {
        self.cap
    }
}

/// Shared text of a key (`Arc<str>` keys compare by text).
pub type Key = Arc<str>;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        correlate::LegRole,
        output::record::Record,
        test_support::fixtures::{leg, service_transaction},
    };

    #[test]
    fn percentiles_are_within_a_bucket_of_the_values() {
        let mut l = Latency::default();
        assert_eq!(l.quantile_ms(0.5), None);
        for ms in 1..=100u64 {
            l.add(ms * 1_000_000);
        }
        assert_eq!(l.count(), 100);
        let p50 = l.quantile_ms(0.5).unwrap();
        let p99 = l.quantile_ms(0.99).unwrap();
        assert!((p50 - 50.0).abs() <= 50.0 * 0.0625, "{p50}");
        assert!((p99 - 99.0).abs() <= 99.0 * 0.0625, "{p99}");
        // Below 8 µs every microsecond has its bucket.
        let mut small = Latency::default();
        small.add(3_000);
        assert_eq!(small.quantile_ms(1.0), Some(0.004));
        // Hours land in the last bucket, not out of bounds.
        let mut huge = Latency::default();
        huge.add(u64::MAX);
        assert!(huge.quantile_ms(0.5).unwrap() > 1e6);
        let mut m = Latency::default();
        m.merge(&l);
        m.merge(&small);
        assert_eq!(m.count(), 101);
    }

    #[test]
    fn a_forwarders_leg_splits_its_time_with_its_upstream() {
        let Record::Transaction(t) = service_transaction("www.lab.test.", "A", 5000, "NOERROR")
        else {
            panic!("a transaction")
        };
        let legs: Vec<_> = served_legs(&t).collect();
        assert_eq!(legs.len(), 2);
        assert_eq!(legs[0].role, ServerRole::Service);
        assert_eq!(legs[0].backend.to_string(), "10.244.1.3:53");
        assert_eq!(legs[0].split, Some((630_000 - 273_000, 273_000)));
        assert_eq!(legs[1].role, ServerRole::Upstream);
        assert_eq!(legs[1].split, None);
        let stub = leg(
            LegRole::Query,
            "127.0.0.1:1",
            "127.0.0.53:53",
            "127.0.0.53:53",
            None,
            None,
        );
        assert_eq!(role_of(&stub), ServerRole::Stub);
        assert_eq!(client_of(&t), "client/10.244.1.2");
    }

    #[test]
    fn a_full_table_folds_new_keys_into_other() {
        let mut c: Capped<u32, u64> = Capped::new(2);
        *c.row(1) += 1;
        *c.row(2) += 1;
        *c.row(3) += 5;
        *c.row(1) += 1;
        assert_eq!(c.len(), 2);
        assert_eq!(c.other(), (&5, 1));
        assert_eq!(c.rows().map(|(_, v)| *v).sum::<u64>(), 3);
    }
}
