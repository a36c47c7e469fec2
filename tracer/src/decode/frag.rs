//! IP fragment reassembly (RFC 791 §3.2, RFC 8200 §4.5), per hop.
//!
//! Large UDP DNS answers (EDNS 4096, DNSSEC) leave their server as several IP fragments; only
//! the first carries the UDP header. Each hop (namespace, interface, direction) reassembles on
//! its own, so a fragment missing at one hop is reported at that hop: when a datagram is not
//! complete after [`FragLimits::timeout_ns`] (or at the end of input) it becomes a
//! [`FragmentLoss`] naming the fragments seen, the byte ranges never seen, and — when the
//! first fragment was seen — its ports and the DNS header and question it starts with.
//!
//! A complete datagram is rebuilt as one unfragmented IP packet and handed back, to be
//! decoded like any other. Fragments are kept sorted by offset with at most
//! [`FragLimits::max_fragments`] per datagram, which bounds the per-fragment work; the number
//! of datagrams in flight and their bytes are capped (the oldest is evicted and counted).
//! Overlapping fragments must agree where they overlap: fragments that rewrite bytes already
//! seen (the overlap attack of RFC 1858 / RFC 5722) make the datagram unusable.
use std::collections::{hash_map::Entry, HashMap, VecDeque};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use crate::decode::dns::{self, DnsMessage};
use crate::event::{CapturedPacket, ObservationPoint};

const IPV4_MIN_HEADER: usize = 20;
const IPV6_HEADER: usize = 40;
const PROTO_HOPOPTS: u8 = 0;
const PROTO_UDP: u8 = 17;
const PROTO_ROUTING: u8 = 43;
const PROTO_FRAGMENT: u8 = 44;
const PROTO_DSTOPTS: u8 = 60;
/// IPv4 total length and IPv6 payload length are 16 bits.
const MAX_IP_LENGTH: usize = 65535;
/// Extension headers walked before the Fragment header (as in `decode::ip`).
const MAX_IPV6_EXTENSION_HEADERS: usize = 8;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FragLimits {
    /// Datagrams being reassembled at once, over all hops.
    pub max_datagrams: usize,
    /// Captured fragment bytes held at once, over all hops.
    pub max_bytes: usize,
    /// Fragments of one datagram (a 65 535-byte datagram over a 1280-byte MTU is 53).
    pub max_fragments: usize,
    /// A datagram incomplete this long after its first fragment (in capture time) is lost.
    pub timeout_ns: u64,
}

impl Default for FragLimits {
    fn default() -> Self {
        Self {
            max_datagrams: 1024,
            max_bytes: 16 << 20,
            max_fragments: 128,
            timeout_ns: 2_000_000_000,
        }
    }
}

/// Why a fragment made its datagram unusable.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FragError {
    #[error("IP fragment at offset {offset} overlaps an earlier one with different bytes")]
    Overlap { offset: usize },
    #[error("IP fragment at offset {offset} of {len} bytes ends past the {MAX_IP_LENGTH}-byte limit of a datagram")]
    TooBig { offset: usize, len: usize },
    #[error("more than {0} IP fragments for one datagram")]
    TooManyFragments(usize),
    #[error("IP fragment with more-fragments set has {0} bytes of data, not a multiple of 8")]
    Misaligned(usize),
    #[error(
        "IP fragment ends at {end}, past the datagram's end at {total} set by its last fragment"
    )]
    PastEnd { end: usize, total: usize },
}

/// Where a datagram is reassembled: one hop, one (src, dst, IP id, protocol).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct DatagramKey {
    pub at: ObservationPoint,
    pub src: IpAddr,
    pub dst: IpAddr,
    /// IPv4 16-bit Identification, or the IPv6 Fragment header's 32-bit one.
    pub id: u32,
    pub proto: u8,
}

/// One IP fragment found in a captured packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fragment<'a> {
    pub src: IpAddr,
    pub dst: IpAddr,
    pub id: u32,
    /// Protocol of the fragmented payload.
    pub proto: u8,
    /// Byte offset of this fragment's data in the datagram's payload.
    pub offset: usize,
    pub more: bool,
    /// The fragment's data length on the wire (from the IP header).
    pub len: usize,
    /// What the capture holds of that data (at most `len` bytes).
    pub data: &'a [u8],
    /// IPv4: the header with options; IPv6: the fixed 40-byte header.
    pub header: &'a [u8],
}

/// The fragment `data` (from its IP header on) is, or `None` for an unfragmented packet (or
/// one whose headers `decode::ip` will reject).
pub fn parse_fragment(data: &[u8]) -> Option<Fragment<'_>> {
    match data.first()? >> 4 {
        4 => parse_ipv4(data),
        6 => parse_ipv6(data),
        _ => None,
    }
}

fn parse_ipv4(data: &[u8]) -> Option<Fragment<'_>> {
    let h = data.get(..IPV4_MIN_HEADER)?;
    let ihl = usize::from(h[0] & 0x0f) * 4;
    let flags_offset = u16::from_be_bytes([h[6], h[7]]);
    let more = flags_offset & 0x2000 != 0;
    let offset = usize::from(flags_offset & 0x1fff) * 8;
    if !more && offset == 0 {
        return None;
    }
    let total = usize::from(u16::from_be_bytes([h[2], h[3]]));
    if ihl < IPV4_MIN_HEADER || total < ihl || data.len() < ihl {
        return None;
    }
    Some(Fragment {
        src: IpAddr::V4(Ipv4Addr::new(h[12], h[13], h[14], h[15])),
        dst: IpAddr::V4(Ipv4Addr::new(h[16], h[17], h[18], h[19])),
        id: u32::from(u16::from_be_bytes([h[4], h[5]])),
        proto: h[9],
        offset,
        more,
        len: total - ihl,
        data: data.get(ihl..total.min(data.len()))?,
        header: data.get(..ihl)?,
    })
}

fn parse_ipv6(data: &[u8]) -> Option<Fragment<'_>> {
    let h = data.get(..IPV6_HEADER)?;
    let payload_len = usize::from(u16::from_be_bytes([h[4], h[5]]));
    let mut next = h[6];
    let mut at = IPV6_HEADER;
    for _ in 0..MAX_IPV6_EXTENSION_HEADERS {
        match next {
            PROTO_HOPOPTS | PROTO_ROUTING | PROTO_DSTOPTS => {
                let ext = data.get(at..at + 2)?;
                next = ext[0];
                at += (usize::from(ext[1]) + 1) * 8;
            }
            PROTO_FRAGMENT => {
                let f = data.get(at..at + 8)?;
                let off_m = u16::from_be_bytes([f[2], f[3]]);
                let offset = usize::from(off_m >> 3) * 8;
                let more = off_m & 1 != 0;
                // An atomic fragment (offset 0, no more) is a whole packet (RFC 6946).
                if offset == 0 && !more {
                    return None;
                }
                let start = at + 8;
                let end = IPV6_HEADER + payload_len;
                if payload_len == 0 || end < start {
                    return None;
                }
                let mut src = [0u8; 16];
                let mut dst = [0u8; 16];
                src.copy_from_slice(&h[8..24]);
                dst.copy_from_slice(&h[24..40]);
                return Some(Fragment {
                    src: IpAddr::V6(Ipv6Addr::from(src)),
                    dst: IpAddr::V6(Ipv6Addr::from(dst)),
                    id: u32::from_be_bytes([f[4], f[5], f[6], f[7]]),
                    proto: f[0],
                    offset,
                    more,
                    len: end - start,
                    data: data.get(start..end.min(data.len())).unwrap_or_default(),
                    header: h,
                });
            }
            _ => return None,
        }
    }
    None
}

/// The datagrams whose first fragment was on a watched port, for a capture-file reader that
/// filters by port before decoding: later fragments carry no port, so they are kept when
/// their datagram's first fragment was (as the kernel program does with its `FRAGS` map).
/// Bounded: the oldest keys are forgotten first.
#[derive(Default)]
pub struct WatchedDatagrams {
    keys: std::collections::HashSet<(IpAddr, IpAddr, u32, u8)>,
    order: VecDeque<(IpAddr, IpAddr, u32, u8)>,
}

impl WatchedDatagrams {
    const CAPACITY: usize = 4096;

    /// `ip` (from its IP header on) was kept for its ports: if it is a first fragment,
    /// remember its datagram.
    pub fn note_kept(&mut self, ip: &[u8]) {
        let Some(f) = parse_fragment(ip).filter(|f| f.offset == 0) else {
            return;
        };
        let key = (f.src, f.dst, f.id, f.proto);
        if self.keys.insert(key) {
            self.order.push_back(key);
            if self.order.len() > Self::CAPACITY {
                if let Some(old) = self.order.pop_front() {
                    self.keys.remove(&old);
                }
            }
        }
    }

    /// `ip` is a later fragment of a remembered datagram.
    pub fn is_later_fragment(&self, ip: &[u8]) -> bool {
        parse_fragment(ip)
            .is_some_and(|f| f.offset > 0 && self.keys.contains(&(f.src, f.dst, f.id, f.proto)))
    }
}

/// What [`Reassembler::push`] did with a packet.
#[derive(Debug)]
pub enum Pushed {
    /// Not a fragment: decode it as it is.
    Unfragmented(CapturedPacket),
    /// A fragment, held (or, for an unusable datagram, counted): nothing to decode yet.
    Held,
    /// The fragment that completed its datagram, rebuilt as one unfragmented IP packet: decode it.
    Complete(CapturedPacket),
    /// The fragment made its datagram unusable (counted as malformed by the caller); the
    /// fragments held for it count as incomplete.
    Rejected(CapturedPacket, FragError),
}

/// Why a datagram was given up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LossCause {
    /// Still incomplete [`FragLimits::timeout_ns`] after its first fragment.
    Timeout,
    /// The input ended (end of file, or the trace stopped) with the datagram incomplete.
    EndOfInput,
}

impl LossCause {
    pub fn as_str(self) -> &'static str {
        match self {
            LossCause::Timeout => "timeout",
            LossCause::EndOfInput => "end of input",
        }
    }
}

/// A datagram of which some fragments never came, at one hop.
#[derive(Clone, Debug)]
pub struct FragmentLoss {
    pub key: DatagramKey,
    /// The first fragment seen (capture time).
    pub first_ts_ns: u64,
    pub last_ts_ns: u64,
    pub cause: LossCause,
    /// `(offset, len)` of each fragment seen, by offset (data bytes of the IP payload).
    pub seen: Vec<(usize, usize)>,
    /// `[start, end)` byte ranges never seen; `end` is `None` after the last seen byte when
    /// the last fragment (more-fragments clear) was not seen either.
    pub missing: Vec<(usize, Option<usize>)>,
    /// Payload length of the datagram, known when its last fragment was seen.
    pub total_len: Option<usize>,
    /// Ports of the first fragment's UDP/TCP header, when it was seen.
    pub ports: Option<(u16, u16)>,
    /// The DNS header and question the first fragment starts with, decoded as far as its
    /// bytes go (a UDP first fragment on any port).
    pub dns: Option<DnsMessage>,
}

impl FragmentLoss {
    /// The datagram's fragment count if its fragments follow the usual layout (each but the
    /// last as long as the first), and which of them (1-based) were never seen.
    pub fn fragment_numbers(&self) -> Option<(usize, Vec<usize>)> {
        let total = self.total_len?;
        let &(0, size) = self.seen.first()? else {
            return None;
        };
        if size == 0 || !size.is_multiple_of(8) {
            return None;
        }
        let count = total.div_ceil(size);
        // Every seen fragment must sit on that grid.
        if self
            .seen
            .iter()
            .any(|&(o, l)| o % size != 0 || (l != size && o + l != total))
        {
            return None;
        }
        let missing = (0..count)
            .filter(|i| !self.seen.iter().any(|&(o, _)| o == i * size))
            .map(|i| i + 1)
            .collect();
        Some((count, missing))
    }

    pub fn src(&self) -> String {
        match self.ports {
            Some((s, _)) => SocketAddr::new(self.key.src, s).to_string(),
            None => self.key.src.to_string(),
        }
    }

    pub fn dst(&self) -> String {
        match self.ports {
            Some((_, d)) => SocketAddr::new(self.key.dst, d).to_string(),
            None => self.key.dst.to_string(),
        }
    }
}

/// Reassembly counters; the fragments ones keep the decoder's accounting exact.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FragStats {
    /// Fragments of datagrams that were reassembled, except the one completing each.
    pub merged: u64,
    /// Fragments of datagrams that never completed (lost fragments, evicted, unusable).
    pub incomplete: u64,
    /// Fragments held right now for datagrams still being reassembled.
    pub pending: u64,
    pub datagrams_reassembled: u64,
    /// Datagrams reported as a [`FragmentLoss`].
    pub datagrams_lost: u64,
    /// Datagrams forgotten to keep memory bounded (not reported).
    pub datagrams_evicted: u64,
}

struct Piece {
    offset: usize,
    len: usize,
    /// Captured bytes of the fragment's data (a prefix of it when the capture cut it).
    data: Vec<u8>,
}

struct Partial {
    first_ts: u64,
    last_ts: u64,
    /// By offset; overlapping pieces agree where both hold bytes.
    pieces: Vec<Piece>,
    /// Payload length, from the fragment with more-fragments clear.
    total: Option<usize>,
    /// Captured fragments counted into this datagram (duplicates included).
    packets: u64,
    bytes: usize,
    /// The first fragment's IP header, to rebuild the datagram.
    header: Option<Vec<u8>>,
    /// Unusable (a bad fragment): later fragments are only counted until it expires.
    poisoned: bool,
    /// Its entry in the expiry queue.
    seq: u64,
}

/// Per-hop IP reassembly with bounded memory.
pub struct Reassembler {
    limits: FragLimits,
    partials: HashMap<DatagramKey, Partial>,
    /// (deadline, key, seq) in arrival order of first fragments; entries whose seq no longer
    /// matches are stale.
    expiry: VecDeque<(u64, DatagramKey, u64)>,
    next_seq: u64,
    bytes: usize,
    stats: FragStats,
}

impl Reassembler {
    pub fn new(limits: FragLimits) -> Self {
        Self {
            limits,
            partials: HashMap::new(),
            expiry: VecDeque::new(),
            next_seq: 0,
            bytes: 0,
            stats: FragStats::default(),
        }
    }

    pub fn stats(&self) -> FragStats {
        let mut s = self.stats;
        s.pending = self.partials.values().map(|p| p.packets).sum();
        s
    }

    /// Takes one captured packet: not a fragment, held, completing, or rejected.
    pub fn push(&mut self, packet: CapturedPacket) -> Pushed {
        let Some(f) = parse_fragment(&packet.data) else {
            return Pushed::Unfragmented(packet);
        };
        let key = DatagramKey {
            at: packet.at,
            src: f.src,
            dst: f.dst,
            id: f.id,
            proto: f.proto,
        };
        let ts = packet.ts_ns;
        match self.add(key, &f, ts) {
            Ok(None) => Pushed::Held,
            Ok(Some(rebuilt)) => Pushed::Complete(CapturedPacket {
                orig_len: u32::try_from(rebuilt.1).unwrap_or(u32::MAX),
                data: rebuilt.0,
                ..packet
            }),
            Err(e) => Pushed::Rejected(packet, e),
        }
    }

    /// Adds a fragment; `Ok(Some((packet bytes, length on the wire)))` when it completed its
    /// datagram.
    fn add(
        &mut self,
        key: DatagramKey,
        f: &Fragment<'_>,
        ts: u64,
    ) -> Result<Option<(Vec<u8>, usize)>, FragError> {
        let end = f.offset.saturating_add(f.len);
        let header_len = if key.src.is_ipv4() { f.header.len() } else { 0 };
        let too_big = end.saturating_add(header_len) > MAX_IP_LENGTH;
        let misaligned = f.more && !f.len.is_multiple_of(8);
        // Entries of completed datagrams stay queued until their deadline; at high rates,
        // drop them in one pass now and then (amortised O(1); the queue stays within a few
        // times the datagrams in flight).
        if self.expiry.len() > 4 * self.limits.max_datagrams + 16 {
            let live = &self.partials;
            self.expiry
                .retain(|(_, k, s)| live.get(k).is_some_and(|p| p.seq == *s));
        }
        let partial = match self.partials.entry(key) {
            Entry::Occupied(o) => o.into_mut(),
            Entry::Vacant(v) => {
                let seq = self.next_seq;
                self.next_seq += 1;
                self.expiry
                    .push_back((ts.saturating_add(self.limits.timeout_ns), key, seq));

                v.insert(Partial {
                    first_ts: ts,
                    last_ts: ts,
                    pieces: Vec::new(),
                    total: None,
                    packets: 0,
                    bytes: 0,
                    header: None,
                    poisoned: false,
                    seq,
                })
            }
        };
        partial.last_ts = partial.last_ts.max(ts);
        if partial.poisoned {
            self.stats.incomplete += 1;
            return Ok(None);
        }
        let check = if too_big {
            Err(FragError::TooBig {
                offset: f.offset,
                len: f.len,
            })
        } else if misaligned {
            Err(FragError::Misaligned(f.len))
        } else if partial.pieces.len() >= self.limits.max_fragments {
            Err(FragError::TooManyFragments(self.limits.max_fragments))
        } else {
            check_fits(partial, f, end)
        };
        if let Err(e) = check {
            // The datagram is unusable: what was held for it will never complete.
            self.stats.incomplete += partial.packets;
            self.bytes -= partial.bytes;
            partial.packets = 0;
            partial.bytes = 0;
            partial.pieces = Vec::new();
            partial.header = None;
            partial.poisoned = true;
            return Err(e);
        }
        partial.packets += 1;
        if !f.more {
            partial.total = Some(end);
        }
        if f.offset == 0 {
            partial.header = Some(f.header.to_vec());
        }
        let at = partial.pieces.partition_point(|p| p.offset <= f.offset);
        partial.pieces.insert(
            at,
            Piece {
                offset: f.offset,
                len: f.len,
                data: f.data.to_vec(),
            },
        );
        partial.bytes += f.data.len();
        self.bytes += f.data.len();

        let done = partial
            .total
            .is_some_and(|total| covered(&partial.pieces) >= total)
            && partial.header.is_some();
        if done {
            let rebuilt = self.partials.remove(&key).and_then(|p| {
                self.bytes -= p.bytes;
                // The completing fragment is decoded; the others were merged into it.
                self.stats.merged += p.packets.saturating_sub(1);
                self.stats.datagrams_reassembled += 1;
                rebuild(&key, p)
            });
            if rebuilt.is_none() {
                // Cannot happen (lengths were checked on the way in); keep the count exact.
                self.stats.incomplete += 1;
            }
            return Ok(rebuilt);
        }
        self.evict_over_limits();
        Ok(None)
    }

    /// Datagrams incomplete for longer than the timeout at capture time `now_ns` become
    /// losses (in `out`).
    pub fn expire(&mut self, now_ns: u64, out: &mut Vec<FragmentLoss>) {
        while let Some(&(deadline, key, seq)) = self.expiry.front() {
            if deadline > now_ns {
                break;
            }
            self.expiry.pop_front();
            if self.partials.get(&key).is_some_and(|p| p.seq == seq) {
                self.give_up(key, Some(LossCause::Timeout), out);
            }
        }
    }

    /// The input ended: every incomplete datagram is a loss.
    pub fn finish(&mut self, out: &mut Vec<FragmentLoss>) {
        while let Some((_, key, seq)) = self.expiry.pop_front() {
            if self.partials.get(&key).is_some_and(|p| p.seq == seq) {
                self.give_up(key, Some(LossCause::EndOfInput), out);
            }
        }
    }

    /// Forgets the oldest datagrams while over the limits (counted, not reported: running
    /// out of room says nothing about the network).
    fn evict_over_limits(&mut self) {
        let mut none = Vec::new();
        while self.partials.len() > self.limits.max_datagrams || self.bytes > self.limits.max_bytes
        {
            let Some((_, key, seq)) = self.expiry.pop_front() else {
                break;
            };
            if self.partials.get(&key).is_some_and(|p| p.seq == seq) {
                self.stats.datagrams_evicted += 1;
                self.give_up(key, None, &mut none);
            }
        }
    }

    fn give_up(&mut self, key: DatagramKey, cause: Option<LossCause>, out: &mut Vec<FragmentLoss>) {
        let Some(p) = self.partials.remove(&key) else {
            return;
        };
        self.bytes -= p.bytes;
        self.stats.incomplete += p.packets;
        // A poisoned datagram was reported as malformed already.
        let (Some(cause), false) = (cause, p.poisoned) else {
            return;
        };
        self.stats.datagrams_lost += 1;
        out.push(loss(key, p, cause));
    }
}

/// Whether `f` can join `partial`: inside the datagram's end, agreeing with overlapped bytes.
fn check_fits(partial: &Partial, f: &Fragment<'_>, end: usize) -> Result<(), FragError> {
    if let Some(total) = partial.total {
        if end > total || (!f.more && end != total) {
            return Err(FragError::PastEnd { end, total });
        }
    }
    if !f.more {
        if let Some(last) = partial.pieces.iter().map(|p| p.offset + p.len).max() {
            if last > end {
                return Err(FragError::PastEnd {
                    end: last,
                    total: end,
                });
            }
        }
    }
    for p in &partial.pieces {
        let lo = p.offset.max(f.offset);
        let hi = (p.offset + p.data.len()).min(f.offset + f.data.len());
        if lo < hi {
            let old = p.data.get(lo - p.offset..hi - p.offset);
            let new = f.data.get(lo - f.offset..hi - f.offset);
            if old != new {
                return Err(FragError::Overlap { offset: f.offset });
            }
        }
    }
    Ok(())
}

/// Bytes covered from offset 0 without a hole, by the pieces' lengths on the wire.
fn covered(pieces: &[Piece]) -> usize {
    let mut end = 0;
    for p in pieces {
        if p.offset > end {
            break;
        }
        end = end.max(p.offset + p.len);
    }
    end
}

/// The datagram as one unfragmented IP packet: `(captured bytes, length on the wire)`. Bytes
/// after the first the capture did not hold are left out, so a datagram the snaplen cut
/// decodes as cut.
fn rebuild(key: &DatagramKey, p: Partial) -> Option<(Vec<u8>, usize)> {
    let total = p.total?;
    let header = p.header?;
    let mut payload = Vec::with_capacity(total);
    for piece in &p.pieces {
        if piece.offset > payload.len() {
            // A hole in the captured bytes: the capture cut the piece before.
            break;
        }
        let skip = payload.len() - piece.offset;
        if let Some(rest) = piece.data.get(skip..) {
            payload.extend_from_slice(rest);
        }
    }
    payload.truncate(total);
    let mut out = match key.src {
        IpAddr::V4(_) => {
            let mut h = header;
            let len = u16::try_from(h.len() + total).ok()?;
            h[2..4].copy_from_slice(&len.to_be_bytes());
            // No more fragments, offset 0 (DF kept).
            h[6] &= 0x40;
            h[7] = 0;
            h
        }
        IpAddr::V6(_) => {
            let mut h = header;
            h[4..6].copy_from_slice(&u16::try_from(total).ok()?.to_be_bytes());
            h[6] = key.proto;
            h
        }
    };
    let wire = out.len() + total;
    out.extend_from_slice(&payload);
    Some((out, wire))
}

fn loss(key: DatagramKey, p: Partial, cause: LossCause) -> FragmentLoss {
    let seen: Vec<(usize, usize)> = p.pieces.iter().map(|x| (x.offset, x.len)).collect();
    let mut missing = Vec::new();
    let mut end = 0;
    for &(o, l) in &seen {
        if o > end {
            missing.push((end, Some(o)));
        }
        end = end.max(o + l);
    }
    match p.total {
        Some(total) if end < total => missing.push((end, Some(total))),
        Some(_) => {}
        None => missing.push((end, None)),
    }
    let first = p.pieces.first().filter(|x| x.offset == 0);
    let (ports, dns) = match first {
        Some(x) if x.data.len() >= 4 => {
            let ports = (
                u16::from_be_bytes([x.data[0], x.data[1]]),
                u16::from_be_bytes([x.data[2], x.data[3]]),
            );
            // The message is cut where the first fragment ends: its length on the wire is
            // the UDP length's.
            let dns = match (key.proto, x.data.get(4..6), x.data.get(8..)) {
                (PROTO_UDP, Some(&[l0, l1]), Some(bytes)) => {
                    let wire = usize::from(u16::from_be_bytes([l0, l1])).saturating_sub(8);
                    dns::decode_cut(bytes, wire.max(bytes.len() + 1))
                        .ok()
                        .flatten()
                }
                _ => None,
            };
            (Some(ports), dns)
        }
        _ => (None, None),
    };
    FragmentLoss {
        key,
        first_ts_ns: p.first_ts,
        last_ts_ns: p.last_ts,
        cause,
        seen,
        missing,
        total_len: p.total,
        ports,
        dns,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decode::{parse_ip, Transport};
    use crate::event::Direction;

    const HOP: ObservationPoint = ObservationPoint {
        netns: 7,
        ifindex: 3,
        dir: Direction::Ingress,
    };

    /// `big.lab.test. TXT`, id 4660: `n` answers of 200 bytes of text each.
    fn big_answer(n: usize) -> Vec<u8> {
        use hickory_proto::{
            op::{Message, MessageType, OpCode, Query},
            rr::{rdata::TXT, Name, RData, Record as HRecord, RecordType},
        };
        let name = Name::from_ascii("big.lab.test.").unwrap();
        let mut m = Message::new(4660, MessageType::Response, OpCode::Query);
        m.add_query(Query::query(name.clone(), RecordType::TXT));
        for i in 0..n {
            let text = format!("{i:03}{}", "y".repeat(197));
            m.add_answer(HRecord::from_rdata(
                name.clone(),
                300,
                RData::TXT(TXT::new(vec![text])),
            ));
        }
        m.to_vec().unwrap()
    }

    fn udp(payload: &[u8]) -> Vec<u8> {
        let mut u = vec![0, 53, 0x9c, 0x40];
        u.extend_from_slice(&(8 + payload.len() as u16).to_be_bytes());
        u.extend_from_slice(&[0, 0]);
        u.extend_from_slice(payload);
        u
    }

    /// IPv4 fragments of `l4` with `size` bytes of data each (the last shorter).
    fn ipv4_fragments(l4: &[u8], size: usize, id: u16) -> Vec<Vec<u8>> {
        let chunks: Vec<&[u8]> = l4.chunks(size).collect();
        let n = chunks.len();
        chunks
            .iter()
            .enumerate()
            .map(|(i, c)| {
                let mut p = vec![0x45, 0];
                p.extend_from_slice(&((20 + c.len()) as u16).to_be_bytes());
                p.extend_from_slice(&id.to_be_bytes());
                let mut fo = ((i * size) / 8) as u16;
                if i + 1 < n {
                    fo |= 0x2000;
                }
                p.extend_from_slice(&fo.to_be_bytes());
                p.extend_from_slice(&[64, 17, 0, 0, 10, 250, 0, 53, 10, 244, 1, 2]);
                p.extend_from_slice(c);
                p
            })
            .collect()
    }

    /// IPv6 fragments (Fragment header right after the fixed header).
    fn ipv6_fragments(l4: &[u8], size: usize, id: u32) -> Vec<Vec<u8>> {
        let chunks: Vec<&[u8]> = l4.chunks(size).collect();
        let n = chunks.len();
        chunks
            .iter()
            .enumerate()
            .map(|(i, c)| {
                let mut p = vec![0x60, 0, 0, 0];
                p.extend_from_slice(&((8 + c.len()) as u16).to_be_bytes());
                p.extend_from_slice(&[44, 64]);
                p.extend_from_slice(&[0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x53]);
                p.extend_from_slice(&[0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2]);
                let mut om = ((i * size) as u16 / 8) << 3;
                if i + 1 < n {
                    om |= 1;
                }
                p.extend_from_slice(&[17, 0]);
                p.extend_from_slice(&om.to_be_bytes());
                p.extend_from_slice(&id.to_be_bytes());
                p.extend_from_slice(c);
                p
            })
            .collect()
    }

    fn packet(ts_ns: u64, data: &[u8]) -> CapturedPacket {
        CapturedPacket {
            ts_ns,
            cpu: None,
            at: HOP,
            vlan: None,
            orig_len: data.len() as u32,
            data: data.to_vec(),
        }
    }

    /// Pushes `frags` in order at time 1; returns the rebuilt packet if one completed.
    fn push_all(r: &mut Reassembler, frags: &[Vec<u8>]) -> Option<CapturedPacket> {
        let mut done = None;
        for f in frags {
            match r.push(packet(1, f)) {
                Pushed::Held => {}
                Pushed::Complete(p) => {
                    assert!(done.is_none(), "completed twice");
                    done = Some(p);
                }
                other => panic!("unexpected {other:?}"),
            }
        }
        done
    }

    fn udp_payload(p: &CapturedPacket) -> Vec<u8> {
        match parse_ip(&p.data).unwrap().transport {
            Transport::Udp { payload, .. } => payload.to_vec(),
            other => panic!("not UDP: {other:?}"),
        }
    }

    #[test]
    fn ipv4_in_order_is_rebuilt_whole() {
        let msg = big_answer(16);
        assert!(msg.len() > 3000);
        let frags = ipv4_fragments(&udp(&msg), 1480, 0x1a2b);
        assert_eq!(frags.len(), 3);
        let mut r = Reassembler::new(FragLimits::default());
        let p = push_all(&mut r, &frags).expect("complete");
        assert_eq!(udp_payload(&p), msg);
        assert_eq!(p.orig_len as usize, 20 + 8 + msg.len());
        assert_eq!(p.data.len(), p.orig_len as usize);
        assert_eq!(dns::decode(&udp_payload(&p)).unwrap().answers.len(), 16);
        let s = r.stats();
        assert_eq!((s.merged, s.incomplete, s.pending), (2, 0, 0));
        assert_eq!(s.datagrams_reassembled, 1);
        // Not fragments: handed back untouched.
        let whole = p.data.clone();
        assert!(matches!(r.push(packet(2, &whole)), Pushed::Unfragmented(q) if q.data == whole));
    }

    #[test]
    fn out_of_order_and_duplicates_complete_once() {
        let msg = big_answer(16);
        let mut frags = ipv4_fragments(&udp(&msg), 1024, 9);
        assert_eq!(frags.len(), 4);
        frags.reverse();
        let dup = frags[1].clone();
        frags.insert(2, dup);
        let mut r = Reassembler::new(FragLimits::default());
        let p = push_all(&mut r, &frags).expect("complete");
        assert_eq!(udp_payload(&p), msg);
        // 5 packets: one completes, 4 merged (the duplicate included).
        assert_eq!(r.stats().merged, 4);

        // An overlap that agrees (a re-fragmentation of the same bytes) is fine.
        let l4 = udp(&msg);
        let mut r = Reassembler::new(FragLimits::default());
        let a = ipv4_fragments(&l4, 1024, 10);
        let b = ipv4_fragments(&l4, 512, 10);
        assert!(matches!(r.push(packet(1, &a[0])), Pushed::Held));
        assert!(matches!(r.push(packet(1, &b[1])), Pushed::Held));
        assert!(matches!(r.push(packet(1, &b[2])), Pushed::Held));
        let mut done = None;
        for f in &a[1..] {
            if let Pushed::Complete(p) = r.push(packet(1, f)) {
                done = Some(p);
            }
        }
        assert_eq!(udp_payload(&done.unwrap()), msg);
    }

    #[test]
    fn overlapping_fragments_that_disagree_are_rejected() {
        let msg = big_answer(16);
        let frags = ipv4_fragments(&udp(&msg), 1024, 11);
        let mut evil = frags[1].clone();
        evil[20 + 100] ^= 0xff;
        let mut r = Reassembler::new(FragLimits::default());
        assert!(matches!(r.push(packet(1, &frags[0])), Pushed::Held));
        assert!(matches!(r.push(packet(1, &frags[1])), Pushed::Held));
        match r.push(packet(1, &evil)) {
            Pushed::Rejected(_, FragError::Overlap { offset: 1024 }) => {}
            other => panic!("{other:?}"),
        }
        // The rest of that datagram is only counted; it never completes or reports a loss.
        for f in &frags[2..] {
            assert!(matches!(r.push(packet(1, f)), Pushed::Held));
        }
        let mut losses = Vec::new();
        r.expire(10_000_000_000, &mut losses);
        assert!(losses.is_empty(), "{losses:?}");
        let s = r.stats();
        // 2 held before the rejection + 2 after: incomplete; the rejected one is the
        // caller's (malformed).
        assert_eq!((s.merged, s.incomplete, s.pending), (0, 4, 0));
    }

    #[test]
    fn too_many_or_too_big_is_bounded() {
        let msg = big_answer(16);
        let frags = ipv4_fragments(&udp(&msg), 256, 12);
        assert!(frags.len() > 4);
        let mut r = Reassembler::new(FragLimits {
            max_fragments: 4,
            ..FragLimits::default()
        });
        for f in &frags[..4] {
            assert!(matches!(r.push(packet(1, f)), Pushed::Held));
        }
        assert!(matches!(
            r.push(packet(1, &frags[4])),
            Pushed::Rejected(_, FragError::TooManyFragments(4))
        ));
        // Ping of death: data ending past 65535.
        let mut big = ipv4_fragments(&udp(&msg), 1024, 13)[1].clone();
        big[6..8].copy_from_slice(&(0x2000u16 | (65528 / 8)).to_be_bytes());
        assert!(matches!(
            r.push(packet(1, &big)),
            Pushed::Rejected(_, FragError::TooBig { .. })
        ));
        // Memory: at most 2 datagrams in flight; the oldest is evicted and counted.
        let mut r = Reassembler::new(FragLimits {
            max_datagrams: 2,
            ..FragLimits::default()
        });
        for id in 20..23 {
            let f = ipv4_fragments(&udp(&msg), 1024, id);
            assert!(matches!(r.push(packet(1, &f[0])), Pushed::Held));
        }
        let s = r.stats();
        assert_eq!((s.datagrams_evicted, s.incomplete, s.pending), (1, 1, 2));
        let mut losses = Vec::new();
        r.finish(&mut losses);
        assert_eq!(losses.len(), 2);
        assert!(losses.iter().all(|l| l.cause == LossCause::EndOfInput));
        assert_eq!(r.stats().incomplete, 3);
        // Hostile bytes never panic.
        let mut r = Reassembler::new(FragLimits::default());
        for f in &frags {
            for cut in 0..f.len().min(48) {
                let _ = r.push(packet(1, &f[..cut]));
            }
        }
    }

    /// Completed datagrams do not pile up in the expiry queue.
    #[test]
    fn the_expiry_queue_stays_bounded() {
        let msg = big_answer(4);
        let mut r = Reassembler::new(FragLimits {
            max_datagrams: 8,
            ..FragLimits::default()
        });
        for id in 0..1000u16 {
            assert!(push_all(&mut r, &ipv4_fragments(&udp(&msg), 512, id)).is_some());
        }
        assert!(r.expiry.len() <= 4 * 8 + 17, "{}", r.expiry.len());
        assert_eq!(r.stats().datagrams_reassembled, 1000);
    }

    #[test]
    fn a_missing_fragment_times_out_as_a_loss_with_the_question() {
        let msg = big_answer(16);
        let frags = ipv4_fragments(&udp(&msg), 1480, 0x77);
        let mut r = Reassembler::new(FragLimits::default());
        assert!(matches!(r.push(packet(1_000, &frags[0])), Pushed::Held));
        assert!(matches!(r.push(packet(2_000, &frags[2])), Pushed::Held));
        let mut losses = Vec::new();
        r.expire(1_900_000_000, &mut losses);
        assert!(losses.is_empty());
        r.expire(2_000_001_000, &mut losses);
        let [l] = &losses[..] else {
            panic!("{losses:?}")
        };
        assert_eq!(l.cause, LossCause::Timeout);
        assert_eq!((l.key.id, l.key.at), (0x77, HOP));
        assert_eq!(l.seen, vec![(0, 1480), (2960, 8 + msg.len() - 2960)]);
        assert_eq!(l.missing, vec![(1480, Some(2960))]);
        assert_eq!(l.total_len, Some(8 + msg.len()));
        assert_eq!(l.fragment_numbers(), Some((3, vec![2])));
        assert_eq!(
            (l.src(), l.dst()),
            ("10.250.0.53:53".into(), "10.244.1.2:40000".into())
        );
        let m = l.dns.as_ref().unwrap();
        assert_eq!((m.id, m.qr), (4660, true));
        assert_eq!(m.questions[0].name, "big.lab.test.");
        let s = r.stats();
        assert_eq!((s.incomplete, s.pending, s.datagrams_lost), (2, 0, 1));

        // Only later fragments: the end is unknown, no ports, no question.
        let mut r = Reassembler::new(FragLimits::default());
        assert!(matches!(r.push(packet(1, &frags[1])), Pushed::Held));
        let mut losses = Vec::new();
        r.finish(&mut losses);
        assert_eq!(losses[0].missing, vec![(0, Some(1480)), (2960, None)]);
        assert!(losses[0].dns.is_none() && losses[0].ports.is_none());
    }

    #[test]
    fn ipv6_fragments_are_rebuilt_and_lost_ones_reported() {
        let msg = big_answer(16);
        let frags = ipv6_fragments(&udp(&msg), 1232, 0xdead_beef);
        assert_eq!(frags.len(), 3);
        let mut r = Reassembler::new(FragLimits::default());
        let p = push_all(&mut r, &frags).expect("complete");
        assert_eq!(udp_payload(&p), msg);
        assert_eq!(p.orig_len as usize, 40 + 8 + msg.len());
        let ip = parse_ip(&p.data).unwrap();
        assert_eq!(ip.src.to_string(), "fd00::53");
        assert_eq!(r.stats().merged, 2);

        assert!(matches!(r.push(packet(5, &frags[0])), Pushed::Held));
        assert!(matches!(r.push(packet(5, &frags[1])), Pushed::Held));
        let mut losses = Vec::new();
        r.expire(3_000_000_000, &mut losses);
        let [l] = &losses[..] else {
            panic!("{losses:?}")
        };
        assert_eq!(l.key.id, 0xdead_beef);
        assert_eq!(l.missing, vec![(2464, None)]);
        assert_eq!(l.src(), "[fd00::53]:53");
        assert_eq!(l.dns.as_ref().unwrap().id, 4660);
    }

    /// A datagram whose middle fragment the capture cut decodes as cut, not malformed.
    #[test]
    fn a_fragment_cut_by_the_capture_makes_a_cut_datagram() {
        let msg = big_answer(16);
        let frags = ipv4_fragments(&udp(&msg), 1480, 5);
        let mut r = Reassembler::new(FragLimits::default());
        let mut cut = packet(1, &frags[1][..600]);
        cut.orig_len = frags[1].len() as u32;
        assert!(matches!(r.push(packet(1, &frags[0])), Pushed::Held));
        assert!(matches!(r.push(cut), Pushed::Held));
        let Pushed::Complete(p) = r.push(packet(1, &frags[2])) else {
            panic!()
        };
        assert_eq!(p.orig_len as usize, 20 + 8 + msg.len());
        assert_eq!(p.data.len(), 20 + 1480 + 580);
        let ip = parse_ip(&p.data).unwrap();
        assert!(ip.truncated && ip.missing > 0);
    }

    #[test]
    fn watched_datagrams_keep_later_fragments_of_watched_first_ones() {
        let msg = big_answer(16);
        let frags = ipv4_fragments(&udp(&msg), 1480, 5);
        let other = ipv4_fragments(&udp(&msg), 1480, 6);
        let mut w = WatchedDatagrams::default();
        w.note_kept(&frags[0]);
        assert!(w.is_later_fragment(&frags[1]) && w.is_later_fragment(&frags[2]));
        assert!(!w.is_later_fragment(&other[1]) && !w.is_later_fragment(&frags[0]));
    }

    /// Through the decoder: the datagram is decoded once, whole, like an unfragmented answer
    /// (and handed to the correlate stage); a lost fragment is a `fragment_loss` record, never
    /// a malformed or answering packet; every packet is in exactly one bucket.
    #[test]
    fn the_decoder_decodes_reassembled_answers_and_reports_losses() {
        use crate::event::SourceEvent;
        use crate::output::record::Record;
        use crate::{decode::decoder::Decoder, time::Clock};
        use std::sync::{Arc, RwLock};

        let names = Arc::new(RwLock::new(crate::kernel::attach::Names::default()));
        let mut d = Decoder::new(
            Clock::Epoch,
            names,
            crate::kernel::kallsyms::Kallsyms::default(),
            Default::default(),
        );
        d.collect_observations();
        let msg = big_answer(16);
        let mut out = Vec::new();
        for f in ipv4_fragments(&udp(&msg), 1480, 1) {
            d.on_event(SourceEvent::Packet(packet(1_000, &f)), &mut out);
        }
        let [Record::Packet(r)] = &out[..] else {
            panic!("{out:?}")
        };
        assert!(r.malformed.is_none() && !r.capture_truncated);
        assert_eq!(r.dns.as_ref().unwrap().answers.len(), 16);
        assert_eq!(r.src, "10.250.0.53:53");
        let mut obs = Vec::new();
        d.take_observed(&mut obs);
        assert_eq!(obs.len(), 1);

        // Fragment 2 of 3 never comes.
        out.clear();
        let frags = ipv4_fragments(&udp(&msg), 1480, 2);
        d.on_event(SourceEvent::Packet(packet(2_000, &frags[0])), &mut out);
        d.on_event(SourceEvent::Packet(packet(3_000, &frags[2])), &mut out);
        assert!(out.is_empty(), "{out:?}");
        d.finish(0, &mut out);
        let [Record::FragmentLoss(l)] = &out[..] else {
            panic!("{out:?}")
        };
        assert_eq!(
            (l.fragments, l.missing_fragments.clone()),
            (Some(3), Some(vec![2]))
        );
        assert_eq!(l.dns.as_ref().unwrap().id, 4660);
        assert!(
            l.summary
                .contains("answer 4660 TXT? big.lab.test. of 3 fragments: fragment 2 never seen"),
            "{}",
            l.summary
        );
        let line = crate::output::text::fragment_loss_line(l);
        assert!(line.contains("FRAGMENT LOSS netns:0x7/if3 in  udp 10.250.0.53:53 > 10.244.1.2:40000 ip id 0x2 (end of input)"), "{line}");
        let json = serde_json::to_value(&out[0]).unwrap();
        assert_eq!(json["type"], "fragment_loss");
        assert_eq!(json["missing"][0]["start"], 1480);
        obs.clear();
        d.take_observed(&mut obs);
        // A partial answer answers nothing: the correlate stage hears of its loss only.
        let [crate::correlate::Observed::Drop(loss)] = &obs[..] else {
            panic!("{obs:?}")
        };
        assert_eq!(loss.reason, crate::correlate::FRAGMENT_LOSS);
        assert_eq!(loss.location, "fragment 2 of 3 never seen");
        assert_eq!(loss.msg.as_ref().map(|m| (m.id, m.qr)), Some((4660, true)));

        let s = d.stats();
        assert_eq!((s.packets, s.decoded, s.malformed), (5, 1, 0));
        assert_eq!(
            (
                s.fragments_merged,
                s.fragments_incomplete,
                s.fragments_pending
            ),
            (2, 2, 0)
        );
        assert_eq!(
            s.packets,
            s.decoded
                + s.malformed
                + s.capture_truncated
                + s.tcp_control
                + s.other
                + s.summarised
                + s.fragments_merged
                + s.fragments_incomplete
                + s.fragments_pending
        );
        assert_eq!((s.datagrams_reassembled, s.datagrams_lost), (1, 1));
    }
}
