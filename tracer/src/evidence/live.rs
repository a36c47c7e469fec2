//! The live run's packet evidence, a sink of the list: every packet and drop of a batch
//! waits for its annotation ([`Annotator`]), then goes to the `-w` files ([`PcapngFiles`])
//! and the flight recorder's ring ([`Recorder`]); incidents among the records start
//! recorder files, and their records name the file (`evidence`, written in
//! [`Sink::enrich`], before any sink sees them).
use std::path::PathBuf;

use crate::{
    evidence::{
        annotate::{AnnotateConfig, Annotator, EvidencePacket, EvidenceStats},
        files::{PcapngFiles, Rotation},
        recorder::{Recorder, RecorderConfig},
    },
    names::SharedNames,
    output::{
        record::{PacketRecord, StatsRecord},
        sink::{Batch, Sink, Source, Wants},
        Record,
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

    /// The end of the run: everything still waiting is written.
    fn release_all(&mut self, now_ns: u64) {
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

impl Sink for Evidence {
    fn wants(&self) -> Wants {
        Wants {
            sources: true,
            ..Wants::default()
        }
    }

    /// Incidents among the records start recorder files, and name them.
    fn enrich(&mut self, records: &mut [Record], now_ns: u64) {
        if let Some(rec) = self.recorder.as_mut() {
            for r in records.iter_mut() {
                incident(rec, r, now_ns);
            }
        }
    }

    /// The turn's packets and drops wait with what the decoder made of them, the records
    /// annotate the packets waiting; then what is decided is written.
    fn batch(&mut self, batch: Batch<'_>) -> std::io::Result<()> {
        let mut made: Vec<&PacketRecord> = Vec::new();
        for s in batch.sources {
            let records = batch.records_of(s);
            match &s.source {
                Source::Packet(p) => {
                    made.clear();
                    made.extend(records.iter().filter_map(|r| match r {
                        Record::Packet(pr) => Some(pr),
                        _ => None,
                    }));
                    self.annotator.packet(p, &made);
                }
                Source::Drop(d) => {
                    // Drops in namespaces not traced make no record and stay out of the file.
                    if let Some(r) = records.iter().find_map(|r| match r {
                        Record::Drop(dr) => Some(dr),
                        _ => None,
                    }) {
                        self.annotator.drop(d, r);
                    }
                }
            }
        }
        self.annotator.records(batch.records);
        self.release(batch.now_ns, false);
        Ok(())
    }

    /// Everything still waiting is written; `stats.evidence`, and a line on stderr.
    fn finish(&mut self, stats: &mut StatsRecord, now_ns: u64) -> std::io::Result<()> {
        self.release_all(now_ns);
        self.report();
        stats.evidence = Some(Evidence::stats(self));
        Ok(())
    }

    fn abort(&mut self, now_ns: u64) {
        self.release_all(now_ns);
    }
}

/// If `r` is an incident ([`RecordKind::incident`](crate::output::record::RecordKind)),
/// records it and names the file in `r`.
fn incident(rec: &mut Recorder, r: &mut Record, now_ns: u64) {
    let Some(i) = r.kind().incident() else {
        return;
    };
    let file = rec.incident(i.kind, &i.detail, i.ts_ns, now_ns);
    r.kind_mut().set_evidence(file);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        event::{CapturedPacket, Direction, ObservationPoint},
        output::sink::{Sinks, Sourced},
        test_support::fixtures,
    };

    /// A UDP packet of 10.0.0.1:5000 → 10.0.0.2:53 (no DNS message: the record says what
    /// the decoder made of it).
    fn packet(ts_ns: u64) -> CapturedPacket {
        let mut data = vec![
            0x45, 0, 0, 28, 0x12, 0x34, 0, 0, 64, 17, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2,
        ];
        data.extend([0x13, 0x88, 0, 53, 0, 8, 0, 0]);
        CapturedPacket {
            ts_ns,
            cpu: Some(0),
            at: ObservationPoint {
                netns: 4096,
                ifindex: 7,
                dir: Direction::Egress,
            },
            vlan: None,
            orig_len: data.len() as u32,
            data: data.into(),
        }
    }

    /// What the flight recorder keeps, asked of each record's kind: a detected loop, a race
    /// drop, a drop of a DNS message, an unanswered, late or SERVFAIL transaction; not an
    /// ongoing loop, a resolved clash, a benign drop or one of no DNS message, an answered
    /// transaction, a packet. The file named lands in the record's `evidence`.
    #[test]
    fn incidents_are_what_each_record_says() {
        use crate::{
            correlate::record::Outcome,
            detect::{loops::LoopState, race::RaceVerdict},
            output::record::TransactionRecord,
        };
        let kind = |r: Record| r.kind().incident().map(|i| (i.kind, i.ts_ns));
        assert_eq!(
            kind(Record::detected(fixtures::loop_record(
                1,
                LoopState::Detected,
                7
            ))),
            Some(("loop", 7))
        );
        assert_eq!(
            kind(Record::detected(fixtures::loop_record(
                1,
                LoopState::Ongoing,
                7
            ))),
            None
        );
        let race = |v| Record::detected(fixtures::race(v, "10.0.0.1:5000", 1, "A"));
        assert_eq!(
            kind(race(RaceVerdict::RaceDrop)),
            Some(("race-drop", 2_000))
        );
        assert_eq!(kind(race(RaceVerdict::ResolvedClash)), None);
        assert_eq!(kind(race(RaceVerdict::Suspected)), None);
        let query = [
            0x12, 0x34, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0, 1, b'a', 0, 0, 1, 0, 1,
        ];
        let dns = crate::decode::dns::decode(&query).unwrap();
        let drop = |benign, dns: Option<&crate::decode::dns::DnsMessage>| {
            let mut d = fixtures::drop_record("NETFILTER_DROP", benign);
            d.dns = dns.cloned().map(Into::into);
            Record::Drop(Box::new(d))
        };
        assert_eq!(kind(drop(None, Some(&dns))), Some(("drop", 3_000)));
        assert_eq!(kind(drop(Some("socket closed"), Some(&dns))), None);
        assert_eq!(kind(drop(None, None)), None);
        let tx = |outcome, rcode: Option<&str>| {
            let mut t: TransactionRecord =
                fixtures::transaction("a.", "A", "10.0.0.1:5000", rcode, Vec::new());
            t.outcome = outcome;
            Record::Transaction(Box::new(t))
        };
        assert_eq!(
            kind(tx(Outcome::Unanswered, None)),
            Some(("unanswered", 1_000))
        );
        assert_eq!(
            kind(tx(Outcome::Late, Some("NOERROR"))),
            Some(("late", 1_000))
        );
        assert_eq!(
            kind(tx(Outcome::Answered, Some("SERVFAIL"))),
            Some(("servfail", 1_000))
        );
        assert_eq!(kind(tx(Outcome::Answered, Some("NOERROR"))), None);
        assert_eq!(kind(Record::Packet(fixtures::malformed_packet("x"))), None);

        let mut r = race(RaceVerdict::RaceDrop);
        let detail = r.kind().incident().map(|i| i.detail);
        assert_eq!(
            detail.as_deref(),
            Some("lookup of api.lab.test. took 5.00 s: A dropped by conntrack race at +600 µs, retried at +5.00 s")
        );
        r.kind_mut().set_evidence(Some("f.pcapng".into()));
        let Record::Detected(crate::output::record::Detected::Race(r)) = r else {
            unreachable!()
        };
        assert_eq!(r.evidence.as_deref(), Some("f.pcapng"));
    }

    /// The evidence sink as an entry of the list: each source packet reaches the `-w` file
    /// with the record the decoder made of it (found by its range, not searched), also one
    /// without a record yet; the end writes what still waits and counts it in
    /// `stats.evidence`.
    #[test]
    fn sources_reach_the_file_with_their_records() {
        let dir = std::env::temp_dir().join(format!("dnspath-evidence-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let opts = EvidenceOptions {
            write: Some(dir.join("t.pcapng")),
            record: Some(RecorderConfig {
                dir: dir.join("rec"),
                before_ns: 10,
                after_ns: 5,
                ring_bytes: 1 << 20,
                dir_max_bytes: 1 << 30,
                files_per_minute: 10,
                delay_ns: 0,
            }),
            buffer_bytes: 1 << 20,
            ..Default::default()
        };
        std::fs::create_dir_all(dir.join("rec")).unwrap();
        let names = SharedNames::default();
        let ev = Evidence::new(&opts, true, 1_000, Clock::Epoch, 2048, &names, 1);
        let mut sinks = Sinks::new();
        sinks.push_front(Box::new(ev));
        assert!(sinks.wants_sources());

        let mut malformed = fixtures::malformed_packet("cut short");
        malformed.ts_ns = 10;
        let mut records = vec![
            Record::Packet(malformed),
            Record::Drop(Box::new(fixtures::drop_record("NETFILTER_DROP", None))),
        ];
        let mut sources = vec![
            Sourced {
                source: Source::Packet(packet(10)),
                records: 0..1,
            },
            // A packet held for reassembly: no record yet.
            Sourced {
                source: Source::Packet(packet(11)),
                records: 1..1,
            },
        ];
        sinks
            .batch(&mut records, &mut sources, None, 0, 20)
            .unwrap();
        assert!(records.is_empty() && sources.is_empty());
        let mut stats = StatsRecord::default();
        sinks.finish(&mut stats, 10_000_000_000).unwrap();
        let e = stats.evidence.expect("evidence stats");
        assert_eq!(e.write.as_ref().map(|w| w.packets), Some(2));
        assert_eq!(e.annotate.unclaimed, 2);
        let file = std::fs::read(dir.join("t.pcapng")).unwrap();
        let has = |s: &str| file.windows(s.len()).any(|w| w == s.as_bytes());
        assert!(
            has("malformed=[cut short]"),
            "the record's finding in the comment"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
