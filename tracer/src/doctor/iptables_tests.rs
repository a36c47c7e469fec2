use super::*;

/// The lab's rules (tests/src/kube_proxy.rs), as `iptables-save -t nat` prints them.
pub(in crate::doctor) const LAB_NAT: &str = r#"*nat
:PREROUTING ACCEPT [0:0]
:KUBE-SERVICES - [0:0]
:KUBE-SVC-DNS-UDP - [0:0]
-A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A KUBE-MARK-MASQ -j MARK --set-xmark 0x4000/0x4000
-A KUBE-SERVICES -d 10.96.0.10/32 -p udp -m comment --comment "kube-system/kube-dns:dns cluster IP" -m udp --dport 53 -j KUBE-SVC-DNS-UDP
-A KUBE-SVC-DNS-UDP -m statistic --mode random --probability 0.50000000000 -j KUBE-SEP-DNS-UDP-A
-A KUBE-SVC-DNS-UDP -j KUBE-SEP-DNS-UDP-B
-A KUBE-SEP-DNS-UDP-A -s 10.244.1.3/32 -j KUBE-MARK-MASQ
-A KUBE-SEP-DNS-UDP-A -p udp -m udp -j DNAT --to-destination 10.244.1.3:53
-A KUBE-SEP-DNS-UDP-B -p udp -m udp -j DNAT --to-destination 10.244.1.4:53
COMMIT
"#;

#[test]
fn kube_proxy_rules_give_the_service_backends() {
    let s = parse_iptables_nat(LAB_NAT);
    assert_eq!(s.len(), 1, "{s:?}");
    assert_eq!(s[0].ip, "10.96.0.10".parse::<IpAddr>().unwrap());
    assert_eq!(s[0].port, 53);
    assert_eq!(
        s[0].name.as_deref(),
        Some("kube-system/kube-dns:dns cluster IP")
    );
    assert_eq!(
        s[0].backends,
        [
            "10.244.1.3:53".parse().unwrap(),
            "10.244.1.4:53".parse().unwrap()
        ] as [SocketAddr; 2]
    );
}

#[test]
fn hostile_iptables_text_does_not_panic() {
    for t in [
        "",
        "-A",
        "-A X -j",
        "-A KUBE-SERVICES -d -j",
        "-A KUBE-SERVICES -d 1.2.3.4/32 --dport 99999 -j X",
        "-A X -j X\n-A KUBE-SERVICES -d 1.1.1.1/32 --dport 53 -j X",
        "-A X -j DNAT --to-destination",
        "\"\"\"",
    ] {
        let _ = parse_iptables_nat(t);
    }
}
