//! Configuration of the lab's real DNS servers.

use std::fmt::Write;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::Path;

use crate::addr;

/// `named.conf` for the upstream: authoritative only, everything it writes under `dir`.
pub(crate) fn named_conf(dir: &Path) -> String {
    let d = dir.display();
    format!(
        r#"options {{
    directory "{d}";
    pid-file none;
    session-keyfile "{d}/session.key";
    managed-keys-directory "{d}";
    listen-on {{ any; }};
    listen-on-v6 {{ any; }};
    recursion no;
    allow-query {{ any; }};
    dnssec-validation no;
    notify no;
    minimal-responses yes;
}};
controls {{ }};
logging {{
    channel lab {{ stderr; severity info; print-time yes; print-category yes; }};
    category default {{ lab; }};
    category lame-servers {{ null; }};
}};
zone "{zone}" {{ type primary; file "{d}/{zone}.zone"; }};
zone "cluster.local" {{ type primary; file "{d}/cluster.local.zone"; }};
"#,
        zone = addr::ZONE
    )
}

/// Zone `lab.test`.
pub(crate) fn lab_zone() -> String {
    let mut z = format!(
        "$TTL 300\n\
@ IN SOA ns.{zone}. hostmaster.{zone}. 1 3600 600 86400 300\n\
@ IN NS ns\n\
ns IN A {up}\n\
ns IN AAAA {up6}\n\
www IN A {a}\n\
www IN AAAA {aaaa}\n\
alias IN CNAME www\n\
_dns._udp IN SRV 0 100 53 ns\n\
txt IN TXT \"dnspath lab zone\"\n",
        zone = addr::ZONE,
        up = addr::UPSTREAM,
        up6 = addr::UPSTREAM6,
        a = addr::WWW_A,
        aaaa = addr::WWW_AAAA,
    );
    // Each record: 2 (compressed owner) + 10 (type, class, TTL, rdlength) + 1 + 60 bytes.
    let filler = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWX";
    for i in 0..8 {
        let _ = writeln!(z, "medium IN TXT \"{i:02}{}\"", &filler[2..]);
    }
    for i in 0..40 {
        let _ = writeln!(z, "big IN TXT \"{i:02}{}\"", &filler[2..]);
    }
    z
}

/// Zone `cluster.local`, empty: answers the client's search-list expansions
/// (`www.lab.test.default.svc.cluster.local`, ...) with NXDOMAIN, as CoreDNS's
/// `kubernetes` plugin would, instead of REFUSED.
pub(crate) fn cluster_local_zone() -> String {
    format!(
        "$TTL 30\n\
@ IN SOA ns.dns.cluster.local. hostmaster.cluster.local. 1 3600 600 86400 30\n\
@ IN NS ns.dns\n\
ns.dns IN A {up}\n\
kube-dns.kube-system.svc IN A {svc}\n",
        up = addr::UPSTREAM,
        svc = addr::CLUSTER_IP,
    )
}

/// dnsdist configuration: listen on every address of the pod (IPv4 and IPv6, including
/// loopback), accept everyone, forward everything to `forward_to`.
pub(crate) fn dnsdist_conf(forward_to: SocketAddr) -> String {
    format!(
        "setLocal('0.0.0.0:53')\n\
addLocal('[::]:53')\n\
setACL({{'0.0.0.0/0', '::/0'}})\n\
-- no security-status queries through the pod's resolv.conf\n\
setSecurityPollSuffix('')\n\
newServer({{address='{forward_to}'}}):setUp()\n"
    )
}

/// dnsmasq arguments (after the program name) for pod `ip`/`ip6` forwarding to `forward_to`.
pub(crate) fn dnsmasq_args(
    ip: Ipv4Addr,
    ip6: Ipv6Addr,
    forward_to: SocketAddr,
    pid_file: &Path,
) -> Vec<String> {
    let mut listen: Vec<IpAddr> = vec![
        ip.into(),
        ip6.into(),
        Ipv4Addr::LOCALHOST.into(),
        Ipv6Addr::LOCALHOST.into(),
    ];
    // A loop over the pod's own loopback (forward_to 127.0.0.53) needs dnsmasq there too.
    if forward_to.ip().is_loopback() && !listen.contains(&forward_to.ip()) {
        listen.push(forward_to.ip());
    }
    let mut args = vec![
        "-k".to_owned(),
        "-C".to_owned(),
        "/dev/null".to_owned(),
        "--no-resolv".to_owned(),
        "--no-hosts".to_owned(),
        "--user=root".to_owned(),
        "--log-facility=-".to_owned(),
        format!("--pid-file={}", pid_file.display()),
        format!("--server={}#{}", forward_to.ip(), forward_to.port()),
    ];
    args.extend(listen.iter().map(|a| format!("--listen-address={a}")));
    args
}
