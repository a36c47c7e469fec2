//! Where an answer from an unexpected source must be named (a pod's query to a ClusterIP
//! whose answer missed its reverse NAT) and where it must not (the answer un-NATed, a
//! local DNAT seen after it, a REDIRECT to a proxy on `lo`, TCP).
use super::*;
use crate::{
    correlate::test_support::{at, msg, Feed, MS, TCP, UDP},
    decode::dns::DnsMessage,
    detect::Sample,
    event::Direction,
    output::record::Record,
    test_support::fixtures,
};

const CLIENT: &str = "10.244.1.2:40000";
const CLUSTER_IP: &str = "10.96.0.10:53";
const COREDNS: &str = "10.244.1.3:53";

fn q() -> DnsMessage {
    msg(7, false, "svc.lab.test.", "A", "NOERROR", &[], false)
}

fn a() -> DnsMessage {
    msg(
        7,
        true,
        "svc.lab.test.",
        "A",
        "NOERROR",
        &["10.250.0.80"],
        false,
    )
}

/// The client's query leaving its pod on `eth0` to `asked`, and the answers arriving there
/// from each of `from`; then every record out.
fn exchange(proto: Proto, asked: &str, from: &[&str]) -> Vec<Record> {
    exchange_on((2, "eth0"), proto, asked, from)
}

/// [`exchange`] on interface `(ifindex, name)` of the client's pod.
fn exchange_on(dev: (u32, &str), proto: Proto, asked: &str, from: &[&str]) -> Vec<Record> {
    let mut f = Feed::new();
    let here = |dir| at(2, dev.0, dir);
    f.see(
        MS,
        here(Direction::Egress),
        "client",
        dev.1,
        proto,
        CLIENT,
        asked,
        q(),
    );
    for (i, src) in from.iter().enumerate() {
        let t = (2 + i as u64) * MS;
        f.see(
            t,
            here(Direction::Ingress),
            "client",
            dev.1,
            proto,
            src,
            CLIENT,
            a(),
        );
    }
    f.c.tick(60_000 * MS, &mut f.out);
    std::mem::take(&mut f.out)
}

fn found(records: &[Record]) -> Vec<&UnexpectedSourceRecord> {
    records
        .iter()
        .filter_map(|r| match r {
            Record::Detected(Detected::UnexpectedSource(u)) => Some(&**u),
            _ => None,
        })
        .collect()
}

#[test]
fn an_answer_that_missed_its_reverse_nat_is_named_after_its_transaction() {
    let out = exchange(UDP, CLUSTER_IP, &[COREDNS]);
    let u = found(&out);
    assert_eq!(u.len(), 1, "{out:?}");
    let u = u[0];
    assert_eq!(u.asked.to_string(), CLUSTER_IP);
    assert_eq!(u.answered_from.to_string(), COREDNS);
    assert_eq!((&*u.netns, &*u.ifname), ("client", "eth0"));
    assert_eq!(u.client.to_string(), CLIENT);
    assert_eq!(u.dns_id, 7);
    // After the transaction it is about, which names it.
    let tx = out
        .iter()
        .position(|r| matches!(r, Record::Transaction(t) if t.id == u.transaction));
    let det = out.iter().position(|r| matches!(r, Record::Detected(_)));
    assert!(tx < det, "{out:?}");
    // Every sink's words, from the record.
    let line = u.text();
    assert!(
        line.contains(
            "ANSWER FROM UNEXPECTED SOURCE: svc.lab.test. A id 7 asked 10.96.0.10:53, answered from 10.244.1.3:53"
        ),
        "{line}"
    );
    assert!(u.is_failure() && u.incident().is_some());
    let (class, _) = u.failure().unwrap();
    assert_eq!(class, "answer from unexpected source");
    let json = serde_json::to_value(Record::detected(u.clone())).unwrap();
    assert_eq!(json["type"], "unexpected_source");
    assert_eq!(json["answered_from"], COREDNS);
}

#[test]
fn answers_from_where_the_query_went_are_not_named() {
    // Un-NATed on the node: from the ClusterIP.
    assert!(found(&exchange(UDP, CLUSTER_IP, &[CLUSTER_IP])).is_empty());
    // A local DNAT, seen after it: the query's destination there is the pod already.
    assert!(found(&exchange(UDP, COREDNS, &[COREDNS])).is_empty());
    // A stray copy from elsewhere next to the real answer: the client took the real one.
    assert!(found(&exchange(UDP, CLUSTER_IP, &[COREDNS, CLUSTER_IP])).is_empty());
    // TCP: a stream, not datagrams a socket picks by source.
    assert!(found(&exchange(TCP, CLUSTER_IP, &[COREDNS])).is_empty());
    // No answer at all: that is an unanswered question, not this.
    assert!(found(&exchange(UDP, CLUSTER_IP, &[])).is_empty());
}

#[test]
fn a_redirect_to_a_proxy_on_lo_is_not_named() {
    // Istio's REDIRECT: the query goes to 127.0.0.1:15053 on `lo`, the answer comes back
    // from the ClusterIP asked (un-NATed on its way out), with or without the conntrack
    // entry that tells the correlator so.
    let out = exchange_on((1, "lo"), UDP, "127.0.0.1:15053", &[CLUSTER_IP]);
    assert!(found(&out).is_empty(), "{out:?}");
}

impl Sample for UnexpectedSourceRecord {
    fn sample() -> Self {
        UnexpectedSourceRecord {
            ts_ns: 1,
            wall_ns: 1,
            client: fixtures::addr(CLIENT),
            client_netns: "client".into(),
            pod: PodRef {
                pod: Some("ns/client".into()),
                pod_uid: Some("uid".into()),
                container: Some("c".into()),
                container_id: Some("containerd://x".into()),
                pod_veth: false,
            },
            question: fixtures::question("svc.lab.test.", "A"),
            dns_id: 7,
            asked: fixtures::addr(CLUSTER_IP),
            answered_from: fixtures::addr(COREDNS),
            netns: "client".into(),
            ifname: "eth0".into(),
            transaction: 1,
            outcome: Outcome::Unanswered,
            evidence: Some("DIR/dnspath-x-unexpected-source.pcapng".into()),
        }
    }
}
