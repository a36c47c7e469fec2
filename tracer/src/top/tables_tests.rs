use super::*;
use crate::{
    correlate::LegRole,
    detect::race::RaceVerdict,
    output::{
        filter::{Filter, FilterSpec},
        sink::{Batch, Sink},
        Format,
    },
    test_support::fixtures::{
        drop_record, dropped, leg, loop_record, race, service_transaction, transaction,
    },
    top::{Cell, Shown, TopOutput, TopSink},
};

fn unanswered(client: &str) -> Record {
    Record::Transaction(Box::new(transaction(
        "void.lab.test.",
        "A",
        client,
        None,
        vec![leg(
            LegRole::Query,
            client,
            "10.250.0.54:53",
            "10.250.0.54:53",
            None,
            None,
        )],
    )))
}

/// The traffic the lab test sends, in records: 3 answered and 1 NXDOMAIN question from
/// one client through the Service and its upstream, 2 unanswered from another to a dead
/// server, a dropped one, a race, a loop, kernel drops.
fn traffic() -> Vec<Record> {
    let mut r = Vec::new();
    for port in 0..3 {
        r.push(service_transaction(
            "www.lab.test.",
            "A",
            5000 + port,
            "NOERROR",
        ));
    }
    r.push(service_transaction("nope.lab.test.", "A", 5010, "NXDOMAIN"));
    r.push(unanswered("10.244.1.9:7000"));
    r.push(unanswered("10.244.1.9:7001"));
    r.push(Record::Transaction(Box::new(transaction(
        "gone.lab.test.",
        "AAAA",
        "10.244.1.9:7002",
        None,
        vec![dropped(
            leg(
                LegRole::Query,
                "10.244.1.9:7002",
                "10.96.0.10:53",
                "10.244.1.4:53",
                None,
                None,
            ),
            "NETFILTER_DROP",
        )],
    ))));
    r.push(Record::detected(race(
        RaceVerdict::RaceDrop,
        "10.244.1.2:5000",
        7,
        "A",
    )));
    r.push(Record::detected(loop_record(4, LoopState::Detected, 1)));
    r.push(Record::Drop(Box::new(drop_record("NETFILTER_DROP", None))));
    r.push(Record::Drop(Box::new(drop_record("NETFILTER_DROP", None))));
    r.push(Record::Drop(Box::new(drop_record(
        "QUEUE_PURGE",
        Some("socket closed"),
    ))));
    r
}

fn row<'a>(t: &'a crate::top::Table, first: &str) -> &'a [Cell] {
    t.rows
        .iter()
        .find(|r| r.first() == Some(&Cell::Text(first.into())))
        .unwrap_or_else(|| panic!("no row {first}: {t:#?}"))
}

fn cell<'a>(t: &'a crate::top::Table, first: &str, key: &str) -> &'a Cell {
    let i = t.column(key).unwrap_or_else(|| panic!("no column {key}"));
    &row(t, first)[i]
}

#[test]
fn clients_servers_names_and_status_count_what_was_sent() {
    let mut t = Tables::default();
    for r in traffic() {
        t.add(&r);
    }
    t.roll(2.0);
    let c = t.clients_table();
    assert_eq!(c.rows.len(), 2);
    let a = "client/10.244.1.2";
    assert_eq!(cell(&c, a, "questions"), &Cell::Count(4));
    assert_eq!(cell(&c, a, "qps"), &Cell::Rate(2.0));
    assert_eq!(cell(&c, a, "answered_pct"), &Cell::Percent(Some(100.0)));
    assert_eq!(cell(&c, a, "nxdomain"), &Cell::Count(1));
    assert_eq!(cell(&c, a, "unanswered"), &Cell::Count(0));
    assert_eq!(cell(&c, a, "p50_ms"), &Cell::Ms(Some(0.608)));
    // Every fixture transaction is its own lookup's first step.
    assert_eq!(cell(&c, a, "search"), &Cell::Ratio(Some(1.0)));
    let b = "client/10.244.1.9";
    assert_eq!(cell(&c, b, "questions"), &Cell::Count(3));
    assert_eq!(cell(&c, b, "answered_pct"), &Cell::Percent(Some(0.0)));
    assert_eq!(cell(&c, b, "unanswered"), &Cell::Count(2));
    assert_eq!(cell(&c, b, "dropped"), &Cell::Count(1));
    assert_eq!(cell(&c, b, "p50_ms"), &Cell::Ms(None));

    let s = t.servers_table();
    let coredns = "10.244.1.3:53";
    assert_eq!(cell(&s, coredns, "role"), &Cell::Text("service".into()));
    assert_eq!(cell(&s, coredns, "queries"), &Cell::Count(4));
    assert_eq!(cell(&s, coredns, "noerror"), &Cell::Count(3));
    assert_eq!(cell(&s, coredns, "nxdomain"), &Cell::Count(1));
    // 0.63 ms at the client, 0.273 ms of it upstream: 0.357 ms its own (within a bucket).
    assert_eq!(cell(&s, coredns, "own_p50_ms"), &Cell::Ms(Some(0.368)));
    assert_eq!(cell(&s, coredns, "upstream_p50_ms"), &Cell::Ms(Some(0.272)));
    assert_eq!(
        cell(&s, "10.250.0.53:53", "role"),
        &Cell::Text("upstream".into())
    );
    assert_eq!(cell(&s, "10.250.0.54:53", "unanswered"), &Cell::Count(2));
    assert_eq!(cell(&s, "10.244.1.4:53", "unanswered"), &Cell::Count(1));

    let n = t.names_table();
    let www = row(&n, "www.lab.test.");
    assert_eq!(www[3], Cell::Count(3));
    assert_eq!(www[8], Cell::Text("NOERROR".into()));
    assert_eq!(row(&n, "nope.lab.test.")[8], Cell::Text("NXDOMAIN".into()));
    assert_eq!(row(&n, "void.lab.test.")[7], Cell::Count(2));
    assert_eq!(row(&n, "gone.lab.test.")[8], Cell::Text("dropped".into()));

    let snap = t.snapshot(&Shown::new(10), 0);
    assert_eq!(snap.status.races, 1);
    assert_eq!(snap.status.race_drops, 1);
    assert_eq!(snap.status.loops_active.len(), 1);
    assert_eq!(snap.status.drops.len(), 1, "benign drops are not shown");
    assert_eq!(snap.status.drops[0].count, 2);
    // Sorted by questions, most first; the loop's banner until it ends.
    assert_eq!(snap.clients.rows[0][0], Cell::Text(a.into()));
    assert_eq!(snap.loop_banners().len(), 1);
    t.add(&Record::detected(loop_record(4, LoopState::Ended, 2)));
    assert!(t.snapshot(&Shown::new(10), 0).loop_banners().is_empty());
}

/// A table full folds the next keys into `other`, counted; the rates are the interval's.
#[test]
fn tables_are_capped_and_rates_are_per_interval() {
    let mut t = Tables::default();
    for i in 0..(MAX_CLIENTS as u16 + 5) {
        let ip = format!("10.{}.{}.2:53", i / 256, i % 256);
        t.add(&unanswered(&ip));
    }
    assert_eq!(t.clients.len(), MAX_CLIENTS);
    assert_eq!(t.clients_table().folded, 5);
    t.roll(1.0);
    t.roll(1.0);
    assert_eq!(t.clients_table().rows[0][1], Cell::Rate(0.0));
    assert_eq!(t.elapsed_s, 2.0);
}

/// The sink counts what the filter keeps; `-o json` writes a snapshot each interval and
/// one at the end, `--once` text one table at the end.
#[test]
fn the_sink_filters_and_writes_snapshots() {
    #[derive(Clone, Default)]
    struct Shared(Arc<Mutex<Vec<u8>>>);
    impl std::io::Write for Shared {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    use std::sync::{Arc, Mutex};
    let filter = Filter::new(&FilterSpec {
        names: vec!["www.lab.test".into()],
        ..Default::default()
    })
    .unwrap();
    let records = traffic();
    let batch = Batch {
        records: &records,
        sources: &[],
        packets_allowed: None,
        packet_records_held: 0,
        now_ns: 0,
    };
    let out = Shared::default();
    let tables = Arc::new(Mutex::new(Tables::default()));
    let mut sink = TopSink::new(
        Arc::clone(&tables),
        filter.clone(),
        1_000_000_000,
        TopOutput::Batch {
            format: Format::Json,
            once: false,
            shown: Shown::new(5),
            out: Box::new(out.clone()),
        },
    );
    sink.batch(batch).unwrap();
    let mut stats = StatsRecord::default();
    stats.decode.packets = 40;
    sink.periodic(&stats, 500_000_000);
    sink.periodic(&stats, 1_000_000_000);
    sink.finish(&mut stats, 1_500_000_000).unwrap();
    let text = String::from_utf8(out.0.lock().unwrap().clone()).unwrap();
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 2, "{text}");
    let first = &lines[0];
    assert_eq!(first["type"], "top");
    assert_eq!(first["status"]["packets"], 40);
    assert_eq!(first["status"]["packets_per_s"], 40.0);
    let clients = first["clients"]["rows"].as_array().unwrap();
    assert_eq!(clients.len(), 1, "only www.lab.test.'s client: {first:#}");
    assert_eq!(clients[0]["client"], "client/10.244.1.2");
    assert_eq!(clients[0]["questions"], 3);
    assert_eq!(clients[0]["qps"], 3.0);
    assert_eq!(first["names"]["rows"][0]["name"], "www.lab.test.");
    assert_eq!(lines[1]["elapsed_s"], 1.5);

    let out = Shared::default();
    let mut sink = TopSink::new(
        Arc::new(Mutex::new(Tables::default())),
        Filter::default(),
        1_000_000_000,
        TopOutput::Batch {
            format: Format::Text,
            once: true,
            shown: Shown::new(5),
            out: Box::new(out.clone()),
        },
    );
    sink.batch(batch).unwrap();
    sink.periodic(&stats, 1_000_000_000);
    assert!(
        out.0.lock().unwrap().is_empty(),
        "--once writes at the end only"
    );
    sink.finish(&mut stats, 2_000_000_000).unwrap();
    let text = String::from_utf8(out.0.lock().unwrap().clone()).unwrap();
    assert!(
        text.starts_with("dnspath top: 2 s counted; 20.0 pkts/s, 40 packets"),
        "{text}"
    );
    assert!(
        text.contains("\nLOOP 4: storm.lab.test. A going round"),
        "{text}"
    );
    assert!(text.contains("\n\nclients (2 shown)\nCLIENT"), "{text}");
    // Rates over the whole run: 4 questions in 2 s.
    let line = text
        .lines()
        .find(|l| l.starts_with("client/10.244.1.2"))
        .unwrap();
    let words: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(
        &words[..4],
        ["client/10.244.1.2", "2.0", "4", "100.0"],
        "{text}"
    );
    // The screen's short status and the whole one.
    assert!(
        text.contains("loops active, kernel drops: NETFILTER_DROP 2"),
        "{text}"
    );
}
