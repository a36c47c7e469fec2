use super::*;
use crate::decode::{parse_ip, Transport};

/// A DNS query's bytes (id 0x1234, `A? a.test.`).
const DNS: &[u8] = &[
    0x12, 0x34, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0, 1, b'a', 4, b't', b'e', b's', b't', 0, 0, 1, 0, 1,
];

fn udp(sport: u16, dport: u16, payload: &[u8]) -> Vec<u8> {
    let mut v = Vec::new();
    v.extend_from_slice(&sport.to_be_bytes());
    v.extend_from_slice(&dport.to_be_bytes());
    v.extend_from_slice(&((8 + payload.len()) as u16).to_be_bytes());
    v.extend_from_slice(&[0, 0]);
    v.extend_from_slice(payload);
    v
}

fn ipv4(src: [u8; 4], dst: [u8; 4], proto: u8, body: &[u8]) -> Vec<u8> {
    let mut v = vec![0x45, 0];
    v.extend_from_slice(&((20 + body.len()) as u16).to_be_bytes());
    v.extend_from_slice(&[0, 1, 0, 0, 64, proto, 0, 0]);
    v.extend_from_slice(&src);
    v.extend_from_slice(&dst);
    v.extend_from_slice(body);
    v
}

fn ipv6(src: u8, dst: u8, next: u8, body: &[u8]) -> Vec<u8> {
    let mut v = vec![0x60, 0, 0, 0];
    v.extend_from_slice(&(body.len() as u16).to_be_bytes());
    v.extend_from_slice(&[next, 64]);
    let addr = |last: u8| {
        let mut a = [0u8; 16];
        a[0] = 0xfd;
        a[15] = last;
        a
    };
    v.extend_from_slice(&addr(src));
    v.extend_from_slice(&addr(dst));
    v.extend_from_slice(body);
    v
}

/// The client's query: 10.244.1.2:40000 > 10.244.2.3:53.
fn inner_query() -> Vec<u8> {
    ipv4(
        [10, 244, 1, 2],
        [10, 244, 2, 3],
        IPPROTO_UDP,
        &udp(40000, 53, DNS),
    )
}

fn ethernet(ethertype: u16, body: &[u8]) -> Vec<u8> {
    let mut v = vec![2, 0, 0, 0, 0, 2, 2, 0, 0, 0, 0, 1];
    v.extend_from_slice(&ethertype.to_be_bytes());
    v.extend_from_slice(body);
    v
}

const A: [u8; 4] = [10, 200, 0, 1];
const B: [u8; 4] = [10, 200, 0, 2];

/// The inner packet `decapsulate` found: its tunnel, and the DNS query parsed from it.
fn inner(data: &[u8]) -> Tunnel {
    let Ok(Decap::Inner { tunnel, offset }) = decapsulate(data) else {
        panic!("no inner packet: {:?}", decapsulate(data));
    };
    let ip = parse_ip(&data[offset..]).unwrap();
    match ip.transport {
        Transport::Udp {
            sport,
            dport,
            payload,
        } => {
            assert_eq!((sport, dport, payload), (40000, 53, DNS));
        }
        t => panic!("{t:?}"),
    }
    tunnel
}

fn vxlan(port: u16, vni: u32, frame: &[u8]) -> Vec<u8> {
    let mut h = vec![0x08, 0, 0, 0];
    h.extend_from_slice(&(vni << 8).to_be_bytes());
    h.extend_from_slice(frame);
    ipv4(A, B, IPPROTO_UDP, &udp(51234, port, &h))
}

#[test]
fn vxlan_on_both_ports_with_vni_and_outer_addresses() {
    for port in [VXLAN_PORT, VXLAN_LINUX_PORT] {
        let t = inner(&vxlan(port, 1, &ethernet(ETH_P_IP, &inner_query())));
        assert_eq!(t.kind, TunnelKind::Vxlan);
        assert_eq!(t.id, Some(1));
        assert_eq!(t.src, IpAddr::from(A));
        assert_eq!(t.dst, IpAddr::from(B));
        assert_eq!(t.to_string(), "vxlan vni=1 10.200.0.1 > 10.200.0.2");
    }
    // A VLAN tag inside the inner frame.
    let mut tagged = vec![0, 7];
    tagged.extend_from_slice(&ETH_P_IP.to_be_bytes());
    tagged.extend_from_slice(&inner_query());
    let t = inner(&vxlan(4789, 0xabcdef, &ethernet(ETH_P_8021Q, &tagged)));
    assert_eq!(t.id, Some(0xabcdef));
    // ARP inside: a tunnel, not IP.
    assert!(matches!(
        decapsulate(&vxlan(4789, 1, &ethernet(0x0806, &[0; 28]))),
        Ok(Decap::NotIp(_))
    ));
}

#[test]
fn geneve_with_options() {
    // Two options: 4-byte header + 4 bytes, and 4-byte header + 8 bytes: 5 words.
    let options = [
        0x01, 0x02, 0x80, 0x01, 1, 2, 3, 4, 0x01, 0x02, 0x81, 0x02, 1, 2, 3, 4, 5, 6, 7, 8,
    ];
    let mut h = vec![options.len() as u8 / 4, 0];
    h.extend_from_slice(&ETH_P_TEB.to_be_bytes());
    h.extend_from_slice(&[0x00, 0x12, 0x34, 0]);
    h.extend_from_slice(&options);
    h.extend_from_slice(&ethernet(ETH_P_IP, &inner_query()));
    let t = inner(&ipv4(A, B, IPPROTO_UDP, &udp(1000, GENEVE_PORT, &h)));
    assert_eq!((t.kind, t.id), (TunnelKind::Geneve, Some(0x1234)));
    assert_eq!(t.to_string(), "geneve vni=4660 10.200.0.1 > 10.200.0.2");

    // IPv4 straight after the header (protocol type 0x0800).
    let mut h = vec![0, 0];
    h.extend_from_slice(&ETH_P_IP.to_be_bytes());
    h.extend_from_slice(&[0, 0, 7, 0]);
    h.extend_from_slice(&inner_query());
    assert_eq!(
        inner(&ipv4(A, B, IPPROTO_UDP, &udp(1000, GENEVE_PORT, &h))).id,
        Some(7)
    );

    // Options longer than the packet: an error, not a panic.
    let mut h = vec![0x3f, 0];
    h.extend_from_slice(&ETH_P_TEB.to_be_bytes());
    h.extend_from_slice(&[0, 0, 1, 0, 1, 2, 3, 4]);
    let e = decapsulate(&ipv4(A, B, IPPROTO_UDP, &udp(1000, GENEVE_PORT, &h))).unwrap_err();
    assert_eq!(e, TunnelError::GeneveOptions { need: 252, have: 4 });
}

fn gre(flags: u16, proto: u16, fields: &[u8], body: &[u8]) -> Vec<u8> {
    let mut v = flags.to_be_bytes().to_vec();
    v.extend_from_slice(&proto.to_be_bytes());
    v.extend_from_slice(fields);
    v.extend_from_slice(body);
    ipv4(A, B, IPPROTO_GRE, &v)
}

#[test]
fn gre_with_checksum_key_and_sequence() {
    // Key and sequence number (RFC 2890).
    let t = inner(&gre(
        0x3000,
        ETH_P_IP,
        &[0, 0, 0, 42, 0, 0, 0, 9],
        &inner_query(),
    ));
    assert_eq!((t.kind, t.id), (TunnelKind::Gre, Some(42)));
    assert_eq!(t.to_string(), "gre key=42 10.200.0.1 > 10.200.0.2");
    // Checksum, key and sequence number.
    let t = inner(&gre(
        0xb000,
        ETH_P_IP,
        &[0xab, 0xcd, 0, 0, 0, 0, 1, 0, 0, 0, 0, 9],
        &inner_query(),
    ));
    assert_eq!(t.id, Some(256));
    // None of them.
    assert_eq!(inner(&gre(0, ETH_P_IP, &[], &inner_query())).id, None);
    // Transparent Ethernet Bridging (gretap).
    let t = inner(&gre(
        0x2000,
        ETH_P_TEB,
        &[0, 0, 0, 5],
        &ethernet(ETH_P_IP, &inner_query()),
    ));
    assert_eq!(t.id, Some(5));
    // IPv6 inside.
    let q6 = ipv6(2, 3, IPPROTO_UDP, &udp(40000, 53, DNS));
    let mut bytes = gre(0, ETH_P_IPV6, &[], &q6);
    let Ok(Decap::Inner { offset, .. }) = decapsulate(&bytes) else {
        panic!()
    };
    assert_eq!(offset, 24);
    // Claims IPv6, holds IPv4.
    bytes.truncate(24);
    bytes.extend_from_slice(&inner_query());
    assert!(matches!(
        decapsulate(&bytes),
        Err(TunnelError::InnerVersion { version: 4, .. })
    ));
}

#[test]
fn gre_hostile_headers_are_errors() {
    // Routing bit, version 1 (PPTP), every flag bit, and cut optional fields.
    assert_eq!(
        decapsulate(&gre(0x4000, ETH_P_IP, &[0; 8], &inner_query())),
        Err(TunnelError::GreRouting)
    );
    assert_eq!(
        decapsulate(&gre(0x2001, 0x880b, &[0; 8], &[])),
        Err(TunnelError::GreVersion(1))
    );
    assert!(decapsulate(&gre(0xffff, 0xffff, &[], &[])).is_err());
    assert!(matches!(
        decapsulate(&gre(0xb000, ETH_P_IP, &[0; 6], &[])),
        Err(TunnelError::TooShort { .. })
    ));
    // Nothing after the header.
    assert!(matches!(
        decapsulate(&gre(0, ETH_P_IP, &[], &[])),
        Err(TunnelError::TooShort { .. })
    ));
    // An unknown protocol type is a tunnel without IP.
    assert!(matches!(
        decapsulate(&gre(0, 0x88be, &[], &[0; 20])),
        Ok(Decap::NotIp(_))
    ));
}

#[test]
fn ip_in_ip_of_every_pairing() {
    let t = inner(&ipv4(A, B, IPPROTO_IPIP, &inner_query()));
    assert_eq!(t.to_string(), "ipip 10.200.0.1 > 10.200.0.2");
    let t = inner(&ipv6(1, 2, IPPROTO_IPIP, &inner_query()));
    assert_eq!(t.to_string(), "ip4in6 fd00::1 > fd00::2");
    // ip6tnl's destination options header (tunnel encapsulation limit) before the tunnel.
    let mut dst_opts = vec![IPPROTO_IPIP, 0, 4, 1, 4, 1, 0, 0];
    dst_opts.extend_from_slice(&inner_query());
    assert_eq!(
        inner(&ipv6(1, 2, IPPROTO_DSTOPTS, &dst_opts)).kind,
        TunnelKind::Ip4in6
    );
    for (outer, kind) in [
        (ipv4(A, B, IPPROTO_IPV6, &[]), TunnelKind::Ip6in4),
        (ipv6(1, 2, IPPROTO_IPV6, &[]), TunnelKind::Ip6in6),
    ] {
        let mut bytes = outer;
        let q6 = ipv6(2, 3, IPPROTO_UDP, &udp(40000, 53, DNS));
        bytes.extend_from_slice(&q6);
        let Ok(Decap::Inner { tunnel, offset }) = decapsulate(&bytes) else {
            panic!()
        };
        assert_eq!(tunnel.kind, kind);
        let ip = parse_ip(&bytes[offset..]).unwrap();
        assert!(matches!(ip.transport, Transport::Udp { dport: 53, .. }));
    }
    // Cut right after the outer header.
    assert!(decapsulate(&ipv4(A, B, IPPROTO_IPIP, &[])).is_err());
}

#[test]
fn what_is_not_a_tunnel_stays_plain() {
    // DNS itself; a DNS answer to a client on port 4789 without the VXLAN I flag; a
    // datagram to 6081 whose version bits are not 0; IP fragments of a tunnel packet.
    assert_eq!(decapsulate(&inner_query()), Ok(Decap::Plain));
    let answer = ipv4(A, B, IPPROTO_UDP, &udp(53, 4789, &[0x10; 40]));
    assert_eq!(decapsulate(&answer), Ok(Decap::Plain));
    let not_geneve = ipv4(A, B, IPPROTO_UDP, &udp(53, 6081, &[0xc0; 40]));
    assert_eq!(decapsulate(&not_geneve), Ok(Decap::Plain));
    let mut fragment = vxlan(4789, 1, &ethernet(ETH_P_IP, &inner_query()));
    fragment[6] = 0x20;
    assert_eq!(decapsulate(&fragment), Ok(Decap::Plain));
    assert_eq!(decapsulate(&[]), Ok(Decap::Plain));
    assert_eq!(decapsulate(&[0x45, 0]), Ok(Decap::Plain));
    // Every cut of a VXLAN packet: never a panic, and never an inner packet it does not hold.
    let whole = vxlan(4789, 1, &ethernet(ETH_P_IP, &inner_query()));
    for n in 0..whole.len() {
        if let Ok(Decap::Inner { offset, .. }) = decapsulate(&whole[..n]) {
            assert!(offset < n);
        }
    }
}

#[test]
fn json_names_the_id_by_kind() {
    let t = inner(&vxlan(8472, 1, &ethernet(ETH_P_IP, &inner_query())));
    assert_eq!(
        serde_json::to_string(&t).unwrap(),
        r#"{"kind":"vxlan","vni":1,"src":"10.200.0.1","dst":"10.200.0.2"}"#
    );
    let t = inner(&gre(0x2000, ETH_P_IP, &[0, 0, 0, 3], &inner_query()));
    assert_eq!(
        serde_json::to_string(&t).unwrap(),
        r#"{"kind":"gre","key":3,"src":"10.200.0.1","dst":"10.200.0.2"}"#
    );
    let t = inner(&ipv4(A, B, IPPROTO_IPIP, &inner_query()));
    assert_eq!(
        serde_json::to_string(&t).unwrap(),
        r#"{"kind":"ipip","src":"10.200.0.1","dst":"10.200.0.2"}"#
    );
}

/// Every byte of every kind of tunnel packet set to hostile values, and every cut of each:
/// never a panic, and an inner packet only where the bytes hold one.
#[test]
fn hostile_bytes_never_panic() {
    let mut geneve = vec![2, 0];
    geneve.extend_from_slice(&ETH_P_TEB.to_be_bytes());
    geneve.extend_from_slice(&[0, 0, 1, 0, 1, 2, 0x80, 1, 0, 0, 0, 0]);
    geneve.extend_from_slice(&ethernet(ETH_P_IP, &inner_query()));
    let q6 = ipv6(2, 3, IPPROTO_UDP, &udp(40000, 53, DNS));
    let packets = [
        vxlan(4789, 1, &ethernet(ETH_P_IP, &inner_query())),
        ipv4(A, B, IPPROTO_UDP, &udp(1, GENEVE_PORT, &geneve)),
        gre(0xb000, ETH_P_TEB, &[0; 12], &ethernet(ETH_P_IPV6, &q6)),
        ipv6(1, 2, IPPROTO_DSTOPTS, &{
            let mut v = vec![IPPROTO_IPIP, 0, 4, 1, 4, 1, 0, 0];
            v.extend_from_slice(&inner_query());
            v
        }),
    ];
    for p in &packets {
        for i in 0..p.len() {
            for v in [0u8, 1, 0x08, 0x3f, 0x40, 0x80, 0xff] {
                let mut m = p.clone();
                m[i] = v;
                for n in [m.len(), i + 1, i / 2] {
                    if let Ok(Decap::Inner { offset, .. }) = decapsulate(&m[..n]) {
                        assert!(offset < n);
                    }
                }
            }
        }
    }
}
