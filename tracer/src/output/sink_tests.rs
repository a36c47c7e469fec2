use std::{cell::RefCell, rc::Rc};

use super::*;
use crate::{
    event::{Direction, ObservationPoint},
    test_support::fixtures,
};

type Log = Rc<RefCell<Vec<String>>>;

/// Says in `log` what it was handed; with `enrich`, names every drop's evidence file.
struct Probe {
    name: &'static str,
    log: Log,
    enrich: bool,
    fail: bool,
}

impl Probe {
    fn new(name: &'static str, log: &Log) -> Self {
        Self {
            name,
            log: Rc::clone(log),
            enrich: false,
            fail: false,
        }
    }

    fn say(&self, what: String) {
        self.log.borrow_mut().push(format!("{} {what}", self.name));
    }

    fn describe(records: &[Record]) -> String {
        records
            .iter()
            .map(|r| match r {
                Record::Packet(p) => format!("packet {}", p.ts_ns),
                Record::Drop(d) => format!("drop {}", d.evidence.as_deref().unwrap_or("-")),
                _ => "other".into(),
            })
            .collect::<Vec<_>>()
            .join(", ")
    }
}

impl Sink for Probe {
    fn wants(&self) -> Wants {
        Wants {
            sources: self.enrich,
            ..Wants::default()
        }
    }
    fn enrich(&mut self, records: &mut [Record], _now_ns: u64) {
        if !self.enrich {
            return;
        }
        self.say("enrich".into());
        for r in records {
            if let Record::Drop(d) = r {
                d.evidence = Some("f.pcapng".into());
            }
        }
    }
    fn batch(&mut self, batch: Batch<'_>) -> io::Result<()> {
        let sources: Vec<String> = batch
            .sources
            .iter()
            .map(|s| Self::describe(batch.records_of(s)))
            .collect();
        self.say(format!(
            "borrowed [{}] sources [{}] allowed {:?}",
            Self::describe(batch.records),
            sources.join(" | "),
            batch.packets_allowed
        ));
        if self.fail {
            return Err(io::Error::from(io::ErrorKind::BrokenPipe));
        }
        Ok(())
    }
    fn batch_owned(&mut self, records: &mut Vec<Record>, batch: Batch<'_>) -> io::Result<()> {
        assert!(batch.records.is_empty());
        let taken: Vec<Record> = std::mem::take(records);
        self.say(format!("took [{}]", Self::describe(&taken)));
        Ok(())
    }
    fn stats(&self, stats: &mut StatsRecord) {
        stats.unread += 1;
    }
    fn periodic(&mut self, stats: &StatsRecord, _now_ns: u64) {
        self.say(format!("periodic unread {}", stats.unread));
    }
    fn finish(&mut self, stats: &mut StatsRecord, _now_ns: u64) -> io::Result<()> {
        self.say(format!("finish not_written {}", stats.not_written));
        stats.not_written += 1;
        Ok(())
    }
    fn abort(&mut self, _now_ns: u64) {
        self.say("abort".into());
    }
}

fn packet(ts_ns: u64) -> Record {
    let mut p = fixtures::malformed_packet("x");
    p.ts_ns = ts_ns;
    Record::Packet(p)
}

fn captured() -> CapturedPacket {
    CapturedPacket {
        ts_ns: 1,
        cpu: None,
        at: ObservationPoint {
            netns: 1,
            ifindex: 2,
            dir: Direction::Egress,
        },
        vlan: None,
        orig_len: 0,
        data: Default::default(),
    }
}

/// The enrich step runs before any sink sees the batch; every sink but the last borrows
/// it, with each source's records; the last takes the records; both vectors are emptied.
#[test]
fn a_batch_is_enriched_once_then_fanned_out_and_the_last_sink_takes_it() {
    let log = Log::default();
    let mut sinks = Sinks::new();
    sinks.push(Box::new(Probe::new("metrics", &log)));
    sinks.push(Box::new(Probe::new("writer", &log)));
    sinks.push_front(Box::new(Probe {
        enrich: true,
        ..Probe::new("evidence", &log)
    }));
    assert!(sinks.wants_sources());
    let mut records = vec![
        packet(1),
        Record::Drop(Box::new(fixtures::drop_record("NETFILTER_DROP", None))),
        packet(2),
    ];
    let mut sources = vec![
        Sourced {
            source: Source::Packet(captured()),
            records: 0..1,
        },
        Sourced {
            source: Source::Packet(captured()),
            records: 1..1,
        },
        Sourced {
            source: Source::Packet(captured()),
            records: 2..3,
        },
    ];
    sinks
        .batch(&mut records, &mut sources, Some(1), 0, 9)
        .unwrap();
    assert!(records.is_empty() && sources.is_empty());
    assert_eq!(
        *log.borrow(),
        [
            "evidence enrich",
            "evidence borrowed [packet 1, drop f.pcapng, packet 2] sources [packet 1 |  | packet 2] allowed Some(1)",
            "metrics borrowed [packet 1, drop f.pcapng, packet 2] sources [packet 1 |  | packet 2] allowed Some(1)",
            "writer took [packet 1, drop f.pcapng, packet 2]",
        ]
    );
}

/// Periodic stats carry what every sink adds; at the end each sink adds its counts for the
/// ones after it; a failed run aborts every sink.
#[test]
fn stats_gain_each_sinks_counts_and_finish_goes_in_order() {
    let log = Log::default();
    let mut sinks = Sinks::new();
    sinks.push(Box::new(Probe::new("a", &log)));
    sinks.push(Box::new(Probe::new("b", &log)));
    assert!(!sinks.wants_sources());
    sinks.periodic(&StatsRecord::default(), 1);
    let mut stats = StatsRecord::default();
    sinks.finish(&mut stats, 2).unwrap();
    assert_eq!(stats.not_written, 2);
    sinks.abort(3);
    assert_eq!(
        *log.borrow(),
        [
            "a periodic unread 2",
            "b periodic unread 2",
            "a finish not_written 0",
            "b finish not_written 1",
            "a abort",
            "b abort",
        ]
    );
}

/// A sink that fails does not keep the batch from the others; its error is returned.
#[test]
fn a_failing_sink_still_lets_the_others_see_the_batch() {
    let log = Log::default();
    let mut sinks = Sinks::new();
    sinks.push(Box::new(Probe {
        fail: true,
        ..Probe::new("a", &log)
    }));
    sinks.push(Box::new(Probe::new("b", &log)));
    let mut records = vec![packet(1)];
    let e = sinks
        .batch(&mut records, &mut Vec::new(), None, 0, 1)
        .unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::BrokenPipe);
    assert_eq!(
        *log.borrow(),
        [
            "a borrowed [packet 1] sources [] allowed None",
            "b took [packet 1]"
        ]
    );
}

/// Answers [`Wants::packet_records`] as told and keeps what it was told was held back.
struct Asks(PacketRecords, Rc<RefCell<u64>>);

impl Sink for Asks {
    fn wants(&self) -> Wants {
        Wants {
            packet_records: self.0,
            ..Wants::default()
        }
    }
    fn batch(&mut self, batch: Batch<'_>) -> io::Result<()> {
        *self.1.borrow_mut() += batch.packet_records_held;
        Ok(())
    }
    fn finish(&mut self, _stats: &mut StatsRecord, _now_ns: u64) -> io::Result<()> {
        Ok(())
    }
}

/// Packet records are held back only when no sink wants them (one refuses them, or all
/// ignore them); every sink is told how many in the next batch.
#[test]
fn packet_records_are_held_only_when_no_sink_wants_them() {
    use PacketRecords::{Ignored, Refused, Wanted};
    for (answers, hold) in [
        (vec![], true),
        (vec![Ignored], true),
        (vec![Ignored, Ignored], true),
        (vec![Wanted], false),
        (vec![Refused], true),
        (vec![Ignored, Refused], true),
        (vec![Wanted, Refused], false),
        (vec![Refused, Wanted, Ignored], false),
    ] {
        let counts: Vec<Rc<RefCell<u64>>> = answers.iter().map(|_| Rc::default()).collect();
        let mut sinks = Sinks::new();
        for (a, c) in answers.iter().zip(&counts) {
            sinks.push(Box::new(Asks(*a, Rc::clone(c))));
        }
        assert_eq!(sinks.hold_packet_records(), hold, "{answers:?}");
        sinks
            .batch(&mut Vec::new(), &mut Vec::new(), None, 7, 1)
            .unwrap();
        for c in &counts {
            assert_eq!(*c.borrow(), 7, "{answers:?}");
        }
    }
}
