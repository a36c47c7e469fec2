use std::{
    path::Path,
    process::Command,
    sync::{atomic::Ordering, mpsc},
};

use super::*;
use crate::event::ConntrackEvent;

const OWN: &str = "/proc/self/ns/net";

#[test]
fn schedule_samples_while_active_then_once_more_and_stops() {
    let t0 = Instant::now();
    let ms = Duration::from_millis;
    let mut s = StatsSchedule::new(ms(200), ms(2000));
    assert_eq!(s.next(), None, "idle from the start");
    assert!(!s.due(t0 + ms(10_000)));
    s.events(t0);
    assert!(s.due(t0), "a sample at once when it becomes active");
    s.sampled(t0);
    assert_eq!(s.next(), Some(t0 + ms(200)));
    // More events while active do not pull the next sample forward.
    s.events(t0 + ms(100));
    assert_eq!(s.next(), Some(t0 + ms(200)));
    s.sampled(t0 + ms(2000));
    assert_eq!(s.next(), Some(t0 + ms(2200)), "1.9 s since the last event");
    // The first sample after the window is the last.
    s.sampled(t0 + ms(2200));
    assert_eq!(s.next(), None);
    s.events(t0 + ms(5000));
    assert!(s.due(t0 + ms(5000)));
}

#[test]
fn schedule_without_an_interval_never_overflows() {
    let now = Instant::now();
    let mut s = StatsSchedule::new(Duration::MAX, Duration::from_secs(2));
    s.events(now);
    s.sampled(now);
    assert_eq!(s.next(), None);
}

/// A conntrack entry of ours (TEST-NET-1, no traffic) to port `dport`, deleted on drop.
struct TestEntry(String);

impl TestEntry {
    fn insert(dport: u16) -> Option<Self> {
        let port = dport.to_string();
        let args = [
            "-I",
            "-p",
            "udp",
            "-s",
            "192.0.2.1",
            "-d",
            "192.0.2.2",
            "--sport",
            "1000",
            "--dport",
            &port,
            "-t",
            "60",
        ];
        crate::test_support::tool("conntrack", &args).then(|| Self(port))
    }
}

impl Drop for TestEntry {
    fn drop(&mut self) {
        let _ = Command::new("conntrack")
            .args(["-D", "-p", "udp", "-s", "192.0.2.1", "--dport", &self.0])
            .output();
    }
}

fn options(ports: &[u16]) -> WatchOptions {
    WatchOptions {
        ports: ports.to_vec(),
        stats_interval: Some(Duration::from_millis(100)),
        active_window: Duration::from_millis(500),
        ..WatchOptions::default()
    }
}

fn samples(w: &ConntrackWatchers) -> u64 {
    w.counters().stats_samples.load(Ordering::Relaxed)
}

/// Events on `rx` until `done` holds or 5 s pass.
fn collect_until(
    rx: &mpsc::Receiver<SourceEvent>,
    seen: &mut Vec<SourceEvent>,
    done: impl Fn(&[SourceEvent]) -> bool,
) -> bool {
    let deadline = Instant::now() + Duration::from_secs(5);
    while !done(seen) && Instant::now() < deadline {
        if let Ok(e) = rx.recv_timeout(Duration::from_millis(50)) {
            seen.push(e);
        }
    }
    done(seen)
}

fn is_ours(e: &SourceEvent, change: CtChange, dport: u16) -> Option<ConntrackEvent> {
    match e {
        SourceEvent::Conntrack(c) if c.change == change && c.orig.dst.port() == dport => Some(*c),
        _ => None,
    }
}

#[test]
fn a_namespace_added_after_start_hands_out_its_dump_and_a_sample() {
    if !crate::test_support::root_or_skip("CAP_NET_ADMIN for ctnetlink") {
        return;
    }
    let Some(_entry) = TestEntry::insert(65002) else {
        return;
    };
    let (tx, rx) = mpsc::sync_channel(QUEUE);
    let w = ConntrackWatchers::start(options(&[65002]), tx).unwrap();
    std::thread::sleep(Duration::from_millis(100));
    assert!(
        rx.try_recv().is_err(),
        "nothing before a namespace is added"
    );
    assert_eq!(w.add(Path::new(OWN), 0x6502).unwrap(), Added::Watching);
    let mut seen = Vec::new();
    let got = collect_until(&rx, &mut seen, |s| {
        s.iter()
            .any(|e| is_ours(e, CtChange::Existing, 65002).is_some())
            && s.iter()
                .any(|e| matches!(e, SourceEvent::CtStats(c) if c.netns == 0x6502))
    });
    assert!(got, "no dump entry and sample in {seen:#?}");
    let entry = seen
        .iter()
        .find_map(|e| is_ours(e, CtChange::Existing, 65002))
        .unwrap();
    assert_eq!(entry.netns, 0x6502);
    let summary = w.stop();
    assert!(summary.error.is_none(), "{:?}", summary.error);
    assert_eq!(summary.counts.lost, 0);
}

#[test]
fn stop_wakes_a_blocked_loop_at_once() {
    if !crate::test_support::root_or_skip("CAP_NET_ADMIN for ctnetlink") {
        return;
    }
    let (tx, _rx) = mpsc::sync_channel(QUEUE);
    let w = ConntrackWatchers::start(options(&[7]), tx).unwrap();
    assert_eq!(w.add(Path::new(OWN), 7).unwrap(), Added::Watching);
    // Idle: the loop blocks in poll(2) with no timeout.
    std::thread::sleep(Duration::from_millis(300));
    let t = Instant::now();
    let summary = w.stop();
    let took = t.elapsed();
    assert!(took < Duration::from_millis(100), "stop took {took:?}");
    assert!(summary.error.is_none(), "{:?}", summary.error);
    // The first sample and the last, at the stop.
    assert_eq!(summary.stats_samples, 2);
}

#[test]
fn an_idle_namespace_is_not_sampled_and_a_busy_one_is_until_idle_again() {
    if !crate::test_support::root_or_skip("CAP_NET_ADMIN for ctnetlink") {
        return;
    }
    let (idle_tx, _idle_rx) = mpsc::sync_channel(QUEUE);
    let (busy_tx, busy_rx) = mpsc::sync_channel(QUEUE);
    let idle = ConntrackWatchers::start(options(&[7]), idle_tx).unwrap();
    let busy = ConntrackWatchers::start(options(&[65003]), busy_tx).unwrap();
    idle.add(Path::new(OWN), 1).unwrap();
    busy.add(Path::new(OWN), 2).unwrap();
    let mut seen = Vec::new();
    assert!(collect_until(&busy_rx, &mut seen, |s| !s.is_empty()));
    let Some(entry) = TestEntry::insert(65003) else {
        return;
    };
    assert!(collect_until(&busy_rx, &mut seen, |s| s
        .iter()
        .any(|e| is_ours(e, CtChange::New, 65003).is_some())));
    // Active for 0.5 s after the event, sampled every 0.1 s, then once more.
    std::thread::sleep(Duration::from_millis(1000));
    let (idle_n, busy_n) = (samples(&idle), samples(&busy));
    assert_eq!(
        idle_n, 1,
        "only the first sample of a namespace without events"
    );
    assert!(busy_n >= 5, "{busy_n} samples of the busy namespace");
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(samples(&busy), busy_n, "idle again after the window");
    assert_eq!(samples(&idle), 1);
    drop(entry);
    drop(busy_rx);
    drop((idle.stop(), busy.stop()));
}

#[test]
fn namespaces_past_the_cap_are_counted_not_watched() {
    if !crate::test_support::root_or_skip("CAP_NET_ADMIN for ctnetlink") {
        return;
    }
    let (tx, _rx) = mpsc::sync_channel(QUEUE);
    let w = ConntrackWatchers::start(
        WatchOptions {
            max_namespaces: 1,
            ..options(&[7])
        },
        tx,
    )
    .unwrap();
    let own = Path::new(OWN);
    assert_eq!(w.add(own, 1).unwrap(), Added::Watching);
    assert_eq!(w.add(own, 1).unwrap(), Added::AlreadyWatched);
    assert_eq!(w.add(own, 2).unwrap(), Added::Capped);
    assert_eq!(w.add(own, 3).unwrap(), Added::Capped);
    assert_eq!(w.counters().netns_capped.load(Ordering::Relaxed), 2);
    assert!(w.remove(1));
    assert!(!w.remove(1));
    assert_eq!(w.add(own, 2).unwrap(), Added::Watching);
    assert_eq!(w.namespaces().len(), 1);
    assert_eq!(w.stop().counts.netns_capped, 2);
}

const QUEUE: usize = 1024;
