//! The correlate and otlp targets' input: arbitrary sequences of DNS packets (UDP and TCP,
//! at several points, out of order), kernel drops with and without their conntrack entry,
//! conntrack events (DNAT to a few backends), conntrack statistics and the passing of time,
//! run through `dnspath::fuzzing::Harness` (the live pipeline with small tables).
//!
//! The inputs are structured (`arbitrary`): addresses, ports, ids and names come from small
//! sets so that queries meet their answers, forwarders their clients, retries their first
//! attempts and search-list steps their lookups.
use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use arbitrary::Arbitrary;
use bytes::Bytes;
use dnspath::{
    event::{
        CapturedPacket, ConntrackEvent, CtChange, CtCpuStats, CtFlow, CtSnapshot, CtStatsSample,
        Direction, KernelDrop, ObservationPoint, Proto, SourceEvent,
    },
    fuzzing::Harness,
};

/// Clients, the cluster DNS Service, its backends, the node cache, an upstream.
const ADDRS: [[u8; 4]; 8] = [
    [10, 244, 1, 2],
    [10, 244, 1, 3],
    [10, 96, 0, 10],
    [10, 244, 0, 5],
    [10, 244, 0, 6],
    [169, 254, 20, 10],
    [8, 8, 8, 8],
    [127, 0, 0, 53],
];
/// A search list's steps, and others.
const NAMES: [&str; 8] = [
    "web",
    "web.default.svc.cluster.local",
    "web.svc.cluster.local",
    "web.cluster.local",
    "example.com",
    "www.example.com",
    "kubernetes.default.svc.cluster.local",
    "a.b.c.d.e.f.g.h.i.j.k.l.m.n.o.p.q.r.s.t.u.v.w.x.y.z.example.org",
];

#[derive(Arbitrary, Debug, Clone, Copy)]
struct Msg {
    client: u8,
    server: u8,
    port: u8,
    id: u8,
    name: u8,
    aaaa: bool,
    response: bool,
    rcode: u8,
    answers: u8,
    tc: bool,
    tcp: bool,
    seq: u8,
}

#[derive(Arbitrary, Debug)]
pub enum Step {
    /// A message seen at a point; `dt`: 100 µs units since the last event (`back`: seen
    /// that much before it, out of order).
    Packet {
        msg: Msg,
        at: u8,
        dt: u16,
        back: bool,
        /// The capture cut it to this many bytes (0: whole).
        cut: u8,
    },
    Drop {
        msg: Msg,
        at: u8,
        reason: u8,
        /// With its conntrack entry: the backend it was DNATed to.
        ct: Option<u8>,
        dt: u16,
    },
    Conntrack {
        msg: Msg,
        backend: u8,
        change: u8,
        dt: u16,
    },
    Stats {
        netns: u8,
        insert_failed: u8,
        drop: u8,
        dt: u16,
    },
    /// Any bytes as a packet.
    Raw {
        data: Vec<u8>,
        at: u8,
    },
    Tick {
        dt: u32,
    },
}

fn addr(i: u8, port: u16) -> SocketAddr {
    let a = ADDRS[usize::from(i) % ADDRS.len()];
    SocketAddr::new(IpAddr::V4(Ipv4Addr::from(a)), port)
}

fn client_port(m: &Msg) -> u16 {
    40_000 + u16::from(m.port % 4)
}

/// (source, destination) of the message.
fn ends(m: &Msg) -> (SocketAddr, SocketAddr) {
    let c = addr(m.client, client_port(m));
    let s = addr(m.server, 53);
    if m.response {
        (s, c)
    } else {
        (c, s)
    }
}

fn dns(m: &Msg) -> Vec<u8> {
    let mut v = Vec::with_capacity(128);
    v.extend_from_slice(&u16::from(m.id % 8).to_be_bytes());
    let mut flags: u16 = 0x0100; // RD
    if m.response {
        flags |= 0x8080 | u16::from(m.rcode % 6);
        if m.tc {
            flags |= 0x0200;
        }
    }
    v.extend_from_slice(&flags.to_be_bytes());
    let answers = if m.response { m.answers % 4 } else { 0 };
    for n in [1, u16::from(answers), 0, 0] {
        v.extend_from_slice(&n.to_be_bytes());
    }
    for label in NAMES[usize::from(m.name) % NAMES.len()].split('.') {
        v.push(label.len() as u8);
        v.extend_from_slice(label.as_bytes());
    }
    v.push(0);
    let qtype: u16 = if m.aaaa { 28 } else { 1 };
    v.extend_from_slice(&qtype.to_be_bytes());
    v.extend_from_slice(&1u16.to_be_bytes());
    for i in 0..answers {
        v.extend_from_slice(&[0xc0, 12]);
        v.extend_from_slice(&qtype.to_be_bytes());
        v.extend_from_slice(&1u16.to_be_bytes());
        v.extend_from_slice(&30u32.to_be_bytes());
        if m.aaaa {
            v.extend_from_slice(&16u16.to_be_bytes());
            v.extend_from_slice(&[0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, i]);
        } else {
            v.extend_from_slice(&4u16.to_be_bytes());
            v.extend_from_slice(&[10, 1, 2, i]);
        }
    }
    v
}

/// The message in IPv4 and UDP or TCP (length-prefixed, at a sequence number of the input).
fn packet(m: &Msg) -> Vec<u8> {
    let (src, dst) = ends(m);
    let (IpAddr::V4(s), IpAddr::V4(d)) = (src.ip(), dst.ip()) else {
        return Vec::new();
    };
    let payload = dns(m);
    let mut l4 = Vec::with_capacity(payload.len() + 22);
    l4.extend_from_slice(&src.port().to_be_bytes());
    l4.extend_from_slice(&dst.port().to_be_bytes());
    if m.tcp {
        l4.extend_from_slice(&(u32::from(m.seq) * 64).to_be_bytes());
        l4.extend_from_slice(&1u32.to_be_bytes());
        l4.extend_from_slice(&[0x50, 0x18, 0xff, 0xff, 0, 0, 0, 0]);
        l4.extend_from_slice(&(payload.len() as u16).to_be_bytes());
    } else {
        l4.extend_from_slice(&((payload.len() + 8) as u16).to_be_bytes());
        l4.extend_from_slice(&[0, 0]);
    }
    l4.extend_from_slice(&payload);
    let total = (20 + l4.len()) as u16;
    let mut v = vec![0x45, 0];
    v.extend_from_slice(&total.to_be_bytes());
    v.extend_from_slice(&[0, 0, 0x40, 0, 64, if m.tcp { 6 } else { 17 }, 0, 0]);
    v.extend_from_slice(&s.octets());
    v.extend_from_slice(&d.octets());
    v.extend_from_slice(&l4);
    v
}

/// Three namespaces (1: the node's), two interfaces each, both directions.
fn point(at: u8) -> ObservationPoint {
    ObservationPoint {
        netns: u64::from(at % 3 + 1),
        ifindex: u32::from(at / 3 % 2 + 1),
        dir: if at & 0x80 != 0 {
            Direction::Egress
        } else {
            Direction::Ingress
        },
    }
}

/// The query's conntrack entry: client → server, DNATed to `backend`.
fn entry(m: &Msg, backend: u8) -> (CtFlow, CtFlow) {
    let proto = if m.tcp { Proto::Tcp } else { Proto::Udp }.number();
    let c = addr(m.client, client_port(m));
    let s = addr(m.server, 53);
    let b = addr(backend, 53);
    (
        CtFlow {
            src: c,
            dst: s,
            proto,
        },
        CtFlow {
            src: b,
            dst: c,
            proto,
        },
    )
}

/// The steps through `h`, its checks after each (a panic on the first that fails).
pub fn run(mut h: Harness, steps: Vec<Step>) -> Harness {
    let mut now: u64 = 1_000_000_000;
    for step in steps.into_iter().take(512) {
        let ev = match step {
            Step::Packet {
                msg,
                at,
                dt,
                back,
                cut,
            } => {
                let d = u64::from(dt) * 100_000;
                let ts = if back {
                    now.saturating_sub(d)
                } else {
                    now += d;
                    now
                };
                let bytes = packet(&msg);
                let orig_len = bytes.len() as u32;
                let keep = if cut == 0 {
                    bytes.len()
                } else {
                    usize::from(cut).min(bytes.len())
                };
                SourceEvent::Packet(CapturedPacket {
                    ts_ns: ts,
                    cpu: Some(u32::from(at % 2)),
                    at: point(at),
                    vlan: None,
                    orig_len,
                    data: Bytes::from(bytes).slice(..keep),
                })
            }
            Step::Drop {
                msg,
                at,
                reason,
                ct,
                dt,
            } => {
                now += u64::from(dt) * 100_000;
                let bytes = packet(&msg);
                let p = point(at);
                SourceEvent::Drop(KernelDrop {
                    ts_ns: now,
                    cpu: 0,
                    netns: p.netns,
                    ifindex: p.ifindex,
                    // Kernel drop reasons: not specified, socket filter, no socket,
                    // netfilter, and others.
                    reason: [2, 3, 4, 6, 8, 12, 77][usize::from(reason) % 7],
                    location: 0xffff_ffff_8100_0000 + u64::from(reason),
                    ct: ct.map(|b| {
                        let (orig, reply) = entry(&msg, b);
                        CtSnapshot {
                            status: 0x8 | 0x20,
                            orig,
                            reply,
                        }
                    }),
                    orig_len: bytes.len() as u32,
                    data: Bytes::from(bytes),
                    confirm_failed: reason & 0x80 != 0,
                    named: None,
                })
            }
            Step::Conntrack {
                msg,
                backend,
                change,
                dt,
            } => {
                now += u64::from(dt) * 100_000;
                let (orig, reply) = entry(&msg, backend);
                SourceEvent::Conntrack(ConntrackEvent {
                    ts_ns: now,
                    netns: 1,
                    change: match change % 4 {
                        0 => CtChange::New,
                        1 => CtChange::Update,
                        2 => CtChange::Destroy,
                        _ => CtChange::Existing,
                    },
                    status: 0x8 | 0x20,
                    zone: 0,
                    orig,
                    reply,
                })
            }
            Step::Stats {
                netns,
                insert_failed,
                drop,
                dt,
            } => {
                now += u64::from(dt) * 100_000;
                SourceEvent::CtStats(CtStatsSample {
                    ts_ns: now,
                    netns: u64::from(netns % 3 + 1),
                    per_cpu: vec![CtCpuStats {
                        cpu: 0,
                        insert_failed: u64::from(insert_failed),
                        drop: u64::from(drop),
                        ..Default::default()
                    }],
                })
            }
            Step::Raw { data, at } => SourceEvent::Packet(CapturedPacket {
                ts_ns: now,
                cpu: None,
                at: point(at),
                vlan: None,
                orig_len: data.len() as u32,
                data: Bytes::from(data),
            }),
            Step::Tick { dt } => {
                now += u64::from(dt) * 1_000;
                if let Err(e) = h.tick(now) {
                    panic!("after a tick to {now}: {e}");
                }
                continue;
            }
        };
        if let Err(e) = h.push(ev) {
            panic!("{e}");
        }
    }
    if let Err(e) = h.finish() {
        panic!("at the end: {e}");
    }
    h
}
