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
