//! Joining: each observation finds its leg (across NAT, by conntrack or the fallback
//! method), its transaction (parent forwards, retries, TCP fallback) and its lookup.
use super::*;
use crate::event::Direction;

impl<D: Detector> Correlator<D> {
    pub(crate) fn on_conntrack(&mut self, ev: &ConntrackEvent) {
        self.ct.learn(ev);
    }

    /// Queues an observation; it is correlated once the reorder window has passed it.
    pub(crate) fn on_observed(&mut self, o: Observed) {
        let ts = o.ts();
        if ts < self.watermark {
            self.stats.late_observations += 1;
            self.process(o);
            return;
        }
        self.pending.push(ts, o);
        // Bound the reorder buffer: under a flood, correlate early rather than grow.
        while self.pending.len() > self.cfg.max_legs {
            if let Some(o) = self.pending.pop_first() {
                self.watermark = self.watermark.max(o.ts());
                self.process(o);
            }
        }
    }

    pub(super) fn process(&mut self, o: Observed) {
        match o {
            Observed::Message(m) => self.on_message(m),
            Observed::Drop(d) => self.on_drop(*d),
        }
        // A hop added to an open leg counts towards `max_leg_bytes` at once, not at the
        // next tick (a batch's hops could overshoot it until then).
        self.enforce_bounds();
    }

    /// The client port of the flow's original tuple (conntrack), and whether the observed
    /// addresses differ from it.
    pub(super) fn canonical_client(
        &self,
        proto: Proto,
        src: SocketAddr,
        dst: SocketAddr,
        qr: bool,
    ) -> (SocketAddr, bool) {
        match self.ct.lookup(proto, src, dst) {
            // An answer in its entry's original direction opened that entry: the query's own
            // entry was gone (deleted, expired) when it came back, so this one says nothing of
            // the query's client (and the answer is not reverse-NATed).
            Some(m) if qr && !m.reply_dir => (dst, false),
            Some(m) => (m.orig.src, true),
            None => (if qr { dst } else { src }, false),
        }
    }

    pub(super) fn on_message(&mut self, o: Observation) {
        let Some(q) = self.keys.get(&o.msg) else {
            self.stats.unkeyed += 1;
            return;
        };
        if self.detect.message(&q, o.ts_ns) {
            self.stats.loop_messages += 1;
            return;
        }
        let (qr, dns_id) = (o.msg.qr, o.msg.id);
        let generation = (self.legs.generation(), self.ct.generation());
        let memo = self
            .join_memo
            .as_ref()
            .filter(|m| m.generation == generation && m.is_for(&o));
        let (client, by_ct, memo_leg, same_key) = match memo {
            Some(m) => (m.client, m.by_ct, Some(m.leg), None),
            None => {
                let (client, by_ct) = self.canonical_client(o.proto, o.src, o.dst, qr);
                // The same message at another point, its addresses NATed on the way: the
                // same leg key when the client port is the same (its id and question are
                // the message's), which the leg index answers the same while no leg came
                // or went.
                let same_key = self
                    .join_memo
                    .as_ref()
                    .filter(|m| {
                        m.generation.0 == generation.0
                            && m.proto == o.proto
                            && m.client.port() == client.port()
                            && Arc::ptr_eq(&m.msg, &o.msg)
                    })
                    .map(|m| m.leg);
                (client, by_ct, None, same_key)
            }
        };
        let key = LegKey {
            proto: o.proto,
            client_port: client.port(),
            id: dns_id,
            q: q.clone(),
        };
        let (seen_client, seen_server) = if qr { (o.dst, o.src) } else { (o.src, o.dst) };
        let hop = |via| Hop {
            ts_ns: o.ts_ns,
            at: o.at,
            netns: o.netns.clone(),
            ifname: o.ifname.clone(),
            src: o.src,
            dst: o.dst,
            dns_id,
            qr,
            via,
            tunnel: o.tunnel.clone(),
        };
        let existing = match memo_leg {
            Some(leg) => leg,
            None => {
                let leg = match same_key {
                    Some(leg) => leg,
                    None => self.legs.by_key(&key),
                };
                self.join_memo = Some(JoinMemo {
                    msg: Arc::clone(&o.msg),
                    proto: o.proto,
                    src: o.src,
                    dst: o.dst,
                    generation,
                    client,
                    by_ct,
                    leg,
                });
                leg
            }
        };
        if qr {
            let Some(leg_id) = existing else {
                self.stats.orphan_responses += 1;
                return;
            };
            let max_hops = self.cfg.max_hops_per_leg;
            let Some(leg) = self.legs.get_mut(&leg_id) else {
                return;
            };
            let via = via_for(leg, seen_client, seen_server, by_ct);
            Self::answered_as(leg, seen_client, seen_server);
            let stored = leg.hops.len() < max_hops;
            if stored {
                leg.hops.push(hop(via));
            } else {
                self.stats.hops_not_stored += 1;
            }
            leg.last_ts = leg.last_ts.max(o.ts_ns);
            let tx = leg.tx;
            match &mut leg.response {
                None => self.legs.respond(leg_id, Response::of(o.ts_ns, &o.msg)),
                Some(r) => {
                    // The same response captured whole at another hop: it says more.
                    if r.cut.is_some() && o.msg.cut.is_none() {
                        *r = Response {
                            ts_ns: r.ts_ns,
                            ..Response::of(o.ts_ns, &o.msg)
                        };
                    }
                }
            }
            if stored {
                self.legs.hop_added();
            }
            self.touch(tx, o.ts_ns);
            return;
        }

        // A query.
        if let Some(leg_id) = existing {
            let settle = self.cfg.settle_ns;
            let retransmit_gap = self.cfg.retransmit_gap_ns;
            let max_hops = self.cfg.max_hops_per_leg;
            if let Some(leg) = self.legs.get_mut(&leg_id) {
                let answered_long_ago = leg
                    .response
                    .as_ref()
                    .is_some_and(|r| o.ts_ns > r.ts_ns + settle);
                if !answered_long_ago {
                    // The same query again at a point that already saw it: a retransmission.
                    let again = leg
                        .hops
                        .iter()
                        .any(|h| !h.qr && h.at == o.at && o.ts_ns > h.ts_ns + retransmit_gap);
                    if again && o.at == leg.client_point {
                        leg.retransmits += 1;
                    }
                    let via = via_for(leg, seen_client, seen_server, by_ct);
                    let mut moved = false;
                    if seen_server != leg.server
                        && seen_server != leg.backend
                        && o.ts_ns >= leg.last_ts
                    {
                        leg.backend = seen_server;
                        leg.backend_at = Some((o.at, o.netns.clone()));
                        moved = leg.parent.is_some();
                    }
                    let stored = leg.hops.len() < max_hops;
                    if stored {
                        leg.hops.push(hop(via));
                    } else {
                        self.stats.hops_not_stored += 1;
                    }
                    if o.ts_ns >= leg.last_ts {
                        leg.delivered_ns = o.netns.clone();
                        leg.delivered_at = o.at;
                    }
                    leg.last_ts = leg.last_ts.max(o.ts_ns);
                    let tx = leg.tx;
                    if stored {
                        self.legs.hop_added();
                    }
                    self.touch(tx, o.ts_ns);
                    if moved {
                        self.check_cycle(leg_id, o.ts_ns);
                    }
                    return;
                }
            }
        }

        // A new leg: a forwarder's query, a retry, a TCP fallback, or a new transaction.
        let parent_leg = self.find_parent(&q, seen_client.ip(), &o);
        if let Some(p) = parent_leg {
            let full = self
                .legs
                .get(&p)
                .and_then(|pl| self.txs.get(&pl.tx))
                .is_some_and(|t| t.legs.len() >= self.cfg.max_legs_per_transaction);
            if full {
                self.stats.legs_not_stored += 1;
                self.detect.leg(&LegEvent::Forwarded {
                    server: seen_client.ip(),
                    q: &q,
                    ts: o.ts_ns,
                });
                return;
            }
        }
        let id = self.next();
        let (tx, parent, role) = match parent_leg {
            Some(parent) => (
                self.legs.get(&parent).map(|p| p.tx).unwrap_or(0),
                Some(parent),
                LegRole::Forward,
            ),
            None => match self.find_previous_attempt(&q, &o, seen_client) {
                Some((tx, role)) => (tx, None, role),
                None => {
                    let tx = self.next();
                    let next_id = &mut self.next_id;
                    let (lookup, step) = self.lookups.assign(
                        seen_client.ip(),
                        o.netns.clone(),
                        &q.name,
                        o.ts_ns,
                        || {
                            let id = *next_id;
                            *next_id += 1;
                            id
                        },
                    );
                    self.new_transaction(
                        tx,
                        Transaction {
                            id: tx,
                            lookup,
                            lookup_step: step,
                            legs: Vec::new(),
                            first_ts: o.ts_ns,
                            last_activity: o.ts_ns,
                            wake_at: o.ts_ns + self.cfg.settle_ns,
                        },
                    );
                    self.wakes.insert((o.ts_ns + self.cfg.settle_ns, tx));
                    (tx, None, LegRole::Query)
                }
            },
        };
        let leg = Leg {
            id,
            key,
            tx,
            parent,
            role,
            first_ts: o.ts_ns,
            last_ts: o.ts_ns,
            client: seen_client,
            server: seen_server,
            backend: seen_server,
            backend_at: Some((o.at, o.netns.clone())),
            delivered_ns: o.netns.clone(),
            delivered_at: o.at,
            client_netns: o.netns.clone(),
            client_point: o.at,
            // Room for as many hops as the last leg taken had (on a node, every query
            // crosses the same few points: both ends of each veth, there and back), so
            // that the vector does not grow as they come.
            hops: {
                let mut hops = Vec::with_capacity(self.hop_room);
                hops.push(hop(Via::Same));
                hops
            },
            retransmits: 0,
            response: None,
            drop: None,
            race: None,
            closes_cycle: None,
            client_drop: None,
            client_drop_ts: Vec::new(),
            timed_out: false,
            cut_short: false,
            redirected: false,
            proxy_shared: false,
        };
        if let Some(t) = self.txs.get_mut(&tx) {
            t.legs.push(id);
        }
        self.touch(tx, o.ts_ns);
        self.timeouts.push(o.ts_ns + self.cfg.timeout_ns, id);
        self.legs.insert(leg);
        self.pod_proxy_leg(id, &q, &o);
        // The key now names the new leg: so does the memo, for the next end of the veth.
        let generation = (self.legs.generation(), self.ct.generation());
        if let Some(m) = self.join_memo.as_mut().filter(|m| m.is_for(&o)) {
            m.leg = Some(id);
            m.generation = generation;
        }
        self.stats.legs += 1;
        match role {
            LegRole::Forward => {
                self.detect.leg(&LegEvent::Forwarded {
                    server: seen_client.ip(),
                    q: &q,
                    ts: o.ts_ns,
                });
                self.check_cycle(id, o.ts_ns);
            }
            LegRole::Query | LegRole::Retry | LegRole::TcpFallback => {
                self.detect.leg(&LegEvent::Asked { q: &q, ts: o.ts_ns })
            }
        }
        self.enforce_bounds();
    }

    /// An open leg whose query was delivered to the address this new query comes from (or,
    /// for loopback servers, into the namespace it comes from), for the same question.
    pub(super) fn find_parent(&self, q: &QKey, from: IpAddr, o: &Observation) -> Option<u64> {
        self.legs
            .open_candidates(q)
            .iter()
            .rev()
            .filter(|c| o.ts_ns >= c.first_ts && o.ts_ns - c.first_ts <= self.cfg.forward_window_ns)
            .filter_map(|c| self.legs.get(&c.id))
            .filter(|l| l.response.is_none() && !l.timed_out)
            .find(|l| {
                let backend_ip = l.backend.ip();
                let server_ip = l.server.ip();
                // A forwarder sends from the address it was asked on, from its loopback, or
                // (a loopback server) from any address of the namespace it runs in.
                let from_server = backend_ip == from
                    || server_ip == from
                    || ((backend_ip.is_loopback() || from.is_loopback())
                        && l.delivered_ns == o.netns)
                    || Self::asked_again_from(l, o);
                from_server && (!Self::peer_client(l, from, &o.netns) || Self::pod_proxy_asks(l, o))
            })
            .map(|l| l.id)
    }

    /// A forwarder whose own query leaves with another address than the one it was asked on
    /// (a node cache asking CoreDNS from the node's address, a pod asked over IPv6 asking
    /// over IPv4): `l`'s query was last seen coming into a namespace, so a socket there got
    /// it, and this query is first seen leaving that same namespace. A query only passing
    /// through the namespace (the node between a pod and a DNAT'd Service) is seen leaving
    /// it within microseconds, and then no longer counts as delivered there.
    pub(super) fn asked_again_from(l: &Leg, o: &Observation) -> bool {
        l.delivered_at.dir == Direction::Ingress
            && o.at.dir == Direction::Egress
            && l.delivered_at.netns == o.at.netns
    }

    /// Could a new query from `from` (seen in namespace `ns`) just as well come from a
    /// second client beside `l`'s as from `l`'s server? It does when it comes from the host
    /// (on loopback: the namespace) of `l`'s client and `l` is a client's own query: two
    /// clients of one host, or a client's retry, asking a server is no forward, and a
    /// question can only re-enter a server as a query of a forwarder's own socket.
    pub(super) fn peer_client(l: &Leg, from: IpAddr, ns: &str) -> bool {
        l.parent.is_none()
            && l.client.ip() == from
            && (!from.is_loopback() || *l.client_netns == *ns)
    }

    /// An earlier root attempt of the same client and question that this one repeats:
    /// after no answer (retry) or a truncated UDP answer (TCP fallback). Only the client's
    /// latest query of that question counts, and only when it went unanswered from the same
    /// socket, or for a while: concurrent or later answered queries of the same name from
    /// other sockets are transactions of their own.
    pub(super) fn find_previous_attempt(
        &self,
        q: &QKey,
        o: &Observation,
        client: SocketAddr,
    ) -> Option<(u64, LegRole)> {
        let retry_min_ns = self.cfg.retry_min_ns;
        const MAX_ATTEMPTS: usize = 8;
        let window = self.cfg.timeout_ns + self.cfg.retry_grace_ns;
        // The latest in the window from the client's namespace (of equal times, the one
        // listed last): newest first, a leg looked up only if it would be the latest.
        let mut latest: Option<&Leg> = None;
        for c in self.legs.root_candidates(client.ip(), q).iter().rev() {
            let in_window = o.ts_ns >= c.first_ts && o.ts_ns - c.first_ts <= window;
            if !in_window || latest.is_some_and(|l| c.first_ts <= l.first_ts) {
                continue;
            }
            if let Some(l) = self.legs.get(&c.id).filter(|l| l.client_netns == o.netns) {
                latest = Some(l);
            }
        }
        let latest = latest?;
        // A transaction with all the legs it may keep takes no more attempts either: this one
        // begins a transaction of its own. (Left out instead, its answer would be an orphan
        // and the client's answered retry part of an unanswered transaction.)
        let legs = self.txs.get(&latest.tx).map(|t| t.legs.len()).unwrap_or(0);
        if legs >= MAX_ATTEMPTS.min(self.cfg.max_legs_per_transaction) {
            return None;
        }
        let role = match &latest.response {
            Some(r) if r.tc && o.proto == Proto::Tcp => LegRole::TcpFallback,
            Some(_) => return None,
            None if latest.client == client || o.ts_ns - latest.first_ts >= retry_min_ns => {
                LegRole::Retry
            }
            None => return None,
        };
        Some((latest.tx, role))
    }

    pub(super) fn on_drop(&mut self, d: DropObservation) {
        if d.benign {
            return;
        }
        let Some(msg) = &d.msg else {
            self.stats.drops_unmatched += 1;
            return;
        };
        let Some(q) = QKey::of(msg) else {
            self.stats.drops_unmatched += 1;
            return;
        };
        let client_port = match &d.ct {
            Some(ct) => ct.orig.src.port(),
            None if msg.qr => d.dst.port(),
            None => d.src.port(),
        };
        let key = LegKey {
            proto: d.proto,
            client_port,
            id: msg.id,
            q,
        };
        let Some(leg) = self.legs.by_key(&key).and_then(|id| self.legs.get_mut(&id)) else {
            self.stats.drops_unmatched += 1;
            if self.detect.keeps(&d) {
                self.detect.unmatched_drop(&d, &key.q);
            }
            return;
        };
        if leg.race.is_none() && self.detect.keeps(&d) {
            let backend = d.ct.as_ref().map(|ct| ct.reply.src).unwrap_or(leg.backend);
            leg.race = Some(DropEvidence {
                cpu: d.cpu,
                netns: d.netns_cookie,
                ts: d.ts_ns,
                backend,
                confirm_failed: d.confirm_failed,
            });
        }
        // A loss is no kernel drop: no packet of it is in the evidence.
        let fragment_drops_ns = if d.fragment.is_some() && d.reason != FRAGMENT_LOSS {
            vec![d.ts_ns]
        } else {
            Vec::new()
        };
        let mut drop = LegDrop {
            pod: Default::default(),
            ts_ns: d.ts_ns,
            netns: d.netns,
            ifname: d.ifname,
            reason: d.reason,
            location: d.location,
            response: msg.qr,
            fragment_drops_ns,
            fragments: d.fragment,
        };
        // Another fragment of an answer already dropped in the same namespace: each drop
        // that names it says all of what was lost (fragments 2 and 3 of 3, not one).
        if drop.fragments.is_some() {
            for kept in [leg.drop.as_mut(), leg.client_drop.as_mut()]
                .into_iter()
                .flatten()
            {
                merge_fragment_drop(kept, &mut drop);
            }
        }
        // The answer was at the client's interface and the client's own namespace dropped
        // it on the way to the socket (a closed socket, a rule, a full buffer).
        if msg.qr && d.netns_cookie == leg.client_point.netns && leg.reached_client() {
            if leg.client_drop_ts.len() < MAX_CLIENT_DROPS {
                leg.client_drop_ts.push(d.ts_ns);
            }
            if leg.client_drop.is_none() {
                leg.client_drop = Some(drop.clone());
            }
        }
        if leg.drop.is_none() {
            leg.drop = Some(drop);
            self.stats.drops_attached += 1;
        }
        let tx = leg.tx;
        self.touch(tx, d.ts_ns);
    }

    pub(super) fn touch(&mut self, tx: u64, ts: u64) {
        if let Some(t) = self.txs.get_mut(&tx) {
            t.last_activity = t.last_activity.max(ts);
            // An answer may finish it before the time it was to be looked at.
            let settled = t.last_activity + self.cfg.settle_ns;
            if settled < t.wake_at {
                self.wakes.remove(&(t.wake_at, tx));
                t.wake_at = settled;
                self.wakes.insert((settled, tx));
            }
        }
    }

    fn new_transaction(&mut self, id: u64, t: Transaction) {
        self.txs.insert(id, t);
        self.tx_order.push_back(id);
        self.sweep_tx_order();
    }

    /// Takes the ids of reported and evicted transactions out of `tx_order` once they are
    /// over half of it: after every change of either. Amortised O(1): each id is swept once.
    pub(super) fn sweep_tx_order(&mut self) {
        if self.tx_order.len() > 2 * self.txs.len() + 64 {
            let txs = &self.txs;
            self.tx_order.retain(|id| txs.contains_key(id));
        }
    }

    /// The open transaction with the lowest id (the oldest).
    fn oldest_transaction(&mut self) -> Option<u64> {
        while let Some(&id) = self.tx_order.front() {
            if self.txs.contains_key(&id) {
                return Some(id);
            }
            self.tx_order.pop_front();
        }
        None
    }

    pub(super) fn enforce_bounds(&mut self) {
        while self.legs.len() > self.cfg.max_legs || self.legs.bytes() > self.cfg.max_leg_bytes {
            let Some(oldest) = self.oldest_transaction() else {
                break;
            };
            if let Some(t) = self.txs.remove(&oldest) {
                self.wakes.remove(&(t.wake_at, t.id));
                self.stats.evicted_transactions += 1;
                for id in t.legs {
                    if self.remove_leg(id) {
                        self.stats.evicted_legs += 1;
                    }
                }
            }
            self.sweep_tx_order();
        }
    }

    pub(super) fn remove_leg(&mut self, id: u64) -> bool {
        self.take_leg(id).is_some()
    }

    /// Removes a leg and its index entries, and hands it back.
    pub(super) fn take_leg(&mut self, id: u64) -> Option<Box<Leg>> {
        let leg = self.legs.remove(id)?;
        self.hop_room = leg.hops.len().clamp(MIN_HOP_ROOM, MAX_HOP_ROOM);
        // Its timeout entry stays, passed over when due, until a sweep.
        let legs = &self.legs;
        self.timeouts
            .sweep(legs.len(), |id| legs.get(&id).is_some());
        Some(leg)
    }
}

/// `new` and `kept` are drops of fragments of one datagram in one namespace and of the same
/// kind (kernel drops, or losses): each takes the other's part and drop times.
fn merge_fragment_drop(kept: &mut LegDrop, new: &mut LegDrop) {
    let (Some(k), Some(n)) = (kept.fragments.as_mut(), new.fragments.as_mut()) else {
        return;
    };
    let same_kind = (kept.reason == FRAGMENT_LOSS) == (new.reason == FRAGMENT_LOSS);
    if k.ip_id != n.ip_id || kept.netns != new.netns || !same_kind || kept.response != new.response
    {
        return;
    }
    k.merge(n);
    n.clone_from(k);
    for &ts in &new.fragment_drops_ns {
        if !kept.fragment_drops_ns.contains(&ts) && kept.fragment_drops_ns.len() < MAX_CLIENT_DROPS
        {
            kept.fragment_drops_ns.push(ts);
        }
    }
    new.fragment_drops_ns.clone_from(&kept.fragment_drops_ns);
}

pub(super) fn via_for(
    leg: &Leg,
    seen_client: SocketAddr,
    seen_server: SocketAddr,
    by_ct: bool,
) -> Via {
    if seen_client == leg.client && seen_server == leg.server {
        return Via::Same;
    }
    if by_ct {
        Via::Conntrack
    } else {
        Via::Fallback
    }
}
