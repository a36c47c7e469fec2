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
    a.records(&[Record::detected(race)]);
    let (l, _) = query(102, 3, 9, "storm.lab.test.");
    a.records(&[Record::detected(fixtures::loop_record(
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

/// An answer whose IP fragments 2 and 3 a rule in the client's namespace dropped: its copy
/// at the client's interface says what was lost, each fragment's drop says which fragment
/// it was and is claimed by the leg (and `analyze` still reads the drop back).
#[test]
fn dropped_fragments_of_an_answer_are_named_in_the_comments() {
    use crate::decode::record::{DroppedFragment, DroppedPart, MissingRange};
    let mut a = Annotator::new(cfg(1 << 20));
    let (p, r) = query(100, 3, 7, "big.lab.test.");
    let fragment = |number: usize, ts_ns: u64| {
        let mut d = fixtures::drop_record("NETFILTER_DROP", None);
        d.ts_ns = ts_ns;
        d.fragment = Some(DroppedFragment {
            ip_id: 9,
            offset: (number - 1) * 1232,
            len: if number == 3 { 1094 } else { 1232 },
            number: Some(number),
            fragments: Some(3),
            total_len: Some(3558),
        });
        let k = KernelDrop {
            ts_ns,
            cpu: 1,
            netns: 4096,
            ifindex: 7,
            reason: 0,
            location: 0,
            ct: None,
            orig_len: 60,
            data: vec![0x45; 60].into(),
            confirm_failed: false,
            named: None,
        };
        (k, d)
    };
    let (k2, d2) = fragment(2, 90);
    let (k3, d3) = fragment(3, 110);
    // In capture order: fragment 2 dropped before fragment 3 completed the answer.
    a.drop(&k2, &d2);
    a.packet(&p, &[&r]);
    a.drop(&k3, &d3);
    let mut leg = fixtures::dropped(
        fixtures::leg(
            LegRole::Query,
            "10.0.0.1:5000",
            "10.0.0.2:53",
            "10.0.0.2:53",
            None,
            None,
        ),
        "NETFILTER_DROP",
    );
    leg.rcode = Some("NOERROR".into());
    let mut response = hop(&r);
    response.qr = true;
    leg.hops = vec![response];
    if let Some(d) = leg.drop.as_mut() {
        d.ts_ns = 110;
        d.response = true;
        d.fragments = Some(DroppedPart {
            ip_id: 9,
            fragments: Some(3),
            numbers: vec![2, 3],
            bytes: vec![MissingRange {
                start: 1232,
                end: Some(3558),
            }],
            total_len: Some(3558),
        });
        d.fragment_drops_ns = vec![90, 110];
    }
    let mut t = fixtures::transaction("big.lab.test.", "TXT", "10.0.0.1:5000", None, vec![leg]);
    t.id = 42;
    a.records(&[Record::Transaction(Box::new(t))]);
    let mut out = Vec::new();
    a.release(200, false, &mut out);
    assert_eq!(out.len(), 3, "every one claimed: {out:?}");
    let [drop2, answer, drop3] = &out[..] else {
        unreachable!()
    };
    assert!(
        answer.comment.contains(
            "msg=response outcome=dropped lost=[IP fragments 2 and 3 of 3 (bytes 1232-3558 of 3558)] "
        ),
        "{}",
        answer.comment
    );
    for (d, words) in [
        (drop2, "IP fragment 2 of 3 (bytes 1232-2464 of 3558)"),
        (drop3, "IP fragment 3 of 3 (bytes 2464-3558 of 3558)"),
    ] {
        assert!(
            d.comment.starts_with("txn=42 leg=0 role=query drop="),
            "{}",
            d.comment
        );
        assert!(
            d.comment.ends_with(&format!(" fragment=[{words}]")),
            "{}",
            d.comment
        );
        let back = crate::source::file::drops::parse_drop_comment(&d.comment).unwrap();
        assert_eq!(back.netns, "node", "{back:?}");
    }
}
