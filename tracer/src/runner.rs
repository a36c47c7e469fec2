//! The one runner every mode drives: a source's events go through the [`Pipeline`], what it
//! decides is enriched (pods named; then what the sinks write into the records, such as the
//! flight recorder's file of an incident), admitted past the [`StopPolicy`] (`--count`,
//! `--until loop`) and handed to the [`Sinks`].
//!
//! A mode differs only in its source and its sinks. `trace`, the agent and doctor run the
//! live engine (crate::engine), which reads the kernel's ring buffer and conntrack and calls
//! [`Runner::turn`] at least every [`TICK`](crate::pipeline::TICK); `analyze` reads a capture
//! file and calls it per event, ticking on the capture's clock. Both end with
//! [`Runner::finish`]. Whatever is decided in a turn goes out together, in the order it was
//! decided.
use std::io;

pub mod stop;

use crate::{
    event::SourceEvent,
    names::SharedNames,
    output::{
        pods,
        record::{Record, StatsRecord},
        sink::{Sinks, Sourced},
    },
    pipeline::Pipeline,
};
use stop::StopPolicy;

/// What time a turn decides at.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Tick {
    /// Nothing is due this turn (offline: less than a tick of capture time passed).
    No,
    /// At this time of the source's clock (offline: the capture's latest timestamp).
    At(u64),
    /// Live, read at `clock_ns`: at that time unless the source is `behind` (see
    /// [`Pipeline::tick_live`]).
    Live { clock_ns: u64, behind: bool },
}

/// The pipeline, the enrich stage, and what waits for the sinks.
pub(crate) struct Runner {
    pipeline: Pipeline,
    /// The pods' names (live: kept by the namespace scans). Offline the map knows no pods
    /// and naming costs nothing.
    names: SharedNames,
    records: Vec<Record>,
    /// The packets and drops of the records waiting, when a sink wants them.
    sources: Vec<Sourced>,
    keep_sources: bool,
    /// Some sink reads the pods of transactions' hops: they are named.
    hop_pods: bool,
    /// Packet records held back since the last hand-over (no sink wanted them).
    held: u64,
    /// Records wait until this many are decided (0: every turn hands over what it has).
    batch_at: usize,
}

impl Runner {
    /// A runner of `pipeline` for `sinks` (as registered: whether one wants the sources is
    /// asked now). `batch_at`: see [`Runner::turn`].
    pub(crate) fn new(
        pipeline: Pipeline,
        names: SharedNames,
        sinks: &Sinks<'_>,
        batch_at: usize,
    ) -> Self {
        Self {
            pipeline,
            names,
            records: Vec::new(),
            sources: Vec::new(),
            keep_sources: sinks.wants_sources(),
            hop_pods: sinks.wants_hop_pods(),
            held: 0,
            batch_at,
        }
    }

    pub(crate) fn pipeline_mut(&mut self) -> &mut Pipeline {
        &mut self.pipeline
    }

    /// The pipeline's counts so far.
    pub(crate) fn stats(&self) -> StatsRecord {
        self.pipeline.stats()
    }

    /// One turn: `events` (drained) through the pipeline, what is due at `tick` decided,
    /// and everything decided since the last hand-over given to `sinks` — once at least
    /// `batch_at` records wait. When no sink wants this turn's packet records (and
    /// `--count` does not count them), they are not made; the packets are decoded, counted
    /// and correlated all the same ([`Sinks::hold_packet_records`]).
    pub(crate) fn turn(
        &mut self,
        events: &mut Vec<SourceEvent>,
        tick: Tick,
        sinks: &mut Sinks<'_>,
        policy: &mut StopPolicy,
        now_ns: u64,
    ) -> io::Result<()> {
        let hold = !policy.counts_packets() && sinks.hold_packet_records();
        if hold {
            self.pipeline.hold_packet_records(true);
        }
        self.push(events);
        match tick {
            Tick::No => {}
            Tick::At(t) => self.pipeline.tick(t, &mut self.records),
            Tick::Live { clock_ns, behind } => {
                self.pipeline.tick_live(clock_ns, behind, &mut self.records);
            }
        }
        if hold {
            self.pipeline.hold_packet_records(false);
            self.held += self.pipeline.take_held_packet_records();
        }
        if self.records.len() >= self.batch_at {
            self.hand_over(sinks, policy, now_ns)?;
        }
        Ok(())
    }

    /// Source events into the pipeline (drained); their records wait for the next
    /// hand-over. Conntrack events go in this way before a turn's packets, which they may
    /// have NATed.
    pub(crate) fn push(&mut self, events: &mut Vec<SourceEvent>) {
        if self.keep_sources {
            for ev in events.drain(..) {
                self.pipeline
                    .push_keeping(ev, &mut self.records, &mut self.sources);
            }
        } else {
            for ev in events.drain(..) {
                self.pipeline.push(ev, &mut self.records);
            }
        }
    }

    /// The input ended: everything still pending is decided and handed to the sinks in
    /// batches of at most [`FINISH_BATCH`](crate::pipeline::FINISH_BATCH) transactions,
    /// each before the next is made (the first with whatever waited). `now_ns` 0: the time
    /// of the last packet. Stops at the first error.
    pub(crate) fn finish(
        &mut self,
        now_ns: u64,
        sinks: &mut Sinks<'_>,
        policy: &mut StopPolicy,
    ) -> io::Result<()> {
        loop {
            let more = self.pipeline.finish(now_ns, &mut self.records);
            self.hand_over(sinks, policy, now_ns)?;
            if !more {
                return Ok(());
            }
        }
    }

    /// The enrich stage, the stop policy, then every sink (see
    /// [`Sinks::batch`](crate::output::sink::Sinks::batch)).
    fn hand_over(
        &mut self,
        sinks: &mut Sinks<'_>,
        policy: &mut StopPolicy,
        now_ns: u64,
    ) -> io::Result<()> {
        self.name_pods();
        let allowed = policy.admit(&self.records);
        let held = std::mem::take(&mut self.held);
        sinks.batch(&mut self.records, &mut self.sources, allowed, held, now_ns)
    }

    /// Names the pods of every place in the waiting records (one map lookup each), under
    /// the names' lock only as long as the lookups take.
    fn name_pods(&mut self) {
        if self.records.is_empty() {
            return;
        }
        let hops = self.hop_pods;
        if let Ok(names) = self.names.read() {
            if !names.knows_pods() {
                return;
            }
            for r in &mut self.records {
                pods::annotate(r, &names, hops);
            }
        }
    }
}

#[cfg(test)]
#[path = "runner_tests.rs"]
mod tests;
