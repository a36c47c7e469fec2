//! Detect stage: what the correlator's hops, legs and transactions add up to beyond one
//! transaction — forwarding loops ([`loops`]) and the conntrack DNAT race ([`race`]).
//!
//! Each detection is a [`Detector`] (the correlator's hooks: messages, legs, conntrack
//! samples, decided transactions, time) with its record, registered once in
//! [`Detectors::new`]. A detector that needs the stages before it to act (storm shedding
//! under a loop) says so with a [`Control`], which the pipeline applies.
//!
//! A new detection: its file here (the detector and its record), a variant of [`Detected`]
//! and a field of [`DetectStats`] if it counts anything, one line in [`Detectors::new`]; then
//! the sinks' `Record` and docs/output.md.
pub mod loops;
pub mod race;

use serde::Serialize;

pub use crate::correlate::detector::{Control, Detector};
use crate::{
    correlate::{
        detector::{Decided, DropEvidence, LegEvent},
        CorrelateConfig, Correlator, DropObservation, QKey,
    },
    event::CtStatsSample,
    time::Clock,
};

/// What the detectors report.
#[derive(Clone, Debug)]
#[expect(
    clippy::large_enum_variant,
    reason = "made and turned into a Record at once, never stored"
)]
pub enum Detected {
    Loop(loops::LoopRecord),
    Race(race::RaceRecord),
}

/// The detectors' counters (fields of the `stats` record's `correlate` object).
#[derive(Clone, Debug, Default, Serialize)]
pub struct DetectStats {
    pub loops: loops::LoopStats,
    pub races: race::RaceStats,
}

type Boxed = Box<dyn Detector<Report = Detected, Stats = DetectStats> + Send>;

/// Every detector, in the order their hooks run (and so their records come out).
pub struct Detectors(Vec<Boxed>);

impl Detectors {
    pub fn new(cfg: &CorrelateConfig, clock: Clock) -> Self {
        Self(vec![
            Box::new(loops::LoopTracker::new(clock, cfg)),
            Box::new(race::RaceDetector::new(clock, cfg)),
        ])
    }
}

impl Correlator<Detectors> {
    /// A correlator showing what it sees to every detector.
    pub fn new(cfg: CorrelateConfig, clock: Clock) -> Self {
        Correlator::with_detector(cfg, clock, Detectors::new(&cfg, clock))
    }
}

impl Detector for Detectors {
    type Report = Detected;
    type Stats = DetectStats;

    fn message(&mut self, q: &QKey, ts: u64) -> bool {
        self.0.iter_mut().any(|d| d.message(q, ts))
    }

    fn summarised(&mut self, q: &QKey, n: u64, ts: u64) {
        for d in &mut self.0 {
            d.summarised(q, n, ts);
        }
    }

    fn leg(&mut self, ev: &LegEvent<'_>) {
        for d in &mut self.0 {
            d.leg(ev);
        }
    }

    fn ct_stats(&mut self, s: &CtStatsSample) {
        for d in &mut self.0 {
            d.ct_stats(s);
        }
    }

    fn keeps(&self, d: &DropObservation) -> bool {
        self.0.iter().any(|x| x.keeps(d))
    }

    fn holds(&self, e: &DropEvidence, now: u64) -> Option<u64> {
        self.0.iter().filter_map(|d| d.holds(e, now)).max()
    }

    fn decided(&mut self, t: &Decided<'_>) {
        for d in &mut self.0 {
            d.decided(t);
        }
    }

    fn tick(&mut self, now: u64, all: bool, out: &mut Vec<Detected>, control: &mut Vec<Control>) {
        for d in &mut self.0 {
            d.tick(now, all, out, control);
        }
    }

    fn settle(&mut self, out: &mut Vec<Detected>) {
        for d in &mut self.0 {
            d.settle(out);
        }
    }

    fn stats(&self, into: &mut DetectStats) {
        for d in &self.0 {
            d.stats(into);
        }
    }
}
