#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "integration tests fail at the line that broke"
)]
//! The conntrack DNAT race, reproduced with the real kernel: every drop attributed to its
//! query and socket, rule drops never called races, no false alarms on healthy traffic.
//! Root only; `--test-threads=1`.
use std::{thread, time::Duration};

use lab::{
    race,
    tracer::Tracer,
    tracer::{lab_or_skip as lab, ndjson as records},
    IptablesFlavor, Lab, LabConfig, Pod,
};
use serde_json::Value;

fn races<'a>(recs: &'a [Value], verdict: &str) -> Vec<&'a Value> {
    recs.iter()
        .filter(|r| r["type"] == "race" && r["verdict"] == verdict)
        .collect()
}

/// Sum over CPUs of (insert_failed, drop, clash_resolve) in the node namespace.
/// Whether the final stats say the kprobe pair on `__nf_conntrack_confirm` was loaded.
fn has_confirm_hook(recs: &[Value]) -> bool {
    let stats = recs
        .iter()
        .find(|r| r["type"] == "stats")
        .expect("a stats record");
    stats["kernel"]["hooks"]
        .as_array()
        .expect("stats.kernel.hooks")
        .iter()
        .any(|h| h == dnspath::kernel::CONFIRM_HOOK)
}

fn ct_totals(lab: &Lab) -> (u64, u64, u64) {
    race::ct_totals(&race::ct_stats(lab).unwrap())
}

fn trace(lab: &Lab) -> Tracer {
    Tracer::transactions(lab, &["--timeout", "1"]).unwrap()
}

/// docs/lab.md's deterministic race: the A query is held in NFQUEUE after DNAT, the AAAA
/// from the same socket goes straight to the pods; on release the A fails to confirm.
#[test]
fn forced_races_are_each_reported_with_query_and_socket() {
    let Some(lab) = lab(LabConfig::default()) else {
        return;
    };
    let rig = race::RaceRig::install(&lab, 300).unwrap();
    let t = trace(&lab);
    let before = ct_totals(&lab);
    let mut shots = Vec::new();
    for i in 0..10 {
        shots.push((
            format!("forced{i}.lab.test."),
            race::force_race(&lab, &format!("forced{i}.lab.test")).unwrap(),
        ));
    }
    let after = ct_totals(&lab);
    // Timeout 1 s + retry grace, then the counters sample.
    thread::sleep(Duration::from_secs(4));
    let out = t.stop();
    rig.remove().unwrap();
    assert!(out.status.success(), "{}", out.stderr);
    let recs = records(&out.stdout);
    let confirm_hook = has_confirm_hook(&recs);
    eprintln!("conntrack-confirm kprobes: {confirm_hook}");
    let drops = races(&recs, "race-drop");
    let insert_failed = after.0 - before.0;
    eprintln!(
        "forced: insert_failed +{insert_failed}, {} race drops reported",
        drops.len()
    );
    assert_eq!(insert_failed, 10);
    assert_eq!(drops.len() as u64, insert_failed, "{drops:#?}");
    for (name, shot) in &shots {
        let r = drops
            .iter()
            .find(|r| r["dropped"]["question"]["name"] == name.as_str())
            .unwrap_or_else(|| panic!("no race for {name}: {drops:#?}"));
        assert_eq!(
            r["client"],
            format!("{}:{}", lab.ip_of(Pod::Client), shot.src_port),
            "{r:#}"
        );
        assert_eq!(r["dropped"]["dns_id"], shot.a_id, "{r:#}");
        assert_eq!(r["dropped"]["question"]["type"], "A");
        assert_eq!(r["counter_confirmed"], true, "{r:#}");
        // Where the kernel has kprobes, its own word agrees with the counters'.
        if confirm_hook {
            assert_eq!(r["kernel_confirm_failed"], true, "{r:#}");
        } else {
            assert!(r["kernel_confirm_failed"].is_null(), "{r:#}");
        }
        assert_eq!(r["sibling"]["question"]["type"], "AAAA", "{r:#}");
        assert!(
            r["summary"]
                .as_str()
                .unwrap()
                .contains("A dropped by conntrack race"),
            "{r:#}"
        );
    }
}

/// docs/lab.md's natural race: two threads pinned to two CPUs send A (to the ClusterIP)
/// and AAAA (straight to both pods) from one socket. Every drop the kernel counts must be
/// attributed to its query; resolved clashes are counted.
#[test]
fn natural_two_cpu_race_drops_are_all_attributed() {
    let Some(lab) = lab(LabConfig::default()) else {
        return;
    };
    if std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
        < 2
    {
        eprintln!("skipped: needs two CPUs");
        return;
    }
    let script = format!(
        r#"
import os, socket, struct, threading, random
def q(name, qtype, id):
    h = struct.pack('!HHHHHH', id, 0x0100, 1, 0, 0, 0)
    return h + b''.join(bytes([len(l)]) + l.encode() for l in name.split('.')) + b'\0' + struct.pack('!HH', qtype, 1)
pods = ['{a}', '{b}']
for n in range(2000):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(('0.0.0.0', 0))
    name = 'r%d.lab.test' % n
    go = threading.Barrier(2)
    def a():
        os.sched_setaffinity(0, {{0}})
        go.wait()
        s.sendto(q(name, 1, random.randrange(65536)), ('10.96.0.10', 53))
    def aaaa():
        os.sched_setaffinity(0, {{1}})
        go.wait()
        for p in pods:
            s.sendto(q(name, 28, random.randrange(65536)), (p, 53))
    ts = [threading.Thread(target=a), threading.Thread(target=aaaa)]
    [t.start() for t in ts]
    [t.join() for t in ts]
    s.close()
"#,
        a = lab.ip_of(Pod::Dns(0)),
        b = lab.ip_of(Pod::Dns(1)),
    );
    let t = trace(&lab);
    let before = ct_totals(&lab);
    let o = lab.exec(lab.client_ns(), &["python3", "-c", &script]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let after = ct_totals(&lab);
    thread::sleep(Duration::from_secs(4));
    let out = t.stop();
    assert!(out.status.success(), "{}", out.stderr);
    let recs = records(&out.stdout);
    let drops = races(&recs, "race-drop");
    let clashes: u64 = races(&recs, "resolved-clash")
        .iter()
        .map(|r| r["counters"]["clash_resolve"].as_u64().unwrap())
        .sum();
    let insert_failed = after.0 - before.0;
    eprintln!(
        "2000 pairs: insert_failed +{insert_failed}, drop +{}, clash_resolve +{}; reported {} race drops, {clashes} resolved clashes",
        after.1 - before.1,
        after.2 - before.2,
        drops.len()
    );
    assert_eq!(
        drops.len() as u64,
        insert_failed,
        "every counted drop attributed, nothing else: {drops:#?}"
    );
    for d in &drops {
        assert!(
            d["client"].as_str().unwrap().starts_with("10.244.1.2:"),
            "{d:#}"
        );
        assert!(
            d["dropped"]["question"]["name"]
                .as_str()
                .unwrap()
                .starts_with('r'),
            "{d:#}"
        );
        assert_eq!(d["counter_confirmed"], true, "{d:#}");
    }
    assert_eq!(clashes, after.2 - before.2, "resolved clashes counted");
}

fn rule_drops_are_not_races(flavor: IptablesFlavor) {
    let Some(lab) = lab(LabConfig {
        iptables: flavor,
        ..LabConfig::default()
    }) else {
        return;
    };
    // A DROP for DNS to the pods in the node, and one inside the upstream's own namespace.
    let up_rule = ["INPUT", "-p", "udp", "--dport", "53", "-j", "DROP"];
    let t = trace(&lab);
    assert!(lab.pod_dns_drop("-I").status.success());
    let _ = lab.exec(lab.client_ns(), &["getent", "ahosts", "ruled.lab.test"]);
    assert!(lab.pod_dns_drop("-D").status.success());
    assert!(lab
        .iptables_rule(lab.ns_of(Pod::Upstream), "-I", &up_rule)
        .status
        .success());
    let _ = lab.dig(&["+time=1", "+tries=1", "upstream-dropped.lab.test."]);
    thread::sleep(Duration::from_secs(4));
    let out = t.stop();
    assert!(out.status.success(), "{}", out.stderr);
    let recs = records(&out.stdout);
    let drop_events: Vec<_> = recs
        .iter()
        .filter(|r| r["type"] == "drop" && r["benign"].is_null())
        .collect();
    // Before 5.17 the kernel gives no reason (UNKNOWN).
    let netfilter = drop_events
        .iter()
        .filter(|d| d["reason"] == "NETFILTER_DROP" || d["reason"] == "UNKNOWN")
        .count();
    if has_confirm_hook(&recs) {
        for d in &drop_events {
            assert_eq!(
                d["confirm_failed"], false,
                "a rule drop is no failed confirm: {d:#}"
            );
        }
    }
    let race_records: Vec<_> = recs
        .iter()
        .filter(|r| r["type"] == "race" && r["verdict"] != "resolved-clash")
        .collect();
    eprintln!(
        "{flavor:?}: {netfilter} NETFILTER_DROP events, {} race records",
        race_records.len()
    );
    assert!(
        netfilter >= 2,
        "the rules' drops were not seen: {drop_events:#?}"
    );
    assert!(
        race_records.is_empty(),
        "rule drops called races: {race_records:#?}"
    );
}

#[test]
fn nft_rule_drops_are_not_races() {
    rule_drops_are_not_races(IptablesFlavor::Nft);
}

#[test]
fn legacy_rule_drops_are_not_races() {
    rule_drops_are_not_races(IptablesFlavor::Legacy);
}

#[test]
fn healthy_getent_through_the_cluster_ip_has_no_races() {
    let Some(lab) = lab(LabConfig::default()) else {
        return;
    };
    let t = trace(&lab);
    let o = lab.exec(
        lab.client_ns(),
        &[
            "bash",
            "-c",
            "for i in $(seq 1000); do getent ahosts www.lab.test >/dev/null || echo FAIL; done",
        ],
    );
    assert!(o.status.success());
    let failures = String::from_utf8_lossy(&o.stdout).matches("FAIL").count();
    thread::sleep(Duration::from_secs(3));
    let out = t.stop();
    assert!(out.status.success(), "{}", out.stderr);
    let recs = records(&out.stdout);
    let txs = recs.iter().filter(|r| r["type"] == "transaction").count();
    let bad: Vec<_> = recs
        .iter()
        .filter(|r| r["type"] == "race" && r["verdict"] != "resolved-clash")
        .collect();
    eprintln!(
        "getent ×1000: {failures} failures, {txs} transactions, {} race records",
        bad.len()
    );
    assert_eq!(failures, 0);
    assert!(txs >= 8000, "{txs}");
    assert!(bad.is_empty(), "{bad:#?}");
}
