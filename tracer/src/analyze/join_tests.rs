use std::sync::Arc;

use super::*;
use crate::{
    correlate::LegRole,
    event::Direction::{self, Egress, Ingress},
    output::record::{HopRecord, LegRecord},
    test_support::fixtures,
};

const SEC: u64 = 1_000_000_000;
const SERVICE: &str = "10.96.0.10:53";
const POD_B: &str = "10.244.2.3:53";

fn hop(ts_ns: u64, netns: &str, dir: Direction, src: &str, dst: &str, qr: bool) -> HopRecord {
    fixtures::hop(ts_ns, netns, dir, src, dst, qr, None)
}

/// Node A's half: `client` asks the Service, DNAT'd to node B's pod, the query leaves on
/// the overlay and the answer comes back; at `t` (capture time = wall time offline).
fn client_half(client: &str, name: &str, t: u64) -> TransactionRecord {
    let mut l = fixtures::leg(
        LegRole::Query,
        client,
        SERVICE,
        POD_B,
        Some("NOERROR"),
        Some(900_000),
    );
    l.hops = vec![
        hop(t, "client", Egress, client, SERVICE, false),
        hop(t + 20_000, "node-a", Egress, client, POD_B, false),
        hop(t + 900_000, "client", Ingress, SERVICE, client, true),
    ];
    let mut tx = fixtures::transaction(name, "A", client, Some("NOERROR"), vec![l]);
    tx.ts_ns = t;
    tx.wall_ns = t;
    tx
}

/// Node B's half: the query arrives from the overlay addressed to the pod (DNAT done on
/// A), is served, and the pod forwards it upstream.
fn served_half(client: &str, name: &str, t: u64) -> TransactionRecord {
    let mut l = fixtures::leg(
        LegRole::Query,
        client,
        POD_B,
        POD_B,
        Some("NOERROR"),
        Some(700_000),
    );
    l.hops = vec![
        hop(t, "node-b", Ingress, client, POD_B, false),
        hop(t + 10_000, "coredns", Ingress, client, POD_B, false),
        hop(t + 700_000, "node-b", Egress, POD_B, client, true),
    ];
    let mut up = fixtures::leg(
        LegRole::Forward,
        "10.244.2.3:41000",
        "10.250.0.53:53",
        "10.250.0.53:53",
        Some("NOERROR"),
        Some(500_000),
    );
    up.parent = Some(0);
    up.hops = vec![hop(
        t + 50_000,
        "coredns",
        Egress,
        "10.244.2.3:41000",
        "10.250.0.53:53",
        false,
    )];
    let mut tx = fixtures::transaction(name, "A", client, Some("NOERROR"), vec![l, up]);
    tx.ts_ns = t;
    tx.wall_ns = t;
    tx
}

fn join() -> NodeJoin {
    NodeJoin::new(
        IdKey::default(),
        vec![Arc::from("node-a"), Arc::from("node-b")],
        10 * SEC,
    )
}

/// Everything `j` writes by the end, fed `(node, transaction, decided at)` in order.
fn run(feed: Vec<(usize, TransactionRecord, u64)>) -> Vec<(usize, TransactionRecord)> {
    let mut j = join();
    let mut out = Vec::new();
    for (node, tx, at) in feed {
        j.ready(Some(at), &mut out);
        j.push(node, tx, at, &mut out);
    }
    j.ready(None, &mut out);
    out
}

fn nodes_of(l: &LegRecord) -> &str {
    l.node.as_deref().unwrap_or("")
}

const T: u64 = 1_796_072_403_000_000_000;
const C: &str = "10.244.1.2:40005";

/// The two halves of one query, whichever is decided first: one transaction, written as the
/// client's node's, its legs from both nodes, B's first leg under the leg A sent, B's
/// upstream leg under it; the trace id the client's.
#[test]
fn a_query_across_nodes_is_one_transaction() {
    let key = IdKey::default();
    let want_trace = trace_ids(&key, &client_half(C, "www.lab.test.", T)).trace;
    for served_first in [false, true] {
        let a = (0, client_half(C, "www.lab.test.", T), T + SEC);
        let b = (1, served_half(C, "www.lab.test.", T + 300_000), T + SEC / 2);
        let feed = if served_first { vec![b, a] } else { vec![a, b] };
        let out = run(feed);
        assert_eq!(out.len(), 1, "{out:#?}");
        let (node, tx) = &out[0];
        assert_eq!(*node, 0);
        assert_eq!(tx.nodes, [Arc::from("node-a"), Arc::from("node-b")]);
        let legs: Vec<(&str, Option<usize>)> =
            tx.legs.iter().map(|l| (nodes_of(l), l.parent)).collect();
        assert_eq!(
            legs,
            [("node-a", None), ("node-b", Some(0)), ("node-b", Some(1))]
        );
        assert_eq!(trace_ids(&key, tx).trace, want_trace);
    }
}

/// Not joined: the same name asked by another client; the same client socket and DNS id
/// asking another name; the same query key a minute later; a half of the same node.
#[test]
fn unrelated_halves_are_not_joined() {
    let cases: Vec<(&str, TransactionRecord)> = vec![
        (
            "another client",
            served_half("10.244.1.9:40005", "www.lab.test.", T),
        ),
        ("another name", served_half(C, "api.lab.test.", T)),
        (
            "a minute later",
            served_half(C, "www.lab.test.", T + 60 * SEC),
        ),
    ];
    for (what, b) in cases {
        let at = b.wall_ns + SEC;
        let out = run(vec![
            (0, client_half(C, "www.lab.test.", T), T + SEC),
            (1, b, at),
        ]);
        assert_eq!(out.len(), 2, "{what}: {out:#?}");
        for (node, tx) in &out {
            assert_eq!(tx.nodes.len(), 1, "{what}");
            assert!(
                tx.legs.iter().all(|l| l.node == tx.nodes.first().cloned()),
                "{what}"
            );
            assert_eq!(tx.nodes[0].as_ref(), ["node-a", "node-b"][*node], "{what}");
        }
    }
    // Both halves from one node's capture: that node's correlator already had them.
    let out = run(vec![
        (0, client_half(C, "www.lab.test.", T), T + SEC),
        (0, served_half(C, "www.lab.test.", T), T + SEC),
    ]);
    assert_eq!(out.len(), 2, "{out:#?}");
}

/// A half waits for the other only as long as the hold: written alone when it is over,
/// and a later half of the same key is another transaction.
#[test]
fn the_hold_ends() {
    let mut j = join();
    let mut out = Vec::new();
    j.push(0, client_half(C, "www.lab.test.", T), T + SEC, &mut out);
    j.ready(Some(T + 5 * SEC), &mut out);
    assert!(out.is_empty());
    j.ready(Some(T + 11 * SEC), &mut out);
    assert_eq!(out.len(), 1);
    j.push(
        1,
        served_half(C, "www.lab.test.", T),
        T + 12 * SEC,
        &mut out,
    );
    j.ready(None, &mut out);
    assert_eq!(out.len(), 2);
    assert_eq!(j.joined, 0);
}
