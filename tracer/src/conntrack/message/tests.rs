use super::*;
use std::net::{Ipv4Addr, Ipv6Addr};

/// Appends a netlink attribute (header, value, padding to 4 bytes).
fn nla(out: &mut Vec<u8>, kind: u16, value: &[u8]) {
    out.extend_from_slice(&((4 + value.len()) as u16).to_ne_bytes());
    out.extend_from_slice(&kind.to_ne_bytes());
    out.extend_from_slice(value);
    while !out.len().is_multiple_of(4) {
        out.push(0);
    }
}

/// A nested attribute with NLA_F_NESTED set, as the kernel's nla_nest_start does.
fn nest(out: &mut Vec<u8>, kind: u16, inner: impl FnOnce(&mut Vec<u8>)) {
    let mut v = Vec::new();
    inner(&mut v);
    nla(out, kind | 0x8000, &v);
}

fn tuple(out: &mut Vec<u8>, kind: u16, src: IpAddr, dst: IpAddr, proto: u8, sp: u16, dp: u16) {
    nest(out, kind, |t| {
        nest(t, 1, |ip| match (src, dst) {
            (IpAddr::V4(s), IpAddr::V4(d)) => {
                nla(ip, 1, &s.octets());
                nla(ip, 2, &d.octets());
            }
            (IpAddr::V6(s), IpAddr::V6(d)) => {
                nla(ip, 3, &s.octets());
                nla(ip, 4, &d.octets());
            }
            _ => unreachable!(),
        });
        nest(t, 2, |p| {
            nla(p, 1, &[proto]);
            nla(p, 2, &sp.to_be_bytes());
            nla(p, 3, &dp.to_be_bytes());
        });
        // CTA_TUPLE_ZONE, as the kernel adds for a non-default directional zone.
        nla(t, 3, &7u16.to_be_bytes());
    });
}

/// nlmsghdr + nfgenmsg + attributes.
fn message(msg_type: u16, flags: u16, family: u8, res_id: u16, attrs: &[u8]) -> Vec<u8> {
    let mut m = Vec::new();
    m.extend_from_slice(&((16 + 4 + attrs.len()) as u32).to_ne_bytes());
    m.extend_from_slice(&msg_type.to_ne_bytes());
    m.extend_from_slice(&flags.to_ne_bytes());
    m.extend_from_slice(&0u32.to_ne_bytes());
    m.extend_from_slice(&0u32.to_ne_bytes());
    m.extend_from_slice(&[family, 0]);
    m.extend_from_slice(&res_id.to_be_bytes());
    m.extend_from_slice(attrs);
    m
}

const CLIENT: Ipv4Addr = Ipv4Addr::new(10, 244, 1, 2);
const CLUSTER_IP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 10);
const POD: Ipv4Addr = Ipv4Addr::new(10, 244, 1, 3);

/// A DNAT'd UDP DNS flow, as ctnetlink_conntrack_event sends for a new entry.
fn new_event_v4() -> Vec<u8> {
    let mut a = Vec::new();
    tuple(&mut a, 1, CLIENT.into(), CLUSTER_IP.into(), 17, 40005, 53);
    tuple(&mut a, 2, POD.into(), CLIENT.into(), 17, 53, 40005);
    nla(&mut a, 3, &0x1a8u32.to_be_bytes()); // CONFIRMED|SRC_NAT_DONE|DST_NAT_DONE|DST_NAT
    nla(&mut a, 7, &30u32.to_be_bytes()); // CTA_TIMEOUT
    nla(&mut a, 8, &0u32.to_be_bytes()); // CTA_MARK
    nla(&mut a, 12, &0x1234_5678u32.to_be_bytes()); // CTA_ID
    nla(&mut a, 18, &5u16.to_be_bytes()); // CTA_ZONE
    nla(&mut a, 9, &[0, 0, 0, 3]); // CTA_USE
    message(0x0100, NLM_F_CREATE | NLM_F_EXCL, 2, 0, &a)
}

fn v6(s: &str) -> Ipv6Addr {
    s.parse().unwrap()
}

fn new_event_v6(flags: u16, msg_type: u16) -> Vec<u8> {
    let mut a = Vec::new();
    tuple(
        &mut a,
        1,
        v6("fd00:244::2").into(),
        v6("fd00:96::a").into(),
        6,
        41000,
        53,
    );
    tuple(
        &mut a,
        2,
        v6("fd00:244::4").into(),
        v6("fd00:244::2").into(),
        6,
        53,
        41000,
    );
    nla(&mut a, 3, &0x18eu32.to_be_bytes());
    nest(&mut a, 4, |p| nest(p, 1, |tcp| nla(tcp, 1, &[3]))); // CTA_PROTOINFO_TCP state
    message(msg_type, flags, 10, 0, &a)
}

fn one(buf: &[u8]) -> CtMessage {
    let mut v = decode_datagram(buf);
    assert_eq!(v.len(), 1, "{v:?}");
    v.remove(0).unwrap().1
}

#[test]
fn new_event_with_dnat_tuples_status_and_zone() {
    let CtMessage::Entry { change, entry } = one(&new_event_v4()) else {
        panic!("not an entry");
    };
    assert_eq!(change, CtChange::New);
    assert_eq!(entry.status, 0x1a8);
    assert_eq!(entry.zone, 5);
    assert_eq!(entry.orig.src, SocketAddr::new(CLIENT.into(), 40005));
    assert_eq!(entry.orig.dst, SocketAddr::new(CLUSTER_IP.into(), 53));
    assert_eq!(entry.reply.src, SocketAddr::new(POD.into(), 53));
    assert_eq!(entry.reply.dst, SocketAddr::new(CLIENT.into(), 40005));
    assert_eq!(entry.orig.proto, 17);
}

#[test]
fn ipv6_update_destroy_and_dump_entries() {
    for (flags, ty, want) in [
        (0, 0x0100, CtChange::Update),
        (0, 0x0102, CtChange::Destroy),
        (NLM_F_MULTIPART, 0x0100, CtChange::Existing),
        (NLM_F_CREATE | NLM_F_EXCL, 0x0100, CtChange::New),
    ] {
        let CtMessage::Entry { change, entry } = one(&new_event_v6(flags, ty)) else {
            panic!("not an entry");
        };
        assert_eq!(change, want);
        assert_eq!(entry.orig.proto, 6);
        assert_eq!(entry.orig.src, "[fd00:244::2]:41000".parse().unwrap());
        assert_eq!(entry.orig.dst, "[fd00:96::a]:53".parse().unwrap());
        assert_eq!(entry.reply.src, "[fd00:244::4]:53".parse().unwrap());
        assert_eq!(entry.zone, 0);
        assert_eq!(entry.status, 0x18e);
    }
}

#[test]
fn several_messages_in_one_datagram_and_done() {
    let mut d = new_event_v4();
    d.extend(new_event_v6(NLM_F_MULTIPART, 0x0100));
    // NLMSG_DONE with its 4-byte error field.
    let mut done = Vec::new();
    done.extend_from_slice(&20u32.to_ne_bytes());
    done.extend_from_slice(&3u16.to_ne_bytes());
    done.extend_from_slice(&NLM_F_MULTIPART.to_ne_bytes());
    done.extend_from_slice(&[0; 12]);
    d.extend(done);
    let v: Vec<CtMessage> = decode_datagram(&d)
        .into_iter()
        .map(|r| r.unwrap().1)
        .collect();
    assert_eq!(v.len(), 3);
    assert!(matches!(
        v[0],
        CtMessage::Entry {
            change: CtChange::New,
            ..
        }
    ));
    assert!(matches!(
        v[1],
        CtMessage::Entry {
            change: CtChange::Existing,
            ..
        }
    ));
    assert_eq!(v[2], CtMessage::Done);
}

#[test]
fn icmp_entry_is_other_protocol() {
    let mut a = Vec::new();
    nest(&mut a, 1, |t| {
        nest(t, 1, |ip| {
            nla(ip, 1, &CLIENT.octets());
            nla(ip, 2, &POD.octets());
        });
        nest(t, 2, |p| {
            nla(p, 1, &[1]);
            nla(p, 4, &7u16.to_be_bytes()); // CTA_PROTO_ICMP_ID
            nla(p, 5, &[8]);
            nla(p, 6, &[0]);
        });
    });
    assert_eq!(one(&message(0x0100, 0, 2, 0, &a)), CtMessage::OtherProtocol);
}

/// IPCTNL_MSG_CT_GET_STATS_CPU reply for CPU 1 (ctnetlink_ct_stat_cpu_fill_info).
fn stats_reply() -> Vec<u8> {
    let mut a = Vec::new();
    for (kind, v) in [
        (2u16, 11u32),
        (4, 12),
        (5, 99), // CTA_STATS_IGNORE: no longer used
        (8, 13),
        (9, 14),
        (10, 15),
        (11, 16),
        (12, 17),
        (13, 18),
        (14, 19),
        (15, 20),
    ] {
        nla(&mut a, kind, &v.to_be_bytes());
    }
    message(0x0104, NLM_F_MULTIPART, 0, 1, &a)
}

#[test]
fn stats_cpu_reply() {
    let CtMessage::Stats(s) = one(&stats_reply()) else {
        panic!("not stats");
    };
    assert_eq!(
        s,
        CtCpuStats {
            cpu: 1,
            found: 11,
            invalid: 12,
            insert: 13,
            insert_failed: 14,
            drop: 15,
            early_drop: 16,
            error: 17,
            search_restart: 18,
            clash_resolve: 19,
            chain_toolong: 20,
        }
    );
}

#[test]
fn error_reply() {
    let mut m = Vec::new();
    m.extend_from_slice(&36u32.to_ne_bytes());
    m.extend_from_slice(&2u16.to_ne_bytes());
    m.extend_from_slice(&0u16.to_ne_bytes());
    m.extend_from_slice(&[0; 8]);
    m.extend_from_slice(&(-libc::EPERM).to_ne_bytes());
    m.extend_from_slice(&[0; 16]); // the request's header
    assert_eq!(one(&m), CtMessage::Error(libc::EPERM));
}

#[test]
fn requests_are_well_formed() {
    let r = stats_dump_request(9);
    assert_eq!(r.len(), 20);
    assert_eq!(u16::from_ne_bytes([r[4], r[5]]), 0x0104);
    assert_eq!(u16::from_ne_bytes([r[6], r[7]]), NLM_F_REQUEST | NLM_F_DUMP);
    assert_eq!(u32::from_ne_bytes([r[8], r[9], r[10], r[11]]), 9);
    let t = table_dump_request(1);
    assert_eq!(u16::from_ne_bytes([t[4], t[5]]), 0x0101);
}

#[test]
fn malformed_attributes_are_errors() {
    // A stats value of 2 bytes.
    let mut a = Vec::new();
    nla(&mut a, 8, &[0, 1]);
    assert!(decode_datagram(&message(0x0104, 0, 0, 0, &a))[0].is_err());
    // CTA_ZONE of 4 bytes.
    let mut e = new_event_v4();
    let mut z = Vec::new();
    nla(&mut z, 18, &[0, 0, 0, 1]);
    e.extend_from_slice(&z);
    let len = e.len() as u32;
    e[..4].copy_from_slice(&len.to_ne_bytes());
    assert!(decode_datagram(&e)[0].is_err());
    // A UDP tuple without ports.
    let mut a = Vec::new();
    for kind in [1, 2] {
        nest(&mut a, kind, |t| {
            nest(t, 1, |ip| {
                nla(ip, 1, &CLIENT.octets());
                nla(ip, 2, &POD.octets());
            });
            nest(t, 2, |p| nla(p, 1, &[17]));
        });
    }
    assert!(decode_datagram(&message(0x0100, 0, 2, 0, &a))[0].is_err());
    // An address of 5 bytes.
    let mut a = Vec::new();
    nest(&mut a, 1, |t| nest(t, 1, |ip| nla(ip, 1, &[1, 2, 3, 4, 5])));
    assert!(decode_datagram(&message(0x0100, 0, 2, 0, &a))[0].is_err());
    // An attribute whose length runs past the message.
    let mut m = new_event_v4();
    m[20] = 0xff;
    assert!(decode_datagram(&m)[0].is_err());
    // A message shorter than its header says, and one shorter than a header.
    let m = new_event_v4();
    assert!(decode_datagram(&m[..m.len() - 1])[0].is_err());
    assert!(decode_datagram(&m[..10])[0].is_err());
}

fn hex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

/// Captured from Linux 6.18 (NFNLGRP_CONNTRACK_NEW): UDP 10.244.1.2:40005 →
/// 10.96.0.10:53 DNAT'd (nat OUTPUT) to 127.0.0.1:53, in conntrack zone 5 (raw `CT --zone 5`).
const CAPTURED_NEW_V4: &str = "9c000000000100060000000000000000020000003400018014000180080001000af40102080002000a60000a1c0002800500010011000000060002009c45000006000300003500003400028014000180080001007f000001080002000af401021c00028005000100110000000600020000350000060003009c450000060012000005000008000c0043de5baf08000300000001a8080007000000001e";
/// The same for IPv6: [fd00:244::2]:40006 → [fd00:96::a]:53 DNAT'd to [::1]:53, zone 0.
const CAPTURED_NEW_V6: &str = "c40000000001000600000000000000000a0000004c0001802c00018014000300fd00024400000000000000000000000214000400fd00009600000000000000000000000a1c0002800500010011000000060002009c46000006000300003500004c0002802c000180140003000000000000000000000000000000000114000400fd0002440000000000000000000000021c00028005000100110000000600020000350000060003009c46000008000c00ade38d5808000300000001a8080007000000001e";
/// Captured IPCTNL_MSG_CT_GET_STATS_CPU dump datagram of a 2-CPU machine (CPU 1 has
/// CTA_STATS_ERROR = 2).
const CAPTURED_STATS: &str = "640000000401020001000000c7fe09dd00000000080002000000000008000400000000000800080000000000080009000000000008000a000000000008000b000000000008000c000000000008000d000000000008000e000000000008000f0000000000640000000401020001000000c7fe09dd00000001080002000000000008000400000000000800080000000000080009000000000008000a000000000008000b000000000008000c000000000208000d000000000008000e000000000008000f0000000000";

#[test]
fn captured_kernel_events() {
    let CtMessage::Entry { change, entry } = one(&hex(CAPTURED_NEW_V4)) else {
        panic!("not an entry");
    };
    assert_eq!(change, CtChange::New);
    assert_eq!(entry.zone, 5);
    // CONFIRMED | SRC_NAT_DONE | DST_NAT_DONE | DST_NAT
    assert_eq!(entry.status, 0x1a8);
    assert_eq!(entry.orig.src, "10.244.1.2:40005".parse().unwrap());
    assert_eq!(entry.orig.dst, "10.96.0.10:53".parse().unwrap());
    assert_eq!(entry.reply.src, "127.0.0.1:53".parse().unwrap());
    assert_eq!(entry.reply.dst, "10.244.1.2:40005".parse().unwrap());
    assert_eq!(entry.orig.proto, 17);

    let CtMessage::Entry { change, entry } = one(&hex(CAPTURED_NEW_V6)) else {
        panic!("not an entry");
    };
    assert_eq!(change, CtChange::New);
    assert_eq!(entry.zone, 0);
    assert_eq!(entry.orig.src, "[fd00:244::2]:40006".parse().unwrap());
    assert_eq!(entry.orig.dst, "[fd00:96::a]:53".parse().unwrap());
    assert_eq!(entry.reply.src, "[::1]:53".parse().unwrap());
    assert_eq!(entry.reply.dst, "[fd00:244::2]:40006".parse().unwrap());
}

#[test]
fn captured_stats_dump() {
    let v: Vec<(u32, CtMessage)> = decode_datagram(&hex(CAPTURED_STATS))
        .into_iter()
        .map(|r| r.unwrap())
        .map(|(h, m)| (h.sequence_number, m))
        .collect();
    assert_eq!(v.len(), 2);
    for (i, (seq, m)) in v.iter().enumerate() {
        assert_eq!(*seq, 1);
        let CtMessage::Stats(s) = m else {
            panic!("not stats")
        };
        assert_eq!(s.cpu, i as u32);
        assert_eq!(s.error, if i == 1 { 2 } else { 0 });
    }
}

#[test]
fn bad_message_does_not_hide_the_next() {
    let mut a = Vec::new();
    nla(&mut a, 8, &[0, 1]);
    let mut d = message(0x0104, 0, 0, 0, &a);
    d.extend(hex(CAPTURED_NEW_V4));
    let v = decode_datagram(&d);
    assert_eq!(v.len(), 2);
    assert!(v[0].is_err());
    assert!(matches!(v[1], Ok((_, CtMessage::Entry { .. }))));
}

/// Every truncation and many single-byte corruptions of real-shaped messages: errors or
/// decodes, never a panic.
#[test]
fn no_panic_on_truncated_or_corrupted_input() {
    let mut fixtures = vec![
        new_event_v4(),
        new_event_v6(0, 0x0100),
        stats_reply(),
        hex(CAPTURED_NEW_V4),
        hex(CAPTURED_NEW_V6),
        hex(CAPTURED_STATS),
    ];
    let mut two = new_event_v4();
    two.extend(stats_reply());
    fixtures.push(two);
    for f in &fixtures {
        for cut in 0..=f.len() {
            let _ = decode_datagram(&f[..cut]);
        }
        for i in 0..f.len() {
            for b in [
                0x00,
                0xff,
                0x80,
                0x03,
                f[i].wrapping_add(1),
                f[i].wrapping_sub(4),
            ] {
                let mut m = f.clone();
                m[i] = b;
                let _ = decode_datagram(&m);
            }
        }
    }
    // A deterministic pseudo-random stream of garbage.
    let mut x: u32 = 0x1234_5678;
    for len in 0..300 {
        let g: Vec<u8> = (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                x as u8
            })
            .collect();
        let _ = decode_datagram(&g);
    }
}
