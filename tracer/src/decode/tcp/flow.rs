//! One direction of one TCP flow: the stream put back in order and cut into DNS messages.
use super::{TcpOutput, TcpStats, KEEP_CAPACITY, MAX_PENDING_SEGMENTS, MAX_SEGMENT};

pub(super) struct Flow {
    /// Sequence number of the next stream byte not yet appended to `buf`.
    next_seq: u32,
    /// The SYN's sequence number, to tell a retransmitted SYN from a new connection.
    pub(super) isn: Option<u32>,
    /// Stream bytes from a message boundary on; between pushes only an unfinished frame.
    pub(super) buf: Vec<u8>,
    /// Stream bytes still to discard of a frame too large to buffer.
    skip: usize,
    /// Segments beyond a hole, waiting for it to be filled.
    pub(super) pending: Vec<(u32, Vec<u8>)>,
    pub(super) pending_bytes: usize,
    /// The stream position is unknown (after a snaplen cut): the next new data starts a message.
    resync: bool,
    pub(super) last_ts: u64,
    pub(super) tick: u64,
}

/// Signed distance from `b` to `a` in sequence space (RFC 793 §3.3 modular comparison).
fn seq_diff(a: u32, b: u32) -> i64 {
    i64::from(a.wrapping_sub(b) as i32)
}

fn len32(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

pub(super) fn add_bytes(counter: &mut u64, n: usize) {
    *counter = counter.saturating_add(u64::try_from(n).unwrap_or(u64::MAX));
}

impl Flow {
    pub(super) fn new(next_seq: u32, isn: Option<u32>, ts: u64, tick: u64) -> Self {
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

    pub(super) fn held_bytes(&self) -> usize {
        self.buf.len().saturating_add(self.pending_bytes)
    }

    pub(super) fn malformed(out: &mut Vec<TcpOutput>, reason: String, bytes: usize) {
        out.push(TcpOutput::Malformed { reason, bytes });
    }

    /// Processes the payload of one segment whose first byte has sequence number `seq`.
    pub(super) fn segment(
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
            Self::malformed(out, reason, payload.len());
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
        Self::malformed(out, reason, partial);
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
        Self::malformed(out, reason, held);
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
                Self::malformed(out, reason, rest.len());
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
                Self::malformed(out, reason, total);
                pos += present;
                continue;
            }
            let Some(msg) = rest.get(2..total) else {
                break;
            };
            out.push(TcpOutput::Message(msg.to_vec()));
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
