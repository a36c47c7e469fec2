//! The run summary's counting: [`RunTally`] folds the records a run shows (its filter's)
//! into a [`SummaryRecord`]; [`SummarySink`] is it as a sink of `trace` and `analyze`.
use std::{collections::HashMap, io::Write};

use crate::{
    correlate::record::{transaction_summary, Outcome, TransactionRecord},
    output::{
        escape,
        filter::Filter,
        record::{Record, StatsRecord},
        sink::{Batch, PacketRecords, Sink, Wants},
        summary::{summary_text, Busiest, FailureClass, Share, SummaryRecord, BUSIEST},
        tally::{client_of, served_legs, Capped, Latency},
        Format,
    },
};

/// Clients and servers counted (the rest folded into `other`, counted).
const MAX_ROWS: usize = 4096;
/// Failure classes kept (each with its first example), and rcodes.
const MAX_CLASSES: usize = 64;

fn ratio(n: u64, of: u64) -> f64 {
    if of == 0 {
        0.0
    } else {
        (n as f64 / of as f64 * 10_000.0).round() / 10_000.0
    }
}

/// Counts records into a [`SummaryRecord`].
#[derive(Debug)]
pub struct RunTally {
    questions: u64,
    outcomes: HashMap<Outcome, u64>,
    rcodes: HashMap<String, u64>,
    latency: Latency,
    clients: Capped<String, u64>,
    servers: Capped<String, (Option<String>, u64)>,
    failures: Vec<FailureClass>,
    classes_folded: u64,
}

impl Default for RunTally {
    fn default() -> Self {
        Self {
            questions: 0,
            outcomes: HashMap::new(),
            rcodes: HashMap::new(),
            latency: Latency::default(),
            clients: Capped::new(MAX_ROWS),
            servers: Capped::new(MAX_ROWS),
            failures: Vec::new(),
            classes_folded: 0,
        }
    }
}

impl RunTally {
    /// Counts `r`.
    pub fn add(&mut self, r: &Record) {
        match r {
            Record::Transaction(t) => self.add_transaction(t),
            Record::Detected(d) => {
                if let Some((class, example)) = d.get().failure() {
                    self.failure(class, || escape(&example).into_owned());
                }
            }
            Record::Drop(d) if d.benign.is_none() => {
                let class = format!("kernel drop {}", escape(&d.reason));
                let ex = format!(
                    "{} > {} at {}/{} ({})",
                    d.src,
                    d.dst,
                    escape(&d.netns),
                    escape(&d.ifname),
                    escape(&d.location)
                );
                self.failure(&class, || ex);
            }
            Record::FragmentLoss(f) => {
                let ex = format!(
                    "{} > {} at {}/{}",
                    f.src,
                    f.dst,
                    escape(&f.netns),
                    escape(&f.ifname)
                );
                self.failure("fragment loss", || ex);
            }
            _ => {}
        }
    }

    fn add_transaction(&mut self, t: &TransactionRecord) {
        self.questions += 1;
        *self.outcomes.entry(t.outcome).or_default() += 1;
        if let Some(rc) = &t.rcode {
            if let Some(n) = self.rcodes.get_mut(&**rc) {
                *n += 1;
            } else if self.rcodes.len() < MAX_CLASSES {
                self.rcodes.insert(rc.to_string(), 1);
            }
        }
        if t.outcome == Outcome::Answered {
            if let Some(ns) = t.latency_ns {
                self.latency.add(ns);
            }
        }
        *self.clients.row(client_of(t)) += 1;
        for leg in served_legs(t) {
            let row = self.servers.row(leg.backend.to_string());
            row.1 += 1;
            if row.0.is_none() {
                row.0 = leg.pod;
            }
        }
        let class = match (t.outcome, &t.rcode) {
            (Outcome::Answered, Some(rc)) if rc.is_failure() => rc.to_string(),
            (Outcome::Answered, _) => return,
            (o, _) => o.as_str().to_string(),
        };
        self.failure(&class, || {
            format!(
                "{} asks {} {}: {}",
                escape(&client_of(t)),
                escape(&t.question.name),
                t.question.qtype,
                escape(&transaction_summary(t))
            )
        });
    }

    fn failure(&mut self, class: &str, example: impl FnOnce() -> String) {
        if let Some(c) = self.failures.iter_mut().find(|c| c.class == class) {
            c.count += 1;
        } else if self.failures.len() < MAX_CLASSES {
            self.failures.push(FailureClass {
                class: class.to_string(),
                count: 1,
                example: example(),
            });
        } else {
            self.classes_folded += 1;
        }
    }

    /// What was counted, as a record.
    pub fn record(&self) -> SummaryRecord {
        let q = self.questions;
        let mut outcomes: Vec<Share> = self
            .outcomes
            .iter()
            .map(|(o, n)| Share {
                what: o.as_str().to_string(),
                count: *n,
                ratio: ratio(*n, q),
            })
            .collect();
        outcomes.sort_by(|a, b| b.count.cmp(&a.count).then(a.what.cmp(&b.what)));
        let mut rcodes: Vec<Share> = self
            .rcodes
            .iter()
            .map(|(r, n)| Share {
                what: r.clone(),
                count: *n,
                ratio: ratio(*n, q),
            })
            .collect();
        rcodes.sort_by(|a, b| b.count.cmp(&a.count).then(a.what.cmp(&b.what)));
        let mut clients: Vec<Busiest> = self
            .clients
            .rows()
            .map(|(c, n)| Busiest {
                name: c.clone(),
                pod: None,
                count: *n,
            })
            .collect();
        clients.sort_by(|a, b| b.count.cmp(&a.count).then(a.name.cmp(&b.name)));
        clients.truncate(BUSIEST);
        let mut servers: Vec<Busiest> = self
            .servers
            .rows()
            .map(|(s, (pod, n))| Busiest {
                name: s.clone(),
                pod: pod.clone(),
                count: *n,
            })
            .collect();
        servers.sort_by(|a, b| b.count.cmp(&a.count).then(a.name.cmp(&b.name)));
        servers.truncate(BUSIEST);
        SummaryRecord {
            questions: q,
            outcomes,
            rcodes,
            p50_ms: self.latency.quantile_ms(0.5),
            p90_ms: self.latency.quantile_ms(0.9),
            p99_ms: self.latency.quantile_ms(0.99),
            busiest_clients: clients,
            busiest_servers: servers,
            failures: self.failures.clone(),
            folded: self.clients.other().1 + self.servers.other().1,
        }
    }
}

/// The summary's sink: counts what the run shows; at the end writes the text to `text_out`
/// (stderr), or hands the record to the JSON writer after it (`stats.summary`).
pub struct SummarySink {
    tally: RunTally,
    filter: Filter,
    format: Format,
    text_out: Box<dyn Write + Send>,
}

impl SummarySink {
    pub fn new(format: Format, filter: Filter, text_out: Box<dyn Write + Send>) -> Self {
        Self {
            tally: RunTally::default(),
            filter,
            format,
            text_out,
        }
    }
}

impl Sink for SummarySink {
    /// Packet records count for nothing here; hops' pods name the servers.
    fn wants(&self) -> Wants {
        Wants {
            packet_records: PacketRecords::Ignored,
            ..Wants::default()
        }
    }
    fn batch(&mut self, batch: Batch<'_>) -> std::io::Result<()> {
        for r in batch.records {
            if !matches!(r, Record::Packet(_)) && self.filter.keep(r) {
                self.tally.add(r);
            }
        }
        Ok(())
    }
    fn finish(&mut self, stats: &mut StatsRecord, _now_ns: u64) -> std::io::Result<()> {
        let record = self.tally.record();
        match self.format {
            Format::Json => stats.summary = Some(Box::new(record)),
            Format::Text => {
                writeln!(self.text_out, "{}", summary_text(&record))?;
                self.text_out.flush()?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        correlate::LegRole,
        detect::loops::LoopState,
        test_support::fixtures::{drop_record, leg, loop_record, service_transaction, transaction},
    };

    fn tally(records: &[Record]) -> SummaryRecord {
        let mut t = RunTally::default();
        for r in records {
            t.add(r);
        }
        t.record()
    }

    #[test]
    fn outcomes_rcodes_and_failures_are_counted_with_one_example_each() {
        let unanswered = Record::Transaction(Box::new(transaction(
            "void.lab.test.",
            "A",
            "10.244.1.9:7000",
            None,
            vec![leg(
                LegRole::Query,
                "10.244.1.9:7000",
                "10.250.0.54:53",
                "10.250.0.54:53",
                None,
                None,
            )],
        )));
        let records = vec![
            service_transaction("www.lab.test.", "A", 5000, "NOERROR"),
            service_transaction("www.lab.test.", "A", 5001, "NOERROR"),
            service_transaction("nope.lab.test.", "A", 5002, "NXDOMAIN"),
            service_transaction("bad.lab.test.", "A", 5003, "SERVFAIL"),
            unanswered.clone(),
            unanswered,
            Record::Drop(Box::new(drop_record("NETFILTER_DROP", None))),
            Record::Drop(Box::new(drop_record("QUEUE_PURGE", Some("socket closed")))),
            Record::detected(loop_record(1, LoopState::Detected, 10)),
            Record::detected(loop_record(1, LoopState::Ongoing, 20)),
        ];
        let s = tally(&records);
        assert_eq!(s.questions, 6);
        let share =
            |v: &[Share], w: &str| v.iter().find(|s| s.what == w).map(|s| (s.count, s.ratio));
        assert_eq!(share(&s.outcomes, "answered"), Some((4, 0.6667)));
        assert_eq!(share(&s.outcomes, "unanswered"), Some((2, 0.3333)));
        assert_eq!(share(&s.rcodes, "NOERROR"), Some((2, 0.3333)));
        assert_eq!(share(&s.rcodes, "NXDOMAIN"), Some((1, 0.1667)));
        let classes: Vec<(&str, u64)> = s
            .failures
            .iter()
            .map(|f| (f.class.as_str(), f.count))
            .collect();
        assert_eq!(
            classes,
            [
                ("SERVFAIL", 1),
                ("unanswered", 2),
                ("kernel drop NETFILTER_DROP", 1),
                ("loop", 1)
            ]
        );
        assert!(
            s.failures[1].example.contains("void.lab.test. A"),
            "{:?}",
            s.failures[1]
        );
        assert_eq!(s.busiest_clients[0].name, "client/10.244.1.2");
        assert_eq!(s.busiest_clients[0].count, 4);
        // The service's backend and the upstream, 4 queries each; the hole twice.
        let servers: Vec<(&str, u64)> = s
            .busiest_servers
            .iter()
            .map(|b| (b.name.as_str(), b.count))
            .collect();
        assert_eq!(
            servers,
            [
                ("10.244.1.3:53", 4),
                ("10.250.0.53:53", 4),
                ("10.250.0.54:53", 2)
            ]
        );
        // Answered latencies only (the fixture's 0.63 ms).
        assert_eq!(s.p50_ms, Some(0.608));
        let text = summary_text(&s);
        assert!(
            text.starts_with(
                "--- summary: 6 question(s): answered 4 (66.7 %), unanswered 2 (33.3 %)"
            ),
            "{text}"
        );
        assert!(text.contains("\n--- failure unanswered ×2, e.g. client/10.244.1.9 asks void.lab.test. A: unanswered after 5.0 s"), "{text}");
    }

    /// Names off the wire are escaped in the text; the JSON record goes to the writer.
    #[test]
    fn text_is_escaped_and_json_is_handed_on() {
        let Record::Transaction(mut t) =
            service_transaction("x\u{1b}[7m.lab.test.", "A", 1, "SERVFAIL")
        else {
            panic!("a transaction")
        };
        t.pod.pod = Some("ns/\u{202e}evil".into());
        let records = [Record::Transaction(t)];
        let text = summary_text(&tally(&records));
        assert!(
            !text.contains('\u{1b}') && !text.contains('\u{202e}'),
            "{text}"
        );
        assert!(text.contains("x\\x1b[7m.lab.test."), "{text}");

        let mut sink = SummarySink::new(Format::Json, Filter::default(), Box::new(std::io::sink()));
        sink.batch(Batch {
            records: &records,
            sources: &[],
            packets_allowed: None,
            packet_records_held: 0,
            now_ns: 0,
        })
        .unwrap();
        let mut stats = StatsRecord::default();
        sink.finish(&mut stats, 0).unwrap();
        assert_eq!(stats.summary.map(|s| s.questions), Some(1));
    }
}
