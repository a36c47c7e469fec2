//! The correlate and detect stages fed arbitrary sequences of DNS packets (UDP and TCP, at
//! several points, out of order), kernel drops with and without their conntrack entry,
//! conntrack events (DNAT to a few backends), conntrack statistics and the passing of time,
//! through `dnspath::fuzzing::Harness` (the live pipeline with small tables): after every
//! event each packet is accounted for exactly once, every table is within its bound, and
//! no transaction or leg is reported twice (so none both answered and dropped).
//!
//! The inputs are structured (`arbitrary`, steps.rs): addresses, ports, ids and names come
//! from small sets so that queries meet their answers, forwarders their clients, retries
//! their first attempts and search-list steps their lookups.
#![no_main]
use dnspath::fuzzing::Harness;
use libfuzzer_sys::fuzz_target;

#[path = "steps.rs"]
mod steps;

fuzz_target!(|steps: Vec<steps::Step>| {
    steps::run(Harness::new(), steps);
});
