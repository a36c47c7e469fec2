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
    bindings::{__sk_buff, BPF_RB_AVAIL_DATA, BPF_RB_FORCE_WAKEUP, BPF_RB_NO_WAKEUP},
    helpers::{bpf_get_smp_processor_id, bpf_ktime_get_boot_ns, generated::bpf_skb_load_bytes},
    macros::{classifier, map},
    maps::{Array, HashMap, LruHashMap, PerCpuArray, RingBuf},
    programs::TcContext,
};
use aya_log_ebpf::{debug, trace};
use packet::PacketRead as _;
use tracer_common::{
    counter,
    proto::{ETH_P_8021AD, ETH_P_8021Q, ETH_P_QINQ1, IPPROTO_TCP, IPPROTO_UDP, UDP_HEADER_LEN},
    CaptureConfig, Dir, EventKind, FragKey, KernelOffsets, LearntPort, PacketEvent, PacketHeader,
    FRAG_KEY_LIFETIME_NS, MAX_FRAG_KEYS, MAX_LEARNT_PORTS, MAX_PACKET_DATA, MAX_SNAPLEN,
    PACKET_DATA_MASK, PACKET_HEADER_LEN, PORT_EVERYWHERE, PORT_LEARNT,
};

mod copies;
mod drops;
mod packet;
mod storm;

/// Where in a `PacketEvent`'s data buffer the shedding check passes its argument: past
/// anything a packet can fill.
const SHED_ARG: usize = tracer_common::PACKET_DATA_BUF - 8;
const _: () = assert!(SHED_ARG >= MAX_PACKET_DATA);

/// Where [`forget_ranges`] passes a [`Found`] through memory (six u32s before `SHED_ARG`).
const FOUND_ARG: usize = SHED_ARG - 24;
const _: () = assert!(FOUND_ARG >= MAX_PACKET_DATA);

/// Longest question name (wire form) the TC programs hash: each byte costs the verifier
/// ~170 steps in every TC program of every namespace, and loop names are short (CoreDNS's
/// probe, cluster names). A longer looping name is shed in userspace after copying.
const SHED_NAME_BYTES: usize = 128;

/// `TC_ACT_UNSPEC`, which is also `TCX_NEXT`: never change the packet's fate.
const TC_NEXT: i32 = -1;

/// The records of packets and drops. 8 MiB: a message's later copies are 84-byte records
/// (`copies.rs`), ~1 KB a query in all, and 0 were lost at 20,000 qps in the bench (two
/// runs; 665 of 1.9 million at 4 MiB on a busy machine). Userspace maps its pages twice (the
/// ring's wrap-around), which resident-memory figures count twice: 16 of an idle agent's
/// 47 MiB (32 of 65 at 16 MiB).
#[map]
static EVENTS: RingBuf = RingBuf::with_byte_size(8 * 1024 * 1024, 0);

/// Where a kernel drop that may be a race's loser goes when `EVENTS` is full: under a flood
/// the reader cannot drain (a forwarding loop), packets fill `EVENTS` and a drop — a race's
/// one piece of kernel evidence, rare — was lost with them. Only such drops
/// (`drops::race_like`): the flood's own drops (tens of thousands a second in a loop) filled
/// it before. Read by the run loop's poll once `EVENTS` is drained; no wakeups. 256 KiB:
/// ~390 drops.
#[map]
static DROP_RESERVE: RingBuf = RingBuf::with_byte_size(256 * 1024, 0);

/// Watched ports, at index PORT (`tracer_common::ports`): `PORT_EVERYWHERE` (a `--port`)
/// captures it in every namespace; `PORT_LEARNT` (a port some pod redirects DNS to) only in
/// the namespaces [`LEARNT_PORTS`] holds it for. One lookup decides a packet on neither.
#[map]
static PORTS: Array<u8> = Array::with_max_entries(65536, 0);

/// (namespace, port) pairs userspace learnt from conntrack: a pod redirects a watched port to
/// this one (its DNS proxy). Looked up only for a packet whose port is `PORT_LEARNT` and not
/// `PORT_EVERYWHERE`, with the packet's namespace ([`netns_id`]): a pod's proxy on 443 or
/// 8080 costs every other namespace's traffic on that port one lookup, not a copy.
#[map]
static LEARNT_PORTS: HashMap<LearntPort, u8> = HashMap::with_max_entries(MAX_LEARNT_PORTS, 0);

/// Per-CPU scratch space where a packet event is built before it is copied into the ring
/// buffer with only the bytes it needs (a DNS packet is ~100 bytes; the event can hold 4 KB).
#[map]
static SCRATCH: PerCpuArray<PacketEvent> = PerCpuArray::with_max_entries(1, 0);

/// Fragmented datagrams on a watched port → when their first fragment was seen (boot ns).
/// Later fragments carry no ports: they are captured (and their drops reported) when their
/// key is here and fresh. Shared by every instance, so a datagram whose first fragment was
/// seen at one hop is followed at the next. A later fragment that arrives before the first
/// is not captured (userspace then reports that fragment as never seen).
#[map]
static FRAGS: LruHashMap<FragKey, u64> = LruHashMap::with_max_entries(MAX_FRAG_KEYS, 0);

#[map]
static COUNTERS: PerCpuArray<u64> = PerCpuArray::with_max_entries(counter::COUNT, 0);

#[unsafe(no_mangle)]
static CONFIG: CaptureConfig = CaptureConfig {
    snaplen: tracer_common::DEFAULT_SNAPLEN,
    _reserved: 0,
};

/// Id of the network namespace whose interfaces this instance is attached to (its cookie,
/// or its inode number on kernels without `SO_NETNS_COOKIE`), for kernels without BTF only:
/// userspace then loads one instance of the TC programs per namespace. With BTF one instance
/// serves every namespace and [`netns_id`] reads the packet's own. (`bpf_get_netns_cookie`
/// in TC reports the namespace of `skb->sk` and falls back to init_net for forwarded and
/// received packets, which have none.)
#[unsafe(no_mangle)]
static NETNS_COOKIE: u64 = 0;

#[unsafe(no_mangle)]
static KERNEL_OFFSETS: KernelOffsets = KernelOffsets::UNSET;

/// Backlog step at which a record wakes the reader. The ring buffer's default wakes the
/// reader for every record it finds idle: at a few thousand packets per second that is a
/// wakeup (irq_work, then a scheduler wakeup, in the sending task's context) per packet —
/// ~8 µs per egress run at 2k qps — and a userspace batch of one record. Instead a record
/// wakes the reader when the bytes waiting cross a multiple of this step (one wakeup per
/// 256 KiB of backlog, however many CPUs add to it; a crossing missed in a race is made up
/// at the next), and below it records wait for the reader's own poll every 50 ms
/// (`pipeline::TICK`).
const WAKEUP_BYTES: u64 = 256 * 1024;

/// `BPF_RB_FORCE_WAKEUP` if adding `len` bytes crosses a multiple of [`WAKEUP_BYTES`] of
/// backlog, else `BPF_RB_NO_WAKEUP`.
#[inline(always)]
fn wakeup_flag(len: u64) -> u64 {
    let waiting = EVENTS.query(BPF_RB_AVAIL_DATA as u64);
    if waiting / WAKEUP_BYTES != (waiting + len) / WAKEUP_BYTES {
        BPF_RB_FORCE_WAKEUP as u64
    } else {
        BPF_RB_NO_WAKEUP as u64
    }
}

#[inline(always)]
fn count(index: u32) {
    if let Some(slot) = COUNTERS.get_ptr_mut(index) {
        // SAFETY: per-CPU slot, not shared with other CPUs.
        unsafe { *slot += 1 };
    }
}

/// `port`'s bits in [`PORTS`]: 0 when it is not captured anywhere.
#[inline(always)]
fn port_flags(port: u16) -> u8 {
    PORTS.get(port as u32).map_or(0, |v| *v)
}

/// Whether `port` is captured in some namespace.
#[inline(always)]
fn watched(port: u16) -> bool {
    port_flags(port) != 0
}

/// Whether to report this packet: `Some(0)` for a port watched everywhere, or a later fragment
/// of a datagram whose first fragment was on one (within [`FRAG_KEY_LIFETIME_NS`]);
/// `Some(ports)` (source port in the high half) when only a learnt port matched, which
/// [`learnt_here`] decides once the packet's namespace is known; `None` for neither. With
/// `remember`, a first fragment on a port watched everywhere records its datagram's key.
/// A learnt port's fragments are not followed: it carries a pod's DNS to its own proxy,
/// over `lo` (64 KiB MTU), where nothing is fragmented.
#[inline(always)]
fn wanted<P: packet::PacketRead>(
    p: &P,
    t: &packet::Transport,
    remember: bool,
) -> Result<Option<u32>, ()> {
    if t.frag == packet::FRAG_LATER {
        let key = packet::frag_key(p, t)?;
        // SAFETY: the value is a plain u64 read while the map holds it.
        let Some(seen) = (unsafe { FRAGS.get(&key) }) else {
            return Ok(None);
        };
        // SAFETY: helper call.
        let now = unsafe { bpf_ktime_get_boot_ns() };
        return Ok((now.saturating_sub(*seen) < FRAG_KEY_LIFETIME_NS).then_some(0));
    }
    let flags = port_flags(t.sport) | port_flags(t.dport);
    if flags & PORT_EVERYWHERE != 0 {
        if remember && t.frag == packet::FRAG_FIRST {
            let key = packet::frag_key(p, t)?;
            // SAFETY: helper call.
            let now = unsafe { bpf_ktime_get_boot_ns() };
            let _ = FRAGS.insert(&key, &now, 0);
        }
        return Ok(Some(0));
    }
    if flags & PORT_LEARNT != 0 {
        return Ok(Some(((t.sport as u32) << 16) | t.dport as u32));
    }
    Ok(None)
}

/// Whether namespace `netns` learnt either of `ports` (as [`wanted`] returns them).
#[inline(always)]
fn learnt_here(netns: u64, ports: u32) -> bool {
    let learnt = |port: u32| {
        let key = LearntPort {
            netns,
            port: port as u16,
            _pad: [0; 6],
        };
        // SAFETY: only whether the map holds the key is read.
        unsafe { LEARNT_PORTS.get(&key) }.is_some()
    };
    learnt(ports >> 16) || learnt(ports & 0xffff)
}

/// TC classifier on ingress of devices with an Ethernet header (veth, physical NICs, `lo`).
/// Also copies later IP fragments of datagrams whose first fragment was on a watched port.
///
/// Hook: `tcx/ingress` (Linux ≥ 6.6) or clsact `ingress` (≥ 4.5); ring buffer ≥ 5.8.
#[classifier]
pub fn dnspath_tc_eth_ingress(ctx: TcContext) -> i32 {
    tc(&ctx, true, Dir::Ingress as u8)
}

/// As [`dnspath_tc_eth_ingress`], on egress (`tcx/egress` or clsact `egress`).
#[classifier]
pub fn dnspath_tc_eth_egress(ctx: TcContext) -> i32 {
    tc(&ctx, true, Dir::Egress as u8)
}

/// TC classifier on ingress of devices without a link-layer header (tun, wireguard, ipip):
/// the packet starts at its IP header and `skb->protocol` says which.
#[classifier]
pub fn dnspath_tc_raw_ingress(ctx: TcContext) -> i32 {
    tc(&ctx, false, Dir::Ingress as u8)
}

/// As [`dnspath_tc_raw_ingress`], on egress.
#[classifier]
pub fn dnspath_tc_raw_egress(ctx: TcContext) -> i32 {
    tc(&ctx, false, Dir::Egress as u8)
}

#[inline(always)]
fn tc(ctx: &TcContext, has_eth: bool, dir: u8) -> i32 {
    match try_tc(ctx, has_eth, dir) {
        Ok(()) => {}
        Err(()) => {
            count(counter::PARSE_FAILED);
            // SAFETY: the context pointer is valid for the whole program run.
            let ifindex = unsafe { (*ctx.skb.skb).ifindex };
            debug!(
                ctx,
                target: LOG_TARGET,
                "ifindex {} len {}: headers unreadable (cut or malformed); counted in parse_failed",
                ifindex,
                ctx.len()
            );
        }
    }
    TC_NEXT
}

/// Target of the kernel programs' diagnostics (`dnspath -vv`; `aya-log`). Userspace sets
/// `AYA_LOG_LEVEL` to 0 at load unless asked for them: the verifier then drops every log
/// statement as dead code, and they cost nothing.
const LOG_TARGET: &str = "dnspath::kernel";

/// Says (at trace level, `-vv`) why a packet the linear walk left alone was not inspected,
/// when the reason is an encapsulation the walker does not enter: MPLS, PPPoE, VLAN tags
/// beyond two. (One level of VXLAN, Geneve, GRE and IP-in-IP is entered; a tunnel inside a
/// tunnel is not, and not said.) A few plain loads, no second walk: with logging on, the programs
/// stay cheap enough to verify on a slow machine. Nothing runs unless trace logging was
/// enabled at load.
#[inline(always)]
fn explain_skip(ctx: &TcContext, p: &packet::Linear, has_eth: bool, skb_protocol: u32) {
    if !aya_log_ebpf::macro_support::level_enabled(aya_log_ebpf::macro_support::Level::Trace) {
        return;
    }
    let (ethertype, l3) = if has_eth {
        match p.ptr_at::<u16>(12) {
            Ok(e) => (u16::from_be(e), 14usize),
            Err(()) => return,
        }
    } else {
        (u16::from_be(skb_protocol as u16), 0usize)
    };
    let what = match ethertype {
        0x8847 | 0x8848 => "MPLS",
        0x8863 | 0x8864 => "PPPoE",
        ETH_P_8021Q | ETH_P_8021AD | ETH_P_QINQ1 => match p.ptr_at::<[u16; 4]>(l3) {
            // A tag, then a tag, then yet another.
            Ok(t)
                if matches!(u16::from_be(t[1]), ETH_P_8021Q | ETH_P_8021AD)
                    && matches!(u16::from_be(t[3]), ETH_P_8021Q | ETH_P_8021AD | ETH_P_QINQ1) =>
            {
                "VLAN tags beyond two"
            }
            _ => return,
        },
        _ => return,
    };
    // SAFETY: the context pointer is valid for the whole program run.
    let ifindex = unsafe { (*ctx.skb.skb).ifindex };
    trace!(
        ctx,
        target: LOG_TARGET,
        "ifindex {} ethertype {:x}: {} not inspected",
        ifindex,
        ethertype,
        what
    );
}

#[inline(always)]
fn try_tc(ctx: &TcContext, has_eth: bool, dir: u8) -> Result<(), ()> {
    let skb: *mut __sk_buff = ctx.skb.skb;
    // SAFETY: the context pointer is valid for the whole program run.
    let (vlan_present, meta_tci, skb_protocol) =
        unsafe { ((*skb).vlan_present, (*skb).vlan_tci, (*skb).protocol) };
    // Most packets of a node are not DNS: the linear bytes decide them with plain loads.
    // What they cannot decide (headers outside the linear part, malformed headers, later IP
    // fragments) is walked again through `bpf_skb_load_bytes`, which reads paged data too and
    // counts what it cannot parse.
    let linear = packet::Linear {
        data: ctx.data(),
        end: ctx.data_end(),
    };
    let found = match walk(&linear, has_eth, skb_protocol) {
        Ok(Some(found)) => found,
        Ok(None) => {
            explain_skip(ctx, &linear, has_eth, skb_protocol);
            return Ok(());
        }
        Err(()) => match walk(ctx, has_eth, skb_protocol)? {
            Some(found) => found,
            None => return Ok(()),
        },
    };
    let Some(ev) = SCRATCH.get_ptr_mut(0) else {
        count(counter::PACKETS_MATCHED);
        count(counter::PACKETS_LOST_COPY);
        return Ok(());
    };
    // SAFETY: `ev` is this CPU's scratch event; the area used is past any packet bytes.
    let t = unsafe { forget_ranges(ev, found) };
    let netns = netns_id(skb);
    if t.learnt != 0 && !learnt_here(netns, t.learnt) {
        return Ok(());
    }
    count(counter::PACKETS_MATCHED);
    let vlan_tci: u16 = if t.tci & TCI_PRESENT != 0 {
        t.tci as u16
    } else if vlan_present != 0 {
        // With VLAN offload the tag is in skb metadata and the payload starts at 14.
        meta_tci as u16
    } else {
        0
    };
    let l4_hdr = if t.frag == packet::FRAG_LATER {
        // Fragment data follows the IP header: the snaplen counts from there.
        0
    } else if t.proto == IPPROTO_TCP {
        let doff = ctx.ptr_at::<u8>(t.l4_off + 12)?;
        ((doff >> 4) as usize) * 4
    } else {
        UDP_HEADER_LEN
    };

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
    // Only a tunnel's headers reach past MAX_PACKET_DATA's room for them: its payload is
    // then cut a little shorter (and said so by userspace), not lost.
    let cap = if cap > MAX_PACKET_DATA {
        MAX_PACKET_DATA
    } else {
        cap
    };
    if cap == 0 {
        count(counter::PACKETS_LOST_COPY);
        return Ok(());
    }
    let cap = packet::bounded_len(cap as u32, PACKET_DATA_MASK as u32);

    // SAFETY: `ev` points at this CPU's scratch PacketEvent; programs do not nest on a CPU
    // for TC. `cap` is in 1..=PACKET_DATA_BUF, the size of `data`.
    unsafe {
        (*ev).hdr = PacketHeader {
            kind: EventKind::Packet as u32,
            cpu: bpf_get_smp_processor_id(),
            ts_ns: bpf_ktime_get_boot_ns(),
            netns_cookie: netns,
            ifindex: (*skb).ifindex,
            orig_len: pkt_len as u32,
            cap_len: cap,
            vlan_tci,
            dir,
            _reserved: 0,
            msg: 0,
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
        if t.proto == IPPROTO_UDP && t.frag == packet::FRAG_NONE && storm::shedding() {
            // The hash loop gets its inputs back from map memory, which the verifier does
            // not track: every parse path (VLANs, IPv4 options, IPv6 chains) then reaches
            // the loop in the same state and it is verified once, not once per path.
            let arg = (*ev).data.as_mut_ptr().add(SHED_ARG) as *mut u32;
            core::ptr::write_volatile(arg, ((t.l4_off - t.l3_off) + 8) as u32);
            let dns = core::ptr::read_volatile(arg) as usize;
            let len = core::ptr::read_volatile(&(*ev).hdr.cap_len) as usize;
            if let Some(h) = storm::question_hash(&mut (*ev).data, dns, len) {
                if storm::shed_packet(h) {
                    return Ok(());
                }
            }
        }
        // A plain UDP datagram: a later copy of a message sent whole goes as its headers.
        let sighting = if t.proto == IPPROTO_UDP && t.frag == packet::FRAG_NONE {
            match socket_of(skb) {
                Some(sk) => copies::sighting(
                    ev,
                    skb as u64,
                    sk,
                    (t.l4_off - t.l3_off) + UDP_HEADER_LEN,
                    pkt_len,
                ),
                None => None,
            }
        } else {
            None
        };
        if let Some(s) = &sighting {
            if let Some(msg) = copies::copy_of(s) {
                (*ev).hdr.kind = EventKind::Copy as u32;
                (*ev).hdr.msg = msg;
                (*ev).hdr.cap_len = s.hdr_len;
                let len = PACKET_HEADER_LEN + (s.hdr_len as usize & COPY_HEADERS_MASK);
                let bytes = core::slice::from_raw_parts(ev as *const u8, len);
                if EVENTS
                    .output::<[u8]>(bytes, wakeup_flag(bytes.len() as u64))
                    .is_err()
                {
                    count(counter::PACKETS_LOST_RINGBUF);
                } else {
                    count(counter::PACKETS_COPIED);
                }
                return Ok(());
            }
            (*ev).hdr.msg = copies::next_id();
        }
        let bytes = core::slice::from_raw_parts(ev as *const u8, PACKET_HEADER_LEN + cap as usize);
        if EVENTS
            .output::<[u8]>(bytes, wakeup_flag(bytes.len() as u64))
            .is_err()
        {
            count(counter::PACKETS_LOST_RINGBUF);
        } else if let Some(s) = &sighting {
            let msg = (*ev).hdr.msg;
            if msg != 0 {
                copies::remember(s, msg);
            }
        }
    }
    Ok(())
}

/// Bounds a copy record's header bytes for the verifier (`tracer_common::copies::MAX_HEADERS`
/// is below it).
const COPY_HEADERS_MASK: usize = 127;

/// The id of the network namespace of the device the packet is on — `skb->dev->nd_net`'s
/// cookie (its `ns.inum` before Linux 5.14, as userspace names namespaces there) — read with
/// the struct offsets userspace took from the kernel's BTF, so that one loaded, verified set
/// of TC programs serves every namespace it is attached in. Three probe reads, for copied
/// packets only. Without those offsets (no BTF): this instance's [`NETNS_COOKIE`], since
/// userspace then loads an instance per namespace.
#[inline(always)]
fn netns_id(skb: *mut __sk_buff) -> u64 {
    // A volatile read of the address hides KERNEL_OFFSETS' initializer (see drops.rs).
    // SAFETY: a read of a local holding the address of a plain global set before load.
    let o: &KernelOffsets = unsafe { &*read_volatile(&(&raw const KERNEL_OFFSETS)) };
    if o.dev_nd_net == 0 || o.skb_dev == 0 {
        // SAFETY: read of a plain global that userspace sets before load.
        return unsafe { read_volatile(&NETNS_COOKIE) };
    }
    // The context is the kernel's `struct sk_buff` (the verifier rewrites `__sk_buff`
    // field loads into it); its fields beyond `__sk_buff` are read like any kernel memory.
    let skb = skb as u64;
    // SAFETY: every read of kernel memory goes through bpf_probe_read_kernel, which faults
    // safely on a bad address.
    unsafe {
        let Ok(dev) = drops::kread::<u64>(skb, o.skb_dev) else {
            return 0;
        };
        let Ok(net) = drops::kread::<u64>(dev, o.dev_nd_net) else {
            return 0;
        };
        if net == 0 {
            0
        } else if o.net_id_is_inum != 0 {
            drops::kread::<u32>(net, o.net_cookie).map_or(0, u64::from)
        } else {
            drops::kread::<u64>(net, o.net_cookie).unwrap_or(0)
        }
    }
}

/// `skb->sk` (0 for none), read with the offsets from BTF; `None` without them (or when
/// the read fails): then no message takes part in `copies`.
#[inline(always)]
fn socket_of(skb: *mut __sk_buff) -> Option<u64> {
    // SAFETY: as in `netns_id`.
    let o: &KernelOffsets = unsafe { &*read_volatile(&(&raw const KERNEL_OFFSETS)) };
    if o.skb_sk == 0 {
        return None;
    }
    // SAFETY: bpf_probe_read_kernel faults safely on a bad address.
    unsafe { drops::kread::<u64>(skb as u64, o.skb_sk).ok() }
}

/// A packet to copy: where its IP and transport headers start, its protocol, its fragment
/// kind ([`packet::FRAG_NONE`] ...), the innermost in-packet VLAN tag ([`TCI_PRESENT`] set
/// when there is one), and, when only a learnt port matched, its ports ([`wanted`]): copied
/// only if its namespace learnt one.
struct Found {
    l3_off: usize,
    l4_off: usize,
    proto: u8,
    frag: u8,
    tci: u32,
    learnt: u32,
}

/// In [`Found::tci`]: a tag was in the packet.
const TCI_PRESENT: u32 = 1 << 16;

/// Link layer, IP and transport headers of the packet `p`, read by the walker shared with the
/// drop program: `Ok(None)` for a packet not to copy, `Err` when a header cannot be read.
#[inline(always)]
fn walk<P: packet::PacketRead>(
    p: &P,
    has_eth: bool,
    skb_protocol: u32,
) -> Result<Option<Found>, ()> {
    let (ethertype, l3_off, tci) = if has_eth {
        let (ethertype, off, tci) = packet::ethernet(p)?;
        (ethertype, off, tci.map_or(0, |t| t as u32 | TCI_PRESENT))
    } else {
        (u16::from_be(skb_protocol as u16), 0usize, 0)
    };
    let Some(n) = packet::network(p, ethertype, l3_off)? else {
        return Ok(None);
    };
    if let Some(t) = packet::ports(p, &n, l3_off)? {
        if let Some(learnt) = wanted(p, &t, true)? {
            return Ok(Some(Found {
                l3_off: t.l3_off,
                l4_off: t.l4_off,
                proto: t.proto,
                frag: t.frag,
                tci,
                learnt,
            }));
        }
    }
    let Some((inner_type, inner_off)) = packet::tunnel(p, &n)? else {
        return Ok(None);
    };
    tunnelled(p, l3_off, tci, inner_type, inner_off)
}

/// Where [`tunnelled`] passes its arguments through memory (four u32s before `FOUND_ARG`).
const TUNNEL_ARG: usize = FOUND_ARG - 16;
const _: () = assert!(TUNNEL_ARG >= MAX_PACKET_DATA);

/// Largest offset of a tunnel's inner IP header walked (outer IPv6 with extension headers,
/// Geneve with options, VLAN tags inside): a mask the verifier bounds it by.
const INNER_OFF_MASK: u32 = 511;
/// Largest offset of the outer IP header (after two VLAN tags): a mask.
const OUTER_OFF_MASK: u32 = 63;

/// The packet inside one level of tunnel, its inner IP header at `inner_off`: copied (from
/// the outer IP header `l3_off` on, encapsulation and all; userspace walks it again) when
/// its own ports, or its fragment key, are watched. The arguments go through this CPU's
/// scratch event, so the verifier walks the inner headers once for every outer layout
/// (VLAN tags, IPv4 options, IPv6 extension headers, Geneve options), not once per layout.
#[inline(always)]
fn tunnelled<P: packet::PacketRead>(
    p: &P,
    l3_off: usize,
    tci: u32,
    inner_type: u16,
    inner_off: usize,
) -> Result<Option<Found>, ()> {
    let Some(ev) = SCRATCH.get_ptr_mut(0) else {
        return Ok(None);
    };
    // SAFETY: TUNNEL_ARG..TUNNEL_ARG + 16 is inside `data`, past MAX_PACKET_DATA (asserted);
    // `ev` is this CPU's scratch event.
    let arg = unsafe { (*ev).data.as_mut_ptr().add(TUNNEL_ARG) as *mut u32 };
    // SAFETY: `arg` as above.
    let (l3_off, tci, inner_type, inner_off) = unsafe {
        core::ptr::write_volatile(arg, l3_off as u32);
        core::ptr::write_volatile(arg.add(1), tci);
        core::ptr::write_volatile(arg.add(2), inner_type as u32);
        core::ptr::write_volatile(arg.add(3), inner_off as u32);
        (
            core::ptr::read_volatile(arg),
            core::ptr::read_volatile(arg.add(1)),
            core::ptr::read_volatile(arg.add(2)) as u16,
            core::ptr::read_volatile(arg.add(3)),
        )
    };
    if inner_off > INNER_OFF_MASK || l3_off > OUTER_OFF_MASK {
        return Ok(None);
    }
    // The offsets used are masked from a second read: after the check above LLVM drops a
    // mask of the same value as redundant, and where it then spills the value and reloads a
    // copy, 5.10's and 6.1's verifiers do not carry the check's bound to the copy ("R1
    // offset is outside of the packet"; 6.12's do).
    // SAFETY: as above.
    let (inner_off, l3_off) = unsafe {
        (
            (core::ptr::read_volatile(arg.add(3)) & INNER_OFF_MASK) as usize,
            (core::ptr::read_volatile(arg) & OUTER_OFF_MASK) as usize,
        )
    };
    let Some(t) = packet::transport(p, inner_type, inner_off)? else {
        return Ok(None);
    };
    let Some(learnt) = wanted(p, &t, true)? else {
        return Ok(None);
    };
    Ok(Some(Found {
        l3_off,
        l4_off: t.l4_off,
        proto: t.proto,
        frag: t.frag,
        tci,
        learnt,
    }))
}

/// `found` written to and read back from this CPU's scratch event (past any packet bytes): the
/// verifier then knows nothing of the values either walk left, so the copy below is verified
/// once, not once per walk and header layout. Every use of them is bounded again.
///
/// # Safety
/// `ev` is this CPU's scratch event.
#[inline(always)]
unsafe fn forget_ranges(ev: *mut PacketEvent, found: Found) -> Found {
    // SAFETY: FOUND_ARG..FOUND_ARG + 24 is inside `data`, past MAX_PACKET_DATA (asserted).
    unsafe {
        let arg = (*ev).data.as_mut_ptr().add(FOUND_ARG) as *mut u32;
        core::ptr::write_volatile(arg, found.l3_off as u32);
        core::ptr::write_volatile(arg.add(1), found.l4_off as u32);
        core::ptr::write_volatile(arg.add(2), found.proto as u32);
        core::ptr::write_volatile(arg.add(3), found.frag as u32);
        core::ptr::write_volatile(arg.add(4), found.tci);
        core::ptr::write_volatile(arg.add(5), found.learnt);
        Found {
            l3_off: core::ptr::read_volatile(arg) as usize,
            l4_off: core::ptr::read_volatile(arg.add(1)) as usize,
            proto: core::ptr::read_volatile(arg.add(2)) as u8,
            frag: core::ptr::read_volatile(arg.add(3)) as u8,
            tci: core::ptr::read_volatile(arg.add(4)),
            learnt: core::ptr::read_volatile(arg.add(5)),
        }
    }
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";

const _: () = assert!(size_of::<PacketEvent>() <= 8192 + 64);
