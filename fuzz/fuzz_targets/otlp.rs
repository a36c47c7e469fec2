//! The OTLP encoder fed the transactions the correlate stage decides from arbitrary inputs
//! (the correlate target's steps, steps.rs): every transaction's spans are built with names
//! shown and redacted, encoded as an export request and checked
//! (`dnspath::fuzzing::check_otlp`): every span in the transaction's trace with a non-zero
//! id of its own, its parent a span of the transaction or (a SERVER span of another node's
//! client) that client's CLIENT span, one root on the client's node and none elsewhere, no
//! name or answer left when redacted, the request decoding back to itself (prost). The
//! correlate target's checks run too.
#![no_main]
use dnspath::{fuzzing::Harness, output::otlp::SpanConfig};
use libfuzzer_sys::fuzz_target;

#[path = "steps.rs"]
mod steps;

fuzz_target!(|steps: Vec<steps::Step>| {
    let cfg = SpanConfig {
        node: Some("node-a".into()),
        ..Default::default()
    };
    steps::run(Harness::with_otlp(cfg), steps);
});
