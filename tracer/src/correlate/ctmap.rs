//! Conntrack's view of NAT: every form a flow's packets can take on the wire, mapped back to
//! the flow's original tuple.
//!
//! For an entry with original tuple A→B and reply tuple C→D, original-direction packets look
//! like A→B before NAT and D→C after it; reply-direction packets look like C→D before un-NAT
//! and B→A after. So `10.244.1.2:41234 → 10.96.0.10:53` (before DNAT) and
//! `10.244.1.2:41234 → 10.244.1.3:53` (after) both map to the same original tuple, and so does
//! a hairpinned `169.254.1.1:PORT → POD:53` (SNAT'd) to the pod's own query.
use std::{
    collections::{HashMap, VecDeque},
    net::SocketAddr,
};

use crate::event::{ConntrackEvent, CtChange, CtFlow};

/// Where a packet seen as (src → dst) belongs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Mapped {
    /// Canonical identity of the flow: its original tuple.
    pub orig: CtFlow,
    /// The packet travels in the reply direction (server → client).
    pub reply_dir: bool,
}

type WireKey = (u8, SocketAddr, SocketAddr);

/// Bounded map of wire tuples → original flow.
pub(crate) struct CtMap {
    map: HashMap<WireKey, Mapped, super::sip::Sip>,
    order: VecDeque<WireKey>,
    max: usize,
    pub evicted: u64,
    /// Bumped by every event learnt: what `lookup` answers can change only then.
    generation: u64,
}

impl CtMap {
    pub(crate) fn new(max: usize) -> Self {
        Self {
            map: HashMap::default(),
            order: VecDeque::new(),
            max: max.max(4),
            evicted: 0,
            generation: 0,
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.map.len()
    }

    fn insert(&mut self, key: WireKey, m: Mapped) {
        if self.map.insert(key, m).is_none() {
            self.order.push_back(key);
        }
        while self.map.len() > self.max {
            match self.order.pop_front() {
                Some(old) => {
                    if self.map.remove(&old).is_some() {
                        self.evicted += 1;
                    }
                }
                None => break,
            }
        }
        // Keys removed by updates leave stale entries in `order`; keep it bounded too.
        if self.order.len() > self.max.saturating_mul(2) {
            let map = &self.map;
            self.order.retain(|k| map.contains_key(k));
        }
    }

    /// Learns (or re-learns) an entry. DESTROY is ignored on purpose: packets of a flow can
    /// still be in flight in userspace after the entry is gone; eviction bounds the map.
    pub(crate) fn learn(&mut self, ev: &ConntrackEvent) {
        self.generation += 1;
        if ev.change == CtChange::Destroy
            && self
                .map
                .contains_key(&(ev.orig.proto, ev.orig.src, ev.orig.dst))
        {
            return;
        }
        let orig = CtFlow {
            proto: ev.orig.proto,
            src: ev.orig.src,
            dst: ev.orig.dst,
        };
        let p = ev.orig.proto;
        let fwd = Mapped {
            orig,
            reply_dir: false,
        };
        let back = Mapped {
            orig,
            reply_dir: true,
        };
        self.insert((p, ev.orig.src, ev.orig.dst), fwd);
        self.insert((p, ev.reply.dst, ev.reply.src), fwd);
        self.insert((p, ev.reply.src, ev.reply.dst), back);
        self.insert((p, ev.orig.dst, ev.orig.src), back);
    }

    /// Bumped by every [`CtMap::learn`].
    pub(crate) fn generation(&self) -> u64 {
        self.generation
    }

    pub(crate) fn lookup(&self, proto: u8, src: SocketAddr, dst: SocketAddr) -> Option<Mapped> {
        self.map.get(&(proto, src, dst)).copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::CtFlow;

    fn flow(s: &str, d: &str) -> CtFlow {
        CtFlow {
            src: s.parse().unwrap(),
            dst: d.parse().unwrap(),
            proto: 17,
        }
    }

    #[test]
    fn every_wire_form_maps_to_the_original_tuple() {
        let mut m = CtMap::new(100);
        // Hairpin: pod .3 asks the ClusterIP, DNAT back to itself, SNAT to 169.254.1.1.
        m.learn(&ConntrackEvent {
            ts_ns: 0,
            netns: 1,
            change: CtChange::New,
            status: 0,
            zone: 0,
            orig: flow("10.244.1.3:4000", "10.96.0.10:53"),
            reply: flow("10.244.1.3:53", "169.254.1.1:6000"),
        });
        let a = |s: &str| s.parse::<SocketAddr>().unwrap();
        let pre = m
            .lookup(17, a("10.244.1.3:4000"), a("10.96.0.10:53"))
            .unwrap();
        let post = m
            .lookup(17, a("169.254.1.1:6000"), a("10.244.1.3:53"))
            .unwrap();
        assert_eq!(pre.orig, post.orig);
        assert!(!post.reply_dir);
        let answer = m
            .lookup(17, a("10.244.1.3:53"), a("169.254.1.1:6000"))
            .unwrap();
        assert!(answer.reply_dir);
        assert_eq!(answer.orig.src, a("10.244.1.3:4000"));
        let unnat = m
            .lookup(17, a("10.96.0.10:53"), a("10.244.1.3:4000"))
            .unwrap();
        assert!(unnat.reply_dir);
        assert!(m
            .lookup(6, a("10.244.1.3:4000"), a("10.96.0.10:53"))
            .is_none());
    }

    #[test]
    fn bounded() {
        let mut m = CtMap::new(40);
        for i in 0..1000u16 {
            m.learn(&ConntrackEvent {
                ts_ns: 0,
                netns: 1,
                change: CtChange::New,
                status: 0,
                zone: 0,
                orig: flow(&format!("10.0.0.1:{}", 1000 + i), "10.96.0.10:53"),
                reply: flow("10.244.1.3:53", &format!("10.0.0.1:{}", 1000 + i)),
            });
            assert!(m.len() <= 40);
        }
        assert!(m.evicted > 0);
    }
}
