//! The text/NDJSON output of a run: which records it writes ([`RecordsOut`]: the view,
//! `--count`'s packet limit, the filter), and [`WriterSink`], the sink that writes them
//! straight to a [`RecordWriter`] (`analyze`; `trace` puts a queue in between,
//! `trace::TraceWriter`).
use std::io;

use crate::output::{
    filter::Filter,
    record::StatsRecord,
    sink::{Batch, Sink},
    Record, RecordWriter, View,
};

/// Which records a text/NDJSON output writes: packet records only within `--count` and when
/// the view shows them, and what the filter keeps.
pub struct RecordsOut {
    show_packets: bool,
    filter: Filter,
}

impl RecordsOut {
    pub fn new(view: View, filter: Filter) -> Self {
        Self {
            show_packets: view.packets(),
            filter,
        }
    }

    /// Every packet record is written (the view shows packets, no filter): none held back
    /// is one that would not have been written anyway.
    pub fn writes_every_packet(&self) -> bool {
        self.show_packets && !self.filter.is_active()
    }

    /// Whether no packet record is ever written (the view has no packets).
    pub fn writes_no_packet(&self) -> bool {
        !self.show_packets
    }

    /// Whether `r` is written; `packets_allowed` counts down the packet records within
    /// `--count` ([`Batch::packets_allowed`]).
    pub fn keep(&self, r: &Record, packets_allowed: &mut Option<u64>) -> bool {
        if matches!(r, Record::Packet(_)) {
            match packets_allowed {
                Some(0) => return false,
                Some(n) => *n -= 1,
                None => {}
            }
            if !self.show_packets {
                return false;
            }
        }
        self.filter.keep(r)
    }

    /// Writes what it keeps of `records`, moved (not copied), and empties `records`; does
    /// not flush (`analyze` flushes once at the end).
    pub fn write(
        &self,
        records: &mut Vec<Record>,
        mut packets_allowed: Option<u64>,
        sink: &mut (impl RecordWriter + ?Sized),
    ) -> std::io::Result<()> {
        for r in records.drain(..) {
            if self.keep(&r, &mut packets_allowed) {
                sink.write_owned(r)?;
            }
        }
        Ok(())
    }
}

/// The records a run shows, written to `out` as they come, and the `stats` record at the
/// end. Registered last, it takes the records without a copy.
pub struct WriterSink<W: RecordWriter> {
    records: RecordsOut,
    out: W,
}

impl<W: RecordWriter> WriterSink<W> {
    pub fn new(records: RecordsOut, out: W) -> Self {
        Self { records, out }
    }
}

impl<W: RecordWriter> Sink for WriterSink<W> {
    /// Not the last of the list: what is written is copied.
    fn batch(&mut self, batch: Batch<'_>) -> io::Result<()> {
        let mut allowed = batch.packets_allowed;
        for r in batch.records {
            if self.records.keep(r, &mut allowed) {
                self.out.write(r)?;
            }
        }
        Ok(())
    }
    /// Written from where they are: this writer keeps nothing, so nothing is moved.
    fn batch_owned(&mut self, records: &mut Vec<Record>, batch: Batch<'_>) -> io::Result<()> {
        let result = self.batch(Batch { records, ..batch });
        records.clear();
        result
    }
    fn finish(&mut self, stats: &mut StatsRecord, _now_ns: u64) -> io::Result<()> {
        let mut stats = stats.clone();
        if let Some(s) = stats.summary.take() {
            self.out.write(&Record::Summary(s))?;
        }
        self.out.write(&Record::Stats(Box::new(stats)))?;
        self.out.flush()
    }
}
