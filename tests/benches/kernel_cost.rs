//! What the TC programs cost per packet, measured by the kernel itself: each crafted frame
//! runs `repeat` times through `BPF_PROG_TEST_RUN`, which reports the mean time per run
//! without the two timestamps `kernel.bpf_stats_enabled` adds around every run of an
//! attached program. `cargo xtask bench` runs this (`--only kernel`); it prints one line per
//! frame and program, `name<TAB>program<TAB>ns/run`. Root only. Nothing is asserted.
use std::process::ExitCode;

use aya::maps::{MapData, RingBuf};
use dnspath::kernel::{ProbeOptions, Probes, TC_PROGRAMS};
use lab::frames::{dns_query, eth, ext_opts, gre, ipv4, ipv6, tcp, udp, vxlan};

/// Runs per measurement for frames that are not copied.
const REPEAT_OTHER: u32 = 1_000_000;
/// Runs per measurement for DNS frames: each leaves a record in the 16 MiB ring buffer,
/// drained between measurements (a full ring buffer would make the runs cheaper).
const REPEAT_DNS: u32 = 20_000;
/// Measurements per frame and program; the lowest is printed (the others met interrupts).
const ROUNDS: usize = 5;

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("kernel_cost: {e}");
            ExitCode::FAILURE
        }
    }
}

fn drain(ring: &mut RingBuf<MapData>) {
    while ring.next().is_some() {}
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let mut probes = Probes::load(&ProbeOptions {
        ports: vec![53],
        snaplen: 512,
        drops: false,
        kernel_log: false,
    })?;
    let mut ring = probes.take_events()?;
    let frames: Vec<(&str, bool, Vec<u8>)> = vec![
        (
            "dns-ipv4-udp",
            true,
            eth(&[], 0x0800, &ipv4(17, 0, 0, &udp(40000, 53, &dns_query(0)))),
        ),
        (
            "dns-ipv6-udp",
            true,
            eth(&[], 0x86dd, &ipv6(&[], 17, &udp(40000, 53, &dns_query(0)))),
        ),
        (
            "dns-ipv4-tcp",
            true,
            eth(
                &[],
                0x0800,
                &ipv4(6, 0, 0, &tcp(40000, 53, 3, &dns_query(0))),
            ),
        ),
        (
            "dns-vlan-ipv6-ext",
            true,
            eth(
                &[(0x8100, 7)],
                0x86dd,
                &ipv6(&[ext_opts(0)], 17, &udp(40000, 53, &dns_query(0))),
            ),
        ),
        (
            "dns-vxlan-ipv4-udp",
            true,
            eth(
                &[],
                0x0800,
                &ipv4(
                    17,
                    0,
                    0,
                    &udp(
                        51000,
                        8472,
                        &vxlan(
                            1,
                            &eth(&[], 0x0800, &ipv4(17, 0, 0, &udp(40000, 53, &dns_query(0)))),
                        ),
                    ),
                ),
            ),
        ),
        (
            "dns-gre-key-ipv4-udp",
            true,
            eth(
                &[],
                0x0800,
                &ipv4(
                    47,
                    0,
                    0,
                    &gre(
                        false,
                        Some(1),
                        None,
                        0x0800,
                        &ipv4(17, 0, 0, &udp(40000, 53, &dns_query(0))),
                    ),
                ),
            ),
        ),
        (
            "other-vxlan-ipv4-tcp",
            false,
            eth(
                &[],
                0x0800,
                &ipv4(
                    17,
                    0,
                    0,
                    &udp(
                        51000,
                        8472,
                        &vxlan(
                            1,
                            &eth(&[], 0x0800, &ipv4(6, 0, 0, &tcp(40000, 443, 3, &[0; 200]))),
                        ),
                    ),
                ),
            ),
        ),
        (
            "other-ipv4-tcp",
            false,
            eth(&[], 0x0800, &ipv4(6, 0, 0, &tcp(40000, 443, 3, &[0; 200]))),
        ),
        (
            "other-ipv4-udp",
            false,
            eth(&[], 0x0800, &ipv4(17, 0, 0, &udp(40000, 9, &[0; 64]))),
        ),
        (
            "other-ipv6-tcp",
            false,
            eth(&[], 0x86dd, &ipv6(&[], 6, &tcp(40000, 443, 3, &[0; 200]))),
        ),
        ("other-arp", false, eth(&[], 0x0806, &[0u8; 28])),
    ];
    for (name, dns, frame) in &frames {
        for (index, (prog, has_eth, _)) in TC_PROGRAMS.iter().enumerate() {
            if !has_eth {
                continue;
            }
            let repeat = if *dns { REPEAT_DNS } else { REPEAT_OTHER };
            let mut best = None::<std::time::Duration>;
            for _ in 0..ROUNDS {
                drain(&mut ring);
                let (_, d) = probes.test_run_tc_repeat(index, frame, repeat)?;
                best = Some(best.map_or(d, |b| b.min(d)));
            }
            drain(&mut ring);
            let ns = best.map_or(0, |d| d.as_nanos());
            println!("{name}\t{prog}\t{ns}");
        }
    }
    print_verified("verified-insns", &probes, "dnspath_tc");
    drop(ring);
    drop(probes);
    drop_cost()?;
    // With `-vv` the programs keep their log statements: the verifier's cost then.
    let probes = Probes::load(&ProbeOptions {
        ports: vec![53],
        snaplen: 512,
        drops: false,
        kernel_log: true,
    })?;
    print_verified("verified-insns-vv", &probes, "dnspath_tc");
    Ok(())
}

/// Verified instructions of the loaded programs whose name starts with `only`.
fn print_verified(what: &str, probes: &Probes, only: &str) {
    for (prog, insns) in probes.verified_insns() {
        if !prog.starts_with(only) {
            continue;
        }
        match insns {
            Some(n) => println!("{what}\t{prog}\t{n}"),
            None => println!("{what}\t{prog}\tunknown"),
        }
    }
}

/// Datagrams sent to a closed loopback port for the drop program's cost.
const DROPS: u32 = 200_000;

/// The kfree_skb program's cost on drops that are not DNS (a tracing program cannot be test
/// run): `DROPS` UDP datagrams to 127.0.0.1:9, where nothing listens, each freed by the kernel
/// as `NO_SOCKET`, with the kernel's BPF run-time statistics on for the measurement (other
/// drops of the machine in that time count too). `other-drop` sends 7 bytes of payload, so
/// the program copies the whole packet to decide; `other-drop-1k` sends 1,000, where it copies
/// its first-peek bytes (`packet::PEEK`).
fn drop_cost() -> Result<(), Box<dyn std::error::Error>> {
    let probes = Probes::load(&ProbeOptions {
        ports: vec![53],
        snaplen: 512,
        drops: true,
        kernel_log: false,
    })?;
    if !probes.drops_enabled {
        println!(
            "other-drop\tdnspath_kfree_skb\tunavailable: {:?}",
            probes.setup.degraded
        );
        return Ok(());
    }
    print_verified("verified-insns", &probes, "dnspath_kfree_skb");
    let sock = std::net::UdpSocket::bind("127.0.0.1:0")?;
    let large = [0u8; 1000];
    for (what, payload) in [
        ("other-drop", &b"not dns"[..]),
        ("other-drop-1k", &large[..]),
    ] {
        let stats_on = aya::sys::enable_stats(aya::sys::Stats::RunTime)?;
        let before = probes.run_stats();
        for _ in 0..DROPS {
            let _ = sock.send_to(payload, "127.0.0.1:9");
        }
        let after = probes.run_stats();
        drop(stats_on);
        for (name, t1, n1) in &after {
            if !name.starts_with("dnspath_kfree_skb") {
                continue;
            }
            if let Some((_, t0, n0)) = before.iter().find(|(n, _, _)| n == name) {
                let runs = n1.saturating_sub(*n0);
                if let Some(ns) = t1.saturating_sub(*t0).checked_div(runs) {
                    println!("{what}\t{name}\t{ns}\t({runs} runs)");
                }
            }
        }
    }
    Ok(())
}
