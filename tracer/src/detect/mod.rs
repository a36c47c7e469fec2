//! Detect stage: what the correlator's hops, legs and transactions add up to beyond one
//! transaction — forwarding loops ([`loops`]) and the conntrack DNAT race ([`race`]).
pub mod loops;
pub mod race;
