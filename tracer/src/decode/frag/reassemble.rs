//! The per-hop reassembler: fragments held by datagram, checked as they come, rebuilt into one
//! packet when complete, given up (and reported) when late, evicted when over the limits.
use std::collections::{hash_map::Entry, HashMap, VecDeque};
use std::net::IpAddr;

use super::{
    first::{first_identity, FirstFragment, FirstFragments},
    parse_fragment, DatagramKey, FragError, FragLimits, Fragment, FragmentLoss, LossCause,
    MAX_IP_LENGTH,
};
use crate::event::CapturedPacket;

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
    pub(super) expiry: VecDeque<(u64, DatagramKey, u64)>,
    next_seq: u64,
    pub(super) bytes: usize,
    stats: FragStats,
    /// Heads of recent first fragments, over all hops: for kernel drops of later fragments.
    firsts: FirstFragments,
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
            firsts: FirstFragments::new(),
        }
    }

    pub fn stats(&self) -> FragStats {
        let mut s = self.stats;
        s.pending = self.partials.values().map(|p| p.packets).sum();
        s
    }

    /// What the first fragment of the datagram of later fragment `ip` (from its IP header on)
    /// said, seen at any hop shortly before `ts_ns`: a kernel drop of `ip` is a drop of that
    /// query or answer.
    pub fn first_fragment_of(&self, ip: &[u8], ts_ns: u64) -> Option<FirstFragment> {
        self.firsts.of(&parse_fragment(ip)?, ts_ns)
    }

    /// Every table within its bound (the fuzz harness's check after each event,
    /// `crate::fuzzing`): what is wrong, if anything.
    pub(crate) fn check_bounds(&self) -> Result<(), String> {
        let l = &self.limits;
        let held: usize = self.partials.values().map(|p| p.bytes).sum();
        if held != self.bytes {
            return Err(format!(
                "fragments: {} bytes counted, {held} held",
                self.bytes
            ));
        }
        if let Some(p) = self
            .partials
            .values()
            .find(|p| p.pieces.len() > l.max_fragments)
        {
            return Err(format!(
                "fragments: {} of one datagram > {}",
                p.pieces.len(),
                l.max_fragments
            ));
        }
        let bounds = [
            ("datagrams", self.partials.len(), l.max_datagrams),
            ("fragment bytes", self.bytes, l.max_bytes),
            (
                "fragment expiry queue",
                self.expiry.len(),
                4 * l.max_datagrams + 17,
            ),
            (
                "first fragments",
                self.firsts.len(),
                FirstFragments::CAPACITY,
            ),
        ];
        match bounds.iter().find(|(_, n, max)| n > max) {
            Some((what, n, max)) => Err(format!("{what}: {n} > {max}")),
            None => Ok(()),
        }
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
        if f.offset == 0 {
            self.firsts.note(&f, ts);
        }
        match self.add(key, &f, ts) {
            Ok(None) => Pushed::Held,
            Ok(Some(rebuilt)) => Pushed::Complete(CapturedPacket {
                orig_len: u32::try_from(rebuilt.1).unwrap_or(u32::MAX),
                data: rebuilt.0.into(),
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
            // Kept to count its later fragments, so counted against the limit too: else
            // one bad first fragment per IP id holds an entry each for the whole timeout.
            self.evict_over_limits();
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

/// What was seen of the datagram `p` at hop `key`, what never came, and what its first
/// fragment said, as the [`FragmentLoss`] of giving it up.
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
    let (ports, dns) = match p
        .pieces
        .first()
        .filter(|x| x.offset == 0)
        .and_then(|x| first_identity(key.proto, &x.data))
    {
        Some((ports, dns)) => (Some(ports), dns),
        None => (None, None),
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
