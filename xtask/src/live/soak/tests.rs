use super::{
    load::{rate_at, rates},
    report::{loop_reports, LoopReports},
};

/// dnsperf's `-S` lines among its status lines, timed from the soak's start; a sample takes
/// the interval that ended nearest it, none farther than 6 s.
#[test]
fn dnsperf_interval_rates_are_read_and_matched_to_samples() {
    let out = "[Status] Command line: dnsperf -s 10.96.0.10 -S 10\n\
[Status] Started at: Thu Dec  3 12:28:05 2026\n\
1000.5: 9876.500000\n\
1010.5: 12.000000\n\
[Timeout] Query timed out: msg id 7\n\
Statistics:\n  Queries sent:         30\n";
    let r = rates(out, 990.0);
    assert_eq!(r, vec![(10.5, 9876.5), (20.5, 12.0)]);
    assert_eq!(rate_at(&r, 10), Some(9876.5));
    assert_eq!(rate_at(&r, 19), Some(12.0));
    assert_eq!(rate_at(&r, 30), None);
}

#[test]
fn loop_reports_tell_a_loop_reported_twice_from_a_question_asked_again() {
    let ev = |ty: &str, state: &str, q: &str, cycle: &str| {
        let (name, qtype) = q.split_once(' ').unwrap_or((q, "A"));
        serde_json::json!({"type": ty, "state": state, "question": {"name": name, "type": qtype, "class": "IN"}, "cycle": [cycle]})
    };
    let recs = vec![
        ev("agent", "start", "", ""),
        ev("loop", "detected", "a.", "x"),
        ev("loop", "detected", "a. AAAA", "x"), // the other type: another loop
        ev("loop", "ended", "a. AAAA", "x"),
        ev("loop", "detected", "a.", "x"), // twice while active
        ev("loop", "detected", "a.", "y"), // another cycle: another loop
        ev("loop", "ended", "a.", "x"),
        ev("loop", "ended", "a.", "x"),
        ev("loop", "detected", "a.", "x"), // asked again after its end
        ev("loop", "detected", "b.", "x"),
        ev("agent", "start", "", ""), // restarted: nothing is active
        ev("loop", "detected", "b.", "x"),
    ];
    assert_eq!(
        loop_reports(&recs),
        LoopReports {
            detected: 7,
            questions: 2,
            again_after_end: 2,
            again_while_active: 1,
        }
    );
}
