#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "integration tests fail at the line that broke"
)]
//! Transactions against the lab: one query followed through DNAT and forwarders, search-list
//! lookups, unanswered queries and their retries. Root only; `--test-threads=1`.
use std::time::Duration;

use lab::{
    hole::{Hole, SLOW_ADDR},
    node_cache::NodeCache,
    tracer::ndjson,
    tracer::{assert_accounted, last_stats, Tracer},
    DnsPodConfig, DnsServerKind, Lab, Pod,
};

use serde_json::Value;

use crate::shared::lab;

fn transactions(stdout: &str) -> Vec<Value> {
    ndjson(stdout)
        .into_iter()
        .filter(|r| r["type"] == "transaction")
        .collect()
}

fn trace_node(lab: &Lab, extra: &[&str]) -> Tracer {
    let mut args = vec!["trace", "-o", "json", "--view", "transactions"];
    args.extend_from_slice(extra);
    Tracer::start(lab, lab.node_ns(), &args).unwrap()
}

#[test]
fn dig_through_the_cluster_ip_is_one_transaction_tree() {
    let Some(lab) = lab() else { return };
    let t = trace_node(&lab, &[]);
    let o = lab.dig(&["+time=2", "+tries=1", "www.lab.test.", "A"]);
    assert!(o.status.success());
    std::thread::sleep(Duration::from_millis(600));
    let out = t.stop();
    assert!(out.status.success(), "{}", out.stderr);
    let txs = transactions(&out.stdout);
    let ours: Vec<_> = txs
        .iter()
        .filter(|t| t["question"]["name"] == "www.lab.test.")
        .collect();
    assert_eq!(ours.len(), 1, "one transaction expected: {txs:#?}");
    let t = ours[0];
    assert_eq!(t["outcome"], "answered");
    assert_eq!(t["answers"][0], "A 10.250.0.80");
    assert!(t["client"].as_str().unwrap().starts_with("10.244.1.2:"));
    let legs = t["legs"].as_array().unwrap();
    assert_eq!(legs.len(), 2, "{t:#}");
    let client_leg = &legs[0];
    assert_eq!(client_leg["server"], format!("{}:53", lab.cluster_ip()));
    let backend = client_leg["backend"].as_str().unwrap();
    assert!(
        [lab.ip_of(Pod::Dns(0)), lab.ip_of(Pod::Dns(1))]
            .iter()
            .any(|ip| backend == format!("{ip}:53")),
        "{client_leg:#}"
    );
    // Client veth in, pod veth out (after DNAT), and both answers back.
    assert!(
        client_leg["hops"].as_array().unwrap().len() >= 4,
        "{client_leg:#}"
    );
    assert_eq!(client_leg["join"], "conntrack", "{client_leg:#}");
    let up = &legs[1];
    assert_eq!(up["parent"], 0);
    assert_eq!(up["role"], "forward");
    assert_eq!(up["server"], format!("{}:53", lab.ip_of(Pod::Upstream)));
    assert!(up["client"]
        .as_str()
        .unwrap()
        .starts_with(&backend[..backend.len() - 3]));
    assert!(t["latency_ns"].as_u64().unwrap() >= up["latency_ns"].as_u64().unwrap());
}

/// A message crosses the node as one `sk_buff`: the kernel sends it whole at its first hook
/// and as its headers at the others (`tracer_common::copies`), and userspace rebuilds each
/// hop's packet. Every hop is still there with the same message, after DNAT as before it,
/// and every matched packet is accounted for.
#[test]
fn a_message_is_sent_whole_once_and_as_headers_at_its_other_hops() {
    let Some(lab) = lab() else { return };
    let args = ["trace", "-o", "json", "--view", "both", "--all-netns"];
    let t = Tracer::start(&lab, lab.node_ns(), &args).unwrap();
    let o = lab.dig(&["+time=2", "+tries=1", "www.lab.test.", "A"]);
    assert!(o.status.success());
    std::thread::sleep(Duration::from_millis(600));
    let out = t.stop();
    assert!(out.status.success(), "{}", out.stderr);
    let recs = ndjson(&out.stdout);
    let stats = last_stats(&recs);
    assert_accounted(stats);
    if !std::path::Path::new("/sys/kernel/btf/vmlinux").exists() {
        eprintln!("skipped: no kernel BTF, no copy records");
        return;
    }
    let copied = stats["kernel"]["packets_copied"].as_u64().unwrap();
    let txs = transactions(&out.stdout);
    let ours: Vec<_> = txs
        .iter()
        .filter(|t| t["question"]["name"] == "www.lab.test.")
        .collect();
    assert_eq!(ours.len(), 1, "{txs:#?}");
    let client_leg = &ours[0]["legs"][0];
    let hops = client_leg["hops"].as_array().unwrap();
    // The query and the answer, each at both ends of two veth pairs.
    assert_eq!(hops.len(), 8, "{client_leg:#}");
    assert!(
        hops.iter().all(|h| h["dns_id"] == client_leg["dns_id"]),
        "{client_leg:#}"
    );
    // Each of those messages sent whole once: at least three copies of each.
    assert!(copied >= 6, "packets_copied {copied}: {stats}");
    // Every packet record of the answer carries the same answer, rebuilt or not.
    let answers: Vec<&Value> = recs
        .iter()
        .filter(|r| {
            r["type"] == "packet"
                && r["dns"]["questions"][0]["name"] == "www.lab.test."
                && r["dns"]["id"] == client_leg["dns_id"]
                && r["dns"]["qr"] == true
        })
        .map(|r| &r["dns"]["answers"])
        .collect();
    assert_eq!(answers.len(), 4, "{recs:#?}");
    assert!(answers.windows(2).all(|w| w[0] == w[1]), "{answers:#?}");
}

#[test]
fn search_list_expansion_is_one_lookup() {
    let Some(lab) = lab() else { return };
    let t = trace_node(&lab, &[]);
    // glibc with the pod's resolv.conf (ndots:5): A and AAAA for each search domain.
    let o = lab.exec(lab.client_ns(), &["getent", "ahosts", "www.lab.test"]);
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("10.250.0.80"),
        "{o:?}"
    );
    std::thread::sleep(Duration::from_millis(600));
    let out = t.stop();
    assert!(out.status.success(), "{}", out.stderr);
    let txs = transactions(&out.stdout);
    let last = txs
        .iter()
        .find(|t| t["question"]["name"] == "www.lab.test." && t["question"]["type"] == "A")
        .unwrap_or_else(|| panic!("final A query not found: {txs:#?}"));
    let lookup = &last["lookup"]["id"];
    let steps: Vec<_> = txs
        .iter()
        .filter(|t| &t["lookup"]["id"] == lookup)
        .collect();
    let nx: Vec<_> = steps.iter().filter(|t| t["rcode"] == "NXDOMAIN").collect();
    assert!(
        nx.iter()
            .any(|t| t["question"]["name"] == "www.lab.test.default.svc.cluster.local."),
        "first search step missing from the lookup: {steps:#?}"
    );
    assert!(nx.len() >= 3, "{steps:#?}");
    assert_eq!(last["answers"][0], "A 10.250.0.80");
    assert!(last["lookup"]["step"].as_u64().unwrap() >= 3, "{last:#}");
    eprintln!(
        "lookup {lookup}: {} transactions, {} NXDOMAIN",
        steps.len(),
        nx.len()
    );
}

#[test]
fn unanswered_query_times_out_and_its_retry_is_linked() {
    let Some(lab) = lab() else { return };
    let _hole = Hole::new(&lab).unwrap();
    let t = trace_node(&lab, &["--timeout", "1"]);
    let o = lab.dig(&["+time=1", "+tries=2", "@10.250.0.54", "void.lab.test.", "A"]);
    let dig_out = String::from_utf8_lossy(&o.stdout);
    assert!(dig_out.contains("timed out"), "{dig_out}");
    // Timeout (1 s) + retry grace (1.5 s) after the retry.
    std::thread::sleep(Duration::from_millis(3000));
    let out = t.stop();
    assert!(out.status.success(), "{}", out.stderr);
    let txs = transactions(&out.stdout);
    let ours: Vec<_> = txs
        .iter()
        .filter(|t| t["question"]["name"] == "void.lab.test.")
        .collect();
    assert_eq!(
        ours.len(),
        1,
        "the retry must join the first attempt: {txs:#?}"
    );
    let t = ours[0];
    assert_eq!(t["outcome"], "unanswered", "{t:#}");
    assert!(
        t["summary"]
            .as_str()
            .unwrap()
            .contains("unanswered after 1.0 s"),
        "{t:#}"
    );
    assert!(t["summary"].as_str().unwrap().contains("retried"), "{t:#}");
    let legs = t["legs"].as_array().unwrap();
    let attempts = legs.len() as u64 + legs[0]["retransmits"].as_u64().unwrap();
    assert!(attempts >= 2, "{t:#}");
}

/// `--snaplen 200` cuts the ~700-byte TXT answer at every hop: the transaction is still
/// answered, with the answers that fit and a note where the answer was cut; nothing is
/// malformed and nothing waits for a timeout.
#[test]
fn answer_cut_by_the_snaplen_still_answers() {
    let Some(lab) = lab() else { return };
    let t = Tracer::start(
        &lab,
        lab.node_ns(),
        &["trace", "-o", "json", "--snaplen", "200"],
    )
    .unwrap();
    let o = lab.dig(&["+time=2", "+tries=1", "medium.lab.test.", "TXT"]);
    let dig_out = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success() && dig_out.contains("status: NOERROR"),
        "{dig_out}"
    );
    assert!(dig_out.contains("ANSWER: 8"), "{dig_out}");
    std::thread::sleep(Duration::from_millis(600));
    let out = t.stop();
    assert!(out.status.success(), "{}", out.stderr);
    let recs = ndjson(&out.stdout);
    let txs = transactions(&out.stdout);
    let t = txs
        .iter()
        .find(|t| t["question"]["name"] == "medium.lab.test.")
        .unwrap_or_else(|| panic!("no transaction: {txs:#?}"));
    assert_eq!(t["outcome"], "answered", "{t:#}");
    assert_eq!(t["rcode"], "NOERROR", "{t:#}");
    let answers = t["answers"].as_array().unwrap();
    assert!(
        !answers.is_empty() && answers.len() < 8,
        "the answers that fit in 200 bytes: {t:#}"
    );
    assert!(answers
        .iter()
        .all(|a| a.as_str().unwrap().starts_with("TXT \"")));
    let cut = &t["answer_cut"];
    assert_eq!(cut["captured_bytes"], 200, "{t:#}");
    assert!(cut["message_bytes"].as_u64().unwrap() > 600, "{t:#}");
    assert_eq!(
        cut["answers"].as_u64().unwrap() as usize + answers.len(),
        8,
        "{t:#}"
    );
    let summary = t["summary"].as_str().unwrap();
    eprintln!("medium.lab.test. TXT with --snaplen 200: {summary}");
    assert!(
        summary.contains("answer cut by the capture at 200 of"),
        "{summary}"
    );
    assert!(!summary.contains("unanswered"), "{summary}");
    // Every leg (client → ClusterIP, the pod's forward to the upstream) answered.
    let legs = t["legs"].as_array().unwrap();
    assert!(legs.len() >= 2, "{t:#}");
    assert!(legs.iter().all(|l| l["outcome"] == "answered"), "{t:#}");
    // The packets: responses cut, none malformed.
    let packets: Vec<_> = recs.iter().filter(|r| r["type"] == "packet").collect();
    assert!(
        packets.iter().all(|p| p.get("malformed").is_none()),
        "{packets:#?}"
    );
    let cut_packets = packets
        .iter()
        .filter(|p| p["capture_truncated"] == true)
        .count();
    assert!(cut_packets >= 4, "every hop of both answers: {packets:#?}");
    let stats = recs.last().unwrap();
    assert_eq!(stats["type"], "stats");
    assert_eq!(stats["malformed"], 0, "{stats}");
    assert_eq!(stats["capture_truncated"], cut_packets, "{stats}");
}

/// `dnspath trace -o json` over every namespace of this lab and the extra ones (not
/// `--all-netns`: other labs may share the machine), with a 3 s correlation timeout.
fn trace_lab(lab: &Lab, extra_ns: &[&str]) -> Tracer {
    let mut args = vec![
        "trace",
        "-o",
        "json",
        "--view",
        "transactions",
        "--timeout",
        "3",
    ];
    for ns in lab
        .namespaces()
        .into_iter()
        .skip(1)
        .chain(extra_ns.iter().copied())
    {
        args.extend(["--netns", ns]);
    }
    Tracer::start(lab, lab.node_ns(), &args).unwrap()
}

fn the_one<'a>(txs: &'a [Value], name: &str) -> &'a Value {
    let ours: Vec<&Value> = txs
        .iter()
        .filter(|t| t["question"]["name"] == name)
        .collect();
    assert_eq!(ours.len(), 1, "one transaction of {name}: {txs:#?}");
    ours[0]
}

/// The upstream answers after 1.6 s, the client waits 1 s: dig says "no servers could be
/// reached", the kernel drops the answer for want of a socket, and dnspath must say the
/// answer was late — never `answered`. The same server with a client that waits 3 s is
/// answered.
#[test]
fn an_answer_after_the_client_gave_up_is_late_not_answered() {
    let Some(lab) = lab() else { return };
    let slow = Hole::slow(&lab, Duration::from_millis(1600), 1).unwrap();
    let t = trace_lab(&lab, &[slow.ns()]);
    let at = format!("@{SLOW_ADDR}");
    let o = lab.dig(&["+time=1", "+tries=1", &at, "late.lab.test.", "A"]);
    assert!(!o.status.success(), "dig must give up: {o:?}");
    let o = lab.dig(&["+time=3", "+tries=1", &at, "patient.lab.test.", "A"]);
    assert!(o.status.success(), "{o:?}");
    std::thread::sleep(Duration::from_millis(1500));
    let out = t.stop();
    assert!(out.status.success(), "{}", out.stderr);
    let txs = transactions(&out.stdout);

    let late = the_one(&txs, "late.lab.test.");
    assert_eq!(late["outcome"], "late", "{late:#}");
    assert_eq!(late["latency_ns"], Value::Null, "{late:#}");
    let answer_ns = late["late_answer_ns"].as_u64().unwrap();
    assert!(
        (1_500_000_000..2_500_000_000).contains(&answer_ns),
        "{late:#}"
    );
    let summary = late["summary"].as_str().unwrap();
    assert!(
        summary.contains("after the client had given up"),
        "{summary}"
    );
    assert!(summary.contains("__udp4_lib_rcv"), "{summary}");
    let leg = &late["legs"][0];
    assert_eq!(leg["outcome"], "late", "{late:#}");
    assert_eq!(leg["drop"]["netns"], lab.client_ns(), "{late:#}");
    assert_eq!(leg["drop"]["response"], true, "{late:#}");

    let patient = the_one(&txs, "patient.lab.test.");
    assert_eq!(patient["outcome"], "answered", "{patient:#}");
    assert!(
        patient["latency_ns"].as_u64().unwrap() >= 1_500_000_000,
        "{patient:#}"
    );
}

/// The same through a real forwarder: the client asks the ClusterIP, the "CoreDNS" pods
/// (dnsdist) forward to the slow server, get its answer after 1.6 s and pass it on to a
/// client that left after 1 s. The forwarder's own leg is answered; the client's is late.
#[test]
fn a_forwarders_late_answer_to_a_client_that_gave_up_is_late() {
    let Some(mut lab) = lab() else { return };
    let slow = Hole::slow(&lab, Duration::from_millis(1600), 1).unwrap();
    let to_slow = DnsPodConfig::new(DnsServerKind::Dnsdist)
        .forwarding_to(format!("{SLOW_ADDR}:53").parse().unwrap());
    for i in 0..lab.dns_pod_count() {
        lab.reconfigure_dns_pod(i, to_slow.clone()).unwrap();
    }
    let t = trace_lab(&lab, &[slow.ns()]);
    let o = lab.dig(&["+time=1", "+tries=1", "late.lab.test.", "A"]);
    assert!(!o.status.success(), "dig must give up: {o:?}");
    std::thread::sleep(Duration::from_millis(2000));
    let out = t.stop();
    assert!(out.status.success(), "{}", out.stderr);
    let txs = transactions(&out.stdout);
    let late = the_one(&txs, "late.lab.test.");
    assert_eq!(late["outcome"], "late", "{late:#}");
    let legs = late["legs"].as_array().unwrap();
    assert_eq!(legs[0]["outcome"], "late", "{late:#}");
    let forward = legs
        .iter()
        .find(|l| l["role"] == "forward")
        .unwrap_or_else(|| panic!("the forwarder's query: {late:#}"));
    assert_eq!(forward["outcome"], "answered", "{late:#}");
    assert_eq!(forward["server"], format!("{SLOW_ADDR}:53"), "{late:#}");
}

/// An answer that reached the client pod's interface and was dropped by a rule in the pod's
/// own namespace (a sidecar's iptables) never reached dig: `dropped`, with that drop.
#[test]
fn an_answer_dropped_in_the_clients_namespace_is_dropped() {
    let Some(lab) = lab() else { return };
    let t = trace_lab(&lab, &[]);
    let rule = ["INPUT", "-p", "udp", "--sport", "53", "-j", "DROP"];
    let added = lab.iptables_rule(lab.client_ns(), "-I", &rule);
    assert!(added.status.success(), "{added:?}");
    let o = lab.dig(&["+time=1", "+tries=1", "www.lab.test.", "A"]);
    assert!(
        !o.status.success(),
        "the rule must keep the answer from dig: {o:?}"
    );
    let removed = lab.iptables_rule(lab.client_ns(), "-D", &rule);
    assert!(removed.status.success(), "{removed:?}");
    std::thread::sleep(Duration::from_millis(800));
    let out = t.stop();
    assert!(out.status.success(), "{}", out.stderr);
    let txs = transactions(&out.stdout);
    let t = the_one(&txs, "www.lab.test.");
    assert_eq!(t["outcome"], "dropped", "{t:#}");
    assert_eq!(t["latency_ns"], Value::Null, "{t:#}");
    assert_eq!(t["legs"][0]["outcome"], "dropped", "{t:#}");
    assert_eq!(t["legs"][0]["drop"]["netns"], lab.client_ns(), "{t:#}");
    let summary = t["summary"].as_str().unwrap();
    assert!(summary.contains("dropped by the kernel"), "{summary}");
}

/// A server that answers twice: dig takes the first copy and closes its socket, the kernel
/// drops the second for want of a socket. The client got its answer: `answered`.
#[test]
fn a_duplicate_answer_after_the_first_was_delivered_stays_answered() {
    let Some(lab) = lab() else { return };
    let slow = Hole::slow(&lab, Duration::from_millis(20), 2).unwrap();
    let t = trace_lab(&lab, &[slow.ns()]);
    let at = format!("@{SLOW_ADDR}");
    let o = lab.dig(&["+time=2", "+tries=1", &at, "twice.lab.test.", "A"]);
    assert!(o.status.success(), "{o:?}");
    std::thread::sleep(Duration::from_millis(800));
    let out = t.stop();
    assert!(out.status.success(), "{}", out.stderr);
    let recs = ndjson(&out.stdout);
    let txs = transactions(&out.stdout);
    let t = the_one(&txs, "twice.lab.test.");
    assert_eq!(t["outcome"], "answered", "{t:#}");
    assert_eq!(t["legs"][0]["outcome"], "answered", "{t:#}");
    // The second copy did come, and the kernel did drop it: the case is the one meant.
    let client_hops = t["legs"][0]["hops"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|h| h["qr"] == true && h["netns"] == lab.client_ns())
        .count();
    assert_eq!(client_hops, 2, "{t:#}");
    assert!(
        recs.iter().any(|r| r["type"] == "drop"
            && r["netns"] == lab.client_ns()
            && r["dns"]["id"].is_u64()),
        "the duplicate's drop: {recs:#?}"
    );
}

/// NodeLocal DNSCache's real shape: the client asks the cluster DNS address, which the
/// node's cache answers on (NOTRACK'd); a miss goes over TCP to kube-dns-upstream, DNAT'd to
/// a "CoreDNS" pod, and on to the upstream. Each question is one tree from the client to
/// the upstream, its first leg labelled `miss`; asked again, `hit` with no child; over TCP
/// from the client the same; a client asking the CoreDNS pod itself is a `bypass`.
#[test]
fn node_local_dns_cache_hits_misses_and_bypass_are_one_tree_each() {
    let Some(lab) = lab() else { return };
    let _cache = NodeCache::start(&lab).unwrap();
    let t = trace_lab(&lab, &[]);
    let dig = |args: &[&str]| {
        let o = lab.dig(args);
        assert!(o.status.success(), "{args:?}: {o:?}");
    };
    dig(&["+time=2", "+tries=1", "www.lab.test.", "A"]);
    dig(&["+time=2", "+tries=1", "www.lab.test.", "A"]);
    dig(&["+tcp", "+time=2", "+tries=1", "txt.lab.test.", "TXT"]);
    dig(&["+tcp", "+time=2", "+tries=1", "txt.lab.test.", "TXT"]);
    let coredns = format!("@{}", lab.ip_of(Pod::Dns(0)));
    dig(&["+time=2", "+tries=1", &coredns, "ns.lab.test.", "A"]);
    std::thread::sleep(Duration::from_millis(800));
    let out = t.stop();
    assert!(out.status.success(), "{}", out.stderr);
    let txs = transactions(&out.stdout);
    let of = |name: &str| -> Vec<&Value> {
        txs.iter()
            .filter(|t| t["question"]["name"] == name && t["client_netns"] == lab.client_ns())
            .collect()
    };
    for (name, proto) in [("www.lab.test.", "udp"), ("txt.lab.test.", "tcp")] {
        let both = of(name);
        assert_eq!(both.len(), 2, "{name}: a miss and a hit: {txs:#?}");
        let (miss, hit) = (both[0], both[1]);
        for t in [miss, hit] {
            assert_eq!(t["outcome"], "answered", "{t:#}");
            assert_eq!(t["legs"][0]["proto"], proto, "{t:#}");
            assert_eq!(
                t["legs"][0]["server"],
                format!("{}:53", lab.cluster_ip()),
                "{t:#}"
            );
        }
        let legs = miss["legs"].as_array().unwrap();
        assert_eq!(legs[0]["node_cache"], "miss", "{miss:#}");
        // The cache's own query: TCP to kube-dns-upstream, from the node's address (the
        // DNAT in the node's `nat OUTPUT` comes before any TC hook: its first hop already
        // has the pod's address).
        let to_coredns = legs
            .iter()
            .find(|l| l["parent"] == 0)
            .unwrap_or_else(|| panic!("the cache's query is the client's child: {miss:#}"));
        assert_eq!(to_coredns["proto"], "tcp", "{miss:#}");
        assert_eq!(to_coredns["role"], "forward", "{miss:#}");
        assert_eq!(
            to_coredns["backend"],
            format!("{}:53", lab.ip_of(Pod::Dns(0))),
            "{miss:#}"
        );
        assert_ne!(
            to_coredns["client"].as_str().unwrap().split(':').next(),
            Some("10.244.1.2")
        );
        let to_upstream = legs
            .iter()
            .find(|l| l["parent"] == 1)
            .unwrap_or_else(|| panic!("CoreDNS's query to the upstream: {miss:#}"));
        assert_eq!(to_upstream["server"], "10.250.0.53:53", "{miss:#}");
        assert_eq!(hit["legs"].as_array().unwrap().len(), 1, "{hit:#}");
        assert_eq!(hit["legs"][0]["node_cache"], "hit", "{hit:#}");
    }
    let bypass = of("ns.lab.test.");
    assert_eq!(bypass.len(), 1, "{txs:#?}");
    assert_eq!(
        bypass[0]["legs"][0]["node_cache"], "bypass",
        "{:#}",
        bypass[0]
    );
}

/// Dual-stack: the client asks an IPv6 ClusterIP (an ip6tables DNAT on the node, as
/// kube-proxy writes for an IPv6 Service) that leads to a "CoreDNS" pod, which forwards over
/// IPv4. One tree: the pod's IPv4 query is the child of the IPv6 question it received.
#[test]
fn a_question_asked_over_ipv6_and_forwarded_over_ipv4_is_one_tree() {
    let Some(lab) = lab() else { return };
    lab::tracer::require_tools(&["ip6tables"]);
    const SERVICE6: &str = "fd00:96::10";
    let pod6 = format!("[{}]:53", lab.ip6_of(Pod::Dns(0)));
    let rule = [
        "ip6tables",
        "-w",
        "-t",
        "nat",
        "-A",
        "PREROUTING",
        "-d",
        SERVICE6,
        "-p",
        "udp",
        "--dport",
        "53",
        "-j",
        "DNAT",
        "--to-destination",
        &pod6,
    ];
    let added = lab.exec(lab.node_ns(), &rule);
    assert!(added.status.success(), "{rule:?}: {added:?}");
    let t = trace_lab(&lab, &[]);
    let at = format!("@{SERVICE6}");
    let o = lab.dig(&["+time=2", "+tries=1", &at, "www.lab.test.", "A"]);
    assert!(o.status.success(), "{o:?}");
    std::thread::sleep(Duration::from_millis(800));
    let out = t.stop();
    assert!(out.status.success(), "{}", out.stderr);
    let txs = transactions(&out.stdout);
    let t = the_one(&txs, "www.lab.test.");
    assert_eq!(t["outcome"], "answered", "{t:#}");
    let legs = t["legs"].as_array().unwrap();
    assert_eq!(legs[0]["server"], format!("[{SERVICE6}]:53"), "{t:#}");
    assert_eq!(legs[0]["backend"], pod6, "{t:#}");
    let forward = legs
        .iter()
        .find(|l| l["parent"] == 0)
        .unwrap_or_else(|| panic!("the pod's IPv4 query is the question's child: {t:#}"));
    assert_eq!(forward["server"], "10.250.0.53:53", "{t:#}");
    assert_eq!(forward["role"], "forward", "{t:#}");
    // No second transaction for the pod's own query.
    assert!(
        !txs.iter().any(|x| x["question"]["name"] == "www.lab.test."
            && x["client"].as_str().unwrap().starts_with("10.244.1.3")),
        "{txs:#?}"
    );
}

/// A second "Service" in the node's `nat` table: `10.96.0.99:53` DNATed to the slow server.
const SLOW_SERVICE: &str = "10.96.0.99";

/// An answer that missed its reverse NAT (docs/output.md, `unexpected_source`): the client
/// asks a Service DNATed to a server that answers after 1.5 s, and the node's conntrack entry
/// of the query is deleted meanwhile (as kube-proxy does to a Service's UDP entries when an
/// endpoint goes). The answer then reaches the client from the server's own address, which
/// dig's socket does not take. Named once, with both addresses, after its transaction; the
/// same lookup with its entry left alone is not.
#[test]
fn an_answer_that_missed_its_reverse_nat_is_named() {
    let Some(lab) = lab() else { return };
    let slow = Hole::slow(&lab, Duration::from_millis(1500), 1).unwrap();
    let dnat = [
        "PREROUTING",
        "-t",
        "nat",
        "-d",
        SLOW_SERVICE,
        "-p",
        "udp",
        "--dport",
        "53",
        "-j",
        "DNAT",
        "--to-destination",
        SLOW_ADDR,
    ];
    let o = lab.iptables_rule(lab.node_ns(), "-I", &dnat);
    assert!(o.status.success(), "{o:?}");
    let t = trace_lab(&lab, &[slow.ns()]);
    let at = format!("@{SLOW_SERVICE}");
    // Its entry left alone: answered from the Service.
    let o = lab.dig(&["+time=3", "+tries=1", &at, "kept.lab.test.", "A"]);
    assert!(o.status.success(), "{o:?}");
    // Its entry deleted while the server takes its time.
    let (o, deleted) = std::thread::scope(|s| {
        let dig = s.spawn(|| lab.dig(&["+time=3", "+tries=1", &at, "unnat.lab.test.", "A"]));
        std::thread::sleep(Duration::from_millis(600));
        let deleted = lab.exec(
            lab.node_ns(),
            &["conntrack", "-D", "-p", "udp", "--orig-dst", SLOW_SERVICE],
        );
        (dig.join().unwrap(), deleted)
    });
    assert!(deleted.status.success(), "{deleted:?}");
    assert!(!o.status.success(), "dig must not take the answer: {o:?}");
    std::thread::sleep(Duration::from_millis(1500));
    let out = t.stop();
    assert!(out.status.success(), "{}", out.stderr);
    let recs = ndjson(&out.stdout);
    let found: Vec<&Value> = recs
        .iter()
        .filter(|r| r["type"] == "unexpected_source")
        .collect();
    let txs = transactions(&out.stdout);
    assert_eq!(
        found.len(),
        1,
        "{found:#?}\n{:#}",
        the_one(&txs, "unnat.lab.test.")
    );
    let u = found[0];
    assert_eq!(u["question"]["name"], "unnat.lab.test.", "{u:#}");
    assert_eq!(u["asked"], format!("{SLOW_SERVICE}:53"), "{u:#}");
    assert_eq!(u["answered_from"], format!("{SLOW_ADDR}:53"), "{u:#}");
    assert_eq!(u["netns"], lab.client_ns(), "{u:#}");
    let tx = the_one(&txs, "unnat.lab.test.");
    assert_eq!(u["transaction"], tx["id"], "{u:#}\n{tx:#}");
    assert_ne!(tx["outcome"], "answered", "{tx:#}");
    the_one(&txs, "kept.lab.test.");
    lab.iptables_rule(lab.node_ns(), "-D", &dnat);
}
