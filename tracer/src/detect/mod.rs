//! Detect stage: what the correlator's hops, legs and transactions add up to beyond one
//! transaction — forwarding loops ([`loops`]) and the conntrack DNAT race ([`race`]).
//!
//! Each detection is a [`Detector`] (the correlator's hooks: messages, legs, conntrack
//! samples, decided transactions, time) with its record, registered once in
//! the `detectors!` list below. A detector that needs the stages before it to act (storm shedding
//! under a loop) says so with a [`Control`], which the pipeline applies.
//!
//! A new detection: its file here (the detector and its record), a variant of [`Detected`]
//! and a field of [`DetectStats`] if it counts anything, one line in the `detectors!` list; then
//! the sinks' `Record` and docs/output.md.
pub(crate) mod loops;
pub(crate) mod race;

use serde::Serialize;

pub(crate) use crate::correlate::detector::{Control, Detector};
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

/// Declares [`Detectors`] from its list: each detector's field, type and constructor
/// (`fn(Clock, &CorrelateConfig) -> Self`). Every hook calls the detectors in list order,
/// statically (no indirect call per message).
macro_rules! detectors {
    ($($field:ident: $ty:ty),* $(,)?) => {
        /// Every detector, in the order their hooks run (and so their records come out).
        pub(crate) struct Detectors {
            $($field: $ty,)*
        }

        impl Detectors {
            pub(crate) fn new(cfg: &CorrelateConfig, clock: Clock) -> Self {
                Self {
                    $($field: <$ty>::new(clock, cfg),)*
                }
            }
        }

        impl Detector for Detectors {
            type Report = Detected;
            type Stats = DetectStats;

            fn message(&mut self, q: &QKey, ts: u64) -> bool {
                $(self.$field.message(q, ts))||*
            }

            fn summarised(&mut self, q: &QKey, n: u64, ts: u64) {
                $(self.$field.summarised(q, n, ts);)*
            }

            fn leg(&mut self, ev: &LegEvent<'_>) {
                $(self.$field.leg(ev);)*
            }

            fn ct_stats(&mut self, s: &CtStatsSample) {
                $(self.$field.ct_stats(s);)*
            }

            fn keeps(&self, d: &DropObservation) -> bool {
                $(self.$field.keeps(d))||*
            }

            fn unmatched_drop(&mut self, d: &DropObservation, q: &QKey) {
                $(self.$field.unmatched_drop(d, q);)*
            }

            fn holds(&self, e: &DropEvidence, now: u64) -> Option<u64> {
                [$(self.$field.holds(e, now)),*].into_iter().flatten().max()
            }

            fn decided(&mut self, t: &Decided<'_>) {
                $(self.$field.decided(t);)*
            }

            fn tick(
                &mut self,
                now: u64,
                all: bool,
                out: &mut Vec<Detected>,
                control: &mut Vec<Control>,
            ) {
                $(self.$field.tick(now, all, out, control);)*
            }

            fn settle(&mut self, out: &mut Vec<Detected>) {
                $(self.$field.settle(out);)*
            }

            fn stats(&self, into: &mut DetectStats) {
                $(self.$field.stats(into);)*
            }

            fn check_bounds(&self) -> Result<(), String> {
                $(self.$field.check_bounds()?;)*
                Ok(())
            }
        }
    };
}

// The registration: one line a detection.
detectors! {
    loops: loops::LoopTracker,
    races: race::RaceDetector,
}

impl Correlator<Detectors> {
    /// A correlator showing what it sees to every detector.
    pub(crate) fn new(cfg: CorrelateConfig, clock: Clock) -> Self {
        Correlator::with_detector(cfg, clock, Detectors::new(&cfg, clock))
    }
}
