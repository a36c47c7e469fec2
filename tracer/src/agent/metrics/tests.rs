use super::*;
use crate::{
    correlate::{
        record::{LegOutcome, Outcome},
        CorrelateStats, LegRole,
    },
    detect::{loops::LoopState, race::RaceVerdict},
    output::record::{DecodeStats, Record, StatsRecord},
    test_support::fixtures,
    test_support::fixtures::{
        drop_record, dropped, leg, loop_record, malformed_packet, race, service_transaction,
        transaction,
    },
};

/// The value of one series, e.g. `dnspath_dns_queries_total{leg="service",proto="udp",qtype="A"}`.
fn value(text: &str, series: &str) -> Option<f64> {
    text.lines().filter(|l| !l.starts_with('#')).find_map(|l| {
        let (name, v) = l.rsplit_once(' ')?;
        (name == series).then(|| v.parse().ok())?
    })
}

fn series_count(text: &str) -> usize {
    text.lines().filter(|l| !l.starts_with('#')).count()
}

#[test]
fn queries_responses_and_latency_by_leg() {
    let m = Metrics::new();
    m.observe(&service_transaction("www.lab.test.", "A", 40005, "NOERROR"));
    m.observe(&service_transaction(
        "nope.lab.test.",
        "AAAA",
        40006,
        "NXDOMAIN",
    ));
    let t = m.encode();
    let v = |s: &str| value(&t, s).unwrap_or_else(|| panic!("no {s} in\n{t}"));
    assert_eq!(
        v(r#"dnspath_dns_queries_total{leg="service",proto="udp",qtype="A"}"#),
        1.0
    );
    assert_eq!(
        v(r#"dnspath_dns_queries_total{leg="upstream",proto="udp",qtype="A"}"#),
        1.0
    );
    assert_eq!(
        v(r#"dnspath_dns_queries_total{leg="service",proto="udp",qtype="AAAA"}"#),
        1.0
    );
    assert_eq!(
        v(
            r#"dnspath_dns_responses_total{leg="service",proto="udp",qtype="AAAA",rcode="NXDOMAIN"}"#
        ),
        1.0
    );
    assert_eq!(
        v(r#"dnspath_dns_responses_total{leg="upstream",proto="udp",qtype="A",rcode="NOERROR"}"#),
        1.0
    );
    // 630 µs falls in the 1 ms bucket, not the 500 µs one.
    assert_eq!(
        v(r#"dnspath_dns_leg_duration_seconds_bucket{le="0.0005",leg="service",proto="udp"}"#),
        0.0
    );
    assert_eq!(
        v(r#"dnspath_dns_leg_duration_seconds_bucket{le="0.001",leg="service",proto="udp"}"#),
        2.0
    );
    assert_eq!(
        v(r#"dnspath_dns_leg_duration_seconds_count{leg="upstream",proto="udp"}"#),
        2.0
    );
    assert_eq!(
        v(r#"dnspath_dns_transactions_total{qtype="A",outcome="answered"}"#),
        1.0
    );
    assert_eq!(
        v(r#"dnspath_dns_transaction_duration_seconds_count{qtype="AAAA"}"#),
        1.0
    );
    assert!(t.contains(r#"dnspath_build_info{version=""#), "{t}");
    assert!(t.ends_with("# EOF\n"), "{t}");
}

#[test]
fn leg_roles_stub_client_and_unanswered() {
    let m = Metrics::new();
    let stub = leg(
        LegRole::Query,
        "127.0.0.1:5000",
        "127.0.0.53:53",
        "127.0.0.53:53",
        None,
        None,
    );
    let direct = leg(
        LegRole::Query,
        "10.244.1.2:5001",
        "10.244.1.3:53",
        "10.244.1.3:53",
        Some("SERVFAIL"),
        Some(2_000_000),
    );
    assert_eq!(leg_label(&stub), "stub");
    assert_eq!(leg_label(&direct), "client");
    m.observe(&Record::Transaction(Box::new(transaction(
        "x.lab.test.",
        "TYPE65534",
        "127.0.0.1:5000",
        None,
        vec![stub],
    ))));
    m.observe(&Record::Transaction(Box::new(transaction(
        "y.lab.test.",
        "SRV",
        "10.244.1.2:5001",
        Some("SERVFAIL"),
        vec![direct],
    ))));
    let t = m.encode();
    assert_eq!(
        value(
            &t,
            r#"dnspath_dns_unanswered_queries_total{leg="stub",proto="udp",qtype="other"}"#
        ),
        Some(1.0),
        "{t}"
    );
    assert_eq!(
        value(
            &t,
            r#"dnspath_dns_responses_total{leg="client",proto="udp",qtype="SRV",rcode="SERVFAIL"}"#
        ),
        Some(1.0),
        "{t}"
    );
    assert_eq!(
        value(
            &t,
            r#"dnspath_dns_transactions_total{qtype="other",outcome="unanswered"}"#
        ),
        Some(1.0),
        "{t}"
    );
}

#[test]
fn label_maps_are_fixed() {
    assert_eq!(qtype_label("aaaa".into()), "AAAA");
    // ANY (255), once spelt `*` too.
    assert_eq!(qtype_label(crate::decode::dns::RrType(255)), "ANY");
    assert_eq!(qtype_label("CAA".into()), "other");
    assert_eq!(
        rcode_label(&crate::decode::dns::Rcode::NXDOMAIN),
        "NXDOMAIN"
    );
    assert_eq!(
        rcode_label(&crate::decode::dns::Rcode::new(23)),
        "BADCOOKIE"
    );
    assert_eq!(rcode_label(&crate::decode::dns::Rcode::new(42)), "other");
    // Every label is the code's own mnemonic.
    for (code, name) in RCODES {
        assert_eq!(&*crate::decode::dns::Rcode::new(code), name);
    }
    assert_eq!(
        malformed_label("IP: IPv4 IHL of 3 words is below the 5-word minimum"),
        "ip_header"
    );
    assert_eq!(malformed_label("TCP stream: gap (12 bytes)"), "tcp_stream");
    assert_eq!(
        malformed_label("7 bytes is shorter than the 12-byte DNS header"),
        "dns_header"
    );
    assert_eq!(
        malformed_label("header counts (qd 1, an 9, ns 0, ar 0) need at least 100 bytes after the header, only 20 present"),
        "dns_counts"
    );
    assert_eq!(malformed_label("answer #2: label too long"), "dns_record");
    assert_eq!(malformed_label("something new"), "other");
}

#[test]
fn retries_by_cause() {
    let m = Metrics::new();
    let client = "10.244.1.2:5000";
    // Timeout: unanswered, retried, answered.
    let first = leg(
        LegRole::Query,
        client,
        "10.96.0.10:53",
        "10.244.1.3:53",
        None,
        None,
    );
    let retry = leg(
        LegRole::Retry,
        client,
        "10.96.0.10:53",
        "10.244.1.4:53",
        Some("NOERROR"),
        Some(500_000),
    );
    m.observe(&Record::Transaction(Box::new(transaction(
        "a.lab.test.",
        "A",
        client,
        Some("NOERROR"),
        vec![first.clone(), retry.clone()],
    ))));
    // Truncated: TCP fallback.
    let mut tc = leg(
        LegRole::Query,
        client,
        "10.96.0.10:53",
        "10.244.1.3:53",
        Some("NOERROR"),
        Some(1),
    );
    tc.outcome = LegOutcome::Truncated;
    let tcp = leg(
        LegRole::TcpFallback,
        client,
        "10.96.0.10:53",
        "10.244.1.3:53",
        Some("NOERROR"),
        Some(1),
    );
    m.observe(&Record::Transaction(Box::new(transaction(
        "big.lab.test.",
        "TXT",
        client,
        Some("NOERROR"),
        vec![tc, tcp],
    ))));
    // Dropped by a conntrack race, retried: the correlator marks the dropped leg.
    let mut raced = dropped(first.clone(), "NETFILTER_DROP");
    raced.race_drop = true;
    m.observe(&Record::Transaction(Box::new(transaction(
        "api.lab.test.",
        "A",
        client,
        Some("NOERROR"),
        vec![raced.clone(), retry.clone()],
    ))));
    // Dropped by a rule, retried: not marked.
    let mut ruled = dropped(first, "NETFILTER_DROP");
    ruled.client = fixtures::addr("10.244.1.2:6000");
    m.observe(&Record::Transaction(Box::new(transaction(
        "blocked.lab.test.",
        "A",
        "10.244.1.2:6000",
        Some("NOERROR"),
        vec![ruled, retry],
    ))));
    m.observe(&Record::detected(race(
        RaceVerdict::RaceDrop,
        client,
        raced.dns_id,
        "A",
    )));
    m.observe(&service_transaction("next.lab.test.", "A", 7000, "NOERROR"));
    let t = m.encode();
    let v = |c: &str| value(&t, &format!(r#"dnspath_dns_retries_total{{cause="{c}"}}"#));
    assert_eq!(v("timeout"), Some(1.0), "{t}");
    assert_eq!(v("truncated"), Some(1.0), "{t}");
    assert_eq!(v("conntrack_race"), Some(1.0), "{t}");
    assert_eq!(v("kernel_drop"), Some(1.0), "{t}");
    assert_eq!(
        value(&t, r#"dnspath_conntrack_race_drops_total{qtype="A"}"#),
        Some(1.0)
    );
}

#[test]
fn a_retry_after_a_drop_is_settled_by_a_record_of_another_kind() {
    let m = Metrics::new();
    let client = "10.244.1.2:5000";
    let first = leg(
        LegRole::Query,
        client,
        "10.96.0.10:53",
        "10.244.1.3:53",
        None,
        None,
    );
    let retry = leg(
        LegRole::Retry,
        client,
        "10.96.0.10:53",
        "10.244.1.4:53",
        Some("NOERROR"),
        Some(1),
    );
    m.observe(&Record::Transaction(Box::new(transaction(
        "blocked.lab.test.",
        "A",
        client,
        Some("NOERROR"),
        vec![dropped(first, "NETFILTER_DROP"), retry],
    ))));
    m.observe(&Record::Drop(Box::new(drop_record("NETFILTER_DROP", None))));
    assert_eq!(
        value(
            &m.encode(),
            r#"dnspath_dns_retries_total{cause="kernel_drop"}"#
        ),
        Some(1.0)
    );
}

/// The agent reports no packet records: a retry after a drop that was not a race counts at
/// once, whatever comes after it.
#[test]
fn a_retry_after_a_drop_counts_with_its_transaction() {
    let m = Metrics::new();
    let client = "10.244.1.2:5000";
    let first = leg(
        LegRole::Query,
        client,
        "10.96.0.10:53",
        "10.244.1.3:53",
        None,
        None,
    );
    let retry = leg(
        LegRole::Retry,
        client,
        "10.96.0.10:53",
        "10.244.1.4:53",
        Some("NOERROR"),
        Some(1),
    );
    m.observe(&Record::Transaction(Box::new(transaction(
        "blocked.lab.test.",
        "A",
        client,
        Some("NOERROR"),
        vec![dropped(first, "NETFILTER_DROP"), retry],
    ))));
    let kernel_drop = |m: &Metrics| {
        value(
            &m.encode(),
            r#"dnspath_dns_retries_total{cause="kernel_drop"}"#,
        )
    };
    assert_eq!(kernel_drop(&m), Some(1.0));
    m.observe(&Record::detected(race(
        RaceVerdict::RaceDrop,
        client,
        4660,
        "A",
    )));
    assert_eq!(kernel_drop(&m), Some(1.0), "counted once");
}

#[test]
fn races_and_clashes() {
    let m = Metrics::new();
    m.observe(&Record::detected(race(
        RaceVerdict::Suspected,
        "10.244.1.2:1",
        1,
        "AAAA",
    )));
    let mut clash = race(RaceVerdict::ResolvedClash, "", 0, "A");
    clash.dropped = None;
    clash.counters.clash_resolve = 3;
    m.observe(&Record::detected(clash));
    let t = m.encode();
    assert_eq!(
        value(
            &t,
            r#"dnspath_conntrack_race_suspected_total{qtype="AAAA"}"#
        ),
        Some(1.0)
    );
    assert_eq!(
        value(&t, "dnspath_conntrack_clashes_resolved_total"),
        Some(3.0)
    );
}

#[test]
fn search_list_nxdomain_steps() {
    let m = Metrics::new();
    let step = |name: &str, step: u32, rcode: &str| {
        let mut t = transaction(name, "A", "10.244.1.2:5000", Some(rcode), Vec::new());
        t.lookup.id = 9;
        t.lookup.step = step;
        Record::Transaction(Box::new(t))
    };
    m.observe(&step("www.default.svc.cluster.local.", 0, "NXDOMAIN"));
    m.observe(&step("www.svc.cluster.local.", 1, "NXDOMAIN"));
    m.observe(&step("www.cluster.local.", 2, "NXDOMAIN"));
    m.observe(&step("www.", 3, "NOERROR"));
    // A final NXDOMAIN with no next step is the answer, not a search step.
    let mut other = transaction(
        "gone.",
        "A",
        "10.244.1.2:5001",
        Some("NXDOMAIN"),
        Vec::new(),
    );
    other.lookup.id = 10;
    m.observe(&Record::Transaction(Box::new(other)));
    let t = m.encode();
    assert_eq!(
        value(&t, r#"dnspath_dns_search_nxdomain_total{qtype="A"}"#),
        Some(3.0),
        "{t}"
    );
}

#[test]
fn kernel_drops_by_bounded_reason() {
    let m = Metrics::new();
    m.observe(&Record::Drop(Box::new(drop_record("NETFILTER_DROP", None))));
    m.observe(&Record::Drop(Box::new(drop_record(
        "NOT_SPECIFIED",
        Some("socket closed with unread datagrams"),
    ))));
    m.observe(&Record::Drop(Box::new(drop_record("evil\"} 1\nx{", None))));
    let t = m.encode();
    assert_eq!(
        value(
            &t,
            r#"dnspath_kernel_drops_total{reason="NETFILTER_DROP",benign="false"}"#
        ),
        Some(1.0)
    );
    assert_eq!(
        value(
            &t,
            r#"dnspath_kernel_drops_total{reason="NOT_SPECIFIED",benign="true"}"#
        ),
        Some(1.0)
    );
    assert_eq!(
        value(
            &t,
            r#"dnspath_kernel_drops_total{reason="other",benign="false"}"#
        ),
        Some(1.0)
    );
    // Beyond the cap every new name is `other`.
    for i in 0..MAX_DROP_REASONS + 50 {
        m.observe(&Record::Drop(Box::new(drop_record(
            &format!("REASON_{i}"),
            None,
        ))));
    }
    let t = m.encode();
    let drops = t
        .lines()
        .filter(|l| l.starts_with("dnspath_kernel_drops_total"))
        .count();
    assert_eq!(drops, MAX_DROP_REASONS + 1, "the cap, plus `other`");
}

#[test]
fn loops_detected_and_active() {
    let m = Metrics::new();
    // Both kinds there at 0 before any loop.
    let t = m.encode();
    for kind in ["cycle", "amplification"] {
        assert_eq!(
            value(
                &t,
                &format!(r#"dnspath_forwarding_loops_detected_total{{kind="{kind}"}}"#)
            ),
            Some(0.0),
            "{t}"
        );
    }
    m.observe(&Record::detected(loop_record(1, LoopState::Detected, 1)));
    m.observe(&Record::detected(loop_record(1, LoopState::Ongoing, 2)));
    m.observe(&Record::detected(loop_record(2, LoopState::Detected, 3)));
    let t = m.encode();
    assert_eq!(
        value(
            &t,
            r#"dnspath_forwarding_loops_detected_total{kind="cycle"}"#
        ),
        Some(2.0)
    );
    assert_eq!(value(&t, "dnspath_forwarding_loops_active"), Some(2.0));
    m.observe(&Record::detected(loop_record(1, LoopState::Ended, 4)));
    assert_eq!(
        value(&m.encode(), "dnspath_forwarding_loops_active"),
        Some(1.0)
    );
    m.observe(&Record::detected(loop_record(2, LoopState::Ended, 5)));
    let t = m.encode();
    assert_eq!(value(&t, "dnspath_forwarding_loops_active"), Some(0.0));
    assert_eq!(
        value(
            &t,
            r#"dnspath_forwarding_loops_detected_total{kind="cycle"}"#
        ),
        Some(2.0)
    );
}

#[test]
fn stats_totals_become_counter_growth() {
    let m = Metrics::new();
    m.observe(&Record::Packet(malformed_packet(
        "TCP stream: gap (3 bytes)",
    )));
    let mut s = StatsRecord {
        decode: DecodeStats {
            packets: 100,
            malformed: 3,
            lost: 5,
            drops_lost: 1,
            summarised: 7,
            shed: 30,
            tcp_flows_evicted: 2,
            ..DecodeStats::default()
        },
        correlate: Some(CorrelateStats {
            evicted_legs: 4,
            ..CorrelateStats::default()
        }),
        ..StatsRecord::default()
    };
    m.observe_stats(&s);
    s.decode.packets = 150;
    s.decode.lost = 9;
    m.observe(&Record::Stats(Box::new(s.clone())));
    let t = m.encode();
    let v = |series: &str| value(&t, series).unwrap_or_else(|| panic!("no {series} in\n{t}"));
    assert_eq!(v(r#"dnspath_events_lost_total{event="packet"}"#), 9.0);
    assert_eq!(v(r#"dnspath_events_lost_total{event="drop"}"#), 1.0);
    assert_eq!(v("dnspath_packets_total"), 150.0);
    // Shed in userspace after copying, or in the kernel without: both only counted.
    assert_eq!(v("dnspath_summarised_packets_total"), 37.0);
    assert_eq!(
        v(r#"dnspath_malformed_messages_total{reason="tcp_stream"}"#),
        1.0
    );
    assert_eq!(
        v(r#"dnspath_malformed_messages_total{reason="unclassified"}"#),
        2.0
    );
    assert_eq!(v(r#"dnspath_table_evictions_total{table="legs"}"#), 4.0);
    assert_eq!(
        v(r#"dnspath_table_evictions_total{table="tcp_flows"}"#),
        2.0
    );
    // A new pipeline's totals start again from zero: they count from there.
    s.decode.lost = 2;
    m.observe_stats(&s);
    assert_eq!(
        value(&m.encode(), r#"dnspath_events_lost_total{event="packet"}"#),
        Some(11.0)
    );
}

#[test]
fn event_stream_folds_count_as_evictions() {
    use crate::agent::events::{Events, EventsConfig};
    let m = Metrics::new();
    let cfg = EventsConfig {
        max_keys: 1,
        ..EventsConfig::default()
    };
    let mut ev = Events::new(cfg, crate::time::Clock::Epoch);
    let mut out = Vec::new();
    for i in 0..3 {
        let mut t = transaction("x.", "A", "10.244.1.2:1", None, Vec::new());
        t.legs = vec![leg(
            LegRole::Query,
            "10.244.1.2:1",
            &format!("10.0.0.{i}:53"),
            "10.0.0.1:53",
            None,
            None,
        )];
        ev.observe(&Record::Transaction(Box::new(t)), 1, &mut out);
    }
    m.observe_events(&ev);
    m.observe_events(&ev);
    assert_eq!(
        value(
            &m.encode(),
            r#"dnspath_table_evictions_total{table="events_servers"}"#
        ),
        Some(2.0)
    );
}

#[test]
fn findings_of_the_last_window_set_the_gauge() {
    use crate::agent::events::{Events, EventsConfig};
    let m = Metrics::new();
    let gauge = |m: &Metrics, kind: &str, severity: &str| {
        value(
            &m.encode(),
            &format!(r#"dnspath_findings{{kind="{kind}",severity="{severity}"}}"#),
        )
    };
    // Every traffic kind is there at 0 before any window closed.
    assert_eq!(gauge(&m, "unanswered_queries", "warning"), Some(0.0));
    assert_eq!(gauge(&m, "runtime_loop", "critical"), Some(0.0));
    assert_eq!(gauge(&m, "ndots_amplification", "info"), Some(0.0));
    let cfg = EventsConfig {
        findings_window_ns: 10,
        ..EventsConfig::default()
    };
    let mut ev = Events::new(cfg, crate::time::Clock::Epoch);
    let mut out = Vec::new();
    for i in 0..5 {
        let c = format!("10.244.1.2:{}", 1000 + i);
        let t = transaction(
            "x.",
            "A",
            &c,
            None,
            vec![leg(
                LegRole::Query,
                &c,
                "10.96.0.10:53",
                "10.244.1.3:53",
                None,
                None,
            )],
        );
        ev.observe(&Record::Transaction(Box::new(t)), 1, &mut out);
    }
    m.observe_events(&ev);
    assert_eq!(
        gauge(&m, "unanswered_queries", "warning"),
        Some(0.0),
        "window still open"
    );
    ev.tick(11, &mut out);
    m.observe_events(&ev);
    assert_eq!(gauge(&m, "unanswered_queries", "warning"), Some(1.0));
    // An empty window brings it back to 0.
    ev.tick(22, &mut out);
    m.observe_events(&ev);
    assert_eq!(gauge(&m, "unanswered_queries", "warning"), Some(0.0));
}

/// 10,000 query names from 500 client ports, every qtype and rcode spelling seen on a wire:
/// the series are bounded by the fixed label sets, and no name or port becomes a label.
#[test]
fn cardinality_is_bounded_by_the_label_sets() {
    let m = Metrics::new();
    let qtypes = [
        "A",
        "AAAA",
        "TYPE65534",
        "CAA",
        "SRV",
        "HINFO",
        "NAPTR",
        "ANY",
    ];
    let rcodes = [
        "NOERROR",
        "NXDOMAIN",
        "SERVFAIL",
        "RCODE42",
        "BADCOOKIE",
        "REFUSED",
    ];
    let feed = |from: usize| {
        for i in from..from + 10_000 {
            let port = 30_000 + (i % 500) as u16;
            let name = format!("name-{i}.ns-{}.svc.cluster.local.", i % 97);
            let r = service_transaction(
                &name,
                qtypes[i % qtypes.len()],
                port,
                rcodes[i % rcodes.len()],
            );
            m.observe(&r);
            if i % 10 == 0 {
                let mut t =
                    transaction(&name, "A", &format!("10.244.1.2:{port}"), None, Vec::new());
                t.lookup.id = i as u64;
                m.observe(&Record::Transaction(Box::new(t)));
            }
        }
    };
    feed(0);
    let t = m.encode();
    let after_first = series_count(&t);
    for needle in ["name-", "svc.cluster", ":30", "10.244."] {
        assert!(!t.contains(needle), "{needle} became a label:\n{t}");
    }
    // legs (5) × protos (2) × qtypes (14) × rcodes (14) bounds responses; the whole text
    // stays far below what one series per name or port would give.
    let bound = 5 * 2 * 14 * (1 + 1 + 14) + 5 * 2 * 20 + 14 * 4 + 14 * 20 + 100;
    assert!(after_first <= bound, "{after_first} series > {bound}");
    feed(10_000);
    assert_eq!(
        series_count(&m.encode()),
        after_first,
        "new names added series"
    );
}

/// `promtool check metrics` accepts the exposition (names, types, suffixes, help). promtool
/// 2.42 reads the classic text format only; the OpenMetrics form holds the same series.
#[test]
fn promtool_accepts_the_exposition() {
    let m = Metrics::new();
    m.observe(&service_transaction("www.lab.test.", "A", 40005, "NOERROR"));
    m.observe(&Record::Drop(Box::new(drop_record("NETFILTER_DROP", None))));
    m.observe(&Record::detected(loop_record(1, LoopState::Detected, 1)));
    m.observe(&Record::detected(race(
        RaceVerdict::RaceDrop,
        "10.244.1.2:1",
        1,
        "A",
    )));
    m.observe_stats(&StatsRecord {
        decode: DecodeStats {
            lost: 1,
            ..DecodeStats::default()
        },
        ..StatsRecord::default()
    });
    let text = m.encode_as(Exposition::PrometheusText);
    let om = m.encode();
    // The same series in both (they differ in label order and number spelling only).
    let names = |t: &str| -> Vec<String> {
        let mut v: Vec<String> = t
            .lines()
            .filter(|l| !l.starts_with('#'))
            .map(|l| l.split(['{', ' ']).next().unwrap_or("").to_string())
            .collect();
        v.sort();
        v
    };
    assert_eq!(names(&text), names(&om));
    assert!(om.ends_with("# EOF\n") && !text.contains("# EOF"));
    let child = std::process::Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn();
    let mut child = match child {
        Ok(c) => c,
        Err(e) => {
            eprintln!("SKIPPED: promtool not runnable ({e}); `cargo xtask setup` installs it (Debian package prometheus)");
            return;
        }
    };
    {
        use std::io::Write;
        let mut stdin = child.stdin.take().unwrap();
        stdin.write_all(text.as_bytes()).unwrap();
    }
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success() && out.stdout.is_empty() && out.stderr.is_empty(),
        "promtool check metrics: {}\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
}

/// Many distinct names, servers, drop reasons and namespaces: every table of the agent's own
/// stays within its cap (`dnspath_table_entries` ≤ `dnspath_table_capacity`), and what did
/// not fit is counted in `dnspath_table_evictions_total`.
#[test]
fn every_agent_table_stays_within_its_cap() {
    use crate::agent::events::{Events, EventsConfig};
    let m = Metrics::with_config(MetricsConfig {
        namespace_label: Some(8),
        ..MetricsConfig::default()
    });
    let mut ev = Events::new(EventsConfig::default(), crate::time::Clock::Epoch);
    let mut out = Vec::new();
    for i in 0..10_000u64 {
        // Each name the first step of its own lookup, answered NXDOMAIN, never continued.
        let mut t = transaction(
            &format!("n{i}.default.svc.cluster.local."),
            "A",
            "10.244.1.2:5000",
            Some("NXDOMAIN"),
            Vec::new(),
        );
        t.lookup.id = i;
        t.pod.pod = Some(format!("ns{}/pod{i}", i % 20));
        m.observe(&Record::Transaction(Box::new(t.clone())));
        // ... and unanswered by a server of its own.
        t.outcome = Outcome::Unanswered;
        t.rcode = None;
        t.legs = vec![leg(
            LegRole::Query,
            "10.244.1.2:5000",
            &format!("10.{}.{}.{}:53", i >> 16, (i >> 8) & 255, i & 255),
            "10.0.0.1:53",
            None,
            None,
        )];
        ev.observe(&Record::Transaction(Box::new(t)), 1, &mut out);
        // A drop reason of its own.
        m.observe(&Record::Drop(Box::new(drop_record(
            &format!("REASON_{i}"),
            None,
        ))));
        // And a loop of its own that never ends.
        m.observe(&Record::detected(loop_record(i, LoopState::Detected, 1)));
    }
    m.observe_events(&ev);
    let text = m.encode();
    let tables = [
        "metrics_search_lookups",
        "metrics_active_loops",
        "metrics_drop_reasons",
        "metrics_namespaces",
        "events_servers",
    ];
    for table in tables {
        let series = |metric: &str| {
            value(&text, &format!(r#"dnspath_{metric}{{table="{table}"}}"#))
                .unwrap_or_else(|| panic!("no {metric} for {table}:\n{text}"))
        };
        let (entries, cap) = (series("table_entries"), series("table_capacity"));
        assert!(cap > 0.0 && entries <= cap, "{table}: {entries} > {cap}");
        assert!(
            entries >= cap.min(8.0),
            "{table}: {entries} entries, the cap was never reached"
        );
        assert!(
            series("table_evictions_total") > 0.0,
            "{table}: nothing evicted:\n{text}"
        );
    }
    // Drop reasons beyond the cap and namespaces beyond the cap are `other`.
    assert!(value(
        &text,
        r#"dnspath_kernel_drops_total{reason="other",benign="false"}"#
    )
    .is_some_and(|n| n >= 10_000.0 - MAX_DROP_REASONS as f64));
    assert!(text.contains(r#"namespace="other""#), "{text}");
}

#[test]
fn namespace_label_only_when_asked_and_capped() {
    let observe = |m: &Metrics| {
        for (i, pod) in [
            Some("team-a/web-1"),
            Some("team-b/api-1"),
            Some("team-c/db-1"),
            Some("Not_A_Namespace/x"),
            None,
        ]
        .into_iter()
        .enumerate()
        {
            let mut t = transaction(
                "www.lab.test.",
                "A",
                "10.244.1.2:5000",
                Some("NOERROR"),
                vec![leg(
                    LegRole::Query,
                    "10.244.1.2:5000",
                    "10.96.0.10:53",
                    "10.244.1.3:53",
                    Some("NOERROR"),
                    Some(1_000_000),
                )],
            );
            t.lookup.id = i as u64;
            t.pod.pod = pod.map(str::to_string);
            m.observe(&Record::Transaction(Box::new(t)));
        }
    };
    let off = Metrics::new();
    observe(&off);
    let text = off.encode();
    assert!(!text.contains("namespace="), "{text}");
    assert_eq!(
        value(
            &text,
            r#"dnspath_dns_transactions_total{qtype="A",outcome="answered"}"#
        ),
        Some(5.0)
    );

    let on = Metrics::with_config(MetricsConfig {
        namespace_label: Some(2),
        ..MetricsConfig::default()
    });
    observe(&on);
    let text = on.encode();
    let tx = |ns: &str| {
        value(
            &text,
            &format!(
                r#"dnspath_dns_transactions_total{{qtype="A",outcome="answered",namespace="{ns}"}}"#
            ),
        )
    };
    assert_eq!(tx("team-a"), Some(1.0), "{text}");
    assert_eq!(tx("team-b"), Some(1.0), "{text}");
    // The third namespace is beyond the cap; a malformed name is no namespace either.
    assert_eq!(tx("team-c"), None, "{text}");
    assert_eq!(tx("other"), Some(2.0), "{text}");
    // A client in no known pod.
    assert_eq!(tx(""), Some(1.0), "{text}");
    assert_eq!(
        value(
            &text,
            r#"dnspath_dns_queries_total{leg="service",proto="udp",qtype="A",namespace="team-a"}"#
        ),
        Some(1.0),
        "{text}"
    );
    assert_eq!(
        value(
            &text,
            r#"dnspath_table_evictions_total{table="metrics_namespaces"}"#
        ),
        Some(1.0),
        "{text}"
    );
    assert_eq!(
        value(
            &text,
            r#"dnspath_table_entries{table="metrics_namespaces"}"#
        ),
        Some(2.0)
    );
    // Histograms keep their labels: the namespace would multiply their buckets.
    assert!(
        text.contains(r#"dnspath_dns_leg_duration_seconds_count{leg="service",proto="udp"} 5"#),
        "{text}"
    );
}

/// docs/metrics.md's table lists every metric family the registry registers, and no other:
/// the reference cannot drift from the code.
#[test]
fn every_metric_is_documented_in_docs_metrics() {
    // What `Metrics::new` registers (`r.register("name", …)` / `register_with_unit`), with
    // the suffixes the exposition adds, as a scrape shows them.
    let src = include_str!("mod.rs");
    let mut registered: std::collections::BTreeSet<String> = src
        .split("r.register")
        .skip(1)
        .filter(|call| !call.starts_with("_collector"))
        .filter_map(|call| {
            let name = call.split('"').nth(1)?;
            let with_unit = call.starts_with("_with_unit");
            Some(if with_unit {
                format!("dnspath_{name}_seconds")
            } else {
                format!("dnspath_{name}")
            })
        })
        .collect();
    // And what the process and cgroup collectors read at each scrape.
    registered.extend(super::process::COLLECTED.map(String::from));
    // A family with samples shows in the scrape under a registered name.
    let m = Metrics::new();
    m.observe(&service_transaction("www.lab.test.", "A", 40005, "NOERROR"));
    let text = m.encode();
    for l in text.lines().filter_map(|l| l.strip_prefix("# TYPE ")) {
        let name = l.split(' ').next().unwrap_or_default();
        assert!(
            registered.contains(name),
            "{name} not found in {registered:?}"
        );
    }
    assert!(registered.len() > 20, "{registered:?}");
    let doc = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/metrics.md");
    let doc_text = std::fs::read_to_string(doc).unwrap();
    let listed: std::collections::BTreeSet<String> = doc_text
        .lines()
        .filter_map(|l| l.trim_start().strip_prefix("| `"))
        .filter(|l| l.starts_with("dnspath_") || l.starts_with("process_"))
        .filter_map(|l| l.split_once('`'))
        .map(|(name, _)| name.trim_end_matches("_total").to_owned())
        .collect();
    assert_eq!(listed, registered, "docs/metrics.md's metric table");
}

/// The event stream's queue reports running totals; the counter follows them.
#[test]
fn sink_drops_follow_the_queues_totals() {
    use crate::output::queue::SinkStats;
    let m = Metrics::new();
    let events = |dropped| SinkStats {
        name: "events",
        written: 10,
        dropped,
    };
    m.observe_sinks(&[events(0)]);
    m.observe_sinks(&[events(7)]);
    m.observe_sinks(&[events(7)]);
    m.observe_sinks(&[events(12)]);
    assert_eq!(
        value(&m.encode(), r#"dnspath_sink_dropped_total{sink="events"}"#),
        Some(12.0)
    );
}

/// One hop of a fixture's leg.
fn hop_at(
    netns: &str,
    dir: crate::event::Direction,
    src: &str,
    dst: &str,
    qr: bool,
) -> crate::output::record::HopRecord {
    crate::output::record::HopRecord {
        ts_ns: 1_000,
        netns: netns.into(),
        ifname: "eth0".into(),
        pod: Default::default(),
        dir,
        src: fixtures::addr(src),
        dst: fixtures::addr(dst),
        dns_id: 4660,
        qr,
        latency_ns: None,
        tunnel: None,
    }
}

/// A client on node A asks the Service; kube-proxy on A sends it to the CoreDNS pod on
/// node B, which forwards upstream and retries once. Node A's agent sees the client's
/// question; node B's sees it arrive from the overlay (already DNAT'd, from no pod of its
/// own) and counts it as served: summed over both nodes, one client question, one served
/// query, one upstream query, no retry counted twice (Retina #584).
#[test]
fn a_query_from_another_node_is_served_not_asked_again() {
    use crate::event::Direction::{Egress, Ingress};
    let Record::Transaction(a) = service_transaction("x.lab.test.", "A", 40005, "NOERROR") else {
        unreachable!()
    };
    let c = "10.244.1.2:40005";
    let mut a = *a;
    a.legs.truncate(1);
    a.legs[0].hops = vec![hop_at("client", Egress, c, "10.96.0.10:53", false)];
    let mut b = a.clone();
    b.legs[0].hops = vec![
        hop_at("node-b", Ingress, c, "10.244.1.3:53", false),
        hop_at("coredns", Ingress, c, "10.244.1.3:53", false),
    ];
    let Record::Transaction(up) = service_transaction("x.lab.test.", "A", 40005, "NOERROR") else {
        unreachable!()
    };
    b.legs.push(up.legs[1].clone());
    let mut retry = b.legs[0].clone();
    retry.role = LegRole::Retry;
    b.legs.push(retry);
    assert!(crate::output::otlp::spans::client_is_local(&a));
    assert!(!crate::output::otlp::spans::client_is_local(&b));
    let (node_a, node_b) = (Metrics::new(), Metrics::new());
    node_a.observe(&Record::Transaction(Box::new(a)));
    node_b.observe(&Record::Transaction(Box::new(b)));
    let (ta, tb) = (node_a.encode(), node_b.encode());
    let sum = |s: &str| value(&ta, s).unwrap_or(0.0) + value(&tb, s).unwrap_or(0.0);
    assert_eq!(
        sum(r#"dnspath_dns_transactions_total{qtype="A",outcome="answered"}"#),
        1.0,
        "one client question across the two nodes:\n{ta}\n{tb}"
    );
    assert_eq!(
        value(
            &tb,
            r#"dnspath_dns_transactions_total{qtype="A",outcome="answered"}"#
        ),
        None
    );
    assert_eq!(
        value(
            &ta,
            r#"dnspath_dns_queries_total{leg="service",proto="udp",qtype="A"}"#
        ),
        Some(1.0)
    );
    assert_eq!(
        value(
            &tb,
            r#"dnspath_dns_queries_total{leg="served",proto="udp",qtype="A"}"#
        ),
        Some(2.0),
        "the query and its retry, served on B"
    );
    assert_eq!(
        value(
            &tb,
            r#"dnspath_dns_queries_total{leg="service",proto="udp",qtype="A"}"#
        ),
        None
    );
    assert_eq!(
        value(
            &tb,
            r#"dnspath_dns_queries_total{leg="upstream",proto="udp",qtype="A"}"#
        ),
        Some(1.0)
    );
    assert_eq!(sum(r#"dnspath_dns_retries_total{cause="timeout"}"#), 0.0);
    assert!(!tb.contains("dnspath_dns_transaction_duration_seconds_count{qtype=\"A\"} 1"));
}
