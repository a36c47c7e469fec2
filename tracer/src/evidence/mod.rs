//! Evidence: the captured packets themselves, annotated with what dnspath made of them, in
//! pcapng files — `trace -w` and its rotation, and the flight recorder `--record`.
pub mod annotate;
pub mod files;
mod live;
pub mod pcapng;
pub mod recorder;

pub use live::{Evidence, EvidenceOptions};
