//! What each captured packet was part of, for the pcapng files (`-w`, `--record`).
//!
//! A packet is captured before dnspath knows its transaction: that is decided when the
//! answer reaches the client, or at the timeout. So each packet (and each kernel drop) waits
//! here, in capture order, until the records that explain it came out of the pipeline — its
//! transaction (`txn= leg= hop= role=`), a loop of its question (`loop= cycle=`), a race drop
//! of its query (`race=race-drop sibling=`) — and is released with that in its comment. The
//! wait is bounded twice: a packet older than `max_delay` goes out as it stands (a packet no
//! transaction claims, e.g. a TCP handshake, waits that long), and when the held packets
//! exceed `max_bytes` the oldest go out early, without what was still to come, counted in
//! [`AnnotateStats`]. Releasing strictly from the front keeps the file in capture order, and
//! every packet is released exactly once, so a file holds every packet the trace counted.
//!
//! Records find their packets through an index by capture time (a hop's `ts_ns` is its
//! packet's), checked against the place: O(1) per hop.
use std::{
    collections::{HashMap, VecDeque},
    fmt::Write as _,
    hash::{Hash, Hasher},
};

use tracer_common::proto::{IPPROTO_TCP, IPPROTO_UDP};

pub use crate::output::evidence::{AnnotateStats, EvidenceStats};
use crate::output::record::Detected;
use crate::{
    correlate::record::LegOutcome,
    decode::dns::RrType,
    decode::ip::{parse_ip, Transport},
    detect::{
        loops::{LoopRecord, LoopState},
        race::{RaceRecord, RaceVerdict},
    },
    event::{CapturedPacket, KernelDrop, ObservationPoint},
    output::{
        escape,
        record::{DropRecord, PacketRecord, Record, TransactionRecord},
    },
    source::file::drops::DropDetails,
};

/// Where a packet goes in a pcapng file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Place {
    /// Seen by a TC hook: the interface block of its namespace and interface.
    Hop(ObservationPoint),
    /// Freed by the kernel: the drops block.
    Drops,
}

/// One packet for a pcapng file: as captured, with what dnspath knows about it.
#[derive(Clone, Debug)]
pub struct EvidencePacket {
    pub ts_ns: u64,
    pub place: Place,
    /// Length on the wire from the IP header on.
    pub orig_len: u32,
    pub data: bytes::Bytes,
    /// Everything after `dnspath at=IFACE` in the packet's comment.
    pub comment: String,
}

#[derive(Clone, Copy, Debug)]
pub struct AnnotateConfig {
    /// Longest a packet waits for its transaction.
    pub max_delay_ns: u64,
    /// Most bytes of packets held at once.
    pub max_bytes: usize,
    /// Whether transactions are correlated at all: without them nothing is waited for.
    pub transactions: bool,
}

struct Held {
    packet: EvidencePacket,
    /// Names of the place, as records name it (`netns`, `ifname`), for matching hops.
    netns: std::sync::Arc<str>,
    ifname: std::sync::Arc<str>,
    dir: &'static str,
    /// DNS id and first question (lowercase name, type), for races and loops.
    question: Option<(u16, String, RrType)>,
    /// What the records said, in the order they came.
    notes: String,
    claimed: bool,
    /// Its share of [`Annotator::bytes`] (see [`footprint`]).
    counted: usize,
}

/// What a held packet takes beyond its bytes, comment and question: its entry (in a queue
/// that may be twice as long as what it holds), the time index's entry, the shared
/// buffer's header, a note or two (`txn=… leg=… hop=…/… role=… msg=…`) and the allocator's
/// rounding of each block.
const HELD_OVERHEAD: usize = 2 * std::mem::size_of::<Held>() + 96 + 48 + 192 + 64;

/// The bytes a held packet is counted for: what it takes from the allocator, about, so
/// that `max_bytes` bounds memory and not only the packets' payload (a DNS query's bytes
/// are a fifth of what holding it takes).
fn footprint(h: &Held) -> usize {
    h.packet.data.len()
        + h.packet.comment.capacity()
        + h.question.as_ref().map_or(0, |q| q.1.capacity())
        + h.notes.capacity()
        + HELD_OVERHEAD
}

pub struct Annotator {
    cfg: AnnotateConfig,
    held: VecDeque<Held>,
    /// Sequence number of `held[0]`.
    front: u64,
    bytes: usize,
    /// Capture time → sequence numbers of held packets with that time.
    by_ts: HashMap<u64, Vec<u64>>,
    /// Active loops by question (lowercase name, type): their note, for packets that come
    /// while the loop goes on.
    loops: HashMap<(String, RrType), String>,
    stats: AnnotateStats,
}

impl Annotator {
    pub fn new(cfg: AnnotateConfig) -> Self {
        Self {
            cfg,
            held: VecDeque::new(),
            front: 0,
            bytes: 0,
            by_ts: HashMap::new(),
            loops: HashMap::new(),
            stats: AnnotateStats::default(),
        }
    }

    pub fn stats(&self) -> AnnotateStats {
        self.stats
    }

    /// The capture time before which every packet was released (`now_ns` when none is held).
    pub fn released_before(&self, now_ns: u64) -> u64 {
        self.held.front().map_or(now_ns, |h| h.packet.ts_ns)
    }

    /// One captured packet and the packet records the decoder made of it (none for packets
    /// of a loop only counted).
    pub fn packet(&mut self, p: &CapturedPacket, records: &[&PacketRecord]) {
        // Written in place (writing to a String cannot fail): every packet of a node goes
        // through here with `--record`, so no piece is a string of its own.
        let mut comment = String::with_capacity(96);
        let _ = write!(
            comment,
            "dir={} pkt={:016x}",
            p.at.dir.as_str(),
            packet_id(&p.data)
        );
        let mut question = None;
        for r in records {
            if let Some(m) = &r.dns {
                let _ = write!(comment, " dns=[{}]", escape(&m.summary_line()));
                if let Some(q) = m.questions.first() {
                    question = Some((m.id, q.name.to_ascii_lowercase(), q.qtype));
                }
            }
            if let Some(why) = &r.malformed {
                let _ = write!(comment, " malformed=[{}]", escape(why));
            }
            if r.capture_truncated {
                comment.push_str(" capture_truncated");
            }
        }
        let (netns, ifname) = records
            .first()
            .map(|r| (r.netns.clone(), r.ifname.clone()))
            .unwrap_or_default();
        let mut notes = String::new();
        // A packet only counted under a loop has no record: it is the loop's if there is
        // one loop (the common case); with several, it stays unclaimed.
        if !self.loops.is_empty() {
            let note = match &question {
                Some((_, name, qtype)) => self.loops.get(&(name.clone(), *qtype)),
                None if self.loops.len() == 1 && records.is_empty() => self.loops.values().next(),
                None => None,
            };
            if let Some(n) = note {
                notes.push_str(n);
            }
        }
        self.hold(Held {
            packet: EvidencePacket {
                ts_ns: p.ts_ns,
                place: Place::Hop(p.at),
                orig_len: p.orig_len,
                data: p.data.clone(),
                comment,
            },
            netns,
            ifname,
            dir: p.at.dir.as_str(),
            question,
            claimed: !notes.is_empty() || !self.cfg.transactions,
            notes,
            counted: 0,
        });
    }

    /// One kernel drop of a watched packet, with its record.
    pub fn drop(&mut self, d: &KernelDrop, r: &DropRecord) {
        let mut comment = format!(
            "drop={}@{} netns={} ifname={} pkt={:016x}",
            escape(&r.reason),
            escape(&r.location),
            clean(&r.netns),
            clean(&r.ifname),
            packet_id(&d.data)
        );
        // What else the drop record says, for `analyze` to read the drop back.
        DropDetails {
            cpu: r.cpu,
            netns_cookie: r.netns_cookie,
            ifindex: r.ifindex,
            reason_code: r.reason_code,
            confirm_failed: r.confirm_failed,
            ct: d.ct,
        }
        .write(&mut comment);
        if let Some(b) = r.benign {
            let _ = write!(comment, " benign=[{b}]");
        }
        let mut question = None;
        if let Some(m) = &r.dns {
            let _ = write!(comment, " dns=[{}]", escape(&m.summary_line()));
            if let Some(q) = m.questions.first() {
                question = Some((m.id, q.name.to_ascii_lowercase(), q.qtype));
            }
        }
        // Which part of its datagram the dropped fragment was (after the fields `analyze`
        // reads back: a bracketed value ends them).
        if let Some(f) = &r.fragment {
            let _ = write!(comment, " fragment=[{}]", f.part().describe());
        }
        self.hold(Held {
            packet: EvidencePacket {
                ts_ns: d.ts_ns,
                place: Place::Drops,
                orig_len: d.orig_len,
                data: d.data.clone(),
                comment,
            },
            netns: r.netns.clone(),
            ifname: r.ifname.clone(),
            dir: "drop",
            question,
            notes: String::new(),
            claimed: !self.cfg.transactions,
            counted: 0,
        });
    }

    fn hold(&mut self, mut h: Held) {
        let seq = self.front + self.held.len() as u64;
        h.counted = footprint(&h);
        self.bytes += h.counted;
        self.by_ts.entry(h.packet.ts_ns).or_default().push(seq);
        self.held.push_back(h);
    }

    /// The records of one turn: each transaction, loop and race drop annotates the packets
    /// it explains.
    pub fn records(&mut self, records: &[Record]) {
        for r in records {
            match r {
                Record::Transaction(t) => self.transaction(t),
                Record::Detected(Detected::Loop(l)) => self.loop_record(l),
                Record::Detected(Detected::Race(r)) if r.verdict == RaceVerdict::RaceDrop => {
                    self.race(r)
                }
                _ => {}
            }
        }
    }

    fn find(&mut self, ts_ns: u64, netns: &str, ifname: &str, dir: &str) -> Option<&mut Held> {
        let seqs = self.by_ts.get(&ts_ns)?;
        let front = self.front;
        let i = seqs.iter().find_map(|&s| {
            let i = usize::try_from(s.checked_sub(front)?).ok()?;
            let h = self.held.get(i)?;
            (h.dir == dir && *h.netns == *netns && *h.ifname == *ifname).then_some(i)
        })?;
        self.held.get_mut(i)
    }

    fn transaction(&mut self, t: &TransactionRecord) {
        for (li, leg) in t.legs.iter().enumerate() {
            let dnat = if leg.server != leg.backend {
                format!(" dnat={}->{}", leg.server, leg.backend)
            } else {
                String::new()
            };
            let role = leg.role.as_str();
            let n = leg.hops.len();
            // An answer that never reached the asking socket says so on every copy of it,
            // and what of it was lost when that was some of its IP fragments.
            let fate = match leg.outcome {
                LegOutcome::Late => " outcome=late".to_owned(),
                LegOutcome::Dropped if leg.rcode.is_some() => {
                    match leg.drop.as_ref().and_then(|d| d.fragments.as_ref()) {
                        Some(p) => format!(" outcome=dropped lost=[{}]", p.describe()),
                        None => " outcome=dropped".to_owned(),
                    }
                }
                _ => String::new(),
            };
            for (hi, hop) in leg.hops.iter().enumerate() {
                let msg = if hop.qr { "response" } else { "query" };
                let fate = if hop.qr { fate.as_str() } else { "" };
                if let Some(h) = self.find(hop.ts_ns, &hop.netns, &hop.ifname, hop.dir.as_str()) {
                    let _ = write!(
                        h.notes,
                        "txn={} leg={li} hop={}/{n} role={role} msg={msg}{dnat}{fate} ",
                        t.id,
                        hi + 1
                    );
                    h.claimed = true;
                }
            }
            if let Some(d) = &leg.drop {
                // The drop, and every other drop of the answer's fragments it stands for.
                let others = d.fragment_drops_ns.iter().filter(|&&ts| ts != d.ts_ns);
                for ts in std::iter::once(&d.ts_ns).chain(others) {
                    if let Some(h) = self.find(*ts, &d.netns, &d.ifname, "drop") {
                        let _ = write!(h.notes, "txn={} leg={li} role={role} ", t.id);
                        h.claimed = true;
                    }
                }
            }
        }
    }

    fn loop_record(&mut self, l: &LoopRecord) {
        let key = (l.question.name.to_ascii_lowercase(), l.question.qtype);
        match l.state {
            LoopState::Ended => {
                self.loops.remove(&key);
            }
            LoopState::Detected | LoopState::Ongoing => {
                let note = format!(
                    "loop={} cycle=[{}] ",
                    l.id,
                    escape(&crate::output::report::loop_path(l))
                );
                if l.state == LoopState::Detected {
                    // The packets of the question held now: from the client's query on.
                    for h in self.held.iter_mut() {
                        if h.question
                            .as_ref()
                            .is_some_and(|q| q.1 == key.0 && q.2 == key.1)
                            && !h.notes.contains("loop=")
                        {
                            h.notes.push_str(&note);
                            h.claimed = true;
                        }
                    }
                }
                self.loops.insert(key, note);
            }
        }
    }

    /// The dropped query's copies and its drop (by DNS id and question; a race is rare, so
    /// a pass over what is held is fine).
    fn race(&mut self, r: &RaceRecord) {
        let Some(dropped) = &r.dropped else { return };
        let name = dropped.question.name.to_ascii_lowercase();
        let sibling = match &r.sibling {
            Some(s) => format!(
                " sibling=[{} id={:#06x} ->{}]",
                s.question.qtype, s.dns_id, s.backend
            ),
            None => String::new(),
        };
        let note = format!("race=race-drop{sibling} ");
        for h in self.held.iter_mut() {
            if h.question.as_ref().is_some_and(|q| {
                q.0 == dropped.dns_id && q.1 == name && q.2 == dropped.question.qtype
            }) {
                h.notes.push_str(&note);
                h.claimed = true;
            }
        }
    }

    /// Releases (in capture order) what is decided, what waited `max_delay`, and what the
    /// buffer cannot hold; `all`: everything (the end of the run).
    pub fn release(&mut self, now_ns: u64, all: bool, out: &mut Vec<EvidencePacket>) {
        while let Some(front) = self.held.front() {
            let late = now_ns.saturating_sub(front.packet.ts_ns) >= self.cfg.max_delay_ns;
            let over = self.bytes > self.cfg.max_bytes;
            if !(all || front.claimed || late || over) {
                break;
            }
            let Some(h) = self.held.pop_front() else {
                break;
            };
            let seq = self.front;
            self.front += 1;
            self.bytes = self.bytes.saturating_sub(h.counted);
            if let Some(v) = self.by_ts.get_mut(&h.packet.ts_ns) {
                v.retain(|&s| s != seq);
                if v.is_empty() {
                    self.by_ts.remove(&h.packet.ts_ns);
                }
            }
            // Without transactions nothing is waited for, so nothing is counted.
            if self.cfg.transactions {
                let counter = if h.claimed {
                    &mut self.stats.annotated
                } else if over && !late && !all {
                    &mut self.stats.early
                } else {
                    &mut self.stats.unclaimed
                };
                *counter += 1;
            }
            let mut p = h.packet;
            if !h.notes.is_empty() {
                let mut notes = h.notes;
                notes.push_str(&p.comment);
                p.comment = notes;
            }
            out.push(p);
        }
        // A burst's room goes back (a queue keeps its largest size otherwise).
        if self.held.capacity() > 4 * self.held.len().max(1024) {
            self.held.shrink_to(2 * self.held.len().max(1024));
            self.by_ts.shrink_to(2 * self.held.len().max(1024));
        }
    }
}

/// The same for every copy of one packet through the node, whatever NAT did to its
/// addresses and ports: its IPv4 id, protocol and transport payload. (IPv6 has no id: two
/// sends of the same bytes from one socket share it there.)
pub fn packet_id(data: &[u8]) -> u64 {
    // A tunnel's copy of a packet is the packet inside it.
    let data = match crate::decode::tunnel::decapsulate(data) {
        Ok(crate::decode::tunnel::Decap::Inner { offset, .. }) => {
            data.get(offset..).unwrap_or_default()
        }
        _ => data,
    };
    let mut h = std::collections::hash_map::DefaultHasher::new();
    if data.first().is_some_and(|b| b >> 4 == 4) {
        data.get(4..6).hash(&mut h);
    }
    match parse_ip(data) {
        Ok(ip) => match ip.transport {
            Transport::Udp { payload, .. } => (IPPROTO_UDP, payload).hash(&mut h),
            Transport::Tcp {
                seq,
                flags,
                payload,
                ..
            } => (IPPROTO_TCP, seq, flags, payload).hash(&mut h),
            Transport::Other { proto } => (proto, data.get(20..)).hash(&mut h),
        },
        Err(_) => data.hash(&mut h),
    }
    h.finish()
}

/// A name inside a comment field: escaped, no spaces (fields are space-separated).
fn clean(s: &str) -> String {
    escape(s).replace(' ', "_")
}

#[cfg(test)]
#[path = "annotate_tests.rs"]
mod tests;
