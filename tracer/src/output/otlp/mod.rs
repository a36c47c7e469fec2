//! OTLP export (`--otlp`): each decided transaction as spans with deterministic ids, sent
//! to a tracing backend by a thread of its own (docs/otlp.md). Also what NDJSON records
//! carry to link logs with traces: the transaction's `trace_id` and the run's `node`.
pub mod config;
pub mod error;
pub mod export;
pub mod ids;
mod resource;
mod roles;
pub mod spans;
pub mod tls;
pub mod wire;

use std::sync::OnceLock;

pub use config::{OtlpConfig, Protocol};
pub use error::OtlpError;
pub use export::Exporter;

pub use crate::output::record::OtlpStats;
pub use spans::SpanConfig;

use crate::output::Record;

/// The run's id key and node name, for the NDJSON records (set once, at start).
struct Identity {
    key: ids::IdKey,
    /// `,"node":"…"` ready to append, or empty.
    node_field: String,
}

static IDENTITY: OnceLock<Identity> = OnceLock::new();

/// Sets the key trace ids are made with and the node name NDJSON records carry (once; later
/// calls change nothing). Without it, trace ids use the empty secret and no `node` is written.
pub fn set_identity(key: ids::IdKey, node: Option<&str>) {
    let node_field = match node.map(serde_json::to_string) {
        Some(Ok(n)) => format!(",\"node\":{n}"),
        _ => String::new(),
    };
    let _ = IDENTITY.set(Identity { key, node_field });
}

fn identity() -> &'static Identity {
    IDENTITY.get_or_init(|| Identity {
        key: ids::IdKey::default(),
        node_field: String::new(),
    })
}

/// Appends `node` (every record, with `--node-name`) and `trace_id` (transactions) to a
/// record's JSON object in `line` (which ends with its `}`).
pub fn extend_json(record: &Record, line: &mut Vec<u8>) {
    extend_json_as(record, line, None);
}

/// [`extend_json`] with `node` in place of the run's `--node-name` (`analyze` of several
/// nodes' captures names each record's node).
pub fn extend_json_as(record: &Record, line: &mut Vec<u8>, node: Option<&str>) {
    let id = identity();
    let trace = match record {
        Record::Transaction(t) => Some(spans::trace_ids(&id.key, t).trace),
        _ => None,
    };
    let own;
    let node_field = match node.map(serde_json::to_string) {
        Some(Ok(n)) => {
            own = format!(",\"node\":{n}");
            own.as_str()
        }
        _ => id.node_field.as_str(),
    };
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
        let mut line = serde_json::to_vec(&r).unwrap();
        extend_json(&r, &mut line);
        let v: serde_json::Value = serde_json::from_slice(&line).unwrap();
        let Record::Transaction(t) = &r else {
            unreachable!()
        };
        let want = ids::hex(&spans::trace_ids(&identity().key, t).trace);
        assert_eq!(v["trace_id"].as_str(), Some(want.as_str()));
        assert_eq!(v["type"], "transaction");
    }
}
