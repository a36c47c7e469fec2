//! Findings: one thing wrong on the node, how bad it is, why and what to do ([`finding`]),
//! and the folds that turn the pipeline's records into them ([`watch`] over [`traffic`] and
//! [`traffic_more`]; [`servers`] the per-server tally they share with the agent's event
//! lines; [`causes`] which server's failure another's is a symptom of). `doctor` adds the
//! findings of the node's files and counters; the agent exports each findings window's as
//! events and metrics.
pub mod causes;
pub mod finding;
pub mod servers;
pub mod traffic;
pub mod traffic_more;
pub mod watch;

#[cfg(test)]
mod fields;
