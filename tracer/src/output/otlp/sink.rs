//! `--otlp`: the run's decided transactions offered to the OTLP exporter, a sink of the
//! list. The exporter has its own thread and bounded queue: this only copies the
//! transactions it keeps into the queue, never waits (docs/otlp.md).
use crate::output::{
    otlp::{Exporter, OtlpStats},
    record::StatsRecord,
    sink::{Batch, PacketRecords, Sink, Wants},
    Record,
};

/// The transactions exported; the `stats` records of the sinks after it gain `otlp`.
pub struct OtlpSink {
    exporter: Option<Exporter>,
    /// Set at the end: the exporter's final counts.
    stats: Option<OtlpStats>,
}

impl OtlpSink {
    pub fn new(exporter: Exporter) -> Self {
        Self {
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

impl Sink for OtlpSink {
    fn wants(&self) -> Wants {
        Wants {
            packet_records: PacketRecords::Ignored,
            ..Wants::default()
        }
    }
    fn batch(&mut self, batch: Batch<'_>) -> std::io::Result<()> {
        if let Some(e) = &self.exporter {
            for r in batch.records {
                if let Record::Transaction(t) = r {
                    e.offer(t);
                }
            }
        }
        Ok(())
    }
    fn stats(&self, stats: &mut StatsRecord) {
        stats.otlp = Some(self.running());
    }
    fn finish(&mut self, stats: &mut StatsRecord, _now_ns: u64) -> std::io::Result<()> {
        // What is queued goes first, within the flush bound (`--otlp-flush-timeout`).
        if let Some(e) = self.exporter.take() {
            self.stats = Some(e.finish());
        }
        stats.otlp = self.stats.clone();
        Ok(())
    }
}
