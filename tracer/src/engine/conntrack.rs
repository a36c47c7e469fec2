//! Conntrack of the namespaces where DNAT happens, for joining hops across NAT: one watch
//! thread for all of them, feeding the run loop's channel.
use std::{sync::Arc, time::Duration};

use super::RunOptions;
use crate::{
    conntrack::{Added, ConntrackWatchers, WatchCounters, WatchOptions},
    event::SourceEvent,
    kernel::netns,
};

/// The conntrack watch thread, following the namespaces where NAT is expected: ours, those
/// named with `--netns`, and with `--all-netns` every named one (`/run/netns`, where CNI
/// plugins put pod namespaces), at most [`crate::conntrack::MAX_NAMESPACES`]. More are
/// added later through [`ConntrackWatchers::namespaces`]. Without conntrack: a warning, and
/// hops across NAT are joined by the fallback method.
pub(super) fn start(
    opts: &RunOptions,
    tx: &std::sync::mpsc::SyncSender<SourceEvent>,
    counters: &Arc<WatchCounters>,
) -> Option<ConntrackWatchers> {
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
    // Statistics every 200 ms while a namespace has DNS flows (see `StatsSchedule`): a race
    // drop is judged by the per-CPU counters sampled on both sides of it.
    let watch = WatchOptions {
        ports: opts.capture.ports.clone(),
        stats_interval: Some(Duration::from_millis(200)),
        counters: Arc::clone(counters),
        ..Default::default()
    };
    let watchers = match ConntrackWatchers::start(watch, tx.clone()) {
        Ok(w) => w,
        Err(e) => {
            log::warn!("conntrack: {e}; joining hops across NAT without it");
            return None;
        }
    };
    // Added on a thread of their own that ends when they are: each add dumps the table, a
    // walk of the kernel's conntrack hash shared by every namespace (~4 ms each even when
    // empty, 0.4 s for 110 namespaces), which the run loop need not wait for.
    let handle = watchers.namespaces();
    let add_all = move || {
        for ns in namespaces {
            let Ok(cookie) = netns::with_netns(&ns.path, netns::current_netns_cookie) else {
                continue;
            };
            match handle.add(&ns.path, cookie) {
                // Capped: counted and warned once by `add`.
                Ok(Added::Watching | Added::AlreadyWatched | Added::Capped) => {}
                Err(e) => log::warn!(
                    "conntrack in {}: {e}; joining hops across NAT without it",
                    ns.name
                ),
            }
        }
    };
    let adder = std::thread::Builder::new().name("conntrack-start".into());
    if let Err(e) = adder.spawn(add_all) {
        log::warn!("conntrack: starting the thread adding namespaces: {e}; none followed");
    }
    Some(watchers)
}
