//! dnspath kernel programs.
//!
//! - TC classifiers (ingress and egress; for devices with and without an Ethernet header) that
//!   copy every UDP/TCP packet on a watched port into the `EVENTS` ring buffer.
//! - A `tp_btf/kfree_skb` program that reports drops of such packets with reason, location and
//!   the skb's conntrack entry.
//!
//! Every loss on the way is counted in the per-CPU `COUNTERS` array (indexes in
//! `tracer_common::counter`), which userspace reports.
#![no_std]
#![no_main]

use core::{ffi::c_void, mem::size_of, ptr::read_volatile};

use aya_ebpf::{
    bindings::__sk_buff,
    helpers::{
        bpf_get_smp_processor_id, bpf_ktime_get_boot_ns, bpf_probe_read_kernel,
        bpf_probe_read_kernel_buf, generated::bpf_skb_load_bytes,
    },
    macros::{btf_tracepoint, classifier, map},
    maps::{Array, PerCpuArray, RingBuf},
    programs::{BtfTracePointContext, TcContext},
};
use tracer_common::{
    counter, CaptureConfig, CtTuple, DropEvent, KernelOffsets, PacketEvent, PacketHeader,
    DIR_EGRESS, DIR_INGRESS, EVENT_DROP, EVENT_PACKET, IPPROTO_TCP, IPPROTO_UDP, L3_IPV4, L3_IPV6,
    MAX_DROP_DATA, MAX_PACKET_DATA, MAX_SNAPLEN, PACKET_HEADER_LEN,
};

/// `TC_ACT_UNSPEC`, which is also `TCX_NEXT`: never change the packet's fate.
const TC_NEXT: i32 = -1;

const ETH_P_IP: u16 = 0x0800;
const ETH_P_IPV6: u16 = 0x86dd;
const ETH_P_8021Q: u16 = 0x8100;
const ETH_P_8021AD: u16 = 0x88a8;

#[map]
static EVENTS: RingBuf = RingBuf::with_byte_size(16 * 1024 * 1024, 0);

/// Watched ports: a non-zero value at index PORT means "capture".
#[map]
static PORTS: Array<u8> = Array::with_max_entries(65536, 0);

/// Per-CPU scratch space where a packet event is built before it is copied into the ring
/// buffer with only the bytes it needs (a DNS packet is ~100 bytes; the event can hold 4 KB).
#[map]
static SCRATCH: PerCpuArray<PacketEvent> = PerCpuArray::with_max_entries(1, 0);

#[map]
static COUNTERS: PerCpuArray<u64> = PerCpuArray::with_max_entries(counter::COUNT, 0);

#[unsafe(no_mangle)]
static CONFIG: CaptureConfig = CaptureConfig {
    snaplen: tracer_common::DEFAULT_SNAPLEN,
    _reserved: 0,
};

/// Cookie of the network namespace whose interfaces this instance is attached to. Userspace
/// loads one instance of the TC programs per namespace: `bpf_get_netns_cookie` in TC reports
/// the namespace of `skb->sk` and falls back to init_net for forwarded and received packets,
/// which have none.
#[unsafe(no_mangle)]
static NETNS_COOKIE: u64 = 0;

#[unsafe(no_mangle)]
static KERNEL_OFFSETS: KernelOffsets = KernelOffsets::UNSET;

#[inline(always)]
fn count(index: u32) {
    if let Some(slot) = COUNTERS.get_ptr_mut(index) {
        // SAFETY: per-CPU slot, not shared with other CPUs.
        unsafe { *slot += 1 };
    }
}

#[inline(always)]
fn watched(port: u16) -> bool {
    matches!(PORTS.get(port as u32), Some(v) if *v != 0)
}

/// The one bounds-checked packet accessor: `bpf_skb_load_bytes` checks `offset + size_of::<T>()`
/// against the packet (linear and paged parts alike) and fails rather than read past it.
#[inline(always)]
fn ptr_at<T>(ctx: &TcContext, offset: usize) -> Result<T, ()> {
    ctx.load::<T>(offset).map_err(|_| ())
}

/// Where the transport header starts and which protocol it is.
struct Transport {
    l3: u8,
    l3_off: usize,
    l4_off: usize,
    proto: u8,
}

/// TC classifier on ingress of devices with an Ethernet header (veth, physical NICs, `lo`).
///
/// Hook: `tcx/ingress` (Linux ≥ 6.6) or clsact `ingress` (≥ 4.5); ring buffer ≥ 5.8.
#[classifier]
pub fn dnspath_tc_eth_ingress(ctx: TcContext) -> i32 {
    tc(&ctx, true, DIR_INGRESS)
}

/// As [`dnspath_tc_eth_ingress`], on egress (`tcx/egress` or clsact `egress`).
#[classifier]
pub fn dnspath_tc_eth_egress(ctx: TcContext) -> i32 {
    tc(&ctx, true, DIR_EGRESS)
}

/// TC classifier on ingress of devices without a link-layer header (tun, wireguard, ipip):
/// the packet starts at its IP header and `skb->protocol` says which.
#[classifier]
pub fn dnspath_tc_raw_ingress(ctx: TcContext) -> i32 {
    tc(&ctx, false, DIR_INGRESS)
}

/// As [`dnspath_tc_raw_ingress`], on egress.
#[classifier]
pub fn dnspath_tc_raw_egress(ctx: TcContext) -> i32 {
    tc(&ctx, false, DIR_EGRESS)
}

#[inline(always)]
fn tc(ctx: &TcContext, has_eth: bool, dir: u8) -> i32 {
    match try_tc(ctx, has_eth, dir) {
        Ok(()) => {}
        Err(()) => count(counter::PARSE_FAILED),
    }
    TC_NEXT
}

#[inline(always)]
fn try_tc(ctx: &TcContext, has_eth: bool, dir: u8) -> Result<(), ()> {
    let skb: *mut __sk_buff = ctx.skb.skb;
    // SAFETY: the context pointer is valid for the whole program run.
    let (vlan_present, meta_tci, skb_protocol) =
        unsafe { ((*skb).vlan_present, (*skb).vlan_tci, (*skb).protocol) };
    let mut vlan_tci: u16 = if vlan_present != 0 {
        meta_tci as u16
    } else {
        0
    };

    let (ethertype, l3_off) = if has_eth {
        let mut proto = u16::from_be(ptr_at::<u16>(ctx, 12)?);
        let mut off = 14usize;
        // Up to two in-packet tags (802.1ad outer + 802.1Q inner); with VLAN offload the
        // tag is in skb metadata instead and the payload starts at 14.
        let mut i = 0;
        while i < 2 {
            if proto == ETH_P_8021Q || proto == ETH_P_8021AD {
                vlan_tci = u16::from_be(ptr_at::<u16>(ctx, off)?);
                proto = u16::from_be(ptr_at::<u16>(ctx, off + 2)?);
                off += 4;
            }
            i += 1;
        }
        (proto, off)
    } else {
        (u16::from_be(skb_protocol as u16), 0usize)
    };

    let t = match ethertype {
        ETH_P_IP => match ipv4_transport(ctx, l3_off)? {
            Some(t) => t,
            None => return Ok(()),
        },
        ETH_P_IPV6 => match ipv6_transport(ctx, l3_off)? {
            Some(t) => t,
            None => return Ok(()),
        },
        _ => return Ok(()),
    };
    if t.proto != IPPROTO_UDP && t.proto != IPPROTO_TCP {
        return Ok(());
    }
    let ports = u32::from_be(ptr_at::<u32>(ctx, t.l4_off)?);
    let (sport, dport) = ((ports >> 16) as u16, ports as u16);
    if !watched(sport) && !watched(dport) {
        return Ok(());
    }
    let l4_hdr = if t.proto == IPPROTO_TCP {
        let doff = ptr_at::<u8>(ctx, t.l4_off + 12)?;
        ((doff >> 4) as usize) * 4
    } else {
        8
    };
    count(counter::PACKETS_MATCHED);

    let pkt_len = (ctx.len() as usize).saturating_sub(t.l3_off);
    // SAFETY: read of a plain global that userspace sets before load.
    let config = unsafe { read_volatile(&CONFIG) };
    let snaplen = if config.snaplen > MAX_SNAPLEN {
        MAX_SNAPLEN
    } else {
        config.snaplen
    } as usize;
    let want = (t.l4_off - t.l3_off) + l4_hdr + snaplen;
    let cap = if want < pkt_len { want } else { pkt_len };

    let Some(ev) = SCRATCH.get_ptr_mut(0) else {
        count(counter::PACKETS_LOST_COPY);
        return Ok(());
    };
    // The verifier needs the length provably in 1..=MAX_PACKET_DATA.
    let cap = cap as u32;
    if cap == 0 || cap as usize > MAX_PACKET_DATA {
        count(counter::PACKETS_LOST_COPY);
        return Ok(());
    }
    // SAFETY: `ev` points at this CPU's scratch PacketEvent; programs do not nest on a CPU
    // for TC.
    unsafe {
        (*ev).hdr = PacketHeader {
            kind: EVENT_PACKET,
            cpu: bpf_get_smp_processor_id(),
            ts_ns: bpf_ktime_get_boot_ns(),
            netns_cookie: read_volatile(&NETNS_COOKIE),
            ifindex: (*skb).ifindex,
            orig_len: pkt_len as u32,
            cap_len: cap,
            vlan_tci,
            dir,
            l3: t.l3,
        };
        let ret = bpf_skb_load_bytes(
            skb as *const c_void,
            t.l3_off as u32,
            (*ev).data.as_mut_ptr() as *mut c_void,
            cap,
        );
        if ret != 0 {
            count(counter::PACKETS_LOST_COPY);
            return Ok(());
        }
        let len = PACKET_HEADER_LEN + cap as usize;
        if len > size_of::<PacketEvent>() {
            return Ok(());
        }
        let bytes = core::slice::from_raw_parts(ev as *const u8, len);
        if EVENTS.output::<[u8]>(bytes, 0).is_err() {
            count(counter::PACKETS_LOST_RINGBUF);
        }
    }
    Ok(())
}

/// IPv4 header at `off` (RFC 791). `None` for non-first fragments, which carry no ports.
#[inline(always)]
fn ipv4_transport(ctx: &TcContext, off: usize) -> Result<Option<Transport>, ()> {
    let vihl = ptr_at::<u8>(ctx, off)?;
    let ihl = ((vihl & 0x0f) as usize) * 4;
    if vihl >> 4 != 4 || ihl < 20 {
        return Err(());
    }
    let frag = u16::from_be(ptr_at::<u16>(ctx, off + 6)?);
    if frag & 0x1fff != 0 {
        return Ok(None);
    }
    let proto = ptr_at::<u8>(ctx, off + 9)?;
    Ok(Some(Transport {
        l3: L3_IPV4,
        l3_off: off,
        l4_off: off + ihl,
        proto,
    }))
}

/// IPv6 header at `off` (RFC 8200), following up to four extension headers.
#[inline(always)]
fn ipv6_transport(ctx: &TcContext, off: usize) -> Result<Option<Transport>, ()> {
    let mut nh = ptr_at::<u8>(ctx, off + 6)?;
    let mut l4 = off + 40;
    let mut i = 0;
    while i < 4 {
        match nh {
            // hop-by-hop, routing, destination options: length in 8-octet units, not
            // counting the first 8
            0 | 43 | 60 => {
                let hdr = ptr_at::<[u8; 2]>(ctx, l4)?;
                nh = hdr[0];
                l4 += (hdr[1] as usize + 1) * 8;
            }
            // fragment header: only the first fragment has the transport header
            44 => {
                let hdr = ptr_at::<[u8; 4]>(ctx, l4)?;
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
    Ok(Some(Transport {
        l3: L3_IPV6,
        l3_off: off,
        l4_off: l4,
        proto: nh,
    }))
}

/// Drops of packets on a watched port.
///
/// Hook: BTF-enabled tracepoint `skb:kfree_skb`,
/// `TP_PROTO(struct sk_buff *skb, void *location, enum skb_drop_reason reason, struct sock *rx_sk)`;
/// the `reason` argument exists since Linux 5.17, `tp_btf` needs kernel BTF (5.5+).
/// Struct offsets come from userspace (`KERNEL_OFFSETS`), read from `/sys/kernel/btf/vmlinux`.
#[btf_tracepoint(function = "kfree_skb")]
pub fn dnspath_kfree_skb(ctx: BtfTracePointContext) -> i32 {
    match try_kfree_skb(&ctx) {
        Ok(()) => {}
        Err(()) => count(counter::DROPS_READ_FAILED),
    }
    0
}

#[inline(always)]
unsafe fn kread<T>(base: u64, off: u32) -> Result<T, ()> {
    // SAFETY: bpf_probe_read_kernel faults safely on a bad address.
    unsafe { bpf_probe_read_kernel((base + off as u64) as *const T).map_err(|_| ()) }
}

#[inline(always)]
fn try_kfree_skb(ctx: &BtfTracePointContext) -> Result<(), ()> {
    let skb: u64 = ctx.arg(0);
    let location: u64 = ctx.arg(1);
    let reason: u32 = ctx.arg(2);
    // SAFETY: plain global set by userspace before load.
    let o = unsafe { read_volatile(&KERNEL_OFFSETS) };
    if o.skb_head == 0 || skb == 0 {
        return Ok(());
    }
    // SAFETY: every read goes through bpf_probe_read_kernel.
    unsafe {
        let head: u64 = kread(skb, o.skb_head)?;
        let nh: u16 = kread(skb, o.skb_network_header)?;
        if head == 0 || nh == 0xffff {
            return Ok(());
        }
        let ip = head + nh as u64;
        let vihl: u8 = kread(ip, 0)?;
        let (l3, l4, proto) = match vihl >> 4 {
            4 => {
                let frag: u16 = u16::from_be(kread(ip, 6)?);
                if frag & 0x1fff != 0 {
                    return Ok(());
                }
                (
                    L3_IPV4,
                    ip + ((vihl & 0x0f) as u64) * 4,
                    kread::<u8>(ip, 9)?,
                )
            }
            6 => (L3_IPV6, ip + 40, kread::<u8>(ip, 6)?),
            _ => return Ok(()),
        };
        if proto != IPPROTO_UDP && proto != IPPROTO_TCP {
            return Ok(());
        }
        let ports: u32 = u32::from_be(kread(l4, 0)?);
        if !watched((ports >> 16) as u16) && !watched(ports as u16) {
            return Ok(());
        }
        count(counter::DROPS_MATCHED);

        let len: u32 = kread(skb, o.skb_len)?;
        let tail: u32 = kread(skb, o.skb_tail)?;
        let data: u64 = kread(skb, o.skb_data)?;
        let data_off = data.saturating_sub(head);
        let Some(mut entry) = EVENTS.reserve::<DropEvent>(0) else {
            count(counter::DROPS_LOST_RINGBUF);
            return Ok(());
        };
        let ev = entry.as_mut_ptr();
        (*ev).kind = EVENT_DROP;
        (*ev).cpu = bpf_get_smp_processor_id();
        (*ev).ts_ns = bpf_ktime_get_boot_ns();
        (*ev).location = location;
        (*ev).reason = reason;
        (*ev).l3 = l3;
        (*ev)._pad = [0; 2];
        (*ev)._pad2 = 0;
        // skb->len counts from skb->data; the network header may lie before or after it.
        (*ev).orig_len = (len as u64 + data_off).saturating_sub(nh as u64) as u32;

        let dev: u64 = kread(skb, o.skb_dev).unwrap_or(0);
        let net: u64 = if dev != 0 {
            (*ev).ifindex = kread(dev, o.dev_ifindex).unwrap_or(0);
            kread(dev, o.dev_nd_net).unwrap_or(0)
        } else {
            (*ev).ifindex = 0;
            let sk: u64 = kread(skb, o.skb_sk).unwrap_or(0);
            if sk != 0 {
                kread(sk, o.sk_net).unwrap_or(0)
            } else {
                0
            }
        };
        (*ev).netns_cookie = if net != 0 {
            kread(net, o.net_cookie).unwrap_or(0)
        } else {
            0
        };

        (*ev).has_ct = 0;
        (*ev).ct_status = 0;
        (*ev).ct_orig = CtTuple::default();
        (*ev).ct_reply = CtTuple::default();
        if o.has_nfct != 0 {
            let nfct: u64 = kread(skb, o.skb_nfct).unwrap_or(0);
            // include/linux/skbuff.h: NFCT_PTRMASK = ~7UL; the low bits are ctinfo.
            let ct = nfct & !7u64;
            if ct != 0 {
                let th = ct + o.nfct_tuplehash as u64 + o.tuplehash_tuple as u64;
                if let (Ok(status), Ok(orig), Ok(reply)) = (
                    kread::<u64>(ct, o.nfct_status),
                    kread::<CtTuple>(th, 0),
                    kread::<CtTuple>(th, o.tuplehash_size),
                ) {
                    (*ev).has_ct = 1;
                    (*ev).ct_status = status;
                    (*ev).ct_orig = orig;
                    (*ev).ct_reply = reply;
                }
            }
        }

        // Copy the linear part from the network header: `tail` is an offset from `head`
        // on 64-bit kernels (NET_SKBUFF_DATA_USES_OFFSET).
        let linear = (tail as u64).saturating_sub(nh as u64);
        let cap = if linear < MAX_DROP_DATA as u64 {
            linear as usize
        } else {
            MAX_DROP_DATA
        };
        (*ev).cap_len = 0;
        if cap > 0 && cap <= MAX_DROP_DATA {
            let dst = &mut (&mut (*ev).data)[..cap];
            if bpf_probe_read_kernel_buf(ip as *const u8, dst).is_ok() {
                (*ev).cap_len = cap as u32;
            }
        }
        entry.submit(0);
    }
    Ok(())
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";

const _: () = assert!(size_of::<PacketEvent>() <= 8192);
