//! Both crates' modules import one way: no circle of `use` edges between the modules of
//! outbox-relay or outbox-operator, nor between their top-level folders (the relay's table,
//! broker, protocol, config, runtime, ...; the operator's crd, reconcile, runtime).
//!
//! The check reads the sources with `syn` (seconds, where installing cargo-modules took 8-15
//! minutes): it walks the module tree from `src/lib.rs`, skips `#[cfg(test)]` code, and draws
//! an edge from a module to every module it names, in a `use` item or in a path in its code
//! that starts with `crate`, `super` or `self` (or with a child module or a name a `use`
//! brought in). A path is charged to the longest prefix that is a module, and through the
//! re-exports (`pub use`) of that module to the module that defines the name, as cargo-modules
//! does. Unit tests at the end run the checker on planted source trees.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};

use petgraph::algo::tarjan_scc;
use petgraph::graph::{DiGraph, NodeIndex};
use syn::buffer::{Cursor, TokenBuffer};
use syn::punctuated::Punctuated;
use syn::visit::{self, Visit};
use syn::{Attribute, ImplItem, Item, Meta, TraitItem, UseTree};

/// Below this many edges a crate's check would pass without looking at anything: the walk or
/// the path resolution has gone wrong. The relay has about 190, the operator about 85.
const MIN_EDGES: usize = 50;

/// How many re-exports or imports one path is followed through; real chains are one or two.
const MAX_HOPS: usize = 8;

#[test]
fn relay_modules_import_one_way() {
    check_crate("relay");
}

#[test]
fn operator_modules_import_one_way() {
    check_crate("operator");
}

fn check_crate(dir: &str) {
    let src = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(dir)
        .join("src");
    match check(&src, MIN_EDGES) {
        Ok(summary) => println!(
            "imports: {} use edges between {} modules of {dir}, no circle",
            summary.edges.len(),
            summary.modules
        ),
        Err(message) => panic!("imports of {dir}: {message}"),
    }
}

/// What a passing check saw.
#[derive(Debug)]
struct Summary {
    modules: usize,
    /// `(from, to)` module paths, each with the first path that drew it.
    edges: BTreeMap<(String, String), String>,
}

/// Reads the crate under `src` and fails, with a message naming the circle, when its modules
/// or its top-level folders import each other in a circle, or when it finds fewer than
/// `min_edges` edges.
fn check(src: &Path, min_edges: usize) -> Result<Summary, String> {
    let krate = Crate::load(src)?;
    let edges = krate.edges();
    if edges.len() < min_edges {
        return Err(format!(
            "only {} use edges found between the modules under {} (at least {min_edges} \
             expected); the check would pass vacuously",
            edges.len(),
            src.display()
        ));
    }
    let modules: Vec<String> = krate.modules.iter().map(|m| m.name()).collect();
    if let Some(circle) = find_circles(&modules, &edges) {
        return Err(format!("modules import each other in a circle:\n{circle}"));
    }

    // Each module stands for its top-level folder; edges inside one folder drop out.
    let mut folder_edges = BTreeMap::new();
    for ((from, to), why) in &edges {
        let (from, to) = (top_level(from), top_level(to));
        if from != to {
            folder_edges
                .entry((from, to))
                .or_insert_with(|| why.clone());
        }
    }
    let folders: BTreeSet<String> = modules.iter().map(|m| top_level(m)).collect();
    let folders: Vec<String> = folders.into_iter().collect();
    if let Some(circle) = find_circles(&folders, &folder_edges) {
        return Err(format!(
            "top-level modules import each other in a circle:\n{circle}"
        ));
    }
    Ok(Summary {
        modules: modules.len(),
        edges,
    })
}

/// `crate::table::health` -> `crate::table`; the crate root stays `crate`.
fn top_level(module: &str) -> String {
    module.split("::").take(2).collect::<Vec<_>>().join("::")
}

/// Every circle, one per strongly connected component (Tarjan's), as `a -> b -> c -> a` with
/// the path behind each step; None when there is none.
fn find_circles(nodes: &[String], edges: &BTreeMap<(String, String), String>) -> Option<String> {
    let mut graph = DiGraph::<&str, ()>::new();
    let index: BTreeMap<&str, NodeIndex> = nodes
        .iter()
        .map(|n| (n.as_str(), graph.add_node(n.as_str())))
        .collect();
    for (from, to) in edges.keys() {
        graph.add_edge(index[from.as_str()], index[to.as_str()], ());
    }
    let mut components: Vec<Vec<&str>> = tarjan_scc(&graph)
        .into_iter()
        .filter(|c| c.len() > 1)
        .map(|c| {
            let mut names: Vec<&str> = c.into_iter().map(|i| graph[i]).collect();
            names.sort_unstable();
            names
        })
        .collect();
    if components.is_empty() {
        return None;
    }
    components.sort();
    let described: Vec<String> = components
        .iter()
        .map(|component| describe_circle(component, edges))
        .collect();
    Some(described.join("\n"))
}

/// The shortest circle from the component's first module back to itself, inside the component.
fn describe_circle(component: &[&str], edges: &BTreeMap<(String, String), String>) -> String {
    let start = component[0];
    let inside: BTreeSet<&str> = component.iter().copied().collect();
    let mut came_from: BTreeMap<&str, &str> = BTreeMap::new();
    let mut queue = VecDeque::from([start]);
    let mut last = None;
    while let Some(at) = queue.pop_front() {
        let next = edges
            .keys()
            .filter(|(from, to)| from == at && inside.contains(to.as_str()))
            .map(|(_, to)| to.as_str());
        for to in next {
            if to == start {
                last = Some(at);
                queue.clear();
                break;
            }
            if !came_from.contains_key(to) {
                came_from.insert(to, at);
                queue.push_back(to);
            }
        }
    }
    let mut circle = vec![start];
    let mut at = last.expect("a strongly connected component has a circle");
    while at != start {
        circle.push(at);
        at = came_from[at];
    }
    circle[1..].reverse();
    circle.push(start);

    let mut message = circle.join(" -> ");
    for step in circle.windows(2) {
        let why = &edges[&(step[0].to_string(), step[1].to_string())];
        let _ = write!(message, "\n  {} -> {}: {why}", step[0], step[1]);
    }
    if component.len() > circle.len() - 1 {
        let _ = write!(
            message,
            "\n  (all the modules of this circle: {})",
            component.join(", ")
        );
    }
    message
}

/// One module: a file's items or an inline `mod x { ... }`'s.
struct Module {
    /// `["crate", "table", "health"]`.
    path: Vec<String>,
    file: PathBuf,
    items: Vec<Item>,
    children: BTreeSet<String>,
    /// Names of the items it defines (functions, types, constants, traits, macros).
    defined: BTreeSet<String>,
    /// Names its `use` items bring in, with the path as written (`use a::b as c`: c -> a::b).
    imports: BTreeMap<String, Vec<String>>,
    /// The paths of its glob imports (`use a::*`).
    globs: Vec<Vec<String>>,
}

impl Module {
    fn name(&self) -> String {
        self.path.join("::")
    }
}

struct Crate {
    root: PathBuf,
    modules: Vec<Module>,
    by_path: BTreeMap<Vec<String>, usize>,
}

impl Crate {
    fn load(src: &Path) -> Result<Crate, String> {
        let lib = src.join("lib.rs");
        let file = parse(&lib)?;
        let mut modules = Vec::new();
        walk(
            vec!["crate".to_string()],
            &lib,
            file.items,
            src.to_path_buf(),
            src,
            &mut modules,
        )?;
        let by_path = modules
            .iter()
            .enumerate()
            .map(|(i, m)| (m.path.clone(), i))
            .collect();
        Ok(Crate {
            root: src.to_path_buf(),
            modules,
            by_path,
        })
    }

    /// Every edge between two different modules, each with the first path that drew it.
    fn edges(&self) -> BTreeMap<(String, String), String> {
        let mut edges = BTreeMap::new();
        for (at, module) in self.modules.iter().enumerate() {
            let mut collector = PathCollector { paths: Vec::new() };
            for item in &module.items {
                collector.visit_item(item);
            }
            let file = module
                .file
                .strip_prefix(self.root.parent().unwrap_or(&self.root))
                .unwrap_or(&module.file)
                .display()
                .to_string();
            for written in collector.paths {
                let Some(absolute) = self.absolute(at, &written, 0) else {
                    continue;
                };
                let Some(target) = self.target(&absolute, 0) else {
                    continue;
                };
                if target != at {
                    edges
                        .entry((module.name(), self.modules[target].name()))
                        .or_insert_with(|| format!("`{}` in {file}", written.join("::")));
                }
            }
        }
        edges
    }

    /// The path as seen from the crate root (`["crate", ...]`), or None for a path outside the
    /// crate (another crate, a local item, a generic parameter).
    fn absolute(&self, at: usize, written: &[String], hops: usize) -> Option<Vec<String>> {
        let module = &self.modules[at];
        let first = written.first()?;
        match first.as_str() {
            "crate" => Some(written.to_vec()),
            "self" | "super" => {
                let mut path = module.path.clone();
                let mut rest = written;
                while let Some(segment) = rest.first() {
                    match segment.as_str() {
                        "self" => {}
                        "super" if path.len() > 1 => {
                            path.pop();
                        }
                        "super" => return None,
                        _ => break,
                    }
                    rest = &rest[1..];
                }
                path.extend(rest.iter().cloned());
                Some(path)
            }
            _ if module.children.contains(first) => {
                let mut path = module.path.clone();
                path.extend(written.iter().cloned());
                Some(path)
            }
            _ if hops < MAX_HOPS => {
                // A name a `use` of this module brought in (uniform paths: `use a::b; b::c`).
                let imported = module.imports.get(first)?;
                if imported.as_slice() == written {
                    return None;
                }
                let mut path = self.absolute(at, imported, hops + 1)?;
                path.extend(written[1..].iter().cloned());
                Some(path)
            }
            _ => None,
        }
    }

    /// The module that defines what `path` names: the longest prefix that is a module, then,
    /// when the next segment is a name that module re-exports, the module it comes from.
    fn target(&self, path: &[String], hops: usize) -> Option<usize> {
        let (length, at) = (1..=path.len())
            .rev()
            .find_map(|n| Some((n, *self.by_path.get(&path[..n])?)))?;
        let Some(next) = path.get(length) else {
            return Some(at);
        };
        if hops >= MAX_HOPS {
            return Some(at);
        }
        let module = &self.modules[at];
        if let Some(imported) = module.imports.get(next) {
            // Re-exported: `crate::database::DatabaseTarget` where database has
            // `pub use target::DatabaseTarget;` is charged to database::target. A name another
            // crate defines (`pub use outbox_relay::config::LogFormat`) is charged to no module
            // of this one, as a path into that crate would be.
            let mut through = imported.clone();
            through.extend(path[length + 1..].iter().cloned());
            return match self.absolute(at, &through, hops + 1) {
                Some(absolute) => self.target(&absolute, hops + 1).or(Some(at)),
                None if module.defined.contains(&through[0]) => Some(at),
                None => None,
            };
        }
        if !module.defined.contains(next) {
            for glob in &module.globs {
                let Some(base) = self.absolute(at, glob, 0) else {
                    continue;
                };
                let Some(from) = self.target(&base, hops + 1) else {
                    continue;
                };
                let source = &self.modules[from];
                if from != at
                    && (source.defined.contains(next)
                        || source.imports.contains_key(next)
                        || source.children.contains(next))
                {
                    let mut through = base;
                    through.extend(path[length..].iter().cloned());
                    return self.target(&through, hops + 1);
                }
            }
        }
        Some(at)
    }
}

fn parse(file: &Path) -> Result<syn::File, String> {
    let text =
        fs::read_to_string(file).map_err(|e| format!("cannot read {}: {e}", file.display()))?;
    syn::parse_file(&text).map_err(|e| format!("cannot parse {}: {e}", file.display()))
}

/// Adds the module `path` (whose items are `items`, in `file`) and, depth first, its children.
/// `child_dir` is where its `mod x;` files live; `decl_dir` is where a `#[path]` is relative to.
fn walk(
    path: Vec<String>,
    file: &Path,
    items: Vec<Item>,
    child_dir: PathBuf,
    decl_dir: &Path,
    modules: &mut Vec<Module>,
) -> Result<(), String> {
    let mut module = Module {
        path: path.clone(),
        file: file.to_path_buf(),
        items: Vec::new(),
        children: BTreeSet::new(),
        defined: BTreeSet::new(),
        imports: BTreeMap::new(),
        globs: Vec::new(),
    };
    let mut items = items;
    for item in &mut items {
        if is_cfg_test(item_attrs(item)) {
            continue;
        }
        match item {
            Item::Mod(m) => {
                let name = unraw(&m.ident);
                let mut child = path.clone();
                child.push(name.clone());
                module.children.insert(name.clone());
                match &mut m.content {
                    // Taken, not cloned: the visitor skips `mod` items, and syn's Clone impls
                    // are a feature this check does without.
                    Some((_, inner)) => walk(
                        child,
                        file,
                        std::mem::take(inner),
                        child_dir.join(&name),
                        &child_dir.join(&name),
                        modules,
                    )?,
                    None => {
                        let candidates = match path_attr(&m.attrs) {
                            Some(explicit) => vec![decl_dir.join(explicit)],
                            None => vec![
                                child_dir.join(format!("{name}.rs")),
                                child_dir.join(&name).join("mod.rs"),
                            ],
                        };
                        let Some(found) = candidates.iter().find(|c| c.is_file()) else {
                            return Err(format!(
                                "`mod {name};` in {} has no file: looked for {}",
                                file.display(),
                                candidates
                                    .iter()
                                    .map(|c| c.display().to_string())
                                    .collect::<Vec<_>>()
                                    .join(" and ")
                            ));
                        };
                        let parsed = parse(found)?;
                        let dir = found.parent().unwrap_or(Path::new(".")).to_path_buf();
                        let grandchildren = if found.file_name().is_some_and(|n| n == "mod.rs") {
                            dir.clone()
                        } else {
                            found.with_extension("")
                        };
                        walk(child, found, parsed.items, grandchildren, &dir, modules)?;
                    }
                }
            }
            Item::Use(u) if u.leading_colon.is_none() => {
                let mut flat = Vec::new();
                flatten_use(&u.tree, Vec::new(), &mut flat);
                for (written, binding) in flat {
                    match binding {
                        Some(name) => {
                            module.imports.insert(name, written);
                        }
                        None => module.globs.push(written),
                    }
                }
            }
            _ => {
                if let Some(name) = defined_name(item) {
                    module.defined.insert(name);
                }
            }
        }
    }
    module.items = items;
    modules.push(module);
    Ok(())
}

/// Flattens a use tree into `(path, Some(name bound))` entries, or `(path, None)` for a glob.
fn flatten_use(tree: &UseTree, prefix: Vec<String>, out: &mut Vec<(Vec<String>, Option<String>)>) {
    match tree {
        UseTree::Path(p) => {
            let mut prefix = prefix;
            prefix.push(unraw(&p.ident));
            flatten_use(&p.tree, prefix, out);
        }
        UseTree::Name(n) => {
            let name = unraw(&n.ident);
            if name == "self" {
                // `use a::b::{self}` binds b.
                if let Some(last) = prefix.last().cloned() {
                    out.push((prefix, Some(last)));
                }
            } else {
                let mut path = prefix;
                path.push(name.clone());
                out.push((path, Some(name)));
            }
        }
        UseTree::Rename(r) => {
            let name = unraw(&r.ident);
            let mut path = prefix;
            if name != "self" {
                path.push(name);
            }
            out.push((path, Some(unraw(&r.rename))));
        }
        UseTree::Glob(_) => out.push((prefix, None)),
        UseTree::Group(g) => {
            for tree in &g.items {
                flatten_use(tree, prefix.clone(), out);
            }
        }
    }
}

/// Gathers, from one module's items (not its child modules', nor `#[cfg(test)]` code), every
/// path that may name a module of the crate: the paths of `use` items, the paths in code, and
/// `crate::`/`super::`/`self::` chains inside macro calls.
struct PathCollector {
    paths: Vec<Vec<String>>,
}

impl<'ast> Visit<'ast> for PathCollector {
    fn visit_item(&mut self, item: &'ast Item) {
        // A child module is a module of its own, walked on its own.
        if is_cfg_test(item_attrs(item)) || matches!(item, Item::Mod(_)) {
            return;
        }
        visit::visit_item(self, item);
    }

    fn visit_impl_item(&mut self, item: &'ast ImplItem) {
        let attrs = match item {
            ImplItem::Const(i) => &i.attrs,
            ImplItem::Fn(i) => &i.attrs,
            ImplItem::Type(i) => &i.attrs,
            ImplItem::Macro(i) => &i.attrs,
            _ => return visit::visit_impl_item(self, item),
        };
        if !is_cfg_test(attrs) {
            visit::visit_impl_item(self, item);
        }
    }

    fn visit_trait_item(&mut self, item: &'ast TraitItem) {
        let attrs = match item {
            TraitItem::Const(i) => &i.attrs,
            TraitItem::Fn(i) => &i.attrs,
            TraitItem::Type(i) => &i.attrs,
            TraitItem::Macro(i) => &i.attrs,
            _ => return visit::visit_trait_item(self, item),
        };
        if !is_cfg_test(attrs) {
            visit::visit_trait_item(self, item);
        }
    }

    fn visit_item_use(&mut self, item: &'ast syn::ItemUse) {
        if item.leading_colon.is_some() {
            return; // `use ::other_crate::...`
        }
        let mut flat = Vec::new();
        flatten_use(&item.tree, Vec::new(), &mut flat);
        self.paths.extend(flat.into_iter().map(|(path, _)| path));
    }

    fn visit_visibility(&mut self, _: &'ast syn::Visibility) {
        // `pub(crate)`, `pub(super)`: a visibility, not a use of the parent or the root.
    }

    fn visit_path(&mut self, path: &'ast syn::Path) {
        // A one-segment path names a local item or one a `use` brought in (which drew its
        // edge already); `::name` is another crate.
        if path.leading_colon.is_none() && path.segments.len() > 1 {
            self.paths
                .push(path.segments.iter().map(|s| unraw(&s.ident)).collect());
        }
        visit::visit_path(self, path);
    }

    fn visit_macro(&mut self, mac: &'ast syn::Macro) {
        let tokens = TokenBuffer::new2(mac.tokens.clone());
        scan_tokens(tokens.begin(), &mut self.paths);
        visit::visit_macro(self, mac);
    }
}

/// Finds `crate::a::b`, `super::a` and `self::a` chains in a macro call's tokens, which syn
/// leaves unparsed (`matches!(x, crate::a::B)`, `format!("{}", super::f())`).
fn scan_tokens(mut cursor: Cursor<'_>, out: &mut Vec<Vec<String>>) {
    while !cursor.eof() {
        if let Some((inside, _, _, after)) = cursor.any_group() {
            scan_tokens(inside, out);
            cursor = after;
        } else if let Some((ident, after)) = cursor.ident() {
            cursor = after;
            let first = ident.to_string();
            if matches!(first.as_str(), "crate" | "super" | "self") {
                let mut path = vec![first];
                while let Some((segment, after)) = path_step(cursor) {
                    path.push(segment);
                    cursor = after;
                }
                if path.len() > 1 {
                    out.push(path);
                }
            }
        } else if let Some((_, after)) = cursor.token_tree() {
            cursor = after;
        } else {
            break;
        }
    }
}

/// `::name` at `cursor`: the name and what follows it.
fn path_step(cursor: Cursor<'_>) -> Option<(String, Cursor<'_>)> {
    let (first, cursor) = cursor.punct()?;
    let (second, cursor) = cursor.punct()?;
    if first.as_char() != ':' || second.as_char() != ':' {
        return None;
    }
    let (ident, cursor) = cursor.ident()?;
    Some((unraw(&ident), cursor))
}

fn unraw(ident: &syn::Ident) -> String {
    let name = ident.to_string();
    name.strip_prefix("r#").map(str::to_string).unwrap_or(name)
}

/// True for `#[cfg(test)]` and `#[cfg(all(test, ...))]`: code that exists only in tests.
fn is_cfg_test(attrs: &[Attribute]) -> bool {
    fn test_only(meta: &Meta) -> bool {
        match meta {
            Meta::Path(p) => p.is_ident("test"),
            Meta::List(list) if list.path.is_ident("all") => list
                .parse_args_with(Punctuated::<Meta, syn::Token![,]>::parse_terminated)
                .is_ok_and(|all| all.iter().any(test_only)),
            _ => false,
        }
    }
    attrs.iter().any(|attr| {
        attr.path().is_ident("cfg") && attr.parse_args::<Meta>().is_ok_and(|m| test_only(&m))
    })
}

/// The file a `#[path = "..."]` attribute names.
fn path_attr(attrs: &[Attribute]) -> Option<String> {
    attrs.iter().find_map(|attr| match &attr.meta {
        Meta::NameValue(nv) if nv.path.is_ident("path") => match &nv.value {
            syn::Expr::Lit(syn::ExprLit {
                lit: syn::Lit::Str(s),
                ..
            }) => Some(s.value()),
            _ => None,
        },
        _ => None,
    })
}

fn item_attrs(item: &Item) -> &[Attribute] {
    match item {
        Item::Const(i) => &i.attrs,
        Item::Enum(i) => &i.attrs,
        Item::ExternCrate(i) => &i.attrs,
        Item::Fn(i) => &i.attrs,
        Item::ForeignMod(i) => &i.attrs,
        Item::Impl(i) => &i.attrs,
        Item::Macro(i) => &i.attrs,
        Item::Mod(i) => &i.attrs,
        Item::Static(i) => &i.attrs,
        Item::Struct(i) => &i.attrs,
        Item::Trait(i) => &i.attrs,
        Item::TraitAlias(i) => &i.attrs,
        Item::Type(i) => &i.attrs,
        Item::Union(i) => &i.attrs,
        Item::Use(i) => &i.attrs,
        _ => &[],
    }
}

fn defined_name(item: &Item) -> Option<String> {
    let ident = match item {
        Item::Const(i) => &i.ident,
        Item::Enum(i) => &i.ident,
        Item::Fn(i) => &i.sig.ident,
        Item::Macro(i) => i.ident.as_ref()?,
        Item::Static(i) => &i.ident,
        Item::Struct(i) => &i.ident,
        Item::Trait(i) => &i.ident,
        Item::TraitAlias(i) => &i.ident,
        Item::Type(i) => &i.ident,
        Item::Union(i) => &i.ident,
        _ => return None,
    };
    Some(unraw(ident))
}

/// The checker on small source trees written to a temporary folder.
mod planted {
    use super::*;

    /// A crate's `src/` in a temporary folder, removed when dropped.
    struct Tree(PathBuf);

    impl Tree {
        fn new(name: &str, files: &[(&str, &str)]) -> Tree {
            // Unique per tree: tests run in parallel, and two may plant trees of the same name.
            let dir = std::env::temp_dir().join(format!(
                "outbox-imports-{}-{name}-{}",
                std::process::id(),
                uuid::Uuid::new_v4().simple()
            ));
            let _ = fs::remove_dir_all(&dir);
            for (path, text) in files {
                let file = dir.join(path);
                fs::create_dir_all(file.parent().expect("a file has a folder")).unwrap();
                fs::write(file, text).unwrap();
            }
            Tree(dir)
        }

        fn check(&self) -> Result<Summary, String> {
            check(&self.0, 0)
        }
    }

    impl Drop for Tree {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    fn fails_with(tree: &Tree, expected: &str) {
        match tree.check() {
            Ok(summary) => panic!(
                "the check passed; expected it to fail with {expected:?}; edges: {:#?}",
                summary.edges.keys()
            ),
            Err(message) => assert!(
                message.contains(expected),
                "expected {expected:?} in:\n{message}"
            ),
        }
    }

    #[test]
    fn a_circle_between_two_files_fails() {
        let tree = Tree::new(
            "two-files",
            &[
                ("lib.rs", "pub mod a;\npub mod b;\n"),
                ("a.rs", "use crate::b::B;\npub struct A(pub B);\n"),
                (
                    "b.rs",
                    "pub struct B;\npub fn make() -> crate::a::A {\n    crate::a::A(B)\n}\n",
                ),
            ],
        );
        fails_with(
            &tree,
            "modules import each other in a circle:\ncrate::a -> crate::b -> crate::a",
        );
        fails_with(&tree, "crate::a -> crate::b: `crate::b::B` in ");
    }

    #[test]
    fn a_circle_through_a_re_export_names_the_defining_module() {
        // table names `crate::database::DatabaseTarget`, which database re-exports from its
        // child target; target names table. Charged to database itself, the circle would run
        // through database instead.
        let tree = Tree::new(
            "re-export",
            &[
                ("lib.rs", "pub mod database;\npub mod table;\n"),
                (
                    "database/mod.rs",
                    "mod target;\npub use target::DatabaseTarget;\n",
                ),
                (
                    "database/target.rs",
                    "pub struct DatabaseTarget {\n    pub table: crate::table::TableName,\n}\n",
                ),
                (
                    "table.rs",
                    "pub struct TableName;\npub fn target_of(_: &crate::database::DatabaseTarget) {}\n",
                ),
            ],
        );
        fails_with(
            &tree,
            "crate::database::target -> crate::table -> crate::database::target\n",
        );
    }

    #[test]
    fn a_circle_of_three_modules_in_one_folder_fails() {
        // The last step is a path inside a macro call, which syn leaves unparsed.
        let tree = Tree::new(
            "one-folder",
            &[
                ("lib.rs", "pub mod table;\n"),
                (
                    "table/mod.rs",
                    "pub mod health;\npub mod inspect;\npub mod migrate;\n",
                ),
                (
                    "table/health.rs",
                    "use crate::table::migrate::index_name;\n\
                     pub const SERVER_SQL: &str = \"\";\n\
                     pub fn measure() -> String {\n    index_name()\n}\n",
                ),
                (
                    "table/migrate.rs",
                    "use super::inspect::{Shape, inspect};\n\
                     pub fn index_name() -> String {\n    String::new()\n}\n\
                     pub fn migrate() -> Shape {\n    inspect()\n}\n",
                ),
                (
                    "table/inspect.rs",
                    "pub struct Shape;\n\
                     pub fn inspect() -> Shape {\n    \
                         let _ = format!(\"{}\", super::health::SERVER_SQL);\n    Shape\n}\n",
                ),
            ],
        );
        fails_with(
            &tree,
            "crate::table::health -> crate::table::migrate -> crate::table::inspect -> crate::table::health\n",
        );
    }

    #[test]
    fn a_circle_between_top_level_folders_fails() {
        // a::x -> b::y and b::z -> a::w: no two modules import each other, the folders do.
        let tree = Tree::new(
            "folders",
            &[
                ("lib.rs", "pub mod a;\npub mod b;\n"),
                ("a/mod.rs", "pub mod w;\npub mod x;\n"),
                ("a/w.rs", "pub fn h() {}\n"),
                ("a/x.rs", "pub fn f() {\n    crate::b::y::g();\n}\n"),
                ("b/mod.rs", "pub mod y;\npub mod z;\n"),
                ("b/y.rs", "pub fn g() {}\n"),
                ("b/z.rs", "pub fn k() {\n    crate::a::w::h();\n}\n"),
            ],
        );
        fails_with(
            &tree,
            "top-level modules import each other in a circle:\ncrate::a -> crate::b -> crate::a",
        );
    }

    /// Re-exports, nested use groups, `self` in a group, a module imported by name, an inline
    /// module, a file module with a folder of children, a path in a macro call, and test code
    /// that would close circles if it counted.
    fn clean_tree() -> Tree {
        Tree::new(
            "clean",
            &[
                (
                    "lib.rs",
                    "pub mod database;\npub mod runtime;\npub mod table;\n\
                     #[cfg(test)]\nmod test_support;\n",
                ),
                (
                    "test_support.rs",
                    "pub fn helper() {\n    crate::runtime::run();\n}\n",
                ),
                (
                    "database/mod.rs",
                    "mod failure;\nmod target;\n\
                     pub use failure::Failure;\npub use target::DatabaseTarget;\n\
                     pub fn open(target: &DatabaseTarget) -> Result<(), Failure> {\n    \
                         failure::check(target)\n}\n",
                ),
                ("database/target.rs", "pub struct DatabaseTarget;\n"),
                (
                    // Names its sibling through the parent's re-export: charged to the parent,
                    // failure and database would import each other.
                    "database/failure.rs",
                    "use crate::database::DatabaseTarget;\npub struct Failure;\n\
                     pub fn check(_: &DatabaseTarget) -> Result<(), Failure> {\n    Ok(())\n}\n",
                ),
                (
                    "table/mod.rs",
                    "pub mod ident;\npub mod outbox;\npub mod sql;\npub use outbox::OutboxTable;\n",
                ),
                (
                    "table/ident.rs",
                    "pub struct Ident;\n\
                     #[cfg(test)]\nmod tests {\n    use crate::table::sql::render;\n    \
                         use crate::test_support::helper;\n}\n",
                ),
                (
                    "table/outbox.rs",
                    "use super::ident::Ident;\npub struct OutboxTable {\n    pub name: Ident,\n}\n\
                     #[cfg(test)]\nuse crate::table::sql::render;\n\
                     impl OutboxTable {\n    #[cfg(test)]\n    \
                         fn rendered(&self) -> String {\n        crate::table::sql::render(self)\n    }\n}\n",
                ),
                (
                    "table/sql.rs",
                    "use crate::{\n    database::{self, DatabaseTarget},\n    \
                         table::{OutboxTable, ident::Ident},\n};\n\
                     pub(crate) fn render(_: &OutboxTable) -> String {\n    \
                         let _ = database::open(&DatabaseTarget);\n    String::new()\n}\n\
                     pub mod quoting {\n    pub fn quote(_: &super::Ident) -> String {\n        \
                         String::new()\n    }\n}\n",
                ),
                (
                    "runtime.rs",
                    "mod worker;\npub struct Runtime;\npub fn run() {\n    worker::work();\n}\n",
                ),
                (
                    "runtime/worker.rs",
                    "use crate::table::{OutboxTable, sql};\n\
                     pub(super) fn work() {\n    \
                         let _ = sql::render;\n    \
                         let _ = matches!(None::<OutboxTable>, Some(_));\n    \
                         assert!(matches!(Some(crate::database::Failure), Some(_)));\n}\n",
                ),
            ],
        )
    }

    #[test]
    fn a_tree_without_circles_passes_with_every_edge_found() {
        let tree = clean_tree();
        let summary = tree.check().unwrap_or_else(|message| panic!("{message}"));
        let found: Vec<(&str, &str)> = summary
            .edges
            .keys()
            .map(|(from, to)| (from.as_str(), to.as_str()))
            .collect();
        let mut expected = vec![
            ("crate::database", "crate::database::failure"),
            ("crate::database", "crate::database::target"),
            ("crate::database::failure", "crate::database::target"),
            ("crate::runtime", "crate::runtime::worker"),
            ("crate::runtime::worker", "crate::database::failure"),
            ("crate::runtime::worker", "crate::table::outbox"),
            ("crate::runtime::worker", "crate::table::sql"),
            ("crate::table", "crate::table::outbox"),
            ("crate::table::outbox", "crate::table::ident"),
            ("crate::table::sql", "crate::database"),
            ("crate::table::sql", "crate::database::target"),
            ("crate::table::sql", "crate::table::ident"),
            ("crate::table::sql", "crate::table::outbox"),
            ("crate::table::sql::quoting", "crate::table::ident"),
        ];
        expected.sort_unstable();
        assert_eq!(found, expected);
        // test_support is test code: not a module of the graph.
        assert_eq!(summary.modules, 11);
    }

    #[test]
    fn a_tree_with_too_few_edges_fails() {
        let tree = clean_tree();
        let message = check(&tree.0, MIN_EDGES).unwrap_err();
        assert!(message.contains("would pass vacuously"), "{message}");
    }

    #[test]
    fn a_module_without_its_file_fails() {
        let tree = Tree::new("missing", &[("lib.rs", "pub mod gone;\n")]);
        fails_with(&tree, "`mod gone;` in ");
    }
}
