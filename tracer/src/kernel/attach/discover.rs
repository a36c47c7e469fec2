//! Which namespaces there are and which interfaces each has, followed from kernel events
//! rather than by polling:
//!
//! - each known namespace has a link subscription ([`LinkSubscription`]) opened inside it
//!   once; its interfaces are listed again (over that socket, without entering it) only when
//!   the socket says something changed;
//! - inotify on `/run/netns` and `/var/run/netns` (where `ip netns add` and the CNI runtimes
//!   bind-mount namespaces) and, with `--all-netns`, a new or removed interface in the own
//!   namespace (the node-side veth of a pod appears with its namespace) start a *discovery
//!   pass*: the namespaces are listed, new ones opened, unreachable ones forgotten;
//! - a pass every [`SAFETY_RESCAN`] catches namespaces that only processes hold (no bind
//!   mount, no veth into the own namespace).
//!
//! The thread blocks in `poll(2)` over all of these and a wake fd ([`Waker`]) in between.
//! Nothing here attaches programs: [`Discovery`] reports what it found ([`Found`]) and the
//! attacher acts on it, so this part is tested without eBPF.
use std::{
    collections::{HashMap, HashSet},
    os::fd::{AsFd, BorrowedFd},
    path::PathBuf,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

use nix::{
    poll::{PollFd, PollFlags},
    sys::{
        eventfd::{EfdFlags, EventFd},
        inotify::{AddWatchFlags, InitFlags, Inotify, WatchDescriptor},
    },
};

use super::{
    super::{
        netns::{self, Link, LinkSubscription, NetnsId, NetnsRef},
        KernelError,
    },
    AttachSpec,
};

/// A full discovery pass this often whatever the events say: the safety net for namespaces
/// that only processes hold (no bind mount under `/run/netns`, no veth into the own
/// namespace), for namespaces whose subscription could not be opened, and for directories
/// to watch that did not exist yet. Between passes an idle node costs no system call.
pub const SAFETY_RESCAN: Duration = Duration::from_secs(10);

/// `ip netns add` creates the file (IN_CREATE) and bind-mounts the namespace on it a few
/// milliseconds later; a mount makes no inotify event, so a new file is looked at again
/// this often until it is a namespace ...
const CREATED_RETRY: Duration = Duration::from_millis(10);
/// ... for at most this long.
const CREATED_WAIT: Duration = Duration::from_secs(2);
/// New files waiting to become namespaces; beyond that a pass is made at once instead.
const MAX_CREATED: usize = 256;
/// Most namespaces with a subscription of their own, and the share of the open-files limit
/// (`RLIMIT_NOFILE`) they may take (maps and conntrack sockets need fds too). The others are listed
/// at each [`SAFETY_RESCAN`], and counted in [`Discovery::unsubscribed`].
const MAX_SUBSCRIPTIONS: u64 = 8192;
const SUBSCRIPTIONS_OF_NOFILE: u64 = 4;

/// The directories `ip netns` and the CNI runtimes bind-mount namespaces under (the same one
/// where `/var/run` links to `/run`: inotify then gives the same watch).
const NETNS_DIRS: [&str; 2] = ["/run/netns", "/var/run/netns"];

/// What a turn or a pass found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Found {
    /// A namespace not known before, now in [`Discovery::get`].
    Appeared(NetnsId),
    /// A known namespace whose interfaces changed.
    Relinked(NetnsId),
    /// A namespace no process or bind mount holds any more: its subscription is closed.
    Vanished { id: NetnsId, cookie: u64 },
}

/// One known namespace.
pub struct Watched {
    /// The path it was last found at (a `/proc/PID` one changes when that process exits).
    pub ns: NetnsRef,
    pub cookie: u64,
    pub links: Vec<Link>,
    /// `None` past the subscription limit or when opening it failed: listed at each
    /// [`SAFETY_RESCAN`] instead.
    sub: Option<LinkSubscription>,
    /// Notifications arrived while listing: list again.
    stale: bool,
}

/// What one [`Discovery::turn`] found.
#[derive(Debug, Default)]
pub struct Turn {
    pub found: Vec<Found>,
    /// The turn made the [`SAFETY_RESCAN`] pass.
    pub full: bool,
}

/// Wakes a thread blocked in [`Discovery::turn`] (to stop it).
#[derive(Clone)]
pub struct Waker(Arc<EventFd>);

impl Waker {
    pub fn wake(&self) {
        if let Err(e) = self.0.write(1) {
            log::debug!("waking the attacher: {e}");
        }
    }
}

pub struct Discovery {
    all_netns: bool,
    named: Vec<String>,
    netns_unreadable: Arc<AtomicU64>,
    unreadable_reported: bool,
    known: HashMap<NetnsId, Watched>,
    /// The own namespace: its interfaces appearing start a pass with `all_netns`.
    own: Option<NetnsId>,
    /// nsfs's device: a path whose device is this is a namespace.
    nsfs_dev: Option<u64>,
    inotify: Option<Inotify>,
    dirs: HashMap<WatchDescriptor, PathBuf>,
    /// Files created under a namespace directory, not yet namespaces, and since when.
    created: Vec<(PathBuf, Instant)>,
    wake: Arc<EventFd>,
    next_full: Instant,
    max_subscriptions: u64,
    subscriptions: u64,
    /// Namespaces listed at the safety rescan only, over the run (see [`MAX_SUBSCRIPTIONS`]).
    pub unsubscribed: u64,
}

impl Discovery {
    pub fn new(spec: &AttachSpec) -> Result<Self, KernelError> {
        let wake = EventFd::from_flags(EfdFlags::EFD_NONBLOCK | EfdFlags::EFD_CLOEXEC)
            .map_err(|e| KernelError::Netns(format!("eventfd: {e}")))?;
        let inotify = if spec.all_netns || !spec.netns.is_empty() {
            match Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC) {
                Ok(i) => Some(i),
                Err(e) => {
                    log::warn!(
                        "inotify: {e}; new namespaces are found every {} s only",
                        SAFETY_RESCAN.as_secs()
                    );
                    None
                }
            }
        } else {
            None
        };
        let nofile = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
            .map_or(1024, |(soft, _)| soft);
        let mut d = Self {
            all_netns: spec.all_netns,
            named: spec.netns.clone(),
            netns_unreadable: Arc::clone(&spec.netns_unreadable),
            unreadable_reported: false,
            known: HashMap::new(),
            own: None,
            nsfs_dev: None,
            inotify,
            dirs: HashMap::new(),
            created: Vec::new(),
            wake: Arc::new(wake),
            next_full: Instant::now() + SAFETY_RESCAN,
            max_subscriptions: MAX_SUBSCRIPTIONS.min(nofile / SUBSCRIPTIONS_OF_NOFILE),
            subscriptions: 0,
            unsubscribed: 0,
        };
        d.watch_dirs();
        Ok(d)
    }

    pub fn waker(&self) -> Waker {
        Waker(Arc::clone(&self.wake))
    }

    pub fn get(&self, id: NetnsId) -> Option<&Watched> {
        self.known.get(&id)
    }

    pub fn namespaces(&self) -> impl Iterator<Item = &Watched> {
        self.known.values()
    }

    /// Watches the namespace directories that exist and are not watched yet.
    fn watch_dirs(&mut self) {
        let Some(inotify) = &self.inotify else { return };
        let mask = AddWatchFlags::IN_CREATE
            | AddWatchFlags::IN_DELETE
            | AddWatchFlags::IN_MOVED_TO
            | AddWatchFlags::IN_MOVED_FROM
            | AddWatchFlags::IN_ONLYDIR;
        for dir in NETNS_DIRS {
            let dir = crate::host::path(dir);
            if !dir.is_dir() {
                continue;
            }
            match inotify.add_watch(&dir, mask) {
                Ok(wd) => {
                    self.dirs.entry(wd).or_insert(dir);
                }
                Err(e) => log::debug!("inotify on {}: {e}", dir.display()),
            }
        }
    }

    /// The namespaces to watch: the own one first, then every other (`all_netns`) or the
    /// named ones. `strict` (the first pass) fails on a named namespace that is missing.
    fn list(&mut self, strict: bool) -> Result<Vec<NetnsRef>, KernelError> {
        if self.all_netns {
            let all = netns::all_netns()?;
            self.netns_unreadable
                .store(all.unreadable, Ordering::Relaxed);
            if all.unreadable > 0 && !self.unreadable_reported {
                self.unreadable_reported = true;
                eprintln!("dnspath: {}", super::unreadable_message(all.unreadable));
            }
            return Ok(all.namespaces);
        }
        let mut out = vec![netns::own_netns()?];
        if !self.named.is_empty() {
            let named = netns::named_netns();
            for want in &self.named {
                match named.iter().find(|n| &n.name == want) {
                    Some(n) if n.id != out[0].id => out.push(n.clone()),
                    Some(_) => {}
                    None if strict => {
                        return Err(KernelError::Netns(format!(
                            "no network namespace named {want} under /run/netns"
                        )));
                    }
                    None => {}
                }
            }
        }
        Ok(out)
    }

    /// A discovery pass: lists the namespaces, opens the new ones (entering each once) and
    /// forgets those no longer listed. Known namespaces are not entered nor listed again.
    /// An own namespace that cannot be opened is an error; any other is skipped (it went
    /// away meanwhile).
    pub fn pass(&mut self, strict: bool) -> Result<Vec<Found>, KernelError> {
        let listed = self.list(strict)?;
        let mut found = Vec::new();
        let ids: HashSet<NetnsId> = listed.iter().map(|n| n.id).collect();
        let gone: Vec<NetnsId> = self
            .known
            .keys()
            .filter(|id| !ids.contains(id))
            .copied()
            .collect();
        for id in gone {
            if let Some(w) = self.known.remove(&id) {
                if w.sub.is_some() {
                    self.subscriptions -= 1;
                }
                found.push(Found::Vanished {
                    id,
                    cookie: w.cookie,
                });
            }
        }
        for ns in listed {
            if let Some(w) = self.known.get_mut(&ns.id) {
                w.ns.path = ns.path;
                continue;
            }
            if ns.is_own {
                self.own = Some(ns.id);
                self.nsfs_dev = Some(ns.id.dev);
            }
            match self.open(&ns) {
                Ok(w) => {
                    found.push(Found::Appeared(ns.id));
                    self.known.insert(ns.id, w);
                }
                Err(e) if !ns.is_own => log::debug!("skipping netns {}: {e}", ns.name),
                Err(e) => return Err(e),
            }
        }
        Ok(found)
    }

    /// Enters `ns` once: its cookie, a subscription to its link changes, its links.
    fn open(&mut self, ns: &NetnsRef) -> Result<Watched, KernelError> {
        let subscribe = self.subscriptions < self.max_subscriptions;
        let (cookie, sub, links, stale) = netns::with_netns_id(&ns.path, ns.id, || {
            let cookie = netns::current_netns_cookie()?;
            let sub = if subscribe {
                LinkSubscription::open()
                    .map_err(|e| log::debug!("netns {}: {e}", ns.name))
                    .ok()
            } else {
                None
            };
            let (links, stale, sub) = match sub {
                Some(mut sub) => {
                    let (links, stale) = sub.list()?;
                    (links, stale, Some(sub))
                }
                None => (netns::list_links()?, false, None),
            };
            Ok((cookie, sub, links, stale))
        })?;
        if sub.is_some() {
            self.subscriptions += 1;
        } else {
            self.unsubscribed += 1;
        }
        Ok(Watched {
            ns: ns.clone(),
            cookie,
            links,
            sub,
            stale,
        })
    }

    /// Blocks until something happens (or `max_wait`, or the safety rescan is due), and
    /// reports what changed.
    pub fn turn(&mut self, max_wait: Duration) -> Result<Turn, KernelError> {
        let now = Instant::now();
        let mut wait = self.next_full.saturating_duration_since(now).min(max_wait);
        if !self.created.is_empty() {
            wait = wait.min(CREATED_RETRY);
        }
        if self.known.values().any(|w| w.stale) {
            wait = Duration::ZERO;
        }
        let (woken, inotify_ready, ready) = self.poll(wait)?;
        if woken {
            // Cleared; the caller looks at its stop flag.
            let _ = self.wake.read();
        }
        let mut need_pass = false;
        if inotify_ready {
            need_pass |= self.read_inotify();
        }
        need_pass |= self.check_created();
        let mut turn = Turn::default();
        let now = Instant::now();
        if now >= self.next_full {
            self.next_full = now + SAFETY_RESCAN;
            turn.full = true;
            need_pass = true;
            self.watch_dirs();
        }
        let mut dirty: Vec<NetnsId> = Vec::new();
        for (id, w) in &mut self.known {
            let notified = ready.contains(id) && w.sub.as_ref().is_some_and(|s| s.drain());
            if notified || w.stale || (turn.full && w.sub.is_none()) {
                dirty.push(*id);
            }
        }
        for id in dirty {
            match self.relist(id) {
                Ok(Some(indexes_changed)) => {
                    turn.found.push(Found::Relinked(id));
                    // A pod's namespace comes with the node-side end of its veth.
                    need_pass |= self.all_netns && indexes_changed && Some(id) == self.own;
                }
                Ok(None) => {}
                Err(e) => {
                    log::debug!("listing the links of a netns: {e}");
                    need_pass = true;
                }
            }
        }
        if need_pass {
            let found = self.pass(false)?;
            // A relisted namespace that has just vanished is only reported as vanished.
            turn.found.retain(|f| match f {
                Found::Relinked(id) => self.known.contains_key(id),
                _ => true,
            });
            turn.found.extend(found);
        }
        Ok(turn)
    }

    /// poll(2) over the wake fd, inotify and every subscription: whether the wake fd and
    /// inotify are readable, and which namespaces' subscriptions are.
    fn poll(&self, wait: Duration) -> Result<(bool, bool, HashSet<NetnsId>), KernelError> {
        let mut ids: Vec<NetnsId> = Vec::with_capacity(self.known.len());
        let mut fds: Vec<PollFd<'_>> = Vec::with_capacity(self.known.len() + 2);
        fds.push(PollFd::new(self.wake.as_fd(), PollFlags::POLLIN));
        if let Some(i) = &self.inotify {
            fds.push(PollFd::new(i.as_fd(), PollFlags::POLLIN));
        }
        let first_sub = fds.len();
        for (id, w) in &self.known {
            if let Some(s) = &w.sub {
                let fd: BorrowedFd<'_> = s.as_fd();
                fds.push(PollFd::new(fd, PollFlags::POLLIN));
                ids.push(*id);
            }
        }
        // Rounded up, so that a timer due in 0.3 ms does not spin.
        let ms = wait.as_micros().div_ceil(1000).min(i32::MAX as u128) as i32;
        let timeout = nix::poll::PollTimeout::try_from(ms).unwrap_or(nix::poll::PollTimeout::MAX);
        match nix::poll::poll(&mut fds, timeout) {
            Ok(_) => {}
            Err(nix::errno::Errno::EINTR) => return Ok((false, false, HashSet::new())),
            Err(e) => return Err(KernelError::Netns(format!("poll: {e}"))),
        }
        let readable = |f: &PollFd<'_>| f.revents().is_some_and(|r| !r.is_empty());
        let woken = readable(&fds[0]);
        let inotify_ready = self.inotify.is_some() && readable(&fds[1]);
        let ready = fds[first_sub..]
            .iter()
            .zip(ids)
            .filter(|(f, _)| readable(f))
            .map(|(_, id)| id)
            .collect();
        Ok((woken, inotify_ready, ready))
    }

    /// Reads inotify's queue: true if a pass is needed now (something was removed, or the
    /// queue overflowed); new files wait in `created` until they are namespaces.
    fn read_inotify(&mut self) -> bool {
        let Some(inotify) = &self.inotify else {
            return false;
        };
        let mut need_pass = false;
        loop {
            let events = match inotify.read_events() {
                Ok(ev) if !ev.is_empty() => ev,
                Ok(_) | Err(nix::errno::Errno::EAGAIN) => break,
                Err(e) => {
                    log::debug!("inotify: {e}");
                    need_pass = true;
                    break;
                }
            };
            for ev in events {
                if ev.mask.contains(AddWatchFlags::IN_Q_OVERFLOW) {
                    need_pass = true;
                } else if ev.mask.contains(AddWatchFlags::IN_IGNORED) {
                    // The directory went away (or was unmounted): watched again once back.
                    self.dirs.remove(&ev.wd);
                    need_pass = true;
                } else if ev
                    .mask
                    .intersects(AddWatchFlags::IN_DELETE | AddWatchFlags::IN_MOVED_FROM)
                {
                    need_pass = true;
                } else if let Some(name) = ev.name {
                    if self.created.len() >= MAX_CREATED {
                        need_pass = true;
                        continue;
                    }
                    if let Some(dir) = self.dirs.get(&ev.wd) {
                        self.created.push((dir.join(name), Instant::now()));
                    }
                }
            }
        }
        need_pass
    }

    /// Looks at the files waiting to become namespaces: true if one has.
    fn check_created(&mut self) -> bool {
        let Some(nsfs) = self.nsfs_dev else {
            self.created.clear();
            return false;
        };
        let mut ready = false;
        self.created
            .retain(|(path, since)| match netns::id_of(path) {
                Some(id) if id.dev == nsfs => {
                    ready = true;
                    false
                }
                Some(_) => since.elapsed() < CREATED_WAIT,
                None => false,
            });
        ready
    }

    /// Lists a known namespace's links again: `Some(indexes_changed)` when they changed.
    fn relist(&mut self, id: NetnsId) -> Result<Option<bool>, KernelError> {
        let Some(w) = self.known.get_mut(&id) else {
            return Ok(None);
        };
        let links = match &mut w.sub {
            Some(sub) => {
                let (links, stale) = sub.list()?;
                w.stale = stale;
                links
            }
            None => netns::with_netns_id(&w.ns.path, id, netns::list_links)?,
        };
        if links == w.links {
            return Ok(None);
        }
        let indexes = |l: &[Link]| l.iter().map(|l| l.index).collect::<HashSet<_>>();
        let indexes_changed = indexes(&links) != indexes(&w.links);
        w.links = links;
        Ok(Some(indexes_changed))
    }
}

#[cfg(test)]
mod tests;
