//! Sources: where observations come from. Live (eBPF ring buffer) and, later, capture files;
//! everything after the source is shared.
pub mod file;
pub mod live;
