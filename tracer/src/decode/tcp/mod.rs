//! DNS over TCP: per-flow reassembly and RFC 7766 §8 / RFC 1035 §4.2.2 framing (each
//! message behind a 2-byte big-endian length; several per segment or one across many).
//!
//! A tracer sees segments, not a socket: some are lost, reordered, retransmitted or cut by
//! the snaplen, and flows may be first seen mid-stream. The reassembler never stalls on
//! that: anything it cannot frame is reported as [`TcpOutput::Malformed`] and dropped, and the
//! stream is resynchronised by assuming a message starts at the next usable segment. All
//! state is bounded: flows (LRU + idle eviction), bytes per flow, out-of-order segments.
mod flow;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;

use serde::Serialize;

use flow::{add_bytes, Flow};

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
    /// Flows dropped for room (LRU) or idleness.
    pub flows_evicted: u64,
    /// Stream bytes thrown away: unfinished messages, oversize messages, evicted buffers.
    pub bytes_dropped: u64,
    /// Holes in a stream that were given up on.
    pub gaps: u64,
    /// [`TcpOutput::Cut`] outputs: messages cut by the capture.
    pub cut: u64,
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
        self.stats
    }

    /// Every table within its bound (the fuzz harness's check after each event,
    /// `crate::fuzzing`): what is wrong, if anything.
    pub(crate) fn check_bounds(&self) -> Result<(), String> {
        let l = &self.limits;
        if self.flows.len() > l.max_flows || self.lru.len() != self.flows.len() {
            return Err(format!(
                "TCP flows: {} (LRU {}) > {}",
                self.flows.len(),
                self.lru.len(),
                l.max_flows
            ));
        }
        for (key, f) in &self.flows {
            let pending: usize = f.pending.iter().map(|(_, d)| d.len()).sum();
            if f.pending.len() > MAX_PENDING_SEGMENTS
                || pending != f.pending_bytes
                || f.held_bytes() > l.max_buffer
                || self.lru.get(&f.tick) != Some(key)
            {
                return Err(format!(
                    "TCP flow {key:?}: {} segments pending ({pending} bytes, {} counted), \
                     {} bytes held > {}, or not in the LRU",
                    f.pending.len(),
                    f.pending_bytes,
                    f.held_bytes(),
                    l.max_buffer
                ));
            }
        }
        Ok(())
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
        Flow::malformed(out, reason, held);
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
