//! Conntrack of the namespaces where DNAT happens, for joining hops across NAT: one watcher
//! thread each, feeding the run loop's channel.
use std::{
    sync::{atomic::AtomicBool, Arc},
    time::Duration,
};

use super::RunOptions;
use crate::{event::SourceEvent, kernel::netns};

/// One conntrack watcher thread per namespace where NAT is expected: ours, those named with
/// `--netns`, and with `--all-netns` every named one (`/run/netns`, where CNI plugins put pod
/// namespaces), at most [`MAX_CT_WATCHERS`]. Without conntrack: a warning, and hops across
/// NAT are joined by the fallback method.
pub(super) fn start(
    opts: &RunOptions,
    tx: &std::sync::mpsc::SyncSender<SourceEvent>,
    stop: &Arc<AtomicBool>,
    counters: &Arc<crate::conntrack::WatchCounters>,
) -> Vec<std::thread::JoinHandle<crate::conntrack::WatchSummary>> {
    const MAX_CT_WATCHERS: usize = 64;
    let mut namespaces = Vec::new();
    if let Ok(own) = netns::own_netns() {
        namespaces.push(own);
    }
    for n in netns::named_netns() {
        if namespaces.iter().any(|m| m.id == n.id) {
            continue;
        }
        if opts.attach.all_netns || opts.attach.netns.contains(&n.name) {
            namespaces.push(n);
        }
    }
    if namespaces.len() > MAX_CT_WATCHERS {
        log::warn!(
            "conntrack: watching {MAX_CT_WATCHERS} of {} namespaces",
            namespaces.len()
        );
        namespaces.truncate(MAX_CT_WATCHERS);
    }
    let mut handles = Vec::new();
    for ns in namespaces {
        let Ok(cookie) = netns::with_netns(&ns.path, netns::current_netns_cookie) else {
            continue;
        };
        // Statistics every 200 ms: a race drop is judged by the per-CPU counters sampled
        // on both sides of it.
        let watch = crate::conntrack::WatchOptions {
            ports: opts.capture.ports.clone(),
            stats_interval: Some(Duration::from_millis(200)),
            counters: Arc::clone(counters),
            ..Default::default()
        };
        match crate::conntrack::spawn_watch_with(
            ns.path.clone(),
            cookie,
            watch,
            tx.clone(),
            Arc::clone(stop),
        ) {
            Ok(h) => handles.push(h),
            Err(e) => log::warn!(
                "conntrack in {}: {e}; joining hops across NAT without it",
                ns.name
            ),
        }
    }
    handles
}
