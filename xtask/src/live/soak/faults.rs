//! The faults and when they come: a schedule scaled to the run, and the pod namespaces
//! churned all run long.
use std::{
    process::{Command, Stdio},
    sync::atomic::{AtomicBool, AtomicU64, Ordering},
    thread,
    time::Duration,
};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Fault {
    LoopStart,
    LoopStop,
    Race,
    CtFull,
    CtRestore,
    Stop,
    ReceiverKill,
    ReceiverStart,
    Kill,
}

pub(super) fn schedule(total_s: u64) -> Vec<(u64, Fault)> {
    let at = |f: f64| (total_s as f64 * f) as u64;
    let mut s = Vec::new();
    // A loop every 5 minutes (at least two), 20 s each.
    let loops = (total_s / 300).max(2);
    for k in 0..loops {
        let t = at(0.12) + k * (at(0.88) - at(0.12)) / loops;
        s.push((t, Fault::LoopStart));
        s.push((t + 20, Fault::LoopStop));
    }
    s.extend([
        (at(0.25), Fault::Race),
        (at(0.72), Fault::Race),
        (at(0.33), Fault::CtFull),
        (at(0.33) + 15, Fault::CtRestore),
        (at(0.42), Fault::Stop),
        (at(0.84), Fault::Stop),
        (at(0.28), Fault::ReceiverKill),
        (at(0.28) + 30, Fault::ReceiverStart),
        (at(0.6), Fault::Kill),
    ]);
    s.sort_by_key(|(t, _)| *t);
    s
}

/// Pod namespaces with a veth into the node, created and deleted several times a second
/// until `stop`; returns how many were made.
pub(super) fn churn(prefix: &str, node: &str, stop: &AtomicBool, made: &AtomicU64) {
    let mut i: u64 = 0;
    while !stop.load(Ordering::Relaxed) {
        let ns = format!("{prefix}-churn{}", i % 4);
        let host = format!("{prefix}c{}", i % 4);
        let run = |args: &[&str]| {
            Command::new("ip")
                .args(args)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .map(|s| s.success())
                .unwrap_or(false)
        };
        let _ = run(&["netns", "del", &ns]);
        if run(&["netns", "add", &ns])
            && run(&[
                "-n", node, "link", "add", &host, "type", "veth", "peer", "name", "eth0", "netns",
                &ns,
            ])
        {
            let _ = run(&["-n", node, "link", "set", &host, "up"]);
            let _ = run(&["-n", &ns, "link", "set", "eth0", "up"]);
            made.fetch_add(1, Ordering::Relaxed);
        }
        i += 1;
        thread::sleep(Duration::from_millis(200));
    }
    for k in 0..4 {
        let _ = Command::new("ip")
            .args(["netns", "del", &format!("{prefix}-churn{k}")])
            .stderr(Stdio::null())
            .status();
    }
}
