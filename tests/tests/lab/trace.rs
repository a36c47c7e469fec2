#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "integration tests fail at the line that broke"
)]
//! `dnspath trace` against the lab: real servers, real kernel, real iptables DNAT.
//! Run as root with `--test-threads=1` (`cargo xtask test`).
use std::{thread, time::Duration};

use lab::tracer::last_stats as stats;
use lab::{
    tracer::{dnspath_bin, Tracer},
    Lab, LabConfig, Pod,
};
use serde_json::Value;

use crate::shared::{dig_ok, lab_of as lab, of_type, qname};

/// DNS packets about `name`, at interface `ifname`, direction `dir`, query (`qr` false) or response.
fn find<'a>(recs: &'a [Value], name: &str, ifname: &str, dir: &str, qr: bool) -> Vec<&'a Value> {
    recs.iter()
        .filter(|r| {
            r["type"] == "packet"
                && qname(r) == Some(name)
                && r["ifname"] == ifname
                && r["dir"] == dir
                && r["dns"]["qr"] == qr
        })
        .collect()
}

/// The query is seen at the client's veth (to the ClusterIP), after DNAT at the chosen
/// CoreDNS pod's veth, as that pod's own query to the upstream, and as every response back.
fn assert_path(lab: &Lab, recs: &[Value], name: &str, proto: &str) {
    let client = lab.veth_of(Pod::Client);
    let up = lab.veth_of(Pod::Upstream);
    let cip = format!("{}:53", lab.cluster_ip());
    let q_client = find(recs, name, client, "ingress", false);
    assert!(
        q_client
            .iter()
            .any(|r| r["dst"] == cip.as_str() && r["proto"] == proto),
        "query to the ClusterIP not seen at {client}: {q_client:?}"
    );
    let backend = (0..lab.dns_pod_count())
        .find(|i| {
            let pod_ip = format!("{}:53", lab.ip_of(Pod::Dns(*i)));
            find(recs, name, lab.veth_of(Pod::Dns(*i)), "egress", false)
                .iter()
                .any(|r| r["dst"] == pod_ip.as_str() && r["proto"] == proto)
        })
        .unwrap_or_else(|| panic!("DNAT'd query not seen at any CoreDNS pod veth"));
    let pod_ip = lab.ip_of(Pod::Dns(backend)).to_string();
    let up_addr = format!("{}:53", lab.ip_of(Pod::Upstream));
    let fwd = find(recs, name, up, "egress", false);
    assert!(
        fwd.iter().any(|r| r["dst"] == up_addr.as_str()
            && r["src"].as_str().is_some_and(|s| s.starts_with(&pod_ip))),
        "forwarded query from {pod_ip} to the upstream not seen at {up}: {fwd:?}"
    );
    let answered = |r: &&Value| {
        r["dns"]["answers"]
            .as_array()
            .is_some_and(|a| a.iter().any(|rr| rr["data"] == "10.250.0.80"))
    };
    assert!(
        find(recs, name, up, "ingress", true).iter().any(answered),
        "upstream's answer not seen at {up}"
    );
    assert!(
        find(recs, name, lab.veth_of(Pod::Dns(backend)), "ingress", true)
            .iter()
            .any(answered),
        "CoreDNS pod's answer not seen at its veth"
    );
    let back = find(recs, name, client, "egress", true);
    assert!(
        back.iter().any(|r| answered(r) && r["src"] == cip.as_str()),
        "answer from the ClusterIP (un-DNAT'd) not seen at {client}: {back:?}"
    );
}

#[test]
fn udp_query_is_seen_at_every_hop() {
    let Some(lab) = lab(LabConfig::default()) else {
        return;
    };
    let t = Tracer::start(&lab, lab.node_ns(), &["trace", "-o", "json"]).unwrap();
    dig_ok(&lab, &["+time=2", "+tries=1", "www.lab.test.", "A"]);
    let recs = t.stop().records();
    assert_path(&lab, &recs, "www.lab.test.", "udp");
    let s = stats(&recs);
    assert_eq!(s["lost"], 0);
    assert!(s["decoded"].as_u64().unwrap() >= 6, "{s}");
    eprintln!("stats: {s}");
}

#[test]
fn tcp_query_is_reassembled_at_every_hop() {
    let Some(lab) = lab(LabConfig::default()) else {
        return;
    };
    // The ~3 KB answer crosses the veths as one GSO segment: keep all of it.
    let t = Tracer::start(
        &lab,
        lab.node_ns(),
        &["trace", "-o", "json", "--snaplen", "4096"],
    )
    .unwrap();
    dig_ok(&lab, &["+tcp", "+time=2", "+tries=1", "www.lab.test.", "A"]);
    // A response larger than one segment's worth of a small MSS would be split; ~3 KB of TXT
    // needs reassembly across segments on the way back.
    let big = dig_ok(
        &lab,
        &["+tcp", "+time=2", "+tries=1", "big.lab.test.", "TXT"],
    );
    assert!(big.contains("TXT"), "{big}");
    let recs = t.stop().records();
    // The client leg and the pod's upstream leg both over TCP (dnsdist keeps the transport).
    let client = lab.veth_of(Pod::Client);
    let q = find(&recs, "www.lab.test.", client, "ingress", false);
    assert!(q.iter().any(|r| r["proto"] == "tcp"), "{q:?}");
    assert_path(&lab, &recs, "www.lab.test.", "tcp");
    let big_answers: Vec<_> = find(&recs, "big.lab.test.", client, "egress", true)
        .into_iter()
        .filter(|r| r["proto"] == "tcp")
        .collect();
    assert!(
        !big_answers.is_empty(),
        "big TCP answer not reassembled: {:?}",
        recs.iter()
            .filter(|r| qname(r) == Some("big.lab.test.") || r["malformed"].is_string())
            .map(|r| format!(
                "{} {} {} {} {} {}",
                r["ifname"], r["dir"], r["proto"], r["src"], r["dst"], r["malformed"]
            ))
            .collect::<Vec<_>>()
    );
    assert!(
        big_answers[0]["dns"]["answers"].as_array().unwrap().len() >= 20,
        "{:?}",
        big_answers[0]
    );
    let s = stats(&recs);
    assert_eq!(s["malformed"], 0, "{s}");
}

/// The default snaplen (2048) cuts the 3 KB TCP answer: it is decoded as far as it goes,
/// marked `capture_truncated`, never `malformed`, and still answers its transaction.
#[test]
fn snaplen_cut_is_decoded_as_far_as_it_goes() {
    let Some(lab) = lab(LabConfig::default()) else {
        return;
    };
    let t = Tracer::start(&lab, lab.node_ns(), &["trace", "-o", "json"]).unwrap();
    dig_ok(
        &lab,
        &["+tcp", "+time=2", "+tries=1", "big.lab.test.", "TXT"],
    );
    thread::sleep(Duration::from_millis(600));
    let recs = t.stop().records();
    let cut: Vec<_> = recs
        .iter()
        .filter(|r| r["type"] == "packet" && r["capture_truncated"] == true)
        .collect();
    assert!(
        !cut.is_empty(),
        "the 2048-byte snaplen should cut the 3 KB answer"
    );
    for r in &cut {
        assert!(r.get("malformed").is_none(), "{r}");
        if r["dns"].is_object() {
            let c = &r["dns"]["cut"];
            assert!(
                c["captured_bytes"].as_u64() < c["message_bytes"].as_u64(),
                "{r}"
            );
            assert!(c["answers"].as_u64().unwrap() > 0, "{r}");
        }
    }
    assert!(
        cut.iter().any(|r| qname(r) == Some("big.lab.test.")
            && r["dns"]["answers"].as_array().is_some_and(|a| a.len() > 10)),
        "{cut:?}"
    );
    let s = stats(&recs);
    assert_eq!(s["malformed"], 0, "{s}");
    assert_eq!(s["capture_truncated"].as_u64().unwrap() as usize, cut.len());
    let t = of_type(&recs, "transaction")
        .into_iter()
        .find(|t| t["question"]["name"] == "big.lab.test.")
        .unwrap_or_else(|| panic!("no transaction: {recs:?}"));
    assert_eq!(t["outcome"], "answered", "{t}");
    assert!(t["answer_cut"].is_object(), "{t}");
}

#[test]
fn iptables_drop_rule_produces_drop_event() {
    let Some(lab) = lab(LabConfig::default()) else {
        return;
    };
    let o = lab.pod_dns_drop("-I");
    assert!(o.status.success(), "{o:?}");
    let t = Tracer::start(&lab, lab.node_ns(), &["trace", "-o", "json"]).unwrap();
    let out = lab.dig(&["+time=1", "+tries=1", "dropped.lab.test.", "A"]);
    assert!(!out.status.success(), "query should have timed out");
    let recs = t.stop().records();
    let drops = of_type(&recs, "drop");
    let ours: Vec<_> = drops
        .iter()
        .filter(|d| qname(d) == Some("dropped.lab.test."))
        .collect();
    assert!(!ours.is_empty(), "no drop event for the query: {drops:?}");
    let d = ours[0];
    assert_eq!(d["reason"], "NETFILTER_DROP", "{d}");
    assert!(d["location"].as_str().unwrap().contains('+'), "{d}");
    assert_eq!(d["netns"], lab.node_ns(), "{d}");
    // DNAT already happened; the conntrack entry remembers the ClusterIP.
    assert_eq!(
        d["ct"]["orig"]["dst"],
        format!("{}:53", lab.cluster_ip()),
        "{d}"
    );
    assert_eq!(d["ct"]["confirmed"], false, "{d}");
    assert!(stats(&recs)["drops"].as_u64().unwrap() >= 1);
}

#[test]
fn loopback_inside_a_pod_needs_all_netns() {
    let Some(lab) = lab(LabConfig::default()) else {
        return;
    };
    // A stub resolver on the client pod's own loopback, as systemd-resolved on 127.0.0.53.
    let mut stub = lab
        .spawn_in(
            lab.client_ns(),
            &[
                "dnsmasq",
                "-k",
                "--no-resolv",
                "--listen-address=127.0.0.53",
                "--bind-interfaces",
                "--address=/stub.test/10.9.9.9",
                "-C",
                "/dev/null",
                "--pid-file=",
                "--user=root",
            ],
        )
        .unwrap();
    let ready = (0..50).any(|_| {
        std::thread::sleep(Duration::from_millis(100));
        lab.dig(&["+time=1", "+tries=1", "@127.0.0.53", "stub.test."])
            .status
            .success()
    });
    if !ready {
        let _ = stub.kill();
        let out = stub.wait_with_output().unwrap();
        panic!(
            "stub resolver did not start: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let t = Tracer::start(&lab, lab.node_ns(), &["trace", "-o", "json", "--all-netns"]).unwrap();
    if let Ok(Some(status)) = stub.try_wait() {
        let mut err = String::new();
        let _ = std::io::Read::read_to_string(stub.stderr.as_mut().unwrap(), &mut err);
        panic!("stub resolver exited ({status}) once tracing started: {err}");
    }
    let a = dig_ok(
        &lab,
        &["+time=2", "+tries=1", "@127.0.0.53", "stub.test.", "A"],
    );
    assert!(a.contains("10.9.9.9"), "{a}");
    let recs = t.stop().records();
    let on_lo: Vec<_> = recs
        .iter()
        .filter(|r| r["type"] == "packet" && r["ifname"] == "lo" && qname(r) == Some("stub.test."))
        .collect();
    assert!(
        on_lo
            .iter()
            .any(|r| r["netns"] == lab.client_ns() && r["dns"]["qr"] == false),
        "query on the client pod's lo not seen: {on_lo:?}"
    );
    assert!(
        on_lo
            .iter()
            .any(|r| r["netns"] == lab.client_ns() && r["dns"]["answers"][0]["data"] == "10.9.9.9"),
        "answer on lo not seen"
    );
    // Without --all-netns nothing of this is visible from the node.
    let t2 = Tracer::start(&lab, lab.node_ns(), &["trace", "-o", "json"]).unwrap();
    dig_ok(
        &lab,
        &["+time=2", "+tries=1", "@127.0.0.53", "stub.test.", "A"],
    );
    let recs2 = t2.stop().records();
    let _ = stub.kill();
    let _ = stub.wait();
    assert!(
        !recs2
            .iter()
            .any(|r| r["type"] == "packet" && qname(r) == Some("stub.test.")),
        "node-only trace should not see the pod's loopback"
    );
}

#[test]
fn ipv6_query_is_decoded() {
    let Some(lab) = lab(LabConfig::default()) else {
        return;
    };
    let t = Tracer::start(&lab, lab.node_ns(), &["trace", "-o", "json"]).unwrap();
    let server = format!("@{}", lab.ip6_of(Pod::Upstream));
    let out = dig_ok(
        &lab,
        &["+time=2", "+tries=1", &server, "www.lab.test.", "AAAA"],
    );
    assert!(out.contains("fd00:250::80"), "{out}");
    let recs = t.stop().records();
    let client_src = format!("[{}]:", lab.ip6_of(Pod::Client));
    let v6: Vec<_> = find(
        &recs,
        "www.lab.test.",
        lab.veth_of(Pod::Client),
        "egress",
        true,
    )
    .into_iter()
    .filter(|r| {
        r["dst"]
            .as_str()
            .is_some_and(|d| d.starts_with(&client_src))
    })
    .collect();
    assert!(!v6.is_empty(), "IPv6 answer not seen");
    assert_eq!(v6[0]["dns"]["answers"][0]["type"], "AAAA");
    assert_eq!(v6[0]["dns"]["answers"][0]["data"], "fd00:250::80");
    assert_eq!(v6[0]["dns"]["questions"][0]["type"], "AAAA");
}

#[test]
fn malformed_packets_are_reported_not_fatal() {
    let Some(lab) = lab(LabConfig::default()) else {
        return;
    };
    let t = Tracer::start(&lab, lab.node_ns(), &["trace", "-o", "json"]).unwrap();
    let up = lab.ip_of(Pod::Upstream).to_string();
    // Too short for a header; and a header claiming one question whose name is a
    // compression pointer to itself.
    let script = format!(
        "printf 'garbage' > /dev/udp/{up}/53; printf '\\x12\\x34\\x01\\x00\\x00\\x01\\x00\\x00\\x00\\x00\\x00\\x00\\xc0\\x0c\\x00\\x01\\x00\\x01' > /dev/udp/{up}/53"
    );
    let o = lab.exec(lab.client_ns(), &["bash", "-c", &script]);
    assert!(o.status.success(), "{o:?}");
    // The tracer is still working afterwards.
    dig_ok(&lab, &["+time=2", "+tries=1", "www.lab.test.", "A"]);
    let recs = t.stop().records();
    let bad: Vec<_> = recs
        .iter()
        .filter(|r| r["type"] == "packet" && r["malformed"].is_string())
        .collect();
    // Each crafted datagram is seen at the client's and the upstream's veth.
    assert!(bad.len() >= 4, "malformed packets not reported: {bad:?}");
    assert!(bad.iter().all(|r| r["dns"].is_null()));
    assert!(
        bad.iter().any(|r| r["malformed"]
            .as_str()
            .unwrap()
            .to_lowercase()
            .contains("pointer")
            || r["malformed"]
                .as_str()
                .unwrap()
                .to_lowercase()
                .contains("compression")),
        "compression loop not named: {bad:?}"
    );
    assert!(!find(
        &recs,
        "www.lab.test.",
        lab.veth_of(Pod::Client),
        "egress",
        true
    )
    .is_empty());
    assert_eq!(
        stats(&recs)["malformed"].as_u64().unwrap() as usize,
        bad.len()
    );
}

#[test]
fn duration_and_count_stop_the_trace() {
    let Some(lab) = lab(LabConfig::default()) else {
        return;
    };
    let t = Tracer::start(
        &lab,
        lab.node_ns(),
        &["trace", "-o", "json", "--count", "2"],
    )
    .unwrap();
    dig_ok(&lab, &["+time=2", "+tries=1", "www.lab.test.", "A"]);
    let out = t.wait();
    let recs = out.records();
    assert_eq!(of_type(&recs, "packet").len(), 2, "{recs:?}");
    // The stats say exactly what was seen after the stop: packets decoded in the stop's
    // batch but not written, and what the kernel matched that was never read.
    let st = stats(&recs);
    assert_eq!(st["stopped_by"], "count", "{st}");
    assert_eq!(
        st["packets"].as_u64().unwrap(),
        2 + st["not_written"].as_u64().unwrap(),
        "{st}"
    );
    let t = Tracer::start(&lab, lab.node_ns(), &["trace", "--duration", "1"]).unwrap();
    let out = t.wait();
    assert!(out.status.success(), "{out:?}");
    assert!(out.stdout.contains("--- 0 packets"), "{}", out.stdout);
}

#[test]
fn clear_errors_for_bad_setups() {
    let Some(lab) = lab(LabConfig::default()) else {
        return;
    };
    let o = lab.exec(
        lab.node_ns(),
        &[
            &dnspath_bin().to_string_lossy(),
            "trace",
            "-i",
            "nosuch0",
            "--duration",
            "1",
        ],
    );
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("no such interface: nosuch0"), "{err}");
    assert_eq!(
        err.trim().lines().count(),
        1,
        "one-line error expected: {err}"
    );

    let o = lab.exec(
        lab.node_ns(),
        &[
            "setpriv",
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            &dnspath_bin().to_string_lossy(),
            "trace",
        ],
    );
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("needs root"), "{err}");
}

/// The drop program walks the same headers as TC: an IPv6 query behind a hop-by-hop
/// extension header, dropped by an ip6tables rule on the node, is reported as a drop of a
/// DNS packet (its ports and question read past the extension header), as well as traced.
#[test]
fn ipv6_drop_behind_an_extension_header_is_reported() {
    let Some(lab) = lab(LabConfig::default()) else {
        return;
    };
    let rule = [
        "FORWARD",
        "-p",
        "udp",
        "--dport",
        "53",
        "-d",
        "fd00:250::53",
        "-j",
        "DROP",
    ];
    let rule_cmd = |op: &str| {
        let o = lab.ip6tables_rule(lab.node_ns(), op, &rule);
        assert!(o.status.success(), "ip6tables {op}: {o:?}");
    };
    let t = Tracer::start(&lab, lab.node_ns(), &["trace", "-o", "json", "--all-netns"]).unwrap();
    rule_cmd("-I");
    // Hop-by-hop options header with one PadN option (RFC 8200 §4.3), then a DNS query.
    let script = format!(
        "import socket\n\
         s = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)\n\
         s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_HOPOPTS, bytes([0, 0, 1, 4, 0, 0, 0, 0]))\n\
         q = bytes.fromhex('abcd01000001000000000000') + b'\\x05hopv6\\x03lab\\x04test\\x00' + bytes.fromhex('00010001')\n\
         s.sendto(q, ('{}', 53))\n",
        lab.ip6_of(Pod::Upstream)
    );
    let o = lab.exec(lab.client_ns(), &["python3", "-c", &script]);
    assert!(o.status.success(), "{o:?}");
    thread::sleep(Duration::from_millis(500));
    rule_cmd("-D");
    let recs = t.stop().records();
    let traced: Vec<_> = recs
        .iter()
        .filter(|r| r["type"] == "packet" && qname(r) == Some("hopv6.lab.test."))
        .collect();
    assert!(!traced.is_empty(), "the query was not traced: {recs:#?}");
    let drops: Vec<_> = recs
        .iter()
        .filter(|r| r["type"] == "drop" && r["dst"] == "[fd00:250::53]:53")
        .collect();
    assert_eq!(
        drops.len(),
        1,
        "drop behind an extension header not reported: {recs:#?}"
    );
    assert_eq!(drops[0]["dns"]["questions"][0]["name"], "hopv6.lab.test.");
}
