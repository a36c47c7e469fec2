//! Every watched namespace's conntrack on one thread: the event sockets of all of them and
//! a wake socket in one `poll(2)`, which has no timeout unless a namespace's statistics are
//! due. Namespaces are added and removed from other threads through [`CtNamespaces`].
use std::{
    collections::{HashSet, VecDeque},
    os::unix::net::UnixDatagram,
    path::Path,
    sync::{
        atomic::{AtomicBool, Ordering},
        mpsc::SyncSender,
        Arc, Mutex, MutexGuard,
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};

use super::{
    stats::StatsSource,
    watch::{hand_over, ConntrackWatcher, WatchCounters, WatchOptions, WatchSummary},
    ConntrackError,
};
use crate::{
    event::{CtChange, SourceEvent},
    kernel::netns::with_netns,
};

/// When a namespace's conntrack statistics are sampled.
///
/// The race verdict (`detect/race.rs`) reads the per-CPU counters of the drop's namespace
/// from the last sample at or before the drop to the first after it, and holds a drop for
/// at most `counters_wait_ns` (2 s) waiting for that later sample. A race needs two DNS
/// queries of one socket in that namespace's table, and the one that wins is confirmed:
/// a NEW event on the watched ports, next to the drop in time. So a namespace is sampled:
/// - once when it is added: the "before" of a drop that comes while it is idle;
/// - once when it becomes **active**, that is hands out a NEW or DESTROY event on the
///   watched ports (dump entries do not count);
/// - every [`WatchOptions::stats_interval`] while active, which it stays for
///   [`WatchOptions::active_window`] (2 s, the race's wait) after its last such event;
/// - once when it goes idle (the first due sample after the window), and once at the stop.
///
/// A drop within the window after an event therefore has a sample on each side, the later
/// within one interval, as with sampling all the time; a drop of an idle namespace is
/// bracketed by its last sample and the one its winner's event triggers. An idle namespace
/// costs no wake-up at all.
#[derive(Clone, Debug)]
pub(super) struct StatsSchedule {
    interval: Duration,
    window: Duration,
    last_event: Option<Instant>,
    /// The next sample, while active.
    next: Option<Instant>,
}

impl StatsSchedule {
    pub(super) fn new(interval: Duration, window: Duration) -> Self {
        Self {
            interval,
            window,
            last_event: None,
            next: None,
        }
    }

    /// Events on the watched ports were handed out at `now`: active, and if it was idle, a
    /// sample is due at once.
    pub(super) fn events(&mut self, now: Instant) {
        self.last_event = Some(now);
        if self.next.is_none() {
            self.next = Some(now);
        }
    }

    pub(super) fn due(&self, now: Instant) -> bool {
        self.next.is_some_and(|t| now >= t)
    }

    /// When the next sample is due; `None` while idle.
    pub(super) fn next(&self) -> Option<Instant> {
        self.next
    }

    /// A due sample was taken at `now`: the next one, or idle once the window is over.
    pub(super) fn sampled(&mut self, now: Instant) {
        let active = self
            .last_event
            .is_some_and(|t| now.saturating_duration_since(t) < self.window);
        self.next = active.then(|| now.checked_add(self.interval)).flatten();
    }
}

/// What [`CtNamespaces::add`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Added {
    Watching,
    /// That cookie is watched already.
    AlreadyWatched,
    /// [`WatchOptions::max_namespaces`] are watched: counted in `netns_capped`, warned once.
    Capped,
}

/// One namespace on the watch thread.
struct Watched {
    watcher: ConntrackWatcher,
    /// `None`: statistics not wanted, or not readable there.
    stats: Option<StatsSource>,
    schedule: StatsSchedule,
}

enum Request {
    Add(Box<Watched>),
    Remove(u64),
}

struct Shared {
    opts: WatchOptions,
    /// Cookies watched or being opened: the cap and duplicates are checked here.
    cookies: Mutex<HashSet<u64>>,
    /// At most one Add per cookie and one Remove per cookie: bounded by twice the cap.
    requests: Mutex<VecDeque<Request>>,
    stop: AtomicBool,
    /// Written to wake the thread (a request or the stop); it reads `wake_rx`.
    wake_tx: UnixDatagram,
    wake_rx: UnixDatagram,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Shared {
    fn wake(&self) {
        // A full socket already holds a wake-up.
        let _ = self.wake_tx.send(&[1]);
    }

    fn request(&self, r: Request) {
        lock(&self.requests).push_back(r);
        self.wake();
    }
}

/// Adds and removes watched namespaces from any thread (the interface attacher, as pod
/// namespaces come and go).
#[derive(Clone)]
pub struct CtNamespaces {
    shared: Arc<Shared>,
}

impl CtNamespaces {
    /// Watches the namespace at `netns_path` (cookie `cookie`): its sockets are opened and
    /// its table dumped on the calling thread, inside the namespace (`with_netns`); the
    /// watch thread then hands out the dump and follows the events.
    pub fn add(&self, netns_path: &Path, cookie: u64) -> Result<Added, ConntrackError> {
        let opts = &self.shared.opts;
        {
            let mut cookies = lock(&self.shared.cookies);
            if cookies.contains(&cookie) {
                return Ok(Added::AlreadyWatched);
            }
            if cookies.len() >= opts.max_namespaces {
                if opts.counters.netns_capped.fetch_add(1, Ordering::Relaxed) == 0 {
                    log::warn!(
                        "conntrack: watching {} namespaces, the most it follows; netns \
                         {cookie:#x} and any more are not (counted in netns_capped): hops \
                         across their NAT are joined by the fallback method",
                        opts.max_namespaces
                    );
                }
                return Ok(Added::Capped);
            }
            cookies.insert(cookie);
        }
        let opened = with_netns(netns_path, || Ok(Self::open(cookie, opts)));
        let watched = match opened {
            Ok(Ok(w)) => w,
            Ok(Err(e)) => return Err(self.forget(cookie, e)),
            Err(e) => return Err(self.forget(cookie, e.into())),
        };
        self.shared.request(Request::Add(Box::new(watched)));
        Ok(Added::Watching)
    }

    fn open(cookie: u64, opts: &WatchOptions) -> Result<Watched, ConntrackError> {
        let mut watcher = ConntrackWatcher::open_with(cookie, opts)?;
        let stats = match opts.stats_interval {
            None => None,
            Some(_) => match StatsSource::open(watcher.dump_socket()) {
                Ok(s) => Some(s),
                Err(e) => {
                    log::warn!("conntrack statistics of netns {cookie:#x}: {e}; not sampling them");
                    None
                }
            },
        };
        Ok(Watched {
            watcher,
            stats,
            schedule: StatsSchedule::new(
                opts.stats_interval.unwrap_or(Duration::MAX),
                opts.active_window,
            ),
        })
    }

    fn forget(&self, cookie: u64, e: ConntrackError) -> ConntrackError {
        lock(&self.shared.cookies).remove(&cookie);
        e
    }

    /// Stops watching the namespace of `cookie` (its sockets are closed); `false` if it was
    /// not watched.
    pub fn remove(&self, cookie: u64) -> bool {
        if !lock(&self.shared.cookies).remove(&cookie) {
            return false;
        }
        self.shared.request(Request::Remove(cookie));
        true
    }

    /// Namespaces watched (or being opened).
    pub fn len(&self) -> usize {
        lock(&self.shared.cookies).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The conntrack watch thread: every namespace added through [`ConntrackWatchers::add`] (or
/// a [`CtNamespaces`] handle), sending UDP/TCP entries on [`WatchOptions::ports`] and
/// statistics samples to `tx` until stopped or `tx`'s receiver is gone: a namespace's
/// statistics when it is added, every [`WatchOptions::stats_interval`] while it has events
/// on those ports (and for [`WatchOptions::active_window`] after), and at the stop
/// (`StatsSchedule` says why that is enough for the race verdict). Dropping it stops the
/// thread without waiting for it.
pub struct ConntrackWatchers {
    namespaces: CtNamespaces,
    thread: Option<JoinHandle<WatchSummary>>,
}

impl ConntrackWatchers {
    /// Starts the thread, watching no namespace yet.
    pub fn start(opts: WatchOptions, tx: SyncSender<SourceEvent>) -> Result<Self, ConntrackError> {
        let (wake_tx, wake_rx) = UnixDatagram::pair().map_err(ConntrackError::Thread)?;
        wake_tx
            .set_nonblocking(true)
            .and_then(|()| wake_rx.set_nonblocking(true))
            .map_err(ConntrackError::Thread)?;
        let shared = Arc::new(Shared {
            opts,
            cookies: Mutex::default(),
            requests: Mutex::default(),
            stop: AtomicBool::new(false),
            wake_tx,
            wake_rx,
        });
        let thread_shared = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name("conntrack".into())
            .spawn(move || {
                let error = run(&thread_shared, &tx).err();
                WatchSummary::new(&thread_shared.opts.counters, error)
            })
            .map_err(ConntrackError::Thread)?;
        Ok(Self {
            namespaces: CtNamespaces { shared },
            thread: Some(thread),
        })
    }

    /// A handle to add and remove namespaces from other threads.
    pub fn namespaces(&self) -> CtNamespaces {
        self.namespaces.clone()
    }

    /// See [`CtNamespaces::add`].
    pub fn add(&self, netns_path: &Path, cookie: u64) -> Result<Added, ConntrackError> {
        self.namespaces.add(netns_path, cookie)
    }

    /// See [`CtNamespaces::remove`].
    pub fn remove(&self, cookie: u64) -> bool {
        self.namespaces.remove(cookie)
    }

    pub fn counters(&self) -> &Arc<WatchCounters> {
        &self.namespaces.shared.opts.counters
    }

    /// Wakes the thread, which takes a last statistics sample of each namespace, and waits
    /// for it.
    pub fn stop(mut self) -> WatchSummary {
        let shared = &self.namespaces.shared;
        shared.stop.store(true, Ordering::Relaxed);
        shared.wake();
        match self.thread.take().map(JoinHandle::join) {
            Some(Ok(summary)) => summary,
            _ => WatchSummary::new(
                &shared.opts.counters,
                Some(ConntrackError::Thread(std::io::Error::other(
                    "the conntrack watch thread panicked",
                ))),
            ),
        }
    }
}

impl Drop for ConntrackWatchers {
    fn drop(&mut self) {
        let shared = &self.namespaces.shared;
        shared.stop.store(true, Ordering::Relaxed);
        shared.wake();
    }
}

/// Least time between two reads of the event sockets while events keep coming (see `run`).
const GATHER: Duration = Duration::from_millis(5);

/// The watch thread's loop; `Ok` at the stop or when the receiver is gone.
fn run(shared: &Shared, tx: &SyncSender<SourceEvent>) -> Result<(), ConntrackError> {
    let counters = &shared.opts.counters;
    let mut watched: Vec<Watched> = Vec::new();
    let mut batch: Vec<SourceEvent> = Vec::new();
    let mut ready: Vec<bool> = Vec::new();
    let mut last_read = Instant::now();
    loop {
        // Requests first: a namespace added hands out its dump and a first sample.
        let requests: Vec<Request> = lock(&shared.requests).drain(..).collect();
        let added = requests.iter().any(|r| matches!(r, Request::Add(_)));
        for r in requests {
            match r {
                Request::Add(w) => {
                    let mut w = *w;
                    let netns = w.watcher.netns();
                    if let Err(e) = take_events(&mut w, &mut batch) {
                        fail(shared, &w, &e);
                        continue;
                    }
                    sample(&mut w, counters, &mut batch);
                    if !hand_over(&mut batch, tx, counters, netns) {
                        return Ok(());
                    }
                    watched.push(w);
                }
                Request::Remove(cookie) => watched.retain(|w| w.watcher.netns() != cookie),
            }
        }
        if added {
            // A namespace's first dump allocates its socket's buffer and parses the table,
            // then frees them: handed back now, not kept resident by an idle thread (110
            // namespaces at start-up).
            crate::memory::release_freed();
        }
        if shared.stop.load(Ordering::Relaxed) {
            break;
        }

        let now = Instant::now();
        let timeout = match watched.iter().filter_map(|w| w.schedule.next()).min() {
            // Rounded up: a timeout of 0 ms before the due time would spin.
            Some(at) => {
                let ms = at.saturating_duration_since(now).as_micros().div_ceil(1000);
                PollTimeout::try_from(ms).unwrap_or(PollTimeout::MAX)
            }
            None => PollTimeout::NONE,
        };
        let woken = {
            let mut fds = Vec::with_capacity(watched.len() + 1);
            fds.push(PollFd::new(
                std::os::fd::AsFd::as_fd(&shared.wake_rx),
                PollFlags::POLLIN,
            ));
            fds.extend(
                watched
                    .iter()
                    .map(|w| PollFd::new(w.watcher.event_socket().as_fd(), PollFlags::POLLIN)),
            );
            match poll(&mut fds, timeout) {
                Ok(_) | Err(nix::errno::Errno::EINTR) => {}
                Err(e) => {
                    return Err(ConntrackError::Socket {
                        op: "poll",
                        source: std::io::Error::from(e),
                    })
                }
            }
            let is_ready = |f: &PollFd<'_>| f.revents().is_some_and(|r| !r.is_empty());
            ready.clear();
            ready.extend(fds.iter().skip(1).map(is_ready));
            fds.first().is_some_and(is_ready)
        };
        if woken {
            let mut buf = [0u8; 64];
            while shared.wake_rx.recv(&mut buf).is_ok() {}
        }

        // Under a busy DNS forwarder (a new flow a query) events come a few a millisecond:
        // each waking the thread cost more than reading it. A wake within GATHER of the
        // last read waits out the rest of it, so that one read takes what came meanwhile;
        // an event is handed over at most GATHER late, well inside the correlator's
        // reorder window (60 ms), and an idle or quiet table is read at once.
        if ready.iter().any(|r| *r) {
            let since = last_read.elapsed();
            if since < GATHER {
                std::thread::sleep(GATHER - since);
            }
            last_read = Instant::now();
        }
        let mut failed = Vec::new();
        for (w, _) in watched.iter_mut().zip(&ready).filter(|(_, r)| **r) {
            let netns = w.watcher.netns();
            let result = take_events(w, &mut batch);
            if !hand_over(&mut batch, tx, counters, netns) {
                return Ok(());
            }
            if let Err(e) = result {
                fail(shared, w, &e);
                failed.push(netns);
            }
        }
        watched.retain(|w| !failed.contains(&w.watcher.netns()));

        let now = Instant::now();
        for w in watched.iter_mut().filter(|w| w.schedule.due(now)) {
            sample(w, counters, &mut batch);
            w.schedule.sampled(now);
            if !hand_over(&mut batch, tx, counters, w.watcher.netns()) {
                return Ok(());
            }
        }
    }
    for w in &mut watched {
        sample(w, counters, &mut batch);
        if !hand_over(&mut batch, tx, counters, w.watcher.netns()) {
            break;
        }
    }
    Ok(())
}

/// Appends what `w`'s sockets hold to `batch` (the dump first, after an add), and marks it
/// active if that holds events on the watched ports ([`StatsSchedule`]).
fn take_events(w: &mut Watched, batch: &mut Vec<SourceEvent>) -> Result<(), ConntrackError> {
    let start = batch.len();
    let result = w.watcher.next_events(batch, Duration::ZERO);
    let active = batch
        .get(start..)
        .unwrap_or_default()
        .iter()
        .any(|e| matches!(e, SourceEvent::Conntrack(c) if c.change != CtChange::Existing));
    if active && w.stats.is_some() {
        w.schedule.events(Instant::now());
    }
    result.map(drop)
}

/// Appends a statistics sample of `w` to `batch`; a namespace whose statistics fail is
/// warned about and not sampled again.
fn sample(w: &mut Watched, counters: &WatchCounters, batch: &mut Vec<SourceEvent>) {
    let Some(stats) = w.stats.as_mut() else {
        return;
    };
    let netns = w.watcher.netns();
    match stats.sample(w.watcher.dump_socket(), netns) {
        Ok(s) => {
            WatchCounters::add(&counters.stats_samples, 1);
            batch.push(SourceEvent::CtStats(s));
        }
        Err(e) => {
            log::warn!("conntrack statistics of netns {netns:#x}: {e}; not sampling them");
            w.stats = None;
        }
    }
}

/// A namespace whose watcher failed is no longer watched (it may be added again).
fn fail(shared: &Shared, w: &Watched, e: &ConntrackError) {
    let netns = w.watcher.netns();
    log::warn!("conntrack of netns {netns:#x}: {e}; no longer watched");
    lock(&shared.cookies).remove(&netns);
}

#[cfg(test)]
#[path = "watchers_tests.rs"]
mod tests;
