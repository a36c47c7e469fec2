//! The lab's address plan. Fixed per lab instance: every lab lives in its own namespaces, so
//! two labs running at once can use the same addresses without seeing each other.

use std::net::{Ipv4Addr, Ipv6Addr};

/// Address every node-side pod veth carries (`/32`), the pods' default gateway
/// (Calico and kindnet-ptp style routed veths).
pub const NODE_GATEWAY: Ipv4Addr = Ipv4Addr::new(169, 254, 1, 1);
/// Link-local address every node-side pod veth carries (`/64`, `nodad`), the pods' IPv6
/// default gateway.
pub const NODE_GATEWAY6: Ipv6Addr = Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 1);

/// Client pod.
pub const CLIENT: Ipv4Addr = Ipv4Addr::new(10, 244, 1, 2);
/// Client pod, IPv6 (also what makes glibc's `AI_ADDRCONFIG` ask AAAA at all).
pub const CLIENT6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x244, 0, 0, 0, 0, 0, 2);

/// First "CoreDNS" pod; pod `i` gets `.3 + i`.
pub const DNS_FIRST: Ipv4Addr = Ipv4Addr::new(10, 244, 1, 3);
/// First "CoreDNS" pod, IPv6; pod `i` gets `::3 + i`.
pub const DNS_FIRST6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x244, 0, 0, 0, 0, 0, 3);

/// Upstream authoritative server (bind9) for [`ZONE`].
pub const UPSTREAM: Ipv4Addr = Ipv4Addr::new(10, 250, 0, 53);
/// Upstream authoritative server, IPv6.
pub const UPSTREAM6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x250, 0, 0, 0, 0, 0, 0x53);

/// The DNS Service's ClusterIP (kube-dns), DNAT'ed by the node's kube-proxy rules.
pub const CLUSTER_IP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 10);
/// Service CIDR, routed to a sink device in the node so node-originated (hostNetwork)
/// queries to the ClusterIP have a route before `nat OUTPUT` rewrites them.
pub const SERVICE_CIDR: (Ipv4Addr, u8) = (Ipv4Addr::new(10, 96, 0, 0), 12);

/// Zone the upstream serves.
pub const ZONE: &str = "lab.test";
/// `www.lab.test A`.
pub const WWW_A: Ipv4Addr = Ipv4Addr::new(10, 250, 0, 80);
/// `www.lab.test AAAA`.
pub const WWW_AAAA: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x250, 0, 0, 0, 0, 0, 0x80);
/// A TXT RRset of about 630 bytes on the wire: truncated over UDP without EDNS
/// (RFC 1035 section 4.2.1, 512 bytes), fits with EDNS.
pub const MEDIUM_TXT: &str = "medium.lab.test";
/// A TXT RRset of about 3 KB: truncated over UDP even with EDNS (bind's default
/// `max-udp-size` 1232), so every client must retry over TCP.
pub const BIG_TXT: &str = "big.lab.test";

/// Most "CoreDNS" pods one lab supports (`dnsa` .. `dnsh`).
pub const MAX_DNS_PODS: usize = 8;

/// IPv4 address of "CoreDNS" pod `i`.
pub fn dns_pod(i: usize) -> Ipv4Addr {
    let [a, b, c, d] = DNS_FIRST.octets();
    Ipv4Addr::new(a, b, c, d.wrapping_add(i as u8))
}

/// IPv6 address of "CoreDNS" pod `i`.
pub fn dns_pod6(i: usize) -> Ipv6Addr {
    let mut s = DNS_FIRST6.segments();
    s[7] = s[7].wrapping_add(i as u16);
    Ipv6Addr::from(s)
}
