//! Golden outputs (issue 25): `dnspath analyze` of every capture under `tests/golden/`, in
//! text, `-o json`, `--view packets` and `--failures`, byte for byte against the expected
//! files next to it, normalised as `lab::golden` says. No root needed: it reads files.
//! `cargo xtask bless` rewrites the expected files on purpose; `tests/golden/README.md` says
//! how each capture was made. Also: two of the captures as two nodes' (`analyze a=… b=…`),
//! for what a run of several nodes writes at its end.
use std::{collections::BTreeSet, fs, process::Command};

use lab::{golden, tracer::dnspath_bin};

#[test]
fn analyze_prints_the_expected_outputs_of_every_capture() {
    let dir = golden::dir();
    let captures = golden::captures(&dir).unwrap_or_else(|e| panic!("{e}"));
    assert!(
        captures.len() >= 5,
        "{}: too few captures ({captures:?})",
        dir.display()
    );
    let bin = dnspath_bin();
    let mut failures = Vec::new();
    let mut compared = 0;
    for capture in &captures {
        for (output, flags) in golden::OUTPUTS {
            let path = golden::expected(capture, output);
            let name = path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            let expected = match fs::read(&path) {
                Ok(b) => b,
                Err(e) => {
                    failures.push(format!("{name}: {e} (run `cargo xtask bless`)"));
                    continue;
                }
            };
            let actual = golden::run(&bin, capture, flags).unwrap_or_else(|e| panic!("{e}"));
            compared += 1;
            if let Some(diff) = golden::first_difference(&expected, &actual, &name) {
                failures.push(diff);
            }
        }
    }
    // An expected file of no capture is a leftover (a capture renamed or removed).
    let wanted: BTreeSet<_> = captures
        .iter()
        .flat_map(|c| golden::OUTPUTS.map(|(o, _)| golden::expected(c, o)))
        .collect();
    for entry in fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = entry.unwrap_or_else(|e| panic!("{e}")).path();
        if path.extension().is_some_and(|e| e == "out") && !wanted.contains(&path) {
            failures.push(format!("{}: expected output of no capture", path.display()));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {compared} golden outputs differ from {} (if the change is meant: \
         `cargo xtask bless`, and commit the new files):\n\n{}",
        failures.len(),
        dir.display(),
        failures.join("\n")
    );
}

/// `analyze` of several nodes' captures ends as one capture's does: with the run's summary,
/// of every node's questions, on stderr before the files' lines (text) or as a `summary`
/// record of no node just before the nodes' `stats` records (`-o json`).
#[test]
fn several_nodes_captures_end_with_the_runs_summary() {
    let run = |flags: &[&str]| {
        let out = Command::new(dnspath_bin())
            .current_dir(golden::dir())
            .arg("analyze")
            .args(flags)
            .args(["a=lab.pcapng", "b=late.pcapng"])
            .env("TZ", "UTC")
            .env("LC_ALL", "C")
            .env_remove("RUST_LOG")
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "{stderr}");
        (String::from_utf8_lossy(&out.stdout).into_owned(), stderr)
    };
    let (json, _) = run(&["-o", "json"]);
    let recs: Vec<serde_json::Value> = json
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let types: Vec<&str> = recs.iter().map(|r| r["type"].as_str().unwrap()).collect();
    let n = types.len();
    assert_eq!(types[n - 3..], ["summary", "stats", "stats"], "{types:?}");
    assert_eq!(types.iter().filter(|t| **t == "summary").count(), 1);
    let summary = &recs[n - 3];
    assert!(summary.get("node").is_none(), "{summary}");
    let txs: Vec<&serde_json::Value> = recs.iter().filter(|r| r["type"] == "transaction").collect();
    for node in ["a", "b"] {
        assert!(
            txs.iter().any(|t| t["node"] == node),
            "no transaction of {node}"
        );
    }
    assert_eq!(summary["questions"], txs.len(), "{summary}");

    let (_, stderr) = run(&[]);
    let first = stderr.lines().next().unwrap_or_default();
    assert!(
        first.starts_with(&format!("--- summary: {} question(s)", txs.len())),
        "{stderr}"
    );
    assert!(
        stderr.contains("\ndnspath: lab.pcapng (node a)"),
        "{stderr}"
    );
}
