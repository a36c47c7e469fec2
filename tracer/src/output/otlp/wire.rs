//! The request's protobuf bytes, the same as prost's `encode_to_vec` writes them, in linear
//! time: prost measures a nested message again at every level it is nested in (a hop
//! event's attribute value is seven levels down, so it was measured seven times), this
//! measures each message once, keeping the lengths in pre-order for the writing pass.
//!
//! Every struct is taken apart field by field with no `..`: a field added by a new
//! `opentelemetry-proto` is a compile error here, not bytes silently left out. The unit
//! tests compare the bytes with prost's for every span the tests build and for a request
//! with every field set.
use opentelemetry_proto::tonic::{
    collector::trace::v1::ExportTraceServiceRequest,
    common::v1::{
        any_value::Value, AnyValue, ArrayValue, EntityRef, InstrumentationScope, KeyValue,
        KeyValueList,
    },
    resource::v1::Resource,
    trace::v1::{
        span::{Event, Link},
        ResourceSpans, ScopeSpans, Span, Status,
    },
};

/// Wire types.
const VARINT: u32 = 0;
const I64: u32 = 1;
const LEN: u32 = 2;
const I32: u32 = 5;

fn varint_len(v: u64) -> usize {
    // 1 byte per 7 bits, at least one.
    (64 - (v | 1).leading_zeros() as usize).div_ceil(7)
}

fn key_len(tag: u32) -> usize {
    varint_len(u64::from(tag << 3))
}

/// The lengths of the request's nested messages in pre-order, then its bytes.
pub fn encode(req: &ExportTraceServiceRequest) -> Vec<u8> {
    let mut m = Measure { lens: Vec::new() };
    let total = m.request(req);
    let mut w = Write {
        out: Vec::with_capacity(total),
        lens: m.lens.iter(),
    };
    w.request(req);
    w.out
}

/// The first pass: each message's length, pushed before its children's (a slot filled
/// once they are measured).
struct Measure {
    lens: Vec<usize>,
}

/// A field of a nested message: key, length, body.
fn field(tag: u32, body: usize) -> usize {
    key_len(tag) + varint_len(body as u64) + body
}

fn bytes_field(tag: u32, b: &[u8]) -> usize {
    if b.is_empty() {
        0
    } else {
        field(tag, b.len())
    }
}

fn varint_field(tag: u32, v: u64) -> usize {
    if v == 0 {
        0
    } else {
        key_len(tag) + varint_len(v)
    }
}

fn fixed_field(tag: u32, zero: bool, size: usize) -> usize {
    if zero {
        0
    } else {
        key_len(tag) + size
    }
}

/// int32 and enums: negative values are 10-byte varints (sign-extended).
fn i32_u64(v: i32) -> u64 {
    i64::from(v) as u64
}

impl Measure {
    /// A nested message: its slot, its body measured by `f`; the whole field's length.
    fn nested(&mut self, tag: u32, f: impl FnOnce(&mut Self) -> usize) -> usize {
        let slot = self.lens.len();
        self.lens.push(0);
        let body = f(self);
        if let Some(l) = self.lens.get_mut(slot) {
            *l = body;
        }
        field(tag, body)
    }

    fn request(&mut self, r: &ExportTraceServiceRequest) -> usize {
        let ExportTraceServiceRequest { resource_spans } = r;
        resource_spans
            .iter()
            .map(|rs| self.nested(1, |m| m.resource_spans(rs)))
            .sum()
    }

    fn resource_spans(&mut self, r: &ResourceSpans) -> usize {
        let ResourceSpans {
            resource,
            scope_spans,
            schema_url,
        } = r;
        resource
            .as_ref()
            .map_or(0, |res| self.nested(1, |m| m.resource(res)))
            + scope_spans
                .iter()
                .map(|s| self.nested(2, |m| m.scope_spans(s)))
                .sum::<usize>()
            + bytes_field(3, schema_url.as_bytes())
    }

    fn resource(&mut self, r: &Resource) -> usize {
        let Resource {
            attributes,
            dropped_attributes_count,
            entity_refs,
        } = r;
        self.key_values(1, attributes)
            + varint_field(2, u64::from(*dropped_attributes_count))
            + entity_refs
                .iter()
                .map(|e| self.nested(3, |_| entity_ref_len(e)))
                .sum::<usize>()
    }

    fn scope_spans(&mut self, s: &ScopeSpans) -> usize {
        let ScopeSpans {
            scope,
            spans,
            schema_url,
        } = s;
        scope
            .as_ref()
            .map_or(0, |sc| self.nested(1, |m| m.scope(sc)))
            + spans
                .iter()
                .map(|sp| self.nested(2, |m| m.span(sp)))
                .sum::<usize>()
            + bytes_field(3, schema_url.as_bytes())
    }

    fn scope(&mut self, s: &InstrumentationScope) -> usize {
        let InstrumentationScope {
            name,
            version,
            attributes,
            dropped_attributes_count,
        } = s;
        bytes_field(1, name.as_bytes())
            + bytes_field(2, version.as_bytes())
            + self.key_values(3, attributes)
            + varint_field(4, u64::from(*dropped_attributes_count))
    }

    fn span(&mut self, s: &Span) -> usize {
        let Span {
            trace_id,
            span_id,
            trace_state,
            parent_span_id,
            flags,
            name,
            kind,
            start_time_unix_nano,
            end_time_unix_nano,
            attributes,
            dropped_attributes_count,
            events,
            dropped_events_count,
            links,
            dropped_links_count,
            status,
        } = s;
        bytes_field(1, trace_id)
            + bytes_field(2, span_id)
            + bytes_field(3, trace_state.as_bytes())
            + bytes_field(4, parent_span_id)
            + bytes_field(5, name.as_bytes())
            + varint_field(6, i32_u64(*kind))
            + fixed_field(7, *start_time_unix_nano == 0, 8)
            + fixed_field(8, *end_time_unix_nano == 0, 8)
            + self.key_values(9, attributes)
            + varint_field(10, u64::from(*dropped_attributes_count))
            + events
                .iter()
                .map(|e| self.nested(11, |m| m.event(e)))
                .sum::<usize>()
            + varint_field(12, u64::from(*dropped_events_count))
            + links
                .iter()
                .map(|l| self.nested(13, |m| m.link(l)))
                .sum::<usize>()
            + varint_field(14, u64::from(*dropped_links_count))
            + status
                .as_ref()
                .map_or(0, |st| self.nested(15, |_| status_len(st)))
            + fixed_field(16, *flags == 0, 4)
    }

    fn event(&mut self, e: &Event) -> usize {
        let Event {
            time_unix_nano,
            name,
            attributes,
            dropped_attributes_count,
        } = e;
        fixed_field(1, *time_unix_nano == 0, 8)
            + bytes_field(2, name.as_bytes())
            + self.key_values(3, attributes)
            + varint_field(4, u64::from(*dropped_attributes_count))
    }

    fn link(&mut self, l: &Link) -> usize {
        let Link {
            trace_id,
            span_id,
            trace_state,
            attributes,
            dropped_attributes_count,
            flags,
        } = l;
        bytes_field(1, trace_id)
            + bytes_field(2, span_id)
            + bytes_field(3, trace_state.as_bytes())
            + self.key_values(4, attributes)
            + varint_field(5, u64::from(*dropped_attributes_count))
            + fixed_field(6, *flags == 0, 4)
    }

    fn key_values(&mut self, tag: u32, kvs: &[KeyValue]) -> usize {
        kvs.iter()
            .map(|kv| self.nested(tag, |m| m.key_value(kv)))
            .sum()
    }

    fn key_value(&mut self, kv: &KeyValue) -> usize {
        let KeyValue {
            key,
            value,
            key_strindex,
        } = kv;
        bytes_field(1, key.as_bytes())
            + value
                .as_ref()
                .map_or(0, |v| self.nested(2, |m| m.any_value(v)))
            + varint_field(3, i32_u64(*key_strindex))
    }

    fn any_value(&mut self, v: &AnyValue) -> usize {
        let AnyValue { value } = v;
        // A oneof's field is written whenever it is set, default or not.
        match value {
            None => 0,
            Some(Value::StringValue(s)) => field(1, s.len()),
            Some(Value::BoolValue(_)) => key_len(2) + 1,
            Some(Value::IntValue(i)) => key_len(3) + varint_len(*i as u64),
            Some(Value::DoubleValue(_)) => key_len(4) + 8,
            Some(Value::ArrayValue(a)) => self.nested(5, |m| {
                let ArrayValue { values } = a;
                values.iter().map(|v| m.nested(1, |m| m.any_value(v))).sum()
            }),
            Some(Value::KvlistValue(l)) => self.nested(6, |m| {
                let KeyValueList { values } = l;
                m.key_values(1, values)
            }),
            Some(Value::BytesValue(b)) => field(7, b.len()),
            Some(Value::StringValueStrindex(i)) => key_len(8) + varint_len(i32_u64(*i)),
        }
    }
}

fn status_len(s: &Status) -> usize {
    let Status { message, code } = s;
    bytes_field(2, message.as_bytes()) + varint_field(3, i32_u64(*code))
}

fn entity_ref_len(e: &EntityRef) -> usize {
    let EntityRef {
        schema_url,
        r#type,
        id_keys,
        description_keys,
    } = e;
    bytes_field(1, schema_url.as_bytes())
        + bytes_field(2, r#type.as_bytes())
        + id_keys.iter().map(|k| field(3, k.len())).sum::<usize>()
        + description_keys
            .iter()
            .map(|k| field(4, k.len()))
            .sum::<usize>()
}

/// The second pass: the bytes, each nested message's length taken from the first.
struct Write<'a> {
    out: Vec<u8>,
    lens: std::slice::Iter<'a, usize>,
}

impl Write<'_> {
    fn varint(&mut self, mut v: u64) {
        while v >= 0x80 {
            self.out.push((v as u8) | 0x80);
            v >>= 7;
        }
        self.out.push(v as u8);
    }

    fn key(&mut self, tag: u32, wire: u32) {
        self.varint(u64::from(tag << 3 | wire));
    }

    fn bytes(&mut self, tag: u32, b: &[u8]) {
        if !b.is_empty() {
            self.bytes_always(tag, b);
        }
    }

    fn bytes_always(&mut self, tag: u32, b: &[u8]) {
        self.key(tag, LEN);
        self.varint(b.len() as u64);
        self.out.extend_from_slice(b);
    }

    fn uint(&mut self, tag: u32, v: u64) {
        if v != 0 {
            self.key(tag, VARINT);
            self.varint(v);
        }
    }

    fn fixed64(&mut self, tag: u32, v: u64) {
        if v != 0 {
            self.key(tag, I64);
            self.out.extend_from_slice(&v.to_le_bytes());
        }
    }

    fn fixed32(&mut self, tag: u32, v: u32) {
        if v != 0 {
            self.key(tag, I32);
            self.out.extend_from_slice(&v.to_le_bytes());
        }
    }

    /// A nested message's key and length (measured by the first pass), then its body.
    fn nested(&mut self, tag: u32, f: impl FnOnce(&mut Self)) {
        let len = self.lens.next().copied().unwrap_or(0);
        self.key(tag, LEN);
        self.varint(len as u64);
        f(self);
    }

    fn request(&mut self, r: &ExportTraceServiceRequest) {
        let ExportTraceServiceRequest { resource_spans } = r;
        for rs in resource_spans {
            self.nested(1, |w| w.resource_spans(rs));
        }
    }

    fn resource_spans(&mut self, r: &ResourceSpans) {
        let ResourceSpans {
            resource,
            scope_spans,
            schema_url,
        } = r;
        if let Some(res) = resource {
            self.nested(1, |w| w.resource(res));
        }
        for s in scope_spans {
            self.nested(2, |w| w.scope_spans(s));
        }
        self.bytes(3, schema_url.as_bytes());
    }

    fn resource(&mut self, r: &Resource) {
        let Resource {
            attributes,
            dropped_attributes_count,
            entity_refs,
        } = r;
        self.key_values(1, attributes);
        self.uint(2, u64::from(*dropped_attributes_count));
        for e in entity_refs {
            self.nested(3, |w| {
                let EntityRef {
                    schema_url,
                    r#type,
                    id_keys,
                    description_keys,
                } = e;
                w.bytes(1, schema_url.as_bytes());
                w.bytes(2, r#type.as_bytes());
                for k in id_keys {
                    w.bytes_always(3, k.as_bytes());
                }
                for k in description_keys {
                    w.bytes_always(4, k.as_bytes());
                }
            });
        }
    }

    fn scope_spans(&mut self, s: &ScopeSpans) {
        let ScopeSpans {
            scope,
            spans,
            schema_url,
        } = s;
        if let Some(sc) = scope {
            self.nested(1, |w| {
                let InstrumentationScope {
                    name,
                    version,
                    attributes,
                    dropped_attributes_count,
                } = sc;
                w.bytes(1, name.as_bytes());
                w.bytes(2, version.as_bytes());
                w.key_values(3, attributes);
                w.uint(4, u64::from(*dropped_attributes_count));
            });
        }
        for sp in spans {
            self.nested(2, |w| w.span(sp));
        }
        self.bytes(3, schema_url.as_bytes());
    }

    fn span(&mut self, s: &Span) {
        let Span {
            trace_id,
            span_id,
            trace_state,
            parent_span_id,
            flags,
            name,
            kind,
            start_time_unix_nano,
            end_time_unix_nano,
            attributes,
            dropped_attributes_count,
            events,
            dropped_events_count,
            links,
            dropped_links_count,
            status,
        } = s;
        self.bytes(1, trace_id);
        self.bytes(2, span_id);
        self.bytes(3, trace_state.as_bytes());
        self.bytes(4, parent_span_id);
        self.bytes(5, name.as_bytes());
        self.uint(6, i32_u64(*kind));
        self.fixed64(7, *start_time_unix_nano);
        self.fixed64(8, *end_time_unix_nano);
        self.key_values(9, attributes);
        self.uint(10, u64::from(*dropped_attributes_count));
        for e in events {
            self.nested(11, |w| {
                let Event {
                    time_unix_nano,
                    name,
                    attributes,
                    dropped_attributes_count,
                } = e;
                w.fixed64(1, *time_unix_nano);
                w.bytes(2, name.as_bytes());
                w.key_values(3, attributes);
                w.uint(4, u64::from(*dropped_attributes_count));
            });
        }
        self.uint(12, u64::from(*dropped_events_count));
        for l in links {
            self.nested(13, |w| {
                let Link {
                    trace_id,
                    span_id,
                    trace_state,
                    attributes,
                    dropped_attributes_count,
                    flags,
                } = l;
                w.bytes(1, trace_id);
                w.bytes(2, span_id);
                w.bytes(3, trace_state.as_bytes());
                w.key_values(4, attributes);
                w.uint(5, u64::from(*dropped_attributes_count));
                w.fixed32(6, *flags);
            });
        }
        self.uint(14, u64::from(*dropped_links_count));
        if let Some(st) = status {
            self.nested(15, |w| {
                let Status { message, code } = st;
                w.bytes(2, message.as_bytes());
                w.uint(3, i32_u64(*code));
            });
        }
        self.fixed32(16, *flags);
    }

    fn key_values(&mut self, tag: u32, kvs: &[KeyValue]) {
        for kv in kvs {
            self.nested(tag, |w| {
                let KeyValue {
                    key,
                    value,
                    key_strindex,
                } = kv;
                w.bytes(1, key.as_bytes());
                if let Some(v) = value {
                    w.nested(2, |w| w.any_value(v));
                }
                w.uint(3, i32_u64(*key_strindex));
            });
        }
    }

    fn any_value(&mut self, v: &AnyValue) {
        let AnyValue { value } = v;
        match value {
            None => {}
            Some(Value::StringValue(s)) => self.bytes_always(1, s.as_bytes()),
            Some(Value::BoolValue(b)) => {
                self.key(2, VARINT);
                self.out.push(u8::from(*b));
            }
            Some(Value::IntValue(i)) => {
                self.key(3, VARINT);
                self.varint(*i as u64);
            }
            Some(Value::DoubleValue(d)) => {
                self.key(4, I64);
                self.out.extend_from_slice(&d.to_le_bytes());
            }
            Some(Value::ArrayValue(a)) => self.nested(5, |w| {
                let ArrayValue { values } = a;
                for v in values {
                    w.nested(1, |w| w.any_value(v));
                }
            }),
            Some(Value::KvlistValue(l)) => self.nested(6, |w| {
                let KeyValueList { values } = l;
                w.key_values(1, values);
            }),
            Some(Value::BytesValue(b)) => self.bytes_always(7, b),
            Some(Value::StringValueStrindex(i)) => {
                self.key(8, VARINT);
                self.varint(i32_u64(*i));
            }
        }
    }
}

#[cfg(test)]
#[path = "wire_tests.rs"]
mod tests;
