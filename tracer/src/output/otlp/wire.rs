//! The request's protobuf, written straight from the transactions with no message structs in
//! between (docs/bench/README.md, "OTLP export's cost"): `spans.rs` writes each span's and
//! each resource's bytes with the writers here; [`RequestBuf`] groups the spans by resource
//! (equal bytes, equal resource) and writes the `ExportTraceServiceRequest` around them.
//!
//! Fields are written in field-number order and proto3's defaults are left out, as prost
//! writes them, but for a oneof's value, which is written whenever it is set: the unit tests
//! decode every request with prost and check that it encodes back to the same bytes.
use std::collections::HashMap;

/// Wire types.
const VARINT: u32 = 0;
const I64: u32 = 1;
const LEN: u32 = 2;

/// The field numbers written (opentelemetry-proto's `.proto` files).
pub mod tag {
    /// `ExportTraceServiceRequest.resource_spans`.
    pub const REQUEST_RESOURCE_SPANS: u32 = 1;
    /// `ResourceSpans`.
    pub const RS_RESOURCE: u32 = 1;
    pub const RS_SCOPE_SPANS: u32 = 2;
    /// `ScopeSpans`.
    pub const SS_SCOPE: u32 = 1;
    pub const SS_SPANS: u32 = 2;
    /// `InstrumentationScope`.
    pub const SCOPE_NAME: u32 = 1;
    pub const SCOPE_VERSION: u32 = 2;
    /// `Resource.attributes`.
    pub const RESOURCE_ATTRIBUTES: u32 = 1;
    /// `Span`.
    pub const SPAN_TRACE_ID: u32 = 1;
    pub const SPAN_SPAN_ID: u32 = 2;
    pub const SPAN_PARENT_SPAN_ID: u32 = 4;
    pub const SPAN_NAME: u32 = 5;
    pub const SPAN_KIND: u32 = 6;
    pub const SPAN_START: u32 = 7;
    pub const SPAN_END: u32 = 8;
    pub const SPAN_ATTRIBUTES: u32 = 9;
    pub const SPAN_EVENTS: u32 = 11;
    pub const SPAN_LINKS: u32 = 13;
    pub const SPAN_STATUS: u32 = 15;
    /// `Span.Event`.
    pub const EVENT_TIME: u32 = 1;
    pub const EVENT_NAME: u32 = 2;
    pub const EVENT_ATTRIBUTES: u32 = 3;
    /// `Span.Link`.
    pub const LINK_TRACE_ID: u32 = 1;
    pub const LINK_SPAN_ID: u32 = 2;
    pub const LINK_ATTRIBUTES: u32 = 4;
    /// `Status`.
    pub const STATUS_MESSAGE: u32 = 2;
    pub const STATUS_CODE: u32 = 3;
    /// `KeyValue`.
    pub const KV_KEY: u32 = 1;
    pub const KV_VALUE: u32 = 2;
    /// `AnyValue`'s oneof.
    pub const ANY_STRING: u32 = 1;
    pub const ANY_INT: u32 = 3;
    pub const ANY_ARRAY: u32 = 5;
    /// `ArrayValue.values`.
    pub const ARRAY_VALUES: u32 = 1;
}

#[inline]
pub fn varint_len(v: u64) -> usize {
    // 1 byte per 7 bits, at least one.
    (64 - (v | 1).leading_zeros() as usize).div_ceil(7)
}

#[inline]
pub fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

#[inline]
fn put_key(out: &mut Vec<u8>, tag: u32, wire_type: u32) {
    put_varint(out, u64::from(tag << 3 | wire_type));
}

/// A length-delimited field's size: key, length, body.
#[inline]
fn field_len(tag: u32, body: usize) -> usize {
    varint_len(u64::from(tag << 3)) + varint_len(body as u64) + body
}

/// A string or bytes field, left out when empty (proto3's default).
#[inline]
pub fn put_bytes(out: &mut Vec<u8>, tag: u32, b: &[u8]) {
    if !b.is_empty() {
        put_bytes_always(out, tag, b);
    }
}

/// A string or bytes field written even when empty (a oneof's value).
#[inline]
pub fn put_bytes_always(out: &mut Vec<u8>, tag: u32, b: &[u8]) {
    put_key(out, tag, LEN);
    put_varint(out, b.len() as u64);
    out.extend_from_slice(b);
}

/// A string made of `parts`, left out when empty.
pub fn put_str_parts(out: &mut Vec<u8>, tag: u32, parts: &[&str]) {
    let len: usize = parts.iter().map(|p| p.len()).sum();
    if len == 0 {
        return;
    }
    put_key(out, tag, LEN);
    put_varint(out, len as u64);
    for p in parts {
        out.extend_from_slice(p.as_bytes());
    }
}

/// An unsigned varint field (or an enum's non-negative value), left out when zero.
#[inline]
pub fn put_uint(out: &mut Vec<u8>, tag: u32, v: u64) {
    if v != 0 {
        put_key(out, tag, VARINT);
        put_varint(out, v);
    }
}

/// A `fixed64` field, left out when zero.
#[inline]
pub fn put_fixed64(out: &mut Vec<u8>, tag: u32, v: u64) {
    if v != 0 {
        put_key(out, tag, I64);
        out.extend_from_slice(&v.to_le_bytes());
    }
}

/// Where a nested message's one-byte length was reserved ([`begin`]).
#[must_use]
pub struct Mark(usize);

/// Starts a nested message (always written, even empty, as an optional message that is set):
/// its key and a one-byte length that [`end`] fills in.
#[inline]
pub fn begin(out: &mut Vec<u8>, tag: u32) -> Mark {
    put_key(out, tag, LEN);
    out.push(0);
    Mark(out.len() - 1)
}

/// Ends the message [`begin`] started: its length, moving the body up if the length takes
/// more than its one byte (once per message, so the writing stays linear per level).
pub fn end(out: &mut Vec<u8>, Mark(at): Mark) {
    let body = out.len() - at - 1;
    let n = varint_len(body as u64);
    if n > 1 {
        let old = out.len();
        out.resize(old + n - 1, 0);
        out.copy_within(at + 1..old, at + n);
    }
    let mut v = body as u64;
    for b in out.iter_mut().skip(at).take(n) {
        *b = if v >= 0x80 { (v as u8) | 0x80 } else { v as u8 };
        v >>= 7;
    }
}

/// A `KeyValue` with a string value, as field `tag`.
#[inline]
pub fn kv_str(out: &mut Vec<u8>, tag: u32, key: &str, value: &str) {
    let any = field_len(tag::ANY_STRING, value.len());
    let kv = field_len(tag::KV_KEY, key.len()) + field_len(tag::KV_VALUE, any);
    out.reserve(field_len(tag, kv));
    put_key(out, tag, LEN);
    put_varint(out, kv as u64);
    put_bytes(out, tag::KV_KEY, key.as_bytes());
    put_key(out, tag::KV_VALUE, LEN);
    put_varint(out, any as u64);
    put_bytes_always(out, tag::ANY_STRING, value.as_bytes());
}

/// A `KeyValue` with an integer value, as field `tag`.
#[inline]
pub fn kv_int(out: &mut Vec<u8>, tag: u32, key: &str, value: i64) {
    let any = varint_len(u64::from(tag::ANY_INT << 3)) + varint_len(value as u64);
    let kv = field_len(tag::KV_KEY, key.len()) + field_len(tag::KV_VALUE, any);
    put_key(out, tag, LEN);
    put_varint(out, kv as u64);
    put_bytes(out, tag::KV_KEY, key.as_bytes());
    put_key(out, tag::KV_VALUE, LEN);
    put_varint(out, any as u64);
    put_key(out, tag::ANY_INT, VARINT);
    // int64: negative values are ten-byte varints (two's complement).
    put_varint(out, value as u64);
}

/// A `KeyValue` with an array of strings, as field `tag`: each of `values` as it displays.
pub fn kv_strings<T: std::fmt::Display>(
    out: &mut Vec<u8>,
    text: &mut String,
    tag: u32,
    key: &str,
    values: impl Iterator<Item = T>,
) {
    use std::fmt::Write;
    let kv = begin(out, tag);
    put_bytes(out, tag::KV_KEY, key.as_bytes());
    let any = begin(out, tag::KV_VALUE);
    let array = begin(out, tag::ANY_ARRAY);
    for v in values {
        text.clear();
        let _ = write!(text, "{v}");
        let item = begin(out, tag::ARRAY_VALUES);
        put_bytes_always(out, tag::ANY_STRING, text.as_bytes());
        end(out, item);
    }
    end(out, array);
    end(out, any);
    end(out, kv);
}

/// One span's place in a [`RequestBuf`]: its resource's group and its bytes.
#[derive(Clone, Copy)]
struct Placed {
    group: usize,
    start: usize,
    end: usize,
}

/// The spans of a request being made, grouped by resource, and the request's bytes once
/// they are all in. Its buffers are kept from one request to the next.
#[derive(Default)]
pub struct RequestBuf {
    /// The `Span` messages' bodies, back to back; `spans.rs` writes the next one at the end.
    pub spans: Vec<u8>,
    placed: Vec<Placed>,
    /// Each distinct resource's `Resource` body, in order of first use, and its group.
    resources: Vec<Vec<u8>>,
    index: HashMap<Vec<u8>, usize>,
    /// The groups' spans in order ([`RequestBuf::encode`]'s counting sort).
    order: Vec<usize>,
}

impl RequestBuf {
    /// Spans placed so far.
    pub fn len(&self) -> usize {
        self.placed.len()
    }

    pub fn is_empty(&self) -> bool {
        self.placed.is_empty()
    }

    /// Where the next span's body starts in [`RequestBuf::spans`].
    pub fn span_start(&self) -> usize {
        self.spans.len()
    }

    /// The span written from `start` to the end of `spans` belongs to the resource whose
    /// body is `resource`.
    pub fn place(&mut self, start: usize, resource: &[u8]) {
        let group = match self.index.get(resource) {
            Some(&g) => g,
            None => {
                let g = self.resources.len();
                self.resources.push(resource.to_vec());
                self.index.insert(resource.to_vec(), g);
                g
            }
        };
        self.placed.push(Placed {
            group,
            start,
            end: self.spans.len(),
        });
    }

    /// Each span placed, in order, with its resource: `(resource, span)` bodies.
    pub fn placed(&self) -> impl Iterator<Item = (&[u8], &[u8])> {
        self.placed.iter().map(|p| {
            (
                self.resources.get(p.group).map_or(&[][..], Vec::as_slice),
                self.spans.get(p.start..p.end).unwrap_or_default(),
            )
        })
    }

    /// The `ExportTraceServiceRequest` of every span placed: one `ResourceSpans` per
    /// resource (in order of first use) holding one `ScopeSpans` of `scope` (an
    /// `InstrumentationScope` body) with the resource's spans in the order placed. Empties
    /// the buffer for the next request.
    pub fn encode(&mut self, scope: &[u8]) -> Vec<u8> {
        let groups = self.resources.len();
        // Counting sort of the spans by group, and each group's `ScopeSpans` body length.
        let mut first = vec![0usize; groups + 1];
        let mut scope_spans = vec![field_len(tag::SS_SCOPE, scope.len()); groups];
        for p in &self.placed {
            if let Some(c) = first.get_mut(p.group + 1) {
                *c += 1;
            }
            if let Some(l) = scope_spans.get_mut(p.group) {
                *l += field_len(tag::SS_SPANS, p.end - p.start);
            }
        }
        for g in 0..groups {
            let before = first.get(g).copied().unwrap_or(0);
            if let Some(c) = first.get_mut(g + 1) {
                *c += before;
            }
        }
        self.order.clear();
        self.order.resize(self.placed.len(), 0);
        let mut next = first.clone();
        for (i, p) in self.placed.iter().enumerate() {
            if let Some(n) = next.get_mut(p.group) {
                if let Some(o) = self.order.get_mut(*n) {
                    *o = i;
                }
                *n += 1;
            }
        }
        let resource_spans = |g: usize, ss: usize| {
            let r = self.resources.get(g).map_or(0, Vec::len);
            field_len(tag::RS_RESOURCE, r) + field_len(tag::RS_SCOPE_SPANS, ss)
        };
        let total: usize = scope_spans
            .iter()
            .enumerate()
            .map(|(g, &ss)| field_len(tag::REQUEST_RESOURCE_SPANS, resource_spans(g, ss)))
            .sum();
        let mut out = Vec::with_capacity(total);
        for (g, &ss) in scope_spans.iter().enumerate() {
            put_key(&mut out, tag::REQUEST_RESOURCE_SPANS, LEN);
            put_varint(&mut out, resource_spans(g, ss) as u64);
            let resource = self.resources.get(g).map_or(&[][..], Vec::as_slice);
            put_bytes_always(&mut out, tag::RS_RESOURCE, resource);
            put_key(&mut out, tag::RS_SCOPE_SPANS, LEN);
            put_varint(&mut out, ss as u64);
            put_bytes_always(&mut out, tag::SS_SCOPE, scope);
            let (from, to) = (
                first.get(g).copied().unwrap_or(0),
                first.get(g + 1).copied().unwrap_or(0),
            );
            for &i in self.order.get(from..to).unwrap_or_default() {
                if let Some(p) = self.placed.get(i) {
                    let body = self.spans.get(p.start..p.end).unwrap_or_default();
                    put_bytes_always(&mut out, tag::SS_SPANS, body);
                }
            }
        }
        self.clear();
        out
    }

    /// Forgets every span and resource, keeping the buffers.
    pub fn clear(&mut self) {
        self.spans.clear();
        self.placed.clear();
        self.resources.clear();
        self.index.clear();
    }
}

/// An `InstrumentationScope` body: its name and version.
pub fn scope(name: &str, version: &str) -> Vec<u8> {
    let mut out = Vec::new();
    put_bytes(&mut out, tag::SCOPE_NAME, name.as_bytes());
    put_bytes(&mut out, tag::SCOPE_VERSION, version.as_bytes());
    out
}

#[cfg(test)]
#[path = "wire_tests.rs"]
mod tests;
