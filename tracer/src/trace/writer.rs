//! Where a live run's records go: the [`LiveSink`] trait, and `trace`'s own sink that writes
//! them as text or NDJSON and applies `--count` and `--until loop`.
use std::{io::Write, time::Instant};

use super::TraceOptions;
use crate::{
    detect::loops::LoopState,
    event::KernelSetup,
    output::{
        self,
        filter::Filter,
        queue::{self, QueuedSink},
        record::StatsRecord,
        Record,
    },
};

/// Where a live run's records go: `trace` writes them ([`TraceWriter`]), the agent counts
/// them and reports what people act on.
pub trait LiveSink {
    /// Attached: what this kernel gave.
    fn started(&mut self, _setup: &KernelSetup, _now_ns: u64) {}
    /// Each turn of the run loop (at least every 50 ms): the records decided since the last
    /// turn, to take. Returns whether the run should stop now.
    fn batch(&mut self, records: &mut Vec<Record>, now_ns: u64) -> std::io::Result<bool>;
    /// About once a second: the running totals.
    fn periodic(&mut self, _stats: &StatsRecord, _now_ns: u64) {}
    /// The run is over: its last records went to [`LiveSink::batch`]; these are the final
    /// totals.
    fn finish(&mut self, stats: &StatsRecord, now_ns: u64) -> std::io::Result<()>;
    /// `--count` was reached: the ring buffer's rest is left unread.
    fn count_reached(&self) -> bool {
        false
    }
    /// A forwarding loop was reported (`--until loop`).
    fn loop_found(&self) -> bool {
        false
    }
    /// Packet records decided after a `--count` stop and not written.
    fn not_written(&self) -> u64 {
        0
    }
}

/// `trace`'s sink: records written as text or NDJSON by a thread of their own behind a
/// bounded queue (a slow reader costs records, counted in `stats.sinks`, never packets),
/// `--count` and `--until loop` applied to the records before the queue.
pub struct TraceWriter {
    writer: BatchWriter,
    sink: QueuedSink,
}

impl TraceWriter {
    pub fn new(opts: &TraceOptions, out: Box<dyn Write + Send>) -> std::io::Result<Self> {
        Ok(Self {
            writer: BatchWriter::new(opts),
            sink: QueuedSink::spawn("output", queue::RECORDS, output::sink(opts.format, out))?,
        })
    }
}

impl LiveSink for TraceWriter {
    fn batch(&mut self, records: &mut Vec<Record>, _now_ns: u64) -> std::io::Result<bool> {
        self.writer.write(records, &mut self.sink)
    }
    /// Waits (at most [`queue::DRAIN_WAIT`] in all) for what is queued to be written, so the
    /// `stats` record counts it, then for the `stats` record itself.
    fn finish(&mut self, stats: &StatsRecord, _now_ns: u64) -> std::io::Result<()> {
        let deadline = Instant::now() + queue::DRAIN_WAIT;
        let q = self.sink.queue();
        q.wait_written(queue::DRAIN_WAIT);
        let mut stats = stats.clone();
        stats.sinks = vec![q.stats()];
        q.push_last(Record::Stats(Box::new(stats)))?;
        let (_, result) = q.finish(deadline.saturating_duration_since(Instant::now()));
        result
    }
    fn count_reached(&self) -> bool {
        self.writer.count_reached()
    }
    fn loop_found(&self) -> bool {
        self.writer.loop_found
    }
    fn not_written(&self) -> u64 {
        self.writer.not_written
    }
}

/// Writes each batch of records and decides when the run stops: `--count` limits the packet
/// records, `--until loop` stops at the first detected loop. A stop ends the run after the
/// batch it happened in: the transactions, drops, races and loops of that batch (decided
/// before the stop) are written all the same; only packets beyond `--count` are not.
struct BatchWriter {
    count: Option<u64>,
    until_loop: bool,
    show_packets: bool,
    /// Packet records counted against `count` (written, or hidden by the view).
    packets_out: u64,
    /// Packet records decided after `count` was reached (in the batch of the stop, or
    /// unfinished TCP messages reported at the end): counted, not written.
    not_written: u64,
    loop_found: bool,
    filter: Filter,
}

impl BatchWriter {
    fn new(opts: &TraceOptions) -> Self {
        Self {
            count: opts.count,
            until_loop: opts.until_loop,
            show_packets: opts.view.packets(),
            packets_out: 0,
            not_written: 0,
            loop_found: false,
            filter: opts.filter.clone(),
        }
    }

    fn count_reached(&self) -> bool {
        self.count.is_some_and(|n| self.packets_out >= n)
    }

    /// Writes (and empties) `records`; returns whether the run should stop now.
    fn write(
        &mut self,
        records: &mut Vec<Record>,
        sink: &mut dyn output::Sink,
    ) -> std::io::Result<bool> {
        for r in records.drain(..) {
            if matches!(r, Record::Packet(_)) {
                if self.count_reached() {
                    self.not_written += 1;
                    continue;
                }
                self.packets_out += 1;
                if !self.show_packets {
                    continue;
                }
            }
            if let Record::Loop(l) = &r {
                self.loop_found |= l.state == LoopState::Detected;
            }
            if !self.filter.keep(&r) {
                continue;
            }
            sink.write_owned(r)?;
        }
        sink.flush()?;
        Ok(self.count_reached() || (self.until_loop && self.loop_found))
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::{
        correlate::record::{Answered, Outcome, Summary},
        detect::loops::{LoopKind, LoopRecord},
        kernel::attach::AttachSpec,
        output::record::{DropRecord, LookupRef, PacketRecord, QuestionRecord, TransactionRecord},
        output::{Format, View},
    };

    /// Keeps what is written.
    #[derive(Default)]
    struct Collect(Vec<Record>);

    impl output::Sink for Collect {
        fn write(&mut self, record: &Record) -> std::io::Result<()> {
            self.0.push(record.clone());
            Ok(())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    fn opts(count: Option<u64>, until_loop: bool, view: View) -> TraceOptions {
        TraceOptions {
            attach: AttachSpec::default(),
            filter: Filter::default(),
            every_packet: true,
            ports: vec![53],
            snaplen: 2048,
            format: Format::Json,
            view,
            timeout: Duration::from_secs(5),
            duration: None,
            count,
            drops: true,
            kernel_log: false,
            until_loop,
            evidence: Default::default(),
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
            dir: "ingress",
            proto: "udp",
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
        QuestionRecord::new("www.lab.test.", "A", "IN")
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
            proto: "udp",
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
        Record::Loop(LoopRecord {
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
                Record::Loop(l) => format!("loop {:?}", l.state),
                Record::Race(_) => "race".into(),
                Record::FragmentLoss(f) => format!("fragment_loss {}", f.ts_ns),
                Record::Stats(_) => "stats".into(),
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
        assert_eq!(w.not_written, 2);
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
        assert_eq!(w.packets_out, 1);
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
        assert!(stop && w.loop_found);
        assert_eq!(
            kinds(&sink.0),
            ["packet 1", "loop Detected", "transaction 3", "drop 4"]
        );
        // Without a loop, no stop.
        let mut w = BatchWriter::new(&opts(None, true, View::Both));
        let mut batch = vec![packet(1), loop_record(LoopState::Ongoing)];
        assert!(!w.write(&mut batch, &mut sink).unwrap());
    }
}
