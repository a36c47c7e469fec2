#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "integration tests fail at the line that broke"
)]
//! Pod attribution and filters against the lab, with its pods made to look like a kubelet's
//! (real cgroups named as kubelet names them, kubelet's log directories under a private
//! `--host-root`). Run as root with `--test-threads=1` (`cargo xtask test`).
use lab::{
    kubelet::{KubeletPods, Node},
    tracer::Tracer,
    Lab, Pod,
};
use serde_json::Value;

use crate::shared::qname;

fn setup() -> Option<(Lab, KubeletPods)> {
    let lab = crate::shared::lab()?;
    let pods = KubeletPods::for_test(&lab, Node::Lab)?;
    Some((lab, pods))
}

/// `dnspath ARGS --netns …` for every namespace of this lab but the node (where it runs):
/// what `--all-netns` would attach to, without the other labs a shared machine may run.
fn trace_args<'a>(lab: &'a Lab, args: &[&'a str]) -> Vec<&'a str> {
    let mut v = vec!["trace"];
    v.extend_from_slice(args);
    for ns in lab.namespaces().into_iter().skip(1) {
        v.extend(["--netns", ns]);
    }
    v
}

/// The pod a record at (netns, ifname) must name, and whether by the node side of its veth.
fn expected(lab: &Lab, pods: &KubeletPods, netns: &str, ifname: &str) -> Option<(String, bool)> {
    let mut all = vec![Pod::Client];
    all.extend((0..lab.dns_pod_count()).map(Pod::Dns));
    for p in all {
        let fake = pods.of(p)?;
        if netns == lab.ns_of(p) {
            return Some((fake.label(), false));
        }
        if netns == lab.node_ns() && ifname == lab.veth_of(p) {
            return Some((fake.label(), true));
        }
    }
    None
}

fn check_place(lab: &Lab, pods: &KubeletPods, r: &Value, what: &str) -> bool {
    let netns = r["netns"].as_str().unwrap();
    let ifname = r["ifname"].as_str().unwrap_or("");
    match expected(lab, pods, netns, ifname) {
        Some((label, veth)) => {
            assert_eq!(r["pod"], label.as_str(), "{what} at {netns}/{ifname}: {r}");
            assert_eq!(
                r["pod_veth"].as_bool().unwrap_or(false),
                veth,
                "{what}: {r}"
            );
            assert!(r["pod_uid"].is_string(), "{what}: {r}");
            true
        }
        None => {
            assert!(
                r.get("pod").is_none(),
                "{what} at {netns}/{ifname} has a pod: {r}"
            );
            false
        }
    }
}

#[test]
fn pods_named_on_every_hop_and_drop() {
    let Some((lab, pods)) = setup() else {
        return;
    };
    let root = pods.host_root.to_str().unwrap().to_string();
    let t = Tracer::start(
        &lab,
        lab.node_ns(),
        &trace_args(&lab, &["-o", "json", "--host-root", &root]),
    )
    .unwrap();
    let out = lab.dig(&["+time=5", "+tries=1", "www.lab.test.", "A"]);
    assert!(out.status.success(), "{out:?}");
    let o = lab.pod_dns_drop("-I");
    assert!(o.status.success(), "{o:?}");
    let out = lab.dig(&["+time=1", "+tries=1", "dropped.lab.test.", "A"]);
    assert!(!out.status.success(), "query should have been dropped");
    let recs = t.stop().records();
    lab.pod_dns_drop("-D");

    // Every packet of the lookup, at every hop, names its pod (or none, at the upstream).
    let mut named = std::collections::BTreeSet::new();
    for r in recs
        .iter()
        .filter(|r| r["type"] == "packet" && qname(r) == Some("www.lab.test."))
    {
        if check_place(&lab, &pods, r, "packet") {
            named.insert((
                r["pod"].as_str().unwrap().to_string(),
                r["pod_veth"].as_bool().unwrap_or(false),
            ));
        }
    }
    let client = pods.of(Pod::Client).unwrap();
    assert!(
        named.contains(&(client.label(), false)),
        "client eth0: {named:?}"
    );
    assert!(
        named.contains(&(client.label(), true)),
        "client's node-side veth: {named:?}"
    );
    let dns_seen: Vec<_> = (0..lab.dns_pod_count())
        .filter_map(|i| pods.of(Pod::Dns(i)))
        .filter(|p| named.contains(&(p.label(), false)) && named.contains(&(p.label(), true)))
        .collect();
    assert_eq!(
        dns_seen.len(),
        1,
        "one CoreDNS pod, inside and on its veth: {named:?}"
    );
    // Container names and ids come from the cgroups and /var/log/containers.
    let inside = recs
        .iter()
        .find(|r| {
            r["type"] == "packet"
                && r["pod"] == dns_seen[0].label().as_str()
                && r.get("pod_veth").is_none()
        })
        .unwrap();
    assert_eq!(inside["container"], "coredns", "{inside}");
    assert_eq!(
        inside["container_id"],
        dns_seen[0].container_id.as_str(),
        "{inside}"
    );
    assert_eq!(inside["pod_uid"], dns_seen[0].uid.as_str(), "{inside}");

    // The transaction: the client's pod, and every hop's.
    let t = recs
        .iter()
        .find(|r| r["type"] == "transaction" && r["question"]["name"] == "www.lab.test.")
        .unwrap_or_else(|| panic!("no transaction"));
    assert_eq!(t["pod"], client.label().as_str(), "{t}");
    let mut hops = 0;
    for leg in t["legs"].as_array().unwrap() {
        for h in leg["hops"].as_array().unwrap() {
            check_place(&lab, &pods, h, "hop");
            hops += 1;
        }
    }
    assert!(hops >= 8, "{t}");

    // The hostNetwork pod in the node's namespace names nothing: the node stays the node.
    let host_pod = pods.pods.iter().find(|p| p.pod.is_none()).unwrap();
    assert!(
        recs.iter().all(|r| !r.to_string().contains(&host_pod.name)),
        "the node's namespace was labelled with the hostNetwork pod {}",
        host_pod.label()
    );

    // The drop names the pod whose veth it happened at.
    let d = recs
        .iter()
        .find(|r| r["type"] == "drop" && qname(r) == Some("dropped.lab.test."))
        .unwrap_or_else(|| panic!("no drop record"));
    assert!(
        check_place(&lab, &pods, d, "drop"),
        "drop without a pod: {d}"
    );
}

#[test]
fn filters_select_what_is_shown_and_stats_count_everything() {
    let Some((lab, pods)) = setup() else {
        return;
    };
    let root = pods.host_root.to_str().unwrap().to_string();

    // --failures: the answered lookup is counted, not shown; the dropped one is shown.
    let t = Tracer::start(
        &lab,
        lab.node_ns(),
        &trace_args(
            &lab,
            &[
                "-o",
                "json",
                "--host-root",
                &root,
                "--failures",
                "--timeout",
                "1",
            ],
        ),
    )
    .unwrap();
    let out = lab.dig(&["+time=5", "+tries=1", "www.lab.test.", "A"]);
    assert!(out.status.success(), "{out:?}");
    let o = lab.pod_dns_drop("-I");
    assert!(o.status.success(), "{o:?}");
    let out = lab.dig(&["+time=1", "+tries=1", "dropped.lab.test.", "A"]);
    assert!(!out.status.success());
    let recs = t.stop().records();
    lab.pod_dns_drop("-D");
    let name_of = |r: &Value| -> Option<String> {
        qname(r)
            .or_else(|| r["question"]["name"].as_str())
            .map(str::to_string)
    };
    assert!(
        recs.iter()
            .all(|r| name_of(r).as_deref() != Some("www.lab.test.")),
        "answered lookup shown under --failures: {recs:?}"
    );
    assert!(recs
        .iter()
        .any(|r| r["type"] == "transaction" && name_of(r).as_deref() == Some("dropped.lab.test.")));
    assert!(recs.iter().any(|r| r["type"] == "drop"));
    let stats = recs.iter().rfind(|r| r["type"] == "stats").unwrap();
    let shown = recs.iter().filter(|r| r["type"] == "packet").count() as u64;
    assert!(
        stats["decoded"].as_u64().unwrap() >= 8 + shown,
        "stats count everything: {stats}"
    );

    // --name (case and trailing dot aside) and --pod: only that name, only in CoreDNS pods.
    let t = Tracer::start(
        &lab,
        lab.node_ns(),
        &trace_args(
            &lab,
            &[
                "-o",
                "json",
                "--host-root",
                &root,
                "--view",
                "packets",
                "--name",
                "WWW.Lab.Test",
                "--pod",
                "kube-system/coredns-*",
            ],
        ),
    )
    .unwrap();
    for name in ["www.lab.test.", "other.lab.test."] {
        lab.dig(&["+time=5", "+tries=1", name, "A"]);
    }
    let recs = t.stop().records();
    let packets: Vec<_> = recs.iter().filter(|r| r["type"] == "packet").collect();
    assert!(!packets.is_empty(), "{recs:?}");
    for p in &packets {
        assert_eq!(qname(p), Some("www.lab.test."), "{p}");
        assert!(
            p["pod"]
                .as_str()
                .unwrap()
                .starts_with("kube-system/coredns-"),
            "{p}"
        );
    }
    let stats = recs.iter().rfind(|r| r["type"] == "stats").unwrap();
    assert!(
        stats["packets"].as_u64().unwrap() > packets.len() as u64,
        "{stats}"
    );
}

#[test]
fn text_view_shows_pods_in_place_of_namespaces() {
    let Some((lab, pods)) = setup() else {
        return;
    };
    let root = pods.host_root.to_str().unwrap().to_string();
    let t = Tracer::start(
        &lab,
        lab.node_ns(),
        &trace_args(&lab, &["--host-root", &root, "--view", "both"]),
    )
    .unwrap();
    let out = lab.dig(&["+time=5", "+tries=1", "www.lab.test.", "A"]);
    assert!(out.status.success(), "{out:?}");
    let out = t.stop();
    assert!(out.status.success(), "{}", out.stderr);
    let client = pods.of(Pod::Client).unwrap().label();
    let text = &out.stdout;
    assert!(text.contains(&format!(" {client}/eth0 out udp")), "{text}");
    assert!(
        text.contains(&format!(
            "{}/{}({client}) in  udp",
            lab.node_ns(),
            lab.veth_of(Pod::Client)
        )),
        "{text}"
    );
    assert!(text.contains(" kube-system/coredns-"), "{text}");
    assert!(
        !text.contains(&format!("{}/eth0", lab.client_ns())),
        "{text}"
    );
    // The transaction's first line names the client's pod.
    assert!(
        text.lines()
            .any(|l| l.contains(&format!(" {client} ")) && l.contains("asks www.lab.test.")),
        "{text}"
    );
}

#[test]
fn node_side_veths_name_their_pods_without_all_netns() {
    let Some((lab, pods)) = setup() else {
        return;
    };
    let root = pods.host_root.to_str().unwrap().to_string();
    // Only the node's own interfaces: the pods' namespaces are entered once each, to pair
    // their eth0 with the node-side veths.
    let t = Tracer::start(
        &lab,
        lab.node_ns(),
        &["trace", "-o", "json", "--host-root", &root],
    )
    .unwrap();
    let out = lab.dig(&["+time=5", "+tries=1", "www.lab.test.", "A"]);
    assert!(out.status.success(), "{out:?}");
    let recs = t.stop().records();
    let mut named = 0;
    for r in recs
        .iter()
        .filter(|r| r["type"] == "packet" && qname(r) == Some("www.lab.test."))
    {
        assert_eq!(r["netns"], lab.node_ns(), "{r}");
        if check_place(&lab, &pods, r, "packet") {
            named += 1;
        }
    }
    assert!(named >= 4, "client and CoreDNS veths, both ways: {recs:?}");
    let client = pods.of(Pod::Client).unwrap();
    let t = recs
        .iter()
        .find(|r| r["type"] == "transaction" && r["question"]["name"] == "www.lab.test.")
        .unwrap_or_else(|| panic!("no transaction"));
    assert_eq!(
        t["pod"],
        client.label().as_str(),
        "the client's pod from its veth: {t}"
    );
    assert!(t.get("pod_veth").is_none(), "{t}");
}

#[test]
fn namespace_qtype_rcode_and_slower_than_filters() {
    let Some((lab, pods)) = setup() else {
        return;
    };
    let root = pods.host_root.to_str().unwrap().to_string();
    let run = |args: &[&str], digs: &[&[&str]]| -> Vec<Value> {
        let mut all = vec!["-o", "json", "--host-root", &root];
        all.extend_from_slice(args);
        let t = Tracer::start(&lab, lab.node_ns(), &trace_args(&lab, &all)).unwrap();
        for d in digs {
            lab.dig(d);
        }
        t.stop().records()
    };
    let answered: &[&str] = &["+time=5", "+tries=1", "www.lab.test.", "A"];
    let aaaa: &[&str] = &["+time=5", "+tries=1", "www.lab.test.", "AAAA"];
    let nx: &[&str] = &["+time=5", "+tries=1", "nothing-here.lab.test.", "A"];

    // --namespace and --qtype: AAAA packets in kube-system's pods only.
    let recs = run(
        &[
            "--view",
            "packets",
            "--namespace",
            "kube-system",
            "--qtype",
            "AAAA",
        ],
        &[answered, aaaa],
    );
    let packets: Vec<_> = recs.iter().filter(|r| r["type"] == "packet").collect();
    assert!(
        packets.len() >= 4,
        "query and answer, in and on the veth: {recs:?}"
    );
    for p in &packets {
        assert_eq!(p["dns"]["questions"][0]["type"], "AAAA", "{p}");
        assert!(
            p["pod"].as_str().unwrap().starts_with("kube-system/"),
            "{p}"
        );
    }
    let client = pods.of(Pod::Client).unwrap().label();
    assert!(recs.iter().all(|r| r["pod"] != client.as_str()), "{recs:?}");

    // --rcode: only the NXDOMAIN lookup's transaction.
    let recs = run(
        &["--view", "transactions", "--rcode", "NXDOMAIN"],
        &[answered, nx],
    );
    let shown: Vec<_> = recs.iter().filter(|r| r["type"] == "transaction").collect();
    assert!(!shown.is_empty(), "{recs:?}");
    for t in &shown {
        assert_eq!(t["question"]["name"], "nothing-here.lab.test.", "{t}");
        assert_eq!(t["pod"], client.as_str(), "{t}");
    }

    // --slower-than: the answered lookup (milliseconds) is hidden, the dropped one (never
    // answered: slower than anything) is shown; the stats count both.
    let t = Tracer::start(
        &lab,
        lab.node_ns(),
        &trace_args(
            &lab,
            &[
                "-o",
                "json",
                "--host-root",
                &root,
                "--view",
                "transactions",
                "--slower-than",
                "2s",
                "--timeout",
                "1",
            ],
        ),
    )
    .unwrap();
    let out = lab.dig(answered);
    assert!(out.status.success(), "{out:?}");
    let o = lab.pod_dns_drop("-I");
    assert!(o.status.success(), "{o:?}");
    let out = lab.dig(&["+time=1", "+tries=1", "dropped.lab.test.", "A"]);
    assert!(!out.status.success(), "query should have been dropped");
    let recs = t.stop().records();
    lab.pod_dns_drop("-D");
    let shown: Vec<_> = recs.iter().filter(|r| r["type"] == "transaction").collect();
    assert!(
        shown
            .iter()
            .any(|t| t["question"]["name"] == "dropped.lab.test."),
        "{recs:?}"
    );
    assert!(
        shown
            .iter()
            .all(|t| t["question"]["name"] != "www.lab.test."),
        "{recs:?}"
    );
    let stats = recs.iter().rfind(|r| r["type"] == "stats").unwrap();
    assert!(
        stats["decoded"].as_u64().unwrap() >= 8,
        "stats count what is not shown: {stats}"
    );
}
