#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "integration tests fail at the line that broke"
)]
//! Forwarding loops born at runtime, against real servers: dnsdist ping-pong through the
//! Service, hairpin to itself, a pod forwarding to itself over its own loopback, a loopback
//! stub that sends the question back to the Service; and no false alarms on a healthy lab
//! under load. Root only; `--test-threads=1`.
use std::{
    thread,
    time::{Duration, Instant},
};

use lab::{
    tracer::Tracer,
    tracer::{lab_or_skip as lab, last_stats as stats, ndjson as records},
    DnsPodConfig, DnsServerKind, LabConfig, Pod,
};
use serde_json::Value;

use crate::shared::dnsdist_to_cluster_ip;

fn loops<'a>(recs: &'a [Value], state: &str) -> Vec<&'a Value> {
    recs.iter()
        .filter(|r| r["type"] == "loop" && r["state"] == state)
        .collect()
}

#[test]
fn ping_pong_loop_through_the_service_is_reported_and_survived() {
    let Some(mut lab) = lab(LabConfig::default()) else {
        return;
    };
    let t = Tracer::transactions(&lab, &[]).unwrap();
    // The loop is born at runtime: both "CoreDNS" pods now forward to their own Service.
    lab.reconfigure_dns_pod(0, dnsdist_to_cluster_ip()).unwrap();
    lab.reconfigure_dns_pod(1, dnsdist_to_cluster_ip()).unwrap();
    let _ = lab.dig(&["+time=1", "+tries=1", "storm.lab.test.", "A"]);
    // 30 s of storm; meanwhile ordinary traffic straight to the upstream is still traced.
    let up = format!("@{}", lab.ip_of(Pod::Upstream));
    let started = Instant::now();
    let mut healthy = 0;
    while started.elapsed() < Duration::from_secs(30) {
        thread::sleep(Duration::from_secs(3));
        let o = lab.dig(&[
            "+time=2",
            "+tries=1",
            &up,
            &format!("h{healthy}.lab.test."),
            "A",
        ]);
        if o.status.success() {
            healthy += 1;
        }
    }
    // End the loop: back to the upstream; the report says it ended.
    lab.reconfigure_dns_pod(0, DnsPodConfig::new(DnsServerKind::Dnsdist))
        .unwrap();
    lab.reconfigure_dns_pod(1, DnsPodConfig::new(DnsServerKind::Dnsdist))
        .unwrap();
    thread::sleep(Duration::from_secs(3));
    let stop_started = Instant::now();
    let out = t.stop();
    assert!(
        stop_started.elapsed() < Duration::from_secs(10),
        "tracer slow to stop under load"
    );
    assert!(out.status.success(), "{}", out.stderr);
    let recs = records(&out.stdout);
    let detected = loops(&recs, "detected");
    assert_eq!(
        detected.len(),
        1,
        "one loop report, not one per packet: {detected:#?}"
    );
    let l = detected[0];
    assert_eq!(l["kind"], "cycle");
    assert_eq!(l["question"]["name"], "storm.lab.test.");
    assert_eq!(l["zone"], "lab.test.");
    let path = l["path"].as_str().unwrap();
    assert!(path.contains("10.96.0.10:53 ⇒DNAT 10.244.1."), "{path}");
    assert!(
        l["clients"][0].as_str().unwrap().starts_with("10.244.1.2:"),
        "{l:#}"
    );
    let after = l["detected_ns"].as_u64().unwrap() - l["first_seen_ns"].as_u64().unwrap();
    eprintln!(
        "cycle closed {:.2} ms after the client's query entered it",
        after as f64 / 1e6
    );
    assert!(after < 100_000_000, "{after} ns");
    assert!(
        !loops(&recs, "ongoing").is_empty(),
        "no updates while it lasted"
    );
    let ended = loops(&recs, "ended");
    assert_eq!(ended.len(), 1, "{ended:#?}");
    let total = ended[0]["packets"].as_u64().unwrap();
    let summarised = ended[0]["summarised"].as_u64().unwrap();
    // Healthy queries made during the storm were reported as transactions.
    let healthy_seen = recs
        .iter()
        .filter(|r| {
            r["type"] == "transaction"
                && r["question"]["name"]
                    .as_str()
                    .is_some_and(|n| n.starts_with('h'))
                && r["outcome"] == "answered"
        })
        .count();
    let s = stats(&recs);
    eprintln!(
        "storm: {total} packets of the looping question ({summarised} only counted), \
         {healthy}/{healthy_seen} healthy queries answered/traced, stats {s}"
    );
    assert!(total > 10_000, "{total}");
    assert!(
        healthy >= 5 && healthy_seen >= healthy - 1,
        "{healthy} {healthy_seen}"
    );
    // Once the loop was detected the kernel stopped copying its packets, so the ring
    // buffer stayed free: nothing lost, and every packet only counted is counted once,
    // in the kernel (`shed`) or after copying (`summarised`).
    let n = |k: &str| s[k].as_u64().unwrap();
    assert_eq!(
        n("summarised") + n("shed"),
        summarised,
        "every summarised packet counted once"
    );
    assert!(n("shed") > 0, "the kernel shed nothing: {s}");
    assert_eq!(n("lost"), 0, "ring-buffer loss under a shed storm: {s}");
}

#[test]
fn hairpin_to_itself_is_a_one_hop_loop() {
    let cfg = LabConfig {
        dns_pods: vec![dnsdist_to_cluster_ip()],
        ..LabConfig::default()
    };
    let Some(lab) = lab(cfg) else { return };
    let t = Tracer::transactions(&lab, &["--until", "loop"]).unwrap();
    let _ = lab.dig(&["+time=1", "+tries=1", "self.lab.test.", "A"]);
    let out = t.wait();
    assert_eq!(
        out.status.code(),
        Some(3),
        "--until loop exits 3: {}",
        out.stderr
    );
    let recs = records(&out.stdout);
    let l = loops(&recs, "detected")[0];
    let pod = format!("{}:53", lab.ip_of(Pod::Dns(0)));
    let cycle = l["cycle"].as_array().unwrap();
    assert_eq!(cycle.len(), 1, "{l:#}");
    assert_eq!(cycle[0]["backend"], pod.as_str());
    assert_eq!(cycle[0]["server"], "10.96.0.10:53");
    assert!(
        cycle[0]["from"]
            .as_str()
            .unwrap()
            .starts_with(&pod[..pod.len() - 3]),
        "{l:#}"
    );
}

#[test]
fn loop_over_a_pods_own_loopback_needs_all_netns() {
    // The pod forwards to 127.0.0.53, which is itself: nothing crosses a veth.
    let cfg = LabConfig {
        dns_pods: vec![DnsPodConfig::new(DnsServerKind::Dnsdist)
            .forwarding_to("127.0.0.53:53".parse().unwrap())],
        ..LabConfig::default()
    };
    let Some(lab) = lab(cfg) else { return };
    let pod_ip = lab.ip_of(Pod::Dns(0)).to_string();
    let t = Tracer::transactions(&lab, &["--all-netns", "--until", "loop"]).unwrap();
    let _ = lab.dig(&[
        "+time=1",
        "+tries=1",
        &format!("@{pod_ip}"),
        "lo.lab.test.",
        "A",
    ]);
    let out = t.wait();
    assert_eq!(out.status.code(), Some(3), "{}", out.stderr);
    let recs = records(&out.stdout);
    let l = loops(&recs, "detected")[0];
    let cycle = l["cycle"].as_array().unwrap();
    assert!(
        cycle.iter().all(|h| h["backend"] == "127.0.0.53:53"),
        "{l:#}"
    );
    assert!(
        cycle[0]["at"].as_str().unwrap().starts_with(lab.dns_ns(0)),
        "{l:#}"
    );
}

#[test]
fn stub_on_loopback_sending_back_to_the_service_is_a_short_loop() {
    // "CoreDNS" (dnsmasq, de-duplicating) forwards to a loopback stub in its own pod, the
    // stub forwards to the Service, which sends it back to the same pod. (The stub listens on
    // port 5353: the pod's server holds the wildcard port 53.)
    let cfg = LabConfig {
        dns_pods: vec![DnsPodConfig::new(DnsServerKind::Dnsmasq)
            .forwarding_to("127.0.0.54:5353".parse().unwrap())],
        pin_backend: Some(0),
        ..LabConfig::default()
    };
    let Some(lab) = lab(cfg) else { return };
    let mut stub = lab
        .spawn_in(
            lab.dns_ns(0),
            &[
                "dnsmasq",
                "-k",
                "-C",
                "/dev/null",
                "--no-resolv",
                "--no-hosts",
                "--user=root",
                "--bind-interfaces",
                "--listen-address=127.0.0.54",
                "--port=5353",
                "--server=10.96.0.10",
                "--pid-file=",
            ],
        )
        .unwrap();
    thread::sleep(Duration::from_millis(500));
    let t = Tracer::transactions(&lab, &["--all-netns", "--port", "53", "--port", "5353"]).unwrap();
    let o = lab.dig(&["+time=2", "+tries=1", "stub.lab.test.", "A"]);
    let answered = String::from_utf8_lossy(&o.stdout).contains("ANSWER SECTION");
    thread::sleep(Duration::from_secs(3));
    let out = t.stop();
    let _ = stub.kill();
    let _ = stub.wait();
    assert!(out.status.success(), "{}", out.stderr);
    let recs = records(&out.stdout);
    let detected = loops(&recs, "detected");
    assert_eq!(detected.len(), 1, "{recs:#?}");
    let l = detected[0];
    assert!(l["hop_count"].as_u64().unwrap() >= 2, "{l:#}");
    assert!(
        l["path"].as_str().unwrap().contains("127.0.0.54:5353"),
        "{l:#}"
    );
    assert!(!answered, "the client should be left unanswered");
    eprintln!(
        "short loop: {} hops, {} packets",
        l["hop_count"],
        loops(&recs, "ended")[0]["packets"]
    );
}

/// A healthy lab under sustained load — many clients, the same names, cache misses, TCP
/// fallback, a node-local cache in front of CoreDNS in front of the upstream — reports no loop.
#[test]
fn no_false_positives_on_a_healthy_lab_under_load() {
    let Some(lab) = lab(LabConfig::default()) else {
        return;
    };
    // NodeLocal-DNSCache-like cache on the node: 169.254.20.10 → ClusterIP → CoreDNS → upstream.
    let node = lab.node_ns();
    assert!(lab
        .exec(
            node,
            &["ip", "addr", "add", "169.254.20.10/32", "dev", "lo"]
        )
        .status
        .success());
    let o = lab.exec(
        lab.client_ns(),
        &[
            "ip",
            "route",
            "add",
            "169.254.20.10/32",
            "via",
            "169.254.1.1",
        ],
    );
    assert!(o.status.success(), "{o:?}");
    let mut cache = lab
        .spawn_in(
            node,
            &[
                "dnsmasq",
                "-k",
                "-C",
                "/dev/null",
                "--no-resolv",
                "--no-hosts",
                "--user=root",
                "--bind-interfaces",
                "--listen-address=169.254.20.10",
                "--server=10.96.0.10",
                "--pid-file=",
            ],
        )
        .unwrap();
    thread::sleep(Duration::from_millis(500));
    let t = Tracer::start(
        &lab,
        node,
        &[
            "trace",
            "-o",
            "json",
            "--view",
            "transactions",
            "--all-netns",
        ],
    )
    .unwrap();
    // 40 sockets × 60 queries: the same few names from everyone, unique misses, both
    // resolvers (ClusterIP and the node-local cache), some through TCP.
    let script = r#"
import socket, struct, random, threading
def q(name, qtype, id):
    h = struct.pack('!HHHHHH', id, 0x0100, 1, 0, 0, 0)
    return h + b''.join(bytes([len(l)]) + l.encode() for l in name.split('.')) + b'\0' + struct.pack('!HH', qtype, 1)
sent = [0]
def worker(n):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.settimeout(1.0)
    for i in range(60):
        name = random.choice(['www.lab.test', 'alias.lab.test', 'txt.lab.test', 'miss%d-%d.lab.test' % (n, i)])
        server = random.choice(['10.96.0.10', '169.254.20.10'])
        s.sendto(q(name, random.choice([1, 28]), random.randrange(65536)), (server, 53))
        sent[0] += 1
        try:
            s.recv(4096)
        except Exception:
            pass
ts = [threading.Thread(target=worker, args=(n,)) for n in range(40)]
[t.start() for t in ts]
[t.join() for t in ts]
print(sent[0])
"#;
    let o = lab.exec(lab.client_ns(), &["python3", "-c", script]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let sent: u64 = String::from_utf8_lossy(&o.stdout).trim().parse().unwrap();
    for _ in 0..10 {
        let _ = lab.dig(&["+tcp", "+time=2", "+tries=1", "big.lab.test.", "TXT"]);
        let _ = lab.dig(&[
            "+time=2",
            "+tries=1",
            "@169.254.20.10",
            "medium.lab.test.",
            "TXT",
        ]);
    }
    // A retry after a timeout must not look like a loop either.
    let _ = lab.dig(&["+time=1", "+tries=2", "@10.250.0.99", "retry.lab.test."]);
    thread::sleep(Duration::from_secs(2));
    let out = t.stop();
    let _ = cache.kill();
    let _ = cache.wait();
    assert!(out.status.success(), "{}", out.stderr);
    let recs = records(&out.stdout);
    let txs: Vec<_> = recs.iter().filter(|r| r["type"] == "transaction").collect();
    let three_level = txs
        .iter()
        .filter(|t| {
            t["legs"]
                .as_array()
                .is_some_and(|l| l.iter().any(|l| l["parent"] == 1))
        })
        .count();
    let loop_records: Vec<_> = recs.iter().filter(|r| r["type"] == "loop").collect();
    eprintln!(
        "healthy load: {sent} UDP queries + 20 dig, {} transactions ({three_level} with three levels), {} loop reports",
        txs.len(),
        loop_records.len()
    );
    assert!(loop_records.is_empty(), "false positive: {loop_records:#?}");
    assert!(
        txs.len() as u64 >= sent * 9 / 10,
        "too few transactions traced: {}",
        txs.len()
    );
    assert!(
        three_level > 0,
        "no node-local → CoreDNS → upstream chain seen"
    );
}

// ---- healthy loopback traffic is no loop (issue #10) ----

/// A lab whose client namespace runs dnsmasq on 127.0.0.1 and 127.0.0.53 (forwarding to the
/// upstream) and resolves through it.
fn lab_with_loopback_stub() -> Option<(lab::Lab, std::process::Child)> {
    let cfg = LabConfig {
        client_resolv_conf: "nameserver 127.0.0.53\noptions timeout:2 attempts:1\n".to_owned(),
        ..LabConfig::default()
    };
    let lab = lab(cfg)?;
    let up = format!("--server={}", lab.ip_of(Pod::Upstream));
    let stub = lab
        .spawn_in(
            lab.client_ns(),
            &[
                "dnsmasq",
                "-k",
                "-C",
                "/dev/null",
                "--no-resolv",
                "--no-hosts",
                "--user=root",
                "--bind-interfaces",
                "--listen-address=127.0.0.1",
                "--listen-address=127.0.0.53",
                &up,
                "--pid-file=",
            ],
        )
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let o = lab.dig(&["+time=1", "+tries=1", "@127.0.0.53", "ready.lab.test.", "A"]);
        if String::from_utf8_lossy(&o.stdout).contains("status: ") {
            break;
        }
        assert!(Instant::now() < deadline, "loopback stub does not answer");
        thread::sleep(Duration::from_millis(200));
    }
    Some((lab, stub))
}

/// `dnspath trace --netns CLIENT --until loop -o json` for the client namespace.
fn trace_client_until_loop(lab: &lab::Lab) -> Tracer {
    Tracer::start(
        lab,
        lab.node_ns(),
        &[
            "trace",
            "--netns",
            lab.client_ns(),
            "-o",
            "json",
            "--view",
            "transactions",
            "--until",
            "loop",
        ],
    )
    .unwrap()
}

/// Stops the tracer (it must still run: `--until loop` exits 3 on a loop) and returns its
/// records.
fn stop_without_loop(t: Tracer) -> Vec<Value> {
    thread::sleep(Duration::from_secs(2));
    let out = t.stop();
    let recs = records(&out.stdout);
    let loop_records: Vec<_> = recs.iter().filter(|r| r["type"] == "loop").collect();
    assert!(loop_records.is_empty(), "false loop: {loop_records:#?}");
    assert!(
        out.status.success(),
        "exit {:?}: {}",
        out.status,
        out.stderr
    );
    recs
}

/// Transactions whose question is `name`.
fn transactions_of<'a>(recs: &'a [Value], name: &str) -> Vec<&'a Value> {
    recs.iter()
        .filter(|r| r["type"] == "transaction" && r["question"]["name"] == name)
        .collect()
}

/// Each of `txs` is one client's own query and answer: one leg, a `query`, answered.
fn assert_one_client_each(txs: &[&Value]) {
    let mut clients = std::collections::BTreeSet::new();
    for t in txs {
        assert_eq!(t["outcome"], "answered", "{t:#}");
        let legs = t["legs"].as_array().unwrap();
        let roots: Vec<_> = legs.iter().filter(|l| l["parent"].is_null()).collect();
        assert_eq!(roots.len(), 1, "{t:#}");
        assert_eq!(roots[0]["role"], "query", "{t:#}");
        assert!(
            legs.iter()
                .all(|l| l["role"] != "forward"
                    || !l["backend"].as_str().unwrap().starts_with("127.")),
            "a client's query taken for a forward: {t:#}"
        );
        // A client is its socket's address and its query's id: across rounds the kernel can
        // hand a later dig the port of an earlier one (30 digs over ~28,000 ephemeral ports
        // share one about once in 60 runs); the same 16-bit id as well is 1 in 65,536 more.
        assert!(
            clients.insert((
                t["client"].as_str().unwrap().to_owned(),
                roots[0]["dns_id"].as_u64().unwrap()
            )),
            "{t:#}"
        );
    }
}

#[test]
fn concurrent_clients_of_loopback_stubs_are_no_loop() {
    let Some((lab, mut stub)) = lab_with_loopback_stub() else {
        return;
    };
    let t = trace_client_until_loop(&lab);
    // 3 rounds of 5 concurrent digs of one name to each of 127.0.0.1 and 127.0.0.53.
    let script = "for s in 127.0.0.1 127.0.0.53; do for i in 1 2 3 4 5; do \
                  dig +time=2 +tries=1 @$s www.lab.test. A & done; done; wait";
    let mut answered = 0;
    for _ in 0..3 {
        let o = lab.exec(lab.client_ns(), &["sh", "-c", script]);
        answered += String::from_utf8_lossy(&o.stdout)
            .matches("status: NOERROR")
            .count();
        thread::sleep(Duration::from_millis(300));
    }
    let recs = stop_without_loop(t);
    let _ = stub.kill();
    let _ = stub.wait();
    assert_eq!(answered, 30, "the stub should answer every dig");
    let txs: Vec<_> = transactions_of(&recs, "www.lab.test.")
        .into_iter()
        .filter(|t| t["client"].as_str().unwrap().starts_with("127.0.0.1:"))
        .collect();
    assert_eq!(txs.len(), 30, "one transaction per dig: {txs:#?}");
    assert_one_client_each(&txs);
    assert_eq!(stats(&recs)["correlate"]["orphan_responses"], 0);
}

#[test]
fn concurrent_getent_pairs_against_a_loopback_stub_are_no_loop() {
    let Some((lab, mut stub)) = lab_with_loopback_stub() else {
        return;
    };
    let t = trace_client_until_loop(&lab);
    // glibc asks A and AAAA from one socket; 5 lookups at once, 3 times.
    let script = "for i in 1 2 3 4 5; do getent ahosts www.lab.test & done; wait";
    let mut resolved = 0;
    for _ in 0..3 {
        let o = lab.exec(lab.client_ns(), &["sh", "-c", script]);
        resolved += String::from_utf8_lossy(&o.stdout)
            .matches("STREAM www.lab.test")
            .count();
        thread::sleep(Duration::from_millis(300));
    }
    let recs = stop_without_loop(t);
    let _ = stub.kill();
    let _ = stub.wait();
    assert_eq!(resolved, 15, "every getent should resolve");
    for qtype in ["A", "AAAA"] {
        let txs: Vec<_> = transactions_of(&recs, "www.lab.test.")
            .into_iter()
            .filter(|t| t["question"]["type"] == qtype)
            .collect();
        assert_eq!(
            txs.len(),
            15,
            "{qtype}: one transaction per lookup: {txs:#?}"
        );
        assert_one_client_each(&txs);
    }
    assert_eq!(stats(&recs)["correlate"]["orphan_responses"], 0);
}

#[test]
fn retry_after_port_unreachable_on_loopback_is_no_loop() {
    let Some((lab, mut stub)) = lab_with_loopback_stub() else {
        return;
    };
    let t = trace_client_until_loop(&lab);
    // Nothing listens on 127.0.0.9:53: ICMP port unreachable, and dig tries again.
    let _ = lab.dig(&["+time=1", "+tries=2", "@127.0.0.9", "retry.lab.test.", "A"]);
    let recs = stop_without_loop(t);
    let _ = stub.kill();
    let _ = stub.wait();
    let txs = transactions_of(&recs, "retry.lab.test.");
    let queries: usize = txs
        .iter()
        .map(|t| t["legs"].as_array().unwrap().len())
        .sum();
    assert!(queries >= 2, "the retry was not seen: {txs:#?}");
    for t in &txs {
        assert!(
            t["legs"]
                .as_array()
                .unwrap()
                .iter()
                .all(|l| l["role"] != "forward"),
            "a retry taken for a forward: {t:#}"
        );
        assert_ne!(t["outcome"], "answered", "{t:#}");
    }
}
