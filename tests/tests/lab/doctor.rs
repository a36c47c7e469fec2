#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "integration tests fail at the line that broke"
)]
//! `dnspath doctor` on the lab: a healthy lab under load gives no finding and exit 0; each
//! injected fault is found, ranked first, with its evidence, and sets the exit status
//! (docs/doctor.md). Root only; `--test-threads=1`.
use std::{
    fs,
    os::unix::fs::symlink,
    path::{Path, PathBuf},
    thread,
    time::Duration,
};

use lab::{
    addr,
    hole::{Hole, SLOW_ADDR},
    kube_proxy,
    node_cache::{NodeCache, NODE_CACHE_ADDR},
    race,
    resolved::Resolved,
    tracer::{Tracer, TracerOutput},
    DnsPodConfig, DnsServerKind, Lab, Pod,
};
use serde_json::Value;

use crate::shared::{lab, TestCgroup};

/// `dnspath doctor -o json --duration SECS` in the node namespace, once it is tracing.
fn doctor(lab: &Lab, secs: u32) -> Tracer {
    let d = format!("{secs}s");
    Tracer::start(
        lab,
        lab.node_ns(),
        &["doctor", "-o", "json", "--duration", &d],
    )
    .unwrap()
}

/// A host root of this lab for `--host-root`: the machine's `/proc` and `/run`, its `/sys` as
/// this test process sees it (`ip netns exec` mounts a fresh sysfs without the cgroup
/// mounts; this test's own mount namespace has them), and an empty kubelet log tree.
fn host_root(lab: &Lab) -> PathBuf {
    let root = lab.temp_dir().join("doctor-root");
    fs::create_dir_all(root.join("var/log/pods")).unwrap();
    symlink("/proc", root.join("proc")).unwrap();
    symlink("/run", root.join("run")).unwrap();
    symlink(
        format!("/proc/{}/root/sys", std::process::id()),
        root.join("sys"),
    )
    .unwrap();
    root
}

/// As [`doctor`], with `--host-root ROOT`.
fn doctor_at(lab: &Lab, root: &Path, secs: u32) -> Tracer {
    let d = format!("{secs}s");
    let r = root.to_string_lossy().into_owned();
    Tracer::start(
        lab,
        lab.node_ns(),
        &["doctor", "-o", "json", "--duration", &d, "--host-root", &r],
    )
    .unwrap()
}

/// Writes kubelet's log `N.log` of `container` of pod `ns/name` under `root`, in the CRI log
/// format, one line per message.
fn kubelet_log(root: &Path, ns: &str, name: &str, container: &str, n: u32, msgs: &[&str]) {
    let dir = root.join(format!(
        "var/log/pods/{ns}_{name}_0f5c5b56-4c0a-4b8e-9a55-{:012x}/{container}",
        name.len()
    ));
    fs::create_dir_all(&dir).unwrap();
    let text: String = msgs
        .iter()
        .enumerate()
        .map(|(i, m)| format!("2026-12-02T10:00:{i:02}.000000000Z stderr F {m}\n"))
        .collect();
    fs::write(dir.join(format!("{n}.log")), text).unwrap();
}

/// A healthy CoreDNS's log: started, restarted once by a rollout (SIGTERM), serving.
fn healthy_coredns_logs(root: &Path) {
    let start = [
        ".:53",
        "[INFO] plugin/reload: Running configuration SHA512 = 591cf328cccc12bc490481273e738df59329c62c0b729d94e8b61db9961c2fa5f046dd37f1cf888b953814040d180f52594972691cd6ff41be96639138a43908",
        "CoreDNS-1.11.1",
        "linux/amd64, go1.20.7, ae2bbc2",
        "[INFO] 10.244.1.2:41235 - 1 \"A IN www.lab.test. udp 41 false 1232\" NOERROR qr,aa,rd 46 0.000131s",
    ];
    let mut stopped = start.to_vec();
    stopped.push("[INFO] SIGTERM: Shutting down servers then terminating");
    kubelet_log(
        root,
        "kube-system",
        "coredns-5d78c9869d-7xk2p",
        "coredns",
        0,
        &stopped,
    );
    kubelet_log(
        root,
        "kube-system",
        "coredns-5d78c9869d-7xk2p",
        "coredns",
        1,
        &start,
    );
}

/// The report, its exit status checked against its own `exit_status`.
fn report(out: &TracerOutput) -> Value {
    let r: Value = serde_json::from_str(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}\nstderr:\n{}", out.stdout, out.stderr));
    assert_eq!(
        out.status.code(),
        r["exit_status"].as_u64().map(|c| c as i32),
        "{r:#}\nstderr:\n{}",
        out.stderr
    );
    r
}

fn kinds(r: &Value) -> Vec<&str> {
    r["findings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["kind"].as_str().unwrap())
        .collect()
}

/// A finding's evidence, one fact a string.
fn evidence(f: &Value) -> Vec<&str> {
    f["evidence"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e.as_str().unwrap())
        .collect()
}

fn finding<'a>(r: &'a Value, kind: &str) -> &'a Value {
    r["findings"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["kind"] == kind)
        .unwrap_or_else(|| panic!("no {kind} finding: {r:#}"))
}

#[test]
fn healthy_lab_under_load_has_no_finding() {
    let Some(lab) = lab() else { return };
    // kubelet's logs of a CoreDNS restarted by a rollout: a restart, no crash.
    let root = host_root(&lab);
    healthy_coredns_logs(&root);
    let t = doctor_at(&lab, &root, 8);
    // Many clients, one name, retries allowed.
    crate::shared::many_clients_one_name(&lab);
    let out = t.wait();
    let r = report(&out);
    assert_eq!(kinds(&r), Vec::<&str>::new(), "{r:#}");
    assert_eq!(r["worst"], "none");
    assert_eq!(out.status.code(), Some(0));
    assert!(
        r["checked"]["transactions"].as_u64().unwrap() >= 100,
        "{r:#}"
    );
    assert!(
        r["checked"]["dns_servers"].as_array().unwrap().len() >= 2,
        "the two dnsdist pods are found: {r:#}"
    );
    assert!(r["checked"]["configs_read"].as_u64().unwrap() >= 2, "{r:#}");
    assert!(r["checked"]["services"].as_u64().unwrap() >= 1, "{r:#}");
    // What the quiet checks looked at: the logs, the servers' cgroups, conntrack.
    assert_eq!(r["checked"]["pod_logs"], 2, "{r:#}");
    assert!(r["checked"]["cgroups"].as_u64().unwrap() >= 2, "{r:#}");
    assert!(
        r["checked"]["conntrack"].as_str().unwrap().contains(" of "),
        "{r:#}"
    );
}

#[test]
fn a_server_forwarding_to_its_own_service_is_found_before_a_query_and_at_runtime() {
    let Some(mut lab) = lab() else { return };
    let to_svc = || DnsPodConfig::new(DnsServerKind::Dnsdist).forwarding_to_cluster_ip();
    lab.reconfigure_dns_pod(0, to_svc()).unwrap();
    lab.reconfigure_dns_pod(1, to_svc()).unwrap();
    let t = doctor(&lab, 6);
    let _ = lab.dig(&["+time=1", "+tries=1", "storm.lab.test.", "A"]);
    let out = t.wait();
    lab.reconfigure_dns_pod(0, DnsPodConfig::new(DnsServerKind::Dnsdist))
        .unwrap();
    lab.reconfigure_dns_pod(1, DnsPodConfig::new(DnsServerKind::Dnsdist))
        .unwrap();
    // Found from the files, said before tracing started (so before any query was sent).
    let said = out
        .stderr
        .find("critical StaticForwardingLoop")
        .expect(&out.stderr);
    let tracing = out.stderr.find("dnspath: tracing").expect(&out.stderr);
    assert!(said < tracing, "{}", out.stderr);
    let r = report(&out);
    assert_eq!(out.status.code(), Some(2), "{r:#}");
    assert_eq!(r["worst"], "critical");
    let k = kinds(&r);
    assert_eq!(k[0], "static_forwarding_loop", "ranked first: {r:#}");
    let f = finding(&r, "static_forwarding_loop");
    let cluster_ip = lab.cluster_ip().to_string();
    let line = f["config"]["text"].as_str().unwrap();
    assert!(
        line.contains("newServer") && line.contains(&cluster_ip),
        "{f:#}"
    );
    assert!(
        f["config"]["file"]
            .as_str()
            .unwrap()
            .ends_with("dnsdist.conf"),
        "{f:#}"
    );
    assert!(f["evidence"][0].as_str().unwrap().contains("DNAT"), "{f:#}");
    let rt = finding(&r, "runtime_loop");
    assert_eq!(rt["severity"], "critical");
    assert!(
        rt["seen"].as_str().unwrap().contains("storm.lab.test."),
        "{rt:#}"
    );
}

#[test]
fn a_drop_of_port_53_names_the_client_namespace() {
    let Some(lab) = lab() else { return };
    assert!(lab.pod_dns_drop("-I").status.success());
    let t = doctor(&lab, 5);
    for i in 0..3 {
        let _ = lab.dig(&["+time=1", "+tries=1", &format!("d{i}.lab.test."), "A"]);
    }
    let out = t.wait();
    let _ = lab.pod_dns_drop("-D");
    let r = report(&out);
    assert_eq!(out.status.code(), Some(2), "{r:#}");
    assert_eq!(kinds(&r)[0], "kernel_drops", "{r:#}");
    let f = finding(&r, "kernel_drops");
    assert!(f["count"].as_u64().unwrap() >= 3, "{f:#}");
    assert!(
        f["seen"].as_str().unwrap().contains("NETFILTER_DROP"),
        "{f:#}"
    );
    let text = f.to_string();
    assert!(
        text.contains(lab.client_ns()),
        "names the client's namespace: {f:#}"
    );
}

#[test]
fn an_answer_after_the_client_gave_up_is_a_late_answer_finding() {
    let Some(lab) = lab() else { return };
    let slow = Hole::slow(&lab, Duration::from_millis(1600), 1).unwrap();
    let t = doctor(&lab, 5);
    let at = format!("@{SLOW_ADDR}");
    let o = lab.dig(&["+time=1", "+tries=1", &at, "late.lab.test.", "A"]);
    assert!(!o.status.success(), "dig must give up: {o:?}");
    thread::sleep(Duration::from_millis(1000));
    let out = t.wait();
    drop(slow);
    let r = report(&out);
    assert_eq!(out.status.code(), Some(1), "warning: {r:#}");
    assert_eq!(kinds(&r), ["late_answers"], "{r:#}");
    let f = finding(&r, "late_answers");
    assert_eq!(f["severity"], "warning");
    assert_eq!(f["subject"], lab.client_ns());
    let ev = f["evidence"].to_string();
    assert!(ev.contains("late.lab.test."), "{f:#}");
    assert!(ev.contains("answer came at +1.6"), "{f:#}");
}

/// dnsmasq told (by its command line) to forward to 127.0.0.53, where it listens itself: the
/// loop over the pod's own loopback, found from `/proc/PID/cmdline` before a query.
#[test]
fn a_server_forwarding_to_its_own_loopback_is_a_static_loop() {
    let Some(mut lab) = lab() else { return };
    let stub: std::net::SocketAddr = "127.0.0.53:53".parse().unwrap();
    lab.reconfigure_dns_pod(
        0,
        DnsPodConfig::new(DnsServerKind::Dnsmasq).forwarding_to(stub),
    )
    .unwrap();
    let t = doctor(&lab, 2);
    let out = t.wait();
    lab.reconfigure_dns_pod(0, DnsPodConfig::new(DnsServerKind::Dnsdist))
        .unwrap();
    let r = report(&out);
    assert_eq!(out.status.code(), Some(2), "{r:#}");
    assert_eq!(kinds(&r), ["static_forwarding_loop"], "{r:#}");
    let f = finding(&r, "static_forwarding_loop");
    assert_eq!(f["config"]["file"], "argv", "{f:#}");
    assert_eq!(f["config"]["text"], "--server=127.0.0.53#53", "{f:#}");
    assert!(
        f["evidence"][0]
            .as_str()
            .unwrap()
            .contains("loopback of its own namespace"),
        "{f:#}"
    );
    assert!(f["subject"].as_str().unwrap().contains("dnsmasq"), "{f:#}");
}

/// kubelet's logs of three crashed DNS pods, written as a kubelet does (CRI format, `N.log` per
/// restart): the loop plugin's fatal line in the previous log of one, a bind failure on :53,
/// a Corefile that does not parse. Each is a critical finding naming the pod and the line.
#[test]
fn crashed_dns_pods_previous_logs_give_their_reasons() {
    let Some(lab) = lab() else { return };
    let root = host_root(&lab);
    healthy_coredns_logs(&root);
    let loop_line = "[FATAL] plugin/loop: Loop (127.0.0.1:38427 -> :53) detected for zone \".\", see https://coredns.io/plugins/loop#troubleshooting. Query: \"HINFO 4547991504243258144.3688648895315093531.\"";
    let pod = "coredns-7db6d8ff4d-x2x9q";
    for n in 0..4 {
        kubelet_log(
            &root,
            "kube-system",
            pod,
            "coredns",
            n,
            &[".:53", "CoreDNS-1.11.1", loop_line],
        );
    }
    // The current one, just started again.
    kubelet_log(
        &root,
        "kube-system",
        pod,
        "coredns",
        4,
        &[".:53", "CoreDNS-1.11.1"],
    );
    kubelet_log(
        &root,
        "kube-system",
        "coredns-7db6d8ff4d-b1ndx",
        "coredns",
        1,
        &["Listen: listen tcp :53: bind: address already in use"],
    );
    kubelet_log(
        &root,
        "kube-system",
        "coredns-7db6d8ff4d-p4rse",
        "coredns",
        0,
        &["/etc/coredns/Corefile:7 - Error during parsing: Unknown directive 'forwad'"],
    );
    let out = doctor_at(&lab, &root, 2).wait();
    let r = report(&out);
    assert_eq!(out.status.code(), Some(2), "{r:#}");
    let mut k = kinds(&r);
    assert_eq!(k[0], "loop_plugin_exit", "ranked first: {r:#}");
    k.sort_unstable();
    assert_eq!(
        k,
        [
            "config_parse_error",
            "loop_plugin_exit",
            "port53_bind_failure"
        ],
        "{r:#}"
    );
    let f = finding(&r, "loop_plugin_exit");
    assert_eq!(f["subject"], format!("kube-system/{pod}/coredns"), "{f:#}");
    assert_eq!(f["count"], 4, "restart count: {f:#}");
    assert_eq!(
        f["evidence"][0],
        format!("3.log: {loop_line}"),
        "the previous log's line: {f:#}"
    );
    assert!(f["fix"].as_str().unwrap().contains("resolvConf"), "{f:#}");
    let b = finding(&r, "port53_bind_failure");
    assert!(
        b["evidence"][0]
            .as_str()
            .unwrap()
            .contains("address already in use"),
        "{b:#}"
    );
    let c = finding(&r, "config_parse_error");
    assert!(
        c["evidence"][0].as_str().unwrap().contains("Corefile:7"),
        "{c:#}"
    );
    assert_eq!(r["checked"]["pod_logs"], 9, "{r:#}");
}

/// A real dnsmasq in a cgroup of 32 MiB and 1 % of a CPU: a process of its cgroup that
/// grows (`tail /dev/zero`) is OOM-killed, and the server, under a query load, is
/// throttled. Both are found from its cgroups; the other servers (no limits) are not named.
#[test]
fn an_oom_killed_and_throttled_dns_server_is_found_from_its_cgroups() {
    let Some(mut lab) = lab() else { return };
    lab.reconfigure_dns_pod(0, DnsPodConfig::new(DnsServerKind::Dnsmasq))
        .unwrap();
    let server = lab.server_pid(Pod::Dns(0)).unwrap();
    let name = format!("dnspath-doctor-{}", lab.prefix());
    let mem = TestCgroup::new("memory", &name).expect("a memory cgroup");
    let cpu = TestCgroup::new("cpu", &name).expect("a cpu cgroup");
    mem.add(server);
    cpu.add(server);
    if mem.dir.join("memory.limit_in_bytes").exists() {
        mem.set("memory.limit_in_bytes", "33554432");
        if mem.dir.join("memory.memsw.limit_in_bytes").exists() {
            mem.set("memory.memsw.limit_in_bytes", "33554432");
        }
    } else {
        mem.set("memory.max", "33554432");
        mem.set("memory.swap.max", "0");
    }
    if cpu.dir.join("cpu.cfs_quota_us").exists() {
        cpu.set("cpu.cfs_period_us", "100000");
        cpu.set("cpu.cfs_quota_us", "1000");
    } else {
        cpu.set("cpu.max", "1000 100000");
    }
    let root = host_root(&lab);
    let t = doctor_at(&lab, &root, 6);
    // The pod's other process, growing until the kernel kills it.
    let grow = format!("echo $$ > {}; exec tail /dev/zero", mem.procs());
    // Entered here, not under `ip netns exec` (whose fresh /sys has no cgroup mounts).
    let mut hog = lab
        .spawn(
            std::process::Command::new("sh")
                .args(["-c", &grow])
                .stdin(std::process::Stdio::null()),
        )
        .unwrap();
    let status = hog.wait().unwrap();
    assert!(
        !status.success(),
        "tail /dev/zero must be killed: {status:?}"
    );
    // Load on the server itself, 20 queries outstanding (no socket overflows): it needs more
    // than 1 ms of CPU per 100 ms.
    let at = addr::dns_pod(0).to_string();
    let load = format!(
        "for i in $(seq 400); do echo \"www.lab.test A\"; done > {0}/q; dnsperf -s {at} -d {0}/q -l 3 -q 20 >/dev/null",
        lab.temp_dir().display()
    );
    let o = lab.exec(lab.client_ns(), &["sh", "-c", &load]);
    assert!(o.status.success(), "{o:?}");
    let out = t.wait();
    lab.reconfigure_dns_pod(0, DnsPodConfig::new(DnsServerKind::Dnsdist))
        .unwrap();
    drop((mem, cpu));
    let r = report(&out);
    assert_eq!(out.status.code(), Some(1), "warnings: {r:#}");
    let mut k = kinds(&r);
    k.sort_unstable();
    // The throttled server may leave some of the load unanswered.
    k.retain(|k| *k != "unanswered_queries");
    assert_eq!(k, ["cpu_throttled", "oom_killed"], "{r:#}");
    let o = finding(&r, "oom_killed");
    assert!(
        o["subject"]
            .as_str()
            .unwrap()
            .contains(&format!("dnsmasq pid {server}")),
        "{o:#}"
    );
    assert_eq!(o["count"], 1, "{o:#}");
    let ev = o["evidence"].to_string();
    assert!(ev.contains(&name) && ev.contains("oom_kill 1"), "{o:#}");
    assert!(ev.contains("1 of them during the watch"), "{o:#}");
    let c = finding(&r, "cpu_throttled");
    assert!(
        c["subject"]
            .as_str()
            .unwrap()
            .contains(&format!("dnsmasq pid {server}")),
        "{c:#}"
    );
    assert!(c["count"].as_u64().unwrap() >= 3, "{c:#}");
}

/// The conntrack insert race forced (an A held after DNAT while its socket's AAAA goes
/// straight to the pods): the race finding carries the counters' growth and the kernel's
/// clash resolution as evidence, with the runbooks' fixes.
#[test]
fn the_forced_conntrack_race_is_found_with_its_counters() {
    let Some(lab) = lab() else { return };
    let rig = race::RaceRig::install(&lab, 300).unwrap();
    let t = Tracer::start(
        &lab,
        lab.node_ns(),
        &["doctor", "-o", "json", "--duration", "6s", "--timeout", "1"],
    )
    .unwrap();
    for i in 0..3 {
        race::force_race(&lab, &format!("forced{i}.lab.test")).unwrap();
    }
    let out = t.wait();
    rig.remove().unwrap();
    let r = report(&out);
    assert_eq!(out.status.code(), Some(1), "{r:#}");
    let f = finding(&r, "conntrack_race");
    assert_eq!(f["count"], 3, "{f:#}");
    let ev = f["evidence"].to_string();
    assert!(ev.contains("insert_failed +3, drop +3"), "{f:#}");
    assert!(ev.contains("clash resolution"), "{f:#}");
    let fix = f["fix"].as_str().unwrap();
    assert!(
        fix.contains("single-request-reopen")
            && fix.contains("NodeLocal DNSCache")
            && fix.contains("5.6"),
        "{f:#}"
    );
    assert!(
        !kinds(&r).contains(&"conntrack_insert_failed"),
        "attributed drops are not said twice: {r:#}"
    );
}

/// kube-proxy's rule for a DNS Service without endpoints (`filter` `KUBE-SERVICES`, REJECT):
/// a critical finding naming the Service IP, with the queries the client sent it.
#[test]
fn a_dns_service_without_endpoints_is_named_with_its_rejected_queries() {
    let Some(lab) = lab() else { return };
    let ip = "10.96.0.99";
    let node = lab.node_ns();
    let chain = "KUBE-SERVICES";
    let rules: Vec<Vec<&str>> = vec![
        vec!["-t", "filter", "-N", chain],
        vec![
            "-t",
            "filter",
            "-I",
            "FORWARD",
            "-m",
            "conntrack",
            "--ctstate",
            "NEW",
            "-m",
            "comment",
            "--comment",
            "kubernetes service portals",
            "-j",
            chain,
        ],
        vec![
            "-t",
            "filter",
            "-A",
            chain,
            "-d",
            "10.96.0.99/32",
            "-p",
            "udp",
            "-m",
            "comment",
            "--comment",
            "kube-system/nodns:dns has no endpoints",
            "-m",
            "udp",
            "--dport",
            "53",
            "-j",
            "REJECT",
            "--reject-with",
            "icmp-port-unreachable",
        ],
    ];
    for rule in &rules {
        let mut args = vec![lab.iptables()];
        args.extend_from_slice(rule);
        let o = lab.exec(node, &args);
        assert!(o.status.success(), "{args:?}: {o:?}");
    }
    let t = doctor(&lab, 4);
    let at = format!("@{ip}");
    for i in 0..3 {
        let o = lab.dig(&["+time=1", "+tries=1", &at, &format!("n{i}.lab.test."), "A"]);
        assert!(!o.status.success(), "rejected: {o:?}");
    }
    let out = t.wait();
    for args in [
        vec![
            lab.iptables(),
            "-t",
            "filter",
            "-D",
            "FORWARD",
            "-m",
            "conntrack",
            "--ctstate",
            "NEW",
            "-m",
            "comment",
            "--comment",
            "kubernetes service portals",
            "-j",
            chain,
        ],
        vec![lab.iptables(), "-t", "filter", "-F", chain],
        vec![lab.iptables(), "-t", "filter", "-X", chain],
    ] {
        let _ = lab.exec(node, &args);
    }
    let r = report(&out);
    assert_eq!(out.status.code(), Some(2), "{r:#}");
    assert_eq!(kinds(&r)[0], "service_without_endpoints", "{r:#}");
    let f = finding(&r, "service_without_endpoints");
    assert_eq!(f["subject"], format!("{ip}:53"), "{f:#}");
    assert!(
        f["seen"]
            .as_str()
            .unwrap()
            .contains("kube-system/nodns:dns"),
        "{f:#}"
    );
    assert_eq!(f["count"], 3, "the three queries: {f:#}");
}

/// A client that ignores TC (`dig +ignore`, as old musl does) on an answer too large for UDP:
/// truncated answers never retried over TCP; a client that does retry is no finding.
#[test]
fn truncated_answers_never_retried_over_tcp_are_found() {
    let Some(lab) = lab() else { return };
    let t = doctor(&lab, 4);
    let at = format!("@{}", lab.cluster_ip());
    let big = format!("{}.", addr::BIG_TXT);
    for _ in 0..2 {
        let o = lab.dig(&["+ignore", "+time=2", "+tries=1", &at, &big, "TXT"]);
        assert!(o.status.success(), "{o:?}");
    }
    // A glibc-like client retries over TCP: no finding of its own.
    let o = lab.dig(&["+time=2", "+tries=1", &at, &big, "TXT"]);
    assert!(o.status.success(), "{o:?}");
    let out = t.wait();
    let r = report(&out);
    assert_eq!(kinds(&r), ["truncated_not_retried"], "{r:#}");
    assert_eq!(out.status.code(), Some(1), "{r:#}");
    let f = finding(&r, "truncated_not_retried");
    assert_eq!(f["count"], 2, "{f:#}");
    assert_eq!(f["subject"], lab.client_ns(), "{f:#}");
    assert!(
        f["evidence"].to_string().contains("big.lab.test. TXT"),
        "{f:#}"
    );
}

/// NodeLocal DNSCache on the node: lookups through it (hits and misses) are no finding; a
/// client asking a CoreDNS pod itself goes around it, each such query labelled `bypass`.
#[test]
fn queries_around_nodelocal_dnscache_are_found_and_those_through_it_are_not() {
    let Some(lab) = lab() else { return };
    let _cache = NodeCache::start(&lab).unwrap();
    let t = doctor(&lab, 4);
    let dig = |args: &[&str]| {
        let o = lab.dig(args);
        assert!(o.status.success(), "{args:?}: {o:?}");
    };
    for _ in 0..4 {
        dig(&["+time=2", "+tries=1", "www.lab.test.", "A"]);
    }
    let coredns = format!("@{}", lab.ip_of(Pod::Dns(0)));
    for _ in 0..3 {
        dig(&["+time=2", "+tries=1", &coredns, "ns.lab.test.", "A"]);
    }
    let out = t.wait();
    let r = report(&out);
    assert_eq!(kinds(&r), ["node_cache_bypassed"], "{r:#}");
    assert_eq!(out.status.code(), Some(1), "{r:#}");
    let f = finding(&r, "node_cache_bypassed");
    assert_eq!(f["count"], 3, "{f:#}");
    assert_eq!(f["subject"], lab.client_ns(), "{f:#}");
    assert!(
        f["seen"]
            .as_str()
            .unwrap()
            .contains(&format!("{}:53", lab.ip_of(Pod::Dns(0)))),
        "{f:#}"
    );
}

/// systemd-resolved in the node's namespace: the node's stub on 127.0.0.53 (and on the
/// node's address the pods reach, `DNSStubListenerExtra=`), `DNS=` the `upstreams`; a host
/// root whose /etc/resolv.conf is resolved's own stub-resolv.conf, as on a systemd-resolved
/// node. Panics when the package is not unpacked (`cargo xtask setup`).
fn node_resolved(lab: &Lab, upstreams: &[std::net::IpAddr]) -> (Resolved, PathBuf) {
    let r = Resolved::start(
        lab,
        lab.node_ns(),
        upstreams,
        Some(addr::NODE_GATEWAY.into()),
    )
    .unwrap()
    .expect("systemd-resolved is not unpacked: run `cargo xtask setup`");
    let root = host_root(lab);
    // On a node /etc/resolv.conf links to resolved's stub-resolv.conf, which doctor resolves
    // beneath the host root (never through the container's own /run). This root's `run`
    // is the lab host's /run, so the file resolved wrote is copied in its place.
    fs::create_dir_all(root.join("etc")).unwrap();
    fs::copy(
        r.path("/run/systemd/resolve/stub-resolv.conf"),
        root.join("etc/resolv.conf"),
    )
    .unwrap();
    (r, root)
}

/// Both "CoreDNS" pods forward to the node's resolver (at the node's address), a real
/// systemd-resolved whose `DNS=` is the cluster DNS ClusterIP: the loop
/// pod → node stub → ClusterIP → pod, found from resolved's own files before a query, and
/// at runtime when a lookup enters it; the node's resolver is named as sending to cluster
/// DNS, with resolved.conf's line.
#[test]
fn the_node_systemd_resolved_forwarding_to_cluster_dns_closes_a_loop() {
    let Some(mut lab) = lab() else { return };
    let (resolved, root) = node_resolved(&lab, &[lab.cluster_ip().into()]);
    // resolved's own account of its upstreams: the ClusterIP.
    let rc = fs::read_to_string(resolved.path("/run/systemd/resolve/resolv.conf")).unwrap();
    assert!(rc.contains("nameserver 10.96.0.10"), "{rc}");
    let to_node: std::net::SocketAddr = format!("{}:53", addr::NODE_GATEWAY).parse().unwrap();
    for i in 0..2 {
        lab.reconfigure_dns_pod(
            i,
            DnsPodConfig::new(DnsServerKind::Dnsdist).forwarding_to(to_node),
        )
        .unwrap();
    }
    let t = doctor_at(&lab, &root, 6);
    // The node's own lookup through its stub, and a pod's through the Service.
    let _ = lab.exec(
        lab.node_ns(),
        &[
            "dig",
            "+time=2",
            "+tries=1",
            "@127.0.0.53",
            "stub.lab.test.",
            "A",
        ],
    );
    let _ = lab.dig(&["+time=2", "+tries=1", "pod.lab.test.", "A"]);
    let out = t.wait();
    drop(resolved);
    for i in 0..2 {
        lab.reconfigure_dns_pod(i, DnsPodConfig::new(DnsServerKind::Dnsdist))
            .unwrap();
    }
    let said = out
        .stderr
        .find("critical StaticForwardingLoop")
        .expect(&out.stderr);
    let tracing = out.stderr.find("dnspath: tracing").expect(&out.stderr);
    assert!(said < tracing, "{}", out.stderr);
    let r = report(&out);
    assert_eq!(out.status.code(), Some(2), "{r:#}");
    let k = kinds(&r);
    assert_eq!(k[0], "static_forwarding_loop", "ranked first: {r:#}");
    // The loop as the stub closes it: its resolved.conf line, through the Service's DNAT.
    let stub = r["findings"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| {
            f["kind"] == "static_forwarding_loop"
                && f["subject"]
                    .as_str()
                    .unwrap()
                    .contains("node's systemd-resolved")
        })
        .unwrap_or_else(|| panic!("no loop through the node's systemd-resolved: {r:#}"));
    assert_eq!(
        stub["config"]["file"], "/etc/systemd/resolved.conf",
        "{stub:#}"
    );
    assert_eq!(stub["config"]["line"], 2, "{stub:#}");
    assert_eq!(stub["config"]["text"], "DNS=10.96.0.10", "{stub:#}");
    assert!(
        stub["evidence"][0].as_str().unwrap().contains("DNAT"),
        "{stub:#}"
    );
    // And as a pod closes it: its dnsdist line, then resolved's.
    let pod = r["findings"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| {
            f["kind"] == "static_forwarding_loop"
                && f["config"]["text"]
                    .as_str()
                    .unwrap()
                    .contains("169.254.1.1")
        })
        .unwrap_or_else(|| panic!("no loop from a pod's config: {r:#}"));
    assert!(
        pod["evidence"]
            .to_string()
            .contains("/etc/systemd/resolved.conf:2: `DNS=10.96.0.10`"),
        "{pod:#}"
    );
    // The node's resolver: /etc/resolv.conf → 127.0.0.53 → resolved → the ClusterIP.
    let node = finding(&r, "node_resolver_to_cluster_dns");
    assert_eq!(node["config"]["text"], "DNS=10.96.0.10", "{node:#}");
    assert!(
        node["seen"].as_str().unwrap().contains("127.0.0.53"),
        "{node:#}"
    );
    assert!(
        node["fix"]
            .as_str()
            .unwrap()
            .contains("/etc/systemd/resolved.conf"),
        "{node:#}"
    );
    // And at runtime.
    let rt = finding(&r, "runtime_loop");
    assert_eq!(rt["severity"], "critical");
}

/// The same node stub forwarding to a real upstream outside cluster DNS: pods forward through
/// it and are answered; no loop, no node resolver finding — no finding at all.
#[test]
fn the_node_systemd_resolved_forwarding_upstream_is_no_finding() {
    let Some(mut lab) = lab() else { return };
    let (resolved, root) = node_resolved(&lab, &[addr::UPSTREAM.into()]);
    let to_node: std::net::SocketAddr = format!("{}:53", addr::NODE_GATEWAY).parse().unwrap();
    for i in 0..2 {
        lab.reconfigure_dns_pod(
            i,
            DnsPodConfig::new(DnsServerKind::Dnsdist).forwarding_to(to_node),
        )
        .unwrap();
    }
    let t = doctor_at(&lab, &root, 5);
    let node = lab.exec(
        lab.node_ns(),
        &[
            "dig",
            "+time=2",
            "+tries=2",
            "@127.0.0.53",
            "www.lab.test.",
            "A",
        ],
    );
    let pod = lab.dig(&["+time=2", "+tries=2", "+short", "www.lab.test.", "A"]);
    let out = t.wait();
    drop(resolved);
    for i in 0..2 {
        lab.reconfigure_dns_pod(i, DnsPodConfig::new(DnsServerKind::Dnsdist))
            .unwrap();
    }
    assert!(
        String::from_utf8_lossy(&node.stdout).contains(&addr::WWW_A.to_string()),
        "{node:?}"
    );
    assert!(
        String::from_utf8_lossy(&pod.stdout).contains(&addr::WWW_A.to_string()),
        "{pod:?}"
    );
    let r = report(&out);
    assert_eq!(kinds(&r), Vec::<&str>::new(), "{r:#}");
    assert_eq!(out.status.code(), Some(0));
    let ns = r["checked"]["node_nameservers"].to_string();
    assert!(
        ns.contains("10.250.0.53") && ns.contains("systemd-resolved"),
        "{r:#}"
    );
    assert!(
        r["checked"]["dns_servers"]
            .to_string()
            .contains("the node's systemd-resolved"),
        "{r:#}"
    );
}

const CT_MAX: &str = "/proc/sys/net/netfilter/nf_conntrack_max";

/// `nf_conntrack_max` (one value for the machine, written in its own network namespace)
/// lowered for a test, put back on drop, also when the test panics. Each namespace's table
/// counts its own entries against it: another lab's namespaces, far below it, are not
/// touched.
struct CtMax {
    old: String,
}

impl CtMax {
    fn set(max: u64) -> CtMax {
        let old = machine_sysctl(|| fs::read_to_string(CT_MAX)).unwrap();
        let guard = CtMax { old };
        machine_sysctl(|| fs::write(CT_MAX, max.to_string())).unwrap();
        guard
    }
}

impl Drop for CtMax {
    fn drop(&mut self) {
        let old = self.old.trim();
        if let Err(e) = machine_sysctl(|| fs::write(CT_MAX, old)) {
            eprintln!("could not restore {CT_MAX} to {old}: {e}");
        }
    }
}

/// A machine-wide sysctl read or written in the machine's network namespace.
fn machine_sysctl<T: Send>(f: impl FnOnce() -> std::io::Result<T> + Send) -> std::io::Result<T> {
    lab::sandbox::in_machine_netns(f)?
}

fn ct_count(lab: &Lab, ns: &str) -> u64 {
    let o = lab.exec(ns, &["cat", "/proc/sys/net/netfilter/nf_conntrack_count"]);
    String::from_utf8_lossy(&o.stdout).trim().parse().unwrap()
}

/// The node namespace's conntrack table ~90 % full (400 UDP port-53 entries inserted with
/// `conntrack -I`, `nf_conntrack_max` lowered to fit them, restored after): a
/// `conntrack_table_fill` warning, first; with the machine's own maximum, none.
#[test]
fn a_nearly_full_conntrack_table_is_found() {
    let Some(lab) = lab() else { return };
    let node = lab.node_ns();
    let fill = lab.exec(
        node,
        &[
            "sh",
            "-c",
            "for i in $(seq 400); do conntrack -I -s 10.9.0.1 -d 10.9.0.2 -p udp --sport $((20000 + i)) --dport 53 -t 300 2>/dev/null || exit 1; done",
        ],
    );
    assert!(fill.status.success(), "{fill:?}");
    let count = ct_count(&lab, node);
    assert!(count >= 400, "{count}");
    // Nothing else may hit the lowered maximum: the machine's namespace stays far below it.
    let host: u64 =
        machine_sysctl(|| fs::read_to_string("/proc/sys/net/netfilter/nf_conntrack_count"))
            .unwrap()
            .trim()
            .parse()
            .unwrap();
    let max = count * 100 / 90;
    assert!(
        host < max / 2,
        "the machine's own table holds {host} entries"
    );
    let out = {
        let _lowered = CtMax::set(max);
        doctor(&lab, 2).wait()
    };
    let r = report(&out);
    assert_eq!(out.status.code(), Some(1), "warning: {r:#}");
    assert_eq!(kinds(&r)[0], "conntrack_table_fill", "{r:#}");
    let f = finding(&r, "conntrack_table_fill");
    assert_eq!(f["severity"], "warning");
    assert_eq!(f["subject"], "node");
    assert!(
        f["seen"]
            .as_str()
            .unwrap()
            .contains(&format!(" of {max} entries")),
        "{f:#}"
    );
    assert!(f["count"].as_u64().unwrap() >= 400, "{f:#}");
    // Restored: the same entries are a sliver of the machine's maximum.
    assert_ne!(
        machine_sysctl(|| fs::read_to_string(CT_MAX))
            .unwrap()
            .trim(),
        max.to_string()
    );
    let out = doctor(&lab, 1).wait();
    let r = report(&out);
    assert!(!kinds(&r).contains(&"conntrack_table_fill"), "{r:#}");
}

/// A pod of its own where a dnsmasq answers ~3.5 KB on port 53.
const BIG_SERVER: &str = "10.250.0.56";
const BIG_NAME: &str = "big.frag.test.";

/// A large answer (16 TXT strings of 200 bytes, EDNS 4096) from a server on port 53 (dnsmasq,
/// in a pod of its own) whose pod's MTU is 1280, so it leaves as three IPv4 fragments; on the node's veth towards the
/// client, TC u32 filters redirect every later fragment to the node's service device, whose
/// peer is down (as fragments.rs does): the client gets the first fragment only. doctor names
/// the fragment loss at the client, with the question.
#[test]
fn fragments_lost_on_the_way_to_the_client_are_a_fragment_loss() {
    let Some(lab) = lab() else { return };
    let node = lab.node_ns();
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
            lab.temp_dir().join("big-dnsmasq.pid").display()
        ),
        "--port=53".into(),
        "--bind-interfaces".into(),
        format!("--listen-address={BIG_SERVER}"),
        "--edns-packet-max=4096".into(),
    ];
    for i in 0..16 {
        args.push(format!(
            "--txt-record={},\"{i:02}{}\"",
            BIG_NAME.trim_end_matches('.'),
            "f".repeat(198)
        ));
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    // A pod of its own: the lab's servers would answer on any new address of theirs.
    let big = Hole::serving(&lab, "big", BIG_SERVER, &args).unwrap();
    let up = big.ns();
    let o = lab.exec(up, &["ip", "link", "set", "dev", "eth0", "mtu", "1280"]);
    assert!(o.status.success(), "{o:?}");
    let at = format!("@{BIG_SERVER}");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let o = lab.exec(
            up,
            &["dig", "+short", "+time=1", "+tries=1", &at, BIG_NAME, "TXT"],
        );
        if o.status.success() && !o.stdout.is_empty() {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "dnsmasq did not answer: {o:?}"
        );
        thread::sleep(Duration::from_millis(100));
    }
    let vclient = lab.veth_of(Pod::Client);
    let sink = lab.service_dev();
    let o = lab.exec(node, &["tc", "qdisc", "add", "dev", vclient, "clsact"]);
    assert!(o.status.success(), "{o:?}");
    let filters: [Vec<&str>; 2] = [
        // First fragments and whole packets (offset zero) pass.
        vec![
            "pref", "1", "u32", "match", "u16", "0", "0x1fff", "at", "6", "classid", "1:1",
        ],
        vec![
            "pref", "2", "u32", "match", "u32", "0", "0", "action", "mirred", "egress", "redirect",
            "dev", sink,
        ],
    ];
    for f in &filters {
        let mut a = vec![
            "tc", "filter", "add", "dev", vclient, "egress", "protocol", "ip",
        ];
        a.extend_from_slice(f);
        let o = lab.exec(node, &a);
        assert!(o.status.success(), "{a:?}: {o:?}");
    }
    let t = doctor(&lab, 8);
    for _ in 0..3 {
        let o = lab.dig(&[
            "+bufsize=4096",
            "+notcp",
            "+ignore",
            "+time=1",
            "+tries=1",
            &at,
            BIG_NAME,
            "TXT",
        ]);
        assert!(
            !String::from_utf8_lossy(&o.stdout).contains("ANSWER: 16"),
            "answered through the filter: {o:?}"
        );
    }
    let out = t.wait();
    drop(big);
    let r = report(&out);
    // The fault first; the kernel's drops of those fragments (TC's redirect, the node's
    // re-fragmenting stopped) are its evidence, not a rule's drops.
    let k = kinds(&r);
    assert_eq!(k[0], "fragment_loss", "{r:#}");
    assert!(!k.contains(&"kernel_drops"), "{r:#}");
    assert_eq!(out.status.code(), Some(1), "warning: {r:#}");
    let f = finding(&r, "fragment_loss");
    assert!(
        f["evidence"].to_string().contains("dropped by the kernel"),
        "{f:#}"
    );
    assert_eq!(f["severity"], "warning");
    assert!(f["count"].as_u64().unwrap() >= 3, "{f:#}");
    assert!(f["seen"].as_str().unwrap().contains("eth0"), "{f:#}");
    let ev = f["evidence"].to_string();
    assert!(ev.contains("big.frag.test. TXT"), "{f:#}");
    assert!(ev.contains(BIG_SERVER), "{f:#}");
}

/// kube-proxy in nftables mode: the lab's iptables Service rules flushed and its rules as
/// kube-proxy's nftables proxier writes them loaded instead (`nft -f`, table
/// `ip kube-proxy`). Healthy: lookups through the ClusterIP work, the mode is `nftables`, the
/// DNS Service is known and there is no finding. Then a Service without endpoints in the
/// `no-endpoint-services` map and both "CoreDNS" pods forwarding to the ClusterIP: the
/// same static loop (through the nft DNAT) and no-endpoints findings as in iptables mode.
#[test]
fn kube_proxy_in_nftables_mode_gives_the_dns_service_and_the_same_findings() {
    let Some(mut lab) = lab() else { return };
    let node = lab.node_ns().to_owned();
    let o = lab.exec(&node, &[lab.iptables(), "-t", "nat", "-F", "KUBE-SERVICES"]);
    assert!(o.status.success(), "{o:?}");
    let backends: Vec<_> = (0..lab.dns_pod_count()).map(addr::dns_pod).collect();
    let rules = lab.temp_dir().join("kube-proxy.nft");
    fs::write(&rules, kube_proxy::nft_ruleset(&backends, &[])).unwrap();
    let o = lab.exec(&node, &["nft", "-f", &rules.to_string_lossy()]);
    assert!(o.status.success(), "nft -f: {o:?}");
    let t = doctor(&lab, 3);
    crate::shared::dig_ok(&lab, &["+time=2", "+tries=1", "www.lab.test.", "A"]);
    let out = t.wait();
    let r = report(&out);
    assert!(kinds(&r).is_empty(), "healthy in nftables mode: {r:#}");
    assert_eq!(
        r["checked"]["kube_proxy_mode"],
        serde_json::json!(["nftables"]),
        "{r:#}"
    );
    assert_eq!(r["checked"]["services"], 1, "{r:#}");
    assert!(r["checked"]["transactions"].as_u64().unwrap() >= 1, "{r:#}");

    let no_ep = "10.96.0.99";
    let more = lab.temp_dir().join("kube-proxy-more.nft");
    let text = kube_proxy::nft_ruleset(
        &backends,
        &[(no_ep.parse().unwrap(), "kube-system/nodns:dns")],
    );
    // Only the new elements: the table is there.
    let elements: String = text
        .lines()
        .filter(|l| l.starts_with("add element ip kube-proxy no-endpoint-services"))
        .map(|l| format!("{l}\n"))
        .collect();
    assert!(!elements.is_empty());
    fs::write(&more, elements).unwrap();
    let o = lab.exec(&node, &["nft", "-f", &more.to_string_lossy()]);
    assert!(o.status.success(), "nft -f: {o:?}");
    let to_svc = || DnsPodConfig::new(DnsServerKind::Dnsdist).forwarding_to_cluster_ip();
    lab.reconfigure_dns_pod(0, to_svc()).unwrap();
    lab.reconfigure_dns_pod(1, to_svc()).unwrap();
    let t = doctor(&lab, 4);
    let at = format!("@{no_ep}");
    for i in 0..3 {
        let o = lab.dig(&["+time=1", "+tries=1", &at, &format!("n{i}.lab.test."), "A"]);
        assert!(!o.status.success(), "rejected: {o:?}");
    }
    let out = t.wait();
    let r = report(&out);
    assert_eq!(out.status.code(), Some(2), "{r:#}");
    let k = kinds(&r);
    assert_eq!(k[0], "static_forwarding_loop", "{r:#}");
    let f = finding(&r, "static_forwarding_loop");
    let ev = f["evidence"][0].as_str().unwrap();
    assert!(
        ev.contains("is Service kube-system/kube-dns:dns")
            && ev.contains("whose DNAT rule sends to 10.244."),
        "{f:#}"
    );
    let f = finding(&r, "service_without_endpoints");
    assert_eq!(f["subject"], format!("{no_ep}:53"), "{f:#}");
    assert!(
        f["seen"]
            .as_str()
            .unwrap()
            .contains("kube-system/nodns:dns"),
        "{f:#}"
    );
    assert!(
        f["evidence"][0]
            .as_str()
            .unwrap()
            .contains("no-endpoint-services"),
        "{f:#}"
    );
    assert_eq!(f["count"], 3, "the three queries: {f:#}");
    assert_eq!(
        r["checked"]["kube_proxy_mode"],
        serde_json::json!(["nftables"]),
        "{r:#}"
    );
}

/// NodeLocal DNSCache with its NOTRACK rules (as node-cache sets them up): named in
/// `checked.node_local_dns` with its address, server and rules, no finding. With its UDP
/// NOTRACK rules deleted from the raw table: a `node_cache_notrack_missing` finding naming
/// the missing rules.
#[test]
fn nodelocal_dnscache_without_its_notrack_rules_is_found() {
    let Some(lab) = lab() else { return };
    let _cache = NodeCache::start(&lab).unwrap();
    let out = doctor(&lab, 2).wait();
    let r = report(&out);
    assert!(kinds(&r).is_empty(), "{r:#}");
    let nl = &r["checked"]["node_local_dns"];
    assert_eq!(nl["address"], NODE_CACHE_ADDR, "{r:#}");
    assert!(nl["server"].as_str().unwrap().contains("dnsdist"), "{nl:#}");
    assert_eq!(nl["notrack_rules"].as_array().unwrap().len(), 4, "{nl:#}");
    assert!(
        nl["notrack_missing"].as_array().unwrap().is_empty(),
        "{nl:#}"
    );

    let node = lab.node_ns();
    for (chain, a, p) in [("PREROUTING", "-d", "--dport"), ("OUTPUT", "-s", "--sport")] {
        let o = lab.exec(
            node,
            &[
                lab.iptables(),
                "-t",
                "raw",
                "-D",
                chain,
                a,
                NODE_CACHE_ADDR,
                "-p",
                "udp",
                p,
                "53",
                "-j",
                "NOTRACK",
            ],
        );
        assert!(o.status.success(), "{o:?}");
    }
    let t = doctor(&lab, 3);
    let at = format!("@{NODE_CACHE_ADDR}");
    crate::shared::dig_ok(&lab, &["+time=2", "+tries=1", &at, "www.lab.test.", "A"]);
    let out = t.wait();
    let r = report(&out);
    assert_eq!(kinds(&r), ["node_cache_notrack_missing"], "{r:#}");
    assert_eq!(out.status.code(), Some(1), "{r:#}");
    let f = finding(&r, "node_cache_notrack_missing");
    assert_eq!(f["subject"], NODE_CACHE_ADDR);
    let ev = evidence(f);
    assert!(
        ev.contains(&"missing: -t raw -A PREROUTING -d 169.254.20.10 -p udp --dport 53 -j NOTRACK"),
        "{f:#}"
    );
    assert!(
        ev.contains(&"missing: -t raw -A OUTPUT -s 169.254.20.10 -p udp --sport 53 -j NOTRACK"),
        "{f:#}"
    );
    assert_eq!(
        ev.iter().filter(|e| e.starts_with("present: ")).count(),
        2,
        "tcp's: {f:#}"
    );
    assert!(
        f["config"]["text"].as_str().unwrap().contains("setLocal"),
        "{f:#}"
    );
}

/// kubelet's config.yaml beneath the host root: `clusterDNS` the ClusterIP kube-proxy serves
/// and a `resolvConf` with a real upstream is no finding; `clusterDNS` nobody serves and a
/// `resolvConf` naming 127.0.0.53 are both found, the first critical.
#[test]
fn kubelets_cluster_dns_and_resolv_conf_are_checked() {
    let Some(lab) = lab() else { return };
    let root = host_root(&lab);
    fs::create_dir_all(root.join("var/lib/kubelet")).unwrap();
    fs::create_dir_all(root.join("etc/kubelet")).unwrap();
    fs::write(
        root.join("etc/kubelet/upstream.conf"),
        "nameserver 192.0.2.53\n",
    )
    .unwrap();
    fs::write(
        root.join("etc/kubelet/stub.conf"),
        "nameserver 127.0.0.53\noptions edns0 trust-ad\n",
    )
    .unwrap();
    let config = |dns: &str, resolv: &str| {
        let text = format!(
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\ncgroupDriver: systemd\nclusterDNS:\n- {dns}\nclusterDomain: cluster.local\nresolvConf: {resolv}\n"
        );
        fs::write(root.join("var/lib/kubelet/config.yaml"), text).unwrap();
    };
    config(&lab.cluster_ip().to_string(), "/etc/kubelet/upstream.conf");
    let out = doctor_at(&lab, &root, 2).wait();
    let r = report(&out);
    assert!(kinds(&r).is_empty(), "{r:#}");
    let k = &r["checked"]["kubelet"];
    assert_eq!(k["cluster_dns"], serde_json::json!(["10.96.0.10"]), "{k:#}");
    assert_eq!(
        k["resolv_conf_nameservers"],
        serde_json::json!(["192.0.2.53"]),
        "{k:#}"
    );

    config("10.96.0.77", "/etc/kubelet/stub.conf");
    let out = doctor_at(&lab, &root, 2).wait();
    let r = report(&out);
    assert_eq!(
        kinds(&r),
        ["kubelet_cluster_dns", "kubelet_resolv_conf_loopback"],
        "{r:#}"
    );
    assert_eq!(out.status.code(), Some(2), "{r:#}");
    let f = finding(&r, "kubelet_cluster_dns");
    assert!(f["seen"].as_str().unwrap().contains("10.96.0.77"), "{f:#}");
    let f = finding(&r, "kubelet_resolv_conf_loopback");
    assert!(
        f["evidence"][1].as_str().unwrap().contains("127.0.0.53"),
        "{f:#}"
    );
    assert!(
        f["fix"]
            .as_str()
            .unwrap()
            .contains("resolvConf: /run/systemd/resolve/resolv.conf"),
        "{f:#}"
    );

    // Not YAML kubelet would take: said, not a panic, and nothing else judged.
    fs::write(
        root.join("var/lib/kubelet/config.yaml"),
        "clusterDNS: [\u{1b}[31m\n",
    )
    .unwrap();
    let out = doctor_at(&lab, &root, 1).wait();
    let r = report(&out);
    assert_eq!(kinds(&r), ["config_unreadable"], "{r:#}");
    assert_eq!(out.status.code(), Some(0), "{r:#}");
    assert!(r["checked"]["kubelet"].is_null(), "{r:#}");
}

/// From a debug container whose image carries dnspath alone (here: a `PATH` without
/// `iptables-save` or `nft`), doctor runs the host's own programs chrooted into the host root:
/// the DNS Service is still read from kube-proxy's rules. Under a host root without them, it
/// is not: the programs really came from the root.
#[test]
fn kube_proxy_rules_are_read_with_the_hosts_own_programs() {
    let Some(lab) = lab() else { return };
    let node = lab.node_ns().to_owned();
    let run = |root: Option<&Path>| {
        let r = root.map(|p| p.to_string_lossy().into_owned());
        let mut args = vec!["doctor", "-o", "json", "--duration", "1s"];
        if let Some(r) = &r {
            args.extend(["--host-root", r.as_str()]);
        }
        let t = Tracer::start_under(
            &lab,
            &node,
            &["env", "PATH=/nonexistent"],
            &args,
            true,
            Duration::from_secs(30),
        )
        .unwrap();
        report(&t.wait())
    };
    let r = run(None);
    assert_eq!(r["checked"]["services"], 1, "{r:#}");
    assert_eq!(
        r["checked"]["kube_proxy_mode"],
        serde_json::json!(["iptables"]),
        "{r:#}"
    );
    let r = run(Some(&host_root(&lab)));
    assert_eq!(r["checked"]["services"], 0, "{r:#}");
}

/// ndots:5 clients (the client pod's resolv.conf as kubelet writes it) asking an external
/// name with glibc: each lookup goes through the three search domains' NXDOMAINs before its
/// answer, an `ndots_amplification` finding (info, exit 0) with the queries it cost and what
/// a trailing dot and `ndots:2` would save. The same lookups with a trailing dot: no finding.
#[test]
fn ndots_5_clients_asking_external_names_are_an_ndots_amplification() {
    let Some(lab) = lab() else { return };
    let lookups = |name: &str| {
        let script =
            format!("for i in $(seq 12); do getent ahostsv4 {name} >/dev/null || echo FAIL; done");
        let o = lab.exec(lab.client_ns(), &["sh", "-c", &script]);
        assert!(o.status.success() && o.stdout.is_empty(), "{o:?}");
    };
    let t = doctor(&lab, 4);
    lookups("www.lab.test");
    let out = t.wait();
    let r = report(&out);
    assert_eq!(kinds(&r), ["ndots_amplification"], "{r:#}");
    assert_eq!(r["worst"], "info");
    assert_eq!(out.status.code(), Some(0), "info is no failure: {r:#}");
    let f = finding(&r, "ndots_amplification");
    assert_eq!(f["count"], 12, "{f:#}");
    assert_eq!(f["subject"], lab.client_ns(), "{f:#}");
    // ahostsv4: A only, for each of the three search domains and then the name itself.
    let ev = evidence(f);
    assert!(
        ev.contains(&"NXDOMAIN: www.lab.test.default.svc.cluster.local."),
        "{f:#}"
    );
    assert!(
        ev.contains(&"48 queries for these 12 lookups (4.0 per lookup), 36 of them NXDOMAIN"),
        "{f:#}"
    );
    // www.lab.test has two dots: asked first under ndots:2 as with a trailing dot.
    assert!(
        ev.contains(&"a trailing dot on the names asked would save 36 of the 48 queries (75%); `ndots:2` would save 36 (75%)"),
        "{f:#}"
    );
    assert!(f["fix"].as_str().unwrap().contains("ndots"), "{f:#}");

    let t = doctor(&lab, 3);
    lookups("www.lab.test.");
    let out = t.wait();
    let r = report(&out);
    assert_eq!(kinds(&r), Vec::<&str>::new(), "{r:#}");
    assert!(
        r["checked"]["transactions"].as_u64().unwrap() >= 12,
        "{r:#}"
    );
}

/// A pod of its own where a real named serves a zone whose file does not load: SERVFAIL.
const SERVFAIL_SERVER: &str = "10.250.0.57";

/// Both "CoreDNS" pods forwarding to an upstream that never answers (a socket nobody reads):
/// one `unanswered_queries` warning, the upstream's — the cause, named first — with the
/// Service address the client asked folded under it as its symptom (the joined legs prove
/// it), not two warnings of equal rank. Then forwarding to a real named whose zone failed to
/// load: one `servfail` warning, named's, with the Service's SERVFAILs folded under it, and
/// nothing unanswered.
#[test]
fn an_upstream_that_never_answers_or_servfails_is_named() {
    let Some(mut lab) = lab() else { return };
    let svc = format!("{}:53", lab.cluster_ip());
    let ask = |lab: &Lab, zone: &str| {
        for i in 0..5 {
            let _ = lab.dig(&["+time=1", "+tries=1", &format!("q{i}.{zone}."), "A"]);
        }
    };
    let forward_all = |lab: &mut Lab, to: &str| {
        let to: std::net::SocketAddr = format!("{to}:53").parse().unwrap();
        for i in 0..2 {
            lab.reconfigure_dns_pod(
                i,
                DnsPodConfig::new(DnsServerKind::Dnsdist).forwarding_to(to),
            )
            .unwrap();
        }
    };
    let subjects = |r: &Value, kind: &str| -> Vec<String> {
        let mut s: Vec<String> = r["findings"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|f| f["kind"] == kind)
            .map(|f| f["subject"].as_str().unwrap().to_owned())
            .collect();
        s.sort();
        s
    };

    let hole = Hole::new(&lab).unwrap();
    let hole_at = format!("{}:53", lab::hole::HOLE_ADDR);
    forward_all(&mut lab, lab::hole::HOLE_ADDR);
    // Queries still unanswered when the watch ends are pending, not unanswered: a timeout of
    // 1 s decides them within it.
    let t = Tracer::start(
        &lab,
        lab.node_ns(),
        &["doctor", "-o", "json", "--duration", "8s", "--timeout", "1"],
    )
    .unwrap();
    ask(&lab, "void.lab.test");
    let out = t.wait();
    drop(hole);
    let r = report(&out);
    assert_eq!(out.status.code(), Some(1), "warning: {r:#}");
    assert_eq!(
        subjects(&r, "unanswered_queries"),
        std::slice::from_ref(&hole_at),
        "one cause, one finding: {r:#}"
    );
    assert_eq!(subjects(&r, "servfail"), Vec::<String>::new(), "{r:#}");
    let f = finding(&r, "unanswered_queries");
    assert_eq!(f["count"], 5, "{f:#}");
    assert_eq!(
        f["seen"],
        format!(
            "{hole_at} left 5 of 5 queries unanswered (100%), and so {svc} left 5 of its 5 queries unanswered"
        ),
        "{f:#}"
    );
    let ev = evidence(f);
    assert!(
        ev.contains(&&*format!(
            "symptom: {svc} left 5 of its 5 queries unanswered: each forwarded on to {hole_at}, where it went unanswered (joined legs)"
        )),
        "{f:#}"
    );
    assert!(ev.contains(&"unanswered: q0.void.lab.test."), "{f:#}");

    // A real named whose only zone's file is missing: it starts, and answers SERVFAIL.
    let dir = lab.temp_dir().join("servfail");
    fs::create_dir_all(&dir).unwrap();
    let d = dir.display();
    let conf = dir.join("named.conf");
    fs::write(
        &conf,
        format!(
            r#"options {{
    directory "{d}";
    pid-file none;
    session-keyfile "{d}/session.key";
    managed-keys-directory "{d}";
    listen-on {{ {SERVFAIL_SERVER}; }};
    listen-on-v6 {{ none; }};
    recursion no;
    allow-query {{ any; }};
    dnssec-validation no;
    notify no;
}};
controls {{ }};
zone "broken.test" {{ type primary; file "{d}/broken.test.zone"; }};
"#
        ),
    )
    .unwrap();
    let conf = conf.to_string_lossy().into_owned();
    let named = ["/usr/sbin/named", "-f", "-u", "root", "-c", &conf];
    let server = Hole::serving(&lab, "servfail", SERVFAIL_SERVER, &named).unwrap();
    let at = format!("@{SERVFAIL_SERVER}");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let o = lab.exec(
            server.ns(),
            &["dig", "+time=1", "+tries=1", &at, "broken.test.", "SOA"],
        );
        if String::from_utf8_lossy(&o.stdout).contains("status: SERVFAIL") {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "named never answered: {o:?}"
        );
        thread::sleep(Duration::from_millis(200));
    }
    forward_all(&mut lab, SERVFAIL_SERVER);
    let t = doctor(&lab, 4);
    ask(&lab, "broken.test");
    let out = t.wait();
    drop(server);
    let r = report(&out);
    assert_eq!(out.status.code(), Some(1), "warning: {r:#}");
    assert_eq!(
        subjects(&r, "servfail"),
        [format!("{SERVFAIL_SERVER}:53")],
        "{r:#}"
    );
    assert_eq!(
        subjects(&r, "unanswered_queries"),
        Vec::<String>::new(),
        "{r:#}"
    );
    let f = finding(&r, "servfail");
    assert_eq!(f["count"], 5, "{f:#}");
    assert!(
        f["evidence"]
            .to_string()
            .contains("SERVFAIL: q0.broken.test."),
        "{f:#}"
    );
    assert!(f["fix"].as_str().unwrap().contains("upstream"), "{f:#}");
    assert!(
        f["seen"].as_str().unwrap().ends_with(&format!(
            ", and so {svc} answered SERVFAIL to 5 of its 5 queries"
        )),
        "{f:#}"
    );
}

/// A forwarder of its own (dnsdist, in a pod namespace of its own).
const FORWARDER: &str = "10.250.0.58";

/// A forwarder in front of two upstreams: the lab's, healthy, and one that never answers
/// (a pool for `void.lab.test`). It drops the healthy upstream's answers for
/// `fail.lab.test` itself (`DropResponseAction`): those are its own failures, its upstream
/// answered every one. Two causes, two findings: the silent upstream, with the forwarder's
/// `void` queries folded under it; and the forwarder, for its `fail` queries alone — not
/// folded under the upstream's.
#[test]
fn a_forwarder_failing_on_its_own_is_not_folded_under_its_upstream() {
    let Some(lab) = lab() else { return };
    let hole = Hole::new(&lab).unwrap();
    let hole_at = format!("{}:53", lab::hole::HOLE_ADDR);
    let fwd_at = format!("{FORWARDER}:53");
    let dir = lab.temp_dir().join("own-forwarder");
    fs::create_dir_all(&dir).unwrap();
    let conf = dir.join("dnsdist.conf");
    fs::write(
        &conf,
        format!(
            "setLocal('{fwd_at}')\n\
setACL({{'0.0.0.0/0', '::/0'}})\n\
setSecurityPollSuffix('')\n\
newServer({{address='{up}:53'}}):setUp()\n\
newServer({{address='{hole_at}', pool='silent'}}):setUp()\n\
addAction(makeRule('void.lab.test.'), PoolAction('silent'))\n\
addResponseAction(makeRule('fail.lab.test.'), DropResponseAction())\n",
            up = addr::UPSTREAM
        ),
    )
    .unwrap();
    let conf = conf.to_string_lossy().into_owned();
    let dnsdist = ["dnsdist", "--supervised", "--disable-syslog", "-C", &conf];
    let server = Hole::serving(&lab, "fwd", FORWARDER, &dnsdist).unwrap();
    let at = format!("@{FORWARDER}");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !lab
        .dig(&["+time=1", "+tries=1", &at, "www.lab.test.", "A"])
        .status
        .success()
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the forwarder never answered"
        );
        thread::sleep(Duration::from_millis(200));
    }
    let t = Tracer::start(
        &lab,
        lab.node_ns(),
        &[
            "doctor",
            "-o",
            "json",
            "--duration",
            "16s",
            "--timeout",
            "1",
        ],
    )
    .unwrap();
    // Through the healthy upstream, answered.
    let ok = lab.dig(&["+time=1", "+tries=1", &at, "www.lab.test.", "A"]);
    assert!(
        String::from_utf8_lossy(&ok.stdout).contains("10.250.0.80"),
        "{ok:?}"
    );
    for zone in ["void", "fail"] {
        for i in 0..5 {
            let name = format!("q{i}.{zone}.lab.test.");
            let _ = lab.dig(&["+time=1", "+tries=1", &at, &name, "A"]);
        }
    }
    let out = t.wait();
    drop(server);
    drop(hole);
    let r = report(&out);
    let unanswered: Vec<&Value> = r["findings"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["kind"] == "unanswered_queries")
        .collect();
    let of = |subject: &str| {
        *unanswered
            .iter()
            .find(|f| f["subject"] == subject)
            .unwrap_or_else(|| panic!("no unanswered_queries of {subject}: {r:#}"))
    };
    assert_eq!(unanswered.len(), 2, "{r:#}");
    // The silent upstream: the cause of the forwarder's `void` failures.
    let up = of(&hole_at);
    assert_eq!(up["count"], 5, "{up:#}");
    let seen = up["seen"].as_str().unwrap();
    assert!(
        seen.starts_with(&format!(
            "{hole_at} left 5 of 5 queries unanswered (100%), and so {fwd_at} left 5 of its "
        )),
        "{up:#}"
    );
    // The forwarder: its own five, the `fail` names only, no symptom of anything.
    let fwd = of(&fwd_at);
    assert_eq!(fwd["count"], 5, "{fwd:#}");
    assert!(
        fwd["seen"]
            .as_str()
            .unwrap()
            .starts_with(&format!("{fwd_at} left 5 of ")),
        "{fwd:#}"
    );
    let ev = evidence(fwd);
    assert!(ev.contains(&"unanswered: q0.fail.lab.test."), "{fwd:#}");
    assert!(
        !ev.iter()
            .any(|e| e.contains("void") || e.starts_with("symptom")),
        "{fwd:#}"
    );
    // The healthy upstream failed nothing.
    assert!(
        !r["findings"]
            .to_string()
            .contains(&format!("{}:53 left", addr::UPSTREAM)),
        "{r:#}"
    );
}

/// An upstream that never answers, over UDP or TCP: a UDP socket nobody reads and a TCP
/// listener that takes every connection and reads nothing.
const SILENT_UDP_AND_TCP: &str = r#"
import socket, sys, time
addr = sys.argv[1]
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
u.bind((addr, 53))
t = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
t.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
t.bind((addr, 53))
t.listen(64)
t.settimeout(1.0)
held = []
end = time.time() + 60
while time.time() < end:
    try:
        c, _ = t.accept()
        held.append(c)
    except socket.timeout:
        pass
"#;

/// NodeLocal DNSCache → cluster DNS (its misses over TCP to kube-dns-upstream, whose pods
/// forward over TCP too) → an upstream that never answers: the cache and the CoreDNS pod
/// fail every lookup because the upstream does. One finding, the upstream's, with both
/// servers in front of it folded under it.
#[test]
fn a_dead_upstream_behind_node_cache_and_cluster_dns_is_one_finding() {
    let Some(mut lab) = lab() else { return };
    let _cache = NodeCache::start(&lab).unwrap();
    let silent = ["python3", "-c", SILENT_UDP_AND_TCP, lab::hole::HOLE_ADDR];
    let hole = Hole::serving(&lab, "hole", lab::hole::HOLE_ADDR, &silent).unwrap();
    let hole_at = format!("{}:53", lab::hole::HOLE_ADDR);
    let to: std::net::SocketAddr = hole_at.parse().unwrap();
    for i in 0..2 {
        lab.reconfigure_dns_pod(
            i,
            DnsPodConfig::new(DnsServerKind::Dnsdist).forwarding_to(to),
        )
        .unwrap();
    }
    let t = Tracer::start(
        &lab,
        lab.node_ns(),
        &[
            "doctor",
            "-o",
            "json",
            "--duration",
            "10s",
            "--timeout",
            "1",
        ],
    )
    .unwrap();
    for i in 0..5 {
        let _ = lab.dig(&["+time=1", "+tries=1", &format!("q{i}.void.lab.test."), "A"]);
    }
    let out = t.wait();
    drop(hole);
    let r = report(&out);
    let subjects: Vec<&str> = r["findings"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["kind"] == "unanswered_queries" || f["kind"] == "servfail")
        .map(|f| f["subject"].as_str().unwrap())
        .collect();
    assert_eq!(
        subjects,
        [hole_at.as_str()],
        "one cause, one finding: {r:#}"
    );
    let f = finding(&r, "unanswered_queries");
    let seen = f["seen"].as_str().unwrap();
    // The cache as the clients asked it (on the ClusterIP), and the CoreDNS pod its misses
    // reach (kube-dns-upstream's DNAT happens in the node's own OUTPUT, before any hop).
    let cache = format!("{}:53", lab.cluster_ip());
    let coredns = format!("{}:53", lab.ip_of(Pod::Dns(0)));
    assert!(
        seen.starts_with(&format!("{hole_at} left ")) && seen.contains(", and so "),
        "{f:#}"
    );
    for front in [&cache, &coredns] {
        assert!(seen.contains(&format!("{front} left ")), "{front}: {f:#}");
        assert!(
            evidence(f)
                .iter()
                .any(|e| e.starts_with(&format!("symptom: {front} left "))),
            "{front}: {f:#}"
        );
    }
}
