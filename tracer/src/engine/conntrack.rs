//! Conntrack of the namespaces where DNAT happens, for joining hops across NAT: one watch
//! thread for all of them, feeding the run loop's channel.
use std::{
    sync::{
        mpsc::{Receiver, SyncSender},
        Arc,
    },
    time::Duration,
};

use super::RunOptions;
use crate::{
    conntrack::{Added, ConntrackWatchers, WatchCounters, WatchOptions},
    event::SourceEvent,
    kernel::attach::NsChange,
};

/// Namespace changes queued from the attacher to the thread that adds them to conntrack:
/// as many as the attacher follows namespaces (its subscription cap), so none is lost.
pub(super) const NS_CHANGES: usize = 8192;

/// The conntrack watch thread, following every namespace the attacher follows: ours, those
/// named with `--netns`, and with `--all-netns` every one (pod namespaces, named or held by
/// processes), at most [`crate::conntrack::MAX_NAMESPACES`]; each added when the attacher
/// reports it (`changes`, from start-up on) and removed when it goes. An idle namespace costs
/// the watch thread nothing (see `StatsSchedule`). Each namespace gone is also told to `gone`
/// (the run loop forgets the ports it taught). Without conntrack: a warning, and hops
/// across NAT are joined by the fallback method.
pub(super) fn start(
    opts: &RunOptions,
    tx: &std::sync::mpsc::SyncSender<SourceEvent>,
    counters: &Arc<WatchCounters>,
    changes: Receiver<NsChange>,
    gone: SyncSender<u64>,
) -> Option<ConntrackWatchers> {
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
    // Added on a thread of their own, which ends with the attacher (its sender): each add
    // dumps the table, a walk of the kernel's conntrack hash shared by every namespace (~4 ms
    // each even when empty, 0.4 s for 110 namespaces), which neither the run loop nor the
    // attacher need wait for.
    let handle = watchers.namespaces();
    let follow = move || {
        for change in changes {
            match change {
                NsChange::Appeared { path, cookie } => match handle.add(&path, cookie) {
                    // Capped: counted and warned once by `add`.
                    Ok(Added::Watching | Added::AlreadyWatched | Added::Capped) => {}
                    Err(e) => log::warn!(
                        "conntrack in {}: {e}; joining hops across NAT there without it",
                        path.display()
                    ),
                },
                NsChange::Gone { cookie } => {
                    handle.remove(cookie);
                    // As many as `changes` holds: full only if the run loop is gone.
                    let _ = gone.try_send(cookie);
                }
            }
        }
    };
    let adder = std::thread::Builder::new().name("conntrack-netns".into());
    if let Err(e) = adder.spawn(follow) {
        log::warn!("conntrack: starting the thread adding namespaces: {e}; none followed");
    }
    Some(watchers)
}
