//! The reorder buffer: observations wait here, in (timestamp, arrival) order, until the
//! reorder window has passed them.
//!
//! Most arrive in time order: those queue at the back of a ring buffer, which takes and
//! hands back each by one move. The others (another CPU's ring-buffer record, a late
//! conntrack-confirmed drop) wait in an ordered map beside it. The next out is whichever of
//! the two fronts comes first, so the order is exactly that of one ordered map of them all
//! (keys are unique: the arrival number breaks ties).
use std::collections::{BTreeMap, VecDeque};

use super::Observed;

#[derive(Default)]
pub(super) struct Reorder {
    /// Sorted by (ts, seq): each pushed at the back only if not before the back.
    in_order: VecDeque<(u64, u64, Observed)>,
    out_of_order: BTreeMap<(u64, u64), Observed>,
    seq: u64,
}

impl Reorder {
    /// Queues an observation seen at `ts`.
    pub(super) fn push(&mut self, ts: u64, o: Observed) {
        self.seq += 1;
        match self.in_order.back() {
            Some(&(back, _, _)) if ts < back => {
                self.out_of_order.insert((ts, self.seq), o);
            }
            _ => self.in_order.push_back((ts, self.seq, o)),
        }
    }

    pub(super) fn len(&self) -> usize {
        self.in_order.len() + self.out_of_order.len()
    }

    /// The first observation, if it was seen at or before `until`.
    pub(super) fn pop_until(&mut self, until: u64) -> Option<Observed> {
        let front = self.in_order.front().map(|&(ts, seq, _)| (ts, seq));
        let other = self.out_of_order.first_key_value().map(|(&k, _)| k);
        match (front, other) {
            (Some(f), Some(o)) if o < f => self.pop_out_of_order(until),
            (Some((ts, _)), _) => {
                if ts > until {
                    return None;
                }
                self.in_order.pop_front().map(|(_, _, o)| o)
            }
            (None, _) => self.pop_out_of_order(until),
        }
    }

    /// The first observation.
    pub(super) fn pop_first(&mut self) -> Option<Observed> {
        self.pop_until(u64::MAX)
    }

    fn pop_out_of_order(&mut self, until: u64) -> Option<Observed> {
        let entry = self.out_of_order.first_entry()?;
        if entry.key().0 > until {
            return None;
        }
        Some(entry.remove())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::correlate::DropObservation;

    fn obs(ts: u64, n: u32) -> Observed {
        Observed::Drop(Box::new(DropObservation {
            ts_ns: ts,
            cpu: n,
            netns_cookie: 0,
            netns: Default::default(),
            ifname: Default::default(),
            reason: String::new(),
            location: String::new(),
            function: String::new(),
            benign: false,
            proto: crate::decode::record::Proto::Udp,
            src: "10.0.0.1:5000".parse().unwrap(),
            dst: "10.0.0.2:53".parse().unwrap(),
            ct: None,
            confirm_failed: None,
            msg: None,
            fragment: None,
        }))
    }

    fn n(o: Observed) -> u32 {
        match o {
            Observed::Drop(d) => d.cpu,
            Observed::Message(_) => u32::MAX,
        }
    }

    #[test]
    fn hands_back_in_the_order_of_one_ordered_map() {
        let mut r = Reorder::default();
        let mut reference: BTreeMap<(u64, u64), u32> = BTreeMap::new();
        let mut rng = 0x2545_f491_4f6c_dd1d_u64;
        let mut next = || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        let (mut now, mut seq, mut out_of_order) = (1_000u64, 0u64, 0);
        for i in 0..5_000u32 {
            now += next() % 10;
            // Every fifth comes late (up to 40 behind), some at the same time as others.
            let ts = if next() % 5 == 0 {
                now.saturating_sub(next() % 40)
            } else {
                now
            };
            out_of_order += u32::from(r.in_order.back().is_some_and(|b| ts < b.0));
            seq += 1;
            r.push(ts, obs(ts, i));
            reference.insert((ts, seq), i);
            assert_eq!(r.len(), reference.len());
            if next() % 3 == 0 {
                let until = now.saturating_sub(next() % 50);
                loop {
                    let want = reference
                        .first_entry()
                        .filter(|e| e.key().0 <= until)
                        .map(|e| e.remove());
                    assert_eq!(r.pop_until(until).map(n), want);
                    if want.is_none() {
                        break;
                    }
                }
            }
        }
        assert!(out_of_order > 100, "{out_of_order} out of order");
        while let Some((_, want)) = reference.pop_first() {
            assert_eq!(r.pop_first().map(n), Some(want));
        }
        assert!(r.pop_first().is_none());
        assert_eq!(r.len(), 0);
    }
}
