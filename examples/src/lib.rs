//! Runnable examples for bucket4rs. This library is empty; the programs are in `examples/`:
//!
//! - `quickstart`: a bucket with two limits on a manual clock, consumed and probed step by
//!   step (`cargo run --release -p bucket4rs-examples --example quickstart`).
