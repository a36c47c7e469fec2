//! Link layers of capture files: where the IP header starts, the VLAN tag and direction.
use super::*;

/// What [`strip_link`] found in a frame.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Link {
    Ip {
        offset: usize,
        vlan: Option<u16>,
        dir: Option<Direction>,
        /// Kernel interface index from an SLL2 header.
        ifindex: Option<u32>,
    },
    NotIp,
    Truncated,
    Unsupported,
}

pub(super) use tracer_common::proto::{
    ETH_P_8021AD, ETH_P_8021Q, ETH_P_IP, ETH_P_IPV6, ETH_P_QINQ1,
};
/// Tags followed at most; more means garbage.
pub(super) const MAX_VLAN_TAGS: usize = 4;
/// `PACKET_OUTGOING` in SLL/SLL2's packet type (include/uapi/linux/if_packet.h).
pub(super) const PACKET_OUTGOING: u8 = 4;

pub(super) fn be16(b: &[u8], at: usize) -> Option<u16> {
    b.get(at..at + 2).map(|s| u16::from_be_bytes([s[0], s[1]]))
}

pub(super) fn be32(b: &[u8], at: usize) -> Option<u32> {
    b.get(at..at + 4)
        .map(|s| u32::from_be_bytes([s[0], s[1], s[2], s[3]]))
}

/// Follows 802.1Q/802.1ad tags from `ethertype` at `offset`; the innermost tag's VLAN id
/// wins, as in the kernel programs.
pub(super) fn after_tags(
    frame: &[u8],
    mut ethertype: u16,
    mut offset: usize,
    dir: Option<Direction>,
    ifindex: Option<u32>,
) -> Link {
    let mut vlan = None;
    let mut tags = 0;
    while matches!(ethertype, ETH_P_8021Q | ETH_P_8021AD | ETH_P_QINQ1) {
        tags += 1;
        if tags > MAX_VLAN_TAGS {
            return Link::NotIp;
        }
        let (Some(tci), Some(next)) = (be16(frame, offset), be16(frame, offset + 2)) else {
            return Link::Truncated;
        };
        vlan = (tci != 0).then_some(tci & 0x0fff);
        ethertype = next;
        offset += 4;
    }
    match ethertype {
        ETH_P_IP | ETH_P_IPV6 => Link::Ip {
            offset,
            vlan,
            dir,
            ifindex,
        },
        _ => Link::NotIp,
    }
}

pub(super) fn sll_dir(pkttype: u8) -> Direction {
    if pkttype == PACKET_OUTGOING {
        Direction::Egress
    } else {
        Direction::Ingress
    }
}

/// BSD address families for IPv4 and IPv6 (AF_INET6 differs between systems).
pub(super) fn null_family(family: u32) -> Link {
    match family {
        2 | 10 | 24 | 28 | 30 => Link::Ip {
            offset: 4,
            vlan: None,
            dir: None,
            ifindex: None,
        },
        _ => Link::NotIp,
    }
}

/// Finds the IP header in a captured frame of link type `linktype`.
pub(super) fn strip_link(linktype: u32, frame: &[u8]) -> Link {
    match linktype {
        // LINKTYPE_NULL: the address family in the capturing host's byte order.
        0 => match frame.first_chunk::<4>() {
            None => Link::Truncated,
            Some(b) => {
                let le = u32::from_le_bytes(*b);
                null_family(if le <= 0xffff {
                    le
                } else {
                    u32::from_be_bytes(*b)
                })
            }
        },
        // LINKTYPE_LOOP: the same, always big-endian.
        108 => match frame.first_chunk::<4>() {
            None => Link::Truncated,
            Some(b) => null_family(u32::from_be_bytes(*b)),
        },
        // LINKTYPE_ETHERNET.
        1 => match be16(frame, 12) {
            None => Link::Truncated,
            Some(ethertype) => after_tags(frame, ethertype, 14, None, None),
        },
        // LINKTYPE_RAW, IPV4, IPV6; 12 and 14 are DLT_RAW's values on some BSDs.
        101 | 228 | 229 | 12 | 14 => {
            if frame.is_empty() {
                Link::Truncated
            } else {
                Link::Ip {
                    offset: 0,
                    vlan: None,
                    dir: None,
                    ifindex: None,
                }
            }
        }
        // LINKTYPE_LINUX_SLL: pkttype(2) hatype(2) halen(2) addr(8) protocol(2).
        113 => match (be16(frame, 0), be16(frame, 14)) {
            (Some(pkttype), Some(proto)) => {
                after_tags(frame, proto, 16, Some(sll_dir(pkttype as u8)), None)
            }
            _ => Link::Truncated,
        },
        // LINKTYPE_LINUX_SLL2: protocol(2) reserved(2) ifindex(4) hatype(2) pkttype(1)
        // halen(1) addr(8).
        276 => match (be16(frame, 0), be32(frame, 4), frame.get(10)) {
            (Some(proto), Some(ifindex), Some(&pkttype)) if frame.len() >= 20 => {
                after_tags(frame, proto, 20, Some(sll_dir(pkttype)), Some(ifindex))
            }
            _ => Link::Truncated,
        },
        _ => Link::Unsupported,
    }
}
