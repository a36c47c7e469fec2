use super::*;
use crate::{
    correlate::{
        record::Outcome,
        test_support::{at, msg, Feed, MS, UDP},
    },
    decode::dns::RrClass,
    event::Direction,
    output::{record::Record, report},
};

fn q(i: u64) -> QKey {
    QKey::new(format!("q{i}.scan.test."), RrType::A, RrClass::IN)
}

#[test]
fn client_questions_of_distinct_names_are_forgotten_once_stale() {
    let mut t = LoopTracker::new(Clock::boot(), &CorrelateConfig::default());
    // 1,000 distinct questions a second for 200 s: only the last seconds' are kept.
    for i in 0..200_000u64 {
        t.client_ask(&q(i), i * 1_000_000);
    }
    assert!(t.asks.len() <= 2 * SWEEP_AT, "{}", t.asks.len());
    // The current window is still there (the amplification baseline).
    assert!(t.asks.contains_key(&q(199_999)));
    assert!(!t.asks.contains_key(&q(0)));
}

#[test]
fn a_rate_above_the_sweep_size_keeps_sweeping_in_o1() {
    let mut t = LoopTracker::new(Clock::boot(), &CorrelateConfig::default());
    // 100,000 a second: 200,000 questions are current at any time.
    for i in 0..600_000u64 {
        t.client_ask(&q(i), i * 10_000);
    }
    assert!(t.asks.len() <= 2 * 200_001 + SWEEP_AT, "{}", t.asks.len());
    assert!(t.asks_sweep_at >= t.asks.len());
    t.check_bounds().unwrap();
}

/// The fuzz harness's check fires on a question counted towards a loop that is gone.
#[test]
fn check_bounds_fires_on_a_question_without_its_loop() {
    let mut t = LoopTracker::new(Clock::boot(), &CorrelateConfig::default());
    t.check_bounds().unwrap();
    t.by_question.insert(q(1), (q(1), Vec::new()));
    let e = t.check_bounds().unwrap_err();
    assert!(e.contains("counts towards no loop"), "{e}");
}

// Through the correlator, as the pipeline runs the detector.

/// Many clients asking the same name through a forwarder at a high rate is not an
/// amplification: the forwarder sends it on as often as it is asked.
#[test]
fn busy_forwarder_is_not_an_amplification() {
    let mut f = Feed::new();
    // 1.6 s at 500 queries/s: the rate windows of clients and forwards do not line up.
    for i in 0..800u64 {
        let t = MS + i * 2 * MS;
        let port = 10_000 + i as u16;
        let client = format!("10.244.1.2:{port}");
        let id = i as u16;
        f.see(
            t,
            at(1, 10, Direction::Ingress),
            "node",
            "vclient",
            UDP,
            &client,
            "10.96.0.10:53",
            msg(id, false, "busy.test.", "A", "NOERROR", &[], false),
        );
        f.see(
            t + 10_000,
            at(1, 11, Direction::Egress),
            "node",
            "vdnsa",
            UDP,
            &client,
            "10.244.1.3:53",
            msg(id, false, "busy.test.", "A", "NOERROR", &[], false),
        );
        f.see(
            t + 20_000,
            at(1, 11, Direction::Ingress),
            "node",
            "vdnsa",
            UDP,
            &format!("10.244.1.3:{port}"),
            "10.250.0.53:53",
            msg(id ^ 0x5555, false, "busy.test.", "A", "NOERROR", &[], false),
        );
        f.see(
            t + 90_000,
            at(1, 10, Direction::Egress),
            "node",
            "vclient",
            UDP,
            "10.96.0.10:53",
            &client,
            msg(id, true, "busy.test.", "A", "NOERROR", &["10.0.0.1"], false),
        );
        f.c.tick(t, &mut f.out);
    }
    f.c.tick(10_000 * MS, &mut f.out);
    let loops: Vec<_> = f
        .out
        .iter()
        .filter(|r| {
            matches!(
                r,
                Record::Detected(crate::output::record::Detected::Loop(_))
            )
        })
        .collect();
    assert!(loops.is_empty(), "{loops:#?}");
}

/// Five clients of a loopback stub asking one name at once are five transactions, each
/// answered, and no loop; a server asking itself over loopback (its own query re-entering
/// it) still is one.
#[test]
fn concurrent_loopback_clients_are_no_loop_but_a_self_forward_is() {
    let mut f = Feed::new();
    let lo = |dir| at(7, 1, dir);
    let t0 = MS;
    for i in 0..5u64 {
        let client = format!("127.0.0.1:{}", 40_000 + i);
        let q = msg(
            100 + i as u16,
            false,
            "same.test.",
            "A",
            "NOERROR",
            &[],
            false,
        );
        for dir in [Direction::Egress, Direction::Ingress] {
            f.see(
                t0 + i * 1000,
                lo(dir),
                "pod",
                "lo",
                UDP,
                &client,
                "127.0.0.1:53",
                q.clone(),
            );
        }
    }
    for i in (0..5u64).rev() {
        let client = format!("127.0.0.1:{}", 40_000 + i);
        let r = msg(
            100 + i as u16,
            true,
            "same.test.",
            "A",
            "NOERROR",
            &["192.0.2.1"],
            false,
        );
        for dir in [Direction::Egress, Direction::Ingress] {
            f.see(
                t0 + MS + i * 1000,
                lo(dir),
                "pod",
                "lo",
                UDP,
                "127.0.0.1:53",
                &client,
                r.clone(),
            );
        }
    }
    f.c.tick(t0 + 2000 * MS, &mut f.out);
    let loops = f
        .out
        .iter()
        .filter(|r| {
            matches!(
                r,
                Record::Detected(crate::output::record::Detected::Loop(_))
            )
        })
        .count();
    assert_eq!(loops, 0, "{:#?}", f.out);
    let txs = f.txs(t0 + 3000 * MS);
    assert_eq!(txs.len(), 5, "{txs:#?}");
    for t in &txs {
        assert_eq!(t.outcome, Outcome::Answered, "{t:#?}");
        assert_eq!(t.legs.len(), 1, "{t:#?}");
        assert_eq!(t.first_loop(), None, "no cycle marked: {t:#?}");
    }
    assert_eq!(f.c.stats().orphan_responses, 0);

    // A pod's server forwarding to 127.0.0.53, which is itself.
    let t1 = 10_000 * MS;
    let q = |id| msg(id, false, "self.test.", "A", "NOERROR", &[], false);
    f.see(
        t1,
        at(8, 2, Direction::Ingress),
        "dns",
        "eth0",
        UDP,
        "10.244.1.2:5000",
        "10.244.1.3:53",
        q(1),
    );
    for (k, port) in [(1u64, 6000), (2, 6001), (3, 6002)] {
        for dir in [Direction::Egress, Direction::Ingress] {
            let src = format!("127.0.0.1:{port}");
            f.see(
                t1 + k * 10_000,
                at(8, 1, dir),
                "dns",
                "lo",
                UDP,
                &src,
                "127.0.0.53:53",
                q(k as u16 + 1),
            );
        }
    }
    f.c.tick(t1 + 100 * MS, &mut f.out);
    let detected: Vec<_> = f
        .out
        .iter()
        .filter_map(|r| match r {
            Record::Detected(crate::output::record::Detected::Loop(l)) => Some(l),
            _ => None,
        })
        .collect();
    assert_eq!(detected.len(), 1, "{:#?}", f.out);
    assert!(
        detected[0]
            .cycle
            .iter()
            .all(|h| report::peer(&h.backend) == "127.0.0.53:53"),
        "{:#?}",
        detected[0]
    );
    // The transaction's record marks the leg that closed the cycle (what its spans read):
    // the second forward, delivered to the stub the first one was, a cycle of itself.
    let txs = f.txs(t1 + 30_000 * MS);
    let t = txs
        .iter()
        .find(|t| t.question.name == "self.test.")
        .expect("the self-forward's transaction");
    let (closing, lp) = t.first_loop().expect("a cycle marked");
    let leg = &t.legs[closing];
    assert_eq!(leg.backend.to_string(), "127.0.0.53:53", "{t:#?}");
    assert_eq!(lp.cycle, [closing], "{t:#?}");
    assert_eq!(lp.hop_count, 2, "{t:#?}");
    assert_eq!(
        leg.parent.map(|p| t.legs[p].closes_loop.is_none()),
        Some(true)
    );
}

impl crate::detect::Sample for LoopRecord {
    fn sample() -> Self {
        let mut lp = crate::test_support::fixtures::loop_record(1, LoopState::Detected, 1);
        lp.evidence = Some("DIR/dnspath-x-loop.pcapng".into());
        lp
    }
}
