//! kube-proxy's Services (a Service port and its backends) as its iptables mode's `nat`
//! rules say them, and the walk from a Service's chain to its DNAT targets that the nftables
//! mode shares ([`super::kube_proxy`]); `iptables-save` lines split into words, which the
//! NOTRACK and REJECT rules' readers use too.
use std::{
    collections::{BTreeSet, HashMap, HashSet},
    net::{IpAddr, SocketAddr},
};

use super::config;

/// A Service port and the pod addresses its DNAT rules send to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Service {
    pub ip: IpAddr,
    pub port: u16,
    /// kube-proxy's comment, e.g. `kube-system/kube-dns:dns cluster IP`.
    pub name: Option<String>,
    pub backends: Vec<SocketAddr>,
}

/// kube-proxy's iptables `nat` rules (`iptables-save -t nat`): each `KUBE-SERVICES` rule
/// with a destination address and port, and the DNAT targets its chains reach.
pub fn parse_iptables_nat(text: &str) -> Vec<Service> {
    let mut jumps: HashMap<String, Vec<String>> = HashMap::new();
    let mut dnat: HashMap<String, Vec<SocketAddr>> = HashMap::new();
    let mut entries: Vec<ServiceEntry> = Vec::new();
    for line in text.lines() {
        let w = words(line);
        if w.first().map(String::as_str) != Some("-A") {
            continue;
        }
        let Some(chain) = w.get(1) else { continue };
        let val = |flag: &str| -> Option<&String> {
            w.iter().position(|x| x == flag).and_then(|i| w.get(i + 1))
        };
        let Some(target) = val("-j") else { continue };
        if target == "DNAT" {
            if let Some(to) = val("--to-destination").and_then(|t| config::parse_addr(t, 0)) {
                dnat.entry(chain.clone()).or_default().push(to);
            }
            continue;
        }
        jumps.entry(chain.clone()).or_default().push(target.clone());
        if chain == "KUBE-SERVICES" {
            let dst = val("-d").and_then(|d| d.split('/').next()?.parse::<IpAddr>().ok());
            let port = val("--dport").and_then(|p| p.parse::<u16>().ok());
            if let (Some(ip), Some(port)) = (dst, port) {
                entries.push((ip, port, val("--comment").cloned(), target.clone()));
            }
        }
    }
    services_from_chains(entries, &dnat, &jumps)
}

/// A Service entry of kube-proxy's rules: its IP, port, name (a comment), first chain.
pub(super) type ServiceEntry = (IpAddr, u16, Option<String>, String);

/// Each Service entry's backends: the DNAT targets of the chains reached from its chain
/// (through `jumps`, 8 deep at most, each chain once), in iptables and nftables mode alike.
pub(super) fn services_from_chains(
    entries: Vec<ServiceEntry>,
    dnat: &HashMap<String, Vec<SocketAddr>>,
    jumps: &HashMap<String, Vec<String>>,
) -> Vec<Service> {
    let mut out: Vec<Service> = Vec::new();
    for (ip, port, name, chain) in entries {
        let mut backends = BTreeSet::new();
        let mut stack = vec![(chain, 0)];
        let mut seen = HashSet::new();
        while let Some((c, depth)) = stack.pop() {
            if depth > 8 || !seen.insert(c.clone()) {
                continue;
            }
            for d in dnat.get(&c).into_iter().flatten() {
                let p = if d.port() == 0 { port } else { d.port() };
                backends.insert(SocketAddr::new(d.ip(), p));
            }
            for j in jumps.get(&c).into_iter().flatten() {
                stack.push((j.clone(), depth + 1));
            }
        }
        add_service(
            &mut out,
            Service {
                ip,
                port,
                name,
                backends: backends.into_iter().collect(),
            },
        );
    }
    out
}

/// Adds `s` to `out`, its backends joined (sorted, once each) to those of an entry of the
/// same IP and port already there.
pub(super) fn add_service(out: &mut Vec<Service>, s: Service) {
    match out.iter_mut().find(|x| x.ip == s.ip && x.port == s.port) {
        Some(x) => {
            x.backends.extend(s.backends);
            x.backends.sort();
            x.backends.dedup();
        }
        None => out.push(s),
    }
}

/// Shell-like words of an `iptables-save` line (double quotes group).
pub(super) fn words(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut quoted = false;
    let mut any = false;
    for c in line.chars() {
        match c {
            '"' => {
                quoted = !quoted;
                any = true;
            }
            c if c.is_whitespace() && !quoted => {
                if any {
                    out.push(std::mem::take(&mut cur));
                    any = false;
                }
            }
            c => {
                cur.push(c);
                any = true;
            }
        }
    }
    if any {
        out.push(cur);
    }
    out
}

#[cfg(test)]
#[path = "iptables_tests.rs"]
pub(super) mod tests;
