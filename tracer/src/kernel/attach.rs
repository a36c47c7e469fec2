//! Keeps the TC programs attached to every watched interface: an initial scan, then a rescan
//! every [`RESCAN`] so that pods starting (new namespaces, new veths) are picked up within a
//! second and vanished ones forgotten.
use std::{
    collections::{HashMap, HashSet},
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc, Mutex,
    },
    thread,
    time::Duration,
};

use aya::programs::tc::SchedClassifierLinkId;

use super::{
    netns::{self, Link, NetnsId, NetnsRef},
    KernelError, Probes,
};
use crate::kube::{
    resolver::{NsKey, PodResolver},
    Pod,
};
pub use crate::names::{place, Names, SharedNames};

pub const RESCAN: Duration = Duration::from_millis(500);

pub mod discover;

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
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct AttachKey {
    netns: NetnsId,
    ifindex: u32,
    ifname: String,
}

struct Attached {
    cookie: u64,
    links: Vec<(usize, SchedClassifierLinkId)>,
    /// The namespace, to enter for detaching: clsact filters are removed over netlink in
    /// the namespace of their interface (TCX links go away with their fd anywhere).
    netns_path: std::path::PathBuf,
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
    /// The refused namespace reads were reported (once a run).
    unreadable_reported: bool,
    /// Cookie and links of pod namespaces this run does not attach to (entered once each,
    /// to find the node-side ends of their veths).
    pod_links: HashMap<NsKey, (u64, Vec<Link>)>,
}

/// One namespace as a scan found it.
struct Scanned {
    id: NetnsId,
    is_own: bool,
    cookie: u64,
    links: Vec<Link>,
}

impl Attacher {
    pub fn new(probes: Arc<Mutex<Probes>>, spec: AttachSpec, names: SharedNames) -> Self {
        Self {
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
            unreadable_reported: false,
            pod_links: HashMap::new(),
        }
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

    fn namespaces(&mut self) -> Result<Vec<NetnsRef>, KernelError> {
        if self.spec.all_netns {
            let all = netns::all_netns()?;
            self.spec
                .netns_unreadable
                .store(all.unreadable, Ordering::Relaxed);
            if all.unreadable > 0 && !self.unreadable_reported {
                self.unreadable_reported = true;
                eprintln!("dnspath: {}", unreadable_message(all.unreadable));
            }
            return Ok(all.namespaces);
        }
        let mut out = vec![netns::own_netns()?];
        if !self.spec.netns.is_empty() {
            let named = netns::named_netns();
            for want in &self.spec.netns {
                match named.iter().find(|n| &n.name == want) {
                    Some(n) if n.id != out[0].id => out.push(n.clone()),
                    Some(_) => {}
                    None => {
                        if self.attached.is_empty() {
                            return Err(KernelError::Netns(format!(
                                "no network namespace named {want} under /run/netns"
                            )));
                        }
                    }
                }
            }
        }
        Ok(out)
    }

    /// One pass: attach to new interfaces, forget vanished ones. The first call fails on an
    /// interface given with `-i` that does not exist; later calls only warn.
    pub fn scan(&mut self) -> Result<(), KernelError> {
        let first = self.attached.is_empty() && self.failed.is_empty();
        let namespaces = self.namespaces()?;
        let mut seen: HashSet<AttachKey> = HashSet::new();
        let mut scanned = Vec::with_capacity(namespaces.len());
        for ns in &namespaces {
            let listed = netns::with_netns(&ns.path, || {
                let cookie = netns::current_netns_cookie()?;
                let links = netns::list_links()?;
                Ok((cookie, links))
            });
            let (cookie, links) = match listed {
                Ok(v) => v,
                // The namespace went away between listing and entering: not an error.
                Err(e) if !ns.is_own => {
                    log::debug!("skipping netns {}: {e}", ns.name);
                    continue;
                }
                Err(e) => return Err(e),
            };
            scanned.push(Scanned {
                id: ns.id,
                is_own: ns.is_own,
                cookie,
                links: links.clone(),
            });
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
            let mut to_attach = Vec::new();
            for link in wanted {
                let key = AttachKey {
                    netns: ns.id,
                    ifindex: link.index,
                    ifname: link.name.clone(),
                };
                seen.insert(key.clone());
                if !self.attached.contains_key(&key) && !self.failed.contains(&key) {
                    to_attach.push((key, link));
                }
            }
            if to_attach.is_empty() {
                continue;
            }
            if let Ok(mut names) = self.names.write() {
                for (_, link) in &to_attach {
                    names.learn(cookie, &ns.name, link.index, &link.name);
                }
            }
            let probes = Arc::clone(&self.probes);
            let results = netns::with_netns(&ns.path, || {
                let mut probes = probes.lock().map_err(|_| KernelError::Poisoned("probe"))?;
                Ok(to_attach
                    .into_iter()
                    .map(|(key, link)| {
                        let r = probes.attach_tc(cookie, &link.name, link.has_eth);
                        (key, r)
                    })
                    .collect::<Vec<_>>())
            });
            let results = match results {
                Ok(r) => r,
                Err(e) if !ns.is_own => {
                    log::debug!("skipping netns {}: {e}", ns.name);
                    continue;
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
                            log::warn!("{msg} (further interfaces failing the same way are counted in stats)");
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
        }
        let gone: Vec<AttachKey> = self
            .attached
            .keys()
            .filter(|k| !seen.contains(*k))
            .cloned()
            .collect();
        for key in gone {
            if let Some(a) = self.attached.remove(&key) {
                let forget = !self.attached.values().any(|other| other.cookie == a.cookie);
                self.detach(a, forget);
            }
        }
        self.failed.retain(|k| seen.contains(k));
        self.refresh_pods(&scanned);
        Ok(())
    }

    /// Pods of the namespaces, and the node-side ends of their veths: a pair is a link in a
    /// pod namespace and one in a scanned namespace that name each other's ifindex as peer
    /// (`IFLA_LINK`) in another namespace (`IFLA_LINK_NETNSID`).
    fn refresh_pods(&mut self, scanned: &[Scanned]) {
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
        let entered = netns::with_netns(&a.netns_path, || {
            if let (Ok(mut p), Some(links)) = (probes.lock(), links.take()) {
                p.detach_tc(cookie, links);
            }
            Ok(())
        });
        if let Err(e) = entered {
            log::debug!("namespace {} gone: {e}", a.netns_path.display());
        }
        if let (Some(links), Ok(mut p)) = (links, self.probes.lock()) {
            p.abandon_tc(cookie, links);
        }
        if forget {
            if let Ok(mut p) = self.probes.lock() {
                p.forget_netns(cookie);
            }
        }
    }

    /// Rescans every [`RESCAN`] on a thread of its own until `stop` is set, then detaches
    /// everything. setns(2) affects only that thread.
    pub fn spawn(mut self, stop: Arc<AtomicBool>) -> thread::JoinHandle<(Vec<String>, u64)> {
        thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                thread::sleep(RESCAN);
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                if let Err(e) = self.scan() {
                    log::warn!("interface scan: {e}");
                }
            }
            self.detach_all();
            (std::mem::take(&mut self.warnings), self.failures)
        })
    }
}
