//! Finding the IP fragment in a captured packet: IPv4 flags and offset (RFC 791 §3.1), the
//! IPv6 Fragment header after any extension headers (RFC 8200 §4.5).
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use tracer_common::proto::{
    IPPROTO_DSTOPTS, IPPROTO_FRAGMENT, IPPROTO_HOPOPTS, IPPROTO_ROUTING, IPV4_MIN_HEADER_LEN,
    IPV6_HEADER_LEN,
};

use super::DatagramId;
// Extension headers walked before the Fragment header: as many as `decode::ip` follows.
use crate::decode::ip::MAX_IPV6_EXTENSION_HEADERS;

/// One IP fragment found in a captured packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fragment<'a> {
    pub src: IpAddr,
    pub dst: IpAddr,
    pub id: u32,
    /// Protocol of the fragmented payload.
    pub proto: u8,
    /// Byte offset of this fragment's data in the datagram's payload.
    pub offset: usize,
    pub more: bool,
    /// The fragment's data length on the wire (from the IP header).
    pub len: usize,
    /// What the capture holds of that data (at most `len` bytes).
    pub data: &'a [u8],
    /// IPv4: the header with options; IPv6: the fixed 40-byte header.
    pub header: &'a [u8],
}

impl Fragment<'_> {
    pub fn datagram(&self) -> DatagramId {
        DatagramId {
            src: self.src,
            dst: self.dst,
            id: self.id,
            proto: self.proto,
        }
    }
}

/// The fragment `data` (from its IP header on) is, or `None` for an unfragmented packet (or
/// one whose headers `decode::ip` will reject).
pub fn parse_fragment(data: &[u8]) -> Option<Fragment<'_>> {
    match data.first()? >> 4 {
        4 => parse_ipv4(data),
        6 => parse_ipv6(data),
        _ => None,
    }
}

fn parse_ipv4(data: &[u8]) -> Option<Fragment<'_>> {
    let h = data.get(..IPV4_MIN_HEADER_LEN)?;
    let ihl = usize::from(h[0] & 0x0f) * 4;
    let flags_offset = u16::from_be_bytes([h[6], h[7]]);
    let more = flags_offset & 0x2000 != 0;
    let offset = usize::from(flags_offset & 0x1fff) * 8;
    if !more && offset == 0 {
        return None;
    }
    let total = usize::from(u16::from_be_bytes([h[2], h[3]]));
    if ihl < IPV4_MIN_HEADER_LEN || total < ihl || data.len() < ihl {
        return None;
    }
    Some(Fragment {
        src: IpAddr::V4(Ipv4Addr::new(h[12], h[13], h[14], h[15])),
        dst: IpAddr::V4(Ipv4Addr::new(h[16], h[17], h[18], h[19])),
        id: u32::from(u16::from_be_bytes([h[4], h[5]])),
        proto: h[9],
        offset,
        more,
        len: total - ihl,
        data: data.get(ihl..total.min(data.len()))?,
        header: data.get(..ihl)?,
    })
}

fn parse_ipv6(data: &[u8]) -> Option<Fragment<'_>> {
    let h = data.get(..IPV6_HEADER_LEN)?;
    let payload_len = usize::from(u16::from_be_bytes([h[4], h[5]]));
    let mut next = h[6];
    let mut at = IPV6_HEADER_LEN;
    for _ in 0..MAX_IPV6_EXTENSION_HEADERS {
        match next {
            IPPROTO_HOPOPTS | IPPROTO_ROUTING | IPPROTO_DSTOPTS => {
                let ext = data.get(at..at + 2)?;
                next = ext[0];
                at += (usize::from(ext[1]) + 1) * 8;
            }
            IPPROTO_FRAGMENT => {
                let f = data.get(at..at + 8)?;
                let off_m = u16::from_be_bytes([f[2], f[3]]);
                let offset = usize::from(off_m >> 3) * 8;
                let more = off_m & 1 != 0;
                // An atomic fragment (offset 0, no more) is a whole packet (RFC 6946).
                if offset == 0 && !more {
                    return None;
                }
                let start = at + 8;
                let end = IPV6_HEADER_LEN + payload_len;
                if payload_len == 0 || end < start {
                    return None;
                }
                let mut src = [0u8; 16];
                let mut dst = [0u8; 16];
                src.copy_from_slice(&h[8..24]);
                dst.copy_from_slice(&h[24..40]);
                return Some(Fragment {
                    src: IpAddr::V6(Ipv6Addr::from(src)),
                    dst: IpAddr::V6(Ipv6Addr::from(dst)),
                    id: u32::from_be_bytes([f[4], f[5], f[6], f[7]]),
                    proto: f[0],
                    offset,
                    more,
                    len: end - start,
                    data: data.get(start..end.min(data.len())).unwrap_or_default(),
                    header: h,
                });
            }
            _ => return None,
        }
    }
    None
}
