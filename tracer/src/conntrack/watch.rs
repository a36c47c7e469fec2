//! Following a namespace's conntrack table: a dump of what exists, then the kernel's
//! NEW and DESTROY events (no UPDATEs: they repeat a NEW's tuples), resynchronised with a
//! new dump whenever events were lost.
use std::{
    sync::{
        atomic::{AtomicU64, Ordering},
        mpsc::{SyncSender, TrySendError},
        Arc,
    },
    time::Duration,
};

use super::{
    boottime_ns,
    filter::event_filter,
    message::{decode_datagram, table_dump_request, CtEntry, CtMessage},
    socket::{CtSocket, Received},
    ConntrackError,
};
use crate::event::{ConntrackEvent, CtChange, SourceEvent};

/// `enum nfnetlink_groups` (nfnetlink_compat.h / nfnetlink.h).
const NFNLGRP_CONNTRACK_NEW: u32 = 1;
const NFNLGRP_CONNTRACK_DESTROY: u32 = 3;
/// Datagrams taken per [`ConntrackWatcher::next_events`] call, so a busy table cannot keep
/// a caller from its stop or from the other namespaces.
const MAX_DATAGRAMS_PER_CALL: usize = 4096;
/// Entries one dump hands out; the rest are counted in `dump_cut` and `lost`. A node's table
/// can hold millions of entries: a whole dump was held twice over in memory (43 MB in the
/// soak, heaptrack) and went to the run loop in one piece. As many as the run loop's queue
/// takes ([`QUEUE_EVENTS`]): 7.6 MB of events at most.
pub const MAX_DUMP_ENTRIES: usize = 32_768;
/// Events queued from the watch thread to the run loop ([`super::ConntrackWatchers`]'
/// channel); when
/// it is full an event is dropped and counted in `queue_full` and `lost`, never waited for
/// (a watcher that waits overruns its socket and dumps again). 32,768 events of 232 bytes:
/// 7.6 MB at most, ~0.8 s of a node's conntrack events at 20k DNS queries/s; unbounded, it
/// held 16 MB in the soak and had no limit.
pub const QUEUE_EVENTS: usize = 32_768;
/// Namespaces one watch thread follows: well above a node's pods (110 by default, a few
/// hundred at most). Each costs two sockets and, with its 4 MiB receive buffer, kernel
/// memory only while events queue.
pub const MAX_NAMESPACES: usize = 1024;

/// Which entries are reported: UDP and TCP flows with one of `ports` as source or
/// destination port of the original or reply tuple. No ports: every UDP/TCP flow.
///
/// On the event socket the kernel drops the other ports' events first (see
/// `conntrack/filter.rs`); this check stays behind it for dumps, which are not filtered, for
/// the protocol (the kernel filter looks at ports only), and for namespaces where the
/// filter could not be attached.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PortFilter {
    ports: Vec<u16>,
}

impl PortFilter {
    pub fn new(ports: &[u16]) -> Self {
        let mut ports = ports.to_vec();
        ports.sort_unstable();
        ports.dedup();
        Self { ports }
    }

    pub fn matches(&self, e: &CtEntry) -> bool {
        // CtEntry only holds UDP/TCP flows (others are CtMessage::OtherProtocol).
        self.ports.is_empty()
            || [e.orig.src, e.orig.dst, e.reply.src, e.reply.dst]
                .iter()
                .any(|a| self.ports.binary_search(&a.port()).is_ok())
    }
}

/// Live counters of a watcher; shared with whoever reports them.
#[derive(Debug, Default)]
pub struct WatchCounters {
    /// Conntrack events delivered, dump entries included.
    pub events: AtomicU64,
    /// Of those, `Existing` entries from dumps (the first and every resync).
    pub existing: AtomicU64,
    /// Events known lost: a lower bound, since an overrun drops an unknown number (≥ 1).
    pub lost: AtomicU64,
    /// ENOBUFS: the socket's receive buffer overflowed.
    pub overruns: AtomicU64,
    /// Dumps taken after an overrun.
    pub resyncs: AtomicU64,
    /// Messages that did not parse or did not fit the buffer (also counted in `lost`).
    pub malformed: AtomicU64,
    /// Entries of other protocols or ports dropped here, after they were read and parsed.
    /// Events of other ports mostly never reach us: the kernel filter of the event socket
    /// drops them uncounted (`conntrack/filter.rs`), and with it ICMP's. What is left: dump
    /// entries (dumps are not filtered), events of other protocols with a watched port (SCTP,
    /// GRE keys), and every event of a namespace without the kernel filter
    /// ([`WatchCounters::kernel_unfiltered`]).
    pub filtered: AtomicU64,
    /// Namespaces whose event socket has no kernel filter though ports were given: too many
    /// ports for one program, or SO_ATTACH_FILTER refused it (warned once). Their events are
    /// all read, and those of other ports dropped here (`filtered`).
    pub kernel_unfiltered: AtomicU64,
    /// Statistics samples delivered.
    pub stats_samples: AtomicU64,
    /// Dump entries beyond [`WatchOptions::max_dump`] (also counted in `lost`).
    pub dump_cut: AtomicU64,
    /// Events dropped because the run loop's queue ([`QUEUE_EVENTS`]) was full (also in
    /// `lost`).
    pub queue_full: AtomicU64,
    /// Namespaces not watched because [`WatchOptions::max_namespaces`] were.
    pub netns_capped: AtomicU64,
}

impl WatchCounters {
    pub(super) fn add(c: &AtomicU64, n: u64) {
        c.fetch_add(n, Ordering::Relaxed);
    }

    /// The counters now, for the `stats` records and the metrics (one set may be shared by
    /// every watcher of a run: they only add).
    pub fn snapshot(&self) -> ConntrackStats {
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        ConntrackStats {
            events: get(&self.events),
            existing: get(&self.existing),
            lost: get(&self.lost),
            overruns: get(&self.overruns),
            resyncs: get(&self.resyncs),
            malformed: get(&self.malformed),
            dump_cut: get(&self.dump_cut),
            queue_full: get(&self.queue_full),
            netns_capped: get(&self.netns_capped),
            kernel_unfiltered: get(&self.kernel_unfiltered),
            // The attacher's count, not the watchers': the live run fills it in.
            netns_changes_lost: 0,
        }
    }
}

/// The conntrack watchers' counters in a `stats` record (live, with transactions; see
/// [`WatchCounters`] for each): what was read, and what was lost and why. `lost` is
/// `overruns + malformed + dump_cut + queue_full`, a lower bound (an overrun drops an
/// unknown number of events, counted once). The last three count namespaces, not events.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct ConntrackStats {
    pub events: u64,
    pub existing: u64,
    pub lost: u64,
    pub overruns: u64,
    pub resyncs: u64,
    pub malformed: u64,
    pub dump_cut: u64,
    pub queue_full: u64,
    pub netns_capped: u64,
    /// Namespaces' appearances and departures the attacher could not hand the watchers
    /// (`kernel::attach::AttachSpec::netns_changes_lost`): an appearance lost is a
    /// namespace whose conntrack is not followed.
    pub netns_changes_lost: u64,
    /// See [`WatchCounters::kernel_unfiltered`]: a cost, not a loss.
    pub kernel_unfiltered: u64,
}

/// How a watcher runs.
#[derive(Clone, Debug)]
pub struct WatchOptions {
    /// See [`PortFilter`]; default 53.
    pub ports: Vec<u16>,
    /// Interval of a namespace's [`SourceEvent::CtStats`] samples from
    /// [`super::ConntrackWatchers`] while it is active (see [`WatchOptions::active_window`]);
    /// `None` for none. Default 1 s.
    pub stats_interval: Option<Duration>,
    /// How long a namespace stays active (sampled) after it last handed out an event on
    /// `ports`: at least how long the race detector waits for the counters after a drop
    /// (`CorrelateConfig::counters_wait_ns`). Default 2 s.
    pub active_window: Duration,
    /// Namespaces watched at once; more are counted in `netns_capped`. Default
    /// [`MAX_NAMESPACES`].
    pub max_namespaces: usize,
    /// Receive buffer of the event socket, bytes. Default 4 MiB.
    pub rcvbuf: usize,
    /// Entries one dump hands out. Default [`MAX_DUMP_ENTRIES`].
    pub max_dump: usize,
    /// Whether the kernel drops events of other ports before they are read (a socket filter,
    /// `conntrack/filter.rs`); default true. Off, every event is read and parsed, and those
    /// of other ports dropped here: only to compare the two.
    pub kernel_filter: bool,
    pub counters: Arc<WatchCounters>,
}

impl Default for WatchOptions {
    fn default() -> Self {
        Self {
            ports: vec![53],
            stats_interval: Some(Duration::from_secs(1)),
            active_window: Duration::from_secs(2),
            max_namespaces: MAX_NAMESPACES,
            rcvbuf: 4 << 20,
            max_dump: MAX_DUMP_ENTRIES,
            kernel_filter: true,
            counters: Arc::default(),
        }
    }
}

/// What the watch thread did, returned when it ends.
#[derive(Debug, Default)]
pub struct WatchSummary {
    /// Its counters (shared with whoever else holds [`WatchOptions::counters`]).
    pub counts: ConntrackStats,
    pub filtered: u64,
    pub stats_samples: u64,
    /// Why the thread ended early, if it did (a namespace that fails is warned about and
    /// no longer watched; the others go on).
    pub error: Option<ConntrackError>,
}

impl WatchSummary {
    pub(super) fn new(c: &WatchCounters, error: Option<ConntrackError>) -> Self {
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        Self {
            counts: c.snapshot(),
            filtered: get(&c.filtered),
            stats_samples: get(&c.stats_samples),
            error,
        }
    }
}

/// Conntrack events of the network namespace the opening thread was in.
///
/// Two sockets: one subscribed to NFNLGRP_CONNTRACK_NEW and _DESTROY, one for dumps, so
/// dump replies and events never interleave. The event socket subscribes before the first
/// dump, so nothing falls between them; an entry created meanwhile may be reported twice
/// (Existing and New). The event socket gets its kernel filter before it subscribes.
pub struct ConntrackWatcher {
    events: CtSocket,
    /// The event socket has the kernel filter of the ports.
    kernel_filter: bool,
    dump: CtSocket,
    netns: u64,
    ports: PortFilter,
    counters: Arc<WatchCounters>,
    /// Dump entries not yet handed out.
    pending: Vec<SourceEvent>,
    /// A resync dump is owed (the last one failed).
    resync: bool,
    /// [`WatchOptions::max_dump`].
    max_dump: usize,
}

impl ConntrackWatcher {
    /// Opens the sockets in the calling thread's current namespace, whose cookie is
    /// `netns_cookie`, and dumps the table; the first [`ConntrackWatcher::next_events`]
    /// returns the dump.
    pub fn open(netns_cookie: u64, ports: &[u16]) -> Result<Self, ConntrackError> {
        Self::open_with(
            netns_cookie,
            &WatchOptions {
                ports: ports.to_vec(),
                ..WatchOptions::default()
            },
        )
    }

    pub fn open_with(netns_cookie: u64, opts: &WatchOptions) -> Result<Self, ConntrackError> {
        let events = CtSocket::open()?;
        events.set_rcvbuf(opts.rcvbuf);
        let kernel_filter = opts.kernel_filter && attach_port_filter(&events, opts, netns_cookie);
        // No UPDATE group: an update (a flow's first reply, then ASSURED) repeats the tuples
        // its NEW gave, and the correlator learns nothing from it; a DNS forwarder's every
        // query is a new flow (a random source port), so updates were a third of the events
        // (a NEW missed in an overrun is made up by the resync dump).
        for group in [NFNLGRP_CONNTRACK_NEW, NFNLGRP_CONNTRACK_DESTROY] {
            events.subscribe(group)?;
        }
        let mut w = Self {
            events,
            kernel_filter,
            dump: CtSocket::open()?,
            netns: netns_cookie,
            ports: PortFilter::new(&opts.ports),
            counters: opts.counters.clone(),
            pending: Vec::new(),
            resync: false,
            max_dump: opts.max_dump,
        };
        let mut first = Vec::new();
        w.dump_table(&mut first)?;
        w.pending = first;
        Ok(w)
    }

    pub(super) fn event_socket(&self) -> &CtSocket {
        &self.events
    }

    pub(super) fn dump_socket(&mut self) -> &mut CtSocket {
        &mut self.dump
    }

    pub fn netns(&self) -> u64 {
        self.netns
    }

    /// Whether the kernel drops the other ports' events before they are read.
    pub fn kernel_filter(&self) -> bool {
        self.kernel_filter
    }

    pub fn counters(&self) -> &Arc<WatchCounters> {
        &self.counters
    }

    /// Events known lost so far (a lower bound; see [`WatchCounters::lost`]).
    pub fn lost(&self) -> u64 {
        self.counters.lost.load(Ordering::Relaxed)
    }

    /// Appends the next events to `out`, waiting at most `timeout` for the first; returns how
    /// many were appended. After a socket overrun the table is dumped again and its entries
    /// appended as `Existing`.
    pub fn next_events(
        &mut self,
        out: &mut Vec<SourceEvent>,
        timeout: Duration,
    ) -> Result<usize, ConntrackError> {
        let start = out.len();
        if !self.pending.is_empty() {
            out.append(&mut self.pending);
            return Ok(out.len() - start);
        }
        if self.resync {
            self.dump_table(out)?;
            self.resync = false;
            return Ok(out.len() - start);
        }
        if !self.events.wait_readable(timeout)? {
            return Ok(0);
        }
        for _ in 0..MAX_DATAGRAMS_PER_CALL {
            match self.events.recv_nonblocking()? {
                Received::Empty => break,
                Received::Datagram(n) => {
                    let ts_ns = boottime_ns();
                    for m in decode_datagram(self.events.data(n)) {
                        match m {
                            Ok((_, msg)) => self.push(msg, ts_ns, out),
                            Err(e) => {
                                log::debug!("conntrack event: {e}");
                                WatchCounters::add(&self.counters.malformed, 1);
                                WatchCounters::add(&self.counters.lost, 1);
                            }
                        }
                    }
                }
                Received::Truncated(n) => {
                    log::debug!("conntrack event datagram of {n} bytes truncated");
                    WatchCounters::add(&self.counters.malformed, 1);
                    WatchCounters::add(&self.counters.lost, 1);
                }
                Received::Overrun => {
                    WatchCounters::add(&self.counters.overruns, 1);
                    WatchCounters::add(&self.counters.lost, 1);
                    self.resync = true;
                }
            }
        }
        if self.resync {
            WatchCounters::add(&self.counters.resyncs, 1);
            self.dump_table(out)?;
            self.resync = false;
        }
        Ok(out.len() - start)
    }

    fn push(&self, msg: CtMessage, ts_ns: u64, out: &mut Vec<SourceEvent>) {
        push_entry(&self.ports, &self.counters, self.netns, msg, ts_ns, out);
    }

    /// IPCTNL_MSG_CT_GET dump of the whole table (every family and zone), as `Existing`: at
    /// most [`WatchOptions::max_dump`] of the entries on the watched ports.
    fn dump_table(&mut self, out: &mut Vec<SourceEvent>) -> Result<(), ConntrackError> {
        self.resync = true;
        let ts_ns = boottime_ns();
        let (ports, counters, netns) = (&self.ports, &self.counters, self.netns);
        let room = out.len().saturating_add(self.max_dump);
        let malformed = self
            .dump
            .dump("IPCTNL_MSG_CT_GET", table_dump_request, |m| {
                if out.len() < room {
                    push_entry(ports, counters, netns, m, ts_ns, out);
                } else if matches!(&m, CtMessage::Entry { entry, .. } if ports.matches(entry)) {
                    WatchCounters::add(&counters.dump_cut, 1);
                    WatchCounters::add(&counters.lost, 1);
                }
            })?;
        WatchCounters::add(&self.counters.malformed, malformed);
        WatchCounters::add(&self.counters.lost, malformed);
        self.resync = false;
        Ok(())
    }
}

/// Attaches the kernel filter of [`WatchOptions::ports`] to `events`; whether it is attached.
/// No ports: no filter, every event wanted. A filter that cannot be built or attached is
/// counted in [`WatchCounters::kernel_unfiltered`] and warned about once: the watcher reads
/// every event then, as it did before there was a filter.
fn attach_port_filter(events: &CtSocket, opts: &WatchOptions, netns: u64) -> bool {
    let attached = match event_filter(&opts.ports) {
        Ok(None) => return false,
        Ok(Some(prog)) => events
            .attach_filter(&prog)
            .map(|()| prog.len())
            .map_err(|e| e.to_string()),
        Err(e) => Err(e.to_string()),
    };
    match attached {
        Ok(insns) => {
            log::debug!(
                "conntrack of netns {netns:#x}: kernel filter of {insns} instructions for \
                 ports {:?}",
                opts.ports
            );
            true
        }
        Err(e) => {
            if opts
                .counters
                .kernel_unfiltered
                .fetch_add(1, Ordering::Relaxed)
                == 0
            {
                log::warn!(
                    "conntrack of netns {netns:#x}: no kernel filter of the ports ({e}); \
                     every conntrack event is read and the other ports' dropped here \
                     (counted in kernel_unfiltered)"
                );
            } else {
                log::debug!("conntrack of netns {netns:#x}: no kernel filter of the ports: {e}");
            }
            false
        }
    }
}

fn push_entry(
    ports: &PortFilter,
    counters: &WatchCounters,
    netns: u64,
    msg: CtMessage,
    ts_ns: u64,
    out: &mut Vec<SourceEvent>,
) {
    match msg {
        CtMessage::Entry { change, entry } if ports.matches(&entry) => {
            WatchCounters::add(&counters.events, 1);
            if change == CtChange::Existing {
                WatchCounters::add(&counters.existing, 1);
            }
            out.push(SourceEvent::Conntrack(ConntrackEvent {
                ts_ns,
                netns,
                change,
                status: entry.status,
                zone: entry.zone,
                orig: entry.orig,
                reply: entry.reply,
            }));
        }
        CtMessage::Entry { .. } | CtMessage::OtherProtocol => {
            WatchCounters::add(&counters.filtered, 1);
        }
        _ => {}
    }
}

/// Sends `batch` to the run loop, dropping (and counting) what a full queue cannot take;
/// `false` once the receiver is gone.
pub(super) fn hand_over(
    batch: &mut Vec<SourceEvent>,
    tx: &SyncSender<SourceEvent>,
    counters: &WatchCounters,
    netns: u64,
) -> bool {
    for ev in batch.drain(..) {
        match tx.try_send(ev) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) => {
                if counters.queue_full.fetch_add(1, Ordering::Relaxed) == 0 {
                    log::warn!(
                        "conntrack of netns {netns:#x}: the run loop's queue is full \
                         ({QUEUE_EVENTS} events); events dropped and counted"
                    );
                }
                WatchCounters::add(&counters.lost, 1);
            }
            Err(TrySendError::Disconnected(_)) => return false,
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::fixtures::ct_flow;

    fn entry(orig: (&str, &str), reply: (&str, &str)) -> CtEntry {
        let f = |(s, d)| ct_flow(tracer_common::proto::IPPROTO_UDP, s, d);
        CtEntry {
            status: 0,
            zone: 0,
            orig: f(orig),
            reply: f(reply),
        }
    }

    #[test]
    fn port_filter_looks_at_both_tuples() {
        let dns = PortFilter::new(&[53]);
        let to_cluster_ip = entry(
            ("10.244.1.2:40005", "10.96.0.10:53"),
            ("10.244.1.3:53", "10.244.1.2:40005"),
        );
        assert!(dns.matches(&to_cluster_ip));
        // A DNAT from port 5353 to 53: only the reply tuple says 53.
        let remapped = entry(
            ("10.244.1.2:40005", "10.96.0.10:5353"),
            ("10.244.1.3:53", "10.244.1.2:40005"),
        );
        assert!(dns.matches(&remapped));
        let web = entry(
            ("10.244.1.2:40005", "10.96.0.1:443"),
            ("10.244.1.9:8443", "10.244.1.2:40005"),
        );
        assert!(!dns.matches(&web));
        assert!(PortFilter::new(&[]).matches(&web));
        assert!(PortFilter::new(&[8443, 53, 53]).matches(&web));
    }

    #[test]
    fn watcher_sees_own_namespace_dump() {
        if !crate::test_support::root_or_skip("CAP_NET_ADMIN for ctnetlink") {
            return;
        }
        let mut w = ConntrackWatcher::open(0, &[]).unwrap();
        let mut out = Vec::new();
        w.next_events(&mut out, Duration::from_millis(10)).unwrap();
        // Entries the watchers' tests make meanwhile (TEST-NET-1) may come as events.
        let theirs = |c: &ConntrackEvent| c.orig.src.ip().to_string() == "192.0.2.1";
        assert!(out.iter().all(|e| matches!(e,
            SourceEvent::Conntrack(c) if c.change == CtChange::Existing || theirs(c))));
        assert_eq!(w.lost(), 0);
    }

    #[test]
    fn a_full_queue_drops_and_counts_and_a_gone_receiver_ends_the_watch() {
        let counters = WatchCounters::default();
        let (tx, rx) = std::sync::mpsc::sync_channel(2);
        let e = entry(
            ("10.0.0.1:1000", "10.96.0.10:53"),
            ("10.244.1.3:53", "10.0.0.1:1000"),
        );
        let mut batch: Vec<SourceEvent> = (0..5)
            .map(|i| {
                SourceEvent::Conntrack(ConntrackEvent {
                    ts_ns: i,
                    netns: 1,
                    change: CtChange::New,
                    status: e.status,
                    zone: e.zone,
                    orig: e.orig,
                    reply: e.reply,
                })
            })
            .collect();
        assert!(hand_over(&mut batch, &tx, &counters, 1));
        assert!(batch.is_empty());
        assert_eq!(rx.try_iter().count(), 2);
        assert_eq!(counters.queue_full.load(Ordering::Relaxed), 3);
        assert_eq!(counters.lost.load(Ordering::Relaxed), 3);
        drop(rx);
        batch.push(SourceEvent::Conntrack(ConntrackEvent {
            ts_ns: 9,
            netns: 1,
            change: CtChange::New,
            status: 0,
            zone: 0,
            orig: e.orig,
            reply: e.reply,
        }));
        assert!(!hand_over(&mut batch, &tx, &counters, 1));
    }
}
