//! Building blocks of `dnspath agent` (issue #12): a node-wide, long-running tracer that
//! exports Prometheus metrics, health endpoints and an NDJSON stream of events people act on.
//! Each consumes the pipeline's typed output ([`crate::output::Record`]).
pub mod events;
pub mod http;
pub mod metrics;
pub mod run;
