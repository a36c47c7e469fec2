use super::*;
use crate::{
    correlate::LegRole, decode::dns, event::Direction, output::record::HopRecord,
    test_support::fixtures,
};

/// A query for `name` A with DNS id `id`, as an IPv4/UDP packet and its record.
fn query(ts_ns: u64, ifindex: u32, id: u16, name: &str) -> (CapturedPacket, PacketRecord) {
    let mut msg = id.to_be_bytes().to_vec();
    msg.extend([1, 0, 0, 1, 0, 0, 0, 0, 0, 0]);
    for l in name.trim_end_matches('.').split('.') {
        msg.push(l.len() as u8);
        msg.extend(l.as_bytes());
    }
    msg.extend([0, 0, 1, 0, 1]);
    let udp_len = 8 + msg.len() as u16;
    let total = 20 + udp_len;
    let mut data = vec![
        0x45, 0, 0, 0, 0x12, 0x34, 0, 0, 64, 17, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2,
    ];
    data[2..4].copy_from_slice(&total.to_be_bytes());
    data.extend(5000u16.to_be_bytes());
    data.extend(53u16.to_be_bytes());
    data.extend(udp_len.to_be_bytes());
    data.extend([0, 0]);
    data.extend(&msg);
    let mut r = fixtures::malformed_packet("x");
    r.malformed = None;
    r.ts_ns = ts_ns;
    r.ifname = format!("if{ifindex}").into();
    r.ifindex = ifindex;
    r.dns = Some(dns::decode(&msg).unwrap().into());
    let p = CapturedPacket {
        ts_ns,
        cpu: Some(0),
        at: ObservationPoint {
            netns: 4096,
            ifindex,
            dir: Direction::Egress,
        },
        vlan: None,
        orig_len: data.len() as u32,
        data: data.into(),
    };
    (p, r)
}

fn hop(r: &PacketRecord) -> HopRecord {
    HopRecord {
        ts_ns: r.ts_ns,
        netns: r.netns.clone(),
        ifname: r.ifname.clone(),
        pod: Default::default(),
        dir: r.dir,
        src: fixtures::addr(&r.src.to_string()),
        dst: fixtures::addr(&r.dst.to_string()),
        dns_id: 1,
        qr: false,
        latency_ns: None,
        tunnel: None,
    }
}

fn cfg(max_bytes: usize) -> AnnotateConfig {
    AnnotateConfig {
        max_delay_ns: 10_000,
        max_bytes,
        transactions: true,
    }
}

/// Packets wait for their transaction and come out in capture order with it in the comment;
/// the copies of one packet at two hops share their `pkt=` id.
#[test]
fn packets_wait_for_their_transaction() {
    let mut a = Annotator::new(cfg(1 << 20));
    let (p1, r1) = query(100, 3, 7, "www.lab.test.");
    let (p2, r2) = query(200, 4, 7, "www.lab.test.");
    a.packet(&p1, &[&r1]);
    a.packet(&p2, &[&r2]);
    let mut out = Vec::new();
    a.release(300, false, &mut out);
    assert!(
        out.is_empty(),
        "released before its transaction was decided"
    );
    let mut leg = fixtures::leg(
        LegRole::Query,
        "10.0.0.1:5000",
        "10.96.0.10:53",
        "10.0.0.2:53",
        Some("NOERROR"),
        Some(5),
    );
    leg.hops = vec![hop(&r1), hop(&r2)];
    let mut t = fixtures::transaction(
        "www.lab.test.",
        "A",
        "10.0.0.1:5000",
        Some("NOERROR"),
        vec![leg],
    );
    t.id = 42;
    a.records(&[Record::Transaction(Box::new(t))]);
    a.release(300, false, &mut out);
    assert_eq!(out.len(), 2);
    assert!(
        out[0].comment.starts_with("txn=42 leg=0 hop=1/2 role=query msg=query dnat=10.96.0.10:53->10.0.0.2:53 dir=egress pkt="),
        "{}",
        out[0].comment
    );
    assert!(
        out[1].comment.starts_with("txn=42 leg=0 hop=2/2 "),
        "{}",
        out[1].comment
    );
    let id = |c: &str| c.split(" pkt=").nth(1).map(|s| s[..16].to_string());
    assert_eq!(id(&out[0].comment), id(&out[1].comment));
    assert_eq!(a.stats().annotated, 2);
}

/// Unclaimed packets go out after the delay; over the byte bound, early (counted).
#[test]
fn the_wait_is_bounded_in_time_and_bytes() {
    let mut a = Annotator::new(cfg(1 << 20));
    let (p, r) = query(100, 3, 7, "www.lab.test.");
    a.packet(&p, &[&r]);
    let mut out = Vec::new();
    a.release(100 + 9_999, false, &mut out);
    assert!(out.is_empty());
    a.release(100 + 10_000, false, &mut out);
    assert_eq!(out.len(), 1);
    assert_eq!(a.stats().unclaimed, 1);

    // Room for two and a half packets.
    let one = {
        let mut a = Annotator::new(cfg(1 << 20));
        let (p, r) = query(0, 3, 7, "www.lab.test.");
        a.packet(&p, &[&r]);
        a.bytes
    };
    let mut a = Annotator::new(cfg(one * 5 / 2));
    for ts in 0..4 {
        let (p, r) = query(ts, 3, 7, "www.lab.test.");
        a.packet(&p, &[&r]);
    }
    let mut out = Vec::new();
    a.release(5, false, &mut out);
    assert!(!out.is_empty() && out.len() < 4, "{}", out.len());
    assert_eq!(a.stats().early, out.len() as u64);
    a.release(5, true, &mut out);
    assert_eq!(out.len(), 4, "every packet comes out exactly once");
    assert_eq!(
        out.iter().map(|p| p.ts_ns).collect::<Vec<_>>(),
        [0, 1, 2, 3]
    );
}

/// A race drop marks its query's copies and drop; a loop marks its question's packets, also
/// those only counted (no record) while it goes on.
#[test]
fn races_and_loops_mark_their_packets() {
    let mut a = Annotator::new(cfg(1 << 20));
    let (p, r) = query(100, 3, 4660, "api.lab.test.");
    a.packet(&p, &[&r]);
    let (other, ro) = query(101, 3, 4661, "api.lab.test.");
    a.packet(&other, &[&ro]);
    let mut race = fixtures::race(RaceVerdict::RaceDrop, "10.0.0.1:5000", 4660, "A");
    race.sibling = race.dropped.clone().map(|mut s| {
        s.dns_id = 4661;
        s.question = crate::output::record::QuestionRecord::new(
            s.question.name.clone(),
            "AAAA".into(),
            "IN".into(),
        );
        s
    });
    a.records(&[Record::Race(Box::new(race))]);
    let (l, _) = query(102, 3, 9, "storm.lab.test.");
    a.records(&[Record::Loop(fixtures::loop_record(
        7,
        LoopState::Detected,
        90,
    ))]);
    a.packet(&l, &[]);
    let mut out = Vec::new();
    a.release(0, true, &mut out);
    assert!(
        out[0]
            .comment
            .starts_with("race=race-drop sibling=[AAAA id=0x1235 ->10.244.1.3:53] "),
        "{}",
        out[0].comment
    );
    assert!(!out[1].comment.contains("race="), "{}", out[1].comment);
    assert!(
        out[2].comment.starts_with(
            "loop=7 cycle=[10.244.1.3:40000 → 10.96.0.10:53 ⇒DNAT 10.244.1.4:53 (node/vdnsb)] "
        ),
        "{}",
        out[2].comment
    );
}

#[test]
fn packet_ids_ignore_nat_and_follow_the_payload() {
    let (a, _) = query(1, 3, 7, "www.lab.test.");
    let mut natted = a.data.to_vec();
    natted[16..20].copy_from_slice(&[10, 244, 1, 3]);
    natted[22..24].copy_from_slice(&5353u16.to_be_bytes());
    assert_eq!(packet_id(&a.data), packet_id(&natted));
    let (b, _) = query(1, 3, 8, "www.lab.test.");
    assert_ne!(packet_id(&a.data), packet_id(&b.data));
    assert_ne!(packet_id(&[]), packet_id(&[0x45]));
}

/// The held packets' account of their bytes covers what they take from the allocator
/// (the packet, its comment, the question, the time index and the entry itself), so
/// `max_bytes` bounds the memory held, not only the packets' payload.
#[test]
fn the_byte_bound_covers_what_held_packets_take() {
    let names: Vec<String> = (0..20_000)
        .map(|i| format!("n{i}.default.svc.cluster.local."))
        .collect();
    let (a, taken) = crate::memory::heap_bytes_of(|| {
        let mut a = Annotator::new(cfg(1 << 30));
        for (i, n) in names.iter().enumerate() {
            // Made and gone as in the pipeline: the annotator keeps what it holds.
            let (p, r) = query(i as u64 * 1000, 3 + (i % 4) as u32, i as u16, n);
            a.packet(&p, &[&r]);
        }
        a
    });
    let Some(taken) = taken else {
        eprintln!("system allocator: no heap figure");
        return;
    };
    let counted = a.bytes;
    eprintln!(
        "{} packets held: {taken} bytes taken ({} a packet), {counted} counted ({} a packet)",
        names.len(),
        taken / names.len(),
        counted / names.len()
    );
    assert!(counted >= taken, "{counted} bytes counted, {taken} taken");
    assert!(
        counted <= 2 * taken,
        "{counted} bytes counted, {taken} taken"
    );
}
