//! kube-proxy's rules: an nftables table as `nft -j` 1.0.6 lists the lab's
//! kube-proxy-shaped one (tests/src/kube_proxy.rs), ipvs's `/proc/net/ip_vs`.
use super::*;

/// `nft -j list table ip kube-proxy` of the lab's rule set (maps and rules).
const NFT: &str = r#"{"nftables":[{"map":{"family":"ip","name":"no-endpoint-services","table":"kube-proxy","type":["ipv4_addr","inet_proto","inet_service"],"handle":11,"comment":"vmap to drop or reject packets to services with no endpoints","map":"verdict","elem":[[{"elem":{"val":{"concat":["10.96.0.99","udp",53]},"comment":"kube-system/nodns:dns"}},{"goto":{"target":"reject-chain"}}]]}},{"map":{"family":"ip","name":"service-ips","table":"kube-proxy","type":["ipv4_addr","inet_proto","inet_service"],"handle":12,"comment":"ClusterIP, ExternalIP and LoadBalancer IP traffic","map":"verdict","elem":[[{"elem":{"val":{"concat":["10.96.0.10","udp",53]},"comment":"kube-system/kube-dns:dns"}},{"goto":{"target":"service-ULMVA6XW-kube-system/kube-dns/udp/dns"}}]]}},{"rule":{"family":"ip","table":"kube-proxy","chain":"mark-for-masquerade","handle":13,"expr":[{"mangle":{"key":{"meta":{"key":"mark"}},"value":{"|":[{"meta":{"key":"mark"}},16384]}}}]}},{"rule":{"family":"ip","table":"kube-proxy","chain":"masquerading","handle":14,"expr":[{"match":{"op":"==","left":{"&":[{"meta":{"key":"mark"}},16384]},"right":0}},{"return":null}]}},{"rule":{"family":"ip","table":"kube-proxy","chain":"masquerading","handle":15,"expr":[{"mangle":{"key":{"meta":{"key":"mark"}},"value":{"^":[{"meta":{"key":"mark"}},16384]}}}]}},{"rule":{"family":"ip","table":"kube-proxy","chain":"masquerading","handle":16,"expr":[{"masquerade":{"flags":"fully-random"}}]}},{"rule":{"family":"ip","table":"kube-proxy","chain":"services","handle":17,"expr":[{"vmap":{"key":{"concat":[{"payload":{"protocol":"ip","field":"daddr"}},{"meta":{"key":"l4proto"}},{"payload":{"protocol":"th","field":"dport"}}]},"data":"@service-ips"}}]}},{"rule":{"family":"ip","table":"kube-proxy","chain":"nat-prerouting","handle":18,"expr":[{"jump":{"target":"services"}}]}},{"rule":{"family":"ip","table":"kube-proxy","chain":"nat-output","handle":19,"expr":[{"jump":{"target":"services"}}]}},{"rule":{"family":"ip","table":"kube-proxy","chain":"reject-chain","handle":20,"expr":[{"reject":{"type":"icmp","expr":"port-unreachable"}}]}},{"rule":{"family":"ip","table":"kube-proxy","chain":"filter-forward","handle":21,"expr":[{"vmap":{"key":{"concat":[{"payload":{"protocol":"ip","field":"daddr"}},{"meta":{"key":"l4proto"}},{"payload":{"protocol":"th","field":"dport"}}]},"data":"@no-endpoint-services"}}]}},{"rule":{"family":"ip","table":"kube-proxy","chain":"endpoint-AAAAAAAA-kube-system/kube-dns/udp/dns__10.244.1.3/53","handle":22,"expr":[{"match":{"op":"==","left":{"payload":{"protocol":"ip","field":"saddr"}},"right":"10.244.1.3"}},{"jump":{"target":"mark-for-masquerade"}}]}},{"rule":{"family":"ip","table":"kube-proxy","chain":"endpoint-AAAAAAAA-kube-system/kube-dns/udp/dns__10.244.1.3/53","handle":23,"expr":[{"match":{"op":"==","left":{"meta":{"key":"l4proto"}},"right":"udp"}},{"dnat":{"addr":"10.244.1.3","port":53}}]}},{"rule":{"family":"ip","table":"kube-proxy","chain":"endpoint-BBBBBBBB-kube-system/kube-dns/udp/dns__10.244.1.4/53","handle":24,"expr":[{"match":{"op":"==","left":{"payload":{"protocol":"ip","field":"saddr"}},"right":"10.244.1.4"}},{"jump":{"target":"mark-for-masquerade"}}]}},{"rule":{"family":"ip","table":"kube-proxy","chain":"endpoint-BBBBBBBB-kube-system/kube-dns/udp/dns__10.244.1.4/53","handle":25,"expr":[{"match":{"op":"==","left":{"meta":{"key":"l4proto"}},"right":"udp"}},{"dnat":{"addr":"10.244.1.4","port":53}}]}},{"rule":{"family":"ip","table":"kube-proxy","chain":"service-ULMVA6XW-kube-system/kube-dns/udp/dns","handle":26,"expr":[{"match":{"op":"==","left":{"payload":{"protocol":"ip","field":"daddr"}},"right":"10.96.0.10"}},{"match":{"op":"==","left":{"payload":{"protocol":"udp","field":"dport"}},"right":53}},{"match":{"op":"!=","left":{"payload":{"protocol":"ip","field":"saddr"}},"right":{"prefix":{"addr":"10.244.0.0","len":16}}}},{"jump":{"target":"mark-for-masquerade"}}]}},{"rule":{"family":"ip","table":"kube-proxy","chain":"service-ULMVA6XW-kube-system/kube-dns/udp/dns","handle":28,"expr":[{"vmap":{"key":{"numgen":{"mode":"random","mod":2,"offset":0}},"data":{"set":[[0,{"goto":{"target":"endpoint-AAAAAAAA-kube-system/kube-dns/udp/dns__10.244.1.3/53"}}],[1,{"goto":{"target":"endpoint-BBBBBBBB-kube-system/kube-dns/udp/dns__10.244.1.4/53"}}]]}}}]}}]}"#;

#[test]
fn nftables_services_backends_and_no_endpoints() {
    let (s, n) = parse_nft_json(NFT).unwrap();
    assert_eq!(s.len(), 1, "{s:?}");
    assert_eq!(s[0].ip, IpAddr::from([10, 96, 0, 10]));
    assert_eq!(s[0].port, 53);
    assert_eq!(s[0].name.as_deref(), Some("kube-system/kube-dns:dns"));
    let b: Vec<String> = s[0].backends.iter().map(ToString::to_string).collect();
    assert_eq!(b, ["10.244.1.3:53", "10.244.1.4:53"]);
    assert_eq!(n.len(), 1, "{n:?}");
    assert_eq!(n[0].addr.to_string(), "10.96.0.99:53");
    assert_eq!(n[0].name.as_deref(), Some("kube-system/nodns:dns"));
    assert!(n[0].rule.contains("goto reject-chain"), "{n:?}");
}

#[test]
fn nftables_without_comments_names_from_the_chain_and_hostile_json_is_an_error() {
    let bare = NFT.replace(
        r#"{"elem":{"val":{"concat":["10.96.0.10","udp",53]},"comment":"kube-system/kube-dns:dns"}}"#,
        r#"{"concat":["10.96.0.10","udp",53]}"#,
    );
    assert_ne!(bare, NFT);
    let (s, _) = parse_nft_json(&bare).unwrap();
    assert_eq!(s[0].name.as_deref(), Some("kube-system/kube-dns:dns"));
    assert!(parse_nft_json("{").is_err());
    assert!(parse_nft_json("[1,2]").unwrap().0.is_empty());
    let deep = "[".repeat(100_000);
    assert!(parse_nft_json(&deep).is_err());
    // A rule jumping to itself ends.
    let self_loop = r#"{"nftables":[{"map":{"name":"service-ips","elem":[[{"concat":["10.96.0.10","udp",53]},{"goto":{"target":"a"}}]]}},{"rule":{"chain":"a","expr":[{"jump":{"target":"a"}}]}}]}"#;
    let (s, _) = parse_nft_json(self_loop).unwrap();
    assert!(s[0].backends.is_empty());
}

#[test]
fn ipvs_virtual_services_and_real_servers() {
    let text = "IP Virtual Server version 1.2.1 (size=4096)\nProt LocalAddress:Port Scheduler Flags\n  -> RemoteAddress:Port Forward Weight ActiveConn InActConn\nUDP  0A60000A:0035 rr\n  -> 0AF40103:0035      Masq    1      0          0\n  -> 0AF40104:0035      Masq    1      0          0\nTCP  0A600001:01BB rr\n  -> AC120002:192B      Masq    1      0          0\nUDP  0A600063:0035 rr\n";
    let s = parse_ip_vs(text);
    assert_eq!(s.len(), 3, "{s:?}");
    assert_eq!(s[0].ip, IpAddr::from([10, 96, 0, 10]));
    assert_eq!(s[0].port, 53);
    let b: Vec<String> = s[0].backends.iter().map(ToString::to_string).collect();
    assert_eq!(b, ["10.244.1.3:53", "10.244.1.4:53"]);
    assert!(s[2].backends.is_empty());
    assert!(parse_ip_vs("  -> 0AF40103:0035\nUDP zz:1\n").is_empty());
}

#[test]
fn modes_from_rules_table_and_device() {
    let nat = "-A KUBE-SERVICES -d 10.96.0.10/32 -p udp -m udp --dport 53 -j KUBE-SVC-X\n";
    let dev = "Inter-|   Receive\n face |bytes\n    lo: 0 0\nkube-ipvs0: 0 0\n";
    assert_eq!(modes(nat, false, &[], ""), ["iptables"]);
    assert_eq!(modes("", true, &[], ""), ["nftables"]);
    assert_eq!(
        modes(
            "-A KUBE-SERVICES -m set --match-set KUBE-CLUSTER-IP dst,dst -j ACCEPT",
            false,
            &[],
            dev
        ),
        ["ipvs"]
    );
    assert!(modes("", false, &[], "    lo: 0 0\n").is_empty());
}
