//! Display names of namespaces and interfaces, and the pods they belong to: learned by the
//! live attacher or from a capture file's interface descriptions, read by the decode stage.
use std::{
    collections::HashMap,
    sync::{Arc, RwLock},
};

use serde::{ser::SerializeMap, Serialize, Serializer};

use crate::kube::Pod;

/// Names of namespaces and interfaces for display, by netns cookie and ifindex. Kept after
/// an interface goes away so that late events still get a name; bounded. Names are shared
/// (`Arc<str>`), so a record naming its place costs a reference count, not a copy.
#[derive(Debug, Default)]
pub struct Names {
    netns: Map<u64, Arc<str>>,
    ifaces: Map<(u64, u32), Arc<str>>,
    /// Namespace by its name, for records that carry only the name (hops, legs).
    by_label: Map<String, u64>,
    /// Pods' namespaces, and node-side ends of pods' veths (by namespace and interface
    /// name), as of the last refresh; each with its record form, shared by the records.
    pods: Map<u64, PodEntry>,
    pod_veths: Map<u64, Map<String, PodEntry>>,
    /// Changes whenever a namespace or interface name does: what [`place`] gave before is
    /// still right while it stays the same.
    generation: u64,
}

/// The names' maps: keyed by what the node says (namespace cookies, interface indexes, the
/// names the scans and netlink give), never by what a packet carries, so a fast hasher is
/// safe; every packet's place and every record's pods are looked up in them.
type Map<K, V> = HashMap<K, V, foldhash::fast::RandomState>;

/// A pod, and how records name it there.
type PodEntry = (Arc<Pod>, Arc<PodRef>);

/// The Kubernetes pod where a record was seen (or, on transactions and races, the client's
/// pod), as far as the node knows it; every field is left out where unknown, so records of
/// namespaces that are no pod's are unchanged. See docs/output.md. Records flatten it in
/// (`#[serde(flatten)]`, or [`PodRef::serialize_entries`] where they write themselves).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PodRef {
    /// `namespace/name`.
    pub pod: Option<String>,
    pub pod_uid: Option<String>,
    /// The container's name, where the pod's namespace holds one container.
    pub container: Option<String>,
    pub container_id: Option<String>,
    /// The interface is the node-side end of the pod's veth pair, not in the pod itself.
    pub pod_veth: bool,
}

impl PodRef {
    /// Its fields as entries of a record's map, each left out where unknown (`pod_veth`
    /// where false): what `#[serde(flatten)]` writes, for a record that writes itself.
    pub fn serialize_entries<M: SerializeMap>(&self, m: &mut M) -> Result<(), M::Error> {
        let strings = [
            ("pod", &self.pod),
            ("pod_uid", &self.pod_uid),
            ("container", &self.container),
            ("container_id", &self.container_id),
        ];
        for (key, value) in strings {
            if let Some(v) = value {
                m.serialize_entry(key, v)?;
            }
        }
        if self.pod_veth {
            m.serialize_entry("pod_veth", &true)?;
        }
        Ok(())
    }
}

impl Serialize for PodRef {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(None)?;
        self.serialize_entries(&mut m)?;
        m.end()
    }
}

/// For `skip_serializing_if`: a flag written only when set.
pub(crate) fn is_false(b: &bool) -> bool {
    !*b
}

impl PodRef {
    /// No pod known.
    pub const NONE: PodRef = PodRef {
        pod: None,
        pod_uid: None,
        container: None,
        container_id: None,
        pod_veth: false,
    };

    /// `pod` as records name it; `veth`: seen on the node-side end of its veth.
    pub fn of(pod: &Pod, veth: bool) -> Self {
        PodRef {
            pod: pod.label.clone(),
            pod_uid: Some(pod.uid.clone()),
            container: pod.container.clone(),
            container_id: pod.container_id.clone(),
            pod_veth: veth,
        }
    }

    pub fn is_known(&self) -> bool {
        self.pod.is_some() || self.pod_uid.is_some()
    }
}

const MAX_NAMES: usize = 65536;

impl Names {
    pub fn netns(&self, cookie: u64) -> Option<&str> {
        self.netns.get(&cookie).map(|n| &**n)
    }
    pub fn iface(&self, cookie: u64, ifindex: u32) -> Option<&str> {
        self.ifaces.get(&(cookie, ifindex)).map(|n| &**n)
    }
    pub fn learn(&mut self, cookie: u64, ns: &str, ifindex: u32, ifname: &str) {
        if self.ifaces.len() >= MAX_NAMES {
            self.ifaces.clear();
            self.generation = self.generation.wrapping_add(1);
        }
        if self.netns.len() >= MAX_NAMES {
            self.netns.clear();
            self.generation = self.generation.wrapping_add(1);
        }
        if self.by_label.len() >= MAX_NAMES {
            self.by_label.clear();
        }
        if self.netns.get(&cookie).is_none_or(|n| **n != *ns) {
            self.netns.insert(cookie, Arc::from(ns));
            self.generation = self.generation.wrapping_add(1);
        }
        self.by_label.insert(ns.to_string(), cookie);
        if self
            .ifaces
            .get(&(cookie, ifindex))
            .is_none_or(|n| **n != *ifname)
        {
            self.ifaces.insert((cookie, ifindex), Arc::from(ifname));
            self.generation = self.generation.wrapping_add(1);
        }
    }

    /// A number that changes whenever a namespace or interface name does: while it stays
    /// the same, what [`Names::place`] gives does too.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// Replaces the pod map (from the attacher's refresh).
    pub fn set_pods(
        &mut self,
        pods: HashMap<u64, Arc<Pod>>,
        pod_veths: HashMap<(u64, String), Arc<Pod>>,
    ) {
        self.pods = pods
            .into_iter()
            .map(|(cookie, pod)| {
                let r = Arc::new(PodRef::of(&pod, false));
                (cookie, (pod, r))
            })
            .collect();
        self.pod_veths.clear();
        for ((cookie, ifname), pod) in pod_veths {
            let r = Arc::new(PodRef::of(&pod, true));
            self.pod_veths
                .entry(cookie)
                .or_default()
                .insert(ifname, (pod, r));
        }
    }

    /// The pod seen at interface `ifname` of the namespace named `ns` (`ifname` empty: the
    /// namespace's pod), and whether the interface is the node-side end of its veth.
    pub fn pod_at(&self, ns: &str, ifname: &str) -> Option<(&Arc<Pod>, bool)> {
        self.pod_entry(ns, ifname).map(|((p, _), veth)| (p, veth))
    }

    /// Some pod is known (live, after a scan found one): naming records is worth a lookup.
    pub fn knows_pods(&self) -> bool {
        !self.pods.is_empty() || !self.pod_veths.is_empty()
    }

    /// [`Names::pod_at`] in record form, owned (all fields unset where no pod is known).
    pub fn pod_of(&self, ns: &str, ifname: &str) -> PodRef {
        self.pod_at(ns, ifname)
            .map_or_else(PodRef::default, |(p, veth)| PodRef::of(p, veth))
    }

    /// [`Names::pod_at`] in record form, shared.
    pub fn pod_ref_at(&self, ns: &str, ifname: &str) -> Option<&Arc<PodRef>> {
        self.pod_entry(ns, ifname).map(|((_, r), _)| r)
    }

    fn pod_entry(&self, ns: &str, ifname: &str) -> Option<(&PodEntry, bool)> {
        if self.pods.is_empty() && self.pod_veths.is_empty() {
            return None;
        }
        let cookie = *self.by_label.get(ns)?;
        if let Some(p) = self.pods.get(&cookie) {
            return Some((p, false));
        }
        if ifname.is_empty() {
            return None;
        }
        self.pod_veths
            .get(&cookie)
            .and_then(|by_name| by_name.get(ifname))
            .map(|p| (p, true))
    }
}

pub type SharedNames = Arc<RwLock<Names>>;

/// How records name where something was seen: (namespace, interface), with stand-ins for
/// what is not (yet) known: `netns:0x…`, `ifN`, and no name for ifindex 0 (a drop without a
/// device, or a file's first interface). Known names are shared, not copied.
pub fn place(names: &SharedNames, netns: u64, ifindex: u32) -> (Arc<str>, Arc<str>) {
    match names.read() {
        Ok(names) => names.place(netns, ifindex),
        Err(_) => (
            Arc::from(format!("{netns:#x}")),
            Arc::from(format!("if{ifindex}")),
        ),
    }
}

impl Names {
    /// [`place`], under a lock already held.
    pub fn place(&self, netns: u64, ifindex: u32) -> (Arc<str>, Arc<str>) {
        let ns = match self.netns.get(&netns) {
            Some(n) => Arc::clone(n),
            None => Arc::from(format!("netns:{netns:#x}")),
        };
        let ifname = match self.ifaces.get(&(netns, ifindex)) {
            Some(n) => Arc::clone(n),
            None if ifindex == 0 => Arc::from(""),
            None => Arc::from(format!("if{ifindex}")),
        };
        (ns, ifname)
    }
}
