//! The index's invariant: whatever is inserted, answered, timed out or removed, every index
//! names exactly the legs it should, and no index holds more than [`MAX_CANDIDATES`] per key.
use std::net::SocketAddr;

use super::*;
use crate::{
    correlate::{
        model::{Hop, Via},
        record::LegRole,
    },
    event::{Direction, ObservationPoint},
};

fn q(name: &str) -> QKey {
    QKey::asked(name, "A".into(), "IN".into())
}

fn leg(id: u64, client: &str, name: &str, dns_id: u16, parent: Option<u64>) -> Leg {
    let client: SocketAddr = client.parse().unwrap();
    let server: SocketAddr = "10.96.0.10:53".parse().unwrap();
    let at = ObservationPoint {
        netns: 1,
        ifindex: 2,
        dir: Direction::Egress,
    };
    Leg {
        id,
        key: LegKey {
            proto: crate::decode::record::Proto::Udp,
            client_port: client.port(),
            id: dns_id,
            q: q(name),
        },
        tx: id,
        parent,
        role: if parent.is_some() {
            LegRole::Forward
        } else {
            LegRole::Query
        },
        first_ts: id,
        last_ts: id,
        client,
        server,
        backend: server,
        backend_at: None,
        delivered_ns: "ns".into(),
        delivered_at: ObservationPoint {
            netns: 1,
            ifindex: 1,
            dir: crate::event::Direction::Egress,
        },
        client_netns: "ns".into(),
        client_point: at,
        hops: vec![Hop {
            ts_ns: id,
            at,
            netns: "ns".into(),
            ifname: "eth0".into(),
            src: client,
            dst: server,
            dns_id,
            qr: false,
            via: Via::Same,
            tunnel: None,
        }],
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
    }
}

fn response() -> Response {
    Response {
        ts_ns: 0,
        rcode: "NOERROR".into(),
        tc: false,
        answers: Vec::new(),
        cut: None,
    }
}

fn ids<'a>(it: impl Iterator<Item = &'a Leg>) -> Vec<u64> {
    it.map(|l| l.id).collect()
}

/// A leg is a candidate of a key only if it should be, and it should be unless the key
/// already holds [`MAX_CANDIDATES`] newer ones.
fn listed(id: u64, should: bool, list: Vec<u64>) {
    if list.contains(&id) {
        assert!(should, "leg {id} listed in {list:?}");
    } else if should {
        assert!(
            list.len() == MAX_CANDIDATES && list.iter().all(|&other| other > id),
            "leg {id} missing from {list:?}"
        );
    }
}

/// Every index agrees with the legs held: each leg is found by its key (unless a newer leg
/// took the key), by its question while open, and as a root by client and socket.
fn check(ix: &LegIndex) {
    for (id, l) in &ix.legs {
        let by_key = ix.by_key(&l.key).expect("every leg's key is indexed");
        assert!(by_key >= *id, "key of {id} names {by_key}");
        let open = l.response.is_none() && !l.timed_out;
        listed(*id, open, ids(ix.open(&l.key.q)));
        let root = l.parent.is_none();
        listed(*id, root, ids(ix.roots(l.client.ip(), &l.key.q)));
        listed(*id, root, ids(ix.roots_from(&l.client)));
    }
    // Nothing indexed that is not held, and no key over the cap or left empty.
    for v in ix.by_key.values() {
        assert!(ix.legs.contains_key(v), "by_key names a removed leg {v}");
    }
    let lists = ix
        .open_by_q
        .values()
        .chain(ix.roots_by_q.values())
        .chain(ix.roots_by_socket.values());
    for v in lists {
        assert!(
            !v.is_empty() && v.len() <= MAX_CANDIDATES,
            "{} candidates",
            v.len()
        );
        assert!(
            v.iter()
                .all(|c| ix.legs.get(&c.id).is_some_and(|l| l.first_ts == c.first_ts)),
            "{v:?}"
        );
    }
}

#[test]
fn insert_respond_time_out_and_remove_keep_every_index() {
    let mut ix = LegIndex::default();
    ix.insert(leg(1, "10.0.0.5:40000", "a.test.", 7, None));
    ix.insert(leg(2, "10.0.0.5:40000", "b.test.", 8, None));
    ix.insert(leg(3, "10.0.0.10:50000", "a.test.", 9, Some(1)));
    check(&ix);
    assert_eq!(ids(ix.open(&q("a.test."))), [1, 3]);
    assert_eq!(
        ids(ix.roots_from(&"10.0.0.5:40000".parse().unwrap())),
        [1, 2]
    );
    assert_eq!(
        ids(ix.roots("10.0.0.10".parse().unwrap(), &q("a.test."))),
        [] as [u64; 0]
    );

    ix.respond(1, response());
    check(&ix);
    assert_eq!(ids(ix.open(&q("a.test."))), [3]);
    assert!(ix.get(&1).is_some_and(|l| l.response.is_some()));

    assert!(ix.time_out(3));
    assert!(!ix.time_out(3), "a leg times out once");
    assert!(!ix.time_out(1), "an answered leg does not time out");
    check(&ix);
    assert_eq!(ids(ix.open(&q("a.test."))), [] as [u64; 0]);

    assert_eq!(ix.remove(1).map(|l| l.id), Some(1));
    assert!(ix.remove(1).is_none());
    check(&ix);
    assert_eq!(
        ix.by_key(&leg(1, "10.0.0.5:40000", "a.test.", 7, None).key),
        None
    );
    assert_eq!(ids(ix.roots_from(&"10.0.0.5:40000".parse().unwrap())), [2]);
    for id in [2, 3] {
        ix.remove(id);
    }
    check(&ix);
    assert_eq!(ix.len(), 0);
    assert!(ix.by_key.is_empty() && ix.open_by_q.is_empty());
    assert!(ix.roots_by_q.is_empty() && ix.roots_by_socket.is_empty());
}

#[test]
fn a_reused_key_names_the_newer_leg_until_that_one_goes() {
    let mut ix = LegIndex::default();
    ix.insert(leg(1, "10.0.0.5:40000", "a.test.", 7, None));
    ix.respond(1, response());
    // The same socket, id and question again: a new leg takes the key.
    ix.insert(leg(2, "10.0.0.5:40000", "a.test.", 7, None));
    check(&ix);
    let key = ix.get(&2).map(|l| l.key.clone()).unwrap();
    assert_eq!(ix.by_key(&key), Some(2));
    // Removing the older leg leaves the newer one's key.
    ix.remove(1);
    assert_eq!(ix.by_key(&key), Some(2));
    check(&ix);
    ix.remove(2);
    assert_eq!(ix.by_key(&key), None);
    check(&ix);
}

#[test]
fn each_key_keeps_the_newest_candidates_only() {
    let mut ix = LegIndex::default();
    let n = MAX_CANDIDATES as u64 + 10;
    for id in 1..=n {
        // One socket and question, a new DNS id each time.
        ix.insert(leg(id, "10.0.0.5:40000", "a.test.", id as u16, None));
    }
    check(&ix);
    let open = ids(ix.open(&q("a.test.")));
    assert_eq!(open.len(), MAX_CANDIDATES);
    assert_eq!(open.first(), Some(&11), "the oldest went first");
    assert_eq!(open.last(), Some(&n));
    let socket = "10.0.0.5:40000".parse().unwrap();
    assert_eq!(ids(ix.roots_from(&socket)).len(), MAX_CANDIDATES);
    // Legs past the cap are still held and found by their key.
    assert_eq!(ix.len(), n as usize);
    let first_key = ix.get(&1).map(|l| l.key.clone()).unwrap();
    assert_eq!(ix.by_key(&first_key), Some(1));
    // Removing everything empties every index, dropped candidates or not.
    for id in 1..=n {
        ix.remove(id);
        check(&ix);
    }
    assert!(ix.open_by_q.is_empty() && ix.roots_by_q.is_empty() && ix.roots_by_socket.is_empty());
}
