//! `--otlp`: the live run's decided transactions offered to the OTLP exporter, in front of
//! the run's own sink. The exporter has its own thread and bounded queue: this only copies
//! the transactions it keeps into the queue, never waits (docs/otlp.md).
use super::LiveSink;
use crate::{
    event::KernelSetup,
    output::{
        otlp::{Exporter, OtlpStats},
        record::StatsRecord,
        Record,
    },
};

/// `inner` with the transactions also exported; the final `stats` record gains `otlp`.
pub struct OtlpSink<'a> {
    inner: &'a mut dyn LiveSink,
    exporter: Option<Exporter>,
    /// Set at the end: the exporter's final counts.
    pub stats: Option<OtlpStats>,
}

impl<'a> OtlpSink<'a> {
    pub fn new(inner: &'a mut dyn LiveSink, exporter: Exporter) -> Self {
        Self {
            inner,
            exporter: Some(exporter),
            stats: None,
        }
    }

    /// The counts so far (the agent's metrics).
    pub fn running(&self) -> OtlpStats {
        self.exporter
            .as_ref()
            .map(Exporter::stats)
            .or_else(|| self.stats.clone())
            .unwrap_or_default()
    }
}

impl LiveSink for OtlpSink<'_> {
    fn started(&mut self, setup: &KernelSetup, now_ns: u64) {
        self.inner.started(setup, now_ns);
    }
    fn batch(&mut self, records: &mut Vec<Record>, now_ns: u64) -> std::io::Result<bool> {
        if let Some(e) = &self.exporter {
            for r in records.iter() {
                if let Record::Transaction(t) = r {
                    e.offer(t);
                }
            }
        }
        self.inner.batch(records, now_ns)
    }
    fn periodic(&mut self, stats: &StatsRecord, now_ns: u64) {
        let mut s = stats.clone();
        s.otlp = Some(self.running());
        self.inner.periodic(&s, now_ns);
    }
    fn finish(&mut self, stats: &StatsRecord, now_ns: u64) -> std::io::Result<()> {
        // What is queued goes first, within the flush bound (`--otlp-flush-timeout`).
        if let Some(e) = self.exporter.take() {
            self.stats = Some(e.finish());
        }
        let mut s = stats.clone();
        s.otlp = self.stats.clone();
        self.inner.finish(&s, now_ns)
    }
    fn count_reached(&self) -> bool {
        self.inner.count_reached()
    }
    fn loop_found(&self) -> bool {
        self.inner.loop_found()
    }
    fn not_written(&self) -> u64 {
        self.inner.not_written()
    }
}
