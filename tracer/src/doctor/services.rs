//! DNS Services without endpoints, from kube-proxy's rules: in iptables mode kube-proxy
//! gives such a Service no DNAT but a `filter` rule
//! `-A KUBE-SERVICES -d IP/32 -p udp -m comment --comment "NS/NAME:PORT has no endpoints" -m udp --dport 53 -j REJECT`
//! (`pkg/proxy/iptables/proxier.go`), and a query to it is answered by an ICMP port
//! unreachable; a `nat` Service entry whose chains reach no DNAT sends nowhere either. Only
//! port 53 is DNS's.
use std::net::{IpAddr, SocketAddr};

use super::{
    finding::{Finding, FindingKind},
    iptables::{words, Service},
};

/// A Service port that sends nowhere.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NoEndpoints {
    pub addr: SocketAddr,
    pub proto: String,
    /// kube-proxy's comment (`NS/NAME:PORT has no endpoints`), where there is one.
    pub name: Option<String>,
    /// The rule that says it.
    pub rule: String,
}

/// REJECT (or DROP) rules of `iptables-save -t filter` output that kube-proxy writes for a
/// Service without endpoints, on port 53.
pub fn parse_filter(text: &str) -> Vec<NoEndpoints> {
    let mut out: Vec<NoEndpoints> = Vec::new();
    for line in text.lines().take(1 << 20) {
        let w = words(line);
        if w.first().map(String::as_str) != Some("-A") {
            continue;
        }
        let val = |flag: &str| -> Option<&String> {
            w.iter().position(|x| x == flag).and_then(|i| w.get(i + 1))
        };
        let Some(comment) = val("--comment") else {
            continue;
        };
        if !comment.contains("has no endpoints")
            || !matches!(val("-j").map(String::as_str), Some("REJECT" | "DROP"))
        {
            continue;
        }
        let ip = val("-d").and_then(|d| d.split('/').next()?.parse::<IpAddr>().ok());
        let port = val("--dport").and_then(|p| p.parse::<u16>().ok());
        let (Some(ip), Some(53)) = (ip, port) else {
            continue;
        };
        let addr = SocketAddr::new(ip, 53);
        let proto = val("-p").cloned().unwrap_or_default();
        if out.iter().any(|n| n.addr == addr && n.proto == proto) {
            continue;
        }
        out.push(NoEndpoints {
            addr,
            proto,
            name: comment.strip_suffix(" has no endpoints").map(str::to_owned),
            rule: line.chars().take(400).collect(),
        });
    }
    out
}

/// `nat` Service entries on port 53 that reach no DNAT (kube-proxy writes none such; a
/// hand-made or half-synced rule set can).
pub fn nat_without_backends(services: &[Service]) -> Vec<NoEndpoints> {
    services
        .iter()
        .filter(|s| s.port == 53 && s.backends.is_empty())
        .map(|s| NoEndpoints {
            addr: SocketAddr::new(s.ip, s.port),
            proto: String::new(),
            name: s.name.clone(),
            rule: format!(
                "nat KUBE-SERVICES -d {} --dport {}: no DNAT reached",
                s.ip, s.port
            ),
        })
        .collect()
}

/// One finding per Service address; `queries(addr)`: (queries, unanswered) seen to it.
pub fn findings(no: &[NoEndpoints], queries: &dyn Fn(SocketAddr) -> (u64, u64)) -> Vec<Finding> {
    let mut out: Vec<Finding> = Vec::new();
    for n in no {
        if let Some(f) = out.iter_mut().find(|f| f.subject == n.addr.to_string()) {
            f.evidence.push(format!("rule: {}", n.rule));
            continue;
        }
        let name = n.name.as_deref().unwrap_or("a Service");
        let mut f = Finding::new(
            FindingKind::ServiceWithoutEndpoints,
            n.addr.to_string(),
            format!(
                "{name} at {} has no endpoints: kube-proxy rejects every query to it",
                n.addr
            ),
        );
        f.why = "Clients that use this Service (the nameserver of their resolv.conf) get `connection refused` (ICMP port unreachable) or nothing: every lookup fails at once — typically CoreDNS pods not Ready, or a Service selector that matches none.".into();
        f.evidence = vec![format!("rule: {}", n.rule)];
        let (q, u) = queries(n.addr);
        if q > 0 {
            f.count = q;
            f.evidence.push(format!(
                "{q} queries to it during the watch, {u} unanswered"
            ));
        }
        f.fix = "`kubectl -n kube-system get endpointslices -l k8s-app=kube-dns`: bring the DNS pods up (their logs, `kubectl describe pod`), or fix the Service's selector to match their labels.".into();
        out.push(f);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kube_proxy_reject_rules() {
        let text = "*filter\n:KUBE-SERVICES - [0:0]\n-A KUBE-SERVICES -d 10.96.0.10/32 -p udp -m comment --comment \"kube-system/kube-dns:dns has no endpoints\" -m udp --dport 53 -j REJECT --reject-with icmp-port-unreachable\n-A KUBE-SERVICES -d 10.96.0.10/32 -p tcp -m comment --comment \"kube-system/kube-dns:dns-tcp has no endpoints\" -m tcp --dport 53 -j REJECT --reject-with icmp-port-unreachable\n-A KUBE-SERVICES -d 10.96.0.20/32 -p tcp -m comment --comment \"default/web:http has no endpoints\" -m tcp --dport 80 -j REJECT\n-A KUBE-SERVICES -d 10.96.0.10/32 -p udp -m comment --comment \"kube-system/kube-dns:dns has no endpoints\" -m udp --dport 53 -j REJECT --reject-with icmp-port-unreachable\nCOMMIT\n";
        let n = parse_filter(text);
        assert_eq!(n.len(), 2, "{n:?}");
        assert_eq!(n[0].name.as_deref(), Some("kube-system/kube-dns:dns"));
        let f = findings(&n, &|_| (7, 7));
        assert_eq!(f.len(), 1);
        assert_eq!(f[0].subject, "10.96.0.10:53");
        assert_eq!(f[0].count, 7);
        assert_eq!(f[0].evidence.len(), 3, "{:?}", f[0].evidence);
        assert!(parse_filter("-A X -j REJECT --comment").is_empty());
    }

    #[test]
    fn nat_entries_without_dnat() {
        let s = Service {
            ip: "10.96.0.10".parse().unwrap(),
            port: 53,
            name: None,
            backends: vec![],
        };
        assert_eq!(nat_without_backends(std::slice::from_ref(&s)).len(), 1);
        let mut ok = s;
        ok.backends.push("10.244.1.3:53".parse().unwrap());
        assert!(nat_without_backends(&[ok]).is_empty());
    }
}
