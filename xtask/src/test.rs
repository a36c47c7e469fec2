//! `cargo xtask test`: every test (as root: the lab tests included), then the kernel matrix
//! in VMs, then a short campaign of each fuzz target; every part runs whatever the others
//! said, and the failures are reported together.
use std::{
    io::{BufRead, BufReader, Write},
    process::{Command, Stdio},
};

use anyhow::anyhow;
use lab::tracer::is_root;

use crate::{build::build_release, cmd::workspace_root, fuzz, vm, Result};

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
    let (mut tests, Outcome { failures, .. }) = run_noting_failures(&mut cargo_test(extra, &[]));
    // A test that failed is run once more, alone: on two noisy cores a lab test bound by
    // timing can miss once. One that fails again fails the run; one that passes is named
    // as flaky at the end, with its first failure's report.
    let mut flaky = Vec::new();
    if tests.is_err() && !failures.is_empty() && failures.len() <= MAX_RERUNS {
        let again: Vec<bool> = failures
            .iter()
            .map(|f| {
                eprintln!("xtask: running the failed test {} again, alone", f.name);
                // A filter that matched nothing also "passes": the test must have run.
                let (result, again) =
                    run_noting_failures(&mut cargo_test(extra, &["--exact", &f.name]));
                result.is_ok() && again.passed >= 1
            })
            .collect();
        if again.iter().all(|ok| *ok) {
            flaky = failures.iter().map(|f| f.name.clone()).collect();
            tests = Ok(());
        }
    }
    // The kernels nodes run, whatever the tests above said.
    let matrix = vm::run_matrix(&bin, &[]);
    // A short fuzz campaign of every target, seeded (the long campaigns: docs/fuzzing.md).
    let fuzz = fuzz::run_targets(30, Some(fuzz::CI_SEED), &[]);
    let failed: Vec<String> = [tests, matrix, fuzz]
        .into_iter()
        .filter_map(|r| r.err())
        .map(|e| format!("{e:#}"))
        .collect();
    // Last, so that a log cut to its tail still says which tests failed and why.
    if !failures.is_empty() {
        eprintln!("xtask: the failed tests' reports, again:");
        for f in &failures {
            eprintln!("{}", f.report);
        }
    }
    if !flaky.is_empty() {
        eprintln!(
            "xtask: FLAKY: failed once, passed when run again alone: {}",
            flaky.join(", ")
        );
    }
    if failed.is_empty() {
        Ok(())
    } else {
        Err(anyhow!(failed.join("; ")))
    }
}

/// At most this many failed tests are run again; more failures than that are no flake.
const MAX_RERUNS: usize = 3;

/// `cargo test` of the workspace (the eBPF crate aside), one test at a time, with `filter`
/// (the test harness's arguments) after `--`.
fn cargo_test(extra: &[String], filter: &[&str]) -> Command {
    let mut cmd = Command::new("cargo");
    cmd.current_dir(workspace_root())
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
        .args(["--", "--test-threads=1"])
        .args(filter);
    cmd
}

/// Runs the test command with its stdout passed through line by line, and returns, beside its
/// result, the harness's report of each failed test (`---- name stdout ----` up to the next one),
/// each cut to [`REPORT_LINES`] lines.
fn run_noting_failures(cmd: &mut Command) -> (Result<()>, Outcome) {
    let mut child = match cmd.stdout(Stdio::piped()).spawn() {
        Ok(child) => child,
        Err(e) => return (Err(anyhow!("{cmd:?}: {e}")), Outcome::default()),
    };
    let mut reports = FailureReports::default();
    if let Some(out) = child.stdout.take() {
        let mut out = BufReader::new(out);
        let mut line = Vec::new();
        let stdout = std::io::stdout();
        loop {
            line.clear();
            match out.read_until(b'\n', &mut line) {
                Ok(0) | Err(_) => break,
                Ok(_) => {
                    // A closed terminal must not stop the tests; their result still counts.
                    let _ = stdout.lock().write_all(&line);
                    reports.line(&String::from_utf8_lossy(&line));
                }
            }
        }
    }
    let result = match child.wait() {
        Ok(status) if status.success() => Ok(()),
        Ok(status) => Err(anyhow!("{cmd:?} failed: {status}")),
        Err(e) => Err(anyhow!("{cmd:?}: {e}")),
    };
    (result, reports.done())
}

/// How many lines of one failed test's report are repeated at the end: its first and last.
const REPORT_LINES: usize = 40;

/// What a test run's output said: the tests that passed, and those that failed.
#[derive(Debug, Default)]
struct Outcome {
    passed: usize,
    failures: Vec<Failure>,
}

/// A failed test: its name, and libtest's report of it (cut).
#[derive(Debug)]
struct Failure {
    name: String,
    report: String,
}

/// The failure sections of libtest's output, as they stream past.
#[derive(Default)]
struct FailureReports {
    done: Vec<Failure>,
    current: Option<Vec<String>>,
    passed: usize,
}

impl FailureReports {
    fn line(&mut self, line: &str) {
        let line = line.trim_end_matches(['\n', '\r']);
        if line.starts_with("test ") && line.ends_with(" ... ok") {
            self.passed += 1;
        }
        let starts = line.starts_with("---- ") && line.ends_with(" ----");
        // libtest ends the reports with a second "failures:" line that lists their names.
        if starts || line == "failures:" || line.starts_with("test result:") {
            self.finish();
        }
        if starts {
            self.current = Some(vec![line.to_owned()]);
        } else if let Some(lines) = &mut self.current {
            lines.push(line.to_owned());
        }
    }

    fn finish(&mut self) {
        let Some(lines) = self.current.take() else {
            return;
        };
        let name = lines
            .first()
            .and_then(|l| l.strip_prefix("---- "))
            .and_then(|l| l.strip_suffix(" ----"))
            .map(|l| l.strip_suffix(" stdout").unwrap_or(l))
            .unwrap_or_default()
            .to_owned();
        let report = if lines.len() <= REPORT_LINES {
            lines.join("\n")
        } else {
            let head = &lines[..REPORT_LINES / 4];
            let tail = &lines[lines.len() - (REPORT_LINES - REPORT_LINES / 4)..];
            format!(
                "{}\n[… {} lines …]\n{}",
                head.join("\n"),
                lines.len() - REPORT_LINES,
                tail.join("\n")
            )
        };
        self.done.push(Failure { name, report });
    }

    fn done(mut self) -> Outcome {
        self.finish();
        Outcome {
            passed: self.passed,
            failures: self.done,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn outcome(text: &str) -> Outcome {
        let mut r = FailureReports::default();
        for line in text.lines() {
            r.line(line);
        }
        r.done()
    }

    fn failures(text: &str) -> Vec<Failure> {
        outcome(text).failures
    }

    fn reports(text: &str) -> Vec<String> {
        failures(text).into_iter().map(|f| f.report).collect()
    }

    #[test]
    fn each_failed_tests_report_is_kept_and_passing_output_is_not() {
        let out = "running 3 tests\ntest a ... ok\ntest b ... FAILED\ntest c ... FAILED\n\n\
                   failures:\n\n---- b stdout ----\nsome output\n\nthread 'b' panicked at x.rs:1:1:\n\
                   boom\n\n---- c stdout ----\nthread 'c' panicked\n\nfailures:\n    b\n    c\n\n\
                   test result: FAILED. 1 passed; 2 failed\n";
        let got = reports(out);
        assert_eq!(got.len(), 2, "{got:?}");
        assert!(got[0].starts_with("---- b stdout ----") && got[0].contains("boom"));
        assert!(!got[0].contains("---- c"), "{}", got[0]);
        assert!(got[1].contains("thread 'c' panicked") && !got[1].contains("    b"));
        assert!(reports("running 1 test\ntest a ... ok\ntest result: ok.\n").is_empty());
        let names: Vec<String> = failures(out).into_iter().map(|f| f.name).collect();
        assert_eq!(names, ["b", "c"]);
        assert_eq!(outcome(out).passed, 1);
        // A rerun whose filter matched nothing ran no test: it cannot vouch for one.
        assert_eq!(
            outcome("running 0 tests\n\ntest result: ok. 0 passed\n").passed,
            0
        );
    }

    #[test]
    fn a_long_report_keeps_its_start_and_its_panic() {
        let mut out = String::from("failures:\n---- long stdout ----\n");
        for i in 0..500 {
            out.push_str(&format!("line {i}\n"));
        }
        out.push_str("thread 'long' panicked: the reason\n\nfailures:\n    long\n");
        let got = reports(&out);
        assert_eq!(got.len(), 1);
        assert!(got[0].contains("line 0") && got[0].contains("the reason"));
        assert!(!got[0].contains("line 200\n"));
        assert!(got[0].lines().count() <= REPORT_LINES + 1, "{}", got[0]);
    }
}
