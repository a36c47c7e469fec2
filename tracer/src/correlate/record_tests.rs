use super::*;
use crate::test_support::fixtures::{leg, transaction};

/// `failed` (`--failures`) and `troubled` (OTLP's always-exported) on a few transactions:
/// they differ only where an answer came past trouble that JSON reports elsewhere.
#[test]
fn failed_and_troubled_truth_tables() {
    let c = "10.244.1.2:5000";
    let s = "10.96.0.10:53";
    let answered = |rcode: &str| {
        let l = leg(LegRole::Query, c, s, s, Some(rcode), Some(1000));
        transaction("a.test.", "A", c, Some(rcode), vec![l])
    };
    let unanswered = transaction(
        "a.test.",
        "A",
        c,
        None,
        vec![leg(LegRole::Query, c, s, s, None, None)],
    );
    let dropped = {
        let l =
            crate::test_support::fixtures::dropped(leg(LegRole::Query, c, s, s, None, None), "X");
        transaction("a.test.", "A", c, None, vec![l])
    };
    let mut late = answered("NOERROR");
    late.outcome = Outcome::Late;
    let mut upstream_servfail = answered("NOERROR");
    let mut fwd = leg(LegRole::Forward, s, s, s, Some("SERVFAIL"), Some(10));
    fwd.parent = Some(0);
    upstream_servfail.legs.push(fwd);
    let mut after_timeout = answered("NOERROR");
    after_timeout.summary = Summary::Answered(Answered::AfterTimeout {
        timeout_ns: 5_000_000_000,
        drop: None,
    });
    let mut raced = answered("NOERROR");
    raced.legs[0].race_drop = true;
    let mut looped = answered("NOERROR");
    looped.legs[0].closes_loop = Some(Box::new(LegLoop {
        cycle: vec![0],
        hop_count: 0,
    }));

    let cases: [(&str, TransactionRecord, bool, bool); 11] = [
        ("NOERROR", answered("NOERROR"), false, false),
        ("NXDOMAIN", answered("NXDOMAIN"), false, false),
        ("SERVFAIL", answered("SERVFAIL"), true, true),
        ("REFUSED", answered("REFUSED"), true, true),
        ("unanswered", unanswered, true, true),
        ("dropped", dropped, true, true),
        ("late", late, true, true),
        ("upstream SERVFAIL", upstream_servfail, true, true),
        ("answered after a timeout", after_timeout, false, true),
        ("past a conntrack race", raced, false, true),
        ("through a forwarding loop", looped, false, true),
    ];
    for (what, t, failed, troubled) in cases {
        assert_eq!(t.failed(), failed, "{what}: failed");
        assert_eq!(t.is_failure(), failed, "{what}: --failures");
        assert_eq!(t.troubled(), troubled, "{what}: troubled");
    }
}
