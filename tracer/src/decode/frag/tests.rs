use super::*;
use crate::decode::dns;
use crate::decode::{parse_ip, Transport};
use crate::event::{CapturedPacket, Direction};

const HOP: ObservationPoint = ObservationPoint {
    netns: 7,
    ifindex: 3,
    dir: Direction::Ingress,
};

/// `big.lab.test. TXT`, id 4660: `n` answers of 200 bytes of text each.
fn big_answer(n: usize) -> Vec<u8> {
    use hickory_proto::{
        op::{Message, MessageType, OpCode, Query},
        rr::{rdata::TXT, Name, RData, Record as HRecord, RecordType},
    };
    let name = Name::from_ascii("big.lab.test.").unwrap();
    let mut m = Message::new(4660, MessageType::Response, OpCode::Query);
    m.add_query(Query::query(name.clone(), RecordType::TXT));
    for i in 0..n {
        let text = format!("{i:03}{}", "y".repeat(197));
        m.add_answer(HRecord::from_rdata(
            name.clone(),
            300,
            RData::TXT(TXT::new(vec![text])),
        ));
    }
    m.to_vec().unwrap()
}

fn udp(payload: &[u8]) -> Vec<u8> {
    let mut u = vec![0, 53, 0x9c, 0x40];
    u.extend_from_slice(&(8 + payload.len() as u16).to_be_bytes());
    u.extend_from_slice(&[0, 0]);
    u.extend_from_slice(payload);
    u
}

/// IPv4 fragments of `l4` with `size` bytes of data each (the last shorter).
fn ipv4_fragments(l4: &[u8], size: usize, id: u16) -> Vec<Vec<u8>> {
    let chunks: Vec<&[u8]> = l4.chunks(size).collect();
    let n = chunks.len();
    chunks
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let mut p = vec![0x45, 0];
            p.extend_from_slice(&((20 + c.len()) as u16).to_be_bytes());
            p.extend_from_slice(&id.to_be_bytes());
            let mut fo = ((i * size) / 8) as u16;
            if i + 1 < n {
                fo |= 0x2000;
            }
            p.extend_from_slice(&fo.to_be_bytes());
            p.extend_from_slice(&[64, 17, 0, 0, 10, 250, 0, 53, 10, 244, 1, 2]);
            p.extend_from_slice(c);
            p
        })
        .collect()
}

/// IPv6 fragments (Fragment header right after the fixed header).
fn ipv6_fragments(l4: &[u8], size: usize, id: u32) -> Vec<Vec<u8>> {
    let chunks: Vec<&[u8]> = l4.chunks(size).collect();
    let n = chunks.len();
    chunks
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let mut p = vec![0x60, 0, 0, 0];
            p.extend_from_slice(&((8 + c.len()) as u16).to_be_bytes());
            p.extend_from_slice(&[44, 64]);
            p.extend_from_slice(&[0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x53]);
            p.extend_from_slice(&[0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2]);
            let mut om = ((i * size) as u16 / 8) << 3;
            if i + 1 < n {
                om |= 1;
            }
            p.extend_from_slice(&[17, 0]);
            p.extend_from_slice(&om.to_be_bytes());
            p.extend_from_slice(&id.to_be_bytes());
            p.extend_from_slice(c);
            p
        })
        .collect()
}

fn packet(ts_ns: u64, data: &[u8]) -> CapturedPacket {
    CapturedPacket {
        ts_ns,
        cpu: None,
        at: HOP,
        vlan: None,
        orig_len: data.len() as u32,
        data: data.to_vec().into(),
    }
}

/// Pushes `frags` in order at time 1; returns the rebuilt packet if one completed.
fn push_all(r: &mut Reassembler, frags: &[Vec<u8>]) -> Option<CapturedPacket> {
    let mut done = None;
    for f in frags {
        match r.push(packet(1, f)) {
            Pushed::Held => {}
            Pushed::Complete(p) => {
                assert!(done.is_none(), "completed twice");
                done = Some(p);
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    done
}

fn udp_payload(p: &CapturedPacket) -> Vec<u8> {
    match parse_ip(&p.data).unwrap().transport {
        Transport::Udp { payload, .. } => payload.to_vec(),
        other => panic!("not UDP: {other:?}"),
    }
}

#[test]
fn ipv4_in_order_is_rebuilt_whole() {
    let msg = big_answer(16);
    assert!(msg.len() > 3000);
    let frags = ipv4_fragments(&udp(&msg), 1480, 0x1a2b);
    assert_eq!(frags.len(), 3);
    let mut r = Reassembler::new(FragLimits::default());
    let p = push_all(&mut r, &frags).expect("complete");
    assert_eq!(udp_payload(&p), msg);
    assert_eq!(p.orig_len as usize, 20 + 8 + msg.len());
    assert_eq!(p.data.len(), p.orig_len as usize);
    assert_eq!(dns::decode(&udp_payload(&p)).unwrap().answers.len(), 16);
    let s = r.stats();
    assert_eq!((s.merged, s.incomplete, s.pending), (2, 0, 0));
    assert_eq!(s.datagrams_reassembled, 1);
    // Not fragments: handed back untouched.
    let whole = p.data.clone();
    assert!(matches!(r.push(packet(2, &whole)), Pushed::Unfragmented(q) if q.data == whole));
}

#[test]
fn out_of_order_and_duplicates_complete_once() {
    let msg = big_answer(16);
    let mut frags = ipv4_fragments(&udp(&msg), 1024, 9);
    assert_eq!(frags.len(), 4);
    frags.reverse();
    let dup = frags[1].clone();
    frags.insert(2, dup);
    let mut r = Reassembler::new(FragLimits::default());
    let p = push_all(&mut r, &frags).expect("complete");
    assert_eq!(udp_payload(&p), msg);
    // 5 packets: one completes, 4 merged (the duplicate included).
    assert_eq!(r.stats().merged, 4);

    // An overlap that agrees (a re-fragmentation of the same bytes) is fine.
    let l4 = udp(&msg);
    let mut r = Reassembler::new(FragLimits::default());
    let a = ipv4_fragments(&l4, 1024, 10);
    let b = ipv4_fragments(&l4, 512, 10);
    assert!(matches!(r.push(packet(1, &a[0])), Pushed::Held));
    assert!(matches!(r.push(packet(1, &b[1])), Pushed::Held));
    assert!(matches!(r.push(packet(1, &b[2])), Pushed::Held));
    let mut done = None;
    for f in &a[1..] {
        if let Pushed::Complete(p) = r.push(packet(1, f)) {
            done = Some(p);
        }
    }
    assert_eq!(udp_payload(&done.unwrap()), msg);
}

#[test]
fn overlapping_fragments_that_disagree_are_rejected() {
    let msg = big_answer(16);
    let frags = ipv4_fragments(&udp(&msg), 1024, 11);
    let mut evil = frags[1].clone();
    evil[20 + 100] ^= 0xff;
    let mut r = Reassembler::new(FragLimits::default());
    assert!(matches!(r.push(packet(1, &frags[0])), Pushed::Held));
    assert!(matches!(r.push(packet(1, &frags[1])), Pushed::Held));
    match r.push(packet(1, &evil)) {
        Pushed::Rejected(_, FragError::Overlap { offset: 1024 }) => {}
        other => panic!("{other:?}"),
    }
    // The rest of that datagram is only counted; it never completes or reports a loss.
    for f in &frags[2..] {
        assert!(matches!(r.push(packet(1, f)), Pushed::Held));
    }
    let mut losses = Vec::new();
    r.expire(10_000_000_000, &mut losses);
    assert!(losses.is_empty(), "{losses:?}");
    let s = r.stats();
    // 2 held before the rejection + 2 after: incomplete; the rejected one is the
    // caller's (malformed).
    assert_eq!((s.merged, s.incomplete, s.pending), (0, 4, 0));
}

#[test]
fn too_many_or_too_big_is_bounded() {
    let msg = big_answer(16);
    let frags = ipv4_fragments(&udp(&msg), 256, 12);
    assert!(frags.len() > 4);
    let mut r = Reassembler::new(FragLimits {
        max_fragments: 4,
        ..FragLimits::default()
    });
    for f in &frags[..4] {
        assert!(matches!(r.push(packet(1, f)), Pushed::Held));
    }
    assert!(matches!(
        r.push(packet(1, &frags[4])),
        Pushed::Rejected(_, FragError::TooManyFragments(4))
    ));
    // Ping of death: data ending past 65535.
    let mut big = ipv4_fragments(&udp(&msg), 1024, 13)[1].clone();
    big[6..8].copy_from_slice(&(0x2000u16 | (65528 / 8)).to_be_bytes());
    assert!(matches!(
        r.push(packet(1, &big)),
        Pushed::Rejected(_, FragError::TooBig { .. })
    ));
    // Memory: at most 2 datagrams in flight; the oldest is evicted and counted.
    let mut r = Reassembler::new(FragLimits {
        max_datagrams: 2,
        ..FragLimits::default()
    });
    for id in 20..23 {
        let f = ipv4_fragments(&udp(&msg), 1024, id);
        assert!(matches!(r.push(packet(1, &f[0])), Pushed::Held));
    }
    let s = r.stats();
    assert_eq!((s.datagrams_evicted, s.incomplete, s.pending), (1, 1, 2));
    let mut losses = Vec::new();
    r.finish(&mut losses);
    assert_eq!(losses.len(), 2);
    assert!(losses.iter().all(|l| l.cause == LossCause::EndOfInput));
    assert_eq!(r.stats().incomplete, 3);
    // Hostile bytes never panic.
    let mut r = Reassembler::new(FragLimits::default());
    for f in &frags {
        for cut in 0..f.len().min(48) {
            let _ = r.push(packet(1, &f[..cut]));
        }
    }
}

/// Datagrams made unusable by their first fragment (here misaligned: more fragments, 13
/// bytes) count against the limit like any other: a sender cannot hold one entry per IP id
/// for the whole timeout (the fuzz harness's bound, found by reading it).
#[test]
fn unusable_datagrams_are_bounded_too() {
    let mut r = Reassembler::new(FragLimits {
        max_datagrams: 2,
        ..FragLimits::default()
    });
    assert!(r.check_bounds().is_ok());
    for id in 0..10u16 {
        let mut p = vec![0x45, 0, 0, 33];
        p.extend_from_slice(&id.to_be_bytes());
        p.extend_from_slice(&[0x20, 0x01, 64, 17, 0, 0, 10, 250, 0, 53, 10, 244, 1, 2]);
        p.extend_from_slice(&[0; 13]);
        assert!(matches!(
            r.push(packet(1, &p)),
            Pushed::Rejected(_, FragError::Misaligned(13))
        ));
        r.check_bounds().unwrap();
    }
    assert_eq!(r.stats().datagrams_evicted, 8);
    // Within the limit the check holds; beyond it, it says so.
    r.bytes += 1;
    assert!(r.check_bounds().unwrap_err().contains("bytes counted"));
}

/// Completed datagrams do not pile up in the expiry queue.
#[test]
fn the_expiry_queue_stays_bounded() {
    let msg = big_answer(4);
    let mut r = Reassembler::new(FragLimits {
        max_datagrams: 8,
        ..FragLimits::default()
    });
    for id in 0..1000u16 {
        assert!(push_all(&mut r, &ipv4_fragments(&udp(&msg), 512, id)).is_some());
    }
    assert!(r.expiry.len() <= 4 * 8 + 17, "{}", r.expiry.len());
    assert_eq!(r.stats().datagrams_reassembled, 1000);
}

#[test]
fn a_missing_fragment_times_out_as_a_loss_with_the_question() {
    let msg = big_answer(16);
    let frags = ipv4_fragments(&udp(&msg), 1480, 0x77);
    let mut r = Reassembler::new(FragLimits::default());
    assert!(matches!(r.push(packet(1_000, &frags[0])), Pushed::Held));
    assert!(matches!(r.push(packet(2_000, &frags[2])), Pushed::Held));
    let mut losses = Vec::new();
    r.expire(1_900_000_000, &mut losses);
    assert!(losses.is_empty());
    r.expire(2_000_001_000, &mut losses);
    let [l] = &losses[..] else {
        panic!("{losses:?}")
    };
    assert_eq!(l.cause, LossCause::Timeout);
    assert_eq!((l.key.id, l.key.at), (0x77, HOP));
    assert_eq!(l.seen, vec![(0, 1480), (2960, 8 + msg.len() - 2960)]);
    assert_eq!(l.missing, vec![(1480, Some(2960))]);
    assert_eq!(l.total_len, Some(8 + msg.len()));
    assert_eq!(l.fragment_numbers(), Some((3, vec![2])));
    assert_eq!(
        (l.src(), l.dst()),
        ("10.250.0.53:53".into(), "10.244.1.2:40000".into())
    );
    let m = l.dns.as_ref().unwrap();
    assert_eq!((m.id, m.qr), (4660, true));
    assert_eq!(m.questions[0].name, "big.lab.test.");
    let s = r.stats();
    assert_eq!((s.incomplete, s.pending, s.datagrams_lost), (2, 0, 1));

    // Only later fragments: the end is unknown, no ports, no question.
    let mut r = Reassembler::new(FragLimits::default());
    assert!(matches!(r.push(packet(1, &frags[1])), Pushed::Held));
    let mut losses = Vec::new();
    r.finish(&mut losses);
    assert_eq!(losses[0].missing, vec![(0, Some(1480)), (2960, None)]);
    assert!(losses[0].dns.is_none() && losses[0].ports.is_none());
}

#[test]
fn ipv6_fragments_are_rebuilt_and_lost_ones_reported() {
    let msg = big_answer(16);
    let frags = ipv6_fragments(&udp(&msg), 1232, 0xdead_beef);
    assert_eq!(frags.len(), 3);
    let mut r = Reassembler::new(FragLimits::default());
    let p = push_all(&mut r, &frags).expect("complete");
    assert_eq!(udp_payload(&p), msg);
    assert_eq!(p.orig_len as usize, 40 + 8 + msg.len());
    let ip = parse_ip(&p.data).unwrap();
    assert_eq!(ip.src.to_string(), "fd00::53");
    assert_eq!(r.stats().merged, 2);

    assert!(matches!(r.push(packet(5, &frags[0])), Pushed::Held));
    assert!(matches!(r.push(packet(5, &frags[1])), Pushed::Held));
    let mut losses = Vec::new();
    r.expire(3_000_000_000, &mut losses);
    let [l] = &losses[..] else {
        panic!("{losses:?}")
    };
    assert_eq!(l.key.id, 0xdead_beef);
    assert_eq!(l.missing, vec![(2464, None)]);
    assert_eq!(l.src(), "[fd00::53]:53");
    assert_eq!(l.dns.as_ref().unwrap().id, 4660);
}

/// A datagram whose middle fragment the capture cut decodes as cut, not malformed.
#[test]
fn a_fragment_cut_by_the_capture_makes_a_cut_datagram() {
    let msg = big_answer(16);
    let frags = ipv4_fragments(&udp(&msg), 1480, 5);
    let mut r = Reassembler::new(FragLimits::default());
    let mut cut = packet(1, &frags[1][..600]);
    cut.orig_len = frags[1].len() as u32;
    assert!(matches!(r.push(packet(1, &frags[0])), Pushed::Held));
    assert!(matches!(r.push(cut), Pushed::Held));
    let Pushed::Complete(p) = r.push(packet(1, &frags[2])) else {
        panic!()
    };
    assert_eq!(p.orig_len as usize, 20 + 8 + msg.len());
    assert_eq!(p.data.len(), 20 + 1480 + 580);
    let ip = parse_ip(&p.data).unwrap();
    assert!(ip.truncated && ip.missing > 0);
}

#[test]
fn watched_datagrams_keep_later_fragments_of_watched_first_ones() {
    let msg = big_answer(16);
    let frags = ipv4_fragments(&udp(&msg), 1480, 5);
    let other = ipv4_fragments(&udp(&msg), 1480, 6);
    let mut w = WatchedDatagrams::default();
    w.note_kept(&frags[0]);
    assert!(w.is_later_fragment(&frags[1]) && w.is_later_fragment(&frags[2]));
    assert!(!w.is_later_fragment(&other[1]) && !w.is_later_fragment(&frags[0]));
}

/// Through the decoder: the datagram is decoded once, whole, like an unfragmented answer
/// (and handed to the correlate stage); a lost fragment is a `fragment_loss` record, never
/// a malformed or answering packet; every packet is in exactly one bucket.
#[test]
fn the_decoder_decodes_reassembled_answers_and_reports_losses() {
    use crate::output::record::Record;
    use crate::{decode::decoder::Decoder, time::Clock};
    use std::sync::{Arc, RwLock};

    let names = Arc::new(RwLock::new(crate::kernel::attach::Names::default()));
    let mut d = Decoder::new(
        Clock::Epoch,
        names,
        crate::kernel::kallsyms::Kallsyms::default(),
        Default::default(),
    );
    d.collect_observations();
    let msg = big_answer(16);
    let mut out = Vec::new();
    for f in ipv4_fragments(&udp(&msg), 1480, 1) {
        d.on_packet(packet(1_000, &f), &mut out);
    }
    let [Record::Packet(r)] = &out[..] else {
        panic!("{out:?}")
    };
    assert!(r.malformed.is_none() && !r.capture_truncated);
    assert_eq!(r.dns.as_ref().unwrap().answers.len(), 16);
    assert_eq!(r.src.to_string(), "10.250.0.53:53");
    let mut obs = Vec::new();
    d.take_observed(&mut obs);
    assert_eq!(obs.len(), 1);

    // Fragment 2 of 3 never comes.
    out.clear();
    let frags = ipv4_fragments(&udp(&msg), 1480, 2);
    d.on_packet(packet(2_000, &frags[0]), &mut out);
    d.on_packet(packet(3_000, &frags[2]), &mut out);
    assert!(out.is_empty(), "{out:?}");
    d.finish(0, &mut out);
    let [Record::FragmentLoss(l)] = &out[..] else {
        panic!("{out:?}")
    };
    assert_eq!(
        (l.fragments, l.missing_fragments.clone()),
        (Some(3), Some(vec![2]))
    );
    assert_eq!(l.dns.as_ref().unwrap().id, 4660);
    assert!(
        l.summary
            .contains("answer 4660 TXT? big.lab.test. of 3 fragments: fragment 2 never seen"),
        "{}",
        l.summary
    );
    let line = crate::output::text::fragment_loss_line(l);
    assert!(line.contains("FRAGMENT LOSS netns:0x7/if3 in  udp 10.250.0.53:53 > 10.244.1.2:40000 ip id 0x2 (end of input)"), "{line}");
    let json = serde_json::to_value(&out[0]).unwrap();
    assert_eq!(json["type"], "fragment_loss");
    assert_eq!(json["missing"][0]["start"], 1480);
    obs.clear();
    d.take_observed(&mut obs);
    // A partial answer answers nothing: the correlate stage hears of its loss only.
    let [crate::correlate::Observed::Drop(loss)] = &obs[..] else {
        panic!("{obs:?}")
    };
    assert_eq!(loss.reason, crate::correlate::FRAGMENT_LOSS);
    assert_eq!(loss.location, "fragment 2 of 3 never seen");
    assert_eq!(loss.msg.as_ref().map(|m| (m.id, m.qr)), Some((4660, true)));

    let s = d.stats();
    assert_eq!((s.packets, s.decoded, s.malformed), (5, 1, 0));
    assert_eq!(
        (
            s.fragments_merged,
            s.fragments_incomplete,
            s.fragments_pending
        ),
        (2, 2, 0)
    );
    assert_eq!(
        s.packets,
        s.decoded
            + s.malformed
            + s.capture_truncated
            + s.tcp_control
            + s.other
            + s.summarised
            + s.fragments_merged
            + s.fragments_incomplete
            + s.fragments_pending
    );
    assert_eq!((s.datagrams_reassembled, s.datagrams_lost), (1, 1));
}

/// A kernel drop of a later fragment (no ports of its own) names its datagram's query from
/// the first fragment seen on the way — also when that hop had already reassembled the
/// datagram — and so becomes a drop observation the correlate stage can tie to the query.
#[test]
fn a_dropped_later_fragment_is_tied_to_its_query() {
    use crate::correlate::Observed;
    use crate::event::KernelDrop;
    use crate::output::record::{DroppedFragment, Record};
    use crate::{decode::decoder::Decoder, time::Clock};
    use std::sync::{Arc, RwLock};

    let names = Arc::new(RwLock::new(crate::kernel::attach::Names::default()));
    let mut d = Decoder::new(
        Clock::Epoch,
        names,
        crate::kernel::kallsyms::Kallsyms::default(),
        Default::default(),
    );
    d.collect_observations();
    let drop_of = |ts_ns: u64, data: &[u8]| KernelDrop {
        ts_ns,
        cpu: 1,
        netns: 0,
        ifindex: 3,
        reason: 6,
        location: 0,
        ct: None,
        orig_len: data.len() as u32,
        data: data.to_vec().into(),
        confirm_failed: false,
        named: None,
    };
    let msg = big_answer(16);
    let v4 = ipv4_fragments(&udp(&msg), 1480, 0x1a2b);
    let v6 = ipv6_fragments(&udp(&msg), 1232, 0xdead_beef);
    let mut out = Vec::new();
    // Whole at this hop: reassembled, nothing held any more.
    for f in v4.iter().chain(&v6) {
        d.on_packet(packet(1_000, f), &mut out);
    }
    assert_eq!(out.len(), 2, "{out:?}");
    assert_eq!(d.stats().fragments_pending, 0);
    out.clear();
    let mut obs = Vec::new();
    d.take_observed(&mut obs);
    obs.clear();

    d.on_drop(drop_of(2_000, &v4[1]), &mut out);
    d.on_drop(drop_of(2_000, &v6[2]), &mut out);
    let [Record::Drop(a), Record::Drop(b)] = &out[..] else {
        panic!("{out:?}")
    };
    assert_eq!(
        (a.proto, a.src.as_str(), a.dst.as_str()),
        (
            crate::decode::record::Proto::Udp,
            "10.250.0.53:53",
            "10.244.1.2:40000"
        )
    );
    // Numbered by the first fragment seen: its size and its UDP header's length.
    let total = udp(&msg).len();
    assert_eq!(total.div_ceil(1480), 3, "the test's layout");
    assert_eq!(
        a.fragment,
        Some(DroppedFragment {
            ip_id: 0x1a2b,
            offset: 1480,
            len: 1480,
            number: Some(2),
            fragments: Some(3),
            total_len: Some(total),
        })
    );
    assert_eq!(
        (b.src.as_str(), b.dst.as_str()),
        ("[fd00::53]:53", "[fd00::2]:40000")
    );
    assert_eq!(
        b.fragment
            .as_ref()
            .map(|f| (f.ip_id, f.offset, f.number, f.fragments, f.total_len)),
        Some((0xdead_beef, 2464, Some(3), Some(3), Some(total)))
    );
    for r in [a, b] {
        let m = r.dns.as_ref().unwrap();
        assert_eq!((m.id, m.qr), (4660, true));
        assert_eq!(m.questions[0].name, "big.lab.test.");
        assert!(r.malformed.is_none() && !r.capture_truncated, "{r:?}");
    }
    let line = crate::output::text::drop_line(a);
    assert!(
        line.contains(&format!(
            "udp 10.250.0.53:53 > 10.244.1.2:40000 ip id 0x1a2b fragment 2 of 3 (bytes 1480-2960 of {total}) reason"
        )),
        "{line}"
    );
    assert!(line.contains("4660- q: TXT? big.lab.test."), "{line}");
    d.take_observed(&mut obs);
    let [Observed::Drop(x), Observed::Drop(y)] = &obs[..] else {
        panic!("{obs:?}")
    };
    assert_eq!(x.src, "10.250.0.53:53".parse().unwrap());
    assert_eq!(y.dst, "[fd00::2]:40000".parse().unwrap());
    assert!(x.msg.as_ref().is_some_and(|m| m.id == 4660 && m.qr));
    assert_eq!(x.proto, tracer_common::proto::IPPROTO_UDP);
    // What the drop took, for the leg it joins.
    let part = x.fragment.as_ref().unwrap();
    assert_eq!(
        part.describe(),
        format!("IP fragment 2 of 3 (bytes 1480-2960 of {total})")
    );
    assert_eq!(y.fragment.as_ref().unwrap().numbers, [3]);

    // A datagram whose first fragment was never seen, or seen longer ago than the kernel
    // follows its fragments: the addresses only, matched to nothing.
    out.clear();
    let unseen = ipv4_fragments(&udp(&msg), 1480, 0x1a2c);
    d.on_drop(drop_of(3_000, &unseen[1]), &mut out);
    d.on_drop(
        drop_of(1_000 + tracer_common::FRAG_KEY_LIFETIME_NS, &v4[2]),
        &mut out,
    );
    for r in &out {
        let Record::Drop(r) = r else { panic!("{r:?}") };
        assert_eq!(
            (r.proto, r.src.as_str()),
            (crate::decode::record::Proto::Ip, "10.250.0.53"),
            "{r:?}"
        );
        assert!(r.dns.is_none() && r.fragment.is_some(), "{r:?}");
        // Nothing numbers a fragment whose first was not seen.
        let f = r.fragment.as_ref().unwrap();
        assert_eq!(
            (f.number, f.fragments, f.total_len),
            (None, None, None),
            "{r:?}"
        );
    }
    assert_eq!(out.len(), 2);
    obs.clear();
    d.take_observed(&mut obs);
    assert!(obs.is_empty(), "{obs:?}");
    assert_eq!(d.stats().drops, 4);
}

/// The heads of first fragments are kept for as many datagrams as the kernel follows.
#[test]
fn first_fragments_are_bounded() {
    let msg = big_answer(4);
    let mut r = Reassembler::new(FragLimits::default());
    let n = tracer_common::MAX_FRAG_KEYS + 1;
    let mut firsts = Vec::new();
    for id in 0..n {
        let f = ipv6_fragments(&udp(&msg), 512, id);
        assert!(matches!(r.push(packet(1, &f[0])), Pushed::Held));
        firsts.push(f);
    }
    // The oldest is forgotten, the newest kept.
    assert!(r.first_fragment_of(&firsts[0][1], 2).is_none());
    let last = r.first_fragment_of(&firsts[n as usize - 1][1], 2).unwrap();
    assert_eq!(last.ports, (53, 40000));
    assert_eq!(last.dns.unwrap().id, 4660);
    // First fragments themselves are not looked up.
    assert!(r.first_fragment_of(&firsts[n as usize - 1][0], 2).is_none());
}

/// A fragment's number comes from the first fragment's size and the datagram's length, only
/// where the layout is the usual one.
#[test]
fn fragments_are_numbered_on_the_first_fragments_grid() {
    use super::fragment_number;
    // 3558 bytes in fragments of 1232: 1232, 1232, 1094.
    assert_eq!(fragment_number(1232, 3558, 0, 1232), Some((1, 3)));
    assert_eq!(fragment_number(1232, 3558, 1232, 1232), Some((2, 3)));
    assert_eq!(fragment_number(1232, 3558, 2464, 1094), Some((3, 3)));
    // Off the grid, too short for a middle one, past the end, or no real first fragment.
    assert_eq!(fragment_number(1232, 3558, 1000, 1232), None);
    assert_eq!(fragment_number(1232, 3558, 1232, 600), None);
    assert_eq!(fragment_number(1232, 3558, 2464, 1200), None);
    assert_eq!(fragment_number(0, 3558, 0, 0), None);
    assert_eq!(
        fragment_number(1236, 3558, 0, 1236),
        None,
        "not a multiple of 8"
    );
    assert_eq!(fragment_number(3558, 3558, 0, 3558), None, "not fragmented");
}

/// The drops of one answer's fragments add up to one part, said in a few words; another
/// datagram's fragment is not added.
#[test]
fn dropped_parts_of_one_datagram_merge() {
    use crate::decode::record::{DroppedFragment, MissingRange};
    let frag = |ip_id, offset, len, number: Option<usize>| DroppedFragment {
        ip_id,
        offset,
        len,
        number,
        fragments: number.map(|_| 3),
        total_len: Some(3558),
    };
    let mut p = frag(9, 2464, 1094, Some(3)).part();
    assert_eq!(p.describe(), "IP fragment 3 of 3 (bytes 2464-3558 of 3558)");
    p.merge(&frag(9, 1232, 1232, Some(2)).part());
    assert_eq!(p.numbers, [2, 3]);
    assert_eq!(
        p.bytes,
        [MissingRange {
            start: 1232,
            end: Some(3558)
        }]
    );
    assert_eq!(
        p.describe(),
        "IP fragments 2 and 3 of 3 (bytes 1232-3558 of 3558)"
    );
    // The same drop again changes nothing; another datagram's is not this one's.
    let before = p.clone();
    p.merge(&frag(9, 1232, 1232, Some(2)).part());
    p.merge(&frag(10, 0, 1232, Some(1)).part());
    assert_eq!(p, before);
    // A fragment that cannot be numbered: the bytes say it.
    let mut q = frag(9, 2464, 1094, Some(3)).part();
    q.merge(
        &DroppedFragment {
            total_len: None,
            ..frag(9, 0, 1000, None)
        }
        .part(),
    );
    assert_eq!(q.describe(), "IP fragment bytes 0-1000, 2464-3558 of 3558");
}
