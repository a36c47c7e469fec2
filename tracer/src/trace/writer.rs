//! `trace`'s text/NDJSON sink: the records a run shows ([`RecordsOut`]: the view, `--count`'s
//! packet limit, the filter), written by a thread of their own behind a bounded queue.
use std::{io::Write, time::Instant};

use super::OutputOptions;
use crate::output::{
    self,
    queue::{self, QueuedSink},
    record::StatsRecord,
    sink::{Batch, PacketRecords, Sink, Wants},
    writer::RecordsOut,
    Record, RecordWriter,
};

/// `trace`'s sink: records written as text or NDJSON by a thread of their own behind a
/// bounded queue (a slow reader costs records, counted in `stats.sinks`, never packets).
/// Registered last in the list, it takes the records into the queue without a copy.
pub struct TraceWriter {
    out: RecordsOut,
    sink: QueuedSink,
}

impl TraceWriter {
    pub fn new(opts: &OutputOptions, out: Box<dyn Write + Send>) -> std::io::Result<Self> {
        Ok(Self {
            out: RecordsOut::new(opts.view, opts.filter.clone()),
            sink: QueuedSink::spawn(
                "output",
                queue::RECORDS,
                output::sink(opts.format, out, &opts.identity),
            )?,
        })
    }
}

impl TraceWriter {
    /// Refused while the queue is full, if every packet record would be written (with a
    /// filter, some would not: those are not drops, so they are made and filtered).
    fn packet_records(&self) -> PacketRecords {
        if self.out.writes_no_packet() {
            PacketRecords::Ignored
        } else if self.out.writes_every_packet() && self.sink.is_full() {
            PacketRecords::Refused
        } else {
            PacketRecords::Wanted
        }
    }

    /// Packet records held back while this sink did not ignore them: its drops.
    fn count_held(&mut self, batch: &Batch<'_>) {
        if batch.packet_records_held > 0 && !self.out.writes_no_packet() {
            self.sink.queue().count_dropped(batch.packet_records_held);
        }
    }
}

impl Sink for TraceWriter {
    fn wants(&self) -> Wants {
        Wants {
            packet_records: self.packet_records(),
            ..Wants::default()
        }
    }
    /// Not the last of the list: what is written is copied.
    fn batch(&mut self, batch: Batch<'_>) -> std::io::Result<()> {
        self.count_held(&batch);
        let mut allowed = batch.packets_allowed;
        for r in batch.records {
            if self.out.keep(r, &mut allowed) {
                self.sink.write(r)?;
            }
        }
        self.sink.flush()
    }
    fn batch_owned(&mut self, records: &mut Vec<Record>, batch: Batch<'_>) -> std::io::Result<()> {
        self.count_held(&batch);
        self.out
            .write(records, batch.packets_allowed, &mut self.sink)
    }
    /// Waits (at most [`queue::DRAIN_WAIT`] in all) for what is queued to be written, so the
    /// `stats` record counts it, then for the `stats` record itself.
    fn finish(&mut self, stats: &mut StatsRecord, _now_ns: u64) -> std::io::Result<()> {
        let deadline = Instant::now() + queue::DRAIN_WAIT;
        let q = self.sink.queue();
        q.wait_written(queue::DRAIN_WAIT);
        let mut stats = stats.clone();
        if let Some(s) = stats.summary.take() {
            q.push_last(Record::Summary(s))?;
        }
        stats.sinks = vec![q.stats()];
        q.push_last(Record::Stats(Box::new(stats)))?;
        let (_, result) = q.finish(deadline.saturating_duration_since(Instant::now()));
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        correlate::record::{Answered, Outcome, Summary},
        detect::loops::{LoopKind, LoopRecord, LoopState},
        output::record::{DropRecord, LookupRef, PacketRecord, QuestionRecord, TransactionRecord},
        output::{filter::Filter, writer::RecordsOut, Format, View},
        runner::stop::StopPolicy,
    };

    /// Keeps what is written.
    #[derive(Default)]
    struct Collect(Vec<Record>);

    impl output::RecordWriter for Collect {
        fn write(&mut self, record: &Record) -> std::io::Result<()> {
            self.0.push(record.clone());
            Ok(())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// `trace`'s writing of a batch, as the run loop does it: the stop policy looks at the
    /// records, the writer writes them; returns whether the run stops.
    struct BatchWriter {
        stop: StopPolicy,
        out: RecordsOut,
    }

    impl BatchWriter {
        fn new(opts: &OutputOptions) -> Self {
            Self {
                stop: StopPolicy::new(opts.count, opts.until_loop),
                out: RecordsOut::new(opts.view, opts.filter.clone()),
            }
        }

        fn write(
            &mut self,
            records: &mut Vec<Record>,
            sink: &mut dyn RecordWriter,
        ) -> std::io::Result<bool> {
            let allowed = self.stop.admit(records);
            self.out.write(records, allowed, sink)?;
            Ok(self.stop.stop().is_some())
        }
    }

    fn opts(count: Option<u64>, until_loop: bool, view: View) -> OutputOptions {
        OutputOptions {
            filter: Filter::default(),
            format: Format::Json,
            view,
            count,
            until_loop,
            identity: Default::default(),
        }
    }

    fn packet(ts_ns: u64) -> Record {
        Record::Packet(PacketRecord {
            pod: None,
            ts_ns,
            time: crate::time::WallTime(0),
            cpu: None,
            netns: "n".into(),
            netns_cookie: 1,
            ifname: "eth0".into(),
            ifindex: 2,
            dir: crate::event::Direction::Ingress,
            proto: crate::decode::record::Proto::Udp,
            src: "10.0.0.1:5000"
                .parse::<std::net::SocketAddr>()
                .unwrap()
                .into(),
            dst: "10.0.0.2:53"
                .parse::<std::net::SocketAddr>()
                .unwrap()
                .into(),
            len: 60,
            caplen: 60,
            vlan: None,
            tunnel: None,
            dns: None,
            malformed: None,
            capture_truncated: false,
        })
    }

    fn question() -> QuestionRecord {
        QuestionRecord::new("www.lab.test.", "A".into(), "IN".into())
    }

    fn transaction(id: u64) -> Record {
        Record::Transaction(Box::new(TransactionRecord {
            evidence: None,
            pod: Default::default(),
            id,
            lookup: LookupRef { id, step: 0 },
            ts_ns: 1,
            wall_ns: 1,
            client: "10.0.0.1:5000".parse().unwrap(),
            client_netns: "n".into(),
            question: question(),
            outcome: Outcome::Answered,
            rcode: Some("NOERROR".into()),
            answers: vec!["A 10.250.0.80".into()],
            answer_cut: None,
            latency_ns: Some(1000),
            summary: Summary::Answered(Answered::Directly),
            legs: Vec::new(),
            nodes: Vec::new(),
        }))
    }

    fn drop_record(ts_ns: u64) -> Record {
        Record::Drop(Box::new(DropRecord {
            evidence: None,
            pod: None,
            ts_ns,
            time: crate::time::WallTime(0),
            cpu: 0,
            netns: "n".into(),
            netns_cookie: 1,
            ifname: "eth0".into(),
            ifindex: 2,
            reason: "NETFILTER_DROP".into(),
            reason_code: Some(6),
            confirm_failed: None,
            location: "nf_hook_slow+0x9e".into(),
            proto: crate::decode::record::Proto::Udp,
            src: "10.0.0.1:5000".into(),
            dst: "10.0.0.2:53".into(),
            len: 60,
            ct: None,
            dns: None,
            malformed: None,
            capture_truncated: false,
            fragment: None,
            benign: None,
        }))
    }

    fn loop_record(state: LoopState) -> Record {
        Record::detected(LoopRecord {
            evidence: None,
            id: 1,
            state,
            kind: LoopKind::Cycle,
            ts_ns: 1,
            wall_ns: 1,
            question: question(),
            loop_plugin_probe: false,
            cycle: Vec::new(),
            hop_count: 2,
            rate_pps: 0,
            packets: 0,
            summarised: 0,
            clients: Vec::new(),
            first_seen_ns: 1,
            detected_ns: 1,
            last_seen_ns: 1,
        })
    }

    fn kinds(recs: &[Record]) -> Vec<String> {
        recs.iter()
            .map(|r| match r {
                Record::Packet(p) => format!("packet {}", p.ts_ns),
                Record::Drop(d) => format!("drop {}", d.ts_ns),
                Record::Transaction(t) => format!("transaction {}", t.id),
                Record::Detected(crate::output::record::Detected::Loop(l)) => {
                    format!("loop {:?}", l.state)
                }
                Record::Detected(d) => d.name().into(),
                Record::FragmentLoss(f) => format!("fragment_loss {}", f.ts_ns),
                Record::Stats(_) => "stats".into(),
                Record::Summary(_) => "summary".into(),
            })
            .collect()
    }

    /// `--count 2`: the batch holding the second packet also holds a drop and the
    /// transactions the correlate stage finished; they are written, later packets are not,
    /// and the run stops after the batch.
    #[test]
    fn count_stop_writes_the_rest_of_its_batch_but_no_more_packets() {
        let mut w = BatchWriter::new(&opts(Some(2), false, View::Both));
        let mut sink = Collect::default();
        let mut batch = vec![packet(1)];
        assert!(!w.write(&mut batch, &mut sink).unwrap());
        let mut batch = vec![
            packet(2),
            drop_record(3),
            packet(4),
            transaction(7),
            transaction(8),
        ];
        assert!(w.write(&mut batch, &mut sink).unwrap());
        assert!(batch.is_empty());
        // At the end: the correlator's flush, and packets drained from the ring.
        let mut last = vec![packet(5), transaction(9), Record::Stats(Box::default())];
        w.write(&mut last, &mut sink).unwrap();
        // Packets 4 and 5 were decided after the stop: counted, not written.
        assert_eq!(w.stop.not_written(), 2);
        assert_eq!(
            kinds(&sink.0),
            [
                "packet 1",
                "packet 2",
                "drop 3",
                "transaction 7",
                "transaction 8",
                "transaction 9",
                "stats"
            ]
        );
    }

    /// `--view transactions --count 1`: packets count though they are not shown.
    #[test]
    fn count_applies_to_hidden_packets() {
        let mut w = BatchWriter::new(&opts(Some(1), false, View::Transactions));
        let mut sink = Collect::default();
        let mut batch = vec![packet(1), transaction(1), packet(2), transaction(2)];
        assert!(w.write(&mut batch, &mut sink).unwrap());
        assert_eq!(kinds(&sink.0), ["transaction 1", "transaction 2"]);
        assert_eq!(w.stop.packets(), 1);
    }

    /// `--until loop`: the records after the detected loop in its batch are still written.
    #[test]
    fn until_loop_writes_the_rest_of_the_batch() {
        let mut w = BatchWriter::new(&opts(None, true, View::Both));
        let mut sink = Collect::default();
        let mut batch = vec![
            packet(1),
            loop_record(LoopState::Detected),
            transaction(3),
            drop_record(4),
        ];
        let stop = w.write(&mut batch, &mut sink).unwrap();
        assert!(stop && w.stop.loop_found());
        assert_eq!(
            kinds(&sink.0),
            ["packet 1", "loop Detected", "transaction 3", "drop 4"]
        );
        // Without a loop, no stop.
        let mut w = BatchWriter::new(&opts(None, true, View::Both));
        let mut batch = vec![packet(1), loop_record(LoopState::Ongoing)];
        assert!(!w.write(&mut batch, &mut sink).unwrap());
    }
    /// Lets writes through once opened; until then the output's thread waits in its first
    /// write (a reader that does not read).
    #[derive(Clone, Default)]
    struct Gate(std::sync::Arc<(std::sync::Mutex<bool>, std::sync::Condvar)>);

    impl Gate {
        fn open(&self) {
            *self.0 .0.lock().unwrap() = true;
            self.0 .1.notify_all();
        }
    }

    impl Write for Gate {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            let mut open = self.0 .0.lock().unwrap();
            while !*open {
                open = self.0 .1.wait(open).unwrap();
            }
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// The output refuses packet records while its queue is full, if it writes every one;
    /// the ones held back for it are its drops, in the final `stats`. Without the packet
    /// view it ignores them; with a filter it wants them (a filtered record is no drop).
    #[test]
    fn a_full_output_refuses_packet_records_and_counts_those_held_back() {
        let gate = Gate::default();
        let mut w =
            TraceWriter::new(&opts(None, false, View::Both), Box::new(gate.clone())).unwrap();
        assert_eq!(w.packet_records(), PacketRecords::Wanted);
        let mut batch: Vec<Record> = (0..queue::RECORDS as u64 + 10).map(packet).collect();
        let b = Batch {
            records: &[],
            sources: &[],
            packets_allowed: None,
            packet_records_held: 0,
            now_ns: 0,
        };
        w.batch_owned(&mut batch, b).unwrap();
        assert_eq!(w.wants().packet_records, PacketRecords::Refused);
        // The next batch says 5 were held back meanwhile.
        w.batch_owned(
            &mut Vec::new(),
            Batch {
                packet_records_held: 5,
                ..b
            },
        )
        .unwrap();
        gate.open();
        let mut stats = StatsRecord::default();
        w.finish(&mut stats, 0).unwrap();
        let q = w.sink.queue().stats();
        // Every record offered is written or dropped, the 5 held back are drops too, and the
        // final stats are written. How many the output's thread took before it blocked
        // depends on when it ran (on a quiet machine: RECORDS + 1 written, 15 dropped).
        assert_eq!(
            q.written + q.dropped,
            queue::RECORDS as u64 + 10 + 5 + 1,
            "{q:?}"
        );
        assert!(q.dropped >= 15 && q.written > 0, "{q:?}");

        let w = TraceWriter::new(
            &opts(None, false, View::Transactions),
            Box::new(std::io::sink()),
        )
        .unwrap();
        assert_eq!(w.packet_records(), PacketRecords::Ignored);
        let mut filtered = opts(None, false, View::Both);
        filtered.filter = Filter::new(&crate::output::filter::FilterSpec {
            failures: true,
            ..Default::default()
        })
        .unwrap();
        let gate = Gate::default();
        let mut w = TraceWriter::new(&filtered, Box::new(gate.clone())).unwrap();
        let mut batch: Vec<Record> = (0..queue::RECORDS as u64 + 10).map(packet).collect();
        w.batch_owned(&mut batch, b).unwrap();
        assert_eq!(w.packet_records(), PacketRecords::Wanted);
        gate.open();
    }
}
