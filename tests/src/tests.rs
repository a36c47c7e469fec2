use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::time::{Duration, Instant};

use super::bring_up::candidate_prefix;
use super::*;

macro_rules! require_root {
    () => {
        if !crate::tracer::root_or_skip("network namespaces, iptables") {
            return;
        }
    };
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn answers(o: &Output) -> Vec<String> {
    assert!(o.status.success(), "dig failed: {o:?}");
    stdout(o)
        .lines()
        .map(|l| l.trim().to_owned())
        .filter(|l| !l.is_empty())
        .collect()
}

/// A process is gone once /proc no longer lists it or lists it as a zombie.
fn alive(pid: u32) -> bool {
    match fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat
            .rsplit_once(") ")
            .is_some_and(|(_, rest)| !rest.starts_with('Z') && !rest.starts_with('X')),
        Err(_) => false,
    }
}

fn namespaces_with(prefix: &str) -> Vec<String> {
    fs::read_dir(NETNS_RUN_DIR)
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with(&format!("{prefix}-")))
                .collect()
        })
        .unwrap_or_default()
}

fn assert_gone(prefix: &str, pids: &[u32], dir: &Path) {
    assert_eq!(
        namespaces_with(prefix),
        Vec::<String>::new(),
        "namespaces left behind"
    );
    for pid in pids {
        assert!(!alive(*pid), "pid {pid} still alive");
    }
    assert!(!dir.exists(), "{} left behind", dir.display());
    let resolv = Path::new(NETNS_ETC_DIR).join(format!("{prefix}-client"));
    assert!(!resolv.exists(), "{} left behind", resolv.display());
}

#[test]
fn prefix_and_interface_names_fit() {
    for _ in 0..100 {
        let p = candidate_prefix();
        assert_eq!(p.len(), 6);
        assert!(p.starts_with("dp"));
        assert!(p[2..].chars().all(|c| c.is_ascii_hexdigit()));
        // Longest interface name: the client's veth. Linux IFNAMSIZ is 16 with the NUL.
        assert!(format!("{p}-client").len() <= 15);
    }
}

#[test]
fn kube_proxy_rules_spread_and_pin() {
    let backends = [addr::dns_pod(0), addr::dns_pod(1)];
    let spread = kube_proxy::nat_ruleset(&backends, None);
    assert!(spread.contains(
        "-A KUBE-SVC-DNS-UDP -m statistic --mode random --probability 0.50000000000 -j KUBE-SEP-DNS-UDP-A\n"
    ));
    assert!(spread.contains("-A KUBE-SVC-DNS-UDP -j KUBE-SEP-DNS-UDP-B\n"));
    assert!(spread
        .contains("-A KUBE-SEP-DNS-TCP-B -p tcp -m tcp -j DNAT --to-destination 10.244.1.4:53\n"));
    assert!(spread.contains("-A KUBE-SEP-DNS-UDP-A -s 10.244.1.3/32 -j KUBE-MARK-MASQ\n"));
    let pinned = kube_proxy::nat_ruleset(&backends, Some(1));
    assert!(!pinned.contains("statistic"));
    assert!(pinned.contains("-A KUBE-SVC-DNS-TCP -j KUBE-SEP-DNS-TCP-B\n"));
    assert!(!pinned.contains("-j KUBE-SEP-DNS-TCP-A\n"));
}

#[test]
fn config_is_validated() {
    let cfg = LabConfig {
        pin_backend: Some(2),
        ..LabConfig::default()
    };
    assert!(matches!(validate(&cfg), Err(LabError::Config(_))));
    let cfg = LabConfig {
        dns_pods: Vec::new(),
        ..LabConfig::default()
    };
    assert!(matches!(validate(&cfg), Err(LabError::Config(_))));
}

#[test]
fn service_resolves_over_udp_tcp_and_ipv6_then_teardown_leaves_nothing() {
    require_root!();
    let t0 = Instant::now();
    let lab = Lab::start(LabConfig::default()).unwrap();
    eprintln!("lab {} started in {:?}", lab.prefix(), t0.elapsed());
    let prefix = lab.prefix().to_owned();
    let dir = lab.temp_dir().to_path_buf();
    assert_eq!(lab.namespaces().len(), 5);
    assert!(namespaces_with(&prefix).len() == 5);
    assert_eq!(lab.veth_of(Pod::Dns(1)), format!("{prefix}-dnsb"));
    assert_eq!(lab.ns_of(Pod::Upstream), lab.upstream_ns());

    let www = format!("www.{}", addr::ZONE);
    // Through the Service, UDP and TCP.
    let udp = lab.dig(&["+short", "@10.96.0.10", &www]);
    assert_eq!(answers(&udp), ["10.250.0.80"]);
    let tcp = lab.dig(&["+short", "+tcp", "@10.96.0.10", &www]);
    assert_eq!(answers(&tcp), ["10.250.0.80"]);
    // Through the client's resolv.conf (nameserver 10.96.0.10).
    let via_resolv = lab.dig(&["+short", &www, "AAAA"]);
    assert_eq!(answers(&via_resolv), ["fd00:250::80"]);
    // IPv6 transport, client -> node -> upstream and client -> DNS pod -> upstream.
    let v6 = lab.dig(&["+short", "@fd00:250::53", &www, "AAAA"]);
    assert_eq!(answers(&v6), ["fd00:250::80"]);
    let v6_pod = lab.dig(&["+short", "+tcp", "@fd00:244::4", &www, "A"]);
    assert_eq!(answers(&v6_pod), ["10.250.0.80"]);
    // Other records.
    let alias = lab.dig(&["+short", "@10.96.0.10", "alias.lab.test"]);
    assert_eq!(answers(&alias), ["www.lab.test.", "10.250.0.80"]);
    let srv = lab.dig(&["+short", "@10.96.0.10", "_dns._udp.lab.test", "SRV"]);
    assert_eq!(answers(&srv), ["0 100 53 ns.lab.test."]);
    // Search-list expansion gets NXDOMAIN from cluster.local, then the name resolves.
    let search = lab.exec(lab.client_ns(), &["getent", "ahostsv4", "www.lab.test"]);
    assert!(stdout(&search).contains("10.250.0.80"), "{search:?}");
    // The big RRset is truncated over UDP, even with EDNS; dig retries over TCP.
    let big = lab.dig(&["@10.96.0.10", addr::BIG_TXT, "TXT"]);
    let big_out = stdout(&big);
    assert!(
        big_out.contains("Truncated, retrying in TCP mode"),
        "{big_out}"
    );
    assert!(big_out.contains("ANSWER: 40,"), "{big_out}");
    let medium = lab.dig(&[
        "+noedns",
        "+ignore",
        "@10.250.0.53",
        addr::MEDIUM_TXT,
        "TXT",
    ]);
    assert!(stdout(&medium).contains(" tc "), "{}", stdout(&medium));
    let medium = lab.dig(&["@10.250.0.53", addr::MEDIUM_TXT, "TXT"]);
    assert!(
        stdout(&medium).contains("ANSWER: 8,"),
        "{}",
        stdout(&medium)
    );
    // Hairpin: a DNS pod reaching the Service (possibly itself), SNAT'ed by KUBE-POSTROUTING.
    let dig = lab.tools.dig.to_string_lossy().into_owned();
    let hairpin = lab.exec(lab.dns_ns(0), &[&dig, "+short", "@10.96.0.10", &www]);
    assert_eq!(answers(&hairpin), ["10.250.0.80"]);
    // The node itself (hostNetwork) reaching the Service through nat OUTPUT.
    let host = lab.exec(lab.node_ns(), &[&dig, "+short", "@10.96.0.10", &www]);
    assert_eq!(answers(&host), ["10.250.0.80"]);

    let mut sleeper = lab.spawn_in(lab.client_ns(), &["sleep", "600"]).unwrap();
    let pids = lab.pids();
    assert_eq!(pids.len(), 4, "named, 2 dnsdist, sleep: {pids:?}");
    assert!(pids.iter().all(|p| alive(*p)));
    assert!(lab.server_pid(Pod::Upstream).is_some());

    let servers: Vec<u32> = lab
        .pods()
        .into_iter()
        .filter_map(|p| lab.server_pid(p))
        .collect();
    assert_eq!(servers.len(), 3);
    let t1 = Instant::now();
    drop(lab);
    eprintln!("lab {prefix} torn down in {:?}", t1.elapsed());
    for pid in servers {
        assert!(
            !Path::new(&format!("/proc/{pid}")).exists(),
            "server {pid} not reaped"
        );
    }
    let status = sleeper.wait().unwrap();
    assert_eq!(status.signal(), Some(libc::SIGTERM));
    assert_gone(&prefix, &pids, &dir);
}

#[test]
fn dnsmasq_pods_with_pinned_backend() {
    require_root!();
    let cfg = LabConfig {
        dns_pods: vec![DnsPodConfig::new(DnsServerKind::Dnsmasq); 2],
        pin_backend: Some(1),
        ..LabConfig::default()
    };
    let mut lab = Lab::start(cfg).unwrap();
    for _ in 0..4 {
        let out = lab.dig(&["+short", "@10.96.0.10", "www.lab.test"]);
        assert_eq!(answers(&out), ["10.250.0.80"]);
    }
    let v6 = lab.dig(&["+short", "@fd00:244::3", "www.lab.test", "AAAA"]);
    assert_eq!(answers(&v6), ["fd00:250::80"]);
    // Every Service flow went to dnsb.
    let ct = lab.exec(
        lab.node_ns(),
        &["conntrack", "-L", "-p", "udp", "--orig-dst", "10.96.0.10"],
    );
    let flows = stdout(&ct);
    assert!(ct.status.success(), "{ct:?}");
    assert!(!flows.is_empty());
    assert!(
        flows
            .lines()
            .all(|l| l.contains("src=10.244.1.4 dst=10.244.1.2")),
        "{flows}"
    );
    let prefix = lab.prefix().to_owned();
    let pids = lab.pids();
    let dir = lab.temp_dir().to_path_buf();
    lab.teardown();
    lab.teardown();
    assert_gone(&prefix, &pids, &dir);
}

#[test]
fn forwarding_loop_config_starts_quietly_and_loops_on_one_query() {
    require_root!();
    let cfg = LabConfig {
        dns_pods: vec![DnsPodConfig::default().forwarding_to_cluster_ip(); 2],
        ..LabConfig::default()
    };
    let lab = Lab::start(cfg).unwrap();
    let rx_packets = |pod: Pod| -> u64 {
        let path = format!("/sys/class/net/{}/statistics/rx_packets", lab.veth_of(pod));
        // /sys shows the namespace of whoever mounted it, so read it inside the node.
        let out = lab.exec(lab.node_ns(), &["cat", &path]);
        stdout(&out).trim().parse().unwrap()
    };
    let before: u64 = (0..2).map(|i| rx_packets(Pod::Dns(i))).sum();
    // Nothing loops before the first query.
    std::thread::sleep(Duration::from_millis(200));
    let idle: u64 = (0..2).map(|i| rx_packets(Pod::Dns(i))).sum();
    assert!(
        idle - before < 10,
        "traffic before any query: {}",
        idle - before
    );
    let _ = lab.dig(&["+time=1", "+tries=1", "@10.96.0.10", "www.lab.test"]);
    let after: u64 = (0..2).map(|i| rx_packets(Pod::Dns(i))).sum();
    eprintln!(
        "one query looped into {} packets on the DNS pods' veths",
        after - idle
    );
    assert!(
        after - idle > 1000,
        "one query made only {} packets",
        after - idle
    );
    let prefix = lab.prefix().to_owned();
    let pids = lab.pids();
    let dir = lab.temp_dir().to_path_buf();
    let t = Instant::now();
    drop(lab);
    eprintln!("looping lab torn down in {:?}", t.elapsed());
    assert_gone(&prefix, &pids, &dir);
}

#[test]
fn reconfigure_turns_a_healthy_pod_into_a_loop() {
    require_root!();
    let mut lab = Lab::start(LabConfig {
        pin_backend: Some(0),
        ..LabConfig::default()
    })
    .unwrap();
    let old = lab.server_pid(Pod::Dns(0)).unwrap();
    lab.reconfigure_dns_pod(
        0,
        DnsPodConfig::new(DnsServerKind::Dnsmasq).forwarding_to_cluster_ip(),
    )
    .unwrap();
    assert!(!alive(old));
    // The lab reaped its own server, not just killed it.
    assert!(!Path::new(&format!("/proc/{old}")).exists());
    let new = lab.server_pid(Pod::Dns(0)).unwrap();
    assert_ne!(old, new);
    let conf = fs::read_to_string(lab.temp_dir().join("dnsa/dnsmasq.args")).unwrap();
    assert!(conf.contains("--server=10.96.0.10#53"), "{conf}");
    // dnsmasq de-duplicates the looping question: no answer.
    let out = lab.dig(&[
        "+short",
        "+time=1",
        "+tries=1",
        "@10.96.0.10",
        "www.lab.test",
    ]);
    assert!(answers_none(&out), "{out:?}");
    // Back to healthy, forwarding to the upstream over IPv6 this time.
    let upstream6 = SocketAddr::new(IpAddr::V6(addr::UPSTREAM6), 53);
    lab.reconfigure_dns_pod(0, DnsPodConfig::default().forwarding_to(upstream6))
        .unwrap();
    let out = lab.dig(&["+short", "@10.96.0.10", "www.lab.test"]);
    assert_eq!(answers(&out), ["10.250.0.80"]);
    let conf = fs::read_to_string(lab.temp_dir().join("dnsa/dnsdist.conf")).unwrap();
    assert!(
        conf.contains("newServer({address='[fd00:250::53]:53'})"),
        "{conf}"
    );
}

#[test]
fn failed_start_leaves_nothing() {
    require_root!();
    // No time to get ready: the first probe runs before named has loaded its zone.
    let cfg = LabConfig {
        readiness_timeout: Duration::ZERO,
        ..LabConfig::default()
    };
    let tools = resolve_tools(&cfg).unwrap();
    let mut lab = Lab::claim_prefix(cfg, tools).unwrap();
    let prefix = lab.prefix().to_owned();
    let dir = lab.temp_dir().to_path_buf();
    match lab.bring_up() {
        Err(e @ LabError::NotReady { .. }) => eprintln!("as expected: {e}"),
        Err(e) => panic!("unexpected error: {e}"),
        Ok(()) => eprintln!("lab {prefix} was ready at once; checking teardown only"),
    }
    let pids = lab.pids();
    assert_eq!(pids.len(), 3, "named and two dnsdist started");
    drop(lab);
    assert_gone(&prefix, &pids, &dir);
}

#[test]
fn two_labs_side_by_side() {
    require_root!();
    let a = Lab::start(LabConfig::default()).unwrap();
    let b = Lab::start(LabConfig {
        iptables: IptablesFlavor::Legacy,
        ..LabConfig::default()
    })
    .unwrap();
    assert_ne!(a.prefix(), b.prefix());
    for lab in [&a, &b] {
        let out = lab.dig(&["+short", "@10.96.0.10", "www.lab.test"]);
        assert_eq!(answers(&out), ["10.250.0.80"]);
    }
    let rules = b.exec(b.node_ns(), &["iptables-legacy-save", "-t", "nat"]);
    assert!(stdout(&rules).contains("KUBE-SVC-DNS-UDP"));
    let (pa, pb) = (a.prefix().to_owned(), b.prefix().to_owned());
    drop(a);
    assert!(namespaces_with(&pa).is_empty());
    assert_eq!(
        namespaces_with(&pb).len(),
        5,
        "tearing down one lab touched the other"
    );
    drop(b);
    assert!(namespaces_with(&pb).is_empty());
}

#[test]
fn panic_in_a_test_still_tears_down() {
    require_root!();
    let seen = std::sync::Arc::new(Mutex::new(None::<(String, Vec<u32>, PathBuf)>));
    let seen2 = seen.clone();
    let result = std::panic::catch_unwind(move || {
        let lab = Lab::start(LabConfig::default()).unwrap();
        *seen2.lock().unwrap() = Some((
            lab.prefix().to_owned(),
            lab.pids(),
            lab.temp_dir().to_path_buf(),
        ));
        panic!("test failure inside a lab");
    });
    assert!(result.is_err());
    let (prefix, pids, dir) = seen.lock().unwrap().take().unwrap();
    assert_gone(&prefix, &pids, &dir);
}

fn answers_none(o: &Output) -> bool {
    stdout(o)
        .lines()
        .all(|l| l.starts_with(';') || l.trim().is_empty())
}

#[test]
fn teardown_kills_descendants_left_in_lab_namespaces() {
    require_root!();
    let lab = Lab::start(LabConfig {
        dns_pods: vec![DnsPodConfig::default()],
        ..LabConfig::default()
    })
    .unwrap();
    // The shell is tracked; the sleep it forks is not.
    let mut sh = lab
        .spawn_in(lab.client_ns(), &["sh", "-c", "sleep 600 & echo $!; wait"])
        .unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(sh.stdout.take().unwrap()),
        &mut line,
    )
    .unwrap();
    let grandchild: u32 = line.trim().parse().unwrap();
    assert!(alive(grandchild));
    drop(lab);
    let _ = sh.wait().unwrap();
    assert!(!alive(grandchild), "sleep {grandchild} survived teardown");
}
