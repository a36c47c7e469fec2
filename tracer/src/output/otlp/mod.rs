//! OTLP export (`--otlp`): each decided transaction as spans with deterministic ids, sent
//! to a tracing backend by a thread of its own (docs/otlp.md).
pub mod ids;
pub mod spans;
