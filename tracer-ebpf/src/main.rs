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
        generated::{self as gen, bpf_skb_load_bytes},
    },
    macros::{btf_tracepoint, classifier, kprobe, kretprobe, map},
    maps::{Array, HashMap, LruHashMap, PerCpuArray, PerCpuHashMap, RingBuf},
    programs::{BtfTracePointContext, ProbeContext, RetProbeContext, TcContext},
};
use aya_log_ebpf::{debug, trace};
use packet::PacketRead as _;
use tracer_common::{
    counter,
    proto::{
        ETH_P_8021AD, ETH_P_8021Q, ETH_P_IP, ETH_P_IPV6, ETH_P_QINQ1, IPPROTO_DSTOPTS,
        IPPROTO_FRAGMENT, IPPROTO_HOPOPTS, IPPROTO_ROUTING, IPPROTO_TCP, IPPROTO_UDP,
        UDP_HEADER_LEN,
    },
    shed, CaptureConfig, CtTuple, Dir, DropEvent, EventKind, FragKey, KernelOffsets, PacketEvent,
    PacketHeader, DROP_DATA_MASK, FRAG_KEY_LIFETIME_NS, MAX_DROP_DATA, MAX_FRAG_KEYS,
    MAX_PACKET_DATA, MAX_SNAPLEN, PACKET_DATA_MASK, PACKET_HEADER_LEN,
};

mod packet;

/// Where in a `PacketEvent`'s data buffer the shedding check passes its argument: past
/// anything a packet can fill.
const SHED_ARG: usize = tracer_common::PACKET_DATA_BUF - 8;
const _: () = assert!(SHED_ARG >= MAX_PACKET_DATA);

/// Where [`forget_ranges`] passes a [`Found`] through memory (five u32s before `SHED_ARG`).
const FOUND_ARG: usize = SHED_ARG - 24;
const _: () = assert!(FOUND_ARG >= MAX_PACKET_DATA);

/// Longest question name (wire form) the TC programs hash: each byte costs the verifier
/// ~170 steps in every TC program of every namespace, and loop names are short (CoreDNS's
/// probe, cluster names). A longer looping name is shed in userspace after copying.
const SHED_NAME_BYTES: usize = 128;

/// `TC_ACT_UNSPEC`, which is also `TCX_NEXT`: never change the packet's fate.
const TC_NEXT: i32 = -1;

#[map]
static EVENTS: RingBuf = RingBuf::with_byte_size(16 * 1024 * 1024, 0);

/// Watched ports: a non-zero value at index PORT means "capture".
#[map]
static PORTS: Array<u8> = Array::with_max_entries(65536, 0);

/// Per-CPU scratch space where a packet event is built before it is copied into the ring
/// buffer with only the bytes it needs (a DNS packet is ~100 bytes; the event can hold 4 KB).
#[map]
static SCRATCH: PerCpuArray<PacketEvent> = PerCpuArray::with_max_entries(1, 0);

/// The skb of the `__nf_conntrack_confirm` call in progress on this CPU (netfilter hooks
/// run with bottom halves off: entry and return are on the same CPU, not nested).
#[map]
static CONFIRM_SKB: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);

/// skbs whose conntrack confirm returned `NF_DROP` → when; the drop program consumes them.
#[map]
static CONFIRM_FAILED: LruHashMap<u64, u64> = LruHashMap::with_max_entries(1024, 0);

/// Fragmented datagrams on a watched port → when their first fragment was seen (boot ns).
/// Later fragments carry no ports: they are captured (and their drops reported) when their
/// key is here and fresh. Shared by every instance, so a datagram whose first fragment was
/// seen at one hop is followed at the next. A later fragment that arrives before the first
/// is not captured (userspace then reports that fragment as never seen).
#[map]
static FRAGS: LruHashMap<FragKey, u64> = LruHashMap::with_max_entries(MAX_FRAG_KEYS, 0);

/// Storm shedding (see `tracer_common::shed`): question hashes userspace wants only counted.
/// Filled by userspace only, after it created the question's `SHED_COUNT` entry.
#[map]
static SHED_ON: HashMap<u64, u8> = HashMap::with_max_entries(shed::MAX_KEYS, 0);

/// Per question in `SHED_ON`, per CPU: packets counted instead of copied. Userspace creates
/// each entry (zeroed on every CPU) before the question goes into `SHED_ON`, and deletes it
/// only after a last read that follows the question's removal from `SHED_ON`: the counts are
/// exact.
#[map]
static SHED_COUNT: PerCpuHashMap<u64, u64> = PerCpuHashMap::with_max_entries(shed::MAX_KEYS, 0);

/// Slot 0: how many questions `SHED_ON` holds; 0 spares every packet the hashing.
#[map]
static SHED_ACTIVE: Array<u32> = Array::with_max_entries(1, 0);

#[map]
static COUNTERS: PerCpuArray<u64> = PerCpuArray::with_max_entries(counter::COUNT, 0);

#[unsafe(no_mangle)]
static CONFIG: CaptureConfig = CaptureConfig {
    snaplen: tracer_common::DEFAULT_SNAPLEN,
    _reserved: 0,
};

/// Id of the network namespace whose interfaces this instance is attached to (its cookie,
/// or its inode number on kernels without `SO_NETNS_COOKIE`). Userspace loads one instance of
/// the TC programs per namespace: `bpf_get_netns_cookie` in TC reports the namespace of
/// `skb->sk` and falls back to init_net for forwarded and received packets, which have none.
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

/// Whether to report this packet: a watched port, or a later fragment of a datagram whose
/// first fragment was on one (within [`FRAG_KEY_LIFETIME_NS`]). With `remember`, a first
/// fragment on a watched port records its datagram's key.
#[inline(always)]
fn wanted<P: packet::PacketRead>(p: &P, t: &packet::Transport, remember: bool) -> Result<bool, ()> {
    if t.frag == packet::FRAG_LATER {
        let key = packet::frag_key(p, t)?;
        // SAFETY: the value is a plain u64 read while the map holds it.
        let Some(seen) = (unsafe { FRAGS.get(&key) }) else {
            return Ok(false);
        };
        // SAFETY: helper call.
        let now = unsafe { bpf_ktime_get_boot_ns() };
        return Ok(now.saturating_sub(*seen) < FRAG_KEY_LIFETIME_NS);
    }
    let hit = watched(t.sport) || watched(t.dport);
    if hit && remember && t.frag == packet::FRAG_FIRST {
        let key = packet::frag_key(p, t)?;
        // SAFETY: helper call.
        let now = unsafe { bpf_ktime_get_boot_ns() };
        let _ = FRAGS.insert(&key, &now, 0);
    }
    Ok(hit)
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
/// when the reason is an encapsulation the walker does not enter: more than two VLAN tags,
/// MPLS, PPPoE, IP-in-IP, GRE, an IPv6 extension chain longer than the walker follows, or a
/// VXLAN/Geneve tunnel. Nothing is read unless trace logging was enabled at load.
#[inline(always)]
fn explain_skip(ctx: &TcContext, p: &packet::Linear, has_eth: bool, skb_protocol: u32) {
    if !aya_log_ebpf::macro_support::level_enabled(aya_log_ebpf::macro_support::Level::Trace) {
        return;
    }
    // SAFETY: the context pointer is valid for the whole program run.
    let ifindex = unsafe { (*ctx.skb.skb).ifindex };
    let (ethertype, l3_off) = if has_eth {
        match packet::ethernet(p) {
            Ok((ethertype, off, _)) => (ethertype, off),
            Err(()) => return,
        }
    } else {
        (u16::from_be(skb_protocol as u16), 0usize)
    };
    let what = match ethertype {
        ETH_P_8021Q | ETH_P_8021AD | ETH_P_QINQ1 => "VLAN tags beyond two (or 0x9100 ones)",
        0x8847 | 0x8848 => "MPLS",
        0x8863 | 0x8864 => "PPPoE",
        ETH_P_IP | ETH_P_IPV6 => match packet::transport(p, ethertype, l3_off) {
            Ok(Some(t)) if t.proto == IPPROTO_UDP && matches!(t.dport, 4789 | 6081 | 8472) => {
                "a VXLAN or Geneve tunnel"
            }
            Ok(Some(_)) | Err(()) => return,
            Ok(None) => match ip_payload_protocol(p, ethertype, l3_off) {
                Some(4) | Some(41) => "IP-in-IP",
                Some(47) => "GRE",
                Some(IPPROTO_HOPOPTS)
                | Some(IPPROTO_ROUTING)
                | Some(IPPROTO_DSTOPTS)
                | Some(IPPROTO_FRAGMENT) => "an IPv6 extension chain longer than four headers",
                _ => return,
            },
        },
        _ => return,
    };
    trace!(
        ctx,
        target: LOG_TARGET,
        "ifindex {} ethertype {:x}: {} not inspected",
        ifindex,
        ethertype,
        what
    );
}

/// The protocol after the IP header (after at most four IPv6 extension headers).
#[inline(always)]
fn ip_payload_protocol(p: &packet::Linear, ethertype: u16, l3_off: usize) -> Option<u8> {
    if ethertype == ETH_P_IP {
        p.ptr_at::<u8>(l3_off + 9).ok()
    } else {
        packet::ipv6_payload_protocol(p, l3_off).ok()
    }
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
    count(counter::PACKETS_MATCHED);
    let Some(ev) = SCRATCH.get_ptr_mut(0) else {
        count(counter::PACKETS_LOST_COPY);
        return Ok(());
    };
    // SAFETY: `ev` is this CPU's scratch event; the area used is past any packet bytes.
    let t = unsafe { forget_ranges(ev, found) };
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
    if cap == 0 || cap > MAX_PACKET_DATA {
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
            netns_cookie: read_volatile(&NETNS_COOKIE),
            ifindex: (*skb).ifindex,
            orig_len: pkt_len as u32,
            cap_len: cap,
            vlan_tci,
            dir,
            _reserved: 0,
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
        if t.proto == IPPROTO_UDP && t.frag == packet::FRAG_NONE && shedding() {
            // The hash loop gets its inputs back from map memory, which the verifier does
            // not track: every parse path (VLANs, IPv4 options, IPv6 chains) then reaches
            // the loop in the same state and it is verified once, not once per path.
            let arg = (*ev).data.as_mut_ptr().add(SHED_ARG) as *mut u32;
            core::ptr::write_volatile(arg, ((t.l4_off - t.l3_off) + 8) as u32);
            let dns = core::ptr::read_volatile(arg) as usize;
            let len = core::ptr::read_volatile(&(*ev).hdr.cap_len) as usize;
            if let Some(h) = question_hash(&mut (*ev).data, dns, len) {
                if shed_packet(h) {
                    return Ok(());
                }
            }
        }
        let bytes = core::slice::from_raw_parts(ev as *const u8, PACKET_HEADER_LEN + cap as usize);
        if EVENTS.output::<[u8]>(bytes, 0).is_err() {
            count(counter::PACKETS_LOST_RINGBUF);
        }
    }
    Ok(())
}

/// A packet to copy: where its IP and transport headers start, its protocol, its fragment
/// kind ([`packet::FRAG_NONE`] ...) and the innermost in-packet VLAN tag ([`TCI_PRESENT`] set
/// when there is one).
struct Found {
    l3_off: usize,
    l4_off: usize,
    proto: u8,
    frag: u8,
    tci: u32,
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
    let Some(t) = packet::transport(p, ethertype, l3_off)? else {
        return Ok(None);
    };
    if !wanted(p, &t, true)? {
        return Ok(None);
    }
    Ok(Some(Found {
        l3_off: t.l3_off,
        l4_off: t.l4_off,
        proto: t.proto,
        frag: t.frag,
        tci,
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
    // SAFETY: FOUND_ARG..FOUND_ARG + 20 is inside `data`, past MAX_PACKET_DATA (asserted).
    unsafe {
        let arg = (*ev).data.as_mut_ptr().add(FOUND_ARG) as *mut u32;
        core::ptr::write_volatile(arg, found.l3_off as u32);
        core::ptr::write_volatile(arg.add(1), found.l4_off as u32);
        core::ptr::write_volatile(arg.add(2), found.proto as u32);
        core::ptr::write_volatile(arg.add(3), found.frag as u32);
        core::ptr::write_volatile(arg.add(4), found.tci);
        Found {
            l3_off: core::ptr::read_volatile(arg) as usize,
            l4_off: core::ptr::read_volatile(arg.add(1)) as usize,
            proto: core::ptr::read_volatile(arg.add(2)) as u8,
            frag: core::ptr::read_volatile(arg.add(3)) as u8,
            tci: core::ptr::read_volatile(arg.add(4)),
        }
    }
}

#[inline(always)]
fn shedding() -> bool {
    matches!(SHED_ACTIVE.get(0), Some(n) if *n != 0)
}

/// Counts the packet instead of copying it if its question is being shed.
#[inline(always)]
fn shed_packet(h: u64) -> bool {
    // SAFETY: presence check only; the value is not read.
    if unsafe { SHED_ON.get(&h) }.is_none() {
        return false;
    }
    let Some(n) = SHED_COUNT.get_ptr_mut(&h) else {
        return false;
    };
    // SAFETY: this CPU's slot; TC programs do not nest on a CPU.
    unsafe { *n += 1 };
    count(counter::PACKETS_SHED);
    true
}

/// `off` as an index of the packet buffer the verifier can bound on every kernel. Offsets
/// here derive from values read back from map memory, whose range LLVM cannot know, so it
/// keeps the mask.
#[inline(always)]
fn data_index(off: usize) -> usize {
    off & PACKET_DATA_MASK
}

/// `tracer_common::shed` hash of the first question of the DNS message at `dns` in
/// `data[..cap]`; `None` if there is none, it is cut, or its name is longer than
/// [`SHED_NAME_BYTES`].
///
/// The name is hashed up to its first zero byte without walking its labels, and every byte
/// of it is lowercased (length bytes are below 64, never ASCII letters): one exit branch per
/// byte, which every verifier since 5.10 follows in a few thousand steps (a label walk
/// multiplied its states). For a name with a zero byte inside a label or a compression
/// pointer this differs from userspace's hash, so such a question is never shed here.
#[inline(always)]
fn question_hash(
    data: &mut [u8; tracer_common::PACKET_DATA_BUF],
    dns: usize,
    cap: usize,
) -> Option<u64> {
    if dns + 12 > cap {
        return None;
    }
    if data[data_index(dns + 4)] | data[data_index(dns + 5)] == 0 {
        return None;
    }
    let mut off = dns + 12;
    let mut h = shed::start();
    let mut ended = false;
    for _ in 0..SHED_NAME_BYTES {
        if off >= cap {
            return None;
        }
        let b = data[data_index(off)];
        off += 1;
        h = shed::step(h, shed::lower(b));
        if b == 0 {
            ended = true;
            break;
        }
    }
    if !ended {
        return None;
    }
    // Through map memory again: the loop leaves at any of 255 offsets, and the rest would be
    // verified once for each.
    // SAFETY: `SHED_ARG..SHED_ARG + 4` is inside `data`, past any packet bytes.
    let off = unsafe {
        let arg = data.as_mut_ptr().add(SHED_ARG) as *mut u32;
        core::ptr::write_volatile(arg, off as u32);
        core::ptr::read_volatile(arg) as usize
    };
    let mut off = off;
    for _ in 0..4 {
        if off >= cap {
            return None;
        }
        h = shed::step(h, data[data_index(off)]);
        off += 1;
    }
    Some(h)
}

/// Drops of packets on a watched port, and of later IP fragments of datagrams whose first
/// fragment was on one (`FRAGS`), with the drop reason.
///
/// Hook: BTF-enabled tracepoint `skb:kfree_skb`,
/// `TP_PROTO(struct sk_buff *skb, void *location, enum skb_drop_reason reason, ...)`;
/// the `reason` argument exists since Linux 5.17, `tp_btf` needs kernel BTF (5.5+).
/// Struct offsets come from userspace (`KERNEL_OFFSETS`), read from `/sys/kernel/btf/vmlinux`.
#[btf_tracepoint(function = "kfree_skb")]
pub fn dnspath_kfree_skb(ctx: BtfTracePointContext) -> i32 {
    let reason: u32 = ctx.arg(2);
    kfree_skb(&ctx, reason)
}

/// As [`dnspath_kfree_skb`] on kernels before 5.17, whose tracepoint is
/// `TP_PROTO(struct sk_buff *skb, void *location)`: the verifier rejects a read of a third
/// argument, so drops are reported with reason 0 (`NOT_SPECIFIED`) and their location.
#[btf_tracepoint(function = "kfree_skb")]
pub fn dnspath_kfree_skb_noreason(ctx: BtfTracePointContext) -> i32 {
    kfree_skb(&ctx, 0)
}

#[inline(always)]
fn kfree_skb(ctx: &BtfTracePointContext, reason: u32) -> i32 {
    match try_kfree_skb(ctx, reason) {
        Ok(()) => {}
        Err(()) => {
            count(counter::DROPS_READ_FAILED);
            let skb: u64 = ctx.arg(0);
            debug!(
                ctx,
                target: LOG_TARGET,
                "kfree_skb of skb {:x} (reason {}): its headers could not be read; counted in drops_read_failed",
                skb,
                reason
            );
        }
    }
    0
}

/// Entry of `int __nf_conntrack_confirm(struct sk_buff *skb)`
/// (net/netfilter/nf_conntrack_core.c, all supported kernels; in the `nf_conntrack` module on
/// most distributions). Hook: kprobe, optional (feature-probed; absent without
/// CONFIG_KPROBES): it makes race verdicts exact instead of inferred from counters.
#[kprobe]
pub fn dnspath_confirm_entry(ctx: ProbeContext) -> u32 {
    let skb: u64 = ctx.arg(0).unwrap_or(0);
    if let Some(slot) = CONFIRM_SKB.get_ptr_mut(0) {
        // SAFETY: per-CPU slot.
        unsafe { *slot = skb };
    }
    0
}

/// Return of `__nf_conntrack_confirm`: `NF_DROP` (0) means the entry could not be inserted
/// (`insert_failed`), the clash the kernel could not resolve; the packet is freed next.
/// Hook: kretprobe, optional, paired with [`dnspath_confirm_entry`].
#[kretprobe]
pub fn dnspath_confirm_exit(ctx: RetProbeContext) -> u32 {
    let ret: i32 = ctx.ret();
    let Some(slot) = CONFIRM_SKB.get_ptr_mut(0) else {
        return 0;
    };
    // SAFETY: per-CPU slot.
    let skb = unsafe { *slot };
    if ret == 0 && skb != 0 {
        // SAFETY: helper call with valid key/value pointers.
        let now = unsafe { bpf_ktime_get_boot_ns() };
        let _ = CONFIRM_FAILED.insert(&skb, &now, 0);
    }
    // SAFETY: per-CPU slot.
    unsafe { *slot = 0 };
    0
}

#[inline(always)]
unsafe fn kread<T>(base: u64, off: u32) -> Result<T, ()> {
    // SAFETY: bpf_probe_read_kernel faults safely on a bad address.
    unsafe { bpf_probe_read_kernel((base + off as u64) as *const T).map_err(|_| ()) }
}

#[inline(always)]
fn try_kfree_skb(ctx: &BtfTracePointContext, reason: u32) -> Result<(), ()> {
    let skb: u64 = ctx.arg(0);
    let location: u64 = ctx.arg(1);
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
        // `tail` is an offset from `head` on 64-bit kernels (NET_SKBUFF_DATA_USES_OFFSET):
        // the linear bytes from the network header on are the ones the walker may read.
        let tail: u32 = kread(skb, o.skb_tail)?;
        let linear = (tail as u64).saturating_sub(nh as u64);
        let pkt = packet::KernelPacket {
            base: head + nh as u64,
            len: linear,
        };
        let first: u8 = pkt.ptr_at(0)?;
        let Some(t) = packet::transport(&pkt, packet::ethertype_of_version(first), 0)? else {
            return Ok(());
        };
        // Later fragments of a watched datagram too: a fragment freed by reassembly
        // (timeout, overlap) or by a rule is the reason a large answer never arrives.
        if !wanted(&pkt, &t, false)? {
            return Ok(());
        }
        count(counter::DROPS_MATCHED);

        let len: u32 = kread(skb, o.skb_len)?;
        let data: u64 = kread(skb, o.skb_data)?;
        let data_off = data.saturating_sub(head);
        let Some(mut entry) = EVENTS.reserve::<DropEvent>(0) else {
            count(counter::DROPS_LOST_RINGBUF);
            return Ok(());
        };
        let ev = entry.as_mut_ptr();
        (*ev).kind = EventKind::Drop as u32;
        (*ev).cpu = bpf_get_smp_processor_id();
        (*ev).ts_ns = bpf_ktime_get_boot_ns();
        (*ev).location = location;
        (*ev).reason = reason;
        (*ev)._reserved = 0;
        (*ev).confirm_failed = 0;
        (*ev)._pad = 0;
        // A failed confirm of this skb in the last second (the kprobe pair, where loaded).
        if let Some(at) = CONFIRM_FAILED.get(&skb) {
            if (*ev).ts_ns.saturating_sub(*at) < 1_000_000_000 {
                (*ev).confirm_failed = 1;
            }
            let _ = CONFIRM_FAILED.remove(&skb);
        }
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
        (*ev).netns_cookie = if net == 0 {
            0
        } else if o.net_id_is_inum != 0 {
            kread::<u32>(net, o.net_cookie).unwrap_or(0) as u64
        } else {
            kread(net, o.net_cookie).unwrap_or(0)
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

        // Copy the linear part from the network header, at most MAX_DROP_DATA bytes.
        (*ev).cap_len = 0;
        if linear > 0 {
            let cap = if linear < MAX_DROP_DATA as u64 {
                linear as u32
            } else {
                MAX_DROP_DATA as u32
            };
            let cap = packet::bounded_len(cap, DROP_DATA_MASK as u32);
            if gen::bpf_probe_read_kernel(
                (*ev).data.as_mut_ptr() as *mut c_void,
                cap,
                pkt.base as *const c_void,
            ) == 0
            {
                (*ev).cap_len = cap;
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

const _: () = assert!(size_of::<PacketEvent>() <= 8192 + 64);
