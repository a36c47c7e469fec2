//! Storm shedding in the kernel, userspace half: which looping questions the TC programs
//! only count (`SHED_ON`), and how many packets of each they counted (`SHED_COUNT`), read
//! back every turn so that `stats.shed` and each loop's `summarised` stay exact.
//!
//! A question leaves `SHED_ON` when its loop ends; its count is read one last time a turn
//! later (programs that saw it in `SHED_ON` have finished by then) and then forgotten.
use std::collections::HashMap;

use tracer_common::shed::MAX_KEYS;

use super::{KernelError, KernelMaps};
use crate::event::{ShedChange, ShedQuestion};

struct Shed {
    q: ShedQuestion,
    /// Packets already reported.
    reported: u64,
}

/// The questions being shed, and those whose last count is still to be read.
#[derive(Default)]
pub struct Shedder {
    active: HashMap<u64, Shed>,
    /// Removed from `SHED_ON` this turn.
    stopping: Vec<Shed>,
    /// Removed a turn ago: read one last time at the next poll, then forgotten.
    draining: Vec<Shed>,
    /// The maps failed once: shedding stays in userspace from then on (said once).
    broken: bool,
    /// Loops not shed in the kernel because [`MAX_KEYS`] were: counted, said once.
    pub over_capacity: u64,
}

impl Shedder {
    /// Applies the pipeline's changes to the kernel maps. A question that cannot be shed in
    /// the kernel (maps full or failing) is still shed in userspace by the decoder.
    pub fn apply(&mut self, maps: &mut KernelMaps, changes: &mut Vec<ShedChange>) {
        for change in changes.drain(..) {
            if self.broken {
                continue;
            }
            let result = match change {
                ShedChange::Start(q) => {
                    if self.active.contains_key(&q.hash) {
                        continue;
                    }
                    let held = self.active.len() + self.stopping.len() + self.draining.len();
                    if held >= MAX_KEYS as usize {
                        if self.over_capacity == 0 {
                            log::warn!(
                                "{MAX_KEYS} looping questions already shed in the kernel; more are shed after copying"
                            );
                        }
                        self.over_capacity += 1;
                        continue;
                    }
                    let hash = q.hash;
                    self.active.insert(hash, Shed { q, reported: 0 });
                    maps.shed_start(hash, self.active.len() as u32)
                }
                ShedChange::Stop(hash) => {
                    let Some(s) = self.active.remove(&hash) else {
                        continue;
                    };
                    self.stopping.push(s);
                    maps.shed_stop(hash, self.active.len() as u32)
                }
            };
            if let Err(e) = result {
                self.fail(maps, &e);
            }
        }
    }

    /// Reports what the kernel counted since the last call (`report(question, packets)`),
    /// and forgets the questions that stopped before the last call.
    pub fn poll(&mut self, maps: &mut KernelMaps, mut report: impl FnMut(&ShedQuestion, u64)) {
        let finals = std::mem::replace(&mut self.draining, std::mem::take(&mut self.stopping));
        let mut failed = None;
        for mut s in finals {
            if let Err(e) = s
                .read(maps, &mut report)
                .and_then(|()| maps.shed_forget(s.q.hash))
            {
                failed = Some(e);
            }
        }
        for s in self.active.values_mut().chain(self.draining.iter_mut()) {
            if let Err(e) = s.read(maps, &mut report) {
                failed = Some(e);
            }
        }
        if let Some(e) = failed {
            self.fail(maps, &e);
        }
    }

    /// The run ends: every question stops being shed and its last count is reported.
    pub fn finish(&mut self, maps: &mut KernelMaps, mut report: impl FnMut(&ShedQuestion, u64)) {
        let hashes: Vec<u64> = self.active.keys().copied().collect();
        for hash in hashes {
            self.apply(maps, &mut vec![ShedChange::Stop(hash)]);
        }
        if self.stopping.is_empty() && self.draining.is_empty() {
            return;
        }
        // A program that found a question in SHED_ON just before its removal may still be
        // counting on another CPU; its run takes microseconds.
        std::thread::sleep(std::time::Duration::from_millis(10));
        self.poll(maps, &mut report);
        self.poll(maps, &mut report);
    }

    fn fail(&mut self, maps: &mut KernelMaps, e: &KernelError) {
        if !self.broken {
            log::warn!("storm shedding in the kernel failed ({e}); looping questions are shed after copying");
        }
        self.broken = true;
        for (hash, _) in self.active.drain() {
            let _ = maps.shed_stop(hash, 0);
        }
        self.stopping.clear();
        self.draining.clear();
    }
}

impl Shed {
    fn read(
        &mut self,
        maps: &KernelMaps,
        report: &mut impl FnMut(&ShedQuestion, u64),
    ) -> Result<(), KernelError> {
        let total = maps.shed_count(self.q.hash)?;
        let n = total.saturating_sub(self.reported);
        if n > 0 {
            report(&self.q, n);
            self.reported = total;
        }
        Ok(())
    }
}
