//! dnspath's library: the pipeline's stages (see docs/layout.md). Modules used only inside
//! the crate are `pub(crate)`, and `unreachable_pub` keeps their items from claiming more.
#![warn(unreachable_pub)]

/// The one word each value of an enum is written as, everywhere (JSON, the text, OTLP,
/// metric labels): `as_str` gives it, and `Serialize` and `Display` write it.
macro_rules! words {
    ($t:ty { $($v:ident => $w:literal),+ $(,)? }) => {
        impl $t {
            /// The word this value is written as.
            pub fn as_str(self) -> &'static str {
                match self {
                    $(Self::$v => $w),+
                }
            }
        }

        /// Written as its word ([`as_str`](Self::as_str)).
        impl serde::Serialize for $t {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(self.as_str())
            }
        }

        impl std::fmt::Display for $t {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

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
pub mod show;
pub mod source;
pub mod time;
pub mod top;
pub mod trace;

#[cfg(test)]
mod layering;
#[cfg(test)]
mod test_support;
