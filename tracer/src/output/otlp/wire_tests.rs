use opentelemetry_proto::tonic::{
    collector::trace::v1::ExportTraceServiceRequest,
    common::v1::{any_value::Value, AnyValue, ArrayValue, KeyValue},
    resource::v1::Resource,
    trace::v1::{span::Event, Span},
};
use prost::Message;

use super::*;

fn kv(key: &str, value: Value) -> KeyValue {
    KeyValue {
        key: key.into(),
        value: Some(AnyValue { value: Some(value) }),
        key_strindex: 0,
    }
}

/// A `KeyValue` written as a field of a message whose only field it is: prost's bytes of
/// that message.
fn as_resource(kvs: Vec<KeyValue>) -> Vec<u8> {
    Resource {
        attributes: kvs,
        ..Default::default()
    }
    .encode_to_vec()
}

#[test]
fn varint_lengths_are_prosts() {
    for v in [
        0,
        1,
        127,
        128,
        16_383,
        16_384,
        u64::from(u32::MAX),
        u64::MAX,
    ] {
        let mut out = Vec::new();
        put_varint(&mut out, v);
        assert_eq!(out.len(), varint_len(v), "{v}");
        assert_eq!(out.len(), prost::encoding::encoded_len_varint(v), "{v}");
    }
}

/// Strings and integers, empty and zero ones too (a oneof's value is written even then),
/// negative integers as ten-byte varints.
#[test]
fn key_values_are_encoded_as_prost_encodes_them() {
    let cases: Vec<(&str, Value)> = vec![
        ("s", Value::StringValue("value".into())),
        ("empty", Value::StringValue(String::new())),
        ("long", Value::StringValue("x".repeat(300))),
        ("i", Value::IntValue(-5)),
        ("big", Value::IntValue(i64::MAX)),
        ("zero", Value::IntValue(0)),
    ];
    for (k, v) in cases {
        let mut out = Vec::new();
        match &v {
            Value::StringValue(s) => kv_str(&mut out, tag::RESOURCE_ATTRIBUTES, k, s),
            Value::IntValue(i) => kv_int(&mut out, tag::RESOURCE_ATTRIBUTES, k, *i),
            _ => unreachable!(),
        }
        assert_eq!(out, as_resource(vec![kv(k, v.clone())]), "{k}");
    }
}

/// A nested message's length is filled in after its body, moving the body when the length
/// takes more than one byte: bodies of 0, 127, 128, 16,383 and 16,384 bytes and more, at
/// three levels of nesting.
#[test]
fn nested_lengths_of_every_size_are_prosts() {
    for sizes in [
        vec![],
        vec![0],
        vec![120],
        vec![125, 0],
        vec![126],
        vec![16_370],
        vec![16_380, 3],
        vec![70_000, 1, 200],
    ] {
        let strings: Vec<String> = sizes.iter().map(|&n| "a".repeat(n)).collect();
        let mut out = Vec::new();
        let mut text = String::new();
        kv_strings(
            &mut out,
            &mut text,
            tag::RESOURCE_ATTRIBUTES,
            "k",
            strings.iter(),
        );
        let want = kv(
            "k",
            Value::ArrayValue(ArrayValue {
                values: strings
                    .iter()
                    .map(|s| AnyValue {
                        value: Some(Value::StringValue(s.clone())),
                    })
                    .collect(),
            }),
        );
        assert_eq!(out, as_resource(vec![want]), "{sizes:?}");
    }
}

/// Spans of three resources, interleaved: one `ResourceSpans` per resource in order of first
/// use, each span under its own resource in the order placed; the bytes are prost's (they
/// decode, and encode back the same); the buffer is empty after.
#[test]
fn requests_group_spans_by_resource_as_prost_encodes_them() {
    let mut buf = RequestBuf::default();
    let resource = |name: &str| {
        let mut r = Vec::new();
        kv_str(&mut r, tag::RESOURCE_ATTRIBUTES, "service.name", name);
        r
    };
    let span = |buf: &mut RequestBuf, name: &str, res: &str, events: usize| {
        let at = buf.span_start();
        put_bytes(&mut buf.spans, tag::SPAN_TRACE_ID, &[7; 16]);
        put_bytes(&mut buf.spans, tag::SPAN_NAME, name.as_bytes());
        put_fixed64(&mut buf.spans, tag::SPAN_START, 1_700_000_000_000_000_000);
        for e in 0..events {
            let m = begin(&mut buf.spans, tag::SPAN_EVENTS);
            put_fixed64(&mut buf.spans, tag::EVENT_TIME, e as u64 + 1);
            put_bytes(&mut buf.spans, tag::EVENT_NAME, b"hop");
            kv_str(
                &mut buf.spans,
                tag::EVENT_ATTRIBUTES,
                "k",
                &"v".repeat(40 * e),
            );
            end(&mut buf.spans, m);
        }
        let m = begin(&mut buf.spans, tag::SPAN_STATUS);
        end(&mut buf.spans, m);
        buf.place(at, &resource(res));
    };
    for round in 0..2 {
        span(&mut buf, "a1", "a", 0);
        span(&mut buf, "b1", "b", 5);
        span(&mut buf, "a2", "a", 1);
        span(&mut buf, "c1", "c", 200);
        span(&mut buf, "b2", "b", 0);
        assert_eq!(buf.len(), 5);
        let scope = scope("dnspath", "1.2.3");
        let bytes = buf.encode(&scope);
        assert!(buf.is_empty() && buf.spans.is_empty(), "round {round}");
        let req = ExportTraceServiceRequest::decode(bytes.as_slice()).unwrap();
        assert_eq!(req.encode_to_vec(), bytes);
        let got: Vec<(String, Vec<String>)> = req
            .resource_spans
            .iter()
            .map(|rs| {
                let r = rs.resource.as_ref().unwrap();
                let Some(Value::StringValue(n)) =
                    r.attributes[0].value.as_ref().and_then(|v| v.value.clone())
                else {
                    panic!("{r:?}")
                };
                assert_eq!(rs.scope_spans.len(), 1);
                let ss = &rs.scope_spans[0];
                assert_eq!(ss.scope.as_ref().unwrap().name, "dnspath");
                assert_eq!(ss.scope.as_ref().unwrap().version, "1.2.3");
                (n, ss.spans.iter().map(|s: &Span| s.name.clone()).collect())
            })
            .collect();
        let names = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            got,
            vec![
                ("a".into(), names(&["a1", "a2"])),
                ("b".into(), names(&["b1", "b2"])),
                ("c".into(), names(&["c1"])),
            ]
        );
        let c1 = &req.resource_spans[2].scope_spans[0].spans[0];
        assert_eq!(c1.events.len(), 200);
        let last: &Event = &c1.events[199];
        assert_eq!(last.time_unix_nano, 200);
        assert_eq!(c1.status.as_ref().map(|s| s.code), Some(0));
    }
}

#[test]
fn an_empty_request_is_empty() {
    assert!(RequestBuf::default()
        .encode(&scope("dnspath", "0"))
        .is_empty());
}
