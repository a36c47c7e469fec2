//! Display names of namespaces and interfaces, and the pods they belong to: learned by the
//! live attacher or from a capture file's interface descriptions, read by the decode stage.
use std::{
    collections::HashMap,
    sync::{Arc, RwLock},
};

use crate::kube::Pod;

/// Names of namespaces and interfaces for display, by netns cookie and ifindex. Kept after
/// an interface goes away so that late events still get a name; bounded.
#[derive(Debug, Default)]
pub struct Names {
    netns: HashMap<u64, String>,
    ifaces: HashMap<(u64, u32), String>,
    /// Namespace by its name, for records that carry only the name (hops, legs).
    by_label: HashMap<String, u64>,
    /// Pods' namespaces, and node-side ends of pods' veths (by namespace and interface
    /// name), as of the last rescan.
    pods: HashMap<u64, Arc<Pod>>,
    pod_veths: HashMap<u64, HashMap<String, Arc<Pod>>>,
}

const MAX_NAMES: usize = 65536;

impl Names {
    pub fn netns(&self, cookie: u64) -> Option<&str> {
        self.netns.get(&cookie).map(String::as_str)
    }
    pub fn iface(&self, cookie: u64, ifindex: u32) -> Option<&str> {
        self.ifaces.get(&(cookie, ifindex)).map(String::as_str)
    }
    pub fn learn(&mut self, cookie: u64, ns: &str, ifindex: u32, ifname: &str) {
        if self.ifaces.len() >= MAX_NAMES {
            self.ifaces.clear();
        }
        if self.netns.len() >= MAX_NAMES {
            self.netns.clear();
        }
        if self.by_label.len() >= MAX_NAMES {
            self.by_label.clear();
        }
        self.netns.insert(cookie, ns.to_string());
        self.by_label.insert(ns.to_string(), cookie);
        self.ifaces.insert((cookie, ifindex), ifname.to_string());
    }

    /// Replaces the pod map (from a rescan).
    pub fn set_pods(
        &mut self,
        pods: HashMap<u64, Arc<Pod>>,
        pod_veths: HashMap<(u64, String), Arc<Pod>>,
    ) {
        self.pods = pods;
        self.pod_veths.clear();
        for ((cookie, ifname), pod) in pod_veths {
            self.pod_veths
                .entry(cookie)
                .or_default()
                .insert(ifname, pod);
        }
    }

    /// The pod seen at interface `ifname` of the namespace named `ns` (`ifname` empty: the
    /// namespace's pod), and whether the interface is the node-side end of its veth.
    pub fn pod_at(&self, ns: &str, ifname: &str) -> Option<(&Arc<Pod>, bool)> {
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
/// device, or a file's first interface).
pub fn place(names: &SharedNames, netns: u64, ifindex: u32) -> (String, String) {
    let Ok(names) = names.read() else {
        return (format!("{netns:#x}"), format!("if{ifindex}"));
    };
    let ns = names
        .netns(netns)
        .map(str::to_string)
        .unwrap_or_else(|| format!("netns:{netns:#x}"));
    let ifname = match names.iface(netns, ifindex) {
        Some(n) => n.to_string(),
        None if ifindex == 0 => String::new(),
        None => format!("if{ifindex}"),
    };
    (ns, ifname)
}
