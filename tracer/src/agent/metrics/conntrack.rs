//! The conntrack watchers' counts as `dnspath_conntrack_*` metrics (registered in `mod.rs`),
//! from the running totals in `stats.conntrack`: an event lost here is a hop joined across
//! NAT by the fallback method, or a race judged without its counters.
use std::sync::Mutex;

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family},
};

use super::add_growth;
use crate::conntrack::ConntrackStats;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct CtLostLabels {
    /// `overrun` (the socket's buffer overflowed: at least one each), `malformed`,
    /// `dump_cut` (a resync dump over its cap), `queue_full` (the run loop's queue).
    pub(super) reason: &'static str,
}

#[derive(Debug, Default)]
pub(super) struct ConntrackMetrics {
    pub(super) events: Counter,
    pub(super) lost: Family<CtLostLabels, Counter>,
    pub(super) resyncs: Counter,
    pub(super) netns_capped: Counter,
    pub(super) netns_changes_lost: Counter,
    pub(super) netns_unfiltered: Counter,
    last: Mutex<ConntrackStats>,
}

impl ConntrackMetrics {
    /// Adds what grew since the last totals.
    pub(super) fn observe(&self, now: &ConntrackStats) {
        let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        add_growth(&self.events, now.events, last.events);
        add_growth(&self.resyncs, now.resyncs, last.resyncs);
        add_growth(&self.netns_capped, now.netns_capped, last.netns_capped);
        add_growth(
            &self.netns_changes_lost,
            now.netns_changes_lost,
            last.netns_changes_lost,
        );
        add_growth(
            &self.netns_unfiltered,
            now.kernel_unfiltered,
            last.kernel_unfiltered,
        );
        for (reason, n, was) in [
            ("overrun", now.overruns, last.overruns),
            ("malformed", now.malformed, last.malformed),
            ("dump_cut", now.dump_cut, last.dump_cut),
            ("queue_full", now.queue_full, last.queue_full),
        ] {
            add_growth(&self.lost.get_or_create(&CtLostLabels { reason }), n, was);
        }
        *last = now.clone();
    }
}

#[cfg(test)]
mod tests {
    use crate::{agent::metrics::Metrics, conntrack::ConntrackStats, output::record::StatsRecord};

    /// The watchers' running totals become counters that grow by what was added, each loss
    /// under its reason; the namespaces' counts likewise.
    #[test]
    fn watcher_totals_are_counters() {
        let m = Metrics::new();
        let mut s = StatsRecord {
            conntrack: Some(ConntrackStats {
                events: 100,
                overruns: 1,
                resyncs: 1,
                ..Default::default()
            }),
            ..Default::default()
        };
        m.observe_stats(&s);
        if let Some(c) = s.conntrack.as_mut() {
            c.events = 250;
            c.queue_full = 7;
            c.dump_cut = 3;
            c.netns_capped = 2;
            c.netns_changes_lost = 5;
            c.kernel_unfiltered = 1;
        }
        m.observe_stats(&s);
        let text = m.encode();
        for line in [
            "dnspath_conntrack_events_total 250",
            "dnspath_conntrack_resyncs_total 1",
            r#"dnspath_conntrack_events_lost_total{reason="overrun"} 1"#,
            r#"dnspath_conntrack_events_lost_total{reason="queue_full"} 7"#,
            r#"dnspath_conntrack_events_lost_total{reason="dump_cut"} 3"#,
            r#"dnspath_conntrack_events_lost_total{reason="malformed"} 0"#,
            "dnspath_conntrack_netns_capped_total 2",
            "dnspath_conntrack_netns_changes_lost_total 5",
            "dnspath_conntrack_netns_unfiltered_total 1",
        ] {
            assert!(text.contains(line), "{line} not in\n{text}");
        }
    }
}
