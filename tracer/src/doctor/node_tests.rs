use super::*;
use crate::doctor::{
    finding::ConfigLine,
    iptables::{parse_iptables_nat, tests::LAB_NAT},
};

fn server(pid: u32, addr: &str, ns: u64, forwards: Vec<Forward>) -> DnsServer {
    DnsServer {
        pid,
        kind: Some(ServerKind::Dnsdist),
        program: "dnsdist".into(),
        args: Vec::new(),
        netns: (1, ns),
        addrs: vec![addr.parse().unwrap()],
        pod: Some(format!("kube-system/coredns-{pid}")),
        on_node: false,
        forwards: Ok(forwards),
    }
}

fn fwd(target: Target, text: &str) -> Forward {
    Forward {
        target,
        at: ConfigLine {
            file: "/etc/dnsdist.conf".into(),
            line: 6,
            text: text.into(),
        },
    }
}

fn no_files(_: u32, p: &str) -> Result<String, ConfigError> {
    Err(ConfigError::File {
        file: p.into(),
        what: "absent".into(),
    })
}

#[test]
fn forwarding_to_its_own_cluster_ip_is_a_static_loop() {
    let line = "newServer({address='10.96.0.10:53'}):setUp()";
    let to_svc = || vec![fwd(Target::Addr("10.96.0.10:53".parse().unwrap()), line)];
    let view = NodeView {
        servers: vec![
            server(10, "10.244.1.3", 1, to_svc()),
            server(11, "10.244.1.4", 2, to_svc()),
        ],
        services: parse_iptables_nat(LAB_NAT),
        ..Default::default()
    };
    let f = static_loops_with(&view, &no_files);
    assert_eq!(f.len(), 2, "{f:#?}");
    assert_eq!(f[0].kind, FindingKind::StaticForwardingLoop);
    assert_eq!(f[0].config.as_ref().unwrap().text, line);
    assert!(f[0].evidence[0].contains("kube-dns"), "{:?}", f[0].evidence);
}

#[test]
fn forwarding_upstream_is_no_loop() {
    let view = NodeView {
        servers: vec![server(
            10,
            "10.244.1.3",
            1,
            vec![fwd(Target::Addr("10.250.0.53:53".parse().unwrap()), "x")],
        )],
        services: parse_iptables_nat(LAB_NAT),
        ..Default::default()
    };
    assert!(static_loops_with(&view, &no_files).is_empty());
}

#[test]
fn resolv_conf_leading_to_a_stub_that_forwards_to_the_service_is_a_loop() {
    // CoreDNS: forward . /etc/resolv.conf; its resolv.conf (the node's) says 127.0.0.53,
    // where a stub in the same namespace forwards to the ClusterIP, backed by CoreDNS.
    let mut core = server(
        10,
        "10.244.1.3",
        1,
        vec![fwd(
            Target::ResolvConf("/etc/resolv.conf".into()),
            "forward . /etc/resolv.conf",
        )],
    );
    core.kind = Some(ServerKind::CoreDns);
    let stub = server(
        12,
        "10.244.1.3",
        1,
        vec![fwd(
            Target::Addr("10.96.0.10:53".parse().unwrap()),
            "server=10.96.0.10",
        )],
    );
    let view = NodeView {
        servers: vec![core, stub],
        services: parse_iptables_nat(LAB_NAT),
        ..Default::default()
    };
    let read = |_: u32, p: &str| -> Result<String, ConfigError> {
        assert_eq!(p, "/etc/resolv.conf");
        Ok("nameserver 127.0.0.53\n".into())
    };
    let f = static_loops_with(&view, &read);
    assert!(!f.is_empty());
    assert_eq!(
        f[0].config.as_ref().unwrap().text,
        "forward . /etc/resolv.conf"
    );
    assert!(
        f[0].evidence.iter().any(|e| e.contains("127.0.0.53")),
        "{:#?}",
        f[0].evidence
    );
}

/// The node's systemd-resolved (in the node's namespace) whose `DNS=` is `dns`.
fn node_resolved(dns: &str) -> DnsServer {
    DnsServer {
        pid: 7,
        kind: Some(ServerKind::SystemdResolved),
        program: "/lib/systemd/systemd-resolved".into(),
        args: Vec::new(),
        netns: (1, 99),
        addrs: vec!["169.254.1.1".parse().unwrap()],
        pod: None,
        on_node: true,
        forwards: Ok(vec![Forward {
            target: Target::Addr(format!("{dns}:53").parse().unwrap()),
            at: ConfigLine {
                file: "/etc/systemd/resolved.conf".into(),
                line: 2,
                text: format!("DNS={dns}"),
            },
        }]),
    }
}

#[test]
fn the_node_stub_forwarding_to_cluster_dns_is_named_with_its_config_line() {
    let rc = crate::doctor::config::parse_resolv_conf("nameserver 127.0.0.53\nsearch .\n");
    let servers = vec![node_resolved("10.96.0.10")];
    let ns = node_nameservers(&rc, &servers);
    assert_eq!(ns.len(), 1, "{ns:?}");
    assert_eq!(ns[0].ip.to_string(), "10.96.0.10");
    assert!(
        ns[0].how.contains("the node's systemd-resolved (pid 7)"),
        "{ns:?}"
    );
    let view = NodeView {
        servers,
        services: parse_iptables_nat(LAB_NAT),
        node_nameservers: ns,
        ..Default::default()
    };
    let f = resolv_findings(&view);
    assert_eq!(f.len(), 1, "{f:#?}");
    assert_eq!(f[0].kind, FindingKind::NodeResolverToClusterDns);
    assert_eq!(f[0].config.as_ref().unwrap().text, "DNS=10.96.0.10");
    assert!(
        f[0].fix.contains("/etc/systemd/resolved.conf"),
        "{}",
        f[0].fix
    );
    assert!(f[0].evidence.iter().any(|e| e.contains("DNAT")), "{f:#?}");
}

#[test]
fn the_node_stub_forwarding_upstream_is_no_finding() {
    let rc = crate::doctor::config::parse_resolv_conf("nameserver 127.0.0.53\n");
    let servers = vec![node_resolved("10.250.0.53")];
    let ns = node_nameservers(&rc, &servers);
    assert_eq!(ns[0].ip.to_string(), "10.250.0.53");
    let view = NodeView {
        servers,
        services: parse_iptables_nat(LAB_NAT),
        node_nameservers: ns,
        ..Default::default()
    };
    assert!(resolv_findings(&view).is_empty());
    assert!(static_loops_with(&view, &no_files).is_empty());
}

#[test]
fn a_pod_forwarding_to_the_node_stub_that_forwards_to_its_service_is_a_loop() {
    // dnsdist pods forward to the node's address, where systemd-resolved listens
    // (DNSStubListenerExtra=); resolved's DNS= is the ClusterIP, DNAT'd to the pods.
    let to_node = || {
        vec![fwd(
            Target::Addr("169.254.1.1:53".parse().unwrap()),
            "newServer({address='169.254.1.1:53'})",
        )]
    };
    let view = NodeView {
        servers: vec![
            server(10, "10.244.1.3", 1, to_node()),
            server(11, "10.244.1.4", 2, to_node()),
            node_resolved("10.96.0.10"),
        ],
        services: parse_iptables_nat(LAB_NAT),
        ..Default::default()
    };
    let f = static_loops_with(&view, &no_files);
    let r = f
        .iter()
        .find(|f| f.subject.contains("systemd-resolved"))
        .expect("the stub closes the cycle too");
    assert_eq!(r.config.as_ref().unwrap().text, "DNS=10.96.0.10");
    let pod = f.iter().find(|f| f.subject.contains("coredns-10")).unwrap();
    assert!(
        pod.evidence
            .iter()
            .any(|e| e.contains("/etc/systemd/resolved.conf:2")),
        "{:#?}",
        pod.evidence
    );
}
