//! kube-proxy's mode and its Services, from the node: `iptables` (its `KUBE-SERVICES` chain
//! in an iptables flavour's `nat` table), `nftables` (its table `ip kube-proxy` /
//! `ip6 kube-proxy`, read as `nft -j list table …`), `ipvs` (virtual services in
//! `/proc/net/ip_vs`, the `kube-ipvs0` dummy device that holds the ClusterIPs). In nftables
//! mode the Services and their backends come from the table's `service-ips` map, the
//! `service-…` chains it sends to and the `endpoint-…` chains' `dnat` (kube-proxy's
//! `pkg/proxy/nftables/proxier.go`), and a Service without endpoints from its
//! `no-endpoint-services` map; in ipvs mode from the virtual services' real servers.
use std::{
    collections::HashMap,
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr},
};

use serde_json::Value;

use super::{iptables::Service, services::NoEndpoints};

/// What kube-proxy's rules on this node say.
#[derive(Clone, Debug, Default)]
pub struct ProxyRules {
    /// `iptables`, `nftables`, `ipvs`: the modes whose rules are present (one, or two
    /// during a change of mode).
    pub modes: Vec<&'static str>,
    /// Service ports and their backends from the nftables and ipvs rules (the iptables ones
    /// are [`super::iptables::parse_iptables_nat`]'s).
    pub services: Vec<Service>,
    /// Services without endpoints from the nftables rules.
    pub no_endpoints: Vec<NoEndpoints>,
}

/// kube-proxy's iptables mode: its `KUBE-SERVICES` rules send to `KUBE-SVC-` chains (ipvs
/// mode keeps a `KUBE-SERVICES` chain too, matching ipsets instead).
pub fn iptables_mode(nat: &str) -> bool {
    nat.lines()
        .any(|l| l.starts_with("-A KUBE-SERVICES ") && l.contains("-j KUBE-SVC-"))
}

/// `ip link`'s names of this namespace (`/proc/net/dev`).
fn has_device(dev: &str, proc_net_dev: &str) -> bool {
    proc_net_dev
        .lines()
        .filter_map(|l| l.split_once(':'))
        .any(|(name, _)| name.trim() == dev)
}

/// The modes present, from the `nat` rules, whether the nftables table was listed, the
/// ipvs services and `/proc/net/dev`.
pub fn modes(
    nat: &str,
    nft_table: bool,
    ipvs: &[Service],
    proc_net_dev: &str,
) -> Vec<&'static str> {
    let mut out = Vec::new();
    if iptables_mode(nat) {
        out.push("iptables");
    }
    if nft_table {
        out.push("nftables");
    }
    if !ipvs.is_empty() || has_device("kube-ipvs0", proc_net_dev) {
        out.push("ipvs");
    }
    out
}

/// `nft -j list table FAMILY kube-proxy`, if the binary runs and the table exists.
fn nft_table(family: &str) -> Option<String> {
    let o = crate::host::command("nft")?
        .args(["-j", "list", "table", family, "kube-proxy"])
        .output()
        .ok()?;
    o.status
        .success()
        .then(|| String::from_utf8_lossy(&o.stdout).into_owned())
}

/// Reads this namespace's kube-proxy rules; `nat`: `iptables-save -t nat` of it.
pub fn read(nat: &str) -> ProxyRules {
    let mut r = ProxyRules::default();
    let mut nft = false;
    for family in ["ip", "ip6"] {
        if let Some(text) = nft_table(family) {
            nft = true;
            if let Ok((s, n)) = parse_nft_json(&text) {
                r.services.extend(s);
                r.no_endpoints.extend(n);
            }
        }
    }
    let small = |p: &str| {
        use std::io::Read;
        let mut s = String::new();
        std::fs::File::open(p)
            .and_then(|f| {
                f.take(super::config::MAX_CONFIG_BYTES)
                    .read_to_string(&mut s)
            })
            .map(|_| s)
            .unwrap_or_default()
    };
    let ipvs = parse_ip_vs(&small("/proc/net/ip_vs"));
    r.modes = modes(nat, nft, &ipvs, &small("/proc/net/dev"));
    r.services.extend(ipvs);
    r
}

#[derive(Debug, thiserror::Error)]
#[error("nft's JSON: {0}")]
pub struct NftError(#[from] serde_json::Error);

/// A verdict's chain: `{"goto": {"target": C}}` or `{"jump": …}`.
fn verdict_target(v: &Value) -> Option<&str> {
    ["goto", "jump"]
        .iter()
        .find_map(|k| v.get(k)?.get("target")?.as_str())
}

/// Every chain a rule's expression sends to (jumps, gotos, a vmap's verdicts), and its DNAT
/// targets, at any depth (at most 16 levels).
fn walk(v: &Value, depth: u32, jumps: &mut Vec<String>, dnat: &mut Vec<SocketAddr>) {
    if depth > 16 {
        return;
    }
    match v {
        Value::Object(m) => {
            if let Some(t) = verdict_target(v) {
                jumps.push(t.to_owned());
            }
            if let Some(d) = m.get("dnat") {
                let addr = d.get("addr").and_then(Value::as_str);
                let port = d.get("port").and_then(port_of).unwrap_or(0);
                if let Some(ip) = addr.and_then(|a| a.parse::<IpAddr>().ok()) {
                    dnat.push(SocketAddr::new(ip, port));
                }
            }
            for x in m.values() {
                walk(x, depth + 1, jumps, dnat);
            }
        }
        Value::Array(a) => {
            for x in a {
                walk(x, depth + 1, jumps, dnat);
            }
        }
        _ => {}
    }
}

fn port_of(v: &Value) -> Option<u16> {
    match v {
        Value::Number(n) => n.as_u64().and_then(|p| u16::try_from(p).ok()),
        Value::String(s) if s == "domain" => Some(53),
        Value::String(s) => s.parse().ok(),
        _ => None,
    }
}

/// A map element's key `ADDR . PROTO . PORT` (with or without `elem`'s comment), and the
/// comment.
fn element_key(k: &Value) -> Option<(IpAddr, String, u16, Option<String>)> {
    let (val, comment) = match k.get("elem") {
        Some(e) => (
            e.get("val")?,
            e.get("comment").and_then(Value::as_str).map(str::to_owned),
        ),
        None => (k, None),
    };
    let c = val.get("concat")?.as_array()?;
    let ip = c.first()?.as_str()?.parse().ok()?;
    let proto = c.get(1)?.as_str().unwrap_or_default().to_owned();
    let port = port_of(c.get(2)?)?;
    Some((ip, proto, port, comment))
}

/// kube-proxy's name in a chain name `service-HASH-NS/NAME/PROTO/PORTNAME`:
/// `NS/NAME:PORTNAME`.
fn name_of_chain(chain: &str) -> Option<String> {
    let rest = chain.strip_prefix("service-")?.split_once('-')?.1;
    let parts: Vec<&str> = rest.split('/').collect();
    match parts.as_slice() {
        [ns, name, _proto, port] => Some(format!("{ns}/{name}:{port}")),
        _ => None,
    }
}

/// Services (port, backends) and Services without endpoints from
/// `nft -j list table ip kube-proxy`.
pub fn parse_nft_json(text: &str) -> Result<(Vec<Service>, Vec<NoEndpoints>), NftError> {
    let doc: Value = serde_json::from_str(text)?;
    let items = doc
        .get("nftables")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default();
    let mut jumps: HashMap<String, Vec<String>> = HashMap::new();
    let mut dnat: HashMap<String, Vec<SocketAddr>> = HashMap::new();
    let mut entries = Vec::new();
    let mut no_endpoints = Vec::new();
    for item in items {
        if let Some(rule) = item.get("rule") {
            let Some(chain) = rule.get("chain").and_then(Value::as_str) else {
                continue;
            };
            let (mut j, mut d) = (Vec::new(), Vec::new());
            if let Some(e) = rule.get("expr") {
                walk(e, 0, &mut j, &mut d);
            }
            jumps.entry(chain.to_owned()).or_default().extend(j);
            dnat.entry(chain.to_owned()).or_default().extend(d);
        } else if let Some(map) = item.get("map") {
            let name = map.get("name").and_then(Value::as_str).unwrap_or_default();
            let elems = map
                .get("elem")
                .and_then(Value::as_array)
                .map(Vec::as_slice)
                .unwrap_or_default();
            for e in elems.iter().take(1 << 16) {
                let Some([k, v]) = e.as_array().map(Vec::as_slice) else {
                    continue;
                };
                let Some((ip, proto, port, comment)) = element_key(k) else {
                    continue;
                };
                match name {
                    "service-ips" => {
                        if let Some(t) = verdict_target(v) {
                            let name = comment.or_else(|| name_of_chain(t));
                            entries.push((ip, port, name, t.to_owned()));
                        }
                    }
                    "no-endpoint-services" if port == 53 => {
                        let verdict = verdict_target(v)
                            .map(|t| format!("goto {t}"))
                            .or_else(|| v.as_object()?.keys().next().cloned())
                            .unwrap_or_default();
                        let addr = SocketAddr::new(ip, port);
                        if no_endpoints
                            .iter()
                            .any(|n: &NoEndpoints| n.addr == addr && n.proto == proto)
                        {
                            continue;
                        }
                        no_endpoints.push(NoEndpoints {
                            addr,
                            rule: format!(
                                "nft table kube-proxy, map no-endpoint-services: {ip} . {proto} . {port} : {verdict}"
                            )
                            .chars()
                            .take(400)
                            .collect(),
                            proto,
                            name: comment,
                        });
                    }
                    _ => {}
                }
            }
        }
    }
    let out = super::iptables::services_from_chains(entries, &dnat, &jumps);
    Ok((out, no_endpoints))
}

/// `/proc/net/ip_vs`'s hex address `0A60000A:0035` (or an IPv6 one in brackets).
fn ipvs_addr(s: &str) -> Option<SocketAddr> {
    let (a, p) = s.rsplit_once(':')?;
    let port = u16::from_str_radix(p, 16).ok()?;
    let a = a.trim_start_matches('[').trim_end_matches(']');
    let ip = if a.len() == 8 {
        IpAddr::from(Ipv4Addr::from(u32::from_str_radix(a, 16).ok()?))
    } else {
        a.parse::<Ipv6Addr>().ok()?.into()
    };
    Some(SocketAddr::new(ip, port))
}

/// Virtual services (`TCP  0A60000A:0035 rr`) and their real servers (`  -> 0AF40103:0035
/// Masq 1 0 0`) of `/proc/net/ip_vs`.
pub fn parse_ip_vs(text: &str) -> Vec<Service> {
    let mut out: Vec<Service> = Vec::new();
    let mut cur: Option<usize> = None;
    for line in text.lines().take(1 << 20) {
        let w: Vec<&str> = line.split_whitespace().collect();
        match w.as_slice() {
            ["->", a, ..] => {
                let (Some(i), Some(b)) = (cur, ipvs_addr(a)) else {
                    continue;
                };
                if let Some(s) = out.get_mut(i) {
                    if !s.backends.contains(&b) {
                        s.backends.push(b);
                    }
                }
            }
            [proto, a, ..] if matches!(*proto, "TCP" | "UDP" | "SCTP") => {
                cur = ipvs_addr(a).map(|v| {
                    match out
                        .iter()
                        .position(|s| s.ip == v.ip() && s.port == v.port())
                    {
                        Some(i) => i,
                        None => {
                            out.push(Service {
                                ip: v.ip(),
                                port: v.port(),
                                name: None,
                                backends: Vec::new(),
                            });
                            out.len() - 1
                        }
                    }
                });
            }
            _ => {}
        }
    }
    out
}

#[cfg(test)]
#[path = "kube_proxy_tests.rs"]
mod tests;
