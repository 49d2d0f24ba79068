//! The command line of `cargo xtask`.
// xflags generates `pub` items inside this private module.
#![allow(unreachable_pub)]

xflags::xflags! {
    /// Project automation for bucket4rs. Run from anywhere in the repository.
    cmd xtask {
        /// Start the services the tests need (Redis, PostgreSQL) if they are down, then run
        /// `cargo test --workspace --all-features`.
        cmd test {}
        /// Everything CI checks, in order, failing fast.
        cmd ci {}
        /// Model-check bucket4rs-local's atomics with loom (`--cfg bucket4rs_loom`).
        cmd loom {}
        /// Check the layering: bucket4rs-core's dependency closure and who may use loom.
        cmd check-deps {}
        /// Check workspace conventions (lints inheritance, changelogs, test hygiene, traces).
        cmd tidy {}
        /// List every public item of each product crate in `docs/api/<package>.txt` (one
        /// line per item, re-exports of other crates as uncounted `use` lines) and print the
        /// counts. Reads rustdoc JSON, made on stable with RUSTC_BOOTSTRAP=1 in `target/api`.
        cmd api {
            /// Write nothing: compare with the committed listings, print the lines that
            /// differ, and fail if any does (or if the total exceeds the budget).
            optional --check
        }
        /// Run the criterion benchmarks and the memory figures, then write
        /// `target/bench-report/index.html` and `report.md` (honours CARGO_TARGET_DIR).
        cmd bench {
            /// Smoke mode for CI: every benchmark briefly (under two minutes once built).
            optional --quick
            /// Do not run anything: rebuild the report from the last run's criterion data.
            optional --report-only
            /// Also replace the figures section of docs/benchmarks.md (full runs only).
            optional --update-docs
            /// Only benchmarks whose id matches this criterion filter (regex).
            optional --filter filter: String
        }
    }
}
