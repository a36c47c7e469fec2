//! kubelet's configuration file (`/var/lib/kubelet/config.yaml`, a `KubeletConfiguration`):
//! `clusterDNS`, the nameservers kubelet writes into pods' resolv.conf (`dnsPolicy:
//! ClusterFirst`), and `resolvConf`, the file whose nameservers pods with `dnsPolicy:
//! Default` (CoreDNS among them) get. Findings: `clusterDNS` that is neither a DNS Service
//! kube-proxy serves nor NodeLocal DNSCache's address, and a `resolvConf` whose nameserver
//! is a loopback stub (127.0.0.53), which in a pod's namespace is the pod itself.
use std::net::IpAddr;

use serde::{Deserialize, Serialize};

use super::{
    config::{self, ResolvConf},
    finding::{Finding, FindingKind},
    iptables::Service,
};

/// Where kubelet's configuration is read, beneath `--host-root`.
pub const CONFIG: &str = "/var/lib/kubelet/config.yaml";
/// kubelet's default `resolvConf`.
pub const DEFAULT_RESOLV_CONF: &str = "/etc/resolv.conf";

#[derive(Debug, thiserror::Error)]
#[error("{CONFIG}: {0}")]
pub struct KubeletError(String);

/// The fields doctor reads (others ignored).
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct KubeletConfig {
    #[serde(default, rename = "clusterDNS")]
    pub cluster_dns: Vec<String>,
    #[serde(default)]
    pub resolv_conf: Option<String>,
}

/// Deepest flow collection (`[`, `{`) nesting, counted on the raw text (brackets in quoted
/// strings too: it can only over-count), or of block sequences begun on one line.
fn flow_depth(text: &str) -> usize {
    let (mut depth, mut max) = (0usize, 0usize);
    for b in text.bytes() {
        match b {
            b'[' | b'{' => {
                depth += 1;
                max = max.max(depth);
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    // Block sequences nested on one line: `- - - - x`.
    let dashes = text
        .lines()
        .map(|l| {
            let mut n = 0;
            let mut rest = l.trim_start();
            while let Some(r) = rest.strip_prefix('-') {
                if !(r.is_empty() || r.starts_with([' ', '\t'])) {
                    break;
                }
                n += 1;
                rest = r.trim_start();
            }
            n
        })
        .max()
        .unwrap_or(0);
    max.max(dashes)
}

/// Nesting beyond this is refused before the YAML parser sees it: libyaml takes time
/// quadratic in the depth before its own limit (50 000 `[` cost it 5 s).
const MAX_FLOW_DEPTH: usize = 64;

/// Parses the file's YAML; any input gives a value or an error.
pub fn parse(text: &str) -> Result<KubeletConfig, KubeletError> {
    if text.trim().is_empty() {
        return Ok(KubeletConfig::default());
    }
    let d = flow_depth(text);
    if d > MAX_FLOW_DEPTH {
        return Err(KubeletError(format!(
            "collections nested {d} deep (at most {MAX_FLOW_DEPTH})"
        )));
    }
    serde_yaml_ng::from_str(text).map_err(|e| {
        let mut m = e.to_string();
        m.truncate(m.char_indices().nth(300).map_or(m.len(), |(i, _)| i));
        KubeletError(m)
    })
}

/// What doctor read of kubelet (`checked.kubelet`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct KubeletSeen {
    pub cluster_dns: Vec<String>,
    pub resolv_conf: String,
    /// The nameservers of that file, as read beneath the host root.
    pub resolv_conf_nameservers: Vec<String>,
}

/// Findings from kubelet's `cfg`, `resolv` (its `resolvConf` file read beneath the host root,
/// if it was), the DNS Services of kube-proxy's rules and NodeLocal DNSCache's address.
pub fn findings(
    cfg: &KubeletConfig,
    resolv: Option<&ResolvConf>,
    services: &[Service],
    node_local: Option<IpAddr>,
) -> Vec<Finding> {
    let mut out = Vec::new();
    let dns: Vec<&Service> = services.iter().filter(|s| s.port == 53).collect();
    for c in &cfg.cluster_dns {
        let ip = c.parse::<IpAddr>().ok();
        let served = ip.is_some_and(|ip| dns.iter().any(|s| s.ip == ip) || Some(ip) == node_local);
        // Without kube-proxy's rules (none read) there is nothing to compare with.
        if served || services.is_empty() {
            continue;
        }
        let mut f =
            Finding::new(
                FindingKind::KubeletClusterDns,
                "kubelet",
                format!(
                "kubelet's clusterDNS {c} is not a DNS Service kube-proxy serves on this node{}",
                if node_local.is_some() { " nor NodeLocal DNSCache's address" } else { "" }
            ),
            );
        f.why = "kubelet writes clusterDNS as the nameserver of every ClusterFirst pod's resolv.conf: if nothing serves it, every lookup of those pods times out.".into();
        f.evidence.push(format!("{CONFIG}: clusterDNS: {c}"));
        for s in &dns {
            f.evidence.push(format!(
                "kube-proxy serves {}:{} ({})",
                s.ip,
                s.port,
                s.name.as_deref().unwrap_or("a Service")
            ));
        }
        if let Some(n) = node_local {
            f.evidence
                .push(format!("NodeLocal DNSCache listens on {n}:53"));
        }
        f.fix = "Set kubelet's `clusterDNS` to the kube-dns Service's ClusterIP (`kubectl -n kube-system get svc kube-dns`), or to NodeLocal DNSCache's address where it runs, then restart kubelet and recreate the pods.".into();
        out.push(f);
    }
    let file = cfg.resolv_conf.as_deref().unwrap_or(DEFAULT_RESOLV_CONF);
    if let Some(r) = resolv {
        let lo: Vec<String> = r
            .nameservers
            .iter()
            .filter(|n| n.is_loopback())
            .map(ToString::to_string)
            .collect();
        if !lo.is_empty() {
            let mut f = Finding::new(
                FindingKind::KubeletResolvConfLoopback,
                "kubelet",
                format!(
                    "kubelet's resolvConf {file} names the loopback stub {}: pods with `dnsPolicy: Default`, CoreDNS among them, get a nameserver that is their own loopback",
                    lo.join(", ")
                ),
            );
            f.why = "In a pod's network namespace 127.0.0.53 is the pod itself: CoreDNS forwarding to /etc/resolv.conf forwards to itself (the loop plugin exits, CrashLoopBackOff), and other Default-policy pods' lookups fail.".into();
            f.evidence.push(format!(
                "{CONFIG}: resolvConf: {}",
                cfg.resolv_conf
                    .as_deref()
                    .unwrap_or("(unset: /etc/resolv.conf)")
            ));
            f.evidence
                .push(format!("{file}: nameserver {}", lo.join(", nameserver ")));
            f.fix = "Set kubelet's `resolvConf: /run/systemd/resolve/resolv.conf` (systemd-resolved's real upstreams) in /var/lib/kubelet/config.yaml, restart kubelet, then restart the CoreDNS pods.".into();
            out.push(f);
        }
    }
    out
}

/// kubelet's `resolvConf` file's parse, for [`findings`].
pub fn resolv(text: &str) -> ResolvConf {
    config::parse_resolv_conf(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn svc() -> Vec<Service> {
        vec![Service {
            ip: "10.96.0.10".parse().unwrap(),
            port: 53,
            name: Some("kube-system/kube-dns:dns cluster IP".into()),
            backends: vec!["10.244.1.3:53".parse().unwrap()],
        }]
    }

    const KUBEADM: &str = "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nauthentication:\n  anonymous:\n    enabled: false\ncgroupDriver: systemd\nclusterDNS:\n- 10.96.0.10\nclusterDomain: cluster.local\nresolvConf: /run/systemd/resolve/resolv.conf\n";

    #[test]
    fn kubeadms_config_is_no_finding() {
        let c = parse(KUBEADM).unwrap();
        assert_eq!(c.cluster_dns, ["10.96.0.10"]);
        assert_eq!(
            c.resolv_conf.as_deref(),
            Some("/run/systemd/resolve/resolv.conf")
        );
        let r = resolv("nameserver 192.0.2.53\n");
        assert!(findings(&c, Some(&r), &svc(), None).is_empty());
    }

    #[test]
    fn cluster_dns_not_served_and_loopback_resolv_conf() {
        let c = parse("clusterDNS: [10.96.0.99]\n").unwrap();
        let r = resolv("nameserver 127.0.0.53\noptions edns0\n");
        let f = findings(&c, Some(&r), &svc(), None);
        let k: Vec<_> = f.iter().map(|f| f.kind).collect();
        assert_eq!(
            k,
            [
                FindingKind::KubeletClusterDns,
                FindingKind::KubeletResolvConfLoopback
            ]
        );
        assert!(f[0].seen.contains("10.96.0.99"), "{}", f[0].seen);
        assert!(f[1].seen.contains("/etc/resolv.conf"), "{}", f[1].seen);
        assert!(f[1]
            .fix
            .contains("resolvConf: /run/systemd/resolve/resolv.conf"));
        // NodeLocal's address is served; without kube-proxy's rules nothing is judged.
        let c = parse("clusterDNS: [169.254.20.10]\n").unwrap();
        assert!(findings(&c, None, &svc(), "169.254.20.10".parse().ok()).is_empty());
        assert!(!findings(&c, None, &svc(), None).is_empty());
        assert!(findings(&c, None, &[], None).is_empty());
    }

    #[test]
    fn hostile_yaml_is_an_error_not_a_panic() {
        for bad in [
            "clusterDNS: 10.96.0.10\n",
            "clusterDNS: [",
            "- a\n- b\n",
            "\t\u{0}: :",
        ] {
            assert!(parse(bad).is_err(), "{bad:?}");
        }
        // Deep nesting is refused before libyaml's quadratic walk (it took 5 s for this
        // one, 2.3 s for a MiB of `- `).
        let t = std::time::Instant::now();
        let deep = format!("clusterDNS: {}", "[".repeat(50_000));
        assert!(parse(&deep)
            .unwrap_err()
            .to_string()
            .contains("nested 50000 deep"));
        assert!(parse(&"- ".repeat(500_000)).is_err());
        assert!(
            t.elapsed() < std::time::Duration::from_secs(1),
            "{:?}",
            t.elapsed()
        );
        assert!(parse("clusterDNS:\n- - - [[1]]\n").is_err());
        // Billion laughs: aliases expanded into a huge document are refused.
        let mut laughs = String::from(
            "a: &a [\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\"]\n",
        );
        for i in 1..9 {
            let p = (b'a' + i - 1) as char;
            let n = (b'a' + i) as char;
            laughs.push_str(&format!(
                "{n}: &{n} [*{p},*{p},*{p},*{p},*{p},*{p},*{p},*{p},*{p}]\n"
            ));
        }
        let _ = parse(&laughs);
        // A self-referencing alias in a field doctor ignores, and in one it reads.
        let _ = parse("a: &a [*a]\n");
        let _ = parse("clusterDNS: &a [*a]\n");
        assert_eq!(parse("").unwrap(), KubeletConfig::default());
        assert_eq!(
            parse("# only a comment\n").unwrap(),
            KubeletConfig::default()
        );
    }
}
