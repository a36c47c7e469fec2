//! A DNS proxy in the client's pod (`nat OUTPUT` REDIRECT of port 53 to a local port): the
//! proxy's own query is the child of the question it got; retries, other clients of the
//! proxy, loopback stubs and plain clients of one pod stay apart.
use super::test_support::{at, msg, Feed, MS, TCP, UDP};
use super::*;
use crate::{
    event::Direction,
    output::{record::Record, text},
    test_support::fixtures::ct_event,
};

const APP: &str = "10.244.1.2:40000";
const CLUSTER_IP: &str = "10.96.0.10:53";
const PROXY: &str = "127.0.0.1:15053";
const PROXY_SOCK: &str = "10.244.1.2:50000";
const COREDNS: &str = "10.244.1.3:53";

fn q(id: u16) -> DnsMessage {
    msg(id, false, "px.lab.test.", "A", "NOERROR", &[], false)
}

fn a(id: u16) -> DnsMessage {
    msg(
        id,
        true,
        "px.lab.test.",
        "A",
        "NOERROR",
        &["10.250.0.80"],
        false,
    )
}

fn lo(dir: Direction) -> ObservationPoint {
    at(2, 1, dir)
}

/// Conntrack in the client's namespace: `client` asked the ClusterIP, REDIRECT sent it to
/// the proxy.
fn redirect_entry(f: &mut Feed, proto: Proto, client: &str) {
    f.c.on_conntrack(&ConntrackEvent {
        netns: 2,
        ..ct_event(proto.number(), (client, CLUSTER_IP), (PROXY, client))
    });
}

/// `m` from `src` to `dst` at both ends of the client pod's `lo`, from `t` on.
fn on_lo(f: &mut Feed, t: u64, proto: Proto, src: &str, dst: &str, m: DnsMessage) {
    for (k, dir) in [Direction::Egress, Direction::Ingress]
        .into_iter()
        .enumerate()
    {
        f.see(
            t + k as u64 * 1_000,
            lo(dir),
            "client",
            "lo",
            proto,
            src,
            dst,
            m.clone(),
        );
    }
}

/// `client`'s question on the client pod's `lo`, redirected to the proxy (both ends of
/// `lo`), at `t`.
fn app_asks(f: &mut Feed, t: u64, proto: Proto, client: &str, id: u16) {
    on_lo(f, t, proto, client, PROXY, q(id));
}

/// The proxy's answer to `client` on `lo`, un-NATed: from the ClusterIP.
fn proxy_answers(f: &mut Feed, t: u64, proto: Proto, client: &str, id: u16) {
    on_lo(f, t, proto, CLUSTER_IP, client, a(id));
}

/// The proxy's own query to the ClusterIP from the pod (not redirected: its uid is
/// exempt), DNAT'd on the node to CoreDNS, which asks the upstream; the answers back.
fn proxy_asks_cluster_dns(f: &mut Feed, t: u64, proto: Proto) {
    let steps: [(u64, ObservationPoint, &str, &str, &str, &str, DnsMessage); 12] = [
        (
            0,
            at(2, 2, Direction::Egress),
            "client",
            "eth0",
            PROXY_SOCK,
            CLUSTER_IP,
            q(9),
        ),
        (
            10_000,
            at(1, 10, Direction::Ingress),
            "node",
            "vclient",
            PROXY_SOCK,
            CLUSTER_IP,
            q(9),
        ),
        (
            20_000,
            at(1, 11, Direction::Egress),
            "node",
            "vdnsa",
            PROXY_SOCK,
            COREDNS,
            q(9),
        ),
        (
            30_000,
            at(3, 2, Direction::Ingress),
            "dnsa",
            "eth0",
            PROXY_SOCK,
            COREDNS,
            q(9),
        ),
        (
            100_000,
            at(3, 2, Direction::Egress),
            "dnsa",
            "eth0",
            "10.244.1.3:60000",
            "10.250.0.53:53",
            q(512),
        ),
        (
            110_000,
            at(1, 11, Direction::Ingress),
            "node",
            "vdnsa",
            "10.244.1.3:60000",
            "10.250.0.53:53",
            q(512),
        ),
        (
            900_000,
            at(1, 11, Direction::Egress),
            "node",
            "vdnsa",
            "10.250.0.53:53",
            "10.244.1.3:60000",
            a(512),
        ),
        (
            910_000,
            at(3, 2, Direction::Ingress),
            "dnsa",
            "eth0",
            "10.250.0.53:53",
            "10.244.1.3:60000",
            a(512),
        ),
        (
            950_000,
            at(3, 2, Direction::Egress),
            "dnsa",
            "eth0",
            COREDNS,
            PROXY_SOCK,
            a(9),
        ),
        (
            960_000,
            at(1, 11, Direction::Ingress),
            "node",
            "vdnsa",
            COREDNS,
            PROXY_SOCK,
            a(9),
        ),
        (
            970_000,
            at(1, 10, Direction::Egress),
            "node",
            "vclient",
            CLUSTER_IP,
            PROXY_SOCK,
            a(9),
        ),
        (
            980_000,
            at(2, 2, Direction::Ingress),
            "client",
            "eth0",
            CLUSTER_IP,
            PROXY_SOCK,
            a(9),
        ),
    ];
    for (dt, point, ns, ifn, src, dst, m) in steps {
        // The UDP legs are the test's; CoreDNS's own query stays UDP.
        let p = if m.id == 512 { UDP } else { proto };
        f.see(t + dt, point, ns, ifn, p, src, dst, m);
    }
}

fn loops(f: &Feed) -> usize {
    f.out
        .iter()
        .filter(|r| {
            matches!(
                r,
                Record::Detected(crate::output::record::Detected::Loop(_))
            )
        })
        .count()
}

/// A miss: the app's question, redirected to the proxy, is the root; the proxy's query to
/// cluster DNS its child, CoreDNS's to the upstream the grandchild. Over UDP and TCP, with
/// conntrack's word on the redirect and without it (the answer says what was asked).
#[test]
fn a_pod_proxy_miss_is_one_tree_from_the_app_to_the_upstream() {
    for (proto, ct) in [(UDP, true), (UDP, false), (TCP, true), (TCP, false)] {
        let mut f = Feed::new();
        if ct {
            redirect_entry(&mut f, proto, APP);
        }
        let t0 = MS;
        app_asks(&mut f, t0, proto, APP, 7);
        proxy_asks_cluster_dns(&mut f, t0 + 100_000, proto);
        proxy_answers(&mut f, t0 + 1_200_000, proto, APP, 7);
        let txs = f.txs(20_000 * MS);
        assert_eq!(txs.len(), 1, "proto {proto} ct {ct}: {txs:#?}");
        let t = &txs[0];
        assert_eq!(t.outcome, Outcome::Answered, "{t:#?}");
        assert_eq!(t.legs.len(), 3, "{t:#?}");
        let app = &t.legs[0];
        assert_eq!(app.server.to_string(), CLUSTER_IP, "{t:#?}");
        assert_eq!(app.backend.to_string(), PROXY, "{t:#?}");
        assert_eq!(app.pod_proxy, Some(PodProxy::Miss), "{t:#?}");
        assert_eq!(app.role, LegRole::Query);
        let proxy = &t.legs[1];
        assert_eq!(proxy.parent, Some(0), "{t:#?}");
        assert_eq!(proxy.role, LegRole::Forward);
        assert_eq!(proxy.client.to_string(), PROXY_SOCK);
        assert_eq!(proxy.backend.to_string(), COREDNS);
        assert_eq!(proxy.pod_proxy, None);
        assert_eq!(t.legs[2].parent, Some(1), "{t:#?}");
        assert_eq!(t.legs[2].server.to_string(), "10.250.0.53:53");
        let json = serde_json::to_value(t).unwrap();
        assert_eq!(json["legs"][0]["pod_proxy"], "miss");
        assert!(json["legs"][1].get("pod_proxy").is_none(), "{json:#}");
        let text = text::transaction_block(t);
        assert!(
            text.contains("→ 10.96.0.10:53 ⇒REDIRECT 127.0.0.1:15053")
                && text.contains("pod proxy miss"),
            "{text}"
        );
        assert_eq!(loops(&f), 0, "{:#?}", f.out);
        assert_eq!(f.c.stats().orphan_responses, 0);
    }
}

/// A hit: the proxy answers from its cache, one leg, labelled `hit`.
#[test]
fn a_pod_proxy_hit_is_one_leg() {
    let mut f = Feed::new();
    redirect_entry(&mut f, UDP, APP);
    app_asks(&mut f, MS, UDP, APP, 7);
    proxy_answers(&mut f, MS + 80_000, UDP, APP, 7);
    let txs = f.txs(20_000 * MS);
    assert_eq!(txs.len(), 1, "{txs:#?}");
    assert_eq!(txs[0].legs.len(), 1);
    let l = &txs[0].legs[0];
    assert_eq!(l.pod_proxy, Some(PodProxy::Hit), "{l:#?}");
    assert_eq!(l.server.to_string(), CLUSTER_IP);
    assert_eq!(l.backend.to_string(), PROXY);
    assert_eq!(txs[0].outcome, Outcome::Answered);
    let json = serde_json::to_value(&txs[0]).unwrap();
    assert_eq!(json["legs"][0]["pod_proxy"], "hit");
}

/// Two apps of the pod asking one name at once, the proxy asking cluster DNS once for both:
/// two transactions (the second app's question, redirected to the proxy like the first, is
/// no forward of it, and no loop), both misses, the proxy's query in one of them.
#[test]
fn two_apps_asking_through_the_pod_proxy_at_once_are_two_transactions() {
    let app2 = "10.244.1.2:40001";
    let mut f = Feed::new();
    redirect_entry(&mut f, UDP, APP);
    redirect_entry(&mut f, UDP, app2);
    app_asks(&mut f, MS, UDP, APP, 7);
    app_asks(&mut f, MS + 20_000, UDP, app2, 8);
    proxy_asks_cluster_dns(&mut f, MS + 100_000, UDP);
    proxy_answers(&mut f, MS + 1_200_000, UDP, APP, 7);
    proxy_answers(&mut f, MS + 1_210_000, UDP, app2, 8);
    // And the other order: the proxy's query out before the second app asks.
    let (t1, app3, app4) = (5_000 * MS, "10.244.1.2:40003", "10.244.1.2:40004");
    redirect_entry(&mut f, UDP, app3);
    redirect_entry(&mut f, UDP, app4);
    app_asks(&mut f, t1, UDP, app3, 17);
    proxy_asks_cluster_dns(&mut f, t1 + 100_000, UDP);
    app_asks(&mut f, t1 + 200_000, UDP, app4, 18);
    proxy_answers(&mut f, t1 + 1_200_000, UDP, app3, 17);
    proxy_answers(&mut f, t1 + 1_210_000, UDP, app4, 18);
    f.c.tick(30_000 * MS, &mut f.out);
    assert_eq!(loops(&f), 0, "{:#?}", f.out);
    let txs = f.txs(40_000 * MS);
    assert_eq!(txs.len(), 4, "{txs:#?}");
    for pair in txs.chunks(2) {
        let legs: Vec<usize> = pair.iter().map(|t| t.legs.len()).collect();
        assert!(legs == [3, 1] || legs == [1, 3], "{pair:#?}");
        for t in pair {
            assert_eq!(t.outcome, Outcome::Answered, "{t:#?}");
            assert_eq!(t.legs[0].pod_proxy, Some(PodProxy::Miss), "{t:#?}");
            assert_eq!(t.legs[0].parent, None);
            assert!(t.legs.iter().all(|l| l.closes_loop.is_none()), "{t:#?}");
            assert!(
                t.legs
                    .iter()
                    .filter(|l| l.backend.to_string() == PROXY)
                    .count()
                    == 1,
                "one app a transaction: {t:#?}"
            );
        }
    }
    assert_eq!(f.c.stats().orphan_responses, 0);
}

/// Where it must not fire: the app's retry (redirected again) is a retry, not the
/// proxy's query; two apps of a node-level loopback stub are two transactions and the
/// stub's own query a forward with no pod proxy; two clients of one pod without a
/// redirect, asking cluster DNS themselves, are two transactions.
#[test]
fn retries_loopback_stubs_and_plain_clients_are_no_pod_proxy() {
    let mut f = Feed::new();
    // The app's retry from another socket after its first attempt went unanswered.
    let retry = "10.244.1.2:40010";
    redirect_entry(&mut f, UDP, APP);
    redirect_entry(&mut f, UDP, retry);
    app_asks(&mut f, MS, UDP, APP, 7);
    app_asks(&mut f, MS + 1_000 * MS, UDP, retry, 70);
    proxy_answers(&mut f, MS + 1_001 * MS, UDP, retry, 70);
    let txs = f.txs(30_000 * MS);
    assert_eq!(txs.len(), 1, "{txs:#?}");
    let t = &txs[0];
    assert_eq!(t.legs.len(), 2, "{t:#?}");
    assert_eq!(t.legs[1].role, LegRole::Retry, "{t:#?}");
    assert_eq!(t.legs[1].parent, None);
    assert_eq!(t.legs[1].pod_proxy, Some(PodProxy::Hit));
    assert_eq!(t.legs[0].pod_proxy, None, "unanswered: neither: {t:#?}");

    // Two apps of the node's own stub (127.0.0.53), and the stub's query from the node.
    let t1 = 40_000 * MS;
    let node_lo = |dir| at(1, 1, dir);
    for (k, (client, id)) in [("127.0.0.1:41000", 21), ("127.0.0.1:41001", 22)]
        .into_iter()
        .enumerate()
    {
        for dir in [Direction::Egress, Direction::Ingress] {
            f.see(
                t1 + k as u64 * 10_000,
                node_lo(dir),
                "node",
                "lo",
                UDP,
                client,
                "127.0.0.53:53",
                q(id),
            );
        }
    }
    f.see(
        t1 + 50_000,
        at(1, 3, Direction::Egress),
        "node",
        "eth0",
        UDP,
        "10.0.0.5:5000",
        "10.250.0.53:53",
        q(23),
    );
    f.see(
        t1 + 500_000,
        at(1, 3, Direction::Ingress),
        "node",
        "eth0",
        UDP,
        "10.250.0.53:53",
        "10.0.0.5:5000",
        a(23),
    );
    for (k, (client, id)) in [("127.0.0.1:41000", 21), ("127.0.0.1:41001", 22)]
        .into_iter()
        .enumerate()
    {
        for dir in [Direction::Egress, Direction::Ingress] {
            f.see(
                t1 + 600_000 + k as u64 * 10_000,
                node_lo(dir),
                "node",
                "lo",
                UDP,
                "127.0.0.53:53",
                client,
                a(id),
            );
        }
    }
    // Two clients of one pod asking cluster DNS, no redirect.
    let t2 = 45_000 * MS;
    for (k, (client, id)) in [("10.244.1.2:42000", 31), ("10.244.1.2:42001", 32)]
        .into_iter()
        .enumerate()
    {
        f.see(
            t2 + k as u64 * 10_000,
            at(2, 2, Direction::Egress),
            "client",
            "eth0",
            UDP,
            client,
            CLUSTER_IP,
            q(id),
        );
        f.see(
            t2 + 300_000 + k as u64 * 10_000,
            at(2, 2, Direction::Ingress),
            "client",
            "eth0",
            UDP,
            CLUSTER_IP,
            client,
            a(id),
        );
    }
    f.c.tick(70_000 * MS, &mut f.out);
    assert_eq!(loops(&f), 0, "{:#?}", f.out);
    let txs = f.txs(80_000 * MS);
    assert_eq!(txs.len(), 4, "{txs:#?}");
    let legs: Vec<usize> = txs.iter().map(|t| t.legs.len()).collect();
    assert_eq!(
        legs,
        [1, 2, 1, 1],
        "the stub's query under the newest app: {txs:#?}"
    );
    assert_eq!(txs[1].legs[1].role, LegRole::Forward);
    for t in &txs {
        assert!(t.legs.iter().all(|l| l.pod_proxy.is_none()), "{t:#?}");
    }
}
