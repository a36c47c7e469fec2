//! The correlator's bounds: its tables under floods, eviction, the reorder window, timeouts
//! and the end of input.
use super::test_support::{at, msg, Correlator, Feed, MS, UDP};
use super::*;
use crate::{event::Direction, output::record::Record};

#[test]
fn a_flood_of_unanswered_queries_stays_bounded() {
    let cfg = CorrelateConfig {
        max_legs: 1000,
        ..Default::default()
    };
    let mut c = Correlator::new(cfg, Clock::Epoch);
    let mut out: Vec<Record> = vec![];
    for i in 0..20_000u32 {
        c.on_observed(Observed::Message(Observation {
            ts_ns: u64::from(i) * 1000,
            at: at(1, 1, Direction::Egress),
            netns: "c".into(),
            ifname: "eth0".into(),
            proto: UDP,
            src: format!("10.0.{}.{}:{}", i / 250 % 250, i % 250, 1024 + i % 60000)
                .parse()
                .unwrap(),
            dst: "10.96.0.10:53".parse().unwrap(),
            msg: msg(
                i as u16,
                false,
                &format!("n{i}.flood.test."),
                "A",
                "NOERROR",
                &[],
                false,
            )
            .into(),
            tunnel: None,
        }));
        if i % 100 == 0 {
            c.tick(u64::from(i) * 1000, &mut out);
        }
        assert!(c.open_legs() <= 1000);
        assert!(c.pending.len() <= 1000);
    }
    let s = c.stats();
    assert!(s.evicted_legs >= 19_000 - 1000, "{s:?}");
    assert_eq!(s.evicted_legs, s.evicted_transactions);
}

#[test]
fn eviction_takes_the_oldest_open_transactions_among_reported_ones() {
    let mut f = Feed {
        c: Correlator::new(
            CorrelateConfig {
                max_legs: 1_000,
                ..Default::default()
            },
            Clock::Epoch,
        ),
        out: vec![],
    };
    let (mut reported, mut newest_unanswered) = (0, Vec::new());
    for i in 0..6_000u32 {
        let ts = u64::from(i) * MS;
        let client = format!("10.0.{}.{}:{}", i / 250 % 250, i % 250, 1024 + i);
        let name = format!("n{i}.evict.test.");
        let m = |qr| msg(i as u16, qr, &name, "A", "NOERROR", &[], false);
        let p = at(1, 1, Direction::Egress);
        f.see(ts, p, "c", "eth0", UDP, &client, "10.96.0.10:53", m(false));
        // Two of three are answered at once (reported, their ids left behind in the
        // order queue); the third never is.
        if i % 3 != 0 {
            f.see(
                ts + 1,
                p,
                "c",
                "eth0",
                UDP,
                "10.96.0.10:53",
                &client,
                m(true),
            );
        } else {
            newest_unanswered.push(ts);
        }
        reported += f.txs(ts).len();
        assert!(f.c.open_legs() <= 1_000);
        // At most twice the most transactions open at once (each has a leg) and a bit.
        assert!(
            f.c.tx_order.len() <= 2 * 1_000 + 65,
            "{} ids queued for {} transactions",
            f.c.tx_order.len(),
            f.c.txs.len()
        );
    }
    assert!(reported > 3_000, "{reported} reported");
    let s = f.c.stats();
    assert!(s.evicted_transactions > 500, "{s:?}");
    // What is left open is the newest unanswered queries (and answered ones not yet
    // settled), never an older one kept over a newer: every unanswered query since the
    // oldest open one is open (but the last ones, still in the reorder window).
    let open: Vec<u64> = f.c.txs.values().map(|t| t.first_ts).collect();
    let oldest_open = open.iter().copied().min().unwrap();
    let gone: Vec<&u64> = newest_unanswered
        .iter()
        .filter(|&&ts| ts >= oldest_open && ts < 5_900 * MS && !open.contains(&ts))
        .collect();
    assert!(
        gone.is_empty(),
        "newer than {oldest_open} but gone: {gone:?}"
    );
    assert!(oldest_open > 2_000 * MS, "{oldest_open}");
}

#[test]
fn out_of_order_arrival_is_reordered() {
    let mut f = Feed::new();
    let p_out = at(3, 2, Direction::Egress);
    // The response is handed over before its query (different CPUs).
    f.see(
        MS + 500_000,
        at(3, 2, Direction::Ingress),
        "c",
        "eth0",
        UDP,
        "10.250.0.53:53",
        "10.244.1.2:5000",
        msg(1, true, "o.test.", "A", "NOERROR", &["10.0.0.1"], false),
    );
    f.see(
        MS,
        p_out,
        "c",
        "eth0",
        UDP,
        "10.244.1.2:5000",
        "10.250.0.53:53",
        msg(1, false, "o.test.", "A", "NOERROR", &[], false),
    );
    let txs = f.txs(1_000 * MS);
    assert_eq!(txs.len(), 1);
    assert_eq!(txs[0].outcome, Outcome::Answered);
    assert_eq!(f.c.stats().orphan_responses, 0);
}

/// Questions forwarded client → ClusterIP → pod A → pod B, each query seen at ten points
/// (a loop's legs before it is known as one, a busy node's): `n` of them from `t0`, `gap`
/// apart, none answered.
fn forward_storm(c: &mut Correlator, out: &mut Vec<Record>, n: u32, t0: u64, gap: u64) {
    for i in 0..n {
        let ts = t0 + u64::from(i) * gap;
        let name = format!("s{i}.storm.test.");
        let client = format!("10.0.{}.{}:{}", i / 250 % 250, i % 250, 1024 + i % 60000);
        let legs = [
            (client.as_str(), "10.96.0.10:53", "10.244.1.3:53"),
            ("10.244.1.3:40000", "10.96.0.10:53", "10.244.1.4:53"),
        ];
        for (li, (src, dst, backend)) in legs.into_iter().enumerate() {
            let m: Arc<DnsMessage> = msg(
                i as u16 ^ (li as u16) << 15,
                false,
                &name,
                "A",
                "NOERROR",
                &[],
                false,
            )
            .into();
            for k in 0..10u32 {
                c.on_observed(Observed::Message(Observation {
                    ts_ns: ts + u64::from(k) * 1_000 + li as u64 * 20_000,
                    at: at(1, 10 + k + 20 * li as u32, Direction::Egress),
                    netns: "node".into(),
                    ifname: format!("veth{k}").into(),
                    proto: UDP,
                    src: src.parse().unwrap(),
                    dst: (if k < 5 { dst } else { backend }).parse().unwrap(),
                    msg: Arc::clone(&m),
                    tunnel: None,
                }));
            }
        }
        if i % 64 == 0 {
            c.tick(ts, out);
        }
    }
    c.tick(t0 + u64::from(n) * gap, out);
}

/// The leg table's count of its bytes covers what the legs, their hops and indexes (and
/// their transactions) take from the allocator: `max_leg_bytes` bounds memory.
#[test]
fn the_leg_tables_bytes_cover_what_they_take() {
    let (c, taken) = crate::memory::heap_bytes_of(|| {
        let mut c = Correlator::new(
            CorrelateConfig {
                max_leg_bytes: usize::MAX,
                ..Default::default()
            },
            Clock::Epoch,
        );
        forward_storm(&mut c, &mut vec![], 20_000, MS, 100_000);
        c
    });
    let Some(taken) = taken else {
        eprintln!("system allocator: no heap figure");
        return;
    };
    let (legs, counted) = (c.open_legs(), c.legs.bytes());
    eprintln!(
        "{legs} legs open: {taken} bytes taken ({} a leg), {counted} counted ({} a leg)",
        taken / legs.max(1),
        counted / legs.max(1),
    );
    assert!(legs > 30_000, "{legs}");
    assert!(counted >= taken, "{counted} counted, {taken} taken");
    assert!(counted <= 3 * taken, "{counted} counted, {taken} taken");
}

/// Under a storm of new legs with many hops the legs stay within their byte budget: the
/// oldest transactions go, counted, and the tables give their room back once it is over.
#[test]
fn a_storm_of_legs_stays_within_its_byte_budget() {
    let budget = 4 << 20;
    let (mut c, taken) = crate::memory::heap_bytes_of(|| {
        let mut c = Correlator::new(
            CorrelateConfig {
                max_leg_bytes: budget,
                ..Default::default()
            },
            Clock::Epoch,
        );
        forward_storm(&mut c, &mut vec![], 20_000, MS, 100_000);
        c
    });
    assert!(c.legs.bytes() <= budget, "{} > {budget}", c.legs.bytes());
    if let Some(taken) = taken {
        // The legs within their budget; beyond it, what is kept per question and client
        // (lookups, loop baselines, recent client queries: each capped in entries, not
        // bytes), measured at about 750 bytes a question, and the reorder window.
        eprintln!("{taken} bytes taken for 20,000 questions, {budget} of legs");
        assert!(taken <= budget + 20_000 * 1024, "{taken} bytes taken");
    }
    let s = c.stats();
    assert!(s.evicted_transactions > 10_000, "{s:?}");
    assert_eq!(s.evicted_legs, 2 * s.evicted_transactions, "{s:?}");
    // Every question unanswered: reported at the timeout; then the tables are small again.
    c.tick(20 * 1_000 * MS, &mut Vec::<Record>::new());
    assert_eq!(c.open_legs(), 0);
    assert_eq!(c.legs.bytes(), 0);
}

/// Hops added to open legs count towards the byte budget at once: between two ticks (under a
/// flood the reorder window, bounded by `max_legs`, correlates early) the legs never exceed
/// it. Found by the `ring_record` fuzz target (leg bytes 33,040 of 32,768 after a push).
#[test]
fn hops_added_between_ticks_stay_within_the_byte_budget() {
    let budget = 16 << 10;
    let mut c = Correlator::new(
        CorrelateConfig {
            max_legs: 4,
            max_leg_bytes: budget,
            ..Default::default()
        },
        Clock::Epoch,
    );
    let mut worst = 0;
    for i in 0..200u32 {
        let m: Arc<DnsMessage> = msg(
            i as u16,
            false,
            &format!("h{i}.test."),
            "A",
            "NOERROR",
            &[],
            false,
        )
        .into();
        let src: SocketAddr = format!("10.0.0.{}:{}", i % 250, 1024 + i).parse().unwrap();
        for k in 0..10u32 {
            c.on_observed(Observed::Message(Observation {
                ts_ns: MS + u64::from(i) * 100_000 + u64::from(k) * 1_000,
                at: at(1, 10 + k, Direction::Egress),
                netns: "node".into(),
                ifname: format!("veth{k}").into(),
                proto: UDP,
                src,
                dst: "10.96.0.10:53".parse().unwrap(),
                msg: Arc::clone(&m),
                tunnel: None,
            }));
            worst = worst.max(c.legs.bytes());
        }
    }
    assert!(worst <= budget, "{worst} bytes > {budget}");
    assert!(c.stats().evicted_transactions > 0, "the budget was reached");
}

/// The ids of reported transactions leave the eviction order once they are most of it,
/// however the transactions end (reported in a tick, evicted): `tx_order` stays within
/// twice the open ones. Found by the `correlate` fuzz target ("transaction order: 68 > 65").
#[test]
fn the_eviction_order_is_swept_when_transactions_are_reported() {
    let mut c = Correlator::new(CorrelateConfig::default(), Clock::Epoch);
    let mut out: Vec<Record> = Vec::new();
    forward_storm(&mut c, &mut out, 500, MS, 100_000);
    c.tick(1_000 * MS, &mut out);
    assert!(c.txs.len() > 100, "{} open", c.txs.len());
    // Every question unanswered: all reported at their timeout, in one tick.
    c.tick(20 * 1_000 * MS, &mut out);
    assert_eq!(c.txs.len(), 0);
    assert!(c.tx_order.len() <= 65, "{} ids left", c.tx_order.len());
}

#[test]
fn timeouts_come_due_in_deadline_order_late_ones_included() {
    let mut t = Timeouts::default();
    t.push(10, 1);
    t.push(20, 2);
    // A late observation's deadline, earlier than the back: still in order.
    t.push(15, 3);
    t.push(5, 4);
    t.push(30, 5);
    assert_eq!(t.pop_due(4), None, "nothing is due before its deadline");
    let mut due = Vec::new();
    while let Some(id) = t.pop_due(20) {
        due.push(id);
    }
    assert_eq!(due, [4, 1, 3, 2]);
    assert_eq!(t.pop_due(29), None);
    assert_eq!(t.pop_due(30), Some(5));
    assert_eq!(t.len(), 0);
}

#[test]
fn timeouts_of_gone_legs_are_swept_within_the_bound() {
    let mut t = Timeouts::default();
    // 1000 legs come and go, 10 stay open (ids 0..10).
    for id in 0..1000u64 {
        t.push(id, id);
        t.sweep(10, |id| id < 10);
        assert!(t.len() <= 2 * 10 + 64 + 1, "{} entries", t.len());
    }
    // Below the bound nothing is swept: the open legs' entries are all still there.
    let mut due = Vec::new();
    while let Some(id) = t.pop_due(u64::MAX) {
        due.push(id);
    }
    assert!((0..10).all(|id| due.contains(&id)), "{due:?}");
}

/// At the end of input the open transactions come out at most `max` a call, the oldest
/// first, each once, and every one of them in the end (a stop with a full table hands the
/// sinks batches, not 65,536 records at once).
#[test]
fn the_end_reports_open_transactions_in_batches_oldest_first() {
    let mut f = Feed::new();
    let n = 2_500u32;
    open_queries(&mut f, n, "n");
    let end = u64::from(n) * MS + 10;
    let mut batches = Vec::new();
    loop {
        let more = f.c.flush(end, 1_000, &mut f.out);
        let names: Vec<String> = f
            .out
            .drain(..)
            .filter_map(|r| match r {
                Record::Transaction(t) => Some(t.question.name.clone()),
                _ => None,
            })
            .collect();
        batches.push(names);
        if !more {
            break;
        }
        assert!(batches.len() < 10, "flush never says it is done");
    }
    let sizes: Vec<usize> = batches.iter().map(Vec::len).collect();
    assert_eq!(sizes, [1_000, 1_000, 500]);
    let all: Vec<String> = batches.concat();
    let expected: Vec<String> = (0..n).map(|i| format!("n{i}.end.test.")).collect();
    assert_eq!(all, expected, "each once, the oldest first");
    assert_eq!(f.c.stats().transactions, u64::from(n));
    f.c.check_bounds().unwrap();
    // Nothing left: another call reports nothing.
    assert!(!f.c.flush(end, 1_000, &mut f.out));
    assert!(f.out.is_empty());

    // Open transactions missing from the order queue still come out: the end never loops
    // without reporting.
    let mut f = Feed::new();
    open_queries(&mut f, 30, "q");
    assert!(f.c.flush(end, 10, &mut f.out));
    f.c.tx_order.clear();
    // 20 left: 10, then the last 10.
    assert!(f.c.flush(end, 10, &mut f.out));
    assert!(!f.c.flush(end, 10, &mut f.out));
    assert_eq!(f.c.stats().transactions, 30);
}

/// `n` client queries (names `{prefix}{i}.end.test.`), 1 ms apart from 0, none answered.
fn open_queries(f: &mut Feed, n: u32, prefix: &str) {
    for i in 0..n {
        let client = format!("10.0.{}.{}:{}", i / 250, i % 250, 1024 + i);
        let name = format!("{prefix}{i}.end.test.");
        let m = msg(i as u16, false, &name, "A", "NOERROR", &[], false);
        let p = at(1, 1, Direction::Egress);
        f.see(
            u64::from(i) * MS,
            p,
            "c",
            "eth0",
            UDP,
            &client,
            "10.96.0.10:53",
            m,
        );
    }
}
