//! The filter's program: its shape (the kernel's limits), what it makes of ctnetlink
//! messages in a model of classic BPF ([`run`]), and what the kernel makes of them: the same
//! messages sent to a filtered socket, and the events of real conntrack entries, each in a
//! network namespace of the test's own (`unshare(CLONE_NEWNET)` on a thread of its own;
//! nothing of the host's namespaces is touched).
use std::{
    net::{Ipv4Addr, UdpSocket},
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

use libc::{
    BPF_ABS, BPF_H, BPF_IMM, BPF_IND, BPF_JA, BPF_JEQ, BPF_JMP, BPF_LD, BPF_LDX, BPF_MEM, BPF_MISC,
    BPF_RET, BPF_ST, BPF_TAX, BPF_W,
};
use netlink_sys::{protocols::NETLINK_NETFILTER, Socket, SocketAddr};

use super::*;
use crate::{
    conntrack::{
        message::{decode_datagram, CtMessage},
        socket::{CtSocket, Received},
        ConntrackWatcher, PortFilter, WatchOptions,
    },
    event::{CtChange, SourceEvent},
    test_support::tool,
};

// ---------------------------------------------------------------------------------------
// Messages, built as the kernel lays them out (host-order headers, big-endian ports).

const NLA_F_NESTED: u16 = 1 << 15;
const NLMSG_NOOP: u16 = 1;
const IPCTNL_MSG_CT_GET: u16 = 1;
/// `enum ctattr_l4proto`: ICMP's attributes instead of ports.
const CTA_PROTO_NUM: u16 = 1;
const CTA_PROTO_ICMP_ID: u16 = 4;

fn nla(ty: u16, payload: &[u8]) -> Vec<u8> {
    let len = u16::try_from(4 + payload.len()).unwrap();
    let mut v = [len.to_ne_bytes(), ty.to_ne_bytes()].concat();
    v.extend_from_slice(payload);
    v.resize(v.len().div_ceil(4) * 4, 0);
    v
}

fn nest(ty: u32, children: &[Vec<u8>]) -> Vec<u8> {
    nla(
        u16::try_from(ty).unwrap() | NLA_F_NESTED,
        &children.concat(),
    )
}

/// CTA_TUPLE_ORIG or CTA_TUPLE_REPLY of UDP from `sport` to `dport`, after its addresses.
fn udp_tuple(ty: u32, sport: u16, dport: u16) -> Vec<u8> {
    let ip = nest(1, &[nla(1, &[192, 0, 2, 1]), nla(2, &[192, 0, 2, 2])]);
    let proto = nest(
        CTA_TUPLE_PROTO,
        &[
            nla(CTA_PROTO_NUM, &[17]),
            nla(CTA_PROTO_SRC_PORT as u16, &sport.to_be_bytes()),
            nla(CTA_PROTO_DST_PORT as u16, &dport.to_be_bytes()),
        ],
    );
    nest(ty, &[ip, proto])
}

fn icmp_tuple(ty: u32) -> Vec<u8> {
    let proto = nest(
        CTA_TUPLE_PROTO,
        &[
            nla(CTA_PROTO_NUM, &[1]),
            nla(CTA_PROTO_ICMP_ID, &53u16.to_be_bytes()),
        ],
    );
    nest(ty, &[nest(1, &[nla(1, &[192, 0, 2, 1])]), proto])
}

/// A netlink message: `nlmsghdr`, then (for a ctnetlink type) `nfgenmsg`, then `attrs`.
fn message(subsys: u16, msg: u16, attrs: &[Vec<u8>]) -> Vec<u8> {
    let nfgen: &[u8] = if subsys == NFNL_SUBSYS_CTNETLINK {
        &[libc::AF_INET as u8, 0, 0, 0]
    } else {
        &[]
    };
    let body = [nfgen, &attrs.concat()].concat();
    let len = u32::try_from(16 + body.len()).unwrap();
    let mut v = len.to_ne_bytes().to_vec();
    v.extend_from_slice(&((subsys << 8) | msg).to_ne_bytes());
    v.extend_from_slice(&[0; 10]); // flags, sequence, port id
    v.extend_from_slice(&body);
    v
}

/// A conntrack event of a UDP flow with the four ports given.
fn udp_event(msg: u16, [os, od, rs, rd]: [u16; 4]) -> Vec<u8> {
    let status = nla(3, &8u32.to_be_bytes());
    message(
        NFNL_SUBSYS_CTNETLINK,
        msg,
        &[
            udp_tuple(CTA_TUPLE_ORIG, os, od),
            udp_tuple(CTA_TUPLE_REPLY, rs, rd),
            status,
        ],
    )
}

/// Ports nobody watches in these tests.
const OTHER: u16 = 40_000;

/// The four slots, each with `port` and the others [`OTHER`].
fn in_each_slot(port: u16) -> [[u16; 4]; 4] {
    in_each_slot_with(port, || OTHER)
}

/// The four slots, each with `port` and the others `filler()`.
fn in_each_slot_with(port: u16, mut filler: impl FnMut() -> u16) -> [[u16; 4]; 4] {
    let mut out = [[0; 4]; 4];
    for (slot, ports) in out.iter_mut().enumerate() {
        let f = filler();
        *ports = [f; 4];
        ports[slot] = port;
    }
    out
}

/// What the filter must make of the messages of [`corpus`]: (message, accepted).
fn corpus(watched: &[u16], unwatched: &[u16]) -> Vec<(Vec<u8>, bool)> {
    let mut out = vec![
        // Not conntrack events: whatever they are, userspace decides.
        (message(0, NLMSG_NOOP, &[]), true),
        (message(NFNL_SUBSYS_CTNETLINK, IPCTNL_MSG_CT_GET, &[]), true),
        (
            message(
                2,
                IPCTNL_MSG_CT_NEW,
                &[udp_tuple(CTA_TUPLE_ORIG, OTHER, OTHER)],
            ),
            true,
        ),
        // Conntrack events without ports.
        (
            message(NFNL_SUBSYS_CTNETLINK, IPCTNL_MSG_CT_NEW, &[]),
            false,
        ),
        (
            message(
                NFNL_SUBSYS_CTNETLINK,
                IPCTNL_MSG_CT_DELETE,
                &[icmp_tuple(CTA_TUPLE_ORIG), icmp_tuple(CTA_TUPLE_REPLY)],
            ),
            false,
        ),
    ];
    for msg in [IPCTNL_MSG_CT_NEW, IPCTNL_MSG_CT_DELETE] {
        for &p in watched {
            out.extend(in_each_slot(p).map(|ports| (udp_event(msg, ports), true)));
        }
        for &p in unwatched {
            out.extend(in_each_slot(p).map(|ports| (udp_event(msg, ports), false)));
        }
    }
    out
}

// ---------------------------------------------------------------------------------------
// A model of classic BPF: the instructions the filter uses, as net/core/filter.c runs them.

fn nla_find(pkt: &[u8], mut at: usize, end: usize, ty: u32) -> u32 {
    while at + 4 <= end {
        let len = usize::from(u16::from_ne_bytes([pkt[at], pkt[at + 1]]));
        if len < 4 || at + len > end {
            break;
        }
        if u32::from(u16::from_ne_bytes([pkt[at + 2], pkt[at + 3]]) & 0x3fff) == ty {
            return u32::try_from(at).unwrap();
        }
        at += len.div_ceil(4) * 4;
    }
    0
}

/// What `prog` returns for `pkt` (a load out of the packet ends the program with 0).
fn run(prog: &[sock_filter], pkt: &[u8]) -> u32 {
    let (mut a, mut x, mut mem) = (0u32, 0u32, [0u32; 16]);
    let load = |at: u32, n: usize| -> Option<u32> {
        let at = usize::try_from(at).ok()?;
        let b = pkt.get(at..at.checked_add(n)?)?;
        Some(b.iter().fold(0, |v, &b| (v << 8) | u32::from(b)))
    };
    let nlattr = ancillary(libc::SKF_AD_NLATTR);
    let nlattr_nest = ancillary(libc::SKF_AD_NLATTR_NEST);
    let mut pc = 0usize;
    loop {
        let i = prog[pc];
        let code = u32::from(i.code);
        pc += 1;
        match code {
            c if c == BPF_LD | BPF_W | BPF_ABS && i.k == nlattr => {
                let at = usize::try_from(a).unwrap();
                a = if pkt.len() < 4 || at > pkt.len() - 4 {
                    0
                } else {
                    nla_find(pkt, at, pkt.len(), x)
                };
            }
            c if c == BPF_LD | BPF_W | BPF_ABS && i.k == nlattr_nest => {
                let at = usize::try_from(a).unwrap();
                a = if pkt.len() < 4 || at > pkt.len() - 4 {
                    0
                } else {
                    let len = usize::from(u16::from_ne_bytes([pkt[at], pkt[at + 1]]));
                    if len > pkt.len() - at {
                        0
                    } else {
                        nla_find(pkt, at + 4, at + len, x)
                    }
                };
            }
            c if c == BPF_LD | BPF_H | BPF_ABS => match load(i.k, 2) {
                Some(v) => a = v,
                None => return 0,
            },
            c if c == BPF_LD | BPF_H | BPF_IND => match load(x.wrapping_add(i.k), 2) {
                Some(v) => a = v,
                None => return 0,
            },
            c if c == BPF_LD | BPF_IMM => a = i.k,
            c if c == BPF_LDX | BPF_IMM => x = i.k,
            c if c == BPF_LD | BPF_MEM => a = mem[usize::try_from(i.k).unwrap()],
            c if c == BPF_ST => mem[usize::try_from(i.k).unwrap()] = a,
            c if c == BPF_MISC | BPF_TAX => x = a,
            c if c == BPF_JMP | BPF_JA => pc += usize::try_from(i.k).unwrap(),
            c if c == BPF_JMP | BPF_JEQ => {
                pc += usize::from(if a == i.k { i.jt } else { i.jf });
            }
            c if c == BPF_RET => return i.k,
            other => panic!("instruction {other:#x} at {} not modelled", pc - 1),
        }
    }
}

/// The kernel's checks of a classic program (`bpf_check_classic`): not empty, at most
/// BPF_MAXINSNS, every jump inside it, scratch memory in range, a `ret` last.
fn check(prog: &[sock_filter]) {
    assert!(
        !prog.is_empty() && prog.len() <= 4096,
        "{} instructions",
        prog.len()
    );
    for (pc, i) in prog.iter().enumerate() {
        let code = u32::from(i.code);
        let inside = |off: usize| pc + 1 + off < prog.len();
        match code & 0x07 {
            BPF_JMP if code & 0xf0 == BPF_JA => {
                assert!(inside(usize::try_from(i.k).unwrap()), "ja at {pc}");
            }
            BPF_JMP => assert!(
                inside(usize::from(i.jt)) && inside(usize::from(i.jf)),
                "jump at {pc}"
            ),
            BPF_ST => assert!(i.k < 16),
            BPF_LD if code & 0xe0 == BPF_MEM => assert!(i.k < 16),
            _ => {}
        }
    }
    assert_eq!(u32::from(prog[prog.len() - 1].code) & 0x07, BPF_RET);
}

fn program(ports: &[u16]) -> Vec<sock_filter> {
    event_filter(ports).unwrap().unwrap()
}

/// `n` ports, none next to another: 1000, 1003, 1006, …
fn spread(n: usize) -> Vec<u16> {
    (0..n)
        .map(|i| 1000 + 3 * u16::try_from(i).unwrap())
        .collect()
}

#[test]
fn no_ports_no_filter() {
    assert!(event_filter(&[]).unwrap().is_none());
}

#[test]
fn programs_keep_to_the_kernels_limits() {
    let mut last = 0;
    for n in [1, 8, RUN - 1, RUN, RUN + 1, 2 * RUN, 1000] {
        let prog = program(&spread(n));
        check(&prog);
        assert!(prog.len() > last, "{n} ports: {} instructions", prog.len());
        last = prog.len();
    }
    assert!(program(&[53]).len() < 70, "{}", program(&[53]).len());
    // Repeats and order do not matter.
    assert_eq!(program(&[53, 5353, 53]).len(), program(&[5353, 53]).len());
    // The most ports one program holds: ~1,000; more are refused, not cut.
    let most = (1000..2000)
        .take_while(|&n| event_filter(&spread(n)).is_ok())
        .last()
        .unwrap();
    check(&program(&spread(most)));
    let too_many = event_filter(&spread(most + 1));
    assert!(
        matches!(too_many, Err(FilterError::TooLong { ports, insns })
            if ports == most + 1 && insns > 4096),
        "{too_many:?}"
    );
}

#[test]
fn the_model_accepts_watched_ports_in_any_slot_and_only_them() {
    for n in [1, 8, RUN + 1, 1000] {
        let ports = spread(n);
        let prog = program(&ports);
        let unwatched: Vec<u16> = [999, 1001, 1002, ports[n - 1] + 1, 53, 0, u16::MAX]
            .into_iter()
            .collect();
        for (i, (msg, accepted)) in corpus(&ports, &unwatched).iter().enumerate() {
            let want = if *accepted { ACCEPT } else { DROP };
            assert_eq!(run(&prog, msg), want, "{n} ports, message {i}: {msg:02x?}");
        }
    }
}

#[test]
fn a_message_cut_short_is_dropped_not_read_past() {
    let prog = program(&[53]);
    let full = udp_event(IPCTNL_MSG_CT_NEW, [1000, 53, 53, 1000]);
    assert_eq!(run(&prog, &full), ACCEPT);
    // An nlmsghdr alone: a ctnetlink type, no attributes to search.
    assert_eq!(run(&prog, &full[..16]), DROP);
    assert_eq!(run(&prog, &full[..3]), DROP);
}

// ---------------------------------------------------------------------------------------
// The kernel.

/// Runs `f` on a thread of its own in a new network namespace, gone with the thread. The
/// processes it starts (`conntrack`, `nft`, `ip`) are in that namespace too.
fn in_new_netns<T: Send>(f: impl FnOnce() -> T + Send) -> T {
    std::thread::scope(|s| {
        let t = s.spawn(|| {
            nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
            f()
        });
        t.join().unwrap_or_else(|e| std::panic::resume_unwind(e))
    })
}

/// `enum nfnetlink_groups`: NFNLGRP_CONNTRACK_NEW, _UPDATE, _DESTROY.
const EVENT_GROUPS: [u32; 3] = [1, 2, 3];

/// An event socket as the watcher opens it, with the filter of `ports` or none.
fn event_socket(ports: Option<&[u16]>) -> CtSocket {
    let s = CtSocket::open().unwrap();
    if let Some(ports) = ports {
        s.attach_filter(&program(ports)).unwrap();
    }
    for g in EVENT_GROUPS {
        s.subscribe(g).unwrap();
    }
    s
}

/// The conntrack entries of what `s` has queued, until 100 ms pass without one.
fn drain(s: &mut CtSocket) -> Vec<CtMessage> {
    let mut out = Vec::new();
    while s.wait_readable(Duration::from_millis(100)).unwrap() {
        match s.recv_nonblocking().unwrap() {
            Received::Datagram(n) => {
                out.extend(decode_datagram(s.data(n)).into_iter().map(|m| m.unwrap().1));
            }
            Received::Empty => {}
            other @ (Received::Truncated(_) | Received::Overrun) => {
                panic!(
                    "{}",
                    if matches!(other, Received::Overrun) {
                        "overrun"
                    } else {
                        "truncated"
                    }
                )
            }
        }
    }
    out
}

#[test]
fn the_kernel_judges_messages_as_the_model_does() {
    if !crate::test_support::root_or_skip("unshare(CLONE_NEWNET), SO_ATTACH_FILTER") {
        return;
    }
    in_new_netns(|| {
        for ports in [vec![53], spread(1000)] {
            let prog = program(&ports);
            let mut to = Socket::new(NETLINK_NETFILTER).unwrap();
            let addr = to.bind_auto().unwrap();
            attach(to_fd(&to), &prog).unwrap();
            let mut from = Socket::new(NETLINK_NETFILTER).unwrap();
            from.bind_auto().unwrap();
            let dest = SocketAddr::new(addr.port_number(), 0);
            let messages = corpus(&ports[..ports.len().min(40)], &[52, 54, 999, 1001]);
            // Spot checks of the last runs of a long list too.
            let mut messages = messages;
            if ports.len() > 40 {
                for &p in &ports[ports.len() - 300..] {
                    messages
                        .extend(in_each_slot(p).map(|s| (udp_event(IPCTNL_MSG_CT_NEW, s), true)));
                }
            }
            // netlink_unicast queues the message (or drops it) before send returns: each
            // is judged on its own, and the receive buffer never fills.
            let mut buf = vec![0u8; 65536];
            for (i, (msg, accepted)) in messages.iter().enumerate() {
                from.send_to(msg, &dest, 0).unwrap();
                let got = match to.recv(&mut &mut buf[..], libc::MSG_DONTWAIT) {
                    Ok(n) => Some(buf[..n].to_vec()),
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => None,
                    Err(e) => panic!("recv: {e}"),
                };
                let what = format!("{} ports, message {i}: {msg:02x?}", ports.len());
                assert_eq!(got.as_ref(), accepted.then_some(msg), "{what}");
                assert_eq!(run(&prog, msg) == ACCEPT, *accepted, "{what}");
            }
        }
    });
}

fn to_fd(s: &Socket) -> std::os::fd::BorrowedFd<'_> {
    use std::os::fd::AsRawFd;
    // SAFETY: the fd stays open while `s` lives, which outlives the borrow.
    unsafe { std::os::fd::BorrowedFd::borrow_raw(s.as_raw_fd()) }
}

/// `conntrack -I` of a UDP entry 192.0.2.1:`sport` → 192.0.2.2:`dport`, with the reply
/// tuple's ports given (a NAT: the addresses follow).
fn insert(sport: u16, dport: u16, reply: (u16, u16)) -> bool {
    let p = |v: u16| v.to_string();
    tool(
        "conntrack",
        &[
            "-I",
            "-p",
            "udp",
            "-s",
            "192.0.2.1",
            "-d",
            "192.0.2.2",
            "--sport",
            &p(sport),
            "--dport",
            &p(dport),
            "-r",
            "192.0.2.3",
            "-q",
            "192.0.2.1",
            "--reply-port-src",
            &p(reply.0),
            "--reply-port-dst",
            &p(reply.1),
            "-t",
            "60",
        ],
    )
}

fn ports_of(m: &CtMessage) -> Option<(CtChange, [u16; 4])> {
    match m {
        CtMessage::Entry { change, entry } => Some((
            *change,
            [
                entry.orig.src,
                entry.orig.dst,
                entry.reply.src,
                entry.reply.dst,
            ]
            .map(|a| a.port()),
        )),
        _ => None,
    }
}

#[test]
fn conntrack_events_reach_the_filtered_socket_only_for_watched_ports() {
    if !crate::test_support::root_or_skip("unshare(CLONE_NEWNET), ctnetlink") {
        return;
    }
    in_new_netns(|| {
        let watched = spread(1000);
        let mut filtered = event_socket(Some(&watched));
        let mut plain = event_socket(None);
        // Each watched port in each slot, first and last of each run of comparisons,
        // and ports next to them.
        let mut samples = Vec::new();
        for run in watched.chunks(RUN) {
            samples.extend([run[0], run[run.len() - 1]]);
        }
        let unwatched = [999, 1001, watched[999] + 1, 53];
        // Other ports of each entry its own, so no two entries have a tuple in common.
        let mut filler = OTHER..;
        let mut filler = || filler.next().unwrap();
        for &p in samples.iter().chain(&unwatched) {
            for [os, od, rs, rd] in in_each_slot_with(p, &mut filler) {
                if !insert(os, od, (rs, rd)) {
                    return;
                }
            }
        }
        assert!(tool(
            "conntrack",
            &[
                "-I",
                "-p",
                "icmp",
                "-s",
                "192.0.2.1",
                "-d",
                "192.0.2.2",
                "--icmp-type",
                "8",
                "--icmp-code",
                "0",
                "--icmp-id",
                "1000",
                "-t",
                "60"
            ]
        ));
        // UPDATE, then DESTROY, of every entry.
        assert!(tool(
            "conntrack",
            &["-U", "-p", "udp", "-s", "192.0.2.1", "-t", "100"]
        ));
        assert!(tool("conntrack", &["-F"]));
        let (filtered, plain) = (drain(&mut filtered), drain(&mut plain));
        let portless = plain
            .iter()
            .filter(|m| **m == CtMessage::OtherProtocol)
            .count();
        assert_eq!(portless, 2, "the ICMP entry's NEW and DESTROY: {plain:?}");
        let keep = PortFilter::new(&watched);
        let want: Vec<&CtMessage> = plain
            .iter()
            .filter(|m| matches!(m, CtMessage::Entry { entry, .. } if keep.matches(entry)))
            .collect();
        let per_change = |c| {
            want.iter()
                .filter(|m| matches!(m, CtMessage::Entry { change, .. } if *change == c))
                .count()
        };
        let n = samples.len() * 4;
        assert_eq!(
            [
                per_change(CtChange::New),
                per_change(CtChange::Update),
                per_change(CtChange::Destroy)
            ],
            [n, n, n]
        );
        assert_eq!(plain.len(), 3 * (n + unwatched.len() * 4) + portless);
        let got: Vec<_> = filtered.iter().map(ports_of).collect();
        let want: Vec<_> = want.into_iter().map(ports_of).collect();
        assert_eq!(got, want);
    });
}

// ---------------------------------------------------------------------------------------
// Real flows, through the watcher.

/// In the namespace of the calling thread: `lo` up, conntrack on for locally sent packets
/// (an nftables rule that needs it), UDP entries expiring after `udp_timeout` s.
fn conntrack_on_loopback(udp_timeout: u32) -> bool {
    if !tool("ip", &["link", "set", "lo", "up"]) {
        return false;
    }
    let rules = "table inet ut { chain out { type filter hook output priority 0; \
                 ct state new counter; }; }";
    if !tool("nft", &[rules]) {
        return false;
    }
    std::fs::write(
        "/proc/sys/net/netfilter/nf_conntrack_udp_timeout",
        udp_timeout.to_string(),
    )
    .unwrap();
    true
}

/// Sends one datagram to `127.x.y.z:port` for each of `flows`, a new flow each.
fn send_flows(sock: &UdpSocket, net: u8, flows: std::ops::Range<u32>, port: u16) {
    for i in flows {
        let [_, _, y, z] = i.to_be_bytes();
        let x = net.wrapping_add(u8::try_from(i >> 16).unwrap_or(0));
        // Refused (ICMP port unreachable) or not, the flow is tracked.
        let _ = sock.send_to(b"x", (Ipv4Addr::new(127, x, y, z), port));
    }
}

fn watch_options(kernel_filter: bool) -> WatchOptions {
    WatchOptions {
        ports: vec![53],
        kernel_filter,
        ..WatchOptions::default()
    }
}

/// Events of the watcher until 200 ms pass without one.
fn watch_until_quiet(w: &mut ConntrackWatcher) -> Vec<SourceEvent> {
    let mut out = Vec::new();
    while w.next_events(&mut out, Duration::from_millis(200)).unwrap() > 0 {}
    out
}

#[test]
fn flows_of_other_ports_never_reach_the_filtered_watcher() {
    if !crate::test_support::root_or_skip("unshare(CLONE_NEWNET), ctnetlink, nftables") {
        return;
    }
    in_new_netns(|| {
        if !conntrack_on_loopback(30) {
            return;
        }
        let mut filtered = ConntrackWatcher::open_with(1, &watch_options(true)).unwrap();
        let mut plain = ConntrackWatcher::open_with(2, &watch_options(false)).unwrap();
        assert!(filtered.kernel_filter());
        assert!(!plain.kernel_filter());
        let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
        send_flows(&sock, 1, 1..1001, 9999);
        send_flows(&sock, 2, 1..6, 53);
        assert!(tool("conntrack", &["-F"]));
        let (f, p) = (
            watch_until_quiet(&mut filtered),
            watch_until_quiet(&mut plain),
        );
        let dns = |e: &Vec<SourceEvent>, change| {
            e.iter()
                .filter(|e| {
                    matches!(e, SourceEvent::Conntrack(c)
                    if c.change == change && c.orig.dst.port() == 53)
                })
                .count()
        };
        for (events, w) in [(&f, &filtered), (&p, &plain)] {
            assert_eq!(events.len(), 10, "{events:?}");
            assert_eq!(
                [dns(events, CtChange::New), dns(events, CtChange::Destroy)],
                [5, 5]
            );
            assert_eq!(w.lost(), 0);
        }
        let read_and_dropped = |w: &ConntrackWatcher| w.counters().filtered.load(Ordering::Relaxed);
        assert_eq!(
            read_and_dropped(&filtered),
            0,
            "no event of port 9999 was read"
        );
        assert_eq!(read_and_dropped(&plain), 2000, "NEW and DESTROY of each");
    });
}

/// The thread's CPU time so far.
fn thread_cpu() -> Duration {
    use nix::sys::resource::{getrusage, UsageWho};
    let u = getrusage(UsageWho::RUSAGE_THREAD).unwrap();
    let d = |t: nix::sys::time::TimeVal| {
        Duration::from_secs(u64::try_from(t.tv_sec()).unwrap())
            + Duration::from_micros(u64::try_from(t.tv_usec()).unwrap())
    };
    d(u.user_time()) + d(u.system_time())
}

/// The figures of the commit: `cargo test -p tracer --release --lib flood -- --ignored
/// --nocapture` (root). 20,000 new UDP flows/s on port 9999 and 100/s on port 53 for 3 s,
/// then the table flushed: a NEW and a DESTROY event of each flow. Two watchers of port 53 on
/// threads of their own, one with the kernel filter, one without (receive buffers large
/// enough for the flush, so neither overruns): the CPU time of each over the flood's 3 s is
/// what it costs a node that makes that many flows a second.
#[test]
#[ignore = "a measurement: a 3 s flood of conntrack entries (root)"]
fn flood_of_other_ports_costs_the_filtered_watcher_nothing() {
    in_new_netns(|| {
        assert!(conntrack_on_loopback(30));
        let stop = Arc::new(AtomicBool::new(false));
        let watcher = |kernel_filter: bool| {
            let stop = Arc::clone(&stop);
            let opts = WatchOptions {
                rcvbuf: 256 << 20,
                ..watch_options(kernel_filter)
            };
            // Spawned from the namespace's thread: in the namespace too.
            std::thread::spawn(move || {
                let mut w = ConntrackWatcher::open_with(0, &opts).unwrap();
                let cpu0 = thread_cpu();
                let mut out = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    w.next_events(&mut out, Duration::from_millis(50)).unwrap();
                    out.clear();
                }
                let c = w.counters();
                (
                    thread_cpu() - cpu0,
                    c.snapshot(),
                    c.filtered.load(Ordering::Relaxed),
                )
            })
        };
        let (filtered, plain) = (watcher(true), watcher(false));
        std::thread::sleep(Duration::from_millis(200));
        let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
        let (rate, secs, tick) = (20_000u32, 3u32, Duration::from_millis(10));
        let per_tick = rate / 100;
        let start = Instant::now();
        for t in 0..secs * 100 {
            send_flows(&sock, 1, 1 + t * per_tick..1 + (t + 1) * per_tick, 9999);
            send_flows(&sock, 2, 1 + t..2 + t, 53);
            let next = tick * (t + 1);
            if let Some(wait) = next.checked_sub(start.elapsed()) {
                std::thread::sleep(wait);
            }
        }
        let flood = start.elapsed();
        assert!(tool("conntrack", &["-F"]));
        std::thread::sleep(Duration::from_secs(2));
        stop.store(true, Ordering::Relaxed);
        let flows = secs * (rate + 100);
        println!(
            "{flows} flows in {:.2} s ({:.0}/s), then flushed",
            flood.as_secs_f64(),
            f64::from(flows) / flood.as_secs_f64(),
        );
        for (name, t) in [("kernel filter", filtered), ("userspace only", plain)] {
            let (cpu, c, dropped) = t.join().unwrap();
            let read = c.events + dropped;
            println!(
                "{name:>14}: CPU {:>6.1} ms = {:>5.2} % of a core over the flood; read {read} \
                 events ({:.2} µs each): {} handed out, {dropped} dropped here; overruns {}, \
                 lost {}",
                cpu.as_secs_f64() * 1e3,
                100.0 * cpu.as_secs_f64() / flood.as_secs_f64(),
                cpu.as_secs_f64() * 1e6 / read.max(1) as f64,
                c.events,
                c.overruns,
                c.lost
            );
        }
    });
}
