//! The drop program (`tp_btf/kfree_skb`) and the optional conntrack-confirm kprobe pair
//! whose verdict it reports.
use core::{ffi::c_void, mem::size_of, ptr::read_volatile};

use aya_ebpf::{
    helpers::{
        bpf_get_smp_processor_id, bpf_ktime_get_boot_ns, bpf_probe_read_kernel, generated as gen,
    },
    macros::{btf_tracepoint, kprobe, kretprobe, map},
    maps::{LruHashMap, PerCpuArray},
    programs::{BtfTracePointContext, ProbeContext, RetProbeContext},
};
use aya_log_ebpf::debug;
use tracer_common::{
    counter,
    proto::{
        IPPROTO_DSTOPTS, IPPROTO_FRAGMENT, IPPROTO_HOPOPTS, IPPROTO_ROUTING, IPPROTO_TCP,
        IPPROTO_UDP, IPV4_MIN_HEADER_LEN, IPV6_HEADER_LEN,
    },
    CtTuple, DropEvent, EventKind, KernelOffsets, DROP_DATA_MASK, MAX_DROP_DATA, SKB_WINDOW,
};

use crate::{
    count, learnt_here, packet, wakeup_flag, wanted, watched, DROP_RESERVE, EVENTS, KERNEL_OFFSETS,
    LOG_TARGET,
};

/// The skb of the `__nf_conntrack_confirm` call in progress on this CPU (netfilter hooks
/// run with bottom halves off: entry and return are on the same CPU, not nested).
#[map]
static CONFIRM_SKB: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);

/// skbs whose conntrack confirm returned `NF_DROP` → when; the drop program consumes them.
#[map]
static CONFIRM_FAILED: LruHashMap<u64, u64> = LruHashMap::with_max_entries(1024, 0);

/// Where the drop program copies what it decides a freed packet by. Map memory, not stack:
/// it reads them at offsets known only at run time, which 5.10's verifier refuses on the
/// stack.
#[repr(C)]
struct DropScratch {
    /// [`SKB_WINDOW`] bytes of the `sk_buff` (`KernelOffsets::skb_window`); `u64`s, so that
    /// each field read at its aligned offset is an aligned load.
    skb: [u64; SKB_WINDOW / 8],
    /// The start of the packet's headers ([`packet::Copied`]).
    peek: [u8; packet::PEEK_BUF],
}

const _: () = assert!(core::mem::offset_of!(DropScratch, peek) % 8 == 0);

/// One [`DropScratch`] per CPU: tracing programs do not nest on a CPU.
#[map]
static DROP_SCRATCH: PerCpuArray<DropScratch> = PerCpuArray::with_max_entries(1, 0);

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

/// `ct->status` bits (include/uapi/linux/netfilter/nf_conntrack_common.h).
const IPS_CONFIRMED: u64 = 1 << 3;
const IPS_SRC_NAT_DONE: u64 = 1 << 7;
const IPS_DST_NAT_DONE: u64 = 1 << 8;

/// Could this freed skb be a conntrack race's loser (and so worth the reserve ring)? The
/// kprobe pair saw its confirm fail, or its entry went through a NAT hook and was never
/// confirmed: freed inside netfilter. The flood's drops that fill `EVENTS` (full socket
/// buffers, closed ports) are on confirmed entries or none. A superset of what userspace
/// calls a race candidate (`detect::race::is_race_candidate`), which decides.
#[inline(always)]
unsafe fn race_like(o: &KernelOffsets, skb: u64) -> bool {
    // SAFETY: a lookup by value; every read of kernel memory goes through kread.
    unsafe {
        if CONFIRM_FAILED.get(&skb).is_some() {
            return true;
        }
        if o.has_nfct == 0 {
            return false;
        }
        let ct = kread::<u64>(skb, o.skb_nfct).unwrap_or(0) & !7u64;
        if ct == 0 {
            return false;
        }
        match kread::<u64>(ct, o.nfct_status) {
            Ok(s) => s & IPS_CONFIRMED == 0 && s & (IPS_SRC_NAT_DONE | IPS_DST_NAT_DONE) != 0,
            Err(()) => false,
        }
    }
}

#[inline(always)]
pub(crate) unsafe fn kread<T>(base: u64, off: u32) -> Result<T, ()> {
    // SAFETY: bpf_probe_read_kernel faults safely on a bad address.
    unsafe { bpf_probe_read_kernel((base + off as u64) as *const T).map_err(|_| ()) }
}

/// The field of type `T` (`u16`, `u32` or `u64`) at `off` in the copy of the `sk_buff`
/// window at `w`; userspace aligned `off` to the field's size (`SkbWindow`).
///
/// # Safety
/// `w` points at [`SKB_WINDOW`] readable, 8-aligned bytes.
#[inline(always)]
unsafe fn window_field<T: Copy>(w: *const u8, off: u32) -> T {
    // The mask is what the verifier bounds the read by (inside the window) and keeps the
    // load aligned; LLVM cannot see the offset (KERNEL_OFFSETS is read through an opaque
    // pointer), so it keeps the mask.
    let off = off as usize & (SKB_WINDOW - size_of::<T>());
    // SAFETY: `off + size_of::<T>() <= SKB_WINDOW`, and `off` is a multiple of the size.
    unsafe { core::ptr::read(w.add(off) as *const T) }
}

/// `skb->head`, `skb->network_header` and `skb->tail`: from one copy of the window of
/// `sk_buff` that holds them where userspace found one, else with a read each.
#[inline(always)]
fn skb_headers(
    o: &KernelOffsets,
    skb: u64,
    scratch: Option<*mut DropScratch>,
) -> Result<(u64, u16, u32), ()> {
    // SAFETY: every read of kernel memory goes through bpf_probe_read_kernel.
    unsafe {
        match scratch {
            Some(s) if o.has_skb_window != 0 => {
                let w = (*s).skb.as_mut_ptr() as *mut c_void;
                if gen::bpf_probe_read_kernel(
                    w,
                    SKB_WINDOW as u32,
                    (skb + o.skb_window as u64) as *const c_void,
                ) != 0
                {
                    return Err(());
                }
                let w = w as *const u8;
                Ok((
                    window_field::<u64>(w, o.window_head),
                    window_field::<u16>(w, o.window_network_header),
                    window_field::<u32>(w, o.window_tail),
                ))
            }
            _ => Ok((
                kread(skb, o.skb_head)?,
                kread(skb, o.skb_network_header)?,
                kread(skb, o.skb_tail)?,
            )),
        }
    }
}

#[inline(always)]
fn try_kfree_skb(ctx: &BtfTracePointContext, reason: u32) -> Result<(), ()> {
    let skb: u64 = ctx.arg(0);
    // A volatile read of the address hides KERNEL_OFFSETS' initializer (UNSET), which LLVM
    // would otherwise fold into the program; each field is then loaded where it is used,
    // not all of them before the decision.
    // SAFETY: a read of a local holding the address of a plain global set before load.
    let o: &KernelOffsets = unsafe { &*read_volatile(&(&raw const KERNEL_OFFSETS)) };
    if o.skb_head == 0 || skb == 0 {
        return Ok(());
    }
    let scratch = DROP_SCRATCH.get_ptr_mut(0);
    let (head, nh, tail) = skb_headers(o, skb, scratch)?;
    if head == 0 || nh == 0xffff {
        return Ok(());
    }
    // SAFETY: every read of kernel memory goes through bpf_probe_read_kernel.
    unsafe {
        // `tail` is an offset from `head` on 64-bit kernels (NET_SKBUFF_DATA_USES_OFFSET):
        // the linear bytes from the network header on are the ones the walker may read.
        let linear = (tail as u64).saturating_sub(nh as u64);
        let pkt = packet::KernelPacket {
            base: head + nh as u64,
            len: linear,
        };
        // Most freed packets of a node are not DNS: one copy of their first bytes decides
        // them; headers further in are read from the packet itself.
        let decided = match scratch {
            Some(s) if linear > 0 => {
                let buf = (*s).peek.as_mut_ptr();
                let n = if linear < packet::PEEK as u64 {
                    linear as u32
                } else {
                    packet::PEEK as u32
                };
                let n = packet::bounded_len(n, (packet::PEEK - 1) as u32);
                if gen::bpf_probe_read_kernel(buf as *mut c_void, n, pkt.base as *const c_void) == 0
                {
                    let copied = packet::Copied {
                        buf: buf as *const u8,
                        len: n as usize,
                    };
                    if plainly_unwanted(&copied) {
                        Some(None)
                    } else {
                        drop_wanted(&copied).ok()
                    }
                } else {
                    None
                }
            }
            _ => None,
        };
        let want = match decided {
            Some(w) => w,
            None => drop_wanted(&pkt)?,
        };
        let Some(learnt) = want else {
            return Ok(());
        };
        // The namespace of the device the packet was on, or of its socket.
        let dev: u64 = kread(skb, o.skb_dev).unwrap_or(0);
        let (ifindex, net): (u32, u64) = if dev != 0 {
            (
                kread(dev, o.dev_ifindex).unwrap_or(0),
                kread(dev, o.dev_nd_net).unwrap_or(0),
            )
        } else {
            let sk: u64 = kread(skb, o.skb_sk).unwrap_or(0);
            let net = if sk != 0 {
                kread(sk, o.sk_net).unwrap_or(0)
            } else {
                0
            };
            (0, net)
        };
        let netns: u64 = if net == 0 {
            0
        } else if o.net_id_is_inum != 0 {
            kread::<u32>(net, o.net_cookie).unwrap_or(0) as u64
        } else {
            kread(net, o.net_cookie).unwrap_or(0)
        };
        if learnt != 0 && !learnt_here(netns, learnt) {
            return Ok(());
        }
        let location: u64 = ctx.arg(1);
        count(counter::DROPS_MATCHED);

        let len: u32 = kread(skb, o.skb_len)?;
        let data: u64 = kread(skb, o.skb_data)?;
        let data_off = data.saturating_sub(head);
        // `EVENTS` full: the reserve ring (read once `EVENTS` is drained) takes what may
        // be a race's evidence, never the flood's ordinary drops (which would fill it).
        let entry = match EVENTS.reserve::<DropEvent>(0) {
            Some(e) => Some(e),
            None if race_like(o, skb) => DROP_RESERVE.reserve::<DropEvent>(0),
            None => None,
        };
        let Some(mut entry) = entry else {
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

        (*ev).ifindex = ifindex;
        (*ev).netns_cookie = netns;

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
        entry.submit(wakeup_flag(core::mem::size_of::<DropEvent>() as u64));
    }
    Ok(())
}

/// The decision for what most freed packets are, from aligned loads of their copied
/// headers: true for an IPv4 packet, or an IPv6 packet without extension headers, that is not
/// UDP/TCP, or is UDP/TCP (not a later fragment) on no watched port — what [`drop_wanted`]
/// would decide, without its dependent loads; and for what is not IP at all. false: let
/// `drop_wanted` decide (every packet it may want, and every one this cannot read whole:
/// short copies, bad headers, later fragments, extension headers).
#[inline(always)]
fn plainly_unwanted(c: &packet::Copied) -> bool {
    // RFC 791 §3.1 / RFC 8200 §3: the first 12 bytes hold version, IHL, flags and fragment
    // offset, protocol; the IPv6 next header is byte 6.
    if c.len < IPV4_MIN_HEADER_LEN {
        return false;
    }
    let w = c.buf as *const u32;
    // SAFETY: `buf` is 8-aligned (DropScratch) with PEEK_BUF bytes, of which `len` (≥ 20)
    // were copied; every load below is of copied bytes at an aligned offset.
    unsafe {
        let w0 = u32::from_be(*w);
        let w1 = u32::from_be(*w.add(1));
        match w0 >> 28 {
            4 => {
                let ihl = ((w0 >> 24) & 0x0f) as usize * 4;
                if ihl < IPV4_MIN_HEADER_LEN {
                    return false;
                }
                let proto = (u32::from_be(*w.add(2)) >> 16) as u8;
                if proto != IPPROTO_UDP && proto != IPPROTO_TCP {
                    return true;
                }
                // A later fragment has no ports (FRAGS), and the ports must have been copied.
                if w1 & 0x1fff != 0 || ihl + 4 > c.len {
                    return false;
                }
                // `ihl` ≤ 60 (a 4-bit field times 4): the verifier bounds the load by it.
                let ports = u32::from_be(*(c.buf.add(ihl) as *const u32));
                !watched((ports >> 16) as u16) && !watched(ports as u16)
            }
            6 => {
                let next = (w1 >> 8) as u8;
                match next {
                    IPPROTO_UDP | IPPROTO_TCP if c.len >= IPV6_HEADER_LEN + 4 => {
                        let ports = u32::from_be(*w.add(IPV6_HEADER_LEN / 4));
                        !watched((ports >> 16) as u16) && !watched(ports as u16)
                    }
                    IPPROTO_UDP | IPPROTO_TCP | IPPROTO_HOPOPTS | IPPROTO_ROUTING
                    | IPPROTO_DSTOPTS | IPPROTO_FRAGMENT => false,
                    _ => true,
                }
            }
            // Not IP: `drop_wanted` finds no transport header either.
            _ => true,
        }
    }
}

/// Whether a freed packet (`p` starts at its network header) is one to report: on a watched
/// port, or a later fragment of a watched datagram — a fragment freed by reassembly
/// (timeout, overlap) or by a rule is the reason a large answer never arrives. As
/// [`wanted`]: `Some(ports)` when only a learnt port matched.
#[inline(always)]
fn drop_wanted<P: packet::PacketRead>(p: &P) -> Result<Option<u32>, ()> {
    let first: u8 = p.ptr_at(0)?;
    let Some(t) = packet::transport(p, packet::ethertype_of_version(first), 0)? else {
        return Ok(None);
    };
    wanted(p, &t, false)
}
