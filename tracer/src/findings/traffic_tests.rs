use super::*;
use crate::correlate::{
    record::{Join, LegOutcome, LegRecord, LookupRef, QuestionRecord},
    LegRole,
};

fn addr(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

fn tx(
    id: u64,
    lookup: u64,
    name: &str,
    outcome: Outcome,
    rcode: Option<&str>,
    leg: LegOutcome,
) -> TransactionRecord {
    TransactionRecord {
        evidence: None,
        pod: Default::default(),
        id,
        lookup: LookupRef {
            id: lookup,
            step: 0,
        },
        ts_ns: 1,
        wall_ns: 1,
        client: addr("10.244.1.2:1000"),
        client_netns: "lab-client".into(),
        question: QuestionRecord::new(name, "A".into(), "IN".into()),
        outcome,
        rcode: rcode.map(Into::into),
        answers: if rcode == Some("NOERROR") {
            vec!["A 10.0.0.1".into()]
        } else {
            Vec::new()
        },
        answer_cut: None,
        latency_ns: None,
        summary: if outcome == Outcome::Late {
            Summary::Late {
                answer_ns: 1_600_000_000,
                gave_up_ns: Some(1_000_000_000),
                reason: "NO_SOCKET".into(),
                location: "__udp4_lib_rcv".into(),
                retried: false,
            }
        } else {
            Summary::Pending
        },
        legs: vec![LegRecord {
            id,
            parent: None,
            role: LegRole::Query,
            proto: crate::decode::record::Proto::Udp,
            client: addr("10.244.1.2:1000"),
            server: addr("10.96.0.10:53"),
            backend: addr("10.244.1.3:53"),
            dns_id: 1,
            join: Join::SameTuple,
            outcome: leg,
            rcode: rcode.map(Into::into),
            answers: Vec::new(),
            answer_cut: None,
            latency_ns: None,
            retransmits: 0,
            drop: None,
            node_cache: None,
            pod_proxy: None,
            hops: Vec::new(),
            race_drop: false,
            closes_loop: None,
            node: None,
        }],
        nodes: Vec::new(),
    }
}

#[test]
fn healthy_load_is_no_finding() {
    let mut f = TrafficFolder::default();
    for i in 0..1000 {
        f.transaction(&tx(
            i,
            i,
            "www.lab.test.",
            Outcome::Answered,
            Some("NOERROR"),
            LegOutcome::Answered,
        ));
    }
    // One lost datagram among a thousand, and a couple of unanswered: under the thresholds.
    f.transaction(&tx(
        2000,
        2000,
        "x.lab.test.",
        Outcome::Unanswered,
        None,
        LegOutcome::Unanswered,
    ));
    f.transaction(&tx(
        2001,
        2001,
        "y.lab.test.",
        Outcome::Unanswered,
        None,
        LegOutcome::Unanswered,
    ));
    assert!(f.findings().is_empty(), "{:#?}", f.findings());
}

#[test]
fn unanswered_over_threshold_is_a_finding() {
    let mut f = TrafficFolder::default();
    for i in 0..10 {
        f.transaction(&tx(
            i,
            i,
            "x.lab.test.",
            Outcome::Unanswered,
            None,
            LegOutcome::Unanswered,
        ));
    }
    let found = f.findings();
    assert_eq!(found.len(), 1, "{found:#?}");
    assert_eq!(found[0].kind, FindingKind::UnansweredQueries);
    assert_eq!(found[0].subject, "10.96.0.10:53");
    assert_eq!(found[0].count, 10);
}

/// SERVFAIL goes through the same thresholds as unanswered queries: 3 of 100 (3 %) is no
/// finding, 6 of 100 is, with its title and examples.
#[test]
fn servfail_over_threshold_is_a_finding() {
    let fold = |servfails: u64| {
        let mut f = TrafficFolder::default();
        for i in 0..100 {
            let rcode = if i < servfails { "SERVFAIL" } else { "NOERROR" };
            f.transaction(&tx(
                i,
                i,
                "sf.lab.test.",
                Outcome::Answered,
                Some(rcode),
                LegOutcome::Answered,
            ));
        }
        f.findings()
    };
    assert!(fold(3).is_empty(), "{:#?}", fold(3));
    let found = fold(6);
    assert_eq!(found.len(), 1, "{found:#?}");
    assert_eq!(found[0].kind, FindingKind::Servfail);
    assert_eq!(found[0].subject, "10.96.0.10:53");
    assert_eq!(found[0].count, 6);
    assert_eq!(
        found[0].seen,
        "10.96.0.10:53 answered SERVFAIL to 6 of 100 queries"
    );
    assert_eq!(found[0].evidence, ["SERVFAIL: sf.lab.test."]);
}

#[test]
fn a_late_answer_is_a_finding_with_its_times() {
    let mut f = TrafficFolder::default();
    f.transaction(&tx(
        1,
        1,
        "late.lab.test.",
        Outcome::Late,
        Some("NOERROR"),
        LegOutcome::Late,
    ));
    let found = f.findings();
    assert_eq!(found.len(), 1, "{found:#?}");
    assert_eq!(found[0].kind, FindingKind::LateAnswers);
    assert_eq!(found[0].subject, "lab-client");
    assert!(found[0]
        .evidence
        .iter()
        .any(|e| e == "answer came at +1.60 s"));
    assert!(found[0]
        .evidence
        .iter()
        .any(|e| e == "client's own timeout 1.00 s"));
}

/// `lookups` lookups of `asked` by one client, each through `expansions` NXDOMAINs and then
/// answered at `answered` (the name asked, or one of its expansions).
fn search_lookups(f: &mut TrafficFolder, lookups: u64, expansions: &[&str], answered: &str) {
    let mut id = 0;
    for lookup in 0..lookups {
        for name in expansions {
            id += 1;
            f.transaction(&tx(
                id,
                lookup,
                name,
                Outcome::Answered,
                Some("NXDOMAIN"),
                LegOutcome::Answered,
            ));
        }
        id += 1;
        f.transaction(&tx(
            id,
            lookup,
            answered,
            Outcome::Answered,
            Some("NOERROR"),
            LegOutcome::Answered,
        ));
        if lookup == 0 {
            assert!(f.findings().is_empty());
        }
    }
}

const SEARCH: [&str; 3] = [
    "default.svc.cluster.local.",
    "svc.cluster.local.",
    "cluster.local.",
];

fn expansions(name: &str, n: usize) -> Vec<String> {
    SEARCH[..n].iter().map(|s| format!("{name}.{s}")).collect()
}

fn savings(f: &Finding) -> Option<&str> {
    f.evidence
        .iter()
        .find(|e| e.starts_with("a trailing dot"))
        .map(String::as_str)
}

#[test]
fn ndots_amplification_needs_many_lookups() {
    let mut f = TrafficFolder::default();
    let ex = expansions("api.example.com", 3);
    let ex: Vec<&str> = ex.iter().map(String::as_str).collect();
    search_lookups(&mut f, NDOTS_MIN_LOOKUPS, &ex, "api.example.com.");
    let found = f.findings();
    assert_eq!(found.len(), 1, "{found:#?}");
    assert_eq!(found[0].kind, FindingKind::NdotsAmplification);
    assert_eq!(found[0].count, NDOTS_MIN_LOOKUPS);
    assert!(
        found[0].evidence.contains(
            &"40 queries for these 10 lookups (4.0 per lookup), 30 of them NXDOMAIN".into()
        ),
        "{found:#?}"
    );
    // Two dots: asked first under `ndots:2` too.
    assert_eq!(
        savings(&found[0]),
        Some("a trailing dot on the names asked would save 30 of the 40 queries (75%); `ndots:2` would save 30 (75%)"),
    );
}

#[test]
fn ndots_2_saves_nothing_for_a_name_of_one_dot() {
    let mut f = TrafficFolder::default();
    let ex = expansions("example.com", 2);
    let ex: Vec<&str> = ex.iter().map(String::as_str).collect();
    search_lookups(&mut f, NDOTS_MIN_LOOKUPS, &ex, "example.com.");
    let found = f.findings();
    assert_eq!(
        savings(&found[0]),
        Some("a trailing dot on the names asked would save 20 of the 30 queries (66%); `ndots:2` would save 0 (0%)"),
    );
}

/// A short name answered at its third search domain (a Service of another namespace asked
/// by its short name) is amplified, but no trailing dot would have helped: no savings said.
#[test]
fn a_name_answered_through_its_search_list_has_no_savings() {
    let mut f = TrafficFolder::default();
    let ex = expansions("web", 2);
    let ex: Vec<&str> = ex.iter().map(String::as_str).collect();
    search_lookups(&mut f, NDOTS_MIN_LOOKUPS, &ex, "web.cluster.local.");
    let found = f.findings();
    assert_eq!(found[0].kind, FindingKind::NdotsAmplification);
    assert_eq!(savings(&found[0]), None, "{found:#?}");
    // A name that only shares a prefix with the expansions is not the name asked.
    let l = LookupAgg {
        queries: 2,
        nxdomains: 1,
        first_nx: Some("webs.default.svc.cluster.local.".into()),
        answered: Some("web.".into()),
    };
    assert_eq!(l.asked_dots(), None);
}

/// Two questions entering one cycle at its two servers are one cycle, one finding.
#[test]
fn each_rotation_of_a_cycle_is_one_key() {
    let p = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let a_b = from_least(p(&["10.244.1.4:53 (node)", "10.244.1.3:53 (node)"]));
    let b_a = from_least(p(&["10.244.1.3:53 (node)", "10.244.1.4:53 (node)"]));
    assert_eq!(a_b, b_a);
    assert_eq!(a_b[0], "10.244.1.3:53 (node)");
    let three = from_least(p(&["c", "a", "b"]));
    assert_eq!(
        three,
        p(&["a", "b", "c"]),
        "the order round the cycle is kept"
    );
    assert_ne!(
        from_least(p(&["a", "c", "b"])),
        three,
        "the other direction is another cycle"
    );
    assert!(from_least(Vec::new()).is_empty());
}
