//! `cargo xtask test`: every test (as root: the lab tests included), then the kernel matrix
//! in VMs, then a short campaign of each fuzz target; every part runs whatever the others
//! said, and the failures are reported together.
use std::process::Command;

use anyhow::anyhow;
use lab::tracer::is_root;

use crate::{
    build::build_release,
    cmd::{run, workspace_root},
    fuzz, vm, Result,
};

pub fn run_all(extra: &[String]) -> Result<()> {
    if !is_root() {
        if lab::tracer::skip_root_tests() {
            eprintln!("xtask: not root: lab and eBPF tests will report themselves skipped");
        } else {
            eprintln!(
                "xtask: not root: lab and eBPF tests will fail; run as root, or set \
                 DNSPATH_SKIP_ROOT_TESTS=1 to skip them"
            );
        }
    }
    // The binary under test must exist before the integration tests spawn it.
    let bin = build_release()?;
    let tests = run(Command::new("cargo")
        .current_dir(workspace_root())
        .args([
            "test",
            "--workspace",
            "--exclude",
            "tracer-ebpf",
            "--release",
            // Every failing test binary is reported, not only the first.
            "--no-fail-fast",
        ])
        .args(extra)
        .args(["--", "--test-threads=1"]));
    // The kernels nodes run, whatever the tests above said.
    let matrix = vm::run_matrix(&bin, &[]);
    // A short fuzz campaign of every target, seeded (the long ones are recorded in README).
    let fuzz = fuzz::run_targets(30, Some(fuzz::CI_SEED), &[]);
    let failed: Vec<String> = [tests, matrix, fuzz]
        .into_iter()
        .filter_map(|r| r.err())
        .map(|e| format!("{e:#}"))
        .collect();
    if failed.is_empty() {
        Ok(())
    } else {
        Err(anyhow!(failed.join("; ")))
    }
}
