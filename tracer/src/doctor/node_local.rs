//! NodeLocal DNSCache's configuration on the node: its link-local address (a socket on
//! `169.254.x.x:53` in the node's namespace, as node-cache binds `-localip` / its Corefile's
//! `bind` line, 169.254.20.10 by default on the `nodelocaldns` device), whether the pods'
//! resolv.conf name it, and its `raw` table NOTRACK rules: node-cache adds
//! `-A PREROUTING -d ADDR -p udp --dport 53 -j NOTRACK` and
//! `-A OUTPUT -s ADDR -p udp --sport 53 -j NOTRACK` (and TCP's) so that its queries and
//! answers never take a conntrack entry. Without them every query to the cache does, and
//! hits the A/AAAA insert race the cache exists to avoid.
use std::net::{IpAddr, Ipv4Addr};

use serde::Serialize;

use super::finding::{ConfigLine, Finding, FindingKind};

/// What doctor found of NodeLocal DNSCache (`checked.node_local_dns`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct NodeLocal {
    /// The link-local address it listens on.
    pub address: String,
    /// The process listening there, where known.
    pub server: Option<String>,
    /// Pods whose resolv.conf names it.
    pub pods_using: usize,
    /// Pods whose resolv.conf was read and does not.
    pub pods_not_using: usize,
    /// Its `raw` NOTRACK rules found.
    pub notrack_rules: Vec<String>,
    /// The NOTRACK rules node-cache adds that are missing.
    pub notrack_missing: Vec<String>,
    /// The config line that binds it (Corefile `bind`, or node-cache's `-localip`).
    #[serde(skip)]
    pub bind: Option<ConfigLine>,
}

/// Link-local IPv4 addresses with a UDP socket on port 53 in `/proc/net/udp`'s text, and the
/// sockets' inodes.
pub fn link_local_listeners(proc_net_udp: &str) -> Vec<(IpAddr, u64)> {
    let mut out = Vec::new();
    for line in proc_net_udp.lines().skip(1).take(1 << 20) {
        let f: Vec<&str> = line.split_whitespace().collect();
        let (Some(local), Some(inode)) = (f.get(1), f.get(9)) else {
            continue;
        };
        let Some((hex, port)) = local.split_once(':') else {
            continue;
        };
        if port != "0035" || hex.len() != 8 {
            continue;
        }
        // The kernel prints the address's four bytes as a native-endian u32.
        let Ok(v) = u32::from_str_radix(hex, 16) else {
            continue;
        };
        let ip = Ipv4Addr::from(v.to_ne_bytes());
        if ip.is_link_local() {
            if let Ok(i) = inode.parse::<u64>() {
                if !out.iter().any(|(a, _)| *a == IpAddr::V4(ip)) {
                    out.push((IpAddr::V4(ip), i));
                }
            }
        }
    }
    out
}

/// The NOTRACK rules node-cache adds for `addr`: (chain, address flag, port flag, proto).
const WANTED: [(&str, &str, &str, &str); 4] = [
    ("PREROUTING", "-d", "--dport", "udp"),
    ("OUTPUT", "-s", "--sport", "udp"),
    ("PREROUTING", "-d", "--dport", "tcp"),
    ("OUTPUT", "-s", "--sport", "tcp"),
];

fn wanted_text(addr: IpAddr, (chain, a, p, proto): (&str, &str, &str, &str)) -> String {
    format!("-t raw -A {chain} {a} {addr} -p {proto} {p} 53 -j NOTRACK")
}

/// Of `iptables-save -t raw`'s text, the NOTRACK (or `CT --notrack`) rules for `addr` on
/// port 53, and which of node-cache's four are missing.
pub fn notrack(raw: &str, addr: IpAddr) -> (Vec<String>, Vec<String>) {
    let mut found = Vec::new();
    let mut present = [false; 4];
    for line in raw.lines().take(1 << 20) {
        let w = super::iptables::words(line);
        if w.first().map(String::as_str) != Some("-A") {
            continue;
        }
        let val = |flag: &str| -> Option<&str> {
            w.iter()
                .position(|x| x == flag)
                .and_then(|i| w.get(i + 1))
                .map(String::as_str)
        };
        let untracked = match val("-j") {
            Some("NOTRACK") => true,
            Some("CT") => w.iter().any(|x| x == "--notrack"),
            _ => false,
        };
        if !untracked {
            continue;
        }
        let is_addr = |v: Option<&str>| {
            v.and_then(|d| d.split('/').next()?.parse::<IpAddr>().ok()) == Some(addr)
        };
        let mut any = false;
        for (k, (chain, a, p, proto)) in WANTED.iter().enumerate() {
            if w.get(1).map(String::as_str) == Some(*chain)
                && is_addr(val(a))
                && val("-p") == Some(*proto)
                && val(p) == Some("53")
            {
                present[k] = true;
                any = true;
            }
        }
        // iptables-save's flavours list the same nf_tables rules twice: once is enough.
        let l: String = line.chars().take(400).collect();
        if any && !found.contains(&l) {
            found.push(l);
        }
    }
    let missing = WANTED
        .iter()
        .zip(present)
        .filter(|(_, p)| !p)
        .map(|(w, _)| wanted_text(addr, *w))
        .collect();
    (found, missing)
}

/// A finding when the cache's UDP NOTRACK rules are missing.
pub fn findings(nl: &NodeLocal) -> Vec<Finding> {
    let udp_missing = nl.notrack_missing.iter().any(|m| m.contains("-p udp"));
    if !udp_missing {
        return Vec::new();
    }
    let mut f = Finding::new(
        FindingKind::NodeCacheNotrackMissing,
        nl.address.clone(),
        format!(
            "NodeLocal DNSCache listens on {}:53 but {} of its NOTRACK rules in the raw table are missing: its queries take conntrack entries",
            nl.address,
            nl.notrack_missing.len()
        ),
    );
    f.why = "NodeLocal DNSCache exists to keep pods' DNS out of conntrack: without its NOTRACK rules every UDP query to it takes a conntrack entry, so the A/AAAA insert race (5-second timeouts) and conntrack table fill come back, and the node's kube-proxy rules may DNAT what the cache should have answered.".into();
    if let Some(s) = &nl.server {
        f.evidence
            .push(format!("listening: {s} on {}:53", nl.address));
    }
    if let Some(b) = &nl.bind {
        f.evidence
            .push(format!("config: {}:{}: `{}`", b.file, b.line, b.text));
    }
    f.evidence.push(format!(
        "{} pod(s) use it as nameserver, {} do not",
        nl.pods_using, nl.pods_not_using
    ));
    for m in &nl.notrack_missing {
        f.evidence.push(format!("missing: {m}"));
    }
    for r in &nl.notrack_rules {
        f.evidence.push(format!("present: {r}"));
    }
    f.config = nl.bind.clone();
    f.fix = format!(
        "Restore node-local-dns's NOTRACK rules: it adds them at start (`-setupiptables`, the default) and re-checks them every `-syncinterval`; restart the node-local-dns pod on this node (`kubectl -n kube-system delete pod -l k8s-app=node-local-dns --field-selector spec.nodeName=NODE`), and find what flushed the raw table. By hand: `iptables -t raw -I PREROUTING -d {a} -p udp --dport 53 -j NOTRACK` and `iptables -t raw -I OUTPUT -s {a} -p udp --sport 53 -j NOTRACK` (and the same for tcp).",
        a = nl.address
    );
    vec![f]
}

#[cfg(test)]
mod tests {
    use super::*;

    const ADDR: &str = "169.254.20.10";

    fn raw_all() -> String {
        "*raw\n:PREROUTING ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n\
-A PREROUTING -d 169.254.20.10/32 -p udp -m udp --dport 53 -j NOTRACK\n\
-A PREROUTING -d 169.254.20.10/32 -p tcp -m tcp --dport 53 -j NOTRACK\n\
-A OUTPUT -s 169.254.20.10/32 -p udp -m udp --sport 53 -j CT --notrack\n\
-A OUTPUT -s 169.254.20.10/32 -p tcp -m tcp --sport 53 -j NOTRACK\n\
-A PREROUTING -d 10.96.0.10/32 -p udp -m udp --dport 53 -j NOTRACK\nCOMMIT\n"
            .to_owned()
    }

    #[test]
    fn notrack_rules_found_and_missing() {
        let a: IpAddr = ADDR.parse().unwrap();
        // Both iptables-save flavours list the nf_tables rules: counted once.
        let (found, missing) = notrack(&format!("{}{}", raw_all(), raw_all()), a);
        assert_eq!(found.len(), 4, "{found:?}");
        assert!(missing.is_empty(), "{missing:?}");
        let nl = NodeLocal {
            address: ADDR.into(),
            notrack_rules: found,
            ..Default::default()
        };
        assert!(findings(&nl).is_empty());
        // The UDP PREROUTING rule gone: a finding naming it.
        let raw: String = raw_all()
            .lines()
            .filter(|l| !l.contains("-p udp -m udp --dport 53 -j NOTRACK") || l.contains("10.96"))
            .map(|l| format!("{l}\n"))
            .collect();
        let (found, missing) = notrack(&raw, a);
        assert_eq!(found.len(), 3);
        assert_eq!(
            missing,
            ["-t raw -A PREROUTING -d 169.254.20.10 -p udp --dport 53 -j NOTRACK"]
        );
        let nl = NodeLocal {
            address: ADDR.into(),
            notrack_missing: missing,
            ..Default::default()
        };
        let f = findings(&nl);
        assert_eq!(f.len(), 1);
        assert_eq!(f[0].kind, FindingKind::NodeCacheNotrackMissing);
        assert!(f[0].fix.contains("-setupiptables"), "{}", f[0].fix);
        // Only TCP's missing: no finding (the race is UDP's).
        let nl = NodeLocal {
            address: ADDR.into(),
            notrack_missing: vec![wanted_text(a, WANTED[2])],
            ..Default::default()
        };
        assert!(findings(&nl).is_empty());
        // An ACCEPT rule or another address is not NOTRACK for it.
        let (_, missing) = notrack(
            "-A PREROUTING -d 169.254.20.10/32 -p udp -m udp --dport 53 -j ACCEPT\n-A PREROUTING -d 169.254.20.11/32 -p udp -m udp --dport 53 -j NOTRACK\n-A\n",
            a,
        );
        assert_eq!(missing.len(), 4);
    }

    #[test]
    #[cfg(target_endian = "little")]
    fn link_local_sockets_on_53_from_proc_net_udp() {
        // 169.254.20.10:53 and 10.96.0.10:53 (little-endian hex), 169.254.20.10:5353.
        let text = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode ref pointer drops\n\
  1: 0A14FEA9:0035 00000000:0000 07 00000000:00000000 00:00000000 00000000     0        0 4242 2 0000000000000000 0\n\
  2: 0A00600A:0035 00000000:0000 07 00000000:00000000 00:00000000 00000000     0        0 4243 2 0000000000000000 0\n\
  3: 0A14FEA9:14E9 00000000:0000 07 00000000:00000000 00:00000000 00000000     0        0 4244 2 0000000000000000 0\n\
  4: zz\n";
        assert_eq!(link_local_listeners(text), [(ADDR.parse().unwrap(), 4242)]);
    }
}
