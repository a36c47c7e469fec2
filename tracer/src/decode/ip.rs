//! IPv4/IPv6 + UDP/TCP header parsing of captured packets.
//!
//! Captures may be cut by a snaplen, so every length field is checked against the bytes
//! actually present: a short capture either fails (headers incomplete) or sets
//! [`IpPacket::truncated`] (payload incomplete). Nothing here allocates.
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use tracer_common::proto::{
    IPPROTO_DSTOPTS, IPPROTO_FRAGMENT, IPPROTO_HOPOPTS, IPPROTO_ROUTING, IPPROTO_TCP, IPPROTO_UDP,
    IPV4_MIN_HEADER_LEN, IPV6_HEADER_LEN, TCP_MIN_HEADER_LEN, UDP_HEADER_LEN,
};

/// `addr` as its `Display` writes it (`10.0.0.1:53`, `[::1]:53`), in one allocation of
/// the right size: records carry addresses as text, and `to_string` through the formatter
/// costs several times more per packet than the bytes it writes.
pub fn addr_string(addr: std::net::SocketAddr) -> String {
    match addr {
        std::net::SocketAddr::V4(v4) => v4_text(v4, &mut [0u8; V4_TEXT_MAX]).to_owned(),
        std::net::SocketAddr::V6(_) => addr.to_string(),
    }
}

/// The longest IPv4 socket address as text: "255.255.255.255:65535".
pub const V4_TEXT_MAX: usize = 21;

/// `addr` as its `Display` writes it, written into `buf` without the formatter.
pub fn v4_text(addr: std::net::SocketAddrV4, buf: &mut [u8; V4_TEXT_MAX]) -> &str {
    let mut n = 0;
    for octet in addr.ip().octets() {
        // Each octet's digits and the separator after it, from a table.
        let (text, len) = OCTET_TEXT[usize::from(octet)];
        if let Some(dst) = buf.get_mut(n..n + 4) {
            dst.copy_from_slice(&text);
        }
        n += usize::from(len);
    }
    // The last octet's separator is the colon.
    buf[n - 1] = b':';
    n = push_decimal(buf, n, addr.port());
    // Only ASCII digits, dots and a colon were written.
    std::str::from_utf8(&buf[..n]).unwrap_or_default()
}

/// Each octet's decimal digits followed by a dot (padded to four bytes), and their length
/// with the dot.
const OCTET_TEXT: [([u8; 4], u8); 256] = {
    let mut t = [([0u8; 4], 0u8); 256];
    let mut v = 0;
    while v < 256 {
        let (h, d, u) = ((v / 100) as u8, (v / 10 % 10) as u8, (v % 10) as u8);
        t[v] = if v >= 100 {
            ([b'0' + h, b'0' + d, b'0' + u, b'.'], 4)
        } else if v >= 10 {
            ([b'0' + d, b'0' + u, b'.', 0], 3)
        } else {
            ([b'0' + u, b'.', 0, 0], 2)
        };
        v += 1;
    }
    t
};

/// Writes `v` in decimal at `buf[n..]` (room for five digits); returns the end.
fn push_decimal(buf: &mut [u8; V4_TEXT_MAX], n: usize, v: u16) -> usize {
    let digits = match v {
        0..=9 => 1,
        10..=99 => 2,
        100..=999 => 3,
        1_000..=9_999 => 4,
        _ => 5,
    };
    let mut v = v;
    for i in (0..digits).rev() {
        if let Some(b) = buf.get_mut(n + i) {
            *b = b'0' + (v % 10) as u8;
        }
        v /= 10;
    }
    n + digits
}

/// A socket address written as its `Display` writes it (`10.0.0.1:53`, `[::1]:53`), an
/// IPv4 one without the formatter (which costs several times the bytes it writes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Addr(pub std::net::SocketAddr);

impl serde::Serialize for Addr {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let std::net::SocketAddr::V4(v4) = self.0 else {
            return s.collect_str(&self.0);
        };
        s.serialize_str(v4_text(v4, &mut [0u8; V4_TEXT_MAX]))
    }
}

/// For `serialize_with`: a socket address written as [`Addr`] writes it.
pub fn serialize_addr<S: serde::Serializer>(
    a: &std::net::SocketAddr,
    s: S,
) -> Result<S::Ok, S::Error> {
    serde::Serialize::serialize(&Addr(*a), s)
}

impl std::fmt::Display for Addr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            std::net::SocketAddr::V4(v4) => f.write_str(v4_text(v4, &mut [0u8; V4_TEXT_MAX])),
            a @ std::net::SocketAddr::V6(_) => std::fmt::Display::fmt(&a, f),
        }
    }
}

/// Where a packet record's packet came from or went to, kept as the address and written
/// (`Display`, and serialised as a string) only when a sink shows it: the socket address,
/// or for a packet whose transport header went unread (a rejected fragment) its IP address
/// alone, or the empty string where not even the IP header could be read.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Endpoint {
    #[default]
    None,
    Ip(IpAddr),
    Socket(std::net::SocketAddr),
}

impl std::fmt::Display for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Endpoint::None => Ok(()),
            Endpoint::Ip(ip) => std::fmt::Display::fmt(ip, f),
            Endpoint::Socket(a) => std::fmt::Display::fmt(&Addr(*a), f),
        }
    }
}

impl serde::Serialize for Endpoint {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Endpoint::None => s.serialize_str(""),
            Endpoint::Ip(ip) => s.collect_str(ip),
            Endpoint::Socket(a) => Addr(*a).serialize(s),
        }
    }
}

impl From<std::net::SocketAddr> for Endpoint {
    fn from(a: std::net::SocketAddr) -> Self {
        Endpoint::Socket(a)
    }
}

/// Real stacks send at most a handful of extension headers; a long chain is either an
/// attack or garbage, and bounding it keeps the walk O(1).
pub const MAX_IPV6_EXTENSION_HEADERS: usize = 8;

/// A parsed IP packet; `transport` borrows from the captured bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IpPacket<'a> {
    pub src: IpAddr,
    pub dst: IpAddr,
    pub transport: Transport<'a>,
    /// payload shorter than the headers' lengths say (snaplen cut)
    pub truncated: bool,
    /// How many bytes of the transport payload the headers' lengths say the capture lacks
    /// (0 when whole): from the UDP length for UDP, from the IP length otherwise.
    pub missing: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport<'a> {
    Udp {
        sport: u16,
        dport: u16,
        payload: &'a [u8],
    },
    Tcp {
        sport: u16,
        dport: u16,
        seq: u32,
        /// TCP flags byte (FIN=1,SYN=2,RST=4,PSH=8,ACK=16)
        flags: u8,
        payload: &'a [u8],
    },
    /// other protocol or non-first fragment
    Other { proto: u8 },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum IpError {
    #[error("{layer} header needs {need} bytes, only {have} captured")]
    TooShort {
        layer: &'static str,
        need: usize,
        have: usize,
    },
    #[error("IP version {0} is neither 4 nor 6")]
    BadVersion(u8),
    #[error("IPv4 IHL of {0} words is below the 5-word minimum")]
    BadIhl(u8),
    #[error("IPv4 total length {total} is smaller than its {header}-byte header")]
    BadTotalLength { total: u16, header: usize },
    #[error("TCP data offset of {0} words is below the 5-word minimum")]
    BadDataOffset(u8),
    #[error("UDP length {0} is smaller than the 8-byte UDP header")]
    BadUdpLength(u16),
    #[error("more than {MAX_IPV6_EXTENSION_HEADERS} IPv6 extension headers")]
    TooManyExtensionHeaders,
}

/// Parses `data`, which starts at an IPv4 or IPv6 header.
pub fn parse_ip(data: &[u8]) -> Result<IpPacket<'_>, IpError> {
    let first = *data.first().ok_or(IpError::TooShort {
        layer: "IP",
        need: 1,
        have: 0,
    })?;
    match first >> 4 {
        4 => parse_ipv4(data),
        6 => parse_ipv6(data),
        v => Err(IpError::BadVersion(v)),
    }
}

fn parse_ipv4(data: &[u8]) -> Result<IpPacket<'_>, IpError> {
    let h: &[u8; IPV4_MIN_HEADER_LEN] = array_at(data, 0).ok_or(IpError::TooShort {
        layer: "IPv4",
        need: IPV4_MIN_HEADER_LEN,
        have: data.len(),
    })?;
    let ihl_words = h[0] & 0x0f;
    let ihl = usize::from(ihl_words) * 4;
    if ihl < IPV4_MIN_HEADER_LEN {
        return Err(IpError::BadIhl(ihl_words));
    }
    if data.len() < ihl {
        return Err(IpError::TooShort {
            layer: "IPv4 (with options)",
            need: ihl,
            have: data.len(),
        });
    }
    let total = u16::from_be_bytes([h[2], h[3]]);
    // Linux BIG TCP (and some TSO captures) leave tot_len at 0 for packets over 64 KiB:
    // the captured length is then the only length there is.
    let declared_end = if total == 0 {
        data.len()
    } else if usize::from(total) < ihl {
        return Err(IpError::BadTotalLength { total, header: ihl });
    } else {
        usize::from(total)
    };
    let src = IpAddr::V4(Ipv4Addr::new(h[12], h[13], h[14], h[15]));
    let dst = IpAddr::V4(Ipv4Addr::new(h[16], h[17], h[18], h[19]));
    let proto = h[9];
    let frag_offset = u16::from_be_bytes([h[6], h[7]]) & 0x1fff;
    if frag_offset != 0 {
        // Non-first fragments carry no transport header (RFC 791).
        return Ok(IpPacket {
            src,
            dst,
            transport: Transport::Other { proto },
            truncated: data.len() < declared_end,
            missing: declared_end.saturating_sub(data.len()),
        });
    }
    let end = declared_end.min(data.len());
    let ip_truncated = data.len() < declared_end;
    // Trailing Ethernet padding beyond tot_len is cut off here.
    let segment = data.get(ihl..end).unwrap_or_default();
    let (transport, l4_missing) = parse_transport(proto, segment)?;
    Ok(IpPacket {
        src,
        dst,
        transport,
        truncated: ip_truncated || l4_missing.is_some_and(|n| n > 0),
        missing: l4_missing.unwrap_or(declared_end.saturating_sub(data.len())),
    })
}

fn parse_ipv6(data: &[u8]) -> Result<IpPacket<'_>, IpError> {
    let h: &[u8; IPV6_HEADER_LEN] = array_at(data, 0).ok_or(IpError::TooShort {
        layer: "IPv6",
        need: IPV6_HEADER_LEN,
        have: data.len(),
    })?;
    let payload_len = usize::from(u16::from_be_bytes([h[4], h[5]]));
    // Payload length 0 means a jumbogram (RFC 2675) or Linux BIG TCP: trust the capture.
    let declared_end = if payload_len == 0 {
        data.len()
    } else {
        IPV6_HEADER_LEN.saturating_add(payload_len)
    };
    let mut src = [0u8; 16];
    let mut dst = [0u8; 16];
    src.copy_from_slice(&h[8..24]);
    dst.copy_from_slice(&h[24..40]);
    let src = IpAddr::V6(Ipv6Addr::from(src));
    let dst = IpAddr::V6(Ipv6Addr::from(dst));
    let end = declared_end.min(data.len());
    let ip_truncated = data.len() < declared_end;
    let body = data.get(IPV6_HEADER_LEN..end).unwrap_or_default();

    let mut next = h[6];
    let mut offset = 0usize;
    let mut seen = 0usize;
    loop {
        match next {
            IPPROTO_HOPOPTS | IPPROTO_ROUTING | IPPROTO_DSTOPTS => {
                let ext: &[u8; 2] = array_at(body, offset).ok_or(IpError::TooShort {
                    layer: "IPv6 extension",
                    need: offset.saturating_add(2),
                    have: body.len(),
                })?;
                // RFC 8200 §4.3-4.6: Hdr Ext Len counts 8-octet units beyond the first.
                let len = (usize::from(ext[1]) + 1) * 8;
                let ext_end = offset.saturating_add(len);
                if body.len() < ext_end {
                    return Err(IpError::TooShort {
                        layer: "IPv6 extension",
                        need: ext_end,
                        have: body.len(),
                    });
                }
                next = ext[0];
                offset = ext_end;
            }
            IPPROTO_FRAGMENT => {
                let frag: &[u8; 8] = array_at(body, offset).ok_or(IpError::TooShort {
                    layer: "IPv6 fragment",
                    need: offset.saturating_add(8),
                    have: body.len(),
                })?;
                next = frag[0];
                offset = offset.saturating_add(8);
                let frag_offset = u16::from_be_bytes([frag[2], frag[3]]) >> 3;
                if frag_offset != 0 {
                    return Ok(IpPacket {
                        src,
                        dst,
                        transport: Transport::Other { proto: next },
                        truncated: ip_truncated,
                        missing: declared_end.saturating_sub(data.len()),
                    });
                }
            }
            _ => break,
        }
        seen += 1;
        if seen > MAX_IPV6_EXTENSION_HEADERS {
            return Err(IpError::TooManyExtensionHeaders);
        }
    }
    let segment = body.get(offset..).unwrap_or_default();
    let (transport, l4_missing) = parse_transport(next, segment)?;
    Ok(IpPacket {
        src,
        dst,
        transport,
        truncated: ip_truncated || l4_missing.is_some_and(|n| n > 0),
        missing: l4_missing.unwrap_or(declared_end.saturating_sub(data.len())),
    })
}

/// Returns the transport and, if it has a length field of its own (UDP), how many bytes more
/// than `segment` holds that field promises.
fn parse_transport(proto: u8, segment: &[u8]) -> Result<(Transport<'_>, Option<usize>), IpError> {
    match proto {
        IPPROTO_UDP => {
            let h: &[u8; UDP_HEADER_LEN] = array_at(segment, 0).ok_or(IpError::TooShort {
                layer: "UDP",
                need: UDP_HEADER_LEN,
                have: segment.len(),
            })?;
            let ulen = u16::from_be_bytes([h[4], h[5]]);
            // Length 0 is legal only for IPv6 jumbograms (RFC 2675 §4); take what was captured.
            let declared = match ulen {
                0 => None,
                n if usize::from(n) < UDP_HEADER_LEN => return Err(IpError::BadUdpLength(n)),
                n => Some(usize::from(n)),
            };
            let declared_end = declared.unwrap_or(segment.len());
            let end = declared_end.min(segment.len());
            Ok((
                Transport::Udp {
                    sport: u16::from_be_bytes([h[0], h[1]]),
                    dport: u16::from_be_bytes([h[2], h[3]]),
                    payload: segment.get(UDP_HEADER_LEN..end).unwrap_or_default(),
                },
                declared.map(|end| end.saturating_sub(segment.len())),
            ))
        }
        IPPROTO_TCP => {
            let h: &[u8; TCP_MIN_HEADER_LEN] = array_at(segment, 0).ok_or(IpError::TooShort {
                layer: "TCP",
                need: TCP_MIN_HEADER_LEN,
                have: segment.len(),
            })?;
            let doff_words = h[12] >> 4;
            let doff = usize::from(doff_words) * 4;
            if doff < TCP_MIN_HEADER_LEN {
                return Err(IpError::BadDataOffset(doff_words));
            }
            let payload = segment.get(doff..).ok_or(IpError::TooShort {
                layer: "TCP (with options)",
                need: doff,
                have: segment.len(),
            })?;
            Ok((
                Transport::Tcp {
                    sport: u16::from_be_bytes([h[0], h[1]]),
                    dport: u16::from_be_bytes([h[2], h[3]]),
                    seq: u32::from_be_bytes([h[4], h[5], h[6], h[7]]),
                    flags: h[13],
                    payload,
                },
                None,
            ))
        }
        proto => Ok((Transport::Other { proto }, None)),
    }
}

/// Bounds-checked fixed-size view of `data[offset..offset + N]`.
fn array_at<const N: usize>(data: &[u8], offset: usize) -> Option<&[u8; N]> {
    data.get(offset..offset.checked_add(N)?)?.try_into().ok()
}

#[cfg(test)]
mod tests;
