use super::{dnsperf::parse_dnsperf, rates::metric, thousands};

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
