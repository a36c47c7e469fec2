pub mod agent;
pub mod analyze;
pub mod conntrack;
pub mod correlate;
pub mod decode;
pub mod detect;
pub mod doctor;
pub mod ebpf;
pub mod event;
pub mod evidence;
pub mod host;
pub mod kallsyms;
pub mod kernel;
pub mod kube;
pub mod memory;
pub mod names;
pub mod output;
pub mod pipeline;
pub mod source;
pub mod time;
pub mod trace;

#[cfg(test)]
mod layering;
#[cfg(test)]
mod test_support;
