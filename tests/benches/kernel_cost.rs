//! What the TC programs cost per packet, measured by the kernel itself: each crafted frame
//! runs `repeat` times through `BPF_PROG_TEST_RUN`, which reports the mean time per run
//! without the two timestamps `kernel.bpf_stats_enabled` adds around every run of an
//! attached program. `cargo xtask bench` runs this (`--only kernel`); it prints one line per
//! frame and program, `name<TAB>program<TAB>ns/run`. Root only. Nothing is asserted.
use std::process::ExitCode;

use aya::maps::{MapData, RingBuf};
use dnspath::kernel::{ProbeOptions, Probes, TC_PROGRAMS};
use lab::frames::{dns_query, eth, ext_opts, ipv4, ipv6, tcp, udp};

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
    print_verified("verified-insns", &probes);
    drop(ring);
    drop(probes);
    // With `-vv` the programs keep their log statements: the verifier's cost then.
    let probes = Probes::load(&ProbeOptions {
        ports: vec![53],
        snaplen: 512,
        drops: false,
        kernel_log: true,
    })?;
    print_verified("verified-insns-vv", &probes);
    Ok(())
}

fn print_verified(what: &str, probes: &Probes) {
    for (prog, insns) in probes.verified_insns() {
        match insns {
            Some(n) => println!("{what}\t{prog}\t{n}"),
            None => println!("{what}\t{prog}\tunknown"),
        }
    }
}
