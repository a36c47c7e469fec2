pub mod ebpf;
pub mod kernel;
pub mod event;
pub mod source;
pub mod decode;
pub mod output;
pub mod pipeline;
pub mod trace;
