//! Detect stage, `dnspath doctor`'s half: typed findings ([`finding`]) made from the node's
//! own files ([`config`] parses DNS server and resolver configs, [`node`] follows each
//! server's forward targets to where they go) and from the pipeline's records
//! ([`traffic`] folds loops, races, drops and transactions into findings). The modes
//! (`doctor`, later the agent) drive it and render what it finds.
pub mod config;
pub mod finding;
pub mod node;
pub mod traffic;

#[cfg(test)]
mod fields;
