#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "integration tests fail at the line that broke"
)]
//! The TC programs on crafted frames, through `BPF_PROG_TEST_RUN`: no lab, no traffic, just
//! the kernel's verifier and the programs' walk of VLAN tags, IPv4 options, IPv6 extension
//! headers, TCP options and cut DNS payloads, checked on the ring-buffer record each one
//! leaves (or does not). Root only; `cargo xtask vm-test` runs this on every kernel of the
//! matrix too.
use aya::maps::{MapData, RingBuf};
use dnspath::decode::tunnel::{decapsulate, Decap, TunnelKind};
use dnspath::{
    event::{Direction, SourceEvent},
    kernel::{KernelMaps, ProbeOptions, Probes, TC_PROGRAMS},
    source::live::RecordReader,
};
use lab::frames::{
    dns_query, eth, ext_frag, ext_frag_id, ext_opts, geneve, gre, ipv4, ipv6, tcp, udp, vxlan,
};
use tracer_common::counter;

const ETH_INGRESS: usize = 0;
const ETH_EGRESS: usize = 1;
const SNAPLEN: u32 = 100;

struct Rig {
    probes: Probes,
    maps: KernelMaps,
    ring: RingBuf<MapData>,
    /// Reads the records as the live source does (a test run's `sk_buff` may be the last
    /// one's address: a frame run again elsewhere can come out as a copy record, rebuilt).
    records: RecordReader,
}

fn rig() -> Option<Rig> {
    rig_with(false)
}

fn rig_with(kernel_log: bool) -> Option<Rig> {
    if !lab::tracer::root_or_skip("BPF_PROG_TEST_RUN") {
        return None;
    }
    let mut probes = Probes::load(&ProbeOptions {
        ports: vec![53],
        snaplen: SNAPLEN,
        drops: false,
        kernel_log,
    })
    .unwrap();
    let ring = probes.take_events().unwrap();
    let maps = probes.maps().unwrap();
    assert_eq!(TC_PROGRAMS[ETH_INGRESS].0, "dnspath_tc_eth_ingress");
    assert_eq!(TC_PROGRAMS[ETH_EGRESS].0, "dnspath_tc_eth_egress");
    Some(Rig {
        probes,
        maps,
        ring,
        records: RecordReader::default(),
    })
}

/// Number of kernel counters (`tracer_common::counter`).
const COUNTERS: usize = tracer_common::counter::COUNT as usize;

impl Rig {
    /// Runs `frame` through program `index`; returns the records it produced and how much
    /// each kernel counter grew.
    fn run(&mut self, index: usize, frame: &[u8]) -> (Vec<SourceEvent>, [u64; COUNTERS]) {
        let before = self.maps.counters().unwrap();
        let verdict = self.probes.test_run_tc(index, frame).unwrap();
        // TC_ACT_UNSPEC (-1): the programs never change a packet's fate.
        assert_eq!(verdict as i32, -1, "verdict");
        let after = self.maps.counters().unwrap();
        let mut grew = [0u64; COUNTERS];
        for (i, g) in grew.iter_mut().enumerate() {
            *g = after[i] - before[i];
        }
        let mut out = Vec::new();
        while let Some(item) = self.ring.next() {
            out.push(self.records.parse(&item));
        }
        (out, grew)
    }
}

fn one_packet(events: &[SourceEvent]) -> &dnspath::event::CapturedPacket {
    assert_eq!(events.len(), 1, "expected one record, got {events:?}");
    match &events[0] {
        SourceEvent::Packet(p) => p,
        other => panic!("expected a packet record, got {other:?}"),
    }
}

#[test]
fn ipv4_udp_query_is_copied_whole_with_its_direction() {
    let Some(mut rig) = rig() else { return };
    let ip = ipv4(17, 0, 0, &udp(40000, 53, &dns_query(0)));
    for (index, dir) in [
        (ETH_INGRESS, Direction::Ingress),
        (ETH_EGRESS, Direction::Egress),
    ] {
        let (ev, grew) = rig.run(index, &eth(&[], 0x0800, &ip));
        let p = one_packet(&ev);
        assert_eq!(p.data, ip, "record holds the IP packet");
        assert_eq!(p.orig_len as usize, ip.len());
        assert_eq!(p.at.dir, dir);
        assert_eq!(p.vlan, None);
        assert_eq!(grew[counter::PACKETS_MATCHED as usize], 1);
        assert_eq!(grew[counter::PACKETS_LOST_RINGBUF as usize], 0);
    }
}

/// One loaded program set serves every namespace: a record names the namespace of the
/// device its packet was on (read through BTF offsets), not one fixed at load. A test run's
/// packet is on the calling thread's namespace's `lo`.
#[test]
fn a_record_names_the_namespace_of_its_device() {
    let Some(mut rig) = rig() else { return };
    if !rig.probes.shared_programs() {
        eprintln!("skipped: no kernel BTF, one program instance per namespace");
        return;
    }
    let ip = ipv4(17, 0, 0, &udp(40000, 53, &dns_query(0)));
    let frame = eth(&[], 0x0800, &ip);
    let own = dnspath::kernel::netns::current_netns_cookie().unwrap();
    let (ev, _) = rig.run(ETH_INGRESS, &frame);
    assert_eq!(one_packet(&ev).at.netns, own, "own namespace");
    // A namespace of this thread alone (unshare affects the calling thread only).
    let (other, ev) = std::thread::scope(|s| {
        s.spawn(|| {
            // SAFETY: unshare(2) of this thread's network namespace; no memory involved.
            assert_eq!(unsafe { libc::unshare(libc::CLONE_NEWNET) }, 0, "unshare");
            let other = dnspath::kernel::netns::current_netns_cookie().unwrap();
            (other, rig.run(ETH_EGRESS, &frame).0)
        })
        .join()
        .unwrap()
    });
    assert_ne!(other, own);
    assert_eq!(
        one_packet(&ev).at.netns,
        other,
        "the thread's new namespace"
    );
}

/// A port learnt in one namespace (a pod's DNS proxy: `KernelMaps::capture_port_in`) is
/// captured there alone, both ways, and not even counted as matched elsewhere; a `--port`
/// stays everywhere; released (its namespace gone), it is captured nowhere.
#[test]
fn a_learnt_port_is_captured_only_in_its_namespace() {
    let Some(mut rig) = rig() else { return };
    if !rig.probes.shared_programs() {
        eprintln!("skipped: no kernel BTF, one program instance per namespace");
        return;
    }
    const PROXY: u16 = 15053;
    let to_proxy = eth(
        &[],
        0x0800,
        &ipv4(17, 0, 0, &udp(40000, PROXY, &dns_query(0))),
    );
    let from_proxy = eth(
        &[],
        0x0800,
        &ipv4(17, 0, 0, &udp(PROXY, 40000, &dns_query(0))),
    );
    let to_53 = eth(&[], 0x0800, &ipv4(17, 0, 0, &udp(40000, 53, &dns_query(0))));
    let own = dnspath::kernel::netns::current_netns_cookie().unwrap();
    let matched = |grew: [u64; COUNTERS]| grew[counter::PACKETS_MATCHED as usize];
    // Before: nowhere.
    let (ev, grew) = rig.run(ETH_EGRESS, &to_proxy);
    assert!(ev.is_empty(), "{ev:?}");
    assert_eq!(matched(grew), 0);
    rig.maps.capture_port_in(own, PROXY).unwrap();
    for frame in [&to_proxy, &from_proxy] {
        let (ev, grew) = rig.run(ETH_EGRESS, frame);
        assert_eq!(one_packet(&ev).at.netns, own);
        assert_eq!(matched(grew), 1);
    }
    // Another namespace (this thread's alone): the learnt port is not captured there, the
    // port given is.
    let (learnt, given) = std::thread::scope(|s| {
        s.spawn(|| {
            // SAFETY: unshare(2) of this thread's network namespace; no memory involved.
            assert_eq!(unsafe { libc::unshare(libc::CLONE_NEWNET) }, 0, "unshare");
            (rig.run(ETH_EGRESS, &to_proxy), rig.run(ETH_EGRESS, &to_53))
        })
        .join()
        .unwrap()
    });
    assert!(learnt.0.is_empty(), "learnt elsewhere: {:?}", learnt.0);
    assert_eq!(matched(learnt.1), 0, "not even counted as matched");
    assert_eq!(matched(given.1), 1, "--port 53 everywhere");
    // Released (its namespace gone): nowhere again.
    rig.maps.release_port_in(own, PROXY, false).unwrap();
    let (ev, grew) = rig.run(ETH_EGRESS, &to_proxy);
    assert!(ev.is_empty(), "{ev:?}");
    assert_eq!(matched(grew), 0);
}

#[test]
fn vlan_tags_in_the_packet_are_walked() {
    let Some(mut rig) = rig() else { return };
    let ip = ipv4(17, 0, 0, &udp(53, 40000, &dns_query(0)));
    let (ev, _) = rig.run(ETH_INGRESS, &eth(&[(0x8100, 100)], 0x0800, &ip));
    let p = one_packet(&ev);
    assert_eq!(p.data, ip);
    assert_eq!(p.vlan, Some(100));
    // 802.1ad outer + 802.1Q inner: the inner tag is the one reported.
    let (ev, _) = rig.run(
        ETH_INGRESS,
        &eth(&[(0x88a8, 7), (0x8100, 200)], 0x0800, &ip),
    );
    let p = one_packet(&ev);
    assert_eq!(p.data, ip);
    assert_eq!(p.vlan, Some(200));
}

#[test]
fn ipv4_options_are_skipped_by_ihl() {
    let Some(mut rig) = rig() else { return };
    for words in [1, 3, 10] {
        let ip = ipv4(17, words, 0, &udp(40000, 53, &dns_query(0)));
        let (ev, _) = rig.run(ETH_EGRESS, &eth(&[], 0x0800, &ip));
        assert_eq!(one_packet(&ev).data, ip, "IHL {}", 5 + words);
    }
    // Port 53 only at the wrong offset (as if IHL were ignored): nothing captured.
    let mut ip = ipv4(17, 2, 0, &udp(40000, 5353, &dns_query(0)));
    ip[20..24].copy_from_slice(&[0x9c, 0x40, 0, 53]);
    let (ev, grew) = rig.run(ETH_EGRESS, &eth(&[], 0x0800, &ip));
    assert!(ev.is_empty(), "{ev:?}");
    assert_eq!(grew[counter::PACKETS_MATCHED as usize], 0);
}

#[test]
fn ipv6_extension_headers_are_followed() {
    let Some(mut rig) = rig() else { return };
    let l4 = udp(40000, 53, &dns_query(0));
    for chain in [
        vec![],
        vec![ext_opts(0)],
        vec![ext_opts(0), ext_opts(60)],
        vec![ext_opts(0), ext_frag(0)],
    ] {
        let ip = ipv6(&chain, 17, &l4);
        let (ev, _) = rig.run(ETH_INGRESS, &eth(&[], 0x86dd, &ip));
        assert_eq!(one_packet(&ev).data, ip, "chain of {}", chain.len());
    }
    // A non-first fragment carries no ports: not captured unless its datagram's first
    // fragment was on a watched port.
    let ip = ipv6(&[ext_frag_id(100, 0xfeed_0001)], 17, &l4);
    let (ev, _) = rig.run(ETH_INGRESS, &eth(&[], 0x86dd, &ip));
    assert!(ev.is_empty(), "{ev:?}");
}

/// A later fragment whose first fragment (same addresses, id, protocol) was on a watched
/// port is captured from its IP header on, its data counted against the snaplen; one of
/// another datagram (other id) is not.
#[test]
fn later_fragments_of_watched_datagrams_are_captured() {
    let Some(mut rig) = rig() else { return };
    // IPv4: MF set, offset 0 (first), then offset 100 (later) with the same id 0x3344.
    let first = ipv4(17, 0, 0x2000, &udp(53, 40000, &dns_query(40)));
    let later = ipv4(17, 0, 100, &[0xcd; 60]);
    let (ev, _) = rig.run(ETH_INGRESS, &eth(&[], 0x0800, &first));
    assert_eq!(one_packet(&ev).data, first);
    let (ev, grew) = rig.run(ETH_EGRESS, &eth(&[], 0x0800, &later));
    assert_eq!(
        one_packet(&ev).data,
        later,
        "later IPv4 fragment copied whole"
    );
    assert_eq!(grew[counter::PACKETS_MATCHED as usize], 1);
    let long = ipv4(17, 0, 200, &[0xcd; 300]);
    let (ev, _) = rig.run(ETH_EGRESS, &eth(&[], 0x0800, &long));
    assert_eq!(one_packet(&ev).data.len(), 20 + SNAPLEN as usize, "snaplen");
    let mut other = later.clone();
    other[4..6].copy_from_slice(&[0x99, 0x99]);
    let (ev, grew) = rig.run(ETH_EGRESS, &eth(&[], 0x0800, &other));
    assert!(ev.is_empty(), "{ev:?}");
    assert_eq!(grew[counter::PACKETS_MATCHED as usize], 0);
    // A first fragment on an unwatched port does not make its datagram watched.
    let first = ipv4(17, 0, 0x2000, &udp(5000, 6000, &dns_query(40)));
    let mut later = ipv4(17, 0, 100, &[0xcd; 60]);
    later[4..6].copy_from_slice(&[0x77, 0x77]);
    let mut first_other = first.clone();
    first_other[4..6].copy_from_slice(&[0x77, 0x77]);
    let (ev, _) = rig.run(ETH_INGRESS, &eth(&[], 0x0800, &first_other));
    assert!(ev.is_empty(), "{ev:?}");
    let (ev, _) = rig.run(ETH_INGRESS, &eth(&[], 0x0800, &later));
    assert!(ev.is_empty(), "{ev:?}");

    // IPv6: the Fragment header's 32-bit id.
    let l4 = udp(53, 40000, &dns_query(40));
    let first = ipv6(&[ext_frag_id(0, 0xabcd_0002)], 17, &l4);
    let later = ipv6(&[ext_frag_id(20, 0xabcd_0002)], 17, &[0xef; 48]);
    let (ev, _) = rig.run(ETH_EGRESS, &eth(&[], 0x86dd, &first));
    assert_eq!(one_packet(&ev).at.dir, Direction::Egress);
    let (ev, _) = rig.run(ETH_INGRESS, &eth(&[], 0x86dd, &later));
    assert_eq!(
        one_packet(&ev).data,
        later,
        "later IPv6 fragment copied whole"
    );
    let other = ipv6(&[ext_frag_id(20, 0xabcd_0003)], 17, &[0xef; 48]);
    let (ev, _) = rig.run(ETH_INGRESS, &eth(&[], 0x86dd, &other));
    assert!(ev.is_empty(), "{ev:?}");
}

#[test]
fn tcp_with_options_keeps_headers_and_snaplen_payload() {
    let Some(mut rig) = rig() else { return };
    for opt_words in [0, 3, 10] {
        let seg = tcp(40000, 53, opt_words, &dns_query(300));
        let ip = ipv4(6, 0, 0, &seg);
        let (ev, _) = rig.run(ETH_EGRESS, &eth(&[], 0x0800, &ip));
        let p = one_packet(&ev);
        let headers = 20 + (5 + opt_words) * 4;
        assert_eq!(
            p.data.len(),
            headers + SNAPLEN as usize,
            "options {opt_words}"
        );
        assert_eq!(p.data[..], ip[..p.data.len()]);
        assert_eq!(p.orig_len as usize, ip.len());
    }
}

#[test]
fn dns_cut_at_odd_lengths_is_copied_as_far_as_it_goes() {
    let Some(mut rig) = rig() else { return };
    // Payloads below, at and above the snaplen, odd and even.
    for extra in [0usize, 1, 57, 70, 71, 72, 73, 500, 1201, 3001] {
        let ip = ipv4(17, 0, 0, &udp(53, 40000, &dns_query(extra)));
        let (ev, grew) = rig.run(ETH_INGRESS, &eth(&[], 0x0800, &ip));
        let p = one_packet(&ev);
        let want = ip.len().min(20 + 8 + SNAPLEN as usize);
        assert_eq!(p.data.len(), want, "extra {extra}");
        assert_eq!(p.data[..], ip[..want]);
        assert_eq!(p.orig_len as usize, ip.len());
        assert_eq!(grew[counter::PACKETS_LOST_COPY as usize], 0);
    }
    // A UDP header cut short: the ports are there, so it is captured as far as it goes.
    let ip = ipv4(17, 0, 0, &udp(53, 40000, &[]));
    let cut = &ip[..20 + 4];
    let (ev, _) = rig.run(ETH_INGRESS, &eth(&[], 0x0800, cut));
    assert_eq!(one_packet(&ev).data, cut);
}

#[test]
fn other_traffic_leaves_no_record() {
    let Some(mut rig) = rig() else { return };
    let cases: Vec<(&str, Vec<u8>)> = vec![
        (
            "udp 80",
            eth(&[], 0x0800, &ipv4(17, 0, 0, &udp(40000, 80, b"hello"))),
        ),
        (
            "tcp 443",
            eth(&[], 0x0800, &ipv4(6, 0, 0, &tcp(40000, 443, 0, b"x"))),
        ),
        ("icmp", eth(&[], 0x0800, &ipv4(1, 0, 0, &[8, 0, 0, 0]))),
        ("arp", eth(&[], 0x0806, &[0u8; 28])),
        (
            "ipv6 udp 123",
            eth(&[], 0x86dd, &ipv6(&[], 17, &udp(123, 123, b"ntp"))),
        ),
    ];
    for (what, frame) in cases {
        let (ev, grew) = rig.run(ETH_EGRESS, &frame);
        assert!(ev.is_empty(), "{what}: {ev:?}");
        assert_eq!(grew[counter::PACKETS_MATCHED as usize], 0, "{what}");
        assert_eq!(grew[counter::PARSE_FAILED as usize], 0, "{what}");
    }
}

#[test]
fn unreadable_headers_are_counted_not_reported() {
    let Some(mut rig) = rig() else { return };
    let ip = ipv4(17, 0, 0, &udp(40000, 53, &dns_query(0)));
    // Ports cut off after the IPv4 header, and a bad IHL. (The kernel's test run refuses
    // frames too short for an IPv4 header itself.)
    let mut bad_ihl = ip.clone();
    bad_ihl[0] = 0x43;
    for (what, frame) in [
        ("ports cut", eth(&[], 0x0800, &ip[..22])),
        ("ihl 3", eth(&[], 0x0800, &bad_ihl)),
    ] {
        let (ev, grew) = rig.run(ETH_INGRESS, &frame);
        assert!(ev.is_empty(), "{what}: {ev:?}");
        assert_eq!(grew[counter::PARSE_FAILED as usize], 1, "{what}");
    }
}

/// Storm shedding: a question userspace put in `SHED_ON` is only counted — whatever the case
/// of its name, behind IPv4 or IPv6 headers — and every other question is copied as before.
#[test]
fn shed_questions_are_counted_not_copied() {
    let Some(mut rig) = rig() else { return };
    let hash = dnspath::decode::decoder::question_hash(
        "a.test.",
        dnspath::decode::dns::RrType::A,
        dnspath::decode::dns::RrClass::IN,
    )
    .unwrap();
    rig.maps.shed_start(hash, 1).unwrap();
    // DNS 0x20 case randomisation does not hide the question.
    let mut mixed = dns_query(0);
    mixed[13] = b'A';
    mixed[15..19].copy_from_slice(b"TeSt");
    let frames = [
        eth(&[], 0x0800, &ipv4(17, 0, 0, &udp(40000, 53, &dns_query(0)))),
        eth(&[], 0x0800, &ipv4(17, 2, 0, &udp(53, 40000, &mixed))),
        eth(
            &[],
            0x86dd,
            &ipv6(&[ext_opts(60)], 17, &udp(40000, 53, &dns_query(30))),
        ),
    ];
    for (i, f) in frames.iter().enumerate() {
        let (ev, grew) = rig.run(ETH_INGRESS, f);
        assert!(ev.is_empty(), "frame {i}: shed question copied: {ev:?}");
        assert_eq!(grew[counter::PACKETS_MATCHED as usize], 1, "frame {i}");
        assert_eq!(grew[counter::PACKETS_SHED as usize], 1, "frame {i}");
    }
    assert_eq!(rig.maps.shed_count(hash).unwrap(), 3);

    // Another type of the same name, a message without a question, TCP: copied.
    let mut aaaa = dns_query(0);
    aaaa[21] = 28;
    let mut no_question = dns_query(0);
    no_question[5] = 0;
    for (i, f) in [
        eth(&[], 0x0800, &ipv4(17, 0, 0, &udp(40000, 53, &aaaa))),
        eth(&[], 0x0800, &ipv4(17, 0, 0, &udp(40000, 53, &no_question))),
        eth(
            &[],
            0x0800,
            &ipv4(6, 0, 0, &tcp(40000, 53, 0, &dns_query(0))),
        ),
    ]
    .iter()
    .enumerate()
    {
        let (ev, grew) = rig.run(ETH_INGRESS, f);
        one_packet(&ev);
        assert_eq!(grew[counter::PACKETS_SHED as usize], 0, "frame {i}");
    }

    // Stopped: copied again; the count stays readable until forgotten.
    rig.maps.shed_stop(hash, 0).unwrap();
    let (ev, grew) = rig.run(ETH_INGRESS, &frames[0]);
    one_packet(&ev);
    assert_eq!(grew[counter::PACKETS_SHED as usize], 0);
    assert_eq!(rig.maps.shed_count(hash).unwrap(), 3);
    rig.maps.shed_forget(hash).unwrap();
    assert_eq!(rig.maps.shed_count(hash).unwrap(), 0);
}

/// Every log record of the process, as `level target: message`.
static LOGGED: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());

struct Collect;

impl log::Log for Collect {
    fn enabled(&self, _: &log::Metadata<'_>) -> bool {
        true
    }
    fn log(&self, r: &log::Record<'_>) {
        LOGGED
            .lock()
            .unwrap()
            .push(format!("{} {}: {}", r.level(), r.target(), r.args()));
    }
    fn flush(&self) {}
}

fn take_logged() -> Vec<String> {
    std::mem::take(&mut *LOGGED.lock().unwrap())
}

/// `-vv`: the programs say why a packet was not parsed and which encapsulation they did not
/// enter (VLAN tags beyond two, MPLS); loaded without it, the same frames say nothing (the verifier removed the logging).
#[test]
fn kernel_diagnostics_only_when_asked() {
    if log::set_logger(&Collect).is_ok() {
        log::set_max_level(log::LevelFilter::Trace);
    }
    let three_tags = eth(
        &[(0x88a8, 1), (0x8100, 2), (0x8100, 3)],
        0x0800,
        &ipv4(17, 0, 0, &udp(40000, 53, &dns_query(0))),
    );
    let mpls = eth(&[], 0x8847, &[0u8; 40]);
    let mut bad_ihl = ipv4(17, 0, 0, &udp(40000, 53, &dns_query(0)));
    bad_ihl[0] = 0x43;
    let bad_ihl = eth(&[], 0x0800, &bad_ihl);
    let plain_tcp = eth(&[], 0x0800, &ipv4(6, 0, 0, &tcp(40000, 443, 0, b"x")));
    for kernel_log in [false, true] {
        let Some(mut rig) = rig_with(kernel_log) else {
            return;
        };
        take_logged();
        for frame in [&three_tags, &mpls, &bad_ihl, &plain_tcp] {
            rig.run(ETH_INGRESS, frame);
        }
        rig.maps.flush_kernel_log();
        let logged: Vec<String> = take_logged()
            .into_iter()
            .filter(|l| l.contains("dnspath::kernel"))
            .collect();
        if !kernel_log {
            assert!(logged.is_empty(), "{logged:?}");
            continue;
        }
        assert_eq!(logged.len(), 3, "{logged:?}");
        assert!(
            logged[0].starts_with("TRACE dnspath::kernel: ")
                && logged[0].ends_with("ethertype 88a8: VLAN tags beyond two not inspected"),
            "{logged:?}"
        );
        assert!(
            logged[1].ends_with("ethertype 8847: MPLS not inspected"),
            "{logged:?}"
        );
        assert!(
            logged[2].starts_with("DEBUG dnspath::kernel: ")
                && logged[2].contains("headers unreadable")
                && logged[2].contains("parse_failed"),
            "{logged:?}"
        );
    }
}

/// The DNS query every tunnel test carries: 10.244.1.2:40000 > 10.96.0.10:53.
fn inner_query() -> Vec<u8> {
    ipv4(17, 0, 0, &udp(40000, 53, &dns_query(0)))
}

/// The record of `frame` (an Ethernet frame around `outer`, an IP packet carrying a tunnel)
/// holds `outer` whole, from its IP header on; userspace finds in it the tunnel `kind` and
/// the query to port 53.
fn tunnelled(rig: &mut Rig, what: &str, outer: &[u8], frame: &[u8], kind: TunnelKind) {
    let (ev, grew) = rig.run(ETH_INGRESS, frame);
    let p = one_packet(&ev);
    assert_eq!(p.data, outer, "{what}: copied from the outer IP header on");
    assert_eq!(p.orig_len as usize, outer.len(), "{what}");
    assert_eq!(grew[counter::PACKETS_MATCHED as usize], 1, "{what}");
    assert_eq!(grew[counter::PARSE_FAILED as usize], 0, "{what}");
    let Ok(Decap::Inner { tunnel, offset }) = decapsulate(&p.data) else {
        panic!("{what}: {:?}", decapsulate(&p.data));
    };
    assert_eq!(tunnel.kind, kind, "{what}");
    let ip = dnspath::decode::parse_ip(&p.data[offset..]).unwrap();
    assert!(
        matches!(
            ip.transport,
            dnspath::decode::Transport::Udp { dport: 53, .. }
        ),
        "{what}: {ip:?}"
    );
}

/// One level of VXLAN (both ports, a VLAN tag inside), Geneve (with options; Ethernet or IP
/// inside), GRE (checksum, key, sequence number; IPv4, IPv6, Ethernet inside) and IP-in-IP
/// (4 and 41, in IPv4 and IPv6, behind an extension header) is entered: a DNS packet inside is
/// copied from the outer IP header on; what is not DNS inside, or not a tunnel, is not.
#[test]
fn tunnels_are_entered_one_level() {
    let Some(mut rig) = rig() else { return };
    let q = inner_query();
    let q6 = ipv6(&[], 17, &udp(40000, 53, &dns_query(0)));
    let in_eth = eth(&[], 0x0800, &q);
    let mut cases: Vec<(&str, Vec<u8>, u16, TunnelKind)> = vec![
        (
            "vxlan 4789",
            ipv4(17, 0, 0, &udp(51000, 4789, &vxlan(1, &in_eth))),
            0x0800,
            TunnelKind::Vxlan,
        ),
        (
            "vxlan 8472, VLAN tag inside",
            ipv4(
                17,
                0,
                0,
                &udp(51000, 8472, &vxlan(1, &eth(&[(0x8100, 5)], 0x0800, &q))),
            ),
            0x0800,
            TunnelKind::Vxlan,
        ),
        (
            "vxlan over IPv6",
            ipv6(
                &[],
                17,
                &udp(51000, 4789, &vxlan(7, &eth(&[], 0x86dd, &q6))),
            ),
            0x86dd,
            TunnelKind::Vxlan,
        ),
        (
            "geneve, 5 words of options, Ethernet",
            ipv4(17, 0, 0, &udp(51000, 6081, &geneve(5, 0x6558, 9, &in_eth))),
            0x0800,
            TunnelKind::Geneve,
        ),
        (
            "geneve, IPv4",
            ipv4(17, 0, 0, &udp(51000, 6081, &geneve(0, 0x0800, 9, &q))),
            0x0800,
            TunnelKind::Geneve,
        ),
        (
            "gre key+seq IPv4",
            ipv4(47, 0, 0, &gre(false, Some(42), Some(1), 0x0800, &q)),
            0x0800,
            TunnelKind::Gre,
        ),
        (
            "gre csum+key+seq TEB",
            ipv4(47, 0, 0, &gre(true, Some(42), Some(1), 0x6558, &in_eth)),
            0x0800,
            TunnelKind::Gre,
        ),
        (
            "gre IPv6 in IPv6 options",
            ipv6(&[ext_opts(60)], 47, &gre(false, None, None, 0x86dd, &q6)),
            0x86dd,
            TunnelKind::Gre,
        ),
        ("ipip", ipv4(4, 0, 0, &q), 0x0800, TunnelKind::Ipip),
        (
            "ipip, outer options",
            ipv4(4, 3, 0, &q),
            0x0800,
            TunnelKind::Ipip,
        ),
        ("ip6 in ip", ipv4(41, 0, 0, &q6), 0x0800, TunnelKind::Ip6in4),
        ("ip in ip6", ipv6(&[], 4, &q), 0x86dd, TunnelKind::Ip4in6),
        (
            "ip6 in ip6",
            ipv6(&[ext_opts(60)], 41, &q6),
            0x86dd,
            TunnelKind::Ip6in6,
        ),
    ];
    for (what, outer, ethertype, kind) in cases.drain(..) {
        let frame = eth(&[], ethertype, &outer);
        tunnelled(&mut rig, what, &outer, &frame, kind);
        // Behind two VLAN tags of the uplink as well.
        let tagged = eth(&[(0x88a8, 3), (0x8100, 4)], ethertype, &outer);
        tunnelled(&mut rig, what, &outer, &tagged, kind);
    }

    // The snaplen counts from the inner transport header.
    let big = ipv4(17, 0, 0, &udp(53, 40000, &dns_query(500)));
    let outer = ipv4(
        17,
        0,
        0,
        &udp(51000, 4789, &vxlan(1, &eth(&[], 0x0800, &big))),
    );
    let (ev, _) = rig.run(ETH_EGRESS, &eth(&[], 0x0800, &outer));
    let p = one_packet(&ev);
    assert_eq!(p.data.len(), 20 + 8 + 8 + 14 + 20 + 8 + SNAPLEN as usize);
    assert_eq!(p.orig_len as usize, outer.len());

    // Not DNS inside, not IP inside, not a tunnel's header, a tunnel in a tunnel, a GRE
    // version or routing bit not read: nothing, and nothing counted as unreadable.
    let web = ipv4(6, 0, 0, &tcp(40000, 443, 0, b"x"));
    let mut no_i_flag = vxlan(1, &in_eth);
    no_i_flag[0] = 0;
    let mut gre_v1 = gre(false, Some(1), None, 0x880b, &q);
    gre_v1[1] = 1;
    let mut gre_routing = gre(false, None, None, 0x0800, &q);
    gre_routing[0] = 0x40;
    let nested = ipv4(4, 0, 0, &ipv4(4, 0, 0, &q));
    let quiet: Vec<(&str, Vec<u8>)> = vec![
        (
            "tcp 443 in vxlan",
            ipv4(
                17,
                0,
                0,
                &udp(51000, 4789, &vxlan(1, &eth(&[], 0x0800, &web))),
            ),
        ),
        (
            "arp in vxlan",
            ipv4(
                17,
                0,
                0,
                &udp(51000, 4789, &vxlan(1, &eth(&[], 0x0806, &[0; 28]))),
            ),
        ),
        ("no I flag", ipv4(17, 0, 0, &udp(51000, 4789, &no_i_flag))),
        (
            "geneve version 1",
            ipv4(
                17,
                0,
                0,
                &udp(51000, 6081, &{
                    let mut g = geneve(0, 0x0800, 1, &q);
                    g[0] = 0x40;
                    g
                }),
            ),
        ),
        ("gre version 1", ipv4(47, 0, 0, &gre_v1)),
        ("gre routing", ipv4(47, 0, 0, &gre_routing)),
        ("ipip in ipip", nested),
        ("tcp 443 in ipip", ipv4(4, 0, 0, &web)),
    ];
    for (what, outer) in quiet {
        let (ev, grew) = rig.run(ETH_INGRESS, &eth(&[], 0x0800, &outer));
        assert!(ev.is_empty(), "{what}: {ev:?}");
        assert_eq!(grew[counter::PACKETS_MATCHED as usize], 0, "{what}");
        assert_eq!(grew[counter::PARSE_FAILED as usize], 0, "{what}");
    }

    // An inner header cut short: counted as unreadable, not reported.
    let cut = ipv4(17, 0, 0, &udp(51000, 4789, &vxlan(1, &in_eth[..14 + 22])));
    let (ev, grew) = rig.run(ETH_INGRESS, &eth(&[], 0x0800, &cut));
    assert!(ev.is_empty(), "{ev:?}");
    assert_eq!(grew[counter::PARSE_FAILED as usize], 1);
}

/// The inner datagram's later fragments, each in a tunnel packet of its own, follow its first
/// fragment (on port 53) as they do outside tunnels.
#[test]
fn inner_fragments_in_a_tunnel_are_followed() {
    let Some(mut rig) = rig() else { return };
    let wrap = |inner: &[u8]| ipv4(47, 0, 0, &gre(false, Some(5), None, 0x0800, inner));
    let mut later_ip = ipv4(17, 0, 100, &[0xcd; 60]);
    later_ip[4..6].copy_from_slice(&[0x55, 0x66]);
    let mut first_ip = ipv4(17, 0, 0x2000, &udp(53, 40000, &dns_query(40)));
    first_ip[4..6].copy_from_slice(&[0x55, 0x66]);
    let (first, later) = (wrap(&first_ip), wrap(&later_ip));
    let (ev, _) = rig.run(ETH_INGRESS, &eth(&[], 0x0800, &first));
    assert_eq!(one_packet(&ev).data, first);
    let (ev, _) = rig.run(ETH_INGRESS, &eth(&[], 0x0800, &later));
    assert_eq!(one_packet(&ev).data, later, "later inner fragment copied");
    // Another datagram's later fragment (other id) is not.
    let mut other = later_ip.clone();
    other[4..6].copy_from_slice(&[0x77, 0x88]);
    let (ev, _) = rig.run(ETH_INGRESS, &eth(&[], 0x0800, &wrap(&other)));
    assert!(ev.is_empty(), "{ev:?}");
}
