//! The module graph points one way (docs: STYLE.md, "Shape of the userspace pipeline"):
//! event → decode → correlate → detect (loops, races) → output (records, the sink trait)
//! → evidence (pcapng sinks) and pipeline → the modes, with shared pieces (time, host, names,
//! kallsyms, kube, conntrack status) below them all.
//! This test reads `tracer/src` and fails on a `crate::` path that points up, or at a module
//! not listed here. Test code is left out: a test may look at a record the way a sink shows it.
use std::{
    collections::{BTreeMap, BTreeSet},
    fs,
    path::{Path, PathBuf},
};

/// Each top-level module and the modules its non-test code may name.
const LAYERS: &[(&str, &[&str])] = &[
    ("time", &[]),
    ("memory", &[]),
    ("host", &[]),
    ("ebpf", &[]),
    ("event", &[]),
    ("kallsyms", &[]),
    ("kube", &["host"]),
    ("names", &["kube"]),
    // Sources: the kernel programs, capture files, the conntrack socket. `conntrack` enters
    // namespaces through kernel/netns.rs.
    (
        "kernel",
        &[
            "ebpf", "event", "host", "kallsyms", "kube", "memory", "names", "time",
        ],
    ),
    ("conntrack", &["event", "kernel", "time"]),
    ("source", &["event", "names", "time"]),
    // The stages.
    (
        "decode",
        &["conntrack", "event", "kallsyms", "names", "time"],
    ),
    ("correlate", &["conntrack", "decode", "event", "time"]),
    // What the correlator's legs and transactions add up to: loops, races (the correlator
    // calls them through its `Detector` trait).
    (
        "detect",
        &["conntrack", "correlate", "decode", "event", "time"],
    ),
    (
        "output",
        &[
            "conntrack",
            "correlate",
            "decode",
            "detect",
            "event",
            "kube",
            "names",
            "source",
            "time",
        ],
    ),
    // Packets as evidence: pcapng files annotated with the records.
    (
        "evidence",
        &[
            "correlate",
            "decode",
            "detect",
            "event",
            "kube",
            "names",
            "output",
            "source",
            "time",
        ],
    ),
    (
        "pipeline",
        &["correlate", "decode", "detect", "event", "output", "time"],
    ),
    // The fuzz targets' harness: the pipeline with small tables, and its checks.
    (
        "fuzzing",
        &[
            "correlate",
            "decode",
            "event",
            "kallsyms",
            "names",
            "output",
            "pipeline",
            "time",
        ],
    ),
    // The modes: what drives the pipeline from a source into sinks.
    (
        "analyze",
        &[
            "decode", "event", "kallsyms", "names", "output", "pipeline", "source", "time",
        ],
    ),
    (
        "trace",
        &[
            "conntrack",
            "correlate",
            "decode",
            "detect",
            "event",
            "evidence",
            "kallsyms",
            "kernel",
            "names",
            "output",
            "pipeline",
            "source",
            "time",
        ],
    ),
    // Findings: what the records amount to (doctor's traffic checks, the agent's findings
    // windows) and the per-server tally the agent's event lines share.
    ("findings", &["correlate", "decode", "detect", "output"]),
    // The node's triage: the findings of its files and counters, and of a watch.
    (
        "doctor",
        &[
            "conntrack",
            "correlate",
            "decode",
            "detect",
            "event",
            "findings",
            "host",
            "kube",
            "output",
            "trace",
        ],
    ),
    // The DaemonSet mode: the traffic's findings over windows, as events and metrics.
    (
        "agent",
        &[
            "conntrack",
            "correlate",
            "decode",
            "detect",
            "event",
            "findings",
            "kernel",
            "kube",
            "names",
            "output",
            "pipeline",
            "source",
            "time",
            "trace",
        ],
    ),
];

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// Marks a test module given by `#[path]` in what [`non_test_code`] returns.
const PATH_ATTR: &str = "#[path] ";

/// The lines of `text` outside `#[cfg(test)]` items, without comments, and the names of
/// the modules declared there as `#[cfg(test)] mod name;` (files that are test code).
fn non_test_code(text: &str) -> (String, Vec<String>) {
    let mut code = String::new();
    let mut test_mods = Vec::new();
    let mut lines = text.lines();
    while let Some(line) = lines.next() {
        if line.trim() != "#[cfg(test)]" {
            let line = line.split("//").next().unwrap_or_default();
            code.push_str(line);
            code.push('\n');
            continue;
        }
        let Some(mut item) = lines.next() else { break };
        // `#[cfg(test)] #[path = "x_tests.rs"] mod tests;`: the file named is test code.
        if let Some(file) = item
            .trim()
            .strip_prefix("#[path = \"")
            .and_then(|s| s.strip_suffix(".rs\"]"))
        {
            test_mods.push(format!("{PATH_ATTR}{file}"));
            let Some(next) = lines.next() else { break };
            item = next;
            if item.trim().ends_with(';') {
                continue;
            }
        }
        let trimmed = item.trim();
        if let Some(name) = trimmed
            .strip_suffix(';')
            .and_then(|s| s.rsplit_once("mod "))
            .map(|(_, name)| name)
        {
            test_mods.push(name.to_string());
        } else if trimmed.ends_with('{') {
            // Skip to the closing brace at the item's own indentation.
            let indent = &item[..item.len() - item.trim_start().len()];
            let close = format!("{indent}}}");
            for l in lines.by_ref() {
                if l == close {
                    break;
                }
            }
        }
    }
    (code, test_mods)
}

/// The top-level modules named by `crate::` paths in `code`.
fn crate_imports(code: &str) -> BTreeSet<String> {
    let ident = |s: &str| -> String {
        s.chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect()
    };
    let mut out = BTreeSet::new();
    for (i, _) in code.match_indices("crate::") {
        if i > 0 && code[..i].ends_with(|c: char| c.is_alphanumeric() || c == '_' || c == '$') {
            continue;
        }
        let rest = code[i + "crate::".len()..].trim_start();
        if let Some(group) = rest.strip_prefix('{') {
            // `crate::{a::x, b::{y, z}}`: the first name of each top-level entry.
            let mut depth = 0;
            let mut entry_start = true;
            for (j, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => entry_start = true,
                    c if entry_start && !c.is_whitespace() => {
                        entry_start = false;
                        out.insert(ident(&group[j..]));
                    }
                    _ => {}
                }
            }
        } else {
            out.insert(ident(rest));
        }
    }
    out.remove("self");
    out
}

#[test]
fn module_graph_points_one_way() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    files.sort();
    let layers: BTreeMap<&str, &[&str]> = LAYERS.iter().copied().collect();

    let mut test_files = BTreeSet::new();
    let mut code_of = Vec::new();
    for path in &files {
        let text = fs::read_to_string(path).unwrap();
        let (code, test_mods) = non_test_code(&text);
        let dir = if path
            .file_name()
            .is_some_and(|n| n == "mod.rs" || n == "lib.rs")
        {
            path.parent().unwrap().to_path_buf()
        } else {
            path.with_extension("")
        };
        for m in test_mods {
            // `#[path]` is relative to the directory of the file that has it.
            if let Some(file) = m.strip_prefix(PATH_ATTR) {
                if let Some(parent) = path.parent() {
                    test_files.insert(parent.join(format!("{file}.rs")));
                }
                continue;
            }
            test_files.insert(dir.join(format!("{m}.rs")));
            test_files.insert(dir.join(&m).join("mod.rs"));
        }
        code_of.push((path, code));
    }

    let mut wrong = Vec::new();
    for (path, code) in code_of {
        let rel = path.strip_prefix(&src).unwrap();
        let top = rel.iter().next().unwrap().to_string_lossy();
        let top = top.trim_end_matches(".rs");
        // A test module's own modules (test_support/fixtures.rs) are test code too.
        let in_test_module = path
            .ancestors()
            .any(|a| test_files.contains(&a.with_extension("rs")));
        // The binary names the library by its crate name; lib.rs declares the modules.
        if test_files.contains(path) || in_test_module || top == "main" || top == "lib" {
            continue;
        }
        let Some(allowed) = layers.get(top) else {
            wrong.push(format!(
                "{}: module `{top}` is not in LAYERS",
                rel.display()
            ));
            continue;
        };
        for import in crate_imports(&code) {
            if import != top && !allowed.contains(&import.as_str()) {
                wrong.push(format!(
                    "{}: `{top}` imports `crate::{import}`",
                    rel.display()
                ));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "imports against the layering (src/layering.rs):\n{}",
        wrong.join("\n")
    );
}

#[test]
fn upward_imports_are_found() {
    let code =
        "use crate::{\n    decode::x,\n    output::{a, b},\n};\nfn f() { crate::time::now(); }\n";
    let found: Vec<_> = crate_imports(code).into_iter().collect();
    assert_eq!(found, ["decode", "output", "time"]);
    let (code, mods) = non_test_code(
        "use crate::a;\n#[cfg(test)]\nmod tests {\n    use crate::b;\n}\n#[cfg(test)]\nmod more;\n// crate::c\n#[cfg(test)]\n#[path = \"x_tests.rs\"]\nmod x;\n",
    );
    assert_eq!(crate_imports(&code).into_iter().collect::<Vec<_>>(), ["a"]);
    assert_eq!(mods, ["more", "#[path] x_tests"]);
}
