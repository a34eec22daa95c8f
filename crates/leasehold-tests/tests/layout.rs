//! The layout's arrows point down (issue 35, item 2): drawn from the imports, no circle of modules spans two
//! folders. A circle through `a/` and `b/` means neither folder can be read, changed or moved without the other, so
//! the folders stop telling the architecture.
//!
//! The checker reads every `.rs` file of a crate's `src/` (no compiler, std only) and follows the paths that name
//! the crate's own modules: `use crate::…`, `crate::…` anywhere in code, `super::…`, `self::…`, and paths starting at
//! a child module or at a name a `use` brought in. Comments, doc comments and string literals are not read; a `mod`
//! declaration is not a dependency. A path to an item that a module re-exports (`pub use x::Item`) leads to the
//! module the item comes from, so `crate::Error` is `error.rs`, not `lib.rs`.
//!
//! The files are then folded into nodes: a file is in the folder it lies in (`backend/redis/keys.rs` in
//! `backend/redis/`), a folder's own module file with it (`bench/mod.rs` in `bench/`, and `demo.rs` in `demo/` when
//! `demo/` exists), and each other top-level file is a node of its own (`cli.rs`, `client.rs`). A circle is a
//! strongly connected component of two nodes or more; its files are the ones that carry its arrows.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};

#[test]
fn the_command_has_no_import_cycle_across_folders() {
    let layout = Layout::of_crate(&crate_src("leasehold-cli"));
    print!("{}", layout.summary("crates/leasehold-cli/src"));
    let cycles = layout.cycles();
    assert!(
        cycles.is_empty(),
        "the command's imports go round in circles across folders (see above); move what both sides need below them"
    );
}

/// The library has no circle across folders either (issue 35, item 2). Until it had none, a ratchet held its largest
/// circle down: 61 files before the session engine, 67 with it, 70 once the wait moved into the engine; then 53 when
/// `error.rs` stopped importing `engine/` and `backend/redis/`, 26 when the seam left `backend/mod.rs` for
/// `kinds/store.rs`, 20 when the fenced transaction's `Guard` methods left `backend/sql/`, and none when Redis's
/// acquisitions returned grants instead of guards and `client.rs` stopped importing the kinds.
#[test]
fn the_library_has_no_import_cycle_across_folders() {
    let layout = Layout::of_crate(&crate_src("leasehold"));
    print!("{}", layout.summary("crates/leasehold/src"));
    let cycles = layout.cycles();
    assert!(
        cycles.is_empty(),
        "the library's imports go round in circles across folders (see above): the stores return grants and the kinds \
         make guards; move what both sides need below them"
    );
}

fn crate_src(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(name)
        .join("src")
}

/// A module path from the crate root: `["bench", "stats"]`.
type ModPath = Vec<String>;

/// One `use` binding: the name it brings in, and the path it names, relative to the module that holds it.
struct Binding {
    name: String,
    path: Vec<String>,
    glob: bool,
}

/// A crate's files and what their paths name.
struct Layout {
    /// Every file, by its path under `src/`, with the module it is.
    files: BTreeMap<String, ModPath>,
    /// Every module (file or inline `mod x { … }`) and the file it is written in.
    modules: HashMap<ModPath, String>,
    /// The `use` bindings of each module.
    bindings: HashMap<ModPath, Vec<Binding>>,
    /// The paths each file mentions: the module they are in, and the path.
    mentions: BTreeMap<String, Vec<(ModPath, Vec<String>)>>,
}

/// Arrows between files inside one circle of nodes, and the files that carry them.
#[derive(Debug)]
struct Cycle {
    nodes: Vec<String>,
    files: BTreeSet<String>,
    /// How many node-to-node arrows run inside it.
    arrows: usize,
}

impl Layout {
    fn of_crate(src: &Path) -> Layout {
        let mut files = Vec::new();
        collect(src, src, &mut files);
        Layout::of_files(&files)
    }

    /// `files`: (path under `src/`, contents).
    fn of_files(files: &[(String, String)]) -> Layout {
        let mut layout = Layout {
            files: BTreeMap::new(),
            modules: HashMap::new(),
            bindings: HashMap::new(),
            mentions: BTreeMap::new(),
        };
        for (path, _) in files {
            let module = module_of(path);
            layout.modules.insert(module.clone(), path.clone());
            layout.files.insert(path.clone(), module);
        }
        for (path, text) in files {
            let module = layout.files[path].clone();
            layout.read(path, module, &tokens(&strip(text)));
        }
        layout
    }

    /// Records a file's inline modules, `use` bindings and path mentions.
    fn read(&mut self, file: &str, root: ModPath, tokens: &[String]) {
        let mut scope = root;
        // The inline modules open at this point, with the brace depth each closes at.
        let mut open: Vec<usize> = Vec::new();
        let mut depth = 0;
        let mut i = 0;
        while i < tokens.len() {
            let token = tokens[i].as_str();
            match token {
                "{" => depth += 1,
                "}" => {
                    depth -= 1;
                    if open.last() == Some(&depth) {
                        open.pop();
                        scope.pop();
                    }
                }
                "mod" if is_ident(tok(tokens, i + 1)) && tok(tokens, i + 2) == "{" => {
                    scope.push(tokens[i + 1].clone());
                    self.modules.insert(scope.clone(), file.to_owned());
                    open.push(depth);
                    depth += 1;
                    i += 3;
                    continue;
                }
                "mod" => {
                    // `mod x;` declares a child: not a dependency.
                    i += 2;
                    continue;
                }
                "use" => {
                    let end = (i..tokens.len())
                        .find(|&j| tokens[j] == ";")
                        .unwrap_or(tokens.len());
                    let mut trees = Vec::new();
                    use_tree(&tokens[i + 1..end], Vec::new(), &mut trees);
                    for (path, name, glob) in trees {
                        self.mention(file, &scope, path.clone());
                        self.bindings
                            .entry(scope.clone())
                            .or_default()
                            .push(Binding { name, path, glob });
                    }
                    i = end;
                    continue;
                }
                _ if is_ident(token)
                    && tok(tokens, i + 1) == "::"
                    && !matches!(tok(tokens, i.wrapping_sub(1)), "::" | "." | "in") =>
                {
                    let mut path = vec![token.to_owned()];
                    let mut j = i + 1;
                    while tok(tokens, j) == "::" && is_ident(tok(tokens, j + 1)) {
                        path.push(tokens[j + 1].clone());
                        j += 2;
                    }
                    self.mention(file, &scope, path);
                    i = j;
                    continue;
                }
                _ => {}
            }
            i += 1;
        }
    }

    fn mention(&mut self, file: &str, scope: &ModPath, path: Vec<String>) {
        self.mentions
            .entry(file.to_owned())
            .or_default()
            .push((scope.clone(), path));
    }

    /// The file a path mentioned in module `from` leads to, if it names this crate's modules.
    fn resolve(&self, from: &ModPath, path: &[String], hops: usize) -> Option<String> {
        if hops > 16 || path.is_empty() {
            return None;
        }
        let mut module = from.clone();
        let mut rest = path;
        match rest[0].as_str() {
            "crate" => {
                module.clear();
                rest = &rest[1..];
            }
            "self" => rest = &rest[1..],
            "super" => {
                while rest.first().map(String::as_str) == Some("super") {
                    module.pop()?;
                    rest = &rest[1..];
                }
            }
            first => {
                let mut child = module.clone();
                child.push(first.to_owned());
                if !self.modules.contains_key(&child) {
                    // Not a child module: a name a `use` of this module brought in, or another crate.
                    let binding = self.binding(&module, first)?;
                    if binding.path == [first] {
                        return None; // `use redis;`: another crate.
                    }
                    let mut through = binding.path.clone();
                    through.extend_from_slice(&rest[1..]);
                    return self.resolve(&module, &through, hops + 1);
                }
            }
        }
        for (k, segment) in rest.iter().enumerate() {
            let mut child = module.clone();
            child.push(segment.clone());
            if self.modules.contains_key(&child) {
                module = child;
                continue;
            }
            // An item of `module`: where it is defined, if `module` only re-exports it (from another crate: none).
            if let Some(binding) = self.binding(&module, segment) {
                if binding.path == [segment.as_str()] {
                    return None;
                }
                let mut through = binding.path.clone();
                through.extend_from_slice(&rest[k + 1..]);
                return self.resolve(&module, &through, hops + 1);
            }
            for glob in self.globs(&module) {
                let mut through = glob.path.clone();
                through.extend_from_slice(&rest[k..]);
                if let Some(file) = self.resolve(&module, &through, hops + 1) {
                    if file != self.modules[&module] {
                        return Some(file);
                    }
                }
            }
            break;
        }
        self.modules.get(&module).cloned()
    }

    fn binding(&self, module: &ModPath, name: &str) -> Option<&Binding> {
        self.bindings
            .get(module)?
            .iter()
            .find(|b| !b.glob && b.name == name)
    }

    fn globs(&self, module: &ModPath) -> impl Iterator<Item = &Binding> {
        self.bindings
            .get(module)
            .into_iter()
            .flatten()
            .filter(|b| b.glob)
    }

    /// The arrows between files: (from, to), both files of this crate, never a file to itself.
    fn file_arrows(&self) -> BTreeSet<(String, String)> {
        let mut arrows = BTreeSet::new();
        for (file, mentions) in &self.mentions {
            for (scope, path) in mentions {
                if let Some(to) = self.resolve(scope, path, 0) {
                    if &to != file {
                        arrows.insert((file.clone(), to));
                    }
                }
            }
        }
        arrows
    }

    /// The node a file is folded into: its folder, or the top-level file itself.
    fn node(&self, file: &str) -> String {
        let path = Path::new(file);
        let stem = file.strip_suffix(".rs").unwrap_or(file);
        let own_folder = format!("{stem}/");
        if path.file_name().is_some_and(|n| n == "mod.rs") {
            return format!("{}/", path.parent().unwrap().display());
        }
        if self.files.keys().any(|f| f.starts_with(&own_folder)) {
            return own_folder;
        }
        match path.parent().filter(|p| !p.as_os_str().is_empty()) {
            Some(folder) => format!("{}/", folder.display()),
            None => file.to_owned(),
        }
    }

    /// The arrows between nodes, each with the file arrows that draw it.
    fn node_arrows(&self) -> BTreeMap<(String, String), Vec<(String, String)>> {
        let mut arrows: BTreeMap<(String, String), Vec<(String, String)>> = BTreeMap::new();
        for (from, to) in self.file_arrows() {
            let (a, b) = (self.node(&from), self.node(&to));
            if a != b {
                arrows.entry((a, b)).or_default().push((from, to));
            }
        }
        arrows
    }

    /// The circles across nodes: the strongly connected components of two nodes or more, largest first.
    fn cycles(&self) -> Vec<Cycle> {
        let arrows = self.node_arrows();
        let mut next: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
        for (a, b) in arrows.keys() {
            next.entry(a).or_default().push(b);
            next.entry(b).or_default();
        }
        let mut cycles: Vec<Cycle> = components(&next)
            .into_iter()
            .filter(|c| c.len() > 1)
            .map(|nodes| {
                let inside: BTreeSet<&str> = nodes.iter().copied().collect();
                let files = arrows
                    .iter()
                    .filter(|((a, b), _)| {
                        inside.contains(a.as_str()) && inside.contains(b.as_str())
                    })
                    .flat_map(|(_, pairs)| pairs.iter().flat_map(|(f, t)| [f.clone(), t.clone()]))
                    .collect();
                Cycle {
                    nodes: nodes.iter().map(|n| n.to_string()).collect(),
                    files,
                    arrows: arrows
                        .keys()
                        .filter(|(a, b)| inside.contains(a.as_str()) && inside.contains(b.as_str()))
                        .count(),
                }
            })
            .collect();
        cycles.sort_by_key(|c| std::cmp::Reverse(c.files.len()));
        cycles
    }

    /// The circles of files (not folded) that span two nodes or more: the files that import each other round.
    fn file_cycles(&self) -> Vec<Vec<String>> {
        let arrows = self.file_arrows();
        let mut next: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
        for (a, b) in &arrows {
            next.entry(a).or_default().push(b);
            next.entry(b).or_default();
        }
        components(&next)
            .into_iter()
            .filter(|c| {
                c.iter()
                    .map(|f| self.node(f))
                    .collect::<BTreeSet<_>>()
                    .len()
                    > 1
            })
            .map(|c| c.into_iter().map(str::to_owned).collect())
            .collect()
    }

    /// What a reader needs to see: the nodes, the arrows between them, and each circle with its files.
    fn summary(&self, name: &str) -> String {
        let arrows = self.node_arrows();
        let nodes: BTreeSet<String> = self.files.keys().map(|f| self.node(f)).collect();
        let mut out = format!(
            "{name}: {} files in {} folders and top-level files, {} arrows between them\n",
            self.files.len(),
            nodes.len(),
            arrows.len()
        );
        let cycles = self.cycles();
        let arrows_in_cycles = cycles.iter().map(|c| c.arrows).sum::<usize>();
        out += &format!("  {arrows_in_cycles} of those arrows are inside circles\n");
        for files in self.file_cycles() {
            out += &format!(
                "  {} files go round at the level of files: {}\n",
                files.len(),
                files.join(", ")
            );
        }
        if cycles.is_empty() {
            out.push_str("  no import circle across folders\n");
        }
        for cycle in &cycles {
            let inside: BTreeSet<&String> = cycle.nodes.iter().collect();
            out += &format!(
                "  a circle of {} files through {}:\n",
                cycle.files.len(),
                cycle.nodes.join(", ")
            );
            for ((a, b), pairs) in &arrows {
                if inside.contains(a) && inside.contains(b) {
                    let shown: Vec<String> =
                        pairs.iter().map(|(f, t)| format!("{f} -> {t}")).collect();
                    out += &format!("    {a} -> {b}: {}\n", shown.join(", "));
                }
            }
        }
        out
    }
}

/// Every `.rs` file under `dir`, by its path relative to `src`.
fn collect(src: &Path, dir: &Path, out: &mut Vec<(String, String)>) {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            collect(src, &path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            let relative = path.strip_prefix(src).unwrap();
            let relative = relative
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect::<Vec<_>>()
                .join("/");
            let text = std::fs::read_to_string(&path).unwrap();
            out.push((relative, text));
        }
    }
}

/// The module a file is: `bench/stats.rs` and `bench/stats/mod.rs` are `bench::stats`, `main.rs` the root.
fn module_of(file: &str) -> ModPath {
    let mut parts: Vec<String> = file
        .strip_suffix(".rs")
        .unwrap_or(file)
        .split('/')
        .map(str::to_owned)
        .collect();
    if parts.last().map(String::as_str) == Some("mod")
        || parts.len() == 1 && matches!(parts[0].as_str(), "lib" | "main")
    {
        parts.pop();
    }
    parts
}

/// Flattens a `use` tree (the tokens after `use`, before `;`) into (path, bound name, is a glob).
fn use_tree(tokens: &[String], prefix: Vec<String>, out: &mut Vec<(Vec<String>, String, bool)>) {
    let mut path = prefix;
    let mut i = 0;
    if tok(tokens, 0) == "::" {
        return; // `use ::x`: another crate.
    }
    while i < tokens.len() {
        match tokens[i].as_str() {
            "::" => i += 1,
            "*" => {
                let name = path.last().cloned().unwrap_or_default();
                out.push((path, name, true));
                return;
            }
            "{" => {
                // Split the group at its top-level commas.
                let mut depth = 0;
                let mut start = i + 1;
                for j in i..tokens.len() {
                    match tokens[j].as_str() {
                        "{" => depth += 1,
                        "}" => {
                            depth -= 1;
                            if depth == 0 {
                                if start < j {
                                    use_tree(&tokens[start..j], path.clone(), out);
                                }
                                return;
                            }
                        }
                        "," if depth == 1 => {
                            if start < j {
                                use_tree(&tokens[start..j], path.clone(), out);
                            }
                            start = j + 1;
                        }
                        _ => {}
                    }
                }
                return;
            }
            "as" => {
                let alias = tok(tokens, i + 1).to_owned();
                if alias != "_" {
                    if path.last().map(String::as_str) == Some("self") {
                        path.pop();
                    }
                    out.push((path, alias, false));
                }
                return;
            }
            segment if is_ident(segment) => {
                path.push(segment.to_owned());
                i += 1;
            }
            _ => return, // Not a use tree we read (a visibility, an attribute): nothing bound.
        }
    }
    if path.last().map(String::as_str) == Some("self") {
        path.pop();
    }
    if let Some(name) = path.last().cloned() {
        out.push((path, name, false));
    }
}

fn tok(tokens: &[String], i: usize) -> &str {
    tokens.get(i).map(String::as_str).unwrap_or("")
}

fn is_ident(token: &str) -> bool {
    token
        .chars()
        .next()
        .is_some_and(|c| c.is_alphabetic() || c == '_')
}

/// The code of a file with its comments (doc comments too), strings and character literals blanked out.
fn strip(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    let at = |i: usize| chars.get(i).copied().unwrap_or('\0');
    let ident = |c: char| c.is_alphanumeric() || c == '_';
    while i < chars.len() {
        let c = chars[i];
        if c == '/' && at(i + 1) == '/' {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && at(i + 1) == '*' {
            let mut depth = 0;
            while i < chars.len() {
                if chars[i] == '/' && at(i + 1) == '*' {
                    depth += 1;
                    i += 2;
                } else if chars[i] == '*' && at(i + 1) == '/' {
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
        } else if (c == 'r' || c == 'b' && at(i + 1) == 'r')
            && (i == 0 || !ident(chars[i - 1]))
            && {
                let r = if c == 'b' { i + 1 } else { i };
                let mut h = r + 1;
                while at(h) == '#' {
                    h += 1;
                }
                at(h) == '"'
            }
        {
            // A raw string: `r#"…"#`, as many hashes at its end as at its start.
            let mut h = if c == 'b' { i + 2 } else { i + 1 };
            let mut hashes = 0;
            while at(h) == '#' {
                hashes += 1;
                h += 1;
            }
            i = h + 1;
            while i < chars.len() && !(chars[i] == '"' && (1..=hashes).all(|k| at(i + k) == '#')) {
                i += 1;
            }
            i += 1 + hashes;
            out.push_str("\"\"");
        } else if c == '"' {
            i += 1;
            while i < chars.len() && chars[i] != '"' {
                i += if chars[i] == '\\' { 2 } else { 1 };
            }
            i += 1;
            out.push_str("\"\"");
        } else if c == '\'' && (at(i + 1) == '\\' || at(i + 2) == '\'') {
            // A character literal (a lifetime has no closing quote right after its first character).
            i += 1;
            while i < chars.len() && chars[i] != '\'' {
                i += if chars[i] == '\\' { 2 } else { 1 };
            }
            i += 1;
            out.push_str("' '");
        } else {
            out.push(c);
            i += 1;
        }
    }
    out
}

/// Identifiers (with `r#`), `::`, and every other character on its own; whitespace dropped.
fn tokens(code: &str) -> Vec<String> {
    let chars: Vec<char> = code.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c.is_whitespace() {
            i += 1;
        } else if c.is_alphanumeric() || c == '_' {
            let start = i;
            while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '_') {
                i += 1;
            }
            let word: String = chars[start..i].iter().collect();
            if word == "r" && chars.get(i) == Some(&'#') {
                i += 1;
                continue; // `r#type`: the identifier follows.
            }
            out.push(word);
        } else if c == ':' && chars.get(i + 1) == Some(&':') {
            out.push("::".to_owned());
            i += 2;
        } else {
            out.push(c.to_string());
            i += 1;
        }
    }
    out
}

/// Tarjan's strongly connected components.
fn components<'a>(next: &BTreeMap<&'a str, Vec<&'a str>>) -> Vec<Vec<&'a str>> {
    struct State<'a> {
        index: HashMap<&'a str, usize>,
        low: HashMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on_stack: BTreeSet<&'a str>,
        out: Vec<Vec<&'a str>>,
    }
    fn visit<'a>(node: &'a str, next: &BTreeMap<&'a str, Vec<&'a str>>, s: &mut State<'a>) {
        let n = s.index.len();
        s.index.insert(node, n);
        s.low.insert(node, n);
        s.stack.push(node);
        s.on_stack.insert(node);
        for &to in &next[node] {
            if !s.index.contains_key(to) {
                visit(to, next, s);
                let low = s.low[node].min(s.low[to]);
                s.low.insert(node, low);
            } else if s.on_stack.contains(to) {
                let low = s.low[node].min(s.index[to]);
                s.low.insert(node, low);
            }
        }
        if s.low[node] == s.index[node] {
            let mut component = Vec::new();
            loop {
                let top = s.stack.pop().unwrap();
                s.on_stack.remove(top);
                component.push(top);
                if top == node {
                    break;
                }
            }
            component.sort();
            s.out.push(component);
        }
    }
    let mut state = State {
        index: HashMap::new(),
        low: HashMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        out: Vec::new(),
    };
    for &node in next.keys() {
        if !state.index.contains_key(node) {
            visit(node, next, &mut state);
        }
    }
    state.out
}

#[cfg(test)]
mod checker {
    use super::*;

    fn layout(files: &[(&str, &str)]) -> Layout {
        let files: Vec<(String, String)> = files
            .iter()
            .map(|(path, text)| (path.to_string(), text.to_string()))
            .collect();
        Layout::of_files(&files)
    }

    fn arrows(layout: &Layout) -> Vec<String> {
        layout
            .file_arrows()
            .into_iter()
            .map(|(from, to)| format!("{from} -> {to}"))
            .collect()
    }

    #[test]
    fn a_circle_across_folders_is_found_with_its_files() {
        let layout = layout(&[
            (
                "main.rs",
                "mod a;\nmod b;\nmod top;\nfn main() { top::go(); }",
            ),
            ("a/mod.rs", "mod x;\npub mod y;"),
            ("a/x.rs", "use crate::b::y::Thing;\nfn f(_: Thing) {}"),
            ("a/y.rs", "pub fn g() {}"),
            ("b/mod.rs", "pub mod y;"),
            ("b/y.rs", "pub struct Thing;\nfn f() { crate::a::y::g(); }"),
            ("top.rs", "pub fn go() { crate::b::y::Thing; }"),
        ]);
        let cycles = layout.cycles();
        assert_eq!(cycles.len(), 1, "{cycles:?}");
        assert_eq!(cycles[0].nodes, ["a/", "b/"]);
        assert_eq!(
            cycles[0].files.iter().collect::<Vec<_>>(),
            ["a/x.rs", "a/y.rs", "b/y.rs"]
        );
        assert_eq!(cycles[0].arrows, 2);
        // main.rs -> top.rs, top.rs -> b/, a/ -> b/, b/ -> a/.
        assert_eq!(layout.node_arrows().len(), 4);
    }

    #[test]
    fn arrows_that_point_one_way_make_no_circle() {
        let layout = layout(&[
            ("lib.rs", "mod a;\nmod b;\npub use a::x::Api;"),
            ("a/mod.rs", "pub mod x;\nmod y;"),
            // A circle inside one folder is that folder's own business.
            ("a/x.rs", "use super::y::helper;\npub struct Api;"),
            (
                "a/y.rs",
                "pub fn helper() { super::x::Api; crate::b::low(); }",
            ),
            ("b/mod.rs", "pub fn low() {}"),
        ]);
        assert!(layout.cycles().is_empty(), "{:?}", layout.cycles());
        assert_eq!(
            arrows(&layout),
            [
                "a/x.rs -> a/y.rs",
                "a/y.rs -> a/x.rs",
                "a/y.rs -> b/mod.rs",
                "lib.rs -> a/x.rs"
            ]
        );
    }

    #[test]
    fn comments_strings_and_mod_declarations_are_not_imports() {
        let layout = layout(&[
            ("main.rs", "mod a;\nmod b;"),
            ("a/mod.rs", "pub fn f() { crate::b::g(); }"),
            (
                "b/mod.rs",
                r####"//! See [`crate::a::f`].
mod inner;
// use crate::a::f;
/* crate::a::f(); /* nested */ crate::a::f(); */
/// Calls [`super::a::f`].
pub fn g<'a>(s: &'a str) -> char {
    let _ = ("crate::a::f", r#"crate::a::f "quoted""#, b"crate::a::f", s);
    '"'
}
"####,
            ),
            ("b/inner.rs", "fn h() { super::g(); }"),
        ]);
        assert_eq!(
            arrows(&layout),
            ["a/mod.rs -> b/mod.rs", "b/inner.rs -> b/mod.rs"]
        );
        assert!(layout.cycles().is_empty());
    }

    #[test]
    fn super_in_an_inline_module_and_a_re_exported_item_lead_to_their_files() {
        let layout = layout(&[
            (
                "lib.rs",
                "mod error;\nmod demo;\nmod client;\npub use error::Error;\npub use redis;\n\
                 pub use tokio::time as clock;",
            ),
            (
                "error.rs",
                "pub enum Error {}\n#[cfg(test)]\nmod tests { use super::*; }",
            ),
            // `demo.rs` belongs with `demo/`.
            ("demo.rs", "mod buyer;\nfn f() { buyer::buy(); }"),
            (
                "demo/buyer.rs",
                "use crate::Error;\npub fn buy() {}\nmod tests { use super::super::f; }",
            ),
            // Another crate's items, re-exported at the root: no arrow to `lib.rs`.
            (
                "client.rs",
                "fn f() -> Result<(), crate::Error> { crate::redis::cmd(); crate::clock::sleep(); Ok(()) }",
            ),
        ]);
        assert_eq!(
            arrows(&layout),
            [
                "client.rs -> error.rs",
                "demo.rs -> demo/buyer.rs",
                "demo/buyer.rs -> demo.rs",
                "demo/buyer.rs -> error.rs",
                "lib.rs -> error.rs"
            ]
        );
        assert_eq!(layout.node("demo.rs"), "demo/");
        assert_eq!(layout.node("demo/buyer.rs"), "demo/");
        assert!(layout.cycles().is_empty());
    }
}
