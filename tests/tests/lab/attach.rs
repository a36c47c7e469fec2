#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "integration tests fail at the line that broke"
)]
//! Where dnspath attaches: devices without an Ethernet header, VLAN tags, namespaces that
//! come and go while it runs. Root only; `--test-threads=1`.
use std::{process::Command, thread, time::Duration};

use lab::{tracer::ndjson as records, tracer::Tracer, Pod};
use serde_json::Value;

use crate::shared::lab;

fn packets_for<'a>(recs: &'a [Value], name: &str) -> Vec<&'a Value> {
    recs.iter()
        .filter(|r| r["type"] == "packet" && r["dns"]["questions"][0]["name"] == name)
        .collect()
}

/// A namespace made by the test itself, deleted on drop.
struct TestNetns(String);

impl TestNetns {
    fn new(name: String) -> Self {
        let ok = Command::new("ip")
            .args(["netns", "add", &name])
            .status()
            .unwrap()
            .success();
        assert!(ok, "ip netns add {name}");
        let ok = Command::new("ip")
            .args(["-n", &name, "link", "set", "lo", "up"])
            .status()
            .unwrap()
            .success();
        assert!(ok);
        TestNetns(name)
    }
}

impl Drop for TestNetns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
    }
}

#[test]
fn device_without_ethernet_header_is_traced() {
    let Some(lab) = lab() else { return };
    let ns = lab.client_ns();
    for args in [
        vec!["ip", "tuntap", "add", "dev", "tun0", "mode", "tun"],
        vec!["ip", "link", "set", "tun0", "up"],
        vec!["ip", "addr", "add", "10.77.0.1/24", "dev", "tun0"],
    ] {
        let o = lab.exec(ns, &args);
        assert!(o.status.success(), "{args:?}: {o:?}");
    }
    let t = Tracer::start(&lab, lab.node_ns(), &["trace", "-o", "json", "--netns", ns]).unwrap();
    // No reader on the tun: the query leaves through it (egress TC sees it) and is dropped.
    let _ = lab.dig(&["+time=1", "+tries=1", "@10.77.0.2", "tun.test."]);
    let out = t.stop();
    assert!(out.status.success(), "{}", out.stderr);
    let recs = records(&out.stdout);
    let on_tun: Vec<_> = packets_for(&recs, "tun.test.")
        .into_iter()
        .filter(|r| r["ifname"] == "tun0")
        .collect();
    assert!(!on_tun.is_empty(), "nothing seen on tun0: {recs:?}");
    assert_eq!(on_tun[0]["dir"], "egress");
    assert_eq!(on_tun[0]["netns"], ns);
    assert_eq!(on_tun[0]["dst"], "10.77.0.2:53");
}

/// An 802.1Q-tagged DNS query sent raw from the client pod: its egress TC sees the tag in
/// the packet, the node's ingress TC sees it in skb metadata after the kernel untags it.
#[test]
fn vlan_tagged_query_is_decoded() {
    let Some(lab) = lab() else { return };
    let mac = String::from_utf8(
        lab.exec(
            lab.node_ns(),
            &[
                "cat",
                &format!("/sys/class/net/{}/address", lab.veth_of(Pod::Client)),
            ],
        )
        .stdout,
    )
    .unwrap();
    let script = format!(
        r#"
import socket, struct
def csum(b):
    if len(b) % 2: b += b'\0'
    s = sum(struct.unpack('!%dH' % (len(b)//2), b))
    while s >> 16: s = (s & 0xffff) + (s >> 16)
    return ~s & 0xffff
q = struct.pack('!HHHHHH', 0x4242, 0x0100, 1, 0, 0, 0) + b'\x04vlan\x04test\x00' + struct.pack('!HH', 1, 1)
udp = struct.pack('!HHHH', 40000, 53, 8 + len(q), 0) + q
src, dst = socket.inet_aton('10.244.1.2'), socket.inet_aton('10.250.0.53')
ip = struct.pack('!BBHHHBBH4s4s', 0x45, 0, 20 + len(udp), 1, 0, 64, 17, 0, src, dst)
ip = ip[:10] + struct.pack('!H', csum(ip)) + ip[12:]
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
s.bind(('eth0', 0))
dmac = bytes.fromhex('{mac}'.replace(':', ''))
smac = open('/sys/class/net/eth0/address').read().strip()
smac = bytes.fromhex(smac.replace(':', ''))
s.send(dmac + smac + struct.pack('!HHH', 0x8100, 100, 0x0800) + ip + udp)
"#,
        mac = mac.trim()
    );
    let t = Tracer::start(
        &lab,
        lab.node_ns(),
        &[
            "trace",
            "-o",
            "json",
            "--netns",
            lab.client_ns(),
            "-i",
            lab.veth_of(Pod::Client),
        ],
    )
    .unwrap();
    let o = lab.exec(lab.client_ns(), &["python3", "-c", &script]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    thread::sleep(Duration::from_millis(300));
    let out = t.stop();
    assert!(out.status.success(), "{}", out.stderr);
    let recs = records(&out.stdout);
    let seen = packets_for(&recs, "vlan.test.");
    assert!(
        seen.iter()
            .any(|r| r["netns"] == lab.client_ns() && r["dir"] == "egress" && r["vlan"] == 100),
        "tag in the packet (client egress) not handled: {seen:?}"
    );
    assert!(
        seen.iter()
            .any(|r| r["netns"] == lab.node_ns() && r["dir"] == "ingress" && r["vlan"] == 100),
        "tag in skb metadata (node ingress) not handled: {seen:?}"
    );
    assert!(seen
        .iter()
        .all(|r| r["dns"]["id"] == 0x4242 && r["src"] == "10.244.1.2:40000"));
}

/// In namespace `ns`, UDP queries to 127.0.0.1:`port` DNATed to 127.0.0.2:`port` (nothing
/// listens there; the query is still on `lo`), so that its conntrack has a flow to report.
fn nat_loopback(lab: &lab::Lab, ns: &str, port: &str) {
    let to = format!("127.0.0.2:{port}");
    let rule = [
        "nat",
        "-A",
        "OUTPUT",
        "-p",
        "udp",
        "-d",
        "127.0.0.1",
        "--dport",
        port,
        "-j",
        "DNAT",
        "--to-destination",
        &to,
    ];
    let out = lab.iptables_rule(ns, "-t", &rule);
    assert!(out.status.success(), "{out:?}");
}

/// One query to 127.0.0.1 from inside namespace `ns` (nothing need listen: the query is on
/// its `lo` either way).
fn dig_loopback(ns: &str, name: &str) {
    let o = Command::new("ip")
        .args([
            "netns",
            "exec",
            ns,
            "dig",
            "+time=1",
            "+tries=1",
            "@127.0.0.1",
            name,
        ])
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&o.stdout).contains(name.trim_end_matches('.')),
        "{o:?}"
    );
}

#[test]
fn namespaces_appearing_and_vanishing_are_followed() {
    let Some(lab) = lab() else { return };
    let t = Tracer::start(&lab, lab.node_ns(), &["trace", "-o", "json", "--all-netns"]).unwrap();
    let name = format!("{}-late", lab.prefix());
    let late = TestNetns::new(name.clone());
    // Picked up as it appears (inotify on /run/netns), well within this.
    thread::sleep(Duration::from_millis(1100));
    dig_loopback(&name, "late.test.");
    drop(late);
    thread::sleep(Duration::from_millis(1100));
    let out = t.stop();
    assert!(out.status.success(), "{}", out.stderr);
    assert!(
        !out.stderr.to_lowercase().contains("warn") && !out.stderr.to_lowercase().contains("error"),
        "vanishing namespace caused noise: {}",
        out.stderr
    );
    let recs = records(&out.stdout);
    let seen = packets_for(&recs, "late.test.");
    assert!(
        seen.iter()
            .any(|r| r["netns"] == name.as_str() && r["ifname"] == "lo"),
        "query in the new namespace not seen: {seen:?}"
    );
}

/// A pod's namespace made while dnspath runs is attached to, and its conntrack followed, from
/// events (a bind mount under /run/netns), not a rescan: a query made 300 ms after the
/// namespace appeared is traced, and the NAT its own iptables rule makes is read from its
/// conntrack table (before, conntrack was followed only in namespaces there at start, and
/// interfaces were rescanned every 500 ms).
#[test]
fn a_namespace_made_while_tracing_is_traced_from_its_first_query() {
    let Some(lab) = lab() else { return };
    let t = Tracer::start(&lab, lab.node_ns(), &["trace", "-o", "json", "--all-netns"]).unwrap();
    let name = format!("{}-new", lab.prefix());
    let late = TestNetns::new(name.clone());
    // NAT in the new namespace, so that its conntrack has a DNS flow to report: the query to
    // 127.0.0.1:53 is sent to 127.0.0.2:53 (nothing listens; the query is still on `lo`).
    nat_loopback(&lab, &name, "53");
    thread::sleep(Duration::from_millis(300));
    dig_loopback(&name, "first.test.");
    let out = t.stop();
    drop(late);
    assert!(out.status.success(), "{}", out.stderr);
    let recs = records(&out.stdout);
    let seen = packets_for(&recs, "first.test.");
    assert!(
        seen.iter()
            .any(|r| r["netns"] == name.as_str() && r["ifname"] == "lo"),
        "the first query in the new namespace not seen: {seen:?}"
    );
    let ct = &lab::tracer::last_stats(&recs)["conntrack"];
    assert!(
        ct["events"].as_u64().unwrap_or(0) >= 1,
        "no conntrack event from the new namespace's NAT: {ct}"
    );
}

/// Conntrack is followed in every namespace, not the first 64 (its old cap): 70 namespaces
/// of the test's own besides the lab's, there before the tracer starts, and the NAT of a
/// query in the last of them is read from its table; no namespace is capped. The tracer
/// watches a port only that query uses, so every conntrack event it counts is that NAT's.
#[test]
fn conntrack_is_followed_in_a_namespace_beyond_the_64th() {
    const PORT: &str = "5399";
    let Some(lab) = lab() else { return };
    let many: Vec<TestNetns> = (0..70)
        .map(|i| TestNetns::new(format!("{}-ct{i}", lab.prefix())))
        .collect();
    let last = many[many.len() - 1].0.clone();
    nat_loopback(&lab, &last, PORT);
    let args = ["trace", "-o", "json", "--all-netns", "--port", PORT];
    let t = Tracer::start(&lab, lab.node_ns(), &args).unwrap();
    // The conntrack thread opens each namespace after the first scan: a query a while
    // after the start, and three more a second apart (each a new flow, so a new conntrack
    // event) for a machine slowed by other work.
    for _ in 0..4 {
        thread::sleep(Duration::from_millis(1000));
        let o = Command::new("ip")
            .args([
                "netns", "exec", &last, "dig", "+time=1", "+tries=1", "-p", PORT,
            ])
            .args(["@127.0.0.1", "beyond.test."])
            .output()
            .unwrap();
        assert!(
            String::from_utf8_lossy(&o.stdout).contains("beyond.test"),
            "{o:?}"
        );
    }
    let out = t.stop();
    drop(many);
    assert!(out.status.success(), "{}", out.stderr);
    let recs = records(&out.stdout);
    assert!(
        packets_for(&recs, "beyond.test.")
            .iter()
            .any(|r| r["netns"] == last.as_str()),
        "the query in the 70th namespace not seen"
    );
    let ct = &lab::tracer::last_stats(&recs)["conntrack"];
    assert_eq!(ct["netns_capped"], 0, "{ct}");
    assert_eq!(ct["netns_changes_lost"], 0, "{ct}");
    assert_eq!(ct["kernel_unfiltered"], 0, "{ct}");
    let live = ct["events"].as_u64().unwrap_or(0) - ct["existing"].as_u64().unwrap_or(0);
    assert!(
        live >= 1,
        "no conntrack event from the 70th namespace's NAT: {ct}"
    );
}
