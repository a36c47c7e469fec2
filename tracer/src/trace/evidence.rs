//! The live run's packet evidence: every packet and drop waits for its annotation
//! ([`Annotator`]), then goes to the `-w` files ([`PcapngFiles`]) and the flight recorder's
//! ring ([`Recorder`]); incidents among the records start recorder files, and their records
//! name the file (`evidence`).
use std::path::PathBuf;

use crate::{
    correlate::record::Outcome,
    detect::{loops::LoopState, race::RaceVerdict},
    event::{CapturedPacket, KernelDrop},
    names::SharedNames,
    output::{
        annotate::{AnnotateConfig, Annotator, EvidencePacket, EvidenceStats},
        files::{PcapngFiles, Rotation},
        record::{DropRecord, PacketRecord},
        recorder::{Recorder, RecorderConfig},
        report, Record,
    },
    time::Clock,
};

/// `-w`, its rotation, `--record` and the annotation's bounds.
#[derive(Clone, Debug, Default)]
pub struct EvidenceOptions {
    /// `-w FILE` (`-` for standard output).
    pub write: Option<PathBuf>,
    pub rotation: Rotation,
    pub record: Option<RecorderConfig>,
    /// Longest a packet waits for its transaction (default: the timeout plus 5 s).
    pub max_delay_ns: Option<u64>,
    /// Most bytes of packets waiting.
    pub buffer_bytes: usize,
}

impl EvidenceOptions {
    pub fn wanted(&self) -> bool {
        self.write.is_some() || self.record.is_some()
    }
}

pub struct Evidence {
    annotator: Annotator,
    files: Option<PcapngFiles>,
    recorder: Option<Recorder>,
    released: Vec<EvidencePacket>,
}

/// Late answers, retries and a reply's grace at the client: a transaction is decided at
/// most this long after its timeout.
const DECIDED_AFTER_TIMEOUT_NS: u64 = 5_000_000_000;

impl Evidence {
    pub fn new(
        opts: &EvidenceOptions,
        transactions: bool,
        timeout_ns: u64,
        clock: Clock,
        snaplen: u32,
        names: &SharedNames,
        now_ns: u64,
    ) -> Self {
        let max_delay_ns = opts
            .max_delay_ns
            .unwrap_or(timeout_ns.saturating_add(DECIDED_AFTER_TIMEOUT_NS));
        let files = opts.write.as_ref().map(|path| {
            let mut f = PcapngFiles::new(
                path.clone(),
                opts.rotation.clone(),
                clock,
                snaplen,
                names.clone(),
            );
            f.open_now(now_ns);
            f
        });
        let recorder = opts.record.as_ref().map(|cfg| {
            let mut cfg = cfg.clone();
            cfg.delay_ns = max_delay_ns;
            Recorder::new(cfg, clock, snaplen, names.clone())
        });
        Self {
            annotator: Annotator::new(AnnotateConfig {
                max_delay_ns,
                max_bytes: opts.buffer_bytes,
                transactions,
            }),
            files,
            recorder,
            released: Vec::new(),
        }
    }

    pub fn packet(&mut self, p: &CapturedPacket, records: &[&PacketRecord]) {
        self.annotator.packet(p, records);
    }

    pub fn drop(&mut self, d: &KernelDrop, r: &DropRecord) {
        self.annotator.drop(d, r);
    }

    /// The records of one turn: they annotate the packets waiting, incidents among them
    /// start recorder files (and name them); then what is decided is written.
    pub fn records(&mut self, records: &mut [Record], now_ns: u64) {
        self.annotator.records(records);
        if let Some(rec) = self.recorder.as_mut() {
            for r in records.iter_mut() {
                incident(rec, r, now_ns);
            }
        }
        self.release(now_ns, false);
    }

    /// The end of the run: the last records, then everything still waiting is written.
    pub fn finish(&mut self, records: &mut [Record], now_ns: u64) {
        self.records(records, now_ns);
        self.release(now_ns, true);
        if let Some(rec) = self.recorder.as_mut() {
            rec.finish();
        }
        if let Some(f) = self.files.as_mut() {
            f.flush();
        }
    }

    fn release(&mut self, now_ns: u64, all: bool) {
        self.annotator.release(now_ns, all, &mut self.released);
        for p in self.released.drain(..) {
            if let Some(f) = self.files.as_mut() {
                f.write(&p);
            }
            if let Some(rec) = self.recorder.as_mut() {
                rec.packet(p);
            }
        }
        if let Some(f) = self.files.as_mut() {
            f.flush();
        }
        if let Some(rec) = self.recorder.as_mut() {
            rec.tick(self.annotator.released_before(now_ns));
        }
    }

    pub fn stats(&self) -> EvidenceStats {
        EvidenceStats {
            annotate: self.annotator.stats(),
            write: self.files.as_ref().map(PcapngFiles::stats),
            record: self.recorder.as_ref().map(Recorder::stats),
        }
    }

    /// One line on stderr about the `-w` files at the end.
    pub fn report(&self) {
        let Some(f) = &self.files else { return };
        let s = f.stats();
        match f.failed() {
            None => eprintln!(
                "dnspath: wrote {} packets and {} drops to the pcapng file{}",
                s.packets,
                s.drops,
                if s.files > 1 {
                    format!("s ({} created, {} deleted)", s.files, s.files_deleted)
                } else {
                    String::new()
                }
            ),
            Some(why) => eprintln!(
                "dnspath: the pcapng file stopped after {} packets and {} drops: {}",
                s.packets,
                s.drops,
                crate::output::escape(why)
            ),
        }
    }
}

/// If `r` is an incident, records it and names the file in `r`.
fn incident(rec: &mut Recorder, r: &mut Record, now_ns: u64) {
    match r {
        Record::Loop(l) if l.state == LoopState::Detected => {
            let detail = format!(
                "loop {} {} {}: {}",
                l.id,
                l.question.name,
                l.question.qtype,
                report::loop_path(l)
            );
            l.evidence = rec.incident("loop", &detail, l.detected_ns, now_ns);
        }
        Record::Race(r) if r.verdict == RaceVerdict::RaceDrop => {
            r.evidence = rec.incident("race-drop", &report::race_summary(r), r.ts_ns, now_ns);
        }
        Record::Drop(d) if d.benign.is_none() && d.dns.is_some() => {
            let detail = format!(
                "{}@{} {} -> {} in {}/{}",
                d.reason, d.location, d.src, d.dst, d.netns, d.ifname
            );
            d.evidence = rec.incident("drop", &detail, d.ts_ns, now_ns);
        }
        Record::Transaction(t) => {
            let kind = if t.outcome == Outcome::Unanswered {
                "unanswered"
            } else if t.outcome == Outcome::Late {
                "late"
            } else if t.rcode.as_deref() == Some("SERVFAIL") {
                "servfail"
            } else {
                return;
            };
            let detail = format!(
                "transaction {} {} {} from {}: {}",
                t.id,
                t.question.name,
                t.question.qtype,
                t.client,
                report::transaction_summary(t)
            );
            t.evidence = rec.incident(kind, &detail, t.ts_ns, now_ns);
        }
        _ => {}
    }
}
