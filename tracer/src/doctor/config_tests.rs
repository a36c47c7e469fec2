use super::*;

fn addr(s: &str) -> Target {
    Target::Addr(s.parse().unwrap())
}

/// Inputs no parser may panic on.
fn hostile() -> Vec<String> {
    let mut v: Vec<String> = [
        "",
        "\0\0\0",
        "forward",
        "forward .",
        "forward . {",
        "forward . 999.1.1.1",
        "forward . [::1",
        "newServer(",
        "newServer({",
        "newServer({address=",
        "newServer({address='",
        "newServer({address='10.0.0.1:99999'})",
        "newServer(\"",
        "forward-addr:",
        "forward-addr: @",
        "forward-addr: 1.2.3.4@",
        "server=",
        "server=/",
        "server=//",
        "server=1.2.3.4#",
        "server=1.2.3.4#x",
        "nameserver",
        "options ndots:",
        "options ndots:99999999999999999999",
        "options ndots:-1",
        "ñ=\u{202e}forward . 1.1.1.1",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    v.push("a".repeat(100_000));
    v.push("newServer(".repeat(10_000));
    v.push("forward . ".to_string() + &"1.1.1.1 ".repeat(10_000));
    v
}

#[test]
fn no_parser_panics_on_hostile_input() {
    for h in hostile() {
        let _ = parse_resolv_conf(&h);
        let _ = corefile_forwards("Corefile", &h);
        let _ = dnsdist_forwards("d.conf", &h);
        let _ = unbound_forwards("u.conf", &h);
        let mut c = DnsmasqConf::default();
        let _ = dnsmasq_conf("m.conf", &h, &mut c);
        let _ = dnsmasq_args(std::slice::from_ref(&h));
        let _ = dnsmasq_args(&["-S".into()]);
        let _ = dnsmasq_args(&["--server".into()]);
        let _ = arg_value(std::slice::from_ref(&h), &["-C", "--config"]);
    }
}

#[test]
fn resolv_conf_kubernetes_pod() {
    let r = parse_resolv_conf(
        "search default.svc.cluster.local svc.cluster.local cluster.local\n\
         nameserver 10.96.0.10\n# comment\noptions ndots:5 single-request-reopen\n",
    );
    assert_eq!(r.nameservers, ["10.96.0.10".parse::<IpAddr>().unwrap()]);
    assert_eq!(r.search.len(), 3);
    assert_eq!(r.ndots, Some(5));
    assert_eq!(r.options, ["single-request-reopen"]);
    assert!(r.problems.is_empty());
}

#[test]
fn resolv_conf_bad_lines_are_problems_not_panics() {
    let r = parse_resolv_conf(
        "nameserver banana\nnameserver\noptions ndots:x ndots:40\nnameserver fe80::1%eth0\n",
    );
    assert_eq!(r.problems.len(), 3, "{:?}", r.problems);
    assert_eq!(r.ndots, Some(15), "glibc caps ndots at 15");
    assert_eq!(r.nameservers.len(), 1);
}

#[test]
fn corefile_forward_lines() {
    let f = corefile_forwards(
        "/etc/coredns/Corefile",
        ".:53 {\n    errors\n    forward . 10.96.0.10 dns://8.8.8.8:5353 /etc/resolv.conf {\n       max_concurrent 1000\n    }\n    # forward . 1.1.1.1\n}\nexample.org {\n forward . tls://9.9.9.9\n}\n",
    )
    .unwrap();
    let t: Vec<_> = f.iter().map(|f| f.target.clone()).collect();
    assert_eq!(
        t,
        [
            addr("10.96.0.10:53"),
            addr("8.8.8.8:5353"),
            Target::ResolvConf("/etc/resolv.conf".into()),
            addr("9.9.9.9:853")
        ]
    );
    assert_eq!(f[0].at.line, 3);
    assert!(f[0].at.text.starts_with("forward . 10.96.0.10"));
}

#[test]
fn corefile_errors_say_where() {
    let e = corefile_forwards("Corefile", ".:53 {\n forward . banana\n}").unwrap_err();
    assert_eq!(e.to_string(), "Corefile:2: \"banana\" is not an address");
    assert!(corefile_forwards("Corefile", "forward .").is_err());
}

#[test]
fn dnsmasq_args_and_conf() {
    let args: Vec<String> = [
        "-k",
        "-C",
        "/dev/null",
        "--no-resolv",
        "--server=10.96.0.10#53",
        "-S",
        "/cluster.local/10.0.0.9",
        "--server=/local/",
        "-S1.1.1.1",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let c = dnsmasq_args(&args).unwrap();
    assert!(c.no_resolv);
    assert_eq!(c.conf_files, ["/dev/null"]);
    let t: Vec<_> = c.targets("argv").into_iter().map(|f| f.target).collect();
    assert_eq!(
        t,
        [
            addr("10.96.0.10:53"),
            addr("10.0.0.9:53"),
            addr("1.1.1.1:53")
        ]
    );

    let mut c = DnsmasqConf::default();
    dnsmasq_conf(
        "/etc/dnsmasq.conf",
        "# x\nserver=127.0.0.53#53\nresolv-file=/run/r.conf\ncache-size=0\n",
        &mut c,
    )
    .unwrap();
    let t: Vec<_> = c.targets("m").into_iter().map(|f| f.target).collect();
    assert_eq!(
        t,
        [
            addr("127.0.0.53:53"),
            Target::ResolvConf("/run/r.conf".into())
        ]
    );
    assert_eq!(c.forwards[0].at.line, 2);
    assert!(dnsmasq_args(&["--server=banana".into()]).is_err());
}

#[test]
fn dnsdist_new_server() {
    let f = dnsdist_forwards(
        "/tmp/dnsdist.conf",
        "setLocal('0.0.0.0:53')\n-- newServer({address='1.1.1.1'})\nnewServer({address='10.96.0.10:53'}):setUp()\nnewServer(\"8.8.8.8\")\nnewServer({ name='x', address = \"[fd00::1]:5353\" })\n",
    )
    .unwrap();
    let t: Vec<_> = f.iter().map(|f| f.target.clone()).collect();
    assert_eq!(
        t,
        [
            addr("10.96.0.10:53"),
            addr("8.8.8.8:53"),
            addr("[fd00::1]:5353")
        ]
    );
    assert_eq!(f[0].at.line, 3);
    let e = dnsdist_forwards("d", "newServer({address='nope'})").unwrap_err();
    assert_eq!(e.to_string(), "d:1: \"nope\" is not an address");
}

#[test]
fn unbound_forward_addr() {
    let f = unbound_forwards(
        "/etc/unbound/unbound.conf",
        "server:\n  local-zone: \"test.\" nodefault\nforward-zone:\n  name: \".\"\n  forward-addr: 10.96.0.10@53\n  forward-addr: 1.1.1.1#cloudflare-dns.com\n  # forward-addr: 2.2.2.2\n",
    )
    .unwrap();
    let t: Vec<_> = f.iter().map(|f| f.target.clone()).collect();
    assert_eq!(t, [addr("10.96.0.10:53"), addr("1.1.1.1:53")]);
    assert!(unbound_forwards("u", "forward-addr: x@y").is_err());
}

#[test]
fn arg_values() {
    let a: Vec<String> = ["--supervised", "-C", "/a.conf"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    assert_eq!(arg_value(&a, &["-C", "--config"]), Some("/a.conf"));
    let a: Vec<String> = ["--config=/b.conf"].iter().map(|s| s.to_string()).collect();
    assert_eq!(arg_value(&a, &["-C", "--config"]), Some("/b.conf"));
    let a: Vec<String> = ["-conf", "/etc/coredns/Corefile"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    assert_eq!(arg_value(&a, &["-conf"]), Some("/etc/coredns/Corefile"));
    assert_eq!(
        ServerKind::from_program("/usr/sbin/dnsdist"),
        Some(ServerKind::Dnsdist)
    );
}

#[test]
fn resolved_conf_dns_lines() {
    let mut dns = Vec::new();
    resolved_conf_dns(
        "/etc/systemd/resolved.conf",
        "# See resolved.conf(5)\n[Resolve]\nDNS=10.96.0.10 1.1.1.1:5353#one.one.one.one fd00::53%eth0\n#DNS=9.9.9.9\nFallbackDNS=8.8.8.8\nDNS=not-an-address\n[Other]\nDNS=7.7.7.7\n",
        &mut dns,
    );
    let a: Vec<_> = dns.iter().map(|(a, _)| *a).collect();
    assert_eq!(
        a,
        [
            "10.96.0.10:53".parse().unwrap(),
            "1.1.1.1:5353".parse().unwrap(),
            "[fd00::53]:53".parse().unwrap()
        ]
    );
    assert_eq!(dns[0].1.line, 3);
    assert!(dns[0].1.text.starts_with("DNS=10.96.0.10"));
    // A later drop-in's empty `DNS=` empties the list, the next line adds again.
    resolved_conf_dns(
        "/etc/systemd/resolved.conf.d/x.conf",
        "[Resolve]\nDNS=\nDNS=10.250.0.53\n",
        &mut dns,
    );
    assert_eq!(dns.len(), 1);
    assert_eq!(dns[0].0, "10.250.0.53:53".parse().unwrap());
    assert_eq!(dns[0].1.file, "/etc/systemd/resolved.conf.d/x.conf");
    // Hostile bytes: skipped, no panic.
    resolved_conf_dns("f", "[Resolve]\nDNS=[[[:::\u{0}\nDNS==\n=\n[", &mut dns);
    assert_eq!(dns.len(), 1);
}

#[test]
fn resolv_conf_nameserver_line_numbers() {
    let l = resolv_conf_nameserver_lines(
        "# This is /run/systemd/resolve/resolv.conf managed by man:systemd-resolved(8).\n\nnameserver 10.96.0.10\nnameserver fe80::1%eth0\nnameserver bogus\nsearch .\n",
    );
    assert_eq!(l.len(), 2);
    assert_eq!(
        l[0],
        (
            "10.96.0.10".parse().unwrap(),
            3,
            "nameserver 10.96.0.10".to_string()
        )
    );
    assert_eq!(l[1].1, 4);
}
