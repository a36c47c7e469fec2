use serde_json::Value;

use super::*;
use crate::correlate::{record::Outcome, LegRole};
use crate::detect::{loops::LoopState, race::RaceVerdict};
use crate::output::record::DecodeStats;
use crate::test_support::fixtures::{drop_record, dropped, leg, loop_record, race, transaction};

const S: u64 = 1_000_000_000;

fn events() -> Events {
    Events::new(EventsConfig::default(), Clock::Epoch)
}

/// A client question to `server` that went unanswered.
fn unanswered(server: &str, i: u64) -> Record {
    let client = format!("10.244.1.2:{}", 30_000 + i);
    let l = leg(LegRole::Query, &client, server, "10.244.1.3:53", None, None);
    Record::Transaction(Box::new(transaction(
        &format!("q{i}.lab.test."),
        "A",
        &client,
        None,
        vec![l],
    )))
}

fn servfail(server: &str) -> Record {
    let client = "10.244.1.2:5000";
    let l = leg(
        LegRole::Query,
        client,
        server,
        server,
        Some("SERVFAIL"),
        Some(1),
    );
    Record::Transaction(Box::new(transaction(
        "bad.lab.test.",
        "AAAA",
        client,
        Some("SERVFAIL"),
        vec![l],
    )))
}

fn kinds(out: &[Event]) -> Vec<&'static str> {
    out.iter()
        .map(|e| match e {
            Event::Agent(_) => "agent",
            Event::Detected(d) => d.name(),
            Event::Drop(_) => "drop",
            Event::FragmentLoss(_) => "fragment_loss",
            Event::Unanswered(_) => "unanswered",
            Event::Servfail(_) => "servfail",
            Event::Suppressed(_) => "suppressed",
            Event::Warning(_) => "warning",
            Event::Finding(_) => "finding",
        })
        .collect()
}

#[test]
fn unanswered_and_servfail_fold_per_server_and_window() {
    let mut ev = events();
    let mut out = Vec::new();
    for i in 0..100 {
        ev.observe(
            &unanswered("10.96.0.10:53", i),
            S + i * 10_000_000,
            &mut out,
        );
    }
    for i in 0..3 {
        ev.observe(&unanswered("127.0.0.53:53", i), 2 * S, &mut out);
    }
    for _ in 0..5 {
        ev.observe(&servfail("10.96.0.10:53"), 3 * S, &mut out);
    }
    // A dropped question is unanswered too; an answered one is nothing.
    let client = "10.244.1.2:7000";
    let d = dropped(
        leg(
            LegRole::Query,
            client,
            "10.96.0.10:53",
            "10.244.1.3:53",
            None,
            None,
        ),
        "NETFILTER_DROP",
    );
    ev.observe(
        &Record::Transaction(Box::new(transaction(
            "d.lab.test.",
            "A",
            client,
            None,
            vec![d],
        ))),
        4 * S,
        &mut out,
    );
    ev.observe(
        &crate::test_support::fixtures::service_transaction("ok.lab.test.", "A", 1, "NOERROR"),
        4 * S,
        &mut out,
    );
    assert!(
        out.is_empty(),
        "nothing before the window ends: {:?}",
        kinds(&out)
    );
    ev.tick(10 * S, &mut out);
    assert!(
        out.is_empty(),
        "the window started at 1 s: {:?}",
        kinds(&out)
    );
    ev.tick(11 * S, &mut out);
    assert_eq!(kinds(&out), ["unanswered", "unanswered", "servfail"]);
    let Event::Unanswered(a) = &out[0] else {
        unreachable!()
    };
    assert_eq!((a.server.as_str(), a.count), ("10.96.0.10:53", 101));
    assert_eq!(a.examples.len(), 3);
    assert_eq!(a.examples[0].question.name, "q0.lab.test.");
    assert_eq!((a.window_start_ns, a.ts_ns), (S, 11 * S));
    let Event::Unanswered(b) = &out[1] else {
        unreachable!()
    };
    assert_eq!((b.server.as_str(), b.count), ("127.0.0.53:53", 3));
    let Event::Servfail(c) = &out[2] else {
        unreachable!()
    };
    assert_eq!((c.server.as_str(), c.count), ("10.96.0.10:53", 5));
    // The next window starts empty.
    out.clear();
    ev.tick(22 * S, &mut out);
    assert!(out.is_empty(), "{:?}", kinds(&out));
}

#[test]
fn aggregation_keys_are_capped() {
    let cfg = EventsConfig {
        max_keys: 4,
        ..EventsConfig::default()
    };
    let mut ev = Events::new(cfg, Clock::Epoch);
    let mut out = Vec::new();
    for i in 0..10u64 {
        ev.observe(&unanswered(&format!("10.0.0.{i}:53"), i), S, &mut out);
        ev.observe(&unanswered(&format!("10.0.0.{i}:53"), i), S, &mut out);
    }
    ev.close_window(2 * S, &mut out);
    let lines: Vec<(&str, u64)> = out
        .iter()
        .filter_map(|e| match e {
            Event::Unanswered(a) => Some((a.server.as_str(), a.count)),
            _ => None,
        })
        .collect();
    assert_eq!(lines.len(), 5, "{lines:?}");
    assert_eq!(lines[0], ("*", 12));
    assert_eq!(lines.iter().map(|l| l.1).sum::<u64>(), 20);
    assert_eq!(ev.keys_folded(), 12);
}

/// Unanswered and SERVFAIL lines share the cap on servers; a late answer is unanswered, and a
/// late SERVFAIL is SERVFAIL.
#[test]
fn unanswered_and_servfail_share_the_key_cap() {
    let cfg = EventsConfig {
        max_keys: 2,
        ..EventsConfig::default()
    };
    let mut ev = Events::new(cfg, Clock::Epoch);
    let mut out = Vec::new();
    let late = |server: &str, rcode: Option<&str>| {
        let Record::Transaction(mut t) = unanswered(server, 9) else {
            unreachable!()
        };
        t.outcome = Outcome::Late;
        t.rcode = rcode.map(Into::into);
        Record::Transaction(t)
    };
    ev.observe(&late("10.0.0.1:53", None), S, &mut out);
    ev.observe(&late("10.0.0.2:53", Some("SERVFAIL")), S, &mut out);
    // Two servers kept: a third key, even of a server kept for the other failure, is `*`.
    ev.observe(&unanswered("10.0.0.2:53", 1), S, &mut out);
    ev.observe(&servfail("10.0.0.2:53"), S, &mut out);
    assert_eq!(ev.keys(), 3);
    ev.close_window(2 * S, &mut out);
    let lines: Vec<(&str, &str, u64)> = out
        .iter()
        .filter_map(|e| match e {
            Event::Unanswered(a) => Some(("unanswered", a.server.as_str(), a.count)),
            Event::Servfail(a) => Some(("servfail", a.server.as_str(), a.count)),
            _ => None,
        })
        .collect();
    assert_eq!(
        lines,
        [
            ("unanswered", "*", 1),
            ("unanswered", "10.0.0.1:53", 1),
            ("servfail", "10.0.0.2:53", 2)
        ]
    );
    assert_eq!(ev.keys_folded(), 1);
}

#[test]
fn drops_and_races_are_rate_limited_with_a_count_of_the_rest() {
    let mut ev = events();
    let mut out = Vec::new();
    for i in 0..50 {
        ev.observe(
            &Record::Drop(Box::new(drop_record("NETFILTER_DROP", None))),
            S + i,
            &mut out,
        );
    }
    // Normal socket life is not an event.
    ev.observe(
        &Record::Drop(Box::new(drop_record(
            "NOT_SPECIFIED",
            Some("socket closed with unread datagrams"),
        ))),
        S,
        &mut out,
    );
    for i in 0..25 {
        ev.observe(
            &Record::detected(race(RaceVerdict::RaceDrop, "10.244.1.2:1", i, "A")),
            S,
            &mut out,
        );
    }
    // Resolved clashes and suspicions are metrics, not events.
    ev.observe(
        &Record::detected(race(RaceVerdict::ResolvedClash, "", 0, "A")),
        S,
        &mut out,
    );
    ev.observe(
        &Record::detected(race(RaceVerdict::Suspected, "10.244.1.2:2", 0, "AAAA")),
        S,
        &mut out,
    );
    assert_eq!(kinds(&out).iter().filter(|k| **k == "drop").count(), 20);
    assert_eq!(kinds(&out).iter().filter(|k| **k == "race").count(), 20);
    assert_eq!(out.len(), 40);
    out.clear();
    ev.tick(11 * S, &mut out);
    let held: Vec<(&str, u64)> = out
        .iter()
        .filter_map(|e| match e {
            Event::Suppressed(s) => Some((s.event, s.count)),
            _ => None,
        })
        .collect();
    assert_eq!(held, [("drop", 30), ("race", 5)]);
    // A new window lets lines through again.
    out.clear();
    ev.observe(
        &Record::Drop(Box::new(drop_record("NETFILTER_DROP", None))),
        12 * S,
        &mut out,
    );
    assert_eq!(kinds(&out), ["drop"]);
}

#[test]
fn loop_detected_and_ended_always_pass_updates_are_limited() {
    let mut ev = events();
    let mut out = Vec::new();
    ev.observe(
        &Record::detected(loop_record(1, LoopState::Detected, S)),
        S,
        &mut out,
    );
    for i in 0..30 {
        ev.observe(
            &Record::detected(loop_record(1, LoopState::Ongoing, S + i)),
            S + i,
            &mut out,
        );
    }
    ev.observe(
        &Record::detected(loop_record(1, LoopState::Ended, 2 * S)),
        2 * S,
        &mut out,
    );
    let states: Vec<LoopState> = out
        .iter()
        .filter_map(|e| match e {
            Event::Detected(crate::output::record::Detected::Loop(l)) => Some(l.state),
            _ => None,
        })
        .collect();
    assert_eq!(states.len(), 22);
    assert_eq!(states.first(), Some(&LoopState::Detected));
    assert_eq!(states.last(), Some(&LoopState::Ended));
}

#[test]
fn loss_growth_gives_one_warning_per_window() {
    let mut ev = events();
    let mut out = Vec::new();
    let stats = |lost, drops_lost| {
        Record::Stats(Box::new(StatsRecord {
            decode: DecodeStats {
                lost,
                drops_lost,
                ..DecodeStats::default()
            },
            ..StatsRecord::default()
        }))
    };
    ev.observe(&stats(0, 0), S, &mut out);
    ev.observe(&stats(5, 0), 2 * S, &mut out);
    ev.observe(&stats(9, 1), 3 * S, &mut out);
    assert!(out.is_empty());
    ev.tick(11 * S, &mut out);
    let [Event::Warning(w)] = out.as_slice() else {
        panic!("{:?}", kinds(&out))
    };
    assert_eq!((w.kind, w.lost, w.drops_lost), ("events_lost", 9, 1));
    // No growth, no warning.
    out.clear();
    ev.observe(&stats(9, 1), 12 * S, &mut out);
    ev.tick(22 * S, &mut out);
    assert!(out.is_empty(), "{:?}", kinds(&out));
}

#[test]
fn the_sink_writes_ndjson_with_trace_field_names() {
    let mut buf = Vec::new();
    {
        let mut sink = EventSink::new(EventsConfig::default(), Clock::Epoch, &mut buf);
        sink.start(S, Some("kernel 6.18, tcx".to_string())).unwrap();
        sink.observe(&Record::detected(loop_record(7, LoopState::Detected, S)), S)
            .unwrap();
        sink.observe(&unanswered("10.96.0.10:53", 1), 2 * S)
            .unwrap();
        sink.observe(
            &Record::Drop(Box::new(drop_record("NETFILTER_DROP", None))),
            2 * S,
        )
        .unwrap();
        sink.stop(3 * S, Some("SIGTERM".to_string())).unwrap();
    }
    let lines: Vec<Value> = std::str::from_utf8(&buf)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let types: Vec<&str> = lines.iter().map(|l| l["type"].as_str().unwrap()).collect();
    assert_eq!(
        types,
        [
            "agent",
            "loop",
            "drop",
            "unanswered",
            "finding",
            "finding",
            "agent"
        ]
    );
    assert_eq!(lines[0]["state"], "start");
    assert_eq!(lines[0]["detail"], "kernel 6.18, tcx");
    assert_eq!(lines[0]["time"], "1970-01-01T00:00:01.000000Z");
    // As `trace -o json` writes them.
    assert_eq!(lines[1]["state"], "detected");
    assert_eq!(lines[1]["question"]["name"], "storm.lab.test.");
    assert_eq!(lines[1]["id"], 7);
    assert_eq!(lines[2]["reason"], "NETFILTER_DROP");
    assert_eq!(lines[2]["location"], "nft_do_chain+0x3f");
    // The window is closed at stop, early.
    assert_eq!(lines[3]["server"], "10.96.0.10:53");
    assert_eq!(lines[3]["count"], 1);
    assert_eq!(lines[3]["examples"][0]["question"]["type"], "A");
    assert_eq!(lines[3]["examples"][0]["client_netns"], "client");
    // So is the findings window: doctor's words for the loop and the drop, ranked.
    assert_eq!(lines[4]["kind"], "runtime_loop");
    assert_eq!(lines[4]["severity"], "critical");
    assert_eq!(lines[5]["kind"], "kernel_drops");
    assert_eq!(lines[5]["window_start_ns"], 1_000_000_000);
    assert_eq!(lines[6]["state"], "stop");
    assert_eq!(lines[6]["detail"], "SIGTERM");
}

/// With `--record`, a folded line names the flight recorder's files of the questions it
/// folded: each file once, at most [`MAX_EVIDENCE`]; each example its own file. Without,
/// the field is absent.
#[test]
fn folded_lines_name_the_recorders_files() {
    let with_file = |r: Record, file: Option<String>| match r {
        Record::Transaction(mut t) => {
            t.evidence = file;
            Record::Transaction(t)
        }
        r => r,
    };
    let mut buf = Vec::new();
    {
        let mut sink = EventSink::new(EventsConfig::default(), Clock::Epoch, &mut buf);
        // Incidents close in time share a file: 40 questions, 20 files, then none.
        for i in 0..40u64 {
            let file = format!("DIR/dnspath-{:02}-unanswered.pcapng", i / 2);
            sink.observe(
                &with_file(unanswered("10.96.0.10:53", i), Some(file)),
                S + i,
            )
            .unwrap();
        }
        sink.observe(&with_file(unanswered("10.96.0.10:53", 99), None), 2 * S)
            .unwrap();
        let Record::Transaction(mut sf) = servfail("10.96.0.10:53") else {
            unreachable!()
        };
        sf.evidence = Some("DIR/dnspath-x-servfail.pcapng".into());
        sink.observe(&Record::Transaction(sf), 2 * S).unwrap();
        // Not recorded: no `evidence` at all.
        sink.observe(&unanswered("127.0.0.53:53", 1), 2 * S)
            .unwrap();
        sink.stop(3 * S, None).unwrap();
    }
    let lines: Vec<Value> = std::str::from_utf8(&buf)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let line = |kind: &str, server: &str| {
        lines
            .iter()
            .find(|l| l["type"] == kind && l["server"] == server)
            .unwrap_or_else(|| panic!("no {kind} line for {server}: {lines:#?}"))
    };
    let u = line("unanswered", "10.96.0.10:53");
    assert_eq!(u["count"], 41);
    let files: Vec<&str> = u["evidence"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f.as_str().unwrap())
        .collect();
    let expected: Vec<String> = (0..MAX_EVIDENCE)
        .map(|k| format!("DIR/dnspath-{k:02}-unanswered.pcapng"))
        .collect();
    assert_eq!(files, expected);
    assert_eq!(
        u["examples"][1]["evidence"],
        "DIR/dnspath-00-unanswered.pcapng"
    );
    assert_eq!(
        u["examples"][2]["evidence"],
        "DIR/dnspath-01-unanswered.pcapng"
    );
    let s = line("servfail", "10.96.0.10:53");
    assert_eq!(
        s["evidence"],
        serde_json::json!(["DIR/dnspath-x-servfail.pcapng"])
    );
    assert_eq!(
        s["examples"][0]["evidence"],
        "DIR/dnspath-x-servfail.pcapng"
    );
    let plain = line("unanswered", "127.0.0.53:53");
    assert!(plain.get("evidence").is_none(), "{plain}");
    assert!(plain["examples"][0].get("evidence").is_none(), "{plain}");
}

fn findings_of(out: &[Event]) -> Vec<&FindingEvent> {
    out.iter()
        .filter_map(|e| match e {
            Event::Finding(f) => Some(f),
            _ => None,
        })
        .collect()
}

/// The agent's findings: doctor's traffic checks over each findings window, ranked, capped,
/// and reset when the window closes.
#[test]
fn findings_windows_fold_doctors_checks_and_reset() {
    let cfg = EventsConfig {
        findings_window_ns: 30 * S,
        max_lines_per_window: 2,
        ..EventsConfig::default()
    };
    let mut ev = Events::new(cfg, Clock::Epoch);
    let mut out = Vec::new();
    // A healthy window: many answered questions, one lost query (below the thresholds).
    for i in 0..50 {
        let t = crate::test_support::fixtures::service_transaction(
            &format!("ok{i}.lab.test."),
            "A",
            i,
            "NOERROR",
        );
        ev.observe(&t, S, &mut out);
    }
    ev.observe(&unanswered("10.96.0.10:53", 0), 2 * S, &mut out);
    ev.tick(31 * S, &mut out);
    assert!(findings_of(&out).is_empty(), "{:?}", kinds(&out));
    let (last, closed) = ev.findings_last();
    assert_eq!(closed, 1);
    assert!(last.iter().all(|(_, n)| *n == 0), "{last:?}");

    // A failing window: one server leaves 10 queries unanswered, two more 3 each.
    out.clear();
    for i in 0..10 {
        ev.observe(&unanswered("10.96.0.10:53", i), 40 * S, &mut out);
    }
    for server in ["10.96.0.11:53", "10.96.0.12:53"] {
        for i in 0..3 {
            ev.observe(&unanswered(server, i), 41 * S, &mut out);
        }
    }
    ev.tick(60 * S, &mut out);
    assert!(findings_of(&out).is_empty(), "the window ends at 61 s");
    ev.tick(61 * S, &mut out);
    let found = findings_of(&out);
    assert_eq!(found.len(), 2, "capped at 2 lines: {:?}", kinds(&out));
    let f = found[0];
    assert_eq!(f.finding.kind, FindingKind::UnansweredQueries);
    assert_eq!(
        (f.finding.subject.as_str(), f.finding.count),
        ("10.96.0.10:53", 10)
    );
    assert_eq!((f.window_start_ns, f.ts_ns), (31 * S, 61 * S));
    let held: Vec<u64> = out
        .iter()
        .filter_map(|e| match e {
            Event::Suppressed(s) if s.event == "finding" => Some(s.count),
            _ => None,
        })
        .collect();
    assert_eq!(held, [1]);
    let (last, closed) = ev.findings_last();
    assert_eq!(closed, 2);
    let unanswered_n = last
        .iter()
        .find(|(k, _)| *k == FindingKind::UnansweredQueries)
        .map(|(_, n)| *n);
    assert_eq!(unanswered_n, Some(3), "every finding counts, shown or not");
    let line = serde_json::to_value(Event::Finding(f.clone())).unwrap();
    assert_eq!(line["type"], "finding");
    assert_eq!(line["kind"], "unanswered_queries");
    assert_eq!(line["severity"], "warning");
    assert!(
        line["fix"].as_str().is_some_and(|s| !s.is_empty()),
        "{line}"
    );

    // The next window starts empty.
    out.clear();
    ev.tick(92 * S, &mut out);
    assert!(findings_of(&out).is_empty(), "{:?}", kinds(&out));
    assert!(ev.findings_last().0.iter().all(|(_, n)| *n == 0));
}
