//! `cargo xtask build`: the release binary (the eBPF object is built by tracer/build.rs).
use std::{path::PathBuf, process::Command};

use crate::{
    cmd::{run, workspace_root},
    Result,
};

pub fn build_release() -> Result<PathBuf> {
    run(Command::new("cargo").current_dir(workspace_root()).args([
        "build",
        "--release",
        "--package",
        "tracer",
        "--bin",
        "dnspath",
    ]))?;
    Ok(workspace_root().join("target/release/dnspath"))
}
