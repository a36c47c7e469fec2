//! DNS over TCP: per-flow reassembly and RFC 7766 §8 / RFC 1035 §4.2.2 framing (each
//! message behind a 2-byte big-endian length; several per segment or one across many).
//!
//! A tracer sees segments, not a socket: some are lost, reordered, retransmitted or cut by
//! the snaplen, and flows may be first seen mid-stream. The reassembler never stalls on
//! that: anything it cannot frame is reported as [`TcpOutput::Malformed`] and dropped, and the
//! stream is resynchronised by assuming a message starts at the next usable segment. All
//! state is bounded: flows (LRU + idle eviction), bytes per flow, out-of-order segments.
use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;

use serde::Serialize;

pub const TCP_FIN: u8 = 0x01;
pub const TCP_SYN: u8 = 0x02;
pub const TCP_RST: u8 = 0x04;

/// Segments waiting behind a hole; real reordering is a few segments deep.
const MAX_PENDING_SEGMENTS: usize = 16;
/// Larger "segments" (offline GRO/TSO aggregates are ≤ 512 KiB) are garbage; also keeps
/// lengths far inside the ±2^31 range of sequence arithmetic.
const MAX_SEGMENT: usize = 1 << 24;
/// Buffers that grew for a large message are released once empty, so idle flows stay small.
const KEEP_CAPACITY: usize = 4096;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FlowKey {
    /// where the segment was seen: netns cookie, ifindex, direction (0 ingress / 1 egress); offline use 0s
    pub netns: u64,
    pub ifindex: u32,
    pub dir: u8,
    pub src: SocketAddr,
    pub dst: SocketAddr,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TcpLimits {
    pub max_flows: usize,
    /// Per flow: the largest message (with its length prefix) that can be reassembled, and
    /// the bound on the unfinished message plus out-of-order segments held.
    pub max_buffer: usize,
    pub idle_ns: u64,
}

impl Default for TcpLimits {
    fn default() -> Self {
        Self {
            max_flows: 4096,
            // Largest possible DNS message plus its length prefix.
            max_buffer: 64 * 1024 + 2,
            idle_ns: 30_000_000_000,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TcpOutput {
    /// One DNS message, without its length prefix.
    Message(Vec<u8>),
    /// bytes could not be framed: gap (lost/out-of-window segment), oversize
    Malformed { reason: String, bytes: usize },
    /// The capture (snaplen) cut the segment inside a message: the captured start of that
    /// message (without its length prefix, possibly empty), and its length from the prefix
    /// (`None` when the prefix itself was not captured).
    Cut {
        captured: Vec<u8>,
        message_len: Option<usize>,
    },
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct TcpStats {
    pub flows_active: usize,
    /// Flows dropped for room (LRU) or idleness.
    pub flows_evicted: u64,
    /// Stream bytes thrown away: unfinished messages, oversize messages, evicted buffers.
    pub bytes_dropped: u64,
    /// Holes in a stream that were given up on.
    pub gaps: u64,
    /// [`TcpOutput::Cut`] outputs: messages cut by the capture.
    pub cut: u64,
    pub messages: u64,
    /// [`TcpOutput::Malformed`] outputs.
    pub malformed: u64,
}

pub struct TcpReassembler {
    limits: TcpLimits,
    flows: HashMap<FlowKey, Flow>,
    /// Flows by last use. Ticks are unique, so the first entry is exactly the LRU flow.
    lru: BTreeMap<u64, FlowKey>,
    tick: u64,
    stats: TcpStats,
    /// What flows held when they were forgotten (evicted, expired, or at [`Self::finish`]),
    /// by flow: each unfinished message becomes a [`TcpOutput::Malformed`], so no stream
    /// byte goes unreported.
    closed: Vec<(FlowKey, TcpOutput)>,
}

struct Flow {
    /// Sequence number of the next stream byte not yet appended to `buf`.
    next_seq: u32,
    /// The SYN's sequence number, to tell a retransmitted SYN from a new connection.
    isn: Option<u32>,
    /// Stream bytes from a message boundary on; between pushes only an unfinished frame.
    buf: Vec<u8>,
    /// Stream bytes still to discard of a frame too large to buffer.
    skip: usize,
    /// Segments beyond a hole, waiting for it to be filled.
    pending: Vec<(u32, Vec<u8>)>,
    pending_bytes: usize,
    /// The stream position is unknown (after a snaplen cut): the next new data starts a message.
    resync: bool,
    last_ts: u64,
    tick: u64,
}

/// Signed distance from `b` to `a` in sequence space (RFC 793 §3.3 modular comparison).
fn seq_diff(a: u32, b: u32) -> i64 {
    i64::from(a.wrapping_sub(b) as i32)
}

fn len32(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

fn add_bytes(counter: &mut u64, n: usize) {
    *counter = counter.saturating_add(u64::try_from(n).unwrap_or(u64::MAX));
}

impl Flow {
    fn new(next_seq: u32, isn: Option<u32>, ts: u64, tick: u64) -> Self {
        Self {
            next_seq,
            isn,
            buf: Vec::new(),
            skip: 0,
            pending: Vec::new(),
            pending_bytes: 0,
            resync: false,
            last_ts: ts,
            tick,
        }
    }

    fn held_bytes(&self) -> usize {
        self.buf.len().saturating_add(self.pending_bytes)
    }

    fn malformed(stats: &mut TcpStats, out: &mut Vec<TcpOutput>, reason: String, bytes: usize) {
        stats.malformed = stats.malformed.saturating_add(1);
        out.push(TcpOutput::Malformed { reason, bytes });
    }

    /// Processes the payload of one segment whose first byte has sequence number `seq`.
    fn segment(
        &mut self,
        seq: u32,
        payload: &[u8],
        truncated: bool,
        max_buffer: usize,
        stats: &mut TcpStats,
        out: &mut Vec<TcpOutput>,
    ) {
        if payload.is_empty() {
            return;
        }
        if payload.len() > MAX_SEGMENT {
            add_bytes(&mut stats.bytes_dropped, payload.len());
            let reason = format!("{}-byte segment is not TCP payload", payload.len());
            Self::malformed(stats, out, reason, payload.len());
            return;
        }
        let mut payload = payload;
        let d = seq_diff(seq, self.next_seq);
        if d < 0 {
            if self.resync {
                // Its new part continues the uncaptured tail of the cut segment.
                return;
            }
            // Retransmission or overlap: keep only what was not seen yet.
            let seen = usize::try_from(d.unsigned_abs()).unwrap_or(usize::MAX);
            match payload.get(seen..) {
                Some(rest) if !rest.is_empty() => payload = rest,
                _ => return,
            }
        } else if d > 0 {
            let hole = usize::try_from(d).unwrap_or(usize::MAX);
            if self.resync {
                // Whatever was lost with the cut segment ends somewhere before here.
                self.next_seq = seq;
            } else if truncated {
                // Its tail is lost too, so it cannot wait for the hole: start over from it.
                let reason = format!(
                    "gap of {hole} bytes before seq {seq}, which is itself cut by the snaplen"
                );
                self.drop_held(reason, stats, out);
                self.next_seq = seq;
                self.resync = false;
            } else {
                self.pending.push((seq, payload.to_vec()));
                self.pending_bytes = self.pending_bytes.saturating_add(payload.len());
                if hole.saturating_add(payload.len()) <= max_buffer
                    && self.within_limits(max_buffer)
                {
                    return;
                }
                self.give_up(max_buffer, stats, out);
                self.settle(max_buffer, stats, out);
                return;
            }
        }
        self.resync = false;
        self.append(payload, stats);
        self.drain_pending(stats);
        self.frame(max_buffer, stats, out);
        if truncated {
            self.cut(stats, out);
        }
        self.settle(max_buffer, stats, out);
    }

    /// Restarts at the earliest pending segment while the stream position is lost, and gives
    /// up on holes until the flow fits its buffer again. Each round consumes a pending
    /// segment, so this ends.
    fn settle(&mut self, max_buffer: usize, stats: &mut TcpStats, out: &mut Vec<TcpOutput>) {
        while !self.pending.is_empty() {
            if self.resync {
                self.restart_at_pending(max_buffer, stats, out);
            } else if !self.within_limits(max_buffer) {
                self.give_up(max_buffer, stats, out);
            } else {
                break;
            }
        }
        self.trim_capacity();
    }

    /// The rest of the last segment was not captured: the unfinished message cannot complete.
    /// Frames complete in the captured part were emitted already; the captured start of the
    /// cut one is handed on as [`TcpOutput::Cut`], to be decoded as far as it goes.
    fn cut(&mut self, stats: &mut TcpStats, out: &mut Vec<TcpOutput>) {
        self.resync = true;
        if self.skip > 0 {
            // Inside a frame too large to buffer, already reported.
            self.skip = 0;
            self.buf.clear();
            return;
        }
        let message_len = self
            .buf
            .first_chunk::<2>()
            .map(|&[h0, h1]| usize::from(u16::from_be_bytes([h0, h1])));
        let captured = self.buf.get(2..).map(<[u8]>::to_vec).unwrap_or_default();
        self.buf.clear();
        stats.cut = stats.cut.saturating_add(1);
        out.push(TcpOutput::Cut {
            captured,
            message_len,
        });
    }

    fn within_limits(&self, max_buffer: usize) -> bool {
        self.pending.len() <= MAX_PENDING_SEGMENTS && self.held_bytes() <= max_buffer
    }

    /// Gives up on the hole before the earliest pending segment: drops the unfinished message
    /// and restarts framing at that segment.
    fn give_up(&mut self, max_buffer: usize, stats: &mut TcpStats, out: &mut Vec<TcpOutput>) {
        let next = self.next_seq;
        let Some(first) = self
            .pending
            .iter()
            .map(|(s, _)| *s)
            .min_by_key(|s| seq_diff(*s, next))
        else {
            return;
        };
        let hole = seq_diff(first, next);
        let reason =
            format!("gap of {hole} bytes before seq {first} (lost or out-of-window segment)");
        stats.gaps = stats.gaps.saturating_add(1);
        let partial = self.buf.len();
        add_bytes(&mut stats.bytes_dropped, partial);
        self.buf.clear();
        self.skip = 0;
        Self::malformed(stats, out, reason, partial);
        self.restart_at_pending(max_buffer, stats, out);
    }

    /// Drops everything held (unfinished message and pending segments) because of a gap.
    fn drop_held(&mut self, reason: String, stats: &mut TcpStats, out: &mut Vec<TcpOutput>) {
        let held = self.held_bytes();
        stats.gaps = stats.gaps.saturating_add(1);
        add_bytes(&mut stats.bytes_dropped, held);
        self.buf.clear();
        self.pending.clear();
        self.pending_bytes = 0;
        self.skip = 0;
        Self::malformed(stats, out, reason, held);
    }

    fn restart_at_pending(
        &mut self,
        max_buffer: usize,
        stats: &mut TcpStats,
        out: &mut Vec<TcpOutput>,
    ) {
        let next = self.next_seq;
        if let Some(&(first, _)) = self.pending.iter().min_by_key(|(s, _)| seq_diff(*s, next)) {
            self.next_seq = first;
            self.resync = false;
            self.drain_pending(stats);
            self.frame(max_buffer, stats, out);
        }
        self.trim_capacity();
    }

    fn append(&mut self, data: &[u8], stats: &mut TcpStats) {
        self.next_seq = self.next_seq.wrapping_add(len32(data.len()));
        let skipped = self.skip.min(data.len());
        self.skip -= skipped;
        add_bytes(&mut stats.bytes_dropped, skipped);
        self.buf
            .extend_from_slice(data.get(skipped..).unwrap_or_default());
    }

    /// Appends every pending segment that the stream has reached.
    fn drain_pending(&mut self, stats: &mut TcpStats) {
        loop {
            let next = self.next_seq;
            let Some(i) = self
                .pending
                .iter()
                .position(|(s, _)| seq_diff(*s, next) <= 0)
            else {
                return;
            };
            let (seq, data) = self.pending.swap_remove(i);
            self.pending_bytes = self.pending_bytes.saturating_sub(data.len());
            let seen = usize::try_from(seq_diff(next, seq)).unwrap_or(usize::MAX);
            if let Some(fresh) = data.get(seen..) {
                self.append(fresh, stats);
            }
        }
    }

    /// Emits every complete frame in `buf`.
    fn frame(&mut self, max_buffer: usize, stats: &mut TcpStats, out: &mut Vec<TcpOutput>) {
        let mut pos = 0usize;
        while let Some(rest) = self.buf.get(pos..) {
            let Some(&[h0, h1]) = rest.first_chunk::<2>() else {
                break;
            };
            let len = usize::from(u16::from_be_bytes([h0, h1]));
            let total = len + 2;
            if len == 0 {
                // No DNS message is empty (RFC 1035 §4.1.1 needs a 12-byte header): this is
                // not DNS or not a frame boundary, so nothing after it can be trusted either.
                add_bytes(&mut stats.bytes_dropped, rest.len());
                let reason = "zero-length frame: stream is not DNS or lost sync".into();
                Self::malformed(stats, out, reason, rest.len());
                pos = self.buf.len();
                self.skip = 0;
                self.resync = true;
                break;
            }
            if total > max_buffer {
                let present = rest.len().min(total);
                add_bytes(&mut stats.bytes_dropped, present);
                self.skip = total - present;
                let reason =
                    format!("{len}-byte message exceeds the {max_buffer}-byte flow buffer");
                Self::malformed(stats, out, reason, total);
                pos += present;
                continue;
            }
            let Some(msg) = rest.get(2..total) else {
                break;
            };
            out.push(TcpOutput::Message(msg.to_vec()));
            stats.messages = stats.messages.saturating_add(1);
            pos += total;
        }
        if pos >= self.buf.len() {
            self.buf.clear();
        } else {
            self.buf.drain(..pos);
        }
    }

    fn trim_capacity(&mut self) {
        if self.buf.is_empty() && self.buf.capacity() > KEEP_CAPACITY {
            self.buf = Vec::new();
        }
    }
}

impl TcpReassembler {
    pub fn new(limits: TcpLimits) -> Self {
        Self {
            limits: TcpLimits {
                // A flow must exist to be reassembled at all.
                max_flows: limits.max_flows.max(1),
                ..limits
            },
            flows: HashMap::new(),
            lru: BTreeMap::new(),
            tick: 0,
            stats: TcpStats::default(),
            closed: Vec::new(),
        }
    }

    /// Feeds one segment of flow `key`. `truncated` means the capture holds only a prefix of
    /// the segment's payload. Complete messages and framing failures are appended to `out`.
    #[expect(
        clippy::too_many_arguments,
        reason = "one call per segment; a parameter struct would only be rebuilt each time"
    )]
    pub fn push(
        &mut self,
        ts_ns: u64,
        key: FlowKey,
        seq: u32,
        flags: u8,
        payload: &[u8],
        truncated: bool,
        out: &mut Vec<TcpOutput>,
    ) {
        let syn = flags & TCP_SYN != 0;
        let rst = flags & TCP_RST != 0;
        let fin = flags & TCP_FIN != 0;
        self.tick = self.tick.wrapping_add(1);
        let tick = self.tick;
        let Self {
            limits,
            flows,
            lru,
            stats,
            closed,
            ..
        } = self;

        if let Some(flow) = flows.get_mut(&key) {
            lru.remove(&flow.tick);
            flow.tick = tick;
            flow.last_ts = flow.last_ts.max(ts_ns);
            lru.insert(tick, key);
            if syn && flow.isn != Some(seq) {
                // Same 4-tuple, new connection: the old stream is over.
                close(flow, "connection restarted (new SYN)", stats, out);
                *flow = Flow::new(seq.wrapping_add(1), Some(seq), ts_ns, tick);
            }
        } else {
            if rst || (payload.is_empty() && !syn) {
                // Nothing to anchor a stream on (pure ACK/FIN/RST of an unknown flow).
                return;
            }
            while flows.len() >= limits.max_flows {
                let Some((_, old)) = lru.pop_first() else {
                    break;
                };
                if let Some(mut evicted) = flows.remove(&old) {
                    stats.flows_evicted = stats.flows_evicted.saturating_add(1);
                    forget(
                        old,
                        &mut evicted,
                        "flow evicted (too many flows)",
                        stats,
                        closed,
                    );
                }
            }
            // Without a SYN, assume the first segment seen starts a message.
            let flow = match syn {
                true => Flow::new(seq.wrapping_add(1), Some(seq), ts_ns, tick),
                false => Flow::new(seq, None, ts_ns, tick),
            };
            lru.insert(tick, key);
            flows.insert(key, flow);
        }
        let Some(flow) = flows.get_mut(&key) else {
            return;
        };

        if rst {
            // RFC 9293 §3.5.3: data on a RST is diagnostic, not stream bytes.
            close(flow, "connection reset (RST)", stats, out);
        } else {
            let data_seq = if syn { seq.wrapping_add(1) } else { seq };
            flow.segment(data_seq, payload, truncated, limits.max_buffer, stats, out);
            if !fin {
                return;
            }
            close(flow, "connection closed (FIN)", stats, out);
        }
        lru.remove(&flow.tick);
        flows.remove(&key);
    }

    /// Forgets flows idle for more than `idle_ns`; their unfinished bytes count as dropped.
    ///
    /// Walks flows from the least recently used and stops at the first active one, so it is
    /// cheap enough to call per packet. Use order tracks timestamps closely enough (a flow
    /// with a slightly older timestamp behind a newer one just expires a little later).
    pub fn expire(&mut self, now_ns: u64) {
        while let Some((_, &key)) = self.lru.first_key_value() {
            if let Some(flow) = self.flows.get(&key) {
                if now_ns.saturating_sub(flow.last_ts) <= self.limits.idle_ns {
                    return;
                }
                if let Some(mut flow) = self.flows.remove(&key) {
                    self.stats.flows_evicted = self.stats.flows_evicted.saturating_add(1);
                    let why = "flow idle too long";
                    forget(key, &mut flow, why, &mut self.stats, &mut self.closed);
                }
            }
            self.lru.pop_first();
        }
    }

    /// The input ended (end of file, or the trace stopped): every unfinished message of every
    /// flow becomes a [`TcpOutput::Malformed`] in [`Self::take_closed`]; the flows are forgotten.
    pub fn finish(&mut self) {
        let mut flows: Vec<(u64, FlowKey)> = std::mem::take(&mut self.lru).into_iter().collect();
        flows.sort_unstable_by_key(|(tick, _)| *tick);
        for (_, key) in flows {
            if let Some(mut flow) = self.flows.remove(&key) {
                forget(
                    key,
                    &mut flow,
                    "stream ended",
                    &mut self.stats,
                    &mut self.closed,
                );
            }
        }
        self.flows.clear();
    }

    /// Moves out what forgotten flows still held (see [`Self::closed`](TcpReassembler)).
    pub fn take_closed(&mut self, out: &mut Vec<(FlowKey, TcpOutput)>) {
        out.append(&mut self.closed);
    }

    pub fn stats(&self) -> TcpStats {
        TcpStats {
            flows_active: self.flows.len(),
            ..self.stats
        }
    }
}

/// Reports what a flow still held when its stream ended.
fn close(flow: &mut Flow, why: &str, stats: &mut TcpStats, out: &mut Vec<TcpOutput>) {
    let held = flow.held_bytes();
    if !flow.pending.is_empty() {
        stats.gaps = stats.gaps.saturating_add(1);
    }
    if held > 0 {
        add_bytes(&mut stats.bytes_dropped, held);
        let reason = if !flow.pending.is_empty() {
            format!("{why} with {held} bytes held behind a gap")
        } else if let Some(&[h0, h1]) = flow.buf.first_chunk::<2>() {
            let len = usize::from(u16::from_be_bytes([h0, h1]));
            let short = (len + 2).saturating_sub(held);
            format!("{why} {short} bytes short of a {len}-byte message")
        } else {
            format!("{why} inside a message's 2-byte length prefix ({held} byte)")
        };
        Flow::malformed(stats, out, reason, held);
    }
    flow.buf.clear();
    flow.pending.clear();
    flow.pending_bytes = 0;
}

/// [`close`] for a flow that is being forgotten, its report kept with its key.
fn forget(
    key: FlowKey,
    flow: &mut Flow,
    why: &str,
    stats: &mut TcpStats,
    closed: &mut Vec<(FlowKey, TcpOutput)>,
) {
    let mut out = Vec::new();
    close(flow, why, stats, &mut out);
    closed.extend(out.into_iter().map(|o| (key, o)));
}

#[cfg(test)]
mod tests {
    use super::*;

    const PSH_ACK: u8 = 0x18;

    fn key(port: u16) -> FlowKey {
        FlowKey {
            netns: 0,
            ifindex: 0,
            dir: 0,
            src: SocketAddr::from(([10, 0, 0, 1], port)),
            dst: SocketAddr::from(([10, 0, 0, 53], 53)),
        }
    }

    /// A fake DNS message body of `len` bytes whose first two bytes identify it.
    fn msg(id: u16, len: usize) -> Vec<u8> {
        let mut m = vec![0xab; len];
        m[..2].copy_from_slice(&id.to_be_bytes());
        m
    }

    fn framed(m: &[u8]) -> Vec<u8> {
        let mut v = (m.len() as u16).to_be_bytes().to_vec();
        v.extend_from_slice(m);
        v
    }

    fn messages(out: &[TcpOutput]) -> Vec<Vec<u8>> {
        out.iter()
            .filter_map(|o| match o {
                TcpOutput::Message(m) => Some(m.clone()),
                _ => None,
            })
            .collect()
    }

    fn malformed(out: &[TcpOutput]) -> Vec<(String, usize)> {
        out.iter()
            .filter_map(|o| match o {
                TcpOutput::Malformed { reason, bytes } => Some((reason.clone(), *bytes)),
                _ => None,
            })
            .collect()
    }

    fn reasm() -> TcpReassembler {
        TcpReassembler::new(TcpLimits::default())
    }

    fn closed(r: &mut TcpReassembler) -> Vec<(FlowKey, String)> {
        let mut v = Vec::new();
        r.take_closed(&mut v);
        v.into_iter()
            .map(|(k, o)| match o {
                TcpOutput::Malformed { reason, .. } => (k, reason),
                o => panic!("{o:?}"),
            })
            .collect()
    }

    /// What an evicted, expired or ended flow held is reported, with its flow, never lost.
    #[test]
    fn forgotten_flows_report_their_unfinished_messages() {
        let mut r = TcpReassembler::new(TcpLimits {
            max_flows: 1,
            ..TcpLimits::default()
        });
        let mut out = Vec::new();
        // Flow 1: 3 bytes of a 20-byte message; flow 2 evicts it.
        r.push(
            1,
            key(1),
            100,
            PSH_ACK,
            &framed(&msg(1, 20))[..5],
            false,
            &mut out,
        );
        r.push(2, key(2), 100, PSH_ACK, &[0], false, &mut out);
        assert!(out.is_empty());
        assert_eq!(
            closed(&mut r),
            [(
                key(1),
                "flow evicted (too many flows) 17 bytes short of a 20-byte message".to_string()
            )]
        );
        // Flow 2 holds one byte of a length prefix; it idles out.
        r.expire(2 + TcpLimits::default().idle_ns + 1);
        assert_eq!(
            closed(&mut r),
            [(
                key(2),
                "flow idle too long inside a message's 2-byte length prefix (1 byte)".to_string()
            )]
        );
        // At the end of input.
        r.push(
            3,
            key(3),
            100,
            PSH_ACK,
            &framed(&msg(3, 30))[..12],
            false,
            &mut out,
        );
        r.finish();
        assert_eq!(
            closed(&mut r),
            [(
                key(3),
                "stream ended 20 bytes short of a 30-byte message".to_string()
            )]
        );
        assert_eq!(r.stats().flows_active, 0);
        // A flow with nothing held reports nothing.
        r.push(
            4,
            key(4),
            100,
            PSH_ACK,
            &framed(&msg(4, 30)),
            false,
            &mut out,
        );
        r.finish();
        assert!(closed(&mut r).is_empty());
    }

    #[test]
    fn two_messages_in_one_segment() {
        let mut r = reasm();
        let (a, b) = (msg(1, 30), msg(2, 40));
        let mut seg = framed(&a);
        seg.extend_from_slice(&framed(&b));
        let mut out = Vec::new();
        r.push(1, key(1000), 5000, PSH_ACK, &seg, false, &mut out);
        assert_eq!(out, vec![TcpOutput::Message(a), TcpOutput::Message(b)]);
        assert_eq!(r.stats().messages, 2);
        assert_eq!(r.stats().flows_active, 1);
    }

    #[test]
    fn one_message_over_three_segments() {
        let mut r = reasm();
        let m = msg(7, 300);
        let f = framed(&m);
        let mut out = Vec::new();
        // Split inside the length prefix too.
        r.push(1, key(1), 100, 0x02, &[], false, &mut out); // SYN, ISN 100
        r.push(2, key(1), 101, PSH_ACK, &f[..1], false, &mut out);
        assert!(out.is_empty());
        r.push(3, key(1), 102, PSH_ACK, &f[1..150], false, &mut out);
        assert!(out.is_empty());
        r.push(4, key(1), 251, PSH_ACK, &f[150..], false, &mut out);
        assert_eq!(out, vec![TcpOutput::Message(m)]);
    }

    #[test]
    fn syn_with_data_and_retransmitted_syn() {
        let mut r = reasm();
        let m = msg(3, 20);
        let mut out = Vec::new();
        // TCP Fast Open: data rides on the SYN, starting at ISN+1.
        r.push(1, key(2), 9, 0x02, &framed(&m), false, &mut out);
        // A retransmitted SYN must not reset the stream or re-emit.
        r.push(2, key(2), 9, 0x02, &framed(&m), false, &mut out);
        assert_eq!(out, vec![TcpOutput::Message(m)]);
    }

    #[test]
    fn retransmits_are_ignored_and_overlaps_trimmed() {
        let mut r = reasm();
        let (a, b) = (msg(1, 50), msg(2, 50));
        let mut stream = framed(&a);
        stream.extend_from_slice(&framed(&b));
        let mut out = Vec::new();
        r.push(1, key(3), 1000, PSH_ACK, &stream[..40], false, &mut out);
        r.push(2, key(3), 1000, PSH_ACK, &stream[..40], false, &mut out); // pure retransmit
        r.push(3, key(3), 1020, PSH_ACK, &stream[20..70], false, &mut out); // overlap
        assert_eq!(out, vec![TcpOutput::Message(a.clone())]);
        r.push(4, key(3), 1000, PSH_ACK, &stream, false, &mut out); // repacketised retransmit
        assert_eq!(out, vec![TcpOutput::Message(a), TcpOutput::Message(b)]);
        assert_eq!(r.stats().bytes_dropped, 0);
    }

    #[test]
    fn out_of_order_segments_are_reordered() {
        let mut r = reasm();
        let m = msg(9, 100);
        let f = framed(&m);
        let mut out = Vec::new();
        r.push(1, key(4), 0, PSH_ACK, &f[..10], false, &mut out);
        r.push(2, key(4), 60, PSH_ACK, &f[60..], false, &mut out);
        r.push(3, key(4), 30, PSH_ACK, &f[30..60], false, &mut out);
        assert!(out.is_empty());
        r.push(4, key(4), 10, PSH_ACK, &f[10..30], false, &mut out);
        assert_eq!(out, vec![TcpOutput::Message(m)]);
        assert_eq!(r.stats().gaps, 0);
    }

    #[test]
    fn sequence_wraparound() {
        let mut r = reasm();
        let m = msg(5, 64);
        let f = framed(&m);
        let mut out = Vec::new();
        let start = u32::MAX - 9;
        r.push(1, key(5), start, PSH_ACK, &f[..30], false, &mut out);
        r.push(
            2,
            key(5),
            start.wrapping_add(30),
            PSH_ACK,
            &f[30..],
            false,
            &mut out,
        );
        // Retransmit across the wrap is still recognised as old.
        r.push(
            3,
            key(5),
            start.wrapping_add(5),
            PSH_ACK,
            &f[5..40],
            false,
            &mut out,
        );
        assert_eq!(out, vec![TcpOutput::Message(m)]);
    }

    #[test]
    fn gap_is_reported_then_stream_resyncs() {
        let mut r = reasm();
        let (a, b) = (msg(1, 200), msg(2, 30));
        let fa = framed(&a);
        let mut out = Vec::new();
        r.push(1, key(6), 1000, PSH_ACK, &fa[..100], false, &mut out);
        // fa[100..] is lost; the next segment starts message b, far beyond the buffer window.
        let far = 1000 + 100 + 70_000;
        r.push(2, key(6), far, PSH_ACK, &framed(&b), false, &mut out);
        let bad = malformed(&out);
        assert_eq!(bad.len(), 1);
        assert!(bad[0].0.starts_with("gap of 70000 bytes"), "{bad:?}");
        assert_eq!(bad[0].1, 100);
        assert_eq!(messages(&out), vec![b.clone()]);
        // The stream keeps going from there.
        out.clear();
        let c = msg(3, 10);
        r.push(3, key(6), far + 32, PSH_ACK, &framed(&c), false, &mut out);
        assert_eq!(out, vec![TcpOutput::Message(c)]);
        let s = r.stats();
        assert_eq!(
            (s.gaps, s.bytes_dropped, s.messages, s.malformed),
            (1, 100, 2, 1)
        );
    }

    #[test]
    fn too_many_pending_segments_is_a_gap() {
        let mut r = reasm();
        let mut out = Vec::new();
        r.push(1, key(7), 0, PSH_ACK, &[0, 50, 1, 2, 3], false, &mut out); // partial message
                                                                           // Bytes 5..10 never arrive; 17 one-message segments follow.
        let mut seq = 10u32;
        for i in 0..=MAX_PENDING_SEGMENTS as u16 {
            let f = framed(&msg(i, 12));
            r.push(2, key(7), seq, PSH_ACK, &f, false, &mut out);
            seq += f.len() as u32;
        }
        let bad = malformed(&out);
        assert_eq!(bad.len(), 1, "{bad:?}");
        assert_eq!(bad[0].1, 5);
        assert_eq!(messages(&out).len(), MAX_PENDING_SEGMENTS + 1);
        assert_eq!(r.stats().gaps, 1);
    }

    #[test]
    fn oversize_message_is_skipped_exactly() {
        let mut r = TcpReassembler::new(TcpLimits {
            max_buffer: 102,
            ..TcpLimits::default()
        });
        let (big, small) = (msg(1, 250), msg(2, 20));
        let mut stream = framed(&big);
        stream.extend_from_slice(&framed(&small));
        let mut out = Vec::new();
        r.push(1, key(8), 0, PSH_ACK, &stream[..80], false, &mut out);
        r.push(2, key(8), 80, PSH_ACK, &stream[80..200], false, &mut out);
        r.push(3, key(8), 200, PSH_ACK, &stream[200..], false, &mut out);
        let bad = malformed(&out);
        assert_eq!(bad.len(), 1);
        assert_eq!(bad[0].1, 252);
        assert!(bad[0].0.contains("250-byte message exceeds"), "{bad:?}");
        assert_eq!(messages(&out), vec![small]);
        assert_eq!(r.stats().bytes_dropped, 252);
    }

    #[test]
    fn snaplen_cut_segment_hands_on_partial_and_resyncs() {
        let mut r = reasm();
        let (a, b, c) = (msg(1, 20), msg(2, 100), msg(3, 15));
        let mut seg = framed(&a);
        seg.extend_from_slice(&framed(&b));
        let mut out = Vec::new();
        // Capture holds a and the first 30 bytes of b (its prefix and 28 bytes of it).
        r.push(1, key(9), 0, PSH_ACK, &seg[..22 + 30], true, &mut out);
        assert_eq!(
            out,
            vec![
                TcpOutput::Message(a),
                TcpOutput::Cut {
                    captured: b[..28].to_vec(),
                    message_len: Some(100),
                }
            ]
        );
        assert!(malformed(&out).is_empty());
        assert_eq!(r.stats().cut, 1);
        assert_eq!(r.stats().bytes_dropped, 0);
        out.clear();
        // A retransmission of the cut segment (cut again) adds nothing and emits nothing.
        r.push(2, key(9), 0, PSH_ACK, &seg[..22 + 30], true, &mut out);
        r.push(2, key(9), 10, PSH_ACK, &seg[10..80], false, &mut out);
        assert!(out.is_empty(), "{out:?}");
        // Next segment (after the uncaptured tail) starts a new message.
        r.push(
            2,
            key(9),
            seg.len() as u32,
            PSH_ACK,
            &framed(&c),
            false,
            &mut out,
        );
        assert_eq!(out, vec![TcpOutput::Message(c)]);
    }

    #[test]
    fn fin_and_rst_report_leftovers_and_forget_flow() {
        let mut r = reasm();
        let mut out = Vec::new();
        let m = msg(1, 40);
        let f = framed(&m);
        r.push(1, key(10), 0, PSH_ACK, &f[..20], false, &mut out);
        r.push(2, key(10), 20, PSH_ACK | TCP_FIN, &[], false, &mut out);
        let bad = malformed(&out);
        assert_eq!(bad.len(), 1);
        assert!(bad[0].0.contains("FIN"), "{bad:?}");
        assert_eq!(bad[0].1, 20);
        assert_eq!(r.stats().flows_active, 0);

        // Complete message with FIN on the same segment: no leftovers.
        out.clear();
        r.push(3, key(11), 0, PSH_ACK | TCP_FIN, &f, false, &mut out);
        assert_eq!(out, vec![TcpOutput::Message(m)]);
        assert_eq!(r.stats().flows_active, 0);

        out.clear();
        r.push(4, key(12), 0, PSH_ACK, &f[..5], false, &mut out);
        r.push(5, key(12), 5, TCP_RST, &[], false, &mut out);
        assert!(malformed(&out)[0].0.contains("RST"));
        assert_eq!(r.stats().flows_active, 0);
        // Stray FIN/RST for unknown flows create nothing.
        r.push(6, key(13), 5, TCP_RST, &[], false, &mut out);
        r.push(6, key(14), 5, TCP_FIN | 0x10, &[], false, &mut out);
        assert_eq!(r.stats().flows_active, 0);
    }

    #[test]
    fn new_syn_on_same_tuple_restarts_stream() {
        let mut r = reasm();
        let mut out = Vec::new();
        r.push(1, key(15), 100, TCP_SYN, &[], false, &mut out);
        r.push(2, key(15), 101, PSH_ACK, &[0, 30, 1], false, &mut out);
        let m = msg(4, 12);
        r.push(3, key(15), 7777, TCP_SYN, &[], false, &mut out);
        r.push(4, key(15), 7778, PSH_ACK, &framed(&m), false, &mut out);
        assert_eq!(malformed(&out).len(), 1);
        assert_eq!(messages(&out), vec![m]);
    }

    #[test]
    fn zero_length_frame_drops_segment_and_resyncs() {
        let mut r = reasm();
        let m = msg(1, 12);
        let mut out = Vec::new();
        // A valid message, then zeros (not DNS): one report for the rest, not one per pair.
        let mut seg = framed(&m);
        seg.extend_from_slice(&[0u8; 100]);
        r.push(1, key(16), 0, PSH_ACK, &seg, false, &mut out);
        assert_eq!(messages(&out), vec![m.clone()]);
        assert_eq!(malformed(&out).len(), 1);
        assert_eq!(malformed(&out)[0].1, 100);
        out.clear();
        // Next segment is taken as a message start, even after a jump.
        r.push(2, key(16), 500, PSH_ACK, &framed(&m), false, &mut out);
        assert_eq!(out, vec![TcpOutput::Message(m)]);
    }

    #[test]
    fn lru_eviction_bounds_flows() {
        let mut r = TcpReassembler::new(TcpLimits {
            max_flows: 100,
            ..TcpLimits::default()
        });
        let mut out = Vec::new();
        for i in 0..10_000u32 {
            let k = FlowKey {
                netns: 0,
                ifindex: i,
                dir: 0,
                src: SocketAddr::from(([10, 0, 0, 1], 1000)),
                dst: SocketAddr::from(([10, 0, 0, 2], 53)),
            };
            r.push(u64::from(i), k, 0, PSH_ACK, &[0, 40, 1, 2], false, &mut out);
            assert!(r.stats().flows_active <= 100);
        }
        let s = r.stats();
        assert_eq!(s.flows_active, 100);
        assert_eq!(s.flows_evicted, 9_900);
        assert_eq!(s.bytes_dropped, 9_900 * 4);
        assert!(out.is_empty());
    }

    #[test]
    fn lru_keeps_recently_used_flow() {
        let mut r = TcpReassembler::new(TcpLimits {
            max_flows: 2,
            ..TcpLimits::default()
        });
        let mut out = Vec::new();
        let m = msg(1, 20);
        let f = framed(&m);
        r.push(1, key(1), 0, PSH_ACK, &f[..10], false, &mut out);
        r.push(2, key(2), 0, PSH_ACK, &f[..10], false, &mut out);
        r.push(3, key(1), 10, 0x10, &[], false, &mut out); // touch flow 1
        r.push(4, key(3), 0, PSH_ACK, &f[..10], false, &mut out); // evicts flow 2
        r.push(5, key(1), 10, PSH_ACK, &f[10..], false, &mut out);
        assert_eq!(out, vec![TcpOutput::Message(m)]);
        assert_eq!(r.stats().flows_evicted, 1);
    }

    #[test]
    fn idle_flows_expire() {
        let mut r = reasm();
        let mut out = Vec::new();
        r.push(1_000, key(1), 0, PSH_ACK, &[0, 9, 1], false, &mut out);
        r.push(
            20_000_000_000,
            key(2),
            0,
            PSH_ACK,
            &[0, 9, 1],
            false,
            &mut out,
        );
        r.expire(31_000_000_000);
        let s = r.stats();
        assert_eq!(
            (s.flows_active, s.flows_evicted, s.bytes_dropped),
            (1, 1, 3)
        );
        r.expire(60_000_000_000);
        assert_eq!(r.stats().flows_active, 0);
        // The flow's LRU entry went with it: new flows still fit.
        r.push(
            70_000_000_000,
            key(3),
            0,
            PSH_ACK,
            &[0, 9, 1],
            false,
            &mut out,
        );
        assert_eq!(r.stats().flows_active, 1);
    }

    #[test]
    fn garbage_never_panics_and_stays_bounded() {
        let mut r = TcpReassembler::new(TcpLimits {
            max_flows: 8,
            max_buffer: 600,
            idle_ns: 1_000,
        });
        let mut state = 0x853c_49e6_748f_ea9bu64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let mut out = Vec::new();
        let mut seqs = [0u32; 16];
        for t in 0..50_000u64 {
            let r0 = next();
            let f = (r0 % 16) as usize;
            let len = (r0 >> 8) as usize % 300;
            let payload: Vec<u8> = (0..len).map(|_| next() as u8).collect();
            // Mostly in order, sometimes jumping back or ahead.
            let seq = match (r0 >> 20) % 8 {
                0 => seqs[f].wrapping_sub((r0 >> 24) as u32 % 500),
                1 => seqs[f].wrapping_add((r0 >> 24) as u32 % 5_000),
                2 => (r0 >> 32) as u32,
                _ => seqs[f],
            };
            seqs[f] = seq.wrapping_add(len as u32);
            let flags = [PSH_ACK, PSH_ACK, PSH_ACK, TCP_SYN, TCP_FIN, TCP_RST, 0x10]
                [(r0 >> 40) as usize % 7];
            r.push(
                t,
                key(f as u16),
                seq,
                flags,
                &payload,
                (r0 >> 50) % 13 == 0,
                &mut out,
            );
            for flow in r.flows.values() {
                assert!(flow.pending.len() <= MAX_PENDING_SEGMENTS);
                assert!(flow.held_bytes() <= 600, "{}", flow.held_bytes());
            }
            assert!(r.stats().flows_active <= 8);
            assert_eq!(r.lru.len(), r.flows.len());
            if t % 1_000 == 0 {
                r.expire(t);
            }
            out.clear();
        }
    }
}
