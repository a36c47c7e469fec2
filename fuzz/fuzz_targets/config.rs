//! The text parsers of `doctor` (tracer/src/doctor/), over any bytes: resolv.conf, the
//! Corefile's `forward` lines, dnsmasq's command line and conf files, dnsdist's and
//! unbound's forwarders, kubelet's CRI log lines (the restart reasons), `iptables-save`'s
//! nat, filter and raw tables (NodeLocal DNSCache's NOTRACK rules), kube-proxy's nftables
//! table as `nft -j` lists it, /proc/net/ip_vs and /proc/net/udp, kubelet's config.yaml,
//! /proc/cgroups and cgroup paths and `key value` files. Every one
//! gives a value or an error for any input, never a panic, and a quoted configuration line
//! is at most 400 characters however long the file's line.
//!
//! The first byte picks the parser; the rest is the file (UTF-8, lossily).
#![no_main]
use dnspath::doctor::{
    cgroups, config, iptables, kube_proxy, kubelet, node_local, restarts, services,
};
use libfuzzer_sys::fuzz_target;

fn short(f: &config::Forward) {
    assert!(f.at.text.chars().count() <= 400, "{:?}", f.at);
}

fuzz_target!(|data: &[u8]| {
    let Some((&which, rest)) = data.split_first() else {
        return;
    };
    let text = String::from_utf8_lossy(rest);
    match which % 15 {
        0 => {
            let r = config::parse_resolv_conf(&text);
            assert!(r.ndots.is_none_or(|n| n <= 15));
        }
        1 => {
            if let Ok(fs) = config::corefile_forwards("Corefile", &text) {
                fs.iter().for_each(short);
            }
        }
        2 => {
            let args: Vec<String> = text.split(['\0', '\n']).map(str::to_owned).collect();
            if let Ok(c) = config::dnsmasq_args(&args) {
                c.targets("argv").iter().for_each(short);
            }
        }
        3 => {
            let mut c = config::DnsmasqConf::default();
            if config::dnsmasq_conf("dnsmasq.conf", &text, &mut c).is_ok() {
                c.targets("dnsmasq.conf").iter().for_each(short);
            }
        }
        4 => {
            if let Ok(fs) = config::dnsdist_forwards("dnsdist.conf", &text) {
                fs.iter().for_each(short);
            }
        }
        5 => {
            if let Ok(fs) = config::unbound_forwards("unbound.conf", &text) {
                fs.iter().for_each(short);
            }
        }
        6 => {
            for line in text.lines() {
                let (msg, _) = restarts::cri_message(line);
                let _ = restarts::classify(msg);
            }
            let _ = restarts::scan(&text);
        }
        7 => {
            let _ = iptables::parse_iptables_nat(&text);
        }
        8 => {
            let _ = services::parse_filter(&text);
        }
        11 => {
            let _ = kube_proxy::parse_nft_json(&text);
        }
        12 => {
            let _ = kube_proxy::parse_ip_vs(&text);
            let _ = node_local::link_local_listeners(&text);
        }
        13 => {
            let (found, _) = node_local::notrack(&text, [169, 254, 20, 10].into());
            assert!(found.iter().all(|r| r.chars().count() <= 400));
        }
        14 => {
            let _ = kubelet::parse(&text);
        }
        9 => {
            let _ = cgroups::parse_proc_cgroups(&text);
            for line in text.lines() {
                let _ = cgroups::levels(line);
            }
        }
        _ => {
            let _ = cgroups::kv(&text, "oom_kill");
            let _ = config::parse_addr(&text, 53);
            let args: Vec<String> = text.split_whitespace().map(str::to_owned).collect();
            let _ = config::arg_value(&args, &["--conf", "-c"]);
        }
    }
});
