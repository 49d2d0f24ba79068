//! `cargo xtask tidy`, also run by `cargo test` (see `tests.rs`): workspace conventions that
//! the compiler does not check.

use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};

/// Checks every convention and reports all violations at once.
pub(crate) fn check(root: &Path) -> Result<()> {
    let mut problems = Vec::new();

    for member in members(root)? {
        let manifest_path = member.join("Cargo.toml");
        let manifest = fs::read_to_string(&manifest_path)
            .with_context(|| format!("reading {}", manifest_path.display()))?;
        let shown = relative(root, &manifest_path);
        if !section_has(&manifest, "[lints]", "workspace = true") {
            problems.push(format!("{shown}: add `[lints]\\nworkspace = true`"));
        }
        if !section_has(&manifest, "[package]", "publish = false") {
            let changelog = member.join("CHANGELOG.md");
            let ok = fs::read_to_string(&changelog)
                .is_ok_and(|text| text.lines().any(|l| l.trim_end() == "## [Unreleased]"));
            if !ok {
                problems.push(format!(
                    "{}: a published crate needs a CHANGELOG.md with a `## [Unreleased]` header",
                    relative(root, &member)
                ));
            }
        }
    }

    let traces = root.join("testdata/conformance");
    let count = fs::read_dir(&traces).map_or(0, |dir| {
        dir.filter_map(Result::ok)
            .filter(|e| e.path().extension().is_some_and(|x| x == "json"))
            .count()
    });
    if count == 0 {
        problems.push("testdata/conformance: no conformance trace (*.json)".to_owned());
    }

    // The crates, and the measurement programs under benches/ (the HTTP ones lived in
    // crates/ before they moved there).
    let mut sources = Vec::new();
    for dir in ["crates", "benches"] {
        rust_files(&root.join(dir), &mut sources)?;
    }
    for file in sources {
        let text = fs::read_to_string(&file)?;
        for (i, line) in text.lines().enumerate() {
            if let Some(attr) = forbidden_attribute(line) {
                problems.push(format!(
                    "{}:{}: `#[{attr}]` is not used in this workspace; test the behaviour \
                     (a panic: with catch_unwind or a Result) and let every test run",
                    relative(root, &file),
                    i + 1
                ));
            }
        }
    }

    problems.extend(facade_problems(root)?);
    problems.extend(bucket4j_tables(root)?);

    if !problems.is_empty() {
        bail!(
            "tidy found {} problem(s):\n  - {}",
            problems.len(),
            problems.join("\n  - ")
        );
    }
    Ok(())
}

/// The facade's sources: only re-exports (and docs, attributes and the `#[cfg(doctest)]`
/// hook that tests the repository's README), so that the API lives in the crates it
/// re-exports and `bucket4rs::tower` and the others can change underneath.
fn facade_problems(root: &Path) -> Result<Vec<String>> {
    let src = root.join("crates/bucket4rs/src");
    let mut files = Vec::new();
    rust_files(&src, &mut files)?;
    let mut problems = Vec::new();
    for file in files {
        let shown = relative(root, &file);
        if file.file_name().is_some_and(|n| n != "lib.rs") {
            problems.push(format!(
                "{shown}: the facade has one source file, lib.rs, of re-exports only"
            ));
            continue;
        }
        let text = fs::read_to_string(&file)?;
        problems.extend(not_reexports(&text).into_iter().map(|item| {
            format!("{shown}: the facade only re-exports; move `{item}` to the crate it belongs to")
        }));
    }
    Ok(problems)
}

/// The statements of a source file that are not `pub use …;` (comments and attributes
/// skipped; an item under a `#[cfg(…doctest…)]` attribute allowed), each shortened to its
/// first line.
fn not_reexports(text: &str) -> Vec<String> {
    let mut found = Vec::new();
    let mut statement = String::new();
    let mut doctest_only = false;
    for line in text.lines() {
        let line = line.split("//").next().unwrap_or_default().trim();
        if line.starts_with("#[") || line.starts_with("#![") {
            doctest_only |= line.contains("doctest");
            continue;
        }
        if line.is_empty() {
            continue;
        }
        if statement.is_empty() {
            statement = line.to_owned();
        } else {
            statement.push(' ');
            statement.push_str(line);
        }
        if line.ends_with(';') || line.ends_with('}') {
            if !statement.starts_with("pub use ") && !doctest_only {
                found.push(statement.chars().take(60).collect());
            }
            statement.clear();
            doctest_only = false;
        }
    }
    if !statement.is_empty() {
        found.push(statement.chars().take(60).collect());
    }
    found
}

/// The facade's documentation and `docs/differences-from-bucket4j.md` each have a "Coming
/// from Bucket4j" table (one with rustdoc links, one in plain Markdown): they must list the
/// same Bucket4j names, in the same order.
fn bucket4j_tables(root: &Path) -> Result<Vec<String>> {
    const FACADE: &str = "crates/bucket4rs/src/lib.rs";
    const DOC: &str = "docs/differences-from-bucket4j.md";
    let facade = fs::read_to_string(root.join(FACADE))?;
    let doc = fs::read_to_string(root.join(DOC))?;
    let facade: String = facade
        .lines()
        .filter_map(|l| l.strip_prefix("//!"))
        .map(|l| l.strip_prefix(' ').unwrap_or(l))
        .collect::<Vec<_>>()
        .join("\n");
    let ours = java_names(&facade, "# Coming from Bucket4j");
    let theirs = java_names(&doc, "## Coming from Bucket4j");
    let mut problems = Vec::new();
    if ours.is_empty() {
        problems.push(format!("{FACADE}: no \"Coming from Bucket4j\" table"));
    }
    if ours != theirs {
        let missing: Vec<_> = ours.iter().filter(|n| !theirs.contains(n)).collect();
        let extra: Vec<_> = theirs.iter().filter(|n| !ours.contains(n)).collect();
        problems.push(format!(
            "{DOC}'s \"Coming from Bucket4j\" table differs from {FACADE}'s (missing \
             {missing:?}, extra {extra:?}, or another order): update both"
        ));
    }
    Ok(problems)
}

/// The first cells of the table rows of the section under `heading` (up to the next heading
/// of the same level), header and separator rows excepted.
fn java_names(markdown: &str, heading: &str) -> Vec<String> {
    let level = heading.split(' ').next().unwrap_or("#");
    markdown
        .lines()
        .skip_while(|l| !l.starts_with(heading))
        .skip(1)
        .take_while(|l| !(l.starts_with(level) && l[level.len()..].starts_with(' ')))
        .filter(|l| l.starts_with('|') && !l.starts_with("|---") && !l.starts_with("| Bucket4j |"))
        .filter_map(|l| {
            let cells = l.replace("\\|", "\u{0}");
            cells
                .split('|')
                .nth(1)
                .map(|c| c.trim().replace('\u{0}', "|"))
        })
        .collect()
}

/// The directories of the workspace members listed in the root manifest's `members`
/// (a trailing `/*` expands to every subdirectory with a Cargo.toml).
fn members(root: &Path) -> Result<Vec<PathBuf>> {
    let manifest = fs::read_to_string(root.join("Cargo.toml"))?;
    let list = manifest
        .split_once("members")
        .and_then(|(_, rest)| rest.split_once('['))
        .and_then(|(_, rest)| rest.split_once(']'))
        .map(|(list, _)| list)
        .context("no `members = [...]` in the root Cargo.toml")?;
    let mut members = Vec::new();
    for pattern in list.split(',').map(|p| p.trim().trim_matches('"')) {
        if pattern.is_empty() {
            continue;
        }
        if let Some(parent) = pattern.strip_suffix("/*") {
            let mut found: Vec<PathBuf> = fs::read_dir(root.join(parent))?
                .filter_map(Result::ok)
                .map(|e| e.path())
                .filter(|p| p.join("Cargo.toml").is_file())
                .collect();
            found.sort();
            members.extend(found);
        } else {
            members.push(root.join(pattern));
        }
    }
    Ok(members)
}

/// Whether the TOML `section` contains the line `line` (before the next section header).
fn section_has(manifest: &str, section: &str, line: &str) -> bool {
    manifest
        .lines()
        .skip_while(|l| l.trim() != section)
        .skip(1)
        .take_while(|l| !l.trim_start().starts_with('['))
        .any(|l| l.split('#').next().unwrap_or_default().trim() == line)
}

/// The forbidden test attribute a line starts with, if any.
fn forbidden_attribute(line: &str) -> Option<&'static str> {
    let line = line.trim_start();
    ["ignore", "should_panic"].into_iter().find(|attr| {
        line.strip_prefix("#[")
            .and_then(|rest| rest.strip_prefix(attr))
            .is_some_and(|rest| rest.starts_with([']', '(', '=', ' ']))
    })
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
    let Ok(entries) = fs::read_dir(dir) else {
        return Ok(());
    };
    for entry in entries {
        let path = entry?.path();
        if path.is_dir() {
            if path.file_name().is_some_and(|n| n != "target") {
                rust_files(&path, out)?;
            }
        } else if path.extension().is_some_and(|x| x == "rs") {
            out.push(path);
        }
    }
    Ok(())
}

fn relative(root: &Path, path: &Path) -> String {
    path.strip_prefix(root)
        .unwrap_or(path)
        .display()
        .to_string()
}

#[cfg(test)]
mod tests;
