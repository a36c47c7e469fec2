//! The stages in order: source events in, records out.
//!
//! **decode** ([`Decoder`]: packets and drops → packet/drop records and typed observations)
//! → **correlate** ([`Correlator`]: hops, legs, transactions) and **detect** ([`Detectors`],
//! shown what the correlator sees: loops, races) → records for the sinks. What a detector
//! asks of the stages before it ([`Control`]: shed a looping question) is applied here.
//! [`Pipeline::push`] takes a source event, [`Pipeline::tick`] tells it time passed, and
//! [`Pipeline::finish`] ends it; every mode calls them through the one runner
//! ([`crate::runner::Runner`]), which hands what comes out to the sinks.
use crate::{
    correlate::{CorrelateConfig, Correlator, Observed},
    decode::{
        decoder::{Decoder, Summarised},
        dns::{RrClass, RrType},
    },
    detect::{Control, Detectors},
    event::{KernelCounters, ShedChange, ShedQuestion, SourceEvent},
    output::{
        record::{Record, StatsRecord},
        sink::{Source, Sourced},
    },
    time::Clock,
};

/// How often every mode calls [`Pipeline::tick`]: in wall time live (`trace`, the agent),
/// in capture time reading a file (`analyze`).
pub(crate) const TICK_NS: u64 = 50_000_000;
/// [`TICK_NS`] as a [`std::time::Duration`].
pub(crate) const TICK: std::time::Duration = std::time::Duration::from_nanos(TICK_NS);
/// Open transactions one [`Pipeline::finish`] call reports: a stop with the correlate
/// stage's table full (65,536 legs) hands its records to the sinks in batches of this many,
/// not all at once (the agent's memory limit).
pub(crate) const FINISH_BATCH: usize = 1024;

#[derive(Clone, Copy, Debug)]
pub(crate) struct PipelineConfig {
    /// Run the correlate and detect stages (transactions, loops, races). Without them only
    /// packet and drop records come out.
    pub transactions: bool,
    /// A query unanswered for this long is reported as such.
    pub timeout_ns: u64,
    /// Under a detected forwarding loop, only count the looping question's UDP packets
    /// instead of decoding them (live: a loop runs at hundreds of thousands of packets per
    /// second); decode them again when it ends.
    pub shed_loops: bool,
    /// The node's own network namespace (live: the one dnspath runs in): a DNS server
    /// there is a node cache (NodeLocal DNSCache). `None` offline.
    pub node_netns: Option<u64>,
}

pub(crate) struct Pipeline {
    decoder: Decoder,
    correlator: Option<Correlator<Detectors>>,
    shed_loops: bool,
    controls: Vec<Control>,
    observed: Vec<Observed>,
    summarised: Vec<Summarised>,
    /// Some source applies [`ShedChange`]s (and takes them every turn).
    kernel_shedding: bool,
    shed_changes: Vec<ShedChange>,
    /// [`Pipeline::finish`] was called: the decode stage is finished.
    finishing: bool,
}

impl Pipeline {
    pub(crate) fn new(decoder: Decoder, cfg: PipelineConfig, clock: Clock) -> Self {
        Self::with_bounds(decoder, cfg, CorrelateConfig::default(), clock)
    }

    /// [`Pipeline::new`] with the correlate stage's windows and bounds of `bounds` (its
    /// timeout and node namespace are `cfg`'s): the fuzz harness's small tables.
    pub(crate) fn with_bounds(
        mut decoder: Decoder,
        cfg: PipelineConfig,
        bounds: CorrelateConfig,
        clock: Clock,
    ) -> Self {
        let correlator = cfg.transactions.then(|| {
            decoder.collect_observations();
            Correlator::new(
                CorrelateConfig {
                    timeout_ns: cfg.timeout_ns,
                    node_netns: cfg.node_netns,
                    ..bounds
                },
                clock,
            )
        });
        Self {
            decoder,
            correlator,
            shed_loops: cfg.shed_loops,
            controls: Vec::new(),
            observed: Vec::new(),
            summarised: Vec::new(),
            kernel_shedding: false,
            shed_changes: Vec::new(),
            finishing: false,
        }
    }

    /// One source event. Packets and drops are decoded (their records appended to `out`)
    /// and handed to the correlate stage; conntrack events and samples go to it directly.
    pub(crate) fn push(&mut self, ev: SourceEvent, out: &mut Vec<Record>) {
        match ev {
            SourceEvent::Conntrack(ct) => {
                if let Some(c) = self.correlator.as_mut() {
                    c.on_conntrack(&ct);
                }
            }
            SourceEvent::CtStats(s) => {
                if let Some(c) = self.correlator.as_mut() {
                    c.on_ct_stats(s);
                }
            }
            SourceEvent::Packet(p) => {
                self.decoder.on_packet(p, out);
                self.hand_over();
            }
            SourceEvent::Drop(d) => {
                self.decoder.on_drop(d, out);
                self.hand_over();
            }
            SourceEvent::Garbled { len, why } => self.decoder.on_garbled(len, why),
        }
    }

    /// [`Pipeline::push`], keeping a packet or drop in `sources` with the range of `out` the
    /// decoder made of it, for the sinks that want them
    /// ([`Wants::sources`](crate::output::sink::Wants::sources)): nothing is
    /// searched afterwards, and the packet's bytes are shared with the decoder, not copied.
    pub(crate) fn push_keeping(
        &mut self,
        ev: SourceEvent,
        out: &mut Vec<Record>,
        sources: &mut Vec<Sourced>,
    ) {
        let source = match &ev {
            SourceEvent::Packet(p) => Source::Packet(p.clone()),
            SourceEvent::Drop(d) => Source::Drop(d.clone()),
            _ => return self.push(ev, out),
        };
        let from = out.len();
        self.push(ev, out);
        sources.push(Sourced {
            source,
            records: from..out.len(),
        });
    }

    /// Time passed (`now_ns` on the source's clock): transactions, loops and races that are
    /// decided come out.
    pub(crate) fn tick(&mut self, now_ns: u64, out: &mut Vec<Record>) {
        // Datagrams past their reassembly timeout are reported (and their messages handed
        // over as lost) before the correlate stage decides.
        self.decoder.tick(now_ns, out);
        self.hand_over();
        if let Some(c) = self.correlator.as_mut() {
            c.tick(now_ns, out);
            c.take_controls(&mut self.controls);
            self.apply_controls();
        }
    }

    /// [`Pipeline::tick`] for a live source read at `clock_ns`: at that time, unless the
    /// source is `behind` (records still wait in the ring buffer: a reader late by up to
    /// seconds, stopped or starved): then at the latest time read, so that no query is
    /// timed out whose answer is still unread.
    pub(crate) fn tick_live(&mut self, clock_ns: u64, behind: bool, out: &mut Vec<Record>) {
        let now = if behind {
            self.decoder.now_ns().min(clock_ns)
        } else {
            clock_ns
        };
        self.tick(now, out);
    }

    /// The input ended: everything still pending is decided and comes out (unfinished TCP
    /// messages as malformed, open transactions as they stand), at most [`FINISH_BATCH`]
    /// transactions a call. True while some are left: hand `out` to the sinks and call it
    /// again. `now_ns` 0: the time of the last packet.
    pub(crate) fn finish(&mut self, now_ns: u64, out: &mut Vec<Record>) -> bool {
        if !self.finishing {
            self.finishing = true;
            self.decoder.finish(now_ns, out);
            self.hand_over();
        }
        match self.correlator.as_mut() {
            Some(c) => c.flush(now_ns.max(self.decoder.now_ns()), FINISH_BATCH, out),
            None => false,
        }
    }

    /// The live source sheds looping questions in the kernel: from now on
    /// [`Pipeline::take_shed_changes`] says which, and must be called every turn.
    pub(crate) fn enable_kernel_shedding(&mut self) {
        self.kernel_shedding = self.shed_loops;
    }

    /// Loops detected or ended since the last call: what the kernel should start or stop
    /// shedding.
    pub(crate) fn take_shed_changes(&mut self, out: &mut Vec<ShedChange>) {
        out.append(&mut self.shed_changes);
    }

    /// The kernel only counted `n` packets of `q` (last at `ts_ns`): into `stats.shed` and
    /// the loop's `summarised`.
    pub(crate) fn kernel_shed(&mut self, q: &ShedQuestion, n: u64, ts_ns: u64) {
        if n == 0 {
            return;
        }
        self.decoder.kernel_shed(n);
        if let Some(c) = self.correlator.as_mut() {
            c.summarised(&q.name, RrType(q.qtype), RrClass(q.class), n, ts_ns);
        }
    }

    /// Latest kernel counters (live only).
    pub(crate) fn set_kernel_counters(&mut self, k: KernelCounters) {
        self.decoder.set_kernel_counters(k);
    }

    /// See [`Decoder::hold_packet_records`].
    pub(crate) fn hold_packet_records(&mut self, hold: bool) {
        self.decoder.hold_packet_records(hold);
    }

    /// See [`Decoder::take_held`].
    pub(crate) fn take_held_packet_records(&mut self) -> u64 {
        self.decoder.take_held()
    }

    pub(crate) fn stats(&self) -> StatsRecord {
        StatsRecord::new(
            self.decoder.stats(),
            self.correlator.as_ref().map(Correlator::stats),
        )
    }

    /// Every table of the decode and correlate stages (and the detectors) within its bound
    /// (the fuzz harness's check).
    pub(crate) fn check_bounds(&self) -> Result<(), String> {
        self.decoder.check_bounds(crate::detect::loops::MAX_LOOPS)?;
        self.correlator
            .as_ref()
            .map_or(Ok(()), Correlator::check_bounds)
    }

    fn hand_over(&mut self) {
        let Some(c) = self.correlator.as_mut() else {
            return;
        };
        self.decoder.take_observed(&mut self.observed);
        for o in self.observed.drain(..) {
            c.on_observed(o);
        }
        self.decoder.take_summarised(&mut self.summarised);
        for s in self.summarised.drain(..) {
            c.summarised(&s.name, s.qtype, s.class, s.count, s.last_ts);
        }
    }

    /// What the detectors asked: under a loop, only count its packets (here and, live, in
    /// the kernel); when it ends, decode them again.
    fn apply_controls(&mut self) {
        for c in self.controls.drain(..) {
            if !self.shed_loops {
                continue;
            }
            match c {
                Control::Shed(w, q) => {
                    self.decoder.summarise(&w, &q.name, q.qtype, q.class);
                    if self.kernel_shedding {
                        self.shed_changes.push(ShedChange::Start(ShedQuestion {
                            hash: w.hash(),
                            name: q.name.clone(),
                            qtype: q.qtype.0,
                            class: q.class.0,
                        }));
                    }
                }
                Control::Unshed(w) => {
                    self.decoder.unsummarise(&w);
                    if self.kernel_shedding {
                        self.shed_changes.push(ShedChange::Stop(w.hash()));
                    }
                }
            }
        }
    }
}

#[cfg(test)]
#[path = "pipeline_tests.rs"]
pub(crate) mod tests;
