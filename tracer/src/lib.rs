//! dnspath's library: the pipeline's stages (see docs/layout.md). Modules used only inside
//! the crate are `pub(crate)`, and `unreachable_pub` keeps their items from claiming more.
#![warn(unreachable_pub)]

pub mod agent;
pub mod analyze;
pub mod conntrack;
pub(crate) mod correlate;
pub mod decode;
pub(crate) mod detect;
pub mod doctor;
pub(crate) mod ebpf;
pub mod engine;
pub mod event;
pub mod evidence;
pub mod findings;
/// The fuzz targets' entry into the pipeline (fuzz/): not an API.
#[doc(hidden)]
pub mod fuzzing;
pub mod host;
pub mod kallsyms;
pub mod kernel;
pub(crate) mod kube;
pub(crate) mod memory;
pub mod names;
pub mod output;
pub(crate) mod pipeline;
pub mod runner;
pub mod source;
pub mod time;
pub mod trace;

#[cfg(test)]
mod layering;
#[cfg(test)]
mod test_support;
