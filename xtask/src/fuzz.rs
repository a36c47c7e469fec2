//! `cargo xtask fuzz [--seconds N] [TARGET...]`: the coverage-guided fuzz targets of
//! `fuzz/` (libFuzzer through `cargo fuzz`, on the rustup `nightly` these machines have:
//! sanitizers need no `rust-src`), each for N seconds (default 60), seeded with the golden
//! captures. A crash fails the run; its input is left in `fuzz/artifacts/TARGET/`, to become
//! a regression test.
use anyhow::anyhow;
use std::{path::Path, process::Command};

use crate::{
    cmd::{run, workspace_root},
    Result,
};

/// The targets, with what seeds them (a folder of the repository, or none).
const TARGETS: &[(&str, Option<&str>)] =
    &[("capture", Some("tests/golden")), ("dns_message", None)];

/// cargo-fuzz, pinned.
const CARGO_FUZZ: &str = "cargo-fuzz@0.13.2";

fn ensure_cargo_fuzz() -> Result<()> {
    let have = Command::new("cargo")
        .args(["fuzz", "--version"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !have {
        eprintln!("xtask: installing {CARGO_FUZZ}");
        run(Command::new("cargo").args(["install", CARGO_FUZZ, "--locked"]))?;
    }
    Ok(())
}

pub fn run_targets(seconds: u64, only: &[String]) -> Result<()> {
    if let Some(other) = only.iter().find(|t| !TARGETS.iter().any(|(n, _)| n == t)) {
        return Err(anyhow!("fuzz: unknown argument or target {other:?}"));
    }
    ensure_cargo_fuzz()?;
    let root = workspace_root();
    for &(target, seeds) in TARGETS {
        if !only.is_empty() && !only.iter().any(|t| t == target) {
            continue;
        }
        let corpus = root.join("fuzz/corpus").join(target);
        std::fs::create_dir_all(&corpus).map_err(|e| anyhow!("{}: {e}", corpus.display()))?;
        let mut cmd = Command::new("cargo");
        cmd.current_dir(&root)
            .args(["+nightly", "fuzz", "run", "--release", target])
            .arg(&corpus);
        if let Some(dir) = seeds {
            cmd.arg(Path::new(&root).join(dir));
        }
        cmd.arg("--").arg(format!("-max_total_time={seconds}"));
        // Captures of a few packets say as much as big ones, and run 100× faster.
        cmd.arg("-max_len=65536");
        eprintln!("xtask: fuzzing {target} for {seconds} s");
        run(&mut cmd).map_err(|e| {
            anyhow!("fuzz target {target}: {e:#} (inputs in fuzz/artifacts/{target}/)")
        })?;
    }
    Ok(())
}
