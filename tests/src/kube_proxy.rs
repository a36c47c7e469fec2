//! The node's kube-proxy (iptables mode) rules for the DNS Service, in the layout
//! kube-proxy's `syncProxyRules` writes (pkg/proxy/iptables/proxier.go).

use std::fmt::Write;
use std::net::Ipv4Addr;

use crate::addr;

/// `nat` chain every Service lookup starts in (from `PREROUTING` and `OUTPUT`).
pub const SERVICES_CHAIN: &str = "KUBE-SERVICES";
/// Per-Service chain for `kube-dns:53/udp`.
pub const SVC_UDP_CHAIN: &str = "KUBE-SVC-DNS-UDP";
/// Per-Service chain for `kube-dns:53/tcp`.
pub const SVC_TCP_CHAIN: &str = "KUBE-SVC-DNS-TCP";
/// Marks a connection for masquerading (hairpin: a pod reaching itself through the Service).
pub const MARK_MASQ_CHAIN: &str = "KUBE-MARK-MASQ";
pub const POSTROUTING_CHAIN: &str = "KUBE-POSTROUTING";
/// The mark `KUBE-MARK-MASQ` sets.
pub const MASQ_MARK: u32 = 0x4000;

/// Endpoint chain of DNS pod `i` for `proto` ("UDP"/"TCP"): `KUBE-SEP-DNS-UDP-A`, ...
pub fn sep_chain(proto: &str, i: usize) -> String {
    format!(
        "KUBE-SEP-DNS-{proto}-{}",
        pod_letter(i).to_ascii_uppercase()
    )
}

/// `a`, `b`, ... for DNS pod 0, 1, ...
pub(crate) fn pod_letter(i: usize) -> char {
    char::from(b'a' + (i % 26) as u8)
}

/// `iptables-restore` input for the `nat` table. `backends` are the DNS pods' addresses;
/// `pin` sends everything to one of them.
pub(crate) fn nat_ruleset(backends: &[Ipv4Addr], pin: Option<usize>) -> String {
    let mut r = String::new();
    let mark = format!("{MASQ_MARK:#x}/{MASQ_MARK:#x}");
    r.push_str("*nat\n:PREROUTING ACCEPT [0:0]\n:INPUT ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\n:POSTROUTING ACCEPT [0:0]\n");
    for chain in [
        SERVICES_CHAIN,
        POSTROUTING_CHAIN,
        MARK_MASQ_CHAIN,
        SVC_UDP_CHAIN,
        SVC_TCP_CHAIN,
    ] {
        let _ = writeln!(r, ":{chain} - [0:0]");
    }
    for proto in ["UDP", "TCP"] {
        for i in 0..backends.len() {
            let _ = writeln!(r, ":{} - [0:0]", sep_chain(proto, i));
        }
    }
    let _ = writeln!(
        r,
        "-A PREROUTING -m comment --comment \"kubernetes service portals\" -j {SERVICES_CHAIN}"
    );
    let _ = writeln!(
        r,
        "-A OUTPUT -m comment --comment \"kubernetes service portals\" -j {SERVICES_CHAIN}"
    );
    let _ = writeln!(r, "-A POSTROUTING -m comment --comment \"kubernetes postrouting rules\" -j {POSTROUTING_CHAIN}");
    let _ = writeln!(r, "-A {MARK_MASQ_CHAIN} -j MARK --set-xmark {mark}");
    let _ = writeln!(
        r,
        "-A {POSTROUTING_CHAIN} -m mark ! --mark {mark} -j RETURN"
    );
    let _ = writeln!(
        r,
        "-A {POSTROUTING_CHAIN} -j MARK --set-xmark {MASQ_MARK:#x}/0x0"
    );
    let _ = writeln!(
        r,
        "-A {POSTROUTING_CHAIN} -m comment --comment \"kubernetes service traffic requiring SNAT\" -j MASQUERADE --random-fully"
    );
    let cluster_ip = addr::CLUSTER_IP;
    for (proto, svc) in [("udp", SVC_UDP_CHAIN), ("tcp", SVC_TCP_CHAIN)] {
        let upper = proto.to_ascii_uppercase();
        let _ = writeln!(
            r,
            "-A {SERVICES_CHAIN} -d {cluster_ip}/32 -p {proto} -m comment --comment \"kube-system/kube-dns:dns{} cluster IP\" -m {proto} --dport 53 -j {svc}",
            if proto == "tcp" { "-tcp" } else { "" }
        );
        let chosen: Vec<usize> = match pin {
            Some(p) => vec![p],
            None => (0..backends.len()).collect(),
        };
        // kube-proxy gives endpoint k of n the probability 1/(n-k), the last one none:
        // a uniform choice overall.
        for (k, &i) in chosen.iter().enumerate() {
            let left = chosen.len() - k;
            let sep = sep_chain(&upper, i);
            if left > 1 {
                let _ = writeln!(
                    r,
                    "-A {svc} -m statistic --mode random --probability {:.11} -j {sep}",
                    1.0 / left as f64
                );
            } else {
                let _ = writeln!(r, "-A {svc} -j {sep}");
            }
        }
        for (i, pod) in backends.iter().enumerate() {
            let sep = sep_chain(&upper, i);
            let _ = writeln!(r, "-A {sep} -s {pod}/32 -j {MARK_MASQ_CHAIN}");
            let _ = writeln!(
                r,
                "-A {sep} -p {proto} -m {proto} -j DNAT --to-destination {pod}:53"
            );
        }
    }
    r.push_str("COMMIT\n");
    r
}

/// `nft -f` input for kube-proxy's nftables mode (pkg/proxy/nftables/proxier.go), the DNS
/// Service's UDP and TCP ports: table `ip kube-proxy` with its `service-ips` map (elements
/// `IP . PROTO . 53 : goto service-HASH-kube-system/kube-dns/PROTO/dns…`), a `service-…`
/// chain per port choosing an `endpoint-…` chain with `numgen random`, each endpoint's
/// `dnat to POD:53`, hooked in prerouting and output (dstnat), masquerade in postrouting; and
/// a `no-endpoint-services` map whose elements (`no_endpoints`: ClusterIP, comment) go to
/// `reject-chain` in the forward hook.
pub fn nft_ruleset(backends: &[Ipv4Addr], no_endpoints: &[(Ipv4Addr, &str)]) -> String {
    let cluster_ip = addr::CLUSTER_IP;
    let mut r = String::new();
    r.push_str(
        "table ip kube-proxy {\n\tcomment \"rules for kube-proxy\"\n\
\tmap no-endpoint-services {\n\t\ttype ipv4_addr . inet_proto . inet_service : verdict\n\t\tcomment \"vmap to drop or reject packets to services with no endpoints\"\n\t}\n\
\tmap service-ips {\n\t\ttype ipv4_addr . inet_proto . inet_service : verdict\n\t\tcomment \"ClusterIP, ExternalIP and LoadBalancer IP traffic\"\n\t}\n\
\tchain mark-for-masquerade {\n\t\tmeta mark set meta mark | 0x4000\n\t}\n\
\tchain masquerading {\n\t\ttype nat hook postrouting priority srcnat; policy accept;\n\t\tmeta mark & 0x4000 == 0 return\n\t\tmeta mark set meta mark ^ 0x4000\n\t\tmasquerade fully-random\n\t}\n\
\tchain services {\n\t\tip daddr . meta l4proto . th dport vmap @service-ips\n\t}\n\
\tchain nat-prerouting {\n\t\ttype nat hook prerouting priority dstnat; policy accept;\n\t\tjump services\n\t}\n\
\tchain nat-output {\n\t\ttype nat hook output priority -100; policy accept;\n\t\tjump services\n\t}\n\
\tchain reject-chain {\n\t\tcomment \"helper for @no-endpoint-services / @no-endpoint-nodeports\"\n\t\treject\n\t}\n\
\tchain filter-forward {\n\t\ttype filter hook forward priority -110; policy accept;\n\t\tip daddr . meta l4proto . th dport vmap @no-endpoint-services\n\t}\n\
\tchain filter-output {\n\t\ttype filter hook output priority -110; policy accept;\n\t\tip daddr . meta l4proto . th dport vmap @no-endpoint-services\n\t}\n",
    );
    let mut elements = Vec::new();
    for (proto, hash) in [("udp", "ULMVA6XW"), ("tcp", "SWWHDGQE")] {
        let port_name = if proto == "tcp" { "dns-tcp" } else { "dns" };
        let svc = format!("service-{hash}-kube-system/kube-dns/{proto}/{port_name}");
        let mut eps = Vec::new();
        for (i, pod) in backends.iter().enumerate() {
            let ep = format!(
                "endpoint-{}{}-kube-system/kube-dns/{proto}/{port_name}__{pod}/53",
                proto.to_ascii_uppercase(),
                pod_letter(i).to_ascii_uppercase()
            );
            let _ = write!(
                r,
                "\tchain {ep} {{\n\t\tip saddr {pod} jump mark-for-masquerade\n\t\tmeta l4proto {proto} dnat to {pod}:53\n\t}}\n"
            );
            eps.push(format!("{i} : goto {ep}"));
        }
        let _ = write!(
            r,
            "\tchain {svc} {{\n\t\tip daddr {cluster_ip} {proto} dport 53 ip saddr != 10.244.0.0/16 jump mark-for-masquerade\n\t\tnumgen random mod {} vmap {{ {} }}\n\t}}\n",
            eps.len(),
            eps.join(", ")
        );
        elements.push(format!(
            "add element ip kube-proxy service-ips {{ {cluster_ip} . {proto} . 53 comment \"kube-system/kube-dns:{port_name}\" : goto {svc} }}\n"
        ));
    }
    r.push_str("}\n");
    for e in elements {
        r.push_str(&e);
    }
    for (ip, comment) in no_endpoints {
        for proto in ["udp", "tcp"] {
            let _ = writeln!(
                r,
                "add element ip kube-proxy no-endpoint-services {{ {ip} . {proto} . 53 comment \"{comment}\" : goto reject-chain }}"
            );
        }
    }
    r
}
