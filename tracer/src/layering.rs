//! The module graph points one way (docs/style.md, "Shape of the userspace pipeline"):
//! event → decode → correlate → detect (loops, races) → output (records, the sink trait)
//! → evidence (pcapng sinks) and pipeline → the modes, with shared pieces (time, host, names,
//! kallsyms, kube, conntrack status) below them all.
//! This test reads `tracer/src` and fails on a `crate::` path that points up, or at a module
//! not listed here. Test code is left out: a test may look at a record the way a sink shows it.
//!
//! Between files the imports point one way too: [`files_import_no_circles`] builds the graph
//! of which file's non-test code names which (a path resolved to the deepest module file on
//! it, and through a module's re-exports and glob imports to the file defining the item) and
//! fails on each circle (a strongly connected component of more than one file). A child's use
//! of what its parent module itself defines is no edge: the parent is the module, its files
//! the module's parts, and what the parent only re-exports is followed to its file.
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
    ("conntrack", &["event", "kernel", "memory", "time"]),
    ("source", &["event", "names", "time"]),
    // The stages.
    (
        "decode",
        &["conntrack", "event", "kallsyms", "names", "time"],
    ),
    ("correlate", &["conntrack", "decode", "event", "time"]),
    // How values read on a terminal (escaping, clocks, places): for the detections' own
    // lines and every text sink.
    ("show", &["decode", "time"]),
    // What the correlator's legs and transactions add up to: loops, races (the correlator
    // calls them through its `Detector` trait).
    (
        "detect",
        &["conntrack", "correlate", "decode", "event", "show", "time"],
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
            "show",
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
    // The one runner every mode drives: the pipeline, the enrich stage, the stop policy,
    // the sinks.
    (
        "runner",
        &["detect", "event", "names", "output", "pipeline"],
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
    // The live engine: the kernel's programs and conntrack as the runner's source.
    (
        "engine",
        &[
            "conntrack",
            "correlate",
            "decode",
            "detect",
            "event",
            "evidence",
            "kallsyms",
            "kernel",
            "memory",
            "names",
            "output",
            "pipeline",
            "runner",
            "source",
            "time",
        ],
    ),
    // The modes: a source and their sinks under the runner.
    (
        "analyze",
        &[
            "decode", "event", "kallsyms", "names", "output", "pipeline", "runner", "source",
            "time",
        ],
    ),
    ("trace", &["engine", "evidence", "output", "runner"]),
    // The live tables: the engine with one sink counting records into them.
    (
        "top",
        &[
            "correlate",
            "decode",
            "detect",
            "engine",
            "event",
            "output",
            "runner",
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
            "engine",
            "event",
            "findings",
            "host",
            "kube",
            "output",
            "runner",
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
            "engine",
            "event",
            "findings",
            "kernel",
            "kube",
            "names",
            "output",
            "pipeline",
            "runner",
            "source",
            "time",
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

/// The non-test files of `src` (a `#[cfg(test)]` module's file is test code) and the code of
/// each outside its `#[cfg(test)]` items.
fn non_test_files(src: &Path) -> Vec<(PathBuf, String)> {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    files.sort();
    let mut test_files = BTreeSet::new();
    let mut code_of = Vec::new();
    for path in files {
        let text = fs::read_to_string(&path).unwrap();
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
    // A test module's own modules (test_support/fixtures.rs) are test code too.
    code_of.retain(|(path, _)| {
        !path
            .ancestors()
            .any(|a| test_files.contains(a) || test_files.contains(&a.with_extension("rs")))
    });
    code_of
}

#[test]
fn module_graph_points_one_way() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let layers: BTreeMap<&str, &[&str]> = LAYERS.iter().copied().collect();
    let mut wrong = Vec::new();
    for (path, code) in non_test_files(&src) {
        let rel = path.strip_prefix(&src).unwrap();
        let top = rel.iter().next().unwrap().to_string_lossy();
        let top = top.trim_end_matches(".rs");
        // The binary names the library by its crate name; lib.rs declares the modules.
        if top == "main" || top == "lib" {
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

/// A module's path from the crate root: `decode/dns/rdata.rs` is `decode::dns::rdata`.
type ModPath = Vec<String>;

/// What one file's non-test code declares and names, for [`FileGraph`].
#[derive(Default)]
struct FileModule {
    /// Items defined at the file's top level (`fn`, `struct`, `const`, ..).
    items: BTreeSet<String>,
    /// Names brought in by `use` (the alias, or the path's last segment) and their paths.
    imports: BTreeMap<String, Vec<String>>,
    /// `use path::*`: the paths, without the `*`.
    globs: Vec<Vec<String>>,
    /// Every path with `::` in the code, `use` trees expanded.
    paths: Vec<Vec<String>>,
    /// Identifiers of types, constants and called functions, not after `.` or `::` (what a
    /// glob import may have brought in).
    idents: BTreeSet<String>,
}

/// The graph between the files of the crate: which module's file names which one's.
struct FileGraph {
    modules: BTreeMap<ModPath, FileModule>,
}

fn is_ident(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_'
}

/// `code` with the contents of string and char literals blanked out.
fn without_literals(code: &str) -> String {
    let s = code.as_bytes();
    let mut out = Vec::with_capacity(s.len());
    let mut i = 0;
    while i < s.len() {
        match s[i] {
            b'"' => {
                out.push(b'"');
                i += 1;
                while i < s.len() && s[i] != b'"' {
                    i += if s[i] == b'\\' { 2 } else { 1 };
                }
                out.push(b'"');
                i += 1;
            }
            b'\'' if s.get(i + 1) == Some(&b'\\') => {
                let end = (i + 2..s.len()).find(|&j| s[j] == b'\'').unwrap_or(s.len());
                out.extend_from_slice(b"' '");
                i = end + 1;
            }
            b'\'' if s.get(i + 2) == Some(&b'\'') => {
                out.extend_from_slice(b"' '");
                i += 3;
            }
            c => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Reads paths (`a::b::{c, d::*}`) out of code.
struct PathScan<'a> {
    s: &'a [u8],
    i: usize,
}

impl PathScan<'_> {
    fn skip_ws(&mut self) {
        while self.i < self.s.len() && self.s[self.i].is_ascii_whitespace() {
            self.i += 1;
        }
    }

    fn ident(&mut self) -> String {
        let start = self.i;
        while self.i < self.s.len() && is_ident(self.s[self.i]) {
            self.i += 1;
        }
        String::from_utf8_lossy(&self.s[start..self.i]).into_owned()
    }

    /// One tree after `prefix`, each leaf pushed as (path, name it is known by).
    fn tree(&mut self, mut prefix: Vec<String>, out: &mut Vec<(Vec<String>, String)>) {
        loop {
            self.skip_ws();
            match self.s.get(self.i) {
                Some(b'{') => {
                    self.i += 1;
                    loop {
                        self.skip_ws();
                        match self.s.get(self.i) {
                            None => return,
                            Some(b'}') => {
                                self.i += 1;
                                return;
                            }
                            Some(b',') => self.i += 1,
                            Some(_) => {
                                let before = self.i;
                                self.tree(prefix.clone(), out);
                                if self.i == before {
                                    self.i += 1;
                                }
                            }
                        }
                    }
                }
                Some(b'*') => {
                    self.i += 1;
                    prefix.push("*".into());
                    out.push((prefix, "*".into()));
                    return;
                }
                _ => {}
            }
            let name = self.ident();
            if name.is_empty() {
                return;
            }
            prefix.push(name);
            if self.s[self.i..].starts_with(b"::") && self.s.get(self.i + 2) != Some(&b'<') {
                self.i += 2;
                continue;
            }
            let end = self.i;
            self.skip_ws();
            let mut known_as = prefix.last().cloned().unwrap_or_default();
            if self.s[self.i..].starts_with(b"as ") {
                self.i += 3;
                self.skip_ws();
                known_as = self.ident();
            } else {
                self.i = end;
            }
            if known_as == "self" && prefix.len() > 1 {
                prefix.pop();
                known_as = prefix.last().cloned().unwrap_or_default();
            }
            out.push((prefix, known_as));
            return;
        }
    }
}

/// Item names defined at the top level of `code` (rustfmt puts them in column 0).
fn top_level_items(code: &str) -> BTreeSet<String> {
    const KINDS: &[&str] = &[
        "fn ",
        "struct ",
        "enum ",
        "trait ",
        "type ",
        "const ",
        "static ",
        "union ",
        "mod ",
        "macro_rules! ",
    ];
    let mut out = BTreeSet::new();
    for line in code.lines() {
        let mut rest = line;
        if let Some(r) = rest.strip_prefix("pub") {
            rest = r
                .strip_prefix('(')
                .map_or(r, |r| r.split_once(')').map_or(r, |x| x.1));
            rest = rest.trim_start();
        }
        for q in ["const ", "async ", "unsafe "] {
            if let Some(r) = rest.strip_prefix(q) {
                if KINDS.iter().any(|k| r.starts_with(k)) {
                    rest = r;
                }
            }
        }
        if let Some(kind) = KINDS.iter().find(|k| rest.starts_with(**k)) {
            let name: String = rest[kind.len()..]
                .bytes()
                .take_while(|&c| is_ident(c))
                .map(char::from)
                .collect();
            if !name.is_empty() {
                out.insert(name);
            }
        }
    }
    out
}

impl FileModule {
    fn parse(code: &str) -> FileModule {
        let code = without_literals(code);
        let s = code.as_bytes();
        let mut m = FileModule {
            items: top_level_items(&code),
            ..FileModule::default()
        };
        let mut i = 0;
        while i < s.len() {
            let after_path_sep = i >= 2 && &s[i - 2..i] == b"::";
            let starts = is_ident(s[i])
                && !s[i].is_ascii_digit()
                && (i == 0 || !(is_ident(s[i - 1]) || matches!(s[i - 1], b'$' | b'\'' | b'.')))
                && !after_path_sep;
            if !starts {
                i += 1;
                continue;
            }
            let mut scan = PathScan { s, i };
            let word = scan.ident();
            let is_use = word == "use" && s.get(scan.i).is_some_and(|c| c.is_ascii_whitespace());
            if !is_use {
                scan.i = i;
            }
            let mut leaves = Vec::new();
            scan.tree(Vec::new(), &mut leaves);
            for (path, known_as) in leaves {
                if is_use {
                    if path.last().is_some_and(|l| l == "*") {
                        m.globs.push(path[..path.len() - 1].to_vec());
                    } else {
                        m.imports.insert(known_as, path.clone());
                    }
                    m.paths.push(path);
                } else if path.len() > 1 {
                    m.paths.push(path);
                } else if path[0].starts_with(|c: char| c.is_ascii_uppercase())
                    || s[scan.i..].starts_with(b"(")
                    || s[scan.i..].starts_with(b"!")
                {
                    // A type, a constant, a call: not a variable or a field of that name.
                    if !code[..i].trim_end().ends_with("fn") {
                        m.idents.extend(path);
                    }
                }
            }
            i = scan.i.max(i + 1);
        }
        m
    }
}

/// Names being looked up in modules, to stop at import cycles (`use super::*` both ways).
type Visiting = BTreeSet<(ModPath, String)>;

impl FileGraph {
    /// The module file that `path`, written in `from`, names: the deepest module on the path,
    /// or where the item after it is defined when that module imports it from elsewhere.
    /// `None` for paths into other crates and for names that are not modules.
    fn resolve(&self, from: &[String], path: &[String], seen: &mut Visiting) -> Option<ModPath> {
        let first = path.first()?;
        let mut base: ModPath = from.to_vec();
        let rest = match first.as_str() {
            "crate" => {
                base.clear();
                &path[1..]
            }
            "self" => &path[1..],
            "super" => {
                let supers = path.iter().take_while(|s| *s == "super").count();
                base.truncate(base.len().checked_sub(supers)?);
                &path[supers..]
            }
            f => {
                let mut child = base.clone();
                child.push(f.to_string());
                if self.modules.contains_key(&child) {
                    path
                } else {
                    // A name `from` imported: `use crate::decode::dns; dns::decode(..)`.
                    let import = self.modules.get(from)?.imports.get(f)?;
                    if !seen.insert((from.to_vec(), f.to_string())) {
                        return None;
                    }
                    let mut full = import.clone();
                    full.extend_from_slice(&path[1..]);
                    return self.resolve(from, &full, seen);
                }
            }
        };
        let mut k = 0;
        while let Some(seg) = rest.get(k) {
            let mut child = base.clone();
            child.push(seg.clone());
            if !self.modules.contains_key(&child) {
                break;
            }
            base = child;
            k += 1;
        }
        match rest.get(k).map(String::as_str) {
            None | Some("*" | "self") => Some(base),
            Some(item) => Some(self.find_item(&base, item, seen).unwrap_or(base)),
        }
    }

    /// The module whose file defines `name` as seen from `module`, following its imports.
    fn find_item(&self, module: &[String], name: &str, seen: &mut Visiting) -> Option<ModPath> {
        let m = self.modules.get(module)?;
        if m.items.contains(name) {
            return Some(module.to_vec());
        }
        if !seen.insert((module.to_vec(), name.to_string())) {
            return None;
        }
        if let Some(import) = m.imports.get(name) {
            return self.resolve(module, import, seen);
        }
        m.globs.iter().find_map(|glob| {
            let g = self.resolve(module, glob, seen)?;
            self.find_item(&g, name, seen)
        })
    }

    /// For each module file, the module files its non-test code names.
    fn edges(&self) -> BTreeMap<ModPath, BTreeSet<ModPath>> {
        let mut edges = BTreeMap::new();
        for (from, m) in &self.modules {
            let mut to = BTreeSet::new();
            for path in &m.paths {
                to.extend(self.resolve(from, path, &mut Visiting::new()));
            }
            // A glob import names whatever of it the code uses.
            for glob in &m.globs {
                let Some(g) = self.resolve(from, glob, &mut Visiting::new()) else {
                    continue;
                };
                for ident in m.idents.iter().filter(|i| !m.items.contains(*i)) {
                    to.extend(self.find_item(&g, ident, &mut Visiting::new()));
                }
            }
            // A child uses what its parent module defines as a part of that module; the
            // parent's re-exports were followed above to the file that defines the item.
            to.retain(|t| !from.starts_with(t));
            edges.insert(from.clone(), to);
        }
        edges
    }
}

/// The strongly connected components of more than one node (Tarjan's algorithm), each sorted.
fn cycles<N: Ord + Clone>(edges: &BTreeMap<N, BTreeSet<N>>) -> Vec<Vec<N>> {
    struct Tarjan<'a, N> {
        edges: &'a BTreeMap<N, BTreeSet<N>>,
        index: BTreeMap<&'a N, (usize, usize)>,
        stack: Vec<&'a N>,
        on_stack: BTreeSet<&'a N>,
        out: Vec<Vec<N>>,
    }
    impl<'a, N: Ord + Clone> Tarjan<'a, N> {
        fn visit(&mut self, v: &'a N) {
            let n = self.index.len();
            self.index.insert(v, (n, n));
            self.stack.push(v);
            self.on_stack.insert(v);
            for w in self.edges.get(v).into_iter().flatten() {
                if !self.index.contains_key(w) {
                    self.visit(w);
                    let low = self.index[w].1;
                    let e = self.index.get_mut(v).unwrap();
                    e.1 = e.1.min(low);
                } else if self.on_stack.contains(w) {
                    let low = self.index[w].0;
                    let e = self.index.get_mut(v).unwrap();
                    e.1 = e.1.min(low);
                }
            }
            let (i, low) = self.index[v];
            if i == low {
                let mut scc = Vec::new();
                while let Some(w) = self.stack.pop() {
                    self.on_stack.remove(w);
                    scc.push(w.clone());
                    if w == v {
                        break;
                    }
                }
                if scc.len() > 1 {
                    scc.sort();
                    self.out.push(scc);
                }
            }
        }
    }
    let mut t = Tarjan {
        edges,
        index: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        out: Vec::new(),
    };
    for v in edges.keys() {
        if !t.index.contains_key(v) {
            t.visit(v);
        }
    }
    t.out.sort();
    t.out
}

/// The module graph of the crate's non-test files.
fn file_graph() -> FileGraph {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut modules = BTreeMap::new();
    for (path, code) in non_test_files(&src) {
        let rel = path.strip_prefix(&src).unwrap().with_extension("");
        let mut module: ModPath = rel
            .iter()
            .map(|s| s.to_string_lossy().into_owned())
            .collect();
        // The binary (main.rs, main/) is another crate; lib.rs is the root.
        if module[0] == "main" {
            continue;
        }
        if module.last().is_some_and(|l| l == "mod" || l == "lib") {
            module.pop();
        }
        modules.insert(module, FileModule::parse(&code));
    }
    FileGraph { modules }
}

/// The files' circles as text: each circle's modules, then the imports between them.
fn describe_cycles(edges: &BTreeMap<ModPath, BTreeSet<ModPath>>) -> Vec<String> {
    let mut out = Vec::new();
    for scc in cycles(edges) {
        let names: Vec<String> = scc.iter().map(|m| m.join("::")).collect();
        let mut text = names.join(" <-> ");
        for a in &scc {
            for b in edges[a].iter().filter(|b| scc.contains(b)) {
                text.push_str(&format!("\n    {} imports {}", a.join("::"), b.join("::")));
            }
        }
        out.push(text);
    }
    out
}

#[test]
fn files_import_no_circles() {
    let edges = file_graph().edges();
    let found = describe_cycles(&edges);
    assert!(
        found.is_empty(),
        "circles between files (src/layering.rs; move what both need below both):\n{}",
        found.join("\n")
    );
}

fn synthetic(
    edges: &[(&'static str, &'static str)],
) -> BTreeMap<&'static str, BTreeSet<&'static str>> {
    let mut out: BTreeMap<_, BTreeSet<_>> = BTreeMap::new();
    for &(a, b) in edges {
        out.entry(a).or_default().insert(b);
        out.entry(b).or_default();
    }
    out
}

#[test]
fn circles_are_found_and_a_one_way_graph_has_none() {
    // a -> b -> c -> a is a circle; d hangs off it, e -> e is no circle between files.
    let circle = synthetic(&[("a", "b"), ("b", "c"), ("c", "a"), ("c", "d"), ("e", "e")]);
    assert_eq!(cycles(&circle), [["a", "b", "c"]]);
    let one_way = synthetic(&[("a", "b"), ("b", "c"), ("a", "c"), ("c", "d")]);
    assert!(cycles(&one_way).is_empty());
}

/// Files as modules: `use` trees, `super::` and `crate::` paths, a parent's re-export and
/// a glob import each lead to the file that defines the item.
#[test]
fn imports_resolve_to_the_file_that_defines_the_item() {
    let graph = |files: &[(&str, &str)]| FileGraph {
        modules: files
            .iter()
            .map(|(m, code)| {
                let path = m.split("::").filter(|s| !s.is_empty()).map(String::from);
                (path.collect(), FileModule::parse(code))
            })
            .collect(),
    };
    let name = |m: &ModPath| m.join("::");
    let files = [
        ("", "mod a;\nmod z;\n"),
        (
            "a",
            "mod b;\nmod c;\nmod d;\npub use b::Reader;\nuse d::*;\npub struct Limits;\n",
        ),
        // `b` uses its parent's own type (allowed) and `c` through `super::`.
        (
            "a::b",
            "use super::{c::{self, helper}, Limits};\npub struct Reader;\nfn f() { c::g(); }\n",
        ),
        // `c` names `Reader` through the parent's re-export: the circle b <-> c.
        (
            "a::c",
            "use crate::a::Reader;\npub fn helper() {}\npub fn g() {}\n",
        ),
        ("a::d", "pub const MAX: usize = 1;\n"),
        (
            "z",
            "fn f() -> usize { crate::a::MAX + crate::a::d::MAX }\n",
        ),
    ];
    let edges = graph(&files).edges();
    let to = |m: &str| -> Vec<String> {
        let key: ModPath = m.split("::").map(String::from).collect();
        edges[&key].iter().map(name).collect()
    };
    assert_eq!(to("a"), ["a::b", "a::d"]);
    assert_eq!(to("a::b"), ["a::c"]);
    assert_eq!(to("a::c"), ["a::b"]);
    assert_eq!(to("z"), ["a::d"]);
    let found: Vec<Vec<String>> = cycles(&edges)
        .iter()
        .map(|c| c.iter().map(name).collect())
        .collect();
    assert_eq!(found, [["a::b", "a::c"]]);
    // Without `c`'s import of the re-exported `Reader`, no circle.
    let mut files = files;
    files[3].1 = "pub fn helper() {}\npub fn g() {}\n";
    assert!(cycles(&graph(&files).edges()).is_empty());
}
