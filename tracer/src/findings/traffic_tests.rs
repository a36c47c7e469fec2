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

const SVC: &str = "10.96.0.10:53";
const CACHE: &str = "169.254.20.10:53";
const UP: &str = "10.250.0.54:53";

/// A client's question through a chain of forwarders: `(server, outcome, rcode)` from the
/// client's leg down, each leg the child of the one before.
fn chain(id: u64, name: &str, legs: &[(&str, LegOutcome, Option<&str>)]) -> TransactionRecord {
    let (_, first, rcode) = legs[0];
    let outcome = match first {
        LegOutcome::Answered => Outcome::Answered,
        _ => Outcome::Unanswered,
    };
    let mut t = tx(id, id, name, outcome, rcode, first);
    let template = t.legs[0].clone();
    t.legs = legs
        .iter()
        .enumerate()
        .map(|(i, &(server, outcome, rcode))| LegRecord {
            id: id * 10 + i as u64,
            parent: i.checked_sub(1),
            role: if i == 0 {
                LegRole::Query
            } else {
                LegRole::Forward
            },
            server: addr(server),
            backend: addr(server),
            outcome,
            rcode: rcode.map(Into::into),
            ..template.clone()
        })
        .collect();
    t
}

fn server_findings(f: &TrafficFolder) -> Vec<Finding> {
    f.findings()
        .into_iter()
        .filter(|f| {
            matches!(
                f.kind,
                FindingKind::UnansweredQueries | FindingKind::Servfail
            )
        })
        .collect()
}

use LegOutcome::{Answered, Unanswered};

/// Both forwarders' failures caused by the upstream that never answers: one finding, the
/// cause's, with the symptom folded under it — not two of equal rank.
#[test]
fn an_upstreams_failures_are_one_finding_with_the_forwarders_folded_under_it() {
    let mut f = TrafficFolder::default();
    for i in 0..5 {
        let name = format!("q{i}.void.lab.test.");
        f.transaction(&chain(
            i,
            &name,
            &[(SVC, Unanswered, None), (UP, Unanswered, None)],
        ));
    }
    let found = server_findings(&f);
    let [one] = &found[..] else {
        panic!("{found:#?}")
    };
    assert_eq!(
        (one.kind, one.subject.as_str(), one.count),
        (FindingKind::UnansweredQueries, UP, 5)
    );
    assert_eq!(
        one.seen,
        "10.250.0.54:53 left 5 of 5 queries unanswered (100%), and so 10.96.0.10:53 left 5 of its 5 queries unanswered"
    );
    assert_eq!(
        one.evidence[0],
        "symptom: 10.96.0.10:53 left 5 of its 5 queries unanswered: each forwarded on to 10.250.0.54:53, where it went unanswered (joined legs)"
    );
    assert!(one
        .evidence
        .iter()
        .any(|e| e == "unanswered: q0.void.lab.test."));
    assert!(one.why.contains("not faults of their own"), "{}", one.why);

    // SERVFAIL from the forwarder because its upstream never answered: the same cause.
    let mut f = TrafficFolder::default();
    for i in 0..5 {
        let name = format!("q{i}.void.lab.test.");
        f.transaction(&chain(
            i,
            &name,
            &[(SVC, Answered, Some("SERVFAIL")), (UP, Unanswered, None)],
        ));
    }
    let found = server_findings(&f);
    let [one] = &found[..] else {
        panic!("{found:#?}")
    };
    assert_eq!(
        (one.kind, one.subject.as_str()),
        (FindingKind::UnansweredQueries, UP)
    );
    assert!(
        one.seen
            .ends_with("and so 10.96.0.10:53 answered SERVFAIL to 5 of its 5 queries"),
        "{}",
        one.seen
    );
}

/// node cache → cluster DNS → upstream: both in front are the upstream's symptoms.
#[test]
fn a_chain_of_forwarders_is_folded_under_its_last_server() {
    let mut f = TrafficFolder::default();
    for i in 0..4 {
        f.transaction(&chain(
            i,
            "x.void.test.",
            &[
                (CACHE, Unanswered, None),
                (SVC, Unanswered, None),
                (UP, Unanswered, None),
            ],
        ));
    }
    let found = server_findings(&f);
    let [one] = &found[..] else {
        panic!("{found:#?}")
    };
    assert_eq!(one.subject, UP);
    // The symptoms in the order of their servers' addresses.
    assert!(
        one.seen.ends_with(
            "and so 10.96.0.10:53 left 4 of its 4 queries unanswered and 169.254.20.10:53 left 4 of its 4 queries unanswered"
        ),
        "{}",
        one.seen
    );
    assert_eq!(
        one.evidence
            .iter()
            .filter(|e| e.starts_with("symptom: "))
            .count(),
        2
    );
}

/// A forwarder failing with a healthy upstream is its own finding; next to an upstream's
/// failures, each cause keeps its own finding with only its own queries.
#[test]
fn a_forwarder_failing_on_its_own_is_not_folded() {
    let mut f = TrafficFolder::default();
    for i in 0..5 {
        f.transaction(&chain(
            i,
            "own.lab.test.",
            &[(SVC, Unanswered, None), (UP, Answered, Some("NOERROR"))],
        ));
    }
    let found = server_findings(&f);
    let [one] = &found[..] else {
        panic!("{found:#?}")
    };
    assert_eq!((one.subject.as_str(), one.count), (SVC, 5));
    assert_eq!(
        one.seen,
        "10.96.0.10:53 left 5 of 5 queries unanswered (100%)"
    );
    assert!(!one.evidence.iter().any(|e| e.starts_with("symptom")));

    // And five more whose upstream never answered: two causes, two findings.
    for i in 5..10 {
        f.transaction(&chain(
            i,
            "void.lab.test.",
            &[(SVC, Unanswered, None), (UP, Unanswered, None)],
        ));
    }
    let mut found = server_findings(&f);
    // By subject as text: 10.250… before 10.96….
    found.sort_by(|a, b| a.subject.cmp(&b.subject));
    let [up, svc] = &found[..] else {
        panic!("{found:#?}")
    };
    assert_eq!((svc.subject.as_str(), svc.count), (SVC, 5));
    assert_eq!(
        svc.seen,
        "10.96.0.10:53 left 5 of 10 queries unanswered (50%)"
    );
    // Its own failures' names, not the upstream's.
    assert_eq!(svc.evidence, ["unanswered: own.lab.test."]);
    assert_eq!(up.evidence[1..], ["unanswered: void.lab.test."]);
    assert_eq!((up.subject.as_str(), up.count), (UP, 5));
    assert!(
        up.seen.contains("and so 10.96.0.10:53 left 5 of its 10"),
        "{}",
        up.seen
    );
}

/// An upstream too quiet to report is no cause: the forwarder's failures stay its finding.
#[test]
fn a_cause_below_the_threshold_folds_nothing() {
    let mut f = TrafficFolder::default();
    for i in 0..2 {
        f.transaction(&chain(
            i,
            "void.lab.test.",
            &[(SVC, Unanswered, None), (UP, Unanswered, None)],
        ));
    }
    f.transaction(&chain(
        2,
        "own.lab.test.",
        &[(SVC, Unanswered, None), (UP, Answered, Some("NOERROR"))],
    ));
    let found = server_findings(&f);
    let [one] = &found[..] else {
        panic!("{found:#?}")
    };
    assert_eq!((one.subject.as_str(), one.count), (SVC, 3));
    assert_eq!(
        one.evidence,
        ["unanswered: own.lab.test.", "unanswered: void.lab.test."]
    );
}
