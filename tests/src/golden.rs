//! Golden outputs: the captures checked in under `tests/golden/` and, next to each, what
//! `dnspath analyze` prints of it in four forms. The one place that says how such a run is
//! made and what of its output is normalised, for the test (`tests/tests/golden.rs`) and for
//! `cargo xtask bless` alike.
//!
//! A run is `dnspath analyze FILE [ARGS] [the output's flags]` with the capture's folder as
//! working directory and `FILE` its bare name (so no absolute path reaches the output),
//! `TZ=UTC`, `LC_ALL=C`, no `RUST_LOG`, stdin null. `ARGS` are the capture's own flags, one a
//! line in `NAME.args` next to it (e.g. `--port 5353`). What is compared is its stdout, after
//! [`normalise`]; the run must exit 0.
use std::{
    fs,
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use crate::LabError;

/// The four outputs of each capture: the expected file's suffix (`NAME.SUFFIX.out`) and the
/// flags that make it.
pub const OUTPUTS: [(&str, &[&str]); 4] = [
    ("text", &[]),
    ("json", &["-o", "json"]),
    ("packets", &["--view", "packets"]),
    ("failures", &["--failures"]),
];

/// `tests/golden/` of this workspace.
pub fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("golden")
}

/// The captures in `dir`: `*.pcap` and `*.pcapng`, sorted by name.
pub fn captures(dir: &Path) -> Result<Vec<PathBuf>, LabError> {
    let io = |source| LabError::Io {
        what: format!("reading {}", dir.display()),
        source,
    };
    let mut v = Vec::new();
    for entry in fs::read_dir(dir).map_err(io)? {
        let path = entry.map_err(io)?.path();
        if matches!(
            path.extension().and_then(|e| e.to_str()),
            Some("pcap" | "pcapng")
        ) {
            v.push(path);
        }
    }
    v.sort();
    Ok(v)
}

/// The capture's name without its extension: `lab` for `lab.pcapng`.
pub fn stem(capture: &Path) -> String {
    capture
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// Where the expected `output` of `capture` is kept: `NAME.OUTPUT.out` next to it.
pub fn expected(capture: &Path, output: &str) -> PathBuf {
    capture.with_file_name(format!("{}.{output}.out", stem(capture)))
}

/// The capture's own flags (`NAME.args`, one a line; none without the file).
pub fn capture_args(capture: &Path) -> Result<Vec<String>, LabError> {
    let path = capture.with_file_name(format!("{}.args", stem(capture)));
    match fs::read_to_string(&path) {
        Ok(s) => Ok(s
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .map(str::to_string)
            .collect()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(source) => Err(LabError::Io {
            what: format!("reading {}", path.display()),
            source,
        }),
    }
}

/// Runs `bin analyze` on `capture` for the output `flags`, and returns its normalised stdout.
pub fn run(bin: &Path, capture: &Path, flags: &[&str]) -> Result<Vec<u8>, LabError> {
    let folder = capture.parent().unwrap_or(Path::new("."));
    let name = capture.file_name().unwrap_or_default();
    let mut cmd = Command::new(bin);
    cmd.current_dir(folder)
        .arg("analyze")
        .arg(name)
        .args(capture_args(capture)?)
        .args(flags)
        .env("TZ", "UTC")
        .env("LC_ALL", "C")
        .env_remove("RUST_LOG")
        .stdin(Stdio::null());
    let what = format!(
        "{} analyze {} {}",
        bin.display(),
        name.to_string_lossy(),
        flags.join(" ")
    );
    let out = cmd.output().map_err(|source| LabError::Spawn {
        cmd: what.clone(),
        source,
    })?;
    if !out.status.success() {
        return Err(LabError::Command {
            cmd: what,
            status: out.status.to_string(),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    Ok(normalise(&out.stdout, folder))
}

/// What is not the same from run to run or machine to machine, made so: the capture's folder
/// (an absolute path, should one ever be printed) becomes `<golden>`. Everything else the
/// output says — capture times, counts, names, the file's name — comes from the capture alone
/// (`analyze` prints no version, no wall-clock of its own run, no host name); if that changes,
/// this is the place to add a rule.
pub fn normalise(stdout: &[u8], folder: &Path) -> Vec<u8> {
    let mut out = stdout.to_vec();
    let abs = fs::canonicalize(folder).unwrap_or_else(|_| folder.to_path_buf());
    for path in [abs.as_path(), folder] {
        let needle = path.as_os_str().as_encoded_bytes();
        if needle.len() > 1 {
            out = replace(&out, needle, b"<golden>");
        }
    }
    out
}

fn replace(haystack: &[u8], needle: &[u8], with: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(haystack.len());
    let mut i = 0;
    while i < haystack.len() {
        if haystack[i..].starts_with(needle) {
            out.extend_from_slice(with);
            i += needle.len();
        } else {
            out.push(haystack[i]);
            i += 1;
        }
    }
    out
}

/// A unified-style diff of the first lines where `actual` differs from `expected`, or `None`
/// when they are equal: three lines of context, the differing lines of each side (up to
/// `MAX`; the differing region ends where the two files' common tail begins), three more.
pub fn first_difference(expected: &[u8], actual: &[u8], name: &str) -> Option<String> {
    const MAX: usize = 12;
    if expected == actual {
        return None;
    }
    let e: Vec<&[u8]> = expected.split(|&b| b == b'\n').collect();
    let a: Vec<&[u8]> = actual.split(|&b| b == b'\n').collect();
    let first = e.iter().zip(&a).take_while(|(x, y)| x == y).count();
    let tail = e[first..]
        .iter()
        .rev()
        .zip(a[first..].iter().rev())
        .take_while(|(x, y)| x == y)
        .count();
    let (e_end, a_end) = (e.len() - tail, a.len() - tail);
    let from = first.saturating_sub(3);
    let line = |l: &[u8]| String::from_utf8_lossy(l).into_owned();
    let mut s = format!(
        "--- {name} (expected, {} lines)\n+++ {name} (actual, {} lines)\n@@ -{},{} +{},{} @@\n",
        e.len(),
        a.len(),
        from + 1,
        e_end - from,
        from + 1,
        a_end - from
    );
    for l in &e[from..first] {
        s.push_str(&format!(" {}\n", line(l)));
    }
    for (sign, side, end) in [('-', &e, e_end), ('+', &a, a_end)] {
        for l in &side[first..end.min(first + MAX)] {
            s.push_str(&format!("{sign}{}\n", line(l)));
        }
        if end > first + MAX {
            s.push_str(&format!("{sign}… {} more lines\n", end - first - MAX));
        }
    }
    for l in e.iter().skip(e_end).take(3) {
        s.push_str(&format!(" {}\n", line(l)));
    }
    Some(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_difference_is_shown_with_context() {
        let d = first_difference(b"a\nb\nc\nd\ne\n", b"a\nb\nc\nX\ne\n", "f").unwrap();
        assert!(
            d.ends_with("@@ -1,4 +1,4 @@\n a\n b\n c\n-d\n+X\n e\n \n"),
            "{d}"
        );
        assert_eq!(first_difference(b"same", b"same", "f"), None);
    }

    #[test]
    fn the_folder_is_normalised_away() {
        let f = Path::new("/x/golden");
        assert_eq!(
            normalise(b"read /x/golden/a.pcap ok", f),
            b"read <golden>/a.pcap ok".to_vec()
        );
    }
}
