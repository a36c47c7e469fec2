//! One level of the tunnels a node's uplink carries pod traffic in: VXLAN (UDP 4789, and
//! flannel's 8472), Geneve (UDP 6081, with its options), GRE (RFC 2784/2890: checksum, key
//! and sequence number; inner IPv4, IPv6 or Ethernet by Transparent Ethernet Bridging) and
//! IP-in-IP (protocol 4 and 41, in IPv4 or IPv6).
//!
//! [`decapsulate`] looks at a captured packet (from its outer IP header on) and says where the
//! inner IP header starts, and what the tunnel was (kind, VNI or key, the outer addresses:
//! which node sent it to which). Packets that are IP fragments themselves are not entered
//! (their inner packet is in pieces). A UDP datagram to a tunnel port whose first bytes are
//! not that tunnel's header is left as a plain datagram; a header that is there but whose
//! inner packet the bytes do not hold is an error, reported as the packet's `malformed`.
//! Nothing here allocates or panics on hostile input.
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use serde::{Serialize, Serializer};
use tracer_common::proto::{
    ETH_P_8021AD, ETH_P_8021Q, ETH_P_IP, ETH_P_IPV6, ETH_P_QINQ1, IPPROTO_DSTOPTS,
    IPPROTO_FRAGMENT, IPPROTO_HOPOPTS, IPPROTO_ROUTING, IPPROTO_UDP, IPV4_MIN_HEADER_LEN,
    IPV6_HEADER_LEN, UDP_HEADER_LEN,
};
pub use tracer_common::proto::{
    ETH_P_TEB, GENEVE_PORT, IPPROTO_GRE, IPPROTO_IPIP, IPPROTO_IPV6, VXLAN_LINUX_PORT, VXLAN_PORT,
};

/// Which tunnel a packet was in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TunnelKind {
    Vxlan,
    Geneve,
    Gre,
    /// IPv4 in IPv4 (protocol 4; Calico's IP-in-IP).
    Ipip,
    /// IPv6 in IPv4 (protocol 41; `sit`).
    Ip6in4,
    /// IPv4 in IPv6 (protocol 4; `ip6tnl`).
    Ip4in6,
    /// IPv6 in IPv6 (protocol 41; `ip6tnl`).
    Ip6in6,
}

impl TunnelKind {
    pub fn as_str(self) -> &'static str {
        match self {
            TunnelKind::Vxlan => "vxlan",
            TunnelKind::Geneve => "geneve",
            TunnelKind::Gre => "gre",
            TunnelKind::Ipip => "ipip",
            TunnelKind::Ip6in4 => "ip6in4",
            TunnelKind::Ip4in6 => "ip4in6",
            TunnelKind::Ip6in6 => "ip6in6",
        }
    }
}

/// The tunnel a packet was seen in: its kind, its VXLAN/Geneve VNI or GRE key, and the
/// outer header's addresses (the nodes, or tunnel ends, it went between).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Tunnel {
    pub kind: TunnelKind,
    /// VXLAN/Geneve: the 24-bit VNI; GRE: the key, when the K bit is set.
    pub id: Option<u32>,
    pub src: IpAddr,
    pub dst: IpAddr,
}

impl Tunnel {
    /// The name of [`Tunnel::id`] in text and JSON: `vni` or `key`.
    pub fn id_name(&self) -> &'static str {
        match self.kind {
            TunnelKind::Gre => "key",
            _ => "vni",
        }
    }
}

/// `vxlan vni=1 10.200.0.1 > 10.200.0.2`
impl std::fmt::Display for Tunnel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.kind.as_str())?;
        if let Some(id) = self.id {
            write!(f, " {}={id}", self.id_name())?;
        }
        write!(f, " {} > {}", self.src, self.dst)
    }
}

/// `{"kind": "vxlan", "vni": 1, "src": "10.200.0.1", "dst": "10.200.0.2"}` (`key` for GRE;
/// no id field when there is none).
impl Serialize for Tunnel {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut m = s.serialize_map(None)?;
        m.serialize_entry("kind", self.kind.as_str())?;
        if let Some(id) = self.id {
            m.serialize_entry(self.id_name(), &id)?;
        }
        m.serialize_entry("src", &self.src)?;
        m.serialize_entry("dst", &self.dst)?;
        m.end()
    }
}

/// What a packet holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decap {
    /// No tunnel (or one this module does not enter): the packet is itself.
    Plain,
    /// An IP packet inside `tunnel`, from `offset` of the captured bytes on.
    Inner { tunnel: Tunnel, offset: usize },
    /// A tunnel whose inner packet is not IP (ARP in VXLAN, PPTP, ERSPAN, …).
    NotIp(Tunnel),
}

/// Why a tunnel's inner packet cannot be read.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TunnelError {
    #[error("{layer} header needs {need} bytes, only {have} captured")]
    TooShort {
        layer: &'static str,
        need: usize,
        have: usize,
    },
    #[error("GRE version {0} is not read (only version 0 carries IP here)")]
    GreVersion(u8),
    #[error("GRE with the routing bit set (RFC 1701 source routes) is not read")]
    GreRouting,
    #[error("Geneve options of {need} bytes run past the {have} bytes captured")]
    GeneveOptions { need: usize, have: usize },
    #[error("{kind} inner packet claims IP version {version} but is carried as IPv{expected}")]
    InnerVersion {
        kind: &'static str,
        version: u8,
        expected: u8,
    },
}

/// Extension headers walked to an IPv6 packet's tunnel (ip6tnl adds a destination options
/// header of its own).
const MAX_EXTENSIONS: usize = 8;

/// Where `data` (from its outer IP header on) carries an inner IP packet, if it does.
pub fn decapsulate(data: &[u8]) -> Result<Decap, TunnelError> {
    let Some(&first) = data.first() else {
        return Ok(Decap::Plain);
    };
    let (outer, src, dst, proto, l4) = match first >> 4 {
        4 => {
            let Some(h) = data.get(..IPV4_MIN_HEADER_LEN) else {
                return Ok(Decap::Plain);
            };
            let ihl = usize::from(h[0] & 0x0f) * 4;
            // A fragment (more fragments, or an offset) is not entered.
            if ihl < IPV4_MIN_HEADER_LEN || u16::from_be_bytes([h[6], h[7]]) & 0x3fff != 0 {
                return Ok(Decap::Plain);
            }
            let src = IpAddr::V4(Ipv4Addr::new(h[12], h[13], h[14], h[15]));
            let dst = IpAddr::V4(Ipv4Addr::new(h[16], h[17], h[18], h[19]));
            (4u8, src, dst, h[9], ihl)
        }
        6 => {
            let Some(h) = data.get(..IPV6_HEADER_LEN) else {
                return Ok(Decap::Plain);
            };
            let mut a = [0u8; 16];
            a.copy_from_slice(&h[8..24]);
            let src = IpAddr::V6(Ipv6Addr::from(a));
            a.copy_from_slice(&h[24..40]);
            let dst = IpAddr::V6(Ipv6Addr::from(a));
            let mut next = h[6];
            let mut off = IPV6_HEADER_LEN;
            let mut seen = 0;
            while matches!(
                next,
                IPPROTO_HOPOPTS | IPPROTO_ROUTING | IPPROTO_DSTOPTS | IPPROTO_FRAGMENT
            ) {
                let Some(ext) = data.get(off..off + 8) else {
                    return Ok(Decap::Plain);
                };
                if next == IPPROTO_FRAGMENT {
                    // Only an atomic fragment (offset 0, no more fragments) is whole.
                    if u16::from_be_bytes([ext[2], ext[3]]) & 0xfff9 != 0 {
                        return Ok(Decap::Plain);
                    }
                    off += 8;
                } else {
                    off += (usize::from(ext[1]) + 1) * 8;
                }
                next = ext[0];
                seen += 1;
                if seen > MAX_EXTENSIONS {
                    return Ok(Decap::Plain);
                }
            }
            (6u8, src, dst, next, off)
        }
        _ => return Ok(Decap::Plain),
    };
    let tunnel = |kind, id| Tunnel { kind, id, src, dst };
    match proto {
        IPPROTO_UDP => udp(data, l4, tunnel),
        IPPROTO_GRE => gre(data, l4, tunnel(TunnelKind::Gre, None)),
        IPPROTO_IPIP | IPPROTO_IPV6 => {
            let (kind, inner) = match (outer, proto) {
                (4, IPPROTO_IPIP) => (TunnelKind::Ipip, 4),
                (4, _) => (TunnelKind::Ip6in4, 6),
                (_, IPPROTO_IPIP) => (TunnelKind::Ip4in6, 4),
                _ => (TunnelKind::Ip6in6, 6),
            };
            inner_ip(data, l4, inner, tunnel(kind, None))
        }
        _ => Ok(Decap::Plain),
    }
}

/// VXLAN or Geneve by the destination port, when the header is theirs.
fn udp(
    data: &[u8],
    l4: usize,
    tunnel: impl Fn(TunnelKind, Option<u32>) -> Tunnel,
) -> Result<Decap, TunnelError> {
    let Some(dport) = data.get(l4 + 2..l4 + 4) else {
        return Ok(Decap::Plain);
    };
    let dport = u16::from_be_bytes([dport[0], dport[1]]);
    let h = l4 + UDP_HEADER_LEN;
    // The tunnel header's first 8 bytes: not there, or not such a header, is a plain datagram.
    let Some(t) = data.get(h..h + 8) else {
        return Ok(Decap::Plain);
    };
    let vni = u32::from_be_bytes([0, t[4], t[5], t[6]]);
    match dport {
        // RFC 7348: flags with the I bit (VNI valid), 24 reserved bits, VNI, 8 reserved.
        VXLAN_PORT | VXLAN_LINUX_PORT if t[0] & 0x08 != 0 => {
            ethernet(data, h + 8, tunnel(TunnelKind::Vxlan, Some(vni)))
        }
        // RFC 8926: version (2 bits, 0), options length (6 bits, 4-byte words), O, C,
        // reserved, protocol type, VNI, reserved; then the options.
        GENEVE_PORT if t[0] >> 6 == 0 => {
            let tunnel = tunnel(TunnelKind::Geneve, Some(vni));
            let inner = h + 8 + usize::from(t[0] & 0x3f) * 4;
            if inner > data.len() {
                return Err(TunnelError::GeneveOptions {
                    need: inner - h - 8,
                    have: data.len() - h - 8,
                });
            }
            by_ethertype(data, inner, u16::from_be_bytes([t[2], t[3]]), tunnel)
        }
        _ => Ok(Decap::Plain),
    }
}

/// GRE (RFC 2784, with RFC 2890's key and sequence number) at `off`.
fn gre(data: &[u8], off: usize, tunnel: Tunnel) -> Result<Decap, TunnelError> {
    let h = data.get(off..off + 4).ok_or(TunnelError::TooShort {
        layer: "GRE",
        need: 4,
        have: data.len().saturating_sub(off),
    })?;
    let flags = u16::from_be_bytes([h[0], h[1]]);
    let proto = u16::from_be_bytes([h[2], h[3]]);
    let version = (flags & 0x7) as u8;
    if version != 0 {
        return Err(TunnelError::GreVersion(version));
    }
    if flags & 0x4000 != 0 {
        return Err(TunnelError::GreRouting);
    }
    let (csum, key, seq) = (
        flags & 0x8000 != 0,
        flags & 0x2000 != 0,
        flags & 0x1000 != 0,
    );
    let len = 4 + 4 * (usize::from(csum) + usize::from(key) + usize::from(seq));
    let fields = data.get(off..off + len).ok_or(TunnelError::TooShort {
        layer: "GRE (with its optional fields)",
        need: len,
        have: data.len().saturating_sub(off),
    })?;
    let id = key.then(|| {
        let k = 4 + 4 * usize::from(csum);
        u32::from_be_bytes([fields[k], fields[k + 1], fields[k + 2], fields[k + 3]])
    });
    by_ethertype(data, off + len, proto, Tunnel { id, ..tunnel })
}

/// The inner packet at `off` whose protocol an ethertype names (GRE, Geneve).
fn by_ethertype(data: &[u8], off: usize, ethertype: u16, t: Tunnel) -> Result<Decap, TunnelError> {
    match ethertype {
        ETH_P_TEB => ethernet(data, off, t),
        ETH_P_IP => inner_ip(data, off, 4, t),
        ETH_P_IPV6 => inner_ip(data, off, 6, t),
        _ => Ok(Decap::NotIp(t)),
    }
}

/// An inner Ethernet frame at `off`, with up to two VLAN tags.
fn ethernet(data: &[u8], off: usize, t: Tunnel) -> Result<Decap, TunnelError> {
    let short = |need: usize| TunnelError::TooShort {
        layer: "inner Ethernet",
        need,
        have: data.len().saturating_sub(off),
    };
    let mut at = off + 12;
    let mut len = 14;
    for _ in 0..3 {
        let e = data.get(at..at + 2).ok_or(short(len))?;
        let ethertype = u16::from_be_bytes([e[0], e[1]]);
        match ethertype {
            ETH_P_8021Q | ETH_P_8021AD | ETH_P_QINQ1 => {
                at += 4;
                len += 4;
            }
            ETH_P_IP => return inner_ip(data, at + 2, 4, t),
            ETH_P_IPV6 => return inner_ip(data, at + 2, 6, t),
            _ => return Ok(Decap::NotIp(t)),
        }
    }
    Ok(Decap::NotIp(t))
}

/// An inner IP packet of version `version` at `off`.
fn inner_ip(data: &[u8], off: usize, version: u8, t: Tunnel) -> Result<Decap, TunnelError> {
    let first = *data.get(off).ok_or(TunnelError::TooShort {
        layer: "inner IP",
        need: 1,
        have: 0,
    })?;
    if first >> 4 != version {
        return Err(TunnelError::InnerVersion {
            kind: t.kind.as_str(),
            version: first >> 4,
            expected: version,
        });
    }
    Ok(Decap::Inner {
        tunnel: t,
        offset: off,
    })
}

#[cfg(test)]
mod tests;
