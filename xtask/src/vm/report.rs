//! What a run left: the test's `key=value` report, what failed, and the log lines that
//! explain it; one line per kernel.
use std::{
    fs,
    path::{Path, PathBuf},
};

/// One kernel's outcome.
pub(super) struct Row {
    pub(super) release: String,
    pub(super) place: &'static str,
    pub(super) report: Vec<(String, String)>,
    /// Why it failed, if it did: failed checks or the harness's own reason.
    pub(super) failures: Vec<String>,
    pub(super) timing: String,
    /// Logs whose tails explain a failure.
    pub(super) logs: Vec<PathBuf>,
    /// The VM never got as far as starting the test (emulated boot too slow on a loaded
    /// machine): said loudly, not counted as a failure of dnspath.
    pub(super) not_run: Option<String>,
}

impl Row {
    pub(super) fn get(&self, key: &str) -> &str {
        self.report
            .iter()
            .find(|(k, _)| k == key)
            .map_or("?", |(_, v)| v.as_str())
    }

    pub(super) fn line(&self) -> String {
        let verdict = if self.not_run.is_some() {
            "NOT RUN"
        } else if self.failures.is_empty() {
            "PASS"
        } else {
            "FAIL"
        };
        format!(
            "{:<24} {:<4} attach {:<7} hooks {}  {verdict}  ({})",
            self.release,
            self.place,
            self.get("tc_attach"),
            self.get("hooks"),
            self.timing
        )
    }
}

pub(super) fn read_report(path: &Path) -> Vec<(String, String)> {
    fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

/// Failed checks from a report, then `harness` (the harness's own reason: a timeout, a
/// crash), or `fallback` if the test failed without saying why.
pub(super) fn failures_of(
    report: &[(String, String)],
    rc: Option<i32>,
    harness: Option<String>,
    fallback: &str,
) -> Vec<String> {
    let mut f: Vec<String> = report
        .iter()
        .filter_map(|(k, v)| {
            let name = k.strip_prefix("check.")?;
            v.strip_prefix("FAIL ").map(|e| format!("{name}: {e}"))
        })
        .collect();
    let step = report
        .iter()
        .find(|(k, _)| k == "step")
        .map(|(_, v)| v.as_str())
        .filter(|s| *s != "done");
    if let Some(h) = harness {
        f.push(match step {
            Some(step) => format!("{h}, during: {step}"),
            None => h,
        });
    } else if f.is_empty() && rc != Some(0) {
        f.push(fallback.to_owned());
    }
    f
}

/// The test's `kernel_matrix: [  12.3 s] ...` progress lines, each cut to one screen line.
pub(super) fn timeline(path: &Path) -> String {
    fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split_once("kernel_matrix: [").map(|(_, rest)| rest))
        .map(|l| {
            let l: String = l.chars().take(150).collect();
            format!("  [{l}")
        })
        .collect::<Vec<_>>()
        .join("\n")
}

pub(super) fn tail(path: &Path, lines: usize) -> String {
    let text = fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}
