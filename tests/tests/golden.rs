//! Golden outputs (issue 25): `dnspath analyze` of every capture under `tests/golden/`, in
//! text, `-o json`, `--view packets` and `--failures`, byte for byte against the expected
//! files next to it, normalised as `lab::golden` says. No root needed: it reads files.
//! `cargo xtask bless` rewrites the expected files on purpose; `tests/golden/README.md` says
//! how each capture was made.
use std::{collections::BTreeSet, fs};

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
