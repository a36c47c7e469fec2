//! Detect stage: what the correlator's hops, legs and transactions add up to beyond one
//! transaction — forwarding loops ([`loops`]) and the conntrack DNAT race ([`race`]).
//!
//! Each detection is a [`Detector`] (the correlator's hooks: messages, legs, conntrack
//! samples, decided transactions, time) with its record, a [`Detection`], registered once in
//! the `detectors!` list below. A detector that needs the stages before it to act (storm shedding
//! under a loop) says so with a [`Control`], which the pipeline applies.
//!
//! A new detection: its file here (the detector, its record and the record's
//! [`RecordKind`] and [`Detection`]), its tests, one line in the `detectors!` list, and
//! docs/output.md. Every sink takes it from there: JSON from its `Serialize`, text from
//! [`Detection::text`], the metric `dnspath_detections_total`, the run's summary and the
//! agent's events from [`Detection::failure`] and [`Detection::notice`], the flight recorder
//! from [`RecordKind::incident`]. Sinks that know more of loops and races (the loop banner,
//! the loop and race metrics, doctor's findings) match on them by name as extras.
pub(crate) mod loops;
pub(crate) mod race;
pub(crate) mod unexpected;

use serde::Serialize;

pub(crate) use crate::correlate::detector::{Control, Detector};
use crate::{
    correlate::{
        detector::{Decided, DropEvidence, LegEvent},
        CorrelateConfig, Correlator, DropObservation, QKey,
    },
    decode::record::RecordKind,
    event::CtStatsSample,
    time::Clock,
};

/// How the agent's event stream takes a detection's record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Notice {
    /// Always written (a loop found, a loop over).
    Always,
    /// Written within the event stream's rate limit of its kind (`--max-events-per-window`).
    Limited,
    /// Not written (a resolved clash, a suspected race: the metrics count them).
    Never,
}

/// What the sinks ask of a detection's record beyond [`RecordKind`]: answered in the file
/// that defines it, so that no sink changes for a new detection.
pub trait Detection: RecordKind {
    /// Its one text line (or block): a tag people scan for, what it is about, where. Strings
    /// from the wire escaped (`crate::show::escape`).
    fn text(&self) -> String;
    /// Whether it is news to count (a loop detected, not its updates; a race drop, not a
    /// resolved clash), and how the run's summary lists it: its failure class and one
    /// example (not escaped yet). Counted by `dnspath_detections_total`.
    fn failure(&self) -> Option<(&'static str, String)>;
    /// How the agent's event stream takes it.
    fn notice(&self) -> Notice {
        if self.failure().is_some() {
            Notice::Limited
        } else {
            Notice::Never
        }
    }
}

/// A detection's record with every optional part filled: what docs/output.md's check
/// (`output/fields.rs`) writes. Each detection's tests give theirs.
#[cfg(test)]
pub(crate) trait Sample {
    fn sample() -> Self;
}

/// Declares, from the list of detections, [`Detectors`] (each detector's field, type and
/// constructor `fn(Clock, &CorrelateConfig) -> Self`), [`Detected`] (their records, each
/// variant its JSON `type`) and [`DetectStats`] (their counters, each under the detector's
/// field name). Every hook calls the detectors in list order, statically (no indirect call
/// per message).
macro_rules! detectors {
    ($($field:ident: $ty:ty => $variant:ident($record:ty) as $name:literal),* $(,)?) => {
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

        /// What the detectors report: one record each (boxed: records move through the
        /// stages' hand-overs at a pointer's size). In JSON, the record's own object under
        /// its `type`.
        #[derive(Clone, Debug, Serialize)]
        #[serde(tag = "type")]
        pub enum Detected {
            $(#[serde(rename = $name)] $variant(Box<$record>),)*
        }

        impl Detected {
            /// Every detection's `type`, in list order.
            pub const NAMES: &[&str] = &[$($name),*];

            /// Its place in [`Detected::NAMES`].
            pub fn index(&self) -> usize {
                let mut i = 0;
                $(if matches!(self, Self::$variant(_)) {
                    return i;
                }
                i += 1;)*
                i
            }

            /// Its `type`.
            pub fn name(&self) -> &'static str {
                match self {
                    $(Self::$variant(_) => $name,)*
                }
            }

            pub fn get(&self) -> &dyn Detection {
                match self {
                    $(Self::$variant(r) => &**r,)*
                }
            }

            pub fn get_mut(&mut self) -> &mut dyn Detection {
                match self {
                    $(Self::$variant(r) => &mut **r,)*
                }
            }
        }

        #[cfg(test)]
        impl Detected {
            /// Every detection's [`Sample`].
            pub(crate) fn samples() -> Vec<Detected> {
                vec![$(<$record as Sample>::sample().into()),*]
            }
        }

        $(impl From<$record> for Detected {
            fn from(r: $record) -> Self {
                Self::$variant(Box::new(r))
            }
        })*

        /// The detectors' counters (fields of the `stats` record's `correlate` object).
        #[derive(Clone, Debug, Default, Serialize)]
        pub struct DetectStats {
            $(#[serde(skip_serializing_if = "no_counters")]
            pub(crate) $field: <$ty as Detector>::Stats,)*
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
                $(self.$field.stats(&mut into.$field);)*
            }

            fn check_bounds(&self) -> Result<(), String> {
                $(self.$field.check_bounds()?;)*
                Ok(())
            }
        }
    };
}

/// A detector without counters of its own (`type Stats = ()`) writes none in `stats`.
fn no_counters<T: 'static>(_: &T) -> bool {
    std::any::TypeId::of::<T>() == std::any::TypeId::of::<()>()
}

// The registration: one line a detection.
detectors! {
    loops: loops::LoopTracker => Loop(loops::LoopRecord) as "loop",
    races: race::RaceDetector => Race(race::RaceRecord) as "race",
    unexpected: unexpected::UnexpectedSources
        => UnexpectedSource(unexpected::UnexpectedSourceRecord) as "unexpected_source",
}

impl Correlator<Detectors> {
    /// A correlator showing what it sees to every detector.
    pub(crate) fn new(cfg: CorrelateConfig, clock: Clock) -> Self {
        Correlator::with_detector(cfg, clock, Detectors::new(&cfg, clock))
    }
}
