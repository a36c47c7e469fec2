//! The one packet walker: Ethernet/VLAN → IPv4 (with options) or IPv6 (with extension
//! headers) → UDP/TCP ports. The TC programs read through `bpf_skb_load_bytes`, the drop
//! program through `bpf_probe_read_kernel`; both walk the same headers the same way, so a
//! packet TC traces is a packet whose drop is reported.
use core::mem::size_of;

use aya_ebpf::{helpers::bpf_probe_read_kernel, programs::TcContext};
use tracer_common::{IPPROTO_TCP, IPPROTO_UDP, L3_IPV4, L3_IPV6};

pub const ETH_P_IP: u16 = 0x0800;
pub const ETH_P_IPV6: u16 = 0x86dd;
const ETH_P_8021Q: u16 = 0x8100;
const ETH_P_8021AD: u16 = 0x88a8;

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

/// Where the transport header starts, which protocol it is, and its ports.
pub struct Transport {
    pub l3: u8,
    pub l3_off: usize,
    pub l4_off: usize,
    pub proto: u8,
    pub sport: u16,
    pub dport: u16,
}

/// The link layer of an Ethernet frame: the ethertype after up to two in-packet tags
/// (802.1ad outer + 802.1Q inner), the offset of the network header, and the innermost TCI.
#[inline(always)]
pub fn ethernet<P: PacketRead>(p: &P) -> Result<(u16, usize, Option<u16>), ()> {
    let mut proto = u16::from_be(p.ptr_at::<u16>(12)?);
    let mut off = 14usize;
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
/// `Ok(None)` for other protocols, other ethertypes and non-first fragments (no ports);
/// `Err` for headers that cannot be read.
#[inline(always)]
pub fn transport<P: PacketRead>(
    p: &P,
    ethertype: u16,
    l3_off: usize,
) -> Result<Option<Transport>, ()> {
    let found = match ethertype {
        ETH_P_IP => ipv4(p, l3_off)?,
        ETH_P_IPV6 => ipv6(p, l3_off)?,
        _ => None,
    };
    let Some((l3, l4_off, proto)) = found else {
        return Ok(None);
    };
    if proto != IPPROTO_UDP && proto != IPPROTO_TCP {
        return Ok(None);
    }
    let ports = u32::from_be(p.ptr_at::<u32>(l4_off)?);
    Ok(Some(Transport {
        l3,
        l3_off,
        l4_off,
        proto,
        sport: (ports >> 16) as u16,
        dport: ports as u16,
    }))
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
fn ipv4<P: PacketRead>(p: &P, off: usize) -> Result<Option<(u8, usize, u8)>, ()> {
    let vihl = p.ptr_at::<u8>(off)?;
    let ihl = ((vihl & 0x0f) as usize) * 4;
    if vihl >> 4 != 4 || ihl < 20 {
        return Err(());
    }
    let frag = u16::from_be(p.ptr_at::<u16>(off + 6)?);
    if frag & 0x1fff != 0 {
        return Ok(None);
    }
    let proto = p.ptr_at::<u8>(off + 9)?;
    Ok(Some((L3_IPV4, off + ihl, proto)))
}

/// IPv6 header at `off` (RFC 8200), following up to four extension headers.
#[inline(always)]
fn ipv6<P: PacketRead>(p: &P, off: usize) -> Result<Option<(u8, usize, u8)>, ()> {
    let mut nh = p.ptr_at::<u8>(off + 6)?;
    let mut l4 = off + 40;
    let mut i = 0;
    while i < 4 {
        match nh {
            // hop-by-hop, routing, destination options: length in 8-octet units, not
            // counting the first 8
            0 | 43 | 60 => {
                let hdr = p.ptr_at::<[u8; 2]>(l4)?;
                nh = hdr[0];
                l4 += (hdr[1] as usize + 1) * 8;
            }
            // fragment header: only the first fragment has the transport header
            44 => {
                let hdr = p.ptr_at::<[u8; 4]>(l4)?;
                let frag_off = u16::from_be_bytes([hdr[2], hdr[3]]) >> 3;
                if frag_off != 0 {
                    return Ok(None);
                }
                nh = hdr[0];
                l4 += 8;
            }
            _ => break,
        }
        i += 1;
    }
    Ok(Some((L3_IPV6, l4, nh)))
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
