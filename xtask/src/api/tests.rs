use serde_json::{Map, Value, json};

use super::{
    PRODUCT_CRATES, Surface, doc_hidden, line_diff, listing_text, order_key, over_budget, render,
    walk,
};

/// A rustdoc JSON document of the format-57 shape, with `items` as its index.
fn krate(root: u32, items: Vec<Value>, paths: Value) -> Value {
    let index: Map<String, Value> = items
        .into_iter()
        .map(|item| (item["id"].to_string(), item))
        .collect();
    json!({ "format_version": 57, "root": root, "index": index, "paths": paths })
}

/// One index entry of this crate (`crate_id` 0).
fn item(id: u32, name: &str, visibility: &str, attrs: Value, inner: Value) -> Value {
    json!({
        "id": id, "crate_id": 0, "name": name, "visibility": visibility,
        "attrs": attrs, "inner": inner,
    })
}

/// A `pub use` entry (rustdoc gives `use` items no name; the name is in `inner`).
fn use_item(id: u32, source: &str, name: &str, target: u32, glob: bool) -> Value {
    json!({
        "id": id, "crate_id": 0, "name": null, "visibility": "public", "attrs": [],
        "inner": { "use": { "source": source, "name": name, "id": target, "is_glob": glob } },
    })
}

fn module(items: &[u32]) -> Value {
    json!({ "module": { "is_crate": false, "items": items, "is_stripped": false } })
}

fn hidden() -> Value {
    json!([{ "other": "#[doc(hidden)]" }])
}

fn inherent_impl(items: &[u32]) -> Value {
    json!({ "impl": {
        "is_unsafe": false, "provided_trait_methods": [], "trait": null, "for": null,
        "items": items, "is_negative": false, "is_synthetic": false, "blanket_impl": null,
    } })
}

fn function() -> Value {
    json!({ "function": {} })
}

/// The rendered lines of a crate walked on its own.
fn lines_of(json: &Value) -> Vec<String> {
    let surface = walk(json).unwrap();
    render(&surface, &[]).lines
}

#[test]
fn lists_items_and_members_but_not_trait_auto_or_blanket_impls() {
    let json = krate(
        0,
        vec![
            item(
                0,
                "demo",
                "public",
                json!([]),
                module(&[1, 2, 10, 20, 30, 40, 41, 42, 43, 44]),
            ),
            item(
                1,
                "Meter",
                "public",
                json!([]),
                json!({ "struct": {
                    "kind": { "plain": { "fields": [3, 4], "has_stripped_fields": true } },
                    "impls": [5, 6, 7, 8],
                } }),
            ),
            item(
                3,
                "limit",
                "public",
                json!([]),
                json!({ "struct_field": {} }),
            ),
            item(
                4,
                "secret",
                "public",
                hidden(),
                json!({ "struct_field": {} }),
            ),
            item(
                5,
                "",
                "default",
                json!([]),
                inherent_impl(&[50, 51, 52, 53]),
            ),
            item(50, "new", "public", json!([]), function()),
            item(51, "MAX", "public", json!([]), json!({ "assoc_const": {} })),
            item(52, "internal", "public", hidden(), function()),
            item(53, "helper", "crate", json!([]), function()),
            item(
                6,
                "",
                "default",
                json!([]),
                json!({ "impl": {
                    "trait": { "path": "Clone", "id": 99, "args": null },
                    "items": [60], "is_synthetic": false, "blanket_impl": null,
                } }),
            ),
            // rustdoc gives trait impl items "default" visibility; this one claims `pub` so
            // that the test shows the impl itself is skipped, not only its items.
            item(60, "clone", "public", json!([]), function()),
            item(
                7,
                "",
                "default",
                json!([]),
                json!({ "impl": {
                    "trait": null, "items": [62], "is_synthetic": true, "blanket_impl": null,
                } }),
            ),
            item(62, "synthetic", "public", json!([]), function()),
            item(
                8,
                "",
                "default",
                json!([]),
                json!({ "impl": {
                    "trait": null, "items": [61], "is_synthetic": false,
                    "blanket_impl": { "generic": "T" },
                } }),
            ),
            item(61, "from", "public", json!([]), function()),
            item(
                2,
                "Pair",
                "public",
                json!([]),
                json!({ "struct": { "kind": { "tuple": [70, null] }, "impls": [] } }),
            ),
            item(70, "0", "public", json!([]), json!({ "struct_field": {} })),
            item(
                10,
                "Mode",
                "public",
                json!([]),
                json!({ "enum": { "variants": [11, 12], "impls": [13] } }),
            ),
            item(
                11,
                "Fast",
                "default",
                json!([]),
                json!({ "variant": { "kind": "plain" } }),
            ),
            item(
                12,
                "Legacy",
                "default",
                hidden(),
                json!({ "variant": { "kind": "plain" } }),
            ),
            item(13, "", "default", json!([]), inherent_impl(&[14])),
            item(14, "is_fast", "public", json!([]), function()),
            item(
                20,
                "Gauge",
                "public",
                json!([]),
                json!({ "trait": { "items": [21, 22, 23, 24], "implementations": [] } }),
            ),
            item(21, "read", "default", json!([]), function()),
            item(
                22,
                "Unit",
                "default",
                json!([]),
                json!({ "assoc_type": {} }),
            ),
            item(
                23,
                "SCALE",
                "default",
                json!([]),
                json!({ "assoc_const": {} }),
            ),
            item(24, "raw", "default", hidden(), function()),
            item(30, "units", "public", json!([]), module(&[31, 32])),
            item(31, "convert", "public", json!([]), function()),
            item(32, "private", "crate", json!([]), function()),
            item(40, "LIMIT", "public", json!([]), json!({ "constant": {} })),
            item(41, "COUNTER", "public", json!([]), json!({ "static": {} })),
            item(
                42,
                "Alias",
                "public",
                json!([]),
                json!({ "type_alias": {} }),
            ),
            item(
                43,
                "meter",
                "public",
                json!(["macro_export"]),
                json!({ "macro": "" }),
            ),
            item(
                44,
                "Raw",
                "public",
                json!([]),
                json!({ "union": { "fields": [45], "impls": [] } }),
            ),
            item(
                45,
                "bits",
                "public",
                json!([]),
                json!({ "struct_field": {} }),
            ),
        ],
        json!({}),
    );
    let surface = walk(&json).unwrap();
    let rendered = render(&surface, &[]);
    assert_eq!(
        rendered.lines,
        [
            "type demo::Alias",
            "static demo::COUNTER",
            "trait demo::Gauge",
            "trait-const demo::Gauge::SCALE",
            "trait-type demo::Gauge::Unit",
            "trait-fn demo::Gauge::read",
            "const demo::LIMIT",
            "struct demo::Meter",
            "const demo::Meter::MAX",
            "field demo::Meter::limit",
            "fn demo::Meter::new",
            "enum demo::Mode",
            "variant demo::Mode::Fast",
            "fn demo::Mode::is_fast",
            "struct demo::Pair",
            "field demo::Pair::0",
            "union demo::Raw",
            "field demo::Raw::bits",
            "macro demo::meter",
            "mod demo::units",
            "fn demo::units::convert",
        ]
    );
    // Variants, fields and trait items are listed with their type, not counted on their own.
    assert_eq!(rendered.items, rendered.lines.len() - 7);
    assert_eq!(rendered.reexports, 0);
    assert!(rendered.notes.is_empty(), "{:?}", rendered.notes);
}

#[test]
fn leaves_out_doc_hidden_items_and_everything_below_a_hidden_module() {
    let json = krate(
        0,
        vec![
            item(0, "demo", "public", json!([]), module(&[1, 2, 3, 4, 5])),
            item(1, "__private", "public", hidden(), module(&[10, 11, 12])),
            item(
                10,
                "Shared",
                "public",
                json!([]),
                json!({ "struct": { "kind": "unit", "impls": [13, 15] } }),
            ),
            item(13, "", "default", json!([]), inherent_impl(&[14])),
            item(14, "get", "public", json!([]), function()),
            // `#[doc(hidden)] impl Shared { pub fn internal() {} }`
            item(15, "", "default", hidden(), inherent_impl(&[16])),
            item(16, "internal", "public", json!([]), function()),
            item(11, "helper", "public", json!([]), function()),
            item(
                12,
                "Other",
                "public",
                json!([]),
                json!({ "struct": { "kind": "unit", "impls": [] } }),
            ),
            item(2, "visible", "public", json!([]), function()),
            item(
                3,
                "Internal",
                "public",
                hidden(),
                json!({ "struct": { "kind": "unit", "impls": [] } }),
            ),
            // `pub use __private::Shared;`: the item is not hidden, and this path is public.
            use_item(4, "__private::Shared", "Shared", 10, false),
            // `#[doc(hidden)] pub use __private::Other;`
            {
                let mut u = use_item(5, "__private::Other", "Other", 12, false);
                u["attrs"] = hidden();
                u
            },
        ],
        json!({}),
    );
    assert_eq!(
        lines_of(&json),
        [
            "struct demo::Shared",
            "fn demo::Shared::get",
            "fn demo::visible"
        ]
    );
}

#[test]
fn a_reexported_hidden_item_stays_hidden() {
    let json = krate(
        0,
        vec![
            item(0, "demo", "public", json!([]), module(&[1, 2])),
            item(1, "inner", "default", json!([]), module(&[3])),
            item(3, "secret", "public", hidden(), function()),
            use_item(2, "inner::secret", "secret", 3, false),
        ],
        json!({}),
    );
    assert_eq!(lines_of(&json), Vec::<String>::new());
}

#[test]
fn recognises_doc_hidden_attributes() {
    assert!(doc_hidden("#[doc(hidden)]"));
    assert!(doc_hidden("#[doc( hidden )]"));
    assert!(doc_hidden("#[doc(alias = \"x\", hidden)]"));
    assert!(!doc_hidden("#[doc = \"hidden\"]"));
    assert!(!doc_hidden("#[doc(inline)]"));
    assert!(!doc_hidden("#[doc(hidden_gem)]"));
    assert!(!doc_hidden("#[hidden]"));
    // Older formats gave attributes as plain strings: both shapes are read.
    let old_shape = json!({ "attrs": ["#[doc(hidden)]"] });
    let new_shape = json!({ "attrs": [{ "other": "#[doc(hidden)]" }] });
    let plain = json!({ "attrs": [{ "other": "#[inline]" }, "macro_export"] });
    assert!(super::is_hidden(&old_shape));
    assert!(super::is_hidden(&new_shape));
    assert!(!super::is_hidden(&plain));
}

/// `core`: `Probe` is defined in the public `ops` and re-exported at the root; `Bandwidth`
/// is defined in the private `config` and re-exported at the root.
fn core_crate() -> Value {
    krate(
        0,
        vec![
            item(0, "core", "public", json!([]), module(&[1, 2, 5])),
            item(1, "ops", "public", json!([]), module(&[3, 4])),
            item(
                3,
                "Probe",
                "public",
                json!([]),
                json!({ "struct": { "kind": "unit", "impls": [] } }),
            ),
            item(4, "run", "public", json!([]), function()),
            use_item(2, "ops::Probe", "Probe", 3, false),
            use_item(5, "config::Bandwidth", "Bandwidth", 6, false),
            item(
                6,
                "Bandwidth",
                "public",
                json!([]),
                json!({ "struct": { "kind": "unit", "impls": [] } }),
            ),
        ],
        json!({
            "0": { "crate_id": 0, "path": ["core"], "kind": "module" },
            "1": { "crate_id": 0, "path": ["core", "ops"], "kind": "module" },
            "3": { "crate_id": 0, "path": ["core", "ops", "Probe"], "kind": "struct" },
            "6": { "crate_id": 0, "path": ["core", "config", "Bandwidth"], "kind": "struct" },
        }),
    )
}

#[test]
fn an_item_reexported_in_its_own_crate_is_counted_once_at_its_shortest_path() {
    let surface = walk(&core_crate()).unwrap();
    let rendered = render(&surface, &[]);
    assert_eq!(
        rendered.lines,
        [
            "struct core::Bandwidth",
            "struct core::Probe",
            "mod core::ops",
            "use core::ops::Probe = core::Probe",
            "fn core::ops::run",
        ]
    );
    assert_eq!((rendered.items, rendered.reexports), (4, 1));
    assert!(listing_text(&rendered).starts_with("# 4 public items (variants, fields, trait items"));
    // What another crate's JSON calls these items, mapped to their public paths.
    assert_eq!(
        surface.public_paths["core::config::Bandwidth"],
        "core::Bandwidth"
    );
    assert_eq!(surface.public_paths["core::ops::Probe"], "core::Probe");
    assert_eq!(surface.public_paths["core"], "core");
}

#[test]
fn the_canonical_path_is_the_shortest_even_when_a_longer_one_sorts_first() {
    // `pub mod a { pub mod b { pub fn run() {} } }` and `pub mod z { pub use crate::a::b::run; }`
    let json = krate(
        0,
        vec![
            item(0, "demo", "public", json!([]), module(&[1, 3])),
            item(1, "a", "public", json!([]), module(&[2])),
            item(2, "b", "public", json!([]), module(&[4])),
            item(4, "run", "public", json!([]), function()),
            item(3, "z", "public", json!([]), module(&[5])),
            use_item(5, "crate::a::b::run", "run", 4, false),
        ],
        json!({}),
    );
    assert_eq!(
        lines_of(&json),
        [
            "mod demo::a",
            "mod demo::a::b",
            "use demo::a::b::run = demo::z::run",
            "mod demo::z",
            "fn demo::z::run",
        ]
    );
}

#[test]
fn reexports_of_other_crates_are_listed_by_their_public_path_and_not_counted() {
    let facade = krate(
        0,
        vec![
            item(
                0,
                "facade",
                "public",
                json!([]),
                module(&[1, 2, 3, 4, 5, 6]),
            ),
            use_item(1, "core::Bandwidth", "Bandwidth", 50, false),
            use_item(2, "core", "core", 51, false),
            use_item(3, "core::ops", "ops", 52, true),
            item(
                4,
                "Own",
                "public",
                json!([]),
                json!({ "struct": { "kind": "unit", "impls": [] } }),
            ),
            use_item(5, "other::Thing", "Thing", 53, false),
            use_item(6, "core::__private::Secret", "Secret", 54, false),
        ],
        json!({
            "50": { "crate_id": 1, "path": ["core", "config", "Bandwidth"], "kind": "struct" },
            "51": { "crate_id": 1, "path": ["core"], "kind": "module" },
            "52": { "crate_id": 1, "path": ["core", "ops"], "kind": "module" },
            "53": { "crate_id": 2, "path": ["other", "thing", "Thing"], "kind": "struct" },
            "54": { "crate_id": 1, "path": ["core", "__private", "Secret"], "kind": "struct" },
        }),
    );
    let all: Vec<Surface> = vec![walk(&core_crate()).unwrap(), walk(&facade).unwrap()];
    let rendered = render(&all[1], &all);
    assert_eq!(
        rendered.lines,
        [
            "use facade::* = core::ops::*",
            "use facade::Bandwidth = core::Bandwidth",
            "struct facade::Own",
            "use facade::Secret = core::__private::Secret",
            "use facade::Thing = other::thing::Thing",
            "use facade::core = core",
        ]
    );
    assert_eq!((rendered.items, rendered.reexports), (1, 5));
    // A product crate's item that is not public there (here: under a hidden module) keeps
    // its definition path and is pointed out; a crate outside the walk is not.
    assert_eq!(rendered.notes.len(), 1, "{:?}", rendered.notes);
    assert!(rendered.notes[0].contains("core::__private::Secret"));
}

#[test]
fn glob_reexports_of_own_modules_place_the_children_and_terminate_on_cycles() {
    let json = krate(
        0,
        vec![
            item(0, "demo", "public", json!([]), module(&[1, 2, 3])),
            // `mod inner { pub fn f() {} }` and `pub use inner::*;`
            item(1, "inner", "default", json!([]), module(&[10])),
            item(10, "f", "public", json!([]), function()),
            use_item(2, "inner", "inner", 1, true),
            // `pub mod m { pub fn g() {} pub use super::m::*; }`: a glob of itself.
            item(3, "m", "public", json!([]), module(&[30, 31])),
            item(30, "g", "public", json!([]), function()),
            use_item(31, "super::m", "m", 3, true),
        ],
        json!({}),
    );
    assert_eq!(
        lines_of(&json),
        ["fn demo::f", "mod demo::m", "fn demo::m::g"]
    );
}

#[test]
fn a_method_in_two_impl_blocks_is_one_line_with_a_note() {
    let json = krate(
        0,
        vec![
            item(0, "demo", "public", json!([]), module(&[1])),
            item(
                1,
                "Bucket",
                "public",
                json!([]),
                json!({ "struct": { "kind": "unit", "impls": [2, 3] } }),
            ),
            item(2, "", "default", json!([]), inherent_impl(&[4])),
            item(3, "", "default", json!([]), inherent_impl(&[5])),
            item(4, "new", "public", json!([]), function()),
            item(5, "new", "public", json!([]), function()),
        ],
        json!({}),
    );
    let rendered = render(&walk(&json).unwrap(), &[]);
    assert_eq!(
        rendered.lines,
        ["struct demo::Bucket", "fn demo::Bucket::new"]
    );
    assert_eq!(rendered.items, 2);
    assert_eq!(rendered.notes.len(), 1);
}

#[test]
fn rejects_what_is_not_rustdoc_json() {
    assert!(walk(&json!({ "hello": "world" })).is_err());
    assert!(walk(&json!({ "index": {}, "root": 0 })).is_err());
}

#[test]
fn the_diff_lists_added_and_removed_lines_in_listing_order() {
    let old = "# 3 public items\nstruct a::B\nfn a::B::x\nstruct a::C\n";
    let new = "# 3 public items\nstruct a::A\nfn a::A::y\nstruct a::B\nstruct a::C\n";
    assert_eq!(
        line_diff(old, new),
        ["+struct a::A", "+fn a::A::y", "-fn a::B::x"]
    );
    // The header changes too when the count does: the old header first.
    assert_eq!(
        line_diff("# 10 public items\nfn a::f\n", "# 9 public items\n"),
        ["-# 10 public items", "+# 9 public items", "-fn a::f"]
    );
    assert_eq!(line_diff("", "fn a::f\n"), ["+fn a::f"]);
    assert_eq!(line_diff("fn a::f\nfn a::f\n", "fn a::f\n"), ["-fn a::f"]);
}

#[test]
fn the_diff_is_empty_for_the_same_lines() {
    let text = "# 2 public items\nstruct a::B\nfn a::B::x\n";
    assert!(line_diff(text, text).is_empty());
    // A checkout with CRLF line ends is the same listing.
    assert!(line_diff(&text.replace('\n', "\r\n"), text).is_empty());
}

#[test]
fn the_budget_fails_only_above_the_limit() {
    assert_eq!(over_budget(1000, None), None);
    assert_eq!(over_budget(380, Some(380)), None);
    let over = over_budget(381, Some(380)).expect("381 is over 380");
    assert!(over.contains("381") && over.contains("380") && over.contains("remove 1"));
}

/// The committed listings are what `cargo xtask api` writes: one per product crate, a header
/// whose count is the number of counted lines, sorted, no repeats. (Whether they match the
/// code is `cargo xtask api --check`, which needs rustdoc.)
#[test]
fn committed_listings_are_well_formed() {
    let dir = crate::project_root().join(super::API_DIR);
    for package in PRODUCT_CRATES {
        let path = dir.join(format!("{package}.txt"));
        let text = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("{}: {e} (run `cargo xtask api`)", path.display()));
        let mut lines = text.lines();
        let header = lines.next().unwrap_or_default();
        let body: Vec<&str> = lines.collect();
        // The header counts what `counted` counts: not re-exports, variants, fields or trait
        // items (d30862d's rule), which are listed all the same.
        let counted = body
            .iter()
            .filter(|l| !l.starts_with("use ") && super::counted(l))
            .count();
        let stated: Option<usize> = header
            .strip_prefix("# ")
            .and_then(|h| h.split_once(' '))
            .and_then(|(n, _)| n.parse().ok());
        assert_eq!(stated, Some(counted), "{package}: header `{header}`");
        let mut sorted = body.clone();
        sorted.sort_by_cached_key(|l| order_key(l));
        sorted.dedup();
        assert_eq!(sorted, body, "{package}: lines out of order or repeated");
        assert!(
            body.iter().all(|l| l.split_once(' ').is_some()),
            "{package}: a line without a kind"
        );
    }
}
