use std::collections::BTreeSet;

use super::error::verifier_reason;
use super::*;
use tracer_common::counter;

/// The line a person needs is the verifier's last complaint, not its statistics.
/// Held by every test that loads the programs: instances of one process share their pinned
/// maps (`/sys/fs/bpf/dnspath-PID`), so one test's reader would take another's records.
static LOADED: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn loaded() -> std::sync::MutexGuard<'static, ()> {
    LOADED
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

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
    let _loaded = loaded();
    let mut probes = Probes::load(&ProbeOptions {
        ports: vec![53],
        snaplen: tracer_common::MAX_SNAPLEN,
        drops: true,
        kernel_log: false,
    })
    .unwrap();
    assert!(probes.drops_enabled);
    let c = probes.maps().unwrap().counters().unwrap();
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

/// Sends `packet` (an IPv4 header and what follows) to 127.0.0.1 through a raw socket,
/// which takes the header as given (IPPROTO_RAW implies IP_HDRINCL); the kernel fills in
/// the checksum.
fn send_raw_ipv4(packet: &[u8]) {
    // SAFETY: plain socket calls on a descriptor this function owns.
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_RAW, libc::IPPROTO_RAW);
        assert!(fd >= 0, "raw socket: {}", std::io::Error::last_os_error());
        let to = libc::sockaddr_in {
            sin_family: libc::AF_INET as libc::sa_family_t,
            sin_port: 0,
            sin_addr: libc::in_addr {
                s_addr: u32::from_ne_bytes([127, 0, 0, 1]),
            },
            sin_zero: [0; 8],
        };
        let sent = libc::sendto(
            fd,
            packet.as_ptr().cast(),
            packet.len(),
            0,
            std::ptr::addr_of!(to).cast(),
            std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
        );
        let err = std::io::Error::last_os_error();
        libc::close(fd);
        assert_eq!(sent, packet.len() as isize, "raw sendto: {err}");
    }
}

/// 127.0.0.1 → 127.0.0.1, UDP from port 40000 to `dport`, with `option_words` words of NOP
/// options (RFC 791 §3.1, option type 1).
fn ipv4_udp_with_options(option_words: usize, dport: u16, payload: &[u8]) -> Vec<u8> {
    let ihl = 5 + option_words;
    let total = ihl * 4 + 8 + payload.len();
    let mut p = vec![0x40 | ihl as u8, 0];
    p.extend_from_slice(&(total as u16).to_be_bytes());
    p.extend_from_slice(&[0, 0, 0x40, 0, 64, libc::IPPROTO_UDP as u8, 0, 0]);
    p.extend_from_slice(&[127, 0, 0, 1, 127, 0, 0, 1]);
    p.extend(std::iter::repeat_n(1u8, option_words * 4));
    p.extend_from_slice(&40000u16.to_be_bytes());
    p.extend_from_slice(&dport.to_be_bytes());
    p.extend_from_slice(&((8 + payload.len()) as u16).to_be_bytes());
    // UDP checksum 0: none (RFC 768), accepted over IPv4.
    p.extend_from_slice(&[0, 0]);
    p.extend_from_slice(payload);
    p
}

/// Packets to a closed watched port on loopback are freed (`NO_SOCKET`) and reported — UDP
/// over IPv4 and IPv6, IPv4 with options, a TCP SYN — whether the kfree_skb program takes
/// `network_header`, `tail` and `head` from one copy of their window of `sk_buff` or reads
/// them one by one (kernels where they do not fit one); the same packets to a port not
/// watched are not.
#[test]
fn drops_are_reported_with_and_without_the_skb_window() {
    if !crate::test_support::root_or_skip("loading eBPF programs") {
        return;
    }
    let _loaded = loaded();
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
        let maps = probes.maps().unwrap();
        let before = maps.counters().unwrap();
        let v4 = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let v6 = std::net::UdpSocket::bind("[::1]:0").unwrap();
        let payload = [0u8; 300];
        for dport in [other, port] {
            v4.send_to(&payload, ("127.0.0.1", dport)).unwrap();
            v6.send_to(&payload, ("::1", dport)).unwrap();
            send_raw_ipv4(&ipv4_udp_with_options(3, dport, &payload));
            let refused = std::net::TcpStream::connect(("127.0.0.1", dport));
            assert!(refused.is_err(), "nothing listens on {dport}");
        }
        let drops = drops_to(&mut ring, port, 4);
        let kinds: BTreeSet<(u8, usize, u8)> = drops
            .iter()
            .map(|d| {
                let ihl = usize::from(d.data[0] & 0x0f) * 4;
                match d.data[0] >> 4 {
                    4 => (4, ihl, d.data[9]),
                    _ => (6, 40, d.data[6]),
                }
            })
            .collect();
        let (udp, tcp) = (libc::IPPROTO_UDP as u8, libc::IPPROTO_TCP as u8);
        assert_eq!(
            kinds,
            BTreeSet::from([(4, 20, udp), (6, 40, udp), (4, 32, udp), (4, 20, tcp)]),
            "window {window}"
        );
        for d in &drops {
            let (l3, ip_udp_len) = match d.data[0] >> 4 {
                4 => (usize::from(d.data[0] & 0x0f) * 4, 8 + 300),
                _ => (40, 8 + 300),
            };
            if d.data[if d.data[0] >> 4 == 4 { 9 } else { 6 }] == udp {
                assert_eq!(d.orig_len as usize, l3 + ip_udp_len, "{d:?}");
            }
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
        let after = maps.counters().unwrap();
        let i = counter::DROPS_READ_FAILED as usize;
        assert_eq!(after[i], before[i], "drops_read_failed");
    }
}

/// A drop that finds the `EVENTS` ring buffer full goes to the reserve ring when it may be a
/// race's loser — its entry went through a NAT hook and was never confirmed (freed inside
/// netfilter) — and is counted lost otherwise: the flood's own drops never take the
/// reserve's room. 26,000 drops to a closed port (656-byte records into 8 MiB: ~12,800)
/// fill `EVENTS`; then 20 queries DNAT'd and dropped by a filter rule (unconfirmed,
/// `DST_NAT_DONE`) in a namespace of the test's own all go to the reserve.
#[test]
fn only_drops_that_may_be_a_race_go_to_the_reserve_when_the_ring_buffer_is_full() {
    if !crate::test_support::root_or_skip("loading eBPF programs") {
        return;
    }
    struct Netns(String);
    impl Drop for Netns {
        fn drop(&mut self) {
            let _ = std::process::Command::new("ip")
                .args(["netns", "del", &self.0])
                .status();
        }
    }
    let ip = |args: &[&str]| {
        let st = std::process::Command::new("ip")
            .args(args)
            .status()
            .unwrap();
        assert!(st.success(), "ip {args:?}");
    };
    let ns = Netns(format!("dnspath-ut-reserve-{}", std::process::id()));
    ip(&["netns", "add", &ns.0]);
    ip(&["-n", &ns.0, "link", "set", "lo", "up"]);
    let (port, nat_port) = (closed_udp_port(), closed_udp_port());
    let to = format!("127.0.0.1:{nat_port}");
    let nat_s = nat_port.to_string();
    ip(&[
        "netns",
        "exec",
        &ns.0,
        "iptables",
        "-t",
        "nat",
        "-A",
        "OUTPUT",
        "-p",
        "udp",
        "-d",
        "127.0.0.1",
        "--dport",
        "5300",
        "-j",
        "DNAT",
        "--to-destination",
        &to,
    ]);
    ip(&[
        "netns", "exec", &ns.0, "iptables", "-A", "OUTPUT", "-p", "udp", "--dport", &nat_s, "-j",
        "DROP",
    ]);

    let _loaded = loaded();
    let mut probes = Probes::load(&ProbeOptions {
        ports: vec![port, nat_port],
        snaplen: 512,
        drops: true,
        kernel_log: false,
    })
    .unwrap();
    let mut events = probes.take_events().unwrap();
    let mut reserve = probes.take_drop_reserve().unwrap();
    let maps = probes.maps().unwrap();
    let lost_at = counter::DROPS_LOST_RINGBUF as usize;
    let before = maps.counters().unwrap()[lost_at];
    const SENT: usize = 26_000;
    let s = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    for _ in 0..SENT {
        s.send_to(&[0u8; 8], ("127.0.0.1", port)).unwrap();
    }
    const NATTED: usize = 20;
    let path = std::path::PathBuf::from("/run/netns").join(&ns.0);
    crate::kernel::netns::with_netns(&path, || {
        let s = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        for _ in 0..NATTED {
            // The filter rule's drop is the sender's EPERM.
            let _ = s.send_to(&[0u8; 8], ("127.0.0.1", 5300));
        }
        Ok(())
    })
    .unwrap();
    let lost = (maps.counters().unwrap()[lost_at] - before) as usize;
    let in_events = drops_to(&mut events, port, usize::MAX).len();
    let reserved: Vec<_> = std::iter::from_fn(|| reserve.next().map(|r| r.to_vec()))
        .filter_map(|r| match crate::source::live::parse_record(&r) {
            crate::event::SourceEvent::Drop(d) => Some(d),
            _ => None,
        })
        .collect();
    let port_of = |d: &crate::event::KernelDrop| {
        let l4 = usize::from(d.data[0] & 0x0f) * 4;
        u16::from_be_bytes([d.data[l4 + 2], d.data[l4 + 3]])
    };
    let natted = reserved.iter().filter(|d| port_of(d) == nat_port).count();
    eprintln!(
        "{in_events} in EVENTS, {lost} lost; reserve: {natted} DNAT'd of {}",
        reserved.len()
    );
    // Every flood drop is in EVENTS or counted lost, none in the reserve.
    assert_eq!(in_events + lost, SENT);
    assert!(lost > 300, "{lost} lost: EVENTS was never full");
    assert_eq!(reserved.len(), NATTED, "only the DNAT'd drops");
    assert_eq!(natted, NATTED);
    let d = &reserved[0];
    assert!(
        d.ct.as_ref().is_some_and(|c| c.status & (1 << 3) == 0),
        "{d:?}"
    );
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
