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
        // Hook for the bench engineer: add `cmd bench { optional --quick }` here, a `bench`
        // module, and set `ci::BENCH` so that `cargo xtask ci` runs `bench --quick`.
    }
}
