//! `cargo xtask api [--check]`: the public surface of every product crate, one line per
//! public item, committed as `docs/api/<package>.txt` so that every change to it shows in
//! review, and counted, so that the size of the API is a number the project can hold to a
//! budget ([`API_BUDGET`]).
//!
//! The listing is read from rustdoc's JSON output. That output is unstable; the stable
//! toolchain produces it under `RUSTC_BOOTSTRAP=1`, in its own target directory
//! (`target/api`) so the flags do not invalidate the normal build or `cargo doc`. It is
//! generated with `--document-hidden-items`, so the `#[doc(hidden)]` rule is applied by
//! [`walk`] (and tested) rather than silently by rustdoc, which otherwise drops hidden items
//! but keeps a dangling `use` for a hidden item re-exported at a visible path.
//!
//! What a listing holds (see `docs/api/README.md` for the reader's version):
//!
//! - one counted line per public item reachable from the crate root through public modules
//!   and `pub use`: `mod`, `struct`, `enum`, `union`, `trait`, `fn`, `const`, `static`,
//!   `type`, `macro`; the public fields of structs and unions (`field`); enum variants
//!   (`variant`); the public methods and associated consts of inherent impls (`fn`, `const`);
//!   the items of traits (`trait-fn`, `trait-type`, `trait-const`);
//! - an item reachable at several paths of its own crate is listed and counted once, at its
//!   shortest path (then the alphabetically first); every other path is a `use` line;
//! - a re-export of another crate's item is a `use` line naming the item's public path in
//!   its own crate, and is not counted, so the facade does not count everything twice;
//! - left out: trait impls (derived or written), auto and blanket impls, private items, and
//!   anything `#[doc(hidden)]` or reachable only through a `#[doc(hidden)]` module (such as
//!   a `__private` module shared between the workspace's own crates).
//!
//! Only names are listed, not signatures: changing a parameter's type does not show here.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap, HashSet};
use std::fs;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result, bail};
use serde_json::Value;
use xshell::{Shell, cmd};

use crate::{project_root, step};

/// The product crates (package names): the published library crates whose public surface is
/// listed. Test support, examples, benchmarks, the bookshelf and xtask are not products.
pub(crate) const PRODUCT_CRATES: [&str; 9] = [
    "bucket4rs-core",
    "bucket4rs-local",
    "bucket4rs-blocking",
    "bucket4rs-async",
    "bucket4rs-listeners",
    "bucket4rs-distributed",
    "bucket4rs-tower",
    "bucket4rs-testkit",
    "bucket4rs",
];

/// The most public items (summed over [`PRODUCT_CRATES`]) that `cargo xtask api --check`
/// accepts, or `None` for no limit. Re-exports (`use` lines) do not count. The surface only
/// grows by a change that raises this number, in review; the commit that raises it says which
/// items it adds and why (`git log -p -- xtask/src/api.rs`).
pub(crate) const API_BUDGET: Option<usize> = Some(529);

/// Where the listings are committed, relative to the workspace root.
const API_DIR: &str = "docs/api";

/// The rustdoc JSON `format_version` this walker was written against (Rust 1.95). Another
/// version is read all the same, with a note: the fields used here rarely change, and a
/// structural change fails loudly in [`walk`].
const KNOWN_FORMAT_VERSION: u64 = 57;

/// The message `--check` fails with when a listing differs from the committed one.
const CHANGED: &str =
    "the public API changed: review the diff and run `cargo xtask api` to update docs/api/";

/// `cargo xtask api`: regenerates `docs/api/*.txt` and prints the counts.
pub(crate) fn write(sh: &Shell) -> Result<()> {
    step("api: rustdoc JSON of the product crates");
    let listings = generate(sh)?;
    let dir = project_root().join(API_DIR);
    fs::create_dir_all(&dir).with_context(|| format!("creating {API_DIR}"))?;
    for listing in &listings {
        let path = dir.join(format!("{}.txt", listing.package));
        fs::write(&path, listing.text()).with_context(|| format!("writing {}", path.display()))?;
    }
    for stale in stale_listings(&dir)? {
        fs::remove_file(dir.join(&stale)).with_context(|| format!("removing {stale}"))?;
        println!("api: removed {API_DIR}/{stale} (not a product crate)");
    }
    print_table(&listings);
    if let Some(over) = over_budget(total(&listings), API_BUDGET) {
        println!("api: {over} (`--check` fails)");
    }
    println!("api: wrote {API_DIR}/ ({} files)", listings.len());
    Ok(())
}

/// `cargo xtask api --check`: regenerates the listings in memory and compares them with the
/// committed ones, printing the lines that differ; fails when any differs, or when the total
/// exceeds [`API_BUDGET`].
pub(crate) fn check(sh: &Shell) -> Result<()> {
    let started = Instant::now();
    step("api --check: rustdoc JSON of the product crates");
    let listings = generate(sh)?;
    let dir = project_root().join(API_DIR);
    let mut problems = Vec::new();
    let mut changed = false;
    for listing in &listings {
        let shown = format!("{API_DIR}/{}.txt", listing.package);
        let (committed, state) =
            match fs::read_to_string(dir.join(format!("{}.txt", listing.package))) {
                Ok(text) => (text, "committed"),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => (String::new(), "missing"),
                Err(e) => return Err(e).with_context(|| format!("reading {shown}")),
            };
        let diff = line_diff(&committed, &listing.text());
        if !diff.is_empty() {
            changed = true;
            println!("--- {shown} ({state})\n+++ {shown} (generated)");
            for line in diff {
                println!("{line}");
            }
        }
    }
    for stale in stale_listings(&dir)? {
        changed = true;
        println!("--- {API_DIR}/{stale} (committed; not a product crate, delete it)");
    }
    print_table(&listings);
    if changed {
        problems.push(CHANGED.to_owned());
    }
    if let Some(over) = over_budget(total(&listings), API_BUDGET) {
        problems.push(over);
    }
    if !problems.is_empty() {
        bail!("{}", problems.join("\n"));
    }
    println!(
        "api: ok, {API_DIR}/ is up to date ({:.1}s)",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// One product crate's listing, ready to write or compare.
#[derive(Debug)]
struct Listing {
    package: &'static str,
    rendered: Rendered,
}

impl Listing {
    /// The file's text: the header with the count, then the sorted lines.
    fn text(&self) -> String {
        listing_text(&self.rendered)
    }
}

/// Runs rustdoc on every product crate and renders their listings. Every crate is walked
/// before any is rendered, because a re-export names the item's public path in the crate
/// that defines it.
fn generate(sh: &Shell) -> Result<Vec<Listing>> {
    let target_dir = std::env::var_os("CARGO_TARGET_DIR")
        .filter(|d| !d.is_empty())
        .map_or_else(|| project_root().join("target"), PathBuf::from)
        .join("api");
    let mut surfaces = Vec::new();
    for package in PRODUCT_CRATES {
        let json = rustdoc_json(sh, package, &target_dir)?;
        let mut surface =
            walk(&json).with_context(|| format!("reading {package}'s rustdoc JSON"))?;
        match json["format_version"].as_u64() {
            Some(KNOWN_FORMAT_VERSION) => {}
            other => surface.notes.push(format!(
                "rustdoc JSON format_version {other:?}, xtask was written against \
                 {KNOWN_FORMAT_VERSION}: if a listing looks wrong, check xtask/src/api.rs"
            )),
        }
        surfaces.push(surface);
    }
    let mut listings = Vec::new();
    for (package, surface) in PRODUCT_CRATES.into_iter().zip(&surfaces) {
        let rendered = render(surface, &surfaces);
        for note in &rendered.notes {
            println!("api: note: {package}: {note}");
        }
        listings.push(Listing { package, rendered });
    }
    Ok(listings)
}

/// Runs `cargo rustdoc` for one package with JSON output and reads the result. The old file
/// is removed first, so a stale JSON can never be read in place of a failed run.
fn rustdoc_json(sh: &Shell, package: &str, target_dir: &Path) -> Result<Value> {
    let path = target_dir
        .join("doc")
        .join(format!("{}.json", package.replace('-', "_")));
    match fs::remove_file(&path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e).with_context(|| format!("removing {}", path.display())),
    }
    cmd!(
        sh,
        "cargo rustdoc --quiet -p {package} --all-features --lib --target-dir {target_dir}
            -- -Z unstable-options --output-format json --document-hidden-items"
    )
    .env("RUSTC_BOOTSTRAP", "1")
    .run()?;
    let text = fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))
}

/// The listing files in `dir` that belong to no product crate (a renamed or removed crate).
fn stale_listings(dir: &Path) -> Result<Vec<String>> {
    let Ok(entries) = fs::read_dir(dir) else {
        return Ok(Vec::new());
    };
    let mut stale = Vec::new();
    for entry in entries {
        let name = entry?.file_name().to_string_lossy().into_owned();
        if let Some(stem) = name.strip_suffix(".txt")
            && !PRODUCT_CRATES.contains(&stem)
        {
            stale.push(name);
        }
    }
    stale.sort();
    Ok(stale)
}

/// The counted items of all listings together.
fn total(listings: &[Listing]) -> usize {
    listings.iter().map(|l| l.rendered.items).sum()
}

/// Prints the items and re-exports of every crate, and the totals.
fn print_table(listings: &[Listing]) {
    let width = PRODUCT_CRATES.iter().map(|p| p.len()).max().unwrap_or(0);
    println!(
        "\n{:<width$}  {:>5}  {:>10}",
        "crate", "items", "re-exports"
    );
    for l in listings {
        println!(
            "{:<width$}  {:>5}  {:>10}",
            l.package, l.rendered.items, l.rendered.reexports
        );
    }
    let reexports: usize = listings.iter().map(|l| l.rendered.reexports).sum();
    println!(
        "{:<width$}  {:>5}  {:>10}",
        "total",
        total(listings),
        reexports
    );
    match API_BUDGET {
        Some(budget) => println!("(budget: {budget} items)"),
        None => println!("(no budget set: xtask/src/api.rs, API_BUDGET)"),
    }
}

/// Why `total` items break the budget, if they do.
fn over_budget(total: usize, budget: Option<usize>) -> Option<String> {
    let budget = budget?;
    (total > budget).then(|| {
        format!(
            "the product crates have {total} public items, over the budget of {budget} \
             (API_BUDGET in xtask/src/api.rs): remove {} or raise the budget",
            total - budget
        )
    })
}

// ---------------------------------------------------------------------------------------
// The walk: rustdoc JSON to a crate's public surface.
// ---------------------------------------------------------------------------------------

/// What [`walk`] finds in one crate's rustdoc JSON.
#[derive(Debug, Default)]
struct Surface {
    /// The crate name, as in paths (`bucket4rs_core`).
    name: String,
    /// This crate's own public items: `(kind, path)`. Counted.
    items: Vec<(&'static str, String)>,
    /// Further public paths of this crate's own items: `(path, canonical path)`.
    aliases: Vec<(String, String)>,
    /// Re-exports of other crates' items.
    foreign: Vec<Foreign>,
    /// The public path of each of this crate's items, by the path of its definition (what
    /// another crate's JSON names it by, private modules included).
    public_paths: HashMap<String, String>,
    /// What the walk could not classify or resolve; printed, never fatal.
    notes: Vec<String>,
}

/// A `pub use` of another crate's item (or module, or everything in a module).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Foreign {
    /// Where it is re-exported (`bucket4rs::Bandwidth`; for a glob, the module).
    at: String,
    /// The definition path of the target in its own crate (`bucket4rs_core::config::Bandwidth`).
    def_path: String,
    /// `pub use module::*`.
    glob: bool,
}

/// A path at which an item was reached, waiting to be placed. Ordered shortest first, then
/// alphabetically, so that an item's first placement is its canonical path however the
/// JSON orders the modules.
#[derive(Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Pending {
    depth: usize,
    path: String,
    id: String,
}

/// The state of one [`walk`].
struct Walker<'a> {
    index: &'a serde_json::Map<String, Value>,
    paths: Option<&'a serde_json::Map<String, Value>>,
    root: String,
    queue: BinaryHeap<Reverse<Pending>>,
    /// Each placed item's canonical path, by id.
    placed: BTreeMap<String, String>,
    /// `(module id, importing module path)` of the globs already expanded (cycle guard).
    globbed: HashSet<(String, String)>,
    surface: Surface,
}

/// Walks a crate's rustdoc JSON from the root through public modules and `pub use`, and
/// collects its public surface. Fails only when the JSON lacks what every format version
/// has (an index and a root module); anything else unexpected becomes a note.
fn walk(json: &Value) -> Result<Surface> {
    let index = json["index"]
        .as_object()
        .context("no `index` object: not rustdoc JSON?")?;
    let root = id_key(&json["root"]).context("no `root` id")?;
    let root_item = index
        .get(&root)
        .context("the root id is not in the index")?;
    let name = root_item["name"]
        .as_str()
        .context("the root module has no name")?
        .to_owned();
    if inner(root_item).map(|(kind, _)| kind) != Some("module") {
        bail!("the root item is not a module");
    }
    let mut w = Walker {
        index,
        paths: json["paths"].as_object(),
        root: root.clone(),
        queue: BinaryHeap::new(),
        placed: BTreeMap::new(),
        globbed: HashSet::new(),
        surface: Surface {
            name: name.clone(),
            ..Surface::default()
        },
    };
    w.queue.push(Reverse(Pending {
        depth: 1,
        path: name,
        id: root,
    }));
    while let Some(Reverse(next)) = w.queue.pop() {
        w.place(next);
    }
    for (id, public) in &w.placed {
        if let Some(def_path) = w.def_path(id) {
            w.surface.public_paths.insert(def_path, public.clone());
        }
    }
    Ok(w.surface)
}

impl Walker<'_> {
    /// Places an item at the path it was reached by: lists it and its members if this is its
    /// first (so shortest) path, or records the path as an alias.
    fn place(&mut self, p: Pending) {
        let Some(item) = self.index.get(&p.id) else {
            return;
        };
        // A public re-export of a hidden item is hidden too.
        if is_hidden(item) {
            return;
        }
        if let Some(canonical) = self.placed.get(&p.id) {
            if *canonical != p.path {
                self.surface.aliases.push((p.path, canonical.clone()));
            }
            return;
        }
        self.placed.insert(p.id.clone(), p.path.clone());
        let Some((kind, body)) = inner(item) else {
            self.note(format!("{}: an item without `inner`; not listed", p.path));
            return;
        };
        match kind {
            "module" => {
                if p.id != self.root {
                    self.item("mod", &p.path);
                }
                for child in ids(&body["items"]) {
                    self.enqueue(&child, &p.path, p.depth);
                }
            }
            "struct" => {
                self.item("struct", &p.path);
                let fields = match &body["kind"] {
                    Value::Object(k) if k.contains_key("plain") => ids(&k["plain"]["fields"]),
                    // Private tuple fields are `null`; `ids` skips them.
                    Value::Object(k) if k.contains_key("tuple") => ids(&k["tuple"]),
                    _ => Vec::new(),
                };
                self.fields(&fields, &p.path);
                self.inherent_impls(&body["impls"], &p.path);
            }
            "union" => {
                self.item("union", &p.path);
                self.fields(&ids(&body["fields"]), &p.path);
                self.inherent_impls(&body["impls"], &p.path);
            }
            "enum" => {
                self.item("enum", &p.path);
                for variant in ids(&body["variants"]) {
                    if let Some((_, name)) = self.member(&variant, false) {
                        self.item("variant", &format!("{}::{name}", p.path));
                    }
                }
                self.inherent_impls(&body["impls"], &p.path);
            }
            "trait" => {
                self.item("trait", &p.path);
                for member in ids(&body["items"]) {
                    let Some((kind, name)) = self.member(&member, false) else {
                        continue;
                    };
                    let line = match kind {
                        "function" => "trait-fn",
                        "assoc_type" => "trait-type",
                        "assoc_const" => "trait-const",
                        other => {
                            self.note(format!("{}::{name}: trait item of kind `{other}`", p.path));
                            "trait-item"
                        }
                    };
                    self.item(line, &format!("{}::{name}", p.path));
                }
            }
            "function" => self.item("fn", &p.path),
            "constant" => self.item("const", &p.path),
            "static" => self.item("static", &p.path),
            "type_alias" => self.item("type", &p.path),
            "macro" | "proc_macro" => self.item("macro", &p.path),
            "trait_alias" => self.item("trait-alias", &p.path),
            other => {
                self.note(format!(
                    "{}: item of kind `{other}`, listed as such",
                    p.path
                ));
                self.item("item", &p.path);
            }
        }
    }

    /// Queues a module's child for placement, following `pub use` to its target; private and
    /// hidden children are dropped here, so nothing below a hidden module is ever reached.
    fn enqueue(&mut self, id: &str, parent: &str, depth: usize) {
        let Some(item) = self.index.get(id) else {
            self.note(format!("{parent}: child {id} is missing from the index"));
            return;
        };
        if !is_public(item) || is_hidden(item) {
            return;
        }
        match inner(item) {
            Some(("use", body)) => self.enqueue_use(body, parent, depth),
            Some(("extern_crate", body)) => {
                let name = body["name"].as_str().unwrap_or("?");
                let rename = body["rename"].as_str().unwrap_or(name);
                self.surface.foreign.push(Foreign {
                    at: format!("{parent}::{rename}"),
                    def_path: name.to_owned(),
                    glob: false,
                });
            }
            // Impl blocks are reached through their types, never through modules.
            Some(("impl", _)) => {}
            _ => match item["name"].as_str() {
                Some(name) => self.queue.push(Reverse(Pending {
                    depth: depth + 1,
                    path: format!("{parent}::{name}"),
                    id: id.to_owned(),
                })),
                None => self.note(format!("{parent}: an unnamed public child {id}")),
            },
        }
    }

    /// Follows a `pub use`: an item of this crate is queued at the re-export's path (a glob
    /// queues the module's children into `parent`); another crate's item is recorded as a
    /// foreign re-export.
    fn enqueue_use(&mut self, body: &Value, parent: &str, depth: usize) {
        let name = body["name"].as_str().unwrap_or("?");
        let source = body["source"].as_str().unwrap_or("?");
        let glob = body["is_glob"].as_bool().unwrap_or(false);
        let Some(target) = id_key(&body["id"]) else {
            self.note(format!(
                "`pub use {source}` in {parent} has no target id (a primitive?); not listed"
            ));
            return;
        };
        let local = self
            .index
            .get(&target)
            .filter(|t| t["crate_id"].as_u64() == Some(0));
        match local {
            Some(module) if glob => {
                if !self.globbed.insert((target.clone(), parent.to_owned())) {
                    return;
                }
                match inner(module) {
                    Some(("module", m)) => {
                        for child in ids(&m["items"]) {
                            self.enqueue(&child, parent, depth);
                        }
                    }
                    _ => self.note(format!(
                        "`pub use {source}::*` in {parent}: a glob of a non-module; not listed"
                    )),
                }
            }
            Some(_) => self.queue.push(Reverse(Pending {
                depth: depth + 1,
                path: format!("{parent}::{name}"),
                id: target,
            })),
            None => {
                let def_path = match self.def_path(&target) {
                    Some(path) if self.path_crate(&target) != Some(0) => path,
                    Some(path) => {
                        self.note(format!(
                            "`pub use {source}` in {parent}: rustdoc left its target \
                             `{path}` out of the JSON; listed as a re-export"
                        ));
                        path
                    }
                    None => source.to_owned(),
                };
                let at = if glob {
                    parent.to_owned()
                } else {
                    format!("{parent}::{name}")
                };
                self.surface.foreign.push(Foreign { at, def_path, glob });
            }
        }
    }

    /// Lists the public, visible fields of a struct or union.
    fn fields(&mut self, fields: &[String], parent: &str) {
        for field in fields {
            if let Some((_, name)) = self.member(field, true) {
                self.item("field", &format!("{parent}::{name}"));
            }
        }
    }

    /// Lists the public, visible methods and associated items of a type's inherent impls.
    /// Trait impls (written or derived), auto-trait impls (`is_synthetic`) and blanket impls
    /// are not the type's own surface, and are skipped.
    fn inherent_impls(&mut self, impls: &Value, parent: &str) {
        for impl_id in ids(impls) {
            let Some(imp) = self.index.get(&impl_id) else {
                continue;
            };
            let Some(("impl", body)) = inner(imp) else {
                continue;
            };
            let inherent = body["trait"].is_null()
                && body["blanket_impl"].is_null()
                && body["is_synthetic"].as_bool() != Some(true);
            if !inherent || is_hidden(imp) {
                continue;
            }
            for member in ids(&body["items"]) {
                let Some((kind, name)) = self.member(&member, true) else {
                    continue;
                };
                let line = match kind {
                    "function" => "fn",
                    "assoc_const" => "const",
                    "assoc_type" => "type",
                    other => {
                        self.note(format!("{parent}::{name}: inherent item of kind `{other}`"));
                        "item"
                    }
                };
                self.item(line, &format!("{parent}::{name}"));
            }
        }
    }

    /// The kind and name of a member (field, variant, trait or impl item), unless it is
    /// missing, hidden, unnamed or (when `must_be_pub`) not `pub`. Variants and trait items
    /// carry rustdoc's "default" visibility: they are as public as their parent.
    fn member(&self, id: &str, must_be_pub: bool) -> Option<(&'static str, String)> {
        let item = self.index.get(id)?;
        if is_hidden(item) || (must_be_pub && !is_public(item)) {
            return None;
        }
        let (kind, _) = inner(item)?;
        let name = item["name"].as_str()?.to_owned();
        Some((static_kind(kind), name))
    }

    /// The definition path of an item (private modules included) from the JSON's `paths`.
    fn def_path(&self, id: &str) -> Option<String> {
        let segments = self.paths?.get(id)?["path"].as_array()?;
        let segments: Option<Vec<&str>> = segments.iter().map(Value::as_str).collect();
        Some(segments?.join("::"))
    }

    /// The crate id `paths` gives an item (0: this crate).
    fn path_crate(&self, id: &str) -> Option<u64> {
        self.paths?.get(id)?["crate_id"].as_u64()
    }

    fn item(&mut self, kind: &'static str, path: &str) {
        self.surface.items.push((kind, path.to_owned()));
    }

    fn note(&mut self, note: String) {
        self.surface.notes.push(note);
    }
}

/// The item kinds [`Walker::member`] distinguishes, as `'static` strings (others: `other`).
fn static_kind(kind: &str) -> &'static str {
    match kind {
        "function" => "function",
        "assoc_type" => "assoc_type",
        "assoc_const" => "assoc_const",
        "struct_field" => "struct_field",
        "variant" => "variant",
        _ => "other",
    }
}

/// An item's kind (the single key of `inner`) and its body.
fn inner(item: &Value) -> Option<(&str, &Value)> {
    item["inner"]
        .as_object()?
        .iter()
        .next()
        .map(|(k, v)| (k.as_str(), v))
}

/// An id as the index's key. Format 57 ids are integers; older formats used strings.
fn id_key(id: &Value) -> Option<String> {
    match id {
        Value::Number(n) => Some(n.to_string()),
        Value::String(s) => Some(s.clone()),
        _ => None,
    }
}

/// The ids of an array of ids, skipping `null` (a stripped tuple field).
fn ids(list: &Value) -> Vec<String> {
    list.as_array()
        .map(|a| a.iter().filter_map(id_key).collect())
        .unwrap_or_default()
}

/// Whether the item is declared `pub` (module-level items, fields, inherent impl items).
fn is_public(item: &Value) -> bool {
    item["visibility"].as_str() == Some("public")
}

/// Whether the item is `#[doc(hidden)]`. Format 57 gives such an attribute as
/// `{"other": "#[doc(hidden)]"}`; older formats gave every attribute as a plain string.
fn is_hidden(item: &Value) -> bool {
    item["attrs"].as_array().is_some_and(|attrs| {
        attrs.iter().any(|attr| {
            attr.as_str()
                .or_else(|| attr["other"].as_str())
                .is_some_and(doc_hidden)
        })
    })
}

/// Whether an attribute's source text is a `doc(...)` attribute with a `hidden` argument
/// (`#[doc(hidden)]`, `#[doc(alias = "x", hidden)]`), and not, say, `#[doc = "hidden"]`.
fn doc_hidden(attr: &str) -> bool {
    let compact: String = attr.chars().filter(|c| !c.is_whitespace()).collect();
    compact
        .strip_prefix("#[doc(")
        .and_then(|rest| rest.strip_suffix(")]"))
        .is_some_and(|args| args.split(',').any(|arg| arg == "hidden"))
}

// ---------------------------------------------------------------------------------------
// Rendering and comparing listings.
// ---------------------------------------------------------------------------------------

/// A crate's listing as lines, with its counts.
#[derive(Debug, Default)]
struct Rendered {
    /// Sorted, without repeats.
    lines: Vec<String>,
    /// Lines that are the crate's own items (everything but `use` lines).
    items: usize,
    /// `use` lines: re-exports of other crates' items and second paths of its own.
    reexports: usize,
    /// The walk's notes, and the re-exports that could not be resolved.
    notes: Vec<String>,
}

/// Renders one crate's surface. `all` holds every product crate's surface, so a re-export
/// names its target by the target's public path in its own crate; a target outside the
/// product crates, or not public there, keeps its definition path (with a note when it
/// should have been found).
fn render(surface: &Surface, all: &[Surface]) -> Rendered {
    let mut notes = surface.notes.clone();
    let mut items: Vec<String> = surface
        .items
        .iter()
        .map(|(kind, path)| format!("{kind} {path}"))
        .collect();
    items.sort_by_cached_key(|l| order_key(l));
    let before = items.len();
    items.dedup();
    if items.len() != before {
        notes.push(format!(
            "{} line(s) listed once although reached twice (e.g. a method in two impl blocks)",
            before - items.len()
        ));
    }

    let mut reexports: Vec<String> = surface
        .aliases
        .iter()
        .map(|(path, canonical)| format!("use {path} = {canonical}"))
        .collect();
    for f in &surface.foreign {
        let origin = f.def_path.split("::").next().unwrap_or_default();
        let public = all
            .iter()
            .find(|s| s.name == origin)
            .map(|s| s.public_paths.get(&f.def_path));
        let target = match public {
            Some(Some(public)) => public.clone(),
            Some(None) => {
                notes.push(format!(
                    "{} re-exports `{}`, which is not public API of {origin} (hidden or \
                     private there)",
                    f.at, f.def_path
                ));
                f.def_path.clone()
            }
            None => f.def_path.clone(),
        };
        reexports.push(if f.glob {
            format!("use {}::* = {target}::*", f.at)
        } else {
            format!("use {} = {target}", f.at)
        });
    }
    reexports.sort();
    reexports.dedup();

    let counts = (items.iter().filter(|l| counted(l)).count(), reexports.len());
    let mut lines = items;
    lines.extend(reexports);
    lines.sort_by_cached_key(|l| order_key(l));
    Rendered {
        lines,
        items: counts.0,
        reexports: counts.1,
        notes,
    }
}

/// The kinds of line that are listed but not counted: the members of a type or trait that
/// come with it (enum variants, public fields, trait items). What is counted is what a user
/// can name and call on its own: modules, types, traits, functions, constants, statics,
/// macros, and inherent methods and associated consts.
const LISTED_NOT_COUNTED: [&str; 5] = ["variant", "field", "trait-fn", "trait-type", "trait-const"];

/// Whether a listing line (not a `use` line) counts towards the crate's items.
fn counted(line: &str) -> bool {
    let kind = line.split(' ').next().unwrap_or_default();
    !LISTED_NOT_COUNTED.contains(&kind)
}

/// The text of a listing file.
fn listing_text(rendered: &Rendered) -> String {
    let mut text = format!(
        "# {} public items (variants, fields, trait items and re-exports listed, not counted); \
         written by `cargo xtask api`\n",
        rendered.items
    );
    for line in &rendered.lines {
        text.push_str(line);
        text.push('\n');
    }
    text
}

/// How listing lines are ordered: comments first, then by path segment by segment (so a
/// type's members follow the type), then by the whole line.
fn order_key(line: &str) -> (bool, Vec<String>, String) {
    if line.starts_with('#') {
        return (false, Vec::new(), line.to_owned());
    }
    let path = line
        .split_once(' ')
        .map_or(line, |(_, rest)| rest)
        .split(" = ")
        .next()
        .unwrap_or_default();
    (
        true,
        path.split("::").map(str::to_owned).collect(),
        line.to_owned(),
    )
}

/// The lines that differ between two listings: `-line` for a line only in `old`, `+line`
/// for a line only in `new` (a repeated line counts as often as it appears). A listing is a
/// sorted set of lines, so the added and removed lines are the whole change; they are given
/// in listing order, a removal before an addition at the same place.
fn line_diff(old: &str, new: &str) -> Vec<String> {
    let mut balance: BTreeMap<&str, i64> = BTreeMap::new();
    for line in old.lines() {
        *balance.entry(line).or_default() -= 1;
    }
    for line in new.lines() {
        *balance.entry(line).or_default() += 1;
    }
    let mut changes: Vec<(char, &str)> = Vec::new();
    for (line, n) in balance {
        let sign = if n < 0 { '-' } else { '+' };
        for _ in 0..n.unsigned_abs() {
            changes.push((sign, line));
        }
    }
    changes.sort_by_cached_key(|&(sign, line)| {
        let (comment_last, path, whole) = order_key(line);
        (comment_last, path, sign == '+', whole)
    });
    changes
        .into_iter()
        .map(|(sign, line)| format!("{sign}{line}"))
        .collect()
}

#[cfg(test)]
mod tests;
