//! The one packet walker: Ethernet/VLAN → IPv4 (with options) or IPv6 (with extension
//! headers) → UDP/TCP ports, and (TC only) one level of tunnel to the same walk again. The TC programs read through `bpf_skb_load_bytes`, the drop
//! program through `bpf_probe_read_kernel`; both walk the same headers the same way, so a
//! packet TC traces is a packet whose drop is reported.
use core::mem::size_of;

use aya_ebpf::{helpers::bpf_probe_read_kernel, programs::TcContext};
use tracer_common::{
    proto::{
        ETH_P_8021AD, ETH_P_8021Q, ETH_P_IP, ETH_P_IPV6, ETH_P_TEB, GENEVE_PORT, IPPROTO_DSTOPTS,
        IPPROTO_FRAGMENT, IPPROTO_GRE, IPPROTO_HOPOPTS, IPPROTO_IPIP, IPPROTO_IPV6,
        IPPROTO_ROUTING, IPPROTO_TCP, IPPROTO_UDP, IPV4_MIN_HEADER_LEN, IPV6_HEADER_LEN,
        UDP_HEADER_LEN, VXLAN_LINUX_PORT, VXLAN_PORT,
    },
    FragKey, L3_IPV4, L3_IPV6,
};

/// Bounds-checked reads of packet bytes at an offset.
pub trait PacketRead {
    /// `size_of::<T>()` bytes at `offset`; `Err` if they are not all in the packet.
    fn ptr_at<T: Copy>(&self, offset: usize) -> Result<T, ()>;
}

/// A packet seen by a TC program: `bpf_skb_load_bytes` checks `offset + size_of::<T>()`
/// against the packet (linear and paged parts alike) and fails rather than read past it.
impl PacketRead for TcContext {
    #[inline(always)]
    fn ptr_at<T: Copy>(&self, offset: usize) -> Result<T, ()> {
        self.load::<T>(offset).map_err(|_| ())
    }
}

/// The linear bytes of a kernel `sk_buff`, from its network header: `len` bytes at `base`.
pub struct KernelPacket {
    pub base: u64,
    pub len: u64,
}

impl PacketRead for KernelPacket {
    #[inline(always)]
    fn ptr_at<T: Copy>(&self, offset: usize) -> Result<T, ()> {
        if offset as u64 + size_of::<T>() as u64 > self.len {
            return Err(());
        }
        // SAFETY: bpf_probe_read_kernel faults safely on a bad address.
        unsafe { bpf_probe_read_kernel((self.base + offset as u64) as *const T).map_err(|_| ()) }
    }
}

/// The linear bytes of a TC program's packet (`skb->data .. skb->data_end`), read with
/// plain loads: no helper call per header field. A field outside the linear part fails the
/// bounds check like a field past the packet's end; the caller then walks again through
/// `bpf_skb_load_bytes`, which also reads the paged part.
pub struct Linear {
    pub data: usize,
    pub end: usize,
}

impl PacketRead for Linear {
    #[inline(always)]
    fn ptr_at<T: Copy>(&self, offset: usize) -> Result<T, ()> {
        let start = self.data + offset;
        // At least two bytes: LLVM turns `start + 1 > end` into `start >= end`, from which
        // the verifier learns no readable range (a one-byte field at the very end of the
        // linear part is then left to the caller's second walk).
        let need = if size_of::<T>() < 2 {
            2
        } else {
            size_of::<T>()
        };
        if start + need > self.end {
            return Err(());
        }
        // SAFETY: `start..start + size_of::<T>()` lies in the packet's linear bytes (checked
        // against `data_end` above, which is also what the verifier checks).
        Ok(unsafe { core::ptr::read_unaligned(start as *const T) })
    }
}

/// Bytes of [`Copied`]'s buffer the drop program fills: an IPv4 header with any options
/// and the ports (≤ 64), an IPv6 header and the ports (44) or with an 8-byte extension
/// header (52). 64 rather than 128: on 1,000-byte datagrams the copy of 128 cost 4–5 ns more
/// per drop; packets whose headers reach further are walked in the packet itself.
pub const PEEK: usize = 64;
/// [`Copied`]'s buffer: twice [`PEEK`], so that any read at a masked offset stays inside.
pub const PEEK_BUF: usize = 2 * PEEK;

/// The first `len` (≤ [`PEEK`]) bytes of a packet, copied into map memory by one
/// `bpf_probe_read_kernel`: the drop program walks them with plain loads, and walks the
/// packet itself only when a header lies further.
pub struct Copied {
    pub buf: *const u8,
    pub len: usize,
}

impl PacketRead for Copied {
    #[inline(always)]
    fn ptr_at<T: Copy>(&self, offset: usize) -> Result<T, ()> {
        if offset + size_of::<T>() > self.len {
            return Err(());
        }
        // The mask is what the verifier bounds the read by; the volatile read keeps LLVM from
        // dropping it as redundant after the check above.
        // SAFETY: a read of a local.
        let masked = unsafe { core::ptr::read_volatile(&offset) } & (PEEK - 1);
        // SAFETY: `buf` holds PEEK_BUF bytes; the masked offset is below PEEK and no field
        // read here is longer than PEEK.
        Ok(unsafe { core::ptr::read_unaligned(self.buf.add(masked) as *const T) })
    }
}

/// Not a fragment.
pub const FRAG_NONE: u8 = 0;
/// The first fragment of a datagram (offset 0, more fragments): it has the ports.
pub const FRAG_FIRST: u8 = 1;
/// A later fragment: no transport header, no ports; `l4_off` is where its data starts.
pub const FRAG_LATER: u8 = 2;

/// Where the transport header starts, which protocol it is, and its ports.
pub struct Transport {
    pub l3: u8,
    pub l3_off: usize,
    pub l4_off: usize,
    pub proto: u8,
    /// 0 for a [`FRAG_LATER`] fragment.
    pub sport: u16,
    pub dport: u16,
    /// [`FRAG_NONE`], [`FRAG_FIRST`] or [`FRAG_LATER`].
    pub frag: u8,
    /// The datagram's IP Identification (IPv4: 16 bits; IPv6: the Fragment header's 32).
    pub frag_id: u32,
}

/// IP header fields the walk found: version, transport offset, protocol, fragment kind, id.
pub struct Network {
    pub l3: u8,
    pub l4_off: usize,
    pub proto: u8,
    pub frag: u8,
    pub frag_id: u32,
}

/// The link layer of an Ethernet frame: the ethertype after up to two in-packet tags
/// (802.1ad outer + 802.1Q inner), the offset of the network header, and the innermost TCI.
#[inline(always)]
pub fn ethernet<P: PacketRead>(p: &P) -> Result<(u16, usize, Option<u16>), ()> {
    ethernet_at(p, 0)
}

/// [`ethernet`] of the frame at `base` (a tunnel's inner frame).
#[inline(always)]
fn ethernet_at<P: PacketRead>(p: &P, base: usize) -> Result<(u16, usize, Option<u16>), ()> {
    let mut proto = u16::from_be(p.ptr_at::<u16>(base + 12)?);
    let mut off = base + 14;
    let mut tci = None;
    let mut i = 0;
    while i < 2 {
        if proto == ETH_P_8021Q || proto == ETH_P_8021AD {
            tci = Some(u16::from_be(p.ptr_at::<u16>(off)?));
            proto = u16::from_be(p.ptr_at::<u16>(off + 2)?);
            off += 4;
        }
        i += 1;
    }
    Ok((proto, off, tci))
}

/// The UDP or TCP header of the IP packet at `l3_off` whose ethertype is `ethertype`.
/// `Ok(None)` for other protocols and other ethertypes; a non-first UDP/TCP fragment is
/// returned without ports ([`FRAG_LATER`]); `Err` for headers that cannot be read.
#[inline(always)]
pub fn transport<P: PacketRead>(
    p: &P,
    ethertype: u16,
    l3_off: usize,
) -> Result<Option<Transport>, ()> {
    let Some(n) = network(p, ethertype, l3_off)? else {
        return Ok(None);
    };
    ports(p, &n, l3_off)
}

/// The IP header at `l3_off` whose ethertype is `ethertype`; `Ok(None)` for other ethertypes.
#[inline(always)]
pub fn network<P: PacketRead>(p: &P, ethertype: u16, l3_off: usize) -> Result<Option<Network>, ()> {
    match ethertype {
        ETH_P_IP => ipv4(p, l3_off),
        ETH_P_IPV6 => ipv6(p, l3_off),
        _ => Ok(None),
    }
}

/// The UDP or TCP header after the IP header `n` (at `l3_off`); `Ok(None)` for other
/// protocols.
#[inline(always)]
pub fn ports<P: PacketRead>(p: &P, n: &Network, l3_off: usize) -> Result<Option<Transport>, ()> {
    if n.proto != IPPROTO_UDP && n.proto != IPPROTO_TCP {
        return Ok(None);
    }
    let ports = if n.frag == FRAG_LATER {
        0
    } else {
        u32::from_be(p.ptr_at::<u32>(n.l4_off)?)
    };
    Ok(Some(Transport {
        l3: n.l3,
        l3_off,
        l4_off: n.l4_off,
        proto: n.proto,
        sport: (ports >> 16) as u16,
        dport: ports as u16,
        frag: n.frag,
        frag_id: n.frag_id,
    }))
}

/// The inner packet of one level of tunnel after the IP header `n`: its ethertype and the
/// offset of its IP header. VXLAN (UDP 4789 and flannel's 8472, I flag set; an Ethernet
/// frame inside), Geneve (UDP 6081, version 0; past its options; Ethernet, IPv4 or IPv6
/// inside), GRE (version 0 without routing; past its checksum, key and sequence number;
/// IPv4, IPv6 or Transparent Ethernet Bridging inside), IP-in-IP (protocol 4 and 41).
/// `Ok(None)` for anything else, and for an outer packet that is a fragment. The same rules
/// as userspace's `decode::tunnel`, which reads the copied bytes again.
#[inline(always)]
pub fn tunnel<P: PacketRead>(p: &P, n: &Network) -> Result<Option<(u16, usize)>, ()> {
    if n.frag != FRAG_NONE {
        return Ok(None);
    }
    let l4 = n.l4_off;
    let (proto, off) = match n.proto {
        IPPROTO_UDP => {
            let dport = u16::from_be(p.ptr_at::<u16>(l4 + 2)?);
            if dport != VXLAN_PORT && dport != VXLAN_LINUX_PORT && dport != GENEVE_PORT {
                return Ok(None);
            }
            // The tunnel header: flags (VXLAN) or version and option length (Geneve),
            // then Geneve's protocol type.
            let h = p.ptr_at::<[u8; 4]>(l4 + UDP_HEADER_LEN)?;
            if dport == GENEVE_PORT {
                if h[0] >> 6 != 0 {
                    return Ok(None);
                }
                (
                    u16::from_be_bytes([h[2], h[3]]),
                    l4 + UDP_HEADER_LEN + 8 + ((h[0] & 0x3f) as usize) * 4,
                )
            } else if h[0] & 0x08 != 0 {
                (ETH_P_TEB, l4 + UDP_HEADER_LEN + 8)
            } else {
                return Ok(None);
            }
        }
        IPPROTO_GRE => {
            let h = p.ptr_at::<[u8; 4]>(l4)?;
            // Version 0, no routing (RFC 1701); C, K, S each add 4 bytes.
            if h[1] & 0x07 != 0 || h[0] & 0x40 != 0 {
                return Ok(None);
            }
            let words = ((h[0] >> 7) & 1) + ((h[0] >> 5) & 1) + ((h[0] >> 4) & 1);
            (
                u16::from_be_bytes([h[2], h[3]]),
                l4 + 4 + (words as usize) * 4,
            )
        }
        IPPROTO_IPIP => (ETH_P_IP, l4),
        IPPROTO_IPV6 => (ETH_P_IPV6, l4),
        _ => return Ok(None),
    };
    if proto == ETH_P_TEB {
        let (ethertype, l3, _) = ethernet_at(p, off)?;
        return Ok(Some((ethertype, l3)));
    }
    Ok(Some((proto, off)))
}

/// The key of the datagram a fragment belongs to: addresses from the IP header at
/// `t.l3_off`, the IP id and the payload protocol.
#[inline(always)]
pub fn frag_key<P: PacketRead>(p: &P, t: &Transport) -> Result<FragKey, ()> {
    let mut key = FragKey {
        src: [0; 16],
        dst: [0; 16],
        id: t.frag_id,
        proto: t.proto,
        l3: t.l3,
        _pad: 0,
    };
    if t.l3 == L3_IPV4 {
        let a = p.ptr_at::<[u8; 8]>(t.l3_off + 12)?;
        key.src[..4].copy_from_slice(&a[..4]);
        key.dst[..4].copy_from_slice(&a[4..]);
    } else {
        key.src = p.ptr_at::<[u8; 16]>(t.l3_off + 8)?;
        key.dst = p.ptr_at::<[u8; 16]>(t.l3_off + 24)?;
    }
    Ok(key)
}

/// The ethertype for an IP header whose version nibble is `first_byte >> 4` (the drop
/// program starts at the network header and has no link layer to tell it).
#[inline(always)]
pub fn ethertype_of_version(first_byte: u8) -> u16 {
    match first_byte >> 4 {
        4 => ETH_P_IP,
        6 => ETH_P_IPV6,
        _ => 0,
    }
}

/// IPv4 header at `off` (RFC 791): options skipped by IHL; non-first fragments carry no ports.
#[inline(always)]
fn ipv4<P: PacketRead>(p: &P, off: usize) -> Result<Option<Network>, ()> {
    let vihl = p.ptr_at::<u8>(off)?;
    let ihl = ((vihl & 0x0f) as usize) * 4;
    if vihl >> 4 != 4 || ihl < IPV4_MIN_HEADER_LEN {
        return Err(());
    }
    // Identification, then flags (MF = 0x2000) and the 13-bit fragment offset.
    let id_frag = u32::from_be(p.ptr_at::<u32>(off + 4)?);
    let frag = if id_frag & 0x1fff != 0 {
        FRAG_LATER
    } else if id_frag & 0x2000 != 0 {
        FRAG_FIRST
    } else {
        FRAG_NONE
    };
    let proto = p.ptr_at::<u8>(off + 9)?;
    Ok(Some(Network {
        l3: L3_IPV4,
        l4_off: off + ihl,
        proto,
        frag,
        frag_id: id_frag >> 16,
    }))
}

/// IPv6 header at `off` (RFC 8200), following up to four extension headers.
#[inline(always)]
fn ipv6<P: PacketRead>(p: &P, off: usize) -> Result<Option<Network>, ()> {
    let mut nh = p.ptr_at::<u8>(off + 6)?;
    let mut l4 = off + IPV6_HEADER_LEN;
    let mut frag = FRAG_NONE;
    let mut frag_id = 0u32;
    let mut i = 0;
    while i < 4 {
        match nh {
            // hop-by-hop, routing, destination options: length in 8-octet units, not
            // counting the first 8
            IPPROTO_HOPOPTS | IPPROTO_ROUTING | IPPROTO_DSTOPTS => {
                let hdr = p.ptr_at::<[u8; 2]>(l4)?;
                nh = hdr[0];
                l4 += (hdr[1] as usize + 1) * 8;
            }
            // fragment header (RFC 8200 §4.5): next header, reserved, offset (13 bits) |
            // res | M, identification; only the first fragment has the transport header
            IPPROTO_FRAGMENT => {
                let hdr = p.ptr_at::<[u8; 8]>(l4)?;
                let off_m = u16::from_be_bytes([hdr[2], hdr[3]]);
                frag_id = u32::from_be_bytes([hdr[4], hdr[5], hdr[6], hdr[7]]);
                nh = hdr[0];
                l4 += 8;
                if off_m >> 3 != 0 {
                    // The rest is fragment data, not headers.
                    frag = FRAG_LATER;
                    break;
                }
                if off_m & 1 != 0 {
                    frag = FRAG_FIRST;
                }
            }
            _ => break,
        }
        i += 1;
    }
    Ok(Some(Network {
        l3: L3_IPV6,
        l4_off: l4,
        proto: nh,
        frag,
        frag_id,
    }))
}

/// A copy length the verifier of every supported kernel can follow: `n` bounded to
/// `1..=mask + 1` by arithmetic rather than by comparisons, which LLVM may fold into a form
/// that older verifiers cannot track (6.1: "min value is negative"; 6.12: "invalid zero-sized
/// read"). `n` must already be in `1..=mask + 1` for the result to equal it.
#[inline(always)]
pub fn bounded_len(n: u32, mask: u32) -> u32 {
    // The volatile read hides `n`'s known range from LLVM, which would otherwise drop the
    // mask as redundant.
    // SAFETY: a read of a local.
    let n = unsafe { core::ptr::read_volatile(&n) };
    (n.wrapping_sub(1) & mask) + 1
}
