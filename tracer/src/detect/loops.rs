//! Forwarding loops: cycles in the transaction tree, and amplification storms whose cycle is
//! partly invisible.
//!
//! A loop is reported once when its cycle closes (`detected`), then at most once a second
//! while it lasts (`ongoing`), and once more when the question has not been seen for
//! [`CorrelateConfig::loop_end_ns`] (`ended`). Reports are keyed by question and cycle, so a loop that keeps
//! re-forming (its transaction evicted, a new client query entering it) stays one report.
use std::{
    collections::{BTreeSet, HashMap},
    fmt::Write as _,
    net::{IpAddr, SocketAddr},
};

use serde::{ser::SerializeMap, Serialize, Serializer};

use super::{Control, Detected, Detection, Detector, Notice};
use crate::{
    correlate::{
        detector::LegEvent,
        record::{QMap, QuestionRecord},
        sip, CorrelateConfig, QKey,
    },
    decode::{
        decoder::WireQuestion,
        dns::RrType,
        record::{Incident, Names, PodRef, RecordKind},
    },
    show::{at, dur, escape, grouped, wall_clock},
    time::Clock,
};

/// Amplification: forwards of one question by one server per second, at least …
const STORM_MIN_PER_SEC: u64 = 200;
/// … and this many times the rate at which clients ask it.
const STORM_FACTOR: u64 = 10;
pub(crate) const MAX_LOOPS: usize = 1024;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LoopKind {
    /// The question came back to a server already on its chain.
    Cycle,
    /// The same question re-sent by a server far faster than clients ask it; the rest of
    /// the cycle is out of sight (another node, an external resolver).
    Amplification,
}

words!(LoopKind {
    Cycle => "cycle",
    Amplification => "amplification",
});

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LoopState {
    Detected,
    Ongoing,
    Ended,
}

words!(LoopState {
    Detected => "detected",
    Ongoing => "ongoing",
    Ended => "ended",
});

/// A server of a loop: a socket, or only a host (an amplifying server, whatever port it
/// sends from).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Peer {
    Socket(SocketAddr),
    Host(IpAddr),
}

/// One server of a cycle; its addresses and place are written as text.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct LoopHop {
    /// The query's client (a forwarder) as seen at the leg's first hop.
    #[serde(serialize_with = "serialize_peer")]
    pub from: Peer,
    /// Where it was sent (may be a ClusterIP); not visible for an amplification.
    #[serde(serialize_with = "serialize_server")]
    pub server: Option<SocketAddr>,
    /// Where it arrived after DNAT.
    #[serde(serialize_with = "serialize_peer")]
    pub backend: Peer,
    /// Namespace and interface (display names) where it was seen arriving.
    #[serde(serialize_with = "serialize_at")]
    pub at: Option<(String, String)>,
    /// The pod of `at`, where known (filled in by the sinks' caller).
    #[serde(flatten)]
    pub pod: PodRef,
}

/// A `loop` record, its own JSON shape (field by field in docs/output.md).
#[derive(Clone, Debug, Serialize)]
pub struct LoopRecord {
    pub id: u64,
    pub state: LoopState,
    pub kind: LoopKind,
    pub ts_ns: u64,
    /// `ts_ns` as Unix-epoch nanoseconds (wall-clock time), written as `time`.
    #[serde(rename = "time", serialize_with = "crate::time::serialize_wall_ns")]
    pub wall_ns: u64,
    /// Written with its parent domain (`zone`) after it.
    #[serde(flatten, serialize_with = "serialize_question_zone")]
    pub question: QuestionRecord,
    /// CoreDNS's `loop` plugin probe (HINFO for a random name at startup).
    pub loop_plugin_probe: bool,
    /// The cycle, first server to last (the last forwards back to the first); written with
    /// its `path` in one line after it.
    #[serde(flatten, serialize_with = "serialize_cycle_path")]
    pub cycle: Vec<LoopHop>,
    /// Legs in the longest chain seen so far (1 = a server forwarding to itself).
    pub hop_count: u64,
    /// Packets of this question per second over the last second.
    pub rate_pps: u64,
    /// Packets of this question seen since detection (correlated + summarised).
    pub packets: u64,
    /// Of `packets`, those only counted (not decoded or correlated) to survive the storm.
    pub summarised: u64,
    /// Client sockets whose queries entered the loop (written in text order).
    #[serde(serialize_with = "serialize_clients")]
    pub clients: Vec<SocketAddr>,
    /// When the question entered the chain (the client's query).
    pub first_seen_ns: u64,
    /// When the cycle closed (the first repeat to a server of the chain).
    pub detected_ns: u64,
    /// `--record`: the flight-recorder file holding this incident's packets (written once its
    /// window is over).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub evidence: Option<String>,
    pub last_seen_ns: u64,
}

pub fn peer(p: &Peer) -> String {
    match p {
        Peer::Socket(s) => s.to_string(),
        Peer::Host(ip) => ip.to_string(),
    }
}

fn server_text(server: Option<SocketAddr>) -> String {
    match server {
        Some(s) => s.to_string(),
        None => "(not visible)".to_string(),
    }
}

fn at_text(at: &Option<(String, String)>) -> String {
    match at {
        Some((netns, ifname)) => format!("{netns}/{ifname}"),
        None => String::new(),
    }
}

/// Where a loop's query was sent: `(not visible)` for an amplification.
pub fn loop_server(h: &LoopHop) -> String {
    server_text(h.server)
}

/// `namespace/interface` where a loop's query arrived, or empty.
pub fn loop_at(h: &LoopHop) -> String {
    at_text(&h.at)
}

/// The cycle in one line, e.g. `10.244.1.4:53 → 10.96.0.10:53 ⇒DNAT 10.244.1.3:53 (…) → …`.
pub fn loop_path(l: &LoopRecord) -> String {
    cycle_path(&l.cycle)
}

fn cycle_path(cycle: &[LoopHop]) -> String {
    let Some(first) = cycle.first() else {
        return String::new();
    };
    let mut p = peer(&first.from);
    for h in cycle {
        let (server, backend) = (loop_server(h), peer(&h.backend));
        let _ = write!(p, " → {server}");
        if backend != server {
            let _ = write!(p, " ⇒DNAT {backend}");
        }
        let _ = write!(p, " ({})", loop_at(h));
    }
    p
}

/// The question's parent domain.
pub fn zone(name: &str) -> &str {
    match name.split_once('.') {
        Some((_, rest)) if !rest.is_empty() => rest,
        _ => ".",
    }
}

/// A loop's client sockets, in text order.
pub fn loop_clients(l: &LoopRecord) -> Vec<String> {
    sorted_clients(&l.clients)
}

fn sorted_clients(clients: &[SocketAddr]) -> Vec<String> {
    let mut c: Vec<String> = clients.iter().map(SocketAddr::to_string).collect();
    c.sort();
    c
}

fn serialize_peer<S: Serializer>(p: &Peer, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&peer(p))
}

fn serialize_server<S: Serializer>(server: &Option<SocketAddr>, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&server_text(*server))
}

fn serialize_at<S: Serializer>(at: &Option<(String, String)>, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&at_text(at))
}

/// `question`, then `zone`: flattened into the record.
fn serialize_question_zone<S: Serializer>(q: &QuestionRecord, s: S) -> Result<S::Ok, S::Error> {
    let mut m = s.serialize_map(Some(2))?;
    m.serialize_entry("question", q)?;
    m.serialize_entry("zone", zone(&q.name))?;
    m.end()
}

/// `cycle`, then `path`: flattened into the record.
fn serialize_cycle_path<S: Serializer>(cycle: &[LoopHop], s: S) -> Result<S::Ok, S::Error> {
    let mut m = s.serialize_map(Some(2))?;
    m.serialize_entry("cycle", cycle)?;
    m.serialize_entry("path", &cycle_path(cycle))?;
    m.end()
}

fn serialize_clients<S: Serializer>(clients: &[SocketAddr], s: S) -> Result<S::Ok, S::Error> {
    sorted_clients(clients).serialize(s)
}

/// A loop matches by its question and its cycle's pods; it is a failure, has no rcode and no
/// duration; its detection is an incident.
impl RecordKind for LoopRecord {
    fn any_pod(&self, f: &mut dyn FnMut(&PodRef) -> bool) -> bool {
        self.cycle.iter().any(|h| f(&h.pod))
    }
    fn any_question(&self, f: &mut dyn FnMut(&str, RrType) -> bool) -> bool {
        f(&self.question.name, self.question.qtype)
    }
    fn is_failure(&self) -> bool {
        true
    }
    fn annotate_pods(&mut self, names: &Names) {
        for h in &mut self.cycle {
            if let Some((ns, ifname)) = &h.at {
                h.pod = names.pod_of(ns, ifname);
            }
        }
    }
    fn incident(&self) -> Option<Incident> {
        (self.state == LoopState::Detected).then(|| Incident {
            kind: "loop",
            detail: format!(
                "loop {} {} {}: {}",
                self.id,
                self.question.name,
                self.question.qtype,
                loop_path(self)
            ),
            ts_ns: self.detected_ns,
        })
    }
    fn set_evidence(&mut self, file: Option<String>) {
        self.evidence = file;
    }
}

/// A loop's line tells whether it was found, goes on or ended; a found one is news (its
/// updates are not), and found and ended ones always reach the event stream.
impl Detection for LoopRecord {
    fn text(&self) -> String {
        loop_line(self)
    }
    fn failure(&self) -> Option<(&'static str, String)> {
        (self.state == LoopState::Detected).then(|| {
            let q = &self.question;
            (
                "loop",
                format!("{} {} went round {}", q.name, q.qtype, loop_path(self)),
            )
        })
    }
    fn notice(&self) -> Notice {
        match self.state {
            LoopState::Detected | LoopState::Ended => Notice::Always,
            LoopState::Ongoing => Notice::Limited,
        }
    }
}

/// The loop's cycle in one line (as `path`), with each server's pod in place of its
/// namespace where known.
fn text_path(l: &LoopRecord) -> String {
    let Some(first) = l.cycle.first() else {
        return String::new();
    };
    if !l.cycle.iter().any(|h| h.pod.is_known()) {
        return escape(&loop_path(l)).into_owned();
    }
    let mut p = peer(&first.from);
    for h in &l.cycle {
        let (server, backend) = (loop_server(h), peer(&h.backend));
        p.push_str(&format!(" → {server}"));
        if backend != server {
            p.push_str(&format!(" ⇒DNAT {backend}"));
        }
        let place = match &h.at {
            Some((netns, ifname)) => at(netns, ifname, &h.pod),
            None => at("", "", &h.pod),
        };
        p.push_str(&format!(" ({place})"));
    }
    p
}

fn loop_line(l: &LoopRecord) -> String {
    let what = match (l.state, l.kind) {
        (LoopState::Detected, LoopKind::Cycle) => "FORWARDING LOOP detected",
        (LoopState::Detected, LoopKind::Amplification) => "AMPLIFICATION STORM detected",
        (LoopState::Ongoing, _) => "forwarding loop ongoing",
        (LoopState::Ended, _) => "forwarding loop ended",
    };
    let probe = if l.loop_plugin_probe {
        " (CoreDNS loop plugin probe)"
    } else {
        ""
    };
    let span = l.last_seen_ns.saturating_sub(l.first_seen_ns);
    format!(
        "{} {what}: {} {}{probe} zone {}: {} — {} hop(s), {} pkt/s, {} packets ({} summarised) over {}, clients {}",
        wall_clock(l.wall_ns),
        escape(&l.question.name),
        l.question.qtype,
        escape(zone(&l.question.name)),
        text_path(l),
        l.hop_count,
        grouped(l.rate_pps),
        grouped(l.packets),
        grouped(l.summarised),
        dur(span),
        if l.clients.is_empty() {
            "-".to_string()
        } else {
            loop_clients(l).join(",")
        }
    )
}

#[derive(Clone, Debug, Default, Serialize)]
pub(crate) struct LoopStats {
    pub detected: u64,
    pub ended: u64,
    pub active: u64,
    pub amplification: u64,
}

#[derive(Clone, Debug)]
struct Tracked {
    rec: LoopRecord,
    last_report: u64,
    /// packets counted in the current one-second window, and its start
    win_start: u64,
    win_count: u64,
    clients: BTreeSet<SocketAddr>,
    dirty: bool,
}

/// Loop reports by (question, cycle servers).
pub(crate) struct LoopTracker {
    clock: Clock,
    /// [`CorrelateConfig::loop_end_ns`] and [`CorrelateConfig::loop_update_ns`].
    end_ns: u64,
    update_ns: u64,
    loops: HashMap<(QKey, Vec<Peer>), Tracked>,
    /// Which report a question's packets count towards.
    by_question: QMap<(QKey, Vec<Peer>)>,
    /// (server ip, question) → (window start, forwards in window)
    forwards: HashMap<(IpAddr, QKey), (u64, u64), sip::Sip>,
    /// question → (window start, client queries in window, in the window before)
    asks: QMap<(u64, u64, u64)>,
    /// Sizes of `forwards` and `asks` at which their stale windows are swept next.
    forwards_sweep_at: usize,
    asks_sweep_at: usize,
    next_id: u64,
    pub stats: LoopStats,
    out: Vec<LoopRecord>,
}

/// Entries of `forwards` or `asks` before their first sweep.
const SWEEP_AT: usize = 65_536;

/// Forgets the windows that ended over two seconds before `ts` (no longer a baseline) once
/// `map` reached `*at` entries; the next sweep waits for twice what is left, so that a
/// sweep costs O(1) per insertion however many windows are current.
fn sweep<K: std::hash::Hash + Eq, V, S: std::hash::BuildHasher>(
    map: &mut HashMap<K, V, S>,
    at: &mut usize,
    ts: u64,
    start: impl Fn(&V) -> u64,
) {
    if map.len() < *at {
        return;
    }
    let horizon = ts.saturating_sub(2_000_000_000);
    map.retain(|_, v| start(v) >= horizon);
    *at = SWEEP_AT.max(map.len().saturating_mul(2));
}

impl LoopTracker {
    pub(crate) fn new(clock: Clock, cfg: &CorrelateConfig) -> Self {
        Self {
            clock,
            end_ns: cfg.loop_end_ns,
            update_ns: cfg.loop_update_ns,
            loops: HashMap::new(),
            by_question: QMap::default(),
            forwards: HashMap::default(),
            asks: QMap::default(),
            forwards_sweep_at: SWEEP_AT,
            asks_sweep_at: SWEEP_AT,
            next_id: 1,
            stats: LoopStats::default(),
            out: Vec::new(),
        }
    }

    /// Every table within its bound (the fuzz harness's check, `crate::fuzzing`).
    fn bounds(&self) -> Result<(), String> {
        if let Some((q, _)) = self
            .by_question
            .iter()
            .find(|(_, key)| !self.loops.contains_key(*key))
        {
            return Err(format!("loops: question {q:?} counts towards no loop"));
        }
        let bounds = [
            ("loops", self.loops.len(), MAX_LOOPS),
            ("loop questions", self.by_question.len(), self.loops.len()),
            ("forwards", self.forwards.len(), self.forwards_sweep_at),
            ("client asks", self.asks.len(), self.asks_sweep_at),
        ];
        match bounds.iter().find(|(_, n, max)| n > max) {
            Some((what, n, max)) => Err(format!("{what}: {n} > {max}")),
            None => Ok(()),
        }
    }

    /// Is a loop report active for this question (its packets can be summarised)?
    pub(crate) fn active_for(&self, q: &QKey) -> bool {
        self.by_question.contains_key(q)
    }

    /// A cycle closed in a transaction tree.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn cycle(
        &mut self,
        q: &QKey,
        cycle: Vec<LoopHop>,
        hop_count: u64,
        client: Option<SocketAddr>,
        entered_ts: u64,
        ts: u64,
    ) {
        let mut servers: Vec<Peer> = cycle.iter().map(|h| h.backend).collect();
        servers.sort();
        servers.dedup();
        self.report(
            q,
            LoopKind::Cycle,
            servers,
            cycle,
            hop_count,
            client,
            entered_ts,
            ts,
        );
    }

    #[allow(clippy::too_many_arguments)]
    fn report(
        &mut self,
        q: &QKey,
        kind: LoopKind,
        servers: Vec<Peer>,
        cycle: Vec<LoopHop>,
        hop_count: u64,
        client: Option<SocketAddr>,
        entered_ts: u64,
        ts: u64,
    ) {
        let key = (q.clone(), servers);
        if let Some(t) = self.loops.get_mut(&key) {
            t.rec.hop_count = t.rec.hop_count.max(hop_count);
            if let Some(c) = client {
                if t.clients.len() < 64 {
                    t.clients.insert(c);
                }
            }
            t.dirty = true;
            self.by_question.insert(q.clone(), key);
            return;
        }
        if self.loops.len() >= MAX_LOOPS {
            return;
        }
        let id = self.next_id;
        self.next_id += 1;
        let mut clients = BTreeSet::new();
        if let Some(c) = client {
            clients.insert(c);
        }
        let rec = LoopRecord {
            evidence: None,
            id,
            state: LoopState::Detected,
            kind,
            ts_ns: ts,
            wall_ns: self.clock.epoch_ns(ts),
            question: q.clone(),
            loop_plugin_probe: q.qtype == RrType::HINFO,
            cycle,
            hop_count,
            rate_pps: 0,
            packets: 0,
            summarised: 0,
            clients: clients.iter().copied().collect(),
            first_seen_ns: entered_ts.min(ts),
            detected_ns: ts,
            last_seen_ns: ts,
        };
        self.stats.detected += 1;
        if kind == LoopKind::Amplification {
            self.stats.amplification += 1;
        }
        self.out.push(rec.clone());
        self.by_question.insert(q.clone(), key.clone());
        self.loops.insert(
            key,
            Tracked {
                rec,
                last_report: ts,
                win_start: ts,
                win_count: 0,
                clients,
                dirty: false,
            },
        );
    }

    /// `n` packets of question `q` seen at `ts` (correlated or only counted).
    pub(crate) fn packets(&mut self, q: &QKey, n: u64, summarised: bool, ts: u64) {
        let Some(key) = self.by_question.get(q) else {
            return;
        };
        let Some(t) = self.loops.get_mut(key) else {
            return;
        };
        t.rec.packets += n;
        if summarised {
            t.rec.summarised += n;
        }
        t.rec.last_seen_ns = t.rec.last_seen_ns.max(ts);
        if ts >= t.win_start + 1_000_000_000 {
            let secs = ((ts - t.win_start) / 1_000_000_000).max(1);
            t.rec.rate_pps = t.win_count / secs;
            t.win_start = ts;
            t.win_count = 0;
        }
        t.win_count += n;
        t.dirty = true;
    }

    /// A client's own query for `q` (not a forward): the baseline for amplification.
    pub(crate) fn client_ask(&mut self, q: &QKey, ts: u64) {
        let e = self.asks.entry(q.clone()).or_insert((ts, 0, 0));
        if ts >= e.0 + 1_000_000_000 {
            // The previous window only counts if it was the one just before.
            let prev = if ts < e.0 + 2_000_000_000 { e.1 } else { 0 };
            *e = (ts, 0, prev);
        }
        e.1 += 1;
        // Every client question has an entry: distinct names (a scan, a crawler, search-list
        // expansions) would grow it without end unless swept here, where it grows.
        sweep(&mut self.asks, &mut self.asks_sweep_at, ts, |v| v.0);
    }

    /// A server sent `q` onwards; an amplification storm if it does so far faster than
    /// clients ask.
    pub(crate) fn forward(&mut self, server_ip: IpAddr, q: &QKey, ts: u64) {
        if self.by_question.contains_key(q) {
            return;
        }
        let e = self
            .forwards
            .entry((server_ip, q.clone()))
            .or_insert((ts, 0));
        if ts >= e.0 + 1_000_000_000 {
            *e = (ts, 0);
        }
        e.1 += 1;
        let forwards = e.1;
        // Client rate: the larger of this and the previous one-second window, so that a
        // window that just started does not make the clients look quiet.
        let asks = self
            .asks
            .get(q)
            .filter(|a| ts < a.0 + 2_000_000_000)
            .map(|a| a.1.max(a.2))
            .unwrap_or(0);
        if forwards >= STORM_MIN_PER_SEC && forwards >= STORM_FACTOR * asks.max(1) {
            let hop = LoopHop {
                from: Peer::Host(server_ip),
                server: None,
                backend: Peer::Host(server_ip),
                at: None,
                pod: Default::default(),
            };
            self.report(
                q,
                LoopKind::Amplification,
                vec![Peer::Host(server_ip)],
                vec![hop],
                0,
                None,
                ts,
                ts,
            );
        }
        sweep(&mut self.forwards, &mut self.forwards_sweep_at, ts, |v| v.0);
    }

    /// Updates and ends, as time passes.
    fn advance(&mut self, now: u64, all: bool) {
        let mut gone = Vec::new();
        for (key, t) in self.loops.iter_mut() {
            if all || now >= t.rec.last_seen_ns.max(t.rec.first_seen_ns) + self.end_ns {
                t.rec.state = LoopState::Ended;
                t.rec.ts_ns = now;
                t.rec.wall_ns = self.clock.epoch_ns(now);
                t.rec.clients = t.clients.iter().copied().collect();
                self.out.push(t.rec.clone());
                self.stats.ended += 1;
                gone.push(key.clone());
            } else if t.dirty && now >= t.last_report + self.update_ns {
                t.rec.state = LoopState::Ongoing;
                t.rec.ts_ns = now;
                t.rec.wall_ns = self.clock.epoch_ns(now);
                t.rec.clients = t.clients.iter().copied().collect();
                t.last_report = now;
                t.dirty = false;
                self.out.push(t.rec.clone());
            }
        }
        for key in gone {
            self.loops.remove(&key);
            if self.by_question.get(&key.0) == Some(&key) {
                self.by_question.remove(&key.0);
            }
        }
        self.stats.active = self.loops.len() as u64;
    }
}

impl Detector for LoopTracker {
    type Report = Detected;
    type Stats = LoopStats;

    /// A message of a question in an active loop is only counted towards it.
    fn message(&mut self, q: &QKey, ts: u64) -> bool {
        if !self.active_for(q) {
            return false;
        }
        self.packets(q, 1, false, ts);
        true
    }

    fn summarised(&mut self, q: &QKey, n: u64, ts: u64) {
        self.packets(q, n, true, ts);
    }

    fn leg(&mut self, ev: &LegEvent<'_>) {
        match ev {
            LegEvent::Asked { q, ts } => self.client_ask(q, *ts),
            LegEvent::Forwarded { server, q, ts } => self.forward(*server, q, *ts),
            LegEvent::Cycle(c) => {
                let hops = c
                    .hops
                    .iter()
                    .map(|h| LoopHop {
                        from: Peer::Socket(h.from),
                        server: Some(h.server),
                        backend: Peer::Socket(h.backend),
                        at: h.at.clone(),
                        pod: Default::default(),
                    })
                    .collect();
                self.cycle(c.q, hops, c.hop_count, c.client, c.entered_ts, c.ts);
            }
        }
    }

    /// Reports detected, ongoing and ended loops; under a loop only its question's packets
    /// are counted (decoding them would not keep up), from when it is detected to when it
    /// ends.
    fn tick(&mut self, now: u64, all: bool, out: &mut Vec<Detected>, control: &mut Vec<Control>) {
        self.advance(now, all);
        for r in self.out.drain(..) {
            let q = &r.question;
            match r.state {
                LoopState::Detected => {
                    if let Some(w) = WireQuestion::of(&q.name, q.qtype, q.class) {
                        control.push(Control::Shed(w, q.clone()));
                    }
                }
                LoopState::Ended => {
                    if let Some(w) = WireQuestion::of(&q.name, q.qtype, q.class) {
                        control.push(Control::Unshed(w));
                    }
                }
                LoopState::Ongoing => {}
            }
            out.push(r.into());
        }
    }

    fn check_bounds(&self) -> Result<(), String> {
        self.bounds()
    }

    fn stats(&self, into: &mut LoopStats) {
        *into = self.stats.clone();
    }
}

#[cfg(test)]
#[path = "loops_tests.rs"]
mod tests;
