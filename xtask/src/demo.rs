//! `cargo xtask demo`: a node-like lab with real DNS servers, and dnspath following queries
//! through every hop of it.
use anyhow::anyhow;
use std::{path::Path, thread, time::Duration};

use lab::{tracer::Tracer, DnsPodConfig, DnsServerKind, Lab, LabConfig, Pod};

fn step(title: &str) {
    eprintln!("\n\x1b[1m== {title}\x1b[0m");
    thread::sleep(Duration::from_millis(200));
}

pub fn run(bin: &Path) -> crate::Result<()> {
    // SAFETY: setting a variable before any thread is started.
    unsafe { std::env::set_var("DNSPATH_BIN", bin) };
    let mut lab = Lab::start(LabConfig::default()).map_err(|e| anyhow!("lab: {e}"))?;
    eprintln!(
        "lab {}: client {} ({}), CoreDNS-like dnsdist pods {} and {} behind ClusterIP {}, \
         upstream bind9 {} ({}), kube-proxy iptables DNAT in {}",
        lab.prefix(),
        lab.ip_of(Pod::Client),
        lab.client_ns(),
        lab.ip_of(Pod::Dns(0)),
        lab.ip_of(Pod::Dns(1)),
        lab.cluster_ip(),
        lab.ip_of(Pod::Upstream),
        lab.upstream_ns(),
        lab.node_ns(),
    );
    // Every pod namespace too, so each packet shows on both ends of its veth.
    // Full TCP payloads, so the ~3 KB answer below reassembles.
    let mut args = vec!["trace", "--snaplen", "4096"];
    for ns in lab.namespaces().into_iter().skip(1) {
        args.extend(["--netns", ns]);
    }
    let tracer = Tracer::start_with(&lab, lab.node_ns(), &args, false)
        .map_err(|e| anyhow!("dnspath: {e}"))?;

    step(
        "dig www.lab.test A via the ClusterIP (UDP): client → DNAT → CoreDNS pod → upstream → back",
    );
    let _ = lab.dig(&["+time=2", "+tries=1", "+short", "www.lab.test."]);
    thread::sleep(Duration::from_millis(800));

    step("dig +tcp big.lab.test TXT (~3 KB answer, TCP reassembled)");
    let _ = lab.dig(&[
        "+tcp",
        "+time=2",
        "+tries=1",
        "+short",
        "big.lab.test.",
        "TXT",
    ]);
    thread::sleep(Duration::from_millis(800));

    step("dig AAAA www.lab.test straight to the upstream over IPv6");
    let up6 = format!("@{}", lab.ip6_of(Pod::Upstream));
    let _ = lab.dig(&[
        "+time=2",
        "+tries=1",
        "+short",
        &up6,
        "www.lab.test.",
        "AAAA",
    ]);
    thread::sleep(Duration::from_millis(800));

    step("iptables -j DROP for DNS to the pods: the kernel drop, with its reason and the ClusterIP from conntrack");
    let _ = lab.pod_dns_drop("-I");
    let _ = lab.dig(&["+time=1", "+tries=1", "+short", "dropped.lab.test."]);
    let _ = lab.pod_dns_drop("-D");
    thread::sleep(Duration::from_millis(800));

    step("both CoreDNS pods now forward to their own Service: a forwarding loop born at runtime");
    let to_service = DnsPodConfig::new(DnsServerKind::Dnsdist).forwarding_to_cluster_ip();
    let healthy = DnsPodConfig::new(DnsServerKind::Dnsdist);
    for i in 0..2 {
        lab.reconfigure_dns_pod(i, to_service.clone())
            .map_err(|e| anyhow!("lab: {e}"))?;
    }
    let _ = lab.dig(&["+time=1", "+tries=1", "+short", "loop.lab.test."]);
    thread::sleep(Duration::from_secs(2));
    step("pods fixed again: the loop ends");
    for i in 0..2 {
        lab.reconfigure_dns_pod(i, healthy.clone())
            .map_err(|e| anyhow!("lab: {e}"))?;
    }
    thread::sleep(Duration::from_secs(3));

    step("stopping dnspath (Ctrl-C); its totals:");
    let out = tracer.stop();
    if !out.status.success() {
        return Err(anyhow!(
            "dnspath exited with {}:\n{}",
            out.status,
            out.stderr
        ));
    }
    eprintln!("\nlab torn down; try it on a node: dnspath trace --all-netns");
    Ok(())
}
