//! docs/layout.md's "Layout" lists the tree, one line a file or folder: this test fails on a
//! listed path that does not exist, and on a file or folder missing from a folder whose files
//! are listed (but `mod.rs` and unit tests: `tests.rs`, `*_tests.rs`), so the list cannot drift.
use std::{
    collections::BTreeSet,
    fs,
    path::{Path, PathBuf},
};

const LAYOUT: &str = include_str!("../../docs/layout.md");

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default()
}

/// The paths the section's code block lists (folders end in `/`): each line a name, indented
/// two spaces a level under its folder, then what it is.
fn listed() -> Vec<String> {
    let section = LAYOUT
        .split("\n## Layout\n")
        .nth(1)
        .and_then(|s| s.split("\n## ").next())
        .expect("docs/layout.md has a \"## Layout\" section");
    let block = section
        .split("```")
        .nth(1)
        .expect("the Layout section has a code block");
    let mut folders: Vec<&str> = Vec::new();
    let mut paths = Vec::new();
    for line in block.lines().skip(1).filter(|l| !l.trim().is_empty()) {
        let name = line.split_whitespace().next().unwrap_or_default();
        let indent = line.len() - line.trim_start().len();
        assert!(
            indent % 2 == 0 && indent / 2 <= folders.len(),
            "Layout: {line:?} is not two spaces under a listed folder"
        );
        folders.truncate(indent / 2);
        paths.push(format!("{}{name}", folders.concat()));
        if name.ends_with('/') {
            folders.push(name);
        }
    }
    paths
}

/// What a listing of `dir` must name: its folders (`name/`, but hidden ones and `target/`)
/// and its Rust files (but `mod.rs` and unit tests).
fn must_list(dir: &Path) -> Vec<String> {
    let mut names = Vec::new();
    for entry in fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let entry = entry.unwrap();
        let name = entry.file_name().to_string_lossy().into_owned();
        if entry.file_type().unwrap().is_dir() {
            if !name.starts_with('.') && name != "target" {
                names.push(format!("{name}/"));
            }
        } else if name.ends_with(".rs")
            && name != "mod.rs"
            && name != "tests.rs"
            && !name.ends_with("_tests.rs")
        {
            names.push(name);
        }
    }
    names.sort();
    names
}

#[test]
fn layout_matches_the_tree() {
    let root = root();
    let listed = listed();
    let set: BTreeSet<&str> = listed.iter().map(String::as_str).collect();
    let absent: Vec<&String> = listed
        .iter()
        .filter(|p| {
            let at = root.join(p);
            if p.ends_with('/') {
                !at.is_dir()
            } else {
                !at.is_file()
            }
        })
        .collect();
    assert!(
        absent.is_empty(),
        "docs/layout.md lists what is not there: {absent:?}"
    );
    // The folders whose files are listed: the top, and every folder with a line under it.
    let mut open: BTreeSet<&str> = BTreeSet::from([""]);
    for p in &listed {
        if let Some(i) = p.trim_end_matches('/').rfind('/') {
            open.insert(&p[..=i]);
        }
    }
    let mut missing = Vec::new();
    for dir in &open {
        for name in must_list(&root.join(dir)) {
            let path = format!("{dir}{name}");
            // A module's folder goes with its file: `decoder.rs` covers `decoder/`.
            let covered = set.contains(path.as_str())
                || path
                    .strip_suffix('/')
                    .is_some_and(|m| set.contains(format!("{m}.rs").as_str()));
            if !covered {
                missing.push(path);
            }
        }
    }
    assert!(
        missing.is_empty(),
        "missing from docs/layout.md: {missing:?}"
    );
    // The test sees what it is about.
    assert!(set.contains("tracer/src/correlate/index.rs"));
    assert!(open.contains("tracer/src/output/"));
}
