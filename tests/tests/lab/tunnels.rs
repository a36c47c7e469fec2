//! DNS between two nodes joined by a real Linux VXLAN device (flannel's shape): traced live
//! on both nodes, every hop seen — the encapsulated copies on the underlay too, with the
//! tunnel's VNI and outer addresses — and the query one leg; then the same from a
//! `tcpdump -i any` capture of node A analysed offline.
//! Run as root with `--test-threads=1` (`cargo xtask test`).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "integration tests fail at the line that broke"
)]
use std::{
    process::{Command, Stdio},
    time::Duration,
};

use lab::{
    tracer::{dnspath_bin, ndjson},
    tunnel::{VxlanNodes, ANSWER, CLIENT, DNS, NODE_A, NODE_B, VNI},
    watch::{read_all, Watched},
};
use serde_json::Value;

/// A process this test started, stopped with SIGINT (and waited for) on drop.
struct Running(Option<Watched<String>>);

impl Running {
    fn start(ns: &str, args: &[&str], ready: &str) -> Running {
        let child = Command::new("ip")
            .args(["netns", "exec", ns])
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .env("RUST_LOG", "warn")
            .spawn()
            .unwrap();
        let mut w = Watched::new(child, args[0], read_all);
        w.wait_for_stderr(ready, Duration::from_secs(60)).unwrap();
        Running(Some(w))
    }

    /// SIGINT, then stdout and stderr.
    fn stop(mut self) -> (String, String) {
        let w = self.0.take().unwrap();
        w.signal(libc::SIGINT);
        let done = w.finish();
        assert!(
            done.status.is_some_and(|s| s.success()),
            "{:?}: {}",
            done.status,
            done.stderr
        );
        (done.stdout, done.stderr)
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(w) = self.0.take() {
            w.signal(libc::SIGINT);
            let _ = w.finish();
        }
    }
}

/// `(namespace, ifname, dir)` of a packet or hop record.
fn place(r: &Value) -> (String, String, String) {
    (
        r["netns"].as_str().unwrap_or_default().to_owned(),
        r["ifname"].as_str().unwrap_or_default().to_owned(),
        r["dir"].as_str().unwrap_or_default().to_owned(),
    )
}

/// The records of the question `name`: its packet records and its transactions.
fn of_name<'a>(recs: &'a [Value], name: &str) -> (Vec<&'a Value>, Vec<&'a Value>) {
    let packets = recs
        .iter()
        .filter(|r| r["type"] == "packet" && r["dns"]["questions"][0]["name"] == name)
        .collect();
    let txs = recs
        .iter()
        .filter(|r| r["type"] == "transaction" && r["question"]["name"] == name)
        .collect();
    (packets, txs)
}

/// A tunnel object says VXLAN, our VNI, from `src` to `dst`.
fn assert_vxlan(t: &Value, src: std::net::Ipv4Addr, dst: std::net::Ipv4Addr, what: &str) {
    assert_eq!(t["kind"], "vxlan", "{what}: {t}");
    assert_eq!(t["vni"], VNI, "{what}: {t}");
    assert_eq!(t["src"], src.to_string(), "{what}: {t}");
    assert_eq!(t["dst"], dst.to_string(), "{what}: {t}");
}

fn nodes() -> Option<VxlanNodes> {
    if !lab::tracer::root_or_skip("network namespaces, a VXLAN device, eBPF") {
        return None;
    }
    lab::tracer::require_tools(&["ip", "dig", "dnsmasq", "tcpdump"]);
    Some(VxlanNodes::start().unwrap())
}

#[test]
fn dns_through_vxlan_is_one_leg_with_every_hop_live_and_offline() {
    let Some(n) = nodes() else { return };
    let bin = dnspath_bin();
    let bin = bin.to_str().unwrap();
    // dnspath in node A: node A's interfaces, and node B's and the pods' by name.
    let trace = Running::start(
        &n.node_a,
        &[
            bin, "trace", "-o", "json", "--view", "both", "--netns", &n.node_b, "--netns",
            &n.client, "--netns", &n.dns,
        ],
        "dnspath: tracing",
    );
    let pcap = n.dir.join("node-a.pcap");
    let pcap_s = pcap.to_str().unwrap();
    let tcpdump = Running::start(
        &n.node_a,
        &[
            "tcpdump",
            "-i",
            "any",
            "-U",
            "--immediate-mode",
            "-w",
            pcap_s,
        ],
        "listening on",
    );
    let name = "www.tunnel.test.";
    assert_eq!(n.dig(name), ANSWER.to_string());
    std::thread::sleep(Duration::from_millis(1500));
    let (_, tcpdump_err) = tcpdump.stop();
    let (stdout, stderr) = trace.stop();
    let recs = ndjson(&stdout);

    // Live: every hop on both nodes, the query out and the answer back.
    let (packets, txs) = of_name(&recs, name);
    let (a, b, cl, dn) = (&n.node_a, &n.node_b, &n.client, &n.dns);
    let s = |x: &str| x.to_owned();
    let query_path = [
        (s(cl), s("eth0"), s("egress")),
        (s(a), s("vcl"), s("ingress")),
        (s(a), s("flannel.1"), s("egress")),
        (s(a), s("eth0"), s("egress")),
        (s(b), s("eth0"), s("ingress")),
        (s(b), s("flannel.1"), s("ingress")),
        (s(b), s("vdn"), s("egress")),
        (s(dn), s("eth0"), s("ingress")),
    ];
    let flip = |d: &str| {
        if d == "egress" {
            s("ingress")
        } else {
            s("egress")
        }
    };
    let answer_path: Vec<_> = query_path
        .iter()
        .rev()
        .map(|(ns, i, d)| (ns.clone(), i.clone(), flip(d)))
        .collect();
    for (qr, path) in [(false, query_path.to_vec()), (true, answer_path)] {
        for hop in &path {
            let at: Vec<&&Value> = packets
                .iter()
                .filter(|p| p["dns"]["qr"] == qr && place(p) == *hop)
                .collect();
            assert_eq!(at.len(), 1, "qr {qr} at {hop:?}: {at:?}\nstderr:\n{stderr}");
            let p = at[0];
            let (client, server) = (format!("{CLIENT}:"), format!("{DNS}:53"));
            let (src, dst) = if qr {
                (&server, &client)
            } else {
                (&client, &server)
            };
            assert!(p["src"].as_str().unwrap().starts_with(src.as_str()), "{p}");
            assert!(p["dst"].as_str().unwrap().starts_with(dst.as_str()), "{p}");
            // The underlay's copies are encapsulated: the tunnel says which node sent
            // them to which; the others have none.
            if hop.1 == "eth0" && (hop.0 == *a || hop.0 == *b) {
                let (from, to) = if qr {
                    (NODE_B, NODE_A)
                } else {
                    (NODE_A, NODE_B)
                };
                assert_vxlan(&p["tunnel"], from, to, &format!("{hop:?}"));
                assert!(p["len"].as_u64().unwrap() > 50 + 28, "outer length: {p}");
            } else {
                assert!(p.get("tunnel").is_none(), "{p}");
            }
        }
    }
    assert_eq!(packets.len(), 16, "{packets:#?}");
    // One transaction, one leg of all 16 hops, its underlay hops with their tunnel.
    assert_eq!(txs.len(), 1, "{txs:#?}");
    let legs = txs[0]["legs"].as_array().unwrap();
    assert_eq!(
        legs.len(),
        1,
        "one leg, not one per side of the tunnel: {legs:#?}"
    );
    assert_eq!(txs[0]["outcome"], "answered");
    let hops = legs[0]["hops"].as_array().unwrap();
    assert_eq!(hops.len(), 16, "{hops:#?}");
    let tunnelled: Vec<&Value> = hops.iter().filter(|h| h.get("tunnel").is_some()).collect();
    assert_eq!(tunnelled.len(), 4, "{hops:#?}");
    for h in tunnelled {
        assert_eq!(h["ifname"], "eth0");
        let (from, to) = if h["qr"] == true {
            (NODE_B, NODE_A)
        } else {
            (NODE_A, NODE_B)
        };
        assert_vxlan(&h["tunnel"], from, to, "hop");
    }
    let stats = lab::tracer::last_stats(&recs);
    lab::tracer::assert_accounted(stats);
    assert_eq!(stats["malformed"], 0, "{stats}");
    assert_eq!(stats["kernel"]["parse_failed"], 0, "{stats}");

    // The same in text: the hop names its tunnel.
    let text = Command::new(bin)
        .args(["analyze", pcap_s, "--view", "packets"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&text.stdout);
    let want = format!("vxlan vni={VNI} {NODE_A} > {NODE_B} out udp {CLIENT}:");
    assert!(text.contains(&want), "{want:?} not in:\n{text}");

    // Offline: node A's `tcpdump -i any` (SLL2: hops named by ifindex).
    let out = Command::new(bin)
        .args(["analyze", pcap_s, "-o", "json", "--view", "both"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let recs = ndjson(&String::from_utf8_lossy(&out.stdout));
    let (packets, txs) = of_name(&recs, name);
    let eth0 = format!("if{}", n.ifindex(a, "eth0").unwrap());
    let vcl = format!("if{}", n.ifindex(a, "vcl").unwrap());
    let flannel = format!("if{}", n.ifindex(a, "flannel.1").unwrap());
    let mut seen: Vec<(String, bool, bool)> = packets
        .iter()
        .map(|p| {
            let on = p["ifname"].as_str().unwrap().to_owned();
            if on == eth0 {
                let qr = p["dns"]["qr"] == true;
                let (from, to) = if qr {
                    (NODE_B, NODE_A)
                } else {
                    (NODE_A, NODE_B)
                };
                assert_vxlan(&p["tunnel"], from, to, "offline");
            } else {
                assert!(p.get("tunnel").is_none(), "{p}");
            }
            (on, p["dns"]["qr"] == true, p.get("tunnel").is_some())
        })
        .collect();
    seen.sort();
    let mut want = vec![
        (vcl.clone(), false, false),
        (flannel.clone(), false, false),
        (eth0.clone(), false, true),
        (eth0.clone(), true, true),
        (flannel.clone(), true, false),
        (vcl.clone(), true, false),
    ];
    want.sort();
    assert_eq!(seen, want, "tcpdump: {tcpdump_err}");
    assert_eq!(txs.len(), 1, "{txs:#?}");
    let legs = txs[0]["legs"].as_array().unwrap();
    assert_eq!(legs.len(), 1, "{legs:#?}");
    assert_eq!(legs[0]["hops"].as_array().unwrap().len(), 6);
    assert_eq!(txs[0]["outcome"], "answered");
}
