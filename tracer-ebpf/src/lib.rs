#![no_std]
// The programs live in main.rs (a bin target, as aya-build builds `--bins`); this library
// exists so that `cargo check --workspace` has something to check on the host.
