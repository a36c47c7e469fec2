//! One message, many records (`tracer_common::copies`): the TC programs recognise a later
//! sighting of a message by its `sk_buff` — the kernel object that carries it across a
//! veth pair, routing and DNAT — and send it as a copy record (its own IP and UDP headers)
//! instead of its whole payload again.
use aya_ebpf::{
    helpers::bpf_get_smp_processor_id,
    macros::map,
    maps::{LruHashMap, PerCpuArray},
};
use tracer_common::{copies, PacketEvent, SeenMessage};

/// Messages sent whole lately, by the address of the `sk_buff` that carried them: the
/// kernel's object, the same at every hook it crosses on a node (see `tracer_common::copies`).
/// An LRU map: the oldest go first, and an entry outlives its `sk_buff` only until its
/// address carries something else ([`WINDOW_NS`](copies::WINDOW_NS) and the bytes tell).
#[map]
static SEEN: LruHashMap<u64, SeenMessage> = LruHashMap::with_max_entries(copies::MAX_MESSAGES, 0);

/// Per CPU: the last message id handed out on it.
#[map]
static NEXT_MSG: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);

/// A UDP datagram copied into a scratch event that can take part: where it is and what
/// identifies its message.
pub(crate) struct Sighting {
    skb: u64,
    /// Its IP and UDP headers' length: what a copy record carries.
    pub(crate) hdr_len: u32,
    seen: SeenMessage,
}

/// Largest offset of the DNS payload in the scratch data (a mask the verifier bounds it by;
/// [`copies::MAX_HEADERS`] is below it).
const DNS_OFF_MASK: usize = 127;
/// Mask of the offset of the captured tail's 8 bytes.
const TAIL_OFF_MASK: usize = 4095;
const _: () = assert!(copies::MAX_HEADERS as usize <= DNS_OFF_MASK);
const _: () = assert!(TAIL_OFF_MASK + 8 <= tracer_common::PACKET_DATA_BUF);

/// The message in `ev` (its first `cap` bytes copied from the IP header on, `pkt_len` long),
/// a plain UDP datagram whose UDP payload starts `udp_end` bytes in, if it can take part:
/// IPv4 (options allowed) or IPv6 without extension headers — not tunnelled — with at least
/// [`copies::MIN_DNS_LEN`] bytes of DNS captured.
///
/// # Safety
/// `ev` is this CPU's scratch event, its header filled in.
#[inline(always)]
pub(crate) unsafe fn sighting(
    ev: *const PacketEvent,
    skb: u64,
    sk: u64,
    udp_end: usize,
    pkt_len: usize,
) -> Option<Sighting> {
    // SAFETY: every read is inside `data` (offsets masked below its size) of this CPU's
    // scratch event.
    unsafe {
        let hdr = &(*ev).hdr;
        let data = (*ev).data.as_ptr();
        let cap = hdr.cap_len as usize;
        if udp_end > copies::MAX_HEADERS as usize
            || cap < udp_end + copies::MIN_DNS_LEN as usize
            || pkt_len < udp_end + copies::MIN_DNS_LEN as usize
        {
            return None;
        }
        let v = *data;
        let ip_id = match v >> 4 {
            // IPv4: no tunnel (the UDP header follows this IP header) and UDP.
            4 if ((v & 0x0f) as usize) * 4 + 8 == udp_end && *data.add(9) == 17 => {
                u16::from_be_bytes([*data.add(4), *data.add(5)])
            }
            6 if udp_end == 48 && *data.add(6) == 17 => 0,
            _ => return None,
        };
        let dns = udp_end & DNS_OFF_MASK;
        let head = [
            core::ptr::read_unaligned(data.add(dns) as *const u64),
            core::ptr::read_unaligned(data.add(dns + 8) as *const u64),
        ];
        let tail = core::ptr::read_unaligned(data.add((cap - 8) & TAIL_OFF_MASK) as *const u64);
        Some(Sighting {
            skb,
            hdr_len: udp_end as u32,
            seen: SeenMessage {
                msg: 0,
                ts_ns: hdr.ts_ns,
                head,
                tail,
                sk,
                first_netns: hdr.netns_cookie,
                last_netns: hdr.netns_cookie,
                first_ifindex: hdr.ifindex,
                last_ifindex: hdr.ifindex,
                dns_len: (pkt_len - udp_end) as u32,
                ip_id,
                first_dir: hdr.dir,
                last_dir: hdr.dir,
            },
        })
    }
}

/// The id of the message `s` is a later copy of, if it is one (the rules are
/// `tracer_common::copies`'): the same `sk_buff` carried the same DNS bytes within the
/// window, owned by no other socket, and it is now somewhere else than where it started or
/// was last seen. Records this sighting as the message's last.
#[inline(always)]
pub(crate) fn copy_of(s: &Sighting) -> Option<u64> {
    let seen = SEEN.get_ptr_mut(&s.skb)?;
    let n = &s.seen;
    // SAFETY: the entry is this map's value while the program runs; a message's sightings
    // follow each other on its path, so no other CPU writes this entry meanwhile (and a
    // torn entry only makes a copy go whole).
    unsafe {
        let p = &mut *seen;
        let same = n.ts_ns.wrapping_sub(p.ts_ns) < copies::WINDOW_NS
            && p.head[0] == n.head[0]
            && p.head[1] == n.head[1]
            && p.tail == n.tail
            && p.dns_len == n.dns_len
            && p.ip_id == n.ip_id
            && (n.sk == 0 || n.sk == p.sk);
        let at_first = p.first_netns == n.first_netns
            && p.first_ifindex == n.first_ifindex
            && p.first_dir == n.first_dir;
        let at_last = p.last_netns == n.last_netns
            && p.last_ifindex == n.last_ifindex
            && p.last_dir == n.last_dir;
        if !same || at_first || at_last {
            return None;
        }
        p.ts_ns = n.ts_ns;
        p.sk = n.sk;
        p.last_netns = n.last_netns;
        p.last_ifindex = n.last_ifindex;
        p.last_dir = n.last_dir;
        Some(p.msg)
    }
}

/// A new message id: this CPU's number (plus one: 0 means none) in the top 16 bits, a
/// per-CPU count below.
#[inline(always)]
pub(crate) fn next_id() -> u64 {
    let Some(n) = NEXT_MSG.get_ptr_mut(0) else {
        return 0;
    };
    // SAFETY: this CPU's slot; TC programs do not nest on a CPU.
    let count = unsafe {
        *n += 1;
        *n
    };
    // SAFETY: helper call.
    let cpu = unsafe { bpf_get_smp_processor_id() } as u64;
    ((cpu + 1) << 48) | (count & ((1 << 48) - 1))
}

/// Remembers `s`, sent whole as message `msg`, for its later copies.
#[inline(always)]
pub(crate) fn remember(s: &Sighting, msg: u64) {
    let mut seen = s.seen;
    seen.msg = msg;
    let _ = SEEN.insert(&s.skb, &seen, 0);
}
