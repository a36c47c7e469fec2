use super::*;
use hickory_proto::op::{Edns as HEdns, Message, MessageType, OpCode, Query, ResponseCode};
use hickory_proto::rr::rdata::opt::{ClientSubnet, EdnsOption as HOption};
use hickory_proto::rr::rdata::{A, AAAA, CNAME, MX, PTR, SOA, SRV, TXT};
use hickory_proto::rr::Record as HRecord;
use hickory_proto::rr::{Name, RData};
use std::net::Ipv4Addr;

fn name(s: &str) -> Name {
    Name::from_ascii(s).unwrap()
}

fn query_with_edns() -> Vec<u8> {
    let mut m = Message::new(12345, MessageType::Query, OpCode::Query);
    m.metadata.recursion_desired = true;
    m.add_query(Query::query(name("www.lab.test."), RecordType::A));
    let mut edns = HEdns::new();
    edns.set_max_payload(1232)
        .set_version(0)
        .set_dnssec_ok(true);
    let opts = edns.options_mut();
    opts.insert(HOption::Subnet(ClientSubnet::new(
        "1.2.3.0".parse().unwrap(),
        24,
        0,
    )));
    opts.insert(HOption::Unknown(10, vec![1, 2, 3, 4, 5, 6, 7, 8]));
    m.set_edns(edns);
    m.to_vec().unwrap()
}

#[test]
fn query_with_edns_ecs_cookie() {
    let m = decode(&query_with_edns()).unwrap();
    assert_eq!(m.id, 12345);
    assert!(!m.qr);
    assert_eq!(m.opcode, "QUERY");
    assert_eq!(m.rcode, "NOERROR");
    assert!(m.flags.rd && !m.flags.aa && !m.flags.ra);
    assert_eq!(
        m.questions,
        vec![Question {
            name: "www.lab.test.".into(),
            qtype: "A".into(),
            class: "IN".into()
        }]
    );
    assert!(m.additional.is_empty(), "OPT must not appear in additional");
    let edns = m.edns.as_ref().unwrap();
    assert_eq!(
        (edns.udp_size, edns.version, edns.dnssec_ok),
        (1232, 0, true)
    );
    assert_eq!(
        edns.options,
        vec![
            EdnsOption {
                code: 8,
                name: "ECS".into(),
                data: "1.2.3.0/24/0".into()
            },
            EdnsOption {
                code: 10,
                name: "COOKIE".into(),
                data: "0102030405060708".into()
            },
        ]
    );
    assert_eq!(m.summary_line(), "12345+ [1au] A? www.lab.test.");
    let json = serde_json::to_value(&m).unwrap();
    assert_eq!(json["questions"][0]["type"], "A");
    assert_eq!(json["edns"]["options"][0]["data"], "1.2.3.0/24/0");
}

fn rr(n: &str, ttl: u32, data: RData) -> HRecord {
    HRecord::from_rdata(name(n), ttl, data)
}

/// A response of 7 answers of common types, 1 authority, 1 additional and an OPT.
fn common_response() -> Vec<u8> {
    let mut m = Message::new(4242, MessageType::Response, OpCode::Query);
    m.metadata.recursion_desired = true;
    m.metadata.recursion_available = true;
    m.metadata.authoritative = true;
    m.add_query(Query::query(name("www.lab.test."), RecordType::A));
    m.add_answer(rr(
        "www.lab.test.",
        30,
        RData::CNAME(CNAME(name("web.lab.test."))),
    ));
    m.add_answer(rr("web.lab.test.", 30, RData::A(A::new(10, 250, 0, 80))));
    m.add_answer(rr(
        "web.lab.test.",
        30,
        RData::AAAA(AAAA("fd00::50".parse().unwrap())),
    ));
    m.add_answer(rr(
        "_dns._udp.lab.test.",
        60,
        RData::SRV(SRV::new(10, 5, 53, name("ns1.lab.test."))),
    ));
    m.add_answer(rr(
        "lab.test.",
        60,
        RData::TXT(TXT::from_bytes(vec![
            &b"v=spf1 -all"[..],
            &b"say \"hi\"\\"[..],
            &b"\x00\xff"[..],
        ])),
    ));
    m.add_answer(rr(
        "80.0.250.10.in-addr.arpa.",
        60,
        RData::PTR(PTR(name("web.lab.test."))),
    ));
    m.add_answer(rr(
        "lab.test.",
        60,
        RData::MX(MX::new(10, name("mx.lab.test."))),
    ));
    m.add_authority(rr(
        "lab.test.",
        300,
        RData::SOA(SOA::new(
            name("ns1.lab.test."),
            name("hostmaster.lab.test."),
            2024010101,
            3600,
            600,
            86400,
            30,
        )),
    ));
    m.add_additional(rr("ns1.lab.test.", 60, RData::A(A::new(10, 250, 0, 53))));
    m.set_edns(HEdns::new());
    m.to_vec().unwrap()
}

#[test]
fn response_with_common_types() {
    let bytes = common_response();

    let d = decode(&bytes).unwrap();
    assert!(d.qr && d.flags.aa && d.flags.rd && d.flags.ra);
    let names: Vec<Text> = d.answers.iter().map(|r| r.rtype.name()).collect();
    let got: Vec<(&str, &str, &str)> = d
        .answers
        .iter()
        .zip(&names)
        .map(|(r, t)| (r.name.as_str(), &**t, r.data.as_str()))
        .collect();
    assert_eq!(
        got,
        vec![
            ("www.lab.test.", "CNAME", "web.lab.test."),
            ("web.lab.test.", "A", "10.250.0.80"),
            ("web.lab.test.", "AAAA", "fd00::50"),
            ("_dns._udp.lab.test.", "SRV", "10 5 53 ns1.lab.test."),
            (
                "lab.test.",
                "TXT",
                r#""v=spf1 -all" "say \"hi\"\\" "\000\255""#
            ),
            ("80.0.250.10.in-addr.arpa.", "PTR", "web.lab.test."),
            ("lab.test.", "MX", "10 mx.lab.test."),
        ]
    );
    assert_eq!(d.answers[0].ttl, 30);
    assert_eq!(d.answers[0].class, RrClass::IN);
    assert_eq!(
        d.authority[0].data,
        "ns1.lab.test. hostmaster.lab.test. 2024010101 3600 600 86400 30"
    );
    assert_eq!(d.additional.len(), 1);
    assert!(d.edns.is_some());
    assert_eq!(
        d.summary_line(),
        "4242* q: A? www.lab.test. NOERROR 7/1/2 CNAME web.lab.test., A 10.250.0.80, \
         AAAA fd00::50, SRV 10 5 53 ns1.lab.test., ..."
    );
}

#[test]
fn summary_matches_example() {
    let mut m = Message::new(12345, MessageType::Response, OpCode::Query);
    m.metadata.recursion_desired = true;
    m.metadata.recursion_available = true;
    m.add_query(Query::query(name("www.lab.test."), RecordType::A));
    m.add_answer(rr("www.lab.test.", 5, RData::A(A::new(10, 250, 0, 80))));
    m.set_edns(HEdns::new());
    let d = decode(&m.to_vec().unwrap()).unwrap();
    assert_eq!(
        d.summary_line(),
        "12345 q: A? www.lab.test. NOERROR 1/0/1 A 10.250.0.80"
    );
}

#[test]
fn extended_rcode_badvers() {
    let mut m = Message::new(7, MessageType::Response, OpCode::Query);
    m.metadata.response_code = ResponseCode::BADVERS;
    m.add_query(Query::query(name("x.test."), RecordType::AAAA));
    m.set_edns(HEdns::new());
    let bytes = m.to_vec().unwrap();
    // Header carries only the low 4 bits (0); the rest is in the OPT TTL.
    assert_eq!(bytes[3] & 0x0f, 0);
    let d = decode(&bytes).unwrap();
    assert_eq!(d.rcode, "BADVERS");
    assert_eq!(d.summary_line(), "7- q: AAAA? x.test. BADVERS 0/0/1");
}

#[test]
fn ipv4_formatting() {
    for ip in [
        [0, 0, 0, 0],
        [255, 255, 255, 255],
        [10, 9, 100, 199],
        [1, 20, 0, 250],
    ] {
        let mut s = String::new();
        push_ipv4(&mut s, ip);
        assert_eq!(s, Ipv4Addr::from(ip).to_string());
    }
}

#[test]
fn rcode_names_and_fallback() {
    assert_eq!(rcode_name(3), "NXDOMAIN");
    assert_eq!(rcode_name(2), "SERVFAIL");
    assert_eq!(rcode_name(23), "BADCOOKIE");
    assert_eq!(rcode_name(24), "RCODE24");
    assert_eq!(rcode_name(4095), "RCODE4095");
    assert_eq!(opcode_name(3), "OPCODE3");
    assert_eq!(type_name(65280), "TYPE65280");
    assert_eq!(type_name(65), "HTTPS");
    assert_eq!(class_name(3), "CH");
    assert_eq!(class_name(42), "CLASS42");
    assert_eq!(edns_option_name(65001), "OPT65001");
}

/// Builds `header` + raw body by hand.
fn raw(id: u16, flags: u16, counts: [u16; 4], body: &[u8]) -> Vec<u8> {
    let mut v = Vec::new();
    v.extend_from_slice(&id.to_be_bytes());
    v.extend_from_slice(&flags.to_be_bytes());
    for c in counts {
        v.extend_from_slice(&c.to_be_bytes());
    }
    v.extend_from_slice(body);
    v
}

fn reason(e: DnsError) -> String {
    match e {
        DnsError::Malformed { reason, .. } => reason,
        other => panic!("expected Malformed, got {other:?}"),
    }
}

#[test]
fn nxdomain_with_unknown_type_and_class() {
    // q: TYPE65280 CLASS42? a. ; authority: a. 3 TYPE65280 ... rdata 0xbeef
    let mut body = vec![1, b'a', 0, 0xff, 0x00, 0, 42];
    body.extend_from_slice(&[0xc0, 12, 0xff, 0x00, 0, 1, 0, 0, 0, 3, 0, 2, 0xbe, 0xef]);
    let d = decode(&raw(9, 0x8183, [1, 0, 1, 0], &body)).unwrap();
    assert_eq!(d.rcode, "NXDOMAIN");
    assert_eq!(d.questions[0].qtype, "TYPE65280");
    assert_eq!(d.questions[0].class, "CLASS42");
    assert_eq!(d.authority[0].data, "\\# 2 beef");
    assert_eq!(
        d.summary_line(),
        "9 q: TYPE65280 CLASS42? a. NXDOMAIN 0/1/0"
    );
}

#[test]
fn hostile_too_short_header() {
    assert_eq!(decode(&[]), Err(DnsError::TooShort(0)));
    assert_eq!(decode(&[0; 11]), Err(DnsError::TooShort(11)));
}

#[test]
fn hostile_huge_counts() {
    let e = decode(&raw(1, 0, [65535, 65535, 65535, 65535], &[])).unwrap_err();
    assert!(
        matches!(e, DnsError::CountsExceedMessage { have: 0, .. }),
        "{e}"
    );
    assert!(e.to_string().contains("qd 65535"));
    // Plausible counts but not enough bytes for even minimal records.
    let e = decode(&raw(1, 0, [0, 3, 0, 0], &[0; 20])).unwrap_err();
    assert!(matches!(
        e,
        DnsError::CountsExceedMessage {
            need: 33,
            have: 20,
            ..
        }
    ));
}

#[test]
fn hostile_pointer_to_itself() {
    // Question name is a pointer to offset 12: itself.
    let e = decode(&raw(1, 0, [1, 0, 0, 0], &[0xc0, 12, 0, 1, 0, 1])).unwrap_err();
    let r = reason(e.clone());
    assert!(r.contains("pointer loop"), "{r}");
    assert!(e.to_string().starts_with("question #0:"), "{e}");
}

#[test]
fn hostile_pointer_loop_between_names() {
    // Name A at 12: label "a" then pointer to 17; name B at 17: pointer back to 12.
    // A→B is a forward pointer; even if allowed, B→A would loop.
    let body = [1, b'a', 0xc0, 17, 0, 0xc0, 12, 0, 1, 0, 1];
    let r = reason(decode(&raw(1, 0, [1, 0, 0, 0], &body)).unwrap_err());
    assert!(r.contains("compression pointer"), "{r}");
    // Backward pointer into the middle of a name that then points forward to itself.
    let body = [
        1, b'a', 0xc0, 14, // q0 name at 12: "a" + ptr→14 (its own pointer bytes)
        0, 1, 0, 1,
    ];
    let r = reason(decode(&raw(1, 0, [1, 0, 0, 0], &body)).unwrap_err());
    assert!(r.contains("pointer"), "{r}");
}

#[test]
fn hostile_pointer_out_of_range() {
    let body = [0xff, 0xff, 0, 1, 0, 1];
    let r = reason(decode(&raw(1, 0, [1, 0, 0, 0], &body)).unwrap_err());
    assert!(r.contains("targets offset 16383"), "{r}");
}

#[test]
fn hostile_pointer_chain_in_rdata() {
    // Valid question, answer CNAME whose target points forward (past the message).
    let mut body = vec![1, b'a', 0, 0, 5, 0, 1];
    body.extend_from_slice(&[0xc0, 12, 0, 5, 0, 1, 0, 0, 0, 1, 0, 2, 0xc0, 0x40]);
    let e = decode(&raw(1, 0x8180, [1, 1, 0, 0], &body)).unwrap_err();
    assert!(matches!(
        e,
        DnsError::Malformed {
            section: Section::Answer,
            index: 0,
            ..
        }
    ));
    assert!(e.to_string().contains("CNAME rdata"), "{e}");
}

#[test]
fn hostile_label_too_long() {
    // 0x40 = 64: the top bits 01 are a reserved label type, not a length.
    let mut body = vec![0x40];
    body.extend_from_slice(&[b'x'; 64]);
    body.extend_from_slice(&[0, 0, 1, 0, 1]);
    let r = reason(decode(&raw(1, 0, [1, 0, 0, 0], &body)).unwrap_err());
    assert!(r.contains("0x40"), "{r}");
}

#[test]
fn hostile_name_too_long() {
    // 5 labels of 63 bytes = 320 bytes > 255.
    let mut body = Vec::new();
    for _ in 0..5 {
        body.push(63);
        body.extend_from_slice(&[b'z'; 63]);
    }
    body.extend_from_slice(&[0, 0, 1, 0, 1]);
    let r = reason(decode(&raw(1, 0, [1, 0, 0, 0], &body)).unwrap_err());
    assert!(r.contains("255"), "{r}");
}

#[test]
fn hostile_truncated_messages() {
    let full = query_with_edns();
    assert!(decode(&full).is_ok());
    for cut in 12..full.len() {
        assert!(decode(&full[..cut]).is_err(), "cut at {cut} decoded");
    }
    // Name without its terminating root label.
    let r = reason(decode(&raw(1, 0, [1, 0, 0, 0], &[3, b'a', b'b', b'c', 3, b'd'])).unwrap_err());
    assert!(r.contains("ends in the middle"), "{r}");
}

#[test]
fn hostile_rdlength_past_end() {
    let body = [0, 0, 1, 0, 1, 0, 0, 0, 0, 0xff, 0xff, 1, 2];
    let e = decode(&raw(1, 0x8000, [0, 1, 0, 0], &body)).unwrap_err();
    assert!(e.to_string().contains("rdata length 65535"), "{e}");
}

#[test]
fn hostile_rdata_misframed() {
    // A record with 5 bytes of rdata.
    let body = [0, 0, 1, 0, 1, 0, 0, 0, 0, 0, 5, 1, 2, 3, 4, 5];
    let e = decode(&raw(1, 0x8000, [0, 1, 0, 0], &body)).unwrap_err();
    assert!(e.to_string().contains("A rdata is 5 bytes"), "{e}");
    // NS whose name ends before the rdata does (trailing junk inside rdlength).
    let body = [0, 0, 2, 0, 1, 0, 0, 0, 0, 0, 3, 0, 0xaa, 0xbb];
    let e = decode(&raw(1, 0x8000, [0, 1, 0, 0], &body)).unwrap_err();
    assert!(e.to_string().contains("NS fields end"), "{e}");
    // TXT string longer than the rdata.
    let body = [0, 0, 16, 0, 1, 0, 0, 0, 0, 0, 2, 9, b'x'];
    let e = decode(&raw(1, 0x8000, [0, 1, 0, 0], &body)).unwrap_err();
    assert!(e.to_string().contains("TXT string declares 9"), "{e}");
}

#[test]
fn hostile_opt_placement_and_options() {
    let opt = |rdata: &[u8]| {
        let mut v = vec![0, 0, 41, 0x04, 0xd0, 0, 0, 0, 0];
        v.extend_from_slice(&(rdata.len() as u16).to_be_bytes());
        v.extend_from_slice(rdata);
        v
    };
    // OPT in the answer section.
    let e = decode(&raw(1, 0x8000, [0, 1, 0, 0], &opt(&[]))).unwrap_err();
    assert!(e.to_string().contains("outside the additional"), "{e}");
    // Two OPTs.
    let mut two = opt(&[]);
    two.extend_from_slice(&opt(&[]));
    let e = decode(&raw(1, 0x8000, [0, 0, 0, 2], &two)).unwrap_err();
    assert!(e.to_string().contains("second OPT"), "{e}");
    // Option length beyond the OPT rdata.
    let e = decode(&raw(1, 0, [0, 0, 0, 1], &opt(&[0, 10, 0, 50, 1, 2]))).unwrap_err();
    assert!(e.to_string().contains("EDNS option 10 declares 50"), "{e}");
    // Option header cut.
    let e = decode(&raw(1, 0, [0, 0, 0, 1], &opt(&[0, 10, 0]))).unwrap_err();
    assert!(e.to_string().contains("needs 4 bytes"), "{e}");
    // Non-root owner.
    let mut named = vec![1, b'x'];
    named.extend_from_slice(&opt(&[])[..]);
    let e = decode(&raw(1, 0, [0, 0, 0, 1], &named)).unwrap_err();
    assert!(e.to_string().contains("not the root"), "{e}");
}

#[test]
fn edns_raw_fields_and_odd_options() {
    // UDP size 100 (hickory would clamp to 512), version 1, ext rcode 1 (BADCOOKIE with
    // low 7), DO clear, ECS with unknown family 9 shown as hex, NSID, unknown option.
    let rdata = [
        0, 8, 0, 5, 0, 9, 32, 0, 1, // ECS family 9
        0, 3, 0, 2, b'n', b's', // NSID
        0xfd, 0xe9, 0, 0, // OPT65001, empty
        0, 8, 0, 6, 0, 2, 56, 0, 0x20, 0x01, // ECS v6 2001::/56 (address shortened)
    ];
    let mut body = vec![0, 0, 41, 0, 100, 1, 1, 0, 0];
    body.extend_from_slice(&(rdata.len() as u16).to_be_bytes());
    body.extend_from_slice(&rdata);
    let d = decode(&raw(3, 0x8007, [0, 0, 0, 1], &body)).unwrap();
    assert_eq!(d.rcode, "BADCOOKIE");
    let e = d.edns.unwrap();
    assert_eq!((e.udp_size, e.version, e.dnssec_ok), (100, 1, false));
    let opts: Vec<(&str, &str)> = e
        .options
        .iter()
        .map(|o| (&*o.name, o.data.as_str()))
        .collect();
    assert_eq!(
        opts,
        vec![
            ("ECS", "0009200001"),
            ("NSID", "6e73"),
            ("OPT65001", ""),
            ("ECS", "2001::/56/0"),
        ]
    );
}

#[test]
fn escaped_names() {
    // Label with a dot, a space and a 0xff byte.
    let body = [4, b'a', b'.', b' ', 0xff, 0, 0, 16, 0, 3];
    let d = decode(&raw(1, 0, [1, 0, 0, 0], &body)).unwrap();
    assert_eq!(d.questions[0].name, "a\\.\\032\\255.");
    assert_eq!(d.questions[0].class, "CH");
    assert_eq!(d.summary_line(), "1 TXT CH? a\\.\\032\\255.");
    // DNS 0x20 mixed case survives.
    let body = [3, b'W', b'w', b'W', 3, b'L', b'a', b'B', 0, 0, 1, 0, 1];
    let d = decode(&raw(1, 0, [1, 0, 0, 0], &body)).unwrap();
    assert_eq!(d.questions[0].name, "WwW.LaB.");
    // Root.
    let d = decode(&raw(1, 0x0100, [1, 0, 0, 0], &[0, 0, 2, 0, 1])).unwrap();
    assert_eq!(d.summary_line(), "1+ NS? .");
}

#[test]
fn empty_rdata_tolerated() {
    // RFC 2136 prerequisite "name is in use": ANY class, empty rdata, UPDATE opcode.
    let body = [
        0, 0, 6, 0, 1, /* rr */ 0, 0, 1, 0, 255, 0, 0, 0, 0, 0, 0,
    ];
    let d = decode(&raw(5, 0x2800, [1, 1, 0, 0], &body)).unwrap();
    assert_eq!(d.opcode, "UPDATE");
    assert_eq!(d.answers[0].class, "ANY");
    assert_eq!(d.answers[0].data, "");
    assert!(d.summary_line().starts_with("5 [UPDATE]"));
}

#[test]
fn garbage_never_panics() {
    let seeds = [query_with_edns(), {
        let mut m = Message::new(1, MessageType::Response, OpCode::Query);
        m.add_query(Query::query(name("a.b.c."), RecordType::SRV));
        m.add_answer(rr(
            "a.b.c.",
            1,
            RData::SRV(SRV::new(1, 2, 3, name("t.b.c."))),
        ));
        m.add_answer(rr("a.b.c.", 1, RData::TXT(TXT::new(vec!["x".into()]))));
        m.to_vec().unwrap()
    }];
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    for _ in 0..20_000 {
        let r = next();
        let mut msg = seeds[(r & 1) as usize].clone();
        for _ in 0..1 + (r >> 8) % 4 {
            let r = next();
            let i = (r as usize) % msg.len();
            msg[i] = (r >> 32) as u8;
        }
        if let Ok(m) = decode(&msg) {
            let _ = m.summary_line();
        }
        let cut = (next() as usize) % (msg.len() + 1);
        if let Ok(Some(m)) = decode_cut(&msg[..cut], msg.len()) {
            let _ = m.summary_line();
        }
    }
}

/// Where each entry of a well-formed message ends, walked independently of the decoder:
/// (section, end offset, is OPT).
fn entry_ends(msg: &[u8]) -> Vec<(Section, usize, bool)> {
    let count = |i: usize| usize::from(u16::from_be_bytes([msg[i], msg[i + 1]]));
    let skip_name = |mut at: usize| loop {
        let len = msg[at];
        if len & 0xc0 == 0xc0 {
            return at + 2;
        }
        at += 1 + usize::from(len);
        if len == 0 {
            return at;
        }
    };
    let mut at = HEADER_LEN;
    let mut ends = Vec::new();
    for _ in 0..count(4) {
        at = skip_name(at) + 4;
        ends.push((Section::Question, at, false));
    }
    for (section, n) in [
        (Section::Answer, count(6)),
        (Section::Authority, count(8)),
        (Section::Additional, count(10)),
    ] {
        for _ in 0..n {
            let fixed = skip_name(at);
            let rtype = u16::from_be_bytes([msg[fixed], msg[fixed + 1]]);
            let rdlen = usize::from(u16::from_be_bytes([msg[fixed + 8], msg[fixed + 9]]));
            at = fixed + 10 + rdlen;
            ends.push((section, at, rtype == TYPE_OPT));
        }
    }
    assert_eq!(at, msg.len());
    ends
}

/// A response cut at every byte offset: never a panic, never an error; below 12 bytes
/// no message; otherwise the header, every entry that fits whole (and only those), and
/// the right number of entries counted as cut in each section.
#[test]
fn cut_at_every_offset_decodes_what_fits() {
    let full = common_response();
    let whole = decode(&full).unwrap();
    let ends = entry_ends(&full);
    assert_eq!(ends.len(), 1 + 7 + 1 + 2);
    for n in 0..full.len() {
        let got = decode_cut(&full[..n], full.len());
        let m = match got {
            Ok(Some(m)) => m,
            Ok(None) => {
                assert!(n < HEADER_LEN, "no message at {n} bytes");
                continue;
            }
            Err(e) => panic!("cut at {n}: {e}"),
        };
        assert!(n >= HEADER_LEN);
        assert_eq!(
            (m.id, m.qr, m.flags),
            (whole.id, whole.qr, whole.flags),
            "at {n}"
        );
        assert_eq!(m.rcode, whole.rcode);
        let fits = |s: Section| {
            ends.iter()
                .filter(|(sec, end, _)| *sec == s && *end <= n)
                .count()
        };
        let total = |s: Section| ends.iter().filter(|(sec, ..)| *sec == s).count();
        let opt_fits = ends.iter().any(|(_, end, opt)| *opt && *end <= n);
        assert_eq!(m.questions[..], whole.questions[..fits(Section::Question)]);
        assert_eq!(
            m.answers[..],
            whole.answers[..fits(Section::Answer)],
            "at {n}"
        );
        assert_eq!(m.authority[..], whole.authority[..fits(Section::Authority)]);
        let additional = fits(Section::Additional) - usize::from(opt_fits);
        assert_eq!(m.additional[..], whole.additional[..additional], "at {n}");
        assert_eq!(m.edns.is_some(), opt_fits, "at {n}");
        let cut = m.cut.unwrap_or_else(|| panic!("cut at {n} not marked"));
        let left = |s: Section| (total(s) - fits(s)) as u16;
        assert_eq!(
            cut,
            Cut {
                captured_bytes: n,
                message_bytes: full.len(),
                questions: left(Section::Question),
                answers: left(Section::Answer),
                authority: left(Section::Authority),
                additional: left(Section::Additional),
            },
            "at {n}"
        );
        // The summary gives the header's counts and says what was cut.
        let line = m.summary_line();
        assert!(
            line.contains(" NOERROR 7/1/2") || fits(Section::Question) == 0,
            "{line}"
        );
        assert!(
            line.contains(&format!("[|cut by the capture at {n} of {}", full.len())),
            "{line}"
        );
        // Without the capture's word that bytes are missing, it is malformed.
        assert!(decode(&full[..n]).is_err(), "short message at {n} decoded");
    }
    // The whole message is not cut.
    assert_eq!(decode_cut(&full, full.len()), Ok(Some(whole)));
}

#[test]
fn cut_note_and_summary() {
    let full = common_response();
    let ends = entry_ends(&full);
    // After the question and the first two answers.
    let n = ends[2].1 + 5;
    let m = decode_cut(&full[..n], full.len()).unwrap().unwrap();
    assert_eq!(m.answers.len(), 2);
    let c = m.cut.unwrap();
    assert_eq!(
        (c.answers, c.authority, c.additional, c.entries()),
        (5, 1, 2, 8)
    );
    assert_eq!(
        m.summary_line(),
        format!(
            "4242* q: A? www.lab.test. NOERROR 7/1/2 CNAME web.lab.test., A 10.250.0.80 \
             [|cut by the capture at {n} of {} bytes: 5 answers, 1 authority, 2 additional \
             not decoded]",
            full.len()
        )
    );
    let json = serde_json::to_value(&m).unwrap();
    assert_eq!(json["cut"]["answers"], 5);
    assert_eq!(json["cut"]["captured_bytes"], n);
    // A whole message has no `cut` field at all.
    let whole = serde_json::to_value(decode(&full).unwrap()).unwrap();
    assert!(whole.get("cut").is_none());
    // Cut inside the question: header only.
    let m = decode_cut(&full[..20], full.len()).unwrap().unwrap();
    assert!(m.questions.is_empty() && m.answers.is_empty());
    assert_eq!(m.cut.unwrap().questions, 1);
    assert!(
        m.summary_line().contains("1 question, 7 answers"),
        "{}",
        m.summary_line()
    );
}

/// A cut capture does not excuse what is wrong in the bytes it holds.
#[test]
fn cut_message_wrong_in_itself_stays_malformed() {
    // Question name pointing at itself, then the capture ends.
    let msg = raw(1, 0x8180, [1, 1, 0, 0], &[0xc0, 12, 0, 1, 0, 1, 0xc0]);
    let e = decode_cut(&msg, 200).unwrap_err();
    assert!(e.to_string().contains("pointer loop"), "{e}");
    // A whole A record of 5 bytes before the cut.
    let mut body = vec![0, 0, 1, 0, 1, 0, 0, 0, 0, 0, 5, 1, 2, 3, 4, 5];
    body.extend_from_slice(&[0, 0, 1]);
    let e = decode_cut(&raw(1, 0x8000, [0, 2, 0, 0], &body), 100).unwrap_err();
    assert!(e.to_string().contains("A rdata is 5 bytes"), "{e}");
    // A record whose rdata runs past the bytes of a message that was not cut.
    let body = [0, 0, 16, 0, 1, 0, 0, 0, 0, 2, 0x58, 5, b'h', b'e'];
    let e = decode(&raw(1, 0x8000, [0, 1, 0, 0], &body)).unwrap_err();
    assert!(e.to_string().contains("rdata length 600 runs past"), "{e}");
    // The same bytes as the start of a cut 700-byte message: the header, no answer.
    let m = decode_cut(&raw(1, 0x8000, [0, 1, 0, 0], &body), 700)
        .unwrap()
        .unwrap();
    assert!(m.answers.is_empty());
    assert_eq!(m.cut.unwrap().answers, 1);
}

/// Counts a cut header claims cost nothing: no allocation by count, no error.
#[test]
fn hostile_counts_in_a_cut_message() {
    let msg = raw(1, 0x8000, [65535, 65535, 65535, 65535], &[0, 0, 1]);
    let m = decode_cut(&msg, 9000).unwrap().unwrap();
    assert!(m.questions.is_empty());
    let c = m.cut.unwrap();
    assert_eq!(
        (c.questions, c.answers, c.authority, c.additional),
        (65535, 65535, 65535, 65535)
    );
    assert_eq!(decode_cut(&msg[..11], 9000), Ok(None));
}

/// The name reader's pointer shortcut reaches the verdict and the text `Name::read` does:
/// compressed messages with bytes and compression pointers overwritten at random, whole and
/// cut, decode the same with the shortcut on and off.
#[test]
fn name_shortcut_agrees_with_name_read() {
    let mut cname = Message::new(9, MessageType::Response, OpCode::Query);
    cname.add_query(Query::query(name("api.example.net."), RecordType::A));
    cname.add_answer(rr(
        "api.example.net.",
        5,
        RData::CNAME(CNAME(name("edge.cdn.example.net."))),
    ));
    cname.add_answer(rr("edge.cdn.example.net.", 5, RData::A(A::new(1, 2, 3, 4))));
    cname.add_authority(rr(
        "example.net.",
        5,
        RData::SOA(SOA::new(
            name("ns.example.net."),
            name("hostmaster.example.net."),
            1,
            2,
            3,
            4,
            5,
        )),
    ));
    let seeds = [
        common_response(),
        query_with_edns(),
        cname.to_vec().unwrap(),
    ];
    let decode_both = |bytes: &[u8], cut: Option<usize>| {
        let h = Header::read(bytes)?;
        let mut fast = NameReader::new(bytes);
        let mut plain = NameReader::new(bytes);
        plain.shortcut = false;
        let a = decode_body_with(bytes, &h, cut, &mut fast);
        let b = decode_body_with(bytes, &h, cut, &mut plain);
        assert_eq!(a, b, "{bytes:?} cut {cut:?}");
        assert_eq!(plain.hits, 0);
        Some((a, fast.hits))
    };
    // Unmutated: answers' owner names are pointers to names already read.
    for seed in &seeds[..] {
        let (m, hits) = decode_both(seed, None).unwrap();
        assert!(m.is_ok());
        assert!(hits > 0 || seed == &seeds[1]);
    }
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let (mut hits, mut ok_with_hits, mut errors) = (0, 0, 0);
    for _ in 0..30_000 {
        let r = next();
        let mut msg = seeds[(r % 3) as usize].clone();
        for _ in 0..1 + (r >> 8) % 3 {
            let r = next();
            let i = 12 + (r as usize) % (msg.len() - 12);
            if r & 0x100_0000_0000 != 0 && i + 1 < msg.len() {
                // A pointer to anywhere up to a little past the end.
                let target = ((r >> 16) as usize % (msg.len() + 4)) as u16;
                msg[i] = 0xc0 | (target >> 8) as u8;
                msg[i + 1] = target as u8;
            } else {
                msg[i] = (r >> 32) as u8;
            }
        }
        if let Some((m, h)) = decode_both(&msg, None) {
            hits += h;
            ok_with_hits += usize::from(m.is_ok() && h > 0);
            errors += usize::from(m.is_err());
        }
        let cut = (next() as usize) % (msg.len() + 1);
        decode_both(&msg[..cut], Some(msg.len()));
    }
    assert!(
        hits > 10_000 && ok_with_hits > 1_000 && errors > 1_000,
        "{hits} {ok_with_hits} {errors}"
    );
}

/// Every byte value in a label is written as RFC 1035 §5.1 says, by the name reader and by
/// `push_name` alike.
#[test]
fn name_text_escapes_every_byte() {
    for b in 0..=255u8 {
        let expected = match b {
            b'.' | b'\\' | b'"' | b'(' | b')' | b';' | b'@' | b'$' => format!("x\\{}.", b as char),
            0x21..=0x7e => format!("x{}.", b as char),
            _ => format!("x\\{b:03}."),
        };
        let body = [2, b'x', b, 0, 0, 1, 0, 1];
        let msg = raw(1, 0, [1, 0, 0, 0], &body);
        let d = decode(&msg).unwrap();
        assert_eq!(d.questions[0].name, expected);
        let n = Name::from_labels([&[b'x', b][..]]).unwrap();
        assert_eq!(name_to_string(&n), expected);
    }
    // A name of 4 labels of about 63 bytes that all need `\DDD` does not fit what is left
    // after a first name, and still comes out whole.
    let label = [0xffu8; 63];
    let mut body = vec![9];
    body.extend_from_slice(b"abcdefghi");
    body.extend_from_slice(&[0, 0, 1, 0, 1]);
    for _ in 0..3 {
        body.push(63);
        body.extend_from_slice(&label);
    }
    body.push(61);
    body.extend_from_slice(&label[..61]);
    body.extend_from_slice(&[0, 0, 1, 0, 1]);
    let d = decode(&raw(1, 0, [2, 0, 0, 0], &body)).unwrap();
    assert_eq!(d.questions[0].name, "abcdefghi.");
    let long = &d.questions[1].name;
    assert_eq!(long.len(), (63 * 3 + 61) * 4 + 4, "{long}");
    assert!(long.starts_with("\\255\\255") && long.ends_with("\\255."));
}

#[test]
fn numbers_and_hex_as_display_writes_them() {
    for v in [
        0,
        1,
        9,
        10,
        99,
        100,
        65535,
        1_000_000_000,
        2024010101,
        u32::MAX,
    ] {
        let mut s = String::from("x");
        push_u32(&mut s, v);
        assert_eq!(s, format!("x{v}"));
    }
    let bytes: Vec<u8> = (0..=255).collect();
    let expected: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    assert_eq!(hex(&bytes), expected);
    let mut s = String::new();
    push_hex(&mut s, &bytes);
    assert_eq!(s, expected);
}
