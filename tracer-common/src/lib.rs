//! Types shared by the kernel programs (`tracer-ebpf`) and userspace (`tracer`).
//!
//! Every type here is `#[repr(C)]`, `Copy` and free of implicit padding (flags are `u8`, never
//! `bool`), so both sides agree on the bytes without a serialisation step. `aya::Pod` is
//! implemented behind the `user` feature, which only userspace enables.
#![no_std]

/// Largest number of bytes of one packet copied into a [`PacketEvent`], counted from the IP
/// header: 4096 bytes of DNS payload after the largest IPv6 + TCP headers we parse.
pub const MAX_PACKET_DATA: usize = 4096 + 192;
/// Size of the data buffer of a [`PacketEvent`]: a power of two above [`MAX_PACKET_DATA`], so
/// that the kernel program can bound a copy length with a mask that every verifier since 5.10
/// follows (`len = ((n - 1) & PACKET_DATA_MASK) + 1` is provably in `1..=PACKET_DATA_BUF`).
pub const PACKET_DATA_BUF: usize = 8192;
pub const PACKET_DATA_MASK: usize = PACKET_DATA_BUF - 1;
/// Default bytes of payload kept after the transport header.
pub const DEFAULT_SNAPLEN: u32 = 2048;
/// Largest configurable snaplen (payload bytes after the transport header).
pub const MAX_SNAPLEN: u32 = 4096;
/// Bytes of a dropped packet copied into a [`DropEvent`], counted from the IP header.
pub const MAX_DROP_DATA: usize = 512;
/// Mask bounding a drop copy length (see [`PACKET_DATA_MASK`]); `MAX_DROP_DATA` is a power of two.
pub const DROP_DATA_MASK: usize = MAX_DROP_DATA - 1;
const _: () = assert!(PACKET_DATA_BUF.is_power_of_two() && PACKET_DATA_BUF >= MAX_PACKET_DATA);
const _: () = assert!(MAX_DROP_DATA.is_power_of_two());

/// What a ring-buffer record is: the first `u32` of every record.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventKind {
    /// A [`PacketHeader`] and the packet's bytes.
    Packet = 1,
    /// A [`DropEvent`].
    Drop = 2,
    /// A [`PacketHeader`] and only the IP and UDP headers of a packet: a later copy of the
    /// message of the packet record [`PacketHeader::msg`] names (see [`copies`]).
    Copy = 3,
}

/// The direction of a packet at its TC hook ([`PacketHeader::dir`]).
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dir {
    Ingress = 0,
    Egress = 1,
}

pub const L3_IPV4: u8 = 4;
pub const L3_IPV6: u8 = 6;

/// Numbers of the protocols and headers both sides walk (Ethernet, VLAN tags, IPv4, IPv6
/// and its extension headers, UDP, TCP, the tunnels), defined once for the kernel programs, the capture
/// decoder and the conntrack reader.
pub mod proto {
    /// Ethertypes (include/uapi/linux/if_ether.h).
    pub const ETH_P_IP: u16 = 0x0800;
    pub const ETH_P_IPV6: u16 = 0x86DD;
    /// 802.1Q VLAN tag.
    pub const ETH_P_8021Q: u16 = 0x8100;
    /// 802.1ad (QinQ) outer tag.
    pub const ETH_P_8021AD: u16 = 0x88A8;
    /// Pre-standard QinQ outer tag some switches still use.
    pub const ETH_P_QINQ1: u16 = 0x9100;
    /// Transparent Ethernet Bridging: an Ethernet frame inside GRE or Geneve.
    pub const ETH_P_TEB: u16 = 0x6558;

    /// Tunnels entered (one level): IP-in-IP (IPv4 and IPv6 inside), GRE, and the UDP
    /// ports of VXLAN (IANA's, and flannel's/Linux's old default) and Geneve.
    pub const IPPROTO_IPIP: u8 = 4;
    pub const IPPROTO_IPV6: u8 = 41;
    pub const IPPROTO_GRE: u8 = 47;
    pub const VXLAN_PORT: u16 = 4789;
    pub const VXLAN_LINUX_PORT: u16 = 8472;
    pub const GENEVE_PORT: u16 = 6081;

    /// IP protocol numbers (IANA; include/uapi/linux/in.h and in6.h): the transports…
    pub const IPPROTO_TCP: u8 = 6;
    pub const IPPROTO_UDP: u8 = 17;
    /// …and the IPv6 extension headers (RFC 8200 §4).
    pub const IPPROTO_HOPOPTS: u8 = 0;
    pub const IPPROTO_ROUTING: u8 = 43;
    pub const IPPROTO_FRAGMENT: u8 = 44;
    pub const IPPROTO_DSTOPTS: u8 = 60;

    /// Header lengths: IPv4 without options, IPv6 without extension headers, UDP, TCP
    /// without options.
    pub const IPV4_MIN_HEADER_LEN: usize = 20;
    pub const IPV6_HEADER_LEN: usize = 40;
    pub const UDP_HEADER_LEN: usize = 8;
    pub const TCP_MIN_HEADER_LEN: usize = 20;
}

/// Largest number of IP fragment keys the kernel remembers (the `FRAGS` LRU hash map).
pub const MAX_FRAG_KEYS: u32 = 4096;
/// How long a remembered fragment key stays valid: later fragments of a datagram follow its
/// first within microseconds; an older entry belongs to a datagram long gone, whose IP id
/// may be reused.
pub const FRAG_KEY_LIFETIME_NS: u64 = 2_000_000_000;

/// One fragmented IP datagram: what its non-first fragments share with its first one, which
/// alone carries the ports (RFC 791 §3.2; RFC 8200 §4.5). IPv4 addresses use the first 4
/// bytes of `src`/`dst`, the rest zero; `id` is the IPv4 16-bit Identification or the IPv6
/// Fragment header's 32-bit Identification.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct FragKey {
    pub src: [u8; 16],
    pub dst: [u8; 16],
    pub id: u32,
    /// Protocol of the fragmented payload ([`proto::IPPROTO_UDP`], …).
    pub proto: u8,
    /// [`L3_IPV4`] or [`L3_IPV6`]
    pub l3: u8,
    pub _pad: u16,
}

/// Values in the `PORTS` array (index: the port), bits: [`PORT_EVERYWHERE`] for a port given
/// with `--port`, captured in every namespace; [`PORT_LEARNT`] for a port some namespace
/// redirects a watched one to (a DNS proxy in a pod), captured only in the namespaces
/// `LEARNT_PORTS` holds it for. 0: not captured.
pub mod ports {
    pub const PORT_EVERYWHERE: u8 = 1;
    pub const PORT_LEARNT: u8 = 2;
}
pub use ports::{PORT_EVERYWHERE, PORT_LEARNT};

/// Most (namespace, port) pairs learnt at once (the `LEARNT_PORTS` hash map's size): beyond,
/// userspace refuses, counts and warns.
pub const MAX_LEARNT_PORTS: u32 = 64;

/// A port captured in one network namespace only: the key of `LEARNT_PORTS`. `netns` is the
/// namespace's id as the TC programs report it (`PacketHeader::netns_cookie`: its cookie,
/// or its inode number before Linux 5.14).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct LearntPort {
    pub netns: u64,
    pub port: u16,
    pub _pad: [u8; 6],
}

/// Storm shedding in the kernel: under a forwarding loop (hundreds of thousands of packets a
/// second of one question), userspace puts the question's hash in `SHED_ON`, and the TC
/// programs count that question's UDP packets per CPU in `SHED_COUNT` instead of copying them
/// to the ring buffer, which then stays free for every other query. Both sides hash the same
/// bytes with the same function: the first question's wire form (length-prefixed labels,
/// ASCII lowercased, the root label, type and class), FNV-1a 64.
pub mod shed {
    /// Questions shed at once (`SHED_ON`/`SHED_COUNT` size); loops beyond it are shed in
    /// userspace only.
    pub const MAX_KEYS: u32 = 256;
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;

    /// Start value of a question hash.
    #[inline(always)]
    pub const fn start() -> u64 {
        OFFSET
    }

    /// Adds one byte of the question's wire form (after lowercasing label bytes).
    #[inline(always)]
    pub const fn step(h: u64, b: u8) -> u64 {
        (h ^ b as u64).wrapping_mul(PRIME)
    }

    /// ASCII lowercase without a branch (each one costs the eBPF verifier a state): bit 7 of
    /// `b + 63` is set from `'A'` on, of `b + 37` from `'['` on.
    #[inline(always)]
    pub const fn lower(b: u8) -> u8 {
        let w = b as u32;
        (w | (((w + 63) & !(w + 37) & 0x80) >> 2)) as u8
    }

    /// The hash of a question key as userspace builds it (already lowercased).
    pub fn hash(key: &[u8]) -> u64 {
        let mut h = start();
        for b in key {
            h = step(h, *b);
        }
        h
    }
}

/// Indexes of the per-CPU `COUNTERS` array.
pub mod counter {
    /// Packets on a watched port that a TC program tried to report.
    pub const PACKETS_MATCHED: u32 = 0;
    /// Ring buffer full: a matched packet was lost.
    pub const PACKETS_LOST_RINGBUF: u32 = 1;
    /// IP packet whose headers could not be read (truncated, or an IPv6 extension chain too
    /// long to follow): not reported, counted here.
    pub const PARSE_FAILED: u32 = 2;
    /// Copying the packet bytes failed after a successful reserve; the event was discarded.
    pub const PACKETS_LOST_COPY: u32 = 3;
    /// Drops of packets on a watched port that the kfree_skb program tried to report.
    pub const DROPS_MATCHED: u32 = 4;
    /// Ring buffer full: a drop event was lost.
    pub const DROPS_LOST_RINGBUF: u32 = 5;
    /// Reading kernel memory of a dropped skb failed.
    pub const DROPS_READ_FAILED: u32 = 6;
    /// UDP packets of a question under a detected forwarding loop that the TC program only
    /// counted (per question in `SHED_COUNT`), not copied: see [`crate::shed`].
    pub const PACKETS_SHED: u32 = 7;
    /// Of `PACKETS_MATCHED`, those sent as copy records: a message already sent whole, seen
    /// again on its way (its IP and UDP headers only; see [`crate::copies`]).
    pub const PACKETS_COPIED: u32 = 8;
    /// Number of counters (the `COUNTERS` array's size).
    pub const COUNT: u32 = 9;
}

/// Tunables of the TC programs, written by userspace into the `CONFIG` global before load.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct CaptureConfig {
    /// Payload bytes to keep after the transport header (≤ [`MAX_SNAPLEN`]).
    pub snaplen: u32,
    pub _reserved: u32,
}

/// Fixed part of a [`PacketEvent`]; the ring-buffer record is this header followed by
/// `cap_len` packet bytes (records are only as long as the packet needs).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct PacketHeader {
    /// [`EventKind::Packet`]
    pub kind: u32,
    pub cpu: u32,
    /// `bpf_ktime_get_boot_ns()`: CLOCK_BOOTTIME, survives suspend.
    pub ts_ns: u64,
    /// Cookie of the network namespace of the device (set per program instance).
    pub netns_cookie: u64,
    pub ifindex: u32,
    /// Length of the packet from the IP header on.
    pub orig_len: u32,
    /// Bytes of packet data that follow the header.
    pub cap_len: u32,
    /// 802.1Q TCI of the packet (0 if untagged): from skb metadata or an in-packet tag.
    pub vlan_tci: u16,
    /// A [`Dir`].
    pub dir: u8,
    /// Unused, 0: keeps the header padding-free (the IP version is the packet's first nibble).
    pub _reserved: u8,
    /// [`EventKind::Packet`]: the id later copies of this message name, 0 if none will
    /// (see [`copies`]). [`EventKind::Copy`]: the id of the packet record it copies.
    pub msg: u64,
}

/// One message, many records: a DNS message crosses a node's hops as one `sk_buff` (the
/// client pod's veth, the node's side of it, DNAT, the DNS pod's veth: four TC hooks, the
/// same kernel object), and each hook used to send its whole payload. Now the first sends a
/// packet record with a message id ([`PacketHeader::msg`]); a later hook that sees the same
/// `sk_buff` carrying the same DNS bytes within [`WINDOW_NS`] at another point sends an
/// [`EventKind::Copy`] record: the header and its own IP and UDP headers (addresses after
/// NAT, TTL, checksums), which userspace puts in front of the first record's payload —
/// the bytes that hook would have copied. Only plain UDP datagrams take part: not a
/// fragment, not tunnelled, IPv4 (options allowed) or IPv6 without extension headers; and
/// only with the kernel's BTF (the `sk_buff`'s socket is read with its offsets).
///
/// A copy is the same `sk_buff` address, within the window of the last sighting, with the
/// same DNS length, first 16 and last 8 captured DNS bytes and IPv4 identification, at a
/// point (namespace, interface, direction) other than where the message was first and last
/// seen, and owned by no socket or the last sighting's. A new message in a freed `sk_buff`'s
/// address fails one of these: a retransmission starts where the first did, a forwarder's
/// byte-identical query is owned by the forwarder's socket.
pub mod copies {
    /// How long after a message's last sighting a copy is recognised. A message crosses a
    /// node in microseconds; a later sighting is sent whole (which is always correct).
    pub const WINDOW_NS: u64 = 50_000_000;
    /// Messages the kernel remembers at once (`SEEN`, an LRU map keyed by `sk_buff`).
    pub const MAX_MESSAGES: u32 = 8192;
    /// Bytes of DNS payload a message must have to take part: the 16 compared at its start
    /// and the 8 at the end of what was captured.
    pub const MIN_DNS_LEN: u32 = 24;
    /// Longest IP + UDP header of a message that takes part: IPv4 with the most options.
    pub const MAX_HEADERS: u32 = 60 + 8;
}

/// What the TC programs remember of a message's last sighting (`SEEN`'s value, keyed by
/// the `sk_buff`'s address), to tell a later copy of it from a new message that got the
/// freed `sk_buff`'s address.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct SeenMessage {
    /// [`PacketHeader::msg`] of its packet record.
    pub msg: u64,
    /// When it was last seen (boot ns).
    pub ts_ns: u64,
    /// Its first 16 DNS bytes (id, flags, counts, the question's start)…
    pub head: [u64; 2],
    /// …and the last 8 it captured.
    pub tail: u64,
    /// `skb->sk` at its last sighting: a socket's own `sk_buff` is a message just sent, so a
    /// sighting owned by another socket is a new message (a forwarder's byte-identical
    /// query in the `sk_buff` its client's query was freed from).
    pub sk: u64,
    /// Where it was first seen and last seen: a copy is somewhere else (the same message
    /// again where it started is a retransmission, a new message).
    pub first_netns: u64,
    pub last_netns: u64,
    pub first_ifindex: u32,
    pub last_ifindex: u32,
    /// Its UDP payload length.
    pub dns_len: u32,
    /// IPv4 identification (0 for IPv6): NAT keeps it, a retransmission usually changes it.
    pub ip_id: u16,
    pub first_dir: u8,
    pub last_dir: u8,
}

/// Size of [`PacketHeader`] in a record.
pub const PACKET_HEADER_LEN: usize = core::mem::size_of::<PacketHeader>();

/// One packet on a watched port, seen by a TC program: built in a per-CPU scratch buffer,
/// sent as its first `PACKET_HEADER_LEN + hdr.cap_len` bytes.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct PacketEvent {
    pub hdr: PacketHeader,
    /// The packet from its IP header on; at most [`MAX_PACKET_DATA`] bytes are used.
    pub data: [u8; PACKET_DATA_BUF],
}

/// The tuple of one conntrack direction, as `struct nf_conntrack_tuple` lays it out
/// (include/net/netfilter/nf_conntrack_tuple.h; unchanged since 2.6.x).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CtTuple {
    /// `src.u3`: IPv4 in the first 4 bytes, or IPv6.
    pub src: [u8; 16],
    /// `src.u.all`, network byte order.
    pub sport: [u8; 2],
    /// `src.l3num`: AF_INET (2) or AF_INET6 (10), host byte order.
    pub l3num: u16,
    /// `dst.u3`
    pub dst: [u8; 16],
    /// `dst.u.all`, network byte order.
    pub dport: [u8; 2],
    /// `dst.protonum`
    pub proto: u8,
    /// `dst.dir`
    pub dir: u8,
}

/// A packet on a watched port freed with a drop reason (`skb:kfree_skb`).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct DropEvent {
    /// [`EventKind::Drop`]
    pub kind: u32,
    pub cpu: u32,
    pub ts_ns: u64,
    /// Cookie of the namespace of `skb->dev` (or of `skb->sk` without a device); 0 if neither.
    pub netns_cookie: u64,
    /// Kernel address of the code that dropped it; userspace symbolises it.
    pub location: u64,
    /// `enum skb_drop_reason`
    pub reason: u32,
    /// `skb->dev->ifindex`, 0 without a device.
    pub ifindex: u32,
    /// `nf_conn->status` (enum ip_conntrack_status bits).
    pub ct_status: u64,
    /// Original-direction tuple of the skb's conntrack entry.
    pub ct_orig: CtTuple,
    /// Reply-direction tuple.
    pub ct_reply: CtTuple,
    /// 1 if `ct_*` are valid.
    pub has_ct: u8,
    /// Unused, 0 (the IP version is the first nibble of `data`).
    pub _reserved: u8,
    /// 1: `__nf_conntrack_confirm` returned `NF_DROP` for this very skb just before (the
    /// optional kprobe pair saw it) — a failed conntrack insert. 0: not seen (or no hook).
    pub confirm_failed: u8,
    pub _pad: u8,
    /// Length of the packet from the IP header on.
    pub orig_len: u32,
    /// Bytes of `data` that are valid.
    pub cap_len: u32,
    pub _pad2: u32,
    /// The packet from its IP header on (linear part only).
    pub data: [u8; MAX_DROP_DATA],
}

/// Offsets into kernel structures, read by userspace from the kernel's BTF and handed to the
/// kfree_skb program (Rust has no CO-RE relocations for field access). All in bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct KernelOffsets {
    pub skb_len: u32,
    pub skb_head: u32,
    pub skb_network_header: u32,
    /// Unused, 0: the program walks the headers from the network header itself.
    pub _reserved: u32,
    pub skb_dev: u32,
    pub skb_sk: u32,
    pub skb_nfct: u32,
    pub skb_data: u32,
    pub skb_tail: u32,
    pub dev_ifindex: u32,
    pub dev_nd_net: u32,
    pub sk_net: u32,
    pub net_cookie: u32,
    pub nfct_status: u32,
    pub nfct_tuplehash: u32,
    /// `sizeof(struct nf_conntrack_tuple_hash)`
    pub tuplehash_size: u32,
    /// offset of `tuple` in `struct nf_conntrack_tuple_hash`
    pub tuplehash_tuple: u32,
    /// 1 if `skb->_nfct` exists (CONFIG_NF_CONNTRACK)
    pub has_nfct: u32,
    /// 1: `net_cookie` is the offset of `net->ns.inum` (a `u32`), the namespace id userspace
    /// uses on kernels without `SO_NETNS_COOKIE` (< 5.14); 0: of `net->net_cookie` (a `u64`).
    pub net_id_is_inum: u32,
    /// 1: `skb->network_header`, `tail` and `head` lie in the [`SKB_WINDOW`] bytes of
    /// `sk_buff` from `skb_window`, and the kfree_skb program reads them with one copy of
    /// those bytes; 0: with one read each (`skb_network_header`, `skb_tail`, `skb_head`).
    pub has_skb_window: u32,
    /// Offset in `sk_buff` of the window's first byte (8-aligned).
    pub skb_window: u32,
    /// Offsets inside the window, each aligned to its field's size.
    pub window_network_header: u32,
    pub window_tail: u32,
    pub window_head: u32,
}

/// Bytes of `struct sk_buff` the kfree_skb program copies to decide a drop (a power of two:
/// the program masks an offset inside it with `SKB_WINDOW - size`). From an 8-aligned start,
/// `network_header` to the end of `head` takes 24 bytes on Debian's 5.10, 6.1 and 6.12 and on
/// 6.18 (their BTF), 32 with CONFIG_KCOV's `kcov_handle` between `mac_header` and `tail`; a
/// kernel that puts more there has `has_skb_window` 0.
pub const SKB_WINDOW: usize = 32;

impl KernelOffsets {
    /// All offsets zero: the kfree_skb program reports nothing until userspace fills them in.
    pub const UNSET: Self = Self {
        skb_len: 0,
        skb_head: 0,
        skb_network_header: 0,
        _reserved: 0,
        skb_dev: 0,
        skb_sk: 0,
        skb_nfct: 0,
        skb_data: 0,
        skb_tail: 0,
        dev_ifindex: 0,
        dev_nd_net: 0,
        sk_net: 0,
        net_cookie: 0,
        nfct_status: 0,
        nfct_tuplehash: 0,
        tuplehash_size: 0,
        tuplehash_tuple: 0,
        has_nfct: 0,
        net_id_is_inum: 0,
        has_skb_window: 0,
        skb_window: 0,
        window_network_header: 0,
        window_tail: 0,
        window_head: 0,
    };
}

/// A ring-buffer record that is not what the kernel programs write.
#[cfg(feature = "user")]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RecordError {
    /// Shorter than its kind's fixed part.
    TooShort {
        kind: EventKind,
        len: usize,
        need: usize,
    },
    /// Not even the 4-byte kind.
    NoKind {
        len: usize,
    },
    UnknownKind(u32),
    UnknownDir(u8),
    /// A copy record of a message whose packet record userspace no longer holds (or never
    /// read: lost): the copy is counted as lost.
    UnknownMessage(u64),
}

#[cfg(feature = "user")]
impl core::fmt::Display for RecordError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            RecordError::TooShort { kind, len, need } => {
                write!(
                    f,
                    "{kind:?} record of {len} bytes, shorter than its {need}-byte header"
                )
            }
            RecordError::NoKind { len } => write!(f, "record of {len} bytes has no kind"),
            RecordError::UnknownKind(k) => write!(f, "record of unknown kind {k}"),
            RecordError::UnknownDir(d) => write!(f, "packet record with unknown direction {d}"),
            RecordError::UnknownMessage(m) => {
                write!(f, "copy of message {m:#x}, whose packet record is not held")
            }
        }
    }
}

#[cfg(feature = "user")]
impl core::error::Error for RecordError {}

#[cfg(feature = "user")]
impl TryFrom<u32> for EventKind {
    type Error = RecordError;

    fn try_from(kind: u32) -> Result<Self, RecordError> {
        match kind {
            k if k == EventKind::Packet as u32 => Ok(EventKind::Packet),
            k if k == EventKind::Drop as u32 => Ok(EventKind::Drop),
            k if k == EventKind::Copy as u32 => Ok(EventKind::Copy),
            k => Err(RecordError::UnknownKind(k)),
        }
    }
}

#[cfg(feature = "user")]
impl TryFrom<u8> for Dir {
    type Error = RecordError;

    fn try_from(dir: u8) -> Result<Self, RecordError> {
        match dir {
            d if d == Dir::Ingress as u8 => Ok(Dir::Ingress),
            d if d == Dir::Egress as u8 => Ok(Dir::Egress),
            d => Err(RecordError::UnknownDir(d)),
        }
    }
}

/// One ring-buffer record, decoded.
#[cfg(feature = "user")]
#[derive(Clone, Copy)]
#[allow(
    clippy::large_enum_variant,
    reason = "made once per record and taken apart at once; no_std has no Box"
)]
pub enum RingRecord<'a> {
    /// A packet: its header, its direction, and its captured bytes (at most `cap_len`).
    Packet {
        hdr: PacketHeader,
        dir: Dir,
        data: &'a [u8],
    },
    /// A drop: the event, and its copied packet bytes (at most `cap_len` of `data`).
    Drop { ev: DropEvent, data: &'a [u8] },
    /// A later copy of the message of packet record `hdr.msg`: its header, its direction,
    /// and its own IP and UDP headers (at most `cap_len`; see [`copies`]).
    Copy {
        hdr: PacketHeader,
        dir: Dir,
        headers: &'a [u8],
    },
}

#[cfg(feature = "user")]
impl RingRecord<'_> {
    /// Decodes one record of the `EVENTS` ring buffer, which carries no alignment promise.
    pub fn parse(bytes: &[u8]) -> Result<RingRecord<'_>, RecordError> {
        let kind = bytes
            .first_chunk::<4>()
            .map(|b| u32::from_ne_bytes(*b))
            .ok_or(RecordError::NoKind { len: bytes.len() })?;
        match EventKind::try_from(kind)? {
            kind @ (EventKind::Packet | EventKind::Copy) => {
                let hdr: PacketHeader = read_unaligned(bytes, kind)?;
                let dir = Dir::try_from(hdr.dir)?;
                let data = bytes.get(PACKET_HEADER_LEN..).unwrap_or_default();
                let cap = (hdr.cap_len as usize).min(data.len());
                let data = data.get(..cap).unwrap_or_default();
                Ok(if kind == EventKind::Copy {
                    RingRecord::Copy {
                        hdr,
                        dir,
                        headers: data,
                    }
                } else {
                    RingRecord::Packet { hdr, dir, data }
                })
            }
            EventKind::Drop => {
                let ev: DropEvent = read_unaligned(bytes, EventKind::Drop)?;
                let data = bytes
                    .get(core::mem::offset_of!(DropEvent, data)..)
                    .unwrap_or_default();
                let cap = (ev.cap_len as usize).min(MAX_DROP_DATA).min(data.len());
                Ok(RingRecord::Drop {
                    ev,
                    data: data.get(..cap).unwrap_or_default(),
                })
            }
        }
    }
}

#[cfg(feature = "user")]
fn read_unaligned<T: aya::Pod>(bytes: &[u8], kind: EventKind) -> Result<T, RecordError> {
    let need = core::mem::size_of::<T>();
    if bytes.len() < need {
        return Err(RecordError::TooShort {
            kind,
            len: bytes.len(),
            need,
        });
    }
    // SAFETY: length checked; T is `aya::Pod`: plain old data, any bit pattern valid.
    Ok(unsafe { core::ptr::read_unaligned(bytes.as_ptr().cast::<T>()) })
}

#[cfg(feature = "user")]
mod pod {
    // SAFETY: all are repr(C), Copy, padding-free plain data.
    unsafe impl aya::Pod for super::CaptureConfig {}
    unsafe impl aya::Pod for super::KernelOffsets {}
    unsafe impl aya::Pod for super::CtTuple {}
    unsafe impl aya::Pod for super::FragKey {}
    unsafe impl aya::Pod for super::LearntPort {}
    unsafe impl aya::Pod for super::PacketHeader {}
    unsafe impl aya::Pod for super::DropEvent {}
    unsafe impl aya::Pod for super::SeenMessage {}
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::{align_of, size_of};

    #[test]
    fn branch_free_lowercase_is_ascii_lowercase() {
        for b in 0..=255u8 {
            assert_eq!(shed::lower(b), b.to_ascii_lowercase(), "{b}");
        }
    }

    // No implicit padding: each size equals the sum of its fields.
    #[test]
    fn layouts_are_padding_free() {
        assert_eq!(size_of::<CtTuple>(), 40);
        assert_eq!(PACKET_HEADER_LEN, 48);
        assert_eq!(size_of::<SeenMessage>(), 8 * 8 + 4 * 3 + 2 + 2);
        assert_eq!(
            size_of::<PacketEvent>(),
            PACKET_HEADER_LEN + PACKET_DATA_BUF
        );
        assert_eq!(core::mem::offset_of!(PacketEvent, data), PACKET_HEADER_LEN);
        assert_eq!(size_of::<PacketEvent>() % align_of::<PacketEvent>(), 0);
        assert_eq!(size_of::<DropEvent>(), 144 + MAX_DROP_DATA);
        assert_eq!(size_of::<KernelOffsets>(), 24 * 4);
        assert_eq!(size_of::<FragKey>(), 16 + 16 + 4 + 1 + 1 + 2);
        assert_eq!(size_of::<LearntPort>(), 8 + 2 + 6);
    }
}
