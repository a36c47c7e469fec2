use super::*;
use crate::{
    correlate::{
        test_support::{at, msg, Feed, MS, UDP},
        Observed,
    },
    decode::dns::DnsMessage,
    detect::race,
    event::Direction,
    output::{record::Record, report},
    test_support::fixtures::ct_flow,
};

fn ct(status: u64) -> CtSnapshot {
    let f = |s, d| ct_flow(UDP.number(), s, d);
    CtSnapshot {
        status,
        orig: f("10.244.1.2:5000", "10.96.0.10:53"),
        reply: f("10.244.1.3:53", "10.244.1.2:5000"),
    }
}

/// Samples of more namespaces than kept, more samples than kept: within the bounds the
/// fuzz harness checks.
#[test]
fn conntrack_samples_stay_bounded() {
    let mut s = CtSamples::default();
    for i in 0..3000u64 {
        s.add(CtStatsSample {
            ts_ns: i,
            netns: i % 1500,
            per_cpu: Vec::new(),
        });
        s.check_bounds().unwrap();
    }
    for i in 0..100u64 {
        s.add(CtStatsSample {
            ts_ns: 10_000 + i,
            netns: 7,
            per_cpu: Vec::new(),
        });
    }
    s.check_bounds().unwrap();
    s.by_netns.entry(7).or_default().push_back(CtStatsSample {
        ts_ns: 0,
        netns: 7,
        per_cpu: Vec::new(),
    });
    assert!(s.check_bounds().unwrap_err().contains("65 > 64"));
}

/// docs/lab.md's table of what the kernel shows for each kind of drop.
#[test]
fn races_and_rule_drops_tell_apart() {
    assert!(is_race_candidate(
        "NETFILTER_DROP",
        "nf_hook_slow",
        Some(&ct(0x1a0)),
        None
    ));
    assert!(is_race_candidate(
        "NETFILTER_DROP",
        "nf_hook_slow",
        Some(&ct(0x180)),
        None
    ));
    assert!(is_race_candidate(
        "NOT_SPECIFIED",
        "nfqnl_reinject",
        Some(&ct(0x120)),
        None
    ));
    // no reason (< 5.17): location and state decide
    assert!(is_race_candidate(
        "UNKNOWN",
        "nf_hook_slow",
        Some(&ct(0x1a0)),
        None
    ));
    assert!(!is_race_candidate(
        "UNKNOWN",
        "nf_hook_slow",
        Some(&ct(0x120)),
        None
    ));
    // iptables-nft and iptables-legacy DROP rules
    assert!(!is_race_candidate(
        "NETFILTER_DROP",
        "nft_do_chain",
        Some(&ct(0x120)),
        None
    ));
    assert!(!is_race_candidate(
        "NETFILTER_DROP",
        "nf_hook_slow",
        Some(&ct(0x120)),
        None
    ));
    // confirmed entry, NAT not done yet, no conntrack
    assert!(!is_race_candidate(
        "NETFILTER_DROP",
        "nf_hook_slow",
        Some(&ct(0x1a8)),
        None
    ));
    assert!(!is_race_candidate(
        "NETFILTER_DROP",
        "nf_hook_slow",
        Some(&ct(0x100)),
        None
    ));
    assert!(!is_race_candidate(
        "NETFILTER_DROP",
        "nf_hook_slow",
        None,
        None
    ));
    // The kernel's own word, where the confirm hook is loaded, settles it either way
    // the heuristics would go.
    assert!(is_race_candidate(
        "NETFILTER_DROP",
        "nf_hook_slow",
        Some(&ct(0x120)),
        Some(true)
    ));
    assert!(is_race_candidate(
        "NOT_SPECIFIED",
        "nfqnl_reinject",
        None,
        Some(true)
    ));
}

#[test]
fn counter_growth_around_a_drop() {
    let sample =
        |ts, insert_failed, clash| crate::test_support::ct_sample(ts, 7, insert_failed, clash);
    let mut s = CtSamples::default();
    assert!(s.add(sample(100, 5, 0)).is_empty());
    assert!(s.around(7, 1, 150).is_none());
    assert_eq!(s.add(sample(200, 6, 3)), vec![(1, 3)]);
    let d = s.around(7, 1, 150).unwrap();
    assert_eq!((d.insert_failed, d.drop, d.clash_resolve), (1, 1, 3));
    assert_eq!(s.around(7, 0, 150).unwrap().insert_failed, 0);
    assert!(s.has_after(7, 150));
}

// Through the correlator, as the pipeline runs the detector.

/// Conntrack statistics of netns 1 at `ts`: CPU 1 with `insert_failed` (and `drop`) at the
/// given total, CPU 0 with none.
fn ct_sample(ts: u64, insert_failed: u64) -> crate::event::CtStatsSample {
    crate::test_support::ct_sample(ts, 1, insert_failed, 0)
}

/// The race records among `out`.
fn race_records(out: &[Record]) -> Vec<race::RaceRecord> {
    out.iter()
        .filter_map(|r| match r {
            Record::Detected(crate::output::record::Detected::Race(r)) => {
                Some(race::RaceRecord::clone(r))
            }
            _ => None,
        })
        .collect()
}

/// A kernel drop at `nf_hook_slow` on CPU 1 of netns 1 (`node`, `vclient`) of `client`'s
/// query `m` to the ClusterIP, DNAT'd to 10.244.1.3:53, its conntrack entry in `status`.
fn dnat_drop(ts: u64, client: &str, status: u64, m: DnsMessage) -> Observed {
    let flow = |s, d| ct_flow(UDP.number(), s, d);
    Observed::Drop(Box::new(DropObservation {
        ts_ns: ts,
        cpu: 1,
        netns_cookie: 1,
        netns: "node".into(),
        ifname: "vclient".into(),
        reason: "NETFILTER_DROP".into(),
        location: "nf_hook_slow+0x9e".into(),
        function: "nf_hook_slow".into(),
        benign: false,
        proto: UDP,
        src: client.parse().unwrap(),
        dst: "10.244.1.3:53".parse().unwrap(),
        confirm_failed: None,
        ct: Some(CtSnapshot {
            status,
            orig: flow(client, "10.96.0.10:53"),
            reply: flow("10.244.1.3:53", client),
        }),
        msg: Some(m.into()),
        fragment: None,
    }))
}

/// glibc's A and AAAA from one socket; the A fails to confirm (insert_failed +1 on CPU 1),
/// is dropped, and retried at the timeout.
#[test]
fn race_drop_with_counters_sibling_and_retry() {
    let mut f = Feed::new();
    f.c.on_ct_stats(ct_sample(0, 7));
    let client = "10.244.1.2:5000";
    let p_in = at(1, 10, Direction::Ingress);
    let q = |id, t| msg(id, false, "api.lab.test.", t, "NOERROR", &[], false);
    f.see(
        10 * MS,
        p_in,
        "node",
        "vclient",
        UDP,
        client,
        "10.96.0.10:53",
        q(1, "A"),
    );
    f.see(
        10 * MS + 400_000,
        p_in,
        "node",
        "vclient",
        UDP,
        client,
        "10.96.0.10:53",
        q(2, "AAAA"),
    );
    f.see(
        10 * MS + 500_000,
        at(1, 11, Direction::Egress),
        "node",
        "vdnsb",
        UDP,
        client,
        "10.244.1.4:53",
        q(2, "AAAA"),
    );
    f.see(
        11 * MS,
        at(1, 10, Direction::Egress),
        "node",
        "vclient",
        UDP,
        "10.96.0.10:53",
        client,
        msg(2, true, "api.lab.test.", "AAAA", "NOERROR", &[], false),
    );
    f.c.on_observed(dnat_drop(10 * MS + 600_000, client, 0x1a0, q(1, "A")));
    f.c.on_ct_stats(ct_sample(200 * MS, 8));
    // glibc retries the A at its timeout, same socket.
    let retry = 10 * MS + 5_000 * MS;
    f.see(
        retry,
        p_in,
        "node",
        "vclient",
        UDP,
        client,
        "10.96.0.10:53",
        q(3, "A"),
    );
    f.see(
        retry + MS,
        at(1, 10, Direction::Egress),
        "node",
        "vclient",
        UDP,
        "10.96.0.10:53",
        client,
        msg(
            3,
            true,
            "api.lab.test.",
            "A",
            "NOERROR",
            &["10.0.0.7"],
            false,
        ),
    );
    f.c.tick(9_000 * MS, &mut f.out);
    let races = race_records(&f.out);
    assert_eq!(races.len(), 1, "{races:#?}");
    let r = &races[0];
    assert_eq!(r.verdict, race::RaceVerdict::RaceDrop);
    assert!(r.counter_confirmed);
    assert_eq!(r.counters.insert_failed, 1);
    assert_eq!(r.cpu, Some(1));
    let dropped = r.dropped.as_ref().unwrap();
    assert_eq!(
        (
            dropped.dns_id,
            dropped.question.qtype.name().as_ref(),
            dropped.backend.to_string().as_str()
        ),
        (1, "A", "10.244.1.3:53")
    );
    let sibling = r.sibling.as_ref().unwrap();
    assert_eq!(
        (
            sibling.dns_id,
            sibling.question.qtype.name().as_ref(),
            sibling.backend.to_string().as_str()
        ),
        (2, "AAAA", "10.244.1.4:53")
    );
    assert_eq!(r.retry_ns, Some(5_000 * MS));
    assert!(report::race_summary(r).starts_with("lookup of api.lab.test. took 5.00 s: A dropped by conntrack race at +600 µs, retried at +5.00 s"), "{}", report::race_summary(r));
    assert_eq!(f.c.stats().detect.races.race_drops, 1);
}

/// The A fails to confirm and is dropped, but dnspath never read the query itself (lost in a
/// flood, or its leg gone): the drop is still reported as a race drop, with the counters
/// sampled after it, and says so; a rule's drop of a confirmed entry is not.
#[test]
fn race_drop_of_a_query_never_read_is_still_reported() {
    let mut f = Feed::new();
    f.c.on_ct_stats(ct_sample(0, 7));
    let drop = |ts: u64, port: u16, status: u64| {
        let m = msg(9, false, "lost.lab.test.", "A", "NOERROR", &[], false);
        dnat_drop(ts, &format!("10.244.1.2:{port}"), status, m)
    };
    // A failed confirm (NAT done, not confirmed), and a rule's drop (confirmed: 0x8).
    f.c.on_observed(drop(10 * MS, 5000, 0x1a0));
    f.c.on_observed(drop(20 * MS, 5001, 0x1a8));
    // Not before the counters after it are sampled.
    f.c.tick(150 * MS, &mut f.out);
    assert!(!f.out.iter().any(|r| matches!(
        r,
        Record::Detected(crate::output::record::Detected::Race(_))
    )));
    f.c.on_ct_stats(ct_sample(200 * MS, 8));
    f.c.tick(300 * MS, &mut f.out);
    let races = race_records(&f.out);
    assert_eq!(races.len(), 1, "{races:#?}");
    let r = &races[0];
    assert_eq!(r.verdict, race::RaceVerdict::RaceDrop);
    assert!(r.counter_confirmed);
    assert_eq!(r.client.unwrap().to_string(), "10.244.1.2:5000");
    let dropped = r.dropped.as_ref().unwrap();
    assert_eq!(
        (dropped.dns_id, dropped.backend.to_string().as_str()),
        (9, "10.244.1.3:53")
    );
    assert_eq!(
        report::race_summary(r),
        "lookup of lost.lab.test.: A dropped by conntrack race (the query itself was not read), no retry seen"
    );
    let s = f.c.stats();
    assert_eq!((s.detect.races.race_drops, s.drops_unmatched), (1, 2));
    // Nothing more at the end.
    while f.c.flush(10_000 * MS, 1024, &mut f.out) {}
    assert_eq!(
        f.out
            .iter()
            .filter(|r| matches!(
                r,
                Record::Detected(crate::output::record::Detected::Race(_))
            ))
            .count(),
        1
    );
}

impl crate::detect::Sample for RaceRecord {
    fn sample() -> Self {
        let mut race =
            crate::test_support::fixtures::race(RaceVerdict::RaceDrop, "10.244.1.2:1", 1, "A");
        race.evidence = Some("DIR/dnspath-x-race-drop.pcapng".into());
        race
    }
}
