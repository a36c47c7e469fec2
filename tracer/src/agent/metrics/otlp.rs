//! The OTLP exporter's counts as `dnspath_otlp_*` metrics (registered in `mod.rs`), from the
//! running totals the exporter keeps (`stats.otlp`).
use std::sync::Mutex;

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family},
};

use super::add_growth;
use crate::output::otlp::OtlpStats;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct OtlpDropLabels {
    /// `queue_full`, `export_failed`, `at_exit`.
    pub(super) reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct OtlpResultLabels {
    /// `ok`, `failed`.
    pub(super) result: &'static str,
}

#[derive(Debug, Default)]
pub(super) struct OtlpMetrics {
    pub(super) spans_exported: Counter,
    pub(super) transactions_exported: Counter,
    pub(super) dropped: Family<OtlpDropLabels, Counter>,
    pub(super) sampled_out: Counter,
    pub(super) requests: Family<OtlpResultLabels, Counter>,
    last: Mutex<OtlpStats>,
}

impl OtlpMetrics {
    /// Adds what grew since the last totals.
    pub(super) fn observe(&self, now: &OtlpStats) {
        let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        add_growth(
            &self.spans_exported,
            now.spans_exported,
            last.spans_exported,
        );
        add_growth(
            &self.transactions_exported,
            now.transactions_exported,
            last.transactions_exported,
        );
        add_growth(&self.sampled_out, now.sampled_out, last.sampled_out);
        for (reason, n, was) in [
            (
                "queue_full",
                now.dropped_queue_full,
                last.dropped_queue_full,
            ),
            (
                "export_failed",
                now.dropped_export_failed,
                last.dropped_export_failed,
            ),
            ("at_exit", now.dropped_at_exit, last.dropped_at_exit),
        ] {
            add_growth(
                &self.dropped.get_or_create(&OtlpDropLabels { reason }),
                n,
                was,
            );
        }
        let ok = now.requests.saturating_sub(now.request_failures);
        let was_ok = last.requests.saturating_sub(last.request_failures);
        add_growth(
            &self
                .requests
                .get_or_create(&OtlpResultLabels { result: "ok" }),
            ok,
            was_ok,
        );
        add_growth(
            &self
                .requests
                .get_or_create(&OtlpResultLabels { result: "failed" }),
            now.request_failures,
            last.request_failures,
        );
        *last = now.clone();
    }
}

#[cfg(test)]
mod tests {
    use crate::{
        agent::metrics::Metrics,
        output::{otlp::OtlpStats, record::StatsRecord},
    };

    /// The exporter's running totals become counters that grow by what was added.
    #[test]
    fn exporter_totals_are_counters() {
        let m = Metrics::new();
        let mut s = StatsRecord {
            otlp: Some(OtlpStats {
                transactions_exported: 10,
                spans_exported: 40,
                dropped_queue_full: 2,
                requests: 3,
                request_failures: 1,
                ..Default::default()
            }),
            ..Default::default()
        };
        m.observe_stats(&s);
        if let Some(o) = s.otlp.as_mut() {
            o.transactions_exported = 15;
            o.dropped_at_exit = 1;
        }
        m.observe_stats(&s);
        let text = m.encode();
        for line in [
            "dnspath_otlp_transactions_exported_total 15",
            "dnspath_otlp_spans_exported_total 40",
            r#"dnspath_otlp_transactions_dropped_total{reason="queue_full"} 2"#,
            r#"dnspath_otlp_transactions_dropped_total{reason="at_exit"} 1"#,
            r#"dnspath_otlp_export_requests_total{result="ok"} 2"#,
            r#"dnspath_otlp_export_requests_total{result="failed"} 1"#,
        ] {
            assert!(text.contains(line), "{line} not in\n{text}");
        }
    }
}
