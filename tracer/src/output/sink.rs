//! Where a run's records go: the one [`Sink`] trait of every mode (`trace`, `analyze`, the
//! agent, doctor), and [`Sinks`], the list each turn's [`Batch`] is fanned out to.
//!
//! Each turn of a run (live: the run loop, at least every 50 ms; offline: each event read)
//! the runner hands the list the records decided in the turn, after naming their pods,
//! together with the source packets and drops they came from, each with the records the
//! decoder made of it (a range of the batch, so nothing is searched). The list then
//!
//! 1. lets every sink [`Sink::enrich`] the records (the flight recorder names its files in
//!    the incidents' records), once, before any sink sees them;
//! 2. hands every sink but the last the batch, borrowed ([`Sink::batch`]), and the last
//!    one the records themselves ([`Sink::batch_owned`]): the text/JSON writer, registered
//!    last, moves them into its queue without a copy, and no sink copies records it only
//!    counts.
//!
//! A sink that can be slow (a pipe, a terminal, a log reader) keeps its own bounded queue
//! and thread (output/queue.rs): a slow reader costs records at that sink, counted in
//! `stats.sinks`, never packets of the ring buffer. When a run stops on its own (`--count`,
//! `--until loop`) is not a sink's business but the runner's stop policy, beside the list
//! (`runner::stop`); it tells the sinks how many of a batch's packet records are within
//! `--count` ([`Batch::packets_allowed`]).
//!
//! **Adding a sink**: one file with a type that implements [`Sink`] (only [`Sink::batch`]
//! and [`Sink::finish`] are required; [`Sink::wants`] if it wants the packets), and
//! one line where the mode assembles its list (`trace::output_sinks` for `trace`,
//! `agent::run::run` for the agent): `sinks.push(Box::new(MySink::new(…)))`.
use std::{io, ops::Range};

use crate::{
    event::{CapturedPacket, KernelDrop, KernelSetup},
    output::record::{Record, StatsRecord},
};

/// A packet or drop as the source handed it over.
pub enum Source {
    Packet(CapturedPacket),
    Drop(KernelDrop),
}

/// A source packet or drop of the batch, kept only when a sink wants them (its bytes are
/// shared with the decoder, not copied).
pub struct Sourced {
    pub source: Source,
    /// The records the decoder made of it, as a range of the batch's records. Empty for a
    /// packet held for reassembly, shed under a loop, or a drop in a namespace not traced.
    pub records: Range<usize>,
}

/// One turn's records and where they came from.
#[derive(Clone, Copy)]
pub struct Batch<'a> {
    /// The records decided this turn, in the order they were decided. Empty in the batch
    /// handed to [`Sink::batch_owned`], whose records come apart.
    pub records: &'a [Record],
    /// The packets and drops read this turn (only when a sink wants them).
    pub sources: &'a [Sourced],
    /// How many of this batch's packet records are within `--count`: those beyond were
    /// decided after it was reached and are not written. `None`: no limit.
    pub packets_allowed: Option<u64>,
    /// Packet records not made since the last batch because no sink wanted them
    /// ([`Sinks::hold_packet_records`]): a sink that does not ignore packet records (one
    /// that refused them then, whether or not its queue has room since) counts them as its
    /// own drops.
    pub packet_records_held: u64,
    pub now_ns: u64,
}

impl<'a> Batch<'a> {
    /// The records the decoder made of `s` (empty if the range is not this batch's).
    pub fn records_of(&self, s: &Sourced) -> &'a [Record] {
        self.records.get(s.records.clone()).unwrap_or_default()
    }
}

/// What a sink wants made for it ([`Sink::wants`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Wants {
    /// The batches' sources ([`Batch::sources`]): only when a sink wants them are the
    /// packets kept (asked once, when the run starts).
    pub sources: bool,
    /// What it would do with the packet records of whole messages made now (asked every
    /// turn, before the turn's packets are decoded).
    pub packet_records: PacketRecords,
    /// The pods of transactions' hops (asked once, when the run starts): a sink that
    /// reads only a transaction's client and drops (the agent's metrics and events) spares
    /// every hop its lookup when no sink wants them.
    pub hop_pods: bool,
}

impl Default for Wants {
    /// No sources; packet records and hops' pods wanted (a sink that says nothing gets
    /// them).
    fn default() -> Self {
        Self {
            sources: false,
            packet_records: PacketRecords::Wanted,
            hop_pods: true,
        }
    }
}

/// What a sink would do with the packet records of whole messages made now
/// ([`Wants::packet_records`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PacketRecords {
    /// It writes or reads them (the default: a sink that says nothing gets them).
    Wanted,
    /// It never uses them (the OTLP exporter; trace's output without the packet view).
    Ignored,
    /// It would drop them, counted: its queue is full.
    Refused,
}

/// Where records go. Every method but [`Sink::batch`] and [`Sink::finish`] has a default
/// that does nothing.
pub trait Sink {
    /// Attached (live): what this kernel gave.
    fn started(&mut self, _setup: &KernelSetup, _now_ns: u64) {}
    /// What this sink wants made for it: the sources, the packet records. When no sink
    /// wants a turn's packet records and one refuses them, the decoder holds them back
    /// ([`Sinks::hold_packet_records`]; [`Batch::packet_records_held`] says how many).
    fn wants(&self) -> Wants {
        Wants::default()
    }
    /// Before any sink sees the batch: what this sink writes into the records for every
    /// sink (the flight recorder's file of an incident).
    fn enrich(&mut self, _records: &mut [Record], _now_ns: u64) {}
    /// Each turn: the records decided since the last one.
    fn batch(&mut self, batch: Batch<'_>) -> io::Result<()>;
    /// [`Sink::batch`] for the last sink of the list: `records` are the batch's (not in
    /// `batch.records`), to take; what is left is dropped after the call.
    fn batch_owned(&mut self, records: &mut Vec<Record>, batch: Batch<'_>) -> io::Result<()> {
        self.batch(Batch { records, ..batch })
    }
    /// This sink's running counts into the periodic `stats` (e.g. `otlp`).
    fn stats(&self, _stats: &mut StatsRecord) {}
    /// About once a second (live): the running totals.
    fn periodic(&mut self, _stats: &StatsRecord, _now_ns: u64) {}
    /// The run is over and its last records went to [`Sink::batch`]. Sinks finish in list
    /// order, each adding its final counts to `stats` for the ones after it (the text/JSON
    /// writer, last, writes the `stats` record).
    fn finish(&mut self, stats: &mut StatsRecord, now_ns: u64) -> io::Result<()>;
    /// The run failed, or the output's reader went away: no `stats` record; what the sink
    /// holds is completed where it can be (pcapng files).
    fn abort(&mut self, _now_ns: u64) {}
}

/// The sinks of a run, in order: each turn's batch goes to every one.
#[derive(Default)]
pub struct Sinks<'a> {
    list: Vec<Box<dyn Sink + 'a>>,
}

impl<'a> Sinks<'a> {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds `sink` at the end (the last one takes the records: register the text/JSON
    /// writer last).
    pub fn push(&mut self, sink: Box<dyn Sink + 'a>) {
        self.list.push(sink);
    }

    /// Adds `sink` at the front: it sees each batch before the others (the runner's
    /// evidence, which needs the run's clock and names).
    pub fn push_front(&mut self, sink: Box<dyn Sink + 'a>) {
        self.list.insert(0, sink);
    }

    pub fn len(&self) -> usize {
        self.list.len()
    }

    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    /// Some sink reads the batches' sources: the runner keeps them.
    pub fn wants_sources(&self) -> bool {
        self.list.iter().any(|s| s.wants().sources)
    }

    /// Some sink reads the pods of transactions' hops ([`Wants::hop_pods`]).
    pub fn wants_hop_pods(&self) -> bool {
        self.list.iter().any(|s| s.wants().hop_pods)
    }

    /// No sink wants packet records now: one refuses them (its queue is full), or every
    /// one ignores them (`trace`'s text, whose view has no packets). The turn's whole
    /// messages may go without (the refused ones counted from
    /// [`Batch::packet_records_held`]).
    pub fn hold_packet_records(&self) -> bool {
        !self
            .list
            .iter()
            .any(|s| s.wants().packet_records == PacketRecords::Wanted)
    }

    pub fn started(&mut self, setup: &KernelSetup, now_ns: u64) {
        for s in &mut self.list {
            s.started(setup, now_ns);
        }
    }

    /// One turn: `records` enriched, then handed to every sink (moved into the last), with
    /// how many packet records were held back since the last batch
    /// ([`Batch::packet_records_held`]); `records` and `sources` are left empty. Every sink
    /// sees the batch even when one fails; the first error is returned.
    pub fn batch(
        &mut self,
        records: &mut Vec<Record>,
        sources: &mut Vec<Sourced>,
        packets_allowed: Option<u64>,
        packet_records_held: u64,
        now_ns: u64,
    ) -> io::Result<()> {
        for s in &mut self.list {
            s.enrich(records, now_ns);
        }
        let mut result = Ok(());
        if let Some((last, rest)) = self.list.split_last_mut() {
            let batch = Batch {
                records,
                sources,
                packets_allowed,
                packet_records_held,
                now_ns,
            };
            for s in rest {
                let r = s.batch(batch);
                if result.is_ok() {
                    result = r;
                }
            }
            let r = last.batch_owned(
                records,
                Batch {
                    records: &[],
                    sources,
                    packets_allowed,
                    packet_records_held,
                    now_ns,
                },
            );
            if result.is_ok() {
                result = r;
            }
        }
        records.clear();
        sources.clear();
        result
    }

    /// The running totals, with what each sink adds to them, to every sink.
    pub fn periodic(&mut self, stats: &StatsRecord, now_ns: u64) {
        let mut stats = stats.clone();
        for s in &self.list {
            s.stats(&mut stats);
        }
        for s in &mut self.list {
            s.periodic(&stats, now_ns);
        }
    }

    /// The end, in list order (see [`Sink::finish`]); every sink finishes, the first error
    /// is returned.
    pub fn finish(&mut self, stats: &mut StatsRecord, now_ns: u64) -> io::Result<()> {
        let mut result = Ok(());
        for s in &mut self.list {
            let r = s.finish(stats, now_ns);
            if result.is_ok() {
                result = r;
            }
        }
        result
    }

    pub fn abort(&mut self, now_ns: u64) {
        for s in &mut self.list {
            s.abort(now_ns);
        }
    }
}

#[cfg(test)]
#[path = "sink_tests.rs"]
mod tests;
