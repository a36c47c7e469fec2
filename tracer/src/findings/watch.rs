//! The traffic half of the triage behind one entry: every record of the pipeline goes to
//! [`Watch::observe`], and [`Watch::findings`] folds what was seen into findings. `doctor`
//! feeds one watch for `--duration`; the agent feeds one per findings window
//! (`--findings-window`) and exports what it finds as events and metrics.
use super::{
    finding::{Finding, FindingKind},
    traffic::TrafficFolder,
    traffic_more::{self, MoreFolder},
};
use crate::output::record::Detected;
use crate::output::Record;

/// Every kind a watch can find (the rest come from the node's files and counters).
pub const TRAFFIC_KINDS: [FindingKind; 10] = [
    FindingKind::RuntimeLoop,
    FindingKind::KernelDrops,
    FindingKind::ConntrackRace,
    FindingKind::UnansweredQueries,
    FindingKind::Servfail,
    FindingKind::LateAnswers,
    FindingKind::FragmentLoss,
    FindingKind::TruncatedNotRetried,
    FindingKind::NodeCacheBypassed,
    FindingKind::NdotsAmplification,
];

#[derive(Default)]
pub struct Watch {
    pub traffic: TrafficFolder,
    pub more: MoreFolder,
}

impl Watch {
    pub fn observe(&mut self, record: &Record) {
        match record {
            // Loops and races have findings of their own; other detections none yet.
            Record::Detected(d) => {
                if let Detected::Loop(l) = d {
                    self.traffic.loop_record(l);
                } else if let Detected::Race(r) = d {
                    self.traffic.race(r);
                }
            }
            // A dropped IP fragment (or a datagram dropped while being fragmented) is the
            // fragment loss's evidence, not a rule's drop.
            Record::Drop(d) if traffic_more::is_fragment_drop(d) => self.more.fragment_drop(d),
            Record::Drop(d) => self.traffic.drop(d),
            Record::Transaction(t) => {
                self.traffic.transaction(t);
                self.more.transaction(t);
            }
            Record::FragmentLoss(f) => self.more.fragment_loss(f),
            Record::Packet(_) | Record::Stats(_) | Record::Summary(_) => {}
        }
    }

    /// What the traffic seen so far amounts to (unranked).
    pub fn findings(&self) -> Vec<Finding> {
        let mut out = self.traffic.findings();
        out.extend(self.more.findings());
        out
    }

    /// Records not followed because a table was full (the findings' counts are then lower
    /// bounds).
    pub fn untracked(&self) -> u64 {
        self.traffic.untracked() + self.more.untracked()
    }
}
