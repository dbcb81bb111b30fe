//! The crate's import graph, read from its own source: no module imports
//! itself through others (no cycle), and the top-level modules keep the
//! layers `lib.rs` documents.
//!
//! A module is a file: `lib.rs` the crate root, `a.rs` or `a/mod.rs` the
//! module `a`, `a/b.rs` its child `a::b` (`main.rs`, the binary, is a crate
//! of its own and is left out). An inline `mod tests { … }` belongs to its
//! file: its imports are the file's, with its `super` meaning the file.
//!
//! A file imports a module when a `use` item or a path in its code (after
//! comments and string literals are removed) starting with `crate`,
//! `super`, `self`, a child module or a name its `use` items bind resolves
//! to an item defined in that module's file. Resolution follows names:
//! - walking a path through a module (`crate::proxy::…`) does not import
//!   that module, only naming an item defined in it does;
//! - a name a module binds with `use` (re-exported or not) resolves to
//!   where that `use` points, so `super::Reason` in `proxy/respond.rs`,
//!   with `proxy/mod.rs` re-exporting `pipeline::Reason`, imports
//!   `proxy::pipeline`, not `proxy`: a parent's re-exports are a facade,
//!   not a dependency on the parent (were they, every child named by the
//!   facade that also used it would form a cycle with its parent);
//! - `use a::b` of a module binds the name only: the paths that then use
//!   `b::item` import the module they reach;
//! - a glob (`use super::*`, in tests) imports the module it names, and
//!   the names it brings are looked up there;
//! - declaring a child (`mod b;`) is not an import.
//!
//! The top-level check maps every module to its top-level module
//! (`proxy::forward` to `proxy`) and requires that each top-level import
//! goes down the layout list of `lib.rs`'s doc (`//! - [`name`]: …`,
//! callers first), which must name every top-level module, and that the
//! modules that doc calls leaves import no other top-level module.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
};

/// One token of Rust source, as far as imports need it.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Tok {
    Ident(String),
    /// `::`
    Path,
    Punct(char),
}

/// The tokens of `src`, each with its line, without comments, string,
/// character and number literals, and lifetimes.
fn lex(src: &str) -> Vec<(Tok, usize)> {
    let s: Vec<char> = src.chars().collect();
    let mut out = Vec::new();
    let (mut i, mut line) = (0, 1);
    let is_ident = |c: char| c.is_alphanumeric() || c == '_';
    // Skips a quoted literal from its opening quote at `i`; `raw` is the
    // number of `#` of a raw string (`None`: escapes apply).
    let skip_quoted = |mut i: usize, raw: Option<usize>, line: &mut usize| -> usize {
        i += 1;
        while i < s.len() {
            match (s[i], raw) {
                ('\\', None) => i += 1,
                ('"', None) => return i + 1,
                ('"', Some(n)) if s[i + 1..].iter().take(n).filter(|&&c| c == '#').count() == n => {
                    return i + 1 + n;
                }
                ('\n', _) => *line += 1,
                _ => {}
            }
            i += 1;
        }
        i
    };
    // Skips a character literal from its quote at `i` ('x', '\n',
    // '\u{1F600}'); `None`: a lifetime or a label.
    let skip_char = |i: usize| -> Option<usize> {
        let mut k = i + 1;
        if s.get(k) == Some(&'\\') {
            k += 2;
            while k < s.len() && s[k] != '\'' {
                k += 1;
            }
            Some(k + 1)
        } else {
            (s.get(k + 1) == Some(&'\'')).then_some(k + 2)
        }
    };
    while i < s.len() {
        let c = s[i];
        match c {
            '\n' => {
                line += 1;
                i += 1;
            }
            c if c.is_whitespace() => i += 1,
            '/' if s.get(i + 1) == Some(&'/') => {
                while i < s.len() && s[i] != '\n' {
                    i += 1;
                }
            }
            '/' if s.get(i + 1) == Some(&'*') => {
                let mut depth = 0;
                while i < s.len() {
                    if s[i] == '/' && s.get(i + 1) == Some(&'*') {
                        depth += 1;
                        i += 2;
                    } else if s[i] == '*' && s.get(i + 1) == Some(&'/') {
                        depth -= 1;
                        i += 2;
                        if depth == 0 {
                            break;
                        }
                    } else {
                        if s[i] == '\n' {
                            line += 1;
                        }
                        i += 1;
                    }
                }
            }
            '"' => i = skip_quoted(i, None, &mut line),
            '\'' => {
                // A character literal ('x', '\n', '\u{1F600}'), else a
                // lifetime or a label: its name is skipped with it.
                i = skip_char(i).unwrap_or_else(|| {
                    let mut i = i + 1;
                    while i < s.len() && is_ident(s[i]) {
                        i += 1;
                    }
                    i
                });
            }
            ':' if s.get(i + 1) == Some(&':') => {
                out.push((Tok::Path, line));
                i += 2;
            }
            c if c.is_ascii_digit() => {
                while i < s.len()
                    && (is_ident(s[i]) || (s[i] == '.' && s.get(i + 1).is_some_and(char::is_ascii_digit)))
                {
                    i += 1;
                }
            }
            c if is_ident(c) => {
                let start = i;
                while i < s.len() && is_ident(s[i]) {
                    i += 1;
                }
                let word: String = s[start..i].iter().collect();
                // String prefixes: b"…", r"…", r#"…"#, br"…", c"…".
                let hashes = s[i..].iter().take_while(|&&c| c == '#').count();
                match (word.as_str(), s.get(i + hashes)) {
                    ("r" | "br" | "cr", Some('"')) => i = skip_quoted(i + hashes, Some(hashes), &mut line),
                    ("b" | "c", Some('"')) if hashes == 0 => i = skip_quoted(i, None, &mut line),
                    ("b", Some('\'')) if hashes == 0 && skip_char(i).is_some() => {
                        i = skip_char(i).unwrap_or(i);
                    }
                    // A raw identifier.
                    ("r", _) if hashes == 1 => {
                        let start = i + 1;
                        i = start;
                        while i < s.len() && is_ident(s[i]) {
                            i += 1;
                        }
                        out.push((Tok::Ident(s[start..i].iter().collect()), line));
                    }
                    _ => out.push((Tok::Ident(word), line)),
                }
            }
            c => {
                out.push((Tok::Punct(c), line));
                i += 1;
            }
        }
    }
    out
}

/// What a `use` item or a path in code names, as written in its file.
#[derive(Clone, Debug)]
struct Reference {
    /// The segments (`super`, `crate`, names), without a trailing `*`.
    segs: Vec<String>,
    /// How many inline modules (`mod tests { … }`) it sits in.
    inline: usize,
    line: usize,
    kind: RefKind,
    /// The name a `use` binds (`_` for `as _`).
    binding: Option<String>,
    /// A `pub` (or `pub(…)`) `use`: a re-export.
    reexport: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum RefKind {
    /// A `use` binding a name (to the module or item the path reaches).
    Use,
    /// A glob `use path::*`.
    Glob,
    /// A path in code.
    Code,
}

/// One source file as a module.
#[derive(Debug)]
struct Module {
    /// `proxy::forward`; the root is empty.
    path: Vec<String>,
    /// Relative to `src/`.
    file: PathBuf,
    refs: Vec<Reference>,
    /// Names the file's own `use` items bind (not those of its inline
    /// modules), to the index in `refs` of the `use`.
    binds: BTreeMap<String, usize>,
    /// Modules its own globs name (indices in `refs`).
    globs: Vec<usize>,
}

/// Parses a use tree at `toks[*i]` into `(binding, segments, line)`
/// leaves (`binding`: `None` for a glob, `_` for `as _`).
fn use_tree(
    toks: &[(Tok, usize)],
    i: &mut usize,
    prefix: &[String],
    out: &mut Vec<(Option<String>, Vec<String>, usize)>,
) {
    let mut segs = prefix.to_vec();
    if toks[*i].0 == Tok::Path {
        // `use ::std::…`: an extern crate.
        segs.push("::".to_owned());
        *i += 1;
    }
    loop {
        match &toks[*i].0 {
            Tok::Ident(name) => {
                segs.push(name.clone());
                *i += 1;
            }
            Tok::Punct('*') => {
                out.push((None, segs, toks[*i].1));
                *i += 1;
                return;
            }
            Tok::Punct('{') => {
                *i += 1;
                while toks[*i].0 != Tok::Punct('}') {
                    use_tree(toks, i, &segs, out);
                    if toks[*i].0 == Tok::Punct(',') {
                        *i += 1;
                    }
                }
                *i += 1;
                return;
            }
            other => panic!("unexpected {other:?} in a use tree at line {}", toks[*i].1),
        }
        if toks[*i].0 == Tok::Path {
            *i += 1;
            continue;
        }
        break;
    }
    // `self` in a list names the module the list is in.
    if segs.last().is_some_and(|s| s == "self") {
        segs.pop();
    }
    let mut binding = segs.last().cloned();
    if toks[*i].0 == Tok::Ident("as".to_owned()) {
        binding = match &toks[*i + 1].0 {
            Tok::Ident(alias) if alias != "_" => Some(alias.clone()),
            _ => None,
        };
        *i += 2;
    }
    // A binding without one (`as _`) still imports what it names.
    out.push((Some(binding.unwrap_or_else(|| "_".to_owned())), segs, toks[*i - 1].1));
}

/// Whether the `use` at `toks[i]` is `pub` or `pub(…)`.
fn is_pub(toks: &[(Tok, usize)], i: usize) -> bool {
    let mut k = i;
    if k > 0 && toks[k - 1].0 == Tok::Punct(')') {
        while k > 0 && toks[k - 1].0 != Tok::Punct('(') {
            k -= 1;
        }
        k = k.saturating_sub(1);
    }
    k > 0 && toks[k - 1].0 == Tok::Ident("pub".to_owned())
}

/// The references of one file's tokens.
fn references(toks: &[(Tok, usize)]) -> Vec<Reference> {
    let mut refs = Vec::new();
    // The brace depth at which each enclosing inline module opened.
    let mut inline: Vec<usize> = Vec::new();
    let mut depth = 0;
    let mut i = 0;
    let ident = |i: usize| match toks.get(i) {
        Some((Tok::Ident(s), _)) => Some(s.as_str()),
        _ => None,
    };
    while i < toks.len() {
        match &toks[i].0 {
            Tok::Punct('{') => depth += 1,
            Tok::Punct('}') => {
                depth -= 1;
                if inline.last() == Some(&depth) {
                    inline.pop();
                }
            }
            Tok::Ident(w) if w == "mod" && toks.get(i + 2).is_some_and(|t| t.0 == Tok::Punct('{')) => {
                inline.push(depth);
            }
            // (Not `use<'a>`, a precise capture in a bound.)
            Tok::Ident(w)
                if w == "use"
                    && i.checked_sub(1).is_none_or(|p| toks[p].0 != Tok::Path)
                    && toks.get(i + 1).is_some_and(|t| t.0 != Tok::Punct('<')) =>
            {
                let reexport = is_pub(toks, i);
                i += 1;
                let mut leaves = Vec::new();
                use_tree(toks, &mut i, &[], &mut leaves);
                for (binding, segs, line) in leaves {
                    let kind = if binding.is_some() { RefKind::Use } else { RefKind::Glob };
                    refs.push(Reference { segs, inline: inline.len(), line, kind, binding, reexport });
                }
                continue;
            }
            Tok::Ident(w)
                if toks.get(i + 1).is_some_and(|t| t.0 == Tok::Path)
                    && i.checked_sub(1)
                        .is_none_or(|p| toks[p].0 != Tok::Path && toks[p].0 != Tok::Punct('$')) =>
            {
                let line = toks[i].1;
                let mut segs = vec![w.clone()];
                let mut j = i + 1;
                while toks.get(j).is_some_and(|t| t.0 == Tok::Path)
                    && let Some(next) = ident(j + 1)
                {
                    segs.push(next.to_owned());
                    j += 2;
                }
                refs.push(Reference {
                    segs,
                    inline: inline.len(),
                    line,
                    kind: RefKind::Code,
                    binding: None,
                    reexport: false,
                });
                i = j;
                continue;
            }
            _ => {}
        }
        i += 1;
    }
    refs
}

/// Where a path leads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Place {
    /// Ends at this module.
    Module(usize),
    /// Names an item defined in this module's file.
    Item(usize),
    /// Outside the crate (or not a path the crate resolves).
    Outside,
}

/// The crate's modules and their imports.
struct Graph {
    modules: Vec<Module>,
    by_path: BTreeMap<Vec<String>, usize>,
}

impl Graph {
    /// Reads every `.rs` file under `src` (but `main.rs`).
    fn read(src: &Path) -> Self {
        let mut files = rust_files(src);
        files.sort();
        let module_path = |file: &Path| -> Vec<String> {
            let mut path: Vec<String> =
                file.with_extension("").iter().map(|s| s.to_string_lossy().into_owned()).collect();
            if path.last().is_some_and(|l| l == "mod" || l == "lib") {
                path.pop();
            }
            path
        };
        let paths: Vec<Vec<String>> = files.iter().map(|f| module_path(f)).collect();
        let by_path: BTreeMap<Vec<String>, usize> = paths.iter().cloned().zip(0..).collect();
        let modules = files
            .iter()
            .zip(&paths)
            .map(|(file, path)| {
                let src = std::fs::read_to_string(src.join(file)).expect("a source file is readable");
                let refs = references(&lex(&src));
                let own = |r: &Reference, kind| r.inline == 0 && r.kind == kind;
                let binds = refs
                    .iter()
                    .enumerate()
                    .filter(|(_, r)| own(r, RefKind::Use))
                    .filter_map(|(k, r)| Some((r.binding.clone()?, k)))
                    .collect();
                let globs =
                    refs.iter().enumerate().filter(|(_, r)| own(r, RefKind::Glob)).map(|(k, _)| k).collect();
                Module { path: path.clone(), file: file.clone(), refs, binds, globs }
            })
            .collect();
        Self { modules, by_path }
    }

    fn child(&self, m: usize, name: &str) -> Option<usize> {
        let mut path = self.modules[m].path.clone();
        path.push(name.to_owned());
        self.by_path.get(&path).copied()
    }

    fn parent(&self, m: usize) -> Option<usize> {
        let path = &self.modules[m].path;
        self.by_path.get(path.get(..path.len().checked_sub(1)?)?).copied()
    }

    /// What `name` means in module `m`'s own scope: a child, a name its
    /// `use` items bind, or one its globs bring.
    fn lookup(&self, m: usize, name: &str, hops: usize) -> Option<Place> {
        if let Some(c) = self.child(m, name) {
            return Some(Place::Module(c));
        }
        let module = &self.modules[m];
        if let Some(&k) = module.binds.get(name) {
            return Some(self.resolve(m, &module.refs[k].segs, 0, hops + 1));
        }
        // Only the crate's own globs can bring its names (`use
        // proptest::prelude::*` brings none).
        let own =
            |segs: &[String]| segs.first().is_some_and(|h| ["crate", "super", "self"].contains(&h.as_str()));
        module.globs.iter().filter(|&&k| own(&module.refs[k].segs)).find_map(|&k| {
            match self.resolve(m, &module.refs[k].segs, 0, hops + 1) {
                Place::Module(g) if g != m => self.lookup(g, name, hops + 1),
                _ => None,
            }
        })
    }

    /// Where `segs`, written in module `m` inside `inline` inline modules,
    /// leads.
    fn resolve(&self, m: usize, segs: &[String], inline: usize, hops: usize) -> Place {
        assert!(hops < 64, "a use loop around {:?} in {}", segs, self.modules[m].file.display());
        let Some(head) = segs.first() else { return Place::Module(m) };
        let mut cur = m;
        let mut rest = &segs[1..];
        match head.as_str() {
            "crate" => cur = self.by_path[&Vec::new()],
            "self" => {}
            "super" => {
                // `super` first leaves the inline modules, then the file's.
                let mut up = 1 + rest.iter().take_while(|s| *s == "super").count();
                rest = &rest[up - 1..];
                up = up.saturating_sub(inline);
                for _ in 0..up {
                    let Some(p) = self.parent(cur) else { return Place::Outside };
                    cur = p;
                }
            }
            // Inside an inline module the file's names are taken as
            // visible (they are, through its `use super::*`).
            name => match self.lookup(m, name, hops) {
                Some(Place::Module(c)) => cur = c,
                Some(Place::Item(c)) => return Place::Item(c),
                Some(Place::Outside) | None => return Place::Outside,
            },
        }
        for name in rest {
            if name == "self" {
                continue;
            }
            match self.lookup(cur, name, hops) {
                Some(Place::Module(c)) => cur = c,
                Some(place) => return place,
                // Not a child and not bound: defined in `cur`.
                None => return Place::Item(cur),
            }
        }
        Place::Module(cur)
    }

    /// Each module's imports: `edges[m]` maps an imported module to the
    /// line of the first reference.
    fn edges(&self) -> Vec<BTreeMap<usize, usize>> {
        self.modules
            .iter()
            .enumerate()
            .map(|(m, module)| {
                let mut to = BTreeMap::new();
                for r in &module.refs {
                    if r.reexport {
                        // A facade: who imports the name imports where it
                        // is defined.
                        continue;
                    }
                    let target = match (self.resolve(m, &r.segs, r.inline, 0), r.kind) {
                        (Place::Item(t), _) | (Place::Module(t), RefKind::Glob | RefKind::Code) => t,
                        _ => continue,
                    };
                    if target != m {
                        to.entry(target).or_insert(r.line);
                    }
                }
                to
            })
            .collect()
    }

    fn name(&self, m: usize) -> String {
        let path = &self.modules[m].path;
        if path.is_empty() { "crate".to_owned() } else { path.join("::") }
    }
}

/// Every cycle's shortest instance through each node of a strongly
/// connected component, as node lists (the first node repeated last is
/// left implicit).
fn cycles(edges: &[BTreeSet<usize>]) -> Vec<Vec<usize>> {
    let mut found: Vec<Vec<usize>> = Vec::new();
    let mut covered = BTreeSet::new();
    for start in 0..edges.len() {
        if covered.contains(&start) {
            continue;
        }
        // Breadth-first from `start` back to `start`: the shortest cycle
        // through it.
        let mut prev: BTreeMap<usize, usize> = BTreeMap::new();
        let mut queue = std::collections::VecDeque::from([start]);
        let mut closing = None;
        while let Some(n) = queue.pop_front() {
            if edges[n].contains(&start) {
                closing = Some(n);
                break;
            }
            for &next in &edges[n] {
                if next != start && !prev.contains_key(&next) {
                    prev.insert(next, n);
                    queue.push_back(next);
                }
            }
        }
        let Some(mut n) = closing else { continue };
        let mut cycle = vec![n];
        while n != start {
            n = prev[&n];
            cycle.push(n);
        }
        cycle.reverse();
        covered.extend(cycle.iter().copied());
        found.push(cycle);
    }
    found
}

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// The cycles among the modules of the crate whose source is `src`, each
/// as `a -> b (a's file:line) -> a (b's file:line)`.
fn cycle_report(src: &Path) -> Vec<String> {
    let graph = Graph::read(src);
    let edges = graph.edges();
    let sets: Vec<BTreeSet<usize>> = edges.iter().map(|e| e.keys().copied().collect()).collect();
    cycles(&sets)
        .iter()
        .map(|cycle| {
            let mut text = graph.name(cycle[0]);
            for (k, &from) in cycle.iter().enumerate() {
                let to = cycle[(k + 1) % cycle.len()];
                let line = edges[from][&to];
                text.push_str(&format!(
                    " -> {} ({}:{line})",
                    graph.name(to),
                    graph.modules[from].file.display()
                ));
            }
            text
        })
        .collect()
}

#[test]
fn no_module_imports_itself_through_others() {
    let found = cycle_report(&src());
    assert!(found.is_empty(), "import cycles between modules:\n  {}", found.join("\n  "));
}

/// The check itself, on a crate of a few files: a cycle through a parent's
/// re-export and a path in code is seen; a child using its parent's
/// items, an inline test module's `super::*` and a parent's facade are
/// not cycles.
#[test]
fn the_check_sees_a_cycle_through_a_reexport_and_a_path_in_code() {
    let dir = std::env::temp_dir().join(format!("limiter-import-graph-{}", std::process::id()));
    let write = |file: &str, text: &str| {
        let path = dir.join(file);
        std::fs::create_dir_all(path.parent().expect("a parent")).expect("a temporary directory");
        std::fs::write(path, text).expect("a temporary file");
    };
    write("lib.rs", "pub mod a;\npub mod b;\npub mod p;\n");
    write("p/mod.rs", "mod inner;\npub use self::inner::Shared;\npub const LIMIT: u32 = 1;\n");
    write("p/inner.rs", "use super::LIMIT;\npub struct Shared;\nfn f() -> u32 { crate::b::g() + LIMIT }\n");
    write(
        "a.rs",
        "// use crate::b::g;\nuse crate::p::Shared;\npub fn a() -> &'static str { \"super::b\" }\n",
    );
    write(
        "b.rs",
        "pub fn g() -> u32 { let _ = super::a::a(); 0 }\n#[cfg(test)]\nmod tests {\n    use super::*;\n}\n",
    );
    assert_eq!(cycle_report(&dir), ["a -> p::inner (a.rs:2) -> b (p/inner.rs:3) -> a (b.rs:1)"]);
    // Without the path in code there is none.
    write("b.rs", "pub fn g() -> u32 { 0 }\n");
    assert_eq!(cycle_report(&dir), Vec::<String>::new());
    std::fs::remove_dir_all(&dir).expect("a temporary directory");
}

/// The top-level modules' imports: `(from, to)` to the first file and
/// line where `from` imports `to`.
fn top_level(graph: &Graph) -> BTreeMap<(String, String), String> {
    let mut top: BTreeMap<(String, String), (bool, String)> = BTreeMap::new();
    for (m, to) in graph.edges().iter().enumerate() {
        let Some(a) = graph.modules[m].path.first() else { continue };
        for (&t, &line) in to {
            let Some(b) = graph.modules[t].path.first() else { continue };
            if a != b {
                // Named by its first file and line, a test's only if no
                // other file imports it.
                let file = &graph.modules[m].file;
                let test = file.iter().any(|c| c == "tests" || c == "tests.rs");
                let at = (test, format!("{}:{line}", file.display()));
                let entry = top.entry((a.clone(), b.clone())).or_insert(at.clone());
                if at < *entry {
                    *entry = at;
                }
            }
        }
    }
    top.into_iter().map(|(k, (_, at))| (k, at)).collect()
}

/// The layout list of `lib.rs`'s doc: each `//! - [`name`]` (or
/// `` - `name` ``) item's module, in order, and whether it says `(leaf)`.
fn documented_layers(lib_rs: &str) -> Vec<(String, bool)> {
    lib_rs
        .lines()
        .filter_map(|l| l.strip_prefix("//! - "))
        .filter_map(|item| {
            let name = item.trim_start_matches('[').strip_prefix('`')?.split('`').next()?;
            let head = item.split(':').next().unwrap_or(item);
            Some((name.to_owned(), head.contains("(leaf)")))
        })
        .collect()
}

#[test]
fn the_top_level_modules_keep_the_documented_layers() {
    let graph = Graph::read(&src());
    let this = module_path!().rsplit("::").next().expect("a module path");
    let modules: BTreeSet<String> =
        graph.modules.iter().filter_map(|m| m.path.first().cloned()).filter(|name| name != this).collect();
    let lib_rs = std::fs::read_to_string(src().join("lib.rs")).expect("lib.rs is readable");
    let layers = documented_layers(&lib_rs);
    let listed: Vec<&String> = layers.iter().map(|(name, _)| name).collect();
    let mut problems = Vec::new();
    for m in &modules {
        if !listed.contains(&m) {
            problems.push(format!("{m} is missing from the layout list"));
        }
    }
    let top = top_level(&graph);
    let position = |name: &str| listed.iter().position(|l| *l == name);
    for ((from, to), at) in &top {
        if let (Some(a), Some(b)) = (position(from), position(to))
            && a >= b
        {
            problems.push(format!("{from} imports {to} ({at}), listed above it"));
        }
    }
    for (name, leaf) in &layers {
        if !modules.contains(name) {
            problems.push(format!("{name} is listed but is no module"));
        }
        let imports: Vec<String> = top
            .iter()
            .filter(|((from, _), _)| from == name)
            .map(|((_, to), at)| format!("{to} ({at})"))
            .collect();
        match (leaf, imports.is_empty()) {
            (true, false) => {
                problems.push(format!("{name} is called a leaf but imports {}", imports.join(", ")))
            }
            (false, true) => problems.push(format!("{name} imports no other module: say (leaf)")),
            _ => {}
        }
    }
    assert!(problems.is_empty(), "lib.rs's layout list is wrong:\n  {}", problems.join("\n  "));
}

/// The files that allow `unsafe` code (under `src`, `main.rs` aside, and
/// not in a test), sorted.
fn unsafe_files(src: &Path) -> Vec<String> {
    let mut found = Vec::new();
    for file in rust_files(src) {
        let text = std::fs::read_to_string(src.join(&file)).expect("a source file");
        // Up to the file's test module: an allow inside a test is the
        // test's own.
        let code = text.split("\nmod tests").next().unwrap_or("");
        if code.lines().any(|l| l.trim_start().starts_with("#[allow(unsafe_code")) {
            found.push(file.display().to_string());
        }
    }
    // An allow on a `mod` line covers the module's file.
    if let Some(i) = found.iter().position(|f| f == "kernel/mod.rs") {
        found[i] = "kernel/sys.rs".to_owned();
    }
    found.sort();
    found
}

/// `docs/architecture.md`'s "Where `unsafe` lives" names every file the
/// daemon's `unsafe` code is in, and no other.
#[test]
fn the_manual_lists_every_file_with_unsafe_code() {
    let page =
        std::fs::read_to_string(src().join("../../docs/architecture.md")).expect("the architecture page");
    let start = page.find("**Where `unsafe` lives.**").expect("its paragraph");
    let paragraph = &page[start..];
    let paragraph = &paragraph[..paragraph.find("In `limiter-common`").expect("its end")];
    let mut listed: Vec<String> = paragraph
        .split('`')
        .skip(1)
        .step_by(2)
        .filter(|s| s.ends_with(".rs") && !s.starts_with("limiter/"))
        .map(str::to_owned)
        .collect();
    listed.sort();
    listed.dedup();
    assert_eq!(listed, unsafe_files(&src()), "docs/architecture.md's list against the source");
}

/// Every `.rs` file under `src` (but `main.rs`, the binary's), relative to
/// it.
fn rust_files(src: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    let mut dirs = vec![src.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).expect("src is readable") {
            let path = entry.expect("src is readable").path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                files.push(path.strip_prefix(src).expect("under src").to_path_buf());
            }
        }
    }
    files.retain(|f| f != Path::new("main.rs"));
    files
}
