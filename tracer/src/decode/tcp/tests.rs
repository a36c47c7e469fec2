use super::*;

const PSH_ACK: u8 = 0x18;

fn key(port: u16) -> FlowKey {
    FlowKey {
        netns: 0,
        ifindex: 0,
        dir: 0,
        src: SocketAddr::from(([10, 0, 0, 1], port)),
        dst: SocketAddr::from(([10, 0, 0, 53], 53)),
    }
}

/// A fake DNS message body of `len` bytes whose first two bytes identify it.
fn msg(id: u16, len: usize) -> Vec<u8> {
    let mut m = vec![0xab; len];
    m[..2].copy_from_slice(&id.to_be_bytes());
    m
}

fn framed(m: &[u8]) -> Vec<u8> {
    let mut v = (m.len() as u16).to_be_bytes().to_vec();
    v.extend_from_slice(m);
    v
}

fn messages(out: &[TcpOutput]) -> Vec<Vec<u8>> {
    out.iter()
        .filter_map(|o| match o {
            TcpOutput::Message(m) => Some(m.clone()),
            _ => None,
        })
        .collect()
}

fn malformed(out: &[TcpOutput]) -> Vec<(String, usize)> {
    out.iter()
        .filter_map(|o| match o {
            TcpOutput::Malformed { reason, bytes } => Some((reason.clone(), *bytes)),
            _ => None,
        })
        .collect()
}

fn reasm() -> TcpReassembler {
    TcpReassembler::new(TcpLimits::default())
}

fn closed(r: &mut TcpReassembler) -> Vec<(FlowKey, String)> {
    let mut v = Vec::new();
    r.take_closed(&mut v);
    v.into_iter()
        .map(|(k, o)| match o {
            TcpOutput::Malformed { reason, .. } => (k, reason),
            o => panic!("{o:?}"),
        })
        .collect()
}

/// What an evicted, expired or ended flow held is reported, with its flow, never lost.
#[test]
fn forgotten_flows_report_their_unfinished_messages() {
    let mut r = TcpReassembler::new(TcpLimits {
        max_flows: 1,
        ..TcpLimits::default()
    });
    let mut out = Vec::new();
    // Flow 1: 3 bytes of a 20-byte message; flow 2 evicts it.
    r.push(
        1,
        key(1),
        100,
        PSH_ACK,
        &framed(&msg(1, 20))[..5],
        false,
        &mut out,
    );
    r.push(2, key(2), 100, PSH_ACK, &[0], false, &mut out);
    assert!(out.is_empty());
    assert_eq!(
        closed(&mut r),
        [(
            key(1),
            "flow evicted (too many flows) 17 bytes short of a 20-byte message".to_string()
        )]
    );
    // Flow 2 holds one byte of a length prefix; it idles out.
    r.expire(2 + TcpLimits::default().idle_ns + 1);
    assert_eq!(
        closed(&mut r),
        [(
            key(2),
            "flow idle too long inside a message's 2-byte length prefix (1 byte)".to_string()
        )]
    );
    // At the end of input.
    r.push(
        3,
        key(3),
        100,
        PSH_ACK,
        &framed(&msg(3, 30))[..12],
        false,
        &mut out,
    );
    r.finish();
    assert_eq!(
        closed(&mut r),
        [(
            key(3),
            "stream ended 20 bytes short of a 30-byte message".to_string()
        )]
    );
    assert_eq!(r.flows.len(), 0);
    // A flow with nothing held reports nothing.
    r.push(
        4,
        key(4),
        100,
        PSH_ACK,
        &framed(&msg(4, 30)),
        false,
        &mut out,
    );
    r.finish();
    assert!(closed(&mut r).is_empty());
}

#[test]
fn two_messages_in_one_segment() {
    let mut r = reasm();
    let (a, b) = (msg(1, 30), msg(2, 40));
    let mut seg = framed(&a);
    seg.extend_from_slice(&framed(&b));
    let mut out = Vec::new();
    r.push(1, key(1000), 5000, PSH_ACK, &seg, false, &mut out);
    assert_eq!(out, vec![TcpOutput::Message(a), TcpOutput::Message(b)]);
    assert_eq!(r.flows.len(), 1);
}

#[test]
fn one_message_over_three_segments() {
    let mut r = reasm();
    let m = msg(7, 300);
    let f = framed(&m);
    let mut out = Vec::new();
    // Split inside the length prefix too.
    r.push(1, key(1), 100, 0x02, &[], false, &mut out); // SYN, ISN 100
    r.push(2, key(1), 101, PSH_ACK, &f[..1], false, &mut out);
    assert!(out.is_empty());
    r.push(3, key(1), 102, PSH_ACK, &f[1..150], false, &mut out);
    assert!(out.is_empty());
    r.push(4, key(1), 251, PSH_ACK, &f[150..], false, &mut out);
    assert_eq!(out, vec![TcpOutput::Message(m)]);
}

#[test]
fn syn_with_data_and_retransmitted_syn() {
    let mut r = reasm();
    let m = msg(3, 20);
    let mut out = Vec::new();
    // TCP Fast Open: data rides on the SYN, starting at ISN+1.
    r.push(1, key(2), 9, 0x02, &framed(&m), false, &mut out);
    // A retransmitted SYN must not reset the stream or re-emit.
    r.push(2, key(2), 9, 0x02, &framed(&m), false, &mut out);
    assert_eq!(out, vec![TcpOutput::Message(m)]);
}

#[test]
fn retransmits_are_ignored_and_overlaps_trimmed() {
    let mut r = reasm();
    let (a, b) = (msg(1, 50), msg(2, 50));
    let mut stream = framed(&a);
    stream.extend_from_slice(&framed(&b));
    let mut out = Vec::new();
    r.push(1, key(3), 1000, PSH_ACK, &stream[..40], false, &mut out);
    r.push(2, key(3), 1000, PSH_ACK, &stream[..40], false, &mut out); // pure retransmit
    r.push(3, key(3), 1020, PSH_ACK, &stream[20..70], false, &mut out); // overlap
    assert_eq!(out, vec![TcpOutput::Message(a.clone())]);
    r.push(4, key(3), 1000, PSH_ACK, &stream, false, &mut out); // repacketised retransmit
    assert_eq!(out, vec![TcpOutput::Message(a), TcpOutput::Message(b)]);
    assert_eq!(r.stats().bytes_dropped, 0);
}

#[test]
fn out_of_order_segments_are_reordered() {
    let mut r = reasm();
    let m = msg(9, 100);
    let f = framed(&m);
    let mut out = Vec::new();
    r.push(1, key(4), 0, PSH_ACK, &f[..10], false, &mut out);
    r.push(2, key(4), 60, PSH_ACK, &f[60..], false, &mut out);
    r.push(3, key(4), 30, PSH_ACK, &f[30..60], false, &mut out);
    assert!(out.is_empty());
    r.push(4, key(4), 10, PSH_ACK, &f[10..30], false, &mut out);
    assert_eq!(out, vec![TcpOutput::Message(m)]);
    assert_eq!(r.stats().gaps, 0);
}

#[test]
fn sequence_wraparound() {
    let mut r = reasm();
    let m = msg(5, 64);
    let f = framed(&m);
    let mut out = Vec::new();
    let start = u32::MAX - 9;
    r.push(1, key(5), start, PSH_ACK, &f[..30], false, &mut out);
    r.push(
        2,
        key(5),
        start.wrapping_add(30),
        PSH_ACK,
        &f[30..],
        false,
        &mut out,
    );
    // Retransmit across the wrap is still recognised as old.
    r.push(
        3,
        key(5),
        start.wrapping_add(5),
        PSH_ACK,
        &f[5..40],
        false,
        &mut out,
    );
    assert_eq!(out, vec![TcpOutput::Message(m)]);
}

#[test]
fn gap_is_reported_then_stream_resyncs() {
    let mut r = reasm();
    let (a, b) = (msg(1, 200), msg(2, 30));
    let fa = framed(&a);
    let mut out = Vec::new();
    r.push(1, key(6), 1000, PSH_ACK, &fa[..100], false, &mut out);
    // fa[100..] is lost; the next segment starts message b, far beyond the buffer window.
    let far = 1000 + 100 + 70_000;
    r.push(2, key(6), far, PSH_ACK, &framed(&b), false, &mut out);
    let bad = malformed(&out);
    assert_eq!(bad.len(), 1);
    assert!(bad[0].0.starts_with("gap of 70000 bytes"), "{bad:?}");
    assert_eq!(bad[0].1, 100);
    assert_eq!(messages(&out), vec![b.clone()]);
    // The stream keeps going from there.
    out.clear();
    let c = msg(3, 10);
    r.push(3, key(6), far + 32, PSH_ACK, &framed(&c), false, &mut out);
    assert_eq!(out, vec![TcpOutput::Message(c)]);
    let s = r.stats();
    assert_eq!((s.gaps, s.bytes_dropped), (1, 100));
}

#[test]
fn too_many_pending_segments_is_a_gap() {
    let mut r = reasm();
    let mut out = Vec::new();
    r.push(1, key(7), 0, PSH_ACK, &[0, 50, 1, 2, 3], false, &mut out); // partial message
                                                                       // Bytes 5..10 never arrive; 17 one-message segments follow.
    let mut seq = 10u32;
    for i in 0..=MAX_PENDING_SEGMENTS as u16 {
        let f = framed(&msg(i, 12));
        r.push(2, key(7), seq, PSH_ACK, &f, false, &mut out);
        seq += f.len() as u32;
    }
    let bad = malformed(&out);
    assert_eq!(bad.len(), 1, "{bad:?}");
    assert_eq!(bad[0].1, 5);
    assert_eq!(messages(&out).len(), MAX_PENDING_SEGMENTS + 1);
    assert_eq!(r.stats().gaps, 1);
}

/// The fuzz harness's check: holds while segments wait behind a hole, fires on a miscount
/// of the bytes waiting and on a flow the LRU lost.
#[test]
fn check_bounds_holds_and_fires() {
    let mut r = reasm();
    let mut out = Vec::new();
    r.push(1, key(7), 0, PSH_ACK, &[0, 50, 1, 2, 3], false, &mut out);
    for i in 0..4u32 {
        r.push(2, key(7), 100 + 20 * i, PSH_ACK, &[9; 20], false, &mut out);
        r.check_bounds().unwrap();
    }
    let flow = r.flows.get_mut(&key(7)).unwrap();
    assert_eq!((flow.pending.len(), flow.pending_bytes), (4, 80));
    flow.pending_bytes -= 1;
    assert!(r.check_bounds().unwrap_err().contains("79 counted"));
    r.flows.get_mut(&key(7)).unwrap().pending_bytes += 1;
    r.lru.clear();
    assert!(r.check_bounds().unwrap_err().contains("LRU 0"));
}

#[test]
fn oversize_message_is_skipped_exactly() {
    let mut r = TcpReassembler::new(TcpLimits {
        max_buffer: 102,
        ..TcpLimits::default()
    });
    let (big, small) = (msg(1, 250), msg(2, 20));
    let mut stream = framed(&big);
    stream.extend_from_slice(&framed(&small));
    let mut out = Vec::new();
    r.push(1, key(8), 0, PSH_ACK, &stream[..80], false, &mut out);
    r.push(2, key(8), 80, PSH_ACK, &stream[80..200], false, &mut out);
    r.push(3, key(8), 200, PSH_ACK, &stream[200..], false, &mut out);
    let bad = malformed(&out);
    assert_eq!(bad.len(), 1);
    assert_eq!(bad[0].1, 252);
    assert!(bad[0].0.contains("250-byte message exceeds"), "{bad:?}");
    assert_eq!(messages(&out), vec![small]);
    assert_eq!(r.stats().bytes_dropped, 252);
}

#[test]
fn snaplen_cut_segment_hands_on_partial_and_resyncs() {
    let mut r = reasm();
    let (a, b, c) = (msg(1, 20), msg(2, 100), msg(3, 15));
    let mut seg = framed(&a);
    seg.extend_from_slice(&framed(&b));
    let mut out = Vec::new();
    // Capture holds a and the first 30 bytes of b (its prefix and 28 bytes of it).
    r.push(1, key(9), 0, PSH_ACK, &seg[..22 + 30], true, &mut out);
    assert_eq!(
        out,
        vec![
            TcpOutput::Message(a),
            TcpOutput::Cut {
                captured: b[..28].to_vec(),
                message_len: Some(100),
            }
        ]
    );
    assert!(malformed(&out).is_empty());
    assert_eq!(r.stats().cut, 1);
    assert_eq!(r.stats().bytes_dropped, 0);
    out.clear();
    // A retransmission of the cut segment (cut again) adds nothing and emits nothing.
    r.push(2, key(9), 0, PSH_ACK, &seg[..22 + 30], true, &mut out);
    r.push(2, key(9), 10, PSH_ACK, &seg[10..80], false, &mut out);
    assert!(out.is_empty(), "{out:?}");
    // Next segment (after the uncaptured tail) starts a new message.
    r.push(
        2,
        key(9),
        seg.len() as u32,
        PSH_ACK,
        &framed(&c),
        false,
        &mut out,
    );
    assert_eq!(out, vec![TcpOutput::Message(c)]);
}

#[test]
fn fin_and_rst_report_leftovers_and_forget_flow() {
    let mut r = reasm();
    let mut out = Vec::new();
    let m = msg(1, 40);
    let f = framed(&m);
    r.push(1, key(10), 0, PSH_ACK, &f[..20], false, &mut out);
    r.push(2, key(10), 20, PSH_ACK | TCP_FIN, &[], false, &mut out);
    let bad = malformed(&out);
    assert_eq!(bad.len(), 1);
    assert!(bad[0].0.contains("FIN"), "{bad:?}");
    assert_eq!(bad[0].1, 20);
    assert_eq!(r.flows.len(), 0);

    // Complete message with FIN on the same segment: no leftovers.
    out.clear();
    r.push(3, key(11), 0, PSH_ACK | TCP_FIN, &f, false, &mut out);
    assert_eq!(out, vec![TcpOutput::Message(m)]);
    assert_eq!(r.flows.len(), 0);

    out.clear();
    r.push(4, key(12), 0, PSH_ACK, &f[..5], false, &mut out);
    r.push(5, key(12), 5, TCP_RST, &[], false, &mut out);
    assert!(malformed(&out)[0].0.contains("RST"));
    assert_eq!(r.flows.len(), 0);
    // Stray FIN/RST for unknown flows create nothing.
    r.push(6, key(13), 5, TCP_RST, &[], false, &mut out);
    r.push(6, key(14), 5, TCP_FIN | 0x10, &[], false, &mut out);
    assert_eq!(r.flows.len(), 0);
}

#[test]
fn new_syn_on_same_tuple_restarts_stream() {
    let mut r = reasm();
    let mut out = Vec::new();
    r.push(1, key(15), 100, TCP_SYN, &[], false, &mut out);
    r.push(2, key(15), 101, PSH_ACK, &[0, 30, 1], false, &mut out);
    let m = msg(4, 12);
    r.push(3, key(15), 7777, TCP_SYN, &[], false, &mut out);
    r.push(4, key(15), 7778, PSH_ACK, &framed(&m), false, &mut out);
    assert_eq!(malformed(&out).len(), 1);
    assert_eq!(messages(&out), vec![m]);
}

#[test]
fn zero_length_frame_drops_segment_and_resyncs() {
    let mut r = reasm();
    let m = msg(1, 12);
    let mut out = Vec::new();
    // A valid message, then zeros (not DNS): one report for the rest, not one per pair.
    let mut seg = framed(&m);
    seg.extend_from_slice(&[0u8; 100]);
    r.push(1, key(16), 0, PSH_ACK, &seg, false, &mut out);
    assert_eq!(messages(&out), vec![m.clone()]);
    assert_eq!(malformed(&out).len(), 1);
    assert_eq!(malformed(&out)[0].1, 100);
    out.clear();
    // Next segment is taken as a message start, even after a jump.
    r.push(2, key(16), 500, PSH_ACK, &framed(&m), false, &mut out);
    assert_eq!(out, vec![TcpOutput::Message(m)]);
}

#[test]
fn lru_eviction_bounds_flows() {
    let mut r = TcpReassembler::new(TcpLimits {
        max_flows: 100,
        ..TcpLimits::default()
    });
    let mut out = Vec::new();
    for i in 0..10_000u32 {
        let k = FlowKey {
            netns: 0,
            ifindex: i,
            dir: 0,
            src: SocketAddr::from(([10, 0, 0, 1], 1000)),
            dst: SocketAddr::from(([10, 0, 0, 2], 53)),
        };
        r.push(u64::from(i), k, 0, PSH_ACK, &[0, 40, 1, 2], false, &mut out);
        assert!(r.flows.len() <= 100);
    }
    let s = r.stats();
    assert_eq!(r.flows.len(), 100);
    assert_eq!(s.flows_evicted, 9_900);
    assert_eq!(s.bytes_dropped, 9_900 * 4);
    assert!(out.is_empty());
}

#[test]
fn lru_keeps_recently_used_flow() {
    let mut r = TcpReassembler::new(TcpLimits {
        max_flows: 2,
        ..TcpLimits::default()
    });
    let mut out = Vec::new();
    let m = msg(1, 20);
    let f = framed(&m);
    r.push(1, key(1), 0, PSH_ACK, &f[..10], false, &mut out);
    r.push(2, key(2), 0, PSH_ACK, &f[..10], false, &mut out);
    r.push(3, key(1), 10, 0x10, &[], false, &mut out); // touch flow 1
    r.push(4, key(3), 0, PSH_ACK, &f[..10], false, &mut out); // evicts flow 2
    r.push(5, key(1), 10, PSH_ACK, &f[10..], false, &mut out);
    assert_eq!(out, vec![TcpOutput::Message(m)]);
    assert_eq!(r.stats().flows_evicted, 1);
}

#[test]
fn idle_flows_expire() {
    let mut r = reasm();
    let mut out = Vec::new();
    r.push(1_000, key(1), 0, PSH_ACK, &[0, 9, 1], false, &mut out);
    r.push(
        20_000_000_000,
        key(2),
        0,
        PSH_ACK,
        &[0, 9, 1],
        false,
        &mut out,
    );
    r.expire(31_000_000_000);
    let s = r.stats();
    assert_eq!((r.flows.len(), s.flows_evicted, s.bytes_dropped), (1, 1, 3));
    r.expire(60_000_000_000);
    assert_eq!(r.flows.len(), 0);
    // The flow's LRU entry went with it: new flows still fit.
    r.push(
        70_000_000_000,
        key(3),
        0,
        PSH_ACK,
        &[0, 9, 1],
        false,
        &mut out,
    );
    assert_eq!(r.flows.len(), 1);
}

#[test]
fn garbage_never_panics_and_stays_bounded() {
    let mut r = TcpReassembler::new(TcpLimits {
        max_flows: 8,
        max_buffer: 600,
        idle_ns: 1_000,
    });
    let mut state = 0x853c_49e6_748f_ea9bu64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let mut out = Vec::new();
    let mut seqs = [0u32; 16];
    for t in 0..50_000u64 {
        let r0 = next();
        let f = (r0 % 16) as usize;
        let len = (r0 >> 8) as usize % 300;
        let payload: Vec<u8> = (0..len).map(|_| next() as u8).collect();
        // Mostly in order, sometimes jumping back or ahead.
        let seq = match (r0 >> 20) % 8 {
            0 => seqs[f].wrapping_sub((r0 >> 24) as u32 % 500),
            1 => seqs[f].wrapping_add((r0 >> 24) as u32 % 5_000),
            2 => (r0 >> 32) as u32,
            _ => seqs[f],
        };
        seqs[f] = seq.wrapping_add(len as u32);
        let flags =
            [PSH_ACK, PSH_ACK, PSH_ACK, TCP_SYN, TCP_FIN, TCP_RST, 0x10][(r0 >> 40) as usize % 7];
        r.push(
            t,
            key(f as u16),
            seq,
            flags,
            &payload,
            (r0 >> 50) % 13 == 0,
            &mut out,
        );
        for flow in r.flows.values() {
            assert!(flow.pending.len() <= MAX_PENDING_SEGMENTS);
            assert!(flow.held_bytes() <= 600, "{}", flow.held_bytes());
        }
        assert!(r.flows.len() <= 8);
        assert_eq!(r.lru.len(), r.flows.len());
        if t % 1_000 == 0 {
            r.expire(t);
        }
        out.clear();
    }
}
