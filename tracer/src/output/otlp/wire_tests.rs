use opentelemetry_proto::tonic::trace::v1::span::SpanKind;
use prost::Message;

use super::*;

fn kv(key: &str, value: Option<Value>) -> KeyValue {
    KeyValue {
        key: key.into(),
        value: Some(AnyValue { value }),
        key_strindex: 0,
    }
}

/// Every field of every message set, most to values that are not their default (and some
/// to their default inside a oneof, which is still written); negative int32s, big varints.
fn everything() -> ExportTraceServiceRequest {
    let values = vec![
        kv("s", Some(Value::StringValue("value".into()))),
        kv("empty", Some(Value::StringValue(String::new()))),
        kv("t", Some(Value::BoolValue(true))),
        kv("f", Some(Value::BoolValue(false))),
        kv("i", Some(Value::IntValue(-5))),
        kv("big", Some(Value::IntValue(i64::MAX))),
        kv("zero", Some(Value::IntValue(0))),
        kv("d", Some(Value::DoubleValue(-1.5))),
        kv("d0", Some(Value::DoubleValue(0.0))),
        kv(
            "a",
            Some(Value::ArrayValue(ArrayValue {
                values: vec![
                    AnyValue {
                        value: Some(Value::StringValue("x".repeat(300))),
                    },
                    AnyValue { value: None },
                ],
            })),
        ),
        kv(
            "l",
            Some(Value::KvlistValue(KeyValueList {
                values: vec![kv("inner", Some(Value::IntValue(1)))],
            })),
        ),
        kv("b", Some(Value::BytesValue(vec![0, 1, 2]))),
        kv("si", Some(Value::StringValueStrindex(-1))),
        kv("none", None),
        KeyValue {
            key: String::new(),
            value: None,
            key_strindex: 7,
        },
    ];
    let span = Span {
        trace_id: vec![1; 16],
        span_id: vec![2; 8],
        trace_state: "k=v".into(),
        parent_span_id: vec![3; 8],
        flags: 0x301,
        name: "n".repeat(200),
        kind: SpanKind::Server as i32,
        start_time_unix_nano: 1_700_000_000_000_000_000,
        end_time_unix_nano: u64::MAX,
        attributes: values.clone(),
        dropped_attributes_count: 3,
        events: vec![
            Event {
                time_unix_nano: 5,
                name: "e".into(),
                attributes: values.clone(),
                dropped_attributes_count: 1,
            },
            Event::default(),
        ],
        dropped_events_count: 4,
        links: vec![
            Link {
                trace_id: vec![4; 16],
                span_id: vec![5; 8],
                trace_state: "x".into(),
                attributes: values.clone(),
                dropped_attributes_count: 2,
                flags: 1,
            },
            Link::default(),
        ],
        dropped_links_count: 5,
        status: Some(Status {
            message: "m".into(),
            code: 2,
        }),
    };
    let scope = InstrumentationScope {
        name: "dnspath".into(),
        version: "1".into(),
        attributes: values.clone(),
        dropped_attributes_count: 9,
    };
    ExportTraceServiceRequest {
        resource_spans: vec![
            ResourceSpans {
                resource: Some(Resource {
                    attributes: values,
                    dropped_attributes_count: 6,
                    entity_refs: vec![EntityRef {
                        schema_url: "u".into(),
                        r#type: "k8s.pod".into(),
                        id_keys: vec!["a".into(), String::new()],
                        description_keys: vec!["b".into()],
                    }],
                }),
                scope_spans: vec![
                    ScopeSpans {
                        scope: Some(scope),
                        spans: vec![span.clone(), Span::default()],
                        schema_url: "https://opentelemetry.io/schemas/1.0".into(),
                    },
                    ScopeSpans {
                        scope: Some(InstrumentationScope::default()),
                        spans: vec![span],
                        schema_url: String::new(),
                    },
                ],
                schema_url: "r".into(),
            },
            ResourceSpans {
                resource: Some(Resource::default()),
                scope_spans: vec![ScopeSpans::default()],
                schema_url: String::new(),
            },
            ResourceSpans::default(),
        ],
    }
}

#[test]
fn every_field_is_written_as_prost_writes_it() {
    let r = everything();
    assert_eq!(encode(&r), r.encode_to_vec());
    assert!(encode(&r).len() > 2000);
}

#[test]
fn an_empty_request_is_empty() {
    let r = ExportTraceServiceRequest::default();
    assert!(encode(&r).is_empty());
    assert_eq!(encode(&r), r.encode_to_vec());
}

#[test]
fn varint_lengths_at_their_edges() {
    for (v, n) in [
        (0u64, 1),
        (127, 1),
        (128, 2),
        (16_383, 2),
        (16_384, 3),
        (u64::MAX >> 1, 9),
        (u64::MAX, 10),
    ] {
        assert_eq!(varint_len(v), n, "{v}");
        assert_eq!(varint_len(v), prost::encoding::encoded_len_varint(v), "{v}");
    }
}
