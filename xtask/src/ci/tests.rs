use super::{FACADE_MANIFEST, feature_names};

#[test]
fn reads_the_feature_names_of_a_manifest() {
    let manifest = "[package]\nname = \"x\"\n\n[features]\ndefault = [\"a\"]\n## Docs.\na = []\nb-c = [\"a\", \"dep:y\"]\n# a = comment\n\n[dependencies]\nz = \"1\"\n";
    assert_eq!(feature_names(manifest), ["a", "b-c"]);
    assert!(feature_names("[package]\nname = \"x\"\n").is_empty());
}

/// The facade's features as the check sees them: every one of them, so none goes unchecked.
#[test]
fn finds_every_feature_of_the_facade() {
    let path = crate::project_root().join(FACADE_MANIFEST);
    let manifest = std::fs::read_to_string(path).expect("the facade's manifest");
    let features = feature_names(&manifest);
    for expected in [
        "local",
        "blocking",
        "async",
        "tokio",
        "distributed",
        "tower",
        "full",
    ] {
        assert!(
            features.iter().any(|f| f == expected),
            "{expected}: {features:?}"
        );
    }
    assert!(!features.iter().any(|f| f == "default"));
}
