use hickory_proto::{
    op::{Message, MessageType, OpCode, Query},
    rr::{
        rdata::{
            svcb::{
                Alpn, EchConfigList, IpHint, Mandatory, SvcParamKey, SvcParamValue, Unknown, SVCB,
            },
            A, AAAA, HTTPS,
        },
        Name, RData, Record as HRecord, RecordType,
    },
};

use super::super::decode;

/// The `data` of the one answer of a response carrying `rdata` (built by hickory-proto).
fn presented(rdata: RData) -> String {
    let name = Name::from_ascii("svc.lab.test.").unwrap();
    let mut m = Message::new(7, MessageType::Response, OpCode::Query);
    m.add_query(Query::query(name.clone(), rdata.record_type()));
    m.add_answer(HRecord::from_rdata(name, 300, rdata));
    let wire = m.to_vec().unwrap();
    let d = decode(&wire).unwrap();
    assert_eq!(d.answers.len(), 1);
    d.answers[0].data.clone()
}

fn https(priority: u16, target: &str, params: Vec<(SvcParamKey, SvcParamValue)>) -> RData {
    RData::HTTPS(HTTPS(SVCB::new(
        priority,
        Name::from_ascii(target).unwrap(),
        params,
    )))
}

#[test]
fn rfc9460_presentation_of_https_and_svcb() {
    let alpn = |ids: &[&str]| {
        (
            SvcParamKey::Alpn,
            SvcParamValue::Alpn(Alpn(ids.iter().map(|s| s.to_string()).collect())),
        )
    };
    let v4 = (
        SvcParamKey::Ipv4Hint,
        SvcParamValue::Ipv4Hint(IpHint(vec![A::new(192, 0, 2, 1), A::new(192, 0, 2, 2)])),
    );
    let port = (SvcParamKey::Port, SvcParamValue::Port(443));
    assert_eq!(
        presented(https(1, ".", vec![alpn(&["h3", "h2"]), port, v4.clone()])),
        r#"1 . alpn="h3,h2" port=443 ipv4hint=192.0.2.1,192.0.2.2"#
    );
    // One alpn-id needs no quotes; AliasMode has no params.
    assert_eq!(presented(https(1, ".", vec![alpn(&["h3"])])), "1 . alpn=h3");
    assert_eq!(
        presented(https(0, "pool.lab.test.", vec![])),
        "0 pool.lab.test."
    );
    // Every key: mandatory, no-default-alpn without a value, ech in base64, ipv6hint, and an
    // unknown key with and without a value.
    let all = vec![
        (
            SvcParamKey::Mandatory,
            SvcParamValue::Mandatory(Mandatory(vec![SvcParamKey::Alpn, SvcParamKey::Ipv4Hint])),
        ),
        alpn(&["h2"]),
        (SvcParamKey::NoDefaultAlpn, SvcParamValue::NoDefaultAlpn),
        (SvcParamKey::Port, SvcParamValue::Port(8443)),
        v4,
        (
            SvcParamKey::EchConfigList,
            SvcParamValue::EchConfigList(EchConfigList(b"\x00\x45\xfe\x0d\xff".to_vec())),
        ),
        (
            SvcParamKey::Ipv6Hint,
            SvcParamValue::Ipv6Hint(IpHint(vec![
                AAAA::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 1),
                AAAA::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 0x53),
            ])),
        ),
        (
            SvcParamKey::Key(65333),
            SvcParamValue::Unknown(Unknown(b"ex 1".to_vec())),
        ),
        (
            SvcParamKey::Key(65444),
            SvcParamValue::Unknown(Unknown(Vec::new())),
        ),
    ];
    assert_eq!(
        presented(RData::SVCB(SVCB::new(
            16,
            Name::from_ascii("foo.example.org.").unwrap(),
            all
        ))),
        "16 foo.example.org. mandatory=alpn,ipv4hint alpn=h2 no-default-alpn port=8443 \
         ipv4hint=192.0.2.1,192.0.2.2 ech=AEX+Df8= ipv6hint=2001:db8::1,2001:db8::53 \
         key65333=\"ex 1\" key65444"
    );
}

/// RFC 9460 Appendix D.2's escaped alpn (figure 9's value-list): items holding `,` and
/// `\`, and bytes that are not printable, stay one value and cannot break the line.
#[test]
fn alpn_items_with_commas_backslashes_and_control_bytes() {
    let v = (
        SvcParamKey::Alpn,
        SvcParamValue::Alpn(Alpn(vec![
            "f\\oo,bar".to_string(),
            "h2".to_string(),
            "a\nb\"".to_string(),
        ])),
    );
    assert_eq!(
        presented(https(16, "foo.example.org.", vec![v])),
        r#"16 foo.example.org. alpn="f\\\\oo\\,bar,h2,a\010b\"""#
    );
}

/// Values a key cannot have (a port of three bytes, keys out of order, an ipv4hint of five
/// bytes): the record is shown generically, as its bytes.
#[test]
fn malformed_params_are_shown_generically() {
    let with_params = |params: &[u8]| {
        let mut rdata = vec![0, 1, 0]; // priority 1, target "."
        rdata.extend_from_slice(params);
        rdata
    };
    for params in [
        &[0, 3, 0, 3, 1, 187, 0][..],                // port of 3 bytes
        &[0, 3, 0, 2, 1, 187, 0, 1, 0, 1, 0x68][..], // port then alpn: out of order
        &[0, 4, 0, 5, 192, 0, 2, 1, 9][..],          // ipv4hint of 5 bytes
        &[0, 2, 0, 1, 0][..],                        // no-default-alpn with a value
        &[0, 1, 0, 2, 5, 0x68][..],                  // alpn-id longer than the value
        &[0, 3, 0][..],                              // a key cut short
    ] {
        let rdata = with_params(params);
        let data = presented(RData::Unknown {
            code: RecordType::HTTPS,
            rdata: hickory_proto::rr::rdata::NULL::with(rdata.clone()),
        });
        assert!(
            data.starts_with(&format!("\\# {} ", rdata.len())),
            "{params:?}: {data}"
        );
    }
}
