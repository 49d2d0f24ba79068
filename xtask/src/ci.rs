//! The checks: `test`, `ci`, `loom` and `check-deps`.

use std::time::Instant;

use anyhow::{Context, Result, bail};
use xshell::{Cmd, Shell, cmd};

use crate::{api, project_root, services, step, tidy};

/// Crates that must never enter bucket4rs-core's normal dependency closure: the core is
/// `no_std`, pure and dependency-free apart from the optional `serde`.
const FORBIDDEN_IN_CORE: [&str; 6] = [
    "tokio",
    "redis",
    "tokio-postgres",
    "parking_lot",
    "crossbeam-utils",
    "quanta",
];

/// The only direct dependencies bucket4rs-core may have: optional `serde`; `strength_reduce`
/// (no_std, dependency-free), whose precomputed reciprocal replaces the hardware divide by
/// the refill period on every operation; and `smallvec` (no_std, dependency-free but for
/// `serde`), which keeps a one-bandwidth bucket's state inline (see ARCHITECTURE.md).
const ALLOWED_CORE_DIRECT: [&str; 3] = ["serde", "smallvec", "strength_reduce"];

/// Crates an in-process user of the HTTP layer (`bucket4rs-tower` without its `distributed`
/// feature) must not compile: the distributed crate and what only it brings.
const FORBIDDEN_IN_LOCAL_TOWER: [&str; 6] = [
    "bucket4rs-distributed",
    "redis",
    "tokio-postgres",
    "rusqlite",
    "rand",
    "async-trait",
];

/// The only workspace crate allowed to depend on loom (through its private `primitive` module).
const LOOM_USER: &str = "bucket4rs-local";

/// Hook for `cargo xtask bench --quick` in `ci` (the smoke run: every benchmark briefly, and
/// the report written, so a broken benchmark or report fails CI; no timing is asserted).
const BENCH: Option<fn(&Shell, bool) -> Result<()>> = Some(crate::bench::run);

/// `cargo xtask test`: makes sure the services are up, then runs every test of the workspace.
pub(crate) fn test(sh: &Shell) -> Result<()> {
    step("services: Redis and PostgreSQL");
    services::ensure(sh)?;
    step("test");
    // The conformance runners (every test named `…replays…`) and the fault suite (every test
    // named `fault_…`, each starting its own throwaway servers) run next, uncaptured, so that
    // each prints what it checked: `conformance: N traces, M steps passed (engine: …)`,
    // `fault: …` with the figures it measured.
    cmd!(
        sh,
        "cargo test --workspace --all-features -- --skip replays --skip fault_"
    )
    .run()?;
    step("test: every conformance runner on the Bucket4j traces");
    cmd!(
        sh,
        "cargo test --workspace --all-features replays -- --nocapture"
    )
    .run()?;
    step("test: the fault suite (own servers frozen, killed, restarted; corrupt records)");
    cmd!(
        sh,
        "cargo test --workspace --all-features fault_ -- --nocapture --test-threads 1"
    )
    .run()?;
    other_conformance_dir(sh)?;
    facade_features(sh)
}

/// The facade's manifest, whose features [`facade_features`] checks one by one.
const FACADE_MANIFEST: &str = "crates/bucket4rs/Cargo.toml";

/// The facade with each of its features alone (and with none): `cargo check` of its tests,
/// whose `tests/each_feature.rs` has a program per feature naming only `bucket4rs::…`. A
/// re-export missing under one feature fails here; `--all-features` would hide it. Checking
/// (no codegen) keeps it to a few seconds a feature once the dependencies are checked.
fn facade_features(sh: &Shell) -> Result<()> {
    step("test: the facade with each feature alone (cargo check of its tests)");
    let path = project_root().join(FACADE_MANIFEST);
    let manifest =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let features = feature_names(&manifest);
    if features.is_empty() {
        bail!("{FACADE_MANIFEST}: no [features] found");
    }
    let started = Instant::now();
    let none = [String::new()];
    for feature in none.iter().chain(&features) {
        let mut args = vec!["--no-default-features"];
        if !feature.is_empty() {
            args.extend(["--features", feature.as_str()]);
        }
        cmd!(sh, "cargo check --quiet -p bucket4rs --tests {args...}").run()?;
    }
    println!(
        "facade: {} feature sets checked in {}s",
        features.len() + 1,
        started.elapsed().as_secs()
    );
    Ok(())
}

/// The features of a manifest's `[features]` table, `default` excepted, in order.
fn feature_names(manifest: &str) -> Vec<String> {
    manifest
        .lines()
        .skip_while(|l| l.trim() != "[features]")
        .skip(1)
        .take_while(|l| !l.trim_start().starts_with('['))
        .filter_map(|l| {
            let (name, _) = l.split_once('=')?;
            let name = name.trim();
            let valid = !name.is_empty()
                && !name.starts_with('#')
                && name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
            (valid && name != "default").then(|| name.to_owned())
        })
        .collect()
}

/// The traces of a conformance directory the runners are asked to replay: any directory of
/// valid traces (`BUCKET4RS_CONFORMANCE_DIR`) must pass on every engine, so no runner may assert
/// on what the directory holds. The test names of every runner contain `replays`.
const OTHER_DIR_TRACES: [&str; 3] = [
    // Only a build error: no step at all.
    "build_error_aligned_refill_needs_wall_clock.json",
    // A clock that goes back: the monotonic runners skip it.
    "clock_moves_backwards.json",
    // A wall-clock based clock: also skipped by the monotonic runners.
    "intervally_aligned_adaptive_first_refill_in_past.json",
];

/// Every conformance runner again, on a directory that holds a few unusual traces only.
fn other_conformance_dir(sh: &Shell) -> Result<()> {
    step("test: the conformance runners on another directory of traces");
    let root = project_root();
    let dir = std::env::var_os("CARGO_TARGET_DIR")
        .map_or_else(|| root.join("target"), Into::into)
        .join("conformance-other");
    if dir.exists() {
        std::fs::remove_dir_all(&dir).with_context(|| format!("removing {}", dir.display()))?;
    }
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    for name in OTHER_DIR_TRACES {
        let from = root.join("testdata/conformance").join(name);
        std::fs::copy(&from, dir.join(name))
            .with_context(|| format!("copying {}", from.display()))?;
    }
    cmd!(
        sh,
        "cargo test --workspace --all-features replays -- --nocapture"
    )
    .env("BUCKET4RS_CONFORMANCE_DIR", &dir)
    .run()?;
    Ok(())
}

/// `cargo xtask ci`: everything CI checks, in order, stopping at the first failure.
pub(crate) fn ci(sh: &Shell) -> Result<()> {
    let started = Instant::now();

    step("fmt");
    cmd!(sh, "cargo fmt --all --check").run()?;

    step("clippy");
    cmd!(
        sh,
        "cargo clippy --workspace --all-targets --all-features -- -D warnings"
    )
    .run()?;

    // Right after clippy: a change of the public surface must come with its listing.
    api::check(sh)?;

    test(sh)?;

    step("doc");
    cmd!(sh, "cargo doc --workspace --all-features --no-deps")
        .env("RUSTDOCFLAGS", "-D warnings")
        .run()?;

    step("no_std: bucket4rs-core without default features");
    cmd!(sh, "cargo build -p bucket4rs-core --no-default-features").run()?;

    check_deps(sh)?;

    step("tidy");
    tidy::check(&project_root())?;
    println!("tidy: ok");

    if sh.path_exists("crates/bucket4rs-local") {
        loom(sh)?;
    } else {
        step("loom: skipped (no crates/bucket4rs-local yet)");
    }

    match BENCH {
        Some(bench) => {
            step("bench --quick");
            bench(sh, true)?;
        }
        None => step("bench --quick: skipped (no `cargo xtask bench` yet)"),
    }

    println!(
        "\nci: every check passed in {}s",
        started.elapsed().as_secs()
    );
    Ok(())
}

/// `cargo xtask loom`: bucket4rs-local's loom models (its unit tests compiled under
/// `--cfg bucket4rs_loom`, which leaves out every other unit test), in their own target
/// directory so that the cfg does not invalidate the normal build.
pub(crate) fn loom(sh: &Shell) -> Result<()> {
    step("loom");
    if !sh.path_exists("crates/bucket4rs-local/Cargo.toml") {
        bail!(
            "loom: crates/bucket4rs-local does not exist yet; its loom models are unit tests \
             compiled under --cfg bucket4rs_loom"
        );
    }
    let rustflags = match std::env::var("RUSTFLAGS") {
        Ok(flags) if !flags.trim().is_empty() => format!("{flags} --cfg bucket4rs_loom"),
        _ => "--cfg bucket4rs_loom".to_owned(),
    };
    let target_dir = std::env::var_os("CARGO_TARGET_DIR")
        .map_or_else(|| project_root().join("target"), Into::into)
        .join("loom");
    cmd!(
        sh,
        "cargo test -p bucket4rs-local --release --lib --target-dir {target_dir}"
    )
    // Each model sets its own preemption bound (3 for two threads, 2 for three); an explicit
    // LOOM_MAX_PREEMPTIONS in the environment overrides them all for a deeper search.
    .env("RUSTFLAGS", rustflags)
    .run()?;
    Ok(())
}

/// `cargo xtask check-deps`: the layering invariants of ARCHITECTURE.md, from `cargo tree`.
pub(crate) fn check_deps(sh: &Shell) -> Result<()> {
    step("check-deps");
    let mut problems = Vec::new();

    let direct = names(cmd!(
        sh,
        "cargo tree -p bucket4rs-core -e normal --all-features --target all --prefix none --depth 1"
    ))?;
    for name in direct.iter().skip(1) {
        if !ALLOWED_CORE_DIRECT.contains(&name.as_str()) {
            problems.push(format!(
                "bucket4rs-core depends on `{name}`; it may only depend on {ALLOWED_CORE_DIRECT:?}"
            ));
        }
    }
    let closure = names(cmd!(
        sh,
        "cargo tree -p bucket4rs-core -e normal --all-features --target all --prefix none"
    ))?;
    for name in FORBIDDEN_IN_CORE {
        if closure.iter().any(|n| n == name) {
            problems.push(format!(
                "`{name}` is in bucket4rs-core's normal dependency closure (see `cargo tree -p \
                 bucket4rs-core -e normal --all-features -i {name}`)"
            ));
        }
    }

    let tower = names(cmd!(
        sh,
        "cargo tree -p bucket4rs-tower --no-default-features -e normal --target all --prefix none"
    ))?;
    for name in FORBIDDEN_IN_LOCAL_TOWER {
        if tower.iter().any(|n| n == name) {
            problems.push(format!(
                "`{name}` is in bucket4rs-tower's normal dependency closure without its \
                 `distributed` feature (see `cargo tree -p bucket4rs-tower --no-default-features \
                 -e normal -i {name}`)"
            ));
        }
    }

    let everything = names(cmd!(
        sh,
        "cargo tree --workspace --all-features --target all -e normal,build,dev --prefix none"
    ))?;
    if everything.iter().any(|n| n == "loom") {
        let users = names(cmd!(
            sh,
            "cargo tree --workspace --all-features --target all -e normal,build,dev --prefix none --depth 1 -i loom"
        ))?;
        for user in users.iter().skip(1) {
            if user != LOOM_USER {
                problems.push(format!(
                    "`{user}` depends on loom; only {LOOM_USER} may (through its `primitive` module)"
                ));
            }
        }
    }

    if !problems.is_empty() {
        bail!("check-deps failed:\n  - {}", problems.join("\n  - "));
    }
    println!(
        "check-deps: ok (bucket4rs-core's closure: {})",
        closure.join(", ")
    );
    Ok(())
}

/// The package names of a `cargo tree --prefix none` listing, in order, without repeats.
fn names(cmd: Cmd<'_>) -> Result<Vec<String>> {
    let out = cmd.read().context("cargo tree failed")?;
    let mut names: Vec<String> = Vec::new();
    for name in out.lines().filter_map(|l| l.split_whitespace().next()) {
        if !names.iter().any(|n| n == name) {
            names.push(name.to_owned());
        }
    }
    Ok(names)
}

#[cfg(test)]
mod tests;
