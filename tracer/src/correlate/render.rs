//! Deciding and reporting: when a transaction is done, its record, and what the detectors
//! are shown of it.
use super::*;

impl<D: Detector> Correlator<D> {
    /// Correlates what the reorder window has released and reports finished transactions.
    /// `now_ns` is in the observations' clock (live: boot time; offline: the file's time).
    pub(crate) fn tick(
        &mut self,
        now_ns: u64,
        out: &mut Vec<impl From<CorrelateReport<D::Report>>>,
    ) {
        let release = now_ns.saturating_sub(self.cfg.reorder_ns);
        while let Some(o) = self.pending.pop_until(release) {
            self.watermark = self.watermark.max(o.ts());
            self.process(o);
        }
        // Hops added to legs since the last new leg count too; and a storm's room goes back.
        self.enforce_bounds();
        self.legs.shrink();
        self.finish(now_ns, None, out);
    }

    /// End of input: correlate everything, then report the open transactions as they
    /// stand, the oldest first and at most `max` a call, so that a stop with a full table
    /// does not hold every record at once. True while some are left: call it again.
    pub(crate) fn flush(
        &mut self,
        now_ns: u64,
        max: usize,
        out: &mut Vec<impl From<CorrelateReport<D::Report>>>,
    ) -> bool {
        while let Some(o) = self.pending.pop_first() {
            self.watermark = self.watermark.max(o.ts());
            self.process(o);
        }
        self.finish(now_ns, Some(max.max(1)), out);
        !self.txs.is_empty()
    }

    /// Reports what is decided at `now`; `all`: the input ended, and up to this many open
    /// transactions are reported whatever their state.
    pub(super) fn finish(
        &mut self,
        now: u64,
        all: Option<usize>,
        out: &mut Vec<impl From<CorrelateReport<D::Report>>>,
    ) {
        self.detect
            .tick(now, all.is_some(), &mut self.reports, &mut self.controls);
        out.extend(
            self.reports
                .drain(..)
                .map(|r| CorrelateReport::Detected(r).into()),
        );
        // Queries whose time is up: each leg once, when its timeout passes.
        while let Some(id) = self.timeouts.pop_due(now) {
            self.legs.time_out(id);
        }
        let mut done: Vec<u64> = Vec::new();
        if let Some(max) = all {
            for leg in self.legs.values_mut() {
                if leg.response.is_none() && !leg.timed_out {
                    leg.cut_short = true;
                }
            }
            // `tx_order` holds every open transaction, in id order: the oldest `max`.
            while done.len() < max {
                let Some(id) = self.tx_order.pop_front() else {
                    break;
                };
                if let Some(t) = self.txs.get(&id) {
                    self.wakes.remove(&(t.wake_at, id));
                    done.push(id);
                }
            }
            if done.len() < max && !self.txs.is_empty() && self.tx_order.is_empty() {
                // Not expected (every transaction is queued when it is made), but the end
                // must never loop without reporting: the rest, the oldest first.
                let mut rest: Vec<u64> = self.txs.keys().copied().collect();
                rest.sort_unstable();
                rest.truncate(max - done.len());
                for id in rest {
                    if let Some(t) = self.txs.get(&id) {
                        self.wakes.remove(&(t.wake_at, id));
                    }
                    done.push(id);
                }
            }
        } else {
            // Only transactions due to be looked at: each a bounded number of times.
            while let Some(&(at, id)) = self.wakes.first() {
                if at > now {
                    break;
                }
                self.wakes.pop_first();
                let Some(t) = self.txs.get(&id) else { continue };
                if t.wake_at != at {
                    continue;
                }
                if self.tx_done(t, now) {
                    done.push(id);
                } else {
                    let next = self.next_look(t, now);
                    if let Some(t) = self.txs.get_mut(&id) {
                        t.wake_at = next;
                    }
                    self.wakes.insert((next, id));
                }
            }
            done.sort_unstable();
        }
        for id in done {
            let Some(t) = self.txs.remove(&id) else {
                continue;
            };
            let rendered = if self.race_candidate(&t) {
                // The attempts are shown with the legs still indexed (a sibling may be one
                // of them): render copies of them first.
                let legs = t
                    .legs
                    .iter()
                    .filter_map(|id| self.legs.get(id))
                    .map(|l| Box::new(l.clone()))
                    .collect();
                let rendered = self.render(&t, legs);
                let (attempts, retry_ns) = self.attempts(&t);
                self.detect.decided(&Decided {
                    record: rendered.as_ref(),
                    attempts: &attempts,
                    retry_ns,
                });
                for &leg in &t.legs {
                    if let Some(l) = self.take_leg(leg).filter(|l| l.parent.is_none()) {
                        self.remember_query((l.client, l.first_ts, l.key.id, l.key.q, l.backend));
                    }
                }
                rendered
            } else {
                // The legs leave the index and their record takes what they hold.
                let mut legs = Vec::with_capacity(t.legs.len());
                for &leg in &t.legs {
                    if let Some(l) = self.take_leg(leg) {
                        if l.parent.is_none() {
                            let q = l.key.q.clone();
                            self.remember_query((l.client, l.first_ts, l.key.id, q, l.backend));
                        }
                        legs.push(l);
                    }
                }
                let rendered = self.render(&t, legs);
                self.detect.decided(&Decided {
                    record: rendered.as_ref(),
                    attempts: &[],
                    retry_ns: None,
                });
                rendered
            };
            if let Some(rec) = rendered {
                if self.cfg.node_netns.is_some() {
                    self.learn_cache_upstreams(&rec);
                }
                out.push(CorrelateReport::Transaction(rec).into());
                self.stats.transactions += 1;
            }
        }
        // The reported ones' ids in `tx_order` go once they are most of it.
        self.sweep_tx_order();
        self.detect.settle(&mut self.reports);
        out.extend(
            self.reports
                .drain(..)
                .map(|r| CorrelateReport::Detected(r).into()),
        );
    }

    /// The client's attempts of a finished transaction whose legs are still indexed, with
    /// the sibling of each (the other query of an A/AAAA pair), and its first retry.
    pub(super) fn attempts(&self, t: &Transaction) -> (Vec<Attempt>, Option<u64>) {
        let pair_window_ns = self.cfg.pair_window_ns;
        let roots = t
            .legs
            .iter()
            .filter_map(|id| self.legs.get(id))
            .filter(|l| l.parent.is_none());
        let retry = roots
            .clone()
            .filter(|l| l.role == LegRole::Retry)
            .map(|l| l.first_ts.saturating_sub(t.first_ts))
            .min();
        let attempts = roots
            .map(|l| Attempt {
                client: l.client,
                client_netns: l.client_netns.clone(),
                dns_id: l.key.id,
                question: l.key.q.clone(),
                first_ts: l.first_ts,
                backend: l.backend,
                drop: l.drop.clone(),
                answered: l.response.is_some(),
                retransmits: l.retransmits,
                evidence: l.race,
                sibling: self.sibling_of(l, pair_window_ns),
            })
            .collect();
        (attempts, retry)
    }

    /// Is there anything to show the detectors of `t`'s attempts ([`Correlator::attempts`]):
    /// drop evidence, or an unanswered client query without a drop?
    pub(super) fn race_candidate(&self, t: &Transaction) -> bool {
        t.legs.iter().filter_map(|id| self.legs.get(id)).any(|l| {
            l.race.is_some() || (l.parent.is_none() && l.response.is_none() && l.drop.is_none())
        })
    }

    /// The earliest time a transaction that is not done yet could be, unless something new
    /// happens to it (a new hop touches it, which looks at it sooner if need be).
    pub(super) fn next_look(&self, t: &Transaction, now: u64) -> u64 {
        let mut next = t.last_activity + self.cfg.settle_ns;
        let mut last_root: Option<&Leg> = None;
        for l in t.legs.iter().filter_map(|id| self.legs.get(id)) {
            if !l.closed() {
                next = next.max(l.first_ts + self.cfg.timeout_ns);
            }
            if let Some(at) = l.race.and_then(|e| self.detect.holds(&e, now)) {
                next = next.max(at);
            }
            if l.parent.is_none() && last_root.is_none_or(|r| l.first_ts >= r.first_ts) {
                last_root = Some(l);
            }
        }
        if let Some(r) = last_root.filter(|r| r.response.is_none()) {
            next = next.max(r.first_ts + self.cfg.timeout_ns + self.cfg.retry_grace_ns);
        }
        if let Some(until) =
            last_root.and_then(|l| l.awaiting_answer_until(self.cfg.answer_grace_ns))
        {
            next = next.max(until);
        }
        next.max(now + 1)
    }

    pub(super) fn tx_done(&self, t: &Transaction, now: u64) -> bool {
        if now < t.last_activity + self.cfg.settle_ns {
            return false;
        }
        let legs: Vec<&Leg> = t.legs.iter().filter_map(|id| self.legs.get(id)).collect();
        if !legs.iter().all(|l| l.closed()) {
            return false;
        }
        // A detector may wait for more evidence (a race drop: the conntrack counters
        // sampled after it).
        let held = legs
            .iter()
            .any(|l| l.race.is_some_and(|e| self.detect.holds(&e, now).is_some()));
        if held {
            return false;
        }
        if legs
            .iter()
            .filter_map(|l| l.awaiting_answer_until(self.cfg.answer_grace_ns))
            .any(|until| now < until)
        {
            return false;
        }
        // The last root attempt timed out: its retry may still come.
        let last_root = legs
            .iter()
            .filter(|l| l.parent.is_none())
            .max_by_key(|l| l.first_ts);
        match last_root {
            Some(l) if l.timed_out => {
                now >= l.first_ts + self.cfg.timeout_ns + self.cfg.retry_grace_ns
            }
            _ => true,
        }
    }

    /// Whether `l` was served by a DNS cache in the node's own namespace (its query was
    /// last seen coming into that namespace: a socket there took it), and hit or missed;
    /// or is a client's query to where that cache sends its misses, around it.
    fn node_cache_of(&self, l: &Leg, has_child: bool) -> Option<NodeCache> {
        let node = self.cfg.node_netns?;
        let into_node =
            l.delivered_at.netns == node && l.delivered_at.dir == crate::event::Direction::Ingress;
        if into_node {
            return match (has_child, &l.response) {
                (true, _) => Some(NodeCache::Miss),
                (false, Some(_)) => Some(NodeCache::Hit),
                (false, None) => None,
            };
        }
        let around = l.parent.is_none()
            && l.client_point.netns != node
            && (self.cache_upstreams.contains(&l.backend.ip())
                || self.cache_upstreams.contains(&l.server.ip()));
        around.then_some(NodeCache::Bypass)
    }

    /// Remembers where the node cache of a finished transaction sent its misses.
    pub(super) fn learn_cache_upstreams(&mut self, t: &TransactionRecord) {
        for l in &t.legs {
            let from_cache = l
                .parent
                .and_then(|p| t.legs.get(p))
                .is_some_and(|p| p.node_cache == Some(NodeCache::Miss));
            if from_cache {
                for ip in [l.server.ip(), l.backend.ip()] {
                    if self.cache_upstreams.len() < MAX_CACHE_UPSTREAMS {
                        self.cache_upstreams.insert(ip);
                    }
                }
            }
        }
    }

    /// The record of a finished transaction, from its legs (in the transaction's order),
    /// which it takes apart: names and answers move into the record rather than copied.
    #[expect(
        clippy::vec_box,
        reason = "the leg table's boxes, taken as they are: a Leg is a few hundred bytes"
    )]
    pub(super) fn render(
        &self,
        t: &Transaction,
        mut legs: Vec<Box<Leg>>,
    ) -> Option<TransactionRecord> {
        let root = legs.first()?;

        // Outcome of the whole transaction: the answer the client got, at its first point.
        let roots: Vec<&Leg> = legs
            .iter()
            .map(|l| &**l)
            .filter(|l| l.parent.is_none())
            .collect();
        // The last attempt whose answer the client's socket could get; else the last one
        // answered at all (the answer may have been lost on the way).
        let full_answer = |l: &&&Leg| l.response.as_ref().is_some_and(|r| !r.tc);
        let final_root = roots
            .iter()
            .rev()
            .filter(full_answer)
            .find(|l| l.delivered_at().is_some())
            .or_else(|| roots.iter().rev().find(full_answer))
            .or(roots.last());
        let final_root = *final_root?;
        let retried = roots.iter().any(|l| l.role == LegRole::Retry) || root.retransmits > 0;
        let tcp = roots.iter().any(|l| l.role == LegRole::TcpFallback);
        let delivered = final_root.delivered_at();
        let end_ts = delivered.or_else(|| {
            // Not delivered: when the answer came anyway (where it was first seen).
            final_root.response.as_ref().map(|r| {
                final_root
                    .hops
                    .iter()
                    .filter(|h| h.qr && same_iface(h.at, final_root.client_point))
                    .map(|h| h.ts_ns)
                    .min()
                    .unwrap_or(r.ts_ns)
            })
        });
        // An answer stamped before its query (clocks of merged captures, an event handed
        // over after the reorder window) was still got: the outcome is decided from when it
        // came (at 0 at the earliest), but its latency is unknown, not 0, as its leg's is.
        let answer_ns = end_ts.map(|e| e.saturating_sub(t.first_ts));
        let latency = end_ts.and_then(|e| e.checked_sub(t.first_ts));
        let dropped = legs.iter().find_map(|l| l.drop.as_ref());
        let undelivered = final_root.undelivered_drop();
        let not_delivered = undelivered.is_some();
        let (outcome, summary) = match (&final_root.response, answer_ns) {
            (Some(_), Some(answer_ns)) if undelivered.is_some_and(socket_closed) => {
                let d = undelivered.map(|d| (d.reason.clone(), d.location.clone()));
                let (reason, location) = d.unwrap_or_default();
                // The client's own timeout shows where it tried again: first query → next
                // attempt.
                let gave_up_ns = roots
                    .iter()
                    .map(|l| l.first_ts)
                    .find(|&ts| ts > t.first_ts)
                    .map(|ts| ts - t.first_ts);
                (
                    Outcome::Late,
                    Summary::Late {
                        answer_ns,
                        gave_up_ns,
                        reason,
                        location,
                        retried,
                    },
                )
            }
            (Some(_), Some(_)) if undelivered.is_some() => {
                let d = undelivered.map(|d| (d.reason.clone(), d.location.clone()));
                let (reason, location) = d.unwrap_or_default();
                (
                    Outcome::Dropped,
                    Summary::Dropped {
                        reason,
                        location,
                        retried,
                        at_client: true,
                        part: undelivered.and_then(|d| d.fragments.clone()),
                    },
                )
            }
            (Some(_), Some(_)) if !final_root.answer_lost() => {
                let first_timed_out = roots.first().is_some_and(|l| {
                    l.timed_out || l.response.is_none() || l.delivered_at().is_none()
                });
                let how = if tcp {
                    Answered::OverTcp
                } else if retried && first_timed_out {
                    Answered::AfterTimeout {
                        timeout_ns: self.cfg.timeout_ns,
                        drop: dropped.map(|d| (d.reason.clone(), d.location.clone())),
                    }
                } else {
                    Answered::Directly
                };
                (Outcome::Answered, Summary::Answered(how))
            }
            _ => match final_root
                .drop
                .as_ref()
                .filter(|d| d.reason == FRAGMENT_LOSS)
                .or(dropped)
            {
                Some(d) if d.reason == FRAGMENT_LOSS => (
                    Outcome::Dropped,
                    Summary::AnswerLost {
                        location: d.location.clone(),
                        netns: d.netns.to_string(),
                        ifname: d.ifname.to_string(),
                        retried,
                        part: d.fragments.clone(),
                    },
                ),
                Some(d) => (
                    Outcome::Dropped,
                    Summary::Dropped {
                        reason: d.reason.clone(),
                        location: d.location.clone(),
                        retried,
                        at_client: false,
                        part: d.fragments.clone().filter(|_| d.response),
                    },
                ),
                None if final_root.cut_short => (Outcome::Pending, Summary::Pending),
                None => (
                    Outcome::Unanswered,
                    Summary::Unanswered {
                        timeout_ns: self.cfg.timeout_ns,
                        retries: retried
                            .then(|| roots.len().saturating_sub(1).max(root.retransmits as usize)),
                    },
                ),
            },
        };
        let rcode = final_root.response.as_ref().map(|r| r.rcode.clone());
        let answers = final_root
            .response
            .as_ref()
            .map(|r| r.answers.clone())
            .unwrap_or_default();
        let answer_cut = final_root.response.as_ref().and_then(|r| r.cut);
        let client = root.client;
        // Each leg's index by its id (a transaction of one leg, the usual one, needs no
        // table of them).
        let (root_id, one_leg) = (root.id, legs.len() == 1);
        let ids: Vec<u64> = match legs.len() {
            1 => Vec::new(),
            _ => legs.iter().map(|l| l.id).collect(),
        };
        let parents: Vec<u64> = legs.iter().filter_map(|l| l.parent).collect();
        let index_of = |id: u64| match one_leg {
            true => (id == root_id).then_some(0),
            false => ids.iter().position(|&l| l == id),
        };
        // Each leg's parent as an index (a loop's cycle is walked up them), when a leg
        // closed one.
        let legs_parent: Vec<Option<usize>> = if legs.iter().any(|l| l.closes_cycle.is_some()) {
            legs.iter().map(|l| l.parent.and_then(index_of)).collect()
        } else {
            Vec::new()
        };
        let (client_netns, q) = match legs.first_mut() {
            Some(root) => (std::mem::take(&mut root.client_netns), root.key.q.clone()),
            None => return None,
        };

        let leg_records: Vec<LegRecord> = legs
            .into_iter()
            .map(|mut l| {
                l.hops.sort_by_key(|h| h.ts_ns);
                let hops = &l.hops;
                let join = if hops.iter().any(|h| h.via == Via::Conntrack) {
                    Join::Conntrack
                } else if hops.iter().any(|h| h.via == Via::Fallback) {
                    Join::Fallback
                } else {
                    Join::SameTuple
                };
                // A query leaves an interface in one direction and its answer comes back
                // through the same interface in the other.
                let query_at = |at: ObservationPoint| {
                    hops.iter()
                        .filter(|h| !h.qr && same_iface(h.at, at))
                        .map(|h| h.ts_ns)
                        .min()
                };
                let node_cache = self.node_cache_of(&l, parents.contains(&l.id));
                let pod_proxy = Self::pod_proxy_of(&l, parents.contains(&l.id));
                // The drop that kept the answer from the socket says more than an earlier
                // one (a dropped first copy of the query, say).
                let undelivered = l.undelivered_drop().cloned();
                let outcome = match (&l.response, &l.drop) {
                    _ if l.answer_lost() => LegOutcome::Dropped,
                    _ if undelivered.as_ref().is_some_and(socket_closed) => LegOutcome::Late,
                    _ if undelivered.is_some() => LegOutcome::Dropped,
                    (Some(r), _) if r.tc => LegOutcome::Truncated,
                    (Some(_), _) => LegOutcome::Answered,
                    (None, Some(_)) => LegOutcome::Dropped,
                    (None, None) if l.cut_short => LegOutcome::Pending,
                    (None, None) => LegOutcome::Unanswered,
                };
                let latency = l.response.as_ref().and_then(|r| {
                    let back_at_client = hops
                        .iter()
                        .filter(|h| h.qr && same_iface(h.at, l.client_point))
                        .map(|h| h.ts_ns)
                        .min()
                        .unwrap_or(r.ts_ns);
                    back_at_client.checked_sub(l.first_ts)
                });
                let hop_records: Vec<HopRecord> = hops
                    .iter()
                    .map(|h| HopRecord {
                        pod: Default::default(),
                        ts_ns: h.ts_ns,
                        netns: h.netns.clone(),
                        ifname: h.ifname.clone(),
                        dir: h.at.dir,
                        src: h.src,
                        dst: h.dst,
                        dns_id: h.dns_id,
                        qr: h.qr,
                        latency_ns: if h.qr {
                            query_at(h.at).and_then(|q| h.ts_ns.checked_sub(q))
                        } else {
                            None
                        },
                        tunnel: h.tunnel.clone(),
                    })
                    .collect();
                let (rcode, answers, answer_cut) = match l.response {
                    Some(r) => (Some(r.rcode), r.answers, r.cut),
                    None => (None, Vec::new(), None),
                };
                LegRecord {
                    id: l.id,
                    parent: l.parent.and_then(index_of),
                    role: l.role,
                    proto: l.key.proto,
                    client: l.client,
                    server: l.server,
                    backend: l.backend,
                    dns_id: l.key.id,
                    join,
                    outcome,
                    rcode,
                    answers,
                    answer_cut,
                    latency_ns: latency,
                    retransmits: l.retransmits,
                    drop: undelivered.or(l.drop),
                    node_cache,
                    pod_proxy,
                    hops: hop_records,
                    // What `races_of` reports as a race drop.
                    race_drop: l.parent.is_none() && l.race.is_some(),
                    closes_loop: l.closes_cycle.map(|(len, hop_count)| {
                        // This leg and its parents, `len` of them, first to last.
                        let mut cycle = Vec::with_capacity(len as usize);
                        let mut at = index_of(l.id);
                        while let Some(k) = at.filter(|_| cycle.len() < len as usize) {
                            cycle.push(k);
                            at = legs_parent.get(k).copied().flatten();
                        }
                        cycle.reverse();
                        Box::new(LegLoop {
                            cycle,
                            hop_count: hop_count as usize,
                        })
                    }),
                    node: None,
                }
            })
            .collect();

        Some(TransactionRecord {
            evidence: None,
            nodes: Vec::new(),
            pod: Default::default(),
            id: t.id,
            lookup: LookupRef {
                id: t.lookup,
                step: t.lookup_step,
            },
            ts_ns: t.first_ts,
            wall_ns: self.clock.epoch_ns(t.first_ts),
            client,
            client_netns,
            question: q,
            outcome,
            rcode,
            answers,
            answer_cut,
            // What the client's socket got, when: nothing, when the answer never reached it.
            latency_ns: if not_delivered { None } else { latency },
            summary,
            legs: leg_records,
        })
    }
}
