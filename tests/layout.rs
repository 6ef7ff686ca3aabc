//! The source tree keeps its shape: no circle of imports crosses folders. Every `use` of
//! the non-test code of each crate is resolved to the file that defines what it names
//! (following re-exports), and the files that import each other in a circle must all lie
//! in one folder. A folder that imports another one that imports it back has no order to
//! be read in, and is where a change in one generator breaks another.
//!
//! Macro expansions are not read, but the generator list's are what matter: each entry
//! names its folder's parameters (expanded in `generators/section.rs` and
//! `generators/trained.rs`), its `check` (`generators/mod.rs`) and its coordinator's side
//! (`coordinator/src/job.rs`), and those references are added as imports of those files.

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};

use syn::visit::Visit;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

/// The crates' roots, each a tree of modules.
const ROOTS: &[&str] = &[
    "proto/src/lib.rs",
    "shared/src/lib.rs",
    "shared/privacy/src/lib.rs",
    "coordinator/src/lib.rs",
    "coordinator/src/main.rs",
    "worker/src/lib.rs",
    "worker/src/main.rs",
];

/// A module of one crate: its file (an inline module shares its parent's), its child
/// modules and the names its `use` items bring in (name → the path as written; `None`
/// for a glob, keyed by the glob's path).
#[derive(Default)]
struct Module {
    file: PathBuf,
    children: BTreeSet<String>,
    imports: HashMap<String, Vec<String>>,
    /// Every `use` of the module, with where it is written.
    uses: Vec<Vec<String>>,
}

/// A crate's modules by path (the root is `[]`).
struct Crate {
    modules: HashMap<Vec<String>, Module>,
}

fn is_test(attrs: &[syn::Attribute]) -> bool {
    attrs
        .iter()
        .any(|a| a.path().is_ident("cfg") && a.parse_args::<syn::Meta>().is_ok_and(|m| m.path().is_ident("test")))
}

/// The paths a use tree names: (segments, the name it binds, or `None` for a glob).
fn expand(tree: &syn::UseTree, prefix: &[String], out: &mut Vec<(Vec<String>, Option<String>)>) {
    let with = |name: String| [prefix, &[name]].concat();
    match tree {
        syn::UseTree::Path(p) => expand(&p.tree, &with(p.ident.to_string()), out),
        syn::UseTree::Name(n) if n.ident == "self" => out.push((prefix.to_vec(), prefix.last().cloned())),
        syn::UseTree::Name(n) => out.push((with(n.ident.to_string()), Some(n.ident.to_string()))),
        syn::UseTree::Rename(r) if r.ident == "self" => out.push((prefix.to_vec(), Some(r.rename.to_string()))),
        syn::UseTree::Rename(r) => out.push((with(r.ident.to_string()), Some(r.rename.to_string()))),
        syn::UseTree::Glob(_) => out.push((prefix.to_vec(), None)),
        syn::UseTree::Group(g) => g.items.iter().for_each(|t| expand(t, prefix, out)),
    }
}

/// Collects a file's modules: its `use` items (also those inside functions), its inline
/// modules and, recursively, the files of its out-of-line ones. Test code is left out.
struct Collector<'a> {
    modules: &'a mut HashMap<Vec<String>, Module>,
    file: PathBuf,
    path: Vec<String>,
}

impl<'ast> Visit<'ast> for Collector<'_> {
    fn visit_item_use(&mut self, item: &'ast syn::ItemUse) {
        if is_test(&item.attrs) {
            return;
        }
        let mut names = Vec::new();
        let root = if item.leading_colon.is_some() { vec![String::new()] } else { Vec::new() };
        expand(&item.tree, &root, &mut names);
        let module = self.modules.get_mut(&self.path).unwrap();
        for (path, name) in names {
            if let Some(name) = name {
                module.imports.insert(name, path.clone());
            }
            module.uses.push(path);
        }
    }

    fn visit_item_mod(&mut self, item: &'ast syn::ItemMod) {
        if is_test(&item.attrs) {
            return;
        }
        let name = item.ident.to_string();
        self.modules.get_mut(&self.path).unwrap().children.insert(name.clone());
        let path = [self.path.clone(), vec![name.clone()]].concat();
        match &item.content {
            Some((_, items)) => {
                self.modules.insert(path.clone(), Module { file: self.file.clone(), ..Module::default() });
                let mut inner = Collector { modules: self.modules, file: self.file.clone(), path };
                items.iter().for_each(|i| inner.visit_item(i));
            }
            None => {
                let stem = self.file.file_stem().unwrap().to_str().unwrap();
                let dir = self.file.parent().unwrap();
                let dir = if ["mod", "lib", "main"].contains(&stem) { dir.to_path_buf() } else { dir.join(stem) };
                let file = [dir.join(format!("{name}.rs")), dir.join(&name).join("mod.rs")]
                    .into_iter()
                    .find(|f| f.exists())
                    .unwrap_or_else(|| panic!("module {name} of {} has no file", self.file.display()));
                collect(self.modules, file, path);
            }
        }
    }
}

fn collect(modules: &mut HashMap<Vec<String>, Module>, file: PathBuf, path: Vec<String>) {
    let text = std::fs::read_to_string(&file).unwrap();
    let parsed = syn::parse_file(&text).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    modules.insert(path.clone(), Module { file: file.clone(), ..Module::default() });
    let mut collector = Collector { modules, file, path };
    collector.visit_file(&parsed);
}

impl Crate {
    fn read(root: &Path) -> Self {
        let mut modules = HashMap::new();
        collect(&mut modules, root.to_path_buf(), Vec::new());
        Crate { modules }
    }

    /// The file that defines what `path`, written in module `at`, names: `None` outside
    /// the crate.
    fn resolve(&self, at: &[String], path: &[String], depth: usize) -> Option<&Path> {
        if depth > 16 {
            return None;
        }
        let (mut module, mut rest) = (at.to_vec(), path);
        match rest.first().map(String::as_str) {
            Some("crate") => (module, rest) = (Vec::new(), &rest[1..]),
            Some("self") => rest = &rest[1..],
            Some("super") => {
                while rest.first().is_some_and(|s| s == "super") {
                    module.pop();
                    rest = &rest[1..];
                }
            }
            // A child module or a name the module imports; anything else is another crate.
            Some(first)
                if self.modules[at].children.contains(first) || self.modules[at].imports.contains_key(first) => {}
            _ => return None,
        }
        for (i, segment) in rest.iter().enumerate() {
            let here = &self.modules[&module];
            if here.children.contains(segment) {
                module.push(segment.clone());
            } else if let Some(imported) = here.imports.get(segment) {
                let followed = [imported.clone(), rest[i + 1..].to_vec()].concat();
                return self.resolve(&module, &followed, depth + 1).or(Some(&here.file));
            } else {
                return Some(&here.file);
            }
        }
        Some(&self.modules[&module].file)
    }

    /// File → the files its `use` items name.
    fn imports(&self) -> Vec<(PathBuf, PathBuf)> {
        let mut edges = Vec::new();
        for (at, module) in &self.modules {
            for path in &module.uses {
                if let Some(target) = self.resolve(at, path, 0)
                    && target != module.file
                {
                    edges.push((module.file.clone(), target.to_path_buf()));
                }
            }
        }
        edges
    }
}

/// The strongly connected components of a graph (Tarjan), those of more than one node.
fn circles(edges: &[(PathBuf, PathBuf)]) -> Vec<Vec<PathBuf>> {
    let nodes: BTreeSet<&PathBuf> = edges.iter().flat_map(|(a, b)| [a, b]).collect();
    let index_of: HashMap<&PathBuf, usize> = nodes.iter().enumerate().map(|(i, n)| (*n, i)).collect();
    let names: Vec<&PathBuf> = nodes.into_iter().collect();
    let mut next = vec![Vec::new(); names.len()];
    for (a, b) in edges {
        next[index_of[a]].push(index_of[b]);
    }
    struct State {
        index: Vec<Option<usize>>,
        low: Vec<usize>,
        on_stack: Vec<bool>,
        stack: Vec<usize>,
        counter: usize,
        found: Vec<Vec<usize>>,
    }
    fn visit(v: usize, next: &[Vec<usize>], s: &mut State) {
        s.index[v] = Some(s.counter);
        s.low[v] = s.counter;
        s.counter += 1;
        s.stack.push(v);
        s.on_stack[v] = true;
        for &w in &next[v] {
            match s.index[w] {
                None => {
                    visit(w, next, s);
                    s.low[v] = s.low[v].min(s.low[w]);
                }
                Some(i) if s.on_stack[w] => s.low[v] = s.low[v].min(i),
                Some(_) => {}
            }
        }
        if Some(s.low[v]) == s.index[v] {
            let mut component = Vec::new();
            while let Some(w) = s.stack.pop() {
                s.on_stack[w] = false;
                component.push(w);
                if w == v {
                    break;
                }
            }
            if component.len() > 1 {
                s.found.push(component);
            }
        }
    }
    let n = names.len();
    let mut state = State {
        index: vec![None; n],
        low: vec![0; n],
        on_stack: vec![false; n],
        stack: Vec::new(),
        counter: 0,
        found: Vec::new(),
    };
    for v in 0..n {
        if state.index[v].is_none() {
            visit(v, &next, &mut state);
        }
    }
    state.found.into_iter().map(|c| c.into_iter().map(|i| names[i].clone()).collect()).collect()
}

/// The generator list's entries: (name, parameters, coordinator's side).
fn generator_list(repo: &Path) -> Vec<(String, String, String)> {
    let text = std::fs::read_to_string(repo.join("shared/src/generators/mod.rs")).unwrap();
    let body = text.split("$then! {").nth(1).expect("the generator list").split('}').next().unwrap();
    body.lines()
        .filter_map(|line| {
            let (name, rest) = line.trim().split_once(": ")?;
            let (_, rest) = rest.split_once('(')?;
            let (params, rest) = rest.split_once(") by ")?;
            let side = rest.split([',', ';']).next()?;
            Some((name.to_string(), params.to_string(), side.trim().to_string()))
        })
        .collect()
}

/// The imports the generator list's expansions make in `krate` (rooted at `root`).
fn list_imports(repo: &Path, root: &str, krate: &Crate) -> Vec<(PathBuf, PathBuf)> {
    let list = generator_list(repo);
    let named = |from: &str, name: &str, item: &str| {
        let path = ["crate", "generators", name, item].map(String::from);
        let target = krate.resolve(&[], &path, 0).unwrap_or_else(|| panic!("{path:?} resolves nowhere"));
        (repo.join(from), target.to_path_buf())
    };
    match root {
        "shared/src/lib.rs" => list
            .iter()
            .flat_map(|(name, params, _)| {
                [
                    named("shared/src/generators/section.rs", name, params),
                    named("shared/src/generators/mod.rs", name, "check"),
                ]
            })
            .collect(),
        "coordinator/src/lib.rs" => {
            list.iter().map(|(name, _, side)| named("coordinator/src/job.rs", name, side)).collect()
        }
        _ => Vec::new(),
    }
}

fn folder(file: &Path) -> &Path {
    file.parent().unwrap()
}

#[test]
fn no_circle_of_imports_crosses_folders() {
    let repo = repo();
    let mut crossing = Vec::new();
    let mut files = 0;
    for root in ROOTS {
        let krate = Crate::read(&repo.join(root));
        files += krate.modules.values().map(|m| &m.file).collect::<BTreeSet<_>>().len();
        let mut imports = krate.imports();
        imports.extend(list_imports(&repo, root, &krate));
        for circle in circles(&imports) {
            let folders: BTreeSet<&Path> = circle.iter().map(|f| folder(f)).collect();
            if folders.len() > 1 {
                let mut named: Vec<String> =
                    circle.iter().map(|f| f.strip_prefix(&repo).unwrap().display().to_string()).collect();
                named.sort();
                crossing.push(named.join(", "));
            }
        }
    }
    assert!(files > 150, "read {files} files: the walk missed the tree");
    let listed = generator_list(&repo).len();
    assert_eq!(
        listed,
        rhosynth_shared::generators::GeneratorName::ALL.len(),
        "the generator list as the test reads it"
    );
    assert!(crossing.is_empty(), "import circles across folders:\n{}", crossing.join("\n"));
}

/// The resolver follows re-exports to the file that defines a name, and finds a circle.
#[test]
fn the_resolver_follows_re_exports_and_finds_circles() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path();
    std::fs::create_dir_all(src.join("a")).unwrap();
    std::fs::write(src.join("lib.rs"), "pub mod a;\npub mod b;\n").unwrap();
    std::fs::write(src.join("a/mod.rs"), "mod inner;\npub use inner::Thing;\n").unwrap();
    std::fs::write(src.join("a/inner.rs"), "use crate::b::Other;\npub struct Thing;\n").unwrap();
    std::fs::write(src.join("b.rs"), "use crate::a::Thing;\npub struct Other;\nfn f() { use std::fmt; }\n").unwrap();
    let krate = Crate::read(&src.join("lib.rs"));
    let edges = krate.imports();
    let b_to = edges.iter().filter(|(from, _)| from.ends_with("b.rs")).map(|(_, to)| to.clone()).collect::<Vec<_>>();
    assert_eq!(b_to, vec![src.join("a/inner.rs")], "b's import resolves past the re-export");
    let found = circles(&edges);
    assert_eq!(found.len(), 1);
    let folders: BTreeSet<&Path> = found[0].iter().map(|f| folder(f)).collect();
    assert_eq!(folders.len(), 2, "{found:?}");
}
