//! Running the commands xtask orchestrates, and where: the workspace.
use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::anyhow;

use crate::Result;

pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."))
}

pub fn run(cmd: &mut Command) -> Result<()> {
    let status = cmd.status().map_err(|e| anyhow!("{cmd:?}: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(anyhow!("{cmd:?} failed: {status}"))
    }
}

pub fn output_ok(cmd: &mut Command) -> Option<String> {
    let out = cmd.output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}
