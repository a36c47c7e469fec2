//! When a live run stops on its own: `--count` (packet records) and `--until loop` (the
//! first detected forwarding loop). A policy beside the sinks, not part of any: it looks at
//! each turn's records before they go out, tells the sinks how many of the turn's packet
//! records are within `--count`, and the runner stops after the turn it was met in. The
//! transactions, drops, races and loops of that turn (decided before the stop) go out all
//! the same; only packets beyond `--count` do not.
use std::sync::{
    atomic::{AtomicBool, Ordering},
    Arc,
};

use crate::output::record::Detected;
use crate::{detect::loops::LoopState, output::Record};

#[derive(Clone, Debug, Default)]
pub struct StopPolicy {
    count: Option<u64>,
    until_loop: bool,
    /// Packet records counted against `count` (written, or hidden by the view).
    packets: u64,
    /// Packet records decided after `count` was reached (in the turn of the stop, or
    /// unfinished TCP messages reported at the end): counted, not written.
    not_written: u64,
    loop_found: bool,
    /// Set by someone outside the run to end it (`top`'s `q`): the run stops after the turn
    /// it is seen in, as for a signal.
    quit: Option<Arc<AtomicBool>>,
}

impl StopPolicy {
    /// `count`: stop after this many packet records; `until_loop`: at the first loop.
    pub fn new(count: Option<u64>, until_loop: bool) -> Self {
        Self {
            count,
            until_loop,
            ..Default::default()
        }
    }

    /// The same policy, also stopping once `quit` is set (`stats.stopped_by` `quit`).
    pub fn with_quit(mut self, quit: Arc<AtomicBool>) -> Self {
        self.quit = Some(quit);
        self
    }

    /// One turn's records, before the sinks: returns how many of their packet records are
    /// within `--count` (`None`: no count).
    pub fn admit(&mut self, records: &[Record]) -> Option<u64> {
        let mut allowed = 0;
        for r in records {
            match r {
                Record::Packet(_) if self.count_reached() => self.not_written += 1,
                Record::Packet(_) => {
                    self.packets += 1;
                    allowed += 1;
                }
                Record::Detected(Detected::Loop(l)) => {
                    self.loop_found |= l.state == LoopState::Detected
                }
                _ => {}
            }
        }
        self.count.map(|_| allowed)
    }

    /// `--count` counts packet records (each must be made, written or not).
    pub fn counts_packets(&self) -> bool {
        self.count.is_some()
    }

    /// Why the run should stop now, if it should: `count` or `loop` (`stats.stopped_by`).
    pub fn stop(&self) -> Option<&'static str> {
        if self.count_reached() {
            Some("count")
        } else if self.until_loop && self.loop_found {
            Some("loop")
        } else if self
            .quit
            .as_ref()
            .is_some_and(|q| q.load(Ordering::Relaxed))
        {
            Some("quit")
        } else {
            None
        }
    }

    /// `--count` was reached: the ring buffer's rest is left unread.
    pub fn count_reached(&self) -> bool {
        self.count.is_some_and(|n| self.packets >= n)
    }

    /// A forwarding loop was detected.
    pub fn loop_found(&self) -> bool {
        self.loop_found
    }

    /// Packet records counted against `--count`.
    pub fn packets(&self) -> u64 {
        self.packets
    }

    /// Packet records decided after `--count` was reached, not written (`stats.not_written`).
    pub fn not_written(&self) -> u64 {
        self.not_written
    }
}
