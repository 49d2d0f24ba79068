//! The bucket4rs benchmarks: one criterion binary, every contender side by side in one run.
//!
//! - `single_thread`: each local strategy's success, denied, probe, estimate and
//!   two-bandwidth paths next to governor, ratelimit and the textbook `Mutex<f64>` bucket;
//!   the same contenders again on one shared clock source; the atomic floors.
//! - `contention`: 1, 2, 4 and 8 threads on one bucket (aggregate time per operation).
//! - `clock`: the clock reads the limiters are built on.
//! - `keyed`: bucket4rs-local's `KeyedBucket` (foldhash, and on SipHash) next to governor's
//!   keyed limiter, `String` keys, 1 and 10,000 keys, 1 and 2 threads, success and denied;
//!   the Redis and PostgreSQL backends when built with their features and reachable.
//! - `backends`: the embedded, SQLite and PostgreSQL backends of bucket4rs-distributed, 1 and
//!   16 clients on 1 and 10,000 keys (SQLite with `--features sqlite`, PostgreSQL with
//!   `--features postgres` when reachable).
//! - `listener`: `try_consume(1)` with no listener, `NoopListener` and `SimpleBucketListener`,
//!   on the lock-free and synchronized strategies: what a listener costs on the hot path.
//! - `memory`: building a bucket of 1, 2, 4 and 8 bandwidths (the byte counts come from the
//!   `bucket4rs-memory` binary, which needs a counting global allocator).
//!
//! Run through `cargo xtask bench [--quick]`, which also writes the report.

// `criterion_group!` generates an undocumented `pub fn`.
#![allow(missing_docs)]

use criterion::{criterion_group, criterion_main};

mod backends;
mod clock;
mod contention;
mod keyed;
mod listener;
mod memory;
mod single_thread;

criterion_group!(
    benches,
    single_thread::bench,
    clock::bench,
    contention::bench,
    keyed::bench,
    backends::bench,
    listener::bench,
    memory::bench
);
criterion_main!(benches);
