//! What the correlate stage reports of a transaction: its legs and their hops, as facts
//! (addresses, numbers, enums); the output stage writes them as records and text (field by
//! field in docs/output.md). Each type here is its own JSON shape (`Serialize`, names and
//! order as written); the transaction writes itself with its summary in words
//! ([`transaction_summary`], which the text and the agent's events write too).
use std::{fmt::Write as _, net::SocketAddr, sync::Arc};

use serde::{ser::SerializeMap, Serialize, Serializer};

use crate::{
    decode::{
        dns::{Cut, Rcode, RrClass, RrType},
        ip::{serialize_addr, Addr},
        record::{DroppedPart, Incident, Names, PodRef, Proto, RecordKind},
    },
    event::Direction,
    time::{format_duration as dur, WallTime},
};

/// Why a leg was sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LegRole {
    /// The client's first query.
    Query,
    /// The same question again from the same client after no answer.
    Retry,
    /// The same question over TCP after a truncated UDP answer.
    TcpFallback,
    /// A server forwarding the question it received.
    Forward,
}

words!(LegRole {
    Query => "query",
    Retry => "retry",
    TcpFallback => "tcp-fallback",
    Forward => "forward",
});

/// One observation of one message of a leg.
#[derive(Clone, Debug, Serialize)]
pub struct HopRecord {
    pub ts_ns: u64,
    /// Display names of the namespace and interface.
    pub netns: Arc<str>,
    pub ifname: Arc<str>,
    /// The pod where it was seen, shared with the node's names (`None`: no pod known).
    #[serde(flatten)]
    pub pod: Option<Arc<PodRef>>,
    pub dir: Direction,
    #[serde(serialize_with = "serialize_addr")]
    pub src: SocketAddr,
    #[serde(serialize_with = "serialize_addr")]
    pub dst: SocketAddr,
    pub dns_id: u16,
    pub qr: bool,
    /// For a response: time since the query was seen at this same point.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub latency_ns: Option<u64>,
    /// The tunnel it was seen in: kind, VNI or key, the outer addresses.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tunnel: Option<Arc<crate::decode::tunnel::Tunnel>>,
}

impl HopRecord {
    /// The pod where it was seen (all fields unset where none is known).
    pub fn pod_ref(&self) -> &PodRef {
        crate::decode::record::pod_or_none(&self.pod)
    }
}

/// The kernel drop that ended a leg.
#[derive(Clone, Debug, Serialize)]
pub struct LegDrop {
    pub ts_ns: u64,
    pub netns: Arc<str>,
    pub ifname: Arc<str>,
    /// Shared, as a hop's (`None`: no pod known).
    #[serde(flatten)]
    pub pod: Option<Arc<PodRef>>,
    pub reason: String,
    pub location: String,
    /// The response was dropped (not the query).
    pub response: bool,
    /// What of an IP-fragmented answer was dropped (or never came): its fragments, their
    /// bytes and the datagram's length; every such drop of the datagram at this place
    /// (each drop's time in `fragment_drops_ns`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fragments: Option<DroppedPart>,
    /// The times of the kernel drops of those fragments, for the evidence files (not in
    /// the JSON: each is a `drop` record of its own).
    #[serde(skip)]
    pub fragment_drops_ns: Vec<u64>,
}

impl LegDrop {
    /// The pod where it was dropped (all fields unset where none is known).
    pub fn pod_ref(&self) -> &PodRef {
        crate::decode::record::pod_or_none(&self.pod)
    }
}

/// How a leg's hops were joined.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Join {
    /// Every hop had the addresses of the first.
    SameTuple,
    /// Addresses differ; joined through the conntrack entry.
    Conntrack,
    /// Addresses differ; joined by (client port, DNS id, question) alone.
    Fallback,
}

words!(Join {
    SameTuple => "same-tuple",
    Conntrack => "conntrack",
    Fallback => "fallback",
});

/// What became of a leg's query.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LegOutcome {
    Answered,
    /// Answered with TC set.
    Truncated,
    Dropped,
    /// The answer came after the client had given up: its socket was closed when the
    /// answer reached the client's namespace.
    Late,
    /// No answer yet when the input ended.
    Pending,
    Unanswered,
}

words!(LegOutcome {
    Answered => "answered",
    Truncated => "truncated",
    Dropped => "dropped",
    Late => "late",
    Pending => "pending",
    Unanswered => "unanswered",
});

/// What became of a client's question.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// The answer could reach the asking socket.
    Answered,
    /// The kernel dropped the query or its answer (also after the answer reached the
    /// client's interface, before its socket).
    Dropped,
    /// The answer came after the client had given up on it (its socket was closed).
    Late,
    /// No answer yet when the input ended.
    Pending,
    Unanswered,
}

words!(Outcome {
    Answered => "answered",
    Dropped => "dropped",
    Late => "late",
    Pending => "pending",
    Unanswered => "unanswered",
});

/// A leg and a cache in the node's own network namespace (NodeLocal DNSCache).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NodeCache {
    /// The node cache answered without asking anyone.
    Hit,
    /// The node cache asked on (its query is this leg's child).
    Miss,
    /// A client's query to a server the node cache forwards to, around the cache.
    Bypass,
}

words!(NodeCache {
    Hit => "hit",
    Miss => "miss",
    Bypass => "bypass",
});

/// A client's query that its own pod's `nat OUTPUT` redirected to a local port, where a DNS
/// proxy took it (Istio's DNS capture, a sidecar cache).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PodProxy {
    /// The proxy answered without asking anyone.
    Hit,
    /// The proxy asked on: its query is this leg's child, or (asked once for several
    /// clients asking the same at once) another redirected leg's.
    Miss,
}

words!(PodProxy {
    Hit => "hit",
    Miss => "miss",
});

/// One query and its response between a client socket and a server.
#[derive(Clone, Debug, Serialize)]
pub struct LegRecord {
    pub id: u64,
    /// Index in `legs` of the leg whose server sent this one (forwarding), if any.
    pub parent: Option<usize>,
    pub role: LegRole,
    /// UDP or TCP.
    pub proto: Proto,
    /// Client and server as seen at the leg's first hop.
    #[serde(serialize_with = "serialize_addr")]
    pub client: SocketAddr,
    #[serde(serialize_with = "serialize_addr")]
    pub server: SocketAddr,
    /// Where the query was delivered (after DNAT; equals `server` without NAT).
    #[serde(serialize_with = "serialize_addr")]
    pub backend: SocketAddr,
    pub dns_id: u16,
    pub join: Join,
    pub outcome: LegOutcome,
    pub rcode: Option<Rcode>,
    pub answers: Vec<String>,
    /// The response was cut by the capture (snaplen) wherever it was seen: how (as the
    /// packet's `dns.cut`); `answers` are those that fit.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub answer_cut: Option<Cut>,
    /// Query → response at the leg's first point.
    pub latency_ns: Option<u64>,
    /// The same query re-sent from the same socket with the same id.
    pub retransmits: u32,
    pub drop: Option<LegDrop>,
    /// Served by the node cache (hit or miss), or a client query around it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node_cache: Option<NodeCache>,
    /// Redirected to a DNS proxy in the client's own pod: hit or miss (`server` is what the
    /// client asked, `backend` the proxy's socket).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pod_proxy: Option<PodProxy>,
    pub hops: Vec<HopRecord>,
    /// `analyze` of several nodes' captures: the node whose capture its hops are from.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node: Option<Arc<str>>,
    /// Not in the JSON (a `race` record says it): a client's query that the conntrack race
    /// dropped, so that what retried it is read here rather than inferred from where the
    /// race record comes in the output.
    #[serde(skip)]
    pub race_drop: bool,
    /// Not in the JSON (a `loop` record says it): the forwarding cycle this leg closed, as
    /// the correlator found it when the leg was made (a forward delivered where one of its
    /// ancestors was), so that what reads the record does not derive it again.
    #[serde(skip)]
    pub closes_loop: Option<Box<LegLoop>>,
}

/// A forwarding cycle closed by a leg of a transaction: what the correlator reported to the
/// loop detector (a `loop` record of kind `cycle`), in the transaction's leg indexes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LegLoop {
    /// The cycle's legs, first to last (the closing leg last): the first one's client is the
    /// server the last one was delivered to.
    pub cycle: Vec<usize>,
    /// Legs in the chain from the client's query to the closing one, less one.
    pub hop_count: usize,
}

#[derive(Clone, Debug, Serialize)]
pub struct LookupRef {
    pub id: u64,
    /// Index of this transaction's name among the lookup's names (search-list order).
    pub step: u32,
}

/// A question, shared by every leg, index entry and record of it rather than copied into
/// each: cloning it copies a pointer. The correlator's own questions have the name in lower
/// case.
///
/// It is hashed once, when made: the correlator's maps (several per packet) hash the
/// stored 64-bit digest, not the name again. The digest is SipHash under this process's
/// random key (`std`'s `RandomState`), so names chosen to collide in those maps are as hard
/// to find as with the maps hashing the name themselves.
#[derive(Clone)]
pub struct QuestionRecord(Arc<Hashed>);

struct Hashed {
    q: Question,
    hash: u64,
}

#[derive(Debug, PartialEq, Eq, Hash, Serialize)]
pub struct Question {
    pub name: String,
    #[serde(rename = "type")]
    pub qtype: RrType,
    pub class: RrClass,
}

/// The key the questions' digests are made with: random, once per process (SipHash, fed
/// in one piece: see [`super::sip`]).
fn question_hasher() -> &'static super::sip::Sip {
    static KEY: std::sync::OnceLock<super::sip::Sip> = std::sync::OnceLock::new();
    KEY.get_or_init(super::sip::Sip::default)
}

impl QuestionRecord {
    pub fn new(name: impl Into<String>, qtype: RrType, class: RrClass) -> Self {
        let q = Question {
            name: name.into(),
            qtype,
            class,
        };
        let hash = std::hash::BuildHasher::hash_one(question_hasher(), &q);
        Self(Arc::new(Hashed { q, hash }))
    }
}

impl PartialEq for QuestionRecord {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0) || (self.0.hash == other.0.hash && self.0.q == other.0.q)
    }
}

impl Eq for QuestionRecord {}

impl std::hash::Hash for QuestionRecord {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        state.write_u64(self.0.hash);
    }
}

/// Hashes a [`QuestionRecord`] as its digest, as is: a map keyed by questions alone
/// ([`QMap`]) then hashes nothing per lookup. The digest is keyed SipHash of the question,
/// so the map is as hard to flood as one hashing the name with SipHash itself. (Anything
/// else written to it is mixed in, not lost, but it is meant for questions only.)
#[derive(Default)]
pub(crate) struct DigestHasher(u64);

impl std::hash::Hasher for DigestHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write_u64(&mut self, digest: u64) {
        self.0 = self.0.rotate_left(5) ^ digest;
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(5) ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
    }
}

/// A map keyed by questions, hashing their digests (see [`DigestHasher`]).
pub(crate) type QMap<V> =
    std::collections::HashMap<QuestionRecord, V, std::hash::BuildHasherDefault<DigestHasher>>;

impl std::ops::Deref for QuestionRecord {
    type Target = Question;
    fn deref(&self) -> &Question {
        &self.0.q
    }
}

/// Written as its question.
impl Serialize for QuestionRecord {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.0.q.serialize(s)
    }
}

impl std::fmt::Debug for QuestionRecord {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.q.fmt(f)
    }
}

/// How a transaction's answer came, or why none did: the facts of its one-line summary
/// ([`transaction_summary`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Summary {
    /// The client got an answer: the record's `rcode`, `answers`, `latency_ns` and
    /// `answer_cut` are its.
    Answered(Answered),
    /// The answer was lost on the way (fragments missing) at `location` in
    /// `netns`/`ifname`.
    AnswerLost {
        location: String,
        netns: String,
        ifname: String,
        retried: bool,
        /// Which of its IP fragments never came, their bytes and the datagram's length.
        part: Option<DroppedPart>,
    },
    /// The kernel dropped the query or its answer.
    Dropped {
        reason: String,
        location: String,
        retried: bool,
        /// The answer reached the client's interface and was dropped after it, in the
        /// client's own namespace, before the asking socket (never "unanswered": the server
        /// did answer, up to the client's door).
        at_client: bool,
        /// The drop took IP fragments of the answer: which, their bytes, the datagram's
        /// length.
        part: Option<DroppedPart>,
    },
    /// The answer reached the client's namespace `answer_ns` after the first query, but the
    /// client had stopped waiting: the kernel dropped it for want of a socket (`reason` at
    /// `location`). `gave_up_ns`: the client's own timeout, where its retry shows it
    /// (first query → the next attempt).
    Late {
        answer_ns: u64,
        gave_up_ns: Option<u64>,
        reason: String,
        location: String,
        retried: bool,
    },
    /// No answer yet when the input ended.
    Pending,
    /// No answer within `timeout_ns`; `retries`: the client tried again this many times.
    Unanswered {
        timeout_ns: u64,
        retries: Option<usize>,
    },
}

/// How an answered transaction got its answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Answered {
    /// In one go.
    Directly,
    /// The UDP answer was truncated; the client asked again over TCP.
    OverTcp,
    /// The first query went unanswered for `timeout_ns` (dropped by the kernel: `(reason,
    /// location)`), and a retry was answered.
    AfterTimeout {
        timeout_ns: u64,
        drop: Option<(String, String)>,
    },
}

/// One client question followed through every leg it caused (written by its own
/// `Serialize`, below: its summary is made of several of its fields).
#[derive(Clone, Debug)]
pub struct TransactionRecord {
    pub id: u64,
    pub lookup: LookupRef,
    pub ts_ns: u64,
    /// `ts_ns` as Unix-epoch nanoseconds (wall-clock time).
    pub wall_ns: u64,
    pub client: SocketAddr,
    pub client_netns: Arc<str>,
    /// The client's pod.
    pub pod: PodRef,
    pub question: QuestionRecord,
    pub outcome: Outcome,
    pub rcode: Option<Rcode>,
    pub answers: Vec<String>,
    /// The answer the client got was cut by the capture: how (see [`LegRecord::answer_cut`]).
    pub answer_cut: Option<Cut>,
    /// First query → the answer the client got, at the client's first point.
    pub latency_ns: Option<u64>,
    /// For a person, e.g. `timeout after 5.0 s, retried, answered at +5.02 s: NOERROR`.
    pub summary: Summary,
    /// `--record`: the flight-recorder file holding this incident's packets (written once its
    /// window is over).
    pub evidence: Option<String>,
    /// `analyze` of several nodes' captures: the nodes whose captures its legs came from,
    /// the client's first (empty otherwise, and not written).
    pub nodes: Vec<Arc<str>>,
    pub legs: Vec<LegRecord>,
}

/// A place's names (by their addresses: namespace, interface) and its pod.
type NamedPlace = (*const str, *const str, Option<Arc<PodRef>>);

impl TransactionRecord {
    /// [`RecordKind::annotate_pods`] but the hops' own pods (no sink reads them:
    /// [`Wants::hop_pods`](crate::output::sink::Wants::hop_pods)): the client's pod, the
    /// drops' pods, as they would be with them.
    pub(crate) fn annotate_pods_but_hops(&mut self, names: &Names) {
        self.annotate(names, false);
    }

    /// The pods of the record's places; of every hop only when `hops`.
    fn annotate(&mut self, names: &Names, hops: bool) {
        // A place's hops share its names (the decode stage's Arcs): one lookup a place,
        // the rest by address (every hop lives as long as this call, so no address is
        // another name's).
        let mut places: [Option<NamedPlace>; 8] = Default::default();
        for leg in &mut self.legs {
            for h in leg.hops.iter_mut().filter(|_| hops) {
                let place = (Arc::as_ptr(&h.netns), Arc::as_ptr(&h.ifname));
                let known = places.iter().flatten().find(|(ns, ifname, _)| {
                    std::ptr::addr_eq(*ns, place.0) && std::ptr::addr_eq(*ifname, place.1)
                });
                h.pod = match known {
                    Some((_, _, pod)) => pod.clone(),
                    None => {
                        let pod = names.pod_ref_at(&h.netns, &h.ifname).cloned();
                        if let Some(free) = places.iter_mut().find(|p| p.is_none()) {
                            *free = Some((place.0, place.1, pod.clone()));
                        }
                        pod
                    }
                };
            }
            if let Some(d) = &mut leg.drop {
                d.pod = names.pod_ref_at(&d.netns, &d.ifname).cloned();
            }
        }
        self.pod = names.pod_of(&self.client_netns, "");
        // Traced from the node side only: the client's pod is that of the veth its query
        // was first seen on.
        if !self.pod.is_known() {
            if let Some(h) = self.legs.first().and_then(|l| l.hops.first()) {
                let named;
                let pod = if hops {
                    h.pod_ref()
                } else {
                    named = names.pod_ref_at(&h.netns, &h.ifname).cloned();
                    crate::decode::record::pod_or_none(&named)
                };
                self.pod = PodRef {
                    pod_veth: false,
                    ..pod.clone()
                };
            }
        }
    }
    /// Whether the client's question failed, what `--failures` keeps of transactions: not
    /// answered, answered SERVFAIL or REFUSED (the client or any leg), or with a leg dropped,
    /// late or unanswered.
    pub fn failed(&self) -> bool {
        self.outcome != Outcome::Answered
            || self
                .rcode
                .iter()
                .chain(self.legs.iter().filter_map(|l| l.rcode.as_ref()))
                .any(Rcode::is_failure)
            || self.legs.iter().any(|l| {
                matches!(
                    l.outcome,
                    LegOutcome::Dropped | LegOutcome::Unanswered | LegOutcome::Late
                )
            })
    }

    /// Whether it [failed](Self::failed) or got its answer only past trouble: after a
    /// timeout, past a conntrack race, or through a forwarding loop. OTLP exports these
    /// whatever the sampling ratio. Wider than `failed` because a trace is all OTLP shows:
    /// the race and the loop, which JSON and text write as `race` and `loop` records of their
    /// own (and `--failures` keeps), are in OTLP only this transaction's spans, and a retry
    /// after a timeout may leave every leg answered (the same query re-sent on one leg).
    pub fn troubled(&self) -> bool {
        self.failed()
            || matches!(
                self.summary,
                Summary::Answered(Answered::AfterTimeout { .. })
            )
            || self.legs.iter().any(|l| l.race_drop)
            || self.first_loop().is_some()
    }

    /// The first leg (in leg order) that closed a forwarding cycle, and the cycle.
    pub fn first_loop(&self) -> Option<(usize, &LegLoop)> {
        self.legs
            .iter()
            .enumerate()
            .find_map(|(n, l)| l.closes_loop.as_deref().map(|lp| (n, lp)))
    }
}

/// Field by field in docs/output.md: the client's pod flattened in; a late answer's times
/// (`late_answer_ns`: first query → the client's namespace, and the client's own timeout
/// where its retry shows it) and the summary in words before the evidence and the legs.
impl Serialize for TransactionRecord {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(None)?;
        m.serialize_entry("id", &self.id)?;
        m.serialize_entry("lookup", &self.lookup)?;
        m.serialize_entry("ts_ns", &self.ts_ns)?;
        m.serialize_entry("time", &WallTime(self.wall_ns))?;
        m.serialize_entry("client", &Addr(self.client))?;
        m.serialize_entry("client_netns", &*self.client_netns)?;
        self.pod.serialize_entries(&mut m)?;
        m.serialize_entry("question", &self.question)?;
        m.serialize_entry("outcome", &self.outcome)?;
        m.serialize_entry("rcode", &self.rcode)?;
        m.serialize_entry("answers", &self.answers)?;
        if let Some(c) = &self.answer_cut {
            m.serialize_entry("answer_cut", c)?;
        }
        m.serialize_entry("latency_ns", &self.latency_ns)?;
        if let Summary::Late {
            answer_ns,
            gave_up_ns,
            ..
        } = &self.summary
        {
            m.serialize_entry("late_answer_ns", answer_ns)?;
            if let Some(g) = gave_up_ns {
                m.serialize_entry("client_timeout_ns", g)?;
            }
        }
        m.serialize_entry("summary", &transaction_summary(self))?;
        if let Some(e) = &self.evidence {
            m.serialize_entry("evidence", e)?;
        }
        if !self.nodes.is_empty() {
            m.serialize_entry("nodes", &self.nodes)?;
        }
        m.serialize_entry("legs", &self.legs)?;
        m.end()
    }
}

/// `answer cut by the capture at 200 of 731 bytes: 1 of 8 answers seen`.
fn cut_note(c: &Cut, answers_seen: usize) -> String {
    let at = format!(
        "answer cut by the capture at {} of {} bytes",
        c.captured_bytes, c.message_bytes
    );
    if c.questions > 0 {
        format!("{at}: question not seen whole")
    } else if c.answers > 0 {
        let total = answers_seen + usize::from(c.answers);
        format!("{at}: {answers_seen} of {total} answers seen")
    } else {
        format!("{at}, after its answers")
    }
}

fn seconds(ns: u64) -> f64 {
    ns as f64 / 1e9
}

/// A transaction in one line, e.g. `timeout after 5.0 s, retried, answered at +5.02 s:
/// NOERROR`.
pub fn transaction_summary(t: &TransactionRecord) -> String {
    let retried_note = |retried: bool| if retried { ", retried" } else { "" };
    match &t.summary {
        Summary::Answered(how) => {
            let rcode = t.rcode.as_deref().unwrap_or("");
            let answers = match t.answers.len() {
                0 => String::new(),
                1..=3 => format!(" {}", t.answers.join(", ")),
                n => format!(" {}, … ({n} answers)", t.answers[..2].join(", ")),
            };
            // Unknown when the answer is stamped before its query (merged captures' clocks).
            let (at, lat) = match t.latency_ns {
                Some(ns) => (format!(" at +{}", dur(ns)), format!(" in {}", dur(ns))),
                None => (String::new(), " (latency unknown)".to_owned()),
            };
            let how = match how {
                Answered::OverTcp => {
                    format!("truncated, retried over TCP, {rcode}{answers}{at}")
                }
                Answered::AfterTimeout { timeout_ns, drop } => {
                    let cause = match drop {
                        Some((reason, location)) => {
                            format!("query dropped ({reason} at {location}), ")
                        }
                        None => String::new(),
                    };
                    format!(
                        "{cause}timeout after {:.1} s, retried, answered{at}: {rcode}{answers}",
                        seconds(*timeout_ns)
                    )
                }
                Answered::Directly => format!("{rcode}{answers}{lat}"),
            };
            match &t.answer_cut {
                Some(c) => format!("{how}; {}", cut_note(c, t.answers.len())),
                None => how,
            }
        }
        Summary::AnswerLost {
            location,
            netns,
            ifname,
            retried,
            part,
        } => {
            // `fragment 2 of 3 never seen` says the numbers; the part adds the bytes.
            let what = match part {
                Some(p) => format!("{} never seen", p.describe()),
                None => location.clone(),
            };
            format!(
                "answer lost on the way: {what} at {netns}/{ifname}, unanswered{}",
                retried_note(*retried)
            )
        }
        Summary::Dropped {
            reason,
            location,
            retried,
            at_client: true,
            part,
        } => {
            let rcode = t
                .rcode
                .as_deref()
                .map(|r| format!(" {r}"))
                .unwrap_or_default();
            let mut s = format!(
                "answer{rcode} reached the client's interface, then was dropped by the kernel ({reason} at {location})"
            );
            if let Some(p) = part {
                let _ = write!(s, ": {}", p.describe());
            }
            s.push_str(retried_note(*retried));
            s
        }
        Summary::Dropped {
            reason,
            location,
            retried,
            at_client: false,
            part,
        } => match part {
            Some(p) => format!(
                "dropped by the kernel ({reason} at {location}): the answer's {}, unanswered{}",
                p.describe(),
                retried_note(*retried)
            ),
            None => format!(
                "dropped by the kernel ({reason} at {location}), unanswered{}",
                retried_note(*retried)
            ),
        },
        Summary::Late {
            answer_ns,
            gave_up_ns,
            reason,
            location,
            retried,
        } => {
            let rcode = t.rcode.as_deref().unwrap_or("");
            let mut s = format!(
                "answer {rcode} came at +{} after the client had given up (socket closed: {reason} at {location})",
                dur(*answer_ns)
            );
            if let Some(g) = gave_up_ns {
                let _ = write!(
                    s,
                    ", {} after its own {} timeout",
                    dur(answer_ns.saturating_sub(*g)),
                    dur(*g)
                );
            }
            s.push_str(", unanswered for the client");
            s.push_str(retried_note(*retried));
            s
        }
        Summary::Pending => "no answer yet when the input ended".to_string(),
        Summary::Unanswered {
            timeout_ns,
            retries,
        } => {
            let mut s = format!("unanswered after {:.1} s", seconds(*timeout_ns));
            if let Some(n) = retries {
                let _ = write!(s, ", retried {n} time(s)");
            }
            s
        }
    }
}

/// A transaction matches by any of its legs or hops: its question, any leg's rcode, the
/// client's or any hop's pod.
impl RecordKind for TransactionRecord {
    fn any_pod(&self, f: &mut dyn FnMut(&PodRef) -> bool) -> bool {
        f(&self.pod)
            || self.legs.iter().any(|l| {
                l.hops.iter().any(|h| f(h.pod_ref()))
                    || l.drop.as_ref().is_some_and(|d| f(d.pod_ref()))
            })
    }
    fn any_question(&self, f: &mut dyn FnMut(&str, RrType) -> bool) -> bool {
        f(&self.question.name, self.question.qtype)
    }
    fn any_rcode(&self, f: &mut dyn FnMut(&str) -> bool) -> bool {
        self.rcode
            .iter()
            .chain(self.legs.iter().filter_map(|l| l.rcode.as_ref()))
            .any(|rc| f(rc))
    }
    fn is_failure(&self) -> bool {
        self.failed()
    }
    /// Unanswered counts as slower than any limit.
    fn slower_than(&self, limit_ns: u64) -> bool {
        self.latency_ns.is_none_or(|l| l > limit_ns)
            || self
                .legs
                .iter()
                .any(|l| l.latency_ns.is_some_and(|l| l > limit_ns))
    }
    fn annotate_pods(&mut self, names: &Names) {
        self.annotate(names, true);
    }
    /// An unanswered or late transaction is an incident, and one answered SERVFAIL.
    fn incident(&self) -> Option<Incident> {
        let kind = match self.outcome {
            Outcome::Unanswered => "unanswered",
            Outcome::Late => "late",
            _ if self.rcode == Some(Rcode::SERVFAIL) => "servfail",
            _ => return None,
        };
        let detail = format!(
            "transaction {} {} {} from {}: {}",
            self.id,
            self.question.name,
            self.question.qtype,
            self.client,
            transaction_summary(self)
        );
        Some(Incident {
            kind,
            detail,
            ts_ns: self.ts_ns,
        })
    }
    fn set_evidence(&mut self, file: Option<String>) {
        self.evidence = file;
    }
}

#[cfg(test)]
#[path = "record_tests.rs"]
mod tests;
