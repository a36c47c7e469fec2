//! `top`'s sink: each turn's records (those the filter keeps) counted into the shared
//! [`Tables`], an interval closed every `--interval`, and the tables written out: as JSON
//! snapshots, as `--once`'s text at the end, or drawn by the full-screen view's thread.
use std::{
    io::Write,
    sync::{Arc, Mutex, MutexGuard},
};

use crate::output::{
    filter::Filter,
    record::{Record, StatsRecord},
    sink::{Batch, PacketRecords, Sink, Wants},
    Format,
};

use super::{snapshot::Shown, tables::Tables, terminal::Screen, wall_now_ns};

/// Where the tables go.
pub enum TopOutput {
    /// `-o json` snapshots every interval, or `--once`'s one table (text or JSON) at the end.
    Batch {
        format: Format,
        once: bool,
        shown: Shown,
        out: Box<dyn Write + Send>,
    },
    /// The full-screen view, drawn by its own thread from the shared tables.
    Screen(Screen),
}

pub struct TopSink {
    tables: Arc<Mutex<Tables>>,
    filter: Filter,
    interval_ns: u64,
    /// When the run started, and when the last interval closed (the run's clock).
    started_ns: Option<u64>,
    rolled_ns: Option<u64>,
    output: TopOutput,
}

fn secs(ns: u64) -> f64 {
    ns as f64 / 1e9
}

impl TopSink {
    pub fn new(
        tables: Arc<Mutex<Tables>>,
        filter: Filter,
        interval_ns: u64,
        output: TopOutput,
    ) -> Self {
        Self {
            tables,
            filter,
            interval_ns,
            started_ns: None,
            rolled_ns: None,
            output,
        }
    }

    fn tables(&self) -> MutexGuard<'_, Tables> {
        // A panic while counting left the counts as they were: show them.
        self.tables
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn started_at(&mut self, now_ns: u64) -> u64 {
        *self.started_ns.get_or_insert(now_ns)
    }

    /// Closes the interval if one is due (`force`: whatever its length).
    fn roll(&mut self, now_ns: u64, force: bool) -> bool {
        let start = self.started_at(now_ns);
        let last = *self.rolled_ns.get_or_insert(start);
        let len = now_ns.saturating_sub(last);
        if !force && len < self.interval_ns {
            return false;
        }
        self.rolled_ns = Some(now_ns);
        self.tables().roll(secs(len));
        true
    }

    /// A JSON snapshot line, or `--once`'s table.
    fn write_batch(&mut self, last: bool, run_ns: u64) -> std::io::Result<()> {
        let snapshot = {
            let mut t = self
                .tables
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let TopOutput::Batch { shown, once, .. } = &self.output else {
                return Ok(());
            };
            if *once {
                t.rates_over_run(secs(run_ns));
            }
            t.snapshot(shown, wall_now_ns())
        };
        let TopOutput::Batch {
            format, once, out, ..
        } = &mut self.output
        else {
            return Ok(());
        };
        match format {
            Format::Json if !*once || last => {
                serde_json::to_writer(&mut *out, &snapshot)?;
                writeln!(out)?;
            }
            Format::Text if last => writeln!(out, "{}", snapshot.text())?,
            _ => return Ok(()),
        }
        out.flush()
    }
}

impl Sink for TopSink {
    fn started(&mut self, _setup: &crate::event::KernelSetup, now_ns: u64) {
        self.started_ns = Some(now_ns);
        self.rolled_ns = Some(now_ns);
        if let TopOutput::Screen(s) = &mut self.output {
            s.start();
        }
    }
    /// Packets count from the stats; hops' pods name the servers.
    fn wants(&self) -> Wants {
        Wants {
            packet_records: PacketRecords::Ignored,
            ..Wants::default()
        }
    }
    fn batch(&mut self, batch: Batch<'_>) -> std::io::Result<()> {
        self.started_at(batch.now_ns);
        let mut t = self
            .tables
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for r in batch.records {
            if !matches!(r, Record::Packet(_)) && self.filter.keep(r) {
                t.add(r);
            }
        }
        Ok(())
    }
    fn periodic(&mut self, stats: &StatsRecord, now_ns: u64) {
        self.tables().add_stats(stats);
        if self.roll(now_ns, false) {
            let run = now_ns.saturating_sub(self.started_at(now_ns));
            if let Err(e) = self.write_batch(false, run) {
                log::warn!("top: {e}");
            }
        }
    }
    fn finish(&mut self, stats: &mut StatsRecord, now_ns: u64) -> std::io::Result<()> {
        self.tables().add_stats(stats);
        self.roll(now_ns, true);
        let run = now_ns.saturating_sub(self.started_at(now_ns));
        if let TopOutput::Screen(s) = &mut self.output {
            s.stop();
        }
        self.write_batch(true, run)
    }
    fn abort(&mut self, _now_ns: u64) {
        if let TopOutput::Screen(s) = &mut self.output {
            s.stop();
        }
    }
}
