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
    hash::Hash,
    net::{Ipv4Addr, SocketAddr, SocketAddrV4},
};

use crate::event::{ConntrackEvent, CtChange, CtFlow, Proto};

/// Where a packet seen as (src → dst) belongs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Mapped {
    /// Canonical identity of the flow: its original tuple.
    pub orig: CtFlow,
    /// The packet travels in the reply direction (server → client).
    pub reply_dir: bool,
}

type WireKey = (u8, SocketAddr, SocketAddr);

/// An IPv4 wire tuple, exactly, in 16 bytes: `[proto, src address, dst address, src port
/// << 16 | dst port]`. As a value (an original flow), bit 8 of the first word is set for
/// the reply direction. A `(u8, SocketAddr, SocketAddr)` takes 68 bytes and a [`Mapped`]
/// 72: at the map's cap of 262,144 wire forms a table of those takes ~92 MB (2^19 buckets
/// of 140 bytes and the order's keys; heaptrack saw 55 MB at half the cap in the soak),
/// this one 25 MiB (measured by a test).
type V4Tuple = [u32; 4];

const REPLY_DIR: u32 = 1 << 8;

fn pack_v4(proto: u8, src: SocketAddrV4, dst: SocketAddrV4) -> V4Tuple {
    [
        u32::from(proto),
        u32::from(*src.ip()),
        u32::from(*dst.ip()),
        u32::from(src.port()) << 16 | u32::from(dst.port()),
    ]
}

fn v4_pair(src: SocketAddr, dst: SocketAddr) -> Option<(SocketAddrV4, SocketAddrV4)> {
    match (src, dst) {
        (SocketAddr::V4(s), SocketAddr::V4(d)) => Some((s, d)),
        _ => None,
    }
}

fn unpack_v4(v: V4Tuple) -> Mapped {
    let [flags, src, dst, ports] = v;
    let proto = (flags & 0xff) as u8;
    let addr =
        |ip: u32, port: u32| SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::from(ip), port as u16));
    Mapped {
        orig: CtFlow {
            proto,
            src: addr(src, ports >> 16),
            dst: addr(dst, ports & 0xffff),
        },
        reply_dir: flags & REPLY_DIR != 0,
    }
}

/// Wire forms → value, evicted oldest first.
struct Table<K, V> {
    map: HashMap<K, V, super::sip::Sip>,
    /// Keys in the order they were first inserted (a key is removed only by eviction, from
    /// the front, so this is exactly the map's keys).
    order: VecDeque<K>,
}

impl<K: Copy + Eq + Hash, V> Table<K, V> {
    fn new() -> Self {
        Self {
            map: HashMap::default(),
            order: VecDeque::new(),
        }
    }

    fn insert(&mut self, key: K, v: V) {
        if self.map.insert(key, v).is_none() {
            self.order.push_back(key);
        }
    }

    /// Removes the oldest key; `false` when empty.
    fn evict_oldest(&mut self) -> bool {
        while let Some(old) = self.order.pop_front() {
            if self.map.remove(&old).is_some() {
                return true;
            }
        }
        false
    }
}

/// Bounded map of wire tuples → original flow: IPv4 flows packed ([`V4Tuple`]), others
/// (IPv6, or an entry mixing families) as they are. `max` bounds both together; beyond it
/// the larger of the two loses its oldest wire form (in a single-stack cluster, exactly
/// the oldest).
pub(crate) struct CtMap {
    v4: Table<V4Tuple, V4Tuple>,
    other: Table<WireKey, Mapped>,
    max: usize,
    pub evicted: u64,
    /// Bumped by every event learnt: what `lookup` answers can change only then.
    generation: u64,
}

impl CtMap {
    pub(crate) fn new(max: usize) -> Self {
        Self {
            v4: Table::new(),
            other: Table::new(),
            max: max.max(4),
            evicted: 0,
            generation: 0,
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.v4.map.len() + self.other.map.len()
    }

    fn enforce_max(&mut self) {
        while self.len() > self.max {
            let evicted = if self.v4.map.len() >= self.other.map.len() {
                self.v4.evict_oldest()
            } else {
                self.other.evict_oldest()
            };
            if !evicted {
                break;
            }
            self.evicted += 1;
        }
    }

    fn contains(&self, proto: u8, src: SocketAddr, dst: SocketAddr) -> bool {
        match v4_pair(src, dst) {
            Some((s, d)) => self.v4.map.contains_key(&pack_v4(proto, s, d)),
            None => self.other.map.contains_key(&(proto, src, dst)),
        }
    }

    /// Learns (or re-learns) an entry. DESTROY is ignored on purpose: packets of a flow can
    /// still be in flight in userspace after the entry is gone; eviction bounds the map.
    pub(crate) fn learn(&mut self, ev: &ConntrackEvent) {
        self.generation += 1;
        let p = ev.orig.proto;
        if ev.change == CtChange::Destroy && self.contains(p, ev.orig.src, ev.orig.dst) {
            return;
        }
        // The four wire forms: (tuple, reply direction).
        let forms = [
            ((ev.orig.src, ev.orig.dst), false),
            ((ev.reply.dst, ev.reply.src), false),
            ((ev.reply.src, ev.reply.dst), true),
            ((ev.orig.dst, ev.orig.src), true),
        ];
        let all_v4 = forms.iter().all(|&((s, d), _)| v4_pair(s, d).is_some());
        match v4_pair(ev.orig.src, ev.orig.dst).filter(|_| all_v4) {
            Some((os, od)) => {
                let orig = pack_v4(p, os, od);
                for ((s, d), reply) in forms {
                    if let Some((s, d)) = v4_pair(s, d) {
                        let mut v = orig;
                        if reply {
                            v[0] |= REPLY_DIR;
                        }
                        self.v4.insert(pack_v4(p, s, d), v);
                    }
                }
            }
            None => {
                let orig = CtFlow {
                    proto: p,
                    src: ev.orig.src,
                    dst: ev.orig.dst,
                };
                for ((s, d), reply_dir) in forms {
                    self.other.insert((p, s, d), Mapped { orig, reply_dir });
                }
            }
        }
        self.enforce_max();
    }

    /// Bumped by every [`CtMap::learn`].
    pub(crate) fn generation(&self) -> u64 {
        self.generation
    }

    pub(crate) fn lookup(&self, proto: Proto, src: SocketAddr, dst: SocketAddr) -> Option<Mapped> {
        let proto = proto.number();
        match v4_pair(src, dst) {
            Some((s, d)) => self
                .v4
                .map
                .get(&pack_v4(proto, s, d))
                .map(|&v| unpack_v4(v)),
            None => self.other.map.get(&(proto, src, dst)).copied(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::fixtures::ct_event;

    const UDP: u8 = tracer_common::proto::IPPROTO_UDP;

    #[test]
    fn every_wire_form_maps_to_the_original_tuple() {
        let mut m = CtMap::new(100);
        // Hairpin: pod .3 asks the ClusterIP, DNAT back to itself, SNAT to 169.254.1.1.
        m.learn(&ct_event(
            UDP,
            ("10.244.1.3:4000", "10.96.0.10:53"),
            ("10.244.1.3:53", "169.254.1.1:6000"),
        ));
        let a = |s: &str| s.parse::<SocketAddr>().unwrap();
        let pre = m
            .lookup(Proto::Udp, a("10.244.1.3:4000"), a("10.96.0.10:53"))
            .unwrap();
        let post = m
            .lookup(Proto::Udp, a("169.254.1.1:6000"), a("10.244.1.3:53"))
            .unwrap();
        assert_eq!(pre.orig, post.orig);
        assert!(!post.reply_dir);
        let answer = m
            .lookup(Proto::Udp, a("10.244.1.3:53"), a("169.254.1.1:6000"))
            .unwrap();
        assert!(answer.reply_dir);
        assert_eq!(answer.orig.src, a("10.244.1.3:4000"));
        let unnat = m
            .lookup(Proto::Udp, a("10.96.0.10:53"), a("10.244.1.3:4000"))
            .unwrap();
        assert!(unnat.reply_dir);
        assert!(m
            .lookup(Proto::Tcp, a("10.244.1.3:4000"), a("10.96.0.10:53"))
            .is_none());
    }

    #[test]
    fn bounded() {
        let mut m = CtMap::new(40);
        for i in 0..1000u16 {
            let client = format!("10.0.0.1:{}", 1000 + i);
            m.learn(&ct_event(
                UDP,
                (&client, "10.96.0.10:53"),
                ("10.244.1.3:53", &client),
            ));
            assert!(m.len() <= 40);
        }
        assert!(m.evicted > 0);
    }

    fn nat_event(i: u32, v6: bool) -> ConntrackEvent {
        let (client, cip, pod) = if v6 {
            (
                format!("[fd00::{:x}]:{}", i >> 16, i & 0xffff),
                "[fd00:96::a]:53".to_string(),
                "[fd00:244::3]:53".to_string(),
            )
        } else {
            (
                format!("10.{}.{}.1:{}", i >> 24, (i >> 16) & 0xff, i & 0xffff),
                "10.96.0.10:53".to_string(),
                "10.244.1.3:53".to_string(),
            )
        };
        ct_event(UDP, (&client, &cip), (&pod, &client))
    }

    #[test]
    fn ipv4_and_ipv6_entries_map_alike_and_share_the_bound() {
        let a = |s: &str| s.parse::<SocketAddr>().unwrap();
        let mut m = CtMap::new(16);
        m.learn(&nat_event(7, false));
        m.learn(&nat_event(7, true));
        assert_eq!(m.len(), 8);
        for (v6, client, cip, pod) in [
            (false, "10.0.0.1:7", "10.96.0.10:53", "10.244.1.3:53"),
            (true, "[fd00::0]:7", "[fd00:96::a]:53", "[fd00:244::3]:53"),
        ] {
            let orig = nat_event(7, v6).orig;
            let fwd = m.lookup(Proto::Udp, a(client), a(pod)).unwrap();
            assert_eq!((fwd.orig, fwd.reply_dir), (orig, false), "{client}");
            let back = m.lookup(Proto::Udp, a(pod), a(client)).unwrap();
            assert_eq!((back.orig, back.reply_dir), (orig, true));
            let unnat = m.lookup(Proto::Udp, a(cip), a(client)).unwrap();
            assert_eq!((unnat.orig, unnat.reply_dir), (orig, true));
            assert!(m.lookup(Proto::Tcp, a(client), a(cip)).is_none());
        }
        // Both families count against one bound: the larger loses its oldest first.
        for i in 8..20 {
            m.learn(&nat_event(i, false));
            assert!(m.len() <= 16);
        }
        assert!(m
            .lookup(Proto::Udp, a("10.0.0.1:7"), a("10.96.0.10:53"))
            .is_none());
        assert!(m
            .lookup(Proto::Udp, a("10.0.0.1:19"), a("10.96.0.10:53"))
            .is_some());
        assert!(m.evicted >= 8);
    }

    /// At the default cap of IPv4 wire forms the map holds 25 MiB, as [`V4Tuple`]'s doc says.
    #[test]
    fn a_full_map_of_ipv4_flows_takes_what_its_doc_says() {
        let max = crate::correlate::CorrelateConfig::default().max_ct_entries;
        let (m, bytes) = crate::memory::heap_bytes_of(|| {
            let mut m = CtMap::new(max);
            for i in 0..(max as u32 / 2) {
                m.learn(&nat_event(i, false));
            }
            m
        });
        assert_eq!(m.len(), max);
        if let Some(bytes) = bytes {
            assert!(bytes <= 28 << 20, "{bytes} bytes for {max} wire forms");
            assert!(
                bytes >= 8 << 20,
                "{bytes} bytes: the count missed the tables"
            );
        }
    }
}
