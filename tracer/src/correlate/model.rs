//! The correlator's model: questions, hops, legs, transactions, lookups.
use super::*;
use crate::{decode::dns::Rcode, event::Direction};

/// A question as the correlator matches it (name in lower case), shared by its legs,
/// indexes and records.
pub(crate) type QKey = QuestionRecord;

impl QuestionRecord {
    /// A question; `name` is lowercased (questions are matched case-insensitively).
    pub(super) fn asked(name: &str, qtype: RrType, class: RrClass) -> QKey {
        QKey::new(name.to_ascii_lowercase(), qtype, class)
    }

    pub(super) fn of(msg: &DnsMessage) -> Option<QKey> {
        let q = msg.questions.first()?;
        Some(QKey::asked(&q.name, q.qtype, q.class))
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(super) struct LegKey {
    pub(super) proto: Proto,
    pub(super) client_port: u16,
    pub(super) id: u16,
    pub(super) q: QKey,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Via {
    /// Same addresses as the leg's first hop.
    Same,
    /// Addresses differ; joined through the conntrack entry.
    Conntrack,
    /// Addresses differ; joined by (client port, DNS id, question) alone.
    Fallback,
}

#[derive(Clone, Debug)]
pub(super) struct Hop {
    pub(super) ts_ns: u64,
    pub(super) at: ObservationPoint,
    pub(super) netns: Arc<str>,
    pub(super) ifname: Arc<str>,
    pub(super) src: SocketAddr,
    pub(super) dst: SocketAddr,
    pub(super) dns_id: u16,
    pub(super) qr: bool,
    pub(super) via: Via,
    /// The tunnel the observation was in (its outer addresses, kind, VNI or key).
    pub(super) tunnel: Option<Arc<crate::decode::tunnel::Tunnel>>,
}

#[derive(Clone, Debug)]
pub(super) struct Response {
    pub(super) ts_ns: u64,
    pub(super) rcode: Rcode,
    pub(super) tc: bool,
    pub(super) answers: Vec<String>,
    /// The capture cut the response (at every hop it was seen whole at none): `answers` are
    /// those that fit.
    pub(super) cut: Option<Cut>,
}

impl Response {
    /// The response `msg`, seen at `ts_ns`.
    pub(super) fn of(ts_ns: u64, msg: &DnsMessage) -> Self {
        Response {
            ts_ns,
            rcode: msg.rcode.clone(),
            tc: msg.flags.tc,
            // `TYPE data`, as `format!("{} {}", ..)` without its formatting machinery.
            answers: msg
                .answers
                .iter()
                .map(|r| {
                    let rtype = r.rtype.name();
                    let mut s = String::with_capacity(rtype.len() + 1 + r.data.len());
                    s.push_str(&rtype);
                    s.push(' ');
                    s.push_str(&r.data);
                    s
                })
                .collect(),
            cut: msg.cut,
        }
    }
}

#[derive(Clone, Debug)]
pub(super) struct Leg {
    pub(super) id: u64,
    pub(super) key: LegKey,
    pub(super) tx: u64,
    pub(super) parent: Option<u64>,
    pub(super) role: LegRole,
    pub(super) first_ts: u64,
    pub(super) last_ts: u64,
    /// Client and server as at the first query hop.
    pub(super) client: SocketAddr,
    pub(super) server: SocketAddr,
    /// Where the query was last seen going (after DNAT: the pod).
    pub(super) backend: SocketAddr,
    pub(super) backend_at: Option<(ObservationPoint, Arc<str>)>,
    /// Namespace of the latest query hop: where the query was delivered, as far as seen.
    pub(super) delivered_ns: Arc<str>,
    /// Where the latest query hop was seen (its namespace's cookie, interface and
    /// direction): a query last seen coming into a namespace was delivered to a socket
    /// there.
    pub(super) delivered_at: ObservationPoint,
    pub(super) client_netns: Arc<str>,
    pub(super) client_point: ObservationPoint,
    pub(super) hops: Vec<Hop>,
    pub(super) retransmits: u32,
    pub(super) response: Option<Response>,
    pub(super) drop: Option<LegDrop>,
    /// A drop's conntrack evidence that a detector keeps (a failed conntrack confirm: the
    /// race detector's).
    pub(super) race: Option<DropEvidence>,
    /// The forwarding cycle this leg closed when it was made or moved (`check_cycle`): how
    /// many legs of its chain, this one and its parents, make the cycle, and the chain's
    /// length less one. No allocation: a loop's every leg may hold one.
    pub(super) closes_cycle: Option<(u32, u32)>,
    /// Kernel drops of this leg's answer in the client's own namespace after the answer
    /// was seen at the client's point (between the interface and the asking socket): the
    /// first one, and the times of at most [`MAX_CLIENT_DROPS`] (see
    /// [`Leg::delivered_at`]).
    pub(super) client_drop: Option<LegDrop>,
    pub(super) client_drop_ts: Vec<u64>,
    pub(super) timed_out: bool,
    /// Still waiting when the input ended (trace stopped before the timeout).
    pub(super) cut_short: bool,
    /// The query was redirected to a local port in the client's own namespace (`-j
    /// REDIRECT` in its `nat OUTPUT`: a DNS proxy in the pod): `server` is what the client
    /// asked, `backend` the proxy's socket ([`Correlator::redirect_of`]).
    pub(super) redirected: bool,
    /// A redirected query the pod's proxy asked on for without it being the parent: the
    /// proxy's one query was for this client and another asking the same at once.
    pub(super) proxy_shared: bool,
}

impl Leg {
    pub(super) fn closed(&self) -> bool {
        self.response.is_some() || self.timed_out || self.cut_short
    }

    /// The response was seen at the interface where the client's query was.
    pub(super) fn reached_client(&self) -> bool {
        self.hops
            .iter()
            .any(|h| h.qr && same_iface(h.at, self.client_point))
    }

    /// The response was seen on the way but dropped (or lost fragments) before it reached
    /// the client: the client did not get it.
    pub(super) fn answer_lost(&self) -> bool {
        self.response.is_some()
            && self.drop.as_ref().is_some_and(|d| d.response)
            && !self.reached_client()
    }

    /// When the answer reached the asking socket, as far as the kernel said: the first
    /// arrival of the response at the client's point (ingress) that no drop in the client's
    /// namespace followed before the next arrival. `None` without a response, when it was
    /// lost before the client's point, or when every copy of it was dropped after it.
    pub(super) fn delivered_at(&self) -> Option<u64> {
        let r = self.response.as_ref()?;
        if self.answer_lost() {
            return None;
        }
        let at_client = |ingress_only: bool| {
            self.hops
                .iter()
                .filter(|h| h.qr && same_iface(h.at, self.client_point))
                .filter(move |h| !ingress_only || h.at.dir == Direction::Ingress)
                .map(|h| h.ts_ns)
        };
        if self.client_drop_ts.is_empty() {
            // No drop in the client's namespace: the first arrival, without sorting (what
            // the search below finds when no drop can follow an arrival).
            return Some(
                at_client(true)
                    .min()
                    .or_else(|| at_client(false).min())
                    .unwrap_or(r.ts_ns),
            );
        }
        let arrivals = |ingress_only: bool| {
            let mut ts: Vec<u64> = at_client(ingress_only).collect();
            ts.sort_unstable();
            ts
        };
        // On `lo` an answer passes the client's point twice (egress, then ingress): the
        // socket is after the ingress.
        let mut seen = arrivals(true);
        if seen.is_empty() {
            seen = arrivals(false);
        }
        if seen.is_empty() {
            // Seen on the way but not at the client's point (not watched there), and not
            // lost: the answer is as far as dnspath can tell.
            return Some(r.ts_ns);
        }
        seen.iter().enumerate().find_map(|(i, &a)| {
            let next = seen.get(i + 1).copied().unwrap_or(u64::MAX);
            let dropped = self.client_drop_ts.iter().any(|&d| d >= a && d < next);
            (!dropped).then_some(a)
        })
    }

    /// The response reached the client's point and every copy of it was dropped after
    /// that, before the asking socket: the first such drop.
    pub(super) fn undelivered_drop(&self) -> Option<&LegDrop> {
        if self.response.is_none() || self.answer_lost() || self.delivered_at().is_some() {
            return None;
        }
        self.client_drop.as_ref()
    }

    /// A root leg whose response has not reached the client yet: until when to wait for it
    /// (or for news of its loss), `grace_ns` ([`CorrelateConfig::answer_grace_ns`]) after it
    /// was seen on the way.
    ///
    /// [`CorrelateConfig::answer_grace_ns`]: super::CorrelateConfig::answer_grace_ns
    pub(super) fn awaiting_answer_until(&self, grace_ns: u64) -> Option<u64> {
        match &self.response {
            Some(r) if self.parent.is_none() && self.drop.is_none() && !self.reached_client() => {
                Some(r.ts_ns + grace_ns)
            }
            _ => None,
        }
    }
}

/// How many drop times of one leg's answer in the client's namespace are kept (a
/// duplicate answer per retransmit at most; more are the same story).
pub(super) const MAX_CLIENT_DROPS: usize = 8;

/// The drop says the asking socket was gone when the answer came: the client had given up
/// (closed its socket). NO_SOCKET (Linux ≥ 5.17) at the UDP or TCP receive path; older
/// kernels give no reason, so the receive function says it.
pub(super) fn socket_closed(d: &LegDrop) -> bool {
    let function = d.location.split('+').next().unwrap_or("");
    let receive = matches!(
        function,
        "__udp4_lib_rcv" | "__udp6_lib_rcv" | "tcp_v4_rcv" | "tcp_v6_rcv"
    );
    d.reason == "NO_SOCKET" || (receive && d.reason == crate::decode::decoder::UNKNOWN_REASON)
}

#[derive(Clone, Debug)]
pub(super) struct Transaction {
    pub(super) id: u64,
    pub(super) lookup: u64,
    pub(super) lookup_step: u32,
    pub(super) legs: Vec<u64>,
    pub(super) first_ts: u64,
    pub(super) last_activity: u64,
    /// When [`Correlator::finish`] looks at it next (its entry in `wakes`).
    pub(super) wake_at: u64,
}

/// The server a leg's query was delivered to, for deciding that a question came back to a
/// server already on its chain: after DNAT the pod, not the ClusterIP (a pod forwarding to
/// its own Service is only a loop once the Service sends the question back to a server of
/// the chain). Loopback addresses are only the same server within one namespace.
pub(super) type Endpoint = (SocketAddr, Option<Arc<str>>);

pub(super) fn endpoint(l: &Leg) -> Endpoint {
    let ns = if l.backend.ip().is_loopback() {
        Some(l.delivered_ns.clone())
    } else {
        None
    };
    (l.backend, ns)
}

/// A drop's conntrack evidence, kept on its leg because a detector asked for it
/// ([`Detector::keeps`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct DropEvidence {
    pub cpu: u32,
    /// The cookie of the namespace it was dropped in.
    pub netns: u64,
    pub ts: u64,
    /// Where conntrack's DNAT sent it.
    pub backend: SocketAddr,
    /// The kernel's own word on the conntrack confirm (where its hook is loaded).
    pub confirm_failed: Option<bool>,
}

/// Two observation points on the same interface of the same namespace.
pub(super) fn same_iface(a: ObservationPoint, b: ObservationPoint) -> bool {
    a.netns == b.netns && a.ifindex == b.ifindex
}
