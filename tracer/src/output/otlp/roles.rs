//! Which span is which: a transaction's trace ids, which node writes its root and client
//! spans (the client's), where a leg's query was delivered (its server span), and the role
//! each span's id is made from (docs/otlp.md, "Ids").
use super::ids::{self, IdKey, QueryIdentity, Role};
use crate::{
    event::Direction,
    output::record::{HopRecord, LegRecord, TransactionRecord},
};

/// A transaction's ids: its trace and its epoch-free query key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TraceIds {
    pub trace: [u8; 16],
    pub query_key: [u8; 16],
}

/// The leg that carried the client's first query.
pub(super) fn first_leg(tx: &TransactionRecord) -> Option<&LegRecord> {
    tx.legs.iter().find(|l| l.parent.is_none())
}

fn identity(tx: &TransactionRecord) -> QueryIdentity<'_> {
    let first = first_leg(tx);
    QueryIdentity {
        client: tx.client,
        proto: first.map_or(tracer_common::proto::IPPROTO_UDP, |l| l.proto.number()),
        dns_id: first.map_or(0, |l| l.dns_id),
        name: &tx.question.name,
        qtype: tx.question.qtype,
        class: tx.question.class,
    }
}

/// The trace a transaction belongs to (cheap: two SipHash runs over some 60 bytes).
pub fn trace_ids(key: &IdKey, tx: &TransactionRecord) -> TraceIds {
    let query_key = ids::query_key(key, &identity(tx));
    TraceIds {
        trace: ids::trace_id(key, &query_key, ids::epoch(tx.wall_ns)),
        query_key,
    }
}

/// Whether the client is on this node (the root and the client spans are this node's),
/// rather than on another one (this node has only the served half; the root and the client
/// span are the other node's, and its server span names that client span as parent).
///
/// The query came from another node when its first hop here is an arrival (ingress) that
/// is not from a pod's veth, already addressed to the backend (a Service's DNAT is done on
/// the client's node), from a client no pod of this node is known as. Anything else — seen
/// leaving a namespace, arriving from a pod's veth, still addressed to a Service, a known
/// client pod, a capture with no direction — is a client of this node.
///
/// The agent's metrics count by the same rule (docs/metrics.md, `leg="served"`), so that a
/// question is one client question on the client's node only.
pub fn client_is_local(tx: &TransactionRecord) -> bool {
    let Some(leg) = first_leg(tx) else {
        return true;
    };
    let Some(h) = leg.hops.first() else {
        return true;
    };
    h.dir != Direction::Ingress
        || h.pod_ref().pod_veth
        || h.dst != leg.backend
        || tx.pod.pod.is_some()
}

/// The role of leg `n`'s CLIENT span: [`Role::Query`], or [`Role::QueryAgain`] when an
/// earlier leg of `tx` was sent from the same socket with the same DNS id.
pub(super) fn query_role(tx: &TransactionRecord, n: usize, l: &LegRecord) -> Role {
    let same = |o: &&LegRecord| o.client == l.client && o.proto == l.proto && o.dns_id == l.dns_id;
    let repeat = tx.legs.iter().take(n).filter(same).count();
    match u16::try_from(repeat) {
        Ok(0) => first_query(l),
        r => Role::QueryAgain {
            client: l.client,
            proto: l.proto.number(),
            dns_id: l.dns_id,
            repeat: r.unwrap_or(u16::MAX),
        },
    }
}

/// The role of the first query sent from leg `l`'s socket with its DNS id: the CLIENT
/// span a serving node names as its parent.
pub(super) fn first_query(l: &LegRecord) -> Role {
    Role::Query {
        client: l.client,
        proto: l.proto.number(),
        dns_id: l.dns_id,
    }
}

/// The role of leg `n`'s SERVER span (it has one: [`delivery`]), counting the earlier legs
/// of `tx` served at the same place from the same socket with the same DNS id (a UDP
/// resend after a truncated answer is such a leg).
pub(super) fn serve_role(tx: &TransactionRecord, n: usize, l: &LegRecord) -> Role {
    let same = |o: &&LegRecord| {
        o.client == l.client
            && o.backend == l.backend
            && o.proto == l.proto
            && o.dns_id == l.dns_id
            && delivery(o).is_some()
    };
    let repeat = tx.legs.iter().take(n).filter(same).count();
    Role::Serve {
        client: l.client,
        server: l.backend,
        proto: l.proto.number(),
        dns_id: l.dns_id,
        repeat: u16::try_from(repeat).unwrap_or(u16::MAX),
    }
}

/// The hop where a leg's query was delivered to its server on this node: the leg's last
/// query hop, addressed to the backend (after DNAT), arriving in the server's namespace
/// (ingress), or handed to the server pod's veth (egress on the node's end, when only the
/// node's namespace is traced). A query whose last hop here leaves the node otherwise has
/// no server span on this node.
pub(super) fn delivery(l: &LegRecord) -> Option<&HopRecord> {
    l.hops
        .iter()
        .rfind(|h| !h.qr)
        .filter(|h| h.dst == l.backend && (h.dir != Direction::Egress || h.pod_ref().pod_veth))
}
