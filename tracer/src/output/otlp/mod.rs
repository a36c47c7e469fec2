//! OTLP export (`--otlp`): each decided transaction as spans with deterministic ids, sent
//! to a tracing backend by a thread of its own (docs/otlp.md). Also what NDJSON records
//! carry to link logs with traces: the transaction's `trace_id` and the run's `node`.
pub mod config;
pub mod error;
pub mod export;
pub mod ids;
mod resource;
mod roles;
pub mod sink;
pub mod spans;
pub mod tls;
pub mod wire;

pub use config::{OtlpConfig, Protocol};
pub use error::OtlpError;
pub use export::Exporter;
pub use sink::OtlpSink;

pub use crate::output::record::OtlpStats;
pub use spans::SpanConfig;

use crate::output::Record;

/// The run's id key and node name, as NDJSON records carry them: the transaction's
/// `trace_id` (the span's, made with the key) and `node` (`--node-name`). The default: the
/// empty secret's key, no `node`.
#[derive(Clone, Debug, Default)]
pub struct Identity {
    key: ids::IdKey,
    /// `,"node":"…"` ready to append, or empty.
    node_field: String,
}

impl Identity {
    pub fn new(key: ids::IdKey, node: Option<&str>) -> Self {
        Self {
            key,
            node_field: node_field(node).unwrap_or_default(),
        }
    }

    /// Appends `node` (every record, with `--node-name`) and `trace_id` (transactions) to a
    /// record's JSON object in `line` (which ends with its `}`).
    pub fn extend_json(&self, record: &Record, line: &mut Vec<u8>) {
        self.extend_json_as(record, line, None);
    }

    /// [`Identity::extend_json`] with `node` in place of the run's `--node-name` (`analyze`
    /// of several nodes' captures names each record's node).
    pub fn extend_json_as(&self, record: &Record, line: &mut Vec<u8>, node: Option<&str>) {
        let trace = match record {
            Record::Transaction(t) => Some(spans::trace_ids(&self.key, t).trace),
            _ => None,
        };
        let own = node_field(node);
        let node_field = own.as_deref().unwrap_or(&self.node_field);
        if node_field.is_empty() && trace.is_none() {
            return;
        }
        if line.last() != Some(&b'}') {
            return;
        }
        line.pop();
        if let Some(t) = trace {
            line.extend_from_slice(b",\"trace_id\":\"");
            line.extend_from_slice(ids::hex(&t).as_bytes());
            line.push(b'"');
        }
        line.extend_from_slice(node_field.as_bytes());
        line.push(b'}');
    }
}

/// `,"node":"…"` of `node`, if given.
fn node_field(node: Option<&str>) -> Option<String> {
    match node.map(serde_json::to_string) {
        Some(Ok(n)) => Some(format!(",\"node\":{n}")),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The fields spliced into NDJSON lines (not seen by `fields.rs`, which serialises
    /// records alone) are documented too.
    #[test]
    fn ndjson_fields_are_documented() {
        let doc = include_str!("../../../../docs/output.md");
        assert!(doc.contains("`trace_id`") && doc.contains("`node`"));
    }

    #[test]
    fn transactions_carry_their_trace_id() {
        let r =
            crate::test_support::fixtures::service_transaction("www.lab.test.", "A", 1, "NOERROR");
        let Record::Transaction(t) = &r else {
            unreachable!()
        };
        // The identity the writer was given: its key makes the id, its node is written.
        let key = ids::IdKey::from_secret(b"s3cret");
        let id = Identity::new(key.clone(), Some("node-a"));
        let mut line = serde_json::to_vec(&r).unwrap();
        id.extend_json(&r, &mut line);
        let v: serde_json::Value = serde_json::from_slice(&line).unwrap();
        let want = ids::hex(&spans::trace_ids(&key, t).trace);
        assert_eq!(v["trace_id"].as_str(), Some(want.as_str()));
        assert_eq!(v["node"], "node-a");
        assert_eq!(v["type"], "transaction");
        // Another key, another id; no node by default.
        let mut line = serde_json::to_vec(&r).unwrap();
        Identity::default().extend_json(&r, &mut line);
        let v: serde_json::Value = serde_json::from_slice(&line).unwrap();
        assert_ne!(v["trace_id"].as_str(), Some(want.as_str()));
        assert!(v.get("node").is_none());
    }
}
