//! A DNS proxy inside the client's pod (Istio's DNS capture, a sidecar cache): the pod's
//! `nat OUTPUT` redirects its port-53 traffic to a local port (`-j REDIRECT --to-ports
//! 15053`), except the proxy's own (`-m owner ! --uid-owner`), and the proxy answers from
//! its cache or asks cluster DNS itself, from the same pod. The client's query is then a
//! redirected leg (what it asked: the ClusterIP; where it went: the proxy's socket), and
//! the proxy's own query its child — which the rule that a second query from the client's
//! own address is a second client, not a forward ([`Correlator::peer_client`]), would
//! otherwise keep apart.
use super::*;
use crate::event::Direction;

/// `lo` has this index in every network namespace (`LOOPBACK_IFINDEX`,
/// include/net/net_namespace.h).
const LOOPBACK_IFINDEX: u32 = 1;

/// A query from an address it was routed by (not a loopback one) to a loopback one: what
/// `nat OUTPUT`'s REDIRECT makes of a query to another address.
fn redirect_shaped(from: SocketAddr, to: SocketAddr) -> bool {
    to.ip().is_loopback() && !from.ip().is_loopback()
}

impl<D: Detector> Correlator<D> {
    /// Whether a query seen as `client` → `server` was redirected to a local port in its own
    /// namespace, and what it asked: it has the address it was routed by (not a loopback
    /// one) and a loopback destination, on `lo` — what `nat OUTPUT`'s REDIRECT (to
    /// 127.0.0.1 or ::1) makes of a query to a ClusterIP. The address asked is conntrack's
    /// original destination when conntrack knows the flow; otherwise the redirect's target
    /// until the answer, un-NATed, says ([`Correlator::answered_as`]).
    pub(super) fn redirect_of(
        &self,
        o: &Observation,
        client: SocketAddr,
        server: SocketAddr,
    ) -> Option<SocketAddr> {
        if o.msg.qr || o.at.ifindex != LOOPBACK_IFINDEX || !redirect_shaped(client, server) {
            return None;
        }
        let asked = self
            .ct
            .lookup(o.proto, o.src, o.dst)
            .filter(|m| !m.reply_dir && m.orig.src == client && m.orig.dst != server)
            .map_or(server, |m| m.orig.dst);
        Some(asked)
    }

    /// A new leg `id` of question `q`, first seen as `o`: marked redirected (see
    /// [`Leg::redirected`]) if it was; if it is a pod proxy's query asked for one redirected
    /// leg, the others of the question waiting for the proxy in that namespace wait for it
    /// too (the proxy asks once for several clients); and a redirected leg that comes while
    /// the proxy's query for it is out waits for that one. At most [`index::MAX_CANDIDATES`]
    /// legs looked at.
    pub(super) fn pod_proxy_leg(&mut self, id: u64, q: &QKey, o: &Observation) {
        let Some(leg) = self.legs.get(&id) else {
            return;
        };
        let (client, server) = (leg.client, leg.server);
        let parent = leg.parent;
        if let Some(asked) = self.redirect_of(o, client, server) {
            let shared = self.proxy_query_out(q, o.at.netns, id);
            if let Some(leg) = self.legs.get_mut(&id) {
                leg.redirected = true;
                leg.server = asked;
                leg.proxy_shared = shared;
            }
            return;
        }
        let Some(p) = parent
            .and_then(|p| self.legs.get(&p))
            .filter(|p| p.redirected)
        else {
            return;
        };
        let (p_id, ns, first) = (p.id, p.delivered_at.netns, p.first_ts);
        let window = self.cfg.forward_window_ns;
        let waiting: Vec<u64> = self
            .legs
            .open_candidates(q)
            .iter()
            .filter(|c| c.id != p_id && c.first_ts.abs_diff(first) <= window)
            .filter_map(|c| self.legs.get(&c.id))
            .filter(|l| l.redirected && l.response.is_none() && l.delivered_at.netns == ns)
            .map(|l| l.id)
            .collect();
        for w in waiting {
            if let Some(l) = self.legs.get_mut(&w) {
                l.proxy_shared = true;
            }
        }
    }

    /// A pod proxy's query for `q` out from namespace `ns` (a child of a redirected leg
    /// delivered there), not yet answered: a redirected leg coming now waits for it.
    fn proxy_query_out(&self, q: &QKey, ns: u64, new: u64) -> bool {
        self.legs
            .open_candidates(q)
            .iter()
            .filter(|c| c.id != new)
            .filter_map(|c| self.legs.get(&c.id))
            .filter(|l| l.response.is_none() && !l.timed_out)
            .filter_map(|l| l.parent.and_then(|p| self.legs.get(&p)))
            .any(|p| p.redirected && p.delivered_at.netns == ns)
    }

    /// Is the new query `o` the pod proxy's own, asked for `l`'s question? `l` was
    /// redirected to the proxy and delivered in its namespace (last seen coming in there);
    /// `o` leaves that namespace and was not redirected itself: it goes elsewhere than `l`
    /// went (another client of the pod, or `l`'s client retrying, would be redirected to
    /// the proxy as `l` was; only the proxy's own traffic is exempt from the rule).
    pub(super) fn pod_proxy_asks(l: &Leg, o: &Observation) -> bool {
        l.redirected
            && l.delivered_at.dir == Direction::Ingress
            && o.at.dir == Direction::Egress
            && l.delivered_at.netns == o.at.netns
            && o.dst != l.backend
            && !redirect_shaped(o.src, o.dst)
    }

    /// An answer to a redirected leg, seen as `server` → `client`: un-NATed on its way back
    /// (REDIRECT's reverse at `POSTROUTING`, before any TC hook), it comes from the address
    /// the client asked, which conntrack may not have said when the query came.
    pub(super) fn answered_as(leg: &mut Leg, client: SocketAddr, server: SocketAddr) {
        if leg.redirected && leg.server == leg.backend && client == leg.client {
            leg.server = server;
        }
    }

    /// Whether `l` was redirected to a proxy in its client's pod, and whether the proxy hit
    /// (answered without a query of its own) or missed (`has_child`: `l` has a child leg).
    pub(super) fn pod_proxy_of(l: &Leg, has_child: bool) -> Option<PodProxy> {
        if !l.redirected {
            return None;
        }
        match (has_child || l.proxy_shared, &l.response) {
            (true, _) => Some(PodProxy::Miss),
            (false, Some(_)) => Some(PodProxy::Hit),
            (false, None) => None,
        }
    }
}
