//! The server crate's module graph has no cycle.
//!
//! Every file under `src/` is a node; an edge A → B means A's code names
//! something in B (`use crate::b::…`, `crate::b::f()`, `super::…`, a
//! declared child module's path, or a name a `use` brought in for a module).
//! `#[cfg(test)]` items and test-only modules are left out: a test may reach
//! across layers, the serving code may not. The graph's strongly connected
//! components must all be single files: a cycle means two layers that
//! cannot be understood (or replaced) one without the other.
//!
//! `cargo nextest run -p ds4-server --test module_graph --no-capture` prints
//! the edges and the components.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// A module path inside the crate: `[]` is the root, `["routes", "chat"]`
/// is `crate::routes::chat`.
type ModPath = Vec<String>;

fn name(m: &ModPath) -> String {
    if m.is_empty() {
        "crate".into()
    } else {
        m.join("::")
    }
}

/// Code with comments, string and char literals blanked out (so that
/// `"crate::x"` in a string or a doc comment is no reference).
fn strip(src: &str) -> String {
    let c: Vec<char> = src.chars().collect();
    let mut out = String::with_capacity(src.len());
    let mut i = 0;
    while i < c.len() {
        if c[i] == '/' && at(&c, i + 1) == '/' {
            while i < c.len() && c[i] != '\n' {
                i += 1;
            }
        } else if c[i] == '/' && at(&c, i + 1) == '*' {
            let mut depth = 0;
            while i < c.len() {
                if c[i] == '/' && at(&c, i + 1) == '*' {
                    depth += 1;
                    i += 2;
                } else if c[i] == '*' && at(&c, i + 1) == '/' {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
            out.push(' ');
        } else if c[i] == 'r'
            && (at(&c, i + 1) == '"' || (at(&c, i + 1) == '#' && !ident(prev(&out))))
        {
            // raw string r"…" or r#"…"#
            let mut j = i + 1;
            let mut hashes = 0;
            while c.get(j) == Some(&'#') {
                hashes += 1;
                j += 1;
            }
            if c.get(j) != Some(&'"') {
                out.push(c[i]);
                i += 1;
                continue;
            }
            j += 1;
            loop {
                if j >= c.len() {
                    break;
                }
                if c[j] == '"' && (0..hashes).all(|h| c.get(j + 1 + h) == Some(&'#')) {
                    j += 1 + hashes;
                    break;
                }
                j += 1;
            }
            out.push_str("\"\"");
            i = j;
        } else if c[i] == '"' {
            i += 1;
            while i < c.len() && c[i] != '"' {
                if c[i] == '\\' {
                    i += 1;
                }
                i += 1;
            }
            i += 1;
            out.push_str("\"\"");
        } else if c[i] == '\'' && (at(&c, i + 1) == '\\' || at(&c, i + 2) == '\'') {
            // a char literal (a lifetime has no closing quote)
            i += 1;
            if c.get(i) == Some(&'\\') {
                i += 2;
            } else {
                i += 1;
            }
            while i < c.len() && c[i] != '\'' {
                i += 1;
            }
            i += 1;
            out.push_str("' '");
        } else {
            out.push(c[i]);
            i += 1;
        }
    }
    out
}

fn at(c: &[char], i: usize) -> char {
    c.get(i).copied().unwrap_or('\0')
}

fn prev(s: &str) -> char {
    s.chars().last().unwrap_or(' ')
}

fn ident(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// `#[cfg(test)]` items removed; returns the rest and the names of the
/// test-only child modules declared as `#[cfg(test)] mod x;`.
fn drop_test_items(code: &str) -> (String, Vec<String>) {
    const ATTR: &str = "#[cfg(test)]";
    let mut out = String::new();
    let mut test_mods = Vec::new();
    let mut rest = code;
    while let Some(at) = rest.find(ATTR) {
        out.push_str(&rest[..at]);
        let item = &rest[at + ATTR.len()..];
        let b = item.as_bytes();
        let mut i = 0;
        let mut depth = 0i32;
        let mut end = item.len();
        while i < b.len() {
            match b[i] {
                b'{' => depth += 1,
                b'}' => {
                    depth -= 1;
                    if depth == 0 {
                        end = i + 1;
                        break;
                    }
                }
                b';' if depth == 0 => {
                    end = i + 1;
                    break;
                }
                _ => {}
            }
            i += 1;
        }
        let words: Vec<&str> = item[..end]
            .split(|ch: char| !ident(ch))
            .filter(|w| !w.is_empty())
            .collect();
        if let Some(p) = words.iter().position(|w| *w == "mod")
            && item[..end].trim_end().ends_with(';')
            && let Some(n) = words.get(p + 1)
        {
            test_mods.push((*n).to_string());
        }
        rest = &item[end..];
    }
    out.push_str(rest);
    (out, test_mods)
}

/// Every path the code names: `a::b::c` sequences (with `{…}` groups
/// expanded), each with the name a `use` binds it to, if any.
fn paths(code: &str) -> Vec<(Vec<String>, bool)> {
    let c: Vec<char> = code.chars().collect();
    let mut found = Vec::new();
    let mut i = 0;
    while i < c.len() {
        if ident(c[i]) && (i == 0 || !(ident(c[i - 1]) || c[i - 1] == ':')) {
            let start = i;
            let in_use = {
                let before: String = c[..start].iter().collect();
                let stmt = before.rsplit([';', '{', '}']).next().unwrap_or("");
                let stmt = stmt.trim_start();
                stmt.starts_with("use ")
                    || stmt.starts_with("pub use ")
                    || stmt.starts_with("pub(crate) use ")
            };
            let mut j = i;
            let (mut list, next) = parse_tree(&c, &mut j, &[]);
            if list.iter().any(|p| p.len() > 1) {
                for p in list.drain(..) {
                    found.push((p, in_use));
                }
            }
            i = next.max(i + 1);
        } else {
            i += 1;
        }
    }
    found
}

/// Parses `seg (:: seg)* (:: { tree, … })?` at `*j`; returns the paths and
/// the index after them.
fn parse_tree(c: &[char], j: &mut usize, prefix: &[String]) -> (Vec<Vec<String>>, usize) {
    let mut segs = prefix.to_vec();
    let mut out = Vec::new();
    loop {
        let s = *j;
        while *j < c.len() && ident(c[*j]) {
            *j += 1;
        }
        if *j == s {
            break;
        }
        segs.push(c[s..*j].iter().collect());
        if c.get(*j) == Some(&':') && c.get(*j + 1) == Some(&':') {
            *j += 2;
            while c.get(*j).is_some_and(|ch| ch.is_whitespace()) {
                *j += 1;
            }
            if c.get(*j) == Some(&'{') {
                *j += 1;
                loop {
                    while c.get(*j).is_some_and(|ch| ch.is_whitespace() || *ch == ',') {
                        *j += 1;
                    }
                    match c.get(*j) {
                        None => return (out, *j),
                        Some('}') => {
                            *j += 1;
                            return (out, *j);
                        }
                        Some(ch) if ident(*ch) => {
                            let (mut more, _) = parse_tree(c, j, &segs);
                            out.append(&mut more);
                        }
                        Some(_) => *j += 1,
                    }
                }
            }
            continue;
        }
        break;
    }
    // `x as y`: the path stays x's.
    if !segs.is_empty() {
        out.push(segs);
    }
    (out, *j)
}

struct Crate {
    /// module → its file
    files: BTreeMap<ModPath, PathBuf>,
}

impl Crate {
    fn load(src: &Path) -> Crate {
        let mut files = BTreeMap::new();
        let mut pending = vec![(Vec::new(), src.join("lib.rs"))];
        while let Some((m, file)) = pending.pop() {
            let text = std::fs::read_to_string(&file).expect("readable source");
            let (code, test_mods) = drop_test_items(&strip(&text));
            let dir = if file.ends_with("lib.rs") || file.ends_with("mod.rs") {
                file.parent().expect("dir").to_path_buf()
            } else {
                file.with_extension("")
            };
            for child in declared_children(&code) {
                if test_mods.contains(&child) {
                    continue;
                }
                let flat = dir.join(format!("{child}.rs"));
                let nested = dir.join(&child).join("mod.rs");
                let path = if flat.exists() { flat } else { nested };
                let mut cm = m.clone();
                cm.push(child);
                pending.push((cm, path));
            }
            files.insert(m, file);
        }
        Crate { files }
    }

    /// Edges, by module.
    fn edges(&self) -> BTreeMap<ModPath, BTreeSet<ModPath>> {
        let mut graph = BTreeMap::new();
        for (m, file) in &self.files {
            let text = std::fs::read_to_string(file).expect("readable source");
            let (code, _) = drop_test_items(&strip(&text));
            let mut aliases: BTreeMap<String, ModPath> = BTreeMap::new();
            let mut targets = BTreeSet::new();
            let all = paths(&code);
            // `use` lines first, so that a module brought in by name is known
            // wherever the code uses it.
            for (p, in_use) in all.iter().filter(|(_, u)| *u).chain(all.iter()) {
                let Some(abs) = self.absolute(m, p, &aliases) else {
                    continue;
                };
                let target = self.owner(&abs);
                if *in_use && self.files.contains_key(&abs) {
                    aliases.insert(abs.last().cloned().unwrap_or_default(), abs.clone());
                }
                // A child naming its parent is an edge too; the root is left
                // out below (it declares every module).
                if target != *m {
                    targets.insert(target);
                }
            }
            targets.remove(&Vec::new());
            graph.insert(m.clone(), targets);
        }
        graph.remove(&Vec::new());
        graph
    }

    /// The path in crate terms, or None for another crate's path.
    fn absolute(
        &self,
        here: &ModPath,
        p: &[String],
        aliases: &BTreeMap<String, ModPath>,
    ) -> Option<ModPath> {
        let (first, rest) = p.split_first()?;
        let mut base: ModPath = match first.as_str() {
            "crate" => Vec::new(),
            "self" => here.clone(),
            "super" => here[..here.len().saturating_sub(1)].to_vec(),
            _ => {
                let mut child = here.clone();
                child.push(first.clone());
                if self.files.contains_key(&child) {
                    child
                } else if let Some(a) = aliases.get(first) {
                    a.clone()
                } else {
                    return None;
                }
            }
        };
        let mut rest = rest;
        while rest.first().is_some_and(|s| s == "super") {
            base.pop();
            rest = &rest[1..];
        }
        base.extend(rest.iter().cloned());
        Some(base)
    }

    /// The deepest module that contains the path.
    fn owner(&self, abs: &ModPath) -> ModPath {
        (0..=abs.len())
            .rev()
            .map(|n| abs[..n].to_vec())
            .find(|m| self.files.contains_key(m))
            .unwrap_or_default()
    }
}

fn declared_children(code: &str) -> Vec<String> {
    let words: Vec<&str> = code
        .split(|ch: char| !ident(ch) && ch != ';' && ch != '{')
        .filter(|w| !w.is_empty())
        .collect();
    words
        .windows(2)
        .filter(|w| w[0] == "mod" && w[1].ends_with(';'))
        .map(|w| w[1].trim_end_matches(';').to_string())
        .collect()
}

/// Tarjan's strongly connected components.
fn components(graph: &BTreeMap<ModPath, BTreeSet<ModPath>>) -> Vec<Vec<ModPath>> {
    struct T<'a> {
        g: &'a BTreeMap<ModPath, BTreeSet<ModPath>>,
        index: BTreeMap<&'a ModPath, usize>,
        low: BTreeMap<&'a ModPath, usize>,
        stack: Vec<&'a ModPath>,
        on: BTreeSet<&'a ModPath>,
        out: Vec<Vec<ModPath>>,
    }
    fn visit<'a>(t: &mut T<'a>, v: &'a ModPath) {
        let n = t.index.len();
        t.index.insert(v, n);
        t.low.insert(v, n);
        t.stack.push(v);
        t.on.insert(v);
        for w in t.g.get(v).into_iter().flatten() {
            let Some((w, _)) = t.g.get_key_value(w) else {
                continue;
            };
            if !t.index.contains_key(w) {
                visit(t, w);
                let lw = t.low[w];
                let lv = t.low.get_mut(v).expect("visited");
                *lv = (*lv).min(lw);
            } else if t.on.contains(w) {
                let iw = t.index[w];
                let lv = t.low.get_mut(v).expect("visited");
                *lv = (*lv).min(iw);
            }
        }
        if t.low[v] == t.index[v] {
            let mut comp = Vec::new();
            while let Some(w) = t.stack.pop() {
                t.on.remove(w);
                comp.push(w.clone());
                if w == v {
                    break;
                }
            }
            comp.sort();
            t.out.push(comp);
        }
    }
    let mut t = T {
        g: graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on: BTreeSet::new(),
        out: Vec::new(),
    };
    for v in graph.keys() {
        if !t.index.contains_key(v) {
            visit(&mut t, v);
        }
    }
    t.out
}

fn server_graph() -> BTreeMap<ModPath, BTreeSet<ModPath>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    Crate::load(&src).edges()
}

#[test]
fn no_module_cycle() {
    let graph = server_graph();
    for (m, to) in &graph {
        let to: Vec<String> = to.iter().map(name).collect();
        println!("{} -> {}", name(m), to.join(", "));
    }
    let cycles: Vec<Vec<ModPath>> = components(&graph)
        .into_iter()
        .filter(|c| c.len() > 1)
        .collect();
    for c in &cycles {
        let names: Vec<String> = c.iter().map(name).collect();
        println!("cycle of {}: {}", c.len(), names.join(", "));
    }
    assert!(
        cycles.is_empty(),
        "module cycles in crates/server: {:?}",
        cycles
            .iter()
            .map(|c| c.iter().map(name).collect::<Vec<_>>())
            .collect::<Vec<_>>()
    );
}

/// The checker itself finds a cycle and a use group's modules (so the test
/// above can fail).
#[test]
fn checker_sees_cycles_and_groups() {
    let dir = tempfile::tempdir().expect("tempdir");
    let src = dir.path();
    std::fs::write(
        src.join("lib.rs"),
        "mod a;\nmod b;\nmod c;\n#[cfg(test)]\nmod t;\n",
    )
    .expect("write");
    std::fs::write(
        src.join("a.rs"),
        "use crate::{b::{X, Y}, c};\n// crate::c is a comment\nfn f() { c::g(); }\n",
    )
    .expect("write");
    std::fs::write(
        src.join("b.rs"),
        "pub struct X; pub struct Y;\nfn g() -> &'static str { \"crate::a::z\" }\n#[cfg(test)]\nmod tests { use crate::a; }\n",
    )
    .expect("write");
    std::fs::write(src.join("c.rs"), "pub fn g() { crate::a::f2(); }\n").expect("write");
    std::fs::write(src.join("t.rs"), "use crate::a;\n").expect("write");
    let graph = Crate::load(src).edges();
    let m = |s: &str| vec![s.to_string()];
    assert_eq!(graph[&m("a")], BTreeSet::from([m("b"), m("c")]));
    assert!(graph[&m("b")].is_empty(), "strings and test items ignored");
    assert!(!graph.contains_key(&m("t")), "test-only modules left out");
    let cycles: Vec<_> = components(&graph)
        .into_iter()
        .filter(|c| c.len() > 1)
        .collect();
    assert_eq!(cycles, vec![vec![m("a"), m("c")]]);
}
