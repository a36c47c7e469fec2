use super::error::verifier_reason;
use super::*;

/// The line a person needs is the verifier's last complaint, not its statistics.
#[test]
fn verifier_reason_is_the_last_complaint() {
    let log = "func#0 @0\n0: R1=ctx() R10=fp0\n; let cap = ...\n\
               412: (85) call bpf_skb_load_bytes#26\n\
               R4 min value is negative, either use unsigned or 'var &= const'\n\
               processed 388 insns (limit 1000000) max_states_per_insn 1 total_states 30 peak_states 30 mark_read 12\n\
               -- END PROG LOAD LOG --\n";
    assert_eq!(
        verifier_reason(log),
        "R4 min value is negative, either use unsigned or 'var &= const'"
    );
    assert_eq!(verifier_reason(""), "(empty verifier log)");
    let e = KernelError::Rejected {
        program: "dnspath_tc_eth_ingress",
        release: "6.1.0-57-amd64".into(),
        last: verifier_reason(log),
        log: Some(PathBuf::from(
            "/tmp/dnspath-verifier-dnspath_tc_eth_ingress.log",
        )),
    };
    let line = e.to_string();
    assert!(!line.contains('\n'), "{line}");
    assert_eq!(
        line,
        "Linux 6.1.0-57-amd64 rejected eBPF program dnspath_tc_eth_ingress: R4 min value is \
         negative, either use unsigned or 'var &= const' (full verifier log: \
         /tmp/dnspath-verifier-dnspath_tc_eth_ingress.log)"
    );
    // A rejection is never mistaken for missing root.
    assert!(!is_eperm(&e));
}

/// Loads every program through the verifier and reads the counters back.
#[test]
fn programs_pass_the_verifier() {
    if !crate::test_support::root_or_skip("loading eBPF programs") {
        return;
    }
    let probes = Probes::load(&ProbeOptions {
        ports: vec![53],
        snaplen: tracer_common::MAX_SNAPLEN,
        drops: true,
        kernel_log: false,
    })
    .unwrap();
    assert!(probes.drops_enabled);
    let c = probes.counters().unwrap();
    assert_eq!(c.len(), counter::COUNT as usize);
}

/// A free UDP port on loopback, IPv4 and IPv6 alike (nothing listens on it once this returns).
fn closed_udp_port() -> u16 {
    loop {
        let v4 = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let port = v4.local_addr().unwrap().port();
        if std::net::UdpSocket::bind(("::1", port)).is_ok() {
            return port;
        }
    }
}

/// The drops the ring buffer holds within a second whose UDP destination port is `port`.
fn drops_to(ring: &mut RingBuf<MapData>, port: u16, want: usize) -> Vec<crate::event::KernelDrop> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(1);
    let mut out = Vec::new();
    while out.len() < want && std::time::Instant::now() < deadline {
        while let Some(r) = ring.next() {
            if let crate::event::SourceEvent::Drop(d) = crate::source::live::parse_record(&r) {
                let l4 = match d.data.first().map(|b| b >> 4) {
                    Some(4) => usize::from(d.data[0] & 0x0f) * 4,
                    Some(6) => 40,
                    _ => continue,
                };
                if d.data.get(l4 + 2..l4 + 4) == Some(&port.to_be_bytes()[..]) {
                    out.push(d);
                }
            }
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    out
}

/// Datagrams to a closed watched port on loopback are freed (`NO_SOCKET`) and reported, over
/// IPv4 and IPv6, whether the kfree_skb program takes `network_header`, `tail` and `head`
/// from one copy of their window of `sk_buff` or reads them one by one (kernels where they
/// do not fit one); a datagram to a port not watched is not.
#[test]
fn drops_are_reported_with_and_without_the_skb_window() {
    if !crate::test_support::root_or_skip("loading eBPF programs") {
        return;
    }
    for window in [true, false] {
        let port = closed_udp_port();
        let other = closed_udp_port();
        let mut probes = Probes::load_adjusted(
            &ProbeOptions {
                ports: vec![port],
                snaplen: 512,
                drops: true,
                kernel_log: false,
            },
            |o| {
                assert_eq!(o.has_skb_window, 1, "this kernel has the window: {o:?}");
                if !window {
                    o.has_skb_window = 0;
                }
            },
        )
        .unwrap();
        assert!(probes.drops_enabled);
        let said = probes
            .setup
            .degraded
            .iter()
            .any(|d| d.contains("one by one"));
        assert_eq!(said, !window, "{:?}", probes.setup.degraded);
        let mut ring = probes.take_events().unwrap();
        let before = probes.counters().unwrap();
        let v4 = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let v6 = std::net::UdpSocket::bind("[::1]:0").unwrap();
        let payload = [0u8; 300];
        v4.send_to(&payload, ("127.0.0.1", other)).unwrap();
        v4.send_to(&payload, ("127.0.0.1", port)).unwrap();
        v6.send_to(&payload, ("::1", other)).unwrap();
        v6.send_to(&payload, ("::1", port)).unwrap();
        let mut drops = drops_to(&mut ring, port, 2);
        drops.sort_by_key(|d| d.data[0]);
        let versions: Vec<u8> = drops.iter().map(|d| d.data[0] >> 4).collect();
        assert_eq!(versions, [4, 6], "window {window}: {drops:?}");
        assert_eq!(drops[0].orig_len, 20 + 8 + 300);
        assert_eq!(drops[1].orig_len, 40 + 8 + 300);
        for d in &drops {
            assert_eq!(
                d.data.len(),
                d.orig_len as usize,
                "linear, under MAX_DROP_DATA"
            );
            if probes.setup.drop_reason {
                assert_eq!(
                    probes.drop_reasons.get(&d.reason).map(String::as_str),
                    Some("NO_SOCKET")
                );
            }
        }
        assert!(drops_to(&mut ring, other, 1).is_empty());
        let after = probes.counters().unwrap();
        let i = counter::DROPS_READ_FAILED as usize;
        assert_eq!(after[i], before[i], "drops_read_failed");
    }
}

/// The sections of a little-endian ELF64 object, by name: (file offset, size).
fn elf_sections(d: &[u8]) -> Vec<(String, usize, usize)> {
    let u16_at = |o: usize| usize::from(u16::from_le_bytes([d[o], d[o + 1]]));
    let u32_at = |o: usize| u32::from_le_bytes(d[o..o + 4].try_into().unwrap()) as usize;
    let u64_at = |o: usize| u64::from_le_bytes(d[o..o + 8].try_into().unwrap()) as usize;
    let (shoff, shentsize, shnum, shstrndx) =
        (u64_at(0x28), u16_at(0x3a), u16_at(0x3c), u16_at(0x3e));
    let header = |i: usize| shoff + i * shentsize;
    let strtab = u64_at(header(shstrndx) + 0x18);
    (0..shnum)
        .map(|i| {
            let h = header(i);
            let name_at = strtab + u32_at(h);
            let end = name_at + d[name_at..].iter().position(|&b| b == 0).unwrap();
            let name = String::from_utf8_lossy(&d[name_at..end]).into_owned();
            (name, u64_at(h + 0x18), u64_at(h + 0x20))
        })
        .collect()
}

/// The loader is given no kernel BTF (`Probes::loader`), which is right only while the
/// object asks for no CO-RE relocations: `.BTF.ext`'s header (32 bytes and more) says
/// where they are and how many bytes they take.
#[test]
fn object_has_no_core_relocations() {
    let d = crate::ebpf::OBJECT;
    let (_, off, size) = elf_sections(d)
        .into_iter()
        .find(|(n, _, _)| n == ".BTF.ext")
        .expect("the object has .BTF.ext (func and line info)");
    assert!(size >= 8);
    let hdr_len = u32::from_le_bytes(d[off + 4..off + 8].try_into().unwrap());
    // func_info and line_info are there: the header was read right.
    let line_info_len = u32::from_le_bytes(d[off + 20..off + 24].try_into().unwrap());
    assert!(line_info_len > 0);
    if hdr_len >= 32 {
        let core_relo_len = u32::from_le_bytes(d[off + 28..off + 32].try_into().unwrap());
        assert_eq!(
            core_relo_len, 0,
            "CO-RE relocations: the loader needs the kernel's BTF"
        );
    }
}
