#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "integration tests fail at the line that broke"
)]
//! Transactions against the lab: one query followed through DNAT and forwarders, search-list
//! lookups, unanswered queries and their retries. Root only; `--test-threads=1`.
use std::time::Duration;

use lab::{
    hole::Hole,
    tracer::Tracer,
    tracer::{lab_or_skip, ndjson},
    Lab, LabConfig, Pod,
};

use serde_json::Value;

fn lab() -> Option<Lab> {
    lab_or_skip(LabConfig::default())
}

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
