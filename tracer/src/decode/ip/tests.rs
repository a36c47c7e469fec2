#[test]
fn addr_string_is_display() {
    use std::net::{SocketAddr, SocketAddrV6};
    let mut addrs: Vec<SocketAddr> = vec![
        "0.0.0.0:0".parse().unwrap(),
        "255.255.255.255:65535".parse().unwrap(),
        "10.96.0.10:53".parse().unwrap(),
        "[::1]:53".parse().unwrap(),
        "[fe80::1%2]:5353".parse().unwrap(),
        SocketAddr::V6(SocketAddrV6::new("fe80::1".parse().unwrap(), 53, 0, 7)),
    ];
    for a in [0u8, 1, 9, 10, 99, 100, 199, 255] {
        for p in [0u16, 7, 10, 53, 999, 1000, 9999, 10000, 65535] {
            addrs.push(SocketAddr::from(([a, 255 - a, a / 2, 9], p)));
        }
    }
    for a in addrs {
        assert_eq!(addr_string(a), a.to_string());
    }
}
use super::*;

fn udp(sport: u16, dport: u16, payload: &[u8]) -> Vec<u8> {
    let mut v = Vec::new();
    v.extend_from_slice(&sport.to_be_bytes());
    v.extend_from_slice(&dport.to_be_bytes());
    v.extend_from_slice(&((8 + payload.len()) as u16).to_be_bytes());
    v.extend_from_slice(&[0, 0]);
    v.extend_from_slice(payload);
    v
}

fn tcp(sport: u16, dport: u16, seq: u32, flags: u8, options: &[u8], payload: &[u8]) -> Vec<u8> {
    assert_eq!(options.len() % 4, 0);
    let doff = (20 + options.len()) / 4;
    let mut v = Vec::new();
    v.extend_from_slice(&sport.to_be_bytes());
    v.extend_from_slice(&dport.to_be_bytes());
    v.extend_from_slice(&seq.to_be_bytes());
    v.extend_from_slice(&0u32.to_be_bytes());
    v.push((doff as u8) << 4);
    v.push(flags);
    v.extend_from_slice(&[0xff, 0xff, 0, 0, 0, 0]);
    v.extend_from_slice(options);
    v.extend_from_slice(payload);
    v
}

fn ipv4(proto: u8, options: &[u8], frag: u16, l4: &[u8]) -> Vec<u8> {
    assert_eq!(options.len() % 4, 0);
    let ihl = 20 + options.len();
    let total = (ihl + l4.len()) as u16;
    let mut v = vec![0x40 | (ihl / 4) as u8, 0];
    v.extend_from_slice(&total.to_be_bytes());
    v.extend_from_slice(&[0x12, 0x34]);
    v.extend_from_slice(&frag.to_be_bytes());
    v.extend_from_slice(&[64, proto, 0, 0]);
    v.extend_from_slice(&[10, 0, 0, 1]);
    v.extend_from_slice(&[10, 0, 0, 2]);
    v.extend_from_slice(options);
    v.extend_from_slice(l4);
    v
}

fn ipv6(next: u8, ext: &[u8], l4: &[u8]) -> Vec<u8> {
    let plen = (ext.len() + l4.len()) as u16;
    let mut v = vec![0x60, 0, 0, 0];
    v.extend_from_slice(&plen.to_be_bytes());
    v.push(next);
    v.push(64);
    v.extend_from_slice(&"fd00::1".parse::<Ipv6Addr>().unwrap().octets());
    v.extend_from_slice(&"fd00::2".parse::<Ipv6Addr>().unwrap().octets());
    v.extend_from_slice(ext);
    v.extend_from_slice(l4);
    v
}

#[test]
fn ipv4_udp() {
    let pkt = ipv4(17, &[], 0, &udp(5353, 53, b"hello"));
    let p = parse_ip(&pkt).unwrap();
    assert_eq!(p.src, "10.0.0.1".parse::<IpAddr>().unwrap());
    assert_eq!(p.dst, "10.0.0.2".parse::<IpAddr>().unwrap());
    assert!(!p.truncated);
    assert_eq!(
        p.transport,
        Transport::Udp {
            sport: 5353,
            dport: 53,
            payload: b"hello"
        }
    );
}

#[test]
fn ipv4_options_honoured() {
    let pkt = ipv4(17, &[1, 1, 1, 0, 1, 1, 1, 0], 0, &udp(1, 53, b"x"));
    let p = parse_ip(&pkt).unwrap();
    assert_eq!(
        p.transport,
        Transport::Udp {
            sport: 1,
            dport: 53,
            payload: b"x"
        }
    );
}

#[test]
fn ipv4_trailing_padding_trimmed() {
    let mut pkt = ipv4(17, &[], 0, &udp(1, 53, b"ab"));
    pkt.extend_from_slice(&[0u8; 16]); // Ethernet minimum-frame padding
    let p = parse_ip(&pkt).unwrap();
    assert!(!p.truncated);
    assert_eq!(
        p.transport,
        Transport::Udp {
            sport: 1,
            dport: 53,
            payload: b"ab"
        }
    );
}

#[test]
fn udp_length_bounds_payload() {
    // IP total length covers 4 extra bytes that the UDP length excludes.
    let mut l4 = udp(1, 53, b"abc");
    l4.extend_from_slice(b"junk");
    let pkt = ipv4(17, &[], 0, &l4);
    let p = parse_ip(&pkt).unwrap();
    assert!(!p.truncated);
    assert!(matches!(
        p.transport,
        Transport::Udp {
            payload: b"abc",
            ..
        }
    ));
}

#[test]
fn ipv4_snaplen_cut_sets_truncated() {
    let pkt = ipv4(17, &[], 0, &udp(1, 53, &[7u8; 100]));
    let p = parse_ip(&pkt[..60]).unwrap();
    assert!(p.truncated);
    assert_eq!(p.missing, 128 - 60);
    match p.transport {
        Transport::Udp { payload, .. } => assert_eq!(payload.len(), 60 - 28),
        other => panic!("{other:?}"),
    }
}

#[test]
fn udp_length_larger_than_ip_payload_is_truncated() {
    let mut l4 = udp(1, 53, b"abcd");
    l4[4..6].copy_from_slice(&100u16.to_be_bytes());
    let pkt = ipv4(17, &[], 0, &l4);
    let p = parse_ip(&pkt).unwrap();
    assert!(p.truncated);
    assert_eq!(p.missing, 100 - 12);
    assert!(matches!(
        p.transport,
        Transport::Udp {
            payload: b"abcd",
            ..
        }
    ));
}

#[test]
fn bad_udp_length() {
    let mut l4 = udp(1, 53, b"abcd");
    l4[4..6].copy_from_slice(&5u16.to_be_bytes());
    assert_eq!(
        parse_ip(&ipv4(17, &[], 0, &l4)),
        Err(IpError::BadUdpLength(5))
    );
}

#[test]
fn ipv4_tcp_with_options() {
    let l4 = tcp(
        40000,
        53,
        0xdead_beef,
        0x18,
        &[1, 1, 8, 10, 0, 0, 0, 1, 0, 0, 0, 2],
        b"\x00\x02hi",
    );
    let pkt = ipv4(6, &[], 0, &l4);
    let p = parse_ip(&pkt).unwrap();
    assert!(!p.truncated);
    assert_eq!(
        p.transport,
        Transport::Tcp {
            sport: 40000,
            dport: 53,
            seq: 0xdead_beef,
            flags: 0x18,
            payload: b"\x00\x02hi"
        }
    );
}

#[test]
fn tcp_bad_data_offset() {
    let mut l4 = tcp(1, 53, 0, 0x10, &[], b"");
    l4[12] = 4 << 4;
    assert_eq!(
        parse_ip(&ipv4(6, &[], 0, &l4)),
        Err(IpError::BadDataOffset(4))
    );
}

#[test]
fn tcp_options_cut_by_snaplen() {
    let l4 = tcp(1, 53, 0, 0x10, &[1; 20], b"payload");
    let pkt = ipv4(6, &[], 0, &l4);
    assert!(matches!(
        parse_ip(&pkt[..20 + 30]),
        Err(IpError::TooShort {
            layer: "TCP (with options)",
            need: 40,
            have: 30
        })
    ));
}

#[test]
fn tcp_payload_cut_is_truncated() {
    let l4 = tcp(1, 53, 5, 0x18, &[], &[9u8; 50]);
    let pkt = ipv4(6, &[], 0, &l4);
    let p = parse_ip(&pkt[..20 + 20 + 10]).unwrap();
    assert!(p.truncated);
    assert_eq!(p.missing, 40);
    assert!(matches!(p.transport, Transport::Tcp { payload, .. } if payload.len() == 10));
}

#[test]
fn ipv4_fragments() {
    // First fragment (MF set, offset 0): transport header present.
    let first = ipv4(17, &[], 0x2000, &udp(1, 53, b"abc"));
    assert!(matches!(
        parse_ip(&first).unwrap().transport,
        Transport::Udp { .. }
    ));
    // Non-first fragment: bytes after the IP header are not a UDP header.
    let later = ipv4(17, &[], 0x0010, b"not a udp header");
    assert_eq!(
        parse_ip(&later).unwrap().transport,
        Transport::Other { proto: 17 }
    );
}

#[test]
fn ipv4_errors() {
    assert!(matches!(parse_ip(&[]), Err(IpError::TooShort { .. })));
    assert!(matches!(
        parse_ip(&[0x45, 0, 0]),
        Err(IpError::TooShort { layer: "IPv4", .. })
    ));
    let mut bad_ihl = ipv4(17, &[], 0, &udp(1, 2, b""));
    bad_ihl[0] = 0x44;
    assert_eq!(parse_ip(&bad_ihl), Err(IpError::BadIhl(4)));
    let mut ihl_past_end = ipv4(17, &[], 0, &[]);
    ihl_past_end[0] = 0x4f;
    assert!(matches!(
        parse_ip(&ihl_past_end),
        Err(IpError::TooShort { need: 60, .. })
    ));
    let mut bad_total = ipv4(17, &[], 0, &udp(1, 2, b""));
    bad_total[2..4].copy_from_slice(&10u16.to_be_bytes());
    assert_eq!(
        parse_ip(&bad_total),
        Err(IpError::BadTotalLength {
            total: 10,
            header: 20
        })
    );
    assert_eq!(parse_ip(&[0x55; 40]), Err(IpError::BadVersion(5)));
    let short_udp = ipv4(17, &[], 0, &[0, 1, 0]);
    assert!(matches!(
        parse_ip(&short_udp),
        Err(IpError::TooShort { layer: "UDP", .. })
    ));
}

#[test]
fn ipv4_other_protocol() {
    let pkt = ipv4(1, &[], 0, &[8, 0, 0, 0]);
    let p = parse_ip(&pkt).unwrap();
    assert_eq!(p.transport, Transport::Other { proto: 1 });
}

#[test]
fn ipv6_udp() {
    let pkt = ipv6(17, &[], &udp(1234, 53, b"q"));
    let p = parse_ip(&pkt).unwrap();
    assert_eq!(p.src, "fd00::1".parse::<IpAddr>().unwrap());
    assert_eq!(p.dst, "fd00::2".parse::<IpAddr>().unwrap());
    assert!(!p.truncated);
    assert!(matches!(
        p.transport,
        Transport::Udp {
            sport: 1234,
            dport: 53,
            payload: b"q"
        }
    ));
}

#[test]
fn ipv6_extension_chain() {
    // hop-by-hop (8 bytes) -> dest opts (16 bytes) -> routing (8 bytes) -> first fragment -> TCP
    let mut ext = vec![60, 0, 1, 4, 0, 0, 0, 0];
    ext.extend_from_slice(&[43, 1, 1, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
    ext.extend_from_slice(&[44, 0, 0, 0, 0, 0, 0, 0]);
    ext.extend_from_slice(&[6, 0, 0x00, 0x01, 0, 0, 0, 1]); // offset 0, M=1
    let l4 = tcp(53, 4000, 7, 0x11, &[], b"");
    let pkt = ipv6(0, &ext, &l4);
    let p = parse_ip(&pkt).unwrap();
    assert_eq!(
        p.transport,
        Transport::Tcp {
            sport: 53,
            dport: 4000,
            seq: 7,
            flags: 0x11,
            payload: b""
        }
    );
}

#[test]
fn ipv6_non_first_fragment() {
    let ext = [17, 0, 0x00, 0xb9, 0, 0, 0, 1]; // offset 23 * 8
    let pkt = ipv6(44, &ext, b"middle of a datagram");
    let p = parse_ip(&pkt).unwrap();
    assert_eq!(p.transport, Transport::Other { proto: 17 });
}

#[test]
fn ipv6_payload_length_bounds_and_truncation() {
    let mut pkt = ipv6(17, &[], &udp(1, 53, b"abc"));
    pkt.extend_from_slice(b"pad");
    let p = parse_ip(&pkt).unwrap();
    assert!(!p.truncated);
    assert!(matches!(
        p.transport,
        Transport::Udp {
            payload: b"abc",
            ..
        }
    ));

    let pkt = ipv6(17, &[], &udp(1, 53, &[0u8; 64]));
    let p = parse_ip(&pkt[..40 + 8 + 10]).unwrap();
    assert!(p.truncated);
    assert_eq!(p.missing, 54);
    assert!(matches!(p.transport, Transport::Udp { payload, .. } if payload.len() == 10));
}

#[test]
fn ipv6_errors() {
    let pkt = ipv6(17, &[], &udp(1, 53, b""));
    assert!(matches!(
        parse_ip(&pkt[..39]),
        Err(IpError::TooShort { layer: "IPv6", .. })
    ));
    // Extension header claims 16 bytes, only 8 present.
    let pkt = ipv6(0, &[17, 1, 0, 0, 0, 0, 0, 0], b"");
    assert!(matches!(
        parse_ip(&pkt),
        Err(IpError::TooShort {
            layer: "IPv6 extension",
            need: 16,
            have: 8
        })
    ));
    // A chain of destination-options headers longer than the bound.
    let ext: Vec<u8> = (0..20).flat_map(|_| [60u8, 0, 0, 0, 0, 0, 0, 0]).collect();
    assert_eq!(
        parse_ip(&ipv6(60, &ext, b"")),
        Err(IpError::TooManyExtensionHeaders)
    );
}

#[test]
fn garbage_never_panics() {
    // Deterministic xorshift so failures reproduce.
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let seeds = [
        ipv4(17, &[], 0, &udp(1, 53, b"hello world")),
        ipv4(
            6,
            &[1, 1, 1, 1],
            0,
            &tcp(1, 53, 1, 2, &[1, 1, 1, 1], b"abc"),
        ),
        ipv6(0, &[17, 0, 1, 4, 0, 0, 0, 0], &udp(1, 53, b"x")),
    ];
    for _ in 0..20_000 {
        let r = next();
        let mut pkt = seeds[(r % 3) as usize].clone();
        for _ in 0..(r >> 8) % 6 {
            let r = next();
            let i = (r as usize) % pkt.len();
            pkt[i] = (r >> 32) as u8;
        }
        let cut = (next() as usize) % (pkt.len() + 1);
        let _ = parse_ip(&pkt[..cut]);
    }
}
