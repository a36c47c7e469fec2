use std::{
    cell::RefCell,
    collections::HashMap,
    rc::Rc,
    sync::{Arc, RwLock},
};

use super::*;
use crate::{
    correlate::record::Outcome,
    kube::Pod,
    names::Names,
    output::sink::{Batch, PacketRecords, Sink, Wants},
    pipeline::tests::{packet, pipeline_naming},
};

const SECOND: u64 = 1_000_000_000;

/// What a sink was handed, batch by batch.
#[derive(Debug, Default, PartialEq)]
struct Seen {
    /// Per batch: its records as `packet POD` / `transaction OUTCOME`.
    batches: Vec<Vec<String>>,
    packets_allowed: Vec<Option<u64>>,
    held: u64,
}

/// Records what it is handed; answers [`Wants::packet_records`] as told.
struct Keeps(Rc<RefCell<Seen>>, PacketRecords);

impl Sink for Keeps {
    fn wants(&self) -> Wants {
        Wants {
            packet_records: self.1,
            ..Wants::default()
        }
    }
    fn batch(&mut self, batch: Batch<'_>) -> std::io::Result<()> {
        let mut seen = self.0.borrow_mut();
        let described = batch
            .records
            .iter()
            .map(|r| match r {
                Record::Packet(p) => format!(
                    "packet {}",
                    p.pod
                        .as_ref()
                        .and_then(|p| p.pod.clone())
                        .unwrap_or_else(|| "-".into())
                ),
                Record::Transaction(t) => format!("transaction {:?}", t.outcome),
                _ => "other".into(),
            })
            .collect();
        seen.batches.push(described);
        seen.packets_allowed.push(batch.packets_allowed);
        seen.held += batch.packet_records_held;
        Ok(())
    }
    fn finish(&mut self, _stats: &mut StatsRecord, _now_ns: u64) -> std::io::Result<()> {
        Ok(())
    }
}

/// A runner over a pipeline that names namespace 1 `client` (its interface 2 `eth0`), with
/// the pod `default/client` there when `pod` is set; and the sink's log.
fn runner(
    pod: bool,
    answer: PacketRecords,
    batch_at: usize,
) -> (Runner, Sinks<'static>, Rc<RefCell<Seen>>) {
    let mut names = Names::default();
    names.learn(1, "client", 2, "eth0");
    if pod {
        let p = Arc::new(Pod {
            uid: "u-1".into(),
            label: Some("default/client".into()),
            container: None,
            container_id: None,
        });
        names.set_pods(HashMap::from([(1, p)]), HashMap::new());
    }
    let names = Arc::new(RwLock::new(names));
    let seen = Rc::new(RefCell::new(Seen::default()));
    let mut sinks = Sinks::new();
    sinks.push(Box::new(Keeps(Rc::clone(&seen), answer)));
    let runner = Runner::new(pipeline_naming(Arc::clone(&names)), names, &sinks, batch_at);
    (runner, sinks, seen)
}

/// Each turn hands over what it decided, with the pods named; the end reports what is still
/// open (pending: its timeout had not passed).
#[test]
fn a_turn_hands_over_its_records_with_their_pods_and_the_end_what_is_open() {
    for (pod, named) in [(true, "default/client"), (false, "-")] {
        let (mut r, mut sinks, seen) = runner(pod, PacketRecords::Wanted, 0);
        let mut policy = StopPolicy::default();
        let mut events = vec![packet(SECOND, false)];
        r.turn(
            &mut events,
            Tick::At(SECOND),
            &mut sinks,
            &mut policy,
            SECOND,
        )
        .unwrap();
        assert!(events.is_empty());
        r.finish(0, &mut sinks, &mut policy).unwrap();
        let seen = seen.borrow();
        assert_eq!(
            seen.batches,
            [
                vec![format!("packet {named}")],
                vec![format!("transaction {:?}", Outcome::Pending)]
            ],
            "pod known: {pod}"
        );
    }
}

/// With `batch_at`, records wait until that many are decided; the end hands over the rest
/// with the open transactions.
#[test]
fn records_wait_for_a_batch_and_the_end_takes_the_rest() {
    let (mut r, mut sinks, seen) = runner(false, PacketRecords::Wanted, 3);
    let mut policy = StopPolicy::default();
    for (i, response) in [(1, false), (2, true), (3, false)] {
        let ts = i * SECOND;
        r.turn(
            &mut vec![packet(ts, response)],
            Tick::No,
            &mut sinks,
            &mut policy,
            ts,
        )
        .unwrap();
        let batches = seen.borrow().batches.len();
        assert_eq!(batches, usize::from(i == 3), "after packet {i}");
    }
    r.finish(0, &mut sinks, &mut policy).unwrap();
    let seen = seen.borrow();
    assert_eq!(seen.batches.len(), 2, "{seen:?}");
    assert_eq!(seen.batches[0].len(), 3, "{seen:?}");
    assert!(
        seen.batches[1].iter().all(|r| r.starts_with("transaction")),
        "{seen:?}"
    );
}

/// A sink that refuses packet records: none are made, the transactions are all the same,
/// and the next batch says how many were held back.
#[test]
fn packet_records_no_sink_wants_are_not_made_and_are_counted() {
    let (mut r, mut sinks, seen) = runner(false, PacketRecords::Refused, 0);
    let mut policy = StopPolicy::default();
    let mut events = vec![packet(SECOND, false), packet(SECOND + 1_000_000, true)];
    r.turn(
        &mut events,
        Tick::At(3 * SECOND),
        &mut sinks,
        &mut policy,
        0,
    )
    .unwrap();
    r.finish(0, &mut sinks, &mut policy).unwrap();
    let seen = seen.borrow();
    assert_eq!(seen.held, 2, "{seen:?}");
    let all: Vec<&String> = seen.batches.iter().flatten().collect();
    assert!(all.iter().all(|r| !r.starts_with("packet")), "{seen:?}");
    assert!(
        all.contains(&&format!("transaction {:?}", Outcome::Answered)),
        "{seen:?}"
    );

    // `--count` counts packet records: they are made whatever the sinks want.
    let (mut r, mut sinks, seen) = runner(false, PacketRecords::Refused, 0);
    let mut policy = StopPolicy::new(Some(1), false);
    let mut events = vec![packet(SECOND, false), packet(SECOND + 1_000_000, true)];
    r.turn(&mut events, Tick::No, &mut sinks, &mut policy, 0)
        .unwrap();
    let seen = seen.borrow();
    assert_eq!(seen.held, 0, "{seen:?}");
    assert_eq!(seen.batches[0], ["packet -", "packet -"], "{seen:?}");
    assert_eq!(seen.packets_allowed, [Some(1)], "{seen:?}");
    assert_eq!(policy.stop(), Some("count"));
}
