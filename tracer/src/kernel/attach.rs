//! Keeps the TC programs attached to every watched interface: an initial scan, then whatever
//! [`discover`] reports (namespaces appearing and vanishing, interfaces changing), on one
//! thread that blocks in between.
use std::{
    collections::{HashMap, HashSet},
    path::PathBuf,
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        mpsc::{SyncSender, TrySendError},
        Arc, Mutex,
    },
    thread,
    time::{Duration, Instant},
};

use super::{
    netns::{self, Link, NetnsId},
    KernelError, Probes, TcLinks,
};
use crate::kube::{
    resolver::{NsKey, PodResolver},
    Pod,
};
pub use crate::names::{place, Names, SharedNames};

pub mod discover;
use discover::{Discovery, Found, Waker};

/// After a change, pods are looked up again this often ...
const POD_FOLLOW_UP: Duration = Duration::from_millis(500);
/// ... this many times: a new namespace has no process yet, and a container's first process
/// enters its cgroup a moment after it starts (`runc init`, see `kube::resolver`); kubelet's
/// log directory, which names the pod, may come later still (read every `LOGS_EVERY`).
const POD_FOLLOW_UPS: u8 = 6;

/// A namespace appearing or going away, for whoever follows them (a conntrack watcher per
/// namespace, say) through [`AttachSpec::ns_changes`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NsChange {
    /// A namespace found (at start-up too), with a path it can be entered by while it lives.
    Appeared { path: PathBuf, cookie: u64 },
    /// No process or bind mount holds it any more.
    Gone { cookie: u64 },
}

/// Which interfaces to watch.
#[derive(Clone, Debug, Default)]
pub struct AttachSpec {
    /// Interfaces of the tracer's own namespace; empty = all of them.
    pub interfaces: Vec<String>,
    /// Also every other namespace: named ones and those of running processes.
    pub all_netns: bool,
    /// Named namespaces (`ip netns`) to watch in addition to the own one.
    pub netns: Vec<String>,
    /// Written by the scans, for whoever holds a clone (the agent's metrics): processes
    /// whose namespace the latest `all_netns` scan was refused (see
    /// [`netns::AllNetns::unreadable`]).
    pub netns_unreadable: Arc<AtomicU64>,
    /// Told of every namespace appearing and going away; a full channel loses the change
    /// (counted in [`AttachSpec::netns_changes_lost`]), it never blocks the attacher.
    pub ns_changes: Option<SyncSender<NsChange>>,
    /// Written by the attacher, for whoever holds a clone (the live run's `stats`):
    /// changes [`AttachSpec::ns_changes`] had no room for.
    pub netns_changes_lost: Arc<AtomicU64>,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct AttachKey {
    netns: NetnsId,
    ifindex: u32,
    ifname: String,
}

struct Attached {
    cookie: u64,
    links: TcLinks,
    /// The namespace, to enter for detaching: clsact filters are removed over netlink in
    /// the namespace of their interface.
    netns: NetnsId,
    /// Where it was when attached, for when discovery no longer knows it.
    netns_path: PathBuf,
}

/// The one line that says some namespaces cannot be traced, and why.
fn unreadable_message(n: u64) -> String {
    let has_ptrace = super::effective_capabilities()
        .is_some_and(|eff| eff & (1u64 << super::CAP_SYS_PTRACE) != 0);
    let why = if has_ptrace {
        "refused despite CAP_SYS_PTRACE (a security module or user namespace)"
    } else {
        "dnspath lacks CAP_SYS_PTRACE"
    };
    format!(
        "cannot read the network namespace of {n} process(es) (/proc/PID/ns/net: permission denied): {why}; pods in those namespaces are not traced (counted in dnspath_netns_unreadable_processes)"
    )
}

/// Attach state, one per tracer run.
pub struct Attacher {
    probes: Arc<Mutex<Probes>>,
    spec: AttachSpec,
    names: SharedNames,
    attached: HashMap<AttachKey, Attached>,
    /// Interfaces we failed to attach to, so each failure is reported once.
    failed: HashSet<AttachKey>,
    /// Causes of attach failures already warned about (the error with the interface name
    /// taken out): a cause is warned once, however many interfaces it hits.
    causes: HashSet<String>,
    /// Interfaces that could not be attached to, over the run.
    pub failures: u64,
    /// The first failure, for the error of a run that attached nowhere.
    first_failure: Option<String>,
    pub warnings: Vec<String>,
    pods: PodResolver,
    /// Cookie and links of pod namespaces this run does not attach to (entered once each,
    /// to find the node-side ends of their veths).
    pod_links: HashMap<NsKey, (u64, Vec<Link>)>,
    discovery: Discovery,
}

/// A namespace's interfaces to attach to.
struct Plan {
    id: NetnsId,
    ns: netns::NetnsRef,
    cookie: u64,
    to_attach: Vec<(AttachKey, Link)>,
}

/// Each interface's links or error; `Err` when the namespace could not be entered.
type PlanResults = Result<Vec<(AttachKey, Result<TcLinks, KernelError>)>, KernelError>;

/// One namespace as a scan found it.
struct Scanned {
    id: NetnsId,
    is_own: bool,
    cookie: u64,
    links: Vec<Link>,
}

impl Attacher {
    pub fn new(
        probes: Arc<Mutex<Probes>>,
        spec: AttachSpec,
        names: SharedNames,
    ) -> Result<Self, KernelError> {
        let discovery = Discovery::new(&spec)?;
        Ok(Self {
            probes,
            spec,
            names,
            attached: HashMap::new(),
            failed: HashSet::new(),
            causes: HashSet::new(),
            failures: 0,
            first_failure: None,
            warnings: Vec::new(),
            pods: PodResolver::new(crate::host::root()),
            pod_links: HashMap::new(),
            discovery,
        })
    }

    /// After the first scan: a run that could attach to no interface at all is an error
    /// (one line with the first cause), not a run that silently captures nothing.
    pub fn require_some(&self) -> Result<(), KernelError> {
        if self.attached.is_empty() {
            return Err(KernelError::NothingAttached(
                self.first_failure
                    .clone()
                    .unwrap_or_else(|| "no interfaces found".into()),
            ));
        }
        Ok(())
    }

    pub fn attached_count(&self) -> usize {
        self.attached.len()
    }

    /// The initial pass: attach to every interface of every watched namespace. It fails on
    /// an interface given with `-i` that does not exist, or a `--netns` name that does not.
    /// Called again, it is a discovery pass (new namespaces only, vanished ones forgotten).
    pub fn scan(&mut self) -> Result<(), KernelError> {
        let first = self.attached.is_empty() && self.failed.is_empty();
        let found = self.discovery.pass(first)?;
        self.apply(found, first)?;
        self.refresh_pods();
        Ok(())
    }

    /// Acts on what discovery found; `first` makes the own namespace's failures errors.
    fn apply(&mut self, found: Vec<Found>, first: bool) -> Result<(), KernelError> {
        let mut changed = Vec::new();
        let mut appeared = Vec::new();
        for f in found {
            match f {
                Found::Vanished { id, cookie } => {
                    self.forget(id);
                    self.tell(NsChange::Gone { cookie });
                }
                Found::Appeared(id) => {
                    changed.push(id);
                    appeared.push(id);
                }
                Found::Relinked(id) => changed.push(id),
            }
        }
        let mut plans = Vec::with_capacity(changed.len());
        for id in changed {
            if let Some(plan) = self.plan(id, first)? {
                plans.push(plan);
            }
        }
        for (plan, results) in self.attach_all(plans) {
            self.record(plan, results, first)?;
        }
        for id in appeared {
            if let Some(w) = self.discovery.get(id) {
                let change = NsChange::Appeared {
                    path: w.ns.path.clone(),
                    cookie: w.cookie,
                };
                self.tell(change);
            }
        }
        Ok(())
    }

    fn tell(&mut self, change: NsChange) {
        let Some(tx) = &self.spec.ns_changes else {
            return;
        };
        match tx.try_send(change) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) => {
                if self.spec.netns_changes_lost.fetch_add(1, Ordering::Relaxed) == 0 {
                    log::warn!(
                        "the queue of namespace changes to conntrack is full: namespaces \
                         appearing now are not followed by conntrack (their hops across NAT \
                         joined by the fallback method), those going away are followed \
                         until the end (counted in netns_changes_lost)"
                    );
                }
            }
            // Nobody listens any more.
            Err(TrySendError::Disconnected(_)) => self.spec.ns_changes = None,
        }
    }

    /// Brings one namespace's attachments in line with its interfaces as discovery lists
    /// them: detaches from vanished ones, and returns the new ones to attach to.
    fn plan(&mut self, id: NetnsId, first: bool) -> Result<Option<Plan>, KernelError> {
        let Some(w) = self.discovery.get(id) else {
            return Ok(None);
        };
        let (ns, cookie, links) = (w.ns.clone(), w.cookie, w.links.clone());
        if ns.is_own && first {
            for want in &self.spec.interfaces {
                if !links.iter().any(|l| &l.name == want) {
                    return Err(KernelError::NoSuchInterface(want.clone()));
                }
            }
        }
        let wanted: Vec<_> = links
            .into_iter()
            .filter(|l| {
                !ns.is_own
                    || self.spec.interfaces.is_empty()
                    || self.spec.interfaces.contains(&l.name)
            })
            .collect();
        let mut seen: HashSet<AttachKey> = HashSet::new();
        let mut to_attach = Vec::new();
        for link in wanted {
            let key = AttachKey {
                netns: id,
                ifindex: link.index,
                ifname: link.name.clone(),
            };
            seen.insert(key.clone());
            if !self.attached.contains_key(&key) && !self.failed.contains(&key) {
                to_attach.push((key, link));
            }
        }
        // Before attaching: a renamed interface keeps its ifindex.
        self.detach_where(|k| k.netns == id && !seen.contains(k));
        if to_attach.is_empty() {
            return Ok(None);
        }
        if let Ok(mut names) = self.names.write() {
            for (_, link) in &to_attach {
                names.learn(cookie, &ns.name, link.index, &link.name);
            }
        }
        Ok(Some(Plan {
            id,
            ns,
            cookie,
            to_attach,
        }))
    }

    /// Attaches every plan's interfaces, one namespace after another.
    fn attach_all(&self, plans: Vec<Plan>) -> Vec<(Plan, PlanResults)> {
        plans
            .into_iter()
            .map(|plan| {
                let r = self.attach_plan(&plan);
                (plan, r)
            })
            .collect()
    }

    /// One plan's interfaces, on this thread, under the probes' lock.
    fn attach_plan(&self, plan: &Plan) -> PlanResults {
        let probes = Arc::clone(&self.probes);
        netns::with_netns_id(&plan.ns.path, plan.id, || {
            let mut probes = probes.lock().map_err(|_| KernelError::Poisoned("probe"))?;
            Ok(plan
                .to_attach
                .iter()
                .map(|(key, link)| {
                    let r = probes.attach_tc(plan.cookie, &link.name, link.has_eth);
                    (key.clone(), r)
                })
                .collect())
        })
    }

    /// Keeps what a plan attached; warns of (and counts) what it could not.
    fn record(&mut self, plan: Plan, results: PlanResults, first: bool) -> Result<(), KernelError> {
        let Plan { id, ns, cookie, .. } = plan;
        let results = match results {
            Ok(r) => r,
            // Gone since it was listed: the next pass forgets it.
            Err(e) if !ns.is_own => {
                log::debug!("skipping netns {}: {e}", ns.name);
                return Ok(());
            }
            Err(e) => return Err(e),
        };
        for (key, r) in results {
            match r {
                Ok(links) => {
                    self.attached.insert(
                        key,
                        Attached {
                            cookie,
                            links,
                            netns: id,
                            netns_path: ns.path.clone(),
                        },
                    );
                }
                Err(e) => {
                    if first && ns.is_own && !self.spec.interfaces.is_empty() {
                        return Err(e);
                    }
                    let msg = format!("cannot attach to {}/{}: {e}", ns.name, key.ifname);
                    let cause = e.to_string().replace(&key.ifname, "IFACE");
                    if self.causes.len() < 64 && self.causes.insert(cause) {
                        log::warn!(
                            "{msg} (further interfaces failing the same way are counted in stats)"
                        );
                    } else {
                        log::debug!("{msg}");
                    }
                    self.failures += 1;
                    self.first_failure.get_or_insert(msg.clone());
                    self.warnings.push(msg);
                    self.warnings.truncate(256);
                    self.failed.insert(key);
                }
            }
        }
        Ok(())
    }

    /// Detaches everything of a namespace that vanished.
    fn forget(&mut self, id: NetnsId) {
        self.detach_where(|k| k.netns == id);
    }

    /// Detaches the interfaces `gone` picks (a namespace's own program instance, where it
    /// has one, unloaded with its last), and forgets their failures.
    fn detach_where(&mut self, gone: impl Fn(&AttachKey) -> bool) {
        let keys: Vec<AttachKey> = self.attached.keys().filter(|k| gone(k)).cloned().collect();
        for key in keys {
            if let Some(a) = self.attached.remove(&key) {
                let forget = !self.attached.values().any(|other| other.cookie == a.cookie);
                self.detach(a, forget);
            }
        }
        self.failed.retain(|k| !gone(k));
    }

    /// Pods of the namespaces discovery knows.
    fn refresh_pods(&mut self) {
        let scanned: Vec<Scanned> = self
            .discovery
            .namespaces()
            .map(|w| Scanned {
                id: w.ns.id,
                is_own: w.ns.is_own,
                cookie: w.cookie,
                links: w.links.clone(),
            })
            .collect();
        self.refresh_pods_of(&scanned);
    }

    /// Pods of the namespaces, and the node-side ends of their veths: a pair is a link in a
    /// pod namespace and one in a scanned namespace that name each other's ifindex as peer
    /// (`IFLA_LINK`) in another namespace (`IFLA_LINK_NETNSID`).
    fn refresh_pods_of(&mut self, scanned: &[Scanned]) {
        let key = |id: &NetnsId| -> NsKey { (id.dev, id.ino) };
        let mut not_pods: HashSet<NsKey> = scanned
            .iter()
            .filter(|s| s.is_own)
            .map(|s| key(&s.id))
            .collect();
        not_pods.extend(self.pods.host_netns());
        let pods = self.pods.refresh(&not_pods);
        self.pod_links.retain(|k, _| pods.contains_key(k));
        let mut by_cookie = HashMap::new();
        let mut ends: HashMap<(u32, u32), Arc<Pod>> = HashMap::new();
        for (k, pn) in &pods {
            let (cookie, links) = match scanned.iter().find(|s| key(&s.id) == *k) {
                Some(s) => (s.cookie, &s.links),
                None => {
                    if !self.pod_links.contains_key(k) {
                        let entered = netns::with_netns(&pn.path, || {
                            Ok((netns::current_netns_cookie()?, netns::list_links()?))
                        });
                        match entered {
                            Ok(v) => {
                                self.pod_links.insert(*k, v);
                            }
                            Err(e) => {
                                log::debug!("pod {}: {e}", pn.pod.uid);
                                continue;
                            }
                        }
                    }
                    match self.pod_links.get(k) {
                        Some((c, l)) => (*c, l),
                        None => continue,
                    }
                }
            };
            by_cookie.insert(cookie, Arc::clone(&pn.pod));
            for l in links.iter().filter(|l| l.peer_elsewhere) {
                if let Some(peer) = l.peer {
                    ends.insert((l.index, peer), Arc::clone(&pn.pod));
                }
            }
        }
        let mut veths = HashMap::new();
        for s in scanned.iter().filter(|s| !pods.contains_key(&key(&s.id))) {
            for l in s.links.iter().filter(|l| l.peer_elsewhere) {
                if let Some(p) = l.peer.and_then(|peer| ends.get(&(peer, l.index))) {
                    veths.insert((s.cookie, l.name.clone()), Arc::clone(p));
                }
            }
        }
        if let Ok(mut names) = self.names.write() {
            names.set_pods(by_cookie, veths);
        }
    }

    /// Detaches everything this run attached.
    pub fn detach_all(&mut self) {
        let all: Vec<Attached> = self.attached.drain().map(|(_, a)| a).collect();
        let mut cookies = HashSet::new();
        for a in all {
            cookies.insert(a.cookie);
            self.detach(a, false);
        }
        // Only now: dropping an instance makes aya detach its remaining links in the
        // *current* namespace, where the same ifindex/priority/handle may name another
        // interface's filter (every namespace's `lo` is ifindex 1).
        if let Ok(mut p) = self.probes.lock() {
            for cookie in cookies {
                p.forget_netns(cookie);
            }
        }
    }

    /// Detaches one interface's links from inside its namespace; a namespace that is gone
    /// took its interfaces and their filters with it. `forget` unloads the namespace's
    /// program instance too.
    fn detach(&self, a: Attached, forget: bool) {
        let probes = Arc::clone(&self.probes);
        let cookie = a.cookie;
        let mut links = Some(a.links);
        // Where discovery last found it; a `/proc/PID` path goes stale with its process.
        let path = self
            .discovery
            .get(a.netns)
            .map_or(a.netns_path, |w| w.ns.path.clone());
        let entered = netns::with_netns_id(&path, a.netns, || {
            if let (Ok(mut p), Some(links)) = (probes.lock(), links.take()) {
                p.detach_tc(links);
            }
            Ok(())
        });
        if let Err(e) = entered {
            log::debug!("namespace {} gone: {e}", path.display());
        }
        if let (Some(links), Ok(mut p)) = (links, self.probes.lock()) {
            p.abandon_tc(links);
        }
        if forget {
            if let Ok(mut p) = self.probes.lock() {
                p.forget_netns(cookie);
            }
        }
    }

    /// Follows [`discover`]'s reports on a thread of its own until stopped, then detaches
    /// everything. setns(2) affects only that thread. It blocks in poll(2) between events;
    /// pods are looked up again after a change ([`POD_FOLLOW_UPS`]) and at each safety rescan.
    pub fn spawn(mut self, stop: Arc<AtomicBool>) -> AttachThread {
        let waker = self.discovery.waker();
        let flag = Arc::clone(&stop);
        let thread = thread::spawn(move || {
            let mut follow_ups = 0u8;
            let mut refreshed = Instant::now();
            while !stop.load(Ordering::Relaxed) {
                let max_wait = if follow_ups > 0 {
                    POD_FOLLOW_UP.saturating_sub(refreshed.elapsed())
                } else {
                    Duration::MAX
                };
                let turn = match self.discovery.turn(max_wait) {
                    Ok(t) => t,
                    Err(e) => {
                        log::warn!("interface scan: {e}");
                        // Not a tight loop on an error that stays.
                        thread::sleep(POD_FOLLOW_UP);
                        continue;
                    }
                };
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                let changed = !turn.found.is_empty();
                if let Err(e) = self.apply(turn.found, false) {
                    log::warn!("interface scan: {e}");
                }
                // A safety rescan that changed nothing refreshes once, with no follow-ups.
                let follow_up = follow_ups > 0 && refreshed.elapsed() >= POD_FOLLOW_UP;
                if changed {
                    follow_ups = POD_FOLLOW_UPS;
                } else if follow_up {
                    follow_ups -= 1;
                } else if !turn.full {
                    continue;
                }
                self.refresh_pods();
                refreshed = Instant::now();
            }
            self.detach_all();
            (std::mem::take(&mut self.warnings), self.failures)
        });
        AttachThread {
            stop: flag,
            waker,
            thread: Some(thread),
        }
    }
}

/// The attacher's thread: [`AttachThread::join`] stops it at once (it is woken, not
/// polled) and returns its warnings and failure count once it has detached everything.
pub struct AttachThread {
    stop: Arc<AtomicBool>,
    waker: Waker,
    thread: Option<thread::JoinHandle<(Vec<String>, u64)>>,
}

impl AttachThread {
    pub fn join(mut self) -> thread::Result<(Vec<String>, u64)> {
        self.stop.store(true, Ordering::Relaxed);
        self.waker.wake();
        match self.thread.take() {
            Some(t) => t.join(),
            None => Ok(Default::default()),
        }
    }
}

impl Drop for AttachThread {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        self.waker.wake();
    }
}
