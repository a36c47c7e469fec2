//! Joining: hops into legs across DNAT, SNAT, hairpins, tunnels, IPv6 and the node cache,
//! and legs into one tree per question.
use super::test_support::{at, msg, summary, Correlator, Feed, MS, TCP, UDP};
use super::*;
use crate::{event::Direction, test_support::fixtures::ct_event};

/// Client → ClusterIP (DNAT to a CoreDNS pod) → upstream, and the answers back.
fn dnat_path(f: &mut Feed, t0: u64, cport: u16, id: u16, name: &str) {
    let client = format!("10.244.1.2:{cport}");
    let q = || msg(id, false, name, "A", "NOERROR", &[], false);
    let fq = || msg(512, false, name, "A", "NOERROR", &[], false);
    let a = || msg(id, true, name, "A", "NOERROR", &["10.250.0.80"], false);
    let fa = || msg(512, true, name, "A", "NOERROR", &["10.250.0.80"], false);
    let node_client = at(1, 10, Direction::Ingress);
    let node_dnsa_out = at(1, 11, Direction::Egress);
    let node_dnsa_in = at(1, 11, Direction::Ingress);
    let node_up_out = at(1, 12, Direction::Egress);
    let node_up_in = at(1, 12, Direction::Ingress);
    let node_client_out = at(1, 10, Direction::Egress);
    f.see(
        t0,
        node_client,
        "node",
        "vclient",
        UDP,
        &client,
        "10.96.0.10:53",
        q(),
    );
    f.see(
        t0 + 10_000,
        node_dnsa_out,
        "node",
        "vdnsa",
        UDP,
        &client,
        "10.244.1.3:53",
        q(),
    );
    f.see(
        t0 + 100_000,
        node_dnsa_in,
        "node",
        "vdnsa",
        UDP,
        "10.244.1.3:40000",
        "10.250.0.53:53",
        fq(),
    );
    f.see(
        t0 + 110_000,
        node_up_out,
        "node",
        "vup",
        UDP,
        "10.244.1.3:40000",
        "10.250.0.53:53",
        fq(),
    );
    f.see(
        t0 + 300_000,
        node_up_in,
        "node",
        "vup",
        UDP,
        "10.250.0.53:53",
        "10.244.1.3:40000",
        fa(),
    );
    f.see(
        t0 + 310_000,
        node_dnsa_out,
        "node",
        "vdnsa",
        UDP,
        "10.250.0.53:53",
        "10.244.1.3:40000",
        fa(),
    );
    f.see(
        t0 + 400_000,
        node_dnsa_in,
        "node",
        "vdnsa",
        UDP,
        "10.244.1.3:53",
        &client,
        a(),
    );
    f.see(
        t0 + 410_000,
        node_client_out,
        "node",
        "vclient",
        UDP,
        "10.96.0.10:53",
        &client,
        a(),
    );
}

#[test]
fn dnat_and_forward_make_one_tree() {
    let mut f = Feed::new();
    dnat_path(&mut f, 1_000 * MS, 41234, 7, "www.lab.test.");
    assert!(
        f.txs(1_000 * MS + 100 * MS).is_empty(),
        "reported before settling"
    );
    let txs = f.txs(3_000 * MS);
    assert_eq!(txs.len(), 1);
    let t = &txs[0];
    assert_eq!(t.outcome, Outcome::Answered);
    assert_eq!(t.legs.len(), 2);
    let client_leg = &t.legs[0];
    assert_eq!(client_leg.server.to_string(), "10.96.0.10:53");
    assert_eq!(client_leg.backend.to_string(), "10.244.1.3:53");
    assert_eq!(client_leg.join, Join::Fallback);
    assert_eq!(client_leg.hops.len(), 4);
    assert_eq!(client_leg.latency_ns, Some(410_000));
    let up = &t.legs[1];
    assert_eq!(up.parent, Some(0));
    assert_eq!(up.role, LegRole::Forward);
    assert_eq!(up.join, Join::SameTuple);
    assert_eq!(up.hops.len(), 4);
    assert_eq!(up.latency_ns, Some(210_000));
    assert_eq!(t.answers, vec!["A 10.250.0.80"]);
    assert!(
        summary(t).starts_with("NOERROR A 10.250.0.80 in"),
        "{}",
        summary(t)
    );
    // Response hop latency is measured at the same point as its query.
    let back = up
        .hops
        .iter()
        .find(|h| h.qr && &*h.ifname == "vup")
        .unwrap();
    assert_eq!(back.latency_ns, Some(190_000));
}

#[test]
fn conntrack_joins_snat_hairpin() {
    let mut f = Feed::new();
    f.c.on_conntrack(&ConntrackEvent {
        status: 0x1b0,
        ..ct_event(
            UDP.number(),
            ("10.244.1.3:4000", "10.96.0.10:53"),
            ("10.244.1.3:53", "169.254.1.1:6000"),
        )
    });
    let q = || msg(9, false, "x.test.", "A", "NOERROR", &[], false);
    let a = || msg(9, true, "x.test.", "A", "NXDOMAIN", &[], false);
    f.see(
        MS,
        at(2, 2, Direction::Egress),
        "dnsa",
        "eth0",
        UDP,
        "10.244.1.3:4000",
        "10.96.0.10:53",
        q(),
    );
    f.see(
        MS + 50_000,
        at(1, 11, Direction::Egress),
        "node",
        "vdnsa",
        UDP,
        "169.254.1.1:6000",
        "10.244.1.3:53",
        q(),
    );
    f.see(
        MS + 90_000,
        at(1, 11, Direction::Ingress),
        "node",
        "vdnsa",
        UDP,
        "10.244.1.3:53",
        "169.254.1.1:6000",
        a(),
    );
    f.see(
        MS + 99_000,
        at(2, 2, Direction::Ingress),
        "dnsa",
        "eth0",
        UDP,
        "10.96.0.10:53",
        "10.244.1.3:4000",
        a(),
    );
    let txs = f.txs(2_000 * MS);
    assert_eq!(txs.len(), 1, "{txs:?}");
    let l = &txs[0].legs[0];
    assert_eq!(l.join, Join::Conntrack);
    assert_eq!(l.hops.len(), 4);
    assert_eq!(txs[0].rcode.as_deref(), Some("NXDOMAIN"));
}

/// A hop's message in the tests below: the one every hop of the packet shares (as the
/// decode stage hands them over), or a copy of its own.
fn hop_message(shared: bool, m: &Arc<DnsMessage>) -> Arc<DnsMessage> {
    if shared {
        Arc::clone(m)
    } else {
        Arc::new((**m).clone())
    }
}

/// A reported leg: its client, outcome, hop count and join.
type JoinedLeg = (SocketAddr, LegOutcome, usize, Join);

/// Everything reported by the end: how many transactions; each leg's client, outcome, hop
/// count and join; the orphan responses.
fn joined(f: &mut Feed) -> (usize, Vec<JoinedLeg>, u64) {
    let txs = f.txs(100_000 * MS);
    let legs = txs
        .iter()
        .flat_map(|t| &t.legs)
        .map(|l| (l.client, l.outcome, l.hops.len(), l.join))
        .collect();
    (txs.len(), legs, f.c.stats().orphan_responses)
}

/// One packet at both ends of each veth, as the decode stage hands it over (one decoded
/// message shared by every hop that carried the same bytes), joins exactly as when every
/// hop's message is its own — with conntrack learning the DNAT between two hops, an answer
/// seen (as an orphan) before its query, and the same query bytes again after the first
/// transaction was reported. Shared messages let a hop reuse the previous hop's join; this
/// holds that reuse to the full lookup.
#[test]
fn hops_sharing_one_message_join_as_hops_with_their_own() {
    let run = |shared: bool| {
        let mut f = Feed::new();
        let q = Arc::new(msg(7, false, "a.test.", "A", "NOERROR", &[], false));
        let a = Arc::new(msg(
            7,
            true,
            "a.test.",
            "A",
            "NOERROR",
            &["10.0.0.1"],
            false,
        ));
        let m = |x: &Arc<DnsMessage>| hop_message(shared, x);
        let (c, vip, pod) = ("10.244.1.2:4000", "10.96.0.10:53", "10.244.1.3:53");
        let ingress = Direction::Ingress;
        let egress = Direction::Egress;
        let answer_at_client = |f: &mut Feed, ts: u64| {
            f.see(ts, at(2, 1, ingress), "client", "eth0", UDP, vip, c, m(&a));
        };
        // A stray copy of the answer first: an orphan, at the client's end of its veth.
        answer_at_client(&mut f, MS);
        for round in 0..2u64 {
            let t0 = 10 * MS + round * 20_000 * MS;
            f.see(t0, at(2, 1, egress), "client", "eth0", UDP, c, vip, m(&q));
            // Conntrack learns the DNAT between the two ends of the client's veth.
            f.c.on_conntrack(&ConntrackEvent {
                ts_ns: t0 + 3_000,
                status: 0x1b0,
                ..ct_event(UDP.number(), (c, vip), (pod, c))
            });
            f.see(
                t0 + 5_000,
                at(1, 10, ingress),
                "node",
                "vclient",
                UDP,
                c,
                vip,
                m(&q),
            );
            f.see(
                t0 + 9_000,
                at(1, 11, egress),
                "node",
                "vdns",
                UDP,
                c,
                pod,
                m(&q),
            );
            f.see(
                t0 + 12_000,
                at(3, 1, ingress),
                "dns",
                "eth0",
                UDP,
                c,
                pod,
                m(&q),
            );
            f.see(
                t0 + 90_000,
                at(3, 1, egress),
                "dns",
                "eth0",
                UDP,
                pod,
                c,
                m(&a),
            );
            f.see(
                t0 + 93_000,
                at(1, 11, ingress),
                "node",
                "vdns",
                UDP,
                pod,
                c,
                m(&a),
            );
            f.see(
                t0 + 96_000,
                at(1, 10, egress),
                "node",
                "vclient",
                UDP,
                vip,
                c,
                m(&a),
            );
            answer_at_client(&mut f, t0 + 99_000);
            // The same answer delivered twice at the last hop.
            answer_at_client(&mut f, t0 + 99_500);
            f.c.tick(t0 + 10_000 * MS, &mut f.out);
            // Once more after its transaction was reported: an orphan now.
            let late = t0 + 10_001 * MS;
            answer_at_client(&mut f, late);
        }
        joined(&mut f)
    };
    let (own, shared) = (run(false), run(true));
    assert_eq!(own.0, 2, "two transactions: {own:?}");
    assert_eq!(own.2, 3, "orphans: the stray answer and each late one");
    assert!(
        own.1.iter().all(|l| l.2 == 9),
        "each leg holds its 9 hops: {own:?}"
    );
    assert_eq!(own, shared);
}

/// As above across a hairpin's SNAT, where what conntrack learns between the two ends of a
/// veth changes the leg the second end joins: a shared message's second hop is joined
/// afresh, not as the first was.
#[test]
fn a_shared_message_joins_afresh_once_conntrack_learns_its_flow() {
    let run = |shared: bool| {
        let mut f = Feed::new();
        let q = Arc::new(msg(9, false, "x.test.", "A", "NOERROR", &[], false));
        let a = Arc::new(msg(9, true, "x.test.", "A", "NXDOMAIN", &[], false));
        let m = |x: &Arc<DnsMessage>| hop_message(shared, x);
        let (pod, pod53, vip, snat) = (
            "10.244.1.3:4000",
            "10.244.1.3:53",
            "10.96.0.10:53",
            "169.254.1.1:6000",
        );
        let (ingress, egress) = (Direction::Ingress, Direction::Egress);
        f.see(MS, at(2, 2, egress), "dnsa", "eth0", UDP, pod, vip, m(&q));
        f.see(
            2 * MS,
            at(1, 11, egress),
            "node",
            "vdnsa",
            UDP,
            snat,
            pod53,
            m(&q),
        );
        // Both joined before conntrack's event comes.
        f.c.tick(100 * MS, &mut f.out);
        f.c.on_conntrack(&ConntrackEvent {
            ts_ns: 3 * MS,
            status: 0x1b0,
            ..ct_event(UDP.number(), (pod, vip), (pod53, snat))
        });
        f.see(
            101 * MS,
            at(2, 2, ingress),
            "dnsa",
            "eth0",
            UDP,
            snat,
            pod53,
            m(&q),
        );
        f.see(
            102 * MS,
            at(2, 2, egress),
            "dnsa",
            "eth0",
            UDP,
            pod53,
            snat,
            m(&a),
        );
        f.see(
            103 * MS,
            at(1, 11, ingress),
            "node",
            "vdnsa",
            UDP,
            pod53,
            snat,
            m(&a),
        );
        f.see(
            104 * MS,
            at(2, 2, ingress),
            "dnsa",
            "eth0",
            UDP,
            vip,
            pod,
            m(&a),
        );
        joined(&mut f)
    };
    let (own, shared) = (run(false), run(true));
    assert!(
        own.1.iter().any(|l| l.3 == Join::Conntrack && l.2 >= 4),
        "the answer and the queries after conntrack's event join by conntrack: {own:?}"
    );
    assert_eq!(own, shared);
}

/// NodeLocal DNSCache's shape: the client asks the cluster DNS address, which the node's
/// cache answers on (NOTRACK'd, no DNAT); on a miss the cache asks CoreDNS over TCP from the
/// node's own address, and CoreDNS asks its upstream. One tree from the client to the
/// upstream, though the cache's query leaves with an address the client never asked.
#[test]
fn a_node_cache_miss_is_one_tree_from_the_client_to_the_upstream() {
    let mut f = Feed {
        c: Correlator::new(
            CorrelateConfig {
                node_netns: Some(1),
                ..Default::default()
            },
            Clock::Epoch,
        ),
        out: vec![],
    };
    let q = |id| msg(id, false, "nl.lab.test.", "A", "NOERROR", &[], false);
    let a = |id| {
        msg(
            id,
            true,
            "nl.lab.test.",
            "A",
            "NOERROR",
            &["10.250.0.80"],
            false,
        )
    };
    let client = "10.244.1.2:40000";
    let (cache_sock, coredns) = ("169.254.1.1:45000", "10.244.1.3:53");
    let (fwd_sock, upstream) = ("10.244.1.3:50000", "10.250.0.53:53");
    f.see(
        MS,
        at(2, 2, Direction::Egress),
        "client",
        "eth0",
        UDP,
        client,
        "10.96.0.10:53",
        q(7),
    );
    f.see(
        MS + 10_000,
        at(1, 10, Direction::Ingress),
        "node",
        "vclient",
        UDP,
        client,
        "10.96.0.10:53",
        q(7),
    );
    // The cache's miss, over TCP to the CoreDNS Service, DNAT'd in the node's OUTPUT.
    f.see(
        MS + 200_000,
        at(1, 11, Direction::Egress),
        "node",
        "vdnsa",
        TCP,
        cache_sock,
        coredns,
        q(9),
    );
    f.see(
        MS + 210_000,
        at(3, 2, Direction::Ingress),
        "dnsa",
        "eth0",
        TCP,
        cache_sock,
        coredns,
        q(9),
    );
    f.see(
        MS + 300_000,
        at(3, 2, Direction::Egress),
        "dnsa",
        "eth0",
        UDP,
        fwd_sock,
        upstream,
        q(512),
    );
    f.see(
        2 * MS,
        at(3, 2, Direction::Ingress),
        "dnsa",
        "eth0",
        UDP,
        upstream,
        fwd_sock,
        a(512),
    );
    f.see(
        2 * MS + 100_000,
        at(3, 2, Direction::Egress),
        "dnsa",
        "eth0",
        TCP,
        coredns,
        cache_sock,
        a(9),
    );
    f.see(
        2 * MS + 110_000,
        at(1, 11, Direction::Ingress),
        "node",
        "vdnsa",
        TCP,
        coredns,
        cache_sock,
        a(9),
    );
    f.see(
        2 * MS + 200_000,
        at(1, 10, Direction::Egress),
        "node",
        "vclient",
        UDP,
        "10.96.0.10:53",
        client,
        a(7),
    );
    f.see(
        2 * MS + 210_000,
        at(2, 2, Direction::Ingress),
        "client",
        "eth0",
        UDP,
        "10.96.0.10:53",
        client,
        a(7),
    );
    let txs = f.txs(20_000 * MS);
    assert_eq!(txs.len(), 1, "{txs:#?}");
    let t = &txs[0];
    assert_eq!(t.outcome, Outcome::Answered);
    assert_eq!(t.legs.len(), 3, "{t:#?}");
    assert_eq!(t.legs[1].proto, TCP);
    assert_eq!(t.legs[1].parent, Some(0));
    assert_eq!(t.legs[1].role, LegRole::Forward);
    assert_eq!(t.legs[2].parent, Some(1));
    assert_eq!(t.legs[0].node_cache, Some(NodeCache::Miss));
    assert_eq!(t.legs[1].node_cache, None, "CoreDNS is no node cache");
    assert_eq!(t.legs[2].node_cache, None);

    // The same question again: the cache answers from memory.
    let t0 = 30_000 * MS;
    f.see(
        t0,
        at(2, 2, Direction::Egress),
        "client",
        "eth0",
        UDP,
        "10.244.1.2:40001",
        "10.96.0.10:53",
        q(11),
    );
    f.see(
        t0 + 10_000,
        at(1, 10, Direction::Ingress),
        "node",
        "vclient",
        UDP,
        "10.244.1.2:40001",
        "10.96.0.10:53",
        q(11),
    );
    f.see(
        t0 + 50_000,
        at(1, 10, Direction::Egress),
        "node",
        "vclient",
        UDP,
        "10.96.0.10:53",
        "10.244.1.2:40001",
        a(11),
    );
    f.see(
        t0 + 60_000,
        at(2, 2, Direction::Ingress),
        "client",
        "eth0",
        UDP,
        "10.96.0.10:53",
        "10.244.1.2:40001",
        a(11),
    );
    // A client asking CoreDNS's pod directly, around the cache.
    let t1 = 31_000 * MS;
    let direct = "10.244.1.2:40002";
    f.see(
        t1,
        at(2, 2, Direction::Egress),
        "client",
        "eth0",
        UDP,
        direct,
        coredns,
        q(12),
    );
    f.see(
        t1 + 10_000,
        at(1, 10, Direction::Ingress),
        "node",
        "vclient",
        UDP,
        direct,
        coredns,
        q(12),
    );
    f.see(
        t1 + 20_000,
        at(1, 11, Direction::Egress),
        "node",
        "vdnsa",
        UDP,
        direct,
        coredns,
        q(12),
    );
    f.see(
        t1 + 30_000,
        at(3, 2, Direction::Ingress),
        "dnsa",
        "eth0",
        UDP,
        direct,
        coredns,
        q(12),
    );
    f.see(
        t1 + 90_000,
        at(3, 2, Direction::Egress),
        "dnsa",
        "eth0",
        UDP,
        coredns,
        direct,
        a(12),
    );
    f.see(
        t1 + 100_000,
        at(1, 11, Direction::Ingress),
        "node",
        "vdnsa",
        UDP,
        coredns,
        direct,
        a(12),
    );
    f.see(
        t1 + 110_000,
        at(1, 10, Direction::Egress),
        "node",
        "vclient",
        UDP,
        coredns,
        direct,
        a(12),
    );
    f.see(
        t1 + 120_000,
        at(2, 2, Direction::Ingress),
        "client",
        "eth0",
        UDP,
        coredns,
        direct,
        a(12),
    );
    let txs = f.txs(60_000 * MS);
    assert_eq!(txs.len(), 2, "{txs:#?}");
    assert_eq!(txs[0].legs.len(), 1);
    assert_eq!(txs[0].legs[0].node_cache, Some(NodeCache::Hit));
    assert_eq!(txs[1].legs[0].node_cache, Some(NodeCache::Bypass));
    let json = serde_json::to_value(&txs[0]).unwrap();
    assert_eq!(json["legs"][0]["node_cache"], "hit");
}

/// A client asking a CoreDNS-like pod over IPv6 (through a DNAT'd ClusterIP), the pod
/// forwarding over IPv4: one tree.
#[test]
fn a_question_asked_over_ipv6_and_forwarded_over_ipv4_is_one_tree() {
    let mut f = Feed::new();
    let q = |id| msg(id, false, "ds.lab.test.", "AAAA", "NOERROR", &[], false);
    let a = |id| {
        msg(
            id,
            true,
            "ds.lab.test.",
            "AAAA",
            "NOERROR",
            &["fd00::80"],
            false,
        )
    };
    let (client, svc, pod) = (
        "[fd00:244::2]:40000",
        "[fd00:96::10]:53",
        "[fd00:244::3]:53",
    );
    let (fwd_sock, upstream) = ("10.244.1.3:50000", "10.250.0.53:53");
    f.see(
        MS,
        at(2, 2, Direction::Egress),
        "client",
        "eth0",
        UDP,
        client,
        svc,
        q(7),
    );
    f.see(
        MS + 10_000,
        at(1, 10, Direction::Ingress),
        "node",
        "vclient",
        UDP,
        client,
        svc,
        q(7),
    );
    f.see(
        MS + 20_000,
        at(1, 11, Direction::Egress),
        "node",
        "vdnsa",
        UDP,
        client,
        pod,
        q(7),
    );
    f.see(
        MS + 30_000,
        at(3, 2, Direction::Ingress),
        "dnsa",
        "eth0",
        UDP,
        client,
        pod,
        q(7),
    );
    f.see(
        MS + 300_000,
        at(3, 2, Direction::Egress),
        "dnsa",
        "eth0",
        UDP,
        fwd_sock,
        upstream,
        q(512),
    );
    f.see(
        2 * MS,
        at(3, 2, Direction::Ingress),
        "dnsa",
        "eth0",
        UDP,
        upstream,
        fwd_sock,
        a(512),
    );
    f.see(
        2 * MS + 100_000,
        at(3, 2, Direction::Egress),
        "dnsa",
        "eth0",
        UDP,
        pod,
        client,
        a(7),
    );
    f.see(
        2 * MS + 110_000,
        at(1, 11, Direction::Ingress),
        "node",
        "vdnsa",
        UDP,
        pod,
        client,
        a(7),
    );
    f.see(
        2 * MS + 120_000,
        at(1, 10, Direction::Egress),
        "node",
        "vclient",
        UDP,
        svc,
        client,
        a(7),
    );
    f.see(
        2 * MS + 130_000,
        at(2, 2, Direction::Ingress),
        "client",
        "eth0",
        UDP,
        svc,
        client,
        a(7),
    );
    let txs = f.txs(20_000 * MS);
    assert_eq!(txs.len(), 1, "{txs:#?}");
    assert_eq!(txs[0].legs.len(), 2, "{:#?}", txs[0]);
    assert_eq!(txs[0].legs[1].parent, Some(0));
    assert_eq!(txs[0].legs[1].server, upstream.parse().unwrap());
}

/// Two clients asking the same question, traced on the node only (pods not watched): the
/// second client's query comes *into* the node, so it is nobody's forward, even while the
/// first client's query is still on its way.
#[test]
fn a_second_client_passing_through_the_node_is_not_a_forward() {
    let mut f = Feed::new();
    let q = |id| msg(id, false, "two.lab.test.", "A", "NOERROR", &[], false);
    f.see(
        MS,
        at(1, 10, Direction::Ingress),
        "node",
        "vclient",
        UDP,
        "10.244.1.2:40000",
        "10.96.0.10:53",
        q(7),
    );
    f.see(
        MS + 5_000,
        at(1, 12, Direction::Ingress),
        "node",
        "vclient2",
        UDP,
        "10.244.1.5:41000",
        "10.96.0.10:53",
        q(8),
    );
    let txs = f.txs(20_000 * MS);
    assert_eq!(txs.len(), 2, "{txs:#?}");
}

/// A query from a pod on node A to a DNS pod on node B through the ClusterIP, carried
/// between the nodes in VXLAN: seen at the client pod, DNAT'd on node A, on node A's
/// `flannel.1` (inner), on node A's and node B's `eth0` (encapsulated), on node B's
/// `flannel.1` and at the server pod; and the answer back the same way. The encapsulated
/// copies are hops of the one leg, not legs of their own, and keep their tunnel.
#[test]
fn a_packet_inside_and_outside_a_tunnel_is_one_leg() {
    use crate::decode::tunnel::{Tunnel, TunnelKind};
    let mut f = Feed::new();
    let t0 = 1_000 * MS;
    let vxlan = |src: [u8; 4], dst: [u8; 4]| {
        Some(Arc::new(Tunnel {
            kind: TunnelKind::Vxlan,
            id: Some(1),
            src: src.into(),
            dst: dst.into(),
        }))
    };
    let (a, b) = ([10, 200, 0, 1], [10, 200, 0, 2]);
    let client = "10.244.1.2:40000";
    let svc = "10.96.0.10:53";
    let pod = "10.244.2.3:53";
    // (netns cookie, ifindex, dir, namespace, interface, src, dst, tunnel)
    type Step<'a> = (
        u64,
        u32,
        Direction,
        &'a str,
        &'a str,
        &'a str,
        &'a str,
        Option<Arc<Tunnel>>,
    );
    let query: Vec<Step> = vec![
        (5, 2, Direction::Egress, "client", "eth0", client, svc, None),
        (
            1,
            10,
            Direction::Ingress,
            "node-a",
            "vclient",
            client,
            svc,
            None,
        ),
        (
            1,
            3,
            Direction::Egress,
            "node-a",
            "flannel.1",
            client,
            pod,
            None,
        ),
        (
            1,
            2,
            Direction::Egress,
            "node-a",
            "eth0",
            client,
            pod,
            vxlan(a, b),
        ),
        (
            2,
            2,
            Direction::Ingress,
            "node-b",
            "eth0",
            client,
            pod,
            vxlan(a, b),
        ),
        (
            2,
            3,
            Direction::Ingress,
            "node-b",
            "flannel.1",
            client,
            pod,
            None,
        ),
        (
            2,
            11,
            Direction::Egress,
            "node-b",
            "vdns",
            client,
            pod,
            None,
        ),
        (6, 2, Direction::Ingress, "dns", "eth0", client, pod, None),
    ];
    let mut ts = t0;
    for (netns, ifindex, dir, ns, ifn, src, dst, tunnel) in query.iter().cloned() {
        ts += 10_000;
        f.c.on_observed(Observed::Message(Observation {
            ts_ns: ts,
            at: at(netns, ifindex, dir),
            netns: ns.into(),
            ifname: ifn.into(),
            proto: UDP,
            src: src.parse().unwrap(),
            dst: dst.parse().unwrap(),
            msg: Arc::new(msg(9, false, "www.lab.test.", "A", "NOERROR", &[], false)),
            tunnel,
        }));
    }
    // The answer: the same places backwards, directions and addresses reversed.
    let flip = |d: Direction| match d {
        Direction::Ingress => Direction::Egress,
        _ => Direction::Ingress,
    };
    for (netns, ifindex, dir, ns, ifn, src, dst, tunnel) in query.iter().rev().cloned() {
        ts += 10_000;
        let tunnel = tunnel.map(|t| {
            Arc::new(Tunnel {
                src: t.dst,
                dst: t.src,
                ..*t
            })
        });
        f.c.on_observed(Observed::Message(Observation {
            ts_ns: ts,
            at: at(netns, ifindex, flip(dir)),
            netns: ns.into(),
            ifname: ifn.into(),
            proto: UDP,
            src: dst.parse().unwrap(),
            dst: src.parse().unwrap(),
            msg: Arc::new(msg(
                9,
                true,
                "www.lab.test.",
                "A",
                "NOERROR",
                &["10.250.0.80"],
                false,
            )),
            tunnel,
        }));
    }
    let txs = f.txs(t0 + 3_000 * MS);
    assert_eq!(txs.len(), 1);
    let t = &txs[0];
    assert_eq!(t.outcome, Outcome::Answered);
    assert_eq!(t.legs.len(), 1, "{:#?}", t.legs);
    let leg = &t.legs[0];
    assert_eq!(leg.hops.len(), 16);
    assert_eq!(leg.backend.to_string(), pod);
    let tunnelled: Vec<String> = leg
        .hops
        .iter()
        .filter_map(|h| Some(format!("{}/{} {}", h.netns, h.ifname, h.tunnel.as_ref()?)))
        .collect();
    assert_eq!(
        tunnelled,
        [
            "node-a/eth0 vxlan vni=1 10.200.0.1 > 10.200.0.2",
            "node-b/eth0 vxlan vni=1 10.200.0.1 > 10.200.0.2",
            "node-b/eth0 vxlan vni=1 10.200.0.2 > 10.200.0.1",
            "node-a/eth0 vxlan vni=1 10.200.0.2 > 10.200.0.1",
        ]
    );
    // Written: the hop names its tunnel in text and JSON.
    let text = crate::output::text::transaction_block(t);
    assert!(
        text.contains("node-a/eth0 vxlan vni=1 10.200.0.1 > 10.200.0.2 out +"),
        "{text}"
    );
    let json = serde_json::to_value(&t.legs[0].hops[3]).unwrap();
    assert_eq!(json["tunnel"]["vni"], 1);
    assert_eq!(json["tunnel"]["src"], "10.200.0.1");
    assert!(serde_json::to_value(&t.legs[0].hops[2])
        .unwrap()
        .get("tunnel")
        .is_none());
}

/// The query's conntrack entry deleted before its answer came back (kube-proxy on an
/// endpoint change, `conntrack -F`): the answer, not reverse-NATed, opens an entry of its
/// own, server → client. That entry says nothing of the query's client: the answer still
/// joins its leg by the client's port, and is seen arriving from the pod.
#[test]
fn an_answer_that_opened_its_own_conntrack_entry_joins_its_leg() {
    let mut f = Feed::new();
    f.c.on_conntrack(&ConntrackEvent {
        status: 0x8,
        ..ct_event(
            UDP.number(),
            ("10.244.1.3:53", "10.244.1.2:4000"),
            ("10.244.1.2:4000", "10.244.1.3:53"),
        )
    });
    let q = || msg(9, false, "x.test.", "A", "NOERROR", &[], false);
    let a = || msg(9, true, "x.test.", "A", "NOERROR", &["10.250.0.80"], false);
    let eth0 = |dir| at(2, 2, dir);
    let client = "10.244.1.2:4000";
    f.see(
        MS,
        eth0(Direction::Egress),
        "client",
        "eth0",
        UDP,
        client,
        "10.96.0.10:53",
        q(),
    );
    let pod = "10.244.1.3:53";
    f.see(
        2 * MS,
        eth0(Direction::Ingress),
        "client",
        "eth0",
        UDP,
        pod,
        client,
        a(),
    );
    let txs = f.txs(60_000 * MS);
    assert_eq!(txs.len(), 1, "{txs:#?}");
    let leg = &txs[0].legs[0];
    assert_eq!(leg.hops.len(), 2, "{leg:#?}");
    assert_eq!(leg.hops[1].src.to_string(), pod);
    assert_eq!(f.c.stats().orphan_responses, 0);
}
