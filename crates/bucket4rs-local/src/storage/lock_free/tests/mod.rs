//! The lock-free bucket's tests that read its mode and its lost races: a differential test of
//! the compact word, stress tests that count every token, and (under `--cfg bucket4rs_loom`,
//! `cargo xtask loom`) its loom models.

#[cfg(not(bucket4rs_loom))]
mod compact;
#[cfg(bucket4rs_loom)]
mod loom;
#[cfg(not(bucket4rs_loom))]
mod stress;
