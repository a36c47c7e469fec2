use super::drop::ct_record;
use super::shed::question_key_of;
use super::*;
use crate::event::{CtSnapshot, Direction};
use crate::output::record::Record;
use std::sync::{Arc, RwLock};

/// `medium.lab.test. TXT`: 8 answers of 62 bytes of text each, id 77.
fn txt_response() -> Vec<u8> {
    use hickory_proto::{
        op::{Message, MessageType, OpCode, Query},
        rr::{rdata::TXT, Name, RData, Record as HRecord, RecordType},
    };
    let name = Name::from_ascii("medium.lab.test.").unwrap();
    let mut m = Message::new(77, MessageType::Response, OpCode::Query);
    m.add_query(Query::query(name.clone(), RecordType::TXT));
    for i in 0..8 {
        let text = format!("{i:02}{}", "x".repeat(60));
        m.add_answer(HRecord::from_rdata(
            name.clone(),
            300,
            RData::TXT(TXT::new(vec![text])),
        ));
    }
    m.to_vec().unwrap()
}

fn ipv4(proto: u8, l4: &[u8]) -> Vec<u8> {
    let total = (20 + l4.len()) as u16;
    let mut p = vec![0x45, 0, 0, 0, 0, 1, 0, 0, 64, proto, 0, 0];
    p[2..4].copy_from_slice(&total.to_be_bytes());
    p.extend_from_slice(&[10, 250, 0, 53, 10, 244, 1, 2]);
    p.extend_from_slice(l4);
    p
}

fn udp(payload: &[u8]) -> Vec<u8> {
    let mut u = vec![0, 53, 0x9c, 0x40];
    u.extend_from_slice(&(8 + payload.len() as u16).to_be_bytes());
    u.extend_from_slice(&[0, 0]);
    u.extend_from_slice(payload);
    ipv4(17, &u)
}

/// A data segment (PSH|ACK) at sequence `seq`.
fn tcp(seq: u32, payload: &[u8]) -> Vec<u8> {
    let mut t = vec![0, 53, 0x9c, 0x40];
    t.extend_from_slice(&seq.to_be_bytes());
    t.extend_from_slice(&[0, 0, 0, 1, 0x50, 0x18, 0xff, 0xff, 0, 0, 0, 0]);
    t.extend_from_slice(payload);
    ipv4(6, &t)
}

fn decoder() -> Decoder {
    let names = Arc::new(RwLock::new(crate::kernel::attach::Names::default()));
    let mut d = Decoder::new(Clock::Epoch, names, Kallsyms::default(), HashMap::new());
    d.collect_observations();
    d
}

/// `data` as captured at ingress of interface 1 at `ts_ns`, `orig_len` bytes on the wire.
fn captured(ts_ns: u64, data: &[u8], orig_len: usize) -> CapturedPacket {
    CapturedPacket {
        ts_ns,
        cpu: None,
        at: ObservationPoint {
            netns: 0,
            ifindex: 1,
            dir: Direction::Ingress,
        },
        vlan: None,
        orig_len: orig_len as u32,
        data: data.to_vec().into(),
    }
}

/// Feeds the first `caplen` bytes of `packet`, which was `orig_len` bytes on the wire.
fn feed(d: &mut Decoder, packet: &[u8], caplen: usize, orig_len: usize) -> PacketRecord {
    let mut out = Vec::new();
    d.on_packet(captured(1, &packet[..caplen], orig_len), &mut out);
    match out.pop() {
        Some(Record::Packet(p)) => p,
        other => panic!("no packet record: {other:?}"),
    }
}

/// Feeds whole packets; returns every record they produced.
fn feed_all(d: &mut Decoder, packets: &[Vec<u8>]) -> Vec<Record> {
    let mut out = Vec::new();
    for (i, p) in packets.iter().enumerate() {
        d.on_packet(captured(i as u64 + 1, p, p.len()), &mut out);
    }
    out
}

/// docs/output.md's accounting: every packet counted once.
fn accounted(s: &DecodeStats) -> bool {
    s.packets + s.tcp_messages
        == s.decoded
            + s.capture_truncated
            + s.malformed
            + s.tcp_control
            + s.tcp_data
            + s.other
            + s.summarised
            + s.fragments_merged
            + s.fragments_incomplete
            + s.fragments_pending
}

fn framed(m: &[u8]) -> Vec<u8> {
    let mut v = (m.len() as u16).to_be_bytes().to_vec();
    v.extend_from_slice(m);
    v
}

/// The stream ends 10 bytes into a message that promised 65535: at the end, that is a
/// malformed record saying so, and every packet is accounted for.
#[test]
fn tcp_message_cut_short_by_the_end_of_the_stream_is_malformed_at_finish() {
    let mut d = decoder();
    let mut partial = vec![0xff, 0xff];
    partial.extend_from_slice(&[0xab; 8]);
    let out = feed_all(&mut d, &[tcp(1000, &partial), tcp(1010, &[])]);
    assert!(out.is_empty(), "{out:?}");
    let s = d.stats();
    assert_eq!(
        (s.packets, s.tcp_data, s.tcp_control, s.malformed),
        (2, 1, 1, 0)
    );
    let mut out = Vec::new();
    d.finish(0, &mut out);
    let [Record::Packet(r)] = &out[..] else {
        panic!("{out:?}")
    };
    let why = r.malformed.as_deref().unwrap();
    assert!(
        why.contains("stream ended 65527 bytes short of a 65535-byte message"),
        "{why}"
    );
    assert_eq!(
        (r.proto, r.len, r.caplen, r.ts_ns),
        (crate::decode::record::Proto::Tcp, 0, 0, 2)
    );
    let s = d.stats();
    assert_eq!((s.malformed, s.tcp_messages), (1, 1));
    assert!(accounted(&s), "{s:?}");
    // Nothing is reported twice.
    d.finish(0, &mut out);
    assert_eq!(out.len(), 1);
}

/// Two messages over three segments (one split across two, two in one) and a bare ACK:
/// segments and messages are counted apart and the accounting holds.
#[test]
fn tcp_segments_and_messages_are_accounted_apart() {
    let msg = txt_response();
    let mut stream = framed(&msg);
    stream.extend(framed(&msg));
    let (a, rest) = stream.split_at(100);
    let (b, c) = rest.split_at(rest.len() - 50);
    let out = {
        let mut d = decoder();
        let out = feed_all(
            &mut d,
            &[
                tcp(1, a),
                tcp(1 + a.len() as u32, b),
                tcp(1 + (a.len() + b.len()) as u32, c),
                tcp(1 + stream.len() as u32, &[]),
            ],
        );
        let s = d.stats();
        assert_eq!(
            (
                s.packets,
                s.tcp_data,
                s.tcp_control,
                s.decoded,
                s.tcp_messages
            ),
            (4, 3, 1, 2, 2)
        );
        assert!(accounted(&s), "{s:?}");
        out
    };
    assert_eq!(out.len(), 2);
}

#[test]
fn cut_udp_answer_is_decoded_as_far_as_it_goes() {
    let msg = txt_response();
    let pkt = udp(&msg);
    let mut d = decoder();
    // 200 bytes of DNS (the --snaplen) after 28 bytes of headers.
    let r = feed(&mut d, &pkt, 28 + 200, pkt.len());
    assert!(r.capture_truncated && r.malformed.is_none(), "{r:?}");
    let m = r.dns.as_ref().unwrap();
    assert_eq!(m.questions[0].name, "medium.lab.test.");
    // Header and question: 33 bytes; each answer 2 + 10 + 1 + 62 = 75 bytes.
    assert_eq!(m.answers.len(), 2);
    let cut = m.cut.unwrap();
    assert_eq!((cut.captured_bytes, cut.message_bytes), (200, msg.len()));
    assert_eq!(cut.answers, 6);
    let s = d.stats();
    assert_eq!((s.decoded, s.malformed, s.capture_truncated), (0, 0, 1));
    // The correlate stage gets it.
    let mut obs = Vec::new();
    d.take_observed(&mut obs);
    assert!(
        matches!(&obs[..], [Observed::Message(o)] if o.msg.cut == Some(cut)),
        "{obs:?}"
    );
    let json = serde_json::to_value(Record::Packet(r)).unwrap();
    assert_eq!(json["capture_truncated"], true);
    assert!(json.get("malformed").is_none());

    // The header itself cut: no message, still not malformed.
    let r = feed(&mut d, &pkt, 28 + 7, pkt.len());
    assert!(r.capture_truncated && r.dns.is_none() && r.malformed.is_none());
    assert!(crate::output::text::packet_line(&r).contains("[|domain"));
    // Whole: decoded, no mark.
    let r = feed(&mut d, &pkt, pkt.len(), pkt.len());
    assert!(!r.capture_truncated && r.dns.unwrap().cut.is_none());
    let json =
        serde_json::to_value(Record::Packet(feed(&mut d, &pkt, pkt.len(), pkt.len()))).unwrap();
    assert!(json.get("capture_truncated").is_none(), "{json}");
    let s = d.stats();
    assert_eq!((s.decoded, s.malformed, s.capture_truncated), (2, 0, 2));
}

/// Short though nothing was cut on capture (the wire had only these bytes): malformed.
#[test]
fn short_message_not_cut_by_the_capture_is_malformed() {
    let msg = txt_response();
    let pkt = udp(&msg);
    let mut d = decoder();
    let r = feed(&mut d, &pkt, 28 + 200, 28 + 200);
    assert!(!r.capture_truncated && r.dns.is_none());
    let why = r.malformed.unwrap();
    assert!(why.contains("runs past the end"), "{why}");
    assert!(why.contains("promise"), "{why}");
    // Only Ethernet padding cut (the IP packet itself whole): a whole message.
    let r = feed(&mut d, &pkt, pkt.len(), pkt.len() + 6);
    assert!(!r.capture_truncated && r.dns.is_some());
    let s = d.stats();
    assert_eq!((s.decoded, s.malformed, s.capture_truncated), (1, 1, 0));
}

#[test]
fn cut_tcp_answer_is_decoded_as_far_as_it_goes() {
    let msg = txt_response();
    let mut framed = (msg.len() as u16).to_be_bytes().to_vec();
    framed.extend_from_slice(&msg);
    let pkt = tcp(1000, &framed);
    let mut d = decoder();
    let r = feed(&mut d, &pkt, 40 + 300, pkt.len());
    assert!(r.capture_truncated && r.malformed.is_none(), "{r:?}");
    let m = r.dns.unwrap();
    let cut = m.cut.unwrap();
    assert_eq!((cut.captured_bytes, cut.message_bytes), (298, msg.len()));
    assert_eq!(m.answers.len(), 3);
    let s = d.stats();
    assert_eq!((s.decoded, s.malformed, s.capture_truncated), (0, 0, 1));
    assert_eq!(s.tcp_bytes_dropped, 0);
}

/// What the TCP reassembler gave up on reaches the stats: a message cut by the capture
/// and a hole in a stream.
#[test]
fn tcp_cuts_and_gaps_reach_the_stats() {
    let msg = txt_response();
    let mut framed = (msg.len() as u16).to_be_bytes().to_vec();
    framed.extend_from_slice(&msg);
    let mut d = decoder();
    let pkt = tcp(1000, &framed);
    feed(&mut d, &pkt, 40 + 300, pkt.len());
    let s = d.stats();
    assert_eq!((s.tcp_cut, s.tcp_gaps), (1, 0));
    // Another flow: its first 100 bytes, then a segment 50 bytes further on, then the
    // end of input with the hole still open.
    let mut d = decoder();
    let mut out: Vec<Record> = Vec::new();
    for (i, (seq, range)) in [(5000u32, 0..100), (5150, 150..framed.len())]
        .into_iter()
        .enumerate()
    {
        let pkt = tcp(seq, &framed[range]);
        d.on_packet(captured(i as u64 + 1, &pkt, pkt.len()), &mut out);
    }
    d.finish(10, &mut out);
    let s = d.stats();
    assert_eq!((s.tcp_cut, s.tcp_gaps), (0, 1));
    assert!(s.tcp_bytes_dropped > 0, "{s:?}");
    let json = serde_json::to_value(Record::Stats(Box::new(
        crate::output::record::StatsRecord::new(s, None),
    )))
    .unwrap();
    assert_eq!(
        (json["tcp_gaps"].as_u64(), json["tcp_cut"].as_u64()),
        (Some(1), Some(0))
    );
}

#[test]
fn normal_socket_life_is_benign_and_netfilter_is_not() {
    assert!(benign_drop("QUEUE_PURGE", "sk_stream_kill_queues", None).is_some());
    assert!(benign_drop("NOT_SPECIFIED", "udp_destruct_common", None).is_some());
    assert!(benign_drop("NOT_SPECIFIED", "tcp_v4_rcv", Some((0x02, true))).is_some());
    assert!(benign_drop("NOT_SPECIFIED", "tcp_v6_rcv", Some((0x10, true))).is_some());
    // A segment with data dropped there is not handshake bookkeeping.
    assert!(benign_drop("NOT_SPECIFIED", "tcp_v4_rcv", Some((0x18, false))).is_none());
    assert!(benign_drop("NETFILTER_DROP", "nf_hook_slow", None).is_none());
    assert!(benign_drop("NO_SOCKET", "__udp4_lib_rcv", None).is_none());
}

#[test]
fn question_keys_match_from_wire_and_text() {
    // id 0x1234, RD, 1 question: WWW.Lab.test A IN (mixed case, DNS 0x20)
    let mut msg = vec![0x12, 0x34, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0];
    msg.extend(b"\x03WWW\x03Lab\x04test\x00\x00\x01\x00\x01");
    let mut buf = [0u8; 264];
    let wire = question_key(&msg, &mut buf).unwrap().to_vec();
    assert_eq!(
        wire,
        question_key_of("www.lab.test.", "A".into(), "IN".into())
            .unwrap()
            .to_vec()
    );
    assert_ne!(
        wire,
        question_key_of("www.lab.test.", "AAAA".into(), "IN".into())
            .unwrap()
            .to_vec()
    );
    // Compression in a question, truncation, no question: no key, no panic.
    let mut ptr = msg[..12].to_vec();
    ptr.extend([0xc0, 0x0c, 0, 1, 0, 1]);
    assert!(question_key(&ptr, &mut buf).is_none());
    assert!(question_key(&msg[..20], &mut buf).is_none());
    let mut none = msg.clone();
    none[5] = 0;
    assert!(question_key(&none, &mut buf).is_none());
}

#[test]
fn conntrack_status_names() {
    let flow =
        |s, d| crate::test_support::fixtures::ct_flow(tracer_common::proto::IPPROTO_UDP, s, d);
    let r = ct_record(&CtSnapshot {
        status: 0x1a0,
        orig: flow("10.244.1.2:5000", "10.96.0.10:53"),
        reply: flow("10.244.1.3:53", "10.244.1.2:5000"),
    });
    assert_eq!(
        r.status_flags,
        vec!["DST_NAT", "SRC_NAT_DONE", "DST_NAT_DONE"]
    );
    assert!(!r.confirmed);
    assert_eq!(r.orig.dst, "10.96.0.10:53");
}

/// Names are remembered per place, but a name learned (or changed) later is the one the next
/// packets there get; places never seen get their stand-ins.
#[test]
fn records_name_their_place_as_the_names_are_now() {
    let names = Arc::new(RwLock::new(crate::kernel::attach::Names::default()));
    let mut d = Decoder::new(
        Clock::Epoch,
        Arc::clone(&names),
        Kallsyms::default(),
        HashMap::new(),
    );
    let packet = udp(&txt_response());
    let at = |d: &mut Decoder| {
        let r = feed(d, &packet, packet.len(), packet.len());
        (r.netns.to_string(), r.ifname.to_string())
    };
    assert_eq!(at(&mut d), ("netns:0x0".to_string(), "if1".to_string()));
    names.write().unwrap().learn(0, "client", 1, "eth0");
    assert_eq!(at(&mut d), ("client".to_string(), "eth0".to_string()));
    assert_eq!(at(&mut d), ("client".to_string(), "eth0".to_string()));
    names.write().unwrap().learn(0, "client", 1, "eth1");
    assert_eq!(at(&mut d), ("client".to_string(), "eth1".to_string()));
    // Many other places in between, more than are remembered: still right.
    for i in 2..40 {
        names
            .write()
            .unwrap()
            .learn(0, "client", i, &format!("veth{i}"));
    }
    for i in (2..40).chain(2..40) {
        let mut out = Vec::new();
        let mut p = captured(1, &packet, packet.len());
        p.at.ifindex = i;
        d.on_packet(p, &mut out);
        let Some(Record::Packet(r)) = out.pop() else {
            panic!("no packet record")
        };
        assert_eq!(&*r.ifname, format!("veth{i}"));
    }
    assert_eq!(at(&mut d), ("client".to_string(), "eth1".to_string()));
}

/// The agent's decoder: every packet decoded, counted and observed; records only for the
/// malformed and cut ones. The same message at two hops is decoded once and shared.
/// Held packet records (trace's output queue full): whole messages get none and are counted
/// as held; malformed and cut ones still get theirs; every packet is decoded, counted and
/// observed; once released, records come again. With only the unusual packets wanted
/// (the agent), nothing is counted as held.
#[test]
fn held_packet_records_are_counted_and_still_observed() {
    let whole = txt_response();
    let good = udp(&whole);
    let malformed = udp(&whole[..20]);
    let mut d = decoder();
    let mut out: Vec<Record> = Vec::new();
    d.hold_packet_records(true);
    d.on_packet(captured(1, &good, good.len()), &mut out);
    d.on_packet(captured(2, &good, good.len()), &mut out);
    d.on_packet(captured(3, &malformed, malformed.len()), &mut out);
    assert_eq!(out.len(), 1, "only the malformed one's record");
    assert_eq!(d.take_held(), 2);
    assert_eq!(d.take_held(), 0);
    d.hold_packet_records(false);
    d.on_packet(captured(4, &good, good.len()), &mut out);
    assert_eq!(out.len(), 2);
    assert_eq!(d.take_held(), 0);
    let s = d.stats();
    assert_eq!((s.packets, s.decoded, s.malformed), (4, 3, 1));
    assert!(accounted(&s));
    let mut observed = Vec::new();
    d.take_observed(&mut observed);
    assert_eq!(observed.len(), 3, "every whole message observed");

    let mut agent = decoder();
    agent.unusual_packets_only();
    agent.hold_packet_records(true);
    agent.on_packet(captured(1, &good, good.len()), &mut out);
    assert_eq!(agent.take_held(), 0);
}

#[test]
fn unusual_packets_only_still_decodes_counts_and_observes_every_packet() {
    let mut d = decoder();
    d.unusual_packets_only();
    let whole = txt_response();
    let good = udp(&whole);
    let malformed = udp(&whole[..20]);
    let cut = udp(&whole);
    let mut out = Vec::new();
    d.on_packet(captured(1, &good, good.len()), &mut out);
    d.on_packet(captured(2, &good, good.len()), &mut out);
    d.on_packet(captured(3, &malformed, malformed.len()), &mut out);
    d.on_packet(captured(4, &cut[..200], cut.len()), &mut out);
    let kinds: Vec<_> = out
        .iter()
        .map(|r| match r {
            Record::Packet(p) => (p.malformed.is_some(), p.capture_truncated),
            other => panic!("not a packet record: {other:?}"),
        })
        .collect();
    assert_eq!(kinds, [(true, false), (false, true)]);
    let s = d.stats();
    assert_eq!(
        (s.packets, s.decoded, s.malformed, s.capture_truncated),
        (4, 2, 1, 1)
    );
    assert!(accounted(&s));
    let mut observed = Vec::new();
    d.take_observed(&mut observed);
    // Both whole ones and the cut one (its question was captured) go to correlation.
    let msgs: Vec<_> = observed
        .iter()
        .filter_map(|o| match o {
            Observed::Message(m) => Some(&m.msg),
            Observed::Drop(_) => None,
        })
        .collect();
    assert_eq!(msgs.len(), 3);
    assert!(Arc::ptr_eq(msgs[0], msgs[1]), "one decode for both hops");
    assert_eq!(msgs[0].answers.len(), 8);
}

/// The decoder on tunnel packets: GRE with key and sequence number, Geneve with options,
/// IP-in-IP and IPv6 in IPv4 around a TXT answer: each decoded as the packet inside, with
/// its tunnel on the record and the observation; a cut snaplen inside the tunnel still cuts
/// the message; hostile tunnel headers are malformed records, counted; ARP in VXLAN is other.
#[test]
fn tunnelled_packets_are_decoded_inside_their_tunnel() {
    use crate::decode::tunnel::TunnelKind;
    let inner = udp(&txt_response());
    let outer = |proto: u8, body: &[u8]| {
        let mut p = ipv4(proto, body);
        p[12..20].copy_from_slice(&[10, 200, 0, 1, 10, 200, 0, 2]);
        p
    };
    let mut gre = vec![0x30, 0, 0x08, 0, 0, 0, 0, 42, 0, 0, 0, 7];
    gre.extend_from_slice(&inner);
    // UDP to 6081; Geneve with two words of options, Ethernet inside, VNI 9.
    let mut geneve = vec![
        0xc3, 0x50, 0x17, 0xc1, 0, 0, 0, 0, 2, 0, 0x65, 0x58, 0, 0, 9, 0,
    ];
    geneve.extend_from_slice(&[1, 2, 0x80, 1, 0xaa, 0xbb, 0xcc, 0xdd]);
    geneve.extend_from_slice(&[2, 0, 0, 0, 0, 2, 2, 0, 0, 0, 0, 1, 0x08, 0]);
    geneve.extend_from_slice(&inner);
    let mut ip6 = vec![0x60, 0, 0, 0, 0, 0, 17, 64];
    ip6.extend_from_slice(&[0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]);
    ip6.extend_from_slice(&[0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2]);
    ip6.extend_from_slice(&inner[20..]);
    let l = (inner.len() - 20) as u16;
    ip6[4..6].copy_from_slice(&l.to_be_bytes());
    let cases = [
        (
            outer(47, &gre),
            TunnelKind::Gre,
            Some(42),
            "10.244.1.2:40000",
        ),
        (
            outer(17, &geneve),
            TunnelKind::Geneve,
            Some(9),
            "10.244.1.2:40000",
        ),
        (outer(4, &inner), TunnelKind::Ipip, None, "10.244.1.2:40000"),
        (outer(41, &ip6), TunnelKind::Ip6in4, None, "[fd00::2]:40000"),
    ];
    for (packet, kind, id, dst) in cases {
        let mut d = decoder();
        let r = feed(&mut d, &packet, packet.len(), packet.len());
        assert!(r.malformed.is_none(), "{kind:?}: {:?}", r.malformed);
        assert_eq!(r.dns.as_ref().unwrap().id, 77, "{kind:?}");
        assert_eq!(r.dst.to_string(), dst, "{kind:?}");
        assert_eq!(r.len as usize, packet.len(), "the outer length");
        let t = r.tunnel.as_deref().unwrap();
        assert_eq!((t.kind, t.id), (kind, id));
        assert_eq!(t.src.to_string(), "10.200.0.1");
        let mut obs = Vec::new();
        d.take_observed(&mut obs);
        match &obs[..] {
            [crate::decode::observation::Observed::Message(o)] => {
                assert_eq!(o.tunnel.as_deref(), Some(t));
            }
            other => panic!("{other:?}"),
        }
        // Cut by a snaplen inside the tunnel: the message is cut, not malformed.
        let mut d = decoder();
        let r = feed(&mut d, &packet, packet.len() - 300, packet.len());
        assert!(r.capture_truncated, "{kind:?}: {:?}", r.malformed);
        assert!(r.tunnel.is_some());
    }
    // Hostile: GRE routing bit, Geneve options past the end, a cut inner header.
    let mut d = decoder();
    let mut routing = gre.clone();
    routing[0] = 0x40;
    let mut long_opts = geneve.clone();
    long_opts[8] = 0x3f;
    long_opts.truncate(40);
    for packet in [outer(47, &routing), outer(17, &long_opts), outer(4, &ip6)] {
        let r = feed(&mut d, &packet, packet.len(), packet.len());
        let why = r.malformed.unwrap();
        assert!(why.starts_with("tunnel: "), "{why}");
        assert_eq!(r.src.to_string(), "10.200.0.1");
        assert!(r.tunnel.is_none() && r.dns.is_none());
    }
    assert_eq!(d.stats.malformed, 3);
    // ARP in VXLAN: counted as other, no record.
    let mut vxlan = vec![0xc8, 0, 0x21, 0x18, 0, 0, 0, 0, 8, 0, 0, 0, 0, 0, 1, 0];
    vxlan.extend_from_slice(&[2, 0, 0, 0, 0, 2, 2, 0, 0, 0, 0, 1, 0x08, 0x06]);
    vxlan.extend_from_slice(&[0; 28]);
    let mut out: Vec<Record> = Vec::new();
    d.on_packet(captured(1, &outer(17, &vxlan), 70), &mut out);
    assert!(out.is_empty());
    assert_eq!(d.stats.other, 1);
    assert!(accounted(&d.stats));
}
