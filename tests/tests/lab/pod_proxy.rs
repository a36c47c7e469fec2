#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "integration tests fail at the line that broke"
)]
//! A DNS proxy inside the client's pod, as Istio's DNS capture sets it up: the pod's `nat
//! OUTPUT` redirects its UDP and TCP port-53 traffic to a local port (15053) where a real
//! forwarder (dnsmasq, caching) listens as another uid, exempt from the rule (`-m owner !
//! --uid-owner`), and asks cluster DNS itself. Traced with the default `--port 53`: the
//! proxy's port is learnt from conntrack, and captured in that pod's namespace only. Root
//! only; `--test-threads=1`.
use std::{
    process::Child,
    time::{Duration, Instant},
};

use lab::{tracer::Tracer, Lab, LabConfig, Pod};
use serde_json::Value;

use crate::shared::lab_of;

const PROXY_PORT: &str = "15053";
/// The proxy's uid: dnsmasq drops to it, and the REDIRECT exempts it.
const PROXY_UID: &str = "65534";

/// The pod's proxy: its REDIRECT rules and dnsmasq, killed on drop (the rules go with the
/// lab's namespaces).
struct PodProxy(Child);

impl Drop for PodProxy {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn ok(what: &str, o: std::process::Output) {
    assert!(o.status.success(), "{what}: {o:?}");
}

/// Starts the proxy in the client's pod and redirects the pod's DNS to it; returns once it
/// answers on its port.
fn start_pod_proxy(lab: &Lab) -> PodProxy {
    let ns = lab.client_ns();
    let server = format!("--server={}", lab.cluster_ip());
    let child = lab
        .spawn_in(
            ns,
            &[
                "dnsmasq",
                "-k",
                "-C",
                "/dev/null",
                "--no-resolv",
                "--no-hosts",
                "--user=nobody",
                "--group=nogroup",
                "--pid-file=",
                "--log-facility=-",
                "--bind-interfaces",
                "--listen-address=127.0.0.1",
                &format!("--port={PROXY_PORT}"),
                "--cache-size=1000",
                // TXT too (dnsmasq caches A, AAAA, CNAME … only by default).
                "--cache-rr=TXT",
                &server,
            ],
        )
        .unwrap();
    let proxy = PodProxy(child);
    for proto in ["udp", "tcp"] {
        let rule = [
            "-t",
            "nat",
            "OUTPUT",
            "-p",
            proto,
            "--dport",
            "53",
            "-m",
            "owner",
            "!",
            "--uid-owner",
            PROXY_UID,
            "-j",
            "REDIRECT",
            "--to-ports",
            PROXY_PORT,
        ];
        let mut args = vec![lab.iptables(), rule[0], rule[1], "-A"];
        args.extend_from_slice(&rule[2..]);
        ok(&args.join(" "), lab.exec(ns, &args));
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    let port = format!("-p{PROXY_PORT}");
    loop {
        // Straight to its port (not redirected), a name the test does not ask.
        let probe = [
            "dig",
            "+time=1",
            "+tries=1",
            "@127.0.0.1",
            &port,
            "ns.lab.test.",
            "AAAA",
        ];
        if lab.exec(ns, &probe).status.success() {
            return proxy;
        }
        assert!(Instant::now() < deadline, "the pod's proxy did not answer");
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn trace(lab: &Lab) -> Tracer {
    let mut args = vec![
        "trace",
        "-o",
        "json",
        "--view",
        "transactions",
        "--timeout",
        "3",
    ];
    for ns in lab.namespaces().into_iter().skip(1) {
        args.extend(["--netns", ns]);
    }
    Tracer::start(lab, lab.node_ns(), &args).unwrap()
}

fn dig(lab: &Lab, args: &[&str]) {
    let o = lab.dig(args);
    assert!(o.status.success(), "dig {args:?}: {o:?}");
}

/// The app's transactions of `name` `qtype`, in time order.
fn asked<'a>(txs: &'a [Value], name: &str, qtype: &str) -> Vec<&'a Value> {
    txs.iter()
        .filter(|t| t["question"]["name"] == name && t["question"]["type"] == qtype)
        .collect()
}

/// The legs of `t` redirected to the proxy.
fn app_legs(t: &Value) -> usize {
    t["legs"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|l| l["backend"] == format!("127.0.0.1:{PROXY_PORT}"))
        .count()
}

/// Each question asked through the pod's proxy is one tree: the app's question (what it
/// asked, the ClusterIP, and where it went, the proxy) labelled `pod proxy miss`, the
/// proxy's own query to cluster DNS its child, CoreDNS's to the upstream the grandchild;
/// asked again, `hit` with no child; over UDP and TCP. Two apps asking one name at once
/// are two transactions, and no loop is reported.
#[test]
fn a_dns_proxy_in_the_client_pod_is_one_tree_hit_and_miss() {
    let Some(lab) = lab_of(LabConfig {
        pin_backend: Some(0),
        ..Default::default()
    }) else {
        return;
    };
    lab::tracer::require_tools(&["dnsmasq"]);
    let _proxy = start_pod_proxy(&lab);
    let mut t = trace(&lab);
    // The first redirected query teaches dnspath the proxy's port (conntrack's entry: the
    // ClusterIP:53 asked, 127.0.0.1:15053 the reply's source); only its answer is seen.
    dig(&lab, &["+time=2", "+tries=1", "ns.lab.test.", "A"]);
    t.wait_for_stderr(
        &format!("capturing port {PROXY_PORT} too"),
        Duration::from_secs(5),
    )
    .unwrap();
    dig(&lab, &["+time=2", "+tries=1", "www.lab.test.", "A"]);
    dig(&lab, &["+time=2", "+tries=1", "www.lab.test.", "A"]);
    dig(
        &lab,
        &["+tcp", "+time=2", "+tries=1", "txt.lab.test.", "TXT"],
    );
    dig(
        &lab,
        &["+tcp", "+time=2", "+tries=1", "txt.lab.test.", "TXT"],
    );
    let two = lab.exec(
        lab.client_ns(),
        &[
            "sh",
            "-c",
            "dig +time=2 +tries=1 www.lab.test. AAAA & dig +time=2 +tries=1 www.lab.test. AAAA & wait",
        ],
    );
    ok("two apps at once", two);
    std::thread::sleep(Duration::from_millis(800));
    let out = t.stop();
    let recs = out.records();
    let txs: Vec<Value> = recs
        .iter()
        .filter(|r| r["type"] == "transaction")
        .cloned()
        .collect();
    assert!(
        !recs.iter().any(|r| r["type"] == "loop"),
        "no loop: {recs:#?}"
    );
    let client_ip = lab.ip_of(Pod::Client).to_string();
    let coredns = format!("{}:53", lab.ip_of(Pod::Dns(0)));
    let cluster = format!("{}:53", lab.cluster_ip());
    for (name, qtype, proto) in [
        ("www.lab.test.", "A", "udp"),
        ("txt.lab.test.", "TXT", "tcp"),
    ] {
        let both = asked(&txs, name, qtype);
        assert_eq!(both.len(), 2, "{name}: a miss and a hit: {txs:#?}");
        let (miss, hit) = (both[0], both[1]);
        for t in [miss, hit] {
            assert_eq!(t["outcome"], "answered", "{t:#}");
            let app = &t["legs"][0];
            assert_eq!(app["proto"], proto, "{t:#}");
            assert_eq!(app["server"], cluster, "what the app asked: {t:#}");
            assert_eq!(app["backend"], format!("127.0.0.1:{PROXY_PORT}"), "{t:#}");
            assert!(
                app["client"].as_str().unwrap().starts_with(&client_ip),
                "{t:#}"
            );
        }
        assert_eq!(miss["legs"][0]["pod_proxy"], "miss", "{miss:#}");
        let legs = miss["legs"].as_array().unwrap();
        let proxy = legs
            .iter()
            .position(|l| l["parent"] == 0)
            .unwrap_or_else(|| panic!("the proxy's query is the app's child: {miss:#}"));
        assert_eq!(legs[proxy]["role"], "forward", "{miss:#}");
        assert_eq!(legs[proxy]["server"], cluster, "{miss:#}");
        assert_eq!(legs[proxy]["backend"], coredns, "{miss:#}");
        assert_eq!(legs[proxy]["proto"], proto, "{miss:#}");
        assert!(legs[proxy].get("pod_proxy").is_none(), "{miss:#}");
        assert!(
            legs.iter()
                .any(|l| l["parent"] == proxy && l["server"] == "10.250.0.53:53"),
            "CoreDNS's query to the upstream under the proxy's: {miss:#}"
        );
        assert_eq!(hit["legs"].as_array().unwrap().len(), 1, "{hit:#}");
        assert_eq!(hit["legs"][0]["pod_proxy"], "hit", "{hit:#}");
    }
    // Two apps at once: two transactions, one app each, none the other's forward.
    let pair = asked(&txs, "www.lab.test.", "AAAA");
    assert_eq!(pair.len(), 2, "{txs:#?}");
    for t in &pair {
        assert_eq!(t["outcome"], "answered", "{t:#}");
        assert_eq!(app_legs(t), 1, "{t:#}");
        assert!(t["legs"][0]["pod_proxy"].is_string(), "{t:#}");
    }
    assert!(
        pair.iter().any(|t| t["legs"][0]["pod_proxy"] == "miss"),
        "{pair:#?}"
    );
    // The proxy's queries are no transactions of their own (but the first one's, whose
    // app's query came before dnspath knew the port).
    for t in &txs {
        if t["client_netns"] == lab.client_ns() && t["question"]["name"] != "ns.lab.test." {
            assert_eq!(app_legs(t), 1, "a root that is not the app's: {t:#}");
        }
    }
}

/// A port learnt from one pod's redirect is captured in that pod's namespace alone: another
/// pod's UDP to that port — to its own loopback, and across the node to the upstream's
/// address — leaves no record on any interface of any other namespace (a proxy on 443 or
/// 8080 must not make the node's HTTPS a flood of malformed DNS), while the first pod's
/// redirected query is still seen on its way to the proxy (its answer is un-NATed to the
/// ClusterIP's port 53 before it reaches `lo`).
#[test]
fn a_learnt_port_is_captured_only_in_the_pod_that_redirects_to_it() {
    let Some(lab) = lab_of(LabConfig::default()) else {
        return;
    };
    lab::tracer::require_tools(&["dnsmasq"]);
    let _proxy = start_pod_proxy(&lab);
    let mut args = vec!["trace", "-o", "json", "--timeout", "3"];
    for ns in lab.namespaces().into_iter().skip(1) {
        args.extend(["--netns", ns]);
    }
    let mut t = Tracer::start(&lab, lab.node_ns(), &args).unwrap();
    dig(&lab, &["+time=2", "+tries=1", "ns.lab.test.", "A"]);
    t.wait_for_stderr(
        &format!("capturing port {PROXY_PORT} too"),
        Duration::from_secs(5),
    )
    .unwrap();
    // Another pod, on the learnt port: nothing listens, each probe is one datagram out and
    // an ICMP error back.
    let other = lab.ns_of(Pod::Dns(0));
    let upstream = lab.ip_of(Pod::Upstream).to_string();
    let port = format!("-p{PROXY_PORT}");
    for to in ["127.0.0.1", upstream.as_str()] {
        for _ in 0..3 {
            let at = format!("@{to}");
            let probe = [
                "dig",
                "+time=1",
                "+tries=1",
                &at,
                &port,
                "probe.lab.test.",
                "A",
            ];
            let o = lab.exec(other, &probe);
            assert_ne!(o.status.code(), Some(127), "{o:?}");
        }
    }
    // The pod that taught it: still traced.
    dig(&lab, &["+time=2", "+tries=1", "www.lab.test.", "A"]);
    std::thread::sleep(Duration::from_millis(800));
    let out = t.stop();
    let recs = out.records();
    let on_port = |r: &&Value| {
        r["type"] == "packet"
            && [&r["src"], &r["dst"]].iter().any(|a| {
                a.as_str()
                    .is_some_and(|a| a.ends_with(&format!(":{PROXY_PORT}")))
            })
    };
    let elsewhere: Vec<&Value> = recs
        .iter()
        .filter(on_port)
        .filter(|r| r["netns"] != lab.client_ns())
        .collect();
    assert!(
        elsewhere.is_empty(),
        "port {PROXY_PORT} captured outside the pod that redirects to it: {elsewhere:#?}"
    );
    assert!(
        recs.iter()
            .filter(on_port)
            .any(|r| r["netns"] == lab.client_ns()
                && r["dns"]["questions"][0]["name"] == "www.lab.test."
                && r["dst"] == format!("127.0.0.1:{PROXY_PORT}")),
        "the app's redirected query: {recs:#?}"
    );
    let stats = recs.iter().rev().find(|r| r["type"] == "stats").unwrap();
    assert_eq!(stats["learnt_ports"]["captured"], 1, "{stats:#}");
    assert_eq!(stats["learnt_ports"]["refused"], 0, "{stats:#}");
}

/// A namespace made by the test, deleted on drop (if the test has not deleted it itself).
struct TestNetns(String);

impl Drop for TestNetns {
    fn drop(&mut self) {
        let _ = std::process::Command::new("ip")
            .args(["netns", "del", &self.0])
            .output();
    }
}

fn ip(args: &[&str]) {
    let o = std::process::Command::new("ip")
        .args(args)
        .output()
        .unwrap();
    ok(&format!("ip {}", args.join(" ")), o);
}

/// The ports a namespace taught are forgotten when it goes: a namespace made while tracing
/// (`--all-netns`) redirects its port-53 queries to 15053, teaching it; deleted, its pair
/// leaves the kernel's `LEARNT_PORTS` (`stats.learnt_ports`: learnt 1, forgotten 1,
/// captured 0).
#[test]
fn a_namespace_gone_takes_its_learnt_ports_with_it() {
    let Some(lab) = lab_of(LabConfig::default()) else {
        return;
    };
    let args = ["trace", "-o", "json", "--all-netns", "--timeout", "1"];
    let mut t = Tracer::start(&lab, lab.node_ns(), &args).unwrap();
    let name = format!("{}-redir", lab.prefix());
    ip(&["netns", "add", &name]);
    let ns = TestNetns(name.clone());
    ip(&["-n", &name, "link", "set", "lo", "up"]);
    // A "ClusterIP" of its own on `lo`, so the query is not to a loopback address.
    ip(&["-n", &name, "addr", "add", "10.99.0.10/32", "dev", "lo"]);
    let rule = [
        "nat",
        "-A",
        "OUTPUT",
        "-p",
        "udp",
        "--dport",
        "53",
        "-j",
        "REDIRECT",
        "--to-ports",
        PROXY_PORT,
    ];
    ok("REDIRECT", lab.iptables_rule(&name, "-t", &rule));
    // Nothing listens on 15053: the query is redirected (a conntrack entry) and refused.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let dig = [
            "netns",
            "exec",
            &name,
            "dig",
            "+time=1",
            "+tries=1",
            "@10.99.0.10",
            "gone.test.",
        ];
        let _ = std::process::Command::new("ip").args(dig).output();
        if t.wait_for_stderr(
            &format!("capturing port {PROXY_PORT} too in netns {name}"),
            Duration::from_millis(1000),
        )
        .is_ok()
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the namespace's redirect was never learnt"
        );
    }
    drop(ns);
    // Discovery sees it go (inotify on /run/netns), then the conntrack thread tells the run
    // loop; well within this.
    std::thread::sleep(Duration::from_millis(2000));
    let out = t.stop();
    let recs = out.records();
    let stats = recs.iter().rev().find(|r| r["type"] == "stats").unwrap();
    let learnt = &stats["learnt_ports"];
    assert_eq!(learnt["learnt"], 1, "{stats:#}");
    assert_eq!(learnt["forgotten"], 1, "{stats:#}");
    assert_eq!(learnt["captured"], 0, "{stats:#}");
}
