//! The fuzz targets' entry into the pipeline (fuzz/, `cargo xtask fuzz`): not an API, hidden
//! from the docs, changed with the targets.
//!
//! [`Harness`] drives the live pipeline (decode → correlate → detect, storm shedding on)
//! with tables small enough for a fuzz input of a few hundred events to reach every bound,
//! and checks after every event what must hold whatever the input:
//! - every packet is accounted for exactly once (the decode stage's equation of
//!   [`DecodeStats::tcp_messages`](crate::decode::record::DecodeStats::tcp_messages), with
//!   the fragments held, merged or given up on), and every drop event is counted (watched
//!   or not);
//! - every table of the correlate stage is within its bound
//!   ([`Correlator::check_bounds`](crate::correlate::Correlator)), and every transaction
//!   within its legs and hops per leg;
//! - a transaction is reported once, and a leg in one transaction only (so never both
//!   answered and dropped); an answered transaction has an answered root leg, an answered
//!   leg an rcode, an unanswered or pending one neither answer nor drop.
use std::{
    collections::HashSet,
    sync::{Arc, RwLock},
};

use crate::{
    correlate::{
        record::{LegOutcome, Outcome, Summary, TransactionRecord},
        CorrelateConfig,
    },
    decode::decoder::Decoder,
    event::SourceEvent,
    kallsyms::Kallsyms,
    names::Names,
    output::record::Record,
    pipeline::{Pipeline, PipelineConfig},
    time::Clock,
};

/// The harness's bounds (the defaults are thousands of times larger).
pub const MAX_LEGS: usize = 24;
pub const MAX_CT_ENTRIES: usize = 16;
pub const MAX_HOPS_PER_LEG: usize = 6;
pub const MAX_LEGS_PER_TRANSACTION: usize = 5;
/// Small enough that a few legs of full hops reach it.
pub const MAX_LEG_BYTES: usize = 32 << 10;

/// The pipeline under test, what it was given, and what it reported.
pub struct Harness {
    pipeline: Pipeline,
    out: Vec<Record>,
    packets: u64,
    drops: u64,
    transactions: HashSet<u64>,
    legs: HashSet<u64>,
    /// Records of each kind seen (packet, drop, transaction, loop, race, fragment loss).
    pub seen: [u64; 6],
}

impl Default for Harness {
    fn default() -> Self {
        Self::new()
    }
}

impl Harness {
    pub fn new() -> Self {
        let clock = Clock::Epoch;
        // Namespaces 1 (the node's), 2 and 3 are watched, two interfaces each: drops
        // elsewhere are only counted (`drops_unwatched`), as live.
        let mut known = Names::default();
        for (cookie, ns) in [(1, "node"), (2, "pod-a"), (3, "pod-b")] {
            known.learn(cookie, ns, 1, "eth0");
            known.learn(cookie, ns, 2, "veth1");
        }
        let names = Arc::new(RwLock::new(known));
        let decoder = Decoder::new(clock, names, Kallsyms::default(), Default::default());
        let pipeline = Pipeline::with_bounds(
            decoder,
            PipelineConfig {
                transactions: true,
                timeout_ns: 5_000_000_000,
                shed_loops: true,
                node_netns: Some(1),
            },
            CorrelateConfig {
                max_legs: MAX_LEGS,
                max_leg_bytes: MAX_LEG_BYTES,
                max_ct_entries: MAX_CT_ENTRIES,
                max_hops_per_leg: MAX_HOPS_PER_LEG,
                max_legs_per_transaction: MAX_LEGS_PER_TRANSACTION,
                ..Default::default()
            },
            clock,
        );
        Self {
            pipeline,
            out: Vec::new(),
            packets: 0,
            drops: 0,
            transactions: HashSet::new(),
            legs: HashSet::new(),
            seen: [0; 6],
        }
    }

    /// One source event through the pipeline, then the checks.
    pub fn push(&mut self, ev: SourceEvent) -> Result<(), String> {
        match ev {
            SourceEvent::Packet(_) => self.packets += 1,
            SourceEvent::Drop(_) => self.drops += 1,
            _ => {}
        }
        self.pipeline.push(ev, &mut self.out);
        self.check(false)
    }

    /// Time passed (`now_ns` on the events' clock), then the checks.
    pub fn tick(&mut self, now_ns: u64) -> Result<(), String> {
        self.pipeline.tick(now_ns, &mut self.out);
        self.check(false)
    }

    /// The input ended: everything pending comes out, then the checks (no fragment held).
    pub fn finish(&mut self) -> Result<(), String> {
        self.pipeline.finish(0, &mut self.out);
        self.check(true)
    }

    fn check(&mut self, finished: bool) -> Result<(), String> {
        self.pipeline.check_bounds()?;
        let d = self.pipeline.stats().decode;
        let accounted =
            i128::from(d.decoded) + i128::from(d.capture_truncated) + i128::from(d.malformed)
                - i128::from(d.tcp_messages)
                + i128::from(d.tcp_control)
                + i128::from(d.tcp_data)
                + i128::from(d.other)
                + i128::from(d.summarised)
                + i128::from(d.fragments_merged)
                + i128::from(d.fragments_incomplete)
                + i128::from(d.fragments_pending);
        if d.packets != self.packets || accounted != i128::from(self.packets) {
            return Err(format!(
                "{} packets pushed, {} counted, {accounted} accounted for: {d:?}",
                self.packets, d.packets
            ));
        }
        if d.drops + d.drops_unwatched != self.drops {
            return Err(format!(
                "{} drops pushed, {} + {} unwatched counted",
                self.drops, d.drops, d.drops_unwatched
            ));
        }
        if finished && d.fragments_pending != 0 {
            return Err(format!("{} fragments held at the end", d.fragments_pending));
        }
        for r in std::mem::take(&mut self.out) {
            let kind = match &r {
                Record::Packet(_) => 0,
                Record::Drop(_) => 1,
                Record::Transaction(t) => {
                    self.transaction(t)?;
                    2
                }
                Record::Loop(_) => 3,
                Record::Race(_) => 4,
                Record::FragmentLoss(_) => 5,
                Record::Stats(_) => continue,
            };
            if let Some(n) = self.seen.get_mut(kind) {
                *n += 1;
            }
        }
        Ok(())
    }

    fn transaction(&mut self, t: &TransactionRecord) -> Result<(), String> {
        let id = t.id;
        if !self.transactions.insert(id) {
            return Err(format!("transaction {id} reported twice"));
        }
        if t.legs.is_empty() || t.legs.len() > MAX_LEGS_PER_TRANSACTION {
            return Err(format!("transaction {id} with {} legs", t.legs.len()));
        }
        for l in &t.legs {
            if !self.legs.insert(l.id) {
                return Err(format!("leg {} reported again in transaction {id}", l.id));
            }
            if l.hops.is_empty() || l.hops.len() > MAX_HOPS_PER_LEG {
                return Err(format!("leg {} with {} hops", l.id, l.hops.len()));
            }
            let fine = match l.outcome {
                LegOutcome::Answered | LegOutcome::Truncated => l.rcode.is_some(),
                LegOutcome::Pending | LegOutcome::Unanswered => {
                    l.rcode.is_none() && l.drop.is_none()
                }
                LegOutcome::Dropped | LegOutcome::Late => true,
            };
            if !fine {
                return Err(format!(
                    "leg {} {:?} with rcode {:?} and drop {:?}",
                    l.id, l.outcome, l.rcode, l.drop
                ));
            }
        }
        let answered_root = t.legs.iter().any(|l| {
            l.parent.is_none() && matches!(l.outcome, LegOutcome::Answered | LegOutcome::Truncated)
        });
        let fine = match (&t.outcome, &t.summary) {
            (Outcome::Answered, Summary::Answered(_)) => answered_root && t.rcode.is_some(),
            (Outcome::Dropped, Summary::Dropped { .. } | Summary::AnswerLost { .. }) => true,
            (Outcome::Late, Summary::Late { .. }) => t.rcode.is_some(),
            (Outcome::Pending, Summary::Pending) => t.rcode.is_none(),
            (Outcome::Unanswered, Summary::Unanswered { .. }) => t.rcode.is_none(),
            _ => false,
        };
        if !fine {
            return Err(format!(
                "transaction {id}: {:?} with {:?}, rcode {:?}",
                t.outcome, t.summary, t.rcode
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::{CapturedPacket, Direction, ObservationPoint};

    /// IPv4/UDP 10.0.0.1:40000 ⇄ 10.0.0.2:53, `a.` A, id 7; the response with one answer.
    fn packet(ts_ns: u64, response: bool) -> SourceEvent {
        let mut dns = vec![
            0, 7, 0x01, 0, 0, 1, 0, 0, 0, 0, 0, 0, 1, b'a', 0, 0, 1, 0, 1,
        ];
        if response {
            dns[2] = 0x81;
            dns[3] = 0x80;
            dns[7] = 1;
            dns.extend_from_slice(&[0xc0, 12, 0, 1, 0, 1, 0, 0, 0, 30, 0, 4, 10, 1, 2, 3]);
        }
        let (c, s) = ([10, 0, 0, 1], [10, 0, 0, 2]);
        let (src, dst, sport, dport) = if response {
            (s, c, 53u16, 40_000u16)
        } else {
            (c, s, 40_000, 53)
        };
        let mut v = vec![0x45, 0];
        v.extend_from_slice(&((28 + dns.len()) as u16).to_be_bytes());
        v.extend_from_slice(&[0, 0, 0x40, 0, 64, 17, 0, 0]);
        v.extend_from_slice(&src);
        v.extend_from_slice(&dst);
        v.extend_from_slice(&sport.to_be_bytes());
        v.extend_from_slice(&dport.to_be_bytes());
        v.extend_from_slice(&((8 + dns.len()) as u16).to_be_bytes());
        v.extend_from_slice(&[0, 0]);
        v.extend_from_slice(&dns);
        SourceEvent::Packet(CapturedPacket {
            ts_ns,
            cpu: Some(0),
            at: ObservationPoint {
                netns: 2,
                ifindex: 1,
                dir: Direction::Egress,
            },
            vlan: None,
            orig_len: v.len() as u32,
            data: v.into(),
        })
    }

    #[test]
    fn a_query_and_its_answer_make_one_answered_transaction_and_pass() {
        let mut h = Harness::new();
        h.push(packet(1_000_000_000, false)).unwrap();
        h.push(packet(1_001_000_000, true)).unwrap();
        h.tick(3_000_000_000).unwrap();
        h.finish().unwrap();
        assert_eq!(h.seen[2], 1, "one transaction: {:?}", h.seen);
        assert_eq!(h.seen[0], 2, "two packet records");
    }

    /// The checks fire: a packet not accounted for, and a transaction reported twice.
    #[test]
    fn the_checks_fire_on_what_must_not_happen() {
        let mut h = Harness::new();
        h.push(packet(1_000_000_000, false)).unwrap();
        h.packets += 1;
        let e = h.tick(1_100_000_000).unwrap_err();
        assert!(e.contains("2 packets pushed, 1 counted"), "{e}");

        let mut h = Harness::new();
        let mut out = Vec::new();
        h.pipeline.push(packet(1_000_000_000, false), &mut out);
        h.pipeline.push(packet(1_001_000_000, true), &mut out);
        h.pipeline.finish(0, &mut out);
        let t = out
            .iter()
            .find_map(|r| match r {
                Record::Transaction(t) => Some(t),
                _ => None,
            })
            .expect("a transaction");
        h.transaction(t).unwrap();
        let e = h.transaction(t).unwrap_err();
        assert!(e.contains("reported twice"), "{e}");
        let mut other = (**t).clone();
        other.id += 1;
        let e = h.transaction(&other).unwrap_err();
        assert!(e.contains("reported again"), "{e}");
    }
}
