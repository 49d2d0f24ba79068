use super::{check, forbidden_attribute, java_names, not_reexports, section_has};

/// The whole repository follows the conventions: `cargo test` fails otherwise.
#[test]
fn tidy() {
    if let Err(e) = check(&crate::project_root()) {
        panic!("{e:#}\n(run `cargo xtask tidy` to see this again)");
    }
}

#[test]
fn recognises_forbidden_test_attributes() {
    let attr = forbidden_attribute;
    assert_eq!(attr("    #[ignore]"), Some("ignore"));
    assert_eq!(attr("#[ignore = \"slow\"]"), Some("ignore"));
    assert_eq!(
        attr("#[should_panic(expected = \"x\")]"),
        Some("should_panic")
    );
    assert_eq!(attr("#[should_panic]"), Some("should_panic"));
    assert_eq!(attr("#[ignored_by_nothing]"), None);
    assert_eq!(attr("// no #[ignore] here"), None);
}

#[test]
fn reads_one_section_only() {
    let manifest = "[package]\nname = \"x\"\n\n[lints]\nworkspace = true # inherit\n";
    assert!(section_has(manifest, "[lints]", "workspace = true"));
    assert!(!section_has(manifest, "[package]", "workspace = true"));
    assert!(!section_has(
        "[lints.rust]\nworkspace = true\n",
        "[lints]",
        "workspace = true"
    ));
}

#[test]
fn the_facade_may_only_reexport() {
    let ok = "//! Docs.\n#![forbid(unsafe_code)]\n\n/// A module.\n#[cfg(feature = \"x\")]\npub use a as b;\npub use c::{\n    D, E,\n};\n#[cfg(doctest)]\n#[doc = include_str!(\"../README.md\")]\nstruct Readme;\n";
    assert!(not_reexports(ok).is_empty(), "{:?}", not_reexports(ok));
    let bad = "pub use a::B;\npub fn helper() -> u8 {\n    1\n}\nstruct Hidden;\nuse private::X;\n";
    assert_eq!(
        not_reexports(bad),
        [
            "pub fn helper() -> u8 { 1 }",
            "struct Hidden;",
            "use private::X;"
        ]
    );
}

#[test]
fn reads_the_first_column_of_a_section_s_tables() {
    let md = "# Top\n## Coming from Bucket4j\n\ntext\n\n### Part\n\n| Bucket4j | bucket4rs |\n|---|---|\n| `a()` | `b` |\n| `c(\\|x\\| x)` | d |\n\n## Next\n\n| `e` | f |\n";
    assert_eq!(
        java_names(md, "## Coming from Bucket4j"),
        ["`a()`", "`c(|x| x)`"]
    );
    assert!(java_names(md, "## Missing").is_empty());
}
