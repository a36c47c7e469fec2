#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "integration tests fail at the line that broke"
)]
//! `dnspath doctor` on the lab: a healthy lab under load gives no finding and exit 0; each
//! injected fault is found, ranked first, with its evidence, and sets the exit status
//! (docs/doctor.md). Root only; `--test-threads=1`.
use std::{thread, time::Duration};

use lab::{
    hole::{Hole, SLOW_ADDR},
    tracer::{Tracer, TracerOutput},
    DnsPodConfig, DnsServerKind, Lab,
};
use serde_json::Value;

use crate::shared::lab;

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
    let t = doctor(&lab, 8);
    // Many clients, one name, retries allowed.
    let workers: Vec<_> = (0..8)
        .map(|_| {
            let mut c = lab.command_in(
                lab.client_ns(),
                &[
                    "sh",
                    "-c",
                    "for i in $(seq 25); do dig +time=2 +tries=3 www.lab.test. A >/dev/null; done",
                ],
            );
            lab.spawn(&mut c).unwrap()
        })
        .collect();
    for mut w in workers {
        w.wait().unwrap();
    }
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
