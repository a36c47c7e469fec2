//! `cargo xtask fuzz [--seconds N] [TARGET...]`: the coverage-guided fuzz targets of
//! `fuzz/` (libFuzzer through `cargo fuzz`, on the rustup `nightly` these machines have:
//! sanitizers need no `rust-src`), each for N seconds (default 60), seeded with the golden
//! captures. A crash fails the run; its input is left in `fuzz/artifacts/TARGET/`, to become
//! a regression test. `--seed S` fixes libFuzzer's random seed: `cargo xtask test` uses
//! [`CI_SEED`], so the gate replays the mutations a developer ran before landing rather than
//! new ones each time (exploration is `cargo xtask fuzz` without a seed; the harness's hash
//! maps still vary a little from run to run).
use anyhow::anyhow;
use std::{path::Path, process::Command};

use crate::{
    cmd::{run, workspace_root},
    Result,
};

/// The targets, with what seeds them (a folder of the repository, or none): every
/// `[[bin]]` of fuzz/Cargo.toml (a test below checks).
const TARGETS: &[(&str, Option<&str>)] = &[
    ("capture", Some("tests/golden")),
    ("dns_message", None),
    ("ring_record", Some("fuzz/seeds/ring_record")),
    ("correlate", Some("fuzz/seeds/correlate")),
    ("config", Some("fuzz/seeds/config")),
    ("otlp", Some("fuzz/seeds/otlp")),
];

/// libFuzzer's seed in `cargo xtask test`.
pub const CI_SEED: u64 = 1;

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

pub fn run_targets(seconds: u64, seed: Option<u64>, only: &[String]) -> Result<()> {
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
        if let Some(seed) = seed {
            cmd.arg(format!("-seed={seed}"));
        }
        eprintln!("xtask: fuzzing {target} for {seconds} s");
        run(&mut cmd).map_err(|e| {
            anyhow!("fuzz target {target}: {e:#} (inputs in fuzz/artifacts/{target}/)")
        })?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_fuzz_target_is_run_and_its_seeds_are_there() {
        let root = workspace_root();
        let manifest =
            std::fs::read_to_string(root.join("fuzz/Cargo.toml")).expect("fuzz/Cargo.toml");
        let bins: Vec<&str> = manifest
            .lines()
            .filter_map(|l| l.strip_prefix("name = \""))
            .filter_map(|l| l.strip_suffix('"'))
            .filter(|n| *n != "dnspath-fuzz")
            .collect();
        let mut listed: Vec<&str> = TARGETS.iter().map(|(n, _)| *n).collect();
        let mut bins_sorted = bins.clone();
        listed.sort_unstable();
        bins_sorted.sort_unstable();
        assert_eq!(
            listed, bins_sorted,
            "fuzz/Cargo.toml's [[bin]]s and TARGETS"
        );
        assert!(listed.len() >= 6);
        for (target, seeds) in TARGETS {
            if let Some(dir) = seeds {
                let n = std::fs::read_dir(root.join(dir)).map_or(0, |d| d.count());
                assert!(n > 0, "{target}: no seeds in {dir}");
            }
        }
    }
}
