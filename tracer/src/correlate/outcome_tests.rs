//! What a transaction says: answered, retried, truncated, dropped, late or unanswered, and
//! the lookup it belongs to.
use super::test_support::{at, msg, summary, Correlator, Feed, MS, TCP, UDP};
use super::*;
use crate::{
    decode::record::DroppedPart,
    event::{CtSnapshot, Direction},
    output::record::Record,
    test_support::fixtures::ct_flow,
};

#[test]
fn unanswered_then_retry_is_one_transaction() {
    let mut f = Feed::new();
    let p = at(3, 2, Direction::Egress);
    let q = |id| msg(id, false, "slow.test.", "A", "NOERROR", &[], false);
    f.see(
        MS,
        p,
        "client",
        "eth0",
        UDP,
        "10.244.1.2:5000",
        "10.96.0.10:53",
        q(1),
    );
    // Not reported at the timeout: the retry may still come.
    assert!(f.txs(5_100 * MS).is_empty());
    let t_retry = MS + 5_000 * MS;
    f.see(
        t_retry,
        p,
        "client",
        "eth0",
        UDP,
        "10.244.1.2:5001",
        "10.96.0.10:53",
        q(2),
    );
    f.see(
        t_retry + 20 * MS,
        at(3, 2, Direction::Ingress),
        "client",
        "eth0",
        UDP,
        "10.96.0.10:53",
        "10.244.1.2:5001",
        msg(2, true, "slow.test.", "A", "NOERROR", &["10.1.1.1"], false),
    );
    let txs = f.txs(7_000 * MS);
    assert_eq!(txs.len(), 1, "{txs:?}");
    let t = &txs[0];
    assert_eq!(t.legs.len(), 2);
    assert_eq!(t.legs[0].outcome, LegOutcome::Unanswered);
    assert_eq!(t.legs[1].role, LegRole::Retry);
    assert_eq!(t.outcome, Outcome::Answered);
    assert!(
        summary(t).contains("timeout after 5.0 s, retried, answered at +5.02 s"),
        "{}",
        summary(t)
    );
}

#[test]
fn never_answered_is_reported_after_timeout_and_grace() {
    let mut f = Feed::new();
    f.see(
        MS,
        at(3, 2, Direction::Egress),
        "client",
        "eth0",
        UDP,
        "10.244.1.2:5000",
        "10.250.0.99:53",
        msg(1, false, "void.test.", "A", "NOERROR", &[], false),
    );
    assert!(f.txs(6_000 * MS).is_empty());
    let txs = f.txs(7_000 * MS);
    assert_eq!(txs.len(), 1);
    assert_eq!(txs[0].outcome, Outcome::Unanswered);
    assert!(
        summary(&txs[0]).starts_with("unanswered after 5.0 s"),
        "{}",
        summary(&txs[0])
    );
}

#[test]
fn truncated_then_tcp_is_one_transaction() {
    let mut f = Feed::new();
    let p_out = at(3, 2, Direction::Egress);
    let p_in = at(3, 2, Direction::Ingress);
    f.see(
        MS,
        p_out,
        "c",
        "eth0",
        UDP,
        "10.244.1.2:5000",
        "10.250.0.53:53",
        msg(1, false, "big.test.", "TXT", "NOERROR", &[], false),
    );
    f.see(
        2 * MS,
        p_in,
        "c",
        "eth0",
        UDP,
        "10.250.0.53:53",
        "10.244.1.2:5000",
        msg(1, true, "big.test.", "TXT", "NOERROR", &[], true),
    );
    f.see(
        3 * MS,
        p_out,
        "c",
        "eth0",
        TCP,
        "10.244.1.2:6000",
        "10.250.0.53:53",
        msg(2, false, "big.test.", "TXT", "NOERROR", &[], false),
    );
    f.see(
        5 * MS,
        p_in,
        "c",
        "eth0",
        TCP,
        "10.250.0.53:53",
        "10.244.1.2:6000",
        msg(2, true, "big.test.", "TXT", "NOERROR", &["\"x\""], false),
    );
    let txs = f.txs(1_000 * MS);
    assert_eq!(txs.len(), 1, "{txs:?}");
    assert_eq!(txs[0].legs[0].outcome, LegOutcome::Truncated);
    assert_eq!(txs[0].legs[1].role, LegRole::TcpFallback);
    assert!(
        summary(&txs[0]).starts_with("truncated, retried over TCP, NOERROR"),
        "{}",
        summary(&txs[0])
    );
}

#[test]
fn search_list_expansion_is_one_lookup() {
    let mut f = Feed::new();
    let p_out = at(3, 2, Direction::Egress);
    let p_in = at(3, 2, Direction::Ingress);
    let names = [
        "www.lab.test.default.svc.cluster.local.",
        "www.lab.test.svc.cluster.local.",
        "www.lab.test.cluster.local.",
        "www.lab.test.",
    ];
    let mut ts = MS;
    for (i, name) in names.iter().enumerate() {
        for (j, qtype) in ["A", "AAAA"].iter().enumerate() {
            let id = (i * 2 + j) as u16;
            let last = i == names.len() - 1;
            f.see(
                ts,
                p_out,
                "c",
                "eth0",
                UDP,
                "10.244.1.2:5000",
                "10.96.0.10:53",
                msg(id, false, name, qtype, "NOERROR", &[], false),
            );
            let (rcode, ans): (&str, &[&str]) = if last {
                ("NOERROR", &["10.250.0.80"])
            } else {
                ("NXDOMAIN", &[])
            };
            f.see(
                ts + MS,
                p_in,
                "c",
                "eth0",
                UDP,
                "10.96.0.10:53",
                "10.244.1.2:5000",
                msg(id, true, name, qtype, rcode, ans, false),
            );
        }
        ts += 2 * MS;
    }
    // Another client's unrelated query is another lookup.
    f.see(
        ts,
        at(4, 2, Direction::Egress),
        "d",
        "eth0",
        UDP,
        "10.244.1.9:5000",
        "10.96.0.10:53",
        msg(99, false, "www.lab.test.", "A", "NOERROR", &[], false),
    );
    let mut txs = f.txs(2_000 * MS);
    // The unanswered one is reported after its timeout.
    txs.extend(f.txs(8_000 * MS));
    let lookup = txs[0].lookup.id;
    let same: Vec<_> = txs.iter().filter(|t| t.lookup.id == lookup).collect();
    assert_eq!(same.len(), 8, "{txs:#?}");
    assert_eq!(
        same.iter()
            .filter(|t| t.rcode.as_deref() == Some("NXDOMAIN"))
            .count(),
        6
    );
    let last = same
        .iter()
        .find(|t| t.question.name == "www.lab.test." && t.question.qtype == "A")
        .unwrap();
    assert_eq!(last.lookup.step, 3);
    assert_eq!(last.answers, vec!["A 10.250.0.80"]);
    assert!(txs
        .iter()
        .any(|t| t.lookup.id != lookup && t.client.to_string().starts_with("10.244.1.9")));
}

#[test]
fn drop_is_attached_to_its_leg() {
    let mut f = Feed::new();
    let q = || msg(5, false, "d.test.", "A", "NOERROR", &[], false);
    f.see(
        MS,
        at(1, 10, Direction::Ingress),
        "node",
        "vclient",
        UDP,
        "10.244.1.2:5000",
        "10.96.0.10:53",
        q(),
    );
    let flow = |s, d| ct_flow(UDP.number(), s, d);
    f.c.on_observed(Observed::Drop(Box::new(DropObservation {
        ts_ns: MS + 1000,
        cpu: 0,
        netns_cookie: 1,
        netns: "node".into(),
        ifname: "vclient".into(),
        reason: "NETFILTER_DROP".into(),
        location: "nft_do_chain+0x3e8".into(),
        function: "nft_do_chain".into(),
        benign: false,
        proto: UDP,
        src: "10.244.1.2:5000".parse().unwrap(),
        dst: "10.244.1.3:53".parse().unwrap(),
        confirm_failed: None,
        ct: Some(CtSnapshot {
            status: 0x120,
            orig: flow("10.244.1.2:5000", "10.96.0.10:53"),
            reply: flow("10.244.1.3:53", "10.244.1.2:5000"),
        }),
        msg: Some(q().into()),
        fragment: None,
    })));
    f.c.tick(8_000 * MS, &mut f.out);
    assert!(
        !f.out.iter().any(|r| matches!(
            r,
            Record::Detected(crate::output::record::Detected::Race(_))
        )),
        "a rule drop is not a race"
    );
    let txs = f.txs(8_000 * MS);
    assert_eq!(txs.len(), 1);
    assert_eq!(txs[0].outcome, Outcome::Dropped);
    assert_eq!(txs[0].legs[0].outcome, LegOutcome::Dropped);
    assert!(
        summary(&txs[0]).contains("NETFILTER_DROP"),
        "{}",
        summary(&txs[0])
    );
    assert_eq!(f.c.stats().drops_attached, 1);
}

/// A response the capture cut answers the transaction like any other, with what was seen
/// of it and a note; a copy of it captured whole at a later hop replaces the cut one.
#[test]
fn cut_response_answers_its_transaction() {
    let cut = Cut {
        captured_bytes: 200,
        message_bytes: 731,
        questions: 0,
        answers: 7,
        authority: 0,
        additional: 1,
    };
    let q = || msg(9, false, "medium.lab.test.", "TXT", "NOERROR", &[], false);
    let cut_answer = || DnsMessage {
        cut: Some(cut),
        ..msg(
            9,
            true,
            "medium.lab.test.",
            "TXT",
            "NOERROR",
            &["\"00abc\""],
            false,
        )
    };
    let client = "10.244.1.2:5000";
    let server = "10.250.0.53:53";
    let out_p = at(1, 10, Direction::Egress);
    let in_p = at(1, 10, Direction::Ingress);

    let mut f = Feed::new();
    f.see(MS, out_p, "client", "eth0", UDP, client, server, q());
    f.see(
        2 * MS,
        in_p,
        "client",
        "eth0",
        UDP,
        server,
        client,
        cut_answer(),
    );
    let txs = f.txs(2_000 * MS);
    assert_eq!(txs.len(), 1, "{txs:#?}");
    let t = &txs[0];
    assert_eq!(t.outcome, Outcome::Answered);
    assert_eq!(t.rcode.as_deref(), Some("NOERROR"));
    assert_eq!(t.answers, ["TXT \"00abc\""]);
    assert_eq!(t.answer_cut, Some(cut));
    assert_eq!(t.legs[0].outcome, LegOutcome::Answered);
    assert_eq!(t.legs[0].answer_cut, Some(cut));
    assert!(
        summary(t)
            .ends_with("; answer cut by the capture at 200 of 731 bytes: 1 of 8 answers seen"),
        "{}",
        summary(t)
    );
    assert!(
        summary(t).starts_with("NOERROR TXT \"00abc\" in 1.00 ms"),
        "{}",
        summary(t)
    );
    let text = crate::output::text::transaction_block(t);
    assert!(
        text.contains("NOERROR (cut by the capture at 200 of 731 bytes)"),
        "{text}"
    );
    let json = serde_json::to_value(t).unwrap();
    assert_eq!(json["answer_cut"]["answers"], 7);
    assert_eq!(json["legs"][0]["answer_cut"]["message_bytes"], 731);

    // Seen cut at the first hop and whole at the next: the whole one counts.
    let mut f = Feed::new();
    let whole = || {
        msg(
            9,
            true,
            "medium.lab.test.",
            "TXT",
            "NOERROR",
            &["\"00abc\"", "\"01abc\""],
            false,
        )
    };
    f.see(MS, out_p, "client", "eth0", UDP, client, server, q());
    f.see(
        2 * MS,
        in_p,
        "client",
        "eth0",
        UDP,
        server,
        client,
        cut_answer(),
    );
    f.see(3 * MS, out_p, "node", "veth", UDP, server, client, whole());
    let txs = f.txs(2_000 * MS);
    let t = &txs[0];
    assert_eq!(t.answer_cut, None);
    assert_eq!(t.answers.len(), 2);
    assert!(!summary(t).contains("cut"), "{}", summary(t));
    assert_eq!(
        t.latency_ns,
        Some(MS),
        "the first (cut) copy still times the answer"
    );
    // An answered transaction without a cut has no `answer_cut` in JSON.
    let json = serde_json::to_value(t).unwrap();
    assert!(json.get("answer_cut").is_none(), "{json}");
}

/// An answer seen on the way (at the upstream) but whose fragments never all reached the
/// client's interface is not the client's: the fragment loss makes the transaction dropped.
/// Without news of a loss, such a transaction waits the answer grace before it is answered.
#[test]
fn an_answer_lost_on_the_way_is_dropped_not_answered() {
    for lost in [true, false] {
        let mut f = Feed::new();
        let client = at(2, 2, Direction::Egress);
        let q = || msg(9, false, "big.test.", "TXT", "NOERROR", &[], false);
        let a = || msg(9, true, "big.test.", "TXT", "NOERROR", &["\"x\""], false);
        let (c, s) = ("10.244.1.2:5000", "10.250.0.53:53");
        f.see(MS, client, "client", "eth0", UDP, c, s, q());
        f.see(
            MS + 10,
            at(3, 2, Direction::Ingress),
            "up",
            "eth0",
            UDP,
            c,
            s,
            q(),
        );
        f.see(
            2 * MS,
            at(3, 2, Direction::Egress),
            "up",
            "eth0",
            UDP,
            s,
            c,
            a(),
        );
        // Settled (300 ms quiet) but not at the client yet: not reported.
        assert!(f.txs(1_000 * MS).is_empty());
        if lost {
            let mut partial = a();
            partial.answers.clear();
            f.c.on_observed(Observed::Drop(Box::new(DropObservation {
                ts_ns: 2_002 * MS,
                cpu: 0,
                netns_cookie: 2,
                netns: "client".into(),
                ifname: "eth0".into(),
                reason: FRAGMENT_LOSS.into(),
                location: "fragment 2 of 3 never seen".into(),
                function: String::new(),
                benign: false,
                proto: UDP,
                src: s.parse().unwrap(),
                dst: c.parse().unwrap(),
                ct: None,
                confirm_failed: None,
                msg: Some(partial.into()),
                fragment: None,
            })));
        }
        let txs = f.txs(3_000 * MS);
        assert_eq!(txs.len(), 1, "lost: {lost}");
        let t = &txs[0];
        if lost {
            assert_eq!(
                (t.outcome, t.legs[0].outcome),
                (Outcome::Dropped, LegOutcome::Dropped)
            );
            assert_eq!(
                summary(t),
                "answer lost on the way: fragment 2 of 3 never seen at client/eth0, unanswered"
            );
            assert!(t.legs[0].drop.as_ref().is_some_and(|d| d.response));
        } else {
            assert_eq!(
                (t.outcome, t.legs[0].outcome),
                (Outcome::Answered, LegOutcome::Answered)
            );
        }
    }
}

/// A client pod (namespace 2, `eth0` = ifindex 2) asking 10.96.0.10 from `cport` with `id`
/// at `ts`, and the answer reaching its `eth0` at `answer_ts` (if any).
fn pod_query(f: &mut Feed, ts: u64, cport: u16, id: u16, answer_ts: Option<u64>) {
    let client = format!("10.244.1.2:{cport}");
    f.see(
        ts,
        at(2, 2, Direction::Egress),
        "client",
        "eth0",
        UDP,
        &client,
        "10.96.0.10:53",
        msg(id, false, "late.lab.test.", "A", "NOERROR", &[], false),
    );
    if let Some(a) = answer_ts {
        f.see(
            a,
            at(2, 2, Direction::Ingress),
            "client",
            "eth0",
            UDP,
            "10.96.0.10:53",
            &client,
            msg(
                id,
                true,
                "late.lab.test.",
                "A",
                "NOERROR",
                &["10.250.0.80"],
                false,
            ),
        );
    }
}

/// The kernel dropping the answer to `cport`/`id` in the client's namespace at `ts`.
fn answer_drop_at_client(f: &mut Feed, ts: u64, cport: u16, id: u16, reason: &str, location: &str) {
    answer_drop(
        f,
        ts,
        (2, "client", "eth0"),
        cport,
        id,
        (reason, location),
        None,
    );
}

/// The kernel dropping (part of) the answer to `cport`/`id` at `ts` in namespace
/// `(cookie, name, interface)`.
fn answer_drop(
    f: &mut Feed,
    ts: u64,
    (netns_cookie, netns, ifname): (u64, &str, &str),
    cport: u16,
    id: u16,
    (reason, location): (&str, &str),
    fragment: Option<DroppedPart>,
) {
    f.c.on_observed(Observed::Drop(Box::new(DropObservation {
        ts_ns: ts,
        cpu: 0,
        netns_cookie,
        netns: netns.into(),
        ifname: ifname.into(),
        reason: reason.into(),
        location: location.into(),
        function: location.split('+').next().unwrap_or("").into(),
        benign: false,
        proto: UDP,
        src: "10.96.0.10:53".parse().unwrap(),
        dst: format!("10.244.1.2:{cport}").parse().unwrap(),
        confirm_failed: None,
        ct: None,
        msg: Some(
            msg(
                id,
                true,
                "late.lab.test.",
                "A",
                "NOERROR",
                &["10.250.0.80"],
                false,
            )
            .into(),
        ),
        fragment,
    })));
}

/// Fragment `number` of an answer of three fragments of 1232 bytes (3558 in all), as the
/// decoder names a dropped one from its datagram's first fragment.
fn fragment_of_three(ip_id: u32, number: usize) -> DroppedPart {
    crate::decode::record::DroppedFragment {
        ip_id,
        offset: (number - 1) * 1232,
        len: if number == 3 { 3558 - 2464 } else { 1232 },
        number: Some(number),
        fragments: Some(3),
        total_len: Some(3558),
    }
    .part()
}

const FRAG_RULE: (&str, &str) = ("NETFILTER_DROP", "nft_do_chain+0x46f");

/// A rule in the client pod dropping the answer's fragments 2 and 3 (`ip6tables -A INPUT -m
/// frag`): every fragment reached the pod's `eth0`, so the answer is whole there (stamped
/// when fragment 3 completed it) and the kernel dropped fragment 2 before that, fragment 3
/// after. The answer reached the client's door: `dropped`, never "unanswered", and what was
/// dropped is named — both fragments, in one leg drop, each kernel drop kept for the
/// evidence.
#[test]
fn an_answers_fragments_dropped_in_the_clients_namespace_are_named() {
    let mut f = Feed::new();
    pod_query(&mut f, MS, 40000, 7, Some(3 * MS));
    let client = (2, "client", "eth0");
    answer_drop(
        &mut f,
        3 * MS - 10_000,
        client,
        40000,
        7,
        FRAG_RULE,
        Some(fragment_of_three(9, 2)),
    );
    answer_drop(
        &mut f,
        3 * MS + 20_000,
        client,
        40000,
        7,
        FRAG_RULE,
        Some(fragment_of_three(9, 3)),
    );
    let txs = f.txs(20_000 * MS);
    let [t] = &txs[..] else { panic!("{txs:?}") };
    assert_eq!(t.outcome, Outcome::Dropped, "{}", summary(t));
    assert_eq!(
        summary(t),
        "answer NOERROR reached the client's interface, then was dropped by the kernel \
         (NETFILTER_DROP at nft_do_chain+0x46f): IP fragments 2 and 3 of 3 (bytes 1232-3558 of 3558)"
    );
    let leg = &t.legs[0];
    assert_eq!(leg.outcome, LegOutcome::Dropped);
    let d = leg.drop.as_ref().unwrap();
    assert_eq!(&*d.netns, "client");
    let part = d.fragments.as_ref().unwrap();
    assert_eq!((part.fragments, &part.numbers[..]), (Some(3), &[2, 3][..]));
    assert_eq!(d.fragment_drops_ns, [3 * MS - 10_000, 3 * MS + 20_000]);
    let json = serde_json::to_value(leg).unwrap();
    assert_eq!(
        json["drop"]["fragments"],
        serde_json::json!({
            "ip_id": 9, "fragments": 3, "numbers": [2, 3],
            "bytes": [{"start": 1232, "end": 3558}], "total_len": 3558
        }),
        "{json}"
    );
}

/// The same fragments dropped on the node, before the client's interface: the client never
/// saw the answer, which is unanswered for it — and the drop still says what it took. A
/// fragment of another datagram (another IP id) dropped there too is not counted as this
/// answer's.
#[test]
fn an_answers_fragments_dropped_on_the_way_are_named_and_unanswered() {
    let mut f = Feed::new();
    pod_query(&mut f, MS, 40000, 7, None);
    // The answer, whole on the node's ingress from the server.
    f.see(
        2 * MS,
        at(1, 4, Direction::Ingress),
        "node",
        "vdnsa",
        UDP,
        "10.96.0.10:53",
        "10.244.1.2:40000",
        msg(
            7,
            true,
            "late.lab.test.",
            "A",
            "NOERROR",
            &["10.250.0.80"],
            false,
        ),
    );
    let node = (1, "node", "vclient");
    answer_drop(
        &mut f,
        2 * MS + 10_000,
        node,
        40000,
        7,
        FRAG_RULE,
        Some(fragment_of_three(9, 3)),
    );
    answer_drop(
        &mut f,
        2 * MS + 20_000,
        node,
        40000,
        7,
        FRAG_RULE,
        Some(fragment_of_three(10, 2)),
    );
    let txs = f.txs(20_000 * MS);
    let [t] = &txs[..] else { panic!("{txs:?}") };
    assert_eq!(t.outcome, Outcome::Dropped, "{}", summary(t));
    assert_eq!(
        summary(t),
        "dropped by the kernel (NETFILTER_DROP at nft_do_chain+0x46f): the answer's IP \
         fragment 3 of 3 (bytes 2464-3558 of 3558), unanswered"
    );
    let d = t.legs[0].drop.as_ref().unwrap();
    assert_eq!(d.fragments.as_ref().map(|p| &p.numbers[..]), Some(&[3][..]));
    assert_eq!(d.fragment_drops_ns, [2 * MS + 10_000]);
}

#[test]
fn an_answer_after_the_client_closed_its_socket_is_late_not_answered() {
    let mut f = Feed::new();
    pod_query(&mut f, MS, 40000, 7, Some(1_601 * MS));
    answer_drop_at_client(
        &mut f,
        1_601 * MS + 20_000,
        40000,
        7,
        "NO_SOCKET",
        "__udp4_lib_rcv+0x5c8",
    );
    let txs = f.txs(20_000 * MS);
    assert_eq!(txs.len(), 1);
    let t = &txs[0];
    assert_eq!(t.outcome, Outcome::Late, "{}", summary(t));
    assert_eq!(t.legs[0].outcome, LegOutcome::Late);
    assert_eq!(t.latency_ns, None, "the client got nothing");
    assert!(
        matches!(&t.summary, Summary::Late { answer_ns, gave_up_ns: None, reason, .. }
            if *answer_ns == 1_600 * MS && reason == "NO_SOCKET"),
        "{:?}",
        t.summary
    );
    let s = summary(t);
    assert!(s.contains("after the client had given up"), "{s}");
    assert!(s.contains("unanswered for the client"), "{s}");
    let json = serde_json::to_value(t).unwrap();
    assert_eq!(json["outcome"], "late");
    assert_eq!(json["late_answer_ns"], 1_600 * MS);
    assert_eq!(json["legs"][0]["outcome"], "late");
    assert_eq!(json["legs"][0]["drop"]["reason"], "NO_SOCKET");
}

#[test]
fn on_kernels_without_drop_reasons_the_receive_function_says_the_socket_was_gone() {
    let mut f = Feed::new();
    pod_query(&mut f, MS, 40000, 7, Some(1_601 * MS));
    answer_drop_at_client(
        &mut f,
        1_601 * MS + 20_000,
        40000,
        7,
        "UNKNOWN",
        "__udp4_lib_rcv+0x5c8",
    );
    let txs = f.txs(20_000 * MS);
    assert_eq!(txs[0].outcome, Outcome::Late, "{}", summary(&txs[0]));
}

#[test]
fn a_late_answer_after_the_retry_names_the_clients_timeout() {
    let mut f = Feed::new();
    // First query at +1 ms, the client's retry (new id, same socket) at +1001 ms, never
    // answered; the first query's answer comes at +1601 ms to a socket already closed.
    pod_query(&mut f, MS, 40000, 7, Some(1_601 * MS));
    pod_query(&mut f, 1_001 * MS, 40000, 8, None);
    answer_drop_at_client(
        &mut f,
        1_601 * MS + 20_000,
        40000,
        7,
        "NO_SOCKET",
        "__udp4_lib_rcv+0x5c8",
    );
    let txs = f.txs(30_000 * MS);
    assert_eq!(txs.len(), 1, "{txs:?}");
    let t = &txs[0];
    assert_eq!(t.outcome, Outcome::Late, "{}", summary(t));
    assert!(
        matches!(&t.summary, Summary::Late { gave_up_ns: Some(g), retried: true, .. } if *g == 1_000 * MS),
        "{:?}",
        t.summary
    );
    let s = summary(t);
    assert!(s.contains("after its own 1.00 s timeout"), "{s}");
}

#[test]
fn a_late_first_answer_does_not_hide_an_answered_retry() {
    let mut f = Feed::new();
    pod_query(&mut f, MS, 40000, 7, Some(1_601 * MS));
    pod_query(&mut f, 1_001 * MS, 40001, 7, Some(1_003 * MS));
    answer_drop_at_client(
        &mut f,
        1_601 * MS + 20_000,
        40000,
        7,
        "NO_SOCKET",
        "__udp4_lib_rcv+0x5c8",
    );
    let txs = f.txs(30_000 * MS);
    assert_eq!(txs.len(), 1, "{txs:?}");
    let t = &txs[0];
    assert_eq!(t.outcome, Outcome::Answered, "{}", summary(t));
    assert_eq!(t.latency_ns, Some(1_002 * MS));
    assert_eq!(t.legs[0].outcome, LegOutcome::Late);
    assert_eq!(t.legs[1].outcome, LegOutcome::Answered);
    assert!(
        matches!(t.summary, Summary::Answered(Answered::AfterTimeout { .. })),
        "{:?}",
        t.summary
    );
}

#[test]
fn a_duplicate_answer_dropped_after_the_first_was_delivered_stays_answered() {
    let mut f = Feed::new();
    pod_query(&mut f, MS, 40000, 7, Some(3 * MS));
    // The same answer again (a forwarder's retransmit answered twice): the socket is gone.
    f.see(
        5 * MS,
        at(2, 2, Direction::Ingress),
        "client",
        "eth0",
        UDP,
        "10.96.0.10:53",
        "10.244.1.2:40000",
        msg(
            7,
            true,
            "late.lab.test.",
            "A",
            "NOERROR",
            &["10.250.0.80"],
            false,
        ),
    );
    answer_drop_at_client(
        &mut f,
        5 * MS + 20_000,
        40000,
        7,
        "NO_SOCKET",
        "__udp4_lib_rcv+0x5c8",
    );
    let txs = f.txs(20_000 * MS);
    assert_eq!(txs.len(), 1);
    assert_eq!(txs[0].outcome, Outcome::Answered, "{}", summary(&txs[0]));
    assert_eq!(txs[0].legs[0].outcome, LegOutcome::Answered);
    assert_eq!(txs[0].latency_ns, Some(2 * MS));
}

#[test]
fn an_answer_in_time_stays_answered() {
    let mut f = Feed::new();
    pod_query(&mut f, MS, 40000, 7, Some(3 * MS));
    let txs = f.txs(20_000 * MS);
    assert_eq!(txs[0].outcome, Outcome::Answered);
    assert_eq!(txs[0].latency_ns, Some(2 * MS));
}

#[test]
fn an_answer_dropped_in_the_clients_namespace_is_dropped_not_answered() {
    let mut f = Feed::new();
    pod_query(&mut f, MS, 40000, 7, Some(3 * MS));
    answer_drop_at_client(
        &mut f,
        3 * MS + 20_000,
        40000,
        7,
        "NETFILTER_DROP",
        "nft_do_chain+0x3e8",
    );
    let txs = f.txs(20_000 * MS);
    assert_eq!(txs.len(), 1);
    let t = &txs[0];
    assert_eq!(t.outcome, Outcome::Dropped, "{}", summary(t));
    assert_eq!(t.legs[0].outcome, LegOutcome::Dropped);
    assert_eq!(t.latency_ns, None);
    // Dropped after the client's door: no fragments to name, and never "unanswered".
    assert_eq!(
        summary(t),
        "answer NOERROR reached the client's interface, then was dropped by the kernel \
         (NETFILTER_DROP at nft_do_chain+0x3e8)"
    );
    assert!(t.legs[0].drop.as_ref().unwrap().fragments.is_none());
}

#[test]
fn a_drop_in_another_namespace_after_the_answer_arrived_is_not_the_clients() {
    let mut f = Feed::new();
    pod_query(&mut f, MS, 40000, 7, Some(3 * MS));
    // The node's copy of a late duplicate, dropped on the node: not in the client's namespace.
    f.c.on_observed(Observed::Drop(Box::new(DropObservation {
        ts_ns: 4 * MS,
        cpu: 0,
        netns_cookie: 1,
        netns: "node".into(),
        ifname: "vclient".into(),
        reason: "NETFILTER_DROP".into(),
        location: "nft_do_chain+0x3e8".into(),
        function: "nft_do_chain".into(),
        benign: false,
        proto: UDP,
        src: "10.96.0.10:53".parse().unwrap(),
        dst: "10.244.1.2:40000".parse().unwrap(),
        confirm_failed: None,
        ct: None,
        msg: Some(
            msg(
                7,
                true,
                "late.lab.test.",
                "A",
                "NOERROR",
                &["10.250.0.80"],
                false,
            )
            .into(),
        ),
        fragment: None,
    })));
    let txs = f.txs(20_000 * MS);
    assert_eq!(txs[0].outcome, Outcome::Answered, "{}", summary(&txs[0]));
}

/// An answer handed over long after the reorder window, stamped before its query (a merged
/// capture's clocks, say): it was delivered, so the question was answered, with no negative
/// latency, never "unanswered" with an rcode (found by the correlate fuzz target).
#[test]
fn answer_stamped_before_its_query_is_answered() {
    let mut f = Feed::new();
    f.see(
        500 * MS,
        at(3, 2, Direction::Egress),
        "c",
        "eth0",
        UDP,
        "10.244.1.2:5000",
        "10.250.0.53:53",
        msg(1, false, "o.test.", "A", "NOERROR", &[], false),
    );
    assert!(f.txs(600 * MS).is_empty());
    f.see(
        100 * MS,
        at(3, 2, Direction::Ingress),
        "c",
        "eth0",
        UDP,
        "10.250.0.53:53",
        "10.244.1.2:5000",
        msg(1, true, "o.test.", "A", "NXDOMAIN", &[], false),
    );
    let txs = f.txs(10_000 * MS);
    assert_eq!(txs.len(), 1, "{txs:?}");
    assert_eq!(txs[0].outcome, Outcome::Answered, "{}", summary(&txs[0]));
    assert_eq!(txs[0].rcode.as_deref(), Some("NXDOMAIN"));
    // No negative latency, and no made-up 0 either: unknown, for the transaction as its leg.
    assert_eq!(txs[0].latency_ns, None);
    assert_eq!(txs[0].legs[0].latency_ns, None);
    assert_eq!(summary(&txs[0]), "NXDOMAIN (latency unknown)");
}

/// A retry of a transaction that already holds all the legs it may keep begins a transaction
/// of its own: no transaction outgrows the cap, and the retry's answer still answers (found
/// by the correlate fuzz target: a retry joined a full transaction without the cap check).
#[test]
fn a_retry_of_a_full_transaction_begins_its_own_and_is_answered() {
    let mut f = Feed {
        c: Correlator::new(
            CorrelateConfig {
                max_legs_per_transaction: 2,
                ..CorrelateConfig::default()
            },
            Clock::Epoch,
        ),
        out: vec![],
    };
    let p = at(3, 2, Direction::Egress);
    let q = |id| msg(id, false, "slow.test.", "A", "NOERROR", &[], false);
    for (i, id) in [1u16, 2, 3].into_iter().enumerate() {
        f.see(
            MS + i as u64 * 1_000 * MS,
            p,
            "client",
            "eth0",
            UDP,
            "10.244.1.2:5000",
            "10.96.0.10:53",
            q(id),
        );
    }
    f.see(
        2_020 * MS,
        at(3, 2, Direction::Ingress),
        "client",
        "eth0",
        UDP,
        "10.96.0.10:53",
        "10.244.1.2:5000",
        msg(3, true, "slow.test.", "A", "NOERROR", &["10.1.1.1"], false),
    );
    let txs = f.txs(30_000 * MS);
    assert_eq!(txs.len(), 2, "{txs:?}");
    assert!(txs.iter().all(|t| t.legs.len() <= 2), "{txs:?}");
    let (first, third) = (&txs[0], &txs[1]);
    assert_eq!(first.legs.len(), 2, "{}", summary(first));
    assert_eq!(first.legs[1].role, LegRole::Retry);
    assert_eq!(third.legs.len(), 1, "{}", summary(third));
    assert_eq!(third.outcome, Outcome::Answered, "{}", summary(third));
}
