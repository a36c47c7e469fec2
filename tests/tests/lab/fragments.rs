#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "integration tests fail at the line that broke"
)]
//! IP-fragmented DNS answers through the lab: a dnsmasq in the upstream pod answers
//! `big.frag.test. TXT` with ~3.5 KB over UDP (EDNS 4096) while the pod's `eth0` has an MTU of
//! 1280, so the answer leaves as three IP fragments (IPv4 and IPv6), crosses the node (whose
//! conntrack reassembles and re-fragments it) and reaches the client.
//!
//! - delivered: reassembled and decoded whole at every hop, the transaction answered, nothing
//!   malformed, every packet accounted for; the same answers from a tcpdump of the node;
//! - later fragments dropped on the node's veth towards the client (a TC flower filter on
//!   egress — after dnspath's own TC program, before the wire; netfilter cannot do it there:
//!   the node's conntrack reassembles at PREROUTING and re-fragments after POSTROUTING): a
//!   `fragment_loss` at the client's `eth0`, the drops of the later fragments reported at the
//!   node and named by their first fragment (ports, answer id, question), the transaction
//!   dropped there and unanswered, nothing malformed;
//! - IPv6 later fragments dropped by an `ip6tables` rule where the node forwards them: the
//!   `NETFILTER_DROP` names its query though the datagram was whole at the hop before, the
//!   transaction is dropped there and unanswered, the client's hop reports the loss.
//!
//! Run as root with `--test-threads=1` (`cargo xtask test`).
use std::{
    path::PathBuf,
    process::{Child, Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use lab::{
    tracer::{assert_accounted, dnspath_bin, last_stats, Tracer},
    Lab, LabConfig, Pod,
};
use serde_json::Value;

use crate::shared::of_type;

const PORT: &str = "5353";
const NAME: &str = "big.frag.test.";
/// TXT strings in the answer, 200 bytes each: a ~3.5 KB message.
const STRINGS: usize = 16;
const MTU: &str = "1280";

/// The lab, with dnsmasq answering the big name on port 5353 in the upstream pod, whose
/// `eth0` MTU is 1280; or `None` after saying why the test cannot run here.
fn lab(tools: &[&str]) -> Option<(Lab, Child)> {
    if !lab::tracer::root_or_skip("network namespaces, eBPF") {
        return None;
    }
    lab::tracer::require_tools(tools);
    let lab = Lab::start(LabConfig::default()).unwrap();
    let up = lab.upstream_ns();
    let out = lab.exec(up, &["ip", "link", "set", "dev", "eth0", "mtu", MTU]);
    assert!(out.status.success(), "{out:?}");
    let mut args = vec![
        "/usr/sbin/dnsmasq".to_string(),
        "-k".into(),
        "-C".into(),
        "/dev/null".into(),
        "--no-resolv".into(),
        "--no-hosts".into(),
        "--user=root".into(),
        "--log-facility=-".into(),
        format!(
            "--pid-file={}",
            lab.temp_dir().join("frag-dnsmasq.pid").display()
        ),
        format!("--port={PORT}"),
        "--bind-interfaces".into(),
        format!("--listen-address={}", lab.ip_of(Pod::Upstream)),
        format!("--listen-address={}", lab.ip6_of(Pod::Upstream)),
        "--edns-packet-max=4096".into(),
    ];
    for i in 0..STRINGS {
        args.push(format!(
            "--txt-record={},\"{i:02}{}\"",
            NAME.trim_end_matches('.'),
            "f".repeat(198)
        ));
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let server = lab.spawn_in(up, &args).unwrap();
    // Ready when it answers (from inside its own pod: no fragmentation on lo).
    let deadline = Instant::now() + Duration::from_secs(10);
    let at = format!("@{}", lab.ip_of(Pod::Upstream));
    loop {
        let out = lab.exec(
            up,
            &[
                "dig", "+short", "+time=1", "+tries=1", "-p", PORT, &at, NAME, "TXT",
            ],
        );
        if out.status.success() && !out.stdout.is_empty() {
            break;
        }
        assert!(Instant::now() < deadline, "dnsmasq did not answer: {out:?}");
        thread::sleep(Duration::from_millis(100));
    }
    Some((lab, server))
}

fn stop_server(mut server: Child) {
    // SAFETY: kill(2) on our own child, not yet reaped.
    unsafe {
        libc::kill(server.id() as libc::pid_t, libc::SIGTERM);
    }
    let _ = server.wait();
}

fn dig_big(lab: &Lab, server: &str) -> std::process::Output {
    lab.dig(&[
        "+bufsize=4096",
        "+notcp",
        "+ignore",
        "+time=2",
        "+tries=1",
        "-p",
        PORT,
        &format!("@{server}"),
        NAME,
        "TXT",
    ])
}

/// Answers to the big question, decoded whole: `(netns, ifname, dir, src)` of each.
fn big_answers(recs: &[Value]) -> Vec<(String, String, String, String)> {
    recs.iter()
        .filter(|r| {
            r["type"] == "packet"
                && r["dns"]["qr"] == true
                && r["dns"]["questions"][0]["name"] == NAME
        })
        .map(|r| {
            assert!(r.get("capture_truncated").is_none(), "cut: {r}");
            assert_eq!(
                r["dns"]["answers"].as_array().map(Vec::len),
                Some(STRINGS),
                "{r}"
            );
            assert!(r["len"].as_u64().unwrap() > 3000, "{r}");
            let s = |k: &str| r[k].as_str().unwrap().to_string();
            (s("netns"), s("ifname"), s("dir"), s("src"))
        })
        .collect()
}

fn transaction_outcome(recs: &[Value]) -> Vec<String> {
    of_type(recs, "transaction")
        .iter()
        .filter(|t| t["question"]["name"] == NAME)
        .map(|t| t["outcome"].as_str().unwrap().to_string())
        .collect()
}

/// Drop records of later IP fragments (offset > 0).
fn fragment_drops(recs: &[Value]) -> Vec<&Value> {
    let drops: Vec<_> = of_type(recs, "drop")
        .into_iter()
        .filter(|d| d["fragment"]["offset"].as_u64().is_some_and(|o| o > 0))
        .collect();
    for d in &drops {
        eprintln!(
            "drop {}/{} {} {} > {} {} {} at {}: {}",
            d["netns"],
            d["ifname"],
            d["proto"],
            d["src"],
            d["dst"],
            d["fragment"],
            d["reason"],
            d["location"],
            d["dns"]["questions"][0]["name"]
        );
    }
    drops
}

/// A drop of a later fragment tied to its query: ports, the answer's id and question from its
/// first fragment, nothing malformed.
fn assert_answer_fragment_drop(d: &Value) {
    assert_eq!(d["proto"], "udp", "{d}");
    assert!(
        d["src"].as_str().unwrap().ends_with(&format!(":{PORT}")),
        "{d}"
    );
    assert_eq!(d["dns"]["qr"], true, "{d}");
    assert!(d["dns"]["id"].is_u64(), "{d}");
    assert_eq!(d["dns"]["questions"][0]["name"], NAME, "{d}");
    assert!(d.get("malformed").is_none(), "{d}");
    assert!(d["fragment"]["ip_id"].is_u64(), "{d}");
}

/// The transaction is `dropped`, unanswered, by the kernel drop of its answer at `netns`/`ifname`.
fn assert_dropped_at(t: &Value, netns: &str, ifname: &str, reason: &Value) {
    assert_eq!(t["outcome"], "dropped", "{t}");
    let summary = t["summary"].as_str().unwrap();
    assert!(
        summary.starts_with(&format!(
            "dropped by the kernel ({} at ",
            reason.as_str().unwrap()
        )) && summary.contains("unanswered"),
        "{t}"
    );
    let leg = &t["legs"][0];
    assert_eq!(leg["outcome"], "dropped", "{t}");
    let drop = &leg["drop"];
    assert_eq!(
        (
            &drop["netns"],
            &drop["ifname"],
            &drop["reason"],
            &drop["response"]
        ),
        (
            &Value::from(netns),
            &Value::from(ifname),
            reason,
            &Value::from(true)
        ),
        "{t}"
    );
}

/// A tcpdump of every interface of a namespace; stopped (SIGINT) by [`Capture::stop`].
struct Capture {
    child: Child,
    file: PathBuf,
}

impl Capture {
    fn start(lab: &Lab, ns: &str, file: PathBuf) -> Self {
        let f = file.to_string_lossy().into_owned();
        let mut cmd = lab.command_in(
            ns,
            &[
                "tcpdump",
                "--immediate-mode",
                "-U",
                "-s",
                "4096",
                "-n",
                "-Z",
                "root",
                "-i",
                "any",
                "-w",
                &f,
            ],
        );
        cmd.stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let child = lab.spawn(&mut cmd).unwrap();
        // tcpdump creates the file once it listens.
        let deadline = Instant::now() + Duration::from_secs(10);
        while !file.exists() {
            assert!(Instant::now() < deadline, "tcpdump did not start");
            thread::sleep(Duration::from_millis(50));
        }
        thread::sleep(Duration::from_millis(500));
        Self { child, file }
    }

    fn stop(mut self) -> PathBuf {
        thread::sleep(Duration::from_millis(1000));
        // SAFETY: kill(2) on our own child, not yet reaped.
        unsafe {
            libc::kill(self.child.id() as libc::pid_t, libc::SIGINT);
        }
        let status = self.child.wait().unwrap();
        assert!(status.success(), "tcpdump exited with {status}");
        self.file
    }
}

#[test]
fn large_answers_are_reassembled_at_every_hop_live_and_offline() {
    let Some((lab, server)) = lab(&["dnsmasq", "dig", "tcpdump"]) else {
        return;
    };
    let (client, up) = (lab.client_ns(), lab.upstream_ns());
    let t = Tracer::start(
        &lab,
        lab.node_ns(),
        &[
            "trace", "-o", "json", "--port", PORT, "--netns", client, "--netns", up,
        ],
    )
    .unwrap();
    let pcap = Capture::start(&lab, lab.node_ns(), lab.temp_dir().join("frag-node.pcap"));
    for server in [
        lab.ip_of(Pod::Upstream).to_string(),
        lab.ip6_of(Pod::Upstream).to_string(),
    ] {
        let out = dig_big(&lab, &server);
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "dig @{server}: {text}");
        assert!(
            text.contains(&format!("ANSWER: {STRINGS}")),
            "dig @{server}: {text}"
        );
        assert!(!text.contains("flags: qr aa tc"), "truncated: {text}");
    }
    let pcap = pcap.stop();
    // Let the transactions finish (300 ms quiet) before stopping.
    thread::sleep(Duration::from_millis(800));
    let recs = t.stop().records();
    stop_server(server);

    let answers = big_answers(&recs);
    let (vup, vclient) = (lab.veth_of(Pod::Upstream), lab.veth_of(Pod::Client));
    let node = lab.node_ns();
    for src_ip in [
        lab.ip_of(Pod::Upstream).to_string(),
        format!("[{}]", lab.ip6_of(Pod::Upstream)),
    ] {
        let src = format!("{src_ip}:{PORT}");
        for (ns, ifname, dir) in [
            (up, "eth0", "egress"),
            (node, vup, "ingress"),
            (node, vclient, "egress"),
            (client, "eth0", "ingress"),
        ] {
            assert!(
                answers
                    .iter()
                    .any(|a| a.0 == ns && a.1 == ifname && a.2 == dir && a.3 == src),
                "answer from {src} not decoded whole at {ns}/{ifname} {dir}: {answers:?}"
            );
        }
    }
    assert!(of_type(&recs, "fragment_loss").is_empty(), "{recs:?}");
    let outcomes = transaction_outcome(&recs);
    assert!(
        outcomes.len() >= 2 && outcomes.iter().all(|o| o == "answered"),
        "{outcomes:?}"
    );
    let s = last_stats(&recs);
    eprintln!("stats: {s}");
    assert_eq!(s["malformed"], 0, "{s}");
    assert_eq!(s["lost"], 0, "{s}");
    // Two answers of three fragments at four hops each.
    assert!(s["datagrams_reassembled"].as_u64().unwrap() >= 8, "{s}");
    assert!(s["fragments_merged"].as_u64().unwrap() >= 16, "{s}");
    assert_eq!(s["fragments_pending"], 0, "{s}");
    assert_eq!(s["datagrams_lost"], 0, "{s}");
    assert_accounted(s);

    // Offline: the node's capture gives the same reassembled answers at its two hops.
    let out = Command::new(dnspath_bin())
        .args(["analyze", "-o", "json", "--port", PORT])
        .arg(&pcap)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let recs: Vec<Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let answers = big_answers(&recs);
    for src in [
        format!("{}:{PORT}", lab.ip_of(Pod::Upstream)),
        format!("[{}]:{PORT}", lab.ip6_of(Pod::Upstream)),
    ] {
        for dir in ["ingress", "egress"] {
            assert!(
                answers.iter().any(|a| a.2 == dir && a.3 == src),
                "offline: answer from {src} not decoded whole {dir}: {answers:?}\n{stderr}"
            );
        }
    }
    assert!(of_type(&recs, "fragment_loss").is_empty(), "{recs:?}");
    let outcomes = transaction_outcome(&recs);
    assert!(
        outcomes.len() >= 2 && outcomes.iter().all(|o| o == "answered"),
        "offline: {outcomes:?}"
    );
    let s = last_stats(&recs);
    eprintln!("offline stats: {s}\n{stderr}");
    assert_eq!(s["malformed"], 0, "{s}");
    assert!(s["datagrams_reassembled"].as_u64().unwrap() >= 4, "{s}");
    assert_accounted(s);
}

#[test]
fn later_fragments_dropped_on_a_hop_are_a_fragment_loss_there() {
    let Some((lab, server)) = lab(&["dnsmasq", "dig", "tc"]) else {
        return;
    };
    let (client, up, node) = (lab.client_ns(), lab.upstream_ns(), lab.node_ns());
    let vclient = lab.veth_of(Pod::Client);
    // On the node's veth towards the client, on egress, after dnspath's own TC program has
    // seen them (dnspath's clsact filter, added later with the kernel's automatic priority,
    // takes the one before the first filter there, 50001), u32 filters redirect fragments to the
    // node's service device, whose veth peer is down: mirred cannot deliver them and the
    // packet is dropped (TC_EGRESS) at the veth. (This kernel has neither act_gact nor
    // cls_flower, and the node's conntrack reassembles IPv4 before any chain iptables can
    // add.) IPv4: every later fragment (a u32 match without action ends classification with
    // TC_ACT_OK, so pref 50001 lets first fragments and whole packets through); the node
    // re-fragments IPv4 and stops sending a datagram's fragments at the first that fails,
    // so its last fragment never leaves either. IPv6 (forwarded fragment by fragment: no
    // IPv6 conntrack on the node): only the middle fragment, at offset 1232.
    let sink = lab.service_dev();
    let out = lab.exec(node, &["tc", "qdisc", "add", "dev", vclient, "clsact"]);
    assert!(out.status.success(), "{out:?}");
    let redirect = ["action", "mirred", "egress", "redirect", "dev", sink];
    let filters: [(&str, &str, Vec<&str>); 3] = [
        // IPv4: fragment offset (13 bits at byte 6) zero.
        (
            "ip",
            "50001",
            vec!["match", "u16", "0", "0x1fff", "at", "6", "classid", "1:1"],
        ),
        (
            "ip",
            "50002",
            [&["match", "u32", "0", "0"][..], &redirect].concat(),
        ),
        // IPv6: a Fragment header right after the fixed one, offset 1232 (154 × 8).
        (
            "ipv6",
            "50003",
            [
                &[
                    "match", "u8", "44", "0xff", "at", "6", "match", "u16", "0x04d0", "0xfff8",
                    "at", "42",
                ][..],
                &redirect,
            ]
            .concat(),
        ),
    ];
    for (proto, pref, spec) in &filters {
        let mut args = vec![
            "tc", "filter", "add", "dev", vclient, "egress", "protocol", proto, "pref", pref, "u32",
        ];
        args.extend_from_slice(spec);
        let out = lab.exec(node, &args);
        assert!(out.status.success(), "tc {args:?}: {out:?}");
    }
    let t = Tracer::start(
        &lab,
        node,
        &[
            "trace", "-o", "json", "--port", PORT, "--netns", client, "--netns", up,
        ],
    )
    .unwrap();
    let pcap = Capture::start(&lab, client, lab.temp_dir().join("frag-client.pcap"));
    for server in [
        lab.ip_of(Pod::Upstream).to_string(),
        lab.ip6_of(Pod::Upstream).to_string(),
    ] {
        let out = dig_big(&lab, &server);
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            !text.contains(&format!("ANSWER: {STRINGS}")),
            "answered through the filter: {text}"
        );
    }
    let pcap = pcap.stop();
    // Past the 2 s reassembly timeout: reported live, not at the end.
    thread::sleep(Duration::from_millis(2500));
    let recs = t.stop().records();
    stop_server(server);

    let losses = of_type(&recs, "fragment_loss");
    for l in &losses {
        eprintln!(
            "{}/{} {}: {}",
            l["netns"], l["ifname"], l["dir"], l["summary"]
        );
        // Complete before the filter: never lost at the upstream or the node's ingress.
        assert!(
            l["netns"] == client || (l["ifname"] == vclient && l["dir"] == "egress"),
            "{l}"
        );
        assert_eq!(l["cause"], "timeout", "{l}");
        assert_eq!(l["dns"]["qr"], true, "{l}");
        assert_eq!(l["dns"]["questions"][0]["name"], NAME, "{l}");
    }
    let at_client = |src: &str| -> &Value {
        let v: Vec<_> = losses
            .iter()
            .filter(|l| l["src"] == src && l["netns"] == client)
            .collect();
        let [l] = &v[..] else {
            panic!("one loss of the answer from {src} at {client} expected: {losses:?}")
        };
        assert_eq!(
            (&l["ifname"], &l["dir"]),
            (&Value::from("eth0"), &Value::from("ingress"))
        );
        l
    };
    // IPv4: only the first fragment reached the client.
    let l = at_client(&format!("{}:{PORT}", lab.ip_of(Pod::Upstream)));
    let first = &l["fragments_seen"][0];
    assert_eq!(l["fragments_seen"].as_array().unwrap().len(), 1, "{l}");
    assert_eq!(first["offset"], 0, "{l}");
    assert_eq!(
        l["missing"],
        serde_json::json!([{"start": first["len"], "end": null}]),
        "{l}"
    );
    // IPv6: fragments 1 and 3 of 3.
    let l = at_client(&format!("[{}]:{PORT}", lab.ip6_of(Pod::Upstream)));
    assert_eq!(l["fragments"], 3, "{l}");
    assert_eq!(l["missing_fragments"], serde_json::json!([2]), "{l}");
    assert_eq!(
        l["missing"],
        serde_json::json!([{"start": 1232, "end": 2464}]),
        "{l}"
    );
    let summary = l["summary"].as_str().unwrap();
    assert!(
        summary.contains("of 3 fragments: fragment 2 never seen"),
        "{summary}"
    );
    // Whole where the fragments passed.
    let answers = big_answers(&recs);
    assert!(
        answers.iter().any(|a| a.1 == vclient && a.2 == "egress"),
        "{answers:?}"
    );
    assert!(!answers.iter().any(|a| a.0 == client), "{answers:?}");
    // The filtered fragments' drops at the node: later fragments, without ports of their
    // own, named by their datagram's first fragment: the answer to the big question.
    let drops = fragment_drops(&recs);
    let mut reasons = Vec::new();
    for src in [
        format!("{}:{PORT}", lab.ip_of(Pod::Upstream)),
        format!("[{}]:{PORT}", lab.ip6_of(Pod::Upstream)),
    ] {
        let d = drops
            .iter()
            .find(|d| d["netns"] == node && d["src"] == src.as_str())
            .unwrap_or_else(|| panic!("no drop of a fragment from {src}: {drops:?}"));
        assert_eq!(d["ifname"], vclient, "{d}");
        assert_answer_fragment_drop(d);
        // The same answer the client's hop reports the loss of.
        let loss = losses
            .iter()
            .find(|l| l["src"] == src.as_str() && l["netns"] == client)
            .unwrap();
        assert_eq!(d["dns"]["id"], loss["dns"]["id"], "{d}\n{loss}");
        reasons.push((src, d["reason"].clone()));
    }
    // The client never got the answers: dropped on the way, by the kernel at the node (the
    // drop of a later fragment comes before the loss is known at the client's hop).
    let txs: Vec<_> = of_type(&recs, "transaction")
        .into_iter()
        .filter(|t| t["question"]["name"] == NAME)
        .collect();
    assert_eq!(txs.len(), 2, "{txs:?}");
    for t in &txs {
        eprintln!("{}", t["summary"]);
        let leg = &t["legs"][0];
        let reason = &reasons
            .iter()
            .find(|(src, _)| leg["backend"] == src.as_str())
            .unwrap_or_else(|| panic!("{t}"))
            .1;
        assert_dropped_at(t, node, vclient, reason);
    }
    let s = last_stats(&recs);
    eprintln!("stats: {s}");
    assert_eq!(s["malformed"], 0, "{s}");
    assert_eq!(
        s["datagrams_lost"].as_u64(),
        Some(losses.len() as u64),
        "{s}"
    );
    assert!(s["fragments_incomplete"].as_u64().unwrap() >= 2, "{s}");
    assert_accounted(s);

    // Offline: the client's capture pins the same losses to its interface, and the answers
    // never count as answered.
    let out = Command::new(dnspath_bin())
        .args(["analyze", "-o", "json", "--port", PORT])
        .arg(&pcap)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let recs: Vec<Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let losses = of_type(&recs, "fragment_loss");
    for l in &losses {
        eprintln!("offline: {}", l["summary"]);
        assert_eq!(l["dns"]["questions"][0]["name"], NAME, "{l}");
        assert_eq!(l["dir"], "ingress", "{l}");
    }
    let v4 = format!("{}:{PORT}", lab.ip_of(Pod::Upstream));
    let v6 = format!("[{}]:{PORT}", lab.ip6_of(Pod::Upstream));
    assert!(
        losses
            .iter()
            .any(|l| l["src"] == v4.as_str() && l["fragments_seen"].as_array().unwrap().len() == 1),
        "offline: {losses:?}\n{stderr}"
    );
    assert!(
        losses
            .iter()
            .any(|l| l["src"] == v6.as_str() && l["missing_fragments"] == serde_json::json!([2])),
        "offline: {losses:?}\n{stderr}"
    );
    assert!(big_answers(&recs).is_empty(), "offline: {recs:?}");
    let outcomes = transaction_outcome(&recs);
    assert!(
        outcomes.len() == 2 && outcomes.iter().all(|o| o == "dropped"),
        "offline: {outcomes:?}"
    );
    let s = last_stats(&recs);
    eprintln!("offline stats: {s}\n{stderr}");
    assert_eq!(s["malformed"], 0, "{s}");
    assert_accounted(s);
}

/// `ip6tables -A CHAIN -s UPSTREAM6 -m frag --fraglast -j DROP` in namespace `ns`, then the
/// big answer asked over IPv6 under `dnspath trace` (node, client and upstream namespaces):
/// dig must not get it whole. Waits past the 2 s reassembly timeout, so the hops after the
/// rule report their loss; stops the server. The trace's records.
fn dig_big_through_fraglast_drop(lab: &Lab, server: Child, ns: &str, chain: &str) -> Vec<Value> {
    dig_big_through_rules(
        lab,
        server,
        ns,
        chain,
        &[&["--fraglast", "-j", "DROP"]],
        &[],
    )
}

/// As [`dig_big_through_fraglast_drop`], with `rules` (each `-m frag` and its verdict) in
/// that order and `trace_args` added to the trace's.
fn dig_big_through_rules(
    lab: &Lab,
    server: Child,
    ns: &str,
    chain: &str,
    rules: &[&[&str]],
    trace_args: &[&str],
) -> Vec<Value> {
    let (client, up, node) = (lab.client_ns(), lab.upstream_ns(), lab.node_ns());
    let up6 = lab.ip6_of(Pod::Upstream).to_string();
    for r in rules {
        let mut rule = vec!["ip6tables", "-w", "-A", chain, "-s", &up6, "-m", "frag"];
        rule.extend_from_slice(r);
        let out = lab.exec(ns, &rule);
        assert!(out.status.success(), "{rule:?}: {out:?}");
    }
    let mut args = vec![
        "trace", "-o", "json", "--port", PORT, "--netns", client, "--netns", up,
    ];
    args.extend_from_slice(trace_args);
    let t = Tracer::start(lab, node, &args).unwrap();
    let out = dig_big(lab, &up6);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        !text.contains(&format!("ANSWER: {STRINGS}")),
        "answered through the rule: {text}"
    );
    thread::sleep(Duration::from_millis(2500));
    let recs = t.stop().records();
    stop_server(server);
    recs
}

/// A firewall rule dropping IPv6 fragments where the node forwards them: `ip6tables -m frag
/// --fraglast -j DROP` in the node's FORWARD chain (the node has no IPv6 conntrack, so its
/// netfilter sees each fragment; its IPv4 conntrack reassembles before any iptables chain,
/// so an IPv4 rule there would see whole datagrams). The kernel frees the last fragment with
/// `NETFILTER_DROP` after dnspath's TC program saw every fragment on the node's ingress, so
/// the datagram is whole at that hop and only the drop says where the answer died: it names
/// the query (from the first fragment), and the transaction is dropped there, unanswered.
#[test]
fn later_fragments_dropped_by_a_firewall_rule_name_their_query() {
    let Some((lab, server)) = lab(&["dnsmasq", "dig", "ip6tables"]) else {
        return;
    };
    let (client, node) = (lab.client_ns(), lab.node_ns());
    let (vup, vclient) = (lab.veth_of(Pod::Upstream), lab.veth_of(Pod::Client));
    let up6 = lab.ip6_of(Pod::Upstream).to_string();
    let recs = dig_big_through_fraglast_drop(&lab, server, node, "FORWARD");
    let counted = lab.exec(
        node,
        &["ip6tables", "-w", "-L", "FORWARD", "-v", "-x", "-n"],
    );
    eprintln!("{}", String::from_utf8_lossy(&counted.stdout));

    let src = format!("[{up6}]:{PORT}");
    // Whole on the node's ingress (before the rule), never at the client.
    let answers = big_answers(&recs);
    assert!(
        answers
            .iter()
            .any(|a| a.0 == node && a.1 == vup && a.2 == "ingress" && a.3 == src),
        "{answers:?}"
    );
    assert!(!answers.iter().any(|a| a.0 == client), "{answers:?}");
    let drops = fragment_drops(&recs);
    let d = drops
        .iter()
        .find(|d| d["netns"] == node && d["src"] == src.as_str())
        .unwrap_or_else(|| panic!("no drop of a fragment from {src}: {drops:?}"));
    assert_answer_fragment_drop(d);
    assert_eq!(d["reason"], "NETFILTER_DROP", "{d}");
    // Where netfilter drops: the rule's verdict (`nft_do_chain` under iptables-nft) or the
    // hook that applies it.
    let location = d["location"].as_str().unwrap();
    assert!(
        location.starts_with("nft_do_chain") || location.starts_with("nf_hook_slow"),
        "{d}"
    );
    // The last of three fragments of 1232 bytes.
    assert_eq!(d["fragment"]["offset"], 2464, "{d}");
    // After the rule the last fragment never came: a loss at the client's hop, of the same
    // answer.
    let losses = of_type(&recs, "fragment_loss");
    let loss = losses
        .iter()
        .find(|l| l["netns"] == client && l["src"] == src.as_str())
        .unwrap_or_else(|| panic!("no loss at {client}: {losses:?}"));
    assert_eq!(
        loss["missing"],
        serde_json::json!([{"start": 2464, "end": null}]),
        "{loss}"
    );
    assert_eq!(loss["dns"]["id"], d["dns"]["id"], "{loss}\n{d}");
    for l in &losses {
        assert!(
            l["netns"] == client || (l["ifname"] == vclient && l["dir"] == "egress"),
            "{l}"
        );
    }
    // The transaction: dropped at the node by the rule, unanswered.
    let txs: Vec<_> = of_type(&recs, "transaction")
        .into_iter()
        .filter(|t| t["question"]["name"] == NAME)
        .collect();
    let [t] = &txs[..] else {
        panic!("one transaction expected: {txs:?}")
    };
    eprintln!("{}", t["summary"]);
    assert_dropped_at(t, node, d["ifname"].as_str().unwrap(), &d["reason"]);
    let s = last_stats(&recs);
    eprintln!("stats: {s}");
    assert_eq!(s["malformed"], 0, "{s}");
    // The kernel drop joined the transaction (the losses reported 2 s later find it over).
    assert_eq!(s["correlate"]["drops_attached"], 1, "{s}");
    assert_accounted(s);
}

/// The same answer's last fragment dropped by a rule in the client pod's own namespace
/// (`ip6tables -A INPUT … -m frag --fraglast -j DROP`: a sidecar's firewall). dnspath's TC
/// program on the pod's `eth0` saw every fragment, so the answer was whole at the client's
/// interface — and still never reached dig's socket: the transaction is `dropped` there,
/// never `answered`.
#[test]
fn later_fragments_dropped_in_the_clients_namespace_are_not_an_answer() {
    let Some((lab, server)) = lab(&["dnsmasq", "dig", "ip6tables"]) else {
        return;
    };
    let client = lab.client_ns();
    let up6 = lab.ip6_of(Pod::Upstream).to_string();
    let recs = dig_big_through_fraglast_drop(&lab, server, client, "INPUT");

    let src = format!("[{up6}]:{PORT}");
    // Whole at the client's interface: the case is the one meant.
    let answers = big_answers(&recs);
    assert!(
        answers
            .iter()
            .any(|a| a.0 == client && a.2 == "ingress" && a.3 == src),
        "{answers:?}"
    );
    let drops = fragment_drops(&recs);
    let d = drops
        .iter()
        .find(|d| d["netns"] == client && d["src"] == src.as_str())
        .unwrap_or_else(|| panic!("no drop of a fragment in {client}: {drops:?}"));
    assert_answer_fragment_drop(d);
    let txs: Vec<_> = of_type(&recs, "transaction")
        .into_iter()
        .filter(|t| t["question"]["name"] == NAME)
        .collect();
    let [t] = &txs[..] else {
        panic!("one transaction expected: {txs:?}")
    };
    assert_dropped_in_the_client_at(t, client, d["ifname"].as_str().unwrap(), &d["reason"]);
    assert_eq!(t["latency_ns"], Value::Null, "{t}");
    // The last of three fragments, named.
    let part = &t["legs"][0]["drop"]["fragments"];
    assert_eq!(
        (&part["fragments"], &part["numbers"]),
        (&Value::from(3), &serde_json::json!([3])),
        "{t}"
    );
    assert!(
        t["summary"].as_str().unwrap().ends_with(&format!(
            ": IP fragment 3 of 3 (bytes 2464-{0} of {0})",
            part["total_len"]
        )),
        "{t}"
    );
    assert_accounted(last_stats(&recs));
}

/// An answer that reached the client's interface and was dropped in the client's namespace,
/// by `reason` at `netns`/`ifname`: `dropped`, and said so — never "unanswered".
fn assert_dropped_in_the_client_at(t: &Value, netns: &str, ifname: &str, reason: &Value) {
    assert_eq!(t["outcome"], "dropped", "{t}");
    let summary = t["summary"].as_str().unwrap();
    assert!(
        summary.starts_with(&format!(
            "answer NOERROR reached the client's interface, then was dropped by the kernel ({} at ",
            reason.as_str().unwrap()
        )) && !summary.contains("unanswered"),
        "{t}"
    );
    let leg = &t["legs"][0];
    assert_eq!(leg["outcome"], "dropped", "{t}");
    let drop = &leg["drop"];
    assert_eq!(
        (
            &drop["netns"],
            &drop["ifname"],
            &drop["reason"],
            &drop["response"]
        ),
        (
            &Value::from(netns),
            &Value::from(ifname),
            reason,
            &Value::from(true)
        ),
        "{t}"
    );
}

/// The answer's fragments 2 and 3 of 3 dropped by a rule in the client pod's namespace
/// (`ip6tables -A INPUT -m frag --fragfirst -j ACCEPT`, then `-m frag -j DROP`): every
/// fragment reached the pod's `eth0` (dnspath's TC program saw them, the answer whole), the
/// kernel dropped fragment 2 before fragment 3 completed it there and fragment 3 after. The
/// summary, the leg's `drop` and the pcapng (`-w`) comments name both fragments, their bytes
/// and the answer's size, and nothing calls the answer "unanswered".
#[test]
fn fragments_2_and_3_dropped_in_the_clients_namespace_are_named() {
    let Some((lab, server)) = lab(&["dnsmasq", "dig", "ip6tables"]) else {
        return;
    };
    let client = lab.client_ns();
    let src = format!("[{}]:{PORT}", lab.ip6_of(Pod::Upstream));
    let file = lab.temp_dir().join("fragments-2-3.pcapng");
    let w = file.to_string_lossy().into_owned();
    let recs = dig_big_through_rules(
        &lab,
        server,
        client,
        "INPUT",
        &[&["--fragfirst", "-j", "ACCEPT"], &["-j", "DROP"]],
        &["-w", &w],
    );
    // Whole at the client's interface: the case is the one meant.
    let answers = big_answers(&recs);
    assert!(
        answers
            .iter()
            .any(|a| a.0 == client && a.2 == "ingress" && a.3 == src),
        "{answers:?}"
    );
    // Two kernel drops in the client's namespace, each numbered by its datagram's first
    // fragment.
    let drops: Vec<&Value> = fragment_drops(&recs)
        .into_iter()
        .filter(|d| d["netns"] == client && d["src"] == src.as_str())
        .collect();
    let mut numbers: Vec<u64> = drops
        .iter()
        .map(|d| {
            assert_answer_fragment_drop(d);
            assert_eq!(d["fragment"]["fragments"], 3, "{d}");
            d["fragment"]["number"].as_u64().unwrap()
        })
        .collect();
    numbers.sort_unstable();
    assert_eq!(numbers, [2, 3], "{drops:?}");
    let total = drops[0]["fragment"]["total_len"].as_u64().unwrap();
    assert!(total > 2464 + 8, "{drops:?}");

    let txs: Vec<_> = of_type(&recs, "transaction")
        .into_iter()
        .filter(|t| t["question"]["name"] == NAME)
        .collect();
    let [t] = &txs[..] else {
        panic!("one transaction expected: {txs:?}")
    };
    eprintln!("{}", t["summary"]);
    assert_dropped_in_the_client_at(
        t,
        client,
        drops[0]["ifname"].as_str().unwrap(),
        &drops[0]["reason"],
    );
    let dropped = format!("IP fragments 2 and 3 of 3 (bytes 1232-{total} of {total})");
    assert!(
        t["summary"]
            .as_str()
            .unwrap()
            .ends_with(&format!(": {dropped}")),
        "{t}"
    );
    assert_eq!(
        t["legs"][0]["drop"]["fragments"],
        serde_json::json!({
            "ip_id": drops[0]["fragment"]["ip_id"],
            "fragments": 3,
            "numbers": [2, 3],
            "bytes": [{"start": 1232, "end": total}],
            "total_len": total
        }),
        "{t}"
    );
    assert_accounted(last_stats(&recs));

    // The evidence file: the answer's copy at the client's interface says what was lost,
    // each fragment's drop which fragment it was, claimed by the transaction.
    let bytes = std::fs::read(&file).unwrap();
    let text = String::from_utf8_lossy(&bytes);
    let txn = format!("txn={} leg=0 ", t["id"]);
    assert!(
        text.contains(&format!("outcome=dropped lost=[{dropped}]")),
        "no lost=[{dropped}] in {w}"
    );
    for n in [2, 3] {
        let end = if n == 3 { total } else { 2464 };
        let comment = format!(
            "fragment=[IP fragment {n} of 3 (bytes {}-{end} of {total})]",
            (n - 1) * 1232
        );
        let at = text
            .find(&comment)
            .unwrap_or_else(|| panic!("no {comment} in {w}"));
        // The drop's comment starts with its transaction.
        let start = text[..at].rfind("dnspath at=dnspath/drops ").unwrap();
        assert!(
            text[start..at].contains(&txn),
            "{}",
            &text[start..at + comment.len()]
        );
    }
}
