use super::{dnsperf::parse_dnsperf, goal, goal_no_loss, thousands, tool::metric};

#[test]
fn dnsperf_output_is_parsed() {
    let out =
        "Statistics:\n\n  Queries sent:         20000\n  Queries completed:    19990 (99.95%)\n  \
Queries lost:         10 (0.05%)\n\n  Response codes:       NOERROR 19990 (100.00%)\n  \
Average packet size:  request 30, response 46\n  Run time (s):         10.000460\n  \
Queries per second:   1998.908\n\n  Average Latency (s):  0.000183 (min 0.000042, max 0.003046)\n  \
Latency StdDev (s):   0.000113\n";
    let d = parse_dnsperf(out).unwrap_or_default();
    assert_eq!((d.completed, d.lost), (19990, 10));
    assert!((d.qps - 1998.908).abs() < 1e-6);
    assert!((d.avg_ms - 0.183).abs() < 1e-9);
    assert!((d.max_ms - 3.046).abs() < 1e-9);
    assert_eq!((d.p50_ms, d.p99_ms), (0.0, 0.0));
}

#[test]
fn dnsperf_percentiles_come_from_answered_queries() {
    let mut out = String::from("[Status] Sending queries\n");
    // 100 answered queries of 1..=100 ms, in shuffled order, and timed-out ones.
    for i in (1..=100u32).map(|i| (i * 37) % 100 + 1) {
        out.push_str(&format!(
            "> NOERROR www.example.com A {:.6}\n",
            f64::from(i) / 1e3
        ));
        out.push_str("> T www.example.com AAAA\n");
    }
    out.push_str("Statistics:\n\n  Queries completed:    100 (50.00%)\n  Queries lost:         100 (50.00%)\n  \
Queries per second:   10.0\n\n  Average Latency (s):  0.050500 (min 0.001000, max 0.100000)\n");
    let d = parse_dnsperf(&out).unwrap_or_default();
    assert!((d.p50_ms - 50.0).abs() < 1e-6, "{}", d.p50_ms);
    assert!((d.p99_ms - 99.0).abs() < 1e-6, "{}", d.p99_ms);
}

#[test]
fn metrics_are_summed_over_matching_labels() {
    let s = "# HELP x\ndnspath_events_lost_total{event=\"packet\"} 3\n\
dnspath_events_lost_total{event=\"drop\"} 4\ndnspath_packets_total 120\n";
    assert_eq!(
        metric(s, "dnspath_events_lost_total", "event=\"packet\""),
        Some(3)
    );
    assert_eq!(metric(s, "dnspath_packets_total", ""), Some(120));
    assert_eq!(metric(s, "dnspath_missing", ""), None);
}

#[test]
fn thousands_are_grouped() {
    assert_eq!(thousands(0), "0");
    assert_eq!(thousands(1234567), "1,234,567");
    assert_eq!(thousands(123), "123");
}

#[test]
fn netfilter_counts_are_read_from_the_chain_listing() {
    let listing = "Chain DNSPATH_BENCH (2 references)\n    pkts      bytes target     prot opt in     out     source               destination\n  123456  9876543 RETURN     17   --  *      *       0.0.0.0/0            0.0.0.0/0            multiport ports 53\n";
    assert_eq!(super::truth::packets(listing), Some(123_456));
    assert_eq!(
        super::truth::packets("Chain DNSPATH_BENCH (0 references)\n"),
        None
    );
}

/// A goal says met only when the figure is on the right side of its target, and by how
/// much it is missed otherwise, in both directions.
#[test]
fn goals_say_met_or_by_how_much_they_are_missed() {
    assert!(goal("cpu", "0.40×", 0.4, 0.5, true).ends_with("  met"));
    assert!(goal("cpu", "0.50×", 0.5, 0.5, true).ends_with("  met"));
    assert!(goal("cpu", "1.10×", 1.1, 0.5, true).ends_with("missed by 2.20×"));
    assert!(goal("rate", "2M", 2e6, 1e6, false).ends_with("  met"));
    assert!(goal("rate", "250k", 2.5e5, 1e6, false).ends_with("missed by 4.00×"));
    assert!(goal_no_loss("loss", 0, 1000).ends_with("0 of 1,000 lost  met"));
    assert!(goal_no_loss("loss", 12, 1000).ends_with("12 of 1,000 lost  missed"));
}
